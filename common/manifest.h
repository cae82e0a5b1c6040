/*
 * manifest: the job's manifest.json (schema 2, spec §5.2): loading with the
 * reference's load-time checks plus the checks esd needs to use it safely
 * (shard ids are plain file names, shard paths are relative without ".."
 * components; pypath_join_inside checks symlinks where a path is used),
 * and the names of every file of the job directory layout (spec §4).
 */
#ifndef ESD_MANIFEST_H
#define ESD_MANIFEST_H

#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "util.h"

#define MANIFEST_SCHEMA 2
/* Limits of a manifest esd reads (files a job's owner or a peer writes).
 * The size a manifest may have follows from what it lists: a base plus
 * so much per shard and per input file, so that a document padded far
 * beyond that is refused before it is parsed (manifest_check_size). */
#define MANIFEST_MAX_BYTES ((size_t)1 << 30)
#define MANIFEST_BASE_BYTES ((size_t)1 << 20)
#define MANIFEST_ENTRY_BYTES ((size_t)16 << 10)
#define MANIFEST_MAX_SHARDS 1000000
#define MANIFEST_MAX_FILES 10000000
#define MANIFEST_PATH_MAX 4096

/* Policy defaults of the reference (spec §14). */
#define POLICY_LOCK_TIMEOUT_DEFAULT 126000
#define POLICY_MAX_RETRIES_DEFAULT 3
#define POLICY_POLL_INTERVAL_DEFAULT 20

struct manifest_shard {
    const char *id;   /* in the manifest's arena */
    const char *path; /* relative, "shards/<id>.jsonl" */
    long long index;
    long long rows;
    long long size_bytes; /* -1: not recorded */
    const char *sha256;   /* NULL: not recorded */
};

/*
 * What esd uses of a manifest, and nothing more: the parsed document is
 * not kept (a daemon holds one of these per job), every string lives in
 * one arena.
 */
struct manifest {
    char *arena;   /* every string below (owned) */
    char *job_dir; /* resolved job directory */
    const char *job_id;
    size_t nshards;
    struct manifest_shard *shards;
    size_t *by_id; /* shard indices sorted by id, for manifest_find */
    const char *ray_address;
    const char *execution_json;      /* the execution object, compact JSON */
    const char *recipe_sha256;       /* recipe.sha256; NULL if absent */
    const char *recipe_snapshot;     /* recipe.snapshot_path; NULL: "recipe.yaml" */
    const char *dj_commit;           /* data_juicer.commit; NULL if absent */
    const char *recipe_whole_sha256; /* recipe.whole_sha256; NULL if absent */
    const char *global_snapshot;     /* recipe.global.snapshot_path; NULL: no global stage */
    const char *global_sha256;       /* recipe.global.sha256 */
    const char *global_executor;     /* recipe.global.executor_type: "default" or "ray" */
    const char *global_ops_json;     /* recipe.global.operators, compact JSON array text */
    long long global_shard_ops;      /* recipe.global.shard_operators */
    long long lock_timeout_secs;
    long long max_retries;
    long long poll_interval_secs;
    long long total_rows;
};

/*
 * Loads <job_dir>/manifest.json (job_dir must be resolved), read as a job
 * file (fs_read_job: no symbolic link, FIFO or device; size checked by
 * manifest_check_size). Checks schema_version == 2, a non-empty shards
 * list of well-formed entries whose ids are plain names, and an execution
 * object with executor_type "ray" and a non-empty ray_address. Missing
 * policy values take the defaults. The caller frees with manifest_free.
 */
int manifest_load(const char *job_dir, struct manifest *ret, struct esd_err *err);
/*
 * Why job_dir/manifest.json could not be opened, when reading it failed
 * with r (negative errno): for -ENOENT, -ENOTDIR, -EACCES and -EPERM,
 * job_dir is looked at (stat, with the caller's file system identity) and
 * err says which of "DIR: no such directory", "DIR: not a directory",
 * "DIR: cannot read the directory: ..." or "DIR: not a job directory (no
 * manifest.json): prepare it first, or check the path" it is; returns true
 * then. Any other r (or none of these found): false, err untouched.
 * manifest_load words its errors so.
 */
bool manifest_dir_explain(const char *job_dir, int r, struct esd_err *err);
/* manifest_load that also hands over the whole parsed document in *ret_doc
 * (the caller cJSON_Deletes it), for prepare and tools that need more. */
int manifest_load_doc(const char *job_dir, struct manifest *ret, cJSON **ret_doc,
                      struct esd_err *err);
/* manifest_load's checks on text[0..len) (path names it in messages);
 * ret_doc as manifest_load_doc, or NULL. */
int manifest_parse(const char *text, size_t len, const char *job_dir, const char *path,
                   cJSON **ret_doc, struct manifest *ret, struct esd_err *err);
/*
 * Refuses, before any parsing, a manifest text larger than what it lists
 * can need: MANIFEST_BASE_BYTES plus MANIFEST_ENTRY_BYTES per element of
 * its top-level "shards" and "input_files" lists (counted by a scan of the
 * bytes), or listing more than MANIFEST_MAX_SHARDS shards or
 * MANIFEST_MAX_FILES input files. -EFBIG with a message naming path.
 */
int manifest_check_size(const char *text, size_t len, const char *path, struct esd_err *err);
/*
 * The compact form of m, which a loading helper sends to the daemon: one
 * tab-separated line of the manifest's fields, then one a shard, so that
 * the daemon reads it line by line into the struct without a parse tree
 * (manifest_reader). Its strings are free of control characters
 * (manifest_parse refuses or drops others). Shard digests are left out: a
 * daemon checks none (whoever verifies a shard loads the manifest), and
 * at 100,000 shards they would be a quarter of its memory for the job.
 */
void manifest_compact(const struct manifest *m, struct buf *out);

/* Reads a compact form as it arrives. */
struct manifest_reader {
    struct buf part;  /* an incomplete line */
    struct buf arena; /* the strings read (offsets below) */
    bool header;
    size_t nshards, got, lines;
    long long lock_timeout, max_retries, poll;
    size_t hoff[11]; /* job_id, ray_address, execution, recipe sha256, snapshot, commit,
                      * whole sha256, global snapshot, sha256, executor, operators */
    long long global_shard_ops;
    struct manifest_shard *shards;
    size_t *offs; /* per shard: id, path, sha256 */
};

void manifest_reader_init(struct manifest_reader *rd);
/* The next n bytes. 0, or -EINVAL with err set for a malformed form. */
int manifest_reader_feed(struct manifest_reader *rd, const char *p, size_t n, struct esd_err *err);
/* The manifest read, for job_dir (manifest_free), after every byte was
 * fed; checks what manifest_parse would. 0 or -EINVAL. */
int manifest_reader_finish(struct manifest_reader *rd, const char *job_dir, struct manifest *ret,
                           struct esd_err *err);
void manifest_reader_free(struct manifest_reader *rd);
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

/* The key of a resolved job directory: the first 16 hex digits of the
 * SHA-256 of its path, the same on every node (esd's registry and spool
 * file names). */
void manifest_dir_key(const char *job_dir, char ret_key[17]);
/* The journal's ESD_JOB of a resolved job directory, unique even when two
 * jobs share a basename: "<basename>@<the first 8 digits of its key>".
 * The caller frees it. */
char *manifest_log_id(const char *job_dir);

#endif
