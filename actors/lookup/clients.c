/* clients: what the lookup actor knows of a client entry — its model, its block size (clients.h). */
#include "clients.h"

#include <stdatomic.h>


static const struct kvr_worker_ent *entry(const struct kvr_actor *a, unsigned client)
{
	return client < a->ctl->max_workers + a->ctl->max_schedulers ? kvr_ctl_worker(a->ctl, client) : NULL;
}

struct kvr_model_ent *lk_client_model(const struct kvr_actor *a, unsigned client)
{
	const struct kvr_worker_ent *e = entry(a, client);
	struct kvr_model_ent *m = e ? kvr_ctl_model(a->ctl, e->model) : NULL;
	return m ? m : kvr_ctl_model(a->ctl, KVR_CTL_MODEL_OTHER);
}

uint64_t lk_client_block_tokens(const struct kvr_actor *a, unsigned client)
{
	const struct kvr_worker_ent *e = entry(a, client);
	if (e && e->block_tokens)
		return e->block_tokens;
	return a->slots->block_tokens ? a->slots->block_tokens : 1;
}

unsigned lk_client_lanes(const struct kvr_actor *a, unsigned client)
{
	const struct kvr_worker_ent *e = entry(a, client);
	if (a->slots->quorum)
		return a->slots->quorum;
	return e ? e->lanes : 0; /* 0: not known, nothing is served */
}

struct kvr_slot_tag lk_client_tag(const struct kvr_actor *a, unsigned client)
{
	const struct kvr_worker_ent *e = entry(a, client);
	return (struct kvr_slot_tag){
		.block_tokens = e ? e->block_tokens : 0,
		.lanes = (uint8_t)lk_client_lanes(a, client),
		.model = e ? e->model : KVR_CTL_MODEL_OTHER,
	};
}

void lk_client_count(struct kvr_actor *a, unsigned client, uint64_t lookups, uint64_t keys, uint64_t matched)
{
	struct kvr_model_ent *m = lk_client_model(a, client);
	uint64_t bt = lk_client_block_tokens(a, client);
	atomic_fetch_add_explicit(&m->lookups, lookups, memory_order_relaxed);
	atomic_fetch_add_explicit(&m->keys, keys, memory_order_relaxed);
	atomic_fetch_add_explicit(&m->matched, matched, memory_order_relaxed);
	atomic_fetch_add_explicit(&m->tokens_asked, keys * bt, memory_order_relaxed);
	atomic_fetch_add_explicit(&m->tokens_matched, matched * bt, memory_order_relaxed);
	kvr_actor_count(a, KVR_STAT_LK_TOKENS_ASKED, keys * bt);
	kvr_actor_count(a, KVR_STAT_LK_TOKENS_MATCHED, matched * bt);
}

void lk_models_publish_l2(struct kvr_actor *a, const uint64_t *by_model, unsigned unknown)
{
	for (unsigned i = 0; i <= KVR_CTL_MAX_MODELS; i++)
		atomic_store_explicit(&kvr_ctl_model(a->ctl, i)->l2_lanes, by_model[i], memory_order_relaxed);
	uint64_t none = by_model[unknown];
	for (unsigned i = KVR_CTL_MAX_MODELS + 1; i < 256; i++)
		none += i == unknown ? 0 : by_model[i]; /* none: slots carry model entries only */
	atomic_store_explicit(&a->stats->c[KVR_STAT_LK_L2_UNATTRIBUTED], none, memory_order_relaxed);
}
