/* uring: the L2 I/O engine; each op is a linked io_uring chain on a direct descriptor, resumed or cleaned up whole. */
#include "uring.h"
#include "uring_int.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The steps of the chains. A step's user_data is gen << 32 | step << 16 | op index. */
enum step {
	S_OPEN = 0,
	S_HDR,        /* header write or read */
	S_PAY,        /* payload write or read */
	S_SYNC,       /* fdatasync of the file */
	S_CLOSE,
	S_RENAME,
	S_UNLINK,
	S_STATX,
	S_CLEAN_CLOSE,
	S_CLEAN_UNLINK,
	S_DIRSYNC,    /* BATCH: the directory fsync after a batch of renames (op index BATCH_IDX) */
	S_MAX,
};

enum phase {
	P_FREE = 0,
	P_DATA,       /* the op's main chain (or a resume of it) */
	P_BATCH_WAIT, /* written and synced, waiting for its batch's rename */
	P_BATCH,      /* rename issued with its batch */
	P_CLEANUP,    /* closing the descriptor / removing a file after a failure */
	P_DONE,       /* in the done queue, not reaped */
};

#define BATCH_IDX 0xffffu
#define KVR_L2IO_READ_GROUP 4u /* read chains handed to the kernel together (kvr_l2io_read_as) */
#define MAX_RESUMES 8
#define BIT(s) (1u << (s))

static inline uint64_t ud_make(const struct op *op, enum step s)
{
	return (uint64_t)op->gen << 32 | (uint64_t)s << 16 | op->idx;
}

static inline uint8_t *hdr_buf(const struct kvr_l2io *io, const struct op *op)
{
	return io->hdr_bufs + (size_t)op->idx * KVR_L2_HDR_BYTES;
}

/*
 * Joined transfers. A block file is its 4 KiB header followed by the payload. Moved as two
 * requests, the header costs a device request of its own (on a virtio disk about as much
 * device time as a 128 KiB read), and a file written header first, payload second, gets two
 * extents that ext4 places apart. So with O_DIRECT, a write or read that starts from the
 * beginning moves both in one vectored transfer (the header from or into the engine's
 * header buffer, the payload from or into the caller's memory): one allocation, one device
 * request. The vectored opcodes take no registered buffer: the payload's pages are pinned
 * per transfer. In huge pages that is one folio per lane and the
 * saved request wins (a lease of 128 KiB lanes from L2: 1.08x); in 4 KiB pages the pinning
 * costs more than the request saves (l2_bench, 512 KiB and 2 MiB lanes: reads 0.87-0.93x),
 * so it is the caller's choice (cfg.join_header: the disk actor's when L1 is in huge
 * pages). A short transfer resumes with the two separate steps; buffered mode, where the
 * page cache decides the requests, keeps the registered-buffer steps.
 */
static bool joined_io(const struct kvr_l2io *io, const struct op *op)
{
	return io->direct && io->join_header && !op->hdr_done && !op->pay_done; /* nothing moved yet */
}

static void joined_iov(struct kvr_l2io *io, struct op *op)
{
	op->joined = true;
	op->iov[0] = (struct iovec){.iov_base = hdr_buf(io, op), .iov_len = KVR_L2_HDR_BYTES};
	op->iov[1] = (struct iovec){.iov_base = op->buf, .iov_len = io->pay_bytes};
}

/* Registered buffer that holds [p, p + len) whole, or -1. */
static int buf_lookup(const struct kvr_l2io *io, const void *p, uint64_t len)
{
	const uint8_t *b = p;
	if (!io->n_pieces || b < io->piece_base || b + len > io->arena + io->arena_bytes)
		return -1;
	uint64_t off = (uint64_t)(b - io->piece_base);
	uint64_t k = off / io->piece_len;
	if (k >= io->n_pieces || off + len > (k + 1) * io->piece_len)
		return -1;
	return (int)k;
}

/* An SQE carrying the step's user_data; the caller made sure of the space (reserve()).
 * The io_uring_prep_* helpers reset sqe->flags: set the flags after the prep. */
static struct io_uring_sqe *sqe_get(struct kvr_l2io *io, struct op *op, enum step s)
{
	struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
	if (!sqe) /* reserve() guarantees room: never expected */
		abort();
	io_uring_sqe_set_data64(sqe, op ? ud_make(op, s) : ((uint64_t)s << 16 | BATCH_IDX));
	if (op)
		op->pending++;
	io->inflight++;
	return sqe;
}

/* Make room for n SQEs of one chain: a chain must not be split across two submissions. */
static int reserve(struct kvr_l2io *io, unsigned n)
{
	if (io_uring_sq_space_left(&io->ring) >= n)
		return 0;
	int rc = io_uring_submit(&io->ring);
	io->st.enters++;
	if (rc < 0)
		return rc;
	io->st.sqes += (unsigned)rc;
	return io_uring_sq_space_left(&io->ring) >= n ? 0 : -EBUSY;
}

static void note_err(struct op *op, enum step s, int res)
{
	if (res == -ECANCELED || op->err)
		return;
	op->err = res;
	op->err_step = s;
}

/* A write leaves its data phase (batch wait, cleanup or completion). */
static void leave_data(struct kvr_l2io *io, struct op *op)
{
	if (op->in_data) {
		op->in_data = false;
		io->n_data_writes--;
	}
}

static void complete(struct kvr_l2io *io, struct op *op, int res, unsigned reason)
{
	leave_data(io, op);
	op->done = (struct kvr_l2io_done){
		.tag = op->tag,
		.key = op->key,
		.lane = op->lane,
		.op = op->kind,
		.reason = (uint8_t)(res ? reason : KVR_L2_OK),
		.unverified = res == 0 && op->unverified,
		.res = res,
		.payload_xxh3 = op->done_xxh3,
	};
	if (op->kind == KVR_L2IO_PROBE && (op->ok & BIT(S_STATX))) {
		op->done.size = op->stx.stx_size;
		op->done.mtime_ns = (int64_t)op->stx.stx_mtime.tv_sec * 1000000000ll + op->stx.stx_mtime.tv_nsec;
		op->done.mode = op->stx.stx_mode & 07777;
	}
	io->st.ops[op->kind]++;
	if (res)
		io->st.failed[op->kind]++;
	else if (op->kind == KVR_L2IO_WRITE)
		io->st.bytes_written += io->ident.lane_bytes;
	else if (op->kind == KVR_L2IO_READ)
		io->st.bytes_read += io->ident.lane_bytes;
	op->phase = P_DONE;
	io->done_q[(io->done_head + io->done_n) % io->qd] = op->idx;
	io->done_n++;
}

/* ---- write chains ---------------------------------------------------------------------- */

static unsigned write_steps_left(const struct kvr_l2io *io, const struct op *op)
{
	uint32_t want = BIT(S_OPEN) | BIT(S_HDR) | BIT(S_PAY) | BIT(S_CLOSE);
	if (io->dur != KVR_L2_DUR_NONE)
		want |= BIT(S_SYNC);
	if (io->dur != KVR_L2_DUR_BATCH)
		want |= BIT(S_RENAME);
	return want & ~op->ok;
}

/* (Re)issue every write step not yet done, linked, in order. */
static int write_chain(struct kvr_l2io *io, struct op *op)
{
	static const enum step order[] = {S_OPEN, S_HDR, S_PAY, S_SYNC, S_CLOSE, S_RENAME};
	uint32_t left = write_steps_left(io, op);
	bool join = joined_io(io, op);
	if (join)
		left &= ~BIT(S_PAY); /* the S_HDR step writes both */
	unsigned n = (unsigned)__builtin_popcount(left);
	int rc = reserve(io, n);
	if (rc)
		return rc;
	op->joined = false;
	int fd = op->idx;
	for (unsigned i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
		enum step s = order[i];
		if (!(left & BIT(s)))
			continue;
		left &= ~BIT(s);
		unsigned link = left ? IOSQE_IO_LINK : 0;
		struct io_uring_sqe *sqe;
		switch (s) {
		case S_OPEN:
			sqe = sqe_get(io, op, s);
			io_uring_prep_openat_direct(sqe, io->dir_fd, op->tmp,
						    O_CREAT | O_WRONLY | O_TRUNC | (io->direct ? O_DIRECT : 0), 0600,
						    op->idx);
			io_uring_sqe_set_flags(sqe, link);
			break;
		case S_HDR:
			sqe = sqe_get(io, op, s);
			if (join) {
				joined_iov(io, op);
				io_uring_prep_writev(sqe, fd, op->iov, 2, 0);
			} else {
				io_uring_prep_write_fixed(sqe, fd, hdr_buf(io, op) + op->hdr_done,
							  (unsigned)(KVR_L2_HDR_BYTES - op->hdr_done), op->hdr_done,
							  (int)io->hdr_index);
			}
			io_uring_sqe_set_flags(sqe, link | IOSQE_FIXED_FILE);
			break;
		case S_PAY:
			sqe = sqe_get(io, op, s);
			if (op->buf_index >= 0)
				io_uring_prep_write_fixed(sqe, fd, op->buf + op->pay_done,
							  (unsigned)(io->pay_bytes - op->pay_done),
							  KVR_L2_HDR_BYTES + op->pay_done, op->buf_index);
			else
				io_uring_prep_write(sqe, fd, op->buf + op->pay_done, (unsigned)(io->pay_bytes - op->pay_done),
						    KVR_L2_HDR_BYTES + op->pay_done);
			io_uring_sqe_set_flags(sqe, link | IOSQE_FIXED_FILE);
			break;
		case S_SYNC:
			sqe = sqe_get(io, op, s);
			io_uring_prep_fsync(sqe, fd, IORING_FSYNC_DATASYNC);
			io_uring_sqe_set_flags(sqe, link | IOSQE_FIXED_FILE);
			break;
		case S_CLOSE:
			sqe = sqe_get(io, op, s);
			io_uring_prep_close_direct(sqe, op->idx);
			io_uring_sqe_set_flags(sqe, link);
			break;
		case S_RENAME:
			sqe = sqe_get(io, op, s);
			io_uring_prep_renameat(sqe, io->dir_fd, op->tmp, io->dir_fd, op->name, 0);
			io_uring_sqe_set_flags(sqe, link);
			break;
		default:
			abort();
		}
	}
	return 0;
}

/* Close the descriptor if still open and remove what the failed write left (the temporary
 * file, or the real name when the rename already happened); report fin_res after. */
static int start_cleanup(struct kvr_l2io *io, struct op *op, int res, unsigned reason)
{
	op->fin_res = res;
	op->fin_reason = (uint8_t)reason;
	leave_data(io, op);
	bool unlink_file = op->kind == KVR_L2IO_WRITE;
	if (!op->opened && !unlink_file) {
		complete(io, op, res, reason);
		return 0;
	}
	int rc = reserve(io, 2);
	if (rc)
		return rc;
	if (op->kind == KVR_L2IO_WRITE)
		io->st.cleanups++;
	op->phase = P_CLEANUP;
	if (op->opened) {
		struct io_uring_sqe *sqe = sqe_get(io, op, S_CLEAN_CLOSE);
		io_uring_prep_close_direct(sqe, op->idx);
		io_uring_sqe_set_flags(sqe, unlink_file ? IOSQE_IO_HARDLINK : 0);
	}
	if (unlink_file) {
		struct io_uring_sqe *sqe = sqe_get(io, op, S_CLEAN_UNLINK);
		io_uring_prep_unlinkat(sqe, io->dir_fd, op->renamed ? op->name : op->tmp, 0);
	}
	return 0;
}

static int write_done(struct kvr_l2io *io, struct op *op)
{
	if (op->err)
		return start_cleanup(io, op, op->err, KVR_L2_R_IO);
	if (write_steps_left(io, op)) {
		/* A short write (the rest of the chain was cancelled): resume where it stopped,
		 * aligned down for O_DIRECT (rewriting the same bytes is harmless). */
		if (++op->resumes > MAX_RESUMES)
			return start_cleanup(io, op, -EIO, KVR_L2_R_IO);
		if (io->direct) {
			op->hdr_done &= ~(uint64_t)(KVR_L2_ALIGN - 1);
			op->pay_done &= ~(uint64_t)(KVR_L2_ALIGN - 1);
		}
		io->st.resumed++;
		return write_chain(io, op);
	}
	if (io->dur == KVR_L2_DUR_BATCH && !op->renamed) {
		op->phase = P_BATCH_WAIT;
		leave_data(io, op);
		io->batch[io->n_batch++] = op->idx;
		return 0;
	}
	complete(io, op, 0, KVR_L2_OK);
	return 0;
}

/* BATCH: rename every waiting file, then fsync the directory once, as one hard-linked
 * chain (a failed rename does not stop the others). */
static int batch_flush(struct kvr_l2io *io)
{
	int rc = reserve(io, io->n_batch + 1);
	if (rc)
		return rc;
	io->n_flushing = io->n_batch;
	io->n_batch = 0;
	io->flush_err = 0;
	io->flush_pending = io->n_flushing + 1;
	for (unsigned i = 0; i < io->n_flushing; i++) {
		struct op *op = &io->ops[io->batch[i]];
		io->flushing[i] = op->idx;
		op->phase = P_BATCH;
		struct io_uring_sqe *sqe = sqe_get(io, op, S_RENAME);
		io_uring_prep_renameat(sqe, io->dir_fd, op->tmp, io->dir_fd, op->name, 0);
		io_uring_sqe_set_flags(sqe, IOSQE_IO_HARDLINK);
	}
	struct io_uring_sqe *sqe = sqe_get(io, NULL, S_DIRSYNC);
	io_uring_prep_fsync(sqe, io->dir_fd, 0);
	return 0;
}

static void maybe_flush(struct kvr_l2io *io)
{
	if (io->n_flushing || !io->n_batch)
		return;
	unsigned batch_max = io->qd / 2 ? io->qd / 2 : 1;
	if (io->n_data_writes == 0 || io->n_batch >= batch_max)
		(void)batch_flush(io); /* -EBUSY: tried again at the next submit */
}

static void batch_done(struct kvr_l2io *io)
{
	io->st.batches++;
	for (unsigned i = 0; i < io->n_flushing; i++) {
		struct op *op = &io->ops[io->flushing[i]];
		if (op->renamed && !io->flush_err) {
			complete(io, op, 0, KVR_L2_OK);
			continue;
		}
		if (!op->err)
			op->err = io->flush_err ? io->flush_err : -EIO;
		(void)start_cleanup(io, op, op->err, KVR_L2_R_IO);
	}
	io->n_flushing = 0;
}

/* ---- read and probe -------------------------------------------------------------------- */

/* A failed step of a read or probe: the file is gone (ENOENT) or not a regular file
 * (ELOOP from O_NOFOLLOW, EISDIR) — a miss with its reason — else an I/O error.
 * open_only: only the open step can tell ENOENT and ELOOP apart from I/O errors. */
static unsigned step_error(const struct op *op, bool open_only, int *ret_res)
{
	int res = op->err;
	bool at_open = !open_only || op->err_step == S_OPEN;
	*ret_res = res;
	if (at_open && res == -ENOENT)
		return KVR_L2_R_VANISHED;
	if ((at_open && res == -ELOOP) || res == -EISDIR) {
		*ret_res = -EBADMSG;
		return KVR_L2_R_NOTREG;
	}
	return KVR_L2_R_IO;
}

/* What op's header must say: the store's identity, with op's block size where the store
 * holds several (ident.block_tokens 0: a read then expects the one asked for, if any). */
static const struct kvr_l2_ident *op_ident(const struct kvr_l2io *io, const struct op *op, struct kvr_l2_ident *buf)
{
	if (io->ident.block_tokens || !op->block_tokens)
		return &io->ident;
	*buf = io->ident;
	buf->block_tokens = op->block_tokens;
	return buf;
}

static int finish_read(struct kvr_l2io *io, struct op *op)
{
	int res = 0;
	unsigned reason = KVR_L2_OK;
	const struct kvr_l2_hdr *h = (const struct kvr_l2_hdr *)hdr_buf(io, op);
	struct kvr_l2_ident id;
	if (op->err) {
		reason = step_error(op, true, &res);
	} else if (!(op->ok & BIT(S_HDR))) {
		res = -EBADMSG;
		reason = KVR_L2_R_SHORT;
	} else if ((reason = kvr_l2_hdr_check(h, op_ident(io, op, &id), op->key, op->lane)) != KVR_L2_OK) {
		res = -EBADMSG;
	} else if (!(op->ok & BIT(S_PAY))) {
		res = -EBADMSG;
		reason = KVR_L2_R_SHORT;
	} else if (io->defer_verify) {
		op->done_xxh3 = h->payload_xxh3; /* compared by the caller: the header buffer is reused */
		op->unverified = true;
	} else if ((reason = kvr_l2_payload_check(h, op->buf)) != KVR_L2_OK) {
		res = -EBADMSG;
	}
	return start_cleanup(io, op, res, reason);
}

static int finish_probe(struct kvr_l2io *io, struct op *op)
{
	int res = 0;
	unsigned reason = KVR_L2_OK;
	const struct kvr_l2_hdr *h = (const struct kvr_l2_hdr *)hdr_buf(io, op);
	if ((op->ok & BIT(S_STATX)) && !S_ISREG(op->stx.stx_mode)) {
		res = -EBADMSG;
		reason = KVR_L2_R_NOTREG;
	} else if (op->err) {
		reason = step_error(op, false, &res);
	} else if (!(op->ok & BIT(S_HDR))) {
		res = -EBADMSG;
		reason = KVR_L2_R_SHORT;
	} else if ((reason = kvr_l2_hdr_check(h, &io->ident, op->key, op->lane)) != KVR_L2_OK) {
		res = -EBADMSG;
	} else if (op->stx.stx_size != io->file_bytes) {
		res = -EBADMSG;
		reason = KVR_L2_R_SIZE;
	}
	return start_cleanup(io, op, res, reason);
}

/* ---- completion dispatch --------------------------------------------------------------- */

/* Every CQE of the op's current chain is in: decide what comes next. */
static void chain_done(struct kvr_l2io *io, struct op *op)
{
	int rc = 0;
	switch (op->phase) {
	case P_DATA:
		switch (op->kind) {
		case KVR_L2IO_WRITE:
			rc = write_done(io, op);
			break;
		case KVR_L2IO_READ:
			rc = finish_read(io, op);
			break;
		case KVR_L2IO_PROBE:
			rc = finish_probe(io, op);
			break;
		case KVR_L2IO_UNLINK:
			complete(io, op, op->err, op->err ? KVR_L2_R_IO : KVR_L2_OK);
			break;
		}
		break;
	case P_CLEANUP:
		complete(io, op, op->fin_res, op->fin_reason);
		break;
	default: /* P_BATCH: the batch completes on its directory fsync */
		break;
	}
	if (rc) /* no SQ space even after a submit: fail the op rather than lose it */
		complete(io, op, rc, KVR_L2_R_IO);
}

/* A CQE of the batch's directory fsync or of one of its renames' shared count. */
static void batch_cqe(struct kvr_l2io *io, int res)
{
	if (res < 0 && !io->flush_err)
		io->flush_err = res;
	if (--io->flush_pending == 0)
		batch_done(io);
}

/* A header or payload read or write of res bytes: counted toward its whole, an error noted.
 * A joined transfer's bytes fill the header first, then the payload. */
static void rw_result(struct kvr_l2io *io, struct op *op, enum step s, int res)
{
	if (res < 0) {
		note_err(op, s, res);
		return;
	}
	if (res == 0 && op->kind == KVR_L2IO_WRITE && !op->err)
		note_err(op, s, -EIO); /* no progress at all */
	uint64_t got = (unsigned)res;
	if (s == S_HDR) {
		uint64_t h = got < KVR_L2_HDR_BYTES - op->hdr_done ? got : KVR_L2_HDR_BYTES - op->hdr_done;
		op->hdr_done += h;
		got -= h;
		if (op->hdr_done == KVR_L2_HDR_BYTES)
			op->ok |= BIT(S_HDR);
		if (!op->joined)
			return;
		io->st.joined_ios++;
	}
	op->pay_done += got;
	if (op->pay_done == io->pay_bytes)
		op->ok |= BIT(S_PAY);
	if (op->joined)
		return; /* counted as joined above */
	if (op->buf_index >= 0)
		io->st.fixed_ios++;
	else
		io->st.plain_ios++;
}

/* The result res of step s recorded on op: its ok bit, its error, what it opened or renamed. */
static void step_result(struct kvr_l2io *io, struct op *op, enum step s, int res)
{
	switch (s) {
	case S_OPEN:
		if (res >= 0) {
			op->opened = true;
			op->ok |= BIT(s);
		} else {
			note_err(op, s, res);
		}
		break;
	case S_HDR:
	case S_PAY:
		rw_result(io, op, s, res);
		break;
	case S_CLOSE:
	case S_CLEAN_CLOSE:
		if (res != -ECANCELED) {
			op->opened = false;
			op->ok |= BIT(S_CLOSE);
		}
		if (res < 0 && res != -ECANCELED && s == S_CLOSE)
			note_err(op, s, res);
		break;
	case S_RENAME:
		if (res >= 0) {
			op->renamed = true;
			op->ok |= BIT(s);
		} else {
			note_err(op, s, res);
		}
		if (op->phase == P_BATCH && --io->flush_pending == 0)
			batch_done(io);
		break;
	case S_UNLINK:
		if (res >= 0 || res == -ENOENT)
			op->ok |= BIT(s);
		else
			note_err(op, s, res);
		break;
	case S_STATX:
		if (res >= 0)
			op->ok |= BIT(s);
		else
			note_err(op, s, res);
		break;
	case S_SYNC:
		if (res >= 0) {
			op->ok |= BIT(s);
			io->st.fsyncs++;
		} else
			note_err(op, s, res);
		break;
	case S_CLEAN_UNLINK: /* already gone is fine; anything else cannot be helped here */
	default:
		break;
	}
}

static void handle_cqe(struct kvr_l2io *io, uint64_t ud, int res)
{
	unsigned idx = ud & 0xffff;
	enum step s = (enum step)((ud >> 16) & 0xff);
	io->inflight--;
	if (idx == BATCH_IDX) {
		batch_cqe(io, res);
		return;
	}
	struct op *op = &io->ops[idx];
	if (op->gen != (uint32_t)(ud >> 32) || !op->pending)
		abort(); /* a CQE for an op that is not waiting for one: engine bug */
	op->pending--;
	step_result(io, op, s, res);
	if (!op->pending && op->phase != P_BATCH)
		chain_done(io, op);
}

static unsigned process_cqes(struct kvr_l2io *io)
{
	struct io_uring_cqe *cqe;
	unsigned head, n = 0;
	/* handle_cqe may prepare SQEs but never waits, so walking the CQ ring here is safe */
	io_uring_for_each_cqe(&io->ring, head, cqe) {
		handle_cqe(io, cqe->user_data, cqe->res);
		n++;
	}
	io_uring_cq_advance(&io->ring, n);
	return n;
}

/* ---- op entry points ------------------------------------------------------------------- */

static int op_new(struct kvr_l2io *io, enum kvr_l2io_op kind, kvr_key key, uint32_t lane, uint64_t tag,
		  struct op **ret)
{
	if (lane > KVR_L2_MAX_LANE)
		return -EINVAL;
	if (!io->n_free)
		return -EAGAIN;
	uint16_t idx = io->free_list[io->n_free - 1];
	struct op *op = &io->ops[idx];
	uint32_t gen = op->gen + 1;
	memset(op, 0, offsetof(struct op, stx));
	op->idx = idx;
	op->gen = gen;
	op->kind = (uint8_t)kind;
	op->phase = P_DATA;
	op->key = key;
	op->lane = lane;
	op->tag = tag;
	op->buf_index = -1;
	op->err_step = -1;
	kvr_l2_name_fmt(key, lane, op->name);
	*ret = op;
	return 0;
}

static void op_commit(struct kvr_l2io *io)
{
	io->n_free--;
}

/* Undo a prepared-but-unsubmittable op (SQ full after a submit: never expected). */
static void op_abandon(struct kvr_l2io *io, struct op *op)
{
	op->kind = 0;
	op->phase = P_FREE;
	(void)io;
}

int kvr_l2io_write(struct kvr_l2io *io, kvr_key key, uint32_t lane, const void *src, uint64_t tag)
{
	return kvr_l2io_write_as(io, key, lane, 0, src, tag);
}

int kvr_l2io_write_as(struct kvr_l2io *io, kvr_key key, uint32_t lane, uint32_t block_tokens, const void *src,
		      uint64_t tag)
{
	struct op *op;
	if (!io || !src)
		return -EINVAL;
	/* a header names one block size: the store's, or (a store of several) the caller's */
	if (io->ident.block_tokens ? block_tokens && block_tokens != io->ident.block_tokens : !block_tokens)
		return -EINVAL;
	if (io->read_only)
		return -EROFS;
	if (io->direct && ((uintptr_t)src & (KVR_L2_ALIGN - 1)))
		return -EINVAL;
	int rc = op_new(io, KVR_L2IO_WRITE, key, lane, tag, &op);
	if (rc)
		return rc;
	op->buf = (uint8_t *)src;
	op->buf_index = buf_lookup(io, src, io->pay_bytes);
	op->block_tokens = block_tokens;
	kvr_l2_tmp_name_fmt(key, lane, io->pid, io->tmp_seq++, op->tmp);
	struct kvr_l2_ident id;
	kvr_l2_hdr_build((struct kvr_l2_hdr *)hdr_buf(io, op), op_ident(io, op, &id), key, lane,
			 kvr_l2_payload_hash(src, io->ident.lane_bytes));
	rc = write_chain(io, op);
	if (rc) {
		op_abandon(io, op);
		return rc;
	}
	op_commit(io);
	op->in_data = true;
	io->n_data_writes++;
	return 0;
}

int kvr_l2io_read(struct kvr_l2io *io, kvr_key key, uint32_t lane, void *dst, uint64_t tag)
{
	return kvr_l2io_read_as(io, key, lane, 0, dst, tag);
}

int kvr_l2io_read_as(struct kvr_l2io *io, kvr_key key, uint32_t lane, uint32_t block_tokens, void *dst,
		     uint64_t tag)
{
	struct op *op;
	if (!io || !dst)
		return -EINVAL;
	if (io->direct && ((uintptr_t)dst & (KVR_L2_ALIGN - 1)))
		return -EINVAL;
	int rc = op_new(io, KVR_L2IO_READ, key, lane, tag, &op);
	if (rc)
		return rc;
	op->block_tokens = block_tokens;
	op->buf = dst;
	op->buf_index = buf_lookup(io, dst, io->pay_bytes);
	bool join = joined_io(io, op);
	rc = reserve(io, join ? 3 : 4);
	if (rc) {
		op_abandon(io, op);
		return rc;
	}
	int fd = op->idx;
	struct io_uring_sqe *sqe = sqe_get(io, op, S_OPEN);
	io_uring_prep_openat_direct(sqe, io->dir_fd, op->name, O_RDONLY | O_NOFOLLOW | (io->direct ? O_DIRECT : 0), 0,
				    op->idx);
	io_uring_sqe_set_flags(sqe, IOSQE_IO_LINK);
	sqe = sqe_get(io, op, S_HDR);
	if (join) {
		joined_iov(io, op);
		io_uring_prep_readv(sqe, fd, op->iov, 2, 0);
	} else {
		io_uring_prep_read_fixed(sqe, fd, hdr_buf(io, op), KVR_L2_HDR_BYTES, 0, (int)io->hdr_index);
	}
	io_uring_sqe_set_flags(sqe, IOSQE_IO_LINK | IOSQE_FIXED_FILE);
	if (!join) {
		sqe = sqe_get(io, op, S_PAY);
		if (op->buf_index >= 0)
			io_uring_prep_read_fixed(sqe, fd, op->buf, (unsigned)io->pay_bytes, KVR_L2_HDR_BYTES,
						 op->buf_index);
		else
			io_uring_prep_read(sqe, fd, op->buf, (unsigned)io->pay_bytes, KVR_L2_HDR_BYTES);
		io_uring_sqe_set_flags(sqe, IOSQE_IO_LINK | IOSQE_FIXED_FILE);
	}
	sqe = sqe_get(io, op, S_CLOSE);
	io_uring_prep_close_direct(sqe, op->idx);
	op_commit(io);
	/* A chain's open completes inline, but its linked read is queued only when the submitting
	 * call returns: a batch of 32 chains in one call opened every file before the first read
	 * reached the disk (0.08-0.1 ms a batch, block tracepoints). In groups, the disk starts on
	 * the first reads while the next files are opened. */
	if (++io->reads_unsubmitted >= KVR_L2IO_READ_GROUP)
		(void)kvr_l2io_submit(io); /* an error shows again at the next submit or reap */
	return 0;
}

static int unlink_common(struct kvr_l2io *io, const char *name, kvr_key key, uint32_t lane, uint64_t tag)
{
	struct op *op;
	if (io->read_only)
		return -EROFS;
	int rc = op_new(io, KVR_L2IO_UNLINK, key, lane, tag, &op);
	if (rc)
		return rc;
	if (name)
		snprintf(op->name, sizeof(op->name), "%s", name);
	rc = reserve(io, 1);
	if (rc) {
		op_abandon(io, op);
		return rc;
	}
	struct io_uring_sqe *sqe = sqe_get(io, op, S_UNLINK);
	io_uring_prep_unlinkat(sqe, io->dir_fd, op->name, 0);
	op_commit(io);
	return 0;
}

int kvr_l2io_unlink(struct kvr_l2io *io, kvr_key key, uint32_t lane, uint64_t tag)
{
	if (!io)
		return -EINVAL;
	return unlink_common(io, NULL, key, lane, tag);
}

int kvr_l2io_unlink_name(struct kvr_l2io *io, const char *name, kvr_key key, uint32_t lane, uint64_t tag)
{
	if (!io || !name || !*name || strchr(name, '/') || strlen(name) >= KVR_L2_TMP_MAX)
		return -EINVAL;
	return unlink_common(io, name, key, lane, tag);
}

int kvr_l2io_probe(struct kvr_l2io *io, kvr_key key, uint32_t lane, uint64_t tag)
{
	struct op *op;
	if (!io)
		return -EINVAL;
	int rc = op_new(io, KVR_L2IO_PROBE, key, lane, tag, &op);
	if (rc)
		return rc;
	rc = reserve(io, 4);
	if (rc) {
		op_abandon(io, op);
		return rc;
	}
	struct io_uring_sqe *sqe = sqe_get(io, op, S_STATX);
	io_uring_prep_statx(sqe, io->dir_fd, op->name, AT_SYMLINK_NOFOLLOW,
			    STATX_TYPE | STATX_MODE | STATX_SIZE | STATX_MTIME, &op->stx);
	/* O_DIRECT like reads: exactly the header's 4 KiB from the disk, no readahead of the payload */
	sqe = sqe_get(io, op, S_OPEN);
	io_uring_prep_openat_direct(sqe, io->dir_fd, op->name, O_RDONLY | O_NOFOLLOW | (io->direct ? O_DIRECT : 0), 0,
				    op->idx);
	io_uring_sqe_set_flags(sqe, IOSQE_IO_LINK);
	sqe = sqe_get(io, op, S_HDR);
	io_uring_prep_read_fixed(sqe, op->idx, hdr_buf(io, op), KVR_L2_HDR_BYTES, 0, (int)io->hdr_index);
	io_uring_sqe_set_flags(sqe, IOSQE_IO_LINK | IOSQE_FIXED_FILE);
	sqe = sqe_get(io, op, S_CLOSE);
	io_uring_prep_close_direct(sqe, op->idx);
	op_commit(io);
	return 0;
}

int kvr_l2io_submit(struct kvr_l2io *io)
{
	io->reads_unsubmitted = 0;
	maybe_flush(io);
	if (!io_uring_sq_ready(&io->ring))
		return 0;
	int rc = io_uring_submit(&io->ring);
	io->st.enters++;
	if (rc > 0)
		io->st.sqes += (unsigned)rc;
	return rc;
}

static void drain_eventfd(struct kvr_l2io *io)
{
	uint64_t v;
	if (io->efd >= 0)
		(void)!read(io->efd, &v, sizeof(v));
}

int kvr_l2io_reap(struct kvr_l2io *io, struct kvr_l2io_done *ret, unsigned max, unsigned min_done)
{
	if (!io || (max && !ret))
		return -EINVAL;
	if (min_done > max)
		min_done = max;
	/* before the CQ is looked at: a completion posted after this read signals the eventfd
	 * again, so a caller woken by the eventfd never sleeps on an unreaped completion */
	drain_eventfd(io);
	for (;;) {
		int rc = kvr_l2io_submit(io);
		if (rc < 0 && rc != -EBUSY && rc != -EAGAIN && rc != -EINTR)
			return rc;
		process_cqes(io);
		if (io_uring_sq_ready(&io->ring) || (io->n_batch && !io->n_flushing && io->n_data_writes == 0))
			continue; /* completions queued more work: hand it over first */
		if (io->done_n >= min_done || !io->inflight)
			break;
		rc = io_uring_submit_and_wait(&io->ring, 1);
		io->st.enters++;
		if (rc < 0 && rc != -EINTR && rc != -EBUSY && rc != -EAGAIN && rc != -ETIME)
			return rc;
		if (rc > 0)
			io->st.sqes += (unsigned)rc;
	}
	unsigned n = 0;
	while (n < max && io->done_n) {
		struct op *op = &io->ops[io->done_q[io->done_head]];
		io->done_head = (io->done_head + 1) % io->qd;
		io->done_n--;
		ret[n++] = op->done;
		op->kind = 0;
		op->phase = P_FREE;
		io->free_list[io->n_free++] = op->idx;
	}
	return (int)n;
}

void kvr_l2io_drain(struct kvr_l2io *io)
{
	for (;;) {
		(void)kvr_l2io_submit(io);
		process_cqes(io);
		if (io_uring_sq_ready(&io->ring))
			continue;
		if (!io->inflight && !io->n_batch)
			break;
		if (!io->inflight)
			continue; /* maybe_flush will issue the waiting batch */
		io->st.enters++;
		(void)io_uring_submit_and_wait(&io->ring, 1);
	}
}

unsigned kvr_l2io_busy(const struct kvr_l2io *io)
{
	return io->qd - io->n_free;
}

unsigned kvr_l2io_queue_depth(const struct kvr_l2io *io)
{
	return io->qd;
}

bool kvr_l2io_direct(const struct kvr_l2io *io)
{
	return io->direct;
}

void kvr_l2io_stats(const struct kvr_l2io *io, struct kvr_l2io_stats *ret)
{
	*ret = io->st;
}
