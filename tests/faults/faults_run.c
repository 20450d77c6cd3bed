/* The kill -9 stress driver (faults_run.h): an instance, worker processes per role, faults, quiet checks, reports. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../ipc/ipc_test.h"
#include "client_harness.h"
#include "faults_run.h"
#include "kvr_ring.h"

#define FAULTS_PER_ROUND 45
#define QUIET_MS 12000 /* > the lookup actor's 8 s give-up on an L2 answer a disk actor lost (l2tier.c) */
#define ROUND_CAP_MS 40000 /* a round that cannot find victims ends anyway */
#define TEST_MODEL_ID "test/tiny" /* ct_start's model_id: the namespace of engines that name no model */

static const struct fr_scenario *sc;
static struct ct_env env;
static char l2dirs[2][256];
static struct fh_wshared *sh;
static pid_t wpid[FR_MAX_ROLES];
static unsigned incarnation[FR_MAX_ROLES];
static unsigned role_model[FR_MAX_ROLES];       /* index into sc->models */
static struct fh_prompt prompts[FH_MAX_MODELS][FR_MAX_PROMPTS];
static struct fh_worker_cfg wcfg[FH_MAX_MODELS];
static kvr_key model_ns[FH_MAX_MODELS];          /* each model's key namespace */
static struct fh_keymap keymap;
static uint64_t seed;
static kvr_key ns0;                              /* the slot table's: its L2 directory */
static struct ct_model model;                    /* models[0] for ct_start */

static const struct fh_role *roles;             /* sc->roles */

enum { K_LOOKUP, K_LOADER, K_STORER, K_DISK, K_GATHER, K_WORKER, K_MAX };
static const char *const kind_name[K_MAX] = {"lookup", "loader", "storer", "disk", "gather", "worker"};
static const unsigned kind_actor[K_MAX] = {KVR_ACTOR_LOOKUP, KVR_ACTOR_LOADER, KVR_ACTOR_STORER, KVR_ACTOR_DISK,
					   KVR_ACTOR_GATHER, 0};

static struct {
	uint64_t faults[K_MAX];
	unsigned rounds, rounds_failed;
	char failed_rounds[256];
	uint64_t quiet_checks, leaked_slots;
	char first_leak[400];         /* the first leaked slot and when (the summary and the assertion say it) */
	uint64_t l1_checked, l1_wrong;
	uint64_t not_idle, not_settled, worker_crashes, unclean_stops, restarts;
	uint64_t l1_checked_by_model[FH_MAX_MODELS];
	struct fh_l2_scan l2;
	uint64_t v_blocks, v_bytes, v_wrong_bytes, v_wrong_blocks, v_missed, v_prompts, v_l2_reads;
	uint64_t v_blocks_by_model[FH_MAX_MODELS];
	uint64_t v_lookups_by_model[FH_MAX_MODELS], v_lookup_errs_by_model[FH_MAX_MODELS];
	uint64_t v_loads_by_model[FH_MAX_MODELS], v_missed_by_model[FH_MAX_MODELS];
} tot;

static pid_t last_killed[KVR_CTL_MAX_ACTORS];

static struct kill_ev {      /* this round's kills, printed when the round found wrong bytes */
	uint64_t ns;
	char name[KVR_ACTOR_NAME_MAX];
	pid_t pid;
} kills[FAULTS_PER_ROUND];
static unsigned n_kills;

static void log_kill(const char *name, pid_t pid)
{
	if (n_kills < FAULTS_PER_ROUND) {
		kills[n_kills] = (struct kill_ev){.ns = kvr_now_ns(), .pid = pid};
		snprintf(kills[n_kills].name, sizeof(kills[n_kills].name), "%s", name);
		n_kills++;
	}
}

void fr_setup(void)
{
	ct_init(&env);
	for (unsigned d = 0; d < 2; d++) {
		snprintf(l2dirs[d], sizeof(l2dirs[d]), "%s/l2.%u", env.h.dir, d);
		cr_assert_eq(mkdir(l2dirs[d], 0700), 0);
	}
	sh = mmap(NULL, FR_MAX_ROLES * sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	cr_assert(sh != MAP_FAILED);
	memset(sh, 0, FR_MAX_ROLES * sizeof(*sh));
}

static void kill_workers(void)
{
	for (unsigned i = 0; sc && i < sc->n_roles; i++)
		if (wpid[i] > 0) {
			(void)kill(wpid[i], SIGKILL);
			(void)waitpid(wpid[i], NULL, 0);
			wpid[i] = 0;
		}
}

void fr_teardown(void)
{
	kill_workers();
	if (env.h.pid > 0)
		(void)kill(env.h.pid, SIGKILL);
	ct_fini(&env);
	if (sh && sh != MAP_FAILED)
		munmap(sh, FR_MAX_ROLES * sizeof(*sh));
	sh = NULL;
	fh_keymap_free(&keymap);
}

/* ---- the instance ------------------------------------------------------------------------ */

static char l1_extra[64];

/* kvringd started in `mode`; with a model section its L1 is mapped at once, without one
 * once the first worker laid it out (map_l1, after spawn_all). */
static void start(const char *mode)
{
	struct ct_opts o = {.max_workers = sc->max_workers, .l1_slots = sc->l1_slots,
			    .eviction = strcmp(mode, "write-back") ? "s3fifo" : "lru", .crash_loop_max = 1000,
			    .l2_dir = l2dirs[0], .l2_dir2 = l2dirs[1], .l2_bytes = 2ull << 20, .l2_mode = mode,
			    .dcp_timeout_ms = 1000, .no_model = sc->no_model};
	if (sc->no_model) {
		snprintf(l1_extra, sizeof(l1_extra), ", \"slot_bytes\": %u", FH_LANE_BYTES);
		o.l1_extra = l1_extra;
	}
	env.slots = NULL;
	ct_start(&env, &model, &o);
	memset(last_killed, 0, sizeof(last_killed));
}

/* The slot table and the arena mapped (without a model section: once a worker laid L1 out);
 * its namespace is the one it had before (the L2 directory's). */
static void map_l1(void)
{
	if (!env.slots) {
		cr_assert(H_WAIT(env.ctl->arena_bytes != 0, 10000), "no worker laid L1 out");
		ct_map_l1(&env);
	}
	cr_assert(kvr_key_eq(env.slots->ns, ns0) || (!ns0.lo && !ns0.hi), "the namespace changed across restarts");
	ns0 = env.slots->ns;
	if (!sc->no_model)
		cr_assert(kvr_key_eq(ns0, model_ns[0]), "the model section's namespace is not its engines' (harness)");
}

/* Each model's slot tag: its entry in the control segment's model table (named by its first
 * engine, for the instance's life; 0 = not attached yet: not checked). */
static void read_tags(void)
{
	for (unsigned k = 0; k < sc->n_models; k++) {
		const char *name = sc->models[k]->model_ns ? sc->models[k]->model_ns : TEST_MODEL_ID;
		keymap.tag[k] = 0;
		for (unsigned i = 1; i <= KVR_CTL_MAX_MODELS; i++)
			if (!strncmp(kvr_ctl_model(env.ctl, i)->name, name, sizeof(kvr_ctl_model(env.ctl, i)->name)))
				keymap.tag[k] = (uint8_t)i;
	}
}

/* SIGTERM (drain); true when kvringd exited 0 within 15 s (else it is killed). */
static bool stop(void)
{
	cr_assert_eq(kill(env.h.pid, SIGTERM), 0);
	int st = h_wait_exit(env.h.pid, 15000);
	if (st < 0) {
		(void)kill(env.h.pid, SIGKILL);
		(void)h_wait_exit(env.h.pid, 5000);
	}
	env.h.pid = 0;
	kvr_segment_close(&env.slots_seg);
	kvr_segment_close(&env.ctl_seg);
	kvr_segment_close(&env.arena_seg);
	env.slots = NULL;
	h_unmap(&env.h);
	bool clean = st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0;
	if (!clean) {
		tot.unclean_stops++;
		fprintf(stderr, "%s: kvringd did not drain and exit 0 on SIGTERM (wait status %d)\n", sc->name, st);
	}
	return clean;
}

/* ---- workers ------------------------------------------------------------------------------- */

static void worker_spawn(unsigned i)
{
	uint64_t s = mix64(seed ^ ((uint64_t)i << 56) ^ ((uint64_t)++incarnation[i] << 32));
	atomic_store(&sh[i].state, FH_W_STARTING);
	wpid[i] = fh_worker_spawn(&wcfg[role_model[i]], &roles[i], &sh[i], s);
	cr_assert_gt(wpid[i], 0, "fork: %s", strerror(-wpid[i]));
}

static uint32_t command(uint32_t cmd);

/* New worker processes for every role, idle once attached (not the EXIT their predecessors got). */
static void spawn_all(void)
{
	command(FH_CMD_QUIET);
	for (unsigned i = 0; i < sc->n_roles; i++)
		worker_spawn(i);
	map_l1();
}

static uint32_t command(uint32_t cmd)
{
	uint32_t seq = 0;
	for (unsigned i = 0; i < sc->n_roles; i++) {
		atomic_store(&sh[i].cmd, cmd);
		seq = atomic_fetch_add(&sh[i].cmd_seq, 1) + 1;
		kvr_futex_wake(&sh[i].cmd_seq); /* an idle worker sleeps on it */
	}
	return seq; /* every role's sequence moves together */
}

static bool all_in(uint32_t state, uint32_t seq)
{
	for (unsigned i = 0; i < sc->n_roles; i++)
		if (atomic_load(&sh[i].ack_seq) != seq || atomic_load(&sh[i].state) != state)
			return false;
	return true;
}

/* A worker that died without our kill is a crash: counted, restarted. */
static void reap_workers(void)
{
	for (unsigned i = 0; i < sc->n_roles; i++) {
		int st;
		if (wpid[i] > 0 && waitpid(wpid[i], &st, WNOHANG) == wpid[i]) {
			tot.worker_crashes++;
			fprintf(stderr, "%s: worker %s (pid %d) died on its own: wait status %d; last error: %s\n", sc->name,
				roles[i].name, (int)wpid[i], st, sh[i].last_err);
			worker_spawn(i);
		}
	}
}

static void stop_workers(void)
{
	command(FH_CMD_EXIT);
	for (unsigned i = 0; i < sc->n_roles; i++) {
		if (wpid[i] <= 0)
			continue;
		if (h_wait_exit(wpid[i], 8000) < 0) {
			fprintf(stderr, "%s: worker %s did not exit: killed\n", sc->name, roles[i].name);
			(void)kill(wpid[i], SIGKILL);
			(void)waitpid(wpid[i], NULL, 0);
		}
		wpid[i] = 0;
	}
}

/* Counter c of the workers of model mi (-1: of every worker). */
static uint64_t sum_model(unsigned c, int mi)
{
	uint64_t n = 0;
	for (unsigned i = 0; i < sc->n_roles; i++)
		if (mi < 0 || role_model[i] == (unsigned)mi)
			n += atomic_load(&sh[i].c[c]);
	return n;
}

static uint64_t sum(unsigned c)
{
	return sum_model(c, -1);
}

/* ---- faults ------------------------------------------------------------------------------- */

static uint64_t fence_overwrites; /* KV memories of killed workers written over after the kill */

/* A live worker's KV memfd `fd` of `bytes`, mapped read-write through /proc (NULL when it is
 * not that memfd any more: the worker was between two attaches). */
static uint8_t *map_worker_kv(pid_t pid, int fd, uint64_t bytes)
{
	char path[64], link[128];
	snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)pid, fd);
	ssize_t n = readlink(path, link, sizeof(link) - 1);
	if (fd < 0 || !bytes || n <= 0)
		return NULL;
	link[n] = 0;
	if (!strstr(link, "memfd:fh-kv"))
		return NULL;
	int f = open(path, O_RDWR | O_CLOEXEC);
	if (f < 0)
		return NULL;
	struct stat stt;
	void *p = fstat(f, &stt) == 0 && (uint64_t)stt.st_size == bytes
			  ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0)
			  : MAP_FAILED;
	close(f);
	return p == MAP_FAILED ? NULL : p;
}

/* Kill one victim of `kind`: true when something was killed. */
static bool inject(struct rng *g, unsigned kind)
{
	if (kind == K_WORKER) {
		unsigned i = rng_below(g, sc->n_roles);
		if (wpid[i] <= 0)
			return false;
		char name[KVR_ACTOR_NAME_MAX];
		snprintf(name, sizeof(name), "worker %s", roles[i].name);
		/* its KV memory outlives it here, as in an engine whose other process shares it:
		 * reaped, the worker's blocks are written over at once — the storer's fence must
		 * keep every store of the dead worker from committing them (the L1 check after the
		 * round compares every COMMITTED slot with its key's bytes) */
		struct { uint8_t *p; uint64_t n; } mem[2] = {{0}};
		unsigned n_kv = atomic_load(&sh[i].n_kv);
		for (unsigned k = 0; k < n_kv && k < 2; k++)
			mem[k].p = map_worker_kv(wpid[i], atomic_load(&sh[i].kv_fd[k]), atomic_load(&sh[i].kv_bytes[k]));
		log_kill(name, wpid[i]);
		cr_assert_eq(kill(wpid[i], SIGKILL), 0);
		cr_assert_eq(waitpid(wpid[i], NULL, 0), wpid[i]);
		for (unsigned k = 0; k < 2; k++) {
			if (!mem[k].p)
				continue;
			uint64_t bytes = atomic_load(&sh[i].kv_bytes[k]);
			memset(mem[k].p, 0x5a ^ (int)(fence_overwrites & 0xff), bytes);
			munmap(mem[k].p, bytes);
			fence_overwrites++;
		}
		worker_spawn(i);
		return true;
	}
	unsigned cand[KVR_CTL_MAX_ACTORS], n = 0, n_act = atomic_load(&env.h.ctl->n_actors);
	for (unsigned a = 0; a < n_act && a < KVR_CTL_MAX_ACTORS; a++) {
		const struct kvr_actor_ent *e = kvr_ctl_actor(env.h.ctl, a);
		pid_t pid = atomic_load(&e->pid);
		if (e->kind == kind_actor[kind] && atomic_load(&e->state) == KVR_ACTOR_READY && pid > 0 &&
		    pid != last_killed[a])
			cand[n++] = a;
	}
	if (!n)
		return false;
	unsigned a = cand[rng_below(g, n)];
	pid_t pid = atomic_load(&kvr_ctl_actor(env.h.ctl, a)->pid);
	if (kill(pid, SIGKILL))
		return false;
	last_killed[a] = pid;
	log_kill(kvr_ctl_actor(env.h.ctl, a)->name, pid);
	return true;
}

static unsigned kinds_mask = (1u << K_MAX) - 1; /* KVR_FAULTS_KINDS: the kinds to kill */

static void round_faults(struct rng *g, uint64_t *ret_by_kind)
{
	unsigned done = 0;
	uint64_t end = kvr_now_ns() + ROUND_CAP_MS * 1000000ull;
	n_kills = 0;
	while (done < FAULTS_PER_ROUND && kvr_now_ns() < end) {
		usleep(30000 + rng_below(g, 240000));
		reap_workers();
		unsigned kind, pick = rng_below(g, (unsigned)__builtin_popcount(kinds_mask));
		for (kind = 0; !(kinds_mask >> kind & 1) || pick--; kind++)
			;
		if (inject(g, kind)) {
			done++;
			ret_by_kind[kind]++;
		}
	}
}

/* ---- quiet --------------------------------------------------------------------------------- */

static bool actor_ready(const char *fmt, unsigned i)
{
	char name[KVR_ACTOR_NAME_MAX];
	snprintf(name, sizeof(name), fmt, i);
	struct kvr_actor_ent *a = h_actor(&env.h, name);
	return a && atomic_load(&a->state) == KVR_ACTOR_READY;
}

/* Every actor READY or idle; the lookup, disk, and every attached worker's actors READY
 * (a DCP rank's: its loader and a gather actor); no worker slot DETACHING. */
static bool settled(void)
{
	const struct kvr_ctl *c = env.h.ctl;
	for (unsigned a = 0; a < atomic_load(&c->n_actors); a++) {
		uint32_t st = atomic_load(&kvr_ctl_actor(c, a)->state);
		if (st != KVR_ACTOR_UNUSED && st != KVR_ACTOR_IDLE && st != KVR_ACTOR_READY)
			return false;
	}
	if (!actor_ready("lookup", 0) || !actor_ready("disk.%u", 0) || !actor_ready("disk.%u", 1))
		return false;
	bool dcp = false;
	for (unsigned w = 0; w < c->max_workers; w++) {
		const struct kvr_worker_ent *we = kvr_ctl_worker(c, w);
		uint32_t st = atomic_load(&we->state);
		if (st == KVR_WORKER_DETACHING)
			return false;
		if (st != KVR_WORKER_ATTACHED)
			continue;
		if (!actor_ready("loader.%u", w) || (we->dcp_size == 1 && !actor_ready("storer.%u", w)))
			return false;
		dcp |= we->dcp_size > 1;
	}
	bool gather = false;
	for (unsigned a = 0; a < atomic_load(&c->n_actors); a++) {
		const struct kvr_actor_ent *e = kvr_ctl_actor(c, a);
		gather |= e->kind == KVR_ACTOR_GATHER && atomic_load(&e->state) == KVR_ACTOR_READY;
	}
	return !dcp || gather;
}

static void dump_instance(void)
{
	const struct kvr_ctl *c = env.h.ctl;
	for (unsigned a = 0; a < atomic_load(&c->n_actors); a++) {
		const struct kvr_actor_ent *e = kvr_ctl_actor(c, a);
		uint32_t st = atomic_load(&e->state);
		if (st != KVR_ACTOR_UNUSED && st != KVR_ACTOR_IDLE)
			fprintf(stderr, "  actor %s: %s pid %d restarts %u\n", e->name, kvr_actor_state_name(st),
				(int)atomic_load(&e->pid), e->restarts);
	}
	for (unsigned w = 0; w < c->max_workers; w++) {
		const struct kvr_worker_ent *we = kvr_ctl_worker(c, w);
		uint32_t st = atomic_load(&we->state);
		if (st != KVR_WORKER_FREE)
			fprintf(stderr, "  worker slot %u: %s pid %d tp %u/%u dcp %u/%u\n", w,
				st == KVR_WORKER_ATTACHED ? "attached" : "detaching", (int)atomic_load(&we->pid),
				we->tp_rank, we->tp_size, we->dcp_rank, we->dcp_size);
	}
}

static bool wait_workers(uint32_t state, uint32_t seq, int ms);

/* The checks once quiet; false when one failed (what failed is printed). */
static bool quiet_check(const char *when)
{
	bool ok = true;
	reap_workers();
	uint32_t seq = command(FH_CMD_QUIET);
	tot.quiet_checks++;
	/* a worker in a hung request gives up after hang_ms, then attaches again */
	if (!wait_workers(FH_W_IDLE, seq, (int)wcfg[0].hang_ms + 2 * (int)wcfg[0].attach_timeout_ms + 5000)) {
		tot.not_idle++;
		for (unsigned i = 0; i < sc->n_roles; i++)
			if (atomic_load(&sh[i].state) != FH_W_IDLE)
				fprintf(stderr, "%s: %s: worker %s not idle (state %u); last error: %s\n", sc->name, when,
					roles[i].name, atomic_load(&sh[i].state), sh[i].last_err);
		return false; /* not quiet: the slot table cannot be judged */
	}
	if (!H_WAIT(settled(), 8000)) {
		tot.not_settled++;
		fprintf(stderr, "%s: %s: actors and worker slots did not settle:\n", sc->name, when);
		dump_instance();
		ok = false;
	}
	if (!H_WAIT(fh_slots_offending(env.slots, NULL, false, NULL) == 0, QUIET_MS)) {
		fprintf(stderr, "%s: %s: slots not FREE/COMMITTED or pinned after %d ms:\n", sc->name, when, QUIET_MS);
		tot.leaked_slots += fh_slots_offending(env.slots, env.h.ctl, true, "leaked");
		for (uint32_t i = 0; i < env.slots->n_slots && !tot.first_leak[0]; i++)
			if (fh_slot_offends(env.slots, i)) {
				char d[320];
				fh_slot_describe(env.slots, env.h.ctl, i, d, sizeof(d));
				snprintf(tot.first_leak, sizeof(tot.first_leak), "%s: %s", when, d);
			}
		ok = false;
	}
	read_tags();
	uint32_t by_model[FH_MAX_MODELS] = {0}, checked = 0;
	uint32_t wrong = fh_l1_check(env.slots, env.arena_seg.base, &keymap, by_model);
	for (unsigned k = 0; k < sc->n_models; k++) {
		checked += by_model[k];
		tot.l1_checked_by_model[k] += by_model[k];
	}
	tot.l1_checked += checked;
	tot.l1_wrong += wrong;
	if (wrong) {
		fprintf(stderr, "%s: %s: %u of %u committed slots hold wrong bytes\n", sc->name, when, wrong, checked);
		ok = false;
	}
	return ok;
}

static void scan_l2(const char *when)
{
	struct fh_l2_scan s = {0};
	for (unsigned d = 0; d < 2; d++)
		fh_l2_scan(l2dirs[d], ns0, &keymap, &s);
	fprintf(stderr, "%s: L2 after %s: %llu files: %llu intact, %llu wrong, %llu damaged; %llu temporary\n", sc->name,
		when, (unsigned long long)s.files, (unsigned long long)s.ok, (unsigned long long)s.wrong,
		(unsigned long long)s.damaged, (unsigned long long)s.tmp);
	tot.l2.files += s.files;
	tot.l2.ok += s.ok;
	tot.l2.wrong += s.wrong;
	tot.l2.damaged += s.damaged;
	tot.l2.tmp += s.tmp;
	tot.l2.bytes += s.bytes;
	for (unsigned k = 0; k < FH_MAX_MODELS; k++)
		tot.l2.ok_by_model[k] += s.ok_by_model[k];
}

/* Workers out, kvringd drained and stopped, L2 checked, kvringd started in `mode`, workers in. */
static void restart(const char *mode, const char *why)
{
	stop_workers();
	(void)stop();
	scan_l2(why);
	start(mode);
	spawn_all();
	tot.restarts++;
}

/* Wait until every worker acknowledged seq in `state` (crashed ones restarted meanwhile). */
static bool wait_workers(uint32_t state, uint32_t seq, int ms)
{
	return H_WAIT((reap_workers(), all_in(state, seq)), ms);
}

/* ---- report ------------------------------------------------------------------------------- */

static uint64_t total_faults(void)
{
	uint64_t n = 0;
	for (unsigned k = 0; k < K_MAX; k++)
		n += tot.faults[k];
	return n;
}

static void print_bad(void)
{
	for (unsigned i = 0; i < sc->n_roles; i++) {
		if (atomic_load(&sh[i].have_bad) != 1)
			continue;
		const struct fh_bad *b = &sh[i].bad;
		fprintf(stderr, "  first wrong block seen by %s (TP rank %u): prompt %u, key %016llx%016llx lane %u, "
			"offset %u: 0x%02x, want 0x%02x%s\n", roles[i].name, sh[i].bad_rank, sh[i].bad_prompt,
			(unsigned long long)b->key.hi, (unsigned long long)b->key.lo, b->lane, b->offset, b->got, b->want,
			b->canary ? " (the block was never written: still the canary)" : "");
	}
}

static void report(void)
{
	fprintf(stderr, "%s: seed %llu; %u rounds, %u failed%s%s\n", sc->name, (unsigned long long)seed, tot.rounds,
		tot.rounds_failed, tot.rounds_failed ? ": " : "", tot.failed_rounds);
	fprintf(stderr, "  faults injected: %llu (", (unsigned long long)total_faults());
	for (unsigned k = 0; k < K_MAX; k++)
		fprintf(stderr, "%s%s %llu", k ? ", " : "", kind_name[k], (unsigned long long)tot.faults[k]);
	fprintf(stderr, ")\n");
	fprintf(stderr, "  workload: %llu stores (%llu failed, %llu blocks stored), %llu lookups (%llu errors), "
		"%llu loads (%llu failed), %llu submissions refused, %llu attaches (%llu failed), %llu hangs\n",
		(unsigned long long)sum(FH_C_STORES), (unsigned long long)sum(FH_C_STORES_FAILED),
		(unsigned long long)sum(FH_C_STORED_BLOCKS), (unsigned long long)sum(FH_C_LOOKUPS),
		(unsigned long long)sum(FH_C_LOOKUP_ERRS), (unsigned long long)sum(FH_C_LOADS),
		(unsigned long long)sum(FH_C_LOADS_FAILED), (unsigned long long)sum(FH_C_SUBMIT_ERRS),
		(unsigned long long)sum(FH_C_ATTACHES), (unsigned long long)sum(FH_C_ATTACH_FAILS),
		(unsigned long long)sum(FH_C_HANGS));
	fprintf(stderr, "  loads checked: %llu blocks restored, %llu bytes compared, %llu wrong bytes in %llu blocks; "
		"%llu blocks reported failed (misses)\n",
		(unsigned long long)sum(FH_C_BLOCKS_CHECKED), (unsigned long long)sum(FH_C_BYTES),
		(unsigned long long)sum(FH_C_WRONG_BYTES), (unsigned long long)sum(FH_C_WRONG_BLOCKS),
		(unsigned long long)sum(FH_C_BLOCKS_MISSED));
	print_bad();
	fprintf(stderr, "  quiet checks: %llu; leaked slots: %llu; L1: %llu committed slots checked, %llu wrong; "
		"not idle %llu, not settled %llu; worker crashes %llu; unclean kvringd stops %llu; restarts %llu\n",
		(unsigned long long)tot.quiet_checks, (unsigned long long)tot.leaked_slots,
		(unsigned long long)tot.l1_checked, (unsigned long long)tot.l1_wrong, (unsigned long long)tot.not_idle,
		(unsigned long long)tot.not_settled, (unsigned long long)tot.worker_crashes,
		(unsigned long long)tot.unclean_stops, (unsigned long long)tot.restarts);
	if (tot.first_leak[0])
		fprintf(stderr, "  the first leaked slot, %s\n", tot.first_leak);
	fprintf(stderr, "  L2 files read: %llu (%llu intact, %llu wrong, %llu damaged, %llu temporary), %llu bytes "
		"compared\n",
		(unsigned long long)tot.l2.files, (unsigned long long)tot.l2.ok, (unsigned long long)tot.l2.wrong,
		(unsigned long long)tot.l2.damaged, (unsigned long long)tot.l2.tmp, (unsigned long long)tot.l2.bytes);
	fprintf(stderr, "  after the restart: %llu prompts looked up, %llu blocks restored (%llu from L2), %llu bytes "
		"compared, %llu wrong bytes in %llu blocks, %llu missed\n",
		(unsigned long long)tot.v_prompts, (unsigned long long)tot.v_blocks, (unsigned long long)tot.v_l2_reads,
		(unsigned long long)tot.v_bytes, (unsigned long long)tot.v_wrong_bytes,
		(unsigned long long)tot.v_wrong_blocks, (unsigned long long)tot.v_missed);
	uint64_t want = 0;
	for (unsigned i = 0; i < sc->n_roles; i++)
		want += (uint64_t)prompts[role_model[i]][sc->n_prompts].n * (roles[i].kind == FH_ROLE_DCP ? 2 : 1);
	fprintf(stderr, "  the seal prompt (stored write-through before a clean stop): %llu block lanes stored, %llu of %llu "
		"restored after the restart\n", (unsigned long long)sum(FH_C_SEAL_STORED),
		(unsigned long long)sum(FH_C_SEAL_RESTORED), (unsigned long long)want);
}


/* Each model's part, when there are several. */
static void report_models(void)
{
	for (unsigned k = 0; sc->n_models > 1 && k < sc->n_models; k++)
		fprintf(stderr, "  model %s (lane %u bytes): %llu stores (%llu blocks stored), %llu loads, %llu blocks "
			"restored and checked, %llu wrong bytes; L1: %llu committed slots checked; L2: %llu files "
			"intact; after the restart %llu lookups (%llu errors), %llu loads, %llu blocks restored, %llu "
			"missed\n", sc->models[k]->name,
			fh_model_lane_bytes(sc->models[k]), (unsigned long long)sum_model(FH_C_STORES, (int)k),
			(unsigned long long)sum_model(FH_C_STORED_BLOCKS, (int)k),
			(unsigned long long)sum_model(FH_C_LOADS, (int)k),
			(unsigned long long)sum_model(FH_C_BLOCKS_CHECKED, (int)k),
			(unsigned long long)sum_model(FH_C_WRONG_BYTES, (int)k),
			(unsigned long long)tot.l1_checked_by_model[k], (unsigned long long)tot.l2.ok_by_model[k],
			(unsigned long long)tot.v_lookups_by_model[k], (unsigned long long)tot.v_lookup_errs_by_model[k],
			(unsigned long long)tot.v_loads_by_model[k], (unsigned long long)tot.v_blocks_by_model[k],
			(unsigned long long)tot.v_missed_by_model[k]);
}

/* ---- the test ------------------------------------------------------------------------------ */

static bool default_run; /* the default rounds and kinds: the fault count is asserted */

/* The seed, KVR_FAULTS_ROUNDS and KVR_FAULTS_KINDS; returns the rounds. */
static unsigned parse_env(void)
{
	seed = test_seed(sc->name);
	unsigned rounds = sc->rounds;
	const char *env_rounds = getenv("KVR_FAULTS_ROUNDS");
	if (env_rounds && *env_rounds)
		rounds = (unsigned)strtoul(env_rounds, NULL, 0);
	cr_assert_gt(rounds, 0);
	/* no DCP role: no gather actor to kill */
	bool dcp = false;
	for (unsigned i = 0; i < sc->n_roles; i++)
		dcp |= roles[i].kind == FH_ROLE_DCP;
	const unsigned all = ((1u << K_MAX) - 1) & ~(dcp ? 0u : 1u << K_GATHER);
	kinds_mask = all;
	const char *env_kinds = getenv("KVR_FAULTS_KINDS");
	if (env_kinds && *env_kinds) {
		kinds_mask = 0;
		for (unsigned k = 0; k < K_MAX; k++)
			if (strstr(env_kinds, kind_name[k]))
				kinds_mask |= 1u << k;
		cr_assert_neq(kinds_mask, 0, "KVR_FAULTS_KINDS=%s names no kind (lookup,loader,storer,disk,gather,worker)",
			      env_kinds);
		fprintf(stderr, "%s: KVR_FAULTS_KINDS=%s\n", sc->name, env_kinds);
	}
	default_run = (!env_rounds || !*env_rounds) && kinds_mask == all;
	return rounds;
}

/* Each model's namespace and prompts, the keymap, the workers' configurations, the roles' models. */
static void prepare(struct rng *g)
{
	const struct fh_model *m0 = sc->models[0];
	model = (struct ct_model){.layers = m0->layers, .kv_heads = m0->lane_heads * m0->tp, .head_dim = m0->head_dim,
				  .dtype_bytes = m0->dtype, .block_tokens = fh_model_bt(m0), .tp_size = m0->tp};
	/* one more: the seal prompt (verify_after_restart), never stored by the rounds */
	cr_assert(sc->n_roles <= FR_MAX_ROLES && sc->n_prompts < FR_MAX_PROMPTS && sc->n_models <= FH_MAX_MODELS);
	uint64_t t0 = kvr_now_ns();
	for (unsigned k = 0; k < sc->n_models; k++) {
		cr_assert_eq(fh_model_namespace(sc->models[k], TEST_MODEL_ID, &model_ns[k]), 0);
		fh_make_prompts(prompts[k], sc->n_prompts, 8, 6, rng_next(g), model_ns[k], fh_model_bt(sc->models[k]));
		/* the seal prompt: tokens of its own, no block shared with the rounds' prompts (a
		 * lane already on disk is not written again, so it would keep its old place in L2's
		 * LRU and could be evicted by the seal's own writes) */
		fh_make_prompt(&prompts[k][sc->n_prompts], 6, rng_next(g), model_ns[k], fh_model_bt(sc->models[k]));
		cr_assert_eq(fh_keymap_add(&keymap, sc->models[k], prompts[k], sc->n_prompts + 1), 0);
		wcfg[k] = (struct fh_worker_cfg){.sock = env.h.sock, .prompts = prompts[k], .n_prompts = sc->n_prompts,
						 .seal = true,
						 .dcp_size = 2, .dcp_interleave = 4, .num_blocks = 128, .hang_ms = 10000,
						 .attach_timeout_ms = 3000, .think_us = 1000, .t0_ns = t0};
	}
	for (unsigned i = 0; i < sc->n_roles; i++) {
		unsigned k = 0;
		while (k < sc->n_models && sc->models[k] != (roles[i].m ? roles[i].m : &fh_model_default))
			k++;
		cr_assert_lt(k, sc->n_models, "role %s: its model is not in the scenario", roles[i].name);
		role_model[i] = k;
	}
}

/* Round r in `mode`: faults, then the quiet checks; printed and counted. */
static void one_round(struct rng *g, unsigned r, const char *mode)
{
	uint64_t by_kind[K_MAX] = {0};
	uint64_t wrong0 = sum(FH_C_WRONG_BYTES), checked0 = sum(FH_C_BLOCKS_CHECKED), t0 = kvr_now_ns();
	command(FH_CMD_RUN);
	round_faults(g, by_kind);
	char when[64];
	snprintf(when, sizeof(when), "round %u (%s)", r, mode);
	bool ok = quiet_check(when);
	uint64_t n = 0;
	for (unsigned k = 0; k < K_MAX; k++) {
		tot.faults[k] += by_kind[k];
		n += by_kind[k];
	}
	tot.rounds++;
	uint64_t wrong = sum(FH_C_WRONG_BYTES) - wrong0;
	fprintf(stderr, "%s: %s: %.1f s, %llu faults (lookup %llu, loader %llu, storer %llu, disk %llu, "
		"gather %llu, worker %llu; %llu KV memories overwritten after a kill), %llu blocks checked, "
		"%llu wrong bytes; %s\n", sc->name, when,
		(double)(kvr_now_ns() - t0) / 1e9, (unsigned long long)n,
		(unsigned long long)by_kind[K_LOOKUP], (unsigned long long)by_kind[K_LOADER],
		(unsigned long long)by_kind[K_STORER], (unsigned long long)by_kind[K_DISK],
		(unsigned long long)by_kind[K_GATHER], (unsigned long long)by_kind[K_WORKER],
		(unsigned long long)fence_overwrites,
		(unsigned long long)(sum(FH_C_BLOCKS_CHECKED) - checked0), (unsigned long long)wrong,
		ok ? "quiet and clean" : "FAILED its quiet checks: kvringd restarted");
	if (wrong) {
		fprintf(stderr, "%s: %s: the kills of this round:", sc->name, when);
		for (unsigned k = 0; k < n_kills; k++)
			fprintf(stderr, "%s t=%.3f %s (%d)", k ? "," : "", (double)(kills[k].ns - wcfg[0].t0_ns) / 1e9,
				kills[k].name, (int)kills[k].pid);
		fprintf(stderr, "\n");
	}
	if (!ok || wrong) {
		tot.rounds_failed++;
		size_t l = strlen(tot.failed_rounds);
		snprintf(tot.failed_rounds + l, sizeof(tot.failed_rounds) - l, "%s%u", l ? " " : "", r);
	}
	if (!ok)
		restart(mode, when);
}

/* The end: stop, check every file, start again on the same directories, every prompt looked
 * up and loaded. Returns whether the quiet checks after it passed. */
static bool verify_after_restart(void)
{
	stop_workers();
	(void)stop();
	scan_l2("the last round");
	/* What the faults left on disk for a model may be nothing it can be served from (a
	 * write-back round ends with its blocks in L1, half-stored blocks have a lane on disk
	 * only). The seal: every role stores one prompt no round used, write-through, and its
	 * lanes reach the disk before a clean stop; after the restart it must be served whole. */
	start("write-through");
	spawn_all();
	uint32_t sseq = command(FH_CMD_SEAL);
	cr_expect(wait_workers(FH_W_SEALED, sseq, 30000), "the workers did not store the seal prompt");
	cr_expect(H_WAIT(ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES_QUEUED) == 0, 10000),
		  "the seal's L2 writes did not finish (%llu queued)",
		  (unsigned long long)ct_stat(&env, "lookup", KVR_STAT_LK_L2_WRITES_QUEUED));
	stop_workers();
	(void)stop();
	scan_l2("the seal");
	start("write-through");
	spawn_all();
	uint64_t b0[FH_MAX_MODELS], l0[FH_MAX_MODELS], e0[FH_MAX_MODELS], d0[FH_MAX_MODELS], x0[FH_MAX_MODELS];
	for (unsigned k = 0; k < sc->n_models; k++) {
		b0[k] = sum_model(FH_C_BLOCKS_CHECKED, (int)k);
		l0[k] = sum_model(FH_C_LOOKUPS, (int)k);
		e0[k] = sum_model(FH_C_LOOKUP_ERRS, (int)k);
		d0[k] = sum_model(FH_C_LOADS, (int)k);
		x0[k] = sum_model(FH_C_BLOCKS_MISSED, (int)k);
	}
	uint64_t b = sum(FH_C_BLOCKS_CHECKED), y0 = sum(FH_C_BYTES), w0 = sum(FH_C_WRONG_BYTES),
		 k0 = sum(FH_C_WRONG_BLOCKS), m0 = sum(FH_C_BLOCKS_MISSED), p0 = sum(FH_C_VERIFIED);
	uint32_t seq = command(FH_CMD_VERIFY);
	bool verified = wait_workers(FH_W_VERIFIED, seq, 60000);
	cr_expect(verified, "the workers did not go through every prompt after the restart");
	tot.v_blocks = sum(FH_C_BLOCKS_CHECKED) - b;
	for (unsigned k = 0; k < sc->n_models; k++) {
		tot.v_blocks_by_model[k] = sum_model(FH_C_BLOCKS_CHECKED, (int)k) - b0[k];
		tot.v_lookups_by_model[k] = sum_model(FH_C_LOOKUPS, (int)k) - l0[k];
		tot.v_lookup_errs_by_model[k] = sum_model(FH_C_LOOKUP_ERRS, (int)k) - e0[k];
		tot.v_loads_by_model[k] = sum_model(FH_C_LOADS, (int)k) - d0[k];
		tot.v_missed_by_model[k] = sum_model(FH_C_BLOCKS_MISSED, (int)k) - x0[k];
	}
	tot.v_bytes = sum(FH_C_BYTES) - y0;
	tot.v_wrong_bytes = sum(FH_C_WRONG_BYTES) - w0;
	tot.v_wrong_blocks = sum(FH_C_WRONG_BLOCKS) - k0;
	tot.v_missed = sum(FH_C_BLOCKS_MISSED) - m0;
	tot.v_prompts = sum(FH_C_VERIFIED) - p0;
	tot.v_l2_reads = ct_stat(&env, "lookup", KVR_STAT_LK_L2_READS);
	bool ok = quiet_check("after the restart");
	stop_workers();
	return ok;
}

/* Model k was served nothing after the restart: its workers' last errors and what kvringd
 * logged about its disks, for whoever reads the failure. */
static void why_nothing_served(unsigned k)
{
	for (unsigned i = 0; i < sc->n_roles; i++)
		if (role_model[i] == k)
			fprintf(stderr, "%s: %s: last error: %s\n", sc->name, roles[i].name,
				sh[i].last_err[0] ? sh[i].last_err : "none");
	fprintf(stderr, "%s: lookup actor: %llu lookups, %llu keys, %llu matched, %llu L1 hits, %llu L2 reads (%llu failed), "
		"%llu ring stalls\n", sc->name, (unsigned long long)ct_stat(&env, "lookup", KVR_STAT_LK_LOOKUPS),
		(unsigned long long)ct_stat(&env, "lookup", KVR_STAT_LK_KEYS),
		(unsigned long long)ct_stat(&env, "lookup", KVR_STAT_LK_MATCHED),
		(unsigned long long)ct_stat(&env, "lookup", KVR_STAT_LK_L1_HITS),
		(unsigned long long)ct_stat(&env, "lookup", KVR_STAT_LK_L2_READS),
		(unsigned long long)ct_stat(&env, "lookup", KVR_STAT_LK_L2_READ_FAILS),
		(unsigned long long)ct_stat(&env, "lookup", KVR_STAT_LK_L2_RING_STALLS));
	char *log = h_read_file(env.h.log);
	char *from = NULL;
	for (char *at = log ? strstr(log, "info: kvringd ") : NULL; at; at = strstr(at + 1, "info: kvringd "))
		from = at;
	while (from && from > log && from[-1] != '\n')
		from--;
	fprintf(stderr, "%s: kvringd's log since the restart:\n%s\n", sc->name, from ? from : "(none)");
	free(log);
}

/* What every model must have done: stored, loaded checked bytes, left intact files in L2
 * and been served from them after the restart. */
static void expect_each_model(void)
{
	for (unsigned k = 0; k < sc->n_models; k++) {
		const char *name = sc->models[k]->name;
		cr_expect_gt(sum_model(FH_C_STORED_BLOCKS, (int)k), 0, "model %s: no block was ever stored", name);
		cr_expect_gt(sum_model(FH_C_BLOCKS_CHECKED, (int)k), 0, "model %s: no load was ever checked", name);
		cr_expect_gt(tot.l1_checked_by_model[k], 0, "model %s: no committed slot was ever checked", name);
		cr_expect_gt(tot.l2.ok_by_model[k], 0, "model %s: no intact L2 file", name);
		if (!tot.v_blocks_by_model[k])
			why_nothing_served(k);
		cr_expect_gt(tot.v_blocks_by_model[k], 0, "model %s: nothing served from L2 after the restart", name);
	}
	for (unsigned i = 0; i < sc->n_roles; i++) {
		const struct fh_prompt *p = &prompts[role_model[i]][sc->n_prompts];
		uint64_t want = (uint64_t)p->n * (roles[i].kind == FH_ROLE_DCP ? 2 : 1);
		uint64_t got = atomic_load(&sh[i].c[FH_C_SEAL_RESTORED]);
		cr_expect_eq(got, want, "%s: the seal prompt (%u blocks, stored write-through before a clean stop): %llu of "
			     "%llu block lanes restored after the restart", roles[i].name, p->n, (unsigned long long)got,
			     (unsigned long long)want);
	}
	if (!default_run)
		return;
	cr_expect_geq(total_faults(), sc->min_faults, "only %llu faults injected", (unsigned long long)total_faults());
	for (unsigned k = 0; sc->every_kind && k < K_MAX; k++)
		if (kinds_mask >> k & 1)
			cr_expect_gt(tot.faults[k], 0, "no %s was ever killed", kind_name[k]);
}

static void expect_all(bool ok)
{
	uint64_t wrong = sum(FH_C_WRONG_BYTES);
	cr_expect_eq(wrong, 0, "%llu wrong bytes in %llu blocks that loads reported restored", (unsigned long long)wrong,
		     (unsigned long long)sum(FH_C_WRONG_BLOCKS));
	cr_expect_eq(tot.leaked_slots, 0, "%llu slots leaked (not FREE/COMMITTED or pinned once quiet); the first, %s",
		     (unsigned long long)tot.leaked_slots, tot.first_leak);
	cr_expect_eq(tot.l1_wrong, 0, "%llu committed L1 slots held wrong bytes", (unsigned long long)tot.l1_wrong);
	cr_expect_eq(tot.l2.wrong, 0, "%llu L2 files with a valid checksum held wrong bytes",
		     (unsigned long long)tot.l2.wrong);
	cr_expect_eq(tot.l2.damaged, 0, "%llu damaged L2 files under real names", (unsigned long long)tot.l2.damaged);
	cr_expect_eq(sum(FH_C_HANGS), 0, "%llu requests never completed", (unsigned long long)sum(FH_C_HANGS));
	cr_expect_eq(tot.not_idle + tot.not_settled, 0, "%llu quiet checks found busy workers, %llu unsettled actors",
		     (unsigned long long)tot.not_idle, (unsigned long long)tot.not_settled);
	cr_expect_eq(tot.worker_crashes, 0, "%llu worker processes died on their own",
		     (unsigned long long)tot.worker_crashes);
	cr_expect_eq(tot.unclean_stops, 0, "%llu SIGTERMs did not end in a drained exit 0",
		     (unsigned long long)tot.unclean_stops);
	cr_expect(ok, "the quiet checks after the restart failed");
	cr_expect_gt(sum(FH_C_BLOCKS_CHECKED), 0, "no load was ever checked");
	cr_expect_gt(tot.v_blocks, 0, "nothing was served from L2 after the restart");
	expect_each_model();
}

void fr_run(const struct fr_scenario *scenario)
{
	sc = scenario;
	roles = sc->roles;
	unsigned rounds = parse_env();
	struct rng g = {seed};
	prepare(&g);
	start("write-through");
	spawn_all();
	const char *mode = "write-through";
	for (unsigned r = 0; r < rounds; r++) {
		if (r == rounds / 2 && r) {
			mode = "write-back";
			restart(mode, "the write-through rounds");
		}
		one_round(&g, r, mode);
	}
	bool ok = verify_after_restart();
	report();
	report_models();
	expect_all(ok);
}
