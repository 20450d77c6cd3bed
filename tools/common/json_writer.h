/* json_writer: the one JSON writer of the tools (kvring-inspect, kvring-bench, kvr-ringbench). */
#ifndef KVR_JSON_WRITER_H
#define KVR_JSON_WRITER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/*
 * Why not cJSON: cJSON stores every number as a double. A u64 counter above 2^53 comes out
 * rounded and any integer from 10^15 up in exponent form (cJSON_Print of 18446744073709551615
 * is "1.8446744073709552e+19", of 10^15 "1e+15"), and the tools print u64 counters, CLOCK_REALTIME
 * nanoseconds (~1.8e18) and kvring-bench's --seed (a u64) that must read back exactly. That is why
 * kvring-inspect had its own writer; this is it, made common. It streams to a FILE* (no tree, no
 * allocation) and writes integers as integers.
 *
 * Layouts:
 *   KVR_JW_COMPACT  one line, no white space: {"a":1,"b":[1,2]}
 *   KVR_JW_INDENT   two spaces a level, every member and element on its own line, "key": value;
 *                   an empty container is {} or [] (kvring-inspect --json)
 *   KVR_JW_TABS     cJSON_Print's layout, byte for byte: a tab a level, one member a line,
 *                   "key":<tab>value, an empty object "{\n<tabs>}", arrays on one line "[1, 2]"
 *                   (kvring-bench --json, kvr-ringbench --json, kvring-bench's kvringd config)
 *
 * Use: kvr_jw_init, then values. Inside an object every value takes its key; at the top and
 * inside an array the key is NULL. Keys are written as given (they are literals: not escaped).
 * Strings are escaped: '"' and '\\' with a backslash, every byte below 0x20 or from 0x7f up as
 * \u00XX (so the output is ASCII whatever a name in shared memory holds).
 * kvr_jw_finish() returns 0, -EINVAL (more than KVR_JW_MAX_DEPTH levels, or an object/array
 * left open or closed twice: nothing more was written after that) or -EIO (the FILE* reported
 * a write error). It writes no final newline.
 */

#define KVR_JW_MAX_DEPTH 16

enum kvr_jw_layout {
	KVR_JW_COMPACT,
	KVR_JW_INDENT,
	KVR_JW_TABS,
};

struct kvr_jw {
	FILE *f;
	enum kvr_jw_layout layout;
	int depth;                        /* containers open */
	bool bad;                         /* nesting error: the writer stopped */
	bool first[KVR_JW_MAX_DEPTH + 1]; /* no member in the container at that depth yet */
	char close[KVR_JW_MAX_DEPTH + 1]; /* '}' or ']' */
};

void kvr_jw_init(struct kvr_jw *w, FILE *f, enum kvr_jw_layout layout);
int kvr_jw_finish(struct kvr_jw *w);

void kvr_jw_object(struct kvr_jw *w, const char *key); /* open { */
void kvr_jw_array(struct kvr_jw *w, const char *key);  /* open [ */
void kvr_jw_end(struct kvr_jw *w);                     /* close the innermost */

void kvr_jw_str(struct kvr_jw *w, const char *key, const char *v);
void kvr_jw_u64(struct kvr_jw *w, const char *key, uint64_t v);
void kvr_jw_i64(struct kvr_jw *w, const char *key, int64_t v);
void kvr_jw_bool(struct kvr_jw *w, const char *key, bool v);
void kvr_jw_null(struct kvr_jw *w, const char *key);
/* ns as seconds with nanosecond resolution ("12.000000250"), exact for any u64. */
void kvr_jw_secs(struct kvr_jw *w, const char *key, uint64_t ns);
/* "%.3f"; null when v is not finite. */
void kvr_jw_fixed3(struct kvr_jw *w, const char *key, double v);
/* A double as cJSON prints it: the shortest of "%1.15g" and "%1.17g" that reads back; null
 * when not finite. For ratios and rates, not for counts (kvr_jw_u64). */
void kvr_jw_double(struct kvr_jw *w, const char *key, double v);

#endif
