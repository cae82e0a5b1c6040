/*
 * retry: moving failed shards back to pending.
 */
#include "retry.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "fsutil.h"

static bool
exists(const char *path)
{
    struct stat st;

    return lstat(path, &st) == 0;
}

int
retry_run(const struct manifest *m, bool all_failed, const struct strv *ids,
          struct strv *ret_requeued, struct esd_err *err)
{
    struct strv targets, unknown;
    struct buf msg;
    int r = 0;

    strv_init(&targets);
    strv_init(&unknown);
    buf_init(&msg);
    if (!all_failed) {
        for (size_t i = 0; ids && i < ids->n; i++)
            if (manifest_find(m, ids->v[i]) < 0 && !strv_contains(&unknown, ids->v[i]))
                strv_push(&unknown, ids->v[i]);
        if (unknown.n) {
            strv_sort(&unknown);
            for (size_t i = 0; i < unknown.n; i++)
                buf_printf(&msg, "%s%s", i ? ", " : "", unknown.v[i]);
            r = err_set(err, -EINVAL, "Unknown shard IDs: %s", msg.p);
            goto out;
        }
    }
    for (size_t i = 0; i < m->nshards; i++) {
        const char *id = m->shards[i].id;
        char *path;

        if (!all_failed && (!ids || !strv_contains(ids, id)))
            continue;
        path = manifest_state_path(m, "failed", id, ".json");
        if (exists(path))
            strv_push(&targets, id);
        free(path);
    }
    strv_sort(&targets);
    for (size_t i = 0; i < targets.n && r == 0; i++) {
        char *lock = manifest_state_path(m, "locks", targets.v[i], ".lock");
        char *done = manifest_state_path(m, "done", targets.v[i], ".json");

        if (exists(lock))
            r = err_set(err, -EBUSY, "Cannot retry %s: a lock still exists", targets.v[i]);
        else if (exists(done))
            r = err_set(err, -EEXIST, "Cannot retry %s: it is already complete", targets.v[i]);
        free(lock);
        free(done);
    }
    for (size_t i = 0; i < targets.n && r == 0; i++) {
        const char *id = targets.v[i];
        char hex[33];
        char *suffix, *failed, *attempts, *hist_failed, *hist_attempts;

        rand_hex32(hex);
        suffix = xasprintf("%lld.%s", (long long)time(NULL), hex);
        failed = manifest_state_path(m, "failed", id, ".json");
        attempts = xasprintf("%s/attempts/%s", m->job_dir, id);
        hist_failed = xasprintf("%s/state/history/failed/%s.%s.json", m->job_dir, id, suffix);
        hist_attempts = xasprintf("%s/state/history/attempts/%s.%s", m->job_dir, id, suffix);
        /* Attempts first: a crash in between leaves the shard failed (and
         * retryable), never pending with its old failures still counted. */
        if (exists(attempts) && rename(attempts, hist_attempts) < 0)
            r = err_sys(err, -errno, "cannot move %s to %s", attempts, hist_attempts);
        else if (rename(failed, hist_failed) < 0)
            r = err_sys(err, -errno, "cannot move %s to %s", failed, hist_failed);
        if (r == 0)
            r = fs_fsync_parent(hist_attempts, err);
        if (r == 0)
            r = fs_fsync_parent(hist_failed, err);
        if (r == 0)
            r = fs_fsync_parent(failed, err);
        if (r == 0)
            strv_push(ret_requeued, id);
        free(suffix);
        free(failed);
        free(attempts);
        free(hist_failed);
        free(hist_attempts);
    }
out:
    strv_free(&targets);
    strv_free(&unknown);
    buf_free(&msg);
    return r;
}
