/*
 * pypath: CPython 3.11's posixpath and pathlib pieces the reference relies
 * on, copied step by step so that every answer is the reference's, quirks
 * included (a loop's unresolved rest, "//" kept, ".." applied after a
 * symlink is resolved rather than textually). Each function names the
 * Python function it follows. Where CPython recurses without a bound of
 * its own, the copy stops at REALPATH_MAX_DEPTH with an error instead of
 * a RecursionError.
 */
#include "pypath.h"

#include <dirent.h>
#include <errno.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsutil.h"

/* A chain of distinct symlinks this long is refused (CPython would hit its
 * recursion limit at about 1000). */
#define REALPATH_MAX_DEPTH 256

/* posixpath.join(a, b) for two fragments: an absolute b replaces a. */
static char *
py_join(const char *a, const char *b)
{
    size_t na = strlen(a);

    if (b[0] == '/' || na == 0)
        return xstrdup(b);
    if (a[na - 1] == '/')
        return xasprintf("%s%s", a, b);
    return xasprintf("%s/%s", a, b);
}

/* posixpath.split(path)[0] for an absolute path, in place. */
static void
py_split_head(char *path)
{
    char *slash = strrchr(path, '/');
    size_t n;

    if (!slash)
        return;
    n = (size_t)(slash - path) + 1;
    path[n] = '\0';
    /* A head of slashes only stays as it is; otherwise trailing ones go. */
    if (strspn(path, "/") != n)
        while (n > 0 && path[n - 1] == '/')
            path[--n] = '\0';
}

char *
pypath_normpath(const char *path)
{
    size_t slashes = strspn(path, "/");
    struct buf out;
    const char *p = path;
    size_t *starts, depth = 0;

    /* POSIX lets exactly two leading slashes mean something else. */
    slashes = slashes == 2 ? 2 : slashes > 0 ? 1 : 0;
    /* starts[] holds where each poppable component begins: never a kept
     * leading "..", so a pop cannot eat one. */
    starts = xmalloc((strlen(path) / 2 + 2) * sizeof(*starts));
    buf_init(&out);
    buf_append(&out, "//", slashes);
    while (*p) {
        size_t n = strcspn(p, "/");
        bool dotdot = n == 2 && p[0] == '.' && p[1] == '.';

        if (n == 0 || (n == 1 && p[0] == '.')) {
            /* empty or "." */
        } else if (dotdot && depth > 0) {
            out.len = starts[--depth];
            out.p[out.len] = '\0';
        } else if (dotdot && slashes > 0) {
            /* ".." at the root stays at the root. */
        } else {
            if (!dotdot)
                starts[depth++] = out.len;
            if (out.len > slashes)
                buf_putc(&out, '/');
            buf_append(&out, p, n);
        }
        p += n;
        if (*p)
            p++;
    }
    free(starts);
    if (out.len == 0)
        buf_putc(&out, '.');
    return buf_steal(&out);
}

/* Symlinks met while resolving; resolved is NULL while one is in progress. */
struct seen {
    char **link;
    char **resolved;
    size_t n;
    size_t cap;
};

static void
seen_free(struct seen *s)
{
    for (size_t i = 0; i < s->n; i++) {
        free(s->link[i]);
        free(s->resolved[i]);
    }
    free(s->link);
    free(s->resolved);
}

static ssize_t
seen_find(const struct seen *s, const char *link)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->link[i], link) == 0)
            return (ssize_t)i;
    return -1;
}

static size_t
seen_add(struct seen *s, const char *link)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 8;
        s->link = xrealloc(s->link, s->cap * sizeof(*s->link));
        s->resolved = xrealloc(s->resolved, s->cap * sizeof(*s->resolved));
    }
    s->link[s->n] = xstrdup(link);
    s->resolved[s->n] = NULL;
    return s->n++;
}

static int
readlink_alloc(const char *path, char **ret, struct esd_err *err)
{
    size_t size = 256;

    for (;;) {
        char *buf = xmalloc(size);
        ssize_t n = readlink(path, buf, size);

        if (n < 0) {
            int r = -errno;

            free(buf);
            return err_sys(err, r, "cannot read symlink %s", path);
        }
        if ((size_t)n < size) {
            buf[n] = '\0';
            *ret = buf;
            return 0;
        }
        free(buf);
        size *= 2;
    }
}

/*
 * posixpath._joinrealpath of CPython 3.11 with strict=False: resolves rest
 * against the resolved prefix *path (replaced as it goes). Returns 1 when
 * resolved, 0 when a symlink loop stopped the resolution (*path then ends
 * with the unresolved remainder, as CPython returns it), or -errno.
 */
static int
join_real(char **path, const char *rest, struct seen *seen, int depth, struct esd_err *err)
{
    if (depth > REALPATH_MAX_DEPTH)
        return err_set(err, -ELOOP, "too many levels of symbolic links resolving %s", *path);
    if (rest[0] == '/') {
        rest++;
        free(*path);
        *path = xstrdup("/");
    }
    while (*rest) {
        size_t n = strcspn(rest, "/");
        char *name = xstrndup(rest, n), *newpath, *target = NULL;
        struct stat st;
        ssize_t i;
        size_t k;
        int r;

        rest += n;
        if (*rest)
            rest++;
        if (n == 0 || strcmp(name, ".") == 0) {
            free(name);
            continue;
        }
        if (strcmp(name, "..") == 0) {
            /* The prefix is always absolute here, so ".." just pops. */
            py_split_head(*path);
            free(name);
            continue;
        }
        newpath = py_join(*path, name);
        free(name);
        /* Whatever lstat cannot see (ENOENT, ENOTDIR, EACCES) is kept as text. */
        if (lstat(newpath, &st) < 0 || !S_ISLNK(st.st_mode)) {
            free(*path);
            *path = newpath;
            continue;
        }
        i = seen_find(seen, newpath);
        if (i >= 0) {
            if (seen->resolved[i]) {
                free(*path);
                *path = xstrdup(seen->resolved[i]);
                free(newpath);
                continue;
            }
            /* A loop: the resolved part plus the rest, unresolved. */
            free(*path);
            *path = py_join(newpath, rest);
            free(newpath);
            return 0;
        }
        k = seen_add(seen, newpath);
        r = readlink_alloc(newpath, &target, err);
        free(newpath);
        if (r < 0)
            return r;
        r = join_real(path, target, seen, depth + 1, err);
        free(target);
        if (r < 0)
            return r;
        if (r == 0) {
            char *p = py_join(*path, rest);

            free(*path);
            *path = p;
            return 0;
        }
        seen->resolved[k] = xstrdup(*path);
    }
    return 1;
}

int
pypath_realpath(const char *path, char **ret, struct esd_err *err)
{
    struct seen seen = { 0 };
    char *cur = NULL, *abs;
    int r;

    if (path[0] == '/') {
        abs = xstrdup(path);
    } else {
        char *cwd = getcwd(NULL, 0);

        if (!cwd)
            return err_sys(err, -errno, "cannot resolve %s: cannot get the working directory",
                           path);
        abs = py_join(cwd, path);
        free(cwd);
    }
    cur = xstrdup("/");
    r = join_real(&cur, abs, &seen, 0, err);
    seen_free(&seen);
    free(abs);
    if (r < 0) {
        free(cur);
        return r;
    }
    *ret = pypath_normpath(cur);
    free(cur);
    return 0;
}

/* Home directory of the current user (uid != -1) or of name; NULL if unknown. */
static char *
home_of(const char *name)
{
    struct passwd pw, *res = NULL;
    size_t size = 4096;
    char *home = NULL;

    for (;;) {
        char *buf = xmalloc(size);
        int e;

        if (name)
            e = getpwnam_r(name, &pw, buf, size, &res);
        else
            e = getpwuid_r(getuid(), &pw, buf, size, &res);
        if (e == ERANGE && size < ((size_t)1 << 24)) {
            free(buf);
            size *= 2;
            continue;
        }
        if (e == 0 && res)
            home = xstrdup(pw.pw_dir);
        free(buf);
        return home;
    }
}

/* posixpath.expanduser of CPython 3.11. Caller frees. */
static char *
expand_user(const char *path)
{
    const char *slash, *env;
    char *home, *out;
    size_t n;

    if (path[0] != '~')
        return xstrdup(path);
    slash = strchr(path + 1, '/');
    if (!slash)
        slash = path + strlen(path);
    if (slash == path + 1) {
        env = getenv("HOME");
        home = env ? xstrdup(env) : home_of(NULL);
    } else {
        char *name = xstrndup(path + 1, (size_t)(slash - path - 1));

        home = home_of(name);
        free(name);
    }
    if (!home)
        return xstrdup(path);
    n = strlen(home);
    while (n > 0 && home[n - 1] == '/')
        n--;
    out = xasprintf("%.*s%s", (int)n, home, slash);
    free(home);
    if (!*out) {
        free(out);
        out = xstrdup("/");
    }
    return out;
}

int
pypath_resolve_cli(const char *path, char **ret, struct esd_err *err)
{
    char *exp = expand_user(path);
    int r = pypath_realpath(exp, ret, err);

    free(exp);
    return r;
}

int
pypath_join_inside(const char *root, const char *rel, char **ret, struct esd_err *err)
{
    char *joined, *resolved;
    int r;

    if (!rel[0] || rel[0] == '/')
        return err_set(err, -EINVAL, "Manifest path escapes job directory: %s", rel);
    joined = fs_join(root, rel);
    r = pypath_realpath(joined, &resolved, err);
    free(joined);
    if (r < 0)
        return r;
    if (!fs_is_inside(root, resolved)) {
        free(resolved);
        return err_set(err, -EINVAL, "Manifest path escapes job directory: %s", rel);
    }
    *ret = resolved;
    return 0;
}

/* Path.rglob's walk below dir (rel: dir relative to the top), in
 * directory order; lstat decides what is descended, so a symlinked
 * directory is not, as in 3.11 (whose _RecursiveWildcardSelector does not
 * follow links to directories). */
static int
walk_dir(const char *dir, const char *rel, bool (*want)(const char *), struct pypath_entries *out,
         struct esd_err *err)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int r = 0;

    if (!d)
        return err_sys(err, -errno, "cannot read directory %s", dir);
    while ((errno = 0, e = readdir(d))) {
        struct stat st;
        char *path, *sub;

        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        path = fs_join(dir, e->d_name);
        sub = *rel ? xasprintf("%s/%s", rel, e->d_name) : xstrdup(e->d_name);
        if (lstat(path, &st) < 0) {
            r = err_sys(err, -errno, "cannot stat %s", path);
        } else if (S_ISDIR(st.st_mode)) {
            r = walk_dir(path, sub, want, out, err);
        } else if (want(e->d_name) && (!S_ISLNK(st.st_mode) || stat(path, &st) == 0) &&
                   S_ISREG(st.st_mode)) {
            if (out->n == out->cap) {
                out->cap = out->cap ? out->cap * 2 : 16;
                out->v = xrealloc(out->v, out->cap * sizeof(*out->v));
            }
            out->v[out->n++] = (struct pypath_entry){ path, sub, st };
            path = sub = NULL;
        }
        free(path);
        free(sub);
        if (r < 0)
            break;
    }
    if (r == 0 && errno)
        r = err_sys(err, -errno, "cannot read directory %s", dir);
    closedir(d);
    return r;
}

/* strcmp compares the UTF-8 bytes as unsigned char, which is code point
 * order: sorted() of the str paths. */
static int
cmp_entry(const void *a, const void *b)
{
    return strcmp(((const struct pypath_entry *)a)->rel, ((const struct pypath_entry *)b)->rel);
}

int
pypath_rglob(const char *dir, bool (*want)(const char *name), struct pypath_entries *ret,
             struct esd_err *err)
{
    int r;

    memset(ret, 0, sizeof(*ret));
    r = walk_dir(dir, "", want, ret, err);
    if (r == 0 && ret->n > 1)
        qsort(ret->v, ret->n, sizeof(*ret->v), cmp_entry);
    return r;
}

void
pypath_entries_free(struct pypath_entries *e)
{
    for (size_t i = 0; i < e->n; i++) {
        free(e->v[i].path);
        free(e->v[i].rel);
    }
    free(e->v);
    memset(e, 0, sizeof(*e));
}
