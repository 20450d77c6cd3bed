/* kvr_ring_names: the names of the control segment's rings, the one place they are spelled. */
#ifndef KVR_RING_NAMES_H
#define KVR_RING_NAMES_H

/*
 * Every ring kvringd lays out (supervisor/layout.c, sup_ring_specs()) is found by name in
 * the control segment's ring directory (kvr_ctl_find_ring(), kvr_actor_ring()), so the
 * layout, the actors and libkvring must spell each name alike: these are printf formats
 * (string literals, so -Wformat checks every use) that take the argument in the comment.
 * A formatted name fits KVR_RING_NAME_MAX (kvr_ring.h). The names are part of the wire
 * contract kvring-inspect, /metrics and /status show; renaming one breaks dashboards.
 *
 * One ring per direction per edge; producer -> consumer, as layout.c binds them.
 */

/* Per worker slot w (unsigned). */
#define KVR_RING_LOOKUP_REQ "lookup.req.%u" /* worker w's client -> the lookup actor: LOOKUP, LEASE_TAKE */
#define KVR_RING_LOOKUP_REP "lookup.rep.%u" /* the lookup actor -> worker w's client */
#define KVR_RING_LOAD_REQ "load.req.%u"     /* worker w's client -> loader w: LOAD */
#define KVR_RING_LOAD_REP "load.rep.%u"     /* loader w -> worker w's client */
#define KVR_RING_STORE_REQ "store.req.%u"   /* worker w's client -> storer w, or its DCP group's gather actor */
#define KVR_RING_STORE_REP "store.rep.%u"   /* storer w, or its DCP group's gather actor -> worker w's client */
#define KVR_RING_COMMIT_REQ "commit.req.%u" /* storer w, or the gather actor w owns -> the lookup actor: ALLOC, COMMIT */
#define KVR_RING_COMMIT_REP "commit.rep.%u" /* the lookup actor -> storer w, or the gather actor w owns */

/* Per scheduler slot i (unsigned; client slot max_workers + i). */
#define KVR_RING_SCHED_REQ "sched.req.%u" /* scheduler i's client -> the lookup actor: lookups, leases */
#define KVR_RING_SCHED_REP "sched.rep.%u" /* the lookup actor -> scheduler i's client */

/* Per L2 directory d (unsigned). */
#define KVR_RING_DISK_REQ "disk.req.%u" /* the lookup actor -> disk actor d */
#define KVR_RING_DISK_REP "disk.rep.%u" /* disk actor d -> the lookup actor: answers and notices */

/* The shared tier (remote.cluster set): one remote actor, no argument. */
#define KVR_RING_REMOTE_REQ "remote.req" /* the lookup actor -> the remote actor */
#define KVR_RING_REMOTE_REP "remote.rep" /* the remote actor -> the lookup actor */

/* Per actor, by its name ("lookup", "loader.0", "disk.1", "gather.0", "remote"; a string). */
#define KVR_RING_CTL_IN "ctl.%s.in"   /* kvringd -> the actor: PING, STOP, WORKER_GONE, ... */
#define KVR_RING_CTL_OUT "ctl.%s.out" /* the actor -> kvringd: PONG */

#endif
