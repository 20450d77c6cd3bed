/* Ring tests: validation, peek, backpressure, waiters, wake-up syscalls, consumer death. */
#include <criterion/criterion.h>

#include <linux/filter.h>
#include <linux/futex.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>

#include "kvr_ring.h"
#include "kvr_segment.h"
#include "ipc_test.h"

#define MSG 64u
#define SEG_SIZE (1u << 20)
#define SHARED_OFF 64u  /* test bookkeeping shared with children, up to RING_OFF */
#define RING_OFF 4096u  /* first ring */
#define MS 1000000ll

static struct kvr_segment seg = {.fd = -1};

static void setup(void)
{
	cr_assert_eq(kvr_segment_create("kvr-test-ring", KVR_SEG_CTL, SEG_SIZE, 1, 0, &seg), 0);
}

static void teardown(void)
{
	kill_kids();
	kvr_segment_close(&seg);
}

static void *at(size_t off)
{
	return (uint8_t *)seg.base + off;
}

/* Shared bookkeeping of one test, in the segment (children see the parent's writes). */
static void *shared(void)
{
	return at(SHARED_OFF);
}

/* Waiters a test ring may point at: any aligned word of the test segment (the tests put
 * shared waiters in its bookkeeping area). */
static bool in_segment(const void *ctx, uintptr_t addr)
{
	(void)ctx;
	return addr >= (uintptr_t)seg.base && addr + sizeof(struct kvr_waiter) <= (uintptr_t)seg.base + seg.size;
}
static const struct kvr_ring_waiters seg_waiters = {.ok = in_segment};

/* Views of the rings a test made: process-private (a forked child gets its own copy). */
static struct kvr_ring views[64];
static unsigned n_views;

static struct kvr_ring *view_at(size_t off)
{
	cr_assert_lt(n_views, sizeof(views) / sizeof(views[0]));
	struct kvr_ring *r = &views[n_views];
	cr_assert_eq(kvr_ring_view(at(off), seg.size - off, &seg_waiters, r), 0);
	n_views++;
	return r;
}

static struct kvr_ring *make_ring(size_t off, uint32_t cap, uint32_t msg_size, const char *name)
{
	size_t sz = kvr_ring_memsize(cap, msg_size);
	cr_assert_neq(sz, 0);
	cr_assert_leq(off + sz, seg.size);
	cr_assert_eq(kvr_ring_init(at(off), cap, msg_size, name), 0);
	return view_at(off);
}

TestSuite(ring, .init = setup, .fini = teardown);

/* ---- validation --------------------------------------------------------------------- */

Test(ring, memsize)
{
	static const struct {
		uint32_t cap, msz;
		size_t want;
	} t[] = {
		{0, 64, 0},       {1, 64, 0},          {3, 64, 0},       {6, 64, 0},     {(1u << 30) + 1, 64, 0},
		{1u << 31, 64, 0}, {0x80000000u, 8, 0}, {2, 0, 0},        {2, 4, 0},      {2, 12, 0},
		{2, 4104, 0},      {2, 8192, 0},        {2, 64, 448},     {2, 8, 384},    {8, 64, 832},
		{1024, 64, 65856}, {2, 4096, 8512},     {4, 24, 448},     {1u << 30, 8, 320 + (8ull << 30)},
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		cr_expect_eq(kvr_ring_memsize(t[i].cap, t[i].msz), t[i].want, "memsize(%u, %u) = %zu, want %zu",
			     t[i].cap, t[i].msz, kvr_ring_memsize(t[i].cap, t[i].msz), t[i].want);
}

Test(ring, init)
{
	uint8_t *mem = at(RING_OFF);
	memset(mem, 0xa5, 2048);
	cr_assert_eq(kvr_ring_init(NULL, 8, MSG, "x"), -EINVAL);
	cr_assert_eq(kvr_ring_init(mem + 8, 8, MSG, "x"), -EINVAL, "misaligned memory accepted");
	cr_assert_eq(kvr_ring_init(mem + 32, 8, MSG, "x"), -EINVAL, "misaligned memory accepted");
	cr_assert_eq(kvr_ring_init(mem, 6, MSG, "x"), -EINVAL);
	cr_assert_eq(kvr_ring_init(mem, 8, 60, "x"), -EINVAL);
	for (int i = 0; i < 2048; i++)
		cr_assert_eq(mem[i], 0xa5, "a rejected init wrote byte %d", i);

	const char *longname = "a-ring-name-much-longer-than-thirty-one-characters";
	cr_assert_eq(kvr_ring_init(mem, 8, MSG, longname), 0);
	struct kvr_ring_shm *r = (struct kvr_ring_shm *)mem;
	cr_assert_eq(r->magic, KVR_RING_MAGIC);
	cr_assert_eq(r->version, KVR_RING_VERSION);
	cr_assert_eq(r->capacity, 8);
	cr_assert_eq(r->msg_size, MSG);
	cr_assert_eq(r->data_off, sizeof(struct kvr_ring_shm));
	cr_assert_eq(r->cons_waiter_off, offsetof(struct kvr_ring_shm, own_cons_waiter));
	cr_assert_eq(r->prod_waiter_off, offsetof(struct kvr_ring_shm, own_prod_waiter));
	struct kvr_ring *v = view_at(RING_OFF);
	cr_assert_eq(v->shm, r);
	cr_assert_eq(v->data, mem + sizeof(struct kvr_ring_shm));
	cr_assert_eq(v->mask, 7);
	cr_assert_eq(v->msg_size, MSG);
	cr_assert_eq(kvr_ring_consumer_waiter(v), &r->own_cons_waiter);
	cr_assert_eq(kvr_ring_producer_waiter(v), &r->own_prod_waiter);
	cr_assert_eq(strlen(r->name), KVR_RING_NAME_MAX - 1);
	cr_assert_eq(strncmp(r->name, longname, KVR_RING_NAME_MAX - 1), 0);
	cr_assert_eq(atomic_load(&r->head), 0);
	cr_assert_eq(atomic_load(&r->tail), 0);
	cr_assert_eq(atomic_load(&r->enqueued), 0);
	cr_assert_eq(atomic_load(&r->own_cons_waiter.seq), 0);
	cr_assert_eq(atomic_load(&r->own_cons_waiter.sleepers), 0);
	cr_assert_eq(kvr_ring_count(v), 0);
	cr_assert_eq(kvr_ring_free(v), 8);

	cr_assert_eq(kvr_ring_init(mem, 8, MSG, NULL), 0);
	cr_assert_eq(r->name[0], '\0');
}

Test(ring, attach_rejects)
{
	const uint32_t cap = 8;
	size_t sz = kvr_ring_memsize(cap, MSG);
	uint8_t *good = at(RING_OFF), *bad = at(RING_OFF + 8192);
	cr_assert_eq(kvr_ring_init(good, cap, MSG, "good"), 0);
	struct kvr_ring canary, r;
	memset(&canary, 0x5a, sizeof(canary));
	r = canary;

	cr_assert_eq(kvr_ring_view(good, sz, NULL, &r), 0);
	cr_assert_eq(r.shm, (struct kvr_ring_shm *)good);

	enum { MAGIC, VERSION, CAP_NPOT, CAP_BIG, MSGSZ, DATA_OFF, NAME, CONS_W, PROD_W, CONS_W_WILD, N_CORRUPT };
	static const char *const what[] = {"magic", "version", "capacity 3", "capacity 16", "msg_size 60",
					   "data_off", "name without NUL", "consumer waiter not its own (no legal others)",
					   "producer waiter on the consumer's", "consumer waiter offset INT64_MIN"};
	static const int want[] = {-EPROTO, -EPROTO, -EINVAL, -EINVAL, -EINVAL, -EINVAL, -EINVAL, -EINVAL, -EINVAL, -EINVAL};
	for (int k = 0; k < N_CORRUPT; k++) {
		memcpy(bad, good, sz);
		struct kvr_ring_shm *b = (struct kvr_ring_shm *)bad;
		switch (k) {
		case MAGIC: b->magic ^= 1; break;
		case VERSION: b->version = KVR_RING_VERSION + 1; break;
		case CAP_NPOT: b->capacity = 3; break;
		case CAP_BIG: b->capacity = 16; break; /* valid, but does not fit in avail */
		case MSGSZ: b->msg_size = 60; break;
		case DATA_OFF: b->data_off = 0; break;
		case NAME: memset(b->name, 'n', sizeof(b->name)); break;
		case CONS_W: b->cons_waiter_off = -64; break;
		case PROD_W: b->prod_waiter_off = offsetof(struct kvr_ring_shm, own_cons_waiter); break;
		case CONS_W_WILD: b->cons_waiter_off = INT64_MIN; break;
		}
		r = canary;
		int rc = kvr_ring_view(bad, sz, NULL, &r);
		cr_expect_eq(rc, want[k], "%s: got %d", what[k], rc);
		cr_expect_eq(memcmp(&r, &canary, sizeof(r)), 0, "%s: the view written on failure", what[k]);
	}
	r = canary;
	cr_expect_eq(kvr_ring_view(good, sz - 1, NULL, &r), -EINVAL, "truncated avail accepted");
	cr_expect_eq(kvr_ring_view(good, sizeof(struct kvr_ring_shm) - 1, NULL, &r), -EINVAL);
	cr_expect_eq(kvr_ring_view(good, 0, NULL, &r), -EINVAL);
	cr_expect_eq(kvr_ring_view(good + 8, sz, NULL, &r), -EINVAL, "misaligned attach accepted");
	cr_expect_eq(kvr_ring_view(NULL, sz, NULL, &r), -EINVAL);
	cr_expect_eq(memcmp(&r, &canary, sizeof(r)), 0);
}

Test(ring, peek_does_not_consume)
{
	struct kvr_ring *r = make_ring(RING_OFF, 8, MSG, "peek");
	uint8_t m[MSG], out[MSG], canary[MSG];
	memset(canary, 0xee, sizeof(canary));
	for (uint64_t i = 0; i < 5; i++) {
		stamp(m, i, 7);
		cr_assert_eq(kvr_ring_try_enqueue(r, m), 0);
	}
	for (int pass = 0; pass < 2; pass++)
		for (uint32_t i = 0; i < 5; i++) {
			cr_assert_eq(kvr_ring_peek(r, i, out), 0);
			cr_assert_eq(stamp_check(out, i, 7), 0, "peek %u", i);
		}
	cr_assert_eq(atomic_load(&r->shm->head), 0, "peek moved head");
	cr_assert_eq(atomic_load(&r->shm->dequeued), 0);
	cr_assert_eq(kvr_ring_count(r), 5);
	memcpy(out, canary, MSG);
	cr_assert_eq(kvr_ring_peek(r, 5, out), -ENOENT);
	cr_assert_eq(kvr_ring_peek(r, 100, out), -ENOENT);
	cr_assert_eq(kvr_ring_peek(r, UINT32_MAX, out), -ENOENT);
	cr_assert_arr_eq(out, canary, MSG, "failed peek wrote its output");

	/* after consuming two, peek 0 is the third; then fill up across the wrap */
	cr_assert_eq(kvr_ring_dequeue_burst(r, out, 1), 1);
	cr_assert_eq(kvr_ring_try_dequeue(r, out), 0);
	cr_assert_eq(stamp_check(out, 1, 7), 0);
	cr_assert_eq(kvr_ring_peek(r, 0, out), 0);
	cr_assert_eq(stamp_check(out, 2, 7), 0);
	for (uint64_t i = 5; i < 10; i++) {
		stamp(m, i, 7);
		cr_assert_eq(kvr_ring_try_enqueue(r, m), 0);
	}
	cr_assert_eq(kvr_ring_count(r), 8);
	for (uint32_t i = 0; i < 8; i++) {
		cr_assert_eq(kvr_ring_peek(r, i, out), 0);
		cr_assert_eq(stamp_check(out, 2 + i, 7), 0, "peek %u after wrap", i);
	}
	cr_assert_eq(kvr_ring_peek(r, 8, out), -ENOENT);
	cr_assert_eq(atomic_load(&r->shm->head), 2);
}

/* Free-running 32-bit indices: a ring keeps working when tail and head wrap past 2^32. */
Test(ring, index_wrap)
{
	struct kvr_ring *r = make_ring(RING_OFF, 8, MSG, "wrap");
	atomic_store(&r->shm->head, UINT32_MAX - 20);
	atomic_store(&r->shm->tail, UINT32_MAX - 20);
	uint8_t buf[16 * MSG], out[16 * MSG];
	uint64_t sent = 0, got = 0;
	struct rng g = {42};
	for (int round = 0; round < 200; round++) {
		unsigned n = 1 + rng_below(&g, 12);
		for (unsigned i = 0; i < n; i++)
			stamp(buf + i * MSG, sent + i, 3);
		uint32_t room = kvr_ring_free(r);
		unsigned k = kvr_ring_enqueue_burst(r, buf, n);
		cr_assert_eq(k, n < room ? n : room);
		sent += k;
		cr_assert_eq(kvr_ring_count(r), sent - got);
		if (k < n) {
			cr_assert_eq(kvr_ring_try_enqueue(r, buf + k * MSG), -EAGAIN);
		}
		unsigned d = kvr_ring_dequeue_burst(r, out, 1 + rng_below(&g, 12));
		for (unsigned i = 0; i < d; i++)
			cr_assert_eq(stamp_check(out + i * MSG, got + i, 3), 0, "message %llu", (unsigned long long)(got + i));
		got += d;
	}
	got += kvr_ring_dequeue_burst(r, out, 16);
	cr_assert_eq(got, sent);
	cr_assert_eq(atomic_load(&r->shm->tail), (uint32_t)(UINT32_MAX - 20 + sent));
	cr_assert_lt(atomic_load(&r->shm->tail), 1000, "tail did not wrap (sent %llu)", (unsigned long long)sent);
	cr_assert_eq(kvr_ring_count(r), 0);
}

Test(ring, message_sizes)
{
	static const uint32_t sizes[] = {8, 24, 4096};
	size_t off = RING_OFF;
	for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
		uint32_t msz = sizes[s];
		struct kvr_ring *r = make_ring(off, 4, msz, "sizes");
		off += kvr_ring_memsize(4, msz);
		uint8_t in[4 * 4096], out[4 * 4096 + 64];
		for (uint32_t i = 0; i < 4 * msz; i++)
			in[i] = (uint8_t)(i * 31 + msz);
		memset(out, 0, sizeof(out));
		cr_assert_eq(kvr_ring_enqueue_burst(r, in, 5), 4);
		cr_assert_eq(kvr_ring_try_enqueue(r, in), -EAGAIN);
		cr_assert_eq(kvr_ring_dequeue(r, out, -1), 0);
		cr_assert_eq(kvr_ring_dequeue_burst(r, out + msz, 8), 3);
		cr_assert_arr_eq(out, in, 4 * msz, "msg_size %u", msz);
		cr_assert_eq(out[4 * msz], 0, "msg_size %u: dequeue wrote past the messages", msz);
	}
}

/* ---- backpressure ------------------------------------------------------------------- */

struct bp_shared {
	_Atomic uint64_t done_ns;
	_Atomic int32_t rc;
	_Atomic uint32_t started;
	uint8_t msg[MSG];
};

static int blocked_producer(void *arg)
{
	struct kvr_ring *r = arg;
	struct bp_shared *s = shared();
	kvr_ring_claim_producer(r, getpid());
	uint8_t m[MSG];
	stamp(m, 8, 1);
	atomic_store(&s->started, 1);
	int rc = kvr_ring_enqueue(r, m, -1);
	atomic_store(&s->done_ns, kvr_now_ns());
	atomic_store(&s->rc, rc);
	return 0;
}

Test(ring, backpressure_producer)
{
	struct kvr_ring *r = make_ring(RING_OFF, 8, MSG, "bp");
	struct bp_shared *s = shared();
	uint8_t m[MSG], out[MSG];
	kvr_ring_claim_producer(r, getpid());
	for (uint64_t i = 0; i < 8; i++) {
		stamp(m, i, 1);
		cr_assert_eq(kvr_ring_try_enqueue(r, m), 0, "try %llu", (unsigned long long)i);
	}
	cr_assert_eq(kvr_ring_count(r), 8);
	cr_assert_eq(kvr_ring_free(r), 0);
	stamp(m, 8, 1);
	cr_assert_eq(kvr_ring_try_enqueue(r, m), -EAGAIN);
	cr_assert_eq(kvr_ring_enqueue(r, m, 0), -EAGAIN, "timeout 0 is a try");
	cr_assert_eq(kvr_ring_enqueue_burst(r, m, 1), 0);

	uint64_t fw0 = atomic_load(&r->shm->full_waits), fwns0 = atomic_load(&r->shm->full_wait_ns);
	uint64_t t0 = kvr_now_ns();
	cr_assert_eq(kvr_ring_enqueue(r, m, 50 * MS), -ETIMEDOUT);
	uint64_t el = kvr_now_ns() - t0;
	cr_assert_geq(el, 50 * MS, "timed enqueue returned after %llu ns", (unsigned long long)el);
	cr_assert_lt(el, 2000 * MS);
	cr_assert_eq(atomic_load(&r->shm->full_waits), fw0 + 1);
	cr_assert_geq(atomic_load(&r->shm->full_wait_ns) - fwns0, 50 * MS);
	cr_assert_eq(atomic_load(&r->shm->enqueued), 8);
	cr_assert_eq(atomic_load(&r->shm->prod_blocked), 0);
	cr_assert_eq(kvr_ring_count(r), 8);

	/* another process blocks on the full ring until we take exactly one message */
	pid_t pid = spawn(blocked_producer, r);
	cr_assert_gt(pid, 0);
	cr_assert_eq(wait_u32(&r->shm->prod_blocked, 1, 5000), 0, "producer never reported blocked");
	cr_assert_eq(atomic_load(&r->shm->prod_pid), pid);
	cr_assert_eq(wait_u32(&r->shm->own_prod_waiter.sleepers, 1, 5000), 0, "producer never announced its sleep");
	sleep_us(20000);
	cr_assert_eq(atomic_load(&s->done_ns), 0, "blocking enqueue returned on a full ring");
	cr_assert_eq(atomic_load(&r->shm->prod_blocked), 1);
	cr_assert_eq(kvr_ring_count(r), 8);

	uint64_t t_deq = kvr_now_ns();
	cr_assert_eq(kvr_ring_try_dequeue(r, out), 0);
	int st;
	cr_assert_eq(reap(pid, 5000, &st), 0, "blocked producer did not complete after a dequeue");
	cr_assert_eq(exit_code(st), 0);
	cr_assert_eq(atomic_load(&s->rc), 0);
	uint64_t done = atomic_load(&s->done_ns);
	cr_assert_geq(done, t_deq, "enqueue completed before the dequeue");
	fprintf(stderr, "backpressure: blocked producer resumed %.1f us after the dequeue\n",
		(double)(done - t_deq) / 1e3);
	cr_assert_eq(stamp_check(out, 0, 1), 0);
	cr_assert_eq(kvr_ring_count(r), 8);
	cr_assert_eq(atomic_load(&r->shm->enqueued), 9);
	cr_assert_eq(atomic_load(&r->shm->full_waits), fw0 + 2);
	cr_assert_eq(atomic_load(&r->shm->prod_blocked), 0);
	cr_assert_eq(atomic_load(&r->shm->own_prod_waiter.sleepers), 0);
	for (uint64_t i = 1; i <= 8; i++) {
		cr_assert_eq(kvr_ring_try_dequeue(r, out), 0);
		cr_assert_eq(stamp_check(out, i, 1), 0, "message %llu", (unsigned long long)i);
	}
	cr_assert_eq(kvr_ring_try_dequeue(r, out), -EAGAIN);
}

static int blocked_consumer(void *arg)
{
	struct kvr_ring *r = arg;
	struct bp_shared *s = shared();
	kvr_ring_claim_consumer(r, getpid());
	atomic_store(&s->started, 1);
	int rc = kvr_ring_dequeue(r, s->msg, -1);
	atomic_store(&s->done_ns, kvr_now_ns());
	atomic_store(&s->rc, rc);
	return 0;
}

Test(ring, backpressure_consumer)
{
	struct kvr_ring *r = make_ring(RING_OFF, 8, MSG, "empty");
	struct bp_shared *s = shared();
	uint8_t m[MSG], out[MSG], canary[MSG];
	memset(canary, 0xc3, MSG);
	memcpy(out, canary, MSG);
	cr_assert_eq(kvr_ring_try_dequeue(r, out), -EAGAIN);
	cr_assert_eq(kvr_ring_dequeue(r, out, 0), -EAGAIN);
	cr_assert_eq(kvr_ring_dequeue_burst(r, out, 4), 0);
	uint64_t es0 = atomic_load(&r->shm->empty_sleeps);
	uint64_t t0 = kvr_now_ns();
	cr_assert_eq(kvr_ring_dequeue(r, out, 50 * MS), -ETIMEDOUT);
	uint64_t el = kvr_now_ns() - t0;
	cr_assert_geq(el, 50 * MS, "timed dequeue returned after %llu ns", (unsigned long long)el);
	cr_assert_lt(el, 2000 * MS);
	cr_assert_geq(atomic_load(&r->shm->empty_sleeps), es0 + 1, "the timed dequeue never slept");
	cr_assert_eq(atomic_load(&r->shm->cons_blocked), 0);
	cr_assert_eq(atomic_load(&r->shm->own_cons_waiter.sleepers), 0);
	cr_assert_arr_eq(out, canary, MSG, "failed dequeue wrote its output");
	cr_assert_eq(atomic_load(&r->shm->dequeued), 0);

	/* a consumer in another process sleeps until we enqueue */
	pid_t pid = spawn(blocked_consumer, r);
	cr_assert_gt(pid, 0);
	cr_assert_eq(wait_u32(&r->shm->cons_blocked, 1, 5000), 0, "consumer never reported blocked");
	cr_assert_eq(wait_u64_ge(&r->shm->empty_sleeps, es0 + 2, 5000), 0, "the blocked consumer never slept");
	sleep_us(10000);
	cr_assert_eq(atomic_load(&s->done_ns), 0);
	stamp(m, 99, 5);
	uint64_t t_enq = kvr_now_ns();
	cr_assert_eq(kvr_ring_try_enqueue(r, m), 0);
	int st;
	cr_assert_eq(reap(pid, 5000, &st), 0, "sleeping consumer was not woken");
	cr_assert_eq(exit_code(st), 0);
	cr_assert_eq(atomic_load(&s->rc), 0);
	cr_assert_geq(atomic_load(&s->done_ns), t_enq);
	cr_assert_eq(stamp_check(s->msg, 99, 5), 0);
	cr_assert_eq(kvr_ring_count(r), 0);
	cr_assert_eq(atomic_load(&r->shm->dequeued), 1);
	cr_assert_eq(atomic_load(&r->shm->cons_blocked), 0);
	cr_assert_eq(atomic_load(&r->shm->own_cons_waiter.sleepers), 0);
	cr_assert_geq(atomic_load(&r->shm->own_cons_waiter.seq), 1, "the producer did not wake the sleeper");
}

static void on_usr1(int sig)
{
	(void)sig;
}

static int interrupted_consumer(void *arg)
{
	struct kvr_ring *r = arg;
	struct bp_shared *s = shared();
	struct sigaction sa = {.sa_handler = on_usr1}; /* no SA_RESTART */
	sigaction(SIGUSR1, &sa, NULL);
	uint8_t m[MSG];
	int rc = kvr_ring_dequeue(r, m, -1);
	atomic_store(&s->rc, rc);
	return 0;
}

Test(ring, signal_interrupts_wait)
{
	struct kvr_ring *r = make_ring(RING_OFF, 8, MSG, "eintr");
	struct bp_shared *s = shared();
	atomic_store(&s->rc, 1);
	pid_t pid = spawn(interrupted_consumer, r);
	cr_assert_gt(pid, 0);
	cr_assert_eq(wait_u32(&r->shm->cons_blocked, 1, 5000), 0);
	/* The signal may land between the blocked flag and the futex call (then the handler
	 * runs and the wait goes on): send it until the dequeue returns. */
	int st = 0, rc = -ETIMEDOUT;
	for (int i = 0; i < 500 && rc; i++) {
		kill(pid, SIGUSR1);
		sleep_us(10000);
		if (waitpid(pid, &st, WNOHANG) == pid) {
			forget_kid(pid);
			rc = 0;
		}
	}
	cr_assert_eq(rc, 0, "dequeue did not return on a signal");
	cr_assert_eq(exit_code(st), 0);
	cr_assert_eq(atomic_load(&s->rc), -EINTR);
	cr_assert_eq(atomic_load(&r->shm->cons_blocked), 0);
	cr_assert_eq(atomic_load(&r->shm->own_cons_waiter.sleepers), 0);
	cr_assert_eq(kvr_ring_count(r), 0);
}

/* ---- waiters ------------------------------------------------------------------------ */

/* kvr_waiters_wait: one sleep on several waiters (an actor and its clients' rings). */
struct wv_shared {
	struct kvr_waiter w[3];
	_Atomic uint32_t armed; /* the child announced itself on all three */
	_Atomic int32_t rc;
	_Atomic uint64_t waited_ns;
};

static int wv_sleeper(void *arg)
{
	(void)arg;
	struct wv_shared *s = shared();
	struct kvr_waiter *ws[3] = {&s->w[0], &s->w[1], &s->w[2]};
	uint32_t seen[3];
	for (unsigned i = 0; i < 3; i++)
		seen[i] = kvr_waiter_prepare(ws[i]);
	atomic_store(&s->armed, 1);
	uint64_t t0 = kvr_now_ns();
	int rc = kvr_waiters_wait(ws, seen, 3, 10000 * MS);
	atomic_store(&s->waited_ns, kvr_now_ns() - t0);
	for (unsigned i = 0; i < 3; i++)
		kvr_waiter_finish(ws[i]);
	atomic_store(&s->rc, rc);
	return 0;
}

Test(ring, waiters_wait_wakes_on_any)
{
	struct wv_shared *s = shared();
	memset(s, 0, sizeof(*s));
	atomic_store(&s->rc, 1);
	pid_t pid = spawn(wv_sleeper, NULL);
	cr_assert_gt(pid, 0);
	cr_assert_eq(wait_u32(&s->armed, 1, 5000), 0);
	/* the third waiter's producer: its wake (a sleeper announced) ends the sleep on all */
	kvr_waiter_wake(&s->w[2]);
	int st;
	cr_assert_eq(reap(pid, 5000, &st), 0, "the sleeper did not wake on its third waiter");
	forget_kid(pid);
	cr_assert_eq(exit_code(st), 0);
	cr_assert_eq(atomic_load(&s->rc), 0);
	cr_assert_lt(atomic_load(&s->waited_ns), 5000 * MS, "woken by the timeout, not the wake");
	cr_assert_eq(atomic_load(&s->w[0].seq), 0, "only the woken waiter moves");
	cr_assert_eq(atomic_load(&s->w[2].seq), 1);
	for (unsigned i = 0; i < 3; i++)
		cr_assert_eq(atomic_load(&s->w[i].sleepers) & 0x7fffffffu, 0, "waiter %u: a sleeper left announced", i);
}

Test(ring, waiters_wait_times_out_and_sees_moved_words)
{
	struct wv_shared *s = shared();
	memset(s, 0, sizeof(*s));
	struct kvr_waiter *ws[3] = {&s->w[0], &s->w[1], &s->w[2]};
	uint32_t seen[3];
	for (unsigned i = 0; i < 3; i++)
		seen[i] = kvr_waiter_prepare(ws[i]);
	uint64_t t0 = kvr_now_ns();
	cr_assert_eq(kvr_waiters_wait(ws, seen, 3, 20 * MS), -ETIMEDOUT);
	cr_assert_geq(kvr_now_ns() - t0, 20 * MS, "returned before its deadline");
	/* a word that moved before the sleep: no sleep at all (the wake is not lost) */
	atomic_fetch_add(&s->w[1].seq, 1);
	t0 = kvr_now_ns();
	cr_assert_eq(kvr_waiters_wait(ws, seen, 3, 10000 * MS), 0);
	cr_assert_lt(kvr_now_ns() - t0, 5000 * MS);
	for (unsigned i = 0; i < 3; i++)
		kvr_waiter_finish(ws[i]);
	cr_assert_eq(kvr_waiters_wait(ws, seen, 0, 0), -EINVAL);
	cr_assert_eq(kvr_waiters_wait(ws, seen, KVR_WAITERS_MAX + 1, 0), -E2BIG);
}


Test(ring, wake_needs_a_sleeper)
{
	struct kvr_waiter *w = at(RING_OFF);
	memset(w, 0, sizeof(*w));
	kvr_waiter_wake(w);
	kvr_waiter_wake(w);
	cr_assert_eq(atomic_load(&w->seq), 0, "wake with no sleeper changed seq");

	uint32_t seen = kvr_waiter_prepare(w);
	cr_assert_eq(seen, 0);
	cr_assert_eq(atomic_load(&w->sleepers), 1);
	kvr_waiter_wake(w);
	cr_assert_eq(atomic_load(&w->seq), 1);
	/* a wait on a stale seq returns at once: the wake-up that came before it is not lost */
	uint64_t t0 = kvr_now_ns();
	cr_assert_eq(kvr_waiter_wait(w, seen, 5000 * MS), 0);
	cr_assert_lt(kvr_now_ns() - t0, 1000 * MS);
	kvr_waiter_finish(w);
	cr_assert_eq(atomic_load(&w->sleepers), 0);
	kvr_waiter_wake(w);
	cr_assert_eq(atomic_load(&w->seq), 1);

	seen = kvr_waiter_prepare(w);
	cr_assert_eq(seen, 1);
	t0 = kvr_now_ns();
	cr_assert_eq(kvr_waiter_wait(w, seen, 20 * MS), -ETIMEDOUT);
	cr_assert_geq(kvr_now_ns() - t0, 20 * MS);
	kvr_waiter_finish(w);

	/* ring level: moving messages while nobody sleeps leaves both waiters alone */
	struct kvr_ring *r = make_ring(RING_OFF + 4096, 8, MSG, "nowake");
	uint8_t m[4 * MSG] = {0};
	for (int i = 0; i < 1000; i++) {
		cr_assert_eq(kvr_ring_enqueue_burst(r, m, 4), 4);
		cr_assert_eq(kvr_ring_enqueue(r, m, -1), 0);
		cr_assert_eq(kvr_ring_dequeue_burst(r, m, 4), 4);
		cr_assert_eq(kvr_ring_dequeue(r, m, -1), 0);
	}
	cr_assert_eq(atomic_load(&r->shm->own_cons_waiter.seq), 0);
	cr_assert_eq(atomic_load(&r->shm->own_prod_waiter.seq), 0);
	kvr_waiter_prepare(kvr_ring_consumer_waiter(r));
	cr_assert_eq(kvr_ring_try_enqueue(r, m), 0);
	cr_assert_eq(atomic_load(&r->shm->own_cons_waiter.seq), 1, "enqueue did not wake an announced sleeper");
	kvr_waiter_finish(kvr_ring_consumer_waiter(r));
	kvr_waiter_prepare(kvr_ring_producer_waiter(r));
	cr_assert_eq(kvr_ring_try_dequeue(r, m), 0);
	cr_assert_eq(atomic_load(&r->shm->own_prod_waiter.seq), 1, "dequeue did not wake an announced sleeper");
	kvr_waiter_finish(kvr_ring_producer_waiter(r));
}

/* A quiet enqueue publishes the message but leaves an announced sleeper alone; the
 * producer's one kvr_ring_wake_consumer after its batch wakes it, and the messages are
 * all there, in order (the lookup actor's L2 requests: one wake per pass). */
Test(ring, quiet_enqueue_wakes_only_when_asked)
{
	struct kvr_ring *r = make_ring(RING_OFF, 8, MSG, "quiet");
	struct kvr_waiter *w = kvr_ring_consumer_waiter(r);
	uint32_t seen = kvr_waiter_prepare(w);
	uint8_t m[MSG];
	for (uint8_t i = 0; i < 8; i++) {
		memset(m, i, sizeof(m));
		cr_assert_eq(kvr_ring_try_enqueue_quiet(r, m), 0);
	}
	memset(m, 9, sizeof(m));
	cr_assert_eq(kvr_ring_try_enqueue_quiet(r, m), -EAGAIN, "a full ring takes nothing, quiet or not");
	cr_assert_eq(kvr_ring_count(r), 8);
	cr_assert_eq(atomic_load(&w->seq), seen, "no quiet enqueue woke the sleeper");
	kvr_ring_wake_consumer(r);
	cr_assert_eq(atomic_load(&w->seq), seen + 1, "the batch's wake did");
	cr_assert_eq(kvr_waiter_wait(w, seen, 5000 * MS), 0, "a wait on the old seq returns at once");
	kvr_waiter_finish(w);
	for (uint8_t i = 0; i < 8; i++) {
		cr_assert_eq(kvr_ring_try_dequeue(r, m), 0);
		cr_assert_eq(m[0], i, "message %u in order", i);
		cr_assert_eq(m[MSG - 1], i);
	}
	cr_assert_eq(kvr_ring_try_dequeue(r, m), -EAGAIN);
}

/* Count the FUTEX_WAKE syscalls a process makes: a seccomp filter traps every shared
 * (non-private) FUTEX_WAKE, the only kind kvr_waiter_wake issues, and the SIGSYS handler
 * counts it. The trapped call is not executed, which is fine: nobody really sleeps here. */
static volatile sig_atomic_t futex_wakes;

static void on_sigsys(int sig, siginfo_t *si, void *uc)
{
	(void)sig;
	(void)uc;
	if (si->si_syscall == SYS_futex)
		futex_wakes++;
}

struct nosys_shared {
	int32_t unsupported; /* errno of the seccomp setup, 0 if it worked */
	int32_t calib, after_stream, after_cons_sleeper, after_prod_sleeper;
	uint32_t moved;
	uint32_t cons_seq, prod_seq;
	_Atomic uint32_t word;
};

static int nosys_child(void *arg)
{
	struct kvr_ring *r = arg;
	struct nosys_shared *s = shared();
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	struct sock_filter f[] = {
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_futex, 0, 3),
		BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[1])), /* op, low word */
		BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, FUTEX_WAKE, 0, 1),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
		BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
	};
	struct sock_fprog prog = {.len = sizeof(f) / sizeof(f[0]), .filter = f};
	struct sigaction sa = {.sa_sigaction = on_sigsys, .sa_flags = SA_SIGINFO};
	if (sigaction(SIGSYS, &sa, NULL) || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) ||
	    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
		s->unsupported = errno;
		return 0;
	}
#else
	s->unsupported = ENOSYS;
	return 0;
#endif
	/* calibrate: one shared wake by hand is counted */
	syscall(SYS_futex, &s->word, FUTEX_WAKE, 1, NULL, NULL, 0);
	s->calib = futex_wakes;

	/* a stream through every fast-path call while neither side sleeps */
	uint8_t m[4 * MSG] = {0};
	uint32_t moved = 0;
	for (int i = 0; i < 25000; i++) {
		moved += kvr_ring_enqueue_burst(r, m, 4);
		moved += kvr_ring_enqueue(r, m, -1) == 0;
		moved += kvr_ring_try_enqueue(r, m) == 0;
		moved += kvr_ring_enqueue(r, m, 1000000) == 0;
		moved -= kvr_ring_dequeue_burst(r, m, 4);
		moved -= kvr_ring_dequeue(r, m, -1) == 0;
		moved -= kvr_ring_try_dequeue(r, m) == 0;
		moved -= kvr_ring_dequeue(r, m, 1000000) == 0;
	}
	s->moved = moved + (uint32_t)atomic_load(&r->shm->dequeued);
	s->after_stream = futex_wakes;
	s->cons_seq = atomic_load(&r->shm->own_cons_waiter.seq);
	s->prod_seq = atomic_load(&r->shm->own_prod_waiter.seq);

	/* one announced sleeper: exactly one syscall per side */
	kvr_waiter_prepare(kvr_ring_consumer_waiter(r));
	kvr_ring_try_enqueue(r, m);
	kvr_waiter_finish(kvr_ring_consumer_waiter(r));
	s->after_cons_sleeper = futex_wakes;
	kvr_waiter_prepare(kvr_ring_producer_waiter(r));
	kvr_ring_try_dequeue(r, m);
	kvr_waiter_finish(kvr_ring_producer_waiter(r));
	s->after_prod_sleeper = futex_wakes;
	return 0;
}

Test(ring, no_wake_syscall_without_sleeper)
{
	struct kvr_ring *r = make_ring(RING_OFF, 8, MSG, "nosys");
	struct nosys_shared *s = shared();
	pid_t pid = spawn(nosys_child, r);
	int st;
	cr_assert_eq(reap(pid, 30000, &st), 0);
	cr_assert_eq(exit_code(st), 0);
	if (s->unsupported)
		cr_skip_test("seccomp unavailable (%s): the state checks of wake_needs_a_sleeper stand in",
			     strerror(s->unsupported));
	cr_assert_eq(s->calib, 1, "the syscall counter does not count");
	cr_assert_eq(s->moved, 175000, "moved %u", s->moved); /* 7 dequeued per round, none left */
	cr_assert_eq(s->after_stream, 1, "%d FUTEX_WAKE syscalls while nobody slept", s->after_stream - 1);
	cr_assert_eq(s->cons_seq, 0);
	cr_assert_eq(s->prod_seq, 0);
	cr_assert_eq(s->after_cons_sleeper, 2, "enqueue with a sleeping consumer: %d syscalls",
		     s->after_cons_sleeper - 1);
	cr_assert_eq(s->after_prod_sleeper, 3, "dequeue with a sleeping producer: %d syscalls",
		     s->after_prod_sleeper - 2);
}

/* One consumer sleeps on one shared waiter for 4 rings fed by 4 producer processes. Every
 * round, each producer sends 1..4 messages (every 4th round after a pause) and then sleeps
 * until the consumer has seen the whole round, so the consumer sleeps and wakes over and
 * over; a lost wake-up shows as a 2 s timeout. */
#define WS_RINGS 4
#define WS_ROUNDS 2000

struct ws_shared {
	struct kvr_waiter cons_w;  /* the consumer's shared waiter */
	struct kvr_waiter round_w; /* producers sleep here between rounds */
	_Atomic uint32_t round;    /* last round the consumer completed */
	_Atomic uint32_t stop;
	_Atomic uint32_t timeouts[WS_RINGS];
	uint64_t seed;
};

static unsigned ws_per_round(unsigned ring, unsigned round)
{
	return 1 + (round * 7 + ring * 3) % 4;
}

static struct kvr_ring *ws_ring(unsigned i)
{
	return view_at(RING_OFF + i * 4096);
}

static int ws_producer(void *arg)
{
	unsigned id = (unsigned)(uintptr_t)arg;
	struct ws_shared *s = shared();
	struct kvr_ring *r = ws_ring(id);
	kvr_ring_claim_producer(r, getpid());
	uint8_t m[MSG];
	uint64_t seq = 0;
	for (unsigned round = 1; round <= WS_ROUNDS; round++) {
		if (round % 4 == 0)
			sleep_us(300); /* let the consumer fall asleep first at least this often */
		for (unsigned k = 0; k < ws_per_round(id, round); k++) {
			stamp(m, seq++, s->seed + id);
			if (kvr_ring_enqueue(r, m, 2000 * MS))
				return 2;
		}
		for (;;) {
			uint32_t seen = kvr_waiter_prepare(&s->round_w);
			if (atomic_load(&s->round) >= round || atomic_load(&s->stop)) {
				kvr_waiter_finish(&s->round_w);
				break;
			}
			int rc = kvr_waiter_wait(&s->round_w, seen, 2000 * MS);
			kvr_waiter_finish(&s->round_w);
			if (rc == -ETIMEDOUT) {
				atomic_fetch_add(&s->timeouts[id], 1);
				return 3;
			}
		}
		if (atomic_load(&s->round) < round)
			return 4; /* stopped early */
	}
	return 0;
}

Test(ring, shared_waiter_four_producers)
{
	struct ws_shared *s = shared();
	s->seed = test_seed("ring/shared_waiter_four_producers");
	struct kvr_ring *r[WS_RINGS];
	for (unsigned i = 0; i < WS_RINGS; i++) {
		r[i] = make_ring(RING_OFF + i * 4096, 8, MSG, "shared");
		kvr_ring_set_consumer_waiter(r[i]->shm, &s->cons_w);
		cr_assert_eq(kvr_ring_consumer_waiter(r[i]), &s->cons_w);
		cr_assert_lt(r[i]->shm->cons_waiter_off, 0, "a shared waiter before the ring has a negative offset");
	}
	pid_t pid[WS_RINGS];
	for (unsigned i = 0; i < WS_RINGS; i++) {
		pid[i] = spawn(ws_producer, (void *)(uintptr_t)i);
		cr_assert_gt(pid[i], 0);
	}
	uint64_t next[WS_RINGS] = {0}, total = 0, sleeps = 0, timeouts = 0, spurious = 0;
	uint8_t m[MSG];
	for (unsigned round = 1; round <= WS_ROUNDS && !timeouts; round++) {
		unsigned want = 0, got = 0, got_ring[WS_RINGS] = {0};
		for (unsigned i = 0; i < WS_RINGS; i++)
			want += ws_per_round(i, round);
		while (got < want) {
			unsigned n = 0;
			for (unsigned i = 0; i < WS_RINGS; i++)
				while (kvr_ring_try_dequeue(r[i], m) == 0) {
					cr_assert_eq(stamp_check(m, next[i], s->seed + i), 0,
						     "ring %u message %llu wrong", i, (unsigned long long)next[i]);
					next[i]++;
					got_ring[i]++;
					n++;
				}
			got += n;
			if (n || got == want)
				continue;
			uint32_t seen = kvr_waiter_prepare(&s->cons_w);
			int ready = 0;
			for (unsigned i = 0; i < WS_RINGS; i++)
				ready |= kvr_ring_count(r[i]) > 0;
			if (!ready) {
				sleeps++;
				int rc = kvr_waiter_wait(&s->cons_w, seen, 2000 * MS);
				if (rc == -ETIMEDOUT)
					timeouts++;
				else if (rc == 0 && atomic_load(&s->cons_w.seq) == seen)
					spurious++;
			}
			kvr_waiter_finish(&s->cons_w);
			if (timeouts)
				break;
		}
		cr_assert_eq(timeouts, 0, "round %u: lost wake-up (got %u of %u messages)", round, got, want);
		for (unsigned i = 0; i < WS_RINGS; i++)
			cr_assert_eq(got_ring[i], ws_per_round(i, round), "round %u ring %u", round, i);
		total += got;
		atomic_store(&s->round, round);
		kvr_waiter_wake(&s->round_w);
	}
	atomic_store(&s->stop, 1);
	kvr_waiter_wake(&s->round_w);
	for (unsigned i = 0; i < WS_RINGS; i++) {
		int st;
		cr_assert_eq(reap(pid[i], 10000, &st), 0);
		cr_assert_eq(exit_code(st), 0, "producer %u exit %d (timeouts %u)", i, exit_code(st),
			     atomic_load(&s->timeouts[i]));
	}
	uint64_t want_total = 0;
	for (unsigned i = 0; i < WS_RINGS; i++) {
		uint64_t w = 0;
		for (unsigned round = 1; round <= WS_ROUNDS; round++)
			w += ws_per_round(i, round);
		cr_assert_eq(next[i], w, "ring %u", i);
		cr_assert_eq(atomic_load(&r[i]->shm->enqueued), w);
		cr_assert_eq(atomic_load(&r[i]->shm->dequeued), w);
		cr_assert_eq(atomic_load(&r[i]->shm->own_cons_waiter.seq), 0, "ring %u woke its own waiter", i);
		want_total += w;
	}
	cr_assert_eq(total, want_total);
	cr_assert_eq(atomic_load(&s->cons_w.sleepers), 0);
	cr_assert_geq(sleeps, WS_ROUNDS / 10, "the consumer slept only %llu times", (unsigned long long)sleeps);
	fprintf(stderr, "shared waiter: %llu messages, %u rounds, consumer slept %llu times (%llu spurious), "
		"%u wakes on its waiter\n", (unsigned long long)total, WS_ROUNDS, (unsigned long long)sleeps,
		(unsigned long long)spurious, atomic_load(&s->cons_w.seq));
}

/* ---- consumer death ----------------------------------------------------------------- */

/* Producer sends seq 1..n (stamped). Consumer A dequeues one message at a time and, after
 * each, stores its seq to `progress`. Consumer B attaches to the same ring and takes over.
 *
 * A message is consumed when the consumer stores head (kvr_ring_dequeue's release store);
 * `progress` is written after that. So where A dies decides what B sees first:
 *   - anywhere but between the head store and the progress store: progress+1;
 *   - between the two stores: progress+2 (A took progress+1 and died before recording it:
 *     the ring delivers at most once, it never hands out a consumed message again).
 * B can never see progress itself: that would be a duplicate. B's first seq is always
 * exactly head+1 at the moment it attached, which is what the test checks exactly. */
#define KC_N 200000u

enum kc_mode { KC_RUN, KC_DIE_AFTER_HEAD_STORE, KC_DIE_AFTER_PEEK };

struct kc_shared {
	uint64_t seed;
	uint32_t mode, stop_at;
	_Atomic uint64_t progress;
	_Atomic uint32_t a_errors;
	uint64_t b_head_at_attach, b_first, b_last, b_count;
	uint32_t b_errors;
	int32_t b_rc;
};

static void *kc_ring_mem(void)
{
	return at(RING_OFF);
}

static struct kvr_ring *kc_ring(void)
{
	return view_at(RING_OFF);
}

static int kc_producer(void *arg)
{
	(void)arg;
	struct kc_shared *s = shared();
	struct kvr_ring *r = kc_ring();
	kvr_ring_claim_producer(r, getpid());
	uint8_t m[MSG];
	for (uint64_t seq = 1; seq <= KC_N; seq++) {
		stamp(m, seq, s->seed);
		if (kvr_ring_enqueue(r, m, 30000 * MS))
			return 2;
	}
	return 0;
}

static int kc_consumer_a(void *arg)
{
	(void)arg;
	struct kc_shared *s = shared();
	struct kvr_ring *r = kc_ring();
	kvr_ring_claim_consumer(r, getpid());
	uint8_t m[MSG];
	for (uint64_t seq = 1; seq <= KC_N; seq++) {
		if (s->mode != KC_RUN && seq == s->stop_at + 1) {
			if (s->mode == KC_DIE_AFTER_HEAD_STORE)
				kvr_ring_dequeue(r, m, -1);
			else
				kvr_ring_peek(r, 0, m);
			raise(SIGKILL);
		}
		if (kvr_ring_dequeue(r, m, -1) || stamp_check(m, seq, s->seed)) {
			atomic_fetch_add(&s->a_errors, 1);
			return 3;
		}
		atomic_store_explicit(&s->progress, seq, memory_order_release);
		/* KC_RUN: past the point where the parent kills us, go slowly, so the kill
		 * lands mid-stream however late the parent gets to run */
		if (s->mode == KC_RUN && seq > s->stop_at)
			usleep(20);
	}
	return 0;
}

static int kc_consumer_b(void *arg)
{
	(void)arg;
	struct kc_shared *s = shared();
	struct kvr_ring view, *r = &view;
	int rc = kvr_ring_view(kc_ring_mem(), seg.size - RING_OFF, &seg_waiters, &view);
	if (rc) {
		s->b_rc = rc;
		return 2;
	}
	kvr_ring_claim_consumer(r, getpid());
	s->b_head_at_attach = atomic_load(&r->shm->head);
	uint8_t m[MSG];
	uint64_t expect = 0;
	while (expect != KC_N + 1) {
		if ((rc = kvr_ring_dequeue(r, m, 30000 * MS))) {
			s->b_rc = rc;
			return 3;
		}
		uint64_t seq = stamp_seq(m);
		if (!expect) {
			s->b_first = expect = seq;
		}
		if (seq != expect || stamp_check(m, seq, s->seed))
			s->b_errors++;
		s->b_last = seq;
		s->b_count++;
		expect = seq + 1;
		if (seq >= KC_N)
			break;
	}
	return 0;
}

/* Runs the scenario; returns the progress A had recorded when it died. */
static uint64_t kc_run(enum kc_mode mode, uint32_t stop_at, uint64_t seed, struct rng *g)
{
	struct kc_shared *s = shared();
	memset(s, 0, sizeof(*s));
	s->seed = seed;
	s->mode = mode;
	s->stop_at = stop_at;
	uint64_t k = 0;
	if (mode == KC_RUN)
		s->stop_at = (uint32_t)(k = 1000 + rng_below(g, KC_N / 2));
	struct kvr_ring *r = make_ring(RING_OFF, 64, MSG, "killme");
	pid_t prod = spawn(kc_producer, NULL);
	pid_t a = spawn(kc_consumer_a, NULL);
	cr_assert(prod > 0 && a > 0);
	if (mode == KC_RUN) {
		cr_assert_eq(wait_u64_ge(&s->progress, k, 20000), 0, "consumer A stalled at %llu",
			     (unsigned long long)atomic_load(&s->progress));
		sleep_us(rng_below(g, 500));
		kill(a, SIGKILL);
	}
	int st;
	cr_assert_eq(reap(a, 20000, &st), 0);
	cr_assert_eq(atomic_load(&s->a_errors), 0, "consumer A saw a bad message");
	cr_assert_eq(exit_code(st), 1000 + SIGKILL, "consumer A was not killed (exit %d)", exit_code(st));
	uint64_t progress = atomic_load(&s->progress);
	fprintf(stderr, "consumer killed after seq %llu: head %u, cons_blocked %u, sleepers left on its waiter %u\n",
		(unsigned long long)progress, atomic_load(&r->shm->head), atomic_load(&r->shm->cons_blocked),
		atomic_load(&r->shm->own_cons_waiter.sleepers));

	pid_t b = spawn(kc_consumer_b, NULL);
	cr_assert_gt(b, 0);
	cr_assert_eq(reap(b, 30000, &st), 0, "consumer B did not finish");
	cr_assert_eq(exit_code(st), 0, "consumer B exit %d rc %d", exit_code(st), s->b_rc);
	cr_assert_eq(reap(prod, 10000, &st), 0);
	cr_assert_eq(exit_code(st), 0);

	cr_assert_eq(s->b_errors, 0, "consumer B saw a gap, a duplicate or a bad message");
	cr_assert_eq(s->b_first, s->b_head_at_attach + 1, "B's first seq %llu, head at attach %llu",
		     (unsigned long long)s->b_first, (unsigned long long)s->b_head_at_attach);
	cr_assert(s->b_first == progress + 1 || s->b_first == progress + 2, "B's first seq %llu after progress %llu",
		  (unsigned long long)s->b_first, (unsigned long long)progress);
	cr_assert_eq(s->b_last, KC_N);
	cr_assert_eq(s->b_count, KC_N - s->b_first + 1);
	cr_assert_eq(atomic_load(&r->shm->head), KC_N);
	cr_assert_eq(atomic_load(&r->shm->tail), KC_N);
	cr_assert_eq(atomic_load(&r->shm->cons_pid), b);
	cr_assert_eq(atomic_load(&r->shm->cons_blocked), 0);
	return progress;
}

static int sleeping_consumer(void *arg)
{
	struct kvr_ring *r = arg;
	kvr_ring_claim_consumer(r, getpid());
	uint8_t m[MSG];
	kvr_ring_dequeue(r, m, -1); /* killed while it sleeps here */
	return 1;
}

/* A consumer killed in its sleep leaves cons_blocked set and itself counted as a sleeper on
 * its waiter. The next claimant clears the flag; the sleeper count stays for whoever restarts
 * consumers to reset (a waiter may be shared), and until then wakes only cost a syscall. */
Test(ring, consumer_killed_asleep)
{
	struct kvr_ring *r = make_ring(RING_OFF, 8, MSG, "asleep");
	pid_t pid = spawn(sleeping_consumer, r);
	cr_assert_gt(pid, 0);
	cr_assert_eq(wait_u32(&r->shm->own_cons_waiter.sleepers, 1, 5000), 0);
	cr_assert_eq(atomic_load(&r->shm->cons_blocked), 1);
	kill(pid, SIGKILL);
	int st;
	cr_assert_eq(reap(pid, 5000, &st), 0);
	cr_assert_eq(exit_code(st), 1000 + SIGKILL);
	cr_assert_eq(atomic_load(&r->shm->cons_blocked), 1, "nobody cleared the dead consumer's flag yet");
	cr_assert_eq(atomic_load(&r->shm->own_cons_waiter.sleepers), 1);

	kvr_ring_claim_consumer(r, getpid());
	cr_assert_eq(atomic_load(&r->shm->cons_pid), getpid());
	cr_assert_eq(atomic_load(&r->shm->cons_blocked), 0, "claim left the dead consumer's blocked flag");
	cr_assert_eq(atomic_load(&r->shm->own_cons_waiter.sleepers), 1);

	/* the ring still works both ways; the stale sleeper only makes wakes real syscalls */
	uint8_t m[MSG], out[MSG];
	stamp(m, 5, 5);
	uint32_t seq0 = atomic_load(&r->shm->own_cons_waiter.seq);
	cr_assert_eq(kvr_ring_try_enqueue(r, m), 0);
	cr_assert_eq(atomic_load(&r->shm->own_cons_waiter.seq), seq0 + 1);
	cr_assert_eq(kvr_ring_dequeue(r, out, 1000 * MS), 0);
	cr_assert_eq(stamp_check(out, 5, 5), 0);
	atomic_store(&r->shm->own_cons_waiter.sleepers, 0); /* what the supervisor does on restart */
	cr_assert_eq(kvr_ring_try_enqueue(r, m), 0);
	cr_assert_eq(atomic_load(&r->shm->own_cons_waiter.seq), seq0 + 1);
}

Test(ring, consumer_killed_mid_stream, .timeout = 120)
{
	uint64_t seed = test_seed("ring/consumer_killed_mid_stream");
	struct rng g = {seed};
	for (int i = 0; i < 3; i++)
		kc_run(KC_RUN, 0, seed + (uint64_t)i, &g);
}

Test(ring, consumer_killed_after_head_store)
{
	struct rng g = {1};
	uint64_t progress = kc_run(KC_DIE_AFTER_HEAD_STORE, 777, 1, &g);
	cr_assert_eq(progress, 777);
	cr_assert_eq(((struct kc_shared *)shared())->b_first, 779, "the message A took is lost, not redelivered");
}

Test(ring, consumer_killed_after_peek)
{
	struct rng g = {2};
	uint64_t progress = kc_run(KC_DIE_AFTER_PEEK, 777, 2, &g);
	cr_assert_eq(progress, 777);
	cr_assert_eq(((struct kc_shared *)shared())->b_first, 778, "a peeked message is not consumed");
}
