/*
 * util: error struct, aborting allocators, byte buffers, string lists,
 * Python-compatible timestamps, random tokens and escaping for terminals
 * and logs for the rest of libesd.
 */
#include "util.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

int
err_setv(struct esd_err *err, int code, const char *fmt, va_list ap)
{
    char msg[ESD_ERR_MAX];

    if (err) {
        /* Through a copy: callers may pass err->msg itself as an argument. */
        vsnprintf(msg, sizeof(msg), fmt, ap);
        err->code = code;
        memcpy(err->msg, msg, sizeof(msg));
    }
    return code;
}

int
err_set(struct esd_err *err, int code, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    err_setv(err, code, fmt, ap);
    va_end(ap);
    return code;
}

int
err_sys(struct esd_err *err, int code, const char *fmt, ...)
{
    va_list ap;
    size_t n;

    if (!err)
        return code;
    va_start(ap, fmt);
    err_setv(err, code, fmt, ap);
    va_end(ap);
    n = strlen(err->msg);
    snprintf(err->msg + n, sizeof(err->msg) - n, ": %s", strerror(code < 0 ? -code : code));
    return code;
}

bool
err_transient(int code)
{
    switch (-code) {
    case ENOSPC:
    case EDQUOT:
    case EIO:
    case EROFS:
    case ESTALE:
    case ENOLCK:
    case ETIMEDOUT:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
    case EAGAIN:
    case EBUSY:
    case EINTR:
    case ECANCELED:
        return true;
    default:
        return false;
    }
}

void
err_clear(struct esd_err *err)
{
    if (err) {
        err->code = 0;
        err->msg[0] = '\0';
    }
}

static void
oom(size_t n)
{
    fprintf(stderr, "esd: out of memory allocating %zu bytes\n", n);
    abort();
}

void *
xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);

    if (!p)
        oom(n);
    return p;
}

void *
xcalloc(size_t n, size_t m)
{
    void *p = calloc(n ? n : 1, m ? m : 1);

    if (!p)
        oom(n * m);
    return p;
}

void *
xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);

    if (!q)
        oom(n);
    return q;
}

char *
xstrdup(const char *s)
{
    return xstrndup(s, strlen(s));
}

char *
xstrndup(const char *s, size_t n)
{
    char *p = xmalloc(n + 1);

    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

char *
xasprintf(const char *fmt, ...)
{
    va_list ap;
    char *p;
    int n;

    va_start(ap, fmt);
    n = vasprintf(&p, fmt, ap);
    va_end(ap);
    if (n < 0)
        oom(0);
    return p;
}

void
buf_init(struct buf *b)
{
    b->p = NULL;
    b->len = 0;
    b->cap = 0;
}

void
buf_free(struct buf *b)
{
    free(b->p);
    buf_init(b);
}

void
buf_reset(struct buf *b)
{
    b->len = 0;
    if (b->p)
        b->p[0] = '\0';
}

void
buf_reserve(struct buf *b, size_t extra)
{
    size_t need, cap;

    if (extra >= SIZE_MAX - b->len)
        oom(SIZE_MAX);
    need = b->len + extra + 1;
    if (need <= b->cap)
        return;
    cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap = cap * 2 > cap ? cap * 2 : need;
    b->p = xrealloc(b->p, cap);
    b->cap = cap;
}

void
buf_append(struct buf *b, const void *data, size_t n)
{
    buf_reserve(b, n);
    if (n)
        memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void
buf_putc(struct buf *b, char c)
{
    buf_reserve(b, 1);
    b->p[b->len++] = c;
    b->p[b->len] = '\0';
}

void
buf_puts(struct buf *b, const char *s)
{
    buf_append(b, s, strlen(s));
}

void
buf_printf(struct buf *b, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    buf_vprintf(b, fmt, ap);
    va_end(ap);
}

void
buf_vprintf(struct buf *b, const char *fmt, va_list ap)
{
    va_list aq;
    int n;

    va_copy(aq, ap);
    n = vsnprintf(NULL, 0, fmt, aq);
    va_end(aq);
    if (n < 0) {
        buf_append(b, "", 0);
        return;
    }
    buf_reserve(b, (size_t)n);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    b->len += (size_t)n;
}

char *
buf_steal(struct buf *b)
{
    char *p;

    if (!b->p)
        buf_reserve(b, 0), b->p[0] = '\0';
    p = b->p;
    buf_init(b);
    return p;
}

void
strv_init(struct strv *s)
{
    s->v = NULL;
    s->n = 0;
    s->cap = 0;
}

void
strv_free(struct strv *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->v[i]);
    free(s->v);
    strv_init(s);
}

void
strv_push_owned(struct strv *s, char *str)
{
    if (s->n + 1 >= s->cap) {
        s->cap = s->cap ? s->cap * 2 : 8;
        s->v = xrealloc(s->v, s->cap * sizeof(*s->v));
    }
    s->v[s->n++] = str;
    s->v[s->n] = NULL;
}

void
strv_push(struct strv *s, const char *str)
{
    strv_push_owned(s, xstrdup(str));
}

bool
strv_contains(const struct strv *s, const char *str)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->v[i], str) == 0)
            return true;
    return false;
}

static int
cmp_str(const void *a, const void *b)
{
    /* strcmp compares as unsigned char: code point order for UTF-8. */
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void
strv_sort(struct strv *s)
{
    if (s->n > 1)
        qsort(s->v, s->n, sizeof(*s->v), cmp_str);
}

void
strv_split(struct strv *s, const char *str)
{
    while (*str) {
        size_t n;

        str += strspn(str, " \t");
        n = strcspn(str, " \t");
        if (n)
            strv_push_owned(s, xstrndup(str, n));
        str += n;
    }
}

void
time_iso_format(const struct timespec *ts, char out[40])
{
    struct tm tm;
    long usec = ts->tv_nsec / 1000;
    size_t n;

    gmtime_r(&ts->tv_sec, &tm);
    n = strftime(out, 40, "%Y-%m-%dT%H:%M:%S", &tm);
    if (usec)
        snprintf(out + n, 40 - n, ".%06ld+00:00", usec);
    else
        snprintf(out + n, 40 - n, "+00:00");
}

void
time_iso_now(char out[40], double *ret_epoch)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    /* Python works in microseconds: truncate so both fields agree. */
    ts.tv_nsec = ts.tv_nsec / 1000 * 1000;
    time_iso_format(&ts, out);
    if (ret_epoch)
        *ret_epoch = (double)ts.tv_sec + (double)(ts.tv_nsec / 1000) / 1e6;
}

double
time_wall(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

double
time_mono(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void
rand_hex32(char out[33])
{
    static const char hex[] = "0123456789abcdef";
    unsigned char raw[16];
    size_t got = 0;

    while (got < sizeof(raw)) {
        ssize_t n = getrandom(raw + got, sizeof(raw) - got, 0);

        if (n < 0) {
            if (errno == EINTR)
                continue;
            fprintf(stderr, "esd: getrandom: %s\n", strerror(errno));
            abort();
        }
        got += (size_t)n;
    }
    /* uuid4: version and variant bits, so the token reads as one. */
    raw[6] = (unsigned char)((raw[6] & 0x0f) | 0x40);
    raw[8] = (unsigned char)((raw[8] & 0x3f) | 0x80);
    for (size_t i = 0; i < sizeof(raw); i++) {
        out[2 * i] = hex[raw[i] >> 4];
        out[2 * i + 1] = hex[raw[i] & 15];
    }
    out[32] = '\0';
}

int
parse_int(const char *s, long long min, long long max, long long *ret)
{
    const char *p = s;
    bool neg = false, digit = false;
    unsigned long long u = 0, limit;
    long long v;

    while (isspace((unsigned char)*p))
        p++;
    if (*p == '+' || *p == '-')
        neg = *p++ == '-';
    /* The magnitude of LLONG_MIN is one more than LLONG_MAX. */
    limit = neg ? (unsigned long long)LLONG_MAX + 1 : (unsigned long long)LLONG_MAX;
    for (; *p; p++) {
        if (*p == '_' && digit && p[1] >= '0' && p[1] <= '9')
            continue;
        if (*p < '0' || *p > '9')
            break;
        digit = true;
        if (u > (limit - (unsigned)(*p - '0')) / 10)
            return -ERANGE;
        u = u * 10 + (unsigned)(*p - '0');
    }
    while (isspace((unsigned char)*p))
        p++;
    if (!digit || *p)
        return -EINVAL;
    if (neg)
        v = u == (unsigned long long)LLONG_MAX + 1 ? LLONG_MIN : -(long long)u;
    else
        v = (long long)u;
    if (v < min || v > max)
        return -ERANGE;
    *ret = v;
    return 0;
}

void
fmt_size(uint64_t bytes, char out[32])
{
    static const char *unit[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
    double v = (double)bytes;
    int u = 0;

    while (v >= 1024 && u < 5) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(out, 32, "%llu B", (unsigned long long)bytes);
    else
        snprintf(out, 32, "%.*f %s", v < 10 ? 2 : v < 100 ? 1 : 0, v, unit[u]);
}

void
fmt_duration(double secs, char out[32])
{
    long long s;

    if (secs < 0 || secs != secs)
        secs = 0;
    /* Keeps the conversion to long long below defined (inf, 1e300). */
    if (secs > 1e15)
        secs = 1e15;
    if (secs < 10) {
        snprintf(out, 32, "%.1fs", secs);
        return;
    }
    s = (long long)(secs + 0.5);
    if (s < 60)
        snprintf(out, 32, "%llds", s);
    else if (s < 3600)
        snprintf(out, 32, "%lldm%02llds", s / 60, s % 60);
    else if (s < 86400)
        snprintf(out, 32, "%lldh%02lldm", s / 3600, s % 3600 / 60);
    else
        snprintf(out, 32, "%lldd%02lldh", s / 86400, s % 86400 / 3600);
}

void
py_repr_str(const char *s, size_t n, struct buf *b)
{
    char q = memchr(s, '\'', n) && !memchr(s, '"', n) ? '"' : '\'';

    buf_putc(b, q);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];

        if (c == (unsigned char)q || c == '\\')
            buf_printf(b, "\\%c", c);
        else if (c == '\n')
            buf_puts(b, "\\n");
        else if (c == '\r')
            buf_puts(b, "\\r");
        else if (c == '\t')
            buf_puts(b, "\\t");
        else if (c < 0x20 || c == 0x7f)
            buf_printf(b, "\\x%02x", c);
        else if (c == 0xc2 && i + 1 < n && (unsigned char)s[i + 1] >= 0x80 &&
                 (unsigned char)s[i + 1] < 0xa0)
            buf_printf(b, "\\x%02x", (unsigned char)s[++i]); /* C1 controls */
        else
            buf_putc(b, (char)c);
    }
    buf_putc(b, q);
}

/*
 * Length of the well-formed UTF-8 sequence of two or more bytes at s[0..n)
 * (RFC 3629 table 3-7: no overlong forms, no surrogates, nothing above
 * U+10FFFF), or 0 when there is none.
 */
static size_t
utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0], lo = 0x80, hi = 0xbf;
    size_t len;

    if (c >= 0xc2 && c <= 0xdf)
        len = 2;
    else if (c >= 0xe0 && c <= 0xef)
        len = 3;
    else if (c >= 0xf0 && c <= 0xf4)
        len = 4;
    else
        return 0;
    /* The second byte's range is what rules out the bad forms. */
    if (c == 0xe0)
        lo = 0xa0;
    else if (c == 0xed)
        hi = 0x9f;
    else if (c == 0xf0)
        lo = 0x90;
    else if (c == 0xf4)
        hi = 0x8f;
    if (n < len || s[1] < lo || s[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if (s[i] < 0x80 || s[i] > 0xbf)
            return 0;
    return len;
}

/*
 * The one scanner behind str_escape, str_escape_lines and str_clean: with
 * out NULL, stops at the first byte to escape and returns false.
 */
static bool
escape(const char *s, size_t n, bool keep_lines, struct buf *out)
{
    static const char hex[] = "0123456789abcdef";
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, start = 0;

    if (out)
        buf_reserve(out, n);
    while (i < n) {
        unsigned char c = u[i];
        size_t len = 1;
        bool bad;

        if (c < 0x80) {
            bad = (c < 0x20 && !(keep_lines && (c == '\n' || c == '\t'))) || c == 0x7f;
        } else {
            len = utf8_seq(u + i, n - i);
            /* U+0080..U+009F, the C1 controls, are C2 80..C2 9F. */
            bad = len == 0 || (c == 0xc2 && u[i + 1] < 0xa0);
            if (len == 0)
                len = 1;
        }
        if (!bad) {
            i += len;
            continue;
        }
        if (!out)
            return false;
        buf_append(out, s + start, i - start);
        /* A C1 control is escaped byte by byte, like any other. */
        for (size_t k = 0; k < len; k++) {
            char e[4] = { '\\', 'x', hex[u[i + k] >> 4], hex[u[i + k] & 15] };

            buf_append(out, e, sizeof(e));
        }
        i += len;
        start = i;
    }
    if (out)
        buf_append(out, s + start, n - start);
    return true;
}

void
str_escape(const char *s, size_t n, struct buf *out)
{
    escape(s, n, false, out);
}

void
str_escape_lines(const char *s, size_t n, struct buf *out)
{
    escape(s, n, true, out);
}

char *
str_escape_dup(const char *s)
{
    struct buf b;

    buf_init(&b);
    str_escape(s, strlen(s), &b);
    return buf_steal(&b);
}

bool
str_clean(const char *s, size_t n)
{
    return escape(s, n, false, NULL);
}
