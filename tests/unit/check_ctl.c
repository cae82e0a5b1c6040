/*
 * check_ctl: the control server on a real libev default loop, with its
 * clients in the same process on the same loop (non-blocking sockets with
 * their own watchers), so every wait is bounded by an ev_timer deadline:
 * ping and status, errors that keep the connection (malformed JSON,
 * unknown command, version mismatch) and the one that ends it (a line over
 * 1 MiB), the connection limit, the idle timeout, replies larger than the
 * socket buffer to a peer that does not read yet, peers that hang up, and
 * the socket file: mode 0660, group, stale sockets replaced, anything else
 * left alone, removed by ctl_fini, and sockets passed by systemd; the fair
 * shares of connections and operations (common/proto.h) as a pure decision
 * over tables of what is held, the share a peer gets (uids without an
 * account pooled), and that esd's own non-root uid is not privileged; and
 * that the handler table (daemon/ctlcmd.c) covers exactly the commands
 * cmds.h marks as served by esd.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <ev.h>

#include "cmds.h"
#include "config.h"
#include "ctl.h"
#include "ctlcmd.h"
#include "fsutil.h"
#include "json.h"
#include "proto.h"
#include "testutil.h"
#include "util.h"

#define DEADLINE 10.0 /* seconds any single wait may take */

static char *tmp;
static struct ev_loop *loop;
static struct esd_conf conf;

/* ---- the event loop, bounded ------------------------------------------ */

/* Runs the loop until done(arg) or secs have passed; returns done(arg). */
static bool
run_until(bool (*done)(void *), void *arg, double secs)
{
    return tu_run_until(loop, done, arg, secs);
}

/* Serves for secs (an ev timer, not a sleep: the server keeps working). */
static void
run_for(double secs)
{
    run_until(NULL, NULL, secs);
}

/* ---- an in-process client ---------------------------------------------- */

struct client {
    int fd;
    ev_io read_w, write_w;
    struct buf in;  /* received, not yet taken */
    struct buf out; /* to send; out.p[sent..] pending */
    size_t sent;
    bool eof;      /* end of input or a read error */
    int write_err; /* errno of a failed send (EPIPE once the server closed) */
};

static void
client_read_cb(struct ev_loop *l, ev_io *w, int revents)
{
    struct client *cl = w->data;
    char chunk[65536];
    ssize_t n = recv(cl->fd, chunk, sizeof(chunk), MSG_DONTWAIT);

    if (n > 0) {
        buf_append(&cl->in, chunk, (size_t)n);
        return;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    cl->eof = true;
    ev_io_stop(l, &cl->read_w);
}

static void
client_write_cb(struct ev_loop *l, ev_io *w, int revents)
{
    struct client *cl = w->data;

    while (cl->sent < cl->out.len) {
        ssize_t n =
            send(cl->fd, cl->out.p + cl->sent, cl->out.len - cl->sent, MSG_NOSIGNAL | MSG_DONTWAIT);

        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR)
                return;
            cl->write_err = errno;
            break;
        }
        cl->sent += (size_t)n;
    }
    ev_io_stop(l, &cl->write_w);
}

/* Connects to path (non-blocking) and starts reading. */
static struct client *
client_open_path(const char *path)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    struct client *cl = xcalloc(1, sizeof(*cl));

    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    cl->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    ck_assert_int_ge(cl->fd, 0);
    ck_assert_msg(connect(cl->fd, (struct sockaddr *)&sa, sizeof(sa)) == 0, "connect %s: %s", path,
                  strerror(errno));
    buf_init(&cl->in);
    buf_init(&cl->out);
    ev_io_init(&cl->read_w, client_read_cb, cl->fd, EV_READ);
    ev_io_init(&cl->write_w, client_write_cb, cl->fd, EV_WRITE);
    cl->read_w.data = cl->write_w.data = cl;
    ev_io_start(loop, &cl->read_w);
    return cl;
}

static struct client *
client_open(void)
{
    return client_open_path(conf.socket_path);
}

static void
client_close(struct client *cl)
{
    ev_io_stop(loop, &cl->read_w);
    ev_io_stop(loop, &cl->write_w);
    close(cl->fd);
    buf_free(&cl->in);
    buf_free(&cl->out);
    free(cl);
}

static bool
all_sent(void *arg)
{
    struct client *cl = arg;

    return cl->sent == cl->out.len || cl->write_err;
}

static bool
has_line(void *arg)
{
    struct client *cl = arg;

    return memchr(cl->in.p ? cl->in.p : "", '\n', cl->in.len) != NULL;
}

static bool
at_eof(void *arg)
{
    return ((struct client *)arg)->eof;
}

/* Queues n bytes to send; they go out as the loop runs. */
static void
client_queue(struct client *cl, const char *data, size_t n)
{
    buf_append(&cl->out, data, n);
    ev_io_start(loop, &cl->write_w);
}

/* Sends s and waits until the socket has taken all of it. */
static void
client_send(struct client *cl, const char *s)
{
    client_queue(cl, s, strlen(s));
    ck_assert_msg(run_until(all_sent, cl, DEADLINE), "request not sent");
    ck_assert_int_eq(cl->write_err, 0);
}

/* Waits for the next line and parses it (the caller frees it). */
static cJSON *
client_line(struct client *cl)
{
    struct esd_err err;
    cJSON *v;
    char *nl;
    size_t len;

    ck_assert_msg(run_until(has_line, cl, DEADLINE), "no reply (eof %d, %zu bytes: %.200s)",
                  cl->eof, cl->in.len, cl->in.p ? cl->in.p : "");
    nl = memchr(cl->in.p, '\n', cl->in.len);
    len = (size_t)(nl - cl->in.p);
    ck_assert_msg(json_parse_object(cl->in.p, len, "reply", &v, &err) == 0, "%s", err.msg);
    memmove(cl->in.p, nl + 1, cl->in.len - len - 1);
    cl->in.len -= len + 1;
    cl->in.p[cl->in.len] = '\0';
    return v;
}

static cJSON *
client_call(struct client *cl, const char *request)
{
    client_send(cl, request);
    return client_line(cl);
}

/* Waits for the server to close the connection, with nothing more sent. */
static void
client_expect_eof(struct client *cl)
{
    ck_assert_msg(run_until(at_eof, cl, DEADLINE), "the connection stayed open");
    ck_assert_msg(cl->in.len == 0, "unexpected data: %.200s", cl->in.p);
}

/* ---- checking replies -------------------------------------------------- */

static long long
get_int(const cJSON *o, const char *key)
{
    long long v;

    ck_assert_msg(json_get_int(o, key, &v) == 0, "no integer \"%s\"", key);
    return v;
}

/* Checks an ok reply to id and returns its result (owned by r). */
static const cJSON *
expect_ok(const cJSON *r, long long id)
{
    bool ok = false;
    const cJSON *result = cJSON_GetObjectItem(r, "result");

    ck_assert_int_eq(get_int(r, "v"), PROTO_VERSION);
    ck_assert_int_eq(get_int(r, "id"), id);
    ck_assert(json_get_bool(r, "ok", &ok) && ok);
    ck_assert(cJSON_IsObject(result));
    ck_assert_ptr_null(cJSON_GetObjectItem(r, "error"));
    return result;
}

/* Checks an error reply and returns its message (owned by r). */
static const char *
expect_error(const cJSON *r, long long id, const char *code)
{
    bool ok = true;
    const cJSON *e = cJSON_GetObjectItem(r, "error");

    ck_assert_int_eq(get_int(r, "v"), PROTO_VERSION);
    ck_assert_int_eq(get_int(r, "id"), id);
    ck_assert(json_get_bool(r, "ok", &ok) && !ok);
    ck_assert(cJSON_IsObject(e));
    ck_assert_str_eq(json_get_str(e, "code"), code);
    ck_assert_ptr_nonnull(json_get_str(e, "message"));
    ck_assert_ptr_null(cJSON_GetObjectItem(r, "result"));
    return json_get_str(e, "message");
}

static void
expect_ping(struct client *cl, long long id)
{
    char req[128];
    cJSON *r;

    snprintf(req, sizeof(req), "{\"v\":1,\"id\":%lld,\"cmd\":\"ping\"}\n", id);
    r = client_call(cl, req);
    expect_ok(r, id);
    cJSON_Delete(r);
}

/* ---- fixtures ---------------------------------------------------------- */

static void
setup(void)
{
    json_init();
    tmp = tu_tmpdir();
    loop = ev_default_loop(0);
    memset(&conf, 0, sizeof(conf));
    conf.node_name = xstrdup("node-a");
    conf.socket_path = xasprintf("%s/run/esd/esd.sock", tmp);
    conf.socket_group = NULL;
}

static void
teardown(void)
{
    ctl_fini();
    ctl_set_status(NULL);
    ctl_test_set_idle(PROTO_IDLE_SECS);
    fs_rm_rf(tmp);
    free(tmp);
    free(conf.node_name);
    free(conf.socket_path);
    free(conf.socket_group);
}

static void
start(void)
{
    struct esd_err err;

    err_clear(&err);
    ck_assert_msg(ctl_init(loop, &conf, -1, &err) == 0, "ctl_init: %s", err.msg);
}

/* A socket bound at path; listening if listening, else left stale after
 * close. Returns the fd (-1 when closed). */
static int
bind_at(const char *path, bool listening)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    char *dir = fs_dirname(path);

    ck_assert_int_eq(fs_mkdir_p(dir, 0755, NULL), 0);
    free(dir);
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    if (listening) {
        ck_assert_int_eq(listen(fd, 8), 0);
        return fd;
    }
    close(fd);
    return -1;
}

/* ---- requests ---------------------------------------------------------- */

START_TEST(test_ping)
{
    struct client *cl;
    const cJSON *res;
    bool pong = false;
    cJSON *r;

    start();
    cl = client_open();
    r = client_call(cl, "{\"v\":1,\"id\":1,\"cmd\":\"ping\"}\n");
    res = expect_ok(r, 1);
    ck_assert(json_get_bool(res, "pong", &pong) && pong);
    ck_assert_str_eq(json_get_str(res, "version"), ESD_VERSION);
    ck_assert_str_eq(json_get_str(res, "node"), "node-a");
    ck_assert_int_eq(get_int(res, "pid"), getpid());
    cJSON_Delete(r);
    /* Several requests on one connection, an args object, a large id. */
    r = client_call(cl, "{\"v\":1,\"id\":9007199254740993,\"cmd\":\"ping\",\"args\":{}}\n");
    expect_ok(r, 9007199254740993LL);
    cJSON_Delete(r);
    /* version: the limits a client plans by, under their documented keys */
    r = client_call(cl, "{\"v\":1,\"id\":2,\"cmd\":\"version\"}\n");
    res = expect_ok(r, 2);
    ck_assert_int_eq(get_int(res, "protocol"), PROTO_VERSION);
    ck_assert_int_eq(get_int(res, "max_message"), PROTO_MAX_MESSAGE);
    ck_assert_int_eq(get_int(res, "idle_secs"), (long long)PROTO_IDLE_SECS);
    ck_assert_int_eq(get_int(res, "max_connections"), proto_conn_limits.max);
    cJSON_Delete(r);
    client_close(cl);
}
END_TEST

static cJSON *
status_two_jobs(void)
{
    cJSON *s = cJSON_CreateObject();

    json_add_int(s, "jobs", 2);
    json_add_str(s, "state", "idle");
    return s;
}

static cJSON *
status_none(void)
{
    return NULL;
}

START_TEST(test_status)
{
    struct client *cl;
    const cJSON *res;
    cJSON *r;

    start();
    cl = client_open();
    /* No status function yet. */
    r = client_call(cl, "{\"v\":1,\"id\":1,\"cmd\":\"status\"}\n");
    expect_error(r, 1, PROTO_E_INTERNAL);
    cJSON_Delete(r);

    ctl_set_status(status_two_jobs);
    r = client_call(cl, "{\"v\":1,\"id\":2,\"cmd\":\"status\"}\n");
    res = expect_ok(r, 2);
    ck_assert_int_eq(get_int(res, "jobs"), 2);
    ck_assert_str_eq(json_get_str(res, "state"), "idle");
    cJSON_Delete(r);

    /* A status function that fails. */
    ctl_set_status(status_none);
    r = client_call(cl, "{\"v\":1,\"id\":3,\"cmd\":\"status\"}\n");
    expect_error(r, 3, PROTO_E_INTERNAL);
    cJSON_Delete(r);
    client_close(cl);
}
END_TEST

START_TEST(test_unknown_command)
{
    struct client *cl;
    cJSON *r;

    start();
    cl = client_open();
    r = client_call(cl, "{\"v\":1,\"id\":4,\"cmd\":\"frobnicate\",\"args\":{\"x\":1}}\n");
    ck_assert_ptr_nonnull(strstr(expect_error(r, 4, PROTO_E_UNKNOWN_COMMAND), "frobnicate"));
    cJSON_Delete(r);
    expect_ping(cl, 5);
    client_close(cl);
}
END_TEST

START_TEST(test_malformed_then_valid)
{
    static const char *const bad[] = {
        "{not json\n",
        "\n",
        "[1,2]\n",
        "{\"v\":1,\"cmd\":\"ping\"}\n",
        "{\"v\":1,\"id\":\"x\",\"cmd\":\"ping\"}\n",
        "{\"v\":1,\"id\":6,\"cmd\":\"\"}\n",
        "{\"v\":1,\"id\":7,\"cmd\":\"ping\",\"args\":[]}\n",
    };
    static const long long ids[] = { -1, -1, -1, -1, -1, 6, 7 };
    struct client *cl;
    cJSON *r;

    start();
    cl = client_open();
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        r = client_call(cl, bad[i]);
        expect_error(r, ids[i], PROTO_E_BAD_REQUEST);
        cJSON_Delete(r);
    }
    expect_ping(cl, 2);

    /* Pipelined: a bad line and two requests in one write, answered in
     * order. */
    client_send(cl, "garbage\n{\"v\":1,\"id\":10,\"cmd\":\"ping\"}\n"
                    "{\"v\":1,\"id\":11,\"cmd\":\"nope\"}\n");
    r = client_line(cl);
    expect_error(r, -1, PROTO_E_BAD_REQUEST);
    cJSON_Delete(r);
    r = client_line(cl);
    expect_ok(r, 10);
    cJSON_Delete(r);
    r = client_line(cl);
    expect_error(r, 11, PROTO_E_UNKNOWN_COMMAND);
    cJSON_Delete(r);

    /* A request split over several writes. */
    client_send(cl, "{\"v\":1,\"id\":12,");
    run_for(0.05);
    ck_assert_int_eq(cl->in.len, 0);
    client_send(cl, "\"cmd\":\"ping\"}");
    run_for(0.05);
    ck_assert_int_eq(cl->in.len, 0);
    r = client_call(cl, "\n");
    expect_ok(r, 12);
    cJSON_Delete(r);
    client_close(cl);
}
END_TEST

START_TEST(test_too_large)
{
    const char *req = "{\"v\":1,\"id\":3,\"cmd\":\"ping\"}";
    struct client *cl;
    char *line;
    cJSON *r;

    start();
    /* A line of exactly PROTO_MAX_MESSAGE bytes is fine. */
    line = xmalloc(PROTO_MAX_MESSAGE + 2);
    memset(line, ' ', PROTO_MAX_MESSAGE);
    memcpy(line, req, strlen(req));
    line[PROTO_MAX_MESSAGE] = '\n';
    cl = client_open();
    client_queue(cl, line, PROTO_MAX_MESSAGE + 1);
    r = client_line(cl);
    expect_ok(r, 3);
    cJSON_Delete(r);

    /* One byte more: too-large, then the connection is closed. */
    memset(line, 'x', PROTO_MAX_MESSAGE + 1);
    line[PROTO_MAX_MESSAGE + 1] = '\n';
    client_queue(cl, line, PROTO_MAX_MESSAGE + 2);
    r = client_line(cl);
    ck_assert_ptr_nonnull(strstr(expect_error(r, -1, PROTO_E_TOO_LARGE), "1048576"));
    cJSON_Delete(r);
    client_expect_eof(cl);
    client_close(cl);

    /* Without any newline at all: the server does not wait for one. */
    cl = client_open();
    memset(line, '{', PROTO_MAX_MESSAGE + 2);
    client_queue(cl, line, PROTO_MAX_MESSAGE + 2);
    r = client_line(cl);
    expect_error(r, -1, PROTO_E_TOO_LARGE);
    cJSON_Delete(r);
    client_expect_eof(cl);
    client_close(cl);
    free(line);

    /* The server goes on. */
    cl = client_open();
    expect_ping(cl, 4);
    client_close(cl);
}
END_TEST

START_TEST(test_version_mismatch)
{
    struct client *cl;
    const char *msg;
    cJSON *r;

    start();
    cl = client_open();
    r = client_call(cl, "{\"v\":2,\"id\":5,\"cmd\":\"ping\"}\n");
    msg = expect_error(r, 5, PROTO_E_BAD_VERSION);
    ck_assert_msg(strstr(msg, "version 1"), "%s", msg);
    cJSON_Delete(r);
    r = client_call(cl, "{\"id\":6,\"cmd\":\"ping\"}\n");
    expect_error(r, 6, PROTO_E_BAD_VERSION);
    cJSON_Delete(r);
    /* The connection stays usable. */
    expect_ping(cl, 7);
    client_close(cl);
}
END_TEST

/* ---- connections ------------------------------------------------------- */

START_TEST(test_connection_limit)
{
    struct client *cl[PROTO_MAX_PER_UID], *extra;
    double deadline;
    bool served = false;
    cJSON *r;

    start();
    for (int i = 0; i < PROTO_MAX_PER_UID; i++) {
        cl[i] = client_open();
        expect_ping(cl[i], i);
    }
    /* One more of the same uid is answered "busy" and closed. */
    extra = client_open();
    r = client_line(extra);
    {
        char want[64];

        snprintf(want, sizeof(want), "of uid %u (at most %d)", (unsigned)getuid(),
                 PROTO_MAX_PER_UID);
        ck_assert_ptr_nonnull(strstr(expect_error(r, -1, PROTO_E_BUSY), want));
    }
    cJSON_Delete(r);
    client_expect_eof(extra);
    client_close(extra);
    /* The others are still served. */
    expect_ping(cl[0], 100);
    expect_ping(cl[PROTO_MAX_PER_UID - 1], 101);

    /* Once one leaves, there is room again (the server may see the new
     * connection before the old one's end, so "busy" may come first). */
    client_close(cl[0]);
    deadline = ev_time() + DEADLINE;
    while (!served && ev_time() < deadline) {
        extra = client_open();
        client_send(extra, "{\"v\":1,\"id\":200,\"cmd\":\"ping\"}\n");
        r = client_line(extra);
        served = cJSON_IsTrue(cJSON_GetObjectItem(r, "ok"));
        if (!served)
            expect_error(r, -1, PROTO_E_BUSY);
        cJSON_Delete(r);
        client_close(extra);
    }
    ck_assert(served);
    for (int i = 1; i < PROTO_MAX_PER_UID; i++)
        client_close(cl[i]);
}
END_TEST

START_TEST(test_idle_close)
{
    struct client *quiet, *busy, *partial;
    ev_tstamp t0;

    ctl_test_set_idle(0.5);
    start();
    t0 = ev_time();
    quiet = client_open();
    busy = client_open();
    partial = client_open();
    client_send(partial, "{\"v\":1,");
    /* Requests every 0.25 s keep a connection open well past 0.5 s. */
    for (int i = 0; i < 4; i++) {
        expect_ping(busy, i);
        run_for(0.25);
    }
    /* The quiet one, and the one that only sent part of a line, were
     * closed after 0.5 s. */
    ck_assert(quiet->eof);
    ck_assert(partial->eof);
    ck_assert_int_eq(quiet->in.len, 0);
    expect_ping(busy, 9);
    client_expect_eof(busy);
    ck_assert_msg(ev_time() - t0 >= 1.0, "closed after %.2f s", ev_time() - t0);
    client_close(quiet);
    client_close(busy);
    client_close(partial);
}
END_TEST

/* A status large enough to fill the socket buffers many times. */
#define BIG (4 * 1024 * 1024)

static cJSON *
status_big(void)
{
    cJSON *s = cJSON_CreateObject();
    char *text = xmalloc(BIG + 1);

    memset(text, 'a', BIG);
    text[BIG] = '\0';
    json_add_str(s, "blob", text);
    free(text);
    return s;
}

START_TEST(test_large_reply_to_slow_reader)
{
    struct client *slow, *other;
    const cJSON *res;
    cJSON *r;

    ctl_set_status(status_big);
    start();
    slow = client_open();
    /* Two pipelined requests, and the client does not read yet. */
    ev_io_stop(loop, &slow->read_w);
    client_send(slow, "{\"v\":1,\"id\":1,\"cmd\":\"status\"}\n"
                      "{\"v\":1,\"id\":2,\"cmd\":\"status\"}\n");
    run_for(0.1);
    /* The server is not stuck on it. */
    other = client_open();
    expect_ping(other, 3);
    client_close(other);
    /* Both replies arrive whole and in order once the client reads. */
    ev_io_start(loop, &slow->read_w);
    for (long long id = 1; id <= 2; id++) {
        r = client_line(slow);
        res = expect_ok(r, id);
        ck_assert_uint_eq(strlen(json_get_str(res, "blob")), BIG);
        cJSON_Delete(r);
    }
    client_close(slow);
}
END_TEST

START_TEST(test_peer_hangup)
{
    struct client *cl;
    cJSON *r;

    ctl_set_status(status_big);
    start();
    /* Asks for a large reply and goes away without reading it. */
    cl = client_open();
    client_send(cl, "{\"v\":1,\"id\":1,\"cmd\":\"status\"}\n");
    run_for(0.05);
    client_close(cl);
    /* Closes in the middle of a line. */
    cl = client_open();
    client_send(cl, "{\"v\":1,\"id\":");
    client_close(cl);
    run_for(0.1);

    /* Half-closed: the reply still comes, then the server closes. The
     * unterminated last line is not answered. */
    cl = client_open();
    client_send(cl, "{\"v\":1,\"id\":2,\"cmd\":\"ping\"}\n{\"v\":1,\"id\":3,\"cmd\":\"ping\"}");
    ck_assert_int_eq(shutdown(cl->fd, SHUT_WR), 0);
    r = client_line(cl);
    expect_ok(r, 2);
    cJSON_Delete(r);
    client_expect_eof(cl);
    client_close(cl);

    cl = client_open();
    expect_ping(cl, 4);
    client_close(cl);
}
END_TEST

/* ---- the socket file --------------------------------------------------- */

START_TEST(test_socket_mode)
{
    char *dir = fs_dirname(conf.socket_path);
    struct esd_err err;
    struct stat st;
    mode_t old;

    /* A permissive umask must not leak into the socket's mode, and the
     * process's umask is restored. */
    old = umask(0);
    start();
    ck_assert_int_eq(umask(old), 0);
    ck_assert_int_eq(lstat(conf.socket_path, &st), 0);
    ck_assert(S_ISSOCK(st.st_mode));
    ck_assert_int_eq(st.st_mode & 07777, 0660);
    ck_assert_int_eq(stat(dir, &st), 0);
    ck_assert(S_ISDIR(st.st_mode));
    ck_assert_int_eq(st.st_mode & 07777, 0755);
    /* A second init is refused. */
    ck_assert_int_eq(ctl_init(loop, &conf, -1, &err), -EALREADY);
    free(dir);
}
END_TEST

START_TEST(test_socket_group)
{
    struct group *gr = getgrnam("daemon");
    struct stat st;

    if (geteuid() != 0 || !gr)
        return; /* needs root and a "daemon" group */
    conf.socket_group = xstrdup("daemon");
    start();
    ck_assert_int_eq(lstat(conf.socket_path, &st), 0);
    ck_assert_int_eq(st.st_uid, 0);
    ck_assert_int_eq(st.st_gid, gr->gr_gid);
    ck_assert_int_eq(st.st_mode & 07777, 0660);
    ctl_fini();

    /* A group that does not exist: the socket is still created. */
    free(conf.socket_group);
    conf.socket_group = xstrdup("no-such-group-esd-test");
    start();
    ck_assert_int_eq(lstat(conf.socket_path, &st), 0);
    ck_assert_int_eq(st.st_gid, 0);
}
END_TEST

START_TEST(test_stale_socket_replaced)
{
    struct client *cl;
    struct stat before, after;

    bind_at(conf.socket_path, false);
    ck_assert_int_eq(chmod(conf.socket_path, 0600), 0);
    ck_assert_int_eq(lstat(conf.socket_path, &before), 0);
    ck_assert(S_ISSOCK(before.st_mode));
    start();
    /* A new socket (inode numbers may be reused, so judge by the mode). */
    ck_assert_int_eq(lstat(conf.socket_path, &after), 0);
    ck_assert(S_ISSOCK(after.st_mode));
    ck_assert_int_eq(after.st_mode & 07777, 0660);
    cl = client_open();
    expect_ping(cl, 1);
    client_close(cl);
}
END_TEST

START_TEST(test_live_socket_kept)
{
    struct stat before, after;
    struct esd_err err;
    int fd = bind_at(conf.socket_path, true);

    ck_assert_int_eq(lstat(conf.socket_path, &before), 0);
    ck_assert_int_eq(ctl_init(loop, &conf, -1, &err), -EADDRINUSE);
    ck_assert_ptr_nonnull(strstr(err.msg, conf.socket_path));
    ck_assert_int_eq(lstat(conf.socket_path, &after), 0);
    ck_assert(before.st_ino == after.st_ino);
    ctl_fini(); /* not initialised: nothing to do, nothing removed */
    ck_assert(tu_exists(conf.socket_path));
    close(fd);
}
END_TEST

START_TEST(test_other_files_kept)
{
    char *dir = fs_dirname(conf.socket_path);
    char *target = xasprintf("%s/elsewhere.sock", tmp);
    struct esd_err err;
    char *text;

    /* A regular file. */
    free(tu_write(dir, "esd.sock", "precious", (size_t)-1));
    ck_assert_int_eq(ctl_init(loop, &conf, -1, &err), -EEXIST);
    ck_assert_msg(strstr(err.msg, "not a socket"), "%s", err.msg);
    ck_assert_ptr_nonnull(strstr(err.msg, conf.socket_path));
    text = tu_read(conf.socket_path, NULL);
    ck_assert_str_eq(text, "precious");
    free(text);
    ck_assert_int_eq(unlink(conf.socket_path), 0);

    /* A symbolic link, even to a stale socket. */
    bind_at(target, false);
    ck_assert_int_eq(symlink(target, conf.socket_path), 0);
    ck_assert_int_eq(ctl_init(loop, &conf, -1, &err), -EEXIST);
    ck_assert(tu_exists(conf.socket_path));
    ck_assert(tu_exists(target));
    ck_assert_int_eq(unlink(conf.socket_path), 0);

    /* A directory. */
    ck_assert_int_eq(mkdir(conf.socket_path, 0700), 0);
    ck_assert_int_eq(ctl_init(loop, &conf, -1, &err), -EEXIST);
    ck_assert(tu_exists(conf.socket_path));
    free(dir);
    free(target);
}
END_TEST

START_TEST(test_fini_removes_path)
{
    struct client *cl;

    start();
    cl = client_open();
    expect_ping(cl, 1);
    ck_assert(tu_exists(conf.socket_path));
    ctl_fini();
    ck_assert(!tu_exists(conf.socket_path));
    /* Its connections were closed. */
    client_expect_eof(cl);
    client_close(cl);
    ctl_fini(); /* twice is harmless */

    /* And it starts again. */
    start();
    cl = client_open();
    expect_ping(cl, 2);
    client_close(cl);
}
END_TEST

START_TEST(test_fini_leaves_anothers_socket)
{
    char *other = xasprintf("%s/other.sock", tmp);
    struct stat before, after;
    int fd;

    /* Created while esd's socket exists, so it is another inode. */
    fd = bind_at(other, true);
    start();
    /* Someone moved it over esd's socket while esd ran. */
    ck_assert_int_eq(rename(other, conf.socket_path), 0);
    ck_assert_int_eq(lstat(conf.socket_path, &before), 0);
    ctl_fini();
    ck_assert_int_eq(lstat(conf.socket_path, &after), 0);
    ck_assert(before.st_ino == after.st_ino);
    close(fd);
    free(other);
}
END_TEST

START_TEST(test_activated_socket)
{
    char *path = xasprintf("%s/activated.sock", tmp);
    struct esd_err err;
    struct client *cl;
    int fd;

    /* As systemd passes it: listening, blocking, no FD_CLOEXEC. */
    fd = bind_at(path, true);
    ck_assert_int_eq(fcntl(fd, F_SETFD, 0), 0);
    ck_assert_int_eq(ctl_init(loop, &conf, fd, &err), 0);
    ck_assert(fcntl(fd, F_GETFL) & O_NONBLOCK);
    ck_assert(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    /* Nothing is created at the configured path. */
    ck_assert(!tu_exists(conf.socket_path));
    cl = client_open_path(path);
    expect_ping(cl, 1);
    client_close(cl);
    ctl_fini();
    /* The path belongs to systemd: left in place; the fd is closed. */
    ck_assert(tu_exists(path));
    ck_assert_int_eq(fcntl(fd, F_GETFD), -1);
    free(path);
}
END_TEST

START_TEST(test_path_too_long)
{
    struct esd_err err;

    free(conf.socket_path);
    conf.socket_path = xasprintf("%s/%0200d", tmp, 0);
    ck_assert_int_eq(ctl_init(loop, &conf, -1, &err), -ENAMETOOLONG);
    ck_assert_ptr_nonnull(strstr(err.msg, "too long"));
}
END_TEST

/* ---- fair shares: the decision -------------------------------------- */

#define ROOT_SHARE ((struct proto_share){ PROTO_CLASS_ROOT, 0 })
#define SERVICE(uid) ((struct proto_share){ PROTO_CLASS_SERVICE, (uid) })
#define USER(uid) ((struct proto_share){ PROTO_CLASS_OTHER, (uid) })
#define POOLED ((struct proto_share){ PROTO_CLASS_OTHER, PROTO_SHARE_POOL })

/* A table of what is held: n of share each. */
struct held {
    struct proto_share share;
    unsigned n;
};

/* The decision for who with the rows of table held, counted as the
 * daemon counts them: one proto_usage_add per thing held. */
static enum proto_full
decide(const struct proto_limits *lim, const struct held *table, size_t rows,
       struct proto_share who)
{
    struct proto_usage u = { 0 };

    for (size_t i = 0; i < rows; i++)
        for (unsigned k = 0; k < table[i].n; k++)
            proto_usage_add(&u, &table[i].share, &who);
    return proto_share_admit(lim, &u, &who);
}

#define DECIDE(lim, table, who) decide(lim, table, sizeof(table) / sizeof(table[0]), who)

START_TEST(test_share_connections)
{
    const struct proto_limits *L = &proto_conn_limits;
    /* The pool: every uid without an account is one share, however many
     * of them a user namespace hands out. */
    const struct held pool_full[] = { { POOLED, PROTO_MAX_PER_UID } };
    /* Six users with accounts fill the unprivileged part. */
    const struct held users_full[] = {
        { USER(1000), 32 }, { USER(1001), 32 }, { USER(1002), 32 },
        { USER(1003), 32 }, { USER(1004), 32 }, { POOLED, 32 },
    };
    /* ... and the service class the rest but root's. */
    const struct held not_root_full[] = {
        { USER(1000), 32 }, { USER(1001), 32 }, { USER(1002), 32 },   { USER(1003), 32 },
        { USER(1004), 32 }, { POOLED, 32 },     { SERVICE(998), 32 }, { SERVICE(1100), 24 },
    };
    const struct held all_full[] = {
        { USER(1000), 32 },   { USER(1001), 32 },    { USER(1002), 32 },
        { USER(1003), 32 },   { USER(1004), 32 },    { POOLED, 32 },
        { SERVICE(998), 32 }, { SERVICE(1100), 24 }, { ROOT_SHARE, 8 },
    };
    const struct held root_own[] = { { ROOT_SHARE, PROTO_MAX_PER_UID } };
    const struct held empty[] = { { ROOT_SHARE, 0 } };

    ck_assert_int_eq(DECIDE(L, empty, USER(1000)), PROTO_FULL_NONE);
    ck_assert_int_eq(DECIDE(L, pool_full, POOLED), PROTO_FULL_KEY);
    ck_assert_int_eq(DECIDE(L, pool_full, USER(1000)), PROTO_FULL_NONE);
    /* a group member in a user namespace (no account) shares the pool too */
    ck_assert_int_eq(
        DECIDE(L, pool_full, ((struct proto_share){ PROTO_CLASS_SERVICE, PROTO_SHARE_POOL })),
        PROTO_FULL_KEY);
    ck_assert_int_eq(DECIDE(L, pool_full, ROOT_SHARE), PROTO_FULL_NONE);

    ck_assert_int_eq(DECIDE(L, users_full, USER(1005)), PROTO_FULL_UNPRIV);
    ck_assert_int_eq(DECIDE(L, users_full, USER(1000)), PROTO_FULL_KEY);
    ck_assert_int_eq(DECIDE(L, users_full, SERVICE(998)), PROTO_FULL_NONE);
    ck_assert_int_eq(DECIDE(L, users_full, ROOT_SHARE), PROTO_FULL_NONE);

    ck_assert_int_eq(DECIDE(L, not_root_full, SERVICE(1101)), PROTO_FULL_NOT_ROOT);
    ck_assert_int_eq(DECIDE(L, not_root_full, USER(1005)), PROTO_FULL_UNPRIV);
    ck_assert_int_eq(DECIDE(L, not_root_full, ROOT_SHARE), PROTO_FULL_NONE);

    ck_assert_int_eq(DECIDE(L, all_full, ROOT_SHARE), PROTO_FULL_ALL);
    /* root is held to its own share as well */
    ck_assert_int_eq(DECIDE(L, root_own, ROOT_SHARE), PROTO_FULL_KEY);
    ck_assert_int_eq(DECIDE(L, root_own, USER(1000)), PROTO_FULL_NONE);
}
END_TEST

START_TEST(test_share_operations)
{
    const struct proto_limits *L = &proto_op_limits;
    /* One user's logs --follow calls: PROTO_MAX_OPS_PER_UID, no more. */
    const struct held follower[] = { { USER(1000), PROTO_MAX_OPS_PER_UID } };
    /* Unprivileged users (and the pool) together: PROTO_MAX_OPS_UNPRIV. */
    const struct held readers[] = { { USER(1000), 4 }, { POOLED, 4 }, { USER(65534), 2 } };
    const struct held not_root[] = {
        { USER(1000), 4 }, { POOLED, 4 }, { USER(65534), 2 }, { SERVICE(998), 4 }
    };
    const struct held all[] = {
        { USER(1000), 4 }, { POOLED, 4 }, { USER(65534), 2 }, { SERVICE(998), 4 }, { ROOT_SHARE, 2 }
    };

    ck_assert_int_eq(DECIDE(L, follower, USER(1000)), PROTO_FULL_KEY);
    ck_assert_int_eq(DECIDE(L, follower, USER(1001)), PROTO_FULL_NONE);
    ck_assert_int_eq(DECIDE(L, follower, ROOT_SHARE), PROTO_FULL_NONE);
    ck_assert_int_eq(DECIDE(L, readers, USER(1001)), PROTO_FULL_UNPRIV);
    ck_assert_int_eq(DECIDE(L, readers, POOLED), PROTO_FULL_KEY);
    ck_assert_int_eq(DECIDE(L, readers, SERVICE(998)), PROTO_FULL_NONE);
    ck_assert_int_eq(DECIDE(L, readers, ROOT_SHARE), PROTO_FULL_NONE);
    ck_assert_int_eq(DECIDE(L, not_root, SERVICE(1100)), PROTO_FULL_NOT_ROOT);
    ck_assert_int_eq(DECIDE(L, not_root, ROOT_SHARE), PROTO_FULL_NONE);
    ck_assert_int_eq(DECIDE(L, all, ROOT_SHARE), PROTO_FULL_ALL);
}
END_TEST

/* Whatever mix of other peers takes what it can, one at a time, root
 * still gets its reserve: and the service class its own while only
 * unprivileged peers ask. */
START_TEST(test_share_reserve_survives_any_flood)
{
    const struct proto_limits *lims[] = { &proto_conn_limits, &proto_op_limits };
    unsigned seed = 12345;

    for (size_t l = 0; l < 2; l++) {
        const struct proto_limits *L = lims[l];

        for (int round = 0; round < 50; round++) {
            struct proto_share held[PROTO_MAX_CONNECTIONS];
            size_t n = 0;
            bool service_asks = round % 2;

            /* up to 10,000 requests from random peers, each admitted or not */
            for (int i = 0; i < 10000 && n < L->max; i++) {
                struct proto_usage u = { 0 };
                struct proto_share who;
                unsigned pick;

                seed = seed * 1103515245u + 12345u;
                pick = (seed >> 8) % 100;
                if (service_asks && pick < 20)
                    who = SERVICE(990 + pick % 3);
                else if (pick < 60)
                    who = POOLED;
                else
                    who = USER(1000 + pick % 7);
                for (size_t k = 0; k < n; k++)
                    proto_usage_add(&u, &held[k], &who);
                if (proto_share_admit(L, &u, &who) == PROTO_FULL_NONE)
                    held[n++] = who;
            }
            {
                struct proto_usage u = { 0 };
                struct proto_share root = ROOT_SHARE, svc = SERVICE(4242);
                unsigned pooled = 0, other = 0;

                for (size_t k = 0; k < n; k++) {
                    proto_usage_add(&u, &held[k], &root);
                    pooled += held[k].key == PROTO_SHARE_POOL;
                    other += held[k].cls == PROTO_CLASS_OTHER;
                }
                ck_assert_uint_le(pooled, L->per_key);
                ck_assert_uint_le(other, L->unpriv);
                ck_assert_uint_le(u.not_root, L->not_root);
                /* root: admitted, and room for the whole reserve */
                ck_assert_int_eq(proto_share_admit(L, &u, &root), PROTO_FULL_NONE);
                ck_assert_uint_ge(L->max - u.all, L->max - L->not_root);
                if (!service_asks) {
                    memset(&u, 0, sizeof(u));
                    for (size_t k = 0; k < n; k++)
                        proto_usage_add(&u, &held[k], &svc);
                    ck_assert_int_eq(proto_share_admit(L, &u, &svc), PROTO_FULL_NONE);
                }
            }
        }
    }
}
END_TEST

START_TEST(test_share_explain)
{
    char buf[256];
    struct proto_share who = USER(1000), pool = POOLED;

    proto_share_explain(PROTO_FULL_KEY, &proto_conn_limits, &who, "control connections", buf,
                        sizeof(buf));
    ck_assert_str_eq(buf, "too many control connections of uid 1000 (at most 32); try again "
                          "later");
    proto_share_explain(PROTO_FULL_KEY, &proto_op_limits, &pool, "running operations", buf,
                        sizeof(buf));
    ck_assert_str_eq(buf, "too many running operations of uids without an account on this "
                          "node (at most 4 for all of them together); try again later");
    proto_share_explain(PROTO_FULL_UNPRIV, &proto_conn_limits, &who, "control connections", buf,
                        sizeof(buf));
    ck_assert_ptr_nonnull(strstr(buf, "of unprivileged users (at most 192 together"));
    proto_share_explain(PROTO_FULL_NOT_ROOT, &proto_op_limits, &who, "running operations", buf,
                        sizeof(buf));
    ck_assert_ptr_nonnull(strstr(buf, "the last 2 of 16 are kept for root"));
    proto_share_explain(PROTO_FULL_ALL, &proto_conn_limits, &who, "control connections", buf,
                        sizeof(buf));
    ck_assert_str_eq(buf, "too many control connections (at most 256); try again later");
    /* cut, not overrun */
    proto_share_explain(PROTO_FULL_ALL, &proto_conn_limits, &who, "control connections", buf, 8);
    ck_assert_str_eq(buf, "too man");
}
END_TEST

/* ---- fair shares: who is who ------------------------------------------ */

/* A uid at or above from without an entry in the user database. */
static uid_t
unknown_uid(uid_t from)
{
    for (uid_t u = from; u < from + 1000; u++)
        if (!getpwuid(u))
            return u;
    ck_abort_msg("every uid from %u has an account", (unsigned)from);
    return 0;
}

START_TEST(test_peer_share)
{
    struct ucred root = { .pid = 1, .uid = 0, .gid = 0 };
    struct ucred ns = { .pid = 1, .uid = unknown_uid(100000), .gid = 100000 };
    struct ucred ns2 = { .pid = 1, .uid = unknown_uid(ns.uid + 1), .gid = 100000 };
    struct ucred self = { .pid = 1, .uid = geteuid(), .gid = getegid() };
    struct passwd *nobody = getpwnam("nobody");
    struct group *gr = getgrgid(getegid());
    struct proto_share s;
    gid_t g;

    s = ctl_peer_share(&root, NULL, 0);
    ck_assert_int_eq(s.cls, PROTO_CLASS_ROOT);
    ck_assert_uint_eq(s.key, 0);
    /* two uids without an account (user namespaces): one key */
    s = ctl_peer_share(&ns, NULL, 0);
    ck_assert_int_eq(s.cls, PROTO_CLASS_OTHER);
    ck_assert_uint_eq(s.key, PROTO_SHARE_POOL);
    s = ctl_peer_share(&ns2, NULL, 0);
    ck_assert_uint_eq(s.key, PROTO_SHARE_POOL);
    if (nobody && nobody->pw_uid != geteuid()) {
        struct ucred nb = { .pid = 1, .uid = nobody->pw_uid, .gid = nobody->pw_gid };

        s = ctl_peer_share(&nb, NULL, 0);
        ck_assert_int_eq(s.cls, PROTO_CLASS_OTHER);
        ck_assert_uint_eq(s.key, nobody->pw_uid);
    }
    if (self.uid != 0) {
        s = ctl_peer_share(&self, NULL, 0);
        ck_assert_int_eq(s.cls, PROTO_CLASS_SERVICE);
        ck_assert_uint_eq(s.key, self.uid);
    }
    /* a member of the control group, by a supplementary group, is service;
     * without an account it still counts against the pool */
    ck_assert_ptr_nonnull(gr);
    conf.socket_group = xstrdup(gr->gr_name);
    ctl_reconfigure(&conf);
    g = gr->gr_gid;
    s = ctl_peer_share(&ns, &g, 1);
    ck_assert_int_eq(s.cls, PROTO_CLASS_SERVICE);
    ck_assert_uint_eq(s.key, PROTO_SHARE_POOL);
    s = ctl_peer_share(&ns, NULL, 0);
    ck_assert_int_eq(s.cls, PROTO_CLASS_OTHER);
}
END_TEST

START_TEST(test_version_reports_shares)
{
    static const struct {
        const char *key;
        long long want;
    } figures[] = {
        { "max_connections", PROTO_MAX_CONNECTIONS },
        { "max_connections_not_root", PROTO_MAX_CONN_NOT_ROOT },
        { "max_connections_unprivileged", PROTO_MAX_CONN_UNPRIV },
        { "max_connections_per_uid", PROTO_MAX_PER_UID },
        { "max_operations", PROTO_MAX_OPS },
        { "max_operations_not_root", PROTO_MAX_OPS_NOT_ROOT },
        { "max_operations_unprivileged", PROTO_MAX_OPS_UNPRIV },
        { "max_operations_per_uid", PROTO_MAX_OPS_PER_UID },
    };
    struct client *cl;
    const cJSON *res;
    cJSON *r;

    start();
    cl = client_open();
    r = client_call(cl, "{\"v\":1,\"id\":1,\"cmd\":\"version\"}\n");
    res = expect_ok(r, 1);
    for (size_t i = 0; i < sizeof(figures) / sizeof(figures[0]); i++)
        ck_assert_msg(get_int(res, figures[i].key) == figures[i].want, "%s", figures[i].key);
    cJSON_Delete(r);
    client_close(cl);
}
END_TEST

/* ---- who may do what: esd's own uid ----------------------------------- */

/* The reply's error code and message for one request by peer (both
 * copied into the caller's buffers). */
static void
answer(const struct ucred *peer, const gid_t *groups, size_t n, const char *line, char *code,
       char *msg)
{
    cJSON *r = ctl_test_answer(peer, groups, n, line, strlen(line));
    const cJSON *e = cJSON_GetObjectItem(r, "error");

    snprintf(code, 64, "%s", e ? json_get_str(e, "code") : "ok");
    snprintf(msg, 512, "%s", e ? json_get_str(e, "message") : "");
    cJSON_Delete(r);
}

/*
 * The service-user deployment (esd not root): esd's own uid, whose
 * credentials its attempts have, may not drain or resume the node even
 * with the control group as its primary group (the shipped unit's esd
 * user), but still works its own jobs (submit gets as far as the job
 * directory); a member of the group that is another uid is privileged;
 * anyone else is denied with the new message.
 */
START_TEST(test_esd_uid_not_privileged)
{
    const char *drain = "{\"v\":1,\"id\":1,\"cmd\":\"drain\"}";
    const char *resume = "{\"v\":1,\"id\":2,\"cmd\":\"resume\"}";
    char submit[256], want[256], code[64], msg[512];
    uid_t esd_uid;
    gid_t group;
    struct group *gr;

    if (geteuid() == 0) {
        /* play the service user: this test runs in its own process */
        struct passwd *nb = getpwnam("nobody");

        ck_assert_ptr_nonnull(nb);
        ck_assert_int_eq(setegid(nb->pw_gid), 0);
        ck_assert_int_eq(seteuid(nb->pw_uid), 0);
    }
    esd_uid = geteuid();
    group = getegid();
    gr = getgrgid(group);
    ck_assert_ptr_nonnull(gr);
    conf.socket_group = xstrdup(gr->gr_name);
    ctl_reconfigure(&conf);
    /* a path every uid can look at, and find missing */
    snprintf(submit, sizeof(submit),
             "{\"v\":1,\"id\":3,\"cmd\":\"submit\",\"args\":"
             "{\"job_dir\":\"/nonexistent-esd-check/job-%d\"}}",
             (int)getpid());
    {
        struct ucred esd = { .pid = 1, .uid = esd_uid, .gid = group };
        struct ucred member = { .pid = 1, .uid = unknown_uid(100000), .gid = group };
        struct ucred other = { .pid = 1, .uid = unknown_uid(100000), .gid = group + 1 };

        answer(&esd, &group, 1, drain, code, msg);
        ck_assert_str_eq(code, PROTO_E_DENIED);
        snprintf(want, sizeof(want),
                 "drain changes this node's work: only root or members of "
                 "group %s may run it, not uid %u, which esd and its attempts run as",
                 gr->gr_name, (unsigned)esd_uid);
        ck_assert_str_eq(msg, want);
        answer(&esd, NULL, 0, resume, code, msg);
        ck_assert_str_eq(code, PROTO_E_DENIED);
        /* its own jobs: past authorisation, to the job directory */
        answer(&esd, &group, 1, submit, code, msg);
        ck_assert_str_eq(code, PROTO_E_NOT_FOUND);
        ck_assert_ptr_nonnull(strstr(msg, "no job directory"));
        /* another uid of the group may; here too the job is missing */
        answer(&member, NULL, 0, submit, code, msg);
        ck_assert_str_eq(code, PROTO_E_NOT_FOUND);
        /* anyone else: denied, told who may */
        answer(&other, NULL, 0, submit, code, msg);
        ck_assert_str_eq(code, PROTO_E_DENIED);
        snprintf(want, sizeof(want),
                 "submit changes this node's work: only root, members of "
                 "group %s or uid %u (esd), on jobs they own, may run it",
                 gr->gr_name, (unsigned)esd_uid);
        ck_assert_str_eq(msg, want);
        answer(&other, NULL, 0, drain, code, msg);
        ck_assert_str_eq(code, PROTO_E_DENIED);
    }
    if (getuid() == 0) {
        /* and back, for the teardown */
        ck_assert_int_eq(seteuid(0), 0);
        ck_assert_int_eq(setegid(0), 0);
    }
}
END_TEST

/* esd as root: root and group members are privileged; the deny message
 * names no esd uid. */
START_TEST(test_root_esd_denies)
{
    const char *drain = "{\"v\":1,\"id\":1,\"cmd\":\"drain\"}";
    struct ucred nb = { .pid = 1, .uid = unknown_uid(100000), .gid = 100000 };
    char code[64], msg[512];

    if (geteuid() != 0)
        return; /* covered by test_esd_uid_not_privileged */
    answer(&nb, NULL, 0, drain, code, msg);
    ck_assert_str_eq(code, PROTO_E_DENIED);
    ck_assert_str_eq(msg, "drain changes this node's work: only root or members of group esd "
                          "may run it");
}
END_TEST

/*
 * The handler table: every command of cmds.h that esd serves (CMDF_DAEMON)
 * has a handler, no other command has one, and an esctl-only command sent
 * to esd is refused by name rather than run.
 */
START_TEST(test_handler_table)
{
    const struct ucred root = { .pid = getpid(), .uid = 0, .gid = 0 };
    unsigned served = 0;

    for (unsigned id = 0; id < CMD__COUNT; id++) {
        const struct cmd_def *cmd = &cmd_table[id];
        bool daemon = cmd->flags & CMDF_DAEMON;

        ck_assert_uint_eq(cmd->id, id);
        ck_assert_msg(daemon == (ctlcmd_handler(cmd->id) != NULL), "%s: %s by esd but %s",
                      cmd->name, daemon ? "served" : "not served",
                      daemon ? "has no handler" : "has a handler");
        served += daemon;
        if (!daemon) {
            char line[128], code[64], msg[512], want[128];

            snprintf(line, sizeof(line), "{\"v\":1,\"id\":1,\"cmd\":\"%s\"}", cmd->name);
            answer(&root, NULL, 0, line, code, msg);
            ck_assert_str_eq(code, PROTO_E_UNKNOWN_COMMAND);
            snprintf(want, sizeof(want), "%s runs in esctl only, not in esd", cmd->name);
            ck_assert_str_eq(msg, want);
        }
    }
    ck_assert_uint_gt(served, 0);
    ck_assert_ptr_null(ctlcmd_handler(CMD__COUNT));
}
END_TEST

static Suite *
ctl_suite(void)
{
    Suite *s = suite_create("ctl");
    TCase *req = tcase_create("requests");
    TCase *conn = tcase_create("connections");
    TCase *file = tcase_create("socket file");
    TCase *share = tcase_create("fair shares");

    tcase_add_checked_fixture(req, setup, teardown);
    tcase_add_test(req, test_ping);
    tcase_add_test(req, test_status);
    tcase_add_test(req, test_unknown_command);
    tcase_add_test(req, test_malformed_then_valid);
    tcase_add_test(req, test_too_large);
    tcase_add_test(req, test_version_mismatch);
    suite_add_tcase(s, req);

    tcase_add_checked_fixture(conn, setup, teardown);
    tcase_set_timeout(conn, 120);
    tcase_add_test(conn, test_connection_limit);
    tcase_add_test(conn, test_idle_close);
    tcase_add_test(conn, test_large_reply_to_slow_reader);
    tcase_add_test(conn, test_peer_hangup);
    suite_add_tcase(s, conn);

    tcase_add_checked_fixture(file, setup, teardown);
    tcase_add_test(file, test_socket_mode);
    tcase_add_test(file, test_socket_group);
    tcase_add_test(file, test_stale_socket_replaced);
    tcase_add_test(file, test_live_socket_kept);
    tcase_add_test(file, test_other_files_kept);
    tcase_add_test(file, test_fini_removes_path);
    tcase_add_test(file, test_fini_leaves_anothers_socket);
    tcase_add_test(file, test_activated_socket);
    tcase_add_test(file, test_path_too_long);
    suite_add_tcase(s, file);

    tcase_add_checked_fixture(share, setup, teardown);
    tcase_add_test(share, test_share_connections);
    tcase_add_test(share, test_share_operations);
    tcase_add_test(share, test_share_reserve_survives_any_flood);
    tcase_add_test(share, test_share_explain);
    tcase_add_test(share, test_peer_share);
    tcase_add_test(share, test_version_reports_shares);
    tcase_add_test(share, test_esd_uid_not_privileged);
    tcase_add_test(share, test_root_esd_denies);
    tcase_add_test(share, test_handler_table);
    suite_add_tcase(s, share);
    return s;
}

int
main(void)
{
    return tu_run(ctl_suite());
}
