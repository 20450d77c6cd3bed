/* config: struct kvr_config -> text: the effective JSON (--check-config, the control segment's copy) and
 * docs/config.md, both from the key table. */
#include "config_table.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "kvr_geometry.h"


struct sbuf {
	char *p;
	size_t len, cap;
	bool oom;
};

static void __attribute__((format(printf, 2, 3))) sb_printf(struct sbuf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (b->oom)
		return;
	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
		va_end(ap);
		if (n < 0) {
			b->oom = true;
			return;
		}
		if (b->p && (size_t)n < b->cap - b->len) {
			b->len += (size_t)n;
			return;
		}
		size_t cap = b->cap ? b->cap : 4096;
		while (cap - b->len <= (size_t)n)
			cap *= 2;
		char *p = realloc(b->p, cap);
		if (!p) {
			b->oom = true;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
}

static void sb_json_str(struct sbuf *b, const char *s)
{
	sb_printf(b, "\"");
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;

		if (ch == '"' || ch == '\\')
			sb_printf(b, "\\%c", ch);
		else if (ch < 0x20)
			sb_printf(b, "\\u%04x", ch);
		else
			sb_printf(b, "%c", ch);
	}
	sb_printf(b, "\"");
}

static char *sb_finish(struct sbuf *b)
{
	if (b->oom || !b->p) {
		free(b->p);
		return NULL;
	}
	return b->p;
}

char *kvr_config_to_json(const struct kvr_config *cfg)
{
	struct sbuf b = { 0 };
	size_t cur_len = 0;
	const char *cur = NULL;

	if (!cfg)
		return NULL;
	sb_printf(&b, "{");
	for (size_t i = 0; i < cfg_n_keys; i++) {
		const struct kvr_key *k = &cfg_keys[i];
		size_t slen = section_len(k->path);
		uint32_t n;

		if (!cur || slen != cur_len || strncmp(cur, k->path, slen)) {
			sb_printf(&b, "%s\n  \"%.*s\": {\n", cur ? "\n  }," : "", (int)slen, k->path);
			cur = k->path;
			cur_len = slen;
		} else {
			sb_printf(&b, ",\n");
		}
		sb_printf(&b, "    \"%s\": ", k->path + slen + 1);
		switch (k->kind) {
		case K_U32:
			sb_printf(&b, "%" PRIu32, get_u32(cfg, k));
			break;
		case K_MODE:
			sb_printf(&b, "\"%04" PRIo32 "\"", get_u32(cfg, k));
			break;
		case K_SIZE:
			sb_printf(&b, "%" PRIu64, get_u64(cfg, k));
			break;
		case K_BOOL:
			sb_printf(&b, "%s", *(const bool *)cfield(cfg, k->off) ? "true" : "false");
			break;
		case K_STR:
		case K_ENUM:
			sb_json_str(&b, cfield(cfg, k->off)); /* NUL-terminated: parse and set_str keep it so */
			break;
		case K_PATHS:
			memcpy(&n, cfield(cfg, k->count_off), sizeof(n));
			sb_printf(&b, "[");
			for (uint32_t j = 0; j < n && j < k->max_items; j++) {
				sb_printf(&b, "%s", j ? ", " : "");
				sb_json_str(&b, cfield(cfg, k->off + j * k->size));
			}
			sb_printf(&b, "]");
			break;
		}
	}
	sb_printf(&b, "\n  }\n}\n");
	return sb_finish(&b);
}

/* Markdown table cell text: '|' would end the cell. */
static void sb_md(struct sbuf *b, const char *s)
{
	for (; *s; s++) {
		if (*s == '|')
			sb_printf(b, "\\|");
		else
			sb_printf(b, "%c", *s);
	}
}

static void doc_type(struct sbuf *b, const struct kvr_key *k)
{
	static const char *const names[] = {
		[K_U32] = "uint32", [K_SIZE] = "size", [K_BOOL] = "bool", [K_STR] = "string",
		[K_ENUM] = "enum", [K_MODE] = "mode", [K_PATHS] = "array of strings",
	};

	sb_printf(b, "%s", names[k->kind]);
	if (k->unit && k->kind == K_U32)
		sb_printf(b, " (%s)", k->unit);
	else if (k->kind == K_SIZE)
		sb_printf(b, " (bytes)");
	else if (k->kind == K_MODE)
		sb_printf(b, " (octal)");
}

static void doc_default(struct sbuf *b, const struct kvr_key *k)
{
	char s[32];

	switch (k->kind) {
	case K_U32:
		sb_printf(b, "`%" PRIu64 "`", k->def);
		break;
	case K_SIZE:
		cfg_fmt_size(k->def, s, sizeof(s));
		if (strspn(s, "0123456789") == strlen(s))
			sb_printf(b, "`%s`", s);
		else
			sb_printf(b, "`\"%s\"`", s);
		break;
	case K_BOOL:
		sb_printf(b, "`%s`", k->def ? "true" : "false");
		break;
	case K_MODE:
		sb_printf(b, "`\"%04" PRIo64 "\"`", k->def);
		break;
	case K_STR:
	case K_ENUM:
		sb_printf(b, "`\"");
		sb_md(b, k->def_str);
		sb_printf(b, "\"`");
		break;
	case K_PATHS:
		sb_printf(b, "`[]`");
		break;
	}
}

static void doc_range(struct sbuf *b, const struct kvr_key *k)
{
	const char *e;
	char s[64];

	switch (k->kind) {
	case K_U32:
	case K_SIZE:
	case K_MODE:
		sb_printf(b, "%s", cfg_fmt_range(k, s, sizeof(s)));
		break;
	case K_BOOL:
		sb_printf(b, "`true`, `false`");
		break;
	case K_ENUM:
		for (unsigned i = 0; (e = cfg_enum_value(k, i)); i++)
			sb_printf(b, "%s`%s%s%s`", i ? ", " : "", *e ? "" : "\"", e, *e ? "" : "\"");
		break;
	case K_STR:
		sb_printf(b, "at most %zu bytes", k->size - 1);
		if (k->flags & F_ABS)
			sb_printf(b, ", absolute path");
		if (k->flags & F_ABS_OR_EMPTY)
			sb_printf(b, ", absolute path or `\"\"`");
		break;
	case K_PATHS:
		sb_printf(b, "0..%" PRIu32 " %s of at most %zu bytes, distinct", k->max_items,
			  k->flags & F_ADDR ? "`host:port` addresses" : "absolute paths", k->size - 1);
		break;
	}
}

char *kvr_config_doc_markdown(void)
{
	const struct kvr_preset *p;
	struct sbuf b = { 0 };

	sb_printf(&b,
		  "# kvring configuration\n"
		  "\n"
		  "<!-- Generated from the key table in config/config.c: do not edit. Regenerate with\n"
		  "     BUILDDIR/tests/config/gen-config-doc > docs/config.md -->\n"
		  "\n"
		  "kvringd reads one JSON object with the sections below. Every key is optional: a missing key\n"
		  "takes its default, so `{}` is a complete configuration. Parsing is strict: an unknown or\n"
		  "duplicate key, a value of the wrong type, a number out of range or a fractional/negative\n"
		  "number for an integer key, a string that is too long or not valid UTF-8 and inconsistent\n"
		  "values (see the checks at the end) all refuse the file with one line naming the key and the\n"
		  "reason, for example\n"
		  "\n"
		  "    $.supervisor.restart_backoff_max_ms: out of range: 0 (must be 1..600000)\n"
		  "\n"
		  "Nothing is silently changed or clamped. `kvringd --check-config` prints the effective\n"
		  "configuration: every key, defaults filled in, sizes as integers of bytes.\n"
		  "\n"
		  "Types: `uint32` is a JSON integer; `size` is bytes, a JSON integer or a string with a binary\n"
		  "unit (`\"512MiB\"`, `\"64GiB\"`; units B, KiB, MiB, GiB, TiB, PiB), at most 1 PiB; `mode` is a\n"
		  "string of 3 or 4 octal digits (`\"0600\"`); `enum` is one of the listed strings; `string`\n"
		  "is UTF-8 (a byte that is not is refused with its offset, `\\u0000` is refused).\n"
		  "\n"
		  "The file may start with a UTF-8 byte-order mark (bytes EF BB BF, which some editors write):\n"
		  "it is skipped, and line and column numbers in a reason count from after it. Anywhere else\n"
		  "(a second one, one inside the object) it is refused as not valid JSON, with its position.\n"
		  "\n"
		  "An integer key takes a number whose text is an integer: `2048`, `2048.0` and `1e3` are;\n"
		  "`0.5`, `1e-400` (which a double reads as 0) and `1024.0000000000001` (which a double reads as\n"
		  "1024) are refused as fractional, whatever the double they round to. A size string has no\n"
		  "fraction (`\"1.5GiB\"` is refused: write `\"1536MiB\"`).\n");
	for (size_t s = 0; s < cfg_n_sections; s++) {
		const char *name = cfg_sections[s].name;
		size_t nlen = strlen(name);

		sb_printf(&b, "\n## %s\n\n%s\n\n", name, cfg_sections[s].doc);
		sb_printf(&b, "| key | type | default | range / values | description |\n");
		sb_printf(&b, "| --- | --- | --- | --- | --- |\n");
		for (size_t i = 0; i < cfg_n_keys; i++) {
			const struct kvr_key *k = &cfg_keys[i];

			if (section_len(k->path) != nlen || strncmp(k->path, name, nlen))
				continue;
			sb_printf(&b, "| `%s` | ", k->path);
			doc_type(&b, k);
			sb_printf(&b, " | ");
			doc_default(&b, k);
			sb_printf(&b, " | ");
			doc_range(&b, k);
			sb_printf(&b, " | ");
			sb_md(&b, k->doc);
			sb_printf(&b, " |\n");
		}
	}
	sb_printf(&b, "\n## Model presets\n\n");
	sb_printf(&b, "From kv/presets.c (each model's config.json). kv_heads counts all TP ranks; MLA head_dim is "
		  "the latent width.\n\n");
	sb_printf(&b, "| preset | model_id | layers | kv_heads | head_dim | dtype_bytes | attention |\n");
	sb_printf(&b, "| --- | --- | --- | --- | --- | --- | --- |\n");
	for (unsigned i = 0; (p = kvr_preset_at(i)); i++)
		sb_printf(&b, "| `%s` | %s | %" PRIu32 " | %" PRIu32 " | %" PRIu32 " | %" PRIu32 " | %s |\n", p->name,
			  p->hf_id, p->layers, p->kv_heads_total, p->head_dim, p->dtype_bytes,
			  cfg_enum_value(cfg_key_find("model", "attention"),
					 p->attention == KVR_ATTN_MLA ? CFG_ATTN_MLA : CFG_ATTN_MHA));
	sb_printf(&b, "\n## Checks across keys\n\nMade after every key has parsed, in this order:\n\n");
	for (size_t i = 0; i < cfg_n_checks_doc; i++)
		sb_printf(&b, "%zu. %s\n", i + 1, cfg_checks_doc[i]);
	return sb_finish(&b);
}
