/*
 * spawn: fork+exec with a process group, one output pipe and an exec
 * failure channel (a CLOEXEC pipe that only a failed exec writes to).
 */
#include "spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int
spawn_start(char *const *argv, char *const *envp, const char *cwd, struct spawned *ret,
            struct esd_err *err)
{
    int out[2], status[2], e = 0, r;
    pid_t pid;
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
        if (dup2(out[1], STDOUT_FILENO) < 0 || dup2(out[1], STDERR_FILENO) < 0 ||
            (cwd && chdir(cwd) < 0)) {
            e = errno;
        } else {
            int devnull = open("/dev/null", O_RDONLY);
            if (devnull >= 0) {
                dup2(devnull, STDIN_FILENO);
                if (devnull != STDIN_FILENO)
                    close(devnull);
            }
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
