/* Block keys: chained XXH3-128 over full blocks of tokens, key formatting. */
#include "kvr_keys.h"

#include <errno.h>
#include <limits.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "key inputs are hashed in host (little-endian) order");

/* Inputs up to this size are assembled on the stack and hashed in one call (the common
 * case: 16 + 128 tokens * 4 + a small extra); larger ones go through XXH3's streaming state. */
#define KEYS_STACK_BUF 8192

static inline kvr_key from_xxh(XXH128_hash_t h)
{
	return (kvr_key){.lo = h.low64, .hi = h.high64};
}

kvr_key kvr_key_hash(const void *data, size_t len)
{
	return from_xxh(XXH3_128bits(data, len));
}

char *kvr_key_fmt(kvr_key k, char *buf)
{
	static const char hex[] = "0123456789abcdef";
	for (int i = 0; i < 16; i++) {
		buf[i] = hex[(k.hi >> (60 - 4 * i)) & 0xf];
		buf[16 + i] = hex[(k.lo >> (60 - 4 * i)) & 0xf];
	}
	buf[32] = '\0';
	return buf;
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

int kvr_key_parse(const char *s, kvr_key *ret)
{
	if (!s || !ret || strlen(s) != 32)
		return -EINVAL;
	uint64_t w[2] = {0, 0};
	for (int i = 0; i < 32; i++) {
		int v = hexval(s[i]);
		if (v < 0)
			return -EINVAL;
		w[i / 16] = (w[i / 16] << 4) | (uint64_t)v;
	}
	*ret = (kvr_key){.lo = w[1], .hi = w[0]};
	return 0;
}

int kvr_keys_chain(kvr_key ns, const uint32_t *tokens, size_t n_tokens, uint32_t block_tokens, const void *extra,
		   size_t extra_len, kvr_key *ret_keys, size_t max_keys)
{
	if (!block_tokens || (n_tokens && !tokens) || (extra_len && !extra) || (max_keys && !ret_keys))
		return -EINVAL;
	size_t n = n_tokens / block_tokens;
	if (n > max_keys)
		n = max_keys;
	if (n > INT_MAX)
		return -EOVERFLOW;

	const size_t tok_bytes = (size_t)block_tokens * sizeof(uint32_t);
	kvr_key prev = ns;
	if (extra_len <= KEYS_STACK_BUF - sizeof(kvr_key) &&
	    tok_bytes <= KEYS_STACK_BUF - sizeof(kvr_key) - extra_len) {
		/* One contiguous input per block: prev key, tokens, extra. Only the key and the
		 * tokens change from block to block; extra is copied once. */
		_Alignas(64) uint8_t buf[KEYS_STACK_BUF];
		const size_t len = sizeof(kvr_key) + tok_bytes + extra_len;
		if (extra_len)
			memcpy(buf + sizeof(kvr_key) + tok_bytes, extra, extra_len);
		for (size_t i = 0; i < n; i++) {
			memcpy(buf, &prev, sizeof(prev));
			memcpy(buf + sizeof(kvr_key), tokens + i * block_tokens, tok_bytes);
			prev = from_xxh(XXH3_128bits(buf, len));
			ret_keys[i] = prev;
		}
		return (int)n;
	}

	XXH3_state_t st;
	XXH3_INITSTATE(&st);
	for (size_t i = 0; i < n; i++) {
		(void)XXH3_128bits_reset(&st);
		(void)XXH3_128bits_update(&st, &prev, sizeof(prev));
		(void)XXH3_128bits_update(&st, tokens + i * block_tokens, tok_bytes);
		if (extra_len)
			(void)XXH3_128bits_update(&st, extra, extra_len);
		prev = from_xxh(XXH3_128bits_digest(&st));
		ret_keys[i] = prev;
	}
	return (int)n;
}
