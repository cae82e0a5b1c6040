/*
 * fuzz_records: libFuzzer target for the readers of the job files that a
 * job's owner or any peer node writes: manifest.json (manifest_load), a
 * lock (the claim pass's judge and takeover, the heartbeat, status), a done
 * record (status, merge's verify), a failed record (status), attempt.json
 * (tries_count, tries_mark_stale) and merge.json (verify). The first
 * byte picks the file, the rest is its content, written into a job made
 * once in a private temporary directory; every reader must accept or
 * refuse it with a message, without crashing, hanging or leaking, and what
 * it accepts must satisfy the invariants the rest of esd relies on.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "attempt.h"
#include "claim.h"
#include "fsutil.h"
#include "json.h"
#include "manifest.h"
#include "merge.h"
#include "pypath.h"
#include "sha256.h"
#include "status.h"
#include "tries.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum target {
    T_MANIFEST,
    T_LOCK_STALE,
    T_LOCK_FRESH,
    T_LOCK_PADDED, /* past the lock reader's 64 KiB buffer */
    T_DONE,
    T_FAILED,
    T_ATTEMPT,
    T_MERGE_JSON,
    T__COUNT,
};

#define SHARD "part-00000-of-00001"
#define TOKEN "0123456789abcdef0123456789abcdef"
#define ATTEMPT "attempts/" SHARD "/0001-" TOKEN
/* The one result of the job: results/processed.jsonl. */
#define RESULT "{\"text\":\"x\"}\n"
/* The attempt a lock may name. */
#define RUNNING "{\"status\": \"running\", \"token\": \"" TOKEN "\"}\n"

static char *top;  /* the private temporary directory */
static char *job;  /* top/job: the job of every target but the manifest */
static char *mjob; /* top/mjob: a job directory for manifest.json alone */
static struct manifest M;
static char result_sha[SHA256_HEX_LEN + 1];

static void
put(const char *rel_to, const char *rel, const void *p, size_t n)
{
    char *path = fs_join(rel_to, rel);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);

    if (fd < 0 || fs_write_all(fd, p, n) < 0) {
        perror(path);
        abort();
    }
    close(fd);
    free(path);
}

static void
mkdirs(const char *base, const char *rel)
{
    char *path = fs_join(base, rel);

    if (fs_mkdir_p(path, 0755, NULL) < 0)
        abort();
    free(path);
}

static void
cleanup(void)
{
    if (top)
        fs_rm_rf(top);
}

/* The fixed job: one shard, its result, the state directories. */
static void
setup(void)
{
    static const char *const dirs[] = {
        "shards",     "results",      "attempts",          "state/locks",
        "state/done", "state/failed", "state/stale_locks", "state/clock",
    };
    const char *base = getenv("TMPDIR");
    char *tmpl, *manifest;
    struct esd_err err;

    json_init();
    /* tmpfs when there is one: the readers' writers fsync */
    if (!base || !*base)
        base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    tmpl = xasprintf("%s/fuzz-records.XXXXXX", base);
    if (!mkdtemp(tmpl) || pypath_realpath(tmpl, &top, NULL) < 0)
        abort();
    free(tmpl);
    atexit(cleanup);
    job = fs_join(top, "job");
    mjob = fs_join(top, "mjob");
    mkdirs(mjob, ".");
    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++)
        mkdirs(job, dirs[i]);
    put(job, "shards/" SHARD ".jsonl", RESULT, strlen(RESULT));
    put(job, "results/processed.jsonl", RESULT, strlen(RESULT));
    sha256_buf(RESULT, strlen(RESULT), result_sha);
    manifest =
        xasprintf("{\"schema_version\": 2, \"job_id\": \"fuzz\", "
                  "\"execution\": {\"executor_type\": \"ray\", \"ray_address\": \"local\"}, "
                  "\"policy\": {\"lock_timeout_secs\": 60, \"max_retries\": 3}, "
                  "\"shards\": [{\"id\": \"" SHARD "\", \"index\": 0, \"path\": \"shards/" SHARD
                  ".jsonl\", \"rows\": 1, \"size_bytes\": %zu, \"sha256\": \"%s\"}]}\n",
                  strlen(RESULT), result_sha);
    put(job, "manifest.json", manifest, strlen(manifest));
    free(manifest);
    if (manifest_load(job, &M, &err) < 0) {
        fprintf(stderr, "fuzz_records: %s\n", err.msg);
        abort();
    }
}

/* Back to the fixed job's initial state. */
static void
reset(void)
{
    static const char *const gone[] = {
        "state/locks/" SHARD ".lock",
        "state/done/" SHARD ".json",
        "state/failed/" SHARD ".json",
        "merge.json",
    };
    char *path;

    for (size_t i = 0; i < sizeof(gone) / sizeof(gone[0]); i++) {
        path = fs_join(job, gone[i]);
        unlink(path);
        free(path);
    }
    path = fs_join(job, "attempts");
    fs_rm_rf(path);
    free(path);
    path = fs_join(job, "state/stale_locks");
    fs_rm_rf(path);
    free(path);
    mkdirs(job, "attempts");
    mkdirs(job, "state/stale_locks");
}

/* A refusal carries a message and a negative errno. */
static void
refused(int r, const struct esd_err *err)
{
    if (r < 0 && (!err->msg[0] || err->code >= 0))
        abort();
}

static void
fuzz_manifest(const uint8_t *p, size_t n)
{
    struct manifest m;
    struct esd_err err;
    int r;

    put(mjob, "manifest.json", p, n);
    r = manifest_load(mjob, &m, &err);
    refused(r, &err);
    if (r < 0)
        return;
    if (m.nshards == 0 || m.lock_timeout_secs < 1 || m.max_retries < 0 ||
        m.poll_interval_secs < 1 || !m.ray_address || !*m.ray_address)
        abort();
    for (size_t i = 0; i < m.nshards; i++) {
        const struct manifest_shard *s = &m.shards[i];
        long found = manifest_find(&m, s->id);

        if (!manifest_id_ok(s->id) || !s->path || found < 0 ||
            strcmp(m.shards[found].id, s->id) != 0)
            abort();
    }
    {
        /* a status of the new job (no state yet) */
        struct job_status st;
        cJSON *j;

        r = status_compute(&m, 0, true, &st, &err);
        refused(r, &err);
        if (r == 0) {
            if (st.total != m.nshards || st.counts[ST_PENDING] != m.nshards)
                abort();
            j = status_json(&m, &st);
            cJSON_Delete(j);
            status_free(&st);
        }
    }
    manifest_free(&m);
}

/* status of the fixed job: the states add up. */
static void
fuzz_status(void)
{
    struct job_status st;
    struct esd_err err;
    size_t sum = 0;
    int r = status_compute(&M, 0, true, &st, &err);

    refused(r, &err);
    if (r < 0)
        return;
    for (int s = 0; s < ST__COUNT; s++)
        sum += st.counts[s];
    if (sum != st.total || st.total != 1)
        abort();
    cJSON_Delete(status_json(&M, &st));
    status_free(&st);
}

static void
fuzz_lock(enum target t, const uint8_t *p, size_t n)
{
    char *path = manifest_state_path(&M, "locks", SHARD, ".lock");
    struct claim_opts o = { .node = "fuzz", .hostname = "fuzz-host", .max_retries = -1 };
    struct claimer c;
    struct claim cl = { 0 }, fake = { 0 };
    struct esd_err err;
    struct stat st;
    int r;

    if (t == T_LOCK_PADDED) {
        /* Leading blanks so that the value lies across the end of what
         * the lock reader reads. */
        size_t pad = 65536 - n / 2;
        char *b = xmalloc(pad + n);

        memset(b, ' ', pad);
        memcpy(b + pad, p, n);
        put(job, "state/locks/" SHARD ".lock", b, pad + n);
        free(b);
    } else {
        put(job, "state/locks/" SHARD ".lock", p, n);
    }
    /* the heartbeat of a claim that holds TOKEN (it renews the lock) */
    if (stat(path, &st) < 0)
        abort();
    fake.shard_id = SHARD;
    memcpy(fake.token, TOKEN, sizeof(fake.token));
    fake.lock_path = path;
    fake.lock_dev = st.st_dev;
    fake.lock_ino = st.st_ino;
    r = claim_heartbeat(&fake, &err);
    refused(r, &err);
    if (t != T_LOCK_FRESH) {
        struct timespec old[2] = { { 1000, 0 }, { 1000, 0 } };

        utimensat(AT_FDCWD, path, old, 0);
    }
    fuzz_status();
    /* a claim pass: judge, maybe take over (marking the attempt the lock
     * names stale, if it is this one) and claim */
    mkdirs(job, ATTEMPT);
    put(job, ATTEMPT "/attempt.json", RUNNING, strlen(RUNNING));
    if (claimer_init(&c, &M, &o, &err) < 0)
        abort();
    r = claim_acquire(&c, &cl, NULL, &err);
    refused(r, &err);
    if (r == 1) {
        if (cl.index != 0 || cl.attempt_number != 2 || strcmp(cl.shard_id, SHARD) != 0)
            abort();
        claim_free(&cl);
    }
    claimer_free(&c);
    free(path);
}

static void
fuzz_done(const uint8_t *p, size_t n)
{
    struct merge_opts o = { .output = NULL };
    struct merge_result res;
    struct esd_err err;
    int r;

    put(job, "state/done/" SHARD ".json", p, n);
    fuzz_status();
    r = merge_verify(&M, &o, &res, &err);
    refused(r, &err);
    if (r == 0) {
        /* only the one true result verifies */
        if (res.rows != 1 || res.nshards != 1)
            abort();
        merge_result_free(&res);
    }
}

static void
fuzz_attempt(const uint8_t *p, size_t n)
{
    struct tries_counts a;
    struct esd_err err;
    int r;

    mkdirs(job, ATTEMPT);
    put(job, ATTEMPT "/attempt.json", p, n);
    r = tries_count(&M, SHARD, &a, &err);
    refused(r, &err);
    if (r < 0 || a.attempts != 1 || a.counted < 0 || a.infra < 0 || a.counted + a.infra > 1)
        abort();
    r = tries_mark_stale(&M, ATTEMPT, &err);
    refused(r, &err);
}

static void
fuzz_merge_json(const uint8_t *p, size_t n)
{
    struct merge_opts o = { .output = NULL };
    struct merge_result res;
    struct esd_err err;
    char *done = xasprintf("{\"shard_id\": \"" SHARD "\", \"status\": \"done\", "
                           "\"output_path\": \"results/processed.jsonl\", \"rows\": 1, "
                           "\"sha256\": \"%s\"}\n",
                           result_sha);
    int r;

    put(job, "state/done/" SHARD ".json", done, strlen(done));
    free(done);
    put(job, "merge.json", p, n);
    r = merge_verify(&M, &o, &res, &err);
    refused(r, &err);
    if (r == 0)
        merge_result_free(&res);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    enum target t;

    if (!top)
        setup();
    if (size < 1)
        return 0;
    t = (enum target)(data[0] % T__COUNT);
    data++;
    size--;
    switch (t) {
    case T_MANIFEST:
        fuzz_manifest(data, size);
        break;
    case T_LOCK_STALE:
    case T_LOCK_FRESH:
    case T_LOCK_PADDED:
        fuzz_lock(t, data, size);
        break;
    case T_DONE:
        fuzz_done(data, size);
        break;
    case T_FAILED:
        put(job, "state/failed/" SHARD ".json", data, size);
        fuzz_status();
        break;
    case T_ATTEMPT:
        fuzz_attempt(data, size);
        break;
    case T_MERGE_JSON:
        fuzz_merge_json(data, size);
        break;
    case T__COUNT:
        break;
    }
    reset();
    return 0;
}
