/*
 * opchild: a control command on a job directory (common/ops.h) run in a
 * child process, so that reading 10 GB or thousands of records never
 * blocks the loop, and with the caller's identity, so that it reads and
 * writes only what the caller may. The child reports on a pipe, one JSON
 * object a line: {"event":{…}} any number of times, then {"result":{…}}
 * or {"error":{"code":"…","message":"…"}}. The parent stops reading the
 * pipe while its consumer is full (opchild_hold), so a slow client slows
 * the child instead of filling esd's memory.
 */
#ifndef ESD_OPCHILD_H
#define ESD_OPCHILD_H

#include <stdbool.h>
#include <sys/types.h>

#include <cjson/cJSON.h>
#include <ev.h>

#include "cmds.h"
#include "config.h"
#include "proto.h"
#include "util.h"

/* Who the child runs as. */
struct ident {
    bool change; /* switch to uid/gid/groups (esd runs as root) */
    uid_t uid;
    gid_t gid;
    gid_t *groups; /* owned by the caller of opchild_start; copied */
    size_t ngroups;
    gid_t group1; /* room for a single group */
};

struct opchild_ops {
    /* Each event the child sent (the callee takes ev). */
    void (*event)(void *ctx, cJSON *ev);
    /* The end: result (callee takes it) or code and message. Not called
     * after opchild_cancel. The opchild is freed after it returns. */
    void (*done)(void *ctx, cJSON *result, const char *code, const char *message);
};

struct opchild;

void opchild_init(struct ev_loop *loop, const struct esd_conf *c);
void opchild_reconfigure(const struct esd_conf *c);

/*
 * Starts command id with args (checked; copied) as who, for the peer whose
 * share is share (the caller's, whoever the child runs as): admitted only
 * within proto_op_limits (common/proto.h), counted until the child is
 * freed. Returns the child or NULL with *ret_code (PROTO_E_BUSY,
 * PROTO_E_INTERNAL) and err set.
 */
struct opchild *opchild_start(enum cmd_id id, const cJSON *args, const struct ident *who,
                              const struct proto_share *share, const struct opchild_ops *ops,
                              void *ctx, const char **ret_code, struct esd_err *err);

/* Stop reading its events (hold) or read again. */
void opchild_hold(struct opchild *o, bool hold);

/* The consumer went away: SIGTERM to the child (which stops cleanly),
 * reaped later; done is not called. */
void opchild_cancel(struct opchild *o);

/* Operations running. */
size_t opchild_count(void);

/* Kills every child (shutdown). */
void opchild_fini(void);

#endif
