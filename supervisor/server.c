/* kvringd socket: take-over of the path, accept, peer credentials, timeouts, reading requests, INSPECT. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <kvring/msg.h>

#include "kvr_log.h"
#include "kvr_proto.h"
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

void sup_rep_init(const struct sup *s, struct kvr_proto_rep *rep, int status, const char *fmt, ...)
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
int sup_send_rep(int fd, const struct kvr_proto_rep *rep, const int *fds, unsigned n_fds)
{
	return kvr_proto_send(fd, rep, offsetof(struct kvr_proto_rep, payload) + rep->payload_len, fds, n_fds);
}

static void conn_close(struct sup *s, struct sup_conn *c);
static void conn_drop(struct sup *s, struct sup_conn *c);

bool sup_conn_attached(const struct sup_conn *c)
{
	return c->worker >= 0 || c->sched >= 0;
}

uint64_t sup_attach_timeout_ns(const struct sup *s)
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
		if (!sup_conn_attached(c) && (!old || c->deadline <= old->deadline))
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
			sup_rep_init(s, &rep, -EACCES, "permission denied: uid %u is not the instance owner",
				     (unsigned)cr.uid);
			(void)sup_send_rep(fd, &rep, NULL, 0);
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
			sup_rep_init(s, &rep, -EMFILE, "too many connections (max %d)", SUP_MAX_CONNS);
			(void)sup_send_rep(fd, &rep, NULL, 0);
			(void)close(fd);
			continue;
		}
		*c = (struct sup_conn){.fd = fd, .watch = {W_CONN, c}, .pid = cr.pid, .uid = cr.uid, .worker = -1, .sched = -1, .fence_slot = -1,
				       .refused = refused, .deadline = kvr_now_ns() + sup_attach_timeout_ns(s),
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
int sup_send_client_fds(struct sup *s, int sock, const struct kvr_proto_rep *rep, unsigned area)
{
	int fds[2] = {reopen_ro(s->ctl_seg.fd), s->area_fd[area]};
	if (fds[0] < 0) {
		int rc = -errno;
		kvr_warn("cannot open a read-only view of the control segment: %s", strerror(errno));
		return rc;
	}
	int rc = sup_send_rep(sock, rep, fds, 2);
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
		sup_rep_init(s, &rep, -errno, "cannot open a read-only view of the control segment: %s", strerror(errno));
		(void)sup_send_rep(c->fd, &rep, NULL, 0);
		return;
	}
	n++;
	/* no slot table yet (no model section, no worker attached): an empty memfd in its place,
	 * which maps as no slot table */
	if ((fds[n] = s->slots ? reopen_ro(s->slots_seg.fd) : memfd_create("kvring-no-slots", MFD_CLOEXEC)) < 0) {
		sup_rep_init(s, &rep, -errno, "cannot open a read-only view of the slot table: %s", strerror(errno));
		(void)sup_send_rep(c->fd, &rep, NULL, 0);
		goto out;
	}
	n++;
	for (unsigned a = 0; a < s->ctl->n_areas; a++) { /* in slot order: kvr_ctl_map() */
		if ((fds[n] = reopen_ro(s->area_fd[a])) < 0) {
			sup_rep_init(s, &rep, -errno, "cannot open a read-only view of client area %u: %s", a, strerror(errno));
			(void)sup_send_rep(c->fd, &rep, NULL, 0);
			goto out;
		}
		n++;
	}
	sup_rep_init(s, &rep, 0, NULL);
	rep.n_fds = n;
	/* the payload: every attached engine and its clients (kvr_proto.h), which the control
	 * segment does not hold */
	_Static_assert(KVR_CTL_MAX_ENGINES * sizeof(struct kvr_inspect_engine) <= KVR_PROTO_PAYLOAD_MAX,
		       "the engine table fits an INSPECT reply");
	struct kvr_inspect_engine table[KVR_CTL_MAX_ENGINES];
	unsigned n_eng = sup_engine_table(s, table);
	memcpy(rep.payload, table, n_eng * sizeof(table[0]));
	rep.payload_len = n_eng * (uint32_t)sizeof(struct kvr_inspect_engine);
	int rc = sup_send_rep(c->fd, &rep, fds, n);
	kvr_debug("inspect from pid %d (%u engines)%s", (int)c->pid, n_eng, rc ? ": reply not sent" : "");
out:
	for (unsigned i = 0; i < n; i++)
		(void)close(fds[i]);
}

/* Close c's socket and take it off the list (not freed). */
static void conn_unlink(struct sup *s, struct sup_conn *c)
{
	sup_conn_detach(s, c);
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
		if (!sup_conn_attached(c) && (!next || c->deadline < next))
			next = c->deadline;
	return next;
}

void sup_conns_expire(struct sup *s, uint64_t now)
{
	unsigned n = 0;
	for (struct sup_conn *c = s->conns, *next; c; c = next) {
		next = c->next;
		if (sup_conn_attached(c) || c->fence_slot >= 0 || c->deadline > now)
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
		sup_rep_init(s, &rep, -EPROTO, "malformed request");
		kvr_warn("malformed request from pid %d: closing the connection", (int)c->pid);
		(void)sup_send_rep(c->fd, &rep, NULL, 0);
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
		sup_handle_attach(s, c, &req, fds, n_fds);
		break;
	case KVR_OP_ATTACH_SCHED:
		sup_handle_attach_sched(s, c, &req, n_fds);
		break;
	case KVR_OP_DETACH:
		sup_handle_detach(s, c);
		break;
	}
	for (unsigned i = 0; i < n_fds; i++)
		if (fds[i] >= 0)
			(void)close(fds[i]);
}
