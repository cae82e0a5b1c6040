/*
 * ray: the Ray supervisor (see ray.h). One static object holds the settings
 * in effect, the head (its process group, output pipe, child watcher and
 * kill timer), the health probe (a non-blocking TCP connect to the GCS
 * port), the readiness check of a starting head (a short-lived Python
 * child, see READY_SCRIPT) and the restart timer. A head's life ends when its whole process
 * group is gone, not when the `ray` process exits: `ray start --block`
 * leaves raylet and GCS behind otherwise, and a new head could not bind the
 * port. Only then does the supervisor restart it, apply a reloaded
 * configuration or report a stop as done.
 */
#include "ray.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "json.h"
#include "log.h"
#include "msgid.h"
#include "notify.h"
#include "spawn.h"

#define RAY_HOST "127.0.0.1"
/* The Ray workers an attempt claimed ahead prewarms, at most (esd-dj's
 * PREWARM_WORKERS_MAX). */
#define PREWARM_WORKERS 4
#define START_POLL_SECS 0.5 /* health probes while starting */
#define READY_RETRY_SECS 2. /* a failed readiness check runs again after */
#define UP_POLL_SECS 30.    /* health probes while up */
#define PROBE_TIMEOUT_SECS 2.
#define PROBE_MAX_FAILURES 3 /* consecutive failed probes while up: dead */
#define BACKOFF_MIN_SECS 1.
#define BACKOFF_MAX_SECS 60.
#define BACKOFF_RESET_SECS 300.    /* up this long: the next loss starts at 1 s */
#define KILL_AFTER_SECS 10.        /* SIGTERM, then SIGKILL */
#define GONE_POLL_SECS 0.1         /* leftovers of a group that has lost its head */
#define GIVE_UP_AFTER_KILL_SECS 5. /* members unkillable (D state): stop waiting */
#define OUTPUT_LINE_MAX 4096
#define READY_TAG "esd-ray-probe: "

/*
 * The readiness check, run once per head by the interpreter of ray.command
 * as `python -c READY_SCRIPT <address> <secs>` with the head's environment
 * (its token) in the head's temp dir (not esd's working directory: -c puts
 * it first on sys.path). The GCS port accepting proves little: under load a
 * raylet was seen to die 40-60 s later, before it ever registered. So it
 * waits, within <secs>, until the GCS lists a live node, then connects as a
 * driver and runs one zero-CPU task there (zero CPUs: attempts may hold them
 * all). Each step is reported as a READY_TAG line; exit 0 means the node took
 * a task. It costs about 1.5 s of CPU (importing ray), which is why it runs
 * when a head starts and not with every health probe.
 */
static const char READY_SCRIPT[] =
    "import sys, time\n"
    "address, deadline = sys.argv[1], time.monotonic() + float(sys.argv[2])\n"
    "def say(what):\n"
    "    print('" READY_TAG "' + what, flush=True)\n"
    "try:\n"
    "    import ray\n"
    "    from ray._private import services, state\n"
    "except Exception as e:\n"
    "    say('fail cannot import ray: %s' % e)\n"
    "    sys.exit(2)\n"
    "say('gcs')\n"
    "gs, why = state.GlobalState(), 'no live node'\n"
    "while True:\n"
    "    try:\n"
    "        gs._initialize_global_state(services._get_gcs_client_options(address))\n"
    "        if any(n.get('Alive') for n in gs.node_table()):\n"
    "            break\n"
    "    except Exception as e:\n"
    "        why = str(e).splitlines()[0] if str(e) else type(e).__name__\n"
    "    if time.monotonic() >= deadline:\n"
    "        say('fail raylet not registered: %s' % why)\n"
    "        sys.exit(1)\n"
    "    time.sleep(0.5)\n"
    "say('registered')\n"
    "ray.init(address=address, log_to_driver=False, logging_level='ERROR')\n"
    "@ray.remote(num_cpus=0)\n"
    "def one():\n"
    "    return 1\n"
    "ray.get(one.remote(), timeout=max(1.0, deadline - time.monotonic()))\n"
    "say('ready')\n";

enum ray_state { ST_OFF, ST_LOCAL, ST_STARTING, ST_UP, ST_DOWN, ST_STOPPING };

static const char *const state_names[] = {
    [ST_OFF] = "off", [ST_LOCAL] = "local", [ST_STARTING] = "starting",
    [ST_UP] = "up",   [ST_DOWN] = "down",   [ST_STOPPING] = "stopping",
};

/* The ray.* keys of the configuration (owned copies). */
struct ray_settings {
    enum ray_mode mode;
    char *command;
    long port;
    char *temp_dir;
    struct strv args;
    struct strv env_allow; /* attempt_env: what of esd's environment the head gets */
    long num_gpus;         /* ray.num_gpus; -1: counted */
    double start_timeout;  /* ray.start_timeout_secs */
    long prewarm_slots;    /* slots whose next attempt prewarms Ray workers
                            * (claim-ahead with the warm processor); 0: none */
};

struct ray;

/* A child's output pipe, read line by line into fn. */
struct ray_pipe {
    int fd; /* -1: closed */
    ev_io w;
    struct buf line;
    void (*fn)(struct ray *r, const char *s, size_t n);
};

/* One head, from spawn until its process group is empty. */
struct ray_head {
    struct spawned sp; /* sp.pid 0: none */
    bool exited;       /* the `ray` process itself was reaped */
    bool terminating;  /* SIGTERM sent to the group */
    double killed_at;  /* when SIGKILL was sent (0: not yet) */
    double started_at;
    double up_since;
    long num_gpus;         /* what it was started with (--num-gpus) */
    const char *gpus_from; /* where that came from (status) */
    ev_child exit_w;
    struct ray_pipe out; /* the head's output (sp.out_fd moved here) */
    ev_timer kill_w;
    ev_timer gone_w;
};

/* The readiness check of a starting head: one child at a time. */
struct ray_ready {
    struct spawned sp;        /* sp.pid 0: none (reaped) */
    unsigned long generation; /* of the head it checks */
    char *python;             /* the interpreter next to ray.command; NULL: none found */
    double next_at;           /* a failed check runs again from then on */
    bool said_fail;           /* it said why it failed */
    char why[256];            /* why the head is still starting (status) */
    ev_child exit_w;
    struct ray_pipe out;
};

/* The health check: one connect at a time. */
struct ray_probe {
    int fd; /* -1: none in flight */
    int failures;
    ev_timer tick_w; /* START_POLL_SECS or UP_POLL_SECS */
    ev_io conn_w;
    ev_timer timeout_w;
};

struct ray {
    struct ev_loop *loop; /* NULL: not initialised */
    struct ray_settings set;
    struct ray_settings next; /* a reloaded configuration waiting for the head to go */
    bool has_next;
    char *token_path; /* <temp_dir>/auth_token (persistent) */
    char *address;    /* 127.0.0.1:<port> (persistent) */
    enum ray_state state;
    unsigned long generation;
    unsigned restarts;
    double backoff; /* the next delay */
    double delay;   /* the delay chosen at the last loss */
    void (*listener)(void);
    bool stopping; /* ray_stop was called: no restarts, no reconfiguration */
    void (*stop_done)(void);
    struct ray_head head;
    struct ray_ready ready;
    struct ray_probe probe;
    ev_timer restart_w;
};

static struct ray ray;

static void head_spawn(struct ray *r);
static void head_check_gone(struct ray *r);

/* --- settings --- */

static void
settings_copy(struct ray_settings *s, const struct esd_conf *c)
{
    memset(s, 0, sizeof(*s));
    s->mode = c->ray_mode;
    s->command = xstrdup(c->ray_command && *c->ray_command ? c->ray_command : "ray");
    s->port = c->ray_port;
    s->temp_dir = c->ray_temp_dir ? xstrdup(c->ray_temp_dir) : NULL;
    strv_init(&s->args);
    for (size_t i = 0; i < c->ray_args.n; i++)
        strv_push(&s->args, c->ray_args.v[i]);
    strv_init(&s->env_allow);
    for (size_t i = 0; i < c->attempt_env.n; i++)
        strv_push(&s->env_allow, c->attempt_env.v[i]);
    s->num_gpus = c->ray_num_gpus;
    s->start_timeout = c->ray_start_timeout_secs > 0 ? (double)c->ray_start_timeout_secs : 120.;
    s->prewarm_slots = c->claim_ahead && c->dj_warm ? c->slots : 0;
}

static void
settings_free(struct ray_settings *s)
{
    free(s->command);
    free(s->temp_dir);
    strv_free(&s->args);
    strv_free(&s->env_allow);
    memset(s, 0, sizeof(*s));
}

static bool
str_eq(const char *a, const char *b)
{
    return a == b || (a && b && !strcmp(a, b));
}

static bool
settings_equal(const struct ray_settings *s, const struct esd_conf *c)
{
    if (s->mode != c->ray_mode || s->port != c->ray_port ||
        !str_eq(s->command, c->ray_command && *c->ray_command ? c->ray_command : "ray") ||
        !str_eq(s->temp_dir, c->ray_temp_dir) || s->args.n != c->ray_args.n ||
        s->num_gpus != c->ray_num_gpus ||
        s->start_timeout !=
            (c->ray_start_timeout_secs > 0 ? (double)c->ray_start_timeout_secs : 120.))
        return false;
    for (size_t i = 0; i < s->args.n; i++)
        if (strcmp(s->args.v[i], c->ray_args.v[i]))
            return false;
    return true;
}

/* Derived paths of the settings in effect. */
static void
settings_apply_paths(struct ray *r)
{
    free(r->token_path);
    free(r->address);
    r->token_path = NULL;
    r->address = NULL;
    if (r->set.mode != RAY_PERSISTENT)
        return;
    r->address = xasprintf(RAY_HOST ":%ld", r->set.port);
    if (r->set.temp_dir)
        r->token_path = fs_join(r->set.temp_dir, "auth_token");
}

/*
 * Creates the temp dir (0700) and the token file (0600, 64 hex characters)
 * unless they exist; an existing token is kept (attempts may hold it) and
 * only made private if it was not. The token is what keeps the head to
 * esd's attempts: its GCS port is on the loopback address, which every
 * local user can reach, and a Ray driver runs code as the head's user.
 */
static int
prepare_temp_dir(struct ray *r, struct esd_err *err)
{
    char token[66];
    struct stat st;
    int fd, rc;

    if (!r->set.temp_dir || !*r->set.temp_dir)
        return err_set(err, -EINVAL, "ray.temp_dir is not set");
    if ((rc = fs_mkdir_p(r->set.temp_dir, 0700, err)) < 0)
        return rc;
    fd = open(r->token_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd >= 0) {
        rc = 0;
        if (fstat(fd, &st) < 0)
            rc = err_sys(err, -errno, "cannot stat the Ray token %s", r->token_path);
        else if (!S_ISREG(st.st_mode))
            rc = err_set(err, -EINVAL, "the Ray token %s is not a regular file", r->token_path);
        else if ((st.st_mode & 077) && fchmod(fd, 0600) < 0)
            rc = err_sys(err, -errno, "cannot make the Ray token %s private", r->token_path);
        close(fd);
        return rc;
    }
    if (errno != ENOENT)
        return err_sys(err, -errno, "cannot open the Ray token %s", r->token_path);
    rand_hex32(token);
    rand_hex32(token + 32);
    token[64] = '\n';
    token[65] = '\0';
    rc = fs_create_excl(r->token_path, token, 65, 0600, NULL, err);
    return rc == -EEXIST ? 0 : rc;
}

/* --- state --- */

static bool
state_ready(enum ray_state s)
{
    return s == ST_UP || s == ST_LOCAL || s == ST_OFF;
}

/* Enters st; a loss (the head of a generation went away) bumps the
 * generation. The listener hears of every readiness change and every loss,
 * last, so that it may call back into this module. The generation is what
 * runner compares (ray_generation) to class a processor's failure during
 * a head's loss as the node's, not the recipe's. */
static void
set_state(struct ray *r, enum ray_state st, bool loss)
{
    bool was = state_ready(r->state);

    r->state = st;
    if (loss)
        r->generation++;
    if ((loss || was != state_ready(st)) && r->listener)
        r->listener();
}

/* The delay before the next restart: 1 s doubling to 60 s. */
static double
take_backoff(struct ray *r)
{
    double d = r->backoff < BACKOFF_MIN_SECS ? BACKOFF_MIN_SECS : r->backoff;

    r->backoff = d * 2 > BACKOFF_MAX_SECS ? BACKOFF_MAX_SECS : d * 2;
    return d;
}

static void
restart_schedule(struct ray *r, double delay)
{
    ev_timer_stop(r->loop, &r->restart_w);
    ev_timer_set(&r->restart_w, delay, 0.);
    ev_timer_start(r->loop, &r->restart_w);
}

static void
ray_restart_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct ray *r = w->data;

    r->restarts++;
    log_event(LOG_LVL_INFO, NULL, MSGID_RAY_RESTARTED, "restarting the ray head (restart %u)",
              r->restarts);
    head_spawn(r);
}

/* --- children's output --- */

/* Hands the complete lines of p->line to p->fn (and the rest if last, or if
 * it grew too long to be a line) and keeps the incomplete one. */
static void
pipe_lines(struct ray *r, struct ray_pipe *p, bool last)
{
    size_t start = 0;
    char *nl;

    if (!p->line.len)
        return;
    while ((nl = memchr(p->line.p + start, '\n', p->line.len - start))) {
        size_t n = (size_t)(nl - (p->line.p + start));

        p->fn(r, p->line.p + start, n);
        start += n + 1;
    }
    if (p->line.len - start && (last || p->line.len - start >= OUTPUT_LINE_MAX)) {
        p->fn(r, p->line.p + start, p->line.len - start);
        start = p->line.len;
    }
    if (start) {
        memmove(p->line.p, p->line.p + start, p->line.len - start);
        p->line.len -= start;
        p->line.p[p->line.len] = '\0';
    }
}

/* Takes over fd (a child's stdout+stderr), made non-blocking. */
static void
pipe_open(struct ray *r, struct ray_pipe *p, int fd)
{
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0)
        log_warning(NULL, "cannot make a ray child's output non-blocking: %s, ignoring",
                    strerror(errno));
    p->fd = fd;
    buf_init(&p->line);
    ev_io_set(&p->w, fd, EV_READ);
    ev_io_start(r->loop, &p->w);
}

static void
pipe_close(struct ray *r, struct ray_pipe *p)
{
    ev_io_stop(r->loop, &p->w);
    if (p->fd >= 0) {
        close(p->fd);
        pipe_lines(r, p, true);
    }
    p->fd = -1;
    buf_free(&p->line);
}

/* Reads one chunk; false at EOF (or an error), when the pipe is closed. */
static bool
pipe_read(struct ray *r, struct ray_pipe *p)
{
    char chunk[4096];
    ssize_t n = read(p->fd, chunk, sizeof(chunk));

    if (n > 0) {
        buf_append(&p->line, chunk, (size_t)n);
        pipe_lines(r, p, false);
        return true;
    }
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return errno == EINTR;
    if (n < 0)
        log_warning(NULL, "cannot read a ray child's output: %s, ignoring the rest",
                    strerror(errno));
    pipe_close(r, p);
    return false;
}

/* Reads what is left, then closes. */
static void
pipe_drain(struct ray *r, struct ray_pipe *p)
{
    while (p->fd >= 0 && pipe_read(r, p))
        ;
    pipe_close(r, p);
}

static void
pipe_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    struct ray *r = w->data;

    pipe_read(r, (struct ray_pipe *)((char *)w - offsetof(struct ray_pipe, w)));
}

static void
head_line(struct ray *r, const char *s, size_t n)
{
    log_debug(NULL, "ray: %.*s", (int)n, s);
}

/* --- health probe --- */

static void
probe_cancel(struct ray_probe *p, struct ev_loop *loop)
{
    ev_io_stop(loop, &p->conn_w);
    ev_timer_stop(loop, &p->timeout_w);
    if (p->fd >= 0)
        close(p->fd);
    p->fd = -1;
}

static void ready_kill(struct ray *r);

static void
health_stop(struct ray *r)
{
    ev_timer_stop(r->loop, &r->probe.tick_w);
    probe_cancel(&r->probe, r->loop);
    ready_kill(r);
}

static void
health_every(struct ray *r, double secs)
{
    r->probe.tick_w.repeat = secs;
    ev_timer_again(r->loop, &r->probe.tick_w);
}

/* The head is lost (exited, never answered, stopped answering): down, a new
 * generation, a restart after the backoff once its group is gone. */
static void
head_lost(struct ray *r, const char *why)
{
    /* a head that stayed up for a while earns a fresh backoff: its loss is
     * a new event, not the next failure of a head that cannot start */
    if (r->state == ST_UP && ev_now(r->loop) - r->head.up_since >= BACKOFF_RESET_SECS)
        r->backoff = BACKOFF_MIN_SECS;
    r->delay = take_backoff(r);
    health_stop(r);
    log_warning(NULL, "ray head on %s %s; restarting in %.0f s", r->address, why, r->delay);
    set_state(r, ST_DOWN, true);
}

static void head_terminate(struct ray *r);
static void head_environment(struct ray *r, struct strv *env);

/* --- readiness --- */

static void ready_why(struct ray *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Says why the head is still starting (esctl status). */
static void
ready_why(struct ray *r, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(r->ready.why, sizeof(r->ready.why), fmt, ap);
    va_end(ap);
}

static bool
is_exec(const char *path)
{
    struct stat st;

    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* The interpreter a "#!" line of file names, if it is an absolute path to
 * a python; NULL otherwise. Caller frees. */
static char *
shebang_python(const char *file)
{
    char line[256], *word, *base;
    ssize_t n;
    int fd = open(file, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);

    if (fd < 0)
        return NULL;
    n = read(fd, line, sizeof(line) - 1);
    close(fd);
    if (n < 3 || line[0] != '#' || line[1] != '!')
        return NULL;
    line[n] = '\0';
    word = line + 2 + strspn(line + 2, " \t");
    word[strcspn(word, " \t\r\n")] = '\0';
    base = strrchr(word, '/');
    if (word[0] != '/' || strncmp(base + 1, "python", 6) || !is_exec(word))
        return NULL;
    return xstrdup(word);
}

/*
 * The interpreter of ray.command, for the readiness check: the python3 (or
 * python) in the directory of the program it names (looked up in PATH, links
 * resolved: a virtual environment keeps both there), else the python its
 * "#!" line names. NULL if neither (a wrapper script, a stand-in): the head
 * is then up once its GCS port accepts. Caller frees.
 */
static char *
python_for(const char *command)
{
    static const char *const names[] = { "python3", "python" };
    char *found = NULL, *real, *py = NULL;
    const char *path = getenv("PATH"), *slash;

    if (strchr(command, '/')) {
        if (is_exec(command))
            found = xstrdup(command);
    } else {
        if (!path || !*path)
            path = SPAWN_DEFAULT_PATH;
        for (const char *p = path; !found;) {
            size_t n = strcspn(p, ":");
            char *c = xasprintf("%.*s/%s", (int)(n ? n : 1), n ? p : ".", command);

            if (is_exec(c))
                found = c;
            else
                free(c);
            if (!p[n])
                break;
            p += n + 1;
        }
    }
    if (!found)
        return NULL;
    if ((real = realpath(found, NULL)))
        free(found);
    else
        real = found;
    slash = strrchr(real, '/');
    for (size_t i = 0; !py && slash && i < sizeof(names) / sizeof(names[0]); i++) {
        char *c = xasprintf("%.*s/%s", (int)(slash - real), real, names[i]);

        if (is_exec(c))
            py = c;
        else
            free(c);
    }
    if (!py)
        py = shebang_python(real);
    free(real);
    return py;
}

/* The starting head took a task: up. */
static void
ready_up(struct ray *r, const char *how)
{
    r->head.up_since = ev_now(r->loop);
    r->probe.failures = 0;
    r->ready.why[0] = '\0';
    health_every(r, UP_POLL_SECS);
    log_notice(NULL, "ray head up on %s (%s, %.1f s after its start)", r->address, how,
               ev_now(r->loop) - r->head.started_at);
    set_state(r, ST_UP, false);
}

/* A line of the readiness check's output: its steps say why the head is
 * still starting. */
static void
ready_line(struct ray *r, const char *s, size_t n)
{
    size_t t = strlen(READY_TAG);

    log_debug(NULL, "ray readiness check: %.*s", (int)n, s);
    if (n < t || memcmp(s, READY_TAG, t) || r->ready.generation != r->generation ||
        r->state != ST_STARTING)
        return;
    s += t;
    n -= t;
    if (n == 3 && !memcmp(s, "gcs", 3)) {
        ready_why(r, "GCS answers, raylet not registered yet");
    } else if (n == 10 && !memcmp(s, "registered", 10)) {
        ready_why(r, "raylet registered, a test task has not run yet");
    } else if (n > 5 && !memcmp(s, "fail ", 5)) {
        ready_why(r, "GCS answers, %.*s", (int)(n - 5), s + 5);
        r->ready.said_fail = true;
    }
}

static void
ready_exit_cb(struct ev_loop *loop, ev_child *w, int revents)
{
    struct ray *r = w->data;
    struct ray_ready *rd = &r->ready;
    bool current = rd->generation == r->generation && r->state == ST_STARTING;
    char how[64], why[sizeof(rd->why)];
    int code;

    ev_child_stop(loop, w);
    /* what it left in the pipe, and whatever of its group still runs */
    spawn_signal(&rd->sp, SIGKILL);
    pipe_drain(r, &rd->out);
    rd->sp.pid = 0;
    if (!current)
        return;
    spawn_describe(w->rstatus, how, &code);
    if (code == 0) {
        ready_up(r, "its raylet took a task");
        return;
    }
    rd->next_at = ev_now(loop) + READY_RETRY_SECS;
    if (!rd->said_fail) {
        snprintf(why, sizeof(why), "%s", rd->why);
        ready_why(r, "%s (the readiness check ended: %s)", why, how);
    }
    log_info(NULL, "ray head on %s not ready yet: %s", r->address, rd->why);
}

/* Starts the readiness check of the head, unless one runs or a failed one
 * is too recent. */
static void
ready_start(struct ray *r)
{
    struct ray_ready *rd = &r->ready;
    double left = r->set.start_timeout - (ev_now(r->loop) - r->head.started_at);
    struct strv argv, env;
    struct esd_err err;
    int rc;

    if (rd->sp.pid || ev_now(r->loop) < rd->next_at)
        return;
    strv_init(&argv);
    strv_push(&argv, rd->python);
    strv_push(&argv, "-c");
    strv_push(&argv, READY_SCRIPT);
    strv_push(&argv, r->address);
    strv_push_owned(&argv, xasprintf("%.0f", left > 1 ? left : 1));
    strv_init(&env);
    head_environment(r, &env);
    rc = spawn_start(argv.v, env.v, r->set.temp_dir, &rd->sp, &err);
    strv_free(&argv);
    strv_free(&env);
    if (rc < 0) {
        rd->sp.pid = 0;
        rd->next_at = ev_now(r->loop) + READY_RETRY_SECS;
        ready_why(r, "GCS answers; the readiness check cannot start: %s", err.msg);
        log_warning(NULL, "cannot check the ray head on %s: %s; retrying in %.0f s", r->address,
                    err.msg, READY_RETRY_SECS);
        return;
    }
    rd->generation = r->generation;
    rd->said_fail = false;
    pipe_open(r, &rd->out, rd->sp.out_fd);
    rd->sp.out_fd = -1;
    ev_child_set(&rd->exit_w, rd->sp.pid, 0);
    ev_child_start(r->loop, &rd->exit_w);
    ready_why(r, "GCS answers, checking the raylet");
}

/* Ends a running check (its exit is still reaped by ready_exit_cb). */
static void
ready_kill(struct ray *r)
{
    if (r->ready.sp.pid)
        spawn_signal(&r->ready.sp, SIGKILL);
}

static void
ready_fini(struct ray *r)
{
    struct ray_ready *rd = &r->ready;

    if (rd->sp.pid)
        spawn_signal(&rd->sp, SIGKILL);
    ev_child_stop(r->loop, &rd->exit_w);
    pipe_close(r, &rd->out);
    free(rd->python);
    rd->python = NULL;
    rd->sp.pid = 0;
}

/* --- health probe results --- */

/* 0: something accepted a connection on the port; a negative errno if not. */
static void
probe_done(struct ray *r, int result)
{
    probe_cancel(&r->probe, r->loop);
    if (r->state == ST_STARTING) {
        if (result == 0 && !r->ready.python)
            ready_up(r, "its GCS port accepts; no python next to ray.command to check more");
        else if (result == 0)
            ready_start(r);
    } else if (r->state == ST_UP) {
        if (result == 0) {
            r->probe.failures = 0;
            return;
        }
        /* several in a row before the verdict: a head on a node whose
         * attempts use every CPU may be slow to accept once, and a false
         * loss would stop claims and class running attempts' failures as
         * infrastructure */
        r->probe.failures++;
        log_warning(NULL, "ray head on %s did not answer the health check: %s (%d of %d)",
                    r->address, strerror(-result), r->probe.failures, PROBE_MAX_FAILURES);
        if (r->probe.failures >= PROBE_MAX_FAILURES) {
            head_lost(r, "stopped answering");
            head_terminate(r);
        }
    }
}

static void
probe_conn_cb(struct ev_loop *loop, ev_io *w, int revents)
{
    struct ray *r = w->data;
    int e = 0;
    socklen_t len = sizeof(e);

    if (getsockopt(r->probe.fd, SOL_SOCKET, SO_ERROR, &e, &len) < 0)
        e = errno;
    probe_done(r, -e);
}

static void
probe_timeout_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    probe_done(w->data, -ETIMEDOUT);
}

/* A non-blocking connect to 127.0.0.1:<port>: the probe runs in the event
 * loop, and a head that hangs must not hang esd with it. */
static void
probe_start(struct ray *r)
{
    struct sockaddr_in a = { .sin_family = AF_INET,
                             .sin_port = htons((uint16_t)r->set.port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

    if (fd < 0) {
        probe_done(r, -errno);
        return;
    }
    if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0) {
        close(fd);
        probe_done(r, 0);
        return;
    }
    if (errno != EINPROGRESS) {
        int e = errno;

        close(fd);
        probe_done(r, -e);
        return;
    }
    r->probe.fd = fd;
    ev_io_set(&r->probe.conn_w, fd, EV_WRITE);
    ev_io_start(r->loop, &r->probe.conn_w);
    ev_timer_set(&r->probe.timeout_w, PROBE_TIMEOUT_SECS, 0.);
    ev_timer_start(r->loop, &r->probe.timeout_w);
}

static void
probe_tick_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct ray *r = w->data;

    if (r->state == ST_STARTING && ev_now(loop) - r->head.started_at >= r->set.start_timeout) {
        char why[sizeof(r->ready.why) + 64];

        snprintf(why, sizeof(why), "was not ready within %.0f s (%s)", r->set.start_timeout,
                 r->ready.why);
        head_lost(r, why);
        head_terminate(r);
        return;
    }
    if (r->probe.fd < 0)
        probe_start(r);
}

/* --- the head's process group --- */

/*
 * True while a process of group pgid is alive. Zombies do not count: in a
 * container whose init does not reap, the group's orphans stay zombies.
 */
static bool
group_alive(pid_t pgid)
{
    struct dirent *de;
    bool alive = false;
    DIR *d;

    if (kill(-pgid, 0) < 0 && errno == ESRCH)
        return false;
    if (!(d = opendir("/proc")))
        return true;
    while (!alive && (de = readdir(d))) {
        char path[sizeof(de->d_name) + 16], stat[512], *p, state;
        int fd, ppid, pgrp;
        ssize_t n;

        if (!isdigit((unsigned char)de->d_name[0]))
            continue;
        snprintf(path, sizeof(path), "/proc/%s/stat", de->d_name);
        if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
            continue;
        n = read(fd, stat, sizeof(stat) - 1);
        close(fd);
        if (n <= 0)
            continue;
        stat[n] = '\0';
        /* "pid (comm) state ppid pgrp ...": comm may hold anything */
        if ((p = strrchr(stat, ')')) && sscanf(p + 1, " %c %d %d", &state, &ppid, &pgrp) == 3 &&
            pgrp == pgid && state != 'Z' && state != 'X')
            alive = true;
    }
    closedir(d);
    return alive;
}

static void
head_signal(struct ray_head *h, int sig)
{
    spawn_signal(&h->sp, sig);
}

/* SIGTERM to the whole group, SIGKILL after KILL_AFTER_SECS. */
static void
head_terminate(struct ray *r)
{
    struct ray_head *h = &r->head;

    if (!h->sp.pid || h->terminating)
        return;
    h->terminating = true;
    head_signal(h, SIGTERM);
    ev_timer_set(&h->kill_w, KILL_AFTER_SECS, 0.);
    ev_timer_start(r->loop, &h->kill_w);
}

static void
head_kill_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    struct ray *r = w->data;

    log_warning(NULL,
                "ray head (process group %d) still running %.0f s after SIGTERM, "
                "sending SIGKILL",
                (int)r->head.sp.pid, KILL_AFTER_SECS);
    head_signal(&r->head, SIGKILL);
    r->head.killed_at = ev_now(loop);
    /* looks again until the group is gone, or gives up on it */
    ev_timer_start(loop, &r->head.gone_w);
    head_check_gone(r);
}

static void
head_gone_cb(struct ev_loop *loop, ev_timer *w, int revents)
{
    head_check_gone(w->data);
}

static void ray_start_mode(struct ray *r);

/* What comes after a head: a stop reported, a new configuration applied,
 * or a restart after the backoff. */
static void
head_after(struct ray *r)
{
    if (r->stopping) {
        void (*done)(void) = r->stop_done;

        r->stop_done = NULL;
        set_state(r, ST_DOWN, false);
        if (done)
            done();
        return;
    }
    if (r->has_next) {
        settings_free(&r->set);
        r->set = r->next;
        memset(&r->next, 0, sizeof(r->next));
        r->has_next = false;
        settings_apply_paths(r);
        r->backoff = BACKOFF_MIN_SECS;
        ray_start_mode(r);
        return;
    }
    if (r->state == ST_DOWN)
        restart_schedule(r, r->delay);
}

/* The group is empty: the pipe is drained and closed (every writer in the
 * group is dead), the watchers stopped. */
static void
head_finish(struct ray *r)
{
    struct ray_head *h = &r->head;

    ev_child_stop(r->loop, &h->exit_w);
    ev_timer_stop(r->loop, &h->kill_w);
    ev_timer_stop(r->loop, &h->gone_w);
    pipe_drain(r, &h->out);
    h->sp.pid = 0;
    h->exited = h->terminating = false;
    h->killed_at = 0;
    head_after(r);
}

/* Once the `ray` process has exited: finishes the head if nothing of its
 * group is alive, otherwise terminates the leftovers and looks again. */
static void
head_check_gone(struct ray *r)
{
    struct ray_head *h = &r->head;
    bool give_up = h->killed_at && ev_now(r->loop) - h->killed_at >= GIVE_UP_AFTER_KILL_SECS;

    if (!h->sp.pid || (!h->exited && !give_up))
        return;
    if (!h->exited || group_alive(h->sp.pid)) {
        if (!give_up) {
            if (!h->terminating)
                log_info(NULL, "ray head's process group %d outlived it, stopping the rest",
                         (int)h->sp.pid);
            head_terminate(r);
            if (!ev_is_active(&h->gone_w))
                ev_timer_start(r->loop, &h->gone_w);
            return;
        }
        log_warning(NULL,
                    "ray head's process group %d still has members %.0f s after SIGKILL, "
                    "ignoring them",
                    (int)h->sp.pid, GIVE_UP_AFTER_KILL_SECS);
    }
    head_finish(r);
}

static void
head_exit_cb(struct ev_loop *loop, ev_child *w, int revents)
{
    struct ray *r = w->data;
    char how[64], why[96];
    int code;

    ev_child_stop(loop, w);
    r->head.exited = true;
    spawn_describe(w->rstatus, how, &code);
    if (r->state == ST_STARTING || r->state == ST_UP) {
        snprintf(why, sizeof(why), "exited (%s)", how);
        head_lost(r, why);
    } else {
        log_info(NULL, "ray head (pid %d) exited (%s)", (int)w->rpid, how);
    }
    head_check_gone(r);
}

/* Entries the head never takes from esd's environment: systemd's word to
 * esd, and the Ray settings esd sets itself. */
static bool
head_env_skip(const char *e)
{
    static const char *const ours[] = { "RAY_AUTH_MODE=", "RAY_AUTH_TOKEN_PATH=",
                                        "RAY_USAGE_STATS_ENABLED=",
                                        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=" };

    for (size_t i = 0; i < sizeof(ours) / sizeof(ours[0]); i++)
        if (!strncmp(e, ours[i], strlen(ours[i])))
            return true;
    return notify_env_private(e);
}

/* Whether env has an entry that starts with name_eq. */
static bool
env_has(const struct strv *env, const char *name_eq)
{
    for (size_t i = 0; i < env->n; i++)
        if (!strncmp(env->v[i], name_eq, strlen(name_eq)))
            return true;
    return false;
}

/* esd's environment (less systemd's variables for esd) with the head's
 * own variables in place of any inherited ones. */
static void
head_environment(struct ray *r, struct strv *env)
{
    struct spawn_cred self = { 0 };
    struct esd_err err;
    const char *cvd;

    /* The head's workers run recipes: they get what attempts get of esd's
     * environment (attempt_env), and the login variables of esd's user. */
    if (spawn_cred_for_uid(geteuid(), &self, &err) < 0) {
        self.name = xstrdup("esd");
        self.home = xstrdup("/");
        self.shell = xstrdup("/bin/sh");
    }
    spawn_env_base(&r->set.env_allow, &self, head_env_skip, env);
    spawn_cred_free(&self);
    /* The GPUs the head offers are counted from esd's CUDA_VISIBLE_DEVICES:
     * the head hands out exactly those to its workers, whatever attempt_env
     * lets through. */
    if ((cvd = getenv("CUDA_VISIBLE_DEVICES"))) {
        char *e = xasprintf("CUDA_VISIBLE_DEVICES=%s", cvd);

        if (spawn_env_allowed(&r->set.env_allow, e))
            free(e);
        else
            strv_push_owned(env, e);
    }
    strv_push(env, "RAY_AUTH_MODE=token");
    strv_push_owned(env, xasprintf("RAY_AUTH_TOKEN_PATH=%s", r->token_path));
    strv_push(env, "RAY_USAGE_STATS_ENABLED=0");
    /* Claim-ahead: an attempt claimed ahead has the head start its Ray
     * workers and import Data-Juicer in them while it waits for its slot
     * (esd-dj, at most PREWARM_WORKERS of them). Ray kills idle workers
     * beyond its soft limit (its CPUs) after a second: those would be
     * gone before they are used. (The operator's own setting, let through
     * by attempt_env, has the last word.) */
    if (r->set.prewarm_slots > 0 && !env_has(env, "RAY_num_workers_soft_limit=")) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);

        if (cpus < 1)
            cpus = 1;
        strv_push_owned(env, xasprintf("RAY_num_workers_soft_limit=%ld",
                                       cpus + (cpus < PREWARM_WORKERS ? cpus : PREWARM_WORKERS) *
                                                  r->set.prewarm_slots));
    }
    /* Ray's own drain on SIGTERM (up to 30 s, meant for Serve) only delays
     * the stop until KILL_AFTER_SECS and a SIGKILL: esd stops the head
     * once its attempts are gone. */
    strv_push(env, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=0");
}

/* Starts a head; a failure is logged and retried after the backoff. */
static void
head_spawn(struct ray *r)
{
    struct ray_head *h = &r->head;
    struct strv argv, env;
    struct esd_err err;
    char port[24], gpus[24];
    bool own_gpus = true;
    int rc;
    /* --block: `ray start` stays in the foreground as the group's leader,
     * so esd supervises it as its own child (without it the command
     * returns at once and the head runs detached, unwatched). The loopback
     * address: the head serves this node's attempts only. */
    const char *fixed[] = { r->set.command,
                            "start",
                            "--head",
                            "--block",
                            "--port",
                            port,
                            "--temp-dir",
                            r->set.temp_dir,
                            "--node-ip-address",
                            RAY_HOST,
                            "--include-dashboard=false",
                            "--disable-usage-stats" };

    snprintf(port, sizeof(port), "%ld", r->set.port);
    strv_init(&argv);
    strv_init(&env);
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
        strv_push(&argv, fixed[i]);
    for (size_t i = 0; i < r->set.args.n; i++) {
        const char *a = r->set.args.v[i], *v = NULL;
        long long n;

        strv_push(&argv, a);
        if (!strcmp(a, "--num-gpus"))
            v = i + 1 < r->set.args.n ? r->set.args.v[i + 1] : "";
        else if (!strncmp(a, "--num-gpus=", 11))
            v = a + 11;
        if (v) {
            /* ray.args has the last word */
            own_gpus = false;
            h->num_gpus = parse_int(v, 0, 1 << 20, &n) == 0 ? (long)n : -1;
            h->gpus_from = "ray.args";
        }
    }
    if (own_gpus) {
        h->num_gpus =
            ray_gpus_count(r->set.num_gpus, getenv("CUDA_VISIBLE_DEVICES"), "/dev", &h->gpus_from);
        snprintf(gpus, sizeof(gpus), "%ld", h->num_gpus);
        strv_push(&argv, "--num-gpus");
        strv_push(&argv, gpus);
    }
    free(r->ready.python);
    r->ready.python = python_for(r->set.command);
    r->ready.next_at = 0;
    ready_why(r, "waiting for the GCS port");
    if ((rc = prepare_temp_dir(r, &err)) == 0) {
        head_environment(r, &env);
        rc = spawn_start(argv.v, env.v, NULL, &h->sp, &err);
    }
    strv_free(&argv);
    strv_free(&env);
    if (rc < 0) {
        r->delay = take_backoff(r);
        log_warning(NULL, "cannot start the ray head: %s; retrying in %.0f s", err.msg, r->delay);
        set_state(r, ST_DOWN, false);
        restart_schedule(r, r->delay);
        return;
    }
    h->exited = h->terminating = false;
    h->killed_at = 0;
    h->started_at = ev_now(r->loop);
    ev_child_set(&h->exit_w, h->sp.pid, 0);
    ev_child_start(r->loop, &h->exit_w);
    pipe_open(r, &h->out, h->sp.out_fd);
    h->sp.out_fd = -1;
    /* each head its own generation, so that an attempt started on an
     * earlier one is told apart (runner's ray_gen) */
    r->generation++;
    r->probe.failures = 0;
    health_every(r, START_POLL_SECS);
    log_info(NULL, "starting the ray head on %s (pid %d, temp dir %s, %ld GPUs from %s)",
             r->address, (int)h->sp.pid, r->set.temp_dir, h->num_gpus, h->gpus_from);
    set_state(r, ST_STARTING, false);
}

/* Enters the mode of the settings in effect (no head exists). */
static void
ray_start_mode(struct ray *r)
{
    switch (r->set.mode) {
    case RAY_PERSISTENT:
        head_spawn(r);
        break;
    case RAY_PER_ATTEMPT:
        set_state(r, ST_LOCAL, false);
        break;
    case RAY_OFF:
        set_state(r, ST_OFF, false);
        break;
    }
}

/* Ends the current head (if any) with SIGTERM to its group; head_after
 * decides what comes next once it is gone. */
static void
ray_leave(struct ray *r)
{
    bool loss = r->state == ST_STARTING || r->state == ST_UP;

    ev_timer_stop(r->loop, &r->restart_w);
    health_stop(r);
    if (!r->head.sp.pid) {
        head_after(r);
        return;
    }
    log_info(NULL, "stopping the ray head (process group %d)", (int)r->head.sp.pid);
    set_state(r, ST_STOPPING, loss);
    head_terminate(r);
    head_check_gone(r);
}

/* --- public --- */

long
ray_gpus_count(long configured, const char *cuda_visible, const char *dev_dir,
               const char **ret_from)
{
    const char *p;
    struct dirent *de;
    long n = 0;
    DIR *d;

    if (configured >= 0) {
        *ret_from = "ray.num_gpus";
        return configured;
    }
    if (cuda_visible) {
        /* CUDA's own words for none; else a comma-separated list of
         * indices or UUIDs (GPU-…, MIG-…) */
        *ret_from = "CUDA_VISIBLE_DEVICES";
        p = cuda_visible + strspn(cuda_visible, " \t");
        if (!*p || !strcmp(p, "-1") || !strcmp(p, "NoDevFiles"))
            return 0;
        while (*p) {
            size_t len = strcspn(p, ",");

            if (len > strspn(p, " \t"))
                n++;
            p += len + (p[len] == ',');
        }
        return n;
    }
    *ret_from = "/dev/nvidia*";
    if (!(d = opendir(dev_dir)))
        return 0;
    while ((de = readdir(d)))
        if (!strncmp(de->d_name, "nvidia", 6) && de->d_name[6] &&
            strspn(de->d_name + 6, "0123456789") == strlen(de->d_name + 6))
            n++;
    closedir(d);
    return n;
}

void
ray_status_json(cJSON *o)
{
    struct ray *r = &ray;

    if (!o || !r->loop || r->set.mode != RAY_PERSISTENT)
        return;
    if (r->state == ST_STARTING && r->ready.why[0])
        json_add_str(o, "starting", r->ready.why);
    json_add_str(o, "ready_check", r->ready.python ? "task" : "port");
    if (r->head.gpus_from) {
        if (r->head.num_gpus >= 0)
            json_add_int(o, "num_gpus", r->head.num_gpus);
        json_add_str(o, "gpus_from", r->head.gpus_from);
    }
}

int
ray_init(struct ev_loop *loop, const struct esd_conf *c, struct esd_err *err)
{
    struct ray *r = &ray;
    int rc;

    r->loop = loop;
    settings_copy(&r->set, c);
    settings_apply_paths(r);
    r->backoff = BACKOFF_MIN_SECS;
    r->head.sp.pid = 0;
    r->head.sp.out_fd = -1;
    r->head.out.fd = r->ready.out.fd = -1;
    r->head.out.fn = head_line;
    r->ready.out.fn = ready_line;
    r->probe.fd = -1;
    ev_child_init(&r->head.exit_w, head_exit_cb, 0, 0);
    ev_io_init(&r->head.out.w, pipe_cb, -1, EV_READ);
    ev_io_init(&r->ready.out.w, pipe_cb, -1, EV_READ);
    ev_child_init(&r->ready.exit_w, ready_exit_cb, 0, 0);
    r->ready.out.w.data = r->ready.exit_w.data = r;
    ev_timer_init(&r->head.kill_w, head_kill_cb, KILL_AFTER_SECS, 0.);
    ev_timer_init(&r->head.gone_w, head_gone_cb, GONE_POLL_SECS, GONE_POLL_SECS);
    ev_timer_init(&r->probe.tick_w, probe_tick_cb, 0., START_POLL_SECS);
    ev_io_init(&r->probe.conn_w, probe_conn_cb, -1, EV_WRITE);
    ev_timer_init(&r->probe.timeout_w, probe_timeout_cb, PROBE_TIMEOUT_SECS, 0.);
    ev_timer_init(&r->restart_w, ray_restart_cb, 0., 0.);
    r->head.exit_w.data = r->head.out.w.data = r;
    r->head.kill_w.data = r->head.gone_w.data = r;
    r->probe.tick_w.data = r->probe.conn_w.data = r->probe.timeout_w.data = r;
    r->restart_w.data = r;
    /* the first state is no change for the listener */
    r->state = r->set.mode == RAY_PER_ATTEMPT ? ST_LOCAL
               : r->set.mode == RAY_OFF       ? ST_OFF
                                              : ST_DOWN;
    if (r->set.mode == RAY_PERSISTENT && (rc = prepare_temp_dir(r, err)) < 0)
        return rc;
    ray_start_mode(r);
    return 0;
}

void
ray_reconfigure(const struct esd_conf *c)
{
    struct ray *r = &ray;

    if (!r->loop || settings_equal(r->has_next ? &r->next : &r->set, c))
        return;
    if (r->stopping) {
        log_info(NULL, "ray settings changed after the stop, ignoring them");
        return;
    }
    settings_free(&r->next);
    settings_copy(&r->next, c);
    r->has_next = true;
    if (r->state == ST_STOPPING)
        return; /* the head on its way out; head_after applies next */
    log_info(NULL, "ray settings changed, %s",
             r->set.mode == RAY_PERSISTENT ? "restarting the head" : "applying them");
    ray_leave(r);
}

void
ray_set_listener(void (*changed)(void))
{
    ray.listener = changed;
}

bool
ray_ready(void)
{
    return ray.loop && state_ready(ray.state);
}

const char *
ray_address(void)
{
    switch (ray.set.mode) {
    case RAY_PERSISTENT:
        return ray.address;
    case RAY_PER_ATTEMPT:
        return "local";
    case RAY_OFF:
        break;
    }
    return NULL;
}

unsigned long
ray_generation(void)
{
    return ray.generation;
}

/* Drops the entries of env that set name (with its '='). */
static void
env_unset(struct strv *env, const char *name_eq)
{
    size_t j = 0, len = strlen(name_eq);

    for (size_t i = 0; i < env->n; i++) {
        if (!strncmp(env->v[i], name_eq, len))
            free(env->v[i]);
        else
            env->v[j++] = env->v[i];
    }
    env->n = j;
    if (env->v)
        env->v[j] = NULL;
}

void
ray_env(struct strv *env)
{
    char token[33];

    if (ray.loop && ray.set.mode == RAY_PER_ATTEMPT) {
        /* Ray 2.60's ray.init() of a local cluster turns token auth on
         * and, without a token, writes one to ~/.ray/auth_token: a user
         * without a writable home (a service user's /nonexistent) could
         * run no attempt. A token of the attempt's own, in its
         * environment, is read before any file, and no file is written. */
        env_unset(env, "RAY_AUTH_MODE=");
        env_unset(env, "RAY_AUTH_TOKEN=");
        env_unset(env, "RAY_AUTH_TOKEN_PATH=");
        rand_hex32(token);
        strv_push(env, "RAY_AUTH_MODE=token");
        strv_push_owned(env, xasprintf("RAY_AUTH_TOKEN=%s", token));
        return;
    }
    if (!ray.loop || ray.set.mode != RAY_PERSISTENT || !ray.token_path)
        return;
    env_unset(env, "RAY_AUTH_MODE=");
    env_unset(env, "RAY_AUTH_TOKEN=");
    env_unset(env, "RAY_AUTH_TOKEN_PATH=");
    strv_push(env, "RAY_AUTH_MODE=token");
    strv_push_owned(env, xasprintf("RAY_AUTH_TOKEN_PATH=%s", ray.token_path));
}

const char *
ray_state_name(void)
{
    return state_names[ray.loop ? ray.state : ST_OFF];
}

unsigned
ray_restarts(void)
{
    return ray.restarts;
}

void
ray_stop(void (*done)(void))
{
    struct ray *r = &ray;

    if (!r->loop) {
        if (done)
            done();
        return;
    }
    settings_free(&r->next);
    r->has_next = false;
    r->stopping = true;
    if (!r->head.sp.pid) {
        /* no head: local, off, or waiting to restart one */
        ev_timer_stop(r->loop, &r->restart_w);
        health_stop(r);
        if (r->state != ST_LOCAL && r->state != ST_OFF)
            set_state(r, ST_DOWN, false);
        if (done)
            done();
        return;
    }
    r->stop_done = done;
    ray_leave(r);
}

void
ray_fini(void)
{
    struct ray *r = &ray;
    void (*listener)(void) = r->listener;

    if (!r->loop)
        return;
    if (r->head.sp.pid) {
        if (!r->head.exited)
            log_warning(NULL, "ray head (process group %d) still running at exit, killing it",
                        (int)r->head.sp.pid);
        head_signal(&r->head, SIGKILL);
    }
    ev_child_stop(r->loop, &r->head.exit_w);
    ev_timer_stop(r->loop, &r->head.kill_w);
    ev_timer_stop(r->loop, &r->head.gone_w);
    ev_io_stop(r->loop, &r->head.out.w);
    if (r->head.out.fd >= 0)
        close(r->head.out.fd);
    buf_free(&r->head.out.line);
    ready_fini(r);
    health_stop(r);
    ev_timer_stop(r->loop, &r->restart_w);
    settings_free(&r->set);
    settings_free(&r->next);
    free(r->token_path);
    free(r->address);
    memset(r, 0, sizeof(*r));
    r->listener = listener;
}
