/*
 * remote: esctl commands answered by the daemon over its control socket.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "esctl.h"
#include "json.h"

/* Reply's result or error; prints the error. Returns the exit code. */
static int
reply_or_error(struct call *c, int r, const struct esd_err *err, cJSON *reply,
               const cJSON **ret_result)
{
    const cJSON *e;

    if (r < 0) {
        out_error("%s", err->msg);
        return r == -ECONNREFUSED || r == -ENOENT || r == -ETIMEDOUT ? EXIT_UNREACHABLE
                                                                     : EXIT_ERROR;
    }
    if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(reply, "ok"))) {
        e = cJSON_GetObjectItemCaseSensitive(reply, "error");
        out_error("esd: %s (%s)", json_get_str(e, "message") ? json_get_str(e, "message") : "?",
                  json_get_str(e, "code") ? json_get_str(e, "code") : "?");
        return json_get_str(e, "code") && !strcmp(json_get_str(e, "code"), "denied")
                   ? EXIT_DENIED
                   : EXIT_ERROR;
    }
    *ret_result = cJSON_GetObjectItemCaseSensitive(reply, "result");
    return EXIT_OK;
}

static void
print_json_obj(const cJSON *j)
{
    struct buf b;

    buf_init(&b);
    json_dump(j, JSON_PRETTY, &b);
    fwrite(b.p, 1, b.len, stdout);
    buf_free(&b);
}

int
remote_ping(struct call *c)
{
    struct esd_err err;
    cJSON *reply = NULL;
    const cJSON *res = NULL;
    long long pid = 0;
    int rc;

    rc = client_call(c, "ping", NULL, 10, NULL, NULL, &reply, &err);
    rc = reply_or_error(c, rc, &err, reply, &res);
    if (rc == EXIT_OK) {
        if (c->json) {
            print_json_obj(res);
        } else {
            json_get_int(res, "pid", &pid);
            printf("esd %s on node %s (pid %lld) at %s\n", json_get_str(res, "version"),
                   json_get_str(res, "node"), pid, client_socket_path(c));
        }
    }
    cJSON_Delete(reply);
    return rc;
}

int
remote_status(struct call *c)
{
    struct esd_err err;
    cJSON *reply = NULL;
    const cJSON *res = NULL, *ray, *x;
    struct table t;
    long long pid = 0, slots = 0, busy = 0;
    int rc;

    rc = client_call(c, "status", NULL, 30, NULL, NULL, &reply, &err);
    rc = reply_or_error(c, rc, &err, reply, &res);
    if (rc != EXIT_OK || c->json) {
        if (rc == EXIT_OK)
            print_json_obj(res);
        cJSON_Delete(reply);
        return rc;
    }
    json_get_int(res, "pid", &pid);
    json_get_int(res, "slots", &slots);
    json_get_int(res, "busy", &busy);
    ray = cJSON_GetObjectItemCaseSensitive(res, "ray");
    printf("esd %s on node %s (pid %lld): %s, %lld/%lld slots busy, ray %s%s%s\n",
           json_get_str(res, "version"), json_get_str(res, "node"), pid,
           json_get_str(res, "state"), busy, slots, json_get_str(ray, "state"),
           json_get_str(ray, "address") ? " at " : "",
           json_get_str(ray, "address") ? json_get_str(ray, "address") : "");
    table_init(&t, 5);
    table_add(&t, NULL, "JOB", "STATE", "DONE", "HERE", "DIRECTORY / ERROR");
    cJSON_ArrayForEach(x, cJSON_GetObjectItemCaseSensitive(res, "jobs"))
    {
        long long done = 0, shards = 0, here = 0, running = 0;
        char d[64], h[64];
        const char *err_msg = json_get_str(x, "error");

        if (!err_msg)
            err_msg = json_get_str(x, "load_error");
        json_get_int(x, "done", &done);
        json_get_int(x, "shards", &shards);
        json_get_int(x, "done_here", &here);
        json_get_int(x, "running_here", &running);
        snprintf(d, sizeof(d), "%lld/%lld", done, shards);
        snprintf(h, sizeof(h), "%lld done, %lld running", here, running);
        table_add(&t, out_color(c, json_get_str(x, "state")),
                  json_get_str(x, "job_id") ? json_get_str(x, "job_id") : json_get_str(x, "key"),
                  json_get_str(x, "state"), d, h,
                  err_msg ? err_msg : json_get_str(x, "job_dir"));
    }
    if (t.nrows > 1) {
        putchar('\n');
        table_print(c, &t);
    }
    table_free(&t);
    cJSON_Delete(reply);
    return rc;
}
