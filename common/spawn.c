/*
 * spawn: fork+exec with a process group, one output pipe and an exec
 * failure channel (a CLOEXEC pipe that only a failed exec writes to).
 */
#include "spawn.h"

#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* (TEMP until the env branch lands) */
#define PW_BUF_MAX ((size_t)1 << 20)
#define GROUPS_MAX 65536

/* spawn_start, with stderr on the pipe too (merge) or on /dev/null, as
 * uid/gid unless uid is (uid_t)-1. */
static int
start(char *const *argv, char *const *envp, const char *cwd, bool merge, uid_t uid, gid_t gid,
      struct spawned *ret, struct esd_err *err)
{
    int out[2], status[2], e = 0, r;
    pid_t pid, parent = getpid();
    ssize_t n;

    if (!argv || !argv[0])
        return err_set(err, -EINVAL, "Nothing to run");
    if (pipe2(out, O_CLOEXEC) < 0)
        return err_sys(err, -errno, "Cannot create a pipe for %s", argv[0]);
    if (pipe2(status, O_CLOEXEC) < 0) {
        r = err_sys(err, -errno, "Cannot create a pipe for %s", argv[0]);
        close(out[0]);
        close(out[1]);
        return r;
    }
    pid = fork();
    if (pid < 0) {
        r = err_sys(err, -errno, "Cannot fork to run %s", argv[0]);
        close(out[0]);
        close(out[1]);
        close(status[0]);
        close(status[1]);
        return r;
    }
    if (pid == 0) {
        /* Only async-signal-safe calls from here on. */
        sigset_t all;

        setpgid(0, 0);
        sigemptyset(&all);
        sigprocmask(SIG_SETMASK, &all, NULL);
        signal(SIGPIPE, SIG_DFL);
        int devnull = open("/dev/null", O_RDWR);

        /* groups first: setuid gives up the right to change them */
        if (uid != (uid_t)-1 &&
            (setgroups(1, &gid) < 0 || setgid(gid) < 0 || setuid(uid) < 0 || setuid(0) == 0)) {
            e = errno ? errno : EPERM;
        } else if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0) {
            /* after the uid change, which clears it: the child dies with
             * its parent, so that a crashed esd leaves no attempt behind
             * to run on under a lease that nobody renews */
            e = errno;
        } else if (getppid() != parent) {
            _exit(127); /* the parent died before the line above */
        } else if (devnull < 0 || dup2(out[1], STDOUT_FILENO) < 0 ||
            dup2(merge ? out[1] : devnull, STDERR_FILENO) < 0 ||
            dup2(devnull, STDIN_FILENO) < 0 || (cwd && chdir(cwd) < 0)) {
            e = errno;
        } else {
            if (devnull > STDERR_FILENO)
                close(devnull);
            execvpe(argv[0], argv, envp);
            e = errno;
        }
        (void)!write(status[1], &e, sizeof(e));
        _exit(127);
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
        return err_set(err, -e, "Cannot run %s%s%s: %s", argv[0], cwd ? " in " : "",
                       cwd ? cwd : "", strerror(e));
    }
    ret->pid = pid;
    ret->out_fd = out[0];
    return 0;
}

int
spawn_start(char *const *argv, char *const *envp, const char *cwd, struct spawned *ret,
            struct esd_err *err)
{
    return start(argv, envp, cwd, true, (uid_t)-1, (gid_t)-1, ret, err);
}

int
spawn_start_as(char *const *argv, char *const *envp, const char *cwd, uid_t uid, gid_t gid,
               struct spawned *ret, struct esd_err *err)
{
    if (uid == 0)
        return err_set(err, -EPERM, "Refusing to run %s as root", argv && argv[0] ? argv[0] : "");
    return start(argv, envp, cwd, true, uid, gid, ret, err);
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
            return err_set(err, -e, "Cannot look up uid %lu in the user database: %s",
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
            e = err_set(err, -E2BIG, "Cannot take the groups of user %s (uid %lu): %d groups",
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
spawn_capture(char *const *argv, const char *cwd, double timeout, size_t max,
              struct buf *out, int *ret_status, struct esd_err *err)
{
    extern char **environ;
    struct spawned sp;
    double deadline = time_mono() + timeout;
    bool eof = false;
    int status = 0, r;

    if ((r = start(argv, environ, cwd, false, (uid_t)-1, (gid_t)-1, &sp, err)) < 0)
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
