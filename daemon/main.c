/*
 * esd: the elastic-sharding daemon. main only parses the command line and
 * wires the modules: init in dependency order, the loop, fini in reverse.
 * Signals: SIGTERM and SIGINT drain and stop, SIGHUP reloads the
 * configuration (a bad file keeps the old one), SIGPIPE is ignored.
 */
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/resource.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <ev.h>

#include "config.h"
#include "contain.h"
#include "ctl.h"
#include "engine.h"
#include "helper.h"
#include "json.h"
#include "log.h"
#include "notify.h"
#include "oneshot.h"
#include "ray.h"
#include "spawn.h"
#include "unitcheck.h"
#include "suggest.h"

static struct {
    struct ev_loop *loop;
    struct esd_conf *conf; /* replaced whole on reload: modules keep pointers */
    const char *path;
    bool path_given;
    ev_signal term_w, int_w, hup_w;
    bool stopping;
    int exit_code;
} M;

static void
usage(FILE *f)
{
    fprintf(f,
            "usage: esd [-f] [-c FILE] [--check-config [--unit UNIT] [--user USER]] "
            "[--help-config] [--version]\n"
            "       esd run --job-dir DIR [OPTION...]   (one job on every node: esd run --help)\n"
            "  -f, --foreground     log to stderr instead of the journal\n"
            "  -c, --config FILE    configuration (default %s)\n"
            "  --check-config       validate the configuration and exit: as the unit's\n"
            "                       User= and under its sandbox (esd.service without -c)\n"
            "  --unit UNIT          --check-config: the unit to check for\n"
            "  --user USER          --check-config: the user to check as (root only)\n"
            "  --help-config        list every configuration key and its default\n"
            "  --version            print the version\n"
            "See esd(8) and esd.yaml(5).\n",
            ESD_CONFIG_DEFAULT);
}

/* The configuration at path (the defaults if the default file is
 * absent), and what it cannot be as the user esd runs as. */
static int
load_config(struct esd_conf *c, struct esd_err *err)
{
    struct stat st;
    int r;

    if (!M.path_given && stat(M.path, &st) < 0 && errno == ENOENT)
        config_defaults(c);
    else if ((r = config_load(M.path, c, err)) < 0)
        return r;
    if (geteuid() == 0 && c->ray_mode == RAY_PERSISTENT) {
        /* Ray runs its workers as the head's user: a head of root's would
         * run the job owners' recipes as root, and no other user may use
         * its token and session files. */
        config_free(c);
        return err_set(err, -EPERM,
                       "%s: ray.mode persistent needs esd to run as the user "
                       "that owns the jobs (systemd User=), not as root, whose Ray head would "
                       "run every recipe as root; as root, use ray.mode per-attempt or off",
                       M.path_given || stat(M.path, &st) == 0 ? M.path : "the defaults");
    }
    return 0;
}

/* esd --check-config: the file as the unit's esd will load it (its User=
 * and sandbox, unitcheck.h): esd.service's when no -c is given and
 * systemd knows it, or unit's; as the caller without a unit. */
static int
check_config(const char *unit, const char *user)
{
    struct unit_sandbox sb;
    struct esd_conf c;
    struct strv problems;
    struct esd_err err;
    bool have_sb = false;
    const char *as = user, *shown;
    int rc;

    if (unit || !M.path_given) {
        if (unit_sandbox_load(unit ? unit : "esd.service", &sb, &err) == 0)
            have_sb = true;
        else if (unit) {
            fprintf(stderr, "esd: %s\n", err.msg);
            return 1;
        }
    }
    if (!as && have_sb) {
        as = sb.user ? sb.user : "root";
        if (geteuid() != 0 && (!getpwnam(as) || getpwnam(as)->pw_uid != geteuid())) {
            fprintf(stderr,
                    "esd: checking as uid %u, not as %s's user %s (run it as root to "
                    "check as %s)\n",
                    (unsigned)geteuid(), sb.unit, as, as);
            as = NULL;
        }
    }
    if (as && unitcheck_become(as, &err) < 0) {
        fprintf(stderr, "esd: %s\n", err.msg);
        if (have_sb)
            unit_sandbox_free(&sb);
        return 1;
    }
    if (load_config(&c, &err) < 0) {
        fprintf(stderr, "esd: %s\n", err.msg);
        if (have_sb)
            unit_sandbox_free(&sb);
        return 1;
    }
    strv_init(&problems);
    unitcheck_paths(&c, have_sb ? &sb : NULL, &problems);
    shown = M.path_given || access(M.path, F_OK) == 0 ? M.path : "defaults";
    /* without a unit (a file of one's own, -c) what the paths lack is
     * only a warning: they may be right where the file will be used */
    for (size_t i = 0; i < problems.n; i++)
        fprintf(stderr, "esd: %s: %s%s\n", shown, have_sb ? "" : "warning: ", problems.v[i]);
    rc = have_sb && problems.n ? 1 : 0;
    if (!rc) {
        if (have_sb)
            printf("%s: ok (as user %s, under %s's sandbox)\n", shown,
                   getpwuid(geteuid()) ? getpwuid(geteuid())->pw_name : "?", sb.unit);
        else
            printf("%s: ok\n", shown);
    }
    config_free(&c);
    if (have_sb)
        unit_sandbox_free(&sb);
    strv_free(&problems);
    return rc;
}

static void
main_stop_cb(struct ev_loop *loop, ev_signal *w, int revents)
{
    (void)loop;
    (void)revents;
    if (M.stopping) {
        log_notice(NULL, "signal %d while draining: stopping attempts and merges now", w->signum);
        engine_stop_now();
        return;
    }
    M.stopping = true;
    notify_stopping();
    log_notice(NULL, "signal %d: draining", w->signum);
    engine_drain();
}

/* Reloads esd.yaml: a file that does not load is refused (err says why)
 * and the running configuration stays. SIGHUP and the control socket's
 * "reload" (esctl reload, the unit's ExecReload=) both come here. */
static int
main_reload(struct esd_err *err)
{
    struct esd_conf *next = xcalloc(1, sizeof(*next)), *old = M.conf;
    int r;

    notify_reloading();
    if ((r = load_config(next, err)) < 0) {
        log_err(NULL, "reload: %s; keeping the current configuration", err->msg);
        free(next);
        notify_ready();
        return r;
    }
    if (strcmp(next->state_dir, old->state_dir) || strcmp(next->socket_path, old->socket_path) ||
        strcmp(next->node_name, old->node_name) ||
        strcmp(next->spool_dir ? next->spool_dir : "", old->spool_dir ? old->spool_dir : "") ||
        strcmp(next->socket_group ? next->socket_group : "",
               old->socket_group ? old->socket_group : "") ||
        next->socket_mode != old->socket_mode || next->log_target != old->log_target)
        log_warning(NULL, "reload: state_dir, socket, socket_group, socket_mode, node_name, "
                          "spool_dir and log.target take effect at the next restart (the "
                          "control group's members are looked up again now)");
    free(next->state_dir);
    next->state_dir = xstrdup(old->state_dir);
    free(next->socket_path);
    next->socket_path = xstrdup(old->socket_path);
    free(next->node_name);
    next->node_name = xstrdup(old->node_name);
    /* every module moves to the new struct (comparing with the old one
     * first where it must), then the old one goes */
    engine_reconfigure(next);
    log_set_level(next->log_level);
    M.conf = next;
    config_free(old);
    free(old);
    log_notice(NULL, "reloaded %s", M.path);
    notify_ready();
    return 0;
}

static void
main_reload_cb(struct ev_loop *loop, ev_signal *w, int revents)
{
    struct esd_err err;

    (void)loop;
    (void)w;
    (void)revents;
    main_reload(&err);
}

/* Room for every control connection, attempt and child: the soft limit
 * of open files up to the hard one (systemd's default soft limit is 1024). */
static void
raise_fd_limit(void)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max > 65536 ? 65536 : rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
            fprintf(stderr, "esd: cannot raise the limit of open files: %s\n", strerror(errno));
    }
}

int
main(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "foreground", no_argument, NULL, 'f' },
        { "config", required_argument, NULL, 'c' },
        { "check-config", no_argument, NULL, 'C' },
        { "help-config", no_argument, NULL, 'K' },
        { "version", no_argument, NULL, 'V' },
        { "help", no_argument, NULL, 'h' },
        { "test-hang-watchdog", no_argument, NULL, 'W' },
        { "unit", required_argument, NULL, 'U' },
        { "user", required_argument, NULL, 'u' },
        { NULL, 0, NULL, 0 },
    };
    bool foreground = false, check = false, hang_watchdog = false;
    const char *unit = NULL, *user = NULL;
    struct esd_err err;
    int opt;

    /* the keeper of an attempt forked by the warm processor (runner.c):
     * nothing of the daemon's runs in it */
    if (argc > 1 && !strcmp(argv[1], SPAWN_KEEPER_ARG))
        return spawn_keeper_adopted(argc, argv);
    /* esd run: one job, in the foreground, on every node of a scheduler's job */
    if (argc > 1 && !strcmp(argv[1], "run"))
        return oneshot_main(argc - 1, argv + 1);
    json_init();
    M.path = ESD_CONFIG_DEFAULT;
    opterr = 0; /* suggest_getopt_error() words the complaints */
    while ((opt = getopt_long(argc, argv, ":fc:h", longopts, NULL)) != -1) {
        switch (opt) {
        case 'f':
            foreground = true;
            break;
        case 'c':
            M.path = optarg;
            M.path_given = true;
            break;
        case 'C':
            check = true;
            break;
        case 'K':
            config_print_keys();
            return 0;
        case 'V':
            printf("esd %s\n", ESD_VERSION);
            return 0;
        case 'W':
            hang_watchdog = true;
            break;
        case 'U':
            unit = optarg;
            break;
        case 'u':
            user = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        case '?':
        case ':':
            suggest_getopt_error(opt, argv, longopts, &err);
            fprintf(stderr, "esd: %s (see esd --help)\n", err.msg);
            return 2;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (optind < argc || ((unit || user) && !check)) {
        usage(stderr);
        return 2;
    }
    if (check)
        return check_config(unit, user);
    /* Start-up errors end the program with a clear message. */
    M.conf = xcalloc(1, sizeof(*M.conf));
    if (load_config(M.conf, &err) < 0) {
        fprintf(stderr, "esd: %s\n", err.msg);
        return 1;
    }
    signal(SIGPIPE, SIG_IGN);
    raise_fd_limit();
    /* As root esd acts in job directories with their owners' file system
     * identity (setfsuid), which keeps the supplementary groups: root's
     * own (sudo esd -f) must not lend their access. */
    if (geteuid() == 0 && setgroups(0, NULL) < 0) {
        fprintf(stderr, "esd: cannot drop the supplementary groups: %s\n", strerror(errno));
        return 1;
    }
    /* A service user's esd runs recipes with its own uid: they must not be
     * able to attach to it (ptrace, /proc/<pid>/mem) or read its memory. */
#ifndef __SANITIZE_ADDRESS__ /* (LeakSanitizer attaches to the process at exit) */
    if (geteuid() != 0)
        prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
#endif
    log_init(M.conf->log_target, M.conf->log_level, foreground, M.conf->node_name);
    M.loop = ev_default_loop(EVFLAG_AUTO);
    if (!M.loop) {
        fprintf(stderr, "esd: cannot initialise the event loop\n");
        return 1;
    }
    /* before anything is started: the subreaper, the attempts' cgroups */
    contain_init(M.loop);
    ev_signal_init(&M.term_w, main_stop_cb, SIGTERM);
    ev_signal_start(M.loop, &M.term_w);
    ev_signal_init(&M.int_w, main_stop_cb, SIGINT);
    ev_signal_start(M.loop, &M.int_w);
    ev_signal_init(&M.hup_w, main_reload_cb, SIGHUP);
    ev_signal_start(M.loop, &M.hup_w);

    notify_init(M.loop);
    /* Tests: idle control connections are closed sooner. */
    if (getenv("ESD_TEST_IDLE_SECS")) {
        long long secs;

        if (parse_int(getenv("ESD_TEST_IDLE_SECS"), 1, 3600, &secs) == 0)
            ctl_test_set_idle((double)secs);
    }
    /* Tests: a silent helper is killed sooner. */
    if (getenv("ESD_TEST_HELPER_SILENCE_SECS")) {
        long long secs;

        if (parse_int(getenv("ESD_TEST_HELPER_SILENCE_SECS"), 1, 3600, &secs) == 0)
            helper_test_set_silence((double)secs);
    }
    if (hang_watchdog)
        notify_test_stop_watchdog();
    ctl_set_reload(main_reload);
    if (engine_init(M.loop, M.conf, notify_listen_fd(), &err) < 0) {
        log_err(NULL, "%s", err.msg);
        fprintf(stderr, "esd: %s\n", err.msg);
        return 1;
    }
    log_notice(NULL, "esd %s started: node %s, %ld slot(s), ray %s, state in %s, socket %s",
               ESD_VERSION, M.conf->node_name, M.conf->slots, ray_state_name(), M.conf->state_dir,
               M.conf->socket_path);
    notify_ready();

    ev_run(M.loop, 0);

    log_notice(NULL, "stopped");
    engine_fini();
    notify_fini();
    contain_fini();
    config_free(M.conf);
    free(M.conf);
    ev_loop_destroy(M.loop);
    return M.exit_code;
}
