/* Shared-memory segments: memfd create/map with header validation. */
#include "kvr_segment.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "kvr_time.h"

#define HUGE_2M (2ull << 20)

#ifndef MADV_HUGEPAGE
#define MADV_HUGEPAGE 14
#endif

const char *kvr_shmem_thp_mode(char *buf, size_t len)
{
	char line[128] = "";
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/shmem_enabled", "r");
	if (f) {
		if (!fgets(line, sizeof(line), f))
			line[0] = 0;
		fclose(f);
	}
	char *l = strchr(line, '['), *r = l ? strchr(l, ']') : NULL;
	if (l && r && (size_t)(r - l - 1) < len) {
		memcpy(buf, l + 1, (size_t)(r - l - 1));
		buf[r - l - 1] = 0;
	} else {
		snprintf(buf, len, "never");
	}
	return buf;
}

/* Map fd's size bytes shared at a 2 MiB boundary (so the kernel may map it with 2 MiB
 * entries) and advise transparent huge pages. Returns the address or MAP_FAILED. */
static void *map_arena(int fd, size_t size, int prot)
{
	uint8_t *res = mmap(NULL, size + HUGE_2M, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (res == MAP_FAILED)
		return MAP_FAILED;
	uint8_t *at = (uint8_t *)(((uintptr_t)res + HUGE_2M - 1) & ~(uintptr_t)(HUGE_2M - 1));
	void *base = mmap(at, size, prot, MAP_SHARED | MAP_FIXED, fd, 0);
	if (base == MAP_FAILED) {
		int e = errno;
		munmap(res, size + HUGE_2M);
		errno = e;
		return MAP_FAILED;
	}
	if (at > res)
		munmap(res, (size_t)(at - res));
	size_t tail = (size_t)(res + size + HUGE_2M - (at + size));
	if (tail)
		munmap(at + size, tail);
	(void)madvise(base, size, MADV_HUGEPAGE); /* best effort: never where THP is off */
	return base;
}

static int make_memfd(const char *name, size_t size, int huge)
{
	unsigned mflags = MFD_CLOEXEC | MFD_ALLOW_SEALING;
	if (huge)
		mflags |= MFD_HUGETLB;
	int fd = memfd_create(name, mflags);
	if (fd < 0)
		return -errno;
	if (fchmod(fd, 0600) < 0 || ftruncate(fd, (off_t)size) < 0) {
		int rc = -errno;
		close(fd);
		return rc;
	}
	return fd;
}

int kvr_segment_create(const char *name, enum kvr_seg_kind kind, size_t size, uint32_t generation,
		       unsigned flags, struct kvr_segment *ret)
{
	if (!name || !ret || size < sizeof(struct kvr_seg_hdr))
		return -EINVAL;
	long pg = sysconf(_SC_PAGESIZE);
	size = (size + (size_t)pg - 1) & ~((size_t)pg - 1);

	int fd = -1, huge = 0;
	void *base = MAP_FAILED;
	if ((flags & KVR_SEG_TRY_HUGE) && size % HUGE_2M == 0) {
		fd = make_memfd(name, size, 1);
		if (fd >= 0) {
			/* Huge pages are reserved at mmap time (a failure here means not enough
			 * free), so they need no faulting in now: a fault later cannot fail. */
			base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
			if (base == MAP_FAILED) {
				close(fd);
				fd = -1;
			} else {
				huge = 1;
			}
		}
	}
	int thp = 0;
	if (fd < 0) {
		fd = make_memfd(name, size, 0);
		if (fd < 0)
			return fd;
		if (kind == KVR_SEG_ARENA) {
			char mode[24];
			kvr_shmem_thp_mode(mode, sizeof(mode));
			thp = strcmp(mode, "never") && strcmp(mode, "deny");
			base = map_arena(fd, size, PROT_READ | PROT_WRITE);
		} else {
			base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		}
		if (base == MAP_FAILED) {
			int rc = -errno;
			close(fd);
			return rc;
		}
	}
	/* The size is part of the contract: nobody may grow or shrink it afterwards. */
	(void)fcntl(fd, F_ADD_SEALS, F_SEAL_GROW | F_SEAL_SHRINK | F_SEAL_SEAL);

	struct kvr_seg_hdr *h = base;
	memset(h, 0, sizeof(*h));
	h->layout_version = KVR_LAYOUT_VERSION;
	h->kind = kind;
	h->size = size;
	h->creator_pid = getpid();
	h->generation = generation;
	h->created_ns = kvr_realtime_ns();
	__atomic_store_n(&h->magic, KVR_SEG_MAGIC, __ATOMIC_RELEASE);

	*ret = (struct kvr_segment){.fd = fd, .base = base, .size = size, .writable = 1, .huge = huge, .thp = thp};
	return 0;
}

int kvr_segment_map(int fd, enum kvr_seg_kind expect_kind, int writable, struct kvr_segment *ret)
{
	if (fd < 0 || !ret)
		return -EINVAL;
	struct stat st;
	if (fstat(fd, &st) < 0)
		return -errno;
	if ((size_t)st.st_size < sizeof(struct kvr_seg_hdr))
		return -EBADMSG;
	int myfd = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	if (myfd < 0)
		return -errno;
	size_t size = (size_t)st.st_size;
	int prot = writable ? PROT_READ | PROT_WRITE : PROT_READ;
	struct statfs sfs;
	/* an arena of normal pages: at a 2 MiB boundary, THP advised (as kvr_segment_create) */
	bool arena = expect_kind == KVR_SEG_ARENA && !(fstatfs(myfd, &sfs) == 0 && sfs.f_type == HUGETLBFS_MAGIC);
	void *base = arena ? map_arena(myfd, size, prot) : mmap(NULL, size, prot, MAP_SHARED, myfd, 0);
	if (base == MAP_FAILED) {
		int rc = -errno;
		close(myfd);
		return rc;
	}
	const struct kvr_seg_hdr *h = base;
	int rc = 0;
	if (__atomic_load_n(&h->magic, __ATOMIC_ACQUIRE) != KVR_SEG_MAGIC || h->layout_version != KVR_LAYOUT_VERSION)
		rc = -EPROTO;
	else if (expect_kind && h->kind != (uint32_t)expect_kind)
		rc = -EMEDIUMTYPE;
	else if (h->size != size)
		rc = -EBADMSG;
	if (rc) {
		munmap(base, size);
		close(myfd);
		return rc;
	}
	*ret = (struct kvr_segment){.fd = myfd, .base = base, .size = size, .writable = writable};
	return 0;
}

int kvr_segment_map_over(int fd, int writable, void *addr, size_t size)
{
	if (fd < 0 || !addr || !size)
		return -EINVAL;
	struct stat st;
	if (fstat(fd, &st) < 0)
		return -errno;
	if ((uint64_t)st.st_size != size)
		return -EBADMSG;
	void *got = mmap(addr, size, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0);
	return got == MAP_FAILED ? -errno : 0;
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

int kvr_populate_rw(void *base, size_t len, int write)
{
	return madvise(base, len, write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) ? -errno : 0;
}

int kvr_populate(void *base, size_t len)
{
	return kvr_populate_rw(base, len, 1);
}

void kvr_segment_close(struct kvr_segment *seg)
{
	if (!seg)
		return;
	if (seg->base && seg->base != MAP_FAILED)
		munmap(seg->base, seg->size);
	if (seg->fd >= 0 && seg->base)
		close(seg->fd);
	*seg = (struct kvr_segment){.fd = -1};
}

int kvr_proc_page_tables(int pid, uint64_t *ret)
{
	char path[40], line[128];
	snprintf(path, sizeof(path), "/proc/%d/status", pid);
	FILE *f = fopen(path, "r");
	if (!f)
		return -errno;
	int rc = -ENODATA;
	unsigned long long kb;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmPTE: %llu kB", &kb) == 1) {
			*ret = (uint64_t)kb * 1024;
			rc = 0;
			break;
		}
	fclose(f);
	return rc;
}
