/*
 * finalize: the end of a job. When every shard is done, exactly one node
 * merges: the one whose O_EXCL create of <job>/state/esd/finalize.lock
 * succeeds. It merges in a child process (as the job's owner when esd runs
 * as root) into the job's output, records the result in
 * <job>/state/esd/finalize.json, and renews the lock's mtime meanwhile as
 * a claim's lease is renewed. Every other node waits for finalize.json; a
 * lock whose lease ran out without a result (its node died) is moved aside
 * and the election held again. A merge that fails (a changed result, a full
 * disk) fails the job on every node, with the reason.
 */
#ifndef ESD_FINALIZE_H
#define ESD_FINALIZE_H

#include <stdbool.h>

#include <ev.h>

#include "config.h"
#include "jobs.h"

void finalize_init(struct ev_loop *loop, const struct esd_conf *c);
void finalize_reconfigure(const struct esd_conf *c);
/* Called when a job's finalize here ended: complete, failed, or given up
 * (a merge that ended without a result: the job is active again). */
void finalize_set_done(void (*done)(struct job *j));

/* j has every shard done: take part in the election (idempotent). */
void finalize_start(struct job *j);

/*
 * The operator's word that j's merge may be tried again now (esctl merge
 * of a job this node works, or a new submit): a merge record that says the
 * merge failed is moved aside (state/esd/finalize.failed.<time>.json), the
 * backoff after transient failures is forgotten, and a job that had failed
 * by its merge works again. Returns true if j is to be merged again (false
 * while a merge or an election of j runs here, or when j failed otherwise).
 */
bool finalize_retry(struct job *j);

/* Stops every running merge (SIGTERM; its temporary output is removed and
 * its election lock given up, so that the merge is held again). */
void finalize_stop_all(void);

/* Merges running on this node. */
size_t finalize_running(void);

/* Stops waiting; a running merge is killed and its lock left to turn
 * stale (another node merges then). */
void finalize_fini(void);

#endif
