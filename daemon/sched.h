/*
 * sched: the scheduler. It fills free slots by claiming across the active
 * jobs in turn (round robin, so every job gets its share), claims again as
 * soon as a slot frees, and otherwise sleeps until the earliest moment
 * something may become claimable: a lock's lease could run out, or the
 * poll interval (jittered by ±20 % so a fleet does not poll in step) has
 * passed. No claims are made while the Ray head is down or while draining.
 * It also notices the end of a job (every shard done: finalize; a shard
 * failed terminally: the job fails, naming the shard and its error) and
 * keeps systemd's STATUS= line current.
 */
#ifndef ESD_SCHED_H
#define ESD_SCHED_H

#include <cjson/cJSON.h>
#include <ev.h>

#include "config.h"

void sched_init(struct ev_loop *loop, const struct esd_conf *c);
void sched_reconfigure(const struct esd_conf *c);
void sched_fini(void);
struct job;
/*
 * esd run (oneshot.c): complete, when set, is called instead of
 * finalize_start when a pass finds every shard of j done, and returns true
 * if it took the job's end over; may_claim, when set, says whether this
 * node may claim a shard of j now (false: asked again after a poll).
 */
void sched_set_hooks(bool (*complete)(struct job *j), bool (*may_claim)(struct job *j));

/* Claim now if slots are free (coalesced: runs once from the loop). */
void sched_kick(void);
/* j leaves the registry (jobs_forget): the scheduler keeps no pointer to it. */
void sched_forget_job(const struct job *j);

/*
 * SIGTERM: no new claims; running attempts may finish within
 * drain_timeout_secs, then they are stopped and their claims released
 * without counting a failure; drained is called once nothing runs.
 */
void sched_drain(void (*drained)(void));

/*
 * esctl drain: no new claims until sched_resume (kept across restarts in
 * <state_dir>/drained); with release, running attempts are stopped now
 * and their claims released without counting a failure.
 */
void sched_hold(bool release);
void sched_resume(void);
bool sched_held(void);
/* Cancels the jobs cancelled on every node (their marker file) and stops
 * their attempts here. Runs at every rescan. */
void sched_check_cancelled(void);
/* The daemon's status for the control socket (caller owns it). */
cJSON *sched_status_json(void);
/* Sends the STATUS= line again (a job's view changed). */
void sched_status_refresh(void);

#endif
