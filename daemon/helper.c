/*
 * helper: the helper children's one set-up (helper.h), their liveness tick
 * and the guard that kills the silent or overdue ones.
 */
#include "helper.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fsutil.h"
#include "spawn.h"

static double silence_secs = HELPER_SILENCE_SECS;

/* ---- in the child ---- */

static int tick_fd = -1;

static void
tick(int sig)
{
    int saved = errno;

    (void)sig;
    (void)!write(tick_fd, "\n", 1);
    errno = saved;
}

/* Closes every descriptor above 2 but keep. */
static void
close_all_but(int keep)
{
    if (keep > 3)
        syscall(SYS_close_range, 3U, (unsigned)keep - 1, 0U);
    if (syscall(SYS_close_range, (unsigned)keep + 1, ~0U, 0U) == 0)
        return;
    /* (no close_range: the kernel is older than 5.9) */
    for (int fd = 3; fd < 65536; fd++)
        if (fd != keep)
            close(fd);
}

/* Everything helper_fork does in the child; false if it failed. */
static bool
child_setup(const struct helper_id *who, int fd, pid_t parent)
{
    struct sigaction sa = { .sa_handler = SIG_DFL };
    struct itimerval it = { { HELPER_TICK_SECS, 0 }, { HELPER_TICK_SECS, 0 } };
    sigset_t all;
    int null;

    setpgid(0, 0);
    for (int sig = 1; sig < NSIG; sig++)
        if (sig != SIGKILL && sig != SIGSTOP)
            sigaction(sig, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    close_all_but(fd);
    if ((null = open("/dev/null", O_RDWR | O_CLOEXEC)) >= 0) {
        dup2(null, STDIN_FILENO);
        dup2(null, STDOUT_FILENO);
        if (null > STDERR_FILENO)
            close(null);
    }
    /* groups first: setresuid gives up the right to change them */
    if (who && who->change) {
        if (who->uid == 0 || setgroups(who->ngroups, who->groups) < 0 ||
            setresgid(who->gid, who->gid, who->gid) < 0 ||
            setresuid(who->uid, who->uid, who->uid) < 0 || setuid(0) == 0)
            return false;
        /* what it creates is the owner's, with the owner's usual mode */
        umask(022);
    }
    /* after the identity change, which clears it */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0 || getppid() != parent)
        return false;
    tick_fd = fd;
    sa.sa_handler = tick;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL);
    setitimer(ITIMER_REAL, &it, NULL);
    return true;
}

pid_t
helper_fork(const char *what, const struct helper_id *who, int *ret_fd, struct esd_err *err)
{
    pid_t parent = getpid(), pid;
    int fds[2];

    if (pipe2(fds, O_CLOEXEC) < 0)
        return err_sys(err, -errno, "cannot start the %s process", what);
    pid = fork();
    if (pid < 0) {
        int r = err_sys(err, -errno, "cannot start the %s process", what);

        close(fds[0]);
        close(fds[1]);
        return r;
    }
    if (pid == 0) {
        close(fds[0]);
        if (!child_setup(who, fds[1], parent))
            _exit(HELPER_EXIT_SETUP);
        *ret_fd = fds[1];
        return 0;
    }
    /* both sides set the group: no window in which kill(-pid) misses it */
    setpgid(pid, pid);
    close(fds[1]);
    fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    *ret_fd = fds[0];
    return pid;
}

int
helper_write(int fd, const void *data, size_t len)
{
    sigset_t alrm, old;
    int r;

    sigemptyset(&alrm);
    sigaddset(&alrm, SIGALRM);
    sigprocmask(SIG_BLOCK, &alrm, &old);
    r = fs_write_all(fd, data, len);
    sigprocmask(SIG_SETMASK, &old, NULL);
    return r;
}

void
helper_describe(int status, char out[96])
{
    int code;

    if (WIFEXITED(status) && WEXITSTATUS(status) == HELPER_EXIT_SETUP) {
        snprintf(out, 96, "could not take its identity");
        return;
    }
    spawn_describe(status, out, &code);
}

/* ---- in esd ---- */

static void
guard_kill(struct helper_guard *g, struct ev_loop *loop, const char *why)
{
    if (g->fired || g->pid <= 0)
        return;
    g->fired = true;
    log_warning(&g->ctx, "the %s process %d %s: killing it", g->what, (int)g->pid, why);
    kill(-g->pid, SIGKILL);
    kill(g->pid, SIGKILL);
    helper_guard_stop(g, loop);
}

static void
guard_silence_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct helper_guard *g = w->data;
    char why[96];

    (void)revents;
    snprintf(why, sizeof(why), "sent nothing for %.0f s (stopped, or stuck)", silence_secs);
    guard_kill(g, loop, why);
}

static void
guard_limit_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct helper_guard *g = w->data;
    char why[96];

    (void)revents;
    snprintf(why, sizeof(why), "ran longer than its limit of %.0f s", g->limit);
    guard_kill(g, loop, why);
}

void
helper_guard_start(struct helper_guard *g, struct ev_loop *loop, pid_t pid, const char *what,
                   const struct log_ctx *ctx, double limit)
{
    memset(g, 0, sizeof(*g));
    g->pid = pid;
    g->what = what;
    if (ctx)
        g->ctx = *ctx;
    g->limit = limit;
    ev_init(&g->silence_w, guard_silence_cb);
    g->silence_w.repeat = silence_secs;
    g->silence_w.data = g;
    ev_timer_again(loop, &g->silence_w);
    ev_timer_init(&g->limit_w, guard_limit_cb, limit, 0);
    g->limit_w.data = g;
    if (limit > 0)
        ev_timer_start(loop, &g->limit_w);
}

void
helper_guard_fed(struct helper_guard *g, struct ev_loop *loop)
{
    if (g->pid > 0 && ev_is_active(&g->silence_w))
        ev_timer_again(loop, &g->silence_w);
}

void
helper_guard_pause(struct helper_guard *g, struct ev_loop *loop, bool pause)
{
    if (g->fired || !g->pid)
        return;
    if (pause)
        ev_timer_stop(loop, &g->silence_w);
    else
        ev_timer_again(loop, &g->silence_w);
}

void
helper_guard_stop(struct helper_guard *g, struct ev_loop *loop)
{
    ev_timer_stop(loop, &g->silence_w);
    ev_timer_stop(loop, &g->limit_w);
    /* (its pid may be another process's soon: never signalled again) */
    g->pid = 0;
}

void
helper_test_set_silence(double secs)
{
    silence_secs = secs;
}
