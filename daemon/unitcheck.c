/*
 * unitcheck: esd --check-config as the unit runs (unitcheck.h).
 */
#include "unitcheck.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fsutil.h"
#include "pypath.h"
#include "spawn.h"

/* The PATH systemd gives a system service (systemd 252 on a merged /usr). */
#define UNIT_PATH "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"

static const char *const props[] = {
    "LoadState",      "User",          "ProtectSystem",     "ProtectHome",    "PrivateTmp",
    "ReadWritePaths", "ReadOnlyPaths", "InaccessiblePaths", "StateDirectory", "RuntimeDirectory"
};

/* A path list of systemctl show: blank-separated, each maybe prefixed by
 * "-" (ignore if missing) or "+" (relative to RootDirectory=). */
static void
push_paths(struct strv *v, const char *value, const char *under)
{
    struct strv words;

    strv_init(&words);
    strv_split(&words, value);
    for (size_t i = 0; i < words.n; i++) {
        const char *p = words.v[i];

        while (*p == '-' || *p == '+')
            p++;
        if (*p)
            strv_push_owned(v, under ? fs_join(under, p) : xstrdup(p));
    }
    strv_free(&words);
}

int
unit_sandbox_load(const char *unit, struct unit_sandbox *ret, struct esd_err *err)
{
    struct stat st;
    struct strv argv;
    struct buf out;
    char *line, *save = NULL, *load = NULL;
    int status = 0, r;

    memset(ret, 0, sizeof(*ret));
    if (stat("/run/systemd/system", &st) < 0)
        return err_set(err, -ENOENT, "systemd does not run here");
    strv_init(&argv);
    strv_push(&argv, "systemctl");
    strv_push(&argv, "show");
    for (size_t i = 0; i < sizeof(props) / sizeof(props[0]); i++)
        strv_push_owned(&argv, xasprintf("--property=%s", props[i]));
    strv_push(&argv, "--");
    strv_push(&argv, unit);
    buf_init(&out);
    r = spawn_capture(argv.v, "/", 30, 1 << 20, &out, &status, err);
    strv_free(&argv);
    if (r < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        buf_free(&out);
        return r < 0 ? r : err_set(err, -EIO, "systemctl show %s failed", unit);
    }
    strv_init(&ret->rw);
    strv_init(&ret->ro);
    strv_init(&ret->hidden);
    ret->unit = xstrdup(unit);
    buf_putc(&out, '\0');
    for (line = strtok_r(out.p, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *eq = strchr(line, '=');
        const char *v;

        if (!eq)
            continue;
        *eq = '\0';
        v = eq + 1;
        if (!strcmp(line, "LoadState"))
            load = xstrdup(v);
        else if (!strcmp(line, "User") && *v)
            ret->user = xstrdup(v);
        else if (!strcmp(line, "ProtectSystem"))
            ret->protect_system = xstrdup(v);
        else if (!strcmp(line, "ProtectHome"))
            ret->protect_home = xstrdup(v);
        else if (!strcmp(line, "PrivateTmp"))
            ret->private_tmp = !strcmp(v, "yes");
        else if (!strcmp(line, "ReadWritePaths"))
            push_paths(&ret->rw, v, NULL);
        else if (!strcmp(line, "ReadOnlyPaths"))
            push_paths(&ret->ro, v, NULL);
        else if (!strcmp(line, "InaccessiblePaths"))
            push_paths(&ret->hidden, v, NULL);
        else if (!strcmp(line, "StateDirectory"))
            push_paths(&ret->rw, v, "/var/lib");
        else if (!strcmp(line, "RuntimeDirectory"))
            push_paths(&ret->rw, v, "/run");
    }
    buf_free(&out);
    if (!load || strcmp(load, "loaded")) {
        r = err_set(err, -ENOENT, "systemd has no unit %s (LoadState=%s)", unit, load ? load : "?");
        free(load);
        unit_sandbox_free(ret);
        return r;
    }
    free(load);
    return 0;
}

void
unit_sandbox_free(struct unit_sandbox *sb)
{
    free(sb->unit);
    free(sb->user);
    free(sb->protect_system);
    free(sb->protect_home);
    strv_free(&sb->rw);
    strv_free(&sb->ro);
    strv_free(&sb->hidden);
    memset(sb, 0, sizeof(*sb));
}

/* The length of the longest entry of v that holds path; 0 if none. */
static size_t
deepest(const struct strv *v, const char *path)
{
    size_t best = 0;

    for (size_t i = 0; i < v->n; i++)
        if (fs_is_inside(v->v[i], path) && strlen(v->v[i]) > best)
            best = strlen(v->v[i]);
    return best;
}

/* The deepest of the directories (NULL-terminated) that holds path. */
static size_t
deepest_of(const char *const *dirs, const char *path, const char **which)
{
    size_t best = 0;

    for (; *dirs; dirs++)
        if (fs_is_inside(*dirs, path) && strlen(*dirs) > best) {
            best = strlen(*dirs);
            *which = *dirs;
        }
    return best;
}

static bool
is(const char *value, const char *want)
{
    return value && !strcmp(value, want);
}

char *
unit_sandbox_why(const struct unit_sandbox *sb, const char *path, bool write)
{
    static const char *const home[] = { "/home", "/root", "/run/user", NULL };
    static const char *const tmp[] = { "/tmp", "/var/tmp", NULL };
    static const char *const api[] = { "/dev", "/proc", "/sys", NULL };
    static const char *const usr[] = { "/usr", "/boot", "/efi", NULL };
    static const char *const usr_etc[] = { "/usr", "/boot", "/efi", "/etc", NULL };
    const char *which = NULL, *reason = NULL;
    size_t rw = deepest(&sb->rw, path), ro = 0, n;

    if (deepest(&sb->hidden, path))
        return xasprintf("%s hides it (InaccessiblePaths=)", sb->unit);
    if ((is(sb->protect_home, "yes") || is(sb->protect_home, "tmpfs")) &&
        deepest_of(home, path, &which) > rw)
        return xasprintf("%s hides %s (ProtectHome=%s): move it out of /home, /root and "
                         "/run/user, or set ProtectHome=read-only in a drop-in (systemctl edit "
                         "%s)",
                         sb->unit, which, sb->protect_home, sb->unit);
    if (sb->private_tmp && deepest_of(tmp, path, &which))
        return xasprintf("%s has a %s of its own (PrivateTmp=yes), which no other process "
                         "sees: use a directory outside /tmp and /var/tmp",
                         sb->unit, which);
    if (!write)
        return NULL;
    if (is(sb->protect_system, "strict") && !deepest_of(api, path, &which)) {
        ro = 1;
        reason = "ProtectSystem=strict";
    } else if (is(sb->protect_system, "full") && deepest_of(usr_etc, path, &which)) {
        ro = strlen(which);
        reason = "ProtectSystem=full";
    } else if (is(sb->protect_system, "yes") && deepest_of(usr, path, &which)) {
        ro = strlen(which);
        reason = "ProtectSystem=yes";
    }
    if (is(sb->protect_home, "read-only") && (n = deepest_of(home, path, &which)) > ro) {
        ro = n;
        reason = "ProtectHome=read-only";
    }
    if ((n = deepest(&sb->ro, path)) > ro) {
        ro = n;
        reason = "ReadOnlyPaths=";
    }
    if (ro == 0 || rw >= ro)
        return NULL;
    return xasprintf("%s may not write %s (%s): add it in a drop-in, systemctl edit %s: "
                     "[Service] ReadWritePaths=%s",
                     sb->unit, path, reason, sb->unit, path);
}

int
unitcheck_become(const char *user, struct esd_err *err)
{
    struct passwd *pw;

    errno = 0;
    if (!(pw = getpwnam(user)))
        return err_set(err, errno ? -errno : -ENOENT, "no user %s%s%s", user, errno ? ": " : "",
                       errno ? strerror(errno) : "");
    if (pw->pw_uid == geteuid())
        return 0;
    if (geteuid() != 0)
        return err_set(err, -EPERM, "checking as user %s needs root (or run it as %s)", user, user);
    if (initgroups(user, pw->pw_gid) < 0 || setgid(pw->pw_gid) < 0 || setuid(pw->pw_uid) < 0)
        return err_sys(err, -errno, "cannot become user %s", user);
    return 0;
}

static const char *
me(void)
{
    struct passwd *pw = getpwuid(geteuid());

    return pw ? pw->pw_name : "this user";
}

static void
check_exec(const char *what, const char *cmd, const struct unit_sandbox *sb, struct strv *problems)
{
    const char *path = sb ? UNIT_PATH : getenv("PATH");
    char *found = fs_which(cmd, path, F_OK), *real = NULL, *why = NULL;
    struct esd_err err;

    if (!found) {
        strv_push_owned(problems, xasprintf("%s '%s' is not on PATH (%s)%s", what, cmd,
                                            path ? path : "", sb ? ", the unit's" : ""));
        return;
    }
    if (pypath_realpath(found, &real, &err) < 0)
        real = xstrdup(found);
    if (access(found, X_OK) < 0)
        strv_push_owned(problems, xasprintf("%s %s: user %s cannot run it: %s", what, found, me(),
                                            strerror(errno)));
    /* the path as named (a link under a hidden directory cannot be
     * followed) and where it leads */
    else if (sb && ((why = unit_sandbox_why(sb, found, false)) ||
                    (why = unit_sandbox_why(sb, real, false))))
        strv_push_owned(problems, xasprintf("%s %s: %s", what, found, why));
    free(why);
    free(real);
    free(found);
}

/* A directory that esd creates files in. */
static void
check_dir(const char *what, const char *shown, const char *dir, const struct unit_sandbox *sb,
          struct strv *problems)
{
    struct stat st;
    char *real = NULL, *why = NULL;
    struct esd_err err;

    if (stat(dir, &st) < 0) {
        strv_push_owned(problems, xasprintf("%s %s: %s: %s", what, shown, dir,
                                            errno == ENOENT ? "no such directory (create it, "
                                                              "writable by the user esd runs as)"
                                                            : strerror(errno)));
        return;
    }
    if (!S_ISDIR(st.st_mode)) {
        strv_push_owned(problems, xasprintf("%s %s: %s is not a directory", what, shown, dir));
        return;
    }
    if (access(dir, W_OK | X_OK) < 0) {
        strv_push_owned(problems, xasprintf("%s %s: user %s cannot write %s: %s", what, shown, me(),
                                            dir, strerror(errno)));
        return;
    }
    if (!sb)
        return;
    if (pypath_realpath(dir, &real, &err) < 0)
        real = xstrdup(dir);
    if ((why = unit_sandbox_why(sb, dir, true)) || (why = unit_sandbox_why(sb, real, true)))
        strv_push_owned(problems, xasprintf("%s %s: %s", what, shown, why));
    free(why);
    free(real);
}

void
unitcheck_paths(const struct esd_conf *c, const struct unit_sandbox *sb, struct strv *problems)
{
    if (c->processor.n) {
        check_exec("processor", c->processor.v[0], sb, problems);
    } else if (c->dj_root) {
        char *runner = fs_join(c->dj_root, "tools/process_data.py");

        check_exec("data_juicer.python", c->dj_python ? c->dj_python : "python3", sb, problems);
        if (access(runner, R_OK) < 0)
            strv_push_owned(problems, xasprintf("data_juicer.root: user %s cannot read %s: %s",
                                                me(), runner, strerror(errno)));
        free(runner);
    } else {
        check_exec("processor (default)", "dj-process", sb, problems);
    }
    if (c->ray_mode == RAY_PERSISTENT)
        check_exec("ray.command", c->ray_command ? c->ray_command : "ray", sb, problems);
    if (c->metrics_path && *c->metrics_path) {
        char *dir = fs_dirname(c->metrics_path);

        check_dir("metrics.path", c->metrics_path, dir, sb, problems);
        free(dir);
    }
    if (c->spool_dir && *c->spool_dir)
        check_dir("spool_dir", c->spool_dir, c->spool_dir, sb, problems);
}
