/* Host transfer backend: the worker's KV memory is a memfd mapped here; copies run inside submit. */
#include "kvr_segment.h"
#include "kvr_xfer.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kvr_time.h"

struct host_xfer {
	void *map;          /* the whole mapping, from fd offset 0 */
	size_t map_len;
	unsigned char *kv;  /* KV byte 0 (map + kv->u.host.offset) */
	unsigned char *arena;
};

/* Make sure the fd cannot shrink under our mapping: a truncated memfd would turn a copy
 * into SIGBUS in this actor. Adds F_SEAL_SHRINK when it is missing. */
static int seal_shrink(int fd)
{
	int seals = fcntl(fd, F_GET_SEALS);

	if (seals < 0)
		return errno == EINVAL ? -EPERM : -errno; /* not a memfd: cannot be sealed */
	if (seals & F_SEAL_SHRINK)
		return 0;
	if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0)
		return -EPERM; /* F_SEAL_SEAL set without SHRINK, or sealing not allowed */
	return 0;
}

static int host_open(const struct kvr_xfer_kvmem *kv, const struct kvr_xfer_arena *arena, void **ret_priv)
{
	struct host_xfer *h;
	struct stat st;
	uint64_t end;
	void *map;
	int rc;

	if (kv->kind != KVR_XFER_MEM_HOST || kv->u.host.fd < 0 || kv->size == 0 || !arena->base)
		return -EINVAL;
	if (__builtin_add_overflow(kv->u.host.offset, kv->size, &end))
		return -EINVAL;
	if (fstat(kv->u.host.fd, &st) < 0)
		return -errno;
	if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size < end)
		return -EINVAL;
	rc = seal_shrink(kv->u.host.fd);
	if (rc < 0)
		return rc;

	h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	/* Map the whole file: a hugetlb memfd only maps in whole huge pages, and its size is one. */
	map = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, kv->u.host.fd, 0);
	if (map == MAP_FAILED) {
		rc = -errno;
		free(h);
		return rc;
	}
	/* Not faulted in at open: the KV memory can be many GiB. The actor populates its page
	 * table from its loop once ready (kvr_xfer_mapping, actors/runtime/populate.c). */
	h->map = map;
	h->map_len = (size_t)st.st_size;
	h->kv = (unsigned char *)map + kv->u.host.offset;
	h->arena = arena->base;
	*ret_priv = h;
	return 0;
}

static int host_mapping(void *priv, void **ret_base, size_t *ret_len)
{
	struct host_xfer *h = priv;

	*ret_base = h->map;
	*ret_len = h->map_len;
	return 0;
}

static void host_close(void *priv)
{
	struct host_xfer *h = priv;

	if (!h)
		return;
	(void) munmap(h->map, h->map_len);
	free(h);
}

static int host_submit(void *priv, uint32_t slot, uint32_t dir, const struct kvr_xfer_run *runs, size_t n,
		       const struct kvr_xfer_dep *ready, struct kvr_xfer_stats *ret_stats)
{
	struct host_xfer *h = priv;
	uint64_t t0, bytes = 0;

	(void) slot;
	if (ready->kind != KVR_XFER_DEP_NONE)
		return -EOPNOTSUPP;

	for (size_t i = 0; i < n; i++)
		bytes += runs[i].len;
	/* A large submission streams: its destination is not read again soon (copy.c). */
	void (*copy)(void *, const void *, size_t) = bytes >= KVR_XFER_STREAM_MIN ? kvr_copy_stream : kvr_copy;

	t0 = kvr_now_ns();
	if (dir == KVR_XFER_KV_TO_SLOT) {
		for (size_t i = 0; i < n; i++)
			copy(h->arena + runs[i].slot_off, h->kv + runs[i].kv_off, runs[i].len);
	} else {
		for (size_t i = 0; i < n; i++)
			copy(h->kv + runs[i].kv_off, h->arena + runs[i].slot_off, runs[i].len);
	}
	*ret_stats = (struct kvr_xfer_stats){
		.bytes = bytes,
		.runs = n,
		.copies = n,
		.queue_ns = 0,
		.copy_ns = kvr_now_ns() - t0,
	};
	return 1;
}

/* Host copies complete inside submit: there is never a slot in flight to poll. */
static int host_poll(void *priv, uint32_t slot, struct kvr_xfer_stats *ret_stats)
{
	(void) priv;
	(void) slot;
	(void) ret_stats;
	return -EINVAL;
}

static int host_wait(void *priv, uint32_t slot, int64_t timeout_ns, struct kvr_xfer_stats *ret_stats)
{
	(void) timeout_ns;
	return host_poll(priv, slot, ret_stats);
}

const struct kvr_xfer_backend kvr_xfer_host_backend = {
	.name = "host",
	.kind = KVR_XFER_MEM_HOST,
	.open = host_open,
	.close = host_close,
	.submit = host_submit,
	.poll = host_poll,
	.wait = host_wait,
	.mapping = host_mapping,
};
