/* rcluster: Redis Cluster routing without sockets (CRC16 key slots, node addresses, the slot map, MOVED/ASK). */
#ifndef KVR_RCLUSTER_H
#define KVR_RCLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

/*
 * Everything here is pure: it parses what a cluster node said and answers "which node owns
 * this key"; the remote actor does the I/O. Nothing allocates, nothing logs.
 *
 * Host strings (every struct kvr_rc_node, every parser below) are 1..63 bytes of
 * [A-Za-z0-9._-] (an IPv4 address or a hostname) or an IPv6 address of [0-9A-Fa-f:.],
 * always without brackets. Anything else ("?", spaces, '@', NUL bytes) is refused.
 */

#define KVR_RC_SLOTS 16384u
#define KVR_RC_MAX_NODES 64u
#define KVR_RC_NONE 0xffffu   /* owner[] of an unassigned slot */
#define KVR_RC_HOST_MAX 64u   /* sizeof(kvr_rc_node.host): 63 bytes + NUL */

/* CRC16-CCITT (XMODEM: poly 0x1021, init 0, no reflection, no final xor), the Redis Cluster
 * key hash. "123456789" -> 0x31c3. buf may be NULL when len is 0. */
uint16_t kvr_rc_crc16(const void *buf, size_t len);

/* The hash slot (0..16383) of key[0..len), with the hash-tag rule: when the key has a '{'
 * and a '}' somewhere after it, and at least one byte lies between the first '{' and the
 * first '}' after it, only those bytes are hashed; otherwise the whole key is
 * ("foo{}{bar}" hashes all of it, "foo{{bar}}zap" hashes "{bar", "foo{bar}{zap}" hashes
 * "bar"). Binary-safe: key need not be NUL-terminated. */
unsigned kvr_rc_key_slot(const char *key, size_t len);

/* One node's address: host (NUL-terminated, see above) and port (1..65535). */
struct kvr_rc_node {
	char host[KVR_RC_HOST_MAX];
	uint16_t port;
};

/* Parse "host:port" or "[v6]:port" (host stored without the brackets). The port is 1..5
 * decimal digits, 1..65535; nothing may follow it. An unbracketed host with a ':' in it is
 * refused (ambiguous). Returns 0, or -EINVAL (s or ret NULL, empty or too long or bad
 * host, no port, port 0 or > 65535, junk); *ret untouched on failure. */
int kvr_rc_node_parse(const char *s, struct kvr_rc_node *ret);

/*
 * The slot map: which master owns each slot. Masters are kept in nodes[0..n_nodes) in
 * the order first seen and keep their index for the life of the map (a refresh from
 * CLUSTER SLOTS or a MOVED never renumbers them), so the caller may index its
 * connections by node index. A node that no longer owns a slot stays listed; when the
 * list is full (-ENOSPC), kvr_rc_map_init() and a fresh CLUSTER SLOTS start over.
 * Size-then-init: the caller owns the memory (about 37 KiB).
 */
struct kvr_rc_map {
	uint16_t owner[KVR_RC_SLOTS]; /* node index, KVR_RC_NONE when unassigned */
	unsigned n_nodes;
	struct kvr_rc_node nodes[KVR_RC_MAX_NODES];
};

/* Every slot unassigned, no nodes. */
void kvr_rc_map_init(struct kvr_rc_map *m);

/* The index of node host:port in m, added when new (exact, case-sensitive host match).
 * Returns the index (>= 0), -EINVAL (m or host NULL, bad host, port 0) or -ENOSPC (a new
 * node and KVR_RC_MAX_NODES listed already; m untouched). */
int kvr_rc_map_node(struct kvr_rc_map *m, const char *host, uint16_t port);

/* Replace the slot assignment of m with a CLUSTER SLOTS reply (RESP2, as hiredis 0.14
 * parses it):
 *
 *   array of ranges, each: [start (integer), end (integer), master, replica...]
 *   each node:             [ip (string or nil), port (integer), id (string), extra...]
 *
 * Only the master (the first node of a range) owns the range; replicas are validated but
 * not listed. An empty or nil ip means "the node you asked" (Redis 7) and becomes
 * default_host (which may point into m->nodes[]: listed nodes are never rewritten, only
 * appended to). Every slot no range names is unassigned afterwards.
 * Strict: the whole reply is checked before m changes. Returns 0, or
 *   -EINVAL   m or r NULL
 *   -EBADMSG  any other shape: not an array, a range with fewer than 3 elements, a
 *             non-integer start or end, start > end, end > 16383, a slot named by two
 *             ranges, a node that is not an array of >= 2, an ip that is neither a string
 *             nor nil or is not a valid host, an empty or nil ip with default_host NULL
 *             or invalid, a port that is not an integer in 1..65535, an id that is not a
 *             string
 *   -ENOSPC   the reply's masters do not fit beside the nodes m lists already
 * and m is untouched on every failure. */
int kvr_rc_map_from_slots(struct kvr_rc_map *m, const redisReply *r, const char *default_host);

/* The number of assigned slots (KVR_RC_SLOTS when the map covers the cluster). */
unsigned kvr_rc_map_covered(const struct kvr_rc_map *m);

/* Give slot to host:port (after a MOVED), adding the node when new. Returns the node
 * index, or -EINVAL (slot >= KVR_RC_SLOTS, or as kvr_rc_map_node) or -ENOSPC; m
 * untouched on failure. */
int kvr_rc_map_set(struct kvr_rc_map *m, unsigned slot, const char *host, uint16_t port);

/* Parse a redirect error, err[0..len) as hiredis gives it (no leading '-', no CRLF):
 *
 *   "MOVED <slot> <endpoint>:<port>"   the slot has moved for good (update the map)
 *   "ASK <slot> <endpoint>:<port>"     ask that node once, after ASKING
 *
 * with single spaces, slot 0..16383 in decimal, port as kvr_rc_node_parse. The endpoint is
 * what Redis writes: a host, an IPv6 address unbracketed ("::1:7000", the port follows the
 * last ':') or bracketed, or empty (Redis 7's unknown endpoint, ":7000": ret_node->host
 * is then "" and the caller substitutes the node it asked).
 * Returns 0 with *ret_ask (true for ASK), *ret_slot, *ret_node; -ENOENT when the first word
 * is neither MOVED nor ASK; -EBADMSG when it is but the rest is malformed; -EINVAL for a
 * NULL argument. Outputs untouched on failure. */
int kvr_rc_parse_redirect(const char *err, size_t len, bool *ret_ask, unsigned *ret_slot,
			  struct kvr_rc_node *ret_node);

#endif
