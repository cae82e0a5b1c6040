/*
 * attempt: one run of a processor on one claimed shard (spec §5.4, §8.4–8.6):
 * attempt.json, the command line, environment and working directory of the
 * child, materialising and validating its Ray-style output, publishing the
 * done record or recording the failure. Counting failures by class and the
 * terminal rule are common/tries.h's, below claim and attempt both.
 *
 * Nothing here blocks on the child: attempt_prepare returns what to spawn;
 * the caller spawns it (own process group), heartbeats the claim, enforces
 * timeouts and then calls attempt_materialize (heavy: may run in a child
 * process) and attempt_finish.
 *
 * Failure classes (attempt.json "failure_class"): "processor" (non-zero exit,
 * signal, timeout) and "output" (invalid output) count toward max_retries
 * as in the reference; "infrastructure" (lease lost, stale takeover, spawn
 * failure, Ray head down) does not, but has its own limit; a clean stop
 * (drain, shutdown: status "released") counts toward nothing.
 */
#ifndef ESD_ATTEMPT_H
#define ESD_ATTEMPT_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "claim.h"
#include "jsonl.h"
#include "manifest.h"
#include "sha256.h"
#include "util.h"

enum failure_class {
    FC_NONE,
    FC_PROCESSOR,
    FC_OUTPUT,
    FC_INFRASTRUCTURE,
};

/* "processor", "output", "infrastructure" (NULL for FC_NONE). */
const char *attempt_class_name(enum failure_class fc);

struct attempt_opts {
    /* Processor command prefix; NULL: {"dj-process"}, or {python,
     * <dj_root>/tools/process_data.py} when dj_root is set. */
    const char *const *processor;
    const char *dj_root;     /* Data-Juicer checkout: child's cwd, PYTHONPATH */
    const char *python;      /* NULL: "python3" */
    const char *ray_address; /* --ray_address; NULL: the manifest's */
    char *const *env;        /* base environment; NULL: environ */
    /* With both set, the command is {dj_python, dj_runner} instead of the
     * processor: esd-dj, Data-Juicer's process_data with the input order
     * kept (djversion's python: only for Data-Juicer's own processor). */
    const char *dj_python;
    const char *dj_runner;
};

/*
 * The path of esd-dj: next to the running program (a build tree), else in
 * ../lib/esd from it (an installation, whatever its PREFIX), else in
 * ESD_LIBEXECDIR. NULL when none is readable. Caller frees.
 */
char *attempt_dj_runner(void);

/* What to spawn (all owned; attempt_cmd_free). */
struct attempt_cmd {
    char **argv;
    char **envp;
    char *cwd;
    char *log_path;    /* <attempt>/process.log */
    char *export_path; /* <attempt>/ray-output.jsonl */
};

/*
 * Builds the command of an attempt: the processor prefix and the flags of
 * spec §8.4 (--config, --dataset_path, --export_path, --executor_type
 * ray or the manifest's executor_type (a global stage's), --ray_address, --work_dir, --job_id, --event_log_dir, --checkpoint_dir,
 * --partition_dir), the environment (DJ_PRODUCED_DATA_DIR; XDG_CACHE_HOME
 * and HF_HOME under <job>/cache unless set; PYTHONPATH led by dj_root) and
 * the working directory (dj_root, else the job directory). Creates the
 * resolved work directory and records "command" and "ray_export_path" in
 * attempt.json.
 */
int attempt_prepare(const struct manifest *m, const struct claim *cl, const struct attempt_opts *o,
                    struct attempt_cmd *ret, struct esd_err *err);
void attempt_cmd_free(struct attempt_cmd *cmd);

/* A validated result (spec §8.5). */
struct attempt_result {
    uint64_t rows;
    uint64_t size_bytes;
    char sha256[SHA256_HEX_LEN + 1];
    cJSON *ray_output_files; /* owned: [{path, rows, size_bytes, sha256}] */
};

/*
 * Materialises the export path of a successful run into processed.jsonl
 * (spec §8.5): a file is the only source; a directory contributes every
 * regular file below it whose name starts with neither "." nor "_", in
 * code point order of relative paths, except that a name whose stem ends
 * in more than six digits (Ray's write task index from task 1,000,000 on)
 * sorts by that number after the six-digit ones of the same prefix. Every
 * line is validated, a missing
 * final newline is added per source; nothing else changes. Errors name the
 * file and line; a missing export path is "Data-Juicer returned 0 but did
 * not create <path>"; one that is neither a regular file nor a directory is
 * refused. On failure no processed.jsonl is left.
 */
int attempt_materialize(const struct manifest *m, const struct claim *cl,
                        const struct jsonl_limits *lim, struct attempt_result *ret,
                        struct esd_err *err);
void attempt_result_free(struct attempt_result *r);

/* How an attempt ended, as the caller saw it. */
struct attempt_outcome {
    int return_code;         /* exit status; -N killed by signal N; -1 never started */
    double duration;         /* seconds */
    enum failure_class fc;   /* FC_NONE for success */
    const char *error;       /* message for a failure */
    bool released;           /* stopped on purpose (drain, shutdown): not a failure */
    const char *dj_commit;   /* recorded in the done record; NULL: "unknown" */
    const char *ray_address; /* the address the attempt used; NULL: the manifest's */
    /* when the processor was let run and when it ended (epoch seconds;
     * 0: unknown), recorded in attempt.json as started_at_epoch and
     * processor_ended_at_epoch: validation and publication come after */
    double started_epoch, ended_epoch;
};

/* The attempt's final status ("done", "superseded", "lost", "stale",
 * "failed", "released") and whether the shard became terminal. */
struct attempt_final {
    char status[16];
    bool shard_done;
    bool shard_failed;
    bool shard_left; /* this node alone used up the shard's retries: left to the others */
    bool counted;    /* a failure toward max_retries (processor, output) */
    size_t index;    /* the claim's shard */
};

/*
 * The attempt.json status of an infrastructure failure that is not a
 * takeover ("stale") nor a clean stop ("released"): the reference's
 * workers count "failed" and "stale" toward max_retries (spec §5.4, §8.3
 * step 4) and skip any other status, so that esd's infrastructure
 * failures never use up a shard's retries in a fleet that mixes both
 * (attempt_finish still reports such an attempt as "failed").
 */
#define ATTEMPT_STATUS_INFRA "infra_failed"

/*
 * Ends an attempt. Success (res != NULL): publishes the done record (spec
 * §5.5 plus "node") by link() under the fence, only while the lock is
 * still this claim's, then removes the lock ("done"; "superseded" if a
 * done or failed record already existed; "lost"/"stale" if the lock is no
 * longer ours, in which case nothing is published). Failure: records the
 * error and class; publishes the failed record (spec §5.6) under the fence
 * when tries_limit says TL_TERMINAL, else releases the lock (also when
 * the attempts cannot be counted: tries_count's -E2BIG; ret->shard_left
 * when this node alone used up the retries while another lives). An
 * infrastructure failure's attempt.json says ATTEMPT_STATUS_INFRA, any
 * other failure's "failed". attempt.json gets the final fields. Tells the
 * claimer.
 */
int attempt_finish(struct claimer *c, const struct claim *cl, const struct attempt_outcome *out,
                   const struct attempt_result *res, struct attempt_final *ret,
                   struct esd_err *err);

/*
 * The failure class of an attempt whose output could not be materialised,
 * validated or published with the negative errno r: infrastructure when the
 * storage or the node failed (err_transient: ENOSPC, EIO, ...), which does
 * not use up the shard's retries; output otherwise (the processor wrote
 * something that is not a valid result).
 */
enum failure_class attempt_result_class(int r);

#endif
