/* Background populate: an actor's mappings faulted in from its loop, one chunk per idle pass, after it is ready. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kvr_actor.h"
#include "kvr_log.h"
#include "kvr_segment.h"
#include "kvr_time.h"


/*
 * Why: an actor maps the arena and a worker's KV memory without touching them, so it is
 * ready in the same few milliseconds for any arena size. The pages themselves exist
 * (kvringd faults the arena in, the engine wrote its KV memory), but this process's page
 * table is empty: every first touch of a 4 KiB page on the data path is a fault, and a
 * fresh mapping copies at a third of the speed of a warm one (docs/benchmarks.md). So
 * once ready the loop fills the page table itself, KVR_POPULATE_CHUNK bytes at a time,
 * only when it has nothing else to do: after every chunk it looks at its rings again, so a
 * message waits at most one chunk (about half a millisecond here). Only pages that exist
 * are populated (populate_resident): this never allocates memory. MADV_POPULATE_*
 * (Linux 5.14) fails with EFAULT instead of raising SIGBUS where the file is shorter than
 * the mapping; a region that fails is given up (logged once), never retried.
 */

struct kvr_populate {
	struct {
		uint8_t *base;
		size_t len, done;
		bool write;
		bool arena;   /* the L1 arena: only as far as kvringd has faulted it in */
		char what[24];
	} r[KVR_POPULATE_MAX];
	unsigned n;
	uint64_t t0_ns;       /* first chunk */
	uint64_t bytes;       /* populated so far, all regions */
	bool logged;
	bool waiting;         /* the arena waits for kvringd's prefault to get further */
};

int kvr_actor_populate_add(struct kvr_actor *a, void *base, size_t len, bool write, const char *what)
{
	if (!base || !len)
		return -EINVAL;
	if (!a->populate && !(a->populate = calloc(1, sizeof(*a->populate))))
		return -ENOMEM;
	struct kvr_populate *p = a->populate;
	if (p->n == KVR_POPULATE_MAX)
		return -ENOSPC;
	p->r[p->n].base = base;
	p->r[p->n].len = len;
	p->r[p->n].done = 0;
	p->r[p->n].write = write;
	snprintf(p->r[p->n].what, sizeof(p->r[p->n].what), "%s", what ? what : "memory");
	p->r[p->n].arena = base == a->arena_seg.base && len == a->arena_seg.size;
	p->n++;
	p->logged = false;
	atomic_fetch_add_explicit(&a->ent->populate_total, len, memory_order_relaxed);
	return 0;
}

void kvr_actor_populate_forget(struct kvr_actor *a, const void *base)
{
	struct kvr_populate *p = a->populate;
	for (unsigned i = 0; p && i < p->n; i++)
		if (p->r[i].base == base) {
			/* nothing more of it is touched: counted as if done, so progress still ends */
			atomic_fetch_sub_explicit(&a->ent->populate_total, p->r[i].len - p->r[i].done, memory_order_relaxed);
			p->r[i].done = p->r[i].len;
		}
}

uint64_t kvr_actor_populate_left(const struct kvr_actor *a)
{
	const struct kvr_populate *p = a->populate;
	uint64_t left = 0;
	for (unsigned i = 0; p && i < p->n; i++)
		left += p->r[i].len - p->r[i].done;
	return left;
}

/*
 * How much of region i may be populated now. The arena follows kvringd's own prefault
 * (supervisor/prefault.c, in address order): populating ahead of it would allocate the
 * pages, and kvringd declines an arena larger than the memory available — there no actor
 * may allocate it either. So: all of it once kvringd is done, up to kvringd's progress
 * while it runs, nothing (the region is given up) when it skipped, failed or is off.
 */
static size_t limit_of(struct kvr_actor *a, struct kvr_populate *p, unsigned i)
{
	if (!p->r[i].arena || !a->ctl)
		return p->r[i].len;
	switch (atomic_load_explicit(&a->ctl->prefault_state, memory_order_acquire)) {
	case KVR_PREFAULT_DONE:
		return p->r[i].len;
	case KVR_PREFAULT_RUNNING: {
		uint64_t b = atomic_load_explicit(&a->ctl->prefault_bytes, memory_order_acquire);
		return b < p->r[i].len ? (size_t)b : p->r[i].len;
	}
	default:
		kvr_info("the arena is not populated here: kvringd did not fault it in (l1.prefault \"off\", or "
			 "larger than the memory available); its pages fault in on first use");
		atomic_fetch_sub_explicit(&a->ent->populate_total, p->r[i].len - p->r[i].done, memory_order_relaxed);
		p->r[i].done = p->r[i].len;
		return p->r[i].len;
	}
}

/*
 * Populate the pages of [base, base+len) that exist (mincore: in the memfd's page cache),
 * never allocating one: a worker's KV memory the engine has not touched yet stays
 * unallocated (on some VMs a fresh page costs milliseconds per MiB, and a 1 GiB populate
 * that allocates stalls the whole machine), and so does a sparse arena. One madvise per run
 * of resident pages. 0 or -errno.
 */
static int populate_resident(uint8_t *base, size_t len, bool write)
{
	static unsigned char vec[KVR_POPULATE_CHUNK / 4096];
	size_t pg = (size_t)sysconf(_SC_PAGESIZE), n = (len + pg - 1) / pg;
	if (n > sizeof(vec) || mincore(base, len, vec))
		return kvr_populate_rw(base, len, write);
	for (size_t i = 0; i < n;) {
		if (!(vec[i] & 1)) {
			i++;
			continue;
		}
		size_t j = i;
		while (j < n && (vec[j] & 1))
			j++;
		size_t end = j * pg < len ? j * pg : len;
		int rc = kvr_populate_rw(base + i * pg, end - i * pg, write);
		if (rc)
			return rc;
		i = j;
	}
	return 0;
}

bool kvr_actor_populate_waiting(const struct kvr_actor *a)
{
	const struct kvr_populate *p = a->populate;
	return p && p->waiting;
}

bool kvr_actor_populate_step(struct kvr_actor *a)
{
	struct kvr_populate *p = a->populate;
	if (!p)
		return false;
	p->waiting = false;
	for (unsigned i = 0; i < p->n; i++) {
		if (p->r[i].done >= p->r[i].len)
			continue;
		size_t limit = limit_of(a, p, i);
		if (p->r[i].done >= limit) {
			p->waiting |= p->r[i].done < p->r[i].len; /* kvringd's prefault is behind */
			continue;
		}
		if (!p->t0_ns)
			p->t0_ns = kvr_now_ns();
		size_t k = limit - p->r[i].done;
		if (k > KVR_POPULATE_CHUNK)
			k = KVR_POPULATE_CHUNK;
		int rc = populate_resident(p->r[i].base + p->r[i].done, k, p->r[i].write);
		if (rc) {
			kvr_warn("populate of the %s (%zu of %zu bytes done): %s; the rest faults in on first use",
				 p->r[i].what, p->r[i].done, p->r[i].len, strerror(-rc));
			p->r[i].done = p->r[i].len;
		} else {
			p->r[i].done += k;
			p->bytes += k;
		}
		atomic_store_explicit(&a->ent->populated, p->bytes, memory_order_relaxed);
		return true;
	}
	if (!p->logged && p->t0_ns && !p->waiting) {
		p->logged = true;
		uint64_t pte = 0;
		(void)kvr_proc_page_tables(getpid(), &pte);
		kvr_info("populated %llu MiB of mappings in %llu ms (page tables: %llu KiB)",
			 (unsigned long long)(p->bytes >> 20), (unsigned long long)((kvr_now_ns() - p->t0_ns) / 1000000),
			 (unsigned long long)(pte >> 10));
	}
	return false;
}

void kvr_actor_populate_free(struct kvr_actor *a)
{
	free(a->populate);
	a->populate = NULL;
}
