/*
 * check_fsutil: the filesystem primitives of the job-directory contract:
 * atomic replace, exclusive publish and O_EXCL create leave either the
 * complete new file or nothing (no temp files, originals untouched, ENOSPC a
 * clean error naming the path); reads refuse what is not a small regular
 * file; rm -rf never follows a symlink. (Path resolution and the safe join
 * are check_pypath's.)
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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
        { "/a", "b", "/a/b" }, { "/a/", "b", "/a/b" },  { "/a//", "/b", "/a/b" },
        { "/", "x", "/x" },    { "a", "b/c", "a/b/c" }, { "", "b", "b" },
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
    char *dir = tu_real_tmpdir();
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
    char *dir = tu_real_tmpdir();
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
    char *dir = tu_real_tmpdir();
    char *missing = fs_join(dir, "no/such/dir/f.json");
    char *target = fs_join(dir, "isdir");
    struct esd_err err;

    ck_assert_int_eq(fs_write_atomic(missing, "x", 1, 0644, &err), -ENOENT);
    ck_assert_ptr_nonnull(strstr(err.msg, "f.json"));
    ck_assert_ptr_nonnull(strstr(err.msg, "No such file or directory"));

    /* rename() over a non-empty directory fails: the temp must go. */
    tu_mkdir_at(dir, "isdir/child");
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
    char *dir = tu_real_tmpdir();
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
    char *dir = tu_real_tmpdir();
    char *path = fs_join(dir, "done.json");
    struct esd_err err;

    tu_symlink_at("nowhere", dir, "done.json");
    ck_assert_int_eq(fs_publish_excl(path, "x", 1, 0644, &err), -EEXIST);
    ck_assert_int_eq(tu_count_entries(dir), 1);

    fs_rm_rf(dir);
    free(path);
    free(dir);
}
END_TEST

START_TEST(test_create_excl)
{
    char *dir = tu_real_tmpdir();
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
    char *dir = tu_real_tmpdir();
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
    dir = tu_real_tmpdir();
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
    char *dir = tu_real_tmpdir();
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
    char *dir = tu_real_tmpdir();
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
    char *dir = tu_real_tmpdir();
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
    tu_symlink_at("a", dir, "alias");
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
    char *dir = tu_real_tmpdir();
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
    char *dir = tu_real_tmpdir();
    char *tree = fs_join(dir, "tree");
    char *outside = fs_join(dir, "outside");
    char *keep = tu_write(dir, "outside/keep", "keep", (size_t)-1);
    char *f;

    f = tu_write(dir, "tree/a/b/c/file", "x", 1);
    free(f);
    f = tu_write(dir, "tree/top", "x", 1);
    free(f);
    tu_mkdir_at(dir, "tree/empty");
    tu_symlink_at(outside, dir, "tree/a/link_dir");
    tu_symlink_at(keep, dir, "tree/a/b/link_file");
    tu_symlink_at("dangling", dir, "tree/dangling");
    ck_assert_int_eq(chmod(keep, 0444), 0);

    ck_assert_int_eq(fs_rm_rf(tree), 0);
    ck_assert(!tu_exists(tree));
    ck_assert(tu_exists(keep));
    ck_assert_int_eq(tu_count_entries(outside), 1);

    /* Missing: fine. A symlink to a directory: only the link goes. */
    ck_assert_int_eq(fs_rm_rf(tree), 0);
    tu_symlink_at(outside, dir, "alias");
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
    tcase_add_test(tc, test_kind);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(fsutil_suite());
}
