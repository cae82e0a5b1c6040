/*
 * dispatch: runs a parsed command line to its end. The commands that are
 * programs of their own (worker, report, fscheck, completion, logs from
 * the journal) get the call; for every other the options that have a
 * request key become the request's arguments (paths made absolute), and
 * the request runs once (ctl/call.c) or in a loop (ctl/watch.c: status
 * --watch, wait, drain --wait). The top of esctl: nothing here is used by
 * another module but esctl.c.
 */
#include <stdlib.h>

#include "esctl.h"
#include "pypath.h"
#include "json.h"
#include "proto.h"

/*
 * The request arguments of c: every option given that has a key, paths
 * made absolute (esd refuses relative ones: its working directory is not
 * the caller's). *ret is the object (caller frees).
 */
static int
build_args(const struct call *c, cJSON **ret, struct esd_err *err)
{
    cJSON *a = cJSON_CreateObject(), *v;
    char *abs;
    int r;

    for (int o = 0; o < O__COUNT; o++) {
        const struct opt_def *d = &cmd_opts[o];

        if (!c->set[o] || !d->key)
            continue;
        switch (d->kind) {
        case K_FLAG:
            json_add_bool(a, d->key, true);
            break;
        case K_STR:
            if (o == O_PROCESSOR) {
                abs = call_processor_abs(c->str[o]);
                json_add_str(a, d->key, abs);
                free(abs);
                break;
            }
            if (!d->path) {
                json_add_str(a, d->key, c->str[o]);
                break;
            }
            if ((r = pypath_resolve_cli(c->str[o], &abs, err)) < 0) {
                cJSON_Delete(a);
                return r;
            }
            json_add_str(a, d->key, abs);
            free(abs);
            break;
        case K_STRV:
            v = cJSON_AddArrayToObject(a, d->key);
            for (size_t i = 0; i < c->multi[o].n; i++) {
                if (!d->path) {
                    cJSON_AddItemToArray(v, cJSON_CreateString(c->multi[o].v[i]));
                    continue;
                }
                if ((r = pypath_resolve_cli(c->multi[o].v[i], &abs, err)) < 0) {
                    cJSON_Delete(a);
                    return r;
                }
                cJSON_AddItemToArray(v, cJSON_CreateString(abs));
                free(abs);
            }
            break;
        case K_POSITIVE:
        case K_NONNEG:
            /* A plain number: cmd_arg_num() reads those (json_add_int
             * would make a raw node). */
            cJSON_AddNumberToObject(a, d->key, (double)c->num[o]);
            break;
        }
    }
    *ret = a;
    return 0;
}

int
dispatch_run(struct call *c)
{
    const struct cmd_def *cmd = c->cmd;
    bool local = c->set[O_LOCAL] || !(cmd->flags & CMDF_DAEMON);
    struct esd_err err;
    cJSON *args = NULL, *res = NULL;
    int rc;

    if (local && !(cmd->flags & CMDF_LOCAL)) {
        out_error("%s has no local mode: it asks esd", cmd->name);
        return EXIT_ERROR;
    }
    switch (cmd->id) {
    case CMD_COMPLETION:
        return completion_print();
    case CMD_WORKER:
        return worker_run(c);
    case CMD_FSCHECK:
        return fscheck_cmd(c);
    case CMD_REPORT:
        return report_run(c);
    case CMD_LOGS:
        if (!c->set[O_SHARD])
            return journal_show(c);
        break;
    case CMD_STATUS:
        if (local && !c->set[O_JOB_DIR]) {
            out_error("status --local needs a job directory (without one, status asks esd)");
            return EXIT_ERROR;
        }
        if (c->set[O_WATCH] && !c->set[O_JOB_DIR]) {
            out_error("status --watch needs a job directory");
            return EXIT_ERROR;
        }
        break;
    default:
        break;
    }
    call_catch_signals();
    if (cmd->id == CMD_VERSION)
        return call_version(c);
    if (build_args(c, &args, &err) < 0) {
        rc = render_error(c, PROTO_E_BAD_ARGS, err.msg, EXIT_ERROR);
        return rc;
    }
    if (cmd->id == CMD_WAIT) {
        /* through esd unless --local (status falls back by itself) */
        rc = watch_wait(c, args, c->set[O_LOCAL]);
        cJSON_Delete(args);
        return rc;
    }
    if (cmd->id == CMD_STATUS && c->set[O_WATCH]) {
        cJSON_DeleteItemFromObjectCaseSensitive(args, "watch");
        rc = watch_status(c, args, local);
        cJSON_Delete(args);
        return rc;
    }
    if (cmd->id == CMD_DRAIN)
        cJSON_DeleteItemFromObjectCaseSensitive(args, "wait");
    rc = call_do(c, cmd->id, args, &local, &res);
    if (rc == EXIT_OK) {
        rc = render_result(c, cmd->id, args, res);
        if (rc == EXIT_OK && cmd->id == CMD_DRAIN && c->set[O_WAIT])
            rc = watch_drain(c, res);
        /* logs --follow ends when interrupted, with its result */
        if (rc == EXIT_OK && call_interrupted())
            rc = EXIT_INTERRUPTED;
    }
    cJSON_Delete(res);
    cJSON_Delete(args);
    return rc;
}
