/*
 * check_fsutil: the filesystem primitives of the job-directory contract:
 * atomic replace, exclusive publish and O_EXCL create leave either the
 * complete new file or nothing (no temp files, originals untouched, ENOSPC a
 * clean error naming the path); reads refuse what is not a small regular
 * file; rm -rf never follows a symlink; path resolution gives what CPython
 * 3.11's os.path.realpath gives (the expected strings were produced by it on
 * the same tree); and the safe join refuses every escape from a job dir.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pwd.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "testutil.h"
#include "util.h"

/* A fresh temp dir with every symlink in its name resolved. */
static char *
real_tmpdir(void)
{
    char *dir = tu_tmpdir();
    char *real = realpath(dir, NULL);

    ck_assert_ptr_nonnull(real);
    free(dir);
    return real;
}

static void
symlink_at(const char *target, const char *dir, const char *rel)
{
    char *path = fs_join(dir, rel);

    ck_assert_msg(symlink(target, path) == 0, "symlink %s: %s", path, strerror(errno));
    free(path);
}

static void
mkdir_at(const char *dir, const char *rel)
{
    char *path = fs_join(dir, rel);

    ck_assert_int_eq(fs_mkdir_p(path, 0755, NULL), 0);
    free(path);
}

static mode_t
mode_of(const char *path)
{
    struct stat st;

    ck_assert_int_eq(lstat(path, &st), 0);
    return st.st_mode & 07777;
}

static bool
starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

START_TEST(test_basename_dirname)
{
    static const struct {
        const char *path, *base, *dir;
    } t[] = {
        { "/a/b/c.json", "c.json", "/a/b" },
        { "/x", "x", "/" },
        { "/", "", "/" },
        { "x", "x", "." },
        { "a//b", "b", "a" },
        { "//x", "x", "/" },
        { "a/b/", "", "a/b" },
    };

    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        char *d = fs_dirname(t[i].path);

        ck_assert_str_eq(fs_basename(t[i].path), t[i].base);
        ck_assert_str_eq(d, t[i].dir);
        free(d);
    }
}
END_TEST

START_TEST(test_join_and_inside)
{
    static const struct {
        const char *a, *b, *want;
    } t[] = {
        { "/a", "b", "/a/b" },   { "/a/", "b", "/a/b" },     { "/a//", "/b", "/a/b" },
        { "/", "x", "/x" },      { "a", "b/c", "a/b/c" },    { "", "b", "b" },
        { "/a", "", "/a/" },
    };

    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        char *j = fs_join(t[i].a, t[i].b);

        ck_assert_str_eq(j, t[i].want);
        free(j);
    }
    ck_assert(fs_is_inside("/job", "/job"));
    ck_assert(fs_is_inside("/job", "/job/a"));
    ck_assert(fs_is_inside("/job/", "/job/a"));
    ck_assert(!fs_is_inside("/job", "/job2"));
    ck_assert(!fs_is_inside("/job", "/jo"));
    ck_assert(!fs_is_inside("/job", "/"));
    ck_assert(fs_is_inside("/", "/anything"));
}
END_TEST

START_TEST(test_tmp_path)
{
    char *a = fs_tmp_path("/j/state/done/00001.json");
    char *b = fs_tmp_path("/j/state/done/00001.json");
    const char *prefix = "/j/state/done/.00001.json.";
    size_t n = strlen(prefix);

    ck_assert(starts_with(a, prefix));
    ck_assert_uint_eq(strlen(a), n + 32 + 4);
    ck_assert_str_eq(a + n + 32, ".tmp");
    ck_assert_uint_eq(strspn(a + n, "0123456789abcdef"), 32);
    ck_assert_str_ne(a, b);
    free(a);
    free(b);
}
END_TEST

START_TEST(test_write_all)
{
    char *dir = real_tmpdir();
    char *path = fs_join(dir, "big");
    size_t len = 3 << 20;
    char *data = xmalloc(len), *got;
    size_t got_len = 0;
    int fd;

    for (size_t i = 0; i < len; i++)
        data[i] = (char)(i * 7);
    fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(fs_write_all(fd, data, len), 0);
    ck_assert_int_eq(fs_write_all(fd, data, 0), 0);
    close(fd);
    got = tu_read(path, &got_len);
    ck_assert_uint_eq(got_len, len);
    ck_assert(memcmp(got, data, len) == 0);
    ck_assert_int_eq(fs_write_all(-1, "x", 1), -EBADF);

    fs_rm_rf(dir);
    free(got);
    free(data);
    free(path);
    free(dir);
}
END_TEST

START_TEST(test_write_atomic_replaces)
{
    char *dir = real_tmpdir();
    char *path = tu_write(dir, "manifest.json", "old content", (size_t)-1);
    struct esd_err err;
    char *got;

    umask(022);
    ck_assert_int_eq(chmod(path, 0600), 0);
    ck_assert_int_eq(fs_write_atomic(path, "new", 3, 0666, &err), 0);
    got = tu_read(path, NULL);
    ck_assert_str_eq(got, "new");
    free(got);
    ck_assert_uint_eq(mode_of(path), 0644);
    ck_assert_int_eq(tu_count_entries(dir), 1);

    /* A new file, empty content. */
    free(path);
    path = fs_join(dir, "empty");
    ck_assert_int_eq(fs_write_atomic(path, "", 0, 0640, &err), 0);
    got = tu_read(path, NULL);
    ck_assert_str_eq(got, "");
    free(got);
    ck_assert_uint_eq(mode_of(path), 0640);
    ck_assert_int_eq(tu_count_entries(dir), 2);

    fs_rm_rf(dir);
    free(path);
    free(dir);
}
END_TEST

START_TEST(test_write_atomic_failures_leave_nothing)
{
    char *dir = real_tmpdir();
    char *missing = fs_join(dir, "no/such/dir/f.json");
    char *target = fs_join(dir, "isdir");
    struct esd_err err;

    ck_assert_int_eq(fs_write_atomic(missing, "x", 1, 0644, &err), -ENOENT);
    ck_assert_ptr_nonnull(strstr(err.msg, "f.json"));
    ck_assert_ptr_nonnull(strstr(err.msg, "No such file or directory"));

    /* rename() over a non-empty directory fails: the temp must go. */
    mkdir_at(dir, "isdir/child");
    ck_assert_int_lt(fs_write_atomic(target, "x", 1, 0644, &err), 0);
    ck_assert_ptr_nonnull(strstr(err.msg, target));
    ck_assert_int_eq(tu_count_entries(dir), 1);
    ck_assert_int_eq(tu_count_entries(target), 1);

    fs_rm_rf(dir);
    free(target);
    free(missing);
    free(dir);
}
END_TEST

START_TEST(test_publish_excl)
{
    char *dir = real_tmpdir();
    char *path = fs_join(dir, "done.json");
    struct esd_err err;
    char *got, *want;

    umask(022);
    ck_assert_int_eq(fs_publish_excl(path, "first\n", 6, 0666, &err), 0);
    ck_assert_uint_eq(mode_of(path), 0644);
    ck_assert_int_eq(tu_count_entries(dir), 1);

    err_clear(&err);
    ck_assert_int_eq(fs_publish_excl(path, "second\n", 7, 0666, &err), -EEXIST);
    want = xasprintf("%s already exists", path);
    ck_assert_str_eq(err.msg, want);
    ck_assert_int_eq(err.code, -EEXIST);
    got = tu_read(path, NULL);
    ck_assert_str_eq(got, "first\n");
    ck_assert_int_eq(tu_count_entries(dir), 1);

    fs_rm_rf(dir);
    free(got);
    free(want);
    free(path);
    free(dir);
}
END_TEST

START_TEST(test_publish_excl_over_dangling_symlink)
{
    char *dir = real_tmpdir();
    char *path = fs_join(dir, "done.json");
    struct esd_err err;

    symlink_at("nowhere", dir, "done.json");
    ck_assert_int_eq(fs_publish_excl(path, "x", 1, 0644, &err), -EEXIST);
    ck_assert_int_eq(tu_count_entries(dir), 1);

    fs_rm_rf(dir);
    free(path);
    free(dir);
}
END_TEST

START_TEST(test_create_excl)
{
    char *dir = real_tmpdir();
    char *path = fs_join(dir, "0001.lock");
    struct esd_err err;
    char *got, *want, back[8] = { 0 };
    int fd = -1;

    umask(0);
    ck_assert_int_eq(fs_create_excl(path, "{\"a\": 1}\n", 9, 0644, NULL, &err), 0);
    ck_assert_uint_eq(mode_of(path), 0644);
    got = tu_read(path, NULL);
    ck_assert_str_eq(got, "{\"a\": 1}\n");
    free(got);

    ck_assert_int_eq(fs_create_excl(path, "other", 5, 0644, &fd, &err), -EEXIST);
    ck_assert_int_eq(fd, -1);
    want = xasprintf("%s already exists", path);
    ck_assert_str_eq(err.msg, want);
    free(want);
    got = tu_read(path, NULL);
    ck_assert_str_eq(got, "{\"a\": 1}\n");
    free(got);

    /* With ret_fd: open read-write, close-on-exec. */
    free(path);
    path = fs_join(dir, "0002.lock");
    ck_assert_int_eq(fs_create_excl(path, "token", 5, 0600, &fd, &err), 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(fcntl(fd, F_GETFL) & O_ACCMODE, O_RDWR);
    ck_assert(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    ck_assert_int_eq(pread(fd, back, 5, 0), 5);
    ck_assert_str_eq(back, "token");
    ck_assert_uint_eq(mode_of(path), 0600);
    close(fd);

    fs_rm_rf(dir);
    free(path);
    free(dir);
}
END_TEST

START_TEST(test_create_excl_missing_dir)
{
    char *dir = real_tmpdir();
    char *path = fs_join(dir, "nodir/x.lock");
    struct esd_err err;

    ck_assert_int_eq(fs_create_excl(path, "x", 1, 0644, NULL, &err), -ENOENT);
    ck_assert_ptr_nonnull(strstr(err.msg, path));

    fs_rm_rf(dir);
    free(path);
    free(dir);
}
END_TEST

/*
 * A 64 KiB tmpfs in a private mount namespace, for real ENOSPC. Needs root;
 * returns NULL after printing a notice otherwise.
 */
static char *
small_tmpfs(void)
{
    char *dir;

    if (geteuid() != 0) {
        printf("notice: not root, ENOSPC test skipped\n");
        return NULL;
    }
    dir = real_tmpdir();
    /* Best effort: keep the mount out of the parent namespace. */
    if (unshare(CLONE_NEWNS) == 0)
        mount("none", "/", "none", MS_REC | MS_PRIVATE, NULL);
    if (mount("tmpfs", dir, "tmpfs", 0, "size=64k") < 0) {
        printf("notice: cannot mount a tmpfs (%s), ENOSPC test skipped\n", strerror(errno));
        rmdir(dir);
        free(dir);
        return NULL;
    }
    return dir;
}

static void
small_tmpfs_done(char *dir)
{
    umount2(dir, MNT_DETACH);
    rmdir(dir);
    free(dir);
}

START_TEST(test_enospc)
{
    char *dir = small_tmpfs();
    size_t len = 256 << 10;
    char *data, *path, *want;
    struct esd_err err;
    int fd = -1;

    if (!dir)
        return;
    data = xcalloc(1, len);
    path = fs_join(dir, "manifest.json");
    want = xasprintf("cannot write %s: No space left on device", path);

    ck_assert_int_eq(fs_write_atomic(path, data, len, 0644, &err), -ENOSPC);
    ck_assert_str_eq(err.msg, want);
    ck_assert_int_eq(tu_count_entries(dir), 0);

    ck_assert_int_eq(fs_publish_excl(path, data, len, 0644, &err), -ENOSPC);
    ck_assert_str_eq(err.msg, want);
    ck_assert_int_eq(tu_count_entries(dir), 0);

    ck_assert_int_eq(fs_create_excl(path, data, len, 0644, &fd, &err), -ENOSPC);
    ck_assert_str_eq(err.msg, want);
    ck_assert_int_eq(fd, -1);
    ck_assert_int_eq(tu_count_entries(dir), 0);

    /* The filesystem still works for what fits. */
    ck_assert_int_eq(fs_write_atomic(path, "{}\n", 3, 0644, &err), 0);
    ck_assert_int_eq(tu_count_entries(dir), 1);

    small_tmpfs_done(dir);
    free(want);
    free(path);
    free(data);
}
END_TEST

START_TEST(test_read_file)
{
    char *dir = real_tmpdir();
    char *path = tu_write(dir, "f", "hello\0world", 11);
    char *empty = tu_write(dir, "e", "", 0);
    char *data = NULL;
    size_t len = 0;
    struct esd_err err;

    ck_assert_int_eq(fs_read_file(path, 11, &data, &len, &err), 0);
    ck_assert_uint_eq(len, 11);
    ck_assert(memcmp(data, "hello\0world", 12) == 0);
    free(data);

    ck_assert_int_eq(fs_read_file(empty, 0, &data, NULL, &err), 0);
    ck_assert_str_eq(data, "");
    free(data);

    fs_rm_rf(dir);
    free(empty);
    free(path);
    free(dir);
}
END_TEST

START_TEST(test_read_file_refusals)
{
    char *dir = real_tmpdir();
    char *path = tu_write(dir, "f", "0123456789", 10);
    char *fifo = fs_join(dir, "fifo");
    char *missing = fs_join(dir, "missing");
    static char sentinel[] = "untouched";
    char *data = sentinel, *want;
    size_t len = 99;
    struct esd_err err;

    ck_assert_int_eq(fs_read_file(path, 9, &data, &len, &err), -EFBIG);
    want = xasprintf("%s is larger than 9 bytes", path);
    ck_assert_str_eq(err.msg, want);
    free(want);

    ck_assert_int_eq(fs_read_file(dir, 1024, &data, &len, &err), -EINVAL);
    want = xasprintf("%s is not a regular file", dir);
    ck_assert_str_eq(err.msg, want);
    free(want);

    /* A FIFO with no writer: refused at once, not waited on. */
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    ck_assert_int_eq(fs_read_file(fifo, 1024, &data, &len, &err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, fifo));

    ck_assert_int_eq(fs_read_file(missing, 1024, &data, &len, &err), -ENOENT);
    want = xasprintf("cannot open %s: No such file or directory", missing);
    ck_assert_str_eq(err.msg, want);
    free(want);

    ck_assert_ptr_eq(data, sentinel);
    ck_assert_uint_eq(len, 99);

    fs_rm_rf(dir);
    free(missing);
    free(fifo);
    free(path);
    free(dir);
}
END_TEST

START_TEST(test_mkdir_p)
{
    char *dir = real_tmpdir();
    char *deep = fs_join(dir, "a/b//c/");
    char *c = fs_join(dir, "a/b/c");
    char *blocked = fs_join(dir, "file/sub");
    char *file = tu_write(dir, "file", "x", 1);
    struct esd_err err;

    umask(0);
    ck_assert_int_eq(fs_mkdir_p(deep, 0750, &err), 0);
    ck_assert_uint_eq(mode_of(c), 0750);
    ck_assert_int_eq(fs_mkdir_p(deep, 0750, &err), 0);
    ck_assert_int_eq(fs_mkdir_p(dir, 0750, &err), 0);
    ck_assert_int_eq(fs_mkdir_p("/", 0755, &err), 0);

    ck_assert_int_eq(fs_mkdir_p(blocked, 0755, &err), -ENOTDIR);
    ck_assert_ptr_nonnull(strstr(err.msg, file));
    ck_assert_int_eq(fs_mkdir_p(file, 0755, &err), -ENOTDIR);
    ck_assert_int_eq(fs_mkdir_p("", 0755, &err), -ENOENT);

    /* A symlink to a directory counts as one. */
    symlink_at("a", dir, "alias");
    free(deep);
    deep = fs_join(dir, "alias/b/new");
    ck_assert_int_eq(fs_mkdir_p(deep, 0755, &err), 0);
    ck_assert(tu_exists(deep));

    fs_rm_rf(dir);
    free(file);
    free(blocked);
    free(c);
    free(deep);
    free(dir);
}
END_TEST

START_TEST(test_fsync_dir)
{
    char *dir = real_tmpdir();
    char *file = tu_write(dir, "f", "x", 1);
    char *missing = fs_join(dir, "missing");
    struct esd_err err;

    ck_assert_int_eq(fs_fsync_dir(dir, &err), 0);
    ck_assert_int_eq(fs_fsync_parent(file, &err), 0);
    ck_assert_int_eq(fs_fsync_dir(missing, &err), -ENOENT);
    ck_assert_ptr_nonnull(strstr(err.msg, missing));
    ck_assert_int_eq(fs_fsync_dir(file, &err), -ENOTDIR);

    fs_rm_rf(dir);
    free(missing);
    free(file);
    free(dir);
}
END_TEST

START_TEST(test_rm_rf)
{
    char *dir = real_tmpdir();
    char *tree = fs_join(dir, "tree");
    char *outside = fs_join(dir, "outside");
    char *keep = tu_write(dir, "outside/keep", "keep", (size_t)-1);
    char *f;

    f = tu_write(dir, "tree/a/b/c/file", "x", 1);
    free(f);
    f = tu_write(dir, "tree/top", "x", 1);
    free(f);
    mkdir_at(dir, "tree/empty");
    symlink_at(outside, dir, "tree/a/link_dir");
    symlink_at(keep, dir, "tree/a/b/link_file");
    symlink_at("dangling", dir, "tree/dangling");
    ck_assert_int_eq(chmod(keep, 0444), 0);

    ck_assert_int_eq(fs_rm_rf(tree), 0);
    ck_assert(!tu_exists(tree));
    ck_assert(tu_exists(keep));
    ck_assert_int_eq(tu_count_entries(outside), 1);

    /* Missing: fine. A symlink to a directory: only the link goes. */
    ck_assert_int_eq(fs_rm_rf(tree), 0);
    symlink_at(outside, dir, "alias");
    f = fs_join(dir, "alias");
    ck_assert_int_eq(fs_rm_rf(f), 0);
    ck_assert(!tu_exists(f));
    ck_assert(tu_exists(keep));
    free(f);

    /* A plain file. */
    ck_assert_int_eq(fs_rm_rf(keep), 0);
    ck_assert(!tu_exists(keep));

    ck_assert_int_eq(fs_rm_rf(dir), 0);
    ck_assert(!tu_exists(dir));
    free(keep);
    free(outside);
    free(tree);
    free(dir);
}
END_TEST

/*
 * The tree the realpath expectations were worked out on (B = base dir):
 *   real/ real/sub/ real/file  link -> real  abslink -> B/real/sub
 *   loop1 -> loop2  loop2 -> loop1  self -> self  vialoop -> loop1/q
 *   dangling -> nonexistent/target  real/up -> ../other  chain -> link/sub
 *   root -> /  dotdot -> ../x/../real  real/s2 -> sub  here -> .  up1 -> ..
 *   twice -> link/../link/sub
 */
static char *
realpath_tree(void)
{
    char *b = real_tmpdir();
    char *abs = fs_join(b, "real/sub");
    char *f = tu_write(b, "real/file", "", 0);

    mkdir_at(b, "real/sub");
    symlink_at("real", b, "link");
    symlink_at(abs, b, "abslink");
    symlink_at("loop2", b, "loop1");
    symlink_at("loop1", b, "loop2");
    symlink_at("self", b, "self");
    symlink_at("loop1/q", b, "vialoop");
    symlink_at("nonexistent/target", b, "dangling");
    symlink_at("../other", b, "real/up");
    symlink_at("link/sub", b, "chain");
    symlink_at("/", b, "root");
    symlink_at("../x/../real", b, "dotdot");
    symlink_at("sub", b, "real/s2");
    symlink_at(".", b, "here");
    symlink_at("..", b, "up1");
    symlink_at("link/../link/sub", b, "twice");
    free(f);
    free(abs);
    return b;
}

START_TEST(test_realpath_lax)
{
    /* {input below B, expected below B}; "^" stands for B's parent. */
    static const struct {
        const char *in, *want;
    } t[] = {
        { "/link/sub/x", "/real/sub/x" },               /* symlink in the middle */
        { "/link/..", "" },                             /* ".." after a symlink */
        { "/link/../real", "/real" },
        { "/abslink/../file", "/real/file" },           /* absolute target */
        { "/chain/..", "/real" },                       /* link to a link */
        { "/twice/x", "/real/sub/x" },
        { "/link/s2/..", "/real" },
        { "/link/../link/sub", "/real/sub" },           /* cached resolution */
        { "/nope/../real", "/real" },                   /* missing, then ".." */
        { "/nope/a/../../link/./sub", "/real/sub" },
        { "/real/file/../sub", "/real/sub" },           /* ".." after a file */
        { "/real/file/x/..", "/real/file" },            /* ENOTDIR kept as text */
        { "/dangling", "/nonexistent/target" },         /* dangling symlink */
        { "/dangling/../z", "/nonexistent/z" },
        { "/real/up", "/other" },
        { "/real/up/../sub", "/sub" },
        { "/loop1", "/loop1" },                         /* loop: rest unresolved */
        { "/loop1/x/../y", "/loop1/y" },
        { "/loop1/a/b/../../..", "" },
        { "/self/a", "/self/a" },
        { "/vialoop/r", "/loop1/q/r" },
        { "/link/s2/../../loop2/k", "/loop2/k" },
        { "/here/here/link", "/real" },
        { "/real/sub/", "/real/sub" },                  /* trailing slash */
        { "//real///sub//", "/real/sub" },              /* repeated slashes */
        { "/./real/./sub/.", "/real/sub" },
    };
    char *b = realpath_tree();
    char *parent = fs_dirname(b);
    char *base = xstrdup(fs_basename(b));
    struct esd_err err;

    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        char *in = xasprintf("%s%s", b, t[i].in);
        char *want = xasprintf("%s%s", b, t[i].want);
        char *got = NULL;

        ck_assert_int_eq(fs_realpath_lax(in, &got, &err), 0);
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
            ck_assert_int_eq(fs_realpath_lax(in.p, &got, &err), 0);
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
    static const char *const roots[] = { "/", "/..", "/../..", "//", "/./" };
    char *b = realpath_tree();
    char *real = fs_join(b, "real");
    struct esd_err err;
    char *got;

    for (size_t i = 0; i < sizeof(roots) / sizeof(roots[0]); i++) {
        ck_assert_int_eq(fs_realpath_lax(roots[i], &got, &err), 0);
        ck_assert_str_eq(got, "/");
        free(got);
    }
    /* Relative paths are taken against the working directory. */
    ck_assert_int_eq(chdir(real), 0);
    ck_assert_int_eq(fs_realpath_lax("s2/x", &got, &err), 0);
    ck_assert_str_eq(got + strlen(b), "/real/sub/x");
    free(got);
    ck_assert_int_eq(fs_realpath_lax("", &got, &err), 0);
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
    ck_assert_int_eq(fs_resolve_cli("~", &got, &err), 0);
    want = fs_join(b, "real");
    ck_assert_str_eq(got, want);
    free(want);
    free(got);

    setenv("HOME", home_slash, 1);
    ck_assert_int_eq(fs_resolve_cli("~/sub/../file", &got, &err), 0);
    want = fs_join(b, "real/file");
    ck_assert_str_eq(got, want);
    free(want);
    free(got);

    /* Python: ("" + "/x") or "/" */
    setenv("HOME", "", 1);
    ck_assert_int_eq(fs_resolve_cli("~/x", &got, &err), 0);
    ck_assert_str_eq(got, "/x");
    free(got);
    setenv("HOME", "/", 1);
    ck_assert_int_eq(fs_resolve_cli("~", &got, &err), 0);
    ck_assert_str_eq(got, "/");
    free(got);

    /* No $HOME: the password database. */
    unsetenv("HOME");
    pw = getpwuid(getuid());
    if (pw) {
        char *real = realpath(pw->pw_dir, NULL);

        ck_assert_int_eq(fs_resolve_cli("~", &got, &err), 0);
        if (real)
            ck_assert_str_eq(got, real);
        free(real);
        free(got);
    }
    pw = getpwnam("root");
    if (pw) {
        char *real = realpath(pw->pw_dir, NULL);

        ck_assert_int_eq(fs_resolve_cli("~root/x", &got, &err), 0);
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
    ck_assert_int_eq(fs_resolve_cli("~no_such_user_esd/x", &got, &err), 0);
    want = fs_join(b, "~no_such_user_esd/x");
    ck_assert_str_eq(got, want);
    free(want);
    free(got);
    ck_assert_int_eq(fs_resolve_cli("link/s2/../../dangling", &got, &err), 0);
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

/* fs_kind: the nearest existing parent of a missing path, /proc (a type
 * not in the table: named by its number, not node-local), and an error
 * that is not a missing path. */
START_TEST(test_kind)
{
    const char *type;
    bool local, rdonly;
    char *at = NULL;
    struct esd_err err;

    ck_assert_int_eq(fs_kind("/proc/self/no/such/dir", &type, &local, &rdonly, &at, &err), 0);
    ck_assert_str_eq(at, "/proc/self");
    ck_assert_str_eq(type, "0x9fa0");
    ck_assert(!local);
    free(at);
    /* (below a file: the file's) */
    ck_assert_int_eq(fs_kind("/proc/self/status/x", &type, &local, &rdonly, &at, &err), 0);
    ck_assert_str_eq(at, "/proc/self/status");
    free(at);
    /* a name too long for any file system: an error naming the path */
    {
        char long_path[400] = "/";

        memset(long_path + 1, 'x', 300);
        ck_assert_int_eq(fs_kind(long_path, &type, &local, &rdonly, NULL, &err), -ENAMETOOLONG);
        ck_assert_ptr_nonnull(strstr(err.msg, "cannot find the file system of /xxx"));
    }
}
END_TEST

START_TEST(test_join_inside)
{
    static const struct {
        const char *rel, *want;
    } ok[] = {
        { "a/b", "/a/b" },        { "shards/part-00001-of-00002.jsonl",
                                    "/shards/part-00001-of-00002.jsonl" },
        { "in/x", "/sub/x" },     { "abs_in", "/sub" },
        { "a/../b", "/b" },       { ".", "" },
        { "sub/", "/sub" },       { "in/../sub", "/sub" },
        { "up/job/sub", "/sub" }, /* leaves and comes back: the result counts */
    };
    static const char *const bad[] = {
        "..", "../job2", "a/../../x", "sub/../..", "/etc/passwd", "", "out", "out/x",
        "esc", "esc/f", "in/../../x", "up", "up/job2",
    };
    char *b = real_tmpdir();
    char *root = fs_join(b, "job");
    char *outside = fs_join(b, "outside");
    char *abs_in = fs_join(root, "sub");
    struct esd_err err;

    mkdir_at(b, "job/sub");
    mkdir_at(b, "job2");
    mkdir_at(b, "outside");
    symlink_at("sub", root, "in");
    symlink_at(abs_in, root, "abs_in");
    symlink_at(outside, root, "out");
    symlink_at("../job2", root, "esc");
    symlink_at("..", root, "up");

    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        char *got = NULL, *want = xasprintf("%s%s", root, ok[i].want);

        ck_assert_msg(fs_join_inside(root, ok[i].rel, &got, &err) == 0, "%s: %s", ok[i].rel,
                      err.msg);
        ck_assert_str_eq(got, want);
        free(got);
        free(want);
    }
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        static char untouched[] = "untouched";
        char *got = untouched, *want;

        ck_assert_msg(fs_join_inside(root, bad[i], &got, &err) == -EINVAL, "%s accepted",
                      bad[i]);
        want = xasprintf("Manifest path escapes job directory: %s", bad[i]);
        ck_assert_str_eq(err.msg, want);
        ck_assert_str_eq(got, "untouched");
        free(want);
    }
    /* An absolute rel is refused even when it names a place inside. */
    {
        char *got = NULL;

        ck_assert_int_eq(fs_join_inside(root, abs_in, &got, &err), -EINVAL);
        ck_assert_ptr_null(got);
    }

    fs_rm_rf(b);
    free(abs_in);
    free(outside);
    free(root);
    free(b);
}
END_TEST

static Suite *
fsutil_suite(void)
{
    Suite *s = suite_create("fsutil");
    TCase *tc = tcase_create("fsutil");

    tcase_add_test(tc, test_basename_dirname);
    tcase_add_test(tc, test_join_and_inside);
    tcase_add_test(tc, test_tmp_path);
    tcase_add_test(tc, test_write_all);
    tcase_add_test(tc, test_write_atomic_replaces);
    tcase_add_test(tc, test_write_atomic_failures_leave_nothing);
    tcase_add_test(tc, test_publish_excl);
    tcase_add_test(tc, test_publish_excl_over_dangling_symlink);
    tcase_add_test(tc, test_create_excl);
    tcase_add_test(tc, test_create_excl_missing_dir);
    tcase_add_test(tc, test_enospc);
    tcase_add_test(tc, test_read_file);
    tcase_add_test(tc, test_read_file_refusals);
    tcase_add_test(tc, test_mkdir_p);
    tcase_add_test(tc, test_fsync_dir);
    tcase_add_test(tc, test_rm_rf);
    tcase_add_test(tc, test_realpath_lax);
    tcase_add_test(tc, test_realpath_root_and_relative);
    tcase_add_test(tc, test_resolve_cli);
    tcase_add_test(tc, test_join_inside);
    tcase_add_test(tc, test_kind);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(fsutil_suite());
}
