/* l2store: the L2 disk tier of one directory — index, byte accounting, LRU eviction, adoption at start. */
#ifndef KVR_L2STORE_H
#define KVR_L2STORE_H

#include <stdbool.h>
#include <stdint.h>

#include "l2file.h"
#include "uring.h"

/*
 * A store owns one namespace directory <root>/<ns hex>/ and the I/O engine (uring.h) on
 * it; it is used from one thread (the disk actor's loop). It keeps an in-memory index of
 * (key, lane) -> file, the byte accounting and the recency order, and issues every file
 * operation through the engine.
 *
 * Opening adopts what the directory already holds (DESIGN.md section 6):
 *   - the directory is created if needed and locked (flock on KVR_L2_LOCK_NAME): a second
 *     store on the same namespace directory gets -EBUSY;
 *   - permissions, whatever the umask and whatever existed before: the namespace directory is
 *     0700 (created so; an existing one with other bits is fchmod'ed to 0700, logged, and
 *     ret_adopt->dir_mode_was says what it was; -EACCES when it cannot be: not ours), the
 *     lock file 0600, every block file 0600 (created so by the engine; an adopted file with
 *     other bits is set to 0600, counted in modes_fixed and logged; one that cannot be is not
 *     adopted: removed, reason MODE). The root is the operator's and is not changed;
 *   - only <root>/<ns hex>/ is read: other namespaces' directories are never touched;
 *   - "*.kvb.tmp.*" leftovers are removed (reason TMP);
 *   - a name that does not parse (kvr_l2_name_parse), a directory or anything not ours is
 *     left alone and counted FOREIGN (NOTREG for a non-regular file with our name);
 *   - every other file is probed (statx + its header, never its payload): it is adopted
 *     when its header checks (kvr_l2_hdr_check) and its size is exactly
 *     kvr_l2_file_bytes(lane_bytes); otherwise it is deleted and counted by reason;
 *   - lane >= cfg.lanes is deleted (reason LANE);
 *   - adopted files are ordered by mtime (ties by name): the newest are kept while they
 *     fit capacity_bytes, the older rest deleted (OVER_CAP); the kept ones enter the LRU
 *     oldest first, so the least recently written is evicted first after a restart.
 *
 * Accounting counts real file bytes (kvr_l2_file_bytes(lane_bytes) per file):
 *   used     = bytes of present files + bytes reserved by writes in flight; a new write
 *              is admitted only when used + one file <= capacity_bytes, evicting least
 *              recently used present files first to make room;
 *   evicting = bytes of files whose unlink is queued or in flight (still on disk).
 * So the files on disk never exceed capacity_bytes by more than the evictions in flight.
 * Re-storing a present (or in-flight) key costs nothing and writes nothing.
 *
 * Reads verify every byte (uring.h) before reporting success. A read that finds the file
 * gone is a miss (-ENOENT) and drops the entry; a bad file (-EBADMSG: checksum, header,
 * truncation) or an I/O error drops the entry and unlinks the file. Unlinking a file that
 * is already gone is not an error.
 *
 * Recency: a get (at submission) or a completed put moves the entry to most recent.
 * Reads do not change mtime, so after a restart recency is that of the last write.
 *
 * Read-only (cfg.read_only): the store serves what the directory holds and never changes
 * it (no file or directory is created, written, renamed, removed or chmod'ed: permissions
 * are left as they are; the engine is opened read-only too):
 *   - the namespace directory is not created: when it does not exist the store opens
 *     empty (ret_adopt->no_dir) and every get is a miss;
 *   - the lock is shared: flock(LOCK_SH) on the namespace directory itself and on
 *     KVR_L2_LOCK_NAME when that file exists (it is not created). Read-only stores share a
 *     directory; a writable store (which takes both locks exclusively) and a read-only one
 *     exclude each other: whichever comes second gets -EBUSY;
 *   - adoption counts tmp leftovers, bad files, lanes >= cfg.lanes and files over the cap
 *     by reason exactly as above, but leaves them in place (ret_adopt->left_in_place; they
 *     are not in the index and never served); deleted stays 0;
 *   - put and remove return -EROFS (counted in puts_refused); nothing is queued;
 *   - a get that finds a bad file (-EBADMSG) or an I/O error drops the entry from the index
 *     (reported GONE, counted in dropped[reason] and bad_kept) and leaves the file on disk.
 */

#define KVR_L2_PRESENT 1   /* put: the key is already on disk: nothing written */
#define KVR_L2_ADOPT_DEPTH 256u /* probes and unlinks in flight during adoption */
#define KVR_L2_INFLIGHT 2  /* put: a write of the key is in flight: nothing written */

struct kvr_l2_store_config {
	const char *root;             /* an existing directory; files go to <root>/<ns hex>/ */
	struct kvr_l2_ident ident;    /* namespace, fingerprint, block_tokens, lane_bytes */
	uint32_t lanes;               /* valid lanes are 0..lanes-1 (1..KVR_L2_MAX_LANE+1) */
	uint64_t capacity_bytes;      /* cap on file bytes (> 0) */
	uint32_t queue_depth;         /* puts, gets and unlinks in flight (1..KVR_L2IO_MAX_QD); adoption
				       * probes max(queue_depth, KVR_L2_ADOPT_DEPTH) files at a time */
	enum kvr_l2_durability durability;
	enum kvr_l2_iomode io_mode;
	void *arena;                  /* registered as fixed buffers (may be NULL) */
	uint64_t arena_bytes;
	uint64_t arena_data_off;
	uint64_t slot_bytes;
	bool report_gone;             /* poll also returns a KVR_L2_GONE completion for every
				       * present (key, lane) that leaves the index: evicted for
				       * capacity, removed, or dropped after a failed read */
	bool read_only;               /* serve the directory, never change it (see above) */
	bool defer_verify;            /* a get completes before its payload checksum is compared
				       * (done.unverified): the caller first hands the store new
				       * work, then calls kvr_l2_store_verify — the check of a
				       * batch then runs while the disk reads the next one */
	bool join_header;             /* the engine's cfg.join_header (uring.h) */
};

struct kvr_l2_adopt_stats {
	uint64_t entries;             /* directory entries seen (".", ".." and the lock excluded) */
	uint64_t adopted;             /* files now in the index */
	uint64_t adopted_bytes;
	uint64_t deleted;             /* files removed: tmp, bad and over-cap */
	uint64_t left_alone;          /* foreign entries not touched */
	uint64_t left_in_place;       /* read-only: tmp, bad and over-cap files not removed */
	bool no_dir;                  /* read-only: the namespace directory does not exist */
	bool dir_mode_fixed;          /* the namespace directory was not 0700 and was set to 0700 */
	uint32_t dir_mode_was;        /* ...its permission bits before (when dir_mode_fixed) */
	uint64_t modes_fixed;         /* block files whose permissions were not 0600, set to 0600 */
	uint64_t rejected[KVR_L2_R_MAX]; /* per reason (TMP and OVER_CAP included) */
	uint64_t elapsed_ns;
};

enum kvr_l2_kind {
	KVR_L2_PUT = 1,
	KVR_L2_GET = 2,
	KVR_L2_GONE = 3,              /* (report_gone) the entry left the index: tag 0, res 0,
				       * reason OVER_CAP (eviction), KVR_L2_OK (remove) or the
				       * failed read's reason; queued before that read's completion */
};

/* One completed put or get, as returned by kvr_l2_store_poll(). */
struct kvr_l2_done {
	uint64_t tag;                 /* as given to put/get */
	kvr_key key;
	uint32_t lane;
	uint8_t kind;                 /* enum kvr_l2_kind */
	uint8_t reason;               /* enum kvr_l2_reason, KVR_L2_OK when res == 0 */
	bool unverified;              /* get with cfg.defer_verify, res 0: dst holds the payload as
				       * read, its checksum not yet compared: kvr_l2_store_verify
				       * before anything uses it */
	uint8_t reserved;
	int res;                      /* put: 0 or -errno (-ENOSPC...); get: 0 (dst holds the
				       * verified payload), -ENOENT, -EBADMSG, -EIO... */
	uint64_t payload_xxh3;        /* unverified: what the file's header says */
	uint32_t ent, ent_gen;        /* unverified: the index entry read (kvr_l2_store_verify's) */
};

struct kvr_l2_store_stats {
	uint64_t capacity_bytes;
	uint64_t file_bytes;          /* bytes of one file */
	uint64_t files;               /* present in the index */
	uint64_t used_bytes;          /* present + writing */
	uint64_t writing_bytes;
	uint64_t evicting_bytes;
	uint64_t puts, puts_present, puts_inflight, puts_failed, puts_nospace;
	uint64_t puts_refused;        /* read-only: puts and removes refused with -EROFS */
	uint64_t gets, get_hits, get_misses; /* get_misses: at submission (not indexed) or after (vanished/bad) */
	uint64_t evictions;           /* files evicted for capacity */
	uint64_t removed;             /* files removed on request (kvr_l2_store_remove) */
	uint64_t dropped[KVR_L2_R_MAX]; /* index entries dropped after a read, by reason */
	uint64_t bad_kept;            /* read-only: of those, bad or unreadable files left on disk */
	uint64_t unlink_errors;
	struct kvr_l2io_stats io;
	bool direct;
	bool read_only;
};

struct kvr_l2_store;

/* Create or adopt (see above). *ret_adopt (may be NULL) gets the adoption counts. Returns
 * 0 and *ret, or -EINVAL (bad config), -ENOENT (root missing), -EBUSY (another store has
 * the directory; read-only: a writable one), -EACCES (the namespace directory or the lock
 * file is not 0700 / 0600 and cannot be made so), -ENOMEM, or an engine error
 * (kvr_l2io_open). */
int kvr_l2_store_open(const struct kvr_l2_store_config *cfg, struct kvr_l2_adopt_stats *ret_adopt,
		      struct kvr_l2_store **ret);

/* Wait for everything in flight (unreaped completions are dropped), unlock, free. NULL ok. */
void kvr_l2_store_close(struct kvr_l2_store *s);

/* Store one lane of one block from src (lane_bytes, readable up to the padded length;
 * 4096-aligned in direct mode; must not change until the put completes). Returns 0 (the
 * write is queued: its completion comes from poll), KVR_L2_PRESENT or KVR_L2_INFLIGHT
 * (nothing queued, no completion), -EAGAIN (the engine is busy, the file is being
 * evicted, or room can only come from writes in flight: poll and retry), -ENOSPC
 * (capacity_bytes is smaller than one file), -EINVAL (lane >= lanes, bad buffer), -EROFS
 * (a read-only store: nothing queued). */
int kvr_l2_store_put(struct kvr_l2_store *s, kvr_key key, uint32_t lane, const void *src, uint64_t tag);
/* kvr_l2_store_put of a lane of block_tokens tokens: required by a store of several block
 * sizes (ident.block_tokens 0), which writes it into the file's header; 0 or the store's
 * own for a store of one (-EINVAL otherwise). */
int kvr_l2_store_put_as(struct kvr_l2_store *s, kvr_key key, uint32_t lane, uint32_t block_tokens, const void *src,
			uint64_t tag);

/* Read one lane into dst (writable for the padded length; 4096-aligned in direct mode).
 * Returns 0 (queued: completion from poll), -ENOENT (not in L2: a miss, no completion),
 * -EAGAIN (engine busy), -EINVAL. */
int kvr_l2_store_get(struct kvr_l2_store *s, kvr_key key, uint32_t lane, void *dst, uint64_t tag);
/* kvr_l2_store_get whose file must say block_tokens (0: the store's identity decides). */
int kvr_l2_store_get_as(struct kvr_l2_store *s, kvr_key key, uint32_t lane, uint32_t block_tokens, void *dst,
			uint64_t tag);

/* Whether (key, lane) is present (not being written or evicted). No recency change. */
bool kvr_l2_store_contains(const struct kvr_l2_store *s, kvr_key key, uint32_t lane);
/* (key, lane) was used where L2 cannot see it (a hit in L1): moved to the recent end of
 * the LRU. true when it is present (false: not on disk, being written or evicted). */
bool kvr_l2_store_touch(struct kvr_l2_store *s, kvr_key key, uint32_t lane);
/* Whether a put of (key, lane) is in flight (its file not yet in place). */
bool kvr_l2_store_writing(const struct kvr_l2_store *s, kvr_key key, uint32_t lane);

/* Delete a present file. 0 (its unlink is queued), -ENOENT (not present), -EBUSY (a write of
 * it is in flight), -EROFS (a read-only store). */
int kvr_l2_store_remove(struct kvr_l2_store *s, kvr_key key, uint32_t lane);

/* Submit what is queued and collect completed puts and gets into ret[0..max), waiting until
 * at least min_done are there (or nothing is in flight). Internal work (evictions, unlinks
 * of bad files) is handled here too. Returns the number written or -errno. */
int kvr_l2_store_poll(struct kvr_l2_store *s, struct kvr_l2_done *ret, unsigned max, unsigned min_done);
/* An unverified get (d->unverified; anything else: 0 at once): compare the checksum of
 * dst, the buffer the get read into. A match: d->unverified cleared, 0. A mismatch: d
 * becomes the failed get it is (res -EBADMSG, reason PAYLOAD_CSUM) and the file leaves
 * the index as after any bad read (removed; read-only: left on disk, counted in
 * bad_kept); 0, or -errno when that could not be queued. */
int kvr_l2_store_verify(struct kvr_l2_store *s, struct kvr_l2_done *d, const void *dst);

/* Wait until every put, get and internal unlink has finished (their completions stay queued
 * for poll). 0 or -errno. */
int kvr_l2_store_flush(struct kvr_l2_store *s);

/* Puts and gets in flight plus internal unlinks queued or in flight. */
unsigned kvr_l2_store_pending(const struct kvr_l2_store *s);

/* The engine's completion eventfd (see kvr_l2io_event_fd). */
int kvr_l2_store_event_fd(struct kvr_l2_store *s);

void kvr_l2_store_stats(const struct kvr_l2_store *s, struct kvr_l2_store_stats *ret);

/* The least recently used present entries, oldest first, up to max: for tests and
 * kvring-inspect. Returns the number written. */
unsigned kvr_l2_store_lru(const struct kvr_l2_store *s, kvr_key *ret_keys, uint32_t *ret_lanes, unsigned max);

/* The namespace directory's path (<root>/<ns hex>). */
const char *kvr_l2_store_dir(const struct kvr_l2_store *s);

#endif
