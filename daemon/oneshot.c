/*
 * oneshot: esd run. The coordination directory holds, as the reference's
 * dlc_job.py writes them (spec §5.10):
 *   prepare.lock, finalize.lock, abort.lock   O_EXCL elections, one line of
 *       JSON {created_at, hostname, phase, pid} plus esd's node, token and
 *       lease_secs; the holder renews the mtime every lease/4;
 *   prepare-result.json, finalize-result.json, abort.json   {phase,
 *       return_code, hostname, finished_at[, error | reason]}, published
 *       once (link(2)): the first publication stands;
 * and esd's own:
 *   clock/<node>      touched to read the file server's time (leases are
 *                     judged on it, never on a node's clock);
 *   ranks/<rank>.json one file a launcher rank, written once; read only by
 *                     the node that reports the end (who took part).
 *
 * A lock is stale when its age exceeds its lease_secs (the reference's,
 * which have none: the wait timeout); a stale lock is moved aside under
 * the fence a shard's lock takeover uses, and the election held again.
 */
#include "oneshot.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <ev.h>

#include "claim.h"
#include "config.h"
#include "contain.h"
#include "engine.h"
#include "finalize.h"
#include "fsutil.h"
#include "gstage.h"
#include "helper.h"
#include "jobs.h"
#include "jobview.h"
#include "json.h"
#include "log.h"
#include "manifest.h"
#include "ops.h"
#include "prepare.h"
#include "pypath.h"
#include "sched.h"
#include "sha256.h"
#include "status.h"
#include "suggest.h"

#define WAIT_TIMEOUT_DEFAULT 126000.0 /* the reference's --wait-timeout-secs */
#define COORD_POLL_DEFAULT 2.0
#define RESULT_MAX (1 << 20)
/* walltime: a shard is not claimed unless now + its estimate * this +
 * DEADLINE_SLACK ends before the deadline */
#define DEADLINE_FACTOR 1.25
#define DEADLINE_SLACK 10.0

enum { EXIT_OK = 0, EXIT_INCOMPLETE = 1, EXIT_FAILED = 2, EXIT_SIGTERM = 143 };

/* An election on <coord>/<phase>.lock. */
struct elect {
    char *path;
    const char *phase;
    char token[33];
    bool held;
};

enum phase { P_WORK, P_MERGING, P_WAITING };

static struct {
    /* the command line */
    char *job_dir, *recipe, *dataset, *output, *run_id, *node, *state_dir, *esd_config;
    char *processor, *dj_root, *ray_mode, *ray_address, *ray_command;
    long long num_shards, nodes, slots, threads, lease, max_retries, lock_timeout, attempt_timeout;
    struct strv allow, deny;
    bool strict, nodes_given, no_global_stage;
    double wait_timeout, poll, deadline;
    const char *run_id_from, *deadline_from;
    /* the launcher's ranks */
    const char *launcher;
    long long rank, local_rank, world, nnodes;
    /* coordination */
    char runkey[21];
    char *coord;
    char *state_base; /* the parent of the default state directory */
    char host[256];
    long long cap; /* strict: shards this node may complete; 0: none */
    /* the engine */
    struct ev_loop *loop;
    struct esd_conf *conf;
    struct job *job;
    ev_timer tick_w, beat_w;
    ev_signal term_w, int_w, hup_w;
    struct elect fin;
    enum phase phase;
    double phase_at;            /* monotonic: the phase began, or (work) a shard was last done */
    struct timespec done_mtime; /* (work) of state/done then */
    struct timespec done_seen, failed_seen; /* of state/done, state/failed, last looked at */
    size_t nfailed;                         /* failed records at the last count */
    bool said_cap, said_deadline;
    bool stopping;
    int code;
    char *reason;
    struct log_job log; /* every line of esd run is about its one job */
    struct log_ctx ctx;
} R;

static volatile sig_atomic_t stop_sig;

static void
on_stop_sig(int sig)
{
    stop_sig = sig;
}

/* ---- small things ---- */

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void line(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* A line on stdout, control characters escaped (reasons and names come
 * from files other nodes wrote). */
static void
vline(const char *prefix, const char *fmt, va_list ap)
{
    struct buf raw, out;

    buf_init(&raw);
    buf_init(&out);
    buf_puts(&out, prefix);
    buf_vprintf(&raw, fmt, ap);
    str_escape(raw.p, raw.len, &out);
    buf_putc(&out, '\n');
    fwrite(out.p, 1, out.len, stdout);
    fflush(stdout);
    buf_free(&raw);
    buf_free(&out);
}

/* One line of esd run's own on stdout (the log goes to stderr). */
static void
say(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vline("esd run: ", fmt, ap);
    va_end(ap);
}

/* A line of the summary. */
static void
line(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vline("", fmt, ap);
    va_end(ap);
}

static char *
coord_path(const char *name)
{
    return fs_join(R.coord, name);
}

static double
mtime_of(const struct stat *st)
{
    return (double)st->st_mtim.tv_sec + (double)st->st_mtim.tv_nsec / 1e9;
}

/* Sleeps ms, or less when a signal comes. */
static void
nap(double secs)
{
    struct timespec ts = { (time_t)secs, (long)((secs - floor(secs)) * 1e9) };

    if (!stop_sig)
        nanosleep(&ts, NULL);
}

/* The file server's time: the mtime of <coord>/clock/<node>, just touched. */
static int
server_now(double *ret, struct esd_err *err)
{
    char *dir = coord_path("clock"), *path;
    struct stat st;
    int fd, r = 0;

    if (fs_mkdir_p(dir, 0755, err) < 0) {
        free(dir);
        return -1;
    }
    path = fs_join(dir, R.conf ? R.conf->node_name : R.node);
    free(dir);
    fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0644);
    if (fd < 0 || fs_touch_fd(fd) < 0 || fstat(fd, &st) < 0)
        r = err_sys(err, -errno, "cannot read the file server's time from %s", path);
    else
        *ret = mtime_of(&st);
    if (fd >= 0)
        close(fd);
    free(path);
    return r;
}

/* ---- results ---- */

/* Why the last result_read returned -1. */
static char result_error[ESD_ERR_MAX + 64];

/* The return_code of <coord>/name: 1 with *code (0..255; another number
 * reads as 2) and *obj if asked, 0 when there is none yet, -1 when it
 * cannot be read or has no integer return_code (result_error says why). */
static int
result_read(const char *name, long long *code, cJSON **obj)
{
    char *path = coord_path(name);
    cJSON *o = NULL;
    struct esd_err err;
    struct stat st;
    int r;

    if (lstat(path, &st) < 0) {
        free(path);
        return 0;
    }
    r = json_load_object(path, RESULT_MAX, &o, &err);
    if (r == 0 && json_get_int(o, "return_code", code) < 0)
        r = err_set(&err, -EINVAL, "%s has no integer return_code", path);
    free(path);
    if (r < 0) {
        snprintf(result_error, sizeof(result_error), "%s", err.msg);
        cJSON_Delete(o);
        return -1;
    }
    if (*code < 0 || *code > 255)
        *code = 2;
    if (obj)
        *obj = o;
    else
        cJSON_Delete(o);
    return 1;
}

/* The words a result gives for itself: its error or reason. */
static const char *
result_why(const cJSON *o)
{
    const char *s = json_get_str(o, "error");

    return s ? s : json_get_str(o, "reason");
}

/* Publishes <coord>/name once; a result already there stands (its code is
 * returned then). */
static long long
result_publish(const char *name, const char *phase, long long code, const char *why,
               const char *why_key)
{
    char *path = coord_path(name), now[40];
    cJSON *o = cJSON_CreateObject();
    struct esd_err err;
    long long theirs = code;
    char token[33];
    int r;

    time_iso_now(now, NULL);
    rand_hex32(token);
    json_add_str(o, "phase", phase);
    json_add_int(o, "return_code", code);
    json_add_str(o, "hostname", R.host);
    json_add_str(o, "node", R.conf->node_name);
    json_add_str(o, "finished_at", now);
    json_add_str(o, "token", token);
    json_add_str(o, "run_id", R.run_id);
    if (why)
        json_add_str(o, why_key, why);
    r = json_publish_excl(path, o, JSON_LINE, &err);
    cJSON_Delete(o);
    free(path);
    if (r == -EEXIST)
        result_read(name, &theirs, NULL);
    else if (r < 0)
        log_err(&R.ctx, "cannot publish %s: %s", name, err.msg);
    return theirs;
}

/* ---- elections ---- */

static void
elect_init(struct elect *e, const char *phase)
{
    char name[32];

    snprintf(name, sizeof(name), "%s.lock", phase);
    e->path = coord_path(name);
    e->phase = phase;
    e->held = false;
}

/* 1 elected, 0 another holds the lock, -1 an error (logged). */
static int
elect_try(struct elect *e)
{
    cJSON *o = cJSON_CreateObject();
    struct esd_err err;
    struct buf b;
    char now[40];
    int r;

    time_iso_now(now, NULL);
    rand_hex32(e->token);
    json_add_str(o, "created_at", now);
    json_add_str(o, "hostname", R.host);
    json_add_str(o, "phase", e->phase);
    json_add_int(o, "pid", (long long)getpid());
    json_add_str(o, "node", R.conf->node_name);
    json_add_str(o, "token", e->token);
    json_add_int(o, "lease_secs", R.conf->lease_secs);
    buf_init(&b);
    json_dump(o, JSON_LINE, &b);
    cJSON_Delete(o);
    r = fs_create_excl(e->path, b.p, b.len, 0644, NULL, &err);
    buf_free(&b);
    if (r == -EEXIST)
        return 0;
    if (r < 0) {
        log_err(&R.ctx, "%s", err.msg);
        return -1;
    }
    e->held = true;
    return 1;
}

/* Renews a held election: 0, or -ESTALE when it was taken over. */
static int
elect_beat(struct elect *e)
{
    struct esd_err err;

    if (!e->held)
        return 0;
    if (claim_lock_renew(e->path, e->token, &err) == -ESTALE) {
        log_warning(&R.ctx, "the %s election was taken over: %s", e->phase, err.msg);
        e->held = false;
        return -ESTALE;
    }
    return 0;
}

static void
elect_release(struct elect *e)
{
    if (!e->held)
        return;
    claim_lock_release(e->path, e->token);
    e->held = false;
}

/* The holder's lease: its lease_secs, or for a lock without one (the
 * reference's) the wait timeout. */
static double
holder_lease(const char *path, char *who, size_t whosz)
{
    cJSON *o = NULL;
    long long lease = 0, pid = 0;
    const char *h = NULL, *n = NULL;

    snprintf(who, whosz, "?");
    if (json_load_object(path, 4096, &o, NULL) < 0)
        return R.wait_timeout;
    json_get_int(o, "lease_secs", &lease);
    json_get_int(o, "pid", &pid);
    h = json_get_str(o, "hostname");
    n = json_get_str(o, "node");
    snprintf(who, whosz, "node %s (hostname %s, pid %lld)", n ? n : h ? h : "?", h ? h : "?", pid);
    cJSON_Delete(o);
    return lease > 0 ? (double)lease : R.wait_timeout;
}

/* A lost election: 1 when the lock is gone or was stale and is now moved
 * aside (hold the election again), 0 while its holder lives. */
static int
elect_judge(struct elect *e)
{
    struct esd_err err;
    struct stat st;
    char who[256];
    double now = 0, lease, age = 0;
    int r;

    if (lstat(e->path, &st) < 0)
        return errno == ENOENT;
    lease = holder_lease(e->path, who, sizeof(who));
    if (server_now(&now, &err) < 0 || now - mtime_of(&st) <= lease)
        return 0;
    if (!(r = claim_lock_move_stale(e->path, now, lease, &age)))
        return 0;
    if (r == 1) {
        log_warning(&R.ctx,
                    "%s: %s stopped renewing it %.0f s ago (lease %.0f s): taking the %s "
                    "over",
                    e->path, who, age, lease, e->phase);
        say("the %s coordinator, %s, stopped renewing %s: taking over", e->phase, who, e->path);
    }
    return 1;
}

/* ---- the submission: run id, launcher ranks ---- */

static const char *
env_nonempty(const char *name)
{
    const char *v = getenv(name);

    while (v && (*v == ' ' || *v == '\t'))
        v++;
    return v && *v ? v : NULL;
}

static char *
strip_dup(const char *s)
{
    size_t n;

    while (*s == ' ' || *s == '\t' || *s == '\n')
        s++;
    n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r'))
        n--;
    return xasprintf("%.*s", (int)n, s);
}

/* --run-id, else the scheduler's variables (first that is set). */
static int
resolve_run_id(struct esd_err *err)
{
    static const char *const plain[] = { "PAI_JOB_ID", "DLC_JOB_ID", "JOB_ID" };
    const char *v, *idx;

    if (R.run_id) {
        char *s = strip_dup(R.run_id);

        free(R.run_id);
        R.run_id = s;
        if (!*s)
            return err_set(err, -EINVAL, "--run-id is empty");
        R.run_id_from = "--run-id";
        return 0;
    }
    for (size_t i = 0; i < sizeof(plain) / sizeof(plain[0]); i++)
        if ((v = env_nonempty(plain[i]))) {
            R.run_id = strip_dup(v);
            R.run_id_from = plain[i];
            return 0;
        }
    if ((v = env_nonempty("SLURM_JOB_ID"))) {
        const char *a = env_nonempty("SLURM_ARRAY_JOB_ID"),
                   *t = env_nonempty("SLURM_ARRAY_TASK_ID");

        /* an array task: its array's id and its task id (as Slurm shows it) */
        R.run_id = t ? xasprintf("%s_%s", a ? a : v, t) : strip_dup(v);
        R.run_id_from =
            t ? (a ? "SLURM_ARRAY_JOB_ID_SLURM_ARRAY_TASK_ID" : "SLURM_JOB_ID_SLURM_ARRAY_TASK_ID")
              : "SLURM_JOB_ID";
        return 0;
    }
    if ((v = env_nonempty("TORCHELASTIC_RUN_ID"))) {
        if (!strcmp(v, "none"))
            return err_set(err, -EINVAL,
                           "TORCHELASTIC_RUN_ID is \"none\" (torchrun's default, "
                           "the same for every submission): give torchrun --rdzv-id, or esd "
                           "run --run-id");
        R.run_id = strip_dup(v);
        R.run_id_from = "TORCHELASTIC_RUN_ID";
        return 0;
    }
    /* a Kubernetes Indexed Job: its pods are named <job name>-<index> */
    if ((idx = env_nonempty("JOB_COMPLETION_INDEX"))) {
        size_t hl = strlen(R.host), il = strlen(idx);

        if (hl > il + 1 && !strcmp(R.host + hl - il, idx) && R.host[hl - il - 1] == '-') {
            R.run_id = xasprintf("%.*s", (int)(hl - il - 1), R.host);
            R.run_id_from = "the Kubernetes job name in the pod's host name";
            return 0;
        }
        return err_set(err, -EINVAL,
                       "no run id: JOB_COMPLETION_INDEX is %s, but the host "
                       "name \"%s\" is not <job name>-%s as an Indexed Job's pod's is: pass "
                       "--run-id",
                       idx, R.host, idx);
    }
    return err_set(err, -EINVAL,
                   "no run id: pass --run-id, or run under a scheduler that sets "
                   "one of PAI_JOB_ID, DLC_JOB_ID, JOB_ID, SLURM_JOB_ID, TORCHELASTIC_RUN_ID or "
                   "a Kubernetes Indexed Job's JOB_COMPLETION_INDEX; every node of one "
                   "submission must have the same, and each submission its own");
}

static int
env_num(const char *name, long long min, long long *ret, struct esd_err *err)
{
    const char *v = getenv(name);

    if (!v)
        return 0;
    if (parse_int(v, min, 1LL << 40, ret) < 0)
        return err_set(err, -EINVAL, "%s=%.64s is not a number of at least %lld", name, v, min);
    return 1;
}

/* torchrun, OpenMPI, Slurm, a Kubernetes Indexed Job. */
static int
resolve_launcher(struct esd_err *err)
{
    static const struct {
        const char *name, *size, *rank, *local, *local_size, *nodes;
    } kinds[] = {
        { "torchrun", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_WORLD_SIZE" },
        { "OpenMPI", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
          "OMPI_COMM_WORLD_LOCAL_SIZE", NULL },
        { "Slurm", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID", NULL, "SLURM_NNODES" },
    };
    long long v;
    int r;

    R.rank = R.local_rank = 0;
    R.world = 1;
    R.nnodes = 0;
    for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
        if (!getenv(kinds[i].size) || !getenv(kinds[i].rank) || !getenv(kinds[i].local))
            continue;
        R.launcher = kinds[i].name;
        if ((r = env_num(kinds[i].size, 1, &R.world, err)) < 0 ||
            (r = env_num(kinds[i].rank, 0, &R.rank, err)) < 0 ||
            (r = env_num(kinds[i].local, 0, &R.local_rank, err)) < 0)
            return r;
        if (R.rank >= R.world)
            return err_set(err, -EINVAL, "%s: rank %lld is not below the world size %lld",
                           R.launcher, R.rank, R.world);
        if (kinds[i].nodes && env_num(kinds[i].nodes, 1, &v, err) > 0)
            R.nnodes = v;
        else if (kinds[i].local_size && env_num(kinds[i].local_size, 1, &v, err) > 0 &&
                 R.world % v == 0)
            R.nnodes = R.world / v;
        return 0;
    }
    if (getenv("JOB_COMPLETION_INDEX")) {
        R.launcher = "Kubernetes Indexed Job";
        return env_num("JOB_COMPLETION_INDEX", 0, &R.rank, err) < 0 ? -EINVAL : 0;
    }
    return 0;
}

/* ranks/<rank>.json: one small file a rank, written once. */
static void
rank_register(bool worker)
{
    char *dir = coord_path("ranks"), name[48], *path, now[40];
    cJSON *o;
    struct esd_err err;

    if (!R.launcher || fs_mkdir_p(dir, 0755, &err) < 0) {
        free(dir);
        return;
    }
    snprintf(name, sizeof(name), "%lld.json", R.rank);
    path = fs_join(dir, name);
    time_iso_now(now, NULL);
    o = cJSON_CreateObject();
    json_add_int(o, "rank", R.rank);
    json_add_int(o, "local_rank", R.local_rank);
    json_add_int(o, "world_size", R.world);
    json_add_str(o, "launcher", R.launcher);
    json_add_str(o, "hostname", R.host);
    json_add_str(o, "node", R.node);
    json_add_int(o, "pid", (long long)getpid());
    json_add_str(o, "role", worker ? "worker" : "waiter");
    json_add_str(o, "at", now);
    if (json_write_atomic(path, o, JSON_LINE, &err) < 0)
        log_warning(&R.ctx, "%s", err.msg);
    cJSON_Delete(o);
    free(path);
    free(dir);
}

static bool
json_name(const char *name)
{
    size_t n = strlen(name);

    return n > 5 && !strcmp(name + n - 5, ".json");
}

/* Who took part, from the rank files (read here only, once): "8 rank(s) of
 * 8 on 2 node(s): a (ranks 0-3), b (4-7)", or "" without a launcher. */
static char *
ranks_summary(void)
{
    char *dir = coord_path("ranks");
    struct pypath_entries ents = { 0 };
    struct buf b;
    struct strv nodes;
    size_t n = 0;

    buf_init(&b);
    strv_init(&nodes);
    struct esd_err err;

    if (R.launcher && pypath_rglob(dir, json_name, &ents, &err) == 0) {
        for (size_t i = 0; i < ents.n; i++) {
            char *p = fs_join(dir, ents.v[i].rel);
            cJSON *o = NULL;

            if (json_load_object(p, 4096, &o, NULL) == 0) {
                const char *node = json_get_str(o, "node");
                const char *role = json_get_str(o, "role");

                n++;
                if (node && role && !strcmp(role, "worker") && !strv_contains(&nodes, node))
                    strv_push(&nodes, node);
            }
            cJSON_Delete(o);
            free(p);
        }
        buf_printf(&b, "%zu rank(s) of %lld arrived; %zu worked (one a node):", n, R.world,
                   nodes.n);
        for (size_t i = 0; i < nodes.n && i < 32; i++)
            buf_printf(&b, " %s", nodes.v[i]);
        if (nodes.n > 32)
            buf_printf(&b, " ...");
    }
    pypath_entries_free(&ents);
    strv_free(&nodes);
    free(dir);
    return buf_steal(&b);
}

/* ---- prepare (before the engine starts: a child prepares, this process
 * renews the election) ---- */

/* One progress event of the prepare, said at most every 10 s (and at its
 * end); takes ev. */
static void
prepare_progress(cJSON *ev)
{
    static double last;
    double done = 0, total = 0, now = time_mono();
    long long rows = 0;
    const char *phase = json_get_str(ev, "phase");

    json_get_num(ev, "bytes_done", &done);
    json_get_num(ev, "bytes_total", &total);
    json_get_int(ev, "rows", &rows);
    if (now - last >= 10.0 || (total > 0 && done >= total)) {
        last = now;
        say("prepare: %s %.1f of %.1f MiB, %lld records", phase ? phase : "?", done / 1048576.0,
            total / 1048576.0, rows);
    }
    cJSON_Delete(ev);
}

/* In the prepare child: the report pipe (its stdout is /dev/null). */
static int prepare_fd = -1;

/* In the prepare child: an event of op_run's, one {"event": ...} line. */
static void
prepare_event(void *ctx, cJSON *ev)
{
    cJSON *m = cJSON_CreateObject();
    struct buf b;

    (void)ctx;
    cJSON_AddItemToObject(m, "event", ev);
    buf_init(&b);
    json_dump(m, JSON_LINE, &b);
    /* (a parent that is gone: PR_SET_PDEATHSIG ends this process) */
    (void)helper_write(prepare_fd, b.p, b.len);
    buf_free(&b);
    cJSON_Delete(m);
}

static void __attribute__((noreturn)) prepare_child(int fd)
{
    cJSON *args = cJSON_CreateObject(), *res = NULL, *rep = cJSON_CreateObject();
    struct op_env env = { 0 };
    struct esd_err err = { 0 };
    struct buf b;
    int r;

    /* (helper_fork reset every signal: a stop here ends the prepare cleanly) */
    prepare_fd = fd;
    signal(SIGTERM, on_stop_sig);
    signal(SIGINT, on_stop_sig);
    /* Tests: a prepare that takes its time (to kill its coordinator); the
     * helper's tick cuts a nap short */
    if (getenv("ESD_TEST_PREPARE_DELAY_SECS")) {
        long long secs;

        if (parse_int(getenv("ESD_TEST_PREPARE_DELAY_SECS"), 1, 3600, &secs) == 0)
            for (double end = time_mono() + (double)secs; !stop_sig && time_mono() < end;)
                nap(end - time_mono());
    }
    json_add_str(args, "config", R.recipe);
    if (R.dataset)
        json_add_str(args, "dataset_path", R.dataset);
    json_add_str(args, "job_dir", R.job_dir);
    json_add_int(args, "num_shards", R.num_shards);
    if (R.max_retries >= 0)
        json_add_int(args, "max_retries", R.max_retries);
    if (R.lock_timeout > 0)
        json_add_int(args, "lock_timeout_secs", R.lock_timeout);
    if (R.ray_address)
        json_add_str(args, "ray_address", R.ray_address);
    if (R.dj_root)
        json_add_str(args, "data_juicer_root", R.dj_root);
    if (R.allow.n) {
        cJSON *a = cJSON_AddArrayToObject(args, "allow_op");

        for (size_t i = 0; i < R.allow.n; i++)
            cJSON_AddItemToArray(a, cJSON_CreateString(R.allow.v[i]));
    }
    if (R.deny.n) {
        cJSON *a = cJSON_AddArrayToObject(args, "deny_op");

        for (size_t i = 0; i < R.deny.n; i++)
            cJSON_AddItemToArray(a, cJSON_CreateString(R.deny.v[i]));
    }
    if (R.no_global_stage)
        json_add_bool(args, "no_global_stage", true);
    env.event = prepare_event;
    env.cancel = &stop_sig;
    env.processor = R.conf->processor.n ? (const char *const *)R.conf->processor.v : NULL;
    env.dj_root = R.conf->dj_root;
    env.threads = (unsigned)R.conf->threads;
    r = op_run(CMD_PREPARE, args, &env, &res, &err);
    json_add_bool(rep, "ok", r == 0);
    if (r < 0)
        json_add_str(rep, "error", err.msg);
    if (res)
        cJSON_AddItemToObject(rep, "result", res);
    buf_init(&b);
    json_dump(rep, JSON_LINE, &b);
    (void)helper_write(fd, b.p, b.len);
    _exit(r == 0 ? 0 : 2);
}

/* The prepare child's report so far: says its progress and drops its
 * ticks (empty lines); what stays in *in is its last line, the result,
 * once that has come. */
static void
prepare_report(struct buf *in)
{
    size_t pos = 0;

    while (pos < in->len) {
        char *nl = memchr(in->p + pos, '\n', in->len - pos);
        size_t len = nl ? (size_t)(nl - (in->p + pos)) : 0;
        cJSON *m = NULL, *ev = NULL;

        if (!nl)
            break;
        if (len && json_parse_object(in->p + pos, len, "prepare", &m, NULL) == 0)
            ev = cJSON_DetachItemFromObjectCaseSensitive(m, "event");
        cJSON_Delete(m);
        if (len && !ev)
            break;
        if (ev)
            prepare_progress(ev);
        pos += len + 1;
    }
    if (pos > 0) {
        memmove(in->p, in->p + pos, in->len - pos);
        in->len -= pos;
    }
}

/* The recipe's split from prepare's result, when it has a global stage
 * (esctl prepare's words). */
static void
say_split(const cJSON *res)
{
    const cJSON *ops = cJSON_GetObjectItemCaseSensitive(res, "global_operators"), *op;
    long long per = 0;
    struct buf b;

    if (!cJSON_IsArray(ops) || cJSON_GetArraySize(ops) == 0)
        return;
    json_get_int(res, "shard_operators", &per);
    buf_init(&b);
    cJSON_ArrayForEach(op, ops)
    {
        if (!cJSON_IsString(op))
            continue;
        if (b.len)
            buf_puts(&b, ", ");
        str_escape(op->valuestring, strlen(op->valuestring), &b);
    }
    say("prepare: %lld operator%s per shard, then %d once%s: %s", per, per == 1 ? "" : "s",
        cJSON_GetArraySize(ops), per == 0 ? " (the whole recipe, unsharded)" : "", b.p ? b.p : "");
    buf_free(&b);
}

/* Runs the prepare in a child while renewing the election: the code, with
 * *why set on failure. */
static int
prepare_run_here(struct elect *e, char **why)
{
    int fd, status = 0;
    struct buf out;
    struct esd_err err;
    pid_t pid;
    double beat = (double)R.conf->lease_secs / 4.0, next = time_mono() + beat;
    bool eof = false;
    cJSON *o = NULL;

    *why = NULL;
    fflush(NULL);
    /* the helper's one set-up, as the daemon's children have it (its own
     * group, nothing of this process's open but the report pipe, signals
     * reset, dead with this process); the identity is already the job
     * owner's (become_owner) */
    if ((pid = helper_fork("prepare", NULL, &fd, &err)) < 0) {
        *why = xstrdup(err.msg);
        return EXIT_FAILED;
    }
    if (pid == 0)
        prepare_child(fd);
    buf_init(&out);
    while (!eof) {
        struct pollfd p = { fd, POLLIN, 0 };
        double left = next - time_mono();
        int n;

        if (stop_sig) {
            kill(pid, SIGTERM);
            stop_sig = 0; /* told once; the child stops cleanly */
        }
        n = poll(&p, 1, left > 0 ? (int)(left * 1000) + 1 : 0);
        if (n > 0) {
            char chunk[4096];
            ssize_t k = read(fd, chunk, sizeof(chunk));

            if (k > 0) {
                buf_append(&out, chunk, (size_t)k);
                prepare_report(&out);
            } else if (k == 0 || (errno != EINTR && errno != EAGAIN)) {
                eof = true;
            }
        }
        if (time_mono() >= next) {
            elect_beat(e);
            next = time_mono() + beat;
        }
    }
    close(fd);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (out.len && json_parse_object(out.p, out.len, "prepare", &o, NULL) == 0) {
        bool ok = false;
        cJSON *res = cJSON_GetObjectItemCaseSensitive(o, "result");
        long long n = 0, rows = 0;
        bool unchanged = false;

        json_get_bool(o, "ok", &ok);
        if (!ok) {
            *why = xstrdup(json_get_str(o, "error") ? json_get_str(o, "error") : "prepare failed");
        } else if (res) {
            json_get_int(res, "num_shards", &n);
            json_get_int(res, "rows", &rows);
            json_get_bool(res, "unchanged", &unchanged);
            if (unchanged)
                say("prepare: %s was already prepared with this request (%lld shards): "
                    "nothing to do",
                    R.job_dir, n);
            else
                say("prepare: %lld records into %lld shards in %s", rows, n, R.job_dir);
            say_split(res);
            cJSON *w = cJSON_GetObjectItemCaseSensitive(res, "warnings");
            cJSON *it;

            cJSON_ArrayForEach(it, w) if (cJSON_IsString(it))
                say("prepare: warning: %s", it->valuestring);
        }
        cJSON_Delete(o);
    } else if (!*why) {
        *why = WIFSIGNALED(status)
                   ? xasprintf("the prepare was killed by signal %d", WTERMSIG(status))
                   : xstrdup("the prepare ended without a result");
    }
    buf_free(&out);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && !*why)
        return EXIT_OK;
    if (!*why)
        *why = xstrdup("prepare failed");
    return EXIT_FAILED;
}

/* The prepare phase, as dlc_job.py's (spec §13.3) with leases: the code
 * the prepare of this run ended with. */
static int
prepare_phase(void)
{
    struct elect e;
    char *manifest = fs_join(R.job_dir, "manifest.json");
    struct stat st;
    bool had_manifest = stat(manifest, &st) == 0;
    double start = time_mono(), poll = R.poll;
    long long code;
    cJSON *o = NULL;
    bool said = false;
    int r;

    elect_init(&e, "prepare");
    for (;;) {
        if (stop_sig)
            break;
        if ((r = result_read("prepare-result.json", &code, &o)) < 0) {
            say("the prepare's result cannot be read: %s", result_error);
            free(manifest);
            free(e.path);
            return EXIT_FAILED;
        }
        if (r == 1) {
            if (code != 0)
                say("the prepare of this run failed (return code %lld): %s", code,
                    result_why(o) ? result_why(o) : "no error recorded");
            cJSON_Delete(o);
            free(manifest);
            free(e.path);
            return (int)code;
        }
        if (!R.recipe) {
            /* nothing to prepare: the job must be (or become) prepared */
            if (stat(manifest, &st) == 0) {
                free(manifest);
                free(e.path);
                return EXIT_OK;
            }
            if (!said)
                say("%s is not prepared and this node has no --config: waiting for the node "
                    "that prepares it (at most %.0f s)",
                    R.job_dir, R.wait_timeout);
            said = true;
        } else if ((r = elect_try(&e)) == 1) {
            char *why = NULL;
            bool existed = stat(manifest, &st) == 0;

            say("hostname=%s node=%s elected as prepare coordinator", R.host, R.conf->node_name);
            code = prepare_run_here(&e, &why);
            if (code != 0 && !stop_sig && !existed && stat(manifest, &st) == 0) {
                /* a coordinator this node took over from (frozen past its
                 * lease) published the job while this one prepared: this
                 * prepare lost the rename; prepared again, it is a check */
                say("prepare: %s appeared meanwhile (%s): preparing again, which checks it",
                    R.job_dir, why ? why : "?");
                free(why);
                why = NULL;
                code = prepare_run_here(&e, &why);
            }
            if (stop_sig) {
                elect_release(&e);
                free(why);
                break;
            }
            if (!e.held || elect_beat(&e) == -ESTALE) {
                /* frozen past its lease, taken over: the new coordinator's
                 * result is the run's, not this one */
                say("this node's prepare election was taken over while it prepared: waiting "
                    "for the result of the node that took it");
                free(why);
                nap(poll);
                continue;
            }
            code = result_publish("prepare-result.json", "prepare", code, why, "error");
            if (code != 0)
                say("prepare failed: %s", why ? why : "see above");
            free(why);
            free(manifest);
            free(e.path);
            return (int)code;
        } else if (r == 0) {
            if (!had_manifest && stat(manifest, &st) == 0) {
                /* the reference's rule: a manifest that appeared is a
                 * prepared job (esd's prepare renames it in whole) */
                free(manifest);
                free(e.path);
                return EXIT_OK;
            }
            if (elect_judge(&e) == 1)
                continue; /* gone or stale: elect again at once */
        }
        if (time_mono() - start > R.wait_timeout) {
            say("timed out after %.0f s waiting for the prepare of %s (%s)", R.wait_timeout,
                R.job_dir, R.recipe ? e.path : "it is not prepared, and no --config was given");
            free(manifest);
            free(e.path);
            return EXIT_FAILED;
        }
        nap(poll);
    }
    free(manifest);
    free(e.path);
    return EXIT_SIGTERM;
}

/* ---- the worker of a host, watched by the other ranks there ---- */

#define WAIT_TAKEOVER (-1) /* wait_for_result: this host's worker died */

static void
boot_id(char out[64])
{
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");

    if (!f || !fgets(out, 64, f))
        snprintf(out, 64, "unknown");
    out[strcspn(out, "\n")] = '\0';
    if (f)
        fclose(f);
}

static char *
host_path(void)
{
    char name[96];

    snprintf(name, sizeof(name), "hosts/%s.json", R.conf->node_name);
    return coord_path(name);
}

/* hosts/<node>.json: this host's worker (pid, boot), for its waiters. */
static void
host_register(void)
{
    char *dir = coord_path("hosts"), *path = host_path(), boot[64];
    cJSON *o = cJSON_CreateObject();
    struct esd_err err;

    boot_id(boot);
    json_add_int(o, "pid", (long long)getpid());
    json_add_str(o, "boot_id", boot);
    json_add_int(o, "rank", R.rank);
    json_add_str(o, "hostname", R.host);
    if (fs_mkdir_p(dir, 0755, &err) < 0 || json_write_atomic(path, o, JSON_LINE, &err) < 0)
        log_warning(&R.ctx, "%s", err.msg);
    cJSON_Delete(o);
    free(dir);
    free(path);
}

/* The pid of this host's worker if this waiter saw it alive and it has
 * died since (0 otherwise: alive, unknown, another machine's, or a worker
 * of an earlier process never seen alive, whose file the new worker has
 * not replaced yet). */
static long long
host_worker_dead(void)
{
    static long long seen_alive;
    char *path = host_path(), boot[64];
    cJSON *o = NULL;
    long long pid = 0, dead = 0;
    const char *b;

    if (json_load_object(path, 4096, &o, NULL) == 0 && json_get_int(o, "pid", &pid) == 0 &&
        (b = json_get_str(o, "boot_id"))) {
        boot_id(boot);
        if (!strcmp(b, boot) && pid > 0 && pid != (long long)getpid()) {
            if (kill((pid_t)pid, 0) == 0 || errno != ESRCH)
                seen_alive = pid;
            else if (pid == seen_alive)
                dead = pid;
        }
    }
    cJSON_Delete(o);
    free(path);
    return dead;
}

/* ---- a rank that does not work: it waits for the run's result ---- */

static int
terminal_code(long long *code, char **why)
{
    static const char *const names[] = { "finalize-result.json", "abort.json" };

    for (size_t i = 0; i < 2; i++) {
        cJSON *o = NULL;
        int r = result_read(names[i], code, &o);

        if (r < 0) {
            /* a result nobody can read ends the run as failed, saying so */
            *code = EXIT_FAILED;
            if (why)
                *why = xasprintf("the run's result cannot be read: %s", result_error);
            return 1;
        }
        if (r == 1) {
            if (why)
                *why = result_why(o) ? xstrdup(result_why(o)) : NULL;
            cJSON_Delete(o);
            return 1;
        }
    }
    return 0;
}

static int
wait_for_result(void)
{
    double start = time_mono();
    long long code, dead;
    char *why = NULL;
    bool prepared = false;

    host_worker_dead(); /* (notes this host's worker as alive: before the line below) */
    say("rank %lld (local rank %lld) of %s waits: the lowest local rank of this host works", R.rank,
        R.local_rank, R.launcher);
    while (!stop_sig) {
        if (!prepared) {
            cJSON *o = NULL;
            int r = result_read("prepare-result.json", &code, &o);

            if (r < 0) {
                say("the prepare's result cannot be read: %s", result_error);
                return EXIT_FAILED;
            }
            if (r == 1) {
                prepared = true;
                if (code != 0) {
                    say("the prepare failed (return code %lld): %s", code,
                        result_why(o) ? result_why(o) : "no error recorded");
                    cJSON_Delete(o);
                    return (int)code;
                }
                start = time_mono();
            }
            cJSON_Delete(o);
        }
        if (terminal_code(&code, &why)) {
            say("the run ended with code %lld%s%s", code, why ? ": " : "", why ? why : "");
            free(why);
            return (int)code;
        }
        if (R.deadline > 0 && time_wall() >= R.deadline) {
            say("the allocation's walltime (%s) is over before the end of the run",
                R.deadline_from);
            return EXIT_INCOMPLETE;
        }
        if ((dead = host_worker_dead()) > 0) {
            /* the lowest local rank left works in its place: the first
             * waiter to create this name */
            char name[128], *gone;
            struct esd_err err;
            int r;

            snprintf(name, sizeof(name), "hosts/%s.%lld.gone", R.conf->node_name, dead);
            gone = coord_path(name);
            r = fs_create_excl(gone, "", 0, 0644, NULL, &err);
            free(gone);
            if (r == 0) {
                say("this host's worker (pid %lld) died before the end of the run: rank %lld "
                    "works in its place",
                    dead, R.rank);
                return WAIT_TAKEOVER;
            }
        }
        if (time_mono() - start > 2 * R.wait_timeout) {
            say("timed out after %.0f s waiting for the end of the run", 2 * R.wait_timeout);
            return EXIT_FAILED;
        }
        nap(R.poll);
    }
    return EXIT_SIGTERM;
}

/* ---- the work: the daemon's engine on this one job ---- */

/* Whether the mtime of <job_dir>/sub differs from *seen (updated). */
static bool
dir_changed(const char *job_dir, const char *sub, struct timespec *seen)
{
    char *path = fs_join(job_dir, sub);
    struct stat st;
    bool changed = false;

    if (stat(path, &st) == 0 &&
        (st.st_mtim.tv_sec != seen->tv_sec || st.st_mtim.tv_nsec != seen->tv_nsec)) {
        *seen = st.st_mtim;
        changed = true;
    }
    free(path);
    return changed;
}

/* The records in <job_dir>/sub (names *.json not starting with a dot). */
static size_t
count_records(const char *job_dir, const char *sub)
{
    char *path = fs_join(job_dir, sub);
    DIR *d = opendir(path);
    struct dirent *de;
    size_t n = 0;

    while (d && (de = readdir(d)))
        if (de->d_name[0] != '.' && json_name(de->d_name))
            n++;
    if (d)
        closedir(d);
    free(path);
    return n;
}

/* The names of the nodes that completed shards of j (esd's node name,
 * else the reference's host name): how many, and a list for messages. */
static size_t
done_nodes(struct job *j, struct strv *names, size_t *ret_done, size_t *ret_failed,
           struct strv *failed)
{
    struct job_status st;
    struct esd_err err;

    *ret_done = *ret_failed = 0;
    if (status_compute(&j->m, 0, true, &st, &err) < 0) {
        log_warning(&R.ctx, "%s", err.msg);
        return 0;
    }
    for (size_t i = 0; i < st.total; i++) {
        const struct shard_status *s = &st.shards[i];
        const char *who = s->node ? s->node : s->owner;

        if (s->state == ST_DONE) {
            (*ret_done)++;
            if (who && names && !strv_contains(names, who))
                strv_push(names, who);
        } else if (s->state == ST_FAILED) {
            (*ret_failed)++;
            if (failed)
                strv_push_owned(failed, xasprintf("%s: %s", j->m.shards[i].id,
                                                  s->error ? s->error : "no error recorded"));
        }
    }
    status_free(&st);
    return names ? names->n : 0;
}

static void finish(int code, const char *reason);

/* "shard X failed: ERROR" of the first failed shard of j (as the daemon
 * says it), or how many failed. */
static char *
failed_why(struct job *j)
{
    struct strv failed;
    size_t done, nfailed;
    char *why;

    strv_init(&failed);
    done_nodes(j, NULL, &done, &nfailed, &failed);
    why = failed.n ? xasprintf("%zu shard(s) failed; shard %s", nfailed, failed.v[0])
                   : xstrdup("a shard failed");
    strv_free(&failed);
    return why;
}

/* Publishes the abort of this run (the first stands) and ends with its code. */
static void
abort_run(long long code, const char *reason)
{
    char *lock = coord_path("abort.lock");
    struct esd_err err;
    char *line = xasprintf("{\"hostname\": \"%s\", \"phase\": \"abort\", \"pid\": %d}\n", R.host,
                           (int)getpid());

    /* the reference's election file, so that its nodes publish no other */
    if (fs_create_excl(lock, line, strlen(line), 0644, NULL, &err) < 0 && err.code != -EEXIST)
        log_warning(&R.ctx, "%s", err.msg);
    free(line);
    free(lock);
    code = result_publish("abort.json", "worker", code, reason, "reason");
    finish((int)code, reason);
}

/* Strict mode: at least --nodes distinct nodes completed shards. */
static bool
strict_ok(struct job *j)
{
    struct strv names;
    struct buf b;
    size_t done, failed, n;
    char *ranks;

    if (!R.strict)
        return true;
    strv_init(&names);
    n = done_nodes(j, &names, &done, &failed, NULL);
    if ((long long)n >= R.nodes) {
        say("strict: %zu shards were completed by %zu node(s), as --nodes %lld requires", done, n,
            R.nodes);
        strv_free(&names);
        return true;
    }
    buf_init(&b);
    buf_printf(&b,
               "strict mode (--require-all-nodes): the shards were completed by %zu node(s) "
               "(",
               n);
    for (size_t i = 0; i < names.n; i++)
        buf_printf(&b, "%s%s", i ? ", " : "", names.v[i]);
    buf_printf(&b, "), not the %lld --nodes requires: %lld node(s) missing", R.nodes,
               R.nodes - (long long)n);
    ranks = ranks_summary();
    if (*ranks)
        buf_printf(&b, "; %s", ranks);
    free(ranks);
    abort_run(EXIT_FAILED, b.p);
    buf_free(&b);
    strv_free(&names);
    return false;
}

static void
phase_set(enum phase p)
{
    R.phase = p;
    R.phase_at = time_mono();
}

/* Every shard is done: the finalize election of the run. */
static void
end_begin(struct job *j)
{
    int r;

    if (R.stopping)
        return;
    if ((r = elect_try(&R.fin)) == 1) {
        say("hostname=%s node=%s elected as finalize coordinator", R.host, R.conf->node_name);
        if (!strict_ok(j))
            return;
        phase_set(P_MERGING);
        ev_timer_again(R.loop, &R.beat_w);
        finalize_start(j); /* the merge, fenced against every esd of the job */
    } else if (r == 0) {
        if (R.phase != P_WAITING)
            say("every shard is done; another node finalizes");
        phase_set(P_WAITING);
    }
}

/* sched's hook: a pass found every shard done. */
static bool
on_complete(struct job *j)
{
    if (j != R.job)
        return false;
    /* (the job stays active here: no pass again before a poll) */
    j->next_claim = time_mono() + (double)R.conf->poll_interval_secs;
    if (R.phase == P_WORK)
        end_begin(j);
    else if (R.phase == P_MERGING && R.fin.held)
        finalize_start(j); /* a merge that failed for a transient cause: again */
    return true;
}

/* The estimated seconds of a shard here: this node's mean, else the fleet's. */
static double
shard_estimate(struct job *j)
{
    const struct status_view *v;

    if (j->proc_avg > 0)
        return j->proc_avg;
    if ((v = jobview_get(j)) && v->dur_n)
        return v->dur_sum / (double)v->dur_n;
    return 0;
}

/* sched's hook: the strict cap and the walltime. */
static bool
may_claim(struct job *j)
{
    if (j != R.job || R.stopping)
        return false;
    if (j->gstage) {
        /* A whole recipe's global stage: run by the finalize coordinator
         * after its merge of the shards, or, in a run that finds the
         * shards merged already, by whichever node claims it first (its
         * lock decides, as a shard's does); past the walltime it is not
         * begun. */
        if (R.phase == P_WAITING || (R.phase == P_MERGING && !R.fin.held))
            return false;
        return !(R.deadline > 0 && time_wall() + DEADLINE_SLACK >= R.deadline);
    }
    if (R.phase != P_WORK)
        return false;
    if (R.cap && (long long)(j->done_here + j->running) >= R.cap) {
        if (!R.said_cap)
            say("strict: this node has its share of %lld shard(s) done or running; it claims "
                "no more",
                R.cap);
        R.said_cap = true;
        return false;
    }
    if (R.deadline > 0) {
        double est = shard_estimate(j), now = time_wall();

        if (now + DEADLINE_SLACK >= R.deadline ||
            (est > 0 && now + est * DEADLINE_FACTOR + DEADLINE_SLACK > R.deadline)) {
            if (!R.said_deadline)
                say("walltime: %.0f s are left before the end of the allocation (%s); a shard "
                    "takes about %.0f s here, %.0f s with the margin (x%.2f + %.0f s): this node "
                    "claims no more",
                    R.deadline - now, R.deadline_from, est, est * DEADLINE_FACTOR + DEADLINE_SLACK,
                    DEADLINE_FACTOR, DEADLINE_SLACK);
            R.said_deadline = true;
            return false;
        }
    }
    return true;
}

static void
beat_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    (void)loop;
    (void)revents;
    if (!R.fin.held) {
        ev_timer_stop(R.loop, w);
        return;
    }
    if (elect_beat(&R.fin) == -ESTALE) {
        /* frozen past its lease: the node elected after it finalizes */
        ev_timer_stop(R.loop, w);
        finalize_stop_all();
        phase_set(P_WAITING);
    }
}

static void
tick_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct job *j = R.job;
    long long code;
    char *why = NULL;

    (void)loop;
    (void)w;
    (void)revents;
    if (R.stopping)
        return;
    if (terminal_code(&code, &why)) {
        finish((int)code, why);
        free(why);
        return;
    }
    switch (j->state) {
    case JOB_COMPLETE:
        code = result_publish("finalize-result.json", "finalize", EXIT_OK, NULL, "error");
        finish((int)code, NULL);
        return;
    case JOB_FAILED:
        if (R.phase == P_MERGING) {
            code =
                result_publish("finalize-result.json", "finalize", EXIT_FAILED, j->error, "error");
            finish((int)code, j->error);
        } else {
            abort_run(EXIT_FAILED, j->error ? j->error : "a shard failed");
        }
        return;
    case JOB_CANCELLED:
        abort_run(EXIT_FAILED, j->error ? j->error : "the job was cancelled");
        return;
    default:
        break;
    }
    if (R.phase == P_WAITING && elect_judge(&R.fin) == 1) {
        phase_set(P_WORK);
        end_begin(j);
        return;
    }
    if (R.phase == P_WORK && j->loaded && !j->gstage) {
        /* The end of the job, also while this node makes no claim passes
         * that would see it (capped, past its walltime, paused after
         * failures): the records are counted when a failed one appeared,
         * and when a done one did while some failed or this node makes
         * no passes. */
        bool passes = may_claim(j) && j->paused_until <= time_mono();
        bool failed_new = dir_changed(j->job_dir, "state/failed", &R.failed_seen);
        bool done_new = dir_changed(j->job_dir, "state/done", &R.done_seen);

        if (failed_new || (done_new && (R.nfailed || !passes))) {
            size_t nd = count_records(j->job_dir, "state/done");

            R.nfailed = count_records(j->job_dir, "state/failed");
            if (R.nfailed && nd + R.nfailed >= j->m.nshards) {
                char *fwhy = failed_why(j);

                abort_run(EXIT_FAILED, fwhy);
                free(fwhy);
            } else if (nd >= j->m.nshards && !passes) {
                end_begin(j);
            }
        }
        if (R.stopping)
            return;
    }
    if (R.phase == P_WORK) {
        /* progress: the work's wait timeout counts from the last shard done
         * anywhere (a new record changes state/done), loaded here or not */
        char *done_dir = fs_join(j->job_dir, "state/done");
        struct stat st;

        if (stat(done_dir, &st) == 0 && (st.st_mtim.tv_sec != R.done_mtime.tv_sec ||
                                         st.st_mtim.tv_nsec != R.done_mtime.tv_nsec)) {
            R.done_mtime = st.st_mtim;
            R.phase_at = time_mono();
        }
        free(done_dir);
    }
    if (R.deadline > 0 && time_wall() >= R.deadline) {
        finish(EXIT_INCOMPLETE, "the allocation's walltime is over; the job is not finished "
                                "(submit it again: what is done is kept)");
        return;
    }
    if (time_mono() - R.phase_at > R.wait_timeout) {
        struct buf b;
        size_t done = 0, failed = 0;

        buf_init(&b);
        if (j->loaded)
            done_nodes(j, NULL, &done, &failed, NULL);
        buf_printf(&b, "timed out: %.0f s %s (%zu/%zu done)", R.wait_timeout,
                   R.phase == P_WORK ? "without a shard done" : "waiting for the finalize", done,
                   j->m.nshards);
        if (R.strict && R.phase == P_WORK) {
            struct strv names;

            strv_init(&names);
            done_nodes(j, &names, &done, &failed, NULL);
            buf_printf(&b, "; strict mode: %zu of %lld node(s) completed shards (", names.n,
                       R.nodes);
            for (size_t i = 0; i < names.n; i++)
                buf_printf(&b, "%s%s", i ? ", " : "", names.v[i]);
            buf_printf(&b, "), each at most %lld; %zu shard(s) left for the missing node(s)", R.cap,
                       j->m.nshards - done - failed);
            strv_free(&names);
        }
        char *ranks = ranks_summary();

        if (*ranks)
            buf_printf(&b, "; %s", ranks);
        free(ranks);
        abort_run(EXIT_FAILED, b.p);
        buf_free(&b);
    }
}

/* The end of this node's run: the code, the summary, then the engine
 * stops (attempts stopped now, claims released). */
static void
finish(int code, const char *reason)
{
    if (R.stopping)
        return;
    R.stopping = true;
    R.code = code;
    R.reason = reason ? xstrdup(reason) : NULL;
    ev_timer_stop(R.loop, &R.tick_w);
    if (code == EXIT_SIGTERM || code == EXIT_INCOMPLETE)
        elect_release(&R.fin); /* no result of ours: the others elect at once */
    ev_timer_stop(R.loop, &R.beat_w);
    engine_drain();
}

static void
stop_cb(struct ev_loop *loop, ev_signal *w, int revents)
{
    (void)loop;
    (void)revents;
    if (R.stopping) {
        engine_stop_now();
        return;
    }
    log_notice(&R.ctx,
               "signal %d: stopping; running attempts are stopped and their claims "
               "released without counting a failure",
               w->signum);
    finish(EXIT_SIGTERM, "stopped by a signal before the job ended");
}

/* Up to this many shards the summary reads the records themselves; above,
 * it counts from the job's view (one poll old at most). */
#define SUMMARY_EXACT_SHARDS 20000

/* " node=count ..." of the nodes that completed shards of j; their number. */
static size_t
owners(struct job *j, struct buf *out)
{
    const struct status_view *v = jobview_get(j);
    struct job_status st;
    struct esd_err err;
    struct strv names;
    size_t *counts = NULL, n = 0;

    if (j->m.nshards > SUMMARY_EXACT_SHARDS && v && v->valid) {
        for (size_t i = 0; i < v->nnodes; i++)
            if (v->nodes[i].done && n++ < 64)
                buf_printf(out, " %s=%zu", v->nodes[i].name, v->nodes[i].done);
        return n;
    }
    if (status_compute(&j->m, 0, true, &st, &err) < 0)
        return 0;
    strv_init(&names);
    counts = xcalloc(st.total + 1, sizeof(*counts));
    for (size_t i = 0; i < st.total; i++) {
        const struct shard_status *s = &st.shards[i];
        const char *who = s->node ? s->node : s->owner ? s->owner : "?";
        size_t k = 0;

        if (s->state != ST_DONE)
            continue;
        while (k < names.n && strcmp(names.v[k], who))
            k++;
        if (k == names.n)
            strv_push(&names, who);
        counts[k]++;
    }
    /* by name: the same line on every node */
    for (size_t a = 1; a < names.n; a++)
        for (size_t b = a; b > 0 && strcmp(names.v[b - 1], names.v[b]) > 0; b--) {
            char *t = names.v[b - 1];
            size_t c = counts[b - 1];

            names.v[b - 1] = names.v[b];
            names.v[b] = t;
            counts[b - 1] = counts[b];
            counts[b] = c;
        }
    for (size_t k = 0; k < names.n && k < 64; k++)
        buf_printf(out, " %s=%zu", names.v[k], counts[k]);
    n = names.n;
    free(counts);
    strv_free(&names);
    status_free(&st);
    return n;
}

/* What every node prints last: the result, then who completed how many
 * shards. */
static void
summary(void)
{
    struct job *j = R.job;
    struct strv failed;
    size_t nodes = 0, done = 0, nfailed = 0;
    struct buf b;

    strv_init(&failed);
    buf_init(&b);
    if (j && j->loaded) {
        nodes = owners(j, &b);
        if (R.code == EXIT_FAILED)
            done_nodes(j, NULL, &done, &nfailed, &failed);
    }
    if (R.code == EXIT_OK) {
        char *res = fs_join(j->job_dir, "state/esd/finalize.json");
        cJSON *o = NULL;
        long long rows = -1;

        if (json_load_object(res, RESULT_MAX, &o, NULL) == 0)
            json_get_int(o, "rows", &rows);
        cJSON_Delete(o);
        free(res);
        line("PASS: %zu shards were completed by %zu node(s); merged %lld rows into %s",
             j->m.nshards, nodes, rows, j->output);
    } else if (R.code == EXIT_FAILED) {
        line("FAILED: %s", R.reason ? R.reason : "the run failed");
        for (size_t i = 0; i < failed.n && i < 100; i++)
            line("  failed shard %s", failed.v[i]);
        if (failed.n > 100)
            line("  ... and %zu more failed shards (esctl status --all)", failed.n - 100);
    } else {
        line("STOPPED (exit %d): %s", R.code, R.reason ? R.reason : "");
    }
    if (nodes)
        line("Shard owners:%s%s", b.p, nodes > 64 ? " ..." : "");
    buf_free(&b);
    strv_free(&failed);
}

/* ---- the command line ---- */

static void
usage(FILE *f)
{
    fprintf(f,
            "usage: esd run --job-dir DIR [--config RECIPE --num-shards N [--dataset-path PATH]]\n"
            "               [OPTION...]\n"
            "The same command on every node of a scheduler's job: one node prepares, every\n"
            "node works, one node merges, every node exits with the run's code (0 merged,\n"
            "2 failed, 1 walltime over, 143 stopped by a signal). See esd(8), ONE-SHOT MODE.\n"
            "  --job-dir DIR             the job directory on the shared file system\n"
            "  --config RECIPE           Data-Juicer recipe to prepare the job from\n"
            "  --dataset-path PATH       JSONL file or directory (overrides the recipe's)\n"
            "  --num-shards N            shards to prepare (default 4 with --config)\n"
            "  --max-retries N, --lock-timeout-secs N, --data-juicer-root DIR,\n"
            "  --allow-op NAME, --deny-op NAME, --no-global-stage   as esctl prepare\n"
            "  --output PATH             merged output, inside the job directory\n"
            "                            (default DIR/merged.jsonl)\n"
            "  --run-id ID               the submission (default: PAI_JOB_ID, DLC_JOB_ID,\n"
            "                            JOB_ID, SLURM_JOB_ID, TORCHELASTIC_RUN_ID, or a\n"
            "                            Kubernetes Indexed Job's name)\n"
            "  --nodes N                 nodes expected (informational unless strict)\n"
            "  --require-all-nodes       strict: each node at most ceil(shards/N) shards, and\n"
            "                            N nodes must have completed shards before the merge\n"
            "  --wait-timeout-secs S     longest wait for the prepare, the finalize, or a\n"
            "                            shard done (default 126000)\n"
            "  --poll-interval-secs S    coordination poll (default 2)\n"
            "  --deadline TIME           claim nothing that cannot end before TIME (epoch\n"
            "                            seconds or YYYY-MM-DDTHH:MM:SS[Z]; default under\n"
            "                            Slurm: SLURM_JOB_END_TIME, else squeue's %%e)\n"
            "  --node NAME               this node's name (default: the host name)\n"
            "  --slots N                 attempts at once on this node\n"
            "  --threads N               threads of the prepare and the merge (default: the\n"
            "                            CPUs available)\n"
            "  --lease-secs N            lease of claims and elections (default 60)\n"
            "  --attempt-timeout-secs N  stop an attempt after N s\n"
            "  --processor CMD           Data-Juicer's process_data (default dj-process)\n"
            "  --ray-mode MODE           persistent (default), per-attempt or off\n"
            "  --ray-address local       the reference's: every attempt starts its own Ray\n"
            "  --ray-command CMD         the ray command of the head (default: the ray next\n"
            "                            to --processor, else ray on PATH)\n"
            "  --state-dir DIR           this node's state (default a private directory under\n"
            "                            $XDG_RUNTIME_DIR or /tmp)\n"
            "  --esd-config FILE         esd.yaml to read the other settings from\n"
            "  --explain                 print what this process would be (run id, rank, role,\n"
            "                            coordination directory) and exit\n");
}

enum {
    OPT_JOB_DIR = 256,
    OPT_CONFIG,
    OPT_DATASET,
    OPT_NUM_SHARDS,
    OPT_OUTPUT,
    OPT_RUN_ID,
    OPT_NODES,
    OPT_STRICT,
    OPT_WAIT,
    OPT_POLL,
    OPT_DEADLINE,
    OPT_NODE,
    OPT_SLOTS,
    OPT_THREADS,
    OPT_LEASE,
    OPT_RETRIES,
    OPT_LOCK_TIMEOUT,
    OPT_ATTEMPT_TIMEOUT,
    OPT_PROCESSOR,
    OPT_DJ_ROOT,
    OPT_RAY_MODE,
    OPT_RAY_ADDRESS,
    OPT_RAY_COMMAND,
    OPT_STATE_DIR,
    OPT_ESD_CONFIG,
    OPT_ALLOW,
    OPT_DENY,
    OPT_NO_GLOBAL,
    OPT_EXPLAIN,
    OPT_HELP,
};

static bool explain;

static int
num_opt(const char *name, const char *v, long long min, long long *ret)
{
    if (parse_int(v, min, 1LL << 40, ret) < 0) {
        fprintf(stderr, "esd run: %s needs a whole number of at least %lld, got '%.64s'\n", name,
                min, v);
        return -1;
    }
    return 0;
}

static int
secs_opt(const char *name, const char *v, double *ret)
{
    char *end;
    double d;

    errno = 0;
    d = strtod(v, &end);
    if (errno || end == v || *end || !(d > 0) || !isfinite(d)) {
        fprintf(stderr, "esd run: %s needs a positive number of seconds, got '%.64s'\n", name, v);
        return -1;
    }
    *ret = d;
    return 0;
}

/* Epoch seconds, or YYYY-MM-DDTHH:MM:SS (local time; UTC with Z), as
 * squeue -o %e prints the end of a job. */
static int
parse_deadline(const char *v, double *ret)
{
    struct tm tm = { 0 };
    long long n;
    const char *end;

    if (parse_int(v, 1, 1LL << 40, &n) == 0) {
        *ret = (double)n;
        return 0;
    }
    end = strptime(v, "%Y-%m-%dT%H:%M:%S", &tm);
    if (!end || (*end && strcmp(end, "Z")))
        return -1;
    tm.tm_isdst = -1;
    *ret = (double)(*end == 'Z' ? timegm(&tm) : mktime(&tm));
    return 0;
}

/* Slurm before 23.02 sets no SLURM_JOB_END_TIME: the end of the
 * allocation as squeue prints it (%e), when it answers within 10 s. */
static void
slurm_end_time(void)
{
    struct strv argv = { 0 };
    struct esd_err err;
    struct buf out;
    int status;

    strv_push(&argv, "squeue");
    strv_push(&argv, "-h");
    strv_push(&argv, "-j");
    strv_push(&argv, getenv("SLURM_JOB_ID"));
    strv_push(&argv, "-o");
    strv_push(&argv, "%e");
    buf_init(&out);
    if (spawn_capture(argv.v, "/", 10.0, 256, &out, &status, &err) == 0 && WIFEXITED(status) &&
        WEXITSTATUS(status) == 0 && out.p) {
        out.p[strcspn(out.p, " \t\r\n")] = '\0';
        if (parse_deadline(out.p, &R.deadline) == 0)
            R.deadline_from = "squeue -o %e (no SLURM_JOB_END_TIME)";
    }
    buf_free(&out);
    strv_free(&argv);
}

static bool
node_name_ok(const char *s)
{
    size_t n = strlen(s);

    if (!n || n > 64 || s[0] == '.')
        return false;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '_' || *p == '-'))
            return false;
    return true;
}

static int
parse_args(int argc, char **argv)
{
    static const struct option lo[] = {
        { "job-dir", required_argument, NULL, OPT_JOB_DIR },
        { "config", required_argument, NULL, OPT_CONFIG },
        { "dataset-path", required_argument, NULL, OPT_DATASET },
        { "num-shards", required_argument, NULL, OPT_NUM_SHARDS },
        { "output", required_argument, NULL, OPT_OUTPUT },
        { "run-id", required_argument, NULL, OPT_RUN_ID },
        { "nodes", required_argument, NULL, OPT_NODES },
        { "require-all-nodes", no_argument, NULL, OPT_STRICT },
        { "wait-timeout-secs", required_argument, NULL, OPT_WAIT },
        { "poll-interval-secs", required_argument, NULL, OPT_POLL },
        { "deadline", required_argument, NULL, OPT_DEADLINE },
        { "node", required_argument, NULL, OPT_NODE },
        { "slots", required_argument, NULL, OPT_SLOTS },
        { "threads", required_argument, NULL, OPT_THREADS },
        { "lease-secs", required_argument, NULL, OPT_LEASE },
        { "max-retries", required_argument, NULL, OPT_RETRIES },
        { "lock-timeout-secs", required_argument, NULL, OPT_LOCK_TIMEOUT },
        { "attempt-timeout-secs", required_argument, NULL, OPT_ATTEMPT_TIMEOUT },
        { "processor", required_argument, NULL, OPT_PROCESSOR },
        { "data-juicer-root", required_argument, NULL, OPT_DJ_ROOT },
        { "ray-mode", required_argument, NULL, OPT_RAY_MODE },
        { "ray-address", required_argument, NULL, OPT_RAY_ADDRESS },
        { "ray-command", required_argument, NULL, OPT_RAY_COMMAND },
        { "state-dir", required_argument, NULL, OPT_STATE_DIR },
        { "esd-config", required_argument, NULL, OPT_ESD_CONFIG },
        { "allow-op", required_argument, NULL, OPT_ALLOW },
        { "deny-op", required_argument, NULL, OPT_DENY },
        { "no-global-stage", no_argument, NULL, OPT_NO_GLOBAL },
        { "explain", no_argument, NULL, OPT_EXPLAIN },
        { "help", no_argument, NULL, OPT_HELP },
        { NULL, 0, NULL, 0 },
    };
    char **str[] = {
        [OPT_JOB_DIR - OPT_JOB_DIR] = &R.job_dir,
        [OPT_CONFIG - OPT_JOB_DIR] = &R.recipe,
        [OPT_DATASET - OPT_JOB_DIR] = &R.dataset,
        [OPT_OUTPUT - OPT_JOB_DIR] = &R.output,
        [OPT_RUN_ID - OPT_JOB_DIR] = &R.run_id,
        [OPT_NODE - OPT_JOB_DIR] = &R.node,
        [OPT_PROCESSOR - OPT_JOB_DIR] = &R.processor,
        [OPT_DJ_ROOT - OPT_JOB_DIR] = &R.dj_root,
        [OPT_RAY_MODE - OPT_JOB_DIR] = &R.ray_mode,
        [OPT_RAY_ADDRESS - OPT_JOB_DIR] = &R.ray_address,
        [OPT_RAY_COMMAND - OPT_JOB_DIR] = &R.ray_command,
        [OPT_STATE_DIR - OPT_JOB_DIR] = &R.state_dir,
        [OPT_ESD_CONFIG - OPT_JOB_DIR] = &R.esd_config,
        [OPT_HELP - OPT_JOB_DIR] = NULL,
    };
    int opt;

    R.num_shards = -1;
    R.max_retries = -1;
    R.wait_timeout = WAIT_TIMEOUT_DEFAULT;
    R.poll = COORD_POLL_DEFAULT;
    strv_init(&R.allow);
    strv_init(&R.deny);
    optind = 1;
    opterr = 0; /* suggest_getopt_error() words the complaints */
    while ((opt = getopt_long(argc, argv, ":h", lo, NULL)) != -1) {
        switch (opt) {
        case OPT_NUM_SHARDS:
            if (num_opt("--num-shards", optarg, 1, &R.num_shards) < 0)
                return -1;
            break;
        case OPT_NODES:
            if (num_opt("--nodes", optarg, 1, &R.nodes) < 0)
                return -1;
            R.nodes_given = true;
            break;
        case OPT_SLOTS:
            if (num_opt("--slots", optarg, 1, &R.slots) < 0)
                return -1;
            break;
        case OPT_THREADS:
            if (num_opt("--threads", optarg, 1, &R.threads) < 0)
                return -1;
            break;
        case OPT_LEASE:
            if (num_opt("--lease-secs", optarg, 1, &R.lease) < 0)
                return -1;
            break;
        case OPT_RETRIES:
            if (num_opt("--max-retries", optarg, 0, &R.max_retries) < 0)
                return -1;
            break;
        case OPT_LOCK_TIMEOUT:
            if (num_opt("--lock-timeout-secs", optarg, 1, &R.lock_timeout) < 0)
                return -1;
            break;
        case OPT_ATTEMPT_TIMEOUT:
            if (num_opt("--attempt-timeout-secs", optarg, 1, &R.attempt_timeout) < 0)
                return -1;
            break;
        case OPT_STRICT:
            R.strict = true;
            break;
        case OPT_WAIT:
            if (secs_opt("--wait-timeout-secs", optarg, &R.wait_timeout) < 0)
                return -1;
            break;
        case OPT_POLL:
            if (secs_opt("--poll-interval-secs", optarg, &R.poll) < 0)
                return -1;
            break;
        case OPT_DEADLINE:
            if (parse_deadline(optarg, &R.deadline) < 0) {
                fprintf(stderr,
                        "esd run: --deadline needs epoch seconds or "
                        "YYYY-MM-DDTHH:MM:SS[Z], got '%.64s'\n",
                        optarg);
                return -1;
            }
            R.deadline_from = "--deadline";
            break;
        case OPT_ALLOW:
            strv_push(&R.allow, optarg);
            break;
        case OPT_DENY:
            strv_push(&R.deny, optarg);
            break;
        case OPT_NO_GLOBAL:
            R.no_global_stage = true;
            break;
        case OPT_EXPLAIN:
            explain = true;
            break;
        case OPT_HELP:
        case 'h':
            usage(stdout);
            exit(0);
        case '?':
        case ':': {
            struct esd_err err;

            suggest_getopt_error(opt, argv, lo, &err);
            fprintf(stderr, "esd run: %s (see esd run --help)\n", err.msg);
            return -1;
        }
        default:
            if (opt >= OPT_JOB_DIR && opt <= OPT_HELP && str[opt - OPT_JOB_DIR]) {
                free(*str[opt - OPT_JOB_DIR]);
                *str[opt - OPT_JOB_DIR] = xstrdup(optarg);
                break;
            }
            usage(stderr);
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "esd run: unexpected argument '%.200s'\n", argv[optind]);
        return -1;
    }
    if (!R.job_dir) {
        fprintf(stderr, "esd run: --job-dir is required\n");
        return -1;
    }
    if (R.recipe && R.num_shards < 0)
        R.num_shards = 4; /* dlc_job.py's default */
    if (R.num_shards > 0 && !R.recipe) {
        fprintf(stderr, "esd run: --num-shards prepares a job and needs --config\n");
        return -1;
    }
    if (R.node && !node_name_ok(R.node)) {
        fprintf(stderr,
                "esd run: --node '%.64s' must be 1-64 of [A-Za-z0-9._-], not starting "
                "with a dot\n",
                R.node);
        return -1;
    }
    if (R.ray_address && strcmp(R.ray_address, "local")) {
        fprintf(stderr, "esd run: --ray-address takes only 'local' (every attempt starts its "
                        "own Ray, as the reference's default); esd run otherwise starts this "
                        "node's own head (--ray-mode persistent)\n");
        return -1;
    }
    if (R.ray_mode && strcmp(R.ray_mode, "persistent") && strcmp(R.ray_mode, "per-attempt") &&
        strcmp(R.ray_mode, "off")) {
        fprintf(stderr, "esd run: --ray-mode is persistent, per-attempt or off, not '%.64s'\n",
                R.ray_mode);
        return -1;
    }
    return 0;
}

/* ---- settings: an optional esd.yaml, then the flags ---- */

/* An executable path, or a name found on PATH. */
static bool
command_found(const char *cmd)
{
    char *p = fs_which(cmd, getenv("PATH"), X_OK);
    bool found = p != NULL;

    free(p);
    return found;
}

/* A private directory of the caller's: made 0700, or refused when it is
 * not the caller's own (a name planted in /tmp by someone else). */
static int
private_dir(const char *path, struct esd_err *err)
{
    struct stat st;

    if (mkdir(path, 0700) < 0 && errno != EEXIST)
        return err_sys(err, -errno, "cannot make %s", path);
    if (lstat(path, &st) < 0)
        return err_sys(err, -errno, "cannot stat %s", path);
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077))
        return err_set(err, -EPERM,
                       "%s is not a private directory of uid %u (mode 0700): "
                       "not using it; pass --state-dir",
                       path, (unsigned)geteuid());
    return 0;
}

/* A worker's state directory (and its default parent), made private. */
static int
state_dirs(struct esd_err *err)
{
    char *sock_dir = fs_dirname(R.conf->socket_path);
    int r = 0;

    if ((R.state_base && private_dir(R.state_base, err) < 0) ||
        private_dir(R.conf->state_dir, err) < 0 ||
        (strcmp(sock_dir, R.conf->state_dir) && private_dir(sock_dir, err) < 0))
        r = -1;
    free(sock_dir);
    return r;
}

static int
build_conf(struct esd_err *err)
{
    struct esd_conf *c = xcalloc(1, sizeof(*c));
    char *old_ray;

    R.conf = c;
    if (R.esd_config) {
        if (config_load(R.esd_config, c, err) < 0) {
            free(c);
            R.conf = NULL;
            return -1;
        }
    } else {
        config_defaults(c);
    }
    old_ray = fs_join(c->state_dir, "ray");
    if (R.node) {
        free(c->node_name);
        c->node_name = xstrdup(R.node);
    }
    free(R.node);
    R.node = xstrdup(c->node_name);
    if (R.slots)
        c->slots = R.slots;
    if (R.threads)
        c->threads = R.threads > OPS_MAX_THREADS ? OPS_MAX_THREADS : R.threads;
    if (R.lease)
        c->lease_secs = R.lease;
    if (R.attempt_timeout)
        c->attempt_timeout_secs = R.attempt_timeout;
    if (R.processor) {
        strv_free(&c->processor);
        strv_init(&c->processor);
        strv_split(&c->processor, R.processor);
    }
    if (R.dj_root) {
        free(c->dj_root);
        c->dj_root = xstrdup(R.dj_root);
    }
    if (R.ray_address)
        c->ray_mode = RAY_PER_ATTEMPT;
    if (R.ray_command) {
        free(c->ray_command);
        c->ray_command = xstrdup(R.ray_command);
    } else if (c->ray_command && !strcmp(c->ray_command, "ray") && c->processor.n &&
               strchr(c->processor.v[0], '/')) {
        /* the ray of the processor's virtual environment */
        char *dir = fs_dirname(c->processor.v[0]), *ray = fs_join(dir, "ray");

        if (access(ray, X_OK) == 0) {
            free(c->ray_command);
            c->ray_command = ray;
            ray = NULL;
        }
        free(ray);
        free(dir);
    }
    if (R.ray_mode)
        c->ray_mode = !strcmp(R.ray_mode, "persistent")    ? RAY_PERSISTENT
                      : !strcmp(R.ray_mode, "per-attempt") ? RAY_PER_ATTEMPT
                                                           : RAY_OFF;
    free(c->state_dir);
    if (R.state_dir) {
        if (pypath_resolve_cli(R.state_dir, &c->state_dir, err) < 0)
            goto fail;
    } else {
        const char *rt = getenv("XDG_RUNTIME_DIR");
        struct stat rst;
        char *base;

        /* (not a runtime directory of the user it was before become_owner) */
        if (rt && (stat(rt, &rst) < 0 || rst.st_uid != geteuid()))
            rt = NULL;
        base = rt && *rt == '/' ? xasprintf("%s/esd-run", rt)
                                : xasprintf("/tmp/esd-run-%u", (unsigned)geteuid());

        c->state_dir = xasprintf("%s/%s.%.12s", base, c->node_name, R.runkey);
        R.state_base = base;
    }
    if (c->ray_temp_dir && !strcmp(c->ray_temp_dir, old_ray)) {
        free(c->ray_temp_dir);
        c->ray_temp_dir = fs_join(c->state_dir, "ray");
    }
    free(old_ray);
    old_ray = NULL;
    free(c->socket_path);
    c->socket_path = fs_join(c->state_dir, "esd.sock");
    if (strlen(c->socket_path) >= 100) {
        free(c->socket_path);
        c->socket_path = xasprintf("/tmp/esd-run-%u/%d.sock", (unsigned)geteuid(), (int)getpid());
    }
    free(c->socket_group);
    c->socket_group = NULL;
    c->socket_mode = 0600;
    free(c->spool_dir);
    c->spool_dir = NULL;
    free(c->metrics_path);
    c->metrics_path = NULL;
    c->log_target = LOG_TARGET_STDERR;
    c->drain_timeout_secs = 0; /* a scheduler's SIGTERM: stop now, release the claims */
    c->run_mode = true;
    if (c->ray_mode == RAY_PERSISTENT && !explain && !command_found(c->ray_command)) {
        err_set(err, -ENOENT,
                "the Ray head's command '%s' %s: pass --ray-command PATH (or "
                "ray.command in --esd-config), or --ray-address local to let every attempt "
                "start its own Ray",
                c->ray_command,
                strchr(c->ray_command, '/') ? "is not an executable" : "is not on PATH");
        goto fail;
    }
    return 0;
fail:
    free(old_ray);
    config_free(c);
    free(c);
    R.conf = NULL;
    return -1;
}

/* Started as root on another user's job: become that user for good (a
 * job of root's, or a new one under root's directory, stays root's). */
static int
become_owner(struct esd_err *err)
{
    uid_t uid;

    if (geteuid() != 0)
        return 0;
    if (prepare_owner(R.job_dir, &uid, NULL, err) < 0)
        return -1;
    if (uid == 0)
        return 0;
    if (prepare_become(uid, err) < 0)
        return -1;
    say("running as uid %u, the owner of %s", (unsigned)uid, R.job_dir);
    return 0;
}

/* Strict mode's arithmetic, as dlc_job.py's (spec §13.2). */
static int
strict_setup(long long shards, struct esd_err *err)
{
    if (!R.strict)
        return 0;
    if (R.nodes <= 0)
        return err_set(err, -EINVAL,
                       "--require-all-nodes needs --nodes (or a launcher that "
                       "tells the number of nodes)");
    R.cap = (shards + R.nodes - 1) / R.nodes;
    if (shards < R.nodes || (R.nodes - 1) * R.cap >= shards)
        return err_set(err, -EINVAL,
                       "--require-all-nodes with --nodes %lld needs a shard count "
                       "that gives every node at least one shard (%lld shards, at most %lld a "
                       "node); use a multiple of the node count",
                       R.nodes, shards, R.cap);
    return 0;
}

static int
setup_engine(struct esd_err *err)
{
    struct stat st;
    char *out = NULL;
    int fd;

    if (engine_init(R.loop, R.conf, -1, err) < 0)
        return -1;
    fd = open(R.job_dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) < 0) {
        int e = errno;

        if (fd >= 0)
            close(fd);
        return err_sys(err, -e, "cannot open the job directory %s", R.job_dir);
    }
    close(fd);
    if (R.output && pypath_resolve_cli(R.output, &out, err) < 0)
        return -1;
    R.job = jobs_register(R.job_dir, &st, out, false, getuid(), err);
    free(out);
    if (!R.job)
        return -1;
    finalize_retry(R.job); /* a new submission: a failed merge's record does not stand */
    sched_set_hooks(on_complete, may_claim);
    sched_kick();
    return 0;
}

int
oneshot_main(int argc, char **argv)
{
    struct esd_err err;
    char hex[SHA256_HEX_LEN + 1], *parent, *base, *abs = NULL, *why = NULL;
    long long code;
    struct manifest m;
    bool worker;
    int r;

    setvbuf(stdout, NULL, _IOLBF, 0);
    json_init();
    if (parse_args(argc, argv) < 0)
        return EXIT_FAILED;
    if (gethostname(R.host, sizeof(R.host) - 1) < 0)
        snprintf(R.host, sizeof(R.host), "unknown");
    if (pypath_resolve_cli(R.job_dir, &abs, &err) < 0)
        goto fatal;
    free(R.job_dir);
    R.job_dir = abs;
    log_job_init(&R.log, R.job_dir);
    R.ctx.job = &R.log;
    if (!strcmp(R.job_dir, "/")) {
        err_set(&err, -EINVAL, "--job-dir / is not a job directory");
        goto fatal;
    }
    if (resolve_run_id(&err) < 0 || resolve_launcher(&err) < 0)
        goto fatal;
    if (!R.nodes_given && R.nnodes)
        R.nodes = R.nnodes;
    if (!R.deadline_from && getenv("SLURM_JOB_END_TIME") &&
        parse_deadline(getenv("SLURM_JOB_END_TIME"), &R.deadline) == 0)
        R.deadline_from = "SLURM_JOB_END_TIME";
    if (!R.deadline_from && getenv("SLURM_JOB_ID"))
        slurm_end_time();
    sha256_buf(R.run_id, strlen(R.run_id), hex);
    memcpy(R.runkey, hex, 20);
    R.runkey[20] = '\0';
    parent = fs_dirname(R.job_dir);
    base = strrchr(R.job_dir, '/') + 1;
    R.coord = xasprintf("%s/.%s.dlc-coordination/%s", parent, base, R.runkey);
    free(parent);
    if ((!explain && become_owner(&err) < 0) || build_conf(&err) < 0)
        goto fatal;
    log_init(R.conf->log_target, R.conf->log_level, true, R.conf->node_name);
    signal(SIGPIPE, SIG_IGN);
    {
        struct sigaction sa = { 0 };

        sa.sa_handler = on_stop_sig;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGTERM, &sa, NULL);
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGHUP, &sa, NULL);
    }
    worker = R.local_rank == 0;
    if (explain) {
        printf("run_id: %s\nrun_id_from: %s\ncoordination: %s\nnode: %s\nhostname: %s\n"
               "launcher: %s\nrank: %lld\nlocal_rank: %lld\nworld_size: %lld\nnodes: %lld\n"
               "role: %s\nmode: %s\n",
               R.run_id, R.run_id_from, R.coord, R.conf->node_name, R.host,
               R.launcher ? R.launcher : "none", R.rank, R.local_rank, R.world, R.nodes,
               worker ? "worker" : "waiter", R.strict ? "strict" : "elastic");
        if (R.deadline > 0)
            printf("deadline: %.0f (%s)\n", R.deadline, R.deadline_from);
        return 0;
    }
    if (fs_mkdir_p(R.coord, 0755, &err) < 0)
        goto fatal;
    rank_register(worker);
    if (!worker && (r = wait_for_result()) != WAIT_TAKEOVER)
        return r;
    if (state_dirs(&err) < 0)
        goto fatal;
    host_register();
    say("job %s, run id %s (from %s), coordination_generation=%s, node %s (hostname %s), %s",
        R.job_dir, R.run_id, R.run_id_from, R.runkey, R.conf->node_name, R.host,
        R.strict ? "strict" : "elastic");
    if (R.launcher && !strcmp(R.launcher, "Kubernetes Indexed Job"))
        say("launcher %s: completion index %lld: a worker", R.launcher, R.rank);
    else if (R.launcher)
        say("launcher %s: rank %lld of %lld, local rank %lld: this host's worker", R.launcher,
            R.rank, R.world, R.local_rank);
    if (R.deadline > 0)
        say("walltime: the allocation ends in %.0f s (%s)", R.deadline - time_wall(),
            R.deadline_from);
    if (R.num_shards > 0 && strict_setup(R.num_shards, &err) < 0)
        goto fatal;
    if ((code = prepare_phase()) != 0)
        return (int)code;
    if (terminal_code(&code, &why)) {
        say("this run already ended with code %lld%s%s", code, why ? ": " : "", why ? why : "");
        free(why);
        return (int)code;
    }
    if ((r = manifest_load(R.job_dir, &m, &err)) < 0)
        goto fatal;
    if (!R.cap && strict_setup((long long)m.nshards, &err) < 0) {
        manifest_free(&m);
        goto fatal;
    }
    manifest_free(&m);
    say("working: %s mode%s, %ld slot(s), ray %s, state in %s, socket %s",
        R.strict ? "strict" : "elastic", R.cap ? " (a node completes at most its share)" : "",
        R.conf->slots,
        R.conf->ray_mode == RAY_PERSISTENT    ? "persistent head"
        : R.conf->ray_mode == RAY_PER_ATTEMPT ? "per attempt"
                                              : "off",
        R.conf->state_dir, R.conf->socket_path);
    /* the engine: the daemon's modules on this one job */
    R.loop = ev_default_loop(EVFLAG_AUTO);
    if (!R.loop) {
        err_set(&err, -ENOMEM, "cannot initialise the event loop");
        goto fatal;
    }
    contain_init(R.loop);
    if (setup_engine(&err) < 0) {
        /* this node's own trouble (its state directory, its socket, its
         * flags): it takes no part; the other nodes go on */
        say("this node cannot take part: %s", err.msg);
        fprintf(stderr, "esd run: %s\n", err.msg);
        return EXIT_FAILED;
    }
    if (stop_sig)
        finish(EXIT_SIGTERM, "stopped by a signal before the job ended");
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    ev_signal_init(&R.term_w, stop_cb, SIGTERM);
    ev_signal_start(R.loop, &R.term_w);
    ev_signal_init(&R.int_w, stop_cb, SIGINT);
    ev_signal_start(R.loop, &R.int_w);
    ev_signal_init(&R.hup_w, stop_cb, SIGHUP);
    ev_signal_start(R.loop, &R.hup_w);
    elect_init(&R.fin, "finalize");
    phase_set(P_WORK);
    ev_timer_init(&R.tick_w, tick_cb, R.poll, R.poll);
    ev_timer_start(R.loop, &R.tick_w);
    ev_init(&R.beat_w, beat_cb);
    R.beat_w.repeat = (double)R.conf->lease_secs / 4.0;
    ev_run(R.loop, 0);
    summary();
    engine_fini();
    contain_fini();
    /* the default state is this run's alone, and its claims are released:
     * the Ray head's session and token, the registry (a run again under a
     * new run id has another directory) */
    if (!R.state_dir && fs_rm_rf(R.conf->state_dir) < 0)
        log_warning(&R.ctx, "cannot remove %s: %s", R.conf->state_dir, strerror(errno));
    return R.code;
fatal:
    fprintf(stderr, "esd run: %s\n", err.msg);
    return EXIT_FAILED;
}
