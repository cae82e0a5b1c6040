/*
 * helper: esd's helper children, the processes it forks without exec to do
 * work that must not run in its event loop or with its identity: a shard's
 * finishing (validation and publication), a job's merge, a job's loading
 * (its manifest and recipe), a control operation, esd run's prepare. They
 * all start through helper_fork, the one audited set-up (what esd execs,
 * a processor or a Ray head, starts through common/spawn.c instead):
 *
 *   - a process group of its own;
 *   - every descriptor closed but 0-2 (stdin and stdout on /dev/null) and
 *     its report pipe: no control socket, client, lock or journal stream
 *     of esd's;
 *   - every signal back to its default disposition and unblocked (SIGPIPE
 *     ignored, so that a report to a gone parent fails with EPIPE);
 *   - the identity it is given, for good (supplementary groups, primary
 *     group, uid; setuid(0) must fail afterwards), then PR_SET_PDEATHSIG
 *     SIGKILL and a check that esd is still its parent: no helper outlives
 *     a killed esd;
 *   - a liveness tick: every HELPER_TICK_SECS its SIGALRM handler writes
 *     one "\n" on the report pipe, which readers skip.
 *
 * In esd's event loop a helper_guard watches each helper (esd run's
 * prepare runs before the loop, in a wait of its own): a helper that sends
 * nothing, not even its tick, for HELPER_SILENCE_SECS (stopped with
 * SIGSTOP, stuck in the kernel) or that runs past its time limit is killed
 * with SIGKILL (its whole group), and its end is then handled as any other
 * failure.
 */
#ifndef ESD_HELPER_H
#define ESD_HELPER_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include <ev.h>

#include "log.h"
#include "util.h"

#define HELPER_TICK_SECS 5
#define HELPER_SILENCE_SECS 30.0

/* Who a helper runs as: change false keeps esd's own identity. */
struct helper_id {
    bool change;
    uid_t uid;
    gid_t gid;
    const gid_t *groups;
    size_t ngroups;
};

/*
 * Forks a helper for what ("merge", "finishing", ...). In esd it returns
 * the child's pid with *ret_fd the read end of its report pipe (O_CLOEXEC,
 * O_NONBLOCK); in the child, after the set-up above, it returns 0 with
 * *ret_fd the write end. A negative errno (err set) when the pipe or the
 * fork failed. A child that cannot take its identity (or set itself up)
 * exits at once with HELPER_EXIT_SETUP, having reported nothing.
 */
#define HELPER_EXIT_SETUP 126
pid_t helper_fork(const char *what, const struct helper_id *who, int *ret_fd, struct esd_err *err);

/* In a helper: writes the report bytes whole, with the tick held off so
 * that its newline cannot land inside them. 0 or a negative errno. */
int helper_write(int fd, const void *data, size_t len);

/* A helper's wait status in words: "exit code N", "killed by signal N
 * (NAME)", or "could not take its identity" for HELPER_EXIT_SETUP. */
void helper_describe(int status, char out[96]);

/* In esd: the watch over one helper. */
struct helper_guard {
    pid_t pid;
    const char *what;
    struct log_ctx ctx;
    double limit; /* seconds; 0: none */
    ev_timer silence_w;
    ev_timer limit_w;
    bool fired; /* the guard killed it */
};

/* Starts watching pid (limit seconds in all, 0 for no limit). */
void helper_guard_start(struct helper_guard *g, struct ev_loop *loop, pid_t pid, const char *what,
                        const struct log_ctx *ctx, double limit);
/* The helper sent something: it is alive. */
void helper_guard_fed(struct helper_guard *g, struct ev_loop *loop);
/* While paused (its reader is held back, so it cannot be heard) a helper
 * is not killed for its silence; its time limit still runs. */
void helper_guard_pause(struct helper_guard *g, struct ev_loop *loop, bool pause);
/* The helper ended (or is abandoned): stop watching. */
void helper_guard_stop(struct helper_guard *g, struct ev_loop *loop);

/* For tests: the silence after which a helper is killed (seconds). */
void helper_test_set_silence(double secs);

#endif
