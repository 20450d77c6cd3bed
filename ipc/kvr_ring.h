/* kvr_ring: single-producer single-consumer ring of fixed-size messages in shared memory. */
#ifndef KVR_RING_H
#define KVR_RING_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/*
 * Contract
 * --------
 * A ring lives in memory someone else owns (a shared-memory segment): size it with
 * kvr_ring_memsize(), then kvr_ring_init() it in place. Its shared header (struct
 * kvr_ring_shm) holds no pointers, only offsets, so every process that maps the segment at
 * any address can use it.
 *
 * A process uses a ring through its own view (struct kvr_ring), built once by
 * kvr_ring_view(): the header is validated (magic, version, sizes, offsets inside the
 * mapping, waiters among the legal ones) and the view keeps the mask, message size, data
 * pointer and waiter pointers in process-private memory. The fast path reads the sizes and
 * the data pointer from the view only, never again from the shared header, so a peer that
 * scribbles over the header (a buggy worker) cannot make this process copy outside the
 * ring or outside its own buffers: it can only make the ring look empty or full, or its
 * messages garbage (which decoders reject). The one shared field the fast path reads is
 * each waiter offset, because kvringd re-points it when a DCP group re-forms: a changed
 * offset is resolved again and checked against the legal waiters before it is used (an
 * illegal one falls back to the ring's own waiter).
 *
 * Exactly one producer process and one consumer process at a time. Capacity is a power
 * of two; indices are free-running 32-bit counters (tail - head = fill; a fill above the
 * capacity, which only a scribbled index can produce, reads as an empty ring to the
 * consumer and a full one to the producer).
 *
 * Blocking is the backpressure: kvr_ring_enqueue() on a full ring waits for the consumer,
 * kvr_ring_dequeue() on an empty ring waits for the producer. Waiting is adaptive: a
 * bounded spin, then a futex sleep on a kvr_waiter. The side that makes progress makes a
 * syscall (FUTEX_WAKE) only when the other side announced it sleeps.
 *
 * A kvr_waiter can be shared: an actor that consumes several rings points all of them at
 * one waiter (kvr_ring_set_consumer_waiter()), then sleeps once in kvr_waiter_wait()
 * until any of them gets work. The waiter must lie in the same mapping as the ring.
 *
 * Return values: 0 or a count on success, negative errno on failure:
 *   -EAGAIN     try-variant and the ring is full (enqueue) or empty (dequeue)
 *   -ETIMEDOUT  timed variant and the deadline passed
 *   -EINTR      the wait was interrupted by a signal (the caller re-checks its stop flag)
 *   -EINVAL     bad arguments or a ring header that does not validate
 */

#define KVR_RING_MAGIC 0x474e495252564b00ull /* "\0KVRRING" */
#define KVR_RING_VERSION 1u
#define KVR_RING_NAME_MAX 32
#define KVR_CACHELINE 64
#define KVR_RING_MAX_SPIN_NS 1000000u /* a view never spins longer than this, whatever the header says */

/* One futex word plus the sleepers' announcement. seq changes whenever sleepers must
 * wake. sleepers counts announced sleepers (low 31 bits); bit 31 says a wake was sent
 * since the last announcement, so further wakers make no syscall until a sleeper
 * announces itself again. */
struct kvr_waiter {
	_Atomic uint32_t seq;
	_Atomic uint32_t sleepers;
};

/* The shared header, at the start of the ring's memory; the messages follow it. */
struct kvr_ring_shm {
	/* line 0: immutable after init, except the waiter offsets (kvringd re-points them) */
	uint64_t magic;
	uint32_t version;
	uint32_t capacity; /* messages, power of two */
	uint32_t msg_size; /* bytes, multiple of 8 */
	uint32_t spin_ns;  /* how long a waiter spins before it sleeps */
	_Atomic int64_t cons_waiter_off; /* offset from the ring to the consumer's waiter */
	_Atomic int64_t prod_waiter_off; /* offset from the ring to the producer's waiter */
	uint32_t data_off;       /* offset from the ring to message 0 */
	uint32_t reserved0;

	char name[KVR_RING_NAME_MAX];

	/* line 2: producer side, written by the producer only */
	_Alignas(KVR_CACHELINE) _Atomic uint32_t tail;
	_Atomic int32_t prod_pid;
	_Atomic uint64_t enqueued;
	_Atomic uint64_t full_waits;    /* times the producer found the ring full and waited */
	_Atomic uint64_t full_wait_ns;  /* total time it waited */
	_Atomic uint32_t prod_blocked;  /* 1 while the producer waits on a full ring */
	uint32_t reserved1;

	/* line 3: consumer side, written by the consumer only */
	_Alignas(KVR_CACHELINE) _Atomic uint32_t head;
	_Atomic int32_t cons_pid;
	_Atomic uint64_t dequeued;
	_Atomic uint64_t empty_sleeps;  /* times the consumer went to sleep on an empty ring */
	_Atomic uint64_t rejected;      /* malformed messages the consumer rejected */
	_Atomic uint32_t cons_blocked;  /* 1 while the consumer waits on an empty ring */
	uint32_t reserved2;

	/* line 4: the ring's own waiters (used unless redirected to a shared one) */
	_Alignas(KVR_CACHELINE) struct kvr_waiter own_cons_waiter;
	struct kvr_waiter own_prod_waiter;
};

_Static_assert(offsetof(struct kvr_ring_shm, tail) == 128, "producer line");
_Static_assert(offsetof(struct kvr_ring_shm, head) == 192, "consumer line");
_Static_assert(offsetof(struct kvr_ring_shm, own_cons_waiter) == 256, "waiter line");
_Static_assert(sizeof(struct kvr_ring_shm) == 320, "ring header size");

/* Which waiters, besides the ring's own two, a ring may point at: ok(ctx, addr) says
 * whether addr (computed from an untrusted offset: compare it, never dereference it
 * before ok says yes) is one. The owner of the mapping supplies it (kvr_ctl_attach: the
 * actor and client table entries' waiters); it must stay valid as long as the view. */
struct kvr_ring_waiters {
	bool (*ok)(const void *ctx, uintptr_t addr);
	const void *ctx;
};

/* A process-private view of one ring: everything the fast path needs, checked once. */
struct kvr_ring {
	struct kvr_ring_shm *shm;  /* indices, counters, pids: the only shared state written */
	uint8_t *data;             /* message 0 */
	uint32_t mask;             /* capacity - 1 */
	uint32_t msg_size;
	uint32_t spin_ns;          /* at most KVR_RING_MAX_SPIN_NS */
	uint32_t reserved;
	int64_t cons_off, prod_off;        /* the shared offsets cons_w / prod_w were resolved from */
	struct kvr_waiter *cons_w, *prod_w;
	struct kvr_ring_waiters legal;
};

/* Bytes needed for a ring of capacity messages of msg_size bytes; 0 if the sizes are
 * invalid (capacity not a power of two in [2, 2^30], msg_size not a multiple of 8 in
 * [8, 4096]). */
size_t kvr_ring_memsize(uint32_t capacity, uint32_t msg_size);

/* Initialise a ring in place at mem (64-byte aligned, kvr_ring_memsize() bytes). */
int kvr_ring_init(void *mem, uint32_t capacity, uint32_t msg_size, const char *name);

/* Make the ring at mem, initialised before, empty again with these sizes and name, its
 * indices, pids, flags, counters and own waiters zero, its waiter offsets its own — while
 * observers (/metrics, inspect) may read it: every shared word is stored atomically, and
 * the fields written once at init only where they differ (a scribbler changed them). No
 * endpoint may use the ring meanwhile. Returns 0 or -EINVAL as kvr_ring_init(). */
int kvr_ring_reset(void *mem, uint32_t capacity, uint32_t msg_size, uint32_t spin_ns, const char *name);

/* Validate the ring header found in a mapping of avail bytes starting at mem and build the
 * view *ret. legal may be NULL (only the ring's own waiters are legal). Returns 0, or
 * -EINVAL (sizes or offsets that do not validate, a waiter that is not legal) / -EPROTO
 * (wrong magic or version); *ret is untouched on failure. */
int kvr_ring_view(void *mem, size_t avail, const struct kvr_ring_waiters *legal, struct kvr_ring *ret);

/* Build the view of a ring whose sizes the caller knows from a source it trusts (the
 * control segment's directory, written by kvringd only), not from the header: nothing but
 * the waiter offsets is read from the header, and an offset that names no legal waiter
 * gives the ring's own. A header scribbled over by a peer thus neither fails this nor
 * changes the view. 0, or -EINVAL (bad arguments, sizes kvr_ring_memsize() refuses). */
int kvr_ring_view_sized(void *mem, uint32_t capacity, uint32_t msg_size, const struct kvr_ring_waiters *legal,
			struct kvr_ring *ret);

/* Redirect the waiter the consumer (producer) sleeps on: the owner of the layout only
 * (kvringd), before or between the endpoints' use. w must lie in the same mapping. */
void kvr_ring_set_consumer_waiter(struct kvr_ring_shm *r, struct kvr_waiter *w);
void kvr_ring_set_producer_waiter(struct kvr_ring_shm *r, struct kvr_waiter *w);
/* The waiters the view wakes (after resolving a changed offset). */
struct kvr_waiter *kvr_ring_consumer_waiter(struct kvr_ring *r);
struct kvr_waiter *kvr_ring_producer_waiter(struct kvr_ring *r);

/* Record which process produces / consumes (for inspect). Also clears that side's blocked
 * flag, which a predecessor killed while it waited leaves set. Waiter sleeper counts are not
 * touched (a waiter may be shared): whoever restarts a dead side resets its waiter. */
void kvr_ring_claim_producer(struct kvr_ring *r, pid_t pid);
void kvr_ring_claim_consumer(struct kvr_ring *r, pid_t pid);

/* Non-blocking: copy one message in / out. -EAGAIN when full / empty. */
int kvr_ring_try_enqueue(struct kvr_ring *r, const void *msg);
int kvr_ring_try_dequeue(struct kvr_ring *r, void *ret_msg);

/* Blocking with a timeout in nanoseconds (< 0: wait forever, 0: same as try).
 * -ETIMEDOUT when the deadline passes, -EINTR on a signal. */
int kvr_ring_enqueue(struct kvr_ring *r, const void *msg, int64_t timeout_ns);
int kvr_ring_dequeue(struct kvr_ring *r, void *ret_msg, int64_t timeout_ns);

/* Quiet: kvr_ring_try_enqueue without waking the consumer. A producer that sends a batch
 * one message at a time wakes the consumer once after it (kvr_ring_wake_consumer), before
 * it sleeps or waits for an answer: where both share a CPU, a wake per message hands the
 * CPU to the consumer per message (a context switch each way for every message). */
int kvr_ring_try_enqueue_quiet(struct kvr_ring *r, const void *msg);
void kvr_ring_wake_consumer(struct kvr_ring *r);

/* Bursts: copy up to n messages; return how many (0..n). Never block. */
unsigned kvr_ring_enqueue_burst(struct kvr_ring *r, const void *msgs, unsigned n);
unsigned kvr_ring_dequeue_burst(struct kvr_ring *r, void *ret_msgs, unsigned n);

/* Messages currently in the ring (a snapshot; exact for the producer and consumer; 0 when
 * the indices do not make sense). */
uint32_t kvr_ring_count(const struct kvr_ring *r);
uint32_t kvr_ring_free(const struct kvr_ring *r);
/* The same, for observers that read a validated header without a view (capacity from the
 * header: only kvr_ctl_attach()ed or kvr_ring_view()ed headers). */
uint32_t kvr_ring_shm_count(const struct kvr_ring_shm *r);

/* Read-only snapshot for observers (inspect): copy the message at head + i without
 * consuming it. Returns 0, or -ENOENT if i >= fill at the time of the call. A message
 * copied while the ring moves may be stale; callers decode it like any other input. */
int kvr_ring_peek(const struct kvr_ring *r, uint32_t i, void *ret_msg);

/* Wait until seq of w differs from seen, or timeout (< 0 forever). Consumers of several
 * rings use it as: seen = kvr_waiter_prepare(w); re-check rings; kvr_waiter_wait(w, seen, t);
 * kvr_waiter_finish(w). Returns 0, -ETIMEDOUT or -EINTR. */
uint32_t kvr_waiter_prepare(struct kvr_waiter *w);
int kvr_waiter_wait(struct kvr_waiter *w, uint32_t seen, int64_t timeout_ns);
void kvr_waiter_finish(struct kvr_waiter *w);
/* Wake every sleeper of w; a syscall only when one sleeps. */
void kvr_waiter_wake(struct kvr_waiter *w);

/* The same wait on n waiters at once (futex_waitv, Linux >= 5.16): returns when any of them
 * moves from its seen[i] (each kvr_waiter_prepare()d, kvr_waiter_finish()ed after), the
 * timeout passes or a signal arrives. 0, -ETIMEDOUT, -EINTR, -E2BIG (n above
 * KVR_WAITERS_MAX) or -ENOSYS (no futex_waitv: the caller waits on one and polls). */
#define KVR_WAITERS_MAX 128
int kvr_waiters_wait(struct kvr_waiter *const *w, const uint32_t *seen, unsigned n, int64_t timeout_ns);

/* One spin-wait step: tell the CPU we are spinning (PAUSE / YIELD). */
static inline void kvr_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__)
	__asm__ __volatile__("yield" ::: "memory");
#endif
}

/* A shared (cross-process) futex on any 32-bit word of a shared mapping: sleep while *addr
 * == val, up to timeout_ns (< 0: no limit). 0 (woken, or the word had changed), -ETIMEDOUT,
 * -EINTR. kvr_futex_wake wakes every sleeper; the writer calls it after changing the word. */
int kvr_futex_wait(_Atomic uint32_t *addr, uint32_t val, int64_t timeout_ns);
void kvr_futex_wake(_Atomic uint32_t *addr);

#endif
