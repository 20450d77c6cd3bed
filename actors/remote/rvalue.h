/* rvalue: the Redis key name and value format (128-byte checksummed header + payload) of one block lane. */
#ifndef KVR_RVALUE_H
#define KVR_RVALUE_H

#include <stddef.h>
#include <stdint.h>

#include "kvr_keys.h"
#include "l2file.h" /* struct kvr_l2_ident: the same identity as the disk tier */

/*
 * One Redis string per (namespace, block key, lane):
 *
 *   key    kvr:<ns: 32 hex>:{<key: 32 hex>}:<lane: decimal>
 *   value  struct kvr_rv_hdr (128 bytes) || payload (payload_bytes bytes, no padding)
 *
 * Hex is kvr_key_fmt's (lowercase, hi then lo). The hash tag is the block key, so every
 * lane of one block hashes to one cluster slot (one node, one pipeline).
 *
 * Every integer of the header is little-endian (kvring builds for little-endian hosts
 * only). A value is served only when kvr_rv_check() accepts all of it: another writer's
 * model, a torn or evicted-and-rewritten value or a flipped bit is a miss, never a
 * wrong byte in a slot.
 */

#define KVR_RV_KEY_MAX 96u  /* the longest key name (82 bytes) + NUL fits */
#define KVR_RV_MAGIC 0x31564d455252564bull /* "KVRREMV1" as little-endian bytes */
#define KVR_RV_VERSION 1u
#define KVR_RV_HDR_BYTES 128u

struct kvr_rv_hdr {
	uint64_t magic;          /* KVR_RV_MAGIC */
	uint32_t version;        /* KVR_RV_VERSION */
	uint32_t hdr_bytes;      /* KVR_RV_HDR_BYTES (= the payload offset) */
	kvr_key ns;
	kvr_key key;
	kvr_key fingerprint;
	uint32_t lane;
	uint32_t block_tokens;
	uint64_t payload_bytes;  /* = the ident's lane_bytes */
	uint64_t payload_xxh3;   /* XXH3-64 (seed 0) of the payload */
	uint64_t created_ns;     /* CLOCK_REALTIME at build (informational, never checked) */
	uint8_t reserved[24];    /* 0 */
	uint64_t hdr_xxh3;       /* XXH3-64 (seed 0) of bytes [0, 120): every header byte before it */
};
_Static_assert(sizeof(struct kvr_rv_hdr) == KVR_RV_HDR_BYTES, "the remote value header is 128 bytes");
_Static_assert(offsetof(struct kvr_rv_hdr, version) == 8, "rv header layout");
_Static_assert(offsetof(struct kvr_rv_hdr, hdr_bytes) == 12, "rv header layout");
_Static_assert(offsetof(struct kvr_rv_hdr, ns) == 16, "rv header layout");
_Static_assert(offsetof(struct kvr_rv_hdr, key) == 32, "rv header layout");
_Static_assert(offsetof(struct kvr_rv_hdr, fingerprint) == 48, "rv header layout");
_Static_assert(offsetof(struct kvr_rv_hdr, lane) == 64, "rv header layout");
_Static_assert(offsetof(struct kvr_rv_hdr, block_tokens) == 68, "rv header layout");
_Static_assert(offsetof(struct kvr_rv_hdr, payload_bytes) == 72, "rv header layout");
_Static_assert(offsetof(struct kvr_rv_hdr, payload_xxh3) == 80, "rv header layout");
_Static_assert(offsetof(struct kvr_rv_hdr, created_ns) == 88, "rv header layout");
_Static_assert(offsetof(struct kvr_rv_hdr, reserved) == 96, "rv header layout");
_Static_assert(offsetof(struct kvr_rv_hdr, hdr_xxh3) == 120, "rv header layout");

/* Why a value was refused (KVR_RV_OK = accepted). Named KVR_RV_R_* as the disk tier's
 * KVR_L2_R_*: KVR_RV_MAGIC and KVR_RV_VERSION are the header constants. */
enum kvr_rv_reason {
	KVR_RV_OK = 0,
	KVR_RV_R_SHORT,        /* shorter than the header, or than header + payload_bytes (truncated) */
	KVR_RV_R_MAGIC,        /* not a kvring value (or a flipped magic byte) */
	KVR_RV_R_VERSION,      /* another version or hdr_bytes, or a reserved byte not 0 under a good
				* checksum (a layout this build does not know) */
	KVR_RV_R_HDR_CSUM,     /* header checksum mismatch (a flipped header byte) */
	KVR_RV_R_NS,           /* another namespace, fingerprint or block_tokens: another model or geometry */
	KVR_RV_R_KEY,          /* another block key or lane than the key name asked for */
	KVR_RV_R_LENGTH,       /* payload_bytes != lane_bytes, or bytes after the payload */
	KVR_RV_R_PAYLOAD_CSUM, /* payload checksum mismatch */
	KVR_RV_R_MAX,
};

/* "ok", "short", "magic", "version", "header_checksum", "namespace", "key", "length",
 * "payload_checksum"; "unknown" out of range. */
const char *kvr_rv_reason_name(unsigned r);

/* Write the key name of (ns, key, lane) and its NUL into buf[0..cap). Returns its length
 * (without the NUL), or 0 when buf is NULL or cap is too small (buf then untouched).
 * KVR_RV_KEY_MAX is always enough. */
size_t kvr_rv_key_fmt(char *buf, size_t cap, kvr_key ns, kvr_key key, unsigned lane);

/* Fill *ret, the header of (key, lane) for payload[0..id->lane_bytes): every field of id,
 * both checksums (payload first, header last), created_ns now, reserved bytes 0. The value
 * to store is *ret followed by the payload. */
void kvr_rv_hdr_build(struct kvr_rv_hdr *ret, const struct kvr_l2_ident *id, kvr_key key, unsigned lane,
		      const void *payload);

/* Check value[0..len), as read back from key name (id->ns, key, lane), in this order:
 * length >= 128 (SHORT), magic (MAGIC), header checksum (HDR_CSUM; nothing else in the
 * header is trusted before it), version, hdr_bytes and reserved bytes (VERSION), ns,
 * fingerprint and block_tokens (NS), key and lane (KEY), payload_bytes == id->lane_bytes
 * (LENGTH), len < 128 + payload_bytes (SHORT), len > 128 + payload_bytes (LENGTH), payload
 * checksum (PAYLOAD_CSUM).
 * Returns 0 (*ret_reason KVR_RV_OK) when the value is exactly what kvr_rv_hdr_build and
 * that payload make; -EBADMSG with *ret_reason the first failing check otherwise; -EINVAL
 * when value (with len > 0) or id is NULL (*ret_reason untouched). ret_reason may be NULL.
 * value needs no alignment. */
int kvr_rv_check(const void *value, size_t len, const struct kvr_l2_ident *id, kvr_key key, unsigned lane,
		 unsigned *ret_reason);

/* kvr_rv_check in two steps, for a value that arrives in pieces: the header hdr[0..128)
 * of a value of len bytes in all, every check but the payload checksum (the same reasons,
 * in the same order; len < 128: SHORT, hdr not looked at); then, once the payload is
 * complete, its checksum against the header's (0 or -EBADMSG: PAYLOAD_CSUM). */
int kvr_rv_check_hdr(const void *hdr, uint64_t len, const struct kvr_l2_ident *id, kvr_key key, unsigned lane,
		     unsigned *ret_reason);
int kvr_rv_check_payload(const void *hdr, const void *payload);

#endif
