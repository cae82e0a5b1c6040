/*
 * output: what esctl shows a human: errors and warnings on stderr, a
 * progress line on a terminal, aligned tables, and colour only on a
 * terminal and never with NO_COLOR.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "esctl.h"
#include "json.h"

void
out_error(const char *fmt, ...)
{
    va_list ap;

    fputs("esctl: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

void
out_warning(const char *fmt, ...)
{
    va_list ap;

    fputs("WARNING: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
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
            "########################", width - fill, "........................", frac * 100,
            sdone, stotal, rate, (unsigned long long)rows, eta);
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

void
out_json(const cJSON *result)
{
    struct buf b;

    buf_init(&b);
    json_dump(result, JSON_PRETTY, &b);
    fwrite(b.p, 1, b.len, stdout);
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
