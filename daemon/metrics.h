/*
 * metrics: a Prometheus textfile-collector file (node_exporter's
 * --collector.textfile.directory), rewritten atomically every
 * metrics.interval_secs when metrics.path is set: per job, shards by state
 * and what this node did (rows, bytes, attempts); attempt durations as a
 * histogram; failures by class; Ray head restarts; lease takeovers. The
 * counters start at zero when esd starts (Prometheus' rate() copes). A
 * job's series carry the label esd_job (its registration key: stable and
 * unique) and exist only while the job is in the registry.
 */
#ifndef ESD_METRICS_H
#define ESD_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ev.h>

#include "config.h"

void metrics_init(struct ev_loop *loop, const struct esd_conf *c);
void metrics_reconfigure(const struct esd_conf *c);
void metrics_fini(void);

struct job;

/* An attempt of job j (NULL: none known) ended here: status "done",
 * "failed", "released", …; cls the failure class or NULL. */
void metrics_attempt(struct job *j, const char *status, const char *cls, double secs, uint64_t rows,
                     uint64_t bytes);
/* The number of attempts running on this node now (the runner tells it
 * whenever it changes: metrics reads no other module's state). */
void metrics_set_running(size_t n);
/* A claim took over a lock whose lease had run out. */
void metrics_takeover(void);

/* The file's text now (tests; the caller frees). */
char *metrics_render(void);

#endif
