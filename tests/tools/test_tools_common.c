/* tools/common: the number formats, and the JSON writer against cJSON_Print byte for byte. */
#include <criterion/criterion.h>

#include <cJSON.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmt.h"
#include "json_writer.h"

/* ---- fmt ------------------------------------------------------------------------------ */

struct case_u {
	uint64_t v;
	const char *want;
};

TestSuite(tools_fmt);

Test(tools_fmt, bytes)
{
	static const struct case_u t[] = {
		{0, "0 B"}, {1023, "1023 B"}, {1024, "1.0 KiB"}, {160 * 1024, "160.0 KiB"},
		{1048524, "1023.9 KiB"}, {1048525, "1.0 MiB"}, {3ull << 30, "3.0 GiB"},
		{(1ull << 40) - (1ull << 29), "1023.5 GiB"}, {UINT64_MAX, "16.0 EiB"},
	};
	char b[16];
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		cr_expect_str_eq(kvr_fmt_bytes(t[i].v, b, sizeof(b)), t[i].want, "%llu", (unsigned long long)t[i].v);
		cr_expect_leq(strlen(b), 10);
	}
}

Test(tools_fmt, duration)
{
	static const struct case_u t[] = {
		{0, "0.00s"}, {250000000ull, "0.25s"}, {9999999999ull, "9.99s"}, {12345678901ull, "12.3s"},
		{245ull * 1000000000, "4m05s"}, {(3 * 3600 + 7 * 60 + 59) * 1000000000ull, "3h07m"},
		{100 * 3600 * 1000000000ull, "4d"}, {UINT64_MAX, "213503d"},
	};
	char b[16];
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		cr_expect_str_eq(kvr_fmt_duration(t[i].v, b, sizeof(b)), t[i].want, "%llu", (unsigned long long)t[i].v);
		cr_expect_leq(strlen(b), 7);
	}
}

Test(tools_fmt, ns_and_rate)
{
	char b[32];
	cr_expect_str_eq(kvr_fmt_ns(950, b, sizeof(b)), "950 ns");
	cr_expect_str_eq(kvr_fmt_ns(4500, b, sizeof(b)), "4.5 us");
	cr_expect_str_eq(kvr_fmt_ns(6.78e6, b, sizeof(b)), "6.78 ms");
	cr_expect_str_eq(kvr_fmt_ns(1.2345e9, b, sizeof(b)), "1.234 s");
	cr_expect_str_eq(kvr_fmt_rate(950, b, sizeof(b)), "950");
	cr_expect_str_eq(kvr_fmt_rate(12345, b, sizeof(b)), "12.3k");
	cr_expect_str_eq(kvr_fmt_rate(999.9e6, b, sizeof(b)), "999.9M");
	cr_expect_str_eq(kvr_fmt_rate(12e9, b, sizeof(b)), "12G");
	cr_expect_str_eq(kvr_fmt_rate(1e12, b, sizeof(b)), ">999G");
	cr_expect_float_eq(kvr_fmt_mib(3ull << 20), 3.0, 1e-12);
	cr_expect_float_eq(kvr_fmt_gib(5ull << 29), 2.5, 1e-12);
}

/* ---- json_writer ---------------------------------------------------------------------- */

TestSuite(tools_json);

struct doc {
	char *text;
	size_t len;
	FILE *f;
	struct kvr_jw w;
};

static void doc_open(struct doc *d, enum kvr_jw_layout layout)
{
	d->text = NULL;
	d->f = open_memstream(&d->text, &d->len);
	cr_assert_not_null(d->f);
	kvr_jw_init(&d->w, d->f, layout);
}

static int doc_close(struct doc *d)
{
	int rc = kvr_jw_finish(&d->w);
	cr_assert_eq(fclose(d->f), 0);
	return rc;
}

/* One document written twice, by cJSON and by the writer: nested objects and arrays, empty
 * ones, strings, bools, nulls and doubles of every magnitude. */
static void both(cJSON *root, struct kvr_jw *w, const double *nums, size_t n)
{
	kvr_jw_object(w, NULL);
	cJSON_AddStringToObject(root, "tool", "kvring-bench");
	kvr_jw_str(w, "tool", "kvring-bench");
	cJSON_AddObjectToObject(root, "empty");
	kvr_jw_object(w, "empty");
	kvr_jw_end(w);
	cJSON_AddArrayToObject(root, "none");
	kvr_jw_array(w, "none");
	kvr_jw_end(w);
	cJSON *a = cJSON_AddArrayToObject(root, "nums");
	kvr_jw_array(w, "nums");
	for (size_t i = 0; i < n; i++) {
		cJSON_AddItemToArray(a, cJSON_CreateNumber(nums[i]));
		kvr_jw_double(w, NULL, nums[i]);
	}
	cJSON *o = cJSON_CreateObject();
	cJSON_AddItemToArray(a, o);
	kvr_jw_object(w, NULL);
	cJSON_AddBoolToObject(o, "t", 1);
	kvr_jw_bool(w, "t", true);
	cJSON *in = cJSON_AddObjectToObject(o, "in");
	kvr_jw_object(w, "in");
	cJSON_AddNullToObject(in, "n");
	kvr_jw_null(w, "n");
	kvr_jw_end(w);
	kvr_jw_end(w);
	kvr_jw_end(w);
	cJSON *s = cJSON_AddObjectToObject(root, "s");
	kvr_jw_object(w, "s");
	cJSON_AddStringToObject(s, "q", "a \"quoted\" \\ path");
	kvr_jw_str(w, "q", "a \"quoted\" \\ path");
	cJSON_AddNumberToObject(s, "u", 42);
	kvr_jw_u64(w, "u", 42);
	cJSON_AddFalseToObject(s, "f");
	kvr_jw_bool(w, "f", false);
	kvr_jw_end(w);
	kvr_jw_end(w);
}

static const double nums[] = {0, -0.0, 1, -1, 0.5, 1.5, 0.1, 1.0 / 3, 2.0 / 3, 0.85, 1.1, 12345.678,
			      1e15, 1e16, 123456789012345678.0, 1e-7, 5e-324, DBL_MAX, -DBL_MAX, 3000000000.0,
			      NAN, INFINITY};

Test(tools_json, tabs_is_cjson_print)
{
	for (int layout = 0; layout < 2; layout++) {
		cJSON *root = cJSON_CreateObject();
		struct doc d;
		doc_open(&d, layout ? KVR_JW_TABS : KVR_JW_COMPACT);
		both(root, &d.w, nums, sizeof(nums) / sizeof(nums[0]));
		cr_assert_eq(doc_close(&d), 0);
		char *want = layout ? cJSON_Print(root) : cJSON_PrintUnformatted(root);
		cr_expect_str_eq(d.text, want);
		free(want);
		free(d.text);
		cJSON_Delete(root);
	}
}

Test(tools_json, doubles_as_cjson_random)
{
	uint64_t x = 0x9e3779b97f4a7c15ull; /* xorshift64 from a fixed seed: the same values every run */
	enum { N = 20000 };
	double *v = malloc(N * sizeof(*v));
	cr_assert_not_null(v);
	for (int i = 0; i < N; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		switch (i % 3) {
		case 0: memcpy(&v[i], &x, sizeof(x)); break;               /* any bit pattern */
		case 1: v[i] = (double)x / (double)(1 + (x >> 40)); break; /* ratios */
		default: v[i] = (double)(x >> (x % 64)); break;            /* counts */
		}
	}
	cJSON *root = cJSON_CreateObject();
	struct doc d;
	doc_open(&d, KVR_JW_COMPACT);
	both(root, &d.w, v, N);
	cr_assert_eq(doc_close(&d), 0);
	char *want = cJSON_PrintUnformatted(root);
	cr_expect(!strcmp(d.text, want), "the writer's doubles differ from cJSON's");
	free(want);
	free(d.text);
	cJSON_Delete(root);
	free(v);
}

/* What cJSON cannot: every u64 exact (cJSON prints 2^64-1 as 1.8446744073709552e+19). */
Test(tools_json, exact_integers_and_seconds)
{
	struct doc d;
	doc_open(&d, KVR_JW_COMPACT);
	kvr_jw_object(&d.w, NULL);
	kvr_jw_u64(&d.w, "max", UINT64_MAX);
	kvr_jw_u64(&d.w, "odd", (1ull << 53) + 1);
	kvr_jw_i64(&d.w, "min", INT64_MIN);
	kvr_jw_secs(&d.w, "s", 12000000250ull);
	kvr_jw_secs(&d.w, "smax", UINT64_MAX);
	kvr_jw_fixed3(&d.w, "pct", 12.3456);
	kvr_jw_fixed3(&d.w, "nan", NAN);
	kvr_jw_end(&d.w);
	cr_assert_eq(doc_close(&d), 0);
	cr_expect_str_eq(d.text, "{\"max\":18446744073709551615,\"odd\":9007199254740993,\"min\":-9223372036854775808,"
				 "\"s\":12.000000250,\"smax\":18446744073.709551615,\"pct\":12.346,\"nan\":null}");
	free(d.text);
}

Test(tools_json, indent_layout_and_escapes)
{
	struct doc d;
	doc_open(&d, KVR_JW_INDENT);
	kvr_jw_object(&d.w, NULL);
	kvr_jw_str(&d.w, "name", "a\"b\\c\nd\x7f\xc3\xa9");
	kvr_jw_array(&d.w, "empty");
	kvr_jw_end(&d.w);
	kvr_jw_array(&d.w, "list");
	kvr_jw_u64(&d.w, NULL, 1);
	kvr_jw_object(&d.w, NULL);
	kvr_jw_bool(&d.w, "x", true);
	kvr_jw_end(&d.w);
	kvr_jw_end(&d.w);
	kvr_jw_end(&d.w);
	cr_assert_eq(doc_close(&d), 0);
	cr_expect_str_eq(d.text, "{\n"
				 "  \"name\": \"a\\\"b\\\\c\\u000ad\\u007f\\u00c3\\u00a9\",\n"
				 "  \"empty\": [],\n"
				 "  \"list\": [\n"
				 "    1,\n"
				 "    {\n"
				 "      \"x\": true\n"
				 "    }\n"
				 "  ]\n"
				 "}");
	free(d.text);
}

Test(tools_json, nesting_errors)
{
	struct doc d;
	doc_open(&d, KVR_JW_COMPACT);
	for (int i = 0; i <= KVR_JW_MAX_DEPTH; i++)
		kvr_jw_array(&d.w, NULL);
	cr_expect_eq(doc_close(&d), -EINVAL, "one level too deep");
	cr_expect_eq(strlen(d.text), KVR_JW_MAX_DEPTH, "nothing written past the limit: %s", d.text);
	free(d.text);

	doc_open(&d, KVR_JW_COMPACT);
	kvr_jw_object(&d.w, NULL);
	cr_expect_eq(doc_close(&d), -EINVAL, "left open");
	free(d.text);

	doc_open(&d, KVR_JW_COMPACT);
	kvr_jw_object(&d.w, NULL);
	kvr_jw_end(&d.w);
	kvr_jw_end(&d.w);
	cr_expect_eq(doc_close(&d), -EINVAL, "closed twice");
	cr_expect_str_eq(d.text, "{}");
	free(d.text);
}
