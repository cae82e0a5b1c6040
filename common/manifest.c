/*
 * manifest: loading and checking manifest.json, and the job directory's
 * file names.
 */
#include "manifest.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsutil.h"
#include "json.h"

bool
manifest_id_ok(const char *id)
{
    size_t n = strlen(id);

    if (n == 0 || n > 200 || id[0] == '.')
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = id[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return false;
    }
    return true;
}

bool
manifest_job_id_ok(const char *id)
{
    size_t n = strlen(id);

    return n > 0 && n <= 255 && id[0] != '-' && !memchr(id, '/', n) && str_clean(id, n);
}

/* The refusal of a job id: both it and the path are shown escaped. */
static int
job_id_refused(const char *path, const char *id, struct esd_err *err)
{
    char *p = str_escape_dup(path), *i = str_escape_dup(id);
    int r = err_set(err, -EINVAL,
                    "Malformed manifest %s: job_id '%s' is not allowed (a job id is 1 to 255 "
                    "bytes of UTF-8 without control characters or '/', not starting with '-')",
                    p, i);

    free(p);
    free(i);
    return r;
}

char *
manifest_shard_id(long long i, long long n)
{
    int width = snprintf(NULL, 0, "%lld", n);

    if (width < 5)
        width = 5;
    return xasprintf("part-%0*lld-of-%0*lld", width, i, width, n);
}

/* Lexical part of the escape check: relative, no ".." component. Symlinks
 * are checked where a path is used (fs_join_inside). */
static bool
path_ok(const char *p)
{
    const char *c = p;

    if (!*p || *p == '/')
        return false;
    while (*c) {
        size_t n = strcspn(c, "/");
        if (n == 2 && c[0] == '.' && c[1] == '.')
            return false;
        c += n;
        c += *c == '/';
    }
    return true;
}

static int
policy_int(const cJSON *policy, const char *key, long long def, long long min, long long *ret,
           const char *path, struct esd_err *err)
{
    const cJSON *v = policy ? cJSON_GetObjectItemCaseSensitive(policy, key) : NULL;
    long long x;

    if (!v || cJSON_IsNull(v)) {
        *ret = def;
        return 0;
    }
    if (json_get_int(policy, key, &x) < 0 || x < min)
        return err_set(err, -EINVAL, "Malformed manifest %s: policy.%s must be an integer >= %lld",
                       path, key, min);
    *ret = x;
    return 0;
}

static int
cmp_by_id(const void *a, const void *b, void *shards)
{
    const struct manifest_shard *s = shards;

    return strcmp(s[*(const size_t *)a].id, s[*(const size_t *)b].id);
}

int
manifest_load(const char *job_dir, struct manifest *ret, struct esd_err *err)
{
    struct manifest m = { 0 };
    char *path = fs_join(job_dir, "manifest.json");
    const cJSON *shards, *exec, *policy, *item;
    long long schema;
    int r, i = 0;

    r = json_load_object(path, MANIFEST_MAX_BYTES, &m.json, err);
    if (r < 0)
        goto out;
    if (json_get_int(m.json, "schema_version", &schema) < 0 || schema != MANIFEST_SCHEMA) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(m.json, "schema_version");
        char *txt = v ? cJSON_PrintUnformatted(v) : NULL;
        r = err_set(err, -EINVAL, "Unsupported manifest schema_version %s in %s (expected %d)",
                    txt ? txt : "(missing)", path, MANIFEST_SCHEMA);
        free(txt);
        goto out;
    }
    shards = cJSON_GetObjectItemCaseSensitive(m.json, "shards");
    if (!cJSON_IsArray(shards) || cJSON_GetArraySize(shards) == 0) {
        r = err_set(err, -EINVAL, "Malformed manifest %s: shards must be a non-empty list", path);
        goto out;
    }
    exec = cJSON_GetObjectItemCaseSensitive(m.json, "execution");
    m.ray_address = json_get_str(exec, "ray_address");
    if (!cJSON_IsObject(exec) || !json_get_str(exec, "executor_type") ||
        strcmp(json_get_str(exec, "executor_type"), "ray") != 0 || !m.ray_address ||
        !*m.ray_address) {
        r = err_set(err, -EINVAL,
                    "Malformed manifest %s: execution must have executor_type \"ray\" and a "
                    "non-empty ray_address",
                    path);
        goto out;
    }
    m.execution = exec;
    m.job_id = json_get_str(m.json, "job_id");
    if (!manifest_job_id_ok(m.job_id ? m.job_id : fs_basename(job_dir))) {
        r = job_id_refused(path, m.job_id ? m.job_id : fs_basename(job_dir), err);
        goto out;
    }
    policy = cJSON_GetObjectItemCaseSensitive(m.json, "policy");
    if ((r = policy_int(policy, "lock_timeout_secs", POLICY_LOCK_TIMEOUT_DEFAULT, 1,
                        &m.lock_timeout_secs, path, err)) < 0 ||
        (r = policy_int(policy, "max_retries", POLICY_MAX_RETRIES_DEFAULT, 0, &m.max_retries,
                        path, err)) < 0 ||
        (r = policy_int(policy, "poll_interval_secs", POLICY_POLL_INTERVAL_DEFAULT, 1,
                        &m.poll_interval_secs, path, err)) < 0)
        goto out;
    m.nshards = (size_t)cJSON_GetArraySize(shards);
    m.shards = xcalloc(m.nshards, sizeof(*m.shards));
    cJSON_ArrayForEach(item, shards) {
        struct manifest_shard *s = &m.shards[i];
        if (!cJSON_IsObject(item) || !(s->id = json_get_str(item, "id")) ||
            !(s->path = json_get_str(item, "path")) || json_get_int(item, "rows", &s->rows) < 0) {
            r = err_set(err, -EINVAL,
                        "Malformed manifest %s: shards[%d] needs string id and path and integer rows",
                        path, i);
            goto out;
        }
        if (!path_ok(s->path)) {
            r = err_set(err, -EINVAL,
                        "Malformed manifest %s: shard path '%s' is not a relative path inside "
                        "the job directory",
                        path, s->path);
            goto out;
        }
        if (!manifest_id_ok(s->id)) {
            r = err_set(err, -EINVAL,
                        "Malformed manifest %s: shard id '%s' is not a plain file name", path,
                        s->id);
            goto out;
        }
        if (json_get_int(item, "index", &s->index) < 0)
            s->index = i;
        if (json_get_int(item, "size_bytes", &s->size_bytes) < 0)
            s->size_bytes = -1;
        s->sha256 = json_get_str(item, "sha256");
        m.total_rows += s->rows;
        i++;
    }
    /* The index for manifest_find, which also finds duplicate ids. */
    m.by_id = xcalloc(m.nshards, sizeof(*m.by_id));
    for (size_t k = 0; k < m.nshards; k++)
        m.by_id[k] = k;
    qsort_r(m.by_id, m.nshards, sizeof(*m.by_id), cmp_by_id, m.shards);
    for (size_t k = 1; k < m.nshards; k++)
        if (strcmp(m.shards[m.by_id[k - 1]].id, m.shards[m.by_id[k]].id) == 0) {
            r = err_set(err, -EINVAL, "Malformed manifest %s: duplicate shard id '%s'", path,
                        m.shards[m.by_id[k]].id);
            goto out;
        }
    m.job_dir = xstrdup(job_dir);
    /* Into our own copy: the caller's job_dir may not outlive m. */
    if (!m.job_id)
        m.job_id = fs_basename(m.job_dir);
    *ret = m;
    m.json = NULL;
    m.shards = NULL;
    m.by_id = NULL;
out:
    free(path);
    free(m.by_id);
    free(m.shards);
    cJSON_Delete(m.json);
    return r;
}

void
manifest_free(struct manifest *m)
{
    cJSON_Delete(m->json);
    free(m->shards);
    free(m->by_id);
    free(m->job_dir);
    memset(m, 0, sizeof(*m));
}

long
manifest_find(const struct manifest *m, const char *id)
{
    size_t lo = 0, hi = m->nshards;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(m->shards[m->by_id[mid]].id, id);

        if (c == 0)
            return (long)m->by_id[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

char *
manifest_state_path(const struct manifest *m, const char *kind, const char *id, const char *suffix)
{
    return xasprintf("%s/state/%s/%s%s", m->job_dir, kind, id, suffix);
}

int
manifest_list_state(const struct manifest *m, const char *kind, const char *suffix,
                    bool *present, struct esd_err *err)
{
    char *dir = xasprintf("%s/state/%s", m->job_dir, kind);
    size_t slen = strlen(suffix);
    struct dirent *e;
    DIR *d = opendir(dir);
    int r = 0;

    if (!d) {
        r = errno == ENOENT ? 0 : err_sys(err, -errno, "Cannot read %s", dir);
        free(dir);
        return r;
    }
    while ((errno = 0, e = readdir(d))) {
        size_t n = strlen(e->d_name);
        char *id;
        long k;

        if (e->d_name[0] == '.' || n <= slen || strcmp(e->d_name + n - slen, suffix) != 0)
            continue;
        id = xstrndup(e->d_name, n - slen);
        k = manifest_find(m, id);
        free(id);
        if (k >= 0)
            present[k] = true;
    }
    if (errno)
        r = err_sys(err, -errno, "Cannot read %s", dir);
    closedir(d);
    free(dir);
    return r;
}
