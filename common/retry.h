/*
 * retry: requeues terminally failed shards (spec §10) by moving their failed
 * record and their attempts into state/history/, after checking every
 * target first.
 */
#ifndef ESD_RETRY_H
#define ESD_RETRY_H

#include <stdbool.h>

#include "manifest.h"
#include "util.h"

/*
 * Requeues the failed shards among ids (or every failed shard with
 * all_failed). Unknown ids are an error ("Unknown shard IDs: a, b"); ids
 * that are not failed are ignored; a target with a lock or a done record
 * refuses the whole request before anything moves. The requeued ids, sorted,
 * are appended to ret_requeued (empty: nothing was selected).
 */
int retry_run(const struct manifest *m, bool all_failed, const struct strv *ids,
              struct strv *ret_requeued, struct esd_err *err);

#endif
