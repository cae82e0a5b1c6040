/*
 * jobview: one truth for a job's counts on every node. For each loaded job
 * the daemon keeps a status_view (common/status.h) read from the job
 * directory itself (listings of state/done, state/failed and state/locks,
 * each done record read once), never from this node's claimer: `esctl
 * list`, `esctl status`, the STATUS= line and the metrics all show it, with
 * the time of the reading. A reading is made a bounded step at a time from
 * an idle watcher, as the job's owner; active jobs are read again every
 * poll_interval_secs and when a status request finds the reading older
 * than JOBVIEW_FRESH_SECS; a terminal job once.
 */
#ifndef ESD_JOBVIEW_H
#define ESD_JOBVIEW_H

#include <stdbool.h>

#include <cjson/cJSON.h>
#include <ev.h>

#include "config.h"
#include "jobs.h"
#include "status.h"

/* A reading younger than this is shown without its age. */
#define JOBVIEW_FRESH_SECS 2.0

void jobview_init(struct ev_loop *loop, const struct esd_conf *c);
void jobview_reconfigure(const struct esd_conf *c);
void jobview_fini(void);

/* A job was loaded or changed state: look at the views again at once (the
 * views' timer stops while no job can change). */
void jobview_kick(void);
/* refreshed is called when a new reading changed a job's figures (the
 * scheduler's status line; set by it: jobview never calls up). */
void jobview_set_refreshed(void (*refreshed)(void));

/* The last complete reading of j (NULL: none yet); valid until the next
 * event loop turn. */
const struct status_view *jobview_get(const struct job *j);

/* Seconds since the reading of v was taken. */
double jobview_age(const struct status_view *v);

/*
 * The status of job j from its view, for `esctl status DIR` (caller
 * deletes; bounded, see status_view_json), after up to about 50 ms spent
 * bringing a reading older than JOBVIEW_FRESH_SECS up to date; NULL when
 * j has no complete reading yet (the caller reads the directory in a
 * child instead).
 */
cJSON *jobview_status(struct job *j, bool all);

/* jobs_status_json with every job's counts, rows/s and ETA from its view
 * ("done", "failed", "running", "stale", "pending", "rows_done", "read_at",
 * "read_age_secs"); jobs without a reading keep this node's counts and say
 * "counts_from": "node". Caller deletes. */
cJSON *jobview_jobs_json(void);

/* " (as of N s ago)" into out when v is older than JOBVIEW_FRESH_SECS,
 * else "". */
void jobview_age_text(const struct status_view *v, char out[48]);

#endif
