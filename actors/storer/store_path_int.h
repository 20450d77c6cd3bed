/* store_path_int: what store_path.c (a store's lane, replies, checks) and store_pipe.c (the pipe) share. */
#ifndef KVR_STORE_PATH_INT_H
#define KVR_STORE_PATH_INT_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>

#include "kvr_time.h"
#include "store_path.h"

#define LOOKUP_TIMEOUT_NS(a) kvr_ms_to_ns((a)->cfg.timeouts.lookup_call_ms)
#define AWAIT_SLICE_NS 20000000 /* re-check the lookup actor's generation this often while waiting */

/* A fence's error (stage_fence): the store was cancelled, or its worker detached or died. */
static inline bool stage_store_fenced(int rc)
{
	return rc == -ECANCELED || rc == -ESHUTDOWN || rc == -EOWNERDEAD;
}

static inline const char *stage_store_fence_why(int rc)
{
	return rc == -ECANCELED ? "cancelled" : rc == -ESHUTDOWN ? "its worker detached" : "its worker died";
}

/* STORE_DONE of rq with its counts, copy stats (st may be NULL) and the failed block ids;
 * queue_us is the time from its arrival to start_ns (0: now), when its store began. */
void stage_store_send_done(struct stage_worker *sw, const struct stage_store_req *rq, int status, uint32_t stored,
			   uint32_t present, const uint32_t *failed, uint32_t n_failed, const struct kvr_xfer_stats *st,
			   uint64_t start_ns);

/* Checks before anything is allocated: 0, or the status that fails every rank. Fills
 * ready[r] / readyp[r] with rank r's producer event (CUDA). */
int stage_store_check(struct stage_store *ss, struct stage_worker *const *sw, const struct stage_store_req *rq,
		      unsigned n_ranks, struct kvr_xfer_dep *ready, const struct kvr_xfer_dep **readyp);

/* Sort an ALLOC_REP of n keys: the slots to copy (written[], their positions pos[], arena
 * offsets slot_offs[]), PRESENT keys (counted; their positions in pres_pos[] unless NULL),
 * and positions not stored (NOROOM, or a slot out of range: fail_pos[]). */
void stage_store_sort_alloc(const struct kvr_slot_table *t, const struct kvr_msg_slot *alloc, uint32_t n,
			    struct kvr_msg_slot *written, uint32_t *pos, uint64_t *slot_offs, uint32_t *fail_pos,
			    uint32_t *pres_pos, uint32_t *ret_copy, uint32_t *ret_present, uint32_t *ret_fail);

/* After a COMMIT_REP reporting `reported` of the n_copy slots committed: how many did
 * (written[k] at position pos[k]); the positions of the others are appended to
 * fail_pos[*n_fail...]. The slot table decides only when the count is short. */
uint32_t stage_store_commit_outcome(const struct kvr_slot_table *t, const struct kvr_msg_slot *written,
				    const uint32_t *pos, uint32_t n_copy, uint32_t reported, uint32_t *fail_pos,
				    uint32_t *n_fail);

#endif
