/*
 * cmds: the one command table. esctl parses its command line, prints its
 * usage, help and bash completion from it; esd dispatches control requests,
 * authorises them and checks their arguments against it; the man page test
 * and the completion test read it through `esctl --help`.
 *
 * A command's options are also its request arguments: option --num-shards
 * is the member "num_shards" of the request's "args" (dashes become
 * underscores), a flag is a JSON boolean, a string option a string, a
 * repeatable option an array of strings, a number option an integer. The
 * positional job directory is "job_dir".
 */
#ifndef ESD_CMDS_H
#define ESD_CMDS_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "util.h"

enum opt_id {
    O_CONFIG,
    O_DATASET_PATH,
    O_JOB_DIR,
    O_NUM_SHARDS,
    O_LOCK_TIMEOUT,
    O_MAX_RETRIES,
    O_POLL_INTERVAL,
    O_RAY_ADDRESS,
    O_DJ_ROOT,
    O_ALLOW_OP,
    O_DENY_OP,
    O_NO_GLOBAL_STAGE,
    O_MAX_LINE_BYTES,
    O_MAX_DEPTH,
    O_THREADS,
    O_ALL,
    O_ALL_FAILED,
    O_SHARD_ID,
    O_OUTPUT,
    O_OVERWRITE,
    O_EXPECT_NODES,
    O_NODE,
    O_MAX_SHARDS,
    O_LEASE_SECS,
    O_MAX_INFRA,
    O_PROCESSOR,
    O_ATTEMPT_TIMEOUT,
    O_VERBOSE,
    O_ALLOW_MISMATCH,
    O_SHARD,
    O_FOLLOW,
    O_WATCH,
    O_EVERYWHERE,
    O_RELEASE,
    O_WAIT,
    O_LINES,
    O_NODES,
    O_WAIT_SECS,
    O_RUN,
    O_STATE,
    O_SORT,
    O_ATTEMPT,
    O_TIMEOUT_SECS,
    /* Global options of esctl: never request arguments. */
    O_JSON,
    O_LOCAL,
    O_SOCKET,
    O_COLOR,
    O__COUNT
};

#define OPT(o) ((uint64_t)1 << (o))
#define OPT_GLOBAL (OPT(O_JSON) | OPT(O_LOCAL) | OPT(O_SOCKET) | OPT(O_COLOR))

enum opt_kind {
    K_FLAG,     /* --x; JSON true/false */
    K_STR,      /* --x VALUE; JSON string */
    K_STRV,     /* --x VALUE, repeatable; JSON array of strings */
    K_POSITIVE, /* integer > 0 */
    K_NONNEG,   /* integer >= 0 */
};

struct opt_def {
    const char *name; /* without the leading "--" */
    enum opt_kind kind;
    const char *metavar;
    const char *help;
    const char *key;   /* request argument: name with '-' as '_' */
    bool path;         /* the value is a file or directory (completion) */
    const char *alias; /* another spelling esctl accepts for it, or NULL */
};

enum cmd_id {
    CMD_PING,
    CMD_VERSION,
    CMD_SUBMIT,
    CMD_LIST,
    CMD_STATUS,
    CMD_WAIT,
    CMD_PREPARE,
    CMD_RETRY,
    CMD_MERGE,
    CMD_VERIFY,
    CMD_CANCEL,
    CMD_FORGET,
    CMD_DRAIN,
    CMD_RESUME,
    CMD_NODES,
    CMD_LOGS,
    CMD_CONFIG,
    CMD_WORKER,
    CMD_COMPLETION,
    CMD_FSCHECK,
    CMD_REPORT,
    CMD_RELOAD,
    CMD__COUNT
};

/* Who may run a command through esd (ARCHITECTURE.md "Security model"). */
enum cmd_auth {
    AUTH_READ, /* any peer that can connect */
    AUTH_NODE, /* root, or a member of the control group (esd's own uid only
                  when esd runs as root: otherwise its attempts run as it) */
    AUTH_JOB,  /* as AUTH_NODE or esd's own uid, and the caller owns the job
                  dir (or is root) */
};

/* Where a command runs. */
#define CMDF_DAEMON 0x01u /* esd answers it */
#define CMDF_LOCAL 0x02u  /* esctl can run it in-process (--local) */
#define CMDF_FALLBACK \
    0x04u                /* only reads a job dir: in-process, with a notice,
                               when esd cannot be reached */
#define CMDF_CHILD 0x08u /* esd runs it in a child process as the caller */
#define CMDF_LONG 0x10u  /* may take minutes; sends progress events */

struct cmd_def {
    enum cmd_id id;
    const char *name;
    const char *args;    /* synopsis of the arguments, for usage */
    const char *summary; /* one line */
    uint64_t opts;       /* options it accepts (global ones aside) */
    uint64_t required;   /* options it needs */
    bool positional_job; /* a lone positional argument is --job-dir */
    enum cmd_auth auth;
    unsigned flags; /* CMDF_* */
};

extern const struct opt_def cmd_opts[O__COUNT];
extern const struct cmd_def cmd_table[CMD__COUNT]; /* indexed by enum cmd_id */

/* The command called name, or NULL. */
const struct cmd_def *cmd_find(const char *name);

/* "read", "node", "job". */
const char *cmd_auth_name(enum cmd_auth a);

/*
 * Checks a request's args (may be NULL) against cmd: every member must be
 * an option of cmd with a value of its kind, every required option there.
 * Returns 0 or -EINVAL with err naming the member.
 */
int cmd_args_check(const struct cmd_def *cmd, const cJSON *args, struct esd_err *err);

/* Typed access to checked args (absent: the default / false / NULL). */
const char *cmd_arg_str(const cJSON *args, enum opt_id o);
bool cmd_arg_flag(const cJSON *args, enum opt_id o);
bool cmd_arg_has(const cJSON *args, enum opt_id o);
long long cmd_arg_num(const cJSON *args, enum opt_id o, long long dflt);
/* Appends the strings of a repeatable option to v. */
void cmd_arg_strv(const cJSON *args, enum opt_id o, struct strv *v);

#endif
