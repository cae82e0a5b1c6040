/*
 * ctl: the control server. A listening UNIX socket (created here with mode
 * 0660 before anyone can connect, or handed over by systemd) and up to
 * PROTO_MAX_CONNECTIONS connections, each an object that embeds its read and
 * write watchers and its idle timer. Requests are read as lines of at most
 * PROTO_MAX_MESSAGE bytes, answered from a command table, and the replies
 * are written without ever blocking: what the peer does not take yet waits
 * in the connection's buffer, and the connection reads nothing more until it
 * has gone out, so a peer that does not read cannot make esd hold more than
 * one reply for it. The protocol is defined in common/proto.h.
 */
#include "ctl.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "fsutil.h"
#include "json.h"
#include "log.h"
#include "proto.h"

#define READ_CHUNK 65536       /* bytes read at once from a connection */
#define ACCEPT_BURST 64        /* connections accepted in one callback */
#define ACCEPT_PAUSE_SECS 1.0  /* after running out of descriptors */
#define KEEP_BUF (256 * 1024)  /* larger buffers are freed once empty */

/* One client connection. */
struct conn {
    int fd;
    struct ucred cred;  /* the peer, from SO_PEERCRED at accept */
    ev_io read_w;       /* readable: conn_read_cb */
    ev_io write_w;      /* writable while a reply is pending: conn_write_cb */
    ev_timer idle_w;    /* idle_secs without a complete request or a reply
                           making progress: conn_idle_cb */
    struct buf in;      /* bytes received; in.p[pos..] not yet answered */
    size_t pos;         /* start of the current (incomplete) line */
    size_t scan;        /* in.p[pos..scan) holds no "\n" */
    struct buf out;     /* reply bytes; out.p[sent..] not yet sent */
    size_t sent;
    bool eof;           /* the peer will send nothing more */
    bool closing;       /* close once out has gone */
    struct conn *prev, *next;
};

/* The server: the listening socket and its connections. */
static struct {
    struct ev_loop *loop;  /* NULL: not initialised */
    int fd;
    bool activated;        /* fd came from systemd */
    char *path;            /* the socket file we created (NULL if activated) */
    struct stat st;        /* and its identity (device, inode, change time),
                              so that fini removes only that file */
    char *node;            /* for ping */
    ev_io accept_w;        /* server_accept_cb */
    ev_timer resume_w;     /* server_resume_cb: accepting again after EMFILE */
    struct conn *conns;
    unsigned nconns;
} server = { .fd = -1 };

static cJSON *(*status_fn)(void);
static double idle_secs = PROTO_IDLE_SECS;

/* Commands. run returns the result (the caller owns it), or NULL with
 * *ret_code set to a PROTO_E_* code and err to the message. */
struct command {
    const char *name;
    cJSON *(*run)(const struct conn *c, const cJSON *args, const char **ret_code,
                  struct esd_err *err);
};

static cJSON *
cmd_ping(const struct conn *c, const cJSON *args, const char **ret_code, struct esd_err *err)
{
    cJSON *r = cJSON_CreateObject();

    if (!r)
        abort();
    json_add_bool(r, "pong", true);
    json_add_str(r, "version", ESD_VERSION);
    json_add_str(r, "node", server.node);
    json_add_int(r, "pid", (long long)getpid());
    return r;
}

static cJSON *
cmd_status(const struct conn *c, const cJSON *args, const char **ret_code, struct esd_err *err)
{
    cJSON *r = status_fn ? status_fn() : NULL;

    if (!r) {
        *ret_code = PROTO_E_INTERNAL;
        err_set(err, -ENODATA, "the daemon's status is not available");
    }
    return r;
}

static const struct command commands[] = {
    { PROTO_CMD_PING, cmd_ping },
    { PROTO_CMD_STATUS, cmd_status },
};

static const struct command *
command_find(const char *name)
{
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (!strcmp(commands[i].name, name))
            return &commands[i];
    return NULL;
}

/* The reply to one request line (the caller owns it). */
static cJSON *
conn_answer(const struct conn *c, const char *line, size_t len)
{
    struct proto_request req;
    const struct command *cmd;
    const char *code = PROTO_E_INTERNAL;
    struct esd_err err;
    cJSON *result, *reply;
    int r;

    err_clear(&err);
    r = proto_parse_request(line, len, &req, &err);
    if (r < 0) {
        log_debug(NULL, "control request from uid %u pid %d refused: %s",
                  (unsigned)c->cred.uid, (int)c->cred.pid, err.msg);
        return proto_reply_error(req.id, proto_error_code(r), err.msg);
    }
    cmd = command_find(req.cmd);
    if (!cmd) {
        err_set(&err, -EINVAL, "unknown command \"%.100s\"", req.cmd);
        reply = proto_reply_error(req.id, PROTO_E_UNKNOWN_COMMAND, err.msg);
    } else if ((result = cmd->run(c, req.args, &code, &err))) {
        reply = proto_reply_ok(req.id, result);
    } else {
        reply = proto_reply_error(req.id, code, err.msg);
    }
    proto_request_free(&req);
    return reply;
}

static void
conn_close(struct conn *c, const char *why)
{
    struct ev_loop *loop = server.loop;

    log_debug(NULL, "control connection from uid %u pid %d closed: %s", (unsigned)c->cred.uid,
              (int)c->cred.pid, why);
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
    free(c);
}

/* Sends what the peer takes of c->out. Returns false if c was closed. */
static bool
conn_flush(struct conn *c)
{
    while (c->sent < c->out.len) {
        ssize_t n = send(c->fd, c->out.p + c->sent, c->out.len - c->sent,
                         MSG_NOSIGNAL | MSG_DONTWAIT);

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
        ev_timer_again(server.loop, &c->idle_w);
    }
    if (c->out.cap > KEEP_BUF)
        buf_free(&c->out);
    buf_reset(&c->out);
    c->sent = 0;
    return true;
}

/* Arms c's watchers for its state: reading only while no reply is pending,
 * writing while one is; closes c once it has nothing more to do. Returns
 * false if c was closed. */
static bool
conn_settle(struct conn *c)
{
    struct ev_loop *loop = server.loop;
    bool pending = c->sent < c->out.len;

    if (!pending && (c->closing || c->eof)) {
        conn_close(c, c->closing ? "after an error" : "end of input");
        return false;
    }
    if (pending || c->closing || c->eof)
        ev_io_stop(loop, &c->read_w);
    else
        ev_io_start(loop, &c->read_w);
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
 * goes out at once (the rest wait in c->in until the peer has taken it),
 * then settles the watchers. Returns false if c was closed.
 */
static bool
conn_process(struct conn *c)
{
    while (c->sent == c->out.len && !c->closing) {
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
        /* An unterminated last line is never answered. */
        c->eof = true;
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
    char why[64];

    snprintf(why, sizeof(why), "idle for %g s", idle_secs);
    conn_close(w->data, why);
}

/* Answers a connection beyond the limit with one "busy" line and closes it.
 * The line is short and the socket new, so it fits in its buffer. */
static void
server_refuse(int fd, const struct ucred *cred)
{
    struct buf b;
    cJSON *reply;
    char msg[128];

    snprintf(msg, sizeof(msg), "too many control connections (at most %d); try again later",
             PROTO_MAX_CONNECTIONS);
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

static void
server_admit(int fd)
{
    socklen_t len = sizeof(struct ucred);
    struct ucred cred;
    struct conn *c;

    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 || len != sizeof(cred)) {
        log_warning(NULL, "control socket: cannot read the peer's credentials: %s; "
                    "closing the connection", strerror(errno));
        close(fd);
        return;
    }
    if (server.nconns >= PROTO_MAX_CONNECTIONS) {
        server_refuse(fd, &cred);
        return;
    }
    c = xcalloc(1, sizeof(*c));
    c->fd = fd;
    c->cred = cred;
    buf_init(&c->in);
    buf_init(&c->out);
    ev_io_init(&c->read_w, conn_read_cb, fd, EV_READ);
    ev_io_init(&c->write_w, conn_write_cb, fd, EV_WRITE);
    ev_init(&c->idle_w, conn_idle_cb);
    c->idle_w.repeat = idle_secs;
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
            log_warning(NULL, "control socket: accept: %s; not accepting for %g s",
                        strerror(errno), ACCEPT_PAUSE_SECS);
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
        return err_set(err, -EEXIST, "control socket path %s exists and is not a socket; "
                       "not removing it", path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return err_sys(err, -errno, "cannot create a socket");
    r = connect(fd, (const struct sockaddr *)sa, sizeof(*sa));
    e = errno;
    close(fd);
    /* EAGAIN: a listener whose backlog is full is still a listener. */
    if (r == 0 || e == EAGAIN || e == EINPROGRESS)
        return err_set(err, -EADDRINUSE, "another process listens on the control socket %s "
                       "(is esd already running?)", path);
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
socket_create(const char *path, const char *group, int *ret_fd, struct esd_err *err)
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
        return err_set(err, -ENAMETOOLONG, "control socket path %s is too long (at most %zu "
                       "bytes)", path, sizeof(sa.sun_path) - 1);
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
    if (chmod(path, 0660) < 0) {
        r = err_sys(err, -errno, "cannot set the mode of the control socket %s", path);
        goto fail;
    }
    if (group && *group && geteuid() == 0) {
        struct group *gr = getgrnam(group);

        if (!gr)
            log_notice(NULL, "control socket %s: group %s does not exist, so only root can "
                       "connect; continuing", path, group);
        else if (chown(path, 0, gr->gr_gid) < 0) {
            r = err_sys(err, -errno, "cannot give the control socket %s to group %s", path,
                        group);
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
ctl_init(struct ev_loop *loop, const struct esd_conf *c, int activated_fd,
         struct esd_err *err)
{
    int fd, r;

    if (server.loop)
        return err_set(err, -EALREADY, "the control socket is already open");
    if (activated_fd >= 0) {
        int fl = fcntl(activated_fd, F_GETFL);

        if (fl < 0 || fcntl(activated_fd, F_SETFL, fl | O_NONBLOCK) < 0 ||
            fcntl(activated_fd, F_SETFD, FD_CLOEXEC) < 0)
            return err_sys(err, -errno, "cannot set up the control socket from systemd "
                           "(fd %d)", activated_fd);
        fd = activated_fd;
        server.activated = true;
    } else {
        r = socket_create(c->socket_path, c->socket_group, &fd, err);
        if (r < 0)
            return r;
        server.path = xstrdup(c->socket_path);
    }
    server.loop = loop;
    server.fd = fd;
    server.node = xstrdup(c->node_name ? c->node_name : "");
    ev_io_init(&server.accept_w, server_accept_cb, fd, EV_READ);
    ev_timer_init(&server.resume_w, server_resume_cb, ACCEPT_PAUSE_SECS, 0.);
    ev_io_start(loop, &server.accept_w);
    log_info(NULL, "control socket: listening on %s",
             server.activated ? "the socket passed by systemd" : server.path);
    return 0;
}

void
ctl_set_status(cJSON *(*fn)(void))
{
    status_fn = fn;
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
    free(server.node);
    memset(&server, 0, sizeof(server));
    server.fd = -1;
}

void
ctl_test_set_idle(double secs)
{
    idle_secs = secs;
}
