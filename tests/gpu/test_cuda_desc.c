/* CUDA KV descriptor tests, no GPU needed: create/read/check, seals, host refusal, event table, libkvring's export. */
#include <criterion/criterion.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <kvring/kvring.h>

#include "kvr_cuda.h"
#include "kvr_geometry.h"
#include "kvr_proto.h"
#include "kvr_xfer.h"

static const uint8_t uuid[16] = {0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe, 1, 2, 3, 4, 5, 6, 7, 8};

/* Three ranges of a 1 MiB KV space: two in one allocation (same handle), one in another. */
static void three_ranges(struct kvr_cuda_range r[3])
{
	memset(r, 0, 3 * sizeof(*r));
	for (unsigned i = 0; i < 64; i++) {
		r[0].handle[i] = r[1].handle[i] = (uint8_t)(i + 1);
		r[2].handle[i] = (uint8_t)(0xff - i);
	}
	r[0].alloc_offset = 0, r[0].kv_offset = 0, r[0].bytes = 256 * 1024;
	r[1].alloc_offset = 256 * 1024 + 512, r[1].kv_offset = 256 * 1024, r[1].bytes = 256 * 1024;
	r[2].alloc_offset = 256, r[2].kv_offset = 512 * 1024 + 4096, r[2].bytes = 512 * 1024 - 4096;
}

TestSuite(cuda_desc, .timeout = 30);

Test(cuda_desc, create_read_roundtrip)
{
	struct kvr_cuda_range r[3];
	struct kvr_cuda_export x;
	char err[160] = "";
	three_ranges(r);
	cr_assert_eq(kvr_cuda_desc_create(r, 3, 1 << 20, uuid, 64, &x, err, sizeof(err)), 0, "%s", err);
	cr_assert_geq(x.fd, 0);
	cr_assert_eq(x.fd_bytes, 1 << 20, "the fd is as large as the KV space");
	cr_assert_eq(x.n_events, 64);

	struct stat st;
	cr_assert_eq(fstat(x.fd, &st), 0);
	cr_assert_eq((uint64_t)st.st_size, x.fd_bytes);
	int seals = fcntl(x.fd, F_GET_SEALS);
	cr_assert_eq(seals, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL, "seals %#x", seals);
	cr_assert_lt(ftruncate(x.fd, 4096), 0, "a sealed descriptor shrank");
	cr_assert_lt(pwrite(x.fd, "x", 1, 0), 0, "a sealed descriptor took a write");

	void *blob = NULL;
	size_t len = 0;
	cr_assert_eq(kvr_cuda_desc_read(x.fd, &blob, &len, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(len, sizeof(struct kvr_cuda_desc) + 3 * sizeof(struct kvr_cuda_range));
	struct kvr_cuda_desc d;
	memcpy(&d, blob, sizeof(d));
	cr_assert_eq(d.magic, KVR_CUDA_DESC_MAGIC);
	cr_assert_eq(d.version, KVR_CUDA_DESC_VERSION);
	cr_assert_eq(d.n_ranges, 3);
	cr_assert_eq(d.n_events, 64);
	cr_assert_eq(d.kv_bytes, 1 << 20);
	cr_assert_eq(d.ranges_off, 96);
	cr_assert_eq(d.events_off, 96 + 3 * 96, "384: already a multiple of 64");
	cr_assert_eq(d.desc_bytes, 8192, "384 + 64 * 80 = 5504 -> two pages");
	cr_assert_eq(d.worker_pid, getpid());
	cr_assert_eq(memcmp(d.device_uuid, uuid, 16), 0);
	cr_assert_eq(memcmp((uint8_t *)blob + 96, r, sizeof(r)), 0, "ranges byte for byte");
	free(blob);
	kvr_cuda_export_close(&x);
	cr_assert_eq(x.fd, -1);
	kvr_cuda_export_close(&x); /* idempotent */
	kvr_cuda_export_close(NULL);

	/* a KV space smaller than the descriptor: the fd takes the descriptor's size */
	struct kvr_cuda_range small = {.kv_offset = 0, .bytes = 1024};
	cr_assert_eq(kvr_cuda_desc_create(&small, 1, 1024, uuid, 1024, &x, err, sizeof(err)), 0, "%s", err);
	cr_assert_eq(x.fd_bytes, (96 + 96 + 1024 * 80 + 4095) / 4096 * 4096);
	cr_assert_eq(kvr_cuda_desc_read(x.fd, &blob, &len, err, sizeof(err)), 0, "%s", err);
	free(blob);
	kvr_cuda_export_close(&x);
}

/* A loader without the CUDA hook opens the descriptor as host KV memory: it must fail (no
 * writable shared mapping), never copy into it. */
Test(cuda_desc, host_backend_refuses)
{
	struct kvr_cuda_range r[3];
	struct kvr_cuda_export x;
	three_ranges(r);
	cr_assert_eq(kvr_cuda_desc_create(r, 3, 1 << 20, uuid, 16, &x, NULL, 0), 0);
	static uint8_t arena_mem[8192];
	struct kvr_xfer_kvmem kv = {.kind = KVR_XFER_MEM_HOST, .size = 1 << 20};
	kv.u.host.fd = x.fd;
	struct kvr_xfer_arena arena = {.base = arena_mem, .size = sizeof(arena_mem)};
	struct kvr_xfer *xf = NULL;
	cr_assert_eq(kvr_xfer_open(&kv, &arena, &xf), -EPERM);
	cr_assert_null(xf);
	cr_assert_eq(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, x.fd, 0), MAP_FAILED);
	cr_assert_eq(errno, EPERM);
	void *ro = mmap(NULL, 4096, PROT_READ, MAP_SHARED, x.fd, 0);
	cr_assert_neq(ro, MAP_FAILED, "read-only mappings stay possible");
	munmap(ro, 4096);
	kvr_cuda_export_close(&x);
}

Test(cuda_desc, not_a_descriptor)
{
	void *blob = (void *)0x1;
	size_t len = 77;
	char err[160];
	/* a host KV memfd whose bytes happen to start with the magic: no write seal, not ours */
	int fd = memfd_create("host-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	cr_assert_geq(fd, 0);
	cr_assert_eq(ftruncate(fd, 65536), 0);
	struct kvr_cuda_desc d = {.magic = KVR_CUDA_DESC_MAGIC, .version = KVR_CUDA_DESC_VERSION};
	cr_assert_eq(pwrite(fd, &d, sizeof(d), 0), (ssize_t)sizeof(d));
	cr_assert_eq(kvr_cuda_desc_read(fd, &blob, &len, err, sizeof(err)), -ENOMSG);
	cr_assert_eq(blob, (void *)0x1, "outputs untouched");
	cr_assert_eq(len, 77);
	struct kvr_cuda_events ev;
	cr_assert_eq(kvr_cuda_events_map(fd, &ev), -ENOMSG);
	/* sealed for write but without the magic */
	int fd2 = memfd_create("sealed", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	cr_assert_eq(ftruncate(fd2, 4096), 0);
	cr_assert_eq(fcntl(fd2, F_ADD_SEALS, F_SEAL_WRITE), 0);
	cr_assert_eq(kvr_cuda_desc_read(fd2, &blob, &len, err, sizeof(err)), -ENOMSG);
	/* not a regular file */
	int p[2];
	cr_assert_eq(pipe(p), 0);
	cr_assert_eq(kvr_cuda_desc_read(p[0], &blob, &len, err, sizeof(err)), -ENOMSG);
	cr_assert_eq(kvr_cuda_desc_read(-1, &blob, &len, err, sizeof(err)), -EBADF);
	close(p[0]);
	close(p[1]);
	close(fd);
	close(fd2);
}

/* One mutation of a valid blob per row; each must be -EBADMSG with a reason. */
struct mut {
	const char *name;
	void (*fn)(uint8_t *b, size_t *len);
};

#define D(b) ((struct kvr_cuda_desc *)(b))
#define R(b, i) ((struct kvr_cuda_range *)((b) + 96) + (i))
static void m_magic(uint8_t *b, size_t *l) { (void)l; D(b)->magic ^= 1; }
static void m_version(uint8_t *b, size_t *l) { (void)l; D(b)->version = 2; }
static void m_nranges0(uint8_t *b, size_t *l) { (void)l; D(b)->n_ranges = 0; }
static void m_nranges_big(uint8_t *b, size_t *l) { (void)l; D(b)->n_ranges = KVR_CUDA_MAX_RANGES + 1; }
static void m_nranges_len(uint8_t *b, size_t *l) { (void)l; D(b)->n_ranges = 4; }
static void m_events3(uint8_t *b, size_t *l) { (void)l; D(b)->n_events = 3; }
static void m_events_big(uint8_t *b, size_t *l) { (void)l; D(b)->n_events = 2 * KVR_CUDA_MAX_EVENTS; }
static void m_reserved(uint8_t *b, size_t *l) { (void)l; D(b)->reserved[6] = 1; }
static void m_kv0(uint8_t *b, size_t *l) { (void)l; D(b)->kv_bytes = 0; }
static void m_ranges_off(uint8_t *b, size_t *l) { (void)l; D(b)->ranges_off = 128; }
static void m_events_off_early(uint8_t *b, size_t *l) { (void)l; D(b)->events_off = 128; }
static void m_events_off_odd(uint8_t *b, size_t *l) { (void)l; D(b)->events_off += 8; }
static void m_desc_odd(uint8_t *b, size_t *l) { (void)l; D(b)->desc_bytes += 100; }
static void m_desc_small(uint8_t *b, size_t *l) { (void)l; D(b)->desc_bytes = 0; }
static void m_desc_fd(uint8_t *b, size_t *l) { (void)l; D(b)->desc_bytes = 2 << 20; }
static void m_kv_fd(uint8_t *b, size_t *l) { (void)l; D(b)->kv_bytes = (1 << 20) + 1; }
static void m_range0(uint8_t *b, size_t *l) { (void)l; R(b, 1)->bytes = 0; }
static void m_range_res(uint8_t *b, size_t *l) { (void)l; R(b, 2)->reserved = 9; }
static void m_range_beyond(uint8_t *b, size_t *l) { (void)l; R(b, 2)->bytes += 4097; }
static void m_range_wrap(uint8_t *b, size_t *l) { (void)l; R(b, 2)->kv_offset = UINT64_MAX - 10; }
static void m_alloc_wrap(uint8_t *b, size_t *l) { (void)l; R(b, 0)->alloc_offset = UINT64_MAX - 10; }
static void m_overlap(uint8_t *b, size_t *l) { (void)l; R(b, 1)->kv_offset -= 1; }
static void m_unsorted(uint8_t *b, size_t *l)
{
	(void)l;
	struct kvr_cuda_range t = *R(b, 0);
	*R(b, 0) = *R(b, 2);
	*R(b, 2) = t;
}
static void m_truncated(uint8_t *b, size_t *l) { (void)b; *l -= 1; }
static void m_header_only(uint8_t *b, size_t *l) { (void)b; *l = 95; }

static const struct mut muts[] = {
	{"magic", m_magic}, {"version", m_version}, {"n_ranges 0", m_nranges0}, {"n_ranges too many", m_nranges_big},
	{"n_ranges beyond the blob", m_nranges_len}, {"n_events 3", m_events3}, {"n_events too many", m_events_big},
	{"reserved", m_reserved}, {"kv_bytes 0", m_kv0}, {"ranges_off", m_ranges_off},
	{"events_off inside the ranges", m_events_off_early}, {"events_off unaligned", m_events_off_odd},
	{"desc_bytes unaligned", m_desc_odd}, {"desc_bytes too small", m_desc_small},
	{"desc_bytes beyond the fd", m_desc_fd}, {"kv_bytes beyond the fd", m_kv_fd}, {"empty range", m_range0},
	{"range reserved", m_range_res}, {"range beyond kv_bytes", m_range_beyond}, {"range wraps", m_range_wrap},
	{"alloc offset wraps", m_alloc_wrap}, {"ranges overlap", m_overlap}, {"ranges unsorted", m_unsorted},
	{"truncated", m_truncated}, {"header only", m_header_only},
};

Test(cuda_desc, check_rejects)
{
	struct kvr_cuda_range r[3];
	struct kvr_cuda_export x;
	void *good = NULL;
	size_t good_len = 0;
	three_ranges(r);
	cr_assert_eq(kvr_cuda_desc_create(r, 3, 1 << 20, uuid, 64, &x, NULL, 0), 0);
	cr_assert_eq(kvr_cuda_desc_read(x.fd, &good, &good_len, NULL, 0), 0);
	cr_assert_eq(kvr_cuda_desc_check(good, good_len, 1 << 20, NULL, 0), 0);
	cr_assert_eq(kvr_cuda_desc_check(good, good_len, 0, NULL, 0), 0, "fd size unknown: not checked");
	uint8_t *b = malloc(good_len);
	for (size_t i = 0; i < sizeof(muts) / sizeof(muts[0]); i++) {
		char err[160] = "";
		size_t len = good_len;
		memcpy(b, good, good_len);
		muts[i].fn(b, &len);
		cr_assert_eq(kvr_cuda_desc_check(b, len, 1 << 20, err, sizeof(err)), -EBADMSG, "%s: accepted",
			     muts[i].name);
		cr_assert_neq(err[0], 0, "%s: no reason", muts[i].name);
	}
	cr_assert_eq(kvr_cuda_desc_check(NULL, 0, 0, NULL, 0), -EBADMSG);

	/* the same checks guard the fd path: a sealed fd with a corrupt range */
	int fd = memfd_create("bad-desc", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	memcpy(b, good, good_len);
	m_overlap(b, &good_len);
	cr_assert_eq(ftruncate(fd, 1 << 20), 0);
	cr_assert_eq(pwrite(fd, b, good_len, 0), (ssize_t)good_len);
	cr_assert_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), 0);
	char err[160] = "";
	void *blob = NULL;
	size_t len;
	cr_assert_eq(kvr_cuda_desc_read(fd, &blob, &len, err, sizeof(err)), -EBADMSG);
	cr_assert_null(blob);
	cr_assert(strstr(err, "overlaps"), "reason: %s", err);
	close(fd);
	free(b);
	free(good);
	kvr_cuda_export_close(&x);
}

Test(cuda_desc, create_rejects)
{
	struct kvr_cuda_range r[3];
	struct kvr_cuda_export x = {.fd = -7};
	char err[160];
	three_ranges(r);
	cr_assert_eq(kvr_cuda_desc_create(r, 3, 1 << 19, uuid, 64, &x, err, sizeof(err)), -EINVAL, "beyond kv_bytes");
	cr_assert_eq(x.fd, -7, "output untouched");
	cr_assert_eq(kvr_cuda_desc_create(r, 0, 1 << 20, uuid, 64, &x, err, sizeof(err)), -EINVAL);
	cr_assert_eq(kvr_cuda_desc_create(r, 3, 1 << 20, uuid, 100, &x, err, sizeof(err)), -EINVAL, "events not 2^n");
	r[1].kv_offset = 1000;
	cr_assert_eq(kvr_cuda_desc_create(r, 3, 1 << 20, uuid, 64, &x, err, sizeof(err)), -EINVAL, "overlap");
	cr_assert(strstr(err, "range 1"), "%s", err);
}

Test(cuda_desc, store_events)
{
	struct kvr_cuda_range r[3];
	struct kvr_cuda_export x;
	struct kvr_cuda_events ev;
	struct kvr_xfer_dep dep;
	uint8_t h1[64], h2[64];
	three_ranges(r);
	memset(h1, 0x31, sizeof(h1));
	memset(h2, 0x42, sizeof(h2));
	cr_assert_eq(kvr_cuda_desc_create(r, 3, 1 << 20, uuid, 64, &x, NULL, 0), 0);
	cr_assert_eq(kvr_cuda_events_map(x.fd, &ev), 0);
	cr_assert_eq(ev.n, 64);
	cr_assert_eq(kvr_cuda_events_dep(&ev, 5, &dep), -ENOENT, "empty entry");
	cr_assert_eq(kvr_cuda_export_event(&x, 5, h1), 0);
	memset(&dep, 0, sizeof(dep));
	cr_assert_eq(kvr_cuda_events_dep(&ev, 5, &dep), 0);
	cr_assert_eq(dep.kind, KVR_XFER_DEP_CUDA_IPC_EVENT);
	cr_assert_eq(dep.len, 64);
	cr_assert_eq(memcmp(dep.blob, h1, 64), 0);
	cr_assert_eq(kvr_cuda_events_dep(&ev, 5 + 64, &dep), -ENOENT, "same entry, another store");
	cr_assert_eq(kvr_cuda_export_event(&x, 6, h2), 0);
	cr_assert_eq(kvr_cuda_events_dep(&ev, 6, &dep), 0);
	cr_assert_eq(memcmp(dep.blob, h2, 64), 0);
	cr_assert_eq(kvr_cuda_events_dep(&ev, 5, &dep), 0, "entry 5 untouched by entry 6");
	cr_assert_eq(memcmp(dep.blob, h1, 64), 0);
	cr_assert_eq(kvr_cuda_export_event(&x, 69, h2), 0);
	cr_assert_eq(kvr_cuda_events_dep(&ev, 5, &dep), -ENOENT, "entry reused by store 69");
	cr_assert_eq(kvr_cuda_events_dep(&ev, 69, &dep), 0);
	cr_assert_eq(kvr_cuda_export_event(&x, 0, h1), -EINVAL);
	cr_assert_eq(kvr_cuda_events_dep(&ev, 0, &dep), -EINVAL);
	kvr_cuda_events_unmap(&ev);
	kvr_cuda_events_unmap(&ev);
	kvr_cuda_export_close(&x);
}

/* ---- libkvring's export path, against a fake kvringd ------------------------------------- */

struct fake {
	int lfd;
	char path[108];
	/* what it received */
	int ok;
	char why[256];
	struct kvr_geometry geom;
	_Alignas(8) uint8_t blob[96 + 4 * 96];
	size_t blob_len;
	uint64_t fd_bytes;
	int seals;
};

static void *fake_kvringd(void *arg)
{
	struct fake *f = arg;
	static struct kvr_proto_req req;
	int fds[KVR_PROTO_MAX_FDS];
	unsigned nfds = 0;
	int c = accept(f->lfd, NULL, NULL);
	if (c < 0) {
		snprintf(f->why, sizeof(f->why), "accept: %s", strerror(errno));
		return NULL;
	}
	ssize_t n = kvr_proto_recv(c, &req, sizeof(req), fds, KVR_PROTO_MAX_FDS, &nfds);
	if (n < (ssize_t)offsetof(struct kvr_proto_req, payload) || req.op != KVR_OP_ATTACH || nfds != 1 ||
	    req.payload_len != sizeof(struct kvr_geometry) + sizeof(struct kvr_attach_engine)) {
		snprintf(f->why, sizeof(f->why), "request: n %zd op %u fds %u", n, req.op, nfds);
	} else {
		memcpy(&f->geom, req.payload, sizeof(f->geom));
		struct stat st;
		void *blob = NULL;
		size_t len = 0;
		fstat(fds[0], &st);
		f->fd_bytes = (uint64_t)st.st_size;
		f->seals = fcntl(fds[0], F_GET_SEALS);
		int rc = kvr_cuda_desc_read(fds[0], &blob, &len, f->why, sizeof(f->why));
		if (!rc && len <= sizeof(f->blob)) {
			memcpy(f->blob, blob, len);
			f->blob_len = len;
			f->ok = 1;
		}
		free(blob);
	}
	for (unsigned i = 0; i < nfds; i++)
		close(fds[i]);
	struct kvr_proto_rep rep = {.magic = KVR_PROTO_MAGIC, .version = KVR_PROTO_VERSION, .status = -ECANCELED};
	snprintf(rep.reason, sizeof(rep.reason), "fake kvringd: descriptor received");
	(void) kvr_proto_send(c, &rep, offsetof(struct kvr_proto_rep, payload), NULL, 0);
	close(c);
	return NULL;
}

Test(cuda_desc, client_exports_descriptor)
{
	static struct fake f;
	struct kvr_geometry g;
	cr_assert_eq(kvr_geometry_fill_vllm_layer_major(&g, 2, 2, 64, 2, 16, 8), 0); /* 4 regions of 32 KiB */
	const uint64_t kv = kvr_geometry_kv_extent(&g);
	cr_assert_eq(kv, 128 * 1024);

	struct kvr_cuda_kv_range cr[2] = {{.alloc_offset = 512, .kv_offset = 0, .bytes = 64 * 1024},
					  {.alloc_offset = 0, .kv_offset = 64 * 1024, .bytes = 64 * 1024}};
	memset(cr[0].ipc_handle, 0xA1, 64);
	memset(cr[1].ipc_handle, 0xB2, 64);
	struct kvr_cuda_kv ck = {.n_ranges = 2, .ranges = cr};
	memcpy(ck.device_uuid, uuid, 16);

	f.lfd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(f.path, sizeof(f.path), "/tmp/kvr-cuda-desc-%d.sock", (int)getpid());
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", f.path);
	unlink(f.path);
	cr_assert_eq(bind(f.lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	cr_assert_eq(listen(f.lfd, 4), 0);
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, fake_kvringd, &f), 0);

	struct kvr_attach_opts o = {.socket = f.path, .geometry = &g, .kv_fd = -1, .kv_bytes = kv, .timeout_ms = 5000,
				    .cuda_kv = &ck};
	struct kvr_client *c = NULL;
	int rc = kvr_attach(&o, &c);
	pthread_join(th, NULL);
	cr_assert_eq(rc, -ECANCELED, "attach: %d (%s)", rc, kvr_last_error(NULL));
	cr_assert_null(c);
	cr_assert(strstr(kvr_last_error(NULL), "fake kvringd"), "%s", kvr_last_error(NULL));
	cr_assert(f.ok, "kvringd side: %s", f.why);
	cr_assert_eq(memcmp(&f.geom, &g, sizeof(g)), 0, "the payload is the geometry, unchanged");
	cr_assert_eq(f.seals, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_FUTURE_WRITE | F_SEAL_SEAL);
	cr_assert_geq(f.fd_bytes, kv, "kvringd's size check (extent <= fd size) passes");

	struct kvr_cuda_desc d;
	memcpy(&d, f.blob, sizeof(d));
	cr_assert_eq(f.blob_len, 96 + 2 * 96);
	cr_assert_eq(d.n_ranges, 2);
	cr_assert_eq(d.n_events, KVR_CUDA_EVENTS);
	cr_assert_eq(d.kv_bytes, kv);
	cr_assert_eq(d.worker_pid, getpid());
	cr_assert_eq(memcmp(d.device_uuid, uuid, 16), 0);
	const struct kvr_cuda_range *got = (const void *)(f.blob + 96);
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(memcmp(got[i].handle, cr[i].ipc_handle, 64), 0);
		cr_assert_eq(got[i].alloc_offset, cr[i].alloc_offset);
		cr_assert_eq(got[i].kv_offset, cr[i].kv_offset);
		cr_assert_eq(got[i].bytes, cr[i].bytes);
		cr_assert_eq(got[i].reserved, 0);
	}
	close(f.lfd);
	unlink(f.path);

	/* bad ranges are refused before anything is sent (no server needed) */
	cr[1].kv_offset = 60 * 1024;
	o.socket = "/tmp/kvr-cuda-desc-nobody.sock";
	cr_assert_eq(kvr_attach(&o, &c), -EINVAL);
	cr_assert(strstr(kvr_last_error(NULL), "cuda_kv range 1"), "%s", kvr_last_error(NULL));
	cr[1].kv_offset = 64 * 1024;
	cr[1].bytes = 64 * 1024 + 1;
	cr_assert_eq(kvr_attach(&o, &c), -EINVAL, "beyond kv_bytes");
	ck.n_ranges = 0;
	cr_assert_eq(kvr_attach(&o, &c), -EINVAL);
	/* kvr_store_cuda on a client that is not there / not CUDA: argument checks only */
	cr_assert_eq(kvr_store_cuda(NULL, 1, NULL, 0, NULL, 0, NULL, 0, NULL), -EINVAL);
}
