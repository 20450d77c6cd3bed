/* kvringd process tests: layout, attach, restarts, crash loop, health, drain, socket take-over, config. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <sched.h>
#include <errno.h>
#include <stddef.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sup_harness.h"
#include "kvr_geometry.h"
#include "kvr_ring_names.h"
#include "kvr_slots.h"
#include "kvr_time.h"

static struct h_inst inst;

static void setup(void)
{
	h_init(&inst, 0700);
}

static void teardown(void)
{
	h_fini(&inst);
}

TestSuite(supervisor, .init = setup, .fini = teardown, .timeout = 30);

static struct kvr_actor_ent *wait_ready(const char *name, int ms)
{
	struct kvr_actor_ent *e = h_actor(&inst, name);
	cr_assert(e, "no actor %s", name);
	bool ok = H_WAIT(atomic_load(&e->state) == KVR_ACTOR_READY && atomic_load(&e->pid) > 0, ms);
	cr_assert(ok, "%s not READY within %d ms (state %s)", name, ms, kvr_actor_state_name(atomic_load(&e->state)));
	return e;
}

/* ---- layout and INSPECT ------------------------------------------------------------- */

Test(supervisor, inspect_layout)
{
	h_write_config(&inst, 2, NULL, NULL);
	h_start(&inst);
	const struct kvr_ctl *c = inst.ctl;

	cr_assert_eq(c->supervisor_pid, inst.pid);
	cr_assert(H_WAIT(atomic_load(&((struct kvr_ctl *)c)->state) == KVR_INST_RUNNING, 2000));
	cr_assert_str_eq(c->socket_path, inst.sock);
	cr_assert_eq(c->max_workers, 2);
	/* lookup + loader/storer per worker slot + one gather actor per possible DCP group */
	cr_assert_eq(atomic_load(&((struct kvr_ctl *)c)->n_actors), 6);
	static const char *const names[] = {"lookup", "loader.0", "storer.0", "loader.1", "storer.1", "gather.0"};
	static const unsigned kinds[] = {KVR_ACTOR_LOOKUP, KVR_ACTOR_LOADER, KVR_ACTOR_STORER, KVR_ACTOR_LOADER,
					 KVR_ACTOR_STORER, KVR_ACTOR_GATHER};
	for (unsigned i = 0; i < 6; i++) {
		struct kvr_actor_ent *e = kvr_ctl_actor(c, i);
		cr_assert_str_eq(e->name, names[i]);
		cr_assert_eq(e->kind, kinds[i]);
		char rn[KVR_RING_NAME_MAX];
		snprintf(rn, sizeof(rn), KVR_RING_CTL_IN, names[i]);
		cr_assert_eq(e->ctl_in, kvr_ctl_find_ring(c, rn));
		const struct kvr_ring_ent *re = kvr_ctl_ring_ent(c, e->ctl_in);
		cr_assert_eq(re->producer, KVR_EP_SUPERVISOR);
		cr_assert_eq(re->consumer, (int)i);
		snprintf(rn, sizeof(rn), KVR_RING_CTL_OUT, names[i]);
		cr_assert_eq(e->ctl_out, kvr_ctl_find_ring(c, rn));
		re = kvr_ctl_ring_ent(c, e->ctl_out);
		cr_assert_eq(re->producer, (int)i);
		cr_assert_eq(re->consumer, KVR_EP_SUPERVISOR);
	}
	wait_ready("lookup", 2000);
	/* no worker attached: loaders, storers and the gather actor are configured but idle */
	for (unsigned i = 1; i < 6; i++) {
		cr_assert_eq(atomic_load(&kvr_ctl_actor(c, i)->state), KVR_ACTOR_IDLE);
		cr_assert_eq(atomic_load(&kvr_ctl_actor(c, i)->pid), 0);
	}
	/* 2 control rings per actor + 8 data rings per worker slot + 2 per scheduler slot (4 by default) */
	cr_assert_eq(atomic_load(&((struct kvr_ctl *)c)->n_rings), 2 * 6 + 8 * 2 + 2 * 4);
	cr_assert_eq(kvr_ctl_find_ring(c, "sched.req.3") >= 0, true);
	cr_assert_eq(kvr_ctl_ring_ent(c, (unsigned)kvr_ctl_find_ring(c, "sched.rep.0"))->consumer, KVR_EP_CLIENT(2));
	static const struct {
		const char *name;
		int prod, cons;
	} data[] = {
		{"lookup.req.1", KVR_EP_CLIENT(1), 0}, {"lookup.rep.1", 0, KVR_EP_CLIENT(1)},
		{"load.req.1", KVR_EP_CLIENT(1), 3},   {"load.rep.1", 3, KVR_EP_CLIENT(1)},
		{"store.req.1", KVR_EP_CLIENT(1), 4},  {"store.rep.1", 4, KVR_EP_CLIENT(1)},
		{"commit.req.1", 4, 0},                {"commit.rep.1", 0, 4},
		{"commit.req.0", 2, 0},                {"load.req.0", KVR_EP_CLIENT(0), 1},
	};
	for (size_t k = 0; k < sizeof(data) / sizeof(data[0]); k++) {
		int i = kvr_ctl_find_ring(c, data[k].name);
		cr_assert(i >= 0, "ring %s missing", data[k].name);
		cr_assert_eq(kvr_ctl_ring_ent(c, (unsigned)i)->producer, data[k].prod, "%s producer", data[k].name);
		cr_assert_eq(kvr_ctl_ring_ent(c, (unsigned)i)->consumer, data[k].cons, "%s consumer", data[k].name);
		cr_assert_eq(kvr_ctl_ring_shm(c, (unsigned)i)->capacity, 64);
	}
	/* the lookup actor claimed the rings it consumes */
	pid_t lk = atomic_load(&kvr_ctl_actor(c, 0)->pid);
	cr_assert_eq(atomic_load(&h_ring(c, "lookup.req.0")->shm->cons_pid), lk);
	cr_assert_eq(atomic_load(&h_ring(c, "commit.rep.1")->shm->prod_pid), lk);
	cr_assert_eq(atomic_load(&h_ring(c, "ctl.lookup.in")->shm->prod_pid), inst.pid);
	/* the effective config is embedded */
	cr_assert(strstr(kvr_ctl_config_json(c), inst.sock));
	cr_assert(strstr(kvr_ctl_config_json(c), "\"health_interval_ms\": 200"));

	/* INSPECT hands out a read-only description: it cannot be mapped writable */
	int fd = h_inspect_fd(inst.sock);
	cr_assert(fd >= 0);
	cr_assert_eq(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDONLY);
	void *w = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	cr_assert_eq(w, MAP_FAILED);
	cr_assert_eq(errno, EACCES);
	close(fd);
}

/* ---- attach ------------------------------------------------------------------------ */

Test(supervisor, attach_busy_detach_reattach)
{
	h_write_config(&inst, 1, NULL, NULL);
	h_start(&inst);
	struct h_worker w1, w2;
	cr_assert_eq(h_attach(inst.sock, &w1), 0);
	cr_assert_eq(w1.status, 0, "attach: %s", w1.reason);
	cr_assert_eq(w1.worker, 0);
	cr_assert_eq(w1.n_fds, 2, "the control segment and the worker's area: no arena, no slot table");
	/* fds[0]: the control segment, read-only: not mappable writable */
	cr_assert_eq(fcntl(w1.fds[0], F_GETFL) & O_ACCMODE, O_RDONLY);
	void *wm = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, w1.fds[0], 0);
	cr_assert_eq(wm, MAP_FAILED, "a worker can map the control segment writable");
	/* fds[1]: worker 0's area, the only memory it can write */
	struct kvr_client_area ah;
	cr_assert_eq(pread(w1.fds[1], &ah, sizeof(ah), 0), (ssize_t)sizeof(ah));
	cr_assert_eq(ah.seg.kind, KVR_SEG_CLIENT);
	cr_assert_eq(ah.slot, 0);
	struct kvr_segment ctl, arena, slots, full;
	struct kvr_ctl *wc = h_worker_map(&w1, &ctl);
	cr_assert_eq(wc->n_areas, 1 + KVR_CTL_MAX_SCHEDULERS);
	/* its mapping of the control segment is read-only: a write faults */
	pid_t child = fork();
	cr_assert_geq(child, 0);
	if (child == 0) {
		signal(SIGSEGV, SIG_DFL);
		*(volatile uint32_t *)&kvr_ctl_actor(wc, 0)->state = KVR_ACTOR_FAILED;
		_exit(0);
	}
	int cst;
	cr_assert_eq(waitpid(child, &cst, 0), child);
	cr_assert(WIFSIGNALED(cst) && WTERMSIG(cst) == SIGSEGV, "a write to the actor table did not fault (%#x)", cst);
	/* its own rings are in its area; every other client's area reads as zeros there, while
	 * kvringd's mapping holds that client's rings */
	int lk0 = kvr_ctl_find_ring(wc, "lookup.req.0"), sk0 = kvr_ctl_find_ring(wc, "sched.req.0");
	cr_assert(lk0 >= 0 && sk0 >= 0);
	const struct kvr_area_ent *a0 = kvr_ctl_area_ent(wc, 0);
	cr_assert(kvr_ctl_ring_ent(wc, (unsigned)lk0)->offset > a0->offset &&
		  kvr_ctl_ring_ent(wc, (unsigned)lk0)->offset < a0->offset + a0->bytes);
	h_daemon_ctl(&inst, 0, &full);
	for (unsigned a = 1; a < wc->n_areas; a++) {
		const struct kvr_area_ent *ae = kvr_ctl_area_ent(wc, a);
		const uint8_t *mine = (const uint8_t *)wc + ae->offset, *real = (const uint8_t *)full.base + ae->offset;
		for (uint64_t b = 0; b < ae->bytes; b++)
			if (mine[b])
				cr_assert_fail("client area %u byte %llu is visible to worker 0", a, (unsigned long long)b);
		cr_assert_eq(((const struct kvr_client_area *)(const void *)real)->slot, a);
		cr_assert_eq(((const struct kvr_client_area *)(const void *)real)->seg.kind, KVR_SEG_CLIENT);
	}
	const struct kvr_ring_shm *sched_ring = kvr_ctl_ring_shm(full.base, (unsigned)sk0);
	cr_assert_eq(sched_ring->magic, KVR_RING_MAGIC, "kvringd's view holds scheduler 0's ring");
	cr_assert_eq(kvr_ctl_ring_shm(wc, (unsigned)sk0)->magic, 0, "worker 0 sees no scheduler ring");
	kvr_segment_close(&full);
	/* The instance's: 64 MiB of L1 hold 3 slots of one qwen3-8b block lane (36 layers x K,V
	 * x 8 heads x 128 x bf16 x 128 tokens = 18 MiB) after the arena's 4 KiB header */
	struct kvr_slot_table *t;
	int fd = h_daemon_memfd(inst.pid, "kvring-arena", O_RDONLY);
	cr_assert_eq(kvr_segment_map(fd, KVR_SEG_ARENA, 0, &arena), 0);
	close(fd);
	fd = h_daemon_memfd(inst.pid, "kvring-slots", O_RDONLY);
	cr_assert_eq(kvr_segment_map(fd, KVR_SEG_SLOTS, 0, &slots), 0);
	close(fd);
	cr_assert_eq(kvr_slots_attach(&slots, &t), 0);
	cr_assert_eq(t->slot_bytes, 18874368);
	cr_assert_eq(t->n_slots, 3);
	cr_assert_eq(arena.size, 4096 + 3 * 18874368);
	kvr_segment_close(&ctl);
	kvr_segment_close(&arena);
	kvr_segment_close(&slots);

	struct kvr_worker_ent *we = kvr_ctl_worker(inst.ctl, 0);
	cr_assert_eq(atomic_load(&we->state), KVR_WORKER_ATTACHED);
	cr_assert_eq(atomic_load(&we->pid), getpid());
	cr_assert_eq(we->uid, getuid());
	cr_assert_eq(we->generation, 1);
	struct kvr_actor_ent *ld = wait_ready("loader.0", 3000);
	struct kvr_actor_ent *st = wait_ready("storer.0", 3000);
	pid_t ld_pid = atomic_load(&ld->pid), st_pid = atomic_load(&st->pid);
	cr_assert_eq(atomic_load(&h_ring(inst.ctl, "load.req.0")->shm->cons_pid), ld_pid);
	cr_assert_eq(atomic_load(&h_ring(inst.ctl, "store.req.0")->shm->cons_pid), st_pid);
	cr_assert_eq(atomic_load(&h_ring(inst.ctl, "commit.req.0")->shm->prod_pid), st_pid);

	/* one slot only */
	cr_assert_eq(h_attach(inst.sock, &w2), 0);
	cr_assert_eq(w2.status, -EBUSY);
	cr_assert_str_eq(w2.reason, "no free worker slot (max_workers=1)");
	cr_assert_eq(w2.n_fds, 0);
	h_worker_close(&w2);

	/* a mapping of its area that outlives the worker's attach (a worker that detaches and
	 * runs on keeps one) */
	struct stat ast1;
	cr_assert_eq(fstat(w1.fds[1], &ast1), 0);
	uint8_t *old_area = mmap(NULL, (size_t)ast1.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, w1.fds[1], 0);
	cr_assert_neq(old_area, MAP_FAILED);

	/* the worker goes away: its loader and storer stop cleanly, the slot is freed */
	h_worker_close(&w1);
	cr_assert(H_WAIT(atomic_load(&we->state) == KVR_WORKER_FREE, 4000), "slot not freed");
	cr_assert_eq(atomic_load(&ld->state), KVR_ACTOR_IDLE);
	cr_assert_eq(atomic_load(&st->state), KVR_ACTOR_IDLE);
	cr_assert_eq(atomic_load(&ld->pid), 0);
	cr_assert_eq(ld->last_exit_code, 0);
	cr_assert_eq(st->last_exit_code, 0);
	cr_assert_eq(ld->restarts, 0);
	cr_assert(!h_pid_alive(ld_pid) && !h_pid_alive(st_pid));
	/* the lookup actor heard about it (WORKER_GONE) and did not count it as malformed */
	cr_assert(H_WAIT(h_stat(&inst, "lookup", KVR_STAT_LK_WORKERS_GONE) == 1, 1000), "no WORKER_GONE");
	cr_assert_eq(h_stat(&inst, "lookup", KVR_STAT_MALFORMED), 0);

	/* and the slot can be attached again: a new generation, new actors */
	cr_assert_eq(h_attach(inst.sock, &w2), 0);
	cr_assert_eq(w2.status, 0, "re-attach: %s", w2.reason);
	cr_assert_eq(w2.worker, 0);
	cr_assert_eq(we->generation, 2);
	ld = wait_ready("loader.0", 3000);
	cr_assert_neq(atomic_load(&ld->pid), ld_pid);
	cr_assert_eq(atomic_load(&ld->generation), 2);

	/* ... with a fresh area: what the old one's mapping writes reaches nobody. The new
	 * worker's lookup ring, as kvringd and the lookup actor map it, keeps its header, and
	 * the lookup actor reads what the new worker writes there (a bad message, counted). */
	struct stat ast2;
	cr_assert_eq(fstat(w2.fds[1], &ast2), 0);
	cr_assert_neq(ast2.st_ino, ast1.st_ino, "the slot's next worker got the same area");
	memset(old_area, 0xff, (size_t)ast1.st_size);
	munmap(old_area, (size_t)ast1.st_size);
	h_daemon_areas(&inst, 0, &inst.ro);
	const struct kvr_ring_shm *lrq = h_ring(inst.ctl, "lookup.req.0")->shm;
	cr_assert_eq(lrq->magic, KVR_RING_MAGIC, "the old area's writes reached the new worker's ring");
	cr_assert_eq(atomic_load(&lrq->head), atomic_load(&lrq->tail));
	struct kvr_segment seg2;
	struct kvr_ctl *c2 = h_worker_map(&w2, &seg2);
	struct kvr_ring *req2 = h_ring(c2, "lookup.req.0");
	kvr_ring_claim_producer(req2, getpid());
	struct kvr_msg bad;
	kvr_msg_build(&bad, 60, 0, 1, 0, NULL, 0); /* unknown type */
	cr_assert_eq(kvr_ring_try_enqueue(req2, &bad), 0); /* wakes the consumer */
	cr_assert(H_WAIT(h_stat(&inst, "lookup", KVR_STAT_MALFORMED) == 1, 3000),
		  "the lookup actor does not read the new worker's fresh ring");
	kvr_segment_close(&seg2);
	h_worker_close(&w2);
}

/* ---- kill -9 and restart ----------------------------------------------------------- */

static void kill_and_check(const char *name)
{
	struct kvr_actor_ent *e = wait_ready(name, 3000);
	char rin[KVR_RING_NAME_MAX], rout[KVR_RING_NAME_MAX];
	snprintf(rin, sizeof(rin), KVR_RING_CTL_IN, name);
	snprintf(rout, sizeof(rout), KVR_RING_CTL_OUT, name);
	/* a pong has been answered before the kill */
	cr_assert(H_WAIT(h_stat(&inst, name, KVR_STAT_PINGS) > 0, 2000), "%s never answered a ping", name);

	pid_t pid0 = atomic_load(&e->pid);
	uint32_t gen0 = atomic_load(&e->generation), restarts0 = e->restarts;
	cr_assert_eq(kill(pid0, SIGKILL), 0);

	bool back = H_WAIT(atomic_load(&e->pid) > 0 && atomic_load(&e->pid) != pid0 &&
				   atomic_load(&e->state) == KVR_ACTOR_READY,
			   3000);
	cr_assert(back, "%s did not come back (state %s)", name, kvr_actor_state_name(atomic_load(&e->state)));
	pid_t pid1 = atomic_load(&e->pid);
	cr_assert_eq(atomic_load(&e->generation), gen0 + 1);
	cr_assert_eq(e->restarts, restarts0 + 1);
	cr_assert_eq(e->last_exit_signal, SIGKILL);
	cr_assert_eq(e->last_exit_code, -1);
	cr_assert(!h_pid_alive(pid0));
	/* its control rings are re-attached by the new process ... */
	cr_assert_eq(atomic_load(&h_ring(inst.ctl, rin)->shm->cons_pid), pid1);
	cr_assert_eq(atomic_load(&h_ring(inst.ctl, rout)->shm->prod_pid), pid1);
	/* ... and it answers pings */
	uint64_t pings = h_stat(&inst, name, KVR_STAT_PINGS);
	uint64_t out_deq = atomic_load(&h_ring(inst.ctl, rout)->shm->dequeued);
	cr_assert(H_WAIT(h_stat(&inst, name, KVR_STAT_PINGS) > pings &&
				 atomic_load(&h_ring(inst.ctl, rout)->shm->dequeued) > out_deq,
			 2000),
		  "no pong from the restarted %s", name);
	cr_assert_eq(atomic_load(&e->pid), pid1, "%s restarted again", name);
	cr_assert_eq(atomic_load(&((struct kvr_ctl *)inst.ctl)->state), KVR_INST_RUNNING);
}

Test(supervisor, kill9_lookup)
{
	h_write_config(&inst, 2, NULL, NULL);
	h_start(&inst);
	kill_and_check("lookup");
	cr_assert(h_log_contains(&inst, "lookup killed by signal 9"));
}

Test(supervisor, kill9_loader_and_storer)
{
	h_write_config(&inst, 2, NULL, NULL);
	h_start(&inst);
	struct h_worker w;
	cr_assert_eq(h_attach(inst.sock, &w), 0);
	cr_assert_eq(w.status, 0, "%s", w.reason);
	kill_and_check("loader.0");
	kill_and_check("storer.0");
	/* the other worker slot was never started */
	cr_assert_eq(atomic_load(&h_actor(&inst, "loader.1")->state), KVR_ACTOR_IDLE);
	h_worker_close(&w);
}

/* An actor that stops answering (SIGSTOP) is killed after 5 missed pings and restarted. */
Test(supervisor, missed_pings_kill)
{
	h_write_config(&inst, 1, NULL, NULL);
	h_start(&inst);
	struct kvr_actor_ent *e = wait_ready("lookup", 2000);
	pid_t pid0 = atomic_load(&e->pid);
	uint32_t gen0 = atomic_load(&e->generation);
	cr_assert_eq(kill(pid0, SIGSTOP), 0);
	/* 5 intervals of 200 ms: killed after about 1 s, certainly within 3 s */
	bool back = H_WAIT(atomic_load(&e->pid) != pid0 && atomic_load(&e->state) == KVR_ACTOR_READY, 3000);
	cr_assert(back, "stopped lookup not replaced");
	cr_assert_eq(e->last_exit_signal, SIGKILL);
	cr_assert_eq(atomic_load(&e->generation), gen0 + 1);
	cr_assert_eq(e->restarts, 1);
	cr_assert(h_log_contains(&inst, "missed 5 pings in a row"));
}

/* Every thread of process pid allowed only on CPU cpu (-1: on every CPU). */
static void pin_threads(pid_t pid, int cpu)
{
	char dir[64];
	snprintf(dir, sizeof(dir), "/proc/%d/task", (int)pid);
	DIR *d = opendir(dir);
	cr_assert(d, "cannot list %s", dir);
	cpu_set_t set;
	CPU_ZERO(&set);
	for (int c = 0; c < CPU_SETSIZE && c < sysconf(_SC_NPROCESSORS_ONLN); c++)
		if (cpu < 0 || c == cpu)
			CPU_SET(c, &set);
	for (struct dirent *de; (de = readdir(d));)
		if (de->d_name[0] != '.')
			(void)sched_setaffinity((pid_t)atoi(de->d_name), sizeof(set), &set);
	closedir(d);
}

/*
 * An actor that waits for a CPU the whole time (a real-time spinner holds its core) is
 * starved, not hung: kvringd does not count the pings it had no CPU to answer, and it lives
 * through 14 health intervals (5 missed pings kill) — while a stopped one (missed_pings_kill)
 * is still killed.
 */
Test(supervisor, starved_actor_is_not_killed)
{
	if (sysconf(_SC_NPROCESSORS_ONLN) < 2)
		cr_skip_test("needs two CPUs: one to starve the actor on, one for kvringd");
	h_write_config_with(&inst, NULL, 1,
			    "\"ready_timeout_ms\": 2000, \"stable_after_ms\": 1000, \"health_interval_ms\": 50, "
			    "\"drain_timeout_ms\": 3000",
			    ",\n  \"l1\": {\"capacity_bytes\": \"64MiB\", \"huge_pages\": false}");
	h_start(&inst);
	struct kvr_actor_ent *e = wait_ready("lookup", 2000);
	pid_t pid0 = atomic_load(&e->pid);
	uint32_t gen0 = atomic_load(&e->generation), starved0 = atomic_load(&e->health_starved);
	pin_threads(inst.pid, 1);
	pin_threads(getpid(), 1);
	pin_threads(pid0, 0);
	int ready[2];
	cr_assert_eq(pipe(ready), 0);
	pid_t spin = fork();
	cr_assert_geq(spin, 0);
	if (spin == 0) {
		/* CPU 0 at real-time priority for 700 ms (the RT budget is 950 ms a second): the
		 * lookup actor, allowed only there, gets no CPU at all meanwhile */
		cpu_set_t one;
		CPU_ZERO(&one);
		CPU_SET(0, &one);
		struct sched_param sp = {.sched_priority = 1};
		char ok = sched_setaffinity(0, sizeof(one), &one) == 0 && sched_setscheduler(0, SCHED_FIFO, &sp) == 0;
		(void)!write(ready[1], &ok, 1);
		uint64_t end = kvr_now_ns() + 700000000ull;
		while (kvr_now_ns() < end)
			;
		_exit(0);
	}
	close(ready[1]);
	char ok = 0;
	cr_assert_eq(read(ready[0], &ok, 1), 1);
	close(ready[0]);
	int st;
	cr_assert_eq(waitpid(spin, &st, 0), spin);
	if (!ok)
		cr_skip_test("cannot run a SCHED_FIFO spinner here (needs CAP_SYS_NICE)");
	pin_threads(pid0, -1);
	uint32_t starved = atomic_load(&e->health_starved) - starved0;
	cr_expect_geq(starved, 5, "only %u health ticks found the lookup actor waiting for a CPU in 700 ms (14 ticks)",
		      starved);
	cr_expect_eq(atomic_load(&e->pid), pid0, "the starved lookup actor was replaced");
	cr_expect_eq(atomic_load(&e->generation), gen0);
	cr_expect_eq(e->restarts, 0);
	cr_expect(!h_log_contains(&inst, "pings in a row"), "kvringd killed an actor for pings it could not answer");
	/* and it answers again: its pong clears the outstanding ping */
	cr_assert(H_WAIT(atomic_load(&e->heartbeat_ns) > kvr_now_ns() - 100000000ull, 2000),
		  "the lookup actor's heartbeat did not move after the spinner ended");
	cr_expect_eq(atomic_load(&e->state), KVR_ACTOR_READY);
}

/* ---- crash loop and ready timeout --------------------------------------------------- */

static void make_actor_dir(const char *dir, const char *lookup_script)
{
	cr_assert_eq(mkdir(dir, 0700), 0);
	char p[256], real[512];
	snprintf(p, sizeof(p), "%s/kvring-lookup", dir);
	FILE *f = fopen(p, "w");
	cr_assert(f);
	fputs(lookup_script, f);
	fclose(f);
	cr_assert_eq(chmod(p, 0755), 0);
	static const char *const others[] = {"loader", "storer"};
	for (int i = 0; i < 2; i++) {
		snprintf(p, sizeof(p), "%s/kvring-%s", dir, others[i]);
		char rel[64];
		snprintf(rel, sizeof(rel), "actors/%s/kvring-%s", others[i], others[i]);
		h_build_path(real, sizeof(real), rel);
		cr_assert_eq(symlink(real, p), 0);
	}
}

Test(supervisor, crash_loop_gives_up)
{
	char dir[640], extra[800];
	snprintf(dir, sizeof(dir), "%s/actors", inst.dir);
	make_actor_dir(dir, "#!/bin/sh\nexit 3\n");
	snprintf(extra, sizeof(extra), ", \"actor_dir\": \"%s\"", dir);
	h_write_config(&inst, 1, extra, NULL);
	h_start(&inst);
	struct kvr_actor_ent *e = h_actor(&inst, "lookup");
	cr_assert(H_WAIT(atomic_load(&e->state) == KVR_ACTOR_FAILED, 5000), "state %s",
		  kvr_actor_state_name(atomic_load(&e->state)));
	cr_assert_eq(atomic_load(&((struct kvr_ctl *)inst.ctl)->state), KVR_INST_DEGRADED);
	cr_assert_eq(e->last_exit_code, 3);
	cr_assert_eq(e->last_exit_signal, 0);
	/* 3 deaths within 10 s: started once, restarted twice, then given up */
	cr_assert_eq(e->restarts, 2);
	cr_assert_eq(atomic_load(&e->generation), 3);
	cr_assert_eq(atomic_load(&e->pid), 0);
	usleep(500 * 1000); /* more than the longest backoff: nothing restarts it */
	cr_assert_eq(atomic_load(&e->generation), 3);
	cr_assert_eq(atomic_load(&e->state), KVR_ACTOR_FAILED);
	cr_assert(h_log_contains(&inst, "crash loop (3 deaths within 10 s): giving up"));
	/* the supervisor keeps serving: it answers, and refuses an attach it could not serve */
	struct h_worker w;
	cr_assert_eq(h_attach(inst.sock, &w), 0);
	cr_assert_eq(w.status, -EPIPE, "%s", w.reason);
	cr_assert(strstr(w.reason, "the lookup actor was given up after 3 deaths within 10 s (last exit code 3)"), "%s",
		  w.reason);
	h_worker_close(&w);
}

/* Raw ATTACH (op KVR_OP_ATTACH with geometry g and a KV memfd of its extent, or
 * KVR_OP_ATTACH_SCHED with the default engine when g is NULL) over a new connection, kept
 * open in w->sock: the reply's status and reason. 0 when a reply arrived. */
static int raw_attach(const char *sock, const struct kvr_geometry *g, struct h_worker *w)
{
	memset(w, 0, sizeof(*w));
	struct kvr_proto_req req = {.magic = KVR_PROTO_MAGIC, .version = KVR_PROTO_VERSION};
	int kv = -1;
	if (g) {
		kv = memfd_create("h-kv", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		cr_assert(kv >= 0 && ftruncate(kv, (off_t)kvr_geometry_kv_extent(g)) == 0);
		req.op = KVR_OP_ATTACH;
		req.payload_len = sizeof(*g);
		memcpy(req.payload, g, sizeof(*g));
	} else {
		req.op = KVR_OP_ATTACH_SCHED;
		req.payload_len = sizeof(struct kvr_attach_engine); /* zeros: engine "default" */
	}
	w->sock = kvr_proto_connect(sock);
	cr_assert_geq(w->sock, 0, "connect %s: %s", sock, strerror(-w->sock));
	/* a reply that never comes fails the test here, not at Criterion's timeout */
	struct timeval tv = {.tv_sec = 5};
	cr_assert_eq(setsockopt(w->sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
	(void)kvr_proto_send(w->sock, &req, offsetof(struct kvr_proto_req, payload) + req.payload_len, &kv, g ? 1 : 0);
	if (kv >= 0)
		close(kv);
	static struct kvr_proto_rep rep;
	memset(&rep, 0, sizeof(rep));
	ssize_t n = kvr_proto_recv(w->sock, &rep, sizeof(rep), w->fds, KVR_PROTO_MAX_FDS, &w->n_fds);
	if (n <= 0)
		return n < 0 ? (int)n : -ECONNRESET;
	w->status = rep.status;
	w->worker = rep.worker;
	snprintf(w->reason, sizeof(w->reason), "%s", rep.reason);
	return 0;
}

/* Issue 22: the real lookup actor killed until its crash-loop tally gives it up (FAILED).
 * A worker's and a scheduler's attach are refused at once, naming it — not served (every
 * lookup would fail) and not left to wait out the client's attach timeout — and no actor
 * of the worker is started. */
Test(supervisor, attach_refused_once_lookup_given_up)
{
	h_write_config_with(&inst, NULL, 1,
			    "\"ready_timeout_ms\": 2000, \"stable_after_ms\": 1000, \"restart_backoff_initial_ms\": 50, "
			    "\"restart_backoff_max_ms\": 400, \"crash_loop_window_s\": 10, \"crash_loop_max_deaths\": 2, "
			    "\"health_interval_ms\": 200, \"attach_timeout_ms\": 5000",
			    ",\n  \"l1\": {\"capacity_bytes\": \"64MiB\", \"huge_pages\": false}");
	h_start(&inst);
	struct kvr_actor_ent *e = wait_ready("lookup", 3000);
	pid_t pid0 = atomic_load(&e->pid);
	cr_assert_eq(kill(pid0, SIGKILL), 0);
	cr_assert(H_WAIT(atomic_load(&e->pid) > 0 && atomic_load(&e->pid) != pid0, 3000), "lookup not restarted");
	cr_assert_eq(kill(atomic_load(&e->pid), SIGKILL), 0);
	cr_assert(H_WAIT(atomic_load(&e->state) == KVR_ACTOR_FAILED, 3000), "lookup %s after 2 deaths",
		  kvr_actor_state_name(atomic_load(&e->state)));

	struct h_worker w;
	cr_assert_eq(raw_attach(inst.sock, NULL, &w), 0, "no reply to the scheduler's attach");
	cr_assert_eq(w.status, -EPIPE, "scheduler attach: status %d (%s)", w.status, w.reason);
	cr_assert_eq(w.n_fds, 0);
	cr_assert_str_eq(w.reason, "the lookup actor was given up after 2 deaths within 10 s (last killed by signal 9): "
				   "restart kvringd");
	h_worker_close(&w);

	cr_assert_eq(h_attach(inst.sock, &w), 0, "no reply to the worker's attach");
	cr_assert_eq(w.status, -EPIPE, "worker attach: status %d (%s)", w.status, w.reason);
	cr_assert_eq(w.n_fds, 0);
	cr_assert_str_eq(w.reason, "the lookup actor was given up after 2 deaths within 10 s (last killed by signal 9): "
				   "restart kvringd");
	h_worker_close(&w);
	cr_assert(h_log_contains(&inst, "attach from pid"), "the refusal is logged");
	cr_assert_eq(atomic_load(&h_actor(&inst, "loader.0")->state), KVR_ACTOR_IDLE, "a refused worker's loader started");
	cr_assert_eq(atomic_load(&h_actor(&inst, "storer.0")->state), KVR_ACTOR_IDLE);
	cr_assert_eq(atomic_load(&kvr_ctl_worker(inst.ctl, 0)->state), KVR_WORKER_FREE);
}

/* Issue 22: dcp_interleave means nothing without DCP; anything but 1 is refused at attach by
 * the one geometry check (kvr_geometry_validate) that the client library makes too. */
Test(supervisor, attach_refuses_interleave_without_dcp)
{
	h_write_config(&inst, 1, NULL, NULL);
	h_start(&inst);
	struct kvr_geometry g;
	cr_assert_eq(kvr_preset_geometry(kvr_preset_find("qwen3-8b"), 1, 0, 128, 2, &g), 0);
	g.dcp_interleave = 7;
	struct h_worker w;
	cr_assert_eq(raw_attach(inst.sock, &g, &w), 0);
	cr_assert_eq(w.status, -EINVAL, "status %d (%s)", w.status, w.reason);
	cr_assert_str_eq(w.reason, "geometry: dcp_interleave: 7 with dcp_size 1 (without DCP it must be 1)");
	h_worker_close(&w);
	g.dcp_interleave = 1; /* the same attach, right: served */
	cr_assert_eq(raw_attach(inst.sock, &g, &w), 0);
	cr_assert_eq(w.status, 0, "%s", w.reason);
	h_worker_close(&w);
}

Test(supervisor, ready_timeout_kills)
{
	char dir[640], extra[800];
	snprintf(dir, sizeof(dir), "%s/actors", inst.dir);
	/* never writes the readiness byte */
	make_actor_dir(dir, "#!/bin/sh\nexec sleep 30\n");
	snprintf(extra, sizeof(extra), ", \"actor_dir\": \"%s\"", dir);
	h_write_config_with(&inst, extra, 1,
			    "\"ready_timeout_ms\": 200, \"restart_backoff_initial_ms\": 50, \"restart_backoff_max_ms\": 100, "
			    "\"crash_loop_max_deaths\": 2, \"crash_loop_window_s\": 10",
			    ",\n  \"l1\": {\"capacity_bytes\": \"64MiB\", \"huge_pages\": false}");
	h_start(&inst);
	struct kvr_actor_ent *e = h_actor(&inst, "lookup");
	/* 200 ms, kill, 50 ms backoff, 200 ms, kill: FAILED after two deaths */
	cr_assert(H_WAIT(atomic_load(&e->state) == KVR_ACTOR_FAILED, 3000), "state %s",
		  kvr_actor_state_name(atomic_load(&e->state)));
	cr_assert_eq(e->last_exit_signal, SIGKILL);
	cr_assert_eq(e->restarts, 1);
	cr_assert(h_log_contains(&inst, "not ready within 200 ms: killing it"));
}

/* ---- shutdown ---------------------------------------------------------------------- */

Test(supervisor, sigterm_drains_and_cleans_up)
{
	h_write_config(&inst, 2, NULL, NULL);
	h_start(&inst);
	struct h_worker w;
	cr_assert_eq(h_attach(inst.sock, &w), 0);
	cr_assert_eq(w.status, 0);
	pid_t pids[3];
	pids[0] = atomic_load(&wait_ready("lookup", 2000)->pid);
	pids[1] = atomic_load(&wait_ready("loader.0", 3000)->pid);
	pids[2] = atomic_load(&wait_ready("storer.0", 3000)->pid);
	ino_t ino = inst.ctl_ino;
	dev_t dev = inst.ctl_dev;
	char who[256];
	cr_assert_geq(h_count_segment_users(ino, dev, who, sizeof(who)), 4, "users: %s", who);
	/* let go of everything the test holds on the segment, except the attach connection */
	for (unsigned i = 0; i < w.n_fds; i++)
		close(w.fds[i]);
	w.n_fds = 0;
	h_unmap(&inst);

	cr_assert_eq(kill(inst.pid, SIGTERM), 0);
	int st = h_wait_exit(inst.pid, 3000 + 1000);
	char *log = h_read_file(inst.log);
	cr_assert_neq(st, -1, "kvringd did not exit; log:\n%s", log);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exit status 0x%x; log:\n%s", st, log);
	free(log);
	inst.pid = 0;
	struct stat sb;
	cr_assert_eq(stat(inst.sock, &sb), -1, "socket file left behind");
	cr_assert_eq(errno, ENOENT);
	for (int i = 0; i < 3; i++)
		cr_assert(!h_pid_alive(pids[i]), "actor pid %d still alive", (int)pids[i]);
	int users = h_count_segment_users(ino, dev, who, sizeof(who));
	cr_assert_eq(users, 0, "control segment still open in: %s", who);
	cr_assert(h_log_contains(&inst, "draining"));
	cr_assert(h_log_contains(&inst, "loader.0 stopped (exited with code 0)"));
	h_worker_close(&w);
}

/* Drain waits while a live actor still has work queued, and ends once it is taken. */
Test(supervisor, sigterm_waits_for_rings)
{
	h_write_config(&inst, 1, NULL, NULL);
	h_start(&inst);
	pid_t lk = atomic_load(&wait_ready("lookup", 2000)->pid);
	struct h_worker w;
	cr_assert_eq(h_attach(inst.sock, &w), 0);
	cr_assert_eq(w.status, 0);
	struct kvr_segment seg;
	struct kvr_ctl *c;
	c = h_worker_map(&w, &seg);
	struct kvr_ring *req = h_ring(c, "lookup.req.0");

	cr_assert_eq(kill(lk, SIGSTOP), 0);
	struct kvr_msg m;
	kvr_msg_build(&m, 60, 0, 7, 0, NULL, 0);
	cr_assert_eq(kvr_ring_try_enqueue(req, &m), 0);
	cr_assert_eq(kill(inst.pid, SIGTERM), 0);
	struct stat sb;
	cr_assert(H_WAIT(stat(inst.sock, &sb) < 0, 1000), "socket not removed when draining");
	cr_assert_eq(atomic_load(&c->state), KVR_INST_DRAINING);
	usleep(300 * 1000);
	cr_assert_eq(waitpid(inst.pid, NULL, WNOHANG), 0, "kvringd did not wait for lookup.req.0");
	cr_assert_eq(kvr_ring_count(req), 1);

	cr_assert_eq(kill(lk, SIGCONT), 0);
	int st = h_wait_exit(inst.pid, 2000);
	cr_assert(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "status 0x%x", st);
	inst.pid = 0;
	cr_assert_eq(kvr_ring_count(req), 0);
	cr_assert_eq(atomic_load(&req->shm->rejected), 1);
	cr_assert_eq(atomic_load(&c->state), KVR_INST_STOPPED);
	cr_assert(h_log_contains(&inst, "rings drained: stopping every actor"));
	kvr_segment_close(&seg);
	h_worker_close(&w);
}

/* ---- the socket path --------------------------------------------------------------- */

Test(supervisor, second_instance_refused)
{
	h_write_config(&inst, 1, NULL, NULL);
	h_start(&inst);
	struct h_inst two;
	h_init(&two, 0700);
	const char *args[] = {"--config", inst.cfg, NULL};
	pid_t p2 = h_spawn_kvringd(&two, args);
	int st = h_wait_exit(p2, 3000);
	char *log = h_read_file(two.log);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status 0x%x; log:\n%s", st, log);
	char want[256];
	snprintf(want, sizeof(want), "kvringd: another instance is serving %s (pid %d)\n", inst.sock, (int)inst.pid);
	cr_assert_str_eq(log, want);
	free(log);
	h_fini(&two);
	/* the first one still serves, from the same socket */
	h_inspect_map(&inst);
	cr_assert_eq(inst.ctl->supervisor_pid, inst.pid);
}

Test(supervisor, stale_socket_replaced)
{
	h_write_config(&inst, 1, NULL, NULL);
	h_start(&inst);
	pid_t old = inst.pid;
	pid_t old_lookup = atomic_load(&wait_ready("lookup", 2000)->pid);
	h_unmap(&inst);
	cr_assert_eq(kill(old, SIGKILL), 0);
	cr_assert_neq(h_wait_exit(old, 2000), -1);
	struct stat sb;
	cr_assert_eq(stat(inst.sock, &sb), 0, "a killed kvringd leaves its socket file");
	cr_assert(S_ISSOCK(sb.st_mode));
	/* its actors follow it (parent-death signal) */
	cr_assert(H_WAIT(!h_pid_alive(old_lookup), 2000));

	h_start(&inst);
	cr_assert_neq(inst.pid, old);
	cr_assert_eq(inst.ctl->supervisor_pid, inst.pid);
	wait_ready("lookup", 2000);
	cr_assert(h_log_contains(&inst, "replacing stale socket"));
	struct h_worker w;
	cr_assert_eq(h_attach(inst.sock, &w), 0);
	cr_assert_eq(w.status, 0);
	h_worker_close(&w);
}

static unsigned long cpu_ticks(pid_t pid)
{
	char p[64];
	snprintf(p, sizeof(p), "/proc/%d/stat", (int)pid);
	char *st = h_read_file(p);
	char *rp = strrchr(st, ')');
	unsigned long ut = 0, stime = 0;
	/* after "(comm)": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime */
	cr_assert(rp && sscanf(rp + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &stime) == 2);
	free(st);
	return ut + stime;
}

/* Out of descriptors, accept fails while the connection stays queued: kvringd pauses
 * accepting instead of spinning on the readable socket, and serves it once it can. */
Test(supervisor, accept_without_fds_does_not_spin)
{
	h_write_config(&inst, 1, NULL, NULL);
	h_start(&inst);
	wait_ready("lookup", 2000);
	/* the arena's background prefault is CPU work of its own: let it finish first */
	cr_assert(H_WAIT(h_log_contains(&inst, "faulted in, in"), 20000), "the arena prefault did not finish");
	struct rlimit old, tight;
	cr_assert_eq(prlimit(inst.pid, RLIMIT_NOFILE, NULL, &old), 0);
	tight = old;
	tight.rlim_cur = 0; /* no new descriptor at all; the open ones stay usable */
	cr_assert_eq(prlimit(inst.pid, RLIMIT_NOFILE, &tight, NULL), 0);

	int sock = kvr_proto_connect(inst.sock);
	cr_assert(sock >= 0, "connect: %s", strerror(-sock));
	struct kvr_proto_req req = {.magic = KVR_PROTO_MAGIC, .version = KVR_PROTO_VERSION, .op = KVR_OP_INSPECT};
	cr_assert_eq(kvr_proto_send(sock, &req, offsetof(struct kvr_proto_req, payload), NULL, 0), 0);
	cr_assert(H_WAIT(h_log_contains(&inst, "accept: Too many open files: not accepting for 100 ms"), 2000));
	unsigned long t0 = cpu_ticks(inst.pid);
	usleep(400 * 1000);
	unsigned long used = cpu_ticks(inst.pid) - t0;
	long hz = sysconf(_SC_CLK_TCK);
	cr_assert_leq(used * 1000 / (unsigned long)hz, 100, "kvringd used %lu ms of CPU in 400 ms", used * 1000 / hz);

	cr_assert_eq(prlimit(inst.pid, RLIMIT_NOFILE, &old, NULL), 0);
	struct timeval tv = {.tv_sec = 2};
	cr_assert_eq(setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
	static struct kvr_proto_rep rep;
	int fds[KVR_PROTO_MAX_FDS];
	unsigned n_fds = 0;
	ssize_t n = kvr_proto_recv(sock, &rep, sizeof(rep), fds, KVR_PROTO_MAX_FDS, &n_fds);
	cr_assert_gt(n, 0, "no reply once fds are available again: %s", strerror((int)-n));
	cr_assert_eq(rep.status, 0);
	/* the control segment, the slot table, and the areas of 1 worker + 16 scheduler slots */
	cr_assert_eq(n_fds, 2 + 1 + KVR_CTL_MAX_SCHEDULERS, "the control segment, the slot table, every client area");
	for (unsigned i = 0; i < n_fds; i++) { /* all read-only: an observer cannot map them writable */
		cr_assert_eq(fcntl(fds[i], F_GETFL) & O_ACCMODE, O_RDONLY);
		void *wm = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fds[i], 0);
		cr_assert_eq(wm, MAP_FAILED, "INSPECT fd %u maps writable", i);
	}
	struct kvr_segment slots_seg;
	cr_assert_eq(kvr_segment_map(fds[1], KVR_SEG_SLOTS, 0, &slots_seg), 0, "the second fd is the slot table");
	kvr_segment_close(&slots_seg);
	for (unsigned i = 2; i < n_fds; i++) {
		struct kvr_client_area ah;
		cr_assert_eq(pread(fds[i], &ah, sizeof(ah), 0), (ssize_t)sizeof(ah));
		cr_assert_eq(ah.seg.kind, KVR_SEG_CLIENT, "fd %u is a client area", i);
		cr_assert_eq(ah.slot, i - 2, "the areas in slot order");
	}
	for (unsigned i = 0; i < n_fds; i++)
		close(fds[i]);
	close(sock);
	cr_assert(h_log_contains(&inst, "accepting connections again"));
}

/* ---- RLIMIT_NOFILE ------------------------------------------------------------------ */

/* A config with one L2 directory: its disk actor registers an io_uring file table of
 * max(l2.queue_depth, 256) entries, which the kernel refuses above the soft RLIMIT_NOFILE. */
static void write_l2_config(void)
{
	char l2[640], sections[1024];
	snprintf(l2, sizeof(l2), "%s/l2", inst.dir);
	cr_assert_eq(mkdir(l2, 0700), 0);
	snprintf(sections, sizeof(sections),
		 ",\n  \"l1\": {\"capacity_bytes\": \"64MiB\", \"huge_pages\": false},\n"
		 "  \"l2\": {\"dirs\": [\"%s\"], \"capacity_bytes\": \"256MiB\"}", l2);
	h_write_config_with(&inst, NULL, 1, H_SUP_WATCH, sections);
}

/* Each Criterion test is a process of its own: the limits set here end with it. */
static void set_nofile(rlim_t soft, rlim_t hard)
{
	struct rlimit old, rl = {.rlim_cur = soft, .rlim_max = hard};
	cr_assert_eq(getrlimit(RLIMIT_NOFILE, &old), 0);
	if (old.rlim_max != RLIM_INFINITY && old.rlim_max < hard)
		cr_skip_test("the hard RLIMIT_NOFILE is %llu here, the test needs %llu", (unsigned long long)old.rlim_max,
			     (unsigned long long)hard);
	cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0, "setrlimit(%llu, %llu): %s", (unsigned long long)soft,
		     (unsigned long long)hard, strerror(errno));
}

/* Issue 22: below what the config needs, with no room to raise it, kvringd refuses to start
 * and says by how much (it used to start "degraded": its disk actor crash-looped on EMFILE,
 * L2 given up). */
Test(supervisor, nofile_too_low_refused)
{
	write_l2_config();
	set_nofile(64, 64);
	const char *args[] = {"--config", inst.cfg, NULL};
	pid_t p = h_spawn_kvringd(&inst, args);
	int st = h_wait_exit(p, 5000);
	char *log = h_read_file(inst.log);
	cr_assert(st != -1, "kvringd still runs under RLIMIT_NOFILE 64; log:\n%s", log);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status 0x%x; log:\n%s", st, log);
	/* 16 + 8 + 256: the disk actor's own descriptors and its file table (limits.c) */
	static const char want[] = "kvringd: RLIMIT_NOFILE soft 64 hard 64, this config needs at least 280 (a disk actor: "
				   "its io_uring file table is max(l2.queue_depth, 256)): raise it (ulimit -n 280)\n";
	cr_assert_str_eq(log, want);
	free(log);
	struct stat sb;
	cr_assert_eq(stat(inst.sock, &sb), -1, "a refused start created its socket");
}

/* Room under the hard limit: the soft limit is raised (every actor inherits it) and the
 * disk actor starts. */
Test(supervisor, nofile_soft_raised_to_hard)
{
	write_l2_config();
	set_nofile(64, 4096);
	h_start(&inst);
	struct kvr_actor_ent *d = wait_ready("disk.0", 5000);
	char path[64], *limits;
	snprintf(path, sizeof(path), "/proc/%d/limits", (int)inst.pid);
	limits = h_read_file(path);
	cr_assert(strstr(limits, "Max open files            4096                 4096"), "%s", limits);
	free(limits);
	snprintf(path, sizeof(path), "/proc/%d/limits", (int)atomic_load(&d->pid));
	limits = h_read_file(path);
	cr_assert(strstr(limits, "Max open files            4096                 4096"), "disk.0: %s", limits);
	free(limits);
	cr_assert(h_log_contains(&inst, "RLIMIT_NOFILE soft limit raised from 64 to 4096: this config needs at least 280"));
	cr_assert_eq(d->restarts, 0, "the disk actor had to restart");
	cr_assert_eq(atomic_load(&((struct kvr_ctl *)inst.ctl)->state), KVR_INST_RUNNING);
}

/* ---- configuration ----------------------------------------------------------------- */

Test(supervisor, bad_config_exit_2)
{
	char json[512];
	snprintf(json, sizeof(json),
		 "{\"instance\": {\"socket\": \"%s\"}, \"supervisor\": {\"restart_backoff_max_ms\": 0}}", inst.sock);
	h_write_config_raw(&inst, json);
	const char *args[] = {"--config", inst.cfg, NULL};
	pid_t p = h_spawn_kvringd(&inst, args);
	int st = h_wait_exit(p, 3000);
	char *log = h_read_file(inst.log);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "status 0x%x; log:\n%s", st, log);
	static const char want[] = "kvringd: $.supervisor.restart_backoff_max_ms: ";
	cr_assert(strncmp(log, want, strlen(want)) == 0, "got: %s", log);
	cr_assert_eq(strchr(log, '\n'), log + strlen(log) - 1, "one line only: %s", log);
	free(log);
	/* nothing was created */
	char run[640];
	snprintf(run, sizeof(run), "%s/run", inst.dir);
	struct stat sb;
	cr_assert_eq(stat(run, &sb), -1);

	/* --check-config: the same reason, exit 2, nothing on stdout */
	cr_assert_eq(truncate(inst.log, 0), 0);
	const char *chk[] = {"--check-config", inst.cfg, NULL};
	st = h_wait_exit(h_spawn_kvringd(&inst, chk), 3000);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2);
	cr_assert(h_log_contains(&inst, "kvringd: $.supervisor.restart_backoff_max_ms: "));

	/* an L1 too small for one block of the model is a bad config too, caught before start */
	char small[512];
	snprintf(small, sizeof(small),
		 "{\"instance\": {\"socket\": \"%s\"}, \"model\": {\"preset\": \"qwen3-8b\"}, "
		 "\"l1\": {\"capacity_bytes\": \"1MiB\"}}", inst.sock);
	h_write_config_raw(&inst, small);
	cr_assert_eq(truncate(inst.log, 0), 0);
	st = h_wait_exit(h_spawn_kvringd(&inst, chk), 3000);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2);
	cr_assert(h_log_contains(&inst, "kvringd: $.l1.capacity_bytes: 1048576 bytes hold 0 slots of 18874368 bytes, "
					"one block needs 1"));
}

Test(supervisor, check_config_prints_effective)
{
	h_write_config(&inst, 3, NULL, NULL);
	const char *chk[] = {"--check-config", inst.cfg, NULL};
	int st = h_wait_exit(h_spawn_kvringd(&inst, chk), 3000);
	char *out = h_read_file(inst.log);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status 0x%x: %s", st, out);
	cr_assert(out[0] == '{', "%s", out);
	cr_assert(strstr(out, "\"max_workers\": 3"));
	cr_assert(strstr(out, "\"restart_backoff_initial_ms\": 50"));
	free(out);
	struct stat sb;
	cr_assert_eq(stat(inst.sock, &sb), -1, "--check-config started something");
}

/* ---- malformed messages ------------------------------------------------------------ */

Test(supervisor, malformed_messages_counted)
{
	h_write_config(&inst, 1, NULL, NULL);
	h_start(&inst);
	struct kvr_actor_ent *lk = wait_ready("lookup", 2000);
	pid_t lk_pid = atomic_load(&lk->pid);
	struct h_worker w;
	cr_assert_eq(h_attach(inst.sock, &w), 0);
	cr_assert_eq(w.status, 0);
	struct kvr_segment seg;
	struct kvr_ctl *c;
	c = h_worker_map(&w, &seg);
	struct kvr_ring *req = h_ring(c, "lookup.req.0");
	kvr_ring_claim_producer(req, getpid());

	struct kvr_msg bad[3];
	kvr_msg_build(&bad[0], 60, 0, 1, 0, NULL, 0); /* unknown type */
	kvr_msg_build(&bad[1], KVR_MSG_LOOKUP, 0, 2, 0, NULL, 0);
	bad[1].hdr.body_len = 200; /* longer than any body */
	kvr_msg_build(&bad[2], KVR_MSG_LOOKUP, 0x80, 3, 0, NULL, 0); /* undefined flag */
	for (int i = 0; i < 3; i++)
		cr_assert_eq(kvr_ring_try_enqueue(req, &bad[i]), 0);

	cr_assert(H_WAIT(atomic_load(&req->shm->rejected) == 3, 2000), "rejected = %llu",
		  (unsigned long long)atomic_load(&req->shm->rejected));
	cr_assert_eq(atomic_load(&req->shm->dequeued), 3);
	cr_assert_eq(kvr_ring_count(req), 0);
	cr_assert_eq(h_stat(&inst, "lookup", KVR_STAT_MALFORMED), 3);
	/* the actor keeps serving: a new pong after the bad messages, same process */
	uint64_t pings = h_stat(&inst, "lookup", KVR_STAT_PINGS);
	cr_assert(H_WAIT(h_stat(&inst, "lookup", KVR_STAT_PINGS) > pings, 2000));
	cr_assert_eq(atomic_load(&lk->pid), lk_pid);
	cr_assert_eq(atomic_load(&lk->state), KVR_ACTOR_READY);
	cr_assert_eq(lk->restarts, 0);
	cr_assert_eq(h_stat(&inst, "lookup", KVR_STAT_MALFORMED), 3);
	kvr_segment_close(&seg);
	h_worker_close(&w);
}

/* ---- peer credentials -------------------------------------------------------------- */

/* In a child that drops to uid 65534: attach and report status + reason through a pipe. */
static void foreign_attach(const char *sock, int *ret_status, char *reason, size_t len)
{
	int p[2];
	cr_assert_eq(pipe(p), 0);
	pid_t pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		close(p[0]);
		struct {
			int rc, status;
			char reason[KVR_PROTO_REASON_MAX];
		} out = {0};
		if (setgid(65534) || setuid(65534))
			_exit(3);
		struct h_worker w;
		out.rc = h_attach(sock, &w);
		out.status = w.status;
		memcpy(out.reason, w.reason, sizeof(out.reason));
		(void)!write(p[1], &out, sizeof(out));
		_exit(0);
	}
	close(p[1]);
	struct {
		int rc, status;
		char reason[KVR_PROTO_REASON_MAX];
	} in = {0};
	cr_assert_eq(read(p[0], &in, sizeof(in)), (ssize_t)sizeof(in));
	close(p[0]);
	cr_assert_neq(h_wait_exit(pid, 2000), -1);
	*ret_status = in.rc ? in.rc : in.status;
	snprintf(reason, len, "%s", in.reason);
}

Test(supervisor, foreign_uid_refused)
{
	if (geteuid() != 0)
		cr_skip_test("needs root to switch to uid 65534");
	/* socket and its directory open to everyone, so only SO_PEERCRED stands in the way */
	struct h_inst *in = &inst;
	cr_assert_eq(chmod(in->dir, 0755), 0);
	h_write_config(in, 1, ", \"socket_mode\": \"0666\"", NULL);
	char run[640];
	snprintf(run, sizeof(run), "%s/run", in->dir);
	cr_assert_eq(mkdir(run, 0755), 0);
	h_start(in);
	struct stat sb;
	cr_assert_eq(stat(in->sock, &sb), 0);
	cr_assert_eq(sb.st_mode & 0777, 0666);

	int status;
	char reason[KVR_PROTO_REASON_MAX];
	foreign_attach(in->sock, &status, reason, sizeof(reason));
	cr_assert_eq(status, -EACCES, "status %d (%s), reason '%s'", status, strerror(-status), reason);
	cr_assert_str_eq(reason, "permission denied: uid 65534 is not the instance owner");
	cr_assert_eq(atomic_load(&kvr_ctl_worker(in->ctl, 0)->state), KVR_WORKER_FREE);
	cr_assert_eq(atomic_load(&h_actor(in, "loader.0")->state), KVR_ACTOR_IDLE);

	/* with the default mode 0600 the filesystem already refuses the connection */
	cr_assert_eq(chmod(in->sock, 0600), 0);
	foreign_attach(in->sock, &status, reason, sizeof(reason));
	cr_assert_eq(status, -EACCES);
	/* the owner still attaches */
	struct h_worker w;
	cr_assert_eq(h_attach(in->sock, &w), 0);
	cr_assert_eq(w.status, 0);
	h_worker_close(&w);
}
