/*
 * prepare: discovery, the scan pass, the write pass and publication of a job
 * directory.
 *
 * Cost model. The scan pass validates every record and hashes every input
 * file (SHA-256 for the manifest). The write pass needs record boundaries,
 * the shard hashes and the whole-stream hash; for input files whose
 * records needed no normalisation edit in the scan pass it trusts the
 * scan's validation, because a fast 64-bit hash of the bytes, compared at
 * the end of the file, proves the bytes did not change in between (the
 * reference rehashes with SHA-256 for the same purpose). When no record
 * needs an edit there is no second pass: the scan writes the shards itself
 * (scan_pass, "one pass"). Both passes are
 * pipelines over o->threads threads (common/pipeline.h): validation runs
 * on every thread, and each digest is an ordered stage of its own, so the
 * digests of the same bytes run side by side. A compressed input is
 * decompressed on a thread of its own (zsrc). One pass needs the text's
 * size before it is read: gzip and zstd record it (compressed_guess), and
 * a record that is wrong all the same costs a second pass that
 * decompresses again. Where no size can be believed, the scan spools the
 * text into the staging directory for the write pass, which reads the
 * spool as it would a plain file (spool_open, input_open).
 *
 * What a shard costs, for jobs of 100,000 shards: one create, a write a
 * chunk and one close, no sync (the staging directory is made durable at
 * once before publication, stage_sync), no wait for its digest (the digest
 * stage follows the writes), no string kept and no JSON tree (the
 * manifest's shards array is written as it is formatted). The file
 * system's create is what remains.
 *
 * Descriptors. The job directory's parent may be writable by someone who
 * wants root's shards and manifest in another user's job: between two
 * path lookups they can swap any name in it for a symlink. So the parent
 * is opened once, without following links on the way; the staging
 * directory is made and opened relative to it and checked to be this
 * process's new directory; everything in it is made relative to that
 * descriptor; and the name is checked to still be that directory just
 * before the rename that publishes it, and after (see publish()).
 */
#include "prepare.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/types.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "fsutil.h"
#include "json.h"
#include "manifest.h"
#include "pipeline.h"
#include "pypath.h"
#include "record.h"
#include "sha256.h"
#include "spawn.h"
#include "suggest.h"
#include "zsrc.h"

/* Tests define it (prepare.h); in programs the weak reference is NULL. */
extern void prepare_test_hook(enum prepare_step step, int parent_fd, const char *staging,
                              const char *job) __attribute__((weak));

/* ---- a streaming 64-bit hash for change detection between passes ---- */

struct fasthash {
    uint64_t lane[4];
    uint64_t total;
    unsigned char tail[32];
    size_t ntail;
};

static const uint64_t FH_P1 = 0x9e3779b185ebca87ULL, FH_P2 = 0xc2b2ae3d27d4eb4fULL;

static void
fh_init(struct fasthash *h)
{
    memset(h, 0, sizeof(*h));
    for (int i = 0; i < 4; i++)
        h->lane[i] = FH_P1 * (uint64_t)(i + 1);
}

static inline uint64_t
fh_round(uint64_t acc, uint64_t v)
{
    acc += v * FH_P2;
    acc = (acc << 31) | (acc >> 33);
    return acc * FH_P1;
}

static void
fh_blocks(struct fasthash *h, const unsigned char *p, size_t nblocks)
{
    uint64_t a = h->lane[0], b = h->lane[1], c = h->lane[2], d = h->lane[3], w[4];

    for (size_t i = 0; i < nblocks; i++, p += 32) {
        memcpy(w, p, 32);
        a = fh_round(a, w[0]);
        b = fh_round(b, w[1]);
        c = fh_round(c, w[2]);
        d = fh_round(d, w[3]);
    }
    h->lane[0] = a, h->lane[1] = b, h->lane[2] = c, h->lane[3] = d;
}

static void
fh_update(void *ctx, const char *data, size_t n)
{
    struct fasthash *h = ctx;
    const unsigned char *p = (const unsigned char *)data;

    h->total += n;
    if (h->ntail) {
        size_t k = 32 - h->ntail < n ? 32 - h->ntail : n;
        memcpy(h->tail + h->ntail, p, k);
        h->ntail += k;
        p += k;
        n -= k;
        if (h->ntail < 32)
            return;
        fh_blocks(h, h->tail, 1);
        h->ntail = 0;
    }
    fh_blocks(h, p, n / 32);
    memcpy(h->tail, p + n / 32 * 32, n % 32);
    h->ntail = n % 32;
}

static uint64_t
fh_final(const struct fasthash *h)
{
    uint64_t acc = h->total * FH_P1;

    for (int i = 0; i < 4; i++)
        acc = fh_round(acc ^ h->lane[i], (uint64_t)i);
    for (size_t i = 0; i < h->ntail; i++)
        acc = fh_round(acc, h->tail[i]);
    acc ^= acc >> 29;
    return acc * FH_P2;
}

/* ---- input files ---- */

struct infile {
    char *path; /* dataset path joined with rel (not resolved) */
    char *rel;  /* POSIX path relative to the dataset dir */
    uint64_t size;
    long long mtime_ns;
    uint64_t rows;
    uint64_t norm_bytes;
    uint64_t fast;       /* its chunks' fasthashes combined, scan pass */
    uint64_t seen;       /* raw bytes read in this pass */
    uint64_t text_size;  /* bytes of the text: size, or a compressed file's decompressed size */
    enum zsrc_kind kind; /* as its name says */
    bool spooled;        /* its text is spooled by the scan for the write pass */
    bool edited;         /* some record needed a normalisation edit */
    bool decoded;        /* its records are not its bytes (jsonl_reader's decoded) */
    char sha256[SHA256_HEX_LEN + 1];
    struct sha256 sha; /* in flight during the scan */
};

struct files {
    struct infile *v;
    size_t n, cap;
};

static void
files_free(struct files *f)
{
    for (size_t i = 0; i < f->n; i++) {
        free(f->v[i].path);
        free(f->v[i].rel);
        sha256_abort(&f->v[i].sha);
    }
    free(f->v);
    memset(f, 0, sizeof(*f));
}

static void
files_add(struct files *f, const char *path, const char *rel, const struct stat *st)
{
    struct infile *x;

    if (f->n == f->cap) {
        f->cap = f->cap ? f->cap * 2 : 16;
        f->v = xrealloc(f->v, f->cap * sizeof(*f->v));
    }
    x = &f->v[f->n++];
    memset(x, 0, sizeof(*x));
    x->path = xstrdup(path);
    x->rel = xstrdup(rel);
    x->size = (uint64_t)st->st_size;
    x->mtime_ns = (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec;
    x->kind = zsrc_kind_of_name(fs_basename(path));
}

/* Python's Path.suffix, lower-cased, equals ".jsonl"; or, compressed, the
 * last two of its suffixes are one of these (files_add says which). */
static bool
is_jsonl_name(const char *name)
{
    static const char *const zipped[] = { ".jsonl.gz", ".jsonl.zst", ".json.gz", ".json.zst" };
    const char *dot = strrchr(name, '.');
    size_t len = strlen(name);

    for (size_t i = 0; i < sizeof(zipped) / sizeof(zipped[0]); i++) {
        size_t n = strlen(zipped[i]);

        /* a stem of dots only has no suffixes there (".jsonl.gz" is a
         * hidden file whose suffix is ".gz") */
        if (len > n && !strcasecmp(name + len - n, zipped[i]))
            return strspn(name, ".") < len - n;
    }
    if (!dot || dot == name || (size_t)(dot - name) >= len - 1)
        return false;
    return strcasecmp(dot, ".jsonl") == 0;
}

/* Discovers the input files of dataset (resolved) in processing order and
 * sets *ret_media_root. */
static int
discover(const char *dataset, struct files *out, char **ret_media_root, struct esd_err *err)
{
    struct stat st;
    int r;

    if (stat(dataset, &st) < 0)
        return err_sys(err, -errno, "Dataset path does not exist: %s", dataset);
    if (S_ISDIR(st.st_mode)) {
        struct pypath_entries found;

        r = pypath_rglob(dataset, is_jsonl_name, &found, err);
        for (size_t i = 0; r == 0 && i < found.n; i++)
            files_add(out, found.v[i].path, found.v[i].rel, &found.v[i].st);
        pypath_entries_free(&found);
        if (r < 0)
            return r;
        *ret_media_root = xstrdup(dataset);
    } else {
        if (S_ISREG(st.st_mode) && is_jsonl_name(fs_basename(dataset)))
            files_add(out, dataset, fs_basename(dataset), &st);
        *ret_media_root = fs_dirname(dataset);
    }
    if (out->n == 0) {
        free(*ret_media_root);
        *ret_media_root = NULL;
        return err_set(err, -ENOENT, "No .jsonl files found under %s", dataset);
    }
    return 0;
}

/* ---- directories through descriptors ---- */

static bool
same_inode(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

/*
 * Opens the directory at path (absolute and resolved) one component at a
 * time, each relative to the one before and never through a symbolic link:
 * the path was resolved, so a link on it now was put there since by
 * whoever can write the directory holding it. With create, missing
 * components are made (0755, as mkdir -p). The last component is opened
 * with last_flags (O_RDONLY to sync it, O_PATH only to look inside), the
 * others O_PATH, which needs no read permission. *ret_fd is O_CLOEXEC.
 */
static int
dir_open_path(const char *path, bool create, int last_flags, int *ret_fd, struct esd_err *err)
{
    const int walk = O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC;
    char *copy, *name, *end;
    int fd, r = 0;

    if (path[0] != '/')
        return err_set(err, -EINVAL, "cannot open directory %s: not an absolute path", path);
    copy = xstrdup(path);
    name = copy + strspn(copy, "/");
    fd = open("/", *name ? walk : last_flags | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        r = err_sys(err, -errno, "cannot open directory /");
    while (r == 0 && *name) {
        int flags, nfd, len;
        bool last;

        end = name + strcspn(name, "/");
        len = (int)(end - copy); /* path up to this component, for messages */
        last = end[strspn(end, "/")] == '\0';
        if (*end)
            *end++ = '\0';
        flags = last ? last_flags | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC : walk;
        nfd = openat(fd, name, flags);
        if (nfd < 0 && errno == ENOENT && create) {
            if (mkdirat(fd, name, 0755) < 0 && errno != EEXIST) {
                r = err_sys(err, -errno, "cannot create directory %.*s", len, path);
                break;
            }
            nfd = openat(fd, name, flags);
        }
        if (nfd < 0) {
            struct stat lst;

            r = -errno;
            if ((r == -ENOTDIR || r == -ELOOP) &&
                fstatat(fd, name, &lst, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(lst.st_mode))
                r = err_set(err, -ENOTDIR,
                            "cannot use directory %.*s: a symbolic link appeared "
                            "there after the path was resolved (not followed)",
                            len, path);
            else if (r == -ENOTDIR)
                err_set(err, r, "cannot create directory %.*s: it exists and is not a directory",
                        len, path);
            else
                err_sys(err, r, "cannot open directory %.*s", len, path);
            break;
        }
        close(fd);
        fd = nfd;
        name = end + strspn(end, "/");
    }
    free(copy);
    if (r < 0) {
        if (fd >= 0)
            close(fd);
        return r;
    }
    *ret_fd = fd;
    return 0;
}

/*
 * Removes everything inside the directory open on dfd, never following a
 * link. Only for this process's own staging directory, which nobody else
 * can write: what is in it was made here. Best effort.
 */
static void
dir_clear(int dfd)
{
    struct strv names;
    struct dirent *e;
    DIR *d;
    int fd;

    if ((fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        return;
    if (!(d = fdopendir(fd))) {
        close(fd);
        return;
    }
    strv_init(&names);
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            strv_push(&names, e->d_name);
    closedir(d);
    for (size_t i = 0; i < names.n; i++) {
        if (unlinkat(dfd, names.v[i], 0) == 0 || (errno != EISDIR && errno != EPERM))
            continue;
        fd = openat(dfd, names.v[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
            continue;
        dir_clear(fd);
        close(fd);
        unlinkat(dfd, names.v[i], AT_REMOVEDIR);
    }
    strv_free(&names);
}

/* True if the directory open on dfd holds nothing but "." and "..". */
static bool
dir_is_empty(int dfd)
{
    struct dirent *e;
    bool empty = true;
    DIR *d;
    int fd;

    if ((fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        return false;
    if (!(d = fdopendir(fd))) {
        close(fd);
        return false;
    }
    while (empty && (e = readdir(d)))
        empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(d);
    return empty;
}

/* fsync of an open directory; shown names it in messages. */
static int
dir_sync(int fd, const char *shown, struct esd_err *err)
{
    /* EINVAL: the filesystem cannot sync directories; there is nothing more to do. */
    if (fsync(fd) < 0 && errno != EINVAL)
        return err_sys(err, -errno, "cannot fsync directory %s", shown);
    return 0;
}

struct job {
    const struct prepare_opts *o;
    struct jsonl_limits lim;
    char *config; /* resolved recipe path */
    char *recipe_data;
    size_t recipe_len;
    struct stat recipe_st;
    char recipe_sha[SHA256_HEX_LEN + 1];
    struct recipe_policy pol; /* o->policy's lists and limits, global_stage from o */
    struct recipe recipe;
    bool have_recipe;
    bool split; /* recipe.split < recipe.nprocess: the recipe has a global stage */
    char shards_sha[SHA256_HEX_LEN + 1]; /* of recipe.shards_yaml, when split */
    char global_sha[SHA256_HEX_LEN + 1]; /* of recipe.global_yaml, when split */
    char *ray_address;                   /* stripped */
    char *dataset;                       /* resolved dataset path */
    char *media_root;
    struct files files;
    char *job_dir;
    char *staging;          /* its path, for messages */
    char *staging_name;     /* its name in the parent */
    int parent_fd;          /* the job directory's parent, or -1 */
    int staging_fd;         /* or -1 */
    int shards_fd;          /* staging's shards/, or -1 */
    struct stat staging_st; /* of staging_fd: what the name must still be at publication */
    bool staged;            /* staging_name was made here: removed on failure */
    struct record_ctx rctx;
    struct strv warnings;
    uint64_t total_raw;
    uint64_t total_text;  /* what the write pass reads: the spools of compressed files */
    uint64_t total_guess; /* what one pass balances on: the plain files' sizes and the guesses */
    uint64_t rows;
    uint64_t bytes;
    double t0;
    uint64_t progress_next;
    unsigned threads; /* of the passes' pipelines */
    bool norm_is_raw; /* the normalised stream is the one input file's bytes */
    /* One pass (see scan_pass): the shards written by the scan, on the
     * guess that the normalised stream is the input files' text */
    bool spec, spec_failed;
    struct writer *w;
    enum prepare_sync sync; /* FS or FILES, chosen once the staging directory is open */
};

static void
report(struct job *j, int phase, uint64_t done, uint64_t rows, bool force)
{
    struct prepare_progress p;

    if (!j->o->progress || (!force && done < j->progress_next))
        return;
    j->progress_next = done + (8u << 20);
    p.phase = phase;
    p.bytes_done = done;
    p.bytes_total = phase == 2 ? j->total_text : j->total_raw;
    p.rows = rows;
    p.elapsed = time_mono() - j->t0;
    j->o->progress(j->o->progress_ctx, &p);
}

static int
cancelled(const struct job *j, struct esd_err *err)
{
    if (j->o->cancel && *j->o->cancel)
        return err_set(err, -ECANCELED, "interrupted; no job directory was published");
    return 0;
}

static char *
strip(const char *s)
{
    const char *e;

    while (*s == ' ' || (*s >= '\t' && *s <= '\r'))
        s++;
    e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || (e[-1] >= '\t' && e[-1] <= '\r')))
        e--;
    return xstrndup(s, (size_t)(e - s));
}

/*
 * Every operator of the recipe is one the processor's Data-Juicer
 * registers (o->registry, when it was read): a misspelt name with a
 * shard-safe suffix would pass the name rule and fail every attempt on
 * every node. Not checked for a recipe with custom_operator_paths (those
 * register more) nor for an operator the caller allowed by name.
 */
static int
registry_check(const struct prepare_opts *o, const struct recipe *rc, struct esd_err *err)
{
    const struct strv *allow = o->policy ? o->policy->allow : NULL;

    if (!o->registry || rc->custom_operator_paths.n)
        return 0;
    for (size_t i = 0; i < rc->ops.n; i++) {
        const char *op = rc->ops.v[i], *best;
        struct suggest s;

        if (strv_contains(o->registry, op) || (allow && strv_contains(allow, op)))
            continue;
        suggest_init(&s, op, strlen(op));
        for (size_t k = 0; k < o->registry->n; k++)
            suggest_add(&s, o->registry->v[k]);
        best = suggest_result(&s);
        return err_set(err, -EINVAL,
                       "Unknown operator '%s' in %s: the processor's Data-Juicer "
                       "(%s) registers no such operator%s%s%s",
                       op, o->config, o->registry_source ? o->registry_source : "its registry",
                       best ? "; did you mean '" : "", best ? best : "", best ? "'?" : "");
    }
    return 0;
}

/* Steps 1–7 of spec §6.1: everything that needs no pass over the data. */
static int
load_request(struct job *j, struct esd_err *err)
{
    const struct prepare_opts *o = j->o;
    int r;

    if ((r = pypath_resolve_cli(o->config, &j->config, err)) < 0)
        return r;
    if (stat(j->config, &j->recipe_st) < 0 || !S_ISREG(j->recipe_st.st_mode))
        return err_set(err, -ENOENT, "Recipe does not exist: %s", j->config);
    if (o->num_shards <= 0)
        return err_set(err, -EINVAL, "--num-shards must be a positive integer");
    j->ray_address = strip(o->ray_address ? o->ray_address : "local");
    if (!*j->ray_address)
        return err_set(err, -EINVAL, "--ray-address must not be empty");
    if (o->policy)
        j->pol = *o->policy;
    j->pol.global_stage = !o->no_global_stage;
    {
        size_t max = j->pol.limits.max_bytes ? j->pol.limits.max_bytes : RECIPE_MAX_BYTES;

        if ((r = fs_read_file(j->config, max, &j->recipe_data, &j->recipe_len, err)) < 0)
            return r;
    }
    sha256_buf(j->recipe_data, j->recipe_len, j->recipe_sha);
    if ((r = recipe_parse(j->recipe_data, j->recipe_len, j->config, &j->pol, &j->recipe, err)) < 0)
        return r;
    j->have_recipe = true;
    /* The global stage (spec of issue 17): what runs per shard and what
     * runs once after every shard, each a recipe of its own in the job. */
    j->split = j->recipe.split < j->recipe.nprocess;
    if (j->split) {
        sha256_buf(j->recipe.shards_yaml, strlen(j->recipe.shards_yaml), j->shards_sha);
        sha256_buf(j->recipe.global_yaml, strlen(j->recipe.global_yaml), j->global_sha);
    }
    if ((r = registry_check(o, &j->recipe, err)) < 0)
        return r;
    for (size_t i = 0; i < j->recipe.warnings.n; i++)
        strv_push(&j->warnings, j->recipe.warnings.v[i]);
    if (j->recipe.ray_address && strcmp(j->recipe.ray_address, j->ray_address) != 0) {
        /* the reference's words: the warning is kept in the manifest */
        struct buf w;

        buf_init(&w);
        buf_printf(&w, "recipe ray_address=%s will be overridden with ",
                   j->recipe.ray_address_repr);
        py_repr_str(j->ray_address, strlen(j->ray_address), &w);
        strv_push_owned(&j->warnings, buf_steal(&w));
    }
    if (o->dataset_path) {
        if ((r = pypath_resolve_cli(o->dataset_path, &j->dataset, err)) < 0)
            return r;
    } else {
        char *base = NULL, *joined;

        if (!j->recipe.dataset_path)
            return err_set(err, -EINVAL,
                           "no dataset path: pass --dataset-path or set dataset_path in %s",
                           j->config);
        if (!j->recipe.dataset_path_valid)
            return err_set(err, -EINVAL, "recipe %s: dataset_path must be a non-empty string",
                           j->config);
        if (j->recipe.dataset_path[0] == '/') {
            joined = xstrdup(j->recipe.dataset_path);
        } else {
            if ((r = pypath_resolve_cli(o->dj_root ? o->dj_root : ".", &base, err)) < 0)
                return r;
            joined = fs_join(base, j->recipe.dataset_path);
            free(base);
        }
        r = pypath_realpath(joined, &j->dataset, err);
        free(joined);
        if (r < 0)
            return r;
    }
    if ((r = discover(j->dataset, &j->files, &j->media_root, err)) < 0)
        return r;
    for (size_t i = 0; i < j->files.n; i++)
        j->total_raw += j->files.v[i].size;
    j->rctx.media_keys = &j->recipe.media_keys;
    j->rctx.index_keys = &j->recipe.index_keys;
    j->rctx.media_root = j->media_root;
    if ((r = pypath_resolve_cli(o->job_dir, &j->job_dir, err)) < 0)
        return r;
    /* its name is the job id, which every later load checks */
    if (!manifest_job_id_ok(fs_basename(j->job_dir))) {
        char *shown = str_escape_dup(fs_basename(j->job_dir));

        r = err_set(err, -EINVAL,
                    "the job directory's name '%s' cannot be a job id (1 to 255 "
                    "bytes of UTF-8 without control characters, not starting with '-')",
                    shown);
        free(shown);
        return r;
    }
    return 0;
}

/*
 * Whether the job's manifest m (its recipe object recipe) records the split
 * this request makes: no global stage in either, or the same operators
 * from the same item on. A job split without --no-global-stage is not the
 * job a request with it asks for, nor the other way round.
 */
static bool
same_split(const struct job *j, const struct manifest *m, const cJSON *recipe)
{
    const cJSON *ops, *op;
    size_t i = 0;

    if (!j->split || !m->global_snapshot)
        return !j->split && !m->global_snapshot && !m->recipe_whole_sha256;
    /* (not the digests of the two parts: the same recipe is the same job
     * even if another esd writes its parts otherwise) */
    if (m->global_shard_ops < 0 || (size_t)m->global_shard_ops != j->recipe.split)
        return false;
    ops = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(recipe, "global"),
                                           "operators");
    if (cJSON_GetArraySize(ops) != (int)j->recipe.global_ops.n)
        return false;
    cJSON_ArrayForEach(op, ops)
    {
        if (!cJSON_IsString(op) || strcmp(op->valuestring, j->recipe.global_ops.v[i++]) != 0)
            return false;
    }
    return true;
}

/*
 * Spec §6.6: does the existing job directory match this request? Its name
 * is looked up in the parent open on parent_fd and its manifest read from
 * there: a link at either (put there after the path was resolved) is not
 * followed and matches nothing, nor does a manifest that is not a regular
 * file.
 */
static int
matches_existing(struct job *j, int parent_fd, bool *ret_match, struct esd_err *err)
{
    struct manifest m;
    struct esd_err ignore;
    const cJSON *files, *recipe, *f;
    const char *whole;
    cJSON *doc = NULL;
    long long n;
    size_t i = 0, len = 0;
    bool match = false;
    char *mpath, *text = NULL;
    int jfd, r;

    *ret_match = false;
    jfd = openat(parent_fd, fs_basename(j->job_dir), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (jfd < 0)
        return 0;
    mpath = fs_join(j->job_dir, "manifest.json");
    r = fs_read_job_at(jfd, "manifest.json", mpath, MANIFEST_MAX_BYTES, &text, &len, err);
    close(jfd);
    if (r == -ENOENT || r == -ELOOP || r == -EINVAL) /* none, a link, not a file */
        r = 1;
    else if (r == 0)
        r = manifest_parse(text, len, j->job_dir, mpath, &doc, &m, err);
    free(text);
    free(mpath);
    if (r != 0)
        return r < 0 ? r : 0;
    recipe = cJSON_GetObjectItemCaseSensitive(doc, "recipe");
    files = cJSON_GetObjectItemCaseSensitive(doc, "input_files");
    if (!json_get_str(doc, "dataset_path") ||
        strcmp(json_get_str(doc, "dataset_path"), j->dataset) != 0)
        goto done;
    /* the user's recipe: whole_sha256 where the job has a global stage
     * (sha256 is then that of the shards' part), and the same split */
    whole = json_get_str(recipe, m.recipe_whole_sha256 ? "whole_sha256" : "sha256");
    if (!whole || strcmp(whole, j->recipe_sha) != 0 || !same_split(j, &m, recipe))
        goto done;
    if (json_get_int(doc, "num_shards", &n) < 0 || n != j->o->num_shards)
        goto done;
    if (strcmp(m.ray_address, j->ray_address) != 0)
        goto done;
    if (!cJSON_IsArray(files) || (size_t)cJSON_GetArraySize(files) != j->files.n)
        goto done;
    cJSON_ArrayForEach(f, files)
    {
        struct infile *x = &j->files.v[i++];
        const char *zk = json_get_str(f, "compression"), *zx = zsrc_kind_name(x->kind);
        long long size, mt;

        if ((zk || zx) && (!zk || !zx || strcmp(zk, zx) != 0))
            goto done;
        if (!json_get_str(f, "path") || strcmp(json_get_str(f, "path"), x->path) != 0 ||
            json_get_int(f, "size_bytes", &size) < 0 || (uint64_t)size != x->size ||
            json_get_int(f, "mtime_ns", &mt) < 0 || mt != x->mtime_ns)
            goto done;
    }
    i = 0;
    cJSON_ArrayForEach(f, files)
    {
        struct infile *x = &j->files.v[i++];
        char hex[SHA256_HEX_LEN + 1];

        if (sha256_file(x->path, hex, &ignore) < 0 || !json_get_str(f, "sha256") ||
            strcmp(json_get_str(f, "sha256"), hex) != 0)
            goto done;
    }
    match = true;
done:
    manifest_free(&m);
    cJSON_Delete(doc);
    *ret_match = match;
    return 0;
}

/* ---- the two passes as pipelines (common/pipeline.h) ----
 *
 * The source reads one input file after the other in blocks of whole
 * records (jsonl_reader_block), with the records before each block
 * counted, so that each can be validated and normalised on any thread: a
 * record's line and its global index, which a missing index key gets, are
 * known from the block's start. A file ends with a chunk of no records
 * (end), where its checks are made in order. The ordered stages apply the
 * results, hash and write; a failure in a block is applied as the single
 * thread applies it, record by record: the records before it count, then
 * its error is the pass's. */

enum { CHUNK_BYTES = 1 << 20 };

/* A piece of a chunk's normalised records that goes to one shard; close:
 * the shard ends with it. */
struct slice {
    long long shard;
    size_t off, len;
    bool close;
};

struct pchunk {
    size_t file;                 /* in j->files */
    bool end;                    /* the file's end: no records */
    uint64_t line0, row0, lines; /* records before it in its file, in the pass; in it */
    struct buf text;             /* whole records, as read */
    size_t inlen;                /* text.len as read */
    struct buf raw;              /* pass 1: the raw bytes read while it was read */
    bool raw_is_text;            /* the reader's bytes are the text: raw not kept */
    /* the parallel stage's results */
    struct jsonl_record rec;
    struct buf norm;
    uint64_t nok; /* records before the failure r, or all */
    int r;
    struct esd_err err;
    uint64_t fast; /* fasthash of text */
    uint64_t norm_bytes;
    bool edited;
    /* pass 2: the normalised records (out, or text when nothing was
     * edited) and their ends; the slices the apply stage cut */
    struct buf out;
    const char *outp;
    size_t outlen;
    size_t *ends;
    size_t nends, endcap;
    struct slice *sl;
    size_t nsl, slcap;
    bool laid; /* pass 1: its slices go to the shards (one pass) */
};

struct writer;

struct pass {
    struct job *j;
    int phase;        /* 1: scan, 2: write */
    struct writer *w; /* pass 2 */
    /* source */
    size_t file;
    bool open;
    struct jsonl_reader rd;
    uint64_t rows;
    struct buf *raw; /* pass 1: where the reader's raw bytes go */
    /* the digest that shardhash_run pairs with the shards' (few threads,
     * sha256_pair_pays): the normalised stream's, or in one pass of
     * one plain file, that file's (its bytes are the stream's) */
    enum { PAIR_NONE, PAIR_ALL, PAIR_RAW } pair;
    bool spooling;      /* pass 1: the current file's text goes to spool_fd */
    uint64_t text_read; /* of the current file */
    int spool_fd;
    int spool_werr; /* its first write error, a negative errno */
    uint64_t spool_bytes;
    /* apply */
    uint64_t done; /* bytes applied */
    uint64_t fast; /* the current file's chunks' fasthashes, combined */
    uint64_t file_rows;
    uint64_t written, remaining, index;
};

static void
pchunk_free(struct pchunk *c)
{
    buf_free(&c->text);
    buf_free(&c->raw);
    buf_free(&c->norm);
    buf_free(&c->out);
    jsonl_record_free(&c->rec);
    free(c->ends);
    free(c->sl);
    free(c);
}

/* A buffer that one long record made large goes back to its usual size. */
static void
buf_trim(struct buf *b)
{
    if (b->cap > 4 * (size_t)CHUNK_BYTES) {
        buf_free(b);
        buf_init(b);
    }
    buf_reset(b);
}

static void
pass_on_data(void *ctx, const char *p, size_t n)
{
    struct pass *ps = ctx;

    ps->j->files.v[ps->file].seen += n;
    if (ps->raw)
        buf_append(ps->raw, p, n);
}

/*
 * The spool: a compressed input's text, written in the scan pass as it is
 * decompressed (by the source stage, in order), so that the write pass
 * reads it as a plain file instead of decompressing again. It is a file of
 * the staging directory (made before the scan when an input is
 * compressed), checked in the write pass as a plain file's bytes are
 * (rows, size, fast hash) and removed once read, or with the staging
 * directory on any failure. It needs the text's size of room in the job
 * directory's file system.
 */
static void
spool_name(char *buf, size_t size, size_t i)
{
    snprintf(buf, size, "spool-%05zu.jsonl", i);
}

static void
pass_on_text(void *ctx, const char *p, size_t n)
{
    struct pass *ps = ctx;

    ps->spool_bytes += n;
    if (ps->spool_werr == 0)
        ps->spool_werr = fs_write_all(ps->spool_fd, p, n);
}

/* Creates the current file's spool; it then receives the text read. */
static int
spool_open(struct pass *ps, struct esd_err *err)
{
    struct job *j = ps->j;
    char name[40];

    spool_name(name, sizeof(name), ps->file);
    ps->spool_fd =
        openat(j->staging_fd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (ps->spool_fd < 0)
        return err_sys(err, -errno, "cannot create %s/%s (the text of %s)", j->staging, name,
                       j->files.v[ps->file].path);
    ps->spooling = true;
    ps->spool_werr = 0;
    ps->spool_bytes = 0;
    ps->rd.on_text = pass_on_text;
    ps->rd.on_text_ctx = ps;
    return 0;
}

/* Closes the current file's spool, after r (0 when the file was read
 * whole: its text's size is then the spool's). */
static int
spool_end(struct pass *ps, int r, struct esd_err *err)
{
    struct job *j = ps->j;
    struct infile *f = &j->files.v[ps->file];
    char name[40];

    if (!ps->spooling)
        return r;
    ps->spooling = false;
    spool_name(name, sizeof(name), ps->file);
    if (r == 0 && ps->spool_werr < 0)
        r = err_sys(err, ps->spool_werr, "cannot write %s/%s (the text of %s)", j->staging, name,
                    f->path);
    if (close(ps->spool_fd) < 0 && errno != EINTR && r == 0)
        r = err_sys(err, -errno, "cannot write %s/%s (the text of %s)", j->staging, name, f->path);
    ps->spool_fd = -1;
    if (r == 0)
        f->text_size = ps->spool_bytes;
    return r;
}

/* The write pass's reader of input i: the file (a compressed one
 * decompressed again), or the spool of its text. */
static int
input_open(struct job *j, size_t i, struct jsonl_reader *rd, struct esd_err *err)
{
    const struct infile *f = &j->files.v[i];
    char name[40], *shown;
    int fd;

    if (!f->spooled)
        return jsonl_reader_open_as(rd, f->path, f->kind, j->lim.max_line, err);
    spool_name(name, sizeof(name), i);
    shown = fs_join(j->staging, name);
    fd = openat(j->staging_fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        int r = err_sys(err, -errno, "cannot open %s (the text of %s)", shown, f->path);

        free(shown);
        return r;
    }
    jsonl_reader_open_fd(rd, fd, shown, j->lim.max_line);
    free(shown);
    return 0;
}

/*
 * After the write pass read input i: a compressed file's spool goes, and
 * the file itself, read once in the scan, must still be what was read
 * then (its size and mtime as discovery saw them).
 */
static int
input_done(struct job *j, size_t i, struct esd_err *err)
{
    const struct infile *f = &j->files.v[i];
    struct stat st;
    char name[40];

    if (!f->spooled)
        return 0;
    spool_name(name, sizeof(name), i);
    if (unlinkat(j->staging_fd, name, 0) < 0)
        return err_sys(err, -errno, "cannot remove %s/%s", j->staging, name);
    if (stat(f->path, &st) < 0 || (uint64_t)st.st_size != f->size ||
        (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec != f->mtime_ns)
        return err_set(err, -ESTALE, "Input content changed between the scan and write passes: %s",
                       f->path);
    return 0;
}

/* Stage 0: the next block of the current file, or its end chunk. */
static int
src_run(void *ctx, void *chunk, uint64_t seq, struct esd_err *err)
{
    struct pass *ps = ctx;
    struct pchunk *c = chunk;
    struct job *j = ps->j;
    unsigned long long lines;
    const char *p;
    size_t len;
    int r;

    (void)seq;
    if (ps->file == j->files.n)
        return 0;
    if ((r = cancelled(j, err)) < 0)
        return r;
    if (!ps->open) {
        struct infile *f = &j->files.v[ps->file];

        if (ps->phase == 2)
            r = input_open(j, ps->file, &ps->rd, err);
        else
            r = jsonl_reader_open_as(&ps->rd, f->path, f->kind, j->lim.max_line, err);
        if (r < 0)
            return r;
        ps->open = true;
        ps->rd.on_data = pass_on_data;
        ps->rd.on_data_ctx = ps;
        f->seen = 0;
        ps->text_read = 0;
        if (ps->phase == 1)
            sha256_init(&f->sha);
        if (ps->phase == 1 && f->spooled && (r = spool_open(ps, err)) < 0)
            return r;
    }
    buf_trim(&c->text);
    buf_trim(&c->raw);
    c->file = ps->file;
    c->line0 = ps->rd.lineno;
    c->row0 = ps->rows;
    c->lines = 0;
    c->end = false;
    c->raw_is_text = !ps->rd.decoded;
    ps->raw = ps->phase == 1 && !c->raw_is_text ? &c->raw : NULL;
    r = jsonl_reader_block(&ps->rd, CHUNK_BYTES, &p, &len, &lines, err);
    ps->raw = NULL;
    if (r < 0)
        return r;
    if (r == 1) {
        buf_append(&c->text, p, len);
        c->inlen = len;
        c->lines = lines;
        ps->rows += lines;
        ps->text_read += len;
        return 1;
    }
    c->end = true;
    c->inlen = 0;
    jsonl_reader_close(&ps->rd);
    ps->open = false;
    if (ps->phase == 1) {
        j->files.v[ps->file].text_size = ps->text_read;
        r = spool_end(ps, 0, err); /* a compressed file's: its text's */
    } else {
        r = input_done(j, ps->file, err);
    }
    if (r < 0)
        return r;
    ps->file++;
    return 1;
}

/* The raw bytes of chunk c for its file's digest in pass 1: its text, or
 * a compressed file's bytes read with it. */
static struct sha256 *
chunk_raw(struct pass *ps, struct pchunk *c, const char **p, size_t *n)
{
    struct infile *f = &ps->j->files.v[c->file];

    *p = c->raw_is_text ? c->text.p : c->raw.p;
    *n = c->raw_is_text ? c->inlen : c->raw.len;
    if (!c->raw_is_text)
        f->decoded = true;
    return &f->sha;
}

/* Pass 1's raw digest of each file, in order. */
static int
rawhash_run(void *ctx, void *chunk, uint64_t seq, struct esd_err *err)
{
    struct pass *ps = ctx;
    const char *p;
    size_t n;
    struct sha256 *sha = chunk_raw(ps, chunk, &p, &n);

    (void)seq, (void)err;
    if (n)
        sha256_update(sha, p, n);
    return 0;
}

static void
chunk_end_at(struct pchunk *c, size_t end)
{
    if (c->nends == c->endcap) {
        c->endcap = c->endcap ? c->endcap * 2 : 1024;
        c->ends = xrealloc(c->ends, c->endcap * sizeof(*c->ends));
    }
    c->ends[c->nends++] = end;
}

/*
 * The parallel stage: every record validated and normalised (pass 1, and
 * pass 2 for a file that needed an edit), measured, and in pass 2 laid out
 * as it goes to the shards, each with its "\n". Never fails itself: the
 * first failure is kept with the records before it for the apply stage.
 */
static int
work_run(void *ctx, void *chunk, uint64_t seq, struct esd_err *err)
{
    struct pass *ps = ctx;
    struct pchunk *c = chunk;
    struct job *j = ps->j;
    struct infile *f = &j->files.v[c->file];
    bool check = ps->phase == 1 || f->edited;
    /* laid out for the shards: pass 2, or pass 1 written in one pass
     * (there, only what it read: pass 1 may not look at f->edited, which
     * its apply stage is still making) */
    bool lay = ps->phase == 2 || j->spec, from_out = ps->phase == 2 && f->edited;
    const char *p = c->text.p, *e = p ? p + c->inlen : p; /* an empty chunk has no text */
    struct fasthash fh;

    (void)seq, (void)err;
    c->nok = 0;
    c->r = 0;
    c->norm_bytes = 0;
    c->edited = false;
    c->nends = 0;
    buf_trim(&c->out);
    if (c->end)
        return 0;
    fh_init(&fh);
    fh_update(&fh, c->text.p, c->inlen);
    c->fast = fh_final(&fh);
    for (uint64_t k = 0; k < c->lines; k++) {
        const char *nl = memchr(p, '\n', (size_t)(e - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(e - p);
        bool edited = false;

        if (check) {
            unsigned long long line = c->line0 + k + 1;

            if (jsonl_check(&c->rec, p, len, &j->lim) < 0) {
                c->r = jsonl_error(&c->rec, &j->lim, f->path, line, &c->err);
                break;
            }
            c->r = record_normalize(&j->rctx, p, len, &c->rec, c->row0 + k, &c->norm, &edited,
                                    f->path, line, &c->err);
            if (c->r < 0)
                break;
        }
        c->edited |= edited;
        c->norm_bytes += (edited ? c->norm.len : len) + 1;
        if (from_out) {
            buf_append(&c->out, edited ? c->norm.p : p, edited ? c->norm.len : len);
            buf_putc(&c->out, '\n');
            chunk_end_at(c, c->out.len);
        } else if (lay) {
            chunk_end_at(c, (size_t)(p - c->text.p) + len + 1);
        }
        c->nok++;
        p = nl ? nl + 1 : e;
    }
    if (from_out) {
        c->outp = c->out.p;
        c->outlen = c->out.len;
    } else if (lay) {
        /* a last record without "\n" gets one in the shard (in pass 1,
         * where it ends the guess of one pass, none) */
        if (ps->phase == 2 && c->nok == c->lines && c->inlen && c->text.p[c->inlen - 1] != '\n')
            buf_putc(&c->text, '\n');
        c->outp = c->text.p;
        c->outlen = c->nends ? c->ends[c->nends - 1] : 0;
    }
    return 0;
}

/* The fasthashes of a file's chunks combined in order: the bounds of the
 * chunks depend on the bytes alone, so both passes combine the same. */
static uint64_t
fast_combine(uint64_t acc, const struct pchunk *c)
{
    return fh_round(acc ^ c->fast, (uint64_t)c->inlen);
}

static void balance(struct pass *ps, struct pchunk *c, uint64_t total, bool remaining);
static int write_run(void *ctx, void *chunk, uint64_t seq, struct esd_err *err);
static int shardhash_run(void *ctx, void *chunk, uint64_t seq, struct esd_err *err);
static int allhash_run(void *ctx, void *chunk, uint64_t seq, struct esd_err *err);

/* Pass 1's ordered stage: the counts, a file's checks at its end; in one
 * pass, the shards' records too (balance). */
static int
scan_apply(void *ctx, void *chunk, uint64_t seq, struct esd_err *err)
{
    struct pass *ps = ctx;
    struct pchunk *c = chunk;
    struct job *j = ps->j;
    struct infile *f = &j->files.v[c->file];

    (void)seq;
    c->laid = false;
    c->nsl = 0;
    if (c->end) {
        if (f->seen != f->size)
            return err_set(err, -ESTALE, "input file changed while it was read: %s", f->path);
        f->fast = ps->fast;
        ps->fast = 0;
        j->bytes += f->norm_bytes;
        j->total_text += f->text_size;
        return 0;
    }
    f->edited |= c->edited;
    f->norm_bytes += c->norm_bytes;
    f->rows += c->nok;
    j->rows += c->nok;
    ps->fast = fast_combine(ps->fast, c);
    if (c->r < 0) {
        *err = c->err;
        return c->r;
    }
    /* One pass while the records are the text read (none edited, every
     * one ended by its "\n") and no more than the guess of its size */
    if (j->spec && !j->spec_failed) {
        if (c->edited || c->text.p[c->inlen - 1] != '\n' || ps->written + c->inlen > j->total_guess)
            j->spec_failed = true;
        else
            c->laid = true, balance(ps, c, j->total_guess, false);
    }
    ps->done += c->raw_is_text ? c->inlen : c->raw.len; /* (the raw bytes: of total_raw) */
    report(j, 1, ps->done, j->rows, false);
    return cancelled(j, err);
}

static struct pchunk **
pchunks_new(size_t n)
{
    struct pchunk **v = xcalloc(n, sizeof(*v));

    for (size_t i = 0; i < n; i++) {
        v[i] = xcalloc(1, sizeof(**v));
        buf_init(&v[i]->text);
        buf_init(&v[i]->raw);
        buf_init(&v[i]->norm);
        buf_init(&v[i]->out);
        jsonl_record_init(&v[i]->rec, true);
    }
    return v;
}

/* Runs one pass over every input file with these stages. */
static int
pass_run(struct pass *ps, const struct pipeline_stage *st, size_t nst, struct esd_err *err)
{
    size_t n = pipeline_chunks_for(ps->j->threads, nst);
    struct pchunk **v = pchunks_new(n);
    int r;

    r = pipeline_run(st, nst, ps, (void **)v, n, ps->j->threads, err);
    if (ps->open)
        jsonl_reader_close(&ps->rd);
    ps->open = false;
    (void)spool_end(ps, -1, err); /* (a failed pass's: closed, the error already said) */
    for (size_t i = 0; i < n; i++)
        pchunk_free(v[i]);
    free(v);
    return r;
}

/*
 * Pass 1 (spec §6.3): validate and measure every record, hash every file.
 *
 * In one pass (j->spec), it writes the shards too, on the guess that the
 * normalised stream will be the input files' text (no record edited, each
 * file ended by a "\n"), whose total the file sizes and the compressed
 * files' recorded sizes give before a byte is read (compressed_guess): the
 * balancing rule needs it. The guess is checked
 * as the records come (a failed one stops the writes, spec_failed) and at
 * the end (one_pass_held); when it did not hold, the shards are made again
 * by pass 2.
 */
static int
scan_pass(struct job *j, struct esd_err *err)
{
    /* the scan alone, or with the writes and digests of one pass, without
     * the stream's when it is the one input file's */
    bool one_plain = j->files.n == 1 && j->files.v[0].kind == ZSRC_PLAIN;
    struct pass ps = { .j = j, .phase = 1, .w = j->w };
    struct pipeline_stage st[8];
    size_t nst = 0;
    int r;

    if (j->spec && sha256_pair_pays(j->threads))
        ps.pair = one_plain ? PAIR_RAW : PAIR_ALL;
    st[nst++] = (struct pipeline_stage){ src_run, true };
    if (ps.pair != PAIR_RAW)
        st[nst++] = (struct pipeline_stage){ rawhash_run, true };
    st[nst++] = (struct pipeline_stage){ work_run, false };
    st[nst++] = (struct pipeline_stage){ scan_apply, true };
    if (j->spec) {
        st[nst++] = (struct pipeline_stage){ write_run, true };
        st[nst++] = (struct pipeline_stage){ shardhash_run, true };
        if (!one_plain && ps.pair == PAIR_NONE)
            st[nst++] = (struct pipeline_stage){ allhash_run, true };
    }
    r = pass_run(&ps, st, nst, err);

    for (size_t i = 0; i < j->files.n; i++)
        if (j->files.v[i].sha.ctx) {
            if (r == 0)
                sha256_final(&j->files.v[i].sha, j->files.v[i].sha256);
            else
                sha256_abort(&j->files.v[i].sha);
        }
    report(j, 1, ps.done, j->rows, r == 0);
    /* One file of plain records, none edited, the last one ended by its
     * "\n": the normalised stream is that file, byte for byte, and its
     * digest the file's; the write pass needs no third digest. */
    if (r == 0 && j->files.n == 1) {
        const struct infile *f = &j->files.v[0];

        j->norm_is_raw = !f->edited && !f->decoded && f->norm_bytes == f->size;
    }
    return r;
}

/* ---- pass 2: shards ---- */

/* No string a shard: at 100,000 shards every allocation kept shows in the
 * RSS. Its id and path are formatted when needed (shard_fmt). */
struct shard_out {
    int fd;
    struct sha256 sha;
    uint64_t rows, bytes;
    char sha256[SHA256_HEX_LEN + 1];
};

struct writer {
    struct job *j;
    struct shard_out *shards; /* num_shards entries */
    long long cur;            /* the shard the apply stage fills */
    long long wcur;           /* the shard open for writing */
    struct sha256 all;        /* the normalised stream */
};

/* "shards/<id>.jsonl" of shard i of n: its id is what follows the slash up to
 * the dot, its name in shards/ (shards_fd) what follows the slash; the ids
 * are manifest_shard_id's. */
struct shard_name {
    char rel[96];
    const char *name; /* in rel */
    int id_len;
};

static void
shard_fmt(struct shard_name *sn, long long i, long long n)
{
    int width = snprintf(NULL, 0, "%lld", n);

    if (width < 5)
        width = 5;
    snprintf(sn->rel, sizeof(sn->rel), "shards/part-%0*lld-of-%0*lld.jsonl", width, i, width, n);
    sn->name = sn->rel + strlen("shards/");
    sn->id_len = (int)(strlen(sn->name) - strlen(".jsonl"));
}

static int
shard_open(struct writer *w, long long i, struct esd_err *err)
{
    struct shard_out *s = &w->shards[i];
    struct shard_name sn;

    shard_fmt(&sn, i, w->j->o->num_shards);
    s->fd = openat(w->j->shards_fd, sn.name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                   0644);
    if (s->fd < 0)
        return err_sys(err, -errno, "cannot create shard %s/%s", w->j->staging, sn.rel);
    w->wcur = i;
    return 0;
}

/* For a message about shard i. */
static int
shard_err(struct writer *w, int r, struct esd_err *err)
{
    struct shard_name sn;

    shard_fmt(&sn, w->wcur, w->j->o->num_shards);
    return err_sys(err, r, "cannot write shard %s/%s", w->j->staging, sn.rel);
}

/*
 * Closes the shard being written without syncing it: the whole staging
 * directory is made durable at once before publication (stage_sync).
 */
static int
shard_close(struct writer *w, struct esd_err *err)
{
    struct shard_out *s = &w->shards[w->wcur];
    int r = 0;

    /* A big shard's pages start for the disk now, beside the rest of the
     * pass, so that the sync before publication finds little left to write;
     * small ones are left to that sync, which writes them together. Best
     * effort: a write error is reported by that sync. */
    if (s->bytes >= CHUNK_BYTES)
        (void)sync_file_range(s->fd, 0, 0, SYNC_FILE_RANGE_WRITE);
    /* NFS reports a write error of the flush at close at the latest */
    if (close(s->fd) < 0 && errno != EINTR)
        r = shard_err(w, -errno, err);
    s->fd = -1;
    return r;
}

static void
chunk_slice(struct pchunk *c, long long shard, size_t off, size_t len, bool close)
{
    if (len == 0 && !close)
        return;
    if (c->nsl == c->slcap) {
        c->slcap = c->slcap ? c->slcap * 2 : 16;
        c->sl = xrealloc(c->sl, c->slcap * sizeof(*c->sl));
    }
    c->sl[c->nsl++] = (struct slice){ shard, off, len, close };
}

/*
 * The balancing rule of spec §6.5, in exact integer arithmetic, over the
 * chunk's records in order: each counted into the current shard, the chunk
 * cut into slices where a shard ends. total is the normalised bytes; the
 * rule's second clause (the records left are as many as the shards left)
 * needs the records' total, which one pass does not know yet: there
 * (remaining false) it is left out, and scan_pass checks afterwards that
 * it never applied (one_pass_held).
 */
static void
balance(struct pass *ps, struct pchunk *c, uint64_t total, bool remaining)
{
    struct writer *w = ps->w;
    const long long N = ps->j->o->num_shards;
    size_t start = 0;

    for (uint64_t k = 0; k < c->nok; k++) {
        size_t end = c->ends[k], len = end - (k ? c->ends[k - 1] : 0);
        struct shard_out *s = &w->shards[w->cur];

        s->rows++;
        s->bytes += len;
        ps->written += len;
        ps->remaining -= remaining ? 1 : 0;
        ps->index++;
        ps->file_rows++;
        if (w->cur < N - 1 && ((unsigned __int128)ps->written * (unsigned __int128)N >=
                                   (unsigned __int128)total * (unsigned __int128)(w->cur + 1) ||
                               (remaining && ps->remaining == (uint64_t)(N - w->cur - 1)))) {
            chunk_slice(c, w->cur, start, end - start, true);
            start = end;
            w->cur++;
        }
    }
    chunk_slice(c, w->cur, start, (c->nok ? c->ends[c->nok - 1] : 0) - start, false);
}

/* Pass 2's ordered stage: every record counted into its shard by the
 * balancing rule, in order, and the chunk cut into slices; a file's
 * checks against pass 1 at its end. */
static int
write_apply(void *ctx, void *chunk, uint64_t seq, struct esd_err *err)
{
    struct pass *ps = ctx;
    struct pchunk *c = chunk;
    struct job *j = ps->j;
    struct infile *f = &j->files.v[c->file];

    (void)seq;
    c->nsl = 0;
    if (c->end) {
        /* A file none of whose records needed an edit in pass 1 is copied
         * as read: its bytes are checked against pass 1's here (rows,
         * size, fast hash), and a mismatch fails the prepare, whose
         * staging directory then goes, so an unchecked record never
         * reaches a published shard. */
        uint64_t fast = ps->fast, rows = ps->file_rows;

        ps->fast = 0;
        ps->file_rows = 0;
        /* (seen: raw bytes, those of the text but for a file decompressed again) */
        if (rows != f->rows ||
            f->seen != (f->kind == ZSRC_PLAIN || f->spooled ? f->text_size : f->size) ||
            fast != f->fast)
            return err_set(err, -ESTALE,
                           "Input content changed between the scan and write passes: %s", f->path);
        return 0;
    }
    ps->fast = fast_combine(ps->fast, c);
    /* more records than pass 1 counted: the input changed; stop before
     * writing one (remaining, unsigned, would also wrap and upset the
     * balancing) */
    if (c->nok > ps->remaining)
        return err_set(err, -ESTALE,
                       "Input changed between the scan and write passes: %s has more records",
                       f->path);
    balance(ps, c, j->bytes, true);
    if (c->r < 0) {
        *err = c->err;
        return c->r;
    }
    ps->done += c->inlen;
    report(j, 2, ps->done, ps->index, false);
    return cancelled(j, err);
}

/* Writes the chunk's slices, each to its shard; a shard that ends is
 * closed and the next one made. */
static int
write_run(void *ctx, void *chunk, uint64_t seq, struct esd_err *err)
{
    struct pass *ps = ctx;
    struct pchunk *c = chunk;
    struct writer *w = ps->w;
    int r;

    (void)seq;
    for (size_t i = 0; i < c->nsl; i++) {
        const struct slice *sl = &c->sl[i];

        if (sl->len && (r = fs_write_all(w->shards[sl->shard].fd, c->outp + sl->off, sl->len)) < 0)
            return shard_err(w, r, err);
        if (sl->close &&
            ((r = shard_close(w, err)) < 0 || (r = shard_open(w, sl->shard + 1, err)) < 0))
            return r;
    }
    return 0;
}

/*
 * Each shard's digest, in order; with ps->pair, another digest of the
 * chunk's bytes beside them, in the same blocks (sha256_update2): there
 * is then no stage of its own for that one (allhash_run, rawhash_run).
 */
static int
shardhash_run(void *ctx, void *chunk, uint64_t seq, struct esd_err *err)
{
    struct pass *ps = ctx;
    struct pchunk *c = chunk;
    struct sha256 *one = NULL;
    const char *p = NULL;
    size_t n = 0;

    (void)seq, (void)err;
    if (ps->pair == PAIR_RAW)
        one = chunk_raw(ps, c, &p, &n);
    else if (ps->pair == PAIR_ALL && !c->end && (ps->phase == 2 || c->laid))
        one = &ps->w->all, p = c->outp, n = c->outlen;
    for (size_t i = 0; i < c->nsl; i++) {
        const struct slice *sl = &c->sl[i];
        struct shard_out *s = &ps->w->shards[sl->shard];
        size_t k = n < sl->len ? n : sl->len;

        if (!s->sha.ctx)
            sha256_init(&s->sha);
        if (k)
            sha256_update2(&s->sha, c->outp + sl->off, sl->len, one, p, k);
        else
            sha256_update(&s->sha, c->outp + sl->off, sl->len);
        p += k, n -= k;
        if (sl->close)
            sha256_final(&s->sha, s->sha256);
    }
    if (n)
        sha256_update(one, p, n);
    return 0;
}

/* The normalised stream's digest. */
static int
allhash_run(void *ctx, void *chunk, uint64_t seq, struct esd_err *err)
{
    struct pass *ps = ctx;
    struct pchunk *c = chunk;

    (void)seq, (void)err;
    if (!c->end && (ps->phase == 2 || c->laid))
        sha256_update(&ps->w->all, c->outp, c->outlen);
    return 0;
}

/* After the last record: the last shard closed and its digest final, and
 * every shard made. */
static int
shards_end(struct job *j, struct writer *w, struct esd_err *err)
{
    const long long N = j->o->num_shards;
    struct shard_out *last = &w->shards[w->wcur];
    int r;

    if ((r = shard_close(w, err)) < 0)
        return r;
    if (!last->sha.ctx)
        sha256_init(&last->sha);
    sha256_final(&last->sha, last->sha256);
    if (w->cur != N - 1 || w->shards[N - 1].rows == 0)
        return err_set(err, -EIO, "Internal partitioning error: %lld of %lld shards written",
                       w->cur + 1, N);
    return 0;
}

/* Pass 2 (spec §6.5): the records again, into their shards. */
static int
write_pass(struct job *j, struct writer *w, struct esd_err *err)
{
    static const struct pipeline_stage st[] = {
        { src_run, true },   { work_run, false },     { write_apply, true },
        { write_run, true }, { shardhash_run, true }, { allhash_run, true },
    };
    struct pass ps = { .j = j, .phase = 2, .w = w, .remaining = j->rows };
    /* without the last when the stream's digest is known (norm_is_raw) or
     * made beside the shards' (pair) */
    size_t nst = sizeof(st) / sizeof(st[0]);
    int r;

    if (j->norm_is_raw)
        nst--;
    else if (sha256_pair_pays(j->threads))
        ps.pair = PAIR_ALL, nst--;

    j->progress_next = 0;
    if ((r = shard_open(w, 0, err)) < 0)
        return r;
    r = pass_run(&ps, st, nst, err);
    if (r == 0)
        r = shards_end(j, w, err);
    if (r == 0 && (ps.written != j->bytes || ps.remaining != 0))
        r = err_set(err, -ESTALE, "Input changed between the scan and write passes");
    report(j, 2, ps.done, ps.index, r == 0);
    return r;
}

/* Whether the shards one pass wrote are those of the balancing rule: the
 * guess held (the stream is the files' text, of the total balanced on),
 * and the rule's second clause, left out there, never applied: shard k's
 * last record, the (c_k+1)-th, came no later than where records left =
 * shards left would have closed it (c_k <= rows - N + k), so every shard is
 * where the rule puts it and the last one has records. */
static bool
one_pass_held(const struct job *j, const struct writer *w)
{
    const long long N = j->o->num_shards;
    uint64_t upto = 0;

    if (j->spec_failed || j->bytes != j->total_guess || w->cur != N - 1 || j->rows < (uint64_t)N)
        return false;
    for (long long k = 0; k < N - 1; k++) {
        upto += w->shards[k].rows;
        if (upto - 1 + (uint64_t)N > j->rows + (uint64_t)k)
            return false;
    }
    return w->shards[N - 1].rows > 0;
}

/* Forgets what one pass wrote, for pass 2 to write the shards again. */
static void
one_pass_undo(struct job *j, struct writer *w)
{
    for (long long i = 0; i <= w->wcur && i < j->o->num_shards; i++) {
        struct shard_out *s = &w->shards[i];
        struct shard_name sn;

        if (s->fd >= 0)
            close(s->fd);
        shard_fmt(&sn, i, j->o->num_shards);
        (void)unlinkat(j->shards_fd, sn.name, 0);
        sha256_abort(&s->sha);
        memset(s, 0, sizeof(*s));
        s->fd = -1;
    }
    w->cur = w->wcur = 0;
    sha256_abort(&w->all);
    sha256_init(&w->all);
}

/* ---- manifest and publication ---- */

static cJSON *
strv_json(const struct strv *s)
{
    cJSON *a = cJSON_CreateArray();

    for (size_t i = 0; i < s->n; i++)
        cJSON_AddItemToArray(a, cJSON_CreateString(s->v[i]));
    return a;
}

/*
 * The manifest's "shards" array is the one part that grows with the shards:
 * as a cJSON tree, six items and their strings a shard, then its text whole,
 * 100,000 shards took more than 100 MiB. So the tree holds this raw token
 * in its place, and write_manifest writes the array through a bounded
 * buffer where the token is, laid out as json_dump lays out the rest
 * (JSON_PRETTY: indent 2, keys sorted). The token cannot occur otherwise
 * after a newline and the key: a string's newline is escaped.
 */
static const char SHARDS_MARK[] = "@shards@";
static const char SHARDS_AT[] = "\n  \"shards\": @shards@";

/* The global stage's executor: Ray's where one of its operators is one of
 * Data-Juicer's Ray operators (ray_*, which need a Ray dataset). */
static const char *
global_executor(const struct recipe *rc)
{
    for (size_t i = 0; i < rc->global_ops.n; i++)
        if (!strncmp(rc->global_ops.v[i], "ray_", 4))
            return "ray";
    return "default";
}

static cJSON *
build_manifest(struct job *j, const char *all_sha)
{
    const struct prepare_opts *o = j->o;
    cJSON *m = cJSON_CreateObject(), *files, *x;
    char now[40];

    time_iso_now(now, NULL);
    json_add_int(m, "schema_version", MANIFEST_SCHEMA);
    json_add_str(m, "job_id", fs_basename(j->job_dir));
    json_add_str(m, "created_at", now);
    json_add_str(m, "dataset_path", j->dataset);
    json_add_str(m, "media_root", j->media_root);
    cJSON_AddItemToObject(m, "media_keys", strv_json(&j->recipe.media_keys));
    cJSON_AddItemToObject(m, "index_keys", strv_json(&j->recipe.index_keys));
    files = cJSON_AddArrayToObject(m, "input_files");
    for (size_t i = 0; i < j->files.n; i++) {
        struct infile *f = &j->files.v[i];
        x = cJSON_CreateObject();
        json_add_str(x, "path", f->path);
        json_add_str(x, "relative_path", f->rel);
        json_add_int(x, "size_bytes", (long long)f->size);
        json_add_int(x, "mtime_ns", f->mtime_ns);
        json_add_int(x, "rows", (long long)f->rows);
        json_add_str(x, "sha256", f->sha256);
        /* none for a plain file: a plain job's manifest stays the reference's */
        if (zsrc_kind_name(f->kind))
            json_add_str(x, "compression", zsrc_kind_name(f->kind));
        cJSON_AddItemToArray(files, x);
    }
    json_add_int(m, "total_rows", (long long)j->rows);
    json_add_int(m, "total_size_bytes", (long long)j->bytes);
    json_add_str(m, "normalized_sha256", all_sha);
    json_add_int(m, "num_shards", o->num_shards);
    /* written by write_manifest in its place, without a tree */
    cJSON_AddItemToObject(m, "shards", cJSON_CreateRaw(SHARDS_MARK));
    x = cJSON_AddObjectToObject(m, "recipe");
    json_add_str(x, "source_path", j->config);
    if (!j->split) {
        json_add_str(x, "snapshot_path", "recipe.yaml");
        json_add_str(x, "sha256", j->recipe_sha);
    } else {
        /* What the shards run is the snapshot (the reference's workers
         * and merge read it so); recipe.yaml stays the user's recipe. */
        cJSON *g;

        json_add_str(x, "snapshot_path", RECIPE_SHARDS_FILE);
        json_add_str(x, "sha256", j->shards_sha);
        json_add_str(x, "whole_sha256", j->recipe_sha);
        g = cJSON_AddObjectToObject(x, "global");
        json_add_str(g, "snapshot_path", RECIPE_GLOBAL_FILE);
        json_add_str(g, "sha256", j->global_sha);
        cJSON_AddItemToObject(g, "operators", strv_json(&j->recipe.global_ops));
        json_add_int(g, "shard_operators", (long long)j->recipe.split);
        json_add_str(g, "executor_type", global_executor(&j->recipe));
    }
    x = cJSON_AddObjectToObject(m, "data_juicer");
    json_add_str(x, "commit", o->dj_commit ? o->dj_commit : "unknown");
    if (o->dj_dirty < 0)
        cJSON_AddNullToObject(x, "dirty");
    else
        json_add_bool(x, "dirty", o->dj_dirty > 0);
    x = cJSON_AddObjectToObject(m, "execution");
    json_add_str(x, "executor_type", "ray");
    json_add_str(x, "ray_address", j->ray_address);
    json_add_str(x, "recipe_executor_type", j->recipe.executor_type);
    x = cJSON_AddObjectToObject(m, "policy");
    json_add_int(x, "lock_timeout_secs", o->lock_timeout_secs);
    json_add_int(x, "max_retries", o->max_retries);
    json_add_int(x, "poll_interval_secs", o->poll_interval_secs);
    cJSON_AddItemToObject(m, "warnings", strv_json(&j->warnings));
    return m;
}

/* A recipe file of the staging directory: name holding data[0..len), with
 * the source recipe's mode and times (shutil.copy2 for recipe.yaml). */
static int
write_recipe_file(struct job *j, const char *name, const char *data, size_t len,
                  struct esd_err *err)
{
    char *path = fs_join(j->staging, name);
    struct timespec ts[2] = { j->recipe_st.st_atim, j->recipe_st.st_mtim };
    int fd, r = 0;

    fd = openat(j->staging_fd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        r = err_sys(err, -errno, "cannot create %s", path);
        goto out;
    }
    if ((r = fs_write_all(fd, data, len)) < 0 ||
        (fchmod(fd, j->recipe_st.st_mode & 07777) < 0 && (r = -errno)) ||
        (futimens(fd, ts) < 0 && (r = -errno)) ||
        (j->sync == PREPARE_SYNC_FILES && fsync(fd) < 0 && (r = -errno)))
        err_sys(err, r, "cannot write %s", path);
    close(fd);
out:
    free(path);
    return r;
}

/* recipe.yaml: the bytes that were hashed; with a global stage also its
 * two parts, recipe.shards.yaml and recipe.global.yaml. */
static int
write_recipe_copy(struct job *j, struct esd_err *err)
{
    const struct recipe *rc = &j->recipe;
    int r = write_recipe_file(j, "recipe.yaml", j->recipe_data, j->recipe_len, err);

    if (r == 0 && j->split)
        r = write_recipe_file(j, RECIPE_SHARDS_FILE, rc->shards_yaml, strlen(rc->shards_yaml), err);
    if (r == 0 && j->split)
        r = write_recipe_file(j, RECIPE_GLOBAL_FILE, rc->global_yaml, strlen(rc->global_yaml), err);
    return r;
}

static const char *const state_dirs[] = {
    "attempts",
    "state/locks",
    "state/done",
    "state/failed",
    "state/stale_locks",
    "state/history/failed",
    "state/history/attempts",
    "state/clock",
};

/* mkdir -p of rel below the staging directory's descriptor, following no
 * link; the last level is returned open. */
static int
staging_mkdir(struct job *j, const char *rel, struct esd_err *err)
{
    char *shown = fs_join(j->staging, rel);
    int fd = fs_mkdir_beneath(j->staging_fd, rel, 0755, shown, err);

    free(shown);
    return fd;
}

/* The state directories, and shards/ (kept open in shards_fd). */
static int
make_dirs(struct job *j, struct esd_err *err)
{
    for (size_t i = 0; i < sizeof(state_dirs) / sizeof(state_dirs[0]); i++) {
        int fd = staging_mkdir(j, state_dirs[i], err);

        if (fd < 0)
            return fd;
        close(fd);
    }
    j->shards_fd = staging_mkdir(j, "shards", err);
    return j->shards_fd < 0 ? j->shards_fd : 0;
}

/* The "shards" array at depth 1 of the manifest, written to fd in pieces. */
static int
write_shards(int fd, const struct writer *w, long long n, struct buf *b)
{
    int r = 0;

    buf_putc(b, '[');
    for (long long i = 0; r == 0 && i < n; i++) {
        const struct shard_out *s = &w->shards[i];
        struct shard_name sn;

        shard_fmt(&sn, i, n);
        buf_printf(b,
                   "%s\n    {\n      \"id\": \"%.*s\",\n      \"index\": %lld,\n"
                   "      \"path\": \"%s\",\n      \"rows\": %llu,\n      \"sha256\": \"%s\",\n"
                   "      \"size_bytes\": %llu\n    }",
                   i ? "," : "", sn.id_len, sn.name, i, sn.rel, (unsigned long long)s->rows,
                   s->sha256, (unsigned long long)s->bytes);
        if (b->len >= CHUNK_BYTES || i == n - 1) {
            r = fs_write_all(fd, b->p, b->len);
            b->len = 0;
        }
    }
    if (r == 0) {
        buf_puts(b, "\n  ]");
        r = fs_write_all(fd, b->p, b->len);
    }
    b->len = 0;
    return r;
}

/* manifest.json, as json_write_atomic writes it (0666 less the umask); a
 * new name in a directory nobody else can write needs no temporary file. */
static int
write_manifest(struct job *j, const struct writer *w, const cJSON *manifest, struct esd_err *err)
{
    char *path = fs_join(j->staging, "manifest.json");
    struct buf b, sb;
    const char *at;
    size_t head;
    int fd, r;

    buf_init(&b);
    buf_init(&sb);
    json_dump(manifest, JSON_PRETTY, &b);
    at = strstr(b.p, SHARDS_AT);
    if (!at)
        abort(); /* build_manifest put it there */
    head = (size_t)(at - b.p) + strlen(SHARDS_AT) - strlen(SHARDS_MARK);
    fd = openat(j->staging_fd, "manifest.json",
                O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0) {
        r = err_sys(err, -errno, "cannot create %s", path);
    } else {
        r = fs_write_all(fd, b.p, head);
        if (r == 0)
            r = write_shards(fd, w, j->o->num_shards, &sb);
        if (r == 0)
            r = fs_write_all(fd, b.p + head + strlen(SHARDS_MARK),
                             b.len - head - strlen(SHARDS_MARK));
        /* with PREPARE_SYNC_FS, stage_sync's syncfs writes it */
        if (r == 0 && j->sync == PREPARE_SYNC_FILES && fsync(fd) < 0)
            r = -errno;
        /* NFS may report a write error only at close */
        if (close(fd) < 0 && errno != EINTR && r == 0)
            r = -errno;
        if (r < 0)
            err_sys(err, r, "cannot write %s", path);
    }
    buf_free(&b);
    buf_free(&sb);
    free(path);
    return r;
}

/* ---- durability before publication ---- */

/*
 * File systems whose syncfs(2) writes back every dirty page and inode of
 * the file system and commits its metadata (a journal commit; on NFS the
 * COMMITs of unstable writes, directory operations being synchronous on
 * the server), so that one call makes the whole staging directory durable
 * however many shards it holds: 100,000 fsyncs are as many journal commits
 * or cache flushes, minutes on a busy disk. FUSE (bindfs, sshfs) is not
 * here: its syncfs reaches the server only if the server implements it,
 * where an fsync always does.
 */
static const unsigned long syncfs_types[] = {
    0xEF53,     /* ext2, ext3, ext4 */
    0x58465342, /* XFS */
    0x9123683E, /* btrfs */
    0x6969,     /* NFS */
    0x0BD00BD0, /* Lustre */
    0x01021994, /* tmpfs: nothing to write, nothing to lose */
};

/* Before Linux 5.8 syncfs returned 0 even when the write-back failed. */
static bool
syncfs_reports_errors(void)
{
    struct utsname u;
    unsigned major, minor;

    if (uname(&u) < 0 || sscanf(u.release, "%u.%u", &major, &minor) != 2)
        return false;
    return major > 5 || (major == 5 && minor >= 8);
}

/*
 * Up to this many shards, an fsync of each costs less than a syncfs, which
 * also writes every other process's dirty data on that file system (2 to 3 s
 * on a shared build machine's root, where 16 fsyncs took 0.1 s and 100,000
 * took 40 s).
 */
enum { SYNC_FILES_MAX = 1024 };

/* How the staging directory open on j->staging_fd is made durable. */
static enum prepare_sync
sync_choose(const struct job *j)
{
    struct statfs sf;

    if (j->o->sync != PREPARE_SYNC_AUTO)
        return j->o->sync;
    if (j->o->num_shards <= SYNC_FILES_MAX || fstatfs(j->staging_fd, &sf) < 0 ||
        !syncfs_reports_errors())
        return PREPARE_SYNC_FILES;
    for (size_t i = 0; i < sizeof(syncfs_types) / sizeof(syncfs_types[0]); i++)
        if ((unsigned long)sf.f_type == syncfs_types[i])
            return PREPARE_SYNC_FS;
    return PREPARE_SYNC_FILES;
}

/*
 * fsync of name in the directory open on dfd (shown/rel in messages). A
 * descriptor opened after the write still reports its write-back error:
 * nobody has seen it yet (Linux 4.13 and later).
 */
static int
sync_at(int dfd, const char *name, int flags, const char *shown, const char *rel,
        struct esd_err *err)
{
    int fd = openat(dfd, name, flags | O_NOFOLLOW | O_CLOEXEC), r = 0;

    if (fd < 0)
        return err_sys(err, -errno, "cannot open %s/%s to sync it", shown, rel);
    /* EINVAL: a directory the file system cannot sync, with nothing more to do */
    if (fsync(fd) < 0 && !((flags & O_DIRECTORY) && errno == EINVAL))
        r = err_sys(err, -errno, "cannot fsync %s/%s", shown, rel);
    close(fd);
    return r;
}

/* Directories whose entries were made here, the deepest first. */
static const char *const synced_dirs[] = { "shards", "state/history", "state", "." };

/*
 * Makes everything in the staging directory durable, after the last file
 * in it was written and closed and before it is published: with
 * PREPARE_SYNC_FS one syncfs (through staging_fd, opened before any of it
 * was written, so that a write-back error since is reported), with
 * PREPARE_SYNC_FILES an fsync of every shard (the recipe copy and the
 * manifest were synced as they were written), issued only now that all are
 * written; then its directories, in both modes.
 */
static int
stage_sync(struct job *j, const struct writer *w, struct esd_err *err)
{
    int r = 0;

    if (j->sync == PREPARE_SYNC_FS) {
        if (syncfs(j->staging_fd) < 0)
            return err_sys(err, -errno, "cannot sync %s (syncfs of its file system)", j->staging);
    } else {
        for (long long i = 0; r == 0 && i < j->o->num_shards; i++) {
            struct shard_name sn;

            shard_fmt(&sn, i, j->o->num_shards);
            r = sync_at(j->shards_fd, sn.name, O_RDONLY, j->staging, sn.rel, err);
            if (r == 0 && i % 1024 == 1023)
                r = cancelled(j, err);
        }
    }
    for (size_t i = 0; r == 0 && i < sizeof(synced_dirs) / sizeof(synced_dirs[0]); i++)
        r = sync_at(j->staging_fd, synced_dirs[i], O_RDONLY | O_DIRECTORY, j->staging,
                    synced_dirs[i], err);
    return r;
}

static void
hook(const struct job *j, enum prepare_step step)
{
    if (prepare_test_hook)
        prepare_test_hook(step, j->parent_fd, j->staging_name, fs_basename(j->job_dir));
}

/*
 * Makes the staging directory in the parent (open on parent_fd), opens it
 * and checks that what the name led to is the directory just made: a link
 * swapped in between is not followed, and what else can be put there is
 * refused: a directory of another uid, one that others may write, or one
 * that is not empty (say, another job of this uid's, moved in by whoever
 * can write the parent, which a failure would otherwise empty). Only then
 * is staging_fd kept, written below and emptied on failure.
 */
static int
staging_make(struct job *j, struct esd_err *err)
{
    int fd;

    hook(j, PREPARE_STEP_MKDIR);
    if (mkdirat(j->parent_fd, j->staging_name, 0755) < 0)
        return err_sys(err, -errno, "cannot create staging directory %s", j->staging);
    j->staged = true;
    hook(j, PREPARE_STEP_OPEN);
    fd = openat(j->parent_fd, j->staging_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return err_sys(err, -errno,
                       "cannot open staging directory %s (replaced after it was "
                       "made?); nothing was written",
                       j->staging);
    if (fstat(fd, &j->staging_st) < 0) {
        close(fd);
        return err_sys(err, -errno, "cannot open staging directory %s", j->staging);
    }
    /* The owner proves it: nobody but this uid (and root) can make a
     * directory owned by this uid. A file server that maps root to
     * another uid (root_squash) fails here too, which is the safe way. */
    if (j->staging_st.st_uid != geteuid()) {
        close(fd);
        return err_set(err, -EPERM,
                       "staging directory %s is owned by uid %u, not by this "
                       "prepare (uid %u): it was replaced after it was made, or the file server "
                       "maps this uid to another; nothing was written",
                       j->staging, (unsigned)j->staging_st.st_uid, (unsigned)geteuid());
    }
    /* mkdirat's 0755 never gives group or others write, whatever the umask */
    if ((j->staging_st.st_mode & (S_IWGRP | S_IWOTH)) || !dir_is_empty(fd)) {
        close(fd);
        return err_set(err, -EPERM,
                       "staging directory %s is not the empty directory this "
                       "prepare made: it was replaced after it was made; nothing was written",
                       j->staging);
    }
    j->staging_fd = fd;
    return 0;
}

/* Names the staging directory, opens the parent (made if need be) and
 * makes the staging directory in it (staging_make). */
static int
staging_begin(struct job *j, const char *parent, struct esd_err *err)
{
    char hex[33];
    int r;

    rand_hex32(hex);
    j->staging_name = xasprintf(".%s.preparing.%s", fs_basename(j->job_dir), hex);
    j->staging = xasprintf("%s/%s", parent, j->staging_name);
    hook(j, PREPARE_STEP_PARENT);
    if ((r = dir_open_path(parent, true, O_RDONLY, &j->parent_fd, err)) < 0 ||
        (r = staging_make(j, err)) < 0)
        return r;
    j->sync = sync_choose(j);
    return 0;
}

/*
 * After a failure: empties the staging directory through its descriptor
 * and removes its name if that is still the directory. Between the check
 * and unlinkat the name may be swapped again; unlinkat never follows a
 * link and removes only an empty directory, which whoever swapped it could
 * remove as well. A staging directory never opened (someone replaced it at
 * once) is left as it is.
 */
static void
staging_remove(struct job *j)
{
    struct stat st;

    if (!j->staged || j->staging_fd < 0)
        return;
    dir_clear(j->staging_fd);
    if (fstatat(j->parent_fd, j->staging_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        same_inode(&st, &j->staging_st))
        unlinkat(j->parent_fd, j->staging_name, AT_REMOVEDIR);
}

/*
 * Renames the staging directory onto the job directory, never over one
 * that appeared meanwhile, and only while the staging name is still the
 * directory this prepare filled.
 */
static int
publish(struct job *j, struct esd_err *err)
{
    const char *name = fs_basename(j->job_dir);
    struct stat st;
    char *parent;
    int r;

    hook(j, PREPARE_STEP_FILLED);
    if (fstatat(j->parent_fd, j->staging_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
        !same_inode(&st, &j->staging_st))
        return err_set(err, -ESTALE,
                       "staging directory %s was moved or replaced while this "
                       "prepare ran; nothing was published",
                       j->staging);
    hook(j, PREPARE_STEP_RENAME);
    /*
     * The residual window: rename renames whatever the staging name is at
     * that instant, and whoever can write the parent may swap it in the
     * moment since the check above. The job's name then becomes their own
     * entry (a link to another job, say); nothing is written through it,
     * and the check after the rename sees it, so this prepare fails and
     * claims nothing. Closing the window needs a rename by descriptor,
     * which Linux does not have.
     */
    r = renameat2(j->parent_fd, j->staging_name, j->parent_fd, name, RENAME_NOREPLACE);
    /* Without RENAME_NOREPLACE (some NFS servers) rename(2) still refuses
     * a non-empty target. */
    if (r < 0 && (errno == EINVAL || errno == ENOSYS))
        r = renameat(j->parent_fd, j->staging_name, j->parent_fd, name);
    if (r < 0 && (errno == EEXIST || errno == ENOTEMPTY))
        return err_set(err, -EEXIST,
                       "job directory %s appeared while this prepare ran (another prepare?); "
                       "nothing was published",
                       j->job_dir);
    if (r < 0)
        return err_sys(err, -errno, "cannot publish job directory %s", j->job_dir);
    if (fstatat(j->parent_fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
        !same_inode(&st, &j->staging_st))
        return err_set(err, -ESTALE,
                       "job directory %s is not the directory this prepare made: "
                       "its staging directory was replaced just before publication. Nothing was "
                       "published; do not use what is there now",
                       j->job_dir);
    j->staged = false;
    parent = fs_dirname(j->job_dir);
    r = dir_sync(j->parent_fd, parent, err);
    free(parent);
    return r;
}

void
prepare_opts_init(struct prepare_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->lock_timeout_secs = POLICY_LOCK_TIMEOUT_DEFAULT;
    o->max_retries = POLICY_MAX_RETRIES_DEFAULT;
    o->poll_interval_secs = POLICY_POLL_INTERVAL_DEFAULT;
    o->ray_address = "local";
    o->dj_dirty = -1;
}

void
prepare_result_free(struct prepare_result *r)
{
    free(r->job_dir);
    strv_free(&r->warnings);
    strv_free(&r->global_ops);
    memset(r, 0, sizeof(*r));
}

static void
job_free(struct job *j)
{
    free(j->config);
    free(j->recipe_data);
    if (j->have_recipe)
        recipe_free(&j->recipe);
    free(j->ray_address);
    free(j->dataset);
    free(j->media_root);
    files_free(&j->files);
    free(j->job_dir);
    free(j->staging);
    free(j->staging_name);
    if (j->shards_fd >= 0)
        close(j->shards_fd);
    if (j->staging_fd >= 0)
        close(j->staging_fd);
    if (j->parent_fd >= 0)
        close(j->parent_fd);
    strv_free(&j->warnings);
}

/*
 * The size one pass balances on (total_guess): a plain file's own, a
 * compressed one's text as its format records it (zsrc_text_guess; gzip
 * and zstd write one member or one frame, whose size is recorded). False
 * when some compressed file tells none, or one that cannot be right: its
 * text smaller than its compressed bytes (a file of many members, like
 * bgzip's, whose last one alone is told, or a text of 4 GiB or more, told
 * modulo 2^32). A guess that is wrong all the same is found in the scan
 * (one_pass_held), and pass 2 then decompresses the file again.
 */
static bool
compressed_guess(struct job *j)
{
    bool ok = true;

    j->total_guess = 0;
    for (size_t i = 0; i < j->files.n; i++) {
        const struct infile *f = &j->files.v[i];
        int64_t guess =
            f->kind == ZSRC_PLAIN ? (int64_t)f->size : zsrc_text_guess(f->path, f->kind, f->size);

        /* (sizes a hostile header made up could only add up past 2^64) */
        if (guess < 0 || (uint64_t)guess < f->size ||
            (uint64_t)guess > UINT64_MAX / 2 - j->total_guess)
            ok = false;
        else
            j->total_guess += (uint64_t)guess;
    }
    if (!ok)
        j->total_guess = 0;
    return ok;
}

static bool
files_spooled(const struct job *j)
{
    for (size_t i = 0; i < j->files.n; i++)
        if (j->files.v[i].spooled)
            return true;
    return false;
}

/* What the scan found that no job can be made of. */
static int
input_check(const struct job *j, struct esd_err *err)
{
    if (j->rows == 0)
        return err_set(err, -EINVAL, "Input dataset contains no records");
    if ((uint64_t)j->o->num_shards > j->rows)
        return err_set(err, -EINVAL, "--num-shards (%lld) exceeds input records (%llu)",
                       j->o->num_shards, (unsigned long long)j->rows);
    return 0;
}

int
prepare_run(const struct prepare_opts *o, struct prepare_result *ret, struct esd_err *err)
{
    struct job j = { 0 };
    struct writer w = { 0 };
    struct stat st;
    cJSON *manifest = NULL;
    char all_sha[SHA256_HEX_LEN + 1];
    bool match = false, exists = false;
    char *parent = NULL;
    int r;

    j.o = o;
    j.lim = o->limits ? *o->limits : jsonl_default_limits;
    j.t0 = time_mono();
    j.threads = o->threads ? o->threads : pipeline_cpus();
    j.parent_fd = j.staging_fd = j.shards_fd = -1;
    strv_init(&j.warnings);
    if ((r = load_request(&j, err)) < 0)
        goto out;
    parent = fs_dirname(j.job_dir);
    /* A parent that cannot be reached holds no job yet; making it says why. */
    if (dir_open_path(parent, false, O_PATH, &j.parent_fd, NULL) == 0) {
        exists = fstatat(j.parent_fd, fs_basename(j.job_dir), &st, AT_SYMLINK_NOFOLLOW) == 0;
        r = exists ? matches_existing(&j, j.parent_fd, &match, err) : 0;
        close(j.parent_fd);
        j.parent_fd = -1;
        if (r < 0)
            goto out;
    }
    if (exists) {
        if (!match) {
            r = err_set(err, -EEXIST,
                        "Job directory already exists and does not match this request: %s. "
                        "Choose a new --job-dir.",
                        j.job_dir);
            goto out;
        }
        goto done;
    }
    /* One pass where it can work: the normalised stream's size guessed
     * (compressed_guess); a shard needs a record, of 3 bytes at least
     * ("{}" and its "\n"); with more shards than that allows, the scan
     * alone says what is wrong, before anything is made. */
    j.spec = compressed_guess(&j) && o->num_shards <= (long long)((j.total_guess + 1) / 3);
    /* without a guess, compressed inputs' text is spooled in the staging
     * directory during the scan, for the write pass */
    for (size_t i = 0; !j.spec && i < j.files.n; i++)
        j.files.v[i].spooled = j.files.v[i].kind != ZSRC_PLAIN;
    if (files_spooled(&j) && (r = staging_begin(&j, parent, err)) < 0)
        goto out;
    if (!j.spec && (r = scan_pass(&j, err)) < 0)
        goto out;
    if (!j.spec && (r = input_check(&j, err)) < 0)
        goto out;
    if (j.staging_fd < 0 && (r = staging_begin(&j, parent, err)) < 0)
        goto out;
    if ((r = write_recipe_copy(&j, err)) < 0 || (r = make_dirs(&j, err)) < 0)
        goto out;
    w.j = &j;
    w.shards = xcalloc((size_t)o->num_shards, sizeof(*w.shards));
    for (long long i = 0; i < o->num_shards; i++)
        w.shards[i].fd = -1;
    sha256_init(&w.all);
    j.w = &w;
    if (j.spec) {
        if ((r = shard_open(&w, 0, err)) < 0 || (r = scan_pass(&j, err)) < 0 ||
            (r = input_check(&j, err)) < 0)
            goto out;
        if (one_pass_held(&j, &w)) {
            if ((r = shards_end(&j, &w, err)) < 0)
                goto out;
            report(&j, 2, j.total_text, j.rows, true);
        } else {
            one_pass_undo(&j, &w);
            j.spec = false;
        }
    }
    if (!j.spec && (r = write_pass(&j, &w, err)) < 0)
        goto out;
    if (j.norm_is_raw)
        memcpy(all_sha, j.files.v[0].sha256, sizeof(all_sha));
    else
        sha256_final(&w.all, all_sha);
    manifest = build_manifest(&j, all_sha);
    if ((r = write_manifest(&j, &w, manifest, err)) < 0 || (r = stage_sync(&j, &w, err)) < 0 ||
        (r = publish(&j, err)) < 0)
        goto out;
done:
    memset(ret, 0, sizeof(*ret));
    ret->job_dir = j.job_dir;
    j.job_dir = NULL;
    ret->unchanged = match;
    ret->num_shards = o->num_shards;
    ret->rows = j.rows;
    ret->bytes = j.bytes;
    ret->warnings = j.warnings;
    strv_init(&j.warnings);
    ret->passes = match ? 0 : j.spec ? 1 : 2;
    ret->spooled = !match && files_spooled(&j);
    ret->nprocess = j.recipe.nprocess;
    ret->split = j.recipe.split;
    ret->global_ops = j.recipe.global_ops;
    strv_init(&j.recipe.global_ops);
    r = 0;
out:
    if (w.shards) {
        for (long long i = 0; i < o->num_shards; i++) {
            if (w.shards[i].fd >= 0)
                close(w.shards[i].fd);
            sha256_abort(&w.shards[i].sha);
        }
        free(w.shards);
    }
    sha256_abort(&w.all);
    cJSON_Delete(manifest);
    /* after the shards are closed: nothing of ours is open inside any more */
    staging_remove(&j);
    free(parent);
    job_free(&j);
    return r;
}

int
prepare_owner(const char *job_dir, uid_t *ret_uid, char **ret_where, struct esd_err *err)
{
    char *p = xstrdup(job_dir), *up;
    struct stat st;

    /* lstat: a link there is the work of whoever owns it, and prepare
     * refuses to follow it anyway; a file is its owner's too. */
    while (lstat(p, &st) < 0) {
        if ((errno != ENOENT && errno != ENOTDIR) || !strcmp(p, "/") || !strcmp(p, ".")) {
            int r = err_sys(err, -errno,
                            "cannot examine %s, where job directory %s would be "
                            "created",
                            p, job_dir);

            free(p);
            return r;
        }
        up = fs_dirname(p);
        free(p);
        p = up;
    }
    *ret_uid = st.st_uid;
    if (ret_where)
        *ret_where = p;
    else
        free(p);
    return 0;
}

int
prepare_become(uid_t uid, struct esd_err *err)
{
    struct spawn_cred c;
    int r;

    if ((r = spawn_cred_for_uid(uid, &c, err)) < 0)
        return r;
    /* groups first: setresuid gives up the right to change them */
    if (setgroups(c.ngroups, c.groups) < 0 || setresgid(c.gid, c.gid, c.gid) < 0 ||
        setresuid(uid, uid, uid) < 0)
        r = err_sys(err, -errno, "cannot take the identity of %s (uid %u)", c.name, (unsigned)uid);
    else if (uid != 0 && setuid(0) == 0)
        r = err_set(err, -EPERM, "taking the identity of %s (uid %u) left root's behind", c.name,
                    (unsigned)uid);
    spawn_cred_free(&c);
    return r;
}
