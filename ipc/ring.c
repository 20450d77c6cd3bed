/* SPSC ring of fixed-size messages: lock-free fast path, adaptive spin-then-futex wait. */
#include "kvr_ring.h"

#include <errno.h>
#include <stdbool.h>
#include <limits.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kvr_time.h"

#define KVR_RING_DEFAULT_SPIN_NS 10000u

static inline uint8_t *slot_at(const struct kvr_ring *r, uint32_t idx)
{
	return (uint8_t *)r + r->data_off + (size_t)(idx & (r->capacity - 1)) * r->msg_size;
}

static inline struct kvr_waiter *waiter_at(const struct kvr_ring *r, int64_t off)
{
	return (struct kvr_waiter *)((uint8_t *)r + off);
}

size_t kvr_ring_memsize(uint32_t capacity, uint32_t msg_size)
{
	if (capacity < 2 || capacity > (1u << 30) || (capacity & (capacity - 1)))
		return 0;
	if (msg_size < 8 || msg_size > 4096 || (msg_size % 8))
		return 0;
	size_t sz = sizeof(struct kvr_ring) + (size_t)capacity * msg_size;
	return (sz + KVR_CACHELINE - 1) & ~(size_t)(KVR_CACHELINE - 1);
}

int kvr_ring_init(void *mem, uint32_t capacity, uint32_t msg_size, const char *name)
{
	size_t sz = kvr_ring_memsize(capacity, msg_size);
	if (!mem || !sz || ((uintptr_t)mem % KVR_CACHELINE))
		return -EINVAL;
	struct kvr_ring *r = mem;
	memset(r, 0, sizeof(*r));
	r->version = KVR_RING_VERSION;
	r->capacity = capacity;
	r->msg_size = msg_size;
	r->spin_ns = KVR_RING_DEFAULT_SPIN_NS;
	r->data_off = sizeof(struct kvr_ring);
	r->cons_waiter_off = offsetof(struct kvr_ring, own_cons_waiter);
	r->prod_waiter_off = offsetof(struct kvr_ring, own_prod_waiter);
	if (name)
		strncpy(r->name, name, KVR_RING_NAME_MAX - 1);
	/* Publish the magic last: an observer that sees it sees an initialised header. */
	atomic_store_explicit((_Atomic uint64_t *)&r->magic, KVR_RING_MAGIC, memory_order_release);
	return 0;
}

int kvr_ring_attach(void *mem, size_t avail, struct kvr_ring **ret_ring)
{
	struct kvr_ring *r = mem;
	if (!mem || avail < sizeof(*r) || ((uintptr_t)mem % KVR_CACHELINE))
		return -EINVAL;
	if (atomic_load_explicit((_Atomic uint64_t *)&r->magic, memory_order_acquire) != KVR_RING_MAGIC ||
	    r->version != KVR_RING_VERSION)
		return -EPROTO;
	size_t sz = kvr_ring_memsize(r->capacity, r->msg_size);
	if (!sz || sz > avail || r->data_off != sizeof(*r))
		return -EINVAL;
	/* observers print the name: it must end inside its field */
	if (!memchr(r->name, '\0', sizeof(r->name)))
		return -EINVAL;
	/* Waiters must lie inside this ring's mapping, which the caller vouches for with avail
	 * measured from mem; a redirected waiter points before the ring (into its segment). */
	*ret_ring = r;
	return 0;
}

void kvr_ring_set_consumer_waiter(struct kvr_ring *r, struct kvr_waiter *w)
{
	r->cons_waiter_off = (int64_t)((uint8_t *)w - (uint8_t *)r);
}

void kvr_ring_set_producer_waiter(struct kvr_ring *r, struct kvr_waiter *w)
{
	r->prod_waiter_off = (int64_t)((uint8_t *)w - (uint8_t *)r);
}

struct kvr_waiter *kvr_ring_consumer_waiter(struct kvr_ring *r)
{
	return waiter_at(r, r->cons_waiter_off);
}

struct kvr_waiter *kvr_ring_producer_waiter(struct kvr_ring *r)
{
	return waiter_at(r, r->prod_waiter_off);
}

/* A claimant is not waiting, whatever a predecessor killed mid-wait left in the flag. */
void kvr_ring_claim_producer(struct kvr_ring *r, pid_t pid)
{
	atomic_store_explicit(&r->prod_pid, pid, memory_order_relaxed);
	atomic_store_explicit(&r->prod_blocked, 0, memory_order_relaxed);
}

void kvr_ring_claim_consumer(struct kvr_ring *r, pid_t pid)
{
	atomic_store_explicit(&r->cons_pid, pid, memory_order_relaxed);
	atomic_store_explicit(&r->cons_blocked, 0, memory_order_relaxed);
}

/* ---- waiters ------------------------------------------------------------------------ */

int kvr_futex_wait(_Atomic uint32_t *addr, uint32_t val, int64_t timeout_ns)
{
	struct timespec ts, *tsp = NULL;
	if (timeout_ns >= 0) {
		ts.tv_sec = timeout_ns / 1000000000;
		ts.tv_nsec = timeout_ns % 1000000000;
		tsp = &ts;
	}
	/* Shared futex (no FUTEX_PRIVATE_FLAG): the word lives in memory several processes map. */
	if (syscall(SYS_futex, addr, FUTEX_WAIT, val, tsp, NULL, 0) == 0)
		return 0;
	if (errno == EAGAIN) /* the word changed before we slept: a wake-up we did not miss */
		return 0;
	return -errno;
}

void kvr_futex_wake(_Atomic uint32_t *addr)
{
	syscall(SYS_futex, addr, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

#define WAKE_PENDING 0x80000000u /* in sleepers: a wake was sent and no sleeper re-armed since */

uint32_t kvr_waiter_prepare(struct kvr_waiter *w)
{
	uint32_t seen = atomic_load_explicit(&w->seq, memory_order_acquire);
	atomic_fetch_add_explicit(&w->sleepers, 1, memory_order_seq_cst);
	atomic_fetch_and_explicit(&w->sleepers, ~WAKE_PENDING, memory_order_seq_cst);
	/* A full barrier between announcing the sleep and re-checking the rings (whose index
	 * loads are only acquire). Pairs with the seq_cst fence in kvr_waiter_wake(): of the two
	 * fences, whichever comes second sees the other side's write. Slow path only. */
	atomic_thread_fence(memory_order_seq_cst);
	return seen;
}

int kvr_waiter_wait(struct kvr_waiter *w, uint32_t seen, int64_t timeout_ns)
{
	return kvr_futex_wait(&w->seq, seen, timeout_ns);
}

void kvr_waiter_finish(struct kvr_waiter *w)
{
	uint32_t v = atomic_fetch_sub_explicit(&w->sleepers, 1, memory_order_relaxed);
	if ((v & ~WAKE_PENDING) == 1) /* the last sleeper left: nothing is pending any more */
		atomic_fetch_and_explicit(&w->sleepers, ~WAKE_PENDING, memory_order_relaxed);
}

void kvr_waiter_wake(struct kvr_waiter *w)
{
	/* Pairs with the seq_cst fence in kvr_waiter_prepare(): either the sleeper sees our
	 * published index, or we see its announcement and wake it. The first waker sets
	 * WAKE_PENDING; until a sleeper announces itself again, later wakers make no syscall
	 * (the sleepers they would wake are already woken and will re-check the rings). */
	atomic_thread_fence(memory_order_seq_cst);
	uint32_t v = atomic_load_explicit(&w->sleepers, memory_order_relaxed);
	do {
		if ((v & ~WAKE_PENDING) == 0 || (v & WAKE_PENDING))
			return;
	} while (!atomic_compare_exchange_weak_explicit(&w->sleepers, &v, v | WAKE_PENDING, memory_order_seq_cst,
							memory_order_relaxed));
	atomic_fetch_add_explicit(&w->seq, 1, memory_order_release);
	syscall(SYS_futex, &w->seq, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* ---- fast path ---------------------------------------------------------------------- */

static inline void bump(_Atomic uint64_t *c, uint64_t by)
{
	/* Single writer: a plain load+store avoids a locked instruction. */
	atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + by, memory_order_relaxed);
}

uint32_t kvr_ring_count(const struct kvr_ring *r)
{
	uint32_t t = atomic_load_explicit(&((struct kvr_ring *)r)->tail, memory_order_acquire);
	uint32_t h = atomic_load_explicit(&((struct kvr_ring *)r)->head, memory_order_acquire);
	uint32_t n = t - h;
	return n > r->capacity ? r->capacity : n;
}

uint32_t kvr_ring_free(const struct kvr_ring *r)
{
	return r->capacity - kvr_ring_count(r);
}

unsigned kvr_ring_enqueue_burst(struct kvr_ring *r, const void *msgs, unsigned n)
{
	uint32_t t = atomic_load_explicit(&r->tail, memory_order_relaxed);
	/* acquire pairs with the consumer's release store of head: slots it freed are read out */
	uint32_t h = atomic_load_explicit(&r->head, memory_order_acquire);
	uint32_t room = r->capacity - (t - h);
	if (n > room)
		n = room;
	if (!n)
		return 0;
	const uint8_t *src = msgs;
	for (unsigned i = 0; i < n; i++)
		memcpy(slot_at(r, t + i), src + (size_t)i * r->msg_size, r->msg_size);
	/* release pairs with the consumer's acquire load of tail: the copies are visible first */
	atomic_store_explicit(&r->tail, t + n, memory_order_release);
	bump(&r->enqueued, n);
	kvr_waiter_wake(waiter_at(r, r->cons_waiter_off));
	return n;
}

unsigned kvr_ring_dequeue_burst(struct kvr_ring *r, void *ret_msgs, unsigned n)
{
	uint32_t h = atomic_load_explicit(&r->head, memory_order_relaxed);
	/* acquire pairs with the producer's release store of tail */
	uint32_t t = atomic_load_explicit(&r->tail, memory_order_acquire);
	uint32_t avail = t - h;
	if (n > avail)
		n = avail;
	if (!n)
		return 0;
	uint8_t *dst = ret_msgs;
	for (unsigned i = 0; i < n; i++)
		memcpy(dst + (size_t)i * r->msg_size, slot_at(r, h + i), r->msg_size);
	/* release pairs with the producer's acquire load of head: we are done reading */
	atomic_store_explicit(&r->head, h + n, memory_order_release);
	bump(&r->dequeued, n);
	kvr_waiter_wake(waiter_at(r, r->prod_waiter_off));
	return n;
}

int kvr_ring_try_enqueue(struct kvr_ring *r, const void *msg)
{
	return kvr_ring_enqueue_burst(r, msg, 1) ? 0 : -EAGAIN;
}

int kvr_ring_try_dequeue(struct kvr_ring *r, void *ret_msg)
{
	return kvr_ring_dequeue_burst(r, ret_msg, 1) ? 0 : -EAGAIN;
}

int kvr_ring_peek(const struct kvr_ring *r, uint32_t i, void *ret_msg)
{
	uint32_t h = atomic_load_explicit(&((struct kvr_ring *)r)->head, memory_order_acquire);
	uint32_t t = atomic_load_explicit(&((struct kvr_ring *)r)->tail, memory_order_acquire);
	if (t - h > r->capacity || i >= t - h)
		return -ENOENT;
	memcpy(ret_msg, slot_at(r, h + i), r->msg_size);
	return 0;
}

/* ---- slow path: wait for room (producer) or for a message (consumer) ----------------- */

/* Wait until ready(r) holds. Spins up to spin_ns, then sleeps on w. */
static int wait_until(struct kvr_ring *r, bool (*ready)(const struct kvr_ring *), struct kvr_waiter *w,
		      _Atomic uint32_t *blocked_flag, _Atomic uint64_t *sleeps, int64_t timeout_ns,
		      uint64_t start)
{
	uint64_t deadline = timeout_ns < 0 ? UINT64_MAX : start + (uint64_t)timeout_ns;
	uint64_t spin_end = start + r->spin_ns;
	unsigned iter = 0;

	for (;;) {
		if (ready(r))
			return 0;
		uint64_t now = 0;
		if ((++iter & 63) == 0 || iter == 1) {
			now = kvr_now_ns();
			if (now >= deadline)
				return -ETIMEDOUT;
			if (now >= spin_end)
				break;
		}
		kvr_cpu_relax();
	}

	atomic_store_explicit(blocked_flag, 1, memory_order_relaxed);
	int rc = 0;
	for (;;) {
		uint32_t seen = kvr_waiter_prepare(w);
		if (ready(r)) {
			kvr_waiter_finish(w);
			rc = 0;
			break;
		}
		uint64_t now = kvr_now_ns();
		if (now >= deadline) {
			kvr_waiter_finish(w);
			rc = -ETIMEDOUT;
			break;
		}
		if (sleeps)
			bump(sleeps, 1);
		rc = kvr_waiter_wait(w, seen, deadline == UINT64_MAX ? -1 : (int64_t)(deadline - now));
		kvr_waiter_finish(w);
		if (rc == -EINTR)
			break;
		/* 0 or -ETIMEDOUT: loop re-checks ready() and the deadline */
	}
	atomic_store_explicit(blocked_flag, 0, memory_order_relaxed);
	return rc;
}

static bool has_room(const struct kvr_ring *r)
{
	return kvr_ring_free(r) > 0;
}

static bool has_msg(const struct kvr_ring *r)
{
	return kvr_ring_count(r) > 0;
}

int kvr_ring_enqueue(struct kvr_ring *r, const void *msg, int64_t timeout_ns)
{
	for (;;) {
		if (kvr_ring_try_enqueue(r, msg) == 0)
			return 0;
		if (timeout_ns == 0)
			return -EAGAIN;
		uint64_t start = kvr_now_ns();
		int rc = wait_until(r, has_room, waiter_at(r, r->prod_waiter_off), &r->prod_blocked, NULL,
				    timeout_ns, start);
		bump(&r->full_waits, 1);
		bump(&r->full_wait_ns, kvr_now_ns() - start);
		if (rc < 0)
			return rc;
		/* Single producer: room seen stays room. */
	}
}

int kvr_ring_dequeue(struct kvr_ring *r, void *ret_msg, int64_t timeout_ns)
{
	for (;;) {
		if (kvr_ring_try_dequeue(r, ret_msg) == 0)
			return 0;
		if (timeout_ns == 0)
			return -EAGAIN;
		uint64_t start = kvr_now_ns();
		int rc = wait_until(r, has_msg, waiter_at(r, r->cons_waiter_off), &r->cons_blocked,
				    &r->empty_sleeps, timeout_ns, start);
		if (rc < 0)
			return rc;
	}
}
