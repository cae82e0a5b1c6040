/*
 * runner: attempts as libev objects. Each struct run embeds its watchers:
 * the processor's exit (ev_child), its output (ev_io), the lease renewal,
 * the attempt timeout and the kill grace (ev_timer), and, once the
 * processor is gone, the finishing child's exit and report.
 */
#include "runner.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "contain.h"
#include "fsutil.h"
#include "gstage.h"
#include "helper.h"
#include "json.h"
#include "log.h"
#include "msgid.h"
#include "metrics.h"
#include "notify.h"
#include "outcome.h"
#include "ray.h"
#include "spawn.h"
#include "warm.h"

/* attempt_kill_grace_secs after SIGTERM the keeper kills the tree itself;
 * esd's SIGKILL to the group KEEPER_SLACK later is a backstop for a keeper
 * that did not. */
#define KEEPER_SLACK 5.0
/* How long the output pipe may stay open once the processor's tree is
 * gone: only a process outside it (one that was passed the descriptor)
 * can hold it, and esd never waits on that. */
#define OUT_DRAIN 2.0
/* Bytes of one line in esd's log: a journal entry is one line, and a
 * processor that prints a megabyte without a newline is still readable. */
#define LOG_LINE_MAX 8192
/* Bytes of one attempt's output copied into esd's log (process.log keeps
 * everything): a processor that prints without end must not flood the
 * journal. */
#define LOG_ATTEMPT_MAX ((size_t)1 << 20)

extern char **environ;

struct run {
    struct run *next;
    struct job *job;
    struct claim cl;
    /* what the claim was made on: the job's, or its global stage's */
    const struct manifest *m;
    struct claimer *claimer;
    double timeout; /* seconds; 0: none */
    struct log_ctx ctx;
    struct attempt_cmd cmd;
    struct spawned child;
    char *cgroup; /* its cgroup (contain_begin), or NULL */
    int log_fd;
    ev_child child_w;
    ev_io out_w;
    ev_timer beat_w;
    ev_timer timeout_w;
    ev_timer grace_w;
    ev_timer drain_w;
    struct buf line;
    size_t logged; /* bytes of its output logged so far */
    double started;
    double grace; /* attempt_kill_grace_secs when it started */
    unsigned long ray_gen;
    char ray_addr[128];
    bool running, exited, out_eof, killing;
    int status;
    bool lease_lost, timed_out, stopped, start_failed;
    /* forked by the warm processor: its keeper is not esd's child, its
     * reports (and their end) say all */
    bool warm, warm_pending;
    int go_w;   /* while pending: the fork waits for a byte on it */
    bool gated; /* claimed ahead: waits for a slot (gate_w) */
    int gate_w;
    bool exec_gated; /* claimed ahead, the warm fork failed: exec'd once a slot is free */
    double ran_at;   /* when its processor was let run (monotonic) */
    double ended_at; /* when it ended (monotonic; 0: not yet) */
    ev_io rep_w;
    struct spawn_keep_state ks;
    struct spawn_cred cred; /* whom it runs as (uid 0: esd's own identity) */
    char error[ESD_ERR_MAX];
    /* finishing */
    pid_t fin_pid;
    ev_child fin_child_w;
    ev_io fin_w;
    struct helper_guard fin_guard;
    struct buf fin_out;
    bool fin_exited, fin_eof;
    int fin_status;
};

static struct {
    struct ev_loop *loop;
    const struct esd_conf *conf;
    struct run *head;
    size_t n;
    char *dj_runner; /* esd-dj, or NULL */
    void (*freed)(void);
    void (*done)(struct job *j, const struct attempt_final *fin);
} R;

static void run_finish(struct run *r);
static void run_exec(struct run *r);

void
runner_init(struct ev_loop *loop, const struct esd_conf *c)
{
    R.loop = loop;
    R.conf = c;
    R.dj_runner = attempt_dj_runner();
}

void
runner_reconfigure(const struct esd_conf *c)
{
    /* attempts in flight keep the settings they started with */
    R.conf = c;
}

void
runner_set_done(void (*done)(struct job *j, const struct attempt_final *fin))
{
    R.done = done;
}

void
runner_set_freed(void (*freed)(void))
{
    R.freed = freed;
}

/* A run that takes a slot: its processor starts or runs, ungated. */
static bool
run_busy(const struct run *r)
{
    return !r->exited && !r->gated;
}

size_t
runner_busy(void)
{
    size_t n = 0;

    for (struct run *r = R.head; r; r = r->next)
        n += run_busy(r);
    return n;
}

size_t
runner_gated(void)
{
    size_t n = 0;

    for (struct run *r = R.head; r; r = r->next)
        n += r->gated && !r->exited;
    return n;
}

double
runner_ahead_in(double lead)
{
    double now = time_mono(), best = INFINITY;

    for (struct run *r = R.head; r; r = r->next) {
        double at;

        if (!run_busy(r) || !runner_can_start_ahead(r->job))
            continue;
        at = r->job->proc_avg > 0 ? r->ran_at + r->job->proc_avg - lead : now;
        if (at - now < best)
            best = at > now ? at - now : 0;
    }
    return best;
}

/* Lets the oldest attempts claimed ahead run while slots are free. */
static void
run_open_gates(void)
{
    /* Oldest first: attempts claimed ahead hold leases and locks other
     * nodes could have taken, so the one claimed longest ago is the one to
     * get going. */
    size_t busy = runner_busy();

    while (busy < (size_t)R.conf->slots) {
        struct run *oldest = NULL;

        for (struct run *r = R.head; r; r = r->next)
            if (r->gated && !r->exited && !r->stopped && (!oldest || r->started < oldest->started))
                oldest = r;
        if (!oldest)
            return;
        oldest->gated = false;
        oldest->ran_at = time_mono();
        if (oldest->exec_gated) {
            /* (run_exec may end it at once: a start that failed) */
            oldest->exec_gated = false;
            log_debug(&oldest->ctx, "a slot is free: the attempt claimed ahead starts");
            run_exec(oldest);
            busy = runner_busy();
            continue;
        }
        /* A warm fork claimed ahead has made its Ray executor and waits
         * for one byte on its gate pipe: "r" lets it run (esd-dj.py
         * _gate_before_running; end of file makes it give up). */
        if (oldest->gate_w >= 0) {
            if (write(oldest->gate_w, "r", 1) != 1)
                log_warning(&oldest->ctx, "cannot let the attempt run: %s", strerror(errno));
            close(oldest->gate_w);
            oldest->gate_w = -1;
        }
        /* the timeout counts from here: the wait for a slot was no time
         * of the processor's (run_started left it off while gated) */
        if (oldest->running && oldest->timeout > 0)
            ev_timer_start(R.loop, &oldest->timeout_w);
        log_debug(&oldest->ctx, "a slot is free: the attempt claimed ahead runs");
        busy++;
    }
}

size_t
runner_count(void)
{
    return R.n;
}

static void
run_free(struct run *r)
{
    struct run **p;

    for (p = &R.head; *p && *p != r; p = &(*p)->next)
        ;
    if (*p)
        *p = r->next;
    R.n--;
    metrics_set_running(R.n);
    ev_timer_stop(R.loop, &r->beat_w);
    ev_timer_stop(R.loop, &r->timeout_w);
    ev_timer_stop(R.loop, &r->grace_w);
    ev_timer_stop(R.loop, &r->drain_w);
    if (r->warm_pending)
        warm_cancel(r);
    if (r->go_w >= 0)
        close(r->go_w);
    if (r->gate_w >= 0)
        close(r->gate_w);
    ev_io_stop(R.loop, &r->rep_w);
    spawn_cred_free(&r->cred);
    if (r->log_fd >= 0)
        close(r->log_fd);
    if (r->child.out_fd >= 0)
        close(r->child.out_fd);
    if (r->child.report_fd >= 0)
        close(r->child.report_fd);
    contain_end(r->cgroup);
    attempt_cmd_free(&r->cmd);
    claim_free(&r->cl);
    buf_free(&r->line);
    buf_free(&r->fin_out);
    free(r);
}

/* ---- the processor ---- */

/* SIGTERM to the processor's group; its keeper sends it to what left the
 * group too, and kills the whole tree r->grace later. */
static void
run_kill(struct run *r)
{
    if (r->exec_gated && !r->exited) {
        /* never started: nothing to kill, the attempt just ends */
        r->exec_gated = false;
        r->exited = r->out_eof = true;
        run_finish(r);
        return;
    }
    if (!r->running || r->exited || r->killing)
        return;
    r->killing = true;
    spawn_signal(&r->child, SIGTERM);
    ev_timer_start(R.loop, &r->grace_w);
}

static void
run_grace_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct run *r = w->data;

    (void)loop;
    (void)revents;
    log_warning(&r->ctx,
                "processor's keeper still running %.0f s after SIGTERM: SIGKILL to its "
                "process group",
                r->grace + KEEPER_SLACK);
    spawn_signal(&r->child, SIGKILL);
}

/* Logs one piece of the processor's output, up to LOG_ATTEMPT_MAX bytes
 * an attempt. */
static void
run_log_line(struct run *r, const char *p, size_t n)
{
    if (r->logged >= LOG_ATTEMPT_MAX)
        return;
    r->logged += n + 1; /* (its newline) */
    if (r->logged >= LOG_ATTEMPT_MAX) {
        log_notice(&r->ctx,
                   "the processor printed more than %zu bytes: the rest of its output "
                   "is only in %s",
                   LOG_ATTEMPT_MAX, r->cmd.log_path);
        return;
    }
    log_processor(&r->ctx, p, n);
}

/* Logs complete lines of the processor's output. */
static void
run_lines(struct run *r, bool flush)
{
    size_t start = 0;

    for (size_t i = 0; i < r->line.len; i++)
        if (r->line.p[i] == '\n') {
            run_log_line(r, r->line.p + start, i - start > LOG_LINE_MAX ? LOG_LINE_MAX : i - start);
            start = i + 1;
        }
    if (flush && start < r->line.len) {
        run_log_line(r, r->line.p + start,
                     r->line.len - start > LOG_LINE_MAX ? LOG_LINE_MAX : r->line.len - start);
        start = r->line.len;
    }
    /* a line longer than the limit is logged in pieces */
    if (!flush && r->line.len - start > LOG_LINE_MAX) {
        run_log_line(r, r->line.p + start, LOG_LINE_MAX);
        start += LOG_LINE_MAX;
    }
    /* (nothing logged: the buffer may be empty and unallocated) */
    if (start > 0) {
        memmove(r->line.p, r->line.p + start, r->line.len - start);
        r->line.len -= start;
    }
}

static void
run_out_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    struct run *r = w->data;
    char chunk[65536];
    ssize_t n;

    (void)revents;
    n = read(r->child.out_fd, chunk, sizeof(chunk));
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n > 0) {
        /* process.log is diagnostics, not the result: a full or failing
         * disk there must not fail a shard whose output may be fine, so
         * the attempt runs on and only esd's log keeps its output. */
        if (r->log_fd >= 0 && fs_write_all(r->log_fd, chunk, (size_t)n) < 0) {
            log_warning(&r->ctx, "cannot write %s: %s; the output still goes to the log",
                        r->cmd.log_path, strerror(errno));
            close(r->log_fd);
            r->log_fd = -1;
        }
        buf_append(&r->line, chunk, (size_t)n);
        run_lines(r, false);
        return;
    }
    run_lines(r, true);
    ev_io_stop(loop, w);
    ev_timer_stop(loop, &r->drain_w);
    close(r->child.out_fd);
    r->child.out_fd = -1;
    r->out_eof = true;
    if (r->exited)
        run_finish(r);
}

static void
run_drain_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct run *r = w->data;

    (void)revents;
    /* (also called by the timeout, with the timer still running) */
    ev_timer_stop(loop, w);
    if (r->out_eof)
        return;
    log_warning(&r->ctx, "the processor's output is still open after its process tree ended "
                         "(a process outside it holds it): closing it");
    /* what is there still goes to the log, then end of file */
    run_out_cb(loop, &r->out_w, EV_READ);
    if (!r->out_eof) {
        run_lines(r, true);
        ev_io_stop(loop, &r->out_w);
        close(r->child.out_fd);
        r->child.out_fd = -1;
        r->out_eof = true;
        run_finish(r);
    }
}

/* The keeper is gone: the processor and everything it started are gone
 * (the keeper kills its tree before it exits). told: its report gave the
 * processor's wait status (in r->status). The lease is still renewed: the
 * attempt is over only once it is finished. */
static void
run_keeper_gone(struct run *r, bool told, const char *how)
{
    bool was_busy = run_busy(r);

    r->exited = true;
    r->ended_at = time_mono();
    /* Only a reported end measures the processor: a keeper that died
     * without its report says nothing of how long the work takes. */
    if (was_busy && r->running && told) {
        /* this node's mean time of the job's processor, for claim-ahead;
         * a moving average that halves an old figure's weight at each
         * attempt, so a job whose shards change in cost is followed within
         * a few attempts */
        double d = time_mono() - r->ran_at;
        struct job *j = r->job;

        j->proc_avg = j->proc_avg > 0 ? 0.5 * j->proc_avg + 0.5 * d : d;
    }
    /* The slot is free from now, not from publication: finishing is a
     * helper's file I/O, and the next processor may start beside it. */
    if (was_busy) {
        run_open_gates();
        if (R.freed)
            R.freed();
    }
    /* (the timeout runs on: it also bounds the wait for the output) */
    ev_timer_stop(R.loop, &r->grace_w);
    if (!told) {
        log_warning(&r->ctx, "the processor's keeper ended without its report (%s): %s", how,
                    r->cgroup ? "killing what is left in the attempt's cgroup"
                              : "what the processor started outside its process group may "
                                "still run");
        /* (its processor died with it: PR_SET_PDEATHSIG) */
        spawn_signal(&r->child, SIGKILL);
    }
    contain_end(r->cgroup);
    r->cgroup = NULL;
    if (r->out_eof)
        run_finish(r);
    else
        ev_timer_start(R.loop, &r->drain_w);
}

static void
run_child_cb(struct ev_loop *loop, ev_child *w, int revents)
{
    struct run *r = w->data;
    char how[64];
    int code;
    bool told;

    (void)revents;
    ev_child_stop(loop, w);
    told = spawn_keep_status(&r->child, w->rstatus, &r->status) == 0;
    spawn_describe(w->rstatus, how, &code);
    run_keeper_gone(r, told, how);
}

/* A report of a warm attempt's keeper (not esd's child: the end of its
 * report pipe is its end). */
static void
run_rep_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    struct run *r = w->data;

    (void)revents;
    spawn_keep_read(&r->child, &r->ks);
    if (!r->ks.eof)
        return;
    ev_io_stop(loop, w);
    if (r->ks.exited) {
        r->status = r->ks.status;
    } else if (!r->ks.proc && r->ks.failed) {
        /* the fork could not start its keeper: nothing ran */
        r->start_failed = true;
        snprintf(r->error, sizeof(r->error),
                 "the warm processor's fork could not start the "
                 "attempt's keeper: %s",
                 strerror(r->ks.failed));
        r->running = false;
    }
    run_keeper_gone(r, r->ks.exited || r->start_failed, "its report pipe closed");
}

static void
run_beat_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct run *r = w->data;
    struct esd_err err;
    int rc;

    (void)loop;
    (void)revents;
    /* the lock is the job owner's file: renewing its mtime is done with
     * the owner's file system identity, as creating it was */
    struct fsid prev = jobs_fs_owner(r->job);
    rc = claim_heartbeat(&r->cl, &err);
    jobs_fs_restore(prev);
    if (rc == -ESTALE && r->exited) {
        /* finishing: the finishing process released the lock (or will
         * find that it lost it: its publication is fenced) */
        log_debug(&r->ctx, "%s (finishing)", err.msg);
        ev_timer_stop(loop, w);
    } else if (rc == -ESTALE) {
        /* Another node may run this shard now. Our result would be refused
         * at publication anyway (attempt_finish is fenced on the lock's
         * inode and token), so the processor is stopped at once rather
         * than left to burn the node for nothing. */
        r->lease_lost = true;
        snprintf(r->error, sizeof(r->error), "%s", err.msg);
        log_warning(&r->ctx, "%s: stopping the attempt", err.msg);
        ev_timer_stop(loop, w);
        run_kill(r);
    } else if (rc < 0) {
        /* An I/O error (an NFS server that does not answer, say) is not a
         * lost lease: renewals come every lease/4, so three can fail before
         * another node may judge the lock stale. */
        log_warning(&r->ctx, "%s; retrying at the next renewal", err.msg);
    }
}

static void
run_timeout_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct run *r = w->data;

    (void)revents;
    if (r->exited) {
        /* finishing: the processor's tree is gone; its validation and
         * publication are bounded by helper_timeout_secs */
        if (!r->out_eof)
            run_drain_cb(loop, &r->drain_w, EV_TIMER);
        return;
    }
    r->timed_out = true;
    log_warning(&r->ctx, "attempt timed out after %.0f s: stopping it", r->timeout);
    run_kill(r);
}

/*
 * The attempt's environment: the variables of esd's that attempt_env
 * names (never systemd's for esd), the login variables of the user it
 * runs as, esd's PATH, and what the Ray head needs; attempt_prepare adds
 * spec §8.4's. Nothing else of esd's: its environment is the operator's
 * (or root's), not the job owner's to read.
 */
static struct strv
attempt_env(const struct esd_conf *c, const struct spawn_cred *cred)
{
    struct strv env;

    strv_init(&env);
    spawn_env_base(&c->attempt_env, cred, notify_env_private, &env);
    ray_env(&env);
    return env;
}

/* The processor runs: its output, its end, its lease and its timeout are
 * watched. */
static void
run_started(struct run *r)
{
    r->running = true;
    /* non-blocking: a callback must never block the loop (run_out_cb
     * treats EAGAIN as "nothing yet") */
    fcntl(r->child.out_fd, F_SETFL, fcntl(r->child.out_fd, F_GETFL) | O_NONBLOCK);
    ev_io_init(&r->out_w, run_out_cb, r->child.out_fd, EV_READ);
    r->out_w.data = r;
    ev_io_start(R.loop, &r->out_w);
    /* A warm attempt's keeper was forked by the warm processor, not by esd,
     * so esd gets no SIGCHLD for it: the end of its report pipe stands in
     * for its exit. */
    if (r->warm) {
        ev_io_init(&r->rep_w, run_rep_cb, r->child.report_fd, EV_READ);
        r->rep_w.data = r;
        ev_io_start(R.loop, &r->rep_w);
    } else {
        ev_child_init(&r->child_w, run_child_cb, r->child.pid, 0);
        r->child_w.data = r;
        ev_child_start(R.loop, &r->child_w);
    }
    if (!ev_is_active(&r->beat_w))
        ev_timer_start(R.loop, &r->beat_w);
    /* (a gated attempt's time counts once it is let run) */
    if (r->timeout > 0 && !r->gated)
        ev_timer_start(R.loop, &r->timeout_w);
}

/* The attempt could not start: it ends as an infrastructure failure
 * (run_outcome), since nothing of the recipe ran and a shard must not use
 * up its retries on a node that cannot fork or open a log. */
static void
run_start_failed(struct run *r, const char *why)
{
    r->start_failed = true;
    snprintf(r->error, sizeof(r->error), "%s", why);
    log_warning(&r->ctx, "cannot start the attempt: %s", why);
    if (r->log_fd >= 0)
        dprintf(r->log_fd, "\nUnable to start Data-Juicer: %s\n", why);
    r->exited = r->out_eof = true;
    run_finish(r);
}

/* Starts the processor under a keeper of esd's (spawn_keep). */
static void
run_exec(struct run *r)
{
    struct spawn_keep_opts keep = { .grace = r->grace, .cgroup = r->cgroup };
    const struct spawn_cred *cred = r->cred.uid ? &r->cred : NULL;
    struct esd_err err;

    /* The cgroup is containment on top of the keeper, which kills the
     * processor's tree on its own (run_kill); without the cgroup only what
     * escapes the keeper's reach may outlive the attempt, which is not
     * worth failing the attempt for. */
    if (r->cgroup &&
        spawn_keep(r->cmd.argv, r->cmd.envp, r->cmd.cwd, cred, &keep, &r->child, &err) < 0) {
        /* (a cgroup the keeper could not enter, say: try once without) */
        log_warning(&r->ctx, "%s; starting it again without a cgroup of its own", err.msg);
        contain_end(r->cgroup);
        keep.cgroup = r->cgroup = NULL;
    }
    if (!r->cgroup &&
        spawn_keep(r->cmd.argv, r->cmd.envp, r->cmd.cwd, cred, &keep, &r->child, &err) < 0) {
        run_start_failed(r, err.msg);
        return;
    }
    run_started(r);
    log_info(&r->ctx, "started %s (pid %d, its keeper %d) on Ray %s", r->cmd.argv[0],
             (int)r->child.proc, (int)r->child.pid, r->ray_addr);
}

/* The warm processor's answer (warm_done_fn). */
static void
run_warm_cb(void *arg, pid_t pid, const char *why)
{
    struct run *r = arg;

    r->warm_pending = false;
    /* No fork, or the attempt was stopped or lost its lease while the warm
     * processor was asked: a fork (if any) is let go by closing its go pipe
     * unwritten. Stopped or lost, the attempt ends without having run
     * (run_outcome classes it by those flags); otherwise it is exec'd. */
    if (pid <= 0 || r->stopped || r->lease_lost) {
        /* (a fork that waits for its go ends at this end of file) */
        close(r->go_w);
        r->go_w = -1;
        if (r->gate_w >= 0) {
            close(r->gate_w);
            r->gate_w = -1;
        }
        close(r->child.out_fd);
        close(r->child.report_fd);
        r->child.out_fd = r->child.report_fd = -1;
        r->child.pid = 0;
        if (r->stopped || r->lease_lost) {
            r->exited = r->out_eof = true;
            run_finish(r);
            return;
        }
        if (r->gated) {
            /* claimed ahead: exec'd, it would run at once; it waits for
             * its slot like the others */
            log_notice(&r->ctx,
                       "%s: the attempt claimed ahead starts on its own once a slot "
                       "is free",
                       why);
            r->exec_gated = true;
            run_open_gates();
            return;
        }
        log_notice(&r->ctx, "%s: starting the attempt on its own", why);
        run_exec(r);
        return;
    }
    r->warm = true;
    r->child.pid = pid;
    r->child.proc = 0;
    /* (its time counts from here: not the wait for a warm processor to
     * be ready, which is no time of the job's processor) */
    if (!r->gated)
        r->ran_at = time_mono();
    /* in its cgroup before it starts anything */
    if (r->cgroup && contain_move(r->cgroup, pid) < 0) {
        log_warning(&r->ctx,
                    "cannot move the warm processor's fork %ld into the attempt's "
                    "cgroup: %s; its keeper alone contains it",
                    (long)pid, strerror(errno));
        contain_end(r->cgroup);
        r->cgroup = NULL;
    }
    if (write(r->go_w, "g", 1) != 1)
        log_warning(&r->ctx, "cannot tell the warm processor's fork to go: %s", strerror(errno));
    close(r->go_w);
    r->go_w = -1;
    run_started(r);
    log_info(&r->ctx, "started %s (its keeper %ld, forked by the warm processor%s) on Ray %s",
             r->cmd.argv[1], (long)pid,
             r->gated ? ", claimed ahead: it runs once a slot is "
                        "free"
                      : "",
             r->ray_addr);
    if (r->gated)
        run_open_gates();
}

/* Asks the job's warm processor for the attempt; false when it cannot
 * (the caller execs it). */
static bool
run_warm_ask(struct run *r)
{
    int out[2], rep[2], go[2], gate[2] = { -1, -1 };
    struct warm_req rq = { 0 };
    bool ok;

    if (r->gated && pipe2(gate, O_CLOEXEC) < 0)
        return false;
    if (pipe2(out, O_CLOEXEC) < 0) {
        if (gate[0] >= 0) {
            close(gate[0]);
            close(gate[1]);
        }
        return false;
    }
    if (pipe2(rep, O_CLOEXEC) < 0) {
        close(out[0]);
        close(out[1]);
        goto no_rep;
    }
    if (pipe2(go, O_CLOEXEC) < 0) {
        close(out[0]);
        close(out[1]);
        close(rep[0]);
        close(rep[1]);
        goto no_rep;
    }
    rq.argv = r->cmd.argv + 2;
    rq.envp = r->cmd.envp;
    rq.cwd = r->cmd.cwd;
    rq.python = r->cmd.argv[0];
    rq.runner = r->cmd.argv[1];
    rq.cred = r->cred.uid ? &r->cred : NULL;
    rq.grace = r->grace;
    rq.out_w = out[1];
    rq.rep_w = rep[1];
    rq.go_r = go[0];
    rq.gate_r = gate[0];
    ok = warm_request(r->job, &rq, run_warm_cb, r) == 0;
    close(out[1]);
    close(rep[1]);
    close(go[0]);
    if (gate[0] >= 0)
        close(gate[0]);
    if (!ok) {
        close(out[0]);
        close(rep[0]);
        close(go[1]);
        if (gate[1] >= 0)
            close(gate[1]);
        return false;
    }
    r->gate_w = gate[1];
    fcntl(rep[0], F_SETFL, fcntl(rep[0], F_GETFL) | O_NONBLOCK);
    r->child.out_fd = out[0];
    r->child.report_fd = rep[0];
    r->go_w = go[1];
    r->warm_pending = true;
    return true;
no_rep:
    if (gate[0] >= 0) {
        close(gate[0]);
        close(gate[1]);
    }
    return false;
}

/*
 * Before the global stage runs (as the job's owner): the job directory's
 * file system must hold what it writes, at most its input three times
 * (Data-Juicer's export, processed.jsonl, the final output) and a margin,
 * or the attempt fails at once as an infrastructure failure that says so,
 * instead of filling the disk an hour into its run.
 */
#define GSTAGE_SPACE_MARGIN ((unsigned long long)64 << 20)

static int
gstage_space_check(struct run *r, struct esd_err *err)
{
    const struct manifest_shard *in = &r->m->shards[0];
    unsigned long long size, need, avail;
    struct statvfs vfs;
    struct stat st;
    char *path = fs_join(r->m->job_dir, in->path);
    int rc = 0;

    if (in->size_bytes >= 0)
        size = (unsigned long long)in->size_bytes;
    else if (stat(path, &st) == 0)
        size = (unsigned long long)st.st_size;
    else
        size = 0;
    if (statvfs(r->m->job_dir, &vfs) < 0) {
        rc = err_sys(err, -errno, "cannot look at the free space of %s", r->m->job_dir);
    } else {
        avail = (unsigned long long)vfs.f_bavail * (unsigned long long)vfs.f_frsize;
        need = 3 * size + GSTAGE_SPACE_MARGIN;
        if (avail < need)
            rc = err_set(err, -ENOSPC,
                         "not enough free space for the global stage in %s: %llu MiB free, "
                         "%llu MiB needed (three times its input %s and a margin)",
                         r->m->job_dir, avail >> 20, need >> 20, path);
    }
    free(path);
    return rc;
}

static void
run_begin(struct job *j, struct claim *cl, bool ahead)
{
    const struct esd_conf *c = R.conf;
    struct run *r = xcalloc(1, sizeof(*r));
    struct attempt_opts ao = { 0 };
    struct esd_err err;
    struct strv env;
    struct fsid prev;
    const char *addr = ray_address();
    bool as_owner = geteuid() == 0 && !c->run_mode; /* (esd run: its caller's own job) */

    r->job = j;
    r->cl = *cl; /* the run owns the claim now; the caller's copy is emptied */
    memset(cl, 0, sizeof(*cl));
    if (j->gstage && gstage_is(r->cl.shard_id)) {
        r->m = &j->gm;
        r->claimer = &j->gclaimer;
    } else {
        r->m = &j->m;
        r->claimer = &j->claimer;
    }
    /* the global stage reads what every shard wrote: the time of one
     * attempt a shard */
    r->timeout = (double)c->attempt_timeout_secs;
    if (r->m == &j->gm)
        r->timeout *= (double)(j->m.nshards ? j->m.nshards : 1);
    r->ctx.job = &j->log;
    r->ctx.shard = r->cl.shard_id;
    r->ctx.attempt = r->cl.attempt_number;
    r->log_fd = r->go_w = r->gate_w = -1;
    r->child.out_fd = r->child.report_fd = -1;
    r->started = r->ran_at = time_mono();
    r->gated = ahead;
    r->grace = (double)c->attempt_kill_grace_secs;
    /* The head's generation now: a non-zero exit after it changed is the
     * head's loss, not the recipe's failure (run_outcome). */
    r->ray_gen = ray_generation();
    snprintf(r->ray_addr, sizeof(r->ray_addr), "%s", addr ? addr : r->m->ray_address);
    buf_init(&r->line);
    buf_init(&r->fin_out);
    r->next = R.head;
    R.head = r;
    R.n++;
    metrics_set_running(R.n);
    j->running++;
    /* Recorded before anything here can fail, so that a crash of esd from
     * now on leaves a record for the restarted esd to take the lock back
     * by (jobs.h), instead of waiting out the lease. */
    jobs_claim_record(j, &r->cl);
    ev_timer_init(&r->grace_w, run_grace_cb, r->grace + KEEPER_SLACK, 0);
    r->grace_w.data = r;
    ev_timer_init(&r->drain_w, run_drain_cb, OUT_DRAIN, 0);
    r->drain_w.data = r;
    /* lease/4: three renewals may fail before the lock can be judged
     * stale by another node (claim.h) */
    ev_timer_init(&r->beat_w, run_beat_cb, (double)r->cl.lease_secs / 4.0,
                  (double)r->cl.lease_secs / 4.0);
    r->beat_w.data = r;
    ev_timer_init(&r->timeout_w, run_timeout_cb, r->timeout, 0);
    r->timeout_w.data = r;

    ao.processor = c->processor.n ? (const char *const *)c->processor.v : NULL;
    ao.dj_root = c->dj_root;
    ao.python = c->dj_python;
    ao.ray_address = r->ray_addr;
    /* Data-Juicer's own processor runs as esd-dj, which keeps the input
     * order */
    ao.dj_python = jobs_dj_python();
    ao.dj_runner = R.dj_runner;
    /* the owner as the user database has it (not the job directory's
     * group); esd's own user when it does not run as root */
    if (spawn_cred_for_uid(as_owner ? j->uid : geteuid(), &r->cred, &err) < 0) {
        run_start_failed(r, err.msg);
        return;
    }
    env = attempt_env(c, &r->cred);
    if (!as_owner) /* (uid 0 in r->cred says: as esd itself) */
        r->cred.uid = 0;
    ao.env = env.v;
    /* the attempt directory and process.log are the job owner's */
    prev = jobs_fs_owner(j);
    if (r->m == &j->gm && gstage_space_check(r, &err) < 0) {
        jobs_fs_restore(prev);
        strv_free(&env);
        run_start_failed(r, err.msg);
        return;
    }
    if (attempt_prepare(r->m, &r->cl, &ao, &r->cmd, &err) < 0) {
        jobs_fs_restore(prev);
        strv_free(&env);
        run_start_failed(r, err.msg);
        return;
    }
    strv_free(&env);
    /* truncated, as the reference's (spec §8.4): a directory is one
     * attempt's, so there is nothing earlier in it to keep */
    r->log_fd = fs_open_job(r->cmd.log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644, 0, NULL, &err);
    jobs_fs_restore(prev);
    if (r->log_fd < 0) {
        run_start_failed(r, err.msg);
        return;
    }
    r->cgroup = contain_begin(r->cl.token);
    /* the lease is renewed from the claim on, whoever starts it: the wait
     * for a warm fork or for a slot (claimed ahead) may outlast a lease */
    ev_timer_start(R.loop, &r->beat_w);
    if (c->dj_warm && ao.dj_python && ao.dj_runner && run_warm_ask(r)) {
        log_debug(&r->ctx, "asked the warm processor for the attempt%s",
                  ahead ? " (claimed ahead)" : "");
        return;
    }
    if (r->gated) {
        r->gated = false;
        r->ran_at = time_mono();
    }
    run_exec(r);
}

void
runner_start(struct job *j, struct claim *cl)
{
    run_begin(j, cl, false);
}

bool
runner_can_start_ahead(const struct job *j)
{
    /* (the global stage's processor need not wait at a Ray executor's
     * gate: it waits for nothing) */
    return !j->gstage && R.conf->dj_warm && jobs_dj_python() && R.dj_runner && warm_ready(j);
}

void
runner_start_ahead(struct job *j, struct claim *cl)
{
    run_begin(j, cl, runner_can_start_ahead(j));
}

/* ---- finishing: validation and publication in a child ---- */

/* What the runner saw of the attempt (outcome_classify decides what it
 * means), and out's times and addresses. */
static void
run_facts(const struct run *r, struct outcome_facts *f, struct attempt_outcome *out)
{
    char iso[40];
    double now = time_mono(), wall, end = r->ended_at > 0 ? r->ended_at : now;

    memset(f, 0, sizeof(*f));
    memset(out, 0, sizeof(*out));
    f->stopped = r->stopped;
    f->start_error = r->start_failed ? r->error : NULL;
    f->lease_error = r->lease_lost ? r->error : NULL;
    f->ran = r->running;
    f->status = r->status;
    f->timed_out = r->timed_out;
    f->timeout_secs = r->timeout;
    f->ray_restarted = R.conf->ray_mode == RAY_PERSISTENT && ray_generation() != r->ray_gen;
    /* the processor's time: from when it was let run to its end, measured
     * on the monotonic clock and only then placed on the wall clock, so a
     * clock step during the attempt does not change its duration */
    time_iso_now(iso, &wall);
    out->duration = end - r->ran_at;
    out->started_epoch = wall - (now - r->ran_at);
    out->ended_epoch = wall - (now - end);
    out->ray_address = r->ray_addr;
}

/* In the finishing child: validate, publish, report one JSON line.
 * Validation reads the whole result and publication does fenced link and
 * rename calls on the shared file system, either of which can block for
 * long on NFS: in a child, bounded by helper_timeout_secs, the event loop
 * and every other attempt go on. */
static void __attribute__((noreturn)) finish_child(struct run *r, int fd)
{
    struct outcome_facts f;
    struct attempt_outcome out;
    struct attempt_result res = { 0 };
    struct attempt_final fin = { 0 };
    struct esd_err err, merr;
    char msg[OUTCOME_MSG_MAX];
    bool have_result = false;
    cJSON *rep = cJSON_CreateObject();
    struct buf b;
    int rc;

    run_facts(r, &f, &out);
    if (outcome_classify(&f, &out, msg, sizeof(msg))) {
        f.validated = true;
        f.result_rc = attempt_materialize(r->m, &r->cl, NULL, &res, &merr);
        f.result_error = merr.msg;
        have_result = f.result_rc >= 0;
        outcome_classify(&f, &out, msg, sizeof(msg));
    }
    rc = attempt_finish(r->claimer, &r->cl, &out, have_result ? &res : NULL, &fin, &err);
    json_add_bool(rep, "ok", rc == 0);
    if (rc < 0)
        json_add_str(rep, "finish_error", err.msg);
    json_add_str(rep, "status", rc == 0 ? fin.status : "");
    json_add_bool(rep, "shard_done", fin.shard_done);
    json_add_bool(rep, "shard_failed", fin.shard_failed);
    json_add_bool(rep, "shard_left", fin.shard_left);
    json_add_int(rep, "rows", have_result ? (long long)res.rows : 0);
    json_add_int(rep, "bytes", have_result ? (long long)res.size_bytes : 0);
    json_add_float(rep, "duration", out.duration);
    if (out.error)
        json_add_str(rep, "error", out.error);
    if (attempt_class_name(out.fc))
        json_add_str(rep, "class", attempt_class_name(out.fc));
    buf_init(&b);
    json_dump(rep, JSON_COMPACT, &b);
    buf_putc(&b, '\n');
    (void)helper_write(fd, b.p, b.len);
    _exit(0);
}

static void
run_report(struct run *r)
{
    struct job *j = r->job;
    struct attempt_final fin = { 0 };
    cJSON *rep = NULL;
    const char *status = "", *error, *cls = NULL;
    bool ok = false, done = false, failed = false, left = false;
    double duration = time_mono() - r->ran_at, dv;
    long long rows = 0, bytes = 0;

    if (WIFEXITED(r->fin_status) && WEXITSTATUS(r->fin_status) == 0 &&
        json_parse_object(r->fin_out.p ? r->fin_out.p : "", r->fin_out.len, "report", &rep, NULL) ==
            0 &&
        json_get_bool(rep, "ok", &ok) && ok) {
        status = json_get_str(rep, "status");
        json_get_bool(rep, "shard_done", &done);
        json_get_bool(rep, "shard_failed", &failed);
        json_get_bool(rep, "shard_left", &left);
        json_get_int(rep, "rows", &rows);
        json_get_int(rep, "bytes", &bytes);
        if (json_get_num(rep, "duration", &dv) == 0)
            duration = dv;
        error = json_get_str(rep, "error");
        cls = json_get_str(rep, "class");
        if (!strcmp(status, "done")) {
            log_event(LOG_LVL_INFO, &r->ctx, MSGID_DONE, "done: %lld rows in %.1f s", rows,
                      duration);
            j->done_here++;
            j->rows_here += (unsigned long long)rows;
        } else if (!strcmp(status, "failed")) {
            log_event(LOG_LVL_WARNING, &r->ctx, MSGID_FAILED, "failed (%s)%s: %s", cls ? cls : "?",
                      failed ? ", no retries left: the shard failed"
                      : left ? ", its retries used up by this node alone: left to the other "
                               "nodes"
                             : "",
                      error ? error : "");
            j->failed_here++;
        } else if (!strcmp(status, "released")) {
            log_info(&r->ctx, "released: %s", error ? error : "stopped");
        } else {
            log_warning(&r->ctx, "%s: %s", status, error ? error : "");
        }
        snprintf(fin.status, sizeof(fin.status), "%s", status);
        metrics_attempt(j, status, cls, duration, (uint64_t)rows, (uint64_t)bytes);
    } else {
        const char *why = rep ? json_get_str(rep, "finish_error") : NULL;
        char how[96], what[160];

        helper_describe(r->fin_status, how);
        snprintf(what, sizeof(what), "the finishing process %s%s",
                 r->fin_guard.fired ? "was killed: " : "failed: ", how);
        log_err(&r->ctx, "could not finish the attempt: %s; its lock stays until its lease ends",
                why ? why : what);
        done = failed = false;
        snprintf(fin.status, sizeof(fin.status), "error");
    }
    /* (after an error the record stays: a restart takes the lock back) */
    if (strcmp(fin.status, "error"))
        jobs_claim_forget(j, &r->cl);
    fin.shard_done = done;
    fin.shard_failed = failed;
    fin.index = r->cl.index;
    /* counted: the failures that use up the shard's retries (spec §8.7's
     * limit); infrastructure ones have their own budget
     * (max_infra_failures, 10 by default) */
    fin.counted = cls && (!strcmp(cls, "processor") || !strcmp(cls, "output"));
    jobs_attempt_ended(j, &fin);
    claimer_forget(r->claimer, &r->cl, done, failed);
    cJSON_Delete(rep);
    j->running--;
    run_free(r);
    if (R.done)
        R.done(j, &fin);
}

static void
run_fin_io_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    struct run *r = w->data;
    char chunk[4096];
    ssize_t n = read(w->fd, chunk, sizeof(chunk));

    (void)revents;
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n > 0)
        helper_guard_fed(&r->fin_guard, loop);
    /* The report is one short line; past 1 MiB the rest is read and
     * dropped (so the child never blocks on a full pipe) and the report
     * will not parse. */
    if (n > 0 && r->fin_out.len < (1u << 20)) {
        buf_append(&r->fin_out, chunk, (size_t)n);
        return;
    }
    if (n > 0)
        return;
    ev_io_stop(loop, w);
    close(w->fd);
    r->fin_eof = true;
    if (r->fin_exited)
        run_report(r);
}

static void
run_fin_child_cb(struct ev_loop *loop, ev_child *w, int revents)
{
    struct run *r = w->data;

    (void)revents;
    ev_child_stop(loop, w);
    helper_guard_stop(&r->fin_guard, loop);
    r->fin_exited = true;
    r->fin_status = w->rstatus;
    if (r->fin_eof)
        run_report(r);
}

static void
run_finish(struct run *r)
{
    struct helper_id who;
    struct esd_err err;
    int fd;
    pid_t pid;

    if (r->log_fd >= 0) {
        close(r->log_fd);
        r->log_fd = -1;
    }
    /* the job owner's, as the attempt was (the child leaves root for good) */
    jobs_helper_id(r->job, &who);
    if ((pid = helper_fork("finishing", &who, &fd, &err)) < 0) {
        /* cannot even fork: the lock stays and turns stale; say so */
        log_err(&r->ctx, "%s", err.msg);
        r->fin_status = 1;
        r->fin_exited = r->fin_eof = true;
        run_report(r);
        return;
    }
    if (pid == 0)
        finish_child(r, fd);
    r->fin_pid = pid;
    helper_guard_start(&r->fin_guard, R.loop, pid, "finishing", &r->ctx,
                       (double)R.conf->helper_timeout_secs);
    ev_io_init(&r->fin_w, run_fin_io_cb, fd, EV_READ);
    r->fin_w.data = r;
    ev_io_start(R.loop, &r->fin_w);
    ev_child_init(&r->fin_child_w, run_fin_child_cb, pid, 0);
    r->fin_child_w.data = r;
    ev_child_start(R.loop, &r->fin_child_w);
}

/* ---- the lot ---- */

void
runner_stop_all(void)
{
    runner_stop_job(NULL);
}

void
runner_stop_job(const struct job *j)
{
    struct run *next;

    /* (run_kill may end an attempt that never started: next first) */
    for (struct run *r = R.head; r; r = next) {
        next = r->next;
        if ((!j || r->job == j) && r->warm_pending)
            r->stopped = true; /* (run_warm_cb ends it) */
        else if ((!j || r->job == j) && (r->running || r->exec_gated) && !r->exited) {
            r->stopped = true;
            run_kill(r);
        }
    }
}

void
runner_stop_gated(void)
{
    struct run *next;

    for (struct run *r = R.head; r; r = next) {
        next = r->next;
        if (r->gated && !r->exited && !r->stopped) {
            r->stopped = true;
            if (!r->warm_pending)
                run_kill(r);
        }
    }
}

cJSON *
runner_status_json(void)
{
    cJSON *a = cJSON_CreateArray();

    for (struct run *r = R.head; r; r = r->next) {
        cJSON *o = cJSON_CreateObject();

        json_add_str(o, "job_id", r->job->m.job_id);
        json_add_str(o, "job_dir", r->job->job_dir);
        json_add_str(o, "shard_id", r->cl.shard_id);
        json_add_int(o, "attempt", r->cl.attempt_number);
        if (r->running)
            json_add_int(o, "pid", (long long)r->child.proc);
        json_add_float(o, "running_secs", time_mono() - r->started);
        json_add_str(o, "phase",
                     r->exited         ? "finishing"
                     : r->killing      ? "stopping"
                     : r->warm_pending ? "starting"
                     : r->gated        ? "ahead"
                                       : "running");
        cJSON_AddItemToArray(a, o);
    }
    return a;
}

void
runner_fini(void)
{
    /* only called once every attempt has ended */
    while (R.head)
        run_free(R.head);
    free(R.dj_runner);
    R.dj_runner = NULL;
}
