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
 *   INSPECT  -> reply status 0 + fds [ctl, slot table, every client area] (all read-only)
 *               + payload: the engines attached now (struct kvr_inspect_engine, below)
 *   ATTACH   -> reply status 0 + worker slot + fds [ctl (read-only), the worker's own
 *               client area (read-write): kvr_ctl.h]; the connection then
 *               stays open for the worker's lifetime: when it closes (the worker died or
 *               detached) kvringd releases the worker's leases, reclaims its uncommitted
 *               slots and stops its loader and storer.
 *
 * A reply with status < 0 carries a one-line reason in `reason` (NUL-terminated).
 * Every record starts with magic and version; a record that does not validate is
 * answered with -EPROTO and the connection is closed.
 */

#define KVR_PROTO_MAGIC 0x4b565250u /* "KVRP" */
#define KVR_PROTO_VERSION 4u /* 3: an attach reply carries the control segment read-only and
			      * the client's own area; INSPECT every area too; 4: the area holds
			      * the layer-ordered loads' progress (kvr_ctl.h) */
#define KVR_PROTO_MAX_FDS 40 /* INSPECT: 2 + KVR_CTL_MAX_CLIENTS */
#define KVR_PROTO_REASON_MAX 160
#define KVR_PROTO_PAYLOAD_MAX 20480 /* a geometry of 1024 regions + the engine identity: one
				     * SOCK_SEQPACKET record (the socket buffer holds ~200 KiB) */

enum kvr_proto_op {
	KVR_OP_INSPECT = 1,
	KVR_OP_ATTACH = 2,
	KVR_OP_DETACH = 3,
	KVR_OP_ATTACH_SCHED = 4,
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
 * payload is struct kvr_attach_info and its one fd is the control segment. The arena and
 * the slot table never reach a worker: the actors copy and commit, and a worker holding
 * them could overwrite every other worker's KV bytes and slot states.
 * kvringd refuses KV memory no actor could map safely, naming why in the reason: an
 * O_PATH or not read-write fd, anything but a memfd, a hugetlbfs memfd, one sealed
 * against writes (F_SEAL_WRITE; F_SEAL_FUTURE_WRITE unless it is a CUDA KV descriptor),
 * one that cannot be sealed F_SEAL_SHRINK, one smaller than the geometry's extent. A
 * memfd without F_SEAL_SHRINK gets it (before its size is read): it never shrinks after
 * an accepted attach. */
struct kvr_attach_info {
	uint64_t ns_lo, ns_hi;   /* key namespace this worker's keys use (the instance's; a DCP
				  * rank whose pages carry tails: also naming its layout) */
	uint32_t lane;           /* this worker's lane (its TP rank; DCP: its group's; MLA: 0) */
	uint32_t lanes;          /* commit quorum: lanes per block */
	uint32_t n_slots;
	uint32_t block_tokens;   /* tokens per block (the instance's) */
	uint64_t slot_bytes;     /* bytes per slot (lane bytes rounded up to 4 KiB) */
	uint64_t lane_bytes;     /* bytes of one lane of one block */
	uint64_t kv_bytes;       /* the KV memory size kvringd accepted */
	uint32_t loader_actor;   /* actor indices serving this worker */
	uint32_t storer_actor;
	uint32_t lookup_actor;
	uint32_t group_ranks;    /* DCP: ranks of its group that must attach before the gather
				  * actor storing for it (storer_actor) is ready; else 1 */
};

/* The engine a worker or scheduler belongs to: the ATTACH payload's optional tail (after the
 * geometry; a payload of just the geometry is engine "default", model_ns "") and the whole
 * ATTACH_SCHED payload. Both strings NUL-terminated inside their arrays, reserved zero.
 * engine_id: 1..47 bytes of [A-Za-z0-9._:-] ("" = "default"); one worker per (engine, TP
 * rank, DCP rank). model_ns: printable ASCII, "" = the instance's model.model_id; it replaces
 * model_id in the key namespace, so engines of different model_ns share no block. An engine
 * keeps one model_ns while any of its clients is attached. */
struct kvr_attach_engine {
	char engine_id[48];
	char model_ns[64];
	uint32_t reserved[4];
};
_Static_assert(sizeof(struct kvr_attach_engine) == 128, "engine identity");

/* INSPECT reply payload: the engines attached when kvringd answered (they live only in
 * kvringd's memory, not in the control segment), in engine index order. An array of
 * payload_len / sizeof(struct kvr_inspect_engine) entries, at most KVR_CTL_MAX_ENGINES;
 * payload_len 0 = none attached. A payload_len that is not a multiple of the entry size
 * is malformed (take no entry from it). Readers that do not know the table (it came
 * within protocol version 3) ignore it: the descriptors are the whole of what they use.
 * An engine is listed while any worker or scheduler of it is attached: index is what
 * kvr_worker_ent.engine of its clients names; workers / schedulers count its worker and
 * scheduler slots attached (a detaching worker no longer counts). id is the engine_id
 * ("default" when it attached with ""), model_ns the namespace its keys use, resolved:
 * the attach's model_ns or, when that was "", the instance's model.model_id (flag
 * KVR_INSPECT_ENGINE_NS_MODEL_ID; a model_id longer than 63 bytes is cut here, the
 * effective config in the control segment holds it whole). Both strings NUL-terminated
 * and NUL-padded; other flag bits 0. */
#define KVR_INSPECT_ENGINE_NS_MODEL_ID 0x1u
struct kvr_inspect_engine {
	uint32_t index;       /* engine index (0..KVR_CTL_MAX_ENGINES-1) */
	uint32_t workers;     /* worker slots of it attached */
	uint32_t schedulers;  /* scheduler slots of it attached */
	uint32_t flags;       /* KVR_INSPECT_ENGINE_* */
	char id[48];          /* engine_id */
	char model_ns[64];    /* its key namespace's model part, resolved */
};
_Static_assert(sizeof(struct kvr_inspect_engine) == 128, "INSPECT engine entry");
_Static_assert(offsetof(struct kvr_inspect_engine, id) == 16 && offsetof(struct kvr_inspect_engine, model_ns) == 64,
	       "INSPECT engine entry layout");

/* ATTACH_SCHED: payload struct kvr_attach_engine, no fds. Reply: status 0, worker = the
 * scheduler slot, fds [ctl (read-only), its client area], payload struct kvr_attach_info (ns, lanes, n_slots, block_tokens,
 * lookup_actor; the worker-only fields 0). The connection stays open while attached, as for
 * ATTACH. */

/* ---- ATTACH with CUDA KV memory (docs/cuda.md) -------------------------------------------
 * The request does not change: payload = geometry, one fd. When the worker's KV memory is
 * GPU memory, that fd is a "KV descriptor": a memfd whose size is max(kv_bytes, desc_bytes)
 * (sparse past its first pages), starting with struct kvr_cuda_desc, then n_ranges
 * struct kvr_cuda_range at ranges_off, then the store-event table (n_events struct
 * kvr_cuda_event) at events_off. The worker fills it, seals it F_SEAL_SHRINK | F_SEAL_GROW |
 * F_SEAL_FUTURE_WRITE | F_SEAL_SEAL and keeps one writable mapping to fill event entries.
 * kvringd checks it like any KV memfd (see ATTACH above: its F_SEAL_FUTURE_WRITE is
 * accepted because it starts with the magic) and needs no change; an actor that does not know the format cannot map it
 * writable (EPERM) and fails instead of copying into it. Readers validate every field
 * (xfer/kvr_cuda.h: kvr_cuda_desc_read, kvr_cuda_desc_check) before using any.
 *
 * Store events: a STORE whose list messages carry KVR_STOREF_CUDA_EVENT (msg.h) must not
 * read the KV memory before the IPC event in entry (wire id % n_events) has completed; the
 * entry's wire field equals the request's wire id (anything else fails the store). */
#define KVR_CUDA_DESC_MAGIC 0x3144564bu /* "KVD1" */
#define KVR_CUDA_DESC_VERSION 1u
#define KVR_CUDA_IPC_BYTES 64u           /* cudaIpcMemHandle_t, cudaIpcEventHandle_t */
#define KVR_CUDA_MAX_RANGES 4096u
#define KVR_CUDA_MAX_EVENTS 65536u       /* n_events: 0 or a power of two up to this */
#define KVR_CUDA_EVENTS 1024u            /* what libkvring uses */

struct kvr_cuda_desc {
	uint32_t magic;       /* KVR_CUDA_DESC_MAGIC */
	uint32_t version;     /* KVR_CUDA_DESC_VERSION */
	uint32_t n_ranges;    /* 1..KVR_CUDA_MAX_RANGES */
	uint32_t n_events;    /* 0 or a power of two <= KVR_CUDA_MAX_EVENTS */
	uint64_t kv_bytes;    /* the KV offset space the geometry indexes */
	uint64_t ranges_off;  /* sizeof(struct kvr_cuda_desc) */
	uint64_t events_off;  /* >= end of the ranges, a multiple of 64 */
	uint64_t desc_bytes;  /* >= end of the event table, a multiple of 4096 */
	uint8_t device_uuid[16]; /* cudaDeviceProp.uuid of the GPU that holds the KV memory */
	int32_t worker_pid;   /* exporting process (diagnostics only) */
	uint32_t reserved[7]; /* 0 */
};
_Static_assert(sizeof(struct kvr_cuda_desc) == 96, "cuda descriptor header");

/* One piece of the KV offset space: [kv_offset, kv_offset + bytes) lives at byte
 * alloc_offset of the allocation that handle names. Ranges are sorted by kv_offset and
 * do not overlap; several may name one allocation (one cudaMalloc holding several layers). */
struct kvr_cuda_range {
	uint8_t handle[KVR_CUDA_IPC_BYTES]; /* cudaIpcMemHandle_t (cudaIpcGetMemHandle of the base) */
	uint64_t alloc_offset;
	uint64_t kv_offset;
	uint64_t bytes;       /* > 0 */
	uint64_t reserved;    /* 0 */
};
_Static_assert(sizeof(struct kvr_cuda_range) == 96, "cuda descriptor range");

struct kvr_cuda_event {
	uint64_t wire;        /* wire id of the STORE this entry belongs to; 0 = none */
	uint64_t reserved;    /* 0 */
	uint8_t handle[KVR_CUDA_IPC_BYTES]; /* cudaIpcEventHandle_t, recorded after the KV was written */
};
_Static_assert(sizeof(struct kvr_cuda_event) == 80, "cuda store event");

/* Send one record with up to KVR_PROTO_MAX_FDS descriptors. 0 or -errno. */
int kvr_proto_send(int sock, const void *rec, size_t len, const int *fds, unsigned n_fds);

/* Receive one record (at most cap bytes) and its descriptors (received fds are
 * O_CLOEXEC). Returns the record length, 0 on orderly close, or -errno; -EMSGSIZE when
 * the record or the fd list was truncated (any fds received are closed). */
ssize_t kvr_proto_recv(int sock, void *rec, size_t cap, int *ret_fds, unsigned max_fds, unsigned *ret_n_fds);

/* Connect to a kvringd socket (SOCK_SEQPACKET). Returns an fd or -errno. */
int kvr_proto_connect(const char *path);

#endif
