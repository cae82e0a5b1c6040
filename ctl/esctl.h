/*
 * esctl: the operator's command line. One command table (ctl/commands.c)
 * drives parsing, usage, help and dispatch; local mode (ctl/local.c,
 * ctl/worker.c) runs the job-directory engine of libesd in-process; ctl/output.c renders
 * tables, progress bars and colour for humans.
 */
#ifndef ESCTL_H
#define ESCTL_H

#include <stdbool.h>
#include <stdint.h>

#include "util.h"

/* Exit codes (esctl(1)). */
enum {
    EXIT_OK = 0,
    EXIT_INCOMPLETE = 1,
    EXIT_ERROR = 2,
    EXIT_UNREACHABLE = 3,
    EXIT_DENIED = 4,
};

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
    O_MAX_LINE_BYTES,
    O_MAX_DEPTH,
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
    O_JSON,
    O_LOCAL,
    O_SOCKET,
    O__COUNT
};

enum opt_kind {
    K_FLAG,     /* --x */
    K_STR,      /* --x VALUE */
    K_STRV,     /* --x VALUE, repeatable */
    K_POSITIVE, /* integer > 0 */
    K_NONNEG,   /* integer >= 0 */
};

struct opt_def {
    const char *name; /* without the leading "--" */
    enum opt_kind kind;
    const char *metavar;
    const char *help;
};

#define OPT(o) ((uint64_t)1 << (o))

struct call;

struct cmd_def {
    const char *name;
    const char *args;    /* synopsis of the arguments, for usage */
    const char *summary; /* one line */
    uint64_t opts;       /* options it accepts */
    uint64_t required;   /* options it needs */
    bool positional_job; /* a lone positional argument is --job-dir */
    bool reads_only;     /* falls back to local mode when esd is unreachable */
    int (*local)(struct call *c);  /* in-process; NULL: through the daemon only */
    int (*remote)(struct call *c); /* through esd; NULL: local mode only */
};

/* Parsed arguments of one invocation. */
struct call {
    const struct cmd_def *cmd;
    bool set[O__COUNT];
    const char *str[O__COUNT];
    long long num[O__COUNT];
    struct strv multi[O__COUNT];
    bool json;
    bool tty_out; /* stdout is a terminal */
    bool tty_err; /* stderr is a terminal (progress) */
    bool color;
};

extern const struct opt_def esctl_opts[O__COUNT];
extern const struct cmd_def esctl_cmds[];
extern const size_t esctl_ncmds;

/* Local-mode handlers (ctl/local.c). */
int local_prepare(struct call *c);
int local_status(struct call *c);
int local_retry(struct call *c);
int local_merge(struct call *c);
int local_verify(struct call *c);
int local_worker(struct call *c);
/* --max-line-bytes and --max-depth over the defaults. */
struct jsonl_limits;
void limits_from(const struct call *c, struct jsonl_limits *lim);

/* The daemon's control socket (ctl/client.c). */
#define ESD_SOCKET_DEFAULT "/run/esd/esd.sock"
struct cJSON;
const char *client_socket_path(const struct call *c);
/*
 * Sends cmd (args taken over, may be NULL) and waits at most timeout
 * seconds for its reply (*ret_reply, the whole reply object: the caller
 * checks "ok"); event gets every progress line before it. Returns 0, or a
 * negative errno when esd cannot be reached or talked to (err says why).
 */
int client_call(const struct call *c, const char *cmd, struct cJSON *args, double timeout,
                void (*event)(void *ctx, const struct cJSON *ev), void *ctx,
                struct cJSON **ret_reply, struct esd_err *err);

/* Daemon commands (ctl/remote.c). */
int remote_ping(struct call *c);
int remote_status(struct call *c);

/* Output helpers (ctl/output.c). */
void out_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void out_warning(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A progress line on stderr (terminal only), redrawn at most 10 times a
 * second unless force; done/total in bytes. */
void out_progress(struct call *c, const char *what, uint64_t done, uint64_t total, uint64_t rows,
                  double elapsed, bool force);
void out_progress_end(struct call *c);
/* Colour escape for a state name, or "" (no colour / not a terminal). */
const char *out_color(const struct call *c, const char *state);
const char *out_reset(const struct call *c);

/* A simple text table: add rows of cells, then print aligned. */
struct table {
    size_t ncols;
    size_t nrows;
    char **cells; /* nrows * ncols, owned */
    const char **colors; /* per row, may be "" */
};
void table_init(struct table *t, size_t ncols);
void table_add(struct table *t, const char *color, ...); /* ncols strings */
void table_print(const struct call *c, struct table *t);
void table_free(struct table *t);

#endif
