/* Ring stress: a producer and a consumer process stream stamped messages through one ring. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

#include "kvr_ring.h"
#include "kvr_segment.h"
#include "ipc_test.h"

#ifndef STRESS_MSGS /* per capacity; KVR_STRESS_MSGS overrides it at run time */
#define STRESS_MSGS 100000ull
#endif
#ifndef STRESS_TIMEOUT_S
#define STRESS_TIMEOUT_S 120
#endif
#define MSG 64u
#define RING_OFF 4096u
#define N_STYLES 4

/* Lives in the segment right after its header; both children and the parent see it. */
struct stress_ctl {
	uint64_t n, seed;
	uint32_t capacity, pad;
	_Atomic uint32_t go;
	_Atomic uint32_t failed;       /* 1 once either side gives up */
	_Atomic uint64_t received;
	_Atomic uint64_t errors;
	uint64_t bad_seq;              /* first bad message: the seq expected */
	uint64_t bad_got;              /* and the seq word found */
	uint32_t bad_byte;             /* first differing byte + 1 */
	int32_t bad_rc;                /* or the error a ring call returned */
	uint64_t t_start, t_prod_end, t_cons_end;
	uint64_t prod_style[N_STYLES]; /* messages moved per style */
	uint64_t cons_style[N_STYLES];
};

static struct kvr_segment seg = {.fd = -1};

static void teardown(void)
{
	kill_kids();
	kvr_segment_close(&seg);
}

static struct stress_ctl *ctl_of(void)
{
	return (struct stress_ctl *)((uint8_t *)seg.base + sizeof(struct kvr_seg_hdr));
}

/* This process's view of the ring (each side builds its own after fork). */
static struct kvr_ring *ring_of(void)
{
	static struct kvr_ring view;
	if (kvr_ring_view((uint8_t *)seg.base + RING_OFF, seg.size - RING_OFF, NULL, &view))
		return NULL;
	return &view;
}

static void fail_side(struct stress_ctl *c, int rc)
{
	c->bad_rc = rc;
	atomic_store(&c->failed, 1);
}

static int producer(void *arg)
{
	(void)arg;
	struct stress_ctl *c = ctl_of();
	struct kvr_ring *r = ring_of();
	if (!r)
		return 10;
	kvr_ring_claim_producer(r, getpid());
	uint32_t max_burst = 2 * c->capacity;
	uint8_t *buf = malloc((size_t)max_burst * MSG);
	if (!buf)
		return 11;
	struct rng g = {c->seed ^ 0x70726f6475636572ull};
	if (wait_u32(&c->go, 1, 10000))
		return 12;

	for (uint64_t seq = 0; seq < c->n && !atomic_load_explicit(&c->failed, memory_order_relaxed);) {
		uint32_t b = 1 + rng_below(&g, max_burst);
		if (b > c->n - seq)
			b = (uint32_t)(c->n - seq);
		for (uint32_t i = 0; i < b; i++)
			stamp(buf + (size_t)i * MSG, seq + i, c->seed);
		unsigned style = rng_below(&g, N_STYLES);
		uint32_t done = 0;
		int rc = 0;
		while (done < b && !rc) {
			uint8_t *m = buf + (size_t)done * MSG;
			switch (style) {
			case 0: /* blocking, one at a time */
				rc = kvr_ring_enqueue(r, m, -1);
				done += !rc;
				break;
			case 1: { /* bursts; block for one message when the ring is full */
				unsigned k = kvr_ring_enqueue_burst(r, m, b - done);
				if (k)
					done += k;
				else if (!(rc = kvr_ring_enqueue(r, m, -1)))
					done++;
				break;
			}
			case 2: /* try first, block when full */
				rc = kvr_ring_try_enqueue(r, m);
				if (rc == -EAGAIN)
					rc = kvr_ring_enqueue(r, m, -1);
				done += !rc;
				break;
			default: /* short timed waits that often expire */
				rc = kvr_ring_enqueue(r, m, 200000);
				if (rc == -ETIMEDOUT)
					rc = 0;
				else
					done += !rc;
				break;
			}
		}
		if (rc) {
			fail_side(c, rc);
			free(buf);
			return 2;
		}
		c->prod_style[style] += b;
		seq += b;
	}
	c->t_prod_end = kvr_now_ns();
	free(buf);
	return 0;
}

static int consumer(void *arg)
{
	(void)arg;
	struct stress_ctl *c = ctl_of();
	struct kvr_ring *r = ring_of();
	if (!r)
		return 10;
	kvr_ring_claim_consumer(r, getpid());
	uint32_t max_burst = 2 * c->capacity;
	uint8_t *buf = malloc((size_t)max_burst * MSG);
	if (!buf)
		return 11;
	struct rng g = {c->seed ^ 0x636f6e73756d6572ull};
	if (wait_u32(&c->go, 1, 10000))
		return 12;

	uint64_t expect = 0;
	while (expect < c->n) {
		uint32_t b = 1 + rng_below(&g, max_burst);
		if (b > c->n - expect)
			b = (uint32_t)(c->n - expect);
		unsigned style = rng_below(&g, N_STYLES);
		uint32_t got = 0;
		int rc = 0;
		while (got < b && !rc) {
			uint8_t *m = buf + (size_t)got * MSG;
			switch (style) {
			case 0:
				rc = kvr_ring_dequeue(r, m, -1);
				got += !rc;
				break;
			case 1: {
				unsigned k = kvr_ring_dequeue_burst(r, m, b - got);
				if (k)
					got += k;
				else if (!(rc = kvr_ring_dequeue(r, m, -1)))
					got++;
				break;
			}
			case 2:
				rc = kvr_ring_try_dequeue(r, m);
				if (rc == -EAGAIN)
					rc = kvr_ring_dequeue(r, m, -1);
				got += !rc;
				break;
			default:
				rc = kvr_ring_dequeue(r, m, 200000);
				if (rc == -ETIMEDOUT)
					rc = 0;
				else
					got += !rc;
				break;
			}
		}
		if (rc) {
			fail_side(c, rc);
			free(buf);
			return 2;
		}
		for (uint32_t i = 0; i < got; i++, expect++) {
			unsigned bad = stamp_check(buf + (size_t)i * MSG, expect, c->seed);
			if (bad) {
				c->bad_seq = expect;
				c->bad_got = stamp_seq(buf + (size_t)i * MSG);
				c->bad_byte = bad;
				atomic_fetch_add(&c->errors, 1);
				fail_side(c, 0);
				free(buf);
				return 3;
			}
		}
		c->cons_style[style] += got;
		atomic_store_explicit(&c->received, expect, memory_order_relaxed);
	}
	c->t_cons_end = kvr_now_ns();
	/* nothing beyond the stream */
	int extra = kvr_ring_try_dequeue(r, buf);
	free(buf);
	return extra == -EAGAIN ? 0 : 4;
}

ParameterizedTestParameters(ring_stress, stamped)
{
	static uint32_t caps[] = {2, 8, 1024};
	return cr_make_param_array(uint32_t, caps, sizeof(caps) / sizeof(caps[0]));
}

ParameterizedTest(uint32_t *cap, ring_stress, stamped, .fini = teardown, .timeout = STRESS_TIMEOUT_S + 30)
{
	char name[64];
	snprintf(name, sizeof(name), "ring_stress/stamped capacity %u", *cap);
	uint64_t seed = test_seed(name);
	uint64_t n = STRESS_MSGS;
	const char *env = getenv("KVR_STRESS_MSGS");
	if (env && *env)
		n = strtoull(env, NULL, 0);

	size_t rsz = kvr_ring_memsize(*cap, MSG);
	cr_assert_neq(rsz, 0);
	cr_assert_eq(kvr_segment_create("kvr-test-stress", KVR_SEG_CTL, RING_OFF + rsz, 1, 0, &seg), 0);
	cr_assert_eq(kvr_ring_init((uint8_t *)seg.base + RING_OFF, *cap, MSG, "stress"), 0);
	struct kvr_ring *r = ring_of();
	cr_assert_not_null(r);
	struct stress_ctl *c = ctl_of();
	c->n = n;
	c->seed = seed;
	c->capacity = *cap;

	pid_t cons = spawn(consumer, NULL);
	pid_t prod = spawn(producer, NULL);
	cr_assert(cons > 0 && prod > 0);
	c->t_start = kvr_now_ns();
	atomic_store(&c->go, 1);

	int st_c = 0, st_p = 0;
	int rc_c = reap(cons, STRESS_TIMEOUT_S * 1000, &st_c);
	if (rc_c || exit_code(st_c) != 0)
		atomic_store(&c->failed, 1); /* a producer blocked on a full ring is killed by reap */
	int rc_p = reap(prod, rc_c ? 1000 : 10000, &st_p);

	cr_assert_eq(rc_c, 0, "consumer timed out after %d s: received %llu of %llu", STRESS_TIMEOUT_S,
		     (unsigned long long)atomic_load(&c->received), (unsigned long long)n);
	cr_assert_eq(atomic_load(&c->errors), 0,
		     "seed %llu capacity %u: message %llu wrong (seq word %llu, first bad byte %u)",
		     (unsigned long long)seed, *cap, (unsigned long long)c->bad_seq, (unsigned long long)c->bad_got,
		     c->bad_byte - 1);
	cr_assert_eq(exit_code(st_c), 0, "consumer exit %d (ring rc %d)", exit_code(st_c), c->bad_rc);
	cr_assert_eq(rc_p, 0, "producer did not finish");
	cr_assert_eq(exit_code(st_p), 0, "producer exit %d (ring rc %d)", exit_code(st_p), c->bad_rc);

	/* counts and final state */
	cr_assert_eq(atomic_load(&c->received), n);
	cr_assert_eq(atomic_load(&r->shm->enqueued), n);
	cr_assert_eq(atomic_load(&r->shm->dequeued), n);
	cr_assert_eq(atomic_load(&r->shm->tail), (uint32_t)n);
	cr_assert_eq(atomic_load(&r->shm->head), (uint32_t)n);
	cr_assert_eq(kvr_ring_count(r), 0);
	cr_assert_eq(atomic_load(&r->shm->prod_blocked), 0);
	cr_assert_eq(atomic_load(&r->shm->cons_blocked), 0);
	cr_assert_eq(atomic_load(&r->shm->own_cons_waiter.sleepers), 0);
	cr_assert_eq(atomic_load(&r->shm->own_prod_waiter.sleepers), 0);
	uint64_t ps = 0, cs = 0;
	for (int i = 0; i < N_STYLES; i++) {
		ps += c->prod_style[i];
		cs += c->cons_style[i];
		if (n >= 50000) {
			cr_assert_gt(c->prod_style[i], 0, "producer style %d never used", i);
			cr_assert_gt(c->cons_style[i], 0, "consumer style %d never used", i);
		}
	}
	cr_assert_eq(ps, n);
	cr_assert_eq(cs, n);

	double secs = (double)(c->t_cons_end - c->t_start) / 1e9;
	uint64_t fw = atomic_load(&r->shm->full_waits);
	fprintf(stderr,
		"ring_stress cap %u: %llu msgs in %.3f s = %.2f M msg/s; producer full_waits %llu (avg %.1f us), "
		"consumer empty_sleeps %llu; futex wakes: consumer %u producer %u\n",
		*cap, (unsigned long long)n, secs, (double)n / secs / 1e6, (unsigned long long)fw,
		fw ? (double)atomic_load(&r->shm->full_wait_ns) / (double)fw / 1e3 : 0.0,
		(unsigned long long)atomic_load(&r->shm->empty_sleeps), atomic_load(&r->shm->own_cons_waiter.seq),
		atomic_load(&r->shm->own_prod_waiter.seq));
}
