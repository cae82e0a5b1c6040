/*
 * check_spawn: how attempts are started: stdout and stderr on one pipe, a
 * process group of its own, the given environment and working directory,
 * nothing inherited but descriptors 0-2 (with close_range and without
 * it), every signal at its default and unblocked, the credentials given
 * (supplementary groups included; as root only) and read from the user
 * database, exec failures reported as errors (and no zombie), the whole
 * tree signalled, and wait statuses described as the reference words them;
 * spawn_keep's keeper: the program in its group, its status reported, and
 * nothing left of its tree (what left the group with setsid included)
 * when the program exits, after a stop and its grace, or when the keeper's
 * parent dies.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <grp.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fsutil.h"
#include "spawn.h"
#include "testutil.h"
#include "util.h"

static char *tmp;

static void
tmp_setup(void)
{
    tmp = tu_tmpdir();
}

static void
tmp_teardown(void)
{
    fs_rm_rf(tmp);
    free(tmp);
}

/* A NULL-terminated vector of copies of the arguments, which end with
 * NULL (strv_free). */
static struct strv
vec(const char *first, ...)
{
    struct strv v;
    va_list ap;

    strv_init(&v);
    va_start(ap, first);
    for (const char *s = first; s; s = va_arg(ap, const char *))
        strv_push(&v, s);
    va_end(ap);
    return v;
}

/* Reads fd to EOF (10 s at most between chunks). Caller frees. */
static char *
read_all(int fd)
{
    struct buf b;
    char chunk[4096];
    ssize_t n;

    buf_init(&b);
    buf_puts(&b, "");
    for (;;) {
        struct pollfd p = { .fd = fd, .events = POLLIN };

        ck_assert_msg(poll(&p, 1, 10000) == 1, "no output or EOF within 10 s");
        n = read(fd, chunk, sizeof(chunk));
        if (n < 0 && errno == EINTR)
            continue;
        ck_assert_int_ge(n, 0);
        if (n == 0)
            break;
        buf_append(&b, chunk, (size_t)n);
    }
    return buf_steal(&b);
}

static int
wait_for(pid_t pid)
{
    int st;

    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    return st;
}

START_TEST(test_spawn_output_and_status)
{
    struct strv argv =
        vec("sh", "-c", "echo out; echo err >&2; cat; echo \"$GREETING\"; exit 3", NULL);
    struct strv envp = vec("GREETING=hello", "PATH=/usr/bin:/bin", NULL);
    struct spawned s;
    struct esd_err err;
    char how[64], *text;
    int code = 0;

    ck_assert_msg(spawn_start(argv.v, envp.v, NULL, &s, &err) == 0, "%s", err.msg);
    ck_assert_int_gt(s.pid, 0);
    ck_assert(fcntl(s.out_fd, F_GETFD) & FD_CLOEXEC);
    /* stdout and stderr in one pipe, stdin empty, envp as given. */
    text = read_all(s.out_fd);
    ck_assert_str_eq(text, "out\nerr\nhello\n");
    close(s.out_fd);
    spawn_describe(wait_for(s.pid), how, &code);
    ck_assert_str_eq(how, "exit code 3");
    ck_assert_int_eq(code, 3);
    free(text);
    strv_free(&argv);
    strv_free(&envp);
}
END_TEST

START_TEST(test_spawn_cwd)
{
    struct strv argv = vec("pwd", NULL);
    char *want, *text, real[PATH_MAX];
    struct spawned s;
    struct esd_err err;

    ck_assert_ptr_nonnull(realpath(tmp, real));
    ck_assert_msg(spawn_start(argv.v, environ, tmp, &s, &err) == 0, "%s", err.msg);
    text = read_all(s.out_fd);
    close(s.out_fd);
    want = xasprintf("%s\n", real);
    ck_assert_str_eq(text, want);
    ck_assert(WIFEXITED(wait_for(s.pid)));
    free(text);
    free(want);
    strv_free(&argv);
}
END_TEST

START_TEST(test_spawn_own_process_group)
{
    struct strv argv = vec("sleep", "100", NULL);
    struct spawned s;
    struct esd_err err;
    char how[64];
    int code = 0;

    ck_assert_msg(spawn_start(argv.v, environ, NULL, &s, &err) == 0, "%s", err.msg);
    ck_assert_int_eq(getpgid(s.pid), s.pid);
    ck_assert_int_ne(getpgid(0), s.pid);
    spawn_signal(&s, SIGKILL);
    spawn_describe(wait_for(s.pid), how, &code);
    ck_assert_str_eq(how, "killed by signal 9 (KILL)");
    ck_assert_int_eq(code, -9);
    close(s.out_fd);
    /* Signalling a group that is gone is harmless. */
    spawn_signal(&s, SIGKILL);
    strv_free(&argv);
}
END_TEST

START_TEST(test_spawn_signal_reaches_grandchildren)
{
    /* The shell's child inherits the pipe: EOF only once both are dead. */
    struct strv argv = vec("sh", "-c", "sleep 100 & echo started; wait", NULL);
    struct spawned s;
    struct esd_err err;
    char line[16] = { 0 }, how[64], *rest;
    int code = 0;
    ssize_t n;

    ck_assert_msg(spawn_start(argv.v, environ, NULL, &s, &err) == 0, "%s", err.msg);
    n = read(s.out_fd, line, 8);
    ck_assert_int_eq(n, 8);
    ck_assert_str_eq(line, "started\n");
    spawn_signal(&s, SIGKILL);
    rest = read_all(s.out_fd);
    ck_assert_str_eq(rest, "");
    spawn_describe(wait_for(s.pid), how, &code);
    ck_assert_str_eq(how, "killed by signal 9 (KILL)");
    close(s.out_fd);
    free(rest);
    strv_free(&argv);
}
END_TEST

/* A child dies with its parent: an intermediate process spawns sleep and
 * exits; the sleep, handed to this process (a subreaper for the test),
 * must end killed by SIGKILL rather than run its 5 s. */
START_TEST(test_spawn_child_dies_with_parent)
{
    int p[2], status, code = 0;
    pid_t mid, child = 0;
    char how[64];

    ck_assert_int_eq(prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), 0);
    ck_assert_int_eq(pipe(p), 0);
    mid = fork();
    ck_assert_int_ge(mid, 0);
    if (mid == 0) {
        struct strv argv = vec("sleep", "5", NULL);
        struct spawned s;
        struct esd_err err;

        if (spawn_start(argv.v, environ, NULL, &s, &err) < 0)
            _exit(1);
        (void)!write(p[1], &s.pid, sizeof(s.pid));
        _exit(0);
    }
    close(p[1]);
    ck_assert_int_eq(read(p[0], &child, sizeof(child)), (ssize_t)sizeof(child));
    close(p[0]);
    ck_assert_int_eq(waitpid(mid, &status, 0), mid);
    ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    spawn_describe(wait_for(child), how, &code);
    ck_assert_str_eq(how, "killed by signal 9 (KILL)");
}
END_TEST

START_TEST(test_spawn_exec_failures)
{
    struct strv missing = vec("esd-no-such-program", NULL);
    struct strv absent = vec("/nonexistent/dj-process", NULL);
    struct strv ok = vec("true", NULL);
    char *noexec[] = { NULL, NULL };
    char *none[] = { NULL };
    struct spawned s = { .pid = -7, .out_fd = -7 };
    struct esd_err err;

    ck_assert_int_eq(spawn_start(missing.v, environ, NULL, &s, &err), -ENOENT);
    ck_assert_ptr_nonnull(strstr(err.msg, "esd-no-such-program"));
    ck_assert_int_eq(spawn_start(absent.v, environ, NULL, &s, &err), -ENOENT);
    ck_assert_ptr_nonnull(strstr(err.msg, "/nonexistent/dj-process"));
    ck_assert_int_eq(spawn_start(ok.v, environ, "/nonexistent-dir", &s, &err), -ENOENT);
    ck_assert_ptr_nonnull(strstr(err.msg, "/nonexistent-dir"));
    noexec[0] = tu_write(tmp, "script", "#!/bin/sh\nexit 0\n", (size_t)-1);
    ck_assert_int_eq(spawn_start(noexec, environ, NULL, &s, &err), -EACCES);
    ck_assert_ptr_nonnull(strstr(err.msg, noexec[0]));
    ck_assert_int_eq(spawn_start(none, environ, NULL, &s, &err), -EINVAL);
    /* Failed children were reaped, and nothing was returned. */
    errno = 0;
    ck_assert_int_eq(waitpid(-1, NULL, WNOHANG), -1);
    ck_assert_int_eq(errno, ECHILD);
    ck_assert_int_eq(s.pid, -7);
    ck_assert_int_eq(s.out_fd, -7);
    free(noexec[0]);
    strv_free(&missing);
    strv_free(&absent);
    strv_free(&ok);
}
END_TEST

/* The output of argv, started with spawn_start (cred NULL) or
 * spawn_start_as, after it exited 0. Caller frees. */
static char *
output_of(const struct strv *argv, const struct spawn_cred *cred)
{
    struct spawned s;
    struct esd_err err;
    char *text;
    int st, r;

    r = cred ? spawn_start_as(argv->v, environ, NULL, cred, &s, &err)
             : spawn_start(argv->v, environ, NULL, &s, &err);
    ck_assert_msg(r == 0, "%s", err.msg);
    text = read_all(s.out_fd);
    close(s.out_fd);
    st = wait_for(s.pid);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s failed: %s", argv->v[0], text);
    return text;
}

/* Descriptors the parent holds without O_CLOEXEC (a low one and a high
 * one) do not reach the child: the shell lists its own 0, 1, 2 only. */
static void
only_stdio_inherited(void)
{
    struct strv argv = vec("sh", "-c", "ls /proc/$$/fd", NULL);
    int low = open("/dev/null", O_RDONLY), high;
    char *text;

    ck_assert_int_ge(low, 3);
    ck_assert_int_eq(fcntl(low, F_GETFD) & FD_CLOEXEC, 0);
    high = dup2(low, 700);
    ck_assert_int_eq(high, 700);
    text = output_of(&argv, NULL);
    ck_assert_str_eq(text, "0\n1\n2\n");
    /* the parent's stay open */
    ck_assert_int_eq(fcntl(low, F_GETFD), 0);
    ck_assert_int_eq(fcntl(high, F_GETFD), 0);
    close(low);
    close(high);
    free(text);
    strv_free(&argv);
}

START_TEST(test_spawn_closes_descriptors)
{
    only_stdio_inherited();
}
END_TEST

/* As on a kernel without close_range(2) (before 5.9): a seccomp filter
 * makes it fail with ENOSYS in this (forked) test process, and the child
 * still closes everything through /proc/self/fd. */
START_TEST(test_spawn_closes_descriptors_without_close_range)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_close_range, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = { .len = sizeof(f) / sizeof(f[0]), .filter = f };

    ck_assert_int_eq(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
    ck_assert_int_eq(prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog), 0);
    errno = 0;
    ck_assert_int_eq(close_range(900, 901, 0), -1);
    ck_assert_int_eq(errno, ENOSYS);
    only_stdio_inherited();
}
END_TEST

/* The child gets no ignored and no blocked signal from its parent (esd
 * ignores SIGPIPE; an ignored SIGPIPE would survive the exec). */
START_TEST(test_spawn_default_signals)
{
    struct strv argv = vec("grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status", NULL);
    struct sigaction ign = { .sa_handler = SIG_IGN };
    sigset_t block;
    char *text;

    sigemptyset(&ign.sa_mask);
    ck_assert_int_eq(sigaction(SIGPIPE, &ign, NULL), 0);
    ck_assert_int_eq(sigaction(SIGINT, &ign, NULL), 0);
    ck_assert_int_eq(sigaction(SIGRTMIN + 2, &ign, NULL), 0);
#if defined(__x86_64__) || defined(__aarch64__)
    {
        /* a signal the C library keeps to itself (its sigaction refuses
         * it), ignored through the kernel's, whose layout here starts with
         * the handler */
        struct {
            void (*handler)(int);
            unsigned long flags;
            void *restorer;
            unsigned long mask;
        } kign = { .handler = SIG_IGN };

        ck_assert_int_eq(syscall(SYS_rt_sigaction, SIGRTMIN - 1, &kign, NULL, 8), 0);
    }
#endif
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGUSR1);
    ck_assert_int_eq(sigprocmask(SIG_BLOCK, &block, NULL), 0);
    text = output_of(&argv, NULL);
    ck_assert_str_eq(text, "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\n");
    free(text);
    /* the parent's are untouched */
    ck_assert_int_eq(sigaction(SIGPIPE, NULL, &ign), 0);
    ck_assert_ptr_eq((void *)ign.sa_handler, (void *)SIG_IGN);
    ck_assert_int_eq(sigprocmask(SIG_BLOCK, NULL, &block), 0);
    ck_assert(sigismember(&block, SIGTERM));
    strv_free(&argv);
}
END_TEST

/* Root: the child has exactly the uid, primary group and supplementary
 * groups given, none of the parent's, and cannot become root again. */
START_TEST(test_spawn_as_credentials)
{
    struct strv argv = vec("grep", "-E", "^(Uid|Gid|Groups):", "/proc/self/status", NULL);
    struct strv back = vec("sh", "-c", "chroot / true 2>/dev/null || echo not root", NULL);
    gid_t groups[] = { 4343, 65534, 4242 };
    struct spawn_cred cred = { .uid = 65534, .gid = 4242, .groups = groups, .ngroups = 3 };
    struct spawn_cred root = { .uid = 0, .gid = 0 };
    struct spawned s = { .pid = -7 };
    struct esd_err err;
    gid_t mine[] = { 0, 4 };
    char *text;

    if (geteuid() != 0) {
        fprintf(stderr, "check_spawn: not root, credential test skipped\n");
        return;
    }
    ck_assert_int_eq(setgroups(2, mine), 0);
    text = output_of(&argv, &cred);
    ck_assert_str_eq(text, "Uid:\t65534\t65534\t65534\t65534\n"
                           "Gid:\t4242\t4242\t4242\t4242\n"
                           "Groups:\t4242 4343 65534 \n");
    free(text);
    text = output_of(&back, &cred);
    ck_assert_str_eq(text, "not root\n");
    free(text);
    /* no groups at all is a set like any other */
    cred.ngroups = 0;
    cred.groups = NULL;
    text = output_of(&argv, &cred);
    ck_assert_ptr_nonnull(strstr(text, "Groups:\t \n"));
    free(text);
    ck_assert_int_eq(spawn_start_as(argv.v, environ, NULL, &root, &s, &err), -EPERM);
    ck_assert_ptr_nonnull(strstr(err.msg, "as root"));
    ck_assert_int_eq(s.pid, -7);
    strv_free(&argv);
    strv_free(&back);
}
END_TEST

/* spawn_cred_for_uid: the passwd entry and the group list of the user
 * database, as id(1) reads them; a uid without an entry is refused. */
START_TEST(test_spawn_cred_for_uid)
{
    struct spawn_cred c = { 0 };
    struct esd_err err;
    char *cmd, *id_groups, *got;
    struct strv argv;
    struct buf b;
    uid_t none = 3999999999u;

    ck_assert_msg(spawn_cred_for_uid(getuid(), &c, &err) == 0, "%s", err.msg);
    ck_assert_int_eq(c.uid, getuid());
    ck_assert_ptr_nonnull(c.name);
    ck_assert_int_eq(c.home[0], '/');
    ck_assert_int_eq(c.shell[0], '/');
    /* the same groups as id -G, in some order */
    cmd = xasprintf("id -G %s | tr ' ' '\\n' | sort -n", c.name);
    argv = vec("sh", "-c", cmd, NULL);
    id_groups = output_of(&argv, NULL);
    strv_free(&argv);
    free(cmd);
    buf_init(&b);
    for (size_t i = 0; i < c.ngroups; i++)
        buf_printf(&b, " %lu", (unsigned long)c.groups[i]);
    cmd = xasprintf("printf '%%s\\n'%s | sort -n", b.p);
    argv = vec("sh", "-c", cmd, NULL);
    got = output_of(&argv, NULL);
    strv_free(&argv);
    ck_assert_str_eq(got, id_groups);
    spawn_cred_free(&c);
    spawn_cred_free(&c); /* a freed one is zeroed */
    free(got);
    free(id_groups);
    free(cmd);
    buf_free(&b);

    while (getpwuid(none))
        none--;
    memset(&c, 0x5a, sizeof(c));
    ck_assert_int_eq(spawn_cred_for_uid(none, &c, &err), -ENOENT);
    cmd = xasprintf("uid %lu has no entry in the user database (passwd)", (unsigned long)none);
    ck_assert_str_eq(err.msg, cmd);
    free(cmd);
}
END_TEST

START_TEST(test_spawn_describe)
{
    char how[64];
    int code = 0;

    spawn_describe(W_EXITCODE(0, 0), how, &code);
    ck_assert_str_eq(how, "exit code 0");
    ck_assert_int_eq(code, 0);
    spawn_describe(W_EXITCODE(255, 0), how, &code);
    ck_assert_str_eq(how, "exit code 255");
    ck_assert_int_eq(code, 255);
    spawn_describe(W_EXITCODE(0, SIGTERM), how, &code);
    ck_assert_str_eq(how, "killed by signal 15 (TERM)");
    ck_assert_int_eq(code, -15);
    spawn_describe(W_EXITCODE(0, SIGSEGV) | 0x80, how, &code);
    ck_assert_str_eq(how, "killed by signal 11 (SEGV)");
    ck_assert_int_eq(code, -11);
}
END_TEST

/* ---- spawn_keep: the keeper ---- */

/* Whether pid is gone (not even a zombie) within 10 s. */
static bool
gone_soon(pid_t pid)
{
    for (int i = 0; i < 1000; i++) {
        struct timespec ts = { 0, 10 * 1000 * 1000 };

        if (kill(pid, 0) < 0 && errno == ESRCH)
            return true;
        nanosleep(&ts, NULL);
    }
    return false;
}

/* The program's first line of output: a pid. */
static pid_t
read_pid(int fd)
{
    char line[32] = { 0 };
    size_t n = 0;

    while (n < sizeof(line) - 1) {
        struct pollfd p = { .fd = fd, .events = POLLIN };

        ck_assert_msg(poll(&p, 1, 10000) == 1, "no pid within 10 s");
        ck_assert_int_eq(read(fd, line + n, 1), 1);
        if (line[n++] == '\n')
            break;
    }
    return (pid_t)atol(line);
}

/* An escapee: a process that leaves the group and the session, holds the
 * output pipe, prints its pid and sleeps; the shell waits for it. */
#define ESCAPE "setsid sh -c 'echo $$; exec sleep 100' & "

START_TEST(test_keep_output_status_group)
{
    struct strv argv = vec("sh", "-c", "echo out; echo err >&2; exit 3", NULL);
    struct spawn_keep_opts o = { .grace = 5 };
    struct spawned s;
    struct esd_err err;
    char how[64], *text;
    int code = 0, st;

    ck_assert_msg(spawn_keep(argv.v, environ, NULL, NULL, &o, &s, &err) == 0, "%s", err.msg);
    ck_assert_int_ne(s.proc, s.pid);
    ck_assert(fcntl(s.out_fd, F_GETFD) & FD_CLOEXEC);
    ck_assert(fcntl(s.report_fd, F_GETFD) & FD_CLOEXEC);
    text = read_all(s.out_fd);
    ck_assert_str_eq(text, "out\nerr\n");
    close(s.out_fd);
    st = wait_for(s.pid);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    ck_assert_int_eq(spawn_keep_status(&s, st, &st), 0);
    spawn_describe(st, how, &code);
    ck_assert_str_eq(how, "exit code 3");
    ck_assert_int_eq(s.report_fd, -1);
    free(text);
    strv_free(&argv);
}
END_TEST

START_TEST(test_keep_program_in_keepers_group)
{
    struct strv argv = vec("sleep", "100", NULL);
    struct spawn_keep_opts o = { .grace = 5 };
    struct spawned s;
    struct esd_err err;
    char how[64];
    int code = 0, st;

    ck_assert_msg(spawn_keep(argv.v, environ, NULL, NULL, &o, &s, &err) == 0, "%s", err.msg);
    ck_assert_int_eq(getpgid(s.pid), s.pid);
    ck_assert_int_eq(getpgid(s.proc), s.pid);
    /* SIGTERM to the group: the program dies of it, the keeper reports */
    spawn_signal(&s, SIGTERM);
    st = wait_for(s.pid);
    ck_assert_int_eq(spawn_keep_status(&s, st, &st), 0);
    spawn_describe(st, how, &code);
    ck_assert_str_eq(how, "killed by signal 15 (TERM)");
    close(s.out_fd);
    strv_free(&argv);
}
END_TEST

/* What left the group (setsid) and holds the output pipe dies when the
 * program exits: the pipe reaches its end, the escapee is gone. */
START_TEST(test_keep_kills_escapee_at_exit)
{
    char *flag = xasprintf("%s/printed", tmp);
    char *script = xasprintf("setsid sh -c 'echo $$; : >%s; exec sleep 100' & "
                             "while [ ! -e %s ]; do sleep 0.01; done; exit 0",
                             flag, flag);
    struct strv argv = vec("sh", "-c", script, NULL);
    struct spawn_keep_opts o = { .grace = 5 };
    struct spawned s;
    struct esd_err err;
    char *rest;
    pid_t esc;
    int st;

    ck_assert_msg(spawn_keep(argv.v, environ, NULL, NULL, &o, &s, &err) == 0, "%s", err.msg);
    esc = read_pid(s.out_fd);
    ck_assert_int_gt(esc, 0);
    ck_assert_int_ne(getsid(esc), getsid(s.proc));
    rest = read_all(s.out_fd);
    ck_assert_str_eq(rest, "");
    st = wait_for(s.pid);
    ck_assert_int_eq(spawn_keep_status(&s, st, &st), 0);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    ck_assert(gone_soon(esc));
    close(s.out_fd);
    free(rest);
    free(script);
    free(flag);
    strv_free(&argv);
}
END_TEST

/* A stop: SIGTERM to the group reaches the escapee through the keeper
 * once it is an orphan (here, as soon as the shell died of SIGTERM), and
 * a program that ignores SIGTERM is killed after the grace. */
START_TEST(test_keep_stop_and_grace)
{
    struct strv argv = vec("sh", "-c", "trap '' TERM; " ESCAPE "wait; wait", NULL);
    struct spawn_keep_opts o = { .grace = 0.3 };
    struct spawned s;
    struct esd_err err;
    char how[64];
    double t0;
    pid_t esc;
    int st, code = 0;

    ck_assert_msg(spawn_keep(argv.v, environ, NULL, NULL, &o, &s, &err) == 0, "%s", err.msg);
    esc = read_pid(s.out_fd);
    t0 = time_mono();
    spawn_signal(&s, SIGTERM);
    st = wait_for(s.pid);
    ck_assert(time_mono() - t0 >= 0.3);
    ck_assert_int_eq(spawn_keep_status(&s, st, &st), 0);
    spawn_describe(st, how, &code);
    ck_assert_str_eq(how, "killed by signal 9 (KILL)");
    ck_assert(gone_soon(esc));
    close(s.out_fd);
    strv_free(&argv);
}
END_TEST

/* The keeper's parent dies (esd killed with SIGKILL): the keeper kills its
 * whole tree, escapee included, and exits. This process is the subreaper
 * that gets the keeper. */
START_TEST(test_keep_parent_death)
{
    int p[2], st;
    pid_t mid, got[2] = { 0, 0 };

    ck_assert_int_eq(prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), 0);
    ck_assert_int_eq(pipe(p), 0);
    mid = fork();
    ck_assert_int_ge(mid, 0);
    if (mid == 0) {
        struct strv argv = vec("sh", "-c", ESCAPE "wait", NULL);
        struct spawn_keep_opts o = { .grace = 5 };
        struct spawned s;
        struct esd_err err;

        if (spawn_keep(argv.v, environ, NULL, NULL, &o, &s, &err) < 0)
            _exit(1);
        got[0] = s.pid;
        got[1] = read_pid(s.out_fd);
        (void)!write(p[1], got, sizeof(got));
        kill(getpid(), SIGKILL);
    }
    close(p[1]);
    ck_assert_int_eq(read(p[0], got, sizeof(got)), (ssize_t)sizeof(got));
    close(p[0]);
    ck_assert_int_eq(waitpid(mid, &st, 0), mid);
    ck_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    /* the keeper was handed to this process: it ends by itself */
    st = wait_for(got[0]);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    ck_assert(gone_soon(got[1]));
}
END_TEST

/* A keeper killed with SIGKILL says nothing: -ESRCH and its own status;
 * its program dies with it (PDEATHSIG). */
START_TEST(test_keep_keeper_killed)
{
    struct strv argv = vec("sleep", "100", NULL);
    struct spawn_keep_opts o = { .grace = 5 };
    struct spawned s;
    struct esd_err err;
    int st, got;

    ck_assert_int_eq(prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), 0);
    ck_assert_msg(spawn_keep(argv.v, environ, NULL, NULL, &o, &s, &err) == 0, "%s", err.msg);
    kill(s.pid, SIGKILL);
    st = wait_for(s.pid);
    ck_assert_int_eq(spawn_keep_status(&s, st, &got), -ESRCH);
    ck_assert_int_eq(got, st);
    st = wait_for(s.proc);
    ck_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    close(s.out_fd);
    strv_free(&argv);
}
END_TEST

START_TEST(test_keep_failures)
{
    struct strv missing = vec("esd-no-such-program", NULL);
    struct strv ok = vec("true", NULL);
    struct spawn_keep_opts o = { .grace = 5 }, bad = { .grace = 5, .cgroup = "/nonexistent" };
    struct spawn_cred root = { .uid = 0, .gid = 0 };
    struct spawned s = { .pid = -7, .out_fd = -7 };
    struct esd_err err;

    ck_assert_int_eq(spawn_keep(missing.v, environ, NULL, NULL, &o, &s, &err), -ENOENT);
    ck_assert_ptr_nonnull(strstr(err.msg, "esd-no-such-program"));
    ck_assert_int_eq(spawn_keep(ok.v, environ, "/nonexistent-dir", NULL, &o, &s, &err), -ENOENT);
    ck_assert_int_eq(spawn_keep(ok.v, environ, NULL, NULL, &bad, &s, &err), -ENOENT);
    ck_assert_ptr_nonnull(strstr(err.msg, "cgroup /nonexistent"));
    ck_assert_int_eq(spawn_keep(ok.v, environ, NULL, &root, &o, &s, &err), -EPERM);
    /* every keeper was reaped, and nothing was returned */
    errno = 0;
    ck_assert_int_eq(waitpid(-1, NULL, WNOHANG), -1);
    ck_assert_int_eq(errno, ECHILD);
    ck_assert_int_eq(s.pid, -7);
    strv_free(&missing);
    strv_free(&ok);
}
END_TEST

static Suite *
spawn_suite(void)
{
    Suite *s = suite_create("spawn");
    TCase *tc = tcase_create("spawn");

    tcase_add_checked_fixture(tc, tmp_setup, tmp_teardown);
    tcase_add_test(tc, test_spawn_output_and_status);
    tcase_add_test(tc, test_spawn_cwd);
    tcase_add_test(tc, test_spawn_own_process_group);
    tcase_add_test(tc, test_spawn_signal_reaches_grandchildren);
    tcase_add_test(tc, test_spawn_child_dies_with_parent);
    tcase_add_test(tc, test_spawn_exec_failures);
    tcase_add_test(tc, test_spawn_closes_descriptors);
    tcase_add_test(tc, test_spawn_closes_descriptors_without_close_range);
    tcase_add_test(tc, test_spawn_default_signals);
    tcase_add_test(tc, test_spawn_as_credentials);
    tcase_add_test(tc, test_spawn_cred_for_uid);
    tcase_add_test(tc, test_spawn_describe);
    tcase_add_test(tc, test_keep_output_status_group);
    tcase_add_test(tc, test_keep_program_in_keepers_group);
    tcase_add_test(tc, test_keep_kills_escapee_at_exit);
    tcase_add_test(tc, test_keep_stop_and_grace);
    tcase_add_test(tc, test_keep_parent_death);
    tcase_add_test(tc, test_keep_keeper_killed);
    tcase_add_test(tc, test_keep_failures);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(spawn_suite());
}
