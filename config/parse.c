/* config: JSON text -> struct kvr_config: the strict parser of every key's value, then the cross-key checks
 * (check.c); the file reader. */
#include "config_table.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define CONFIG_FILE_MAX (1u << 20)

/* --- errors -------------------------------------------------------------------------------------------------- */

/* Bytes of the well-formed UTF-8 sequence at s (RFC 3629: shortest form, no surrogates, at most
 * U+10FFFF), 0 when there is none. s is NUL-terminated: a cut sequence stops at the NUL. */
static size_t utf8_len(const char *s)
{
	const unsigned char *u = (const unsigned char *)s;
	size_t n;

	if (u[0] < 0x80)
		return 1;
	if (u[0] < 0xc2 || u[0] > 0xf4)
		return 0; /* a continuation byte, an overlong lead (c0, c1) or beyond U+10FFFF */
	n = u[0] < 0xe0 ? 2 : u[0] < 0xf0 ? 3 : 4;
	for (size_t i = 1; i < n; i++)
		if ((u[i] & 0xc0) != 0x80)
			return 0;
	if ((u[0] == 0xe0 && u[1] < 0xa0) || (u[0] == 0xed && u[1] > 0x9f) || (u[0] == 0xf0 && u[1] < 0x90) ||
	    (u[0] == 0xf4 && u[1] > 0x8f))
		return 0; /* overlong, a surrogate (U+D800..DFFF), or beyond U+10FFFF */
	return n;
}

/* The first byte of s that does not start a well-formed UTF-8 sequence, NULL when s is all UTF-8. */
static const char *utf8_invalid(const char *s)
{
	size_t n;

	for (; *s; s += n) {
		n = utf8_len(s);
		if (!n)
			return s;
	}
	return NULL;
}

/* A JSON-supplied name or value made printable for a one-line message (and cut at 64 bytes): control
 * characters, quotes and bytes that are not UTF-8 become '?', and a cut never splits a character, so the
 * message itself is valid UTF-8. */
const char *cfg_clean(const char *s, char *buf, size_t n)
{
	size_t i = 0, len;

	for (; *s && i + 4 < n && i < 64; s += len) {
		len = utf8_len(s);
		if (len > 1 && i + len + 4 < n && i + len <= 64) {
			memcpy(buf + i, s, len);
			i += len;
			continue;
		}
		if (len > 1)
			break;
		buf[i++] = (len == 0 || (unsigned char)*s < 0x20 || *s == 0x7f || *s == '"') ? '?' : *s;
		len = 1;
	}
	if (*s && i + 3 < n) {
		memcpy(buf + i, "...", 3);
		i += 3;
	}
	buf[i] = '\0';
	return buf;
}

static const char *json_type_name(const cJSON *v)
{
	if (cJSON_IsBool(v))
		return "boolean";
	if (cJSON_IsNull(v))
		return "null";
	if (cJSON_IsNumber(v))
		return "number";
	if (cJSON_IsString(v))
		return "string";
	if (cJSON_IsArray(v))
		return "array";
	if (cJSON_IsObject(v))
		return "object";
	return "invalid value";
}

/* A double as JSON would show it: integers exactly, others in the shortest form that reads back. */
static const char *fmt_double(double d, char *buf, size_t n)
{
	if (isfinite(d) && d > -9.2e18 && d < 9.2e18 && (double)(int64_t)d == d) {
		snprintf(buf, n, "%" PRId64, (int64_t)d);
		return buf;
	}
	snprintf(buf, n, "%.15g", d);
	if (isfinite(d) && strtod(buf, NULL) != d)
		snprintf(buf, n, "%.17g", d);
	return buf;
}

/* --- number texts -------------------------------------------------------------------------------------------- */

/*
 * cJSON keeps a number as a double only, and the double hides what was written: 1e-400 underflows to 0,
 * 1024.0000000000001 rounds to 1024. So the parser pairs every number node with its text in the document
 * and decides "is it an integer" on the text, exactly.
 */
struct numtext {
	const cJSON *node;
	const char *text;
	size_t len;
};

struct numtexts {
	struct numtext *v;
	size_t n;
};

/* The number texts of json (valid JSON) in document order into v[0..max); returns how many there are. A
 * number starts with '-' or a digit outside a string and runs over [0-9+-.eE] (cJSON took exactly that run,
 * or the document would not have parsed). */
static size_t scan_numbers(const char *json, struct numtext *v, size_t max)
{
	bool in_str = false;
	size_t n = 0, len;

	for (const char *p = json; *p; p++) {
		if (in_str) {
			if (*p == '\\' && p[1])
				p++;
			else if (*p == '"')
				in_str = false;
		} else if (*p == '"') {
			in_str = true;
		} else if (*p == '-' || (*p >= '0' && *p <= '9')) {
			len = strspn(p, "0123456789+-.eE");
			if (n < max)
				v[n] = (struct numtext){ .text = p, .len = len };
			n++;
			p += len - 1;
		}
	}
	return n;
}

/* The number nodes under item and its siblings, depth first (= document order), into v[0..max); *n counts. */
static void tree_numbers(const cJSON *item, struct numtext *v, size_t max, size_t *n)
{
	for (; item; item = item->next) {
		if (cJSON_IsNumber(item)) {
			if (*n < max)
				v[*n].node = item;
			(*n)++;
		} else if (item->child) {
			tree_numbers(item->child, v, max, n);
		}
	}
}

/* Pair the number nodes of root with their texts in json. 0, -ENOMEM, or -EINVAL when the two do not
 * pair up (not expected). ret->v is freed by the caller. */
static int numtexts_build(const char *json, const cJSON *root, struct numtexts *ret)
{
	size_t n = scan_numbers(json, NULL, 0), nodes = 0;

	ret->v = NULL;
	ret->n = 0;
	if (n == 0) {
		tree_numbers(root, NULL, 0, &nodes);
		return nodes == 0 ? 0 : -EINVAL;
	}
	ret->v = calloc(n, sizeof(*ret->v));
	if (!ret->v)
		return -ENOMEM;
	(void) scan_numbers(json, ret->v, n);
	tree_numbers(root, ret->v, n, &nodes);
	if (nodes != n)
		return -EINVAL;
	ret->n = n;
	return 0;
}

static const struct numtext *numtext_of(const struct numtexts *t, const cJSON *v)
{
	for (size_t i = 0; t && i < t->n; i++)
		if (t->v[i].node == v)
			return &t->v[i];
	return NULL;
}

/* Whether the JSON number text s[0..len) is an integer, exactly: "2048", "2048.0", "1e3" and "1.5e1" are;
 * "0.5", "1e-400" and "1024.0000000000001" are not. A text that does not read as a number is not. */
static bool numtext_integral(const char *s, size_t len)
{
	size_t i = 0, digits = 0, frac = 0, last_nonzero = SIZE_MAX;
	long long e = 0;
	bool neg_e = false, point = false;

	if (i < len && s[i] == '-')
		i++;
	for (; i < len && ((s[i] >= '0' && s[i] <= '9') || (s[i] == '.' && !point)); i++) {
		if (s[i] == '.') {
			point = true;
			continue;
		}
		if (s[i] != '0')
			last_nonzero = digits;
		digits++;
		frac += point;
	}
	if (digits == 0)
		return false;
	if (i < len && (s[i] == 'e' || s[i] == 'E')) {
		i++;
		if (i < len && (s[i] == '+' || s[i] == '-'))
			neg_e = s[i++] == '-';
		if (i == len)
			return false;
		for (; i < len && s[i] >= '0' && s[i] <= '9'; i++)
			if (e < 1000000000)
				e = e * 10 + (s[i] - '0');
	}
	if (i != len)
		return false;
	if (last_nonzero == SIZE_MAX)
		return true; /* zero */
	/* the digits read as an integer D ending in tz zeros, the value is D x 10^(e - frac): an integer
	 * exactly when no nonzero digit lands right of the point */
	long long tz = (long long)(digits - 1 - last_nonzero);
	return tz + (neg_e ? -e : e) - (long long)frac >= 0;
}

/* --- values -------------------------------------------------------------------------------------------------- */

/* A JSON number that must be an integer in [min, max]: never truncated, never clamped, and never read as
 * something other than what its text says (t: the document's number texts, NULL = the double only). */
static int parse_uint(const struct kvr_key *k, const cJSON *v, const struct numtexts *t, const char *path,
		      uint64_t *ret, char *err, size_t errlen)
{
	const struct numtext *nt = numtext_of(t, v);
	double d = v->valuedouble;
	char num[40], range[64];

	if (nt && !numtext_integral(nt->text, nt->len))
		return FAIL("%s: wrong type: expected unsigned integer, got fractional number %.*s", path,
			    (int)(nt->len < 40 ? nt->len : 40), nt->text);
	if (isfinite(d) && d > -9.2e18 && d < 9.2e18 && (double)(int64_t)d != d)
		return FAIL("%s: wrong type: expected unsigned integer, got fractional number %s", path,
			    fmt_double(d, num, sizeof(num)));
	if (!isfinite(d) || d < (double)k->min || d > (double)k->max)
		return FAIL("%s: out of range: %s (must be %s)", path, fmt_double(d, num, sizeof(num)),
			    cfg_fmt_range(k, range, sizeof(range)));
	*ret = (uint64_t)d;
	return 0;
}

/* "123", "123B", "4KiB" ... "1PiB": 0, -EINVAL (syntax) or -ERANGE (over 64 bits). */
static int parse_size_str(const char *s, uint64_t *ret)
{
	static const struct {
		const char *name;
		unsigned shift;
	} units[] = {
		{ "", 0 }, { "B", 0 }, { "KiB", 10 }, { "MiB", 20 }, { "GiB", 30 }, { "TiB", 40 }, { "PiB", 50 },
	};
	uint64_t v = 0;
	const char *p = s;

	if (*p < '0' || *p > '9')
		return -EINVAL;
	for (; *p >= '0' && *p <= '9'; p++) {
		unsigned dig = (unsigned)(*p - '0');

		if (v > (UINT64_MAX - dig) / 10)
			return -ERANGE;
		v = v * 10 + dig;
	}
	for (size_t i = 0; i < ARRAY_SIZE(units); i++) {
		if (strcmp(p, units[i].name))
			continue;
		if (units[i].shift && v > (UINT64_MAX >> units[i].shift))
			return -ERANGE;
		*ret = v << units[i].shift;
		return 0;
	}
	return -EINVAL;
}

static int parse_size(const struct kvr_key *k, const cJSON *v, const struct numtexts *t, const char *path,
		      uint64_t *ret, char *err, size_t errlen)
{
	char s[80], range[64];
	uint64_t u;
	int r;

	if (cJSON_IsNumber(v))
		return parse_uint(k, v, t, path, ret, err, errlen);
	if (!cJSON_IsString(v))
		return FAIL("%s: wrong type: expected unsigned integer or size string, got %s", path,
			    json_type_name(v));
	r = parse_size_str(v->valuestring, &u);
	if (r == -EINVAL)
		return FAIL("%s: invalid size \"%s\" (bytes, or a string like \"512MiB\"; units B, KiB, MiB, GiB, TiB, "
			    "PiB)", path, cfg_clean(v->valuestring, s, sizeof(s)));
	if (r < 0 || u < k->min || u > k->max)
		return FAIL("%s: out of range: \"%s\" (must be %s)", path, cfg_clean(v->valuestring, s, sizeof(s)),
			    cfg_fmt_range(k, range, sizeof(range)));
	*ret = u;
	return 0;
}

static int parse_mode(const struct kvr_key *k, const cJSON *v, const char *path, uint32_t *ret, char *err,
		      size_t errlen)
{
	char s[80], range[64];
	const char *p;
	size_t len;
	uint32_t m = 0;

	if (!cJSON_IsString(v))
		return FAIL("%s: wrong type: expected octal mode string, got %s", path, json_type_name(v));
	p = v->valuestring;
	len = strlen(p);
	if (len < 3 || len > 4 || strspn(p, "01234567") != len)
		return FAIL("%s: invalid mode \"%s\" (3 or 4 octal digits, like \"0600\")", path,
			    cfg_clean(p, s, sizeof(s)));
	for (; *p; p++)
		m = m * 8 + (uint32_t)(*p - '0');
	if (m < k->min || m > k->max)
		return FAIL("%s: out of range: \"%s\" (must be %s)", path, cfg_clean(v->valuestring, s, sizeof(s)),
			    cfg_fmt_range(k, range, sizeof(range)));
	*ret = m;
	return 0;
}

/* A string that fits a char[size] field, with the path rules of its flags. */
static int check_string(const struct kvr_key *k, const cJSON *v, const char *path, char *err, size_t errlen)
{
	char s[80];
	const char *str, *bad;

	if (!cJSON_IsString(v))
		return FAIL("%s: wrong type: expected string, got %s", path, json_type_name(v));
	str = v->valuestring;
	if (strlen(str) >= k->size)
		return FAIL("%s: too long (max %zu)", path, k->size - 1);
	/* cJSON passes raw bytes through: one that is not UTF-8 would make the effective config (--check-config,
	 * the control segment's copy) text that is no longer JSON */
	bad = utf8_invalid(str);
	if (bad)
		return FAIL("%s: not valid UTF-8: byte 0x%02x at offset %zu", path, (unsigned)(unsigned char)*bad,
			    (size_t)(bad - str));
	if (((k->flags & F_ABS) || ((k->flags & F_ABS_OR_EMPTY) && str[0])) && str[0] != '/')
		return FAIL("%s: not an absolute path: \"%s\"", path, cfg_clean(str, s, sizeof(s)));
	return 0;
}

static int parse_enum(const struct kvr_key *k, const cJSON *v, const char *path, char *err, size_t errlen)
{
	char s[80], list[512];
	const char *e;
	size_t n = 0;

	if (!cJSON_IsString(v))
		return FAIL("%s: wrong type: expected string, got %s", path, json_type_name(v));
	for (unsigned i = 0; (e = cfg_enum_value(k, i)); i++)
		if (!strcmp(e, v->valuestring))
			return 0;
	list[0] = '\0';
	for (unsigned i = 0; (e = cfg_enum_value(k, i)) && n < sizeof(list); i++)
		n += (size_t)snprintf(list + n, sizeof(list) - n, "%s%s", n ? ", " : "", *e ? e : "\"\"");
	return FAIL("%s: invalid value \"%s\" (one of: %s)", path, cfg_clean(v->valuestring, s, sizeof(s)), list);
}

/* An absolute path with repeated '/', "." components and a trailing '/' dropped into buf (>= strlen(p) + 2):
 * "/x//./l2/" -> "/x/l2". ".." is kept: through a symlink "a/.." is not where it looks (kvr_config_check_fs
 * compares what exists by inode). */
const char *cfg_path_lexical(const char *p, char *buf)
{
	size_t n = 0, len;

	buf[n++] = '/';
	while (*p) {
		p += strspn(p, "/");
		len = strcspn(p, "/");
		if (len == 0 || (len == 1 && p[0] == '.')) {
			p += len;
			continue;
		}
		if (n > 1)
			buf[n++] = '/';
		memcpy(buf + n, p, len);
		n += len;
		p += len;
	}
	buf[n] = '\0';
	return buf;
}

static int parse_paths(const struct kvr_key *k, const cJSON *v, const char *path, struct kvr_config *c, char *err,
		       size_t errlen)
{
	char epath[128], dpath[128], a[80], b[80], na[KVR_PATH_MAX + 2], nb[KVR_PATH_MAX + 2];
	const cJSON *e;
	uint32_t n = 0, i = 0;
	int r;

	if (!cJSON_IsArray(v))
		return FAIL("%s: wrong type: expected array of strings, got %s", path, json_type_name(v));
	cJSON_ArrayForEach(e, v)
		n++;
	if (n > k->max_items)
		return FAIL("%s: too many entries: %" PRIu32 " (max %" PRIu32 ")", path, n, k->max_items);
	cJSON_ArrayForEach(e, v) {
		snprintf(epath, sizeof(epath), "%s[%" PRIu32 "]", path, i);
		r = check_string(k, e, epath, err, errlen);
		if (r < 0)
			return r;
		if ((k->flags & F_ADDR) && !cfg_listen_valid(e->valuestring))
			return FAIL("%s: invalid \"%s\" (expected host:port, port 1..65535)", epath,
				    cfg_clean(e->valuestring, a, sizeof(a)));
		/* one directory under two spellings would get two disk actors over one store */
		for (uint32_t j = 0; j < i && (k->flags & F_ADDR); j++)
			if (!strcmp(field(c, k->off + j * k->size), e->valuestring)) {
				snprintf(dpath, sizeof(dpath), "%s[%" PRIu32 "]", path, j);
				return FAIL("%s: duplicate of %s (\"%s\")", epath, dpath, cfg_clean(e->valuestring, a, sizeof(a)));
			}
		for (uint32_t j = 0; j < i && !(k->flags & F_ADDR); j++) {
			const char *prev = field(c, k->off + j * k->size);

			if (strcmp(cfg_path_lexical(prev, na), cfg_path_lexical(e->valuestring, nb)))
				continue;
			snprintf(dpath, sizeof(dpath), "%s[%" PRIu32 "]", path, j);
			return FAIL("%s: duplicate of %s: \"%s\" is the same directory as \"%s\"", epath, dpath,
				    cfg_clean(e->valuestring, a, sizeof(a)), cfg_clean(prev, b, sizeof(b)));
		}
		set_str(field(c, k->off + i * k->size), k->size, e->valuestring);
		i++;
	}
	for (; i < k->max_items; i++)
		memset(field(c, k->off + i * k->size), 0, k->size);
	memcpy(field(c, k->count_off), &n, sizeof(n));
	return 0;
}

static int set_value(const struct kvr_key *k, const cJSON *v, const struct numtexts *t, struct kvr_config *c,
		     char *err, size_t errlen)
{
	char path[96];
	uint64_t u = 0;
	uint32_t m = 0;
	int r;

	snprintf(path, sizeof(path), "$.%s", k->path);
	switch (k->kind) {
	case K_U32:
		if (!cJSON_IsNumber(v))
			return FAIL("%s: wrong type: expected unsigned integer, got %s", path, json_type_name(v));
		r = parse_uint(k, v, t, path, &u, err, errlen);
		if (r == 0)
			set_u32(c, k, (uint32_t)u);
		return r;
	case K_SIZE:
		r = parse_size(k, v, t, path, &u, err, errlen);
		if (r == 0)
			set_u64(c, k, u);
		return r;
	case K_BOOL:
		if (!cJSON_IsBool(v))
			return FAIL("%s: wrong type: expected boolean, got %s", path, json_type_name(v));
		*(bool *)field(c, k->off) = cJSON_IsTrue(v);
		return 0;
	case K_STR:
		r = check_string(k, v, path, err, errlen);
		if (r == 0)
			set_str(field(c, k->off), k->size, v->valuestring);
		return r;
	case K_ENUM:
		r = parse_enum(k, v, path, err, errlen);
		if (r == 0)
			set_str(field(c, k->off), k->size, v->valuestring);
		return r;
	case K_MODE:
		r = parse_mode(k, v, path, &m, err, errlen);
		if (r == 0)
			set_u32(c, k, m);
		return r;
	case K_PATHS:
		return parse_paths(k, v, path, c, err, errlen);
	}
	return FAIL("%s: internal error: bad key kind", path);
}

/* Whether a sibling before item (first: the parent's first child) has the same name. */
static bool duplicate_before(const cJSON *first, const cJSON *item)
{
	for (const cJSON *p = first; p && p != item; p = p->next)
		if (!strcmp(p->string, item->string))
			return true;
	return false;
}

/* Apply every key of root to c; ret_set[i] tells whether cfg_keys[i] was given. t: root's number texts. */
static int walk(const cJSON *root, const struct numtexts *t, struct kvr_config *c, bool *ret_set, char *err,
		size_t errlen)
{
	char a[80], b[80];
	const cJSON *sec, *item;
	int r;

	if (!cJSON_IsObject(root))
		return FAIL("$: wrong type: expected object, got %s", json_type_name(root));
	for (sec = root->child; sec; sec = sec->next) {
		if (duplicate_before(root->child, sec))
			return FAIL("$.%s: duplicate key", cfg_clean(sec->string, a, sizeof(a)));
		if (!cfg_section_find(sec->string))
			return FAIL("$.%s: unknown key", cfg_clean(sec->string, a, sizeof(a)));
		if (!cJSON_IsObject(sec))
			return FAIL("$.%s: wrong type: expected object, got %s", sec->string, json_type_name(sec));
		for (item = sec->child; item; item = item->next) {
			const struct kvr_key *k;

			if (duplicate_before(sec->child, item))
				return FAIL("$.%s.%s: duplicate key", sec->string, cfg_clean(item->string, b, sizeof(b)));
			k = cfg_key_find(sec->string, item->string);
			if (!k)
				return FAIL("$.%s.%s: unknown key", sec->string, cfg_clean(item->string, b, sizeof(b)));
			r = set_value(k, item, t, c, err, errlen);
			if (r < 0)
				return r;
			ret_set[k - cfg_keys] = true;
		}
	}
	return 0;
}

/* --- public -------------------------------------------------------------------------------------------------- */

/* 1-based line and column (in characters, UTF-8 continuation bytes not counted) of at in text. */
static void line_col(const char *text, const char *at, unsigned *ret_line, unsigned *ret_col)
{
	unsigned line = 1, col = 1;

	for (const char *p = text; p < at && *p; p++) {
		if (*p == '\n') {
			line++;
			col = 1;
		} else if (((unsigned char)*p & 0xc0) != 0x80) {
			col++;
		}
	}
	*ret_line = line;
	*ret_col = col;
}

/* cJSON turns "\u0000" into an end of string, silently cutting it: refuse it. text is valid JSON. */
static int check_nul_escape(const char *text, char *err, size_t errlen)
{
	bool in_str = false;
	unsigned line, col;

	for (const char *p = text; *p; p++) {
		if (!in_str) {
			in_str = *p == '"';
		} else if (*p == '"') {
			in_str = false;
		} else if (*p == '\\') {
			if (!strncmp(p, "\\u0000", 6)) {
				line_col(text, p, &line, &col);
				return FAIL("config: \\u0000 in a string near line %u column %u", line, col);
			}
			p++;
		}
	}
	return 0;
}

#define UTF8_BOM "\xef\xbb\xbf"

int kvr_config_parse(const char *json, struct kvr_config *cfg, char *err, size_t errlen)
{
	bool set[CFG_KEYS_MAX] = { false };
	struct numtexts nums = { 0 };
	struct kvr_config tmp;
	const char *end = NULL;
	unsigned line, col;
	cJSON *root;
	int r;

	if (err && errlen > 0)
		err[0] = '\0';
	if (!json)
		return FAIL("config: no JSON text");
	/* A UTF-8 byte-order mark before the text (editors on Windows write one) is skipped on
	 * purpose, and every position counts from after it, as an editor shows them. cJSON would
	 * skip one too, and a second one after it: a second one is refused here, as a mark
	 * anywhere else is (it is not JSON whitespace). */
	if (!strncmp(json, UTF8_BOM, 3)) {
		json += 3;
		if (!strncmp(json, UTF8_BOM, 3))
			return FAIL("config: not valid JSON near line 1 column 1 (a second UTF-8 byte-order mark)");
	}
	root = cJSON_ParseWithOpts(json, &end, true);
	if (!root) {
		if (!end)
			end = cJSON_GetErrorPtr();
		if (!end)
			return FAIL("config: not valid JSON");
		line_col(json, end, &line, &col);
		return FAIL("config: not valid JSON near line %u column %u", line, col);
	}
	cfg_table_defaults(&tmp);
	r = check_nul_escape(json, err, errlen);
	if (r == 0) {
		r = numtexts_build(json, root, &nums);
		if (r == -ENOMEM)
			r = kvr_errf(err, errlen, -ENOMEM, "config: out of memory");
		else if (r < 0)
			r = FAIL("config: internal error: the numbers of the document do not pair up");
	}
	if (r == 0)
		r = walk(root, &nums, &tmp, set, err, errlen);
	if (r == 0)
		r = cfg_check_config(&tmp, set, err, errlen); /* resolves the model preset and derives */
	free(nums.v);
	cJSON_Delete(root);
	if (r == 0 && cfg)
		memcpy(cfg, &tmp, sizeof(tmp));
	return r;
}

int kvr_config_load_file(const char *path, struct kvr_config *cfg, char *err, size_t errlen)
{
	struct kvr_config tmp;
	char ebuf[128];
	size_t n = 0;
	ssize_t got;
	char *text;
	int fd, r;

	if (err && errlen > 0)
		err[0] = '\0';
	if (!path || !path[0])
		return FAIL("config: no file name");
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		r = -errno;
		return kvr_errf(err, errlen, r, "config %s: %s", path, strerror_r(-r, ebuf, sizeof(ebuf)));
	}
	text = malloc(CONFIG_FILE_MAX + 2);
	if (!text) {
		close(fd);
		return kvr_errf(err, errlen, -ENOMEM, "config %s: out of memory", path);
	}
	/* Read one byte past the cap to tell "exactly 1 MiB" from "larger". */
	while (n <= CONFIG_FILE_MAX) {
		got = read(fd, text + n, CONFIG_FILE_MAX + 1 - n);
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0) {
			r = -errno;
			kvr_errf(err, errlen, r, "config %s: %s", path, strerror_r(-r, ebuf, sizeof(ebuf)));
			goto out;
		}
		if (got == 0)
			break;
		n += (size_t)got;
	}
	if (n > CONFIG_FILE_MAX) {
		r = kvr_errf(err, errlen, -EFBIG, "config %s: larger than 1 MiB", path);
		goto out;
	}
	if (memchr(text, '\0', n)) {
		r = FAIL("config %s: contains a NUL byte", path);
		goto out;
	}
	text[n] = '\0';
	r = kvr_config_parse(text, &tmp, err, errlen);
	if (r == 0)
		r = kvr_config_check_fs(&tmp, err, errlen);
	if (r == 0 && cfg)
		memcpy(cfg, &tmp, sizeof(tmp));
out:
	free(text);
	close(fd);
	return r;
}
