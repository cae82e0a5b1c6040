/*
 * hashq: SHA-256 updates on a second thread. Prepare and merge must hash the
 * same bytes two or three ways (per file, per shard, whole stream); doing
 * them beside the reading, validating and writing cuts the wall time on a
 * two-core node; a caller may run two queues for two digests. Data is copied into a bounded ring of slots, so
 * the caller may reuse its buffer at once; memory stays bounded.
 */
#ifndef ESD_HASHQ_H
#define ESD_HASHQ_H

#include <stddef.h>

#include "sha256.h"

struct hashq;

/* Starts the hashing thread. Aborts if it cannot be created. */
struct hashq *hashq_new(void);
/* Queues sha256_update(s, data, len) (data is copied). Updates to one
 * context are applied in the order queued. Blocks while the ring is full. */
void hashq_update(struct hashq *q, struct sha256 *s, const void *data, size_t len);
/* Queues fn(ctx, copy of data, len) in order with the other updates: for
 * consumers of a byte stream other than a bare digest. */
void hashq_run(struct hashq *q, void (*fn)(void *ctx, const char *data, size_t len), void *ctx,
               const void *data, size_t len);
/* Waits until every queued update has been applied. */
void hashq_sync(struct hashq *q);
/* Syncs, stops the thread and frees q (NULL-safe). */
void hashq_free(struct hashq *q);

#endif
