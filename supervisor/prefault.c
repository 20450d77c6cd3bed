/* kvringd prefault: fault the L1 arena in from a background thread, after kvringd is ready. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "kvr_log.h"
#include "kvr_time.h"
#include "sup.h"

/*
 * L1 should be resident before the data path needs it (as pinned host memory would be),
 * but faulting a 232 GiB arena in takes minutes and must not delay readiness: a thread
 * does it in 64 MiB steps (MADV_POPULATE_WRITE) while kvringd and its actors serve. A
 * store into a page not yet faulted just faults it itself. The thread's only shared state
 * is the arena (madvise) and two counters in the control segment that kvring-inspect
 * reads (prefault_state, prefault_bytes); kvringd stops it before unmapping the arena.
 *
 * An arena larger than the memory available at start (MemAvailable) is not faulted in:
 * that would push the node into reclaim or the OOM killer for blocks that may never be
 * stored. It is allocated on first use instead, and kvringd says so once. Huge pages are
 * reserved when the arena is mapped, so faulting them in cannot fail either way.
 */

#define STEP (64ull << 20)

static uint64_t mem_available(void)
{
	FILE *f = fopen("/proc/meminfo", "r");
	char line[128];
	unsigned long long kb = 0;
	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return (uint64_t)kb * 1024;
}

static void *prefault_main(void *arg)
{
	struct sup *s = arg;
	struct kvr_ctl *c = s->ctl;
	uint8_t *base = s->arena_seg.base;
	uint64_t size = s->arena_seg.size, t0 = kvr_now_ns();
	for (uint64_t off = 0; off < size; off += STEP) {
		if (atomic_load_explicit(&s->prefault_stop, memory_order_relaxed))
			return NULL;
		uint64_t len = size - off < STEP ? size - off : STEP;
		int rc = kvr_populate(base + off, (size_t)len);
		if (rc) {
			kvr_warn("arena: prefault stopped at %llu of %llu bytes: %s; the rest is allocated on first use",
				 (unsigned long long)off, (unsigned long long)size, strerror(-rc));
			atomic_store(&c->prefault_state, KVR_PREFAULT_FAILED);
			return NULL;
		}
		atomic_store_explicit(&c->prefault_bytes, off + len, memory_order_relaxed);
	}
	atomic_store(&c->prefault_state, KVR_PREFAULT_DONE);
	kvr_info("arena: %llu bytes faulted in, in %.1f s (background)", (unsigned long long)size,
		 (double)(kvr_now_ns() - t0) / 1e9);
	return NULL;
}

void sup_prefault_start(struct sup *s)
{
	struct kvr_ctl *c = s->ctl;
	atomic_store(&c->prefault_bytes, 0);
	if (!s->cfg.l1.prefault_background) {
		atomic_store(&c->prefault_state, KVR_PREFAULT_OFF);
		return;
	}
	uint64_t avail = mem_available();
	if (!s->arena_seg.huge && avail && s->arena_seg.size > avail / 10 * 9) {
		kvr_warn("arena: %llu bytes exceed 90%% of the memory available (%llu): not faulted in, pages are "
			 "allocated on first use", (unsigned long long)s->arena_seg.size, (unsigned long long)avail);
		atomic_store(&c->prefault_state, KVR_PREFAULT_SKIPPED);
		return;
	}
	atomic_store(&c->prefault_state, KVR_PREFAULT_RUNNING);
	atomic_store(&s->prefault_stop, false);
	int rc = pthread_create(&s->prefault_thread, NULL, prefault_main, s);
	if (rc) {
		kvr_warn("arena: cannot start the prefault thread: %s; pages are allocated on first use", strerror(rc));
		atomic_store(&c->prefault_state, KVR_PREFAULT_FAILED);
		return;
	}
	s->prefault_running = true;
}

void sup_prefault_stop(struct sup *s)
{
	if (!s->prefault_running)
		return;
	atomic_store(&s->prefault_stop, true);
	(void)pthread_join(s->prefault_thread, NULL);
	s->prefault_running = false;
}
