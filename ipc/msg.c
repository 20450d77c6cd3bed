/* Message construction, validation and description. */
#include <kvring/msg.h>
#include <kvring/kvring.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

static const char *const type_names[KVR_MSG_TYPE_MAX] = {
	[KVR_MSG_PING] = "ping",
	[KVR_MSG_PONG] = "pong",
	[KVR_MSG_STOP] = "stop",
	[KVR_MSG_WORKER_GONE] = "worker_gone",
	[KVR_MSG_LOOKUP] = "lookup",
	[KVR_MSG_LOOKUP_REP] = "lookup_rep",
	[KVR_MSG_SLOTS] = "slots",
	[KVR_MSG_LOAD] = "load",
	[KVR_MSG_LOAD_DONE] = "load_done",
	[KVR_MSG_BLOCKS] = "blocks",
	[KVR_MSG_STORE] = "store",
	[KVR_MSG_STORE_DONE] = "store_done",
	[KVR_MSG_ALLOC] = "alloc",
	[KVR_MSG_ALLOC_REP] = "alloc_rep",
	[KVR_MSG_COMMIT] = "commit",
	[KVR_MSG_COMMIT_REP] = "commit_rep",
	[KVR_MSG_RESET] = "reset",
	[KVR_MSG_L2_WRITE] = "l2_write",
	[KVR_MSG_L2_WRITE_DONE] = "l2_write_done",
	[KVR_MSG_L2_READ] = "l2_read",
	[KVR_MSG_L2_READ_DONE] = "l2_read_done",
	[KVR_MSG_L2_SYNC] = "l2_sync",
	[KVR_MSG_L2_HAVE] = "l2_have",
	[KVR_MSG_L2_GONE] = "l2_gone",
	[KVR_MSG_L2_TOUCH] = "l2_touch",
	[KVR_MSG_LEASE] = "lease",
	[KVR_MSG_LEASE_REP] = "lease_rep",
	[KVR_MSG_LEASE_RELEASE] = "lease_release",
	[KVR_MSG_LEASE_TAKE] = "lease_take",
	[KVR_MSG_LEASE_DONE] = "lease_done",
};

const char *kvr_msg_type_name(unsigned type)
{
	if (type < KVR_MSG_TYPE_MAX && type_names[type])
		return type_names[type];
	return "unknown";
}

void kvr_msg_build(struct kvr_msg *m, unsigned type, unsigned flags, uint64_t req_id, uint32_t seq,
		   const void *body, size_t body_len)
{
	memset(m, 0, sizeof(*m));
	if (body_len > KVR_MSG_BODY)
		body_len = KVR_MSG_BODY;
	m->hdr.type = (uint16_t)type;
	m->hdr.flags = (uint8_t)flags;
	m->hdr.body_len = (uint8_t)body_len;
	m->hdr.seq = seq;
	m->hdr.req_id = req_id;
	if (body && body_len)
		memcpy(m->body, body, body_len);
}

static int zero_from(const struct kvr_msg *m, size_t from)
{
	for (size_t i = from; i < KVR_MSG_BODY; i++)
		if (m->body[i])
			return -EBADMSG;
	return 0;
}

/* Header check shared by the decoders of single-message types. */
static int check_fixed(const struct kvr_msg *m, unsigned type, unsigned allowed_flags, size_t body_len)
{
	if (!m || m->hdr.type != type || (m->hdr.flags & ~allowed_flags) || m->hdr.body_len != body_len ||
	    m->hdr.seq != 0)
		return -EBADMSG;
	return zero_from(m, body_len);
}

int kvr_msg_decode_ping(const struct kvr_msg *m, struct kvr_msg_ping *ret)
{
	struct kvr_msg_ping p;
	if (check_fixed(m, KVR_MSG_PING, 0, sizeof(p)))
		return -EBADMSG;
	memcpy(&p, m->body, sizeof(p));
	if (p.reserved)
		return -EBADMSG;
	*ret = p;
	return 0;
}

int kvr_msg_decode_pong(const struct kvr_msg *m, struct kvr_msg_pong *ret)
{
	struct kvr_msg_pong p;
	if (check_fixed(m, KVR_MSG_PONG, 0, sizeof(p)))
		return -EBADMSG;
	memcpy(&p, m->body, sizeof(p));
	if (p.pid <= 0)
		return -EBADMSG;
	*ret = p;
	return 0;
}

int kvr_msg_decode_stop(const struct kvr_msg *m)
{
	return check_fixed(m, KVR_MSG_STOP, 0, 0);
}

char *kvr_msg_describe(const struct kvr_msg *m, char *buf, size_t len)
{
	char fl[16];
	unsigned f = m->hdr.flags, unknown = f & ~(unsigned)(KVR_MSGF_MORE | KVR_MSGF_ERROR);
	if (!f)
		snprintf(fl, sizeof(fl), "-");
	else if (unknown)
		snprintf(fl, sizeof(fl), "0x%02x", f);
	else
		snprintf(fl, sizeof(fl), "%s%s", (f & KVR_MSGF_MORE) ? "M" : "", (f & KVR_MSGF_ERROR) ? "E" : "");
	snprintf(buf, len, "%s req=%llu seq=%u flags=%s len=%u", kvr_msg_type_name(m->hdr.type),
		 (unsigned long long)m->hdr.req_id, m->hdr.seq, fl, m->hdr.body_len);
	return buf;
}

/* ---- lists ---------------------------------------------------------------------------- */

unsigned kvr_msg_list_item_size(unsigned type)
{
	switch (type) {
	case KVR_MSG_LOOKUP:
	case KVR_MSG_ALLOC:
		return sizeof(struct kvr_msg_key);
	case KVR_MSG_SLOTS:
	case KVR_MSG_ALLOC_REP:
	case KVR_MSG_COMMIT:
		return sizeof(struct kvr_msg_slot);
	case KVR_MSG_LOAD:
		return sizeof(struct kvr_msg_load_item);
	case KVR_MSG_STORE:
		return sizeof(struct kvr_msg_store_item);
	case KVR_MSG_BLOCKS:
		return sizeof(uint32_t);
	default:
		return 0;
	}
}

unsigned kvr_msg_list_per_msg(unsigned type)
{
	switch (type) {
	case KVR_MSG_LOOKUP:
	case KVR_MSG_ALLOC:
		return KVR_LIST_KEYS;
	case KVR_MSG_SLOTS:
	case KVR_MSG_ALLOC_REP:
	case KVR_MSG_COMMIT:
		return KVR_LIST_SLOTS;
	case KVR_MSG_LOAD:
		return KVR_LIST_LOAD;
	case KVR_MSG_STORE:
		return KVR_LIST_STORE;
	case KVR_MSG_BLOCKS:
		return KVR_LIST_BLOCKS;
	default:
		return 0;
	}
}

unsigned kvr_msg_build_list(struct kvr_msg *m, unsigned type, uint64_t req_id, uint32_t seq, uint8_t lane,
			    uint8_t flags, const void *items, uint32_t total)
{
	unsigned isz = kvr_msg_list_item_size(type), per = kvr_msg_list_per_msg(type);
	uint64_t first = (uint64_t)seq * per;
	unsigned count = first >= total ? 0 : (unsigned)(total - first < per ? total - first : per);
	struct kvr_msg_list_hdr h = {.total = total, .count = (uint16_t)count, .lane = lane, .flags = flags};
	uint8_t body[KVR_MSG_BODY] = {0};
	memcpy(body, &h, sizeof(h));
	if (count)
		memcpy(body + sizeof(h), (const uint8_t *)items + first * isz, (size_t)count * isz);
	bool more = first + count < total;
	kvr_msg_build(m, type, more ? KVR_MSGF_MORE : 0, req_id, seq, body, sizeof(h) + (size_t)count * isz);
	return count;
}

int kvr_msg_decode_list(const struct kvr_msg *m, unsigned type, struct kvr_msg_list_hdr *ret_hdr)
{
	unsigned isz = kvr_msg_list_item_size(type), per = kvr_msg_list_per_msg(type);
	struct kvr_msg_list_hdr h;
	if (!m || !isz || m->hdr.type != type || (m->hdr.flags & ~KVR_MSGF_MORE))
		return -EBADMSG;
	if (m->hdr.body_len < sizeof(h))
		return -EBADMSG;
	memcpy(&h, m->body, sizeof(h));
	if (h.total == 0 || h.total > KVR_MSG_MAX_LIST)
		return -EBADMSG;
	/* list flags are type-specific; unknown bits are never silently ignored */
	if (h.flags & ~(type == KVR_MSG_STORE ? (unsigned)KVR_STOREF_CUDA_EVENT : 0u))
		return -EBADMSG;
	uint64_t first = (uint64_t)m->hdr.seq * per;
	if (first >= h.total)
		return -EBADMSG;
	uint64_t left = h.total - first;
	unsigned expect = left < per ? (unsigned)left : per;
	if (h.count != expect || m->hdr.body_len != sizeof(h) + (size_t)expect * isz)
		return -EBADMSG;
	bool more = left > expect;
	if (more != !!(m->hdr.flags & KVR_MSGF_MORE))
		return -EBADMSG;
	if (zero_from(m, m->hdr.body_len))
		return -EBADMSG;
	*ret_hdr = h;
	return 0;
}

void kvr_msg_list_items(const struct kvr_msg *m, void *items_out)
{
	struct kvr_msg_list_hdr h;
	unsigned isz = kvr_msg_list_item_size(m->hdr.type), per = kvr_msg_list_per_msg(m->hdr.type);
	memcpy(&h, m->body, sizeof(h));
	memcpy((uint8_t *)items_out + (size_t)m->hdr.seq * per * isz, m->body + sizeof(h), (size_t)h.count * isz);
}

/* Result messages: a fixed body, MORE set exactly when a list follows. */
static int check_result(const struct kvr_msg *m, unsigned type, size_t body_len, bool list_follows)
{
	if (check_fixed(m, type, KVR_MSGF_MORE | KVR_MSGF_ERROR, body_len))
		return -EBADMSG;
	if (list_follows != !!(m->hdr.flags & KVR_MSGF_MORE))
		return -EBADMSG;
	return 0;
}

static bool status_ok(int32_t status)
{
	return status <= 0 && status > -4096;
}

int kvr_msg_decode_lookup_rep(const struct kvr_msg *m, struct kvr_msg_lookup_rep *ret)
{
	struct kvr_msg_lookup_rep r;
	if (!m || m->hdr.body_len != sizeof(r))
		return -EBADMSG;
	memcpy(&r, m->body, sizeof(r));
	if (check_result(m, KVR_MSG_LOOKUP_REP, sizeof(r), r.matched > 0) || !status_ok(r.status) ||
	    r.promoted > r.matched || r.matched > KVR_MSG_MAX_LIST || (r.status < 0 && r.matched) || r.pending ||
	    r.miss)
		return -EBADMSG;
	*ret = r;
	return 0;
}

int kvr_msg_decode_load_done(const struct kvr_msg *m, struct kvr_msg_load_done *ret)
{
	struct kvr_msg_load_done r;
	if (!m || m->hdr.body_len != sizeof(r))
		return -EBADMSG;
	memcpy(&r, m->body, sizeof(r));
	if (check_result(m, KVR_MSG_LOAD_DONE, sizeof(r), r.n_failed > 0) || !status_ok(r.status) ||
	    r.n_blocks > KVR_MSG_MAX_LIST || r.n_failed > r.n_blocks)
		return -EBADMSG;
	*ret = r;
	return 0;
}

int kvr_msg_decode_store_done(const struct kvr_msg *m, struct kvr_msg_store_done *ret)
{
	struct kvr_msg_store_done r;
	if (!m || m->hdr.body_len != sizeof(r))
		return -EBADMSG;
	memcpy(&r, m->body, sizeof(r));
	if (check_result(m, KVR_MSG_STORE_DONE, sizeof(r), r.n_failed > 0) || !status_ok(r.status) ||
	    r.reserved || r.n_blocks > KVR_MSG_MAX_LIST ||
	    (uint64_t)r.n_stored + r.n_present + r.n_failed > r.n_blocks)
		return -EBADMSG;
	*ret = r;
	return 0;
}

int kvr_msg_decode_commit_rep(const struct kvr_msg *m, struct kvr_msg_commit_rep *ret)
{
	struct kvr_msg_commit_rep r;
	if (check_fixed(m, KVR_MSG_COMMIT_REP, KVR_MSGF_ERROR, sizeof(r)))
		return -EBADMSG;
	memcpy(&r, m->body, sizeof(r));
	if (!status_ok(r.status) || r.reserved || r.n_visible > r.n_committed)
		return -EBADMSG;
	*ret = r;
	return 0;
}

int kvr_msg_decode_worker_gone(const struct kvr_msg *m, struct kvr_msg_worker_gone *ret)
{
	struct kvr_msg_worker_gone r;
	if (check_fixed(m, KVR_MSG_WORKER_GONE, 0, sizeof(r)))
		return -EBADMSG;
	memcpy(&r, m->body, sizeof(r));
	if (r.area_fd < -1 || r.reserved)
		return -EBADMSG;
	*ret = r;
	return 0;
}

int kvr_msg_decode_reset(const struct kvr_msg *m)
{
	return check_fixed(m, KVR_MSG_RESET, 0, 0);
}

int kvr_msg_decode_lease(const struct kvr_msg *m, unsigned type, struct kvr_msg_lease *ret)
{
	struct kvr_msg_lease b;
	if (type < KVR_MSG_LEASE_RELEASE && type != KVR_MSG_LEASE)
		return -EBADMSG;
	if (type > KVR_MSG_LEASE_DONE || check_fixed(m, type, 0, sizeof(b)))
		return -EBADMSG;
	memcpy(&b, m->body, sizeof(b));
	if (b.reserved || b.reserved2)
		return -EBADMSG;
	bool lease = type == KVR_MSG_LEASE, worker = type == KVR_MSG_LEASE_TAKE || type == KVR_MSG_LEASE_DONE;
	if (lease ? (!b.ttl_ms || b.ttl_ms > KVR_MSG_LEASE_MAX_TTL_MS || !b.loaders ||
		     b.loaders > KVR_MSG_LEASE_MAX_LOADERS || !b.n_keys || b.n_keys > KVR_MSG_MAX_LIST)
		  : (b.ttl_ms || b.loaders || b.n_keys))
		return -EBADMSG;
	if ((!worker && b.lane) || (type != KVR_MSG_LEASE_DONE && b.status) || !status_ok(b.status))
		return -EBADMSG;
	*ret = b;
	return 0;
}

int kvr_msg_decode_lease_rep(const struct kvr_msg *m, struct kvr_msg_lookup_rep *ret)
{
	struct kvr_msg_lookup_rep r;
	if (!m || m->hdr.body_len != sizeof(r))
		return -EBADMSG;
	memcpy(&r, m->body, sizeof(r));
	if (check_result(m, KVR_MSG_LEASE_REP, sizeof(r), false) || !status_ok(r.status) || r.promoted > r.matched ||
	    r.matched > KVR_MSG_MAX_LIST || (r.status < 0 && (r.matched || r.pending)) ||
	    r.pending > KVR_MSG_MAX_LIST - r.matched || r.miss >= KVR_MISS_REASONS)
		return -EBADMSG;
	*ret = r;
	return 0;
}

int kvr_msg_decode_l2(const struct kvr_msg *m, unsigned type, struct kvr_msg_l2 *ret)
{
	struct kvr_msg_l2 b;
	if (!m || (type && m->hdr.type != type) || m->hdr.type < KVR_MSG_L2_WRITE || m->hdr.type > KVR_MSG_L2_TOUCH)
		return -EBADMSG;
	unsigned t = m->hdr.type;
	if (t == KVR_MSG_L2_SYNC)
		return check_fixed(m, t, 0, 0) ? -EBADMSG : 0;
	if (check_fixed(m, t, KVR_MSGF_ERROR, sizeof(b)))
		return -EBADMSG;
	memcpy(&b, m->body, sizeof(b));
	bool done = t == KVR_MSG_L2_WRITE_DONE || t == KVR_MSG_L2_READ_DONE;
	unsigned allowed = t == KVR_MSG_L2_WRITE_DONE ? KVR_L2F_PRESENT
			   : t == KVR_MSG_L2_HAVE    ? KVR_L2F_LAST
			   : t == KVR_MSG_L2_READ_DONE ? KVR_L2F_GONE
			   : 0;
	if ((b.flags & ~allowed) || (!done && b.status) || !status_ok(b.status))
		return -EBADMSG;
	if (b.lane == 0xffff && !(t == KVR_MSG_L2_HAVE && (b.flags & KVR_L2F_LAST)))
		return -EBADMSG;
	if (ret)
		*ret = b;
	return 0;
}
