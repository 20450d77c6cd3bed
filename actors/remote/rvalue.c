/* rvalue: remote key names, value header build and the strict value check (format in rvalue.h). */
#include "rvalue.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kvr_time.h"

static const char *const reason_names[KVR_RV_R_MAX] = {
	[KVR_RV_OK] = "ok",
	[KVR_RV_R_SHORT] = "short",
	[KVR_RV_R_MAGIC] = "magic",
	[KVR_RV_R_VERSION] = "version",
	[KVR_RV_R_HDR_CSUM] = "header_checksum",
	[KVR_RV_R_NS] = "namespace",
	[KVR_RV_R_KEY] = "key",
	[KVR_RV_R_LENGTH] = "length",
	[KVR_RV_R_PAYLOAD_CSUM] = "payload_checksum",
};

const char *kvr_rv_reason_name(unsigned r)
{
	return r < KVR_RV_R_MAX ? reason_names[r] : "unknown";
}

size_t kvr_rv_key_fmt(char *buf, size_t cap, kvr_key ns, kvr_key key, unsigned lane)
{
	char tmp[KVR_RV_KEY_MAX], nh[KVR_KEY_FMT_LEN], kh[KVR_KEY_FMT_LEN];
	int n = snprintf(tmp, sizeof(tmp), "kvr:%s:{%s}:%u", kvr_key_fmt(ns, nh), kvr_key_fmt(key, kh), lane);
	if (!buf || n < 0 || (size_t)n >= cap)
		return 0;
	memcpy(buf, tmp, (size_t)n + 1);
	return (size_t)n;
}

static uint64_t hdr_hash(const struct kvr_rv_hdr *h)
{
	return XXH3_64bits(h, offsetof(struct kvr_rv_hdr, hdr_xxh3));
}

void kvr_rv_hdr_build(struct kvr_rv_hdr *ret, const struct kvr_l2_ident *id, kvr_key key, unsigned lane,
		      const void *payload)
{
	struct kvr_rv_hdr h;
	memset(&h, 0, sizeof(h));
	h.magic = KVR_RV_MAGIC;
	h.version = KVR_RV_VERSION;
	h.hdr_bytes = KVR_RV_HDR_BYTES;
	h.ns = id->ns;
	h.key = key;
	h.fingerprint = id->fingerprint;
	h.lane = lane;
	h.block_tokens = id->block_tokens;
	h.payload_bytes = id->lane_bytes;
	h.payload_xxh3 = kvr_l2_payload_hash(payload, id->lane_bytes); /* the disk tier's: runtime-dispatched XXH3 */
	h.created_ns = kvr_realtime_ns();
	h.hdr_xxh3 = hdr_hash(&h);
	*ret = h;
}

static bool reserved_zero(const struct kvr_rv_hdr *h)
{
	uint8_t acc = 0;
	for (size_t i = 0; i < sizeof(h->reserved); i++)
		acc |= h->reserved[i];
	return acc == 0;
}

/* The header checks of kvr_rv_check, in its order; the payload is not looked at. */
static enum kvr_rv_reason hdr_check(const struct kvr_rv_hdr *h, const struct kvr_l2_ident *id, kvr_key key,
				    unsigned lane)
{
	if (h->magic != KVR_RV_MAGIC)
		return KVR_RV_R_MAGIC;
	if (h->hdr_xxh3 != hdr_hash(h))
		return KVR_RV_R_HDR_CSUM;
	if (h->version != KVR_RV_VERSION || h->hdr_bytes != KVR_RV_HDR_BYTES || !reserved_zero(h))
		return KVR_RV_R_VERSION;
	if (!kvr_key_eq(h->ns, id->ns) || !kvr_key_eq(h->fingerprint, id->fingerprint) || !h->block_tokens ||
	    (id->block_tokens && h->block_tokens != id->block_tokens))
		return KVR_RV_R_NS;
	if (!kvr_key_eq(h->key, key) || h->lane != lane)
		return KVR_RV_R_KEY;
	if (h->payload_bytes != id->lane_bytes)
		return KVR_RV_R_LENGTH;
	return KVR_RV_OK;
}

int kvr_rv_check_hdr(const void *hdr, uint64_t len, const struct kvr_l2_ident *id, kvr_key key, unsigned lane,
		     unsigned *ret_reason)
{
	struct kvr_rv_hdr h;
	enum kvr_rv_reason r;

	if ((!hdr && len) || !id)
		return -EINVAL;
	if (len < sizeof(h)) {
		r = KVR_RV_R_SHORT;
		goto out;
	}
	memcpy(&h, hdr, sizeof(h)); /* hdr may be unaligned (a reply buffer) */
	r = hdr_check(&h, id, key, lane);
	if (r == KVR_RV_OK && len - sizeof(h) < h.payload_bytes)
		r = KVR_RV_R_SHORT;
	else if (r == KVR_RV_OK && len - sizeof(h) > h.payload_bytes)
		r = KVR_RV_R_LENGTH;
out:
	if (ret_reason)
		*ret_reason = r;
	return r == KVR_RV_OK ? 0 : -EBADMSG;
}

int kvr_rv_check_payload(const void *hdr, const void *payload)
{
	struct kvr_rv_hdr h;
	memcpy(&h, hdr, sizeof(h));
	return kvr_l2_payload_hash(payload, h.payload_bytes) == h.payload_xxh3 ? 0 : -EBADMSG;
}

int kvr_rv_check(const void *value, size_t len, const struct kvr_l2_ident *id, kvr_key key, unsigned lane,
		 unsigned *ret_reason)
{
	if ((!value && len) || !id)
		return -EINVAL;
	unsigned r;
	int rc = kvr_rv_check_hdr(value, len, id, key, lane, &r);
	if (rc == 0 && kvr_rv_check_payload(value, (const uint8_t *)value + KVR_RV_HDR_BYTES)) {
		r = KVR_RV_R_PAYLOAD_CSUM;
		rc = -EBADMSG;
	}
	if (ret_reason)
		*ret_reason = r;
	return rc;
}
