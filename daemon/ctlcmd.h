/*
 * ctlcmd: what the control server's two files share. daemon/ctl.c is the
 * server (the socket, connections, framing, peer credentials, timeouts,
 * operations in children, dispatch); daemon/ctlcmd.c holds one handler
 * per command of common/cmds.h that esd serves (CMDF_DAEMON), in a table
 * indexed by enum cmd_id, and the checks of who may run a command on which
 * job directory. Nothing outside these two files (and check_ctl) includes
 * this header; the daemon's interface to the socket is ctl.h.
 */
#ifndef ESD_CTLCMD_H
#define ESD_CTLCMD_H

#include <stdbool.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <cjson/cJSON.h>
#include <ev.h>

#include "cmds.h"
#include "config.h"
#include "opchild.h"
#include "proto.h"
#include "spawn.h"
#include "util.h"

/* One client connection. */
struct conn {
    int fd;
    struct ucred cred; /* the peer, from SO_PEERCRED at accept */
    gid_t *groups;     /* its supplementary groups (SO_PEERGROUPS) */
    size_t ngroups;
    struct proto_share share; /* what it counts against, set at accept */
    ev_io read_w;             /* readable: conn_read_cb */
    ev_io write_w;            /* writable while a reply is pending: conn_write_cb */
    ev_timer idle_w;          /* idle_secs without a complete request or a reply
                           making progress: conn_idle_cb */
    struct buf in;            /* bytes received; in.p[pos..] not yet answered */
    size_t pos;               /* start of the current (incomplete) line */
    size_t scan;              /* in.p[pos..scan) holds no "\n" */
    struct buf out;           /* reply bytes; out.p[sent..] not yet sent */
    size_t sent;
    bool eof;           /* the peer will send nothing more */
    bool closing;       /* close once out has gone */
    struct opchild *op; /* the operation running for the current request */
    long long op_id;    /* its request id */
    enum cmd_id op_cmd;
    cJSON *then; /* submit --config: the registration after prepare */
    struct conn *prev, *next;
};

/* What a request on a job directory found out about it. */
struct jobref {
    char *dir; /* resolved as the caller; NULL: no job directory */
    bool exists;
    struct stat st;
};

/* Frees jr->dir (and sets it NULL); jr itself is the caller's. */
void ctlcmd_jobref_free(struct jobref *jr);

/*
 * A command's handler: the result (the caller owns it), or NULL with *code
 * and err set; or, when it started an operation in a child
 * (ctlcmd_server.op_start), NULL with *code NULL: the reply comes later, through
 * ctlcmd_op_reply. jr is what ctlcmd_authorise found of the request's
 * job_dir; req_id is the request's id.
 */
typedef cJSON *ctlcmd_fn(struct conn *c, const struct cmd_def *cmd, const cJSON *args,
                         struct jobref *jr, long long req_id, const char **code,
                         struct esd_err *err);

/* The handler of command id; NULL exactly for the commands esd does not
 * serve (no CMDF_DAEMON; check_ctl holds the table to that). */
ctlcmd_fn *ctlcmd_handler(enum cmd_id id);

/*
 * May c run cmd with the request req (whose args are checked)? For submit
 * and prepare, first whether esd sees the client's directory as the client
 * does (req's "seen"). For commands on a job directory, *jr is filled
 * (resolved as the caller; ctlcmd_jobref_free, also on error). Returns 0
 * or a negative errno with *code and err set.
 */
int ctlcmd_authorise(const struct conn *c, const struct cmd_def *cmd,
                     const struct proto_request *req, struct jobref *jr, const char **code,
                     struct esd_err *err);

/*
 * The identity an operation on jr (NULL: none) runs with, for op_start
 * (ARCHITECTURE.md "Security model"). *cred holds what was looked up
 * (spawn_cred_free). 0, or a negative errno with err set.
 */
int ctlcmd_ident(const struct conn *c, const struct jobref *jr, struct ident *who,
                 struct spawn_cred *cred, struct esd_err *err);

/*
 * The reply to the operation of c that ended with result (owned, taken)
 * or with code and message: for submit --config the registration that
 * follows its prepare (c->then, freed here). The caller owns the reply.
 */
cJSON *ctlcmd_op_reply(struct conn *c, cJSON *result, const char *code, const char *message);

/*
 * What the server (ctl.c) tells the handlers: it fills this at ctl_init and
 * ctl_reconfigure, the handlers only read it. The handlers call the server
 * only through op_start, so that ctl.c depends on this file and never the
 * other way round (scripts/modcheck).
 */
struct ctlcmd_server {
    const struct esd_conf *conf; /* NULL until ctl_reconfigure() */
    char *node;                  /* node_name, for ping and status */
    double idle_secs;            /* PROTO_IDLE_SECS, or the test's */
    bool have_group;             /* the control group (socket_group) exists */
    gid_t group;
    cJSON *(*status)(void);             /* ctl_set_status(), or NULL */
    int (*reload)(struct esd_err *err); /* ctl_set_reload(), or NULL */
    /*
     * Starts command id with args as an operation in a child, as the
     * identity ctlcmd_ident gives for jr, answered to request req_id:
     * *code NULL when started, else *code and err set.
     */
    void (*op_start)(struct conn *c, enum cmd_id id, const cJSON *args, const struct jobref *jr,
                     long long req_id, const char **code, struct esd_err *err);
};
extern struct ctlcmd_server ctlcmd_server;

/* Is the peer in the control group (its primary or a supplementary group)? */
bool ctlcmd_in_control_group(const struct ucred *cred, const gid_t *groups, size_t ngroups);
/* May c run node commands? Root, or a member of the control group, never
 * esd's own non-root uid. */
bool ctlcmd_privileged(const struct conn *c);
/* The peer is esd's own uid, and that is not root. */
bool ctlcmd_is_esd_uid(const struct ucred *cred);
/* The control group's name, for messages. */
const char *ctlcmd_group_name(void);
/* Logs a refusal (code "denied") with the peer. */
void ctlcmd_log_refusal(const struct conn *c, const char *cmd, const char *code, const char *why);

#endif
