/* json_writer: a streaming JSON writer with exact 64-bit integers (contract in json_writer.h). */
#include "json_writer.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>

void kvr_jw_init(struct kvr_jw *w, FILE *f, enum kvr_jw_layout layout)
{
	*w = (struct kvr_jw){.f = f, .layout = layout};
	w->first[0] = true;
}

int kvr_jw_finish(struct kvr_jw *w)
{
	if (w->bad || w->depth != 0)
		return -EINVAL;
	return ferror(w->f) ? -EIO : 0;
}

static void indent(struct kvr_jw *w, int depth)
{
	for (int i = 0; i < depth; i++)
		fputs(w->layout == KVR_JW_TABS ? "\t" : "  ", w->f);
}

/* What goes before a value: the separator, the line break and indent, the key. */
static bool sep(struct kvr_jw *w, const char *key)
{
	if (w->bad)
		return false;
	bool first = w->first[w->depth];
	w->first[w->depth] = false;
	bool in_array = w->depth > 0 && w->close[w->depth] == ']';
	switch (w->layout) {
	case KVR_JW_COMPACT:
		if (!first)
			fputc(',', w->f);
		break;
	case KVR_JW_INDENT:
		if (!first)
			fputc(',', w->f);
		if (w->depth > 0) {
			fputc('\n', w->f);
			indent(w, w->depth);
		}
		break;
	case KVR_JW_TABS:
		if (in_array) {
			if (!first)
				fputs(", ", w->f);
		} else if (w->depth > 0) {
			if (!first)
				fputs(",\n", w->f);
			indent(w, w->depth);
		}
		break;
	}
	if (key)
		fprintf(w->f, "\"%s\":%s", key,
			w->layout == KVR_JW_INDENT ? " " : w->layout == KVR_JW_TABS ? "\t" : "");
	return true;
}

static void open_container(struct kvr_jw *w, const char *key, char open_ch, char close_ch)
{
	if (!sep(w, key))
		return;
	if (w->depth >= KVR_JW_MAX_DEPTH) {
		w->bad = true;
		return;
	}
	fputc(open_ch, w->f);
	w->depth++;
	w->first[w->depth] = true;
	w->close[w->depth] = close_ch;
	if (w->layout == KVR_JW_TABS && open_ch == '{')
		fputc('\n', w->f);
}

void kvr_jw_object(struct kvr_jw *w, const char *key)
{
	open_container(w, key, '{', '}');
}

void kvr_jw_array(struct kvr_jw *w, const char *key)
{
	open_container(w, key, '[', ']');
}

void kvr_jw_end(struct kvr_jw *w)
{
	if (w->bad)
		return;
	if (w->depth == 0) {
		w->bad = true;
		return;
	}
	bool empty = w->first[w->depth];
	char ch = w->close[w->depth];
	w->depth--;
	if (w->layout == KVR_JW_INDENT && !empty) {
		fputc('\n', w->f);
		indent(w, w->depth);
	} else if (w->layout == KVR_JW_TABS && ch == '}') {
		if (!empty)
			fputc('\n', w->f);
		indent(w, w->depth);
	}
	fputc(ch, w->f);
}

void kvr_jw_str(struct kvr_jw *w, const char *key, const char *v)
{
	if (!sep(w, key))
		return;
	fputc('"', w->f);
	for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
		if (*p == '"' || *p == '\\')
			fprintf(w->f, "\\%c", *p);
		else if (*p < 0x20 || *p >= 0x7f)
			fprintf(w->f, "\\u%04x", *p);
		else
			fputc(*p, w->f);
	}
	fputc('"', w->f);
}

void kvr_jw_u64(struct kvr_jw *w, const char *key, uint64_t v)
{
	if (sep(w, key))
		fprintf(w->f, "%" PRIu64, v);
}

void kvr_jw_i64(struct kvr_jw *w, const char *key, int64_t v)
{
	if (sep(w, key))
		fprintf(w->f, "%" PRId64, v);
}

void kvr_jw_bool(struct kvr_jw *w, const char *key, bool v)
{
	if (sep(w, key))
		fputs(v ? "true" : "false", w->f);
}

void kvr_jw_null(struct kvr_jw *w, const char *key)
{
	if (sep(w, key))
		fputs("null", w->f);
}

void kvr_jw_secs(struct kvr_jw *w, const char *key, uint64_t ns)
{
	if (sep(w, key))
		fprintf(w->f, "%" PRIu64 ".%09" PRIu64, ns / 1000000000u, ns % 1000000000u);
}

void kvr_jw_fixed3(struct kvr_jw *w, const char *key, double v)
{
	if (!isfinite(v))
		kvr_jw_null(w, key);
	else if (sep(w, key))
		fprintf(w->f, "%.3f", v);
}

void kvr_jw_double(struct kvr_jw *w, const char *key, double v)
{
	if (!isfinite(v)) {
		kvr_jw_null(w, key);
		return;
	}
	if (!sep(w, key))
		return;
	/* cJSON's print_number: 15 significant digits unless they do not read back (within
	 * its compare_double tolerance), then 17 */
	char buf[32];
	snprintf(buf, sizeof(buf), "%1.15g", v);
	double back;
	double max = fabs(v);
	if (sscanf(buf, "%lg", &back) != 1 || fabs(back - v) > (fabs(back) > max ? fabs(back) : max) * DBL_EPSILON)
		snprintf(buf, sizeof(buf), "%1.17g", v);
	fputs(buf, w->f);
}
