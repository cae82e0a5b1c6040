/*
 * cmds: the option and command tables (cmds.h), and the checks of request
 * arguments against them.
 */
#include "cmds.h"

#include <errno.h>
#include <string.h>

#include "json.h"

#define P true /* a path: completion offers file names */

const struct opt_def cmd_opts[O__COUNT] = {
    [O_CONFIG] = { "config", K_STR, "PATH", "Data-Juicer YAML recipe", "config", P },
    [O_DATASET_PATH] = { "dataset-path", K_STR, "PATH",
                         "JSONL file or directory (overrides the recipe's dataset_path)",
                         "dataset_path", P },
    [O_JOB_DIR] = { "job-dir", K_STR, "DIR", "job directory on the shared filesystem", "job_dir",
                    P },
    [O_NUM_SHARDS] = { "num-shards", K_POSITIVE, "N", "exact number of non-empty shards",
                       "num_shards", false },
    [O_LOCK_TIMEOUT] = { "lock-timeout-secs", K_POSITIVE, "N",
                         "claim timeout for locks without a lease (default 126000)",
                         "lock_timeout_secs", false },
    [O_MAX_RETRIES] = { "max-retries", K_NONNEG, "N",
                        "retries after the first attempt (default 3; worker: overrides the "
                        "manifest)",
                        "max_retries", false },
    [O_POLL_INTERVAL] = { "poll-interval-secs", K_POSITIVE, "N",
                          "idle poll interval of workers (default 20)", "poll_interval_secs",
                          false },
    [O_RAY_ADDRESS] = { "ray-address", K_STR, "ADDR",
                        "Ray address; prepare records it (default local), worker overrides it",
                        "ray_address", false },
    [O_DJ_ROOT] = { "data-juicer-root", K_STR, "DIR",
                    "Data-Juicer checkout; prepare resolves relative recipe paths against it "
                    "(default: working directory), worker runs its tools/process_data.py",
                    "data_juicer_root", P },
    [O_ALLOW_OP] = { "allow-op", K_STRV, "NAME",
                     "accept this operator whatever its name says (repeatable)", "allow_op",
                     false },
    [O_DENY_OP] = { "deny-op", K_STRV, "NAME", "refuse this operator (repeatable)", "deny_op",
                    false },
    [O_NO_GLOBAL_STAGE] = { "no-global-stage", K_FLAG, NULL,
                            "refuse a whole-dataset operator (deduplicator, selector, ...) "
                            "instead of running it and the rest of the recipe once after the "
                            "shards",
                            "no_global_stage", false },
    [O_MAX_LINE_BYTES] = { "max-line-bytes", K_POSITIVE, "N",
                           "longest accepted JSONL record (default 268435456)", "max_line_bytes",
                           false },
    [O_MAX_DEPTH] = { "max-depth", K_POSITIVE, "N",
                      "deepest accepted JSON nesting (default 1000, at most 4096)", "max_depth",
                      false },
    [O_THREADS] = { "threads", K_POSITIVE, "N",
                    "threads that read, validate, hash and write (default: the CPUs "
                    "available; 1: none beside the main one); the result is the same",
                    "threads", false },
    [O_ALL] = { "all", K_FLAG, NULL,
                "status: one line per shard; list: also the spool's jobs this node does not "
                "hold (forgotten here, or finished before retention_secs)",
                "all", false },
    [O_ALL_FAILED] = { "all-failed", K_FLAG, NULL, "requeue every failed shard", "all_failed",
                       false },
    [O_SHARD_ID] = { "shard-id", K_STRV, "ID", "requeue this shard (repeatable)", "shard_id", false,
                     "shard" },
    [O_OUTPUT] = { "output", K_STR, "PATH",
                   "merged output (default <job-dir>/merged.jsonl; through esd: inside the job "
                   "dir); report: the HTML file (default report.html; -o is short for it)",
                   "output", P },
    [O_OVERWRITE] = { "overwrite", K_FLAG, NULL, "replace an existing output atomically",
                      "overwrite", false },
    [O_EXPECT_NODES] = { "expect-nodes", K_POSITIVE, "N",
                         "fail unless at least N distinct nodes completed shards", "expect_nodes",
                         false },
    [O_NODE] = { "node", K_STR, "NAME", "this worker's node name (default: the host name)", "node",
                 false },
    [O_MAX_SHARDS] = { "max-shards", K_POSITIVE, "N", "stop after handling N claims", "max_shards",
                       false },
    [O_LEASE_SECS] = { "lease-secs", K_POSITIVE, "N",
                       "lease of a claim, renewed every N/4 seconds (default 60)", "lease_secs",
                       false },
    [O_MAX_INFRA] = { "max-infra-failures", K_POSITIVE, "N",
                      "infrastructure failures a shard may see before it fails (default 10)",
                      "max_infra_failures", false },
    [O_PROCESSOR] = { "processor", K_STR, "CMD",
                      "processor command, split on blanks (default dj-process); prepare asks it "
                      "for the Data-Juicer version",
                      "processor", false },
    [O_ATTEMPT_TIMEOUT] = { "attempt-timeout-secs", K_POSITIVE, "N",
                            "kill an attempt's process group after N seconds",
                            "attempt_timeout_secs", false },
    [O_VERBOSE] = { "verbose", K_FLAG, NULL, "copy attempts' output to standard error", "verbose",
                    false },
    [O_ALLOW_MISMATCH] = { "allow-version-mismatch", K_FLAG, NULL,
                           "run even if this node's Data-Juicer differs from the job's",
                           "allow_version_mismatch", false },
    [O_SHARD] = { "shard", K_STR, "ID", "the shard whose latest attempt's process.log to show",
                  "shard", false, "shard-id" },
    [O_FOLLOW] = { "follow", K_FLAG, NULL, "keep showing new lines until interrupted", "follow",
                   false },
    [O_WATCH] = { "watch", K_FLAG, NULL, "redraw every 2 seconds until the job ends", "watch",
                  false },
    [O_EVERYWHERE] = { "everywhere", K_FLAG, NULL,
                       "on every node: submit through the shared spool_dir, cancel through the "
                       "job dir, forget by leaving the spool too",
                       "everywhere", false },
    [O_RELEASE] = { "release", K_FLAG, NULL,
                    "stop running attempts now and release their claims (no failure counted)",
                    "release", false },
    [O_WAIT] = { "wait", K_FLAG, NULL, "return once nothing runs on this node any more", "wait",
                 false },
    [O_LINES] = { "lines", K_POSITIVE, "N", "only the last N lines", "lines", false },
    [O_NODES] = { "nodes", K_POSITIVE, "N",
                  "fscheck: participants to wait for, one per node (default 1: this node alone)",
                  "nodes", false },
    [O_WAIT_SECS] = { "wait-secs", K_POSITIVE, "N",
                      "fscheck: how long to wait for the other participants (default 60)",
                      "wait_secs", false },
    [O_RUN] = { "run", K_STR, "NAME",
                "fscheck: the rendezvous name shared by the participants (default \"default\")",
                "run", false },
    [O_STATE] = { "state", K_STR, "STATE",
                  "status: only the shards in this state (pending, running, stale, done, "
                  "failed); list: only the jobs in this state (active, draining, finalizing, "
                  "complete, failed, cancelled; running: the first three, finished: the last "
                  "three)",
                  "state", false },
    [O_SORT] = { "sort", K_STR, "KEY",
                 "status: order the shards by elapsed (slowest first), start, shard, node or "
                 "attempts (most first)",
                 "sort", false },
    [O_ATTEMPT] = { "attempt", K_POSITIVE, "N", "logs: this attempt's process.log (with --shard)",
                    "attempt", false },
    [O_TIMEOUT_SECS] = { "timeout-secs", K_POSITIVE, "N",
                         "wait: give up after N seconds (exit status 1)", "timeout_secs", false },
    [O_JSON] = { "json", K_FLAG, NULL, "print the raw result as JSON", NULL, false },
    [O_LOCAL] = { "local", K_FLAG, NULL, "run in-process on the job directory, without esd", NULL,
                  false },
    [O_SOCKET] = { "socket", K_STR, "PATH", "esd's control socket (default /run/esd/esd.sock)",
                   NULL, P },
    [O_COLOR] = { "color", K_STR, "WHEN",
                  "colour: auto (default: on a terminal whose TERM is not dumb, unless NO_COLOR "
                  "is set and not empty), always or never",
                  NULL, false },
};

#define LIMITS (OPT(O_MAX_LINE_BYTES) | OPT(O_MAX_DEPTH))
#define PREPARE_OPTS                                                                        \
    (OPT(O_CONFIG) | OPT(O_DATASET_PATH) | OPT(O_JOB_DIR) | OPT(O_NUM_SHARDS) |             \
     OPT(O_LOCK_TIMEOUT) | OPT(O_MAX_RETRIES) | OPT(O_POLL_INTERVAL) | OPT(O_RAY_ADDRESS) | \
     OPT(O_DJ_ROOT) | OPT(O_PROCESSOR) | OPT(O_ALLOW_OP) | OPT(O_DENY_OP) |                 \
     OPT(O_NO_GLOBAL_STAGE) | OPT(O_THREADS) | LIMITS)

const struct cmd_def cmd_table[CMD__COUNT] = {
    [CMD_PING] = { CMD_PING, "ping", "", "check that esd answers on its control socket", 0, 0,
                   false, AUTH_READ, CMDF_DAEMON },
    [CMD_VERSION] = { CMD_VERSION, "version", "", "versions of esctl, esd and the control protocol",
                      0, 0, false, AUTH_READ, CMDF_DAEMON },
    [CMD_SUBMIT] = { CMD_SUBMIT, "submit",
                     "[--job-dir] DIR [--output PATH] [--everywhere] [--config PATH "
                     "--num-shards N [prepare options]]",
                     "register a prepared job with esd (preparing it first if --config is given)",
                     PREPARE_OPTS | OPT(O_OUTPUT) | OPT(O_EVERYWHERE), OPT(O_JOB_DIR), true,
                     AUTH_JOB, CMDF_DAEMON | CMDF_CHILD | CMDF_LONG },
    [CMD_LIST] = { CMD_LIST, "list", "[--state STATE] [--all]",
                   "the jobs on this node: state, progress, rows/s, ETA", OPT(O_STATE) | OPT(O_ALL),
                   0, false, AUTH_READ, CMDF_DAEMON },
    [CMD_STATUS] = { CMD_STATUS, "status",
                     "[[--job-dir] DIR [--all] [--state STATE] [--sort KEY] [--watch]]",
                     "without a job: the daemon, its slots and jobs; with one: the job's shards "
                     "(--all: with every attempt)",
                     OPT(O_JOB_DIR) | OPT(O_ALL) | OPT(O_LOCK_TIMEOUT) | OPT(O_WATCH) |
                         OPT(O_STATE) | OPT(O_SORT),
                     0, true, AUTH_READ, CMDF_DAEMON | CMDF_LOCAL | CMDF_FALLBACK | CMDF_CHILD },
    /* (esctl repeats status: esd has no wait of its own) */
    [CMD_WAIT] = { CMD_WAIT, "wait", "[--job-dir] DIR [--timeout-secs N]",
                   "block until the job is over: exit 0 merged, 2 failed or cancelled, 1 timed out",
                   OPT(O_JOB_DIR) | OPT(O_TIMEOUT_SECS), OPT(O_JOB_DIR), true, AUTH_READ,
                   CMDF_LOCAL },
    [CMD_PREPARE] = { CMD_PREPARE, "prepare",
                      "--config PATH --job-dir DIR --num-shards N [options]",
                      "validate a recipe and a JSONL dataset and split it into a job directory",
                      PREPARE_OPTS, OPT(O_CONFIG) | OPT(O_JOB_DIR) | OPT(O_NUM_SHARDS), false,
                      AUTH_JOB, CMDF_DAEMON | CMDF_LOCAL | CMDF_CHILD | CMDF_LONG },
    [CMD_RETRY] = { CMD_RETRY, "retry", "[--job-dir] DIR (--all-failed | --shard-id ID ...)",
                    "requeue terminally failed shards",
                    OPT(O_JOB_DIR) | OPT(O_ALL_FAILED) | OPT(O_SHARD_ID), OPT(O_JOB_DIR), true,
                    AUTH_JOB, CMDF_DAEMON | CMDF_LOCAL | CMDF_CHILD },
    [CMD_MERGE] = { CMD_MERGE, "merge", "[--job-dir] DIR [--output PATH] [--overwrite]",
                    "check every shard's result and merge them in the original order",
                    OPT(O_JOB_DIR) | OPT(O_OUTPUT) | OPT(O_OVERWRITE) | OPT(O_LOCK_TIMEOUT) |
                        OPT(O_THREADS) | LIMITS,
                    OPT(O_JOB_DIR), true, AUTH_JOB,
                    CMDF_DAEMON | CMDF_LOCAL | CMDF_CHILD | CMDF_LONG },
    [CMD_VERIFY] = { CMD_VERIFY, "verify", "[--job-dir] DIR [--expect-nodes N]",
                     "recheck every shard's result (and the merged output) without writing",
                     OPT(O_JOB_DIR) | OPT(O_EXPECT_NODES) | OPT(O_LOCK_TIMEOUT) | OPT(O_THREADS) |
                         LIMITS,
                     OPT(O_JOB_DIR), true, AUTH_READ,
                     CMDF_DAEMON | CMDF_LOCAL | CMDF_FALLBACK | CMDF_CHILD | CMDF_LONG },
    [CMD_CANCEL] = { CMD_CANCEL, "cancel", "[--job-dir] DIR [--everywhere]",
                     "stop working a job on this node (or, with --everywhere, on every node)",
                     OPT(O_JOB_DIR) | OPT(O_EVERYWHERE), OPT(O_JOB_DIR), true, AUTH_JOB,
                     CMDF_DAEMON },
    [CMD_FORGET] = { CMD_FORGET, "forget", "[--job-dir] DIR [--everywhere]",
                     "drop an ended job from this node's registry (or the spool's); its files stay",
                     OPT(O_JOB_DIR) | OPT(O_EVERYWHERE), OPT(O_JOB_DIR), true, AUTH_JOB,
                     CMDF_DAEMON },
    [CMD_DRAIN] = { CMD_DRAIN, "drain", "[--release] [--wait]",
                    "take no more claims on this node; running work finishes (or is released)",
                    OPT(O_RELEASE) | OPT(O_WAIT), 0, false, AUTH_NODE, CMDF_DAEMON },
    [CMD_RESUME] = { CMD_RESUME, "resume", "", "take claims again after a drain", 0, 0, false,
                     AUTH_NODE, CMDF_DAEMON },
    [CMD_NODES] = { CMD_NODES, "nodes", "",
                    "every node working the shared spool: state, slots, what it runs, versions", 0,
                    0, false, AUTH_READ, CMDF_DAEMON },
    [CMD_LOGS] = { CMD_LOGS, "logs",
                   "[--job-dir] DIR [--shard ID [--attempt N]] [--lines N] [--follow]",
                   "a shard's process.log, or without --shard this node's journal for the job",
                   OPT(O_JOB_DIR) | OPT(O_SHARD) | OPT(O_ATTEMPT) | OPT(O_FOLLOW) | OPT(O_LINES),
                   OPT(O_JOB_DIR), true, AUTH_READ,
                   CMDF_DAEMON | CMDF_LOCAL | CMDF_FALLBACK | CMDF_CHILD },
    [CMD_CONFIG] = { CMD_CONFIG, "config", "", "esd's effective configuration", 0, 0, false,
                     AUTH_READ, CMDF_DAEMON },
    [CMD_WORKER] = { CMD_WORKER, "worker",
                     "[--job-dir] DIR [--node NAME] [--max-shards N] [options]",
                     "claim and process shards until the job is terminal (in-process, no esd)",
                     OPT(O_JOB_DIR) | OPT(O_NODE) | OPT(O_MAX_SHARDS) | OPT(O_LEASE_SECS) |
                         OPT(O_LOCK_TIMEOUT) | OPT(O_MAX_RETRIES) | OPT(O_MAX_INFRA) |
                         OPT(O_POLL_INTERVAL) | OPT(O_RAY_ADDRESS) | OPT(O_PROCESSOR) |
                         OPT(O_DJ_ROOT) | OPT(O_ATTEMPT_TIMEOUT) | OPT(O_VERBOSE) |
                         OPT(O_ALLOW_MISMATCH) | LIMITS,
                     OPT(O_JOB_DIR), true, AUTH_JOB, CMDF_LOCAL },
    [CMD_COMPLETION] = { CMD_COMPLETION, "completion", "",
                         "print the bash completion script (generated from this table)", 0, 0,
                         false, AUTH_READ, CMDF_LOCAL },
    [CMD_FSCHECK] = { CMD_FSCHECK, "fscheck", "DIR [--nodes N] [--wait-secs N] [--run NAME]",
                      "check the shared file system for exclusive claims (run on N nodes at once)",
                      OPT(O_JOB_DIR) | OPT(O_NODES) | OPT(O_WAIT_SECS) | OPT(O_RUN), OPT(O_JOB_DIR),
                      true, AUTH_READ, CMDF_LOCAL },
    [CMD_REPORT] = { CMD_REPORT, "report", "[--job-dir] DIR [--output PATH]",
                     "write the job's timeline, pace and summary as one self-contained HTML file",
                     OPT(O_JOB_DIR) | OPT(O_OUTPUT) | OPT(O_LOCK_TIMEOUT), OPT(O_JOB_DIR), true,
                     AUTH_READ, CMDF_LOCAL },
    [CMD_RELOAD] = { CMD_RELOAD, "reload", "",
                     "reread esd.yaml; an invalid file is refused and the running one kept", 0, 0,
                     false, AUTH_NODE, CMDF_DAEMON },
};

const struct cmd_def *
cmd_find(const char *name)
{
    for (size_t i = 0; i < CMD__COUNT; i++)
        if (!strcmp(cmd_table[i].name, name))
            return &cmd_table[i];
    return NULL;
}

const char *
cmd_auth_name(enum cmd_auth a)
{
    return a == AUTH_READ ? "read" : a == AUTH_NODE ? "node" : "job";
}

static int
opt_by_key(const char *key)
{
    for (int o = 0; o < O__COUNT; o++)
        if (cmd_opts[o].key && !strcmp(cmd_opts[o].key, key))
            return o;
    return -1;
}

int
cmd_args_check(const struct cmd_def *cmd, const cJSON *args, struct esd_err *err)
{
    uint64_t seen = 0;
    const cJSON *a;

    cJSON_ArrayForEach(a, args)
    {
        int o = a->string ? opt_by_key(a->string) : -1;
        const struct opt_def *d;
        const cJSON *s;
        long long v;

        if (o < 0 || !(cmd->opts & OPT(o)))
            return err_set(err, -EINVAL, "%s takes no argument \"%s\"", cmd->name,
                           a->string ? a->string : "");
        d = &cmd_opts[o];
        if (seen & OPT(o))
            return err_set(err, -EINVAL, "argument \"%s\" of %s is given twice", d->key, cmd->name);
        seen |= OPT(o);
        switch (d->kind) {
        case K_FLAG:
            if (!cJSON_IsBool(a))
                return err_set(err, -EINVAL, "argument \"%s\" of %s must be true or false", d->key,
                               cmd->name);
            break;
        case K_STR:
            if (!cJSON_IsString(a) || !*a->valuestring || strlen(a->valuestring) > 4096)
                return err_set(err, -EINVAL,
                               "argument \"%s\" of %s must be a non-empty string "
                               "of at most 4096 bytes",
                               d->key, cmd->name);
            break;
        case K_STRV:
            if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) > 100000)
                return err_set(err, -EINVAL,
                               "argument \"%s\" of %s must be an array of "
                               "strings",
                               d->key, cmd->name);
            cJSON_ArrayForEach(
                s, a) if (!cJSON_IsString(s) || !*s->valuestring ||
                          strlen(s->valuestring) >
                              4096) return err_set(err, -EINVAL,
                                                   "argument \"%s\" of %s must be an array of "
                                                   "non-empty strings",
                                                   d->key, cmd->name);
            break;
        case K_POSITIVE:
        case K_NONNEG:
            /* plain or raw (exact) numbers alike */
            if (json_get_int(args, a->string, &v) < 0 || v < (d->kind == K_POSITIVE))
                return err_set(err, -EINVAL, "argument \"%s\" of %s must be a %s integer", d->key,
                               cmd->name, d->kind == K_POSITIVE ? "positive" : "non-negative");
            break;
        }
    }
    for (int o = 0; o < O__COUNT; o++)
        if ((cmd->required & OPT(o)) && !cmd_arg_has(args, (enum opt_id)o))
            return err_set(err, -EINVAL, "%s needs the argument \"%s\"", cmd->name,
                           cmd_opts[o].key);
    return 0;
}

bool
cmd_arg_has(const cJSON *args, enum opt_id o)
{
    return args && cmd_opts[o].key && cJSON_GetObjectItemCaseSensitive(args, cmd_opts[o].key);
}

const char *
cmd_arg_str(const cJSON *args, enum opt_id o)
{
    const cJSON *a =
        args && cmd_opts[o].key ? cJSON_GetObjectItemCaseSensitive(args, cmd_opts[o].key) : NULL;

    return cJSON_IsString(a) ? a->valuestring : NULL;
}

bool
cmd_arg_flag(const cJSON *args, enum opt_id o)
{
    return args && cmd_opts[o].key &&
           cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(args, cmd_opts[o].key));
}

long long
cmd_arg_num(const cJSON *args, enum opt_id o, long long dflt)
{
    long long v;

    return args && cmd_opts[o].key && json_get_int(args, cmd_opts[o].key, &v) == 0 ? v : dflt;
}

void
cmd_arg_strv(const cJSON *args, enum opt_id o, struct strv *v)
{
    const cJSON *a =
        args && cmd_opts[o].key ? cJSON_GetObjectItemCaseSensitive(args, cmd_opts[o].key) : NULL;
    const cJSON *s;

    cJSON_ArrayForEach(s, a) if (cJSON_IsString(s)) strv_push(v, s->valuestring);
}
