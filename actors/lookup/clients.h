/* clients: what the lookup actor knows of a client entry — its model, its block size — for the slots it allocates and the counts it keeps. */
#ifndef KVR_LOOKUP_CLIENTS_H
#define KVR_LOOKUP_CLIENTS_H

#include <stdint.h>

#include "kvr_actor.h"
#include "kvr_slots.h"

/*
 * A client is a worker slot (0..max_workers-1) or max_workers + a scheduler slot: its entry
 * (kvr_ctl_worker) carries its engine's model entry and block size, written by kvringd
 * before the entry is ATTACHED. An index past the last scheduler is nobody: model "other",
 * the instance's block size.
 */

/* The model entry of client (its engine's; entry 0 "other" past KVR_CTL_MAX_MODELS). */
struct kvr_model_ent *lk_client_model(const struct kvr_actor *a, unsigned client);
/* Tokens a block of client's engine (without a model section engines of several block
 * sizes share the instance; with one, the instance's). */
uint64_t lk_client_block_tokens(const struct kvr_actor *a, unsigned client);
/* Lanes a block of client's engine (its commit quorum; engines of several TP sizes share an
 * instance without a model section; with one, the instance's). */
unsigned lk_client_lanes(const struct kvr_actor *a, unsigned client);
/* What a slot allocated for client (a store, or a promotion it asked for) records: its
 * engine's model, block size and lanes (kvr_index_alloc_tagged). */
struct kvr_slot_tag lk_client_tag(const struct kvr_actor *a, unsigned client);
/* What client asked for and matched into its model's entry (lookups, blocks and tokens) and
 * the instance's token counters (the block counters KVR_STAT_LK_KEYS and _MATCHED are
 * counted where they happen). */
void lk_client_count(struct kvr_actor *a, unsigned client, uint64_t lookups, uint64_t keys, uint64_t matched);
/* Each model's lanes on disk (by_model[m], m a model entry or the byte `unknown` for files
 * of no known model yet; 256 entries) into the model table's l2_lanes and the gauge
 * KVR_STAT_LK_L2_UNATTRIBUTED (kvring-inspect's models table, /metrics). */
void lk_models_publish_l2(struct kvr_actor *a, const uint64_t *by_model, unsigned unknown);

#endif
