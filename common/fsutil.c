/*
 * fsutil: the filesystem primitives the job-directory contract rests on
 * (spec §3, §5.1; ARCHITECTURE.md "On-disk contract"). Metadata reaches its final
 * name only through rename() (atomic replace), link() (exclusive publish) or
 * O_CREAT|O_EXCL (claims), always after an fsync of the data and followed by
 * an fsync of the directory, so a crash leaves the old state or the new one
 * and a failed write leaves nothing behind. What must give the same answer
 * as the Python reference (realpath, the safe join, rglob) is in pypath.c,
 * not here. Every descriptor is opened O_CLOEXEC; nothing here logs.
 */
#include "fsutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

int
fs_write_all(int fd, const void *data, size_t len)
{
    const char *p = data;

    while (len > 0) {
        ssize_t n = write(fd, p, len);

        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (n == 0)
            return -EIO;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

const char *
fs_basename(const char *path)
{
    const char *slash = strrchr(path, '/');

    return slash ? slash + 1 : path;
}

char *
fs_dirname(const char *path)
{
    const char *slash = strrchr(path, '/');
    size_t n;

    if (!slash)
        return xstrdup(".");
    n = (size_t)(slash - path);
    while (n > 0 && path[n - 1] == '/')
        n--;
    if (n == 0)
        return xstrdup("/");
    return xstrndup(path, n);
}

char *
fs_join(const char *a, const char *b)
{
    size_t na = strlen(a);

    if (na == 0)
        return xstrdup(b);
    while (na > 0 && a[na - 1] == '/')
        na--;
    while (*b == '/')
        b++;
    return xasprintf("%.*s/%s", (int)na, a, b);
}

bool
fs_is_inside(const char *dir, const char *path)
{
    size_t n = strlen(dir);

    while (n > 0 && dir[n - 1] == '/')
        n--;
    if (n == 0)
        return path[0] == '/';
    return strncmp(dir, path, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

char *
fs_tmp_path(const char *path)
{
    char hex[33];
    char *dir = fs_dirname(path);
    char *name, *tmp;

    rand_hex32(hex);
    name = xasprintf(".%s.%s.tmp", fs_basename(path), hex);
    tmp = fs_join(dir, name);
    free(name);
    free(dir);
    return tmp;
}

int
fs_fsync_dir(const char *dir, struct esd_err *err)
{
    int fd, r = 0;

    fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return err_sys(err, -errno, "cannot open directory %s", dir);
    /* EINVAL: the filesystem cannot sync directories; there is nothing more to do. */
    if (fsync(fd) < 0 && errno != EINVAL)
        r = err_sys(err, -errno, "cannot fsync directory %s", dir);
    close(fd);
    return r;
}

int
fs_fsync_parent(const char *path, struct esd_err *err)
{
    char *dir = fs_dirname(path);
    int r = fs_fsync_dir(dir, err);

    free(dir);
    return r;
}

/* Writes data to fd and fsyncs it; messages name path. */
static int
write_sync(int fd, const char *path, const void *data, size_t len, struct esd_err *err)
{
    int r = fs_write_all(fd, data, len);

    if (r < 0)
        return err_sys(err, r, "cannot write %s", path);
    if (fsync(fd) < 0)
        return err_sys(err, -errno, "cannot fsync %s", path);
    return 0;
}

/* close() for a descriptor that was written: NFS may report a write error
 * only here. Linux releases the descriptor even on EINTR. */
static int
close_written(int fd, const char *path, struct esd_err *err)
{
    if (close(fd) < 0 && errno != EINTR)
        return err_sys(err, -errno, "cannot write %s", path);
    return 0;
}

/*
 * Creates a fresh temp file next to path holding data, fsynced and closed.
 * On success *ret_tmp is its name (caller frees); on failure nothing is left.
 */
static int
write_temp(const char *path, const void *data, size_t len, mode_t mode, char **ret_tmp,
           struct esd_err *err)
{
    char *tmp = fs_tmp_path(path);
    int fd, r;

    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) {
        r = err_sys(err, -errno, "cannot create temporary file %s", tmp);
        free(tmp);
        return r;
    }
    r = write_sync(fd, path, data, len, err);
    if (r < 0)
        close(fd);
    else
        r = close_written(fd, path, err);
    if (r < 0) {
        unlink(tmp);
        free(tmp);
        return r;
    }
    *ret_tmp = tmp;
    return 0;
}

int
fs_write_atomic(const char *path, const void *data, size_t len, mode_t mode, struct esd_err *err)
{
    char *tmp;
    int r;

    r = write_temp(path, data, len, mode, &tmp, err);
    if (r < 0)
        return r;
    if (rename(tmp, path) < 0) {
        r = err_sys(err, -errno, "cannot rename %s to %s", tmp, path);
        unlink(tmp);
        free(tmp);
        return r;
    }
    free(tmp);
    return fs_fsync_parent(path, err);
}

/*
 * After link(tmp, path) said EEXIST: is path our own publication? A
 * retransmitted NFS LINK reports EEXIST after it succeeded (the server's
 * reply was lost and its duplicate request cache forgot the first call).
 * Decided on the files opened (an open revalidates with the server; a
 * stat may answer from stale cached attributes): the same inode, or,
 * through layers that number inodes per name (FUSE), the very bytes we
 * wrote, which carry the publisher's token.
 */
static bool
published_ours(const char *tmp, const char *path, const void *data, size_t len)
{
    int pfd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    int tfd = open(tmp, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    struct stat sp, st;
    bool ours = false;

    if (pfd >= 0 && tfd >= 0 && fstat(pfd, &sp) == 0 && fstat(tfd, &st) == 0 &&
        S_ISREG(sp.st_mode)) {
        ours = sp.st_dev == st.st_dev && sp.st_ino == st.st_ino;
        if (!ours && (off_t)len == sp.st_size && len <= ((size_t)1 << 20)) {
            char *got = xmalloc(len + 1);
            ssize_t n = pread(pfd, got, len + 1, 0);

            ours = n == (ssize_t)len && memcmp(got, data, len) == 0;
            free(got);
        }
    }
    if (pfd >= 0)
        close(pfd);
    if (tfd >= 0)
        close(tfd);
    return ours;
}

int
fs_publish_excl(const char *path, const void *data, size_t len, mode_t mode, struct esd_err *err)
{
    char *tmp;
    int r;

    r = write_temp(path, data, len, mode, &tmp, err);
    if (r < 0)
        return r;
    if (link(tmp, path) < 0) {
        r = -errno;
        if (r == -EEXIST && published_ours(tmp, path, data, len))
            r = 0;
    }
    unlink(tmp);
    if (r == -EEXIST)
        err_set(err, r, "%s already exists", path);
    else if (r < 0)
        err_sys(err, r, "cannot link %s to %s", tmp, path);
    free(tmp);
    if (r < 0)
        return r;
    return fs_fsync_parent(path, err);
}

int
fs_create_excl(const char *path, const void *data, size_t len, mode_t mode, int *ret_fd,
               struct esd_err *err)
{
    int flags = O_CREAT | O_EXCL | O_CLOEXEC | (ret_fd ? O_RDWR : O_WRONLY);
    int fd, r;

    fd = open(path, flags, mode);
    if (fd < 0) {
        if (errno == EEXIST)
            return err_set(err, -EEXIST, "%s already exists", path);
        return err_sys(err, -errno, "cannot create %s", path);
    }
    r = write_sync(fd, path, data, len, err);
    if (r == 0 && ret_fd) {
        *ret_fd = fd;
        return 0;
    }
    if (r < 0)
        close(fd);
    else
        r = close_written(fd, path, err);
    /* The file is ours (O_EXCL): do not leave a partial one behind. */
    if (r < 0)
        unlink(path);
    return r;
}

/* fs_open_job_at, following a symbolic link when follow is true; path
 * names the file in messages. */
static int
open_regular(int dirfd, const char *rel, const char *path, int flags, mode_t mode, size_t max,
             bool follow, struct stat *ret_st, struct esd_err *err)
{
    struct stat st;
    int fd, r;

    /* O_NONBLOCK: a FIFO (or a device) is refused below instead of waited
     * on at open; O_NOFOLLOW: a planted symbolic link is never followed. */
    fd = openat(dirfd, rel, flags | (follow ? 0 : O_NOFOLLOW) | O_NONBLOCK | O_NOCTTY | O_CLOEXEC,
                mode);
    if (fd < 0) {
        if (errno == ELOOP && !follow)
            return err_set(err, -ELOOP, "%s is a symbolic link; not following it", path);
        if (errno == ENXIO)
            return err_set(err, -EINVAL, "%s is not a regular file", path);
        return err_sys(err, -errno, "cannot open %s", path);
    }
    if (fstat(fd, &st) < 0) {
        r = err_sys(err, -errno, "cannot stat %s", path);
        close(fd);
        return r;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return err_set(err, -EINVAL, "%s is not a regular file", path);
    }
    if (max && (uintmax_t)st.st_size > max) {
        close(fd);
        return err_set(err, -EFBIG, "%s is larger than %zu bytes", path, max);
    }
    if (ret_st)
        *ret_st = st;
    return fd;
}

int
fs_open_job(const char *path, int flags, mode_t mode, size_t max, struct stat *ret_st,
            struct esd_err *err)
{
    return open_regular(AT_FDCWD, path, path, flags, mode, max, false, ret_st, err);
}

int
fs_open_file(const char *path, int flags, size_t max, struct stat *ret_st, struct esd_err *err)
{
    return open_regular(AT_FDCWD, path, path, flags, 0, max, true, ret_st, err);
}

int
fs_open_job_at(int dirfd, const char *rel, const char *shown, int flags, mode_t mode, size_t max,
               struct stat *ret_st, struct esd_err *err)
{
    return open_regular(dirfd, rel, shown ? shown : rel, flags, mode, max, false, ret_st, err);
}

int
fs_mkdir_beneath(int dirfd, const char *rel, mode_t mode, const char *shown, struct esd_err *err)
{
    char *copy = xstrdup(rel), *part, *save = NULL;
    int fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC), next;

    if (!shown)
        shown = rel;
    if (fd < 0) {
        free(copy);
        return err_sys(err, -errno, "cannot open directory %s", shown);
    }
    for (part = strtok_r(copy, "/", &save); part; part = strtok_r(NULL, "/", &save)) {
        if (!strcmp(part, "."))
            continue;
        if (!strcmp(part, "..")) {
            close(fd);
            free(copy);
            return err_set(err, -EXDEV, "%s leaves its directory", shown);
        }
        if (mkdirat(fd, part, mode) < 0 && errno != EEXIST) {
            int e = errno;

            close(fd);
            free(copy);
            return err_sys(err, -e, "cannot create directory %s", shown);
        }
        next = openat(fd, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        close(fd);
        if (next < 0) {
            int e = errno == ENOTDIR ? ELOOP : errno;

            free(copy);
            if (e == ELOOP)
                return err_set(err, -ELOOP,
                               "%s is, or passes through, a symbolic link or a "
                               "file; not following it",
                               shown);
            return err_sys(err, -e, "cannot open directory %s", shown);
        }
        fd = next;
    }
    free(copy);
    return fd;
}

int
fs_open_dir_beneath(int dirfd, const char *rel, const char *shown, struct esd_err *err)
{
    struct open_how how = {
        .flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC,
        .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
    };
    char *copy, *part, *save = NULL;
    int fd, next;

    if (!shown)
        shown = rel;
    fd = (int)syscall(SYS_openat2, dirfd, *rel ? rel : ".", &how, sizeof(how));
    if (fd >= 0)
        return fd;
    if (errno != ENOSYS) {
        if (errno == ELOOP || errno == EXDEV)
            return err_set(err, -ELOOP,
                           "%s is, or passes through, a symbolic link or leaves "
                           "its directory; not following it",
                           shown);
        return err_sys(err, -errno, "cannot open directory %s", shown);
    }
    /* (a kernel before 5.6) one component at a time, none followed */
    if ((fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
        return err_sys(err, -errno, "cannot open directory %s", shown);
    copy = xstrdup(rel);
    for (part = strtok_r(copy, "/", &save); part; part = strtok_r(NULL, "/", &save)) {
        if (!strcmp(part, "."))
            continue;
        next = !strcmp(part, "..")
                   ? (errno = EXDEV, -1)
                   : openat(fd, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        close(fd);
        if (next < 0) {
            int e = errno == ENOTDIR ? ELOOP : errno;

            free(copy);
            if (e == ELOOP || e == EXDEV)
                return err_set(err, -ELOOP,
                               "%s is, or passes through, a symbolic link or leaves "
                               "its directory; not following it",
                               shown);
            return err_sys(err, -e, "cannot open directory %s", shown);
        }
        fd = next;
    }
    free(copy);
    return fd;
}

/* Reads what is left of fd (a regular file of st_size bytes), at most max. */
static int
read_fd(int fd, const char *path, off_t size, size_t max, char **ret, size_t *ret_len,
        struct esd_err *err)
{
    size_t len = 0, cap;
    char *data;
    int r = 0;

    /* One spare byte past st_size sees EOF (or growth) without a realloc. */
    cap = (size_t)size + 2;
    data = xmalloc(cap);
    for (;;) {
        ssize_t n;

        if (len + 1 >= cap) {
            cap *= 2;
            data = xrealloc(data, cap);
        }
        n = read(fd, data + len, cap - 1 - len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            r = err_sys(err, -errno, "cannot read %s", path);
            break;
        }
        if (n == 0)
            break;
        len += (size_t)n;
        if (len > max) {
            r = err_set(err, -EFBIG, "%s is larger than %zu bytes", path, max);
            break;
        }
    }
    if (r < 0) {
        free(data);
        return r;
    }
    data[len] = '\0';
    *ret = data;
    if (ret_len)
        *ret_len = len;
    return 0;
}

/* Reads a whole regular file, following a link or not. */
static int
read_regular(const char *path, size_t max, bool follow, char **ret, size_t *ret_len,
             struct esd_err *err)
{
    struct stat st;
    int fd = open_regular(AT_FDCWD, path, path, O_RDONLY, 0, max, follow, &st, err), r;

    if (fd < 0)
        return fd;
    r = read_fd(fd, path, st.st_size, max, ret, ret_len, err);
    close(fd);
    return r;
}

int
fs_read_job(const char *path, size_t max, char **ret, size_t *ret_len, struct esd_err *err)
{
    return read_regular(path, max, false, ret, ret_len, err);
}

int
fs_read_job_at(int dirfd, const char *rel, const char *shown, size_t max, char **ret,
               size_t *ret_len, struct esd_err *err)
{
    struct stat st;
    int fd = fs_open_job_at(dirfd, rel, shown, O_RDONLY, 0, max, &st, err), r;

    if (fd < 0)
        return fd;
    r = read_fd(fd, shown ? shown : rel, st.st_size, max, ret, ret_len, err);
    close(fd);
    return r;
}

int
fs_read_file(const char *path, size_t max, char **ret, size_t *ret_len, struct esd_err *err)
{
    return read_regular(path, max, true, ret, ret_len, err);
}

/* mkdir of one level; an existing directory (or symlink to one) is fine. */
static int
mkdir_one(const char *path, mode_t mode, struct esd_err *err)
{
    struct stat st;
    int r;

    if (mkdir(path, mode) == 0)
        return 0;
    r = -errno;
    if (stat(path, &st) == 0) {
        if (S_ISDIR(st.st_mode))
            return 0;
        if (r == -EEXIST)
            return err_set(err, -ENOTDIR,
                           "cannot create directory %s: it exists and is not "
                           "a directory",
                           path);
    }
    return err_sys(err, r, "cannot create directory %s", path);
}

int
fs_mkdir_p(const char *path, mode_t mode, struct esd_err *err)
{
    char *p, *s;
    int r = 0;

    if (!*path)
        return err_sys(err, -ENOENT, "cannot create directory \"\"");
    p = xstrdup(path);
    for (s = p + 1;; s++) {
        char c = *s;

        if (c != '/' && c != '\0')
            continue;
        if (s[-1] != '/') {
            *s = '\0';
            r = mkdir_one(p, mode, err);
            *s = c;
            if (r < 0)
                break;
        }
        if (c == '\0')
            break;
    }
    free(p);
    return r;
}

static int rm_at(int dirfd, const char *name);

/* Removes everything inside the directory open on fd, then closes fd. */
static int
rm_contents(int fd)
{
    struct strv names;
    struct dirent *e;
    DIR *d;
    int r = 0;

    d = fdopendir(fd);
    if (!d) {
        r = -errno;
        close(fd);
        return r;
    }
    /* Names are collected before anything is removed: removing entries
     * while reading a directory can make readdir skip some on NFS. */
    strv_init(&names);
    for (;;) {
        errno = 0;
        e = readdir(d);
        if (!e) {
            if (errno)
                r = -errno;
            break;
        }
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0)
            strv_push(&names, e->d_name);
    }
    for (size_t i = 0; i < names.n; i++) {
        int q = rm_at(dirfd(d), names.v[i]);

        if (q < 0 && r == 0)
            r = q;
    }
    strv_free(&names);
    closedir(d);
    return r;
}

/* Removes name (relative to dirfd) and, if it is a real directory, all
 * below it. A symlink is removed itself, never followed. */
static int
rm_at(int dirfd, const char *name)
{
    int fd, r;

    if (unlinkat(dirfd, name, 0) == 0 || errno == ENOENT)
        return 0;
    /* Linux says EISDIR for a directory, POSIX EPERM. */
    if (errno != EISDIR && errno != EPERM)
        return -errno;
    r = -errno;
    fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT)
            return 0;
        return errno == ENOTDIR || errno == ELOOP ? r : -errno;
    }
    r = rm_contents(fd);
    if (unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT && r == 0)
        r = -errno;
    return r;
}

int
fs_rm_rf(const char *path)
{
    return rm_at(AT_FDCWD, path);
}

int
fs_touch_fd(int fd)
{
    return syscall(SYS_utimensat, fd, NULL, NULL, 0) < 0 ? -errno : 0;
}

char *
fs_which(const char *cmd, const char *path, int mode)
{
    if (!cmd || !*cmd)
        return NULL;
    if (strchr(cmd, '/'))
        return access(cmd, mode) == 0 ? xstrdup(cmd) : NULL;
    while (path && *path) {
        size_t n = strcspn(path, ":");
        char *p = xasprintf("%.*s/%s", (int)n, n ? path : ".", cmd);

        if (access(p, mode) == 0)
            return p;
        free(p);
        path += n;
        if (*path == ':')
            path++;
    }
    return NULL;
}

/* statfs(2) f_type values (linux/magic.h and the file systems' own). */
static const struct {
    unsigned long type;
    const char *name;
    bool local;
} fs_types[] = {
    { 0x6969, "nfs", false },          { 0xFF534D42, "cifs", false },
    { 0xFE534D42, "smb2", false },     { 0x517B, "smb", false },
    { 0x0BD00BD0, "lustre", false },   { 0x47504653, "gpfs", false },
    { 0x00C36400, "ceph", false },     { 0x19830326, "beegfs", false },
    { 0x65735546, "fuse", false },     { 0x6B414653, "afs", false },
    { 0x5346414F, "openafs", false },  { 0x013111A8, "ibrix", false },
    { 0xAAD7AAEA, "panfs", false },    { 0x7461636F, "ocfs2", false },
    { 0x01161970, "gfs2", false },     { 0xEF53, "ext2/3/4", true },
    { 0x58465342, "xfs", true },       { 0x9123683E, "btrfs", true },
    { 0x01021994, "tmpfs", true },     { 0x858458F6, "ramfs", true },
    { 0x794C7630, "overlayfs", true }, { 0x2FC12FC1, "zfs", true },
    { 0xF2F52010, "f2fs", true },      { 0x3153464A, "jfs", true },
    { 0x52654973, "reiserfs", true },  { 0x4D44, "vfat", true },
    { 0x2011BAB0, "exfat", true },     { 0x5346544E, "ntfs", true },
};

int
fs_kind(const char *path, const char **ret_name, bool *ret_local, bool *ret_rdonly, char **ret_at,
        struct esd_err *err)
{
    static __thread char hex[24];
    char *at = xstrdup(path);
    struct statfs sf;
    struct statvfs sv;

    /* (the nearest existing parent: what a directory made there is on) */
    while (statfs(at, &sf) < 0) {
        char *up;

        if ((errno != ENOENT && errno != ENOTDIR) || !strcmp(at, "/") || !strcmp(at, ".")) {
            int r = err_sys(err, -errno, "cannot find the file system of %s", path);

            free(at);
            return r;
        }
        up = fs_dirname(at);
        free(at);
        at = up;
    }
    *ret_rdonly = statvfs(at, &sv) == 0 && (sv.f_flag & ST_RDONLY);
    *ret_local = false;
    snprintf(hex, sizeof(hex), "0x%lx", (unsigned long)sf.f_type);
    *ret_name = hex;
    for (size_t i = 0; i < sizeof(fs_types) / sizeof(fs_types[0]); i++)
        if ((unsigned long)sf.f_type == fs_types[i].type) {
            *ret_name = fs_types[i].name;
            *ret_local = fs_types[i].local;
        }
    if (ret_at)
        *ret_at = at;
    else
        free(at);
    return 0;
}
