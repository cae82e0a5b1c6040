/*
 * ctl: the control server. A listening UNIX socket (created here with mode
 * 0660 before anyone can connect, or handed over by systemd) and up to
 * PROTO_MAX_CONNECTIONS connections, shared out between root, esd and its
 * control group, and the others by the limits of common/proto.h ("Fair
 * shares"), each an object that embeds its read and write watchers and its
 * idle timer.
 * Requests are read as lines of at most PROTO_MAX_MESSAGE bytes, checked
 * against the command table (common/cmds.c: arguments, then who may run
 * it), and answered: at once, or by an operation in a child process
 * (daemon/opchild.c) whose events are passed on as they come. Replies are
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
#include "finalize.h"
#include "fsutil.h"
#include "jobs.h"
#include "jobview.h"
#include "json.h"
#include "log.h"
#include "manifest.h"
#include "merge.h"
#include "nodes.h"
#include "opchild.h"
#include "prepare.h"
#include "proto.h"
#include "pypath.h"
#include "runner.h"
#include "sched.h"
#include "spawn.h"

#define READ_CHUNK 65536       /* bytes read at once from a connection */
#define ACCEPT_BURST 64        /* connections accepted in one callback */
#define ACCEPT_PAUSE_SECS 1.0  /* after running out of descriptors */
#define KEEP_BUF (256 * 1024)  /* larger buffers are freed once empty */
#define HOLD_BYTES (1024 * 1024) /* an operation waits while its client has
                                    this much unread */
#define HANGUP_CHECK_SECS 1.0  /* while an operation runs for a half-closed
                                  connection: is the peer still there? */
#define MAX_GROUPS 65536
#define PW_BUF_MAX (1024 * 1024) /* for getpwuid_r: larger entries count as none */

/* One client connection. */
struct conn {
    int fd;
    struct ucred cred;  /* the peer, from SO_PEERCRED at accept */
    gid_t *groups;      /* its supplementary groups (SO_PEERGROUPS) */
    size_t ngroups;
    struct proto_share share; /* what it counts against, set at accept */
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
    struct opchild *op; /* the operation running for the current request */
    long long op_id;    /* its request id */
    enum cmd_id op_cmd;
    cJSON *then;        /* submit --config: the registration after prepare */
    struct conn *prev, *next;
};

/* The server: the listening socket and its connections. */
static struct {
    struct ev_loop *loop;  /* NULL: not initialised */
    const struct esd_conf *conf;
    int fd;
    bool activated;        /* fd came from systemd */
    char *path;            /* the socket file we created (NULL if activated) */
    struct stat st;        /* and its identity (device, inode, change time),
                              so that fini removes only that file */
    char *node;            /* for ping */
    bool have_group;       /* the control group (socket_group) exists */
    gid_t group;
    ev_io accept_w;        /* server_accept_cb */
    ev_timer resume_w;     /* server_resume_cb: accepting again after EMFILE */
    struct conn *conns;
    unsigned nconns;
} server = { .fd = -1 };

static cJSON *(*status_fn)(void);
static int (*reload_fn)(struct esd_err *err);
static double idle_secs = PROTO_IDLE_SECS;
static bool no_children; /* ctl_test_answer: commands never fork */

static cJSON *
must(cJSON *v)
{
    if (!v)
        abort();
    return v;
}

/* ---- who may do what ---- */

static bool
in_group(const struct ucred *cred, const gid_t *groups, size_t ngroups, gid_t g)
{
    if (cred->gid == g)
        return true;
    for (size_t i = 0; i < ngroups; i++)
        if (groups[i] == g)
            return true;
    return false;
}

/* The peer is esd's own uid, and that is not root: the uid esd's attempts
 * run as, with esd's groups, so it may be running a job's recipe code. */
static bool
is_esd_uid(const struct ucred *cred)
{
    return geteuid() != 0 && cred->uid == geteuid();
}

static bool
in_control_group(const struct ucred *cred, const gid_t *groups, size_t ngroups)
{
    return server.have_group && in_group(cred, groups, ngroups, server.group);
}

/* May c run node commands? Root, or a member of the control group; never
 * esd's own (non-root) uid, which is the attempts' uid, whatever its groups
 * (the shipped unit's esd user has the control group as primary group). */
static bool
privileged(const struct conn *c)
{
    if (c->cred.uid == 0)
        return true;
    return !is_esd_uid(&c->cred) && in_control_group(&c->cred, c->groups, c->ngroups);
}

static const char *
group_name(void)
{
    return server.conf && server.conf->socket_group && *server.conf->socket_group
               ? server.conf->socket_group
               : "esd";
}

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
    else if (in_control_group(cred, groups, ngroups))
        s.cls = PROTO_CLASS_SERVICE;
    /* esd's own uid keys itself even without an entry (DynamicUser=). */
    if (cred->uid != geteuid() && !uid_known(cred->uid))
        s.key = PROTO_SHARE_POOL;
    return s;
}

/* The spool's record of the nodes that refuse job_dir (jobs.c) in r's
 * "refused_by", when there are any. */
static void
add_refusals(cJSON *r, const char *job_dir)
{
    cJSON *a = jobs_spool_refusals(job_dir);

    if (cJSON_GetArraySize(a) > 0)
        cJSON_AddItemToObject(r, "refused_by", a);
    else
        cJSON_Delete(a);
}

/* What a request on a job directory found out about it. */
struct jobref {
    char *dir;        /* resolved */
    bool exists;
    struct stat st;
};

static void
jobref_free(struct jobref *jr)
{
    free(jr->dir);
    jr->dir = NULL;
}

/* Resolves and stats job_dir with the caller's file system identity. */
static int
jobref_get(const struct conn *c, const char *job_dir, struct jobref *jr, const char **code,
           struct esd_err *err)
{
    struct fsid prev;
    int r;

    memset(jr, 0, sizeof(*jr));
    if (job_dir[0] != '/') {
        *code = PROTO_E_BAD_ARGS;
        return err_set(err, -EINVAL, "job_dir must be an absolute path, got %.200s", job_dir);
    }
    prev = jobs_fs_as(c->cred.uid, c->cred.gid);
    r = pypath_realpath(job_dir, &jr->dir, err);
    if (r == 0) {
        if (stat(jr->dir, &jr->st) == 0)
            jr->exists = S_ISDIR(jr->st.st_mode);
        else if (errno != ENOENT && errno != ENOTDIR)
            r = err_sys(err, -errno, "cannot reach the job directory %s", jr->dir);
    }
    jobs_fs_restore(prev);
    if (r == 0 && !jr->exists && S_ISREG(jr->st.st_mode))
        r = err_set(err, -ENOTDIR, "%s is not a directory", jr->dir);
    if (r < 0) {
        *code = r == -EACCES || r == -EPERM ? PROTO_E_DENIED : PROTO_E_NOT_FOUND;
        jobref_free(jr);
    }
    return r;
}

/*
 * The identity an operation on jr runs with (DESIGN.md "Security model"):
 * a user's own, with the groups the kernel gave their connection; root's
 * on a user's job, that job's owner's, with the owner's groups from the
 * user database (never the directory's group); root's into a directory
 * that does not exist yet (prepare), the owner's of its nearest existing
 * parent when that is not root (prepare_owner), so that nothing root-owned appears in a user's
 * directory and no link planted there redirects root's writes. *cred
 * holds what was looked up (spawn_cred_free). 0, or a negative errno with
 * err set when the owner has no entry in the user database.
 */
static int
ident_for(const struct conn *c, const struct jobref *jr, struct ident *who,
          struct spawn_cred *cred, struct esd_err *err)
{
    uid_t owner = 0;
    int r;

    memset(who, 0, sizeof(*who));
    memset(cred, 0, sizeof(*cred));
    if (geteuid() != 0)
        return 0;
    if (c->cred.uid != 0) {
        who->change = true;
        who->uid = c->cred.uid;
        who->gid = c->cred.gid;
        who->groups = c->groups;
        who->ngroups = c->ngroups;
        return 0;
    }
    if (jr && jr->exists)
        owner = jr->st.st_uid;
    else if (jr && jr->dir && prepare_owner(jr->dir, &owner, NULL, NULL) < 0)
        owner = 0; /* root, through descriptors; prepare says what is wrong */
    if (owner == 0)
        return 0;
    if ((r = spawn_cred_for_uid(owner, cred, err)) < 0)
        return r;
    who->change = true;
    who->uid = cred->uid;
    who->gid = cred->gid;
    who->groups = cred->groups;
    who->ngroups = cred->ngroups;
    return 0;
}

static int
deny(const struct conn *c, const struct cmd_def *cmd, const char **code, struct esd_err *err,
     const char *why)
{
    *code = PROTO_E_DENIED;
    return err_set(err, -EACCES, "%s", why);
}

/* Every refusal is logged with the peer, whichever check made it. */
static void
log_refusal(const struct conn *c, const char *cmd, const char *code, const char *why)
{
    if (code && !strcmp(code, PROTO_E_DENIED))
        log_notice(NULL, "control: %s from uid %u pid %d refused: %s", cmd,
                   (unsigned)c->cred.uid, (int)c->cred.pid, why);
}

/*
 * May c run cmd with args? For commands on a job directory, jr is filled
 * (resolved as the caller). Returns 0 or a negative errno with *code.
 */
static int
authorise(const struct conn *c, const struct cmd_def *cmd, const cJSON *args, struct jobref *jr,
          const char **code, struct esd_err *err)
{
    const char *dir = cmd_arg_str(args, O_JOB_DIR);
    bool creates = cmd->id == CMD_PREPARE || (cmd->id == CMD_SUBMIT && cmd_arg_has(args, O_CONFIG));
    char msg[512];
    int r;

    memset(jr, 0, sizeof(*jr));
    if (cmd->auth == AUTH_NODE && !privileged(c)) {
        if (is_esd_uid(&c->cred))
            snprintf(msg, sizeof(msg), "%s changes this node's work: only root or members of "
                     "group %s may run it, not uid %u, which esd and its attempts run as",
                     cmd->name, group_name(), (unsigned)c->cred.uid);
        else
            snprintf(msg, sizeof(msg), "%s changes this node's work: only root or members of "
                     "group %s may run it", cmd->name, group_name());
        return deny(c, cmd, code, err, msg);
    }
    /* esd's own uid works its own jobs: the service-user deployment's
     * `sudo -u esd esctl submit` (the ownership check below). */
    if (cmd->auth == AUTH_JOB && !privileged(c) && !is_esd_uid(&c->cred)) {
        if (geteuid() != 0)
            snprintf(msg, sizeof(msg), "%s changes this node's work: only root, members of "
                     "group %s or uid %u (esd), on jobs they own, may run it", cmd->name,
                     group_name(), (unsigned)geteuid());
        else
            snprintf(msg, sizeof(msg), "%s changes this node's work: only root or members of "
                     "group %s may run it", cmd->name, group_name());
        return deny(c, cmd, code, err, msg);
    }
    if (!dir)
        return 0;
    if ((r = jobref_get(c, dir, jr, code, err)) < 0)
        return r;
    if (cmd->auth != AUTH_JOB)
        return 0;
    if (!jr->exists && !creates && cmd->id != CMD_CANCEL && cmd->id != CMD_FORGET) {
        *code = PROTO_E_NOT_FOUND;
        r = err_set(err, -ENOENT, "no job directory %s", jr->dir);
        jobref_free(jr);
        return r;
    }
    if (jr->exists && c->cred.uid != 0 && jr->st.st_uid != c->cred.uid) {
        snprintf(msg, sizeof(msg), "%.300s is owned by uid %u, not by you (uid %u)", jr->dir,
                 (unsigned)jr->st.st_uid, (unsigned)c->cred.uid);
        r = deny(c, cmd, code, err, msg);
        jobref_free(jr);
        return r;
    }
    /* A non-root esd cannot read the caller's recipe and dataset as the
     * caller, and must not read them as itself on the caller's behalf. */
    if (creates && geteuid() != 0 && c->cred.uid != 0 && c->cred.uid != geteuid()) {
        snprintf(msg, sizeof(msg), "esd runs as uid %u and cannot read your files as you; run "
                 "`esctl prepare --local` yourself, then `esctl submit %.300s`",
                 (unsigned)geteuid(), jr->dir);
        r = deny(c, cmd, code, err, msg);
        jobref_free(jr);
        return r;
    }
    return 0;
}

/* ---- commands answered at once ---- */

/* A command's handler: the result, or NULL with *code and err; or, for an
 * operation started in a child, NULL with *code NULL (the reply comes
 * later). */
typedef cJSON *handler_fn(struct conn *c, const struct cmd_def *cmd, const cJSON *args,
                          struct jobref *jr, const char **code, struct esd_err *err);

static cJSON *
cmd_ping(struct conn *c, const struct cmd_def *cmd, const cJSON *args, struct jobref *jr,
         const char **code, struct esd_err *err)
{
    cJSON *r = must(cJSON_CreateObject());

    json_add_bool(r, "pong", true);
    json_add_str(r, "version", ESD_VERSION);
    json_add_str(r, "node", server.node);
    json_add_int(r, "pid", (long long)getpid());
    return r;
}

static cJSON *
cmd_version(struct conn *c, const struct cmd_def *cmd, const cJSON *args, struct jobref *jr,
            const char **code, struct esd_err *err)
{
    cJSON *r = must(cJSON_CreateObject());

    json_add_str(r, "version", ESD_VERSION);
    json_add_int(r, "protocol", PROTO_VERSION);
    json_add_str(r, "node", server.node);
    json_add_int(r, "max_message", PROTO_MAX_MESSAGE);
    /* the fair shares of common/proto.h */
    json_add_int(r, "max_connections", proto_conn_limits.max);
    json_add_int(r, "max_connections_not_root", proto_conn_limits.not_root);
    json_add_int(r, "max_connections_unprivileged", proto_conn_limits.unpriv);
    json_add_int(r, "max_connections_per_uid", proto_conn_limits.per_key);
    json_add_int(r, "max_operations", proto_op_limits.max);
    json_add_int(r, "max_operations_not_root", proto_op_limits.not_root);
    json_add_int(r, "max_operations_unprivileged", proto_op_limits.unpriv);
    json_add_int(r, "max_operations_per_uid", proto_op_limits.per_key);
    json_add_int(r, "idle_secs", (long long)idle_secs);
    return r;
}

static cJSON *
daemon_status(const char **code, struct esd_err *err)
{
    cJSON *r = status_fn ? status_fn() : NULL;

    if (!r) {
        *code = PROTO_E_INTERNAL;
        err_set(err, -ENODATA, "the daemon's status is not available");
    }
    return r;
}

/*
 * The status of a job this node has loaded, from its view (jobview.h):
 * bounded, and answered without reading the done records again. NULL when
 * there is none, or when the caller, who is neither root nor the job's
 * owner, cannot list its state/done as themselves (what the child that
 * reads the directory as the caller would find out); a --lock-timeout
 * other than the manifest's is read in the child too.
 */
static cJSON *
view_status(struct conn *c, const cJSON *args, const struct jobref *jr)
{
    struct job *j = jr->exists ? jobs_find(jr->dir) : NULL;
    cJSON *r;

    /* the shards' history (--all, --state, --sort) is read in a child */
    if (!j || !j->loaded || strcmp(j->job_dir, jr->dir) || j->ino != jr->st.st_ino ||
        cmd_arg_has(args, O_LOCK_TIMEOUT) || cmd_arg_flag(args, O_ALL) ||
        cmd_arg_has(args, O_STATE) || cmd_arg_has(args, O_SORT))
        return NULL;
    if (c->cred.uid != 0 && c->cred.uid != jr->st.st_uid) {
        struct fsid prev = jobs_fs_as(c->cred.uid, c->cred.gid);
        char *done = xasprintf("%s/state/done", jr->dir);
        int fd = open(done, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

        jobs_fs_restore(prev);
        free(done);
        if (fd < 0)
            return NULL;
        close(fd);
    }
    if (!(r = jobview_status(j, cmd_arg_flag(args, O_ALL))))
        return NULL;
    json_add_str(r, "node", server.node);
    json_add_str(r, "state", job_state_name[j->state]);
    add_refusals(r, jr->dir);
    return r;
}

/* Whether a job in state is one list --state want shows. */
static bool
state_matches(const char *want, const char *state)
{
    static const char *const running[] = { "active", "draining", "finalizing" };
    static const char *const finished[] = { "complete", "failed", "cancelled" };
    const char *const *set = !strcmp(want, "running") ? running
                             : !strcmp(want, "finished") ? finished : NULL;

    if (!state)
        return false;
    if (!set)
        return !strcmp(!strcmp(want, "merged") ? "complete" : want, state);
    for (size_t i = 0; i < 3; i++)
        if (!strcmp(set[i], state))
            return true;
    return false;
}

static cJSON *
cmd_list(struct conn *c, const struct cmd_def *cmd, const cJSON *args, struct jobref *jr,
         const char **code, struct esd_err *err)
{
    static const char *const known[] = { "active",  "draining", "finalizing", "complete",
                                         "merged",  "failed",   "cancelled",  "running",
                                         "finished", "forgotten", "spooled" };
    const char *want = cmd_arg_str(args, O_STATE);
    cJSON *r, *jobs, *x, *next;
    bool ok = !want;

    for (size_t i = 0; want && i < sizeof(known) / sizeof(known[0]); i++)
        ok = ok || !strcmp(want, known[i]);
    if (!ok) {
        *code = PROTO_E_BAD_ARGS;
        err_set(err, -EINVAL, "list: unknown state \"%.100s\" (active, draining, finalizing, "
                "complete or merged, failed, cancelled; running, finished; with --all also "
                "forgotten, spooled)", want);
        return NULL;
    }
    r = must(cJSON_CreateObject());
    json_add_str(r, "node", server.node);
    jobs = jobview_jobs_json();
    if (cmd_arg_flag(args, O_ALL)) {
        cJSON *more = jobs_spool_unheld_json();

        while (cJSON_GetArraySize(more) > 0)
            cJSON_AddItemToArray(jobs, cJSON_DetachItemFromArray(more, 0));
        cJSON_Delete(more);
    }
    for (x = jobs->child; want && x; x = next) {
        next = x->next;
        if (!state_matches(want, json_get_str(x, "state")))
            cJSON_Delete(cJSON_DetachItemViaPointer(jobs, x));
    }
    cJSON_AddItemToObject(r, "jobs", jobs);
    return r;
}

static cJSON *
cmd_config(struct conn *c, const struct cmd_def *cmd, const cJSON *args, struct jobref *jr,
           const char **code, struct esd_err *err)
{
    if (!server.conf) {
        *code = PROTO_E_INTERNAL;
        err_set(err, -ENODATA, "no configuration");
        return NULL;
    }
    return config_json(server.conf);
}

/* The same reload as SIGHUP's, answered: systemd's ExecReload= (esctl
 * reload) fails with the error when the new file is refused. */
static cJSON *
cmd_reload(struct conn *c, const struct cmd_def *cmd, const cJSON *args, struct jobref *jr,
           const char **code, struct esd_err *err)
{
    cJSON *r;

    (void)cmd;
    (void)args;
    (void)jr;
    log_notice(NULL, "control: reload by uid %u pid %d", (unsigned)c->cred.uid, (int)c->cred.pid);
    if (!reload_fn || reload_fn(err) < 0) {
        *code = PROTO_E_FAILED;
        if (!reload_fn)
            err_set(err, -ENOTSUP, "this esd does not reload");
        return NULL;
    }
    r = must(cJSON_CreateObject());
    json_add_str(r, "path", server.conf && server.conf->path ? server.conf->path : "defaults");
    return r;
}

static cJSON *
cmd_drain(struct conn *c, const struct cmd_def *cmd, const cJSON *args, struct jobref *jr,
          const char **code, struct esd_err *err)
{
    log_notice(NULL, "control: %s by uid %u pid %d", cmd->name, (unsigned)c->cred.uid,
               (int)c->cred.pid);
    if (cmd->id == CMD_DRAIN) {
        char why[160], at[40];

        time_iso_now(at, NULL);
        snprintf(why, sizeof(why), "esctl drain%s by uid %u at %s",
                 cmd_arg_flag(args, O_RELEASE) ? " --release" : "", (unsigned)c->cred.uid, at);
        nodes_set_drain_reason(why);
        sched_hold(cmd_arg_flag(args, O_RELEASE));
    } else {
        nodes_set_drain_reason(NULL);
        sched_resume();
    }
    return daemon_status(code, err);
}

static cJSON *
job_result(const struct job *j)
{
    cJSON *r = must(cJSON_CreateObject());

    json_add_str(r, "job_dir", j->job_dir);
    json_add_str(r, "key", j->key);
    json_add_str(r, "output", j->output);
    json_add_str(r, "state", job_state_name[j->state]);
    return r;
}

static cJSON *
cmd_cancel(struct conn *c, const struct cmd_def *cmd, const cJSON *args, struct jobref *jr,
           const char **code, struct esd_err *err)
{
    bool everywhere = cmd_arg_flag(args, O_EVERYWHERE);
    struct job *j = jobs_find(jr->dir);
    cJSON *r;

    /* The directory is gone: only its recorded owner (or root, or esd's
     * uid) may cancel what is registered under its name. */
    if (!jr->exists && c->cred.uid != 0 && c->cred.uid != geteuid() &&
        (!j || !j->loaded || j->uid != c->cred.uid)) {
        char msg[512];

        snprintf(msg, sizeof(msg), "%.300s does not exist, so its owner cannot be checked; "
                 "only root or the job's owner may cancel it", jr->dir);
        deny(c, cmd, code, err, msg);
        return NULL;
    }
    if (!j && !everywhere) {
        *code = PROTO_E_NOT_FOUND;
        err_set(err, -ENOENT, "%s is not a job of this node (--everywhere cancels it on every "
                "node through the job directory)", jr->dir);
        return NULL;
    }
    if (j && (j->state == JOB_FINALIZING || j->state == JOB_COMPLETE)) {
        *code = PROTO_E_CONFLICT;
        err_set(err, -EBUSY, "job %s is %s; there is nothing left to cancel", jr->dir,
                j->state == JOB_FINALIZING ? "being merged" : "complete");
        return NULL;
    }
    if (everywhere) {
        char *manifest = jr->exists ? fs_join(jr->dir, "manifest.json") : NULL;
        struct stat st;
        struct fsid prev = jobs_fs_as(c->cred.uid, c->cred.gid);
        int sr = !manifest ? -ENOENT : stat(manifest, &st) < 0 ? -errno : 0;
        bool is_job = sr == 0 && S_ISREG(st.st_mode);

        if (!is_job && !manifest_dir_explain(jr->dir, sr ? sr : -ENOENT, err))
            err_set(err, -ENOENT, "%s: not a job directory (manifest.json is not a file)",
                    jr->dir);
        jobs_fs_restore(prev);
        free(manifest);
        if (!is_job) {
            *code = err->code == -EACCES ? PROTO_E_DENIED : PROTO_E_NOT_FOUND;
            return NULL;
        }
        if (geteuid() == 0 && jr->st.st_uid == 0) {
            deny(c, cmd, code, err, "a job directory owned by root is not a job esd works; "
                 "not writing into it");
            return NULL;
        }
        if (jobs_cancel_everywhere(jr->dir, jr->st.st_uid, jr->st.st_gid, c->cred.uid, err) < 0) {
            *code = PROTO_E_FAILED;
            return NULL;
        }
    }
    log_notice(j ? &(struct log_ctx){ .job = &j->log } : NULL,
               "control: cancel %s%s by uid %u pid %d", jr->dir, everywhere ? " on every node" : "",
               (unsigned)c->cred.uid, (int)c->cred.pid);
    if (j) {
        j->cancelled_everywhere = everywhere;
        jobs_set_state(j, JOB_CANCELLED, everywhere ? "cancelled on every node" : "cancelled");
        runner_stop_job(j);
        r = job_result(j);
    } else {
        r = must(cJSON_CreateObject());
        json_add_str(r, "job_dir", jr->dir);
        json_add_str(r, "state", "cancelled");
    }
    json_add_bool(r, "everywhere", everywhere);
    json_add_int(r, "stopping", j ? (long long)j->running : 0);
    return r;
}

/*
 * forget: a job that is over (complete, failed, cancelled) and has nothing
 * running here leaves this node's registry (and with --everywhere the
 * spool: jobs_forget). A job still worked is refused: forget never stops
 * work, cancel does.
 */
static cJSON *
cmd_forget(struct conn *c, const struct cmd_def *cmd, const cJSON *args, struct jobref *jr,
           const char **code, struct esd_err *err)
{
    bool everywhere = cmd_arg_flag(args, O_EVERYWHERE);
    struct job *j = jobs_find(jr->dir);
    cJSON *r;

    /* the directory is gone: only its recorded owner (or root, or esd's
     * uid) may forget what is registered under its name */
    if (!jr->exists && c->cred.uid != 0 && c->cred.uid != geteuid() &&
        (!j || j->uid != c->cred.uid)) {
        char msg[512];

        snprintf(msg, sizeof(msg), "%.300s does not exist, so its owner cannot be checked; "
                 "only root or the job's owner may forget it", jr->dir);
        deny(c, cmd, code, err, msg);
        return NULL;
    }
    if (!j) {
        if (!everywhere || jobs_forget_spool(jr->dir, err) < 0) {
            *code = PROTO_E_NOT_FOUND;
            err_set(err, -ENOENT, "%s is not a job of this node%s", jr->dir,
                    everywhere ? ", nor of the spool" : " (--everywhere forgets it in the spool)");
            return NULL;
        }
        log_notice(NULL, "control: forget %s on every node by uid %u pid %d", jr->dir,
                   (unsigned)c->cred.uid, (int)c->cred.pid);
        r = must(cJSON_CreateObject());
        json_add_str(r, "job_dir", jr->dir);
        json_add_str(r, "state", "forgotten");
        json_add_bool(r, "everywhere", true);
        return r;
    }
    if (!jobs_forgettable(j)) {
        *code = PROTO_E_CONFLICT;
        if (j->running || j->finalize)
            err_set(err, -EBUSY, "job %s is %s and still has %zu attempt(s)%s running on this "
                    "node; try again once they ended", jr->dir, job_state_name[j->state],
                    j->running, j->finalize ? " or its merge" : "");
        else
            err_set(err, -EBUSY, "job %s is %s on this node; forget drops only a job that is "
                    "over: cancel it first (esctl cancel %s%s)", jr->dir,
                    job_state_name[j->state], jr->dir, everywhere ? " --everywhere" : "");
        return NULL;
    }
    log_notice(NULL, "control: forget %s%s by uid %u pid %d", jr->dir,
               everywhere ? " on every node" : "", (unsigned)c->cred.uid, (int)c->cred.pid);
    r = job_result(j);
    json_add_bool(r, "everywhere", everywhere);
    jobs_forget(j, everywhere ? FORGET_EVERYWHERE : FORGET_HERE,
                everywhere ? "esctl forget --everywhere" : "esctl forget");
    return r;
}

/*
 * Does esd see, at the path the client names in the request's "seen"
 * (common/proto.h), the directory the client sees there? Not under
 * PrivateTmp= (another /tmp) or in another mount namespace. 0 (also when
 * the client sent nothing), or -ENOENT with *code and err naming the cause
 * and the fix.
 */
static int
seen_check(const struct conn *c, const cJSON *root, const char **code, struct esd_err *err)
{
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(root, "seen");
    const char *path = json_get_str(s, "path");
    long long dev, ino, tdev, tino;
    struct stat st, tmp;
    struct fsid prev;
    bool tmp_differs, in_tmp;
    int r;

    if (!path || path[0] != '/' || json_get_int(s, "dev", &dev) < 0 ||
        json_get_int(s, "ino", &ino) < 0)
        return 0;
    prev = jobs_fs_as(c->cred.uid, c->cred.gid);
    r = stat(path, &st) < 0 ? -errno : 0;
    jobs_fs_restore(prev);
    if (r == 0 && (long long)st.st_dev == dev && (long long)st.st_ino == ino)
        return 0;
    tmp_differs = json_get_int(s, "tmp_dev", &tdev) == 0 && json_get_int(s, "tmp_ino", &tino) == 0 &&
                  (stat("/tmp", &tmp) < 0 || (long long)tmp.st_dev != tdev ||
                   (long long)tmp.st_ino != tino);
    in_tmp = !strcmp(path, "/tmp") || !strncmp(path, "/tmp/", 5) || !strcmp(path, "/var/tmp") ||
             !strncmp(path, "/var/tmp/", 9);
    *code = PROTO_E_FAILED;
    if (tmp_differs && in_tmp)
        return err_set(err, -ENOENT, "esd runs with PrivateTmp: %s is not the same directory "
                       "for it (esd has a /tmp and /var/tmp of its own); put the job under a "
                       "directory esd shares, such as the shared job mount listed in "
                       "ReadWritePaths= (systemctl edit esd), not under /tmp", path);
    if (r < 0)
        return err_set(err, -ENOENT, "esd does not see %s, which you see (device %lld, inode "
                       "%lld): esd runs in a mount namespace of its own (systemd's PrivateTmp=, "
                       "PrivateMounts=, ProtectHome=, or a container); put the job on a file "
                       "system esd sees at the same path", path, dev, ino);
    return err_set(err, -ENOENT, "esd sees another directory at %s (device %llu, inode %llu) "
                   "than you do (device %lld, inode %lld): esd runs in a mount namespace of its "
                   "own (systemd's PrivateTmp=, PrivateMounts=, ProtectHome=, or a container); "
                   "put the job on a file system esd sees at the same path", path,
                   (unsigned long long)st.st_dev, (unsigned long long)st.st_ino, dev, ino);
}

/*
 * submit's checks before anything is prepared or registered: esd can write
 * where the job is (not read-only for it: ProtectSystem=strict), and with
 * --everywhere a spool_dir exists and the job and the spool are on file
 * systems that other nodes share (shared_fs_check). 0, or a negative errno
 * with *code and err naming the cause and the fix.
 */
static int
submit_precheck(const cJSON *args, const struct jobref *jr, const char **code,
                struct esd_err *err)
{
    const char *spool = jobs_spool_dir(), *type = NULL, *stype = NULL;
    bool local = false, rdonly = false, slocal = false;
    struct stat st;
    char *at = NULL;
    int r;

    *code = PROTO_E_FAILED;
    /* (a file system esd may not even statfs is not judged here: the
     * checks after say what is wrong with it) */
    if (fs_kind(jr->dir, &type, &local, &rdonly, &at, err) < 0)
        err_clear(err);
    if (rdonly) {
        r = err_set(err, -EROFS, "%s is read-only for esd (%s is on a file system mounted "
                    "read-only in esd's view: systemd's ProtectSystem=strict, unless the "
                    "directory is listed in ReadWritePaths=); add a drop-in with "
                    "`systemctl edit esd`: [Service] ReadWritePaths=%s, then `systemctl "
                    "restart esd`", jr->dir, at, at);
        free(at);
        return r;
    }
    free(at);
    if (!cmd_arg_flag(args, O_EVERYWHERE))
        return 0;
    if (!spool)
        return err_set(err, -EINVAL, "no spool_dir is configured on this node, so --everywhere "
                       "cannot register the job for every node (set spool_dir in esd.yaml to a "
                       "directory on the shared storage, or submit without --everywhere)");
    if (stat(spool, &st) < 0 || !S_ISDIR(st.st_mode))
        return err_set(err, -ENOENT, "spool_dir %s does not exist on this node, so --everywhere "
                       "cannot register the job for every node; create it on the shared "
                       "storage (mkdir -p %s, writable by esd's user) or fix spool_dir in "
                       "esd.yaml", spool, spool);
    if (!server.conf->shared_fs_check)
        return 0;
    if (local)
        return err_set(err, -EXDEV, "%s is on a node-local file system (%s): other nodes cannot "
                       "see it, so --everywhere cannot work; put the job on the shared storage "
                       "(NFS, Lustre, GPFS, CephFS, ...), or submit without --everywhere "
                       "(shared_fs_check: false in esd.yaml for a single machine)", jr->dir,
                       type);
    if (fs_kind(spool, &stype, &slocal, &rdonly, NULL, err) < 0)
        err_clear(err);
    if (slocal)
        return err_set(err, -EXDEV, "spool_dir %s is on a node-local file system (%s): other "
                       "nodes never see what is registered there; point spool_dir at the "
                       "shared storage (shared_fs_check: false in esd.yaml for a single "
                       "machine)", spool, stype);
    return 0;
}

/* submit's checks of a job directory that exists, and its output. */
static int
submit_check(const struct conn *c, const cJSON *args, const struct jobref *jr, char **ret_out,
             const char **code, struct esd_err *err)
{
    const char *out = cmd_arg_str(args, O_OUTPUT);
    char *manifest;
    struct stat st;
    struct fsid prev;
    int r = 0;

    *ret_out = NULL;
    *code = PROTO_E_BAD_ARGS;
    if (geteuid() == 0 && jr->st.st_uid == 0) {
        char msg[512];

        snprintf(msg, sizeof(msg), "%.300s is owned by root, and esd never runs attempts as "
                 "root; give it to the user the attempts should run as", jr->dir);
        return deny(c, &cmd_table[CMD_SUBMIT], code, err, msg);
    }
    if (!(jr->st.st_mode & S_IWUSR))
        return err_set(err, -EACCES, "%s is not writable by its owner", jr->dir);
    manifest = fs_join(jr->dir, "manifest.json");
    prev = jobs_fs_as(c->cred.uid, c->cred.gid);
    if (stat(manifest, &st) < 0) {
        r = -errno;
        if (!manifest_dir_explain(jr->dir, r, err))
            r = err_sys(err, r, "cannot find %s", manifest);
        else if (err->code == -ENOENT)
            err_set(err, -ENOENT, "%s (or pass --config and --num-shards to submit)", err->msg);
        r = err->code;
    }
    if (r == 0 && out) {
        if (out[0] != '/')
            r = err_set(err, -EINVAL, "output must be an absolute path, got %.200s", out);
        else if ((r = pypath_realpath(out, ret_out, err)) == 0 && !fs_is_inside(jr->dir, *ret_out))
            r = err_set(err, -EACCES, "output %s is outside the job directory %s; esd merges "
                        "only inside it", *ret_out, jr->dir);
        else if (r == 0 && merge_output_clobbers(jr->dir, *ret_out))
            r = err_set(err, -EINVAL, "output %s would overwrite part of the job directory; "
                        "choose another path", *ret_out);
    }
    jobs_fs_restore(prev);
    free(manifest);
    if (r < 0) {
        free(*ret_out);
        *ret_out = NULL;
        if (r == -EACCES)
            *code = PROTO_E_DENIED;
        else if (r == -ENOENT)
            *code = PROTO_E_NOT_FOUND;
    }
    return r;
}

static cJSON *
submit_register(const struct conn *c, const cJSON *args, const struct jobref *jr,
                const char **code, struct esd_err *err)
{
    char *out = NULL;
    struct job *j;
    cJSON *res;

    if (submit_check(c, args, jr, &out, code, err) < 0)
        return NULL;
    j = jobs_register(jr->dir, &jr->st, out, cmd_arg_flag(args, O_EVERYWHERE), c->cred.uid, err);
    free(out);
    if (!j) {
        *code = PROTO_E_FAILED;
        return NULL;
    }
    /* submitted again after a failed merge: its record does not stand */
    finalize_retry(j);
    /* refused at load (say, a mount where claims cannot be exclusive, now
     * fixed): loaded again at once, with the file system checked again */
    if (!j->loaded)
        j->load_after = 0;
    log_notice(&(struct log_ctx){ .job = &j->log }, "control: job %s submitted by uid %u pid %d%s",
               j->job_dir, (unsigned)c->cred.uid, (int)c->cred.pid,
               cmd_arg_flag(args, O_EVERYWHERE) ? " for every node" : "");
    sched_kick();
    res = job_result(j);
    add_refusals(res, j->job_dir);
    return res;
}

/* esctl merge of a job this node works and has not merged: its election is
 * held again now (finalize_retry); NULL when the merge is the caller's own
 * operation (a job not worked here, or merged already). */
static cJSON *
merge_again(const struct conn *c, const struct jobref *jr)
{
    struct job *j = jr->dir ? jobs_find(jr->dir) : NULL;
    cJSON *r;

    if (!j || j->state == JOB_COMPLETE || j->state == JOB_CANCELLED)
        return NULL;
    /* (being merged here: nothing to hold again; a job with shards to do
     * is the operation's to refuse) */
    if (!j->finalize && !(j->state == JOB_FAILED ||
                          (j->loaded && j->claimer.ndone == j->m.nshards)))
        return NULL;
    if (!j->finalize && !finalize_retry(j))
        return NULL;
    log_notice(&(struct log_ctx){ .job = &j->log }, "control: merge of %s held again for uid %u "
               "pid %d", j->job_dir, (unsigned)c->cred.uid, (int)c->cred.pid);
    sched_kick();
    r = job_result(j);
    json_add_bool(r, "held_again", true);
    return r;
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
    if (c->then && result) {
        /* submit --config: prepared; now the registration */
        struct jobref jr = { 0 };
        const char *code2 = PROTO_E_INTERNAL;
        struct esd_err err;
        cJSON *res;

        err_clear(&err);
        if (jobref_get(c, cmd_arg_str(c->then, O_JOB_DIR), &jr, &code2, &err) == 0 && !jr.exists)
            err_set(&err, -ENOENT, "prepare left no job directory %s", jr.dir), code2 = PROTO_E_FAILED;
        if (jr.dir && jr.exists && (res = submit_register(c, c->then, &jr, &code2, &err))) {
            cJSON_AddItemToObject(res, "prepared", result);
            reply = proto_reply_ok(c->op_id, res);
        } else {
            cJSON_Delete(result);
            log_refusal(c, "submit", code2, err.msg);
            reply = proto_reply_error(c->op_id, code2, err.msg);
        }
        jobref_free(&jr);
    } else if (result) {
        if (c->op_cmd == CMD_STATUS && json_get_str(result, "job_dir"))
            add_refusals(result, json_get_str(result, "job_dir"));
        reply = proto_reply_ok(c->op_id, result);
    } else {
        log_refusal(c, cmd_table[c->op_cmd].name, code, message);
        reply = proto_reply_error(c->op_id, code, message);
    }
    cJSON_Delete(c->then);
    c->then = NULL;
    proto_frame(reply, &c->out);
    cJSON_Delete(reply);
    /* requests are idle-timed again */
    c->idle_w.repeat = idle_secs;
    ev_timer_again(server.loop, &c->idle_w);
    if (conn_flush(c))
        conn_process(c);
}

static const struct opchild_ops op_callbacks = { op_event, op_done };

static cJSON *
start_op(struct conn *c, enum cmd_id id, const cJSON *args, const struct jobref *jr,
         long long req_id, const char **code, struct esd_err *err)
{
    struct ident who;
    struct spawn_cred cred;

    if (no_children) {
        *code = PROTO_E_INTERNAL;
        err_set(err, -ENOSYS, "operations are not run here");
        return NULL;
    }
    if (ident_for(c, jr, &who, &cred, err) < 0) {
        *code = PROTO_E_DENIED;
        return NULL;
    }
    c->op = opchild_start(id, args, &who, &c->share, &op_callbacks, c, code, err);
    spawn_cred_free(&cred);
    if (!c->op)
        return NULL;
    c->op_id = req_id;
    c->op_cmd = id;
    *code = NULL;
    /* while it runs the connection is not idle; a hangup is looked for */
    c->idle_w.repeat = HANGUP_CHECK_SECS;
    ev_timer_again(server.loop, &c->idle_w);
    log_info(NULL, "control: %s %s for uid %u pid %d", cmd_table[id].name,
             jr && jr->dir ? jr->dir : "", (unsigned)c->cred.uid, (int)c->cred.pid);
    return NULL;
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
    int r;

    err_clear(&err);
    r = proto_parse_request(line, len, &req, &err);
    if (r < 0) {
        log_debug(NULL, "control request from uid %u pid %d refused: %s",
                  (unsigned)c->cred.uid, (int)c->cred.pid, err.msg);
        return proto_reply_error(req.id, proto_error_code(r), err.msg);
    }
    cmd = cmd_find(req.cmd);
    if (!cmd || !(cmd->flags & CMDF_DAEMON)) {
        err_set(&err, -EINVAL, cmd ? "%.100s runs in esctl only, not in esd"
                                   : "unknown command \"%.100s\"", req.cmd);
        reply = proto_reply_error(req.id, PROTO_E_UNKNOWN_COMMAND, err.msg);
        goto out;
    }
    if (cmd_args_check(cmd, req.args, &err) < 0) {
        reply = proto_reply_error(req.id, PROTO_E_BAD_ARGS, err.msg);
        goto out;
    }
    if ((cmd->id == CMD_SUBMIT || cmd->id == CMD_PREPARE) &&
        seen_check(c, req.root, &code, &err) < 0) {
        log_refusal(c, cmd->name, code, err.msg);
        reply = proto_reply_error(req.id, code, err.msg);
        goto out;
    }
    if (authorise(c, cmd, req.args, &jr, &code, &err) < 0) {
        log_refusal(c, cmd->name, code, err.msg);
        reply = proto_reply_error(req.id, code, err.msg);
        goto out;
    }
    switch (cmd->id) {
    case CMD_PING:
        result = cmd_ping(c, cmd, req.args, &jr, &code, &err);
        break;
    case CMD_VERSION:
        result = cmd_version(c, cmd, req.args, &jr, &code, &err);
        break;
    case CMD_LIST:
        result = cmd_list(c, cmd, req.args, &jr, &code, &err);
        break;
    case CMD_CONFIG:
        result = cmd_config(c, cmd, req.args, &jr, &code, &err);
        break;
    case CMD_RELOAD:
        result = cmd_reload(c, cmd, req.args, &jr, &code, &err);
        break;
    case CMD_DRAIN:
    case CMD_RESUME:
        result = cmd_drain(c, cmd, req.args, &jr, &code, &err);
        break;
    case CMD_CANCEL:
        result = cmd_cancel(c, cmd, req.args, &jr, &code, &err);
        break;
    case CMD_NODES:
        result = nodes_json();
        break;
    case CMD_FORGET:
        result = cmd_forget(c, cmd, req.args, &jr, &code, &err);
        break;
    case CMD_STATUS:
        /* a job's status is read in a child */
        if (!jr.dir)
            result = daemon_status(&code, &err);
        else if (!(result = view_status(c, req.args, &jr)))
            start_op(c, cmd->id, req.args, &jr, req.id, &code, &err);
        break;
    case CMD_MERGE:
        /* a job this node works is merged by its election: held again now */
        if ((result = merge_again(c, &jr)))
            break;
        start_op(c, cmd->id, req.args, &jr, req.id, &code, &err);
        break;
    case CMD_PREPARE:
    case CMD_RETRY:
    case CMD_VERIFY:
    case CMD_LOGS:
        if (cmd->id == CMD_LOGS && !cmd_arg_has(req.args, O_SHARD)) {
            code = PROTO_E_BAD_ARGS;
            err_set(&err, -EINVAL, "logs through esd needs --shard (esctl reads the journal "
                    "itself for a whole job)");
            break;
        }
        start_op(c, cmd->id, req.args, &jr, req.id, &code, &err);
        break;
    case CMD_SUBMIT:
        if (submit_precheck(req.args, &jr, &code, &err) < 0)
            break;
        if (!cmd_arg_has(req.args, O_CONFIG)) {
            result = submit_register(c, req.args, &jr, &code, &err);
            break;
        }
        {
            /* prepare first (in a child, as the caller), register after */
            cJSON *pargs = must(cJSON_Duplicate(req.args, true));

            cJSON_DeleteItemFromObjectCaseSensitive(pargs, "output");
            cJSON_DeleteItemFromObjectCaseSensitive(pargs, "everywhere");
            start_op(c, CMD_PREPARE, pargs, &jr, req.id, &code, &err);
            cJSON_Delete(pargs);
            if (c->op)
                c->then = must(cJSON_Duplicate(req.args, true));
        }
        break;
    default:
        code = PROTO_E_UNKNOWN_COMMAND;
        err_set(&err, -EINVAL, "%s is not answered by esd", cmd->name);
        break;
    }
    if (result) {
        reply = proto_reply_ok(req.id, result);
    } else if (code) {
        log_refusal(c, cmd->name, code, err.msg);
        reply = proto_reply_error(req.id, code, err.msg);
    }
out:
    jobref_free(&jr);
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
    snprintf(why, sizeof(why), "idle for %g s", idle_secs);
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
        log_warning(NULL, "control socket: cannot read the peer's credentials: %s; "
                    "closing the connection", strerror(errno));
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
    if (chmod(path, (mode_t)mode) < 0) {
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
        r = socket_create(c->socket_path, c->socket_group, c->socket_mode ? c->socket_mode : 0660, &fd, err);
        if (r < 0)
            return r;
        server.path = xstrdup(c->socket_path);
    }
    server.loop = loop;
    server.fd = fd;
    server.node = xstrdup(c->node_name ? c->node_name : "");
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

    server.conf = c;
    server.have_group = gr != NULL;
    server.group = gr ? gr->gr_gid : 0;
}

void
ctl_set_status(cJSON *(*fn)(void))
{
    status_fn = fn;
}

void
ctl_set_reload(int (*fn)(struct esd_err *err))
{
    reload_fn = fn;
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
