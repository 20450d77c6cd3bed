/* resp: an incremental RESP2 reply framer whose top-level bulk strings can go straight to a caller's memory. */
#ifndef KVR_RESP_H
#define KVR_RESP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * The remote actor reads replies from a pipelined connection. Most replies are small
 * (+OK, :1, -MOVED ..., CLUSTER SLOTS); a GET's reply is a 5 MiB bulk string that should
 * land in an arena slot without passing through a reply buffer. This framer finds where
 * each reply ends and hands it over in one of two ways:
 *
 *   captured  the reply's bytes, complete, in the framer's buffer (at most
 *             KVR_RESP_CAPTURE_MAX): ops->reply(ctx, raw, len, false); the caller parses
 *             them (the remote actor with hiredis's reader).
 *   streamed  a top-level bulk string the caller asked for when its length was known
 *             (ops->bulk_begin returned true): its bytes go, as they arrive, to the memory
 *             ops->bulk_dest names (NULL: dropped), then ops->reply(ctx, NULL, len, true).
 *             The connection may also read() straight into bulk_dest's memory and report
 *             the bytes with kvr_resp_streamed() — the zero-copy path.
 *
 * Nothing is allocated after init but the capture buffer (grown to the largest reply).
 * A malformed byte stream (a bad type byte, a length that is not a number, a line or a
 * captured reply over its limit, arrays nested deeper than KVR_RESP_DEPTH) makes
 * kvr_resp_feed return -EPROTO and the framer unusable: the connection must be closed.
 */

#define KVR_RESP_LINE_MAX 4096u           /* a type line: "$5243008", "-MOVED 3999 host:port" */
#define KVR_RESP_CAPTURE_MAX (4u << 20)   /* a reply kept whole (CLUSTER SLOTS of a big cluster) */
#define KVR_RESP_DEPTH 8u

struct kvr_resp_ops {
	/* A top-level bulk string of len bytes begins: true to stream it (bulk_dest below),
	 * false to capture the reply. */
	bool (*bulk_begin)(void *ctx, uint64_t len);
	/* Where the next at most *room streamed bytes go (*room is how many are left of the
	 * bulk; the caller may lower it, not to 0), or NULL to drop them. */
	void *(*bulk_dest)(void *ctx, size_t *room);
	/* n streamed bytes were written where bulk_dest said (or dropped). */
	void (*bulk_wrote)(void *ctx, size_t n);
	/* A reply ended: raw[0..len) when captured; (NULL, the bulk's length, true) when
	 * streamed. Returns 0, or non-zero to stop feeding (the caller closed the connection). */
	int (*reply)(void *ctx, const char *raw, size_t len, bool streamed);
};

struct kvr_resp {
	const struct kvr_resp_ops *ops;
	void *ctx;
	char *cap;          /* the reply being captured (its bytes so far) */
	size_t cap_n, cap_size;
	size_t line_at;     /* where in cap the current type line starts */
	uint64_t body_left; /* bytes of the current bulk body still to come, CRLF included */
	uint64_t stream_len;
	unsigned depth;
	int64_t left[KVR_RESP_DEPTH]; /* elements still to come, per open array */
	uint8_t st;
	bool streaming;     /* the current top-level bulk is streamed */
	bool broken;
};

void kvr_resp_init(struct kvr_resp *p, const struct kvr_resp_ops *ops, void *ctx);
void kvr_resp_reset(struct kvr_resp *p);  /* a new connection: nothing half-read */
void kvr_resp_fini(struct kvr_resp *p);

/* Frame buf[0..len): 0 when every byte was taken, -EPROTO on a malformed stream, -ENOMEM,
 * or the non-zero value ops->reply returned (the rest of buf is not looked at). */
int kvr_resp_feed(struct kvr_resp *p, const char *buf, size_t len);

/* Bytes of the streamed bulk body still to come (its trailing CRLF not counted); 0 when
 * nothing is being streamed. While non-zero, the caller may read straight into bulk_dest's
 * memory and then call kvr_resp_streamed(). */
uint64_t kvr_resp_stream_left(const struct kvr_resp *p);
/* n bytes (n <= kvr_resp_stream_left) of the streamed body were read into bulk_dest's memory. */
void kvr_resp_streamed(struct kvr_resp *p, size_t n);

#endif
