/*
 * status: the state of every shard of a job, computed from the job
 * directory alone (spec §9): done record, failed record, lock (running or
 * stale by its age and timeout), else pending. Three directory listings
 * decide the states; records are read only for the shards whose details
 * are asked for.
 */
#ifndef ESD_STATUS_H
#define ESD_STATUS_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "manifest.h"
#include "util.h"

enum shard_state { ST_PENDING, ST_RUNNING, ST_STALE, ST_DONE, ST_FAILED, ST__COUNT };

/* "pending", "running", "stale", "done", "failed". */
extern const char *const status_state_name[ST__COUNT];

struct shard_status {
    enum shard_state state;
    char *owner;      /* hostname of the done record or lock; NULL if unknown */
    char *node;       /* esd's node name in it ("node"); NULL if none (the
                         reference writes none; several nodes may share a host) */
    long long pid;    /* from the lock */
    bool has_pid;
    double lock_age;  /* seconds, >= 0 */
    bool has_age;
    char *error;      /* last_error of the failed record */
    bool metadata_error; /* a record or lock could not be parsed */
    /* With details, the record's "hostname" and the lock's "pid" exactly as
     * written (JSON null when missing), for status --json, which shows them
     * as the reference does; NULL when no record applies or it is
     * unreadable. owner and pid above are the typed views. */
    cJSON *owner_value;
    cJSON *pid_value;
};

struct job_status {
    size_t total;
    size_t counts[ST__COUNT];
    bool complete; /* every shard done */
    bool terminal; /* every shard done or failed */
    struct shard_status *shards; /* manifest order */
};

/*
 * Computes the status of m. lock_timeout <= 0 means the manifest policy. A
 * lock that records lease_secs (written by esd) is stale after that many
 * seconds instead. Locks are always read (ages and leases); with details,
 * done and failed records are read too, for owners and errors. The caller
 * frees with status_free.
 */
int status_compute(const struct manifest *m, long long lock_timeout, bool details,
                   struct job_status *ret, struct esd_err *err);
void status_free(struct job_status *st);

/* The status --json object of spec §5.9 (caller deletes). */
cJSON *status_json(const struct manifest *m, const struct job_status *st);

/* "pending=… running=… stale=… done=… failed=…" into out. */
void status_counts_text(const struct job_status *st, struct buf *out);

#endif
