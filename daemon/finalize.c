/*
 * finalize: the merge election, the merging child and the waiters' poll.
 *
 * Once every shard is done, each node's esd tries to create
 * state/esd/finalize.lock with O_EXCL: the one that succeeds merges, the
 * others wait for state/esd/finalize.json, the record all nodes apply
 * alike. Unlike the reference's DLC election (spec §13, §16.6: a
 * coordinator that dies after taking its lock blocks the run for good),
 * the lock carries a lease that its holder renews and that waiters take
 * over once it runs out, and the merge publishes only under the fence of
 * that lock.
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
#include <time.h>
#include <unistd.h>

#include "fsutil.h"
#include "gstage.h"
#include "helper.h"
#include "json.h"
#include "claim.h"
#include "log.h"
#include "msgid.h"
#include "spawn.h"
#include "merge.h"

/* A merge that failed for a cause of its storage or node (err_transient)
 * is held again after 5 s, doubling up to 10 minutes. */
#define MERGE_RETRY_FIRST 5.0
#define MERGE_RETRY_MAX 600.0
#define LOSER_POLL_MAX 5.0 /* a node that lost the election looks for the result */

struct fin {
    struct job *job;
    char *dir;      /* <job>/state/esd */
    char *lock;     /* finalize.lock */
    char *result;   /* finalize.json */
    char token[33]; /* of the election this node won */
    bool winner;
    bool lost; /* the election lock was taken over while it merged */
    pid_t pid;
    ev_child child_w;
    ev_io out_w; /* winner: the merging child's record */
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

/* How often a node that lost the election looks for its result: soon
 * enough that every node knows the job complete within seconds of the
 * merge (three cheap operations a look, only while a merge runs). */
static double
loser_poll(void)
{
    double p = (double)F.conf->poll_interval_secs;

    return p < LOSER_POLL_MAX ? p : LOSER_POLL_MAX;
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

/* Applies finalize.json if it is there: true when the job ended. Every
 * node, winner or waiter, ends the job through this one record, so all of
 * them agree on complete or failed; a merge that should be tried again
 * never writes it (fin_merge_child), so a passing fault on one node does
 * not fail the job on all. The stat first keeps a waiter's look cheap. */
static bool
fin_apply(struct fin *f)
{
    struct job *j = f->job;
    cJSON *o = NULL;
    const char *status, *error, *node;
    long long rows = 0;
    struct stat st;
    struct esd_err err;

    /* A whole recipe: the shards' outputs merged (prefix.json, which
     * every node reads alike) end this election, and the job goes on to
     * its global stage. A merge of the shards that failed for good still
     * ends the job through finalize.json, below. */
    if (gstage_has(&j->m) && !j->gstage) {
        int r = jobs_global_enter(j, &err); /* (a broken record logged there) */

        if (r == 1) {
            fin_free(f);
            jobs_set_state(j, JOB_ACTIVE, NULL);
            fin_done(j);
            return true;
        }
    }
    if (stat(f->result, &st) < 0 || json_load_object(f->result, 1 << 20, &o, NULL) < 0)
        return false;
    status = json_get_str(o, "status");
    error = json_get_str(o, "error");
    node = json_get_str(o, "node");
    json_get_int(o, "rows", &rows);
    if (status && !strcmp(status, "complete")) {
        log_event(LOG_LVL_NOTICE, &f->ctx, MSGID_MERGED, "merged %lld rows into %s (by node %s)",
                  rows, json_get_str(o, "output_path") ? json_get_str(o, "output_path") : j->output,
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

/* For tests only (ESD_TEST_MERGE_DELAY_SECS): the merging child waits so
 * long before it merges, so that a test can freeze its node meanwhile. */
static void
test_delay(void)
{
    const char *v = getenv("ESD_TEST_MERGE_DELAY_SECS");
    long long secs;
    struct timespec ts;

    if (!v || parse_int(v, 1, 3600, &secs) < 0)
        return;
    ts.tv_sec = (time_t)secs;
    ts.tv_nsec = 0;
    /* (the helper's tick interrupts the sleep: go on with what is left) */
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* In the merging child: the fence over this node's election lock, held
 * from just before the output is renamed into place until finalize.json
 * is written, so that a node that lost its election (its lease ran out
 * while it was frozen, another node was elected) never publishes. */
static int fence_fd = -1;

static int
fin_fence(void *ctx, struct esd_err *err)
{
    struct fin *f = ctx;
    struct esd_err why;
    int fd;

    if (fence_fd >= 0)
        return 0;
    fd = claim_fence(f->lock, f->token, false, &why);
    if (fd == -ESTALE)
        return err_set(err, -ESTALE,
                       "this node no longer holds the finalize election (%s); "
                       "not publishing",
                       why.msg);
    if (fd < 0)
        return err_set(err, fd, "%s", why.msg);
    fence_fd = fd;
    return 0;
}

/* The merging child, a helper as the job's owner. Merged, or failed for
 * good, it records the result in finalize.json and gives up the election
 * lock under the fence; a failure of the storage or the node only gives
 * the lock up, for the election to be held again. It reports one line:
 * the record with "status" complete, failed, retry or lost. */
static void __attribute__((noreturn)) fin_merge_child(struct fin *f, int fd)
{
    struct job *j = f->job;
    struct merge_opts o = { 0 };
    struct merge_result res = { 0 };
    struct esd_err err, ferr;
    cJSON *rec = cJSON_CreateObject();
    struct sigaction sa = { .sa_handler = merge_child_stop };
    /* a whole recipe merges twice: the shards' outputs into the global
     * stage's input (prefix), then the global stage's result */
    bool prefix = gstage_has(&j->m) && !j->gstage;
    const struct manifest *m = j->gstage ? &j->gm : &j->m;
    char *input = prefix ? fs_join(j->job_dir, GSTAGE_INPUT) : NULL;
    struct gstage_prefix pre = { 0 };
    const char *status;
    struct stat st;
    char now[40];
    int r = 0, dfd;

    /* esd stops a merge (drain timeout, second SIGTERM) with SIGTERM */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    test_delay();
    /* The directory bound at submit, checked once more, and the output
     * reached from it, following no link (ARCHITECTURE.md "Security model"). */
    dfd = open(j->job_dir, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0 || fstat(dfd, &st) < 0) {
        r = err_sys(&err, -errno, "cannot open the job directory %s", j->job_dir);
    } else if (st.st_ino != j->ino || st.st_uid != j->uid || (j->dev && st.st_dev != j->dev)) {
        r = err_set(&err, -ESTALE, "%s is not the directory submitted any more; not merging",
                    j->job_dir);
    } else if (j->gstage && (r = gstage_prefix_load(&j->m, &pre, &err)) != 1) {
        if (r == 0)
            r = err_set(&err, -ENOENT, "%s/%s is gone; the global stage's input is not recorded",
                        j->job_dir, GSTAGE_PREFIX);
    } else {
        r = 0;
        o.output = prefix ? input : j->output;
        o.stage_input = prefix;
        if (j->gstage) {
            o.stage_of = &j->m;
            o.prefix = &pre;
        }
        /* an election held again replaces what an earlier winner may have
         * published without recording it, as the reference's DLC verify
         * merges with --overwrite (spec §13.9) */
        o.overwrite = true;
        o.confined = true;
        o.job_fd = dfd;
        o.before_publish = fin_fence;
        o.publish_ctx = f;
        o.threads = (unsigned)F.conf->threads;
        r = merge_run(m, &o, &res, &err);
    }
    /* (a merge that failed before it came to publish takes the fence now,
     * to record or give up what is still this node's: a node whose lease
     * ran out must not write finalize.json over the new winner's) */
    if (r < 0 && fence_fd < 0 && fin_fence(f, &ferr) < 0)
        status = "lost";
    else
        status = r == 0 && prefix   ? "global"
                 : r == 0           ? "complete"
                 : err_transient(r) ? "retry"
                                    : "failed";
    time_iso_now(now, NULL);
    json_add_str(rec, "status", status);
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
    /* finalize.json before the lock goes, both under the fence: a waiter
     * that finds the lock gone finds the record (fin_poll looks for it
     * first), and a merge to be tried again leaves no record, only a
     * released lock, so the election is simply held again. */
    if (fence_fd >= 0 && !strcmp(status, "global")) {
        /* the shards' outputs merged: prefix.json, not finalize.json, is
         * what every node goes on by (fin_apply) */
        pre.rows = (long long)res.rows;
        pre.num_shards = (long long)res.nshards;
        pre.size_bytes = (long long)res.bytes;
        memcpy(pre.sha256, res.sha256, sizeof(pre.sha256));
        if (gstage_prefix_write(&j->m, &pre, F.conf->node_name, &ferr) < 0) {
            cJSON_ReplaceItemInObjectCaseSensitive(rec, "status", cJSON_CreateString("retry"));
            json_set(rec, "error", cJSON_CreateString(ferr.msg));
        }
        unlink(f->lock);
        claim_unfence(fence_fd);
    } else if (fence_fd >= 0) {
        if (strcmp(status, "retry") && json_write_atomic(f->result, rec, JSON_PRETTY, &ferr) < 0) {
            /* the record could not be written: the election again */
            cJSON_ReplaceItemInObjectCaseSensitive(rec, "status", cJSON_CreateString("retry"));
            json_set(rec, "error", cJSON_CreateString(ferr.msg));
        }
        unlink(f->lock);
        claim_unfence(fence_fd);
    }
    {
        struct buf b;

        buf_init(&b);
        json_dump(rec, JSON_COMPACT, &b);
        r = helper_write(fd, b.p, b.len);
        buf_free(&b);
    }
    cJSON_Delete(rec);
    free(input);
    _exit(r < 0 ? 2 : 0);
}

/* Gives the election lock up if it is still this node's (its token). */
static void
fin_release(struct fin *f)
{
    claim_lock_release(f->lock, f->token);
}

/* The merge is over (the child exited and its record was read): applied
 * here, or the election held again after a backoff. */
static void
fin_merged_as_owner(struct fin *f)
{
    struct job *j = f->job;
    struct esd_err err;
    cJSON *rec = NULL;
    const char *status = NULL, *error = NULL;
    char how[96];
    double wait;

    ev_timer_stop(F.loop, &f->beat_w);
    if (f->out.len &&
        json_parse_object(f->out.p, f->out.len, "the merge record", &rec, &err) == 0) {
        status = json_get_str(rec, "status");
        error = json_get_str(rec, "error");
    }
    if (status &&
        (!strcmp(status, "complete") || !strcmp(status, "failed") || !strcmp(status, "global")) &&
        fin_apply(f)) {
        j->merge_failures = 0;
        cJSON_Delete(rec);
        return;
    }
    if ((status && !strcmp(status, "lost")) || f->lost) {
        if (status && !strcmp(status, "lost"))
            log_warning(&f->ctx,
                        "this node lost the finalize election while it merged, and "
                        "its merge did not publish: %s",
                        error ? error : "");
        f->lost = false;
        cJSON_Delete(rec);
        f->winner = false;
        f->pid = 0;
        ev_timer_set(&f->poll_w, loser_poll(), loser_poll());
        ev_timer_start(F.loop, &f->poll_w);
        return;
    }
    /* a failure of the storage or the node, or no result at all: the
     * election again after a backoff, never a job failed for good; the
     * lock is released here too (the child may have died before it could)
     * so that any node, not only this one, may merge next */
    fin_release(f);
    helper_describe(f->status, how);
    /* (the shift is capped so it cannot overflow; 5 s << 7 is already
     * past MERGE_RETRY_MAX) */
    wait = MERGE_RETRY_FIRST * (double)(1u << (j->merge_failures < 7 ? j->merge_failures : 7));
    if (wait > MERGE_RETRY_MAX)
        wait = MERGE_RETRY_MAX;
    j->merge_failures++;
    {
        char *why = xasprintf("the merge failed on node %s: %s; it is held again in %.0f s "
                              "(or at once on esctl merge or submit)",
                              F.conf->node_name, error ? error : how, wait);

        log_event(LOG_LVL_ERR, &f->ctx, MSGID_MERGE_FAILED, "%s", why);
        fin_free(f);
        jobs_set_state(j, JOB_ACTIVE, why);
        free(why);
    }
    cJSON_Delete(rec);
    j->next_claim = time_mono() + wait;
    fin_done(j);
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
    struct esd_err err;
    int r = claim_lock_renew(f->lock, f->token, &err);

    (void)loop;
    (void)revents;
    /* Other errors are left for the next renewal: waiters allow twice the
     * lease (fin_poll), eight renewals, before they take over. */
    if (r == -ESTALE && f->pid > 0) {
        /* taken over (this node was frozen past its lease): the merge
         * cannot publish any more (its fence would refuse); stop it now
         * rather than let it stream the whole job for nothing */
        log_warning(&f->ctx, "this node lost the finalize election (%s): stopping the merge",
                    err.msg);
        f->lost = true;
        ev_timer_stop(loop, w);
        kill(f->pid, SIGTERM);
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
        /* Gone. The winner writes its result before it removes the lock,
         * so a result written between fin_apply above and this stat is
         * there now: look once more, and elect again only if the lock was
         * released without one (its merge failed, or it gave up). */
        if (!fin_apply(f))
            fin_elect(f);
        return;
    }
    /* Ages on the file server's clock (claimer_now), as for shard locks:
     * the nodes' own clocks may disagree (spec §16.2). Twice the lease: a
     * takeover here redoes the whole merge, so the merging node gets more
     * slack than a shard's owner does. */
    if (claimer_now(&f->job->claimer, &now, &err) == 0 &&
        now - ((double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec / 1e9) >
            (double)F.conf->lease_secs * 2) {
        /* Under the fence, as a shard's stale lock is taken over: a merging
         * node that still holds it is deciding; the age is judged again on
         * the very file that is moved aside. */
        int r = claim_lock_move_stale(f->lock, now, (double)F.conf->lease_secs * 2, NULL);

        if (!r)
            return;
        if (r == 1)
            log_warning(&f->ctx, "the merging node stopped renewing %s: electing again", f->lock);
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
    /* a fresh token each election: the fence and the renewal recognise
     * this node's lock by it, not by its name, which the next winner
     * reuses */
    rand_hex32(f->token);
    json_add_str(o, "node", F.conf->node_name);
    json_add_str(o, "token", f->token);
    json_add_int(o, "pid", (long long)getpid());
    json_add_str(o, "phase", "finalize");
    json_add_str(o, "created_at", now);
    json_add_int(o, "lease_secs", F.conf->lease_secs);
    buf_init(&b);
    json_dump(o, JSON_LINE, &b);
    cJSON_Delete(o);
    /* O_EXCL is the election: exactly one creator succeeds, on NFS too
     * (exclusive create is atomic there since NFSv3) */
    r = fs_create_excl(f->lock, b.p, b.len, 0644, NULL, &err);
    buf_free(&b);
    if (r == -EEXIST) {
        f->winner = false;
        ev_timer_set(&f->poll_w, loser_poll(), loser_poll());
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
    if (gstage_has(&j->m) && !j->gstage)
        log_notice(&f->ctx,
                   "every shard is done; merging their outputs into %s/%s for the global "
                   "stage",
                   j->job_dir, GSTAGE_INPUT);
    else if (j->gstage)
        log_notice(&f->ctx, "the global stage is done; merging its result into %s", j->output);
    else
        log_notice(&f->ctx, "every shard is done; merging into %s", j->output);
    jobs_helper_id(j, &who);
    if ((pid = helper_fork("merge", &who, &fd, &err)) < 0) {
        /* released at once: another node may merge instead of waiting two
         * leases for this one */
        log_err(&f->ctx, "%s; retrying", err.msg);
        fin_release(f);
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
    f->ctx.job = &j->log;
    buf_init(&f->out);
    ev_init(&f->beat_w, fin_beat_cb);
    f->beat_w.data = f;
    ev_init(&f->poll_w, fin_poll_cb);
    f->poll_w.data = f;
    j->finalize = f;
    jobs_set_state(j, JOB_FINALIZING, NULL);
    /* another node (or this one before a restart) may have decided it */
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

/* As the owner: moves a failed merge record aside; true if there was one.
 * Aside, not removed: it is the only account of why the merge failed, and
 * the timestamp in its name keeps one per retry. */
static bool
forget_failed_record(struct job *j)
{
    char *result = xasprintf("%s/state/esd/finalize.json", j->job_dir), *aside, now[40];
    const char *status;
    cJSON *o = NULL;
    bool moved = false;

    if (json_load_object(result, 1 << 20, &o, NULL) == 0 && (status = json_get_str(o, "status")) &&
        !strcmp(status, "failed")) {
        time_iso_now(now, NULL);
        aside = xasprintf("%s/state/esd/finalize.failed.%s.json", j->job_dir, now);
        moved = rename(result, aside) == 0;
        free(aside);
    }
    cJSON_Delete(o);
    free(result);
    return moved;
}

bool
finalize_retry(struct job *j)
{
    struct fsid prev;
    bool moved;

    if (j->finalize)
        return false;
    prev = jobs_fs_owner(j);
    moved = forget_failed_record(j);
    jobs_fs_restore(prev);
    j->merge_failures = 0;
    if (j->state == JOB_FAILED && moved) {
        jobs_reset(j);
        jobs_set_state(j, JOB_ACTIVE, NULL);
    }
    if (j->state != JOB_ACTIVE)
        return false;
    j->next_claim = 0;
    if (moved)
        log_notice(&(struct log_ctx){ .job = &j->log },
                   "job %s: the record of its failed merge moved aside; merging again", j->job_dir);
    return true;
}

void
finalize_stop_all(void)
{
    for (struct job *j = jobs_first(); j; j = j->next) {
        struct fin *f = j->finalize;

        if (f && f->pid > 0) {
            log_notice(&f->ctx,
                       "stopping the merge (pid %d); another node or a restart "
                       "merges again",
                       (int)f->pid);
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
