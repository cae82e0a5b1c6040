/*
 * fscheck: the shared file system's verdict (fscheck.h). Everything is done
 * through descriptors of the run directory and its two subdirectories
 * (never re-resolved paths, never following a link): "sig" holds the
 * barrier and signal files, which are only ever found by listing it, and
 * "lag" the one file whose visibility is timed, which is only ever looked
 * up by name, so that the listings never refresh the lookups being timed.
 * Races and lags are judged by every participant from all participants'
 * result files, so they all print the same verdict; the lowest-ranked one
 * records it and removes the run directory once the others are gone.
 */
#include "fscheck.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fsutil.h"
#include "json.h"

#define RUN_BASE ".esd-fscheck"
#define MAX_PARTICIPANTS 64
#define RESULT_MAX 65536
/* How often a participant looks again (seconds): often while a lag is
 * timed, less while barriers are passed, least while others are awaited
 * (every look is a server round trip on NFS). */
#define POLL_LAG 0.002
#define POLL_BARRIER 0.005
#define POLL_RENDEZVOUS 0.05
/* A barrier a peer does not reach within this many seconds ends the run. */
#define PHASE_WAIT 30.0
/* Size of a file renamed onto the shared name: bigger than one page, so
 * that a non-atomic replacement could show a torn file. */
#define REN_SIZE 8192
#define REN_HEAD 64

struct fsc {
    const struct fscheck_opts *o;
    struct esd_err *err;
    int base_fd, run_fd, sig_fd, lag_fd;
    char run[200];
    char me[96];
    char host[64];
    struct strv ids; /* participants, sorted */
    size_t rank;
    int rounds;
    double lag_max;
    int phase;
    bool owner;  /* removes the run directory at the end */
    cJSON *mine; /* this participant's results */
};

static const char *
str_or(const char *s, const char *dflt)
{
    return s ? s : dflt;
}

/* [A-Za-z0-9._-], 1 to 64 of them, not starting with '.'. */
static bool
name_ok(const char *s)
{
    size_t n = strspn(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-");

    return n > 0 && n <= 64 && !s[n] && s[0] != '.';
}

static void
pause_poll(double secs)
{
    struct timespec ts = { 0, (long)(secs * 1e9) };

    nanosleep(&ts, NULL);
}

/* Creates name in dfd exclusively with data, written and (sync) fsynced.
 * close() is checked too: NFS may report a failed write only there. An
 * EINTR from close is not an error: the descriptor is closed anyway. */
static int
put_file(int dfd, const char *name, const char *data, bool sync)
{
    int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    int r;

    if (fd < 0)
        return -errno;
    r = fs_write_all(fd, data, strlen(data));
    if (r == 0 && sync && fsync(fd) < 0)
        r = -errno;
    if (close(fd) < 0 && r == 0 && errno != EINTR)
        r = -errno;
    return r;
}

/* Reads at most max-1 bytes of name in dfd into buf (NUL-terminated);
 * returns the length or a negative errno. O_NONBLOCK: a FIFO planted in
 * the run directory is never waited on. */
static ssize_t
get_file(int dfd, const char *name, char *buf, size_t max)
{
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    size_t len = 0;
    ssize_t n = 0;

    if (fd < 0)
        return -errno;
    while (len + 1 < max && (n = read(fd, buf + len, max - 1 - len)) > 0)
        len += (size_t)n;
    if (n < 0)
        n = -errno;
    close(fd);
    buf[len] = '\0';
    return n < 0 ? n : (ssize_t)len;
}

/* The names in dfd starting with prefix, from a fresh listing: "." is
 * opened anew each time, as an open revalidates a directory where a
 * stream kept open (or rewound) may go on serving a cached listing. */
static int
list(int dfd, const char *prefix, struct strv *ret)
{
    int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    size_t plen = strlen(prefix);
    struct dirent *e;
    DIR *d;

    if (fd < 0)
        return -errno;
    if (!(d = fdopendir(fd))) {
        close(fd);
        return -errno;
    }
    while ((e = readdir(d)))
        if (!strncmp(e->d_name, prefix, plen) && e->d_name[plen])
            strv_push(ret, e->d_name + plen);
    closedir(d);
    return 0;
}

static bool
listed(int dfd, const char *name)
{
    struct strv v;
    bool found;

    strv_init(&v);
    found = list(dfd, "", &v) == 0 && strv_contains(&v, name);
    strv_free(&v);
    return found;
}

/* Every participant has reached this phase (after this one's own mark). */
static int
barrier(struct fsc *f, const char *what)
{
    char name[400];
    double until = time_mono() + PHASE_WAIT;
    struct strv seen;
    int r;

    /* Each barrier has its own names (b<phase>.<id>), so a mark left for
     * an earlier barrier never passes this one. */
    f->phase++;
    if (f->ids.n < 2)
        return 0;
    snprintf(name, sizeof(name), "b%d.%s", f->phase, f->me);
    if ((r = put_file(f->sig_fd, name, "", false)) < 0)
        return err_sys(f->err, r, "cannot create %s/%s/sig/%s", f->o->dir, f->run, name);
    snprintf(name, sizeof(name), "b%d.", f->phase);
    for (;;) {
        size_t missing = 0;

        strv_init(&seen);
        if ((r = list(f->sig_fd, name, &seen)) < 0) {
            strv_free(&seen);
            return err_sys(f->err, r, "cannot list %s/%s/sig", f->o->dir, f->run);
        }
        for (size_t i = 0; i < f->ids.n; i++)
            if (!strv_contains(&seen, f->ids.v[i]) && !missing++ && time_mono() > until) {
                strv_free(&seen);
                return err_set(f->err, -ETIMEDOUT,
                               "participant %s did not reach the %s phase "
                               "within %.0f s",
                               f->ids.v[i], what, PHASE_WAIT);
            }
        strv_free(&seen);
        if (!missing)
            return 0;
        pause_poll(POLL_BARRIER);
    }
}

/* The first participant's signal that it has done its part of a lag test. */
static int
signal_done(struct fsc *f, const char *sig)
{
    int r = put_file(f->sig_fd, sig, "", true);

    return r < 0 ? err_sys(f->err, r, "cannot create %s/%s/sig/%s", f->o->dir, f->run, sig) : 0;
}

/* An observer: waits for the signal, then times until stat of the lag file
 * agrees with want(). Returns the lag (seconds), -1 on a timeout, -2 when
 * the signal never came. The clock starts when the signal is seen, and
 * the signal is made after the change: what is timed is how long a
 * lookup by name still shows the old state once the change is known to
 * have happened, i.e. the staleness of this node's caches. */
static double
time_lag(struct fsc *f, const char *sig, int want)
{
    double until = time_mono() + PHASE_WAIT, t0, t;
    struct stat st;

    while (!listed(f->sig_fd, sig)) {
        if (time_mono() > until)
            return -2;
        pause_poll(POLL_LAG);
    }
    t0 = time_mono();
    for (;;) {
        int r = fstatat(f->lag_fd, "f", &st, AT_SYMLINK_NOFOLLOW);
        bool ok = want == 0   ? r == 0                    /* created: seen */
                  : want == 1 ? r == 0 && st.st_size == 1 /* grown: seen */
                              : r < 0 && errno == ENOENT; /* removed: gone */

        t = time_mono();
        if (ok)
            return t - t0;
        if (t - t0 > f->lag_max)
            return -1;
        pause_poll(POLL_LAG);
    }
}

static void
add_lag(cJSON *o, const char *key, double v)
{
    if (v >= 0)
        json_add_float(o, key, round(v * 1e6) / 1e6);
    else
        json_add_str(o, key, v == -1 ? "timeout" : "no signal");
}

/* ---- phases ---------------------------------------------------------- */

/* Host and node names made fit for ids and run names, which become file
 * names (and lines of "start"): no '/', no newline, and in an id no '.'
 * but the one before the pid. */
static int
sanitize(char *s)
{
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '-' || *s == '_'))
            *s = '_';
    return 0;
}

static int
open_subdir(int dfd, const char *name, const char *shown, struct esd_err *err)
{
    int fd;

    /* EEXIST: another participant made it first. Then opened without
     * following a link, so a link put in its place is refused. */
    if (mkdirat(dfd, name, 0755) < 0 && errno != EEXIST)
        return err_sys(err, -errno, "cannot create %s", shown);
    fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return err_sys(err, -errno, "cannot open %s", shown);
    return fd;
}

static int
cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/*
 * Agrees on the participants: the list in "start", published once. Its
 * O_EXCL create makes one list win; the list is written after the create,
 * so a reader takes it only once it ends with "end\n" and never acts on
 * a partial one. Sorted, it gives every participant the same ranks: rank
 * 0 owns the run.
 */
static int
rendezvous(struct fsc *f)
{
    double until = time_mono() + (f->o->wait_secs > 0 ? f->o->wait_secs : FSCHECK_WAIT_DEFAULT);
    char name[400], *text = xmalloc(RESULT_MAX);
    int r;

    snprintf(name, sizeof(name), "hello.%s", f->me);
    if ((r = put_file(f->run_fd, name, f->me, true)) < 0) {
        free(text);
        return err_sys(f->err, r, "cannot create %s/%s/%s/%s", f->o->dir, RUN_BASE, f->run, name);
    }
    if (f->o->nodes <= 1) {
        strv_push(&f->ids, f->me);
        f->owner = true;
        free(text);
        return 0;
    }
    for (;;) {
        ssize_t n = get_file(f->run_fd, "start", text, RESULT_MAX);

        if (n > 0 && n >= 4 && !strcmp(text + n - 4, "end\n")) {
            for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n"))
                if (strcmp(line, "end"))
                    strv_push(&f->ids, line);
            break;
        }
        if (n == -ENOENT) {
            struct strv hello;
            struct buf b;

            strv_init(&hello);
            if ((r = list(f->run_fd, "hello.", &hello)) < 0) {
                strv_free(&hello);
                free(text);
                return err_sys(f->err, r, "cannot list %s/%s/%s", f->o->dir, RUN_BASE, f->run);
            }
            if ((long)hello.n >= f->o->nodes || time_mono() > until) {
                strv_sort(&hello);
                buf_init(&b);
                for (size_t i = 0; i < hello.n && i < MAX_PARTICIPANTS; i++)
                    buf_printf(&b, "%s\n", hello.v[i]);
                buf_puts(&b, "end\n");
                r = put_file(f->run_fd, "start", b.p, true);
                buf_free(&b);
                if (r < 0 && r != -EEXIST) {
                    strv_free(&hello);
                    free(text);
                    return err_sys(f->err, r, "cannot create %s/%s/%s/start", f->o->dir, RUN_BASE,
                                   f->run);
                }
            }
            strv_free(&hello);
        } else if (n < 0) {
            free(text);
            return err_sys(f->err, (int)n, "cannot read %s/%s/%s/start", f->o->dir, RUN_BASE,
                           f->run);
        }
        pause_poll(POLL_RENDEZVOUS);
    }
    free(text);
    qsort(f->ids.v, f->ids.n, sizeof(*f->ids.v), cmp_str);
    for (f->rank = 0; f->rank < f->ids.n && strcmp(f->ids.v[f->rank], f->me); f->rank++)
        ;
    f->owner = f->rank == 0;
    if (f->rank == f->ids.n)
        return err_set(f->err, -EAGAIN,
                       "the run %s in %s had started without this process "
                       "(a run that ended badly leaves %s/%s/%s: remove it, or pass another "
                       "--run)",
                       f->run, f->o->dir, f->o->dir, RUN_BASE, f->run);
    return 0;
}

/* O_EXCL races: x.<i>, exactly one creator each. The winner writes its id
 * into the file, so the verdict can tell two "winners" of one name (two
 * nodes each told their create succeeded) from a lost race. An error
 * other than EEXIST is a result (O_EXCL unsupported), not a failed run. */
static int
phase_excl(struct fsc *f)
{
    cJSON *won = cJSON_CreateArray();
    char name[64];
    int r = 0;

    cJSON_AddItemToObject(f->mine, "excl_won", won);
    if ((r = barrier(f, "O_EXCL")) < 0)
        return r;
    for (int i = 0; i < f->rounds; i++) {
        int fd;

        snprintf(name, sizeof(name), "x.%d", i);
        fd = openat(f->run_fd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd < 0 && errno == EEXIST)
            continue;
        if (fd < 0) {
            r = -errno;
            json_add_str(f->mine, "excl_error", strerror(-r));
            return 0;
        }
        r = fs_write_all(fd, f->me, strlen(f->me));
        close(fd);
        if (r < 0)
            return err_sys(f->err, r, "cannot write %s/%s/%s", f->o->dir, f->run, name);
        cJSON_AddItemToArray(won, cJSON_CreateNumber(i));
        /* the same name again, from the same node: must be refused */
        fd = openat(f->run_fd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd >= 0 || errno != EEXIST) {
            json_add_str(f->mine, "excl_error",
                         fd >= 0 ? "a second O_EXCL create of an "
                                   "existing file succeeded"
                                 : strerror(errno));
            if (fd >= 0)
                close(fd);
            return 0;
        }
    }
    return 0;
}

/* Is the file at name in dfd the one open as (or holding the same bytes
 * as) src? The token comparison of a link() that said EEXIST: over NFS a
 * LINK whose reply was lost is sent again and the retry fails with EEXIST
 * on our own link; fs_publish_excl accepts that case the same way, so
 * this tests what esd relies on. */
static bool
ours(int dfd, const char *name, int src_fd, const char *token)
{
    char buf[512];
    struct stat a, b;
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    ssize_t n;
    bool same;

    if (fd < 0)
        return false;
    same = fstat(fd, &a) == 0 && fstat(src_fd, &b) == 0 && a.st_dev == b.st_dev &&
           a.st_ino == b.st_ino;
    if (!same) {
        n = pread(fd, buf, sizeof(buf) - 1, 0);
        same = n >= 0 && (size_t)n == strlen(token) && !memcmp(buf, token, (size_t)n);
    }
    close(fd);
    return same;
}

/* link() races: k.<i>, exactly one winner each. */
static int
phase_link(struct fsc *f)
{
    cJSON *won = cJSON_CreateArray();
    char src[400], name[64];
    int r, retransmits = 0;

    cJSON_AddItemToObject(f->mine, "link_won", won);
    /* the sources exist before the barrier: only link() itself races */
    for (int i = 0; i < f->rounds; i++) {
        snprintf(src, sizeof(src), "l.%s.%d", f->me, i);
        if ((r = put_file(f->run_fd, src, f->me, false)) < 0)
            return err_sys(f->err, r, "cannot create %s/%s/%s", f->o->dir, f->run, src);
    }
    if ((r = barrier(f, "link")) < 0)
        return r;
    for (int i = 0; i < f->rounds; i++) {
        int sfd;

        snprintf(src, sizeof(src), "l.%s.%d", f->me, i);
        snprintf(name, sizeof(name), "k.%d", i);
        r = linkat(f->run_fd, src, f->run_fd, name, 0) < 0 ? -errno : 0;
        sfd = openat(f->run_fd, src, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (r == -EEXIST && sfd >= 0 && ours(f->run_fd, name, sfd, f->me)) {
            r = 0;
            retransmits++;
        }
        if (r == 0) {
            cJSON_AddItemToArray(won, cJSON_CreateNumber(i));
            /* again: must be refused */
            int again = linkat(f->run_fd, src, f->run_fd, name, 0) < 0 ? -errno : 0;

            if (again != -EEXIST) {
                json_add_str(f->mine, "link_error",
                             again ? strerror(-again)
                                   : "a second link() to an existing "
                                     "name succeeded");
                r = -1;
            }
        } else if (r != -EEXIST) {
            json_add_str(f->mine, "link_error", strerror(-r));
        }
        if (sfd >= 0)
            close(sfd);
        unlinkat(f->run_fd, src, 0);
        if (r < 0 && r != -EEXIST)
            break;
    }
    json_add_int(f->mine, "link_eexist_ours", retransmits);
    return 0;
}

/* File j of participant me: a head "<j> <c> " then c, one letter from
 * (me, j), to the last byte, a newline. Files differ in their letter, so
 * one that mixes two files' bytes (a torn replacement) fails ren_valid.
 * The head's NUL is overwritten: the file is text throughout. */
static void
ren_content(const char *me, int j, char *out)
{
    unsigned h = (unsigned)j * 7u;
    char c;

    for (const char *p = me; *p; p++)
        h = h * 31u + (unsigned char)*p;
    c = (char)('a' + h % 26);
    memset(out, c, REN_SIZE);
    snprintf(out, REN_HEAD, "%d %c", j, c);
    out[strlen(out)] = ' ';
    out[REN_SIZE - 1] = '\n';
}

/* A whole file, as ren_content makes them. */
static bool
ren_valid(const char *buf, ssize_t n)
{
    const char *sp;
    char c;

    if (n != REN_SIZE || buf[REN_SIZE - 1] != '\n' || !(sp = memchr(buf, ' ', REN_HEAD - 2)))
        return false;
    c = sp[1];
    for (size_t i = REN_HEAD; i < REN_SIZE - 1; i++)
        if (buf[i] != c)
            return false;
    return true;
}

/* rename() onto one name while reading it: never missing, never torn. */
static int
phase_rename(struct fsc *f)
{
    char *data = xmalloc(REN_SIZE + 1), *got = xmalloc(REN_SIZE * 2), src[400];
    int missing = 0, torn = 0, estale = 0, r = 0;

    /* the name exists before anyone reads: "missing" is then rename's fault */
    data[REN_SIZE] = '\0';
    if (f->rank == 0) {
        ren_content(f->me, -1, data);
        if ((r = put_file(f->run_fd, "ren", data, true)) < 0 && r != -EEXIST) {
            r = err_sys(f->err, r, "cannot create %s/%s/ren", f->o->dir, f->run);
            goto out;
        }
    }
    if ((r = barrier(f, "rename")) < 0)
        goto out;
    for (int j = 0; j < f->rounds * 4; j++) {
        int fd;
        ssize_t n = 0, k;

        snprintf(src, sizeof(src), "r.%s.%d", f->me, j);
        ren_content(f->me, j, data);
        if ((r = put_file(f->run_fd, src, data, false)) < 0 ||
            (r = renameat(f->run_fd, src, f->run_fd, "ren") < 0 ? -errno : 0) < 0) {
            json_add_str(f->mine, "rename_error", strerror(-r));
            unlinkat(f->run_fd, src, 0);
            r = 0;
            break;
        }
        /* ESTALE apart: NFS may drop the handle of a file replaced under
         * an open or a read, which is not a torn or missing name (the
         * verdict says "ok (stale handles seen)"). */
        fd = openat(f->run_fd, "ren", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) {
            if (errno == ESTALE)
                estale++;
            else
                missing++;
            continue;
        }
        while ((k = read(fd, got + n, (size_t)(REN_SIZE * 2 - n))) > 0)
            n += k;
        if (k < 0 && errno == ESTALE)
            estale++;
        else if (!ren_valid(got, n))
            torn++;
        close(fd);
    }
    json_add_int(f->mine, "rename_missing", missing);
    json_add_int(f->mine, "rename_torn", torn);
    json_add_int(f->mine, "rename_estale", estale);
out:
    free(data);
    free(got);
    return r;
}

/* flock: two opens of one process, then one node holding it while the
 * others try. */
static int
phase_flock(struct fsc *f)
{
    char own[128];
    int a, b, r;

    if (f->rank == 0 && (r = put_file(f->run_fd, "lock", "", false)) < 0 && r != -EEXIST)
        return err_sys(f->err, r, "cannot create %s/%s/lock", f->o->dir, f->run);
    if ((r = barrier(f, "flock")) < 0)
        return r;
    /* one's own file first: two opens of it by this process. Local flock
     * locks an open file, so the second blocks; NFS emulates flock with
     * POSIX locks, which belong to the process, so there it does not. */
    snprintf(own, sizeof(own), "lock.%s", f->me);
    if ((r = put_file(f->run_fd, own, "", false)) < 0)
        return err_sys(f->err, r, "cannot create %s/%s/%s", f->o->dir, f->run, own);
    a = openat(f->run_fd, own, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    b = openat(f->run_fd, own, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (a < 0 || b < 0) {
        r = -errno;
        json_add_str(f->mine, "flock_local", strerror(-r));
    } else if (flock(a, LOCK_EX | LOCK_NB) < 0) {
        json_add_str(f->mine, "flock_local", strerror(errno));
    } else {
        r = flock(b, LOCK_EX | LOCK_NB);
        json_add_str(f->mine, "flock_local",
                     r == 0                 ? "does not block"
                     : errno == EWOULDBLOCK ? "blocks"
                                            : strerror(errno));
        flock(b, LOCK_UN);
        flock(a, LOCK_UN);
    }
    if (b >= 0)
        close(b);
    if (a >= 0)
        close(a);
    /* then the shared one, held by the first participant from before the
     * "flock held" barrier until after "flock tried" */
    a = openat(f->run_fd, "lock", O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (f->rank == 0 && a >= 0 && flock(a, LOCK_EX | LOCK_NB) < 0) {
        close(a);
        a = -1;
    }
    if ((r = barrier(f, "flock held")) < 0)
        goto out;
    if (f->rank > 0 && a >= 0) {
        r = flock(a, LOCK_EX | LOCK_NB);
        if (r == 0 || errno == EWOULDBLOCK)
            json_add_bool(f->mine, "flock_blocked", r != 0);
        else
            json_add_str(f->mine, "flock_error", strerror(errno));
        if (r == 0)
            flock(a, LOCK_UN);
    }
    r = barrier(f, "flock tried");
out:
    if (a >= 0)
        close(a);
    return r;
}

/* Lags: the first participant creates, grows and removes lag/f; the
 * others time how long their stat() takes to agree. */
static int
phase_lag(struct fsc *f)
{
    struct stat st;
    double lag[3] = { -3, -3, -3 };
    int r, fd;

    if (f->ids.n < 2)
        return 0;
    /* observers prime their lookup cache with the name's absence, so the
     * create lag times a cached "no such file", as a node has of a record
     * another node has just published */
    if (f->rank > 0 && fstatat(f->lag_fd, "f", &st, AT_SYMLINK_NOFOLLOW) == 0)
        return err_set(f->err, -EEXIST, "%s/%s/lag/f exists before its creation", f->o->dir,
                       f->run);
    if ((r = barrier(f, "create lag")) < 0)
        return r;
    if (f->rank == 0) {
        if ((r = put_file(f->lag_fd, "f", "", true)) < 0)
            return err_sys(f->err, r, "cannot create %s/%s/lag/f", f->o->dir, f->run);
        if ((r = signal_done(f, "s.c")) < 0)
            return r;
    } else {
        lag[0] = time_lag(f, "s.c", 0);
    }
    /* observers have seen the file, empty */
    if ((r = barrier(f, "attribute lag")) < 0)
        return r;
    if (f->rank == 0) {
        fd = openat(f->lag_fd, "f", O_WRONLY | O_APPEND | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0 || write(fd, "x", 1) != 1 || fsync(fd) < 0) {
            r = err_sys(f->err, -errno, "cannot write %s/%s/lag/f", f->o->dir, f->run);
            if (fd >= 0)
                close(fd);
            return r;
        }
        close(fd);
        if ((r = signal_done(f, "s.a")) < 0)
            return r;
    } else {
        lag[1] = time_lag(f, "s.a", 1);
    }
    if ((r = barrier(f, "unlink lag")) < 0)
        return r;
    if (f->rank == 0) {
        if (unlinkat(f->lag_fd, "f", 0) < 0)
            return err_sys(f->err, -errno, "cannot remove %s/%s/lag/f", f->o->dir, f->run);
        if ((r = signal_done(f, "s.u")) < 0)
            return r;
    } else {
        lag[2] = time_lag(f, "s.u", 2);
        add_lag(f->mine, "create_lag", lag[0]);
        add_lag(f->mine, "attr_lag", lag[1]);
        add_lag(f->mine, "unlink_lag", lag[2]);
    }
    return 0;
}

/* The server's clock: the mtime of a file just written against this
 * node's clock read around the write. */
static int
phase_clock(struct fsc *f)
{
    char name[400];
    struct stat st;
    double t1, t2, m;
    int fd, r = 0;

    snprintf(name, sizeof(name), "clock.%s", f->me);
    t1 = time_wall();
    fd = openat(f->run_fd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        return err_sys(f->err, -errno, "cannot create %s/%s/%s", f->o->dir, f->run, name);
    /* fsync before fstat: the write reaches the server, which stamps the
     * mtime, before the attributes are read back */
    if (write(fd, "x", 1) != 1 || fsync(fd) < 0 || fstat(fd, &st) < 0)
        r = err_sys(f->err, -errno, "cannot write %s/%s/%s", f->o->dir, f->run, name);
    t2 = time_wall();
    close(fd);
    if (r < 0)
        return r;
    m = (double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec / 1e9;
    json_add_float(f->mine, "clock_offset", round((m - (t1 + t2) / 2) * 1e4) / 1e4);
    json_add_float(f->mine, "clock_error", round((t2 - t1) / 2 * 1e4) / 1e4);
    return 0;
}

/* ---- the verdict ----------------------------------------------------- */

static bool
in_array(const cJSON *a, int i)
{
    const cJSON *x;

    cJSON_ArrayForEach(x, a) if (cJSON_IsNumber(x) && (int)x->valuedouble == i) return true;
    return false;
}

/* Who holds name now (its content), for a race's check. */
static void
holder(struct fsc *f, const char *name, char *out, size_t size)
{
    if (get_file(f->run_fd, name, out, size) < 0)
        out[0] = '\0';
}

/* One race's verdict: exactly one winner per name, the file holding its id. */
static char *
judge_race(struct fsc *f, cJSON *results, const char *won_key, const char *err_key,
           const char *prefix)
{
    char name[64], who[400];
    cJSON *r;

    /* The error recorded is strerror's text (the call is unsupported) or
     * the phase's own "a second ... succeeded" (the call is broken). */
    cJSON_ArrayForEach(r, results)
    {
        const char *e = json_get_str(r, err_key);

        if (e)
            return xasprintf("%s: %s on %s", strstr(e, "second") ? "FAILED" : "unsupported", e,
                             str_or(json_get_str(r, "id"), "?"));
    }
    for (int i = 0; i < f->rounds; i++) {
        int winners = 0;
        const char *winner = NULL;

        cJSON_ArrayForEach(r,
                           results) if (in_array(cJSON_GetObjectItemCaseSensitive(r, won_key), i))
        {
            winners++;
            winner = json_get_str(r, "id");
        }
        snprintf(name, sizeof(name), "%s.%d", prefix, i);
        holder(f, name, who, sizeof(who));
        if (winners != 1)
            return xasprintf("FAILED: %d participants won %s", winners, name);
        if (winner && strcmp(who, winner))
            return xasprintf("FAILED: %s won by %s holds '%s'", name, winner, who);
    }
    return xstrdup(f->ids.n > 1 ? "ok" : "ok (one participant: refuses an existing name)");
}

/* The participants' value of key farthest from 0 (dflt: none); a string
 * value (a timeout) sets *ret_timeout. The worst participant speaks for
 * the file system: a clock offset of either sign, the longest lag. */
static double
max_num(cJSON *results, const char *key, bool *ret_timeout, double dflt)
{
    double m = dflt, v;
    bool found = false;
    cJSON *r;

    cJSON_ArrayForEach(r, results)
    {
        if (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(r, key)) && ret_timeout)
            *ret_timeout = true;
        if (json_get_num(r, key, &v) == 0 && (!found || fabs(v) > fabs(m))) {
            m = v;
            found = true;
        }
    }
    return m;
}

static void
verdict_lag(cJSON *v, cJSON *results, const char *key, const char *out)
{
    bool timeout = false;
    double m = max_num(results, key, &timeout, -1);

    if (timeout)
        json_add_str(v, out, "timeout");
    else if (m >= 0)
        json_add_float(v, out, m);
    else
        cJSON_AddNullToObject(v, out);
}

static cJSON *
verdict(struct fsc *f, cJSON *results)
{
    cJSON *v = cJSON_CreateObject(), *r, *parts = cJSON_CreateArray();
    char now[40], *excl, *link, *why = NULL;
    struct strv hosts;
    long long missing = 0, torn = 0, estale = 0, n;
    const char *flock_local = NULL, *rerr = NULL, *s;
    int free_ = 0;
    bool exclusive;

    strv_init(&hosts);
    time_iso_now(now, NULL);
    json_add_str(v, "dir", f->o->dir);
    json_add_str(v, "checked_at", now);
    cJSON_ArrayForEach(r, results)
    {
        cJSON *p = cJSON_CreateObject();
        const char *h = json_get_str(r, "host");
        double d;
        bool b;

        json_add_str(p, "id", json_get_str(r, "id"));
        json_add_str(p, "host", h ? h : "");
        if (json_get_num(r, "clock_offset", &d) == 0)
            json_add_float(p, "clock_offset_secs", d);
        cJSON_AddItemToArray(parts, p);
        if (h && !strv_contains(&hosts, h))
            strv_push(&hosts, h);
        if (json_get_int(r, "rename_missing", &n) == 0)
            missing += n;
        if (json_get_int(r, "rename_torn", &n) == 0)
            torn += n;
        if (json_get_int(r, "rename_estale", &n) == 0)
            estale += n;
        if (!rerr)
            rerr = json_get_str(r, "rename_error");
        /* the first answer other than "blocks" wins: the worst is shown */
        s = json_get_str(r, "flock_local");
        if (s && (!flock_local || !strcmp(flock_local, "blocks")))
            flock_local = s;
        if (json_get_bool(r, "flock_blocked", &b) && !b)
            free_++;
    }
    cJSON_AddItemToObject(v, "participants", parts);
    json_add_int(v, "hosts", (long long)hosts.n);
    excl = judge_race(f, results, "excl_won", "excl_error", "x");
    link = judge_race(f, results, "link_won", "link_error", "k");
    json_add_str(v, "o_excl", excl);
    json_add_str(v, "link", link);
    if (rerr)
        json_add_str(v, "rename", rerr);
    else if (missing || torn)
        cJSON_AddItemToObject(
            v, "rename",
            cJSON_CreateString(
                (why = xasprintf("FAILED: the name was missing %lld times and torn %lld times "
                                 "while replaced",
                                 missing, torn))));
    else
        json_add_str(v, "rename", estale ? "ok (stale handles seen)" : "ok");
    free(why);
    why = NULL;
    if (flock_local && strcmp(flock_local, "blocks") && strcmp(flock_local, "does not block"))
        json_add_str(v, "flock", (why = xasprintf("unsupported: %s", flock_local)));
    else if (f->ids.n < 2)
        json_add_str(v, "flock", "untested across nodes (one participant)");
    else if (free_)
        json_add_str(v, "flock",
                     "node-local: a lock held by one participant did not block "
                     "another");
    else
        json_add_str(v, "flock",
                     hosts.n > 1 ? "cluster-wide"
                                 : "blocks across processes of one host (run on "
                                   "two nodes for a cluster verdict)");
    free(why);
    why = NULL;
    if (flock_local)
        json_add_str(v, "flock_same_process", flock_local);
    verdict_lag(v, results, "create_lag", "create_lag_secs");
    verdict_lag(v, results, "attr_lag", "attr_lag_secs");
    verdict_lag(v, results, "unlink_lag", "unlink_lag_secs");
    json_add_float(v, "clock_offset_secs", max_num(results, "clock_offset", NULL, 0));
    /* Claims rest on O_EXCL (the lock) and link() (done and failed
     * records) only; rename, flock and the lags are reported but do not
     * decide. */
    exclusive = !strncmp(excl, "ok", 2) && !strncmp(link, "ok", 2);
    json_add_bool(v, "exclusive", exclusive);
    if (!exclusive)
        json_add_str(v, "reason",
                     strncmp(excl, "ok", 2) ? (why = xasprintf("O_EXCL create: %s", excl))
                                            : (why = xasprintf("link(): %s", link)));
    free(why);
    free(excl);
    free(link);
    strv_free(&hosts);
    return v;
}

static int
gather(struct fsc *f, cJSON **ret)
{
    char name[400], *text = xmalloc(RESULT_MAX);
    cJSON *all = cJSON_CreateArray(), *one;
    struct esd_err e;
    int r;

    for (size_t i = 0; i < f->ids.n; i++) {
        ssize_t n;

        snprintf(name, sizeof(name), "res.%s", f->ids.v[i]);
        if ((n = get_file(f->run_fd, name, text, RESULT_MAX)) < 0 ||
            (r = json_parse_object(text, (size_t)n, name, &one, &e)) < 0) {
            cJSON_Delete(all);
            free(text);
            return err_set(f->err, n < 0 ? (int)n : r, "cannot read the result of %s: %s",
                           f->ids.v[i], n < 0 ? strerror((int)-n) : e.msg);
        }
        cJSON_AddItemToArray(all, one);
    }
    free(text);
    *ret = all;
    return 0;
}

static int
run_phases(struct fsc *f, cJSON **ret_verdict)
{
    cJSON *results = NULL;
    struct buf b;
    char name[400];
    int r;

    if ((r = rendezvous(f)) < 0 || (r = phase_clock(f)) < 0 || (r = phase_excl(f)) < 0 ||
        (r = phase_link(f)) < 0 || (r = phase_rename(f)) < 0 || (r = phase_flock(f)) < 0 ||
        (r = phase_lag(f)) < 0)
        return r;
    buf_init(&b);
    json_dump(f->mine, JSON_COMPACT, &b);
    buf_putc(&b, '\0');
    snprintf(name, sizeof(name), "res.%s", f->me);
    r = put_file(f->run_fd, name, b.p, true);
    buf_free(&b);
    if (r < 0)
        return err_sys(f->err, r, "cannot create %s/%s/%s", f->o->dir, f->run, name);
    if ((r = barrier(f, "results")) < 0 || (r = gather(f, &results)) < 0)
        return r;
    *ret_verdict = verdict(f, results);
    cJSON_Delete(results);
    return 0;
}

int
fscheck_run(const struct fscheck_opts *o, cJSON **ret_verdict, struct esd_err *err)
{
    struct fsc f = { .o = o, .err = err, .base_fd = -1, .run_fd = -1, .sig_fd = -1, .lag_fd = -1 };
    char shown[4200];
    cJSON *v = NULL;
    int dfd, r;

    if (o->run && !name_ok(o->run))
        return err_set(err, -EINVAL,
                       "invalid run name '%s': use up to 64 letters, digits, "
                       "'.', '_' and '-', not starting with '.'",
                       o->run);
    {
        char host[256];

        if (gethostname(host, sizeof(host)) < 0)
            snprintf(host, sizeof(host), "unknown");
        /* (a long host name is cut: ids need only be unique with the pid) */
        host[sizeof(f.host) - 1] = '\0';
        memcpy(f.host, host, sizeof(f.host));
    }
    sanitize(f.host);
    snprintf(f.me, sizeof(f.me), "%s.%ld", f.host, (long)getpid());
    /* one participant never waits for, nor meets, another run */
    if (o->nodes <= 1)
        snprintf(f.run, sizeof(f.run), "%s.%s", o->run ? o->run : "single", f.me);
    else
        snprintf(f.run, sizeof(f.run), "%s", o->run ? o->run : "default");
    f.rounds = o->rounds > 0 ? o->rounds : FSCHECK_ROUNDS;
    f.lag_max = o->lag_max > 0 ? o->lag_max : FSCHECK_LAG_MAX;
    strv_init(&f.ids);
    f.mine = cJSON_CreateObject();
    json_add_str(f.mine, "id", f.me);
    json_add_str(f.mine, "host", f.host);
    dfd = open(o->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        r = err_sys(err, -errno, "cannot open %s", o->dir);
        goto out;
    }
    snprintf(shown, sizeof(shown), "%s/%s", o->dir, RUN_BASE);
    f.base_fd = open_subdir(dfd, RUN_BASE, shown, err);
    close(dfd);
    if ((r = f.base_fd) < 0)
        goto out;
    snprintf(shown, sizeof(shown), "%s/%s/%s", o->dir, RUN_BASE, f.run);
    if ((r = f.run_fd = open_subdir(f.base_fd, f.run, shown, err)) < 0)
        goto out;
    snprintf(shown, sizeof(shown), "%s/%s/%s/sig", o->dir, RUN_BASE, f.run);
    if ((r = f.sig_fd = open_subdir(f.run_fd, "sig", shown, err)) < 0)
        goto out;
    snprintf(shown, sizeof(shown), "%s/%s/%s/lag", o->dir, RUN_BASE, f.run);
    if ((r = f.lag_fd = open_subdir(f.run_fd, "lag", shown, err)) < 0)
        goto out;
    /* Rank 0 removes the run directory: it first waits (bounded) for the
     * others' "gone", each written after that participant read every
     * result, so no one's reads fail on a directory removed under them. */
    r = run_phases(&f, &v);
    if (r == 0 && f.rank > 0) {
        /* the first participant removes the run once everyone has read */
        char name[400];

        snprintf(name, sizeof(name), "gone.%s", f.me);
        put_file(f.sig_fd, name, "", true);
    } else if (f.ids.n > 1 && f.rank == 0) {
        double until = time_mono() + PHASE_WAIT;

        for (size_t i = 1; i < f.ids.n && time_mono() < until;) {
            char name[400];

            snprintf(name, sizeof(name), "gone.%s", f.ids.v[i]);
            if (listed(f.sig_fd, name))
                i++;
            else
                pause_poll(POLL_BARRIER);
        }
    }
    if (r == 0 && f.rank == 0 && fscheck_is_job(o->dir))
        r = fscheck_record(o->dir, v, err);
out:
    /* owner is set only for rank 0 of the agreed list: a latecomer refused
     * by rendezvous never removes the run of the others */
    if (f.owner) {
        char *path = xasprintf("%s/%s/%s", o->dir, RUN_BASE, f.run);

        fs_rm_rf(path);
        free(path);
        /* (the last run leaves no empty directory behind) */
        path = xasprintf("%s/%s", o->dir, RUN_BASE);
        rmdir(path);
        free(path);
    }
    if (f.lag_fd >= 0)
        close(f.lag_fd);
    if (f.sig_fd >= 0)
        close(f.sig_fd);
    if (f.run_fd >= 0)
        close(f.run_fd);
    if (f.base_fd >= 0)
        close(f.base_fd);
    strv_free(&f.ids);
    cJSON_Delete(f.mine);
    if (r < 0) {
        cJSON_Delete(v);
        return r;
    }
    *ret_verdict = v;
    return 0;
}

bool
fscheck_exclusive(const cJSON *verdict, const char **ret_reason)
{
    bool ex = false;

    if (!json_get_bool(verdict, "exclusive", &ex))
        ex = false;
    if (ret_reason)
        *ret_reason = json_get_str(verdict, "reason");
    return ex;
}

bool
fscheck_is_job(const char *dir)
{
    char *path = fs_join(dir, "manifest.json");
    struct stat st;
    bool is = lstat(path, &st) == 0 && S_ISREG(st.st_mode);

    free(path);
    return is;
}

int
fscheck_record(const char *job_dir, const cJSON *verdict, struct esd_err *err)
{
    char *dir = fs_join(job_dir, "state/esd"), *path = fs_join(dir, "fscheck.json");
    int r = fs_mkdir_p(dir, 0755, err);

    if (r == 0)
        r = json_write_atomic(path, verdict, JSON_PRETTY, err);
    free(dir);
    free(path);
    return r;
}

char *
fscheck_refusal(const char *job_dir, const char *node)
{
    struct fscheck_opts o = { .dir = job_dir, .nodes = 1, .rounds = 2 };
    char *path = fs_join(job_dir, "state/esd/fscheck.json"), run[80], *why = NULL;
    const char *reason, *when;
    cJSON *rec = NULL, *v = NULL;
    struct esd_err err;

    /* A recorded refusal wins over a passing check here: this one is the
     * single-node subset, blind to what only a run across nodes (esctl
     * fscheck) sees, so the refusal stands until such a run replaces it. */
    if (json_load_object(path, RESULT_MAX, &rec, &err) == 0 && !fscheck_exclusive(rec, &reason)) {
        when = json_get_str(rec, "checked_at");
        why = xasprintf("claims cannot be exclusive on this file system: %.300s (verdict of "
                        "%.40s in state/esd/fscheck.json; once the mount is fixed, run `esctl "
                        "fscheck %s` on the nodes again)",
                        reason ? reason : "see the verdict", when ? when : "an earlier check",
                        job_dir);
        goto out;
    }
    snprintf(run, sizeof(run), "esd.%.60s", node && *node ? node : "node");
    sanitize(run + 4);
    o.run = run;
    if (fscheck_run(&o, &v, &err) < 0)
        goto out;
    if (!fscheck_exclusive(v, &reason)) {
        why = xasprintf("claims cannot be exclusive on this file system: %s (esctl fscheck %s "
                        "says more)",
                        reason ? reason : "see state/esd/fscheck.json", job_dir);
        fscheck_record(job_dir, v, &err);
    } else if (!rec) {
        /* recorded only where none is: a passing verdict recorded
         * earlier, maybe of several nodes, says more than this one */
        fscheck_record(job_dir, v, &err);
    }
out:
    cJSON_Delete(rec);
    cJSON_Delete(v);
    free(path);
    return why;
}

static void
text_lag(struct buf *b, const cJSON *v, const char *key, const char *what)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(v, key);
    double d;

    if (json_get_num(v, key, &d) == 0)
        buf_printf(b, "  %-22s %.6f s\n", what, d);
    else if (cJSON_IsString(x))
        buf_printf(b, "  %-22s more than the limit (%s)\n", what, x->valuestring);
    else
        buf_printf(b, "  %-22s not measured (one participant)\n", what);
}

/* A line "  <label> <value><suffix>", the value escaped: it may come from
 * a peer's result file. */
static void
text_line(struct buf *b, const char *label, const char *value, const char *suffix)
{
    buf_printf(b, "  %-22s ", label);
    str_escape(value ? value : "?", strlen(value ? value : "?"), b);
    buf_printf(b, "%s\n", suffix);
}

char *
fscheck_text(const cJSON *v)
{
    const char *reason, *s, *dir = json_get_str(v, "dir");
    bool ex = fscheck_exclusive(v, &reason);
    const cJSON *parts = cJSON_GetObjectItemCaseSensitive(v, "participants"), *p;
    long long hosts = 0;
    double off = 0;
    struct buf b;

    buf_init(&b);
    json_get_int(v, "hosts", &hosts);
    str_escape(dir ? dir : "?", strlen(dir ? dir : "?"), &b);
    buf_printf(&b, ": %d participant(s) on %lld host(s)\n", cJSON_GetArraySize(parts), hosts);
    cJSON_ArrayForEach(p, parts) text_line(&b, "participant", json_get_str(p, "id"), "");
    text_line(&b, "O_EXCL create", json_get_str(v, "o_excl"), "");
    text_line(&b, "link()", json_get_str(v, "link"), "");
    text_line(&b, "rename()", json_get_str(v, "rename"), "");
    text_line(&b, "flock across nodes", json_get_str(v, "flock"), "");
    if ((s = json_get_str(v, "flock_same_process")))
        text_line(&b, "flock in one process", s,
                  !strcmp(s, "does not block") ? " (emulated by POSIX locks, as NFS does)" : "");
    text_lag(&b, v, "create_lag_secs", "create seen after");
    text_lag(&b, v, "attr_lag_secs", "change seen after");
    text_lag(&b, v, "unlink_lag_secs", "unlink seen after");
    json_get_num(v, "clock_offset_secs", &off);
    buf_printf(&b, "  %-22s %+.3f s%s\n", "server clock", off,
               fabs(off) > FSCHECK_CLOCK_WARN ? " (esd judges leases on the server's clock; "
                                                "other tools may not)"
                                              : "");
    if (hosts < 2 && cJSON_GetArraySize(parts) > 1)
        buf_puts(&b, "note: all participants ran on one host; real verdicts need two nodes\n");
    if (ex) {
        buf_puts(&b, "verdict: claims can be exclusive here\n");
    } else {
        buf_puts(&b, "verdict: claims CANNOT be exclusive here: ");
        str_escape(reason ? reason : "?", strlen(reason ? reason : "?"), &b);
        buf_putc(&b, '\n');
    }
    return buf_steal(&b);
}
