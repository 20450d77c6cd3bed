/* ringbench transport "kvr": two kvring SPSC rings in a memfd control segment, normal adaptive wait. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvr_ctl.h"
#include "ringbench.h"

struct rb_chan {
	struct kvr_ring *tx, *rx;
	struct kvr_ctl_rings rings; /* this process's views */
};

static int kvr_setup(struct rb_env *env, char *why, size_t len)
{
	/* Endpoints kvringd -> client.0 and back: both rings keep their own waiters. */
	struct kvr_ctl_ring_spec specs[2] = {
		{"bench.a2b", env->ring_capacity, KVR_EP_SUPERVISOR, KVR_EP_CLIENT(0)},
		{"bench.b2a", env->ring_capacity, KVR_EP_CLIENT(0), KVR_EP_SUPERVISOR},
	};
	size_t sz = kvr_ctl_memsize(1, 1, specs, 2, 1);
	if (!sz) {
		snprintf(why, len, "ring capacity %u is not a power of two in [2, 2^30]", env->ring_capacity);
		return -EINVAL;
	}
	int rc = kvr_segment_create("kvr-ringbench", KVR_SEG_CTL, sz, 1, 0, &env->seg);
	if (rc) {
		snprintf(why, len, "cannot create the segment: %s", strerror(-rc));
		return rc;
	}
	rc = kvr_ctl_init(&env->seg, 1, 1, specs, 2, NULL);
	if (rc) {
		snprintf(why, len, "cannot lay out the segment: %s", strerror(-rc));
		kvr_segment_close(&env->seg);
		return rc;
	}
	env->ring_a2b = 0;
	env->ring_b2a = 1;
	return 0;
}

static void kvr_teardown(struct rb_env *env)
{
	kvr_segment_close(&env->seg);
}

static int kvr_open(struct rb_env *env, enum rb_role role, struct rb_chan **ret, char *why, size_t len)
{
	struct rb_chan *c = calloc(1, sizeof(*c));
	if (!c) {
		snprintf(why, len, "out of memory");
		return -ENOMEM;
	}
	/* the mapping was inherited across fork(): same segment, same rings */
	struct kvr_ctl *ctl;
	int rc = kvr_ctl_attach(&env->seg, &ctl, &c->rings);
	if (rc) {
		snprintf(why, len, "the segment does not validate: %s", strerror(-rc));
		free(c);
		return rc;
	}
	struct kvr_ring *a2b = kvr_ctl_ring(&c->rings, (unsigned)env->ring_a2b);
	struct kvr_ring *b2a = kvr_ctl_ring(&c->rings, (unsigned)env->ring_b2a);
	c->tx = role == RB_A ? a2b : b2a;
	c->rx = role == RB_A ? b2a : a2b;
	kvr_ring_claim_producer(c->tx, getpid());
	kvr_ring_claim_consumer(c->rx, getpid());
	*ret = c;
	return 0;
}

static int kvr_send(struct rb_chan *c, const struct kvr_msg *m)
{
	int rc;
	while ((rc = kvr_ring_enqueue(c->tx, m, -1)) == -EINTR)
		;
	return rc;
}

static int kvr_recv(struct rb_chan *c, struct kvr_msg *m)
{
	int rc;
	while ((rc = kvr_ring_dequeue(c->rx, m, -1)) == -EINTR)
		;
	return rc;
}

static void kvr_close(struct rb_chan *c)
{
	free(c);
}

const struct rb_transport rb_kvr_transport = {
	.name = "kvr",
	.label = "kvr ring",
	.setup = kvr_setup,
	.teardown = kvr_teardown,
	.open = kvr_open,
	.send = kvr_send,
	.recv = kvr_recv,
	.close = kvr_close,
};
