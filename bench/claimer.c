/*
 * claimer: the benchmark's claiming process. Opens a job as node "bench",
 * makes one claim (which primes the claimer's caches: two directory
 * listings), then --claims more, and exits. A pass that stops at its
 * budget is resumed at once, as the daemon does at its next loop turn. bench/claim runs it under
 * `strace -f -c` with --claims 0 and with --claims K: the difference over
 * K is the cost of one claim in steady state.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "claim.h"
#include "json.h"
#include "manifest.h"

int
main(int argc, char **argv)
{
    struct manifest m;
    struct claimer c;
    struct claim_opts o = { .node = "bench", .lease_secs = 3600 };
    struct esd_err err;
    long claims;
    int r;

    if (argc != 3) {
        fprintf(stderr, "usage: claimer JOB_DIR CLAIMS\n");
        return 2;
    }
    claims = strtol(argv[2], NULL, 10);
    json_init();
    if (manifest_load(argv[1], &m, &err) < 0 || claimer_init(&c, &m, &o, &err) < 0) {
        fprintf(stderr, "claimer: %s\n", err.msg);
        return 2;
    }
    for (long k = 0; k <= claims; k++) {
        struct claim cl;
        struct claim_idle idle;

        /* A pass stops at its budget (idle.more): the daemon resumes it
         * at its next loop turn, the claimer at once. */
        do {
            memset(&idle, 0, sizeof(idle));
            r = claim_acquire(&c, &cl, &idle, &err);
        } while (r == 0 && idle.more);
        if (r < 0) {
            fprintf(stderr, "claimer: %s\n", err.msg);
            return 2;
        }
        if (r == 0) {
            fprintf(stderr,
                    "claimer: nothing left to claim after %ld claims "
                    "(done %zu, failed %zu, busy %zu)\n",
                    k, idle.done, idle.failed, idle.busy);
            return 2;
        }
        claim_free(&cl);
    }
    claimer_free(&c);
    manifest_free(&m);
    return 0;
}
