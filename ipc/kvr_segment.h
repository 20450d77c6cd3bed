/* kvr_segment: fixed-size memfd-backed shared-memory segments with a validated header. */
#ifndef KVR_SEGMENT_H
#define KVR_SEGMENT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/*
 * Every segment starts with struct kvr_seg_hdr. kvringd creates segments
 * (kvr_segment_create); actors and clients receive the fd (inherited or over SCM_RIGHTS)
 * and map it (kvr_segment_map), which validates magic, layout version, kind and size
 * before anything else in the segment is read.
 *
 * Segments are memfds: anonymous, mode 0600 by construction (no path to open), sealed
 * against growing or shrinking. Huge pages (MFD_HUGETLB) are tried first when asked and
 * the size is a multiple of 2 MiB; plain pages otherwise.
 */

#define KVR_SEG_MAGIC 0x4745534752564b00ull /* "\0KVRSEG" little-endian-ish tag */
#define KVR_LAYOUT_VERSION 5u /* 2: client areas in the control segment (kvr_ctl.h); 3: their cancel table;
			       * 4: their layer-ordered loads' progress table; 5: the model table and
			       * each slot's model */

enum kvr_seg_kind {
	KVR_SEG_CTL = 1,   /* control: instance, actors, ring directory, rings, stats */
	KVR_SEG_ARENA = 2, /* L1 slots (KV bytes) */
	KVR_SEG_SLOTS = 3, /* slot table and index */
	KVR_SEG_KV = 4,    /* a worker's KV memory (host backend), created by the client */
	KVR_SEG_CLIENT = 5, /* one client slot's area of the control segment: its rings, its waiter
			     * (its header is informational: the client writes it) */
};

struct kvr_seg_hdr {
	uint64_t magic;
	uint32_t layout_version;
	uint32_t kind;
	uint64_t size;        /* bytes of the whole segment, header included */
	int32_t creator_pid;
	uint32_t generation;  /* kvringd instance generation that created it */
	uint64_t created_ns;  /* CLOCK_REALTIME */
	uint8_t reserved[24];
};
_Static_assert(sizeof(struct kvr_seg_hdr) == 64, "segment header is one cache line");

struct kvr_segment {
	int fd;
	void *base;
	size_t size;
	int writable;
	int huge; /* 1 when backed by huge pages (hugetlb, MFD_HUGETLB) */
	int thp;  /* create: 1 when transparent huge pages were asked for the mapping and the
		   * system allows them for shared memory (shmem_enabled not never/deny) */
};

/* The system's setting for transparent huge pages of shared memory (memfd, tmpfs):
 * /sys/kernel/mm/transparent_hugepage/shmem_enabled's selected word ("never" when it
 * cannot be read), into buf. */
const char *kvr_shmem_thp_mode(char *buf, size_t len);

/* Create a segment of size bytes (rounded up to the page size) and map it read-write.
 * flags: KVR_SEG_TRY_HUGE to try huge pages first. Writes the header.
 * Returns 0 or -errno; *ret untouched on failure. */
#define KVR_SEG_TRY_HUGE 0x1u
/* An arena (kind KVR_SEG_ARENA) without hugetlb pages is mapped at a 2 MiB boundary and
 * advised MADV_HUGEPAGE, by kvr_segment_create and kvr_segment_map alike: where
 * shmem_enabled allows it (advise, always, within_size, force) its pages are transparent
 * huge pages, mapped by one page-table entry per 2 MiB in every process. */
int kvr_segment_create(const char *name, enum kvr_seg_kind kind, size_t size, uint32_t generation,
		       unsigned flags, struct kvr_segment *ret);

/* Map an existing segment fd. writable=0 maps it read-only (observers such as inspect).
 * expect_kind 0 accepts any kind. Validates the header: -EPROTO on wrong magic/version,
 * -EMEDIUMTYPE on wrong kind, -EBADMSG when the header size disagrees with the fd size.
 * The fd is dup'ed: the caller keeps its own. */
int kvr_segment_map(int fd, enum kvr_seg_kind expect_kind, int writable, struct kvr_segment *ret);

/* Map fd, which must be exactly `size` bytes, read-write when `writable`, over [addr, addr +
 * size) of a mapping this process owns (MAP_FIXED replaces what was there): a control
 * segment's client areas (kvr_ctl_map_area()). Nothing in it is read: its contents may be a
 * client's. -EBADMSG when the size differs; the fd is not kept. */
int kvr_segment_map_over(int fd, int writable, void *addr, size_t size);

/* Fault every page of [base, base+len) in now, writable (MADV_POPULATE_WRITE), so the data
 * path never takes a page fault on L1. Returns 0 or -errno (-EINVAL on kernels before
 * 5.14: callers treat a failure as "not populated", never as fatal). */
int kvr_populate(void *base, size_t len);
/* The same, readable (MADV_POPULATE_READ) unless `write`: for a mapping the caller only reads. */
int kvr_populate_rw(void *base, size_t len, int write);

/* The bytes of page tables process pid holds (VmPTE of /proc/<pid>/status): what mapping a
 * large arena costs it (8 bytes per 4 KiB page it touched, per 2 MiB with huge pages).
 * 0 and *ret, or -errno (-ENOENT: no such process, -EACCES). */
int kvr_proc_page_tables(int pid, uint64_t *ret);

/* Unmap and close; accepts a zeroed or already-closed segment. */
void kvr_segment_close(struct kvr_segment *seg);

static inline struct kvr_seg_hdr *kvr_segment_hdr(const struct kvr_segment *seg)
{
	return (struct kvr_seg_hdr *)seg->base;
}

#endif
