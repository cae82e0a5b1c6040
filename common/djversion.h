/*
 * djversion: which Data-Juicer a processor command runs, recorded in the
 * manifest as data_juicer.commit and checked by workers (spec §8.1): the
 * git commit of a checkout when one is configured (with its dirty flag),
 * otherwise the installed py-data-juicer package's version, asked of the
 * interpreter the processor runs on (the "#!" line of dj-process). What
 * cannot be determined is "unknown", which the checks skip.
 */
#ifndef ESD_DJVERSION_H
#define ESD_DJVERSION_H

#include "attempt.h"
#include "util.h"

/*
 * Detects the version for the processor configuration o (NULL: the
 * default dj-process). *ret_version (caller frees) is a commit, a package
 * version or "unknown"; *ret_dirty is 1/0 for a checkout, -1 otherwise.
 * Runs git or python for at most 10 s each: not for an event loop.
 */
void djversion_detect(const struct attempt_opts *o, char **ret_version, int *ret_dirty);

/*
 * The worker's check (spec §8.1): 0 if job_version and ours agree or
 * either is "unknown"; otherwise -EPROTO with "Data-Juicer version
 * mismatch: job=A, worker=B".
 */
int djversion_check(const char *job_version, const char *ours, struct esd_err *err);

#endif
