/* rcluster: CRC16 key slots, node addresses, the CLUSTER SLOTS map and MOVED/ASK parsing (see rcluster.h). */
#include "rcluster.h"

#include <errno.h>
#include <string.h>

/* CRC16-CCITT (XMODEM), poly 0x1021, MSB first: the table of the cluster spec's appendix. */
static const uint16_t crc16_tab[256] = {
	0x0000, 0x1021, 0x2042, 0x3063, 0x4084, 0x50a5, 0x60c6, 0x70e7,
	0x8108, 0x9129, 0xa14a, 0xb16b, 0xc18c, 0xd1ad, 0xe1ce, 0xf1ef,
	0x1231, 0x0210, 0x3273, 0x2252, 0x52b5, 0x4294, 0x72f7, 0x62d6,
	0x9339, 0x8318, 0xb37b, 0xa35a, 0xd3bd, 0xc39c, 0xf3ff, 0xe3de,
	0x2462, 0x3443, 0x0420, 0x1401, 0x64e6, 0x74c7, 0x44a4, 0x5485,
	0xa56a, 0xb54b, 0x8528, 0x9509, 0xe5ee, 0xf5cf, 0xc5ac, 0xd58d,
	0x3653, 0x2672, 0x1611, 0x0630, 0x76d7, 0x66f6, 0x5695, 0x46b4,
	0xb75b, 0xa77a, 0x9719, 0x8738, 0xf7df, 0xe7fe, 0xd79d, 0xc7bc,
	0x48c4, 0x58e5, 0x6886, 0x78a7, 0x0840, 0x1861, 0x2802, 0x3823,
	0xc9cc, 0xd9ed, 0xe98e, 0xf9af, 0x8948, 0x9969, 0xa90a, 0xb92b,
	0x5af5, 0x4ad4, 0x7ab7, 0x6a96, 0x1a71, 0x0a50, 0x3a33, 0x2a12,
	0xdbfd, 0xcbdc, 0xfbbf, 0xeb9e, 0x9b79, 0x8b58, 0xbb3b, 0xab1a,
	0x6ca6, 0x7c87, 0x4ce4, 0x5cc5, 0x2c22, 0x3c03, 0x0c60, 0x1c41,
	0xedae, 0xfd8f, 0xcdec, 0xddcd, 0xad2a, 0xbd0b, 0x8d68, 0x9d49,
	0x7e97, 0x6eb6, 0x5ed5, 0x4ef4, 0x3e13, 0x2e32, 0x1e51, 0x0e70,
	0xff9f, 0xefbe, 0xdfdd, 0xcffc, 0xbf1b, 0xaf3a, 0x9f59, 0x8f78,
	0x9188, 0x81a9, 0xb1ca, 0xa1eb, 0xd10c, 0xc12d, 0xf14e, 0xe16f,
	0x1080, 0x00a1, 0x30c2, 0x20e3, 0x5004, 0x4025, 0x7046, 0x6067,
	0x83b9, 0x9398, 0xa3fb, 0xb3da, 0xc33d, 0xd31c, 0xe37f, 0xf35e,
	0x02b1, 0x1290, 0x22f3, 0x32d2, 0x4235, 0x5214, 0x6277, 0x7256,
	0xb5ea, 0xa5cb, 0x95a8, 0x8589, 0xf56e, 0xe54f, 0xd52c, 0xc50d,
	0x34e2, 0x24c3, 0x14a0, 0x0481, 0x7466, 0x6447, 0x5424, 0x4405,
	0xa7db, 0xb7fa, 0x8799, 0x97b8, 0xe75f, 0xf77e, 0xc71d, 0xd73c,
	0x26d3, 0x36f2, 0x0691, 0x16b0, 0x6657, 0x7676, 0x4615, 0x5634,
	0xd94c, 0xc96d, 0xf90e, 0xe92f, 0x99c8, 0x89e9, 0xb98a, 0xa9ab,
	0x5844, 0x4865, 0x7806, 0x6827, 0x18c0, 0x08e1, 0x3882, 0x28a3,
	0xcb7d, 0xdb5c, 0xeb3f, 0xfb1e, 0x8bf9, 0x9bd8, 0xabbb, 0xbb9a,
	0x4a75, 0x5a54, 0x6a37, 0x7a16, 0x0af1, 0x1ad0, 0x2ab3, 0x3a92,
	0xfd2e, 0xed0f, 0xdd6c, 0xcd4d, 0xbdaa, 0xad8b, 0x9de8, 0x8dc9,
	0x7c26, 0x6c07, 0x5c64, 0x4c45, 0x3ca2, 0x2c83, 0x1ce0, 0x0cc1,
	0xef1f, 0xff3e, 0xcf5d, 0xdf7c, 0xaf9b, 0xbfba, 0x8fd9, 0x9ff8,
	0x6e17, 0x7e36, 0x4e55, 0x5e74, 0x2e93, 0x3eb2, 0x0ed1, 0x1ef0,
};

uint16_t kvr_rc_crc16(const void *buf, size_t len)
{
	const uint8_t *p = buf;
	uint16_t crc = 0;
	for (size_t i = 0; i < len; i++)
		crc = (uint16_t)(crc << 8) ^ crc16_tab[((crc >> 8) ^ p[i]) & 0xff];
	return crc;
}

unsigned kvr_rc_key_slot(const char *key, size_t len)
{
	const char *open = len ? memchr(key, '{', len) : NULL;
	if (open) {
		size_t s = (size_t)(open - key) + 1;
		const char *close = memchr(key + s, '}', len - s);
		if (close && close != key + s)
			return kvr_rc_crc16(key + s, (size_t)(close - (key + s))) & (KVR_RC_SLOTS - 1);
	}
	return kvr_rc_crc16(key, len) & (KVR_RC_SLOTS - 1);
}

/* ---- hosts and ports ------------------------------------------------------------------- */

static bool is_name_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
	       c == '_';
}

static bool is_v6_char(char c)
{
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') || c == ':' || c == '.';
}

/* Whether h[0..n) is a host as rcluster.h defines it (1..63 bytes; an IPv6 address only
 * when allow_v6). */
static bool host_ok(const char *h, size_t n, bool allow_v6)
{
	if (n == 0 || n >= KVR_RC_HOST_MAX)
		return false;
	bool name = true, v6 = memchr(h, ':', n) != NULL;
	for (size_t i = 0; i < n; i++) {
		name = name && is_name_char(h[i]);
		v6 = v6 && is_v6_char(h[i]);
	}
	return name || (allow_v6 && v6);
}

/* Parse s[0..n) as a port: 1..5 decimal digits, 1..65535. 0 or -1. */
static int port_parse(const char *s, size_t n, uint16_t *ret)
{
	unsigned v = 0;
	if (n == 0 || n > 5)
		return -1;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -1;
		v = v * 10 + (unsigned)(s[i] - '0');
	}
	if (v == 0 || v > 65535)
		return -1;
	*ret = (uint16_t)v;
	return 0;
}

/* Split s[0..n) into host and port. "[v6]:port" always; otherwise the port follows the
 * last ':' when unbracketed_v6 (Redis's redirect form) or the only ':' when not. An empty
 * host only when allow_empty. 0 or -1; *ret untouched on failure. */
static int endpoint_parse(const char *s, size_t n, bool unbracketed_v6, bool allow_empty, struct kvr_rc_node *ret)
{
	const char *h, *colon;
	size_t hn;
	bool v6;

	if (n && s[0] == '[') {
		const char *close = memchr(s, ']', n);
		if (!close)
			return -1;
		h = s + 1;
		hn = (size_t)(close - h);
		colon = close + 1;
		if (colon >= s + n || *colon != ':' || !memchr(h, ':', hn))
			return -1; /* no port, or brackets around something that is not IPv6 */
		v6 = true;
	} else {
		colon = memrchr(s, ':', n);
		if (!colon)
			return -1;
		h = s;
		hn = (size_t)(colon - s);
		v6 = unbracketed_v6;
		if (!v6 && memchr(h, ':', hn))
			return -1;
	}
	uint16_t port;
	if (port_parse(colon + 1, (size_t)(s + n - (colon + 1)), &port))
		return -1;
	if (!(hn == 0 && allow_empty) && !host_ok(h, hn, v6))
		return -1;
	memcpy(ret->host, h, hn);
	ret->host[hn] = 0;
	ret->port = port;
	return 0;
}

int kvr_rc_node_parse(const char *s, struct kvr_rc_node *ret)
{
	struct kvr_rc_node node;
	if (!s || !ret)
		return -EINVAL;
	size_t n = strnlen(s, 2 * KVR_RC_HOST_MAX);
	if (n >= 2 * KVR_RC_HOST_MAX || endpoint_parse(s, n, false, false, &node))
		return -EINVAL;
	*ret = node;
	return 0;
}

/* ---- the slot map ---------------------------------------------------------------------- */

void kvr_rc_map_init(struct kvr_rc_map *m)
{
	memset(m->owner, 0xff, sizeof(m->owner));
	m->n_nodes = 0;
	memset(m->nodes, 0, sizeof(m->nodes));
}

static int node_find(const struct kvr_rc_node *nodes, unsigned n, const char *host, size_t hn, uint16_t port)
{
	for (unsigned i = 0; i < n; i++)
		if (nodes[i].port == port && strlen(nodes[i].host) == hn && memcmp(nodes[i].host, host, hn) == 0)
			return (int)i;
	return -1;
}

/* Append host[0..hn):port (already validated, not yet listed). */
static int node_add(struct kvr_rc_map *m, const char *host, size_t hn, uint16_t port)
{
	struct kvr_rc_node *nd = &m->nodes[m->n_nodes];
	memcpy(nd->host, host, hn);
	nd->host[hn] = 0;
	nd->port = port;
	return (int)m->n_nodes++;
}

int kvr_rc_map_node(struct kvr_rc_map *m, const char *host, uint16_t port)
{
	if (!m || !host || port == 0)
		return -EINVAL;
	size_t hn = strnlen(host, KVR_RC_HOST_MAX);
	if (!host_ok(host, hn, true))
		return -EINVAL;
	int i = node_find(m->nodes, m->n_nodes, host, hn, port);
	if (i >= 0)
		return i;
	if (m->n_nodes >= KVR_RC_MAX_NODES)
		return -ENOSPC;
	return node_add(m, host, hn, port);
}

int kvr_rc_map_set(struct kvr_rc_map *m, unsigned slot, const char *host, uint16_t port)
{
	if (!m || slot >= KVR_RC_SLOTS)
		return -EINVAL;
	int i = kvr_rc_map_node(m, host, port);
	if (i < 0)
		return i;
	m->owner[slot] = (uint16_t)i;
	return i;
}

unsigned kvr_rc_map_covered(const struct kvr_rc_map *m)
{
	unsigned n = 0;
	for (unsigned s = 0; s < KVR_RC_SLOTS; s++)
		n += m->owner[s] != KVR_RC_NONE;
	return n;
}

/* One node entry of a CLUSTER SLOTS range, validated: its host (pointing into the reply or
 * at default_host) and port. */
struct slots_node {
	const char *host;
	size_t hn;
	uint16_t port;
};

static int slots_node_parse(const redisReply *e, const char *default_host, struct slots_node *ret)
{
	if (!e || e->type != REDIS_REPLY_ARRAY || e->elements < 2 || !e->element)
		return -1;
	const redisReply *ip = e->element[0], *port = e->element[1], *id = e->elements > 2 ? e->element[2] : NULL;
	if (!ip || !port || (e->elements > 2 && (!id || id->type != REDIS_REPLY_STRING)))
		return -1;
	if (port->type != REDIS_REPLY_INTEGER || port->integer < 1 || port->integer > 65535)
		return -1;
	if (ip->type == REDIS_REPLY_NIL || (ip->type == REDIS_REPLY_STRING && ip->len == 0)) {
		if (!default_host)
			return -1;
		ret->host = default_host;
		ret->hn = strnlen(default_host, KVR_RC_HOST_MAX);
	} else if (ip->type == REDIS_REPLY_STRING && ip->str) {
		ret->host = ip->str;
		ret->hn = ip->len;
	} else {
		return -1;
	}
	if (!host_ok(ret->host, ret->hn, true))
		return -1;
	ret->port = (uint16_t)port->integer;
	return 0;
}

/* Validate one range [start, end, master, replica...] into its bounds and master. */
static int slots_range_parse(const redisReply *rr, const char *default_host, unsigned *ret_start, unsigned *ret_end,
			     struct slots_node *ret_master)
{
	if (!rr || rr->type != REDIS_REPLY_ARRAY || rr->elements < 3 || !rr->element)
		return -1;
	const redisReply *s = rr->element[0], *e = rr->element[1];
	if (!s || !e || s->type != REDIS_REPLY_INTEGER || e->type != REDIS_REPLY_INTEGER)
		return -1;
	if (s->integer < 0 || e->integer < s->integer || e->integer >= (long long)KVR_RC_SLOTS)
		return -1;
	struct slots_node nd;
	for (size_t j = 2; j < rr->elements; j++) {
		if (slots_node_parse(rr->element[j], default_host, j == 2 ? ret_master : &nd))
			return -1;
	}
	*ret_start = (unsigned)s->integer;
	*ret_end = (unsigned)e->integer;
	return 0;
}

/*
 * Two passes over the reply so that m changes only when all of it is good, without a
 * 37 KiB copy of the map: the first validates every range, catches overlaps in a bitmap
 * of slots and counts the masters m does not list yet; the second, which cannot fail,
 * writes the assignment.
 */
int kvr_rc_map_from_slots(struct kvr_rc_map *m, const redisReply *r, const char *default_host)
{
	uint64_t seen[KVR_RC_SLOTS / 64] = {0};
	struct kvr_rc_node fresh[KVR_RC_MAX_NODES];
	unsigned n_fresh = 0;
	unsigned start, end;
	struct slots_node master;

	if (!m || !r)
		return -EINVAL;
	if (r->type != REDIS_REPLY_ARRAY || (r->elements && !r->element))
		return -EBADMSG;
	for (size_t i = 0; i < r->elements; i++) {
		if (slots_range_parse(r->element[i], default_host, &start, &end, &master))
			return -EBADMSG;
		for (unsigned s = start; s <= end; s++) {
			if (seen[s / 64] & (1ull << (s % 64)))
				return -EBADMSG;
			seen[s / 64] |= 1ull << (s % 64);
		}
		if (node_find(m->nodes, m->n_nodes, master.host, master.hn, master.port) >= 0 ||
		    node_find(fresh, n_fresh, master.host, master.hn, master.port) >= 0)
			continue;
		if (m->n_nodes + n_fresh >= KVR_RC_MAX_NODES)
			return -ENOSPC;
		memcpy(fresh[n_fresh].host, master.host, master.hn);
		fresh[n_fresh].host[master.hn] = 0;
		fresh[n_fresh].port = master.port;
		n_fresh++;
	}

	memset(m->owner, 0xff, sizeof(m->owner));
	for (size_t i = 0; i < r->elements; i++) {
		(void)slots_range_parse(r->element[i], default_host, &start, &end, &master);
		int idx = node_find(m->nodes, m->n_nodes, master.host, master.hn, master.port);
		if (idx < 0)
			idx = node_add(m, master.host, master.hn, master.port);
		for (unsigned s = start; s <= end; s++)
			m->owner[s] = (uint16_t)idx;
	}
	return 0;
}

/* ---- redirects ------------------------------------------------------------------------- */

int kvr_rc_parse_redirect(const char *err, size_t len, bool *ret_ask, unsigned *ret_slot,
			  struct kvr_rc_node *ret_node)
{
	struct kvr_rc_node node;
	bool ask;
	size_t p;

	if (!err || !ret_ask || !ret_slot || !ret_node)
		return -EINVAL;
	const char *sp = memchr(err, ' ', len);
	size_t word = sp ? (size_t)(sp - err) : len;
	if (word == 5 && memcmp(err, "MOVED", 5) == 0)
		ask = false;
	else if (word == 3 && memcmp(err, "ASK", 3) == 0)
		ask = true;
	else
		return -ENOENT;
	if (!sp)
		return -EBADMSG;

	p = word + 1;
	size_t digits = 0;
	unsigned slot = 0;
	while (p + digits < len && err[p + digits] >= '0' && err[p + digits] <= '9' && digits < 6) {
		slot = slot * 10 + (unsigned)(err[p + digits] - '0');
		digits++;
	}
	if (digits == 0 || digits > 5 || slot >= KVR_RC_SLOTS || p + digits >= len || err[p + digits] != ' ')
		return -EBADMSG;
	p += digits + 1;
	if (endpoint_parse(err + p, len - p, true, true, &node))
		return -EBADMSG;
	*ret_ask = ask;
	*ret_slot = slot;
	*ret_node = node;
	return 0;
}
