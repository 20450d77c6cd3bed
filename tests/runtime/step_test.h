/* Helpers of the stepped stage tests (tests/lookup/test_l2tier.c, tests/storer/test_store_machine.c): a ring made full on purpose. */
#ifndef KVR_STEP_TEST_H
#define KVR_STEP_TEST_H

#include <criterion/criterion.h>

#include <kvring/msg.h>

#include "kvr_ring.h"

/* Fill ring r with messages of `type` (stand-ins for what its consumer has not taken yet)
 * until `room` slots are left; returns how many went in. */
static inline unsigned step_fill_ring(struct kvr_ring *r, uint32_t room, unsigned type)
{
	struct kvr_msg f;
	kvr_msg_build(&f, type, 0, 0, 0, NULL, 0);
	unsigned n = 0;
	while (kvr_ring_free(r) > room) {
		cr_assert_eq(kvr_ring_try_enqueue(r, &f), 0);
		n++;
	}
	return n;
}

/* Take the n fillers step_fill_ring put in (they come first): each must be one. */
static inline void step_drain_fillers(struct kvr_ring *r, unsigned n, unsigned type)
{
	for (unsigned i = 0; i < n; i++) {
		struct kvr_msg m;
		cr_assert_eq(kvr_ring_try_dequeue(r, &m), 0);
		cr_assert_eq(m.hdr.type, type, "a filler, not a request");
	}
}

#endif
