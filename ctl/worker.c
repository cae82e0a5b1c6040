/*
 * worker: `esctl worker`, a synchronous worker in the manner of the
 * reference's `shard_job.py worker`, on esd's engine: claim a shard, run
 * the processor in its own process group under a keeper that ends every
 * process it starts (spawn_keep) with its output in process.log,
 * renew the lease every lease/4, enforce the attempt timeout, validate and
 * publish, and claim again; when nothing is claimable, wait (jittered) and
 * poll until the job is terminal. SIGINT/SIGTERM stop the running attempt
 * and release its claim without counting a failure.
 *
 * The daemon drives the same engine from its event loop; this loop is what
 * an operator runs without a daemon, and what the multi-process tests run.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "attempt.h"
#include "claim.h"
#include "djversion.h"
#include "esctl.h"
#include "fsutil.h"
#include "json.h"
#include "jsonl.h"
#include "manifest.h"
#include "outcome.h"
#include "pypath.h"
#include "sha256.h"
#include "spawn.h"

static volatile sig_atomic_t stop_requested;

static void
on_stop(int sig)
{
    (void)sig;
    stop_requested = 1;
}

/* The default node name: the host name, made a valid file name. */
static char *
default_node(void)
{
    char host[256];

    if (gethostname(host, sizeof(host)) < 0)
        snprintf(host, sizeof(host), "node");
    host[sizeof(host) - 1] = '\0';
    for (char *p = host; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '_' || *p == '-'))
            *p = '-';
    if (host[0] == '.' || !host[0])
        host[0] = 'n';
    return xstrdup(host);
}

struct run {
    struct spawned child;
    int log_fd;
    bool exited;
    int status;
    bool lease_lost;
    bool timed_out;
    bool stopped;
    char lease_error[ESD_ERR_MAX];
};

/* Copies what the child wrote to process.log (and to stderr when asked). */
static bool
pump_output(struct run *run, bool echo, const char *id)
{
    char buf[65536];
    ssize_t n = read(run->child.out_fd, buf, sizeof(buf));

    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return true;
    if (n <= 0)
        return false;
    (void)fs_write_all(run->log_fd, buf, (size_t)n);
    if (echo) {
        /* prefix each line with the shard, as the daemon's journal does */
        const char *p = buf, *end = buf + n;
        while (p < end) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            size_t len = nl ? (size_t)(nl - p) + 1 : (size_t)(end - p);
            fprintf(stderr, "[%s] %.*s%s", id, (int)len, p, nl ? "" : "\n");
            p += len;
        }
    }
    return true;
}

/* Seconds from SIGTERM to SIGKILL of the attempt's tree (its keeper's,
 * spawn_keep), the backstop after that for a keeper that did not, and how
 * long the output may stay open once the tree is gone (held by a process
 * outside it, which the worker never waits on). */
#define KILL_GRACE 10.0
#define KEEPER_SLACK 5.0
#define OUT_DRAIN 2.0

/* Reaps the keeper (blocking or not); true once it is gone, with the
 * program's wait status in run->status. */
static bool
reap(struct run *run, bool block)
{
    int st;
    pid_t p;

    while ((p = waitpid(run->child.pid, &st, block ? 0 : WNOHANG)) < 0 && errno == EINTR)
        ;
    if (p != run->child.pid)
        return false;
    run->exited = true;
    if (spawn_keep_status(&run->child, st, &run->status) < 0) {
        /* killed without a word: its program died with it (PDEATHSIG);
         * what stayed in the group must not keep the pipe open */
        spawn_signal(&run->child, SIGKILL);
    }
    return true;
}

/* Stops the attempt: SIGTERM to its group (the keeper passes it on to what
 * left the group, and kills the whole tree KILL_GRACE later), SIGKILL to
 * the group if the keeper is still there KEEPER_SLACK after that. */
static void
terminate(struct run *run)
{
    double deadline = time_mono() + KILL_GRACE + KEEPER_SLACK;

    spawn_signal(&run->child, SIGTERM);
    while (!reap(run, false)) {
        if (time_mono() >= deadline) {
            spawn_signal(&run->child, SIGKILL);
            reap(run, true);
            break;
        }
        poll(NULL, 0, 50);
    }
}

/* Runs the attempt until it exits, is timed out, loses its lease or the
 * worker is stopped, then reads its output until end of file, at most
 * OUT_DRAIN seconds. The lease is renewed until then. */
static void
supervise(struct run *run, const struct claim *cl, double timeout, bool echo)
{
    double start = time_mono(), beat_every = (double)cl->lease_secs / 4.0;
    double next_beat = start + beat_every, drain_until = 0;
    bool out_open = true, lost = false;

    while (!run->exited || out_open) {
        struct pollfd pfd = { .fd = run->child.out_fd, .events = POLLIN };
        double now = time_mono(), wake = next_beat;
        int ms;

        if (!run->exited && reap(run, false))
            drain_until = now + OUT_DRAIN;
        if (run->exited && out_open && now >= drain_until) {
            fprintf(stderr,
                    "esctl worker: %s: the output is still open after the processor's "
                    "process tree ended (a process outside it holds it): closing it\n",
                    cl->shard_id);
            break;
        }
        if (!run->exited && stop_requested) {
            run->stopped = true;
            terminate(run);
            drain_until = time_mono() + OUT_DRAIN;
            continue;
        }
        if (!run->exited && timeout > 0 && now - start >= timeout) {
            run->timed_out = true;
            terminate(run);
            drain_until = time_mono() + OUT_DRAIN;
            continue;
        }
        if (!lost && now >= next_beat) {
            struct esd_err err;
            int r = claim_heartbeat(cl, &err);

            if (r == -ESTALE) {
                lost = true;
                if (!run->exited) {
                    run->lease_lost = true;
                    snprintf(run->lease_error, sizeof(run->lease_error), "%s", err.msg);
                    terminate(run);
                    drain_until = time_mono() + OUT_DRAIN;
                    continue;
                }
            } else if (r < 0) {
                fprintf(stderr, "esctl worker: %s; retrying\n", err.msg);
            }
            next_beat = now + beat_every;
            wake = next_beat;
        }
        if (!run->exited && timeout > 0 && start + timeout < wake)
            wake = start + timeout;
        if (run->exited && drain_until < wake)
            wake = drain_until;
        if (!out_open) {
            poll(NULL, 0, 50);
            continue;
        }
        ms = (int)((wake - now) * 1000) + 1;
        if (ms > 1000 || ms < 1)
            ms = ms < 1 ? 1 : 1000; /* also the period of waitpid and stop checks */
        if (poll(&pfd, 1, ms) > 0)
            out_open = pump_output(run, echo, cl->shard_id);
    }
}

struct worker_cfg {
    struct attempt_opts aopts;
    char *dj_version;            /* recorded in done records */
    char *dj_python, *dj_runner; /* esd-dj on Data-Juicer's interpreter, or NULL */
    struct jsonl_limits lim;
    double timeout;
    bool echo;
};

/* One claimed shard, start to end: *fin says how it ended. */
static int
run_claim(struct claimer *c, const struct claim *cl, const struct worker_cfg *w,
          struct attempt_final *fin, struct esd_err *err)
{
    struct attempt_cmd cmd = { 0 };
    struct attempt_result res = { 0 };
    struct attempt_outcome out = { 0 };
    struct outcome_facts f = { .timeout_secs = w->timeout };
    struct run run = { .log_fd = -1 };
    struct spawn_keep_opts keep = { .grace = KILL_GRACE };
    struct esd_err serr, e2; /* (err is attempt_finish's: out.error may point into these) */
    char msg[OUTCOME_MSG_MAX];
    double t0 = time_mono();
    int r;

    out.ray_address = w->aopts.ray_address;
    out.dj_commit = w->dj_version;
    if (attempt_prepare(c->m, cl, &w->aopts, &cmd, &serr) < 0) {
        /* cannot even build it: an infrastructure failure of this node */
        f.start_error = serr.msg;
    } else if ((run.log_fd = open(cmd.log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) <
               0) {
        err_sys(&serr, -errno, "cannot create %s", cmd.log_path);
        f.start_error = serr.msg;
    } else if (spawn_keep(cmd.argv, cmd.envp, cmd.cwd, NULL, &keep, &run.child, &serr) < 0) {
        dprintf(run.log_fd, "\nUnable to start Data-Juicer: %s\n", serr.msg);
        f.start_error = serr.msg;
    } else {
        supervise(&run, cl, w->timeout, w->echo);
        close(run.child.out_fd);
        f.ran = true;
        f.status = run.status;
        f.stopped = run.stopped;
        f.lease_error = run.lease_lost ? run.lease_error : NULL;
        f.timed_out = run.timed_out;
    }
    if (outcome_classify(&f, &out, msg, sizeof(msg))) {
        f.validated = true;
        f.result_rc = attempt_materialize(c->m, cl, &w->lim, &res, &e2);
        f.result_error = e2.msg;
        outcome_classify(&f, &out, msg, sizeof(msg));
    }
    if (run.log_fd >= 0)
        close(run.log_fd);
    out.duration = time_mono() - t0;
    r = attempt_finish(c, cl, &out, out.fc == FC_NONE && !out.released ? &res : NULL, fin, err);
    if (r == 0 && out.error)
        fprintf(stderr, "esctl worker: %s attempt %lld: %s\n", cl->shard_id, cl->attempt_number,
                out.error);
    attempt_result_free(&res);
    attempt_cmd_free(&cmd);
    return r;
}

/*
 * What the reference's worker checks before it claims (spec §8.1): this
 * node runs the job's Data-Juicer (unless --allow-version-mismatch), and
 * the recipe snapshot is the one the manifest hashed.
 */
static int
check_job(const struct call *c, const struct manifest *m, struct worker_cfg *w, struct esd_err *err)
{
    const char *snapshot = m->recipe_snapshot;
    const char *want = m->recipe_sha256;
    char hex[SHA256_HEX_LEN + 1], *path = NULL;
    struct djversion v;
    int r;

    /* (judged with how the version was read, or why it could not be) */
    djversion_read(&w->aopts, &v);
    w->dj_version = xstrdup(v.version);
    /* Data-Juicer's own processor runs as esd-dj, which keeps the input
     * order (attempt_opts) */
    if (v.python && (w->dj_runner = attempt_dj_runner())) {
        w->dj_python = xstrdup(v.python);
        w->aopts.dj_python = w->dj_python;
        w->aopts.dj_runner = w->dj_runner;
    }
    r = djversion_judge(m->dj_commit, &v, err);
    djversion_free(&v);
    if (r < 0) {
        if (!c->set[O_ALLOW_MISMATCH]) {
            size_t n = strlen(err->msg);
            snprintf(err->msg + n, sizeof(err->msg) - n,
                     "; use --allow-version-mismatch only if this is intentional");
            return r;
        }
        fprintf(stderr, "WARNING: %s\n", err->msg);
    }
    if ((r = pypath_join_inside(m->job_dir, snapshot ? snapshot : "recipe.yaml", &path, err)) < 0)
        return r;
    r = sha256_file(path, hex, err);
    free(path);
    if (r < 0)
        return r;
    if (want && strcmp(want, hex) != 0)
        return err_set(err, -EINVAL, "Recipe snapshot hash does not match manifest");
    return 0;
}

/* Sleeps up to secs, waking early on a stop request. */
static void
nap(double secs)
{
    double end = time_mono() + secs;

    while (!stop_requested && time_mono() < end)
        poll(NULL, 0, 100);
}

/* --max-line-bytes and --max-depth over the defaults. */
static void
limits_from(const struct call *c, struct jsonl_limits *lim)
{
    *lim = jsonl_default_limits;
    if (c->set[O_MAX_LINE_BYTES])
        lim->max_line = (size_t)c->num[O_MAX_LINE_BYTES];
    if (c->set[O_MAX_DEPTH])
        lim->max_depth = (unsigned)(c->num[O_MAX_DEPTH] > 4096 ? 4096 : c->num[O_MAX_DEPTH]);
}

int
worker_run(struct call *c)
{
    struct manifest m;
    struct claimer cl;
    struct claim_opts co = { 0 };
    struct worker_cfg w = { 0 };
    struct strv processor;
    struct esd_err err;
    struct sigaction sa;
    char *dir = NULL, *node = NULL;
    long long handled = 0, failed = 0;
    double poll_secs;
    int r, rc = EXIT_OK;

    if ((r = pypath_resolve_cli(c->str[O_JOB_DIR], &dir, &err)) < 0 ||
        (r = manifest_load(dir, &m, &err)) < 0) {
        free(dir);
        fprintf(stderr, "ERROR: %s\n", err.msg);
        return EXIT_ERROR;
    }
    free(dir);
    strv_init(&processor);
    node = c->set[O_NODE] ? xstrdup(c->str[O_NODE]) : default_node();
    co.node = node;
    co.lease_secs = c->set[O_LEASE_SECS] ? c->num[O_LEASE_SECS] : 0;
    co.lock_timeout = c->set[O_LOCK_TIMEOUT] ? c->num[O_LOCK_TIMEOUT] : 0;
    co.max_retries = c->set[O_MAX_RETRIES] ? c->num[O_MAX_RETRIES] : -1;
    co.max_infra = c->set[O_MAX_INFRA] ? c->num[O_MAX_INFRA] : 0;
    if (c->set[O_PROCESSOR]) {
        char *abs = call_processor_abs(c->str[O_PROCESSOR]);

        strv_split(&processor, abs);
        free(abs);
        if (!processor.n) {
            fprintf(stderr, "ERROR: --processor is empty\n");
            rc = EXIT_ERROR;
            goto out_manifest;
        }
        w.aopts.processor = (const char *const *)processor.v;
    }
    w.aopts.dj_root = c->str[O_DJ_ROOT];
    w.aopts.ray_address = c->str[O_RAY_ADDRESS];
    limits_from(c, &w.lim);
    w.timeout = c->set[O_ATTEMPT_TIMEOUT] ? (double)c->num[O_ATTEMPT_TIMEOUT] : 0;
    w.echo = c->set[O_VERBOSE];
    poll_secs =
        c->set[O_POLL_INTERVAL] ? (double)c->num[O_POLL_INTERVAL] : (double)m.poll_interval_secs;
    if ((r = check_job(c, &m, &w, &err)) < 0) {
        fprintf(stderr, "ERROR: %s\n", err.msg);
        rc = EXIT_ERROR;
        goto out_manifest;
    }
    if ((r = claimer_init(&cl, &m, &co, &err)) < 0) {
        fprintf(stderr, "ERROR: %s\n", err.msg);
        rc = EXIT_ERROR;
        goto out_manifest;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    printf("Worker %s (node %s, pid %d) started for %s\n", cl.hostname, cl.node, (int)getpid(),
           m.job_id);
    fflush(stdout);
    srand((unsigned)(getpid() ^ (unsigned)time(NULL)));
    while (!stop_requested) {
        struct claim claim;
        struct claim_idle idle;
        struct attempt_final fin;

        if (c->set[O_MAX_SHARDS] && handled >= c->num[O_MAX_SHARDS]) {
            printf("Reached --max-shards=%lld\n", c->num[O_MAX_SHARDS]);
            rc = failed ? EXIT_ERROR : EXIT_OK;
            break;
        }
        r = claim_acquire(&cl, &claim, &idle, &err);
        if (r < 0) {
            fprintf(stderr, "ERROR: %s\n", err.msg);
            rc = EXIT_ERROR;
            break;
        }
        if (r == 1) {
            printf("Claimed %s (attempt %lld)\n", claim.shard_id, claim.attempt_number);
            fflush(stdout);
            r = run_claim(&cl, &claim, &w, &fin, &err);
            handled++;
            if (r < 0) {
                fprintf(stderr, "ERROR: %s\n", err.msg);
                claim_free(&claim);
                rc = EXIT_ERROR;
                break;
            }
            if (!strcmp(fin.status, "failed"))
                failed++;
            printf("Finished %s: %s\n", claim.shard_id, fin.status);
            fflush(stdout);
            claim_free(&claim);
            continue;
        }
        if (idle.cancelled) {
            fprintf(stderr, "job cancelled on every node (esctl cancel --everywhere): no new "
                            "claims\n");
            rc = EXIT_ERROR;
            break;
        }
        if (idle.complete) {
            printf("All %zu shards completed\n", m.nshards);
            if (m.global_snapshot)
                printf("The recipe's global stage (%s) is not a worker's: it runs once, after "
                       "the merge of the shards, on an esd daemon the job is submitted to or "
                       "in esd run\n",
                       m.global_snapshot);
            break;
        }
        if (idle.terminal) {
            fprintf(stderr, "Job finished with failures: done=%zu failed=%zu\n", idle.done,
                    idle.failed);
            rc = EXIT_ERROR;
            break;
        }
        if (idle.more)
            continue; /* the pass stopped at its budget: go on at once */
        {
            /* Poll again when a lock could turn stale, at most every poll
             * interval, jittered so a fleet does not poll in step, and
             * not before the claimer's idle rate allows. */
            double wait = poll_secs;
            if (idle.next_secs >= 0 && idle.next_secs + 0.05 < wait)
                wait = idle.next_secs + 0.05;
            wait *= 0.8 + 0.4 * ((double)rand() / RAND_MAX);
            if (wait < idle.min_secs)
                wait = idle.min_secs < poll_secs ? idle.min_secs : poll_secs;
            printf("No shard claim available; done=%zu failed=%zu busy=%zu. Waiting %.1fs...\n",
                   idle.done, idle.failed, idle.busy, wait);
            fflush(stdout);
            nap(wait);
        }
    }
    if (stop_requested && rc == EXIT_OK)
        printf("Stopped\n");
    claimer_free(&cl);
out_manifest:
    manifest_free(&m);
    strv_free(&processor);
    free(w.dj_version);
    free(w.dj_python);
    free(w.dj_runner);
    free(node);
    return rc;
}
