/*
 * jobs: the registry of jobs this node works, on disk and in memory.
 */
#include "jobs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
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
#include "fsutil.h"
#include "json.h"
#include "log.h"
#include "sha256.h"

const char *const job_state_name[] = {
    [JOB_ACTIVE] = "active",       [JOB_DRAINING] = "draining", [JOB_FINALIZING] = "finalizing",
    [JOB_COMPLETE] = "complete",   [JOB_FAILED] = "failed",     [JOB_CANCELLED] = "cancelled",
};

static struct {
    const struct esd_conf *conf;
    struct job *head;
    size_t n;
    char *jobs_dir;     /* <state_dir>/jobs */
    char *claims_dir;   /* <state_dir>/claims: <key>.<token>.json per claim held */
    int lock_fd;        /* <state_dir>/esd.lock, flocked while esd runs */
    char *dj_version;   /* what this node's processor runs */
    struct ev_loop *loop;
    /* the registry and the spool directories, watched with inotify for
     * files written or renamed into them (this node's writes only: the
     * rescan timer covers other nodes' on NFS) */
    ev_io notify_w;
    char *spool_dir;    /* as the watch was set */
    void (*changed)(void);
} J;

static int
state_parse(const char *s)
{
    for (int i = JOB_ACTIVE; i <= JOB_CANCELLED; i++)
        if (s && !strcmp(s, job_state_name[i]))
            return i;
    return -1;
}

static void
job_key(const char *job_dir, char key[17])
{
    char hex[SHA256_HEX_LEN + 1];

    sha256_buf(job_dir, strlen(job_dir), hex);
    memcpy(key, hex, 16);
    key[16] = '\0';
}

static struct job *
find(const char *key)
{
    for (struct job *j = J.head; j; j = j->next)
        if (!strcmp(j->key, key))
            return j;
    return NULL;
}

/* Writes the job's registry file (atomically). */
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
    return fs_switch(j->uid, j->gid);
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

static void
persist(struct job *j)
{
    cJSON *o = cJSON_CreateObject();
    struct esd_err err;
    char now[40];

    time_iso_now(now, NULL);
    json_add_str(o, "job_dir", j->job_dir);
    json_add_str(o, "output", j->output);
    json_add_str(o, "state", job_state_name[j->state]);
    if (j->error)
        json_add_str(o, "error", j->error);
    if (j->state == JOB_CANCELLED && j->cancelled_everywhere)
        json_add_bool(o, "cancelled_everywhere", true);
    json_add_str(o, "updated_at", now);
    struct fsid prev = jobs_fs_self();
    if (json_write_atomic(j->reg_path, o, JSON_PRETTY, &err) < 0)
        log_warning(&(struct log_ctx){ .job = j->key }, "%s; the state is kept in memory",
                    err.msg);
    jobs_fs_restore(prev);
    cJSON_Delete(o);
}

static void
job_free(struct job *j)
{
    if (j->loaded) {
        claimer_free(&j->claimer);
        manifest_free(&j->m);
    }
    free(j->job_dir);
    free(j->output);
    free(j->reg_path);
    free(j->error);
    free(j->load_error);
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

/* Adds a job from a registration object (or finds it); NULL if the
 * registration is unusable. *ret_new tells whether it was added. */
static struct job *
add(const cJSON *o, const char *from, bool *ret_new)
{
    const char *dir = json_get_str(o, "job_dir"), *out = json_get_str(o, "output");
    const char *st = json_get_str(o, "state");
    char key[17], *resolved = NULL;
    struct esd_err err;
    struct job *j;

    if (!dir || dir[0] != '/') {
        if (complain(from))
            log_warning(NULL, "%s: job_dir must be an absolute path, ignoring", from);
        return NULL;
    }
    if (fs_realpath_lax(dir, &resolved, &err) < 0) {
        if (complain(from))
            log_warning(NULL, "%s: %s, ignoring", from, err.msg);
        return NULL;
    }
    job_key(resolved, key);
    *ret_new = false;
    if ((j = find(key))) {
        free(resolved);
        return j;
    }
    *ret_new = true;
    j = xcalloc(1, sizeof(*j));
    memcpy(j->key, key, sizeof(key));
    j->job_dir = resolved;
    j->output = out && out[0] == '/' ? xstrdup(out) : fs_join(resolved, "merged.jsonl");
    j->reg_path = xasprintf("%s/%s.json", J.jobs_dir, key);
    j->state = st && state_parse(st) >= 0 ? (enum job_state)state_parse(st) : JOB_ACTIVE;
    if (json_get_str(o, "error"))
        j->error = xstrdup(json_get_str(o, "error"));
    json_get_bool(o, "cancelled_everywhere", &j->cancelled_everywhere);
    /* draining and finalizing are this process's business, not a restart's */
    if (j->state == JOB_DRAINING || j->state == JOB_FINALIZING)
        j->state = JOB_ACTIVE;
    j->next = J.head;
    J.head = j;
    J.n++;
    log_info(&(struct log_ctx){ .job = j->key }, "job %s registered (%s), %s", j->job_dir, from,
             job_state_name[j->state]);
    return j;
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
        struct job *j;
        cJSON *o = NULL;
        char *path;

        if (e->d_name[0] == '.' || n < 6 || strcmp(e->d_name + n - 5, ".json"))
            continue;
        path = fs_join(dir, e->d_name);
        if (json_load_object(path, 1 << 20, &o, &err) < 0) {
            if (complain(path))
                log_warning(NULL, "%s, ignoring", err.msg);
        } else {
            /* a spool registration carries no state of this node */
            if (spool)
                cJSON_DeleteItemFromObjectCaseSensitive(o, "state");
            bool added = false;

            if ((j = add(o, path, &added))) {
                j->seen = true;
                /* cancelled everywhere, then submitted everywhere again */
                if (spool && !added && j->state == JOB_CANCELLED && j->cancelled_everywhere &&
                    !jobs_cancelled_everywhere(j)) {
                    jobs_reset(j);
                    jobs_set_state(j, JOB_ACTIVE, NULL);
                    log_notice(&(struct log_ctx){ .job = j->key }, "job %s: submitted again on "
                               "every node", j->job_dir);
                }
                /* adopted from the spool: this node's own record from now on */
                if (spool && added)
                    persist(j);
            }
        }
        cJSON_Delete(o);
        free(path);
    }
    closedir(d);
}

void
jobs_rescan(void)
{
    scan(J.jobs_dir, false);
    if (J.spool_dir)
        scan(J.spool_dir, true);
}

/* One esd per state directory: its claim records are then known to be of
 * a previous run when esd starts. The lock file holds the pid. */
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
    struct fsid prev = jobs_fs_self();
    if (json_write_atomic(path, o, JSON_PRETTY, &err) < 0)
        log_warning(&(struct log_ctx){ .job = j->m.job_id, .shard = cl->shard_id },
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

/* Takes over at once the claims this node's previous run held on j. */
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
            log_warning(&(struct log_ctx){ .job = j->m.job_id }, "%s, removing it", err.msg);
        } else if (!(shard = json_get_str(o, "shard_id")) || !(token = json_get_str(o, "token"))) {
            log_warning(&(struct log_ctx){ .job = j->m.job_id },
                        "%s lacks shard_id or token, removing it", path);
        } else if ((r = claim_recover(&j->claimer, shard, token, &err)) < 0) {
            log_warning(&(struct log_ctx){ .job = j->m.job_id, .shard = shard },
                        "cannot recover this node's claim from its previous run: %s; it ends "
                        "with its lease", err.msg);
        } else {
            log_notice(&(struct log_ctx){ .job = j->m.job_id, .shard = shard },
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

            /* a registration is a visible *.json; temporary files are not */
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

int
jobs_init(struct ev_loop *loop, const struct esd_conf *c, struct esd_err *err)
{
    struct attempt_opts ao = { 0 };
    int dirty, r;

    J.loop = loop;
    J.conf = c;
    J.lock_fd = -1;
    J.jobs_dir = fs_join(c->state_dir, "jobs");
    J.claims_dir = fs_join(c->state_dir, "claims");
    if ((r = fs_mkdir_p(J.jobs_dir, 0755, err)) < 0 ||
        (r = fs_mkdir_p(J.claims_dir, 0755, err)) < 0 || (r = lock_state_dir(c, err)) < 0)
        return r;
    watch_dirs(loop, c);
    ao.processor = c->processor.n ? (const char *const *)c->processor.v : NULL;
    ao.dj_root = c->dj_root;
    ao.python = c->dj_python;
    djversion_detect(&ao, &J.dj_version, &dirty);
    log_info(NULL, "Data-Juicer version here: %s", J.dj_version);
    jobs_rescan();
    return 0;
}

void
jobs_reconfigure(const struct esd_conf *c)
{
    struct attempt_opts ao = { 0 };
    int dirty;

    J.conf = c;
    ao.processor = c->processor.n ? (const char *const *)c->processor.v : NULL;
    ao.dj_root = c->dj_root;
    ao.python = c->dj_python;
    free(J.dj_version);
    djversion_detect(&ao, &J.dj_version, &dirty);
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
    if (J.lock_fd >= 0)
        close(J.lock_fd);
    free(J.spool_dir);
    free(J.dj_version);
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

/* Why this node cannot work j, or NULL. */
static char *
refusal(struct job *j)
{
    const char *want = j->m.recipe_sha256;
    const char *snap = j->m.recipe_snapshot;
    char hex[SHA256_HEX_LEN + 1], *path = NULL;
    struct esd_err err;

    if (djversion_check(j->m.dj_commit, J.dj_version, &err) < 0 &&
        !J.conf->allow_version_mismatch)
        return xasprintf("%s (set data_juicer.allow_version_mismatch only if this is "
                         "intentional)",
                         err.msg);
    if (fs_join_inside(j->job_dir, snap ? snap : "recipe.yaml", &path, &err) < 0)
        return xstrdup(err.msg);
    if (sha256_file(path, hex, &err) < 0) {
        free(path);
        return xstrdup(err.msg);
    }
    free(path);
    if (want && strcmp(want, hex))
        return xstrdup("the recipe snapshot's hash does not match the manifest");
    return NULL;
}

bool
jobs_load(struct job *j)
{
    const struct esd_conf *c = J.conf;
    struct claim_opts o = { 0 };
    struct esd_err err;
    char *why = NULL;

    struct stat st;
    struct fsid prev;

    if (j->loaded)
        return true;
    if (stat(j->job_dir, &st) < 0) {
        why = xasprintf("cannot stat %s: %s", j->job_dir, strerror(errno));
    } else if (geteuid() == 0 && st.st_uid == 0) {
        why = xasprintf("%s is owned by root, and esd never runs attempts as root; give the "
                        "job directory to the user its attempts should run as",
                        j->job_dir);
    } else {
        j->uid = st.st_uid;
        j->gid = st.st_gid;
        prev = jobs_fs_owner(j);
        if (manifest_load(j->job_dir, &j->m, &err) < 0) {
            why = xstrdup(err.msg);
        } else if ((why = refusal(j))) {
            manifest_free(&j->m);
        } else {
            o.node = c->node_name;
            o.lease_secs = c->lease_secs;
            o.max_infra = c->max_infra_failures;
            o.max_retries = -1;
            if (claimer_init(&j->claimer, &j->m, &o, &err) < 0) {
                why = xstrdup(err.msg);
                manifest_free(&j->m);
            }
        }
        jobs_fs_restore(prev);
    }
    if (why) {
        /* said once per reason, not at every rescan */
        if (!j->load_error || strcmp(j->load_error, why))
            log_warning(&(struct log_ctx){ .job = j->key }, "cannot work job %s: %s", j->job_dir,
                        why);
        free(j->load_error);
        j->load_error = why;
        return false;
    }
    free(j->load_error);
    j->load_error = NULL;
    j->loaded = true;
    log_info(&(struct log_ctx){ .job = j->m.job_id }, "working job %s: %zu shards", j->job_dir,
             j->m.nshards);
    prev = jobs_fs_owner(j);
    recover_claims(j);
    jobs_fs_restore(prev);
    return true;
}

void
jobs_set_state(struct job *j, enum job_state state, const char *error)
{
    if (j->state == state && (!error || (j->error && !strcmp(error, j->error))))
        return;
    j->state = state;
    free(j->error);
    j->error = error ? xstrdup(error) : NULL;
    persist(j);
    if (error)
        log_notice(&(struct log_ctx){ .job = j->loaded ? j->m.job_id : j->key }, "job %s: %s: %s",
                   j->job_dir, job_state_name[state], error);
    else
        log_notice(&(struct log_ctx){ .job = j->loaded ? j->m.job_id : j->key }, "job %s: %s",
                   j->job_dir, job_state_name[state]);
}

struct job *
jobs_register(const char *job_dir, const char *output, bool spool, struct esd_err *err)
{
    cJSON *o = cJSON_CreateObject();
    struct job *j;
    char key[17], *path;
    bool added;
    int r;

    json_add_str(o, "job_dir", job_dir);
    if (output)
        json_add_str(o, "output", output);
    job_key(job_dir, key);
    if (spool) {
        if (!J.spool_dir) {
            cJSON_Delete(o);
            err_set(err, -EINVAL, "no spool_dir is configured on this node, so --everywhere "
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
            return NULL;
        }
    }
    j = add(o, spool ? "spool" : "submit", &added);
    cJSON_Delete(o);
    if (!j) {
        err_set(err, -EINVAL, "cannot register %s", job_dir);
        return NULL;
    }
    if (!added) {
        /* Submitted again: the output given now, and a stopped job works
         * again (a failed one after `esctl retry`). */
        char *want = output ? xstrdup(output) : fs_join(j->job_dir, "merged.jsonl");

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
    }
    jobs_uncancel(j);
    persist(j);
    return j;
}

bool
jobs_reset(struct job *j)
{
    if (j->running || j->finalize)
        return false;
    if (j->loaded) {
        claimer_free(&j->claimer);
        manifest_free(&j->m);
        j->loaded = false;
    }
    free(j->load_error);
    j->load_error = NULL;
    j->idle_valid = false;
    j->next_claim = 0;
    j->rate_t0 = j->rate_t1 = 0;
    j->rate_d0 = j->rate_d1 = 0;
    j->cancelled_everywhere = false;
    return true;
}

struct job *
jobs_find(const char *job_dir)
{
    char key[17];

    job_key(job_dir, key);
    return find(key);
}

/* <job>/state/esd/cancelled.json: the job is cancelled on every node. */
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
        job_key(job_dir, key);
        path = xasprintf("%s/%s.json", J.spool_dir, key);
        prev = jobs_fs_self();
        if (unlink(path) < 0 && errno != ENOENT)
            log_warning(NULL, "cannot remove %s: %s, ignoring", path, strerror(errno));
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
    struct stat st;

    if (stat(j->job_dir, &st) == 0) {
        j->uid = st.st_uid;
        j->gid = st.st_gid;
    }
    struct fsid prev = jobs_fs_owner(j);
    if (unlink(path) == 0)
        log_notice(&(struct log_ctx){ .job = j->key }, "job %s: submitted again, so no longer "
                   "cancelled on every node", j->job_dir);
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
        if (j->loaded) {
            double rate, eta;

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
        if (j->load_error)
            json_add_str(o, "load_error", j->load_error);
        cJSON_AddItemToArray(a, o);
    }
    return a;
}
