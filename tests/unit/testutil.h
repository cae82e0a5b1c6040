/*
 * testutil: helpers shared by the check suites: private temp directories,
 * writing and reading fixture files, and running a suite in fork mode.
 */
#ifndef ESD_TESTUTIL_H
#define ESD_TESTUTIL_H

#include <check.h>
#include <stdbool.h>
#include <stddef.h>

#include <ev.h>

/* Creates a fresh directory under $TMPDIR (or /tmp); caller frees; it is
 * the test's to remove (fs_rm_rf). */
char *tu_tmpdir(void);
/* tu_tmpdir with every symbolic link in its name resolved (realpath(3)),
 * for tests that compare resolved paths. Caller frees. */
char *tu_real_tmpdir(void);
/* symlink(target, dir/rel) and mkdir -p dir/rel (0755); a failure fails the
 * test. */
void tu_symlink_at(const char *target, const char *dir, const char *rel);
void tu_mkdir_at(const char *dir, const char *rel);
/* Writes len bytes (or strlen when len == (size_t)-1) to dir/rel, creating
 * parent directories. Returns the full path (caller frees). */
char *tu_write(const char *dir, const char *rel, const char *data, size_t len);
/* Reads a whole file; NULL if it cannot be read. *len may be NULL. */
char *tu_read(const char *path, size_t *len);
/* True if path exists (lstat). */
int tu_exists(const char *path);
/* Number of directory entries other than . and .. (-1 if unreadable). */
int tu_count_entries(const char *dir);
/* Path to a fixture under tests/data ($ESD_TEST_DATA). Caller frees. */
char *tu_data(const char *rel);
struct manifest;
/*
 * The job the engine suites share, prepared in dir/job: 5 records in
 * dir/data/a.jsonl (2) and dir/data/sub/b.jsonl (3), split into 3 shards of
 * 2, 2 and 1 rows. Loads its manifest into *ret (manifest_free).
 */
void tu_job(const char *dir, struct manifest *ret);
/* Sets path's atime and mtime age seconds into the past (negative: into the
 * future), so that tests age locks without waiting. */
void tu_set_age(const char *path, double age);
/* Publishes state/done/<id>.json for shard i of m as a worker would (its
 * own rows and sha256, output_path under attempts/). */
void tu_put_done(const struct manifest *m, size_t i);
/* Runs loop until done(arg) holds or secs have passed (an ev_timer bounds
 * the wait: nothing sleeps, the loop keeps serving); returns done(arg), or
 * true once secs have passed when done is NULL. */
bool tu_run_until(struct ev_loop *loop, bool (*done)(void *), void *arg, double secs);
/* Runs suite s in fork mode and returns the exit status for main(). */
int tu_run(Suite *s);

#endif
