/*
 * djversion: asking git or the processor's Python which Data-Juicer runs.
 */
#include "djversion.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fsutil.h"
#include "spawn.h"

#define DETECT_TIMEOUT 10.0

/*
 * Runs the command given as NULL-terminated words in cwd; collects up to
 * max bytes of its output. Returns true if it ran and exited 0.
 */
static bool
run(const char *cwd, size_t max, struct buf *out, const char *word, ...)
{
    struct strv argv;
    va_list ap;
    int status = 0;
    bool ok;

    strv_init(&argv);
    va_start(ap, word);
    for (; word; word = va_arg(ap, const char *))
        strv_push(&argv, word);
    va_end(ap);
    ok = spawn_capture(argv.v, cwd, DETECT_TIMEOUT, max, out, &status, NULL) == 0 &&
         WIFEXITED(status) && WEXITSTATUS(status) == 0;
    strv_free(&argv);
    return ok;
}

/* The first line of out, or NULL if there is none. */
static char *
first_line(const struct buf *out)
{
    size_t n = out->len ? strcspn(out->p, "\r\n") : 0;

    return n ? xstrndup(out->p, n) : NULL;
}

/* PATH lookup of a command name, as execvp would do it. Caller frees. */
static char *
which(const char *cmd)
{
    const char *path = getenv("PATH");
    char *dirs, *save = NULL;

    if (strchr(cmd, '/'))
        return access(cmd, X_OK) == 0 ? xstrdup(cmd) : NULL;
    dirs = xstrdup(path && *path ? path : "/usr/local/bin:/usr/bin:/bin");
    for (char *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        char *full = fs_join(*d ? d : ".", cmd);
        if (access(full, X_OK) == 0) {
            free(dirs);
            return full;
        }
        free(full);
    }
    free(dirs);
    return NULL;
}

/* The interpreter a script runs on: its "#!" line's first word. */
static char *
interpreter_of(const char *script)
{
    char line[512];
    FILE *f = fopen(script, "re");
    char *interp = NULL;

    if (!f)
        return NULL;
    if (fgets(line, sizeof(line), f) && line[0] == '#' && line[1] == '!') {
        char *p = line + 2;
        size_t n;

        p += strspn(p, " \t");
        n = strcspn(p, " \t\r\n");
        if (n)
            interp = xstrndup(p, n);
    }
    fclose(f);
    return interp;
}

static bool
looks_like_python(const char *path)
{
    return strstr(fs_basename(path), "python") != NULL;
}

void
djversion_detect(const struct attempt_opts *o, char **ret_version, int *ret_dirty)
{
    static const char *const probe =
        "import importlib.metadata as m; print(m.version('py-data-juicer'))";
    const char *const *proc = o ? o->processor : NULL;
    char *version = NULL, *python = NULL;
    int dirty = -1;

    if (o && o->dj_root) {
        struct buf out;

        buf_init(&out);
        if (run(NULL, 4096, &out, "git", "-C", o->dj_root, "rev-parse", "HEAD", NULL))
            version = first_line(&out);
        buf_reset(&out);
        if (version && run(NULL, 1 << 20, &out, "git", "-C", o->dj_root, "status", "--porcelain",
                           NULL))
            dirty = out.len > 0;
        buf_free(&out);
        if (!version) /* not a git checkout: ask its python */
            python = xstrdup(o->python ? o->python : "python3");
    } else {
        const char *cmd = proc && proc[0] ? proc[0] : "dj-process";
        char *path = which(cmd);

        if (path && looks_like_python(path))
            python = xstrdup(path);
        else if (path)
            python = interpreter_of(path);
        free(path);
        if (python && !looks_like_python(python)) {
            free(python);
            python = NULL;
        }
    }
    if (!version && python) {
        struct buf out;

        buf_init(&out);
        if (run(o && o->dj_root ? o->dj_root : NULL, 4096, &out, python, "-c", probe, NULL))
            version = first_line(&out);
        buf_free(&out);
    }
    free(python);
    *ret_version = version ? version : xstrdup("unknown");
    *ret_dirty = dirty;
}

int
djversion_check(const char *job_version, const char *ours, struct esd_err *err)
{
    if (!job_version || !ours || !strcmp(job_version, "unknown") || !strcmp(ours, "unknown") ||
        !strcmp(job_version, ours))
        return 0;
    return err_set(err, -EPROTO, "Data-Juicer version mismatch: job=%s, worker=%s", job_version,
                   ours);
}
