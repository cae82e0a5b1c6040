/*
 * fscheck: a verdict on the shared file system a job directory lives on
 * (esctl fscheck, and esd before it works a job). Claims are exclusive only
 * if O_CREAT|O_EXCL and link() are atomic across nodes; esd also wants to
 * know whether flock is cluster-wide (it never relies on it), how stale a
 * node's view of another node's files can be, and how far the file server's
 * clock is from this node's.
 *
 * Participants (processes on one or more nodes) meet in
 * DIR/.esd-fscheck/<run>/: each creates hello.<host>.<pid>; the first to see
 * enough of them (or the first whose wait ends) publishes the list with an
 * O_EXCL create of "start", and from then on every phase ends with a
 * barrier (each participant's file b<phase>.<id>, seen through a fresh
 * listing of a signal directory). The phases race O_EXCL creates and
 * link()s of the same names (exactly one winner each), rename distinct
 * files onto one name while reading it (never missing, never torn), hold
 * flock on one node while the others try it, and time how long a file
 * created, grown or removed by the first participant takes to show on the
 * others' stat(). With one participant only the single-node subset runs
 * (O_EXCL and link refuse an existing name, rename, flock works, clock).
 * Two processes on one machine simulate two nodes, but only two nodes give
 * real verdicts on exclusivity, flock and lags.
 */
#ifndef ESD_FSCHECK_H
#define ESD_FSCHECK_H

#include <stdbool.h>

#include <cjson/cJSON.h>

#include "util.h"

struct fscheck_opts {
    const char *dir;  /* the directory to test (a job directory or any other) */
    const char *run;  /* rendezvous name ([A-Za-z0-9._-]); NULL: "default" */
    long nodes;       /* participants to wait for; <= 1: the single-node subset */
    double wait_secs; /* how long to wait for them; <= 0: FSCHECK_WAIT_DEFAULT */
    double lag_max;   /* longest lag measured; <= 0: FSCHECK_LAG_MAX */
    int rounds;       /* races of each kind; <= 0: FSCHECK_ROUNDS */
};

#define FSCHECK_WAIT_DEFAULT 60.0
#define FSCHECK_LAG_MAX 10.0
#define FSCHECK_ROUNDS 32
/* A server clock further than this from the node's is reported. */
#define FSCHECK_CLOCK_WARN 2.0

/*
 * Runs the check in o->dir (creating and, at the end, removing
 * o->dir/.esd-fscheck/<run>). On success *ret_verdict is the verdict
 * (caller frees): "exclusive" (bool: claims can be exclusive), "reason"
 * (why not), "o_excl", "link", "rename", "flock" (strings: "ok",
 * "FAILED: ...", "unsupported: ...", "cluster-wide", "node-local", ...),
 * "create_lag_secs", "attr_lag_secs", "unlink_lag_secs" (null when not
 * measured), "clock_offset_secs" (server minus node), "participants",
 * "hosts", "checked_at", "dir". Returns 0 or a negative errno (a peer that
 * stopped answering, a directory that cannot be written).
 */
int fscheck_run(const struct fscheck_opts *o, cJSON **ret_verdict, struct esd_err *err);

/* The verdict's "exclusive"; *ret_reason (may be NULL) its "reason". */
bool fscheck_exclusive(const cJSON *verdict, const char **ret_reason);

/*
 * Writes verdict to <job_dir>/state/esd/fscheck.json (atomically, creating
 * state/esd). Returns 0 or a negative errno.
 */
int fscheck_record(const char *job_dir, const cJSON *verdict, struct esd_err *err);

/* True if dir holds a manifest.json (a job directory: the verdict is recorded). */
bool fscheck_is_job(const char *dir);

/*
 * esd's check before it works the job in job_dir (run as its owner): the
 * single-node subset here and now, and the recorded verdict of an earlier
 * esctl fscheck. Records the new verdict when none is recorded or this
 * one refuses. Returns NULL if claims can be exclusive, else why not
 * (caller frees). A check that cannot run is not a refusal.
 */
char *fscheck_refusal(const char *job_dir, const char *node);

/* The verdict for humans, several lines ending in '\n' (caller frees). */
char *fscheck_text(const cJSON *verdict);

#endif
