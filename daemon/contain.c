/*
 * contain: esd as child subreaper, the sweep of what was handed to it at
 * its stop, and the attempts' cgroups in a delegated cgroup v2 subtree.
 */
#include "contain.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "util.h"

/* Retries of the removal of a cgroup whose killed processes are still
 * dying, every RMDIR_EVERY seconds. */
#define RMDIR_EVERY 0.5
#define RMDIR_TRIES 120

struct pending {
    struct pending *next;
    char *dir;
    int tries;
};

static struct {
    struct ev_loop *loop;
    char *base;              /* the delegated cgroup directory, or NULL */
    struct pending *pending; /* attempt cgroups not removed yet */
    ev_timer retry_w;
} C;

/* ---- finding the delegated cgroup ---- */

/* The path of this process's cgroup v2 ("0::/path" in /proc/self/cgroup),
 * or NULL. Caller frees. */
static char *
own_cgroup(void)
{
    FILE *f = fopen("/proc/self/cgroup", "re");
    char line[4096], *path = NULL;

    if (!f)
        return NULL;
    while (!path && fgets(line, sizeof(line), f))
        if (!strncmp(line, "0::", 3)) {
            line[strcspn(line, "\n")] = '\0';
            path = xstrdup(line + 3);
        }
    fclose(f);
    return path;
}

/* Where the cgroup v2 hierarchy is mounted (with its root at "/"), or NULL.
 * Caller frees. */
static char *
cgroup2_mount(void)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    char line[8192], *mnt = NULL;

    if (!f)
        return NULL;
    /* "id parent maj:min root mountpoint options [optional...] - type src super" */
    while (!mnt && fgets(line, sizeof(line), f)) {
        char root[4096], point[4096], *sep = strstr(line, " - ");

        if (!sep || strncmp(sep + 3, "cgroup2 ", 8) != 0)
            continue;
        if (sscanf(line, "%*s %*s %*s %4095s %4095s", root, point) == 2 && !strcmp(root, "/") &&
            !strchr(point, '\\')) /* (an escaped blank: not systemd's) */
            mnt = xstrdup(point);
    }
    fclose(f);
    return mnt;
}

/* Whether systemd delegated dir (Delegate=yes): it marks the cgroup with
 * the extended attribute trusted.delegate (readable with CAP_SYS_ADMIN)
 * or user.delegate (newer versions), and hands it to the service's user,
 * who could not write it otherwise. */
static bool
delegated(const char *dir)
{
    char v[8];
    struct stat st;
    ssize_t n;

    if (stat(dir, &st) < 0 || st.st_uid != geteuid() || access(dir, W_OK) < 0)
        return false;
    if (((n = getxattr(dir, "trusted.delegate", v, sizeof(v))) > 0 ||
         (n = getxattr(dir, "user.delegate", v, sizeof(v))) > 0) &&
        v[0] == '1')
        return true;
    /* owned by a user other than root: only a delegation does that */
    return geteuid() != 0;
}

/* Writes text to dir/name. 0 or -errno. */
static int
cg_write(const char *dir, const char *name, const char *text)
{
    char *path = xasprintf("%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CLOEXEC), r = 0;
    size_t len = strlen(text);

    free(path);
    if (fd < 0)
        return -errno;
    if (write(fd, text, len) != (ssize_t)len)
        r = -errno;
    close(fd);
    return r;
}

/* Sends SIGKILL to every process of dir: cgroup.kill (Linux 5.14), else
 * each pid cgroup.procs lists. Returns how many it listed (1 after
 * cgroup.kill), 0 for none. */
static int
cg_kill(const char *dir)
{
    char *path;
    FILE *f;
    long pid;
    int n = 0;

    if (cg_write(dir, "cgroup.kill", "1") == 0)
        return 1;
    path = xasprintf("%s/cgroup.procs", dir);
    f = fopen(path, "re");
    free(path);
    if (!f)
        return 0;
    while (fscanf(f, "%ld", &pid) == 1) {
        kill((pid_t)pid, SIGKILL);
        n++;
    }
    fclose(f);
    return n;
}

/* Kills what is in dir and removes it: 0, or -EBUSY while its processes
 * are still dying, or another -errno. */
static int
cg_remove(const char *dir)
{
    cg_kill(dir);
    return rmdir(dir) == 0 || errno == ENOENT ? 0 : -errno;
}

/* ---- the loop's retries ---- */

static void
contain_retry_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct pending **p = &C.pending;

    (void)revents;
    while (*p) {
        struct pending *q = *p;
        int r = cg_remove(q->dir);

        if (r == 0 || ++q->tries >= RMDIR_TRIES) {
            if (r < 0)
                log_warning(NULL, "cannot remove cgroup %s: %s; leaving it", q->dir, strerror(-r));
            *p = q->next;
            free(q->dir);
            free(q);
            continue;
        }
        p = &q->next;
    }
    if (!C.pending)
        ev_timer_stop(loop, w);
}

/* ---- the interface ---- */

void
contain_init(struct ev_loop *loop)
{
    const char *test = getenv("ESD_TEST_CGROUP");
    char *own, *mnt, *leaf;
    int r;

    C.loop = loop;
    ev_timer_init(&C.retry_w, contain_retry_cb, RMDIR_EVERY, RMDIR_EVERY);
    if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0)
        log_warning(NULL,
                    "cannot become the child subreaper of the attempts: %s; what leaves "
                    "an attempt whose keeper is killed goes to init",
                    strerror(errno));
    if (test && *test) {
        /* tests: a cgroup they made, as if systemd had delegated it */
        C.base = xstrdup(test);
    } else {
        own = own_cgroup();
        mnt = cgroup2_mount();
        if (own && mnt && own[0] == '/')
            C.base = xasprintf("%s%s", mnt, strcmp(own, "/") ? own : "");
        free(own);
        free(mnt);
        if (C.base && access(C.base, W_OK) < 0 && errno == EROFS) {
            log_info(NULL,
                     "cgroup %s is read-only here (ProtectControlGroups=yes?): each "
                     "attempt's keeper alone ends what it started (see esd(8))",
                     C.base);
            free(C.base);
            C.base = NULL;
        } else if (C.base && !delegated(C.base)) {
            log_info(NULL,
                     "cgroup %s is not delegated to esd: each attempt's keeper alone "
                     "ends what it started (Delegate=yes, see esd(8))",
                     C.base);
            free(C.base);
            C.base = NULL;
        }
        if (!C.base)
            return;
    }
    /* No process of its own in a cgroup with children: esd goes into a
     * leaf beside its attempts' */
    leaf = xasprintf("%s/esd", C.base);
    r = mkdir(leaf, 0755) < 0 && errno != EEXIST ? -errno : cg_write(leaf, "cgroup.procs", "0");
    if (r < 0) {
        log_warning(NULL,
                    "cannot move esd into cgroup %s: %s; attempts get no cgroups, each "
                    "attempt's keeper alone ends what it started",
                    leaf, strerror(-r));
        free(leaf);
        free(C.base);
        C.base = NULL;
        return;
    }
    free(leaf);
    log_info(NULL, "attempts run in cgroups of their own under %s", C.base);
}

bool
contain_has_cgroups(void)
{
    return C.base != NULL;
}

char *
contain_begin(const char *name)
{
    char *dir;

    if (!C.base)
        return NULL;
    dir = xasprintf("%s/attempt-%s", C.base, name);
    /* (one of an esd killed earlier, say: whatever it holds is stale) */
    if (mkdir(dir, 0755) < 0 && (errno != EEXIST || cg_remove(dir) < 0 || mkdir(dir, 0755) < 0)) {
        log_warning(NULL, "cannot make cgroup %s: %s; the attempt runs without one", dir,
                    strerror(errno));
        free(dir);
        return NULL;
    }
    return dir;
}

int
contain_move(const char *dir, pid_t pid)
{
    char text[32];

    snprintf(text, sizeof(text), "%ld", (long)pid);
    return cg_write(dir, "cgroup.procs", text);
}

void
contain_end(char *dir)
{
    struct pending *q;

    if (!dir)
        return;
    if (cg_remove(dir) == 0) {
        free(dir);
        return;
    }
    q = xcalloc(1, sizeof(*q));
    q->dir = dir;
    q->next = C.pending;
    C.pending = q;
    if (C.loop && !ev_is_active(&C.retry_w))
        ev_timer_start(C.loop, &C.retry_w);
}

/* Sends SIGKILL to every child of esd's (with no keeper or helper left,
 * only what was handed to it is); how many there were. */
static int
kill_children(void)
{
    char path[64];
    FILE *f;
    long pid;
    int n = 0;

    snprintf(path, sizeof(path), "/proc/self/task/%d/children", (int)getpid());
    if (!(f = fopen(path, "re")))
        return 0;
    while (fscanf(f, "%ld", &pid) == 1) {
        kill((pid_t)pid, SIGKILL);
        n++;
    }
    fclose(f);
    return n;
}

void
contain_fini(void)
{
    /* at most about a second: the processes were sent SIGKILL */
    for (int round = 0; round < 100; round++) {
        struct timespec ts = { 0, 10 * 1000 * 1000 };
        bool left = kill_children() > 0;

        while (waitpid(-1, NULL, WNOHANG) > 0)
            ;
        for (struct pending **p = &C.pending; *p;) {
            struct pending *q = *p;

            if (cg_remove(q->dir) == 0) {
                *p = q->next;
                free(q->dir);
                free(q);
                continue;
            }
            left = true;
            p = &q->next;
        }
        if (!left)
            break;
        nanosleep(&ts, NULL);
    }
    for (struct pending *q = C.pending, *next; q; q = next) {
        next = q->next;
        log_warning(NULL, "cannot remove cgroup %s: its processes did not die", q->dir);
        free(q->dir);
        free(q);
    }
    C.pending = NULL;
    if (C.loop)
        ev_timer_stop(C.loop, &C.retry_w);
    free(C.base);
    C.base = NULL;
}
