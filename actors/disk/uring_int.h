/* uring_int: the L2 I/O engine's objects, shared by uring.c (the op chains) and uring_setup.c (open, close). */
#ifndef KVR_L2_URING_INT_H
#define KVR_L2_URING_INT_H

#include <liburing.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/types.h>

#include "uring.h"

/* One op: its chain's state (uring.c: enum step, enum phase). io->ops[idx]; idx is also its
 * direct descriptor slot and its header buffer. */
struct op {
	uint8_t kind;          /* enum kvr_l2io_op, 0 when free */
	uint8_t phase;
	uint8_t fin_reason;    /* result to report once a cleanup finishes */
	bool opened;           /* our direct descriptor slot holds the file */
	bool renamed;
	bool in_data;          /* a write counted in n_data_writes */
	uint16_t idx;
	uint16_t resumes;
	uint32_t gen;
	unsigned pending;      /* CQEs outstanding */
	uint32_t ok;           /* BIT(step) of steps that completed in full */
	int err;               /* first error (not counting -ECANCELED links) */
	int err_step;
	int fin_res;
	uint32_t lane;
	uint32_t block_tokens; /* a write's (its header's); a read's expected; 0: the ident's */
	kvr_key key;
	uint64_t tag;
	uint8_t *buf;          /* payload source or destination */
	int buf_index;         /* registered buffer index, -1 = plain */
	uint64_t hdr_done, pay_done;
	bool joined;           /* the chain's S_HDR step moves header and payload in one vectored
				* transfer (iov): one device request, one extent (joined_io) */
	struct iovec iov[2];
	bool unverified;       /* a read done with defer_verify: payload checksum not compared */
	uint64_t done_xxh3;    /* ...the checksum its header gave */
	char name[KVR_L2_TMP_MAX];
	char tmp[KVR_L2_TMP_MAX];
	struct statx stx;
	struct kvr_l2io_done done;
};

struct kvr_l2io {
	struct io_uring ring;
	bool ring_ok;
	bool direct;
	bool read_only;
	bool defer_verify;
	bool join_header;
	int dir_fd;
	int efd;
	pid_t pid;
	struct kvr_l2_ident ident;
	uint64_t pay_bytes;          /* padded payload */
	uint64_t file_bytes;
	uint32_t qd;
	enum kvr_l2_durability dur;
	uint8_t *hdr_bufs;           /* qd x 4096, registered as buffer hdr_index */
	unsigned hdr_index;
	uint8_t *arena, *piece_base;
	uint64_t arena_bytes, piece_len;
	unsigned n_pieces;
	struct op *ops;
	uint16_t *free_list;
	unsigned n_free;
	uint16_t *done_q;            /* ring of completed ops, qd entries */
	unsigned done_head, done_n;
	uint16_t *batch, *flushing;
	unsigned n_batch, n_flushing, flush_pending;
	int flush_err;
	unsigned n_data_writes;      /* writes in P_DATA */
	unsigned inflight;           /* CQEs expected (prepared or submitted) */
	unsigned reads_unsubmitted;  /* read chains prepared since the last submission */
	uint64_t tmp_seq;
	struct kvr_l2io_stats st;
};

/* ---- uring.c ---- */

/* Run the engine until nothing is in flight and no batch waits for its rename (close: no
 * rename lands after the engine is gone). Completions are kept, not reaped. */
void kvr_l2io_drain(struct kvr_l2io *io);

#endif
