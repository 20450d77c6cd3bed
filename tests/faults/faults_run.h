/* Fault suites: the kill -9 stress driver shared by faults_stress (one model) and faults_two_models. */
#ifndef FAULTS_RUN_H
#define FAULTS_RUN_H

#include <stdbool.h>
#include <stdint.h>

#include "faults_harness.h"

/*
 * One kvringd with a small L1 in front of two L2 directories (two disk actors) of 2 MiB
 * together, and one worker process per role, each storing and loading random prompts of its
 * model over shared prefixes; bytes follow the block keys, so every block a load reports
 * restored is compared with what any rank of its model stored for those tokens. Meanwhile
 * the driver kills, every 30-270 ms, a random READY actor of a random kind (lookup, loader,
 * storer, disk, gather) or a random worker process (restarted at once), FAULTS_PER_ROUND
 * times a round.
 *
 * After each round: the workers go idle (still attached), every actor is READY (or idle for
 * lack of a worker) and no worker slot is stuck detaching, and the slot table holds only FREE
 * and COMMITTED slots without a pin (polled up to QUIET_MS; the offending slots are dumped),
 * every COMMITTED slot holding its key's bytes for its key's model and carrying that model's
 * tag. A round that fails a check is counted and the instance restarted, so the next round
 * starts clean. The first half of the rounds runs write-through, the second write-back
 * (kvringd restarted on the same L2 directories in between). At the end kvringd is stopped,
 * every L2 file is read and checked, kvringd starts again on the same directories, and every
 * rank looks every prompt of its model up and loads what hits, byte by byte.
 * KVR_FAULTS_ROUNDS=n sets the rounds, KVR_FAULTS_KINDS the kinds killed (a list of names),
 * KVR_TEST_SEED the seed (printed first).
 */

#define FR_MAX_ROLES 6
#define FR_MAX_PROMPTS 64

struct fr_scenario {
	const char *name;           /* "faults_stress": the seed's name and the prefix of every line printed */
	const struct fh_role *roles;
	unsigned n_roles;           /* <= FR_MAX_ROLES */
	const struct fh_model *models[FH_MAX_MODELS]; /* every role's model (a role's NULL: models[0]) */
	unsigned n_models;
	bool no_model;              /* kvringd without a model section, l1.slot_bytes FH_LANE_BYTES; else
				     * models[0] is its model section */
	unsigned max_workers;
	uint32_t l1_slots;
	unsigned n_prompts;         /* a model's, <= FR_MAX_PROMPTS */
	unsigned rounds;            /* the default */
	uint64_t min_faults;        /* asserted with the default rounds and kinds */
	bool every_kind;            /* asserted then: every kind killed at least once */
};

void fr_setup(void);
void fr_teardown(void);
/* The whole test (Criterion asserts): rounds of faults, the checks, the end's restart. */
void fr_run(const struct fr_scenario *sc);

#endif
