/*
 * pypath: the path operations that must give, byte for byte, what the
 * Python reference gives (CPython 3.11 posixpath and pathlib), because the
 * reference decides with them what a job directory holds and what is
 * inside it: normpath, realpath(strict=False), expanduser, the safe join
 * of spec §3 built on realpath, and rglob's walk in code point order.
 * Plain filesystem helpers are in fsutil.h. Nothing here logs.
 */
#ifndef ESD_PYPATH_H
#define ESD_PYPATH_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>

#include "util.h"

/*
 * posixpath.normpath(path): repeated slashes and "." dropped, ".." pops
 * the component before it; at the root it is dropped, at the start of a
 * relative path (or after another leading "..") it is kept. Exactly two
 * leading slashes stay two (POSIX leaves "//" implementation-defined);
 * one, or three and more, become one. "" and a path that normalises to
 * nothing give ".". Purely textual. Caller frees.
 */
char *pypath_normpath(const char *path);

/*
 * os.path.realpath(path, strict=False): a relative path is taken against
 * the working directory; symlinks are resolved component by component,
 * "." dropped, ".." applied to the resolved prefix, non-existent tails
 * kept as text. A symlink loop keeps the remaining path unresolved as
 * CPython does. The result is normpath'ed. Caller frees *ret; -ELOOP for
 * a chain of more than 256 distinct links.
 */
int pypath_realpath(const char *path, char **ret, struct esd_err *err);

/*
 * A path from the command line, as Path(path).expanduser().resolve():
 * "~" and "~user" expanded (posixpath.expanduser: $HOME, else the password
 * database; an unknown user leaves the path as it is), then
 * pypath_realpath. Caller frees *ret.
 */
int pypath_resolve_cli(const char *path, char **ret, struct esd_err *err);

/*
 * Safe join (spec §3): joins the POSIX relative path rel onto the resolved
 * job directory root, resolves it with pypath_realpath and refuses, with
 * "Manifest path escapes job directory: <rel>", any result that is not
 * root itself or below it. Absolute rel is refused the same way.
 */
int pypath_join_inside(const char *root, const char *rel, char **ret, struct esd_err *err);

/* A regular file found by pypath_rglob (all owned). */
struct pypath_entry {
    char *path;     /* dir joined with rel */
    char *rel;      /* POSIX path relative to dir */
    struct stat st; /* of the file (a symlink followed) */
};

struct pypath_entries {
    struct pypath_entry *v;
    size_t n, cap;
};

/*
 * Every regular file below dir whose own name want() accepts, sorted by
 * relative path in code point order (strcmp of the UTF-8 bytes), with
 * Python 3.11 rglob() semantics: hidden names are walked, symlinks to
 * files are followed, symlinked directories are not descended, dangling
 * links and anything but regular files are left out. An unreadable
 * directory is an error naming it. The caller frees *ret with
 * pypath_entries_free (also on error).
 */
int pypath_rglob(const char *dir, bool (*want)(const char *name), struct pypath_entries *ret,
                 struct esd_err *err);
void pypath_entries_free(struct pypath_entries *e);

#endif
