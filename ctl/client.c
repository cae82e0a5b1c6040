/*
 * client: esctl's side of the control socket: connect, send one request,
 * read lines until its reply (progress events are passed to a callback).
 * Everything is bounded by a timeout.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "esctl.h"
#include "fsutil.h"
#include "json.h"
#include "proto.h"

const char *
client_socket_path(const struct call *c)
{
    const char *path = c->set[O_SOCKET] ? c->str[O_SOCKET] : getenv("ESD_SOCKET");

    return path && *path ? path : ESD_SOCKET_DEFAULT;
}

int
client_call(const struct call *c, const char *cmd, cJSON *args, double timeout,
            void (*event)(void *ctx, const cJSON *ev), void *ctx, cJSON **ret_reply,
            struct esd_err *err)
{
    const char *path = client_socket_path(c);
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    cJSON *req = cJSON_CreateObject();
    struct buf out, in;
    double deadline = time_mono() + timeout;
    int fd, r = 0;
    static long long next_id = 1;
    long long id = next_id++;

    buf_init(&out);
    buf_init(&in);
    json_add_int(req, "v", PROTO_VERSION);
    json_add_int(req, "id", id);
    json_add_str(req, "cmd", cmd);
    if (args)
        cJSON_AddItemToObject(req, "args", args);
    proto_frame(req, &out);
    cJSON_Delete(req);
    if (strlen(path) >= sizeof(sa.sun_path)) {
        r = err_set(err, -ENAMETOOLONG, "socket path too long: %s", path);
        goto out;
    }
    strcpy(sa.sun_path, path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        r = err_sys(err, -errno, "socket");
        goto out;
    }
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        r = err_sys(err, -errno, "cannot reach esd at %s", path);
        close(fd);
        goto out;
    }
    if ((r = fs_write_all(fd, out.p, out.len)) < 0) {
        err_sys(err, r, "cannot talk to esd at %s", path);
        close(fd);
        goto out;
    }
    for (;;) {
        char *nl = in.len ? memchr(in.p, '\n', in.len) : NULL;
        struct pollfd p = { .fd = fd, .events = POLLIN };
        char chunk[65536];
        ssize_t n;
        int ms;

        if (nl) {
            cJSON *msg = NULL;
            long long mid;
            size_t len = (size_t)(nl - in.p);

            if (json_parse_object(in.p, len, "esd's reply", &msg, err) < 0) {
                r = -EPROTO;
                break;
            }
            memmove(in.p, nl + 1, in.len - len - 1);
            in.len -= len + 1;
            if (json_get_int(msg, "id", &mid) == 0 && mid != id && mid != -1) {
                cJSON_Delete(msg);
                continue;
            }
            if (cJSON_GetObjectItemCaseSensitive(msg, "ok")) {
                *ret_reply = msg;
                break;
            }
            if (event)
                event(ctx, msg);
            cJSON_Delete(msg);
            continue;
        }
        ms = (int)((deadline - time_mono()) * 1000);
        if (ms <= 0) {
            r = err_set(err, -ETIMEDOUT, "esd at %s did not answer within %.0f s", path, timeout);
            break;
        }
        if (poll(&p, 1, ms) <= 0)
            continue;
        n = read(fd, chunk, sizeof(chunk));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            r = err_set(err, -ECONNRESET, "esd at %s closed the connection", path);
            break;
        }
        if (in.len + (size_t)n > (size_t)PROTO_MAX_MESSAGE * 2) {
            r = err_set(err, -EMSGSIZE, "esd's reply is too long");
            break;
        }
        buf_append(&in, chunk, (size_t)n);
    }
    close(fd);
out:
    buf_free(&out);
    buf_free(&in);
    return r;
}
