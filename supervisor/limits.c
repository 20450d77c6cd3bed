/* kvringd: RLIMIT_NOFILE against the descriptors a config's processes hold open, checked at start. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>

#include "kvr_log.h"
#include "l2store.h"  /* KVR_L2_ADOPT_DEPTH: the disk actor's io_uring file table */
#include "rcluster.h" /* KVR_RC_MAX_NODES: the remote actor's sockets, one per master */
#include "sup.h"

/*
 * Descriptors one process of an instance may hold open at once. Every actor inherits
 * kvringd's RLIMIT_NOFILE, so a config needs the largest of these (W = instance.max_workers,
 * S = KVR_CTL_MAX_SCHEDULERS: the client areas exist for every scheduler slot, used or not,
 * A = the config's actors, SUP_N_ACTORS):
 *
 *   kvringd     FD_BASE                    stdio, epoll, signalfd, timerfd, the listening
 *                                          socket, the control segment, arena, slot table
 *               + W + S                    the client areas (a memfd each, layout.c)
 *               + W                        fresh areas of detaching worker slots (attach.c)
 *               + W                        the attached workers' KV memfds
 *               + SUP_MAX_CONNS            connections: attached clients and peers that have
 *                                          not attached yet (accept pauses at the limit)
 *               + A + 1                    readiness pipes: one per starting actor, two
 *                                          while one is forked
 *               + FD_METRICS               metrics.enabled: its listening socket, 32
 *                                          connections (MHD_OPTION_CONNECTION_LIMIT) and
 *                                          libmicrohttpd's own
 *   lookup      FD_BASE + W + S            it serves every client area
 *   loader,     FD_BASE + 3                its worker's area, KV memfd, and a pidfd of it
 *   storer
 *   gather      FD_BASE + 3 x KVR_DCP_MAX  the same for each rank of its group
 *   disk        FD_BASE + 8                the L2 root, its namespace directory and lock,
 *                                          io_uring, its eventfd, a directory walk
 *               + max(l2.queue_depth, KVR_L2_ADOPT_DEPTH)
 *                                          io_uring's registered file table: the kernel
 *                                          refuses one larger than the soft limit (EMFILE;
 *                                          liburing raises it if the hard one allows), the
 *                                          disk actor cannot start and L2 is given up
 *   remote      FD_BASE + KVR_RC_MAX_NODES + 1
 *                                          a socket per master, the start-up discovery's
 *
 * FD_BASE also leaves room for a log file, a getaddrinfo, a /proc read: counted generously,
 * since a miss shows only later, as an actor that cannot start or a store that fails.
 */
#define FD_BASE 16u
#define FD_METRICS 40u

/* The largest need of one process: how many, which process, and which key lowers it ("" none). */
struct need {
	unsigned n;
	const char *who, *lower;
};

static void consider(struct need *nd, unsigned n, const char *who, const char *lower)
{
	if (n > nd->n)
		*nd = (struct need){n, who, lower};
}

static struct need need_of(const struct kvr_config *cfg)
{
	const unsigned w = cfg->instance.max_workers, areas = w + KVR_CTL_MAX_SCHEDULERS;
	struct need nd = {0, "", ""};
	consider(&nd, FD_BASE + areas + 2 * w + SUP_MAX_CONNS + SUP_N_ACTORS(cfg) + 1 + (cfg->metrics.enabled ? FD_METRICS : 0),
		 "kvringd itself", "instance.max_workers");
	consider(&nd, FD_BASE + areas, "the lookup actor", "instance.max_workers");
	consider(&nd, FD_BASE + 3, "a loader or storer", "");
	if (SUP_N_GATHER(cfg))
		consider(&nd, FD_BASE + 3 * KVR_DCP_MAX, "a DCP gather actor", "");
	if (cfg->l2.n_dirs)
		consider(&nd, FD_BASE + 8 + (cfg->l2.queue_depth > KVR_L2_ADOPT_DEPTH ? cfg->l2.queue_depth : KVR_L2_ADOPT_DEPTH),
			 "a disk actor: its io_uring file table is max(l2.queue_depth, 256)",
			 cfg->l2.queue_depth > KVR_L2_ADOPT_DEPTH ? "l2.queue_depth" : "");
	if (SUP_N_REMOTE(cfg))
		consider(&nd, FD_BASE + KVR_RC_MAX_NODES + 1, "the remote actor", "");
	return nd;
}
_Static_assert(KVR_L2_ADOPT_DEPTH == 256, "need_of's reason names 256");

int sup_nofile_check(const struct kvr_config *cfg, char *err, size_t errlen)
{
	const struct need nd = need_of(cfg);
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return kvr_errf(err, errlen, -errno, "getrlimit(RLIMIT_NOFILE): %s", strerror(errno));
	if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < nd.n) {
		if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < nd.n)
			return kvr_errf(err, errlen, -EMFILE,
					"RLIMIT_NOFILE soft %llu hard %llu, this config needs at least %u (%s): raise it "
					"(ulimit -n %u)%s%s", (unsigned long long)rl.rlim_cur, (unsigned long long)rl.rlim_max,
					nd.n, nd.who, nd.n, nd.lower[0] ? " or lower " : "", nd.lower);
		/* up to the hard limit, not just to the need: the count above is an estimate. An
		 * unlimited hard limit still caps the soft one at fs.nr_open: ask for 1 Mi (the
		 * kernel's default nr_open), and settle for the need if that is refused. */
		rlim_t old = rl.rlim_cur;
		rl.rlim_cur = rl.rlim_max != RLIM_INFINITY ? rl.rlim_max : (rlim_t)1 << 20;
		if (setrlimit(RLIMIT_NOFILE, &rl) < 0) {
			rl.rlim_cur = nd.n;
			if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
				return kvr_errf(err, errlen, -errno, "RLIMIT_NOFILE soft %llu, this config needs at least "
						"%u (%s): cannot raise it: %s", (unsigned long long)old, nd.n, nd.who,
						strerror(errno));
		}
		kvr_info("RLIMIT_NOFILE soft limit raised from %llu to %llu: this config needs at least %u (%s)",
			 (unsigned long long)old, (unsigned long long)rl.rlim_cur, nd.n, nd.who);
	}
	return 0;
}
