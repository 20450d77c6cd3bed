/* ringbench transport "iceoryx": iceoryx 2.0 pub/sub through its C binding, with a RouDi the bench starts and stops. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "ringbench.h"

#ifndef KVR_HAVE_ICEORYX

static int iox_setup(struct rb_env *env, char *why, size_t len)
{
	(void)env;
	snprintf(why, len, "not built (libiceoryx-binding-c-dev was not found at configure time)");
	return -ENOTSUP;
}

static void iox_teardown(struct rb_env *env)
{
	(void)env;
}

static int iox_open(struct rb_env *env, enum rb_role role, struct rb_chan **ret, char *why, size_t len)
{
	(void)env, (void)role, (void)ret;
	snprintf(why, len, "not built");
	return -ENOTSUP;
}

static int iox_send(struct rb_chan *c, const struct kvr_msg *m)
{
	(void)c, (void)m;
	return -ENOTSUP;
}

static int iox_recv(struct rb_chan *c, struct kvr_msg *m)
{
	(void)c, (void)m;
	return -ENOTSUP;
}

static void iox_close(struct rb_chan *c)
{
	(void)c;
}

#else

#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <iceoryx_binding_c/enums.h>
#include <iceoryx_binding_c/log.h>
#include <iceoryx_binding_c/publisher.h>
#include <iceoryx_binding_c/runtime.h>
#include <iceoryx_binding_c/subscriber.h>
#include <iceoryx_binding_c/wait_set.h>

#define ROUDI_READY_LINE "RouDi is ready for clients"
#define ROUDI_START_TIMEOUT_MS 10000
#define ROUDI_STOP_TIMEOUT_MS 10000
#define MATCH_TIMEOUT_MS 10000
#define IOX_QUEUE_CAPACITY 256 /* iceoryx 2.0's maximum subscriber queue */

struct rb_chan {
	iox_pub_storage_t pub_storage;
	iox_sub_storage_t sub_storage;
	iox_ws_storage_t ws_storage;
	iox_pub_t pub;
	iox_sub_t sub;
	iox_ws_t ws;
};

static void sleep_ms(unsigned ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
	nanosleep(&ts, NULL);
}

static int find_roudi(char *path, size_t len)
{
	const char *env = getenv("PATH");
	char *dirs = strdup(env ? env : "");
	if (dirs) {
		char *save = NULL;
		for (char *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
			snprintf(path, len, "%s/iox-roudi", d);
			if (access(path, X_OK) == 0) {
				free(dirs);
				return 0;
			}
		}
		free(dirs);
	}
	snprintf(path, len, "/usr/bin/iox-roudi");
	return access(path, X_OK) == 0 ? 0 : -ENOENT;
}

/* The log's last line that says something, without colour escapes. */
static void last_log_line(const char *log, char *out, size_t len)
{
	snprintf(out, len, "no output");
	FILE *f = fopen(log, "r");
	if (!f)
		return;
	char line[512];
	while (fgets(line, sizeof(line), f)) {
		char clean[512];
		size_t n = 0;
		for (const char *p = line; *p && n + 1 < sizeof(clean); p++) {
			if (*p == '\033') { /* skip "ESC [ ... m" */
				while (*p && *p != 'm')
					p++;
				if (!*p)
					break;
				continue;
			}
			if (*p != '\n' && *p != '\r')
				clean[n++] = *p;
		}
		clean[n] = '\0';
		if (n && len) {
			size_t k = n < len - 1 ? n : len - 1;
			memcpy(out, clean, k);
			out[k] = '\0';
		}
	}
	fclose(f);
}

static bool log_has(const char *log, const char *needle)
{
	FILE *f = fopen(log, "r");
	if (!f)
		return false;
	char line[512];
	bool found = false;
	while (!found && fgets(line, sizeof(line), f))
		found = strstr(line, needle) != NULL;
	fclose(f);
	return found;
}

static void stop_roudi(struct rb_env *env)
{
	if (env->roudi_pid <= 0)
		return;
	kill(env->roudi_pid, SIGTERM);
	for (unsigned ms = 0; ms < ROUDI_STOP_TIMEOUT_MS; ms += 10) {
		if (waitpid(env->roudi_pid, NULL, WNOHANG) == env->roudi_pid) {
			env->roudi_pid = 0;
			return;
		}
		sleep_ms(10);
	}
	kill(env->roudi_pid, SIGKILL);
	waitpid(env->roudi_pid, NULL, 0);
	env->roudi_pid = 0;
	/* the next RouDi reclaims them; say so rather than delete a machine-wide resource */
	fprintf(stderr, "kvring-ringbench: iox-roudi did not stop within %u ms and was killed; it may have left "
			"/dev/shm/iceoryx_mgmt and /tmp/roudi behind\n", ROUDI_STOP_TIMEOUT_MS);
}

static int iox_setup(struct rb_env *env, char *why, size_t len)
{
	char path[512];
	if (find_roudi(path, sizeof(path))) {
		snprintf(why, len, "iox-roudi not found in PATH or /usr/bin (Debian package iceoryx)");
		return -ENOENT;
	}
	snprintf(env->roudi_log, sizeof(env->roudi_log), "/tmp/kvr-ringbench-%d-roudi.log", getpid());
	int fd = open(env->roudi_log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		snprintf(why, len, "%s: %s", env->roudi_log, strerror(errno));
		return -errno;
	}
	pid_t pid = fork();
	if (pid < 0) {
		int rc = -errno;
		close(fd);
		snprintf(why, len, "fork: %s", strerror(-rc));
		return rc;
	}
	if (pid == 0) {
		dup2(fd, 1);
		dup2(fd, 2);
		execl(path, "iox-roudi", "-l", "info", (char *)NULL);
		_exit(127);
	}
	close(fd);
	env->roudi_pid = pid;
	for (unsigned ms = 0; ms < ROUDI_START_TIMEOUT_MS; ms += 20) {
		if (log_has(env->roudi_log, ROUDI_READY_LINE))
			return 0;
		int st;
		if (waitpid(pid, &st, WNOHANG) == pid) {
			env->roudi_pid = 0;
			char last[256];
			last_log_line(env->roudi_log, last, sizeof(last));
			snprintf(why, len, "%s exited (status %d) before it was ready: %s", path,
				 WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), last);
			(void)unlink(env->roudi_log);
			return -ECHILD;
		}
		sleep_ms(20);
	}
	stop_roudi(env);
	snprintf(why, len, "%s not ready after %u ms", path, ROUDI_START_TIMEOUT_MS);
	(void)unlink(env->roudi_log);
	return -ETIMEDOUT;
}

static void iox_teardown(struct rb_env *env)
{
	stop_roudi(env);
	if (env->roudi_log[0])
		(void)unlink(env->roudi_log);
}

static void iox_close(struct rb_chan *c)
{
	if (!c)
		return;
	if (c->ws)
		iox_ws_deinit(c->ws);
	if (c->sub)
		iox_sub_deinit(c->sub);
	if (c->pub)
		iox_pub_deinit(c->pub);
	iox_runtime_shutdown();
	free(c);
}

static int iox_open(struct rb_env *env, enum rb_role role, struct rb_chan **ret, char *why, size_t len)
{
	(void)env;
	struct rb_chan *c = calloc(1, sizeof(*c));
	if (!c) {
		snprintf(why, len, "out of memory");
		return -ENOMEM;
	}
	char name[64];
	snprintf(name, sizeof(name), "kvr-ringbench-%c-%d", role == RB_A ? 'a' : 'b', getpid());
	iox_set_loglevel(Iceoryx_LogLevel_Warn);
	iox_runtime_init(name);

	iox_pub_options_t po;
	iox_pub_options_init(&po);
	po.historyCapacity = 0;
	po.subscriberTooSlowPolicy = ConsumerTooSlowPolicy_WAIT_FOR_CONSUMER; /* lossless, like a ring */
	iox_sub_options_t so;
	iox_sub_options_init(&so);
	so.queueCapacity = IOX_QUEUE_CAPACITY;
	so.historyRequest = 0;
	so.queueFullPolicy = QueueFullPolicy_BLOCK_PRODUCER;

	c->pub = iox_pub_init(&c->pub_storage, "kvring", "ringbench", role == RB_A ? "a2b" : "b2a", &po);
	c->sub = iox_sub_init(&c->sub_storage, "kvring", "ringbench", role == RB_A ? "b2a" : "a2b", &so);
	c->ws = iox_ws_init(&c->ws_storage);
	if (!c->pub || !c->sub || !c->ws ||
	    iox_ws_attach_subscriber_state(c->ws, c->sub, SubscriberState_HAS_DATA, 0, NULL) != WaitSetResult_SUCCESS) {
		snprintf(why, len, "cannot create publisher, subscriber or waitset");
		iox_close(c);
		return -EIO;
	}
	/* Both directions connected before the first message: iceoryx drops what it sends to
	 * a service nobody subscribed to yet. */
	for (unsigned ms = 0;; ms++) {
		if (iox_sub_get_subscription_state(c->sub) == SubscribeState_SUBSCRIBED && iox_pub_has_subscribers(c->pub))
			break;
		if (ms >= MATCH_TIMEOUT_MS) {
			snprintf(why, len, "publisher and subscriber did not match within %u ms", MATCH_TIMEOUT_MS);
			iox_close(c);
			return -ETIMEDOUT;
		}
		sleep_ms(1);
	}
	*ret = c;
	return 0;
}

static int iox_send(struct rb_chan *c, const struct kvr_msg *m)
{
	void *p = NULL;
	enum iox_AllocationResult r = iox_pub_loan_chunk(c->pub, &p, sizeof(*m));
	if (r != AllocationResult_SUCCESS)
		return -ENOBUFS;
	memcpy(p, m, sizeof(*m));
	iox_pub_publish_chunk(c->pub, p); /* blocks while the subscriber's queue is full */
	return 0;
}

static int iox_recv(struct rb_chan *c, struct kvr_msg *m)
{
	for (;;) {
		const void *p = NULL;
		enum iox_ChunkReceiveResult r = iox_sub_take_chunk(c->sub, &p);
		if (r == ChunkReceiveResult_SUCCESS) {
			memcpy(m, p, sizeof(*m));
			iox_sub_release_chunk(c->sub, p);
			return 0;
		}
		if (r != ChunkReceiveResult_NO_CHUNK_AVAILABLE)
			return -EIO;
		iox_notification_info_t info[2];
		uint64_t missed = 0;
		iox_ws_wait(c->ws, info, 2, &missed);
	}
}

#endif /* KVR_HAVE_ICEORYX */

const struct rb_transport rb_iox_transport = {
	.name = "iceoryx",
#ifdef KVR_ICEORYX_VERSION
	.label = "iceoryx " KVR_ICEORYX_VERSION,
#else
	.label = "iceoryx",
#endif
	.setup = iox_setup,
	.teardown = iox_teardown,
	.open = iox_open,
	.send = iox_send,
	.recv = iox_recv,
	.close = iox_close,
};
