/* kvr_keys: 128-bit block keys and the chained block hash (k_i = XXH3-128(k_{i-1} || tokens || extra)). */
#ifndef KVR_KEYS_H
#define KVR_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * A block key names the KV of one full block of tokens *and* everything before it: keys are
 * chained, so equal keys mean equal prefixes (up to the 128-bit hash).
 *
 *   k_{-1} = ns                     the namespace seed (kvr_geometry_namespace)
 *   k_i    = XXH3_128(k_{i-1} || tokens[i*bt .. (i+1)*bt) || extra)
 *
 * Byte order of the hashed input: k_{i-1} as lo then hi, each 8 bytes little-endian; the
 * block's tokens as uint32 little-endian; then the extra bytes (LoRA id, multimodal hashes)
 * exactly as given. Only full blocks are hashed: a trailing partial block has no key.
 * kvring builds for little-endian hosts only (checked at compile time in keys.c).
 *
 * kvr_key is also the wire format of struct kvr_msg_key (same two uint64 fields).
 */

typedef struct {
	uint64_t lo, hi;
} kvr_key;

_Static_assert(sizeof(kvr_key) == 16, "kvr_key is 16 bytes");

#define KVR_KEY_FMT_LEN 33 /* 32 hex chars + NUL */

static inline bool kvr_key_eq(kvr_key a, kvr_key b)
{
	return a.lo == b.lo && a.hi == b.hi;
}

static inline bool kvr_key_is_zero(kvr_key k)
{
	return !k.lo && !k.hi;
}

/* Format as 32 lowercase hex chars, hi then lo (the 128-bit number, most significant
 * digit first) into buf (>= KVR_KEY_FMT_LEN bytes). Returns buf. */
char *kvr_key_fmt(kvr_key k, char *buf);

/* The disk actor (index into l2.dirs, of n_dirs >= 1) that holds block key k: the one rule
 * that spreads blocks over the disk tier (the lookup actor routes with it, a disk actor
 * finds its own slots with it). */
static inline unsigned kvr_key_disk(kvr_key k, unsigned n_dirs)
{
	return n_dirs ? (unsigned)(k.hi % n_dirs) : 0;
}

/* Parse the 32-hex-char form written by kvr_key_fmt (either case). 0 or -EINVAL. */
int kvr_key_parse(const char *s, kvr_key *ret);

/* Chain-hash tokens[0..n_tokens) in blocks of block_tokens, starting from ns. Writes the
 * key of every FULL block, up to max_keys, to ret_keys[0..]. extra (extra_len bytes, may be
 * NULL when extra_len is 0) is appended to every block's input.
 * Returns the number of keys written (min(n_tokens / block_tokens, max_keys)), or -EINVAL
 * (block_tokens 0, tokens NULL with n_tokens > 0, extra NULL with extra_len > 0, ret_keys
 * NULL with max_keys > 0). */
int kvr_keys_chain(kvr_key ns, const uint32_t *tokens, size_t n_tokens, uint32_t block_tokens, const void *extra,
		   size_t extra_len, kvr_key *ret_keys, size_t max_keys);

/* XXH3-128 of an arbitrary byte string as a kvr_key (used for namespaces and tests). */
kvr_key kvr_key_hash(const void *data, size_t len);

#endif
