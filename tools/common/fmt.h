/* fmt: how the tools write numbers for people: bytes, durations, rates (kvring-inspect, kvring-bench). */
#ifndef KVR_FMT_H
#define KVR_FMT_H

#include <stddef.h>
#include <stdint.h>

/*
 * Each writes at most len bytes (NUL included) into buf and returns buf; a buffer of the
 * size given below always holds the whole text. Pure functions of their arguments.
 */

/* Bytes in binary units, at most 10 characters (buf >= 11): "512 B", "160.0 KiB",
 * "1023.9 GiB" (one decimal; the unit steps up at 1023.95). */
char *kvr_fmt_bytes(uint64_t bytes, char *buf, size_t len);

/* A duration for a narrow column, at most 7 characters (buf >= 8): "0.25s", "12.3s",
 * "4m05s", "3h07m", "12d" (truncated, never rounded up). */
char *kvr_fmt_duration(uint64_t ns, char *buf, size_t len);

/* A duration for a report line (buf >= 32): "950 ns", "4.5 us", "6.78 ms", "1.234 s". */
char *kvr_fmt_ns(double ns, char *buf, size_t len);

/* A per-second rate in SI steps, at most 6 characters (buf >= 7): "950", "12.3k", "999.9M",
 * "12G", ">999G". */
char *kvr_fmt_rate(double per_s, char *buf, size_t len);

/* Bytes as a number of MiB / GiB, for "%.1f MiB" in a longer line. */
double kvr_fmt_mib(uint64_t bytes);
double kvr_fmt_gib(uint64_t bytes);

#endif
