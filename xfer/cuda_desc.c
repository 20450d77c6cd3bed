/* CUDA KV descriptor: create (worker side), read and check (actor side), store-event table. CUDA-free. */
#include "kvr_cuda.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvr_log.h"

#define PAGE 4096ull

static uint64_t round_up(uint64_t v, uint64_t a)
{
	return (v + a - 1) / a * a;
}

static int all_zero(const void *p, size_t n)
{
	const uint8_t *b = p;
	for (size_t i = 0; i < n; i++)
		if (b[i])
			return 0;
	return 1;
}

/* The layout a header promises: offsets in order, no overflow (counts are bounded first). */
static int header_check(const struct kvr_cuda_desc *d, uint64_t fd_bytes, char *err, size_t errlen)
{
	if (d->magic != KVR_CUDA_DESC_MAGIC)
		return kvr_errf(err, errlen, -EBADMSG, "magic %#x, want %#x", d->magic, KVR_CUDA_DESC_MAGIC);
	if (d->version != KVR_CUDA_DESC_VERSION)
		return kvr_errf(err, errlen, -EBADMSG, "version %u, want %u", d->version, KVR_CUDA_DESC_VERSION);
	if (d->n_ranges == 0 || d->n_ranges > KVR_CUDA_MAX_RANGES)
		return kvr_errf(err, errlen, -EBADMSG, "n_ranges %u: must be 1..%u", d->n_ranges, KVR_CUDA_MAX_RANGES);
	if (d->n_events > KVR_CUDA_MAX_EVENTS || (d->n_events & (d->n_events - 1)))
		return kvr_errf(err, errlen, -EBADMSG, "n_events %u: must be 0 or a power of two <= %u", d->n_events,
			   KVR_CUDA_MAX_EVENTS);
	if (!all_zero(d->reserved, sizeof(d->reserved)))
		return kvr_errf(err, errlen, -EBADMSG, "reserved header bytes are not zero");
	if (d->kv_bytes == 0)
		return kvr_errf(err, errlen, -EBADMSG, "kv_bytes is 0");
	if (d->ranges_off != sizeof(*d))
		return kvr_errf(err, errlen, -EBADMSG, "ranges_off %llu, want %zu", (unsigned long long)d->ranges_off,
			   sizeof(*d));
	uint64_t ranges_end = d->ranges_off + (uint64_t)d->n_ranges * sizeof(struct kvr_cuda_range);
	if (d->events_off < ranges_end || d->events_off % 64 || d->events_off > (1ull << 40))
		return kvr_errf(err, errlen, -EBADMSG, "events_off %llu: must be a multiple of 64 at or after %llu",
			   (unsigned long long)d->events_off, (unsigned long long)ranges_end);
	uint64_t events_end = d->events_off + (uint64_t)d->n_events * sizeof(struct kvr_cuda_event);
	if (d->desc_bytes < events_end || d->desc_bytes % PAGE || d->desc_bytes > (1ull << 40))
		return kvr_errf(err, errlen, -EBADMSG, "desc_bytes %llu: must be a multiple of 4096 at or after %llu",
			   (unsigned long long)d->desc_bytes, (unsigned long long)events_end);
	if (fd_bytes && (d->kv_bytes > fd_bytes || d->desc_bytes > fd_bytes))
		return kvr_errf(err, errlen, -EBADMSG, "kv_bytes %llu / desc_bytes %llu exceed the fd's %llu bytes",
			   (unsigned long long)d->kv_bytes, (unsigned long long)d->desc_bytes,
			   (unsigned long long)fd_bytes);
	return 0;
}

static int ranges_check(const struct kvr_cuda_range *r, uint32_t n, uint64_t kv_bytes, char *err, size_t errlen)
{
	uint64_t prev_end = 0;
	for (uint32_t i = 0; i < n; i++) {
		uint64_t end, aend;
		if (r[i].bytes == 0)
			return kvr_errf(err, errlen, -EBADMSG, "range %u: 0 bytes", i);
		if (r[i].reserved)
			return kvr_errf(err, errlen, -EBADMSG, "range %u: reserved field not zero", i);
		if (__builtin_add_overflow(r[i].kv_offset, r[i].bytes, &end) || end > kv_bytes)
			return kvr_errf(err, errlen, -EBADMSG, "range %u: [%llu, +%llu) beyond the %llu KV bytes", i,
				   (unsigned long long)r[i].kv_offset, (unsigned long long)r[i].bytes,
				   (unsigned long long)kv_bytes);
		if (__builtin_add_overflow(r[i].alloc_offset, r[i].bytes, &aend))
			return kvr_errf(err, errlen, -EBADMSG, "range %u: alloc_offset + bytes overflows", i);
		if (i > 0 && r[i].kv_offset < prev_end)
			return kvr_errf(err, errlen, -EBADMSG,
				   "range %u: kv_offset %llu overlaps or precedes range %u (ends %llu)", i,
				   (unsigned long long)r[i].kv_offset, i - 1, (unsigned long long)prev_end);
		prev_end = end;
	}
	return 0;
}

int kvr_cuda_desc_check(const void *blob, size_t len, uint64_t fd_bytes, char *err, size_t errlen)
{
	struct kvr_cuda_desc d;

	if (!blob || len < sizeof(d))
		return kvr_errf(err, errlen, -EBADMSG, "descriptor of %zu bytes: shorter than its %zu-byte header", len,
			   sizeof(d));
	memcpy(&d, blob, sizeof(d));
	int rc = header_check(&d, fd_bytes, err, errlen);
	if (rc)
		return rc;
	uint64_t need = d.ranges_off + (uint64_t)d.n_ranges * sizeof(struct kvr_cuda_range);
	if (len < need)
		return kvr_errf(err, errlen, -EBADMSG, "descriptor of %zu bytes: its %u ranges need %llu", len, d.n_ranges,
			   (unsigned long long)need);
	/* The blob is malloc'd or mapped: ranges at offset 96 are 8-byte aligned. */
	return ranges_check((const struct kvr_cuda_range *)((const uint8_t *)blob + d.ranges_off), d.n_ranges,
			    d.kv_bytes, err, errlen);
}

static int pread_all(int fd, void *buf, size_t len, off_t off)
{
	size_t got = 0;
	while (got < len) {
		ssize_t n = pread(fd, (uint8_t *)buf + got, len - got, off + (off_t)got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return -ENODATA;
		got += (size_t)n;
	}
	return 0;
}

/* A sealed-for-write regular file that starts with the magic, and its size. */
static int probe(int fd, struct kvr_cuda_desc *ret_hdr, uint64_t *ret_size)
{
	struct stat st;
	if (fd < 0)
		return -EBADF;
	if (fstat(fd, &st) < 0)
		return -errno;
	int seals = fcntl(fd, F_GET_SEALS);
	if (!S_ISREG(st.st_mode) || seals < 0 || !(seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)))
		return -ENOMSG;
	if ((uint64_t)st.st_size < sizeof(*ret_hdr))
		return -ENOMSG;
	int rc = pread_all(fd, ret_hdr, sizeof(*ret_hdr), 0);
	if (rc)
		return rc == -ENODATA ? -ENOMSG : rc;
	if (ret_hdr->magic != KVR_CUDA_DESC_MAGIC)
		return -ENOMSG;
	*ret_size = (uint64_t)st.st_size;
	return 0;
}

int kvr_cuda_desc_read(int fd, void **ret_blob, size_t *ret_len, char *err, size_t errlen)
{
	struct kvr_cuda_desc d;
	uint64_t fd_bytes;
	int rc = probe(fd, &d, &fd_bytes);

	if (rc == -ENOMSG)
		return kvr_errf(err, errlen, rc, "not a CUDA KV descriptor");
	if (rc)
		return kvr_errf(err, errlen, rc, "reading the KV descriptor: %s", strerror(-rc));
	rc = header_check(&d, fd_bytes, err, errlen);
	if (rc)
		return rc;
	size_t len = (size_t)(d.ranges_off + (uint64_t)d.n_ranges * sizeof(struct kvr_cuda_range));
	void *blob = malloc(len);
	if (!blob)
		return kvr_errf(err, errlen, -ENOMEM, "out of memory");
	rc = pread_all(fd, blob, len, 0);
	if (rc) {
		free(blob);
		return kvr_errf(err, errlen, rc == -ENODATA ? -EBADMSG : rc, "reading the KV descriptor's ranges: %s",
			   strerror(rc == -ENODATA ? EBADMSG : -rc));
	}
	/* Checked on our copy: the header read first is not trusted twice. */
	rc = kvr_cuda_desc_check(blob, len, fd_bytes, err, errlen);
	if (rc) {
		free(blob);
		return rc;
	}
	*ret_blob = blob;
	*ret_len = len;
	return 0;
}

/* ---- worker side ------------------------------------------------------------------------ */

int kvr_cuda_desc_create(const struct kvr_cuda_range *ranges, uint32_t n, uint64_t kv_bytes,
			 const uint8_t device_uuid[16], uint32_t n_events, struct kvr_cuda_export *ret, char *err,
			 size_t errlen)
{
	struct kvr_cuda_desc d = {
		.magic = KVR_CUDA_DESC_MAGIC,
		.version = KVR_CUDA_DESC_VERSION,
		.n_ranges = n,
		.n_events = n_events,
		.kv_bytes = kv_bytes,
		.ranges_off = sizeof(struct kvr_cuda_desc),
		.worker_pid = (int32_t)getpid(),
	};
	int rc;

	if (!ranges || !device_uuid || !ret)
		return kvr_errf(err, errlen, -EINVAL, "NULL argument");
	if (n == 0 || n > KVR_CUDA_MAX_RANGES)
		return kvr_errf(err, errlen, -EINVAL, "%u ranges: must be 1..%u", n, KVR_CUDA_MAX_RANGES);
	memcpy(d.device_uuid, device_uuid, sizeof(d.device_uuid));
	d.events_off = round_up(d.ranges_off + (uint64_t)n * sizeof(*ranges), 64);
	d.desc_bytes = round_up(d.events_off + (uint64_t)n_events * sizeof(struct kvr_cuda_event), PAGE);
	if ((rc = header_check(&d, 0, err, errlen)) || (rc = ranges_check(ranges, n, kv_bytes, err, errlen)))
		return -EINVAL;

	uint64_t fd_bytes = kv_bytes > d.desc_bytes ? kv_bytes : d.desc_bytes;
	int fd = memfd_create("kvring-cuda-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return kvr_errf(err, errlen, -errno, "memfd_create: %s", strerror(errno));
	void *map = MAP_FAILED;
	if (ftruncate(fd, (off_t)fd_bytes) < 0) {
		rc = kvr_errf(err, errlen, -errno, "ftruncate to %llu bytes: %s", (unsigned long long)fd_bytes,
			 strerror(errno));
		goto fail;
	}
	map = mmap(NULL, (size_t)d.desc_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED) {
		rc = kvr_errf(err, errlen, -errno, "mmap: %s", strerror(errno));
		goto fail;
	}
	memcpy(map, &d, sizeof(d));
	memcpy((uint8_t *)map + d.ranges_off, ranges, (size_t)n * sizeof(*ranges));
	/* The mapping above stays writable (the event table); no new writable mapping, no
	 * write(), no resize from here on. */
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) < 0) {
		rc = kvr_errf(err, errlen, -errno, "sealing the descriptor: %s", strerror(errno));
		goto fail;
	}
	*ret = (struct kvr_cuda_export){
		.fd = fd,
		.fd_bytes = fd_bytes,
		.events = n_events ? (struct kvr_cuda_event *)((uint8_t *)map + d.events_off) : NULL,
		.n_events = n_events,
		.map = map,
		.map_len = (size_t)d.desc_bytes,
	};
	return 0;
fail:
	if (map != MAP_FAILED)
		(void) munmap(map, (size_t)d.desc_bytes);
	(void) close(fd);
	return rc;
}

void kvr_cuda_export_close(struct kvr_cuda_export *x)
{
	if (!x)
		return;
	if (x->fd >= 0)
		(void) close(x->fd);
	if (x->map)
		(void) munmap(x->map, x->map_len);
	*x = (struct kvr_cuda_export){.fd = -1};
}

int kvr_cuda_export_event(struct kvr_cuda_export *x, uint64_t wire, const void *handle)
{
	if (!x || !x->events || !x->n_events || !wire || !handle)
		return -EINVAL;
	struct kvr_cuda_event *e = &x->events[wire & (x->n_events - 1)];
	__atomic_store_n(&e->wire, 0, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_RELEASE);
	memcpy(e->handle, handle, KVR_CUDA_IPC_BYTES);
	/* pairs with the acquire load in kvr_cuda_events_dep; the ring message that carries
	 * the STORE orders it again */
	__atomic_store_n(&e->wire, wire, __ATOMIC_RELEASE);
	return 0;
}

/* ---- actor side: store events ----------------------------------------------------------- */

int kvr_cuda_events_map(int fd, struct kvr_cuda_events *ret)
{
	struct kvr_cuda_desc d;
	uint64_t fd_bytes;
	int rc = probe(fd, &d, &fd_bytes);

	if (rc)
		return rc;
	if (!ret)
		return -EINVAL;
	if (header_check(&d, fd_bytes, NULL, 0))
		return -EBADMSG;
	void *map = mmap(NULL, (size_t)d.desc_bytes, PROT_READ, MAP_SHARED, fd, 0);
	if (map == MAP_FAILED)
		return -errno;
	*ret = (struct kvr_cuda_events){
		.tab = d.n_events ? (const struct kvr_cuda_event *)((const uint8_t *)map + d.events_off) : NULL,
		.n = d.n_events,
		.map = map,
		.map_len = (size_t)d.desc_bytes,
	};
	return 0;
}

void kvr_cuda_events_unmap(struct kvr_cuda_events *e)
{
	if (!e)
		return;
	if (e->map)
		(void) munmap(e->map, e->map_len);
	*e = (struct kvr_cuda_events){0};
}

int kvr_cuda_events_dep(const struct kvr_cuda_events *e, uint64_t wire, struct kvr_xfer_dep *ret_dep)
{
	if (!e || !ret_dep || !wire)
		return -EINVAL;
	if (!e->tab || !e->n)
		return -ENOENT;
	const struct kvr_cuda_event *ent = &e->tab[wire & (e->n - 1)];
	struct kvr_xfer_dep dep = {.kind = KVR_XFER_DEP_CUDA_IPC_EVENT, .len = KVR_CUDA_IPC_BYTES};
	/* pairs with the release stores in kvr_cuda_export_event */
	if (__atomic_load_n(&ent->wire, __ATOMIC_ACQUIRE) != wire)
		return -ENOENT;
	memcpy(dep.blob, ent->handle, KVR_CUDA_IPC_BYTES);
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	if (__atomic_load_n(&ent->wire, __ATOMIC_RELAXED) != wire)
		return -ENOENT; /* rewritten while we copied it */
	*ret_dep = dep;
	return 0;
}
