/* resp: RESP2 reply framing — captured small replies, streamed top-level bulk strings (format in resp.h). */
#include "resp.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

enum { ST_LINE = 0, ST_BODY = 1, ST_STREAM = 2 };

void kvr_resp_init(struct kvr_resp *p, const struct kvr_resp_ops *ops, void *ctx)
{
	memset(p, 0, sizeof(*p));
	p->ops = ops;
	p->ctx = ctx;
}

void kvr_resp_reset(struct kvr_resp *p)
{
	p->cap_n = p->line_at = 0;
	p->body_left = p->stream_len = 0;
	p->depth = 0;
	p->st = ST_LINE;
	p->streaming = p->broken = false;
}

void kvr_resp_fini(struct kvr_resp *p)
{
	free(p->cap);
	p->cap = NULL;
	p->cap_size = 0;
	kvr_resp_reset(p);
}

static int broken(struct kvr_resp *p)
{
	p->broken = true;
	return -EPROTO;
}

static int append(struct kvr_resp *p, const char *b, size_t n)
{
	if (p->cap_n + n > KVR_RESP_CAPTURE_MAX)
		return broken(p);
	if (p->cap_n + n > p->cap_size) {
		size_t sz = p->cap_size ? p->cap_size : 4096;
		while (sz < p->cap_n + n)
			sz *= 2;
		char *c = realloc(p->cap, sz);
		if (!c)
			return -ENOMEM;
		p->cap = c;
		p->cap_size = sz;
	}
	memcpy(p->cap + p->cap_n, b, n);
	p->cap_n += n;
	return 0;
}

/* A decimal integer of line[0..len) (an optional '-', then digits only). */
static bool parse_int(const char *s, size_t len, int64_t *ret)
{
	bool neg = len && s[0] == '-';
	size_t i = neg;
	if (i == len || len - i > 18)
		return false;
	int64_t v = 0;
	for (; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return false;
		v = v * 10 + (s[i] - '0');
	}
	*ret = neg ? -v : v;
	return true;
}

/* One element ended: a reply when it was the top level, else one less of its array. */
static int element_done(struct kvr_resp *p)
{
	for (;;) {
		if (p->depth == 0) {
			bool streamed = p->streaming;
			size_t len = streamed ? (size_t)p->stream_len : p->cap_n;
			p->streaming = false;
			p->cap_n = p->line_at = 0;
			p->st = ST_LINE;
			return p->ops->reply(p->ctx, streamed ? NULL : p->cap, len, streamed);
		}
		if (--p->left[p->depth - 1] > 0)
			break;
		p->depth--; /* the array is complete: one element of its parent */
	}
	p->line_at = p->cap_n;
	p->st = ST_LINE;
	return 0;
}

/* The type line cap[line_at..cap_n) (CRLF included) is complete. */
static int line_done(struct kvr_resp *p)
{
	const char *l = p->cap + p->line_at;
	size_t n = p->cap_n - p->line_at;
	if (n < 3 || l[n - 2] != '\r')
		return broken(p);
	n -= 2;
	int64_t v;
	switch (l[0]) {
	case '+':
	case '-':
		return element_done(p);
	case ':':
		return parse_int(l + 1, n - 1, &v) ? element_done(p) : broken(p);
	case '$':
		if (!parse_int(l + 1, n - 1, &v) || v < -1)
			return broken(p);
		if (v == -1)
			return element_done(p); /* nil */
		p->body_left = (uint64_t)v + 2;
		if (p->depth == 0 && p->ops->bulk_begin(p->ctx, (uint64_t)v)) {
			p->streaming = true;
			p->stream_len = (uint64_t)v;
			p->cap_n = p->line_at; /* the line is not part of what the caller gets */
			p->st = ST_STREAM;
		} else {
			if (p->cap_n + p->body_left > KVR_RESP_CAPTURE_MAX)
				return broken(p);
			p->st = ST_BODY;
		}
		return 0;
	case '*':
		if (!parse_int(l + 1, n - 1, &v) || v < -1)
			return broken(p);
		if (v <= 0)
			return element_done(p); /* nil or empty array */
		if (p->depth == KVR_RESP_DEPTH)
			return broken(p);
		p->left[p->depth++] = v;
		p->line_at = p->cap_n;
		return 0;
	default:
		return broken(p);
	}
}

uint64_t kvr_resp_stream_left(const struct kvr_resp *p)
{
	return p->st == ST_STREAM && p->body_left > 2 ? p->body_left - 2 : 0;
}

void kvr_resp_streamed(struct kvr_resp *p, size_t n)
{
	p->body_left -= n;
	p->ops->bulk_wrote(p->ctx, n);
}

int kvr_resp_feed(struct kvr_resp *p, const char *buf, size_t len)
{
	size_t i = 0;
	int rc;
	if (p->broken)
		return -EPROTO;
	while (i < len) {
		switch (p->st) {
		case ST_LINE: {
			const char *nl = memchr(buf + i, '\n', len - i);
			size_t take = nl ? (size_t)(nl - (buf + i)) + 1 : len - i;
			if (p->cap_n - p->line_at + take > KVR_RESP_LINE_MAX)
				return broken(p);
			if ((rc = append(p, buf + i, take)))
				return rc;
			i += take;
			if (nl && (rc = line_done(p)))
				return rc;
			break;
		}
		case ST_BODY: {
			size_t take = len - i < p->body_left ? len - i : (size_t)p->body_left;
			if ((rc = append(p, buf + i, take)))
				return rc;
			i += take;
			p->body_left -= take;
			if (p->body_left)
				break;
			if (p->cap[p->cap_n - 2] != '\r' || p->cap[p->cap_n - 1] != '\n')
				return broken(p);
			if ((rc = element_done(p)))
				return rc;
			break;
		}
		case ST_STREAM: {
			uint64_t data = kvr_resp_stream_left(p);
			if (data) {
				size_t room = len - i < data ? len - i : (size_t)data;
				void *dst = p->ops->bulk_dest(p->ctx, &room);
				if (!room)
					return broken(p); /* bulk_dest must take at least one byte */
				if (dst)
					memcpy(dst, buf + i, room);
				i += room;
				kvr_resp_streamed(p, room);
				break;
			}
			/* the CRLF after the body */
			if (buf[i] != (p->body_left == 2 ? '\r' : '\n'))
				return broken(p);
			i++;
			if (--p->body_left == 0 && (rc = element_done(p)))
				return rc;
			break;
		}
		}
	}
	return 0;
}
