/* disk: the disk actor (kvring-disk) — serves the lookup actor's L2 writes, reads and syncs from one L2 directory. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <kvring/msg.h>

#include "kvr_actor.h"
#include "kvr_backlog.h"
#include "kvr_list.h"
#include "kvr_log.h"
#include "kvr_outbox.h"
#include "kvr_ring_names.h"
#include "kvr_time.h"
#include "l2store.h"

/*
 * One disk actor serves l2.dirs[i] (i = its index among disk actors) through one l2store.
 * Requests come on "disk.req.<i>" from the lookup actor, replies and notices go out on
 * "disk.rep.<i>" (docs/l2.md, "The disk actor").
 *
 * Nothing waits inside a handler: on_msg only prepares the I/O of a request (submitted
 * together with the others of the same loop pass, from on_pass), and the completions are
 * reaped when the store's eventfd becomes readable (a runtime fd watch) — the queue stays
 * full at queue_depth while requests keep coming. A request that finds every request slot
 * in use (or the engine busy with internal unlinks) waits in a short FIFO and the input
 * ring is held (kvr_actor_hold_input) until a completion makes room: the ring fills, and a
 * full ring is the lookup actor's backpressure. Requests are started in arrival order.
 * Every request accepted and not answered (in flight or waiting) is reported as held
 * (kvr_actor_set_held): kvringd's drain waits for L2 writes.
 *
 * l2.read_only: the store is opened read-only (l2store.h): adoption leaves what it skips in
 * place, L2_WRITE is answered -EROFS before it reaches the store (counted, logged once), a
 * read that finds a damaged file is a miss and the file stays. The lookup actor sends no
 * writes in this mode; a refusal means something else did.
 *
 * Stats page (enum kvr_stat_disk, kvr_ctl.h): counters for adoption (by reason), evictions,
 * failed reads and read-only refusals; gauges (bytes, files, cap) published by publish()
 * after adoption, after each batch of completions before their replies go out (so whoever
 * got a reply reads gauges that include it) and after each request.
 */
_Static_assert(KVR_L2_R_MAX == KVR_STAT_DK_REASON_MAX, "kvr_ctl.h's adoption reason counters follow l2file.h");

#define DISK_FINI_TIMEOUT_NS (1ull * 1000000000ull)
#define DISK_POLL_MAX 64u
#define DISK_REQ_NONE 0xffffffffu

struct disk_req {
	uint64_t req_id;
	kvr_key key;
	uint32_t slot, epoch;
	uint16_t lane;
	uint16_t type;              /* KVR_MSG_L2_WRITE or KVR_MSG_L2_READ; 0 = free */
	uint32_t next_free;
};

struct disk {
	struct kvr_actor *a;
	struct kvr_slot_table *slots;
	struct kvr_l2_store *store;
	struct kvr_ring *in, *out;
	unsigned qd;
	struct disk_req *reqs;      /* qd entries; the store tag is the index */
	uint32_t free_req;
	unsigned inflight;
	struct kvr_l2_done done[DISK_POLL_MAX];
	uint64_t send_timeout_ns;   /* an answer waits at most this for room in disk.rep */
	struct kvr_outbox out_q;    /* answers that found disk.rep full: no handler waits for room */
	bool batching;              /* pump: answers are deferred into out_q and flushed together */
	bool read_only;             /* l2.read_only */
	uint64_t refused;           /* L2_WRITEs refused (read-only) */
	const char *root;           /* l2.dirs[i] */
	uint64_t evictions_counted; /* store evictions already added to KVR_STAT_DK_EVICTED */
	uint64_t joined_counted, fixed_counted, unregistered_counted; /* engine transfers already added to KVR_STAT_DK_XFER_* */
	uint64_t write_fails;       /* failed L2 writes (each counted; logged at most every 10 s) */
	uint64_t write_fails_logged;
	uint64_t write_fail_log_ns;
	int watch;                  /* the store's completion eventfd watch */
	struct kvr_backlog wait;    /* requests that found no room, in arrival order */
	struct parked *parked;      /* reads done, payload checksum not yet compared: room for two
				     * batches of qd; on_done compares them early when it is full */
	unsigned n_parked;
};

/* A read whose I/O completed (header checked, payload whole) and whose payload checksum is
 * compared only once the requests that waited for its request slot are on their way to the
 * disk (progress): a batch's checksums then cost no disk time. Its slot keeps the I/O pin
 * and nobody hears of it until the comparison (read_answer). */
struct parked {
	struct disk_req q;
	struct kvr_l2_done c;
};

#define DISK_FAIL_LOG_NS (10ull * 1000000000ull)

/* ---- stats ------------------------------------------------------------------------------- */

static void gauge(struct disk *d, unsigned s, uint64_t v)
{
	atomic_store_explicit(&d->a->stats->c[s], v, memory_order_relaxed);
}

/* A counter of the store's (since it opened) added to stat s by what it grew since *counted
 * (the stats page sums over the actor's starts). */
static void count_since(struct disk *d, unsigned s, uint64_t now, uint64_t *counted)
{
	if (now > *counted) {
		kvr_actor_count(d->a, s, now - *counted);
		*counted = now;
	}
}

/* The store's state into the stats page: gauges overwritten, new evictions and transfers added. */
static void publish(struct disk *d)
{
	struct kvr_l2_store_stats st;
	kvr_l2_store_stats(d->store, &st);
	gauge(d, KVR_STAT_DK_FILES, st.files);
	gauge(d, KVR_STAT_DK_BYTES, st.files * st.file_bytes);
	gauge(d, KVR_STAT_DK_CAPACITY_BYTES, st.capacity_bytes);
	count_since(d, KVR_STAT_DK_EVICTED, st.evictions, &d->evictions_counted);
	count_since(d, KVR_STAT_DK_XFER_JOINED, st.io.joined_ios, &d->joined_counted);
	count_since(d, KVR_STAT_DK_XFER_REGISTERED, st.io.fixed_ios, &d->fixed_counted);
	count_since(d, KVR_STAT_DK_XFER_UNREGISTERED, st.io.plain_ios, &d->unregistered_counted);
}

/* ---- sending ----------------------------------------------------------------------------- */

static void send_l2(struct disk *d, unsigned type, uint64_t req_id, kvr_key key, uint16_t lane, uint32_t slot,
		    uint32_t epoch, uint16_t flags, int status)
{
	struct kvr_msg_l2 b = {
		.key_lo = key.lo, .key_hi = key.hi, .slot = slot, .epoch = epoch,
		.lane = lane, .flags = flags, .status = status,
	};
	struct kvr_msg m;
	kvr_msg_build(&m, type, status < 0 ? KVR_MSGF_ERROR : 0, req_id, 0, &b, sizeof(b));
	/* never waits: a full ring queues the answer, on_pass sends it as room appears; the
	 * answers of one batch of completions go out together (pump) */
	uint64_t now = kvr_now_ns();
	if (d->batching ? kvr_outbox_defer(&d->out_q, &m, now) : kvr_outbox_send(&d->out_q, &m, now)) {
		if (d->out_q.dropped == 1) /* the first drop: out_q.dropped counts them all */
			kvr_warn("disk.rep: %s dropped (%s)", kvr_msg_type_name(type), strerror(ENOBUFS));
		return;
	}
	kvr_actor_count(d->a, KVR_STAT_MSGS_OUT, 1);
}

/* Queued answers to the ring; those that waited send_timeout_ns are dropped (the lookup
 * actor stopped reading: counted in out_q.dropped, logged once). */
static int flush_out(struct disk *d, uint64_t now)
{
	return kvr_outbox_pass(&d->out_q, now, d->send_timeout_ns) ? KVR_PASS_WAITING : KVR_PASS_IDLE;
}

/* ---- request slots ----------------------------------------------------------------------- */

static uint32_t req_get(struct disk *d)
{
	uint32_t r = d->free_req;
	if (r == DISK_REQ_NONE)
		return r;
	d->free_req = d->reqs[r].next_free;
	d->inflight++;
	return r;
}

static void req_put(struct disk *d, uint32_t r)
{
	d->reqs[r].type = 0;
	d->reqs[r].next_free = d->free_req;
	d->free_req = r;
	d->inflight--;
}

/* ---- completions ------------------------------------------------------------------------- */

static bool slot_is(const struct disk *d, uint32_t slot, kvr_key key, uint16_t lane)
{
	const struct kvr_slot *s = kvr_slot_at(d->slots, slot);
	return s->key.lo == key.lo && s->key.hi == key.hi && s->lane == lane;
}

/* A failed L2 write: counted by the lookup actor (WRITE_DONE status), logged here with the
 * dir, the file and errno — the first at once, then at most one line per 10 s, which says
 * how many failed since the line before. */
static void write_failed(struct disk *d, kvr_key key, unsigned lane, int rc)
{
	uint64_t now = kvr_now_ns();
	if (d->write_fails++ && now - d->write_fail_log_ns < DISK_FAIL_LOG_NS)
		return;
	char name[KVR_L2_NAME_MAX];
	kvr_warn("l2 %s/%s: write failed: %s (%llu failed writes since the last such line)", kvr_l2_store_dir(d->store),
		 kvr_l2_name_fmt(key, lane, name), strerror(-rc),
		 (unsigned long long)(d->write_fails - d->write_fails_logged));
	d->write_fails_logged = d->write_fails;
	d->write_fail_log_ns = now;
}

static void read_answer(struct disk *d, const struct disk_req *q, const struct kvr_l2_done *c);
static void verify_parked(struct disk *d);

static void on_done(struct disk *d, const struct kvr_l2_done *c)
{
	if (c->kind == KVR_L2_GONE) {
		send_l2(d, KVR_MSG_L2_GONE, 0, c->key, (uint16_t)c->lane, 0, 0, 0, 0);
		return;
	}
	if (c->tag >= d->qd || !d->reqs[c->tag].type) {
		kvr_err("l2 completion for unknown request %llu", (unsigned long long)c->tag);
		return;
	}
	uint32_t r = (uint32_t)c->tag;
	struct disk_req q = d->reqs[r];
	req_put(d, r);
	if (q.type == KVR_MSG_L2_WRITE) {
		/* the bytes are out of the slot: it may be evicted now */
		(void)kvr_slot_unpin(d->slots, q.slot, KVR_PIN_IO);
		if (c->res < 0)
			write_failed(d, q.key, q.lane, c->res);
		send_l2(d, KVR_MSG_L2_WRITE_DONE, q.req_id, q.key, q.lane, q.slot, q.epoch, 0, c->res);
	} else if (c->unverified) {
		if (d->n_parked == 2 * d->qd)
			verify_parked(d); /* a progress loop whose disk keeps finishing batches: compare now */
		d->parked[d->n_parked++] = (struct parked){.q = q, .c = *c};
	} else {
		read_answer(d, &q, c);
	}
}

/* A read's answer: res 0 only once header and payload checksum were compared. */
static void read_answer(struct disk *d, const struct disk_req *q, const struct kvr_l2_done *c)
{
	if (c->res == -ENOENT)
		kvr_actor_count(d->a, KVR_STAT_DK_READS_VANISHED, 1);
	if (c->res && c->res != -ENOENT) {
		char name[KVR_L2_NAME_MAX];
		bool io = c->reason == KVR_L2_R_IO;
		kvr_actor_count(d->a, io ? KVR_STAT_DK_READS_IO_ERROR : KVR_STAT_DK_READS_DAMAGED, 1);
		/* once per file: the store has dropped it from its index */
		kvr_warn("l2 %s/%s: %s (%s): a miss; %s", kvr_l2_store_dir(d->store), kvr_l2_name_fmt(q->key, q->lane, name),
			 kvr_l2_reason_name(c->reason), strerror(-c->res),
			 d->read_only ? "left on disk (l2.read_only), not served again" : "removed");
		if (d->read_only)
			kvr_actor_count(d->a, KVR_STAT_DK_BAD_KEPT, 1);
	}
	/* the store no longer serves the file: vanished, damaged or unreadable */
	uint16_t flags = c->res == -ENOENT || (c->res < 0 && c->reason != KVR_L2_OK) ? KVR_L2F_GONE : 0;
	int res = c->res;
	/* checked again at completion: the slot must still be the WRITING allocation the read
	 * was started for (our I/O pin kept it from being reused, but the lookup actor may have
	 * aborted it meanwhile: then the bytes are discarded with the slot) */
	if (res == 0 && (kvr_slot_state(d->slots, q->slot) != KVR_SLOT_WRITING ||
			 kvr_slot_epoch(d->slots, q->slot) != q->epoch || !slot_is(d, q->slot, q->key, q->lane))) {
		kvr_actor_count(d->a, KVR_STAT_DK_READS_DISCARDED, 1);
		res = -ESTALE;
	}
	(void)kvr_slot_unpin(d->slots, q->slot, KVR_PIN_IO);
	send_l2(d, KVR_MSG_L2_READ_DONE, q->req_id, q->key, q->lane, q->slot, q->epoch, flags, res);
}

/* Compare the parked reads' payload checksums (the slot still holds what was read: our I/O
 * pin keeps it) and answer them, in one burst. */
static void verify_parked(struct disk *d)
{
	bool was = d->batching;
	d->batching = true;
	for (unsigned i = 0; i < d->n_parked; i++) {
		struct parked *p = &d->parked[i];
		int rc = kvr_l2_store_verify(d->store, &p->c, kvr_slot_data(d->slots, d->a->arena_seg.base, p->q.slot));
		if (rc)
			kvr_err("l2 %s: dropping a file that failed its checksum: %s", kvr_l2_store_dir(d->store),
				strerror(-rc));
	}
	publish(d); /* a dropped file out of the gauges before the answers: they may tell someone to look */
	for (unsigned i = 0; i < d->n_parked; i++)
		read_answer(d, &d->parked[i].q, &d->parked[i].c);
	d->n_parked = 0;
	d->batching = was;
	if (!was)
		(void)flush_out(d, kvr_now_ns());
}

/* Collect completions (waiting for at least min_done) and answer them. Returns how many
 * were handled or -errno. */
static int pump(struct disk *d, unsigned min_done)
{
	int total = 0;
	for (;;) {
		int n = kvr_l2_store_poll(d->store, d->done, DISK_POLL_MAX, min_done);
		if (n < 0) {
			kvr_err("l2 poll: %s", strerror(-n));
			return n;
		}
		if (n)
			publish(d); /* before the replies: they may tell someone to look */
		/* the answers in one burst, one wake of the lookup actor: a wake per answer hands
		 * it the CPU per answer where the two share one */
		d->batching = true;
		for (int i = 0; i < n; i++)
			on_done(d, &d->done[i]);
		d->batching = false;
		if (n)
			(void)flush_out(d, kvr_now_ns());
		total += n;
		if ((unsigned)n < DISK_POLL_MAX)
			return total;
		min_done = 0; /* a full batch: take what else is ready */
	}
}

/* Everything in flight finished and answered (internal unlinks included). */
static int settle_all(struct disk *d)
{
	for (;;) {
		int rc = kvr_l2_store_flush(d->store);
		if (rc) {
			kvr_err("l2 flush: %s", strerror(-rc));
			return rc;
		}
		rc = pump(d, 0);
		if (rc < 0)
			return rc;
		if (!d->n_parked)
			return 0;
		verify_parked(d); /* a checksum that failed queues the file's unlink: settle it too */
	}
}

/* Queue through the store (put or get). -EAGAIN only while something the store waits for
 * is in flight (the request then waits for a completion); a store that says -EAGAIN with
 * nothing in flight cannot make room by waiting: that answer goes to the requester. */
static int submit(struct disk *d, bool put, kvr_key key, uint32_t lane, uint32_t slot, void *buf, uint32_t r)
{
	/* the slot's block size goes into a written file's header, and a read file's must say
	 * it (an instance of several block sizes; of one, the store's identity says it) */
	uint32_t bt = d->slots->block_tokens ? 0 : kvr_slot_at(d->slots, slot)->block_tokens;
	int rc = put ? kvr_l2_store_put_as(d->store, key, lane, bt, buf, r)
		     : kvr_l2_store_get_as(d->store, key, lane, bt, buf, r);
	if (rc == -EAGAIN && !kvr_l2_store_pending(d->store))
		return -EBUSY;
	return rc;
}

/* The I/O pins of slots routed to this disk (kvr_key_disk) belong to
 * this disk actor alone: we hold none yet, so any there is a predecessor's. It is dead and
 * reaped (kvringd starts us only then), and a process's io_uring requests are finished or
 * cancelled before it exits, so nothing it started can still land in those slots: release
 * them. A DRAINING slot so released is freed by the lookup actor's next reap. */
static void drop_stale_pins(struct disk *d, unsigned idx, unsigned n_dirs)
{
	uint32_t dropped = 0, slots = 0;
	for (uint32_t s = 0; s < d->slots->n_slots; s++) {
		const struct kvr_slot *sl = kvr_slot_at(d->slots, s);
		if (!kvr_slot_pins_of(d->slots, s, KVR_PIN_IO) || kvr_key_disk(sl->key, n_dirs) != idx)
			continue;
		unsigned n = kvr_slot_drop_pins(d->slots, s, KVR_PIN_IO);
		dropped += n;
		slots += n != 0;
	}
	if (dropped)
		kvr_warn("released %u I/O pins on %u slots held by the previous disk.%u (its I/O ended with it)", dropped,
			 slots, idx);
}

/* ---- the I/O gate (a test hook) -------------------------------------------------------------
 * KVRING_TEST_READ_GATE=<dir> (inherited from kvringd's environment) holds every L2 read
 * after its slot was checked and claimed and before its I/O is submitted, so a test can make
 * a read complete as late as it likes (a worker dies meanwhile, another one stores): the
 * actor appends "slot epoch key_lo key_hi lane" to <dir>/held.log, then blocks reading one
 * byte from the FIFO <dir>/gate (the test mkfifo()s it and writes a byte per read to release).
 * When the FIFO <dir>/wgate exists too, every L2 write waits there the same way (logged to
 * <dir>/wheld.log): a write the actor has taken off its ring and not finished.
 * Unset: nothing of this runs. */
static void io_gate(const struct kvr_msg_l2 *b, bool write)
{
	static const char *dir;
	static bool looked;
	if (!looked) {
		dir = getenv("KVRING_TEST_READ_GATE");
		looked = true;
		if (dir)
			kvr_warn("KVRING_TEST_READ_GATE=%s: every L2 read waits for the test's gate", dir);
	}
	if (!dir)
		return;
	char path[512];
	snprintf(path, sizeof(path), "%s/%s", dir, write ? "wgate" : "gate");
	if (write && access(path, F_OK) != 0)
		return;
	char log[512];
	snprintf(log, sizeof(log), "%s/%s", dir, write ? "wheld.log" : "held.log");
	int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	if (fd >= 0) {
		dprintf(fd, "%u %u %016llx %016llx %u\n", b->slot, b->epoch, (unsigned long long)b->key_lo,
			(unsigned long long)b->key_hi, (unsigned)b->lane);
		(void)close(fd);
	}
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		char c;
		while (read(fd, &c, 1) < 0 && errno == EINTR)
			;
		(void)close(fd);
	}
}

/* ---- requests ---------------------------------------------------------------------------- */

/* Start the I/O of an L2_WRITE (from a COMMITTED slot) or L2_READ (into the WRITING slot
 * the lookup actor allocated): the slot must still hold the block the request names, in
 * that state and epoch (-ESTALE: another block is there now). 0 when submitted (answered
 * on completion), else what submit() or the checks said; no request slot is kept then. */
static int start_io(struct disk *d, uint64_t req_id, const struct kvr_msg_l2 *b, unsigned slot_state, unsigned type)
{
	kvr_key key = {b->key_lo, b->key_hi};
	/* the I/O pin keeps the slot from being freed and reused until the I/O completed
	 * (on_done drops it); taken before the key check, so the key cannot change under it */
	int rc = kvr_slot_pin_io(d->slots, b->slot, b->epoch, slot_state);
	if (rc)
		return rc == -EOVERFLOW ? -EBUSY : -ESTALE;
	if (!slot_is(d, b->slot, key, b->lane)) {
		(void)kvr_slot_unpin(d->slots, b->slot, KVR_PIN_IO);
		return -ESTALE;
	}
	uint32_t r = req_get(d);
	if (r == DISK_REQ_NONE) { /* every request slot in use: wait for a completion */
		(void)kvr_slot_unpin(d->slots, b->slot, KVR_PIN_IO);
		return -EAGAIN;
	}
	d->reqs[r] = (struct disk_req){.req_id = req_id, .key = key, .slot = b->slot, .epoch = b->epoch,
				       .lane = b->lane, .type = type, .next_free = DISK_REQ_NONE};
	void *data = kvr_slot_data(d->slots, d->a->arena_seg.base, b->slot);
	io_gate(b, type == KVR_MSG_L2_WRITE);
	rc = submit(d, type == KVR_MSG_L2_WRITE, key, b->lane, b->slot, data, r);
	if (rc) {
		req_put(d, r);
		(void)kvr_slot_unpin(d->slots, b->slot, KVR_PIN_IO);
	}
	return rc;
}


/* do_write / do_read: 0 when started or answered, -EAGAIN when the request must wait for room. */
static int do_write(struct disk *d, uint64_t req_id, const struct kvr_msg_l2 *b)
{
	kvr_key key = {b->key_lo, b->key_hi};
	if (d->read_only) {
		/* never reaches the store or io_uring */
		if (!d->refused++)
			kvr_warn("l2 %s: L2_WRITE refused: l2.read_only (further refusals are only counted)", d->root);
		kvr_actor_count(d->a, KVR_STAT_DK_WRITES_REFUSED, 1);
		send_l2(d, KVR_MSG_L2_WRITE_DONE, req_id, key, b->lane, b->slot, b->epoch, 0, -EROFS);
		return 0;
	}
	if (b->slot >= d->slots->n_slots) {
		send_l2(d, KVR_MSG_L2_WRITE_DONE, req_id, key, b->lane, b->slot, b->epoch, 0, -EINVAL);
		return 0;
	}
	/* The same lane is being written (a duplicate: a dead predecessor's writes are sent
	 * again while the old ones still sit in our ring). The duplicate waits for that write's
	 * completion, which retries it: then PRESENT if the write landed, else written anew.
	 * Answered at once it would say "on disk" before the file is, and the lookup actor
	 * would let the slot go on that word. */
	if (kvr_l2_store_writing(d->store, key, b->lane))
		return -EAGAIN;
	int rc = start_io(d, req_id, b, KVR_SLOT_COMMITTED, KVR_MSG_L2_WRITE);
	if (rc == 0 || rc == -EAGAIN || rc == KVR_L2_INFLIGHT)
		return rc == 0 ? 0 : -EAGAIN; /* answered on completion (on_done unpins), or waits */
	bool present = rc == KVR_L2_PRESENT;
	if (!present && rc != -ESTALE)
		write_failed(d, key, b->lane, rc);
	send_l2(d, KVR_MSG_L2_WRITE_DONE, req_id, key, b->lane, b->slot, b->epoch, present ? KVR_L2F_PRESENT : 0,
		present ? 0 : rc);
	return 0;
}

static int do_read(struct disk *d, uint64_t req_id, const struct kvr_msg_l2 *b)
{
	kvr_key key = {b->key_lo, b->key_hi};
	/* the lookup actor allocated the slot for this block (WRITING) and owns it */
	int rc = b->slot >= d->slots->n_slots ? -EINVAL : start_io(d, req_id, b, KVR_SLOT_WRITING, KVR_MSG_L2_READ);
	if (rc == -EAGAIN)
		return rc;
	if (rc)
		send_l2(d, KVR_MSG_L2_READ_DONE, req_id, key, b->lane, b->slot, b->epoch, 0, rc);
	return 0;
}

static void do_sync(struct disk *d, uint64_t req_id)
{
	struct kvr_l2_store_stats st;
	kvr_l2_store_stats(d->store, &st);
	unsigned n = 0;
	kvr_key *keys = NULL;
	uint32_t *lanes = NULL;
	if (st.files) {
		keys = malloc(st.files * sizeof(*keys));
		lanes = malloc(st.files * sizeof(*lanes));
		if (!keys || !lanes)
			kvr_err("sync: out of memory listing %llu files: listing none", (unsigned long long)st.files);
		else
			n = kvr_l2_store_lru(d->store, keys, lanes, (unsigned)st.files);
	}
	uint64_t before = d->out_q.dropped;
	for (unsigned i = 0; i < n && d->out_q.dropped == before; i++)
		send_l2(d, KVR_MSG_L2_HAVE, req_id, keys[i], (uint16_t)lanes[i], 0, 0, 0, 0);
	send_l2(d, KVR_MSG_L2_HAVE, req_id, (kvr_key){0, 0}, 0xffff, 0, 0, KVR_L2F_LAST, 0);
	kvr_info("sync: %u files listed%s", n, d->out_q.dropped != before ? " (cut short: no room for the list)" : "");
	free(keys);
	free(lanes);
}

/* ---- stage ------------------------------------------------------------------------------- */

/* One decoded request: 0 when started or answered, -EAGAIN when it must wait for room. */
static int handle(struct disk *d, const struct kvr_msg *m, const struct kvr_msg_l2 *b)
{
	switch (m->hdr.type) {
	case KVR_MSG_L2_WRITE:
		return do_write(d, m->hdr.req_id, b);
	case KVR_MSG_L2_READ:
		return do_read(d, m->hdr.req_id, b);
	case KVR_MSG_L2_TOUCH: /* no I/O, no answer: a lane gone meanwhile is nothing to touch */
		if (kvr_l2_store_touch(d->store, (kvr_key){b->key_lo, b->key_hi}, b->lane))
			kvr_actor_count(d->a, KVR_STAT_DK_TOUCHED, 1);
		return 0;
	default: /* KVR_MSG_L2_SYNC */
		do_sync(d, m->hdr.req_id);
		return 0;
	}
}

/* kvr_backlog's start: a request decoded when it arrived (on_msg checked it). */
static int start(void *ctx, const struct kvr_msg *m)
{
	struct kvr_msg_l2 b;
	(void)kvr_msg_decode_l2(m, 0, &b);
	return handle(ctx, m, &b);
}

/* What is accepted and not answered, for kvringd's drain. */
static void account(struct disk *d)
{
	kvr_actor_set_held(d->a, d->inflight + d->wait.n + d->n_parked);
}

/* Hand the prepared I/O to the kernel, answer what completed, start what waited; only
 * when nothing more can be started are the reads that completed meanwhile checked (their
 * payload checksums) and answered, so the disk reads the next batch while we hash. */
static void progress(struct disk *d)
{
	for (;;) {
		int n = pump(d, 0);
		unsigned before = d->wait.n;
		if (d->wait.n)
			kvr_backlog_retry(&d->wait, start, d);
		if (n > 0 || d->wait.n != before)
			continue;
		if (!d->n_parked)
			break;
		verify_parked(d); /* then once more: a failed file's unlink, what completed meanwhile */
	}
	publish(d);
	account(d);
}

static int disk_on_msg(struct kvr_actor *a, struct kvr_ring *ring, const struct kvr_msg *m)
{
	struct disk *d = a->data;
	struct kvr_msg_l2 b;
	if (ring != d->in || kvr_msg_decode_l2(m, 0, &b))
		return -EBADMSG;
	if (m->hdr.type != KVR_MSG_L2_WRITE && m->hdr.type != KVR_MSG_L2_READ && m->hdr.type != KVR_MSG_L2_SYNC &&
	    m->hdr.type != KVR_MSG_L2_TOUCH)
		return -EBADMSG; /* replies and notices only flow the other way */
	/* behind older waiting requests, or no room now: it waits (arrival order is kept) */
	if (kvr_backlog_offer(&d->wait, m, start, d)) { /* cannot happen: the input is held well before */
		kvr_err("%s dropped: %u requests already wait for room", kvr_msg_type_name(m->hdr.type), d->wait.n);
		return -EBADMSG;
	}
	account(d);
	return 0;
}

/* After the pass's messages: submit their I/O together (and take what completed). */
static int disk_on_pass(struct kvr_actor *a, uint64_t now_ns)
{
	progress(a->data);
	return flush_out(a->data, now_ns);
}

/* The store's eventfd: completions arrived. */
static void disk_on_event(struct kvr_actor *a, int fd, uint32_t revents, void *arg)
{
	(void)a;
	(void)fd;
	(void)revents;
	progress(arg);
}

/* The read-only adoption line: what is served, and what was skipped but left in place, by reason. */
static void log_read_only(struct disk *d, const char *dir, const struct kvr_l2_store_config *sc,
			  const struct kvr_l2_adopt_stats *ad, const struct kvr_l2_store_stats *st)
{
	if (ad->no_dir) {
		if (sc->ident.block_tokens)
			kvr_warn("l2 %s: read-only and %s does not exist: nothing to serve (no block of this model, "
				 "geometry and block size of %u tokens is stored here)", dir, kvr_l2_store_dir(d->store),
				 sc->ident.block_tokens);
		else
			kvr_warn("l2 %s: read-only and %s does not exist: nothing to serve (no block of this slot "
				 "format is stored here)", dir, kvr_l2_store_dir(d->store));
		return;
	}
	char why[512] = "";
	size_t n = 0;
	for (unsigned r = 1; r < KVR_L2_R_MAX && n < sizeof(why); r++) {
		if (!ad->rejected[r] || r == KVR_L2_R_FOREIGN || r == KVR_L2_R_NOTREG)
			continue;
		int w = snprintf(why + n, sizeof(why) - n, "%s%s %llu", n ? ", " : "", kvr_l2_reason_name(r),
				 (unsigned long long)ad->rejected[r]);
		if (w < 0)
			break;
		n += (size_t)w;
	}
	kvr_actor_count(d->a, KVR_STAT_DK_LEFT_IN_PLACE, ad->left_in_place);
	kvr_info("l2 %s: read-only: adopted %llu files (%llu MiB) of %llu entries; %llu skipped and left in place "
		 "(%s), %llu foreign left alone; nothing on disk is created, written, renamed or removed; %.1f ms, "
		 "%s I/O, capacity %llu MiB, queue depth %u",
		 kvr_l2_store_dir(d->store), (unsigned long long)ad->adopted,
		 (unsigned long long)(ad->adopted_bytes >> 20), (unsigned long long)ad->entries, (unsigned long long)ad->left_in_place, n ? why : "none",
		 (unsigned long long)ad->left_alone, (double)ad->elapsed_ns / 1e6, st->direct ? "direct" : "buffered",
		 (unsigned long long)(sc->capacity_bytes >> 20), sc->queue_depth);
}

/* Namespace directories under root other than ours (32 hex characters): another model, slot
 * format or kvring version wrote them, and this instance neither adopts, counts nor removes
 * them. Logged once at start so an operator sees disk space no instance may be using. */
static void log_other_namespaces(const char *root, const char *ours)
{
	DIR *dp = opendir(root);
	if (!dp)
		return;
	unsigned n = 0;
	char some[3][KVR_KEY_FMT_LEN];
	struct dirent *e;
	while ((e = readdir(dp))) {
		size_t len = strlen(e->d_name);
		if (len != KVR_KEY_FMT_LEN - 1 || strspn(e->d_name, "0123456789abcdef") != len || !strcmp(e->d_name, ours))
			continue;
		struct stat st;
		if (fstatat(dirfd(dp), e->d_name, &st, AT_SYMLINK_NOFOLLOW) || !S_ISDIR(st.st_mode))
			continue;
		if (n < 3)
			snprintf(some[n], sizeof(some[n]), "%s", e->d_name);
		n++;
	}
	closedir(dp);
	if (n)
		kvr_info("l2 %s: %u other namespace director%s beside this instance's (%s%s%s%s%s%s), left alone and not "
			 "counted in its capacity: another model, slot format or kvring version wrote them; remove those "
			 "no instance uses", root, n, n == 1 ? "y" : "ies", some[0], n > 1 ? ", " : "", n > 1 ? some[1] : "",
			 n > 2 ? ", " : "", n > 2 ? some[2] : "", n > 3 ? ", ..." : "");
}

static int open_store(struct disk *d, const char *dir, struct kvr_l2_store_config *sc)
{
	struct kvr_l2_adopt_stats ad;
	int rc = kvr_l2_store_open(sc, &ad, &d->store);
	if ((rc == -ENOMEM || rc == -EPERM) && sc->arena) {
		kvr_warn("l2 %s: cannot register the arena for fixed buffers (%s, RLIMIT_MEMLOCK?): plain I/O",
			 dir, strerror(-rc));
		sc->arena = NULL;
		sc->arena_bytes = 0;
		rc = kvr_l2_store_open(sc, &ad, &d->store);
	}
	if (rc) {
		kvr_err("l2 %s: open%s: %s", dir,
			sc->read_only ? (rc == -EBUSY ? " (read-only): a writable instance holds it"
						      : " (read-only: the directory is not created)") : "",
			strerror(-rc));
		return rc;
	}
	struct kvr_l2_store_stats st;
	kvr_l2_store_stats(d->store, &st);
	char ours[KVR_KEY_FMT_LEN];
	log_other_namespaces(dir, kvr_l2_ns_dir_fmt(sc->ident.ns, ours));
	kvr_actor_count(d->a, KVR_STAT_DK_ADOPTED, ad.adopted);
	for (unsigned r = 1; r < KVR_L2_R_MAX; r++)
		if (ad.rejected[r])
			kvr_actor_count(d->a, kvr_stat_dk_rejected(r), ad.rejected[r]);
	publish(d);
	if (sc->read_only) {
		log_read_only(d, dir, sc, &ad, &st);
		return 0;
	}
	kvr_info("l2 %s: adopted %llu files (%llu MiB) of %llu entries, deleted %llu, left %llu alone, "
		 "%.1f ms; %s I/O, capacity %llu MiB, queue depth %u, durability %s",
		 kvr_l2_store_dir(d->store), (unsigned long long)ad.adopted, (unsigned long long)(ad.adopted_bytes >> 20),
		 (unsigned long long)ad.entries, (unsigned long long)ad.deleted, (unsigned long long)ad.left_alone,
		 (double)ad.elapsed_ns / 1e6, st.direct ? "direct" : "buffered",
		 (unsigned long long)(sc->capacity_bytes >> 20), sc->queue_depth,
		 kvr_l2_durability_name(sc->durability));
	if (!st.direct)
		kvr_warn("l2 %s: the filesystem refuses O_DIRECT: buffered I/O (page cache)", dir);
	return 0;
}

/* The store's configuration for directory dir: the slot table's identity, this actor's share
 * of the byte cap, the arena it reads and writes. */
static void store_config(const struct kvr_actor *a, const char *dir, struct kvr_l2_store_config *sc)
{
	const struct kvr_config *cfg = &a->cfg;
	*sc = (struct kvr_l2_store_config){
		.root = dir,
		.ident = {.ns = a->slots->ns, .fingerprint = a->slots->ns, .block_tokens = a->slots->block_tokens,
			  .lane_bytes = a->slots->slot_bytes},
		.lanes = kvr_slots_lanes_max(a->slots),
		.capacity_bytes = cfg->l2.capacity_bytes / cfg->l2.n_dirs,
		.queue_depth = cfg->l2.queue_depth,
		.io_mode = KVR_L2_IO_AUTO,
		.arena = a->arena_seg.base,
		.arena_bytes = a->arena_seg.size,
		.arena_data_off = a->slots->arena_data_off,
		.slot_bytes = a->slots->slot_bytes,
		.report_gone = true,
		.read_only = cfg->l2.read_only,
		.defer_verify = true, /* progress: checksums while the next reads are on the disk */
		/* L1 in huge pages: one vectored transfer per file (uring.c, "Joined transfers") */
		.join_header = a->ctl->arena_huge != 0, /* set by kvringd before any actor starts */
	};
	_Static_assert((int)KVR_CFG_DUR_NONE == (int)KVR_L2_DUR_NONE && (int)KVR_CFG_DUR_BLOCK == (int)KVR_L2_DUR_BLOCK &&
			       (int)KVR_CFG_DUR_BATCH == (int)KVR_L2_DUR_BATCH, "l2.durability as parsed is the engine's");
	sc->durability = (enum kvr_l2_durability)cfg->l2.durability_id;
}

/* The actor's rings (disk.req/rep.idx), backlog, outbox and a free list of qd requests. */
static int disk_queues(struct disk *d, unsigned idx, uint32_t qd)
{
	struct kvr_actor *a = d->a;
	d->in = kvr_actor_ring_w(a, KVR_RING_DISK_REQ, idx);
	d->out = kvr_actor_ring_w(a, KVR_RING_DISK_REP, idx);
	if (!d->in || !d->out) {
		kvr_err("rings disk.req.%u / disk.rep.%u missing from the ring directory", idx, idx);
		return -ENOENT;
	}
	kvr_backlog_init(&d->wait, a, d->in);
	kvr_outbox_init(&d->out_q, d->out);
	d->qd = qd ? qd : 1;
	d->reqs = calloc(d->qd, sizeof(*d->reqs));
	d->parked = calloc(2 * (size_t)d->qd, sizeof(*d->parked));
	if (!d->reqs || !d->parked)
		return -ENOMEM;
	for (uint32_t i = 0; i < d->qd; i++)
		d->reqs[i].next_free = i + 1 < d->qd ? i + 1 : DISK_REQ_NONE;
	d->free_req = 0;
	return 0;
}

/* The store over dir opened (the directory made first unless read-only), the pins of a dead
 * predecessor dropped, and its completions watched by the actor's loop. */
static int disk_start_store(struct disk *d, const char *dir, struct kvr_l2_store_config *sc, unsigned idx)
{
	if (!d->read_only && mkdir(dir, 0700) == 0)
		kvr_info("l2 %s: created", dir);
	int rc = open_store(d, dir, sc);
	if (rc)
		return rc;
	drop_stale_pins(d, idx, d->a->cfg.l2.n_dirs);
	rc = kvr_l2_store_event_fd(d->store);
	if (rc >= 0)
		rc = d->watch = kvr_actor_watch_fd(d->a, rc, POLLIN, disk_on_event, d);
	if (rc < 0) {
		kvr_err("l2 %s: cannot watch the I/O completions: %s", dir, strerror(-rc));
		kvr_l2_store_close(d->store);
		return rc;
	}
	return 0;
}

static int disk_init(struct kvr_actor *a)
{
	const struct kvr_config *cfg = &a->cfg;
	unsigned idx = a->ent->index;
	if (!a->slots || !a->arena_seg.base) {
		kvr_err("no slot table or arena");
		return -EINVAL;
	}
	/* its I/O reads and writes slots (O_DIRECT pins their pages): populated in the loop */
	(void)kvr_actor_populate_add(a, a->arena_seg.base, a->arena_seg.size, true, "arena");
	if (idx >= cfg->l2.n_dirs || idx >= KVR_L2_MAX_DIRS) {
		kvr_err("disk actor %u but l2.dirs has %u entries", idx, cfg->l2.n_dirs);
		return -EINVAL;
	}
	const char *dir = cfg->l2.dirs[idx];
	struct kvr_l2_store_config sc;
	store_config(a, dir, &sc);
	struct disk *d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->a = a;
	d->slots = a->slots;
	d->read_only = cfg->l2.read_only;
	d->root = dir;
	d->send_timeout_ns = kvr_ms_to_ns(cfg->timeouts.reply_ms);
	int rc = disk_queues(d, idx, sc.queue_depth);
	if (!rc)
		rc = disk_start_store(d, dir, &sc, idx);
	if (rc) {
		kvr_outbox_free(&d->out_q);
		free(d->reqs);
		free(d->parked);
		free(d);
		return rc;
	}
	kvr_actor_set_data(a, d);
	return 0;
}

static void disk_fini(struct kvr_actor *a)
{
	struct disk *d = a->data;
	if (!d)
		return;
	d->send_timeout_ns = DISK_FINI_TIMEOUT_NS;
	(void)settle_all(d);
	kvr_backlog_retry(&d->wait, start, d); /* what still waited for room: started and settled too */
	(void)settle_all(d);
	(void)kvr_outbox_drain(&d->out_q, DISK_FINI_TIMEOUT_NS); /* the answers still queued: a while to be taken */
	publish(d);
	if (d->inflight || d->wait.n)
		kvr_warn("%u requests unanswered at stop", d->inflight + d->wait.n);
	if (d->out_q.dropped)
		kvr_warn("%llu messages to the lookup actor dropped", (unsigned long long)d->out_q.dropped);
	kvr_outbox_free(&d->out_q);
	if (d->refused)
		kvr_warn("%llu L2 writes refused (l2.read_only)", (unsigned long long)d->refused);
	kvr_l2_store_close(d->store);
	free(d->reqs);
	free(d->parked);
	free(d);
	kvr_actor_set_data(a, NULL);
}

static const struct kvr_stage disk_stage = {
	.name = "disk",
	.kind = KVR_ACTOR_DISK,
	.init = disk_init,
	.on_msg = disk_on_msg,
	.on_pass = disk_on_pass,
	.fini = disk_fini,
};

int main(int argc, char **argv)
{
	return kvr_actor_main(argc, argv, &disk_stage);
}
