/*
 * finalize: the merge election, the merging child and the waiters' poll.
 */
#include "finalize.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fsutil.h"
#include "helper.h"
#include "json.h"
#include "log.h"
#include "spawn.h"
#include "merge.h"

struct fin {
    struct job *job;
    char *dir;    /* <job>/state/esd */
    char *lock;   /* finalize.lock */
    char *result; /* finalize.json */
    bool winner;
    pid_t pid;
    ev_child child_w;
    ev_io out_w;      /* winner: the merging child's record */
    struct helper_guard guard;
    struct buf out;
    bool exited, eof;
    int status;
    ev_timer beat_w; /* winner: renews the lock */
    ev_timer poll_w; /* waiter: looks for the result */
    struct log_ctx ctx;
};

static struct {
    struct ev_loop *loop;
    const struct esd_conf *conf;
    void (*done)(struct job *j);
    size_t running;
} F;

void
finalize_init(struct ev_loop *loop, const struct esd_conf *c)
{
    F.loop = loop;
    F.conf = c;
}

void
finalize_reconfigure(const struct esd_conf *c)
{
    F.conf = c;
}

void
finalize_set_done(void (*done)(struct job *j))
{
    F.done = done;
}

size_t
finalize_running(void)
{
    return F.running;
}

static void
fin_free(struct fin *f)
{
    if (ev_is_active(&f->child_w))
        ev_child_stop(F.loop, &f->child_w);
    if (ev_is_active(&f->out_w)) {
        ev_io_stop(F.loop, &f->out_w);
        close(f->out_w.fd);
    }
    buf_free(&f->out);
    ev_timer_stop(F.loop, &f->beat_w);
    ev_timer_stop(F.loop, &f->poll_w);
    helper_guard_stop(&f->guard, F.loop);
    if (f->pid > 0) {
        kill(f->pid, SIGKILL);
        F.running--;
    }
    f->job->finalize = NULL;
    free(f->dir);
    free(f->lock);
    free(f->result);
    free(f);
}

/* Applies finalize.json if it is there: true when the job ended. */
/* Tells the scheduler that j's finalize ended (decided, or given up). */
static void
fin_done(struct job *j)
{
    if (F.done) {
        /* the scheduler's business, with esd's own identity (it may tell
         * systemd, whose socket is not the job owner's to write) */
        struct fsid prev = jobs_fs_self();

        F.done(j);
        jobs_fs_restore(prev);
    }
}

static bool
fin_apply(struct fin *f)
{
    struct job *j = f->job;
    cJSON *o = NULL;
    const char *status, *error, *node;
    long long rows = 0;
    struct stat st;

    if (stat(f->result, &st) < 0 || json_load_object(f->result, 1 << 20, &o, NULL) < 0)
        return false;
    status = json_get_str(o, "status");
    error = json_get_str(o, "error");
    node = json_get_str(o, "node");
    json_get_int(o, "rows", &rows);
    if (status && !strcmp(status, "complete")) {
        log_notice(&f->ctx, "merged %lld rows into %s (by node %s)", rows,
                   json_get_str(o, "output_path") ? json_get_str(o, "output_path") : j->output,
                   node ? node : "?");
        jobs_set_state(j, JOB_COMPLETE, NULL);
    } else {
        char *why = xasprintf("the merge failed on node %s: %s", node ? node : "?",
                              error ? error : "no reason recorded");
        jobs_set_state(j, JOB_FAILED, why);
        free(why);
    }
    cJSON_Delete(o);
    fin_free(f);
    fin_done(j);
    return true;
}

/* SIGTERM in the merging child: no half-written output is left behind. */
static void
merge_child_stop(int sig)
{
    (void)sig;
    merge_abort();
    _exit(1);
}

/* The merging child, a helper as the job's owner. It reports its record
 * on fd; the parent records it in finalize.json. */
static void __attribute__((noreturn))
fin_merge_child(struct fin *f, int fd)
{
    struct job *j = f->job;
    struct merge_opts o = { 0 };
    struct merge_result res = { 0 };
    struct esd_err err;
    cJSON *rec = cJSON_CreateObject();
    struct sigaction sa = { .sa_handler = merge_child_stop };
    struct stat st;
    char now[40];
    int r = 0, dfd;

    /* esd stops a merge (drain timeout, second SIGTERM) with SIGTERM */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    /* The directory bound at submit, checked once more, and the output
     * reached from it, following no link (DESIGN.md "Security model"). */
    dfd = open(j->job_dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0 || fstat(dfd, &st) < 0) {
        r = err_sys(&err, -errno, "cannot open the job directory %s", j->job_dir);
    } else if (st.st_ino != j->ino || st.st_uid != j->uid || (j->dev && st.st_dev != j->dev)) {
        r = err_set(&err, -ESTALE, "%s is not the directory submitted any more; not merging",
                    j->job_dir);
    } else {
        o.output = j->output;
        o.overwrite = true;
        o.confined = true;
        o.job_fd = dfd;
        r = merge_run(&j->m, &o, &res, &err);
    }
    time_iso_now(now, NULL);
    json_add_str(rec, "status", r == 0 ? "complete" : "failed");
    json_add_str(rec, "job_id", j->m.job_id);
    json_add_str(rec, "output_path", j->output);
    json_add_str(rec, "node", F.conf->node_name);
    json_add_str(rec, "finished_at", now);
    if (r == 0) {
        json_add_int(rec, "rows", (long long)res.rows);
        json_add_str(rec, "sha256", res.sha256);
        json_add_int(rec, "num_shards", (long long)res.nshards);
    } else {
        json_add_str(rec, "error", err.msg);
    }
    {
        struct buf b;

        buf_init(&b);
        json_dump(rec, JSON_COMPACT, &b);
        r = helper_write(fd, b.p, b.len);
    }
    _exit(r < 0 ? 2 : 0);
}

/* The merge is over (the child exited and its record was read): record it
 * for every node, then apply it here. */
static void
fin_merged_as_owner(struct fin *f)
{
    struct esd_err err;
    cJSON *rec = NULL;

    ev_timer_stop(F.loop, &f->beat_w);
    if (f->out.len &&
        json_parse_object(f->out.p, f->out.len, "the merge record", &rec, &err) == 0 &&
        json_write_atomic(f->result, rec, JSON_PRETTY, &err) == 0) {
        cJSON_Delete(rec);
        unlink(f->lock);
        fin_apply(f);
        return;
    }
    cJSON_Delete(rec);
    /* no record: say why, leave the lock to turn stale, look again later */
    log_err(&f->ctx, "the merging process ended (status %d) without a result%s%s; retrying",
            f->status, f->out.len ? ": " : "", f->out.len ? err.msg : "");
    unlink(f->lock);
    {
        struct job *j = f->job;

        fin_free(f);
        jobs_set_state(j, JOB_ACTIVE, NULL);
        /* the election again after a poll, not in a loop */
        j->next_claim = time_mono() + (double)F.conf->poll_interval_secs;
        fin_done(j);
    }
}

/* (what finalize does in the job directory it does as the job's owner:
 * see jobs_fs_owner) */
static void
fin_merged(struct fin *f)
{
    struct fsid prev = jobs_fs_owner(f->job);

    fin_merged_as_owner(f);
    jobs_fs_restore(prev);
}

static void
fin_out_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    struct fin *f = w->data;
    char chunk[4096];
    ssize_t n = read(w->fd, chunk, sizeof(chunk));

    (void)revents;
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n > 0) {
        helper_guard_fed(&f->guard, loop);
        if (f->out.len < (1u << 20))
            buf_append(&f->out, chunk, (size_t)n);
        return;
    }
    ev_io_stop(loop, w);
    close(w->fd);
    f->eof = true;
    if (f->exited)
        fin_merged(f);
}

static void
fin_child_cb(struct ev_loop *loop, ev_child *w, int revents)
{
    struct fin *f = w->data;

    (void)revents;
    ev_child_stop(loop, w);
    helper_guard_stop(&f->guard, loop);
    f->pid = 0;
    F.running--;
    f->exited = true;
    f->status = w->rstatus;
    if (f->eof)
        fin_merged(f);
}

static void
fin_beat_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct fin *f = w->data;
    struct fsid prev = jobs_fs_owner(f->job);
    int fd = fs_open_job(f->lock, O_RDWR, 0, 0, NULL, NULL);

    (void)loop;
    (void)revents;
    if (fd >= 0) {
        fs_touch_fd(fd);
        close(fd);
    }
    jobs_fs_restore(prev);
}

static void fin_elect(struct fin *f);

/* A waiter: the result, or a lock whose lease ran out. */
static void
fin_poll(struct fin *f)
{
    struct esd_err err;
    struct stat st;
    double now;

    if (fin_apply(f))
        return;
    if (stat(f->lock, &st) < 0) {
        fin_elect(f); /* released without a result: elect again */
        return;
    }
    if (claimer_now(&f->job->claimer, &now, &err) == 0 &&
        now - ((double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec / 1e9) >
            (double)F.conf->lease_secs * 2) {
        char hex[33], *aside;

        rand_hex32(hex);
        aside = xasprintf("%s.stale.%s", f->lock, hex);
        if (rename(f->lock, aside) == 0)
            log_warning(&f->ctx, "the merging node stopped renewing %s: electing again", f->lock);
        free(aside);
        fin_elect(f);
    }
}

static void
fin_poll_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct fin *f = w->data;
    struct fsid prev = jobs_fs_owner(f->job);

    (void)loop;
    (void)revents;
    fin_poll(f);
    jobs_fs_restore(prev);
}

static void
fin_elect(struct fin *f)
{
    struct job *j = f->job;
    struct esd_err err;
    cJSON *o = cJSON_CreateObject();
    struct buf b;
    struct helper_id who;
    char now[40];
    pid_t pid;
    int r, fd;

    ev_timer_stop(F.loop, &f->poll_w);
    time_iso_now(now, NULL);
    json_add_str(o, "node", F.conf->node_name);
    json_add_int(o, "pid", (long long)getpid());
    json_add_str(o, "phase", "finalize");
    json_add_str(o, "created_at", now);
    json_add_int(o, "lease_secs", F.conf->lease_secs);
    buf_init(&b);
    json_dump(o, JSON_LINE, &b);
    cJSON_Delete(o);
    r = fs_create_excl(f->lock, b.p, b.len, 0644, NULL, &err);
    buf_free(&b);
    if (r == -EEXIST) {
        f->winner = false;
        ev_timer_set(&f->poll_w, (double)F.conf->poll_interval_secs,
                     (double)F.conf->poll_interval_secs);
        ev_timer_start(F.loop, &f->poll_w);
        log_info(&f->ctx, "every shard is done; another node merges");
        return;
    }
    if (r < 0) {
        log_err(&f->ctx, "%s; retrying", err.msg);
        ev_timer_set(&f->poll_w, (double)F.conf->poll_interval_secs,
                     (double)F.conf->poll_interval_secs);
        ev_timer_start(F.loop, &f->poll_w);
        return;
    }
    f->winner = true;
    log_notice(&f->ctx, "every shard is done; merging into %s", j->output);
    jobs_helper_id(j, &who);
    if ((pid = helper_fork("merge", &who, &fd, &err)) < 0) {
        log_err(&f->ctx, "%s; retrying", err.msg);
        unlink(f->lock);
        ev_timer_set(&f->poll_w, (double)F.conf->poll_interval_secs, 0);
        ev_timer_start(F.loop, &f->poll_w);
        return;
    }
    if (pid == 0)
        fin_merge_child(f, fd);
    ev_io_init(&f->out_w, fin_out_cb, fd, EV_READ);
    f->out_w.data = f;
    ev_io_start(F.loop, &f->out_w);
    helper_guard_start(&f->guard, F.loop, pid, "merge", &f->ctx,
                       (double)F.conf->helper_timeout_secs);
    f->pid = pid;
    F.running++;
    ev_child_init(&f->child_w, fin_child_cb, pid, 0);
    f->child_w.data = f;
    ev_child_start(F.loop, &f->child_w);
    ev_timer_set(&f->beat_w, (double)F.conf->lease_secs / 4.0, (double)F.conf->lease_secs / 4.0);
    ev_timer_start(F.loop, &f->beat_w);
}

static void finalize_start_as_owner(struct job *j);

void
finalize_start(struct job *j)
{
    struct fsid prev = jobs_fs_owner(j);

    finalize_start_as_owner(j);
    jobs_fs_restore(prev);
}

static void
finalize_start_as_owner(struct job *j)
{
    struct fin *f;
    struct esd_err err;

    if (j->finalize || j->state == JOB_COMPLETE || j->state == JOB_FAILED)
        return;
    f = xcalloc(1, sizeof(*f));
    f->job = j;
    f->dir = xasprintf("%s/state/esd", j->job_dir);
    f->lock = fs_join(f->dir, "finalize.lock");
    f->result = fs_join(f->dir, "finalize.json");
    f->ctx.job = j->m.job_id;
    buf_init(&f->out);
    ev_init(&f->beat_w, fin_beat_cb);
    f->beat_w.data = f;
    ev_init(&f->poll_w, fin_poll_cb);
    f->poll_w.data = f;
    j->finalize = f;
    jobs_set_state(j, JOB_FINALIZING, NULL);
    if (fin_apply(f))
        return;
    if (jobs_check_bound(j, &err) < 0) {
        /* (logged there) not this directory's merge: look again later */
        ev_timer_set(&f->poll_w, (double)F.conf->poll_interval_secs, 0);
        ev_timer_start(F.loop, &f->poll_w);
        return;
    }
    if (fs_mkdir_p(f->dir, 0755, &err) < 0) {
        log_err(&f->ctx, "%s; retrying", err.msg);
        ev_timer_set(&f->poll_w, (double)F.conf->poll_interval_secs, 0);
        ev_timer_start(F.loop, &f->poll_w);
        return;
    }
    fin_elect(f);
}

void
finalize_stop_all(void)
{
    for (struct job *j = jobs_first(); j; j = j->next) {
        struct fin *f = j->finalize;

        if (f && f->pid > 0) {
            log_notice(&f->ctx, "stopping the merge (pid %d); another node or a restart "
                       "merges again", (int)f->pid);
            kill(f->pid, SIGTERM);
        }
    }
}

void
finalize_fini(void)
{
    for (struct job *j = jobs_first(); j; j = j->next)
        if (j->finalize)
            fin_free(j->finalize);
}
