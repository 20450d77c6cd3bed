/* remote.h: the remote actor's state and what its files (remote.c, rconn.c, rmap.c, rtier.c) call of each other. */
#ifndef KVR_REMOTE_H
#define KVR_REMOTE_H

#include <stdbool.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

#include <kvring/msg.h>

#include "kvr_actor.h"
#include "kvr_backlog.h"
#include "kvr_outbox.h"
#include "rcluster.h"
#include "resp.h"
#include "rvalue.h"

/*
 * Private to kvring-remote. Where to start reading: remote.c (what the actor does, its stage
 * callbacks, init and exit), then rtier.c (one request of the lookup actor, from its message
 * to its answer), rconn.c (the connections its commands travel on) and rmap.c (which master
 * a key goes to). Everything runs on the actor's one thread: nothing here locks.
 */

#define RM_NONE 0xffffffffu
#define RM_READ_CHUNK (256u << 10) /* socket reads of replies that are not streamed */

/* What a GET's streamed value did (resp.h streams it while the reply is read). */
enum { LAND_NONE = 0, LAND_OK = 1, LAND_BAD = 2, LAND_STALE = 3, LAND_SKIP = 4 };

enum node_state { N_DOWN = 0, N_CONNECTING = 1, N_UP = 2 };

/* The replies one queued command block expects, in order. */
enum rkind { K_ASKING = 1, K_EXISTS, K_GET, K_SET, K_AUTH, K_SLOTS };

/* ASKING + EXISTS of every lane + GET, or the head of a SET, formatted in RESP. */
#define RM_PRE_MAX (64u + (KVR_CTL_MAX_WORKERS + 2u) * (KVR_RV_KEY_MAX + 16u))

/*
 * One block of commands in a node's output queue: pre, then (a SET) the value's header,
 * its payload straight from the slot and post. It stays queued, in order, until its last
 * reply is in (a pipeline answers in order, so the queue is also the list of replies to
 * come); `off` bytes of it are written.
 */
struct rout {
	struct rout *next;
	uint32_t req;             /* its request, RM_NONE for the node's own (AUTH, CLUSTER SLOTS) */
	uint8_t kinds[3], n_kinds, got;
	bool pinned;              /* a SET: KVR_PIN_REMOTE on slot until its payload is written */
	uint32_t slot;
	uint64_t len, off;
	const void *payload;
	uint64_t payload_len;
	struct kvr_rv_hdr hdr;
	uint16_t pre_len, post_len;
	char post[64];
	char pre[RM_PRE_MAX];
};

struct rnode {
	struct remote *r;         /* its actor (the resp callbacks and the fd watch get only the node) */
	int fd;                   /* -1: no connection */
	int watch;                /* runtime fd watch of fd, -1 */
	uint32_t events;
	enum node_state st;
	uint64_t since_ns;        /* CONNECTING since */
	uint64_t retry_ns;        /* DOWN: no connect before */
	uint32_t backoff_ms;
	bool timed_out;           /* being closed for a request past its deadline */
	int broken;               /* -errno: the connection failed where it could not be closed (a
				   * write from a callback); closed at the end of the callback or tick */
	struct rout *head, *wr, *tail; /* queue: head awaits replies, wr is the first not written */
	struct kvr_resp rx;
	uint32_t sink;            /* the request whose GET value is streaming, RM_NONE */
	uint64_t sink_off, sink_len;
	struct rout auth, slots;
};

struct rreq {
	uint16_t type;            /* KVR_MSG_L2_READ / KVR_MSG_L2_WRITE; 0 = free */
	uint16_t lane;
	uint32_t slot, epoch;
	uint64_t req_id;
	kvr_key key;
	unsigned node;
	uint64_t first_ns;        /* when the request was taken */
	uint64_t sent_ns;         /* when its commands went to node */
	uint32_t gen;             /* bumped per send and end: stale privdata is told apart */
	uint8_t redirects;
	uint8_t lanes;            /* a read: lanes of its block (its slot's), every one must be in the tier */
	bool asking;
	bool parked;              /* no usable node for it yet: sent again from the tick until
				   * timeout_ms after first_ns (a failover, a map being refreshed) */
	bool queued;              /* out is in a node's queue */
	long long exists;         /* EXISTS answer of this send, -1 none */
	uint8_t landed;           /* LAND_*: what the streamed value did */
	uint8_t reason;           /* LAND_BAD: enum kvr_rv_reason */
	uint32_t next_free;
	struct kvr_rv_hdr vhdr;   /* a GET's value header, as it arrived */
	struct rout out;
};

struct remote {
	struct kvr_actor *a;
	struct kvr_slot_table *slots;
	struct kvr_ring *in, *out;
	struct kvr_l2_ident id;
	unsigned lanes;
	char ttl[16];             /* "" = no EX */
	uint64_t timeout_ns, send_timeout_ns;
	struct kvr_rc_map map;
	struct rnode nodes[KVR_RC_MAX_NODES];
	unsigned n_seeds;         /* nodes[0..n_seeds) are remote.cluster's seeds */
	struct rreq *reqs;
	unsigned n_reqs, inflight;
	uint32_t free_req;
	bool refreshing;
	unsigned refresh_node;
	uint64_t next_refresh_ns;
	unsigned seed_rr;
	struct kvr_backlog wait;  /* requests that found every request slot in use */
	struct kvr_outbox out_q;  /* answers that found remote.rep full: no handler waits for room */
	uint64_t set_refusals;    /* SETs the cluster refused since the last "SET refused" line */
	uint64_t set_logged_ns;   /* that line (log_due: at most one a second) ... */
	uint64_t bad_logged_ns;   /* ... and the last "value refused" line */
	bool closing;             /* fini: nothing is parked any more */
	bool map_dirty;           /* publish(): recount masters and covered slots */
	redisReader *reader;      /* parses the replies that are not streamed */
	char rbuf[RM_READ_CHUNK];
	bool is_master[KVR_RC_MAX_NODES];
	unsigned covered;
	uint8_t *mapped;          /* a bit per slot: its pages are in this process's page tables */
};

/* A counter of the actor's stats page. */
static inline void rm_count(struct remote *r, unsigned s, uint64_t by)
{
	kvr_actor_count(r->a, s, by);
}

/* The map changed (CLUSTER SLOTS, MOVED): rm_publish() looks at its 16384 slots again. */
static inline void rm_map_changed(struct remote *r)
{
	r->map_dirty = true;
}

/* ---- remote.c: the actor ------------------------------------------------------------------ */

/* The gauges (masters, masters up, requests in flight, slots covered) to the stats page. */
void rm_publish(struct remote *r);

/* ---- rconn.c: connections to the cluster's nodes ------------------------------------------ */

/* Every node slot without a connection, its reply framer ready (at init). */
void rm_nodes_init(struct remote *r);

/* Node ni with a connection (maybe still connecting: commands queue until it is up), or
 * NULL: none, and its backoff has not passed or the connect failed at once. */
struct rnode *rm_node_ctx(struct remote *r, unsigned ni);

/* Queue e (its pre/post/payload set) on node n and write what can be written now. A write
 * error marks the node broken; rm_settle() closes it. */
void rm_node_push(struct remote *r, struct rnode *n, struct rout *e);

/* Drop node ni's connection: every request queued there gets its reply as NULL
 * (rm_req_reply: parked while its time is not up, else failed), pins of unwritten SETs go.
 * timed_out: closed for a request past its deadline (those are not parked). */
void rm_node_down(struct remote *r, unsigned ni, bool timed_out);

/* Close the connections that broke where they could not be closed (while sending). */
void rm_settle(struct remote *r);

/* One command formatted by hiredis (redisFormatCommandArgv), appended to buf at *at; false
 * when it does not fit RM_PRE_MAX (it always does: keys and config strings are bounded). */
bool rm_fmt_cmd(char *buf, uint16_t *at, unsigned argc, const char *const *argv, const size_t *argl);

/* e as the node's own command (AUTH, CLUSTER SLOTS) of reply kind, argv of at most 4. */
void rm_ctl_cmd(struct rout *e, uint8_t kind, unsigned argc, const char *const *argv);

/* ---- rmap.c: the slot map ----------------------------------------------------------------- */

/* At start, before readiness: ask the seeds in turn for the map (blocking, timeout_ms each). */
void rm_discover(struct remote *r);

/* Ask a node for the slot map when due (RM_REFRESH_NS, or sooner: rm_refresh_soon, a node
 * lost, a MOVED); the answer comes to rm_on_slots. */
void rm_refresh(struct remote *r, uint64_t now);
void rm_refresh_soon(struct remote *r);

/* Node n's CLUSTER SLOTS reply (NULL: the connection went first). */
void rm_on_slots(struct remote *r, struct rnode *n, const redisReply *rp);

/* Where the key name's hash slot lives: a node index, or RM_NONE (no master for it). */
unsigned rm_route(struct remote *r, const char *name, size_t len);

/* ---- rtier.c: the tier's requests ---------------------------------------------------------- */

/* kvr_backlog's start (ctx: the remote): an L2_READ / L2_WRITE that on_msg decoded. 0 when
 * started or answered, -EAGAIN when every request slot is in use. */
int rm_req_start(void *ctx, const struct kvr_msg *m);

/* Send request i (again), or park it while no node can take it (retried from the tick
 * until timeout_ms after it was taken), or end it. */
void rm_send_or_park(struct remote *r, uint32_t i);

/* Request i ends with err (a read is answered, a write counted). */
void rm_req_fail(struct remote *r, uint32_t i, int err);

/* READ_DONE of q with status to the lookup actor (queued when remote.rep is full). */
void rm_send_read_done(struct remote *r, const struct rreq *q, int status);

/* A reply (NULL: the connection went first) of kind (K_ASKING, K_EXISTS, K_GET, K_SET) for
 * request req. */
void rm_req_reply(struct remote *r, uint32_t req, uint8_t kind, const redisReply *rp);

/* The resp streaming callbacks of a GET's value (ctx: its node; resp.h): into its slot,
 * the header checked before the first payload byte lands. rm_get_end: the value is all in. */
bool rm_get_begin(void *ctx, uint64_t len);
void *rm_get_dest(void *ctx, size_t *room);
void rm_get_wrote(void *ctx, size_t len);
void rm_get_end(struct rnode *n);

#endif
