/*
 * spawn: fork+exec with a process group, one output pipe and an exec
 * failure channel (a CLOEXEC pipe that only a failed exec writes to). The
 * child resets what it inherited (signals, descriptors, credentials)
 * before the exec, with async-signal-safe calls only.
 */
#include "spawn.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Longest passwd entry looked up, and most supplementary groups taken. */
#define PW_BUF_MAX ((size_t)1 << 20)
#define GROUPS_MAX 65536

/* ---- in the child, between fork and exec: async-signal-safe calls only ---- */

/* Every signal to its default action: handlers would go with the exec
 * anyway, but an ignored signal (esd ignores SIGPIPE) would stay ignored in
 * the processor. Through the system call itself: the C library refuses to
 * touch the signals it reserves (32 and 33 in glibc), which a parent may
 * have ignored too. A zeroed kernel sigaction is SIG_DFL with no flags and
 * an empty mask whatever the architecture's field order; the kernel
 * refuses only SIGKILL and SIGSTOP, which need no reset. */
static void
child_signals_default(void)
{
    static const unsigned long dfl[8];

    for (int sig = 1; sig < NSIG; sig++)
        (void)syscall(SYS_rt_sigaction, sig, dfl, NULL, (size_t)(NSIG - 1) / 8);
}

/* fd itself if it is above 2, else a close-on-exec copy above 2, so that
 * the dup2s onto 0-2 cannot clobber it (a parent started with 0-2 closed
 * gets its pipes there). -1 on failure. */
static int
child_above_stdio(int fd)
{
    return fd < 0 || fd > STDERR_FILENO ? fd : fcntl(fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
}

/* Closes lo..hi without close_range(2) (kernels before 5.9): the numbers
 * listed in /proc/self/fd, or every number below the descriptor limit
 * when /proc is not there. */
static void
child_close_slow(unsigned lo, unsigned hi)
{
    int dfd = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    struct rlimit rl;

    if (dfd >= 0) {
        /* (procfs lists by descriptor number: closing those already read
         * does not disturb the listing) */
        char chunk[4096] __attribute__((aligned(8)));
        ssize_t n;

        while ((n = getdents64(dfd, chunk, sizeof(chunk))) > 0)
            for (ssize_t off = 0; off < n;) {
                const struct dirent64 *d = (const struct dirent64 *)(chunk + off);
                unsigned long fd = 0;
                const char *p = d->d_name;

                for (; *p >= '0' && *p <= '9' && fd <= hi; p++)
                    fd = fd * 10 + (unsigned long)(*p - '0');
                if (!*p && p != d->d_name && fd >= lo && fd <= hi && fd != (unsigned long)dfd)
                    close((int)fd);
                off += d->d_reclen;
            }
        close(dfd);
        return;
    }
    if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
        rl.rlim_cur = 65536;
    for (unsigned long fd = lo; fd <= hi && fd < rl.rlim_cur; fd++)
        close((int)fd);
}

static void
child_close(unsigned lo, unsigned hi)
{
    if (lo <= hi && close_range(lo, hi, 0) < 0)
        child_close_slow(lo, hi);
}

/* Takes cred's identity for good. 0 or an errno. */
static int
child_become(const struct spawn_cred *cred)
{
    /* groups first: the uid change gives up the right to change them */
    if (setgroups(cred->ngroups, cred->groups) < 0 ||
        setresgid(cred->gid, cred->gid, cred->gid) < 0 ||
        setresuid(cred->uid, cred->uid, cred->uid) < 0)
        return errno;
    return setuid(0) == 0 ? EPERM : 0;
}

/* own_group: a process group of its own (spawn_start), or its parent's
 * (the keeper's, spawn_keep). */
static void __attribute__((noreturn))
child_exec(char *const *argv, char *const *envp, const char *cwd, bool merge, bool own_group,
           const struct spawn_cred *cred, pid_t parent, int out_w, int status_w, int in_fd)
{
    sigset_t none;
    int e, devnull;

    if (own_group)
        setpgid(0, 0);
    child_signals_default();
    devnull = child_above_stdio(open("/dev/null", O_RDWR | O_CLOEXEC));
    out_w = child_above_stdio(out_w);
    status_w = child_above_stdio(status_w);
    in_fd = in_fd < 0 ? devnull : child_above_stdio(in_fd);
    if (devnull < 0 || out_w < 0 || status_w < 0 || in_fd < 0) {
        e = errno;
    } else if (cred && (e = child_become(cred)) != 0) {
        /* (reported below) */
    } else if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0) {
        /* after the uid change, which clears it: the child dies with its
         * parent, so that a crashed esd leaves no attempt behind to run on
         * under a lease that nobody renews */
        e = errno;
    } else if (getppid() != parent) {
        _exit(127); /* the parent died before the line above */
    } else if (dup2(out_w, STDOUT_FILENO) < 0 || dup2(merge ? out_w : devnull, STDERR_FILENO) < 0 ||
               dup2(in_fd, STDIN_FILENO) < 0 || (cwd && chdir(cwd) < 0)) {
        e = errno;
    } else {
        /* Nothing of the parent's but 0-2, CLOEXEC or not; the status
         * pipe stays until the exec closes it. */
        child_close(STDERR_FILENO + 1, (unsigned)status_w - 1);
        child_close((unsigned)status_w + 1, ~0U);
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execvpe(argv[0], argv, envp);
        e = errno;
    }
    (void)!write(status_w, &e, sizeof(e));
    _exit(127);
}

/* ---- the keeper: a forked process of the caller's that runs one program ---- */

/* What the keeper tells its parent, each record one write (atomic: far
 * below PIPE_BUF). */
enum { REP_STARTED = 1, REP_EXEC_FAILED, REP_SETUP_FAILED, REP_EXITED };
struct rep {
    int kind;
    int value; /* the program's pid, an errno, or its wait status */
};

static void
keeper_report(int fd, int kind, int value)
{
    struct rep rec = { kind, value };

    /* (SIGPIPE is blocked: a parent that is gone gives EPIPE) */
    while (write(fd, &rec, sizeof(rec)) < 0 && errno == EINTR)
        ;
}

static double
keeper_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Sends sig to every child of the keeper (orphans of its tree included:
 * it is their subreaper) that is not in group skip_group (0: none).
 * Returns how many it found. /proc/self/task/<tid>/children lists them
 * (the keeper's own entry, readable even where ProtectProc=invisible
 * hides the tree's, which may run as another user); without it
 * (CONFIG_PROC_CHILDREN), every /proc/<pid>/stat is read for its ppid. */
static int
keeper_signal_children(int sig, pid_t skip_group)
{
    char path[64], chunk[8192];
    pid_t self = getpid();
    int fd, found = 0;
    ssize_t n;

    snprintf(path, sizeof(path), "/proc/self/task/%d/children", (int)self);
    if ((fd = open(path, O_RDONLY | O_CLOEXEC)) >= 0) {
        long pid = 0;
        bool in = false;

        /* "pid pid pid " (a chunk may end inside a number) */
        while ((n = read(fd, chunk, sizeof(chunk))) > 0 || (n < 0 && errno == EINTR))
            for (ssize_t i = 0; i < n; i++) {
                if (chunk[i] >= '0' && chunk[i] <= '9') {
                    pid = pid * 10 + (chunk[i] - '0');
                    in = true;
                    continue;
                }
                if (in && (!skip_group || getpgid((pid_t)pid) != skip_group)) {
                    kill((pid_t)pid, sig);
                    found++;
                }
                pid = 0;
                in = false;
            }
        if (in && (!skip_group || getpgid((pid_t)pid) != skip_group)) {
            kill((pid_t)pid, sig);
            found++;
        }
        close(fd);
        return found;
    }
    DIR *d = opendir("/proc");
    struct dirent *e;

    if (!d)
        return 0;
    while ((e = readdir(d))) {
        char *end, *p;
        long pid = strtol(e->d_name, &end, 10), ppid;

        if (*end || end == e->d_name || pid == self)
            continue;
        snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
        if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
            continue;
        n = read(fd, chunk, sizeof(chunk) - 1);
        close(fd);
        if (n <= 0)
            continue;
        chunk[n] = '\0';
        /* "pid (comm) state ppid ...": comm may hold anything, ')' too */
        if (!(p = strrchr(chunk, ')')) || sscanf(p + 1, " %*c %ld", &ppid) != 1 || ppid != self)
            continue;
        if (!skip_group || getpgid((pid_t)pid) != skip_group) {
            kill((pid_t)pid, sig);
            found++;
        }
    }
    closedir(d);
    return found;
}

/* Kills the keeper's whole tree and reaps it: SIGKILL to every child,
 * wait for one, again, until none is left. A child that dies hands its
 * own children to the keeper (their subreaper) before its parent learns
 * of its death, so each round reaches the next layer, and a process that
 * forks while it is being killed only adds a child to the next round.
 * The program's wait status goes to *status when it is reaped here. */
static void
keeper_kill_tree(pid_t prog, int *status, bool *reaped)
{
    for (;;) {
        int st, found = keeper_signal_children(SIGKILL, 0);
        pid_t w = waitpid(-1, &st, found ? 0 : WNOHANG);

        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return; /* ECHILD: nothing is left */
        if (w == 0) {
            /* children that the listing missed (born since): list again */
            struct timespec ts = { 0, 10 * 1000 * 1000 };

            nanosleep(&ts, NULL);
        }
        if (w == prog && !*reaped) {
            *status = st;
            *reaped = true;
        }
    }
}

/* Moves the calling process into the cgroup directory dir (cgroup v2:
 * "0" written to its cgroup.procs). 0 or an errno. */
static int
keeper_enter_cgroup(const char *dir)
{
    char path[4096];
    int fd, e = 0;

    if ((size_t)snprintf(path, sizeof(path), "%s/cgroup.procs", dir) >= sizeof(path))
        return ENAMETOOLONG;
    if ((fd = open(path, O_WRONLY | O_CLOEXEC)) < 0)
        return errno;
    if (write(fd, "0", 1) != 1)
        e = errno;
    close(fd);
    return e;
}

/* Closes every descriptor above 2 but a and b (both above 2). */
static void
keeper_close_all_but(int a, int b)
{
    int lo = a < b ? a : b, hi = a < b ? b : a;

    child_close(STDERR_FILENO + 1, (unsigned)lo - 1);
    child_close((unsigned)lo + 1, (unsigned)hi - 1);
    child_close((unsigned)hi + 1, ~0U);
}

/*
 * The keeper's watch over its program prog, started: until prog exits or
 * a stop's grace ends, then the tree is killed and reaped (see
 * spawn_keep). parent is whose SIGTERM is a stop (and root's); its death
 * shows as the report pipe rep_w's read end closing. sfd: a signalfd for
 * SIGTERM and SIGCHLD, both blocked.
 */
static void __attribute__((noreturn))
keeper_watch(pid_t prog, pid_t parent, int rep_w, int sfd, double grace)
{
    pid_t self = getpid();
    bool reaped = false, told, stopping = false;
    double kill_at = 0;
    int status = 0, st0;

    /* (an adopted program may have ended before the keeper looked) */
    if (waitpid(prog, &st0, WNOHANG) == prog) {
        status = st0;
        reaped = true;
    }
    while (!reaped) {
        /* the report pipe's read end is the parent's alone: POLLERR on
         * the write end when it is closed, i.e. when the parent is dead */
        struct pollfd p[2] = { { .fd = sfd, .events = POLLIN }, { .fd = rep_w, .events = 0 } };
        struct signalfd_siginfo si;
        int ms = -1, st;
        pid_t w;

        if (stopping) {
            double left = kill_at - keeper_now();

            if (left <= 0)
                break;
            ms = (int)(left * 1000) + 1;
        }
        if (poll(p, 2, ms) < 0 && errno != EINTR)
            break;
        if (p[1].revents & (POLLERR | POLLHUP))
            break;
        while (read(sfd, &si, sizeof(si)) == (ssize_t)sizeof(si))
            /* A stop comes from the parent (spawn_signal) or from root;
             * the program signalling its own group (kill(0, SIGTERM)) is
             * no stop: it ends the attempt by exiting, if at all. */
            if (si.ssi_signo == SIGTERM && !stopping &&
                (si.ssi_pid == (uint32_t)parent || si.ssi_uid == 0)) {
                /* The group has it from the parent (spawn_signal): the
                 * rest are the processes that left it, handed to the
                 * keeper when their parents died. */
                stopping = true;
                kill_at = keeper_now() + grace;
                keeper_signal_children(SIGTERM, self);
            }
        while ((w = waitpid(-1, &st, WNOHANG)) > 0)
            if (w == prog) {
                status = st;
                reaped = true;
            }
    }
    /* the status first: killing the rest may take a while */
    if ((told = reaped))
        keeper_report(rep_w, REP_EXITED, status);
    keeper_kill_tree(prog, &status, &reaped);
    if (reaped && !told)
        keeper_report(rep_w, REP_EXITED, status);
    _exit(0);
}

/*
 * The keeper, in the child of spawn_keep's fork (the caller is
 * single-threaded, so that ordinary library calls are safe here): a
 * process group of its own, every signal blocked (SIGTERM and SIGCHLD
 * read through a signalfd; the rest ignored), the subreaper of everything
 * below it, in the cgroup if one is given; it starts the program in its
 * group and stays with it until all is over.
 */
static void __attribute__((noreturn))
keeper_main(char *const *argv, char *const *envp, const char *cwd, const struct spawn_cred *cred,
            const struct spawn_keep_opts *o, pid_t parent, int out_w, int rep_w)
{
    sigset_t all, want;
    int ex[2], sfd, e = 0;
    pid_t self, prog;
    ssize_t n;

    setpgid(0, 0);
    child_signals_default();
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    out_w = child_above_stdio(out_w);
    rep_w = child_above_stdio(rep_w);
    if (out_w < 0 || rep_w < 0)
        _exit(127); /* (the parent sees the report pipe close without a word) */
    keeper_close_all_but(out_w, rep_w);
    sigemptyset(&want);
    sigaddset(&want, SIGTERM);
    sigaddset(&want, SIGCHLD);
    if ((sfd = signalfd(-1, &want, SFD_CLOEXEC | SFD_NONBLOCK)) < 0 ||
        prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0)
        e = errno;
    else if (o->cgroup)
        e = keeper_enter_cgroup(o->cgroup);
    if (e) {
        keeper_report(rep_w, REP_SETUP_FAILED, e);
        _exit(0);
    }
    if (getppid() != parent)
        _exit(0); /* the parent is gone already */
    if (pipe2(ex, O_CLOEXEC) < 0) {
        keeper_report(rep_w, REP_SETUP_FAILED, errno);
        _exit(0);
    }
    self = getpid();
    if ((prog = fork()) < 0) {
        keeper_report(rep_w, REP_SETUP_FAILED, errno);
        _exit(0);
    }
    if (prog == 0)
        child_exec(argv, envp, cwd, true, false, cred, self, out_w, ex[1], -1);
    /* the program's output pipe is the program's: its end of file must
     * come when the last of the tree holding it is gone */
    close(out_w);
    close(ex[1]);
    while ((n = read(ex[0], &e, sizeof(e))) < 0 && errno == EINTR)
        ;
    close(ex[0]);
    if (n == (ssize_t)sizeof(e)) {
        while (waitpid(prog, NULL, 0) < 0 && errno == EINTR)
            ;
        keeper_report(rep_w, REP_EXEC_FAILED, e);
        _exit(0);
    }
    keeper_report(rep_w, REP_STARTED, (int)prog);
    keeper_watch(prog, parent, rep_w, sfd, o->grace);
}

int
spawn_keeper_adopted(int argc, char **argv)
{
    sigset_t all, want;
    char *end;
    long grace_ms, parent, prog, rep_w;
    int sfd, devnull;

    if (argc != 6 || strcmp(argv[1], SPAWN_KEEPER_ARG))
        return 2;
    grace_ms = strtol(argv[2], &end, 10);
    if (*end || grace_ms < 0)
        return 2;
    parent = strtol(argv[3], &end, 10);
    if (*end || parent <= 0)
        return 2;
    prog = strtol(argv[4], &end, 10);
    if (*end || prog <= 0)
        return 2;
    rep_w = strtol(argv[5], &end, 10);
    if (*end || rep_w <= STDERR_FILENO || rep_w > 65535)
        return 2;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    /* (its own group and the subreaper bit are the warm child's doing:
     * they had to be there before the program was forked) */
    if ((devnull = open("/dev/null", O_RDWR | O_CLOEXEC)) < 0 || dup2(devnull, 0) < 0 ||
        dup2(devnull, 1) < 0 || dup2(devnull, 2) < 0)
        return 127;
    close(devnull);
    keeper_close_all_but((int)rep_w, (int)rep_w);
    fcntl((int)rep_w, F_SETFD, FD_CLOEXEC);
    sigemptyset(&want);
    sigaddset(&want, SIGTERM);
    sigaddset(&want, SIGCHLD);
    if ((sfd = signalfd(-1, &want, SFD_CLOEXEC | SFD_NONBLOCK)) < 0 ||
        prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0) {
        keeper_report((int)rep_w, REP_SETUP_FAILED, errno);
        kill((pid_t)prog, SIGKILL);
        return 0;
    }
    keeper_report((int)rep_w, REP_STARTED, (int)prog);
    keeper_watch((pid_t)prog, (pid_t)parent, (int)rep_w, sfd, (double)grace_ms / 1000.0);
}

/* ---- in the parent ---- */

/* The output pipe and the report pipe of a child that runs what (both
 * close-on-exec). 0, or a negative errno with neither open. */
static int
two_pipes(int a[2], int b[2], const char *what, struct esd_err *err)
{
    int r;

    if (pipe2(a, O_CLOEXEC) < 0)
        return err_sys(err, -errno, "cannot create a pipe for %s", what);
    if (pipe2(b, O_CLOEXEC) < 0) {
        r = err_sys(err, -errno, "cannot create a pipe for %s", what);
        close(a[0]);
        close(a[1]);
        return r;
    }
    return 0;
}

/* spawn_start, with stderr on the pipe too (merge) or on /dev/null, as
 * cred unless it is NULL. */
static int
start(char *const *argv, char *const *envp, const char *cwd, bool merge,
      const struct spawn_cred *cred, int in_fd, struct spawned *ret, struct esd_err *err)
{
    int out[2], status[2], e = 0, r;
    pid_t pid, parent = getpid();
    sigset_t all, old;
    ssize_t n;

    if (!argv || !argv[0])
        return err_set(err, -EINVAL, "nothing to run");
    if ((r = two_pipes(out, status, argv[0], err)) < 0)
        return r;
    /* No handler of the parent's may run in the child before it has reset
     * them (libev's would write to the parent's wake-up pipe). */
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, &old);
    pid = fork();
    if (pid == 0)
        child_exec(argv, envp, cwd, merge, true, cred, parent, out[1], status[1], in_fd);
    e = errno;
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (pid < 0) {
        r = err_sys(err, -e, "cannot fork to run %s", argv[0]);
        close(out[0]);
        close(out[1]);
        close(status[0]);
        close(status[1]);
        return r;
    }
    /* Both sides set the group, so there is no window in which a signal to
     * the group would miss the child. */
    setpgid(pid, pid);
    close(out[1]);
    close(status[1]);
    while ((n = read(status[0], &e, sizeof(e))) < 0 && errno == EINTR)
        ;
    close(status[0]);
    if (n == (ssize_t)sizeof(e)) {
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
            ;
        close(out[0]);
        return err_set(err, -e, "cannot run %s%s%s: %s", argv[0], cwd ? " in " : "", cwd ? cwd : "",
                       strerror(e));
    }
    ret->pid = ret->proc = pid;
    ret->out_fd = out[0];
    ret->report_fd = -1;
    return 0;
}

int
spawn_start(char *const *argv, char *const *envp, const char *cwd, struct spawned *ret,
            struct esd_err *err)
{
    return start(argv, envp, cwd, true, NULL, -1, ret, err);
}

int
spawn_start_as(char *const *argv, char *const *envp, const char *cwd, const struct spawn_cred *cred,
               struct spawned *ret, struct esd_err *err)
{
    if (cred->uid == 0)
        return err_set(err, -EPERM, "refusing to run %s as root", argv && argv[0] ? argv[0] : "");
    return start(argv, envp, cwd, true, cred, -1, ret, err);
}

int
spawn_start_with_input(char *const *argv, char *const *envp, const char *cwd,
                       const struct spawn_cred *cred, int in_fd, struct spawned *ret,
                       struct esd_err *err)
{
    if (cred && cred->uid == 0)
        return err_set(err, -EPERM, "refusing to run %s as root", argv && argv[0] ? argv[0] : "");
    return start(argv, envp, cwd, true, cred, in_fd, ret, err);
}

int
spawn_keep(char *const *argv, char *const *envp, const char *cwd, const struct spawn_cred *cred,
           const struct spawn_keep_opts *o, struct spawned *ret, struct esd_err *err)
{
    int out[2], rep[2], e, r;
    pid_t pid, parent = getpid();
    sigset_t all, old;
    struct rep rec = { 0 };
    ssize_t n;

    if (!argv || !argv[0])
        return err_set(err, -EINVAL, "nothing to run");
    if (cred && cred->uid == 0)
        return err_set(err, -EPERM, "refusing to run %s as root", argv[0]);
    if ((r = two_pipes(out, rep, argv[0], err)) < 0)
        return r;
    sigfillset(&all);
    sigprocmask(SIG_SETMASK, &all, &old);
    pid = fork();
    if (pid == 0)
        keeper_main(argv, envp, cwd, cred, o, parent, out[1], rep[1]);
    e = errno;
    sigprocmask(SIG_SETMASK, &old, NULL);
    close(out[1]);
    close(rep[1]);
    if (pid < 0) {
        close(out[0]);
        close(rep[0]);
        return err_sys(err, -e, "cannot fork to run %s", argv[0]);
    }
    setpgid(pid, pid);
    while ((n = read(rep[0], &rec, sizeof(rec))) < 0 && errno == EINTR)
        ;
    if (n == (ssize_t)sizeof(rec) && rec.kind == REP_STARTED) {
        fcntl(rep[0], F_SETFL, fcntl(rep[0], F_GETFL) | O_NONBLOCK);
        ret->pid = pid;
        ret->proc = (pid_t)rec.value;
        ret->out_fd = out[0];
        ret->report_fd = rep[0];
        return 0;
    }
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    close(out[0]);
    close(rep[0]);
    if (n == (ssize_t)sizeof(rec) && rec.kind == REP_EXEC_FAILED)
        return err_set(err, -rec.value, "cannot run %s%s%s: %s", argv[0], cwd ? " in " : "",
                       cwd ? cwd : "", strerror(rec.value));
    if (n == (ssize_t)sizeof(rec) && rec.kind == REP_SETUP_FAILED)
        return err_set(err, -rec.value, "cannot set up the keeper of %s%s%s: %s", argv[0],
                       o->cgroup ? " in cgroup " : "", o->cgroup ? o->cgroup : "",
                       strerror(rec.value));
    return err_set(err, -ECHILD, "the keeper of %s ended before starting it", argv[0]);
}

int
spawn_keep_status(struct spawned *s, int keeper_status, int *ret_status)
{
    struct rep rec;
    bool got = false;
    int status = keeper_status;
    ssize_t n;

    if (s->report_fd < 0)
        return -EBADF;
    while ((n = read(s->report_fd, &rec, sizeof(rec))) == (ssize_t)sizeof(rec) ||
           (n < 0 && errno == EINTR))
        if (n > 0 && rec.kind == REP_EXITED) {
            status = rec.value;
            got = true;
        }
    close(s->report_fd);
    s->report_fd = -1;
    *ret_status = status;
    return got ? 0 : -ESRCH;
}

void
spawn_keep_read(struct spawned *s, struct spawn_keep_state *st)
{
    struct rep rec;
    ssize_t n;

    while (s->report_fd >= 0) {
        n = read(s->report_fd, &rec, sizeof(rec));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        if (n != (ssize_t)sizeof(rec)) {
            /* end of file (or a torn record: the keeper is not ours) */
            close(s->report_fd);
            s->report_fd = -1;
            st->eof = true;
            return;
        }
        if (rec.kind == REP_STARTED && !st->proc && rec.value > 0) {
            st->proc = s->proc = (pid_t)rec.value;
        } else if (rec.kind == REP_EXITED) {
            st->exited = true;
            st->status = rec.value;
        } else if ((rec.kind == REP_SETUP_FAILED || rec.kind == REP_EXEC_FAILED) && !st->failed) {
            st->failed = rec.value > 0 ? rec.value : EIO;
        }
    }
}

int
spawn_cred_for_uid(uid_t uid, struct spawn_cred *ret, struct esd_err *err)
{
    struct passwd pw, *res = NULL;
    size_t size = 1024;
    char *buf = NULL;
    gid_t *groups = NULL;
    int e, n = 32, got;

    for (;;) {
        buf = xrealloc(buf, size);
        e = getpwuid_r(uid, &pw, buf, size, &res);
        if (e != ERANGE || size >= PW_BUF_MAX)
            break;
        size *= 2;
    }
    if (e != 0 || !res) {
        free(buf);
        if (e != 0)
            return err_set(err, -e, "cannot look up uid %lu in the user database: %s",
                           (unsigned long)uid, strerror(e));
        return err_set(err, -ENOENT, "uid %lu has no entry in the user database (passwd)",
                       (unsigned long)uid);
    }
    for (;;) {
        groups = xrealloc(groups, (size_t)n * sizeof(*groups));
        got = n;
        if (getgrouplist(pw.pw_name, pw.pw_gid, groups, &got) >= 0)
            break;
        /* too small: got is the number needed */
        if (got <= n || got > GROUPS_MAX) {
            e = err_set(err, -E2BIG, "cannot take the groups of user %s (uid %lu): %d groups",
                        pw.pw_name, (unsigned long)uid, got);
            free(groups);
            free(buf);
            return e;
        }
        n = got;
    }
    memset(ret, 0, sizeof(*ret));
    ret->uid = uid;
    ret->gid = pw.pw_gid;
    ret->groups = groups;
    ret->ngroups = (size_t)got;
    ret->name = xstrdup(pw.pw_name);
    ret->home = xstrdup(pw.pw_dir ? pw.pw_dir : "/");
    ret->shell = xstrdup(pw.pw_shell && *pw.pw_shell ? pw.pw_shell : "/bin/sh");
    free(buf);
    return 0;
}

bool
spawn_env_allowed(const struct strv *allow, const char *entry)
{
    size_t n = strcspn(entry, "=");

    for (size_t i = 0; i < allow->n; i++) {
        const char *p = allow->v[i];
        size_t pn = strlen(p);

        if (pn && p[pn - 1] == '*' ? pn - 1 <= n && !strncmp(entry, p, pn - 1)
                                   : pn == n && !strncmp(entry, p, n))
            return true;
    }
    return false;
}

void
spawn_env_base(const struct strv *allow, const struct spawn_cred *cred,
               bool (*skip)(const char *entry), struct strv *out)
{
    extern char **environ;
    static const char *const fixed[] = { "HOME=", "USER=", "LOGNAME=", "SHELL=", "PATH=" };
    const char *path = getenv("PATH");

    for (char **e = environ; e && *e; e++) {
        bool set_here = false;

        for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
            set_here |= !strncmp(*e, fixed[i], strlen(fixed[i]));
        if (!set_here && !(skip && skip(*e)) && spawn_env_allowed(allow, *e))
            strv_push(out, *e);
    }
    strv_push_owned(out, xasprintf("HOME=%s", cred->home));
    strv_push_owned(out, xasprintf("USER=%s", cred->name));
    strv_push_owned(out, xasprintf("LOGNAME=%s", cred->name));
    strv_push_owned(out, xasprintf("SHELL=%s", cred->shell));
    strv_push_owned(out, xasprintf("PATH=%s", path && *path ? path : SPAWN_DEFAULT_PATH));
}

void
spawn_cred_free(struct spawn_cred *c)
{
    free(c->groups);
    free(c->name);
    free(c->home);
    free(c->shell);
    memset(c, 0, sizeof(*c));
}

void
spawn_signal(const struct spawned *s, int sig)
{
    if (s->pid > 0)
        kill(-s->pid, sig);
}

void
spawn_describe(int status, char out[64], int *ret_code)
{
    if (WIFEXITED(status)) {
        *ret_code = WEXITSTATUS(status);
        snprintf(out, 64, "exit code %d", *ret_code);
    } else if (WIFSIGNALED(status)) {
        *ret_code = -WTERMSIG(status);
        snprintf(out, 64, "killed by signal %d (%s)", WTERMSIG(status),
                 sigabbrev_np(WTERMSIG(status)) ? sigabbrev_np(WTERMSIG(status)) : "?");
    } else {
        *ret_code = -1;
        snprintf(out, 64, "status %d", status);
    }
}

int
spawn_capture(char *const *argv, const char *cwd, double timeout, size_t max, struct buf *out,
              int *ret_status, struct esd_err *err)
{
    extern char **environ;
    struct spawned sp;
    double deadline = time_mono() + timeout;
    bool eof = false;
    int status = 0, r;

    if ((r = start(argv, environ, cwd, false, NULL, -1, &sp, err)) < 0)
        return r;
    while (!eof) {
        struct pollfd p = { .fd = sp.out_fd, .events = POLLIN };
        double left = deadline - time_mono();
        char chunk[4096];
        ssize_t n;

        if (left <= 0) {
            spawn_signal(&sp, SIGKILL);
            close(sp.out_fd);
            while (waitpid(sp.pid, NULL, 0) < 0 && errno == EINTR)
                ;
            return err_set(err, -ETIMEDOUT, "%s did not finish within %.0f s", argv[0], timeout);
        }
        if (poll(&p, 1, (int)(left * 1000) + 1) <= 0)
            continue;
        n = read(sp.out_fd, chunk, sizeof(chunk));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            eof = true;
        else if (out->len < max)
            buf_append(out, chunk, (size_t)n < max - out->len ? (size_t)n : max - out->len);
    }
    close(sp.out_fd);
    while (waitpid(sp.pid, &status, 0) < 0 && errno == EINTR)
        ;
    *ret_status = status;
    return 0;
}

void
spawn_close_sockets(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int self;

    if (!d)
        return;
    self = dirfd(d);
    while ((e = readdir(d))) {
        struct stat st;
        char *end;
        long fd = strtol(e->d_name, &end, 10);

        if (*end || end == e->d_name || fd <= 2 || fd == self)
            continue;
        if (fstat((int)fd, &st) == 0 && S_ISSOCK(st.st_mode))
            close((int)fd);
    }
    closedir(d);
}
