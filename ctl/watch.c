/*
 * watch: the loops that repeat a request on the client's side: status
 * --watch reads a job's status every 2 seconds until the job is terminal
 * (on a terminal it redraws a per-node view; otherwise it prints a line,
 * or a JSON document, only when something changed), drain --wait polls
 * esd's status every second until nothing runs on the node. Both keep to
 * a monotonic schedule and end at once on Ctrl-C (exit status 130).
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "esctl.h"
#include "json.h"
#include "ops.h"

#define WATCH_SECS 2.0
#define DRAIN_POLL_SECS 1.0

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
    cJSON_AddItemToObject(k, "rows_done",
                          cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(res, "rows_done"), true));
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
