/* Slot-table tests: layout, attach validation, every transition (and illegal one's errno), pins, release. */
#include <criterion/criterion.h>

#include <errno.h>
#include <string.h>
#include <sys/wait.h>

#include "l1_test.h"

#define N_SLOTS 8

static struct kvr_segment seg = {.fd = -1}, other = {.fd = -1}, ro = {.fd = -1};
static struct kvr_slot_table *t;

static void setup(void)
{
	cr_assert_eq(l1_table(N_SLOTS, 2, 2, &seg, &t), 0);
}

static void teardown(void)
{
	kvr_segment_close(&seg);
	kvr_segment_close(&other);
	kvr_segment_close(&ro);
}

TestSuite(slots, .init = setup, .fini = teardown);

static const kvr_key K1 = {0x1111, 0xaaaa}, K2 = {0x2222, 0xbbbb};

Test(slots, layout)
{
	cr_assert_eq(sizeof(struct kvr_slot), 64);
	cr_assert_eq(sizeof(struct kvr_slot_table), 256);
	cr_assert_eq(kvr_slots_memsize(N_SLOTS), 256 + 64 * N_SLOTS);
	cr_assert_eq(kvr_slots_memsize(0), 0);
	cr_assert_eq((void *)t, seg.base);
	cr_assert_eq(t->seg.magic, KVR_SEG_MAGIC, "init left the segment header alone");
	cr_assert_eq(t->seg.kind, KVR_SEG_SLOTS);
	cr_assert_eq(t->n_slots, N_SLOTS);
	cr_assert_eq(t->slot_bytes, 8192, "5000 aligned up to 4096");
	cr_assert_eq(t->arena_data_off, 4096);
	cr_assert_eq(t->block_tokens, 16);
	cr_assert_eq(t->tp_size, 2);
	cr_assert_eq(t->quorum, 2);
	cr_assert(t->ns.lo == 0x1234 && t->ns.hi == 0x5678);
	for (uint32_t i = 0; i < N_SLOTS; i++) {
		cr_assert_eq(kvr_slot_state(t, i), KVR_SLOT_FREE);
		cr_assert_eq(kvr_slot_epoch(t, i), 0);
		cr_assert_eq((uint8_t *)kvr_slot_at(t, i) - (uint8_t *)t, 256 + 64 * i);
	}
	uint8_t *arena = malloc(kvr_slots_arena_memsize(N_SLOTS, 5000));
	cr_assert_not_null(arena);
	cr_assert_eq((uint8_t *)kvr_slot_data(t, arena, 3) - arena, 4096 + 3 * 8192);
	cr_assert_eq((uint8_t *)kvr_slot_data(t, arena, N_SLOTS - 1) + t->slot_bytes - arena,
		     (ptrdiff_t)kvr_slots_arena_memsize(N_SLOTS, 5000), "the last slot ends at the arena end");
	cr_assert_null(kvr_slot_data(t, arena, N_SLOTS));
	free(arena);
	cr_assert_eq(kvr_slots_slot_bytes(4096), 4096);
	cr_assert_eq(kvr_slots_slot_bytes(4097), 8192);
	cr_assert_eq(kvr_slots_slot_bytes(5242880), 5242880);
	cr_assert_eq(kvr_slots_arena_memsize(10, 5000), 4096 + 10 * 8192);
	cr_assert_eq(kvr_slots_arena_memsize(10, UINT64_MAX), 0);
	cr_assert_eq(kvr_slots_tick(t), 1);
	cr_assert_eq(kvr_slots_tick(t), 2);
}

Test(slots, init_rejects_bad_config)
{
	uint8_t mem[256 + 64 * 4] = {0};
	struct kvr_slot_table *r = NULL;
	struct kvr_slots_config c = {.n_slots = 4, .lane_bytes = 1, .block_tokens = 16, .tp_size = 2, .quorum = 2};
	cr_assert_eq(kvr_slots_init(mem, sizeof(mem), &c, &r), 0);
	cr_assert_eq(r->slot_bytes, 4096);
	struct kvr_slots_config bad[] = {c, c, c, c, c, c, c};
	bad[0].n_slots = 0;
	bad[1].lane_bytes = 0;
	bad[2].tp_size = 0;
	bad[3].tp_size = 17;
	bad[4].quorum = 3;
	bad[5].lane_bytes = UINT64_MAX; /* no slot size */
	bad[6].arena_data_off = 100;
	for (int i = 0; i < 7; i++)
		cr_assert_eq(kvr_slots_init(mem, sizeof(mem), &bad[i], &r), -EINVAL, "bad config %d", i);
	c.n_slots = 5;
	cr_assert_eq(kvr_slots_init(mem, sizeof(mem), &c, &r), -ENOSPC);
}

/* block_tokens 0 and quorum 0: engines of several block sizes and TP sizes share the table,
 * each slot carries its own block size and lanes, written with its model by the allocation
 * (kvr_slot_alloc_tagged) before the slot reads WRITING; an untagged allocation has none. On
 * a table of one block size and quorum the tag's block size and lanes are ignored. */
Test(slots, a_table_of_mixed_block_sizes_keeps_each_slots_own)
{
	uint8_t mem[256 + 64 * 4] = {0};
	struct kvr_slot_table *m = NULL;
	struct kvr_slots_config c = {.n_slots = 4, .lane_bytes = 4096, .block_tokens = 0, .tp_size = 2, .quorum = 0};
	cr_assert_eq(kvr_slots_init(mem, sizeof(mem), &c, &m), 0);
	cr_assert_eq(m->block_tokens, 0);
	uint32_t ep;
	cr_assert_eq(kvr_slot_alloc(m, 0, K1, 0, 0, &ep), 0);
	cr_assert(kvr_slot_at(m, 0)->block_tokens == 0 && kvr_slot_block_lanes(m, 0) == 0 && kvr_slot_model(m, 0) == 0,
		  "an untagged slot has no block size, lanes or model of its own");
	cr_assert_eq(kvr_slot_abort(m, 0, ep), 0);
	const struct kvr_slot_tag a = {.block_tokens = 32, .lanes = 2, .model = 3}, b = {.block_tokens = 16, .lanes = 1, .model = 4};
	cr_assert_eq(kvr_slot_alloc_tagged(m, 0, K1, 1, 0, &a, &ep), 0);
	cr_assert_eq(kvr_slot_alloc_tagged(m, 1, K2, 0, 0, &b, &ep), 0);
	cr_assert(kvr_slot_at(m, 0)->block_tokens == 32 && kvr_slot_block_lanes(m, 0) == 2 && kvr_slot_model(m, 0) == 3);
	cr_assert(kvr_slot_at(m, 1)->block_tokens == 16 && kvr_slot_block_lanes(m, 1) == 1 && kvr_slot_model(m, 1) == 4);

	cr_assert_eq(kvr_slot_alloc_tagged(t, 3, K1, 0, 0, &a, &ep), 0);
	cr_assert_eq(kvr_slot_at(t, 3)->block_tokens, 16, "a table of one block size keeps its own");
	cr_assert_eq(kvr_slot_block_lanes(t, 3), t->quorum, "and one quorum its own");
	cr_assert_eq(kvr_slot_model(t, 3), 3, "the model is every slot's own");
	cr_assert_eq(kvr_slot_abort(t, 3, ep), 0);
}

Test(slots, attach_validates)
{
	struct kvr_slot_table *a = NULL;
	cr_assert_eq(kvr_slots_attach(&seg, &a), 0);
	cr_assert_eq(a, t);

	/* read-only mapping of the same fd: attach and counts work, nothing is written */
	cr_assert_eq(kvr_segment_map(seg.fd, KVR_SEG_SLOTS, 0, &ro), 0);
	struct kvr_slot_table *r = NULL;
	cr_assert_eq(kvr_slots_attach(&ro, &r), 0);
	uint32_t ep;
	cr_assert_eq(kvr_slot_alloc(t, 2, K1, 0, 0, &ep), 0);
	struct kvr_slot_counts c;
	kvr_slots_counts(r, &c);
	cr_assert_eq(c.by_state[KVR_SLOT_WRITING], 1, "the read-only view sees the writer's state");
	cr_assert_eq(c.by_state[KVR_SLOT_FREE], N_SLOTS - 1);

	/* another kind of segment */
	char name[64];
	snprintf(name, sizeof(name), "kvr-test-arena-%d", (int)getpid());
	cr_assert_eq(kvr_segment_create(name, KVR_SEG_ARENA, kvr_slots_memsize(N_SLOTS), 1, 0, &other), 0);
	cr_assert_eq(kvr_slots_attach(&other, &a), -EMEDIUMTYPE);
	kvr_segment_close(&other);

	/* a slots segment never initialised */
	cr_assert_eq(kvr_segment_create(name, KVR_SEG_SLOTS, kvr_slots_memsize(N_SLOTS), 1, 0, &other), 0);
	cr_assert_eq(kvr_slots_attach(&other, &a), -EPROTO);

	/* corrupt fields */
	struct kvr_slot_table *o = NULL;
	struct kvr_slots_config cfg = {.n_slots = N_SLOTS, .lane_bytes = 4096, .block_tokens = 16, .tp_size = 2,
				       .quorum = 1};
	cr_assert_eq(kvr_slots_init(other.base, other.size, &cfg, &o), 0);
	struct kvr_slot_table *b = NULL;
	cr_assert_eq(kvr_slots_attach(&other, &b), 0);
	cr_assert_eq(b, o);
	o->quorum = 3;
	cr_assert_eq(kvr_slots_attach(&other, &a), -EBADMSG, "quorum > tp_size");
	o->quorum = 1;
	o->n_slots = 1u << 20;
	cr_assert_eq(kvr_slots_attach(&other, &a), -EBADMSG, "slots past the segment end");
	o->n_slots = N_SLOTS;
	o->slot_bytes = 5000;
	cr_assert_eq(kvr_slots_attach(&other, &a), -EBADMSG, "slot_bytes not aligned");
	o->slot_bytes = 4096;
	o->slots_off = 8;
	cr_assert_eq(kvr_slots_attach(&other, &a), -EBADMSG, "slots inside the header");
	cr_assert_eq(a, t, "untouched on failure");
}

/* Bring slot 0 into a state; returns its epoch. */
enum start { S_FREE, S_WRITING, S_COMMITTED, S_PINNED, S_EVICTING, S_IO_READ, S_IO_WRITE, S_DRAINING };
static const char *start_name[] = {"free",	    "writing",		"committed", "pinned", "evicting",
				   "writing+io pin", "committed+io pin", "draining"};

static uint32_t bring(enum start s)
{
	uint32_t ep = 0;
	if (s == S_FREE)
		return kvr_slot_epoch(t, 0);
	cr_assert_eq(kvr_slot_alloc(t, 0, K1, 1, 3, &ep), 0);
	if (s == S_WRITING)
		return ep;
	if (s == S_IO_READ || s == S_DRAINING) {
		cr_assert_eq(kvr_slot_pin_io(t, 0, ep, KVR_SLOT_WRITING), 0);
		if (s == S_DRAINING)
			cr_assert_eq(kvr_slot_abort(t, 0, ep), 1, "an aborted slot with I/O in flight drains");
		return ep;
	}
	cr_assert_eq(kvr_slot_commit(t, 0, ep), 0);
	if (s == S_PINNED)
		cr_assert_eq(kvr_slot_pin(t, 0, ep, 5), 0);
	if (s == S_EVICTING)
		cr_assert_eq(kvr_slot_evict_begin(t, 0, ep), 0);
	if (s == S_IO_WRITE)
		cr_assert_eq(kvr_slot_pin_io(t, 0, ep, KVR_SLOT_COMMITTED), 0);
	return ep;
}

enum op { O_ALLOC, O_COMMIT, O_COMMIT_OLD, O_ABORT, O_ABORT_OLD, O_PIN, O_PIN_OLD, O_UNPIN, O_EVICT_BEGIN,
	  O_EVICT, O_EVICT_OLD, O_PIN_IO_W, O_PIN_IO_C, O_UNPIN_IO, O_DRAINED, O_PIN_LOOKUP };
static const char *op_name[] = {"alloc",       "commit",     "commit(old epoch)", "abort",	 "abort(old epoch)",
				"pin",	       "pin(old epoch)", "unpin",	       "evict_begin", "evict",
				"evict(old epoch)", "pin_io(writing)", "pin_io(committed)", "unpin(io)", "drained",
				"pin(lookup)"};

static int do_op(enum op o, uint32_t ep)
{
	uint32_t e2;
	switch (o) {
	case O_ALLOC: return kvr_slot_alloc(t, 0, K2, 0, 1, &e2);
	case O_COMMIT: return kvr_slot_commit(t, 0, ep);
	case O_COMMIT_OLD: return kvr_slot_commit(t, 0, ep - 1);
	case O_ABORT: return kvr_slot_abort(t, 0, ep);
	case O_ABORT_OLD: return kvr_slot_abort(t, 0, ep + 7);
	case O_PIN: return kvr_slot_pin(t, 0, ep, 5);
	case O_PIN_OLD: return kvr_slot_pin(t, 0, ep - 1, 5);
	case O_UNPIN: return kvr_slot_unpin(t, 0, 5);
	case O_EVICT_BEGIN: return kvr_slot_evict_begin(t, 0, ep);
	case O_EVICT: return kvr_slot_evict(t, 0, ep);
	case O_EVICT_OLD: return kvr_slot_evict(t, 0, ep - 1);
	case O_PIN_IO_W: return kvr_slot_pin_io(t, 0, ep, KVR_SLOT_WRITING);
	case O_PIN_IO_C: return kvr_slot_pin_io(t, 0, ep, KVR_SLOT_COMMITTED);
	case O_UNPIN_IO: return kvr_slot_unpin(t, 0, KVR_PIN_IO);
	case O_DRAINED: return kvr_slot_drained(t, 0);
	case O_PIN_LOOKUP: return kvr_slot_pin(t, 0, ep, KVR_PIN_LOOKUP);
	}
	return -1;
}

static const struct tcase {
	enum start from;
	enum op op;
	int rc;
	uint32_t state; /* after */
	unsigned pins;  /* after */
} tcases[] = {
	{S_FREE, O_ALLOC, 0, KVR_SLOT_WRITING, 0},
	{S_FREE, O_COMMIT, -ESTALE, KVR_SLOT_FREE, 0},
	{S_FREE, O_ABORT, -ESTALE, KVR_SLOT_FREE, 0},
	{S_FREE, O_PIN, -ESTALE, KVR_SLOT_FREE, 0},
	{S_FREE, O_UNPIN, -ENOENT, KVR_SLOT_FREE, 0},
	{S_FREE, O_EVICT_BEGIN, -ESTALE, KVR_SLOT_FREE, 0},
	{S_FREE, O_EVICT, -ESTALE, KVR_SLOT_FREE, 0},

	{S_WRITING, O_ALLOC, -EBUSY, KVR_SLOT_WRITING, 0},
	{S_WRITING, O_COMMIT, 0, KVR_SLOT_COMMITTED, 0},
	{S_WRITING, O_COMMIT_OLD, -ESTALE, KVR_SLOT_WRITING, 0},
	{S_WRITING, O_ABORT, 0, KVR_SLOT_FREE, 0},
	{S_WRITING, O_ABORT_OLD, -ESTALE, KVR_SLOT_WRITING, 0},
	{S_WRITING, O_PIN, -ESTALE, KVR_SLOT_WRITING, 0},
	{S_WRITING, O_UNPIN, -ENOENT, KVR_SLOT_WRITING, 0},
	{S_WRITING, O_EVICT_BEGIN, -EBUSY, KVR_SLOT_WRITING, 0},
	{S_WRITING, O_EVICT, -EBUSY, KVR_SLOT_WRITING, 0},

	{S_COMMITTED, O_ALLOC, -EBUSY, KVR_SLOT_COMMITTED, 0},
	{S_COMMITTED, O_COMMIT, -ESTALE, KVR_SLOT_COMMITTED, 0},
	{S_COMMITTED, O_ABORT, -ESTALE, KVR_SLOT_COMMITTED, 0},
	{S_COMMITTED, O_PIN, 0, KVR_SLOT_COMMITTED, 1},
	{S_COMMITTED, O_PIN_OLD, -ESTALE, KVR_SLOT_COMMITTED, 0},
	{S_COMMITTED, O_UNPIN, -ENOENT, KVR_SLOT_COMMITTED, 0},
	{S_COMMITTED, O_EVICT_BEGIN, 0, KVR_SLOT_EVICTING, 0},
	{S_COMMITTED, O_EVICT, 0, KVR_SLOT_FREE, 0},
	{S_COMMITTED, O_EVICT_OLD, -ESTALE, KVR_SLOT_COMMITTED, 0},

	{S_PINNED, O_ALLOC, -EBUSY, KVR_SLOT_COMMITTED, 1},
	{S_PINNED, O_PIN, 0, KVR_SLOT_COMMITTED, 2},
	{S_PINNED, O_UNPIN, 0, KVR_SLOT_COMMITTED, 0},
	{S_PINNED, O_EVICT_BEGIN, -EBUSY, KVR_SLOT_COMMITTED, 1},
	{S_PINNED, O_EVICT, -EBUSY, KVR_SLOT_COMMITTED, 1},
	{S_PINNED, O_ABORT, -ESTALE, KVR_SLOT_COMMITTED, 1},

	{S_EVICTING, O_ALLOC, -EBUSY, KVR_SLOT_EVICTING, 0},
	{S_EVICTING, O_COMMIT, -ESTALE, KVR_SLOT_EVICTING, 0},
	{S_EVICTING, O_ABORT, -ESTALE, KVR_SLOT_EVICTING, 0},
	{S_EVICTING, O_PIN, -ESTALE, KVR_SLOT_EVICTING, 0},
	{S_EVICTING, O_EVICT_BEGIN, -EBUSY, KVR_SLOT_EVICTING, 0},
	{S_EVICTING, O_EVICT, 0, KVR_SLOT_FREE, 0},
	{S_EVICTING, O_EVICT_OLD, -ESTALE, KVR_SLOT_EVICTING, 0},

	/* I/O pins: a read fills a WRITING slot, a write copies a COMMITTED one out */
	{S_WRITING, O_PIN_IO_W, 0, KVR_SLOT_WRITING, 1},
	{S_WRITING, O_PIN_IO_C, -ESTALE, KVR_SLOT_WRITING, 0},
	{S_COMMITTED, O_PIN_IO_C, 0, KVR_SLOT_COMMITTED, 1},
	{S_COMMITTED, O_PIN_IO_W, -ESTALE, KVR_SLOT_COMMITTED, 0},
	{S_COMMITTED, O_PIN_LOOKUP, 0, KVR_SLOT_COMMITTED, 1},
	{S_FREE, O_PIN_IO_W, -ESTALE, KVR_SLOT_FREE, 0},
	{S_EVICTING, O_PIN_IO_C, -ESTALE, KVR_SLOT_EVICTING, 0},
	{S_IO_READ, O_ABORT, 1, KVR_SLOT_DRAINING, 1},   /* defect 1: never FREE while a read may land */
	{S_IO_READ, O_COMMIT, 0, KVR_SLOT_COMMITTED, 1},
	{S_IO_READ, O_UNPIN_IO, 0, KVR_SLOT_WRITING, 0},
	{S_IO_READ, O_ALLOC, -EBUSY, KVR_SLOT_WRITING, 1},
	{S_IO_WRITE, O_EVICT_BEGIN, -EBUSY, KVR_SLOT_COMMITTED, 1},
	{S_IO_WRITE, O_EVICT, -EBUSY, KVR_SLOT_COMMITTED, 1},
	{S_DRAINING, O_ALLOC, -EBUSY, KVR_SLOT_DRAINING, 1},
	{S_DRAINING, O_DRAINED, -EBUSY, KVR_SLOT_DRAINING, 1},
	{S_DRAINING, O_PIN_IO_W, -ESTALE, KVR_SLOT_DRAINING, 1},
	{S_DRAINING, O_COMMIT, -ESTALE, KVR_SLOT_DRAINING, 1},
	{S_DRAINING, O_ABORT, -ESTALE, KVR_SLOT_DRAINING, 1},
	{S_DRAINING, O_EVICT, -ESTALE, KVR_SLOT_DRAINING, 1},
	{S_DRAINING, O_UNPIN_IO, 0, KVR_SLOT_DRAINING, 0},
	{S_WRITING, O_DRAINED, -ESTALE, KVR_SLOT_WRITING, 0},
};

Test(slots, transition_table)
{
	for (size_t i = 0; i < sizeof(tcases) / sizeof(tcases[0]); i++) {
		const struct tcase *c = &tcases[i];
		/* a fresh slot 0 for every row */
		memset(kvr_slot_at(t, 0), 0, sizeof(struct kvr_slot));
		uint32_t ep = bring(c->from);
		int rc = do_op(c->op, ep);
		cr_expect_eq(rc, c->rc, "%s + %s: rc %d, want %d", start_name[c->from], op_name[c->op], rc, c->rc);
		cr_expect_eq(kvr_slot_state(t, 0), c->state, "%s + %s: state %s, want %s", start_name[c->from],
			     op_name[c->op], kvr_slot_state_name(kvr_slot_state(t, 0)), kvr_slot_state_name(c->state));
		cr_expect_eq(kvr_slot_pins(t, 0), c->pins, "%s + %s: pins", start_name[c->from], op_name[c->op]);
	}
}

/* The defect-1 lifecycle in order: a read holds its I/O pin, the slot is aborted, it waits
 * in DRAINING (not allocatable) until the pin goes — by the read's completion or by the disk
 * actor's successor dropping a dead predecessor's pins — and only then is FREE again. */
Test(slots, draining_until_the_io_ends)
{
	uint32_t ep, ep2;
	cr_assert_eq(kvr_slot_alloc(t, 2, K1, 0, KVR_SLOT_OWNER_LOOKUP, &ep), 0);
	cr_assert_eq(kvr_slot_at(t, 2)->owner, KVR_SLOT_OWNER_LOOKUP);
	cr_assert_eq(kvr_slot_pin_io(t, 2, ep, KVR_SLOT_WRITING), 0);
	cr_assert_eq(kvr_slot_abort(t, 2, ep), 1);
	cr_assert_eq(kvr_slot_state(t, 2), KVR_SLOT_DRAINING);
	cr_assert(kvr_key_eq(kvr_slot_at(t, 2)->key, K1), "a draining slot keeps its key (its disk actor is found by it)");
	cr_assert_eq(kvr_slot_alloc(t, 2, K2, 0, 1, &ep2), -EBUSY, "not reusable while the read may land");
	cr_assert_eq(kvr_slot_drop_pins(t, 2, KVR_PIN_LOOKUP), 0, "another owner's pins are not touched");
	cr_assert_eq(kvr_slot_pins_of(t, 2, KVR_PIN_IO), 1);
	cr_assert_eq(kvr_slot_drop_pins(t, 2, KVR_PIN_IO), 1, "the dead disk actor's pin");
	cr_assert_eq(kvr_slot_drained(t, 2), 0);
	cr_assert_eq(kvr_slot_state(t, 2), KVR_SLOT_FREE);
	cr_assert_eq(kvr_slot_alloc(t, 2, K2, 0, 1, &ep2), 0);
	cr_assert_eq(ep2, ep + 1);

	/* owners are separate counters: the lookup actor's pin is not a worker's */
	cr_assert_eq(kvr_slot_commit(t, 2, ep2), 0);
	cr_assert_eq(kvr_slot_pin(t, 2, ep2, KVR_PIN_LOOKUP), 0);
	cr_assert_eq(kvr_slot_pin(t, 2, ep2, KVR_PIN_WORKER(15)), 0);
	cr_assert_eq(kvr_slot_pins_of(t, 2, KVR_PIN_LOOKUP), 1);
	cr_assert_eq(kvr_slot_pins_of(t, 2, 15), 1);
	cr_assert_eq(kvr_slot_pins(t, 2), 2);
	struct kvr_slots_release rel;
	cr_assert_eq(kvr_slots_release_worker(t, 15, &rel), 0);
	cr_assert_eq(rel.pins, 1);
	cr_assert_eq(kvr_slot_pins_of(t, 2, KVR_PIN_LOOKUP), 1, "a worker's release leaves the lookup pin");
	cr_assert_eq(kvr_slot_evict(t, 2, ep2), -EBUSY);
	cr_assert_eq(kvr_slot_drop_pins(t, 2, KVR_PIN_LOOKUP), 1);
	cr_assert_eq(kvr_slot_evict(t, 2, ep2), 0);

	/* a worker that is gone: its WRITING slot with a read in flight drains too */
	cr_assert_eq(kvr_slot_alloc(t, 3, K1, 0, 4, &ep), 0);
	cr_assert_eq(kvr_slot_pin_io(t, 3, ep, KVR_SLOT_WRITING), 0);
	cr_assert_eq(kvr_slots_release_worker(t, 4, &rel), 0);
	cr_assert_eq(rel.aborted, 1);
	cr_assert_eq(rel.draining, 1);
	cr_assert_eq(kvr_slot_state(t, 3), KVR_SLOT_DRAINING);
	cr_assert_eq(kvr_slot_unpin(t, 3, KVR_PIN_IO), 0);
	cr_assert_eq(kvr_slot_drained(t, 3), 0);
	struct kvr_slot_counts c;
	kvr_slots_counts(t, &c);
	cr_assert_eq(c.by_state[KVR_SLOT_DRAINING], 0);
	cr_assert_eq(c.pins, 0);
	cr_assert_str_eq(kvr_slot_state_name(KVR_SLOT_DRAINING), "draining");
}

Test(slots, fields_epochs_and_bad_args)
{
	uint32_t ep = 0, ep2 = 0;
	cr_assert_eq(kvr_slot_alloc(t, 4, K1, 1, 9, &ep), 0);
	cr_assert_eq(ep, 1);
	struct kvr_slot *s = kvr_slot_at(t, 4);
	cr_assert(kvr_key_eq(s->key, K1));
	cr_assert_eq(s->lane, 1);
	cr_assert_eq(s->owner, 9);
	cr_assert_eq(s->block_tokens, 16);
	cr_assert_eq(kvr_slot_commit(t, 4, ep), 0);
	cr_assert_eq(s->commit_seq, 0);
	cr_assert_gt(s->last_access, 0);
	cr_assert_eq(kvr_slot_alloc(t, 5, K2, 0, 0, &ep2), 0);
	cr_assert_eq(kvr_slot_commit(t, 5, ep2), 0);
	cr_assert_eq(kvr_slot_at(t, 5)->commit_seq, 1, "commit sequence counts");
	cr_assert_gt(kvr_slot_at(t, 5)->last_access, s->last_access);
	cr_assert_eq(kvr_slot_touch(t, 4, 1000), 0);
	cr_assert_eq(s->last_access, 1000);

	cr_assert_eq(kvr_slot_evict(t, 4, ep), 0);
	cr_assert(kvr_key_is_zero(s->key), "a free slot has no key");
	cr_assert_eq(kvr_slot_touch(t, 4, 1001), -ESTALE);
	cr_assert_eq(kvr_slot_alloc(t, 4, K2, 0, 0, &ep), 0);
	cr_assert_eq(ep, 2, "epoch +1 per allocation");
	cr_assert_eq(kvr_slot_abort(t, 4, ep), 0);
	cr_assert_eq(kvr_slot_alloc(t, 4, K2, 0, 0, &ep), 0);
	cr_assert_eq(ep, 3);

	cr_assert_eq(kvr_slot_alloc(t, N_SLOTS, K1, 0, 0, &ep), -EINVAL, "slot out of range");
	cr_assert_eq(kvr_slot_alloc(t, 0, K1, 2, 0, &ep), -EINVAL, "lane >= tp_size");
	cr_assert_eq(kvr_slot_alloc(t, 0, K1, 0, 16, &ep), -EINVAL, "owner >= 16");
	cr_assert_eq(kvr_slot_alloc(t, 0, K1, 0, KVR_SLOT_OWNER_LOOKUP - 1, &ep), -EINVAL, "owner not a worker or lookup");
	cr_assert_eq(kvr_slot_commit(t, N_SLOTS, 1), -EINVAL);
	cr_assert_eq(kvr_slot_abort(t, N_SLOTS, 1), -EINVAL);
	cr_assert_eq(kvr_slot_pin(t, 5, ep2, KVR_PIN_OWNERS), -EINVAL);
	cr_assert_eq(kvr_slot_unpin(t, 5, KVR_PIN_OWNERS), -EINVAL);
	cr_assert_eq(kvr_slot_evict(t, N_SLOTS, 1), -EINVAL);
	cr_assert_eq(kvr_slots_release_worker(t, 16, NULL), -EINVAL);
	cr_assert_eq(kvr_slot_state(t, 0), KVR_SLOT_FREE, "nothing changed by rejected calls");
}

Test(slots, pin_limit)
{
	uint32_t ep = bring(S_COMMITTED);
	for (int i = 0; i < 255; i++)
		cr_assert_eq(kvr_slot_pin(t, 0, ep, 2), 0, "pin %d", i);
	cr_assert_eq(kvr_slot_pin(t, 0, ep, 2), -EOVERFLOW);
	cr_assert_eq(atomic_load(&kvr_slot_at(t, 0)->pins[2]), 255);
	cr_assert_eq(kvr_slot_pin(t, 0, ep, 3), 0, "another worker's count is separate");
	cr_assert_eq(kvr_slot_pins(t, 0), 256);
}

Test(slots, pins_from_two_workers)
{
	uint32_t ep = bring(S_COMMITTED);
	cr_assert_eq(kvr_slot_pin(t, 0, ep, 0), 0);
	cr_assert_eq(kvr_slot_pin(t, 0, ep, 0), 0);
	cr_assert_eq(kvr_slot_pin(t, 0, ep, 1), 0);
	struct kvr_slot_counts c;
	kvr_slots_counts(t, &c);
	cr_assert_eq(c.reading, 1, "a pinned committed slot is reading");
	cr_assert_eq(c.pins, 3);
	cr_assert_eq(kvr_slot_evict(t, 0, ep), -EBUSY);

	/* worker 1's loader is another process: it unpins through its own mapping */
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		struct kvr_segment m;
		struct kvr_slot_table *ct;
		int rc = kvr_segment_map(seg.fd, KVR_SEG_SLOTS, 1, &m);
		if (!rc)
			rc = kvr_slots_attach(&m, &ct);
		if (!rc)
			rc = kvr_slot_unpin(ct, 0, 1);
		if (!rc)
			rc = kvr_slot_unpin(ct, 0, 1) == -ENOENT ? 0 : 1; /* never below 0 */
		_exit(rc ? 1 : 0);
	}
	int status;
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child unpin");
	cr_assert_eq(atomic_load(&kvr_slot_at(t, 0)->pins[1]), 0);
	cr_assert_eq(atomic_load(&kvr_slot_at(t, 0)->pins[0]), 2);
	cr_assert_eq(kvr_slot_evict(t, 0, ep), -EBUSY, "worker 0 still reads it");
	cr_assert_eq(kvr_slot_unpin(t, 0, 0), 0);
	cr_assert_eq(kvr_slot_unpin(t, 0, 0), 0);
	cr_assert_eq(kvr_slot_unpin(t, 0, 0), -ENOENT);
	kvr_slots_counts(t, &c);
	cr_assert_eq(c.reading, 0);
	cr_assert_eq(c.pins, 0);
	cr_assert_eq(kvr_slot_evict(t, 0, ep), 0);
}

Test(slots, release_worker_and_counts)
{
	uint32_t ep[N_SLOTS];
	/* 0: writing, owner 1   1: writing, owner 0   2: committed, pins w1 x3 + w0 x1
	 * 3: committed, pin w1   4: committed   5: evicting   6, 7: free */
	cr_assert_eq(kvr_slot_alloc(t, 0, l1_key(1, 0), 0, 1, &ep[0]), 0);
	cr_assert_eq(kvr_slot_alloc(t, 1, l1_key(1, 1), 0, 0, &ep[1]), 0);
	for (uint32_t i = 2; i <= 5; i++) {
		cr_assert_eq(kvr_slot_alloc(t, i, l1_key(1, i), 1, 0, &ep[i]), 0);
		cr_assert_eq(kvr_slot_commit(t, i, ep[i]), 0);
	}
	for (int k = 0; k < 3; k++)
		cr_assert_eq(kvr_slot_pin(t, 2, ep[2], 1), 0);
	cr_assert_eq(kvr_slot_pin(t, 2, ep[2], 0), 0);
	cr_assert_eq(kvr_slot_pin(t, 3, ep[3], 1), 0);
	cr_assert_eq(kvr_slot_evict_begin(t, 5, ep[5]), 0);

	struct kvr_slot_counts c;
	kvr_slots_counts(t, &c);
	cr_assert_eq(c.by_state[KVR_SLOT_FREE], 2);
	cr_assert_eq(c.by_state[KVR_SLOT_WRITING], 2);
	cr_assert_eq(c.by_state[KVR_SLOT_COMMITTED], 3);
	cr_assert_eq(c.by_state[KVR_SLOT_EVICTING], 1);
	cr_assert_eq(c.reading, 2);
	cr_assert_eq(c.pins, 5);
	cr_assert_eq(c.invalid, 0);

	struct kvr_slots_release r;
	cr_assert_eq(kvr_slots_release_worker(t, 1, &r), 0);
	cr_assert_eq(r.unpinned_slots, 2);
	cr_assert_eq(r.pins, 4);
	cr_assert_eq(r.aborted, 1);
	cr_assert_eq(kvr_slot_state(t, 0), KVR_SLOT_FREE, "worker 1's write reclaimed");
	cr_assert_eq(kvr_slot_state(t, 1), KVR_SLOT_WRITING, "worker 0's write untouched");
	cr_assert_eq(atomic_load(&kvr_slot_at(t, 2)->pins[1]), 0);
	cr_assert_eq(atomic_load(&kvr_slot_at(t, 2)->pins[0]), 1, "worker 0's pin untouched");
	cr_assert_eq(kvr_slot_pins(t, 3), 0);
	cr_assert_eq(kvr_slot_evict(t, 3, ep[3]), 0, "no longer pinned forever");

	kvr_slots_counts(t, &c);
	cr_assert_eq(c.by_state[KVR_SLOT_FREE], 4);
	cr_assert_eq(c.by_state[KVR_SLOT_WRITING], 1);
	cr_assert_eq(c.by_state[KVR_SLOT_COMMITTED], 2);
	cr_assert_eq(c.reading, 1);
	cr_assert_eq(c.pins, 1);

	/* a corrupt state is counted, not trusted */
	atomic_store(&kvr_slot_at(t, 7)->state, 9);
	kvr_slots_counts(t, &c);
	cr_assert_eq(c.invalid, 1);
	cr_assert_str_eq(kvr_slot_state_name(9), "invalid");
	cr_assert_str_eq(kvr_slot_state_name(KVR_SLOT_EVICTING), "evicting");
}

/* Committed slots by model: a writing slot is not counted, a model past n counts in ret[0],
 * a freed slot's model is gone with it. */
Test(slots, model_counts)
{
	uint32_t e[4];
	static const uint8_t model[4] = {1, 1, 2, 9};
	for (uint32_t i = 0; i < 4; i++) {
		const struct kvr_slot_tag tag = {.model = model[i]};
		cr_assert_eq(kvr_slot_alloc_tagged(t, i, (kvr_key){i + 1, 7}, 0, 0, &tag, &e[i]), 0);
		cr_assert_eq(kvr_slot_model(t, i), model[i]);
	}
	for (uint32_t i = 0; i < 4; i++)
		if (i != 2)
			cr_assert_eq(kvr_slot_commit(t, i, e[i]), 0);
	uint64_t n[3] = {77, 77, 77};
	kvr_slots_model_counts(t, n, 3);
	cr_assert_eq(n[0], 1, "model 9 counts as other");
	cr_assert_eq(n[1], 2);
	cr_assert_eq(n[2], 0, "slot 2 of model 2 is still writing");
	cr_assert_eq(kvr_slot_evict(t, 0, e[0]), 0);
	cr_assert_eq(kvr_slot_model(t, 0), 0, "a freed slot keeps no model");
	kvr_slots_model_counts(t, n, 3);
	cr_assert_eq(n[1], 1);
}
