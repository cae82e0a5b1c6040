/*
 * ctlcmd: the commands esd answers on its control socket. Each command of
 * common/cmds.h that esd serves (CMDF_DAEMON) has one handler here, found
 * through handlers[], indexed by the command's id; the server (daemon/ctl.c)
 * has already checked the request's arguments against the command table
 * and calls ctlcmd_authorise before the handler. A handler answers at once
 * from the daemon's state (jobs.c, nodes.c, sched.c), or starts an
 * operation in a child process that reads or writes the job directory as
 * the caller (ctlcmd_server.op_start), whose end comes back through ctlcmd_op_reply.
 * Authorisation is here too because it depends on the command beyond its
 * table flags (which commands create a directory or may name one that is
 * gone) and on the job directory resolved as the caller.
 */
#include "ctlcmd.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "finalize.h"
#include "fsutil.h"
#include "jobs.h"
#include "jobview.h"
#include "json.h"
#include "log.h"
#include "manifest.h"
#include "merge.h"
#include "nodes.h"
#include "prepare.h"
#include "pypath.h"
#include "runner.h"
#include "sched.h"

struct ctlcmd_server ctlcmd_server = { .idle_secs = PROTO_IDLE_SECS };

static cJSON *
must(cJSON *v)
{
    if (!v)
        abort();
    return v;
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

/* ---- who may run what ---- */

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

bool
ctlcmd_in_control_group(const struct ucred *cred, const gid_t *groups, size_t ngroups)
{
    return ctlcmd_server.have_group && in_group(cred, groups, ngroups, ctlcmd_server.group);
}

/* The peer is esd's own uid, and that is not root: the uid esd's attempts
 * run as, with esd's groups, so it may be running a job's recipe code. */
bool
ctlcmd_is_esd_uid(const struct ucred *cred)
{
    return geteuid() != 0 && cred->uid == geteuid();
}

/* May c run node commands? Root, or a member of the control group; never
 * esd's own (non-root) uid, which is the attempts' uid, whatever its groups
 * (the shipped unit's esd user has the control group as primary group). */
bool
ctlcmd_privileged(const struct conn *c)
{
    if (c->cred.uid == 0)
        return true;
    return !ctlcmd_is_esd_uid(&c->cred) && ctlcmd_in_control_group(&c->cred, c->groups, c->ngroups);
}

const char *
ctlcmd_group_name(void)
{
    const struct esd_conf *c = ctlcmd_server.conf;

    return c && c->socket_group && *c->socket_group ? c->socket_group : "esd";
}

/* Every refusal is logged with the peer, whichever check made it. */
void
ctlcmd_log_refusal(const struct conn *c, const char *cmd, const char *code, const char *why)
{
    if (code && !strcmp(code, PROTO_E_DENIED))
        log_notice(NULL, "control: %s from uid %u pid %d refused: %s", cmd, (unsigned)c->cred.uid,
                   (int)c->cred.pid, why);
}

void
ctlcmd_jobref_free(struct jobref *jr)
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
        ctlcmd_jobref_free(jr);
    }
    return r;
}

/*
 * The identity an operation on jr runs with (ARCHITECTURE.md "Security model"):
 * a user's own, with the groups the kernel gave their connection; root's
 * on a user's job, that job's owner's, with the owner's groups from the
 * user database (never the directory's group); root's into a directory
 * that does not exist yet (prepare), the owner's of its nearest existing
 * parent when that is not root (prepare_owner), so that nothing root-owned appears in a user's
 * directory and no link planted there redirects root's writes. *cred
 * holds what was looked up (spawn_cred_free). 0, or a negative errno with
 * err set when the owner has no entry in the user database.
 */
int
ctlcmd_ident(const struct conn *c, const struct jobref *jr, struct ident *who,
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

/* ctlcmd_authorise past the seen check. */
static int
authorise(const struct conn *c, const struct cmd_def *cmd, const cJSON *args, struct jobref *jr,
          const char **code, struct esd_err *err)
{
    const char *dir = cmd_arg_str(args, O_JOB_DIR);
    bool creates = cmd->id == CMD_PREPARE || (cmd->id == CMD_SUBMIT && cmd_arg_has(args, O_CONFIG));
    char msg[512];
    int r;

    memset(jr, 0, sizeof(*jr));
    if (cmd->auth == AUTH_NODE && !ctlcmd_privileged(c)) {
        if (ctlcmd_is_esd_uid(&c->cred))
            snprintf(msg, sizeof(msg),
                     "%s changes this node's work: only root or members of "
                     "group %s may run it, not uid %u, which esd and its attempts run as",
                     cmd->name, ctlcmd_group_name(), (unsigned)c->cred.uid);
        else
            snprintf(msg, sizeof(msg),
                     "%s changes this node's work: only root or members of "
                     "group %s may run it",
                     cmd->name, ctlcmd_group_name());
        return deny(c, cmd, code, err, msg);
    }
    /* esd's own uid works its own jobs: the service-user deployment's
     * `sudo -u esd esctl submit` (the ownership check below). */
    if (cmd->auth == AUTH_JOB && !ctlcmd_privileged(c) && !ctlcmd_is_esd_uid(&c->cred)) {
        if (geteuid() != 0)
            snprintf(msg, sizeof(msg),
                     "%s changes this node's work: only root, members of "
                     "group %s or uid %u (esd), on jobs they own, may run it",
                     cmd->name, ctlcmd_group_name(), (unsigned)geteuid());
        else
            snprintf(msg, sizeof(msg),
                     "%s changes this node's work: only root or members of "
                     "group %s may run it",
                     cmd->name, ctlcmd_group_name());
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
        ctlcmd_jobref_free(jr);
        return r;
    }
    if (jr->exists && c->cred.uid != 0 && jr->st.st_uid != c->cred.uid) {
        snprintf(msg, sizeof(msg), "%.300s is owned by uid %u, not by you (uid %u)", jr->dir,
                 (unsigned)jr->st.st_uid, (unsigned)c->cred.uid);
        r = deny(c, cmd, code, err, msg);
        ctlcmd_jobref_free(jr);
        return r;
    }
    /* A non-root esd cannot read the caller's recipe and dataset as the
     * caller, and must not read them as itself on the caller's behalf. */
    if (creates && geteuid() != 0 && c->cred.uid != 0 && c->cred.uid != geteuid()) {
        snprintf(msg, sizeof(msg),
                 "esd runs as uid %u and cannot read your files as you; run "
                 "`esctl prepare --local` yourself, then `esctl submit %.300s`",
                 (unsigned)geteuid(), jr->dir);
        r = deny(c, cmd, code, err, msg);
        ctlcmd_jobref_free(jr);
        return r;
    }
    return 0;
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
    tmp_differs =
        json_get_int(s, "tmp_dev", &tdev) == 0 && json_get_int(s, "tmp_ino", &tino) == 0 &&
        (stat("/tmp", &tmp) < 0 || (long long)tmp.st_dev != tdev || (long long)tmp.st_ino != tino);
    in_tmp = !strcmp(path, "/tmp") || !strncmp(path, "/tmp/", 5) || !strcmp(path, "/var/tmp") ||
             !strncmp(path, "/var/tmp/", 9);
    *code = PROTO_E_FAILED;
    if (tmp_differs && in_tmp)
        return err_set(err, -ENOENT,
                       "esd runs with PrivateTmp: %s is not the same directory "
                       "for it (esd has a /tmp and /var/tmp of its own); put the job under a "
                       "directory esd shares, such as the shared job mount listed in "
                       "ReadWritePaths= (systemctl edit esd), not under /tmp",
                       path);
    if (r < 0)
        return err_set(err, -ENOENT,
                       "esd does not see %s, which you see (device %lld, inode "
                       "%lld): esd runs in a mount namespace of its own (systemd's PrivateTmp=, "
                       "PrivateMounts=, ProtectHome=, or a container); put the job on a file "
                       "system esd sees at the same path",
                       path, dev, ino);
    return err_set(err, -ENOENT,
                   "esd sees another directory at %s (device %llu, inode %llu) "
                   "than you do (device %lld, inode %lld): esd runs in a mount namespace of its "
                   "own (systemd's PrivateTmp=, PrivateMounts=, ProtectHome=, or a container); "
                   "put the job on a file system esd sees at the same path",
                   path, (unsigned long long)st.st_dev, (unsigned long long)st.st_ino, dev, ino);
}

int
ctlcmd_authorise(const struct conn *c, const struct cmd_def *cmd, const struct proto_request *req,
                 struct jobref *jr, const char **code, struct esd_err *err)
{
    int r;

    memset(jr, 0, sizeof(*jr));
    if ((cmd->id == CMD_SUBMIT || cmd->id == CMD_PREPARE) &&
        (r = seen_check(c, req->root, code, err)) < 0)
        return r;
    return authorise(c, cmd, req->args, jr, code, err);
}

/* ---- the handlers (ctlcmd_fn) ---- */

static cJSON *
handle_ping(struct conn *c, const struct cmd_def *cmd, const cJSON *args, struct jobref *jr,
            long long req_id, const char **code, struct esd_err *err)
{
    cJSON *r = must(cJSON_CreateObject());

    json_add_bool(r, "pong", true);
    json_add_str(r, "version", ESD_VERSION);
    json_add_str(r, "node", ctlcmd_server.node);
    json_add_int(r, "pid", (long long)getpid());
    return r;
}

static cJSON *
handle_version(struct conn *c, const struct cmd_def *cmd, const cJSON *args, struct jobref *jr,
               long long req_id, const char **code, struct esd_err *err)
{
    cJSON *r = must(cJSON_CreateObject());

    json_add_str(r, "version", ESD_VERSION);
    json_add_int(r, "protocol", PROTO_VERSION);
    json_add_str(r, "node", ctlcmd_server.node);
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
    json_add_int(r, "idle_secs", (long long)ctlcmd_server.idle_secs);
    return r;
}

static cJSON *
daemon_status(const char **code, struct esd_err *err)
{
    cJSON *r = ctlcmd_server.status ? ctlcmd_server.status() : NULL;

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
    json_add_str(r, "node", ctlcmd_server.node);
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
    const char *const *set = !strcmp(want, "running")    ? running
                             : !strcmp(want, "finished") ? finished
                                                         : NULL;

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
handle_list(struct conn *c, const struct cmd_def *cmd, const cJSON *args, struct jobref *jr,
            long long req_id, const char **code, struct esd_err *err)
{
    static const char *const known[] = { "active",   "draining",  "finalizing", "complete",
                                         "merged",   "failed",    "cancelled",  "running",
                                         "finished", "forgotten", "spooled" };
    const char *want = cmd_arg_str(args, O_STATE);
    cJSON *r, *jobs, *x, *next;
    bool ok = !want;

    for (size_t i = 0; want && i < sizeof(known) / sizeof(known[0]); i++)
        ok = ok || !strcmp(want, known[i]);
    if (!ok) {
        *code = PROTO_E_BAD_ARGS;
        err_set(err, -EINVAL,
                "list: unknown state \"%.100s\" (active, draining, finalizing, "
                "complete or merged, failed, cancelled; running, finished; with --all also "
                "forgotten, spooled)",
                want);
        return NULL;
    }
    r = must(cJSON_CreateObject());
    json_add_str(r, "node", ctlcmd_server.node);
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
handle_config(struct conn *c, const struct cmd_def *cmd, const cJSON *args, struct jobref *jr,
              long long req_id, const char **code, struct esd_err *err)
{
    if (!ctlcmd_server.conf) {
        *code = PROTO_E_INTERNAL;
        err_set(err, -ENODATA, "no configuration");
        return NULL;
    }
    return config_json(ctlcmd_server.conf);
}

/* The same reload as SIGHUP's, answered: systemd's ExecReload= (esctl
 * reload) fails with the error when the new file is refused. */
static cJSON *
handle_reload(struct conn *c, const struct cmd_def *cmd, const cJSON *args, struct jobref *jr,
              long long req_id, const char **code, struct esd_err *err)
{
    const struct esd_conf *conf;
    cJSON *r;

    (void)cmd;
    (void)args;
    (void)jr;
    log_notice(NULL, "control: reload by uid %u pid %d", (unsigned)c->cred.uid, (int)c->cred.pid);
    if (!ctlcmd_server.reload || ctlcmd_server.reload(err) < 0) {
        *code = PROTO_E_FAILED;
        if (!ctlcmd_server.reload)
            err_set(err, -ENOTSUP, "this esd does not reload");
        return NULL;
    }
    r = must(cJSON_CreateObject());
    conf = ctlcmd_server.conf;
    json_add_str(r, "path", conf && conf->path ? conf->path : "defaults");
    return r;
}

static cJSON *
handle_drain(struct conn *c, const struct cmd_def *cmd, const cJSON *args, struct jobref *jr,
             long long req_id, const char **code, struct esd_err *err)
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
handle_cancel(struct conn *c, const struct cmd_def *cmd, const cJSON *args, struct jobref *jr,
              long long req_id, const char **code, struct esd_err *err)
{
    bool everywhere = cmd_arg_flag(args, O_EVERYWHERE);
    struct job *j = jobs_find(jr->dir);
    cJSON *r;

    /* The directory is gone: only its recorded owner (or root, or esd's
     * uid) may cancel what is registered under its name. */
    if (!jr->exists && c->cred.uid != 0 && c->cred.uid != geteuid() &&
        (!j || !j->loaded || j->uid != c->cred.uid)) {
        char msg[512];

        snprintf(msg, sizeof(msg),
                 "%.300s does not exist, so its owner cannot be checked; "
                 "only root or the job's owner may cancel it",
                 jr->dir);
        deny(c, cmd, code, err, msg);
        return NULL;
    }
    if (!j && !everywhere) {
        *code = PROTO_E_NOT_FOUND;
        err_set(err, -ENOENT,
                "%s is not a job of this node (--everywhere cancels it on every "
                "node through the job directory)",
                jr->dir);
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
            err_set(err, -ENOENT, "%s: not a job directory (manifest.json is not a file)", jr->dir);
        jobs_fs_restore(prev);
        free(manifest);
        if (!is_job) {
            *code = err->code == -EACCES ? PROTO_E_DENIED : PROTO_E_NOT_FOUND;
            return NULL;
        }
        if (geteuid() == 0 && jr->st.st_uid == 0) {
            deny(c, cmd, code, err,
                 "a job directory owned by root is not a job esd works; "
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
handle_forget(struct conn *c, const struct cmd_def *cmd, const cJSON *args, struct jobref *jr,
              long long req_id, const char **code, struct esd_err *err)
{
    bool everywhere = cmd_arg_flag(args, O_EVERYWHERE);
    struct job *j = jobs_find(jr->dir);
    cJSON *r;

    /* the directory is gone: only its recorded owner (or root, or esd's
     * uid) may forget what is registered under its name */
    if (!jr->exists && c->cred.uid != 0 && c->cred.uid != geteuid() &&
        (!j || j->uid != c->cred.uid)) {
        char msg[512];

        snprintf(msg, sizeof(msg),
                 "%.300s does not exist, so its owner cannot be checked; "
                 "only root or the job's owner may forget it",
                 jr->dir);
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
            err_set(err, -EBUSY,
                    "job %s is %s and still has %zu attempt(s)%s running on this "
                    "node; try again once they ended",
                    jr->dir, job_state_name[j->state], j->running,
                    j->finalize ? " or its merge" : "");
        else
            err_set(err, -EBUSY,
                    "job %s is %s on this node; forget drops only a job that is "
                    "over: cancel it first (esctl cancel %s%s)",
                    jr->dir, job_state_name[j->state], jr->dir, everywhere ? " --everywhere" : "");
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
 * submit's checks before anything is prepared or registered: esd can write
 * where the job is (not read-only for it: ProtectSystem=strict), and with
 * --everywhere a spool_dir exists and the job and the spool are on file
 * systems that other nodes share (shared_fs_check). 0, or a negative errno
 * with *code and err naming the cause and the fix.
 */
static int
submit_precheck(const cJSON *args, const struct jobref *jr, const char **code, struct esd_err *err)
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
        r = err_set(err, -EROFS,
                    "%s is read-only for esd (%s is on a file system mounted "
                    "read-only in esd's view: systemd's ProtectSystem=strict, unless the "
                    "directory is listed in ReadWritePaths=); add a drop-in with "
                    "`systemctl edit esd`: [Service] ReadWritePaths=%s, then `systemctl "
                    "restart esd`",
                    jr->dir, at, at);
        free(at);
        return r;
    }
    free(at);
    if (!cmd_arg_flag(args, O_EVERYWHERE))
        return 0;
    if (!spool)
        return err_set(err, -EINVAL,
                       "no spool_dir is configured on this node, so --everywhere "
                       "cannot register the job for every node (set spool_dir in esd.yaml to a "
                       "directory on the shared storage, or submit without --everywhere)");
    if (stat(spool, &st) < 0 || !S_ISDIR(st.st_mode))
        return err_set(err, -ENOENT,
                       "spool_dir %s does not exist on this node, so --everywhere "
                       "cannot register the job for every node; create it on the shared "
                       "storage (mkdir -p %s, writable by esd's user) or fix spool_dir in "
                       "esd.yaml",
                       spool, spool);
    if (!ctlcmd_server.conf->shared_fs_check)
        return 0;
    if (local)
        return err_set(err, -EXDEV,
                       "%s is on a node-local file system (%s): other nodes cannot "
                       "see it, so --everywhere cannot work; put the job on the shared storage "
                       "(NFS, Lustre, GPFS, CephFS, ...), or submit without --everywhere "
                       "(shared_fs_check: false in esd.yaml for a single machine)",
                       jr->dir, type);
    if (fs_kind(spool, &stype, &slocal, &rdonly, NULL, err) < 0)
        err_clear(err);
    if (slocal)
        return err_set(err, -EXDEV,
                       "spool_dir %s is on a node-local file system (%s): other "
                       "nodes never see what is registered there; point spool_dir at the "
                       "shared storage (shared_fs_check: false in esd.yaml for a single "
                       "machine)",
                       spool, stype);
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

        snprintf(msg, sizeof(msg),
                 "%.300s is owned by root, and esd never runs attempts as "
                 "root; give it to the user the attempts should run as",
                 jr->dir);
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
            r = err_set(err, -EACCES,
                        "output %s is outside the job directory %s; esd merges "
                        "only inside it",
                        *ret_out, jr->dir);
        else if (r == 0 && merge_output_clobbers(jr->dir, *ret_out))
            r = err_set(err, -EINVAL,
                        "output %s would overwrite part of the job directory; "
                        "choose another path",
                        *ret_out);
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
submit_register(const struct conn *c, const cJSON *args, const struct jobref *jr, const char **code,
                struct esd_err *err)
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
    if (!j->finalize &&
        !(j->state == JOB_FAILED || (j->loaded && j->claimer.ndone == j->m.nshards)))
        return NULL;
    if (!j->finalize && !finalize_retry(j))
        return NULL;
    log_notice(&(struct log_ctx){ .job = &j->log },
               "control: merge of %s held again for uid %u "
               "pid %d",
               j->job_dir, (unsigned)c->cred.uid, (int)c->cred.pid);
    sched_kick();
    r = job_result(j);
    json_add_bool(r, "held_again", true);
    return r;
}

static cJSON *
handle_nodes(struct conn *c, const struct cmd_def *cmd, const cJSON *args, struct jobref *jr,
             long long req_id, const char **code, struct esd_err *err)
{
    return nodes_json();
}

/* A job's status is answered from the job's view when this node has one,
 * else read in a child; no job: the daemon's own. */
static cJSON *
handle_status(struct conn *c, const struct cmd_def *cmd, const cJSON *args, struct jobref *jr,
              long long req_id, const char **code, struct esd_err *err)
{
    cJSON *r;

    if (!jr->dir)
        return daemon_status(code, err);
    if (!(r = view_status(c, args, jr)))
        ctlcmd_server.op_start(c, cmd->id, args, jr, req_id, code, err);
    return r;
}

/* A job this node works is merged by its election: held again now. */
static cJSON *
handle_merge(struct conn *c, const struct cmd_def *cmd, const cJSON *args, struct jobref *jr,
             long long req_id, const char **code, struct esd_err *err)
{
    cJSON *r = merge_again(c, jr);

    if (!r)
        ctlcmd_server.op_start(c, cmd->id, args, jr, req_id, code, err);
    return r;
}

/* prepare, retry, verify: always an operation in a child, as the caller. */
static cJSON *
handle_op(struct conn *c, const struct cmd_def *cmd, const cJSON *args, struct jobref *jr,
          long long req_id, const char **code, struct esd_err *err)
{
    ctlcmd_server.op_start(c, cmd->id, args, jr, req_id, code, err);
    return NULL;
}

static cJSON *
handle_logs(struct conn *c, const struct cmd_def *cmd, const cJSON *args, struct jobref *jr,
            long long req_id, const char **code, struct esd_err *err)
{
    if (!cmd_arg_has(args, O_SHARD)) {
        *code = PROTO_E_BAD_ARGS;
        err_set(err, -EINVAL,
                "logs through esd needs --shard (esctl reads the journal "
                "itself for a whole job)");
        return NULL;
    }
    return handle_op(c, cmd, args, jr, req_id, code, err);
}

static cJSON *
handle_submit(struct conn *c, const struct cmd_def *cmd, const cJSON *args, struct jobref *jr,
              long long req_id, const char **code, struct esd_err *err)
{
    cJSON *pargs;

    if (submit_precheck(args, jr, code, err) < 0)
        return NULL;
    if (!cmd_arg_has(args, O_CONFIG))
        return submit_register(c, args, jr, code, err);
    /* prepare first (in a child, as the caller), register after: c->then
     * is what ctlcmd_op_reply registers once the prepare has succeeded */
    pargs = must(cJSON_Duplicate(args, true));
    cJSON_DeleteItemFromObjectCaseSensitive(pargs, "output");
    cJSON_DeleteItemFromObjectCaseSensitive(pargs, "everywhere");
    ctlcmd_server.op_start(c, CMD_PREPARE, pargs, jr, req_id, code, err);
    cJSON_Delete(pargs);
    if (c->op)
        c->then = must(cJSON_Duplicate(args, true));
    return NULL;
}

/* ---- the table ---- */

/* Indexed by enum cmd_id; NULL: esd does not serve it (esctl runs it). */
static ctlcmd_fn *const handlers[CMD__COUNT] = {
    [CMD_PING] = handle_ping,     [CMD_VERSION] = handle_version, [CMD_SUBMIT] = handle_submit,
    [CMD_LIST] = handle_list,     [CMD_STATUS] = handle_status,   [CMD_PREPARE] = handle_op,
    [CMD_RETRY] = handle_op,      [CMD_MERGE] = handle_merge,     [CMD_VERIFY] = handle_op,
    [CMD_CANCEL] = handle_cancel, [CMD_FORGET] = handle_forget,   [CMD_DRAIN] = handle_drain,
    [CMD_RESUME] = handle_drain,  [CMD_NODES] = handle_nodes,     [CMD_LOGS] = handle_logs,
    [CMD_CONFIG] = handle_config, [CMD_RELOAD] = handle_reload,
};

ctlcmd_fn *
ctlcmd_handler(enum cmd_id id)
{
    return (unsigned)id < CMD__COUNT ? handlers[id] : NULL;
}

/* ---- the end of an operation in a child ---- */

cJSON *
ctlcmd_op_reply(struct conn *c, cJSON *result, const char *code, const char *message)
{
    cJSON *reply;

    if (c->then && result) {
        /* submit --config: prepared; now the registration */
        struct jobref jr = { 0 };
        const char *code2 = PROTO_E_INTERNAL;
        struct esd_err err;
        cJSON *res;

        err_clear(&err);
        if (jobref_get(c, cmd_arg_str(c->then, O_JOB_DIR), &jr, &code2, &err) == 0 && !jr.exists)
            err_set(&err, -ENOENT, "prepare left no job directory %s", jr.dir),
                code2 = PROTO_E_FAILED;
        if (jr.dir && jr.exists && (res = submit_register(c, c->then, &jr, &code2, &err))) {
            cJSON_AddItemToObject(res, "prepared", result);
            reply = proto_reply_ok(c->op_id, res);
        } else {
            cJSON_Delete(result);
            ctlcmd_log_refusal(c, "submit", code2, err.msg);
            reply = proto_reply_error(c->op_id, code2, err.msg);
        }
        ctlcmd_jobref_free(&jr);
    } else if (result) {
        if (c->op_cmd == CMD_STATUS && json_get_str(result, "job_dir"))
            add_refusals(result, json_get_str(result, "job_dir"));
        reply = proto_reply_ok(c->op_id, result);
    } else {
        ctlcmd_log_refusal(c, cmd_table[c->op_cmd].name, code, message);
        reply = proto_reply_error(c->op_id, code, message);
    }
    cJSON_Delete(c->then);
    c->then = NULL;
    return reply;
}
