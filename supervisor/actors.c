/* kvringd actors: spawn with a readiness pipe, the restart state machine, health pings, reaping. */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <kvring/msg.h>

#include "kvr_build_config.h"
#include "kvr_log.h"
#include "kvr_ring.h"
#include "kvr_time.h"
#include "notify.h"
#include "sup.h"

#define MS 1000000ull

/* ---- executables ------------------------------------------------------------------- */

static bool executable(const char *path)
{
	return access(path, X_OK) == 0;
}

int sup_find_executables(struct sup *s, char *err, size_t errlen)
{
	static const enum kvr_actor_kind kinds[] = {KVR_ACTOR_LOOKUP, KVR_ACTOR_LOADER, KVR_ACTOR_STORER, KVR_ACTOR_DISK,
						    KVR_ACTOR_GATHER, KVR_ACTOR_REMOTE};
	char self[PATH_MAX] = "";
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	self[n > 0 ? n : 0] = 0;
	const char *self_dir = n > 0 ? dirname(self) : NULL;

	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
		if (kinds[i] == KVR_ACTOR_DISK && !s->cfg.l2.n_dirs)
			continue; /* no L2: no disk actor to find */
		if (kinds[i] == KVR_ACTOR_REMOTE && !s->cfg.remote.n_cluster)
			continue; /* no shared tier */
		/* The gather actor serves DCP groups only: without it kvringd runs and refuses
		 * DCP ranks at attach, naming what is missing. */
		bool optional = kinds[i] == KVR_ACTOR_GATHER;
		const char *k = kvr_actor_kind_name(kinds[i]);
		char *dst = s->exe[kinds[i]];
		int len;
		if (s->cfg.instance.actor_dir[0]) {
			len = snprintf(dst, PATH_MAX, "%s/kvring-%s", s->cfg.instance.actor_dir, k);
			if (len < PATH_MAX && executable(dst))
				continue;
			if (optional) {
				kvr_warn("no executable kvring-%s in %s: DCP ranks will be refused", k,
					 s->cfg.instance.actor_dir);
				dst[0] = '\0';
				continue;
			}
			snprintf(err, errlen, "$.instance.actor_dir: no executable kvring-%s in %s", k,
				 s->cfg.instance.actor_dir);
			return -ENOENT;
		}
		if (self_dir) {
			/* the build tree: <build>/supervisor/kvringd next to <build>/actors/<k>/kvring-<k> */
			len = snprintf(dst, PATH_MAX, "%s/../actors/%s/kvring-%s", self_dir, k, k);
			if (len < PATH_MAX && executable(dst))
				continue;
			/* a relocated install (the wheel: <venv>/bin/kvringd next to
			 * <venv>/libexec/kvring/kvring-<k>; docs/packaging.md), wherever its prefix is */
			len = snprintf(dst, PATH_MAX, "%s/../libexec/kvring/kvring-%s", self_dir, k);
			if (len < PATH_MAX && executable(dst))
				continue;
		}
		len = snprintf(dst, PATH_MAX, "%s/kvring-%s", KVR_LIBEXECDIR, k);
		if (len < PATH_MAX && executable(dst))
			continue;
		if (optional) {
			kvr_warn("cannot find kvring-%s in %s/../actors/%s, %s/../libexec/kvring or %s: DCP ranks will "
				 "be refused",
				 k, self_dir ? self_dir : "?", k, self_dir ? self_dir : "?", KVR_LIBEXECDIR);
			dst[0] = '\0';
			continue;
		}
		snprintf(err, errlen,
			 "cannot find the actor executable kvring-%s (looked in %s/../actors/%s, %s/../libexec/kvring "
			 "and %s)",
			 k, self_dir ? self_dir : "?", k, self_dir ? self_dir : "?", KVR_LIBEXECDIR);
		return -ENOENT;
	}
	return 0;
}

int sup_actors_init(struct sup *s)
{
	s->n_actors = atomic_load(&s->ctl->n_actors);
	for (unsigned i = 0; i < s->n_actors; i++) {
		struct sup_actor *a = &s->actors[i];
		a->index = i;
		a->ent = kvr_ctl_actor(s->ctl, i);
		a->ctl_in = kvr_ctl_ring(&s->rings, a->ent->ctl_in);
		a->ctl_out = kvr_ctl_ring(&s->rings, a->ent->ctl_out);
		kvr_ring_claim_producer(a->ctl_in, getpid());
		kvr_ring_claim_consumer(a->ctl_out, getpid());
		a->exe = s->exe[a->ent->kind];
		a->ready_fd = -1;
		a->ready_watch = (struct sup_watch){W_READY, a};
		a->backoff_ms = s->cfg.supervisor.restart_backoff_initial_ms;
		a->deaths = calloc(s->cfg.supervisor.crash_loop_max_deaths, sizeof(uint64_t));
		if (!a->deaths)
			return -ENOMEM;
	}
	return 0;
}

void sup_actors_free(struct sup *s)
{
	for (unsigned i = 0; i < s->n_actors; i++) {
		struct sup_actor *a = &s->actors[i];
		if (a->ready_fd >= 0)
			(void)close(a->ready_fd);
		a->ready_fd = -1;
		free(a->deaths);
		a->deaths = NULL;
	}
}

static const char *name_of(const struct sup_actor *a)
{
	return a->ent->name;
}

static void set_state(struct sup_actor *a, enum kvr_actor_state st)
{
	atomic_store(&a->ent->state, st);
	kvr_futex_wake(&a->ent->state); /* a client attaching waits for READY on this word */
}

static unsigned state_of(const struct sup_actor *a)
{
	return atomic_load(&a->ent->state);
}

static void close_ready_pipe(struct sup *s, struct sup_actor *a)
{
	if (a->ready_fd < 0)
		return;
	sup_epoll_del(s, a->ready_fd);
	(void)close(a->ready_fd);
	a->ready_fd = -1;
}

/* ---- spawning ---------------------------------------------------------------------- */

static __attribute__((noreturn)) void child_exec(const char *exe, char *const argv[], const int *keep, int n_keep,
						 pid_t parent)
{
	sigset_t none;
	sigemptyset(&none);
	(void)sigprocmask(SIG_SETMASK, &none, NULL);
	(void)signal(SIGPIPE, SIG_DFL); /* SIG_IGN would survive exec */
	/* Own process group: a terminal's ^C reaches kvringd, which drains in order. */
	(void)setpgid(0, 0);
	/* An actor never outlives its supervisor: a new kvringd must find the memfds free, and
	 * nothing is left to serve (no one restarts, answers or drains). SIGKILL, not SIGTERM:
	 * an actor inside a handler (a store waiting up to 10 s for the lookup actor's reply)
	 * or stopped (SIGSTOP, a debugger) would not act on SIGTERM for as long as that lasts.
	 * If kvringd died between fork() and prctl(), the signal was never sent: then we have
	 * been reparented, and getppid() tells. */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
		_exit(1);
	for (int i = 0; i < n_keep; i++)
		if (fcntl(keep[i], F_SETFD, 0) < 0)
			_exit(127);
	execv(exe, argv);
	_exit(127);
}

/* Drop the PINGs and STOPs a dead predecessor left on ctl.in: a stale STOP would end the
 * new process at once. Other control messages (WORKER_GONE) are kept, in order. With no
 * consumer alive the supervisor may act as the consumer; it is the producer anyway. */
static void purge_stale_ctl(struct sup_actor *a)
{
	uint32_t n = kvr_ring_count(a->ctl_in);
	struct kvr_msg m;
	for (uint32_t i = 0; i < n && kvr_ring_try_dequeue(a->ctl_in, &m) == 0; i++)
		if (m.hdr.type != KVR_MSG_PING && m.hdr.type != KVR_MSG_STOP)
			(void)kvr_ring_try_enqueue(a->ctl_in, &m);
}

/* Which client areas actor a serves rings of: the lookup actor every client's, a loader or a
 * storer its worker's, a gather actor its group's members'; the disk and remote actors none.
 * An actor maps only those: a slot's area is replaced between two of its clients
 * (kvr_ctl_area_fresh), and only the lookup actor, which outlives them, follows. */
static void areas_served(struct sup *s, const struct sup_actor *a, bool *serves)
{
	unsigned kind = a->ent->kind, w = a->ent->index;
	if (kind == KVR_ACTOR_LOOKUP) {
		for (unsigned i = 0; i < s->ctl->n_areas && i < KVR_CTL_MAX_CLIENTS; i++)
			serves[i] = true;
	} else if ((kind == KVR_ACTOR_LOADER || kind == KVR_ACTOR_STORER) && w < s->ctl->max_workers) {
		serves[w] = true;
	} else if (kind == KVR_ACTOR_GATHER) {
		const struct sup_dcp_group *gr = sup_gather_group(s, a->index);
		for (unsigned r = 0; gr && r < gr->dcp_size; r++)
			if (gr->members[r] >= 0 && (unsigned)gr->members[r] < s->ctl->max_workers)
				serves[gr->members[r]] = true;
	}
}

/* An actor's command line and the fds it keeps across exec; argv points into the buffers. */
struct spawn_args {
	char *argv[18 + 4 * KVR_DCP_MAX];
	int keep[4 + KVR_CTL_MAX_CLIENTS + KVR_DCP_MAX];
	int n_keep, n_arg;
	char a_ctl[16], a_arena[16], a_idx[16], a_ready[16], a_slots[16];
	char a_areas[KVR_CTL_MAX_CLIENTS * 16];
	char a_group[KVR_DCP_MAX * 4], kv_str[KVR_DCP_MAX][2][24];
};

/* The arguments every actor gets: its segments, its index and its readiness pipe. */
static void args_base(struct sup *s, struct sup_actor *a, int ready_fd, struct spawn_args *sa)
{
	snprintf(sa->a_ctl, sizeof(sa->a_ctl), "%d", s->ctl_seg.fd);
	snprintf(sa->a_arena, sizeof(sa->a_arena), "%d", s->arena_seg.fd);
	snprintf(sa->a_idx, sizeof(sa->a_idx), "%u", a->index);
	snprintf(sa->a_ready, sizeof(sa->a_ready), "%d", ready_fd);
	snprintf(sa->a_slots, sizeof(sa->a_slots), "%d", s->slots_seg.fd);
	char *base[] = {(char *)a->exe, "--ctl-fd", sa->a_ctl, "--arena-fd", sa->a_arena, "--actor", sa->a_idx,
			"--ready-fd", sa->a_ready, "--slots-fd", sa->a_slots};
	memcpy(sa->argv, base, sizeof(base));
	sa->n_arg = 11;
	sa->keep[0] = s->ctl_seg.fd;
	sa->keep[1] = s->arena_seg.fd;
	sa->keep[2] = ready_fd;
	sa->keep[3] = s->slots_seg.fd;
	sa->n_keep = 4;
}

/* The client areas whose rings it serves, mapped over the control segment ("slot:fd"). */
static void args_areas(struct sup *s, struct sup_actor *a, struct spawn_args *sa)
{
	bool serves[KVR_CTL_MAX_CLIENTS] = {0};
	areas_served(s, a, serves);
	size_t a_len = 0;
	sa->a_areas[0] = '\0';
	for (unsigned ar = 0; ar < s->ctl->n_areas && ar < KVR_CTL_MAX_CLIENTS; ar++) {
		if (!serves[ar])
			continue;
		a_len += (size_t)snprintf(sa->a_areas + a_len, sizeof(sa->a_areas) - a_len, "%s%u:%d", a_len ? "," : "",
					  ar, s->area_fd[ar]);
		sa->keep[sa->n_keep++] = s->area_fd[ar];
	}
	if (a_len) {
		sa->argv[sa->n_arg++] = "--areas";
		sa->argv[sa->n_arg++] = sa->a_areas;
	}
}

/* The KV memory it works on: a loader's or storer's worker's, a gather actor's group's. */
static void args_kv(struct sup *s, struct sup_actor *a, struct spawn_args *sa)
{
	unsigned kind = a->ent->kind, w = a->ent->index;
	const struct sup_dcp_group *gr = sup_gather_group(s, a->index);
	unsigned n_kv = 0, kv_w[KVR_DCP_MAX];
	if ((kind == KVR_ACTOR_LOADER || kind == KVR_ACTOR_STORER) && w < KVR_CTL_MAX_WORKERS && s->kv_fd[w] >= 0)
		kv_w[n_kv++] = w;
	if (gr && sup_group_complete(gr)) {
		size_t off = 0;
		for (unsigned r = 0; r < gr->dcp_size; r++) {
			kv_w[n_kv++] = (unsigned)gr->members[r];
			off += (size_t)snprintf(sa->a_group + off, sizeof(sa->a_group) - off, "%s%d", r ? "," : "",
						gr->members[r]);
		}
		sa->argv[sa->n_arg++] = "--group";
		sa->argv[sa->n_arg++] = sa->a_group;
	}
	for (unsigned i = 0; i < n_kv; i++) {
		snprintf(sa->kv_str[i][0], sizeof(sa->kv_str[i][0]), "%d", s->kv_fd[kv_w[i]]);
		snprintf(sa->kv_str[i][1], sizeof(sa->kv_str[i][1]), "%llu", (unsigned long long)s->kv_bytes[kv_w[i]]);
		sa->argv[sa->n_arg++] = "--kv-fd";
		sa->argv[sa->n_arg++] = sa->kv_str[i][0];
		sa->argv[sa->n_arg++] = "--kv-bytes";
		sa->argv[sa->n_arg++] = sa->kv_str[i][1];
		sa->keep[sa->n_keep++] = s->kv_fd[kv_w[i]];
	}
}

/* The parent's side of a fork that worked: watch the readiness pipe (read end ready_fd) and
 * record the new process in the control segment. */
static void spawned(struct sup *s, struct sup_actor *a, pid_t pid, int ready_fd)
{
	(void)fcntl(ready_fd, F_SETFL, O_NONBLOCK);
	a->ready_fd = ready_fd;
	if (sup_epoll_add(s, a->ready_fd, &a->ready_watch, EPOLLIN) < 0)
		kvr_warn("%s: cannot watch the readiness pipe: the ready timeout will decide", name_of(a));
	a->pid = pid;
	atomic_store(&a->ent->pid, pid);
	a->ent->started_ns = kvr_now_ns();
	a->ping_outstanding = false;
	a->missed = 0;
	a->run_seen = a->starved = 0;
	a->term_sent = false;
}

static int spawn(struct sup *s, struct sup_actor *a)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	struct spawn_args sa;
	args_base(s, a, p[1], &sa);
	args_areas(s, a, &sa);
	args_kv(s, a, &sa);
	sa.argv[sa.n_arg] = NULL;
	pid_t parent = getpid();

	purge_stale_ctl(a);
	/* The dead predecessor may have left its sleeper count raised; nobody else sleeps on
	 * an actor's waiter. Reset it BEFORE the fork: once the child runs it may already have
	 * announced its sleep, and zeroing that would hide it from every waker. */
	atomic_store(&a->ent->waiter.sleepers, 0);
	atomic_store(&a->ent->held, 0); /* what a dead predecessor held died with it */
	/* The new incarnation's generation, BEFORE the fork: the child may read its rings
	 * before the parent runs again, and a request its dead predecessor left there (the
	 * client's wire id carries the old generation) must find the generation moved on, or
	 * the new actor would serve it as its own (found: a load addressed to a killed loader
	 * was copied and answered 0 by its successor under load). A failed fork leaves it
	 * moved on too: the actor is dead either way. */
	atomic_fetch_add(&a->ent->generation, 1);
	pid_t pid = fork();
	if (pid < 0) {
		int rc = -errno;
		(void)close(p[0]);
		(void)close(p[1]);
		return rc;
	}
	if (pid == 0)
		child_exec(a->exe, sa.argv, sa.keep, sa.n_keep, parent);

	(void)close(p[1]);
	spawned(s, a, pid, p[0]);
	return 0;
}

/* ---- the restart state machine ------------------------------------------------------
 * action[state][event], after s6-supervise: every (state, event) pair has exactly one
 * action; A_NONE means the event is ignored in that state. */

enum action {
	A_NONE,
	A_STARTING, /* spawned: wait for readiness, with a timeout */
	A_READY,    /* readiness byte arrived */
	A_DIED,     /* died while starting or serving: restart now, back off, or give up */
	A_KILL,     /* ready timeout or missed pings: kill -9 (the death follows) */
	A_STOP,     /* send STOP, escalate later */
	A_RESTART,  /* backoff over: spawn again */
	A_ESCALATE, /* still stopping: SIGTERM, then SIGKILL */
	A_STOPPED,  /* exited after a stop: idle */
	A_CANCEL,   /* stop while not running: idle */
};

static const uint8_t fsm[KVR_ACTOR_STOPPING + 1][EV_N] = {
	[KVR_ACTOR_IDLE] = {[EV_SPAWNED] = A_STARTING},
	[KVR_ACTOR_STARTING] = {[EV_READY] = A_READY, [EV_DIED] = A_DIED, [EV_TIMER] = A_KILL, [EV_STOP] = A_STOP},
	[KVR_ACTOR_READY] = {[EV_DIED] = A_DIED, [EV_TIMER] = A_KILL, [EV_STOP] = A_STOP},
	[KVR_ACTOR_BACKOFF] = {[EV_SPAWNED] = A_STARTING, [EV_TIMER] = A_RESTART, [EV_STOP] = A_CANCEL},
	[KVR_ACTOR_FAILED] = {[EV_STOP] = A_CANCEL},
	[KVR_ACTOR_STOPPING] = {[EV_DIED] = A_STOPPED, [EV_TIMER] = A_ESCALATE},
};

static void refresh_instance_state(struct sup *s)
{
	if (s->phase != PH_RUN)
		return;
	bool failed = false;
	for (unsigned i = 0; i < s->n_actors; i++)
		failed |= state_of(&s->actors[i]) == KVR_ACTOR_FAILED;
	unsigned cur = atomic_load(&s->ctl->state);
	unsigned want = failed ? KVR_INST_DEGRADED : cur == KVR_INST_STARTING ? KVR_INST_STARTING : KVR_INST_RUNNING;
	if (cur != want) {
		atomic_store(&s->ctl->state, want);
		kvr_info("instance %s", kvr_inst_state_name(want));
	}
}

/* The metrics thread reads these (metrics.c, relaxed atomic loads): store them atomically
 * too. Relaxed is enough: a scrape wants each value, not an order between them. */
static void record_exit(struct sup_actor *a, int status)
{
	bool sig = WIFSIGNALED(status);
	__atomic_store_n(&a->ent->last_exit_code, sig ? -1 : WEXITSTATUS(status), __ATOMIC_RELAXED);
	__atomic_store_n(&a->ent->last_exit_signal, sig ? WTERMSIG(status) : 0, __ATOMIC_RELAXED);
	a->pid = 0;
	atomic_store(&a->ent->pid, 0);
	atomic_store(&a->ent->held, 0); /* what it held died with it (its clients see it gone) */
}

static void describe_exit(int status, char *buf, size_t len)
{
	if (WIFSIGNALED(status))
		snprintf(buf, len, "killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
	else
		snprintf(buf, len, "exited with code %d", WEXITSTATUS(status));
}

/* Count a death; true when it completes a crash loop. */
static bool tally_death(struct sup *s, struct sup_actor *a, uint64_t now)
{
	unsigned max = s->cfg.supervisor.crash_loop_max_deaths;
	a->deaths[a->death_pos] = now;
	a->death_pos = (a->death_pos + 1) % max;
	if (a->n_deaths < max)
		a->n_deaths++;
	if (a->n_deaths < max)
		return false;
	/* the ring is full: death_pos now indexes the oldest of the last max deaths */
	uint64_t oldest = a->deaths[a->death_pos];
	return now - oldest <= (uint64_t)s->cfg.supervisor.crash_loop_window_s * 1000000000ull;
}

static void on_died(struct sup *s, struct sup_actor *a, int status, uint64_t now)
{
	char how[96];
	bool was_ready = state_of(a) == KVR_ACTOR_READY;
	uint64_t up_ms = was_ready ? (now - a->ent->ready_ns) / MS : 0;
	describe_exit(status, how, sizeof(how));
	record_exit(a, status);
	close_ready_pipe(s, a);
	a->deadline = 0;

	if (s->phase != PH_RUN) {
		kvr_info("%s %s while shutting down", name_of(a), how);
		set_state(a, KVR_ACTOR_IDLE);
		return;
	}
	if (tally_death(s, a, now)) {
		/* instance first: an observer that sees the FAILED actor sees the DEGRADED instance */
		atomic_store(&s->ctl->state, KVR_INST_DEGRADED);
		set_state(a, KVR_ACTOR_FAILED);
		kvr_err("%s %s: crash loop (%u deaths within %u s): giving up; instance degraded", name_of(a), how,
			s->cfg.supervisor.crash_loop_max_deaths, s->cfg.supervisor.crash_loop_window_s);
		return;
	}
	set_state(a, KVR_ACTOR_BACKOFF);
	if (was_ready && up_ms > s->cfg.supervisor.stable_after_ms) {
		a->backoff_ms = s->cfg.supervisor.restart_backoff_initial_ms;
		a->deadline = now; /* restart at once: the timer fires on the next loop turn */
		kvr_warn("%s %s after %llu ms up: restarting at once", name_of(a), how, (unsigned long long)up_ms);
		return;
	}
	a->deadline = now + (uint64_t)a->backoff_ms * MS;
	kvr_warn("%s %s%s: restarting in %u ms", name_of(a), how, was_ready ? " soon after start" : " before ready",
		 a->backoff_ms);
	uint64_t next = (uint64_t)a->backoff_ms * 2;
	uint32_t max = s->cfg.supervisor.restart_backoff_max_ms;
	a->backoff_ms = next > max ? max : (uint32_t)next;
}

static void do_spawn(struct sup *s, struct sup_actor *a)
{
	int rc = spawn(s, a);
	if (rc == 0) {
		sup_actor_event(s, a, EV_SPAWNED, 0);
		return;
	}
	/* A failed fork is a death: the same backoff and crash-loop rules apply. */
	kvr_err("%s: cannot spawn %s: %s", name_of(a), a->exe, strerror(-rc));
	set_state(a, KVR_ACTOR_STARTING);
	sup_actor_event(s, a, EV_DIED, W_EXITCODE(127, 0));
}

/* A_STARTING: spawned, the ready timeout armed. */
static void act_starting(struct sup *s, struct sup_actor *a, uint64_t now)
{
	set_state(a, KVR_ACTOR_STARTING);
	a->deadline = now + (uint64_t)s->cfg.supervisor.ready_timeout_ms * MS;
	kvr_info("%s started (pid %d, generation %u)", name_of(a), (int)a->pid, atomic_load(&a->ent->generation));
}

/* A_READY: the readiness byte came; the lookup actor's makes a starting instance run. */
static void act_ready(struct sup *s, struct sup_actor *a, uint64_t now)
{
	close_ready_pipe(s, a);
	a->deadline = 0;
	a->ent->ready_ns = now;
	set_state(a, KVR_ACTOR_READY);
	kvr_info("%s ready (pid %d) after %llu ms", name_of(a), (int)a->pid,
		 (unsigned long long)((now - a->ent->started_ns) / MS));
	if (a->index == SUP_ACTOR_LOOKUP && atomic_load(&s->ctl->state) == KVR_INST_STARTING) {
		atomic_store(&s->ctl->state, KVR_INST_RUNNING);
		(void)sup_notify("READY=1"); /* a Type=notify unit is started now */
	}
}

/* A_KILL: not ready in time (st STARTING) or missed pings: SIGKILL, the death follows. */
static void act_kill(struct sup *s, struct sup_actor *a, unsigned st)
{
	a->deadline = 0;
	a->ping_outstanding = false;
	a->missed = 0;
	if (st == KVR_ACTOR_STARTING)
		kvr_err("%s (pid %d) not ready within %u ms: killing it", name_of(a), (int)a->pid,
			s->cfg.supervisor.ready_timeout_ms);
	else
		kvr_err("%s (pid %d) missed %d pings in a row, with a CPU to answer them on: killing it (%llu health ticks "
			"it spent waiting for a CPU were not counted)", name_of(a), (int)a->pid, SUP_HEALTH_MAX_MISSED,
			(unsigned long long)a->starved);
	if (a->pid > 0)
		(void)kill(a->pid, SIGKILL);
}

/* A_STOP: a STOP on its control ring, the escalation timer armed. */
static void act_stop(struct sup_actor *a, uint64_t now)
{
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_STOP, 0, 0, 0, NULL, 0);
	if (sup_actor_send(a, &m))
		kvr_warn("%s: ctl ring full, STOP not queued: SIGTERM follows", name_of(a));
	set_state(a, KVR_ACTOR_STOPPING);
	a->stop_ns = now;
	a->term_sent = false;
	a->deadline = now + SUP_STOP_TERM_NS;
	kvr_info("%s (pid %d): stopping", name_of(a), (int)a->pid);
}

/* A_RESTART: the backoff is over; counted and spawned again. */
static void act_restart(struct sup *s, struct sup_actor *a)
{
	a->deadline = 0;
	/* one writer (this loop); the metrics thread loads it atomically */
	__atomic_store_n(&a->ent->restarts, a->ent->restarts + 1, __ATOMIC_RELAXED);
	do_spawn(s, a);
}

/* A_ESCALATE: still running after STOP: SIGTERM first, SIGKILL the next time. */
static void act_escalate(struct sup_actor *a)
{
	if (!a->term_sent) {
		kvr_warn("%s (pid %d) still running 2 s after STOP: SIGTERM", name_of(a), (int)a->pid);
		(void)kill(a->pid, SIGTERM);
		a->term_sent = true;
		a->deadline = a->stop_ns + SUP_STOP_KILL_NS;
	} else {
		kvr_err("%s (pid %d) still running 5 s after STOP: SIGKILL", name_of(a), (int)a->pid);
		(void)kill(a->pid, SIGKILL);
		a->deadline = 0;
	}
}

/* A_STOPPED: it exited after a stop; idle. */
static void act_stopped(struct sup *s, struct sup_actor *a, int status)
{
	char how[96];
	describe_exit(status, how, sizeof(how));
	record_exit(a, status);
	close_ready_pipe(s, a);
	a->deadline = 0;
	set_state(a, KVR_ACTOR_IDLE);
	kvr_info("%s stopped (%s)", name_of(a), how);
}

/* A_CANCEL: stopped while not running; idle, its death tally and backoff reset. */
static void act_cancel(struct sup *s, struct sup_actor *a)
{
	a->deadline = 0;
	a->n_deaths = 0;
	a->death_pos = 0;
	a->backoff_ms = s->cfg.supervisor.restart_backoff_initial_ms;
	set_state(a, KVR_ACTOR_IDLE);
}

void sup_actor_event(struct sup *s, struct sup_actor *a, enum sup_event ev, int status)
{
	unsigned st = state_of(a);
	enum action act = st <= KVR_ACTOR_STOPPING ? (enum action)fsm[st][ev] : A_NONE;
	uint64_t now = kvr_now_ns();

	switch (act) {
	case A_NONE:
		break;
	case A_STARTING:
		act_starting(s, a, now);
		break;
	case A_READY:
		act_ready(s, a, now);
		break;
	case A_DIED:
		on_died(s, a, status, now);
		break;
	case A_KILL:
		act_kill(s, a, st);
		break;
	case A_STOP:
		act_stop(a, now);
		break;
	case A_RESTART:
		act_restart(s, a);
		break;
	case A_ESCALATE:
		act_escalate(a);
		break;
	case A_STOPPED:
		act_stopped(s, a, status);
		break;
	case A_CANCEL:
		act_cancel(s, a);
		break;
	}
	refresh_instance_state(s);
}

void sup_actor_start(struct sup *s, struct sup_actor *a)
{
	if (state_of(a) != KVR_ACTOR_IDLE)
		return;
	a->n_deaths = 0;
	a->death_pos = 0;
	a->backoff_ms = s->cfg.supervisor.restart_backoff_initial_ms;
	do_spawn(s, a);
}

void sup_actor_ready_input(struct sup *s, struct sup_actor *a)
{
	char b;
	ssize_t n = read(a->ready_fd, &b, 1);
	if (n == 1) {
		sup_actor_event(s, a, EV_READY, 0);
		return;
	}
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	/* EOF without a byte: the child exited (or closed it); SIGCHLD tells the rest */
	close_ready_pipe(s, a);
}

void sup_reap(struct sup *s)
{
	for (;;) {
		int status;
		pid_t pid = waitpid(-1, &status, WNOHANG);
		if (pid <= 0)
			return;
		struct sup_actor *a = NULL;
		for (unsigned i = 0; i < s->n_actors && !a; i++)
			if (s->actors[i].pid == pid)
				a = &s->actors[i];
		if (!a) {
			kvr_debug("reaped unknown child %d", (int)pid);
			continue;
		}
		sup_actor_event(s, a, EV_DIED, status);
	}
}

/* ---- health ------------------------------------------------------------------------ */

int sup_actor_send(struct sup_actor *a, const void *msg)
{
	return kvr_ring_try_enqueue(a->ctl_in, msg);
}

/* Read every PONG an actor left on ctl.out. A malformed one is counted and ignored. */
static void drain_pongs(struct sup *s, struct sup_actor *a)
{
	struct kvr_msg m;
	while (kvr_ring_try_dequeue(a->ctl_out, &m) == 0) {
		struct kvr_msg_pong pong;
		if (kvr_msg_decode_pong(&m, &pong)) {
			atomic_fetch_add_explicit(&kvr_ctl_stats(s->ctl, a->index)->c[KVR_STAT_MALFORMED], 1,
						  memory_order_relaxed);
			/* we are ctl.out's consumer: rejected is ours to count */
			atomic_fetch_add_explicit(&a->ctl_out->shm->rejected, 1, memory_order_relaxed);
			kvr_debug("%s: malformed message on ctl.out rejected", name_of(a));
			continue;
		}
		if (a->pid <= 0 || pong.pid != a->pid)
			continue; /* from a predecessor that died: no news about this one */
		a->missed = 0;
		if (pong.nonce == a->nonce)
			a->ping_outstanding = false;
	}
}

/* pid's time on a CPU so far (/proc/PID/schedstat, ns) and whether it is runnable now
 * (/proc/PID/stat: state R). false when they cannot be read (the process is gone). */
static bool sched_now(pid_t pid, uint64_t *run_ns, bool *runnable)
{
	char path[48], buf[512];
	snprintf(path, sizeof(path), "/proc/%d/schedstat", (int)pid);
	FILE *f = fopen(path, "re");
	if (!f)
		return false;
	unsigned long long run;
	bool ok = fscanf(f, "%llu", &run) == 1;
	fclose(f);
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "re");
	if (!f)
		return false;
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	const char *close = strrchr(buf, ')'); /* "pid (comm) S ...": comm may hold anything */
	if (!ok || !close || close[1] != ' ')
		return false;
	*run_ns = run;
	*runnable = close[2] == 'R';
	return true;
}

/*
 * An unanswered ping counts as missed only if the actor had a CPU to answer it on: one
 * that is runnable but has not run at all since the last missed ping is starved by the
 * machine (two cores, a test suite beside it), not hung, and is not judged by this tick.
 * Hung actors still are: a loop that spins (it runs), or that sleeps on a lock, is stopped
 * or stuck in the kernel (it is not runnable).
 */
static bool starved_since_last_miss(struct sup_actor *a)
{
	uint64_t run;
	bool runnable;
	if (a->pid <= 0 || !sched_now(a->pid, &run, &runnable))
		return false;
	bool starved = runnable && run == a->run_seen;
	a->run_seen = run;
	if (starved) {
		a->starved++;
		atomic_fetch_add_explicit(&a->ent->health_starved, 1, memory_order_relaxed);
	}
	return starved;
}

static void health_tick(struct sup *s, uint64_t now)
{
	for (unsigned i = 0; i < s->n_actors; i++)
		drain_pongs(s, &s->actors[i]);
	if (s->phase != PH_RUN)
		return;
	for (unsigned i = 0; i < s->n_actors; i++) {
		struct sup_actor *a = &s->actors[i];
		if (state_of(a) != KVR_ACTOR_READY)
			continue;
		/* Liveness is the loop's, not one request's: an actor whose PING waits behind a
		 * long request but whose heartbeat moved (kvr_actor_beat between the request's
		 * steps) is busy, and is not pinged again until it answers; one whose heartbeat
		 * stands still as well misses the ping. */
		uint64_t beat = atomic_load_explicit(&a->ent->heartbeat_ns, memory_order_relaxed);
		bool moved = beat != a->beat_seen;
		a->beat_seen = beat;
		if (a->ping_outstanding && moved) {
			a->missed = 0;
			continue;
		}
		if (a->ping_outstanding && starved_since_last_miss(a))
			continue;
		if (a->ping_outstanding && ++a->missed >= SUP_HEALTH_MAX_MISSED) {
			sup_actor_event(s, a, EV_TIMER, 0);
			continue;
		}
		struct kvr_msg_ping ping = {.sent_ns = now, .nonce = ++a->nonce};
		struct kvr_msg m;
		kvr_msg_build(&m, KVR_MSG_PING, 0, a->nonce, 0, &ping, sizeof(ping));
		/* A full ctl.in means the actor does not read it: that is a missed ping too. */
		(void)sup_actor_send(a, &m);
		a->ping_outstanding = true;
	}
}

void sup_actor_timers(struct sup *s, uint64_t now)
{
	for (unsigned i = 0; i < s->n_actors; i++) {
		struct sup_actor *a = &s->actors[i];
		if (a->deadline && a->deadline <= now) {
			a->deadline = 0;
			sup_actor_event(s, a, EV_TIMER, 0);
		}
	}
	if (s->next_health && now >= s->next_health) {
		uint64_t period = (uint64_t)s->cfg.supervisor.health_interval_ms * MS;
		health_tick(s, now);
		s->next_health += period;
		if (s->next_health <= now)
			s->next_health = now + period;
	}
}

uint64_t sup_actor_next_deadline(const struct sup *s)
{
	uint64_t next = 0;
	for (unsigned i = 0; i < s->n_actors; i++) {
		uint64_t d = s->actors[i].deadline;
		if (d && (!next || d < next))
			next = d;
	}
	if (s->next_health && (!next || s->next_health < next))
		next = s->next_health;
	return next;
}

bool sup_actors_all_down(const struct sup *s)
{
	for (unsigned i = 0; i < s->n_actors; i++)
		if (s->actors[i].pid > 0)
			return false;
	return true;
}
