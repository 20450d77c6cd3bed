/* ringbench: the transport interface kvring-ringbench measures (kvr ring, pipe, iceoryx). */
#ifndef KVR_RINGBENCH_H
#define KVR_RINGBENCH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <kvring/msg.h>

#include "kvr_segment.h"

/*
 * Two processes exchange struct kvr_msg (64 bytes) over two one-way channels:
 * a2b (role A sends, role B receives) and b2a. A transport:
 *
 *   setup()     in the parent, before any fork: creates what both sides share (a segment,
 *               pipes, a RouDi daemon). On failure writes a one-line reason and returns
 *               < 0: the transport's row is skipped, the others still run.
 *   open()      in each child, once per phase: attaches role's ends. Returns only when the
 *               channel can carry messages both ways (iceoryx: both subscriptions matched).
 *   send/recv   blocking, one message; 0 or negative errno. They wait the transport's own
 *               normal way (kvr: spin then futex; pipe: the kernel; iceoryx: its WaitSet).
 *   close()     in the child; teardown() in the parent after the last phase.
 */

enum rb_role { RB_A = 0, RB_B = 1 };

struct rb_env {
	uint32_t ring_capacity; /* kvr: messages per ring */
	/* kvr */
	struct kvr_segment seg;
	int ring_a2b, ring_b2a;
	/* pipe */
	int pipe_a2b[2], pipe_b2a[2];
	/* iceoryx */
	pid_t roudi_pid;
	char roudi_log[128];
};

struct rb_chan;

struct rb_transport {
	const char *name;  /* "kvr", "pipe", "iceoryx": --transports and JSON */
	const char *label; /* table row */
	int (*setup)(struct rb_env *env, char *why, size_t len);
	void (*teardown)(struct rb_env *env);
	int (*open)(struct rb_env *env, enum rb_role role, struct rb_chan **ret, char *why, size_t len);
	int (*send)(struct rb_chan *c, const struct kvr_msg *m);
	int (*recv)(struct rb_chan *c, struct kvr_msg *m);
	void (*close)(struct rb_chan *c);
};

extern const struct rb_transport rb_kvr_transport;
extern const struct rb_transport rb_pipe_transport;
extern const struct rb_transport rb_iox_transport; /* setup() says "not built" without iceoryx */

#endif
