/* kvr_proto: the attach protocol on kvringd's Unix socket (SOCK_SEQPACKET + SCM_RIGHTS). */
#ifndef KVR_PROTO_H
#define KVR_PROTO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/*
 * The only way into an instance. A peer connects to the socket (mode 0600 by default;
 * kvringd checks the peer uid with SO_PEERCRED and refuses other users), sends one
 * request record and receives one reply record; file descriptors travel with the reply
 * (and, for an attach, with the request: the worker's KV memory) as SCM_RIGHTS.
 *
 *   INSPECT  -> reply status 0 + fds [ctl (read-only)]
 *   ATTACH   -> reply status 0 + worker slot + fds [ctl, arena, ...]; the connection then
 *               stays open for the worker's lifetime: when it closes (the worker died or
 *               detached) kvringd releases the worker's leases, reclaims its uncommitted
 *               slots and stops its loader and storer.
 *
 * A reply with status < 0 carries a one-line reason in `reason` (NUL-terminated).
 * Every record starts with magic and version; a record that does not validate is
 * answered with -EPROTO and the connection is closed.
 */

#define KVR_PROTO_MAGIC 0x4b565250u /* "KVRP" */
#define KVR_PROTO_VERSION 1u
#define KVR_PROTO_MAX_FDS 8
#define KVR_PROTO_REASON_MAX 160
#define KVR_PROTO_PAYLOAD_MAX 3072

enum kvr_proto_op {
	KVR_OP_INSPECT = 1,
	KVR_OP_ATTACH = 2,
	KVR_OP_DETACH = 3,
};

struct kvr_proto_req {
	uint32_t magic;
	uint32_t version;
	uint32_t op;          /* enum kvr_proto_op */
	uint32_t payload_len; /* bytes of payload in use */
	uint8_t payload[KVR_PROTO_PAYLOAD_MAX]; /* op-specific (attach: geometry) */
};

struct kvr_proto_rep {
	uint32_t magic;
	uint32_t version;
	int32_t status;       /* 0 or -errno */
	uint32_t n_fds;       /* fds that travel with this reply */
	uint32_t worker;      /* attach: the worker slot */
	uint32_t generation;  /* instance generation */
	uint32_t payload_len;
	uint32_t reserved;
	char reason[KVR_PROTO_REASON_MAX];
	uint8_t payload[KVR_PROTO_PAYLOAD_MAX];
};

/* ATTACH: the request payload is the worker's struct kvr_geometry (kvr_geometry.h) and
 * one fd travels with it: the worker's KV memory (host backend: a memfd). The reply
 * payload is struct kvr_attach_info and its fds are [ctl, arena, slot table]. */
struct kvr_attach_info {
	uint64_t ns_lo, ns_hi;   /* key namespace of the instance */
	uint32_t lane;           /* this worker's lane (its TP rank) */
	uint32_t lanes;          /* commit quorum: lanes per block */
	uint32_t n_slots;
	uint32_t reserved;
	uint64_t slot_bytes;     /* bytes per slot (lane bytes rounded up to 4 KiB) */
	uint64_t lane_bytes;     /* bytes of one lane of one block */
	uint64_t kv_bytes;       /* the KV memory size kvringd accepted */
	uint32_t loader_actor;   /* actor indices serving this worker */
	uint32_t storer_actor;
	uint32_t lookup_actor;
	uint32_t reserved2;
};

/* Send one record with up to KVR_PROTO_MAX_FDS descriptors. 0 or -errno. */
int kvr_proto_send(int sock, const void *rec, size_t len, const int *fds, unsigned n_fds);

/* Receive one record (at most cap bytes) and its descriptors (received fds are
 * O_CLOEXEC). Returns the record length, 0 on orderly close, or -errno; -EMSGSIZE when
 * the record or the fd list was truncated (any fds received are closed). */
ssize_t kvr_proto_recv(int sock, void *rec, size_t cap, int *ret_fds, unsigned max_fds, unsigned *ret_n_fds);

/* Connect to a kvringd socket (SOCK_SEQPACKET). Returns an fd or -errno. */
int kvr_proto_connect(const char *path);

#endif
