/*
 * report: esctl report DIR -o FILE, one self-contained HTML file of a job:
 * a timeline of every attempt per node and slot (inline SVG, a Gantt
 * chart), the job's rows a second over time (an SVG line) and a summary
 * (counts, durations, the slowest shards, the failures with their errors).
 * Nothing is loaded from anywhere: no script, no external style, font or
 * image, and a Content-Security-Policy that forbids them. Everything that
 * comes from the job directory is escaped (it is hostile input: a shard id
 * or an error may hold markup). Slots are not recorded: each node's
 * attempts are laid out on as few lanes as keep them from overlapping,
 * which is its slots in use.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "esctl.h"
#include "fsutil.h"
#include "history.h"
#include "json.h"
#include "manifest.h"
#include "proto.h"
#include "pypath.h"
#include "status.h"

/* Attempts drawn, failures and slow shards listed: a report of 100,000
 * shards stays a file a browser opens. */
#define REPORT_MAX_ATTEMPTS 20000
#define REPORT_MAX_FAILURES 100
#define REPORT_SLOWEST 10
#define REPORT_TEXT_MAX 500 /* bytes of an error shown */

/* Chart geometry (px). */
#define LABEL_W 170
#define CHART_W 900
#define ROW_H 18
#define AXIS_H 24
#define PACE_H 160
#define PACE_BUCKETS 60

struct rep_attempt {
    const char *shard; /* the manifest's */
    const struct history_attempt *a;
    double start, end; /* drawn (end: now for a running attempt) */
    size_t node;       /* index into nodes */
    size_t lane;
};

struct rep_node {
    char *name;
    size_t lanes, first_row;
    double *lane_end; /* per lane, while laying out */
};

struct report {
    struct manifest m;
    struct job_status st;
    struct history_shard *h; /* per shard, only while attempts remain under the bound */
    size_t nh;
    struct rep_attempt *v;
    size_t n, omitted;
    struct rep_node *nodes;
    size_t nnodes, rows;
    double t0, t1, now;
};

/* s escaped for HTML text and attribute values alike; control characters
 * (they have no place in a page) become U+FFFD; at most max bytes of s. */
static void
html_text(struct buf *b, const char *s, size_t max)
{
    size_t n = strlen(s);

    for (size_t i = 0; i < n && i < max; i++) {
        unsigned char ch = (unsigned char)s[i];

        switch (ch) {
        case '&':
            buf_puts(b, "&amp;");
            break;
        case '<':
            buf_puts(b, "&lt;");
            break;
        case '>':
            buf_puts(b, "&gt;");
            break;
        case '"':
            buf_puts(b, "&quot;");
            break;
        case '\'':
            buf_puts(b, "&#39;");
            break;
        default:
            if ((ch < 0x20 && ch != '\n' && ch != '\t') || ch == 0x7f)
                buf_puts(b, "\xef\xbf\xbd");
            else
                buf_putc(b, (char)ch);
        }
    }
    if (n > max)
        buf_puts(b, "...");
}

static void
html_time(struct buf *b, double t)
{
    time_t s = (time_t)t;
    struct tm tm;
    char out[40];

    if (t <= 0 || !gmtime_r(&s, &tm)) {
        buf_puts(b, "?");
        return;
    }
    strftime(out, sizeof(out), "%Y-%m-%d %H:%M:%S", &tm);
    buf_printf(b, "%s.%d UTC", out, (int)((t - (double)s) * 10));
}

/* The outcome's class in the page (and its colour). */
static const char *
outcome_class(const char *outcome)
{
    if (!strcmp(outcome, "done"))
        return "done";
    if (!strcmp(outcome, "failed"))
        return "failed";
    if (!strcmp(outcome, "taken over"))
        return "takenover";
    if (!strcmp(outcome, "running"))
        return "running";
    return "other";
}

static size_t
node_index(struct report *r, const char *name)
{
    size_t i;

    for (i = 0; i < r->nnodes && strcmp(r->nodes[i].name, name); i++)
        ;
    if (i == r->nnodes) {
        r->nodes = xrealloc(r->nodes, (r->nnodes + 1) * sizeof(*r->nodes));
        memset(&r->nodes[i], 0, sizeof(*r->nodes));
        r->nodes[i].name = xstrdup(name);
        r->nnodes++;
    }
    return i;
}

static int
cmp_start(const void *x, const void *y)
{
    const struct rep_attempt *a = x, *b = y;

    return (a->start > b->start) - (a->start < b->start);
}

static int
cmp_node_name(const void *x, const void *y)
{
    return strcmp(((const struct rep_node *)x)->name, ((const struct rep_node *)y)->name);
}

/* Reads the job and its attempts; lays the attempts out on lanes. */
static int
report_load(struct report *r, const char *dir, long long lock_timeout, struct esd_err *err)
{
    size_t cap = 0;
    int rc;

    r->now = time_wall();
    if ((rc = manifest_load(dir, &r->m, err)) < 0)
        return rc;
    if ((rc = status_compute(&r->m, lock_timeout, true, &r->st, err)) < 0)
        return rc;
    r->h = xcalloc(r->m.nshards + 1, sizeof(*r->h));
    /* the shards, then a global stage's pseudo-shard (its attempts drawn
     * as a shard's) */
    for (size_t i = 0; i < r->m.nshards + (r->st.global ? 1 : 0); i++) {
        struct history_shard *h = &r->h[i];
        const char *id = i < r->m.nshards ? r->m.shards[i].id : STATUS_GLOBAL_ID;

        if (r->n >= REPORT_MAX_ATTEMPTS) {
            r->omitted++; /* shards not read */
            continue;
        }
        if ((rc = history_read(&r->m, id, h, err)) < 0)
            return rc;
        r->nh = i + 1;
        for (size_t k = 0; k < h->n; k++) {
            const struct history_attempt *a = &h->v[k];
            struct rep_attempt *x;

            if (a->start <= 0)
                continue;
            if (r->n == cap) {
                cap = cap ? 2 * cap : 64;
                r->v = xrealloc(r->v, cap * sizeof(*r->v));
            }
            x = &r->v[r->n++];
            x->shard = id;
            x->a = a;
            x->start = a->start;
            x->end = a->end > 0                                   ? a->end
                     : a->elapsed >= 0                            ? a->start + a->elapsed
                     : a->status && !strcmp(a->status, "running") ? r->now
                                                                  : a->start;
            /* an end far past the recorded duration (a forged or skewed
             * record) is not believed */
            if (a->elapsed >= 0 && x->end > x->start + a->elapsed + 60)
                x->end = x->start + a->elapsed;
            /* a record from the future (a forged or skewed one) does not
             * stretch the chart */
            if (x->end > r->now)
                x->end = r->now > x->start ? r->now : x->start;
            if (x->end < x->start)
                x->end = x->start;
            x->node = node_index(r, a->node ? a->node : "(unknown)");
        }
    }
    /* nodes by name, then each node's attempts by start onto lanes */
    {
        size_t *order = xcalloc(r->nnodes + 1, sizeof(*order));
        struct rep_node *sorted = xcalloc(r->nnodes + 1, sizeof(*sorted));

        memcpy(sorted, r->nodes, r->nnodes * sizeof(*sorted));
        qsort(sorted, r->nnodes, sizeof(*sorted), cmp_node_name);
        for (size_t i = 0; i < r->nnodes; i++)
            for (size_t k = 0; k < r->nnodes; k++)
                if (sorted[k].name == r->nodes[i].name)
                    order[i] = k;
        for (size_t i = 0; i < r->n; i++)
            r->v[i].node = order[r->v[i].node];
        free(r->nodes);
        r->nodes = sorted;
        free(order);
    }
    qsort(r->v, r->n, sizeof(*r->v), cmp_start);
    for (size_t i = 0; i < r->n; i++) {
        struct rep_attempt *x = &r->v[i];
        struct rep_node *nd = &r->nodes[x->node];
        size_t l;

        for (l = 0; l < nd->lanes && nd->lane_end[l] > x->start + 1e-3; l++)
            ;
        if (l == nd->lanes) {
            nd->lane_end = xrealloc(nd->lane_end, (nd->lanes + 1) * sizeof(double));
            nd->lanes++;
        }
        nd->lane_end[l] = x->end;
        x->lane = l;
        if (r->t0 == 0 || x->start < r->t0)
            r->t0 = x->start;
        if (x->end > r->t1)
            r->t1 = x->end;
    }
    for (size_t i = 0; i < r->nnodes; i++) {
        r->nodes[i].first_row = r->rows;
        r->rows += r->nodes[i].lanes;
    }
    return 0;
}

static void
report_free(struct report *r)
{
    for (size_t i = 0; i < r->nh; i++)
        history_shard_free(&r->h[i]);
    free(r->h);
    for (size_t i = 0; i < r->nnodes; i++) {
        free(r->nodes[i].name);
        free(r->nodes[i].lane_end);
    }
    free(r->nodes);
    free(r->v);
    if (r->st.shards)
        status_free(&r->st);
    manifest_free(&r->m);
}

static double
x_of(const struct report *r, double t)
{
    double span = r->t1 > r->t0 ? r->t1 - r->t0 : 1;

    return LABEL_W + (t - r->t0) / span * CHART_W;
}

/* The time axis under a chart at y: five ticks, seconds from the start. */
static void
axis(struct buf *b, const struct report *r, double y)
{
    double span = r->t1 > r->t0 ? r->t1 - r->t0 : 1;
    char d[32];

    buf_printf(b, "<line class=\"axis\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>\n", LABEL_W,
               y, LABEL_W + CHART_W, y);
    for (int k = 0; k <= 4; k++) {
        double x = LABEL_W + CHART_W * k / 4.0;

        fmt_duration(span * k / 4.0, d);
        buf_printf(b, "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\">+%s</text>\n",
                   x, y + 15,
                   k == 0   ? "start"
                   : k == 4 ? "end"
                            : "middle",
                   d);
    }
}

static void
attempt_title(struct buf *b, const struct rep_attempt *x, const char *node)
{
    const struct history_attempt *a = x->a;
    char d[32];

    buf_puts(b, "<title>shard ");
    html_text(b, x->shard, REPORT_TEXT_MAX);
    buf_printf(b, ", attempt %lld on node ", a->number);
    html_text(b, node, REPORT_TEXT_MAX);
    buf_puts(b, "\n");
    html_time(b, x->start);
    buf_puts(b, " to ");
    html_time(b, x->end);
    fmt_duration(x->end - x->start, d);
    buf_printf(b, " (%s)\noutcome: ", d);
    html_text(b, history_outcome(a), REPORT_TEXT_MAX);
    if (a->fclass) {
        buf_puts(b, " (");
        html_text(b, a->fclass, REPORT_TEXT_MAX);
        buf_puts(b, ")");
    }
    if (a->rows >= 0)
        buf_printf(b, ", %lld rows", a->rows);
    if (a->error) {
        buf_puts(b, "\nerror: ");
        html_text(b, a->error, REPORT_TEXT_MAX);
    }
    buf_puts(b, "</title>");
}

static void
timeline(struct buf *b, const struct report *r)
{
    double h = (double)r->rows * ROW_H + AXIS_H;

    buf_printf(b,
               "<h2>Timeline</h2>\n<svg id=\"timeline\" width=\"%d\" height=\"%.0f\" "
               "viewBox=\"0 0 %d %.0f\">\n",
               LABEL_W + CHART_W + 10, h, LABEL_W + CHART_W + 10, h);
    for (size_t i = 0; i < r->nnodes; i++) {
        const struct rep_node *nd = &r->nodes[i];

        buf_puts(b, "<g class=\"node\" data-node=\"");
        html_text(b, nd->name, REPORT_TEXT_MAX);
        buf_puts(b, "\">\n");
        for (size_t l = 0; l < nd->lanes; l++) {
            double y = (double)(nd->first_row + l) * ROW_H;

            buf_printf(b, "<rect class=\"lane\" x=\"%d\" y=\"%.0f\" width=\"%d\" height=\"%d\"/>",
                       LABEL_W, y + 1, CHART_W, ROW_H - 2);
            buf_printf(b, "<text class=\"label\" x=\"4\" y=\"%.0f\">", y + ROW_H - 5);
            html_text(b, nd->name, 20);
            buf_printf(b, " slot %zu</text>\n", l + 1);
        }
        buf_puts(b, "</g>\n");
    }
    /* idle gaps between a lane's attempts, then the attempts over them */
    for (size_t i = 0; i < r->n; i++) {
        const struct rep_attempt *x = &r->v[i];
        const struct rep_node *nd = &r->nodes[x->node];
        double y = (double)(nd->first_row + x->lane) * ROW_H;
        double w = x_of(r, x->end) - x_of(r, x->start);
        const char *oc = outcome_class(history_outcome(x->a));

        for (size_t k = i + 1; k < r->n; k++)
            if (r->v[k].node == x->node && r->v[k].lane == x->lane) {
                double gap = r->v[k].start - x->end;
                char d[32];

                if (gap > 0 && x_of(r, r->v[k].start) - x_of(r, x->end) >= 1) {
                    fmt_duration(gap, d);
                    buf_printf(b,
                               "<rect class=\"idle\" x=\"%.1f\" y=\"%.0f\" width=\"%.1f\" "
                               "height=\"%d\"><title>idle %s on ",
                               x_of(r, x->end), y + 4, x_of(r, r->v[k].start) - x_of(r, x->end),
                               ROW_H - 8, d);
                    html_text(b, nd->name, REPORT_TEXT_MAX);
                    buf_printf(b, " slot %zu</title></rect>\n", x->lane + 1);
                }
                break;
            }
        buf_printf(b,
                   "<rect class=\"attempt %s\" x=\"%.1f\" y=\"%.0f\" width=\"%.1f\" "
                   "height=\"%d\">",
                   oc, x_of(r, x->start), y + 2, w < 2 ? 2 : w, ROW_H - 4);
        attempt_title(b, x, nd->name);
        buf_puts(b, "</rect>\n");
    }
    axis(b, r, (double)r->rows * ROW_H + 2);
    buf_puts(b, "</svg>\n");
}

/* Rows a second over time: each done attempt's rows spread evenly over
 * its run, in PACE_BUCKETS buckets. */
static void
pace_chart(struct buf *b, const struct report *r)
{
    double bucket[PACE_BUCKETS] = { 0 }, span = r->t1 > r->t0 ? r->t1 - r->t0 : 1;
    double w = span / PACE_BUCKETS, top = 0;

    for (size_t i = 0; i < r->n; i++) {
        const struct rep_attempt *x = &r->v[i];
        double len = x->end - x->start;

        if (x->a->rows <= 0 || strcmp(history_outcome(x->a), "done"))
            continue;
        for (int k = 0; k < PACE_BUCKETS; k++) {
            double lo = r->t0 + k * w, hi = lo + w;
            double a = x->start > lo ? x->start : lo, e = x->end < hi ? x->end : hi;

            if (len <= 0) {
                if (x->start >= lo && (x->start < hi || k == PACE_BUCKETS - 1)) {
                    bucket[k] += (double)x->a->rows;
                    break;
                }
            } else if (e > a) {
                bucket[k] += (double)x->a->rows * (e - a) / len;
            }
        }
    }
    for (int k = 0; k < PACE_BUCKETS; k++) {
        bucket[k] /= w;
        if (bucket[k] > top)
            top = bucket[k];
    }
    buf_printf(b,
               "<h2>Rows a second</h2>\n<svg id=\"pace\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\">\n",
               LABEL_W + CHART_W + 10, PACE_H + AXIS_H, LABEL_W + CHART_W + 10, PACE_H + AXIS_H);
    buf_printf(b, "<text class=\"tick\" x=\"%d\" y=\"12\" text-anchor=\"end\">%.0f rows/s</text>\n",
               LABEL_W - 6, top);
    buf_printf(b, "<text class=\"tick\" x=\"%d\" y=\"%d\" text-anchor=\"end\">0</text>\n",
               LABEL_W - 6, PACE_H);
    buf_puts(b, "<polyline class=\"pace\" points=\"");
    for (int k = 0; k < PACE_BUCKETS; k++)
        buf_printf(b, "%.1f,%.1f ", LABEL_W + CHART_W * (k + 0.5) / PACE_BUCKETS,
                   PACE_H - (top > 0 ? bucket[k] / top * (PACE_H - 8) : 0));
    buf_puts(b, "\"/>\n");
    axis(b, r, PACE_H + 2);
    buf_puts(b, "</svg>\n");
}

static int
cmp_elapsed(const void *x, const void *y)
{
    const struct rep_attempt *a = *(const struct rep_attempt *const *)x;
    const struct rep_attempt *b = *(const struct rep_attempt *const *)y;
    double da = a->end - a->start, db = b->end - b->start;

    return (da < db) - (da > db);
}

static void
summary(struct buf *b, const struct report *r)
{
    const struct rep_attempt **slow = xcalloc(r->n + 1, sizeof(*slow));
    size_t nslow = 0, nfail = 0;
    double busy = 0;
    long long rows_done = 0;
    char d[32];

    for (size_t i = 0; i < r->m.nshards; i++)
        if (r->st.shards[i].state == ST_DONE)
            rows_done += r->m.shards[i].rows;
    for (size_t i = 0; i < r->n; i++) {
        busy += r->v[i].end - r->v[i].start;
        if (!strcmp(history_outcome(r->v[i].a), "done"))
            slow[nslow++] = &r->v[i];
    }
    qsort(slow, nslow, sizeof(*slow), cmp_elapsed);
    buf_puts(b, "<h2>Summary</h2>\n<table id=\"summary\">\n<tr><th>job</th><td>");
    html_text(b, r->m.job_id, REPORT_TEXT_MAX);
    buf_puts(b, "</td></tr>\n<tr><th>directory</th><td>");
    html_text(b, r->m.job_dir, REPORT_TEXT_MAX);
    buf_printf(b, "</td></tr>\n<tr><th>shards</th><td>%zu:", r->st.total);
    for (int k = 0; k < ST__COUNT; k++)
        buf_printf(b, " %s %zu", status_state_name[k], r->st.counts[k]);
    buf_printf(b, "%s</td></tr>\n<tr><th>rows</th><td>%lld of %lld done</td></tr>\n",
               r->st.complete   ? " (complete)"
               : r->st.terminal ? " (terminal, with failures)"
                                : "",
               rows_done, r->m.total_rows);
    if (r->st.global) {
        const struct global_status *g = r->st.global;

        buf_printf(b, "<tr><th>phase</th><td>%s</td></tr>\n<tr><th>global stage</th><td>",
                   status_phase_name[g->phase]);
        html_text(b, status_state_name[g->s.state], REPORT_TEXT_MAX);
        if (g->s.node || g->s.owner) {
            buf_puts(b, " on ");
            html_text(b, g->s.node ? g->s.node : g->s.owner, REPORT_TEXT_MAX);
        }
        buf_printf(b, "; %lld operators per shard, then once: ", r->m.global_shard_ops);
        html_text(b, r->m.global_ops_json ? r->m.global_ops_json : "", REPORT_TEXT_MAX);
        if (g->input_rows >= 0)
            buf_printf(b, "; %lld rows in", g->input_rows);
        if (g->rows >= 0)
            buf_printf(b, ", %lld out", g->rows);
        if (g->duration >= 0) {
            fmt_duration(g->duration, d);
            buf_printf(b, " in %s", d);
        }
        if (g->s.error) {
            buf_puts(b, "; ");
            html_text(b, g->s.error, REPORT_TEXT_MAX);
        }
        buf_puts(b, "</td></tr>\n");
    }
    buf_printf(b, "<tr><th>attempts</th><td>%zu on %zu nodes", r->n, r->nnodes);
    if (r->omitted)
        buf_printf(b, " (%zu shards not drawn: more than %d attempts)", r->omitted,
                   REPORT_MAX_ATTEMPTS);
    buf_puts(b, "</td></tr>\n<tr><th>first start</th><td>");
    html_time(b, r->t0);
    buf_puts(b, "</td></tr>\n<tr><th>last end</th><td>");
    html_time(b, r->t1);
    fmt_duration(r->t1 - r->t0, d);
    buf_printf(b, "</td></tr>\n<tr><th>wall time</th><td>%s</td></tr>\n", d);
    fmt_duration(busy, d);
    buf_printf(b, "<tr><th>attempt time</th><td>%s</td></tr>\n</table>\n", d);

    buf_puts(b, "<h2>Slowest shards</h2>\n<table id=\"slowest\">\n<tr><th>shard</th><th>attempt"
                "</th><th>node</th><th>elapsed</th><th>rows</th></tr>\n");
    for (size_t i = 0; i < nslow && i < REPORT_SLOWEST; i++) {
        buf_puts(b, "<tr><td>");
        html_text(b, slow[i]->shard, REPORT_TEXT_MAX);
        buf_printf(b, "</td><td>%lld</td><td>", slow[i]->a->number);
        html_text(b, r->nodes[slow[i]->node].name, REPORT_TEXT_MAX);
        fmt_duration(slow[i]->end - slow[i]->start, d);
        buf_printf(b, "</td><td>%s</td><td>%lld</td></tr>\n", d, slow[i]->a->rows);
    }
    buf_puts(b, "</table>\n<h2>Failures</h2>\n<table id=\"failures\">\n<tr><th>shard</th><th>"
                "attempt</th><th>node</th><th>outcome</th><th>class</th><th>error</th></tr>\n");
    for (size_t i = 0; i < r->n && nfail < REPORT_MAX_FAILURES; i++) {
        const struct rep_attempt *x = &r->v[i];
        const char *oc = history_outcome(x->a);

        if (!strcmp(oc, "done") || !strcmp(oc, "running"))
            continue;
        nfail++;
        buf_printf(b, "<tr class=\"%s\"><td>", outcome_class(oc));
        html_text(b, x->shard, REPORT_TEXT_MAX);
        buf_printf(b, "</td><td>%lld</td><td>", x->a->number);
        html_text(b, r->nodes[x->node].name, REPORT_TEXT_MAX);
        buf_puts(b, "</td><td>");
        html_text(b, oc, REPORT_TEXT_MAX);
        buf_puts(b, "</td><td>");
        html_text(b, x->a->fclass ? x->a->fclass : "", REPORT_TEXT_MAX);
        buf_puts(b, "</td><td>");
        html_text(b, x->a->error ? x->a->error : "", REPORT_TEXT_MAX);
        buf_puts(b, "</td></tr>\n");
    }
    buf_puts(b, "</table>\n");
    free(slow);
}

static const char style[] =
    "body{font:13px sans-serif;margin:16px;color:#222;background:#fff}"
    "h1{font-size:18px}h2{font-size:15px;margin-top:20px}"
    "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 6px;"
    "text-align:left;vertical-align:top}td{white-space:pre-wrap}"
    ".lane{fill:#f2f2f2}.idle{fill:#dddddd}.label,.tick{font:11px sans-serif;fill:#333}"
    ".axis{stroke:#888}.attempt{stroke:#fff;stroke-width:0.5}"
    ".done{fill:#2e7d32}.failed{fill:#c62828}.takenover{fill:#ef6c00}"
    ".running{fill:#1565c0}.other{fill:#757575}"
    "tr.failed td{color:#c62828}tr.takenover td{color:#ef6c00}"
    ".pace{fill:none;stroke:#1565c0;stroke-width:2}"
    ".key span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px;"
    "vertical-align:middle}.key .done{background:#2e7d32}.key .failed{background:#c62828}"
    ".key .takenover{background:#ef6c00}.key .running{background:#1565c0}"
    ".key .idle{background:#dddddd}";

/* The whole page of r into b. */
static void
report_html(struct buf *b, const struct report *r)
{
    buf_puts(b, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
                "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
                "style-src 'unsafe-inline'\">\n<title>esd report: ");
    html_text(b, r->m.job_id, REPORT_TEXT_MAX);
    buf_printf(b, "</title>\n<style>%s</style>\n</head>\n<body>\n<h1>Job ", style);
    html_text(b, r->m.job_id, REPORT_TEXT_MAX);
    buf_puts(b, "</h1>\n<p>Written by esctl report at ");
    html_time(b, r->now);
    buf_puts(b, ". Hover over an attempt for its shard, node, times and outcome.</p>\n"
                "<p class=\"key\"><span class=\"done\"></span>done<span class=\"failed\"></span>"
                "failed<span class=\"takenover\"></span>taken over<span class=\"running\">"
                "</span>running<span class=\"idle\"></span>idle</p>\n");
    timeline(b, r);
    pace_chart(b, r);
    summary(b, r);
    buf_puts(b, "</body>\n</html>\n");
}

int
report_run(struct call *c)
{
    const char *out = c->set[O_OUTPUT] ? c->str[O_OUTPUT] : "report.html";
    struct report r;
    struct esd_err err;
    struct buf b;
    char *dir = NULL;
    int rc;

    memset(&r, 0, sizeof(r));
    if (pypath_resolve_cli(c->str[O_JOB_DIR], &dir, &err) < 0 ||
        report_load(&r, dir, c->set[O_LOCK_TIMEOUT] ? c->num[O_LOCK_TIMEOUT] : 0, &err) < 0) {
        free(dir);
        report_free(&r);
        return render_error(c, PROTO_E_FAILED, err.msg, EXIT_ERROR);
    }
    free(dir);
    buf_init(&b);
    report_html(&b, &r);
    rc = fs_write_atomic(out, b.p, b.len, 0644, &err);
    if (rc == 0 && !c->json)
        printf("Wrote %s: %zu attempts of %zu shards on %zu nodes\n", out, r.n, r.m.nshards,
               r.nnodes);
    else if (rc == 0) {
        cJSON *j = cJSON_CreateObject();

        json_add_str(j, "output", out);
        json_add_int(j, "attempts", (long long)r.n);
        json_add_int(j, "nodes", (long long)r.nnodes);
        out_json(j);
        cJSON_Delete(j);
    }
    buf_free(&b);
    report_free(&r);
    if (rc < 0)
        return render_error(c, PROTO_E_FAILED, err.msg, EXIT_ERROR);
    return EXIT_OK;
}
