/*
 * nodes: the fleet as each node sees it (esctl nodes). With spool_dir set,
 * every daemon publishes a small status file <spool_dir>/nodes/<node>.json
 * (atomically, as esd's own user) every node_status_interval_secs, at once
 * (at most one write in NODES_MIN_GAP_SECS) when it starts, is drained,
 * resumed or starts draining, and a last time with state "stopped" when
 * it stops cleanly: its slots, what it runs (job, shard, attempt), drained
 * or paused and why, its processor, Data-Juicer, Ray and esd versions.
 *
 * The files of the other nodes are input from peers: read without
 * following a link or waiting on a FIFO, bounded in size and number, only
 * when owned by root or esd's uid (as the spool's registrations), and
 * validated field by field; a file that fails is listed as invalid, with
 * why, and says nothing about any node. A file older than three of its
 * node's intervals (on the file server's clock: ages are measured against
 * the mtime of this node's own file) is down, unless it says stopped; what
 * a down node was running is looked up in the jobs' views, which say
 * whether another node took it over. Nodes named by the locks and done
 * records of the jobs this node has loaded are listed too, so a daemon
 * without spool_dir still shows the nodes its jobs know of.
 */
#ifndef ESD_NODES_H
#define ESD_NODES_H

#include <cjson/cJSON.h>
#include <ev.h>

#include "config.h"

/* Files read from <spool_dir>/nodes at most, and the size of each. */
#define NODES_MAX_FILES 1024
#define NODES_MAX_FILE (64 * 1024)
/* Two publications at least this far apart (drain, resume, start). */
#define NODES_MIN_GAP_SECS 2.0
/* A node silent for this many of its intervals is down. */
#define NODES_DOWN_INTERVALS 3

void nodes_init(struct ev_loop *loop, const struct esd_conf *c);
void nodes_reconfigure(const struct esd_conf *c);
/* The last publication, with state "stopped" (a clean stop). */
void nodes_fini(void);

/* Where the file's state, busy count and Ray address come from: status()
 * returns the daemon's status object (caller deletes; the scheduler's,
 * set by it: nodes never calls up). */
void nodes_set_status(cJSON *(*status)(void));
/* Something the file shows changed: publish soon (rate-limited). */
void nodes_kick(void);
/* Why this node is drained (NULL: it is not, or no reason known). */
void nodes_set_drain_reason(const char *why);

/* The answer of esctl nodes (caller deletes). */
cJSON *nodes_json(void);

#endif
