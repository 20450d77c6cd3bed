/* Slot table: layout, validation and the checked state transitions of L1 slots. */
#include "kvr_slots.h"

#include <errno.h>
#include <string.h>

#include "kvr_ctl.h"

/* the limits that travel together (kv/geometry.c): a pin counter per worker in every slot */
_Static_assert(KVR_CTL_MAX_WORKERS <= KVR_SLOT_MAX_WORKERS, "every worker slot has its pin counter in a slot");

#define SLOTS_OFF 256u /* slot array right after the 256-byte header (64-byte aligned) */

size_t kvr_slots_memsize(uint32_t n_slots)
{
	if (!n_slots)
		return 0;
	return SLOTS_OFF + (size_t)n_slots * sizeof(struct kvr_slot);
}

uint64_t kvr_slots_slot_bytes(uint64_t lane_bytes)
{
	if (lane_bytes > UINT64_MAX - (KVR_SLOT_ALIGN - 1))
		return 0;
	return (lane_bytes + KVR_SLOT_ALIGN - 1) & ~(uint64_t)(KVR_SLOT_ALIGN - 1);
}

uint64_t kvr_slots_arena_memsize(uint32_t n_slots, uint64_t lane_bytes)
{
	uint64_t sb = kvr_slots_slot_bytes(lane_bytes), r;
	if (!sb || __builtin_mul_overflow(sb, (uint64_t)n_slots, &r) ||
	    __builtin_add_overflow(r, (uint64_t)KVR_SLOTS_ARENA_DATA_OFF, &r))
		return 0;
	return r;
}

int kvr_slots_init(void *mem, size_t mem_size, const struct kvr_slots_config *cfg, struct kvr_slot_table **ret)
{
	if (!mem || !cfg || !ret || !cfg->n_slots || !cfg->lane_bytes || !cfg->tp_size ||
	    cfg->tp_size > KVR_SLOT_MAX_WORKERS || cfg->quorum > cfg->tp_size ||
	    cfg->arena_data_off % KVR_SLOT_ALIGN)
		return -EINVAL;
	uint64_t sb = kvr_slots_slot_bytes(cfg->lane_bytes);
	if (!sb)
		return -EINVAL;
	size_t need = kvr_slots_memsize(cfg->n_slots);
	if (!need || mem_size < need)
		return -ENOSPC;

	struct kvr_slot_table *t = mem;
	/* everything after the segment header: the header stays as kvr_segment_create wrote it */
	memset((uint8_t *)t + sizeof(t->seg), 0, need - sizeof(t->seg));
	t->n_slots = cfg->n_slots;
	t->block_tokens = cfg->block_tokens;
	t->slot_bytes = sb;
	t->arena_data_off = cfg->arena_data_off ? cfg->arena_data_off : KVR_SLOTS_ARENA_DATA_OFF;
	t->slots_off = SLOTS_OFF;
	t->ns = cfg->ns;
	t->tp_size = cfg->tp_size;
	t->quorum = cfg->quorum;
	atomic_store_explicit(&t->clock, 0, memory_order_relaxed);
	atomic_store_explicit(&t->commit_seq, 0, memory_order_relaxed);
	/* pairs with the acquire load in kvr_slots_attach */
	__atomic_store_n(&t->magic, KVR_SLOTS_MAGIC, __ATOMIC_RELEASE);
	*ret = t;
	return 0;
}

int kvr_slots_attach(const struct kvr_segment *seg, struct kvr_slot_table **ret)
{
	if (!seg || !seg->base || !ret)
		return -EINVAL;
	if (seg->size < sizeof(struct kvr_slot_table))
		return -EBADMSG;
	struct kvr_slot_table *t = seg->base;
	if (t->seg.kind != KVR_SEG_SLOTS)
		return -EMEDIUMTYPE;
	/* pairs with the release store in kvr_slots_init */
	if (__atomic_load_n(&t->magic, __ATOMIC_ACQUIRE) != KVR_SLOTS_MAGIC)
		return -EPROTO;
	if (!t->n_slots || t->slots_off < sizeof(*t) || t->slots_off % 64 || !t->slot_bytes ||
	    t->slot_bytes % KVR_SLOT_ALIGN || t->arena_data_off % KVR_SLOT_ALIGN || !t->tp_size ||
	    t->tp_size > KVR_SLOT_MAX_WORKERS || t->quorum > t->tp_size)
		return -EBADMSG;
	if (t->slots_off > seg->size || (seg->size - t->slots_off) / sizeof(struct kvr_slot) < t->n_slots)
		return -EBADMSG;
	*ret = t;
	return 0;
}

void *kvr_slot_data(const struct kvr_slot_table *t, void *arena_base, uint32_t i)
{
	if (!t || !arena_base || i >= t->n_slots)
		return NULL;
	return (uint8_t *)arena_base + t->arena_data_off + (uint64_t)i * t->slot_bytes;
}

uint64_t kvr_slots_tick(struct kvr_slot_table *t)
{
	return atomic_fetch_add_explicit(&t->clock, 1, memory_order_relaxed) + 1;
}

static inline void set_state(struct kvr_slot *s, uint32_t st)
{
	/* pairs with the acquire in kvr_slot_state(): the fields written before are visible */
	atomic_store_explicit(&s->state, st, memory_order_release);
}

static inline uint32_t get_state(const struct kvr_slot *s)
{
	return atomic_load_explicit(&s->state, memory_order_acquire);
}

static inline uint32_t get_epoch(const struct kvr_slot *s)
{
	return __atomic_load_n(&s->epoch, __ATOMIC_RELAXED);
}

static _Atomic uint8_t *pin_of(struct kvr_slot *s, unsigned owner)
{
	switch (owner) {
	case KVR_PIN_LOOKUP:
		return &s->lk_pins;
	case KVR_PIN_IO:
		return &s->io_pins;
	case KVR_PIN_REMOTE:
		return &s->rm_pins;
	default:
		return &s->pins[owner];
	}
}

static unsigned pin_sum(const struct kvr_slot *s)
{
	unsigned sum = 0;
	for (unsigned o = 0; o < KVR_PIN_OWNERS; o++)
		sum += atomic_load_explicit(pin_of((struct kvr_slot *)s, o), memory_order_acquire);
	return sum;
}

static bool any_pin(const struct kvr_slot *s)
{
	return pin_sum(s) != 0;
}

/* Back to FREE: the key and lane no longer mean anything. */
static void make_free(struct kvr_slot *s)
{
	set_state(s, KVR_SLOT_FREE);
	s->key = (kvr_key){0, 0};
	s->lane = 0;
	s->owner = 0;
	s->model = 0;
	s->block_tokens = 0;
	s->lanes = 0;
	s->last_access = 0;
	s->commit_seq = 0;
}

int kvr_slot_alloc_tagged(struct kvr_slot_table *t, uint32_t i, kvr_key key, uint16_t lane, uint8_t owner,
			  const struct kvr_slot_tag *tag, uint32_t *ret_epoch)
{
	if (!t || i >= t->n_slots || lane >= t->tp_size || (owner >= KVR_SLOT_MAX_WORKERS && owner != KVR_SLOT_OWNER_LOOKUP))
		return -EINVAL;
	struct kvr_slot *s = kvr_slot_at(t, i);
	if (get_state(s) != KVR_SLOT_FREE)
		return -EBUSY;
	uint32_t epoch = get_epoch(s) + 1;
	__atomic_store_n(&s->epoch, epoch, __ATOMIC_RELAXED);
	s->key = key;
	s->lane = lane;
	s->owner = owner;
	s->model = tag ? tag->model : 0;
	s->block_tokens = t->block_tokens || !tag ? t->block_tokens : tag->block_tokens;
	s->lanes = t->quorum || !tag ? 0 : tag->lanes;
	s->last_access = 0;
	s->commit_seq = 0;
	set_state(s, KVR_SLOT_WRITING); /* release: the fields above first */
	if (ret_epoch)
		*ret_epoch = epoch;
	return 0;
}

int kvr_slot_commit(struct kvr_slot_table *t, uint32_t i, uint32_t epoch)
{
	if (!t || i >= t->n_slots)
		return -EINVAL;
	struct kvr_slot *s = kvr_slot_at(t, i);
	if (get_state(s) != KVR_SLOT_WRITING || get_epoch(s) != epoch)
		return -ESTALE;
	s->last_access = kvr_slots_tick(t);
	s->commit_seq = atomic_fetch_add_explicit(&t->commit_seq, 1, memory_order_relaxed);
	set_state(s, KVR_SLOT_COMMITTED);
	return 0;
}

int kvr_slot_abort(struct kvr_slot_table *t, uint32_t i, uint32_t epoch)
{
	if (!t || i >= t->n_slots)
		return -EINVAL;
	struct kvr_slot *s = kvr_slot_at(t, i);
	if (get_state(s) != KVR_SLOT_WRITING || get_epoch(s) != epoch)
		return -ESTALE;
	set_state(s, KVR_SLOT_DRAINING);
	/* Pairs with the fence in pin_in_state(): a disk actor that took its I/O pin before it
	 * could see DRAINING is seen here, and the slot waits for its I/O. */
	atomic_thread_fence(memory_order_seq_cst);
	if (any_pin(s))
		return 1;
	make_free(s);
	return 0;
}

int kvr_slot_drained(struct kvr_slot_table *t, uint32_t i)
{
	if (!t || i >= t->n_slots)
		return -EINVAL;
	struct kvr_slot *s = kvr_slot_at(t, i);
	if (get_state(s) != KVR_SLOT_DRAINING)
		return -ESTALE;
	if (any_pin(s))
		return -EBUSY;
	make_free(s);
	return 0;
}

int kvr_slot_touch(struct kvr_slot_table *t, uint32_t i, uint64_t clock)
{
	if (!t || i >= t->n_slots)
		return -EINVAL;
	struct kvr_slot *s = kvr_slot_at(t, i);
	if (get_state(s) != KVR_SLOT_COMMITTED)
		return -ESTALE;
	s->last_access = clock;
	return 0;
}

/* pin `owner`++ if the slot is in `state` with `epoch`. */
static int pin_in_state(struct kvr_slot_table *t, uint32_t i, uint32_t epoch, unsigned owner, unsigned state)
{
	if (!t || i >= t->n_slots || owner >= KVR_PIN_OWNERS)
		return -EINVAL;
	struct kvr_slot *s = kvr_slot_at(t, i);
	if (get_state(s) != state || get_epoch(s) != epoch)
		return -ESTALE;
	_Atomic uint8_t *p = pin_of(s, owner);
	uint8_t v = atomic_load_explicit(p, memory_order_relaxed);
	do {
		if (v == UINT8_MAX)
			return -EOVERFLOW;
	} while (!atomic_compare_exchange_weak_explicit(p, &v, (uint8_t)(v + 1), memory_order_seq_cst,
							memory_order_relaxed));
	/* Pairs with the fences in kvr_slot_evict_begin() and kvr_slot_abort(): either we see
	 * the slot leave `state` (and back off), or the evictor / aborter sees our pin. */
	atomic_thread_fence(memory_order_seq_cst);
	if (get_state(s) != state || get_epoch(s) != epoch) {
		(void)kvr_slot_unpin(t, i, owner);
		return -ESTALE;
	}
	return 0;
}

int kvr_slot_pin(struct kvr_slot_table *t, uint32_t i, uint32_t epoch, unsigned owner)
{
	return pin_in_state(t, i, epoch, owner, KVR_SLOT_COMMITTED);
}

int kvr_slot_pin_io(struct kvr_slot_table *t, uint32_t i, uint32_t epoch, unsigned state)
{
	if (state != KVR_SLOT_WRITING && state != KVR_SLOT_COMMITTED)
		return -EINVAL;
	return pin_in_state(t, i, epoch, KVR_PIN_IO, state);
}

int kvr_slot_pin_remote(struct kvr_slot_table *t, uint32_t i, uint32_t epoch, unsigned state)
{
	if (state != KVR_SLOT_WRITING && state != KVR_SLOT_COMMITTED)
		return -EINVAL;
	return pin_in_state(t, i, epoch, KVR_PIN_REMOTE, state);
}

int kvr_slot_unpin(struct kvr_slot_table *t, uint32_t i, unsigned owner)
{
	if (!t || i >= t->n_slots || owner >= KVR_PIN_OWNERS)
		return -EINVAL;
	_Atomic uint8_t *p = pin_of(kvr_slot_at(t, i), owner);
	uint8_t v = atomic_load_explicit(p, memory_order_relaxed);
	do {
		if (!v)
			return -ENOENT;
		/* release: the pinner's accesses to the slot bytes happen before the slot may be
		 * evicted or freed (pairs with the acquire in any_pin()) */
	} while (!atomic_compare_exchange_weak_explicit(p, &v, (uint8_t)(v - 1), memory_order_release,
							memory_order_relaxed));
	return 0;
}

unsigned kvr_slot_drop_pins(struct kvr_slot_table *t, uint32_t i, unsigned owner)
{
	if (!t || i >= t->n_slots || owner >= KVR_PIN_OWNERS)
		return 0;
	return atomic_exchange_explicit(pin_of(kvr_slot_at(t, i), owner), 0, memory_order_acq_rel);
}

unsigned kvr_slot_pins_of(const struct kvr_slot_table *t, uint32_t i, unsigned owner)
{
	if (!t || i >= t->n_slots || owner >= KVR_PIN_OWNERS)
		return 0;
	return atomic_load_explicit(pin_of(kvr_slot_at(t, i), owner), memory_order_acquire);
}

unsigned kvr_slot_pins(const struct kvr_slot_table *t, uint32_t i)
{
	if (!t || i >= t->n_slots)
		return 0;
	return pin_sum(kvr_slot_at(t, i));
}

int kvr_slot_evict_begin(struct kvr_slot_table *t, uint32_t i, uint32_t epoch)
{
	if (!t || i >= t->n_slots)
		return -EINVAL;
	struct kvr_slot *s = kvr_slot_at(t, i);
	uint32_t st = get_state(s);
	if (st == KVR_SLOT_WRITING || st == KVR_SLOT_EVICTING)
		return -EBUSY;
	if (st != KVR_SLOT_COMMITTED || get_epoch(s) != epoch)
		return -ESTALE;
	if (any_pin(s))
		return -EBUSY;
	set_state(s, KVR_SLOT_EVICTING);
	/* Pairs with the fence in kvr_slot_pin(): a loader that pinned before it could see
	 * EVICTING is seen here, and the eviction is called off. */
	atomic_thread_fence(memory_order_seq_cst);
	if (any_pin(s)) {
		set_state(s, KVR_SLOT_COMMITTED);
		return -EBUSY;
	}
	return 0;
}

int kvr_slot_evict_cancel(struct kvr_slot_table *t, uint32_t i, uint32_t epoch)
{
	if (!t || i >= t->n_slots)
		return -EINVAL;
	struct kvr_slot *s = kvr_slot_at(t, i);
	if (get_state(s) != KVR_SLOT_EVICTING || get_epoch(s) != epoch)
		return -ESTALE;
	set_state(s, KVR_SLOT_COMMITTED);
	return 0;
}

int kvr_slot_evict(struct kvr_slot_table *t, uint32_t i, uint32_t epoch)
{
	if (!t || i >= t->n_slots)
		return -EINVAL;
	struct kvr_slot *s = kvr_slot_at(t, i);
	uint32_t st = get_state(s);
	if (st == KVR_SLOT_WRITING)
		return -EBUSY;
	if ((st != KVR_SLOT_COMMITTED && st != KVR_SLOT_EVICTING) || get_epoch(s) != epoch)
		return -ESTALE;
	if (st == KVR_SLOT_COMMITTED) {
		int rc = kvr_slot_evict_begin(t, i, epoch);
		if (rc)
			return rc;
	} else if (any_pin(s)) {
		return -EBUSY;
	}
	make_free(s);
	return 0;
}

int kvr_slots_release_worker(struct kvr_slot_table *t, unsigned w, struct kvr_slots_release *ret)
{
	if (!t || w >= KVR_SLOT_MAX_WORKERS)
		return -EINVAL;
	struct kvr_slots_release r = {0};
	for (uint32_t i = 0; i < t->n_slots; i++) {
		struct kvr_slot *s = kvr_slot_at(t, i);
		uint8_t had = atomic_exchange_explicit(&s->pins[w], 0, memory_order_acq_rel);
		if (had) {
			r.unpinned_slots++;
			r.pins += had;
		}
		if (get_state(s) == KVR_SLOT_WRITING && s->owner == w) {
			int rc = kvr_slot_abort(t, i, get_epoch(s));
			r.aborted += rc >= 0;
			r.draining += rc == 1;
		}
	}
	if (ret)
		*ret = r;
	return 0;
}

void kvr_slots_counts(const struct kvr_slot_table *t, struct kvr_slot_counts *ret)
{
	struct kvr_slot_counts c = {0};
	for (uint32_t i = 0; t && i < t->n_slots; i++) {
		const struct kvr_slot *s = kvr_slot_at(t, i);
		uint32_t st = get_state(s);
		unsigned p = kvr_slot_pins(t, i);
		c.pins += p;
		if (st >= KVR_SLOT_STATE_MAX) {
			c.invalid++;
			continue;
		}
		c.by_state[st]++;
		if (st == KVR_SLOT_COMMITTED && p)
			c.reading++;
	}
	*ret = c;
}

const char *kvr_slot_state_name(unsigned s)
{
	switch (s) {
	case KVR_SLOT_FREE:
		return "free";
	case KVR_SLOT_WRITING:
		return "writing";
	case KVR_SLOT_COMMITTED:
		return "committed";
	case KVR_SLOT_EVICTING:
		return "evicting";
	case KVR_SLOT_DRAINING:
		return "draining";
	default:
		return "invalid";
	}
}

void kvr_slots_model_counts(const struct kvr_slot_table *t, uint64_t *ret, unsigned n)
{
	memset(ret, 0, n * sizeof(*ret));
	for (uint32_t i = 0; n && i < t->n_slots; i++)
		if (kvr_slot_state(t, i) == KVR_SLOT_COMMITTED) {
			unsigned m = kvr_slot_model(t, i);
			ret[m < n ? m : 0]++;
		}
}
