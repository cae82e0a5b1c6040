/*
 * warm: the warm processor of each job (data_juicer.warm). A Python process
 * of the job owner's, `<python> esd-dj --warm` with the attempts'
 * environment and working directory, that has imported Data-Juicer and
 * Ray once and forks one child per attempt (daemon/esd-dj.py says how, and
 * what the child is). It is started at a job's first attempt, replaced
 * when it dies (with backoff; after WARM_MAX_FAILURES failures in a row
 * the job's attempts are exec'd for WARM_DISABLE_SECS), and stopped when
 * its job goes, its settings change, or it has not been asked for
 * anything for WARM_IDLE_SECS.
 */
#ifndef ESD_WARM_H
#define ESD_WARM_H

#include <stdbool.h>
#include <sys/types.h>

#include <ev.h>

#include "config.h"
#include "jobs.h"
#include "spawn.h"

#define WARM_IDLE_SECS 120.0
#define WARM_READY_SECS 120.0 /* from its start to its first word */
#define WARM_REPLY_SECS 30.0  /* from a request to its answer */
#define WARM_MAX_FAILURES 3
#define WARM_DISABLE_SECS 600.0

/* An attempt to fork: argv after the interpreter and esd-dj, the
 * environment and working directory (those of attempt_prepare), who runs
 * it, the keeper's grace, and the three descriptors the fork gets (the
 * output pipe's and the report pipe's write ends, the go pipe's read
 * end; warm_request sends copies, the caller closes its own). */
struct warm_req {
    char *const *argv;
    char *const *envp;
    const char *cwd;
    const char *python, *runner;
    const struct spawn_cred *cred; /* NULL: esd's own identity */
    double grace;
    int out_w, rep_w, go_r;
    /* -1, or the read end of a pipe on which the attempt waits, once
     * Data-Juicer's configuration is read and its Ray executor made, for
     * one byte before it runs (claim-ahead: the next shard of a slot is
     * ready when the current one ends); end of file: it exits */
    int gate_r;
};

/* The answer: pid > 0 is the fork (the attempt's keeper, a process of
 * the attempt's user whose parent is the warm processor), or 0 with why
 * it did not happen. */
typedef void (*warm_done_fn)(void *arg, pid_t pid, const char *why);

void warm_init(struct ev_loop *loop, const struct esd_conf *c);
/* Stops every warm processor (the next attempts start new ones). */
void warm_reconfigure(const struct esd_conf *c);
void warm_fini(void);

/*
 * Asks job j's warm processor to fork an attempt; done(arg, ...) is called
 * later from the loop, exactly once unless warm_cancel(arg) comes first.
 * Returns 0 (asked, or queued until the warm processor is ready), or
 * -EAGAIN when none can serve the job now (disabled, or broken lately):
 * the caller execs the attempt itself.
 */
int warm_request(struct job *j, const struct warm_req *rq, warm_done_fn done, void *arg);
/* Called when a warm processor has become ready. */
void warm_set_ready_cb(void (*ready)(void));

/* Whether job j's warm processor is ready now. */
bool warm_ready(const struct job *j);

/* Forgets a request of arg's (its answer will not be delivered). */
void warm_cancel(void *arg);
/* Stops job j's warm processor (the job is going). */
void warm_forget_job(const struct job *j);

#endif
