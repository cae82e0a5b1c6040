/*
 * log: where esd says what it does: journald with structured fields when it
 * runs under systemd (ESD_NODE, ESD_JOB, ESD_JOB_DIR, ESD_SHARD,
 * ESD_ATTEMPT, PRIORITY, SYSLOG_IDENTIFIER=esd, and MESSAGE_ID for the
 * events of msgid.h), stderr in the foreground. Every message about a job
 * starts with "[<job> <shard>#<attempt>] " in both targets. The
 * processor's own output that esd forwards has the identifier
 * esd-processor instead of esd. One line per decision: the module that
 * decides logs it, once.
 */
#ifndef ESD_LOG_H
#define ESD_LOG_H

#include "config.h"

/* How a job is named in the log; owned by whoever embeds it (struct job). */
struct log_job {
    char *name; /* the text's "[<name> ...]": the job directory's basename */
    char *id;   /* ESD_JOB: manifest_log_id() of the directory */
    char *dir;  /* ESD_JOB_DIR: the resolved job directory */
};

/* What a line is about; every field may be NULL/0. */
struct log_ctx {
    const struct log_job *job;
    const char *shard; /* shard id */
    long long attempt; /* attempt number, 0: none */
};

/* Fills *lj for the resolved directory dir; log_job_free() frees it. */
void log_job_init(struct log_job *lj, const char *dir);
void log_job_free(struct log_job *lj);

/* Chooses the target (auto: journald if started by systemd, i.e. with
 * JOURNAL_STREAM or INVOCATION_ID set; foreground forces stderr). */
void log_init(enum log_target target, int level, bool foreground, const char *node);
void log_set_level(int level);
void log_set_node(const char *node);
/* The target in use: "journal" or "stderr". */
const char *log_target_name(void);

void log_msg(int level, const struct log_ctx *ctx, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* log_msg for an event of msgid.h: in the journal with MESSAGE_ID=msgid. */
void log_event(int level, const struct log_ctx *ctx, const char *msgid, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* One line of the processor's output: SYSLOG_IDENTIFIER=esd-processor
 * (on stderr "esd-processor" in place of "esd"), at LOG_LVL_INFO. */
void log_processor(const struct log_ctx *ctx, const char *line, size_t len);

#define log_err(ctx, ...) log_msg(LOG_LVL_ERR, ctx, __VA_ARGS__)
#define log_warning(ctx, ...) log_msg(LOG_LVL_WARNING, ctx, __VA_ARGS__)
#define log_notice(ctx, ...) log_msg(LOG_LVL_NOTICE, ctx, __VA_ARGS__)
#define log_info(ctx, ...) log_msg(LOG_LVL_INFO, ctx, __VA_ARGS__)
#define log_debug(ctx, ...) log_msg(LOG_LVL_DEBUG, ctx, __VA_ARGS__)

/* Parses "err", "warning", "notice", "info", "debug"; -1 if none. */
int log_level_parse(const char *name);

#endif
