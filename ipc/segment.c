/* Shared-memory segments: memfd create/map with header validation. */
#include "kvr_segment.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvr_time.h"

#define HUGE_2M (2ull << 20)

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
	if (fd < 0) {
		fd = make_memfd(name, size, 0);
		if (fd < 0)
			return fd;
		base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
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

	*ret = (struct kvr_segment){.fd = fd, .base = base, .size = size, .writable = 1, .huge = huge};
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
	void *base = mmap(NULL, size, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, myfd, 0);
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

int kvr_populate(void *base, size_t len)
{
	return madvise(base, len, MADV_POPULATE_WRITE) ? -errno : 0;
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
