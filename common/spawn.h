/*
 * spawn: starting an attempt's child the way every caller needs it: fork
 * and exec at once, a process group of its own (so the whole tree can be
 * killed), stdout and stderr into one pipe, every other descriptor closed
 * (close_range above 2, whether or not the parent marked it O_CLOEXEC),
 * every signal back to its default disposition and unblocked (an ignored
 * signal would survive the exec), a failed exec reported as an error
 * rather than as an exit status the processor might also use, and SIGKILL
 * to the child when its parent dies (PR_SET_PDEATHSIG): a crashed daemon or
 * worker leaves no attempt running on under a lease nobody renews. (The
 * rest of the child's process group is the child's to end; spawn_keep
 * puts a keeper above the child that ends all of it.) A daemon
 * running as root starts it with a user's credentials from the user
 * database (struct spawn_cred).
 */
#ifndef ESD_SPAWN_H
#define ESD_SPAWN_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "util.h"

struct spawned {
    pid_t pid;     /* also the process group id; spawn_keep: the keeper's */
    int out_fd;    /* read end of the child's stdout+stderr (O_CLOEXEC, blocking) */
    pid_t proc;    /* the program itself: pid, or (spawn_keep) the keeper's child */
    int report_fd; /* spawn_keep: the keeper's report (O_CLOEXEC, O_NONBLOCK); else -1 */
};

/*
 * Starts argv[0] (looked up in PATH unless it contains '/') with envp in
 * cwd, in a new process group. Returns 0 with *ret filled, or a negative
 * errno with err naming the program when the fork or the exec failed (the
 * child is reaped in that case).
 */
int spawn_start(char *const *argv, char *const *envp, const char *cwd, struct spawned *ret,
                struct esd_err *err);

/* A user as the user database has it: who a child runs as, and what its
 * login environment says (HOME, USER, SHELL). */
struct spawn_cred {
    uid_t uid;
    gid_t gid;     /* the primary group, pw_gid */
    gid_t *groups; /* the supplementary groups (getgrouplist, gid among them) */
    size_t ngroups;
    char *name;  /* pw_name */
    char *home;  /* pw_dir */
    char *shell; /* pw_shell; "/bin/sh" when empty */
};

/*
 * Fills *ret with uid's passwd entry and group list (getpwuid_r,
 * getgrouplist). Returns 0, -ENOENT when the user database has no entry
 * for uid (err says so: nothing is started for a user nobody knows), or
 * another negative errno. The caller frees *ret with spawn_cred_free.
 */
int spawn_cred_for_uid(uid_t uid, struct spawn_cred *ret, struct esd_err *err);

/* Frees what spawn_cred_for_uid filled in; accepts a zeroed struct. */
void spawn_cred_free(struct spawn_cred *c);

/* An environment entry "NAME=value" that one of allow's patterns names
 * (NAME, PREFIX* for every name it begins, * for all). */
bool spawn_env_allowed(const struct strv *allow, const char *entry);

/*
 * Appends to out (a strv of "NAME=value") the environment of a child run
 * for cred: the entries of this process's environment that allow names,
 * but none that skip (NULL: none) refuses and none of the five set here,
 * then HOME, USER, LOGNAME and SHELL of cred and this process's PATH
 * (SPAWN_DEFAULT_PATH when it has none). Nothing else: a daemon's
 * environment is its operator's, not a job owner's to read.
 */
#define SPAWN_DEFAULT_PATH "/usr/local/bin:/usr/bin:/bin"
void spawn_env_base(const struct strv *allow, const struct spawn_cred *cred,
                    bool (*skip)(const char *entry), struct strv *out);

/*
 * spawn_start with cred's identity (supplementary groups, then primary
 * group, then uid, for good: the child cannot become root again), for a
 * daemon running as root that starts work as a job's owner. The caller
 * keeps cred. Refuses uid 0 (-EPERM).
 */
int spawn_start_as(char *const *argv, char *const *envp, const char *cwd,
                   const struct spawn_cred *cred, struct spawned *ret, struct esd_err *err);

/* spawn_start_as (cred NULL: as the caller) with in_fd, not /dev/null,
 * as the child's standard input (the caller keeps its own descriptor). */
int spawn_start_with_input(char *const *argv, char *const *envp, const char *cwd,
                           const struct spawn_cred *cred, int in_fd, struct spawned *ret,
                           struct esd_err *err);

/*
 * A kept start, for what must leave nothing behind (an attempt's
 * processor). The caller (single-threaded) forks a keeper: a process of
 * its own, with its identity, that leads the process group, is the child
 * subreaper of everything below it (PR_SET_CHILD_SUBREAPER: whatever
 * leaves the group with setsid, double-forks or is orphaned is handed to
 * it, not to init), and starts argv as spawn_start_as would (as cred,
 * refusing uid 0 with -EPERM; as the caller when cred is NULL) but in the
 * keeper's group. s->pid is the keeper (the process to wait for, and the
 * group: spawn_signal reaches the program and what stayed in its group),
 * s->proc the program. The keeper then:
 *  - when the program exits: reports its wait status, SIGKILLs the rest
 *    of its tree and reaps it, round after round until nothing is left,
 *    and exits 0;
 *  - on SIGTERM from the caller or from root (spawn_signal(s, SIGTERM)
 *    sends it to the whole group; the program's own kill(0, SIGTERM) is
 *    not a stop): also sends SIGTERM to the processes that left the group
 *    and were handed to it, and o->grace seconds later SIGKILLs the tree,
 *    program included, as above;
 *  - when the caller dies (even by SIGKILL: it sees the report pipe's
 *    read end close) kills the tree at once and exits.
 * So when the keeper has exited, nothing of the tree is left, unless the
 * keeper itself was killed with SIGKILL (by root, or by the program when
 * cred is the keeper's own user); its program dies with it (PDEATHSIG),
 * what left the group may not. With o->cgroup (a cgroup v2 directory the
 * caller may write), the keeper moves into it before starting anything,
 * so that the caller can kill what is left there exactly.
 * Returns 0 with *ret filled, or a negative errno with err when the fork,
 * the keeper's set-up or the exec failed (the keeper is reaped then).
 */
struct spawn_keep_opts {
    double grace;       /* seconds from SIGTERM to SIGKILL of the tree */
    const char *cgroup; /* the keeper's cgroup directory, or NULL */
};
int spawn_keep(char *const *argv, char *const *envp, const char *cwd, const struct spawn_cred *cred,
               const struct spawn_keep_opts *o, struct spawned *ret, struct esd_err *err);

/*
 * Once the keeper of s (spawn_keep) has been reaped with wait status
 * keeper_status: the program's wait status in *ret_status, and the report
 * pipe closed. Returns 0, or -ESRCH when the keeper died without saying
 * (*ret_status is then keeper_status, and what left the group may still
 * run).
 */
int spawn_keep_status(struct spawned *s, int keeper_status, int *ret_status);

/*
 * The keeper of a program that was forked elsewhere (esd's warm
 * processor), as a program of its own: argv is {any, SPAWN_KEEPER_ARG,
 * grace in ms, the pid whose SIGTERM is a stop, the program's pid, the
 * report pipe's descriptor}. The caller has made itself the leader of a
 * process group and a child subreaper, forked the program into that group,
 * and exec'd this with every signal blocked. It then reports and watches
 * as spawn_keep's keeper does (REP_STARTED first) and never returns;
 * it returns 2 at once for arguments that are not such a call.
 */
#define SPAWN_KEEPER_ARG "--esd-keeper"
int spawn_keeper_adopted(int argc, char **argv);

/*
 * What a keeper reported so far, read without blocking from s->report_fd
 * (for a keeper that is not the caller's child: its end is the report
 * pipe's end of file). st starts zeroed.
 */
struct spawn_keep_state {
    pid_t proc;  /* the program, once started */
    bool exited; /* its wait status is in status */
    int status;
    int failed; /* an errno: the keeper could not set up or start it */
    bool eof;   /* the keeper is gone: nothing more will come */
};
void spawn_keep_read(struct spawned *s, struct spawn_keep_state *st);

/*
 * Runs argv (PATH lookup as spawn_start) in cwd with the current
 * environment and collects its standard output (at most max bytes;
 * stderr goes to /dev/null), waiting at most timeout seconds before
 * killing its process group. *ret_status gets the wait status. Returns 0,
 * -ETIMEDOUT, or a negative errno when it could not run. Blocks: for
 * start-up and command-line paths only.
 */
int spawn_capture(char *const *argv, const char *cwd, double timeout, size_t max, struct buf *out,
                  int *ret_status, struct esd_err *err);

/* Sends sig to the child's whole process group (ESRCH ignored). */
void spawn_signal(const struct spawned *s, int sig);

/*
 * Describes a wait status as the reference words it: "exit code N" or
 * "killed by signal N (NAME)"; *ret_code gets N, or -N for a signal.
 */
void spawn_describe(int status, char out[64], int *ret_code);

/*
 * In a child forked without exec (a daemon's helper process): closes every
 * socket above descriptor 2, so that it holds none of its parent's
 * (the listening control socket, whose path a restarted daemon must be
 * able to take over; clients; the journal), while the files it may need
 * (a claimer's clock file) stay open.
 */
void spawn_close_sockets(void);

#endif
