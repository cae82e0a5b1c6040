/*
 * gstage: the global stage of a whole recipe (prepare split it at its
 * first whole-dataset operator: recipe.global.yaml). Once every shard is
 * done, the finalize winner merges the shards' outputs in order into
 * state/esd/global/input.jsonl and records that merge in prefix.json;
 * from then on the job is in its global phase, where the one pseudo-shard
 * GSTAGE_ID, whose input is that file, goes through the shard machinery
 * as any shard does (lock, attempts, done or failed record: claim.h,
 * attempt.h), on a manifest of its own made here (gstage_manifest). Its
 * id is not a manifest shard id, so the reference's tools, which iterate
 * those, never see its files. The final merge publishes its result.
 */
#ifndef ESD_GSTAGE_H
#define ESD_GSTAGE_H

#include <stdbool.h>

#include <cjson/cJSON.h>

#include "manifest.h"
#include "sha256.h"
#include "util.h"

#define GSTAGE_ID "_global"
#define GSTAGE_DIR "state/esd/global"
#define GSTAGE_INPUT "state/esd/global/input.jsonl"
#define GSTAGE_PREFIX "state/esd/global/prefix.json"

/* The merge of the shards' outputs that the global stage reads. */
struct gstage_prefix {
    long long rows;
    long long num_shards;
    long long size_bytes; /* -1: not recorded */
    char sha256[SHA256_HEX_LEN + 1];
};

/* Whether m's recipe has a global stage. */
static inline bool
gstage_has(const struct manifest *m)
{
    return m->global_snapshot != NULL;
}

/* Whether id is the global stage's pseudo-shard. */
bool gstage_is(const char *id);

/*
 * Reads <job>/state/esd/global/prefix.json (a job file: no link
 * followed). 1 with *ret filled, 0 when it is not there (the shards are
 * not merged yet), or a negative errno with err naming the file.
 */
int gstage_prefix_load(const struct manifest *m, struct gstage_prefix *ret, struct esd_err *err);

/* The record of the prefix merge, written atomically (extra keys of the
 * node's, may be NULL). 0 or a negative errno. */
int gstage_prefix_write(const struct manifest *m, const struct gstage_prefix *p, const char *node,
                        struct esd_err *err);

/*
 * The manifest of the global stage: m's job, policy and Ray address, the
 * recipe recipe.global.yaml, the executor of the stage, and one shard,
 * GSTAGE_ID, whose input is GSTAGE_INPUT with p's rows and digest.
 * manifest_free frees it.
 */
void gstage_manifest(const struct manifest *m, const struct gstage_prefix *p, struct manifest *ret);

/* merge.json's "stages" of a finished job (caller cJSON_Deletes). */
cJSON *gstage_stages_json(const struct manifest *m, const struct gstage_prefix *p, long long rows,
                          const char *sha256);

#endif
