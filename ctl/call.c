/*
 * call: runs one request of a parsed command line: in-process
 * (common/ops.c) with --local or when the command has no daemon side,
 * otherwise through esd, falling back to in-process for commands that only
 * read a job directory when esd cannot be reached. Events are shown by
 * ctl/render.c whichever ran the request. Below ctl/dispatch.c (which
 * turns the command line into requests) and the loops of ctl/watch.c and
 * ctl/worker.c that make requests of their own.
 */
#include <errno.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "esctl.h"
#include "json.h"
#include "ops.h"
#include "prepare.h"
#include "proto.h"
#include "pypath.h"

#define PLAIN_TIMEOUT 30.0 /* seconds for a command that is not CMDF_LONG */

/* Set by SIGINT, SIGTERM and SIGHUP: operations and loops stop cleanly. */
static volatile sig_atomic_t interrupted;

static void
on_signal(int sig)
{
    (void)sig;
    interrupted = 1;
}

void
call_catch_signals(void)
{
    struct sigaction sa;

    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

bool
call_interrupted(void)
{
    return interrupted != 0;
}

static void
event_cb(void *ctx, cJSON *ev)
{
    render_event(ctx, ev);
}

char *
call_processor_abs(const char *cmd)
{
    size_t lead = strspn(cmd, " \t"), n = strcspn(cmd + lead, " \t");
    char *word = xstrndup(cmd + lead, n), *cwd, *r;

    if (word[0] == '/' || !memchr(word, '/', n) || !(cwd = getcwd(NULL, 0))) {
        free(word);
        return xstrdup(cmd);
    }
    r = xasprintf("%s/%s%s", cwd, strncmp(word, "./", 2) ? word : word + 2, cmd + lead + n);
    free(cwd);
    free(word);
    return r;
}

/* A failed operation: its PROTO_E_* code and message. */
struct failure {
    char code[32];
    struct esd_err err;
};

/*
 * prepare as root: esctl becomes, for good (it only shows the result
 * after), the owner of the job directory or of the directory it will be
 * created in, so that its owner cannot steer root's writes (issue 11
 * class 5) and the job is theirs. Root's own directories stay root's.
 * *as names who it became ("" if nobody).
 */
static int
prepare_identity(const cJSON *args, char *as, size_t n, struct esd_err *err)
{
    const char *job_dir = cmd_arg_str(args, O_JOB_DIR);
    struct passwd *pw;
    char *where = NULL;
    uid_t uid;
    int r;

    *as = '\0';
    if (geteuid() != 0 || !job_dir)
        return 0; /* without --job-dir prepare says so */
    if ((r = prepare_owner(job_dir, &uid, &where, err)) < 0 || uid == 0 ||
        (r = prepare_become(uid, err)) < 0) {
        free(where);
        return r;
    }
    pw = getpwuid(uid);
    snprintf(as, n, "prepare ran as %s (uid %u), the owner of %s", pw ? pw->pw_name : "?",
             (unsigned)uid, where);
    free(where);
    return 0;
}

/* Runs id in-process. Returns 0 (*ret result), or 1 (f says why). */
static int
run_local(struct call *c, enum cmd_id id, const cJSON *args, cJSON **ret, struct failure *f)
{
    struct op_env env = { .event = event_cb, .ctx = c, .cancel = &interrupted };
    char as[ESD_ERR_MAX / 2];
    int r;

    as[0] = '\0';
    r = id == CMD_PREPARE ? prepare_identity(args, as, sizeof(as), &f->err) : 0;
    if (r == 0)
        r = op_run(id, args, &env, ret, &f->err);
    out_progress_end(c);
    if (r == 0)
        return 0;
    if (*as) {
        char prev[ESD_ERR_MAX];

        memcpy(prev, f->err.msg, sizeof(prev));
        err_set(&f->err, r, "%s (%s)", prev, as);
    }
    snprintf(f->code, sizeof(f->code), "%s",
             r == -EACCES || r == -EPERM ? PROTO_E_DENIED : PROTO_E_FAILED);
    return 1;
}

/*
 * Runs id through esd. Returns 0 (*ret result), 1 (esd answered with an
 * error: f), or client_call's negative errno (f->err says why).
 */
static int
run_daemon(struct call *c, enum cmd_id id, const cJSON *args, cJSON **ret, struct failure *f)
{
    struct op_env env = { .event = event_cb, .ctx = c, .cancel = &interrupted };
    bool long_op =
        (cmd_table[id].flags & CMDF_LONG) || (id == CMD_LOGS && cmd_arg_flag(args, O_FOLLOW));
    cJSON *reply = NULL, *e;
    const char *code, *msg;
    int r;

    r = client_call(c, cmd_table[id].name, args, long_op ? 0 : PLAIN_TIMEOUT, &env, &reply,
                    &f->err);
    out_progress_end(c);
    if (r < 0)
        return r;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(reply, "ok"))) {
        *ret = cJSON_DetachItemFromObjectCaseSensitive(reply, "result");
        if (!*ret)
            *ret = cJSON_CreateObject();
        cJSON_Delete(reply);
        return 0;
    }
    e = cJSON_GetObjectItemCaseSensitive(reply, "error");
    code = json_get_str(e, "code");
    msg = json_get_str(e, "message");
    snprintf(f->code, sizeof(f->code), "%s", code ? code : PROTO_E_INTERNAL);
    err_set(&f->err, -EREMOTEIO, "%s", msg ? msg : "esd refused the request without a reason");
    cJSON_Delete(reply);
    return 1;
}

/* connect(2) failed in a way that means "no esd for this user here". */
static bool
unreachable(int r)
{
    return r == -ENOENT || r == -ECONNREFUSED || r == -EACCES;
}

/* esd could not be reached or talked to (r from client_call). */
static int
daemon_failed(const struct call *c, int r, const struct esd_err *err)
{
    const char *path = client_socket_path(c);
    const struct cmd_def *cmd = c->cmd;
    char msg[ESD_ERR_MAX + 256];

    if (r == -ECANCELED) {
        out_error("interrupted%s", cmd->flags & CMDF_CHILD ? "; esd stops the operation" : "");
        return EXIT_INTERRUPTED;
    }
    if (r == -EACCES) {
        snprintf(msg, sizeof(msg),
                 "permission denied on esd's control socket %s: only members of its group "
                 "(socket_group in esd.yaml) may connect%s",
                 path,
                 cmd->flags & CMDF_LOCAL ? "; --local works on the job directory directly" : "");
        return render_error(c, PROTO_E_DENIED, msg, EXIT_DENIED);
    }
    if (unreachable(r) && (cmd->flags & CMDF_LOCAL))
        snprintf(msg, sizeof(msg), "%s; pass --local to run %s in-process on the job directory",
                 err->msg, cmd->name);
    else
        snprintf(msg, sizeof(msg), "%s", err->msg);
    return render_error(c, "unreachable", msg, EXIT_UNREACHABLE);
}

int
call_do(struct call *c, enum cmd_id id, const cJSON *args, bool *local, cJSON **ret_result)
{
    const struct cmd_def *cmd = &cmd_table[id];
    struct failure f = { "", { 0, "" } };
    int r;

    *ret_result = NULL;
    if (*local) {
        r = run_local(c, id, args, ret_result, &f);
    } else {
        r = run_daemon(c, id, args, ret_result, &f);
        if (r < 0 && unreachable(r) && (cmd->flags & CMDF_FALLBACK) &&
            cmd_arg_has(args, O_JOB_DIR)) {
            out_error("esd is not reachable at %s (%s); reading the job directory directly",
                      client_socket_path(c), strerror(-r));
            *local = true;
            r = run_local(c, id, args, ret_result, &f);
        }
    }
    if (r == 0)
        return EXIT_OK;
    if (r > 0)
        return render_error(c, f.code, f.err.msg, EXIT_ERROR);
    return daemon_failed(c, r, &f.err);
}

int
call_version(struct call *c)
{
    struct failure f = { "", { 0, "" } };
    cJSON *res = NULL;
    char why[ESD_ERR_MAX + 64];
    int r, rc;

    r = run_daemon(c, CMD_VERSION, NULL, &res, &f);
    if (r > 0)
        return render_error(c, f.code, f.err.msg, EXIT_ERROR);
    if (r == -ECANCELED)
        return daemon_failed(c, r, &f.err);
    if (r < 0) {
        if (unreachable(r))
            snprintf(why, sizeof(why), "%s (%s)", client_socket_path(c), strerror(-r));
        else
            snprintf(why, sizeof(why), "%s (%s)", client_socket_path(c), f.err.msg);
        rc = render_version(c, NULL, why);
        return r == -EACCES ? EXIT_DENIED : rc;
    }
    rc = render_version(c, res, NULL);
    cJSON_Delete(res);
    return rc;
}
