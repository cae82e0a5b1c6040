/*
 * watch: the loops that repeat a request on the client's side: status
 * --watch reads a job's status every 2 seconds until the job is terminal
 * (on a terminal it redraws a per-node view; otherwise it prints a line,
 * or a JSON document, only when something changed), drain --wait polls
 * esd's status every second until nothing runs on the node, wait repeats
 * a job's status until the job is over. All keep to a monotonic schedule
 * and end at once on Ctrl-C (exit status 130).
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "esctl.h"
#include "fsutil.h"
#include "json.h"
#include "ops.h"

#define WATCH_SECS 2.0
#define DRAIN_POLL_SECS 1.0
/* wait: esd answers from its view of the job; without esd every round
 * reads the whole job directory (an RPC per shard on NFS) */
#define WAIT_SECS 2.0
#define WAIT_LOCAL_SECS 5.0

/* Waits until the monotonic time at; false when interrupted. */
static bool
wait_until(double at)
{
    double left;

    while (!call_interrupted() && (left = at - time_mono()) > 0)
        poll(NULL, 0, (int)(left * 1000) + 1);
    return !call_interrupted();
}

static bool
job_terminal(const cJSON *res)
{
    return cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(res, "complete")) ||
           cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(res, "terminal"));
}

/* What a round off a terminal reports a change of: the counts, the rows
 * done, the merge's word and which shards are running where (caller frees). */
static char *
round_key(const cJSON *res)
{
    cJSON *k = cJSON_CreateObject(), *run = cJSON_AddArrayToObject(k, "running");
    const cJSON *x;
    struct buf b;

    cJSON_AddItemToObject(k, "counts",
                          cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(res, "counts"), true));
    cJSON_AddItemToObject(
        k, "rows_done", cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(res, "rows_done"), true));
    cJSON_AddItemToObject(k, "merge",
                          cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(res, "merge"), true));
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(res, "shards"))
    {
        const char *st = json_get_str(x, "status"), *node = json_get_str(x, "node");

        if (st && (!strcmp(st, "running") || !strcmp(st, "stale")))
            cJSON_AddItemToArray(run, cJSON_CreateString(node ? node : st));
    }
    buf_init(&b);
    json_dump(k, JSON_COMPACT, &b);
    cJSON_Delete(k);
    return buf_steal(&b);
}

/* Shows a round; off a terminal only when round_key differs from *last. */
static void
show_round(struct call *c, const cJSON *args, const cJSON *res, char **last)
{
    if (!c->tty_out || c->json) {
        char *key = round_key(res);

        if (*last && !strcmp(*last, key)) {
            free(key);
            return;
        }
        free(*last);
        *last = key;
    }
    if (c->json) {
        /* one compact document a line (JSON Lines), for scripts */
        out_json_line(res);
    } else if (c->tty_out) {
        fputs("\033[H\033[J", stdout);
        render_status_line(c, res);
        render_watch_nodes(c, res);
    } else {
        render_status_line(c, res);
    }
    (void)args;
    fflush(stdout);
}

int
watch_status(struct call *c, const cJSON *args, bool local)
{
    double next = time_mono();
    char *last = NULL;
    int rc;

    for (;;) {
        cJSON *res = NULL;

        if ((rc = call_do(c, CMD_STATUS, args, &local, &res)) != EXIT_OK)
            break;
        if (call_interrupted()) {
            cJSON_Delete(res);
            rc = EXIT_INTERRUPTED;
            break;
        }
        show_round(c, args, res, &last);
        if (job_terminal(res)) {
            rc = op_status_exit(res);
            cJSON_Delete(res);
            break;
        }
        cJSON_Delete(res);
        /* Keep to the schedule; after a slow round, start the next at once. */
        next += WATCH_SECS;
        if (next < time_mono())
            next = time_mono();
        if (!wait_until(next)) {
            rc = EXIT_INTERRUPTED;
            break;
        }
    }
    free(last);
    return rc;
}

/* Nothing runs: no attempt ("attempts": busy, claimed ahead or finishing;
 * "busy" from an esd that does not say), and no merge ("merging", when
 * esd reports it). */
static bool
drained(const cJSON *status)
{
    long long busy = 1, merging = 0;

    if (json_get_int(status, "attempts", &busy) != 0)
        json_get_int(status, "busy", &busy);
    json_get_int(status, "merging", &merging);
    return busy == 0 && merging == 0;
}

int
watch_drain(struct call *c, const cJSON *drain_result)
{
    double next = time_mono();
    bool local = false;
    bool done = drained(drain_result);

    while (!done) {
        cJSON *res = NULL;
        int rc;

        next += DRAIN_POLL_SECS;
        if (!wait_until(next))
            return EXIT_INTERRUPTED;
        if ((rc = call_do(c, CMD_STATUS, NULL, &local, &res)) != EXIT_OK)
            return rc;
        done = drained(res);
        cJSON_Delete(res);
    }
    if (!c->json) {
        printf("drained\n");
        fflush(stdout);
    }
    return EXIT_OK;
}

/* The job directory is still there and still a job: EXIT_OK, or
 * EXIT_ERROR with a message naming what went. */
static int
wait_still_job(const char *dir)
{
    char *manifest = fs_join(dir, "manifest.json");
    struct stat st;
    int rc = EXIT_OK;

    if (stat(dir, &st) < 0) {
        out_error("wait: the job directory %s %s", dir,
                  errno == ENOENT ? "is gone (removed while waiting?)" : strerror(errno));
        rc = EXIT_ERROR;
    } else if (!S_ISDIR(st.st_mode)) {
        out_error("wait: %s is not a directory", dir);
        rc = EXIT_ERROR;
    } else if (stat(manifest, &st) < 0 || !S_ISREG(st.st_mode)) {
        out_error("wait: %s is not a job directory (no manifest.json)", dir);
        rc = EXIT_ERROR;
    }
    free(manifest);
    return rc;
}

static bool
is(const char *s, const char *want)
{
    return s && !strcmp(s, want);
}

/*
 * How the job that status result res shows has ended: EXIT_OK merged
 * (this node's esd says complete, its merge election says so, or
 * `esctl merge` wrote merge.json), EXIT_ERROR failed (a shard failed
 * terminally, or the merge failed) or cancelled (on this node, or on every
 * node by the job directory's marker); -1 not over yet. *what says which.
 */
static int
wait_outcome(const char *dir, const cJSON *res, const char **what)
{
    const char *state = json_get_str(res, "state"); /* this node's, through esd */
    const char *merge = json_get_str(cJSON_GetObjectItemCaseSensitive(res, "merge"), "status");
    char *path;
    struct stat st;
    bool marker;

    *what = NULL;
    if (is(state, "complete") || is(merge, "complete")) {
        *what = "merged";
        return EXIT_OK;
    }
    if (is(state, "failed") || is(merge, "failed")) {
        *what = "failed";
        return EXIT_ERROR;
    }
    if (is(state, "cancelled")) {
        *what = "cancelled";
        return EXIT_ERROR;
    }
    path = fs_join(dir, "merge.json");
    marker = stat(path, &st) == 0;
    free(path);
    if (marker) {
        *what = "merged";
        return EXIT_OK;
    }
    path = fs_join(dir, "state/esd/cancelled.json");
    marker = stat(path, &st) == 0;
    free(path);
    if (marker) {
        *what = "cancelled on every node";
        return EXIT_ERROR;
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(res, "terminal")) &&
        !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(res, "complete"))) {
        *what = "failed";
        return EXIT_ERROR;
    }
    return -1;
}

int
watch_wait(struct call *c, const cJSON *args, bool local)
{
    const char *dir = cmd_arg_str(args, O_JOB_DIR);
    double start = time_mono(), next = start;
    double limit = c->set[O_TIMEOUT_SECS] ? (double)c->num[O_TIMEOUT_SECS] : -1;
    cJSON *sargs = cJSON_CreateObject();

    json_add_str(sargs, "job_dir", dir);
    for (;;) {
        const char *what;
        cJSON *res = NULL;
        int rc;

        if ((rc = wait_still_job(dir)) != EXIT_OK) {
            cJSON_Delete(sargs);
            return rc;
        }
        if ((rc = call_do(c, CMD_STATUS, sargs, &local, &res)) != EXIT_OK) {
            /* (removed while status read it: say so too) */
            if (rc == EXIT_ERROR)
                wait_still_job(dir);
            cJSON_Delete(sargs);
            return rc;
        }
        rc = wait_outcome(dir, res, &what);
        if (rc >= 0) {
            if (c->json) {
                out_json(res);
            } else {
                const char *err = json_get_str(res, "error");

                printf("%s: %s%s%s\n", dir, what, err ? ": " : "", err ? err : "");
            }
            fflush(stdout);
            cJSON_Delete(res);
            cJSON_Delete(sargs);
            return rc;
        }
        cJSON_Delete(res);
        next += local ? WAIT_LOCAL_SECS : WAIT_SECS;
        if (next < time_mono())
            next = time_mono();
        if (limit >= 0 && next - start > limit) {
            /* sleep to the deadline, then one last look */
            if (time_mono() - start >= limit) {
                out_error("wait: %s is not over after %lld s (--timeout-secs)", dir,
                          (long long)limit);
                cJSON_Delete(sargs);
                return EXIT_INCOMPLETE;
            }
            next = start + limit;
        }
        if (!wait_until(next)) {
            cJSON_Delete(sargs);
            return EXIT_INTERRUPTED;
        }
    }
}
