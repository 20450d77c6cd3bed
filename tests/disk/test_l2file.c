/* l2file tests: name format and exact round trip, header layout, every header check reason, payload checksum. */
#include <criterion/criterion.h>

#include "disk_test.h"

TestSuite(l2file);

static const struct kvr_l2_ident ID = {
	.ns = {0x1111222233334444ull, 0x5555666677778888ull},
	.fingerprint = {0xf1f2f3f4ull, 0xe1e2e3e4ull},
	.block_tokens = 16,
	.lane_bytes = 10000,
};

Test(l2file, sizes)
{
	cr_assert_eq(sizeof(struct kvr_l2_hdr), 4096);
	cr_assert_eq(kvr_l2_payload_bytes(1), 4096);
	cr_assert_eq(kvr_l2_payload_bytes(4096), 4096);
	cr_assert_eq(kvr_l2_payload_bytes(4097), 8192);
	cr_assert_eq(kvr_l2_file_bytes(10000), 4096 + 12288);
	cr_assert_eq(kvr_l2_file_bytes(2u << 20), 4096 + (2u << 20));
	cr_assert_eq(kvr_l2_file_bytes(0), 0);
	cr_assert_eq(kvr_l2_file_bytes(UINT64_MAX), 0);
	cr_assert_eq(kvr_l2_file_bytes(UINT64_MAX - 8000), 0);
}

Test(l2file, name_round_trip)
{
	char name[KVR_L2_NAME_MAX];
	kvr_key k = {0x0123456789abcdefull, 0xfedcba9876543210ull};
	cr_assert_str_eq(kvr_l2_name_fmt(k, 0, name), "fedcba98765432100123456789abcdef.0.kvb");
	cr_assert_str_eq(kvr_l2_name_fmt(k, 65535, name), "fedcba98765432100123456789abcdef.65535.kvb");
	struct rng r = {test_seed("l2file.name_round_trip")};
	for (int i = 0; i < 10000; i++) {
		kvr_key key = {rng_next(&r), rng_next(&r)};
		if (i == 0)
			key = (kvr_key){0, 0};
		uint32_t lane = i % 3 ? rng_below(&r, 16) : rng_below(&r, 65536);
		kvr_l2_name_fmt(key, lane, name);
		kvr_key pk = {1, 1};
		uint32_t pl = 7;
		cr_assert_eq(kvr_l2_name_parse(name, &pk, &pl), 0, "%s", name);
		cr_assert(kvr_key_eq(pk, key) && pl == lane, "%s", name);
		char again[KVR_L2_NAME_MAX];
		cr_assert_str_eq(kvr_l2_name_fmt(pk, pl, again), name);
		cr_assert(!kvr_l2_is_tmp_name(name));
		char tmp[KVR_L2_TMP_MAX];
		kvr_l2_tmp_name_fmt(key, lane, 4242, (uint64_t)i, tmp);
		cr_assert(kvr_l2_is_tmp_name(tmp), "%s", tmp);
		cr_assert_eq(kvr_l2_name_parse(tmp, &pk, &pl), -EINVAL, "%s", tmp);
	}
}

Test(l2file, foreign_names)
{
	static const char *const bad[] = {
		"",
		"fedcba98765432100123456789abcdef.0",
		"fedcba98765432100123456789abcdef.0.kvb.",
		"fedcba98765432100123456789abcdef.0.kvbx",
		"fedcba98765432100123456789abcdef.00.kvb",   /* leading zero */
		"fedcba98765432100123456789abcdef.01.kvb",
		"fedcba98765432100123456789abcdef.65536.kvb", /* lane too large */
		"fedcba98765432100123456789abcdef.123456.kvb",
		"fedcba98765432100123456789abcdef.-1.kvb",
		"fedcba98765432100123456789abcdef.+1.kvb",
		"fedcba98765432100123456789abcdef..kvb",
		"FEDCBA98765432100123456789ABCDEF.0.kvb",    /* upper case: not what we write */
		"fedcba98765432100123456789abcdeF.0.kvb",
		"fedcba98765432100123456789abcde.0.kvb",     /* 31 hex */
		"fedcba98765432100123456789abcdef0.0.kvb",   /* 33 hex */
		"gedcba98765432100123456789abcdef.0.kvb",
		" fedcba98765432100123456789abcdef.0.kvb",
		"fedcba98765432100123456789abcdef.0.kvb.tmp.1.2",
		"hello.txt",
		".kvr.lock",
	};
	for (unsigned i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		kvr_key k = {9, 9};
		uint32_t lane = 9;
		cr_assert_eq(kvr_l2_name_parse(bad[i], &k, &lane), -EINVAL, "'%s' must be foreign", bad[i]);
		cr_assert(k.lo == 9 && k.hi == 9 && lane == 9, "outputs untouched on failure");
	}
	cr_assert(!kvr_l2_is_tmp_name("hello.kvb.tmp.1.2"));
	cr_assert(!kvr_l2_is_tmp_name("fedcba98765432100123456789abcdef.0.kvb"));
	cr_assert(kvr_l2_is_tmp_name("fedcba98765432100123456789abcdef.0.kvb.tmp.1.2"));
	char hex[KVR_KEY_FMT_LEN];
	cr_assert_str_eq(kvr_l2_ns_dir_fmt(ID.ns, hex), "55556666777788881111222233334444");
}

Test(l2file, header_build_and_layout)
{
	struct kvr_l2_hdr h;
	kvr_key k = {0xabc, 0xdef};
	memset(&h, 0xee, sizeof(h));
	kvr_l2_hdr_build(&h, &ID, k, 3, 0x1234);
	const uint8_t *b = (const uint8_t *)&h;
	cr_assert_eq(memcmp(b, "KVRL2BLK", 8), 0, "magic bytes on disk");
	cr_assert_eq(h.version, KVR_L2_VERSION);
	cr_assert_eq(h.hdr_bytes, 4096);
	cr_assert(kvr_key_eq(h.ns, ID.ns) && kvr_key_eq(h.key, k) && kvr_key_eq(h.fingerprint, ID.fingerprint));
	cr_assert_eq(h.lane, 3);
	cr_assert_eq(h.block_tokens, 16);
	cr_assert_eq(h.lane_bytes, 10000);
	cr_assert_eq(h.payload_xxh3, 0x1234);
	cr_assert_eq(h.writer_pid, (uint32_t)getpid());
	for (unsigned i = offsetof(struct kvr_l2_hdr, reserved0); i < offsetof(struct kvr_l2_hdr, hdr_xxh3); i++)
		cr_assert_eq(b[i], 0, "reserved byte %u is zero", i);
	cr_assert_eq(kvr_l2_hdr_check(&h, &ID, k, 3), KVR_L2_OK);
}

/* Every reason kvr_l2_hdr_check can give, each from one change to a good header. */
Test(l2file, header_check_reasons)
{
	kvr_key k = {0xabc, 0xdef};
	struct kvr_l2_hdr good, h;
	kvr_l2_hdr_build(&good, &ID, k, 1, 42);
	struct kvr_l2_ident other;

#define EXPECT(reason, ...) \
	do { \
		h = good; \
		__VA_ARGS__; \
		cr_assert_eq(kvr_l2_hdr_check(&h, &other, k, 1), (reason), "%s: got %s", #reason, \
			     kvr_l2_reason_name(kvr_l2_hdr_check(&h, &other, k, 1))); \
	} while (0)

	other = ID;
	EXPECT(KVR_L2_R_MAGIC, h.magic ^= 1);
	EXPECT(KVR_L2_R_VERSION, h.version = 2; kvr_l2_hdr_seal(&h));
	EXPECT(KVR_L2_R_VERSION, h.hdr_bytes = 512; kvr_l2_hdr_seal(&h));
	EXPECT(KVR_L2_R_HDR_CSUM, h.key.lo ^= 1);          /* a flipped field byte */
	EXPECT(KVR_L2_R_HDR_CSUM, h.reserved[1000] = 1);   /* a flipped reserved byte */
	EXPECT(KVR_L2_R_HDR_CSUM, h.hdr_xxh3 ^= 1);
	EXPECT(KVR_L2_R_HDR_CSUM, h.payload_xxh3 ^= 1);
	/* a reserved byte that is not 0 under a good checksum: a layout this build does not know */
	EXPECT(KVR_L2_R_RESERVED, h.reserved[1000] = 1; kvr_l2_hdr_seal(&h));
	EXPECT(KVR_L2_R_RESERVED, h.reserved[0] = 0x80; kvr_l2_hdr_seal(&h));
	EXPECT(KVR_L2_R_RESERVED, h.reserved[sizeof(h.reserved) - 1] = 1; kvr_l2_hdr_seal(&h));
	EXPECT(KVR_L2_R_RESERVED, h.reserved0 = 1u << 24; kvr_l2_hdr_seal(&h));
	EXPECT(KVR_L2_R_RESERVED, h.reserved0 = 1; kvr_l2_hdr_seal(&h));
	/* ... checked before what the header says about the file: the first failure is the reason */
	EXPECT(KVR_L2_R_RESERVED, h.reserved[7] = 1; h.key.lo ^= 1; kvr_l2_hdr_seal(&h));
	/* the informational fields just before them are not reserved */
	EXPECT(KVR_L2_OK, h.writer_pid = 0xffffffffu; h.created_ns = ~0ull; kvr_l2_hdr_seal(&h));
	EXPECT(KVR_L2_R_KEY, h.key.lo ^= 1; kvr_l2_hdr_seal(&h));
	EXPECT(KVR_L2_R_KEY, h.lane = 2; kvr_l2_hdr_seal(&h));
	EXPECT(KVR_L2_OK, (void)0);
	other.ns.hi ^= 1;
	EXPECT(KVR_L2_R_NS, (void)0);
	other = ID;
	other.block_tokens = 128;
	EXPECT(KVR_L2_R_BLOCK_TOKENS, (void)0);
	other = ID;
	other.lane_bytes = 10001;
	EXPECT(KVR_L2_R_LANE_BYTES, (void)0);
	other = ID;
	other.fingerprint.lo ^= 1;
	EXPECT(KVR_L2_R_FINGERPRINT, (void)0);
#undef EXPECT
	/* the name's key and lane must be the header's */
	cr_assert_eq(kvr_l2_hdr_check(&good, &ID, (kvr_key){0xabd, 0xdef}, 1), KVR_L2_R_KEY);
	cr_assert_eq(kvr_l2_hdr_check(&good, &ID, k, 0), KVR_L2_R_KEY);
}

Test(l2file, payload_checksum)
{
	uint8_t *img = dt_image(&ID, (kvr_key){5, 6}, 0, 77);
	const struct kvr_l2_hdr *h = (const struct kvr_l2_hdr *)img;
	cr_assert_eq(kvr_l2_payload_check(h, img + 4096), KVR_L2_OK);
	img[4096 + 9999] ^= 1; /* the last payload byte */
	cr_assert_eq(kvr_l2_payload_check(h, img + 4096), KVR_L2_R_PAYLOAD_CSUM);
	img[4096 + 9999] ^= 1;
	img[4096 + 10000] ^= 1; /* padding is not covered */
	cr_assert_eq(kvr_l2_payload_check(h, img + 4096), KVR_L2_OK);
	free(img);
	for (unsigned r = 0; r < KVR_L2_R_MAX; r++)
		cr_assert_str_neq(kvr_l2_reason_name(r), "unknown");
	cr_assert_str_eq(kvr_l2_reason_name(KVR_L2_R_MAX), "unknown");
	cr_assert_str_eq(kvr_l2_reason_name(KVR_L2_R_RESERVED), "reserved");
}
