/* kvring message formats: the fixed-size records every ring carries. */
#ifndef KVRING_MSG_H
#define KVRING_MSG_H

#include <stddef.h>
#include <stdint.h>

/*
 * Every message is 64 bytes: one cache line, so a producer's copy touches exactly one line
 * and a ring of 1024 messages is 64 KiB. A 16-byte common header is followed by a 48-byte
 * body whose layout depends on the type. A request larger than one body (a key list, a
 * block-id list) streams as several messages of one request id with KVR_MSGF_MORE set on
 * all but the last, seq counting 0, 1, 2, ... (docs/messages.md explains the choice).
 *
 * Receivers never read a body field before the type's decode function validated the
 * whole message: type known, flags within the type's allowed set, body_len equal to the
 * type's body length (or within its range for streamed lists), reserved bytes zero, field
 * values in range. A message that fails is rejected (-EBADMSG) and counted by the
 * receiver; it is never acted on.
 */

#define KVR_MSG_SIZE 64
#define KVR_MSG_BODY 48

enum kvr_msg_type {
	KVR_MSG_NONE = 0,
	/* supervisor <-> actor control */
	KVR_MSG_PING = 1,  /* supervisor -> actor: are you alive */
	KVR_MSG_PONG = 2,  /* actor -> supervisor: yes, with its stats epoch */
	KVR_MSG_STOP = 3,  /* supervisor -> actor: finish in-flight work and exit 0 */
	/* 16..: client <-> lookup, loader, storer (see the L1 data path) */
	KVR_MSG_TYPE_MAX = 64,
};

enum kvr_msg_flags {
	KVR_MSGF_MORE = 1u << 0,  /* more messages of this request follow */
	KVR_MSGF_ERROR = 1u << 1, /* completion carries an error (body.status < 0) */
};

struct kvr_msg_hdr {
	uint16_t type;     /* enum kvr_msg_type */
	uint8_t flags;     /* enum kvr_msg_flags */
	uint8_t body_len;  /* bytes of body in use, <= KVR_MSG_BODY */
	uint32_t seq;      /* position within a streamed request, 0 for single messages */
	uint64_t req_id;   /* request id chosen by the requester; echoed in replies */
};

struct kvr_msg {
	struct kvr_msg_hdr hdr;
	uint8_t body[KVR_MSG_BODY];
};

_Static_assert(sizeof(struct kvr_msg_hdr) == 16, "message header");
_Static_assert(sizeof(struct kvr_msg) == KVR_MSG_SIZE, "message size");

/* PING / PONG bodies */
struct kvr_msg_ping {
	uint64_t sent_ns;  /* sender's CLOCK_MONOTONIC, echoed in the pong */
	uint32_t nonce;
	uint32_t reserved;
};
struct kvr_msg_pong {
	uint64_t sent_ns;  /* echoed from the ping */
	uint32_t nonce;    /* echoed from the ping */
	int32_t pid;       /* the actor's pid */
	uint64_t handled;  /* messages the actor has handled since it started */
};
_Static_assert(sizeof(struct kvr_msg_ping) <= KVR_MSG_BODY, "ping body");
_Static_assert(sizeof(struct kvr_msg_pong) <= KVR_MSG_BODY, "pong body");

/* Human-readable type name ("ping", ...) or "unknown". */
const char *kvr_msg_type_name(unsigned type);

/* Build a message: zeroes it, sets the header and copies body_len bytes of body. */
void kvr_msg_build(struct kvr_msg *m, unsigned type, unsigned flags, uint64_t req_id, uint32_t seq,
		   const void *body, size_t body_len);

/* Validating decoders: 0 and *ret filled, or -EBADMSG (and *ret untouched).
 * Each checks type, flags, body_len, reserved bytes and field ranges. */
int kvr_msg_decode_ping(const struct kvr_msg *m, struct kvr_msg_ping *ret);
int kvr_msg_decode_pong(const struct kvr_msg *m, struct kvr_msg_pong *ret);
int kvr_msg_decode_stop(const struct kvr_msg *m);

/* One line describing any message for inspect: "ping req=7 seq=0 flags=- len=16".
 * Unknown or malformed messages are described as such, never trusted. Returns buf. */
char *kvr_msg_describe(const struct kvr_msg *m, char *buf, size_t len);

#endif
