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
	return r->data + (size_t)(idx & r->mask) * r->msg_size;
}

size_t kvr_ring_memsize(uint32_t capacity, uint32_t msg_size)
{
	if (capacity < 2 || capacity > (1u << 30) || (capacity & (capacity - 1)))
		return 0;
	if (msg_size < 8 || msg_size > 4096 || (msg_size % 8))
		return 0;
	size_t sz = sizeof(struct kvr_ring_shm) + (size_t)capacity * msg_size;
	return (sz + KVR_CACHELINE - 1) & ~(size_t)(KVR_CACHELINE - 1);
}

int kvr_ring_init(void *mem, uint32_t capacity, uint32_t msg_size, const char *name)
{
	size_t sz = kvr_ring_memsize(capacity, msg_size);
	if (!mem || !sz || ((uintptr_t)mem % KVR_CACHELINE))
		return -EINVAL;
	struct kvr_ring_shm *r = mem;
	memset(r, 0, sizeof(*r));
	r->version = KVR_RING_VERSION;
	r->capacity = capacity;
	r->msg_size = msg_size;
	r->spin_ns = KVR_RING_DEFAULT_SPIN_NS;
	r->data_off = sizeof(struct kvr_ring_shm);
	atomic_init(&r->cons_waiter_off, (int64_t)offsetof(struct kvr_ring_shm, own_cons_waiter));
	atomic_init(&r->prod_waiter_off, (int64_t)offsetof(struct kvr_ring_shm, own_prod_waiter));
	if (name)
		strncpy(r->name, name, KVR_RING_NAME_MAX - 1);
	/* Publish the magic last: an observer that sees it sees an initialised header. */
	atomic_store_explicit((_Atomic uint64_t *)&r->magic, KVR_RING_MAGIC, memory_order_release);
	return 0;
}

int kvr_ring_reset(void *mem, uint32_t capacity, uint32_t msg_size, uint32_t spin_ns, const char *name)
{
	size_t sz = kvr_ring_memsize(capacity, msg_size);
	if (!mem || !sz || ((uintptr_t)mem % KVR_CACHELINE))
		return -EINVAL;
	struct kvr_ring_shm *r = mem;
	const memory_order rx = memory_order_relaxed;
	atomic_store_explicit(&r->tail, 0, rx);
	atomic_store_explicit(&r->head, 0, rx);
	atomic_store_explicit(&r->prod_pid, 0, rx);
	atomic_store_explicit(&r->cons_pid, 0, rx);
	atomic_store_explicit(&r->prod_blocked, 0, rx);
	atomic_store_explicit(&r->cons_blocked, 0, rx);
	_Atomic uint64_t *const counters[] = {&r->enqueued, &r->full_waits, &r->full_wait_ns,
					      &r->dequeued, &r->empty_sleeps, &r->rejected};
	for (unsigned i = 0; i < sizeof(counters) / sizeof(counters[0]); i++)
		atomic_store_explicit(counters[i], 0, rx);
	struct kvr_waiter *const own[] = {&r->own_cons_waiter, &r->own_prod_waiter};
	for (unsigned i = 0; i < 2; i++) {
		atomic_store_explicit(&own[i]->seq, 0, rx);
		atomic_store_explicit(&own[i]->sleepers, 0, rx);
	}
	atomic_store_explicit(&r->cons_waiter_off, (int64_t)offsetof(struct kvr_ring_shm, own_cons_waiter), rx);
	atomic_store_explicit(&r->prod_waiter_off, (int64_t)offsetof(struct kvr_ring_shm, own_prod_waiter), rx);
	/* written once at init, read by observers without ordering: rewritten only if changed */
	char nm[KVR_RING_NAME_MAX] = {0};
	if (name)
		strncpy(nm, name, KVR_RING_NAME_MAX - 1);
	if (r->version != KVR_RING_VERSION)
		r->version = KVR_RING_VERSION;
	if (r->capacity != capacity)
		r->capacity = capacity;
	if (r->msg_size != msg_size)
		r->msg_size = msg_size;
	if (r->spin_ns != spin_ns)
		r->spin_ns = spin_ns;
	if (r->data_off != sizeof(struct kvr_ring_shm))
		r->data_off = sizeof(struct kvr_ring_shm);
	if (memcmp(r->name, nm, sizeof(nm)))
		memcpy(r->name, nm, sizeof(nm));
	if (__atomic_load_n(&r->magic, __ATOMIC_RELAXED) != KVR_RING_MAGIC)
		__atomic_store_n(&r->magic, KVR_RING_MAGIC, __ATOMIC_RELEASE);
	return 0;
}

/* The waiter at shm + off if it is the ring's own (own), or one the mapping's owner calls
 * legal; NULL otherwise. The address is computed in integers: off is untrusted. */
static struct kvr_waiter *resolve_waiter(const struct kvr_ring *v, int64_t off, struct kvr_waiter *own)
{
	uintptr_t addr = (uintptr_t)v->shm + (uintptr_t)off;
	if (addr == (uintptr_t)own)
		return own;
	if (addr % _Alignof(struct kvr_waiter) == 0 && v->legal.ok && v->legal.ok(v->legal.ctx, addr))
		return (struct kvr_waiter *)addr;
	return NULL;
}

/* The view of r with the given sizes (already checked). A waiter offset that names no legal
 * waiter fails it (strict: kvr_ring_view) or gives the ring's own (kvr_ring_view_sized). */
static int make_view(struct kvr_ring_shm *r, uint32_t capacity, uint32_t msg_size,
		     const struct kvr_ring_waiters *legal, bool strict, struct kvr_ring *ret)
{
	uint32_t spin = r->spin_ns;
	struct kvr_ring v = {
		.shm = r,
		.data = (uint8_t *)r + sizeof(*r),
		.mask = capacity - 1,
		.msg_size = msg_size,
		.spin_ns = spin < KVR_RING_MAX_SPIN_NS ? spin : KVR_RING_MAX_SPIN_NS,
		.cons_off = atomic_load_explicit(&r->cons_waiter_off, memory_order_relaxed),
		.prod_off = atomic_load_explicit(&r->prod_waiter_off, memory_order_relaxed),
	};
	if (legal)
		v.legal = *legal;
	v.cons_w = resolve_waiter(&v, v.cons_off, &r->own_cons_waiter);
	v.prod_w = resolve_waiter(&v, v.prod_off, &r->own_prod_waiter);
	if (strict && (!v.cons_w || !v.prod_w))
		return -EINVAL;
	if (!v.cons_w)
		v.cons_w = &r->own_cons_waiter;
	if (!v.prod_w)
		v.prod_w = &r->own_prod_waiter;
	*ret = v;
	return 0;
}

int kvr_ring_view(void *mem, size_t avail, const struct kvr_ring_waiters *legal, struct kvr_ring *ret)
{
	struct kvr_ring_shm *r = mem;
	if (!mem || !ret || avail < sizeof(*r) || ((uintptr_t)mem % KVR_CACHELINE))
		return -EINVAL;
	if (atomic_load_explicit((_Atomic uint64_t *)&r->magic, memory_order_acquire) != KVR_RING_MAGIC ||
	    r->version != KVR_RING_VERSION)
		return -EPROTO;
	/* Read each field once: a peer may change the header while we look at it. */
	uint32_t capacity = r->capacity, msg_size = r->msg_size, data_off = r->data_off;
	size_t sz = kvr_ring_memsize(capacity, msg_size);
	if (!sz || sz > avail || data_off != sizeof(*r))
		return -EINVAL;
	/* observers print the name: it must end inside its field */
	if (!memchr(r->name, '\0', sizeof(r->name)))
		return -EINVAL;
	return make_view(r, capacity, msg_size, legal, true, ret);
}

int kvr_ring_view_sized(void *mem, uint32_t capacity, uint32_t msg_size, const struct kvr_ring_waiters *legal,
			struct kvr_ring *ret)
{
	if (!mem || !ret || ((uintptr_t)mem % KVR_CACHELINE) || !kvr_ring_memsize(capacity, msg_size))
		return -EINVAL;
	return make_view(mem, capacity, msg_size, legal, false, ret);
}

void kvr_ring_set_consumer_waiter(struct kvr_ring_shm *r, struct kvr_waiter *w)
{
	atomic_store_explicit(&r->cons_waiter_off, (int64_t)((uint8_t *)w - (uint8_t *)r), memory_order_relaxed);
}

void kvr_ring_set_producer_waiter(struct kvr_ring_shm *r, struct kvr_waiter *w)
{
	atomic_store_explicit(&r->prod_waiter_off, (int64_t)((uint8_t *)w - (uint8_t *)r), memory_order_relaxed);
}

/* The waiter to wake, after a re-pointing by kvringd (rare: a relaxed load of a line that
 * is read-mostly): *w as resolved from *off, resolved again when the shared offset moved.
 * An offset that resolves to no legal waiter wakes the ring's own. */
static struct kvr_waiter *current_waiter(struct kvr_ring *r, _Atomic int64_t *shared_off, int64_t *off,
					 struct kvr_waiter **w, struct kvr_waiter *own)
{
	int64_t now = atomic_load_explicit(shared_off, memory_order_relaxed);
	if (__builtin_expect(now != *off, 0)) {
		struct kvr_waiter *got = resolve_waiter(r, now, own);
		*w = got ? got : own;
		*off = now;
	}
	return *w;
}

struct kvr_waiter *kvr_ring_consumer_waiter(struct kvr_ring *r)
{
	return current_waiter(r, &r->shm->cons_waiter_off, &r->cons_off, &r->cons_w, &r->shm->own_cons_waiter);
}

struct kvr_waiter *kvr_ring_producer_waiter(struct kvr_ring *r)
{
	return current_waiter(r, &r->shm->prod_waiter_off, &r->prod_off, &r->prod_w, &r->shm->own_prod_waiter);
}

/* A claimant is not waiting, whatever a predecessor killed mid-wait left in the flag. */
void kvr_ring_claim_producer(struct kvr_ring *r, pid_t pid)
{
	atomic_store_explicit(&r->shm->prod_pid, pid, memory_order_relaxed);
	atomic_store_explicit(&r->shm->prod_blocked, 0, memory_order_relaxed);
}

void kvr_ring_claim_consumer(struct kvr_ring *r, pid_t pid)
{
	atomic_store_explicit(&r->shm->cons_pid, pid, memory_order_relaxed);
	atomic_store_explicit(&r->shm->cons_blocked, 0, memory_order_relaxed);
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

int kvr_waiters_wait(struct kvr_waiter *const *w, const uint32_t *seen, unsigned n, int64_t timeout_ns)
{
	if (n == 1)
		return kvr_waiter_wait(w[0], seen[0], timeout_ns);
	if (n == 0 || n > KVR_WAITERS_MAX)
		return n ? -E2BIG : -EINVAL;
	struct futex_waitv v[KVR_WAITERS_MAX];
	for (unsigned i = 0; i < n; i++) /* shared futexes: FUTEX_32 without FUTEX_PRIVATE_FLAG */
		v[i] = (struct futex_waitv){.val = seen[i], .uaddr = (uint64_t)(uintptr_t)&w[i]->seq, .flags = FUTEX_32};
	struct timespec abs, *tsp = NULL;
	if (timeout_ns >= 0) { /* futex_waitv takes an absolute deadline */
		uint64_t at = kvr_now_ns() + (uint64_t)timeout_ns;
		abs.tv_sec = (time_t)(at / 1000000000u);
		abs.tv_nsec = (long)(at % 1000000000u);
		tsp = &abs;
	}
	if (syscall(SYS_futex_waitv, v, n, 0, tsp, CLOCK_MONOTONIC) >= 0)
		return 0;
	if (errno == EAGAIN) /* a word changed before we slept */
		return 0;
	return -errno;
}

/* ---- fast path ---------------------------------------------------------------------- */

static inline void bump(_Atomic uint64_t *c, uint64_t by)
{
	/* Single writer: a plain load+store avoids a locked instruction. */
	atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + by, memory_order_relaxed);
}

/* Fill from a pair of indices: t - h, or 0 when that exceeds the capacity (only scribbled
 * indices do that). The consumer sees such a ring empty; the producer, through
 * kvr_ring_free(), full. */
static inline uint32_t fill_of(uint32_t t, uint32_t h, uint32_t capacity)
{
	uint32_t n = t - h;
	return n <= capacity ? n : 0;
}

static inline uint32_t capacity_of(const struct kvr_ring *r)
{
	return r->mask + 1;
}

uint32_t kvr_ring_count(const struct kvr_ring *r)
{
	uint32_t t = atomic_load_explicit(&r->shm->tail, memory_order_acquire);
	uint32_t h = atomic_load_explicit(&r->shm->head, memory_order_acquire);
	return fill_of(t, h, capacity_of(r));
}

uint32_t kvr_ring_free(const struct kvr_ring *r)
{
	uint32_t t = atomic_load_explicit(&r->shm->tail, memory_order_acquire);
	uint32_t h = atomic_load_explicit(&r->shm->head, memory_order_acquire);
	return t - h <= capacity_of(r) ? capacity_of(r) - (t - h) : 0;
}

uint32_t kvr_ring_shm_count(const struct kvr_ring_shm *r)
{
	uint32_t t = atomic_load_explicit(&((struct kvr_ring_shm *)r)->tail, memory_order_acquire);
	uint32_t h = atomic_load_explicit(&((struct kvr_ring_shm *)r)->head, memory_order_acquire);
	return fill_of(t, h, r->capacity);
}

static unsigned enqueue(struct kvr_ring *r, const void *msgs, unsigned n, bool wake)
{
	uint32_t t = atomic_load_explicit(&r->shm->tail, memory_order_relaxed);
	/* acquire pairs with the consumer's release store of head: slots it freed are read out */
	uint32_t h = atomic_load_explicit(&r->shm->head, memory_order_acquire);
	uint32_t room = t - h <= capacity_of(r) ? capacity_of(r) - (t - h) : 0;
	if (n > room)
		n = room;
	if (!n)
		return 0;
	const uint8_t *src = msgs;
	for (unsigned i = 0; i < n; i++)
		memcpy(slot_at(r, t + i), src + (size_t)i * r->msg_size, r->msg_size);
	/* release pairs with the consumer's acquire load of tail: the copies are visible first */
	atomic_store_explicit(&r->shm->tail, t + n, memory_order_release);
	bump(&r->shm->enqueued, n);
	if (wake)
		kvr_waiter_wake(kvr_ring_consumer_waiter(r));
	return n;
}

unsigned kvr_ring_enqueue_burst(struct kvr_ring *r, const void *msgs, unsigned n)
{
	return enqueue(r, msgs, n, true);
}

int kvr_ring_try_enqueue_quiet(struct kvr_ring *r, const void *msg)
{
	return enqueue(r, msg, 1, false) ? 0 : -EAGAIN;
}

void kvr_ring_wake_consumer(struct kvr_ring *r)
{
	kvr_waiter_wake(kvr_ring_consumer_waiter(r));
}

unsigned kvr_ring_dequeue_burst(struct kvr_ring *r, void *ret_msgs, unsigned n)
{
	uint32_t h = atomic_load_explicit(&r->shm->head, memory_order_relaxed);
	/* acquire pairs with the producer's release store of tail */
	uint32_t t = atomic_load_explicit(&r->shm->tail, memory_order_acquire);
	uint32_t avail = fill_of(t, h, capacity_of(r));
	if (n > avail)
		n = avail;
	if (!n)
		return 0;
	uint8_t *dst = ret_msgs;
	for (unsigned i = 0; i < n; i++)
		memcpy(dst + (size_t)i * r->msg_size, slot_at(r, h + i), r->msg_size);
	/* release pairs with the producer's acquire load of head: we are done reading */
	atomic_store_explicit(&r->shm->head, h + n, memory_order_release);
	bump(&r->shm->dequeued, n);
	kvr_waiter_wake(kvr_ring_producer_waiter(r));
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
	uint32_t h = atomic_load_explicit(&r->shm->head, memory_order_acquire);
	uint32_t t = atomic_load_explicit(&r->shm->tail, memory_order_acquire);
	if (i >= fill_of(t, h, capacity_of(r)))
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
		int rc = wait_until(r, has_room, kvr_ring_producer_waiter(r), &r->shm->prod_blocked, NULL,
				    timeout_ns, start);
		bump(&r->shm->full_waits, 1);
		bump(&r->shm->full_wait_ns, kvr_now_ns() - start);
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
		int rc = wait_until(r, has_msg, kvr_ring_consumer_waiter(r), &r->shm->cons_blocked,
				    &r->shm->empty_sleeps, timeout_ns, start);
		if (rc < 0)
			return rc;
	}
}
