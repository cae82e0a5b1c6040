/*
 * check_helper: the helper children's one set-up: a process group of its
 * own, no descriptor of the parent's but 0-2 and the report pipe, default
 * signal dispositions (SIGPIPE ignored) and an empty mask, the identity
 * asked for (as root), a death signal, the liveness tick, and the guard
 * that kills a helper that falls silent (SIGSTOP) or runs past its limit.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <ev.h>

#include "helper.h"
#include "testutil.h"
#include "util.h"

/* Reads fd until EOF (a blocking read of the non-blocking pipe). */
static char *
drain(int fd)
{
    struct buf b;
    char chunk[4096];

    buf_init(&b);
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    for (;;) {
        ssize_t n = read(fd, chunk, sizeof(chunk));

        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        buf_append(&b, chunk, (size_t)n);
    }
    buf_putc(&b, '\0');
    return b.p;
}

/* In the helper: what it sees of itself, as a line. */
static void __attribute__((noreturn)) report_self(int fd)
{
    struct sigaction sa;
    sigset_t mask;
    char line[512];
    int fds = 0, ign = 0, handled = 0, death = 0;

    for (int i = 3; i < 1024; i++)
        if (i != fd && fcntl(i, F_GETFD) >= 0)
            fds++;
    for (int sig = 1; sig < NSIG; sig++) {
        if (sig == SIGKILL || sig == SIGSTOP || sigaction(sig, NULL, &sa) < 0)
            continue;
        if (sa.sa_handler == SIG_IGN && sig != SIGPIPE)
            ign++;
        if (sa.sa_handler != SIG_IGN && sa.sa_handler != SIG_DFL && sig != SIGALRM)
            handled++;
    }
    sigprocmask(SIG_SETMASK, NULL, &mask);
    prctl(PR_GET_PDEATHSIG, &death);
    snprintf(line, sizeof(line),
             "fds=%d ign=%d handled=%d masked=%d pgid_is_pid=%d death=%d "
             "uid=%u gid=%u groups=%d\n",
             fds, ign, handled, sigismember(&mask, SIGTERM), getpgid(0) == getpid(), death,
             (unsigned)getuid(), (unsigned)getgid(), getgroups(0, NULL));
    helper_write(fd, line, strlen(line));
    _exit(0);
}

static void
ignore(int sig)
{
    (void)sig;
}

START_TEST(test_helper_setup)
{
    struct esd_err err;
    int fd, leak = open("/dev/null", O_RDONLY), status;
    sigset_t term;
    pid_t pid;
    char *out;

    /* what a daemon has: a descriptor without O_CLOEXEC, ignored and
     * handled signals, a blocked SIGTERM */
    ck_assert_int_ge(leak, 0);
    signal(SIGHUP, SIG_IGN);
    signal(SIGUSR1, ignore);
    sigemptyset(&term);
    sigaddset(&term, SIGTERM);
    sigprocmask(SIG_BLOCK, &term, NULL);
    pid = helper_fork("test", NULL, &fd, &err);
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        report_self(fd);
    out = drain(fd);
    close(fd);
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ck_assert_msg(strstr(out, "fds=0 ign=0 handled=0 masked=0 pgid_is_pid=1 death=9 "), "%s", out);
    free(out);
    close(leak);
}
END_TEST

/* As root: the identity asked for, with exactly its groups. */
START_TEST(test_helper_identity)
{
    const gid_t groups[] = { 65534, 4242 };
    struct helper_id who = {
        .change = true, .uid = 65534, .gid = 65534, .groups = groups, .ngroups = 2
    };
    struct helper_id root = { .change = true, .uid = 0, .gid = 0 };
    struct esd_err err;
    int fd, status;
    pid_t pid;
    char *out;

    if (geteuid() != 0)
        return;
    pid = helper_fork("test", &who, &fd, &err);
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        report_self(fd);
    out = drain(fd);
    close(fd);
    waitpid(pid, &status, 0);
    ck_assert_msg(strstr(out, "uid=65534 gid=65534 groups=2"), "%s", out);
    free(out);
    /* never root: the child refuses and says nothing */
    pid = helper_fork("test", &root, &fd, &err);
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        report_self(fd);
    out = drain(fd);
    close(fd);
    waitpid(pid, &status, 0);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == HELPER_EXIT_SETUP);
    ck_assert_str_eq(out, "");
    free(out);
}
END_TEST

/* The guard's test bed: one helper, its pipe and its end, in a loop. */
struct bed {
    struct helper_guard g;
    ev_io io;
    ev_child child;
    int status, ticks;
    bool exited;
};

static void
bed_io_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    struct bed *b = w->data;
    char c[256];
    ssize_t n = read(w->fd, c, sizeof(c));

    (void)revents;
    if (n > 0) {
        for (ssize_t i = 0; i < n; i++)
            b->ticks += c[i] == '\n';
        helper_guard_fed(&b->g, loop);
    } else if (n == 0 || errno != EAGAIN) {
        ev_io_stop(loop, w);
    }
}

static void
bed_child_cb(struct ev_loop *loop, ev_child *w, int revents)
{
    struct bed *b = w->data;

    (void)revents;
    ev_child_stop(loop, w);
    helper_guard_stop(&b->g, loop);
    b->status = w->rstatus;
    b->exited = true;
    ev_break(loop, EVBREAK_ALL);
}

/* Runs a helper that sleeps for ever, stopped with SIGSTOP when stop is
 * true, under a guard of the given limit; returns what the loop saw. */
static void
run_guarded(bool stop, double limit, struct bed *b)
{
    struct ev_loop *loop = ev_default_loop(0);
    struct esd_err err;
    int fd;
    pid_t pid;

    memset(b, 0, sizeof(*b));
    pid = helper_fork("sleeper", NULL, &fd, &err);
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        for (;;)
            pause();
    }
    if (stop)
        kill(pid, SIGSTOP);
    ev_io_init(&b->io, bed_io_cb, fd, EV_READ);
    b->io.data = b;
    ev_io_start(loop, &b->io);
    ev_child_init(&b->child, bed_child_cb, pid, 0);
    b->child.data = b;
    ev_child_start(loop, &b->child);
    helper_guard_start(&b->g, loop, pid, "sleeper", NULL, limit);
    ev_run(loop, 0);
    ev_io_stop(loop, &b->io);
    close(fd);
}

START_TEST(test_guard_kills_a_silent_helper)
{
    struct bed b;

    helper_test_set_silence(2);
    run_guarded(true, 0, &b);
    ck_assert(b.exited && b.g.fired);
    ck_assert(WIFSIGNALED(b.status) && WTERMSIG(b.status) == SIGKILL);
    ck_assert_int_eq(b.ticks, 0);
}
END_TEST

/* A live helper ticks and is not silent; its limit ends it. */
START_TEST(test_guard_limit_and_ticks)
{
    struct bed b;

    helper_test_set_silence(HELPER_TICK_SECS + 3);
    run_guarded(false, HELPER_TICK_SECS * 2 + 1, &b);
    ck_assert(b.exited && b.g.fired);
    ck_assert(WIFSIGNALED(b.status) && WTERMSIG(b.status) == SIGKILL);
    ck_assert_int_ge(b.ticks, 1);
}
END_TEST

START_TEST(test_describe)
{
    char how[96];

    helper_describe(W_EXITCODE(HELPER_EXIT_SETUP, 0), how);
    ck_assert_str_eq(how, "could not take its identity");
    helper_describe(W_EXITCODE(0, SIGKILL), how);
    ck_assert_str_eq(how, "killed by signal 9 (KILL)");
}
END_TEST

static Suite *
helper_suite(void)
{
    Suite *s = suite_create("helper");
    TCase *tc = tcase_create("helper");

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_helper_setup);
    tcase_add_test(tc, test_helper_identity);
    tcase_add_test(tc, test_guard_kills_a_silent_helper);
    tcase_add_test(tc, test_guard_limit_and_ticks);
    tcase_add_test(tc, test_describe);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(helper_suite());
}
