/* config_table: the key table (config.c) and the helpers config/'s files share; private to config/. */
#ifndef KVR_CONFIG_TABLE_H
#define KVR_CONFIG_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kvr_config.h"
#include "kvr_log.h"

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

enum kind {
	K_U32,   /* JSON unsigned integer */
	K_SIZE,  /* uint64_t bytes: JSON unsigned integer or a string "512MiB" */
	K_BOOL,
	K_STR,   /* char[size] */
	K_ENUM,  /* char[size], one of values[] (NULL: "" or a preset name of kvr_geometry.h) */
	K_MODE,  /* uint32_t permission bits, JSON string of 3 or 4 octal digits "0600" */
	K_PATHS, /* char[max_items][size] + uint32_t count: JSON array of strings */
};

enum {
	F_ABS = 1u << 0,          /* string must be an absolute path */
	F_ABS_OR_EMPTY = 1u << 1, /* string must be "" or an absolute path */
	F_ADDR = 1u << 2,         /* K_PATHS entries are host:port addresses, not paths */
};

struct kvr_key {
	const char *path; /* "section.key" */
	enum kind kind;
	unsigned flags;
	size_t off, size;          /* the field in struct kvr_config (K_PATHS: one entry) */
	size_t count_off;          /* K_PATHS: uint32_t entry count */
	uint32_t max_items;        /* K_PATHS */
	uint64_t def;              /* K_U32, K_SIZE, K_BOOL, K_MODE */
	const char *def_str;       /* K_STR, K_ENUM */
	uint64_t min, max;         /* K_U32, K_SIZE, K_MODE */
	const char *const *values; /* K_ENUM, NULL-terminated; NULL = the presets (cfg_enum_value) */
	const char *unit;
	const char *doc;
};

struct kvr_section {
	const char *name;
	const char *doc;
};

/* The table (config.c): cfg_sections[] in order, cfg_keys[] grouped by section in that order, and
 * the docs of the cross-key checks in the order cfg_check_config() makes them. */
extern const struct kvr_section cfg_sections[];
extern const size_t cfg_n_sections;
extern const struct kvr_key cfg_keys[];
extern const size_t cfg_n_keys;
extern const char *const cfg_checks_doc[];
extern const size_t cfg_n_checks_doc;
/* At least cfg_n_keys (config.c asserts it): the size of a "was key i given" array. */
#define CFG_KEYS_MAX 128

/* The error of a parse or check: err, errlen are the caller's; returns -EINVAL. */
#define FAIL(...) kvr_errf(err, errlen, -EINVAL, __VA_ARGS__)

/* The values of the two-valued enum keys whose derived field is a bool, as indexes into their values[]
 * (config.c spells each value once, at its index). */
enum { CFG_ATTN_MHA, CFG_ATTN_MLA };
enum { CFG_KV_SPLIT, CFG_KV_FUSED };
enum { CFG_PREFAULT_BACKGROUND, CFG_PREFAULT_OFF };
enum { CFG_L2_WRITE_THROUGH, CFG_L2_WRITE_BACK };

/* --- table access -------------------------------------------------------------------------------------------- */

static inline void *field(struct kvr_config *c, size_t off)
{
	return (char *)c + off;
}

static inline const void *cfield(const struct kvr_config *c, size_t off)
{
	return (const char *)c + off;
}

static inline uint32_t get_u32(const struct kvr_config *c, const struct kvr_key *k)
{
	uint32_t v;

	memcpy(&v, cfield(c, k->off), sizeof(v));
	return v;
}

static inline uint64_t get_u64(const struct kvr_config *c, const struct kvr_key *k)
{
	uint64_t v;

	memcpy(&v, cfield(c, k->off), sizeof(v));
	return v;
}

static inline void set_u32(struct kvr_config *c, const struct kvr_key *k, uint32_t v)
{
	memcpy(field(c, k->off), &v, sizeof(v));
}

static inline void set_u64(struct kvr_config *c, const struct kvr_key *k, uint64_t v)
{
	memcpy(field(c, k->off), &v, sizeof(v));
}

/* Copy s (strlen < size) into a char[size] field, zero-filling the rest so equal configs compare equal. */
static inline void set_str(char *dst, size_t size, const char *s)
{
	size_t len = strlen(s);

	memset(dst, 0, size);
	memcpy(dst, s, len < size ? len : size - 1);
}

static inline size_t section_len(const char *path)
{
	return strcspn(path, ".");
}

/* --- config.c: the table ------------------------------------------------------------------------------------- */

/* The key section.name, NULL when there is none. */
const struct kvr_key *cfg_key_find(const char *section, const char *name);
/* The section named name, NULL when there is none. */
const struct kvr_section *cfg_section_find(const char *name);
/* Every field of c at its key's default (model not resolved, nothing derived). */
void cfg_table_defaults(struct kvr_config *c);
/* Value i of an enum key, NULL past the last. */
const char *cfg_enum_value(const struct kvr_key *k, unsigned i);
/* The index of s among the values of enum key section.name (its enum), -1 when s is none of them. */
int cfg_enum_index(const char *section, const char *name, const char *s);
/* Bytes in the largest binary unit that divides them exactly, into buf[n]; returns buf. */
const char *cfg_fmt_size(uint64_t v, char *buf, size_t n);
/* The range [min, max] of a K_U32, K_SIZE or K_MODE key as the docs and errors show it, into buf[n]. */
const char *cfg_fmt_range(const struct kvr_key *k, char *buf, size_t n);

/* --- parse.c: JSON text -> struct kvr_config ----------------------------------------------------------------- */

/* s made printable for a one-line message into buf[n] (cut at 64 bytes, valid UTF-8); returns buf. */
const char *cfg_clean(const char *s, char *buf, size_t n);
/* Absolute path p with repeated '/', "." components and a trailing '/' dropped into buf (>= strlen(p) + 2). */
const char *cfg_path_lexical(const char *p, char *buf);

/* --- check.c: the cross-key checks --------------------------------------------------------------------------- */

/* "host:port", port 1..65535; an IPv6 host in brackets. */
bool cfg_listen_valid(const char *s);
/* The cross-key checks of a parsed c (resolving the model preset, then deriving the enum fields: cfg_derive);
 * set[i]: whether cfg_keys[i] was given. */
int cfg_check_config(struct kvr_config *c, const bool *set, char *err, size_t errlen);
/* The derived fields of the enum keys (kvr_config.h). */
void cfg_derive(struct kvr_config *c);

#endif
