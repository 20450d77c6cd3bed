/* Integrity under faults: kill -9 of every actor kind and of workers, mixed workload, write-through and write-back. */
#include <criterion/criterion.h>

#include "faults_run.h"

/*
 * The driver is faults_run.h's. Here: one kvringd with a model section (faults_harness.h's
 * model, TP 2) and an L1 of 40 slots, and three worker processes:
 *
 *   tp0, tp1  the two ranks of a TP 2 engine, each its own process and lane;
 *   dcp       a DCP group: TP ranks 2 and 3 of a TP 4 engine with DCP 2 (interleave 4), one
 *             process with both ranks; the group stores lane 1 through its gather actor.
 *
 * (An instance serves one model and one worker per (TP rank, DCP rank): these four ranks are
 * all the workers this model admits at once.) 12 rounds of 45 faults by default.
 */

static const struct fh_role roles[] = {
	{"tp0", FH_ROLE_TP, 0},
	{"tp1", FH_ROLE_TP, 1},
	{"dcp", FH_ROLE_DCP, 2},
};

static const struct fr_scenario stress = {
	.name = "faults_stress", .roles = roles, .n_roles = 3, .models = {&fh_model_default}, .n_models = 1,
	.max_workers = 10, .l1_slots = 40, .n_prompts = 48, .rounds = 12, .min_faults = 500,
};

TestSuite(faults, .init = fr_setup, .fini = fr_teardown, .timeout = 900);

Test(faults, kill9_everything)
{
	fr_run(&stress);
}
