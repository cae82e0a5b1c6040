/*
 * attempt: one run of a processor on one claimed shard (spec §5.4, §8.4–8.6):
 * attempt.json, the command line, environment and working directory of the
 * child, materialising and validating its Ray-style output, publishing the
 * done record or recording the failure, and counting failures by class.
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
 * spec §8.4 (--config, --dataset_path, --export_path, --executor_type ray,
 * --ray_address, --work_dir, --job_id, --event_log_dir, --checkpoint_dir,
 * --partition_dir), the environment (DJ_PRODUCED_DATA_DIR; XDG_CACHE_HOME
 * and HF_HOME under <job>/cache unless set; PYTHONPATH led by dj_root) and
 * the working directory (dj_root, else the job directory). Creates the
 * resolved work directory and records "command" and "ray_export_path" in
 * attempt.json.
 */
int attempt_prepare(const struct manifest *m, const struct claim *cl,
                    const struct attempt_opts *o, struct attempt_cmd *ret, struct esd_err *err);
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
    int return_code;   /* exit status; -N killed by signal N; -1 never started */
    double duration;   /* seconds */
    enum failure_class fc; /* FC_NONE for success */
    const char *error; /* message for a failure */
    bool released;     /* stopped on purpose (drain, shutdown): not a failure */
    const char *dj_commit; /* recorded in the done record; NULL: "unknown" */
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
    bool shard_left;   /* this node alone used up the shard's retries: left to the others */
    bool counted;      /* a failure toward max_retries (processor, output) */
    size_t index;      /* the claim's shard */
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
 * when attempt_limit says AL_TERMINAL, else releases the lock (also when
 * the attempts cannot be counted: attempt_count's -E2BIG; ret->shard_left
 * when this node alone used up the retries while another lives). An
 * infrastructure failure's attempt.json says ATTEMPT_STATUS_INFRA, any
 * other failure's "failed". attempt.json gets the final fields. Tells the
 * claimer.
 */
int attempt_finish(struct claimer *c, const struct claim *cl, const struct attempt_outcome *out,
                   const struct attempt_result *res, struct attempt_final *ret,
                   struct esd_err *err);

/*
 * The number of a well-formed attempt directory name "<digits>-<token>" (4
 * to 9 digits, a 32-character lowercase hex token), or -1 for any other name.
 */
long long attempt_name_number(const char *name);

/* Failures recorded in the attempts of a shard. */
struct attempt_counts {
    long long attempts;  /* the last attempt number in use: the next is attempts + 1 */
    long long counted;   /* toward max_retries: processor and output */
    long long infra;     /* toward the infrastructure limit */
    long long here;      /* of counted: the failures of the node attempt_count_by names */
    int nodes;           /* nodes whose attempts make up counted: 0, 1, or 2 for two or more */
    bool truncated;      /* the directory held more than was looked at */
};

/*
 * Reads the attempts of a shard, attempts/<shard_id>/: failures by class
 * from each attempt.json, and the attempt number in use. Attempts written
 * by the reference have no class: "failed" counts toward max_retries,
 * "stale" as infrastructure. Unreadable attempt.json files are ignored, as
 * the reference ignores them.
 *
 * The directory is the owner's and every peer's to write, so only
 * well-formed attempts count: a directory (not a link to one) named
 * "<number>-<token>", 4 to 9 digits and 32 lowercase hex digits, as claims
 * name them; any other entry is ignored. Each attempt.json is read without
 * following a link or waiting on a FIFO, a regular file of at most 16 MiB.
 * The work is bounded: at most 8192 entries of any name are looked at (the
 * count is of those, and ret->truncated is set: junk hides attempts only
 * from its owner's own shard), and more than 1024 well-formed attempts, or
 * more than 32 MiB of attempt.json in all, is -E2BIG with a message naming
 * the directory, and the shard is not claimed until it is cleaned up. A missing
 * directory is no attempts; a link in its place is an error.
 *
 * Numbering: the reference's next number is the count of directories + 1
 * (spec §8.3 step 5). Here attempts = max(highest number seen, count of
 * well-formed attempts), so junk never shifts it; without junk and gaps
 * both agree (numbers 1..n, or repeats of a number from concurrent
 * reference claims: the count is larger then, as the reference has it);
 * after a gap (attempts removed by hand) the reference would repeat a
 * number, this continues after the highest. Names stay unique by token
 * either way.
 */
int attempt_count(const struct manifest *m, const char *shard_id, struct attempt_counts *ret,
                  struct esd_err *err);

/*
 * attempt_count, and the failures attributed to nodes: an attempt belongs
 * to the node its attempt.json names ("node", else "hostname", as the
 * reference's workers record only that); ret->here counts the counted
 * failures of node (NULL: none), ret->nodes how many nodes failed. An
 * attempt that names neither counts as a node of its own, so that failures
 * nobody can be told apart by keep the reference's rule.
 */
int attempt_count_by(const struct manifest *m, const char *shard_id, const char *node,
                     struct attempt_counts *ret, struct esd_err *err);

/*
 * A node is alive if its state/clock/<node> (touched at least every
 * CLAIM_CLOCK_RESYNC seconds while it makes claim passes) or a lock it
 * holds (renewed every lease/4) was modified this recently on the server's
 * clock.
 */
#define ATTEMPT_PEER_ALIVE_SECS (3 * CLAIM_CLOCK_RESYNC)

/* What the counts of a shard let claimer c's node do. */
enum attempt_limit {
    AL_OPEN,     /* under the limits, or used up by other nodes only: claim it */
    AL_TERMINAL, /* used up: publish the failed record */
    AL_LEFT,     /* this node alone used up max_retries while another node lives:
                    the shard is left to the others */
};

/*
 * The terminal rule. The infrastructure limit is the fleet's, as before.
 * max_retries used up is terminal only when at least two nodes failed the
 * shard, or when no other node has been alive in the last
 * ATTEMPT_PEER_ALIVE_SECS (a one-node fleet still fails a bad shard); a
 * shard only this node failed is left to the live others (AL_LEFT), and one
 * only other nodes failed is open to this node. Only when the retries are
 * used up, touches state/clock/<node> (the server's time, through a
 * descriptor of its own) and looks at state/clock and state/locks; what
 * cannot be read there counts as no other node.
 */
enum attempt_limit attempt_limit(struct claimer *c, const struct attempt_counts *n);

/*
 * Writes the first attempt.json of a new claim (status "running", the
 * claim's fields, input_path). The attempt directory must exist.
 */
int attempt_record_start(const struct manifest *m, const struct claim *cl, const char *hostname,
                         const char *node, double claimed_epoch, const char *claimed_at,
                         struct esd_err *err);

/* Marks a taken-over attempt stale (only if still "running"). attempt.json
 * is read as attempt_count reads it: a link, FIFO or device there is
 * nothing to mark. */
int attempt_mark_stale(const struct manifest *m, const char *attempt_rel, struct esd_err *err);

/*
 * The failure class of an attempt whose output could not be materialised,
 * validated or published with the negative errno r: infrastructure when the
 * storage or the node failed (err_transient: ENOSPC, EIO, ...), which does
 * not use up the shard's retries; output otherwise (the processor wrote
 * something that is not a valid result).
 */
enum failure_class attempt_result_class(int r);

#endif
