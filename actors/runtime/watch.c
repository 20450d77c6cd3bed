/* watch: fd and timer watches of the actor loop — one io_uring wait covers the ring futex, the fds and the next deadline. */
#include "watch.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include <liburing.h>

#include "kvr_log.h"

/*
 * How it works
 * ------------
 * The ring is created with the first fd watch (an actor that watches nothing keeps the
 * plain futex sleep of actor.c and pays nothing here). Each watched fd has at most one
 * one-shot IORING_OP_POLL_ADD outstanding; its completion marks the fd ready, the next
 * kvr_watch_dispatch() runs the callback and arms a new poll (a one-shot poll checks the
 * fd's state when it is armed: level-triggered). The sleep adds one IORING_OP_FUTEX_WAIT on
 * the actor's waiter word with the value kvr_waiter_prepare() saw, so the ring wakes the
 * actor exactly as a futex sleep would: any producer's kvr_waiter_wake() completes it. A
 * futex wait left pending by a wake that came from an fd stays armed for the next sleep
 * when the word has not moved; when it has moved, a wake is on its way (kvr_waiter_wake
 * bumps the word and then calls FUTEX_WAKE), so the sleep returns at once.
 *
 * Completions are told apart by user_data: UD_FUTEX, or a watch's index and generation
 * (a completion of a poll armed before kvr_actor_watch_events / kvr_actor_unwatch_fd
 * changed the watch carries an old generation and is dropped).
 */

#define RING_ENTRIES 128u
#define UD_FUTEX (1ull << 63)
#define UD_REMOVE (1ull << 62)     /* the completion of a POLL_REMOVE: nothing to do */
#define UD_GEN_SHIFT 16

/* io_uring FUTEX_WAIT (Linux 6.7); liburing 2.3 has no helper for it, the SQE is filled by
 * hand as the kernel's io_uring/futex.c reads it. */
#define OP_FUTEX_WAIT 51
#define FUTEX2_SIZE_U32_FLAG 0x02u
#define FUTEX_MATCH_ANY 0xffffffffull

struct fdw {
	int fd;
	uint32_t events;           /* wanted; 0 = paused */
	kvr_actor_fd_fn fn;
	void *arg;
	uint16_t gen;              /* bumped whenever an outstanding poll becomes stale */
	bool live;
	bool armed;                /* a poll with this gen is outstanding */
	uint32_t ready;            /* revents from a completed poll, not yet dispatched */
};

struct tmr {
	uint64_t deadline;
	kvr_actor_timer_fn fn;
	void *arg;
	uint16_t gen;
	bool live;
};

struct kvr_actor_watch {
	struct io_uring ring;
	bool ring_up;
	bool futex_ok;             /* the kernel has io_uring FUTEX_WAIT */
	bool futex_pending;
	uint32_t futex_seen;       /* the value the pending futex wait sleeps on */
	unsigned prepared;         /* SQEs prepared and not submitted yet */
	unsigned n_fds;
	struct fdw fds[KVR_ACTOR_MAX_WATCHES];
	struct tmr timers[KVR_ACTOR_MAX_TIMERS];
};

static struct kvr_actor_watch *watch_get(struct kvr_actor *a)
{
	if (!a->watch) {
		a->watch = calloc(1, sizeof(*a->watch));
		if (!a->watch)
			return NULL;
		for (unsigned i = 0; i < KVR_ACTOR_MAX_WATCHES; i++)
			a->watch->fds[i].fd = -1;
	}
	return a->watch;
}

static int ring_up(struct kvr_actor_watch *w)
{
	if (w->ring_up)
		return 0;
	int rc = io_uring_queue_init(RING_ENTRIES, &w->ring, 0);
	if (rc < 0)
		return rc;
	w->ring_up = true;
	struct io_uring_probe *p = io_uring_get_probe_ring(&w->ring);
	w->futex_ok = p && io_uring_opcode_supported(p, OP_FUTEX_WAIT);
	if (p)
		io_uring_free_probe(p);
	if (!w->futex_ok)
		kvr_warn("this kernel's io_uring cannot wait on a futex (Linux < 6.7): with fds watched, rings are "
			 "looked at every %lld us while idle", KVR_WATCH_FALLBACK_NS / 1000);
	return 0;
}

/* An SQE, submitting what is prepared when the submission queue is full. */
static struct io_uring_sqe *sqe_get(struct kvr_actor_watch *w)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&w->ring);
	if (!sqe) {
		(void)io_uring_submit(&w->ring);
		w->prepared = 0;
		sqe = io_uring_get_sqe(&w->ring);
	}
	if (sqe)
		w->prepared++;
	return sqe;
}

static uint64_t ud_fd(unsigned i, uint16_t gen)
{
	return ((uint64_t)gen << UD_GEN_SHIFT) | i;
}

/* Cancel the outstanding poll of watch i (its completion, -ECANCELED or a late result, then
 * carries a stale generation). */
static void disarm(struct kvr_actor_watch *w, unsigned i)
{
	struct fdw *f = &w->fds[i];
	if (f->armed) {
		struct io_uring_sqe *sqe = sqe_get(w);
		if (sqe) {
			io_uring_prep_poll_remove(sqe, ud_fd(i, f->gen));
			io_uring_sqe_set_data64(sqe, UD_REMOVE);
		}
		f->armed = false;
	}
	f->gen++;
	f->ready = 0;
}

static void arm(struct kvr_actor_watch *w, unsigned i)
{
	struct fdw *f = &w->fds[i];
	if (!f->live || f->armed || !f->events || f->ready)
		return;
	struct io_uring_sqe *sqe = sqe_get(w);
	if (!sqe)
		return; /* retried on the next dispatch */
	io_uring_prep_poll_add(sqe, f->fd, f->events);
	io_uring_sqe_set_data64(sqe, ud_fd(i, f->gen));
	f->armed = true;
}

int kvr_actor_watch_fd(struct kvr_actor *a, int fd, uint32_t events, kvr_actor_fd_fn fn, void *arg)
{
	if (fd < 0 || !fn)
		return -EINVAL;
	struct kvr_actor_watch *w = watch_get(a);
	if (!w)
		return -ENOMEM;
	int rc = ring_up(w);
	if (rc)
		return rc;
	for (unsigned i = 0; i < KVR_ACTOR_MAX_WATCHES; i++) {
		struct fdw *f = &w->fds[i];
		if (f->live)
			continue;
		uint16_t gen = (uint16_t)(f->gen + 1);
		*f = (struct fdw){.fd = fd, .events = events, .fn = fn, .arg = arg, .gen = gen, .live = true};
		w->n_fds++;
		arm(w, i);
		return (int)i;
	}
	return -ENOSPC;
}

void kvr_actor_watch_events(struct kvr_actor *a, int id, uint32_t events)
{
	struct kvr_actor_watch *w = a->watch;
	if (!w || id < 0 || id >= KVR_ACTOR_MAX_WATCHES || !w->fds[id].live || w->fds[id].events == events)
		return;
	disarm(w, (unsigned)id);
	w->fds[id].events = events;
	arm(w, (unsigned)id);
}

void kvr_actor_unwatch_fd(struct kvr_actor *a, int id)
{
	struct kvr_actor_watch *w = a->watch;
	if (!w || id < 0 || id >= KVR_ACTOR_MAX_WATCHES || !w->fds[id].live)
		return;
	disarm(w, (unsigned)id);
	w->fds[id].live = false;
	w->fds[id].fd = -1;
	w->n_fds--;
	/* the POLL_REMOVE goes out now: the caller may close the fd next */
	if (w->prepared) {
		(void)io_uring_submit(&w->ring);
		w->prepared = 0;
	}
}

#define TIMER_ID(i, gen) ((int)(((unsigned)(gen) << 8) | (i)))

int kvr_actor_timer_start(struct kvr_actor *a, uint64_t deadline_ns, kvr_actor_timer_fn fn, void *arg)
{
	_Static_assert(KVR_ACTOR_MAX_TIMERS <= 256, "timer ids keep the index in 8 bits");
	if (!fn)
		return -EINVAL;
	struct kvr_actor_watch *w = watch_get(a);
	if (!w)
		return -ENOMEM;
	for (unsigned i = 0; i < KVR_ACTOR_MAX_TIMERS; i++) {
		struct tmr *t = &w->timers[i];
		if (t->live)
			continue;
		uint16_t gen = (uint16_t)((t->gen + 1) & 0x7fff);
		*t = (struct tmr){.deadline = deadline_ns, .fn = fn, .arg = arg, .gen = gen, .live = true};
		return TIMER_ID(i, gen);
	}
	return -ENOSPC;
}

void kvr_actor_timer_stop(struct kvr_actor *a, int id)
{
	struct kvr_actor_watch *w = a->watch;
	if (!w || id < 0)
		return;
	unsigned i = (unsigned)id & 0xff;
	if (i < KVR_ACTOR_MAX_TIMERS && w->timers[i].live && TIMER_ID(i, w->timers[i].gen) == id)
		w->timers[i].live = false;
}

uint64_t kvr_watch_deadline(const struct kvr_actor *a)
{
	const struct kvr_actor_watch *w = a->watch;
	uint64_t d = UINT64_MAX;
	if (!w)
		return d;
	for (unsigned i = 0; i < KVR_ACTOR_MAX_TIMERS; i++)
		if (w->timers[i].live && w->timers[i].deadline < d)
			d = w->timers[i].deadline;
	return d;
}

bool kvr_watch_uses_uring(const struct kvr_actor *a)
{
	return a->watch && a->watch->ring_up && a->watch->n_fds;
}

/* Take every completion off the CQ: mark fds ready, note the futex wait's end. */
static void reap(struct kvr_actor_watch *w)
{
	struct io_uring_cqe *cqe;
	unsigned head, n = 0;
	io_uring_for_each_cqe(&w->ring, head, cqe) {
		n++;
		uint64_t ud = io_uring_cqe_get_data64(cqe);
		if (ud == UD_FUTEX) {
			w->futex_pending = false;
			continue;
		}
		if (ud & UD_REMOVE)
			continue;
		unsigned i = (unsigned)(ud & ((1u << UD_GEN_SHIFT) - 1));
		uint16_t gen = (uint16_t)(ud >> UD_GEN_SHIFT);
		if (i >= KVR_ACTOR_MAX_WATCHES)
			continue;
		struct fdw *f = &w->fds[i];
		if (!f->live || f->gen != gen)
			continue; /* stale: the watch changed after this poll was armed */
		f->armed = false;
		/* a failed poll (bad fd) is reported as an error on the fd: the callback decides */
		f->ready = cqe->res < 0 ? POLLERR : (uint32_t)cqe->res;
	}
	io_uring_cq_advance(&w->ring, n);
}

unsigned kvr_watch_dispatch(struct kvr_actor *a, uint64_t now_ns)
{
	struct kvr_actor_watch *w = a->watch;
	unsigned ran = 0;
	if (!w)
		return 0;
	for (unsigned i = 0; i < KVR_ACTOR_MAX_TIMERS; i++) {
		struct tmr *t = &w->timers[i];
		if (t->live && t->deadline <= now_ns) {
			t->live = false; /* before fn: it may start another timer in this slot */
			t->fn(a, now_ns, t->arg);
			ran++;
		}
	}
	if (w->ring_up) {
		reap(w);
		for (unsigned i = 0; i < KVR_ACTOR_MAX_WATCHES; i++) {
			struct fdw *f = &w->fds[i];
			if (!f->live || !f->ready)
				continue;
			uint32_t rev = f->ready;
			f->ready = 0;
			f->fn(a, f->fd, rev, f->arg);
			ran++;
		}
		for (unsigned i = 0; i < KVR_ACTOR_MAX_WATCHES; i++)
			arm(w, i);
		if (w->prepared) {
			(void)io_uring_submit(&w->ring);
			w->prepared = 0;
		}
	}
	return ran;
}

int kvr_watch_sleep(struct kvr_actor *a, struct kvr_waiter *wt, uint32_t seen, int64_t timeout_ns)
{
	struct kvr_actor_watch *w = a->watch;
	if (w->futex_ok) {
		if (w->futex_pending && w->futex_seen != seen) {
			/* the word moved since that wait was armed: its wake is on its way */
			timeout_ns = 0;
		} else if (!w->futex_pending) {
			struct io_uring_sqe *sqe = sqe_get(w);
			if (!sqe)
				return -EBUSY;
			memset(sqe, 0, sizeof(*sqe));
			sqe->opcode = OP_FUTEX_WAIT;
			sqe->fd = FUTEX2_SIZE_U32_FLAG; /* futex2 flags: a shared (not private) u32 */
			sqe->addr = (uint64_t)(uintptr_t)&wt->seq;
			sqe->off = seen;
			sqe->addr3 = FUTEX_MATCH_ANY;
			io_uring_sqe_set_data64(sqe, UD_FUTEX);
			w->futex_pending = true;
			w->futex_seen = seen;
		}
	} else if (timeout_ns < 0 || timeout_ns > KVR_WATCH_FALLBACK_NS) {
		timeout_ns = KVR_WATCH_FALLBACK_NS;
	}
	if (timeout_ns < 0 || timeout_ns > INT64_MAX / 2)
		timeout_ns = INT64_MAX / 2;
	struct __kernel_timespec ts = {.tv_sec = timeout_ns / 1000000000, .tv_nsec = timeout_ns % 1000000000};
	struct io_uring_cqe *cqe;
	int rc = io_uring_submit_and_wait_timeout(&w->ring, &cqe, 1, &ts, NULL);
	w->prepared = 0;
	if (rc == -ETIME || rc >= 0)
		return 0;
	return rc;
}

void kvr_watch_close(struct kvr_actor *a)
{
	struct kvr_actor_watch *w = a->watch;
	if (!w)
		return;
	if (w->ring_up)
		io_uring_queue_exit(&w->ring);
	free(w);
	a->watch = NULL;
}
