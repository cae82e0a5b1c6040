/*
 * status: shard states from directory listings of state/done, state/failed
 * and state/locks, so a status pass costs three readdirs plus one stat per
 * lock instead of several syscalls per shard.
 */
#include "status.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "fsutil.h"
#include "json.h"

const char *const status_state_name[ST__COUNT] = {
    "pending", "running", "stale", "done", "failed",
};

/* A copy of obj[key], or JSON null when it is missing. */
static cJSON *
value_or_null(const cJSON *obj, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);

    return v ? cJSON_Duplicate(v, true) : cJSON_CreateNull();
}

/* Reads a done or failed record, or a lock: owner (and pid, error). */
static cJSON *
read_record(const char *path, struct shard_status *s, bool want_error)
{
    cJSON *j = NULL;
    const char *h;

    if (json_load_object(path, 1 << 20, &j, NULL) < 0) {
        s->metadata_error = true;
        return NULL;
    }
    if ((h = json_get_str(j, "hostname")))
        s->owner = xstrdup(h);
    if ((h = json_get_str(j, "node")))
        s->node = xstrdup(h);
    if (want_error && (h = json_get_str(j, "last_error")))
        s->error = xstrdup(h);
    else if (!want_error)
        s->owner_value = value_or_null(j, "hostname");
    return j;
}

int
status_compute(const struct manifest *m, long long lock_timeout, bool details,
               struct job_status *ret, struct esd_err *err)
{
    struct job_status st = { 0 };
    bool *done = xcalloc(m->nshards, sizeof(bool));
    bool *failed = xcalloc(m->nshards, sizeof(bool));
    bool *locked = xcalloc(m->nshards, sizeof(bool));
    struct timespec now;
    int r;

    if (lock_timeout <= 0)
        lock_timeout = m->lock_timeout_secs;
    if ((r = manifest_list_state(m, "done", ".json", done, err)) < 0 ||
        (r = manifest_list_state(m, "failed", ".json", failed, err)) < 0 ||
        (r = manifest_list_state(m, "locks", ".lock", locked, err)) < 0)
        goto out;
    clock_gettime(CLOCK_REALTIME, &now);
    st.total = m->nshards;
    st.shards = xcalloc(m->nshards, sizeof(*st.shards));
    for (size_t i = 0; i < m->nshards; i++) {
        struct shard_status *s = &st.shards[i];
        const char *id = m->shards[i].id;
        char *path;

        if (done[i]) {
            s->state = ST_DONE;
            if (details) {
                path = manifest_state_path(m, "done", id, ".json");
                cJSON_Delete(read_record(path, s, false));
                free(path);
            }
        } else if (failed[i]) {
            s->state = ST_FAILED;
            if (details) {
                path = manifest_state_path(m, "failed", id, ".json");
                cJSON_Delete(read_record(path, s, true));
                free(path);
            }
        } else if (locked[i]) {
            struct stat sb;
            long long timeout = lock_timeout;
            cJSON *lock = NULL;
            long long v;

            path = manifest_state_path(m, "locks", id, ".lock");
            if (stat(path, &sb) < 0) {
                /* released between the listing and now */
                s->state = ST_PENDING;
                free(path);
                continue;
            }
            s->lock_age = (double)(now.tv_sec - sb.st_mtim.tv_sec) +
                          (double)(now.tv_nsec - sb.st_mtim.tv_nsec) / 1e9;
            if (s->lock_age < 0)
                s->lock_age = 0;
            s->has_age = true;
            if ((lock = read_record(path, s, false))) {
                s->pid_value = value_or_null(lock, "pid");
                if (json_get_int(lock, "pid", &s->pid) == 0)
                    s->has_pid = true;
                if (json_get_int(lock, "lease_secs", &v) == 0 && v > 0)
                    timeout = v;
            }
            cJSON_Delete(lock);
            free(path);
            s->state = s->lock_age > (double)timeout ? ST_STALE : ST_RUNNING;
        } else {
            s->state = ST_PENDING;
        }
    }
    for (size_t i = 0; i < m->nshards; i++)
        st.counts[st.shards[i].state]++;
    st.complete = st.counts[ST_DONE] == st.total;
    st.terminal = st.counts[ST_DONE] + st.counts[ST_FAILED] == st.total;
    *ret = st;
    st.shards = NULL;
out:
    free(done);
    free(failed);
    free(locked);
    return r;
}

void
status_free(struct job_status *st)
{
    for (size_t i = 0; st->shards && i < st->total; i++) {
        free(st->shards[i].owner);
        free(st->shards[i].node);
        free(st->shards[i].error);
        cJSON_Delete(st->shards[i].owner_value);
        cJSON_Delete(st->shards[i].pid_value);
    }
    free(st->shards);
    memset(st, 0, sizeof(*st));
}

/* The finalize election's word on the merge, as "merge": {"status":
 * complete, failed or merging, "node", "error", "rows"}; nothing while no
 * node has been elected (esd's daemons; a job merged with esctl merge has
 * merge.json instead). */
static void
merge_state(const struct manifest *m, cJSON *o)
{
    char *result = xasprintf("%s/state/esd/finalize.json", m->job_dir);
    char *lock = xasprintf("%s/state/esd/finalize.lock", m->job_dir);
    cJSON *rec = NULL, *x;
    long long rows;

    if (json_load_object(result, 1 << 20, &rec, NULL) == 0) {
        x = cJSON_AddObjectToObject(o, "merge");
        json_add_str(x, "status", json_get_str(rec, "status") ? json_get_str(rec, "status")
                                                             : "unknown");
        if (json_get_str(rec, "node"))
            json_add_str(x, "node", json_get_str(rec, "node"));
        if (json_get_str(rec, "error"))
            json_add_str(x, "error", json_get_str(rec, "error"));
        if (json_get_int(rec, "rows", &rows) == 0)
            json_add_int(x, "rows", rows);
    } else if (json_load_object(lock, 1 << 16, &rec, NULL) == 0) {
        x = cJSON_AddObjectToObject(o, "merge");
        json_add_str(x, "status", "merging");
        if (json_get_str(rec, "node"))
            json_add_str(x, "node", json_get_str(rec, "node"));
    }
    cJSON_Delete(rec);
    free(result);
    free(lock);
}

cJSON *
status_json(const struct manifest *m, const struct job_status *st)
{
    cJSON *o = cJSON_CreateObject(), *counts, *shards;

    json_add_str(o, "job_id", m->job_id);
    json_add_str(o, "job_dir", m->job_dir);
    cJSON_AddItemToObject(o, "execution", m->execution_json ? cJSON_Parse(m->execution_json)
                                                            : cJSON_CreateObject());
    json_add_int(o, "total", (long long)st->total);
    counts = cJSON_AddObjectToObject(o, "counts");
    for (int k = 0; k < ST__COUNT; k++)
        json_add_int(counts, status_state_name[k], (long long)st->counts[k]);
    json_add_bool(o, "complete", st->complete);
    json_add_bool(o, "terminal", st->terminal);
    merge_state(m, o);
    shards = cJSON_AddArrayToObject(o, "shards");
    for (size_t i = 0; i < st->total; i++) {
        const struct shard_status *s = &st->shards[i];
        cJSON *x = cJSON_CreateObject();

        json_add_str(x, "shard_id", m->shards[i].id);
        json_add_int(x, "rows", m->shards[i].rows);
        json_add_str(x, "status", status_state_name[s->state]);
        if (s->owner_value)
            cJSON_AddItemToObject(x, "owner", cJSON_Duplicate(s->owner_value, true));
        if (s->pid_value)
            cJSON_AddItemToObject(x, "pid", cJSON_Duplicate(s->pid_value, true));
        if (s->node)
            json_add_str(x, "node", s->node);
        if (s->has_age)
            json_add_float(x, "lock_age_secs", s->lock_age);
        if (s->state == ST_FAILED) {
            if (s->error)
                json_add_str(x, "error", s->error);
            else
                cJSON_AddNullToObject(x, "error");
        }
        if (s->metadata_error)
            json_add_bool(x, "metadata_error", true);
        cJSON_AddItemToArray(shards, x);
    }
    return o;
}

void
status_counts_text(const struct job_status *st, struct buf *out)
{
    for (int k = 0; k < ST__COUNT; k++)
        buf_printf(out, "%s%s=%zu", k ? " " : "", status_state_name[k], st->counts[k]);
}
