/*
 * prepare: discovery, the scan pass, the write pass and publication of a job
 * directory.
 *
 * Cost model. The scan pass validates every record and hashes every input
 * file (SHA-256 for the manifest, on the hashing thread). The write pass
 * needs record boundaries, the shard hashes and the whole-stream hash; for
 * input files whose records needed no normalisation edit in the scan pass
 * it trusts the scan's validation, because a fast 64-bit hash of the raw
 * bytes, compared at the end of the file, proves the bytes did not change
 * in between (the reference rehashes with SHA-256 for the same purpose).
 * A compressed input is decompressed once, in the scan, on a thread of its
 * own (zsrc); its text is spooled into the staging directory for the write
 * pass, which reads the spool as it would a plain file (struct spool).
 *
 * What a shard costs, for jobs of 100,000 shards: one create, a write a
 * MiB and one close, no sync (the staging directory is made durable at
 * once before publication, stage_sync), no wait for its digest (one framed
 * stream to the hashing thread), no string kept and no JSON tree (the
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
#include "hashq.h"
#include "json.h"
#include "manifest.h"
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
    uint64_t fast;       /* fasthash of the text (the raw bytes of a plain file), scan pass */
    uint64_t text_size;  /* bytes of the text: size, or a compressed file's decompressed size */
    enum zsrc_kind kind; /* as its name says */
    bool edited;         /* some record needed a normalisation edit */
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
    uint64_t total_text; /* what the write pass reads: the spools of compressed files */
    uint64_t rows;
    uint64_t bytes;
    double t0;
    uint64_t progress_next;
    struct hashq *hq;       /* input digests; the normalised stream in the write pass */
    struct hashq *hq2;      /* shard digests */
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

/* Receives every raw byte of one input file, in order: the scan pass
 * hashes them on the hashing thread, the write pass only fast-hashes them. */
struct raw_sink {
    struct hashq *hq;
    struct sha256 *sha; /* NULL in the write pass */
    struct fasthash fh;
};

static void
raw_sink_apply(void *ctx, const char *p, size_t n)
{
    struct raw_sink *k = ctx;

    if (k->sha)
        sha256_update(k->sha, p, n);
    fh_update(&k->fh, p, n);
}

static void
raw_sink_data(void *ctx, const char *p, size_t n)
{
    struct raw_sink *k = ctx;

    if (k->sha)
        hashq_run(k->hq, raw_sink_apply, k, p, n);
    else
        raw_sink_apply(k, p, n);
}

/*
 * The spool: a compressed input's text, written in the scan pass beside
 * its decompression, so that the write pass reads it as a plain file
 * instead of decompressing again. It is a file of the staging directory
 * (made before the scan when an input is compressed), written on the
 * second hashing thread (idle in the scan), checked in the write pass as
 * a plain file's bytes are (rows, size, fast hash) and removed once read,
 * or with the staging directory on any failure. It needs the text's size
 * of room in the job directory's file system.
 */
struct spool {
    struct job *j;
    int fd;
    struct fasthash fh;
    int werr; /* its first write error, a negative errno */
};

static void
spool_name(char *buf, size_t size, size_t i)
{
    snprintf(buf, size, "spool-%05zu.jsonl", i);
}

static void
spool_apply(void *ctx, const char *p, size_t n)
{
    struct spool *s = ctx;

    fh_update(&s->fh, p, n);
    if (s->werr == 0)
        s->werr = fs_write_all(s->fd, p, n);
}

static void
spool_data(void *ctx, const char *p, size_t n)
{
    struct spool *s = ctx;

    hashq_run(s->j->hq2, spool_apply, s, p, n);
}

/* Creates input i's spool; it then receives the text the reader sees. */
static int
spool_open(struct job *j, size_t i, struct spool *s, struct jsonl_reader *rd, struct esd_err *err)
{
    char name[40];

    spool_name(name, sizeof(name), i);
    fh_init(&s->fh);
    s->j = j;
    s->werr = 0;
    s->fd = openat(j->staging_fd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (s->fd < 0)
        return err_sys(err, -errno, "cannot create %s/%s (the text of %s)", j->staging, name,
                       j->files.v[i].path);
    rd->on_text = spool_data;
    rd->on_text_ctx = s;
    return 0;
}

/* After the scan of input i, whatever r it ended with: the spool written
 * and closed, its size and fast hash those of the text. */
static int
spool_end(struct job *j, size_t i, struct spool *s, int r, struct esd_err *err)
{
    struct infile *f = &j->files.v[i];
    char name[40];

    if (s->fd < 0)
        return r;
    hashq_sync(j->hq2);
    spool_name(name, sizeof(name), i);
    if (r == 0 && s->werr < 0)
        r = err_sys(err, s->werr, "cannot write %s/%s (the text of %s)", j->staging, name, f->path);
    if (close(s->fd) < 0 && errno != EINTR && r == 0)
        r = err_sys(err, -errno, "cannot write %s/%s (the text of %s)", j->staging, name, f->path);
    s->fd = -1;
    if (r == 0) {
        f->fast = fh_final(&s->fh);
        f->text_size = s->fh.total;
    }
    return r;
}

/* The write pass's reader of input i: the file, or the spool of its text. */
static int
input_open(struct job *j, size_t i, struct jsonl_reader *rd, struct esd_err *err)
{
    const struct infile *f = &j->files.v[i];
    char name[40], *shown;
    int fd;

    if (f->kind == ZSRC_PLAIN)
        return jsonl_reader_open(rd, f->path, j->lim.max_line, err);
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

    if (f->kind == ZSRC_PLAIN)
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

/* Pass 1 (spec §6.3): validate and measure every record. */
static int
scan_pass(struct job *j, struct esd_err *err)
{
    struct jsonl_record rec;
    struct buf norm;
    uint64_t done = 0;
    int r = 0;

    jsonl_record_init(&rec, true);
    buf_init(&norm);
    for (size_t i = 0; i < j->files.n && r == 0; i++) {
        struct infile *f = &j->files.v[i];
        struct jsonl_reader rd;
        struct raw_sink sink = { j->hq, &f->sha, { { 0 }, 0, { 0 }, 0 } };
        struct spool sp = { .fd = -1 };
        const char *line;
        size_t len;
        bool nl;

        if ((r = jsonl_reader_open_as(&rd, f->path, f->kind, j->lim.max_line, err)) < 0)
            break;
        if (f->kind != ZSRC_PLAIN && (r = spool_open(j, i, &sp, &rd, err)) < 0) {
            jsonl_reader_close(&rd);
            break;
        }
        fh_init(&sink.fh);
        sha256_init(&f->sha);
        rd.on_data = raw_sink_data;
        rd.on_data_ctx = &sink;
        while ((r = jsonl_reader_next(&rd, &line, &len, &nl, err)) == 1) {
            bool edited = false;

            if (jsonl_check(&rec, line, len, &j->lim) < 0) {
                r = jsonl_error(&rec, &j->lim, f->path, rd.lineno, err);
                break;
            }
            r = record_normalize(&j->rctx, line, len, &rec, j->rows, &norm, &edited, f->path,
                                 rd.lineno, err);
            if (r < 0)
                break;
            f->edited |= edited;
            f->norm_bytes += (edited ? norm.len : len) + 1;
            f->rows++;
            j->rows++;
            report(j, 1, done + rd.offset, j->rows, false);
            if ((r = cancelled(j, err)) < 0)
                break;
        }
        done += rd.offset;
        jsonl_reader_close(&rd);
        hashq_sync(j->hq); /* the sink lives on this stack frame */
        f->fast = fh_final(&sink.fh);
        f->text_size = f->size;
        r = spool_end(j, i, &sp, r, err); /* a compressed file's: its text's */
        if (r < 0)
            break;
        if (sink.fh.total != f->size) {
            r = err_set(err, -ESTALE, "input file changed while it was read: %s", f->path);
            break;
        }
        j->bytes += f->norm_bytes;
        j->total_text += f->text_size;
    }
    hashq_sync(j->hq);
    for (size_t i = 0; i < j->files.n; i++)
        if (j->files.v[i].sha.ctx) {
            if (r == 0)
                sha256_final(&j->files.v[i].sha, j->files.v[i].sha256);
            else
                sha256_abort(&j->files.v[i].sha);
        }
    report(j, 1, done, j->rows, r == 0);
    jsonl_record_free(&rec);
    buf_free(&norm);
    return r;
}

/* ---- pass 2: shards ---- */

enum { WBUF = 1 << 20 };

/* No string a shard: at 100,000 shards every allocation kept shows in the
 * RSS. Its id and path are formatted when needed (shard_fmt). */
struct shard_out {
    int fd;
    struct sha256 sha;
    uint64_t rows, bytes;
    char sha256[SHA256_HEX_LEN + 1];
};

/*
 * The shard digests, on the second hashing thread. Each shard is a digest
 * context of its own, and hashq gives every change of context a slot and a
 * hand-off to the thread; with a wait for the digest at every shard's end
 * that is two thread switches a shard, which dominate at 100,000 small
 * shards. So the writer sends one framed stream to one consumer instead:
 * a header (shard index, data length) before the bytes of every flush and
 * an end header after a shard's last flush. Small shards then share slots,
 * and nothing waits for a shard's digest until the write pass is over.
 * Only the consumer touches the shards' sha and sha256 until hashq_sync.
 */
enum { SHARD_END = -1 };

struct frame {
    long long shard;
    long long len; /* data bytes that follow, or SHARD_END */
};

struct shard_hasher {
    struct shard_out *shards;
    struct shard_out *cur; /* of the frame being read */
    uint64_t left;         /* its data bytes still to come */
    unsigned char hdr[sizeof(struct frame)];
    size_t nhdr;
};

static void
shard_hasher_apply(void *ctx, const char *p, size_t n)
{
    struct shard_hasher *h = ctx;

    while (n > 0) {
        struct frame f;
        size_t k;

        if (h->left > 0) {
            k = h->left < n ? (size_t)h->left : n;
            sha256_update(&h->cur->sha, p, k);
            h->left -= k;
            p += k;
            n -= k;
            continue;
        }
        /* a header may be split between two slots */
        k = sizeof(h->hdr) - h->nhdr < n ? sizeof(h->hdr) - h->nhdr : n;
        memcpy(h->hdr + h->nhdr, p, k);
        h->nhdr += k;
        p += k;
        n -= k;
        if (h->nhdr < sizeof(h->hdr))
            return;
        h->nhdr = 0;
        memcpy(&f, h->hdr, sizeof(f));
        h->cur = &h->shards[f.shard];
        if (!h->cur->sha.ctx)
            sha256_init(&h->cur->sha);
        if (f.len == SHARD_END)
            sha256_final(&h->cur->sha, h->cur->sha256);
        else
            h->left = (uint64_t)f.len;
    }
}

struct writer {
    struct job *j;
    struct shard_out *shards; /* num_shards entries */
    long long cur;
    char *buf;
    size_t len;
    struct sha256 all;      /* normalised stream, on the hashing thread */
    struct shard_hasher sh; /* fed through j->hq2 */
};

/* Queues a frame of the current shard's digest stream: its header, then
 * n bytes of data (none for SHARD_END). */
static void
shard_hash(struct writer *w, const char *p, long long n)
{
    struct frame f = { w->cur, n };

    hashq_run(w->j->hq2, shard_hasher_apply, &w->sh, &f, sizeof(f));
    if (n > 0)
        hashq_run(w->j->hq2, shard_hasher_apply, &w->sh, p, (size_t)n);
}

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
    w->cur = i;
    return 0;
}

/* For a message about shard i. */
static int
shard_err(struct writer *w, int r, struct esd_err *err)
{
    struct shard_name sn;

    shard_fmt(&sn, w->cur, w->j->o->num_shards);
    return err_sys(err, r, "cannot write shard %s/%s", w->j->staging, sn.rel);
}

static int
writer_flush(struct writer *w, const char *p, size_t n, struct esd_err *err)
{
    struct shard_out *s = &w->shards[w->cur];
    int r;

    if (n == 0)
        return 0;
    if ((r = fs_write_all(s->fd, p, n)) < 0)
        return shard_err(w, r, err);
    shard_hash(w, p, (long long)n);
    hashq_update(w->j->hq, &w->all, p, n);
    return 0;
}

/*
 * Closes the current shard without syncing it: the whole staging directory
 * is made durable at once before publication (stage_sync). Its digest is
 * finished on the hashing thread, ready after hashq_sync of hq2.
 */
static int
shard_close(struct writer *w, struct esd_err *err)
{
    struct shard_out *s = &w->shards[w->cur];
    int r = writer_flush(w, w->buf, w->len, err);

    w->len = 0;
    /* A big shard's pages start for the disk now, beside the rest of the
     * pass, so that the sync before publication finds little left to write;
     * small ones are left to that sync, which writes them together. Best
     * effort: a write error is reported by that sync. */
    if (r == 0 && s->bytes >= WBUF)
        (void)sync_file_range(s->fd, 0, 0, SYNC_FILE_RANGE_WRITE);
    /* NFS reports a write error of the flush at close at the latest */
    if (close(s->fd) < 0 && errno != EINTR && r == 0)
        r = shard_err(w, -errno, err);
    s->fd = -1;
    if (r == 0)
        shard_hash(w, NULL, SHARD_END);
    return r;
}

/* Appends one record and its "\n" to the current shard. */
static int
shard_put(struct writer *w, const char *p, size_t n, struct esd_err *err)
{
    struct shard_out *s = &w->shards[w->cur];
    int r;

    if (w->len + n + 1 > WBUF) {
        if ((r = writer_flush(w, w->buf, w->len, err)) < 0)
            return r;
        w->len = 0;
        if (n + 1 > WBUF) {
            if ((r = writer_flush(w, p, n, err)) < 0 || (r = writer_flush(w, "\n", 1, err)) < 0)
                return r;
            goto counted;
        }
    }
    memcpy(w->buf + w->len, p, n);
    w->buf[w->len + n] = '\n';
    w->len += n + 1;
counted:
    s->rows++;
    s->bytes += n + 1;
    return 0;
}

static int
write_pass(struct job *j, struct writer *w, struct esd_err *err)
{
    const long long N = j->o->num_shards;
    struct jsonl_record rec;
    struct buf norm;
    uint64_t written = 0, remaining = j->rows, index = 0, done = 0;
    int r;

    jsonl_record_init(&rec, true);
    buf_init(&norm);
    j->progress_next = 0;
    r = shard_open(w, 0, err);
    for (size_t i = 0; i < j->files.n && r == 0; i++) {
        struct infile *f = &j->files.v[i];
        struct raw_sink sink = { j->hq, NULL, { { 0 }, 0, { 0 }, 0 } };
        struct jsonl_reader rd;
        uint64_t rows = 0;
        const char *line;
        size_t len;
        bool nl;

        if ((r = input_open(j, i, &rd, err)) < 0)
            break;
        fh_init(&sink.fh);
        rd.on_data = raw_sink_data;
        rd.on_data_ctx = &sink;
        while ((r = jsonl_reader_next(&rd, &line, &len, &nl, err)) == 1) {
            const char *out = line;
            size_t out_len = len;

            /* A file none of whose records needed an edit in pass 1 is
             * copied as read: its bytes are checked against pass 1's at
             * the file's end (rows, size, fast hash), and a mismatch
             * fails the prepare, whose staging directory then goes, so
             * an unchecked record never reaches a published shard. */
            if (f->edited) {
                bool edited = false;

                if (jsonl_check(&rec, line, len, &j->lim) < 0) {
                    r = jsonl_error(&rec, &j->lim, f->path, rd.lineno, err);
                    break;
                }
                r = record_normalize(&j->rctx, line, len, &rec, index, &norm, &edited, f->path,
                                     rd.lineno, err);
                if (r < 0)
                    break;
                if (edited)
                    out = norm.p, out_len = norm.len;
            }
            /* more records than pass 1 counted: the input changed; stop
             * before writing one (remaining, unsigned, would also wrap and
             * upset the balancing below) */
            if (remaining == 0) {
                r = err_set(err, -ESTALE,
                            "Input changed between the scan and write passes: %s has more records",
                            f->path);
                break;
            }
            if ((r = shard_put(w, out, out_len, err)) < 0)
                break;
            written += out_len + 1;
            remaining--;
            index++;
            rows++;
            /* The balancing rule of spec §6.5, in exact integer arithmetic. */
            if (w->cur < N - 1 &&
                ((unsigned __int128)written * (unsigned __int128)N >=
                     (unsigned __int128)j->bytes * (unsigned __int128)(w->cur + 1) ||
                 remaining == (uint64_t)(N - w->cur - 1))) {
                if ((r = shard_close(w, err)) < 0 || (r = shard_open(w, w->cur + 1, err)) < 0)
                    break;
            }
            report(j, 2, done + rd.offset, index, false);
            if ((r = cancelled(j, err)) < 0)
                break;
        }
        done += rd.offset;
        jsonl_reader_close(&rd);
        if (r < 0)
            break;
        if (rows != f->rows || sink.fh.total != f->text_size || fh_final(&sink.fh) != f->fast)
            r = err_set(err, -ESTALE, "Input content changed between the scan and write passes: %s",
                        f->path);
        else
            r = input_done(j, i, err);
    }
    if (r == 0)
        r = shard_close(w, err);
    hashq_sync(j->hq);
    hashq_sync(j->hq2); /* every shard's digest is final */
    if (r == 0 && (w->cur != N - 1 || w->shards[N - 1].rows == 0))
        r = err_set(err, -EIO, "Internal partitioning error: %lld of %lld shards written",
                    w->cur + 1, N);
    if (r == 0 && (written != j->bytes || remaining != 0))
        r = err_set(err, -ESTALE, "Input changed between the scan and write passes");
    report(j, 2, done, index, r == 0);
    jsonl_record_free(&rec);
    buf_free(&norm);
    return r;
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
        if (b->len >= WBUF || i == n - 1) {
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
    hashq_free(j->hq);
    hashq_free(j->hq2);
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
    j.hq = hashq_new();
    j.hq2 = hashq_new();
    /* a compressed input's text is spooled there in the scan */
    for (size_t i = 0; i < j.files.n; i++)
        if (j.files.v[i].kind != ZSRC_PLAIN) {
            if ((r = staging_begin(&j, parent, err)) < 0)
                goto out;
            break;
        }
    if ((r = scan_pass(&j, err)) < 0)
        goto out;
    if (j.rows == 0) {
        r = err_set(err, -EINVAL, "Input dataset contains no records");
        goto out;
    }
    if ((uint64_t)o->num_shards > j.rows) {
        r = err_set(err, -EINVAL, "--num-shards (%lld) exceeds input records (%llu)", o->num_shards,
                    (unsigned long long)j.rows);
        goto out;
    }
    if (j.staging_fd < 0 && (r = staging_begin(&j, parent, err)) < 0)
        goto out;
    if ((r = write_recipe_copy(&j, err)) < 0 || (r = make_dirs(&j, err)) < 0)
        goto out;
    w.j = &j;
    w.shards = xcalloc((size_t)o->num_shards, sizeof(*w.shards));
    for (long long i = 0; i < o->num_shards; i++)
        w.shards[i].fd = -1;
    w.buf = xmalloc(WBUF);
    w.sh.shards = w.shards;
    sha256_init(&w.all);
    if ((r = write_pass(&j, &w, err)) < 0)
        goto out;
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
    ret->nprocess = j.recipe.nprocess;
    ret->split = j.recipe.split;
    ret->global_ops = j.recipe.global_ops;
    strv_init(&j.recipe.global_ops);
    r = 0;
out:
    /* No digest may still be in flight when the contexts are released. */
    if (j.hq)
        hashq_sync(j.hq);
    if (j.hq2)
        hashq_sync(j.hq2);
    if (w.shards) {
        for (long long i = 0; i < o->num_shards; i++) {
            if (w.shards[i].fd >= 0)
                close(w.shards[i].fd);
            sha256_abort(&w.shards[i].sha);
        }
        free(w.shards);
    }
    sha256_abort(&w.all);
    free(w.buf);
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
