/* watch: the runtime's side of fd and timer watches — what the actor loop calls (private to actors/runtime). */
#ifndef KVR_ACTOR_WATCH_H
#define KVR_ACTOR_WATCH_H

#include <stdbool.h>
#include <stdint.h>

#include "kvr_actor.h"

/*
 * The stage-facing API (kvr_actor_watch_fd, kvr_actor_timer_start, ...) is in kvr_actor.h.
 * The loop, once per pass:
 *   kvr_watch_dispatch()      runs the callbacks of fds that became ready and of timers
 *                             that are due; returns how many ran (work done this pass);
 *   kvr_watch_deadline()      the earliest armed timer (UINT64_MAX: none);
 *   kvr_watch_uses_uring()    whether the loop must sleep in kvr_watch_sleep() (some fd is
 *                             watched) instead of on its futex alone;
 *   kvr_watch_sleep()         after kvr_waiter_prepare(): one io_uring_enter that returns
 *                             when the waiter's futex word moves from `seen` (io_uring
 *                             FUTEX_WAIT, Linux >= 6.7), a watched fd is ready, the timeout
 *                             passes or a signal arrives. On a kernel without io_uring
 *                             futex waits it sleeps at most KVR_WATCH_FALLBACK_NS and the
 *                             rings are looked at after each slice (logged once at setup).
 */

#define KVR_WATCH_FALLBACK_NS 1000000ll /* ring poll period when io_uring cannot wait on a futex */

unsigned kvr_watch_dispatch(struct kvr_actor *a, uint64_t now_ns);
uint64_t kvr_watch_deadline(const struct kvr_actor *a);
bool kvr_watch_uses_uring(const struct kvr_actor *a);
/* 0 (woken or timed out: the caller re-checks everything) or -errno (-EINTR on a signal). */
int kvr_watch_sleep(struct kvr_actor *a, struct kvr_waiter *w, uint32_t seen, int64_t timeout_ns);
/* Free the watch state (NULL-safe); pending polls and futex waits are cancelled. */
void kvr_watch_close(struct kvr_actor *a);

#endif
