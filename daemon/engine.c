/*
 * engine: init, reconfigure, stop and fini of the daemon's modules.
 */
#include "engine.h"

#include "contain.h"
#include "ctl.h"
#include "finalize.h"
#include "jobs.h"
#include "jobview.h"
#include "log.h"
#include "metrics.h"
#include "nodes.h"
#include "opchild.h"
#include "ray.h"
#include "runner.h"
#include "sched.h"
#include "warm.h"

static struct ev_loop *loop_;
static const struct esd_conf *conf_;

/* The daemon's status: the scheduler's, with the Ray head's details. */
static cJSON *
engine_status(void)
{
    cJSON *o = sched_status_json();

    ray_status_json(cJSON_GetObjectItemCaseSensitive(o, "ray"));
    return o;
}

int
engine_init(struct ev_loop *loop, const struct esd_conf *c, int activated_fd, struct esd_err *err)
{
    loop_ = loop;
    conf_ = c;
    if (ctl_init(loop, c, activated_fd, err) < 0 || jobs_init(loop, c, err) < 0 ||
        ray_init(loop, c, err) < 0)
        return -1;
    runner_init(loop, c);
    warm_init(loop, c);
    finalize_init(loop, c);
    opchild_init(loop, c);
    metrics_init(loop, c);
    jobview_init(loop, c);
    sched_init(loop, c);
    nodes_init(loop, c);
    ctl_set_status(engine_status);
    return 0;
}

void
engine_reconfigure(const struct esd_conf *c)
{
    conf_ = c;
    /* every module moves to the new struct (comparing with the old one
     * first where it must), then the caller frees the old one */
    ray_reconfigure(c);
    runner_reconfigure(c);
    warm_reconfigure(c);
    finalize_reconfigure(c);
    jobs_reconfigure(c);
    sched_reconfigure(c);
    opchild_reconfigure(c);
    metrics_reconfigure(c);
    nodes_reconfigure(c);
    jobview_reconfigure(c);
    ctl_reconfigure(c);
}

static void
ray_stopped(void)
{
    ev_break(loop_, EVBREAK_ALL);
}

static void
drained(void)
{
    log_notice(NULL, "drained: nothing runs any more%s",
               conf_->ray_mode == RAY_PERSISTENT ? "; stopping the Ray head" : "");
    ray_stop(ray_stopped);
}

void
engine_drain(void)
{
    sched_drain(drained);
}

void
engine_stop_now(void)
{
    runner_stop_all();
    finalize_stop_all();
}

void
engine_fini(void)
{
    ctl_fini();
    nodes_fini();
    opchild_fini();
    metrics_fini();
    jobview_fini();
    sched_fini();
    finalize_fini();
    runner_fini();
    warm_fini();
    jobs_fini();
    ray_fini();
}
