/*
 * log: journald through sd_journal_sendv with esd's fields, or one line on
 * stderr with a timestamp, the level and the same fields.
 */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <systemd/sd-journal.h>

static bool to_journal;
static int max_level = LOG_LVL_INFO;
static char node[256] = "";

static const char *const level_names[] = {
    [LOG_LVL_ERR] = "err",       [LOG_LVL_WARNING] = "warning", [LOG_LVL_NOTICE] = "notice",
    [LOG_LVL_INFO] = "info",     [LOG_LVL_DEBUG] = "debug",
};

int
log_level_parse(const char *name)
{
    for (int l = LOG_LVL_ERR; l <= LOG_LVL_DEBUG; l++)
        if (!strcmp(name, level_names[l]))
            return l;
    return -1;
}

void
log_init(enum log_target target, int level, bool foreground, const char *n)
{
    if (foreground || target == LOG_TARGET_STDERR)
        to_journal = false;
    else if (target == LOG_TARGET_JOURNAL)
        to_journal = true;
    else
        to_journal = getenv("JOURNAL_STREAM") || getenv("INVOCATION_ID");
    max_level = level;
    log_set_node(n);
}

void
log_set_level(int level)
{
    max_level = level;
}

void
log_set_node(const char *n)
{
    snprintf(node, sizeof(node), "%s", n ? n : "");
}

const char *
log_target_name(void)
{
    return to_journal ? "journal" : "stderr";
}

void
log_msg(int level, const struct log_ctx *ctx, const char *fmt, ...)
{
    char msg[4096];
    va_list ap;

    if (level > max_level)
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (to_journal) {
        char f[7][4200];
        struct iovec iov[7];
        int n = 0;

        snprintf(f[n++], sizeof(f[0]), "MESSAGE=%s", msg);
        snprintf(f[n++], sizeof(f[0]), "PRIORITY=%d", level);
        snprintf(f[n++], sizeof(f[0]), "SYSLOG_IDENTIFIER=esd");
        snprintf(f[n++], sizeof(f[0]), "ESD_NODE=%s", node);
        if (ctx && ctx->job)
            snprintf(f[n++], sizeof(f[0]), "ESD_JOB=%s", ctx->job);
        if (ctx && ctx->shard)
            snprintf(f[n++], sizeof(f[0]), "ESD_SHARD=%s", ctx->shard);
        if (ctx && ctx->attempt)
            snprintf(f[n++], sizeof(f[0]), "ESD_ATTEMPT=%lld", ctx->attempt);
        for (int i = 0; i < n; i++) {
            iov[i].iov_base = f[i];
            iov[i].iov_len = strlen(f[i]);
        }
        /* A journald that is gone drops the line: stderr still has it. */
        if (sd_journal_sendv(iov, n) >= 0)
            return;
    }
    {
        char ts[32], where[512] = "";
        struct timespec now;
        struct tm tm;

        clock_gettime(CLOCK_REALTIME, &now);
        localtime_r(&now.tv_sec, &tm);
        strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
        if (ctx && ctx->attempt)
            snprintf(where, sizeof(where), " [%s %s#%lld]", ctx->job ? ctx->job : "-",
                     ctx->shard ? ctx->shard : "-", ctx->attempt);
        else if (ctx && ctx->shard)
            snprintf(where, sizeof(where), " [%s %s]", ctx->job ? ctx->job : "-", ctx->shard);
        else if (ctx && ctx->job)
            snprintf(where, sizeof(where), " [%s]", ctx->job);
        fprintf(stderr, "%s.%03ld esd %s %s%s: %s\n", ts, now.tv_nsec / 1000000, node,
                level_names[level], where, msg);
    }
}
