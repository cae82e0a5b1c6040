/*
 * pipeline: one mutex and one condition variable over a small table of
 * chunk slots. Every thread, the caller's included, loops: take the most
 * advanced task there is (a later stage first, and in a stage the earliest
 * chunk, so that chunks drain and the source never runs far ahead), run it
 * unlocked, record its end. A chunk is a few MiB of work, so one lock per
 * stage of a chunk costs nothing measurable.
 */
#include "pipeline.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NO_SEQ UINT64_MAX

struct slot {
    void *chunk;
    uint64_t seq;
    size_t next; /* the next stage to run */
    bool used, busy;
    struct esd_err err;
};

struct pl {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    const struct pipeline_stage *st;
    size_t nst;
    void *ctx;
    struct slot *slot;
    size_t nslot, inuse;
    uint64_t *order;   /* per stage: the chunk an ordered stage takes next */
    uint64_t next_seq; /* the source's next chunk */
    bool source_busy, ended;
    uint64_t fail_seq; /* the earliest chunk that failed, or NO_SEQ */
    int fail_r;
    struct esd_err fail_err;
};

/* The next task, or NULL: *ret_stage is its stage (0: the source, on a
 * free slot). Called with the mutex held. */
static struct slot *
pick(struct pl *p, size_t *ret_stage)
{
    struct slot *best = NULL;

    for (size_t s = p->nst; s-- > 1 && !best;) {
        for (size_t i = 0; i < p->nslot; i++) {
            struct slot *x = &p->slot[i];

            if (!x->used || x->busy || x->next != s || (p->st[s].ordered && x->seq != p->order[s]))
                continue;
            if (!best || x->seq < best->seq)
                best = x;
        }
        *ret_stage = s;
    }
    if (best)
        return best;
    if (p->source_busy || p->ended || p->fail_seq != NO_SEQ)
        return NULL;
    for (size_t i = 0; i < p->nslot; i++)
        if (!p->slot[i].used) {
            *ret_stage = 0;
            return &p->slot[i];
        }
    return NULL;
}

static void
drop(struct pl *p, struct slot *x)
{
    x->used = false;
    p->inuse--;
}

/* Records the end of stage s of x with result r. Mutex held. */
static void
finish(struct pl *p, struct slot *x, size_t s, int r)
{
    x->busy = false;
    if (s == 0) {
        p->source_busy = false;
        if (r <= 0)
            p->ended = true;
        if (r == 0) {
            drop(p, x);
            return;
        }
        if (r > 0)
            p->next_seq++;
    }
    if (r < 0) {
        if (x->seq < p->fail_seq) {
            p->fail_seq = x->seq;
            p->fail_r = r;
            p->fail_err = x->err;
        }
        drop(p, x);
    } else {
        if (p->st[s].ordered)
            p->order[s]++;
        if (++x->next == p->nst)
            drop(p, x);
    }
    /* what comes after a failure is never needed */
    for (size_t i = 0; p->fail_seq != NO_SEQ && i < p->nslot; i++) {
        struct slot *y = &p->slot[i];

        if (y->used && !y->busy && y->seq > p->fail_seq)
            drop(p, y);
    }
}

static void *
worker(void *arg)
{
    struct pl *p = arg;

    pthread_mutex_lock(&p->mu);
    for (;;) {
        size_t s = 0;
        struct slot *x;
        int r;

        if ((p->ended || p->fail_seq != NO_SEQ) && p->inuse == 0 && !p->source_busy)
            break;
        if (!(x = pick(p, &s))) {
            pthread_cond_wait(&p->cv, &p->mu);
            continue;
        }
        if (s == 0) {
            x->used = true;
            x->seq = p->next_seq;
            x->next = 0;
            p->inuse++;
            p->source_busy = true;
        }
        x->busy = true;
        pthread_mutex_unlock(&p->mu);
        r = p->st[s].run(p->ctx, x->chunk, x->seq, &x->err);
        pthread_mutex_lock(&p->mu);
        finish(p, x, s, r);
        pthread_cond_broadcast(&p->cv);
    }
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int
pipeline_run(const struct pipeline_stage *stages, size_t nstages, void *ctx, void **chunks,
             size_t nchunks, unsigned nthreads, struct esd_err *err)
{
    struct pl p = { 0 };
    pthread_t *th = NULL;
    unsigned started = 0;
    int r = 0;

    p.st = stages;
    p.nst = nstages;
    p.ctx = ctx;
    p.nslot = nchunks;
    p.slot = xcalloc(nchunks, sizeof(*p.slot));
    for (size_t i = 0; i < nchunks; i++)
        p.slot[i].chunk = chunks[i];
    p.order = xcalloc(nstages, sizeof(*p.order));
    p.fail_seq = NO_SEQ;
    pthread_mutex_init(&p.mu, NULL);
    pthread_cond_init(&p.cv, NULL);
    if (nthreads > 1) {
        sigset_t all, old;

        th = xcalloc(nthreads - 1, sizeof(*th));
        /* signals stay the caller's: its handlers, its EINTR */
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        /* a thread that cannot start leaves its share to the others */
        while (started < nthreads - 1 && pthread_create(&th[started], NULL, worker, &p) == 0)
            started++;
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    worker(&p);
    for (unsigned i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    if (p.fail_seq != NO_SEQ) {
        r = p.fail_r;
        if (err)
            *err = p.fail_err;
    }
    pthread_mutex_destroy(&p.mu);
    pthread_cond_destroy(&p.cv);
    free(th);
    free(p.order);
    free(p.slot);
    return r;
}

size_t
pipeline_chunks_for(unsigned nthreads, size_t nstages)
{
    return (size_t)nthreads + nstages + 2;
}

/* A number from the first line of path, or 0. */
static long long
read_num(const char *path, long long *ret_second)
{
    char line[128];
    long long a = 0, b = 0;
    FILE *f = fopen(path, "re");

    if (!f)
        return 0;
    if (!fgets(line, sizeof(line), f) || sscanf(line, "%lld %lld", &a, &b) < 1)
        a = 0;
    fclose(f);
    if (ret_second)
        *ret_second = b;
    return a;
}

/* The CPU quota of the cgroup at dir (under /sys/fs/cgroup, "" its root),
 * rounded up: cgroup v2's cpu.max ("max 100000" or "150000 100000"), v1's
 * cpu.cfs_quota_us and cpu.cfs_period_us; 0 for none. */
static unsigned
quota_at(const char *dir, bool v1)
{
    char file[4300];
    long long quota, period = 0;

    if (v1) {
        snprintf(file, sizeof(file), "%s/cpu.cfs_quota_us", dir);
        quota = read_num(file, NULL);
        snprintf(file, sizeof(file), "%s/cpu.cfs_period_us", dir);
        period = read_num(file, NULL);
    } else {
        snprintf(file, sizeof(file), "%s/cpu.max", dir);
        quota = read_num(file, &period);
    }
    return quota > 0 && period > 0 ? (unsigned)((quota + period - 1) / period) : 0;
}

/* The least quota from the cgroup's directory up to the hierarchy's root:
 * a parent's quota bounds its children. */
static unsigned
quota_up(const char *root, char *path, bool v1)
{
    unsigned n = 0, q;

    for (;;) {
        char dir[4200];
        char *end;

        snprintf(dir, sizeof(dir), "%s%s", root, strcmp(path, "/") ? path : "");
        if ((q = quota_at(dir, v1)) > 0 && (n == 0 || q < n))
            n = q;
        if (!(end = strrchr(path, '/')) || end == path) {
            /* the root, which a container sees as its own cgroup */
            if ((q = quota_at(root, v1)) > 0 && (n == 0 || q < n))
                n = q;
            return n;
        }
        *end = '\0';
    }
}

unsigned
pipeline_cpus(void)
{
    cpu_set_t *set;
    size_t size;
    unsigned n = 0, q;
    char line[4096];
    FILE *f;

    for (int cpus = 1024; cpus <= 1 << 16 && n == 0; cpus *= 2) {
        set = CPU_ALLOC((size_t)cpus);
        size = CPU_ALLOC_SIZE((size_t)cpus);
        if (sched_getaffinity(0, size, set) == 0)
            n = (unsigned)CPU_COUNT_S(size, set);
        else if (errno != EINVAL)
            cpus = 1 << 16;
        CPU_FREE(set);
    }
    if (n == 0)
        n = 1;
    /* "0::/path" (v2), "4:cpu,cpuacct:/path" (v1) */
    if (!(f = fopen("/proc/self/cgroup", "re")))
        return n;
    while (fgets(line, sizeof(line), f)) {
        char *ctl = strchr(line, ':'), *path = ctl ? strchr(ctl + 1, ':') : NULL;
        char root[256];
        bool v1;

        if (!path || path[1] != '/')
            continue;
        *path++ = '\0';
        ctl++;
        path[strcspn(path, "\n")] = '\0';
        v1 = *ctl != '\0';
        if (v1) {
            char list[256];
            bool cpu = false;

            snprintf(list, sizeof(list), ",%s,", ctl);
            cpu = strstr(list, ",cpu,") != NULL;
            if (!cpu)
                continue;
            snprintf(root, sizeof(root), "/sys/fs/cgroup/%s", ctl);
        } else {
            snprintf(root, sizeof(root), "/sys/fs/cgroup");
        }
        if ((q = quota_up(root, path, v1)) > 0 && q < n)
            n = q;
    }
    fclose(f);
    return n;
}
