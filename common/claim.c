/*
 * claim: the claim pass, stale takeover, heartbeats and fences.
 *
 * Syscall budget of one claim of a pending shard (first attempt): the
 * stat of the cancel marker and the fresh fstat of state/locks, state/done
 * and state/failed (4, each directory listed again only when it changed),
 * the stat of its done record (1), the O_EXCL create, write, fsync and
 * fstat of the lock (5, close included), the cancel marker again (1), the
 * attempts listing (1), the re-check of the done and failed records (2),
 * two mkdirs and attempt.json (6); the server clock (2) only every
 * CLAIM_CLOCK_RESYNC seconds or near a lease's end. Known-terminal shards
 * and locks known to be fresh cost nothing; a shard done elsewhere since
 * the last listing of state/done costs the stat of its done record. The
 * locks that could have turned stale are looked at first (within
 * CLAIM_JUDGE_RATE), so a dead node's shard is taken over about one lease
 * after its last heartbeat: 4 syscalls for a lock seen for the first time,
 * 1 (a stat) after that.
 */
#include "claim.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fsutil.h"
#include "json.h"
#include "tries.h"

enum { K_UNKNOWN, K_DONE, K_FAILED, K_MINE };
enum { D_LOCKS, D_DONE, D_FAILED };
static const char *const dir_kind[] = { "locks", "done", "failed" };
static const char *const dir_suffix[] = { ".lock", ".json", ".json" };

/* Largest lock file worth reading. */
#define LOCK_MAX 65536

static uint64_t
fnv1a(const char *s)
{
    uint64_t h = 1469598103934665603ULL;

    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

struct tries_rule
claimer_rule(const struct claimer *c)
{
    return (struct tries_rule){
        .job_dir = c->m->job_dir,
        .node = c->node,
        .hostname = c->hostname,
        .max_retries = c->max_retries,
        .max_infra = c->max_infra,
    };
}

int
claimer_init(struct claimer *c, const struct manifest *m, const struct claim_opts *o,
             struct esd_err *err)
{
    char host[256], *dir = NULL, *path = NULL;
    int r;

    memset(c, 0, sizeof(*c));
    c->clock_fd = -1;
    if (!o->node || !manifest_id_ok(o->node))
        return err_set(err, -EINVAL,
                       "invalid node name '%s': use letters, digits, '.', '_' and '-', not "
                       "starting with '.'",
                       o->node ? o->node : "");
    c->m = m;
    c->node = xstrdup(o->node);
    if (o->hostname) {
        c->hostname = xstrdup(o->hostname);
    } else {
        if (gethostname(host, sizeof(host)) < 0)
            snprintf(host, sizeof(host), "unknown");
        host[sizeof(host) - 1] = '\0';
        c->hostname = xstrdup(host);
    }
    c->lease_secs = o->lease_secs > 0 ? o->lease_secs : CLAIM_LEASE_DEFAULT;
    c->lock_timeout = o->lock_timeout > 0 ? o->lock_timeout : m->lock_timeout_secs;
    c->max_retries = o->max_retries >= 0 ? o->max_retries : m->max_retries;
    c->max_infra = o->max_infra > 0 ? o->max_infra : CLAIM_MAX_INFRA_DEFAULT;
    c->known = xcalloc(m->nshards, 1);
    c->fresh_until = xcalloc(m->nshards, sizeof(double));
    c->lock_ino = xcalloc(m->nshards, sizeof(*c->lock_ino));
    c->lock_dev = xcalloc(m->nshards, sizeof(*c->lock_dev));
    c->lock_threshold = xcalloc(m->nshards, sizeof(*c->lock_threshold));
    c->locked = xcalloc(m->nshards, 1);
    c->retry_at = xcalloc(m->nshards, sizeof(double));
    c->fails_here = xcalloc(m->nshards, 1);
    c->cancel_path = fs_join(m->job_dir, "state/esd/cancelled.json");
    c->tokens = CLAIM_JUDGE_BURST;
    c->tokens_at = time_mono();
    c->cursor = (size_t)(fnv1a(c->node) % m->nshards);
    /* A job prepared by the reference has no state/clock yet. */
    dir = fs_join(m->job_dir, "state/clock");
    if ((r = fs_mkdir_p(dir, 0755, err)) < 0)
        goto fail;
    path = fs_join(dir, c->node);
    c->clock_fd = fs_open_job(path, O_WRONLY | O_CREAT, 0644, 0, NULL, err);
    if (c->clock_fd < 0) {
        r = c->clock_fd;
        goto fail;
    }
    free(dir);
    free(path);
    return 0;
fail:
    free(dir);
    free(path);
    claimer_free(c);
    return r;
}

void
claimer_free(struct claimer *c)
{
    if (c->clock_fd >= 0)
        close(c->clock_fd);
    free(c->node);
    free(c->hostname);
    free(c->known);
    free(c->fresh_until);
    free(c->lock_ino);
    free(c->lock_dev);
    free(c->lock_threshold);
    free(c->locked);
    free(c->retry_at);
    free(c->fails_here);
    free(c->cancel_path);
    memset(c, 0, sizeof(*c));
    c->clock_fd = -1;
}

static double
ts_secs(const struct timespec *ts)
{
    return (double)ts->tv_sec + (double)ts->tv_nsec / 1e9;
}

int
claimer_now(struct claimer *c, double *ret_now, struct esd_err *err)
{
    struct stat st;

    /* UTIME_NOW makes the file server stamp its own time (on NFS a
     * SETATTR to server time); the reply's attributes carry it back. */
    c->stats.ops += 2;
    if (fs_touch_fd(c->clock_fd) < 0 || fstat(c->clock_fd, &st) < 0)
        return err_sys(err, -errno, "cannot read the server clock in %s/state/clock",
                       c->m->job_dir);
    c->clock_server = ts_secs(&st.st_mtim);
    c->clock_mono = time_mono();
    c->clock_valid = true;
    *ret_now = c->clock_server;
    return 0;
}

/* The server time from the last reading and the monotonic clock; a fresh
 * reading when the last one is too old. */
static int
clock_estimate(struct claimer *c, double *ret_now, struct esd_err *err)
{
    double mono = time_mono();

    if (!c->clock_valid || mono - c->clock_mono > CLAIM_CLOCK_RESYNC || mono < c->clock_mono)
        return claimer_now(c, ret_now, err);
    *ret_now = c->clock_server + (mono - c->clock_mono);
    return 0;
}

void
claim_free(struct claim *cl)
{
    free(cl->shard_id);
    free(cl->attempt_rel);
    free(cl->attempt_dir);
    free(cl->lock_path);
    memset(cl, 0, sizeof(*cl));
}

/* Reads a lock file's content from fd; NULL if it is empty or unparsable. */
static cJSON *
read_lock_fd(int fd)
{
    char buf[LOCK_MAX];
    ssize_t n = pread(fd, buf, sizeof(buf), 0);
    cJSON *j = NULL;

    if (n <= 0 || json_parse_object(buf, (size_t)n, "lock", &j, NULL) < 0)
        return NULL;
    return j;
}

/*
 * Remembers that shard i's lock is fresh until server time until. Its
 * release or the end of its shard is seen from the listings of state/locks
 * and state/done when those change, so a fresh lock is not looked at again
 * before its lease could have ended, however long (35 hours for a lock of
 * the reference).
 */
static void
remember_fresh(struct claimer *c, size_t i, double now, double until)
{
    (void)now;
    c->fresh_until[i] = until;
}

/*
 * The age of shard i's lock from its stat st, or, if its mtime is absurd
 * (*suspect), the time this claimer has seen that mtime unchanged on that
 * inode: 0 at the first sight. An absurd mtime alone never makes a lock
 * stale (an NFSv3 exclusive create keeps its verifier there until the
 * creator's SETATTR); the same mtime a whole lease later does.
 */
static double
lock_age(struct claimer *c, size_t i, const struct stat *st, double now, bool *suspect)
{
    double mt = ts_secs(&st->st_mtim), mono = time_mono();
    struct claim_suspect *free_e = NULL, *oldest = NULL;
    size_t k;

    *suspect = false;
    if (mt <= now + CLAIM_MTIME_FUTURE && mt >= CLAIM_MTIME_FLOOR)
        return now - mt;
    *suspect = true;
    for (k = 0; k < sizeof(c->suspects) / sizeof(c->suspects[0]); k++) {
        struct claim_suspect *e = &c->suspects[k];

        if (e->since > 0 && e->index == i) {
            if (e->dev == st->st_dev && e->ino == st->st_ino &&
                e->mtime.tv_sec == st->st_mtim.tv_sec && e->mtime.tv_nsec == st->st_mtim.tv_nsec)
                return mono - e->since;
            free_e = e; /* the same shard, another lock or mtime: start again */
            break;
        }
        if (e->since <= 0 && !free_e)
            free_e = e;
        if (!oldest || e->since < oldest->since)
            oldest = e;
    }
    if (!free_e)
        free_e = oldest; /* (full: forgetting one only delays its takeover) */
    free_e->index = i;
    free_e->dev = st->st_dev;
    free_e->ino = st->st_ino;
    free_e->mtime = st->st_mtim;
    free_e->since = mono;
    return 0;
}

/* Seconds after which the lock described by j is stale. */
static double
lock_threshold(const struct claimer *c, const cJSON *j)
{
    long long lease;

    if (!j)
        /* Empty or partial: its writer died between create and write (or
         * is writing right now); our own lease bounds that window. */
        return (double)c->lease_secs;
    if (json_get_int(j, "lease_secs", &lease) == 0 && lease > 0)
        return (double)lease;
    return (double)c->lock_timeout;
}

/* path names fd's file: decided on path opened (an open revalidates the
 * name with an NFS server; a stat may answer from stale cached attributes). */
static bool
same_inode(int fd, const char *path)
{
    struct stat a, b;
    int pfd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    bool same = pfd >= 0 ? fstat(pfd, &b) == 0 : errno == EACCES && lstat(path, &b) == 0;

    if (pfd >= 0)
        close(pfd);
    return same && fstat(fd, &a) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

int
claim_fence(const char *path, const char *token, bool nb, struct esd_err *err)
{
    cJSON *j;
    const char *t;
    int fd, r;

    fd = fs_open_job(path, O_RDWR, 0, 0, NULL, err);
    if (fd == -EACCES)
        /* A lock of another user (a reference worker): flock works on a
         * read-only descriptor locally; on NFS it then fails cleanly. */
        fd = fs_open_job(path, O_RDONLY, 0, 0, NULL, err);
    if (fd < 0) {
        if (fd == -ENOENT)
            return err_set(err, -ESTALE, "lock %s is gone", path);
        return fd;
    }
    /* Never an unbounded wait: whoever holds a lock's flock (a node
     * deciding a takeover, the reference's worker) holds it for moments;
     * an owner holding it for ever makes the step fail, not hang. */
    for (double until = time_mono() + (nb ? 0 : CLAIM_FENCE_WAIT);;) {
        if ((r = flock(fd, LOCK_EX | LOCK_NB)) == 0 || (errno != EINTR && errno != EWOULDBLOCK))
            break;
        if (errno == EWOULDBLOCK && time_mono() >= until)
            break;
        if (errno == EWOULDBLOCK)
            usleep(20000);
    }
    if (r < 0) {
        r = errno != EWOULDBLOCK ? err_sys(err, -errno, "cannot lock %s", path)
            : nb                 ? -EWOULDBLOCK
                                 : err_set(err, -EWOULDBLOCK,
                                           "lock %s stayed locked by another process for "
                                                           "%.0f s",
                                           path, CLAIM_FENCE_WAIT);
        close(fd);
        return r;
    }
    if (!same_inode(fd, path)) {
        claim_unfence(fd);
        return err_set(err, -ESTALE, "lock %s was replaced", path);
    }
    if (token) {
        j = read_lock_fd(fd);
        t = json_get_str(j, "token");
        r = t && strcmp(t, token) == 0;
        cJSON_Delete(j);
        if (!r) {
            claim_unfence(fd);
            return err_set(err, -ESTALE, "lock %s belongs to another claim", path);
        }
    }
    return fd;
}

int
claim_fence_own(const struct claim *cl, struct esd_err *err)
{
    struct stat st;
    int fd = claim_fence(cl->lock_path, cl->token, false, err);

    if (fd < 0)
        return fd;
    /* The heartbeat's rule too: our token in another file is not ours. */
    if (fstat(fd, &st) < 0 || st.st_dev != cl->lock_dev || st.st_ino != cl->lock_ino) {
        claim_unfence(fd);
        return err_set(err, -ESTALE, "lock %s is not the file this claim created", cl->lock_path);
    }
    return fd;
}

void
claim_unfence(int fd)
{
    if (fd >= 0) {
        flock(fd, LOCK_UN);
        close(fd);
    }
}

int
claim_lock_renew(const char *path, const char *token, struct esd_err *err)
{
    int fd = claim_fence(path, token, true, err);

    if (fd < 0)
        return fd;
    fs_touch_fd(fd);
    claim_unfence(fd);
    return 0;
}

void
claim_lock_release(const char *path, const char *token)
{
    struct esd_err err;
    int fd = claim_fence(path, token, true, &err);

    if (fd >= 0) {
        unlink(path);
        claim_unfence(fd);
    }
}

int
claim_lock_move_stale(const char *path, double now, double lease, double *ret_age)
{
    struct esd_err err;
    struct stat st;
    char hex[33], *aside;
    double age;
    int fd, r = 0;

    if ((fd = claim_fence(path, NULL, true, &err)) < 0)
        return 0;
    if (fstat(fd, &st) == 0 &&
        (age = now - ((double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec / 1e9)) > lease) {
        rand_hex32(hex);
        aside = xasprintf("%s.stale.%s", path, hex);
        r = rename(path, aside) == 0 ? 1 : 2;
        if (ret_age)
            *ret_age = age;
        free(aside);
    }
    claim_unfence(fd);
    return r;
}

enum judged { J_FRESH, J_GONE, J_BUSY };

/*
 * Takes over the stale lock of shard i, under the fence: re-checks the
 * inode and the age on the open file, marks the old attempt stale and
 * renames the lock into state/stale_locks/. J_GONE means the lock is out
 * of the way.
 */
static int
takeover(struct claimer *c, size_t i, const char *path, double now, const char *own_token,
         struct esd_err *err)
{
    const struct manifest *m = c->m;
    struct stat st;
    cJSON *j;
    const char *attempt;
    char hex[33], *dest;
    double threshold, age;
    bool suspect;
    int fd, r;

    fd = claim_fence(path, NULL, true, err);
    if (fd == -ESTALE)
        return J_GONE;
    if (fd == -EWOULDBLOCK)
        return J_BUSY;
    if (fd < 0)
        return fd;
    if (fstat(fd, &st) < 0) {
        r = err_sys(err, -errno, "cannot stat lock %s", path);
        claim_unfence(fd);
        return r;
    }
    c->stats.ops += 3;
    j = read_lock_fd(fd);
    threshold = lock_threshold(c, j);
    age = lock_age(c, i, &st, now, &suspect);
    if (own_token) {
        /* a lock of our own previous run: stale at any age, if it still
         * holds our token (else it is somebody else's now) */
        const char *t = json_get_str(j, "token");

        if (!t || strcmp(t, own_token)) {
            cJSON_Delete(j);
            claim_unfence(fd);
            return J_FRESH;
        }
    } else if (age <= threshold) {
        remember_fresh(c, i, now, now + (threshold - age));
        cJSON_Delete(j);
        claim_unfence(fd);
        return J_FRESH;
    }
    /* Mark first, so that the next claimant cannot miss the failure. */
    attempt = json_get_str(j, "attempt_dir");
    if (attempt)
        tries_mark_stale(m, attempt, NULL);
    rand_hex32(hex);
    dest = xasprintf("%s/state/stale_locks/%s.%lld.%s.lock", m->job_dir, m->shards[i].id,
                     (long long)time(NULL), hex);
    r = rename(path, dest) < 0 ? err_sys(err, -errno, "cannot move stale lock %s", path) : 0;
    if (r == 0)
        r = fs_fsync_parent(path, err);
    if (r == 0)
        r = fs_fsync_parent(dest, err);
    free(dest);
    if (r == 0) {
        const char *from = json_get_str(j, "node");

        if (!from)
            from = json_get_str(j, "hostname");
        snprintf(c->taken_from, sizeof(c->taken_from), "%s", from ? from : "unknown");
        c->taken_index = i;
        c->taken_valid = true;
    }
    cJSON_Delete(j);
    claim_unfence(fd);
    return r < 0 ? r : J_GONE;
}

/*
 * Shard i's lock exists: fresh (skip), gone or taken over (try again),
 * busy (another node is deciding; skip). The lock's lease is read once per
 * lock file (a lock is never rewritten) and remembered with its inode, so
 * judging a lock seen before costs one stat.
 */
static int
judge_lock(struct claimer *c, size_t i, const char *path, double now, struct esd_err *err)
{
    struct stat st;
    double threshold, age;
    bool suspect;

    c->stats.ops++;
    if (stat(path, &st) < 0)
        return errno == ENOENT ? J_GONE : err_sys(err, -errno, "cannot stat lock %s", path);
    c->locked[i] = 1;
    if (st.st_ino != c->lock_ino[i] || st.st_dev != c->lock_dev[i] || !c->lock_threshold[i]) {
        int fd = fs_open_job(path, O_RDONLY, 0, 0, NULL, err);
        cJSON *j;

        c->stats.ops++;
        if (fd == -ENOENT)
            return J_GONE;
        if (fd == -ELOOP || fd == -EINVAL) {
            /* Not a lock file (a link, a FIFO): nobody's claim, and not a
             * file to take over either; the shard waits, the pass goes on. */
            remember_fresh(c, i, now, now + (double)c->lease_secs);
            return J_FRESH;
        }
        if (fd < 0)
            return fd;
        j = read_lock_fd(fd);
        close(fd);
        c->lock_threshold[i] = lock_threshold(c, j);
        /* An empty lock may still be written: do not remember its lease. */
        c->lock_ino[i] = j ? st.st_ino : 0;
        c->lock_dev[i] = st.st_dev;
        cJSON_Delete(j);
    }
    threshold = c->lock_threshold[i];
    age = lock_age(c, i, &st, now, &suspect);
    if (!suspect && age > threshold - CLAIM_CLOCK_MARGIN) {
        /* Close to the end of the lease: decide on a fresh reading. */
        int r = claimer_now(c, &now, err);

        if (r < 0)
            return r;
        age = lock_age(c, i, &st, now, &suspect);
    }
    if (age <= threshold) {
        remember_fresh(c, i, now, now + (threshold - age));
        return J_FRESH;
    }
    return takeover(c, i, path, now, NULL, err);
}

static bool
exists(struct claimer *c, const char *path)
{
    struct stat st;

    c->stats.ops++;
    return stat(path, &st) == 0;
}

/* The failed record of a shard whose limits were used up before a claim. */
static int
fail_before_claim(struct claimer *c, size_t i, const struct tries_counts *n, struct esd_err *err)
{
    const struct manifest *m = c->m;
    char now[40], *path = manifest_state_path(m, "failed", m->shards[i].id, ".json");
    cJSON *j = cJSON_CreateObject();
    bool infra = n->counted <= c->max_retries;
    int r;

    time_iso_now(now, NULL);
    json_add_str(j, "shard_id", m->shards[i].id);
    json_add_str(j, "status", "failed");
    json_add_str(j, "failed_at", now);
    json_add_int(j, "failures", n->counted);
    json_add_int(j, "infrastructure_failures", n->infra);
    json_add_str(j, "reason",
                 infra ? "infrastructure failure limit reached before claim"
                       : "retry limit reached before claim");
    json_add_str(j, "node", c->node);
    r = json_publish_excl(path, j, JSON_PRETTY, err);
    if (r == -EEXIST)
        r = 0;
    cJSON_Delete(j);
    free(path);
    return r;
}

/* The fields of a new claim (spec §5.3, plus lease and node): the lock's
 * one line, and the start of its attempt.json. Caller frees. */
static cJSON *
claim_fields(const struct claimer *c, const struct claim *cl, const char *claimed_at, double epoch)
{
    cJSON *j = cJSON_CreateObject();

    json_add_str(j, "shard_id", cl->shard_id);
    json_add_str(j, "token", cl->token);
    json_add_str(j, "hostname", c->hostname);
    json_add_int(j, "pid", (long long)getpid());
    json_add_str(j, "claimed_at", claimed_at);
    json_add_float(j, "claimed_at_epoch", epoch);
    json_add_int(j, "attempt_number", cl->attempt_number);
    json_add_str(j, "attempt_dir", cl->attempt_rel);
    json_add_int(j, "lease_secs", cl->lease_secs);
    json_add_str(j, "node", c->node);
    return j;
}

enum tried { T_SKIP, T_CLAIMED };

/*
 * Tries to claim shard i (not known terminal, not known fresh): O_EXCL
 * create of the lock, stale takeover if it exists, then the checks that
 * need the lock held.
 */
static int
try_shard(struct claimer *c, size_t i, double now, struct claim *ret, struct esd_err *err)
{
    const struct manifest *m = c->m;
    const char *id = m->shards[i].id;
    struct claim cl = { 0 };
    struct tries_counts n;
    struct tries_rule rule = claimer_rule(c);
    enum tries_limit lim;
    struct buf line;
    struct stat st;
    cJSON *fields = NULL;
    char claimed_at[40], *done = NULL, *failed = NULL, *parent = NULL;
    double epoch;
    int fd = -1, r, tries;

    cl.index = i;
    cl.shard_id = xstrdup(id);
    cl.lock_path = manifest_state_path(m, "locks", id, ".lock");
    cl.lease_secs = c->lease_secs;
    buf_init(&line);
    done = manifest_state_path(m, "done", id, ".json");
    failed = manifest_state_path(m, "failed", id, ".json");
    /* Done elsewhere since state/done was listed: one stat, no lock. */
    if (exists(c, done)) {
        c->known[i] = K_DONE;
        c->ndone++;
        c->stats.passed_done++;
        r = T_SKIP;
        goto out;
    }
    /* Create; if a lock is in the way, judge it and, once it is gone
     * (released, or taken over as stale), create again. */
    for (tries = 0;; tries++) {
        c->stats.ops++;
        fd = open(cl.lock_path, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0644);
        if (fd >= 0) {
            c->stats.locks_created++;
            c->locked[i] = 1;
            break;
        }
        if (errno != EEXIST) {
            r = err_sys(err, -errno, "cannot create lock %s", cl.lock_path);
            goto out;
        }
        if (tries == 1) {
            r = T_SKIP; /* somebody else was faster */
            goto out;
        }
        if ((r = judge_lock(c, i, cl.lock_path, now, err)) < 0)
            goto out;
        if (r != J_GONE) {
            r = T_SKIP;
            goto out;
        }
    }
    /* Held. Count the attempts now: a previous owner records its failure
     * before it releases the lock. */
    if ((r = tries_count_by(m, id, c->node, &n, err)) < 0) {
        /* (e.g. an over-full attempts directory) Leave this shard for a
         * lease, so that the next passes claim the others. */
        remember_fresh(c, i, now, now + (double)c->lease_secs);
        goto unlock;
    }
    cl.attempt_number = n.attempts + 1;
    rand_hex32(cl.token);
    cl.attempt_rel = xasprintf("attempts/%s/%04lld-%s", id, cl.attempt_number, cl.token);
    cl.attempt_dir = fs_join(m->job_dir, cl.attempt_rel);
    time_iso_now(claimed_at, &epoch);
    fields = claim_fields(c, &cl, claimed_at, epoch);
    json_dump(fields, JSON_LINE, &line);
    if ((r = fs_write_all(fd, line.p, line.len)) < 0 || (fsync(fd) < 0 && (r = -errno)) ||
        (fstat(fd, &st) < 0 && (r = -errno))) {
        err_sys(err, r, "cannot write lock %s", cl.lock_path);
        goto unlock;
    }
    cl.lock_dev = st.st_dev;
    cl.lock_ino = st.st_ino;
    close(fd);
    fd = -1;
    c->stats.ops += 3;
    /* Cancelled everywhere while this pass ran: the check closest to the
     * start of the attempt, with the lock held. */
    if (exists(c, c->cancel_path)) {
        c->cancelled = true;
        r = T_SKIP;
        goto unlock;
    }
    /* A result published between our cache and our lock wins. */
    if (exists(c, done) || exists(c, failed)) {
        c->known[i] = exists(c, done) ? K_DONE : K_FAILED;
        *(c->known[i] == K_DONE ? &c->ndone : &c->nfailed) += 1;
        r = T_SKIP;
        goto unlock;
    }
    if ((lim = tries_limit(&rule, &n)) == TL_LEFT) {
        /* only this node failed it, and another lives: theirs to try */
        remember_fresh(c, i, now, now + (double)c->lease_secs);
        r = T_SKIP;
        goto unlock;
    }
    if (lim == TL_TERMINAL) {
        if ((r = fail_before_claim(c, i, &n, err)) < 0)
            goto unlock;
        c->known[i] = K_FAILED;
        c->nfailed++;
        r = T_SKIP;
        goto unlock;
    }
    parent = fs_dirname(cl.attempt_dir);
    if ((mkdir(parent, 0755) < 0 && errno != EEXIST) || mkdir(cl.attempt_dir, 0755) < 0) {
        r = err_sys(err, -errno, "cannot create attempt directory %s", cl.attempt_dir);
        goto unlock;
    }
    if ((r = tries_record_start(cl.attempt_dir, fields, m->shards[i].path, err)) < 0)
        goto unlock;
    c->known[i] = K_MINE;
    if (c->taken_valid && c->taken_index == i) {
        cl.took_over = true;
        memcpy(cl.taken_from, c->taken_from, sizeof(cl.taken_from));
    }
    c->taken_valid = false;
    c->stats.claimed++;
    c->stats.ops += 4;
    *ret = cl;
    memset(&cl, 0, sizeof(cl));
    r = T_CLAIMED;
    goto out;
unlock:
    /* The lock is ours and nothing started: remove it. */
    if (fd >= 0)
        close(fd);
    fd = -1;
    unlink(cl.lock_path);
    c->locked[i] = 0;
out:
    if (fd >= 0)
        close(fd);
    buf_free(&line);
    cJSON_Delete(fields);
    free(done);
    free(failed);
    free(parent);
    claim_free(&cl);
    return r;
}

/*
 * Looks at the mtime of state/<kind> on a fresh open and fstat (a cached
 * stat may be a directory's attributes of a minute ago on NFS): *changed
 * if it differs from the last listing's, or that listing was unsettled.
 */
static int
dir_look(struct claimer *c, int k, struct timespec *mtime, bool *changed, struct esd_err *err)
{
    struct claim_dir *d = &c->dirs[k];
    char *path = xasprintf("%s/state/%s", c->m->job_dir, dir_kind[k]);
    struct stat st;
    int fd, r = 0;

    c->stats.ops++;
    d->checked = time_mono();
    fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) < 0) {
        r = errno == ENOENT ? 0 : err_sys(err, -errno, "cannot read %s", path);
        memset(&st, 0, sizeof(st));
    }
    if (fd >= 0)
        close(fd);
    free(path);
    *mtime = st.st_mtim;
    *changed = !d->listed || d->unsettled || st.st_mtim.tv_sec != d->mtime.tv_sec ||
               st.st_mtim.tv_nsec != d->mtime.tv_nsec;
    return r;
}

/* Records a listing of state/<kind> made after its mtime read mtime. A
 * change within the same timestamp granule (a second on some servers)
 * would leave the mtime as it was: list once more after that. */
static void
dir_listed(struct claimer *c, int k, const struct timespec *mtime, double now)
{
    struct claim_dir *d = &c->dirs[k];

    d->mtime = *mtime;
    d->listed = true;
    d->at = time_mono();
    /* (a whole second where the timestamps have no fraction: ext3, some
     * servers; else a few jiffies) */
    d->unsettled = now - ts_secs(mtime) < (mtime->tv_nsec ? 0.1 : 1.0);
}

/*
 * Lists state/locks: a lock gone since (released, or its shard ended) is
 * forgotten; a shard listed is one whose lock must be judged. A lock that
 * appeared since the last listing was made since: it is not looked at
 * before one of our own leases (most shards end before that, and their
 * locks are never read), so that judging locks costs a node nothing per
 * shard that other nodes run.
 */
static int
list_locks(struct claimer *c, double now, struct esd_err *err)
{
    size_t n = c->m->nshards;
    bool *present = xcalloc(n, sizeof(bool));
    bool first = !c->dirs[D_LOCKS].listed;
    int r;

    c->stats.ops++;
    if ((r = manifest_list_state(c->m, "locks", ".lock", present, err)) == 0)
        for (size_t i = 0; i < n; i++) {
            if (!first && present[i] && !c->locked[i] && c->known[i] == K_UNKNOWN &&
                c->fresh_until[i] <= now)
                c->fresh_until[i] = now + (double)c->lease_secs;
            if (c->locked[i] && !present[i] && c->known[i] == K_UNKNOWN) {
                c->woken++;
                c->fresh_until[i] = 0;
                c->lock_ino[i] = 0;
                c->lock_threshold[i] = 0;
            }
            c->locked[i] = present[i];
        }
    free(present);
    return r;
}

/* Lists state/done or state/failed and updates what is known terminal. */
static int
list_terminal(struct claimer *c, int k, struct esd_err *err)
{
    const struct manifest *m = c->m;
    bool *present = xcalloc(m->nshards, sizeof(bool));
    int r;

    c->stats.ops++;
    if ((r = manifest_list_state(m, dir_kind[k], dir_suffix[k], present, err)) == 0)
        for (size_t i = 0; i < m->nshards; i++) {
            unsigned char *kn = &c->known[i];

            if (*kn == K_MINE)
                continue;
            if (k == D_DONE && present[i] && *kn != K_DONE) {
                /* (a failed shard requeued and completed since) */
                if (*kn == K_FAILED)
                    c->nfailed--;
                *kn = K_DONE;
                c->ndone++;
                c->stats.passed_done++;
            } else if (k == D_FAILED && present[i] && *kn == K_UNKNOWN) {
                *kn = K_FAILED;
                c->nfailed++;
            } else if (k == D_FAILED && !present[i] && *kn == K_FAILED) {
                /* requeued by a retry */
                *kn = K_UNKNOWN;
                c->fresh_until[i] = 0;
                c->nfailed--;
                c->woken++;
            }
        }
    free(present);
    return r;
}

/*
 * Follows the job's directories: lists state/locks whenever it changed,
 * and state/done and state/failed when they changed and either they were
 * not listed for CLAIM_RELIST_SECS or eager (the pass is about to report
 * idle: the end of the job must be seen at once). Failed shards are
 * relisted first: a done listing then wins over them.
 */
static int
follow_dirs(struct claimer *c, double now, bool eager, struct esd_err *err)
{
    static const int order[] = { D_LOCKS, D_FAILED, D_DONE };
    struct timespec mt;
    bool changed;
    int r;

    for (size_t o = 0; o < 3; o++) {
        int k = order[o];
        struct claim_dir *d = &c->dirs[k];

        if ((r = dir_look(c, k, &mt, &changed, err)) < 0)
            return r;
        if (!changed)
            continue;
        if (k != D_LOCKS && d->listed && !eager && time_mono() - d->at < CLAIM_RELIST_SECS) {
            d->unsettled = true; /* (listed at the next pass that may) */
            continue;
        }
        r = k == D_LOCKS ? list_locks(c, now, err) : list_terminal(c, k, err);
        if (r < 0)
            return r;
        dir_listed(c, k, &mt, now);
    }
    return 0;
}

/* Judgements of foreign locks allowed now (CLAIM_JUDGE_RATE). */
static double
tokens_now(struct claimer *c)
{
    double mono = time_mono();

    c->tokens += (mono - c->tokens_at) * CLAIM_JUDGE_RATE;
    c->tokens_at = mono;
    if (c->tokens > CLAIM_JUDGE_BURST)
        c->tokens = CLAIM_JUDGE_BURST;
    return c->tokens;
}

struct pass {
    double now;
    double until; /* monotonic end of the pass's time */
    int budget;   /* shards that may still cost a syscall */
    bool starved; /* a lock to judge waits for a token */
    bool stopped; /* budget or time used up */
};

/* Spends one unit of the pass's budget; false when none is left. */
static bool
pass_spend(struct pass *p)
{
    if (p->budget <= 0 || (p->budget < CLAIM_PASS_BUDGET && time_mono() > p->until)) {
        p->stopped = true;
        return false;
    }
    p->budget--;
    return true;
}

/*
 * One phase of a pass from the cursor. Phase 0: the listed locks whose
 * cached lease ran out, within the judging tokens (a dead node's lock lies
 * ahead of the other nodes' cursors: it is taken over before the pending
 * shards). Phase 1: the shards without a listed lock. Returns 1 claimed,
 * 0 not, or a negative errno.
 */
static int
sweep(struct claimer *c, int phase, struct pass *p, struct claim *ret, struct esd_err *err)
{
    const struct manifest *m = c->m;
    size_t n = m->nshards;
    double mono = time_mono();
    int r;

    for (size_t k = 0; k < n && !p->stopped && !c->cancelled; k++) {
        size_t i = (c->cursor + k) % n;

        if (c->known[i] != K_UNKNOWN || c->fresh_until[i] > p->now ||
            (bool)c->locked[i] != (phase == 0) || c->retry_at[i] > mono)
            continue;
        if (phase == 0 && tokens_now(c) < 1.0) {
            p->starved = true;
            break;
        }
        if (!pass_spend(p)) {
            c->cursor = i; /* resume here */
            break;
        }
        if (phase == 0) {
            char *path = manifest_state_path(m, "locks", m->shards[i].id, ".lock");

            c->tokens -= 1.0;
            r = judge_lock(c, i, path, p->now, err);
            free(path);
            if (r < 0)
                return r;
            if (r == J_BUSY) /* another node is deciding: look again soon */
                remember_fresh(c, i, p->now, p->now + 1.0);
            if (r != J_GONE)
                continue;
        }
        r = try_shard(c, i, p->now, ret, err);
        if (r < 0)
            return r;
        if (r == T_CLAIMED) {
            c->cursor = (i + 1) % n;
            return 1;
        }
    }
    return 0;
}

/* Fills *idle from what is known after a pass that claimed nothing. */
static void
idle_report(struct claimer *c, const struct pass *p, unsigned long long ops,
            struct claim_idle *idle)
{
    size_t n = c->m->nshards, busy = 0;
    double next = -1, mono = time_mono();

    for (size_t i = 0; i < n; i++) {
        /* (backing off here: claimable again then) */
        if (c->known[i] == K_UNKNOWN && c->retry_at[i] > mono &&
            (next < 0 || c->retry_at[i] - mono < next))
            next = c->retry_at[i] - mono;
        if (c->known[i] == K_MINE) {
            busy++;
        } else if (c->known[i] == K_UNKNOWN && (c->fresh_until[i] > p->now || c->locked[i])) {
            busy++;
            if (c->fresh_until[i] > p->now && (next < 0 || c->fresh_until[i] - p->now < next))
                next = c->fresh_until[i] - p->now;
        }
    }
    if (p->starved) {
        double wait = (1.0 - c->tokens) / CLAIM_JUDGE_RATE;

        if (next < 0 || wait < next)
            next = wait > 0 ? wait : 0;
    }
    idle->done = c->ndone;
    idle->failed = c->nfailed;
    idle->busy = busy;
    idle->complete = c->ndone == n;
    idle->terminal = c->ndone + c->nfailed == n;
    idle->next_secs = next;
    idle->min_secs = (double)ops / CLAIM_IDLE_RATE;
    idle->more = p->stopped && !idle->terminal && !c->cancelled;
    idle->cancelled = c->cancelled;
}

int
claim_acquire(struct claimer *c, struct claim *ret, struct claim_idle *idle, struct esd_err *err)
{
    unsigned long long ops0 = c->stats.ops;
    struct claim_idle scratch;
    struct pass p = { .budget = CLAIM_PASS_BUDGET };
    int r;

    if (!idle)
        idle = &scratch;
    memset(idle, 0, sizeof(*idle));
    if ((r = clock_estimate(c, &p.now, err)) < 0)
        return r;
    p.until = time_mono() + CLAIM_PASS_SECS;
    /* Cancelled on every node: not one more claim (one stat a pass). */
    c->cancelled = exists(c, c->cancel_path);
    if (!c->cancelled && (r = follow_dirs(c, p.now, false, err)) < 0)
        return r;
    for (int phase = 0; phase < 2 && !c->cancelled; phase++)
        if ((r = sweep(c, phase, &p, ret, err)) != 0)
            return r;
    /* Nothing claimable: a listing put off above is made now, so that the
     * end of the job is seen at once, not at the next pass. */
    if (!c->cancelled && !p.stopped && (c->dirs[D_DONE].unsettled || c->dirs[D_FAILED].unsettled)) {
        size_t woken = c->woken;

        if ((r = follow_dirs(c, p.now, true, err)) < 0)
            return r;
        /* (a requeued shard, or a lock gone since: the next call, soon) */
        if (c->woken != woken)
            p.stopped = true;
    }
    idle_report(c, &p, c->stats.ops - ops0, idle);
    return 0;
}

double
claim_backoff(struct claimer *c, size_t index)
{
    unsigned k;
    double d;

    if (!c->retry_at || index >= c->m->nshards)
        return 0;
    if (c->fails_here[index] < 255)
        c->fails_here[index]++;
    k = c->fails_here[index] - 1u;
    d = k >= 16 ? CLAIM_BACKOFF_MAX : CLAIM_BACKOFF_BASE * (double)(1u << k);
    if (d > CLAIM_BACKOFF_MAX)
        d = CLAIM_BACKOFF_MAX;
    d *= 0.8 + 0.4 * ((double)random() / (double)RAND_MAX);
    c->retry_at[index] = time_mono() + d;
    return d;
}

int
claim_recover(struct claimer *c, const char *shard_id, const char *token, struct esd_err *err)
{
    const struct manifest *m = c->m;
    long i = manifest_find(m, shard_id);
    char *path;
    double now;
    int r;

    if (i < 0)
        return err_set(err, -ENOENT, "no shard %s in %s", shard_id, m->job_dir);
    if ((r = clock_estimate(c, &now, err)) < 0)
        return r;
    path = manifest_state_path(m, "locks", m->shards[i].id, ".lock");
    /* (held under another node's fence: that node is taking it over) */
    c->taken_valid = false;
    r = takeover(c, (size_t)i, path, now, token, err);
    free(path);
    if (r == J_GONE && c->taken_valid && c->taken_index == (size_t)i) {
        /* (the next claim of the shard is not news of a takeover) */
        c->taken_valid = false;
        c->fresh_until[i] = 0;
        c->lock_ino[i] = 0;
        return 1;
    }
    return r < 0 ? r : 0;
}

int
claim_heartbeat(const struct claim *cl, struct esd_err *err)
{
    struct stat st;
    cJSON *j;
    const char *t;
    int fd, r = 0;

    fd = fs_open_job(cl->lock_path, O_RDWR, 0, 0, NULL, err);
    if (fd < 0) {
        if (fd == -ENOENT)
            return err_set(err, -ESTALE, "lease of %s lost: its lock was removed or taken over",
                           cl->shard_id);
        /* replaced by something that is not a lock file: not ours */
        if (fd == -ELOOP || fd == -EINVAL)
            return err_set(err, -ESTALE,
                           "lease of %s lost: its lock was replaced by something "
                           "that is not a lock file",
                           cl->shard_id);
        return fd;
    }
    if (fstat(fd, &st) < 0) {
        r = err_sys(err, -errno, "cannot stat lock %s", cl->lock_path);
    } else if (st.st_dev != cl->lock_dev || st.st_ino != cl->lock_ino) {
        r = err_set(err, -ESTALE, "lease of %s lost: its lock was replaced by another claim",
                    cl->shard_id);
    } else {
        j = read_lock_fd(fd);
        t = json_get_str(j, "token");
        if (!t || strcmp(t, cl->token) != 0)
            r = err_set(err, -ESTALE, "lease of %s lost: its lock holds another token",
                        cl->shard_id);
        else if (fs_touch_fd(fd) < 0)
            r = err_sys(err, -errno, "cannot renew the lease of %s", cl->shard_id);
        cJSON_Delete(j);
    }
    close(fd);
    return r;
}

int
claim_release(const struct claim *cl, struct esd_err *err)
{
    int fd = claim_fence_own(cl, err), r;

    if (fd == -ESTALE)
        return 0;
    if (fd < 0)
        return fd;
    r = unlink(cl->lock_path) < 0 ? err_sys(err, -errno, "cannot remove lock %s", cl->lock_path)
                                  : 1;
    claim_unfence(fd);
    if (r == 1 && fs_fsync_parent(cl->lock_path, err) < 0)
        return -EIO;
    return r;
}

void
claimer_forget(struct claimer *c, const struct claim *cl, bool done, bool failed)
{
    size_t i = cl->index;

    if (i >= c->m->nshards || c->known[i] != K_MINE)
        return;
    if (done) {
        c->known[i] = K_DONE;
        c->ndone++;
    } else if (failed) {
        c->known[i] = K_FAILED;
        c->nfailed++;
    } else {
        c->known[i] = K_UNKNOWN;
        c->fresh_until[i] = 0;
    }
}
