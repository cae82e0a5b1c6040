/*
 * check_djversion: which Data-Juicer a node runs and the check before it
 * works a job: a checkout's commit read from its .git files (a branch, a
 * packed ref, a detached HEAD, a worktree's "gitdir:" link, a checkout owned
 * by another user that git itself refuses as "dubious ownership"), a
 * package version asked of the processor's Python (the processor itself, a
 * script's "#!" line, "#!/usr/bin/env python3"), and every way the version
 * cannot be read (a shell wrapper, a binary, a missing processor, a Python
 * without the package) with its reason; then what "unknown" means on
 * either side and the messages of a refusal. Python interpreters are
 * stand-ins: shell scripts named python3 that answer the version probe.
 */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "djversion.h"
#include "fsutil.h"
#include "testutil.h"
#include "util.h"

static char *tmp;

static void
setup(void)
{
    tmp = tu_tmpdir();
}

static void
teardown(void)
{
    fs_rm_rf(tmp);
    free(tmp);
}

/* Writes an executable script rel under tmp; returns its path. */
static char *
script(const char *rel, const char *text)
{
    char *path = tu_write(tmp, rel, text, (size_t)-1);

    ck_assert_int_eq(chmod(path, 0755), 0);
    return path;
}

/* A stand-in python3 whose py-data-juicer is version (NULL: not installed). */
static char *
fake_python(const char *dir, const char *version)
{
    char *rel = xasprintf("%s/python3", dir), *text, *path;

    if (version)
        text = xasprintf("#!/bin/sh\n[ \"$1\" = -c ] && echo %s\nexit 0\n", version);
    else
        text = xstrdup("#!/bin/sh\necho '!PackageNotFoundError: No package metadata was "
                       "found for py-data-juicer'\nexit 0\n");
    path = script(rel, text);
    free(rel);
    free(text);
    return path;
}

static void
read_proc(const char *const *proc, struct djversion *v)
{
    struct attempt_opts o = { .processor = proc };

    djversion_read(&o, v);
}

static void
read_root(const char *root, const char *python, struct djversion *v)
{
    struct attempt_opts o = { .dj_root = root, .python = python };

    djversion_read(&o, v);
}

/* Runs a shell command in dir; its first output line (caller frees). */
static char *
sh(const char *dir, const char *cmd)
{
    char *full = xasprintf("cd '%s' && %s", dir, cmd), line[256] = "";
    FILE *p = popen(full, "r");

    ck_assert_ptr_nonnull(p);
    if (!fgets(line, sizeof(line), p))
        line[0] = '\0';
    ck_assert_msg(pclose(p) == 0, "%s failed", full);
    free(full);
    line[strcspn(line, "\n")] = '\0';
    return xstrdup(line);
}

/* Whether git is installed (the checkout tests need it; .ci/run installs it). */
static bool
have_git(void)
{
    return system("git --version >/dev/null 2>&1") == 0;
}

/* A git checkout with one commit at tmp/rel; returns its root. */
static char *
checkout(const char *rel)
{
    char *root = fs_join(tmp, rel), *out;
    struct esd_err err;

    ck_assert_int_eq(fs_mkdir_p(root, 0755, &err), 0);
    free(tu_write(root, "README", "dj\n", (size_t)-1));
    out = sh(root, "git init -q -b main . && git -c user.name=t -c user.email=t@t add README && "
                   "git -c user.name=t -c user.email=t@t commit -qm one && echo ok");
    free(out);
    return root;
}

static char *
head_of(const char *root)
{
    char *cmd = xasprintf("git -c safe.directory='%s' rev-parse HEAD", root);
    char *h = sh(root, cmd);

    free(cmd);
    ck_assert_uint_eq(strlen(h), 40);
    return h;
}

/* ---- a checkout ---- */

START_TEST(test_checkout_branch_and_packed_ref)
{
    char *root, *want, *out;
    struct djversion v;

    if (!have_git())
        return;
    root = checkout("dj");
    want = head_of(root);

    read_root(root, NULL, &v);
    ck_assert_str_eq(v.version, want);
    ck_assert_ptr_nonnull(strstr(v.source, "git HEAD of the checkout"));
    ck_assert_ptr_null(v.why);
    ck_assert_int_eq(v.dirty, 0);
    djversion_free(&v);

    /* a packed ref (no loose file) and a dirty tree */
    out = sh(root, "git pack-refs --all && test ! -e .git/refs/heads/main && echo x >> README "
                   "&& echo ok");
    free(out);
    read_root(root, NULL, &v);
    ck_assert_str_eq(v.version, want);
    ck_assert_int_eq(v.dirty, 1);
    djversion_free(&v);

    /* a detached HEAD */
    out = sh(root, "git checkout -q --detach && echo ok");
    free(out);
    read_root(root, NULL, &v);
    ck_assert_str_eq(v.version, want);
    djversion_free(&v);
    free(want);
    free(root);
}
END_TEST

START_TEST(test_checkout_worktree_link)
{
    char *root, *want, *wt, *cmd, *out;
    struct djversion v;

    if (!have_git())
        return;
    root = checkout("dj");
    want = head_of(root);
    wt = fs_join(tmp, "wt");

    cmd = xasprintf("git worktree add -q --detach '%s' && test -f '%s/.git' && echo ok", wt, wt);
    out = sh(root, cmd);
    free(out);
    free(cmd);
    read_root(wt, NULL, &v);
    ck_assert_str_eq(v.version, want);
    djversion_free(&v);
    free(want);
    free(wt);
    free(root);
}
END_TEST

START_TEST(test_checkout_of_another_user)
{
    struct passwd *pw = getpwnam("nobody");
    char *root, *want, *cmd, *out;
    struct djversion v;

    if (geteuid() != 0 || !pw || !have_git())
        return; /* (needs root to give the checkout away) */
    root = checkout("dj");
    want = head_of(root);
    cmd = xasprintf("chown -R %u '%s' && ! git -C '%s' rev-parse HEAD >/dev/null 2>&1 && echo ok",
                    (unsigned)pw->pw_uid, root, root);
    out = sh(tmp, cmd);
    /* git itself refuses it (dubious ownership) ... */
    ck_assert_str_eq(out, "ok");
    free(out);
    free(cmd);
    /* ... its files say which commit it is; git status may not run there */
    read_root(root, NULL, &v);
    ck_assert_str_eq(v.version, want);
    ck_assert_int_eq(v.dirty, -1);
    djversion_free(&v);
    free(want);
    free(root);
}
END_TEST

START_TEST(test_root_without_git_asks_python)
{
    char *root = fs_join(tmp, "wheel"), *py = fake_python("bin", "1.6.1");
    struct esd_err err;
    struct djversion v;

    ck_assert_int_eq(fs_mkdir_p(root, 0755, &err), 0);
    read_root(root, py, &v);
    ck_assert_str_eq(v.version, "1.6.1");
    ck_assert_ptr_nonnull(strstr(v.source, "py-data-juicer of"));
    /* why the checkout gave no commit stays said */
    ck_assert_ptr_nonnull(v.why);
    ck_assert_ptr_nonnull(strstr(v.why, "is not a readable git checkout"));
    djversion_free(&v);
    free(py);

    /* neither: both reasons */
    py = fake_python("nopkg", NULL);
    read_root(root, py, &v);
    ck_assert_str_eq(v.version, "unknown");
    ck_assert_ptr_null(v.source);
    ck_assert_msg(strstr(v.why, "is not a readable git checkout") &&
                      strstr(v.why, "cannot tell the version of py-data-juicer "
                                    "(PackageNotFoundError"),
                  "%s", v.why);
    djversion_free(&v);
    free(py);
    free(root);
}
END_TEST

/* ---- the processor's Python ---- */

START_TEST(test_processor_python_and_scripts)
{
    char *py = fake_python("bin", "9.9.9"), *s1, *s2, *dir = fs_join(tmp, "bin");
    char *path = xasprintf("%s:%s", dir, getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
    char *shebang = xasprintf("#!%s\n", py);
    struct djversion v;

    read_proc((const char *const[]){ py, NULL }, &v);
    ck_assert_str_eq(v.version, "9.9.9");
    ck_assert_ptr_nonnull(strstr(v.source, py));
    djversion_free(&v);

    s1 = script("dj-process", shebang);
    read_proc((const char *const[]){ s1, NULL }, &v);
    ck_assert_str_eq(v.version, "9.9.9");
    djversion_free(&v);

    /* "#!/usr/bin/env python3" finds python3 on PATH */
    setenv("PATH", path, 1);
    s2 = script("envscript", "#!/usr/bin/env python3\n");
    read_proc((const char *const[]){ s2, NULL }, &v);
    ck_assert_str_eq(v.version, "9.9.9");
    djversion_free(&v);
    free(s1);
    free(s2);
    free(shebang);
    free(path);
    free(dir);
    free(py);
}
END_TEST

START_TEST(test_unreadable_versions_say_why)
{
    char *wrap = script("wrap.sh", "#!/bin/sh\nexec mini-dj \"$@\"\n");
    char *missing = fs_join(tmp, "nope");
    struct djversion v;

    read_proc((const char *const[]){ wrap, NULL }, &v);
    ck_assert_str_eq(v.version, "unknown");
    ck_assert_msg(strstr(v.why, "is a script for /bin/sh, not for Python"), "%s", v.why);
    djversion_free(&v);

    read_proc((const char *const[]){ "/bin/true", NULL }, &v);
    ck_assert_str_eq(v.version, "unknown");
    ck_assert_msg(strstr(v.why, "/bin/true is neither a Python interpreter nor a script"), "%s",
                  v.why);
    djversion_free(&v);

    read_proc((const char *const[]){ missing, NULL }, &v);
    ck_assert_str_eq(v.version, "unknown");
    ck_assert_msg(strstr(v.why, "is not an executable file"), "%s", v.why);
    djversion_free(&v);
    free(wrap);
    free(missing);
}
END_TEST

/* ---- the check ---- */

START_TEST(test_judge)
{
    static const char commit[] = "0123456789abcdef0123456789abcdef01234567";
    struct djversion known = { .version = xstrdup("1.6.1"),
                               .source = xstrdup("py-data-juicer of /usr/bin/python3") };
    struct djversion unknown = { .version = xstrdup("unknown"),
                                 .why = xstrdup("the processor /w is a script for /bin/sh") };
    struct esd_err err;

    /* a job that pins nothing: any node, even one that cannot say */
    ck_assert_int_eq(djversion_judge("unknown", &known, &err), 0);
    ck_assert_int_eq(djversion_judge("unknown", &unknown, &err), 0);
    ck_assert_int_eq(djversion_judge(NULL, &unknown, &err), 0);
    ck_assert_int_eq(djversion_judge("1.6.1", &known, &err), 0);

    /* a pinned job: a node that cannot read its version is refused */
    ck_assert_int_eq(djversion_judge("1.6.1", &unknown, &err), -EPROTO);
    ck_assert_str_eq(err.msg, "Data-Juicer version cannot be read on this node: the processor "
                              "/w is a script for /bin/sh; the job was prepared with 1.6.1");

    ck_assert_int_eq(djversion_judge("1.5.0", &known, &err), -EPROTO);
    ck_assert_str_eq(err.msg, "Data-Juicer version mismatch: job=1.5.0, worker=1.6.1 "
                              "(py-data-juicer of /usr/bin/python3)");
    ck_assert_int_eq(djversion_judge(commit, &known, &err), -EPROTO);
    ck_assert_msg(strstr(err.msg, "; the job records a git commit, this node a package version"),
                  "%s", err.msg);

    /* the string form: the same rules */
    ck_assert_int_eq(djversion_check("unknown", "unknown", &err), 0);
    ck_assert_int_eq(djversion_check("1.6.1", NULL, &err), -EPROTO);
    ck_assert_int_eq(djversion_check("1.6.1", "1.6.0", &err), -EPROTO);
    ck_assert(!strncmp(err.msg, "Data-Juicer version mismatch: job=1.6.1, worker=1.6.0", 53));
    djversion_free(&known);
    djversion_free(&unknown);
}
END_TEST

static Suite *
djversion_suite(void)
{
    Suite *s = suite_create("djversion");
    TCase *tc = tcase_create("djversion");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_checkout_branch_and_packed_ref);
    tcase_add_test(tc, test_checkout_worktree_link);
    tcase_add_test(tc, test_checkout_of_another_user);
    tcase_add_test(tc, test_root_without_git_asks_python);
    tcase_add_test(tc, test_processor_python_and_scripts);
    tcase_add_test(tc, test_unreadable_versions_say_why);
    tcase_add_test(tc, test_judge);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(djversion_suite());
}
