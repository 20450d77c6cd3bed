/* Unit tests of resp.c: RESP2 replies framed whole or streamed, fed in every split, malformed streams refused. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "resp.h"

/* What the framer handed over: the replies, in order. */
struct got {
	unsigned n;
	char raw[16][256];
	size_t len[16];
	bool streamed[16];
	/* streaming */
	bool stream;         /* bulk_begin's answer */
	bool drop;           /* bulk_dest returns NULL */
	size_t max_room;     /* bulk_dest lowers room to this (0: as offered) */
	char sink[4096];
	size_t sink_n, wrote;
	uint64_t begun_len;
	int stop_after;      /* reply returns 1 after this many (0: never) */
};

static bool g_begin(void *ctx, uint64_t len)
{
	struct got *g = ctx;
	g->begun_len = len;
	g->sink_n = 0;
	return g->stream;
}

static void *g_dest(void *ctx, size_t *room)
{
	struct got *g = ctx;
	if (g->max_room && *room > g->max_room)
		*room = g->max_room;
	return g->drop ? NULL : g->sink + g->sink_n;
}

static void g_wrote(void *ctx, size_t n)
{
	struct got *g = ctx;
	if (!g->drop)
		g->sink_n += n;
	g->wrote += n;
}

static int g_reply(void *ctx, const char *raw, size_t len, bool streamed)
{
	struct got *g = ctx;
	cr_assert_lt(g->n, 16);
	if (raw) {
		cr_assert_leq(len, sizeof(g->raw[0]));
		memcpy(g->raw[g->n], raw, len);
	} else {
		cr_assert(streamed, "only a streamed reply comes without its bytes");
	}
	g->len[g->n] = len;
	g->streamed[g->n] = streamed;
	g->n++;
	return g->stop_after && (int)g->n == g->stop_after ? 1 : 0;
}

static const struct kvr_resp_ops ops = {g_begin, g_dest, g_wrote, g_reply};

static struct kvr_resp p;
static struct got g;

static void setup(void)
{
	memset(&g, 0, sizeof(g));
	kvr_resp_init(&p, &ops, &g);
}

static void teardown(void)
{
	kvr_resp_fini(&p);
}

TestSuite(resp, .init = setup, .fini = teardown);

/* Small replies of every type a cluster client sees, one after the other. */
static const char *const replies[] = {
	"+OK\r\n",
	":12\r\n",
	":-3\r\n",
	"-MOVED 3999 127.0.0.1:7001\r\n",
	"$-1\r\n",
	"$0\r\n\r\n",
	"$5\r\nab\r\nc\r\n", /* a CRLF inside a bulk is data */
	"*-1\r\n",
	"*0\r\n",
	/* CLUSTER SLOTS: arrays in arrays */
	"*2\r\n*3\r\n:0\r\n:5460\r\n*3\r\n$9\r\n127.0.0.1\r\n:7000\r\n$4\r\nnode\r\n"
	"*4\r\n:5461\r\n:16383\r\n*2\r\n$9\r\n127.0.0.1\r\n:7001\r\n*2\r\n$0\r\n\r\n:7004\r\n",
	"*3\r\n*0\r\n$-1\r\n*1\r\n+x\r\n",
};
#define N_REPLIES (sizeof(replies) / sizeof(replies[0]))

static void expect_all(void)
{
	cr_assert_eq(g.n, N_REPLIES, "%u replies framed", g.n);
	for (unsigned i = 0; i < N_REPLIES; i++) {
		cr_assert_not(g.streamed[i]);
		cr_assert_eq(g.len[i], strlen(replies[i]), "reply %u: %zu bytes", i, g.len[i]);
		cr_assert_eq(memcmp(g.raw[i], replies[i], g.len[i]), 0, "reply %u: its bytes", i);
	}
}

Test(resp, small_replies_are_handed_over_whole_and_in_order)
{
	char all[1024] = "";
	for (unsigned i = 0; i < N_REPLIES; i++)
		strcat(all, replies[i]);
	cr_assert_eq(kvr_resp_feed(&p, all, strlen(all)), 0);
	expect_all();
}

Test(resp, every_split_of_the_stream_frames_the_same)
{
	char all[1024] = "";
	for (unsigned i = 0; i < N_REPLIES; i++)
		strcat(all, replies[i]);
	size_t len = strlen(all);
	for (size_t cut = 1; cut < len; cut++) {
		memset(&g, 0, sizeof(g));
		kvr_resp_reset(&p);
		cr_assert_eq(kvr_resp_feed(&p, all, cut), 0);
		cr_assert_eq(kvr_resp_feed(&p, all + cut, len - cut), 0);
		expect_all();
	}
	/* one byte at a time */
	memset(&g, 0, sizeof(g));
	kvr_resp_reset(&p);
	for (size_t i = 0; i < len; i++)
		cr_assert_eq(kvr_resp_feed(&p, all + i, 1), 0);
	expect_all();
}

Test(resp, a_streamed_bulk_lands_where_the_caller_says_and_the_next_reply_follows)
{
	g.stream = true;
	g.max_room = 7; /* the caller takes at most 7 bytes at a time */
	char value[3000];
	for (unsigned i = 0; i < sizeof(value); i++)
		value[i] = (char)(i * 31 + 7);
	char in[3100];
	int h = snprintf(in, sizeof(in), "$%zu\r\n", sizeof(value));
	memcpy(in + h, value, sizeof(value));
	memcpy(in + h + sizeof(value), "\r\n+OK\r\n", 7);
	size_t len = (size_t)h + sizeof(value) + 7;
	/* in two pieces, split inside the value */
	cr_assert_eq(kvr_resp_feed(&p, in, 1000), 0);
	cr_assert_eq(g.n, 0);
	cr_assert_eq(kvr_resp_stream_left(&p), sizeof(value) - (1000 - (size_t)h));
	cr_assert_eq(kvr_resp_feed(&p, in + 1000, len - 1000), 0);
	cr_assert_eq(g.begun_len, sizeof(value));
	cr_assert_eq(g.n, 2, "the value, then +OK (no bulk string: captured)");
	cr_assert_eq(g.sink_n, sizeof(value));
	cr_assert_eq(memcmp(g.sink, value, sizeof(value)), 0, "every byte where bulk_dest said");
	cr_assert(g.streamed[0]);
	cr_assert_eq(g.len[0], sizeof(value));
	cr_assert_not(g.streamed[1]);
	cr_assert_eq(memcmp(g.raw[1], "+OK\r\n", 5), 0);
	cr_assert_eq(kvr_resp_stream_left(&p), 0);
}

Test(resp, the_connection_may_read_a_streamed_body_itself)
{
	g.stream = true;
	cr_assert_eq(kvr_resp_feed(&p, "$10\r\n0123", 9), 0);
	cr_assert_eq(kvr_resp_stream_left(&p), 6);
	/* the connection read 6 bytes straight into bulk_dest's memory */
	size_t room = 6;
	char *d = g_dest(&g, &room);
	memcpy(d, "456789", 6);
	kvr_resp_streamed(&p, 6);
	cr_assert_eq(kvr_resp_stream_left(&p), 0);
	cr_assert_eq(g.n, 0, "the CRLF is still to come");
	cr_assert_eq(kvr_resp_feed(&p, "\r\n:1\r\n", 6), 0);
	cr_assert_eq(g.n, 2);
	cr_assert(g.streamed[0]);
	cr_assert_eq(g.sink_n, 10);
	cr_assert_eq(memcmp(g.sink, "0123456789", 10), 0);
	cr_assert_not(g.streamed[1]);
	cr_assert_eq(memcmp(g.raw[1], ":1\r\n", 4), 0);
}

Test(resp, a_dropped_stream_is_consumed_without_a_copy)
{
	g.stream = true;
	g.drop = true;
	static const char in[] = "$6\r\nabcdef\r\n$-1\r\n";
	cr_assert_eq(kvr_resp_feed(&p, in, sizeof(in) - 1), 0);
	cr_assert_eq(g.n, 2);
	cr_assert(g.streamed[0]);
	cr_assert_eq(g.len[0], 6);
	cr_assert_eq(g.wrote, 6);
	cr_assert_eq(g.sink_n, 0);
	cr_assert_not(g.streamed[1], "a nil is no bulk body: captured");
}

Test(resp, bulk_strings_inside_arrays_are_never_streamed)
{
	g.stream = true;
	static const char in[] = "*1\r\n$3\r\nabc\r\n";
	cr_assert_eq(kvr_resp_feed(&p, in, sizeof(in) - 1), 0);
	cr_assert_eq(g.n, 1);
	cr_assert_not(g.streamed[0]);
	cr_assert_eq(g.begun_len, 0, "bulk_begin is asked about top-level bulks only");
}

Test(resp, a_reply_callback_can_stop_the_feed)
{
	g.stop_after = 1;
	cr_assert_eq(kvr_resp_feed(&p, "+A\r\n+B\r\n", 8), 1);
	cr_assert_eq(g.n, 1, "nothing after the reply that stopped it");
}

static int feed_str(const char *s)
{
	kvr_resp_reset(&p);
	memset(&g, 0, sizeof(g));
	return kvr_resp_feed(&p, s, strlen(s));
}

Test(resp, malformed_streams_are_refused)
{
	cr_assert_eq(feed_str("x\r\n"), -EPROTO, "unknown type byte");
	cr_assert_eq(feed_str("+OK\n"), -EPROTO, "LF without CR");
	cr_assert_eq(feed_str("\r\n"), -EPROTO, "empty line");
	cr_assert_eq(feed_str(":12a\r\n"), -EPROTO, "integer with a letter");
	cr_assert_eq(feed_str(":\r\n"), -EPROTO, "integer without digits");
	cr_assert_eq(feed_str("$abc\r\n"), -EPROTO, "bulk length not a number");
	cr_assert_eq(feed_str("$-2\r\n"), -EPROTO, "bulk length below -1");
	cr_assert_eq(feed_str("$3\r\nabcXY"), -EPROTO, "bulk without its CRLF");
	cr_assert_eq(feed_str("*-5\r\n"), -EPROTO, "array count below -1");
	cr_assert_eq(feed_str("$99999999999999999999\r\n"), -EPROTO, "length overflow");
	cr_assert_eq(feed_str("*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n"), -EPROTO,
		     "nested deeper than KVR_RESP_DEPTH");
	cr_assert_eq(feed_str("*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n"), 0, "8 levels are fine");
	cr_assert_eq(g.n, 1);
	g.stream = true;
	kvr_resp_reset(&p);
	cr_assert_eq(kvr_resp_feed(&p, "$2\r\nabXY", 8), -EPROTO, "streamed bulk without its CRLF");
	cr_assert_eq(kvr_resp_feed(&p, "+OK\r\n", 5), -EPROTO, "a broken framer stays broken until reset");
	/* a line longer than KVR_RESP_LINE_MAX */
	kvr_resp_reset(&p);
	char *big = malloc(KVR_RESP_LINE_MAX + 16);
	big[0] = '-';
	memset(big + 1, 'e', KVR_RESP_LINE_MAX + 8);
	cr_assert_eq(kvr_resp_feed(&p, big, KVR_RESP_LINE_MAX + 9), -EPROTO);
	free(big);
	/* a captured bulk over KVR_RESP_CAPTURE_MAX */
	g.stream = false;
	kvr_resp_reset(&p);
	char hdr[32];
	int h = snprintf(hdr, sizeof(hdr), "$%u\r\n", KVR_RESP_CAPTURE_MAX + 1);
	cr_assert_eq(kvr_resp_feed(&p, hdr, (size_t)h), -EPROTO);
}
