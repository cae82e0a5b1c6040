/*
 * log: journald through sd_journal_sendv with esd's fields, or one line on
 * stderr with a timestamp, the identifier, the node and the level. In both
 * the message starts with what it is about, "[<job> <shard>#<attempt>] ".
 * The message and every field value are escaped (str_escape): a line is
 * always one line.
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

#include "fsutil.h"
#include "manifest.h"

static bool to_journal;
static int max_level = LOG_LVL_INFO;
static char node[256] = "";

static const char *const level_names[] = {
    [LOG_LVL_ERR] = "err",   [LOG_LVL_WARNING] = "warning", [LOG_LVL_NOTICE] = "notice",
    [LOG_LVL_INFO] = "info", [LOG_LVL_DEBUG] = "debug",
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

void
log_job_init(struct log_job *lj, const char *dir)
{
    lj->name = xstrdup(fs_basename(dir));
    lj->id = manifest_log_id(dir);
    lj->dir = xstrdup(dir);
}

void
log_job_free(struct log_job *lj)
{
    free(lj->name);
    free(lj->id);
    free(lj->dir);
    lj->name = lj->id = lj->dir = NULL;
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

/* Appends "[<job> <shard>#<attempt>] " (the parts ctx has; nothing
 * without any), escaped. */
static void
prefix(struct buf *b, const struct log_ctx *ctx)
{
    const char *job = ctx && ctx->job ? ctx->job->name : NULL, *shard = ctx ? ctx->shard : NULL;

    if (!job && !shard && !(ctx && ctx->attempt))
        return;
    buf_putc(b, '[');
    str_escape(job ? job : "-", strlen(job ? job : "-"), b);
    if (shard || ctx->attempt) {
        buf_putc(b, ' ');
        str_escape(shard ? shard : "-", strlen(shard ? shard : "-"), b);
    }
    if (ctx->attempt)
        buf_printf(b, "#%lld", ctx->attempt);
    buf_puts(b, "] ");
}

#define NFIELDS 10

/* Sends the line to journald; false if it is gone (the line still goes to
 * stderr then). */
static bool
send_journal(int level, const struct log_ctx *ctx, const char *ident, const char *msgid,
             const struct buf *m)
{
    const struct log_job *job = ctx ? ctx->job : NULL;
    struct buf f[NFIELDS];
    struct iovec iov[NFIELDS];
    int n = 0, r;

    for (int i = 0; i < NFIELDS; i++)
        buf_init(&f[i]);
    buf_puts(&f[n], "MESSAGE=");
    buf_append(&f[n], m->p, m->len);
    n++;
    buf_printf(&f[n++], "PRIORITY=%d", level);
    buf_printf(&f[n++], "SYSLOG_IDENTIFIER=%s", ident);
    if (msgid)
        buf_printf(&f[n++], "MESSAGE_ID=%s", msgid);
    field(&f[n++], "ESD_NODE", node);
    if (job) {
        field(&f[n++], "ESD_JOB", job->id);
        field(&f[n++], "ESD_JOB_DIR", job->dir);
    }
    if (ctx && ctx->shard)
        field(&f[n++], "ESD_SHARD", ctx->shard);
    if (ctx && ctx->attempt)
        buf_printf(&f[n++], "ESD_ATTEMPT=%lld", ctx->attempt);
    for (int i = 0; i < n; i++) {
        iov[i].iov_base = f[i].p;
        iov[i].iov_len = f[i].len;
    }
    r = sd_journal_sendv(iov, n);
    for (int i = 0; i < NFIELDS; i++)
        buf_free(&f[i]);
    return r >= 0;
}

static void
emit(int level, const struct log_ctx *ctx, const char *ident, const char *msgid, const char *text,
     size_t len)
{
    struct buf m;

    /*
     * Ids, paths, errors and processor output in a message come from job
     * files, peers and clients. Escaped here, after formatting, none of
     * their bytes can end the line early (forging a next line) or act on
     * the terminal of whoever reads the log.
     */
    buf_init(&m);
    prefix(&m, ctx);
    str_escape(text, len, &m);
    if (!to_journal || !send_journal(level, ctx, ident, msgid, &m)) {
        char ts[32];
        struct timespec now;
        struct tm tm;
        struct buf line;

        clock_gettime(CLOCK_REALTIME, &now);
        localtime_r(&now.tv_sec, &tm);
        strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
        buf_init(&line);
        buf_printf(&line, "%s.%03ld %s ", ts, now.tv_nsec / 1000000, ident);
        str_escape(node, strlen(node), &line);
        buf_printf(&line, " %s: %s\n", level_names[level], m.p);
        fwrite(line.p, 1, line.len, stderr);
        buf_free(&line);
    }
    buf_free(&m);
}

static void
vlog(int level, const struct log_ctx *ctx, const char *msgid, const char *fmt, va_list ap)
{
    char msg[4096];

    if (level > max_level)
        return;
    vsnprintf(msg, sizeof(msg), fmt, ap);
    emit(level, ctx, "esd", msgid, msg, strlen(msg));
}

void
log_msg(int level, const struct log_ctx *ctx, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vlog(level, ctx, NULL, fmt, ap);
    va_end(ap);
}

void
log_event(int level, const struct log_ctx *ctx, const char *msgid, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vlog(level, ctx, msgid, fmt, ap);
    va_end(ap);
}

void
log_processor(const struct log_ctx *ctx, const char *line, size_t len)
{
    if (LOG_LVL_INFO <= max_level)
        emit(LOG_LVL_INFO, ctx, "esd-processor", NULL, line, len);
}
