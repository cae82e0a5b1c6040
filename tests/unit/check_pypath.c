/*
 * check_pypath: the path operations that must answer as the Python
 * reference does (CPython 3.11): normpath on its edge cases (".." past the
 * root or at the start of a relative path, "//" kept, trailing slashes, the
 * empty string), realpath(strict=False) on a tree of symlinks with loops
 * (the expected strings were produced by CPython 3.11's os.path.realpath
 * on the same tree), expanduser, the safe join that refuses every escape
 * from a job dir, and rglob's files in code point order.
 */
#include <check.h>
#include <errno.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "pypath.h"
#include "testutil.h"
#include "util.h"

START_TEST(test_normpath)
{
    /* {input, posixpath.normpath(input)}, from CPython 3.11. */
    static const struct {
        const char *in, *want;
    } t[] = {
        { "", "." },
        { ".", "." },
        { "./", "." },
        { "/", "/" },
        { "//", "//" },
        { "///", "/" },
        { "////a", "/a" },
        { "//a//b/", "//a/b" },
        { "/..", "/" },
        { "//..", "//" },
        { "///..", "/" },
        { "/../a/..", "/" },
        { "/./..", "/" },
        { "//../a", "//a" },
        { "/a/b/..", "/a" },
        { "..", ".." },
        { "../..", "../.." },
        { "a/../..", ".." },
        { "a/b/../../..", ".." },
        { "../a/../b", "../b" },
        { ".//..", ".." },
        { "a/..", "." },
        { "./a/./", "a" },
        { "a//b/", "a/b" },
        { "a/./b/.", "a/b" },
        { "...", "..." },
        { ".../..", "." },
        { "a/.hidden/..", "a" },
        { "../../a/b/../c", "../../a/c" },
    };

    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        char *got = pypath_normpath(t[i].in);

        ck_assert_msg(strcmp(got, t[i].want) == 0, "normpath('%s') = '%s', want '%s'", t[i].in, got,
                      t[i].want);
        free(got);
    }
}
END_TEST

/*
 * The tree the realpath expectations were worked out on (B = base dir):
 *   real/ real/sub/ real/file  link -> real  abslink -> B/real/sub
 *   loop1 -> loop2  loop2 -> loop1  self -> self  vialoop -> loop1/q
 *   dangling -> nonexistent/target  real/up -> ../other  chain -> link/sub
 *   root -> /  dotdot -> ../x/../real  real/s2 -> sub  here -> .  up1 -> ..
 *   twice -> link/../link/sub  aloop1 -> B/aloop2/z  aloop2 -> B/aloop1
 *   selfup -> self/..  deeploop -> real/sub/../../loop1
 */
static char *
realpath_tree(void)
{
    char *b = tu_real_tmpdir();
    char *abs = fs_join(b, "real/sub");
    char *f = tu_write(b, "real/file", "", 0);

    tu_mkdir_at(b, "real/sub");
    tu_symlink_at("real", b, "link");
    tu_symlink_at(abs, b, "abslink");
    tu_symlink_at("loop2", b, "loop1");
    tu_symlink_at("loop1", b, "loop2");
    tu_symlink_at("self", b, "self");
    tu_symlink_at("loop1/q", b, "vialoop");
    tu_symlink_at("nonexistent/target", b, "dangling");
    tu_symlink_at("../other", b, "real/up");
    tu_symlink_at("link/sub", b, "chain");
    tu_symlink_at("/", b, "root");
    tu_symlink_at("../x/../real", b, "dotdot");
    tu_symlink_at("sub", b, "real/s2");
    tu_symlink_at(".", b, "here");
    tu_symlink_at("..", b, "up1");
    tu_symlink_at("link/../link/sub", b, "twice");
    {
        char *a1 = fs_join(b, "aloop1"), *a2z = fs_join(b, "aloop2/z");

        tu_symlink_at(a2z, b, "aloop1");
        tu_symlink_at(a1, b, "aloop2");
        free(a2z);
        free(a1);
    }
    tu_symlink_at("self/..", b, "selfup");
    tu_symlink_at("real/sub/../../loop1", b, "deeploop");
    free(f);
    free(abs);
    return b;
}

START_TEST(test_realpath)
{
    /* {input below B, expected below B}; "^" stands for B's parent. */
    static const struct {
        const char *in, *want;
    } t[] = {
        { "/link/sub/x", "/real/sub/x" }, /* symlink in the middle */
        { "/link/..", "" },               /* ".." after a symlink */
        { "/link/../real", "/real" },
        { "/abslink/../file", "/real/file" }, /* absolute target */
        { "/chain/..", "/real" },             /* link to a link */
        { "/twice/x", "/real/sub/x" },
        { "/link/s2/..", "/real" },
        { "/link/../link/sub", "/real/sub" }, /* cached resolution */
        { "/nope/../real", "/real" },         /* missing, then ".." */
        { "/nope/a/../../link/./sub", "/real/sub" },
        { "/real/file/../sub", "/real/sub" },   /* ".." after a file */
        { "/real/file/x/..", "/real/file" },    /* ENOTDIR kept as text */
        { "/dangling", "/nonexistent/target" }, /* dangling symlink */
        { "/dangling/../z", "/nonexistent/z" },
        { "/real/up", "/other" },
        { "/real/up/../sub", "/sub" },
        { "/loop1", "/loop1" }, /* loop: rest unresolved */
        { "/loop1/x/../y", "/loop1/y" },
        { "/loop1/a/b/../../..", "" },
        { "/self/a", "/self/a" },
        { "/vialoop/r", "/loop1/q/r" },
        { "/link/s2/../../loop2/k", "/loop2/k" },
        { "/here/here/link", "/real" },
        { "/real/sub/", "/real/sub" },     /* trailing slash */
        { "//real///sub//", "/real/sub" }, /* repeated slashes */
        { "/./real/./sub/.", "/real/sub" },
        { "/real/sub//", "/real/sub" },
        { "/real/file/", "/real/file" }, /* a file with a slash: kept */
        { "/nope//..//real/", "/real" },
        /* Loops, strict=False: never an error, the rest kept as text. */
        { "/loop1/..", "" },
        { "/loop1/../link", "/link" }, /* ".." after a loop: textual */
        { "/loop2/./x/.", "/loop2/x" },
        { "/self/..", "" },
        { "/self/../real", "/real" },
        { "/selfup", "" }, /* a link into its own loop */
        { "/selfup/x", "/x" },
        { "/deeploop/k", "/loop1/k" }, /* a loop reached by a target */
        { "/aloop1", "/aloop1/z" },    /* a loop of absolute links */
        { "/aloop1/w", "/aloop1/z/w" },
        { "/aloop2/../real", "/aloop2/real" },
    };
    char *b = realpath_tree();
    char *parent = fs_dirname(b);
    char *base = xstrdup(fs_basename(b));
    struct esd_err err;

    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        char *in = xasprintf("%s%s", b, t[i].in);
        char *want = xasprintf("%s%s", b, t[i].want);
        char *got = NULL;

        ck_assert_int_eq(pypath_realpath(in, &got, &err), 0);
        ck_assert_msg(strcmp(got, want) == 0, "realpath(%s) = %s, want %s", in, got, want);
        free(got);
        free(want);
        free(in);
    }

    /* Results outside B. */
    {
        const struct {
            const char *in, *want;
        } o[] = {
            { "/root/..", "/" },
            { "/dotdot/sub", "%P/real/sub" },
            { "/loop1/../../z", "%P/z" },
            { "/up1/%N/link", "%B/real" },
            /* CPython joins the unresolved rest with os.path.join, so an
             * empty component after a loop makes the rest absolute. */
            { "/loop1//y", "/y" },
            { "/self//x", "/x" },
            /* ".." past B after a link, and past the root. */
            { "/link/../../x", "%P/x" },
            { "/here/../real", "%P/real" },
            { "/root/../..", "/" },
        };

        for (size_t i = 0; i < sizeof(o) / sizeof(o[0]); i++) {
            struct buf in, want;
            char *got = NULL;

            buf_init(&in);
            buf_init(&want);
            buf_puts(&in, b);
            for (const char *p = o[i].in; *p; p++) {
                if (p[0] == '%' && p[1] == 'N')
                    buf_puts(&in, base), p++;
                else
                    buf_putc(&in, *p);
            }
            for (const char *p = o[i].want; *p; p++) {
                if (p[0] == '%' && p[1] == 'P')
                    buf_puts(&want, parent), p++;
                else if (p[0] == '%' && p[1] == 'B')
                    buf_puts(&want, b), p++;
                else
                    buf_putc(&want, *p);
            }
            ck_assert_int_eq(pypath_realpath(in.p, &got, &err), 0);
            ck_assert_msg(strcmp(got, want.p) == 0, "realpath(%s) = %s, want %s", in.p, got,
                          want.p);
            free(got);
            buf_free(&in);
            buf_free(&want);
        }
    }

    fs_rm_rf(b);
    free(base);
    free(parent);
    free(b);
}
END_TEST

START_TEST(test_realpath_root_and_relative)
{
    /* realpath, unlike normpath, does not keep a leading "//". */
    static const char *const roots[] = {
        "/", "/..", "/../..", "//", "/./", "//..", "///", "/.//../.",
    };
    char *b = realpath_tree();
    char *real = fs_join(b, "real");
    struct esd_err err;
    char *got;

    for (size_t i = 0; i < sizeof(roots) / sizeof(roots[0]); i++) {
        ck_assert_int_eq(pypath_realpath(roots[i], &got, &err), 0);
        ck_assert_str_eq(got, "/");
        free(got);
    }
    /* Relative paths are taken against the working directory. */
    ck_assert_int_eq(chdir(real), 0);
    ck_assert_int_eq(pypath_realpath("s2/x", &got, &err), 0);
    ck_assert_str_eq(got + strlen(b), "/real/sub/x");
    free(got);
    ck_assert_int_eq(pypath_realpath("", &got, &err), 0);
    ck_assert_str_eq(got, real);
    free(got);
    ck_assert_int_eq(chdir("/"), 0);

    fs_rm_rf(b);
    free(real);
    free(b);
}
END_TEST

START_TEST(test_resolve_cli)
{
    char *b = realpath_tree();
    char *home = fs_join(b, "link");
    char *home_slash = xasprintf("%s/", home);
    char *want, *got;
    struct passwd *pw;
    struct esd_err err;

    setenv("HOME", home, 1);
    ck_assert_int_eq(pypath_resolve_cli("~", &got, &err), 0);
    want = fs_join(b, "real");
    ck_assert_str_eq(got, want);
    free(want);
    free(got);

    setenv("HOME", home_slash, 1);
    ck_assert_int_eq(pypath_resolve_cli("~/sub/../file", &got, &err), 0);
    want = fs_join(b, "real/file");
    ck_assert_str_eq(got, want);
    free(want);
    free(got);

    /* Python: ("" + "/x") or "/" */
    setenv("HOME", "", 1);
    ck_assert_int_eq(pypath_resolve_cli("~/x", &got, &err), 0);
    ck_assert_str_eq(got, "/x");
    free(got);
    setenv("HOME", "/", 1);
    ck_assert_int_eq(pypath_resolve_cli("~", &got, &err), 0);
    ck_assert_str_eq(got, "/");
    free(got);

    /* No $HOME: the password database. */
    unsetenv("HOME");
    pw = getpwuid(getuid());
    if (pw) {
        char *real = realpath(pw->pw_dir, NULL);

        ck_assert_int_eq(pypath_resolve_cli("~", &got, &err), 0);
        if (real)
            ck_assert_str_eq(got, real);
        free(real);
        free(got);
    }
    pw = getpwnam("root");
    if (pw) {
        char *real = realpath(pw->pw_dir, NULL);

        ck_assert_int_eq(pypath_resolve_cli("~root/x", &got, &err), 0);
        if (real) {
            want = fs_join(real, "x");
            ck_assert_str_eq(got, want);
            free(want);
        }
        free(real);
        free(got);
    }

    /* Unknown user: left as is, then relative to the working directory. */
    ck_assert_int_eq(chdir(b), 0);
    ck_assert_int_eq(pypath_resolve_cli("~no_such_user_esd/x", &got, &err), 0);
    want = fs_join(b, "~no_such_user_esd/x");
    ck_assert_str_eq(got, want);
    free(want);
    free(got);
    ck_assert_int_eq(pypath_resolve_cli("link/s2/../../dangling", &got, &err), 0);
    want = fs_join(b, "nonexistent/target");
    ck_assert_str_eq(got, want);
    free(want);
    free(got);
    ck_assert_int_eq(chdir("/"), 0);

    fs_rm_rf(b);
    free(home_slash);
    free(home);
    free(b);
}
END_TEST

START_TEST(test_join_inside)
{
    static const struct {
        const char *rel, *want;
    } ok[] = {
        { "a/b", "/a/b" },
        { "shards/part-00001-of-00002.jsonl", "/shards/part-00001-of-00002.jsonl" },
        { "in/x", "/sub/x" },
        { "abs_in", "/sub" },
        { "a/../b", "/b" },
        { ".", "" },
        { "sub/", "/sub" },
        { "in/../sub", "/sub" },
        { "up/job/sub", "/sub" }, /* leaves and comes back: the result counts */
    };
    static const char *const bad[] = {
        "..",    "../job2", "a/../../x", "sub/../..",  "/etc/passwd", "",        "out",
        "out/x", "esc",     "esc/f",     "in/../../x", "up",          "up/job2",
    };
    char *b = tu_real_tmpdir();
    char *root = fs_join(b, "job");
    char *outside = fs_join(b, "outside");
    char *abs_in = fs_join(root, "sub");
    struct esd_err err;

    tu_mkdir_at(b, "job/sub");
    tu_mkdir_at(b, "job2");
    tu_mkdir_at(b, "outside");
    tu_symlink_at("sub", root, "in");
    tu_symlink_at(abs_in, root, "abs_in");
    tu_symlink_at(outside, root, "out");
    tu_symlink_at("../job2", root, "esc");
    tu_symlink_at("..", root, "up");

    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        char *got = NULL, *want = xasprintf("%s%s", root, ok[i].want);

        ck_assert_msg(pypath_join_inside(root, ok[i].rel, &got, &err) == 0, "%s: %s", ok[i].rel,
                      err.msg);
        ck_assert_str_eq(got, want);
        free(got);
        free(want);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        static char untouched[] = "untouched";
        char *got = untouched, *want;

        ck_assert_msg(pypath_join_inside(root, bad[i], &got, &err) == -EINVAL, "%s accepted",
                      bad[i]);
        want = xasprintf("Manifest path escapes job directory: %s", bad[i]);
        ck_assert_str_eq(err.msg, want);
        ck_assert_str_eq(got, "untouched");
        free(want);
    }
    /* An absolute rel is refused even when it names a place inside. */
    {
        char *got = NULL;

        ck_assert_int_eq(pypath_join_inside(root, abs_in, &got, &err), -EINVAL);
        ck_assert_ptr_null(got);
    }

    fs_rm_rf(b);
    free(abs_in);
    free(outside);
    free(root);
    free(b);
}
END_TEST

static bool
is_jsonl(const char *name)
{
    size_t n = strlen(name);

    return n > 6 && strcmp(name + n - 6, ".jsonl") == 0;
}

/* rglob: code point order of the relative path (so "a-b" < "a.jsonl" <
 * "a/b" < "a0" and a non-ASCII name last), hidden names walked, a link to
 * a file followed (with the target's stat), a link to a directory, a
 * dangling link, a FIFO and names want() refuses left out. */
START_TEST(test_rglob)
{
    static const char *const want[] = {
        ".hidden/x.jsonl", "B.jsonl",  "_tmp.jsonl",     "a-b.jsonl",      "a.jsonl",
        "a/b.jsonl",       "a0.jsonl", "linkfile.jsonl", "\xc3\xa9.jsonl",
    };
    static const char *const files[] = {
        "a.jsonl",  "B.jsonl",         "\xc3\xa9.jsonl", "a-b.jsonl",  "a/b.jsonl",
        "a0.jsonl", ".hidden/x.jsonl", "_tmp.jsonl",     "a/skip.txt",
    };
    char *d = tu_real_tmpdir();
    char *fifo = fs_join(d, "fifo.jsonl");
    struct pypath_entries e;
    struct esd_err err;

    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++)
        free(tu_write(d, files[i], "{}\n{}\n", (size_t)-1));
    tu_symlink_at("a.jsonl", d, "linkfile.jsonl");
    tu_symlink_at("a", d, "linkdir");
    tu_symlink_at("nowhere.jsonl", d, "dangling.jsonl");
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);

    ck_assert_int_eq(pypath_rglob(d, is_jsonl, &e, &err), 0);
    ck_assert_uint_eq(e.n, sizeof(want) / sizeof(want[0]));
    for (size_t i = 0; i < e.n; i++) {
        char *path = fs_join(d, want[i]);

        ck_assert_str_eq(e.v[i].rel, want[i]);
        ck_assert_str_eq(e.v[i].path, path);
        ck_assert(S_ISREG(e.v[i].st.st_mode));
        ck_assert_int_eq(e.v[i].st.st_size, 6);
        free(path);
    }
    pypath_entries_free(&e);
    ck_assert_uint_eq(e.n, 0);

    /* An empty directory: nothing, no error. */
    tu_mkdir_at(d, "empty");
    {
        char *empty = fs_join(d, "empty");

        ck_assert_int_eq(pypath_rglob(empty, is_jsonl, &e, &err), 0);
        ck_assert_uint_eq(e.n, 0);
        pypath_entries_free(&e);
        free(empty);
    }

    /* A missing directory: an error naming it. */
    {
        char *missing = fs_join(d, "missing"), *msg;

        ck_assert_int_eq(pypath_rglob(missing, is_jsonl, &e, &err), -ENOENT);
        msg = xasprintf("cannot read directory %s", missing);
        ck_assert_ptr_nonnull(strstr(err.msg, msg));
        pypath_entries_free(&e);
        free(msg);
        free(missing);
    }

    fs_rm_rf(d);
    free(fifo);
    free(d);
}
END_TEST

static Suite *
pypath_suite(void)
{
    Suite *s = suite_create("pypath");
    TCase *tc = tcase_create("pypath");

    tcase_add_test(tc, test_normpath);
    tcase_add_test(tc, test_realpath);
    tcase_add_test(tc, test_realpath_root_and_relative);
    tcase_add_test(tc, test_resolve_cli);
    tcase_add_test(tc, test_join_inside);
    tcase_add_test(tc, test_rglob);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(pypath_suite());
}
