/*
 * proto: the control protocol between esd and esctl. This header and
 * esctl(1) are its definition; the daemon (daemon/ctl.c) and the client
 * share the constants, the request parser and the reply builders below.
 *
 * Transport. A SOCK_STREAM UNIX socket, /run/esd/esd.sock by default (the
 * "socket" key of esd.yaml, or the socket systemd passes), mode 0660, group
 * "socket_group" (default esd). Every message is one JSON object in UTF-8 on
 * one line ending in "\n" (an unterminated last line is never answered). A
 * line holds at most PROTO_MAX_MESSAGE bytes, the "\n" not counted.
 *
 * Request:  {"v":1,"id":N,"cmd":"<name>","args":{...}}
 *   v     integer, the protocol version: PROTO_VERSION.
 *   id    integer chosen by the client (non-negative by convention), echoed
 *         in every line answering the request.
 *   cmd   non-empty string, the command name.
 *   args  object, optional: the command's arguments.
 *   Other members are ignored, so that later clients can add some.
 *
 * Reply, exactly one per request, in request order:
 *   {"v":1,"id":N,"ok":true,"result":{...}}
 *   {"v":1,"id":N,"ok":false,"error":{"code":"<code>","message":"<text>"}}
 * code is one of the PROTO_E_* strings below (stable; clients branch on
 * it); message is for humans and may change. id is -1 when the request's
 * id could not be read. Keys are written in sorted order, compactly.
 *
 * Events: long operations may send lines {"v":1,"id":N,"event":"progress",
 * ...} before their reply; the reply (a line with "ok") ends the request.
 *
 * Commands (PROTO_CMD_*):
 *   ping    result {"pong":true,"version":"<ESD_VERSION>","node":"<node>",
 *           "pid":N}; cheap, used to wait for readiness.
 *   status  result: the daemon's status object (esctl(1) describes it).
 *
 * Connections. The daemon serves at most PROTO_MAX_CONNECTIONS at once; a
 * connection beyond that gets one "busy" error line (id -1) and is closed.
 * A connection idle for PROTO_IDLE_SECS (no complete request received, no
 * reply bytes taken) is closed; a partial line does not count. A
 * line longer than PROTO_MAX_MESSAGE gets a "too-large" error (id -1) and
 * the connection is closed after it; any other bad line gets an error reply
 * and the connection stays usable. The daemon reads the peer's credentials
 * (SO_PEERCRED) on every connection; commands that change state will need
 * root, the daemon's own uid or the control group, and answer "denied"
 * otherwise.
 */
#ifndef ESD_PROTO_H
#define ESD_PROTO_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "util.h"

/* The version of esd and esctl (esd --version, esctl --version, ping). */
#define ESD_VERSION "0.1.0"

#define PROTO_VERSION 1
#define PROTO_MAX_MESSAGE (1024 * 1024) /* bytes in one line, "\n" excluded */
#define PROTO_MAX_CONNECTIONS 64        /* served at once */
#define PROTO_IDLE_SECS 60              /* idle connection closed after */

/* Command names. */
#define PROTO_CMD_PING "ping"
#define PROTO_CMD_STATUS "status"

/* Error codes (error.code in a reply). */
#define PROTO_E_BAD_REQUEST "bad-request"         /* not a valid request line */
#define PROTO_E_BAD_VERSION "bad-version"         /* "v" is not PROTO_VERSION */
#define PROTO_E_UNKNOWN_COMMAND "unknown-command" /* no such "cmd" */
#define PROTO_E_BAD_ARGS "bad-args"               /* "args" wrong for the command */
#define PROTO_E_TOO_LARGE "too-large"             /* line above PROTO_MAX_MESSAGE */
#define PROTO_E_DENIED "denied"                   /* the peer may not do this */
#define PROTO_E_NOT_FOUND "not-found"             /* the job (or other object) is unknown */
#define PROTO_E_BUSY "busy"                       /* too many connections */
#define PROTO_E_INTERNAL "internal"               /* the daemon failed; see its log */

/* A parsed request. cmd and args point into root. */
struct proto_request {
    long long id;      /* the request's id; -1 if it could not be read */
    const char *cmd;   /* the command name, non-empty */
    const cJSON *args; /* the "args" object, or NULL when absent */
    cJSON *root;       /* the whole request (proto_request_free) */
};

/*
 * Parses one line (len bytes, without its "\n"; need not be NUL-terminated)
 * into *ret. Returns 0; -EMSGSIZE when len > PROTO_MAX_MESSAGE;
 * -EPROTONOSUPPORT when "v" is missing or not the integer PROTO_VERSION;
 * -EINVAL for anything else that is not a valid request. On error err says
 * why and, unlike the usual rule, ret->id is still written (the request's id
 * when it could be read, else -1) so that the error reply can carry it; the
 * other members are then NULL and nothing needs freeing. proto_error_code()
 * turns the return value into the reply's error code.
 */
int proto_parse_request(const char *line, size_t len, struct proto_request *ret,
                        struct esd_err *err);

/* Frees what a successful proto_parse_request() allocated. NULL-safe. */
void proto_request_free(struct proto_request *r);

/* The PROTO_E_* code for a negative errno from proto_parse_request():
 * too-large, bad-version, otherwise bad-request. */
const char *proto_error_code(int r);

/*
 * {"v":1,"id":id,"ok":true,"result":result}. Takes ownership of result
 * (NULL: an empty object). The caller owns the reply (cJSON_Delete).
 */
cJSON *proto_reply_ok(long long id, cJSON *result);

/*
 * {"v":1,"id":id,"ok":false,"error":{"code":code,"message":message}}.
 * The caller owns the reply (cJSON_Delete).
 */
cJSON *proto_reply_error(long long id, const char *code, const char *message);

/* Appends msg to out as one line: compact JSON, sorted keys, then "\n". */
void proto_frame(const cJSON *msg, struct buf *out);

#endif
