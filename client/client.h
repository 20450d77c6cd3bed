/* client: what libkvring's two files share (private to client/): the client object and its pending
 * requests; client.c attaches, watches kvringd and the actors, and detaches; requests.c sends lookups,
 * leases, loads and stores and assembles their completions. */
#ifndef KVR_CLIENT_H
#define KVR_CLIENT_H

#include <kvring/kvring.h>
#include <kvring/msg.h>

#include <stdbool.h>
#include <stdint.h>

#include "kvr_ctl.h"
#include "kvr_geometry.h"
#include "kvr_keys.h"
#include "kvr_proto.h"
#include "kvr_ring.h"
#include "kvr_segment.h"


/* The public API (kvring.h): the only symbols libkvring exports. The library is built with
 * -fvisibility=hidden and client/libkvring.map; every name marked here is listed there. */
#define KVR_EXPORT __attribute__((visibility("default")))

/* Wire request ids: the addressed actor's generation, this worker slot's attach generation and a
 * sequence (include/kvring/msg.h, "the wire id"). */
#define MEMO_MAX 1024          /* lookups remembered for a following load */
#define WAIT_SLICE_NS 20000000 /* re-check actor liveness this often while waiting */

struct memo {
	uint64_t req_id;
	uint32_t n;
	bool lease;                 /* from kvr_lease_take: its load's completion ends our part of it */
	struct kvr_msg_slot *slots;
};

struct pending {
	uint64_t wire_id;
	uint64_t req_id;
	uint32_t op;       /* enum kvr_op */
	uint32_t actor;    /* actor index it was sent to */
	uint32_t gen;      /* that actor's generation at submit */
	uint32_t n_blocks;
	uint32_t *blocks;  /* engine block ids, to report them all when the actor dies */
	uint64_t submit_ns;
	/* reply assembly */
	bool have_result;
	struct kvr_completion done;
	uint32_t *failed;
	uint32_t failed_total, failed_got;
	uint32_t ev_plus1; /* CUDA store: its event-table entry + 1; 0 = none */
	uint32_t cancel_plus1; /* cancelled: its entry in our area's cancel table + 1; 0 = none */
	uint32_t prog_plus1; /* layered load: its entry in our area's progress table + 1; 0 = none */
	bool lease;        /* a load of a lease (req_id is the lease id): report LEASE_DONE */
};

struct kvr_client {
	int sock;                 /* the attach connection, open while attached */
	bool sup_gone;            /* it closed: kvringd exited (or was killed); every call fails */
	uint64_t sup_checked_ns;  /* when the socket was last looked at */
	struct kvr_segment ctl_seg;
	struct kvr_ctl *ctl;
	struct kvr_ctl_rings rings; /* our views of its rings (we use our six) */
	struct kvr_attach_info info;
	struct kvr_geometry geom;
	kvr_key ns;
	bool sched;               /* a scheduler client: lookups and leases only */
	unsigned worker;          /* worker slot (scheduler: scheduler slot) */
	int64_t timeout_ns;
	struct kvr_ring *lk_req, *lk_rep, *ld_req, *ld_rep, *st_req, *st_rep;
	struct kvr_waiter *waiter;
	uint64_t next_wire;

	struct memo memo[MEMO_MAX];
	unsigned memo_next;

	struct pending *pend;
	unsigned n_pend, cap_pend;

	struct kvr_completion *done;      /* completed, not yet polled */
	uint32_t **done_failed;           /* their failed-id arrays (owned) */
	unsigned n_done, cap_done;
	uint32_t **handed;                /* failed arrays handed out by the last poll */
	unsigned n_handed;

	kvr_key *keys;                    /* scratch */
	size_t cap_keys;

	/* CUDA KV memory only (docs/cuda.md): our writable view of the KV descriptor's
	 * store-event table, and which store's wire id holds each entry (0 = free). */
	void *cuda_map;
	size_t cuda_map_len;
	struct kvr_cuda_event *cuda_ev;
	uint64_t *cuda_ev_owner;

	uint64_t cancel_owner[KVR_AREA_CANCEL_MAX]; /* wire id each cancel-table entry holds, 0 = free */
	uint64_t prog_owner[KVR_AREA_LAYERED_MAX];  /* wire id each progress-table entry holds, 0 = free */

	char err[256];
	char sock_path[108]; /* the socket attached through (sun_path's size), for messages */
};

#define SUP_GONE_WHY "kvringd is gone (the attach socket closed): detach and attach again"

/* client.c: set c->err (when c is not NULL) from fmt; returns rc. */
int client_fail(struct kvr_client *c, int rc, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* client.c: the current generation of actor `actor`. */
uint32_t client_actor_gen(const struct kvr_client *c, unsigned actor);
/* client.c: whether incarnation gen of actor `actor` is the one running and ready. */
bool client_actor_alive(const struct kvr_client *c, unsigned actor, uint32_t gen);
/* client.c: whether incarnation gen of actor `actor` may still run (and copy for its requests). */
bool client_actor_may_run(const struct kvr_client *c, unsigned actor, uint32_t gen);
/* client.c: whether kvringd is gone (its attach socket closed); then every call fails. */
bool client_sup_gone(struct kvr_client *c);
/* client.c: a new wire id addressed to actor generation gen (the next of this client's sequence). */
uint64_t client_wire_id(struct kvr_client *c, uint32_t gen);
/* requests.c: free what a pending request owns (not the entry itself). */
void client_pending_free(struct pending *p);

#endif
