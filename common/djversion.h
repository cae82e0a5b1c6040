/*
 * djversion: which Data-Juicer a processor command runs, recorded in the
 * manifest as data_juicer.commit and checked before a node works a job
 * (spec §8.1): the git commit of a checkout when one is configured (read
 * from its .git directly, so that a checkout owned by another user, which
 * git refuses as "dubious ownership", still reads; with its dirty flag when
 * git may say), otherwise the installed py-data-juicer package's version,
 * asked of the interpreter the processor runs on (the processor itself when
 * it is a Python interpreter, else the "#!" line of a script such as
 * dj-process). What cannot be determined is "unknown", with the reason.
 *
 * What "unknown" means. A job whose data_juicer.commit is "unknown" (or
 * absent) pins no version: every node may work it, whatever it runs. A job
 * that pins a version is worked only by a node that reads the same one: a
 * node whose version cannot be read is refused like one that runs another
 * (both unless the node allows a mismatch explicitly).
 */
#ifndef ESD_DJVERSION_H
#define ESD_DJVERSION_H

#include "attempt.h"
#include "util.h"

/* What a node found out about its Data-Juicer (all owned; djversion_free). */
struct djversion {
    char *version; /* a commit, a package version or "unknown" */
    int dirty;     /* a checkout's: 1 or 0; -1 for a package or when git cannot say */
    char *source;  /* how version was read ("git HEAD of the checkout /x", "py-data-juicer
                      of /usr/bin/python3"); NULL when unknown */
    char *why;     /* why the version is unknown, or why a checkout gave no commit and
                      the package version was taken instead; NULL otherwise */
    char *python;  /* the interpreter Data-Juicer's process_data runs on when the
                      processor is Data-Juicer's own (the default dj-process, a
                      configured command that is one dj-process, a checkout's
                      data_juicer.python); NULL for any other processor */
};

/*
 * Detects the version for the processor configuration o (NULL: the
 * default dj-process) into *ret (djversion_free). Reads a checkout's .git
 * files itself (then `git -c safe.directory=<root> rev-parse HEAD` for what
 * it cannot read, e.g. a reftable repository); `git status` for the dirty
 * flag runs without that override, so a foreign checkout's configuration
 * never runs. Runs git or python for at most 10 s each: not for an event
 * loop.
 */
void djversion_read(const struct attempt_opts *o, struct djversion *ret);
void djversion_free(struct djversion *v);

/*
 * The operator names registered in the Data-Juicer that python imports
 * (data_juicer.ops.OPERATORS), run in cwd (may be NULL), into *ret (sorted;
 * caller frees with strv_free). Importing every operator module takes
 * seconds: at most 120 s. 0, or a negative errno with *ret_why (caller
 * frees) saying why the registry could not be read; python NULL: the
 * processor is not Data-Juicer's own (djversion.python).
 */
int djversion_registry(const char *python, const char *cwd, struct strv *ret, char **ret_why);

/* djversion_read keeping only the version (caller frees) and dirty flag. */
void djversion_detect(const struct attempt_opts *o, char **ret_version, int *ret_dirty);

/*
 * The check before a node works a job whose manifest records job_version:
 * 0 if the job pins no version ("unknown" or NULL) or ours is the same;
 * otherwise -EPROTO with err saying what was detected and why it does not
 * match: "Data-Juicer version mismatch: job=A, worker=B (...)" or "Data-
 * Juicer version cannot be read on this node: <why>; the job was prepared
 * with A".
 */
int djversion_judge(const char *job_version, const struct djversion *ours, struct esd_err *err);

/* djversion_judge when only our version string is known (NULL or
 * "unknown": cannot be read). */
int djversion_check(const char *job_version, const char *ours, struct esd_err *err);

#endif
