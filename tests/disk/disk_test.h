/* Helpers shared by the L2 disk tests: temp dirs, an arena in a memfd, payload patterns, directory listings. */
#ifndef KVR_DISK_TEST_H
#define KVR_DISK_TEST_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <liburing.h>

#include "../ipc/ipc_test.h"
#include "l2file.h"
#include "l2store.h"
#include "uring.h"

/* ---- temp directories ------------------------------------------------------------------ */

static int dt_rm_cb(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb;
	(void)flag;
	(void)ftw;
	return remove(path) && errno != ENOENT ? -1 : 0;
}

/* rm -rf path (no error if it does not exist). */
/* Open a store with cfg; asserts it opened. */
static inline struct kvr_l2_store *dt_store_open(const struct kvr_l2_store_config *cfg, struct kvr_l2_adopt_stats *ast)
{
	struct kvr_l2_store *st = NULL;
	int rc = kvr_l2_store_open(cfg, ast, &st);
	cr_assert_eq(rc, 0, "kvr_l2_store_open: %s", strerror(-rc));
	return st;
}

static inline void dt_rmrf(const char *path)
{
	(void)nftw(path, dt_rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

/* A fresh directory /tmp/kvr-<what>-<pid>-<n> into buf (>= 128). */
static inline const char *dt_mkdtemp(const char *what, char *buf)
{
	static int n;
	snprintf(buf, 128, "/tmp/kvr-%s-%d-%d", what, (int)getpid(), n++);
	dt_rmrf(buf);
	if (mkdir(buf, 0755))
		return NULL;
	return buf;
}

/* ---- environment --------------------------------------------------------------------- */

/* Whether dir's filesystem takes O_DIRECT (1), refuses it (0); -errno on other errors. */
static inline int dt_direct_ok(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int rc = kvr_l2io_probe_direct(fd);
	close(fd);
	return rc;
}

/* Whether this kernel (and seccomp policy) gives us io_uring with direct descriptors. */
static inline bool dt_uring_ok(void)
{
	struct io_uring r;
	if (io_uring_queue_init(4, &r, 0))
		return false;
	bool ok = io_uring_register_files_sparse(&r, 4) == 0;
	io_uring_queue_exit(&r);
	return ok;
}

/* A Criterion main that exits 77 (meson: SKIP) where io_uring is not available. */
#define DT_MAIN_NEEDS_URING \
	int main(int argc, char *argv[]) \
	{ \
		if (!dt_uring_ok()) { \
			fprintf(stderr, "io_uring (with direct descriptors) is not available: skipped\n"); \
			return 77; \
		} \
		struct criterion_test_set *tests = criterion_initialize(); \
		int result = 0; \
		if (criterion_handle_args(argc, argv, true)) \
			result = !criterion_run_all_tests(tests); \
		criterion_finalize(tests); \
		return result; \
	}

/* ---- the arena: a memfd mapping like kvringd's, slots of slot_bytes after 4 KiB --------- */

struct dt_arena {
	uint8_t *base;
	size_t bytes;
	uint64_t data_off, slot_bytes;
	uint32_t n_slots;
};

/* The arena members of a struct kvr_l2io_config / kvr_l2_store_config, from a dt_arena. */
#define DT_ARENA_CFG(a) \
	.arena = (a).base, .arena_bytes = (a).bytes, .arena_data_off = (a).data_off, .slot_bytes = (a).slot_bytes

static inline int dt_arena_new(uint32_t n_slots, uint64_t lane_bytes, struct dt_arena *ret)
{
	uint64_t sb = kvr_l2_payload_bytes(lane_bytes);
	size_t bytes = 4096 + (size_t)n_slots * sb;
	int fd = memfd_create("kvr-test-arena", MFD_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)bytes)) {
		close(fd);
		return -errno;
	}
	void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (p == MAP_FAILED)
		return -errno;
	*ret = (struct dt_arena){p, bytes, 4096, sb, n_slots};
	return 0;
}

static inline void dt_arena_free(struct dt_arena *a)
{
	if (a->base)
		munmap(a->base, a->bytes);
	a->base = NULL;
}

static inline uint8_t *dt_slot(const struct dt_arena *a, uint32_t i)
{
	return a->base + a->data_off + (size_t)i * a->slot_bytes;
}

/* ---- payloads -------------------------------------------------------------------------- */

/* The key of test block i under salt. */
static inline kvr_key dt_key(uint64_t salt, uint64_t i)
{
	uint64_t in[2] = {salt, i};
	return kvr_key_hash(in, sizeof(in));
}

/* Fill len bytes with the pattern of (key, lane, seed): every 8 bytes differ. */
static inline void dt_fill(void *p, uint64_t len, kvr_key key, uint32_t lane, uint64_t seed)
{
	uint8_t *b = p;
	uint64_t s = key.lo ^ mix64(key.hi + lane) ^ seed;
	uint64_t i = 0;
	for (; i + 8 <= len; i += 8) {
		uint64_t w = mix64(s + i);
		memcpy(b + i, &w, 8);
	}
	for (uint64_t w = mix64(s + i); i < len; i++, w >>= 8)
		b[i] = (uint8_t)w;
}

/* 0 when p holds exactly the pattern, else 1 + the first bad offset. */
static inline uint64_t dt_check(const void *p, uint64_t len, kvr_key key, uint32_t lane, uint64_t seed)
{
	uint8_t *want = malloc(len ? len : 1);
	dt_fill(want, len, key, lane, seed);
	uint64_t bad = 0;
	for (uint64_t i = 0; i < len; i++)
		if (((const uint8_t *)p)[i] != want[i]) {
			bad = i + 1;
			break;
		}
	free(want);
	return bad;
}

/* ---- directory contents ---------------------------------------------------------------- */

struct dt_listing {
	unsigned real, tmp, other; /* block names, temporary names, everything else (lock excluded) */
};

static inline struct dt_listing dt_list(const char *dir)
{
	struct dt_listing l = {0};
	DIR *d = opendir(dir);
	if (!d)
		return l;
	struct dirent *de;
	while ((de = readdir(d))) {
		kvr_key k;
		uint32_t lane;
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") || !strcmp(de->d_name, KVR_L2_LOCK_NAME))
			continue;
		if (!kvr_l2_name_parse(de->d_name, &k, &lane))
			l.real++;
		else if (kvr_l2_is_tmp_name(de->d_name))
			l.tmp++;
		else
			l.other++;
	}
	closedir(d);
	return l;
}

/* <dir>/<name> exists? */
static inline int dt_exists(const char *dir, const char *name)
{
	char p[512];
	struct stat st;
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	return lstat(p, &st) == 0;
}

/* Path of (key, lane)'s block file under dir into buf (>= 512). */
static inline const char *dt_path(const char *dir, kvr_key key, uint32_t lane, char *buf)
{
	char name[KVR_L2_NAME_MAX];
	snprintf(buf, 512, "%s/%s", dir, kvr_l2_name_fmt(key, lane, name));
	return buf;
}

/* Flip one byte of a file at off. 0 or -errno. */
static inline int dt_flip(const char *path, off_t off)
{
	int fd = open(path, O_RDWR);
	if (fd < 0)
		return -errno;
	uint8_t b;
	int rc = pread(fd, &b, 1, off) == 1 ? 0 : -EIO;
	b ^= 0x5a;
	if (!rc && pwrite(fd, &b, 1, off) != 1)
		rc = -EIO;
	close(fd);
	return rc;
}

/* Set header byte off (0..4087) of a block file to v and reseal the header checksum, so the header reads
 * as intact and only the byte itself can be refused. 0 or -errno. */
static inline int dt_hdr_poke(const char *path, size_t off, uint8_t v)
{
	struct kvr_l2_hdr h;
	int fd = open(path, O_RDWR);
	if (fd < 0)
		return -errno;
	int rc = pread(fd, &h, sizeof(h), 0) == (ssize_t)sizeof(h) ? 0 : -EIO;
	if (!rc && off < offsetof(struct kvr_l2_hdr, hdr_xxh3)) {
		((uint8_t *)&h)[off] = v;
		kvr_l2_hdr_seal(&h);
		rc = pwrite(fd, &h, sizeof(h), 0) == (ssize_t)sizeof(h) ? 0 : -EIO;
	} else if (!rc) {
		rc = -EINVAL;
	}
	close(fd);
	return rc;
}

/* Write a whole file. 0 or -errno. */
static inline int dt_write_file(const char *path, const void *p, size_t len)
{
	int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
	if (fd < 0)
		return -errno;
	int rc = write(fd, p, len) == (ssize_t)len ? 0 : -EIO;
	close(fd);
	return rc;
}

/* Build a complete block file image (header + padded payload with pattern seed) in a
 * malloc'd buffer of kvr_l2_file_bytes(ident->lane_bytes) bytes. */
static inline uint8_t *dt_image(const struct kvr_l2_ident *ident, kvr_key key, uint32_t lane, uint64_t seed)
{
	uint64_t fb = kvr_l2_file_bytes(ident->lane_bytes);
	uint8_t *img = calloc(1, fb);
	dt_fill(img + KVR_L2_HDR_BYTES, ident->lane_bytes, key, lane, seed);
	kvr_l2_hdr_build((struct kvr_l2_hdr *)img, ident, key, lane,
			 kvr_l2_payload_hash(img + KVR_L2_HDR_BYTES, ident->lane_bytes));
	return img;
}

/* Set a file's mtime (seconds since the epoch). */
static inline int dt_set_mtime(const char *path, time_t sec)
{
	struct timespec ts[2] = {{sec, 0}, {sec, 0}};
	return utimensat(AT_FDCWD, path, ts, AT_SYMLINK_NOFOLLOW) ? -errno : 0;
}

#endif
