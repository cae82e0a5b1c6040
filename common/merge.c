/*
 * merge: ordered concatenation of accepted results, with revalidation.
 *
 * The bytes of each result file go to the output exactly as read (a missing
 * final newline is added), so the reader's raw chunks are written and
 * hashed as they arrive and the lines are only validated; a failure at any
 * point discards the temporary output.
 */
#include "merge.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "json.h"
#include "pipeline.h"
#include "pypath.h"
#include "status.h"

struct result {
    const char *id;
    char *path; /* resolved result file */
    char *hostname;
    long long rows;
    char sha256[SHA256_HEX_LEN + 1];
    uint64_t size;
    bool no_nl; /* its last line has no newline (verify of a global stage) */
    /* as streamed */
    long long seen_rows;
    uint64_t seen_bytes;
    struct sha256 sha;
};

struct ctx {
    const struct manifest *m;
    const struct merge_opts *o;
    struct jsonl_limits lim;
    struct result *res;
    unsigned threads;
    struct sha256 out_sha;
    int out_fd;
    const char *out_tmp;
    double t0;
    uint64_t bytes_total;
};

static void
results_free(struct result *res, size_t n)
{
    for (size_t i = 0; res && i < n; i++) {
        sha256_abort(&res[i].sha);
        free(res[i].path);
        free(res[i].hostname);
    }
    free(res);
}

/* Reads every done record: result path, rows, digest, owner. */
static int
load_results(struct ctx *c, struct esd_err *err)
{
    const struct manifest *m = c->m;

    c->res = xcalloc(m->nshards, sizeof(*c->res));
    for (size_t i = 0; i < m->nshards; i++) {
        struct result *x = &c->res[i];
        char *path = manifest_state_path(m, "done", m->shards[i].id, ".json");
        cJSON *d = NULL;
        const char *rel, *sha, *host;
        struct stat st;
        int r;

        x->id = m->shards[i].id;
        /* A done record is a few hundred bytes; the cap keeps a planted or
         * corrupt file from deciding how much this reads into memory. */
        r = json_load_object(path, 1 << 20, &d, err);
        if (r == 0) {
            rel = json_get_str(d, "output_path");
            sha = json_get_str(d, "sha256");
            if (!rel || !sha || strlen(sha) != SHA256_HEX_LEN ||
                json_get_int(d, "rows", &x->rows) < 0)
                r = err_set(err, -EINVAL,
                            "malformed done record %s: needs output_path, rows and sha256", path);
            else /* spec §3: a stored path must stay inside the job */
                r = pypath_join_inside(m->job_dir, rel, &x->path, err);
        }
        if (r == 0) {
            memcpy(x->sha256, sha, SHA256_HEX_LEN + 1);
            if ((host = json_get_str(d, "hostname")) && *host)
                x->hostname = xstrdup(host);
            /* The size only scales progress (spec §11: size_bytes is not
             * checked); a missing result fails here, before a byte of the
             * output is written. */
            if (stat(x->path, &st) < 0)
                r = err_sys(err, -errno, "cannot read result of %s: %s", x->id, x->path);
            else
                c->bytes_total += (uint64_t)st.st_size;
        }
        cJSON_Delete(d);
        free(path);
        if (r < 0)
            return r;
    }
    return 0;
}

static void
report(struct ctx *c, size_t shards_done, uint64_t bytes, uint64_t rows)
{
    struct merge_progress p;

    if (!c->o->progress)
        return;
    p.shards_done = shards_done;
    p.shards_total = c->m->nshards;
    p.bytes_done = bytes;
    p.bytes_total = c->bytes_total;
    p.rows = rows;
    p.elapsed = time_mono() - c->t0;
    c->o->progress(c->o->progress_ctx, &p);
}

/* ---- the stream of results as a pipeline (common/pipeline.h) ----
 *
 * The source reads the results one after the other in blocks of whole
 * lines, each validated on any thread; the ordered stages count, write and
 * hash the blocks as read, so the output is byte-equal to the results (a
 * \r before a newline included), never a re-serialised line. A result ends
 * with a chunk of no lines, where its rows and digest are checked. */

enum { CHUNK_BYTES = 1 << 20 };

struct mchunk {
    size_t res; /* in c->res */
    bool end;   /* the result's end: no lines */
    uint64_t line0, lines;
    struct buf text;
    bool no_nl; /* its last line has no newline: the result's last */
    struct jsonl_record rec;
    uint64_t nok; /* lines before the failure r, or all */
    int r;
    struct esd_err err;
};

struct mpass {
    struct ctx *c;
    struct merge_result *res;
    /* source */
    size_t i;
    bool open;
    struct jsonl_reader rd;
    /* apply */
    uint64_t bytes, rows, next_report;
    /* write: bytes written, and those whose writeback was started */
    uint64_t written, started;
};

static int
msrc_run(void *ctx, void *chunk, uint64_t seq, struct esd_err *err)
{
    struct mpass *ps = ctx;
    struct mchunk *k = chunk;
    struct ctx *c = ps->c;
    unsigned long long lines;
    const char *p;
    size_t len;
    int r;

    (void)seq;
    if (ps->i == c->m->nshards)
        return 0;
    if (!ps->open) {
        if ((r = jsonl_reader_open(&ps->rd, c->res[ps->i].path, c->lim.max_line, err)) < 0)
            return r;
        ps->open = true;
    }
    if (k->text.cap > 4 * (size_t)CHUNK_BYTES) {
        buf_free(&k->text);
        buf_init(&k->text);
    }
    buf_reset(&k->text);
    k->res = ps->i;
    k->line0 = ps->rd.lineno;
    k->lines = 0;
    k->end = false;
    k->no_nl = false;
    if ((r = jsonl_reader_block(&ps->rd, CHUNK_BYTES, &p, &len, &lines, err)) < 0)
        return r;
    if (r == 1) {
        buf_append(&k->text, p, len);
        k->lines = lines;
        k->no_nl = p[len - 1] != '\n';
        return 1;
    }
    k->end = true;
    jsonl_reader_close(&ps->rd);
    ps->open = false;
    ps->i++;
    return 1;
}

/* Every line validated, on any thread; the first failure is kept with the
 * lines before it for the apply stage. */
static int
mwork_run(void *ctx, void *chunk, uint64_t seq, struct esd_err *err)
{
    struct mpass *ps = ctx;
    struct mchunk *k = chunk;
    const char *p = k->text.p, *e = p ? p + k->text.len : p; /* an end chunk has no text */

    (void)seq, (void)err;
    k->nok = 0;
    k->r = 0;
    for (uint64_t n = 0; n < k->lines; n++) {
        const char *nl = memchr(p, '\n', (size_t)(e - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(e - p);

        if (jsonl_check(&k->rec, p, len, &ps->c->lim) < 0) {
            k->r = jsonl_error(&k->rec, &ps->c->lim, ps->c->res[k->res].path, k->line0 + n + 1,
                               &k->err);
            break;
        }
        k->nok++;
        p = nl ? nl + 1 : e;
    }
    return 0;
}

static int
mapply_run(void *ctx, void *chunk, uint64_t seq, struct esd_err *err)
{
    struct mpass *ps = ctx;
    struct mchunk *k = chunk;
    struct ctx *c = ps->c;
    struct result *x = &c->res[k->res];

    (void)seq;
    if (k->end)
        return 0;
    x->seen_rows += (long long)k->nok;
    ps->rows += k->nok;
    if (k->r < 0) {
        *err = k->err;
        return k->r;
    }
    if (c->o->cancel && *c->o->cancel)
        return err_set(err, -ECANCELED, "interrupted; nothing was written");
    ps->bytes += k->text.len;
    x->seen_bytes += k->text.len;
    if (k->no_nl)
        x->no_nl = true;
    if (ps->bytes >= ps->next_report) {
        report(c, k->res, ps->bytes, ps->rows);
        ps->next_report = ps->bytes + (8u << 20);
    }
    return 0;
}

/* The output gets a missing last newline; the result's digest not: the
 * done record's sha256 is of processed.jsonl as it is (spec §5.5),
 * merge.json's of the merged bytes (spec §5.8). */
static int
mwrite_run(void *ctx, void *chunk, uint64_t seq, struct esd_err *err)
{
    struct mpass *ps = ctx;
    struct mchunk *k = chunk;
    struct ctx *c = ps->c;
    int r;

    (void)seq;
    if (c->out_fd < 0 || k->end)
        return 0;
    if ((r = fs_write_all(c->out_fd, k->text.p, k->text.len)) < 0 ||
        (k->no_nl && (r = fs_write_all(c->out_fd, "\n", 1)) < 0))
        return err_sys(err, r, "cannot write %s", c->out_tmp);
    ps->written += k->text.len + (k->no_nl ? 1 : 0);
    /* The pages start for the disk as they are written, so that the fsync
     * before publication finds little left. Best effort: a write error is
     * reported by that fsync. */
    if (ps->written - ps->started >= 8u << 20) {
        (void)sync_file_range(c->out_fd, (off_t)ps->started, (off_t)(ps->written - ps->started),
                              SYNC_FILE_RANGE_WRITE);
        ps->started = ps->written;
    }
    return 0;
}

static int
mouthash_run(void *ctx, void *chunk, uint64_t seq, struct esd_err *err)
{
    struct mpass *ps = ctx;
    struct mchunk *k = chunk;

    (void)seq, (void)err;
    if (k->end)
        return 0;
    sha256_update(&ps->c->out_sha, k->text.p, k->text.len);
    if (k->no_nl)
        sha256_update(&ps->c->out_sha, "\n", 1);
    return 0;
}

/*
 * Each result's digest (with_out: and the output's, in one stage,
 * sha256_update2), and at the result's end its rows and digest against
 * its done record.
 */
static int
result_hash(struct mpass *ps, struct mchunk *k, bool with_out, struct esd_err *err)
{
    struct result *x = &ps->c->res[k->res];
    char hex[SHA256_HEX_LEN + 1];

    if (!x->sha.ctx)
        sha256_init(&x->sha);
    if (!k->end) {
        if (!with_out) {
            sha256_update(&x->sha, k->text.p, k->text.len);
            return 0;
        }
        sha256_update2(&ps->c->out_sha, k->text.p, k->text.len, &x->sha, k->text.p, k->text.len);
        if (k->no_nl)
            sha256_update(&ps->c->out_sha, "\n", 1);
        return 0;
    }
    sha256_final(&x->sha, hex);
    if (x->seen_rows != x->rows || strcmp(hex, x->sha256) != 0)
        return err_set(err, -EINVAL,
                       "Result checksum or row count mismatch for %s: %s has %lld rows and "
                       "sha256 %s, the done record says %lld rows and sha256 %s",
                       x->id, x->path, x->seen_rows, hex, x->rows, x->sha256);
    ps->res->rows += (uint64_t)x->seen_rows;
    ps->res->bytes += x->seen_bytes + (x->no_nl ? 1 : 0);
    return 0;
}

static int
mshardhash_run(void *ctx, void *chunk, uint64_t seq, struct esd_err *err)
{
    (void)seq;
    return result_hash(ctx, chunk, false, err);
}

/* For few threads: mouthash_run and mshardhash_run in one stage. */
static int
mbothhash_run(void *ctx, void *chunk, uint64_t seq, struct esd_err *err)
{
    (void)seq;
    return result_hash(ctx, chunk, true, err);
}

/* Validates, hashes and (when writing) copies every result in order. */
static int
stream_results(struct ctx *c, struct merge_result *res, struct esd_err *err)
{
    static const struct pipeline_stage st[] = {
        { msrc_run, true },   { mwork_run, false },   { mapply_run, true },
        { mwrite_run, true }, { mouthash_run, true }, { mshardhash_run, true },
    };
    /* the digests side by side on many threads, where one alone bounds
     * the pipeline; on few, both in one stage, where the CPU time is the
     * bound (sha256_pair_pays) */
    static const struct pipeline_stage few[] = {
        { msrc_run, true },   { mwork_run, false },    { mapply_run, true },
        { mwrite_run, true }, { mbothhash_run, true },
    };
    const bool pair = sha256_pair_pays(c->threads);
    const size_t nst = pair ? sizeof(few) / sizeof(few[0]) : sizeof(st) / sizeof(st[0]);
    size_t n = pipeline_chunks_for(c->threads, nst);
    struct mchunk **v = xcalloc(n, sizeof(*v));
    struct mpass ps = { .c = c, .res = res };
    int r;

    for (size_t i = 0; i < n; i++) {
        v[i] = xcalloc(1, sizeof(**v));
        buf_init(&v[i]->text);
        jsonl_record_init(&v[i]->rec, false);
    }
    r = pipeline_run(pair ? few : st, nst, &ps, (void **)v, n, c->threads, err);
    if (ps.open)
        jsonl_reader_close(&ps.rd);
    for (size_t i = 0; i < n; i++) {
        buf_free(&v[i]->text);
        jsonl_record_free(&v[i]->rec);
        free(v[i]);
    }
    free(v);
    if (r == 0)
        report(c, c->m->nshards, ps.bytes, res->rows);
    return r;
}

static int
cmp_owner(const void *a, const void *b)
{
    return strcmp(((const struct merge_owner *)a)->hostname,
                  ((const struct merge_owner *)b)->hostname);
}

/* The distinct hostnames of the done records (the reference's verify
 * counts these, spec §13.9), sorted so that merge and verify print the
 * same owners in the same order on every node. */
static void
collect_owners(struct ctx *c, struct merge_result *res)
{
    for (size_t i = 0; i < c->m->nshards; i++) {
        const char *h = c->res[i].hostname;
        size_t k;

        if (!h)
            continue;
        for (k = 0; k < res->nowners && strcmp(res->owners[k].hostname, h); k++)
            ;
        if (k == res->nowners) {
            res->owners = xrealloc(res->owners, (k + 1) * sizeof(*res->owners));
            res->owners[k].hostname = xstrdup(h);
            res->owners[k].shards = 0;
            res->nowners++;
        }
        res->owners[k].shards++;
    }
    if (res->nowners > 1)
        qsort(res->owners, res->nowners, sizeof(*res->owners), cmp_owner);
}

bool
merge_output_clobbers(const char *job_dir, const char *out)
{
    static const char *const owned[] = { "shards",     "attempts",           "state",
                                         "cache",      "manifest.json",      "recipe.yaml",
                                         "merge.json", "recipe.shards.yaml", "recipe.global.yaml" };

    for (size_t i = 0; i < sizeof(owned) / sizeof(owned[0]); i++) {
        char *p = fs_join(job_dir, owned[i]);
        bool in = fs_is_inside(p, out);

        free(p);
        if (in)
            return true;
    }
    return strcmp(out, job_dir) == 0;
}

/* Steps 1 and 2 of spec §11, before anything is created: completeness,
 * then (merge only) an existing output. */

static int
check_ready(struct ctx *c, struct esd_err *err)
{
    struct job_status st;
    struct stat sb;
    int r;

    if ((r = status_compute(c->m, c->o->lock_timeout, false, &st, err)) < 0)
        return r;
    if (!st.complete) {
        r = err_set(err, -EAGAIN,
                    "Cannot merge an incomplete job: pending=%zu running=%zu stale=%zu "
                    "failed=%zu done=%zu",
                    st.counts[ST_PENDING], st.counts[ST_RUNNING], st.counts[ST_STALE],
                    st.counts[ST_FAILED], st.counts[ST_DONE]);
        status_free(&st);
        return r;
    }
    status_free(&st);
    if (c->o->output && !c->o->stage_input && merge_output_clobbers(c->m->job_dir, c->o->output))
        return err_set(err, -EINVAL,
                       "output %s would overwrite part of the job directory; choose another path",
                       c->o->output);
    /* lstat: a dangling symlink at the output's place is a name that
     * exists; publication by link() would fail on it too. */
    if (c->o->output && !c->o->overwrite && lstat(c->o->output, &sb) == 0)
        return err_set(err, -EEXIST, "Output already exists: %s; pass --overwrite to replace it",
                       c->o->output);
    return 0;
}

/* Done records, then the streamed pass. */
static int
run(struct ctx *c, struct merge_result *res, struct esd_err *err)
{
    int r;

    if ((r = load_results(c, err)) < 0)
        return r;
    collect_owners(c, res);
    res->nshards = c->m->nshards;
    return stream_results(c, res, err);
}

static void
ctx_init(struct ctx *c, const struct manifest *m, const struct merge_opts *o)
{
    memset(c, 0, sizeof(*c));
    c->m = m;
    c->o = o;
    c->lim = o->limits ? *o->limits : jsonl_default_limits;
    c->out_fd = -1;
    c->t0 = time_mono();
    c->threads = o->threads ? o->threads : pipeline_cpus();
    sha256_init(&c->out_sha);
}

static void
ctx_free(struct ctx *c)
{
    sha256_abort(&c->out_sha);
    results_free(c->res, c->m->nshards);
}

static int
write_merge_json(const struct manifest *m, const struct merge_opts *o,
                 const struct merge_result *res, struct esd_err *err)
{
    const char *output = o->output;
    cJSON *j = cJSON_CreateObject();
    char now[40], *path = fs_join(m->job_dir, "merge.json");
    int r;

    time_iso_now(now, NULL);
    json_add_str(j, "job_id", m->job_id);
    json_add_str(j, "merged_at", now);
    json_add_str(j, "output_path", output);
    json_add_int(j, "rows", (long long)res->rows);
    json_add_str(j, "sha256", res->sha256);
    if (o->stage_of && o->prefix) {
        json_add_int(j, "num_shards", (long long)o->stage_of->nshards);
        cJSON_AddItemToObject(
            j, "stages",
            gstage_stages_json(o->stage_of, o->prefix, (long long)res->rows, res->sha256));
    } else {
        json_add_int(j, "num_shards", (long long)m->nshards);
    }
    r = json_write_atomic(path, j, JSON_PRETTY, err);
    cJSON_Delete(j);
    free(path);
    return r;
}

/* The temporary output being written, for merge_abort (a signal handler). */
static const char *volatile inflight_tmp;

void
merge_abort(void)
{
    const char *tmp = inflight_tmp;

    if (tmp)
        unlink(tmp);
}

/* After a link() that reported EEXIST: whether the name is our file all
 * the same (a retransmitted NFS LINK reports EEXIST after it succeeded),
 * decided on the opened files, not on cached attributes. errno is kept. */
static bool
linked_ours(int dirfd, const char *ours, const char *name)
{
    int e = errno, a, b;
    struct stat sa, sb;
    bool same = false;

    if (e != EEXIST)
        return false;
    a = openat(dirfd, ours, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    b = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (a >= 0 && b >= 0 && fstat(a, &sa) == 0 && fstat(b, &sb) == 0)
        same = sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    if (a >= 0)
        close(a);
    if (b >= 0)
        close(b);
    errno = e;
    return same;
}

int
merge_run(const struct manifest *m, const struct merge_opts *o, struct merge_result *ret,
          struct esd_err *err)
{
    struct merge_result res = { 0 };
    struct ctx c;
    char *tmp = NULL, *parent = NULL, *prel = NULL;
    const char *base = fs_basename(o->output ? o->output : "");
    int r, pfd = AT_FDCWD;
    size_t jl = strlen(m->job_dir);

    if (!o->output)
        return err_set(err, -EINVAL, "merge needs an output path");
    /* Confined, the output is reached below as a path relative to job_fd,
     * so it must be textually below job_dir, not just resolve there. */
    if (o->confined &&
        (strncmp(o->output, m->job_dir, jl) || o->output[jl] != '/' || !o->output[jl + 1]))
        return err_set(err, -EACCES, "output %s is not inside the job directory %s", o->output,
                       m->job_dir);
    ctx_init(&c, m, o);
    if ((r = check_ready(&c, err)) < 0)
        goto out;
    parent = fs_dirname(o->output);
    if (o->confined) {
        /* from the job directory's descriptor down, no link followed */
        prel = fs_dirname(o->output + jl + 1);
        if ((r = pfd = fs_mkdir_beneath(o->job_fd, prel, 0755, parent, err)) < 0)
            goto out;
    } else if ((r = fs_mkdir_p(parent, 0755, err)) < 0) {
        goto out;
    }
    /* The temporary file sits beside the output so that the rename or
     * link below stays in one directory of one file system (atomic).
     * inflight_tmp is set before the file exists: a signal in between
     * unlinks a name that is not there yet, which is harmless; set after,
     * a signal could leave the file behind. */
    tmp = fs_tmp_path(o->output);
    c.out_tmp = tmp;
    inflight_tmp = tmp;
    c.out_fd = openat(pfd, o->confined ? fs_basename(tmp) : tmp,
                      O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (c.out_fd < 0) {
        r = err_sys(err, -errno, "cannot create %s", tmp);
        goto out;
    }
    if ((r = run(&c, &res, err)) < 0)
        goto out;
    sha256_final(&c.out_sha, res.sha256);
    /* Data on disk before the name: after a crash the output is either
     * absent or complete, never a published name over missing blocks. */
    if (fsync(c.out_fd) < 0) {
        r = err_sys(err, -errno, "cannot write %s", tmp);
        goto out;
    }
    close(c.out_fd);
    c.out_fd = -1;
    /* The fence is checked as late as it can be, with nothing left to do
     * but the rename: a finalizer that lost its election meanwhile leaves
     * no output, and the window between check and publication is one
     * system call. */
    if (o->before_publish && (r = o->before_publish(o->publish_ctx, err)) < 0)
        goto out;
    /* Without --overwrite the name is published by link(), which, unlike
     * rename(), fails when the name exists: two merges racing for a new
     * output cannot replace each other's file. */
    if (o->confined) {
        /* (a name planted at the output's place is replaced, never followed) */
        if (o->overwrite ? renameat(pfd, fs_basename(tmp), pfd, base) < 0
                         : linkat(pfd, fs_basename(tmp), pfd, base, 0) < 0 &&
                               !linked_ours(pfd, fs_basename(tmp), base))
            r = errno == EEXIST ? err_set(err, -EEXIST,
                                          "Output already exists: %s; pass "
                                          "--overwrite to replace it",
                                          o->output)
                                : err_sys(err, -errno, "cannot create %s", o->output);
        else if (!o->overwrite)
            unlinkat(pfd, fs_basename(tmp), 0);
        if (r == 0 && fsync(pfd) < 0 && errno != EINVAL)
            r = err_sys(err, -errno, "cannot fsync directory %s", parent);
    } else if (o->overwrite) {
        if (rename(tmp, o->output) < 0)
            r = err_sys(err, -errno, "cannot replace %s", o->output);
    } else if (link(tmp, o->output) < 0 && !linked_ours(AT_FDCWD, tmp, o->output)) {
        r = errno == EEXIST
                ? err_set(err, -EEXIST, "Output already exists: %s; pass --overwrite to replace it",
                          o->output)
                : err_sys(err, -errno, "cannot create %s", o->output);
    } else {
        unlink(tmp);
    }
    if (r == 0 && !o->confined)
        r = fs_fsync_dir(parent, err);
    /* merge.json after the output, as the reference does (spec §11 step 4):
     * a crash in between leaves the output with no merge.json or with the
     * previous merge's. verify compares merge.json with the results rather
     * than trusting it, so a stale one of other results shows as a
     * mismatch (check_merged_output). */
    if (r == 0 && !o->stage_input)
        r = write_merge_json(m, o, &res, err);
out:
    if (c.out_fd >= 0)
        close(c.out_fd);
    if (tmp)
        unlinkat(pfd, o->confined ? fs_basename(tmp) : tmp, 0);
    inflight_tmp = NULL;
    if (pfd >= 0)
        close(pfd);
    free(tmp);
    free(parent);
    free(prel);
    ctx_free(&c);
    if (r < 0) {
        merge_result_free(&res);
        return r;
    }
    *ret = res;
    return 0;
}

/* merge.json's top-level record against rows and sha (what gives them:
 * what), and the file it names against sha when it is there. */
static int
check_record_output(const char *path, const cJSON *j, uint64_t want_rows, const char *want_sha,
                    const char *what, struct merge_result *res, struct esd_err *err)
{
    const char *out = json_get_str(j, "output_path"), *sha = json_get_str(j, "sha256");
    long long rows;
    struct stat st;
    int r;

    if (!out || !sha || json_get_int(j, "rows", &rows) < 0)
        return err_set(err, -EINVAL, "malformed %s: needs output_path, rows and sha256", path);
    if ((uint64_t)rows != want_rows || strcmp(sha, want_sha) != 0)
        return err_set(err, -EINVAL,
                       "%s does not match %s: it records %lld rows and sha256 %s, "
                       "the results give %llu rows and sha256 %s",
                       path, what, rows, sha, (unsigned long long)want_rows, want_sha);
    if (stat(out, &st) == 0) {
        char hex[SHA256_HEX_LEN + 1];

        if ((r = sha256_file(out, hex, err)) < 0)
            return r;
        if (strcmp(hex, sha) != 0)
            return err_set(err, -EINVAL,
                           "merged output %s does not match %s: sha256 %s, expected %s", out, path,
                           hex, sha);
        res->checked_output = true;
    }
    return 0;
}

/* Checks the file merge.json names against it, if both exist. merge.json
 * is compared with the results just streamed, so a record left by an
 * earlier merge of other results is caught; an output that is not there
 * (moved away, or on a path this node cannot see) is not checked, and
 * checked_output tells the caller so rather than failing. */
static int
check_merged_output(const struct manifest *m, struct merge_result *res, struct esd_err *err)
{
    char *path = fs_join(m->job_dir, "merge.json");
    cJSON *j = NULL;
    struct stat st;
    int r = 0;

    if (lstat(path, &st) == 0 && (r = json_load_object(path, 1 << 20, &j, err)) == 0)
        r = check_record_output(path, j, res->rows, res->sha256, "the shard results", res, err);
    cJSON_Delete(j);
    free(path);
    return r;
}

/* ---- verify of a job with a global stage (issue 17) ---- */

/* rows and sha256 of the record j (path names it), which must match
 * want_rows and want_sha (what gives them); also read into the
 * optional ret_rows. */
static int
check_rows_sha(const char *path, const cJSON *j, uint64_t want_rows, const char *want_sha,
               const char *what, struct esd_err *err)
{
    const char *sha = json_get_str(j, "sha256");
    long long rows;

    if (!cJSON_IsObject(j) || !sha || json_get_int(j, "rows", &rows) < 0)
        return err_set(err, -EINVAL, "malformed %s: needs rows and sha256", path);
    if ((uint64_t)rows != want_rows || strcmp(sha, want_sha) != 0)
        return err_set(err, -EINVAL,
                       "%s does not match %s: it records %lld rows and sha256 %s, "
                       "%s has %llu rows and sha256 %s",
                       path, what, rows, sha, what, (unsigned long long)want_rows, want_sha);
    return 0;
}

/* state/esd/global/input.jsonl against the shards' results, in manifest
 * order: each shard's rows and digest, then nothing more. */
static int
check_global_input(struct ctx *c, const char *path, const struct jsonl_limits *lim,
                   struct esd_err *err)
{
    struct jsonl_reader rd;
    struct jsonl_record rec;
    const char *line;
    size_t len;
    bool nl = true;
    int r;

    if ((r = jsonl_reader_open(&rd, path, lim->max_line, err)) < 0)
        return r;
    jsonl_record_init(&rec, false);
    for (size_t i = 0; i < c->m->nshards && r >= 0; i++) {
        const struct result *x = &c->res[i];
        unsigned long long first = rd.lineno + 1;
        struct sha256 sh;
        char hex[SHA256_HEX_LEN + 1];
        long long rows = 0;

        sha256_init(&sh);
        while (rows < x->rows && (r = jsonl_reader_next(&rd, &line, &len, &nl, err)) == 1) {
            if (jsonl_check(&rec, line, len, lim) < 0) {
                r = jsonl_error(&rec, lim, path, rd.lineno, err);
                break;
            }
            sha256_update(&sh, line, len);
            rows++;
            /* the shard's own last newline, if its result had one */
            if (nl && !(rows == x->rows && x->no_nl))
                sha256_update(&sh, "\n", 1);
        }
        if (r < 0) {
            sha256_abort(&sh);
            break;
        }
        sha256_final(&sh, hex);
        if (rows != x->rows || strcmp(hex, x->sha256) != 0)
            r = err_set(err, -EINVAL,
                        "%s does not hold the result of %s at line %llu: %lld rows and sha256 %s "
                        "there, the done record says %lld rows and sha256 %s",
                        path, x->id, first, rows, hex, x->rows, x->sha256);
    }
    if (r >= 0 && (r = jsonl_reader_next(&rd, &line, &len, &nl, err)) == 1)
        r = err_set(err, -EINVAL, "%s has more rows than the shards' results, from line %llu", path,
                    rd.lineno);
    jsonl_record_free(&rec);
    jsonl_reader_close(&rd);
    return r < 0 ? r : 0;
}

/* The result the "_global" done record names: its lines valid, its rows
 * and digest the record's. */
static int
check_global_result(const struct manifest *m, const struct jsonl_limits *lim,
                    struct merge_result *res, struct esd_err *err)
{
    char *path = manifest_state_path(m, "done", STATUS_GLOBAL_ID, ".json"), *out = NULL;
    char *failed = manifest_state_path(m, "failed", STATUS_GLOBAL_ID, ".json");
    struct jsonl_reader rd;
    struct jsonl_record rec;
    const char *rel, *sha, *line;
    char hex[SHA256_HEX_LEN + 1];
    long long want, rows = 0;
    cJSON *d = NULL;
    struct stat st;
    size_t len;
    bool nl;
    int r;

    if (lstat(path, &st) < 0) {
        if (json_load_object(failed, 1 << 20, &d, NULL) == 0)
            r = err_set(err, -EINVAL, "the global stage failed (%s): %s", failed,
                        json_get_str(d, "last_error") ? json_get_str(d, "last_error")
                                                      : "no last_error recorded");
        else
            r = err_set(err, -EAGAIN,
                        "cannot verify the global stage: %s is missing (it has not finished)",
                        path);
        goto out;
    }
    if ((r = json_load_object(path, 1 << 20, &d, err)) < 0)
        goto out;
    rel = json_get_str(d, "output_path");
    sha = json_get_str(d, "sha256");
    if (!rel || !sha || strlen(sha) != SHA256_HEX_LEN || json_get_int(d, "rows", &want) < 0) {
        r = err_set(err, -EINVAL, "malformed done record %s: needs output_path, rows and sha256",
                    path);
        goto out;
    }
    if ((r = pypath_join_inside(m->job_dir, rel, &out, err)) < 0 ||
        (r = sha256_file(out, hex, err)) < 0 ||
        (r = jsonl_reader_open(&rd, out, lim->max_line, err)) < 0)
        goto out;
    jsonl_record_init(&rec, false);
    while ((r = jsonl_reader_next(&rd, &line, &len, &nl, err)) == 1) {
        if (jsonl_check(&rec, line, len, lim) < 0) {
            r = jsonl_error(&rec, lim, out, rd.lineno, err);
            break;
        }
        rows++;
    }
    jsonl_record_free(&rec);
    jsonl_reader_close(&rd);
    if (r == 0 && (rows != want || strcmp(hex, sha) != 0))
        r = err_set(err, -EINVAL,
                    "Result checksum or row count mismatch for %s: %s has %lld rows and sha256 "
                    "%s, the done record %s says %lld rows and sha256 %s",
                    STATUS_GLOBAL_ID, out, rows, hex, path, want, sha);
    if (r == 0) {
        res->global_rows = (uint64_t)want;
        memcpy(res->global_sha256, sha, SHA256_HEX_LEN + 1);
    }
out:
    cJSON_Delete(d);
    free(out);
    free(path);
    free(failed);
    return r;
}

/* merge.json of a job with a global stage: its "stages" (the shards' merge
 * and the global stage's result) and its top level (the final output) =
 * the global stage's. One without "stages" is a merge of the shards alone
 * (the reference's, spec §11), checked as such. Absent: not merged yet. */
static int
check_global_merge_json(const struct manifest *m, struct merge_result *res, struct esd_err *err)
{
    char *path = fs_join(m->job_dir, "merge.json");
    const cJSON *stages, *sh;
    cJSON *j = NULL;
    struct stat st;
    long long n;
    int r = 0;

    if (lstat(path, &st) < 0 || (r = json_load_object(path, 1 << 20, &j, err)) < 0)
        goto out;
    if (!(stages = cJSON_GetObjectItemCaseSensitive(j, "stages"))) {
        r = check_record_output(path, j, res->rows, res->sha256, "the shard results", res, err);
        goto out;
    }
    sh = cJSON_GetObjectItemCaseSensitive(stages, "shards");
    if (!cJSON_IsObject(stages) ||
        !cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(stages, "global"))) {
        r = err_set(err, -EINVAL, "malformed %s: stages needs the objects shards and global", path);
        goto out;
    }
    if ((r = check_rows_sha(path, sh, res->rows, res->sha256, "the shard results", err)) < 0 ||
        (r = check_rows_sha(path, cJSON_GetObjectItemCaseSensitive(stages, "global"),
                            res->global_rows, res->global_sha256, "the global stage's result",
                            err)) < 0)
        goto out;
    if (json_get_int(sh, "num_shards", &n) == 0 && n != (long long)m->nshards) {
        r = err_set(err, -EINVAL, "%s records %lld shards in stages.shards, the manifest has %zu",
                    path, n, m->nshards);
        goto out;
    }
    r = check_record_output(path, j, res->global_rows, res->global_sha256,
                            "the global stage's result", res, err);
out:
    cJSON_Delete(j);
    free(path);
    return r;
}

/* Both stages: the shards' merge the global stage read (prefix.json and
 * input.jsonl), its result ("_global"'s done record), merge.json. */
static int
verify_global(struct ctx *c, struct merge_result *res, struct esd_err *err)
{
    const struct manifest *m = c->m;
    char *prefix = fs_join(m->job_dir, STATUS_GLOBAL_PREFIX), *input = NULL;
    char hex[SHA256_HEX_LEN + 1];
    cJSON *p = NULL;
    struct stat st;
    long long n;
    int r;

    res->global = true;
    if (lstat(prefix, &st) < 0) {
        r = err_set(err, -EAGAIN,
                    "cannot verify the global stage: %s is missing (the shards' outputs are not "
                    "merged for it yet)",
                    prefix);
        goto out;
    }
    if ((r = json_load_object(prefix, 1 << 20, &p, err)) < 0 ||
        (r = check_rows_sha(prefix, p, res->rows, res->sha256, "the shard results", err)) < 0)
        goto out;
    if (json_get_int(p, "num_shards", &n) == 0 && n != (long long)m->nshards) {
        r = err_set(err, -EINVAL, "%s records %lld shards, the manifest has %zu", prefix, n,
                    m->nshards);
        goto out;
    }
    input = fs_join(m->job_dir, STATUS_GLOBAL_INPUT);
    if ((r = check_global_input(c, input, &c->lim, err)) < 0)
        goto out;
    if ((r = sha256_file(input, hex, err)) < 0)
        goto out;
    if (strcmp(hex, res->sha256) != 0) {
        r = err_set(err, -EINVAL, "%s does not match %s: sha256 %s, expected %s", input, prefix,
                    hex, res->sha256);
        goto out;
    }
    if ((r = check_global_result(m, &c->lim, res, err)) < 0)
        goto out;
    r = check_global_merge_json(m, res, err);
out:
    cJSON_Delete(p);
    free(prefix);
    free(input);
    return r;
}

int
merge_verify(const struct manifest *m, const struct merge_opts *o, struct merge_result *ret,
             struct esd_err *err)
{
    struct merge_result res = { 0 };
    struct ctx c;
    int r;

    ctx_init(&c, m, o);
    if ((r = check_ready(&c, err)) == 0)
        r = run(&c, &res, err);
    if (r == 0) {
        sha256_final(&c.out_sha, res.sha256);
        r = m->global_snapshot ? verify_global(&c, &res, err) : check_merged_output(m, &res, err);
    }
    ctx_free(&c);
    if (r < 0) {
        merge_result_free(&res);
        return r;
    }
    *ret = res;
    return 0;
}

void
merge_result_free(struct merge_result *r)
{
    for (size_t i = 0; i < r->nowners; i++)
        free(r->owners[i].hostname);
    free(r->owners);
    memset(r, 0, sizeof(*r));
}
