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
 *   seen  object, optional (submit, prepare): what the client sees of the
 *         job directory, or of its nearest existing parent: {"path": P,
 *         "dev": D, "ino": I, "tmp_dev": D2, "tmp_ino": I2} (the last two of
 *         /tmp). esd refuses the request when it sees another directory
 *         there (PrivateTmp=, another mount namespace), saying so.
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
 * Commands. The table in common/cmds.c is the list: each command's name,
 * its arguments (an option --num-shards is the member "num_shards" of args;
 * flags are booleans, strings strings, repeatable options arrays of
 * strings, numbers integers; the positional job directory is "job_dir";
 * paths must be absolute), and who may run it:
 *   read  any peer that can connect: ping, version, list, status, verify,
 *         logs, config;
 *   node  root, or a member of the control group (socket_group): drain,
 *         resume. Not esd's own uid when esd does not run as root, even
 *         with the group: its attempts run with exactly its credentials;
 *   job   as node, or esd's own uid, and the caller owns the job directory
 *         (root: any job not owned by root): submit, prepare, retry, merge,
 *         cancel, forget.
 * A refusal is the error "denied", logged with the peer's uid and pid.
 * Commands on a job directory (status with one, prepare, retry, merge,
 * verify, logs, submit with --config) run in a child process that has the
 * caller's identity (uid, gid, groups) when esd runs as root, so they can
 * read and write only what the caller can; merge's output must be inside
 * the job directory. esctl(1) describes every result.
 *
 * Events: long operations send, before their reply,
 *   {"v":1,"id":N,"event":"progress","phase":"scan"|"write"|"merge"|"verify",
 *    "bytes_done":N,"bytes_total":N,"rows":N,"elapsed":S}
 * and logs sends its text as {"v":1,"id":N,"event":"data","data":"..."}
 * (invalid UTF-8 replaced by U+FFFD). A client that closes the connection
 * cancels its running operation (a prepare or merge leaves nothing behind).
 *
 * Connections and operations are shared out by the limits below ("Fair
 * shares"); a connection beyond them gets one "busy" error line (id -1) and
 * is closed, a request for an operation beyond them a "busy" error reply
 * (the connection stays). A connection idle for PROTO_IDLE_SECS
 * (no complete request received, no reply bytes taken, no operation
 * running for it) is closed; a partial line does not count. A line longer
 * than PROTO_MAX_MESSAGE gets a "too-large" error (id -1) and the
 * connection is closed after it; any other bad line gets an error reply and
 * the connection stays usable. Requests on one connection are answered in
 * order; one waits while the one before it runs. Replies have no size
 * limit of their own (status --all of a large job is large); clients
 * accept up to PROTO_MAX_REPLY bytes a line.
 */
#ifndef ESD_PROTO_H
#define ESD_PROTO_H

#include <stddef.h>
#include <sys/types.h>

#include <cjson/cJSON.h>

#include "util.h"

/* The version of esd and esctl (esd --version, esctl --version, ping). */
#define ESD_VERSION "0.1.0"

#define PROTO_VERSION 1
#define PROTO_MAX_MESSAGE (1024 * 1024)     /* bytes in one line, "\n" excluded */
#define PROTO_MAX_REPLY (256 * 1024 * 1024) /* bytes in one line a client takes */
#define PROTO_IDLE_SECS 60                  /* idle connection closed after */

/*
 * Fair shares (ARCHITECTURE.md "Security model"). Each connection, and each
 * operation run in a child for a request, is held by a peer of a class:
 *   root     uid 0;
 *   service  a member of the control group (socket_group), or esd's own uid;
 *   other    every other peer: unprivileged;
 * and counts against a share key: the peer's uid when the uid has an entry
 * in the user database (getpwuid), else PROTO_SHARE_POOL, one key for all
 * the uids without one (esd's own uid always keys itself). Those are the
 * uids user namespaces hand out: a user with 65,536 subordinate uids
 * (Debian's default, newuidmap) can connect as any of them, but as one
 * share. Limits, for connections and for operations alike:
 *   *_PER_UID    held by one share key;
 *   *_UNPRIV     held by unprivileged peers together, so that
 *                *_NOT_ROOT - *_UNPRIV stay for the service class;
 *   *_NOT_ROOT   held by every peer but root, so that the rest stays for
 *                root whoever else holds what;
 *   the maximum  held by everyone.
 * The figures are in esctl version's reply (cmd_version) and esctl(1).
 */
#define PROTO_MAX_CONNECTIONS 256   /* connections served at once */
#define PROTO_MAX_CONN_NOT_ROOT 248 /* by all but root: 8 always left for root */
#define PROTO_MAX_CONN_UNPRIV 192   /* by unprivileged peers: 56 more kept for service */
#define PROTO_MAX_PER_UID 32        /* by one share key */
#define PROTO_MAX_OPS 16            /* operations (children) running at once */
#define PROTO_MAX_OPS_NOT_ROOT 14   /* for all but root: 2 always left for root */
#define PROTO_MAX_OPS_UNPRIV 10     /* for unprivileged peers: 4 more kept for service */
#define PROTO_MAX_OPS_PER_UID \
    4 /* for one share key: a user's logs --follow calls
                                           take at most this many */

/* Error codes (error.code in a reply). */
#define PROTO_E_BAD_REQUEST "bad-request"         /* not a valid request line */
#define PROTO_E_BAD_VERSION "bad-version"         /* "v" is not PROTO_VERSION */
#define PROTO_E_UNKNOWN_COMMAND "unknown-command" /* no such "cmd" */
#define PROTO_E_BAD_ARGS "bad-args"               /* "args" wrong for the command */
#define PROTO_E_TOO_LARGE "too-large"             /* line above PROTO_MAX_MESSAGE */
#define PROTO_E_DENIED "denied"                   /* the peer may not do this */
#define PROTO_E_NOT_FOUND "not-found"             /* the job (or other object) is unknown */
#define PROTO_E_BUSY "busy"                       /* too many connections or operations */
#define PROTO_E_FAILED "failed"                   /* the operation failed; message says why */
#define PROTO_E_CONFLICT "conflict"               /* not now: e.g. the job is being merged */
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

/* ---- fair shares ---- */

enum proto_class {
    PROTO_CLASS_ROOT,    /* uid 0 */
    PROTO_CLASS_SERVICE, /* socket_group members, esd's own uid */
    PROTO_CLASS_OTHER,   /* unprivileged */
};

/* The share key of every uid without an entry in the user database. No
 * process has this uid: (uid_t)-1 means "unchanged" to setresuid(2). */
#define PROTO_SHARE_POOL ((uid_t)-1)

/* Who holds (or asks for) a connection or an operation. */
struct proto_share {
    enum proto_class cls;
    uid_t key; /* the uid, or PROTO_SHARE_POOL */
};

/* One kind of capacity (see "Fair shares" above). */
struct proto_limits {
    unsigned max;      /* held at once, by everyone */
    unsigned not_root; /* by every class but root */
    unsigned unpriv;   /* by class other */
    unsigned per_key;  /* by one share key */
};

extern const struct proto_limits proto_conn_limits; /* PROTO_MAX_CONN* and PROTO_MAX_PER_UID */
extern const struct proto_limits proto_op_limits;   /* PROTO_MAX_OPS* */

/* What is held, counted from the point of view of one asking peer. */
struct proto_usage {
    unsigned all, not_root, unpriv; /* as in struct proto_limits */
    unsigned key;                   /* by the asker's share key */
};

/* The limit that refuses one more (PROTO_FULL_NONE: admitted). */
enum proto_full {
    PROTO_FULL_NONE,
    PROTO_FULL_KEY,      /* the asker's share key has per_key */
    PROTO_FULL_UNPRIV,   /* unprivileged peers have unpriv */
    PROTO_FULL_NOT_ROOT, /* everyone but root has not_root */
    PROTO_FULL_ALL,      /* everyone has max */
};

/* Counts one thing held by held into u, as seen by who. u starts zeroed. */
void proto_usage_add(struct proto_usage *u, const struct proto_share *held,
                     const struct proto_share *who);

/*
 * May who have one more, with u (counted for who) held? Pure: returns
 * PROTO_FULL_NONE or the first limit that refuses, the asker's own share
 * first. Root is refused only by its own share or by max.
 */
enum proto_full proto_share_admit(const struct proto_limits *lim, const struct proto_usage *u,
                                  const struct proto_share *who);

/*
 * Writes into buf (size n, NUL-terminated, cut if need be) why who got
 * "busy": "too many <what> of uid 1000 (at most 32); try again later", or
 * of the uids without an account, of unprivileged users, or in all.
 */
void proto_share_explain(enum proto_full full, const struct proto_limits *lim,
                         const struct proto_share *who, const char *what, char *buf, size_t n);

#endif
