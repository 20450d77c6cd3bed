/* fmt: byte, duration and rate formats of the tools (contract in fmt.h). */
#include "fmt.h"

#include <inttypes.h>
#include <stdio.h>

char *kvr_fmt_bytes(uint64_t b, char *buf, size_t len)
{
	static const char *const unit[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
	if (b < 1024) {
		snprintf(buf, len, "%u B", (unsigned)b);
		return buf;
	}
	double v = (double)b / 1024.0;
	unsigned u = 0;
	while (v >= 1023.95 && u + 1 < sizeof(unit) / sizeof(unit[0])) {
		v /= 1024.0;
		u++;
	}
	snprintf(buf, len, "%.1f %s", v, unit[u]);
	return buf;
}

char *kvr_fmt_duration(uint64_t ns, char *buf, size_t len)
{
	uint64_t s = ns / 1000000000ull;
	if (ns < 10000000000ull)
		snprintf(buf, len, "%.2fs", (double)(ns / 10000000ull) / 100.0);
	else if (s < 60)
		snprintf(buf, len, "%.1fs", (double)(ns / 100000000ull) / 10.0);
	else if (s < 3600)
		snprintf(buf, len, "%um%02us", (unsigned)(s / 60), (unsigned)(s % 60));
	else if (s < 100 * 3600)
		snprintf(buf, len, "%uh%02um", (unsigned)(s / 3600), (unsigned)(s / 60 % 60));
	else
		snprintf(buf, len, "%" PRIu64 "d", s / 86400);
	return buf;
}

char *kvr_fmt_ns(double ns, char *buf, size_t len)
{
	if (ns < 1e3)
		snprintf(buf, len, "%.0f ns", ns);
	else if (ns < 1e6)
		snprintf(buf, len, "%.1f us", ns / 1e3);
	else if (ns < 1e9)
		snprintf(buf, len, "%.2f ms", ns / 1e6);
	else
		snprintf(buf, len, "%.3f s", ns / 1e9);
	return buf;
}

char *kvr_fmt_rate(double r, char *buf, size_t len)
{
	if (r < 999.5)
		snprintf(buf, len, "%.0f", r);
	else if (r < 999950.0)
		snprintf(buf, len, "%.1fk", r / 1e3);
	else if (r < 999950000.0)
		snprintf(buf, len, "%.1fM", r / 1e6);
	else if (r < 999.5e9)
		snprintf(buf, len, "%.0fG", r / 1e9);
	else
		snprintf(buf, len, ">999G");
	return buf;
}

double kvr_fmt_mib(uint64_t bytes)
{
	return (double)bytes / (1024.0 * 1024.0);
}

double kvr_fmt_gib(uint64_t bytes)
{
	return (double)bytes / (double)(1 << 30);
}
