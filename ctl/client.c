/*
 * client: esctl's side of the control socket (common/proto.h): connect,
 * send one request, pass every event line to a callback and return the
 * reply. The wait is bounded by a timeout unless the command may run for
 * long, and ends early when the user interrupts.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "esctl.h"
#include "fsutil.h"
#include "json.h"
#include "ops.h"
#include "proto.h"

#define READ_CHUNK (256 * 1024)

const char *
client_socket_path(const struct call *c)
{
    const char *path = c->set[O_SOCKET] ? c->str[O_SOCKET] : getenv("ESD_SOCKET");

    return path && *path ? path : ESD_SOCKET_DEFAULT;
}

static bool
cancelled(const struct op_env *env)
{
    return env && env->cancel && *env->cancel;
}

/*
 * The request's "seen" (common/proto.h) for a command on job_dir: the
 * directory, or its nearest existing parent, and /tmp as this process sees
 * them, so that esd can tell when it sees others. NULL when nothing exists.
 */
static cJSON *
seen_of(const char *job_dir)
{
    char *at = xstrdup(job_dir);
    struct stat st, tmp;
    cJSON *o;

    while (stat(at, &st) < 0) {
        char *up;

        if (!strcmp(at, "/") || at[0] != '/') {
            free(at);
            return NULL;
        }
        up = fs_dirname(at);
        free(at);
        at = up;
    }
    o = cJSON_CreateObject();
    json_add_str(o, "path", at);
    json_add_int(o, "dev", (long long)st.st_dev);
    json_add_int(o, "ino", (long long)st.st_ino);
    if (stat("/tmp", &tmp) == 0) {
        json_add_int(o, "tmp_dev", (long long)tmp.st_dev);
        json_add_int(o, "tmp_ino", (long long)tmp.st_ino);
    }
    free(at);
    return o;
}

/* Writes all of p without SIGPIPE (esd may have gone). */
static int
send_all(int fd, const char *p, size_t n, const struct op_env *env)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);

        if (w < 0 && errno == EINTR) {
            if (cancelled(env))
                return -ECANCELED;
            continue;
        }
        if (w < 0)
            return -errno;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static int
connect_to(const char *path, int *ret_fd, struct esd_err *err)
{
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    int fd;

    if (strlen(path) >= sizeof(sa.sun_path))
        return err_set(err, -ENAMETOOLONG, "socket path too long: %s", path);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return err_sys(err, -errno, "socket");
    while (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        int e = errno;

        if (e == EINTR)
            continue;
        close(fd);
        return err_sys(err, -e, "cannot reach esd at %s", path);
    }
    *ret_fd = fd;
    return 0;
}

/*
 * Handles the complete lines in in[0..len): events to env, the reply (the
 * line with "ok") into *ret_reply. Returns 1 once the reply is there, 0 to
 * read on, or -EPROTO.
 */
static int
take_lines(struct buf *in, size_t *scanned, long long id, const struct op_env *env,
           cJSON **ret_reply, struct esd_err *err)
{
    char *nl;

    while (in->len > *scanned && (nl = memchr(in->p + *scanned, '\n', in->len - *scanned))) {
        size_t len = (size_t)(nl - in->p);
        cJSON *msg = NULL;
        long long mid;

        if (json_parse_object(in->p, len, "esd's reply", &msg, err) < 0)
            return -EPROTO;
        memmove(in->p, nl + 1, in->len - len - 1);
        in->len -= len + 1;
        *scanned = 0;
        if (json_get_int(msg, "id", &mid) == 0 && mid != id && mid != -1) {
            cJSON_Delete(msg);
            continue;
        }
        if (cJSON_GetObjectItemCaseSensitive(msg, "ok")) {
            *ret_reply = msg;
            return 1;
        }
        if (env && env->event)
            env->event(env->ctx, msg);
        else
            cJSON_Delete(msg);
    }
    *scanned = in->len;
    return 0;
}

int
client_call(const struct call *c, const char *cmd, const cJSON *args, double timeout,
            const struct op_env *env, cJSON **ret_reply, struct esd_err *err)
{
    static long long next_id = 1;
    const char *path = client_socket_path(c);
    cJSON *req = cJSON_CreateObject();
    struct buf out, in;
    double deadline = time_mono() + timeout;
    long long id = next_id++;
    size_t scanned = 0;
    char *chunk = NULL;
    int fd = -1, r;

    *ret_reply = NULL;
    buf_init(&out);
    buf_init(&in);
    json_add_int(req, "v", PROTO_VERSION);
    json_add_int(req, "id", id);
    json_add_str(req, "cmd", cmd);
    if (args)
        cJSON_AddItemToObject(req, "args", cJSON_Duplicate(args, true));
    if ((!strcmp(cmd, "submit") || !strcmp(cmd, "prepare")) && json_get_str(args, "job_dir")) {
        cJSON *seen = seen_of(json_get_str(args, "job_dir"));

        if (seen)
            cJSON_AddItemToObject(req, "seen", seen);
    }
    proto_frame(req, &out);
    cJSON_Delete(req);
    if ((r = connect_to(path, &fd, err)) < 0)
        goto out;
    if ((r = send_all(fd, out.p, out.len, env)) < 0) {
        if (r != -ECANCELED)
            err_sys(err, r, "cannot talk to esd at %s", path);
        else
            err_set(err, r, "interrupted");
        goto out;
    }
    chunk = xmalloc(READ_CHUNK);
    for (;;) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        ssize_t n;
        int ms = -1;

        if ((r = take_lines(&in, &scanned, id, env, ret_reply, err)) != 0)
            break;
        if (cancelled(env)) {
            r = err_set(err, -ECANCELED, "interrupted");
            break;
        }
        if (in.len > (size_t)PROTO_MAX_REPLY) {
            r = err_set(err, -EMSGSIZE, "esd's reply is longer than %d bytes", PROTO_MAX_REPLY);
            break;
        }
        if (timeout > 0) {
            double left = deadline - time_mono();

            if (left <= 0) {
                r = err_set(err, -ETIMEDOUT, "esd at %s did not answer within %.0f s", path,
                            timeout);
                break;
            }
            ms = (int)(left * 1000) + 1;
        }
        if (poll(&p, 1, ms) <= 0)
            continue; /* EINTR (checked above) or the deadline */
        n = read(fd, chunk, READ_CHUNK);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n <= 0) {
            r = err_set(err, -ECONNRESET, "esd at %s closed the connection without a reply", path);
            break;
        }
        buf_append(&in, chunk, (size_t)n);
    }
    if (r == 1)
        r = 0;
out:
    if (fd >= 0)
        close(fd);
    free(chunk);
    buf_free(&out);
    buf_free(&in);
    return r;
}
