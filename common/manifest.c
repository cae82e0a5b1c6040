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
#include <sys/stat.h>

#include "fsutil.h"
#include "json.h"
#include "pypath.h"
#include "sha256.h"

/* A shard id becomes a file name in state/locks, done, failed, stale_locks
 * and attempts (spec §4), so it must be a plain name. No leading dot:
 * dot names are the temporaries in those directories, which every listing
 * skips (manifest_list_state). At most 200 bytes: the longest name built
 * from it, "<id>.<10-digit epoch>.<32 hex>.lock" in state/stale_locks
 * (spec §5.7), then stays within NAME_MAX (255). */
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

/* The job id is the job directory's name and goes into the processor's
 * argv (--job_id <job_id>_<shard>_<token>, spec §8.4): no '-' first, which
 * argparse would take for an option, no control characters, which would
 * reach logs and the journal. */
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
                    "malformed manifest %s: job_id '%s' is not allowed (a job id is 1 to 255 "
                    "bytes of UTF-8 without control characters or '/', not starting with '-')",
                    p, i);

    free(p);
    free(i);
    return r;
}

/* spec §6.5: the width is that of n, at least 5, so that the ids of one
 * job sort by strcmp in manifest order. */
char *
manifest_shard_id(long long i, long long n)
{
    int width = snprintf(NULL, 0, "%lld", n);

    if (width < 5)
        width = 5;
    return xasprintf("part-%0*lld-of-%0*lld", width, i, width, n);
}

/* Lexical part of the escape check: relative, no ".." component. Symlinks
 * are checked where a path is used (pypath_join_inside). */
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

    /* absent or null: the reference's default (spec §14), as its workers
     * would use for a manifest that lacks the policy */
    if (!v || cJSON_IsNull(v)) {
        *ret = def;
        return 0;
    }
    if (json_get_int(policy, key, &x) < 0 || x < min)
        return err_set(err, -EINVAL, "malformed manifest %s: policy.%s must be an integer >= %lld",
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

/*
 * The sizes of a manifest before it is parsed: one pass over the text that
 * counts the elements of the top-level "shards" and "input_files" lists
 * (strings and escapes skipped), so that a document far larger than what
 * that many entries can need is refused before a tree is built for it.
 */
static void
precount(const char *p, size_t n, size_t *ret_shards, size_t *ret_files)
{
    size_t depth = 0, *counting = NULL, key_at = 0, key_len = 0;
    bool in_str = false, esc = false, nonempty = false, want_key = false;

    *ret_shards = *ret_files = 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];

        if (in_str) {
            if (esc)
                esc = false;
            else if (c == '\\')
                esc = true;
            else if (c == '"') {
                in_str = false;
                if (want_key && depth == 1)
                    key_len = i - key_at;
            }
            continue;
        }
        switch (c) {
        case '"':
            in_str = true;
            if (depth == 1 && want_key)
                key_at = i + 1;
            if (depth == 2 && counting)
                nonempty = true;
            break;
        case '{':
        case '[':
            if (depth == 2 && counting)
                nonempty = true;
            if (depth == 1 && c == '[' && key_len) {
                if (key_len == 6 && !memcmp(p + key_at, "shards", 6))
                    counting = ret_shards;
                else if (key_len == 11 && !memcmp(p + key_at, "input_files", 11))
                    counting = ret_files;
                nonempty = false;
            }
            depth++;
            want_key = c == '{';
            break;
        case '}':
        case ']':
            if (depth == 2 && counting) {
                *counting += nonempty;
                counting = NULL;
            }
            if (depth)
                depth--;
            want_key = false;
            break;
        case ':':
            want_key = false;
            break;
        case ',':
            if (depth == 2 && counting)
                (*counting)++;
            if (depth == 1)
                want_key = true, key_len = 0;
            break;
        default:
            if (depth == 2 && counting && c != ' ' && c != '\t' && c != '\n' && c != '\r')
                nonempty = true;
            break;
        }
        if (depth == 1 && want_key && c == '{')
            key_len = 0;
    }
}

int
manifest_check_size(const char *text, size_t len, const char *path, struct esd_err *err)
{
    size_t shards, files, cap;

    precount(text, len, &shards, &files);
    if (shards > MANIFEST_MAX_SHARDS)
        return err_set(err, -EFBIG,
                       "malformed manifest %s: %zu shards, more than the %d esd "
                       "works",
                       path, shards, MANIFEST_MAX_SHARDS);
    if (files > MANIFEST_MAX_FILES)
        return err_set(err, -EFBIG,
                       "malformed manifest %s: %zu input files, more than the %d "
                       "esd reads",
                       path, files, MANIFEST_MAX_FILES);
    cap = MANIFEST_BASE_BYTES + MANIFEST_ENTRY_BYTES * (shards + files);
    if (len > cap)
        return err_set(err, -EFBIG,
                       "malformed manifest %s: %zu bytes for %zu shards and %zu "
                       "input files, more than the %zu such a manifest can need",
                       path, len, shards, files, cap);
    return 0;
}

/* A hex digest of at most 128 digits. */
static bool
hex_ok(const char *s)
{
    size_t n = strspn(s, "0123456789abcdefABCDEF");

    return n > 0 && n <= 128 && !s[n];
}

/* Bytes of s with its NUL, or 0 for NULL. */
static size_t
slen0(const char *s)
{
    return s ? strlen(s) + 1 : 0;
}

/* Copies s into the arena at *at; NULL stays NULL. */
static char *
put(char **at, const char *s)
{
    char *r;
    size_t n;

    if (!s)
        return NULL;
    n = strlen(s) + 1;
    r = memcpy(*at, s, n);
    *at += n;
    return r;
}

/* The parsed document doc into m (whose strings still point into doc):
 * every string m keeps is copied into one arena, so that doc can go. */
static void
keep_strings(struct manifest *m, const char *job_dir)
{
    size_t total;
    char *at;

    if (!m->job_id)
        m->job_id = fs_basename(job_dir);
    total = slen0(job_dir) + slen0(m->job_id) + slen0(m->ray_address) + slen0(m->execution_json) +
            slen0(m->recipe_sha256) + slen0(m->recipe_snapshot) + slen0(m->dj_commit) +
            slen0(m->recipe_whole_sha256) + slen0(m->global_snapshot) + slen0(m->global_sha256) +
            slen0(m->global_executor) + slen0(m->global_ops_json);

    for (size_t i = 0; i < m->nshards; i++)
        total += slen0(m->shards[i].id) + slen0(m->shards[i].path) + slen0(m->shards[i].sha256);
    m->arena = at = xmalloc(total ? total : 1);
    m->job_dir = put(&at, job_dir);
    m->job_id = put(&at, m->job_id);
    m->ray_address = put(&at, m->ray_address);
    m->execution_json = put(&at, m->execution_json);
    m->recipe_sha256 = put(&at, m->recipe_sha256);
    m->recipe_snapshot = put(&at, m->recipe_snapshot);
    m->dj_commit = put(&at, m->dj_commit);
    m->recipe_whole_sha256 = put(&at, m->recipe_whole_sha256);
    m->global_snapshot = put(&at, m->global_snapshot);
    m->global_sha256 = put(&at, m->global_sha256);
    m->global_executor = put(&at, m->global_executor);
    m->global_ops_json = put(&at, m->global_ops_json);
    for (size_t i = 0; i < m->nshards; i++) {
        m->shards[i].id = put(&at, m->shards[i].id);
        m->shards[i].path = put(&at, m->shards[i].path);
        m->shards[i].sha256 = put(&at, m->shards[i].sha256);
    }
}

/* recipe.global (the global stage of issue 17), when present: every key
 * checked; *ret_ops the operators' compact JSON (the caller frees). */
static int
check_global(const cJSON *recipe, const char *path, struct manifest *m, char **ret_ops,
             struct esd_err *err)
{
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(recipe, "global"), *ops, *x;
    const char *s;

    m->recipe_whole_sha256 = json_get_str(recipe, "whole_sha256");
    if (cJSON_GetObjectItemCaseSensitive(recipe, "whole_sha256") &&
        (!m->recipe_whole_sha256 || !hex_ok(m->recipe_whole_sha256)))
        return err_set(err, -EINVAL,
                       "malformed manifest %s: recipe.whole_sha256 is not a hex digest", path);
    if (!g)
        return 0;
    if (!cJSON_IsObject(g))
        return err_set(err, -EINVAL, "malformed manifest %s: recipe.global is not an object", path);
    s = json_get_str(g, "snapshot_path");
    if (!s || !path_ok(s) || strlen(s) > MANIFEST_PATH_MAX || !str_clean(s, strlen(s)))
        return err_set(err, -EINVAL,
                       "malformed manifest %s: recipe.global.snapshot_path is not a plain "
                       "relative path",
                       path);
    m->global_snapshot = s;
    if (!(m->global_sha256 = json_get_str(g, "sha256")) || !hex_ok(m->global_sha256))
        return err_set(err, -EINVAL,
                       "malformed manifest %s: recipe.global.sha256 is not a hex digest", path);
    s = json_get_str(g, "executor_type");
    if (!s || (strcmp(s, "default") != 0 && strcmp(s, "ray") != 0))
        return err_set(err, -EINVAL,
                       "malformed manifest %s: recipe.global.executor_type must be "
                       "\"default\" or \"ray\"",
                       path);
    m->global_executor = s;
    ops = cJSON_GetObjectItemCaseSensitive(g, "operators");
    if (!cJSON_IsArray(ops) || cJSON_GetArraySize(ops) == 0)
        return err_set(err, -EINVAL,
                       "malformed manifest %s: recipe.global.operators must be a non-empty "
                       "list of names",
                       path);
    cJSON_ArrayForEach(x, ops)
    {
        if (!cJSON_IsString(x) || !*x->valuestring || strlen(x->valuestring) > 256 ||
            !str_clean(x->valuestring, strlen(x->valuestring)))
            return err_set(err, -EINVAL,
                           "malformed manifest %s: recipe.global.operators must be a "
                           "non-empty list of names",
                           path);
    }
    if (json_get_int(g, "shard_operators", &m->global_shard_ops) < 0 || m->global_shard_ops < 0)
        return err_set(err, -EINVAL,
                       "malformed manifest %s: recipe.global.shard_operators is not a "
                       "non-negative integer",
                       path);
    *ret_ops = cJSON_PrintUnformatted(ops);
    m->global_ops_json = *ret_ops;
    return 0;
}

/* Everything manifest_parse checks, on the document doc. */
static int
check_doc(const cJSON *doc, const char *job_dir, const char *path, struct manifest *m,
          char **ret_exec, char **ret_ops, struct esd_err *err)
{
    const cJSON *shards, *exec, *policy, *item, *recipe, *dj;
    long long schema;
    int r, i = 0;

    /* spec §5.2's load-time checks first, in its order: a job the
     * reference refuses is refused here too. Schema 3 (spec §17) keeps the
     * lock as a terminal fence and would be misread as schema 2. */
    if (json_get_int(doc, "schema_version", &schema) < 0 || schema != MANIFEST_SCHEMA) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(doc, "schema_version");
        char *txt = v ? cJSON_PrintUnformatted(v) : NULL;

        r = err_set(err, -EINVAL,
                    "unsupported manifest schema_version %.40s in %s (expected "
                    "%d)",
                    txt ? txt : "(missing)", path, MANIFEST_SCHEMA);
        free(txt);
        return r;
    }
    shards = cJSON_GetObjectItemCaseSensitive(doc, "shards");
    if (!cJSON_IsArray(shards) || cJSON_GetArraySize(shards) == 0)
        return err_set(err, -EINVAL, "malformed manifest %s: shards must be a non-empty list",
                       path);
    if (cJSON_GetArraySize(shards) > MANIFEST_MAX_SHARDS)
        return err_set(err, -EFBIG, "malformed manifest %s: more than %d shards", path,
                       MANIFEST_MAX_SHARDS);
    exec = cJSON_GetObjectItemCaseSensitive(doc, "execution");
    m->ray_address = json_get_str(exec, "ray_address");
    if (!cJSON_IsObject(exec) || !json_get_str(exec, "executor_type") ||
        strcmp(json_get_str(exec, "executor_type"), "ray") != 0 || !m->ray_address ||
        !*m->ray_address)
        return err_set(err, -EINVAL,
                       "malformed manifest %s: execution must have executor_type "
                       "\"ray\" and a non-empty ray_address",
                       path);
    m->job_id = json_get_str(doc, "job_id");
    if (!manifest_job_id_ok(m->job_id ? m->job_id : fs_basename(job_dir)))
        return job_id_refused(path, m->job_id ? m->job_id : fs_basename(job_dir), err);
    recipe = cJSON_GetObjectItemCaseSensitive(doc, "recipe");
    m->recipe_sha256 = json_get_str(recipe, "sha256");
    m->recipe_snapshot = json_get_str(recipe, "snapshot_path");
    if ((r = check_global(recipe, path, m, ret_ops, err)) < 0)
        return r;
    dj = cJSON_GetObjectItemCaseSensitive(doc, "data_juicer");
    m->dj_commit = json_get_str(dj, "commit");
    policy = cJSON_GetObjectItemCaseSensitive(doc, "policy");
    if ((r = policy_int(policy, "lock_timeout_secs", POLICY_LOCK_TIMEOUT_DEFAULT, 1,
                        &m->lock_timeout_secs, path, err)) < 0 ||
        (r = policy_int(policy, "max_retries", POLICY_MAX_RETRIES_DEFAULT, 0, &m->max_retries, path,
                        err)) < 0 ||
        (r = policy_int(policy, "poll_interval_secs", POLICY_POLL_INTERVAL_DEFAULT, 1,
                        &m->poll_interval_secs, path, err)) < 0)
        return r;
    m->nshards = (size_t)cJSON_GetArraySize(shards);
    m->shards = xcalloc(m->nshards, sizeof(*m->shards));
    cJSON_ArrayForEach(item, shards)
    {
        struct manifest_shard *s = &m->shards[i];

        if (!cJSON_IsObject(item) || !(s->id = json_get_str(item, "id")) ||
            !(s->path = json_get_str(item, "path")) || json_get_int(item, "rows", &s->rows) < 0)
            return err_set(err, -EINVAL,
                           "malformed manifest %s: shards[%d] needs string id and "
                           "path and integer rows",
                           path, i);
        if (!path_ok(s->path) || strlen(s->path) > MANIFEST_PATH_MAX ||
            !str_clean(s->path, strlen(s->path)))
            return err_set(err, -EINVAL,
                           "malformed manifest %s: shard path '%.200s' is not a "
                           "relative path inside the job directory",
                           path, s->path);
        if (!manifest_id_ok(s->id))
            return err_set(err, -EINVAL,
                           "malformed manifest %s: shard id '%.200s' is not a "
                           "plain file name",
                           path, s->id);
        if (json_get_int(item, "index", &s->index) < 0)
            s->index = i;
        if (json_get_int(item, "size_bytes", &s->size_bytes) < 0)
            s->size_bytes = -1;
        s->sha256 = json_get_str(item, "sha256");
        if (s->sha256 && !hex_ok(s->sha256))
            s->sha256 = NULL;
        m->total_rows += s->rows;
        i++;
    }
    if (strlen(m->ray_address) > MANIFEST_PATH_MAX ||
        !str_clean(m->ray_address, strlen(m->ray_address)))
        return err_set(err, -EINVAL,
                       "malformed manifest %s: ray_address is too long or holds "
                       "control characters",
                       path);
    /* what esd does not rely on is dropped when it is not plain */
    if (m->recipe_sha256 && !hex_ok(m->recipe_sha256))
        return err_set(err, -EINVAL, "malformed manifest %s: recipe.sha256 is not a hex digest",
                       path);
    if (m->recipe_snapshot && (strlen(m->recipe_snapshot) > MANIFEST_PATH_MAX ||
                               !str_clean(m->recipe_snapshot, strlen(m->recipe_snapshot))))
        return err_set(err, -EINVAL,
                       "malformed manifest %s: recipe.snapshot_path is not a "
                       "plain path",
                       path);
    /* A commit that is not plain text pins nothing: "unknown" is what the
     * reference writes when it cannot tell, and the version check is then
     * skipped (spec §8.1), as for any job that records no version. */
    if (m->dj_commit &&
        (strlen(m->dj_commit) > 256 || !str_clean(m->dj_commit, strlen(m->dj_commit))))
        m->dj_commit = "unknown";
    *ret_exec = cJSON_PrintUnformatted(exec);
    m->execution_json = *ret_exec;
    return 0;
}

/* The index for manifest_find, which also finds duplicate ids: two shards
 * of one id would share one lock and one done record, so one's result
 * would be taken for the other's. */
static int
index_ids(struct manifest *m, const char *path, struct esd_err *err)
{
    m->by_id = xcalloc(m->nshards, sizeof(*m->by_id));
    for (size_t k = 0; k < m->nshards; k++)
        m->by_id[k] = k;
    qsort_r(m->by_id, m->nshards, sizeof(*m->by_id), cmp_by_id, m->shards);
    for (size_t k = 1; k < m->nshards; k++)
        if (strcmp(m->shards[m->by_id[k - 1]].id, m->shards[m->by_id[k]].id) == 0)
            return err_set(err, -EINVAL, "malformed manifest %s: duplicate shard id '%s'", path,
                           m->shards[m->by_id[k]].id);
    return 0;
}

int
manifest_parse(const char *text, size_t len, const char *job_dir, const char *path, cJSON **ret_doc,
               struct manifest *ret, struct esd_err *err)
{
    struct manifest m = { 0 };
    cJSON *doc = NULL;
    char *exec = NULL, *ops = NULL;
    int r;

    if ((r = manifest_check_size(text, len, path, err)) < 0 ||
        (r = json_parse_object(text, len, path, &doc, err)) < 0 ||
        (r = check_doc(doc, job_dir, path, &m, &exec, &ops, err)) < 0)
        goto out;
    if ((r = index_ids(&m, path, err)) < 0)
        goto out;
    keep_strings(&m, job_dir);
    *ret = m;
    memset(&m, 0, sizeof(m));
    if (ret_doc) {
        *ret_doc = doc;
        doc = NULL;
    }
out:
    free(m.by_id);
    free(m.shards);
    free(exec);
    free(ops);
    cJSON_Delete(doc);
    return r;
}

bool
manifest_dir_explain(const char *job_dir, int r, struct esd_err *err)
{
    struct stat st;

    if (r != -ENOENT && r != -ENOTDIR && r != -EACCES && r != -EPERM)
        return false;
    if (stat(job_dir, &st) < 0) {
        if (errno == ENOENT)
            err_set(err, -ENOENT, "%s: no such directory", job_dir);
        else if (errno == ENOTDIR) /* a component of the path */
            err_set(err, -ENOTDIR, "%s: not a directory", job_dir);
        else
            err_sys(err, -errno, "%s: cannot read the directory", job_dir);
        return true;
    }
    if (!S_ISDIR(st.st_mode)) {
        err_set(err, -ENOTDIR, "%s: not a directory", job_dir);
        return true;
    }
    if (r == -EACCES || r == -EPERM) {
        char *path = fs_join(job_dir, "manifest.json");
        bool found = stat(path, &st) == 0;

        free(path);
        if (found) /* the manifest itself is unreadable: the caller says so */
            return false;
        err_sys(err, r, "%s: cannot read the directory", job_dir);
        return true;
    }
    if (r == -ENOENT) {
        err_set(err, -ENOENT,
                "%s: not a job directory (no manifest.json): prepare it first, or "
                "check the path",
                job_dir);
        return true;
    }
    return false;
}

/* manifest_load, keeping the document in *ret_doc when not NULL. */
static int
load(const char *job_dir, struct manifest *ret, cJSON **ret_doc, struct esd_err *err)
{
    char *path = fs_join(job_dir, "manifest.json"), *text = NULL;
    size_t len = 0;
    int r;

    r = fs_read_job(path, MANIFEST_MAX_BYTES, &text, &len, NULL);
    if (r < 0 && manifest_dir_explain(job_dir, r, err))
        ; /* said */
    else if (r == -ELOOP)
        err_set(err, r, "Unable to read JSON file %s: a symbolic link, not followed", path);
    else if (r == -EFBIG)
        err_set(err, r, "Unable to read JSON file %s: larger than %zu bytes", path,
                (size_t)MANIFEST_MAX_BYTES);
    else if (r == -EINVAL)
        err_set(err, r, "Unable to read JSON file %s: not a regular file", path);
    else if (r < 0)
        err_sys(err, r, "Unable to read JSON file %s", path);
    else
        r = manifest_parse(text, len, job_dir, path, ret_doc, ret, err);
    free(text);
    free(path);
    return r;
}

int
manifest_load(const char *job_dir, struct manifest *ret, struct esd_err *err)
{
    return load(job_dir, ret, NULL, err);
}

int
manifest_load_doc(const char *job_dir, struct manifest *ret, cJSON **ret_doc, struct esd_err *err)
{
    return load(job_dir, ret, ret_doc, err);
}

/* ---- the compact form: one line a field set, tab-separated ----
 *
 * What a loading helper sends esd (jobs.c): a manifest of 100,000 shards is
 * tens of megabytes of JSON; esd reads these lines as they arrive, into one
 * arena, instead of parsing the owner's JSON into a tree itself. */

/* A string field: "=" and the value, or "" for none. The values are free
 * of control characters (check_doc saw to it), so no tab or newline. */
static void
put_field(struct buf *out, const char *v)
{
    buf_putc(out, '\t');
    if (v) {
        buf_putc(out, '=');
        buf_puts(out, v);
    }
}

void
manifest_compact(const struct manifest *m, struct buf *out)
{
    buf_printf(out, "H\t%zu\t%lld\t%lld\t%lld", m->nshards, m->lock_timeout_secs, m->max_retries,
               m->poll_interval_secs);
    put_field(out, m->job_id);
    put_field(out, m->ray_address);
    put_field(out, m->execution_json);
    put_field(out, m->recipe_sha256);
    put_field(out, m->recipe_snapshot);
    put_field(out, m->dj_commit);
    put_field(out, m->recipe_whole_sha256);
    put_field(out, m->global_snapshot);
    put_field(out, m->global_sha256);
    put_field(out, m->global_executor);
    put_field(out, m->global_ops_json);
    buf_printf(out, "\t%lld", m->global_shard_ops);
    buf_putc(out, '\n');
    for (size_t i = 0; i < m->nshards; i++) {
        const struct manifest_shard *s = &m->shards[i];

        buf_printf(out, "S\t%lld\t%lld\t%lld", s->index, s->rows, s->size_bytes);
        put_field(out, s->id);
        put_field(out, s->path);
        /* (no digest: the daemon checks none; whoever verifies a shard
         * loads the manifest itself) */
        put_field(out, NULL);
        buf_putc(out, '\n');
    }
}

/* The fields of one line (tabs made NULs in place): at most max. */
static size_t
split_fields(char *line, char **f, size_t max)
{
    size_t n = 0;

    for (char *p = line; n < max;) {
        f[n++] = p;
        if (!(p = strchr(p, '\t')))
            break;
        *p++ = '\0';
    }
    return n;
}

/* A string field into the arena: its offset, or (size_t)-1 for none. */
static int
take_field(struct manifest_reader *rd, const char *f, size_t *ret_off)
{
    if (!*f) {
        *ret_off = (size_t)-1;
        return 0;
    }
    if (*f != '=')
        return -EINVAL;
    *ret_off = rd->arena.len;
    buf_append(&rd->arena, f + 1, strlen(f + 1) + 1);
    return 0;
}

static int
take_num(const char *f, long long *ret)
{
    char *end;

    errno = 0;
    *ret = strtoll(f, &end, 10);
    return errno || end == f || *end ? -EINVAL : 0;
}

void
manifest_reader_init(struct manifest_reader *rd)
{
    memset(rd, 0, sizeof(*rd));
    buf_init(&rd->arena);
    buf_init(&rd->part);
}

void
manifest_reader_free(struct manifest_reader *rd)
{
    buf_free(&rd->arena);
    buf_free(&rd->part);
    free(rd->shards);
    free(rd->offs);
    memset(rd, 0, sizeof(*rd));
}

/* One complete line. */
static int
reader_line(struct manifest_reader *rd, char *line, struct esd_err *err)
{
    char *f[20];
    size_t n = split_fields(line, f, 20);
    long long v[4];

    if (line[0] == 'H' && n == 17 && !rd->header) {
        for (int i = 0; i < 4; i++)
            if (take_num(f[1 + i], &v[i]) < 0)
                goto bad;
        if (v[0] < 1 || v[0] > MANIFEST_MAX_SHARDS)
            goto bad;
        rd->nshards = (size_t)v[0];
        rd->lock_timeout = v[1];
        rd->max_retries = v[2];
        rd->poll = v[3];
        for (int i = 0; i < 11; i++)
            if (take_field(rd, f[5 + i], &rd->hoff[i]) < 0)
                goto bad;
        if (take_num(f[16], &rd->global_shard_ops) < 0)
            goto bad;
        rd->shards = xcalloc(rd->nshards, sizeof(*rd->shards));
        rd->offs = xcalloc(rd->nshards * 3, sizeof(*rd->offs));
        rd->header = true;
        return 0;
    }
    if (line[0] == 'S' && n == 7 && rd->header && rd->got < rd->nshards) {
        struct manifest_shard *s = &rd->shards[rd->got];
        size_t *o = &rd->offs[rd->got * 3];

        if (take_num(f[1], &s->index) < 0 || take_num(f[2], &s->rows) < 0 ||
            take_num(f[3], &s->size_bytes) < 0 || take_field(rd, f[4], &o[0]) < 0 ||
            take_field(rd, f[5], &o[1]) < 0 || take_field(rd, f[6], &o[2]) < 0 ||
            o[0] == (size_t)-1 || o[1] == (size_t)-1)
            goto bad;
        rd->got++;
        return 0;
    }
bad:
    return err_set(err, -EINVAL, "malformed compact manifest at line %zu", rd->lines);
}

int
manifest_reader_feed(struct manifest_reader *rd, const char *p, size_t n, struct esd_err *err)
{
    buf_append(&rd->part, p, n);
    for (;;) {
        char *nl = rd->part.len ? memchr(rd->part.p, '\n', rd->part.len) : NULL;
        size_t len;
        int r;

        if (!nl)
            break;
        len = (size_t)(nl - rd->part.p);
        *nl = '\0';
        rd->lines++;
        r = len ? reader_line(rd, rd->part.p, err) : 0;
        memmove(rd->part.p, nl + 1, rd->part.len - len - 1);
        rd->part.len -= len + 1;
        if (r < 0)
            return r;
    }
    /* a line holds a few bounded fields: a partial line longer than they
     * can make is refused before it grows without bound */
    if (rd->part.len > (size_t)MANIFEST_PATH_MAX * 4)
        return err_set(err, -EINVAL, "malformed compact manifest: a line longer than %d bytes",
                       MANIFEST_PATH_MAX * 4);
    return 0;
}

/* The arena string at offset o, NULL for none. */
static const char *
at(const struct manifest_reader *rd, size_t o)
{
    return o == (size_t)-1 ? NULL : rd->arena.p + o;
}

int
manifest_reader_finish(struct manifest_reader *rd, const char *job_dir, struct manifest *ret,
                       struct esd_err *err)
{
    struct manifest m = { 0 };
    size_t jd, len;
    char *arena;
    int r = 0;

    if (!rd->header || rd->got != rd->nshards || rd->part.len)
        return err_set(err, -EINVAL, "malformed compact manifest: %zu of %zu shards", rd->got,
                       rd->nshards);
    m.nshards = rd->nshards;
    m.shards = rd->shards;
    rd->shards = NULL;
    m.job_id = at(rd, rd->hoff[0]);
    m.ray_address = at(rd, rd->hoff[1]);
    m.lock_timeout_secs = rd->lock_timeout;
    m.max_retries = rd->max_retries;
    m.poll_interval_secs = rd->poll;
    /* Checked again although the helper checked them: it runs as the job's
     * owner, who can tamper with their own processes, and esd builds file
     * names from these. */
    for (size_t i = 0; i < m.nshards; i++) {
        struct manifest_shard *s = &m.shards[i];

        if (!manifest_id_ok(at(rd, rd->offs[i * 3])) || !path_ok(at(rd, rd->offs[i * 3 + 1])))
            r = err_set(err, -EINVAL, "malformed compact manifest: shard %zu", i);
        m.total_rows += s->rows;
    }
    if (r == 0 && (!m.ray_address || !*m.ray_address || m.lock_timeout_secs < 1 ||
                   m.max_retries < 0 || m.poll_interval_secs < 1 ||
                   !manifest_job_id_ok(m.job_id ? m.job_id : fs_basename(job_dir)) ||
                   (at(rd, rd->hoff[7]) && !path_ok(at(rd, rd->hoff[7])))))
        r = err_set(err, -EINVAL, "malformed compact manifest: its header");
    if (r < 0) {
        free(m.shards);
        return r;
    }
    /* The reader's arena becomes the manifest's, cut to its size, with the
     * job directory appended: a daemon that loads a 100,000-shard job
     * never holds two copies of its strings. */
    jd = rd->arena.len;
    buf_append(&rd->arena, job_dir, strlen(job_dir) + 1);
    len = rd->arena.len;
    arena = xrealloc(buf_steal(&rd->arena), len);
#define AT(o) ((o) == (size_t)-1 ? NULL : arena + (o))
    m.arena = arena;
    m.job_dir = arena + jd;
    m.job_id = rd->hoff[0] == (size_t)-1 ? fs_basename(m.job_dir) : AT(rd->hoff[0]);
    m.ray_address = AT(rd->hoff[1]);
    m.execution_json = AT(rd->hoff[2]);
    m.recipe_sha256 = AT(rd->hoff[3]);
    m.recipe_snapshot = AT(rd->hoff[4]);
    m.dj_commit = AT(rd->hoff[5]);
    m.recipe_whole_sha256 = AT(rd->hoff[6]);
    m.global_snapshot = AT(rd->hoff[7]);
    m.global_sha256 = AT(rd->hoff[8]);
    m.global_executor = AT(rd->hoff[9]);
    m.global_ops_json = AT(rd->hoff[10]);
    m.global_shard_ops = rd->global_shard_ops;
    for (size_t i = 0; i < m.nshards; i++) {
        m.shards[i].id = AT(rd->offs[i * 3]);
        m.shards[i].path = AT(rd->offs[i * 3 + 1]);
        m.shards[i].sha256 = AT(rd->offs[i * 3 + 2]);
    }
#undef AT
    /* the offsets are no longer needed: freed before the index is built */
    free(rd->offs);
    rd->offs = NULL;
    if ((r = index_ids(&m, "the compact manifest", err)) < 0) {
        free(m.shards);
        free(m.by_id);
        free(m.arena);
        return r;
    }
    *ret = m;
    return 0;
}

void
manifest_free(struct manifest *m)
{
    free(m->shards);
    free(m->by_id);
    free(m->arena);
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
manifest_list_state(const struct manifest *m, const char *kind, const char *suffix, bool *present,
                    struct esd_err *err)
{
    char *dir = xasprintf("%s/state/%s", m->job_dir, kind);
    size_t slen = strlen(suffix);
    struct dirent *e;
    DIR *d = opendir(dir);
    int r = 0;

    if (!d) {
        r = errno == ENOENT ? 0 : err_sys(err, -errno, "cannot read %s", dir);
        free(dir);
        return r;
    }
    while ((errno = 0, e = readdir(d))) {
        size_t n = strlen(e->d_name);
        char *id;
        long k;

        /* dot names are temporaries (".<name>.<hex>.tmp", spec §4): a
         * record is there only once it has its own name */
        if (e->d_name[0] == '.' || n <= slen || strcmp(e->d_name + n - slen, suffix) != 0)
            continue;
        id = xstrndup(e->d_name, n - slen);
        k = manifest_find(m, id);
        free(id);
        if (k >= 0)
            present[k] = true;
    }
    if (errno)
        r = err_sys(err, -errno, "cannot read %s", dir);
    closedir(d);
    free(dir);
    return r;
}

/* 64 bits of the path's SHA-256: a fixed-length, file-name-safe key for
 * the registry, the spool and the claim records, the same on every node
 * for the same path. */
void
manifest_dir_key(const char *job_dir, char ret_key[17])
{
    char hex[SHA256_HEX_LEN + 1];

    sha256_buf(job_dir, strlen(job_dir), hex);
    memcpy(ret_key, hex, 16);
    ret_key[16] = '\0';
}

char *
manifest_log_id(const char *job_dir)
{
    char key[17];

    manifest_dir_key(job_dir, key);
    return xasprintf("%s@%.8s", fs_basename(job_dir), key);
}
