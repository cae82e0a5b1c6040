/*
 * pipeline: an ordered pipeline of chunks over N threads, for prepare and
 * merge. A source stage produces chunks one at a time, in sequence; each
 * chunk then goes through the other stages in turn. A stage is either
 * ordered (it sees the chunks one at a time, in sequence: a digest, a
 * count, a write) or parallel (any number of chunks at once, in any order:
 * validation). Different stages run at the same time on different chunks,
 * so two ordered stages (two digests of the same bytes) run side by side.
 *
 * Memory is bounded by the chunks the caller hands over: the source waits
 * for a free one. A stage that fails stops the chunks after its own; the
 * chunks before it go on through every stage, and the error of the
 * earliest chunk that failed is the one reported, so errors come in input
 * order whatever the number of threads.
 *
 * With one thread, everything runs on the caller's, one chunk at a time
 * (source, then each stage, in order), and no thread is started.
 */
#ifndef ESD_PIPELINE_H
#define ESD_PIPELINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util.h"

/*
 * One stage. run(ctx, chunk, seq, err) returns 0, or a negative errno with
 * err set, which stops the pipeline after chunk seq. For the source
 * (stages[0], which is always ordered), 1 means it filled chunk, 0 that
 * the input is over (chunk unused). Stages of one chunk run in order, and
 * what one stage wrote in the chunk is seen by the next, whichever thread
 * runs it.
 */
struct pipeline_stage {
    int (*run)(void *ctx, void *chunk, uint64_t seq, struct esd_err *err);
    bool ordered;
};

/*
 * Runs the pipeline to its end on nthreads threads, the caller's included
 * (1: the caller's alone; other threads start with every signal blocked).
 * chunks[0..nchunks) are the caller's, used in turn by the source; at
 * least one. Returns 0 when every chunk the source produced went through
 * every stage, or the first failure in chunk order (err set from it).
 */
int pipeline_run(const struct pipeline_stage *stages, size_t nstages, void *ctx, void **chunks,
                 size_t nchunks, unsigned nthreads, struct esd_err *err);

/*
 * The CPUs this process may use: its affinity mask, lowered to the CPU
 * quota of its cgroup or of a parent (cgroup v2's cpu.max, v1's
 * cpu.cfs_quota_us) when there is one. At least 1.
 */
unsigned pipeline_cpus(void);

/* The chunks to give pipeline_run for nthreads and nstages: one in each
 * ordered stage and one a thread, and a few in flight. */
size_t pipeline_chunks_for(unsigned nthreads, size_t nstages);

#endif
