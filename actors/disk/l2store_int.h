/* l2store internals: the store object l2store.c and l2adopt.c share (private to actors/disk/). */
#ifndef KVR_L2STORE_INT_H
#define KVR_L2STORE_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "l2store.h"

struct ent;
struct req;

/* A growable FIFO of fixed-size items. */
struct fifo {
	void *v;
	size_t item, cap, head, n;
};

struct kvr_l2_store {
	struct kvr_l2_store_config cfg;
	char *dir;                 /* <root>/<ns hex> */
	int dir_fd, lock_fd;
	struct kvr_l2io *io;
	unsigned qd;               /* data-path ops in flight (cfg.queue_depth <= the engine's depth) */
	unsigned io_qd;            /* the engine's depth (adoption uses all of it) */
	uint64_t fb;               /* bytes of one file */
	/* index */
	struct ent *ents;
	uint32_t n_ents, cap_ents, free_ent;
	uint32_t *tab;             /* open addressing, linear probing: entry index + 1, 0 = empty */
	uint32_t tab_mask;
	uint32_t lru_head, lru_tail; /* head = least recently used */
	uint64_t present, writing, evicting; /* files per state */
	/* requests in the engine */
	struct req *reqs;
	uint32_t free_req;
	unsigned reqs_busy;
	struct fifo unlinks;       /* struct unlink_item: evictions waiting for an engine op */
	struct fifo done;          /* struct kvr_l2_done: completions not yet returned */
	struct kvr_l2io_done *iobuf;
	struct kvr_l2_store_stats st;
};

/* ---- l2store.c ---- */

/* (key, lane) entered in the index as a present file, most recently used (adoption enters
 * the kept files oldest first). 0 or -ENOMEM. */
int kvr_l2_index_add_present(struct kvr_l2_store *s, kvr_key key, uint32_t lane);

/* ---- l2adopt.c ---- */

/* The namespace directory opened (made first unless read-only), locked and its modes fixed; a
 * read-only store whose directory does not exist holds the root instead (ast->no_dir). Sets
 * s->dir_fd and s->lock_fd. 0, -EBUSY (locked by another store), -EACCES (a mode that is not
 * ours to fix) or another -errno. */
int kvr_l2_dir_open(struct kvr_l2_store *s, const struct kvr_l2_store_config *cfg, const char *hex,
		    struct kvr_l2_adopt_stats *ast);
/* The block files in s's directory adopted into the index through s's engine (l2store.h says
 * what is adopted, removed and left), counted in *ast; the mode fixes adoption made logged.
 * 0 or -errno. */
int kvr_l2_adopt(struct kvr_l2_store *s, struct kvr_l2_adopt_stats *ast);

#endif
