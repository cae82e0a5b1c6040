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
#include <sys/types.h>

#include <cjson/cJSON.h>

#include "manifest.h"
#include "util.h"

enum shard_state { ST_PENDING, ST_RUNNING, ST_STALE, ST_DONE, ST_FAILED, ST__COUNT };

/* "pending", "running", "stale", "done", "failed". */
extern const char *const status_state_name[ST__COUNT];

struct shard_status {
    enum shard_state state;
    char *owner;   /* hostname of the done record or lock; NULL if unknown */
    char *node;    /* esd's node name in it ("node"); NULL if none (the
                         reference writes none; several nodes may share a host) */
    long long pid; /* from the lock */
    bool has_pid;
    double lock_age; /* seconds, >= 0 */
    bool has_age;
    char *error;         /* last_error of the failed record */
    bool metadata_error; /* a record or lock could not be parsed */
    /* With details, the record's "hostname" and the lock's "pid" exactly as
     * written (JSON null when missing), for status --json, which shows them
     * as the reference does; NULL when no record applies or it is
     * unreadable. owner and pid above are the typed views. */
    cJSON *owner_value;
    cJSON *pid_value;
};

/* ---- the global stage (issue 17) ----
 *
 * A job whose manifest has a global stage (m->global_snapshot) goes
 * through phases of its own: its shards, the merge of their outputs into
 * the global stage's input (state/esd/global/input.jsonl, recorded by
 * prefix.json), the pseudo-shard "_global" that runs the rest of the
 * recipe once, the final merge, and the end. "_global" is read exactly as
 * a shard is (its lock, done and failed records), and is never one of the
 * manifest's shards nor of their counts. */
#define STATUS_GLOBAL_ID "_global"
#define STATUS_GLOBAL_PREFIX "state/esd/global/prefix.json"
#define STATUS_GLOBAL_INPUT "state/esd/global/input.jsonl"

enum job_phase {
    PHASE_SHARDS,   /* some manifest shard is not done */
    PHASE_MERGING,  /* all are, no prefix.json yet */
    PHASE_GLOBAL,   /* prefix.json, "_global" neither done nor failed */
    PHASE_FINAL,    /* "_global" done, the final output not yet published */
    PHASE_COMPLETE, /* merge.json with its "stages", or finalize.json complete */
    PHASE_FAILED,   /* "_global" failed, or the finalizer's record says failed */
    PHASE__COUNT
};

/* "shards", "merging", "global", "final merge", "complete", "failed". */
extern const char *const status_phase_name[PHASE__COUNT];

struct global_status {
    enum job_phase phase;
    struct shard_status s; /* "_global"'s state, as a shard's (with details) */
    bool prefix;           /* prefix.json exists */
    long long input_rows;  /* its rows; -1: unknown */
    long long rows;        /* the done record's rows; -1: none */
    char *sha256;          /* the done record's; NULL: none */
    double duration;       /* the done record's duration_secs; -1: none */
    long long attempts;    /* attempts/_global/ in use (the last number) */
    bool stages;           /* merge.json records the two stages */
    char *final_status;    /* finalize.json's "status"; NULL: none */
};

/*
 * The global stage of m from the job directory jobfd (opened by the
 * caller, who reads as the job's owner): "_global"'s lock, done and failed
 * records as status_compute reads a shard's with details (lock_timeout as
 * there, > 0), prefix.json, the attempts' names, merge.json's "stages",
 * finalize.json; counts are those of the manifest's shards, for the phase.
 * Unreadable records leave their fields unknown (s.metadata_error). The
 * caller frees with status_global_free.
 */
void status_global_read(int jobfd, const struct manifest *m, long long lock_timeout,
                        const size_t counts[ST__COUNT], struct global_status *ret);
void status_global_free(struct global_status *g);

/* "phase" and "global" of a status object, into o: {"shard_id": "_global",
 * "status", "owner", "node", "pid", "lock_age_secs", "error", "rows",
 * "sha256", "duration_secs", "input_rows", "last_attempt", "operators",
 * "shard_operators", "executor_type", "metadata_error"} (those known). */
void status_global_json(const struct manifest *m, const struct global_status *g, cJSON *o);

struct job_status {
    size_t total;
    size_t counts[ST__COUNT];
    bool complete;                /* every shard done */
    bool terminal;                /* every shard done or failed */
    struct shard_status *shards;  /* manifest order */
    struct global_status *global; /* NULL: the job has no global stage */
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

/* The status --json object of spec §5.9 (caller deletes); with a global
 * stage, "phase" and "global" too (status_global_json). */
cJSON *status_json(const struct manifest *m, const struct job_status *st);

/* "pending=… running=… stale=… done=… failed=…" into out. */
void status_counts_text(const struct job_status *st, struct buf *out);

/* ---- views: a job's state kept up to date, step by step ---- */

/* Shards a view details (locks, failures) and a bounded report lists. */
#define STATUS_VIEW_DETAILS 1000

/* A node named by the records: its shards done (terminal, accumulated)
 * and the locks it holds in the last reading. */
struct status_node {
    char *name;
    size_t done, running, stale;
    size_t next_running, next_stale; /* of the reading in progress */
};

/* A shard the last reading details: a lock (running or stale) or a
 * failed record. */
struct status_detail {
    size_t index;
    enum shard_state state;
    char *owner, *node, *error; /* NULL: not recorded */
    long long pid;
    bool has_pid;
    double lock_age;
    bool metadata_error;
};

/*
 * What a daemon keeps of a job between status requests: one byte a shard
 * and aggregates. Done records never change, so each is read once and
 * summarised (its node, its completed_at and duration_secs); the states
 * come from listings of state/done, state/failed and state/locks, made a
 * bounded piece at a time (status_view_step), so that a reading of a
 * 100,000-shard job never holds an event loop for long. The counts are
 * those of the last reading whose listings are complete, taken at
 * read_wall; the done records it found new are summarised after that.
 */
struct status_view {
    size_t nshards;
    ino_t ino;           /* the job directory's inode, checked at each
                                 reading (0: not checked) */
    unsigned char *bits; /* per shard (status.c) */
    bool valid;          /* a reading was completed */
    double read_wall;    /* wall-clock time its listings started */
    size_t counts[ST__COUNT];
    long long rows_done;          /* input rows of the done shards */
    size_t summarised;            /* done records read (the last reading's or before) */
    size_t unreadable;            /* of them, those that could not be parsed */
    double first_start, last_end; /* epoch seconds over the summarised records; 0: none */
    double dur_sum;               /* sum of their duration_secs ... */
    size_t dur_n;                 /* ... over this many */
    struct status_node *nodes;
    size_t nnodes;
    /* the "hostname" and "node" of each summarised done record, as
     * indices + 1 into names (0: none), for a listing with --all */
    unsigned short *host, *node;
    char **names;
    size_t nnames;
    struct status_detail *details; /* the last reading's, by shard index */
    size_t ndetails;
    struct global_status *global; /* the last reading's; NULL: no global stage */
    /* the reading in progress */
    int phase; /* 0: none */
    int jobfd;
    void *dir; /* DIR * of the listing in progress */
    size_t cursor;
    double start_wall;
    long long lock_timeout;
    size_t nrunning, nstale;
    struct status_detail *next_details;
    size_t next_ndetails;
};

/* An empty view of m's shards (no reading yet). status_view_free frees. */
void status_view_init(struct status_view *v, const struct manifest *m);
void status_view_free(struct status_view *v);

/*
 * Goes on with the reading of m's directory into v (starting one when
 * none is in progress) for about budget units of work (a directory entry
 * is one, a record read is 16 plus one per 4 KiB of it). lock_timeout as status_compute. v's counts
 * change once the listings are complete; returns 1 when the new done
 * records are summarised too, 0 when work remains, or a negative errno with err set (the reading is abandoned; v
 * keeps the last complete one). The caller runs it with the job owner's
 * identity.
 */
int status_view_step(struct status_view *v, const struct manifest *m, long long lock_timeout,
                     size_t budget, struct esd_err *err);

/* Abandons the reading in progress, if any. */
void status_view_abort(struct status_view *v);

/*
 * The fleet's pace from the summarised done records: with durations and
 * running shards, running / mean duration shards a second; else the done
 * shards over the span from the first one's start to the last one's end.
 * *ret_rate -1 when unknown; *ret_eta (seconds) -1 when unknown, 0 when
 * nothing remains.
 */
void status_view_pace(const struct status_view *v, double *ret_shards_per_sec, double *ret_eta);

/*
 * Shard i's state in v's last complete reading (ST_PENDING when there is
 * none or i is out of range), and in *ret_node the node its done record
 * or lock names (esd's node name, else the host name; NULL when none is
 * known; the string is v's).
 */
enum shard_state status_view_shard(const struct status_view *v, size_t i, const char **ret_node);

/*
 * The status object of a job from its view (caller deletes): the fields of
 * status_json (total, counts, complete, terminal, merge, nodes, total_rows,
 * rows_done, ray_address) plus "read_at" (the reading's time), "read_age_secs"
 * (now - read_wall), "shards_per_sec", "rows_per_sec", "eta_secs" and
 * "source": "view"; with a global stage "phase" and "global" of the
 * reading. "shards" is bounded: every shard of a job of at most
 * STATUS_VIEW_DETAILS shards; of a larger one, with all the first
 * STATUS_VIEW_DETAILS in manifest order, without it the detailed shards
 * (locks and failures, at most STATUS_VIEW_DETAILS); "shards_omitted"
 * counts what was left out.
 */
cJSON *status_view_json(const struct status_view *v, const struct manifest *m, bool all);

/* Cuts the "shards" list of a status_json object down to at most max
 * entries, keeping running, stale, failed and unreadable ones first, and
 * records "shards_omitted". */
void status_json_bound(cJSON *status, size_t max);

/* The "merge" member of status_json (the finalize election's word), into o. */
void status_merge_json(const struct manifest *m, cJSON *o);

/* Seconds since the epoch of an ISO 8601 time as Python's isoformat()
 * writes it ("2026-12-01T13:58:07.123456+00:00", "Z", no zone: UTC);
 * -1 if malformed. */
double status_parse_time(const char *s);

#endif
