/* Line-oriented logging to stderr: "<time> <tag>[pid] <level>: message". */
#include "kvr_log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *log_tag = "kvring";
static enum kvr_log_level log_level = KVR_LOG_INFO;
static const char *const level_names[] = {"error", "warn", "info", "debug"};

void kvr_log_setup(const char *tag, enum kvr_log_level level)
{
	if (tag)
		log_tag = tag;
	log_level = level;
}

enum kvr_log_level kvr_log_get_level(void)
{
	return log_level;
}

int kvr_log_level_parse(const char *s, enum kvr_log_level *ret)
{
	for (int i = 0; i <= KVR_LOG_DEBUG; i++)
		if (s && strcmp(s, level_names[i]) == 0) {
			*ret = (enum kvr_log_level)i;
			return 0;
		}
	return -EINVAL;
}

void kvr_log(enum kvr_log_level level, const char *fmt, ...)
{
	if (level > log_level)
		return;
	char line[1024];
	struct timespec ts;
	struct tm tm;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	int n = snprintf(line, sizeof(line), "%02d:%02d:%02d.%03ld %s[%d] %s: ", tm.tm_hour, tm.tm_min, tm.tm_sec,
			 ts.tv_nsec / 1000000, log_tag, (int)getpid(), level_names[level]);
	va_list ap;
	va_start(ap, fmt);
	if (n > 0 && (size_t)n < sizeof(line))
		n += vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	if ((size_t)n >= sizeof(line) - 1)
		n = sizeof(line) - 2;
	line[n++] = '\n';
	/* one write per line so lines of concurrent processes do not interleave */
	(void)!write(STDERR_FILENO, line, (size_t)n);
}

int kvr_errf(char *err, size_t errlen, int rc, const char *fmt, ...)
{
	if (err && errlen) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err, errlen, fmt, ap);
		va_end(ap);
	}
	return rc;
}
