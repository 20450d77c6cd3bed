/* remote tier tests: CRC16, key slots (as redis-server 7.0 gives them), CLUSTER SLOTS maps, MOVED/ASK, the value check. */
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <xxhash.h>

#include "kvr_time.h"
#include "rcluster.h"
#include "rvalue.h"

TestSuite(rcluster);
TestSuite(rvalue);

/* ---- CRC16 and key slots ---------------------------------------------------------------- */

/* Bit-at-a-time CRC16-XMODEM, the definition the table must agree with. */
static uint16_t crc16_ref(const uint8_t *p, size_t n)
{
	uint16_t c = 0;
	for (size_t i = 0; i < n; i++) {
		c ^= (uint16_t)(p[i] << 8);
		for (int b = 0; b < 8; b++)
			c = c & 0x8000 ? (uint16_t)((c << 1) ^ 0x1021) : (uint16_t)(c << 1);
	}
	return c;
}

Test(rcluster, crc16_vectors)
{
	cr_assert_eq(kvr_rc_crc16("123456789", 9), 0x31c3);
	cr_assert_eq(kvr_rc_crc16(NULL, 0), 0);
	cr_assert_eq(kvr_rc_crc16("A", 1), 0x58e5);
	cr_assert_eq(kvr_rc_crc16("foo", 3), 0xaf96);
	cr_assert_eq(kvr_rc_crc16("bar", 3), 0x93c5);
	cr_assert_eq(kvr_rc_crc16("\xff\xff\xff\xff", 4), 0x99cf);
	cr_assert_eq(kvr_rc_crc16("\0", 1), 0);

	uint8_t buf[300];
	uint64_t x = 0x9e3779b97f4a7c15ull;
	for (int it = 0; it < 2000; it++) {
		size_t n = (size_t)(it % 300);
		for (size_t i = 0; i < n; i++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			buf[i] = (uint8_t)x;
		}
		cr_assert_eq(kvr_rc_crc16(buf, n), crc16_ref(buf, n), "length %zu", n);
	}
}

/* Every slot here is what `redis-cli CLUSTER KEYSLOT <key>` answered on redis-server 7.0.15
 * started with --cluster-enabled yes. */
static const struct {
	const char *key;
	unsigned slot;
} known_slots[] = {
	{"foo", 12182},
	{"bar", 5061},
	{"123456789", 12739},
	{"{user1000}.following", 3443},
	{"{user1000}.followers", 3443},
	{"foo{}{bar}", 8363},          /* empty first tag: the whole key */
	{"foo{{bar}}zap", 4015},       /* hashes "{bar" */
	{"{bar", 4015},
	{"foo{bar}{zap}", 5061},       /* hashes "bar" */
	{"", 0},
	{"{}", 15257},
	{"{", 4092},
	{"}", 12090},
	{"a{}", 6082},
	{"{a}", 15495},
	{"a", 15495},
	{"{}{a}", 13650},              /* the first tag is empty: the whole key, not "a" */
	{"foo{bar", 15278},            /* no closing brace: the whole key */
	{"foo}bar{", 11073},           /* '}' before '{' does not count */
	{"fedcba98765432100123456789abcdef", 2662},
	{"kvr:00000000000000000000000000000000:{fedcba98765432100123456789abcdef}:0", 2662},
	{"kvr:00000000000000000000000000000000:{fedcba98765432100123456789abcdef}:7", 2662},
};

Test(rcluster, key_slots_match_redis)
{
	for (size_t i = 0; i < sizeof(known_slots) / sizeof(known_slots[0]); i++) {
		const char *k = known_slots[i].key;
		cr_assert_eq(kvr_rc_key_slot(k, strlen(k)), known_slots[i].slot, "%s", k);
	}
}

Test(rcluster, hash_tags)
{
	/* the tag alone decides */
	unsigned s = kvr_rc_key_slot("user1000", 8);
	cr_assert_eq(kvr_rc_key_slot("{user1000}.following", 20), s);
	cr_assert_eq(kvr_rc_key_slot("x{user1000}", 11), s);
	cr_assert_eq(kvr_rc_key_slot("{user1000}{other}", 17), s);
	/* binary safe: the length, not a NUL, ends the key; a NUL inside a tag is hashed */
	cr_assert_eq(kvr_rc_key_slot("foo\0bar", 3), 12182);
	cr_assert_eq(kvr_rc_key_slot("{a\0b}", 5), kvr_rc_crc16("a\0b", 3) & 16383);
	/* a '}' beyond len is not seen */
	cr_assert_eq(kvr_rc_key_slot("{ab}", 3), kvr_rc_crc16("{ab", 3) & 16383);
	cr_assert_eq(kvr_rc_key_slot(NULL, 0), 0);
	/* the slot is always in range */
	char key[16];
	for (unsigned i = 0; i < 100000; i++) {
		int n = snprintf(key, sizeof(key), "k%u", i);
		cr_assert_lt(kvr_rc_key_slot(key, (size_t)n), KVR_RC_SLOTS);
	}
}

/* ---- node addresses --------------------------------------------------------------------- */

#define H63 "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz01234567890"
#define H64 H63 "x"

Test(rcluster, node_parse_good)
{
	static const struct {
		const char *s, *host;
		uint16_t port;
	} good[] = {
		{"127.0.0.1:7000", "127.0.0.1", 7000},
		{"localhost:1", "localhost", 1},
		{"redis-0.redis_svc.local:65535", "redis-0.redis_svc.local", 65535},
		{"a:6379", "a", 6379},
		{"[::1]:6379", "::1", 6379},
		{"[fe80::1:2]:7000", "fe80::1:2", 7000},
		{"[::ffff:10.0.0.1]:7001", "::ffff:10.0.0.1", 7001},
		{"h:007", "h", 7},
		{H63 ":9", H63, 9},
	};
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		struct kvr_rc_node n;
		memset(&n, 0x5a, sizeof(n));
		cr_assert_eq(kvr_rc_node_parse(good[i].s, &n), 0, "%s", good[i].s);
		cr_assert_str_eq(n.host, good[i].host, "%s", good[i].s);
		cr_assert_eq(n.port, good[i].port, "%s", good[i].s);
	}
}

Test(rcluster, node_parse_bad)
{
	static const char *const bad[] = {
		"", ":7000", "host", "host:", "host:0", "host:00000", "host:65536", "host:99999", "host:123456",
		"host:-1", "host:+1", "host: 1", "host:1 ", " host:1", "host:1x", "ho st:1", "host:1:2", "::1:7000",
		"[::1]", "[::1]7000", "[::1]:", "[]:7000", "[abc]:7000", "[::1:7000", "[::1]]:7000", "[::g]:7000",
		"?:7000", "host?:1", "h:1@17000", "h\t:1", H64 ":9", "[" H64 "]:9",
		"verylonghostname-verylonghostname-verylonghostname-verylonghostname-verylonghostname-"
		"verylonghostname-verylonghostname-verylonghostname:7000",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct kvr_rc_node n, before;
		memset(&n, 0x5a, sizeof(n));
		before = n;
		cr_assert_eq(kvr_rc_node_parse(bad[i], &n), -EINVAL, "'%s'", bad[i]);
		cr_assert_eq(memcmp(&n, &before, sizeof(n)), 0, "'%s' touched the output", bad[i]);
	}
	struct kvr_rc_node n;
	cr_assert_eq(kvr_rc_node_parse(NULL, &n), -EINVAL);
	cr_assert_eq(kvr_rc_node_parse("h:1", NULL), -EINVAL);
}

/* ---- hand-built redisReply trees -------------------------------------------------------- */

static redisReply *r_new(int type)
{
	redisReply *r = calloc(1, sizeof(*r));
	cr_assert(r);
	r->type = type;
	return r;
}

static redisReply *r_int(long long v)
{
	redisReply *r = r_new(REDIS_REPLY_INTEGER);
	r->integer = v;
	return r;
}

/* A string of n bytes (may hold NULs). */
static redisReply *r_strn(const char *s, size_t n, int type)
{
	redisReply *r = r_new(type);
	r->str = malloc(n + 1);
	cr_assert(r->str);
	memcpy(r->str, s, n);
	r->str[n] = 0;
	r->len = n;
	return r;
}

static redisReply *r_str(const char *s)
{
	return r_strn(s, strlen(s), REDIS_REPLY_STRING);
}

static redisReply *r_nil(void)
{
	return r_new(REDIS_REPLY_NIL);
}

/* An array of n elements, given as arguments. */
static redisReply *r_arr(size_t n, ...)
{
	redisReply *r = r_new(REDIS_REPLY_ARRAY);
	va_list ap;
	r->elements = n;
	r->element = n ? calloc(n, sizeof(*r->element)) : NULL;
	va_start(ap, n);
	for (size_t i = 0; i < n; i++)
		r->element[i] = va_arg(ap, redisReply *);
	va_end(ap);
	return r;
}

static void r_free(redisReply *r)
{
	if (!r)
		return;
	for (size_t i = 0; i < r->elements; i++)
		r_free(r->element[i]);
	free(r->element);
	free(r->str);
	free(r);
}

/* Replace element i of array a (the old one freed). */
static void r_put(redisReply *a, size_t i, redisReply *e)
{
	r_free(a->element[i]);
	a->element[i] = e;
}

/* A node entry as Redis 7 sends it over RESP2: ip, port, id, networking metadata (a
 * flattened map: here its hostname). */
static redisReply *r_node(const char *ip, long long port, const char *id)
{
	return r_arr(4, r_str(ip), r_int(port), r_str(id), r_arr(2, r_str("hostname"), r_str("")));
}

/* The CLUSTER SLOTS of a 3-master cluster with one replica each, as redis-cli --cluster
 * create lays it out on ports 7000..7005. */
static redisReply *good_slots(void)
{
	return r_arr(3,
		     r_arr(4, r_int(0), r_int(5460), r_node("127.0.0.1", 7000, "id0"),
			   r_node("127.0.0.1", 7004, "id4")),
		     r_arr(4, r_int(5461), r_int(10922), r_node("127.0.0.1", 7001, "id1"),
			   r_node("127.0.0.1", 7005, "id5")),
		     r_arr(4, r_int(10923), r_int(16383), r_node("127.0.0.1", 7002, "id2"),
			   r_node("127.0.0.1", 7003, "id3")));
}

static void assert_good_map(const struct kvr_rc_map *m)
{
	cr_assert_eq(m->n_nodes, 3);
	cr_assert_eq(kvr_rc_map_covered(m), KVR_RC_SLOTS);
	for (unsigned i = 0; i < 3; i++) {
		cr_assert_str_eq(m->nodes[i].host, "127.0.0.1");
		cr_assert_eq(m->nodes[i].port, 7000 + i);
	}
	for (unsigned s = 0; s < KVR_RC_SLOTS; s++)
		cr_assert_eq(m->owner[s], s <= 5460 ? 0 : s <= 10922 ? 1 : 2, "slot %u", s);
}

static struct kvr_rc_map map_a, map_b;

Test(rcluster, map_init_and_nodes)
{
	struct kvr_rc_map *m = &map_a;
	memset(m, 0x33, sizeof(*m));
	kvr_rc_map_init(m);
	cr_assert_eq(m->n_nodes, 0);
	cr_assert_eq(kvr_rc_map_covered(m), 0);
	for (unsigned s = 0; s < KVR_RC_SLOTS; s++)
		cr_assert_eq(m->owner[s], KVR_RC_NONE);

	cr_assert_eq(kvr_rc_map_node(m, "127.0.0.1", 7000), 0);
	cr_assert_eq(kvr_rc_map_node(m, "127.0.0.1", 7001), 1);
	cr_assert_eq(kvr_rc_map_node(m, "127.0.0.1", 7000), 0);
	cr_assert_eq(kvr_rc_map_node(m, "localhost", 7000), 2);
	cr_assert_eq(kvr_rc_map_node(m, "::1", 7000), 3);
	cr_assert_eq(m->n_nodes, 4);
	cr_assert_eq(kvr_rc_map_node(m, "127.0.0.1", 0), -EINVAL);
	cr_assert_eq(kvr_rc_map_node(m, "", 7000), -EINVAL);
	cr_assert_eq(kvr_rc_map_node(m, "?", 7000), -EINVAL);
	cr_assert_eq(kvr_rc_map_node(m, H64, 7000), -EINVAL);
	cr_assert_eq(kvr_rc_map_node(m, NULL, 7000), -EINVAL);
	cr_assert_eq(kvr_rc_map_node(NULL, "h", 7000), -EINVAL);
	cr_assert_eq(m->n_nodes, 4);
	for (unsigned p = 4; p < KVR_RC_MAX_NODES; p++)
		cr_assert_eq(kvr_rc_map_node(m, "10.0.0.1", (uint16_t)(8000 + p)), (int)p);
	memcpy(&map_b, m, sizeof(*m));
	cr_assert_eq(kvr_rc_map_node(m, "10.0.0.2", 8000), -ENOSPC);
	cr_assert_eq(memcmp(m, &map_b, sizeof(*m)), 0);
	cr_assert_eq(kvr_rc_map_node(m, "127.0.0.1", 7001), 1, "a listed node is found in a full map");
}

Test(rcluster, map_set)
{
	struct kvr_rc_map *m = &map_a;
	kvr_rc_map_init(m);
	cr_assert_eq(kvr_rc_map_set(m, 100, "127.0.0.1", 7000), 0);
	cr_assert_eq(kvr_rc_map_set(m, 16383, "127.0.0.1", 7001), 1);
	cr_assert_eq(kvr_rc_map_set(m, 100, "127.0.0.1", 7001), 1);
	cr_assert_eq(m->owner[100], 1);
	cr_assert_eq(m->owner[16383], 1);
	cr_assert_eq(kvr_rc_map_covered(m), 2);
	memcpy(&map_b, m, sizeof(*m));
	cr_assert_eq(kvr_rc_map_set(m, 16384, "127.0.0.1", 7000), -EINVAL);
	cr_assert_eq(kvr_rc_map_set(m, 5, "bad host", 7000), -EINVAL);
	cr_assert_eq(kvr_rc_map_set(m, 5, "h", 0), -EINVAL);
	cr_assert_eq(memcmp(m, &map_b, sizeof(*m)), 0);
	for (unsigned p = 2; p < KVR_RC_MAX_NODES; p++)
		cr_assert_eq(kvr_rc_map_node(m, "10.0.0.1", (uint16_t)(8000 + p)), (int)p);
	memcpy(&map_b, m, sizeof(*m));
	cr_assert_eq(kvr_rc_map_set(m, 7, "10.0.0.9", 1), -ENOSPC);
	cr_assert_eq(memcmp(m, &map_b, sizeof(*m)), 0);
}

Test(rcluster, from_slots_good)
{
	struct kvr_rc_map *m = &map_a;
	redisReply *r = good_slots();
	kvr_rc_map_init(m);
	cr_assert_eq(kvr_rc_map_from_slots(m, r, NULL), 0);
	assert_good_map(m);
	/* the same reply again changes nothing */
	memcpy(&map_b, m, sizeof(*m));
	cr_assert_eq(kvr_rc_map_from_slots(m, r, "10.9.9.9"), 0);
	cr_assert_eq(memcmp(m, &map_b, sizeof(*m)), 0);
	r_free(r);

	/* a node without id or metadata (older servers: [ip, port]) */
	r = r_arr(1, r_arr(3, r_int(0), r_int(16383), r_arr(2, r_str("10.1.1.1"), r_int(6379))));
	kvr_rc_map_init(m);
	cr_assert_eq(kvr_rc_map_from_slots(m, r, NULL), 0);
	cr_assert_eq(m->n_nodes, 1);
	cr_assert_str_eq(m->nodes[0].host, "10.1.1.1");
	cr_assert_eq(m->nodes[0].port, 6379);
	cr_assert_eq(kvr_rc_map_covered(m), KVR_RC_SLOTS);
	r_free(r);

	/* no ranges: a cluster with nothing assigned */
	r = r_arr(0);
	cr_assert_eq(kvr_rc_map_from_slots(m, r, NULL), 0);
	cr_assert_eq(kvr_rc_map_covered(m), 0);
	cr_assert_eq(m->n_nodes, 1, "a node that owns nothing stays listed");
	r_free(r);
}

Test(rcluster, from_slots_split_ranges_and_stable_indices)
{
	struct kvr_rc_map *m = &map_a;
	kvr_rc_map_init(m);
	cr_assert_eq(kvr_rc_map_node(m, "127.0.0.1", 7002), 0); /* listed before any reply */

	/* after a reshard: one master owns two ranges, a slot range unassigned (100..199) */
	redisReply *r = r_arr(4, r_arr(3, r_int(0), r_int(99), r_node("127.0.0.1", 7001, "a")),
			      r_arr(3, r_int(200), r_int(8000), r_node("127.0.0.1", 7000, "b")),
			      r_arr(3, r_int(8001), r_int(8001), r_node("127.0.0.1", 7001, "a")),
			      r_arr(3, r_int(8002), r_int(16383), r_node("127.0.0.1", 7002, "c")));
	cr_assert_eq(kvr_rc_map_from_slots(m, r, NULL), 0);
	cr_assert_eq(m->n_nodes, 3);
	cr_assert_eq(m->nodes[0].port, 7002);
	cr_assert_eq(m->nodes[1].port, 7001);
	cr_assert_eq(m->nodes[2].port, 7000);
	cr_assert_eq(kvr_rc_map_covered(m), KVR_RC_SLOTS - 100);
	for (unsigned s = 0; s < KVR_RC_SLOTS; s++) {
		unsigned want = s < 100 ? 1 : s < 200 ? KVR_RC_NONE : s <= 8000 ? 2 : s == 8001 ? 1 : 0;
		cr_assert_eq(m->owner[s], want, "slot %u", s);
	}
	r_free(r);

	/* a refresh with the masters in another order and a new one: indices keep, the new
	 * one is appended, slots the reply does not name become unassigned */
	r = r_arr(2, r_arr(3, r_int(0), r_int(5000), r_node("127.0.0.1", 7009, "n")),
		  r_arr(3, r_int(5001), r_int(6000), r_node("127.0.0.1", 7000, "b")));
	cr_assert_eq(kvr_rc_map_from_slots(m, r, NULL), 0);
	cr_assert_eq(m->n_nodes, 4);
	cr_assert_eq(m->nodes[3].port, 7009);
	cr_assert_eq(m->nodes[2].port, 7000);
	cr_assert_eq(kvr_rc_map_covered(m), 6001);
	cr_assert_eq(m->owner[0], 3);
	cr_assert_eq(m->owner[5000], 3);
	cr_assert_eq(m->owner[5001], 2);
	cr_assert_eq(m->owner[6000], 2);
	cr_assert_eq(m->owner[6001], KVR_RC_NONE);
	r_free(r);
}

Test(rcluster, from_slots_default_host)
{
	struct kvr_rc_map *m = &map_a;
	/* Redis 7: "" (and nil, the unknown endpoint) is the node that was asked */
	redisReply *r = r_arr(2, r_arr(3, r_int(0), r_int(8191), r_node("", 7000, "a")),
			      r_arr(3, r_int(8192), r_int(16383),
				    r_arr(3, r_nil(), r_int(7001), r_str("b"))));
	kvr_rc_map_init(m);
	cr_assert_eq(kvr_rc_map_from_slots(m, r, "10.0.0.5"), 0);
	cr_assert_eq(m->n_nodes, 2);
	cr_assert_str_eq(m->nodes[0].host, "10.0.0.5");
	cr_assert_eq(m->nodes[0].port, 7000);
	cr_assert_str_eq(m->nodes[1].host, "10.0.0.5");
	cr_assert_eq(m->nodes[1].port, 7001);
	cr_assert_eq(kvr_rc_map_covered(m), KVR_RC_SLOTS);

	/* without a usable default_host the reply cannot be routed */
	memcpy(&map_b, m, sizeof(*m));
	cr_assert_eq(kvr_rc_map_from_slots(m, r, NULL), -EBADMSG);
	cr_assert_eq(kvr_rc_map_from_slots(m, r, ""), -EBADMSG);
	cr_assert_eq(kvr_rc_map_from_slots(m, r, "bad host"), -EBADMSG);
	cr_assert_eq(kvr_rc_map_from_slots(m, r, H64), -EBADMSG);
	cr_assert_eq(memcmp(m, &map_b, sizeof(*m)), 0);
	r_free(r);

	/* default_host may be a listed node's own host (the node the reply came from) */
	kvr_rc_map_init(m);
	cr_assert_eq(kvr_rc_map_node(m, "10.0.0.7", 7000), 0);
	r = r_arr(2, r_arr(3, r_int(0), r_int(99), r_node("", 7000, "a")),
		  r_arr(3, r_int(100), r_int(199), r_node("", 7001, "b")));
	cr_assert_eq(kvr_rc_map_from_slots(m, r, m->nodes[0].host), 0);
	cr_assert_eq(m->n_nodes, 2);
	cr_assert_str_eq(m->nodes[0].host, "10.0.0.7");
	cr_assert_str_eq(m->nodes[1].host, "10.0.0.7");
	cr_assert_eq(m->nodes[1].port, 7001);
	cr_assert_eq(m->owner[99], 0);
	cr_assert_eq(m->owner[100], 1);
	cr_assert_eq(kvr_rc_map_covered(m), 200);
	r_free(r);
}

/* One defect applied to good_slots(); each must be refused with the map unchanged. */
enum defect {
	D_TOP_STRING, D_TOP_NIL, D_TOP_ERROR, D_RANGE_INT, D_RANGE_SHORT, D_START_STRING, D_END_NIL,
	D_START_GT_END, D_END_16384, D_START_NEG, D_OVERLAP, D_SAME_RANGE_TWICE, D_RANGE_NESTED, D_NODE_STRING, D_NODE_ONE,
	D_IP_INT, D_IP_ARRAY, D_PORT_STRING, D_PORT_0, D_PORT_65536, D_PORT_NEG, D_ID_INT, D_ID_NIL,
	D_IP_QUESTION, D_IP_SPACE, D_IP_64, D_IP_NUL, D_IP_EMPTY_NO_DEFAULT, D_REPLICA_PORT_0,
	D_REPLICA_NOT_ARRAY, D_REPLICA_IP_INT, D_ELEMENT_NULL, D_MAX
};

static redisReply *bad_slots(enum defect d)
{
	redisReply *r = good_slots();
	redisReply *r1 = r->element[1], *m1 = r1->element[2], *rep = r1->element[3];
	switch (d) {
	case D_TOP_STRING: r_free(r); return r_str("0 16383 127.0.0.1 7000");
	case D_TOP_NIL: r_free(r); return r_nil();
	case D_TOP_ERROR: r_free(r); return r_strn("ERR This instance has cluster support disabled", 46, REDIS_REPLY_ERROR);
	case D_RANGE_INT: r_put(r, 1, r_int(5461)); break;
	case D_RANGE_SHORT: r_put(r, 1, r_arr(2, r_int(5461), r_int(10922))); break;
	case D_START_STRING: r_put(r1, 0, r_str("5461")); break;
	case D_END_NIL: r_put(r1, 1, r_nil()); break;
	case D_START_GT_END: r_put(r1, 0, r_int(10923)); break;
	case D_END_16384: r_put(r->element[2], 1, r_int(16384)); break;
	case D_START_NEG: r_put(r->element[0], 0, r_int(-1)); break;
	case D_OVERLAP: r_put(r1, 0, r_int(5460)); break;
	case D_SAME_RANGE_TWICE:
		r_put(r, 2, r_arr(4, r_int(5461), r_int(10922), r_node("127.0.0.1", 7001, "id1"),
				  r_node("127.0.0.1", 7005, "id5")));
		break;
	case D_RANGE_NESTED: r_put(r, 2, good_slots()); break; /* a whole reply where a range belongs */
	case D_NODE_STRING: r_put(r1, 2, r_str("127.0.0.1:7001")); break;
	case D_NODE_ONE: r_put(r1, 2, r_arr(1, r_str("127.0.0.1"))); break;
	case D_IP_INT: r_put(m1, 0, r_int(2130706433)); break;
	case D_IP_ARRAY: r_put(m1, 0, r_arr(0)); break;
	case D_PORT_STRING: r_put(m1, 1, r_str("7001")); break;
	case D_PORT_0: r_put(m1, 1, r_int(0)); break;
	case D_PORT_65536: r_put(m1, 1, r_int(65536)); break;
	case D_PORT_NEG: r_put(m1, 1, r_int(-7001)); break;
	case D_ID_INT: r_put(m1, 2, r_int(1)); break;
	case D_ID_NIL: r_put(m1, 2, r_nil()); break;
	case D_IP_QUESTION: r_put(m1, 0, r_str("?")); break;
	case D_IP_SPACE: r_put(m1, 0, r_str("127.0.0.1 ")); break;
	case D_IP_64: r_put(m1, 0, r_str(H64)); break;
	case D_IP_NUL: r_put(m1, 0, r_strn("127.0.0.1\0x", 11, REDIS_REPLY_STRING)); break;
	case D_IP_EMPTY_NO_DEFAULT: r_put(m1, 0, r_str("")); break;
	case D_REPLICA_PORT_0: r_put(rep, 1, r_int(0)); break;
	case D_REPLICA_NOT_ARRAY: r_put(r1, 3, r_int(7005)); break;
	case D_REPLICA_IP_INT: r_put(rep, 0, r_int(1)); break;
	case D_ELEMENT_NULL: r_put(r1, 3, NULL); break;
	case D_MAX: break;
	}
	return r;
}

Test(rcluster, from_slots_malformed)
{
	struct kvr_rc_map *m = &map_a;
	/* a map in a known, non-trivial state: another cluster's layout */
	kvr_rc_map_init(m);
	cr_assert_eq(kvr_rc_map_set(m, 1, "10.0.0.1", 6000), 0);
	cr_assert_eq(kvr_rc_map_set(m, 9000, "10.0.0.2", 6000), 1);
	memcpy(&map_b, m, sizeof(*m));
	for (int d = 0; d < D_MAX; d++) {
		redisReply *r = bad_slots((enum defect)d);
		cr_assert_eq(kvr_rc_map_from_slots(m, r, NULL), -EBADMSG, "defect %d", d);
		cr_assert_eq(memcmp(m, &map_b, sizeof(*m)), 0, "defect %d changed the map", d);
		r_free(r);
	}
	/* the good reply is accepted by the same map (the defects, not the map, were refused) */
	redisReply *r = good_slots();
	cr_assert_eq(kvr_rc_map_from_slots(m, r, NULL), 0);
	cr_assert_eq(m->n_nodes, 5);
	cr_assert_eq(m->owner[0], 2);
	cr_assert_eq(kvr_rc_map_covered(m), KVR_RC_SLOTS);
	cr_assert_eq(kvr_rc_map_from_slots(NULL, r, NULL), -EINVAL);
	cr_assert_eq(kvr_rc_map_from_slots(m, NULL, NULL), -EINVAL);
	r_free(r);
}

Test(rcluster, from_slots_full)
{
	struct kvr_rc_map *m = &map_a;
	redisReply *r = good_slots();
	kvr_rc_map_init(m);
	for (unsigned p = 0; p < KVR_RC_MAX_NODES - 2; p++)
		cr_assert_eq(kvr_rc_map_node(m, "10.0.0.1", (uint16_t)(8000 + p)), (int)p);
	memcpy(&map_b, m, sizeof(*m));
	cr_assert_eq(kvr_rc_map_from_slots(m, r, NULL), -ENOSPC, "3 new masters beside 62 listed");
	cr_assert_eq(memcmp(m, &map_b, sizeof(*m)), 0);

	/* 61 others and one of the masters listed: the 2 new masters fit exactly */
	kvr_rc_map_init(m);
	for (unsigned p = 0; p < KVR_RC_MAX_NODES - 3; p++)
		cr_assert_eq(kvr_rc_map_node(m, "10.0.0.1", (uint16_t)(8000 + p)), (int)p);
	cr_assert_eq(kvr_rc_map_node(m, "127.0.0.1", 7001), KVR_RC_MAX_NODES - 3);
	cr_assert_eq(kvr_rc_map_from_slots(m, r, NULL), 0);
	cr_assert_eq(m->n_nodes, KVR_RC_MAX_NODES);
	cr_assert_eq(m->owner[0], KVR_RC_MAX_NODES - 2);      /* 7000, first new */
	cr_assert_eq(m->owner[6000], KVR_RC_MAX_NODES - 3);   /* 7001, listed before */
	cr_assert_eq(m->owner[16383], KVR_RC_MAX_NODES - 1);  /* 7002, second new */
	cr_assert_eq(m->nodes[KVR_RC_MAX_NODES - 1].port, 7002);
	cr_assert_eq(kvr_rc_map_covered(m), KVR_RC_SLOTS);
	r_free(r);
}

/* ---- redirects -------------------------------------------------------------------------- */

Test(rcluster, redirect_good)
{
	static const struct {
		const char *s;
		bool ask;
		unsigned slot;
		const char *host;
		uint16_t port;
	} good[] = {
		{"MOVED 3999 127.0.0.1:6381", false, 3999, "127.0.0.1", 6381},
		{"ASK 3999 127.0.0.1:6381", true, 3999, "127.0.0.1", 6381},
		{"MOVED 3999 :6381", false, 3999, "", 6381},
		{"ASK 12 :7000", true, 12, "", 7000},
		{"MOVED 0 h:1", false, 0, "h", 1},
		{"MOVED 16383 redis-1.local:65535", false, 16383, "redis-1.local", 65535},
		{"MOVED 1 ::1:7000", false, 1, "::1", 7000},
		{"ASK 2 [::1]:7000", true, 2, "::1", 7000},
		{"MOVED 7 fe80::1:2:7001", false, 7, "fe80::1:2", 7001},
	};
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		bool ask = !good[i].ask;
		unsigned slot = 99999;
		struct kvr_rc_node n;
		memset(&n, 0x5a, sizeof(n));
		cr_assert_eq(kvr_rc_parse_redirect(good[i].s, strlen(good[i].s), &ask, &slot, &n), 0, "%s", good[i].s);
		cr_assert_eq(ask, good[i].ask, "%s", good[i].s);
		cr_assert_eq(slot, good[i].slot, "%s", good[i].s);
		cr_assert_str_eq(n.host, good[i].host, "%s", good[i].s);
		cr_assert_eq(n.port, good[i].port, "%s", good[i].s);
	}
	/* len, not a NUL, ends the error */
	bool ask;
	unsigned slot;
	struct kvr_rc_node n;
	const char *s = "MOVED 42 h:7000xyz";
	cr_assert_eq(kvr_rc_parse_redirect(s, strlen(s) - 3, &ask, &slot, &n), 0);
	cr_assert_eq(n.port, 7000);
	cr_assert_eq(slot, 42);
}

Test(rcluster, redirect_bad)
{
	static const struct {
		const char *s;
		int rc;
	} bad[] = {
		{"", -ENOENT},
		{"ERR unknown command 'FOO'", -ENOENT},
		{"MOVEDX 1 h:1", -ENOENT},
		{"moved 1 h:1", -ENOENT},
		{"ASKING", -ENOENT},
		{"CLUSTERDOWN Hash slot not served", -ENOENT},
		{"TRYAGAIN Multiple keys request during rehashing of slot", -ENOENT},
		{" MOVED 1 h:1", -ENOENT},
		{"MOVED", -EBADMSG},
		{"ASK", -EBADMSG},
		{"MOVED ", -EBADMSG},
		{"MOVED 3999", -EBADMSG},
		{"MOVED 3999 ", -EBADMSG},
		{"MOVED 16384 h:1", -EBADMSG},
		{"MOVED 99999 h:1", -EBADMSG},
		{"MOVED 123456 h:1", -EBADMSG},
		{"MOVED -1 h:1", -EBADMSG},
		{"MOVED x h:1", -EBADMSG},
		{"MOVED  3999 h:1", -EBADMSG},
		{"MOVED 3999  h:1", -EBADMSG},
		{"MOVED 3999 h", -EBADMSG},
		{"MOVED 3999 h:", -EBADMSG},
		{"MOVED 3999 h:0", -EBADMSG},
		{"MOVED 3999 h:70000", -EBADMSG},
		{"MOVED 3999 h:1 extra", -EBADMSG},
		{"MOVED 3999 h:1\r\n", -EBADMSG},
		{"MOVED 3999 ?:1", -EBADMSG},
		{"MOVED 3999 h h:1", -EBADMSG},
		{"ASK 3999 []:1", -EBADMSG},
		{"ASK 3999 h:1@17000", -EBADMSG},
		{"MOVED 3999 " H64 ":1", -EBADMSG},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		bool ask = true;
		unsigned slot = 77;
		struct kvr_rc_node n, before;
		memset(&n, 0x5a, sizeof(n));
		before = n;
		cr_assert_eq(kvr_rc_parse_redirect(bad[i].s, strlen(bad[i].s), &ask, &slot, &n), bad[i].rc, "'%s'",
			     bad[i].s);
		cr_assert(ask && slot == 77 && memcmp(&n, &before, sizeof(n)) == 0, "'%s' touched an output", bad[i].s);
	}
	bool ask;
	unsigned slot;
	struct kvr_rc_node n;
	cr_assert_eq(kvr_rc_parse_redirect(NULL, 0, &ask, &slot, &n), -EINVAL);
	cr_assert_eq(kvr_rc_parse_redirect("MOVED 1 h:1", 11, NULL, &slot, &n), -EINVAL);
	cr_assert_eq(kvr_rc_parse_redirect("MOVED 1 h:1", 11, &ask, NULL, &n), -EINVAL);
	cr_assert_eq(kvr_rc_parse_redirect("MOVED 1 h:1", 11, &ask, &slot, NULL), -EINVAL);
}

/* ---- rvalue: key names ------------------------------------------------------------------ */

static const struct kvr_l2_ident ID = {
	.ns = {0x0123456789abcdefull, 0xfedcba9876543210ull},
	.fingerprint = {0xf1f2f3f4f5f6f7f8ull, 0xe1e2e3e4e5e6e7e8ull},
	.block_tokens = 16,
	.lane_bytes = 256,
};
static const kvr_key KEY = {0x1111222233334444ull, 0xaaaabbbbccccddddull};
#define LANE 3u
#define VLEN (KVR_RV_HDR_BYTES + 256u)

Test(rvalue, key_fmt)
{
	char buf[KVR_RV_KEY_MAX];
	const char *want = "kvr:fedcba98765432100123456789abcdef:{aaaabbbbccccdddd1111222233334444}:3";
	size_t n = kvr_rv_key_fmt(buf, sizeof(buf), ID.ns, KEY, LANE);
	cr_assert_eq(n, strlen(want));
	cr_assert_str_eq(buf, want);

	kvr_key zero = {0, 0}, k = {0x0123456789abcdefull, 0xfedcba9876543210ull};
	n = kvr_rv_key_fmt(buf, sizeof(buf), zero, k, 7);
	cr_assert_str_eq(buf, "kvr:00000000000000000000000000000000:{fedcba98765432100123456789abcdef}:7");
	cr_assert_eq(kvr_rc_key_slot(buf, n), 2662, "the slot redis-server gives this name");

	/* the longest name fits KVR_RV_KEY_MAX */
	kvr_key ff = {UINT64_MAX, UINT64_MAX};
	n = kvr_rv_key_fmt(buf, sizeof(buf), ff, ff, UINT32_MAX);
	cr_assert_eq(n, 82);
	cr_assert_str_eq(buf, "kvr:ffffffffffffffffffffffffffffffff:{ffffffffffffffffffffffffffffffff}:4294967295");

	/* cap: the name and its NUL, or 0 and buf untouched */
	char small[80];
	memset(small, 'Z', sizeof(small));
	cr_assert_eq(kvr_rv_key_fmt(small, 73, zero, k, 7), 0);
	for (size_t i = 0; i < sizeof(small); i++)
		cr_assert_eq(small[i], 'Z');
	cr_assert_eq(kvr_rv_key_fmt(small, 74, zero, k, 7), 73);
	cr_assert_eq(small[73], 0);
	cr_assert_eq(small[74], 'Z');
	cr_assert_eq(kvr_rv_key_fmt(NULL, 96, zero, k, 7), 0);
	cr_assert_eq(kvr_rv_key_fmt(small, 0, zero, k, 7), 0);
}

Test(rvalue, lanes_of_a_block_share_a_slot)
{
	char buf[KVR_RV_KEY_MAX], hex[KVR_KEY_FMT_LEN];
	uint64_t x = 12345;
	for (int i = 0; i < 1000; i++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		kvr_key k = {x, x ^ 0x5555555555555555ull};
		unsigned want = kvr_rc_key_slot(kvr_key_fmt(k, hex), 32);
		for (unsigned lane = 0; lane < 8; lane++) {
			size_t n = kvr_rv_key_fmt(buf, sizeof(buf), ID.ns, k, lane * 1000);
			cr_assert_eq(kvr_rc_key_slot(buf, n), want, "%s", buf);
		}
	}
}

/* ---- rvalue: the value ------------------------------------------------------------------ */

/* value[0..VLEN) = header || a patterned payload of ID.lane_bytes; returns value. */
static uint8_t *make_value(uint8_t *value, const struct kvr_l2_ident *id, kvr_key key, unsigned lane)
{
	uint8_t *payload = value + KVR_RV_HDR_BYTES;
	for (uint64_t i = 0; i < id->lane_bytes; i++)
		payload[i] = (uint8_t)(i * 131 + 7);
	struct kvr_rv_hdr h;
	kvr_rv_hdr_build(&h, id, key, lane, payload);
	memcpy(value, &h, sizeof(h));
	return value;
}

/* kvr_rv_check's verdict; every call also checks that the two steps the remote actor uses
 * on a streamed value (kvr_rv_check_hdr on the first 128 bytes, kvr_rv_check_payload once
 * the rest is in) come to the same one. */
static int check(const void *v, size_t len, unsigned *reason)
{
	*reason = 0xdead;
	int rc = kvr_rv_check(v, len, &ID, KEY, LANE, reason);
	unsigned r2 = 0xbeef;
	int rc2 = kvr_rv_check_hdr(v, len, &ID, KEY, LANE, &r2);
	if (rc2 == 0 && kvr_rv_check_payload(v, (const uint8_t *)v + KVR_RV_HDR_BYTES)) {
		rc2 = -EBADMSG;
		r2 = KVR_RV_R_PAYLOAD_CSUM;
	}
	cr_assert_eq(rc2, rc, "two steps: %d, one: %d", rc2, rc);
	cr_assert_eq(r2, *reason, "two steps: %s, one: %s", kvr_rv_reason_name(r2), kvr_rv_reason_name(*reason));
	return rc;
}

/* Edit the header of value and recompute its checksum (a writer that really wrote it). */
static void reseal(uint8_t *value)
{
	struct kvr_rv_hdr h;
	memcpy(&h, value, sizeof(h));
	h.hdr_xxh3 = XXH3_64bits(&h, offsetof(struct kvr_rv_hdr, hdr_xxh3));
	memcpy(value, &h, sizeof(h));
}

Test(rvalue, layout_and_round_trip)
{
	uint8_t v[VLEN];
	unsigned reason;
	cr_assert_eq(sizeof(struct kvr_rv_hdr), 128);
	uint64_t t0 = kvr_realtime_ns();
	make_value(v, &ID, KEY, LANE);
	uint64_t t1 = kvr_realtime_ns();

	cr_assert_eq(memcmp(v, "KVRREMV1", 8), 0);
	struct kvr_rv_hdr h;
	memcpy(&h, v, sizeof(h));
	cr_assert_eq(h.version, 1);
	cr_assert_eq(h.hdr_bytes, 128);
	cr_assert(kvr_key_eq(h.ns, ID.ns) && kvr_key_eq(h.key, KEY) && kvr_key_eq(h.fingerprint, ID.fingerprint));
	cr_assert_eq(h.lane, LANE);
	cr_assert_eq(h.block_tokens, 16);
	cr_assert_eq(h.payload_bytes, 256);
	cr_assert_eq(h.payload_xxh3, XXH3_64bits(v + 128, 256));
	cr_assert(h.created_ns >= t0 && h.created_ns <= t1);
	for (size_t i = 0; i < sizeof(h.reserved); i++)
		cr_assert_eq(h.reserved[i], 0);
	cr_assert_eq(h.hdr_xxh3, XXH3_64bits(v, 120));
	/* little-endian bytes at the documented offsets */
	cr_assert_eq(v[8], 1);
	cr_assert_eq(v[12], 128);
	cr_assert_eq(v[64], LANE);
	cr_assert_eq(v[68], 16);
	cr_assert_eq(v[72], 0);
	cr_assert_eq(v[73], 1);
	cr_assert_eq(v[16], 0xef);
	cr_assert_eq(v[31], 0xfe);

	cr_assert_eq(check(v, VLEN, &reason), 0);
	cr_assert_eq(reason, KVR_RV_OK);
	cr_assert_eq(kvr_rv_check(v, VLEN, &ID, KEY, LANE, NULL), 0, "ret_reason may be NULL");

	/* unaligned, as a reply buffer may be */
	static uint8_t shifted[VLEN + 1];
	memcpy(shifted + 1, v, VLEN);
	cr_assert_eq(check(shifted + 1, VLEN, &reason), 0);

	/* a 2 MiB lane */
	struct kvr_l2_ident big = ID;
	big.lane_bytes = 2u << 20;
	uint8_t *bv = malloc(KVR_RV_HDR_BYTES + big.lane_bytes);
	cr_assert(bv);
	make_value(bv, &big, KEY, 0);
	cr_assert_eq(kvr_rv_check(bv, KVR_RV_HDR_BYTES + big.lane_bytes, &big, KEY, 0, &reason), 0);
	bv[KVR_RV_HDR_BYTES + (1u << 20)] ^= 0x10;
	cr_assert_eq(kvr_rv_check(bv, KVR_RV_HDR_BYTES + big.lane_bytes, &big, KEY, 0, &reason), -EBADMSG);
	cr_assert_eq(reason, KVR_RV_R_PAYLOAD_CSUM);
	free(bv);
}

Test(rvalue, every_byte_flip_is_refused)
{
	uint8_t good[VLEN], v[VLEN];
	static const uint8_t masks[] = {0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0xff, 0x5a};
	unsigned reason, n = 0;
	make_value(good, &ID, KEY, LANE);
	for (size_t off = 0; off < VLEN; off++) {
		for (size_t mi = 0; mi < sizeof(masks); mi++) {
			memcpy(v, good, VLEN);
			v[off] ^= masks[mi];
			unsigned want = off < 8 ? KVR_RV_R_MAGIC : off < 128 ? KVR_RV_R_HDR_CSUM : KVR_RV_R_PAYLOAD_CSUM;
			cr_assert_eq(check(v, VLEN, &reason), -EBADMSG, "byte %zu ^ 0x%02x accepted", off, masks[mi]);
			cr_assert_eq(reason, want, "byte %zu ^ 0x%02x: %s, not %s", off, masks[mi],
				     kvr_rv_reason_name(reason), kvr_rv_reason_name(want));
			n++;
		}
	}
	cr_assert_eq(n, VLEN * sizeof(masks));
	/* the negative control: the untouched copy still passes */
	cr_assert_eq(check(good, VLEN, &reason), 0);
}

Test(rvalue, truncations_and_extra_bytes)
{
	uint8_t v[VLEN + 16];
	unsigned reason;
	make_value(v, &ID, KEY, LANE);
	for (size_t len = 0; len < VLEN; len++) {
		cr_assert_eq(check(v, len, &reason), -EBADMSG, "length %zu", len);
		cr_assert_eq(reason, KVR_RV_R_SHORT, "length %zu: %s", len, kvr_rv_reason_name(reason));
	}
	cr_assert_eq(check(NULL, 0, &reason), -EBADMSG);
	cr_assert_eq(reason, KVR_RV_R_SHORT);
	for (size_t extra = 1; extra <= 16; extra++) {
		cr_assert_eq(check(v, VLEN + extra, &reason), -EBADMSG);
		cr_assert_eq(reason, KVR_RV_R_LENGTH, "%zu extra bytes: %s", extra, kvr_rv_reason_name(reason));
	}
}

Test(rvalue, forged_headers)
{
	uint8_t good[VLEN], v[VLEN];
	unsigned reason;
	struct kvr_rv_hdr h;
	make_value(good, &ID, KEY, LANE);

	/* payload_bytes other than lane_bytes under a good header checksum */
	static const uint64_t lens[] = {0, 1, 255, 257, 4096, UINT64_MAX};
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		memcpy(v, good, VLEN);
		memcpy(&h, v, sizeof(h));
		h.payload_bytes = lens[i];
		memcpy(v, &h, sizeof(h));
		reseal(v);
		cr_assert_eq(check(v, VLEN, &reason), -EBADMSG);
		cr_assert_eq(reason, KVR_RV_R_LENGTH, "payload_bytes %llu: %s", (unsigned long long)lens[i],
			     kvr_rv_reason_name(reason));
	}
	/* a value of another lane length is LENGTH, whole or cut to ours */
	struct kvr_l2_ident other = ID;
	other.lane_bytes = 300;
	uint8_t ov[KVR_RV_HDR_BYTES + 300];
	make_value(ov, &other, KEY, LANE);
	cr_assert_eq(check(ov, sizeof(ov), &reason), -EBADMSG);
	cr_assert_eq(reason, KVR_RV_R_LENGTH);
	cr_assert_eq(check(ov, VLEN, &reason), -EBADMSG);
	cr_assert_eq(reason, KVR_RV_R_LENGTH);

	/* version, hdr_bytes, reserved bytes: a layout this build does not know */
	static const size_t version_offs[] = {8, 12, 96, 100, 119};
	for (size_t i = 0; i < sizeof(version_offs) / sizeof(version_offs[0]); i++) {
		memcpy(v, good, VLEN);
		v[version_offs[i]] ^= 0x02;
		reseal(v);
		cr_assert_eq(check(v, VLEN, &reason), -EBADMSG);
		cr_assert_eq(reason, KVR_RV_R_VERSION, "offset %zu: %s", version_offs[i], kvr_rv_reason_name(reason));
	}
	/* created_ns is informational: a resealed change is still ours */
	memcpy(v, good, VLEN);
	v[90] ^= 0x40;
	reseal(v);
	cr_assert_eq(check(v, VLEN, &reason), 0);

	/* a magic change is MAGIC even resealed; the checksum is checked before the ns */
	memcpy(v, good, VLEN);
	v[0] ^= 0x20;
	reseal(v);
	cr_assert_eq(check(v, VLEN, &reason), -EBADMSG);
	cr_assert_eq(reason, KVR_RV_R_MAGIC);
	memcpy(v, good, VLEN);
	v[16] ^= 1; /* ns, not resealed */
	cr_assert_eq(check(v, VLEN, &reason), -EBADMSG);
	cr_assert_eq(reason, KVR_RV_R_HDR_CSUM);
	reseal(v);
	cr_assert_eq(check(v, VLEN, &reason), -EBADMSG);
	cr_assert_eq(reason, KVR_RV_R_NS);
}

Test(rvalue, other_identity)
{
	uint8_t v[VLEN];
	unsigned reason;
	make_value(v, &ID, KEY, LANE);

	struct kvr_l2_ident id = ID;
	id.ns.hi ^= 1;
	cr_assert_eq(kvr_rv_check(v, VLEN, &id, KEY, LANE, &reason), -EBADMSG);
	cr_assert_eq(reason, KVR_RV_R_NS);
	id = ID;
	id.fingerprint.lo ^= 1ull << 40;
	cr_assert_eq(kvr_rv_check(v, VLEN, &id, KEY, LANE, &reason), -EBADMSG);
	cr_assert_eq(reason, KVR_RV_R_NS);
	id = ID;
	id.block_tokens = 32;
	cr_assert_eq(kvr_rv_check(v, VLEN, &id, KEY, LANE, &reason), -EBADMSG);
	cr_assert_eq(reason, KVR_RV_R_NS);
	id = ID;
	id.lane_bytes = 512;
	cr_assert_eq(kvr_rv_check(v, VLEN, &id, KEY, LANE, &reason), -EBADMSG);
	cr_assert_eq(reason, KVR_RV_R_LENGTH);
	id = ID;
	id.reserved = 7; /* not part of the identity stored */
	cr_assert_eq(kvr_rv_check(v, VLEN, &id, KEY, LANE, &reason), 0);

	kvr_key k = KEY;
	k.lo ^= 1;
	cr_assert_eq(kvr_rv_check(v, VLEN, &ID, k, LANE, &reason), -EBADMSG);
	cr_assert_eq(reason, KVR_RV_R_KEY);
	k = KEY;
	k.hi ^= 1ull << 63;
	cr_assert_eq(kvr_rv_check(v, VLEN, &ID, k, LANE, &reason), -EBADMSG);
	cr_assert_eq(reason, KVR_RV_R_KEY);
	cr_assert_eq(kvr_rv_check(v, VLEN, &ID, KEY, LANE + 1, &reason), -EBADMSG);
	cr_assert_eq(reason, KVR_RV_R_KEY);
	cr_assert_eq(kvr_rv_check(v, VLEN, &ID, KEY, LANE + 65536, &reason), -EBADMSG);
	cr_assert_eq(reason, KVR_RV_R_KEY);

	/* invalid arguments leave the reason alone */
	reason = 0xbeef;
	cr_assert_eq(kvr_rv_check(NULL, VLEN, &ID, KEY, LANE, &reason), -EINVAL);
	cr_assert_eq(kvr_rv_check(v, VLEN, NULL, KEY, LANE, &reason), -EINVAL);
	cr_assert_eq(reason, 0xbeef);
}

Test(rvalue, reason_names)
{
	static const char *const want[KVR_RV_R_MAX] = {"ok", "short", "magic", "version", "header_checksum",
						       "namespace", "key", "length", "payload_checksum"};
	for (unsigned r = 0; r < KVR_RV_R_MAX; r++)
		cr_assert_str_eq(kvr_rv_reason_name(r), want[r]);
	cr_assert_str_eq(kvr_rv_reason_name(KVR_RV_R_MAX), "unknown");
	cr_assert_str_eq(kvr_rv_reason_name(1000), "unknown");
}
