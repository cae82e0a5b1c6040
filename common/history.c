/*
 * history: the attempts of a shard as its attempt.json files record them
 * (history.h). The directory is hostile input like every part of a job
 * directory: links are not followed, only well-formed attempt names are
 * read, the number of entries looked at and the size of each file are
 * bounded.
 */
#include "history.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attempt.h"
#include "fsutil.h"
#include "json.h"
#include "status.h"
#include "tries.h"

/* Entries of an attempts directory looked at, as tries_count. */
#define HISTORY_SCAN_MAX 8192
#define HISTORY_FILE_MAX (1 << 20)

static char *
dup_str(const cJSON *j, const char *key)
{
    const char *s = json_get_str(j, key);

    return s ? xstrdup(s) : NULL;
}

static double
epoch_of(const cJSON *j, const char *epoch_key, const char *iso_key)
{
    double v;

    if (epoch_key && json_get_num(j, epoch_key, &v) == 0 && v > 0)
        return v;
    v = iso_key ? status_parse_time(json_get_str(j, iso_key)) : -1;
    return v > 0 ? v : 0;
}

/* Fills a from attempt.json j (NULL: unreadable). */
static void
attempt_from(struct history_attempt *a, const cJSON *j)
{
    const cJSON *res;
    long long rows;
    double d;

    a->elapsed = -1;
    a->rows = -1;
    if (!j)
        return;
    a->node = dup_str(j, "node");
    if (!a->node)
        a->node = dup_str(j, "hostname");
    a->status = dup_str(j, "status");
    a->fclass = dup_str(j, "failure_class");
    a->error = dup_str(j, "error");
    a->start = epoch_of(j, "started_at_epoch", NULL);
    if (a->start == 0)
        a->start = epoch_of(j, "claimed_at_epoch", "claimed_at");
    a->end = epoch_of(j, NULL, "finished_at");
    if (a->end == 0)
        a->end = epoch_of(j, NULL, "stale_at");
    if (json_get_num(j, "duration_secs", &d) == 0 && d >= 0 && d < 1e9)
        a->elapsed = d;
    else if (a->start > 0 && a->end >= a->start)
        a->elapsed = a->end - a->start;
    res = cJSON_GetObjectItemCaseSensitive(j, "result");
    if (cJSON_IsObject(res) && json_get_int(res, "rows", &rows) == 0 && rows >= 0)
        a->rows = rows;
}

static int
cmp_number(const void *x, const void *y)
{
    const struct history_attempt *a = x, *b = y;

    return a->number < b->number ? -1 : a->number > b->number;
}

static void
attempt_free(struct history_attempt *a)
{
    free(a->dir);
    free(a->node);
    free(a->status);
    free(a->fclass);
    free(a->error);
}

int
history_read(const struct manifest *m, const char *shard_id, struct history_shard *ret,
             struct esd_err *err)
{
    char *rel = xasprintf("attempts/%s", shard_id);
    size_t cap = 0, entries = 0;
    struct dirent *e;
    int jobfd, fd, r = 0;
    DIR *d;

    memset(ret, 0, sizeof(*ret));
    if (!*shard_id || strchr(shard_id, '/') || !strcmp(shard_id, ".") || !strcmp(shard_id, "..")) {
        free(rel);
        return err_set(err, -EINVAL, "not a shard id: %s", shard_id);
    }
    jobfd = open(m->job_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (jobfd < 0) {
        r = err_sys(err, -errno, "cannot open %s", m->job_dir);
        free(rel);
        return r;
    }
    fd = fs_open_dir_beneath(jobfd, rel, NULL, err);
    close(jobfd);
    if (fd < 0) {
        r = fd == -ENOENT ? (err_clear(err), 0) : fd;
        free(rel);
        return r;
    }
    if (!(d = fdopendir(fd))) {
        r = err_sys(err, -errno, "cannot read %s/%s", m->job_dir, rel);
        close(fd);
        free(rel);
        return r;
    }
    while ((e = readdir(d)) && ++entries <= HISTORY_SCAN_MAX) {
        long long num = tries_name_number(e->d_name);
        struct history_attempt *a;
        char *file;
        cJSON *j = NULL;
        char *text;
        size_t len;

        if (num < 0 || (e->d_type != DT_DIR && e->d_type != DT_UNKNOWN))
            continue;
        if (ret->n == cap) {
            cap = cap ? 2 * cap : 4;
            ret->v = xrealloc(ret->v, cap * sizeof(*ret->v));
        }
        a = &ret->v[ret->n++];
        memset(a, 0, sizeof(*a));
        a->number = num;
        a->dir = xasprintf("%s/%s", rel, e->d_name);
        file = xasprintf("%s/attempt.json", e->d_name);
        if (fs_read_job_at(dirfd(d), file, NULL, HISTORY_FILE_MAX, &text, &len, NULL) == 0) {
            if (json_parse_object(text, len, file, &j, NULL) < 0)
                j = NULL;
            free(text);
        }
        free(file);
        attempt_from(a, j);
        cJSON_Delete(j);
    }
    closedir(d);
    free(rel);
    qsort(ret->v, ret->n, sizeof(*ret->v), cmp_number);
    if (ret->n > HISTORY_MAX_ATTEMPTS) {
        size_t drop = ret->n - HISTORY_MAX_ATTEMPTS;

        for (size_t i = 0; i < drop; i++)
            attempt_free(&ret->v[i]);
        memmove(ret->v, ret->v + drop, HISTORY_MAX_ATTEMPTS * sizeof(*ret->v));
        ret->n = HISTORY_MAX_ATTEMPTS;
        ret->omitted = drop;
    }
    return 0;
}

void
history_shard_free(struct history_shard *h)
{
    for (size_t i = 0; i < h->n; i++)
        attempt_free(&h->v[i]);
    free(h->v);
    memset(h, 0, sizeof(*h));
}

const struct history_attempt *
history_find(const struct history_shard *h, long long number)
{
    for (size_t i = h->n; i-- > 0;)
        if (h->v[i].number == number)
            return &h->v[i];
    return NULL;
}

const char *
history_outcome(const struct history_attempt *a)
{
    if (!a->status)
        return "unreadable";
    if (!strcmp(a->status, "stale") || !strcmp(a->status, "lost"))
        return "taken over";
    if (!strcmp(a->status, ATTEMPT_STATUS_INFRA))
        return "failed";
    return a->status;
}

cJSON *
history_attempt_json(const struct history_attempt *a)
{
    cJSON *o = cJSON_CreateObject();
    char *log = xasprintf("%s/process.log", a->dir);

    json_add_int(o, "attempt", a->number);
    if (a->node)
        json_add_str(o, "node", a->node);
    if (a->start > 0)
        json_add_float(o, "start", a->start);
    if (a->end > 0)
        json_add_float(o, "end", a->end);
    if (a->elapsed >= 0)
        json_add_float(o, "elapsed_secs", a->elapsed);
    json_add_str(o, "outcome", history_outcome(a));
    if (a->status)
        json_add_str(o, "status", a->status);
    if (a->fclass)
        json_add_str(o, "failure_class", a->fclass);
    if (a->rows >= 0)
        json_add_int(o, "rows", a->rows);
    if (a->error)
        json_add_str(o, "error", a->error);
    json_add_str(o, "log", log);
    free(log);
    return o;
}
