/*
 * check_claim: the claim pass (spec §8.3 with esd's leases, ARCHITECTURE.md "What
 * esd adds"): the lock file and the first attempt.json a claim writes, the
 * node-specific starting shard, the idle report, the O_EXCL race between
 * many claimers, stale takeover by lease or by the reference's lock
 * timeout and the fencing of the old owner, heartbeats, release, the
 * "retry limit reached before claim" record, the re-check of results
 * published under a primed cache, a requeued shard seen by an idle
 * claimer, and what claims cost (issue 12): no lock made for a shard done
 * elsewhere, a bounded pass, a cheap idle pass, no claim of a job cancelled
 * everywhere, no takeover on an absurd lock mtime alone. Every fixture is a real job made by prepare_run; locks are aged
 * with utimensat, never by waiting.
 */
#include <check.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "attempt.h"
#include "prepare.h"
#include "claim.h"
#include "fsutil.h"
#include "json.h"
#include "manifest.h"
#include "retry.h"
#include "testutil.h"
#include "util.h"

/* The job of every test: 5 records in two files, 3 shards of 2, 2, 1 rows. */
static char *tmp;
static struct manifest M;

static void
job_setup(void)
{
    tmp = tu_tmpdir();
    tu_job(tmp, &M);
}

static void
job_teardown(void)
{
    fs_rm_rf(tmp);
    manifest_free(&M);
    free(tmp);
}

static const char *
id(size_t i)
{
    return M.shards[i].id;
}

static char *
lock_path(size_t i)
{
    return manifest_state_path(&M, "locks", id(i), ".lock");
}

static bool
lock_exists(size_t i)
{
    char *path = lock_path(i);
    bool r = tu_exists(path);

    free(path);
    return r;
}

static char *
job_path(const char *rel)
{
    return fs_join(M.job_dir, rel);
}

/* Entries in <job>/rel. */
static int
count_in(const char *rel)
{
    char *dir = job_path(rel);
    int n = tu_count_entries(dir);

    free(dir);
    return n;
}

/* Replaces path with content (a new inode). */
static void
put_file(const char *path, const char *content)
{
    struct esd_err err;

    ck_assert_msg(fs_write_atomic(path, content, strlen(content), 0644, &err) == 0, "%s", err.msg);
}

/* True if path holds exactly content. */
static bool
holds(const char *path, const char *content)
{
    char *text = tu_read(path, NULL);
    bool same = text && !strcmp(text, content);

    free(text);
    return same;
}

/* A claimer for node (hostname "host-<node>"); lease and lock_timeout <= 0
 * take the defaults. */
static void
claimer(struct claimer *c, const char *node, long long lease, long long lock_timeout)
{
    char *host = xasprintf("host-%s", node);
    struct claim_opts o = {
        .node = node,
        .hostname = host,
        .lease_secs = lease,
        .lock_timeout = lock_timeout,
        .max_retries = -1,
    };
    struct esd_err err;

    ck_assert_msg(claimer_init(c, &M, &o, &err) == 0, "%s", err.msg);
    free(host);
}

/* One claim pass that must not fail. */
static int
acquire(struct claimer *c, struct claim *cl, struct claim_idle *idle)
{
    struct esd_err err;
    int r = claim_acquire(c, cl, idle, &err);

    ck_assert_msg(r >= 0, "claim_acquire: %s", err.msg);
    return r;
}

/* Loads a JSON object file that must exist (cJSON_Delete). */
static cJSON *
load(const char *path)
{
    struct esd_err err;
    cJSON *j = NULL;

    ck_assert_msg(json_load_object(path, 1 << 20, &j, &err) == 0, "%s", err.msg);
    return j;
}

static cJSON *
load_attempt(const struct claim *cl)
{
    char *path = fs_join(cl->attempt_dir, "attempt.json");
    cJSON *j = load(path);

    free(path);
    return j;
}

static long long
get_int(const cJSON *j, const char *key)
{
    long long v = -12345;

    ck_assert_msg(json_get_int(j, key, &v) == 0, "%s is not an integer", key);
    return v;
}

/* Writes a claim file by hand, as the reference (lease <= 0: no
 * lease_secs) or another esd would, aged age seconds. */
static void
put_lock(size_t i, long long lease, double age)
{
    char *path = lock_path(i);
    cJSON *j = cJSON_CreateObject();
    struct esd_err err;
    struct buf b;

    json_add_str(j, "shard_id", id(i));
    json_add_str(j, "token", "0123456789abcdef0123456789abcdef");
    json_add_str(j, "hostname", "other-host");
    json_add_int(j, "pid", 4242);
    json_add_int(j, "attempt_number", 1);
    if (lease > 0)
        json_add_int(j, "lease_secs", lease);
    buf_init(&b);
    json_dump(j, JSON_LINE, &b);
    ck_assert_msg(fs_create_excl(path, b.p, b.len, 0644, NULL, &err) == 0, "%s", err.msg);
    tu_set_age(path, age);
    buf_free(&b);
    cJSON_Delete(j);
    free(path);
}

/* Marks every shard but keep done, so that a claimer can only claim keep. */
static void
done_except(size_t keep)
{
    for (size_t i = 0; i < M.nshards; i++)
        if (i != keep)
            tu_put_done(&M, i);
}

/* attempt.json of a fabricated attempt attempts/<id>/<name>/. */
static void
put_attempt(size_t i, const char *name, const char *json)
{
    char *rel = xasprintf("attempts/%s/%s/attempt.json", id(i), name);

    free(tu_write(M.job_dir, rel, json, (size_t)-1));
    free(rel);
}

/* A successful result to finish with: a one-record file export. */
static void
materialize(const struct claim *cl, struct attempt_result *res)
{
    struct esd_err err;

    free(tu_write(cl->attempt_dir, "ray-output.jsonl", "{\"text\":\"x\"}\n", (size_t)-1));
    ck_assert_msg(attempt_materialize(&M, cl, NULL, res, &err) == 0, "%s", err.msg);
}

static struct attempt_final
finish(struct claimer *c, const struct claim *cl, const struct attempt_result *res)
{
    struct attempt_outcome out = { .return_code = 0, .duration = 1.5 };
    struct attempt_final fin;
    struct esd_err err;

    ck_assert_msg(attempt_finish(c, cl, &out, res, &fin, &err) == 0, "%s", err.msg);
    return fin;
}

static bool
is_hex(const char *s, size_t n)
{
    if (strlen(s) != n)
        return false;
    for (; *s; s++)
        if (!isdigit((unsigned char)*s) && !(*s >= 'a' && *s <= 'f'))
            return false;
    return true;
}

/* ---- claiming ---- */

START_TEST(test_claim_writes_lock_and_attempt)
{
    static const char *const keys[] = {
        "attempt_dir", "attempt_number", "claimed_at", "claimed_at_epoch", "hostname",
        "lease_secs",  "node",           "pid",        "shard_id",         "token",
    };
    struct claimer c;
    struct claim cl;
    struct stat st;
    struct esd_err err;
    char *text, *rel, *dir, *nl;
    cJSON *j, *a, *it;
    size_t k = 0;
    double epoch;

    claimer(&c, "node-a", 60, 0);
    ck_assert_int_eq(acquire(&c, &cl, NULL), 1);
    ck_assert_uint_lt(cl.index, 3);
    ck_assert_str_eq(cl.shard_id, id(cl.index));
    ck_assert(is_hex(cl.token, 32));
    ck_assert_int_eq(cl.attempt_number, 1);
    ck_assert_int_eq(cl.lease_secs, 60);
    rel = xasprintf("attempts/%s/0001-%s", cl.shard_id, cl.token);
    ck_assert_str_eq(cl.attempt_rel, rel);
    dir = job_path(rel);
    ck_assert_str_eq(cl.attempt_dir, dir);
    ck_assert(tu_exists(dir));

    /* The lock: one line of JSON, keys sorted, Python's separators. */
    {
        char *want = lock_path(cl.index);

        ck_assert_str_eq(cl.lock_path, want);
        free(want);
    }
    ck_assert_int_eq(stat(cl.lock_path, &st), 0);
    ck_assert(st.st_dev == cl.lock_dev && st.st_ino == cl.lock_ino);
    ck_assert_int_eq(st.st_mode & 0777, 0644);
    text = tu_read(cl.lock_path, NULL);
    ck_assert_ptr_nonnull(text);
    nl = strchr(text, '\n');
    ck_assert_ptr_nonnull(nl);
    ck_assert_str_eq(nl, "\n");
    ck_assert(!strncmp(text, "{\"attempt_dir\": \"attempts/", 26));
    ck_assert_ptr_nonnull(strstr(text, "\", \"attempt_number\": 1, \"claimed_at\": \""));
    ck_assert_int_eq(json_parse_object(text, strlen(text), "lock", &j, &err), 0);
    cJSON_ArrayForEach(it, j)
    {
        ck_assert_uint_lt(k, 10);
        ck_assert_str_eq(it->string, keys[k]);
        k++;
    }
    ck_assert_uint_eq(k, 10);
    ck_assert_str_eq(json_get_str(j, "shard_id"), cl.shard_id);
    ck_assert_str_eq(json_get_str(j, "token"), cl.token);
    ck_assert_str_eq(json_get_str(j, "hostname"), "host-node-a");
    ck_assert_str_eq(json_get_str(j, "node"), "node-a");
    ck_assert_str_eq(json_get_str(j, "attempt_dir"), rel);
    ck_assert_int_eq(get_int(j, "pid"), getpid());
    ck_assert_int_eq(get_int(j, "attempt_number"), 1);
    ck_assert_int_eq(get_int(j, "lease_secs"), 60);
    ck_assert_ptr_nonnull(strstr(json_get_str(j, "claimed_at"), "+00:00"));
    ck_assert_int_eq(json_get_num(j, "claimed_at_epoch", &epoch), 0);
    ck_assert(epoch > (double)time(NULL) - 60 && epoch < (double)time(NULL) + 60);

    /* attempt.json: the claim's fields, status running and the input. */
    a = load_attempt(&cl);
    cJSON_ArrayForEach(it, j)
    {
        cJSON *same = cJSON_GetObjectItemCaseSensitive(a, it->string);

        ck_assert_msg(same != NULL, "attempt.json lacks %s", it->string);
        ck_assert_msg(cJSON_Compare(it, same, true), "attempt.json differs in %s", it->string);
    }
    ck_assert_str_eq(json_get_str(a, "status"), "running");
    ck_assert_str_eq(json_get_str(a, "input_path"), M.shards[cl.index].path);
    ck_assert_str_eq(json_get_str(a, "node"), "node-a");
    ck_assert_int_eq(get_int(a, "lease_secs"), 60);
    ck_assert_int_eq(get_int(a, "attempt_number"), 1);
    ck_assert_str_eq(json_get_str(a, "claimed_at"), json_get_str(j, "claimed_at"));

    cJSON_Delete(a);
    cJSON_Delete(j);
    free(text);
    free(rel);
    free(dir);
    claim_free(&cl);
    claimer_free(&c);
}
END_TEST

START_TEST(test_successive_claims_then_busy)
{
    struct claimer a, b;
    struct claim cl[3], extra;
    struct claim_idle idle;
    bool seen[3] = { false };

    claimer(&a, "node-a", 60, 0);
    for (size_t k = 0; k < 3; k++) {
        ck_assert_int_eq(acquire(&a, &cl[k], NULL), 1);
        ck_assert_msg(!seen[cl[k].index], "shard %zu claimed twice", cl[k].index);
        seen[cl[k].index] = true;
        ck_assert(tu_exists(cl[k].lock_path));
    }
    /* The holder itself: everything busy, and its own locks never turn
     * stale while it holds them, so there is no time to wait for. */
    ck_assert_int_eq(acquire(&a, &extra, &idle), 0);
    ck_assert_uint_eq(idle.busy, 3);
    ck_assert_uint_eq(idle.done, 0);
    ck_assert_uint_eq(idle.failed, 0);
    ck_assert(!idle.complete && !idle.terminal);
    ck_assert(idle.next_secs < 0);

    /* Another node: three fresh locks, the first of them stale within the
     * lease. */
    claimer(&b, "node-b", 60, 0);
    ck_assert_int_eq(acquire(&b, &extra, &idle), 0);
    ck_assert_uint_eq(idle.busy, 3);
    ck_assert(!idle.complete && !idle.terminal);
    ck_assert_msg(idle.next_secs >= 0 && idle.next_secs <= 60, "next_secs %f", idle.next_secs);
    /* Known fresh: the second pass answers the same from its cache. */
    ck_assert_int_eq(acquire(&b, &extra, &idle), 0);
    ck_assert_uint_eq(idle.busy, 3);
    ck_assert(idle.next_secs >= 0 && idle.next_secs <= 60);
    ck_assert_int_eq(count_in("state/stale_locks"), 0);

    for (size_t k = 0; k < 3; k++)
        claim_free(&cl[k]);
    claimer_free(&a);
    claimer_free(&b);
}
END_TEST

/* The shard a fresh claimer named node claims first (released again). */
static size_t
first_shard(const char *node)
{
    struct claimer c;
    struct claim cl;
    struct esd_err err;
    size_t i;

    claimer(&c, node, 60, 0);
    ck_assert_int_eq(acquire(&c, &cl, NULL), 1);
    i = cl.index;
    ck_assert_int_eq(claim_release(&cl, &err), 1);
    ck_assert(!tu_exists(cl.lock_path));
    claim_free(&cl);
    claimer_free(&c);
    return i;
}

START_TEST(test_first_shard_depends_on_node)
{
    char name[32];
    size_t first = first_shard("n0"), other = 0;
    int found = -1;

    /* The same name always starts at the same shard ... */
    ck_assert_uint_eq(first_shard("n0"), first);
    /* ... and some other name starts elsewhere. */
    for (int k = 1; k < 20 && found < 0; k++) {
        snprintf(name, sizeof(name), "n%d", k);
        other = first_shard(name);
        if (other != first)
            found = k;
    }
    ck_assert_msg(found > 0, "all of n0..n19 start at shard %zu", first);
    snprintf(name, sizeof(name), "n%d", found);
    ck_assert_uint_eq(first_shard(name), other);
}
END_TEST

START_TEST(test_invalid_node_name)
{
    static const char *const bad[] = { "", ".hidden", "a/b", "a b", "x\n" };
    struct claim_opts o = { .max_retries = -1 };
    struct claimer c;
    struct esd_err err;

    ck_assert_int_eq(claimer_init(&c, &M, &o, &err), -EINVAL);
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        o.node = bad[k];
        ck_assert_int_eq(claimer_init(&c, &M, &o, &err), -EINVAL);
        ck_assert_ptr_nonnull(strstr(err.msg, "invalid node name"));
    }
}
END_TEST

/* ---- the race ---- */

START_TEST(test_race_one_winner)
{
    enum { N = 16 };
    struct claimer c;
    struct claim cl;
    pid_t kids[N];
    int bar[2], wins = 0, losses = 0;
    char *attempts, *text;
    DIR *d;
    struct dirent *e;
    cJSON *j;
    struct esd_err err;

    done_except(2);
    ck_assert_int_eq(pipe(bar), 0);
    for (int k = 0; k < N; k++) {
        kids[k] = fork();
        ck_assert_int_ge(kids[k], 0);
        if (kids[k] == 0) {
            char node[16], host[16], go;
            struct claim_opts o = { .node = node, .hostname = host, .max_retries = -1 };
            int r;

            close(bar[1]);
            snprintf(node, sizeof(node), "racer-%d", k);
            snprintf(host, sizeof(host), "host-%d", k);
            if (claimer_init(&c, &M, &o, &err) < 0)
                _exit(3);
            /* The barrier: EOF once the parent closes its end. */
            while (read(bar[0], &go, 1) < 0 && errno == EINTR)
                ;
            r = claim_acquire(&c, &cl, NULL, &err);
            if (r == 1)
                claim_free(&cl);
            claimer_free(&c);
            close(bar[0]);
            _exit(r == 1 ? 1 : r == 0 ? 0 : 2);
        }
    }
    close(bar[0]);
    close(bar[1]);
    for (int k = 0; k < N; k++) {
        int st;

        ck_assert_int_eq(waitpid(kids[k], &st, 0), kids[k]);
        ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) <= 1, "racer %d: status %#x", k, st);
        if (WEXITSTATUS(st) == 1)
            wins++;
        else
            losses++;
    }
    ck_assert_int_eq(wins, 1);
    ck_assert_int_eq(losses, N - 1);

    /* One lock, one attempt directory, and they agree. */
    attempts = xasprintf("%s/attempts/%s", M.job_dir, id(2));
    ck_assert_int_eq(tu_count_entries(attempts), 1);
    {
        char *path = lock_path(2);

        text = tu_read(path, NULL);
        free(path);
    }
    ck_assert_ptr_nonnull(text);
    ck_assert_int_eq(json_parse_object(text, strlen(text), "lock", &j, &err), 0);
    d = opendir(attempts);
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') {
            char *rel = xasprintf("attempts/%s/%s", id(2), e->d_name);

            ck_assert_str_eq(json_get_str(j, "attempt_dir"), rel);
            ck_assert(!strncmp(e->d_name, "0001-", 5));
            free(rel);
        }
    closedir(d);
    ck_assert_int_eq(count_in("state/stale_locks"), 0);
    cJSON_Delete(j);
    free(text);
    free(attempts);
}
END_TEST

/* ---- stale takeover ---- */

START_TEST(test_stale_takeover_fences_old_owner)
{
    struct claimer ca, cb;
    struct claim a, b;
    struct attempt_result ra, rb;
    struct attempt_final fin;
    struct esd_err err;
    char *before, *after, *stale_dir, *done, *name = NULL, *pfx;
    DIR *d;
    struct dirent *e;
    cJSON *j;
    long long epoch;

    done_except(2);
    claimer(&ca, "node-a", 60, 0);
    ck_assert_int_eq(acquire(&ca, &a, NULL), 1);
    ck_assert_uint_eq(a.index, 2);
    materialize(&a, &ra);
    before = tu_read(a.lock_path, NULL);
    tu_set_age(a.lock_path, 600);

    claimer(&cb, "node-b", 60, 0);
    ck_assert_int_eq(acquire(&cb, &b, NULL), 1);
    ck_assert_uint_eq(b.index, 2);
    ck_assert_int_eq(b.attempt_number, 2);
    ck_assert_str_ne(b.token, a.token);
    ck_assert(!strncmp(b.attempt_rel + strlen(b.attempt_rel) - 38, "/0002-", 6));

    /* The old lock, unchanged, under <id>.<epoch>.<32hex>.lock. */
    stale_dir = job_path("state/stale_locks");
    ck_assert_int_eq(tu_count_entries(stale_dir), 1);
    d = opendir(stale_dir);
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            name = xstrdup(e->d_name);
    closedir(d);
    ck_assert_ptr_nonnull(name);
    pfx = xasprintf("%s.", id(2));
    ck_assert(!strncmp(name, pfx, strlen(pfx)));
    {
        char *p = name + strlen(pfx), *end, *path;

        epoch = strtoll(p, &end, 10);
        ck_assert(end > p && *end == '.');
        ck_assert(epoch > (long long)time(NULL) - 60 && epoch <= (long long)time(NULL));
        ck_assert_int_eq(strlen(end + 1), 32 + 5);
        ck_assert_str_eq(end + 1 + 32, ".lock");
        end[1 + 32] = '\0';
        ck_assert(is_hex(end + 1, 32));
        end[1 + 32] = '.';
        path = fs_join(stale_dir, name);
        after = tu_read(path, NULL);
        ck_assert_str_eq(after, before);
        free(after);
        free(path);
    }

    /* A's attempt is marked stale, as an infrastructure failure. */
    j = load_attempt(&a);
    ck_assert_str_eq(json_get_str(j, "status"), "stale");
    ck_assert_ptr_nonnull(json_get_str(j, "stale_at"));
    ck_assert_str_eq(json_get_str(j, "failure_class"), "infrastructure");
    cJSON_Delete(j);

    /* A is fenced: its heartbeat fails, its result is never published,
     * and its release leaves B's lock alone. */
    ck_assert_int_eq(claim_heartbeat(&a, &err), -ESTALE);
    fin = finish(&ca, &a, &ra);
    ck_assert_str_eq(fin.status, "stale");
    ck_assert(!fin.shard_done && !fin.shard_failed);
    done = manifest_state_path(&M, "done", id(2), ".json");
    ck_assert(!tu_exists(done));
    j = load_attempt(&a);
    ck_assert_str_eq(json_get_str(j, "status"), "stale");
    ck_assert_ptr_nonnull(json_get_str(j, "stale_at"));
    cJSON_Delete(j);
    ck_assert_int_eq(claim_release(&a, &err), 0);
    ck_assert(tu_exists(b.lock_path));
    ck_assert_int_eq(claim_heartbeat(&b, &err), 0);
    after = tu_read(b.lock_path, NULL);
    ck_assert_ptr_nonnull(strstr(after, b.token));
    free(after);

    /* B finishes and publishes. */
    materialize(&b, &rb);
    fin = finish(&cb, &b, &rb);
    ck_assert_str_eq(fin.status, "done");
    ck_assert(fin.shard_done && !fin.shard_failed);
    ck_assert(!tu_exists(b.lock_path));
    j = load(done);
    ck_assert_str_eq(json_get_str(j, "token"), b.token);
    ck_assert_str_eq(json_get_str(j, "node"), "node-b");
    ck_assert_str_eq(json_get_str(j, "hostname"), "host-node-b");
    ck_assert_int_eq(get_int(j, "attempt_number"), 2);
    cJSON_Delete(j);

    attempt_result_free(&ra);
    attempt_result_free(&rb);
    free(before);
    free(stale_dir);
    free(done);
    free(name);
    free(pfx);
    claim_free(&a);
    claim_free(&b);
    claimer_free(&ca);
    claimer_free(&cb);
}
END_TEST

START_TEST(test_fresh_lock_not_taken_over)
{
    struct claimer ca, cb;
    struct claim a, b;
    struct claim_idle idle;
    char *before, *after;

    done_except(0);
    claimer(&ca, "node-a", 60, 0);
    ck_assert_int_eq(acquire(&ca, &a, NULL), 1);
    before = tu_read(a.lock_path, NULL);
    tu_set_age(a.lock_path, 50);
    claimer(&cb, "node-b", 60, 0);
    ck_assert_int_eq(acquire(&cb, &b, &idle), 0);
    ck_assert_uint_eq(idle.busy, 1);
    ck_assert_uint_eq(idle.done, 2);
    ck_assert_msg(idle.next_secs > 5 && idle.next_secs <= 10.5, "next_secs %f", idle.next_secs);
    after = tu_read(a.lock_path, NULL);
    ck_assert_str_eq(after, before);
    ck_assert_int_eq(count_in("state/stale_locks"), 0);
    ck_assert_int_eq(tu_count_entries(a.attempt_dir), 1);
    free(before);
    free(after);
    claim_free(&a);
    claimer_free(&ca);
    claimer_free(&cb);
}
END_TEST

/* The last shard ends on another node: its lock, cached as fresh, is gone
 * and its done record there. The next idle pass sees the job complete at
 * once, not when the cached lease would have run out. */
START_TEST(test_end_of_fresh_lock_seen_at_once)
{
    struct claimer c;
    struct claim cl;
    struct claim_idle idle;
    char *path = lock_path(0);

    done_except(0);
    put_lock(0, 600, 1);
    claimer(&c, "node-b", 600, 0);
    ck_assert_int_eq(acquire(&c, &cl, &idle), 0);
    ck_assert_uint_eq(idle.busy, 1);
    ck_assert(!idle.complete);
    /* still there: still busy, and nothing taken over */
    ck_assert_int_eq(acquire(&c, &cl, &idle), 0);
    ck_assert_uint_eq(idle.busy, 1);
    ck_assert_int_eq(unlink(path), 0);
    tu_put_done(&M, 0);
    ck_assert_int_eq(acquire(&c, &cl, &idle), 0);
    ck_assert_uint_eq(idle.busy, 0);
    ck_assert(idle.complete);
    ck_assert_int_eq(count_in("state/stale_locks"), 0);
    claimer_free(&c);
    free(path);
}
END_TEST

/* A claimer with the given lease and lock timeout judges shard 0's lock:
 * returns whether it took it over (and checks what that left). */
static bool
taken_over(long long lease, long long lock_timeout)
{
    struct claimer c;
    struct claim cl;
    struct claim_idle idle;
    int before = count_in("state/stale_locks"), r;

    claimer(&c, "judge", lease, lock_timeout);
    r = acquire(&c, &cl, &idle);
    if (r == 1) {
        ck_assert_uint_eq(cl.index, 0);
        ck_assert_int_eq(count_in("state/stale_locks"), before + 1);
        claim_free(&cl);
    } else {
        ck_assert_uint_eq(idle.busy, 1);
        ck_assert_int_eq(count_in("state/stale_locks"), before);
    }
    claimer_free(&c);
    return r == 1;
}

START_TEST(test_lease_of_the_lock_decides)
{
    char *path = lock_path(0);

    done_except(0);
    /* The lock's own lease_secs wins over the claimer's lease and the
     * lock timeout. */
    put_lock(0, 30, 20);
    ck_assert(!taken_over(600, 1));
    tu_set_age(path, 40);
    ck_assert(taken_over(600, 100000));
    free(path);
}
END_TEST

START_TEST(test_reference_lock_uses_lock_timeout)
{
    char *path = lock_path(0);

    /* A lock without lease_secs, 100 s old; the claimers' own leases
     * (10 s, 600 s) must not matter. */
    done_except(0);
    put_lock(0, 0, 100);
    /* The manifest's timeout: the reference's default, 3600, 50 ... */
    ck_assert_int_eq(M.lock_timeout_secs, POLICY_LOCK_TIMEOUT_DEFAULT);
    ck_assert(!taken_over(10, 0));
    M.lock_timeout_secs = 3600;
    ck_assert(!taken_over(10, 0));
    /* ... unless the claimer sets its own ... */
    M.lock_timeout_secs = 50;
    ck_assert(!taken_over(10, 3600));
    ck_assert(taken_over(600, 0));
    ck_assert_int_eq(unlink(path), 0);
    M.lock_timeout_secs = POLICY_LOCK_TIMEOUT_DEFAULT;
    put_lock(0, 0, 100);
    ck_assert(taken_over(600, 50));
    free(path);
}
END_TEST

/* A dead node's lock is reclaimed first, wherever it lies relative to the
 * claimer's cursor: a takeover does not wait for the pending shards. */
START_TEST(test_stale_lock_reclaimed_before_pending_shards)
{
    struct claimer c;
    struct claim cl;
    size_t dead;

    claimer(&c, "node-a", 60, 0);
    /* the shard just behind the cursor: the last one a forward scan sees */
    dead = (c.cursor + M.nshards - 1) % M.nshards;
    put_lock(dead, 30, 600);
    ck_assert_int_eq(acquire(&c, &cl, NULL), 1);
    ck_assert_uint_eq(cl.index, dead);
    ck_assert_int_eq(count_in("state/stale_locks"), 1);
    claim_free(&cl);
    claimer_free(&c);
}
END_TEST

/* A fresh reference lock (35 h) is judged again only when its timeout
 * could have run out, not after the claimer's own lease: its release or
 * the end of its shard shows in the listings of state/locks and
 * state/done, at once. */
START_TEST(test_fresh_reference_lock_rechecked_at_its_timeout)
{
    struct claimer c;
    struct claim cl;
    struct claim_idle idle;
    char *path = lock_path(0);

    done_except(0);
    put_lock(0, 0, 10);
    claimer(&c, "judge", 30, 0);
    ck_assert_int_eq(acquire(&c, &cl, &idle), 0);
    ck_assert_uint_eq(idle.busy, 1);
    ck_assert_msg(idle.next_secs > (double)M.lock_timeout_secs - 15 &&
                      idle.next_secs <= (double)M.lock_timeout_secs,
                  "next_secs %f", idle.next_secs);
    /* released: claimed at the next pass */
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(acquire(&c, &cl, &idle), 1);
    ck_assert_uint_eq(cl.index, 0);
    claim_free(&cl);
    claimer_free(&c);
    free(path);
}
END_TEST

START_TEST(test_empty_lock_judged_by_own_lease)
{
    char *path = lock_path(0);

    done_except(0);
    put_file(path, "");
    tu_set_age(path, 30);
    ck_assert(!taken_over(60, 1));
    tu_set_age(path, 90);
    ck_assert(taken_over(60, 100000));
    free(path);
}
END_TEST

START_TEST(test_garbage_lock_judged_by_own_lease)
{
    char *path = lock_path(0);

    /* Its writer died while writing. */
    done_except(0);
    put_file(path, "{\"shard_id\": \"");
    tu_set_age(path, 30);
    ck_assert(!taken_over(60, 1));
    tu_set_age(path, 90);
    ck_assert(taken_over(60, 100000));
    free(path);
}
END_TEST

START_TEST(test_stale_lock_under_flock_is_skipped)
{
    char *path = lock_path(0);
    int fd;

    /* A reference worker publishing or releasing holds the flock: the
     * takeover waits for the next pass. */
    done_except(0);
    put_lock(0, 30, 600);
    fd = open(path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(flock(fd, LOCK_EX), 0);
    {
        struct claimer c;
        struct claim cl;

        claimer(&c, "judge", 60, 0);
        ck_assert_int_eq(acquire(&c, &cl, NULL), 0);
        claimer_free(&c);
    }
    ck_assert(tu_exists(path));
    ck_assert_int_eq(count_in("state/stale_locks"), 0);
    flock(fd, LOCK_UN);
    close(fd);
    ck_assert(taken_over(60, 0));
    free(path);
}
END_TEST

START_TEST(test_takeover_marks_attempt_of_reference_lock)
{
    struct claimer c;
    struct claim cl;
    char *path = lock_path(1), *line;
    char *rel = xasprintf("attempts/%s/0001-0123456789abcdef0123456789abcdef", id(1));
    cJSON *j;

    /* A reference worker died: its lock names its running attempt. */
    done_except(1);
    put_attempt(1, "0001-0123456789abcdef0123456789abcdef",
                "{\"status\": \"running\", \"token\": \"old\"}\n");
    line = xasprintf("{\"attempt_dir\": \"%s\", \"attempt_number\": 1, \"shard_id\": \"%s\", "
                     "\"token\": \"old\"}\n",
                     rel, id(1));
    put_file(path, line);
    tu_set_age(path, 200);
    claimer(&c, "judge", 60, 100);
    ck_assert_int_eq(acquire(&c, &cl, NULL), 1);
    ck_assert_int_eq(cl.attempt_number, 2);
    {
        char *p = xasprintf("%s/%s/attempt.json", M.job_dir, rel);

        j = load(p);
        free(p);
    }
    ck_assert_str_eq(json_get_str(j, "status"), "stale");
    ck_assert_ptr_nonnull(json_get_str(j, "stale_at"));
    ck_assert_str_eq(json_get_str(j, "token"), "old");
    cJSON_Delete(j);
    claim_free(&cl);
    claimer_free(&c);
    free(line);
    free(rel);
    free(path);
}
END_TEST

/* A claim of this node's previous run is taken back at once, whatever
 * its age, if it still holds its token; another claim's lock is not. */
START_TEST(test_recover_own_claim)
{
    struct claimer old, c;
    struct claim a, b;
    struct esd_err err;
    char *rel, *p;
    cJSON *j;

    done_except(0);
    claimer(&old, "node-a", 600, 0);
    ck_assert_int_eq(acquire(&old, &a, NULL), 1);
    rel = xstrdup(a.attempt_rel);
    claimer(&c, "node-a", 600, 0);
    /* a fresh lock of another claim: left alone */
    ck_assert_int_eq(claim_recover(&c, a.shard_id, "ffffffffffffffffffffffffffffffff", &err), 0);
    ck_assert(tu_exists(a.lock_path));
    ck_assert_int_eq(acquire(&c, &b, NULL), 0);
    /* its own token: taken back, attempt stale, claimable again */
    ck_assert_msg(claim_recover(&c, a.shard_id, a.token, &err) == 1, "%s", err.msg);
    ck_assert(!tu_exists(a.lock_path));
    ck_assert_int_eq(count_in("state/stale_locks"), 1);
    p = xasprintf("%s/%s/attempt.json", M.job_dir, rel);
    j = load(p);
    ck_assert_str_eq(json_get_str(j, "status"), "stale");
    cJSON_Delete(j);
    ck_assert_int_eq(acquire(&c, &b, NULL), 1);
    ck_assert_uint_eq(b.index, 0);
    ck_assert_int_eq(b.attempt_number, 2);
    /* gone or unknown: nothing to do, or an error naming the shard */
    ck_assert_int_eq(claim_recover(&c, a.shard_id, a.token, &err), 0);
    ck_assert_int_eq(claim_recover(&c, "no-such-shard", a.token, &err), -ENOENT);
    ck_assert_ptr_nonnull(strstr(err.msg, "no-such-shard"));
    free(p);
    free(rel);
    claim_free(&a);
    claim_free(&b);
    claimer_free(&old);
    claimer_free(&c);
}
END_TEST

/* ---- heartbeats and release ---- */

static double
mtime_of(const char *path)
{
    struct stat st;

    ck_assert_int_eq(stat(path, &st), 0);
    return (double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec / 1e9;
}

START_TEST(test_heartbeat_renews_and_detects_loss)
{
    struct claimer c;
    struct claim cl;
    struct esd_err err;
    char *orig, *other;

    claimer(&c, "node-a", 60, 0);
    ck_assert_int_eq(acquire(&c, &cl, NULL), 1);
    orig = tu_read(cl.lock_path, NULL);

    /* Renewal: an old mtime becomes now. */
    tu_set_age(cl.lock_path, 500);
    ck_assert(mtime_of(cl.lock_path) < (double)time(NULL) - 400);
    ck_assert_msg(claim_heartbeat(&cl, &err) == 0, "%s", err.msg);
    ck_assert(mtime_of(cl.lock_path) > (double)time(NULL) - 10);
    ck_assert(holds(cl.lock_path, orig));

    /* Rewritten in place (same inode) with another token. */
    other = xstrdup(orig);
    /* (the token also appears in attempt_dir, which comes first) */
    memcpy(strstr(other, "\"token\": \"") + 10, "ffffffffffffffffffffffffffffffff", 32);
    {
        int fd = open(cl.lock_path, O_WRONLY | O_TRUNC);

        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(fs_write_all(fd, other, strlen(other)), 0);
        close(fd);
    }
    ck_assert_int_eq(claim_heartbeat(&cl, &err), -ESTALE);
    ck_assert_ptr_nonnull(strstr(err.msg, "another token"));
    ck_assert_int_eq(claim_release(&cl, &err), 0);
    ck_assert(tu_exists(cl.lock_path));
    {
        int fd = open(cl.lock_path, O_WRONLY | O_TRUNC);

        ck_assert_int_ge(fd, 0);
        ck_assert_int_eq(fs_write_all(fd, orig, strlen(orig)), 0);
        close(fd);
    }
    ck_assert_int_eq(claim_heartbeat(&cl, &err), 0);

    /* Replaced by another file with the same content (a new inode): not
     * ours to renew, and not ours to release either. */
    put_file(cl.lock_path, orig);
    tu_set_age(cl.lock_path, 500);
    ck_assert_int_eq(claim_heartbeat(&cl, &err), -ESTALE);
    ck_assert_ptr_nonnull(strstr(err.msg, "replaced"));
    ck_assert(mtime_of(cl.lock_path) < (double)time(NULL) - 400);
    ck_assert_int_eq(claim_release(&cl, &err), 0);
    ck_assert(tu_exists(cl.lock_path));

    /* Removed. */
    ck_assert_int_eq(unlink(cl.lock_path), 0);
    ck_assert_int_eq(claim_heartbeat(&cl, &err), -ESTALE);
    ck_assert_ptr_nonnull(strstr(err.msg, "removed"));
    ck_assert_int_eq(claim_release(&cl, &err), 0);

    free(other);
    free(orig);
    claim_free(&cl);
    claimer_free(&c);
}
END_TEST

START_TEST(test_release_removes_own_lock_once)
{
    struct claimer c;
    struct claim cl, again;
    struct esd_err err;

    claimer(&c, "node-a", 60, 0);
    ck_assert_int_eq(acquire(&c, &cl, NULL), 1);
    ck_assert_int_eq(claim_release(&cl, &err), 1);
    ck_assert(!tu_exists(cl.lock_path));
    ck_assert_int_eq(claim_release(&cl, &err), 0);
    /* Released and forgotten: the shard can be claimed again, as the
     * next attempt. */
    claimer_forget(&c, &cl, false, false);
    for (int k = 0; k < 3; k++) {
        ck_assert_int_eq(acquire(&c, &again, NULL), 1);
        if (again.index == cl.index)
            break;
        claim_free(&again);
    }
    ck_assert_uint_eq(again.index, cl.index);
    ck_assert_int_eq(again.attempt_number, 2);
    claim_free(&again);
    claim_free(&cl);
    claimer_free(&c);
}
END_TEST

/* ---- limits before the claim ---- */

START_TEST(test_retry_limit_reached_before_claim)
{
    struct claimer c;
    struct claim cl;
    struct claim_idle idle;
    char *failed = manifest_state_path(&M, "failed", id(1), ".json"), *attempts, *text;
    cJSON *j;

    done_except(1);
    for (int k = 1; k <= 4; k++) {
        char name[40];

        snprintf(name, sizeof(name), "%04d-%032d", k, k);
        put_attempt(1, name, "{\"status\": \"failed\"}\n");
    }
    claimer(&c, "node-a", 60, 0);
    ck_assert_int_eq(acquire(&c, &cl, &idle), 0);
    ck_assert(idle.terminal && !idle.complete);
    ck_assert_uint_eq(idle.failed, 1);
    ck_assert_uint_eq(idle.done, 2);
    ck_assert_uint_eq(idle.busy, 0);
    ck_assert(!lock_exists(1));
    attempts = xasprintf("%s/attempts/%s", M.job_dir, id(1));
    ck_assert_int_eq(tu_count_entries(attempts), 4);
    j = load(failed);
    ck_assert_str_eq(json_get_str(j, "shard_id"), id(1));
    ck_assert_str_eq(json_get_str(j, "status"), "failed");
    ck_assert_str_eq(json_get_str(j, "reason"), "retry limit reached before claim");
    ck_assert_ptr_nonnull(json_get_str(j, "failed_at"));
    ck_assert_int_eq(get_int(j, "failures"), 4);
    ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(j, "last_error"));
    cJSON_Delete(j);

    /* Terminal now: later passes leave it alone. */
    text = tu_read(failed, NULL);
    ck_assert_int_eq(acquire(&c, &cl, &idle), 0);
    ck_assert(idle.terminal);
    ck_assert(holds(failed, text));
    ck_assert(!lock_exists(1));
    free(text);
    free(attempts);
    free(failed);
    claimer_free(&c);
}
END_TEST

START_TEST(test_three_failures_are_under_the_limit)
{
    struct claimer c;
    struct claim cl;

    done_except(1);
    for (int k = 1; k <= 3; k++) {
        char name[40];

        snprintf(name, sizeof(name), "%04d-%032d", k, k);
        put_attempt(1, name, "{\"status\": \"failed\"}\n");
    }
    /* Stale takeovers of reference attempts are infrastructure failures:
     * they do not use up max_retries. */
    put_attempt(1, "0004-0123456789abcdef0123456789abcdef", "{\"status\": \"stale\"}\n");
    put_attempt(1, "0005-0123456789abcdef0123456789abcdef", "{\"status\": \"stale\"}\n");
    claimer(&c, "node-a", 60, 0);
    ck_assert_int_eq(acquire(&c, &cl, NULL), 1);
    ck_assert_uint_eq(cl.index, 1);
    ck_assert_int_eq(cl.attempt_number, 6);
    claim_free(&cl);
    claimer_free(&c);
}
END_TEST

START_TEST(test_infra_limit_reached_before_claim)
{
    struct claimer c;
    struct claim cl;
    struct claim_opts o = { .node = "node-a", .max_retries = -1, .max_infra = 2 };
    struct esd_err err;
    char *failed = manifest_state_path(&M, "failed", id(1), ".json");
    cJSON *j;

    done_except(1);
    for (int k = 1; k <= 3; k++) {
        char name[40];

        snprintf(name, sizeof(name), "%04d-%032d", k, k);
        put_attempt(1, name, "{\"status\": \"stale\"}\n");
    }
    ck_assert_int_eq(claimer_init(&c, &M, &o, &err), 0);
    ck_assert_int_eq(acquire(&c, &cl, NULL), 0);
    j = load(failed);
    ck_assert_str_eq(json_get_str(j, "reason"),
                     "infrastructure failure limit reached before claim");
    ck_assert_int_eq(get_int(j, "failures"), 0);
    ck_assert_int_eq(get_int(j, "infrastructure_failures"), 3);
    ck_assert(!lock_exists(1));
    cJSON_Delete(j);
    free(failed);
    claimer_free(&c);
}
END_TEST

/* ---- what changes under a primed claimer ---- */

START_TEST(test_result_published_under_primed_cache)
{
    struct claimer c, other;
    struct claim first, second, none;
    struct claim_idle idle;
    size_t next, last;
    char *attempts;

    claimer(&c, "node-a", 60, 0);
    ck_assert_int_eq(acquire(&c, &first, NULL), 1);
    /* The pass continues after the shard it claimed. */
    next = (first.index + 1) % 3;
    last = (first.index + 2) % 3;
    tu_put_done(&M, next);
    ck_assert_int_eq(acquire(&c, &second, NULL), 1);
    ck_assert_uint_eq(second.index, last);
    ck_assert(!lock_exists(next));
    attempts = xasprintf("%s/attempts/%s", M.job_dir, id(next));
    ck_assert(!tu_exists(attempts));
    free(attempts);

    /* Another node learns it from its own listing. */
    claimer(&other, "node-b", 60, 0);
    ck_assert_int_eq(acquire(&other, &none, &idle), 0);
    ck_assert_uint_eq(idle.done, 1);
    ck_assert_uint_eq(idle.busy, 2);
    claim_free(&first);
    claim_free(&second);
    claimer_free(&c);
    claimer_free(&other);
}
END_TEST

START_TEST(test_failed_published_under_primed_cache)
{
    struct claimer c;
    struct claim first, none;
    struct claim_idle idle;
    size_t a, b;
    char *path;
    cJSON *j = cJSON_CreateObject();
    struct esd_err err;

    claimer(&c, "node-a", 60, 0);
    ck_assert_int_eq(acquire(&c, &first, NULL), 1);
    a = (first.index + 1) % 3;
    b = (first.index + 2) % 3;
    tu_put_done(&M, a);
    path = manifest_state_path(&M, "failed", id(b), ".json");
    json_add_str(j, "shard_id", id(b));
    json_add_str(j, "status", "failed");
    ck_assert_int_eq(json_publish_excl(path, j, JSON_PRETTY, &err), 0);
    ck_assert_int_eq(acquire(&c, &none, &idle), 0);
    ck_assert_uint_eq(idle.done, 1);
    ck_assert_uint_eq(idle.failed, 1);
    ck_assert_uint_eq(idle.busy, 1);
    ck_assert(!idle.terminal);
    ck_assert(!lock_exists(a));
    ck_assert(!lock_exists(b));
    ck_assert_int_eq(count_in("state/locks"), 1);
    cJSON_Delete(j);
    free(path);
    claim_free(&first);
    claimer_free(&c);
}
END_TEST

START_TEST(test_requeue_seen_by_idle_claimer)
{
    struct claimer c;
    struct claim cl;
    struct claim_idle idle;
    struct strv req;
    struct esd_err err;
    char *path = manifest_state_path(&M, "failed", id(2), ".json");
    cJSON *j = cJSON_CreateObject();

    done_except(2);
    put_attempt(2, "0001-0123456789abcdef0123456789abcdef",
                "{\"status\": \"failed\", \"failure_class\": \"processor\"}\n");
    json_add_str(j, "shard_id", id(2));
    json_add_str(j, "status", "failed");
    json_add_int(j, "failures", 4);
    ck_assert_int_eq(json_publish_excl(path, j, JSON_PRETTY, &err), 0);
    claimer(&c, "node-a", 60, 0);
    ck_assert_int_eq(acquire(&c, &cl, &idle), 0);
    ck_assert(idle.terminal);
    ck_assert_uint_eq(idle.failed, 1);

    strv_init(&req);
    ck_assert_msg(retry_run(&M, true, NULL, &req, &err) == 0, "%s", err.msg);
    ck_assert_uint_eq(req.n, 1);
    /* The idle pass notices the requeue ... */
    ck_assert_int_eq(acquire(&c, &cl, &idle), 0);
    ck_assert_uint_eq(idle.failed, 0);
    ck_assert(!idle.terminal);
    /* ... and the next pass claims it afresh. */
    ck_assert_int_eq(acquire(&c, &cl, &idle), 1);
    ck_assert_uint_eq(cl.index, 2);
    ck_assert_int_eq(cl.attempt_number, 1);
    strv_free(&req);
    cJSON_Delete(j);
    free(path);
    claim_free(&cl);
    claimer_free(&c);
}
END_TEST

START_TEST(test_requeued_and_done_elsewhere_counted_once)
{
    struct claim_opts o = { .node = "node-a", .hostname = "host-a", .max_retries = 0 };
    struct attempt_outcome out = { .return_code = 1, .fc = FC_PROCESSOR, .error = "exit code 1" };
    struct claimer c;
    struct claim cl, none;
    struct claim_idle idle;
    struct attempt_final fin;
    struct strv req;
    struct esd_err err;
    char *path = manifest_state_path(&M, "failed", id(2), ".json");
    cJSON *j = cJSON_CreateObject();

    /* Shard 0 done, shard 2 failed, shard 1 ours. */
    tu_put_done(&M, 0);
    json_add_str(j, "shard_id", id(2));
    json_add_str(j, "status", "failed");
    ck_assert_int_eq(json_publish_excl(path, j, JSON_PRETTY, &err), 0);
    ck_assert_int_eq(claimer_init(&c, &M, &o, &err), 0);
    ck_assert_int_eq(acquire(&c, &cl, NULL), 1);
    ck_assert_uint_eq(cl.index, 1);
    ck_assert_int_eq(acquire(&c, &none, &idle), 0);
    ck_assert_uint_eq(idle.done, 1);
    ck_assert_uint_eq(idle.failed, 1);

    /* Shard 2 is requeued and completed by another node between two
     * idle passes: it is done now, and no longer failed. */
    strv_init(&req);
    ck_assert_msg(retry_run(&M, true, NULL, &req, &err) == 0, "%s", err.msg);
    tu_put_done(&M, 2);
    ck_assert_int_eq(acquire(&c, &none, &idle), 0);
    ck_assert_uint_eq(idle.done, 2);
    ck_assert_uint_eq(idle.failed, 0);
    ck_assert_uint_eq(idle.busy, 1);
    ck_assert(!idle.complete && !idle.terminal);

    /* Our shard fails for good: the job is terminal. */
    ck_assert_msg(attempt_finish(&c, &cl, &out, NULL, &fin, &err) == 0, "%s", err.msg);
    ck_assert(fin.shard_failed);
    ck_assert_int_eq(acquire(&c, &none, &idle), 0);
    ck_assert_uint_eq(idle.done, 2);
    ck_assert_uint_eq(idle.failed, 1);
    ck_assert(idle.terminal && !idle.complete);

    strv_free(&req);
    cJSON_Delete(j);
    free(path);
    claim_free(&cl);
    claimer_free(&c);
}
END_TEST

/* ---- cost, cancel, suspect mtimes (issue 12) ---- */

/* A job of n one-record shards in <tmp>/big/job (the caller frees m). */
static void
big_job(size_t n, struct manifest *m)
{
    struct prepare_opts o;
    struct prepare_result res;
    struct esd_err err;
    struct buf b;
    char *dir = fs_join(tmp, "big"), *recipe, *data, *job;

    buf_init(&b);
    for (size_t i = 0; i < n; i++)
        buf_printf(&b, "{\"text\":\"r%zu\"}\n", i);
    data = tu_write(dir, "data.jsonl", b.p, b.len);
    recipe = tu_write(dir, "recipe.yaml", "process:\n  - whitespace_normalization_mapper:\n",
                      (size_t)-1);
    job = fs_join(dir, "job");
    prepare_opts_init(&o);
    o.config = recipe;
    o.dataset_path = data;
    o.job_dir = job;
    o.num_shards = (long long)n;
    ck_assert_msg(prepare_run(&o, &res, &err) == 0, "prepare: %s", err.msg);
    ck_assert_msg(manifest_load(res.job_dir, m, &err) == 0, "manifest: %s", err.msg);
    ck_assert_uint_eq(m->nshards, n);
    prepare_result_free(&res);
    buf_free(&b);
    free(recipe);
    free(data);
    free(job);
    free(dir);
}

static void
claimer_of(struct claimer *c, const struct manifest *m, const char *node)
{
    struct claim_opts o = { .node = node, .hostname = node, .lease_secs = 60, .max_retries = -1 };
    struct esd_err err;

    ck_assert_msg(claimer_init(c, m, &o, &err) == 0, "%s", err.msg);
}

/* What a node does when its attempt of cl succeeds: the done record, then
 * the lock goes. */
static void
finish_done(struct claimer *c, const struct manifest *m, struct claim *cl)
{
    tu_put_done(m, cl->index);
    ck_assert_int_eq(unlink(cl->lock_path), 0);
    claimer_forget(c, cl, true, false);
    claim_free(cl);
}

/* Pretends that a moment passed since c's last listings: a change within
 * their timestamps' granule is not to be feared any more. */
static void
settle(struct claimer *c)
{
    for (size_t k = 0; k < sizeof(c->dirs) / sizeof(c->dirs[0]); k++)
        c->dirs[k].unsettled = false;
}

/* Three nodes finish a 40-shard job in turns: each shard is claimed once,
 * and no node ever creates a lock it does not claim with (the shards the
 * others finished are passed on their done records). Every node sees the
 * job complete. */
START_TEST(test_done_elsewhere_costs_no_lock)
{
    struct manifest m;
    struct claimer c[3];
    const char *nodes[3] = { "node-a", "node-b", "node-c" };
    int claims[40] = { 0 }, complete = 0;
    bool seen[3] = { false };
    unsigned long long created = 0, claimed = 0;

    big_job(40, &m);
    for (int k = 0; k < 3; k++)
        claimer_of(&c[k], &m, nodes[k]);
    for (int turn = 0; complete < 3 && turn < 1000; turn++) {
        struct claimer *x = &c[turn % 3];
        bool *end = &seen[turn % 3];
        struct claim cl;
        struct claim_idle idle;
        int r = acquire(x, &cl, &idle);

        if (r == 1) {
            claims[cl.index]++;
            finish_done(x, &m, &cl);
        } else if (idle.complete) {
            complete += !*end;
            *end = true;
        } else {
            ck_assert_msg(idle.more, "idle before the end: done %zu busy %zu", idle.done,
                          idle.busy);
        }
    }
    ck_assert_int_eq(complete, 3);
    for (size_t i = 0; i < 40; i++)
        ck_assert_msg(claims[i] == 1, "shard %zu claimed %d times", i, claims[i]);
    for (int k = 0; k < 3; k++) {
        ck_assert_uint_eq(c[k].stats.locks_created, c[k].stats.claimed);
        ck_assert_uint_eq(c[k].stats.passed_done + c[k].stats.claimed, 40);
        ck_assert_uint_eq(c[k].ndone, 40);
        created += c[k].stats.locks_created;
        claimed += c[k].stats.claimed;
        claimer_free(&c[k]);
    }
    ck_assert_uint_eq(created, 40);
    ck_assert_uint_eq(claimed, 40);
    manifest_free(&m);
}
END_TEST

/* A pass is bounded: 63 shards done elsewhere since the last listing are
 * passed CLAIM_PASS_BUDGET at a time (idle.more: call again), each on one
 * stat, without a lock. */
START_TEST(test_pass_is_bounded)
{
    struct manifest m;
    struct claimer c;
    struct claim cl, none;
    struct claim_idle idle;
    unsigned long long ops;
    int calls = 0;

    big_job(64, &m);
    claimer_of(&c, &m, "node-a");
    ck_assert_int_eq(acquire(&c, &cl, &idle), 1);
    for (size_t i = 0; i < 64; i++)
        if (i != cl.index)
            tu_put_done(&m, i);
    settle(&c);
    ops = c.stats.ops;
    ck_assert_int_eq(acquire(&c, &none, &idle), 0);
    ck_assert(idle.more);
    ck_assert_uint_eq(c.stats.passed_done, CLAIM_PASS_BUDGET);
    /* the cancel marker, three directories, state/locks listed again
     * (our lock), a stat a shard */
    ck_assert_uint_le(c.stats.ops - ops, 5 + CLAIM_PASS_BUDGET);
    for (calls = 1; idle.more && calls < 64; calls++)
        ck_assert_int_eq(acquire(&c, &none, &idle), 0);
    ck_assert(!idle.more);
    ck_assert_uint_eq(idle.done, 63);
    ck_assert_uint_eq(idle.busy, 1);
    ck_assert_int_ge(calls, 63 / CLAIM_PASS_BUDGET);
    ck_assert_uint_eq(c.stats.locks_created, 1);
    finish_done(&c, &m, &cl);
    ck_assert_int_eq(acquire(&c, &cl, &idle), 0);
    ck_assert(idle.complete);
    claimer_free(&c);
    manifest_free(&m);
}
END_TEST

/* Waiting while another node runs the last shards (as many as may be
 * judged at once, CLAIM_JUDGE_BURST): a pass costs the cancel
 * marker and three directory looks, the idle report asks for enough time
 * to keep to CLAIM_IDLE_RATE, fresh locks are not looked at again before
 * their lease could end, and the end of a shard elsewhere is seen at the
 * next pass. */
START_TEST(test_idle_pass_is_cheap)
{
    struct manifest m;
    struct claimer x, y;
    struct claim cl[4], none;
    struct claim_idle idle;
    unsigned long long ops;

    big_job(40, &m);
    claimer_of(&x, &m, "node-x");
    for (int k = 0; k < 4; k++)
        ck_assert_int_eq(acquire(&x, &cl[k], NULL), 1);
    for (size_t i = 0; i < 40; i++) {
        bool mine = false;

        for (int k = 0; k < 4; k++)
            mine |= cl[k].index == i;
        if (!mine)
            tu_put_done(&m, i);
    }
    claimer_of(&y, &m, "node-y");
    ck_assert_int_eq(acquire(&y, &none, &idle), 0);
    ck_assert_uint_eq(idle.busy, 4);
    ck_assert_uint_eq(idle.done, 36);
    ck_assert_msg(idle.next_secs > 55 && idle.next_secs <= 60, "next_secs %f", idle.next_secs);
    settle(&y);
    ops = y.stats.ops;
    ck_assert_int_eq(acquire(&y, &none, &idle), 0);
    ck_assert_uint_le(y.stats.ops - ops, 4);
    ck_assert(idle.min_secs >= (double)(y.stats.ops - ops) / CLAIM_IDLE_RATE);
    ck_assert_uint_eq(y.stats.locks_created, 0);
    /* one of x's shards ends */
    finish_done(&x, &m, &cl[3]);
    ck_assert_int_eq(acquire(&y, &none, &idle), 0);
    ck_assert_uint_eq(idle.done, 37);
    ck_assert_uint_eq(idle.busy, 3);
    ck_assert_uint_eq(y.stats.locks_created, 0);
    for (int k = 0; k < 4; k++)
        if (k != 3)
            finish_done(&x, &m, &cl[k]);
    ck_assert_int_eq(acquire(&y, &none, &idle), 0);
    ck_assert(idle.complete);
    ck_assert_uint_eq(y.stats.locks_created, 0);
    ck_assert_uint_eq(y.stats.passed_done, 40);
    claimer_free(&x);
    claimer_free(&y);
    manifest_free(&m);
}
END_TEST

/* esctl cancel --everywhere's marker: no claim, no lock, no attempt, and
 * claims again once it is gone (submitted again). */
START_TEST(test_cancelled_job_claims_nothing)
{
    struct claimer c;
    struct claim cl;
    struct claim_idle idle;
    char *marker = job_path("state/esd/cancelled.json"), *attempts = job_path("attempts");

    free(tu_write(M.job_dir, "state/esd/cancelled.json", "{\"node\": \"x\"}\n", (size_t)-1));
    claimer(&c, "node-a", 60, 0);
    ck_assert_int_eq(acquire(&c, &cl, &idle), 0);
    ck_assert(idle.cancelled);
    ck_assert(!idle.more && !idle.complete);
    ck_assert_int_eq(count_in("state/locks"), 0);
    ck_assert(!tu_exists(attempts) || count_in("attempts") == 0);
    ck_assert_uint_eq(c.stats.locks_created, 0);
    ck_assert_int_eq(unlink(marker), 0);
    ck_assert_int_eq(acquire(&c, &cl, &idle), 1);
    ck_assert(!idle.cancelled);
    claim_free(&cl);
    claimer_free(&c);
    free(marker);
    free(attempts);
}
END_TEST

/* Ages shard 0's lock to an absolute mtime (epoch seconds). */
static void
set_mtime(size_t i, double epoch)
{
    char *path = lock_path(i);
    struct timespec ts[2];

    ts[0].tv_sec = (time_t)epoch;
    ts[0].tv_nsec = 0;
    ts[1] = ts[0];
    ck_assert_int_eq(utimensat(AT_FDCWD, path, ts, 0), 0);
    free(path);
}

/* Pretends that c first saw its suspect lock of shard i secs ago, and
 * that its cached lease ran out. */
static void
suspect_seen_ago(struct claimer *c, size_t i, double secs)
{
    bool found = false;

    for (size_t k = 0; k < sizeof(c->suspects) / sizeof(c->suspects[0]); k++)
        if (c->suspects[k].since > 0 && c->suspects[k].index == i) {
            c->suspects[k].since -= secs;
            found = true;
        }
    ck_assert_msg(found, "no suspect recorded for shard %zu", i);
    c->fresh_until[i] = 0;
}

/* A lock whose mtime is absurd (far in the future, or before 2000: an
 * NFSv3 exclusive create's verifier) is not taken over on that mtime, by
 * any number of claimers; the same mtime on the same lock a whole lease
 * later is; a heartbeat that makes the mtime sane makes it an ordinary
 * fresh lock. */
START_TEST(test_absurd_mtime_not_taken_over)
{
    double absurd[2] = { (double)time(NULL) + 1e6, 1.0 };

    done_except(0);
    for (int k = 0; k < 2; k++) {
        struct claimer a, b;
        struct claim cl;
        struct claim_idle idle;
        char *path = lock_path(0);

        put_lock(0, 30, 0);
        set_mtime(0, absurd[k]);
        claimer(&a, "judge-a", 30, 0);
        claimer(&b, "judge-b", 30, 0);
        ck_assert_int_eq(acquire(&a, &cl, &idle), 0);
        ck_assert_uint_eq(idle.busy, 1);
        ck_assert_int_eq(acquire(&b, &cl, &idle), 0);
        ck_assert_int_eq(count_in("state/stale_locks"), k);
        /* a few seconds later, still the same mtime: still not */
        suspect_seen_ago(&a, 0, 5);
        ck_assert_int_eq(acquire(&a, &cl, &idle), 0);
        ck_assert_int_eq(count_in("state/stale_locks"), k);
        if (k == 0) {
            /* its owner's heartbeat: an ordinary fresh lock now */
            tu_set_age(path, 1);
            suspect_seen_ago(&b, 0, 100);
            ck_assert_int_eq(acquire(&b, &cl, &idle), 0);
            ck_assert_int_eq(count_in("state/stale_locks"), 0);
            set_mtime(0, absurd[k]);
            claimer_free(&b);
            claimer(&b, "judge-b", 30, 0);
            ck_assert_int_eq(acquire(&b, &cl, &idle), 0);
        }
        /* unchanged for more than the lock's lease: stale */
        suspect_seen_ago(&b, 0, 31);
        ck_assert_int_eq(acquire(&b, &cl, &idle), 1);
        ck_assert_uint_eq(cl.index, 0);
        ck_assert(cl.took_over);
        ck_assert_int_eq(count_in("state/stale_locks"), k + 1);
        ck_assert_int_eq(claim_release(&cl, NULL), 1);
        claimer_forget(&b, &cl, false, false);
        claim_free(&cl);
        claimer_free(&a);
        claimer_free(&b);
        free(path);
    }
}
END_TEST

static Suite *
claim_suite(void)
{
    Suite *s = suite_create("claim");
    TCase *tc = tcase_create("claim");

    tcase_add_checked_fixture(tc, job_setup, job_teardown);
    tcase_add_test(tc, test_claim_writes_lock_and_attempt);
    tcase_add_test(tc, test_successive_claims_then_busy);
    tcase_add_test(tc, test_first_shard_depends_on_node);
    tcase_add_test(tc, test_invalid_node_name);
    tcase_add_test(tc, test_race_one_winner);
    tcase_add_test(tc, test_stale_takeover_fences_old_owner);
    tcase_add_test(tc, test_fresh_lock_not_taken_over);
    tcase_add_test(tc, test_lease_of_the_lock_decides);
    tcase_add_test(tc, test_reference_lock_uses_lock_timeout);
    tcase_add_test(tc, test_fresh_reference_lock_rechecked_at_its_timeout);
    tcase_add_test(tc, test_stale_lock_reclaimed_before_pending_shards);
    tcase_add_test(tc, test_empty_lock_judged_by_own_lease);
    tcase_add_test(tc, test_garbage_lock_judged_by_own_lease);
    tcase_add_test(tc, test_stale_lock_under_flock_is_skipped);
    tcase_add_test(tc, test_takeover_marks_attempt_of_reference_lock);
    tcase_add_test(tc, test_heartbeat_renews_and_detects_loss);
    tcase_add_test(tc, test_release_removes_own_lock_once);
    tcase_add_test(tc, test_retry_limit_reached_before_claim);
    tcase_add_test(tc, test_three_failures_are_under_the_limit);
    tcase_add_test(tc, test_infra_limit_reached_before_claim);
    tcase_add_test(tc, test_result_published_under_primed_cache);
    tcase_add_test(tc, test_failed_published_under_primed_cache);
    tcase_add_test(tc, test_requeue_seen_by_idle_claimer);
    tcase_add_test(tc, test_requeued_and_done_elsewhere_counted_once);
    tcase_add_test(tc, test_end_of_fresh_lock_seen_at_once);
    tcase_add_test(tc, test_recover_own_claim);
    tcase_add_test(tc, test_done_elsewhere_costs_no_lock);
    tcase_add_test(tc, test_pass_is_bounded);
    tcase_add_test(tc, test_idle_pass_is_cheap);
    tcase_add_test(tc, test_cancelled_job_claims_nothing);
    tcase_add_test(tc, test_absurd_mtime_not_taken_over);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    json_init();
    return tu_run(claim_suite());
}
