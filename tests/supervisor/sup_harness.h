/* Test harness for kvringd: temp instances, the real daemon from KVR_BUILD_ROOT, socket requests. */
#ifndef SUP_HARNESS_H
#define SUP_HARNESS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <kvring/msg.h>

#include "kvr_ctl.h"
#include "kvr_proto.h"
#include "kvr_segment.h"

/*
 * One kvringd instance under test. h_init() makes a unique directory
 * /tmp/kvr-sup-<pid>-<n>/ holding the socket, the config and the daemon's log; h_fini()
 * kills whatever the test started (by pid) and removes the directory. Helpers assert
 * through Criterion, so a failure ends the test with a message naming what was awaited.
 */

struct h_inst {
	char dir[96];
	char sock[128];
	char cfg[128];
	char log[128];
	pid_t pid;                /* kvringd, 0 when not running */
	struct kvr_segment ro;    /* read-only INSPECT mapping of the control segment */
	struct kvr_ctl *ctl;
	ino_t ctl_ino;
	dev_t ctl_dev;
};

/* Attach of a worker: the connection and the segments received. */
struct h_worker {
	int sock;
	int status;
	unsigned worker;
	char reason[KVR_PROTO_REASON_MAX];
	int fds[KVR_PROTO_MAX_FDS];
	unsigned n_fds;
};

/* Directory, socket and log paths; mode of the directory (0700 normally). */
void h_init(struct h_inst *in, unsigned dir_mode);
void h_fini(struct h_inst *in);

/* Write the test config: short timeouts (ready 2000, backoff 50..400, crash loop 3 in
 * 10 s, health 200 ms, drain 3000), 64-message rings, a 64 MiB arena without huge pages.
 * extra_instance / extra_supervisor are spliced into the "instance" / "supervisor"
 * objects (e.g. ",\"socket_mode\": \"0666\""): only keys the base config does not set. */
void h_write_config(struct h_inst *in, unsigned max_workers, const char *extra_instance, const char *extra_supervisor);
void h_write_config_raw(struct h_inst *in, const char *json);

/* Supervisor timings (the body of the "supervisor" object). H_SUP_WATCH: fast restarts and
 * health pings, for tests of the supervisor itself; H_SUP_DATA: data-path tests, where a
 * stopped actor must not be killed by missed pings within a test (pings every 1 s). */
#define H_SUP_WATCH                                                                              \
	"\"ready_timeout_ms\": 2000, \"stable_after_ms\": 1000, \"restart_backoff_initial_ms\": 50, " \
	"\"restart_backoff_max_ms\": 400, \"crash_loop_window_s\": 10, \"crash_loop_max_deaths\": 3, "  \
	"\"health_interval_ms\": 200, \"drain_timeout_ms\": 3000"
#define H_SUP_DATA                                                                               \
	"\"ready_timeout_ms\": 3000, \"stable_after_ms\": 1000, \"restart_backoff_initial_ms\": 20, " \
	"\"restart_backoff_max_ms\": 200, \"crash_loop_window_s\": 10, \"crash_loop_max_deaths\": 5, "  \
	"\"health_interval_ms\": 1000, \"drain_timeout_ms\": 3000"

/* Write a config: the instance (this harness's socket, max_workers, log level info, then
 * instance_extra: "" or ", \"key\": value"), rings of 64 messages, the supervisor object
 * with the body `supervisor` (H_SUP_WATCH, H_SUP_DATA or a test's own), then `sections`:
 * the other top-level members, each written as ",\n  \"name\": {...}". */
void h_write_config_with(struct h_inst *in, const char *instance_extra, unsigned max_workers, const char *supervisor,
			 const char *sections);

/* Path of a built program under KVR_BUILD_ROOT. */
void h_build_path(char *buf, size_t len, const char *rel);

/* Start kvringd with extra arguments (NULL-terminated) and its output in in->log. */
pid_t h_spawn_kvringd(struct h_inst *in, const char *const *args);
/* Start with --config in->cfg and wait until INSPECT works; maps ctl into in->ro. */
void h_start(struct h_inst *in);
/* Wait for a child's exit; returns the wait status or -1 after timeout_ms. */
int h_wait_exit(pid_t pid, int timeout_ms);
/* Does the daemon's log contain s? */
bool h_log_contains(const struct h_inst *in, const char *s);
char *h_read_file(const char *path);
/* Files under dir (any depth; names starting with '.' skipped) whose name ends in suffix. */
unsigned h_count_files(const char *dir, const char *suffix);
/* Damage a file: XOR byte off with 0x5a (asserts the byte exists). */
void h_flip_byte(const char *path, long off);
/* Create or truncate path with text (asserts it worked). */
void h_write_file(const char *path, const char *text);

/* INSPECT: returns the read-only ctl fd, or -errno. */
int h_inspect_fd(const char *sock);
void h_inspect_map(struct h_inst *in);
void h_unmap(struct h_inst *in);

/* ATTACH over a new connection (kept open in w->sock). 0 when a reply arrived. */
int h_attach(const char *sock, struct h_worker *w);
/* Attach as TP rank `rank` of `tp_size` (the default model, 2 engine blocks). */
int h_attach_rank(const char *sock, unsigned tp_size, unsigned rank, struct h_worker *w);
void h_worker_close(struct h_worker *w);

/* Poll expr every 5 ms for up to ms milliseconds; true once it holds. */
#define H_WAIT(expr, ms) \
	({ \
		bool _ok = false; \
		for (int _t = 0; _t <= (ms); _t += 5) { \
			if ((expr)) { \
				_ok = true; \
				break; \
			} \
			usleep(5000); \
		} \
		_ok; \
	})

/* Actor table helpers on the read-only mapping. */
int h_actor_index(const struct kvr_ctl *c, const char *name);
struct kvr_actor_ent *h_actor(const struct h_inst *in, const char *name);
/* A view of ring name (one per call, valid for the test). */
struct kvr_ring *h_ring(const struct kvr_ctl *c, const char *name);
/* Map what worker w's attach reply handed over as a client does: the control segment
 * read-only, its own area read-write over it. Asserts; returns the segment's header. */
struct kvr_ctl *h_worker_map(const struct h_worker *w, struct kvr_segment *ret);
/* Open the daemon's own descriptor of memfd `name` ("kvring-ctl", "kvring-slots", ...)
 * through /proc/<pid>/fd with flags: the test owns the daemon, so it may look inside. */
int h_daemon_memfd(pid_t pid, const char *name, int flags);
/* Map kvringd's control segment and every client area over it (kvr_ctl_map), from the
 * descriptors INSPECT hands out: read-write when `writable` (a test acting as an actor; the
 * descriptors are reopened read-write through /proc). Asserts on failure. */
void h_daemon_ctl(const struct h_inst *in, int writable, struct kvr_segment *ret);
/* Map kvringd's current client areas over seg again: a slot gets a fresh area between two of
 * its workers (kvr_ctl_area_fresh), which a mapping made before does not see. */
void h_daemon_areas(const struct h_inst *in, int writable, struct kvr_segment *seg);
uint64_t h_stat(const struct h_inst *in, const char *actor, unsigned s);

/* Is pid alive (and not a zombie)? */
bool h_pid_alive(pid_t pid);
/* Processes (other than the ones excluded) that have the segment ino/dev open or mapped. */
int h_count_segment_users(ino_t ino, dev_t dev, char *who, size_t wholen);

#endif
