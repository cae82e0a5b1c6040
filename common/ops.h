/*
 * ops: the commands that work on a job directory (prepare, status, retry,
 * merge, verify, logs), with their arguments and results in JSON, so that
 * esctl's local mode and esd (in a child running as the caller) run the
 * very same code and esctl renders both alike. Arguments are a request's
 * "args" checked with cmd_args_check(); the result is the reply's
 * "result" object.
 */
#ifndef ESD_OPS_H
#define ESD_OPS_H

#include <signal.h>
#include <stdbool.h>

#include <cjson/cJSON.h>

#include "cmds.h"
#include "util.h"

struct op_env {
    /* Progress of long operations: {"phase": "scan"|"write"|"merge"|
     * "verify", "bytes_done", "bytes_total", "rows", "elapsed"}; logs
     * sends {"data": "<text>"} chunks. The callee keeps ev. May be NULL. */
    void (*event)(void *ctx, cJSON *ev);
    void *ctx;
    /* Stops the operation cleanly (-ECANCELED) once non-zero. May be NULL. */
    const volatile sig_atomic_t *cancel;
    /* Paths must be absolute (a request from another process: its working
     * directory means nothing here), and what the command writes (merge's
     * output) must stay inside the job dir. */
    bool confined;
    /* Defaults for prepare's Data-Juicer version detection and dj_root
     * (esd's configuration); NULL: esctl's defaults. */
    const char *const *processor;
    const char *dj_root;
    /* Threads of prepare, merge and verify when the request gives no
     * --threads (esd's configuration); 0: the CPUs available. */
    unsigned threads;
};

/* The most threads a request may ask for. */
#define OPS_MAX_THREADS 256

/*
 * Runs command id (CMD_PREPARE, CMD_STATUS with a job_dir, CMD_RETRY,
 * CMD_MERGE, CMD_VERIFY, CMD_LOGS) with args. Returns 0 with *ret the
 * result (caller frees), or a negative errno with err set: -EACCES/-EPERM
 * when the file system refused, -ECANCELED when cancelled.
 */
int op_run(enum cmd_id id, const cJSON *args, const struct op_env *env, cJSON **ret,
           struct esd_err *err);

/* The exit code status's result means: 0 complete, 1 incomplete, 2 a
 * shard failed. */
int op_status_exit(const cJSON *result);

/*
 * logs: the process.log of a shard's latest attempt in job_dir (resolved).
 * *ret_path is set (caller frees). Returns 0 or a negative errno (-ENOENT:
 * the shard has no attempt yet).
 */
int op_latest_log(const char *job_dir, const char *shard, char **ret_path, struct esd_err *err);

#endif
