/* Message construction, validation and description. */
#include <kvring/msg.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>

static const char *const type_names[KVR_MSG_TYPE_MAX] = {
	[KVR_MSG_PING] = "ping",
	[KVR_MSG_PONG] = "pong",
	[KVR_MSG_STOP] = "stop",
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
	char fl[8];
	snprintf(fl, sizeof(fl), "%s%s%s", (m->hdr.flags & KVR_MSGF_MORE) ? "M" : "",
		 (m->hdr.flags & KVR_MSGF_ERROR) ? "E" : "", m->hdr.flags ? "" : "-");
	snprintf(buf, len, "%s req=%llu seq=%u flags=%s len=%u", kvr_msg_type_name(m->hdr.type),
		 (unsigned long long)m->hdr.req_id, m->hdr.seq, fl, m->hdr.body_len);
	return buf;
}
