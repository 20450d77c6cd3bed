/* Helpers shared by the tests (first those of ipc/): seeds, a PRNG, child processes, stamped messages. */
#ifndef KVR_IPC_TEST_H
#define KVR_IPC_TEST_H

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "kvr_time.h"

/* ---- seeds and a small PRNG --------------------------------------------------------- */

/* The seed of a randomised test: KVR_TEST_SEED if set, random otherwise. Always printed. */
static inline uint64_t test_seed(const char *test)
{
	uint64_t seed = 0;
	const char *env = getenv("KVR_TEST_SEED");
	if (env && *env) {
		seed = strtoull(env, NULL, 0);
	} else if (getrandom(&seed, sizeof(seed), 0) != sizeof(seed)) {
		seed = kvr_now_ns() ^ ((uint64_t)getpid() << 32);
	}
	fprintf(stderr, "%s: seed %llu (repeat with KVR_TEST_SEED=%llu)\n", test, (unsigned long long)seed,
		(unsigned long long)seed);
	return seed;
}

static inline uint64_t mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

struct rng {
	uint64_t s;
};

static inline uint64_t rng_next(struct rng *r)
{
	r->s += 0x9e3779b97f4a7c15ull;
	return mix64(r->s);
}

/* Uniform-enough integer in [0, n). */
static inline uint32_t rng_below(struct rng *r, uint32_t n)
{
	return (uint32_t)(((rng_next(r) >> 32) * n) >> 32);
}

/* ---- stamped 64-byte messages ------------------------------------------------------- */

#define STAMP_WORDS 8

/* Word 0 is the sequence number; words 1..7 derive from xxh64(seq) under the run's seed,
 * so a torn, stale, reordered or duplicated message fails the byte comparison. */
static inline void stamp(void *msg, uint64_t seq, uint64_t seed)
{
	uint64_t w[STAMP_WORDS];
	uint64_t h = XXH64(&seq, sizeof(seq), seed);
	w[0] = seq;
	for (unsigned i = 1; i < STAMP_WORDS; i++)
		w[i] = mix64(h + i * 0x9e3779b97f4a7c15ull);
	memcpy(msg, w, sizeof(w));
}

/* 0 when msg is exactly the stamp of seq, else 1 + the index of the first bad byte. */
static inline unsigned stamp_check(const void *msg, uint64_t seq, uint64_t seed)
{
	uint8_t want[STAMP_WORDS * 8];
	stamp(want, seq, seed);
	if (memcmp(msg, want, sizeof(want)) == 0)
		return 0;
	const uint8_t *got = msg;
	unsigned i = 0;
	while (got[i] == want[i])
		i++;
	return i + 1;
}

static inline uint64_t stamp_seq(const void *msg)
{
	uint64_t s;
	memcpy(&s, msg, sizeof(s));
	return s;
}

/* ---- time --------------------------------------------------------------------------- */

static inline void sleep_us(uint64_t us)
{
	struct timespec ts = {.tv_sec = (time_t)(us / 1000000), .tv_nsec = (long)(us % 1000000) * 1000};
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

/* Wait (sleeping 100 us between looks) until *p == want; 0, or -ETIMEDOUT. */
static inline int wait_u32(_Atomic uint32_t *p, uint32_t want, unsigned timeout_ms)
{
	uint64_t end = kvr_now_ns() + (uint64_t)timeout_ms * 1000000;
	while (atomic_load(p) != want) {
		if (kvr_now_ns() >= end)
			return -ETIMEDOUT;
		sleep_us(100);
	}
	return 0;
}

/* Wait until *p >= want; 0, or -ETIMEDOUT. */
static inline int wait_u64_ge(_Atomic uint64_t *p, uint64_t want, unsigned timeout_ms)
{
	uint64_t end = kvr_now_ns() + (uint64_t)timeout_ms * 1000000;
	while (atomic_load(p) < want) {
		if (kvr_now_ns() >= end)
			return -ETIMEDOUT;
		sleep_us(100);
	}
	return 0;
}

/* ---- child processes ---------------------------------------------------------------- */

/* Children of the current test; the fixture's fini kills what is left (a failed assertion
 * must not leave a producer blocked forever on a ring nobody drains). */
#define MAX_KIDS 16
static pid_t kids[MAX_KIDS];
static unsigned n_kids;

/* Fork; the child runs fn(arg) and _exits with its return value (no atexit handlers: the
 * child must not run Criterion's or the sanitizers' exit paths of the parent test). */
static inline pid_t spawn(int (*fn)(void *), void *arg)
{
	fflush(NULL);
	pid_t pid = fork();
	if (pid == 0)
		_exit(fn(arg));
	if (pid > 0 && n_kids < MAX_KIDS)
		kids[n_kids++] = pid;
	return pid;
}

static inline void forget_kid(pid_t pid)
{
	for (unsigned i = 0; i < n_kids; i++)
		if (kids[i] == pid) {
			kids[i] = kids[--n_kids];
			return;
		}
}

/* Wait up to timeout_ms for pid to exit; 0 and *ret_status, or -ETIMEDOUT (pid is then
 * killed and reaped, *ret_status untouched). */
static inline int reap(pid_t pid, unsigned timeout_ms, int *ret_status)
{
	uint64_t end = kvr_now_ns() + (uint64_t)timeout_ms * 1000000;
	int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
	for (;;) {
		int st;
		pid_t w = waitpid(pid, &st, WNOHANG);
		if (w == pid) {
			if (pfd >= 0)
				close(pfd);
			forget_kid(pid);
			*ret_status = st;
			return 0;
		}
		uint64_t now = kvr_now_ns();
		if (w < 0 || now >= end)
			break;
		if (pfd >= 0) {
			struct pollfd p = {.fd = pfd, .events = POLLIN};
			(void)poll(&p, 1, (int)((end - now) / 1000000) + 1);
		} else {
			sleep_us(1000);
		}
	}
	if (pfd >= 0)
		close(pfd);
	kill(pid, SIGKILL);
	(void)waitpid(pid, NULL, 0);
	forget_kid(pid);
	return -ETIMEDOUT;
}

/* Exit code of a child that exited normally, or 1000 + signal, or -1. */
static inline int exit_code(int status)
{
	if (WIFEXITED(status))
		return WEXITSTATUS(status);
	if (WIFSIGNALED(status))
		return 1000 + WTERMSIG(status);
	return -1;
}

static inline void kill_kids(void)
{
	while (n_kids) {
		pid_t pid = kids[--n_kids];
		kill(pid, SIGKILL);
		(void)waitpid(pid, NULL, 0);
	}
}

#endif
