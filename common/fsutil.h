/*
 * fsutil: the filesystem primitives the job-directory contract rests on
 * (spec §3, §5.1; ARCHITECTURE.md "On-disk contract"): atomic replace, exclusive
 * publish, O_EXCL create, directory fsync, opens that follow no link and
 * wait on no FIFO, and plain path string helpers. The Python-compatible
 * path resolution and the safe join are in pypath.h.
 *
 * Temporary files are named ".<final-name>.<uuid32hex>.tmp" in the
 * destination directory, as the reference names them.
 */
#ifndef ESD_FSUTIL_H
#define ESD_FSUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "util.h"

/* Writes all of data to fd, retrying short writes and EINTR. 0 or -errno. */
int fs_write_all(int fd, const void *data, size_t len);

/* Returns "<dir>/.<base>.<uuid32hex>.tmp" for final path `path` (caller frees). */
char *fs_tmp_path(const char *path);

/* fsync()s the directory `dir`. */
int fs_fsync_dir(const char *dir, struct esd_err *err);
/* fsync()s the directory containing `path`. */
int fs_fsync_parent(const char *path, struct esd_err *err);

/*
 * Atomic replace: temp file + write + fsync + rename over path + fsync of the
 * directory. A crash leaves the old content or the new, never a mix.
 */
int fs_write_atomic(const char *path, const void *data, size_t len, mode_t mode,
                    struct esd_err *err);

/*
 * Exclusive publish: temp file + write + fsync + link() to path + unlink
 * temp + fsync of the directory. Returns -EEXIST (message set) if path
 * already exists; nothing is left behind in that case. An EEXIST whose
 * path holds our file (same inode) or our bytes counts as success (a
 * retransmitted NFS LINK): data must be unique to its publisher (carry
 * its token).
 */
int fs_publish_excl(const char *path, const void *data, size_t len, mode_t mode,
                    struct esd_err *err);

/*
 * O_CREAT|O_EXCL create of path with data, fsynced. Returns -EEXIST if it
 * exists. If ret_fd is not NULL the descriptor (O_RDWR, O_CLOEXEC) is
 * returned open; otherwise it is closed.
 */
int fs_create_excl(const char *path, const void *data, size_t len, mode_t mode, int *ret_fd,
                   struct esd_err *err);

/* Reads a whole regular file of at most max bytes. *ret is NUL-terminated.
 * A symbolic link is followed (the configuration, a user's recipe); for a
 * file inside a job directory use fs_read_job. */
int fs_read_file(const char *path, size_t max, char **ret, size_t *ret_len, struct esd_err *err);

/*
 * The one way to open a file of a job directory, which its owner or any
 * peer node may have replaced by a symbolic link, a FIFO, a device or a
 * huge file (ARCHITECTURE.md "Security model"): open(2) with flags (O_RDONLY,
 * O_RDWR, O_WRONLY, O_CREAT...; mode for a create) plus O_NOFOLLOW,
 * O_NONBLOCK, O_NOCTTY and O_CLOEXEC, so that it never follows a link nor
 * waits; then fstat: anything but a regular file is refused (-EINVAL, "is
 * not a regular file"; a symbolic link -ELOOP), and so is one above max
 * bytes (-EFBIG; max 0: no limit). Returns the descriptor (O_NONBLOCK
 * stays set, which a regular file ignores) with *ret_st filled when not
 * NULL, or a negative errno with err naming path.
 */
int fs_open_job(const char *path, int flags, mode_t mode, size_t max, struct stat *ret_st,
                struct esd_err *err);

/* fs_open_job that follows a symbolic link (an input file, a result a
 * record names, opened as someone who may read it): still never waits on
 * a FIFO and refuses anything but a regular file. */
int fs_open_file(const char *path, int flags, size_t max, struct stat *ret_st, struct esd_err *err);

/* fs_read_file for a job file: through fs_open_job (no link followed, no
 * FIFO waited on, at most max bytes). *ret is NUL-terminated. */
int fs_read_job(const char *path, size_t max, char **ret, size_t *ret_len, struct esd_err *err);

/* fs_open_job and fs_read_job of rel relative to the directory descriptor
 * dirfd (a job directory opened once and checked); shown names the file
 * in messages (NULL: rel). */
int fs_open_job_at(int dirfd, const char *rel, const char *shown, int flags, mode_t mode,
                   size_t max, struct stat *ret_st, struct esd_err *err);
int fs_read_job_at(int dirfd, const char *rel, const char *shown, size_t max, char **ret,
                   size_t *ret_len, struct esd_err *err);

/*
 * Opens the directory rel below dirfd ("" or "." for dirfd itself)
 * without following any symbolic link on the way and without leaving
 * dirfd (openat2 RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS; one O_NOFOLLOW
 * component at a time on kernels without it). Returns the descriptor
 * (O_RDONLY | O_DIRECTORY | O_CLOEXEC) or a negative errno (-ELOOP for a
 * link or an escape), err naming shown (NULL: rel).
 */
int fs_open_dir_beneath(int dirfd, const char *rel, const char *shown, struct esd_err *err);

/* fs_open_dir_beneath that creates the missing directories of rel (mode)
 * on the way, one component at a time, following no link; ".." is
 * refused. */
int fs_mkdir_beneath(int dirfd, const char *rel, mode_t mode, const char *shown,
                     struct esd_err *err);

/* mkdir -p with mode; existing directories are fine. */
int fs_mkdir_p(const char *path, mode_t mode, struct esd_err *err);

/* rm -rf without following symlinks. Best effort; returns the first error. */
int fs_rm_rf(const char *path);

/* Joins two path fragments with exactly one '/'. Caller frees. */
char *fs_join(const char *a, const char *b);

/* True if path is inside (or equal to) dir; both must be resolved. */
bool fs_is_inside(const char *dir, const char *path);

/*
 * Sets the modification time of the open file fd to the file system's
 * "now" (utimensat(fd, NULL) as a raw system call: on NFS the server
 * stamps it, and no userland clock shim can substitute another time).
 */
int fs_touch_fd(int fd);

/* An executable as execvp(3) finds it: cmd itself if it holds a '/',
 * else the first entry of the PATH-like list path where access(mode)
 * succeeds. NULL when there is none. Caller frees. */
char *fs_which(const char *cmd, const char *path, int mode);

/*
 * The file system of path or, if path does not exist, of its nearest
 * existing parent (*ret_at: that path, allocated; may be NULL). *ret_name is
 * a static name of its type ("nfs", "ext4", ...; "0x<hex>" for a type not
 * known here), *ret_local whether it is known to be node-local (ext4, xfs,
 * btrfs, tmpfs, ...: not shared between nodes; NFS, CIFS, Lustre, GPFS,
 * CephFS, BeeGFS, FUSE and unknown types are not), *ret_rdonly whether it is
 * mounted read-only for the caller (ST_RDONLY). 0, or a negative errno with
 * err naming path.
 */
int fs_kind(const char *path, const char **ret_name, bool *ret_local, bool *ret_rdonly,
            char **ret_at, struct esd_err *err);

/* The final component of path (pointer into path); "" for "/". */
const char *fs_basename(const char *path);
/* The directory part of path (allocated); "/" for "/x", "." for "x". */
char *fs_dirname(const char *path);

#endif
