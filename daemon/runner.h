/*
 * runner: one attempt in flight, start to end, driven by libev. The
 * processor runs in its own process group (as the job directory's owner
 * when esd runs as root, never as root); every line it prints goes to the
 * attempt's process.log and to the log (log_processor: as esd-processor)
 * with ESD_JOB, ESD_SHARD, ESD_ATTEMPT and ESD_NODE; the lease is renewed every lease/4; the
 * attempt timeout, a lost lease or a stop kill the whole group (SIGTERM,
 * SIGKILL after a grace). Validation and publication of the result (heavy:
 * whole files) run in a child process that reports one JSON line; the
 * outcome is logged once and handed to the scheduler.
 */
#ifndef ESD_RUNNER_H
#define ESD_RUNNER_H

#include <stdbool.h>

#include <cjson/cJSON.h>
#include <ev.h>

#include "attempt.h"
#include "claim.h"
#include "config.h"
#include "jobs.h"

void runner_init(struct ev_loop *loop, const struct esd_conf *c);
void runner_reconfigure(const struct esd_conf *c);
void runner_fini(void);

/* Called once for every attempt that ended (the slot is free again). */
void runner_set_done(void (*done)(struct job *j, const struct attempt_final *fin));

/*
 * Starts an attempt of claim cl (taken over by the runner, which frees it)
 * of job j. On failure to start, the attempt is ended as an infrastructure
 * failure (or released) and the done callback still runs, later.
 */
void runner_start(struct job *j, struct claim *cl);

/*
 * Claim-ahead: starts the attempt of cl as runner_start does, but through
 * j's warm processor with a gate: it reads its configuration, connects to
 * Ray and makes its executor, then waits until a slot is free (a busy
 * attempt's processor ended) before it runs. When the warm processor
 * cannot take it after all, it runs at once.
 */
void runner_start_ahead(struct job *j, struct claim *cl);
/* Whether j's attempts can be claimed ahead now (its warm processor is
 * ready). */
bool runner_can_start_ahead(const struct job *j);

/* Attempts whose processor runs (ungated, not yet exited): the slots in
 * use. Finishing attempts (validation, publication) take none. */
size_t runner_busy(void);
/* Attempts claimed ahead that wait for a slot. */
size_t runner_gated(void);
/* Seconds until a busy attempt may be about to end (its processor's time
 * so far is within lead of this node's mean for its job, or there is no
 * mean yet): 0 for now, INFINITY when no busy attempt's job can be
 * claimed ahead (runner_can_start_ahead). */
double runner_ahead_in(double lead);
/* Called when a slot may have become free (a processor ended). */
void runner_set_freed(void (*freed)(void));

/* Stops every attempt (SIGTERM, then SIGKILL); they end "released",
 * their claims given back without counting a failure. */
void runner_stop_all(void);
/* The same for the attempts of job j only (cancel). */
void runner_stop_job(const struct job *j);

/* Stops and releases the attempts claimed ahead that have not run yet
 * (a drain: what runs may finish, what waits does not start). */
void runner_stop_gated(void);

/* Attempts in flight (running, claimed ahead or finishing). */
size_t runner_count(void);

/* The attempts in flight, for the control socket. */
cJSON *runner_status_json(void);

#endif
