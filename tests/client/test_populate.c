/* Background populate (issue 23): actors fault their mappings in from the loop after ready, never ahead of a message. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "client_harness.h"
#include "kvr_segment.h"
#include "kvr_time.h"

/*
 * A worker's loader and storer map the arena and the worker's KV memory without touching
 * them (they are ready at once for any size) and then populate both from their loop, one
 * chunk per pass that has nothing else to do (actors/runtime/populate.c). These tests
 * read the progress kvring-inspect shows (the actor entry's populated / populate_total)
 * and the page tables of the processes (VmPTE), and order events by those counters,
 * never by sleeping.
 */

/* 8 layers x K,V x 16 tokens x 8 heads x 128 x bf16 = 512 KiB a block lane */
static const struct ct_model big = {.layers = 8, .kv_heads = 8, .head_dim = 128, .dtype_bytes = 2, .block_tokens = 16,
				    .tp_size = 1};

static struct ct_env env;
static void setup(void) { ct_init(&env); }
static void teardown(void) { ct_fini(&env); }
TestSuite(populate, .init = setup, .fini = teardown, .timeout = 120);

static const struct kvr_actor_ent *actor(const char *name)
{
	for (unsigned i = 0; i < env.ctl->max_actors; i++)
		if (!strncmp(kvr_ctl_actor(env.ctl, i)->name, name, KVR_ACTOR_NAME_MAX))
			return kvr_ctl_actor(env.ctl, i);
	cr_assert_fail("no actor %s", name);
	return NULL;
}

static bool populated(const char *name)
{
	const struct kvr_actor_ent *e = actor(name);
	uint64_t total = atomic_load(&e->populate_total);
	return total && atomic_load(&e->populated) >= total;
}

Test(populate, a_workers_actors_populate_the_arena_and_its_kv_memory)
{
	ct_start(&env, &big, &(struct ct_opts){.l1_slots = 128}); /* a 64 MiB arena */
	cr_assert(H_WAIT(atomic_load(&env.ctl->prefault_state) == KVR_PREFAULT_DONE, 20000), "kvringd's prefault");
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 256, 0, &r), 0, "%s", kvr_last_error(NULL)); /* 128 MiB of KV memory */
	cr_assert(H_WAIT(populated("loader.0") && populated("storer.0"), 20000), "loader %llu of %llu, storer %llu of %llu",
		  (unsigned long long)atomic_load(&actor("loader.0")->populated),
		  (unsigned long long)atomic_load(&actor("loader.0")->populate_total),
		  (unsigned long long)atomic_load(&actor("storer.0")->populated),
		  (unsigned long long)atomic_load(&actor("storer.0")->populate_total));
	/* what each populates: the whole arena and the whole KV memory it maps */
	uint64_t want = env.ctl->arena_bytes + r->kv_bytes;
	static const char *const who[] = {"loader.0", "storer.0"};
	for (unsigned k = 0; k < 2; k++) {
		const struct kvr_actor_ent *e = actor(who[k]);
		uint64_t total = atomic_load(&e->populate_total), pte = 0;
		cr_assert_geq(total, want, "%s populates %llu bytes, want the arena and the KV memory (%llu)", who[k],
			      (unsigned long long)total, (unsigned long long)want);
		cr_assert_lt(total, want + (2u << 20), "%s: %llu bytes", who[k], (unsigned long long)total);
		/* and its page table holds them: 8 bytes per 4 KiB page (less with huge pages) */
		cr_assert_eq(kvr_proc_page_tables(atomic_load(&e->pid), &pte), 0);
		if (!env.ctl->arena_huge)
			cr_assert_geq(pte, want / 4096 * 8, "%s: %llu bytes of page tables for %llu bytes populated",
				      who[k], (unsigned long long)pte, (unsigned long long)want);
	}
	/* the data path works on the populated mappings */
	uint32_t tokens[4 * 16], blocks[4] = {0, 1, 2, 3};
	ct_prompt(tokens, 4 * 16, 9);
	for (uint32_t b = 0; b < 4; b++)
		ct_fill(r, b, 90 + b);
	struct ct_done d;
	ct_store(r, 1, tokens, 4 * 16, blocks, 4, &d);
	cr_assert_eq(d.c.n_stored, 4);
	cr_assert_eq(ct_lookup_load_exact(r, 2, tokens, 4 * 16, 8, 90), 4);
	ct_assert_table_clean(&env);
}

Test(populate, a_request_during_populate_is_served_first_and_a_detach_stops_it)
{
	ct_start(&env, &big, &(struct ct_opts){.l1_slots = 64});
	cr_assert(H_WAIT(atomic_load(&env.ctl->prefault_state) == KVR_PREFAULT_DONE, 20000), "kvringd's prefault");
	/* 2 GiB of KV memory (written by the harness: its pages exist, so the actors populate
	 * them): that takes the actors far longer than one store and one load */
	struct ct_rank *r;
	cr_assert_eq(ct_rank_open(&env, 0, 4096, 0, &r), 0, "%s", kvr_last_error(NULL));
	const struct kvr_actor_ent *ld = actor("loader.0"), *st = actor("storer.0");
	uint32_t tokens[2 * 16], blocks[2] = {0, 1};
	ct_prompt(tokens, 2 * 16, 10);
	ct_fill(r, 0, 70);
	ct_fill(r, 1, 71);
	struct ct_done d;
	ct_store(r, 1, tokens, 2 * 16, blocks, 2, &d);
	uint64_t st_pop = atomic_load(&st->populated), st_total = atomic_load(&st->populate_total);
	cr_assert_eq(d.c.n_stored, 2);
	cr_assert_eq(ct_lookup_load_exact(r, 2, tokens, 2 * 16, 2, 70), 2);
	uint64_t ld_pop = atomic_load(&ld->populated), ld_total = atomic_load(&ld->populate_total);
	cr_log_info("served while populating: storer %llu of %llu MiB, loader %llu of %llu MiB",
		    (unsigned long long)(st_pop >> 20), (unsigned long long)(st_total >> 20),
		    (unsigned long long)(ld_pop >> 20), (unsigned long long)(ld_total >> 20));
	cr_assert_lt(st_pop, st_total, "the store was answered only after the storer's populate");
	cr_assert_lt(ld_pop, ld_total, "the load was answered only after the loader's populate");

	/* the memory cannot shrink under the populate: kvringd sealed it at attach */
	cr_assert_eq(ftruncate(r->kv_fd, 1 << 20), -1);
	cr_assert_eq(errno, EPERM);
	/* the worker goes away in the middle of it: the actors stop cleanly, the detach is fenced */
	cr_assert_lt(atomic_load(&ld->populated), atomic_load(&ld->populate_total), "populate over already");
	cr_assert_eq(kvr_detach(r->c), 0, "%s", kvr_last_error(NULL));
	r->c = NULL;
	cr_assert_eq(ld->last_exit_code, 0, "the loader exited %d (signal %d)", ld->last_exit_code,
		     ld->last_exit_signal);
	cr_assert_eq(st->last_exit_code, 0, "the storer exited %d (signal %d)", st->last_exit_code,
		     st->last_exit_signal);
	ct_rank_close(r);
	ct_assert_table_clean(&env);
}
