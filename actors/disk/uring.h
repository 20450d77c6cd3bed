/* uring: the L2 I/O engine — block-file writes, reads, unlinks and probes as io_uring chains (liburing). */
#ifndef KVR_L2_URING_H
#define KVR_L2_URING_H

#include <stdbool.h>
#include <stdint.h>

#include "l2file.h"

/*
 * One engine serves one namespace directory (<dir>/<ns>/) from one thread. It never blocks
 * on I/O except in kvr_l2io_reap() with min_done > 0, and it has no thread pool: every
 * file operation is an io_uring request (the kernel's own io-wq runs the ones that
 * cannot complete inline, e.g. statx).
 *
 * Operations (each one "op", at most queue_depth in flight; a new one gets -EAGAIN when
 * all are busy or completed but not yet reaped):
 *
 *   write   openat(tmp, O_CREAT|O_WRONLY|O_TRUNC [|O_DIRECT], 0600) -> write header (from the
 *           engine's own registered header buffer) -> write payload (from src: fixed when
 *           src lies in a registered arena piece) -> [fdatasync] -> close -> rename(tmp,
 *           name), linked into one chain on a direct (registered) file descriptor. The
 *           payload is written padded to 4096: src must be readable for
 *           kvr_l2_payload_bytes(lane_bytes) bytes. Durability:
 *             NONE   no fsync (a kill -9 still never leaves a partial file under a real
 *                    name; a power loss may, and the checksums then refuse it);
 *             BLOCK  fdatasync each file before its rename;
 *             BATCH  fdatasync each file; the renames of a batch are issued together
 *                    and followed by one fsync of the directory; the batch's writes
 *                    complete after it. A batch is flushed when no write is still in
 *                    its data phase or when queue_depth / 2 files wait.
 *           A short write is resumed where it stopped. On any error the chain is cleaned
 *           up (descriptor closed, temporary file unlinked): nothing remains under either
 *           name, and the op completes with the first error (-ENOSPC, -EIO, ...).
 *           With cfg.join_header (O_DIRECT), header and payload are one vectored write.
 *   read    openat(name, O_RDONLY [|O_DIRECT]) -> read header -> read payload into dst
 *           (padded length: dst must be writable for kvr_l2_payload_bytes(lane_bytes)
 *           bytes) -> close (cfg.join_header, O_DIRECT: both in one vectored read); then
 *           the header is checked (kvr_l2_hdr_check) and the payload
 *           checksum verified BEFORE the op reports 0. Results: 0; -ENOENT (reason
 *           VANISHED: the file is gone, a miss); -EBADMSG with the reason (SHORT for a
 *           truncated file, HDR_CSUM, PAYLOAD_CSUM, NS, ...); another -errno (reason IO).
 *           On failure dst holds unspecified bytes. The engine does not unlink a bad file:
 *           its owner (l2store) decides.
 *   unlink  unlinkat(name); a file already gone completes with 0.
 *   probe   statx(name) and openat -> read header -> close (buffered: the header only):
 *           completes with size, mtime, permission bits and reason (KVR_L2_OK when the
 *           header checks and the size is kvr_l2_file_bytes(lane_bytes)). Used by adoption.
 *
 * Permissions: block files (and their temporary names: the rename keeps the inode) are
 * created 0600, which the umask can only narrow; the engine never creates a directory.
 *
 * Buffers: the arena [arena, arena + arena_bytes) is registered as fixed buffers in pieces
 * of at most 1 GiB that start at arena_data_off and hold a whole number of slot_bytes
 * slots (so no slot straddles two pieces); src/dst inside a piece use WRITE_FIXED /
 * READ_FIXED, anything else the plain opcodes. In direct mode src/dst must be 4096-aligned
 * (-EINVAL otherwise).
 *
 * I/O mode: DIRECT opens with O_DIRECT; BUFFERED without; AUTO probes the directory at
 * open (create, O_DIRECT write of 4 KiB, unlink a probe file) and uses DIRECT unless the
 * filesystem refuses O_DIRECT with EINVAL, then BUFFERED: kvr_l2io_direct() says which,
 * and the caller logs the fallback (library code does not log).
 *
 * Read-only (cfg.read_only): the engine never changes the directory. write, unlink and
 * unlink_name return -EROFS without queueing anything; read and probe work as above (they
 * open files O_RDONLY only). AUTO probes by reading instead (kvr_l2io_probe_direct_ro):
 * no probe file is created.
 *
 * Submission is batched: the op functions only prepare requests; kvr_l2io_submit() (also
 * called by kvr_l2io_reap()) hands them all to the kernel in one io_uring_enter.
 *
 * Threads: the engine runs none. Requests that cannot complete inline (openat with O_CREAT,
 * renameat, unlinkat, statx, allocating O_DIRECT writes) run in the kernel's io-wq; the
 * engine raises its bounded-worker limit to min(queue_depth, KVR_L2IO_IOWQ_WORKERS) so a
 * cold adoption is not serialised behind 4 workers per CPU.
 */

enum kvr_l2_durability {
	KVR_L2_DUR_NONE = 0,
	KVR_L2_DUR_BLOCK = 1,
	KVR_L2_DUR_BATCH = 2,
};

enum kvr_l2_iomode {
	KVR_L2_IO_AUTO = 0,
	KVR_L2_IO_DIRECT = 1,
	KVR_L2_IO_BUFFERED = 2,
};

enum kvr_l2io_op {
	KVR_L2IO_WRITE = 1,
	KVR_L2IO_READ = 2,
	KVR_L2IO_UNLINK = 3,
	KVR_L2IO_PROBE = 4,
};

#define KVR_L2IO_MAX_QD 4096u
#define KVR_L2IO_PIECE_MAX (1ull << 30) /* largest registered buffer */
#define KVR_L2IO_IOWQ_WORKERS 64u      /* bounded io-wq workers the engine asks for (at most queue_depth) */

/* "none", "block", "batch" -> 0 or -EINVAL. */
int kvr_l2_durability_parse(const char *s, enum kvr_l2_durability *ret);
const char *kvr_l2_durability_name(enum kvr_l2_durability d);

struct kvr_l2io_config {
	int dir_fd;                   /* the namespace directory (borrowed: stays open while the engine lives) */
	struct kvr_l2_ident ident;    /* written into and checked against every header */
	uint32_t queue_depth;         /* 1..KVR_L2IO_MAX_QD ops in flight */
	enum kvr_l2_durability durability;
	enum kvr_l2_iomode io_mode;
	void *arena;                  /* may be NULL (nothing but the header buffers registered) */
	uint64_t arena_bytes;
	uint64_t arena_data_off;      /* first registered byte (slot 0); multiple of 4096 */
	uint64_t slot_bytes;          /* pieces hold whole slots; 0 = pieces of KVR_L2IO_PIECE_MAX */
	bool read_only;               /* never create, write, rename or unlink (see above) */
	bool defer_verify;            /* a read completes once its header is checked and its payload
				       * read whole, unverified: the caller compares the payload's
				       * checksum later (after handing the engine new work) and never
				       * uses the bytes before (kvr_l2_store_verify) */
	bool join_header;             /* O_DIRECT: a write or read moves header and payload in one
				       * vectored transfer (one extent, one device request per
				       * file) instead of two registered-buffer transfers; for
				       * destinations in huge pages, where pinning per transfer is
				       * cheap (uring.c, "Joined transfers") */
};

struct kvr_l2io_done {
	uint64_t tag;                 /* as given to the op */
	kvr_key key;
	uint32_t lane;
	uint8_t op;                   /* enum kvr_l2io_op */
	uint8_t reason;               /* enum kvr_l2_reason (KVR_L2_OK when res == 0) */
	bool unverified;              /* a read with cfg.defer_verify: header checked, payload read
				       * whole, its checksum not yet compared (kvr_l2_store_verify) */
	uint8_t reserved;
	int res;                      /* 0 or -errno (see the op table above) */
	uint64_t payload_xxh3;        /* unverified: the checksum its header gives for the payload */
	uint64_t size;                /* probe: st_size */
	int64_t mtime_ns;             /* probe: st_mtime in ns */
	uint32_t mode;                /* probe: the permission bits (st_mode & 07777) */
};

struct kvr_l2io_stats {
	uint64_t ops[5];              /* completed ops by enum kvr_l2io_op */
	uint64_t failed[5];           /* of which res != 0 */
	uint64_t bytes_written;       /* payload bytes of successful writes */
	uint64_t bytes_read;          /* payload bytes of successful reads */
	/* payload transfers, each counted once, by how (a resumed short transfer again): */
	uint64_t fixed_ios;           /* the payload alone, through a registered buffer */
	uint64_t plain_ios;           /* the payload alone, through unregistered memory */
	uint64_t joined_ios;          /* header and payload in one vectored transfer */
	uint64_t resumed;             /* short transfers resumed */
	uint64_t cleanups;            /* failed writes whose temporary file was removed */
	uint64_t fsyncs;              /* file fdatasyncs completed (BLOCK, BATCH) */
	uint64_t batches;             /* BATCH: directory fsyncs */
	uint64_t enters;              /* io_uring_enter calls (submit and wait) */
	uint64_t sqes;                /* requests submitted */
};

struct kvr_l2io;

/* Create the engine: ring (SQ sized for queue_depth chains), sparse file table of
 * queue_depth direct descriptors, fixed buffers (arena pieces + header buffers), I/O mode.
 * Returns 0 and *ret, or -EINVAL (bad config), -ENOMEM, -EOPNOTSUPP (the kernel lacks
 * what the engine needs: io_uring, direct descriptors), or the errno of a failed
 * registration (-ENOMEM / -EPERM when RLIMIT_MEMLOCK is too low). */
int kvr_l2io_open(const struct kvr_l2io_config *cfg, struct kvr_l2io **ret);

/* Wait for every op in flight (completions not reaped are dropped), then free. NULL ok. */
void kvr_l2io_close(struct kvr_l2io *io);

/* Queue an op (see the table above). 0, or -EAGAIN (queue_depth ops busy: reap first),
 * -EINVAL (lane > KVR_L2_MAX_LANE, misaligned buffer in direct mode, name too long),
 * -EROFS (write and unlinks of a read-only engine: nothing queued). */
int kvr_l2io_write(struct kvr_l2io *io, kvr_key key, uint32_t lane, const void *src, uint64_t tag);
/* The same for a lane of block_tokens tokens: a store of one block size (ident.block_tokens)
 * takes 0 or that size (else -EINVAL); a store of several (ident.block_tokens 0, an instance
 * without a model section) needs it, and writes it into the file's header. */
int kvr_l2io_write_as(struct kvr_l2io *io, kvr_key key, uint32_t lane, uint32_t block_tokens, const void *src,
		      uint64_t tag);
int kvr_l2io_read(struct kvr_l2io *io, kvr_key key, uint32_t lane, void *dst, uint64_t tag);
/* The same, the file's header to say block_tokens (0: whatever the store's identity says). */
int kvr_l2io_read_as(struct kvr_l2io *io, kvr_key key, uint32_t lane, uint32_t block_tokens, void *dst,
		     uint64_t tag);
int kvr_l2io_unlink(struct kvr_l2io *io, kvr_key key, uint32_t lane, uint64_t tag);
/* Unlink by name (a leftover temporary file); key/lane in the completion are those given. */
int kvr_l2io_unlink_name(struct kvr_l2io *io, const char *name, kvr_key key, uint32_t lane, uint64_t tag);
int kvr_l2io_probe(struct kvr_l2io *io, kvr_key key, uint32_t lane, uint64_t tag);

/* Hand every prepared request to the kernel. Returns the number submitted or -errno. */
int kvr_l2io_submit(struct kvr_l2io *io);

/* Submit, then collect up to max completed ops into ret[], waiting until at least
 * min_done are available (or nothing is in flight any more). Returns the number written,
 * or -errno from io_uring_enter. */
int kvr_l2io_reap(struct kvr_l2io *io, struct kvr_l2io_done *ret, unsigned max, unsigned min_done);

/* Ops in flight or completed and not yet reaped (0..queue_depth). */
unsigned kvr_l2io_busy(const struct kvr_l2io *io);
unsigned kvr_l2io_queue_depth(const struct kvr_l2io *io);

/* An eventfd that becomes readable when completions arrive (registered on first call;
 * kvr_l2io_reap drains it first, then looks at the completion queue: a completion that
 * lands after the drain makes it readable again). -errno on failure. The engine owns it. */
int kvr_l2io_event_fd(struct kvr_l2io *io);

/* Whether files are opened with O_DIRECT (false after an AUTO fallback or BUFFERED). */
bool kvr_l2io_direct(const struct kvr_l2io *io);

void kvr_l2io_stats(const struct kvr_l2io *io, struct kvr_l2io_stats *ret);

/* The AUTO probe on its own: 1 when dir_fd's filesystem accepts an O_DIRECT create and
 * 4 KiB write, 0 when it refuses with EINVAL, else -errno. Leaves no file behind. */
int kvr_l2io_probe_direct(int dir_fd);

/* The read-only AUTO probe: opens the first block file of dir_fd (a name
 * kvr_l2_name_parse accepts) O_RDONLY|O_DIRECT and reads its first 4 KiB. 1 when that
 * works, 0 when the filesystem refuses O_DIRECT (EINVAL) or no block file could be read
 * (buffered I/O then), -errno when the directory cannot be listed. Creates, writes and
 * removes nothing. */
int kvr_l2io_probe_direct_ro(int dir_fd);


#endif
