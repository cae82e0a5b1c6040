/*
 * opchild: job-directory commands in child processes (opchild.h).
 */
#include "opchild.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fsutil.h"
#include "helper.h"
#include "json.h"
#include "log.h"
#include "ops.h"
#include "proto.h"
#include "spawn.h"

#define READ_CHUNK 65536
#define MAX_LINE ((size_t)PROTO_MAX_MESSAGE * 4) /* one line from a child */

struct opchild {
    pid_t pid;
    int fd;
    enum cmd_id id;
    ev_io out_w;
    ev_child child_w;
    struct buf in;
    bool got_end; /* a result or error line was read */
    bool eof;
    bool exited;
    int status; /* wait status */
    bool cancelled;
    bool held;
    cJSON *result; /* kept until the child has exited */
    char *code, *message;
    const struct opchild_ops *ops;
    void *ctx;
    struct proto_share share; /* whose slot it holds */
    struct helper_guard guard;
    struct opchild *prev, *next;
};

static struct {
    struct ev_loop *loop;
    const struct esd_conf *conf;
    struct opchild *head;
    size_t n;
} O;

void
opchild_init(struct ev_loop *loop, const struct esd_conf *c)
{
    O.loop = loop;
    O.conf = c;
}

void
opchild_reconfigure(const struct esd_conf *c)
{
    O.conf = c;
}

size_t
opchild_count(void)
{
    return O.n;
}

/* ---- the child ---- */

static volatile sig_atomic_t child_cancel;

static void
child_on_term(int sig)
{
    (void)sig;
    child_cancel = 1;
}

static int child_fd = -1;

static void
child_write(const char *member, cJSON *v)
{
    cJSON *m = cJSON_CreateObject();
    struct buf b;

    cJSON_AddItemToObject(m, member, v);
    buf_init(&b);
    json_dump(m, JSON_COMPACT, &b);
    buf_append(&b, "\n", 1);
    /* The parent is gone if this fails: nothing to do but stop. */
    if (helper_write(child_fd, b.p, b.len) < 0)
        child_cancel = 1;
    buf_free(&b);
    cJSON_Delete(m);
}

static void
child_event(void *ctx, cJSON *ev)
{
    child_write("event", ev);
}

/* The operation, in a helper (helper_fork: nothing of esd's, the
 * caller's identity, a death signal, the tick). */
static void __attribute__((noreturn)) child_main(enum cmd_id id, const cJSON *args, int fd)
{
    struct sigaction sa = { .sa_handler = child_on_term };
    struct op_env env = { 0 };
    struct esd_err err;
    cJSON *res = NULL;
    int r = 0;

    child_fd = fd;
    /* here SIGTERM (esd's cancel) and SIGINT stop the operation cleanly */
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    {
        env.event = child_event;
        env.cancel = &child_cancel;
        env.confined = true;
        env.processor = O.conf->processor.n ? (const char *const *)O.conf->processor.v : NULL;
        env.dj_root = O.conf->dj_root;
        env.threads = (unsigned)O.conf->threads;
        r = op_run(id, args, &env, &res, &err);
    }
    if (r == 0) {
        child_write("result", res);
    } else {
        cJSON *e = cJSON_CreateObject();

        json_add_str(e, "code",
                     r == -EACCES || r == -EPERM         ? PROTO_E_DENIED
                     : r == -EINVAL && id != CMD_PREPARE ? PROTO_E_BAD_ARGS
                     : r == -ENOENT                      ? PROTO_E_NOT_FOUND
                                                         : PROTO_E_FAILED);
        json_add_str(e, "message", err.msg);
        child_write("error", e);
    }
    _exit(r == 0 ? 0 : 1);
}

/* ---- the parent ---- */

static void
opchild_free(struct opchild *o)
{
    if (o->prev)
        o->prev->next = o->next;
    else
        O.head = o->next;
    if (o->next)
        o->next->prev = o->prev;
    O.n--;
    helper_guard_stop(&o->guard, O.loop);
    ev_io_stop(O.loop, &o->out_w);
    ev_child_stop(O.loop, &o->child_w);
    if (o->fd >= 0)
        close(o->fd);
    buf_free(&o->in);
    cJSON_Delete(o->result);
    free(o->code);
    free(o->message);
    free(o);
}

/* The end, once the child has exited and its pipe is drained. */
static void
maybe_finish(struct opchild *o)
{
    if (!o->exited || !(o->cancelled || (o->eof && !o->held)))
        return;
    if (!o->cancelled) {
        if (o->result) {
            cJSON *res = o->result;

            o->result = NULL;
            o->ops->done(o->ctx, res, NULL, NULL);
        } else if (o->code) {
            o->ops->done(o->ctx, NULL, o->code, o->message);
        } else {
            char why[160];

            if (WIFSIGNALED(o->status))
                snprintf(why, sizeof(why), "the %s process was killed by signal %d; see esd's log",
                         cmd_table[o->id].name, WTERMSIG(o->status));
            else
                snprintf(why, sizeof(why),
                         "the %s process exited with status %d without a "
                         "result; see esd's log",
                         cmd_table[o->id].name, WEXITSTATUS(o->status));
            o->ops->done(o->ctx, NULL, PROTO_E_INTERNAL, why);
        }
    }
    opchild_free(o);
}

static void
handle_line(struct opchild *o, const char *line, size_t len)
{
    struct esd_err err;
    cJSON *m = NULL, *v;

    if (len == 0)
        return; /* the helper's tick */
    if (o->got_end || json_parse_object(line, len, "an operation's report", &m, &err) < 0) {
        log_warning(NULL, "%s process %d: unexpected report line, ignoring", cmd_table[o->id].name,
                    (int)o->pid);
        cJSON_Delete(m);
        return;
    }
    if ((v = cJSON_DetachItemFromObjectCaseSensitive(m, "event"))) {
        if (!o->cancelled)
            o->ops->event(o->ctx, v);
        else
            cJSON_Delete(v);
    } else if ((v = cJSON_DetachItemFromObjectCaseSensitive(m, "result"))) {
        o->result = v;
        o->got_end = true;
    } else if ((v = cJSON_GetObjectItemCaseSensitive(m, "error"))) {
        const char *code = json_get_str(v, "code"), *msg = json_get_str(v, "message");

        o->code = xstrdup(code ? code : PROTO_E_INTERNAL);
        o->message = xstrdup(msg ? msg : "failed");
        o->got_end = true;
    }
    cJSON_Delete(m);
}

static void
out_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    struct opchild *o = w->data;
    size_t pos = 0;
    ssize_t n;

    if (revents & EV_READ) {
        buf_reserve(&o->in, READ_CHUNK);
        n = read(o->fd, o->in.p + o->in.len, READ_CHUNK);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
            o->eof = true;
            ev_io_stop(loop, w);
        } else if (n > 0) {
            o->in.len += (size_t)n;
            helper_guard_fed(&o->guard, loop);
        }
    }
    /* Lines one at a time while not held, so that a consumer that fills
     * up stops the reading at once. */
    while (pos < o->in.len && !o->held) {
        char *nl = memchr(o->in.p + pos, '\n', o->in.len - pos);

        if (!nl)
            break;
        handle_line(o, o->in.p + pos, (size_t)(nl - (o->in.p + pos)));
        pos = (size_t)(nl - o->in.p) + 1;
    }
    if (pos > 0) {
        memmove(o->in.p, o->in.p + pos, o->in.len - pos);
        o->in.len -= pos;
    }
    if (o->in.len > MAX_LINE) {
        log_warning(NULL, "%s process %d: report line too long; stopping it", cmd_table[o->id].name,
                    (int)o->pid);
        kill(o->pid, SIGKILL);
        o->in.len = 0;
    }
    if (o->eof)
        maybe_finish(o);
}

static void
child_cb(struct ev_loop *loop, ev_child *w, int revents)
{
    struct opchild *o = w->data;

    ev_child_stop(loop, w);
    helper_guard_stop(&o->guard, loop);
    o->exited = true;
    o->status = w->rstatus;
    maybe_finish(o);
}

/* May share start one more operation? Every child counts until it is
 * freed, a cancelled one still running included. */
static enum proto_full
slot_check(const struct proto_share *share)
{
    struct proto_usage u = { 0 };

    for (const struct opchild *o = O.head; o; o = o->next)
        proto_usage_add(&u, &o->share, share);
    return proto_share_admit(&proto_op_limits, &u, share);
}

struct opchild *
opchild_start(enum cmd_id id, const cJSON *args, const struct ident *who,
              const struct proto_share *share, const struct opchild_ops *ops, void *ctx,
              const char **ret_code, struct esd_err *err)
{
    enum proto_full full = slot_check(share);
    struct helper_id hid = { .change = who->change,
                             .uid = who->uid,
                             .gid = who->gid,
                             .groups = who->groups,
                             .ngroups = who->ngroups };
    struct opchild *o;
    int fd;
    pid_t pid;

    if (full != PROTO_FULL_NONE) {
        char why[256];

        proto_share_explain(full, &proto_op_limits, share, "running operations", why, sizeof(why));
        *ret_code = PROTO_E_BUSY;
        err_set(err, -EBUSY, "%s", why);
        return NULL;
    }
    if ((pid = helper_fork(cmd_table[id].name, &hid, &fd, err)) < 0) {
        *ret_code = PROTO_E_INTERNAL;
        return NULL;
    }
    if (pid == 0)
        child_main(id, args, fd);
    o = xcalloc(1, sizeof(*o));
    o->pid = pid;
    o->fd = fd;
    o->id = id;
    o->ops = ops;
    o->ctx = ctx;
    o->share = *share;
    buf_init(&o->in);
    ev_io_init(&o->out_w, out_cb, o->fd, EV_READ);
    ev_child_init(&o->child_w, child_cb, pid, 0);
    o->out_w.data = o->child_w.data = o;
    ev_io_start(O.loop, &o->out_w);
    ev_child_start(O.loop, &o->child_w);
    /* (a follower waits for new log lines as long as its client wants) */
    helper_guard_start(
        &o->guard, O.loop, pid, cmd_table[id].name, NULL,
        id == CMD_LOGS && cmd_arg_flag(args, O_FOLLOW) ? 0 : (double)O.conf->helper_timeout_secs);
    o->next = O.head;
    if (o->next)
        o->next->prev = o;
    O.head = o;
    O.n++;
    log_debug(NULL, "%s: process %d started as uid %u", cmd_table[id].name, (int)pid,
              who->change ? (unsigned)who->uid : (unsigned)geteuid());
    return o;
}

void
opchild_hold(struct opchild *o, bool hold)
{
    if (o->held == hold)
        return;
    o->held = hold;
    /* a helper held back by its client sends nothing: that is not silence */
    helper_guard_pause(&o->guard, O.loop, hold);
    if (hold) {
        ev_io_stop(O.loop, &o->out_w);
        return;
    }
    if (!o->eof)
        ev_io_start(O.loop, &o->out_w);
    /* The lines already read first: the fd does not announce them. */
    ev_feed_event(O.loop, &o->out_w, EV_CUSTOM);
}

void
opchild_cancel(struct opchild *o)
{
    o->cancelled = true;
    if (!o->exited)
        kill(o->pid, SIGTERM);
    o->held = false;
    /* Drain (and drop) what it still writes, so that it is not stuck; the
     * end comes from the loop, never from inside the caller. */
    if (!o->eof)
        ev_io_start(O.loop, &o->out_w);
    ev_feed_event(O.loop, &o->out_w, EV_CUSTOM);
}

void
opchild_fini(void)
{
    while (O.head) {
        struct opchild *o = O.head;

        kill(o->pid, SIGKILL);
        waitpid(o->pid, NULL, 0);
        opchild_free(o);
    }
}
