/*
 * gstage: the records and the manifest of a recipe's global stage.
 */
#include "gstage.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fsutil.h"
#include "json.h"

#define PREFIX_MAX_BYTES (64 << 10)

bool
gstage_is(const char *id)
{
    return id && !strcmp(id, GSTAGE_ID);
}

static bool
is_hex64(const char *s)
{
    if (!s || strlen(s) != SHA256_HEX_LEN)
        return false;
    for (const char *p = s; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
            return false;
    return true;
}

int
gstage_prefix_load(const struct manifest *m, struct gstage_prefix *ret, struct esd_err *err)
{
    char *path = fs_join(m->job_dir, GSTAGE_PREFIX);
    const char *status, *sha;
    cJSON *o = NULL;
    int r;

    memset(ret, 0, sizeof(*ret));
    r = json_load_object(path, PREFIX_MAX_BYTES, &o, err);
    if (r == -ENOENT) {
        r = 0;
        goto out;
    }
    if (r < 0)
        goto out;
    status = json_get_str(o, "status");
    sha = json_get_str(o, "sha256");
    if (!status || strcmp(status, "complete"))
        r = err_set(err, -EINVAL, "%s: status is not \"complete\"", path);
    else if (json_get_int(o, "rows", &ret->rows) < 0 || ret->rows < 0)
        r = err_set(err, -EINVAL, "%s: rows must be a non-negative integer", path);
    else if (json_get_int(o, "num_shards", &ret->num_shards) < 0 ||
             ret->num_shards != (long long)m->nshards)
        r = err_set(err, -EINVAL, "%s: num_shards must be the manifest's %zu", path, m->nshards);
    else if (!is_hex64(sha))
        r = err_set(err, -EINVAL, "%s: sha256 must be 64 lower-case hex digits", path);
    if (r == 0) {
        memcpy(ret->sha256, sha, SHA256_HEX_LEN + 1);
        if (json_get_int(o, "size_bytes", &ret->size_bytes) < 0 || ret->size_bytes < 0)
            ret->size_bytes = -1;
        r = 1;
    }
out:
    cJSON_Delete(o);
    free(path);
    return r;
}

int
gstage_prefix_write(const struct manifest *m, const struct gstage_prefix *p, const char *node,
                    struct esd_err *err)
{
    char *dir = fs_join(m->job_dir, GSTAGE_DIR), *path = fs_join(m->job_dir, GSTAGE_PREFIX);
    cJSON *o = cJSON_CreateObject();
    char now[40];
    int r;

    time_iso_now(now, NULL);
    json_add_str(o, "status", "complete");
    json_add_str(o, "job_id", m->job_id);
    json_add_int(o, "rows", p->rows);
    json_add_str(o, "sha256", p->sha256);
    if (p->size_bytes >= 0)
        json_add_int(o, "size_bytes", p->size_bytes);
    json_add_int(o, "num_shards", p->num_shards);
    json_add_str(o, "input_path", GSTAGE_INPUT);
    json_add_str(o, "node", node ? node : "?");
    json_add_str(o, "merged_at", now);
    if ((r = fs_mkdir_p(dir, 0755, err)) == 0)
        r = json_write_atomic(path, o, JSON_PRETTY, err);
    cJSON_Delete(o);
    free(dir);
    free(path);
    return r;
}

/* Appends s (with its NUL) to the arena being filled at *at. */
static char *
put(char **at, const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = *at;

    memcpy(p, s, n);
    *at += n;
    return p;
}

static size_t
len0(const char *s)
{
    return s ? strlen(s) + 1 : 0;
}

void
gstage_manifest(const struct manifest *m, const struct gstage_prefix *p, struct manifest *ret)
{
    const char *strs[] = { m->job_dir,       m->job_id,          m->ray_address, m->execution_json,
                           m->global_sha256, m->global_snapshot, m->dj_commit,   m->global_executor,
                           GSTAGE_ID,        GSTAGE_INPUT,       p->sha256 };
    size_t total = 0;
    char *at;

    for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); i++)
        total += len0(strs[i]);
    memset(ret, 0, sizeof(*ret));
    ret->arena = at = xmalloc(total);
    ret->job_dir = put(&at, m->job_dir);
    ret->job_id = put(&at, m->job_id);
    ret->ray_address = put(&at, m->ray_address);
    ret->execution_json = m->execution_json ? put(&at, m->execution_json) : NULL;
    ret->recipe_sha256 = m->global_sha256 ? put(&at, m->global_sha256) : NULL;
    ret->recipe_snapshot = put(&at, m->global_snapshot);
    ret->dj_commit = m->dj_commit ? put(&at, m->dj_commit) : NULL;
    ret->executor_type = m->global_executor ? put(&at, m->global_executor) : NULL;
    ret->nshards = 1;
    ret->shards = xcalloc(1, sizeof(*ret->shards));
    ret->shards[0].id = put(&at, GSTAGE_ID);
    ret->shards[0].path = put(&at, GSTAGE_INPUT);
    ret->shards[0].index = 0;
    ret->shards[0].rows = p->rows;
    ret->shards[0].size_bytes = p->size_bytes;
    ret->shards[0].sha256 = put(&at, p->sha256);
    ret->by_id = xcalloc(1, sizeof(*ret->by_id));
    ret->lock_timeout_secs = m->lock_timeout_secs;
    ret->max_retries = m->max_retries;
    ret->poll_interval_secs = m->poll_interval_secs;
    ret->total_rows = p->rows;
}

cJSON *
gstage_stages_json(const struct manifest *m, const struct gstage_prefix *p, long long rows,
                   const char *sha256)
{
    cJSON *st = cJSON_CreateObject(), *x, *ops;

    x = cJSON_AddObjectToObject(st, "shards");
    json_add_int(x, "rows", p->rows);
    json_add_str(x, "sha256", p->sha256);
    json_add_int(x, "num_shards", p->num_shards);
    json_add_int(x, "operators", m->global_shard_ops);
    json_add_str(x, "output_path", GSTAGE_INPUT);
    x = cJSON_AddObjectToObject(st, "global");
    json_add_int(x, "rows", rows);
    json_add_str(x, "sha256", sha256);
    ops = m->global_ops_json ? cJSON_Parse(m->global_ops_json) : NULL;
    cJSON_AddItemToObject(x, "operators", ops && cJSON_IsArray(ops) ? ops : cJSON_CreateArray());
    if (ops && !cJSON_IsArray(ops))
        cJSON_Delete(ops);
    json_add_str(x, "executor_type", m->global_executor ? m->global_executor : "default");
    return st;
}
