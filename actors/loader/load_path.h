/* load_path: the load path the loader runs (LOAD -> pin, copy, unpin -> LOAD_DONE). */
#ifndef KVR_LOAD_PATH_H
#define KVR_LOAD_PATH_H

#include <stdint.h>

#include "stage_common.h"

/* ---- the load path (load_path.c): LOAD -> pin, copy slots to KV, unpin -> LOAD_DONE ----- */

struct stage_load {
	struct kvr_list_asm req;
	uint32_t *blocks;          /* engine block ids to copy */
	uint64_t *slot_offs;       /* their slots' arena offsets */
	uint32_t *slots;           /* pinned slot indices */
	uint32_t *failed;          /* block ids not restored */
	uint32_t cap;
};

void stage_load_init(struct stage_load *ld);
void stage_load_fini(struct stage_load *ld);
/* Drop every pin of sw's worker (a previous incarnation died holding them: its loads were
 * failed by the client when it saw the restart). Returns how many. */
unsigned stage_drop_pins(struct stage_worker *sw);
/* Feed one message of sw->req; a complete LOAD is executed and answered on sw->rep.
 * 0, or -EBADMSG (the runtime counts it). */
int stage_load_feed(struct stage_worker *sw, struct stage_load *ld, const struct kvr_msg *m);

#endif
