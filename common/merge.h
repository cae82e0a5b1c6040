/*
 * merge: the ordered merge of a finished job (spec §11) and its read-only
 * twin, verify. Every shard's accepted result is revalidated line by line
 * and its row count and SHA-256 are checked against the done record; merge
 * writes the concatenation, in manifest order, to a temporary file beside
 * the output and renames it into place (so --overwrite is atomic), then
 * records merge.json. Memory stays bounded; reading, the revalidation,
 * the writes and the two digests run as a pipeline over o->threads
 * threads (common/pipeline.h), with the same output whatever their number.
 */
#ifndef ESD_MERGE_H
#define ESD_MERGE_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "gstage.h"
#include "jsonl.h"
#include "manifest.h"
#include "sha256.h"
#include "util.h"

struct merge_progress {
    size_t shards_done, shards_total;
    uint64_t bytes_done, bytes_total; /* bytes_total from the done records */
    uint64_t rows;
    double elapsed;
};

struct merge_opts {
    const char *output; /* resolved path; NULL for verify */
    bool overwrite;
    long long lock_timeout; /* for the completeness check; <= 0: manifest */
    const struct jsonl_limits *limits;
    void (*progress)(void *ctx, const struct merge_progress *p);
    void *progress_ctx;
    /* When it becomes non-zero, merge stops with -ECANCELED, leaving no
     * output or temporary file. May be NULL. */
    const volatile sig_atomic_t *cancel;
    /* confined: output must lie inside the job directory, which job_fd
     * (a descriptor of it, checked by the caller) is; the output's
     * directory is reached from job_fd and the output created and renamed
     * there, no symbolic link followed on the way (a daemon merging a
     * directory its owner controls). */
    bool confined;
    int job_fd;
    /* When not NULL, called once the output is complete and synced, just
     * before it is renamed into place: a non-zero return (a negative errno,
     * err set) stops the merge there, leaving no output or temporary file.
     * A finalizer checks there that it still holds its election. */
    int (*before_publish)(void *ctx, struct esd_err *err);
    void *publish_ctx;
    /* A whole recipe's stages (common/gstage.h). stage_input: this merge
     * is of the shards' outputs into the global stage's input (the output
     * is GSTAGE_INPUT, inside the job's state), and records no merge.json.
     * stage_of and prefix: this merge is of the global stage's manifest
     * (gstage_manifest of stage_of), and merge.json records both stages
     * and stage_of's shard count. */
    bool stage_input;
    const struct manifest *stage_of;
    const struct gstage_prefix *prefix;
    /* Threads of the revalidation and the digests (common/pipeline.h): 0
     * for the CPUs available, 1 for none beside the caller's. */
    unsigned threads;
};

struct merge_owner {
    char *hostname;
    size_t shards;
};

struct merge_result {
    size_t nshards;
    uint64_t rows;
    uint64_t bytes;
    char sha256[SHA256_HEX_LEN + 1]; /* of the merged bytes */
    struct merge_owner *owners;      /* distinct hostnames of done records, sorted */
    size_t nowners;
    /* verify only: merge.json was present and its output checked */
    bool checked_output;
    /* verify of a job with a global stage: both stages checked, and the
     * global stage's result ("_global"'s done record) */
    bool global;
    uint64_t global_rows;
    char global_sha256[SHA256_HEX_LEN + 1];
};

/*
 * Merges m into o->output. Refuses an incomplete job ("Cannot merge an
 * incomplete job: pending=… running=… stale=… failed=… done=…"), an
 * existing output without o->overwrite, an invalid result line (file:line)
 * and a result whose rows or SHA-256 differ from its done record ("Result
 * checksum or row count mismatch for <id>"). On failure no output or
 * temporary file is left behind and an existing output is untouched.
 */
/* Removes the temporary output of a merge_run in progress: async-signal
 * safe, for a process that stops a merge from a signal handler. */
void merge_abort(void);

/* Whether out (resolved) is the job directory itself or inside the job's
 * own files (shards, attempts, state, cache, manifest.json, recipe.yaml,
 * merge.json): a merge there would destroy what it is made from. */
bool merge_output_clobbers(const char *job_dir, const char *out);

int merge_run(const struct manifest *m, const struct merge_opts *o, struct merge_result *ret,
              struct esd_err *err);

/*
 * Verify: the same checks without writing anything; if merge.json exists
 * and its output file too, that file's rows and SHA-256 are checked
 * against it as well. A job with a global stage (m->global_snapshot) is
 * checked in both stages: state/esd/global/prefix.json (rows, sha256,
 * num_shards) and input.jsonl against the shards' results, each shard's
 * rows and digest in manifest order; the "_global" done record against
 * its output; merge.json's "stages" and its top level (= the global
 * stage's result) and the final output. A stage not yet finished is
 * -EAGAIN, a failed or mismatching one -EINVAL, naming the file.
 */
int merge_verify(const struct manifest *m, const struct merge_opts *o, struct merge_result *ret,
                 struct esd_err *err);

void merge_result_free(struct merge_result *r);

#endif
