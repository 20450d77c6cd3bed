/* kvr_disk_stats: the disk actor's stage counters on its stats page (kvr_actor_count indices). */
#ifndef KVR_DISK_STATS_H
#define KVR_DISK_STATS_H

#include "kvr_ctl.h"

/*
 * Indices from KVR_STAT_FIRST_STAGE, as the lookup and transfer actors' counters in
 * kvr_ctl.h; meaningful on an actor entry of kind KVR_ACTOR_DISK only. Each is summed over
 * the actor's starts (a restarted disk actor adds its own adoption again).
 */
enum kvr_stat_disk {
	KVR_STAT_DK_ADOPTED = KVR_STAT_FIRST_STAGE, /* files adopted into the index at start */
	KVR_STAT_DK_LEFT_IN_PLACE,    /* l2.read_only: files adoption skipped and did not remove
				       * (tmp leftovers, bad files, foreign lanes, over the cap) */
	KVR_STAT_DK_WRITES_REFUSED,   /* l2.read_only: L2_WRITEs answered -EROFS (no I/O issued) */
	KVR_STAT_DK_BAD_KEPT,         /* l2.read_only: reads that found a bad file: a miss, the
				       * file left on disk */
	KVR_STAT_DK_NEXT,
};
_Static_assert((int)KVR_STAT_DK_NEXT <= (int)KVR_STAT_MAX, "disk counters fit the stats");

#endif
