/*
 * ray: the Ray supervisor. In "persistent" mode it keeps one node-local head
 * running as a child of esd (`<ray.command> start --head --block --port P
 * --temp-dir D --node-ip-address 127.0.0.1 --include-dashboard=false
 * --disable-usage-stats <ray.args>`, in a process group of its own, with
 * --num-gpus N, RAY_AUTH_MODE=token and a token file of its own under D),
 * waits until it is ready (its GCS port accepts connections, then a
 * short-lived Python child of ray.command's interpreter sees its raylet
 * registered and runs one task on it; only the port where no such python
 * is found), checks it every 30 s (the port), hands its address and the
 * token environment to attempts, restarts it with capped exponential
 * backoff (1 s doubling to 60 s) when it dies or stops answering, and stops
 * its whole process group on shutdown. In "per-attempt" mode attempts get
 * "local"; in "off" mode the manifest's address, and no Ray at all.
 *
 * While the head is not healthy, ray_ready() is false and no claims are
 * made; ray_generation() changes whenever the head goes down, so an
 * attempt that lived through that can be classed as an infrastructure
 * failure.
 */
#ifndef ESD_RAY_H
#define ESD_RAY_H

#include <stdbool.h>

#include <ev.h>

#include <cjson/cJSON.h>

#include "config.h"
#include "util.h"

/* Starts the head (persistent mode). Only start-up errors are returned
 * (e.g. the temp dir cannot be created); a head that fails to start is
 * retried with backoff and logged. */
int ray_init(struct ev_loop *loop, const struct esd_conf *c, struct esd_err *err);

/* Applies a reloaded configuration: restarts the head if any ray.* key
 * changed, stops it if the mode left "persistent", starts it if it
 * entered it. */
void ray_reconfigure(const struct esd_conf *c);

/* Called (from the loop) whenever ray_ready() changes. */
void ray_set_listener(void (*changed)(void));

bool ray_ready(void);
/* "127.0.0.1:<port>", "local", or NULL (off: the manifest's address). */
const char *ray_address(void);
/* Counts head losses and (re)starts. */
unsigned long ray_generation(void);
/* Adds the variables attempts need to env ("NAME=value" strings):
 * persistent, RAY_AUTH_MODE and RAY_AUTH_TOKEN_PATH of the head's token;
 * per-attempt, RAY_AUTH_MODE and a fresh RAY_AUTH_TOKEN for the attempt's
 * own Ray; off, nothing. */
void ray_env(struct strv *env);
/* "off", "local", "starting", "up", "down", "stopping". */
const char *ray_state_name(void);
/* Restarts after a loss, since esd started. */
unsigned ray_restarts(void);

/*
 * The GPUs a head offers Ray: configured when >= 0 (ray.num_gpus), else the
 * devices cuda_visible lists when it is set (NULL: unset; "", "-1" and
 * "NoDevFiles" mean none; a comma-separated list of indices or UUIDs), else
 * the /dev/nvidia<N> entries of dev_dir. *ret_from gets where the count
 * came from ("ray.num_gpus", "CUDA_VISIBLE_DEVICES", "/dev/nvidia*"; static).
 */
long ray_gpus_count(long configured, const char *cuda_visible, const char *dev_dir,
                    const char **ret_from);

/* Adds the head's details to the "ray" object of the daemon's status (o;
 * NULL: nothing): why it is still starting ("starting"), how readiness is
 * checked ("ready_check": "task" or "port"), its GPUs ("num_gpus",
 * "gpus_from"). Persistent mode only. */
void ray_status_json(cJSON *o);

/* Stops the head (SIGTERM to its process group, SIGKILL after 10 s) and
 * calls done once it is gone (at once if there is none). */
void ray_stop(void (*done)(void));
void ray_fini(void);

#endif
