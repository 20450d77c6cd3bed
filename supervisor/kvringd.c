/* kvringd: the kvring supervisor — config, shared memory, actors, the attach socket, drain. */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include "kvr_build_config.h"
#include "kvr_log.h"
#include "kvr_time.h"
#include "notify.h"
#include "sup.h"

#define MS 1000000ull

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvringd [--config FILE]\n"
		"       kvringd --check-config FILE\n"
		"       kvringd --print-config-doc | --help | --version\n"
		"\n"
		"  --config FILE        start with this JSON config (default: built-in defaults)\n"
		"  --check-config FILE  validate FILE, print the effective config as JSON, exit 0;\n"
		"                       or print the reason and exit 2. Starts nothing.\n"
		"  --print-config-doc   print the config reference (markdown)\n"
		"  --help               this text\n"
		"  --version            print the version\n"
		"\n"
		"Signals: SIGTERM/SIGINT drain and exit 0 (a second one skips the drain wait);\n"
		"SIGHUP is ignored.\n");
}

/* ---- config ------------------------------------------------------------------------ */

/* Parse (file or built-in defaults) and check. Prints "kvringd: <reason>" on failure. */
static int load_config(const char *path, struct kvr_config *cfg)
{
	char err[512];
	int rc = path ? kvr_config_load_file(path, cfg, err, sizeof(err))
		      : kvr_config_parse("{}", cfg, err, sizeof(err));
	if (!rc)
		rc = sup_check_config(cfg, err, sizeof(err));
	if (rc)
		fprintf(stderr, "kvringd: %s\n", err);
	return rc;
}

/* ---- timers ------------------------------------------------------------------------ */

static void arm_timer(struct sup *s)
{
	uint64_t next = sup_actor_next_deadline(s);
	if (s->accept_resume && (!next || s->accept_resume < next))
		next = s->accept_resume;
	uint64_t conn = sup_conns_next_deadline(s);
	if (conn && (!next || conn < next))
		next = conn;
	if (s->phase == PH_DRAIN) {
		uint64_t poll = kvr_now_ns() + SUP_DRAIN_POLL_NS;
		uint64_t d = poll < s->drain_deadline ? poll : s->drain_deadline;
		if (!next || d < next)
			next = d;
	}
	struct itimerspec its = {0};
	if (next) {
		/* an absolute time in the past fires at once; 0 would disarm */
		its.it_value.tv_sec = (time_t)(next / 1000000000ull);
		its.it_value.tv_nsec = (long)(next % 1000000000ull);
		if (!its.it_value.tv_sec && !its.it_value.tv_nsec)
			its.it_value.tv_nsec = 1;
	}
	if (timerfd_settime(s->tfd, TFD_TIMER_ABSTIME, &its, NULL) < 0)
		kvr_err("timerfd_settime: %s", strerror(errno));
}

/* ---- drain ------------------------------------------------------------------------- */

/* In-flight work is done when every ring a live actor consumes is empty: the actor has
 * taken every request it was sent. Rings whose consumer is a client (replies) or a dead
 * actor cannot drain and are not waited for.
 * An actor whose handler is running (a store being copied and committed) is waited for
 * too, and so is every request an actor reports held (kvr_actor_set_held). */
static bool sup_drained(const struct sup *s)
{
	unsigned n = atomic_load(&s->ctl->n_rings);
	for (unsigned i = 0; i < n; i++) {
		int cons = kvr_ctl_ring_ent(s->ctl, i)->consumer;
		if (cons < 0 || (unsigned)cons >= s->n_actors)
			continue;
		if (atomic_load(&s->actors[cons].ent->state) != KVR_ACTOR_READY)
			continue;
		if (kvr_ring_count(kvr_ctl_ring(&s->rings, i)))
			return false;
	}
	/* a store taken off its ring may still be copying or committing */
	for (unsigned a = 0; a < s->n_actors; a++)
		if (atomic_load(&s->actors[a].ent->state) == KVR_ACTOR_READY &&
		    (atomic_load(&s->actors[a].ent->busy) || atomic_load(&s->actors[a].ent->held)))
			return false;
	return true;
}

static void begin_drain(struct sup *s, int sig)
{
	kvr_info("%s: draining (up to %u ms), no new connections", strsignal(sig), s->cfg.supervisor.drain_timeout_ms);
	s->phase = PH_DRAIN;
	atomic_store(&s->ctl->state, KVR_INST_DRAINING);
	(void)sup_notify("STOPPING=1");
	sup_socket_close(s);
	s->next_health = 0;
	s->drain_deadline = kvr_now_ns() + (uint64_t)s->cfg.supervisor.drain_timeout_ms * MS;
}

static void begin_stop(struct sup *s, const char *why)
{
	kvr_info("%s: stopping every actor", why);
	s->phase = PH_STOP;
	for (unsigned i = 0; i < s->n_actors; i++)
		sup_actor_event(s, &s->actors[i], EV_STOP, 0);
}

static void on_signal(struct sup *s)
{
	struct signalfd_siginfo si;
	while (read(s->sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
		switch (si.ssi_signo) {
		case SIGCHLD:
			sup_reap(s);
			break;
		case SIGTERM:
		case SIGINT:
			if (s->phase == PH_RUN)
				begin_drain(s, (int)si.ssi_signo);
			else if (s->phase == PH_DRAIN)
				begin_stop(s, "second signal");
			break;
		default:
			break;
		}
	}
}

/* ---- the loop ---------------------------------------------------------------------- */

static void run(struct sup *s)
{
	struct epoll_event evs[32];
	while (s->phase != PH_DONE) {
		arm_timer(s);
		int n = epoll_wait(s->epfd, evs, 32, -1);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			kvr_err("epoll_wait: %s", strerror(errno));
			return;
		}
		for (int i = 0; i < n; i++) {
			struct sup_watch *w = evs[i].data.ptr;
			switch (w->kind) {
			case W_SIGNAL:
				on_signal(s);
				break;
			case W_LISTEN:
				if (s->listen_fd >= 0)
					sup_accept(s);
				break;
			case W_TIMER: {
				uint64_t ticks;
				(void)!read(s->tfd, &ticks, sizeof(ticks));
				break;
			}
			case W_CONN:
				/* a connection is freed only while its own event is handled */
				sup_conn_input(s, w->ptr, evs[i].events);
				break;
			case W_READY:
				if (((struct sup_actor *)w->ptr)->ready_fd >= 0)
					sup_actor_ready_input(s, w->ptr);
				break;
			}
		}
		sup_conns_reap(s); /* after the batch: no event of it points at them any more */
		uint64_t now = kvr_now_ns();
		sup_actor_timers(s, now);
		sup_accept_resume(s, now);
		sup_conns_expire(s, now);
		sup_workers_update(s);
		sup_l1_release_update(s);
		if (s->phase == PH_DRAIN) {
			if (sup_drained(s))
				begin_stop(s, "rings drained");
			else if (now >= s->drain_deadline)
				begin_stop(s, "drain timeout");
		}
		if (s->phase == PH_STOP && sup_actors_all_down(s))
			s->phase = PH_DONE;
	}
}

/* ---- setup ------------------------------------------------------------------------- */

static int setup_fds(struct sup *s)
{
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGCHLD);
	if (sigprocmask(SIG_BLOCK, &set, NULL) < 0)
		return -errno;
	struct sigaction ign = {.sa_handler = SIG_IGN};
	sigemptyset(&ign.sa_mask);
	(void)sigaction(SIGHUP, &ign, NULL);
	(void)sigaction(SIGPIPE, &ign, NULL);

	s->epfd = epoll_create1(EPOLL_CLOEXEC);
	s->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
	s->tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (s->epfd < 0 || s->sigfd < 0 || s->tfd < 0)
		return -errno;
	s->sig_watch = (struct sup_watch){W_SIGNAL, NULL};
	s->timer_watch = (struct sup_watch){W_TIMER, NULL};
	int rc = sup_epoll_add(s, s->sigfd, &s->sig_watch, EPOLLIN);
	if (!rc)
		rc = sup_epoll_add(s, s->tfd, &s->timer_watch, EPOLLIN);
	return rc;
}

static void close_fd(int *fd)
{
	if (*fd >= 0)
		(void)close(*fd);
	*fd = -1;
}

/* Close what serve() opened, after a run or a failed start; an abnormal exit (code not 0)
 * kills every actor first. */
static void shut_down(struct sup *s, int code)
{
	if (s->ctl)
		atomic_store(&s->ctl->state, KVR_INST_STOPPED);
	sup_conns_close_all(s);
	sup_socket_close(s);
	sup_metrics_close(s);
	if (code) {
		/* an abnormal exit still leaves no actor behind */
		for (unsigned i = 0; i < s->n_actors; i++)
			if (s->actors[i].pid > 0)
				(void)kill(s->actors[i].pid, SIGKILL);
	}
	sup_actors_free(s);
	sup_prefault_stop(s);
	sup_segments_close(s);
	close_fd(&s->tfd);
	close_fd(&s->sigfd);
	close_fd(&s->epfd);
}

/* Start, serve until drained, shut down. Returns the exit code. */
static int serve(struct sup *s)
{
	char err[512];
	int code = 1, rc;

	kvr_log_setup("kvringd", (enum kvr_log_level)s->cfg.instance.log_level_id);
	/* before anything is opened or spawned: too few descriptors would start an instance
	 * whose actors fail later (a disk actor whose io_uring cannot be set up: L2 given up) */
	if (sup_nofile_check(&s->cfg, err, sizeof(err))) {
		fprintf(stderr, "kvringd: %s\n", err);
		return 1;
	}

	s->cfg_json = kvr_config_to_json(&s->cfg);
	if (!s->cfg_json) {
		fprintf(stderr, "kvringd: out of memory\n");
		return 1;
	}
	if (sup_find_executables(s, err, sizeof(err))) {
		fprintf(stderr, "kvringd: %s\n", err);
		return 1;
	}
	code = sup_socket_takeover(s);
	if (code)
		return code;
	code = 1;
	if (sup_metrics_open(s, err, sizeof(err))) {
		fprintf(stderr, "kvringd: $.metrics.listen: %s\n", err);
		code = 2;
		goto out;
	}
	rc = setup_fds(s);
	if (rc) {
		fprintf(stderr, "kvringd: cannot set up the event loop: %s\n", strerror(-rc));
		goto out;
	}
	s->generation = (uint32_t)(kvr_realtime_ns() / 1000000000ull);
	if (sup_segments_create(s))
		goto out;
	if (sup_actors_init(s)) {
		kvr_err("out of memory");
		goto out;
	}
	if (sup_socket_listen(s) || sup_metrics_start(s))
		goto out;
	if (s->slots)
		sup_prefault_start(s);

	kvr_info("kvringd %s started (pid %d, generation %u, %u worker slots, %u rings)", KVR_VERSION, (int)getpid(),
		 s->generation, s->cfg.instance.max_workers, atomic_load(&s->ctl->n_rings));
	s->phase = PH_RUN;
	s->next_health = kvr_now_ns() + (uint64_t)s->cfg.supervisor.health_interval_ms * MS;
	if (s->slots) {
		sup_actor_start(s, &s->actors[SUP_ACTOR_LOOKUP]);
		for (unsigned d = 0; d < s->cfg.l2.n_dirs; d++)
			sup_actor_start(s, &s->actors[SUP_ACTOR_DISK(s->cfg.instance.max_workers, d)]);
		if (SUP_N_REMOTE(&s->cfg))
			sup_actor_start(s, &s->actors[SUP_ACTOR_REMOTE(&s->cfg)]);
	} else {
		/* no model: nothing to start until the first worker attaches (sup_l1_bind); the
		 * instance serves attaches from now on */
		atomic_store(&s->ctl->state, KVR_INST_RUNNING);
		(void)sup_notify("READY=1");
	}
	run(s);
	if (s->phase == PH_DONE) {
		code = 0;
		kvr_info("stopped");
	}
out:
	shut_down(s, code);
	return code;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"config", required_argument, NULL, 'c'},
		{"check-config", required_argument, NULL, 'C'},
		{"print-config-doc", no_argument, NULL, 'D'},
		{"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 'V'},
		{0},
	};
	const char *config = NULL, *check = NULL;
	int c;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'c':
			config = optarg;
			break;
		case 'C':
			check = optarg;
			break;
		case 'D': {
			char *doc = kvr_config_doc_markdown();
			if (!doc)
				return 1;
			fputs(doc, stdout);
			free(doc);
			return 0;
		}
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			printf("kvringd %s\n", KVR_VERSION);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind != argc || (config && check)) {
		usage(stderr);
		return 2;
	}

	static struct sup sup; /* large: not on the stack */
	struct sup *s = &sup;
	s->argv0 = argv[0];
	s->epfd = s->sigfd = s->tfd = s->listen_fd = -1;
	s->ctl_seg.fd = s->arena_seg.fd = s->slots_seg.fd = -1;
	for (unsigned a = 0; a < KVR_CTL_MAX_CLIENTS; a++)
		s->area_fd[a] = -1;
	for (unsigned w = 0; w < KVR_CTL_MAX_WORKERS; w++)
		s->area_next_fd[w] = -1;
	for (unsigned w = 0; w < KVR_CTL_MAX_WORKERS; w++)
		s->kv_fd[w] = s->worker_engine[w] = -1;
	for (unsigned i = 0; i < KVR_CTL_MAX_SCHEDULERS; i++)
		s->sched_engine[i] = -1;
	sup_groups_init(s);
	if (check) {
		if (load_config(check, &s->cfg))
			return 2;
		char *json = kvr_config_to_json(&s->cfg);
		if (!json)
			return 1;
		printf("%s\n", json);
		free(json);
		if (s->cfg.model.unbound)
			fprintf(stderr, "kvringd: no model section: L1 (%llu bytes) is laid out for the geometry of the first "
				"worker that attaches, and every engine must name its model\n",
				(unsigned long long)s->cfg.l1.capacity_bytes);
		return 0;
	}
	if (load_config(config, &s->cfg))
		return 2;
	sup_notify_init();
	int code = serve(s);
	free(s->cfg_json);
	return code;
}
