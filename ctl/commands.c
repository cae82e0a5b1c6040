/*
 * commands: esctl's option and command tables. Parsing, usage, help, the
 * man page test and (later) bash completion all read these two tables.
 */
#include "esctl.h"

const struct opt_def esctl_opts[O__COUNT] = {
    [O_CONFIG] = { "config", K_STR, "PATH", "Data-Juicer YAML recipe" },
    [O_DATASET_PATH] = { "dataset-path", K_STR, "PATH",
                         "JSONL file or directory (overrides the recipe's dataset_path)" },
    [O_JOB_DIR] = { "job-dir", K_STR, "DIR", "job directory on the shared filesystem" },
    [O_NUM_SHARDS] = { "num-shards", K_POSITIVE, "N", "exact number of non-empty shards" },
    [O_LOCK_TIMEOUT] = { "lock-timeout-secs", K_POSITIVE, "N",
                         "claim timeout for locks without a lease (default 126000)" },
    [O_MAX_RETRIES] = { "max-retries", K_NONNEG, "N",
                        "retries after the first attempt (default 3; worker: overrides the "
                        "manifest)" },
    [O_POLL_INTERVAL] = { "poll-interval-secs", K_POSITIVE, "N",
                          "idle poll interval of workers (default 20)" },
    [O_RAY_ADDRESS] = { "ray-address", K_STR, "ADDR",
                        "Ray address; prepare records it (default local), worker overrides it" },
    [O_DJ_ROOT] = { "data-juicer-root", K_STR, "DIR",
                    "Data-Juicer checkout; prepare resolves relative recipe paths against it "
                    "(default: working directory), worker runs its tools/process_data.py" },
    [O_ALLOW_OP] = { "allow-op", K_STRV, "NAME",
                     "accept this operator whatever its name says (repeatable)" },
    [O_DENY_OP] = { "deny-op", K_STRV, "NAME", "refuse this operator (repeatable)" },
    [O_MAX_LINE_BYTES] = { "max-line-bytes", K_POSITIVE, "N",
                           "longest accepted JSONL record (default 268435456)" },
    [O_MAX_DEPTH] = { "max-depth", K_POSITIVE, "N",
                      "deepest accepted JSON nesting (default 1000, at most 4096)" },
    [O_ALL] = { "all", K_FLAG, NULL, "one line per shard" },
    [O_ALL_FAILED] = { "all-failed", K_FLAG, NULL, "requeue every failed shard" },
    [O_SHARD_ID] = { "shard-id", K_STRV, "ID", "requeue this shard (repeatable)" },
    [O_OUTPUT] = { "output", K_STR, "PATH", "merged output (default <job-dir>/merged.jsonl)" },
    [O_OVERWRITE] = { "overwrite", K_FLAG, NULL, "replace an existing output atomically" },
    [O_EXPECT_NODES] = { "expect-nodes", K_POSITIVE, "N",
                         "fail unless at least N distinct nodes completed shards" },
    [O_NODE] = { "node", K_STR, "NAME", "this worker's node name (default: the host name)" },
    [O_MAX_SHARDS] = { "max-shards", K_POSITIVE, "N", "stop after handling N claims" },
    [O_LEASE_SECS] = { "lease-secs", K_POSITIVE, "N",
                       "lease of a claim, renewed every N/4 seconds (default 60)" },
    [O_MAX_INFRA] = { "max-infra-failures", K_POSITIVE, "N",
                      "infrastructure failures a shard may see before it fails (default 10)" },
    [O_PROCESSOR] = { "processor", K_STR, "CMD",
                      "processor command, split on blanks (default dj-process); prepare asks it "
                      "for the Data-Juicer version" },
    [O_ATTEMPT_TIMEOUT] = { "attempt-timeout-secs", K_POSITIVE, "N",
                            "kill an attempt's process group after N seconds" },
    [O_VERBOSE] = { "verbose", K_FLAG, NULL, "copy attempts' output to standard error" },
    [O_ALLOW_MISMATCH] = { "allow-version-mismatch", K_FLAG, NULL,
                           "run even if this node's Data-Juicer differs from the job's" },
    [O_JSON] = { "json", K_FLAG, NULL, "print the raw result as JSON" },
    [O_LOCAL] = { "local", K_FLAG, NULL, "run in-process on the job directory, without esd" },
    [O_SOCKET] = { "socket", K_STR, "PATH", "esd's control socket (default /run/esd/esd.sock)" },
};

#define LIMITS (OPT(O_MAX_LINE_BYTES) | OPT(O_MAX_DEPTH))

const struct cmd_def esctl_cmds[] = {
    { "prepare", "--config PATH --job-dir DIR --num-shards N [options]",
      "validate a recipe and a JSONL dataset and split it into a job directory",
      OPT(O_CONFIG) | OPT(O_DATASET_PATH) | OPT(O_JOB_DIR) | OPT(O_NUM_SHARDS) |
          OPT(O_LOCK_TIMEOUT) | OPT(O_MAX_RETRIES) | OPT(O_POLL_INTERVAL) | OPT(O_RAY_ADDRESS) |
          OPT(O_DJ_ROOT) | OPT(O_PROCESSOR) | OPT(O_ALLOW_OP) | OPT(O_DENY_OP) | LIMITS,
      OPT(O_CONFIG) | OPT(O_JOB_DIR) | OPT(O_NUM_SHARDS), false, false, local_prepare, NULL },
    { "ping", "", "check that esd answers on its control socket", 0, 0, false, false, NULL,
      remote_ping },
    { "status", "[[--job-dir] DIR [--all] [--lock-timeout-secs N]]",
      "without a job: the daemon's jobs and slots; with one: the state of every shard",
      OPT(O_JOB_DIR) | OPT(O_ALL) | OPT(O_LOCK_TIMEOUT), 0, true, true, local_status,
      remote_status },
    { "retry", "[--job-dir] DIR (--all-failed | --shard-id ID ...)",
      "requeue terminally failed shards",
      OPT(O_JOB_DIR) | OPT(O_ALL_FAILED) | OPT(O_SHARD_ID), OPT(O_JOB_DIR), true, false,
      local_retry, NULL },
    { "merge", "[--job-dir] DIR [--output PATH] [--overwrite]",
      "check every shard's result and merge them in the original order",
      OPT(O_JOB_DIR) | OPT(O_OUTPUT) | OPT(O_OVERWRITE) | OPT(O_LOCK_TIMEOUT) | LIMITS,
      OPT(O_JOB_DIR), true, false, local_merge, NULL },
    { "worker", "[--job-dir] DIR [--node NAME] [--max-shards N] [options]",
      "claim and process shards until the job is terminal (local mode only)",
      OPT(O_JOB_DIR) | OPT(O_NODE) | OPT(O_MAX_SHARDS) | OPT(O_LEASE_SECS) | OPT(O_LOCK_TIMEOUT) |
          OPT(O_MAX_RETRIES) | OPT(O_MAX_INFRA) | OPT(O_POLL_INTERVAL) | OPT(O_RAY_ADDRESS) |
          OPT(O_PROCESSOR) | OPT(O_DJ_ROOT) | OPT(O_ATTEMPT_TIMEOUT) | OPT(O_VERBOSE) |
          OPT(O_ALLOW_MISMATCH) | LIMITS,
      OPT(O_JOB_DIR), true, false, local_worker, NULL },
    { "verify", "[--job-dir] DIR [--expect-nodes N]",
      "recheck every shard's result (and the merged output) without writing",
      OPT(O_JOB_DIR) | OPT(O_EXPECT_NODES) | OPT(O_LOCK_TIMEOUT) | LIMITS, OPT(O_JOB_DIR), true,
      true, local_verify, NULL },
};

const size_t esctl_ncmds = sizeof(esctl_cmds) / sizeof(esctl_cmds[0]);
