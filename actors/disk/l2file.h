/* l2file: the on-disk format of one L2 block file (name, 4 KiB header, checksums) and its validation. */
#ifndef KVR_L2FILE_H
#define KVR_L2FILE_H

#include <dirent.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "kvr_keys.h"

/*
 * One file per (key, lane), in the namespace's own directory:
 *
 *   <dir>/<ns: 32 hex>/<key: 32 hex>.<lane>.kvb                 a complete block
 *   <dir>/<ns: 32 hex>/<key: 32 hex>.<lane>.kvb.tmp.<pid>.<seq> being written (never served)
 *
 * Hex is lowercase, most significant digit first (kvr_key_fmt); lane is decimal without
 * leading zeros, 0..65535. A name is ours only when kvr_l2_name_parse() accepts it, and it
 * accepts exactly the strings kvr_l2_name_fmt() writes: "ABC..." (upper case), "01" lanes,
 * trailing bytes all make a name foreign.
 *
 * File layout (every offset and length a multiple of KVR_L2_ALIGN, for O_DIRECT):
 *
 *   [0, 4096)                       struct kvr_l2_hdr
 *   [4096, 4096 + lane_bytes)       the payload: one lane of one block, as L1 holds it
 *   [4096 + lane_bytes, file end)   padding up to a multiple of 4096 (unspecified bytes)
 *
 * so a valid file is exactly kvr_l2_file_bytes(lane_bytes) long. All integers are
 * little-endian (kvring builds for little-endian hosts only).
 */

#define KVR_L2_ALIGN 4096u
#define KVR_L2_HDR_BYTES 4096u
#define KVR_L2_MAGIC 0x4b4c42324c52564bull /* "KVRL2BLK" as little-endian bytes */
#define KVR_L2_VERSION 1u
#define KVR_L2_NAME_MAX 64   /* "<32 hex>.<lane>.kvb" + NUL fits */
#define KVR_L2_TMP_MAX 112   /* "<name>.tmp.<pid>.<seq>" + NUL fits */
#define KVR_L2_SUFFIX ".kvb"
#define KVR_L2_TMP_MARK ".kvb.tmp."
#define KVR_L2_LOCK_NAME ".kvr.lock" /* the instance lock in a namespace directory */
#define KVR_L2_MAX_LANE 65535u

/* What every block file of one configuration carries; a file whose header differs in any
 * of these is not ours. fingerprint is a 128-bit digest of the geometry the caller
 * computes (the store does not interpret it). lane_bytes > 0. */
struct kvr_l2_ident {
	kvr_key ns;
	kvr_key fingerprint;
	uint32_t block_tokens;
	uint32_t reserved;       /* 0 */
	uint64_t lane_bytes;     /* payload bytes of one file */
};

struct kvr_l2_hdr {
	uint64_t magic;          /* KVR_L2_MAGIC */
	uint32_t version;        /* KVR_L2_VERSION */
	uint32_t hdr_bytes;      /* KVR_L2_HDR_BYTES (= the payload offset) */
	kvr_key ns;
	kvr_key key;
	kvr_key fingerprint;
	uint32_t lane;
	uint32_t block_tokens;
	uint64_t lane_bytes;     /* payload length */
	uint64_t payload_xxh3;   /* XXH3-64 (seed 0) of the lane_bytes payload bytes */
	uint64_t created_ns;     /* CLOCK_REALTIME at write (informational) */
	uint32_t writer_pid;     /* informational */
	uint32_t reserved0;      /* 0 */
	uint8_t reserved[4096 - 112]; /* 0 */
	uint64_t hdr_xxh3;       /* XXH3-64 (seed 0) of bytes [0, 4088): every other header byte */
};
_Static_assert(sizeof(struct kvr_l2_hdr) == KVR_L2_HDR_BYTES, "the header is one 4 KiB block");
_Static_assert(offsetof(struct kvr_l2_hdr, ns) == 16, "l2 header layout");
_Static_assert(offsetof(struct kvr_l2_hdr, fingerprint) == 48, "l2 header layout");
_Static_assert(offsetof(struct kvr_l2_hdr, lane) == 64, "l2 header layout");
_Static_assert(offsetof(struct kvr_l2_hdr, payload_xxh3) == 80, "l2 header layout");
_Static_assert(offsetof(struct kvr_l2_hdr, reserved) == 104, "l2 header layout");
_Static_assert(offsetof(struct kvr_l2_hdr, hdr_xxh3) == 4088, "l2 header layout");

/* Why a file was not served (adoption or read); 0 = fine. Counted per reason. */
enum kvr_l2_reason {
	KVR_L2_OK = 0,
	KVR_L2_R_FOREIGN,       /* name is not ours (left alone) */
	KVR_L2_R_TMP,           /* leftover temporary file (removed at adoption) */
	KVR_L2_R_NOTREG,        /* ours by name but not a regular file (left alone) */
	KVR_L2_R_SHORT,         /* header or payload shorter than it must be (truncated) */
	KVR_L2_R_SIZE,          /* file size != kvr_l2_file_bytes(lane_bytes) */
	KVR_L2_R_MAGIC,
	KVR_L2_R_VERSION,
	KVR_L2_R_HDR_CSUM,      /* header checksum mismatch (a flipped header byte) */
	KVR_L2_R_NS,            /* another namespace's block */
	KVR_L2_R_KEY,           /* header key or lane differs from the name's */
	KVR_L2_R_LANE,          /* lane outside this configuration's lanes */
	KVR_L2_R_BLOCK_TOKENS,  /* stored under another block size */
	KVR_L2_R_LANE_BYTES,    /* stored with another payload length */
	KVR_L2_R_FINGERPRINT,   /* stored under another geometry fingerprint */
	KVR_L2_R_PAYLOAD_CSUM,  /* payload checksum mismatch (read) */
	KVR_L2_R_VANISHED,      /* the file was gone (read: a miss) */
	KVR_L2_R_IO,            /* an I/O error other than the above */
	KVR_L2_R_OVER_CAP,      /* adoption: deleted to fit the capacity */
	KVR_L2_R_RESERVED,      /* a reserved header byte is not 0 under a good checksum: a layout this
				 * build does not know (a writer that used them without a new version) */
	KVR_L2_R_MODE,          /* adoption: permissions not 0600 that could not be set to 0600 (removed) */
	KVR_L2_R_MAX,
};

/* "foreign", "tmp", ..., "over_cap", "reserved", "mode"; "unknown" out of range. */
const char *kvr_l2_reason_name(unsigned r);

/* Bytes of a file that holds lane_bytes of payload: 4096 + lane_bytes rounded up to
 * 4096. 0 on overflow or lane_bytes 0. */
uint64_t kvr_l2_file_bytes(uint64_t lane_bytes);

/* lane_bytes rounded up to KVR_L2_ALIGN (0 on overflow). */
uint64_t kvr_l2_payload_bytes(uint64_t lane_bytes);

/* "<key hex>.<lane>.kvb" into buf (>= KVR_L2_NAME_MAX). Returns buf. */
char *kvr_l2_name_fmt(kvr_key key, uint32_t lane, char *buf);

/* "<key hex>.<lane>.kvb.tmp.<pid>.<seq>" into buf (>= KVR_L2_TMP_MAX). Returns buf. */
char *kvr_l2_tmp_name_fmt(kvr_key key, uint32_t lane, pid_t pid, uint64_t seq, char *buf);

/* Parse a block file name. 0 and *ret_key, *ret_lane when name is exactly what
 * kvr_l2_name_fmt writes for them; -EINVAL otherwise (outputs untouched). */
int kvr_l2_name_parse(const char *name, kvr_key *ret_key, uint32_t *ret_lane);

/* True when name is a temporary name of ours ("<name>.kvb.tmp.<anything>" whose first part
 * parses). */
bool kvr_l2_is_tmp_name(const char *name);

/* The namespace's directory name: 32 hex chars (kvr_key_fmt of ns) into buf
 * (>= KVR_KEY_FMT_LEN). Returns buf. */
char *kvr_l2_ns_dir_fmt(kvr_key ns, char *buf);

/* Fill the 4096-byte header of (key, lane) carrying a payload of ident->lane_bytes whose
 * XXH3-64 is payload_xxh3; every reserved byte zero, hdr_xxh3 computed last. */
void kvr_l2_hdr_build(struct kvr_l2_hdr *h, const struct kvr_l2_ident *ident, kvr_key key, uint32_t lane,
		      uint64_t payload_xxh3);

/* XXH3-64 of a payload (what payload_xxh3 holds). */
uint64_t kvr_l2_payload_hash(const void *payload, uint64_t lane_bytes);

/* Recompute h->hdr_xxh3 after changing a field (tests and tools that craft files). */
void kvr_l2_hdr_seal(struct kvr_l2_hdr *h);

/* Check a header read from the file named (key, lane) against this configuration, in
 * this order: magic, version and hdr_bytes, header checksum, reserved bytes (reserved0 and
 * reserved[] all 0), ns, key and lane, block_tokens, lane_bytes, fingerprint. Returns
 * KVR_L2_OK or the first failing reason. Does not look at the payload. */
enum kvr_l2_reason kvr_l2_hdr_check(const struct kvr_l2_hdr *h, const struct kvr_l2_ident *ident, kvr_key key,
				    uint32_t lane);

/* Check a payload against the header's checksum (KVR_L2_OK or KVR_L2_R_PAYLOAD_CSUM). */
enum kvr_l2_reason kvr_l2_payload_check(const struct kvr_l2_hdr *h, const void *payload);

/* A directory stream over dir_fd's directory on a descriptor of its own (dir_fd stays
 * open and unmoved). NULL with errno set on failure; closedir() when done. */
DIR *kvr_l2_opendir(int dir_fd);

#endif
