/*
 * history: what the job directory records of a shard's attempts
 * (attempts/<shard>/<n>-<token>/attempt.json), read into plain structs for
 * status --all, logs --attempt and the HTML report. Reads only, bounded:
 * at most HISTORY_MAX_ATTEMPTS attempts of a shard, each attempt.json a
 * regular file of at most 1 MiB, opened without following links.
 */
#ifndef ESD_HISTORY_H
#define ESD_HISTORY_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "manifest.h"
#include "util.h"

/* Attempts of one shard a reading keeps (the latest ones). */
#define HISTORY_MAX_ATTEMPTS 64

struct history_attempt {
    long long number;  /* attempt_number of its name */
    char *dir;         /* "attempts/<shard>/<name>" */
    char *node;        /* "node", else "hostname"; NULL: not recorded */
    char *status;      /* attempt.json "status"; NULL: unreadable */
    char *fclass;      /* "failure_class"; NULL: none */
    char *error;       /* "error"; NULL: none */
    double start, end; /* epoch seconds; 0: unknown. start: the processor's
                          start, else the claim; end: finished_at, else stale_at */
    double elapsed;    /* duration_secs, else end - start; -1: unknown */
    long long rows;    /* output rows of a validated result; -1: none */
};

struct history_shard {
    struct history_attempt *v; /* by number, oldest first */
    size_t n;
    size_t omitted; /* older attempts not kept */
};

/*
 * Reads the attempts of shard_id in m's job directory into ret (caller
 * frees with history_shard_free, also after an error). A shard without an
 * attempts directory has none. Entries that are not well-formed attempt
 * directories are skipped; an unreadable attempt.json gives an attempt
 * with status NULL. Returns 0 or a negative errno with err set.
 */
int history_read(const struct manifest *m, const char *shard_id, struct history_shard *ret,
                 struct esd_err *err);
void history_shard_free(struct history_shard *h);

/* The attempt numbered number of h, or NULL. */
const struct history_attempt *history_find(const struct history_shard *h, long long number);

/* "done", "failed", "taken over" (stale, lost), "running", "released", ... :
 * the outcome a person reads for a's status. */
const char *history_outcome(const struct history_attempt *a);

/* a as a JSON object: attempt, node, start, end (epoch), elapsed_secs,
 * outcome, status, failure_class, rows, error, log (caller deletes). */
cJSON *history_attempt_json(const struct history_attempt *a);

#endif
