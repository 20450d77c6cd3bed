/* Integrity under faults with two model geometries on one kvringd without a model section (issue 24). */
#include <criterion/criterion.h>

#include "faults_run.h"

/*
 * The driver is faults_run.h's. Here: one kvringd started with no model section and 4 KiB
 * slots (l1.slot_bytes), an L1 of 40 slots that two engines of two geometries share, so each
 * evicts the other's blocks, and L2 on (two directories, one namespace directory of the slot
 * format for both models):
 *
 *   model A  faults_harness.h's model: 2 layers, 2 heads of 16 bf16 a lane, 16-token blocks:
 *            a 4096-byte lane;
 *   model B  1 layer, 2 heads of 8 bf16 a lane, 32-token blocks, TP 1: a 2048-byte lane in the
 *            same 4 KiB slots (another block size and lane count: each slot says its own, each
 *            L2 file its block size).
 *
 * Workers, one process each: A's two TP ranks (engine "a"), B's one (engine "b"), and a DCP
 * group of A (TP ranks 2 and 3 of a TP 4, DCP 2 engine "a-dcp": it shares A's blocks, and
 * its stores go through a gather actor). Every kind of actor and every worker is killed;
 * every committed slot and every L2 file is checked against the lane of its key's model (the
 * slot's model tag too), and after the restart every prompt of both models is looked up and
 * loaded byte-exact. 12 rounds of 45 faults by default (about 100 s on 2 cores).
 */

static const struct fh_model model_a = {.name = "A", .model_ns = "org/a", .layers = FH_LAYERS,
					.lane_heads = FH_LANE_HEADS, .head_dim = FH_HEAD_DIM, .dtype = FH_DTYPE,
					.tp = FH_TP};
static const struct fh_model model_b = {.name = "B", .model_ns = "org/b", .layers = 1, .lane_heads = FH_LANE_HEADS,
					.head_dim = 8, .dtype = FH_DTYPE, .tp = 1, .bt = 32};

static const struct fh_role roles[] = {
	{"a.tp0", FH_ROLE_TP, 0, &model_a, "a"},
	{"a.tp1", FH_ROLE_TP, 1, &model_a, "a"},
	{"a.dcp", FH_ROLE_DCP, 2, &model_a, "a-dcp"},
	{"b.tp0", FH_ROLE_TP, 0, &model_b, "b"},
};

static const struct fr_scenario two_models = {
	.name = "faults_two_models", .roles = roles, .n_roles = 4, .models = {&model_a, &model_b}, .n_models = 2,
	.no_model = true, .max_workers = 12, .l1_slots = 40, .n_prompts = 48, .rounds = 12, .min_faults = 500,
	.every_kind = true,
};

TestSuite(faults, .init = fr_setup, .fini = fr_teardown, .timeout = 600);

Test(faults, kill9_two_models)
{
	fr_run(&two_models);
}
