/*
 * manifest: the job's manifest.json (schema 2, spec §5.2): loading with the
 * reference's load-time checks plus the checks esd needs to use it safely
 * (shard ids are plain file names, shard paths are relative without ".."
 * components; fs_join_inside checks symlinks where a path is used),
 * and the names of every file of the job directory layout (spec §4).
 */
#ifndef ESD_MANIFEST_H
#define ESD_MANIFEST_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "util.h"

#define MANIFEST_SCHEMA 2
#define MANIFEST_MAX_BYTES ((size_t)1 << 30)

/* Policy defaults of the reference (spec §14). */
#define POLICY_LOCK_TIMEOUT_DEFAULT 126000
#define POLICY_MAX_RETRIES_DEFAULT 3
#define POLICY_POLL_INTERVAL_DEFAULT 20

struct manifest_shard {
    const char *id;   /* points into json */
    const char *path; /* relative, "shards/<id>.jsonl" */
    long long index;
    long long rows;
    long long size_bytes;
    const char *sha256;
};

struct manifest {
    cJSON *json;       /* the whole document (owned) */
    char *job_dir;     /* resolved job directory */
    const char *job_id;
    size_t nshards;
    struct manifest_shard *shards;
    size_t *by_id;     /* shard indices sorted by id, for manifest_find */
    const cJSON *execution;
    const char *ray_address;
    long long lock_timeout_secs;
    long long max_retries;
    long long poll_interval_secs;
    long long total_rows;
};

/*
 * Loads <job_dir>/manifest.json (job_dir must be resolved). Checks
 * schema_version == 2, a non-empty shards list of well-formed entries whose
 * ids are plain names, and an execution object with executor_type "ray"
 * and a non-empty ray_address. Missing policy values take the defaults.
 * The caller frees with manifest_free.
 */
int manifest_load(const char *job_dir, struct manifest *ret, struct esd_err *err);
void manifest_free(struct manifest *m);

/* Index of the shard with this id, or -1 (a binary search). */
long manifest_find(const struct manifest *m, const char *id);

/* Paths of a job directory (caller frees): <job>/state/<kind>/<id><suffix>. */
char *manifest_state_path(const struct manifest *m, const char *kind, const char *id,
                          const char *suffix);

/*
 * One listing of state/<kind>/: present[i] is set for every shard i whose
 * <id><suffix> is there (hidden temp files ignored; other entries
 * untouched). A missing directory lists as empty.
 */
int manifest_list_state(const struct manifest *m, const char *kind, const char *suffix,
                        bool *present, struct esd_err *err);

/* Shard name for index i of n: "part-<i>-of-<n>", width max(5, digits(n)). */
char *manifest_shard_id(long long i, long long n);

/* True if id is usable as a file name: [A-Za-z0-9._-], not starting with
 * '.', at most 200 bytes. */
bool manifest_id_ok(const char *id);

/* True if id is usable as a job id: 1 to 255 bytes of well-formed UTF-8
 * with no control character (C0, DEL, C1; see str_clean) and no '/', not
 * starting with '-' (it is passed as the value of --job_id). Spaces and
 * other non-ASCII characters are fine: a job id is a directory's name. */
bool manifest_job_id_ok(const char *id);

#endif
