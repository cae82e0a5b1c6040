/*
 * fscheck: `esctl fscheck DIR`, the shared file system's verdict
 * (common/fscheck.h) printed for humans or as JSON, and recorded in the
 * job when DIR is a job directory. It never asks esd: the check is about
 * this node's view of the mount, so it runs here, once per node, with the
 * same --run and --nodes on every node at once.
 */
#include <stdio.h>
#include <stdlib.h>

#include "esctl.h"
#include "fscheck.h"
#include "proto.h"

int
fscheck_cmd(struct call *c)
{
    struct fscheck_opts o = {
        .dir = c->str[O_JOB_DIR],
        .run = c->set[O_RUN] ? c->str[O_RUN] : NULL,
        .nodes = c->set[O_NODES] ? (long)c->num[O_NODES] : 1,
        .wait_secs = c->set[O_WAIT_SECS] ? (double)c->num[O_WAIT_SECS] : 0,
    };
    struct esd_err err;
    cJSON *v;
    char *text;
    int r;

    if ((r = fscheck_run(&o, &v, &err)) < 0)
        return render_error(c, PROTO_E_FAILED, err.msg, EXIT_ERROR);
    if (c->json) {
        out_json(v);
    } else {
        text = fscheck_text(v);
        fputs(text, stdout);
        free(text);
    }
    r = fscheck_exclusive(v, NULL) ? EXIT_OK : EXIT_ERROR;
    cJSON_Delete(v);
    return r;
}
