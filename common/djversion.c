/*
 * djversion: asking a checkout's .git, git or the processor's Python which
 * Data-Juicer runs, and saying why when none of them can tell.
 */
#include "djversion.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fsutil.h"
#include "spawn.h"

#define DETECT_TIMEOUT 10.0
/* Largest .git file read (HEAD, a loose ref, commondir, a gitdir link). */
#define GIT_FILE_MAX 4096
/* packed-refs is read line by line; a longer line is not a ref's. */
#define PACKED_LINE_MAX 1024

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

/* A commit id as git prints it: 40 (SHA-1) or 64 (SHA-256) lowercase hex. */
static bool
is_commit(const char *s)
{
    size_t n = strspn(s, "0123456789abcdef");

    return (n == 40 || n == 64) && !s[n];
}

/* ---- reading a checkout's HEAD without git ---- */

/* A small .git file, trailing whitespace cut; NULL with *why set. */
static char *
git_file(const char *dir, const char *name, char **why)
{
    char *path = fs_join(dir, name), *text = NULL;
    struct esd_err err;
    size_t len = 0;

    if (fs_read_file(path, GIT_FILE_MAX, &text, &len, &err) < 0) {
        free(*why);
        *why = xstrdup(err.msg);
        free(path);
        return NULL;
    }
    while (len && isspace((unsigned char)text[len - 1]))
        text[--len] = '\0';
    free(path);
    return text;
}

/* A path a .git file holds (a gitdir link, commondir): relative to base. */
static char *
git_path(const char *base, const char *p)
{
    return p[0] == '/' ? xstrdup(p) : fs_join(base, p);
}

/* A ref name HEAD may point to: under refs/, no "..", no odd byte. */
static bool
ref_ok(const char *ref)
{
    if (strncmp(ref, "refs/", 5) || strstr(ref, "..") || strstr(ref, "//"))
        return false;
    for (const char *p = ref; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("/._-+@", *p))
            return false;
    return true;
}

/* The commit of ref in common's packed-refs, or NULL. */
static char *
packed_ref(const char *common, const char *ref)
{
    char *path = fs_join(common, "packed-refs"), line[PACKED_LINE_MAX], *commit = NULL;
    FILE *f = fopen(path, "re");

    free(path);
    if (!f)
        return NULL;
    while (!commit && fgets(line, sizeof(line), f)) {
        char *sp = strchr(line, ' ');
        size_t n;

        if (line[0] == '#' || line[0] == '^' || !sp)
            continue;
        *sp++ = '\0';
        n = strcspn(sp, "\r\n");
        sp[n] = '\0';
        if (!strcmp(sp, ref) && is_commit(line))
            commit = xstrdup(line);
    }
    fclose(f);
    return commit;
}

/*
 * The commit HEAD of the checkout root names, read from its files: .git
 * (a directory, or a file "gitdir: <path>" for a worktree or submodule),
 * its commondir, HEAD, the loose ref or packed-refs. NULL with *why set.
 */
static char *
git_head(const char *root, char **why)
{
    char *dotgit = fs_join(root, ".git"), *gitdir = NULL, *common = NULL, *head = NULL;
    char *link, *cd, *commit = NULL;
    struct stat st;

    if (stat(dotgit, &st) < 0) {
        *why = xasprintf("%s: %s", dotgit, strerror(errno));
        goto out;
    }
    if (S_ISDIR(st.st_mode)) {
        gitdir = xstrdup(dotgit);
    } else if (!(link = git_file(root, ".git", why))) {
        goto out;
    } else if (strncmp(link, "gitdir: ", 8)) {
        *why = xasprintf("%s is neither a directory nor a \"gitdir:\" link", dotgit);
        free(link);
        goto out;
    } else {
        gitdir = git_path(root, link + 8);
        free(link);
    }
    if ((cd = git_file(gitdir, "commondir", why))) {
        common = git_path(gitdir, cd);
        free(cd);
    } else {
        common = xstrdup(gitdir);
    }
    free(*why);
    *why = NULL;
    if (!(head = git_file(gitdir, "HEAD", why)))
        goto out;
    if (is_commit(head)) {
        commit = xstrdup(head);
    } else if (!strncmp(head, "ref: ", 5) && ref_ok(head + 5)) {
        const char *ref = head + 5;
        char *loose = git_file(gitdir, ref, why);

        if (!loose)
            loose = git_file(common, ref, why);
        if (loose && is_commit(loose))
            commit = xstrdup(loose);
        else if (!(commit = packed_ref(common, ref))) {
            free(*why);
            *why = xasprintf("%s/HEAD names %s, which has no commit in %s (loose or packed)",
                             gitdir, ref, common);
        }
        free(loose);
    } else {
        *why = xasprintf("%s/HEAD holds neither a commit nor a ref", gitdir);
    }
out:
    if (commit) {
        free(*why);
        *why = NULL;
    }
    free(dotgit);
    free(gitdir);
    free(common);
    free(head);
    return commit;
}

/* ---- the processor's Python ---- */

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

/*
 * The interpreter a script runs on: its "#!" line's first word, or, for
 * "#!/usr/bin/env [-S] name", name looked up on PATH. NULL for a file that
 * is not a script.
 */
static char *
interpreter_of(const char *script)
{
    char line[512], *save = NULL, *interp = NULL;
    FILE *f = fopen(script, "re");

    if (!f)
        return NULL;
    if (fgets(line, sizeof(line), f) && line[0] == '#' && line[1] == '!') {
        char *w = strtok_r(line + 2, " \t\r\n", &save);

        if (w && !strcmp(fs_basename(w), "env")) {
            while ((w = strtok_r(NULL, " \t\r\n", &save)) && w[0] == '-')
                ;
            interp = w ? which(w) : NULL;
            if (!interp && w)
                interp = xstrdup(w);
        } else if (w) {
            interp = xstrdup(w);
        }
    }
    fclose(f);
    return interp;
}

static bool
looks_like_python(const char *path)
{
    return strstr(fs_basename(path), "python") != NULL;
}

/* The version of py-data-juicer that python imports (run in cwd), or NULL
 * with *why saying what python answered. */
static char *
package_version(const char *python, const char *cwd, char **why)
{
    /* the error goes to stdout, marked, since stderr is not collected */
    static const char *const probe = "import importlib.metadata as m\n"
                                     "try:\n"
                                     "    print(m.version('py-data-juicer'))\n"
                                     "except Exception as e:\n"
                                     "    print('!%s: %s' % (type(e).__name__, e))\n";
    struct buf out;
    char *line = NULL;
    bool ok;

    buf_init(&out);
    ok = run(cwd, 4096, &out, python, "-c", probe, NULL);
    line = first_line(&out);
    buf_free(&out);
    if (ok && line && line[0] != '!')
        return line;
    if (line && line[0] == '!')
        *why = xasprintf("%s cannot tell the version of py-data-juicer (%s)", python, line + 1);
    else
        *why = xasprintf("%s could not be run to ask for the version of py-data-juicer", python);
    free(line);
    return NULL;
}

int
djversion_registry(const char *python, const char *cwd, struct strv *ret, char **ret_why)
{
    /* marked lines: Data-Juicer's import may print its own to stdout */
    static const char *const probe =
        "import os, sys\n"
        "os.environ.setdefault('HF_HUB_OFFLINE', '1')\n"
        "try:\n"
        "    from data_juicer.ops import OPERATORS\n"
        "    names = sorted(OPERATORS.modules)\n"
        "except Exception as e:\n"
        "    print('esd-registry-error %s: %s' % (type(e).__name__, e))\n"
        "    sys.exit(0)\n"
        "for n in names:\n"
        "    print('esd-registry-op ' + n)\n";
    static const char op_mark[] = "esd-registry-op ", err_mark[] = "esd-registry-error ";
    struct strv argv;
    struct buf out;
    int status = 0, r;

    *ret_why = NULL;
    strv_init(ret);
    if (!python) {
        *ret_why = xstrdup("the processor is not Data-Juicer's own dj-process or checkout");
        return -ENOENT;
    }
    strv_init(&argv);
    strv_push(&argv, python);
    strv_push(&argv, "-c");
    strv_push(&argv, probe);
    buf_init(&out);
    r = spawn_capture(argv.v, cwd, 120.0, 4 << 20, &out, &status, NULL);
    strv_free(&argv);
    if (r == 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
        r = -ECHILD;
    for (char *line = out.p, *nl; r == 0 && line && line < out.p + out.len; line = nl + 1) {
        if (!(nl = memchr(line, '\n', (size_t)(out.p + out.len - line))))
            break;
        *nl = '\0';
        if (!strncmp(line, op_mark, sizeof(op_mark) - 1))
            strv_push(ret, line + sizeof(op_mark) - 1);
        else if (!strncmp(line, err_mark, sizeof(err_mark) - 1) && !*ret_why)
            *ret_why = xasprintf("%s cannot import data_juicer.ops (%.300s)", python,
                                 line + sizeof(err_mark) - 1);
    }
    buf_free(&out);
    if (r == 0 && !*ret_why && ret->n == 0)
        *ret_why = xasprintf("%s lists no operator in data_juicer.ops.OPERATORS", python);
    if (r < 0 && !*ret_why)
        *ret_why = xasprintf("%s could not be run to list the operators (%s)", python,
                             r == -ETIMEDOUT ? "timed out after 120 s" : strerror(-r));
    if (*ret_why) {
        strv_free(ret);
        return r < 0 ? r : -ENOENT;
    }
    strv_sort(ret);
    return 0;
}

void
djversion_read(const struct attempt_opts *o, struct djversion *ret)
{
    const char *const *proc = o ? o->processor : NULL;
    char *version = NULL, *python = NULL, *source = NULL, *why = NULL, *pwhy = NULL;
    int dirty = -1;
    bool own = !proc || (proc[0] && !proc[1] && !strcmp(fs_basename(proc[0]), "dj-process"));

    if (o && o->dj_root) {
        struct buf out;
        char *safe = xasprintf("safe.directory=%s", o->dj_root);

        buf_init(&out);
        if ((version = git_head(o->dj_root, &why))) {
            source = xasprintf("git HEAD of the checkout %s", o->dj_root);
        } else if (run(NULL, 4096, &out, "git", "-c", safe, "-C", o->dj_root, "rev-parse", "HEAD",
                       NULL) &&
                   (version = first_line(&out))) {
            /* (a layout git_head does not read, e.g. reftable) */
            source = xasprintf("git rev-parse HEAD in the checkout %s", o->dj_root);
            free(why);
            why = NULL;
        }
        buf_reset(&out);
        /* Without the safe.directory override: a checkout git does not
         * trust must not run its configuration (core.fsmonitor, filters)
         * here; its dirty flag stays unknown. */
        if (version &&
            run(NULL, 1 << 20, &out, "git", "-C", o->dj_root, "status", "--porcelain", NULL))
            dirty = out.len > 0;
        buf_free(&out);
        free(safe);
        if (!version) { /* not a git checkout: ask its python */
            char *nowhy = xasprintf("%s is not a readable git checkout (%s)", o->dj_root,
                                    why ? why : "no commit found");

            free(why);
            why = nowhy;
            python = xstrdup(o->python ? o->python : "python3");
        }
    } else {
        const char *cmd = proc && proc[0] ? proc[0] : "dj-process";
        char *path = which(cmd);

        if (!path)
            why = xasprintf("the processor %s is not an executable file (nor on PATH)", cmd);
        else if (looks_like_python(path))
            python = xstrdup(path);
        else if (!(python = interpreter_of(path)))
            why = xasprintf("the processor %s is neither a Python interpreter nor a script: "
                            "which Data-Juicer it runs cannot be read",
                            path);
        if (python && !looks_like_python(python)) {
            why = xasprintf("the processor %s is a script for %s, not for Python: which "
                            "Data-Juicer it runs cannot be read",
                            path, python);
            free(python);
            python = NULL;
        }
        free(path);
    }
    if (!version && python) {
        if ((version = package_version(python, o && o->dj_root ? o->dj_root : NULL, &pwhy))) {
            source = xasprintf("py-data-juicer of %s", python);
        } else {
            char *both = why ? xasprintf("%s, and %s", why, pwhy) : xstrdup(pwhy);

            free(why);
            why = both;
        }
    }
    free(pwhy);
    /* (a checkout's interpreter is used even when it cannot say) */
    if (o && o->dj_root && !python)
        python = xstrdup(o->python ? o->python : "python3");
    ret->python = own ? python : NULL;
    if (!ret->python)
        free(python);
    ret->version = version ? version : xstrdup("unknown");
    ret->dirty = dirty;
    ret->source = source;
    ret->why = why;
}

void
djversion_free(struct djversion *v)
{
    free(v->version);
    free(v->source);
    free(v->why);
    free(v->python);
    memset(v, 0, sizeof(*v));
}

void
djversion_detect(const struct attempt_opts *o, char **ret_version, int *ret_dirty)
{
    struct djversion v;

    djversion_read(o, &v);
    *ret_version = v.version;
    *ret_dirty = v.dirty;
    v.version = NULL;
    djversion_free(&v);
}

int
djversion_judge(const char *job_version, const struct djversion *ours, struct esd_err *err)
{
    const char *mine = ours->version;

    if (!job_version || !strcmp(job_version, "unknown") || (mine && !strcmp(job_version, mine)))
        return 0;
    if (!mine || !strcmp(mine, "unknown"))
        return err_set(err, -EPROTO,
                       "Data-Juicer version cannot be read on this node: %s; the job was "
                       "prepared with %s",
                       ours->why ? ours->why : "no way to read it", job_version);
    return err_set(err, -EPROTO, "Data-Juicer version mismatch: job=%s, worker=%s (%s%s%s%s)",
                   job_version, mine, ours->source ? ours->source : "detected here",
                   ours->why ? ", since " : "", ours->why ? ours->why : "",
                   is_commit(job_version) != is_commit(mine)
                       ? is_commit(job_version)
                             ? "; the job records a git commit, this node a package version"
                             : "; the job records a package version, this node a git commit"
                       : "");
}

int
djversion_check(const char *job_version, const char *ours, struct esd_err *err)
{
    struct djversion v = { .version = ours ? xstrdup(ours) : NULL };
    int r = djversion_judge(job_version, &v, err);

    djversion_free(&v);
    return r;
}
