/*
 * outcome: how an attempt's end maps to what attempt_finish records, decided
 * in one place for every caller (the daemon's runner and `esctl worker`).
 * The caller says what happened (struct outcome_facts); outcome_classify
 * says whether that is a success, a clean stop ("released") or a failure
 * of which class, with the message attempt.json and the failed record
 * carry. Pure: no files, no clock, no logging.
 */
#ifndef ESD_OUTCOME_H
#define ESD_OUTCOME_H

#include <stdbool.h>
#include <stddef.h>

#include "attempt.h"

/* Room for any message outcome_classify writes (a cause of ESD_ERR_MAX
 * and the words around it). */
#define OUTCOME_MSG_MAX (ESD_ERR_MAX + 128)

/* What the caller saw of one attempt. */
struct outcome_facts {
    bool stopped;             /* stopped on purpose: drain, cancel, shutdown, SIGTERM */
    const char *start_error;  /* non-NULL: the processor could not be started (why) */
    const char *lease_error;  /* non-NULL: the claim's lease was lost (why) */
    bool ran;                 /* the processor ran and ended: status is its wait status */
    int status;               /* the processor's wait status (waitpid) */
    bool timed_out;           /* the attempt timeout killed it */
    double timeout_secs;      /* that timeout */
    bool ray_restarted;       /* the Ray head it used went down while it ran */
    bool validated;           /* its output was materialised: result_rc says how */
    int result_rc;            /* attempt_materialize's return: 0 or a negative errno */
    const char *result_error; /* attempt_materialize's message when result_rc < 0 */
};

/*
 * Classifies an attempt's end into out->fc, out->error, out->released and
 * out->return_code (the processor's code: -N for signal N, -1 when it
 * never ran); the other fields of out are the caller's and left alone.
 * out->error points into msg (msglen: OUTCOME_MSG_MAX), into one of f's
 * strings or to a constant: it lives as long as the shorter of those.
 *
 * Returns true when nothing went wrong but the output is not yet
 * validated: the caller materialises it (attempt_materialize), sets
 * f->validated and f->result_* and classifies again. false: out is final
 * (out->fc FC_NONE and !out->released: publish the result).
 */
bool outcome_classify(const struct outcome_facts *f, struct attempt_outcome *out, char *msg,
                      size_t msglen);

#endif
