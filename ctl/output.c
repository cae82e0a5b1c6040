/*
 * output: what esctl shows a human: errors and warnings on stderr, a
 * progress line on a terminal, aligned tables, and colour as --color and
 * NO_COLOR say (esctl.c); and --json documents, kept free of raw control
 * characters too.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "esctl.h"
#include "json.h"

/* prefix, then the formatted message escaped (str_escape), then a newline:
 * messages carry ids, paths and errors from esd and job files. */
static void
say(const char *prefix, const char *fmt, va_list ap)
{
    char msg[ESD_ERR_MAX + 1024];
    struct buf b;

    vsnprintf(msg, sizeof(msg), fmt, ap);
    buf_init(&b);
    buf_puts(&b, prefix);
    str_escape(msg, strlen(msg), &b);
    buf_putc(&b, '\n');
    fwrite(b.p, 1, b.len, stderr);
    buf_free(&b);
}

void
out_error(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    say("esctl: ", fmt, ap);
    va_end(ap);
}

void
out_warning(const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    say("WARNING: ", fmt, ap);
    va_end(ap);
}

static double progress_last = -1;
static bool progress_shown;
/* Rates and ETAs are per phase ("scan", "write", …). */
static char phase_what[16];
static double phase_start;

void
out_progress(struct call *c, const char *what, uint64_t done, uint64_t total, uint64_t rows,
             double elapsed, bool force)
{
    char sdone[32], stotal[32], eta[48] = "";
    double frac = total ? (double)done / (double)total : 0, rate;
    int width = 24, fill;

    if (!c->tty_err || c->json)
        return;
    if (!str_clean(what, strlen(what)))
        what = "?"; /* a phase name esd did not write */
    if (strncmp(phase_what, what, sizeof(phase_what) - 1) != 0) {
        snprintf(phase_what, sizeof(phase_what), "%s", what);
        phase_start = elapsed;
        force = true;
    }
    if (!force && progress_last >= 0 && elapsed - progress_last < 0.1)
        return;
    progress_last = elapsed;
    elapsed -= phase_start;
    if (frac > 1)
        frac = 1;
    fill = (int)(frac * width + 0.5);
    fmt_size(done, sdone);
    fmt_size(total, stotal);
    rate = elapsed > 0 ? (double)done / elapsed / 1e6 : 0;
    if (rate > 0 && done < total) {
        char d[32];
        fmt_duration((double)(total - done) / (rate * 1e6), d);
        snprintf(eta, sizeof(eta), " ETA %s", d);
    }
    fprintf(stderr, "\r\033[K%-7s [%.*s%.*s] %3.0f%% %s/%s %.1f MB/s %llu rows%s", what, fill,
            "########################", width - fill, "........................", frac * 100, sdone,
            stotal, rate, (unsigned long long)rows, eta);
    fflush(stderr);
    progress_shown = true;
}

void
out_progress_end(struct call *c)
{
    if (progress_shown) {
        fputs("\r\033[K", stderr);
        fflush(stderr);
        progress_shown = false;
    }
    progress_last = -1;
    phase_what[0] = '\0';
}

void
out_count(double v, char out[32])
{
    static const char unit[] = "kMGTP";
    int u = -1;

    while (v >= 999.95 && u + 1 < (int)sizeof(unit) - 1) {
        v /= 1000;
        u++;
    }
    if (u < 0)
        snprintf(out, 32, "%.0f", v);
    else
        snprintf(out, 32, "%.1f%c", v, unit[u]);
}

/*
 * Writes the JSON text b to stdout with what json_dump leaves raw and a
 * terminal could act on made \u escapes: DEL and the C1 controls (in UTF-8
 * C2 80..C2 9F), which JSON allows raw, and each byte that is not
 * well-formed UTF-8, which JSON does not allow at all (U+FFFD). Outside
 * strings JSON text is ASCII, so every such byte is inside a string.
 */
static void
json_out(const struct buf *b)
{
    struct buf o;
    size_t i = 0, start = 0;

    buf_init(&o);
    while (i < b->len) {
        unsigned char ch = (unsigned char)b->p[i], next;
        /* the length a character starting with ch has, if well-formed */
        size_t run = ch < 0xc2 ? 1 : ch < 0xe0 ? 2 : ch < 0xf0 ? 3 : 4;

        if (run > b->len - i)
            run = b->len - i;
        if (ch == '\n' || str_clean(b->p + i, run)) {
            i += run;
            continue;
        }
        buf_append(&o, b->p + start, i - start);
        next = run > 1 ? (unsigned char)b->p[i + 1] : 0;
        if (ch == 0xc2 && run == 2 && next >= 0x80 && next < 0xa0) {
            buf_printf(&o, "\\u%04x", next);
            i += 2;
        } else {
            buf_puts(&o, ch == 0x7f ? "\\u007f" : "\\ufffd");
            i++;
        }
        start = i;
    }
    buf_append(&o, b->p + start, b->len - start);
    fwrite(o.p, 1, o.len, stdout);
    buf_free(&o);
}

void
out_json(const cJSON *result)
{
    struct buf b;

    buf_init(&b);
    json_dump(result, JSON_PRETTY, &b);
    json_out(&b);
    buf_free(&b);
}

void
out_json_line(const cJSON *result)
{
    struct buf b;

    buf_init(&b);
    json_dump(result, JSON_COMPACT, &b);
    buf_putc(&b, '\n');
    json_out(&b);
    buf_free(&b);
}

const char *
out_color(const struct call *c, const char *state)
{
    if (!c->color || !state)
        return "";
    if (!strcmp(state, "done"))
        return "\033[32m";
    if (!strcmp(state, "failed"))
        return "\033[31m";
    if (!strcmp(state, "running"))
        return "\033[36m";
    if (!strcmp(state, "stale"))
        return "\033[33m";
    return "";
}

const char *
out_reset(const struct call *c)
{
    return c->color ? "\033[0m" : "";
}

void
table_init(struct table *t, size_t ncols)
{
    memset(t, 0, sizeof(*t));
    t->ncols = ncols;
}

void
table_add(struct table *t, const char *color, ...)
{
    va_list ap;

    t->cells = xrealloc(t->cells, (t->nrows + 1) * t->ncols * sizeof(char *));
    t->colors = xrealloc(t->colors, (t->nrows + 1) * sizeof(char *));
    va_start(ap, color);
    for (size_t i = 0; i < t->ncols; i++) {
        const char *s = va_arg(ap, const char *);
        t->cells[t->nrows * t->ncols + i] = xstrdup(s ? s : "");
    }
    va_end(ap);
    t->colors[t->nrows] = color ? color : "";
    t->nrows++;
}

void
table_print(const struct call *c, struct table *t)
{
    size_t *w = xcalloc(t->ncols, sizeof(size_t));

    for (size_t r = 0; r < t->nrows; r++)
        for (size_t i = 0; i < t->ncols; i++) {
            size_t n = strlen(t->cells[r * t->ncols + i]);
            if (n > w[i])
                w[i] = n;
        }
    for (size_t r = 0; r < t->nrows; r++) {
        bool colored = *t->colors[r] != '\0';

        size_t last = t->ncols;

        /* no padding after the last non-empty cell */
        while (last > 1 && !*t->cells[r * t->ncols + last - 1])
            last--;
        fputs(t->colors[r], stdout);
        for (size_t i = 0; i < last; i++) {
            const char *cell = t->cells[r * t->ncols + i];
            if (i + 1 == last)
                fputs(cell, stdout);
            else
                printf("%-*s  ", (int)w[i], cell);
        }
        if (colored)
            fputs(out_reset(c), stdout);
        fputc('\n', stdout);
    }
    free(w);
}

void
table_free(struct table *t)
{
    for (size_t i = 0; i < t->nrows * t->ncols; i++)
        free(t->cells[i]);
    free(t->cells);
    free(t->colors);
    memset(t, 0, sizeof(*t));
}
