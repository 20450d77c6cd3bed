/* kvr_log: one line per event to stderr, with a level filter. Used by programs, not by libkvring. */
#ifndef KVR_LOG_H
#define KVR_LOG_H

#include <stddef.h>

enum kvr_log_level { KVR_LOG_ERROR = 0, KVR_LOG_WARN = 1, KVR_LOG_INFO = 2, KVR_LOG_DEBUG = 3 };

/* Set the level and the program tag ("kvringd", "lookup") printed on every line. */
void kvr_log_setup(const char *tag, enum kvr_log_level level);
/* Parse "error", "warn", "info", "debug"; -EINVAL otherwise. */
int kvr_log_level_parse(const char *s, enum kvr_log_level *ret);
enum kvr_log_level kvr_log_get_level(void);

void kvr_log(enum kvr_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Format a one-line reason into err (when err && errlen) and return rc: the "-errno plus
 * a reason" idiom of functions that take an err buffer. Not logging: nothing is printed. */
int kvr_errf(char *err, size_t errlen, int rc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#define kvr_err(...) kvr_log(KVR_LOG_ERROR, __VA_ARGS__)
#define kvr_warn(...) kvr_log(KVR_LOG_WARN, __VA_ARGS__)
#define kvr_info(...) kvr_log(KVR_LOG_INFO, __VA_ARGS__)
#define kvr_debug(...) \
	do { \
		if (kvr_log_get_level() >= KVR_LOG_DEBUG) \
			kvr_log(KVR_LOG_DEBUG, __VA_ARGS__); \
	} while (0)

#endif
