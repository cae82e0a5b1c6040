/*
 * tries: attempts/<shard_id>/ read and written below claims: counting,
 * the terminal rule, the first attempt.json, the stale mark.
 */
#include "tries.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "json.h"
#include "pypath.h"

#define TRIES_JSON_MAX ((size_t)16 << 20)

/*
 * Bounds of one count, which runs with the shard's lock held in esd's event
 * loop: entries of attempts/<shard>/ looked at (of any name: a count stops
 * there, with what it saw), well-formed attempts read (a legitimate shard
 * has a few dozen at most), and attempt.json bytes read over all attempts
 * (a count stops once past it, so at most this plus one file).
 */
#define TRIES_SCAN_MAX 8192
#define TRIES_DIR_MAX 1024
#define TRIES_COUNT_BYTES ((size_t)32 << 20)

/* Attempt numbers: 4 digits as "%04d" writes them, up to 9 (never overflows). */
#define TRIES_DIGITS_MIN 4
#define TRIES_DIGITS_MAX 9
#define TRIES_TOKEN_LEN 32

/* ---- reading job files ---- */

/* Reads the job file path (relative to dirfd, or absolute) whole, as
 * fs_read_job_at does: no final link followed, no FIFO or device waited
 * on, a regular file of at most max bytes. */
static int
job_file_read(int dirfd, const char *path, size_t max, char **ret, size_t *ret_len)
{
    return fs_read_job_at(dirfd, path, path, max, ret, ret_len, NULL);
}

/*
 * The JSON object in the job file dirfd/path (job_file_read's rules), or
 * NULL if it is missing, not a regular file, too large or not a valid
 * object: the reference ignores such attempt files. *ret_len (if not NULL)
 * gets the bytes read. Caller frees.
 */
static cJSON *
job_json_load(int dirfd, const char *path, size_t max, size_t *ret_len)
{
    cJSON *j = NULL;
    size_t len = 0;
    char *text;

    if (job_file_read(dirfd, path, max, &text, &len) == 0) {
        if (json_parse_object(text, len, path, &j, NULL) < 0)
            j = NULL;
        free(text);
    }
    if (ret_len)
        *ret_len = len;
    return j;
}

/* ---- counting ---- */

long long
tries_name_number(const char *name)
{
    long long v = 0;
    size_t k = 0;

    for (; name[k] >= '0' && name[k] <= '9'; k++) {
        if (k == TRIES_DIGITS_MAX)
            return -1;
        v = v * 10 + (name[k] - '0');
    }
    if (k < TRIES_DIGITS_MIN || name[k++] != '-')
        return -1;
    for (size_t t = 0; t < TRIES_TOKEN_LEN; t++, k++)
        if (!((name[k] >= '0' && name[k] <= '9') || (name[k] >= 'a' && name[k] <= 'f')))
            return -1;
    return name[k] ? -1 : v;
}

/* The node of the first counted failure seen, to tell a second one. */
struct node_seen {
    char first[128];
    bool any;
};

/* Attributes a counted failure of the attempt j to its node. */
static void
count_node(const cJSON *j, const char *node, struct tries_counts *n, struct node_seen *seen)
{
    const char *who = json_get_str(j, "node");

    if (!who)
        who = json_get_str(j, "hostname");
    if (who && node && !strcmp(who, node))
        n->here++;
    if (!who) {
        n->nodes = 2; /* a node of its own */
    } else if (!seen->any) {
        snprintf(seen->first, sizeof(seen->first), "%s", who);
        seen->any = true;
        if (!n->nodes)
            n->nodes = 1;
    } else if (strncmp(seen->first, who, sizeof(seen->first) - 1)) {
        n->nodes = 2;
    }
}

/* Adds the failure an attempt.json records to n. */
static void
count_record(const cJSON *j, const char *node, struct tries_counts *n, struct node_seen *seen)
{
    const char *status = json_get_str(j, "status");
    const char *fc = json_get_str(j, "failure_class");
    bool counted = false;

    if (fc) {
        if (!strcmp(fc, "processor") || !strcmp(fc, "output"))
            counted = true;
        else if (!strcmp(fc, "infrastructure") && (!status || strcmp(status, "released")))
            n->infra++;
    } else if (status && !strcmp(status, "failed")) {
        counted = true;
    } else if (status && !strcmp(status, "stale")) {
        n->infra++;
    }
    if (counted) {
        n->counted++;
        count_node(j, node, n, seen);
    }
}

int
tries_count(const struct manifest *m, const char *shard_id, struct tries_counts *ret,
            struct esd_err *err)
{
    return tries_count_by(m, shard_id, NULL, ret, err);
}

int
tries_count_by(const struct manifest *m, const char *shard_id, const char *node,
               struct tries_counts *ret, struct esd_err *err)
{
    struct tries_counts n = { 0 };
    struct node_seen seen = { .any = false };
    char *dir = xasprintf("%s/attempts/%s", m->job_dir, shard_id);
    long long highest = 0, found = 0;
    size_t entries = 0, bytes = 0;
    struct dirent *e;
    DIR *d = NULL;
    int fd, r = 0;

    /* Not through a link: the attempts counted are this shard's. */
    fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 || !(d = fdopendir(fd))) {
        r = errno == ENOENT ? 0 : err_sys(err, -errno, "cannot read %s", dir);
        if (fd >= 0)
            close(fd);
        goto out;
    }
    while ((errno = 0, e = readdir(d))) {
        long long num;
        size_t len;
        cJSON *j;
        int afd;

        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        /* junk beyond the scan bound is not looked at: what it hides only
         * spoils the counts of its owner's own shard */
        if (++entries > TRIES_SCAN_MAX) {
            n.truncated = true;
            break;
        }
        num = tries_name_number(e->d_name);
        if (num < 0 || (e->d_type != DT_DIR && e->d_type != DT_UNKNOWN))
            continue;
        if (found >= TRIES_DIR_MAX) {
            r = err_set(err, -E2BIG,
                        "too many attempts in %s (more than %d): remove what is not an "
                        "attempt of the shard",
                        dir, TRIES_DIR_MAX);
            break;
        }
        /* A directory, not a link to one, even if swapped since readdir. */
        afd = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (afd < 0) {
            if (errno == ENOENT || errno == ENOTDIR || errno == ELOOP || errno == EACCES)
                continue;
            r = err_sys(err, -errno, "cannot open %s/%s", dir, e->d_name);
            break;
        }
        found++;
        if (num > highest)
            highest = num;
        if (bytes > TRIES_COUNT_BYTES) {
            close(afd);
            r = err_set(err, -E2BIG,
                        "the attempt.json files in %s hold more than %zu bytes: remove what "
                        "is not an attempt directory",
                        dir, TRIES_COUNT_BYTES);
            break;
        }
        j = job_json_load(afd, "attempt.json", TRIES_JSON_MAX, &len);
        bytes += len;
        close(afd);
        if (j)
            count_record(j, node, &n, &seen);
        cJSON_Delete(j);
    }
    if (r == 0 && errno)
        r = err_sys(err, -errno, "cannot read %s", dir);
    /* The reference numbers by count; a gap (attempts removed) would
     * repeat a number, so the highest number seen wins then. */
    n.attempts = highest > found ? highest : found;
out:
    if (d)
        closedir(d);
    free(dir);
    if (r == 0)
        *ret = n;
    return r;
}

/* ---- the terminal rule ---- */

/*
 * Whether a node other than the rule's was alive lately (server time now): its
 * state/clock/<node> or a lock it holds was modified in the last
 * TRIES_PEER_ALIVE_SECS. Only names and mtimes, and the content of the
 * fresh locks only (the lock names no node otherwise); nothing is followed.
 */
static bool
peer_alive(const struct tries_rule *rule, double now)
{
    char *dir = fs_join(rule->job_dir, "state/clock");
    bool alive = false;
    struct dirent *e;
    struct stat st;
    DIR *d;
    int fd;

    fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    free(dir);
    if (fd >= 0 && (d = fdopendir(fd))) {
        while (!alive && (e = readdir(d)))
            if (e->d_name[0] != '.' && strcmp(e->d_name, rule->node) &&
                fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
                S_ISREG(st.st_mode) && now - (double)st.st_mtim.tv_sec <= TRIES_PEER_ALIVE_SECS)
                alive = true;
        closedir(d);
    } else if (fd >= 0) {
        close(fd);
    }
    if (alive)
        return true;
    /* a node busy with long attempts makes no claim passes, but renews
     * its locks every lease/4 */
    dir = fs_join(rule->job_dir, "state/locks");
    fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    free(dir);
    if (fd < 0 || !(d = fdopendir(fd))) {
        if (fd >= 0)
            close(fd);
        return false;
    }
    while (!alive && (e = readdir(d))) {
        cJSON *j;
        const char *who;

        if (e->d_name[0] == '.' || fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 ||
            !S_ISREG(st.st_mode) || now - (double)st.st_mtim.tv_sec > TRIES_PEER_ALIVE_SECS)
            continue;
        if (!(j = job_json_load(dirfd(d), e->d_name, 64 << 10, NULL)))
            continue;
        who = json_get_str(j, "node");
        if (!who)
            who = json_get_str(j, "hostname");
        alive = who && strcmp(who, rule->node) && strcmp(who, rule->hostname);
        cJSON_Delete(j);
    }
    closedir(d);
    return alive;
}

/*
 * The file server's now, as claimer_now reads it, through a descriptor of
 * its own: the rule is applied in attempt_finish too, which may run in a
 * helper process that does not inherit the claimer's.
 */
static int
server_now(const struct tries_rule *rule, double *ret)
{
    char *rel = xasprintf("state/clock/%s", rule->node), *path = fs_join(rule->job_dir, rel);
    struct esd_err err;
    struct stat st;
    int fd = fs_open_job(path, O_WRONLY, 0, 0, NULL, &err), r = 0;

    if (fd < 0 || fs_touch_fd(fd) < 0 || fstat(fd, &st) < 0)
        r = fd < 0 ? fd : -errno;
    else
        *ret = (double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec / 1e9;
    if (fd >= 0)
        close(fd);
    free(rel);
    free(path);
    return r;
}

enum tries_limit
tries_limit(const struct tries_rule *rule, const struct tries_counts *n)
{
    double now;

    if (n->infra > rule->max_infra)
        return TL_TERMINAL;
    if (n->counted <= rule->max_retries)
        return TL_OPEN;
    if (n->nodes >= 2)
        return TL_TERMINAL;
    if (n->here == 0)
        return TL_OPEN; /* used up by one other node: this one tries it */
    if (server_now(rule, &now) < 0)
        return TL_TERMINAL; /* (no clock: as if no other node) */
    return peer_alive(rule, now) ? TL_LEFT : TL_TERMINAL;
}

/* ---- attempt.json ---- */

int
tries_record_start(const char *attempt_dir, const cJSON *claim, const char *input_path,
                   struct esd_err *err)
{
    char *path = fs_join(attempt_dir, "attempt.json");
    cJSON *j = cJSON_Duplicate(claim, true);
    struct buf b;
    int fd, r = 0;

    json_add_str(j, "status", "running");
    json_add_str(j, "input_path", input_path);
    buf_init(&b);
    json_dump(j, JSON_PRETTY, &b);
    /* A new directory named by our token: nobody else writes here, so a
     * plain exclusive create is enough (readers ignore a partial file). */
    fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 || (r = fs_write_all(fd, b.p, b.len)) < 0 || (fsync(fd) < 0 && (r = -errno)))
        r = err_sys(err, fd < 0 ? -errno : r, "cannot write %s", path);
    if (fd >= 0)
        close(fd);
    buf_free(&b);
    cJSON_Delete(j);
    free(path);
    return r;
}

cJSON *
tries_json_load(const char *path)
{
    return job_json_load(AT_FDCWD, path, TRIES_JSON_MAX, NULL);
}

int
tries_mark_stale(const struct manifest *m, const char *attempt_rel, struct esd_err *err)
{
    char *dir = NULL, *path, now[40];
    cJSON *j;
    const char *status;
    int r;

    if ((r = pypath_join_inside(m->job_dir, attempt_rel, &dir, err)) < 0)
        return r;
    path = fs_join(dir, "attempt.json");
    free(dir);
    if (!(j = tries_json_load(path))) {
        free(path);
        return 0; /* nothing to mark, as the reference */
    }
    status = json_get_str(j, "status");
    if (status && !strcmp(status, "running")) {
        time_iso_now(now, NULL);
        json_set(j, "status", cJSON_CreateString("stale"));
        json_set(j, "stale_at", cJSON_CreateString(now));
        json_set(j, "failure_class", cJSON_CreateString("infrastructure"));
        r = json_write_atomic(path, j, JSON_PRETTY, err);
    }
    cJSON_Delete(j);
    free(path);
    return r;
}
