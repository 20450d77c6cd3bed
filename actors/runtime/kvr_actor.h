/* kvr_actor: the event loop every kvring actor runs around its stage (lookup, loader, storer, ...). */
#ifndef KVR_ACTOR_H
#define KVR_ACTOR_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include <kvring/msg.h>

#include "kvr_config.h"
#include "kvr_ctl.h"
#include "kvr_time.h"
#include "kvr_ring.h"
#include "kvr_segment.h"
#include "kvr_slots.h"

/*
 * Contract
 * --------
 * An actor executable is a tiny main() that calls kvr_actor_main() with its stage. kvringd
 * starts it as
 *
 *   kvring-<kind> --ctl-fd N --arena-fd N --actor I --ready-fd N --slots-fd N
 *                 [--kv-fd N --kv-bytes N]        (loader and storer: the worker's KV memory)
 *                 [--group W,W,.. (--kv-fd N --kv-bytes N) per W]  (gather: its DCP group's
 *                                                  worker slots in DCP rank order, their KV)
 *
 * with the control segment, the arena, the slot table, the write end of a readiness pipe
 * and (loader, storer) the worker's KV memfd inherited.
 * kvr_actor_main():
 *   1. maps the control segment (read-write) and the arena, validates them, finds actor
 *      entry I and parses the effective config embedded in the control segment;
 *   2. attaches every ring the ring directory assigns to this actor: rings it consumes
 *      (the directory's consumer == I) become its inputs, rings it produces its outputs;
 *      it claims the consumer / producer pid on each. ctl.<name>.in and ctl.<name>.out are
 *      the control rings: the runtime serves them itself. The directory (written by
 *      kvringd's ring-spec builder) is the single place that says which actor uses which
 *      ring; a stage looks its rings up by name with kvr_actor_ring();
 *   3. calls stage->init, writes one byte to the readiness fd and closes it;
 *   4. loops: drains ctl.in (PING -> PONG, STOP -> leave the loop; any other control
 *      message goes to stage->on_msg with ring == ctl_in), hands every message of every
 *      input ring to stage->on_msg, calls stage->on_tick every stage->tick_ns, writes its
 *      heartbeat and counters, then sleeps on its waiter until a ring gets work, the next
 *      tick is due or a signal arrives. It never busy-polls.
 *   5. on STOP or SIGTERM (SIGINT too): calls stage->fini and returns 0.
 *
 * Return value (the process exit code): 0 clean stop, 1 setup failure (one log line names
 * what failed). Message accounting: every message taken off a ring counts in
 * KVR_STAT_MSGS_IN; a message the stage (or the runtime, for control messages) rejects
 * counts in KVR_STAT_MALFORMED and in the ring's `rejected`.
 *
 * Besides its rings the loop waits on file descriptors and timers the stage watches
 * (kvr_actor_watch_fd, kvr_actor_timer_start below): a stage that starts I/O (the disk
 * actor's io_uring, the remote actor's sockets) returns from on_msg at once and finishes
 * the request in the fd's callback. No handler blocks; health pings are answered by the
 * loop whatever requests are in flight. With an fd watched the loop sleeps in one
 * io_uring_enter covering its ring futex (io_uring FUTEX_WAIT), the fds and the next
 * deadline (actors/runtime/watch.c).
 */

#define KVR_ACTOR_MAX_RINGS 96 /* inputs and outputs per actor */
#define KVR_ACTOR_MAX_KV 16    /* KV memories one actor maps (a gather actor: its DCP group's) */
#define KVR_ACTOR_OUTPUT_POLL_NS 1000000 /* pending output: look at the readers' rings this often */
enum kvr_pass { KVR_PASS_IDLE = 0, KVR_PASS_WAITING = 1, KVR_PASS_MOVED = 2 };

struct kvr_actor;

struct kvr_stage {
	const char *name;          /* stage name for logs: "lookup" */
	enum kvr_actor_kind kind;  /* the actor kind the control segment must list for us */
	uint64_t tick_ns;          /* on_tick period; 0 = no tick */

	/* Called once after the rings are attached, before readiness. 0 or -errno (the
	 * actor then exits 1). May store its state with kvr_actor_set_data(). */
	int (*init)(struct kvr_actor *a);
	/* One message from an input ring (or a control message other than PING/STOP, then
	 * ring == a->ctl_in). Return 0 when handled, -EBADMSG to reject it: the runtime then
	 * counts it (KVR_STAT_MALFORMED, ring->rejected). Must not block for long. */
	int (*on_msg)(struct kvr_actor *a, struct kvr_ring *ring, const struct kvr_msg *m);
	/* Periodic work, every tick_ns (CLOCK_MONOTONIC now passed in). */
	void (*on_tick)(struct kvr_actor *a, uint64_t now_ns);
	/* Optional: called on every pass of the loop, after the inputs were served (flush
	 * outboxes, kvr_outbox.h), and once more after the loop announced its sleep (a reader
	 * that freed room just before the announcement woke nobody). Returns KVR_PASS_MOVED
	 * when it sent something, KVR_PASS_WAITING while output waits for room in a reader's
	 * ring (the loop then sleeps at most KVR_ACTOR_OUTPUT_POLL_NS; a reader freeing room
	 * wakes it), KVR_PASS_IDLE when nothing waits. A pass that returns KVR_PASS_MOVED is
	 * followed by another pass at once (its stage may have more to move). */
	int (*on_pass)(struct kvr_actor *a, uint64_t now_ns);
	/* Called once before a clean exit (STOP or SIGTERM); not after a failed init. */
	void (*fini)(struct kvr_actor *a);
};

struct kvr_actor_ring {
	struct kvr_ring *ring;
	int index;                 /* index in the ring directory */
	bool held;                 /* input: not served while set (kvr_actor_hold_input) */
};

struct kvr_actor_watch;

/* The runtime's state. Stages read these fields; they do not change them. */
struct kvr_actor {
	const struct kvr_stage *stage;
	struct kvr_segment ctl_seg, arena_seg, slots_seg;
	struct kvr_slot_table *slots;  /* the L1 slot table (--slots-fd), NULL when not given */
	unsigned n_kv;                 /* KV memories given (--kv-fd / --kv-bytes), in order: a
					* loader's or storer's worker (1), a gather actor's group */
	int kv_fds[KVR_ACTOR_MAX_KV];
	uint64_t kv_sizes[KVR_ACTOR_MAX_KV];
	unsigned n_group;              /* gather: --group, the worker slot of each DCP rank */
	unsigned group[KVR_ACTOR_MAX_KV];
	struct kvr_ctl *ctl;
	struct kvr_ctl_rings rings;    /* our views of the control segment's rings */
	struct kvr_config cfg;         /* the instance's effective config */
	unsigned index;                /* actor index in the control segment */
	struct kvr_actor_ent *ent;     /* our actor entry */
	struct kvr_actor_stats *stats; /* our counters */
	struct kvr_ring *ctl_in, *ctl_out;
	struct kvr_actor_ring inputs[KVR_ACTOR_MAX_RINGS];
	unsigned n_inputs;
	struct kvr_actor_ring outputs[KVR_ACTOR_MAX_RINGS];
	unsigned n_outputs;
	uint64_t handled;              /* messages handled since start (echoed in PONG) */
	int stopping;                  /* STOP received or SIGTERM seen */
	uint64_t now_ns;               /* CLOCK_MONOTONIC at the start of this loop pass: the
					* "now" of every handler the pass runs */
	struct kvr_actor_watch *watch; /* fd and timer watches (NULL until the first one) */
	struct kvr_populate *populate; /* background populate (NULL until the first region) */
	uint64_t poll_ns;              /* set by on_pass (kvr_actor_poll_within); 0: none */
	void *data;                    /* the stage's own state */
};

/* Run the actor; returns the process exit code (0 or 1). */
int kvr_actor_main(int argc, char **argv, const struct kvr_stage *stage);

/* Look up one of this actor's rings (input or output) by directory name; NULL if the
 * directory has no such ring or it does not belong to this actor. */
struct kvr_ring *kvr_actor_ring(const struct kvr_actor *a, const char *name);
/* The same for a per-worker ring: fmt takes the worker slot ("load.req.%u"). */
struct kvr_ring *kvr_actor_ring_w(const struct kvr_actor *a, const char *fmt, unsigned worker);

/*
 * File descriptor watches. fn runs in the loop (never inside another handler) when fd is
 * ready for one of `events` (POLLIN, POLLOUT; POLLERR and POLLHUP are always reported),
 * with the revents poll() would give. Level-triggered: after fn returns the fd is watched
 * again, so fn may leave data unread (it runs again on the next pass). Returns a watch id
 * (>= 0) or -errno (-ENOSPC: KVR_ACTOR_MAX_WATCHES in use; -ENOMEM, or what io_uring
 * setup said). kvr_actor_watch_events() changes the events (0 pauses the watch, the fd
 * stays registered); kvr_actor_unwatch_fd() ends it (the fd may be closed right after;
 * fn is not called again). Both ignore an id that is not a live watch.
 */
#define KVR_ACTOR_MAX_WATCHES 32
typedef void (*kvr_actor_fd_fn)(struct kvr_actor *a, int fd, uint32_t revents, void *arg);
int kvr_actor_watch_fd(struct kvr_actor *a, int fd, uint32_t events, kvr_actor_fd_fn fn, void *arg);
void kvr_actor_watch_events(struct kvr_actor *a, int id, uint32_t events);
void kvr_actor_unwatch_fd(struct kvr_actor *a, int id);

/*
 * Background populate (populate.c): fault one of this actor's mappings in from the loop
 * after it is ready — KVR_POPULATE_CHUNK bytes per pass that has nothing else to do, so a
 * message waits at most one chunk — instead of on the data path, one fault per 4 KiB page.
 * Only pages that already exist are mapped: populate never allocates memory.
 * `write` populates writable (MADV_POPULATE_WRITE: the mapping must be writable), else
 * readable. `what` names it in the log. Progress: the actor entry's populated /
 * populate_total (kvring-inspect, /metrics); one log line when all is in, with the
 * process's page-table bytes. kvr_actor_populate_forget() before unmapping a region.
 * add: 0, -EINVAL, -ENOSPC (KVR_POPULATE_MAX regions), -ENOMEM.
 */
#define KVR_POPULATE_MAX 16
#define KVR_POPULATE_CHUNK (2u << 20)
int kvr_actor_populate_add(struct kvr_actor *a, void *base, size_t len, bool write, const char *what);
void kvr_actor_populate_forget(struct kvr_actor *a, const void *base);
uint64_t kvr_actor_populate_left(const struct kvr_actor *a);
/* One chunk, if any is left: true when it did one (the loop looks at its rings next). */
bool kvr_actor_populate_step(struct kvr_actor *a);
/* Work is left that waits for kvringd's prefault of the arena (the loop sleeps shorter).
 * The arena (a region equal to a->arena_seg) is populated only as far as kvringd faulted
 * it in, and not at all where kvringd declined (l1.prefault "off", an arena larger than
 * the memory available). */
bool kvr_actor_populate_waiting(const struct kvr_actor *a);
void kvr_actor_populate_free(struct kvr_actor *a);

/*
 * One-shot timers: fn runs in the loop once CLOCK_MONOTONIC reaches deadline_ns (the loop
 * sleeps no longer than the earliest one). Returns a timer id (>= 0) or -ENOSPC
 * (KVR_ACTOR_MAX_TIMERS armed) / -ENOMEM. kvr_actor_timer_stop() disarms one that has not
 * fired; an id that fired, was stopped or is stale (ids carry a generation) is ignored.
 */
#define KVR_ACTOR_MAX_TIMERS 64
typedef void (*kvr_actor_timer_fn)(struct kvr_actor *a, uint64_t now_ns, void *arg);
int kvr_actor_timer_start(struct kvr_actor *a, uint64_t deadline_ns, kvr_actor_timer_fn fn, void *arg);
void kvr_actor_timer_stop(struct kvr_actor *a, int id);

/*
 * Hold an input ring: while held its messages stay in the ring (it fills, and a full ring is
 * the producer's backpressure) and the loop does not wake for them. A stage holds its input
 * while it has no room for another request (every I/O slot busy) and releases it from the
 * completion that made room. -ENOENT when r is not one of our inputs.
 */
int kvr_actor_hold_input(struct kvr_actor *a, struct kvr_ring *r, bool hold);

/* The stage's clock: the loop's `now` of this pass (a stepped test's injected clock), the
 * real one before the loop ran (init). Deadlines and queue times use it; durations of
 * work (how long a match took) read the real clock. */
static inline uint64_t kvr_actor_now(const struct kvr_actor *a)
{
	return a->now_ns ? a->now_ns : kvr_now_ns();
}

/* From on_pass, with KVR_PASS_WAITING: what waits is not a reader's ring but work in
 * flight that completes without waking us (a CUDA copy: its event is queried) — sleep at
 * most ns before the next pass. Good for that pass only. */
static inline void kvr_actor_poll_within(struct kvr_actor *a, uint64_t ns)
{
	if (!a->poll_ns || ns < a->poll_ns)
		a->poll_ns = ns;
}

static inline void kvr_actor_set_data(struct kvr_actor *a, void *data)
{
	a->data = data;
}

/* Say that the stage holds n accepted requests it has not answered yet (a DCP store
 * waiting for its group's other ranks): kvringd's drain waits for them as it waits for a
 * running handler. */
static inline void kvr_actor_set_held(struct kvr_actor *a, uint32_t n)
{
	atomic_store_explicit(&a->ent->held, n, memory_order_release);
}

/*
 * Progress beat: a handler working through a long request (a 60,000-block copy, a wait
 * for the lookup actor's answer) calls this between steps. It stamps the heartbeat the
 * loop stamps on every pass; kvringd's health check treats an actor whose heartbeat moves
 * as busy, not dead, even while its PINGs wait behind the request, and kills only one
 * whose heartbeat stands still too (supervisor/actors.c). Cheap: one clock read and one
 * relaxed store.
 */
static inline void kvr_actor_beat(struct kvr_actor *a)
{
	atomic_store_explicit(&a->ent->heartbeat_ns, kvr_now_ns(), memory_order_relaxed);
}

/* Add to one of our counters (atomic: kvringd also adds to KVR_STAT_MALFORMED for bad PONGs). */
static inline void kvr_actor_count(struct kvr_actor *a, unsigned s, uint64_t by)
{
	atomic_fetch_add_explicit(&a->stats->c[s], by, memory_order_relaxed);
}

#endif
