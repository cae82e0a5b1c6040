/*
 * jobs: the registry of jobs this node works, on disk and in memory.
 */
#include "jobs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/fsuid.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "attempt.h"
#include "djversion.h"
#include "fscheck.h"
#include "fsutil.h"
#include "gstage.h"
#include "json.h"
#include "log.h"
#include "msgid.h"
#include "merge.h"
#include "pypath.h"
#include "recipe.h"
#include "sha256.h"

const char *const job_state_name[] = {
    [JOB_ACTIVE] = "active",     [JOB_DRAINING] = "draining", [JOB_FINALIZING] = "finalizing",
    [JOB_COMPLETE] = "complete", [JOB_FAILED] = "failed",     [JOB_CANCELLED] = "cancelled",
};

static struct {
    const struct esd_conf *conf;
    struct job *head;
    size_t n;
    char *jobs_dir;       /* <state_dir>/jobs */
    char *claims_dir;     /* <state_dir>/claims: <key>.<token>.json per claim held */
    char *forgotten_dir;  /* <state_dir>/forgotten: spool entries forgotten here */
    int lock_fd;          /* <state_dir>/esd.lock, flocked while esd runs */
    struct djversion djv; /* what this node's processor runs, and how it was read */
    struct ev_loop *loop;
    /* the registry and the spool directories, watched with inotify for
     * files written or renamed into them (this node's writes only: the
     * rescan timer covers other nodes' on NFS) */
    ev_io notify_w;
    char *spool_dir; /* as the watch was set */
    void (*changed)(void);
    /* the modules above, told (set by them at their init: the registry
     * never calls up) */
    void (*removed)(const struct job *j);
    void (*unloaded)(const struct job *j);
    void (*view_changed)(void);
} J;

static void
tell_view_changed(void)
{
    if (J.view_changed)
        J.view_changed();
}

/* Before j's claimer and manifest go (unloaded, or freed). */
static void
tell_unloaded(const struct job *j)
{
    if (J.unloaded)
        J.unloaded(j);
}

static int
state_parse(const char *s)
{
    for (int i = JOB_ACTIVE; i <= JOB_CANCELLED; i++)
        if (s && !strcmp(s, job_state_name[i]))
            return i;
    return -1;
}

static bool
job_over(const struct job *j)
{
    return j->state == JOB_COMPLETE || j->state == JOB_FAILED || j->state == JOB_CANCELLED;
}

static struct job *
find(const char *key)
{
    for (struct job *j = J.head; j; j = j->next)
        if (!strcmp(j->key, key))
            return j;
    return NULL;
}

/* setfsuid/setfsgid, not seteuid: only file system access changes, so
 * esd keeps its own identity for signals, its control socket and systemd
 * while it touches a job directory as the owner; and they are per thread
 * (glibc does not broadcast them): only the calling thread acts as the
 * owner. Every switch is undone by jobs_fs_restore before the loop goes
 * on. A no-op unless esd is root. */
static struct fsid
fs_switch(uid_t uid, gid_t gid)
{
    struct fsid prev = { 0 };

    if (geteuid() != 0)
        return prev;
    /* each call returns the identity before it */
    prev.gid = (gid_t)setfsgid(gid);
    prev.uid = (uid_t)setfsuid(uid);
    prev.set = true;
    return prev;
}

struct fsid
jobs_fs_owner(const struct job *j)
{
    /* the owner's primary group from the user database, never the
     * directory's (which a setgid parent may have given it) */
    return fs_switch(j->uid, j->owner.uid == j->uid && j->owner.name ? j->owner.gid : j->gid);
}

void
jobs_helper_id(const struct job *j, struct helper_id *ret)
{
    memset(ret, 0, sizeof(*ret));
    /* (esd run works its caller's own job: it has no identity to change) */
    if (geteuid() != 0 || J.conf->run_mode)
        return;
    ret->change = true;
    ret->uid = j->uid;
    ret->gid = j->owner.gid;
    ret->groups = j->owner.groups;
    ret->ngroups = j->owner.ngroups;
}

struct fsid
jobs_fs_as(uid_t uid, gid_t gid)
{
    return fs_switch(uid, gid);
}

struct fsid
jobs_fs_self(void)
{
    return fs_switch(geteuid(), getegid());
}

void
jobs_fs_restore(struct fsid prev)
{
    if (prev.set) {
        /* the uid first: a non-zero fsuid has no capability to set the gid */
        setfsuid(prev.uid);
        setfsgid(prev.gid);
    }
}

/* Writes the job's registry file (atomically), as esd itself: the registry
 * is esd's state directory, which no job owner may write. A failure keeps
 * the state in memory only; a restart then sees the previous state. */
static void
persist(struct job *j)
{
    cJSON *o = cJSON_CreateObject();
    struct esd_err err;
    char now[40];

    time_iso_now(now, NULL);
    json_add_str(o, "job_dir", j->job_dir);
    json_add_str(o, "output", j->output);
    json_add_int(o, "uid", (long long)j->uid);
    json_add_int(o, "ino", (long long)j->ino);
    if (j->dev)
        json_add_int(o, "dev", (long long)j->dev);
    json_add_str(o, "state", job_state_name[j->state]);
    if (j->error)
        json_add_str(o, "error", j->error);
    if (j->state == JOB_CANCELLED && j->cancelled_everywhere)
        json_add_bool(o, "cancelled_everywhere", true);
    if (j->from_spool)
        json_add_bool(o, "spool", true);
    if (j->ended_at > 0)
        json_add_int(o, "ended_unix", (long long)j->ended_at);
    json_add_str(o, "updated_at", now);
    struct fsid prev = jobs_fs_self();
    if (json_write_atomic(j->reg_path, o, JSON_PRETTY, &err) < 0)
        log_warning(&(struct log_ctx){ .job = &j->log }, "%s; the state is kept in memory",
                    err.msg);
    jobs_fs_restore(prev);
    cJSON_Delete(o);
}

static void load_abandon(struct job *j);

static void
global_leave(struct job *j)
{
    if (j->gstage) {
        claimer_free(&j->gclaimer);
        manifest_free(&j->gm);
        j->gstage = false;
    }
}

int
jobs_global_enter(struct job *j, struct esd_err *err)
{
    const struct esd_conf *c = J.conf;
    struct claim_opts o = { 0 };
    struct gstage_prefix p;
    struct fsid prev;
    int r;

    if (j->gstage)
        return 1;
    if (!j->loaded || !gstage_has(&j->m))
        return 0;
    prev = jobs_fs_owner(j);
    r = gstage_prefix_load(&j->m, &p, err);
    if (r == 1) {
        gstage_manifest(&j->m, &p, &j->gm);
        o.node = c->node_name;
        o.lease_secs = c->lease_secs;
        o.max_infra = c->max_infra_failures;
        o.max_retries = -1;
        if ((r = claimer_init(&j->gclaimer, &j->gm, &o, err)) < 0)
            manifest_free(&j->gm);
        else
            r = 1;
    }
    jobs_fs_restore(prev);
    if (r < 0 && (!j->gstage_error || strcmp(j->gstage_error, err->msg))) {
        log_warning(&(struct log_ctx){ .job = &j->log },
                    "cannot enter the global stage: %s; looked at again at each poll "
                    "(the finalize winner merges the shards again)",
                    err->msg);
        free(j->gstage_error);
        j->gstage_error = xstrdup(err->msg);
    }
    if (r >= 0) {
        free(j->gstage_error);
        j->gstage_error = NULL;
    }
    if (r == 1) {
        j->gstage = true;
        j->idle_valid = false;
        memset(&j->idle, 0, sizeof(j->idle));
        j->next_claim = 0;
        log_info(&(struct log_ctx){ .job = &j->log },
                 "the shards' outputs are merged (%lld rows): the global stage runs next", p.rows);
        tell_view_changed();
    }
    return r;
}

const struct manifest *
jobs_manifest(const struct job *j)
{
    return j->gstage ? &j->gm : &j->m;
}

struct claimer *
jobs_claimer(struct job *j)
{
    return j->gstage ? &j->gclaimer : &j->claimer;
}

static void
job_free(struct job *j)
{
    tell_unloaded(j);
    load_abandon(j);
    if (j->loaded) {
        global_leave(j);
        claimer_free(&j->claimer);
        manifest_free(&j->m);
    }
    spawn_cred_free(&j->owner);
    free(j->refused);
    free(j->stopped);
    log_job_free(&j->log);
    free(j->job_dir);
    free(j->output);
    free(j->reg_path);
    free(j->error);
    free(j->load_error);
    free(j->gstage_error);
    free(j);
}

/* Registration files found unusable, so that each is complained about
 * once, not at every rescan, until it changes. */
struct bad_reg {
    struct bad_reg *next;
    char *path;
    struct timespec mtime;
    off_t size;
};
static struct bad_reg *bad_regs;

/* Whether to complain about the registration file path (true once per
 * version of it; always for a registration that is not a file). */
static bool
complain(const char *path)
{
    struct stat st;
    struct bad_reg *b;

    if (stat(path, &st) < 0)
        return true;
    for (b = bad_regs; b; b = b->next)
        if (!strcmp(b->path, path)) {
            if (b->size == st.st_size && b->mtime.tv_sec == st.st_mtim.tv_sec &&
                b->mtime.tv_nsec == st.st_mtim.tv_nsec)
                return false;
            break;
        }
    if (!b) {
        b = xcalloc(1, sizeof(*b));
        b->path = xstrdup(path);
        b->next = bad_regs;
        bad_regs = b;
    }
    b->mtime = st.st_mtim;
    b->size = st.st_size;
    return true;
}

static void
forget_complaints(void)
{
    while (bad_regs) {
        struct bad_reg *b = bad_regs;

        bad_regs = b->next;
        free(b->path);
        free(b);
    }
}

/*
 * What a registration names, checked as a submit by the job's owner would
 * be: job_dir is absolute and has no symbolic link on its path, it is a
 * directory owned by uid (not root when esd is root; esd's own uid when it
 * is not), of inode ino (and device dev) when the registration recorded
 * them, its owner is in the user database, and output resolves, as the
 * owner, to itself inside job_dir without overwriting part of the job.
 * Fills *ret_st. 0, or a negative errno with err saying why.
 */
static int
validate(const char *dir, bool have_uid, uid_t uid, ino_t ino, dev_t dev, const char *output,
         struct stat *ret_st, struct esd_err *err)
{
    char *real = NULL, *out = NULL;
    struct stat st;
    struct fsid prev;
    int fd, r;

    if (!dir || dir[0] != '/')
        return err_set(err, -EINVAL, "job_dir must be an absolute path");
    /* The path must be its own canonical form: a symbolic link on it is
     * something its owner (or the owner of any directory above) may swap
     * later, pointing esd, which acts as the recorded owner, at a
     * directory of someone else's. */
    if ((r = pypath_realpath(dir, &real, err)) < 0)
        return r;
    r = strcmp(real, dir);
    free(real);
    if (r)
        return err_set(err, -ELOOP,
                       "%s is not the directory it names: a symbolic link is on "
                       "its path; not following it",
                       dir);
    /* ownership and inode from the opened directory, not from a second
     * lookup of the name that could meanwhile name another */
    fd = open(dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return err_sys(err, -errno, "cannot open the job directory %s", dir);
    r = fstat(fd, &st) < 0 ? err_sys(err, -errno, "cannot stat %s", dir) : 0;
    close(fd);
    if (r < 0)
        return r;
    if (have_uid && st.st_uid != uid)
        return err_set(err, -EPERM, "%s now belongs to uid %u, not to uid %u who submitted it", dir,
                       (unsigned)st.st_uid, (unsigned)uid);
    if ((ino && st.st_ino != ino) || (dev && st.st_dev != dev))
        return err_set(err, -ESTALE,
                       "%s is another directory than the one submitted (it was "
                       "replaced, or re-prepared: submit it again)",
                       dir);
    /* (esd run as root works root's own job: nobody else's recipe runs) */
    if (geteuid() == 0 && st.st_uid == 0 && !(J.conf && J.conf->run_mode))
        return err_set(err, -EPERM,
                       "%s is owned by root, and esd never runs attempts as root; "
                       "give the job directory to the user its attempts should run as",
                       dir);
    if (geteuid() != 0 && st.st_uid != geteuid())
        return err_set(err, -EPERM,
                       "%s belongs to uid %u; an esd running as uid %u works only "
                       "its own user's jobs",
                       dir, (unsigned)st.st_uid, (unsigned)geteuid());
    if (output) {
        if (output[0] != '/')
            return err_set(err, -EINVAL, "output must be an absolute path, got %.200s", output);
        /* resolved as the owner: only links the owner could follow count,
         * as for a merge the owner ran themselves */
        prev = fs_switch(st.st_uid, st.st_gid);
        r = pypath_realpath(output, &out, err);
        jobs_fs_restore(prev);
        if (r < 0)
            return r;
        if (strcmp(out, output) || !fs_is_inside(dir, out) || !strcmp(out, dir))
            r = err_set(err, -EACCES,
                        "output %s is not a path inside the job directory %s "
                        "(esd merges only inside it, and follows no symbolic link there)",
                        output, dir);
        else if (merge_output_clobbers(dir, out))
            r = err_set(err, -EINVAL, "output %s would overwrite part of the job directory",
                        output);
        free(out);
        if (r < 0)
            return r;
    }
    *ret_st = st;
    return 0;
}

/* A number member of a registration, 0 when absent. */
static unsigned long long
reg_num(const cJSON *o, const char *key, bool *ret_have)
{
    long long v;

    if (json_get_int(o, key, &v) < 0 || v < 0) {
        if (ret_have)
            *ret_have = false;
        return 0;
    }
    if (ret_have)
        *ret_have = true;
    return (unsigned long long)v;
}

int
jobs_check_bound(struct job *j, struct esd_err *err)
{
    struct stat st;
    int r = validate(j->job_dir, true, j->uid, j->ino, j->dev, NULL, &st, err);

    if (r == -ESTALE && !j->loaded &&
        validate(j->job_dir, true, j->uid, 0, j->dev, NULL, &st, err) == 0) {
        /* Made again (rm -rf, prepare) before this node ever loaded it: a
         * directory of the same owner on the same device, with no link on
         * its path, is what was submitted; esd acts there as that owner
         * only. A job once loaded is bound for good. */
        log_notice(&(struct log_ctx){ .job = &j->log },
                   "job %s: the directory was made again "
                   "before it was loaded; bound to the new one",
                   j->job_dir);
        j->ino = st.st_ino;
        persist(j);
        r = 0;
    }
    if (r < 0) {
        if (!j->refused || strcmp(j->refused, err->msg))
            log_warning(&(struct log_ctx){ .job = &j->log }, "job %s: %s; not working it",
                        j->job_dir, err->msg);
        free(j->refused);
        j->refused = xstrdup(err->msg);
        return r;
    }
    if (j->refused) {
        /* (the very directory is back: a link swapped in and out again) */
        log_notice(&(struct log_ctx){ .job = &j->log },
                   "job %s: its directory matches its "
                   "registration again",
                   j->job_dir);
        free(j->refused);
        j->refused = NULL;
    }
    if (!j->dev) {
        /* (bound on another node through the spool: this node's view) */
        j->dev = st.st_dev;
        persist(j);
    }
    return 0;
}

/* Logs why the registration of dir (no job yet) is refused, about that job. */
static void __attribute__((format(printf, 2, 3))) refuse(const char *dir, const char *fmt, ...)
{
    struct log_job lj;
    char msg[2048];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    log_job_init(&lj, dir);
    log_warning(&(struct log_ctx){ .job = &lj }, "%s", msg);
    log_job_free(&lj);
}

/* Adds a job from a registration object (or finds it); NULL if the
 * registration is unusable, with *ret_why (may be NULL) saying why.
 * *ret_new tells whether it was added. */
static struct job *
add(const cJSON *o, const char *from, bool *ret_new, struct esd_err *ret_why)
{
    const char *dir = json_get_str(o, "job_dir"), *out = json_get_str(o, "output");
    const char *st_name = json_get_str(o, "state");
    bool have_uid = false;
    uid_t uid = (uid_t)reg_num(o, "uid", &have_uid);
    ino_t ino = (ino_t)reg_num(o, "ino", NULL);
    dev_t dev = (dev_t)reg_num(o, "dev", NULL);
    char key[17], *def = NULL;
    struct esd_err err;
    struct stat st;
    struct job *j;

    *ret_new = false;
    if (!dir || dir[0] != '/') {
        if (complain(from))
            log_warning(NULL, "%s: job_dir must be an absolute path, ignoring", from);
        return NULL;
    }
    /* the registration names its job by the path it bound, never by
     * where that path may lead now */
    manifest_dir_key(dir, key);
    if ((j = find(key)))
        return j;
    if (!out)
        out = def = fs_join(dir, "merged.jsonl");
    if (validate(dir, have_uid, uid, ino, dev, out, &st, &err) < 0) {
        if (complain(from))
            refuse(dir, "%s: %s; refusing the registration", from, err.msg);
        if (ret_why)
            *ret_why = err;
        free(def);
        return NULL;
    }
    j = xcalloc(1, sizeof(*j));
    if (spawn_cred_for_uid(st.st_uid, &j->owner, &err) < 0) {
        if (complain(from))
            refuse(dir, "%s: job %s: %s; refusing the registration", from, dir, err.msg);
        if (ret_why)
            *ret_why = err;
        free(def);
        free(j);
        return NULL;
    }
    *ret_new = true;
    memcpy(j->key, key, sizeof(key));
    j->job_dir = xstrdup(dir);
    log_job_init(&j->log, dir);
    j->output = xstrdup(out);
    free(def);
    j->uid = st.st_uid;
    j->gid = j->owner.gid;
    j->ino = st.st_ino;
    j->dev = st.st_dev;
    j->reg_path = xasprintf("%s/%s.json", J.jobs_dir, key);
    j->state =
        st_name && state_parse(st_name) >= 0 ? (enum job_state)state_parse(st_name) : JOB_ACTIVE;
    if (json_get_str(o, "error"))
        j->error = xstrdup(json_get_str(o, "error"));
    json_get_bool(o, "cancelled_everywhere", &j->cancelled_everywhere);
    json_get_bool(o, "spool", &j->from_spool);
    /* draining and finalizing are this process's business, not a restart's */
    if (j->state == JOB_DRAINING || j->state == JOB_FINALIZING)
        j->state = JOB_ACTIVE;
    if (job_over(j)) {
        /* (a registration of an older esd: over since it was last written) */
        j->ended_at = (double)reg_num(o, "ended_unix", NULL);
        if (j->ended_at <= 0 && stat(from, &st) == 0)
            j->ended_at = (double)st.st_mtim.tv_sec;
    }
    j->next = J.head;
    J.head = j;
    J.n++;
    log_event(LOG_LVL_INFO, &(struct log_ctx){ .job = &j->log }, MSGID_JOB_REGISTERED,
              "job %s registered (%s), %s, owner uid %u", j->job_dir, from,
              job_state_name[j->state], (unsigned)j->uid);
    /* (a registration of an older esd, or adopted: bound from now on) */
    if (!have_uid || !ino || !dev)
        persist(j);
    return j;
}

/* A spool entry is read only from a regular file of root's or esd's own:
 * whoever else can write the spool must not choose jobs for every node.
 * *ret_st is the file's. */
static bool
spool_file_ok(const char *path, struct stat *ret_st)
{
    struct stat st;

    if (lstat(path, &st) < 0 || !S_ISREG(st.st_mode))
        return false;
    *ret_st = st;
    if (st.st_uid == 0 || st.st_uid == geteuid())
        return true;
    if (complain(path))
        log_warning(NULL,
                    "%s belongs to uid %u, not to esd (uid %u) or root: refusing it "
                    "(only esd writes the spool; see esd.yaml(5) spool_dir)",
                    path, (unsigned)st.st_uid, (unsigned)geteuid());
    return false;
}

/* ---- forgetting ---- */

static char *
spool_path(const char *key)
{
    return xasprintf("%s/%s.json", J.spool_dir, key);
}

static char *
forgotten_path(const char *key)
{
    return xasprintf("%s/%s.json", J.forgotten_dir, key);
}

/* Whether the spool entry of key (whose file is st) is the version this
 * node forgot; a local tombstone of another version goes (submitted
 * again). A version is the file's inode and mtime: a new submit writes a
 * new file and renames it into place (json_write_atomic), so forgetting a
 * job here never hides a later submit of it. */
static bool
forgotten_here(const char *key, const struct stat *st)
{
    char *path = forgotten_path(key);
    cJSON *o = NULL;
    bool same = false;

    if (json_load_object(path, 1 << 16, &o, NULL) == 0) {
        same = reg_num(o, "spool_ino", NULL) == (unsigned long long)st->st_ino &&
               reg_num(o, "spool_mtime_ns", NULL) ==
                   (unsigned long long)st->st_mtim.tv_sec * 1000000000ull +
                       (unsigned long long)st->st_mtim.tv_nsec;
        if (!same)
            unlink(path);
    }
    cJSON_Delete(o);
    free(path);
    return same;
}

/* Records that this node forgot the spool's current entry of j. */
static void
forget_entry_here(const struct job *j)
{
    char *spool = spool_path(j->key), *path = forgotten_path(j->key);
    struct esd_err err;
    struct stat st;
    cJSON *o;

    if (lstat(spool, &st) == 0) {
        o = cJSON_CreateObject();
        json_add_str(o, "job_dir", j->job_dir);
        json_add_int(o, "spool_ino", (long long)st.st_ino);
        json_add_int(o, "spool_mtime_ns",
                     (long long)st.st_mtim.tv_sec * 1000000000ll + st.st_mtim.tv_nsec);
        if (json_write_atomic(path, o, JSON_PRETTY, &err) < 0)
            log_warning(&(struct log_ctx){ .job = &j->log },
                        "%s; the spool may give the job "
                        "back to this node",
                        err.msg);
        cJSON_Delete(o);
    }
    free(spool);
    free(path);
}

static void refusals_remove(const char *key);

/* Replaces the spool entry of job_dir by a tombstone. Not a removal: every
 * node keeps its own registry copy of an adopted job, so a vanished entry
 * would tell them nothing; a tombstone tells each to forget the job once
 * it is over there (spool_skip). */
static int
spool_tombstone(const char *job_dir, const char *key, struct esd_err *err)
{
    char *path = spool_path(key), now[40];
    cJSON *o = cJSON_CreateObject();
    int r;

    time_iso_now(now, NULL);
    json_add_str(o, "job_dir", job_dir);
    json_add_bool(o, "forgotten", true);
    json_add_str(o, "node", J.conf->node_name);
    json_add_str(o, "forgotten_at", now);
    r = json_write_atomic(path, o, JSON_PRETTY, err);
    if (r == 0)
        refusals_remove(key);
    cJSON_Delete(o);
    free(path);
    return r;
}

bool
jobs_forgettable(const struct job *j)
{
    return job_over(j) && !j->running && !j->finalize;
}

void
jobs_forget(struct job *j, enum jobs_forget_how how, const char *why)
{
    struct job **pp;
    struct esd_err err;
    char *path;

    struct fsid prev = jobs_fs_self();
    if (unlink(j->reg_path) < 0 && errno != ENOENT)
        log_warning(&(struct log_ctx){ .job = &j->log }, "cannot remove %s: %s, ignoring",
                    j->reg_path, strerror(errno));
    if (J.spool_dir) {
        path = spool_path(j->key);
        if (how == FORGET_EVERYWHERE) {
            if (spool_tombstone(j->job_dir, j->key, &err) < 0)
                log_warning(&(struct log_ctx){ .job = &j->log }, "%s; other nodes keep the job",
                            err.msg);
        } else if (how == FORGET_ENDED && (j->state == JOB_COMPLETE || j->state == JOB_FAILED)) {
            if (unlink(path) < 0 && errno != ENOENT)
                log_warning(NULL, "cannot remove %s: %s, ignoring", path, strerror(errno));
            refusals_remove(j->key);
        } else {
            forget_entry_here(j);
        }
        free(path);
    }
    jobs_fs_restore(prev);
    log_notice(&(struct log_ctx){ .job = &j->log }, "job %s (%s) forgotten: %s", j->job_dir,
               job_state_name[j->state], why);
    for (pp = &J.head; *pp && *pp != j; pp = &(*pp)->next)
        ;
    if (*pp) {
        *pp = j->next;
        J.n--;
    }
    if (J.removed)
        J.removed(j);
    job_free(j);
    tell_view_changed(); /* (its view goes) */
}

int
jobs_forget_spool(const char *job_dir, struct esd_err *err)
{
    char key[17], *path;
    struct stat st;
    int r;

    if (!J.spool_dir)
        return err_set(err, -ENOENT, "no spool_dir is configured on this node");
    manifest_dir_key(job_dir, key);
    path = spool_path(key);
    r = lstat(path, &st);
    free(path);
    if (r < 0)
        return err_set(err, -ENOENT, "the spool has no entry for %s", job_dir);
    struct fsid prev = jobs_fs_self();
    r = spool_tombstone(job_dir, key, err);
    jobs_fs_restore(prev);
    return r;
}

/* A spool entry of a job this node does not hold that was merged (or
 * failed in its merge) longer than retention_secs ago, by the files of
 * its directory (looked at as its owner): one stat or two, no loading. */
/* (Without it a node that joins late, or whose state directory was lost,
 * would adopt again every finished job still in the spool.) */
static bool
spool_entry_ended(const cJSON *o)
{
    const char *dir = json_get_str(o, "job_dir");
    bool have_uid = false;
    uid_t uid = (uid_t)reg_num(o, "uid", &have_uid);
    double cutoff = time_wall() - (double)J.conf->retention_secs;
    const char *const ends[] = { "merge.json", "state/esd/finalize.json" };
    bool ended = false;

    struct passwd *pw = NULL;

    if (!dir || dir[0] != '/' || !have_uid || J.conf->retention_secs <= 0 ||
        (geteuid() == 0 && !(pw = getpwuid(uid))))
        return false; /* (add refuses an owner the user database does not know) */
    /* as its owner, with the owner's group, never root's */
    struct fsid prev = fs_switch(uid, pw ? pw->pw_gid : getegid());
    for (size_t i = 0; i < sizeof(ends) / sizeof(ends[0]) && !ended; i++) {
        char *path = fs_join(dir, ends[i]);
        struct stat st;
        cJSON *rec = NULL;
        const char *status;

        if (lstat(path, &st) == 0 && S_ISREG(st.st_mode) && (double)st.st_mtim.tv_sec < cutoff) {
            /* finalize.json also says "merging"... only its end counts */
            if (i == 0)
                ended = true;
            else if (json_load_object(path, 1 << 20, &rec, NULL) == 0 &&
                     (status = json_get_str(rec, "status")) &&
                     (!strcmp(status, "complete") || !strcmp(status, "failed")))
                ended = true;
            cJSON_Delete(rec);
        }
        free(path);
    }
    jobs_fs_restore(prev);
    return ended;
}

/*
 * What scan does with a spool entry o (file path, st) of key before
 * adopting it: true when it is not to be adopted (a tombstone, the
 * version forgotten here, a job merged before the retention, which then
 * leaves the spool). A tombstone makes this node forget the job once it
 * is over here.
 */
static bool
spool_skip(const char *path, const struct stat *st, const cJSON *o)
{
    const char *dir = json_get_str(o, "job_dir");
    struct job *j;
    bool tomb = false;
    char key[17];

    if (!dir || dir[0] != '/')
        return false; /* (add says why) */
    manifest_dir_key(dir, key);
    j = find(key);

    json_get_bool(o, "forgotten", &tomb);
    if (tomb) {
        if (j && jobs_forgettable(j))
            jobs_forget(j, FORGET_HERE, "forgotten on every node");
        /* tombstones go after a retention (every node read them by then) */
        if (J.conf->retention_secs > 0 &&
            (double)st->st_mtim.tv_sec < time_wall() - (double)J.conf->retention_secs) {
            struct fsid prev = jobs_fs_self();
            unlink(path);
            jobs_fs_restore(prev);
        }
        return true;
    }
    if (j)
        return false;
    if (forgotten_here(key, st))
        return true;
    if (spool_entry_ended(o)) {
        log_info(NULL,
                 "%s: job %s ended more than retention_secs (%ld) ago; not adopting it, "
                 "and removing it from the spool",
                 path, json_get_str(o, "job_dir"), J.conf->retention_secs);
        struct fsid prev = jobs_fs_self();
        if (unlink(path) < 0 && errno != ENOENT)
            log_warning(NULL, "cannot remove %s: %s, ignoring", path, strerror(errno));
        refusals_remove(key);
        jobs_fs_restore(prev);
        return true;
    }
    return false;
}

cJSON *
jobs_spool_unheld_json(void)
{
    cJSON *a = cJSON_CreateArray();
    DIR *d = J.spool_dir ? opendir(J.spool_dir) : NULL;
    struct dirent *e;

    while (d && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        char *path, key[17];
        const char *dir;
        struct stat st;
        cJSON *o = NULL, *x;
        bool tomb = false;

        if (e->d_name[0] == '.' || n < 6 || strcmp(e->d_name + n - 5, ".json"))
            continue;
        path = fs_join(J.spool_dir, e->d_name);
        if (spool_file_ok(path, &st) && json_load_object(path, 1 << 20, &o, NULL) == 0 &&
            (dir = json_get_str(o, "job_dir")) && dir[0] == '/') {
            manifest_dir_key(dir, key);
            json_get_bool(o, "forgotten", &tomb);
            if (!find(key)) {
                x = cJSON_CreateObject();
                json_add_str(x, "key", key);
                json_add_str(x, "job_dir", dir);
                json_add_str(x, "state",
                             tomb || forgotten_here(key, &st) ? "forgotten" : "spooled");
                json_add_bool(x, "loaded", false);
                json_add_str(x, "spool_entry", path);
                cJSON_AddItemToArray(a, x);
            }
        }
        cJSON_Delete(o);
        free(path);
    }
    if (d)
        closedir(d);
    return a;
}

/* Forgets the jobs over longer than retention_secs. */
static void
retention_pass(void)
{
    double cutoff = time_wall() - (double)J.conf->retention_secs;
    struct job *j, *next;
    char why[96];

    if (J.conf->retention_secs <= 0 || J.conf->run_mode)
        return;
    for (j = J.head; j; j = next) {
        next = j->next;
        if (jobs_forgettable(j) && j->ended_at > 0 && j->ended_at < cutoff) {
            snprintf(why, sizeof(why), "over for more than retention_secs (%ld s)",
                     J.conf->retention_secs);
            jobs_forget(j, FORGET_ENDED, why);
        }
    }
}

/*
 * <spool_dir>/<key>.<node>.refused: why node refuses the spooled job key,
 * for the submitter (jobs_spool_refusals). Not *.json: no scan reads it.
 * NULL when node cannot be part of a file name.
 */
static char *
refusal_path(const char *key, const char *node)
{
    if (!node || !*node || strchr(node, '/') || node[0] == '.')
        return NULL;
    return xasprintf("%s/%s.%s.refused", J.spool_dir, key, node);
}

/* Removes every node's <key>.<node>.refused (the registration is gone). */
static void
refusals_remove(const char *key)
{
    DIR *d = opendir(J.spool_dir);
    size_t kn = strlen(key);
    struct dirent *e;

    while (d && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        char *path;

        if (n < kn + 9 || strncmp(e->d_name, key, kn) || e->d_name[kn] != '.' ||
            strcmp(e->d_name + n - 8, ".refused"))
            continue;
        path = fs_join(J.spool_dir, e->d_name);
        if (unlink(path) < 0 && errno != ENOENT)
            log_warning(NULL, "cannot remove %s: %s, ignoring", path, strerror(errno));
        free(path);
    }
    if (d)
        closedir(d);
}

/* Records, once per reason, why this node refuses the spool registration
 * o (of job key); why NULL: it does not (any more). */
static void
spool_refusal(const char *key, const cJSON *o, const char *why)
{
    char *path = refusal_path(key, J.conf->node_name);
    cJSON *r = NULL, *old = NULL;
    struct esd_err err;
    struct fsid prev;

    if (!path)
        return;
    prev = jobs_fs_self();
    if (!why) {
        if (unlink(path) < 0 && errno != ENOENT)
            log_warning(NULL, "cannot remove %s: %s, ignoring", path, strerror(errno));
    } else if (json_load_object(path, 1 << 16, &old, &err) < 0 || !json_get_str(old, "why") ||
               strcmp(json_get_str(old, "why"), why)) {
        r = cJSON_CreateObject();
        json_add_str(r, "node", J.conf->node_name);
        json_add_str(r, "job_dir", json_get_str(o, "job_dir"));
        json_add_str(r, "why", why);
        if (json_write_atomic(path, r, JSON_PRETTY, &err) < 0)
            log_warning(NULL,
                        "%s; the submitter does not see why this node refuses the job, "
                        "ignoring",
                        err.msg);
    }
    jobs_fs_restore(prev);
    cJSON_Delete(old);
    cJSON_Delete(r);
    free(path);
}

/* Why this node refuses the spool registration o: err, or, when the job
 * directory's owner here is not the uid it was submitted with, that the
 * uids differ between nodes, written into msg (n bytes). Returns err's
 * text or msg. */
static const char *
spool_refusal_why(const cJSON *o, const struct esd_err *err, char *msg, size_t n)
{
    const char *dir = json_get_str(o, "job_dir"), *node = json_get_str(o, "node");
    bool have_uid = false;
    uid_t uid = (uid_t)reg_num(o, "uid", &have_uid);
    struct stat st;

    if (!dir || !have_uid || stat(dir, &st) < 0 || st.st_uid == uid)
        return err->msg;
    snprintf(msg, n,
             "%.300s is owned by uid %u on node %.100s, but by uid %u on node %.100s, "
             "where it was submitted (the uids differ between nodes: give the user the same "
             "uid on every node, from one LDAP/NIS directory or identical /etc/passwd "
             "entries)",
             dir, (unsigned)st.st_uid, J.conf->node_name, (unsigned)uid, node ? node : "?");
    return msg;
}

/* Reads every *.json registration of dir. */
static void
scan(const char *dir, bool spool)
{
    DIR *d = opendir(dir);
    struct dirent *e;

    if (!d) {
        if (errno != ENOENT)
            log_warning(NULL, "cannot read %s: %s", dir, strerror(errno));
        return;
    }
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        struct esd_err err;
        struct stat st;
        struct job *j;
        cJSON *o = NULL;
        char *path;

        if (e->d_name[0] == '.' || n < 6 || strcmp(e->d_name + n - 5, ".json"))
            continue;
        path = fs_join(dir, e->d_name);
        if (spool && !spool_file_ok(path, &st)) {
            free(path);
            continue;
        }
        if (json_load_object(path, 1 << 20, &o, &err) < 0) {
            if (complain(path))
                log_warning(NULL, "%s, ignoring", err.msg);
        } else if (spool && spool_skip(path, &st, o)) {
            /* (not adopted) */
        } else {
            /* a spool registration carries no state (nor device) of this node */
            if (spool) {
                cJSON_DeleteItemFromObjectCaseSensitive(o, "state");
                cJSON_DeleteItemFromObjectCaseSensitive(o, "dev");
            }
            bool added = false;
            struct esd_err why;
            char key[17], msg[1024];

            err_clear(&why);
            if (!(j = add(o, path, &added, &why)) && spool && why.msg[0] &&
                json_get_str(o, "job_dir")) {
                manifest_dir_key(json_get_str(o, "job_dir"), key);
                spool_refusal(key, o, spool_refusal_why(o, &why, msg, sizeof(msg)));
            }
            if (j) {
                j->seen = true;
                /* cancelled everywhere, then submitted everywhere again */
                if (spool && !added && j->state == JOB_CANCELLED && j->cancelled_everywhere &&
                    !jobs_cancelled_everywhere(j)) {
                    jobs_reset(j);
                    jobs_set_state(j, JOB_ACTIVE, NULL);
                    log_notice(&(struct log_ctx){ .job = &j->log },
                               "job %s: submitted again on "
                               "every node",
                               j->job_dir);
                }
                /* adopted from the spool: this node's own record from now on */
                if (spool && added) {
                    j->from_spool = true;
                    persist(j);
                    spool_refusal(j->key, o, NULL);
                }
            }
        }
        cJSON_Delete(o);
        free(path);
    }
    closedir(d);
}

static bool badnode_check(struct job *j);

void
jobs_rescan(void)
{
    struct esd_err err;

    scan(J.jobs_dir, false);
    if (J.spool_dir)
        scan(J.spool_dir, true);
    retention_pass();
    /* what is still to be worked is still the directory submitted */
    for (struct job *j = J.head; j; j = j->next) {
        if (j->state == JOB_ACTIVE || j->state == JOB_DRAINING || j->state == JOB_FINALIZING)
            jobs_check_bound(j, &err);
        /* (also while its claims are paused after failures in a row; a
         * job that is over has nothing left to refuse) */
        if (j->loaded && j->state == JOB_ACTIVE)
            (void)badnode_check(j);
    }
}

/* One esd per state directory: its claim records are then known to be of
 * a previous run when esd starts. The lock file holds the pid. A flock,
 * held for esd's lifetime through J.lock_fd: the kernel drops it when esd
 * dies however it dies, so a lock file left behind never keeps a restart
 * out (the pid inside is only for the message). */
static int
lock_state_dir(const struct esd_conf *c, struct esd_err *err)
{
    char *path = fs_join(c->state_dir, "esd.lock"), pid[32], old[32] = "";
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644), r = 0;
    ssize_t n;

    if (fd < 0) {
        r = err_sys(err, -errno, "cannot open %s", path);
    } else if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        r = errno == EWOULDBLOCK ? -EBUSY : -errno;
        n = pread(fd, old, sizeof(old) - 1, 0);
        old[n > 0 ? n : 0] = '\0';
        old[strcspn(old, "\n")] = '\0';
        err_set(err, r, "another esd%s%s uses the state directory %s (%s is locked)",
                old[0] ? " with pid " : "", old, c->state_dir, path);
        close(fd);
    } else {
        n = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
        if (ftruncate(fd, 0) < 0 || pwrite(fd, pid, (size_t)n, 0) != n)
            log_warning(NULL, "cannot write the pid into %s: %s", path, strerror(errno));
        J.lock_fd = fd;
    }
    free(path);
    return r;
}

static char *
claim_record_path(const struct job *j, const struct claim *cl)
{
    return xasprintf("%s/%s.%s.json", J.claims_dir, j->key, cl->token);
}

void
jobs_claim_record(struct job *j, const struct claim *cl)
{
    char *path = claim_record_path(j, cl);
    cJSON *o = cJSON_CreateObject();
    struct esd_err err;

    json_add_str(o, "job_dir", j->job_dir);
    json_add_str(o, "shard_id", cl->shard_id);
    json_add_str(o, "token", cl->token);
    json_add_int(o, "attempt_number", cl->attempt_number);
    /* (the record is esd's, in its state directory, not the owner's) */
    struct fsid prev = jobs_fs_self();
    if (json_write_atomic(path, o, JSON_PRETTY, &err) < 0)
        log_warning(&(struct log_ctx){ .job = &j->log, .shard = cl->shard_id },
                    "%s (a restart then waits for this claim's lease)", err.msg);
    jobs_fs_restore(prev);
    cJSON_Delete(o);
    free(path);
}

void
jobs_claim_forget(struct job *j, const struct claim *cl)
{
    char *path = claim_record_path(j, cl);
    struct fsid prev = jobs_fs_self();

    if (unlink(path) < 0 && errno != ENOENT)
        log_warning(NULL, "cannot remove %s: %s", path, strerror(errno));
    jobs_fs_restore(prev);
    free(path);
}

/* Takes over at once the claims this node's previous run held on j. Safe
 * without waiting for the lease because esd.lock proves the records are a
 * dead process's: its attempts died with it (PR_SET_PDEATHSIG on keeper
 * and processor), and a leftover descendant could not publish anyway,
 * since publication is esd's finishing helper's, fenced by the token this
 * takeover replaces. */
static void
recover_claims(struct job *j)
{
    DIR *d = opendir(J.claims_dir);
    size_t klen = strlen(j->key);
    struct dirent *e;

    if (!d)
        return;
    while ((e = readdir(d))) {
        const char *shard, *token;
        struct esd_err err;
        struct fsid prev;
        cJSON *o = NULL;
        char *path;
        int r;

        if (strncmp(e->d_name, j->key, klen) || e->d_name[klen] != '.' ||
            !strstr(e->d_name, ".json"))
            continue;
        path = fs_join(J.claims_dir, e->d_name);
        prev = jobs_fs_self();
        r = json_load_object(path, 1 << 16, &o, &err);
        jobs_fs_restore(prev);
        if (r < 0) {
            log_warning(&(struct log_ctx){ .job = &j->log }, "%s, removing it", err.msg);
        } else if (!(shard = json_get_str(o, "shard_id")) || !(token = json_get_str(o, "token"))) {
            log_warning(&(struct log_ctx){ .job = &j->log },
                        "%s lacks shard_id or token, removing it", path);
        } else if (gstage_is(shard) && !j->gstage) {
            log_warning(&(struct log_ctx){ .job = &j->log, .shard = shard },
                        "a claim of the global stage from this node's previous run, but the "
                        "job is not in its global stage: it ends with its lease");
        } else if ((r = claim_recover(gstage_is(shard) ? &j->gclaimer : &j->claimer, shard, token,
                                      &err)) < 0) {
            log_warning(&(struct log_ctx){ .job = &j->log, .shard = shard },
                        "cannot recover this node's claim from its previous run: %s; it ends "
                        "with its lease",
                        err.msg);
        } else {
            log_notice(&(struct log_ctx){ .job = &j->log, .shard = shard },
                       r ? "this node's claim from its previous run was taken back at once "
                           "(its attempt marked stale)"
                         : "this node's claim from its previous run had ended already");
        }
        cJSON_Delete(o);
        prev = jobs_fs_self();
        unlink(path);
        jobs_fs_restore(prev);
        free(path);
    }
    closedir(d);
}

static void
dir_changed_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    bool any = false;
    ssize_t n;

    (void)loop;
    (void)revents;
    while ((n = read(w->fd, buf, sizeof(buf))) > 0) {
        for (char *p = buf; p < buf + n;) {
            const struct inotify_event *e = (const struct inotify_event *)p;

            /* a registration is a visible *.json; temporary files are not
             * (".<name>.<hex>.tmp", fs_tmp_path): a half-written one wakes
             * nobody, its rename into place does (IN_MOVED_TO) */
            if (e->len && e->name[0] != '.' && strstr(e->name, ".json"))
                any = true;
            p += sizeof(*e) + e->len;
        }
    }
    if (!any)
        return;
    log_debug(NULL, "a registration changed: reading the registrations again");
    jobs_rescan();
    if (J.changed)
        J.changed();
}

/* The inotify watches; without them the rescan timer does it all. */
static void
watch_dirs(struct ev_loop *loop, const struct esd_conf *c)
{
    const uint32_t mask = IN_CLOSE_WRITE | IN_MOVED_TO | IN_DELETE | IN_MOVED_FROM;
    int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);

    if (c->spool_dir)
        J.spool_dir = xstrdup(c->spool_dir);
    if (fd < 0) {
        log_warning(NULL, "inotify: %s; new registrations are seen at the next rescan",
                    strerror(errno));
        return;
    }
    if (inotify_add_watch(fd, J.jobs_dir, mask) < 0)
        log_warning(NULL, "inotify on %s: %s", J.jobs_dir, strerror(errno));
    if (J.spool_dir && inotify_add_watch(fd, J.spool_dir, mask) < 0)
        log_warning(NULL, "inotify on %s: %s; registrations there are seen at the next rescan",
                    J.spool_dir, strerror(errno));
    ev_io_init(&J.notify_w, dir_changed_cb, fd, EV_READ);
    ev_io_start(loop, &J.notify_w);
}

void
jobs_set_changed(void (*changed)(void))
{
    J.changed = changed;
}

void
jobs_set_removed(void (*removed)(const struct job *j))
{
    J.removed = removed;
}

void
jobs_set_unloaded(void (*unloaded)(const struct job *j))
{
    J.unloaded = unloaded;
}

void
jobs_set_view_changed(void (*view_changed)(void))
{
    J.view_changed = view_changed;
}

/* Says once what this node runs, or why that cannot be read. */
static void
log_version(void)
{
    if (strcmp(J.djv.version, "unknown"))
        log_info(NULL, "Data-Juicer version here: %s (%s%s%s)", J.djv.version, J.djv.source,
                 J.djv.why ? ", since " : "", J.djv.why ? J.djv.why : "");
    else
        log_warning(NULL,
                    "the Data-Juicer version here cannot be read: %s; jobs prepared with "
                    "a known version are refused unless data_juicer.allow_version_mismatch is "
                    "set",
                    J.djv.why ? J.djv.why : "no way to read it");
}

const char *
jobs_dj_python(void)
{
    return J.djv.python;
}

const struct djversion *
jobs_djversion(void)
{
    return &J.djv;
}

int
jobs_init(struct ev_loop *loop, const struct esd_conf *c, struct esd_err *err)
{
    struct attempt_opts ao = { 0 };
    int r;

    J.loop = loop;
    J.conf = c;
    J.lock_fd = -1;
    J.jobs_dir = fs_join(c->state_dir, "jobs");
    J.claims_dir = fs_join(c->state_dir, "claims");
    J.forgotten_dir = fs_join(c->state_dir, "forgotten");
    if ((r = fs_mkdir_p(J.jobs_dir, 0755, err)) < 0 ||
        (r = fs_mkdir_p(J.forgotten_dir, 0755, err)) < 0 ||
        (r = fs_mkdir_p(J.claims_dir, 0755, err)) < 0 || (r = lock_state_dir(c, err)) < 0)
        return r;
    watch_dirs(loop, c);
    ao.processor = c->processor.n ? (const char *const *)c->processor.v : NULL;
    ao.dj_root = c->dj_root;
    ao.python = c->dj_python;
    djversion_read(&ao, &J.djv);
    log_version();
    jobs_rescan();
    return 0;
}

void
jobs_reconfigure(const struct esd_conf *c)
{
    struct attempt_opts ao = { 0 };

    J.conf = c;
    ao.processor = c->processor.n ? (const char *const *)c->processor.v : NULL;
    ao.dj_root = c->dj_root;
    ao.python = c->dj_python;
    djversion_free(&J.djv);
    djversion_read(&ao, &J.djv);
    log_version();
    /* new claims take the new lease and limit (claims held keep theirs);
     * the node name is fixed until a restart */
    for (struct job *j = J.head; j; j = j->next)
        if (j->loaded) {
            j->claimer.lease_secs = c->lease_secs;
            j->claimer.max_infra = c->max_infra_failures;
        }
    jobs_rescan();
}

void
jobs_fini(void)
{
    while (J.head) {
        struct job *j = J.head;

        J.head = j->next;
        job_free(j);
    }
    if (J.loop && ev_is_active(&J.notify_w)) {
        ev_io_stop(J.loop, &J.notify_w);
        close(J.notify_w.fd);
    }
    forget_complaints();
    free(J.jobs_dir);
    free(J.claims_dir);
    free(J.forgotten_dir);
    if (J.lock_fd >= 0)
        close(J.lock_fd);
    free(J.spool_dir);
    djversion_free(&J.djv);
    memset(&J, 0, sizeof(J));
}

struct job *
jobs_first(void)
{
    return J.head;
}

size_t
jobs_count(void)
{
    return J.n;
}

/* ---- loading a job: a helper as the owner reads it ---- */

/* The loading helper of one job while it runs. */
struct jobload {
    struct job *job;
    pid_t pid;
    ev_io out_w;
    ev_child child_w;
    struct helper_guard guard;
    char kind;                 /* the report's first byte: 'M' (a manifest) or 'E' (why not) */
    struct buf why;            /* an 'E' report */
    struct manifest_reader rd; /* an 'M' report, read as it comes */
    char *bad;                 /* the 'M' report is malformed: why */
    size_t got;                /* bytes of the report */
    bool eof, exited, too_big;
    int status;
};

/* Most bytes a loading helper may send: the compact form of a manifest
 * of MANIFEST_MAX_SHARDS shards, with room. The helper reads a directory
 * its owner controls, so what it sends is bounded before esd buffers it. */
#define LOAD_MAX_REPORT ((size_t)512 << 20)
#define LOAD_MAX_WHY ((size_t)64 << 10)

/* In the helper: why this node cannot work m's job, or NULL. */
static char *
refusal(const struct manifest *m, int dfd)
{
    const char *snap = m->recipe_snapshot ? m->recipe_snapshot : "recipe.yaml";
    char hex[SHA256_HEX_LEN + 1], *path = NULL, *text = NULL, *why = NULL;
    struct esd_err err;
    size_t len = 0;

    /* spec §8.1's start-up checks, in its order: the Data-Juicer commit
     * the job was prepared with (unless the mismatch is allowed), then the
     * recipe snapshot against the manifest's hash. */
    if (djversion_judge(m->dj_commit, &J.djv, &err) < 0 && !J.conf->allow_version_mismatch)
        return xasprintf("%s (set data_juicer.allow_version_mismatch only if this is "
                         "intentional)",
                         err.msg);
    if (pypath_join_inside(m->job_dir, snap, &path, &err) < 0)
        return xstrdup(err.msg);
    if (strlen(path) <= strlen(m->job_dir)) {
        free(path);
        return xasprintf("the recipe snapshot %s is not a file of the job", snap);
    }
    /* the snapshot as a job file: not a FIFO, not a device, not huge */
    if (fs_read_job_at(dfd, path + strlen(m->job_dir) + 1, path, RECIPE_MAX_BYTES, &text, &len,
                       &err) < 0)
        why = xasprintf("the recipe snapshot: %s", err.msg);
    else if (sha256_buf(text, len, hex), m->recipe_sha256 && strcmp(m->recipe_sha256, hex))
        why = xstrdup("the recipe snapshot's hash does not match the manifest");
    /* last: a mount where claims cannot be exclusive (fscheck.h) */
    if (!why)
        why = fscheck_refusal(m->job_dir, J.conf->node_name);
    free(text);
    free(path);
    return why;
}

/* The loading helper: checks the directory, reads and checks the
 * manifest and the recipe, and reports "M<compact manifest>" or
 * "E<why>". A helper as the owner, because the job directory is the
 * owner's to fill with FIFOs, links and huge files: reading it must use
 * only the owner's rights and must not block esd's loop. */
static void __attribute__((noreturn)) load_child(struct job *j, int fd)
{
    struct manifest m;
    struct esd_err err;
    struct buf b;
    char *why = NULL, *text = NULL;
    size_t len = 0;
    int dfd, r;

    buf_init(&b);
    /* the directory bound at submit, and nothing it may lead to now */
    dfd = open(j->job_dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0) {
        why = xasprintf("cannot open the job directory %s: %s", j->job_dir, strerror(errno));
    } else {
        struct stat st;
        char *mpath = fs_join(j->job_dir, "manifest.json");

        if (fstat(dfd, &st) < 0 || st.st_ino != j->ino || st.st_uid != j->uid)
            why = xasprintf("%s is not the directory submitted any more", j->job_dir);
        else if ((r = fs_read_job_at(dfd, "manifest.json", mpath, MANIFEST_MAX_BYTES, &text, &len,
                                     &err)) < 0)
            why = manifest_dir_explain(j->job_dir, r, &err)
                      ? xstrdup(err.msg)
                      : xasprintf("Unable to read JSON file %s: %s", mpath, err.msg);
        else if (manifest_parse(text, len, j->job_dir, mpath, NULL, &m, &err) < 0)
            why = xstrdup(err.msg);
        else if (!(why = refusal(&m, dfd)))
            manifest_compact(&m, &b);
        if (!why)
            manifest_free(&m);
        free(mpath);
        free(text);
    }
    if (why) {
        buf_reset(&b);
        buf_putc(&b, 'E');
        buf_puts(&b, why);
    } else {
        /* the compact form goes after its marker */
        struct buf c;

        buf_init(&c);
        buf_putc(&c, 'M');
        buf_append(&c, b.p, b.len);
        buf_free(&b);
        b = c;
    }
    /* (freed before _exit only so that valgrind, which follows the fork,
     * finds nothing lost) */
    r = helper_write(fd, b.p, b.len);
    free(why);
    buf_free(&b);
    _exit(r < 0 ? 2 : 0);
}

/* Ends j's loading: stops its watchers (the helper, if still there, is
 * killed: esd shuts down or forgets the job). */
static void
load_abandon(struct job *j)
{
    struct jobload *l = j->load;

    if (!l)
        return;
    helper_guard_stop(&l->guard, J.loop);
    if (ev_is_active(&l->out_w)) {
        ev_io_stop(J.loop, &l->out_w);
        close(l->out_w.fd);
    }
    if (ev_is_active(&l->child_w)) {
        ev_child_stop(J.loop, &l->child_w);
        kill(l->pid, SIGKILL);
    }
    buf_free(&l->why);
    manifest_reader_free(&l->rd);
    free(l->bad);
    free(l);
    j->load = NULL;
}

/* The result of the loading helper: j is worked, or why not is said once. */
static void
load_done(struct job *j)
{
    struct jobload *l = j->load;
    const struct esd_conf *c = J.conf;
    struct claim_opts o = { 0 };
    struct esd_err err;
    char *why = NULL, how[96];
    struct fsid prev;

    helper_describe(l->status, how);
    if (l->too_big)
        why = xasprintf("the loading process sent more than %zu bytes", LOAD_MAX_REPORT);
    else if (l->kind == 'E')
        why = xstrndup(l->why.p ? l->why.p : "", strcspn(l->why.p ? l->why.p : "", "\n"));
    else if (l->kind != 'M' || !WIFEXITED(l->status) || WEXITSTATUS(l->status))
        why = xasprintf("the loading process %s%s without a result",
                        l->guard.fired ? "was killed: " : "ended: ", how);
    else if (l->bad)
        why = xstrdup(l->bad);
    else if (manifest_reader_finish(&l->rd, j->job_dir, &j->m, &err) < 0)
        why = xstrdup(err.msg);
    load_abandon(j);
    if (!why) {
        o.node = c->node_name;
        o.lease_secs = c->lease_secs;
        o.max_infra = c->max_infra_failures;
        o.max_retries = -1;
        prev = jobs_fs_owner(j);
        if (claimer_init(&j->claimer, &j->m, &o, &err) < 0) {
            why = xstrdup(err.msg);
            manifest_free(&j->m);
        }
        jobs_fs_restore(prev);
    }
    if (why) {
        /* said once per reason, not at every rescan */
        if (!j->load_error || strcmp(j->load_error, why))
            log_warning(&(struct log_ctx){ .job = &j->log }, "cannot work job %s: %s", j->job_dir,
                        why);
        free(j->load_error);
        j->load_error = why;
        j->load_after = time_mono() + (double)c->poll_interval_secs;
    } else {
        free(j->load_error);
        j->load_error = NULL;
        j->loaded = true;
        j->next_claim = 0;
        tell_view_changed();
        log_info(&(struct log_ctx){ .job = &j->log }, "working job %s: %zu shards", j->job_dir,
                 j->m.nshards);
        if (gstage_has(&j->m))
            (void)jobs_global_enter(j, &err); /* (a broken record logged there) */
        prev = jobs_fs_owner(j);
        recover_claims(j);
        jobs_fs_restore(prev);
    }
    if (J.changed)
        J.changed();
}

static void
load_out_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    struct job *j = w->data;
    struct jobload *l = j->load;
    char chunk[65536];
    ssize_t n = read(w->fd, chunk, sizeof(chunk));

    (void)revents;
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n > 0) {
        const char *p = chunk;
        struct esd_err err;

        helper_guard_fed(&l->guard, loop);
        /* (ticks before the report) */
        while (!l->kind && n && *p == '\n')
            p++, n--;
        if (!l->kind && n) {
            l->kind = *p++;
            n--;
        }
        if (n <= 0 || l->too_big)
            return;
        if ((l->got += (size_t)n) > LOAD_MAX_REPORT) {
            l->too_big = true;
            kill(l->pid, SIGKILL);
        } else if (l->kind == 'E' && l->why.len < LOAD_MAX_WHY) {
            buf_append(&l->why, p, (size_t)n);
        } else if (l->kind == 'M' && !l->bad &&
                   manifest_reader_feed(&l->rd, p, (size_t)n, &err) < 0) {
            l->bad = xstrdup(err.msg);
        }
        return;
    }
    ev_io_stop(loop, w);
    close(w->fd);
    l->eof = true;
    if (l->exited)
        load_done(j);
}

static void
load_child_cb(struct ev_loop *loop, ev_child *w, int revents)
{
    struct job *j = w->data;
    struct jobload *l = j->load;

    (void)revents;
    ev_child_stop(loop, w);
    helper_guard_stop(&l->guard, loop);
    l->exited = true;
    l->status = w->rstatus;
    if (l->eof)
        load_done(j);
}

/* Starts j's loading helper. */
static void
load_start(struct job *j)
{
    struct helper_id who;
    struct jobload *l;
    struct esd_err err;
    int fd;
    pid_t pid;

    /* (the owner's groups as the user database has them now: a user
     * added to or removed from a group since the registration gets the
     * access the database gives today, as a fresh login would) */
    struct spawn_cred now;

    if (spawn_cred_for_uid(j->uid, &now, &err) == 0) {
        spawn_cred_free(&j->owner);
        j->owner = now;
        j->gid = now.gid;
    }
    jobs_helper_id(j, &who);
    if ((pid = helper_fork("loading", &who, &fd, &err)) < 0) {
        log_warning(&(struct log_ctx){ .job = &j->log }, "job %s: %s; trying again later",
                    j->job_dir, err.msg);
        j->load_after = time_mono() + (double)J.conf->poll_interval_secs;
        return;
    }
    if (pid == 0)
        load_child(j, fd);
    l = xcalloc(1, sizeof(*l));
    l->job = j;
    l->pid = pid;
    buf_init(&l->why);
    manifest_reader_init(&l->rd);
    ev_io_init(&l->out_w, load_out_cb, fd, EV_READ);
    l->out_w.data = j;
    ev_io_start(J.loop, &l->out_w);
    ev_child_init(&l->child_w, load_child_cb, pid, 0);
    l->child_w.data = j;
    ev_child_start(J.loop, &l->child_w);
    helper_guard_start(&l->guard, J.loop, pid, "loading", &(struct log_ctx){ .job = &j->log },
                       (double)J.conf->helper_timeout_secs);
    j->load = l;
}

/* Tracks the shards whose attempts failed here, for badnode_check. Only
 * counted failures (the processor's or its output's) of shards still
 * claimable: an infrastructure failure says nothing about this node's
 * processor, and a shard failed for good will never be done elsewhere.
 * The list is bounded (JOBS_BADNODE_TRACK): a verdict needs only a few. */
void
jobs_attempt_ended(struct job *j, const struct attempt_final *fin)
{
    size_t k;

    /* (the global stage's one pseudo-shard is no evidence of a bad node:
     * only this node or one other runs it, and its index is not a
     * manifest shard's) */
    if (j->gstage)
        return;
    for (k = 0; k < j->nfailed_idx && j->failed_idx[k] != fin->index; k++)
        ;
    if (!strcmp(fin->status, "done") && k < j->nfailed_idx) {
        j->failed_idx[k] = j->failed_idx[--j->nfailed_idx];
    } else if (!strcmp(fin->status, "failed") && fin->counted && !fin->shard_failed &&
               k == j->nfailed_idx && j->nfailed_idx < JOBS_BADNODE_TRACK) {
        j->failed_idx[j->nfailed_idx++] = fin->index;
    }
}

/*
 * Looks at the shards that failed here for a done record (another node's:
 * a success here took the shard off the list); false once this node has
 * stopped claiming j.
 */
static bool
badnode_check(struct job *j)
{
    double now = time_mono();
    struct fsid prev;

    if (j->stopped)
        return false;
    /* one lstat per tracked shard, at most once a poll: next_job calls
     * this before every claim */
    if (!j->nfailed_idx || now - j->badnode_checked < (double)J.conf->poll_interval_secs)
        return true;
    j->badnode_checked = now;
    prev = jobs_fs_owner(j);
    for (size_t k = 0; k < j->nfailed_idx;) {
        char *done = manifest_state_path(&j->m, "done", j->m.shards[j->failed_idx[k]].id, ".json");
        struct stat st;

        if (lstat(done, &st) == 0) {
            j->done_elsewhere++;
            j->failed_idx[k] = j->failed_idx[--j->nfailed_idx];
        } else {
            k++;
        }
        free(done);
    }
    jobs_fs_restore(prev);
    if (j->done_elsewhere < JOBS_BADNODE_SHARDS)
        return true;
    j->stopped = xasprintf("this node's attempts failed on %u shards that other nodes then did: "
                           "its processor fails what works elsewhere, so it claims no more of "
                           "this job (submit it again or restart esd once the node is fixed)",
                           j->done_elsewhere);
    log_warning(&(struct log_ctx){ .job = &j->log }, "job %s: %s", j->job_dir, j->stopped);
    return false;
}

bool
jobs_load(struct job *j)
{
    struct esd_err err;

    /* (a loaded job's directory refused at a rescan: its claimer's paths
     * would lead into whatever is there now, so it is not worked until
     * jobs_check_bound finds the very directory again) */
    if (j->loaded)
        return !j->refused && badnode_check(j);
    if (j->load || time_mono() < j->load_after)
        return false;
    if (jobs_check_bound(j, &err) < 0) {
        free(j->load_error);
        j->load_error = xstrdup(err.msg);
        j->load_after = time_mono() + (double)J.conf->poll_interval_secs;
        return false;
    }
    load_start(j);
    return false;
}

void
jobs_set_state(struct job *j, enum job_state state, const char *error)
{
    if (j->state == state && (!error || (j->error && !strcmp(error, j->error))))
        return;
    j->state = state;
    free(j->error);
    j->error = error ? xstrdup(error) : NULL;
    /* retention_secs counts from the end, whatever happens after it */
    if (!job_over(j))
        j->ended_at = 0;
    else if (j->ended_at <= 0)
        j->ended_at = time_wall();
    persist(j);
    tell_view_changed();
    if (error)
        log_event(LOG_LVL_NOTICE, &(struct log_ctx){ .job = &j->log },
                  state == JOB_FAILED ? MSGID_JOB_FAILED : NULL, "job %s: %s: %s", j->job_dir,
                  job_state_name[state], error);
    else
        log_notice(&(struct log_ctx){ .job = &j->log }, "job %s: %s", j->job_dir,
                   job_state_name[state]);
}

struct job *
jobs_register(const char *job_dir, const struct stat *st, const char *output, bool spool, uid_t by,
              struct esd_err *err)
{
    char *want = output ? xstrdup(output) : fs_join(job_dir, "merged.jsonl");
    cJSON *o;
    struct job *j;
    struct stat now;
    char key[17], *path;
    bool added;
    int r;

    /* what a registration of any node will check, checked now */
    if (validate(job_dir, true, st->st_uid, st->st_ino, st->st_dev, want, &now, err) < 0) {
        free(want);
        return NULL;
    }
    o = cJSON_CreateObject();
    json_add_str(o, "job_dir", job_dir);
    if (output)
        json_add_str(o, "output", output);
    json_add_int(o, "uid", (long long)st->st_uid);
    json_add_int(o, "ino", (long long)st->st_ino);
    json_add_int(o, "submitted_by", (long long)by);
    json_add_str(o, "node", J.conf->node_name);
    /* (no "dev" in the spool copy: the same NFS mount has a different
     * device number on each node; each binds its own, jobs_check_bound) */
    manifest_dir_key(job_dir, key);
    /* submitted again: what this node forgot of it no longer holds */
    path = forgotten_path(key);
    unlink(path);
    free(path);
    if (spool) {
        if (!J.spool_dir) {
            cJSON_Delete(o);
            free(want);
            err_set(err, -EINVAL,
                    "no spool_dir is configured on this node, so --everywhere "
                    "cannot register the job for every node");
            return NULL;
        }
        path = xasprintf("%s/%s.json", J.spool_dir, key);
        struct fsid prev = jobs_fs_self();
        r = json_write_atomic(path, o, JSON_PRETTY, err);
        jobs_fs_restore(prev);
        free(path);
        if (r < 0) {
            cJSON_Delete(o);
            free(want);
            return NULL;
        }
    }
    json_add_int(o, "dev", (long long)st->st_dev);
    if ((j = find(key))) {
        /* Submitted again by its owner: bound anew (it may have been
         * prepared again at the same path), the output given now, and a
         * stopped job works again (a failed one after `esctl retry`). */
        /* attempts and a merge in flight run as the old owner: a new owner
         * only once they are over */
        if (j->uid != now.st_uid && (j->running || j->finalize)) {
            err_set(err, -EBUSY,
                    "job %s of uid %u still runs here; try again once it has "
                    "stopped",
                    job_dir, (unsigned)j->uid);
            free(want);
            cJSON_Delete(o);
            return NULL;
        }
        if (j->uid != now.st_uid) {
            spawn_cred_free(&j->owner);
            if (spawn_cred_for_uid(now.st_uid, &j->owner, err) < 0) {
                free(want);
                cJSON_Delete(o);
                return NULL;
            }
        }
        j->uid = now.st_uid;
        j->gid = j->owner.gid;
        if (j->ino != now.st_ino || j->dev != now.st_dev) {
            j->ino = now.st_ino;
            j->dev = now.st_dev;
            jobs_reset(j);
        }
        free(j->refused);
        j->refused = NULL;
        /* (a node fixed since its processor failed the job's shards) */
        free(j->stopped);
        j->stopped = NULL;
        j->nfailed_idx = 0;
        j->done_elsewhere = 0;
        free(j->output);
        j->output = want;
        if (j->state == JOB_CANCELLED || j->state == JOB_FAILED || j->state == JOB_COMPLETE) {
            /* read again from the directory: it may have been prepared
             * anew at the same path (a complete job stays complete: its
             * merge record is found again) */
            if (!jobs_reset(j)) {
                j->idle_valid = false;
                j->next_claim = 0;
            }
            jobs_set_state(j, JOB_ACTIVE, NULL);
        }
    } else {
        free(want);
        if (!(j = add(o, spool ? "spool" : "submit", &added, NULL))) {
            cJSON_Delete(o);
            err_set(err, -EINVAL, "cannot register %s (see esd's log)", job_dir);
            return NULL;
        }
    }
    cJSON_Delete(o);
    jobs_uncancel(j);
    persist(j);
    return j;
}

bool
jobs_reset(struct job *j)
{
    if (j->running || j->finalize)
        return false;
    tell_unloaded(j);
    if (j->loaded) {
        global_leave(j);
        claimer_free(&j->claimer);
        manifest_free(&j->m);
        j->loaded = false;
        tell_view_changed(); /* (its view goes) */
    }
    load_abandon(j);
    j->nfailed_idx = 0; /* (shard indices of the manifest gone) */
    j->load_after = 0;
    free(j->load_error);
    j->load_error = NULL;
    j->idle_valid = false;
    j->next_claim = 0;
    j->rate_t0 = j->rate_t1 = 0;
    j->rate_d0 = j->rate_d1 = 0;
    j->cancelled_everywhere = false;
    return true;
}

const char *
jobs_spool_dir(void)
{
    return J.spool_dir;
}

cJSON *
jobs_spool_refusals(const char *job_dir)
{
    cJSON *a = cJSON_CreateArray();
    char key[17], prefix[32];
    struct fsid prev;
    struct dirent *e;
    DIR *d;
    int n = 0;

    if (!J.spool_dir)
        return a;
    manifest_dir_key(job_dir, key);
    snprintf(prefix, sizeof(prefix), "%s.", key);
    prev = jobs_fs_self();
    if ((d = opendir(J.spool_dir))) {
        while ((e = readdir(d)) && n < 64) {
            size_t len = strlen(e->d_name);
            struct esd_err err;
            struct stat st;
            cJSON *o = NULL;
            char *path;

            if (strncmp(e->d_name, prefix, strlen(prefix)) || len < 8 ||
                strcmp(e->d_name + len - 8, ".refused"))
                continue;
            path = fs_join(J.spool_dir, e->d_name);
            if (spool_file_ok(path, &st) && json_load_object(path, 1 << 16, &o, &err) == 0 &&
                json_get_str(o, "node") && json_get_str(o, "why") &&
                !strcmp(json_get_str(o, "job_dir") ? json_get_str(o, "job_dir") : "", job_dir)) {
                cJSON *x = cJSON_CreateObject();

                json_add_str(x, "node", json_get_str(o, "node"));
                json_add_str(x, "why", json_get_str(o, "why"));
                cJSON_AddItemToArray(a, x);
                n++;
            }
            cJSON_Delete(o);
            free(path);
        }
        closedir(d);
    }
    jobs_fs_restore(prev);
    return a;
}

struct job *
jobs_find(const char *job_dir)
{
    char key[17];

    manifest_dir_key(job_dir, key);
    return find(key);
}

/* <job>/state/esd/cancelled.json: the job is cancelled on every node. In
 * the job directory, not the spool: every node working the job sees it
 * through the mount it already reads, the spool registration can go at
 * once, and the owner may write it. */
static char *
cancel_marker(const char *job_dir)
{
    return xasprintf("%s/state/esd/cancelled.json", job_dir);
}

int
jobs_cancel_everywhere(const char *job_dir, uid_t uid, gid_t gid, uid_t by, struct esd_err *err)
{
    struct job owner = { .uid = uid, .gid = gid };
    char *path = cancel_marker(job_dir), *dir = fs_dirname(path), now[40];
    cJSON *o = cJSON_CreateObject();
    char key[17];
    int r;

    time_iso_now(now, NULL);
    json_add_str(o, "node", J.conf->node_name);
    json_add_int(o, "uid", (long long)by);
    json_add_str(o, "cancelled_at", now);
    struct fsid prev = jobs_fs_owner(&owner);
    r = fs_mkdir_p(dir, 0755, err);
    if (r == 0)
        r = json_write_atomic(path, o, JSON_PRETTY, err);
    jobs_fs_restore(prev);
    cJSON_Delete(o);
    free(dir);
    free(path);
    /* The spool registration would only be adopted to be cancelled. */
    if (r == 0 && J.spool_dir) {
        manifest_dir_key(job_dir, key);
        path = xasprintf("%s/%s.json", J.spool_dir, key);
        prev = jobs_fs_self();
        if (unlink(path) < 0 && errno != ENOENT)
            log_warning(NULL, "cannot remove %s: %s, ignoring", path, strerror(errno));
        /* (and the nodes' records of why they refused it) */
        refusals_remove(key);
        jobs_fs_restore(prev);
        free(path);
    }
    return r;
}

bool
jobs_cancelled_everywhere(const struct job *j)
{
    char *path = cancel_marker(j->job_dir);
    struct stat st;
    bool yes;

    struct fsid prev = jobs_fs_owner(j);
    yes = stat(path, &st) == 0;
    jobs_fs_restore(prev);
    free(path);
    return yes;
}

void
jobs_uncancel(struct job *j)
{
    char *path = cancel_marker(j->job_dir);
    struct fsid prev = jobs_fs_owner(j);

    if (unlink(path) == 0)
        log_notice(&(struct log_ctx){ .job = &j->log },
                   "job %s: submitted again, so no longer "
                   "cancelled on every node",
                   j->job_dir);
    jobs_fs_restore(prev);
    free(path);
}

void
jobs_rate(struct job *j, double *ret_shards_per_sec, double *ret_eta)
{
    double now = time_mono(), rate = -1, eta = -1;
    size_t done, total;

    jobs_progress(j, &done, &total);
    if (!j->loaded) {
        *ret_shards_per_sec = *ret_eta = -1;
        return;
    }
    /* Two snapshots a window apart: the rate over the last one to two
     * windows, so that it follows a fleet that grows or shrinks. */
    if (j->rate_t1 == 0) {
        j->rate_t0 = j->rate_t1 = now;
        j->rate_d0 = j->rate_d1 = done;
    } else if (now - j->rate_t1 >= RATE_WINDOW) {
        j->rate_t0 = j->rate_t1;
        j->rate_d0 = j->rate_d1;
        j->rate_t1 = now;
        j->rate_d1 = done;
    }
    if (now - j->rate_t0 >= 1 && done >= j->rate_d0)
        rate = (double)(done - j->rate_d0) / (now - j->rate_t0);
    if (rate > 0 && total >= done)
        eta = (double)(total - done) / rate;
    else if (total == done)
        eta = 0;
    *ret_shards_per_sec = rate;
    *ret_eta = eta;
}

void
jobs_progress(const struct job *j, size_t *done, size_t *total)
{
    *total = j->loaded ? j->m.nshards : 0;
    *done = j->loaded ? j->claimer.ndone : 0;
}

cJSON *
jobs_status_json(void)
{
    cJSON *a = cJSON_CreateArray();

    for (struct job *j = J.head; j; j = j->next) {
        cJSON *o = cJSON_CreateObject();
        size_t done, total;

        jobs_progress(j, &done, &total);
        json_add_str(o, "key", j->key);
        json_add_str(o, "job_dir", j->job_dir);
        if (j->loaded)
            json_add_str(o, "job_id", j->m.job_id);
        json_add_str(o, "output", j->output);
        json_add_str(o, "state", job_state_name[j->state]);
        /* not loaded (not claimed from since esd started): counts unknown */
        json_add_bool(o, "loaded", j->loaded);
        json_add_int(o, "shards", (long long)total);
        json_add_int(o, "done", (long long)done);
        json_add_int(o, "failed", j->loaded ? (long long)j->claimer.nfailed : 0);
        json_add_int(o, "running_here", (long long)j->running);
        json_add_int(o, "done_here", (long long)j->done_here);
        json_add_int(o, "failed_here", (long long)j->failed_here);
        json_add_int(o, "rows_here", (long long)j->rows_here);
        json_add_int(o, "failed_in_a_row", (long long)j->fail_streak);
        if (j->paused_until > time_mono())
            json_add_float(o, "paused_secs", j->paused_until - time_mono());
        if (j->loaded) {
            cJSON *cl = cJSON_AddObjectToObject(o, "claims");
            double rate, eta;

            /* (claim.h struct claim_stats; esd(8) STATUS) */
            json_add_int(cl, "locks_created", (long long)j->claimer.stats.locks_created);
            json_add_int(cl, "claimed", (long long)j->claimer.stats.claimed);
            json_add_int(cl, "passed_done", (long long)j->claimer.stats.passed_done);
            jobs_rate(j, &rate, &eta);
            json_add_int(o, "total_rows", j->m.total_rows);
            if (rate >= 0) {
                json_add_float(o, "shards_per_sec", rate);
                if (j->m.nshards)
                    json_add_float(o, "rows_per_sec",
                                   rate * (double)j->m.total_rows / (double)j->m.nshards);
            }
            if (eta >= 0 && (j->state == JOB_ACTIVE || j->state == JOB_DRAINING))
                json_add_float(o, "eta_secs", eta);
        }
        if (j->error)
            json_add_str(o, "error", j->error);
        if (j->refused)
            json_add_str(o, "load_error", j->refused);
        else if (j->load_error)
            json_add_str(o, "load_error", j->load_error);
        else if (j->stopped)
            json_add_str(o, "load_error", j->stopped); /* (shown by the text view) */
        if (j->stopped)
            json_add_str(o, "refused", j->stopped);
        cJSON_AddItemToArray(a, o);
    }
    return a;
}
