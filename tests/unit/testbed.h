/*
 * testbed: the daemon core on a bench, for the suites of sched, runner,
 * jobs and finalize. A private temporary directory holds esd's state
 * directory, its control socket and the job that tu_job prepares; the
 * configuration is the defaults made small (one slot, a 1 s poll, a 3 s
 * lease, no Ray, no spool, no metrics, no warm processor); the processor
 * is a shell script of the test's writing. Everything runs on libev's
 * default loop, the only one that watches children.
 */
#ifndef ESD_TESTBED_H
#define ESD_TESTBED_H

#include <stdbool.h>

#include <ev.h>

#include "config.h"
#include "manifest.h"

struct job;

struct testbed {
    char *tmp;     /* the test's directory (removed by tb_teardown) */
    char *job_dir; /* tmp/job, prepared by tu_job */
    struct ev_loop *loop;
    struct esd_conf conf;
    struct manifest m; /* the job's manifest as prepared */
};

extern struct testbed tb;

/* Fills tb: the directory, the configuration, the loop and the job. The
 * processor copies its input to its output (tb_processor changes it). */
void tb_setup(void);
/* Removes tb's directory and frees what tb_setup made. The modules the
 * test started are the test's to stop first. */
void tb_teardown(void);

/*
 * The processor becomes a /bin/sh script: $in and $out are set to its
 * --dataset_path and --export_path, then body runs ("cp \"$in\" \"$out\"",
 * "exit 1", "exec sleep 30", ...).
 */
void tb_processor(const char *body);

/* Registers tb.job_dir on this node as its owner would (jobs_register);
 * fails the test if it is refused. */
struct job *tb_register(void);

/* Runs the loop until j is loaded (jobs_load); fails the test, with the
 * reason, if it is not within a few seconds. */
void tb_load(struct job *j);

/* Shard i's result as a worker leaves it: its output (its input copied,
 * under attempts/) and its done record (tu_put_done). */
void tb_put_result(size_t i);

/* Runs tb.loop until done(arg) holds or secs have passed (tu_run_until). */
bool tb_run_until(bool (*done)(void *), void *arg, double secs);

/* The lines of a file, or -1 if it cannot be read. */
long tb_count_lines(const char *path);

#endif
