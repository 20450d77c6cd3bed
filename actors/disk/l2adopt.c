/* l2adopt: an L2 store takes over its namespace directory at open — create, lock, modes, adopt the files. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvr_grow.h"
#include "kvr_log.h"
#include "kvr_time.h"
#include "l2store_int.h"

/* ---- the namespace directory: lock and permissions --------------------------------------- */

static int flock_busy(int fd, int op)
{
	if (flock(fd, op | LOCK_NB) == 0)
		return 0;
	return errno == EWOULDBLOCK ? -EBUSY : -errno;
}

/* The instance lock (see the header): a writable store holds KVR_L2_LOCK_NAME (created if
 * needed) and the namespace directory exclusively; a read-only one holds both shared (the
 * lock file only when it exists: it is not created). */
static int lock_dir(struct kvr_l2_store *s)
{
	if (s->cfg.read_only) {
		int rc = flock_busy(s->dir_fd, LOCK_SH);
		if (rc)
			return rc;
		s->lock_fd = openat(s->dir_fd, KVR_L2_LOCK_NAME, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
		if (s->lock_fd < 0)
			return errno == ENOENT ? 0 : -errno;
		return flock_busy(s->lock_fd, LOCK_SH);
	}
	s->lock_fd = openat(s->dir_fd, KVR_L2_LOCK_NAME, O_CREAT | O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (s->lock_fd < 0)
		return -errno;
	int rc = flock_busy(s->lock_fd, LOCK_EX);
	return rc ? rc : flock_busy(s->dir_fd, LOCK_EX);
}

/* fd's permission bits made exactly mode (an existing file or directory may have any): 0 and *ret_was (its
 * bits before) and *ret_fixed, or -EACCES when it is not ours to change (EPERM), another -errno. */
static int fix_mode(int fd, mode_t mode, uint32_t *ret_was, bool *ret_fixed)
{
	struct stat st;

	*ret_fixed = false;
	if (fstat(fd, &st))
		return -errno;
	*ret_was = st.st_mode & 07777;
	if ((st.st_mode & 07777) == mode)
		return 0;
	if (fchmod(fd, mode))
		return errno == EPERM ? -EACCES : -errno;
	*ret_fixed = true;
	return 0;
}

/* A writable store's permissions (see the header): the namespace directory 0700, the lock file 0600, each
 * change logged (a block file a reader of another uid could read is a leak of the KV cache). */
static int fix_dir_modes(struct kvr_l2_store *s, struct kvr_l2_adopt_stats *st)
{
	uint32_t was = 0;
	bool fixed;
	int rc = fix_mode(s->dir_fd, 0700, &was, &fixed);
	if (rc) {
		kvr_err("l2 %s: namespace directory has mode %04o and cannot be set to 0700: %s", s->dir,
			(unsigned)was, strerror(-rc));
		return rc;
	}
	if (fixed) {
		st->dir_mode_fixed = true;
		st->dir_mode_was = was;
		kvr_warn("l2 %s: namespace directory had mode %04o: now 0700", s->dir, (unsigned)was);
	}
	rc = fix_mode(s->lock_fd, 0600, &was, &fixed);
	if (rc) {
		kvr_err("l2 %s/%s: mode %04o cannot be set to 0600: %s", s->dir, KVR_L2_LOCK_NAME, (unsigned)was,
			strerror(-rc));
		return rc;
	}
	if (fixed)
		kvr_warn("l2 %s/%s: had mode %04o: now 0600", s->dir, KVR_L2_LOCK_NAME, (unsigned)was);
	return 0;
}

int kvr_l2_dir_open(struct kvr_l2_store *s, const struct kvr_l2_store_config *cfg, const char *hex,
		    struct kvr_l2_adopt_stats *ast)
{
	int rc = 0;
	int root_fd = open(cfg->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (root_fd < 0)
		return -errno;
	if (!cfg->read_only && mkdirat(root_fd, hex, 0700) && errno != EEXIST) {
		rc = -errno;
		goto out;
	}
	s->dir_fd = openat(root_fd, hex, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
	if (s->dir_fd < 0 && errno == ENOENT && cfg->read_only) {
		/* nothing stored under this namespace: serve nothing; the engine gets the root
		 * (it never opens a file there: the index stays empty) */
		ast->no_dir = true;
		s->dir_fd = root_fd;
		root_fd = -1;
	} else if (s->dir_fd < 0) {
		rc = -errno;
	} else {
		rc = lock_dir(s);
		if (!rc && !cfg->read_only)
			rc = fix_dir_modes(s, ast);
	}
out:
	if (root_fd >= 0)
		close(root_fd);
	return rc;
}

/* ---- adoption -------------------------------------------------------------------------- */

struct cand {
	kvr_key key;
	uint32_t lane;
	int64_t mtime_ns;  /* probed; before the probe: the inode number (probe order) */
};

enum adopt_tag { T_PROBE = 1, T_UNLINK = 2 };

struct adopt {
	struct kvr_l2_store *s;
	struct kvr_l2_adopt_stats *st;
	struct cand *probe;        /* names to probe */
	size_t n_probe, cap_probe, next_probe;
	struct cand *ok;           /* probed fine */
	size_t n_ok;
	char **tmp;                /* leftovers to remove by name */
	size_t n_tmp, cap_tmp, next_tmp;
	struct cand *del;          /* (key, lane) files to remove */
	size_t n_del, cap_del, next_del;
};

static int push_cand(struct cand **v, size_t *n, size_t *cap, struct cand c)
{
	if (KVR_GROW(*v, *cap, *n + 1, 1024))
		return -ENOMEM;
	(*v)[(*n)++] = c;
	return 0;
}

static int push_tmp(struct adopt *a, const char *name)
{
	if (KVR_GROW(a->tmp, a->cap_tmp, a->n_tmp + 1, 64))
		return -ENOMEM;
	char *c = strdup(name);
	if (!c)
		return -ENOMEM;
	a->tmp[a->n_tmp++] = c;
	return 0;
}

/* Read the directory and sort every entry into probe, tmp (remove), delete or foreign. */
static int adopt_scan(struct adopt *a)
{
	struct kvr_l2_store *s = a->s;
	DIR *d = kvr_l2_opendir(s->dir_fd);
	if (!d)
		return -errno;
	int rc = 0;
	struct dirent *de;
	while ((errno = 0, de = readdir(d))) {
		const char *n = de->d_name;
		if (!strcmp(n, ".") || !strcmp(n, "..") || !strcmp(n, KVR_L2_LOCK_NAME))
			continue;
		a->st->entries++;
		kvr_key key;
		uint32_t lane;
		if (kvr_l2_is_tmp_name(n) || !strncmp(n, ".kvr.probe.", 11)) {
			if (de->d_type != DT_DIR) {
				a->st->rejected[KVR_L2_R_TMP]++;
				if (s->cfg.read_only)
					a->st->left_in_place++;
				else
					rc = push_tmp(a, n);
			} else {
				a->st->rejected[KVR_L2_R_NOTREG]++;
				a->st->left_alone++;
			}
		} else if (kvr_l2_name_parse(n, &key, &lane)) {
			a->st->rejected[KVR_L2_R_FOREIGN]++;
			a->st->left_alone++;
		} else if (de->d_type == DT_DIR) {
			a->st->rejected[KVR_L2_R_NOTREG]++;
			a->st->left_alone++;
		} else if (lane >= s->cfg.lanes) {
			a->st->rejected[KVR_L2_R_LANE]++;
			if (s->cfg.read_only)
				a->st->left_in_place++;
			else
				rc = push_cand(&a->del, &a->n_del, &a->cap_del, (struct cand){key, lane, 0});
		} else {
			rc = push_cand(&a->probe, &a->n_probe, &a->cap_probe, (struct cand){key, lane, (int64_t)de->d_ino});
		}
		if (rc)
			break;
	}
	if (!rc && errno)
		rc = -errno;
	closedir(d);
	return rc;
}

/* Set an adopted block file that the probe found with other permission bits to 0600 (an older kvring wrote
 * it 0644, or it was copied in). Through a descriptor opened without following a symlink, so only the file
 * the probe checked is changed. 0 or -errno. */
static int fix_file_mode(struct kvr_l2_store *s, kvr_key key, uint32_t lane)
{
	char name[KVR_L2_NAME_MAX];
	struct stat st;
	int fd = openat(s->dir_fd, kvr_l2_name_fmt(key, lane, name),
			O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int rc = fstat(fd, &st) ? -errno : !S_ISREG(st.st_mode) ? -EBADMSG : fchmod(fd, 0600) ? -errno : 0;
	close(fd);
	return rc;
}

static void adopt_on_done(struct adopt *a, const struct kvr_l2io_done *d)
{
	struct kvr_l2io_done f;

	if ((d->tag >> 56) == T_UNLINK) {
		if (d->res == 0)
			a->st->deleted++;
		return;
	}
	if (d->res == 0 && d->mode != 0600 && !a->s->cfg.read_only) {
		int rc = fix_file_mode(a->s, d->key, d->lane);
		if (rc == 0) {
			a->st->modes_fixed++;
		} else {
			f = *d;
			f.res = rc;
			f.reason = rc == -ENOENT ? KVR_L2_R_VANISHED : KVR_L2_R_MODE;
			d = &f;
		}
	}
	if (d->res == 0) {
		a->ok[a->n_ok++] = (struct cand){d->key, d->lane, d->mtime_ns};
		return;
	}
	a->st->rejected[d->reason < KVR_L2_R_MAX ? d->reason : KVR_L2_R_IO]++;
	if (d->reason == KVR_L2_R_NOTREG || d->reason == KVR_L2_R_VANISHED) {
		if (d->reason == KVR_L2_R_NOTREG)
			a->st->left_alone++;
		return;
	}
	/* ours by name, but not a block of this configuration: remove it (a failed push only
	 * leaves the file for the next start); read-only: leave it */
	if (a->s->cfg.read_only) {
		a->st->left_in_place++;
		return;
	}
	(void)push_cand(&a->del, &a->n_del, &a->cap_del, (struct cand){d->key, d->lane, 0});
}

/* Run every queued probe and unlink through the engine, queue_depth at a time. */
static int adopt_pump(struct adopt *a)
{
	struct kvr_l2_store *s = a->s;
	struct kvr_l2io *io = s->io;
	unsigned qd = kvr_l2io_queue_depth(io);
	for (;;) {
		while (kvr_l2io_busy(io) < qd) {
			int rc;
			if (a->next_tmp < a->n_tmp) {
				rc = kvr_l2io_unlink_name(io, a->tmp[a->next_tmp], (kvr_key){0, 0}, 0,
							  (uint64_t)T_UNLINK << 56);
				a->next_tmp++;
			} else if (a->next_del < a->n_del) {
				struct cand *c = &a->del[a->next_del++];
				rc = kvr_l2io_unlink(io, c->key, c->lane, (uint64_t)T_UNLINK << 56);
			} else if (a->next_probe < a->n_probe) {
				struct cand *c = &a->probe[a->next_probe++];
				rc = kvr_l2io_probe(io, c->key, c->lane, (uint64_t)T_PROBE << 56);
			} else {
				break;
			}
			if (rc)
				return rc;
		}
		if (!kvr_l2io_busy(io))
			return 0;
		int n = kvr_l2io_reap(io, s->iobuf, qd, 1);
		if (n < 0)
			return n;
		for (int i = 0; i < n; i++)
			adopt_on_done(a, &s->iobuf[i]);
	}
}

static int cand_newest_first(const void *pa, const void *pb)
{
	const struct cand *x = pa, *y = pb;
	if (x->mtime_ns != y->mtime_ns)
		return x->mtime_ns > y->mtime_ns ? -1 : 1;
	if (x->key.hi != y->key.hi)
		return x->key.hi > y->key.hi ? -1 : 1;
	if (x->key.lo != y->key.lo)
		return x->key.lo > y->key.lo ? -1 : 1;
	return x->lane > y->lane ? -1 : x->lane < y->lane;
}

static int cand_by_ino(const void *pa, const void *pb)
{
	const struct cand *x = pa, *y = pb;
	return x->mtime_ns < y->mtime_ns ? -1 : x->mtime_ns > y->mtime_ns;
}

static int adopt(struct kvr_l2_store *s, struct kvr_l2_adopt_stats *st)
{
	uint64_t t0 = kvr_now_ns();
	struct adopt a = {.s = s, .st = st};
	int rc = adopt_scan(&a);
	if (rc)
		goto out;
	/* probe in inode order: on a cold cache the inode tables and headers are read nearly in
	 * disk order instead of at random */
	if (a.n_probe)
		qsort(a.probe, a.n_probe, sizeof(*a.probe), cand_by_ino);
	a.ok = malloc((a.n_probe ? a.n_probe : 1) * sizeof(*a.ok));
	if (!a.ok) {
		rc = -ENOMEM;
		goto out;
	}
	rc = adopt_pump(&a);
	if (rc)
		goto out;
	/* newest first: keep while it fits, delete the older rest */
	if (a.n_ok)
		qsort(a.ok, a.n_ok, sizeof(*a.ok), cand_newest_first);
	uint64_t keep = s->cfg.capacity_bytes / s->fb;
	if (keep > a.n_ok)
		keep = a.n_ok;
	for (size_t i = keep; i < a.n_ok; i++) {
		st->rejected[KVR_L2_R_OVER_CAP]++;
		if (s->cfg.read_only) {
			st->left_in_place++;
			continue;
		}
		rc = push_cand(&a.del, &a.n_del, &a.cap_del, a.ok[i]);
		if (rc)
			goto out;
	}
	/* oldest first into the LRU */
	for (size_t i = keep; i-- > 0;) {
		rc = kvr_l2_index_add_present(s, a.ok[i].key, a.ok[i].lane);
		if (rc)
			goto out;
	}
	st->adopted = keep;
	st->adopted_bytes = keep * s->fb;
	rc = adopt_pump(&a); /* the over-cap and bad files (none when read-only) */
out:
	for (size_t i = 0; i < a.n_tmp; i++)
		free(a.tmp[i]);
	free(a.tmp);
	free(a.probe);
	free(a.ok);
	free(a.del);
	st->elapsed_ns = kvr_now_ns() - t0;
	return rc;
}

int kvr_l2_adopt(struct kvr_l2_store *s, struct kvr_l2_adopt_stats *ast)
{
	int rc = adopt(s, ast);
	if (rc)
		return rc;
	if (ast->modes_fixed)
		kvr_warn("l2 %s: %llu block files had modes other than 0600: now 0600", s->dir,
			 (unsigned long long)ast->modes_fixed);
	if (ast->rejected[KVR_L2_R_MODE])
		kvr_warn("l2 %s: %llu block files could not be set to 0600: not adopted, removed", s->dir,
			 (unsigned long long)ast->rejected[KVR_L2_R_MODE]);
	return 0;
}
