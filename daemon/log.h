/*
 * log: where esd says what it does: journald with structured fields when it
 * runs under systemd (ESD_NODE, ESD_JOB, ESD_SHARD, ESD_ATTEMPT, PRIORITY,
 * SYSLOG_IDENTIFIER=esd), stderr in the foreground. One line per decision:
 * the module that decides logs it, once.
 */
#ifndef ESD_LOG_H
#define ESD_LOG_H

#include "config.h"

/* What a line is about; every field may be NULL/0. */
struct log_ctx {
    const char *job;     /* job id */
    const char *shard;   /* shard id */
    long long attempt;   /* attempt number, 0: none */
};

/* Chooses the target (auto: journald if started by systemd, i.e. with
 * JOURNAL_STREAM or INVOCATION_ID set; foreground forces stderr). */
void log_init(enum log_target target, int level, bool foreground, const char *node);
void log_set_level(int level);
void log_set_node(const char *node);
/* The target in use: "journal" or "stderr". */
const char *log_target_name(void);

void log_msg(int level, const struct log_ctx *ctx, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define log_err(ctx, ...) log_msg(LOG_LVL_ERR, ctx, __VA_ARGS__)
#define log_warning(ctx, ...) log_msg(LOG_LVL_WARNING, ctx, __VA_ARGS__)
#define log_notice(ctx, ...) log_msg(LOG_LVL_NOTICE, ctx, __VA_ARGS__)
#define log_info(ctx, ...) log_msg(LOG_LVL_INFO, ctx, __VA_ARGS__)
#define log_debug(ctx, ...) log_msg(LOG_LVL_DEBUG, ctx, __VA_ARGS__)

/* Parses "err", "warning", "notice", "info", "debug"; -1 if none. */
int log_level_parse(const char *name);

#endif
