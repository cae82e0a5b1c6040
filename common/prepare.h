/*
 * prepare: turns a recipe and a JSONL dataset into a job directory (spec §6):
 * discovery and ordering of input files (plain, or compressed with gzip or
 * zstd), a scan pass that validates and measures every record, the exact
 * balancing rule, a write pass into a staging directory published by a
 * single rename, and idempotent re-prepare. Memory stays bounded whatever
 * the input size: records are streamed, one at a time.
 *
 * The directory the job goes in may belong to someone else, who can
 * rename and replace its entries while prepare runs (ARCHITECTURE.md "Security
 * model"). So prepare makes and fills the staging directory only through
 * descriptors (the parent opened once, every name below it opened without
 * following links), and a process running as root takes the identity of
 * that directory's owner first (prepare_owner, prepare_become).
 */
#ifndef ESD_PREPARE_H
#define ESD_PREPARE_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "jsonl.h"
#include "recipe.h"
#include "util.h"

struct prepare_progress {
    int phase;            /* 1: scan, 2: write (when the scan wrote the shards
                             itself, one report of phase 2, done) */
    uint64_t bytes_done;  /* input bytes read in this phase */
    uint64_t bytes_total; /* input bytes: in the scan the sum of file sizes, in the write
                             pass the same with a compressed file's decompressed size */
    uint64_t rows;        /* records so far in this phase */
    double elapsed;       /* seconds since prepare started */
};

/*
 * How the staging directory is made durable before it is published (see
 * prepare_run): one syncfs(2) of its file system, or an fsync(2) of every
 * file in it, issued after all are written. AUTO takes syncfs for more
 * than 1024 shards where it is known to write and commit everything and to
 * report a write error (ext4, XFS, btrfs, NFS, Lustre and tmpfs on Linux
 * 5.8 or later), else the fsyncs; the others are for tests.
 */
enum prepare_sync {
    PREPARE_SYNC_AUTO,
    PREPARE_SYNC_FS,
    PREPARE_SYNC_FILES,
};

struct prepare_opts {
    const char *config;       /* recipe path as given (resolved like a CLI path) */
    const char *dataset_path; /* overrides the recipe's dataset_path; may be NULL */
    const char *job_dir;      /* as given */
    long long num_shards;
    long long lock_timeout_secs;  /* 0: default 126000 */
    long long max_retries;        /* -1: default 3 */
    long long poll_interval_secs; /* 0: default 20 */
    const char *ray_address;      /* NULL: "local" */
    const char *dj_root;          /* base of relative paths in the recipe; NULL: working dir */
    const char *dj_commit;        /* recorded as data_juicer.commit; NULL: "unknown" */
    int dj_dirty;                 /* data_juicer.dirty: 0, 1, or -1 for null */
    const struct recipe_policy *policy; /* may be NULL; its global_stage is not read */
    bool no_global_stage;               /* refuse a whole-dataset operator, as the reference
                                           does, instead of splitting the recipe there */
    const struct strv *registry;        /* the operators the processor's Data-Juicer registers
                                    (sorted); NULL: not read, names are judged alone */
    const char *registry_source;        /* where registry was read, for messages */
    const struct jsonl_limits *limits;  /* may be NULL */
    void (*progress)(void *ctx, const struct prepare_progress *p); /* may be NULL */
    void *progress_ctx;
    /* When it becomes non-zero (a signal handler sets it), prepare stops
     * with -ECANCELED and leaves nothing behind. May be NULL. */
    const volatile sig_atomic_t *cancel;
    enum prepare_sync sync; /* default AUTO */
    /* Threads of the passes (reading, validation, the digests, writing;
     * common/pipeline.h): 0 for the CPUs available (pipeline_cpus), 1 for
     * none beside the caller's. The job is the same byte for byte. */
    unsigned threads;
};

struct prepare_result {
    char *job_dir;  /* resolved */
    bool unchanged; /* the job already existed and matched */
    long long num_shards;
    uint64_t rows;  /* records */
    uint64_t bytes; /* normalised bytes */
    struct strv warnings;
    size_t nprocess;        /* items of the recipe's process list */
    size_t split;           /* the items that run per shard; nprocess: no global stage */
    struct strv global_ops; /* the names of the items that run once after the shards */
    /* How the input was read (0 when unchanged): 1, the shards written by
     * the scan; 2, by a second pass; spooled, compressed inputs' text kept
     * by the scan for it (none of their sizes could be known before). */
    int passes;
    bool spooled;
};

/* Default values for the options above. */
void prepare_opts_init(struct prepare_opts *o);

/*
 * Prepares the job. On success *ret is filled (prepare_result_free). On
 * failure nothing is left behind (no job directory, no staging directory)
 * and err says why, naming the file and line for bad input.
 *
 * Durability: no file is synced as it is written. Once every shard, the
 * recipe copy and the manifest are written and closed, the staging
 * directory is synced at once (o->sync), then its directories (shards/,
 * state/, state/history/, itself); only then is it renamed onto the job
 * directory, and the parent synced. A crash before the rename leaves a
 * staging directory and no job; after it, a complete job. A write error
 * reported by any of those syncs (or by a close) fails the prepare.
 */
int prepare_run(const struct prepare_opts *o, struct prepare_result *ret, struct esd_err *err);
void prepare_result_free(struct prepare_result *r);

/*
 * Whose identity a prepare of job_dir (absolute, resolved) should run with
 * when root runs it: the owner of the job directory if it exists, else the
 * owner of its nearest existing ancestor, the directory it will be created
 * in. *ret_uid is that owner; 0 means root's own directory, where root
 * prepares as itself (through descriptors: even in a world-writable
 * sticky directory such as /tmp, nobody else may rename or remove root's
 * entries there, and a pre-planted name is never followed). If ret_where
 * is not NULL it is set to that directory (caller frees). Returns 0, or a
 * negative errno with err set when no ancestor can be examined.
 */
int prepare_owner(const char *job_dir, uid_t *ret_uid, char **ret_where, struct esd_err *err);

/*
 * Makes the calling process, which must be root, uid for good: the
 * supplementary groups of its user database entry (spawn_cred_for_uid), its
 * primary group, then the uid, real, effective and saved. Threads must not
 * exist yet. Returns 0, or a negative errno with err set (no entry for
 * uid, or a call failed) and the process may then be half changed: the
 * caller must not go on with the work.
 */
int prepare_become(uid_t uid, struct esd_err *err);

/* The points at which prepare calls prepare_test_hook. */
enum prepare_step {
    PREPARE_STEP_PARENT, /* before the parent is opened to make the job in (parent_fd -1) */
    PREPARE_STEP_MKDIR,  /* before the staging directory is made */
    PREPARE_STEP_OPEN,   /* made, before it is opened */
    PREPARE_STEP_FILLED, /* filled and synced, before it is checked for publication */
    PREPARE_STEP_RENAME, /* checked, before the rename that publishes it */
};

/*
 * Defined only by the unit tests, which play an attacker who renames
 * entries of the parent directory (open on parent_fd) between prepare's
 * steps; staging and job are names in it. Programs do not define it: the
 * reference is weak, so prepare never calls it there.
 */
void prepare_test_hook(enum prepare_step step, int parent_fd, const char *staging, const char *job);

#endif
