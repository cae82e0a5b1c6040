/*
 * esctl: the operator's command line. The one command table (common/cmds.c)
 * drives parsing, usage and help (ctl/esctl.c) and bash completion
 * (ctl/completion.c). ctl/dispatch.c turns a parsed call into request
 * arguments and hands it on; ctl/call.c runs one request through esd
 * (ctl/client.c) or in-process (common/ops.c; ctl/worker.c runs the
 * worker); ctl/render.c shows a result the same way whichever ran it;
 * ctl/watch.c holds the loops that repeat a request (status --watch, drain
 * --wait), ctl/journal.c shows this node's journal for a job; ctl/output.c
 * draws tables, progress and colour. Each module uses only those listed
 * after it, and call.c none of the loops above it (make modcheck).
 */
#ifndef ESCTL_H
#define ESCTL_H

#include <stdbool.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "cmds.h"
#include "util.h"

/* Exit codes (esctl(1)). */
enum {
    EXIT_OK = 0,
    EXIT_INCOMPLETE = 1,
    EXIT_ERROR = 2,
    EXIT_UNREACHABLE = 3,
    EXIT_DENIED = 4,
    EXIT_INTERRUPTED = 130,
};

/* The values of --color (completion offers them). */
#define COLOR_WHENS "auto always never"

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
    bool color;   /* --color, else stdout a terminal, TERM not dumb, NO_COLOR unset or empty */
};

/* Running a parsed call (ctl/dispatch.c). */

/* Runs the parsed call c to its end; returns the exit code. */
int dispatch_run(struct call *c);

/* One request (ctl/call.c). */

/* Makes SIGINT, SIGTERM and SIGHUP set call_interrupted() (and cancel a
 * request in flight) instead of ending esctl. */
void call_catch_signals(void);

/* version: esctl's own version, and esd's when it can be reached.
 * Returns the exit code. */
int call_version(struct call *c);

/*
 * A --processor command with its program made absolute against the
 * working directory when it is a relative path (./proc, bin/proc: esd and
 * attempts run elsewhere); a bare name stays for the PATH lookup, and no
 * symbolic link is resolved (a venv's bin/python must stay itself).
 * Returns a new string.
 */
char *call_processor_abs(const char *cmd);

/*
 * One request: command id with args (not taken; may be NULL), in-process
 * when *local, else through esd. When esd cannot be reached and the
 * command may read the job directory itself (CMDF_FALLBACK and a job_dir),
 * says so on stderr, sets *local and runs it in-process. On success
 * *ret_result is the result (caller frees) and EXIT_OK is returned;
 * otherwise the failure has been shown (stderr, and stdout with --json)
 * and its exit code is returned.
 */
int call_do(struct call *c, enum cmd_id id, const cJSON *args, bool *local, cJSON **ret_result);

/* SIGINT, SIGTERM or SIGHUP arrived since call_catch_signals. */
bool call_interrupted(void);

/* The daemon's control socket (ctl/client.c). */
#define ESD_SOCKET_DEFAULT "/run/esd/esd.sock"
struct op_env;
/* --socket, else $ESD_SOCKET, else ESD_SOCKET_DEFAULT. */
const char *client_socket_path(const struct call *c);
/*
 * Sends command cmd with args (not taken; may be NULL) and waits for its
 * reply (*ret_reply, the whole reply object, caller frees: the caller
 * checks "ok"), at most timeout seconds (<= 0: no limit). Every event line
 * before the reply goes to env->event (which takes it); env->cancel, once
 * set, ends the wait. A reply line may hold up to PROTO_MAX_REPLY bytes.
 * Returns 0; the connect(2) error (-ENOENT, -ECONNREFUSED, -EACCES, ...)
 * when esd cannot be reached; -ETIMEDOUT, -ECONNRESET, -EPROTO or
 * -EMSGSIZE when it was reached but did not answer properly; -ECANCELED.
 * err says why.
 */
int client_call(const struct call *c, const char *cmd, const cJSON *args, double timeout,
                const struct op_env *env, cJSON **ret_reply, struct esd_err *err);

/* Rendering results (ctl/render.c): the same for local and daemon results. */

/*
 * Shows the result of command id (run with args) on stdout: pretty JSON
 * with --json, else the command's human text. Returns the exit code the
 * result means (status: op_status_exit; otherwise EXIT_OK).
 */
int render_result(struct call *c, enum cmd_id id, const cJSON *args, const cJSON *result);
/*
 * A failed operation: "esctl: <message>" on stderr, and with --json
 * {"ok": false, "code": code, "error": message} on stdout. Returns
 * EXIT_DENIED for "denied", else exit_code.
 */
int render_error(const struct call *c, const char *code, const char *message, int exit_code);
/* An event of a running operation (takes ev): "data" text to stdout,
 * "phase" progress to stderr (terminal only). */
void render_event(struct call *c, cJSON *ev);
/* The versions of esctl and (result of "version", NULL when unreachable,
 * then why says why) of esd. Returns the exit code. */
int render_version(struct call *c, const cJSON *result, const char *why);
/* One line on a job's progress for status --watch: a bar on a terminal
 * ("[#####.....] 340/1024 shards, 1.2M rows"), else a summary. */
void render_status_line(const struct call *c, const cJSON *result);
/* status --watch on a terminal: per node its done shards and the shards
 * it runs now (with their lock ages), then the shards that failed. */
void render_watch_nodes(struct call *c, const cJSON *result);

/* Client-side loops (ctl/watch.c); each returns the exit code. */

/* status --watch: repeats status every 2 s until the job is terminal. */
int watch_status(struct call *c, const cJSON *args, bool local);
/* wait: repeats the status of args' job (every 2 s through esd, 5 s in
 * process) until the job is merged (EXIT_OK), failed or cancelled
 * (EXIT_ERROR), --timeout-secs passed (EXIT_INCOMPLETE), or its directory
 * went or is no job (EXIT_ERROR with a message). */
int watch_wait(struct call *c, const cJSON *args, bool local);
/* drain --wait: polls esd's status every second until nothing runs. */
int watch_drain(struct call *c, const cJSON *drain_result);

/* logs without --shard: this node's journal for the job (ctl/journal.c).
 * Replaces esctl with journalctl; returns only on failure (exit code). */
int journal_show(struct call *c);

/* esctl completion: the bash completion script on stdout
 * (ctl/completion.c). Returns the exit code. */
int completion_print(void);

/* esctl worker (ctl/worker.c): claims and processes shards in-process. */
int worker_run(struct call *c);

/* esctl report (ctl/report.c): the job's HTML report. */
int report_run(struct call *c);

/* esctl fscheck (ctl/fscheck.c): the shared file system's verdict. */
int fscheck_cmd(struct call *c);

/* Output helpers (ctl/output.c). */
/* "esctl: <message>" / "WARNING: <message>" on stderr, the message
 * escaped (str_escape): it may carry what a job file or esd wrote. */
void out_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void out_warning(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A progress line on stderr (terminal only, never with --json), redrawn at
 * most 10 times a second unless force; done/total in bytes. */
void out_progress(struct call *c, const char *what, uint64_t done, uint64_t total, uint64_t rows,
                  double elapsed, bool force);
void out_progress_end(struct call *c);
/* Colour escape for a state name, or "" (no colour / not a terminal). */
const char *out_color(const struct call *c, const char *state);
const char *out_reset(const struct call *c);
/* A count for humans: "950", "12.3k", "1.2M", "3.4G". */
void out_count(double v, char out[32]);
/* result as pretty JSON on stdout; out_json_line: as one line (JSON
 * Lines). Both escape DEL and C1 controls as \u00XX and write U+FFFD for
 * bytes that are not UTF-8, so the text never holds a raw control. */
void out_json(const cJSON *result);
void out_json_line(const cJSON *result);

/* A simple text table: add rows of cells, then print aligned. */
struct table {
    size_t ncols;
    size_t nrows;
    char **cells;        /* nrows * ncols, owned */
    const char **colors; /* per row, may be "" */
};
void table_init(struct table *t, size_t ncols);
void table_add(struct table *t, const char *color, ...); /* ncols strings */
void table_print(const struct call *c, struct table *t);
void table_free(struct table *t);

#endif
