/* l2tier (the lookup actor's L2 and shared tiers) stepped message by message over an in-memory control segment, with an injected clock. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <kvring/msg.h>

#include "../runtime/step_test.h"

#include "kvr_actor.h"
#include "kvr_ctl.h"
#include "kvr_index.h"
#include "kvr_keys.h"
#include "kvr_slots.h"
#include "l2tier.h"

/*
 * No processes: the test builds what the lookup actor's l2tier sees — a control segment
 * with the lookup, disk and remote actors' entries and their rings, a slot table, an index,
 * a struct kvr_actor — and plays the disk actor and the remote actor itself. Each step is
 * one call (l2t_extend, l2t_on_msg with one answer, l2t_tick with the clock the test sets in
 * act.now_ns); after each the test reads what went out on the request rings and what the
 * slot table holds. Nothing waits for time to pass.
 */

#define MW 1          /* worker slots */
#define N_SLOTS 64
#define LANE_BYTES 4096
#define DISK_ACTOR (1 + 2 * MW)          /* actor index of disk.0 */
#define REMOTE_ACTOR (1 + 2 * MW + 1)    /* after disk.0 (no gather actor with one worker) */
#define NO_L2_REMOTE_ACTOR (1 + 2 * MW)  /* the remote actor without L2 */
#define MS 1000000ull

static struct kvr_segment ctl_seg = {.fd = -1}, slots_seg = {.fd = -1};
static struct kvr_actor act;
static struct kvr_actor_stats stats;
static struct kvr_index *idx;
static struct l2tier *t;
static struct kvr_ring *dreq, *drep, *rreq, *rrep;
static struct kvr_slot_table *st;
static uint32_t start_gen = 1; /* the disk and remote actors' generation when l2t_open looks */

static kvr_key key_of(unsigned p, unsigned i)
{
	uint64_t in[2] = {p, i};
	return kvr_key_hash(in, sizeof(in));
}

static struct kvr_ring *ring_named(const char *name)
{
	int i = kvr_ctl_find_ring(act.ctl, name);
	cr_assert_geq(i, 0, "ring %s", name);
	return kvr_ctl_ring(&act.rings, (unsigned)i);
}

static void add_io(const char *name, bool input)
{
	int i = kvr_ctl_find_ring(act.ctl, name);
	cr_assert_geq(i, 0);
	struct kvr_actor_ring *r = input ? &act.inputs[act.n_inputs++] : &act.outputs[act.n_outputs++];
	*r = (struct kvr_actor_ring){.ring = kvr_ctl_ring(&act.rings, (unsigned)i), .index = i};
}

static void send_have(kvr_key k, unsigned lane, bool last)
{
	struct kvr_msg_l2 b = {.key_lo = k.lo, .key_hi = k.hi, .lane = (uint16_t)lane, .flags = last ? KVR_L2F_LAST : 0};
	struct kvr_msg m;
	kvr_msg_build(&m, KVR_MSG_L2_HAVE, 0, 0, 0, &b, sizeof(b));
	cr_assert_eq(kvr_ring_try_enqueue(drep, &m), 0);
}

/* The instance: L2 (one dir) and/or the shared tier; `on_disk` block keys (prompt 0, blocks
 * 0..on_disk-1, lane 0) listed by the disk actor's sync answer, taken in by l2t_open. */
static void build(bool l2, bool remote, unsigned on_disk)
{
	unsigned n_actors = 1 + 2 * MW + (l2 ? 1 : 0) + (remote ? 1 : 0);
	unsigned disk = DISK_ACTOR, rm = l2 ? REMOTE_ACTOR : NO_L2_REMOTE_ACTOR;
	struct kvr_ctl_ring_spec specs[8];
	unsigned n = 0;
	memset(specs, 0, sizeof(specs));
	if (l2) {
		specs[n++] = (struct kvr_ctl_ring_spec){.name = "disk.req.0", .capacity = 256, .producer = 0, .consumer = (int16_t)disk};
		specs[n++] = (struct kvr_ctl_ring_spec){.name = "disk.rep.0", .capacity = 256, .producer = (int16_t)disk, .consumer = 0};
	}
	if (remote) {
		specs[n++] = (struct kvr_ctl_ring_spec){.name = "remote.req", .capacity = 64, .producer = 0, .consumer = (int16_t)rm};
		specs[n++] = (struct kvr_ctl_ring_spec){.name = "remote.rep", .capacity = 64, .producer = (int16_t)rm, .consumer = 0};
	}
	size_t sz = kvr_ctl_memsize(n_actors, MW, specs, n, 64);
	char name[64];
	snprintf(name, sizeof(name), "kvr-test-l2tier-%d", (int)getpid());
	cr_assert_eq(kvr_segment_create(name, KVR_SEG_CTL, sz, 1, 0, &ctl_seg), 0);
	cr_assert_eq(kvr_ctl_init(&ctl_seg, n_actors, MW, specs, n, "{}"), 0);
	memset(&act, 0, sizeof(act));
	cr_assert_eq(kvr_ctl_attach(&ctl_seg, &act.ctl, &act.rings), 0);
	act.stats = &stats;
	act.ent = kvr_ctl_actor(act.ctl, 0);
	act.ent->kind = KVR_ACTOR_LOOKUP;
	if (l2) {
		kvr_ctl_actor(act.ctl, disk)->kind = KVR_ACTOR_DISK;
		atomic_store(&kvr_ctl_actor(act.ctl, disk)->generation, start_gen);
	}
	if (remote) {
		kvr_ctl_actor(act.ctl, rm)->kind = KVR_ACTOR_REMOTE;
		atomic_store(&kvr_ctl_actor(act.ctl, rm)->generation, start_gen);
	}
	atomic_store(&act.ctl->n_actors, n_actors);
	kvr_config_defaults(&act.cfg);
	if (l2) {
		act.cfg.l2.n_dirs = 1;
		snprintf(act.cfg.l2.dirs[0], sizeof(act.cfg.l2.dirs[0]), "/nonexistent/l2");
		act.cfg.l2.capacity_bytes = 1 << 30;
		add_io("disk.rep.0", true);
		add_io("disk.req.0", false);
		dreq = ring_named("disk.req.0");
		drep = ring_named("disk.rep.0");
	}
	if (remote) {
		act.cfg.remote.n_cluster = 1;
		snprintf(act.cfg.remote.cluster[0], sizeof(act.cfg.remote.cluster[0]), "127.0.0.1:1");
		add_io("remote.rep", true);
		add_io("remote.req", false);
		rreq = ring_named("remote.req");
		rrep = ring_named("remote.rep");
	}
	snprintf(name, sizeof(name), "kvr-test-l2tier-slots-%d", (int)getpid());
	cr_assert_eq(kvr_segment_create(name, KVR_SEG_SLOTS, kvr_slots_memsize(N_SLOTS), 1, 0, &slots_seg), 0);
	struct kvr_slots_config sc = {.n_slots = N_SLOTS, .lane_bytes = LANE_BYTES, .ns = {7, 7}, .block_tokens = 16,
				      .tp_size = 1, .quorum = 1};
	cr_assert_eq(kvr_slots_init(slots_seg.base, slots_seg.size, &sc, &st), 0);
	act.slots = st;
	cr_assert_eq(kvr_index_new(st, "lru", &idx), 0);
	act.now_ns = 1000 * 1000 * MS; /* the injected clock: 1000 s */
	for (unsigned i = 0; l2 && i < on_disk; i++)
		send_have(key_of(0, i), 0, false);
	if (l2)
		send_have((kvr_key){0, 0}, 0xffff, true);
	cr_assert_eq(l2t_open(&act, idx, &t), 0);
	cr_assert_not_null(t);
	if (l2) {
		struct kvr_msg m;
		cr_assert_eq(kvr_ring_try_dequeue(dreq, &m), 0);
		cr_assert_eq(m.hdr.type, KVR_MSG_L2_SYNC, "l2t_open asks the disk actor for its list");
		for (unsigned i = 0; i < on_disk; i++)
			cr_assert(l2t_has(t, key_of(0, i), 0));
	}
}

static void teardown(void)
{
	l2t_close(t);
	t = NULL;
	kvr_index_free(idx);
	idx = NULL;
	kvr_segment_close(&slots_seg);
	kvr_segment_close(&ctl_seg);
	dreq = drep = rreq = rrep = NULL;
	memset(&stats, 0, sizeof(stats));
}

TestSuite(l2tier, .fini = teardown, .timeout = 30);

static uint64_t stat(unsigned s)
{
	return atomic_load(&stats.c[s]);
}

/* The next request on ring r: its type and decoded body. */
static struct kvr_msg take(struct kvr_ring *r, unsigned type, struct kvr_msg_l2 *ret)
{
	struct kvr_msg m;
	cr_assert_eq(kvr_ring_try_dequeue(r, &m), 0, "nothing was sent");
	cr_assert_eq(m.hdr.type, type, "sent a %s", kvr_msg_type_name(m.hdr.type));
	cr_assert_eq(kvr_msg_decode_l2(&m, 0, ret), 0);
	return m;
}

/* Answer read `m` with status; returns what l2t_on_msg returned. */
static int answer_read(struct kvr_ring *rep, const struct kvr_msg *m, const struct kvr_msg_l2 *b, int status,
		       uint16_t flags, struct l2t_done *done)
{
	struct kvr_msg_l2 a = *b;
	a.status = status;
	a.flags = flags;
	struct kvr_msg ans;
	kvr_msg_build(&ans, KVR_MSG_L2_READ_DONE, status ? KVR_MSGF_ERROR : 0, m->hdr.req_id, 0, &a, sizeof(a));
	return l2t_on_msg(t, rep, &ans, done);
}

/* L1 holds prompt p's blocks [0, n) on lane 0 (allocated and committed through the index). */
static void l1_holds(unsigned p, unsigned n, struct kvr_index_ref *refs)
{
	kvr_key keys[32];
	for (unsigned i = 0; i < n; i++)
		keys[i] = key_of(p, i);
	struct kvr_index_alloc_stats as = {0};
	cr_assert_eq(kvr_index_alloc(idx, keys, n, 0, 0, refs, &as), 0);
	for (unsigned i = 0; i < n; i++)
		cr_assert_geq(kvr_index_commit(idx, 0, refs[i].slot, refs[i].epoch), 0);
}

/* The keys of the L2_TOUCHes waiting on disk.req, in order (at most n; fails on another type). */
static unsigned touches(kvr_key *ret, unsigned n)
{
	unsigned k = 0;
	struct kvr_msg m;
	while (kvr_ring_try_dequeue(dreq, &m) == 0) {
		struct kvr_msg_l2 b;
		cr_assert_eq(m.hdr.type, KVR_MSG_L2_TOUCH, "sent a %s", kvr_msg_type_name(m.hdr.type));
		cr_assert_eq(kvr_msg_decode_l2(&m, 0, &b), 0);
		cr_assert_eq(b.lane, 0);
		cr_assert_lt(k, n, "more touches than lanes used");
		ret[k++] = (kvr_key){b.key_lo, b.key_hi};
	}
	return k;
}

/* A lane on disk that L1 serves is sent as an L2_TOUCH by the tick after each use (its
 * commit, a hit), so L2's LRU does not age the files of what is hot in L1; a lane not on
 * disk is not; a full disk ring ends the look and a later tick goes on from there. */
Test(l2tier, lanes_used_in_l1_are_touched_on_disk_once_per_use)
{
	build(true, false, 2); /* prompt 0 blocks 0 and 1 on disk */
	struct kvr_index_ref refs[3];
	l1_holds(0, 3, refs); /* block 2 is in L1 only */
	struct l2t_done done;
	kvr_key got[4];
	cr_assert_eq(l2t_tick(t, &done), 0);
	cr_assert_eq(touches(got, 4), 2, "the two committed lanes on disk");
	cr_assert(!kvr_key_eq(got[0], got[1]) && (kvr_key_eq(got[0], key_of(0, 0)) || kvr_key_eq(got[0], key_of(0, 1))) &&
		  (kvr_key_eq(got[1], key_of(0, 0)) || kvr_key_eq(got[1], key_of(0, 1))));
	cr_assert_eq(stat(KVR_STAT_LK_L2_TOUCHES), 2);
	cr_assert_eq(l2t_tick(t, &done), 0);
	cr_assert_eq(touches(got, 4), 0, "nothing was used since the last look");

	kvr_key k1 = key_of(0, 1), k2 = key_of(0, 2);
	struct kvr_index_ref r;
	cr_assert_eq(kvr_index_match(idx, &k1, 1, 0, &r), 1);
	cr_assert_eq(kvr_index_match(idx, &k2, 1, 0, &r), 1);
	cr_assert_eq(l2t_tick(t, &done), 0);
	cr_assert_eq(touches(got, 4), 1, "one hit lane on disk (the other hit is in L1 only)");
	cr_assert(kvr_key_eq(got[0], k1));

	/* a full ring: nothing is lost, the look resumes once there is room */
	cr_assert_eq(kvr_index_match(idx, &k1, 1, 0, &r), 1);
	struct kvr_msg fill;
	struct kvr_msg_l2 fb = {.lane = 0};
	kvr_msg_build(&fill, KVR_MSG_L2_TOUCH, 0, 0, 0, &fb, sizeof(fb));
	unsigned n_fill = 0;
	while (kvr_ring_try_enqueue(dreq, &fill) == 0)
		n_fill++;
	cr_assert_eq(l2t_tick(t, &done), 0);
	cr_assert_eq(stat(KVR_STAT_LK_L2_TOUCHES), 3, "the ring was full: not sent");
	for (unsigned i = 0; i < n_fill; i++)
		cr_assert_eq(kvr_ring_try_dequeue(dreq, &fill), 0);
	cr_assert_eq(l2t_tick(t, &done), 0);
	cr_assert_eq(touches(got, 4), 1);
	cr_assert(kvr_key_eq(got[0], k1));
	cr_assert_eq(stat(KVR_STAT_LK_L2_TOUCHES), 4);
}

Test(l2tier, a_promotion_answers_the_verified_prefix_once_every_read_ended)
{
	build(true, false, 4);
	kvr_key keys[6];
	for (unsigned i = 0; i < 6; i++)
		keys[i] = key_of(0, i);
	struct kvr_index_ref refs[6];
	cr_assert_eq(l2t_extend(t, 0, 77, 0, keys, 6, 0, refs, 0), -EINPROGRESS);
	/* the four blocks on disk are read, each into a WRITING slot of the lookup actor's */
	struct kvr_msg m[4];
	struct kvr_msg_l2 b[4];
	for (unsigned i = 0; i < 4; i++) {
		m[i] = take(dreq, KVR_MSG_L2_READ, &b[i]);
		cr_assert_eq(b[i].key_lo, keys[i].lo);
		cr_assert_eq(kvr_slot_state(st, b[i].slot), KVR_SLOT_WRITING);
		cr_assert_eq(kvr_slot_at(st, b[i].slot)->owner, KVR_SLOT_OWNER_LOOKUP);
	}
	struct kvr_msg extra;
	cr_assert_neq(kvr_ring_try_dequeue(dreq, &extra), 0, "blocks 4 and 5 are nowhere: not read");
	/* answers out of order: 3 ok, 0 ok, 2 damaged (the file is gone), 1 ok — only the last ends it */
	struct l2t_done done;
	cr_assert_eq(answer_read(drep, &m[3], &b[3], 0, 0, &done), 0);
	cr_assert_eq(answer_read(drep, &m[0], &b[0], 0, 0, &done), 0);
	cr_assert_eq(answer_read(drep, &m[2], &b[2], -EBADMSG, KVR_L2F_GONE, &done), 0);
	cr_assert(!l2t_has(t, keys[2], 0), "a file the disk says is gone is forgotten");
	cr_assert_eq(kvr_slot_state(st, b[2].slot), KVR_SLOT_FREE, "its slot aborted");
	cr_assert_eq(answer_read(drep, &m[1], &b[1], 0, 0, &done), 2);
	cr_assert_eq(done.worker, 0);
	cr_assert_eq(done.wire, 77);
	cr_assert_eq(done.matched, 2, "blocks 0 and 1: the prefix up to the failed read");
	cr_assert_eq(done.promoted, 2);
	cr_assert_eq(done.refs[0].slot, b[0].slot);
	cr_assert_eq(done.refs[1].slot, b[1].slot);
	for (unsigned i = 0; i < 4; i++)
		if (i != 2)
			cr_assert_eq(kvr_slot_state(st, b[i].slot), KVR_SLOT_COMMITTED, "read %u committed", i);
	cr_assert_eq(kvr_slot_pins(st, b[0].slot), 0, "the reply went: no lookup pin left");
	cr_assert_eq(stat(KVR_STAT_LK_L2_READS), 3);
	cr_assert_eq(stat(KVR_STAT_LK_L2_READ_FAILS), 1);
	/* an answer to a read already answered is dropped */
	cr_assert_eq(answer_read(drep, &m[1], &b[1], 0, 0, &done), 0);
	cr_assert_eq(stat(KVR_STAT_LK_L2_READS), 3);
}

static unsigned fill_ring(struct kvr_ring *r, uint32_t room)
{
	return step_fill_ring(r, room, KVR_MSG_L2_SYNC);
}

static void drain_fillers(struct kvr_ring *r, unsigned n)
{
	step_drain_fillers(r, n, KVR_MSG_L2_SYNC);
}

/*
 * A disk actor restarted while its ring is full: the tick does not wait for room to ask
 * the successor for its list (it held the lookup actor, and every worker's lookup, up to
 * reply_ms in the send, and then gave the request up); the L2_SYNC goes out from a later
 * tick once there is room.
 */
Test(l2tier, the_list_of_a_restarted_disk_actor_is_asked_for_once_its_ring_has_room)
{
	build(true, false, 0);
	unsigned fill = step_fill_ring(dreq, 0, KVR_MSG_PING);
	atomic_fetch_add(&kvr_ctl_actor(act.ctl, DISK_ACTOR)->generation, 1); /* kill -9, restarted */
	struct l2t_done done;
	cr_assert_eq(l2t_tick(t, &done), 0);
	cr_assert_eq(kvr_ring_free(dreq), 0, "no room: nothing sent");
	cr_assert_eq(l2t_tick(t, &done), 0);
	step_drain_fillers(dreq, fill, KVR_MSG_PING);
	struct kvr_msg m;
	cr_assert_neq(kvr_ring_try_dequeue(dreq, &m), 0, "only the fillers were in the ring");
	cr_assert_eq(l2t_tick(t, &done), 0);
	cr_assert_eq(kvr_ring_try_dequeue(dreq, &m), 0, "the tick asked again");
	cr_assert_eq(m.hdr.type, KVR_MSG_L2_SYNC, "sent a %s", kvr_msg_type_name(m.hdr.type));
	cr_assert_eq(l2t_tick(t, &done), 0);
	cr_assert_neq(kvr_ring_try_dequeue(dreq, &m), 0, "once");
}

/*
 * disk.req full (another worker's reads, a slow disk): a promotion's read neither waits in
 * the send (it held the lookup actor, and so every worker's lookup, up to reply_ms) nor
 * ends the prefix: the promotion stalls and goes on when one of its reads ends, or from
 * the tick once the ring has room, until alloc_wait_ms after the lookup began.
 */
Test(l2tier, a_full_disk_ring_stalls_the_promotion_instead_of_blocking)
{
	build(true, false, 6);
	unsigned fill = fill_ring(dreq, 2);
	kvr_key keys[6];
	for (unsigned i = 0; i < 6; i++)
		keys[i] = key_of(0, i);
	struct kvr_index_ref refs[6];
	cr_assert_eq(l2t_extend(t, 0, 78, 0, keys, 6, 0, refs, 0), -EINPROGRESS);
	cr_assert_eq(kvr_ring_free(dreq), 0, "two reads took the room there was");
	cr_assert_eq(stat(KVR_STAT_LK_L2_RING_STALLS), 1);
	cr_assert_eq(stat(KVR_STAT_LK_L2_READ_FAILS), 0, "nothing failed for a full ring");
	drain_fillers(dreq, fill);
	struct kvr_msg m[6];
	struct kvr_msg_l2 b[6];
	for (unsigned i = 0; i < 2; i++) {
		m[i] = take(dreq, KVR_MSG_L2_READ, &b[i]);
		cr_assert_eq(b[i].key_lo, keys[i].lo);
	}
	struct kvr_msg none;
	cr_assert_neq(kvr_ring_try_dequeue(dreq, &none), 0);
	/* read 0 ends: the stall goes on, the other four reads go out */
	struct l2t_done done;
	cr_assert_eq(answer_read(drep, &m[0], &b[0], 0, 0, &done), 0);
	for (unsigned i = 2; i < 6; i++) {
		m[i] = take(dreq, KVR_MSG_L2_READ, &b[i]);
		cr_assert_eq(b[i].key_lo, keys[i].lo, "read %u in order", i);
	}
	for (unsigned i = 1; i < 6; i++)
		cr_assert_eq(answer_read(drep, &m[i], &b[i], 0, 0, &done), i == 5 ? 2 : 0);
	cr_assert_eq(done.matched, 6, "the whole prompt, as if the ring had had room");
	cr_assert_eq(done.promoted, 6);
}

/* The same with no read of its own out: the tick sends it once the ring has room; and a
 * ring that stays full ends the promotion at alloc_wait_ms with what it has. */
Test(l2tier, a_stalled_promotion_goes_on_from_the_tick_and_ends_at_its_deadline)
{
	build(true, false, 2);
	unsigned fill = fill_ring(dreq, 0);
	kvr_key keys[2] = {key_of(0, 0), key_of(0, 1)};
	struct kvr_index_ref refs[2];
	cr_assert_eq(l2t_extend(t, 0, 79, 0, keys, 2, 0, refs, 0), -EINPROGRESS);
	struct l2t_done done;
	cr_assert_eq(l2t_tick(t, &done), 0, "still no room: still stalled");
	drain_fillers(dreq, fill);
	cr_assert_eq(l2t_tick(t, &done), 0);
	struct kvr_msg m[2];
	struct kvr_msg_l2 b[2];
	for (unsigned i = 0; i < 2; i++)
		m[i] = take(dreq, KVR_MSG_L2_READ, &b[i]);
	cr_assert_eq(answer_read(drep, &m[0], &b[0], 0, 0, &done), 0);
	cr_assert_eq(answer_read(drep, &m[1], &b[1], 0, 0, &done), 2);
	cr_assert_eq(done.matched, 2);

}

Test(l2tier, a_promotion_stalled_on_a_ring_that_never_frees_ends_at_alloc_wait)
{
	build(true, false, 2);
	(void)fill_ring(dreq, 0);
	kvr_key keys[2] = {key_of(0, 0), key_of(0, 1)};
	struct kvr_index_ref refs[2];
	cr_assert_eq(l2t_extend(t, 0, 80, 0, keys, 2, 0, refs, 0), -EINPROGRESS);
	struct l2t_done done;
	act.now_ns += kvr_ms_to_ns(act.cfg.timeouts.alloc_wait_ms) - 1;
	cr_assert_eq(l2t_tick(t, &done), 0, "before the deadline: still stalled");
	act.now_ns += 2;
	cr_assert_eq(l2t_tick(t, &done), 1, "at the deadline: answered");
	cr_assert_eq(done.matched, 0, "nothing could be read");
	cr_assert_eq(stat(KVR_STAT_LK_L2_READ_FAILS), 0);
	for (uint32_t s = 0; s < N_SLOTS; s++)
		cr_assert_neq(kvr_slot_state(st, s), KVR_SLOT_WRITING, "slot %u left WRITING", s);
}

/*
 * The lost-answer scan runs on the injected clock: a read unanswered for l2_answer_ms is
 * given up (its slot aborted, the promotion answered); a write sent after the tick's clock
 * was read is not "unanswered" (the wrap that sent every requeued write twice).
 */
Test(l2tier, lost_answers_follow_the_clock)
{
	build(true, false, 1);
	kvr_key k = key_of(0, 0);
	struct kvr_index_ref refs[1];
	cr_assert_eq(l2t_extend(t, 0, 5, 0, &k, 1, 0, refs, 0), -EINPROGRESS);
	struct kvr_msg_l2 b;
	(void)take(dreq, KVR_MSG_L2_READ, &b);
	struct l2t_done done;
	uint64_t answer_ns = act.cfg.timeouts.l2_answer_ms * MS;
	act.now_ns += answer_ns - MS; /* not yet */
	cr_assert_eq(l2t_tick(t, &done), 0);
	cr_assert_eq(kvr_slot_state(st, b.slot), KVR_SLOT_WRITING);
	act.now_ns += 2 * MS + 1000 * MS; /* past it, and past the once-a-second scan */
	cr_assert_eq(l2t_tick(t, &done), 1, "the read is given up");
	cr_assert_eq(done.matched, 0);
	cr_assert_eq(kvr_slot_state(st, b.slot), KVR_SLOT_FREE);
	cr_assert_eq(stat(KVR_STAT_LK_L2_ANSWERS_LOST), 1);

	/* a write-through, sent at now */
	struct kvr_index_ref r[1];
	l1_holds(1, 1, r);
	l2t_committed(t, key_of(1, 0), 0, r[0].slot, r[0].epoch);
	(void)take(dreq, KVR_MSG_L2_WRITE, &b);
	cr_assert_eq(l2t_writes_inflight(t), 1);
	act.now_ns -= 10 * MS; /* a clock read before the send (the old wrap) */
	cr_assert_eq(l2t_tick(t, &done), 0);
	struct kvr_msg m;
	cr_assert_neq(kvr_ring_try_dequeue(dreq, &m), 0, "not sent again");
	act.now_ns += 10 * MS + answer_ns + 1000 * MS;
	cr_assert_eq(l2t_tick(t, &done), 0);
	(void)take(dreq, KVR_MSG_L2_WRITE, &b);
	cr_assert_eq(b.slot, r[0].slot, "unanswered past l2_answer_ms: sent once more");
	cr_assert_neq(kvr_ring_try_dequeue(dreq, &m), 0);
}

/* A disk actor that died: its reads end at once (-EPIPE), its unanswered writes go to the
 * successor in commit order, and duplicates of answered ones cost nothing. */
Test(l2tier, a_dead_disk_actor_ends_its_reads_and_gets_its_writes_again)
{
	build(true, false, 2);
	struct kvr_index_ref r[3];
	l1_holds(1, 3, r);
	for (unsigned i = 0; i < 3; i++)
		l2t_committed(t, key_of(1, i), 0, r[i].slot, r[i].epoch);
	struct kvr_msg_l2 w[3];
	struct kvr_msg wm[3];
	for (unsigned i = 0; i < 3; i++)
		wm[i] = take(dreq, KVR_MSG_L2_WRITE, &w[i]);
	/* write 0 is answered; 1 and 2 are lost with the actor */
	struct kvr_msg_l2 a = w[0];
	struct kvr_msg ans;
	struct l2t_done done;
	kvr_msg_build(&ans, KVR_MSG_L2_WRITE_DONE, 0, wm[0].hdr.req_id, 0, &a, sizeof(a));
	cr_assert_eq(l2t_on_msg(t, drep, &ans, &done), 0);
	cr_assert(l2t_has(t, key_of(1, 0), 0));
	cr_assert_eq(l2t_writes_inflight(t), 2);
	cr_assert_eq(stat(KVR_STAT_LK_L2_WRITES_QUEUED), 2, "the gauge follows the answer, not the next tick");
	kvr_key k[2] = {key_of(0, 0), key_of(0, 1)};
	struct kvr_index_ref refs[2];
	cr_assert_eq(l2t_extend(t, 0, 9, 0, k, 2, 0, refs, 0), -EINPROGRESS);
	struct kvr_msg_l2 rb;
	(void)take(dreq, KVR_MSG_L2_READ, &rb);
	(void)take(dreq, KVR_MSG_L2_READ, &rb);
	atomic_fetch_add(&kvr_ctl_actor(act.ctl, DISK_ACTOR)->generation, 1); /* kill -9, restarted */
	cr_assert_eq(l2t_tick(t, &done), 1, "the promotion ends with its reads");
	cr_assert_eq(done.matched, 0);
	/* the successor is asked for its list at once; the tick that ended the promotion
	 * returned before pumping: the next one sends the lost writes, in commit order */
	struct kvr_msg m;
	cr_assert_eq(kvr_ring_try_dequeue(dreq, &m), 0);
	cr_assert_eq(m.hdr.type, KVR_MSG_L2_SYNC);
	cr_assert_eq(l2t_tick(t, &done), 0);
	struct kvr_msg_l2 x;
	(void)take(dreq, KVR_MSG_L2_WRITE, &x);
	cr_assert_eq(x.slot, r[1].slot);
	(void)take(dreq, KVR_MSG_L2_WRITE, &x);
	cr_assert_eq(x.slot, r[2].slot);
	cr_assert_eq(l2t_tick(t, &done), 0);
	cr_assert_neq(kvr_ring_try_dequeue(dreq, &m), 0, "nothing twice");
	cr_assert_eq(l2t_writes_inflight(t), 2);
	cr_assert_eq(stat(KVR_STAT_LK_L2_WRITES_QUEUED), 2);
	/* both answered: the gauge is 0 at once */
	for (unsigned i = 1; i < 3; i++) {
		a = w[i];
		kvr_msg_build(&ans, KVR_MSG_L2_WRITE_DONE, 0, wm[i].hdr.req_id, 0, &a, sizeof(a));
		cr_assert_eq(l2t_on_msg(t, drep, &ans, &done), 0);
	}
	cr_assert_eq(l2t_writes_inflight(t), 0);
	cr_assert_eq(stat(KVR_STAT_LK_L2_WRITES_QUEUED), 0);
	/* the read slots whose reads were aborted: FREE (no I/O pin held) */
	for (uint32_t s = 0; s < N_SLOTS; s++)
		cr_assert(kvr_slot_state(st, s) == KVR_SLOT_FREE || kvr_slot_state(st, s) == KVR_SLOT_COMMITTED);
}

/*
 * The shared tier: reads ahead start at one block and double with each hit; the first
 * miss ends the prefix. A prompt the cluster never saw costs one read.
 */
Test(l2tier, remote_promotions_read_ahead_in_a_slow_start_window)
{
	build(false, true, 0);
	enum { N = 20 };
	kvr_key keys[N];
	for (unsigned i = 0; i < N; i++)
		keys[i] = key_of(3, i);
	struct kvr_index_ref refs[N];
	cr_assert_eq(l2t_extend(t, 0, 11, 0, keys, N, 0, refs, 0), -EINPROGRESS);
	struct l2t_done done;
	struct kvr_msg none;
	/* window 1: block 0 alone */
	struct kvr_msg_l2 b0;
	struct kvr_msg m0 = take(rreq, KVR_MSG_L2_READ, &b0);
	cr_assert_eq(b0.key_lo, keys[0].lo);
	cr_assert_neq(kvr_ring_try_dequeue(rreq, &none), 0, "one read while nothing hit yet");
	cr_assert_eq(answer_read(rrep, &m0, &b0, 0, 0, &done), 0);
	/* after block 0 hit: exactly 2 more reads went out (window 2), keys 1 and 2 */
	struct kvr_msg m2[2];
	struct kvr_msg_l2 b2[2];
	for (unsigned k = 0; k < 2; k++) {
		m2[k] = take(rreq, KVR_MSG_L2_READ, &b2[k]);
		cr_assert_eq(b2[k].key_lo, keys[1 + k].lo);
	}
	cr_assert_neq(kvr_ring_try_dequeue(rreq, &none), 0, "the window is 2");
	/* block 1 hits (window 4: 3 more go out), block 2 misses: the prefix ends at 2 */
	cr_assert_eq(answer_read(rrep, &m2[0], &b2[0], 0, 0, &done), 0);
	unsigned more = 0;
	struct kvr_msg mm[8];
	struct kvr_msg_l2 bb[8];
	while (kvr_ring_try_dequeue(rreq, &mm[more]) == 0) {
		cr_assert_eq(kvr_msg_decode_l2(&mm[more], 0, &bb[more]), 0);
		more++;
	}
	cr_assert_eq(more, 3, "window 4 with block 2 still out: blocks 3, 4, 5");
	cr_assert_eq(answer_read(rrep, &m2[1], &b2[1], -ENOENT, 0, &done), 0);
	cr_assert_eq(kvr_slot_state(st, b2[1].slot), KVR_SLOT_FREE, "the missed block's slot is aborted");
	cr_assert_neq(kvr_ring_try_dequeue(rreq, &none), 0, "nothing past a miss is asked for");
	for (unsigned k = 0; k < more; k++)
		cr_assert_eq(answer_read(rrep, &mm[k], &bb[k], 0, 0, &done), k + 1 == more ? 2 : 0);
	cr_assert_eq(done.matched, 2, "blocks 0 and 1");
	cr_assert_eq(done.promoted, 2);
	cr_assert_eq(stat(KVR_STAT_LK_RM_READS), 5, "reads ahead that hit are kept in L1");
	cr_assert_eq(stat(KVR_STAT_LK_RM_READ_FAILS), 1);

	/* a prompt the cluster never saw: one read, one miss, nothing else */
	kvr_key cold[N];
	for (unsigned i = 0; i < N; i++)
		cold[i] = key_of(4, i);
	cr_assert_eq(l2t_extend(t, 0, 12, 0, cold, N, 0, refs, 0), -EINPROGRESS);
	struct kvr_msg_l2 cb;
	struct kvr_msg cm = take(rreq, KVR_MSG_L2_READ, &cb);
	cr_assert_neq(kvr_ring_try_dequeue(rreq, &none), 0);
	cr_assert_eq(answer_read(rrep, &cm, &cb, -ENOENT, 0, &done), 2);
	cr_assert_eq(done.matched, 0);
}

/*
 * kvringd starts the lookup actor first, then the disk and remote actors: l2t_open sees
 * generation 0. A read sent once the remote actor runs (generation 1) but before a tick
 * noticed it belongs to that actor: the tick must not abort it as its predecessor's (it
 * did: a prefix cut short at random in the 10,000-block remote test).
 */
Test(l2tier, a_read_sent_before_the_first_tick_saw_the_remote_actor_is_not_aborted)
{
	start_gen = 0;
	build(false, true, 0);
	atomic_store(&kvr_ctl_actor(act.ctl, NO_L2_REMOTE_ACTOR)->generation, 1); /* spawned after l2t_open */
	kvr_key keys[1] = {key_of(5, 0)};
	struct kvr_index_ref refs[1];
	cr_assert_eq(l2t_extend(t, 0, 21, 0, keys, 1, 0, refs, 0), -EINPROGRESS);
	struct kvr_msg_l2 b;
	struct kvr_msg m = take(rreq, KVR_MSG_L2_READ, &b);
	struct l2t_done done;
	cr_assert_eq(l2t_tick(t, &done), 0, "the tick that first sees the remote actor ends nothing");
	cr_assert_eq(stat(KVR_STAT_LK_RM_READ_FAILS), 0);
	cr_assert_eq(kvr_slot_state(st, b.slot), KVR_SLOT_WRITING, "the read's slot is still being filled");
	cr_assert_eq(answer_read(rrep, &m, &b, 0, 0, &done), 2);
	cr_assert_eq(done.matched, 1);
	cr_assert_eq(done.promoted, 1);
	cr_assert_eq(stat(KVR_STAT_LK_RM_READS), 1);
}

/* The same for a disk actor: a read sent to it before the first tick saw it survives that tick. */
Test(l2tier, a_read_sent_before_the_first_tick_saw_the_disk_actor_is_not_aborted)
{
	start_gen = 0;
	build(true, false, 1);
	atomic_store(&kvr_ctl_actor(act.ctl, DISK_ACTOR)->generation, 1);
	kvr_key keys[1] = {key_of(0, 0)};
	struct kvr_index_ref refs[1];
	cr_assert_eq(l2t_extend(t, 0, 22, 0, keys, 1, 0, refs, 0), -EINPROGRESS);
	struct kvr_msg_l2 b;
	struct kvr_msg m = take(dreq, KVR_MSG_L2_READ, &b);
	struct l2t_done done;
	cr_assert_eq(l2t_tick(t, &done), 0, "the tick that first sees the disk actor ends no read");
	cr_assert_eq(stat(KVR_STAT_LK_L2_READ_FAILS), 0);
	cr_assert_eq(answer_read(drep, &m, &b, 0, 0, &done), 2);
	cr_assert_eq(done.matched, 1);
	cr_assert_eq(done.promoted, 1);
}

/*
 * The first start of the disk actor (generation 0 when l2t_open looked, 1 at the next tick)
 * is not a restart: that incarnation reads the L2_SYNC and the writes from the start of its
 * ring. Taken for one, the tick asked for the whole list again and sent every write in
 * flight a second time (disk_actor::a_full_reply_ring_never_stops_its_loop saw 194 sync
 * answers for 97 when the lookup actor's first tick came late).
 */
Test(l2tier, the_first_start_of_the_disk_actor_is_not_a_restart)
{
	start_gen = 0;
	build(true, false, 1);
	struct kvr_index_ref r[2];
	l1_holds(1, 2, r);
	for (unsigned i = 0; i < 2; i++)
		l2t_committed(t, key_of(1, i), 0, r[i].slot, r[i].epoch);
	struct kvr_msg_l2 w;
	(void)take(dreq, KVR_MSG_L2_WRITE, &w);
	(void)take(dreq, KVR_MSG_L2_WRITE, &w);
	atomic_store(&kvr_ctl_actor(act.ctl, DISK_ACTOR)->generation, 1); /* spawned after l2t_open */
	struct l2t_done done;
	cr_assert_eq(l2t_tick(t, &done), 0);
	struct kvr_msg m;
	cr_assert_neq(kvr_ring_try_dequeue(dreq, &m), 0, "no second L2_SYNC, no write sent again (a %s went out)",
		      kvr_msg_type_name(m.hdr.type));
	cr_assert_eq(l2t_writes_inflight(t), 2);
	cr_assert(l2t_has(t, key_of(0, 0), 0), "the list taken at open still holds");
	/* a real restart after that still is one */
	atomic_store(&kvr_ctl_actor(act.ctl, DISK_ACTOR)->generation, 2);
	cr_assert_eq(l2t_tick(t, &done), 0);
	cr_assert_eq(kvr_ring_try_dequeue(dreq, &m), 0);
	cr_assert_eq(m.hdr.type, KVR_MSG_L2_SYNC, "the successor is asked for its list");
}

/* Write-through to the shared tier: every committed lane is handed over once; a full ring
 * skips (and counts) instead of waiting. */
Test(l2tier, remote_write_through_never_waits)
{
	build(false, true, 0);
	struct kvr_index_ref r[1];
	l1_holds(5, 1, r);
	l2t_committed(t, key_of(5, 0), 0, r[0].slot, r[0].epoch);
	struct kvr_msg_l2 b;
	(void)take(rreq, KVR_MSG_L2_WRITE, &b);
	cr_assert_eq(b.slot, r[0].slot);
	cr_assert_eq(b.epoch, r[0].epoch);
	cr_assert_eq(stat(KVR_STAT_LK_RM_WRITES), 1);
	unsigned cap = 64;
	for (unsigned i = 0; i < cap + 5; i++)
		l2t_committed(t, key_of(5, 0), 0, r[0].slot, r[0].epoch);
	cr_assert_eq(stat(KVR_STAT_LK_RM_WRITES), 1 + cap);
	cr_assert_eq(stat(KVR_STAT_LK_RM_WRITES_SKIPPED), 5);
	cr_assert_eq(l2t_writes_inflight(t), 0, "the shared tier vetoes no eviction");
}
