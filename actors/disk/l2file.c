/* l2file: block file names, header build and validation, checksums (format in l2file.h). */
#include "l2file.h"
#include "kvr_ctl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#ifdef KVR_HAVE_XXH_DISPATCH
/* libxxhash's runtime-dispatched XXH3 (AVX2/AVX-512 where the CPU has them: about twice the
 * inline SSE2 speed on a 2 MiB payload). Same function, same value. Declared here because
 * xxh_x86dispatch.h does not mix with XXH_INLINE_ALL. */
unsigned long long XXH3_64bits_dispatch(const void *input, size_t len);
#define payload_xxh3(p, n) XXH3_64bits_dispatch((p), (n))
#else
#define payload_xxh3(p, n) XXH3_64bits((p), (n))
#endif

#include "kvr_time.h"

/* The names live in kvr_ctl.h (kvringd and inspect name the adoption counters without
 * linking the disk tier): one table, in enum kvr_l2_reason order. */
_Static_assert(KVR_L2_R_MAX == KVR_STAT_DK_REASON_MAX, "one reason name per kvr_l2_reason");

const char *kvr_l2_reason_name(unsigned r)
{
	const char *n = kvr_stat_dk_reason_name(r);
	return n ? n : "unknown";
}

uint64_t kvr_l2_payload_bytes(uint64_t lane_bytes)
{
	if (lane_bytes > UINT64_MAX - (KVR_L2_ALIGN - 1))
		return 0;
	return (lane_bytes + KVR_L2_ALIGN - 1) & ~(uint64_t)(KVR_L2_ALIGN - 1);
}

uint64_t kvr_l2_file_bytes(uint64_t lane_bytes)
{
	uint64_t p = kvr_l2_payload_bytes(lane_bytes);
	if (!p || p > UINT64_MAX - KVR_L2_HDR_BYTES)
		return 0;
	return KVR_L2_HDR_BYTES + p;
}

char *kvr_l2_name_fmt(kvr_key key, uint32_t lane, char *buf)
{
	char hex[KVR_KEY_FMT_LEN];
	snprintf(buf, KVR_L2_NAME_MAX, "%s.%u" KVR_L2_SUFFIX, kvr_key_fmt(key, hex), lane);
	return buf;
}

char *kvr_l2_tmp_name_fmt(kvr_key key, uint32_t lane, pid_t pid, uint64_t seq, char *buf)
{
	char hex[KVR_KEY_FMT_LEN];
	snprintf(buf, KVR_L2_TMP_MAX, "%s.%u" KVR_L2_TMP_MARK "%d.%llu", kvr_key_fmt(key, hex), lane, (int)pid,
		 (unsigned long long)seq);
	return buf;
}

char *kvr_l2_ns_dir_fmt(kvr_key ns, char *buf)
{
	return kvr_key_fmt(ns, buf);
}

/* Parse "<32 lowercase hex>.<lane>" at the start of s; returns the length consumed or -1. */
static int parse_stem(const char *s, kvr_key *ret_key, uint32_t *ret_lane)
{
	for (int i = 0; i < 32; i++) {
		char c = s[i];
		if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
			return -1;
	}
	if (s[32] != '.')
		return -1;
	const char *p = s + 33;
	if (*p < '0' || *p > '9' || (p[0] == '0' && p[1] >= '0' && p[1] <= '9'))
		return -1; /* no digits, or a leading zero */
	uint32_t lane = 0;
	int n = 0;
	while (p[n] >= '0' && p[n] <= '9') {
		if (n == 5)
			return -1;
		lane = lane * 10 + (uint32_t)(p[n] - '0');
		n++;
	}
	if (lane > KVR_L2_MAX_LANE)
		return -1;
	char hex[33];
	memcpy(hex, s, 32);
	hex[32] = 0;
	if (kvr_key_parse(hex, ret_key))
		return -1;
	*ret_lane = lane;
	return 33 + n;
}

int kvr_l2_name_parse(const char *name, kvr_key *ret_key, uint32_t *ret_lane)
{
	kvr_key key;
	uint32_t lane;
	if (!name || !ret_key || !ret_lane || strnlen(name, KVR_L2_NAME_MAX) >= KVR_L2_NAME_MAX)
		return -EINVAL;
	int n = parse_stem(name, &key, &lane);
	if (n < 0 || strcmp(name + n, KVR_L2_SUFFIX) != 0)
		return -EINVAL;
	*ret_key = key;
	*ret_lane = lane;
	return 0;
}

bool kvr_l2_is_tmp_name(const char *name)
{
	kvr_key key;
	uint32_t lane;
	if (!name)
		return false;
	int n = parse_stem(name, &key, &lane);
	return n > 0 && strncmp(name + n, KVR_L2_TMP_MARK, strlen(KVR_L2_TMP_MARK)) == 0;
}

uint64_t kvr_l2_payload_hash(const void *payload, uint64_t lane_bytes)
{
	return payload_xxh3(payload, (size_t)lane_bytes);
}

void kvr_l2_hdr_seal(struct kvr_l2_hdr *h)
{
	h->hdr_xxh3 = XXH3_64bits(h, offsetof(struct kvr_l2_hdr, hdr_xxh3));
}

void kvr_l2_hdr_build(struct kvr_l2_hdr *h, const struct kvr_l2_ident *ident, kvr_key key, uint32_t lane,
		      uint64_t payload_xxh3)
{
	memset(h, 0, sizeof(*h));
	h->magic = KVR_L2_MAGIC;
	h->version = KVR_L2_VERSION;
	h->hdr_bytes = KVR_L2_HDR_BYTES;
	h->ns = ident->ns;
	h->key = key;
	h->fingerprint = ident->fingerprint;
	h->lane = lane;
	h->block_tokens = ident->block_tokens;
	h->lane_bytes = ident->lane_bytes;
	h->payload_xxh3 = payload_xxh3;
	h->created_ns = kvr_realtime_ns();
	h->writer_pid = (uint32_t)getpid();
	kvr_l2_hdr_seal(h);
}

/* Whether every reserved header byte (reserved0, reserved[]) is 0, as kvr_l2_hdr_build writes them. */
static bool reserved_zero(const struct kvr_l2_hdr *h)
{
	const uint8_t *p = (const uint8_t *)h + offsetof(struct kvr_l2_hdr, reserved0);
	const uint8_t *end = (const uint8_t *)h + offsetof(struct kvr_l2_hdr, hdr_xxh3);
	uint64_t w, acc = 0;

	_Static_assert(offsetof(struct kvr_l2_hdr, reserved0) + sizeof(h->reserved0) ==
			       offsetof(struct kvr_l2_hdr, reserved) &&
		       offsetof(struct kvr_l2_hdr, reserved) + sizeof(h->reserved) == offsetof(struct kvr_l2_hdr, hdr_xxh3),
		       "the reserved bytes are one run, up to the checksum");
	for (; p + 8 <= end; p += 8) {
		memcpy(&w, p, 8);
		acc |= w;
	}
	for (; p < end; p++)
		acc |= *p;
	return acc == 0;
}

enum kvr_l2_reason kvr_l2_hdr_check(const struct kvr_l2_hdr *h, const struct kvr_l2_ident *ident, kvr_key key,
				    uint32_t lane)
{
	if (h->magic != KVR_L2_MAGIC)
		return KVR_L2_R_MAGIC;
	if (h->version != KVR_L2_VERSION || h->hdr_bytes != KVR_L2_HDR_BYTES)
		return KVR_L2_R_VERSION;
	if (h->hdr_xxh3 != XXH3_64bits(h, offsetof(struct kvr_l2_hdr, hdr_xxh3)))
		return KVR_L2_R_HDR_CSUM;
	if (!reserved_zero(h))
		return KVR_L2_R_RESERVED;
	if (!kvr_key_eq(h->ns, ident->ns))
		return KVR_L2_R_NS;
	if (!kvr_key_eq(h->key, key) || h->lane != lane)
		return KVR_L2_R_KEY;
	/* ident.block_tokens 0: a store of several block sizes, any one */
	if (ident->block_tokens ? h->block_tokens != ident->block_tokens : !h->block_tokens)
		return KVR_L2_R_BLOCK_TOKENS;
	if (h->lane_bytes != ident->lane_bytes)
		return KVR_L2_R_LANE_BYTES;
	if (!kvr_key_eq(h->fingerprint, ident->fingerprint))
		return KVR_L2_R_FINGERPRINT;
	return KVR_L2_OK;
}

enum kvr_l2_reason kvr_l2_payload_check(const struct kvr_l2_hdr *h, const void *payload)
{
	return payload_xxh3(payload, (size_t)h->lane_bytes) == h->payload_xxh3 ? KVR_L2_OK : KVR_L2_R_PAYLOAD_CSUM;
}

DIR *kvr_l2_opendir(int dir_fd)
{
	int fd = openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return NULL;
	DIR *d = fdopendir(fd);
	if (!d) {
		int e = errno;
		close(fd);
		errno = e;
	}
	return d;
}
