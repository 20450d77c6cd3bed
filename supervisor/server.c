/* kvringd socket: take-over of the path, peer credentials, INSPECT, ATTACH and worker detach. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <linux/magic.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/un.h>
#include <unistd.h>

#include <kvring/msg.h>

#include "kvr_log.h"
#include "kvr_proto.h"
#include "kvr_ring_names.h"
#include "kvr_time.h"
#include "sup.h"

/* ---- the socket path ---------------------------------------------------------------- */

/* mkdir -p of the directory part of path; new directories get mode 0700. */
static int make_parent_dirs(const char *path)
{
	char buf[KVR_PATH_MAX];
	snprintf(buf, sizeof(buf), "%s", path);
	char *slash = strrchr(buf, '/');
	if (!slash || slash == buf)
		return 0;
	*slash = 0;
	for (char *p = buf + 1;; p++) {
		if (*p != '/' && *p)
			continue;
		char c = *p;
		*p = 0;
		if (mkdir(buf, 0700) < 0 && errno != EEXIST)
			return -errno;
		*p = c;
		if (!c)
			break;
	}
	return 0;
}

int sup_socket_takeover(struct sup *s)
{
	const char *path = s->cfg.instance.socket;
	struct stat st;
	if (lstat(path, &st) < 0) {
		if (errno != ENOENT) {
			fprintf(stderr, "kvringd: %s: %s\n", path, strerror(errno));
			return 1;
		}
	} else if (!S_ISSOCK(st.st_mode)) {
		fprintf(stderr, "kvringd: %s exists and is not a socket\n", path);
		return 1;
	} else {
		int fd = kvr_proto_connect(path);
		if (fd >= 0) {
			struct ucred cr = {0};
			socklen_t len = sizeof(cr);
			(void)getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len);
			(void)close(fd);
			fprintf(stderr, "kvringd: another instance is serving %s (pid %d)\n", path, (int)cr.pid);
			return 1;
		}
		if (fd != -ECONNREFUSED) {
			fprintf(stderr, "kvringd: %s: cannot tell whether another instance serves it: %s\n", path,
				strerror(-fd));
			return 1;
		}
		/* Nobody listens: a kvringd that was killed left it behind. */
		kvr_warn("replacing stale socket %s", path);
		if (unlink(path) < 0 && errno != ENOENT) {
			fprintf(stderr, "kvringd: cannot remove stale socket %s: %s\n", path, strerror(errno));
			return 1;
		}
	}
	int rc = make_parent_dirs(path);
	if (rc) {
		fprintf(stderr, "kvringd: cannot create the directory of %s: %s\n", path, strerror(-rc));
		return 1;
	}
	return 0;
}

int sup_socket_listen(struct sup *s)
{
	const char *path = s->cfg.instance.socket;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	/* Never visible with looser bits than asked for, not even between bind and chmod. */
	mode_t old = umask(0077);
	int rc = bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ? -errno : 0;
	umask(old);
	if (rc) {
		kvr_err("cannot bind %s: %s", path, strerror(-rc));
		goto fail;
	}
	s->socket_bound = true;
	if (chmod(path, s->cfg.instance.socket_mode) < 0 || listen(fd, 64) < 0) {
		rc = -errno;
		kvr_err("cannot set up %s: %s", path, strerror(-rc));
		goto fail;
	}
	s->listen_fd = fd;
	s->listen_watch = (struct sup_watch){W_LISTEN, NULL};
	rc = sup_epoll_add(s, fd, &s->listen_watch, EPOLLIN);
	if (rc)
		goto fail;
	kvr_info("listening on %s (mode %04o)", path, s->cfg.instance.socket_mode);
	return 0;
fail:
	s->listen_fd = -1;
	(void)close(fd);
	return rc;
}

void sup_socket_close(struct sup *s)
{
	if (s->listen_fd >= 0) {
		sup_epoll_del(s, s->listen_fd);
		(void)close(s->listen_fd);
		s->listen_fd = -1;
	}
	if (s->socket_bound) {
		(void)unlink(s->cfg.instance.socket);
		s->socket_bound = false;
	}
}

/* ---- connections -------------------------------------------------------------------- */

static void rep_init(const struct sup *s, struct kvr_proto_rep *rep, int status, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static void rep_init(const struct sup *s, struct kvr_proto_rep *rep, int status, const char *fmt, ...)
{
	memset(rep, 0, offsetof(struct kvr_proto_rep, payload));
	rep->magic = KVR_PROTO_MAGIC;
	rep->version = KVR_PROTO_VERSION;
	rep->status = status;
	rep->generation = s->generation;
	if (fmt) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(rep->reason, sizeof(rep->reason), fmt, ap);
		va_end(ap);
	}
}

/* Replies carry no payload yet: send the record up to it. */
static int send_rep(int fd, const struct kvr_proto_rep *rep, const int *fds, unsigned n_fds)
{
	return kvr_proto_send(fd, rep, offsetof(struct kvr_proto_rep, payload) + rep->payload_len, fds, n_fds);
}

static void conn_close(struct sup *s, struct sup_conn *c);
static void conn_drop(struct sup *s, struct sup_conn *c);

static bool conn_attached(const struct sup_conn *c)
{
	return c->worker >= 0 || c->sched >= 0;
}

static uint64_t attach_timeout_ns(const struct sup *s)
{
	return (uint64_t)s->cfg.supervisor.attach_timeout_ms * 1000000ull;
}

/* At SUP_MAX_CONNS: close the un-attached connection with the earliest deadline (the one
 * accepted first) so that a new peer gets in. Idle peers cannot lock out a real worker;
 * an attached worker is never closed for room. False when every connection is a worker. */
static bool make_room(struct sup *s)
{
	struct sup_conn *old = NULL;
	for (struct sup_conn *c = s->conns; c; c = c->next) /* newest first: <= ends at the oldest */
		if (!conn_attached(c) && (!old || c->deadline <= old->deadline))
			old = c;
	if (!old)
		return false;
	kvr_debug("connection from pid %d closed to make room (not attached)", (int)old->pid);
	conn_drop(s, old);
	s->n_evicted++;
	return true;
}

static void accept_all(struct sup *s, unsigned *evicted)
{
	for (;;) {
		int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if (errno == EAGAIN)
				return;
			/* Out of descriptors or memory: the connection stays queued and the
			 * level-triggered socket would wake us at once, forever. Pause instead. */
			if (!s->accept_failing) /* one line per episode, not one per retry */
				kvr_warn("accept: %s: not accepting for %llu ms", strerror(errno),
					 (unsigned long long)(SUP_ACCEPT_PAUSE_NS / 1000000ull));
			s->accept_failing = true;
			struct epoll_event ev = {.events = 0, .data.ptr = &s->listen_watch};
			(void)epoll_ctl(s->epfd, EPOLL_CTL_MOD, s->listen_fd, &ev);
			s->accept_resume = kvr_now_ns() + SUP_ACCEPT_PAUSE_NS;
			return;
		}
		if (s->accept_failing) {
			kvr_info("accepting connections again");
			s->accept_failing = false;
		}
		struct ucred cr = {0};
		socklen_t len = sizeof(cr);
		struct kvr_proto_rep rep;
		if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0) {
			kvr_warn("SO_PEERCRED: %s: connection refused", strerror(errno));
			(void)close(fd);
			continue;
		}
		bool refused = cr.uid != geteuid();
		if (refused) {
			kvr_warn("refused a connection from pid %d uid %u: not the instance owner", (int)cr.pid,
				 (unsigned)cr.uid);
			rep_init(s, &rep, -EACCES, "permission denied: uid %u is not the instance owner",
				 (unsigned)cr.uid);
			(void)send_rep(fd, &rep, NULL, 0);
			/* Closed when the peer sends its request or hangs up, so that the peer's send
			 * does not fail with EPIPE before it reads the reason. */
			if (s->n_refused >= SUP_MAX_REFUSED) {
				(void)close(fd);
				continue;
			}
		}
		/* a peer that is refused anyway gets no room at another's expense */
		if (!refused && s->n_conns >= SUP_MAX_CONNS && make_room(s))
			(*evicted)++;
		struct sup_conn *c = s->n_conns < SUP_MAX_CONNS ? calloc(1, sizeof(*c)) : NULL;
		if (!c) {
			if (refused) {
				(void)close(fd);
				continue;
			}
			rep_init(s, &rep, -EMFILE, "too many connections (max %d)", SUP_MAX_CONNS);
			(void)send_rep(fd, &rep, NULL, 0);
			(void)close(fd);
			continue;
		}
		*c = (struct sup_conn){.fd = fd, .watch = {W_CONN, c}, .pid = cr.pid, .uid = cr.uid, .worker = -1, .sched = -1, .fence_slot = -1,
				       .refused = refused, .deadline = kvr_now_ns() + attach_timeout_ns(s),
				       .next = s->conns};
		if (sup_epoll_add(s, fd, &c->watch, EPOLLIN | EPOLLRDHUP) < 0) {
			(void)close(fd);
			free(c);
			continue;
		}
		s->conns = c;
		s->n_conns++;
		s->n_refused += refused;
		kvr_debug("connection from pid %d", (int)c->pid);
	}
}

void sup_accept(struct sup *s)
{
	unsigned evicted = 0;
	accept_all(s, &evicted);
	if (evicted) /* one line per accept pass, not one per connection */
		kvr_warn("connection limit (%d) reached: closed %u connection%s that had not attached, oldest first "
			 "(%llu so far)", SUP_MAX_CONNS, evicted, evicted == 1 ? "" : "s",
			 (unsigned long long)s->n_evicted);
}

void sup_accept_resume(struct sup *s, uint64_t now)
{
	if (!s->accept_resume || now < s->accept_resume)
		return;
	s->accept_resume = 0;
	if (s->listen_fd < 0)
		return;
	struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &s->listen_watch};
	(void)epoll_ctl(s->epfd, EPOLL_CTL_MOD, s->listen_fd, &ev);
}

/* A new, read-only open file description of segment fd fd (through /proc): an observer
 * given it cannot map the segment writable. -1 (errno set) on failure. */
static int reopen_ro(int fd)
{
	char p[64];
	snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
	return open(p, O_RDONLY | O_CLOEXEC);
}

/* An attach reply (rep, n_fds 2) with the control segment, read-only, and client slot
 * `area`'s area, read-write: all a client may write. 0 or -errno. */
static int send_client_fds(struct sup *s, int sock, const struct kvr_proto_rep *rep, unsigned area)
{
	int fds[2] = {reopen_ro(s->ctl_seg.fd), s->area_fd[area]};
	if (fds[0] < 0) {
		int rc = -errno;
		kvr_warn("cannot open a read-only view of the control segment: %s", strerror(errno));
		return rc;
	}
	int rc = send_rep(sock, rep, fds, 2);
	(void)close(fds[0]);
	return rc;
}

/* INSPECT: the control segment, the slot table and every client area, all read-only. */
static void handle_inspect(struct sup *s, struct sup_conn *c)
{
	struct kvr_proto_rep rep;
	int fds[2 + KVR_CTL_MAX_CLIENTS];
	unsigned n = 0;
	fds[n] = reopen_ro(s->ctl_seg.fd);
	if (fds[n] < 0) {
		rep_init(s, &rep, -errno, "cannot open a read-only view of the control segment: %s", strerror(errno));
		(void)send_rep(c->fd, &rep, NULL, 0);
		return;
	}
	n++;
	if ((fds[n] = reopen_ro(s->slots_seg.fd)) < 0) {
		rep_init(s, &rep, -errno, "cannot open a read-only view of the slot table: %s", strerror(errno));
		(void)send_rep(c->fd, &rep, NULL, 0);
		goto out;
	}
	n++;
	for (unsigned a = 0; a < s->ctl->n_areas; a++) { /* in slot order: kvr_ctl_map() */
		if ((fds[n] = reopen_ro(s->area_fd[a])) < 0) {
			rep_init(s, &rep, -errno, "cannot open a read-only view of client area %u: %s", a, strerror(errno));
			(void)send_rep(c->fd, &rep, NULL, 0);
			goto out;
		}
		n++;
	}
	rep_init(s, &rep, 0, NULL);
	rep.n_fds = n;
	/* the payload: every attached engine and its clients (kvr_proto.h), which the control
	 * segment does not hold */
	_Static_assert(KVR_CTL_MAX_ENGINES * sizeof(struct kvr_inspect_engine) <= KVR_PROTO_PAYLOAD_MAX,
		       "the engine table fits an INSPECT reply");
	struct kvr_inspect_engine table[KVR_CTL_MAX_ENGINES];
	unsigned n_eng = sup_engine_table(s, table);
	memcpy(rep.payload, table, n_eng * sizeof(table[0]));
	rep.payload_len = n_eng * (uint32_t)sizeof(struct kvr_inspect_engine);
	int rc = send_rep(c->fd, &rep, fds, n);
	kvr_debug("inspect from pid %d (%u engines)%s", (int)c->pid, n_eng, rc ? ": reply not sent" : "");
out:
	for (unsigned i = 0; i < n; i++)
		(void)close(fds[i]);
}

/* Compare one geometry field with the instance's model; fill rep on a mismatch. */
#define GEOM_FIELD(field, key)                                                                              \
	do {                                                                                                \
		if (g->field != want.field) {                                                               \
			rep_init(s, rep, -EINVAL, "geometry mismatch: " #field " %u, the instance serves %u (%s)", \
				 g->field, want.field, key);                                                 \
			return -EINVAL;                                                                     \
		}                                                                                           \
	} while (0)

/*
 * The worker's KV memory descriptor, before any actor maps it: every loader and storer
 * (and each restart of one) maps it shared read-write and copies through it, so memory an
 * actor cannot map, or that can shrink under its mapping (SIGBUS in the actor), would
 * crash-loop them and degrade the whole instance. Refused here instead, with the reason in
 * rep: an O_PATH or not read-write descriptor, anything but a memfd (F_GET_SEALS fails),
 * hugetlbfs, a memfd sealed against writes (unless it is a CUDA KV descriptor, which is
 * sealed F_SEAL_FUTURE_WRITE on purpose, kvr_proto.h), one that cannot be sealed against
 * shrinking. A memfd without F_SEAL_SHRINK is sealed here, before its size is read, so it
 * can never be truncated afterwards. *ret_bytes: its size.
 */
static int kv_memory_check(struct sup *s, int fd, struct kvr_proto_rep *rep, uint64_t *ret_bytes)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0) {
		rep_init(s, rep, -EBADF, "the KV memory descriptor is not usable: %s", strerror(errno));
		return -EBADF;
	}
	if (fl & O_PATH) {
		rep_init(s, rep, -EBADF, "the KV memory descriptor is an O_PATH descriptor: send the memfd opened "
			 "read-write");
		return -EBADF;
	}
	if ((fl & O_ACCMODE) != O_RDWR) {
		rep_init(s, rep, -EBADF, "the KV memory descriptor is open %s: it must be open read-write",
			 (fl & O_ACCMODE) == O_RDONLY ? "read-only" : "write-only");
		return -EBADF;
	}
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		rep_init(s, rep, -EBADF, "the KV memory descriptor is not a memfd (not even a regular file)");
		return -EBADF;
	}
	struct statfs sfs;
	if (fstatfs(fd, &sfs) == 0 && sfs.f_type == HUGETLBFS_MAGIC) {
		rep_init(s, rep, -EINVAL, "the KV memory is a hugetlbfs memfd (MFD_HUGETLB): not supported, use a "
			 "plain memfd");
		return -EINVAL;
	}
	int seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0) {
		rep_init(s, rep, -EBADF, "the KV memory is not a memfd (F_GET_SEALS: %s): a regular file can be "
			 "truncated under the actors", strerror(errno));
		return -EBADF;
	}
	if (seals & F_SEAL_WRITE) {
		rep_init(s, rep, -EPERM, "the KV memory memfd is sealed against writes (F_SEAL_WRITE): loads could "
			 "not write into it");
		return -EPERM;
	}
	if (seals & F_SEAL_FUTURE_WRITE) {
		uint32_t magic = 0;
		if (pread(fd, &magic, sizeof(magic), 0) != (ssize_t)sizeof(magic) || magic != KVR_CUDA_DESC_MAGIC) {
			rep_init(s, rep, -EPERM, "the KV memory memfd is sealed against writes (F_SEAL_FUTURE_WRITE) and "
				 "is no CUDA KV descriptor");
			return -EPERM;
		}
	}
	if (!(seals & F_SEAL_SHRINK) && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) < 0) {
		rep_init(s, rep, -EPERM, "the KV memory memfd cannot be sealed against shrinking (F_SEAL_SHRINK: %s): "
			 "create it with MFD_ALLOW_SEALING", strerror(errno));
		return -EPERM;
	}
	/* sealed: the size read now is a floor for as long as anyone holds the memfd */
	if (fstat(fd, &st) < 0 || st.st_size <= 0) {
		rep_init(s, rep, -EINVAL, "the KV memory memfd is empty");
		return -EINVAL;
	}
	*ret_bytes = (uint64_t)st.st_size;
	return 0;
}

/* The canonical block g of an attaching rank (rank_g) against the instance's model: the
 * fields, a DCP rank's rows per page, the bytes per lane and the page layout. 0, or
 * -EINVAL with rep naming the field and the numbers. */
static int geometry_matches(struct sup *s, const struct kvr_geometry *rank_g, const struct kvr_geometry *g,
			    struct kvr_proto_rep *rep)
{
	struct kvr_geometry want;
	char why[KVR_GEOM_ERR_MAX + 64];
	if (sup_model_geometry(&s->cfg, g->tp_rank < g->tp_size ? g->tp_rank : 0, g->num_blocks, &want, why,
			       sizeof(why))) {
		rep_init(s, rep, -EINVAL, "%s", why);
		return -EINVAL;
	}
	GEOM_FIELD(block_tokens, "model.block_tokens");
	GEOM_FIELD(tp_size, "model.tp_size");
	GEOM_FIELD(attention, "model.attention");
	GEOM_FIELD(layers, "model.layers");
	GEOM_FIELD(kv_heads, "model.kv_heads per rank");
	GEOM_FIELD(head_dim, "model.head_dim");
	GEOM_FIELD(dtype_bytes, "model.dtype_bytes");
	/* A DCP rank's split of each page into rows and tail decides where its rows land in
	 * the canonical block: it must be the model's (ranks of a group then agree too). */
	for (unsigned i = 0; rank_g->dcp_size > 1 && i < g->n_regions && i < want.n_regions; i++)
		if (g->sem_bytes[i] != want.sem_bytes[i]) {
			char name[32];
			kvr_geometry_region_name(g, i, name, sizeof(name));
			rep_init(s, rep, -EINVAL, "geometry mismatch: region %u (%s) of this DCP rank's group holds %u bytes "
				 "of token rows per block, the model %u (row width or page tail differ)", i, name,
				 g->sem_bytes[i], want.sem_bytes[i]);
			return -EINVAL;
		}
	uint64_t lane = kvr_geometry_lane_bytes(g);
	if (lane != s->lane_bytes) {
		if (rank_g->dcp_size > 1)
			rep_init(s, rep, -EINVAL, "geometry mismatch: the canonical block of this DCP rank's group (dcp_size "
				 "%u) is %llu bytes per lane, the instance's slots hold %llu (a page tail is kept once per "
				 "rank)", rank_g->dcp_size, (unsigned long long)lane, (unsigned long long)s->lane_bytes);
		else
			rep_init(s, rep, -EINVAL, "geometry mismatch: %llu bytes per block on this rank, the instance's "
				 "slots hold %llu", (unsigned long long)lane, (unsigned long long)s->lane_bytes);
		return -EINVAL;
	}
	kvr_key ns;
	if (kvr_geometry_namespace(g, s->cfg.model.model_id, s->cfg.model.cache_salt, &ns) || !kvr_key_eq(ns, s->ns)) {
		rep_init(s, rep, -EINVAL, "geometry mismatch: the page layout differs from the instance's model "
			 "(model.kv_layout \"%s\": %u regions of %u bytes per block, this worker %u of %u)",
			 s->cfg.model.kv_layout, s->geom.n_regions, s->geom.page_bytes[0], g->n_regions, g->page_bytes[0]);
		return -EINVAL;
	}
	return 0;
}

/* Validate what an attaching worker sends — its geometry (payload) and its KV memory
 * (one memfd) — against the instance's model, and adopt the memfd (fds[0] = -1). *ret_ns:
 * the key namespace this worker uses (the instance's; a DCP rank with page tails: its
 * layout's). On failure rep says what was wrong, naming the field and the numbers. */
_Static_assert(sizeof(struct kvr_geometry) + sizeof(struct kvr_attach_engine) <= KVR_PROTO_PAYLOAD_MAX,
	       "geometry and engine identity fit the attach payload");

static int attach_validate(struct sup *s, unsigned w, const struct kvr_proto_req *req, int *fds, unsigned n_fds,
			   const struct sup_engine_id *eng, struct kvr_proto_rep *rep, kvr_key *ret_ns)
{
	if (n_fds != 1) {
		rep_init(s, rep, -EBADF, "attach needs exactly one descriptor (the KV memory), got %u", n_fds);
		return -EBADF;
	}
	uint64_t kv_bytes;
	int rc = kv_memory_check(s, fds[0], rep, &kv_bytes);
	if (rc)
		return rc;
	struct kvr_geometry gbuf, canon;
	memcpy(&gbuf, req->payload, sizeof(gbuf));
	const struct kvr_geometry *rank_g = &gbuf;
	char err[KVR_GEOM_ERR_MAX];
	/* also: every page lies inside the (sealed, so never smaller) KV memory, else
	 * "region R (...): block B ends at E > kv_bytes N" */
	if (kvr_geometry_validate(rank_g, kv_bytes, err, sizeof(err))) {
		rep_init(s, rep, -EINVAL, "geometry: %s", err);
		return -EINVAL;
	}
	/* A DCP rank is checked as the canonical block its group stores (kvr_dcp.h): the
	 * instance's model describes that block, whatever (D, I) produce it. */
	if (kvr_dcp_canonical_geometry(rank_g, &canon, err, sizeof(err))) {
		rep_init(s, rep, -EINVAL, "geometry: %s", err);
		return -EINVAL;
	}
	rc = geometry_matches(s, rank_g, &canon, rep);
	if (rc)
		return rc;
	/* one worker per (engine, TP rank, DCP rank) (MLA: every rank loads the same lane, still
	 * one worker each) */
	for (unsigned i = 0; i < s->cfg.instance.max_workers; i++) {
		const struct kvr_worker_ent *o = kvr_ctl_worker(s->ctl, i);
		/* a DETACHING predecessor (its actors are stopping) does not block its successor */
		if (i != w && atomic_load(&o->state) == KVR_WORKER_ATTACHED && o->tp_rank == rank_g->tp_rank &&
		    o->dcp_rank == rank_g->dcp_rank && s->worker_engine[i] >= 0 &&
		    !strcmp(s->engines[s->worker_engine[i]].id.id, eng->id)) {
			rep_init(s, rep, -EEXIST, "engine \"%s\": TP rank %u (DCP rank %u) is already attached (worker "
				 "slot %u, pid %d)", eng->id, rank_g->tp_rank, rank_g->dcp_rank, i,
				 (int)atomic_load(&o->pid));
			return -EEXIST;
		}
	}
	if (kvr_geometry_namespace(rank_g, sup_engine_model(s, eng), s->cfg.model.cache_salt, ret_ns)) {
		rep_init(s, rep, -EINVAL, "geometry: no key namespace for this rank's layout");
		return -EINVAL;
	}
	memcpy(kvr_ctl_worker_geometry(s->ctl, w), rank_g, sizeof(*rank_g));
	s->kv_fd[w] = fds[0];
	s->kv_bytes[w] = kv_bytes;
	fds[0] = -1;
	return 0;
}

/* The lookup actor was given up (FAILED: its crash-loop tally, actors.c) and nothing restarts
 * it short of restarting kvringd: every lookup, lease and store of a client would fail, so an
 * attach is refused at once (rep filled, -EPIPE as for any dead actor) rather than served or
 * left to wait out the client's attach timeout. A worker's own loader and storer start fresh
 * at its attach; one that fails then is seen by the client as FAILED at once (client.c). */
static bool lookup_given_up(struct sup *s, struct kvr_proto_rep *rep)
{
	const struct kvr_actor_ent *e = s->actors[SUP_ACTOR_LOOKUP].ent;
	if (atomic_load(&e->state) != KVR_ACTOR_FAILED)
		return false;
	char how[48];
	if (e->last_exit_signal)
		snprintf(how, sizeof(how), "last killed by signal %d", e->last_exit_signal);
	else
		snprintf(how, sizeof(how), "last exit code %d", e->last_exit_code);
	rep_init(s, rep, -EPIPE, "the lookup actor was given up after %u deaths within %u s (%s): restart kvringd",
		 s->cfg.supervisor.crash_loop_max_deaths, s->cfg.supervisor.crash_loop_window_s, how);
	return true;
}

/* The first free worker slot for an attach from c, or -1 with rep saying why there is none
 * (or why c may not attach now). */
static int attach_slot(struct sup *s, struct sup_conn *c, struct kvr_proto_rep *rep)
{
	unsigned max = s->cfg.instance.max_workers;
	if (s->phase != PH_RUN) {
		rep_init(s, rep, -ESHUTDOWN, "instance is shutting down");
		return -1;
	}
	if (conn_attached(c)) {
		rep_init(s, rep, -EALREADY, "already attached as %s %d", c->worker >= 0 ? "worker" : "scheduler",
			 c->worker >= 0 ? c->worker : c->sched);
		return -1;
	}
	if (lookup_given_up(s, rep))
		return -1;
	for (unsigned i = 0; i < max; i++)
		if (atomic_load(&kvr_ctl_worker(s->ctl, i)->state) == KVR_WORKER_FREE)
			return (int)i;
	rep_init(s, rep, -EBUSY, "no free worker slot (max_workers=%u)", max);
	return -1;
}

/* The engine identity an attach payload carries after the geometry (all zeros when the
 * client sent none), parsed into eng: 0, or -1 with rep saying why not. */
static int attach_engine(struct sup *s, const struct kvr_proto_req *req, struct sup_engine_id *eng,
			 struct kvr_proto_rep *rep)
{
	struct kvr_attach_engine ein = {0};
	char why[KVR_PROTO_REASON_MAX];
	if (req->payload_len != sizeof(struct kvr_geometry) &&
	    req->payload_len != sizeof(struct kvr_geometry) + sizeof(ein)) {
		rep_init(s, rep, -EPROTO, "attach payload is %u bytes: a geometry is %zu (+ %zu of engine identity)",
			 req->payload_len, sizeof(struct kvr_geometry), sizeof(ein));
		return -1;
	}
	if (req->payload_len > sizeof(struct kvr_geometry))
		memcpy(&ein, req->payload + sizeof(struct kvr_geometry), sizeof(ein));
	if (sup_engine_parse(&ein, eng, why, sizeof(why))) {
		rep_init(s, rep, -EINVAL, "%s", why);
		return -1;
	}
	return 0;
}

/* Worker slot w's entry filled for c's process, the rank g describes and its engine, then
 * published: ATTACHED is stored last. */
static void worker_attached(struct sup *s, struct sup_conn *c, unsigned w, const struct kvr_geometry *g, int engine,
			    const struct sup_engine_id *eng)
{
	struct kvr_worker_ent *we = kvr_ctl_worker(s->ctl, w);
	atomic_store(&we->pid, c->pid);
	we->uid = c->uid;
	we->generation++;
	we->tp_rank = g->tp_rank;
	we->tp_size = g->tp_size;
	we->dcp_rank = g->dcp_rank;
	we->dcp_size = g->dcp_size;
	we->attached_ns = kvr_now_ns();
	we->engine = (uint16_t)engine;
	we->kind = KVR_CLIENT_WORKER;
	s->worker_engine[w] = engine;
	atomic_store(&kvr_ctl_area(s->ctl, w)->waiter.sleepers, 0);
	atomic_store(&we->state, KVR_WORKER_ATTACHED);
	c->worker = (int)w;
	s->worker_conn[w] = c;
	kvr_info("worker %d attached (pid %d, generation %u, engine %d \"%s\", TP rank %u)", (int)w, (int)c->pid,
		 we->generation, engine, eng->id, g->tp_rank);
	sup_engine_publish(s);
}

/* The attach reply of worker slot w (its store path: gather actor `gather`, or -1 for its
 * own storer): what the client needs of the instance, and two descriptors to come. */
static void attach_info(struct sup *s, unsigned w, const struct kvr_geometry *g, int gather, kvr_key ns,
			struct kvr_proto_rep *rep)
{
	rep->worker = (uint32_t)w;
	rep->n_fds = 2;
	struct kvr_attach_info info = {
		.ns_lo = ns.lo,
		.ns_hi = ns.hi,
		.lane = kvr_dcp_lane(g),
		.lanes = s->lanes,
		.n_slots = s->slots->n_slots,
		.block_tokens = s->geom.block_tokens,
		.slot_bytes = s->slots->slot_bytes,
		.lane_bytes = s->lane_bytes,
		.kv_bytes = s->kv_bytes[w],
		.loader_actor = SUP_ACTOR_LOADER(w),
		.storer_actor = gather >= 0 ? (uint32_t)gather : SUP_ACTOR_STORER(w),
		.lookup_actor = SUP_ACTOR_LOOKUP,
		.group_ranks = g->dcp_size,
	};
	memcpy(rep->payload, &info, sizeof(info));
	rep->payload_len = sizeof(info);
}

/* Worker slot w's KV memory, adopted by attach_validate, closed again: the attach failed after. */
static void attach_drop_kv(struct sup *s, int w)
{
	(void)close(s->kv_fd[w]);
	s->kv_fd[w] = -1;
}

static void handle_attach(struct sup *s, struct sup_conn *c, const struct kvr_proto_req *req, int *fds,
			  unsigned n_fds)
{
	struct kvr_proto_rep rep;
	struct sup_engine_id eng;
	char why[KVR_PROTO_REASON_MAX];
	kvr_key ns;

	int w = attach_slot(s, c, &rep);
	if (w < 0)
		goto reply;
	rep_init(s, &rep, 0, NULL);
	if (attach_engine(s, req, &eng, &rep))
		goto reply;
	if (attach_validate(s, (unsigned)w, req, fds, n_fds, &eng, &rep, &ns) || rep.status) {
		if (!rep.status)
			rep.status = -EINVAL;
		goto reply;
	}
	int engine = sup_engine_join(s, &eng, why, sizeof(why));
	if (engine < 0) {
		rep_init(s, &rep, engine, "%s", why);
		attach_drop_kv(s, w);
		goto reply;
	}

	const struct kvr_geometry *g = kvr_ctl_worker_geometry(s->ctl, (unsigned)w);
	/* a DCP rank stores through its group's gather actor (and loads through its own
	 * loader); every other worker has its own loader and storer */
	int gather = -1;
	if (g->dcp_size > 1) {
		gather = sup_group_join(s, (unsigned)w, g, engine, why, sizeof(why));
		if (gather < 0) {
			rep_init(s, &rep, gather, "%s", why);
			sup_engine_leave(s, engine);
			attach_drop_kv(s, w);
			goto reply;
		}
	}
	worker_attached(s, c, (unsigned)w, g, engine, &eng);
	sup_actor_start(s, &s->actors[SUP_ACTOR_LOADER((unsigned)w)]);
	if (gather < 0)
		sup_actor_start(s, &s->actors[SUP_ACTOR_STORER((unsigned)w)]);
	else
		sup_groups_update(s);

	attach_info(s, (unsigned)w, g, gather, ns, &rep);
	/* the control segment, read-only, and the worker's own area (kvr_proto.h): no worker
	 * gets the arena, the slot table or another client's rings */
	if (send_client_fds(s, c->fd, &rep, (unsigned)w))
		kvr_warn("worker %d: attach reply not sent; it detaches when the connection closes", w);
	return;
reply:
	if (rep.status)
		kvr_info("attach from pid %d refused: %s", (int)c->pid, rep.reason);
	(void)send_rep(c->fd, &rep, NULL, 0);
}

/* A scheduler's attach checked (phase, connection, no descriptors, its engine identity
 * parsed into eng) and a free scheduler slot for it: the slot, or -1 with rep saying why not. */
static int sched_slot(struct sup *s, struct sup_conn *c, const struct kvr_proto_req *req, unsigned n_fds,
		      struct sup_engine_id *eng, struct kvr_proto_rep *rep)
{
	struct kvr_attach_engine ein;
	char why[KVR_PROTO_REASON_MAX];
	unsigned max = s->cfg.instance.max_schedulers;
	if (s->phase != PH_RUN) {
		rep_init(s, rep, -ESHUTDOWN, "instance is shutting down");
		return -1;
	}
	if (conn_attached(c)) {
		rep_init(s, rep, -EALREADY, "already attached");
		return -1;
	}
	if (lookup_given_up(s, rep))
		return -1;
	if (n_fds) {
		rep_init(s, rep, -EBADF, "a scheduler attaches without descriptors, got %u", n_fds);
		return -1;
	}
	if (req->payload_len != sizeof(ein)) {
		rep_init(s, rep, -EPROTO, "scheduler attach payload is %u bytes, an engine identity is %zu",
			 req->payload_len, sizeof(ein));
		return -1;
	}
	memcpy(&ein, req->payload, sizeof(ein));
	if (sup_engine_parse(&ein, eng, why, sizeof(why))) {
		rep_init(s, rep, -EINVAL, "%s", why);
		return -1;
	}
	for (unsigned i = 0; i < max; i++)
		if (atomic_load(&kvr_ctl_sched(s->ctl, i)->state) == KVR_WORKER_FREE)
			return (int)i;
	rep_init(s, rep, -EBUSY, "no free scheduler slot (instance.max_schedulers=%u)", max);
	return -1;
}

/* Scheduler slot `slot`'s entry filled for c's process and its engine, then published:
 * ATTACHED is stored last. */
static void sched_attached(struct sup *s, struct sup_conn *c, unsigned slot, int engine,
			   const struct sup_engine_id *eng)
{
	struct kvr_worker_ent *se = kvr_ctl_sched(s->ctl, slot);
	atomic_store(&se->pid, c->pid);
	se->uid = c->uid;
	se->generation++;
	se->tp_rank = se->dcp_rank = 0;
	se->tp_size = s->geom.tp_size;
	se->dcp_size = 1;
	se->attached_ns = kvr_now_ns();
	se->engine = (uint16_t)engine;
	se->kind = KVR_CLIENT_SCHEDULER;
	atomic_store(&kvr_ctl_area(s->ctl, s->ctl->max_workers + slot)->waiter.sleepers, 0);
	atomic_store(&se->state, KVR_WORKER_ATTACHED);
	c->sched = (int)slot;
	s->sched_engine[slot] = engine;
	kvr_info("scheduler %d attached (pid %d, engine %d \"%s\")", (int)slot, (int)c->pid, engine, eng->id);
	sup_engine_publish(s);
}

/* ATTACH_SCHED: an engine's scheduler takes a scheduler slot (no KV memory, no actors of
 * its own): it gets the control segment and talks to the lookup actor on sched.req/rep.N. */
static void handle_attach_sched(struct sup *s, struct sup_conn *c, const struct kvr_proto_req *req, unsigned n_fds)
{
	struct kvr_proto_rep rep;
	struct sup_engine_id eng;
	char why[KVR_PROTO_REASON_MAX];
	kvr_key ns;

	int slot = sched_slot(s, c, req, n_fds, &eng, &rep);
	if (slot < 0)
		goto reply;
	int engine = sup_engine_join(s, &eng, why, sizeof(why));
	if (engine < 0) {
		rep_init(s, &rep, engine, "%s", why);
		goto reply;
	}
	if (sup_engine_namespace(s, engine, &s->geom, &ns)) {
		sup_engine_leave(s, engine);
		rep_init(s, &rep, -EINVAL, "no key namespace for engine \"%s\"", eng.id);
		goto reply;
	}
	sched_attached(s, c, (unsigned)slot, engine, &eng);

	rep_init(s, &rep, 0, NULL);
	rep.worker = (uint32_t)slot;
	rep.n_fds = 2;
	struct kvr_attach_info info = {
		.ns_lo = ns.lo,
		.ns_hi = ns.hi,
		.lanes = s->lanes,
		.n_slots = s->slots->n_slots,
		.block_tokens = s->geom.block_tokens,
		.slot_bytes = s->slots->slot_bytes,
		.lane_bytes = s->lane_bytes,
		.lookup_actor = SUP_ACTOR_LOOKUP,
		.group_ranks = 1,
	};
	memcpy(rep.payload, &info, sizeof(info));
	rep.payload_len = sizeof(info);
	if (send_client_fds(s, c->fd, &rep, s->ctl->max_workers + (unsigned)slot))
		kvr_warn("scheduler %d: attach reply not sent; it detaches when the connection closes", slot);
	return;
reply:
	kvr_info("scheduler attach from pid %d refused: %s", (int)c->pid, rep.reason);
	(void)send_rep(c->fd, &rep, NULL, 0);
}

/* A scheduler is gone: its slot is free at once. Its leases stay until their workers loaded
 * them or their ttl passed (they belong to the engine, not to this connection); a reply
 * still in its ring cannot be taken by the next one (wire ids carry the slot's generation). */
static void sched_detach(struct sup *s, struct sup_conn *c)
{
	unsigned i = (unsigned)c->sched;
	struct kvr_worker_ent *se = kvr_ctl_sched(s->ctl, i);
	c->sched = -1;
	sup_engine_leave(s, s->sched_engine[i]);
	s->sched_engine[i] = -1;
	sup_engine_publish(s);
	atomic_store(&se->pid, 0);
	atomic_store(&se->state, KVR_WORKER_FREE);
	kvr_info("scheduler %u detached (pid %d)", i, (int)c->pid);
}

/* The worker is gone (connection closed or DETACH): stop its actors; sup_workers_update
 * announces it to the lookup actor once they have exited and frees its slot after that. */
static void worker_detach(struct sup *s, struct sup_conn *c)
{
	unsigned w = (unsigned)c->worker;
	struct kvr_worker_ent *we = kvr_ctl_worker(s->ctl, w);
	c->worker = -1;
	s->worker_conn[w] = NULL;
	s->worker_gone_sent[w] = false;
	sup_engine_leave(s, s->worker_engine[w]);
	s->worker_engine[w] = -1;
	sup_engine_publish(s);
	atomic_store(&we->state, KVR_WORKER_DETACHING);
	kvr_info("worker %u detached (pid %d)", w, (int)c->pid);
	sup_actor_event(s, &s->actors[SUP_ACTOR_LOADER(w)], EV_STOP, 0);
	sup_actor_event(s, &s->actors[SUP_ACTOR_STORER(w)], EV_STOP, 0);
	sup_group_leave(s, w);
}

/* A detached worker's load and store rings, once every actor serving them has exited, as
 * kvringd laid them out: the next worker of the slot inherits nothing its predecessor left
 * (scribbled indices would leave a ring stuck). The lookup actor resets lookup.req/rep at
 * WORKER_GONE. */
static void reset_worker_rings(struct sup *s, unsigned w)
{
	static const char *const fmts[] = {KVR_RING_LOAD_REQ, KVR_RING_LOAD_REP, KVR_RING_STORE_REQ, KVR_RING_STORE_REP};
	for (unsigned k = 0; k < sizeof(fmts) / sizeof(fmts[0]); k++) {
		char name[KVR_RING_NAME_MAX];
		snprintf(name, sizeof(name), fmts[k], w);
		int i = kvr_ctl_find_ring(s->ctl, name);
		const struct kvr_ring_ent *e = i < 0 ? NULL : kvr_ctl_ring_ent(s->ctl, (unsigned)i);
		int other = e ? (KVR_EP_IS_CLIENT(e->producer) ? e->consumer : e->producer) : -1;
		/* a DCP group's gather actor may serve it: only when that actor is not running */
		if (other >= 0 && (unsigned)other < s->ctl->max_actors &&
		    atomic_load(&kvr_ctl_actor(s->ctl, (unsigned)other)->pid) > 0) {
			kvr_warn("worker slot %u: ring %s not reset: %s still runs", w, name,
				 kvr_ctl_actor(s->ctl, (unsigned)other)->name);
			continue;
		}
		int rc = i < 0 ? i : kvr_ctl_ring_reset(s->ctl, (unsigned)i, s->cfg.rings.spin_ns);
		if (rc)
			kvr_warn("worker slot %u: cannot reset ring %s: %s", w, name, strerror(-rc));
	}
}

/* The lookup actor acknowledged WORKER_GONE: if it mapped the slot's fresh area (area_ack),
 * map it here too and drop the old one — from now on every process that serves the slot
 * (the lookup actor; the next loader, storer, gather actor, client: spawned or handed the
 * fresh fd) shares the fresh area, and the old one is mapped only by whoever kept it. If not
 * (it could not open it), the old area's rings are laid out again in place. false: the
 * lookup actor maps the fresh area and we cannot (out of memory): the slot must not serve
 * anyone until we can, so it stays DETACHING and this is tried again on the next pass. */
static bool take_fresh_area(struct sup *s, unsigned w, const struct kvr_worker_ent *we)
{
	int fresh = s->area_next_fd[w];
	if (fresh >= 0 && atomic_load_explicit(&we->area_ack, memory_order_acquire) == we->generation) {
		sup_metrics_pause(s); /* a render reads the area's ring counters */
		int rc = kvr_ctl_map_area(&s->ctl_seg, w, fresh, 1);
		sup_metrics_resume(s);
		if (rc) {
			if (!s->area_map_failed[w])
				kvr_err("worker slot %u: cannot map the fresh client area the lookup actor maps: %s; "
					"the slot waits until it can", w, strerror(-rc));
			s->area_map_failed[w] = true;
			return false;
		}
		s->area_map_failed[w] = false;
		s->area_next_fd[w] = -1;
		(void)close(s->area_fd[w]);
		s->area_fd[w] = fresh;
		return true;
	}
	s->area_next_fd[w] = -1;
	if (fresh >= 0)
		(void)close(fresh);
	reset_worker_rings(s, w);
	kvr_ctl_area_reset(s->ctl, w); /* its header and waiter: its client wrote there */
	return true;
}

/* Worker slot w's loader, storer and gather actor have exited: a DETACH waiting for that
 * (its fence) is answered. */
static void answer_fence(struct sup *s, unsigned w)
{
	for (struct sup_conn *c = s->conns; c; c = c->next) {
		if (c->fence_slot != (int)w || c->fd < 0)
			continue;
		struct kvr_proto_rep rep;
		rep_init(s, &rep, 0, NULL);
		if (send_rep(c->fd, &rep, NULL, 0))
			kvr_warn("worker slot %u: detach answer not sent (pid %d)", w, (int)c->pid);
		kvr_debug("worker slot %u: detach fenced in %llu us", w,
			  (unsigned long long)((kvr_now_ns() - c->fence_ns) / 1000));
		c->fence_slot = -1;
		c->deadline = kvr_now_ns() + attach_timeout_ns(s); /* it may attach again */
	}
}

/*
 * A DETACHING worker slot goes FREE in three steps, each waiting for the one before:
 *   1. its loader, its storer and its DCP group's gather actor have exited: nothing can
 *      copy into or out of a slot for it any more, nor out of or into its memory — the
 *      worker's DETACH is answered now (its fence);
 *   2. WORKER_GONE goes to the lookup actor, which drops the worker's pins and aborts its
 *      WRITING slots — only now, so no copy still running lands in a slot given to another
 *      store (a full ctl ring is retried on the next pass);
 *   3. the lookup actor acknowledged it (gone_ack == generation): only then may a new
 *      worker attach in this slot, so its own WRITING slots can never be taken for its
 *      predecessor's. A lookup actor that restarts meanwhile gets the message from its
 *      ctl ring, which is kept across restarts.
 */
void sup_workers_update(struct sup *s)
{
	for (unsigned w = 0; w < s->cfg.instance.max_workers; w++) {
		struct kvr_worker_ent *we = kvr_ctl_worker(s->ctl, w);
		if (atomic_load(&we->state) != KVR_WORKER_DETACHING)
			continue;
		const struct sup_actor *l = &s->actors[SUP_ACTOR_LOADER(w)], *st = &s->actors[SUP_ACTOR_STORER(w)];
		if (l->pid > 0 || st->pid > 0 || !sup_group_release(s, w))
			continue;
		answer_fence(s, w);
		/* The lookup actor restarted since WORKER_GONE went out: it may have died with the
		 * message (taken off its ring, not acknowledged), or have acknowledged it and mapped
		 * the fresh area just before it died, its successor mapping the old one it was
		 * spawned with. Either way the successor gets the message again, and only its own
		 * answer counts (the acknowledgments are cleared first; it may handle the message
		 * twice — the kept ring copy and this — which is harmless: the second finds nothing
		 * to release and maps the same area again). */
		uint32_t lgen = atomic_load(&s->actors[SUP_ACTOR_LOOKUP].ent->generation);
		if (s->worker_gone_sent[w] && s->worker_gone_lgen[w] != lgen) {
			kvr_info("worker slot %u: WORKER_GONE again, to the restarted lookup actor", w);
			atomic_store(&we->area_ack, 0);
			atomic_store(&we->gone_ack, 0);
			s->worker_gone_sent[w] = false;
		}
		if (!s->worker_gone_sent[w]) {
			/* the slot's next client gets a fresh area: the gone one may live on and keep
			 * its mapping of the old one (a worker that detached and did not exit) */
			if (s->area_next_fd[w] < 0) {
				int rc = kvr_ctl_area_fresh(s->ctl, w, s->cfg.rings.spin_ns, &s->area_next_fd[w]);
				if (rc) {
					s->area_next_fd[w] = -1;
					kvr_warn("worker slot %u: no fresh client area (%s): its rings are reset in place",
						 w, strerror(-rc));
				}
			}
			struct kvr_msg m;
			struct kvr_msg_worker_gone gone = {.worker = w, .generation = we->generation,
							   .area_fd = s->area_next_fd[w]};
			kvr_msg_build(&m, KVR_MSG_WORKER_GONE, 0, 0, 0, &gone, sizeof(gone));
			if (sup_actor_send(&s->actors[SUP_ACTOR_LOOKUP], &m))
				continue; /* ctl ring full: again on the next pass */
			s->worker_gone_sent[w] = true;
			s->worker_gone_lgen[w] = lgen;
		}
		if (atomic_load_explicit(&we->gone_ack, memory_order_acquire) != we->generation)
			continue;
		if (s->kv_fd[w] >= 0)
			(void)close(s->kv_fd[w]);
		s->kv_fd[w] = -1;
		if (!take_fresh_area(s, w, we))
			continue;
		s->worker_gone_sent[w] = false;
		atomic_store(&we->pid, 0);
		atomic_store(&we->state, KVR_WORKER_FREE);
		kvr_debug("worker slot %u free", w);
	}
	sup_groups_update(s);
}

/* Close c's socket and take it off the list (not freed). */
static void conn_unlink(struct sup *s, struct sup_conn *c)
{
	if (c->worker >= 0)
		worker_detach(s, c);
	if (c->sched >= 0)
		sched_detach(s, c);
	sup_epoll_del(s, c->fd);
	(void)close(c->fd);
	c->fd = -1;
	for (struct sup_conn **pp = &s->conns; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	s->n_conns--;
	s->n_refused -= c->refused;
}

static void conn_close(struct sup *s, struct sup_conn *c)
{
	conn_unlink(s, c);
	free(c);
}

/* conn_close from inside an epoll batch (sup_accept): a later event of the same batch may
 * still point at c, so it is freed after the batch (sup_conns_reap); sup_conn_input skips
 * it meanwhile (fd -1). */
static void conn_drop(struct sup *s, struct sup_conn *c)
{
	conn_unlink(s, c);
	c->next = s->dropped;
	s->dropped = c;
}

void sup_conns_reap(struct sup *s)
{
	while (s->dropped) {
		struct sup_conn *c = s->dropped;
		s->dropped = c->next;
		free(c);
	}
}

void sup_conns_close_all(struct sup *s)
{
	while (s->conns)
		conn_close(s, s->conns);
	sup_conns_reap(s);
}

uint64_t sup_conns_next_deadline(const struct sup *s)
{
	uint64_t next = 0;
	for (const struct sup_conn *c = s->conns; c; c = c->next)
		if (!conn_attached(c) && (!next || c->deadline < next))
			next = c->deadline;
	return next;
}

void sup_conns_expire(struct sup *s, uint64_t now)
{
	unsigned n = 0;
	for (struct sup_conn *c = s->conns, *next; c; c = next) {
		next = c->next;
		if (conn_attached(c) || c->fence_slot >= 0 || c->deadline > now)
			continue; /* waiting for its detach's fence: answered, then it may attach again */
		kvr_debug("connection from pid %d closed: not attached within %u ms", (int)c->pid,
			  s->cfg.supervisor.attach_timeout_ms);
		conn_close(s, c);
		n++;
	}
	s->n_idle_closed += n;
	if (n) /* one line per pass */
		kvr_warn("closed %u connection%s that did not attach within %u ms (supervisor.attach_timeout_ms; "
			 "%llu so far)", n, n == 1 ? "" : "s", s->cfg.supervisor.attach_timeout_ms,
			 (unsigned long long)s->n_idle_closed);
}

void sup_conn_input(struct sup *s, struct sup_conn *c, uint32_t events)
{
	static struct kvr_proto_req req; /* 3 KiB: kept off the stack; single-threaded */
	int fds[KVR_PROTO_MAX_FDS];
	unsigned n_fds = 0;
	const size_t hdr = offsetof(struct kvr_proto_req, payload);

	if (c->fd < 0)
		return; /* dropped earlier in this epoll batch (make_room) */
	if (!(events & EPOLLIN)) {
		conn_close(s, c);
		return;
	}
	ssize_t n = kvr_proto_recv(c->fd, &req, sizeof(req), fds, KVR_PROTO_MAX_FDS, &n_fds);
	if (c->refused) {
		/* Read before closing: closing with unread data resets the connection and the
		 * peer would lose the reply that says why. */
		for (unsigned i = 0; n > 0 && i < n_fds; i++)
			(void)close(fds[i]);
		if (n != -EAGAIN && n != -EINTR)
			conn_close(s, c);
		return;
	}
	if (n == -EAGAIN || n == -EINTR)
		return;
	if (n <= 0 && n != -EMSGSIZE) {
		conn_close(s, c); /* orderly close (0) or an error */
		return;
	}
	struct kvr_proto_rep rep;
	if (n < (ssize_t)hdr || req.magic != KVR_PROTO_MAGIC || req.version != KVR_PROTO_VERSION ||
	    req.payload_len > KVR_PROTO_PAYLOAD_MAX || (size_t)n < hdr + req.payload_len ||
	    (req.op != KVR_OP_INSPECT && req.op != KVR_OP_ATTACH && req.op != KVR_OP_DETACH &&
	     req.op != KVR_OP_ATTACH_SCHED)) {
		rep_init(s, &rep, -EPROTO, "malformed request");
		kvr_warn("malformed request from pid %d: closing the connection", (int)c->pid);
		(void)send_rep(c->fd, &rep, NULL, 0);
		for (unsigned i = 0; i < n_fds; i++)
			(void)close(fds[i]);
		conn_close(s, c);
		return;
	}
	switch (req.op) {
	case KVR_OP_INSPECT:
		handle_inspect(s, c);
		break;
	case KVR_OP_ATTACH:
		handle_attach(s, c, &req, fds, n_fds);
		break;
	case KVR_OP_ATTACH_SCHED:
		handle_attach_sched(s, c, &req, n_fds);
		break;
	case KVR_OP_DETACH:
		if (!conn_attached(c)) {
			rep_init(s, &rep, -ENOTCONN, "not attached");
		} else if (c->worker >= 0) {
			/* the fence: answered by sup_workers_update once the worker's loader, storer and
			 * gather actor have exited — nothing of it can copy any more (docs/api.md) */
			c->fence_slot = c->worker;
			c->fence_ns = kvr_now_ns();
			worker_detach(s, c);
			c->deadline = kvr_now_ns() + attach_timeout_ns(s); /* it may attach again */
			break;
		} else {
			sched_detach(s, c);
			c->deadline = kvr_now_ns() + attach_timeout_ns(s); /* it may attach again */
			rep_init(s, &rep, 0, NULL);
		}
		(void)send_rep(c->fd, &rep, NULL, 0);
		break;
	}
	for (unsigned i = 0; i < n_fds; i++)
		if (fds[i] >= 0)
			(void)close(fds[i]);
}
