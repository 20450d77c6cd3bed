/* gpu_worker: worker side of the GPU tests and bench: CUDA KV memory exported by IPC handles, driven over a socket. */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cuda_runtime.h>

#include "gpu_test.h"

/* Layout: gpu_test.h. */
struct piece {
	uint64_t kv_off, bytes;
	unsigned alloc;
	uint64_t alloc_off;
};

struct alloc {
	uint8_t *base;
	uint64_t size;
};

static struct piece *pieces;
static unsigned n_pieces;
static struct alloc *allocs;
static unsigned n_allocs;
static uint8_t *mirror;
static uint64_t mirror_bytes, kv_bytes;
static cudaStream_t stream;
static cudaEvent_t events[GW_MAX_EVENTS];

static int reply(int sock, int status, uint64_t value, const void *handle, int fd, const char *fmt, ...)
	__attribute__((format(printf, 6, 7)));
static int reply(int sock, int status, uint64_t value, const void *handle, int fd, const char *fmt, ...)
{
	struct gw_rep r = {.status = status, .value = value};
	if (handle)
		memcpy(r.handle, handle, sizeof(r.handle));
	if (fmt) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(r.why, sizeof(r.why), fmt, ap);
		va_end(ap);
	}
	return kvr_proto_send(sock, &r, sizeof(r), fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0);
}

static int cu(cudaError_t e, const char *what, char *why, size_t len)
{
	if (e == cudaSuccess)
		return 0;
	snprintf(why, len, "%s: %s", what, cudaGetErrorString(e));
	return -EIO;
}

/* Copy [kv_off, +len) of the KV offset space from/to the mirror at mirror_off, piece by
 * piece, on the worker stream. */
static int kv_copy(int to_kv, uint64_t kv_off, uint64_t len, uint64_t mirror_off, char *why, size_t wl)
{
	uint64_t end;
	if (__builtin_add_overflow(kv_off, len, &end) || end > kv_bytes || mirror_off > mirror_bytes ||
	    len > mirror_bytes - mirror_off) {
		snprintf(why, wl, "copy [%llu, +%llu) out of range", (unsigned long long)kv_off,
			 (unsigned long long)len);
		return -ERANGE;
	}
	for (unsigned i = 0; i < n_pieces && len; i++) {
		const struct piece *p = &pieces[i];
		if (kv_off >= p->kv_off + p->bytes || end <= p->kv_off)
			continue;
		uint64_t a = kv_off > p->kv_off ? kv_off : p->kv_off;
		uint64_t b = end < p->kv_off + p->bytes ? end : p->kv_off + p->bytes;
		uint8_t *dev = allocs[p->alloc].base + p->alloc_off + (a - p->kv_off);
		uint8_t *host = mirror + mirror_off + (a - kv_off);
		cudaError_t e = to_kv ? cudaMemcpyAsync(dev, host, b - a, cudaMemcpyHostToDevice, stream)
				      : cudaMemcpyAsync(host, dev, b - a, cudaMemcpyDeviceToHost, stream);
		if (e != cudaSuccess)
			return cu(e, "cudaMemcpyAsync", why, wl);
	}
	return 0;
}

static void CUDART_CB stall(void *arg)
{
	usleep((useconds_t)(uintptr_t)arg);
}

static uint64_t guards_changed(char *why, size_t wl, int *ret_rc)
{
	uint64_t bad = 0;
	*ret_rc = 0;
	for (unsigned k = 0; k < n_allocs; k++) {
		uint8_t *h = malloc(allocs[k].size);
		if (!h) {
			*ret_rc = -ENOMEM;
			return 0;
		}
		if ((*ret_rc = cu(cudaMemcpy(h, allocs[k].base, allocs[k].size, cudaMemcpyDeviceToHost), "cudaMemcpy",
				  why, wl))) {
			free(h);
			return 0;
		}
		for (uint64_t i = 0; i < allocs[k].size; i++) {
			int inside = 0;
			for (unsigned p = 0; p < n_pieces && !inside; p++)
				inside = pieces[p].alloc == k && i >= pieces[p].alloc_off &&
					 i < pieces[p].alloc_off + pieces[p].bytes;
			if (!inside && h[i] != 0xEE)
				bad++;
		}
		free(h);
	}
	return bad;
}

static int setup(unsigned split, int device, int hole, int bad_handle, int *ret_desc_fd, uint64_t *ret_fd_bytes,
		 char *why, size_t wl)
{
	int rc;
	if ((rc = cu(cudaSetDevice(device), "cudaSetDevice", why, wl)))
		return rc;
	struct cudaDeviceProp prop;
	if ((rc = cu(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties", why, wl)))
		return rc;
	if ((rc = cu(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate", why, wl)))
		return rc;
	if ((rc = cu(cudaHostRegister(mirror, mirror_bytes, cudaHostRegisterPortable), "cudaHostRegister(mirror)", why,
		     wl)))
		return rc;

	if (split == 0 || kv_bytes / split < 256) {
		snprintf(why, wl, "split %u: pieces under 256 bytes", split);
		return -EINVAL;
	}
	n_pieces = split;
	n_allocs = (split + 1) / 2;
	pieces = calloc(n_pieces, sizeof(*pieces));
	allocs = calloc(n_allocs, sizeof(*allocs));
	struct kvr_cuda_range *ranges = calloc(n_pieces, sizeof(*ranges));
	if (!pieces || !allocs || !ranges)
		return -ENOMEM;
	for (unsigned i = 0; i < n_pieces; i++) {
		uint64_t b0 = i ? (kv_bytes / split * i) & ~255ull : 0;
		uint64_t b1 = i + 1 < n_pieces ? (kv_bytes / split * (i + 1)) & ~255ull : kv_bytes;
		pieces[i] = (struct piece){.kv_off = b0, .bytes = b1 - b0, .alloc = i / 2};
	}
	for (unsigned k = 0; k < n_allocs; k++) {
		struct piece *p0 = &pieces[2 * k], *p1 = 2 * k + 1 < n_pieces ? &pieces[2 * k + 1] : NULL;
		p0->alloc_off = 256 * (k & 1);
		uint64_t size = p0->alloc_off + p0->bytes + 256;
		if (p1) {
			p1->alloc_off = p0->alloc_off + p0->bytes + 512;
			size = p1->alloc_off + p1->bytes + 256;
		}
		void *d = NULL;
		if ((rc = cu(cudaMalloc(&d, size), "cudaMalloc", why, wl)) ||
		    (rc = cu(cudaMemset(d, 0xEE, size), "cudaMemset", why, wl)))
			return rc;
		allocs[k] = (struct alloc){.base = d, .size = size};
	}
	unsigned nr = 0;
	for (unsigned i = 0; i < n_pieces; i++) {
		if ((int)i == hole)
			continue;
		cudaIpcMemHandle_t h;
		if ((rc = cu(cudaIpcGetMemHandle(&h, allocs[pieces[i].alloc].base), "cudaIpcGetMemHandle", why, wl)))
			return rc;
		memcpy(ranges[nr].handle, &h, sizeof(h));
		if (bad_handle && nr == 0)
			for (unsigned b = 0; b < sizeof(h); b++)
				ranges[nr].handle[b] ^= 0x5a;
		ranges[nr].alloc_offset = pieces[i].alloc_off;
		ranges[nr].kv_offset = pieces[i].kv_off;
		ranges[nr].bytes = pieces[i].bytes;
		nr++;
	}
	struct kvr_cuda_export x;
	rc = kvr_cuda_desc_create(ranges, nr, kv_bytes, (const uint8_t *)prop.uuid.bytes, 64, &x, why, wl);
	free(ranges);
	if (rc)
		return rc;
	*ret_desc_fd = dup(x.fd);
	*ret_fd_bytes = x.fd_bytes;
	kvr_cuda_export_close(&x);
	return *ret_desc_fd < 0 ? -errno : 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"probe", no_argument, NULL, 'p'},      {"sock", required_argument, NULL, 's'},
		{"mirror-fd", required_argument, NULL, 'm'}, {"mirror-bytes", required_argument, NULL, 'M'},
		{"kv-bytes", required_argument, NULL, 'k'}, {"split", required_argument, NULL, 'S'},
		{"device", required_argument, NULL, 'd'}, {"hole", required_argument, NULL, 'h'},
		{"bad-handle", no_argument, NULL, 'b'},  {NULL, 0, NULL, 0},
	};
	int sock = -1, mfd = -1, device = 0, hole = -1, bad = 0, c;
	unsigned split = 1;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'p': {
			int n = 0;
			cudaError_t e = cudaGetDeviceCount(&n);
			if (e != cudaSuccess || n <= 0) {
				printf("no GPU: %s\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 CUDA devices");
				return 77;
			}
			printf("%d CUDA device(s)\n", n);
			return 0;
		}
		case 's': sock = atoi(optarg); break;
		case 'm': mfd = atoi(optarg); break;
		case 'M': mirror_bytes = strtoull(optarg, NULL, 0); break;
		case 'k': kv_bytes = strtoull(optarg, NULL, 0); break;
		case 'S': split = (unsigned)strtoul(optarg, NULL, 0); break;
		case 'd': device = atoi(optarg); break;
		case 'h': hole = atoi(optarg); break;
		case 'b': bad = 1; break;
		default: return 2;
		}
	}
	if (sock < 0 || mfd < 0 || !kv_bytes || !mirror_bytes) {
		fprintf(stderr, "usage: gpu_worker --probe | --sock FD --mirror-fd FD --mirror-bytes N --kv-bytes N "
				"--split M [--device D] [--hole I] [--bad-handle]\n");
		return 2;
	}
	mirror = mmap(NULL, mirror_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	if (mirror == MAP_FAILED)
		return reply(sock, -errno, 0, NULL, -1, "mirror mmap: %s", strerror(errno)), 1;

	char why[128] = "";
	int desc_fd = -1;
	uint64_t fd_bytes = 0;
	int rc = setup(split, device, hole, bad, &desc_fd, &fd_bytes, why, sizeof(why));
	if (rc) {
		reply(sock, rc, 0, NULL, -1, "setup: %s", why);
		return 1;
	}
	if (reply(sock, 0, fd_bytes, NULL, desc_fd, NULL))
		return 1;
	close(desc_fd);

	for (;;) {
		struct gw_cmd cmd;
		ssize_t n = kvr_proto_recv(sock, &cmd, sizeof(cmd), NULL, 0, NULL);
		if (n <= 0)
			return 0; /* the test went away */
		if (n != (ssize_t)sizeof(cmd)) {
			reply(sock, -EPROTO, 0, NULL, -1, "command of %zd bytes", n);
			continue;
		}
		why[0] = 0;
		uint64_t value = 0;
		cudaIpcEventHandle_t h;
		const void *hp = NULL;
		rc = 0;
		switch (cmd.op) {
		case GW_WRITE:
		case GW_READ:
			if (!(rc = kv_copy(cmd.op == GW_WRITE, cmd.kv_off, cmd.len, cmd.mirror_off, why, sizeof(why))))
				rc = cu(cudaStreamSynchronize(stream), "cudaStreamSynchronize", why, sizeof(why));
			break;
		case GW_WRITE_EVENT:
			if (cmd.id >= GW_MAX_EVENTS || events[cmd.id]) {
				rc = -EINVAL;
				snprintf(why, sizeof(why), "event %u: out of range or in use", cmd.id);
				break;
			}
			if (cmd.stall_us &&
			    (rc = cu(cudaLaunchHostFunc(stream, stall, (void *)(uintptr_t)cmd.stall_us),
				     "cudaLaunchHostFunc", why, sizeof(why))))
				break;
			if ((rc = kv_copy(1, cmd.kv_off, cmd.len, cmd.mirror_off, why, sizeof(why))))
				break;
			unsigned fl = cudaEventInterprocess | cudaEventDisableTiming;
			if ((rc = cu(cudaEventCreateWithFlags(&events[cmd.id], fl), "cudaEventCreate", why,
				     sizeof(why))) ||
			    (rc = cu(cudaEventRecord(events[cmd.id], stream), "cudaEventRecord", why, sizeof(why))) ||
			    (rc = cu(cudaIpcGetEventHandle(&h, events[cmd.id]), "cudaIpcGetEventHandle", why,
				     sizeof(why))))
				break;
			_Static_assert(sizeof(h) == KVR_CUDA_IPC_BYTES, "event handle");
			hp = &h;
			break;
		case GW_DESTROY_EVENT:
			if (cmd.id >= GW_MAX_EVENTS || !events[cmd.id]) {
				rc = -EINVAL;
				snprintf(why, sizeof(why), "event %u: none", cmd.id);
				break;
			}
			rc = cu(cudaEventDestroy(events[cmd.id]), "cudaEventDestroy", why, sizeof(why));
			events[cmd.id] = NULL;
			break;
		case GW_SYNC:
			rc = cu(cudaStreamSynchronize(stream), "cudaStreamSynchronize", why, sizeof(why));
			break;
		case GW_GUARDS:
			value = guards_changed(why, sizeof(why), &rc);
			break;
		case GW_EXIT:
			(void) cudaStreamSynchronize(stream);
			reply(sock, 0, 0, NULL, -1, NULL);
			return 0;
		default:
			rc = -EINVAL;
			snprintf(why, sizeof(why), "unknown op %u", cmd.op);
		}
		if (reply(sock, rc, value, hp, -1, rc ? "%s" : NULL, why))
			return 1;
	}
}
