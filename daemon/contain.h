/*
 * contain: what esd adds to each attempt's keeper (spawn_keep) so that
 * nothing an attempt started outlives it. esd is the child subreaper of
 * everything it starts: a process orphaned below it (its keeper killed,
 * say) is handed to esd, not to init, and reaped there (libev's SIGCHLD
 * handler reaps every child with waitpid(-1), known to a watcher or not);
 * at its stop esd kills whatever was handed to it. When systemd delegated
 * a cgroup v2 subtree to esd (Delegate=yes, cgroup writable), esd moves
 * itself into the leaf "esd" of it and runs each attempt in a cgroup of its
 * own beside it, "attempt-<name>", which it kills exactly (cgroup.kill, or
 * every pid of cgroup.procs) and removes when the attempt ends.
 */
#ifndef ESD_CONTAIN_H
#define ESD_CONTAIN_H

#include <stdbool.h>
#include <sys/types.h>

#include <ev.h>

/* Makes esd a child subreaper and looks for a delegated cgroup (logged
 * once either way). Never fails: without a cgroup the keepers do it all. */
void contain_init(struct ev_loop *loop);

/* Kills every process handed to esd (its parent) that is still there, and
 * what is left in attempt cgroups; removes them. For the end of main. */
void contain_fini(void);

/* Whether attempts get cgroups of their own. */
bool contain_has_cgroups(void);

/*
 * Makes the cgroup of an attempt named name (letters, digits, '-', '_', '.')
 * and returns its directory (the caller frees it with contain_end), or NULL
 * without delegated cgroups or when it cannot be made (logged; the attempt
 * runs on with its keeper only).
 */
char *contain_begin(const char *name);

/* Moves process pid into the cgroup dir (from contain_begin): for an
 * attempt that the warm processor forked. 0 or a negative errno. */
int contain_move(const char *dir, pid_t pid);

/* Kills what is left in the cgroup dir (from contain_begin; NULL: none)
 * and removes it (later, from a timer, while dying processes still hold
 * it); frees dir. */
void contain_end(char *dir);

#endif
