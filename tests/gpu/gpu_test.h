/* Helpers of the GPU tests and bench: GPU probe, the gpu_worker process (CUDA KV memory owner) and its commands. */
#ifndef KVR_GPU_TEST_H
#define KVR_GPU_TEST_H

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvr_cuda.h"
#include "kvr_proto.h"
#include "kvr_xfer.h"

/*
 * The worker side of every GPU test is a separate process, tests/gpu/gpu_worker, because
 * CUDA IPC handles cannot be opened by the process that exported them. It owns the KV
 * memory (cudaMalloc), exports it in a KV descriptor, and obeys commands on a
 * SOCK_SEQPACKET socket. A "mirror" memfd shared with the test moves bytes in and out:
 * the test writes what the KV memory should hold into the mirror, the worker copies it to
 * the GPU, and back.
 *
 * KV memory layout (deterministic from kv_bytes and split): the KV offset space is cut
 * into `split` pieces at multiples of 256; allocation k holds pieces 2k and 2k+1, piece 2k
 * at alloc offset 256 * (k & 1), piece 2k+1 512 bytes after piece 2k's end, and 256 bytes
 * after the last piece. Every byte of an allocation outside the pieces is a guard set to
 * 0xEE that no copy may touch (GW_GUARDS counts the ones that changed).
 */

enum gw_op {
	GW_WRITE = 1,       /* mirror[mirror_off, +len) -> KV[kv_off, +len), synchronous */
	GW_READ = 2,        /* KV[kv_off, +len) -> mirror[mirror_off, +len), synchronous */
	GW_WRITE_EVENT = 3, /* on the worker's stream: sleep stall_us, then the GW_WRITE copy,
			     * then record event `id` (interprocess); replies with its IPC handle
			     * at once, before the copy ran */
	GW_DESTROY_EVENT = 4, /* cudaEventDestroy(event id) */
	GW_SYNC = 5,        /* cudaStreamSynchronize(worker stream) */
	GW_GUARDS = 6,      /* value = guard bytes that are no longer 0xEE */
	GW_EXIT = 7,
};

#define GW_MAX_EVENTS 16

struct gw_cmd {
	uint32_t op;
	uint32_t id;
	uint64_t kv_off;
	uint64_t len;
	uint64_t mirror_off;
	uint32_t stall_us;
	uint32_t reserved;
};

struct gw_rep {
	int32_t status;  /* 0 or -errno */
	uint32_t reserved;
	uint64_t value;
	uint8_t handle[KVR_CUDA_IPC_BYTES];
	char why[128];
};

/* ---- probe ------------------------------------------------------------------------------ */

/* $KVR_BUILD_ROOT/tests/gpu/gpu_worker, else gpu_worker beside this executable. */
static inline void gpu_worker_path(char *path, size_t len)
{
	const char *root = getenv("KVR_BUILD_ROOT");
	if (root && *root) {
		snprintf(path, len, "%s/tests/gpu/gpu_worker", root);
		return;
	}
	char self[2048]; /* shorter than any caller's path buffer (4096) */
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	self[n > 0 ? n : 0] = 0;
	char *slash = strrchr(self, '/');
	if (slash)
		*slash = 0;
	snprintf(path, len, "%s/gpu_worker", slash ? self : ".");
}

/* 0 when a CUDA device is usable, 77 when none (cudaGetDeviceCount fails or says 0). The
 * check runs in gpu_worker --probe, so this process never initialises CUDA before a fork. */
static inline int gpu_probe(void)
{
	char path[4096];
	gpu_worker_path(path, sizeof(path));
	pid_t pid = fork();
	if (pid < 0)
		return 77;
	if (pid == 0) {
		execl(path, path, "--probe", (char *)NULL);
		fprintf(stderr, "gpu probe: cannot run %s: %s\n", path, strerror(errno));
		_exit(77);
	}
	int st = 0;
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 77;
}

/* ---- the worker process ------------------------------------------------------------------ */

struct gw {
	pid_t pid;
	int sock;
	int mirror_fd;
	uint8_t *mirror;      /* mirror_bytes, shared with the worker */
	uint64_t mirror_bytes;
	uint64_t kv_bytes;
	int desc_fd;          /* the KV descriptor it exported */
	uint64_t desc_fd_bytes;
};

static inline int gw_recv(struct gw *w, struct gw_rep *rep, int *ret_fd)
{
	int fds[KVR_PROTO_MAX_FDS];
	unsigned nfds = 0;
	ssize_t n = kvr_proto_recv(w->sock, rep, sizeof(*rep), fds, KVR_PROTO_MAX_FDS, &nfds);
	if (n != (ssize_t)sizeof(*rep)) {
		for (unsigned i = 0; n > 0 && i < nfds; i++)
			close(fds[i]);
		return n < 0 ? (int)n : -EPROTO;
	}
	rep->why[sizeof(rep->why) - 1] = 0;
	if (ret_fd)
		*ret_fd = nfds ? fds[0] : -1;
	for (unsigned i = ret_fd ? 1 : 0; i < nfds; i++)
		close(fds[i]);
	return 0;
}

/* Start gpu_worker with a KV offset space of kv_bytes cut into split pieces; extra = more
 * arguments ("--hole 1", "--bad-handle", NULL-terminated list, may be NULL). The mirror is
 * 3 * kv_bytes. 0 or -errno; on failure *why says what. */
static inline int gw_start(struct gw *w, uint64_t kv_bytes, unsigned split, const char *const *extra, char *why,
			   size_t whylen)
{
	int sv[2];
	memset(w, 0, sizeof(*w));
	w->pid = -1;
	w->sock = w->mirror_fd = w->desc_fd = -1;
	w->kv_bytes = kv_bytes;
	w->mirror_bytes = 3 * kv_bytes;
	w->mirror_fd = memfd_create("gw-mirror", 0);
	if (w->mirror_fd < 0 || ftruncate(w->mirror_fd, (off_t)w->mirror_bytes) < 0)
		return snprintf(why, whylen, "mirror: %s", strerror(errno)), -errno;
	w->mirror = mmap(NULL, w->mirror_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, w->mirror_fd, 0);
	if (w->mirror == MAP_FAILED) {
		w->mirror = NULL;
		return snprintf(why, whylen, "mirror mmap: %s", strerror(errno)), -errno;
	}
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
		return snprintf(why, whylen, "socketpair: %s", strerror(errno)), -errno;

	char path[4096], kvb[32], sp[32], mb[32];
	gpu_worker_path(path, sizeof(path));
	snprintf(kvb, sizeof(kvb), "%llu", (unsigned long long)kv_bytes);
	snprintf(sp, sizeof(sp), "%u", split);
	snprintf(mb, sizeof(mb), "%llu", (unsigned long long)w->mirror_bytes);
	const char *argv[32] = {path, "--sock", "3", "--mirror-fd", "4", "--mirror-bytes", mb, "--kv-bytes", kvb,
				"--split", sp};
	unsigned ac = 11;
	for (unsigned i = 0; extra && extra[i] && ac < 31; i++)
		argv[ac++] = extra[i];
	argv[ac] = NULL;

	w->pid = fork();
	if (w->pid < 0)
		return snprintf(why, whylen, "fork: %s", strerror(errno)), -errno;
	if (w->pid == 0) {
		/* fds 3 and 4, without CLOEXEC */
		int s = fcntl(sv[1], F_DUPFD, 10), m = fcntl(w->mirror_fd, F_DUPFD, 10);
		if (s < 0 || m < 0 || dup2(s, 3) < 0 || dup2(m, 4) < 0)
			_exit(127);
		execv(path, (char *const *)argv);
		_exit(127);
	}
	close(sv[1]);
	w->sock = sv[0];
	struct gw_rep rep;
	int rc = gw_recv(w, &rep, &w->desc_fd);
	if (rc)
		return snprintf(why, whylen, "worker did not say hello: %s", strerror(-rc)), rc;
	if (rep.status)
		return snprintf(why, whylen, "worker: %s", rep.why), rep.status;
	if (w->desc_fd < 0)
		return snprintf(why, whylen, "worker sent no descriptor"), -EPROTO;
	w->desc_fd_bytes = rep.value;
	return 0;
}

static inline int gw_cmd(struct gw *w, uint32_t op, uint32_t id, uint64_t kv_off, uint64_t len, uint64_t mirror_off,
			 uint32_t stall_us, struct gw_rep *ret)
{
	struct gw_cmd c = {.op = op, .id = id, .kv_off = kv_off, .len = len, .mirror_off = mirror_off,
			   .stall_us = stall_us};
	struct gw_rep rep;
	int rc = kvr_proto_send(w->sock, &c, sizeof(c), NULL, 0);
	if (rc)
		return rc;
	if ((rc = gw_recv(w, &rep, NULL)))
		return rc;
	if (rep.status)
		fprintf(stderr, "gpu_worker op %u: %s\n", op, rep.why);
	if (ret)
		*ret = rep;
	return rep.status;
}

/* Ask the worker to exit and reap it (kill it after 10 s). NULL-safe. */
static inline void gw_stop(struct gw *w)
{
	if (!w)
		return;
	if (w->sock >= 0 && w->pid > 0)
		(void) gw_cmd(w, GW_EXIT, 0, 0, 0, 0, 0, NULL);
	if (w->pid > 0) {
		int st;
		for (int i = 0; i < 1000; i++) {
			if (waitpid(w->pid, &st, WNOHANG) == w->pid) {
				w->pid = -1;
				break;
			}
			usleep(10000);
		}
		if (w->pid > 0) {
			kill(w->pid, SIGKILL);
			(void) waitpid(w->pid, &st, 0);
		}
	}
	if (w->sock >= 0)
		close(w->sock);
	if (w->desc_fd >= 0)
		close(w->desc_fd);
	if (w->mirror)
		munmap(w->mirror, w->mirror_bytes);
	if (w->mirror_fd >= 0)
		close(w->mirror_fd);
	memset(w, 0, sizeof(*w));
	w->pid = -1;
	w->sock = w->mirror_fd = w->desc_fd = -1;
}

/* ---- the actor side --------------------------------------------------------------------- */

/* An arena: a shared memfd mapping, as kvringd creates it. */
struct gpu_arena {
	int fd;
	uint8_t *base;
	uint64_t size;
};

static inline int gpu_arena_create(struct gpu_arena *a, uint64_t size)
{
	a->size = size;
	a->fd = memfd_create("gpu-test-arena", MFD_CLOEXEC);
	if (a->fd < 0 || ftruncate(a->fd, (off_t)size) < 0)
		return -errno;
	void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, a->fd, 0);
	if (p == MAP_FAILED)
		return -errno;
	a->base = p;
	return 0;
}

static inline void gpu_arena_destroy(struct gpu_arena *a)
{
	if (a->base)
		munmap(a->base, a->size);
	if (a->fd >= 0)
		close(a->fd);
	a->base = NULL;
	a->fd = -1;
}

/* Open the CUDA backend on a worker's descriptor the way a loader/storer does: read and
 * check the descriptor from the fd, then kvr_xfer_open(KVR_XFER_MEM_CUDA). */
static inline int gpu_open(const struct gw *w, const struct gpu_arena *a, struct kvr_xfer **ret, char *why,
			   size_t whylen)
{
	void *blob = NULL;
	size_t len = 0;
	int rc = kvr_cuda_desc_read(w->desc_fd, &blob, &len, why, whylen);
	if (rc)
		return rc;
	struct kvr_xfer_kvmem kv = {.kind = KVR_XFER_MEM_CUDA, .size = w->desc_fd_bytes};
	kv.u.cuda.blob = blob;
	kv.u.cuda.blob_len = (uint32_t)len;
	kv.u.cuda.device = -1;
	struct kvr_xfer_arena ar = {.base = a->base, .size = a->size};
	rc = kvr_xfer_open(&kv, &ar, ret);
	if (rc)
		snprintf(why, whylen, "kvr_xfer_open: %s (%s)", strerror(-rc), kvr_xfer_cuda_last_error());
	free(blob);
	return rc;
}

/* Deterministic bytes: byte i of stream `seed`. */
static inline uint8_t gpu_pat(uint64_t seed, uint64_t i)
{
	uint64_t x = (i >> 3) * 0x9e3779b97f4a7c15ull + seed * 0xbf58476d1ce4e5b9ull;
	x ^= x >> 31;
	x *= 0x94d049bb133111ebull;
	x ^= x >> 29;
	return (uint8_t)(x >> ((i & 7) * 8));
}

static inline void gpu_fill(uint8_t *p, uint64_t len, uint64_t seed)
{
	for (uint64_t i = 0; i < len; i++)
		p[i] = gpu_pat(seed, i);
}

#endif
