/* rconn: the remote actor's connections — one non-blocking socket per node, commands pipelined from a queue, replies framed and handed on. */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "kvr_log.h"
#include "kvr_time.h"
#include "remote.h"

/*
 * Why kvring's own connections and not hiredis's async client: remote.c's overview. Here:
 * a pipeline answers in order, so a node's output queue is also the list of replies to
 * come, and each reply framed by resp.c belongs to the head of the queue. A GET's value
 * streams into its slot (rtier.c, rm_get_*); every other reply is parsed by hiredis's
 * reader (redisReader: the RESP parser only, no connection) and handed on: the node's own
 * commands (AUTH here, CLUSTER SLOTS to rmap.c), a request's to rm_req_reply.
 *
 * A connection that fails is closed and reconnected with backoff (RM_BACKOFF_MIN_MS,
 * doubling to RM_BACKOFF_MAX_MS). One that fails where it cannot be closed (a write from
 * a callback) is marked broken and closed by rm_settle() at the end of the callback or tick.
 */

#define RM_BACKOFF_MIN_MS 50u
#define RM_BACKOFF_MAX_MS 2000u
#define RM_DIRECT_MIN (16u << 10)    /* a streamed value with this much left is read straight into its slot */
#define RM_READ_BUDGET (64ull << 20) /* bytes read per fd callback: the other nodes and the ring get a turn */
#define RM_IOV_MAX 64u

static void node_fd(struct kvr_actor *a, int fd, uint32_t revents, void *arg);
static int rx_reply(void *ctx, const char *raw, size_t len, bool streamed);
static void dispatch(struct remote *r, struct rnode *n, uint32_t req, uint8_t kind, const redisReply *rp);

static const struct kvr_resp_ops rx_ops = {
	.bulk_begin = rm_get_begin,
	.bulk_dest = rm_get_dest,
	.bulk_wrote = rm_get_wrote,
	.reply = rx_reply,
};

void rm_nodes_init(struct remote *r)
{
	for (unsigned n = 0; n < KVR_RC_MAX_NODES; n++) {
		r->nodes[n] = (struct rnode){.r = r, .fd = -1, .watch = -1, .backoff_ms = RM_BACKOFF_MIN_MS, .sink = RM_NONE};
		kvr_resp_init(&r->nodes[n].rx, &rx_ops, &r->nodes[n]);
	}
}

static const char *node_host(const struct remote *r, const struct rnode *n)
{
	return r->map.nodes[n - r->nodes].host;
}

static unsigned node_port(const struct remote *r, const struct rnode *n)
{
	return r->map.nodes[n - r->nodes].port;
}

static void ev_set(struct remote *r, struct rnode *n, uint32_t events)
{
	if (n->events == events)
		return;
	n->events = events;
	if (n->watch >= 0)
		kvr_actor_watch_events(r->a, n->watch, events);
}

/* ---- closing ------------------------------------------------------------------------------ */

/* Drop node n's connection (from outside its reply processing): every request queued
 * there is answered as if its reply were NULL (parked while its time is not up, else
 * failed), pins of unwritten SETs go. */
void rm_node_down(struct remote *r, unsigned ni, bool timed_out)
{
	struct rnode *n = &r->nodes[ni];
	if (n->fd < 0)
		return;
	if (n->watch >= 0)
		kvr_actor_unwatch_fd(r->a, n->watch);
	close(n->fd);
	n->fd = n->watch = -1;
	n->events = 0;
	n->st = N_DOWN;
	n->broken = 0;
	n->retry_ns = kvr_now_ns() + (uint64_t)n->backoff_ms * 1000000ull;
	n->backoff_ms = n->backoff_ms * 2 > RM_BACKOFF_MAX_MS ? RM_BACKOFF_MAX_MS : n->backoff_ms * 2;
	r->next_refresh_ns = 0; /* a node lost: its slots may have moved to a replica */
	kvr_resp_reset(&n->rx);
	n->sink = RM_NONE;
	struct rout *e = n->head;
	n->head = n->wr = n->tail = NULL;
	n->timed_out = timed_out;
	while (e) {
		struct rout *next = e->next;
		e->next = NULL;
		if (e->pinned) {
			(void)kvr_slot_unpin(r->slots, e->slot, KVR_PIN_REMOTE);
			e->pinned = false;
		}
		if (e->req != RM_NONE) {
			r->reqs[e->req].queued = false;
			dispatch(r, n, e->req, e->kinds[e->n_kinds - 1], NULL);
		} else if (e->kinds[0] == K_SLOTS) {
			r->refreshing = false;
		}
		e = next;
	}
	n->timed_out = false;
}

/* The first error of a connection seen where it cannot be closed: closed soon after. */
static void node_broke(struct rnode *n, int err)
{
	if (!n->broken)
		n->broken = err;
}

static void node_settle(struct remote *r, unsigned ni)
{
	struct rnode *n = &r->nodes[ni];
	if (n->fd < 0 || !n->broken)
		return;
	rm_count(r, KVR_STAT_RM_CONN_ERRORS, 1);
	kvr_warn("remote %s:%u: connection lost: %s", node_host(r, n), node_port(r, n), strerror(-n->broken));
	rm_node_down(r, ni, false);
}

void rm_settle(struct remote *r)
{
	for (unsigned ni = 0; ni < r->map.n_nodes; ni++)
		node_settle(r, ni);
}

/* ---- writing ------------------------------------------------------------------------------ */

/* Write what the queue holds, from n->wr on, without waiting. */
static void node_flush(struct remote *r, struct rnode *n)
{
	while (n->st == N_UP && n->wr && !n->broken) {
		struct iovec iov[RM_IOV_MAX];
		unsigned k = 0;
		for (struct rout *e = n->wr; e && k + 4 <= RM_IOV_MAX; e = e->next) {
			const struct {
				const void *p;
				uint64_t len;
			} part[4] = {{e->pre, e->pre_len},
				     {&e->hdr, e->payload ? sizeof(e->hdr) : 0},
				     {e->payload, e->payload_len},
				     {e->post, e->post_len}};
			uint64_t skip = e == n->wr ? e->off : 0;
			for (unsigned p = 0; p < 4; p++) {
				if (skip >= part[p].len) {
					skip -= part[p].len;
					continue;
				}
				iov[k++] = (struct iovec){(char *)part[p].p + skip, part[p].len - skip};
				skip = 0;
			}
		}
		ssize_t put = writev(n->fd, iov, (int)k);
		if (put < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN)
				node_broke(n, -errno);
			break;
		}
		uint64_t left = (uint64_t)put;
		while (left && n->wr) {
			struct rout *e = n->wr;
			uint64_t take = e->len - e->off < left ? e->len - e->off : left;
			e->off += take;
			left -= take;
			if (e->off < e->len)
				break;
			if (e->pinned) { /* the kernel has the payload */
				(void)kvr_slot_unpin(r->slots, e->slot, KVR_PIN_REMOTE);
				e->pinned = false;
			}
			n->wr = e->next;
		}
	}
	uint32_t ev = n->st == N_CONNECTING ? POLLOUT : POLLIN | (n->wr ? POLLOUT : 0);
	ev_set(r, n, ev);
}

/* Queue e (its pre/post/payload set) on node n and write what can be written now. */
void rm_node_push(struct remote *r, struct rnode *n, struct rout *e)
{
	e->next = NULL;
	e->off = 0;
	e->got = 0;
	e->len = e->pre_len + (e->payload ? sizeof(e->hdr) + e->payload_len : 0) + e->post_len;
	if (n->tail)
		n->tail->next = e;
	else
		n->head = e;
	n->tail = e;
	if (!n->wr)
		n->wr = e;
	node_flush(r, n);
}

/* One command formatted by hiredis (redisFormatCommandArgv), appended to buf at *at; false
 * when it does not fit RM_PRE_MAX (it always does: keys and config strings are bounded). */
bool rm_fmt_cmd(char *buf, uint16_t *at, unsigned argc, const char *const *argv, const size_t *argl)
{
	char *cmd = NULL;
	int n = redisFormatCommandArgv(&cmd, (int)argc, (const char **)argv, argl);
	bool ok = n > 0 && (size_t)n <= RM_PRE_MAX - *at;
	if (ok) {
		memcpy(buf + *at, cmd, (size_t)n);
		*at = (uint16_t)(*at + n);
	}
	redisFreeCommand(cmd);
	return ok;
}

void rm_ctl_cmd(struct rout *e, uint8_t kind, unsigned argc, const char *const *argv)
{
	size_t argl[4];
	for (unsigned i = 0; i < argc; i++)
		argl[i] = strlen(argv[i]);
	memset(e, 0, offsetof(struct rout, pre));
	e->req = RM_NONE;
	e->kinds[0] = kind;
	e->n_kinds = 1;
	(void)rm_fmt_cmd(e->pre, &e->pre_len, argc, argv, argl); /* AUTH / CLUSTER SLOTS: bounded by the config */
}

/* ---- connecting --------------------------------------------------------------------------- */

/* A socket to host:port, connecting (non-blocking). -errno on failure. */
static int tcp_start(const char *host, unsigned port)
{
	char ps[8];
	snprintf(ps, sizeof(ps), "%u", port);
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICHOST};
	struct addrinfo *ai = NULL;
	int rc = getaddrinfo(host, ps, &hints, &ai);
	if (rc == EAI_NONAME) { /* a name, not an address: resolved (blocking) as hiredis did */
		hints.ai_flags = 0;
		rc = getaddrinfo(host, ps, &hints, &ai);
	}
	if (rc)
		return rc == EAI_SYSTEM ? -errno : -EHOSTUNREACH;
	int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		rc = -errno;
		freeaddrinfo(ai);
		return rc;
	}
	int one = 1;
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	(void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
	if (connect(fd, ai->ai_addr, ai->ai_addrlen) && errno != EINPROGRESS) {
		rc = -errno;
		close(fd);
		freeaddrinfo(ai);
		return rc;
	}
	freeaddrinfo(ai);
	return fd;
}

/* Node ni with a connection (maybe still connecting: commands queue until it is up), or
 * NULL: none, and its backoff has not passed or the connect failed at once. */
struct rnode *rm_node_ctx(struct remote *r, unsigned ni)
{
	struct rnode *n = &r->nodes[ni];
	if (n->fd >= 0)
		return n;
	uint64_t now = kvr_now_ns();
	if (now < n->retry_ns)
		return NULL;
	const struct kvr_rc_node *addr = &r->map.nodes[ni];
	int fd = tcp_start(addr->host, addr->port);
	if (fd >= 0) {
		n->watch = kvr_actor_watch_fd(r->a, fd, POLLOUT, node_fd, n); /* POLLOUT: the connect completes */
		if (n->watch < 0) {
			kvr_err("remote %s:%u: cannot watch the socket: %s", addr->host, addr->port, strerror(-n->watch));
			close(fd);
			n->watch = -1;
			n->retry_ns = now + (uint64_t)RM_BACKOFF_MAX_MS * 1000000ull;
			return NULL;
		}
	} else {
		rm_count(r, KVR_STAT_RM_CONN_ERRORS, 1);
		kvr_warn("remote %s:%u: cannot connect: %s", addr->host, addr->port, strerror(-fd));
		n->retry_ns = now + (uint64_t)n->backoff_ms * 1000000ull;
		return NULL;
	}
	n->fd = fd;
	n->events = POLLOUT;
	n->st = N_CONNECTING;
	n->since_ns = now;
	n->broken = 0;
	n->sink = RM_NONE;
	kvr_resp_reset(&n->rx);
	const struct kvr_config *cfg = &r->a->cfg;
	if (cfg->remote.password[0]) {
		const char *argv[3] = {"AUTH", cfg->remote.user[0] ? cfg->remote.user : cfg->remote.password,
				       cfg->remote.password};
		rm_ctl_cmd(&n->auth, K_AUTH, cfg->remote.user[0] ? 3 : 2, argv);
		rm_node_push(r, n, &n->auth);
	}
	return n;
}

/* The socket connected (or failed to). */
static void node_connected(struct remote *r, unsigned ni)
{
	struct rnode *n = &r->nodes[ni];
	int err = 0;
	socklen_t el = sizeof(err);
	if (getsockopt(n->fd, SOL_SOCKET, SO_ERROR, &err, &el))
		err = errno;
	if (err) {
		rm_count(r, KVR_STAT_RM_CONN_ERRORS, 1);
		kvr_warn("remote %s:%u: connect failed: %s", node_host(r, n), node_port(r, n), strerror(err));
		rm_node_down(r, ni, false);
		return;
	}
	n->st = N_UP;
	n->backoff_ms = RM_BACKOFF_MIN_MS;
	node_flush(r, n);
}

/* ---- replies ------------------------------------------------------------------------------ */

static void on_auth(struct remote *r, struct rnode *n, const redisReply *rp)
{
	if (rp && rp->type == REDIS_REPLY_ERROR) {
		kvr_err("remote %s:%u: AUTH refused: %s", node_host(r, n), node_port(r, n), rp->str);
		rm_count(r, KVR_STAT_RM_REPLY_ERRORS, 1);
		n->backoff_ms = RM_BACKOFF_MAX_MS;
		node_broke(n, -EACCES);
	}
}

/* A reply (NULL: the connection went first) of kind for request req (RM_NONE: node n's own). */
static void dispatch(struct remote *r, struct rnode *n, uint32_t req, uint8_t kind, const redisReply *rp)
{
	if (kind == K_AUTH)
		on_auth(r, n, rp);
	else if (kind == K_SLOTS)
		rm_on_slots(r, n, rp);
	else
		rm_req_reply(r, req, kind, rp);
}

/* resp: a reply is complete; it belongs to the head of the queue. */
static int rx_reply(void *ctx, const char *raw, size_t len, bool streamed)
{
	struct rnode *n = ctx;
	struct remote *r = n->r;
	struct rout *h = n->head;
	if (!h || (h == n->wr && (!h->off || h->got + 1 == h->n_kinds))) {
		node_broke(n, -EPROTO); /* a reply to nothing we sent (or to a command not all sent) */
		return 1;
	}
	uint8_t kind = h->kinds[h->got++];
	uint32_t req = h->req;
	if (h->got == h->n_kinds) { /* its last reply: off the queue before anything resends it */
		n->head = h->next;
		if (n->tail == h)
			n->tail = NULL;
		h->next = NULL;
		if (req != RM_NONE)
			r->reqs[req].queued = false;
	}
	if (streamed) {
		rm_get_end(n);
		redisReply v = {.type = REDIS_REPLY_STRING, .len = len};
		dispatch(r, n, req, kind, &v);
		return n->broken ? 1 : 0;
	}
	void *rp = NULL;
	if (redisReaderFeed(r->reader, raw, len) != REDIS_OK || redisReaderGetReply(r->reader, &rp) != REDIS_OK ||
	    !rp) {
		/* cannot happen for a reply resp framed; the reader may be unusable: start anew */
		redisReaderFree(r->reader);
		r->reader = redisReaderCreate();
		node_broke(n, r->reader ? -EPROTO : -ENOMEM);
		return 1;
	}
	dispatch(r, n, req, kind, rp);
	freeReplyObject(rp);
	return n->broken ? 1 : 0;
}

static void node_fd(struct kvr_actor *a, int fd, uint32_t revents, void *arg)
{
	(void)a;
	struct rnode *n = arg;
	struct remote *r = n->r;
	unsigned ni = (unsigned)(n - r->nodes);
	if (n->fd != fd)
		return;
	if (n->st == N_CONNECTING) {
		if (revents & (POLLOUT | POLLERR | POLLHUP))
			node_connected(r, ni);
		return;
	}
	if (revents & POLLOUT)
		node_flush(r, n);
	if (!(revents & (POLLIN | POLLERR | POLLHUP)))
		goto out;
	/* a streamed value is read straight into its slot; everything else through rbuf and resp */
	for (uint64_t budget = RM_READ_BUDGET; budget && !n->broken;) {
		uint64_t left = kvr_resp_stream_left(&n->rx);
		ssize_t got;
		if (left >= RM_DIRECT_MIN) {
			size_t room = left > budget ? (size_t)budget : (size_t)left;
			void *dst = rm_get_dest(n, &room);
			if (!dst) {
				dst = r->rbuf;
				room = room < sizeof(r->rbuf) ? room : sizeof(r->rbuf);
			}
			got = read(fd, dst, room);
			if (got > 0) {
				kvr_resp_streamed(&n->rx, (size_t)got);
				budget -= (uint64_t)got < budget ? (uint64_t)got : budget;
				continue;
			}
		} else {
			got = read(fd, r->rbuf, sizeof(r->rbuf));
			if (got > 0) {
				int rc = kvr_resp_feed(&n->rx, r->rbuf, (size_t)got);
				if (rc < 0)
					node_broke(n, rc);
				budget -= (uint64_t)got < budget ? (uint64_t)got : budget;
				continue;
			}
		}
		if (got == 0) {
			node_broke(n, -ECONNRESET); /* the server closed the connection */
			break;
		}
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN)
			node_broke(n, -errno);
		break;
	}
out:
	node_settle(r, ni);
}
