/* Transfer dispatch: backend selection, argument and range validation, tickets and totals. */
#include "kvr_xfer.h"

#include <errno.h>
#include <stdlib.h>

/* ---- CUDA backend -------------------------------------------------------------------------
 * xfer/cuda.c defines kvr_xfer_cuda_backend; xfer/meson.build compiles it with
 * -DKVR_XFER_HAVE_CUDA when the toolkit is found. The dispatch below validates runs and
 * tickets the same way for every backend. */
#ifdef KVR_XFER_HAVE_CUDA
extern const struct kvr_xfer_backend kvr_xfer_cuda_backend;
#endif

enum { T_FREE = 0, T_INFLIGHT, T_DONE };

struct ticket_slot {
	uint64_t ticket; /* 0 when free */
	int state;
	int status;      /* T_DONE: 0 or the copy's -errno */
	struct kvr_xfer_stats stats;
};

struct kvr_xfer {
	const struct kvr_xfer_backend *be;
	void *priv;
	uint64_t kv_size;
	uint64_t arena_size;
	uint64_t seq;        /* tickets are seq * KVR_XFER_MAX_INFLIGHT + slot */
	uint64_t free_mask;  /* bit i set: slot i free */
	struct ticket_slot slots[KVR_XFER_MAX_INFLIGHT];
	struct kvr_xfer_totals totals;
};
_Static_assert(KVR_XFER_MAX_INFLIGHT == 64, "free_mask is one 64-bit word");

const struct kvr_xfer_backend *kvr_xfer_backend_for(uint32_t kind)
{
	switch (kind) {
	case KVR_XFER_MEM_HOST:
		return &kvr_xfer_host_backend;
#ifdef KVR_XFER_HAVE_CUDA
	case KVR_XFER_MEM_CUDA:
		return &kvr_xfer_cuda_backend;
#endif
	default:
		return NULL;
	}
}

int kvr_xfer_open(const struct kvr_xfer_kvmem *kv, const struct kvr_xfer_arena *arena, struct kvr_xfer **ret)
{
	const struct kvr_xfer_backend *be;
	struct kvr_xfer *x;
	int rc;

	if (!kv || !arena || !ret || !arena->base || arena->size == 0 || kv->size == 0 || kv->reserved != 0)
		return -EINVAL;
	if (kv->kind != KVR_XFER_MEM_HOST && kv->kind != KVR_XFER_MEM_CUDA)
		return -EINVAL;
	be = kvr_xfer_backend_for(kv->kind);
	if (!be)
		return -EOPNOTSUPP;

	x = calloc(1, sizeof(*x));
	if (!x)
		return -ENOMEM;
	rc = be->open(kv, arena, &x->priv);
	if (rc < 0) {
		free(x);
		return rc;
	}
	x->be = be;
	x->kv_size = kv->size;
	x->arena_size = arena->size;
	x->seq = 1;
	x->free_mask = ~0ull;
	*ret = x;
	return 0;
}

int kvr_xfer_mapping(const struct kvr_xfer *x, void **ret_base, size_t *ret_len)
{
	if (!x || !x->be->mapping)
		return -EOPNOTSUPP;
	return x->be->mapping(x->priv, ret_base, ret_len);
}

void kvr_xfer_close(struct kvr_xfer *x)
{
	if (!x)
		return;
	for (uint32_t i = 0; i < KVR_XFER_MAX_INFLIGHT; i++) {
		struct kvr_xfer_stats st;
		if (x->slots[i].state == T_INFLIGHT)
			(void) x->be->wait(x->priv, i, -1, &st);
	}
	x->be->close(x->priv);
	free(x);
}

static int runs_in_range(const struct kvr_xfer *x, const struct kvr_xfer_run *runs, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		const struct kvr_xfer_run *r = &runs[i];
		if (r->len == 0 || r->kv_off > x->kv_size || r->len > x->kv_size - r->kv_off ||
		    r->slot_off > x->arena_size || r->len > x->arena_size - r->slot_off)
			return 0;
	}
	return 1;
}

int kvr_xfer_submit(struct kvr_xfer *x, uint32_t dir, const struct kvr_xfer_run *runs, size_t n,
		    const struct kvr_xfer_dep *ready, uint64_t *ret_ticket)
{
	static const struct kvr_xfer_dep no_dep = { .kind = KVR_XFER_DEP_NONE };
	struct kvr_xfer_stats st = { 0 };
	struct ticket_slot *t;
	uint32_t slot;
	int rc;

	if (!x || !ret_ticket || (n > 0 && !runs))
		return -EINVAL;
	if (dir != KVR_XFER_KV_TO_SLOT && dir != KVR_XFER_SLOT_TO_KV)
		return -EINVAL;
	if (!ready)
		ready = &no_dep;
	if (ready->kind > KVR_XFER_DEP_CUDA_IPC_EVENT || ready->len > KVR_XFER_DEP_BLOB ||
	    (ready->kind == KVR_XFER_DEP_NONE && ready->len != 0))
		return -EINVAL;
	if (!runs_in_range(x, runs, n))
		return -ERANGE;
	if (x->free_mask == 0)
		return -EBUSY;

	slot = (uint32_t)__builtin_ctzll(x->free_mask);
	if (n == 0) {
		rc = 1;
	} else {
		rc = x->be->submit(x->priv, slot, dir, runs, n, ready, &st);
		if (rc < 0)
			return rc;
	}

	t = &x->slots[slot];
	t->ticket = x->seq++ * KVR_XFER_MAX_INFLIGHT + slot;
	t->state = rc == 1 ? T_DONE : T_INFLIGHT;
	t->status = 0;
	t->stats = rc == 1 ? st : (struct kvr_xfer_stats){ 0 };
	x->free_mask &= ~(1ull << slot);
	x->totals.submitted++;
	*ret_ticket = t->ticket;
	return 0;
}

static struct ticket_slot *find(struct kvr_xfer *x, uint64_t ticket)
{
	struct ticket_slot *t;

	if (!x || ticket == 0)
		return NULL;
	t = &x->slots[ticket % KVR_XFER_MAX_INFLIGHT];
	return t->state != T_FREE && t->ticket == ticket ? t : NULL;
}

/* Retire a finished ticket: hand out its result and free its slot. */
static int reap(struct kvr_xfer *x, struct ticket_slot *t, int status, const struct kvr_xfer_stats *st,
		struct kvr_xfer_stats *ret_stats)
{
	uint32_t slot = (uint32_t)(t - x->slots);

	if (status == 0) {
		x->totals.completed++;
		x->totals.sum.bytes += st->bytes;
		x->totals.sum.runs += st->runs;
		x->totals.sum.copies += st->copies;
		x->totals.sum.queue_ns += st->queue_ns;
		x->totals.sum.copy_ns += st->copy_ns;
		if (ret_stats)
			*ret_stats = *st;
	} else {
		x->totals.failed++;
	}
	*t = (struct ticket_slot){ 0 };
	x->free_mask |= 1ull << slot;
	return status;
}

static int finish(struct kvr_xfer *x, uint64_t ticket, int64_t timeout_ns, int blocking,
		  struct kvr_xfer_stats *ret_stats)
{
	struct ticket_slot *t = find(x, ticket);
	struct kvr_xfer_stats st = { 0 };
	uint32_t slot;
	int rc;

	if (!t)
		return -ENOENT;
	if (t->state == T_DONE)
		return reap(x, t, t->status, &t->stats, ret_stats);

	slot = (uint32_t)(t - x->slots);
	rc = blocking ? x->be->wait(x->priv, slot, timeout_ns, &st) : x->be->poll(x->priv, slot, &st);
	if (rc == -EAGAIN || rc == -ETIMEDOUT)
		return rc;
	return reap(x, t, rc, &st, ret_stats);
}

int kvr_xfer_poll(struct kvr_xfer *x, uint64_t ticket, struct kvr_xfer_stats *ret_stats)
{
	return finish(x, ticket, 0, 0, ret_stats);
}

int kvr_xfer_wait(struct kvr_xfer *x, uint64_t ticket, int64_t timeout_ns, struct kvr_xfer_stats *ret_stats)
{
	return finish(x, ticket, timeout_ns, 1, ret_stats);
}

unsigned kvr_xfer_inflight(const struct kvr_xfer *x)
{
	return x ? KVR_XFER_MAX_INFLIGHT - (unsigned)__builtin_popcountll(x->free_mask) : 0;
}

void kvr_xfer_get_totals(const struct kvr_xfer *x, struct kvr_xfer_totals *ret)
{
	if (x && ret)
		*ret = x->totals;
}

const char *kvr_xfer_backend_name(const struct kvr_xfer *x)
{
	return x ? x->be->name : "";
}
