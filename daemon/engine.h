/*
 * engine: the daemon's modules wired together, for the daemon (main.c) and
 * for `esd run` (oneshot.c): init in dependency order, fini in reverse,
 * and the stop sequence (drain, then the Ray head, then the loop ends).
 */
#ifndef ESD_ENGINE_H
#define ESD_ENGINE_H

#include <ev.h>

#include "config.h"
#include "util.h"

/* Starts every module on c (which the modules keep a pointer to) with the
 * control socket activated_fd (-1: esd makes its own). Start-up errors
 * only: 0, or a negative errno with err set. */
int engine_init(struct ev_loop *loop, const struct esd_conf *c, int activated_fd,
                struct esd_err *err);
/* Gives every module a reloaded configuration (SIGHUP). */
void engine_reconfigure(const struct esd_conf *c);
/* No new claims; once nothing runs any more (attempts within
 * drain_timeout_secs) the Ray head is stopped and the loop ends. */
void engine_drain(void);
/* Stops running attempts and merges now (their claims released). */
void engine_stop_now(void);
void engine_fini(void);

#endif
