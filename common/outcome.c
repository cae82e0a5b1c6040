/*
 * outcome: the one mapping from what happened to an attempt to its outcome
 * (outcome.h), for the daemon and `esctl worker` alike.
 */
#include "outcome.h"

#include <stdio.h>
#include <string.h>

#include "spawn.h"

bool
outcome_classify(const struct outcome_facts *f, struct attempt_outcome *out, char *msg,
                 size_t msglen)
{
    char how[64], end[96] = "";
    int code = -1;

    if (f->ran) {
        /* "returned exit code 3", "was killed by signal 9 (KILL)" */
        spawn_describe(f->status, how, &code);
        snprintf(end, sizeof(end), "%s %s", code < 0 ? "was" : "returned", how);
    }
    out->return_code = code;
    out->fc = FC_NONE;
    out->error = NULL;
    out->released = false;

    /*
     * The precedence, first match wins. A stop on purpose comes first: it
     * is what made the processor exit non-zero or lose its output, and
     * whatever else happened on the way, the shard goes back uncounted.
     * Then what leaves no attempt to judge, this node's fault and not the
     * shard's (infrastructure): a processor that never started, a lease
     * lost (the lock is not ours, nothing may be published, and the exit
     * status is that of our own kill). A Ray head that went down while
     * the processor failed is infrastructure too, even past the timeout: a
     * lost head makes Data-Juicer fail, or hang until the timeout kills
     * it, and the shard must not pay for it. Only then the processor's own
     * failures (the timeout before the exit status, which is that of our
     * kill), and last the output's.
     */
    if (f->stopped) {
        out->released = true;
        out->error = "the attempt was stopped on purpose (drain, cancel or shutdown)";
    } else if (f->start_error || !f->ran) {
        out->fc = FC_INFRASTRUCTURE;
        out->error = f->start_error   ? f->start_error
                     : f->lease_error ? f->lease_error
                                      : "the processor never started";
    } else if (f->lease_error) {
        out->fc = FC_INFRASTRUCTURE;
        out->error = f->lease_error;
    } else if (f->ray_restarted && code != 0) {
        out->fc = FC_INFRASTRUCTURE;
        snprintf(msg, msglen, "the Ray head went down during the attempt (Data-Juicer %s)", end);
        out->error = msg;
    } else if (f->timed_out) {
        out->fc = FC_PROCESSOR;
        snprintf(msg, msglen, "Data-Juicer timed out after %.0f s and was killed", f->timeout_secs);
        out->error = msg;
    } else if (code != 0) {
        out->fc = FC_PROCESSOR;
        snprintf(msg, msglen, "Data-Juicer %s", end);
        out->error = msg;
    } else if (!f->validated) {
        return true;
    } else if (f->result_rc < 0) {
        out->fc = attempt_result_class(f->result_rc);
        out->error = f->result_error ? f->result_error : strerror(-f->result_rc);
    }
    return false;
}
