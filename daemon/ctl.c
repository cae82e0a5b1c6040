/*
 * ctl: the control server. A listening UNIX socket (created here with mode
 * 0660 before anyone can connect, or handed over by systemd) and up to
 * PROTO_MAX_CONNECTIONS connections, shared out between root, esd and its
 * control group, and the others by the limits of common/proto.h ("Fair
 * shares"), each an object that embeds its read and write watchers and its
 * idle timer.
 * Requests are read as lines of at most PROTO_MAX_MESSAGE bytes, checked
 * against the command table (common/cmds.c: arguments, then who may run
 * it, ctlcmd_authorise) and handed to the command's handler
 * (daemon/ctlcmd.c, found by command id), which answers at once or starts
 * an operation in a child process (daemon/opchild.c, op_start) whose
 * events are passed on as they come. Replies are
 * written without ever blocking: what the peer does not take yet waits in
 * the connection's buffer, the connection reads no new request until it
 * has gone out, and an operation's child is held while its client is
 * behind. The protocol is defined in common/proto.h.
 */
#include "ctl.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "cmds.h"
#include "ctlcmd.h"
#include "fsutil.h"
#include "json.h"
#include "log.h"
#include "opchild.h"
#include "proto.h"
#include "spawn.h"

#define READ_CHUNK 65536      /* bytes read at once from a connection */
#define ACCEPT_BURST 64       /* connections accepted in one callback */
#define ACCEPT_PAUSE_SECS 1.0 /* after running out of descriptors */
#define KEEP_BUF (256 * 1024) /* larger buffers are freed once empty */
#define HOLD_BYTES \
    (1024 * 1024) /* an operation waits while its client has
                                    this much unread */
#define HANGUP_CHECK_SECS \
    1.0 /* while an operation runs for a half-closed
                                  connection: is the peer still there? */
#define MAX_GROUPS 65536
#define PW_BUF_MAX (1024 * 1024) /* for getpwuid_r: larger entries count as none */

/* The server: the listening socket and its connections. */
static struct {
    struct ev_loop *loop; /* NULL: not initialised */
    int fd;
    bool activated;    /* fd came from systemd */
    char *path;        /* the socket file we created (NULL if activated) */
    struct stat st;    /* and its identity (device, inode, change time),
                              so that fini removes only that file */
    ev_io accept_w;    /* server_accept_cb */
    ev_timer resume_w; /* server_resume_cb: accepting again after EMFILE */
    struct conn *conns;
    unsigned nconns;
} server = { .fd = -1 };

/* what the handlers read (ctlcmd.h): written here only */
#define settings ctlcmd_server
static bool no_children; /* ctl_test_answer: commands never fork */

static cJSON *
must(cJSON *v)
{
    if (!v)
        abort();
    return v;
}

/* ---- who the peer is (the command-specific checks: ctlcmd_authorise) ---- */

/* Has uid an entry in the user database? A lookup that fails counts as
 * none: the peer then shares the pool, which only ever tightens its share. */
static bool
uid_known(uid_t uid)
{
    long hint = sysconf(_SC_GETPW_R_SIZE_MAX);
    size_t size = hint > 0 && hint < PW_BUF_MAX ? (size_t)hint : 16384;
    struct passwd pw, *found = NULL;
    char *buf = NULL;
    int r;

    for (;;) {
        buf = xrealloc(buf, size);
        r = getpwuid_r(uid, &pw, buf, size, &found);
        if (r != ERANGE || size >= PW_BUF_MAX)
            break;
        size *= 2;
    }
    free(buf);
    return r == 0 && found;
}

struct proto_share
ctl_peer_share(const struct ucred *cred, const gid_t *groups, size_t ngroups)
{
    struct proto_share s = { .cls = PROTO_CLASS_OTHER, .key = cred->uid };

    if (cred->uid == 0) {
        s.cls = PROTO_CLASS_ROOT;
        return s;
    }
    if (cred->uid == geteuid())
        s.cls = PROTO_CLASS_SERVICE;
    else if (ctlcmd_in_control_group(cred, groups, ngroups))
        s.cls = PROTO_CLASS_SERVICE;
    /* esd's own uid keys itself even without an entry (DynamicUser=). */
    if (cred->uid != geteuid() && !uid_known(cred->uid))
        s.key = PROTO_SHARE_POOL;
    return s;
}

/* ---- operations in children ---- */

static bool conn_flush(struct conn *c);
static bool conn_process(struct conn *c);
static void conn_close(struct conn *c, const char *why);

static void
op_event(void *ctx, cJSON *ev)
{
    struct conn *c = ctx;
    cJSON *m = must(cJSON_CreateObject()), *x;

    json_add_int(m, "v", PROTO_VERSION);
    json_add_int(m, "id", c->op_id);
    json_add_str(m, "event", cJSON_HasObjectItem(ev, "data") ? "data" : "progress");
    while ((x = ev->child)) {
        cJSON_DetachItemViaPointer(ev, x);
        if (!strcmp(x->string, "v") || !strcmp(x->string, "id") || !strcmp(x->string, "event"))
            cJSON_Delete(x);
        else
            cJSON_AddItemToObject(m, x->string, x);
    }
    cJSON_Delete(ev);
    proto_frame(m, &c->out);
    cJSON_Delete(m);
    if (!conn_flush(c))
        return;
    if (c->op && c->out.len - c->sent > HOLD_BYTES) {
        opchild_hold(c->op, true);
        ev_io_start(server.loop, &c->write_w);
    }
}

static void
op_done(void *ctx, cJSON *result, const char *code, const char *message)
{
    struct conn *c = ctx;
    cJSON *reply;

    c->op = NULL;
    reply = ctlcmd_op_reply(c, result, code, message);
    proto_frame(reply, &c->out);
    cJSON_Delete(reply);
    /* requests are idle-timed again */
    c->idle_w.repeat = settings.idle_secs;
    ev_timer_again(server.loop, &c->idle_w);
    if (conn_flush(c))
        conn_process(c);
}

static const struct opchild_ops op_callbacks = { op_event, op_done };

static void
op_start(struct conn *c, enum cmd_id id, const cJSON *args, const struct jobref *jr,
         long long req_id, const char **code, struct esd_err *err)
{
    struct ident who;
    struct spawn_cred cred;

    if (no_children) {
        *code = PROTO_E_INTERNAL;
        err_set(err, -ENOSYS, "operations are not run here");
        return;
    }
    if (ctlcmd_ident(c, jr, &who, &cred, err) < 0) {
        *code = PROTO_E_DENIED;
        return;
    }
    c->op = opchild_start(id, args, &who, &c->share, &op_callbacks, c, code, err);
    spawn_cred_free(&cred);
    if (!c->op)
        return;
    c->op_id = req_id;
    c->op_cmd = id;
    *code = NULL;
    /* while it runs the connection is not idle; a hangup is looked for */
    c->idle_w.repeat = HANGUP_CHECK_SECS;
    ev_timer_again(server.loop, &c->idle_w);
    log_info(NULL, "control: %s %s for uid %u pid %d", cmd_table[id].name,
             jr && jr->dir ? jr->dir : "", (unsigned)c->cred.uid, (int)c->cred.pid);
}

/* ---- dispatch ---- */

/* The reply to one request line (the caller owns it), or NULL when an
 * operation was started for it (its reply comes later). */
static cJSON *
conn_answer(struct conn *c, const char *line, size_t len)
{
    struct proto_request req;
    const struct cmd_def *cmd;
    const char *code = PROTO_E_INTERNAL;
    struct jobref jr = { 0 };
    struct esd_err err;
    cJSON *result = NULL, *reply = NULL;
    ctlcmd_fn *fn;
    int r;

    err_clear(&err);
    r = proto_parse_request(line, len, &req, &err);
    if (r < 0) {
        log_debug(NULL, "control request from uid %u pid %d refused: %s", (unsigned)c->cred.uid,
                  (int)c->cred.pid, err.msg);
        return proto_reply_error(req.id, proto_error_code(r), err.msg);
    }
    cmd = cmd_find(req.cmd);
    /* (check_ctl: a handler exactly for the commands marked CMDF_DAEMON) */
    fn = cmd ? ctlcmd_handler(cmd->id) : NULL;
    if (!fn) {
        err_set(&err, -EINVAL,
                cmd ? "%.100s runs in esctl only, not in esd" : "unknown command \"%.100s\"",
                req.cmd);
        reply = proto_reply_error(req.id, PROTO_E_UNKNOWN_COMMAND, err.msg);
        goto out;
    }
    if (cmd_args_check(cmd, req.args, &err) < 0) {
        reply = proto_reply_error(req.id, PROTO_E_BAD_ARGS, err.msg);
        goto out;
    }
    if (ctlcmd_authorise(c, cmd, &req, &jr, &code, &err) < 0) {
        ctlcmd_log_refusal(c, cmd->name, code, err.msg);
        reply = proto_reply_error(req.id, code, err.msg);
        goto out;
    }
    result = fn(c, cmd, req.args, &jr, req.id, &code, &err);
    if (result) {
        reply = proto_reply_ok(req.id, result);
    } else if (code) {
        ctlcmd_log_refusal(c, cmd->name, code, err.msg);
        reply = proto_reply_error(req.id, code, err.msg);
    }
out:
    ctlcmd_jobref_free(&jr);
    proto_request_free(&req);
    return reply;
}

static void
conn_close(struct conn *c, const char *why)
{
    struct ev_loop *loop = server.loop;

    log_debug(NULL, "control connection from uid %u pid %d closed: %s", (unsigned)c->cred.uid,
              (int)c->cred.pid, why);
    if (c->op) {
        log_info(NULL, "control: %s for uid %u pid %d cancelled: %s", cmd_table[c->op_cmd].name,
                 (unsigned)c->cred.uid, (int)c->cred.pid, why);
        opchild_cancel(c->op);
        c->op = NULL;
    }
    ev_io_stop(loop, &c->read_w);
    ev_io_stop(loop, &c->write_w);
    ev_timer_stop(loop, &c->idle_w);
    close(c->fd);
    if (c->prev)
        c->prev->next = c->next;
    else
        server.conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    server.nconns--;
    buf_free(&c->in);
    buf_free(&c->out);
    cJSON_Delete(c->then);
    free(c->groups);
    free(c);
}

/* Sends what the peer takes of c->out. Returns false if c was closed. */
static bool
conn_flush(struct conn *c)
{
    while (c->sent < c->out.len) {
        ssize_t n =
            send(c->fd, c->out.p + c->sent, c->out.len - c->sent, MSG_NOSIGNAL | MSG_DONTWAIT);

        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return true;
            conn_close(c, errno == EPIPE || errno == ECONNRESET ? "the peer hung up"
                                                                : strerror(errno));
            return false;
        }
        c->sent += (size_t)n;
        /* A peer taking a long reply is not idle. */
        if (!c->op)
            ev_timer_again(server.loop, &c->idle_w);
    }
    if (c->out.cap > KEEP_BUF)
        buf_free(&c->out);
    buf_reset(&c->out);
    c->sent = 0;
    if (c->op)
        opchild_hold(c->op, false);
    return true;
}

/* Arms c's watchers for its state: reading requests only while no reply
 * is pending, reading (to see a hangup) while an operation runs, writing
 * while a reply is pending; closes c once it has nothing more to do.
 * Returns false if c was closed. */
static bool
conn_settle(struct conn *c)
{
    struct ev_loop *loop = server.loop;
    bool pending = c->sent < c->out.len, reading;

    if (!pending && !c->op && (c->closing || c->eof)) {
        conn_close(c, c->closing ? "after an error" : "end of input");
        return false;
    }
    if (c->op)
        reading = !c->eof && !c->closing && c->in.len - c->pos <= PROTO_MAX_MESSAGE;
    else
        reading = !pending && !c->closing && !c->eof;
    if (reading)
        ev_io_start(loop, &c->read_w);
    else
        ev_io_stop(loop, &c->read_w);
    if (pending)
        ev_io_start(loop, &c->write_w);
    else
        ev_io_stop(loop, &c->write_w);
    return true;
}

/* Answers a line that is too long and closes the connection after that. */
static bool
conn_too_large(struct conn *c)
{
    char msg[128];
    cJSON *reply;

    snprintf(msg, sizeof(msg), "request line longer than %d bytes; closing the connection",
             PROTO_MAX_MESSAGE);
    log_debug(NULL, "control connection from uid %u pid %d: %s", (unsigned)c->cred.uid,
              (int)c->cred.pid, msg);
    reply = proto_reply_error(-1, PROTO_E_TOO_LARGE, msg);
    proto_frame(reply, &c->out);
    cJSON_Delete(reply);
    c->closing = true;
    buf_free(&c->in);
    c->pos = c->scan = 0;
    return conn_flush(c);
}

/*
 * Answers the complete lines received, one at a time, as long as each reply
 * goes out at once and no operation runs (the rest wait in c->in), then
 * settles the watchers. Returns false if c was closed.
 */
static bool
conn_process(struct conn *c)
{
    while (c->sent == c->out.len && !c->closing && !c->op) {
        char *line, *nl = NULL;
        size_t len;
        cJSON *reply;

        if (c->scan < c->in.len)
            nl = memchr(c->in.p + c->scan, '\n', c->in.len - c->scan);
        if (!nl) {
            c->scan = c->in.len;
            if (c->in.len - c->pos > PROTO_MAX_MESSAGE && !conn_too_large(c))
                return false;
            break;
        }
        line = c->in.p + c->pos;
        len = (size_t)(nl - line);
        c->pos = c->scan = (size_t)(nl - c->in.p) + 1;
        if (len > PROTO_MAX_MESSAGE) {
            if (!conn_too_large(c))
                return false;
            break;
        }
        ev_timer_again(server.loop, &c->idle_w);
        reply = conn_answer(c, line, len);
        if (!reply)
            continue; /* an operation runs; its reply comes later */
        proto_frame(reply, &c->out);
        cJSON_Delete(reply);
        if (!conn_flush(c))
            return false;
    }
    /* Drop the answered lines. */
    if (c->pos > 0) {
        memmove(c->in.p, c->in.p + c->pos, c->in.len - c->pos);
        c->in.len -= c->pos;
        c->scan -= c->pos;
        c->pos = 0;
        c->in.p[c->in.len] = '\0';
    }
    if (c->in.len == 0 && c->in.cap > KEEP_BUF)
        buf_free(&c->in);
    return conn_settle(c);
}

/* Has the peer closed its end altogether (not just its writing half)? */
static bool
peer_gone(const struct conn *c)
{
    struct pollfd p = { .fd = c->fd, .events = 0 };

    return poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR));
}

static void
conn_read_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    struct conn *c = w->data;
    ssize_t n;

    buf_reserve(&c->in, READ_CHUNK);
    n = recv(c->fd, c->in.p + c->in.len, READ_CHUNK, MSG_DONTWAIT);
    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
            return;
        conn_close(c, errno == ECONNRESET ? "the peer hung up" : strerror(errno));
        return;
    }
    if (n == 0) {
        /* An unterminated last line is never answered. A peer that only
         * shut its writing half still gets the reply of a running
         * operation; one that is gone cancels it. */
        c->eof = true;
        if (c->op && peer_gone(c)) {
            conn_close(c, "the peer hung up");
            return;
        }
    } else {
        c->in.len += (size_t)n;
        c->in.p[c->in.len] = '\0';
    }
    conn_process(c);
}

static void
conn_write_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    struct conn *c = w->data;

    if (conn_flush(c))
        conn_process(c);
}

static void
conn_idle_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct conn *c = w->data;
    char why[64];

    if (c->op) {
        /* not idle: an operation runs for it; but is the peer still there? */
        if (peer_gone(c))
            conn_close(c, "the peer hung up");
        return;
    }
    snprintf(why, sizeof(why), "idle for %g s", settings.idle_secs);
    conn_close(c, why);
}

/* Answers a connection beyond a limit with one "busy" line and closes it.
 * The line is short and the socket new, so it fits in its buffer. */
static void
server_refuse(int fd, const struct ucred *cred, const char *msg)
{
    struct buf b;
    cJSON *reply;

    log_notice(NULL, "control connection from uid %u pid %d refused: %s", (unsigned)cred->uid,
               (int)cred->pid, msg);
    reply = proto_reply_error(-1, PROTO_E_BUSY, msg);
    buf_init(&b);
    proto_frame(reply, &b);
    if (send(fd, b.p, b.len, MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
        log_debug(NULL, "control socket: cannot send the busy reply: %s, ignoring",
                  strerror(errno));
    buf_free(&b);
    cJSON_Delete(reply);
    close(fd);
}

/* The peer's supplementary groups. */
static void
peer_groups(int fd, const struct ucred *cred, gid_t **ret, size_t *ret_n)
{
    socklen_t len = 64 * sizeof(gid_t);
    gid_t *g = xmalloc(len);

    *ret = NULL;
    *ret_n = 0;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g, &len) < 0) {
        if (errno != ERANGE || len > MAX_GROUPS * sizeof(gid_t)) {
            free(g);
            return;
        }
        g = xrealloc(g, len);
        if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, g, &len) < 0) {
            free(g);
            return;
        }
    }
    *ret = g;
    *ret_n = len / sizeof(gid_t);
}

static void
server_admit(int fd)
{
    socklen_t len = sizeof(struct ucred);
    struct proto_usage u = { 0 };
    struct proto_share share;
    enum proto_full full;
    struct ucred cred;
    gid_t *groups;
    size_t ngroups;
    char msg[256];
    struct conn *c;

    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 || len != sizeof(cred)) {
        log_warning(NULL,
                    "control socket: cannot read the peer's credentials: %s; "
                    "closing the connection",
                    strerror(errno));
        close(fd);
        return;
    }
    peer_groups(fd, &cred, &groups, &ngroups);
    share = ctl_peer_share(&cred, groups, ngroups);
    for (c = server.conns; c; c = c->next)
        proto_usage_add(&u, &c->share, &share);
    full = proto_share_admit(&proto_conn_limits, &u, &share);
    if (full != PROTO_FULL_NONE) {
        free(groups);
        proto_share_explain(full, &proto_conn_limits, &share, "control connections", msg,
                            sizeof(msg));
        server_refuse(fd, &cred, msg);
        return;
    }
    c = xcalloc(1, sizeof(*c));
    c->fd = fd;
    c->cred = cred;
    c->groups = groups;
    c->ngroups = ngroups;
    c->share = share;
    buf_init(&c->in);
    buf_init(&c->out);
    ev_io_init(&c->read_w, conn_read_cb, fd, EV_READ);
    ev_io_init(&c->write_w, conn_write_cb, fd, EV_WRITE);
    ev_init(&c->idle_w, conn_idle_cb);
    c->idle_w.repeat = settings.idle_secs;
    c->read_w.data = c->write_w.data = c->idle_w.data = c;
    c->next = server.conns;
    if (c->next)
        c->next->prev = c;
    server.conns = c;
    server.nconns++;
    ev_io_start(server.loop, &c->read_w);
    ev_timer_again(server.loop, &c->idle_w);
    log_debug(NULL, "control connection from uid %u gid %u pid %d (%u open)", (unsigned)cred.uid,
              (unsigned)cred.gid, (int)cred.pid, server.nconns);
}

static void
server_accept_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    for (int i = 0; i < ACCEPT_BURST; i++) {
        int fd = accept4(server.fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

        if (fd >= 0) {
            server_admit(fd);
            continue;
        }
        if (errno == EINTR || errno == ECONNABORTED)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            /* The pending connection stays readable; without a pause the
             * watcher would fire again at once. */
            log_warning(NULL, "control socket: accept: %s; not accepting for %g s", strerror(errno),
                        ACCEPT_PAUSE_SECS);
            ev_io_stop(loop, &server.accept_w);
            ev_timer_start(loop, &server.resume_w);
            return;
        }
        log_warning(NULL, "control socket: accept: %s, ignoring", strerror(errno));
        return;
    }
}

static void
server_resume_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    ev_io_start(loop, &server.accept_w);
}

/*
 * Removes a socket file left behind at sa's path by a process that is gone:
 * only a socket, and only if nothing answers on it. Anything else there is
 * an error and stays.
 */
static int
remove_stale(const struct sockaddr_un *sa, struct esd_err *err)
{
    const char *path = sa->sun_path;
    struct stat st;
    int fd, r, e;

    if (lstat(path, &st) < 0) {
        if (errno == ENOENT)
            return 0;
        return err_sys(err, -errno, "cannot check the control socket path %s", path);
    }
    if (!S_ISSOCK(st.st_mode))
        return err_set(err, -EEXIST,
                       "control socket path %s exists and is not a socket; "
                       "not removing it",
                       path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return err_sys(err, -errno, "cannot create a socket");
    r = connect(fd, (const struct sockaddr *)sa, sizeof(*sa));
    e = errno;
    close(fd);
    /* EAGAIN: a listener whose backlog is full is still a listener. */
    if (r == 0 || e == EAGAIN || e == EINPROGRESS)
        return err_set(err, -EADDRINUSE,
                       "another process listens on the control socket %s "
                       "(is esd already running?)",
                       path);
    if (e == ENOENT)
        return 0;
    if (e != ECONNREFUSED)
        return err_sys(err, -e, "cannot check the existing control socket %s", path);
    if (unlink(path) < 0 && errno != ENOENT)
        return err_sys(err, -errno, "cannot remove the stale control socket %s", path);
    log_notice(NULL, "removed the stale control socket %s", path);
    return 0;
}

/* Creates, binds (mode 0660 from the start) and listens on path. */
static int
socket_create(const char *path, const char *group, int mode, int *ret_fd, struct esd_err *err)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    struct esd_err why;
    struct stat st;
    mode_t old;
    char *dir;
    int fd, r, e;

    if (!path || !*path)
        return err_set(err, -EINVAL, "the control socket path is empty");
    if (strlen(path) >= sizeof(sa.sun_path))
        return err_set(err, -ENAMETOOLONG,
                       "control socket path %s is too long (at most %zu "
                       "bytes)",
                       path, sizeof(sa.sun_path) - 1);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    dir = fs_dirname(path);
    r = fs_mkdir_p(dir, 0755, &why);
    free(dir);
    if (r < 0)
        return err_set(err, r, "control socket %s: %s", path, why.msg);
    r = remove_stale(&sa, err);
    if (r < 0)
        return r;

    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return err_sys(err, -errno, "cannot create the control socket");
    /* No moment in which the socket file is open to others. */
    old = umask(0117);
    r = bind(fd, (const struct sockaddr *)&sa, sizeof(sa));
    e = errno;
    umask(old);
    if (r < 0) {
        close(fd);
        return err_sys(err, -e, "cannot bind the control socket %s", path);
    }
    if (chmod(path, (mode_t)mode) < 0) {
        r = err_sys(err, -errno, "cannot set the mode of the control socket %s", path);
        goto fail;
    }
    if (group && *group && geteuid() == 0) {
        struct group *gr = getgrnam(group);

        if (!gr)
            log_notice(NULL,
                       "control socket %s: group %s does not exist, so only root can "
                       "connect; continuing",
                       path, group);
        else if (chown(path, 0, gr->gr_gid) < 0) {
            r = err_sys(err, -errno, "cannot give the control socket %s to group %s", path, group);
            goto fail;
        }
    }
    if (listen(fd, SOMAXCONN) < 0) {
        r = err_sys(err, -errno, "cannot listen on the control socket %s", path);
        goto fail;
    }
    if (lstat(path, &st) < 0) {
        r = err_sys(err, -errno, "cannot check the control socket %s", path);
        goto fail;
    }
    server.st = st;
    *ret_fd = fd;
    return 0;

fail:
    unlink(path);
    close(fd);
    return r;
}

int
ctl_init(struct ev_loop *loop, const struct esd_conf *c, int activated_fd, struct esd_err *err)
{
    int fd, r;

    if (server.loop)
        return err_set(err, -EALREADY, "the control socket is already open");
    if (activated_fd >= 0) {
        int fl = fcntl(activated_fd, F_GETFL);

        if (fl < 0 || fcntl(activated_fd, F_SETFL, fl | O_NONBLOCK) < 0 ||
            fcntl(activated_fd, F_SETFD, FD_CLOEXEC) < 0)
            return err_sys(err, -errno,
                           "cannot set up the control socket from systemd "
                           "(fd %d)",
                           activated_fd);
        fd = activated_fd;
        server.activated = true;
    } else {
        r = socket_create(c->socket_path, c->socket_group, c->socket_mode ? c->socket_mode : 0660,
                          &fd, err);
        if (r < 0)
            return r;
        server.path = xstrdup(c->socket_path);
    }
    server.loop = loop;
    server.fd = fd;
    settings.node = xstrdup(c->node_name ? c->node_name : "");
    settings.op_start = op_start;
    ctl_reconfigure(c);
    ev_io_init(&server.accept_w, server_accept_cb, fd, EV_READ);
    ev_timer_init(&server.resume_w, server_resume_cb, ACCEPT_PAUSE_SECS, 0.);
    ev_io_start(loop, &server.accept_w);
    log_info(NULL, "control socket: listening on %s",
             server.activated ? "the socket passed by systemd" : server.path);
    return 0;
}

void
ctl_reconfigure(const struct esd_conf *c)
{
    struct group *gr = c->socket_group && *c->socket_group ? getgrnam(c->socket_group) : NULL;

    settings.conf = c;
    settings.have_group = gr != NULL;
    settings.group = gr ? gr->gr_gid : 0;
}

void
ctl_set_status(cJSON *(*fn)(void))
{
    settings.status = fn;
}

void
ctl_set_reload(int (*fn)(struct esd_err *err))
{
    settings.reload = fn;
}

/* Inode numbers are reused at once on some file systems; a file created
 * since has a later change time. */
static bool
same_file(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino &&
           a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

void
ctl_fini(void)
{
    struct stat st;

    if (!server.loop)
        return;
    while (server.conns)
        conn_close(server.conns, "esd is shutting down");
    ev_io_stop(server.loop, &server.accept_w);
    ev_timer_stop(server.loop, &server.resume_w);
    close(server.fd);
    /* Only our own socket: another esd may have taken the path since. */
    if (server.path && lstat(server.path, &st) == 0 && same_file(&st, &server.st) &&
        unlink(server.path) < 0)
        log_warning(NULL, "cannot remove the control socket %s: %s, ignoring", server.path,
                    strerror(errno));
    free(server.path);
    free(settings.node);
    settings.node = NULL;
    settings.conf = NULL;
    settings.op_start = NULL;
    memset(&server, 0, sizeof(server));
    server.fd = -1;
}

void
ctl_test_set_idle(double secs)
{
    settings.idle_secs = secs;
}

cJSON *
ctl_test_answer(const struct ucred *peer, const gid_t *groups, size_t ngroups, const char *line,
                size_t len)
{
    struct conn c;
    cJSON *reply;

    memset(&c, 0, sizeof(c));
    c.fd = -1;
    c.cred = *peer;
    if (ngroups) {
        c.groups = xmalloc(ngroups * sizeof(gid_t));
        memcpy(c.groups, groups, ngroups * sizeof(gid_t));
        c.ngroups = ngroups;
    }
    c.share = ctl_peer_share(peer, groups, ngroups);
    no_children = true;
    reply = conn_answer(&c, line, len);
    no_children = false;
    free(c.groups);
    cJSON_Delete(c.then);
    return reply ? reply : proto_reply_error(-1, PROTO_E_INTERNAL, "no reply");
}
