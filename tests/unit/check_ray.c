/*
 * check_ray: the Ray supervisor on a real libev default loop, with the
 * stand-in tests/tools/fake-ray as ray.command: the head comes up and is
 * reported ready, its token and environment are private to it, a lost head
 * is seen (new generation, not ready) and restarted with backoff, a head
 * that refuses to start is never ready, a stop takes the whole process
 * group down (SIGKILL for one that ignores SIGTERM), per-attempt and off
 * modes need no head, and a reload restarts the head only when a ray.* key
 * changed. With a python next to ray.command (the stand-in's `python`) a head
 * is up only once the readiness check saw it take a task, and one that never
 * gets there is killed and restarted after ray.start_timeout_secs; the GPU
 * count (--num-gpus) follows ray.num_gpus, CUDA_VISIBLE_DEVICES or
 * /dev/nvidia<N>. Every wait is bounded by a timer that stops the loop.
 */
#include <check.h>
#include <errno.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ev.h>

#include "config.h"
#include "fsutil.h"
#include "json.h"
#include "log.h"
#include "ray.h"
#include "testutil.h"
#include "util.h"

static struct ev_loop *loop;
static char *tmp;
static char *fake_ray;
static struct esd_conf conf;

/* What the listener saw. */
static int calls, ready_calls, down_calls;
static double down_at[16];
static int stops_done;

static void
on_change(void)
{
    calls++;
    if (ray_ready()) {
        ready_calls++;
    } else {
        if (down_calls < (int)(sizeof(down_at) / sizeof(down_at[0])))
            down_at[down_calls] = ev_time();
        down_calls++;
    }
}

static void
on_stopped(void)
{
    stops_done++;
}

/* A TCP port nothing listens on (bound to port 0 and released). */
static long
free_port(void)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof(a);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static void
setup(void)
{
    char *rel = tu_data("../tools/fake-ray"), real[PATH_MAX];

    ck_assert_msg(realpath(rel, real), "fake-ray not found at %s (ESD_TEST_DATA?)", rel);
    free(rel);
    fake_ray = xstrdup(real);
    tmp = tu_tmpdir();
    unsetenv("FAKE_RAY_DIE_AFTER");
    unsetenv("FAKE_RAY_REFUSE");
    unsetenv("FAKE_RAY_SLOW_START");
    unsetenv("FAKE_RAY_READY_AFTER");
    unsetenv("FAKE_RAY_NEVER_READY");
    unsetenv("CUDA_VISIBLE_DEVICES");
    log_init(LOG_TARGET_STDERR, getenv("ESD_TEST_DEBUG") ? LOG_LVL_DEBUG : LOG_LVL_WARNING, true,
             "test");
    loop = ev_default_loop(0);
    memset(&conf, 0, sizeof(conf));
    conf.ray_mode = RAY_PERSISTENT;
    conf.ray_command = xstrdup(fake_ray);
    conf.ray_port = free_port();
    conf.ray_temp_dir = fs_join(tmp, "ray");
    strv_init(&conf.ray_args);
    /* the stand-in's knobs reach the head as attempt_env lets them */
    strv_init(&conf.attempt_env);
    strv_push(&conf.attempt_env, "FAKE_RAY_*");
    calls = ready_calls = down_calls = stops_done = 0;
    ray_set_listener(on_change);
}

static void
teardown(void)
{
    ray_fini();
    free(conf.ray_command);
    free(conf.ray_temp_dir);
    strv_free(&conf.ray_args);
    strv_free(&conf.attempt_env);
    fs_rm_rf(tmp);
    free(tmp);
    free(fake_ray);
}

/* --- running the loop --- */

static bool timed_out;

static void
deadline_cb(struct ev_loop *l, ev_timer *w, int revents)
{
    timed_out = true;
    ev_break(l, EVBREAK_ONE);
}

/* Runs the loop until pred() holds or secs pass (pred NULL: secs). */
static bool
run_until(bool (*pred)(void), double secs)
{
    ev_timer deadline;

    ev_now_update(loop);
    ev_timer_init(&deadline, deadline_cb, secs, 0.);
    ev_timer_start(loop, &deadline);
    timed_out = false;
    while (!(pred && pred()) && !timed_out)
        ev_run(loop, EVRUN_ONCE);
    ev_timer_stop(loop, &deadline);
    return pred ? pred() : true;
}

static bool
is_ready(void)
{
    return ray_ready();
}

static bool
is_down(void)
{
    return !ray_ready();
}

static bool
is_stopped(void)
{
    return stops_done > 0;
}

static bool
restarted_once(void)
{
    return ray_restarts() >= 1;
}

static bool
lost_thrice(void)
{
    return down_calls >= 3;
}

static bool
pid_file_written(void)
{
    char *p = fs_join(conf.ray_temp_dir, "fake-ray.pid");
    bool ok = tu_exists(p);

    free(p);
    return ok;
}

/* --- processes --- */

static pid_t
read_pid(const char *path)
{
    char *text = tu_read(path, NULL);
    long long pid = 0;

    ck_assert_msg(text, "cannot read %s", path);
    ck_assert_int_eq(parse_int(text, 1, INT_MAX, &pid), 0);
    free(text);
    return (pid_t)pid;
}

/* The pid of the fake head now serving (its own pid file). */
static pid_t
head_pid(void)
{
    char *p = fs_join(conf.ray_temp_dir, "fake-ray.pid");
    pid_t pid;

    ck_assert_msg(run_until(pid_file_written, 10), "fake-ray wrote no pid file");
    pid = read_pid(p);
    free(p);
    return pid;
}

/* True if pid is a running (not zombie) process: this container's init
 * may never reap orphans. */
static bool
alive(pid_t pid)
{
    char path[64], *stat, *p;
    bool live;

    if (kill(pid, 0) < 0)
        return false;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    if (!(stat = tu_read(path, NULL)))
        return false;
    p = strrchr(stat, ')');
    live = p && p[1] == ' ' && p[2] != 'Z' && p[2] != 'X';
    free(stat);
    return live;
}

/* A NUL-separated /proc file of pid, with the NULs made newlines. */
static char *
proc_text(pid_t pid, const char *what)
{
    char path[64], *text;
    size_t len;

    snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, what);
    text = tu_read(path, &len);
    ck_assert_msg(text, "cannot read %s", path);
    for (size_t i = 0; i < len; i++)
        if (text[i] == '\0')
            text[i] = '\n';
    return text;
}

/* A wrapper around fake-ray in tmp: body runs first, then fake-ray
 * (exec'd unless body ends it otherwise). Caller frees. */
static char *
wrapper(const char *name, const char *body)
{
    char *text = xasprintf("#!/bin/sh\n%s\n", body), *path = tu_write(tmp, name, text, (size_t)-1);

    ck_assert_int_eq(chmod(path, 0755), 0);
    free(text);
    return path;
}

static void
use_command(char *path)
{
    free(conf.ray_command);
    conf.ray_command = path;
}

static void
init_ok(void)
{
    struct esd_err err;

    err_clear(&err);
    ck_assert_msg(ray_init(loop, &conf, &err) == 0, "%s", err.msg);
}

/* Stops the head and checks that done is called within secs. */
static void
stop_ok(double secs)
{
    ray_stop(on_stopped);
    ck_assert_msg(run_until(is_stopped, secs), "ray_stop did not finish within %.0f s", secs);
    ck_assert_int_eq(stops_done, 1);
    ck_assert(!ray_ready());
    ck_assert_str_eq(ray_state_name(), "down");
}

/* --- tests --- */

START_TEST(test_ray_head_up_and_stop)
{
    char *token_path = fs_join(conf.ray_temp_dir, "auth_token"), *want, *text, *addr;
    struct strv env;
    struct stat st;
    size_t len;
    pid_t pid;

    init_ok();
    ck_assert_str_eq(ray_state_name(), "starting");
    ck_assert(!ray_ready());
    ck_assert_msg(run_until(is_ready, 30), "head not up within 30 s (state %s)", ray_state_name());
    ck_assert_str_eq(ray_state_name(), "up");
    ck_assert_int_eq(ready_calls, 1);
    ck_assert_int_eq(down_calls, 0);
    addr = xasprintf("127.0.0.1:%ld", conf.ray_port);
    ck_assert_str_eq(ray_address(), addr);
    ck_assert_uint_eq(ray_restarts(), 0);

    /* the temp dir and the token are private */
    ck_assert_int_eq(stat(conf.ray_temp_dir, &st), 0);
    ck_assert_int_eq(st.st_mode & 07777, 0700);
    ck_assert_int_eq(stat(token_path, &st), 0);
    ck_assert_int_eq(st.st_mode & 07777, 0600);
    text = tu_read(token_path, &len);
    ck_assert_uint_eq(len, 65);
    ck_assert_uint_eq(strspn(text, "0123456789abcdef"), 64);
    ck_assert_int_eq(text[64], '\n');
    free(text);

    /* attempts get the token variables, replacing inherited ones */
    strv_init(&env);
    strv_push(&env, "PATH=/usr/bin:/bin");
    strv_push(&env, "RAY_AUTH_MODE=none");
    ray_env(&env);
    ck_assert_uint_eq(env.n, 3);
    ck_assert_ptr_null(env.v[3]);
    ck_assert_str_eq(env.v[0], "PATH=/usr/bin:/bin");
    ck_assert(strv_contains(&env, "RAY_AUTH_MODE=token"));
    want = xasprintf("RAY_AUTH_TOKEN_PATH=%s", token_path);
    ck_assert(strv_contains(&env, want));
    free(want);
    strv_free(&env);

    /* the head: its own process group, the token environment, the flags */
    pid = head_pid();
    ck_assert_int_eq(getpgid(pid), pid);
    text = proc_text(pid, "environ");
    ck_assert_ptr_nonnull(strstr(text, "\nRAY_AUTH_MODE=token\n"));
    want = xasprintf("\nRAY_AUTH_TOKEN_PATH=%s\n", token_path);
    ck_assert_ptr_nonnull(strstr(text, want));
    free(want);
    ck_assert_ptr_nonnull(strstr(text, "\nRAY_USAGE_STATS_ENABLED=0\n"));
    free(text);
    text = proc_text(pid, "cmdline");
    want = xasprintf("\nstart\n--head\n--block\n--port\n%ld\n--temp-dir\n%s\n--node-ip-address\n"
                     "127.0.0.1\n--include-dashboard=false\n--disable-usage-stats\n"
                     "--num-gpus\n0\n",
                     conf.ray_port, conf.ray_temp_dir);
    ck_assert_msg(strstr(text, want), "unexpected command line:\n%s", text);
    free(want);
    free(text);

    /* a stop takes it down (generation changes) and reports done */
    unsigned long gen = ray_generation();

    stop_ok(15);
    ck_assert(!alive(pid));
    ck_assert_uint_ne(ray_generation(), gen);
    ck_assert_int_eq(down_calls, 1);
    /* a second stop has nothing to wait for */
    ray_stop(on_stopped);
    ck_assert_int_eq(stops_done, 2);
    free(addr);
    free(token_path);
}
END_TEST

START_TEST(test_ray_keeps_existing_token)
{
    char *token_path, *text;
    struct stat st;

    ck_assert_int_eq(fs_mkdir_p(conf.ray_temp_dir, 0700, NULL), 0);
    token_path = tu_write(conf.ray_temp_dir, "auth_token", "my-own-token\n", (size_t)-1);
    ck_assert_int_eq(chmod(token_path, 0644), 0);
    init_ok();
    text = tu_read(token_path, NULL);
    ck_assert_str_eq(text, "my-own-token\n");
    free(text);
    ck_assert_int_eq(stat(token_path, &st), 0);
    ck_assert_int_eq(st.st_mode & 07777, 0600);
    ck_assert(run_until(is_ready, 30));
    stop_ok(15);
    free(token_path);
}
END_TEST

START_TEST(test_ray_loss_restarts_after_backoff)
{
    char *body =
        xasprintf("sleep 300 &\necho $! >'%s/sleeper.pid'\nexec '%s' \"$@\"", tmp, fake_ray);
    char *sleeper_file = fs_join(tmp, "sleeper.pid");
    unsigned long gen;
    pid_t sleeper;
    double lost;

    /* the head dies after 1 s and leaves a member of its group behind */
    use_command(wrapper("ray-with-child", body));
    setenv("FAKE_RAY_DIE_AFTER", "1", 1);
    init_ok();
    ck_assert(run_until(is_ready, 30));
    gen = ray_generation();
    sleeper = read_pid(sleeper_file);
    ck_assert(alive(sleeper));
    ck_assert_int_eq(getpgid(sleeper), getpgid(head_pid()));
    calls = 0;

    ck_assert_msg(run_until(is_down, 10), "the loss was not seen");
    lost = ev_time();
    unsetenv("FAKE_RAY_DIE_AFTER"); /* the next head stays */
    ck_assert_uint_ne(ray_generation(), gen);
    ck_assert_str_eq(ray_state_name(), "down");
    ck_assert_int_eq(calls, 1);
    ck_assert_int_eq(down_calls, 1);
    ck_assert_uint_eq(ray_restarts(), 0);

    /* restarted after 1 s, once the whole group is gone */
    ck_assert(run_until(restarted_once, 10));
    ck_assert_msg(ev_time() - lost >= 0.9, "restarted after %.2f s", ev_time() - lost);
    ck_assert(!alive(sleeper));
    ck_assert(run_until(is_ready, 30));
    ck_assert_uint_eq(ray_restarts(), 1);
    ck_assert_int_eq(ready_calls, 2);
    stop_ok(15);
    free(body);
    free(sleeper_file);
}
END_TEST

/* ray.command as bin/ray and the stand-in's python as bin/python3 beside
 * it, as a virtual environment has them. */
static void
use_venv_like(void)
{
    char *bin = fs_join(tmp, "bin"), *body;
    struct esd_err err;

    ck_assert_int_eq(fs_mkdir_p(bin, 0755, &err), 0);
    body = xasprintf("exec '%s' \"$@\"", fake_ray);
    free(wrapper("bin/ray", body));
    free(body);
    body = xasprintf("exec '%s' python \"$@\"", fake_ray);
    free(wrapper("bin/python3", body));
    free(body);
    use_command(fs_join(bin, "ray"));
    free(bin);
}

/* The "ray" object of a status, with the head's details. */
static cJSON *
ray_status(void)
{
    cJSON *o = cJSON_CreateObject();

    ray_status_json(o);
    return o;
}

static bool
check_running(void)
{
    cJSON *o = ray_status();
    const char *why = json_get_str(o, "starting");
    bool yes = why && strstr(why, "raylet not registered yet");

    cJSON_Delete(o);
    return yes;
}

START_TEST(test_ray_up_only_when_ready)
{
    cJSON *o;
    double t0;

    use_venv_like();
    setenv("FAKE_RAY_READY_AFTER", "2", 1);
    init_ok();
    t0 = ev_time();
    o = ray_status();
    ck_assert_str_eq(json_get_str(o, "ready_check"), "task");
    ck_assert_str_eq(json_get_str(o, "starting"), "waiting for the GCS port");
    cJSON_Delete(o);
    /* the port accepts at once, the check runs and waits */
    ck_assert_msg(run_until(check_running, 10), "no readiness check seen");
    ck_assert_str_eq(ray_state_name(), "starting");
    ck_assert(!ray_ready());
    ck_assert_msg(run_until(is_ready, 20), "not up (state %s)", ray_state_name());
    ck_assert_msg(ev_time() - t0 >= 1.9, "up after %.2f s, before the raylet was ready",
                  ev_time() - t0);
    ck_assert_int_eq(ready_calls, 1);
    o = ray_status();
    ck_assert_ptr_null(cJSON_GetObjectItemCaseSensitive(o, "starting"));
    cJSON_Delete(o);
    stop_ok(15);
}
END_TEST

START_TEST(test_ray_never_ready_restarted)
{
    use_venv_like();
    setenv("FAKE_RAY_NEVER_READY", "1", 1);
    conf.ray_start_timeout_secs = 5;
    init_ok();
    ck_assert_msg(run_until(check_running, 10), "no readiness check seen");
    /* killed at 5 s, restarted 1 s after its group is gone */
    ck_assert_msg(run_until(restarted_once, 20), "not restarted (state %s)", ray_state_name());
    ck_assert_int_eq(ready_calls, 0);
    ck_assert_int_ge(down_calls, 1);
    unsetenv("FAKE_RAY_NEVER_READY"); /* the next head gets ready */
    ray_stop(on_stopped);
    ck_assert(run_until(is_stopped, 15));
}
END_TEST

START_TEST(test_ray_gpus_count)
{
    char *dev = fs_join(tmp, "dev");
    const char *from = NULL;
    const char *names[] = { "nvidia0",    "nvidia1", "nvidia12", "nvidiactl",
                            "nvidia-uvm", "nvidia",  "null" };
    struct esd_err err;

    ck_assert_int_eq(fs_mkdir_p(dev, 0755, &err), 0);
    ck_assert_int_eq(ray_gpus_count(-1, NULL, dev, &from), 0);
    ck_assert_str_eq(from, "/dev/nvidia*");
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        free(tu_write(dev, names[i], "", 0));
    ck_assert_int_eq(ray_gpus_count(-1, NULL, dev, &from), 3);
    ck_assert_int_eq(ray_gpus_count(-1, NULL, "/nonexistent", &from), 0);
    /* CUDA_VISIBLE_DEVICES wins over the devices */
    ck_assert_int_eq(ray_gpus_count(-1, "0,1", dev, &from), 2);
    ck_assert_str_eq(from, "CUDA_VISIBLE_DEVICES");
    ck_assert_int_eq(ray_gpus_count(-1, "3", dev, &from), 1);
    ck_assert_int_eq(ray_gpus_count(-1, "GPU-8f2c1d9e-aaaa-bbbb,MIG-1234", dev, &from), 2);
    ck_assert_int_eq(ray_gpus_count(-1, "", dev, &from), 0);
    ck_assert_int_eq(ray_gpus_count(-1, "-1", dev, &from), 0);
    ck_assert_int_eq(ray_gpus_count(-1, "NoDevFiles", dev, &from), 0);
    ck_assert_int_eq(ray_gpus_count(-1, "0,,2,", dev, &from), 2);
    /* ray.num_gpus wins over both */
    ck_assert_int_eq(ray_gpus_count(0, "0,1", dev, &from), 0);
    ck_assert_str_eq(from, "ray.num_gpus");
    ck_assert_int_eq(ray_gpus_count(4, NULL, dev, &from), 4);
    free(dev);
}
END_TEST

START_TEST(test_ray_head_gets_gpus)
{
    char *text;
    cJSON *o;
    long long n = -1;
    pid_t pid;

    /* attempt_env (FAKE_RAY_* here) does not name CUDA_VISIBLE_DEVICES */
    setenv("CUDA_VISIBLE_DEVICES", "1,3", 1);
    conf.ray_num_gpus = -1;
    init_ok();
    ck_assert(run_until(is_ready, 30));
    pid = head_pid();
    text = proc_text(pid, "cmdline");
    ck_assert_msg(strstr(text, "\n--num-gpus\n2\n"), "command line:\n%s", text);
    free(text);
    text = proc_text(pid, "environ");
    ck_assert_ptr_nonnull(strstr(text, "\nCUDA_VISIBLE_DEVICES=1,3\n"));
    free(text);
    o = ray_status();
    ck_assert_int_eq(json_get_int(o, "num_gpus", &n), 0);
    ck_assert_int_eq(n, 2);
    ck_assert_str_eq(json_get_str(o, "gpus_from"), "CUDA_VISIBLE_DEVICES");
    /* no python beside fake-ray: the port is all that is checked */
    ck_assert_str_eq(json_get_str(o, "ready_check"), "port");
    cJSON_Delete(o);
    stop_ok(15);
}
END_TEST

START_TEST(test_ray_refused_never_ready)
{
    setenv("FAKE_RAY_REFUSE", "1", 1);
    init_ok();
    /* (a deadline, not a fixed window: a loaded machine is slower) */
    ck_assert(run_until(lost_thrice, 60));
    ck_assert_int_eq(ready_calls, 0);
    ck_assert(!ray_ready());
    /* lost at about 0, 1 and 3 s: the delay doubles */
    ck_assert_msg(down_at[1] - down_at[0] >= 0.9, "first delay %.2f s", down_at[1] - down_at[0]);
    ck_assert_msg(down_at[2] - down_at[1] >= 1.9, "second delay %.2f s", down_at[2] - down_at[1]);
    ck_assert_uint_eq(ray_restarts(), (unsigned)down_calls - 1);
    ck_assert_uint_ge(ray_generation(), 2 * (unsigned long)down_calls);
    stop_ok(15);
}
END_TEST

START_TEST(test_ray_stop_kills_whole_group)
{
    char *body =
        xasprintf("sleep 300 &\necho $! >'%s/sleeper.pid'\nexec '%s' \"$@\"", tmp, fake_ray);
    char *sleeper_file = fs_join(tmp, "sleeper.pid");
    pid_t pid, sleeper;

    use_command(wrapper("ray-with-child", body));
    init_ok();
    ck_assert(run_until(is_ready, 30));
    pid = head_pid();
    sleeper = read_pid(sleeper_file);
    ck_assert(alive(pid));
    ck_assert(alive(sleeper));
    stop_ok(15);
    ck_assert(!alive(pid));
    ck_assert(!alive(sleeper));
    free(body);
    free(sleeper_file);
}
END_TEST

START_TEST(test_ray_stop_sigkill_after_10s)
{
    char *marker = fs_join(tmp, "stubborn.pid");
    char *body = xasprintf("trap '' TERM\necho $$ >'%s'\nwhile :; do sleep 1; done", marker);
    double t0;
    pid_t pid;

    use_command(wrapper("stubborn-ray", body));
    init_ok();
    ck_assert(run_until(NULL, 0.5));
    pid = read_pid(marker);
    ck_assert_str_eq(ray_state_name(), "starting");
    t0 = ev_time();
    ray_stop(on_stopped);
    ck_assert_str_eq(ray_state_name(), "stopping");
    ck_assert(run_until(is_stopped, 20));
    ck_assert_msg(ev_time() - t0 >= 9.5, "stopped after %.1f s", ev_time() - t0);
    ck_assert(!alive(pid));
    ck_assert_str_eq(ray_state_name(), "down");
    free(body);
    free(marker);
}
END_TEST

START_TEST(test_ray_stop_while_starting)
{
    setenv("FAKE_RAY_SLOW_START", "30", 1);
    init_ok();
    ck_assert(run_until(NULL, 1.5));
    ck_assert_str_eq(ray_state_name(), "starting");
    ck_assert(!ray_ready());
    stop_ok(5);
    ck_assert_int_eq(ready_calls, 0);
}
END_TEST

START_TEST(test_ray_bad_command_retried)
{
    char *missing = fs_join(tmp, "no-such-ray");

    use_command(missing);
    init_ok();
    ck_assert_str_eq(ray_state_name(), "down");
    ck_assert(!ray_ready());
    ck_assert(run_until(restarted_once, 5));
    ck_assert(!ray_ready());
    ray_stop(on_stopped);
    ck_assert_int_eq(stops_done, 1); /* no head: at once */
    ck_assert_str_eq(ray_state_name(), "down");
    /* stopped: no more restarts */
    unsigned n = ray_restarts();

    run_until(NULL, 2.5);
    ck_assert_uint_eq(ray_restarts(), n);
}
END_TEST

START_TEST(test_ray_temp_dir_error)
{
    struct esd_err err;
    char *file = tu_write(tmp, "file", "x", (size_t)-1);

    free(conf.ray_temp_dir);
    conf.ray_temp_dir = fs_join(file, "ray");
    err_clear(&err);
    ck_assert_int_lt(ray_init(loop, &conf, &err), 0);
    ck_assert_msg(strstr(err.msg, file), "message does not name the path: %s", err.msg);
    free(file);
}
END_TEST

START_TEST(test_ray_per_attempt_mode)
{
    struct strv env;

    conf.ray_mode = RAY_PER_ATTEMPT;
    init_ok();
    ck_assert(ray_ready());
    ck_assert_str_eq(ray_state_name(), "local");
    ck_assert_str_eq(ray_address(), "local");
    /* a token of the attempt's own Ray, a fresh one each time, and no
     * file: Ray would write ~/.ray/auth_token without it */
    strv_init(&env);
    ray_env(&env);
    ck_assert_uint_eq(env.n, 2);
    ck_assert_str_eq(env.v[0], "RAY_AUTH_MODE=token");
    ck_assert(!strncmp(env.v[1], "RAY_AUTH_TOKEN=", 15) && strlen(env.v[1]) == 15 + 32);
    {
        struct strv again;

        strv_init(&again);
        ray_env(&again);
        ck_assert_str_ne(env.v[1], again.v[1]);
        strv_free(&again);
    }
    strv_free(&env);
    ck_assert(!tu_exists(conf.ray_temp_dir));
    ray_stop(on_stopped);
    ck_assert_int_eq(stops_done, 1);
    ck_assert_str_eq(ray_state_name(), "local");
}
END_TEST

START_TEST(test_ray_off_mode)
{
    struct strv env;

    conf.ray_mode = RAY_OFF;
    init_ok();
    ck_assert(ray_ready());
    ck_assert_str_eq(ray_state_name(), "off");
    ck_assert_ptr_null(ray_address());
    strv_init(&env);
    ray_env(&env);
    ck_assert_uint_eq(env.n, 0);
    strv_free(&env);
    ck_assert(!tu_exists(conf.ray_temp_dir));
    ray_stop(on_stopped);
    ck_assert_int_eq(stops_done, 1);
    ck_assert_int_eq(calls, 0);
}
END_TEST

START_TEST(test_ray_reconfigure)
{
    unsigned long gen;
    char *addr, *text;
    pid_t old;

    init_ok();
    ck_assert(run_until(is_ready, 30));
    old = head_pid();
    gen = ray_generation();

    /* the same settings: nothing happens */
    ray_reconfigure(&conf);
    ck_assert_str_eq(ray_state_name(), "up");
    ck_assert_uint_eq(ray_generation(), gen);

    /* a new port: the head is replaced */
    conf.ray_port = free_port();
    ray_reconfigure(&conf);
    ck_assert(!ray_ready());
    ck_assert_uint_ne(ray_generation(), gen);
    ck_assert(run_until(is_ready, 30));
    ck_assert(!alive(old));
    addr = xasprintf("127.0.0.1:%ld", conf.ray_port);
    ck_assert_str_eq(ray_address(), addr);
    free(addr);
    ck_assert_uint_eq(ray_restarts(), 0);
    old = head_pid();

    /* off: the head goes, ready without one */
    conf.ray_mode = RAY_OFF;
    ray_reconfigure(&conf);
    ck_assert(run_until(is_ready, 15));
    ck_assert_str_eq(ray_state_name(), "off");
    ck_assert_ptr_null(ray_address());
    ck_assert(!alive(old));

    /* and back: a head again (new args count as a change too) */
    conf.ray_mode = RAY_PERSISTENT;
    strv_push(&conf.ray_args, "--num-cpus=1");
    ray_reconfigure(&conf);
    ck_assert_str_eq(ray_state_name(), "starting");
    ck_assert(run_until(is_ready, 30));
    text = proc_text(head_pid(), "cmdline");
    ck_assert_ptr_nonnull(strstr(text, "\n--num-cpus=1\n"));
    free(text);
    stop_ok(15);
}
END_TEST

static Suite *
ray_suite(void)
{
    Suite *s = suite_create("ray");
    TCase *tc = tcase_create("ray");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_ray_head_up_and_stop);
    tcase_add_test(tc, test_ray_keeps_existing_token);
    tcase_add_test(tc, test_ray_loss_restarts_after_backoff);
    tcase_add_test(tc, test_ray_refused_never_ready);
    tcase_add_test(tc, test_ray_up_only_when_ready);
    tcase_add_test(tc, test_ray_never_ready_restarted);
    tcase_add_test(tc, test_ray_gpus_count);
    tcase_add_test(tc, test_ray_head_gets_gpus);
    tcase_add_test(tc, test_ray_stop_kills_whole_group);
    tcase_add_test(tc, test_ray_stop_sigkill_after_10s);
    tcase_add_test(tc, test_ray_stop_while_starting);
    tcase_add_test(tc, test_ray_bad_command_retried);
    tcase_add_test(tc, test_ray_temp_dir_error);
    tcase_add_test(tc, test_ray_per_attempt_mode);
    tcase_add_test(tc, test_ray_off_mode);
    tcase_add_test(tc, test_ray_reconfigure);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(ray_suite());
}
