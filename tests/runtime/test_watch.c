/* The actor loop's fd and timer watches (actors/runtime/watch.c), stepped by hand: dispatch, sleep, wake. */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "kvr_actor.h"
#include "kvr_time.h"
#include "watch.h"

/*
 * No actor process here: a zeroed struct kvr_actor is all the watch code uses, so the test
 * plays the loop itself — kvr_watch_dispatch() is one pass, kvr_watch_sleep() the sleep —
 * and asserts which callbacks ran in which step. The waiter is an ordinary futex word.
 */

static struct kvr_actor act;
static struct kvr_waiter waiter;

struct seen {
	unsigned calls;
	uint32_t revents;
	int fd;
	bool drain;           /* read the eventfd in the callback */
};

static void on_fd(struct kvr_actor *a, int fd, uint32_t revents, void *arg)
{
	cr_assert_eq(a, &act);
	struct seen *s = arg;
	s->calls++;
	s->revents = revents;
	s->fd = fd;
	if (s->drain) {
		uint64_t v;
		cr_assert_eq(read(fd, &v, sizeof(v)), (ssize_t)sizeof(v));
	}
}

static void setup(void)
{
	memset(&act, 0, sizeof(act));
	memset(&waiter, 0, sizeof(waiter));
}

static void teardown(void)
{
	kvr_watch_close(&act);
}

TestSuite(watch, .init = setup, .fini = teardown, .timeout = 30);

/* Sleep until something completes (bounded), then one dispatch pass; returns callbacks run. */
static unsigned sleep_and_pass(int64_t timeout_ns)
{
	uint32_t seen = kvr_waiter_prepare(&waiter);
	int rc = kvr_watch_sleep(&act, &waiter, seen, timeout_ns);
	kvr_waiter_finish(&waiter);
	cr_assert(rc == 0 || rc == -EINTR, "sleep: %s", strerror(-rc));
	return kvr_watch_dispatch(&act, kvr_now_ns());
}

Test(watch, a_ready_fd_wakes_the_sleep_and_runs_its_callback_level_triggered)
{
	int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	struct seen s = {0};
	int id = kvr_actor_watch_fd(&act, efd, POLLIN, on_fd, &s);
	cr_assert_geq(id, 0);
	cr_assert(kvr_watch_uses_uring(&act));
	cr_assert_eq(kvr_watch_dispatch(&act, kvr_now_ns()), 0, "nothing ready yet");
	cr_assert_eq(s.calls, 0);
	uint64_t one = 1;
	cr_assert_eq(write(efd, &one, sizeof(one)), (ssize_t)sizeof(one));
	uint64_t t0 = kvr_now_ns();
	cr_assert_eq(sleep_and_pass(5000000000ll), 1);
	cr_assert_lt(kvr_now_ns() - t0, 1000000000ull, "the fd, not the timeout, ended the sleep");
	cr_assert_eq(s.calls, 1);
	cr_assert_eq(s.fd, efd);
	cr_assert(s.revents & POLLIN);
	/* not drained: still ready, so the re-armed watch reports it again */
	cr_assert_eq(sleep_and_pass(5000000000ll), 1);
	cr_assert_eq(s.calls, 2);
	/* drained in the callback: the next sleep runs to its timeout with no callback */
	s.drain = true;
	cr_assert_eq(sleep_and_pass(5000000000ll), 1);
	cr_assert_eq(s.calls, 3);
	cr_assert_eq(sleep_and_pass(20000000ll), 0);
	cr_assert_eq(s.calls, 3);
	close(efd);
}

Test(watch, paused_and_ended_watches_run_nothing)
{
	int efd = eventfd(1, EFD_CLOEXEC | EFD_NONBLOCK); /* ready from the start */
	struct seen s = {0};
	int id = kvr_actor_watch_fd(&act, efd, 0, on_fd, &s); /* paused */
	cr_assert_geq(id, 0);
	cr_assert_eq(sleep_and_pass(20000000ll), 0, "a paused watch is not polled");
	kvr_actor_watch_events(&act, id, POLLIN);
	cr_assert_eq(sleep_and_pass(5000000000ll), 1);
	cr_assert_eq(s.calls, 1);
	kvr_actor_unwatch_fd(&act, id);
	cr_assert(!kvr_watch_uses_uring(&act), "no fd watched any more");
	/* the fd is still ready; an ended watch never calls back (the poll was removed) */
	cr_assert_eq(kvr_watch_dispatch(&act, kvr_now_ns()), 0);
	kvr_actor_unwatch_fd(&act, id); /* twice: ignored */
	kvr_actor_watch_events(&act, id, POLLIN);
	cr_assert_eq(s.calls, 1);
	close(efd);
}

static void *waker(void *arg)
{
	(void)arg;
	usleep(20000);
	kvr_waiter_wake(&waiter);
	return NULL;
}

/* The futex word wakes the io_uring sleep exactly as it wakes a futex sleep: a producer's
 * kvr_waiter_wake() ends it, and a word that moved before the sleep ends it at once. */
Test(watch, a_ring_wake_ends_the_sleep)
{
	int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	struct seen s = {0};
	cr_assert_geq(kvr_actor_watch_fd(&act, efd, POLLIN, on_fd, &s), 0);
	pthread_t th;
	uint32_t seen = kvr_waiter_prepare(&waiter);
	cr_assert_eq(pthread_create(&th, NULL, waker, NULL), 0);
	uint64_t t0 = kvr_now_ns();
	cr_assert_eq(kvr_watch_sleep(&act, &waiter, seen, 5000000000ll), 0);
	kvr_waiter_finish(&waiter);
	uint64_t took = kvr_now_ns() - t0;
	pthread_join(th, NULL);
	cr_assert_lt(took, 2000000000ull, "woken after %llu ms", (unsigned long long)(took / 1000000));
	cr_assert_neq(atomic_load(&waiter.seq), seen, "the wake moved the word");
	/* the word moved since `seen`: a sleep on the old value returns at once */
	t0 = kvr_now_ns();
	cr_assert_eq(kvr_watch_sleep(&act, &waiter, seen, 5000000000ll), 0);
	cr_assert_lt(kvr_now_ns() - t0, 1000000000ull);
	cr_assert_eq(kvr_watch_dispatch(&act, kvr_now_ns()), 0, "no fd was ready");
	close(efd);
}

struct tick {
	unsigned calls;
	uint64_t at;
};

static void on_timer(struct kvr_actor *a, uint64_t now_ns, void *arg)
{
	(void)a;
	struct tick *t = arg;
	t->calls++;
	t->at = now_ns;
}

/* Timers with an injected clock: dispatch fires exactly the ones due at the `now` it is given. */
Test(watch, timers_fire_once_when_due_and_stop_cancels)
{
	struct tick t1 = {0}, t2 = {0}, t3 = {0};
	uint64_t base = 1000000000000ull;
	cr_assert_eq(kvr_watch_deadline(&act), UINT64_MAX);
	int a = kvr_actor_timer_start(&act, base + 300, on_timer, &t1);
	int b = kvr_actor_timer_start(&act, base + 100, on_timer, &t2);
	int c = kvr_actor_timer_start(&act, base + 200, on_timer, &t3);
	cr_assert(a >= 0 && b >= 0 && c >= 0 && a != b && b != c);
	cr_assert_eq(kvr_watch_deadline(&act), base + 100, "the earliest deadline bounds the sleep");
	cr_assert(!kvr_watch_uses_uring(&act), "timers alone need no io_uring");
	cr_assert_eq(kvr_watch_dispatch(&act, base + 99), 0);
	cr_assert_eq(kvr_watch_dispatch(&act, base + 150), 1);
	cr_assert_eq(t2.calls, 1);
	cr_assert_eq(t2.at, base + 150);
	kvr_actor_timer_stop(&act, c);
	cr_assert_eq(kvr_watch_deadline(&act), base + 300);
	cr_assert_eq(kvr_watch_dispatch(&act, base + 1000), 1);
	cr_assert_eq(t1.calls, 1);
	cr_assert_eq(t3.calls, 0, "stopped");
	cr_assert_eq(kvr_watch_dispatch(&act, base + 2000), 0, "one-shot");
	kvr_actor_timer_stop(&act, b); /* fired already: ignored */
	/* a new timer in a reused slot has a new id: the old id cannot stop it */
	int d = kvr_actor_timer_start(&act, base + 3000, on_timer, &t3);
	cr_assert_geq(d, 0);
	cr_assert_neq(d, c);
	kvr_actor_timer_stop(&act, c);
	cr_assert_eq(kvr_watch_dispatch(&act, base + 3000), 1);
	cr_assert_eq(t3.calls, 1);
	/* the table is bounded */
	struct tick many = {0};
	unsigned n = 0;
	while (kvr_actor_timer_start(&act, base + 5000, on_timer, &many) >= 0)
		n++;
	cr_assert_eq(n, KVR_ACTOR_MAX_TIMERS);
	cr_assert_eq(kvr_actor_timer_start(&act, base, on_timer, &many), -ENOSPC);
	cr_assert_eq(kvr_watch_dispatch(&act, base + 5000), KVR_ACTOR_MAX_TIMERS);
}

Test(watch, bad_arguments_are_refused)
{
	struct seen s = {0};
	cr_assert_eq(kvr_actor_watch_fd(&act, -1, POLLIN, on_fd, &s), -EINVAL);
	cr_assert_eq(kvr_actor_watch_fd(&act, 0, POLLIN, NULL, &s), -EINVAL);
	cr_assert_eq(kvr_actor_timer_start(&act, 1, NULL, NULL), -EINVAL);
	int fds[KVR_ACTOR_MAX_WATCHES + 1];
	for (unsigned i = 0; i <= KVR_ACTOR_MAX_WATCHES; i++) {
		fds[i] = eventfd(0, EFD_CLOEXEC);
		int id = kvr_actor_watch_fd(&act, fds[i], POLLIN, on_fd, &s);
		if (i < KVR_ACTOR_MAX_WATCHES)
			cr_assert_geq(id, 0);
		else
			cr_assert_eq(id, -ENOSPC);
	}
	for (unsigned i = 0; i <= KVR_ACTOR_MAX_WATCHES; i++)
		close(fds[i]);
}
