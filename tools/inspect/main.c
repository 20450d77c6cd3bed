/* kvring-inspect: attach read-only to a running kvring instance and show its rings, actors and messages. */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "inspect_render.h"
#include "kvr_config.h"
#include "kvr_proto.h"
#include "kvr_segment.h"
#include "kvr_time.h"

#define EXIT_CONNECT 1
#define EXIT_USAGE 2
#define DEFAULT_SOCKET "/tmp/kvring.sock"
#define DEFAULT_MESSAGES 8u
#define REPLY_TIMEOUT_S 5
#define REFRESH_TIMEOUT_S 1 /* --watch: a frame waits at most this for kvringd's engine table */

static volatile sig_atomic_t stop_flag;

static void on_sigint(int sig)
{
	(void)sig;
	stop_flag = 1;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: kvring-inspect [--socket PATH] [--json] [--watch [SECONDS]] [--messages N] [--all]\n"
		   "  --socket PATH    kvringd's socket (default: instance.socket of the config, %s)\n"
		   "  --json           machine-readable output (docs/inspect.md)\n"
		   "  --watch [S]      refresh every S seconds (default 1) until Ctrl-C; adds rates\n"
		   "  --messages N     in-flight messages shown per ring (default %u, 0 = none)\n"
		   "  --all            also list the idle actors and rings of free worker slots\n"
		   "exit status: 0 ok, 1 cannot connect or attach, 2 bad arguments\n",
		DEFAULT_SOCKET, DEFAULT_MESSAGES);
}

static int parse_seconds(const char *s, double *ret)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v) || v < 0.05 || v > 86400.0)
		return -EINVAL;
	*ret = v;
	return 0;
}

static int parse_count(const char *s, unsigned *ret)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(s, &end, 10);
	if (errno || end == s || *end || s[0] == '-' || v > KVR_INSP_MAX_MSGS)
		return -EINVAL;
	*ret = (unsigned)v;
	return 0;
}

/* kvringd's engine table from the last INSPECT reply (kvr_proto.h): its payload. */
static uint8_t engine_table[KVR_PROTO_PAYLOAD_MAX];
static size_t engine_table_len;

/* One INSPECT round trip: the reply's descriptors into fds (*ret_n_fds, the caller closes
 * them) and its payload into engine_table. 0, or -errno with the reason on stderr unless
 * quiet. */
static int inspect_request(const char *path, bool quiet, int timeout_s, int *fds, unsigned *ret_n_fds)
{
	*ret_n_fds = 0;
	int sock = kvr_proto_connect(path);
	if (sock < 0) {
		if (!quiet)
			fprintf(stderr, "kvring-inspect: cannot connect to %s: %s\n", path, strerror(-sock));
		return sock;
	}
	struct timeval tv = {.tv_sec = timeout_s};
	(void)setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));

	struct kvr_proto_req req = {.magic = KVR_PROTO_MAGIC, .version = KVR_PROTO_VERSION, .op = KVR_OP_INSPECT};
	static struct kvr_proto_rep rep; /* 20 KiB: not on the stack */
	unsigned n_fds = 0;
	int rc = kvr_proto_send(sock, &req, sizeof(req), NULL, 0);
	ssize_t n = rc ? rc : kvr_proto_recv(sock, &rep, sizeof(rep), fds, KVR_PROTO_MAX_FDS, &n_fds);
	close(sock);
	if (n == -EAGAIN || n == -EWOULDBLOCK) /* SO_RCVTIMEO ran out */
		n = -ETIMEDOUT;
	if (n <= 0) {
		if (!quiet)
			fprintf(stderr, "kvring-inspect: cannot connect to %s: %s\n", path,
				n == 0 ? "connection closed without a reply" : strerror((int)-n));
		return n == 0 ? -ECONNRESET : (int)n;
	}
	*ret_n_fds = n_fds;
	size_t hdr = offsetof(struct kvr_proto_rep, payload);
	if ((size_t)n < hdr || rep.magic != KVR_PROTO_MAGIC || rep.version != KVR_PROTO_VERSION) {
		if (!quiet)
			fprintf(stderr, "kvring-inspect: %s: reply is not a kvring protocol record\n", path);
		return -EPROTO;
	}
	if (rep.status < 0) {
		rep.reason[KVR_PROTO_REASON_MAX - 1] = '\0';
		if (!quiet)
			fprintf(stderr, "kvring-inspect: %s: inspect refused: %s (%s)\n", path, strerror(-rep.status),
				rep.reason);
		return rep.status;
	}
	/* the engine table: what the record holds of payload_len (validated when rendered) */
	size_t got = (size_t)n - hdr;
	engine_table_len = rep.payload_len < got ? rep.payload_len : got;
	if (engine_table_len > sizeof(engine_table))
		engine_table_len = sizeof(engine_table);
	memcpy(engine_table, rep.payload, engine_table_len);
	return 0;
}

/* Ask kvringd for the control segment. Returns a read-only mapping in *ret_seg, or exits
 * the way the contract says (message on stderr, status 1). */
static int fetch_ctl(const char *path, struct kvr_segment *ret_seg, struct kvr_segment *ret_slots)
{
	int fds[KVR_PROTO_MAX_FDS];
	unsigned n_fds = 0;
	int ret = -1;
	int rc = inspect_request(path, false, REPLY_TIMEOUT_S, fds, &n_fds);
	if (rc) {
		/* said on stderr */
	} else if (n_fds < 1) {
		fprintf(stderr, "kvring-inspect: %s: reply carries no control segment\n", path);
	} else {
		/* fds[0] the control segment, then the slot table and every client area in slot
		 * order (their rings are mapped over their places in it: kvr_ctl.h) */
		rc = kvr_ctl_map(fds[0], fds + 2, n_fds > 2 ? n_fds - 2 : 0, 0, ret_seg);
		if (rc)
			fprintf(stderr, "kvring-inspect: %s: cannot map the control segment: %s\n", path,
				strerror(-rc));
		else
			ret = 0;
		/* the slot table: shown when there is one and it maps */
		if (!rc && n_fds >= 2 && kvr_segment_map(fds[1], KVR_SEG_SLOTS, 0, ret_slots))
			ret_slots->base = NULL;
	}
	for (unsigned i = 0; i < n_fds; i++)
		close(fds[i]);
	return ret;
}

/* --watch: kvringd's engine table again for the next frame (the segment stays mapped);
 * 0 or -errno. */
static int refresh_engines(const char *path)
{
	int fds[KVR_PROTO_MAX_FDS];
	unsigned n_fds = 0;
	int rc = inspect_request(path, true, REFRESH_TIMEOUT_S, fds, &n_fds);
	for (unsigned i = 0; i < n_fds; i++)
		close(fds[i]);
	return rc;
}

static int show(const struct kvr_segment *seg, const struct kvr_segment *slots_seg, unsigned max_msgs, bool json, bool watch, bool pretty, bool all,
		int engines_rc, struct kvr_insp_snap *prev, struct kvr_insp_snap **ret_snap)
{
	struct kvr_ctl *c;
	int rc = kvr_ctl_attach(seg, &c, NULL); /* re-validated every time: the segment is not ours */
	if (rc) {
		fprintf(stderr, "kvring-inspect: control segment does not validate: %s\n", strerror(-rc));
		return rc;
	}
	struct kvr_insp_clock now = {.mono_ns = kvr_now_ns(), .real_ns = kvr_realtime_ns()};
	struct kvr_insp_snap *s;
	rc = kvr_insp_snapshot(c, &now, max_msgs, &s);
	if (rc) {
		fprintf(stderr, "kvring-inspect: %s\n", strerror(-rc));
		return rc;
	}
	s->hide_idle = !all;
	kvr_insp_read_page_tables(s);
	struct kvr_slot_table *t;
	if (slots_seg->base && kvr_slots_attach(slots_seg, &t) == 0)
		kvr_insp_snapshot_slots(s, t);
	if (engines_rc)
		s->engines_error = engines_rc; /* kvringd did not answer this frame's INSPECT */
	else
		(void)kvr_insp_snapshot_engines(s, c, engine_table, engine_table_len); /* a bad one: shown as such */
	if (json) {
		rc = kvr_insp_render_json(stdout, s, prev, pretty);
	} else {
		if (watch) {
			char t[32];
			time_t wall = (time_t)(now.real_ns / 1000000000ull);
			struct tm tm;
			strftime(t, sizeof(t), "%H:%M:%S", localtime_r(&wall, &tm));
			fputs("\033[H\033[2J", stdout); /* home + clear screen */
			printf("kvring-inspect --watch  %s  (Ctrl-C quits)\n\n", t);
		}
		rc = kvr_insp_render_text(stdout, s, prev);
	}
	if (fflush(stdout) && !rc)
		rc = -EIO;
	*ret_snap = s;
	return rc;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"socket", required_argument, NULL, 's'}, {"json", no_argument, NULL, 'j'},
		{"watch", optional_argument, NULL, 'w'},  {"messages", required_argument, NULL, 'm'},
		{"help", no_argument, NULL, 'h'},	  {"all", no_argument, NULL, 'a'},
		{0},
	};
	struct kvr_config cfg;
	kvr_config_defaults(&cfg);
	const char *path = cfg.instance.socket[0] ? cfg.instance.socket : DEFAULT_SOCKET;
	bool json = false, watch = false, all = false;
	double interval = 1.0;
	unsigned max_msgs = DEFAULT_MESSAGES;

	opterr = 0;
	for (;;) {
		int o = getopt_long(argc, argv, "+s:jw::m:ha", opts, NULL);
		if (o < 0)
			break;
		switch (o) {
		case 's':
			path = optarg;
			break;
		case 'j':
			json = true;
			break;
		case 'a':
			all = true;
			break;
		case 'w':
			watch = true;
			/* "--watch 2" as well as "--watch=2": take a following number */
			if (!optarg && optind < argc && argv[optind][0] != '-') {
				optarg = argv[optind++];
			}
			if (optarg && parse_seconds(optarg, &interval)) {
				fprintf(stderr, "kvring-inspect: --watch: not a number of seconds in [0.05, 86400]: %s\n",
					optarg);
				return EXIT_USAGE;
			}
			break;
		case 'm':
			if (parse_count(optarg, &max_msgs)) {
				fprintf(stderr, "kvring-inspect: --messages: not a count in [0, %u]: %s\n",
					KVR_INSP_MAX_MSGS, optarg);
				return EXIT_USAGE;
			}
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			fprintf(stderr, "kvring-inspect: bad option: %s\n", argv[optind - 1]);
			usage(stderr);
			return EXIT_USAGE;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "kvring-inspect: unexpected argument: %s\n", argv[optind]);
		usage(stderr);
		return EXIT_USAGE;
	}

	struct kvr_segment seg, slots = {.fd = -1};
	if (fetch_ctl(path, &seg, &slots))
		return EXIT_CONNECT;

	struct sigaction sa = {.sa_handler = on_sigint}; /* no SA_RESTART: the sleep must end */
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	int status = 0, engines_rc = 0;
	struct kvr_insp_snap *prev = NULL, *cur = NULL;
	do {
		int rc = show(&seg, &slots, max_msgs, json, watch, !watch, all, engines_rc, prev, &cur);
		kvr_insp_snap_free(prev);
		prev = cur;
		cur = NULL;
		if (rc) {
			status = EXIT_CONNECT;
			break;
		}
		if (!watch)
			break;
		struct timespec ts = {.tv_sec = (time_t)interval,
				      .tv_nsec = (long)((interval - floor(interval)) * 1e9)};
		while (!stop_flag && nanosleep(&ts, &ts) < 0 && errno == EINTR)
			;
		if (!stop_flag) /* engines attach and leave: the next frame asks kvringd again */
			engines_rc = refresh_engines(path);
	} while (!stop_flag);

	kvr_insp_snap_free(prev);
	kvr_segment_close(&seg);
	if (slots.base)
		kvr_segment_close(&slots);
	return status;
}
