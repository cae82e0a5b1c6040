/*
 * log: journald through sd_journal_sendv with esd's fields, or one line on
 * stderr with a timestamp, the level and the same fields. The message and
 * every field value are escaped (str_escape): a line is always one line.
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

/* Appends "<name>=<escaped value>" as one journal field. */
static void
field(struct buf *b, const char *name, const char *value)
{
    buf_puts(b, name);
    buf_putc(b, '=');
    str_escape(value, strlen(value), b);
}

void
log_msg(int level, const struct log_ctx *ctx, const char *fmt, ...)
{
    char msg[4096];
    va_list ap;
    struct buf m;
    const char *job = ctx ? ctx->job : NULL, *shard = ctx ? ctx->shard : NULL;

    if (level > max_level)
        return;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    /*
     * Ids, paths, errors and processor output in a message come from job
     * files, peers and clients. Escaped here, after formatting, none of
     * their bytes can end the line early (forging a next line) or act on
     * the terminal of whoever reads the log.
     */
    buf_init(&m);
    str_escape(msg, strlen(msg), &m);
    if (to_journal) {
        struct buf f[7];
        struct iovec iov[7];
        int n = 0;

        for (int i = 0; i < 7; i++)
            buf_init(&f[i]);
        field(&f[n++], "MESSAGE", m.p);
        buf_printf(&f[n++], "PRIORITY=%d", level);
        buf_puts(&f[n++], "SYSLOG_IDENTIFIER=esd");
        field(&f[n++], "ESD_NODE", node);
        if (job)
            field(&f[n++], "ESD_JOB", job);
        if (shard)
            field(&f[n++], "ESD_SHARD", shard);
        if (ctx && ctx->attempt)
            buf_printf(&f[n++], "ESD_ATTEMPT=%lld", ctx->attempt);
        for (int i = 0; i < n; i++) {
            iov[i].iov_base = f[i].p;
            iov[i].iov_len = f[i].len;
        }
        n = sd_journal_sendv(iov, n);
        for (int i = 0; i < 7; i++)
            buf_free(&f[i]);
        /* A journald that is gone drops the line: stderr still has it. */
        if (n >= 0) {
            buf_free(&m);
            return;
        }
    }
    {
        char ts[32];
        struct timespec now;
        struct tm tm;
        struct buf line;

        clock_gettime(CLOCK_REALTIME, &now);
        localtime_r(&now.tv_sec, &tm);
        strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
        buf_init(&line);
        buf_printf(&line, "%s.%03ld esd ", ts, now.tv_nsec / 1000000);
        str_escape(node, strlen(node), &line);
        buf_printf(&line, " %s", level_names[level]);
        if (job || shard || (ctx && ctx->attempt)) {
            buf_puts(&line, " [");
            str_escape(job ? job : "-", strlen(job ? job : "-"), &line);
            if (shard || ctx->attempt) {
                buf_putc(&line, ' ');
                str_escape(shard ? shard : "-", strlen(shard ? shard : "-"), &line);
            }
            if (ctx->attempt)
                buf_printf(&line, "#%lld", ctx->attempt);
            buf_putc(&line, ']');
        }
        buf_printf(&line, ": %s\n", m.p);
        fwrite(line.p, 1, line.len, stderr);
        buf_free(&line);
    }
    buf_free(&m);
}
