/* uring_setup: the L2 I/O engine's setup and teardown — durability names, O_DIRECT probes, ring and registrations. */
#include "uring.h"
#include "uring_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

static const char *const dur_names[] = {"none", "block", "batch"};

int kvr_l2_durability_parse(const char *s, enum kvr_l2_durability *ret)
{
	for (unsigned i = 0; i < 3; i++)
		if (s && strcmp(s, dur_names[i]) == 0) {
			*ret = (enum kvr_l2_durability)i;
			return 0;
		}
	return -EINVAL;
}

const char *kvr_l2_durability_name(enum kvr_l2_durability d)
{
	return (unsigned)d < 3 ? dur_names[d] : "unknown";
}

int kvr_l2io_probe_direct(int dir_fd)
{
	char name[64];
	snprintf(name, sizeof(name), ".kvr.probe.%d", (int)getpid());
	int fd = openat(dir_fd, name, O_CREAT | O_WRONLY | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
	if (fd < 0) {
		/* EINVAL: no O_DIRECT here. ENOSPC/EDQUOT: a full disk must not keep the tier from
		 * starting (it serves reads, and writes fail cleanly): use buffered I/O, the
		 * choice that works everywhere. */
		int rc = errno == EINVAL || errno == ENOSPC || errno == EDQUOT ? 0 : -errno;
		(void)unlinkat(dir_fd, name, 0); /* some filesystems create the file, then refuse O_DIRECT */
		return rc;
	}
	void *buf = NULL;
	int rc;
	if (posix_memalign(&buf, KVR_L2_ALIGN, KVR_L2_ALIGN)) {
		rc = -ENOMEM;
		goto out;
	}
	memset(buf, 0, KVR_L2_ALIGN);
	ssize_t w = pwrite(fd, buf, KVR_L2_ALIGN, 0);
	if (w == (ssize_t)KVR_L2_ALIGN)
		rc = 1;
	else if (w < 0 && errno == EINVAL)
		rc = 0;
	else if (w < 0 && (errno == ENOSPC || errno == EDQUOT))
		rc = 1; /* the O_DIRECT open worked; the disk is just full */
	else
		rc = w < 0 ? -errno : -EIO;
out:
	free(buf);
	close(fd);
	(void)unlinkat(dir_fd, name, 0);
	return rc;
}

int kvr_l2io_probe_direct_ro(int dir_fd)
{
	DIR *d = kvr_l2_opendir(dir_fd);
	if (!d)
		return -errno;
	void *buf = NULL;
	if (posix_memalign(&buf, KVR_L2_ALIGN, KVR_L2_ALIGN)) {
		closedir(d);
		return -ENOMEM;
	}
	int rc = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		kvr_key key;
		uint32_t lane;
		if (kvr_l2_name_parse(de->d_name, &key, &lane) || (de->d_type != DT_REG && de->d_type != DT_UNKNOWN))
			continue;
		int f = openat(dir_fd, de->d_name, O_RDONLY | O_DIRECT | O_NOFOLLOW | O_CLOEXEC);
		if (f < 0 && errno == EINVAL)
			break; /* no O_DIRECT here: 0 */
		if (f < 0)
			continue; /* vanished, a symlink...: try the next one */
		ssize_t got = pread(f, buf, KVR_L2_ALIGN, 0);
		int err = got < 0 ? errno : 0;
		close(f);
		if (got >= 0) { /* a short file still proves the O_DIRECT read path */
			rc = 1;
			break;
		}
		if (err == EINVAL)
			break;
		/* an unreadable file says nothing about O_DIRECT: try the next one */
	}
	free(buf);
	closedir(d);
	return rc;
}

int kvr_l2io_event_fd(struct kvr_l2io *io)
{
	if (io->efd >= 0)
		return io->efd;
	int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (fd < 0)
		return -errno;
	int rc = io_uring_register_eventfd(&io->ring, fd);
	if (rc < 0) {
		close(fd);
		return rc;
	}
	io->efd = fd;
	return fd;
}

/* ---- open / close ---------------------------------------------------------------------- */

static int register_buffers(struct kvr_l2io *io, const struct kvr_l2io_config *cfg)
{
	unsigned n = 0;
	if (cfg->arena && cfg->arena_bytes > cfg->arena_data_off) {
		uint64_t per = cfg->slot_bytes ? (KVR_L2IO_PIECE_MAX / cfg->slot_bytes) * cfg->slot_bytes
					       : KVR_L2IO_PIECE_MAX;
		if (per) {
			io->arena = cfg->arena;
			io->arena_bytes = cfg->arena_bytes;
			io->piece_base = io->arena + cfg->arena_data_off;
			io->piece_len = per;
			uint64_t span = cfg->arena_bytes - cfg->arena_data_off;
			n = (unsigned)((span + per - 1) / per);
		}
	}
	if (n + 1 > 16384)
		return -E2BIG;
	struct iovec *iov = calloc(n + 1, sizeof(*iov));
	if (!iov)
		return -ENOMEM;
	for (unsigned i = 0; i < n; i++) {
		uint64_t off = (uint64_t)i * io->piece_len;
		uint64_t len = io->arena_bytes - cfg->arena_data_off - off;
		iov[i].iov_base = io->piece_base + off;
		iov[i].iov_len = len < io->piece_len ? len : io->piece_len;
	}
	iov[n].iov_base = io->hdr_bufs;
	iov[n].iov_len = (size_t)io->qd * KVR_L2_HDR_BYTES;
	int rc = io_uring_register_buffers(&io->ring, iov, n + 1);
	free(iov);
	if (rc < 0)
		return rc;
	io->n_pieces = n;
	io->hdr_index = n;
	return 0;
}

int kvr_l2io_open(const struct kvr_l2io_config *cfg, struct kvr_l2io **ret)
{
	if (!cfg || !ret || cfg->dir_fd < 0 || !cfg->queue_depth || cfg->queue_depth > KVR_L2IO_MAX_QD ||
	    !cfg->ident.lane_bytes || !kvr_l2_file_bytes(cfg->ident.lane_bytes) ||
	    kvr_l2_payload_bytes(cfg->ident.lane_bytes) > (1u << 30) || (unsigned)cfg->durability > KVR_L2_DUR_BATCH ||
	    (unsigned)cfg->io_mode > KVR_L2_IO_BUFFERED || (cfg->arena_data_off & (KVR_L2_ALIGN - 1)) ||
	    (cfg->arena && cfg->arena_data_off > cfg->arena_bytes))
		return -EINVAL;
	struct kvr_l2io *io = calloc(1, sizeof(*io));
	if (!io)
		return -ENOMEM;
	int rc;
	io->efd = -1;
	io->dir_fd = cfg->dir_fd;
	io->pid = getpid();
	io->ident = cfg->ident;
	io->pay_bytes = kvr_l2_payload_bytes(cfg->ident.lane_bytes);
	io->file_bytes = kvr_l2_file_bytes(cfg->ident.lane_bytes);
	io->qd = cfg->queue_depth;
	io->dur = cfg->durability;
	io->read_only = cfg->read_only;
	io->defer_verify = cfg->defer_verify;
	io->join_header = cfg->join_header;
	io->ops = calloc(io->qd, sizeof(*io->ops));
	io->free_list = calloc(io->qd, sizeof(uint16_t));
	io->done_q = calloc(io->qd, sizeof(uint16_t));
	io->batch = calloc(io->qd, sizeof(uint16_t));
	io->flushing = calloc(io->qd, sizeof(uint16_t));
	if (!io->ops || !io->free_list || !io->done_q || !io->batch || !io->flushing ||
	    posix_memalign((void **)&io->hdr_bufs, KVR_L2_ALIGN, (size_t)io->qd * KVR_L2_HDR_BYTES)) {
		rc = -ENOMEM;
		goto fail;
	}
	memset(io->hdr_bufs, 0, (size_t)io->qd * KVR_L2_HDR_BYTES);
	for (unsigned i = 0; i < io->qd; i++) {
		io->ops[i].idx = (uint16_t)i;
		io->free_list[io->qd - 1 - i] = (uint16_t)i; /* op 0 first */
	}
	io->n_free = io->qd;

	if (cfg->io_mode == KVR_L2_IO_AUTO) {
		rc = cfg->read_only ? kvr_l2io_probe_direct_ro(cfg->dir_fd) : kvr_l2io_probe_direct(cfg->dir_fd);
		if (rc < 0)
			goto fail;
		io->direct = rc == 1;
	} else {
		io->direct = cfg->io_mode == KVR_L2_IO_DIRECT;
	}

	/* a write chain is 6 SQEs; a batch flush up to qd + 1 in one submission */
	unsigned entries = 16;
	while (entries < io->qd * 8 && entries < 32768)
		entries <<= 1;
	rc = io_uring_queue_init(entries, &io->ring, 0);
	if (rc < 0) {
		rc = rc == -ENOSYS || rc == -EPERM ? -EOPNOTSUPP : rc;
		goto fail;
	}
	io->ring_ok = true;
	rc = io_uring_register_files_sparse(&io->ring, io->qd);
	if (rc < 0) {
		rc = rc == -EINVAL ? -EOPNOTSUPP : rc;
		goto fail;
	}
	rc = register_buffers(io, cfg);
	if (rc < 0)
		goto fail;
	/* Opens, renames, statx and allocating writes run in the kernel's io-wq; its default of
	 * 4 bounded workers per CPU serialises a cold adoption on metadata reads. Best effort. */
	unsigned workers[2] = {io->qd < KVR_L2IO_IOWQ_WORKERS ? io->qd : KVR_L2IO_IOWQ_WORKERS, 0};
	(void)io_uring_register_iowq_max_workers(&io->ring, workers);
	*ret = io;
	return 0;
fail:
	kvr_l2io_close(io);
	return rc;
}

void kvr_l2io_close(struct kvr_l2io *io)
{
	if (!io)
		return;
	if (io->ring_ok) {
		kvr_l2io_drain(io); /* no rename lands after we are gone */
		io_uring_queue_exit(&io->ring);
	}
	if (io->efd >= 0)
		close(io->efd);
	free(io->hdr_bufs);
	free(io->ops);
	free(io->free_list);
	free(io->done_q);
	free(io->batch);
	free(io->flushing);
	free(io);
}
