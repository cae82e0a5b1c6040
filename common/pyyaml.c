/*
 * pyyaml: a YAML loader bit-compatible with PyYAML's yaml.safe_load (the
 * Python reference loads recipes with it). libyaml's event parser feeds a
 * small tree of our own; the tree is built under three bounds fixed before
 * any work is done (a node budget that counts an alias at every use, and a
 * nesting cap; the caller caps the size), so a hostile document costs at
 * most max_nodes nodes of memory and time. Recursive aliases are refused
 * when they are met. Scalars are then typed as PyYAML's SafeLoader types
 * them and every node is checked to be constructible as safe_load would
 * construct it; the readers below see a mapping as the dict PyYAML would
 * have returned (merge keys flattened, later keys win).
 */
#include "pyyaml.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

/* Python 3.11 refuses int <-> decimal str conversions beyond this. */
#define PY_INT_MAX_DIGITS 4300
/* The checks after parsing recurse along nesting; keep that off the C stack. */
#define DEPTH_CAP 1000u
/* Longest value quoted in a message, and longest str() of a list/mapping. */
#define MSG_REPR_MAX 120
#define STR_REPR_MAX 4096

/* Why safe_load could not construct a node. */
enum { BAD_NONE, BAD_TAG, BAD_BOOL, BAD_INT, BAD_FLOAT, BAD_TS };

struct pyyaml_anchor {
    char *name;
    struct pyyaml_node *node;
};

/* A parsed date or datetime, as PyYAML's construct_yaml_timestamp sees it. */
struct ts {
    int year, month, day;
    bool has_time;
    int hour, minute, second, usec;
    bool has_tz;
    int tz_sign, tz_hour, tz_minute;
};

static const char yaml_tag_prefix[] = "tag:yaml.org,2002:";

/* ---- scalar typing (PyYAML's YAML 1.1 implicit resolvers) ---- */

static bool
is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static bool
span_is(const char *s, size_t n, const char *lit)
{
    return strlen(lit) == n && memcmp(s, lit, n) == 0;
}

static bool
match_null(const char *s, size_t n)
{
    return n == 0 || span_is(s, n, "~") || span_is(s, n, "null") || span_is(s, n, "Null") ||
           span_is(s, n, "NULL");
}

static const struct {
    const char *word;
    bool value;
} bool_words[] = {
    { "yes", true },    { "Yes", true },    { "YES", true },  { "no", false },  { "No", false },
    { "NO", false },    { "true", true },   { "True", true }, { "TRUE", true }, { "false", false },
    { "False", false }, { "FALSE", false }, { "on", true },   { "On", true },   { "ON", true },
    { "off", false },   { "Off", false },   { "OFF", false },
};

/* 1 true, 0 false, -1 not a bool. */
static int
match_bool(const char *s, size_t n)
{
    for (size_t i = 0; i < sizeof(bool_words) / sizeof(bool_words[0]); i++)
        if (span_is(s, n, bool_words[i].word))
            return bool_words[i].value;
    return -1;
}

/* c is one of the characters of set (never the terminating NUL). */
static bool
in_set(char c, const char *set)
{
    return c && strchr(set, c);
}

/* Consumes (?::[0-5]?[0-9])+ at *i, each group followed by one of `stop`. */
static bool
match_sexa_groups(const char *s, size_t n, size_t *i, const char *stop)
{
    size_t j = *i;
    int groups = 0;

    while (j < n && s[j] == ':') {
        j++;
        if (j + 1 < n && s[j] >= '0' && s[j] <= '5' && is_digit(s[j + 1]) &&
            (j + 2 == n || in_set(s[j + 2], stop)))
            j += 2;
        else if (j < n && is_digit(s[j]) && (j + 1 == n || in_set(s[j + 1], stop)))
            j += 1;
        else
            return false;
        groups++;
    }
    *i = j;
    return groups > 0;
}

static bool
all_in(const char *s, size_t n, const char *set)
{
    for (size_t i = 0; i < n; i++)
        if (!in_set(s[i], set))
            return false;
    return true;
}

static bool
match_int(const char *s, size_t n)
{
    size_t i = 0;

    if (i < n && (s[i] == '+' || s[i] == '-'))
        i++;
    s += i;
    n -= i;
    if (n == 0)
        return false;
    if (n >= 2 && s[0] == '0' && s[1] == 'b')
        return n > 2 && all_in(s + 2, n - 2, "01_");
    if (n >= 2 && s[0] == '0' && s[1] == 'x')
        return n > 2 && all_in(s + 2, n - 2, "0123456789abcdefABCDEF_");
    if (s[0] == '0')
        return n == 1 || all_in(s + 1, n - 1, "01234567_");
    if (s[0] < '1' || s[0] > '9')
        return false;
    for (i = 1; i < n && (is_digit(s[i]) || s[i] == '_'); i++)
        ;
    if (i == n)
        return true;
    return match_sexa_groups(s, n, &i, ":") && i == n;
}

static bool
match_float(const char *s, size_t n)
{
    size_t i = 0;
    bool sign = false;

    if (i < n && (s[i] == '+' || s[i] == '-')) {
        sign = true;
        i++;
    }
    if (i < n && s[i] == '.') {
        const char *r = s + i + 1;
        size_t rn = n - i - 1;

        if (span_is(r, rn, "inf") || span_is(r, rn, "Inf") || span_is(r, rn, "INF"))
            return true;
        if (span_is(r, rn, "nan") || span_is(r, rn, "NaN") || span_is(r, rn, "NAN"))
            return !sign;
        if (sign)
            return false;
        /* \.[0-9][0-9_]*(?:[eE][-+][0-9]+)? (PyYAML's, stricter than the spec's) */
        if (++i >= n || !is_digit(s[i]))
            return false;
        for (i++; i < n && (is_digit(s[i]) || s[i] == '_'); i++)
            ;
    } else {
        if (i >= n || !is_digit(s[i]))
            return false;
        for (i++; i < n && (is_digit(s[i]) || s[i] == '_'); i++)
            ;
        if (i < n && s[i] == ':') {
            /* sexagesimal: groups, then \.[0-9_]* and nothing else */
            if (!match_sexa_groups(s, n, &i, ":.") || i >= n || s[i] != '.')
                return false;
            for (i++; i < n && (is_digit(s[i]) || s[i] == '_'); i++)
                ;
            return i == n;
        }
        if (i >= n || s[i] != '.')
            return false;
        for (i++; i < n && (is_digit(s[i]) || s[i] == '_'); i++)
            ;
    }
    if (i == n)
        return true;
    /* (?:[eE][-+][0-9]+)? : the exponent sign is mandatory in YAML 1.1 */
    if ((s[i] != 'e' && s[i] != 'E') || i + 2 >= n || (s[i + 1] != '+' && s[i + 1] != '-'))
        return false;
    for (i += 2; i < n && is_digit(s[i]); i++)
        ;
    return i == n && is_digit(s[n - 1]);
}

/* Reads 1..max digits at *i into *v; returns how many were read. */
static int
read_digits(const char *s, size_t n, size_t *i, int max, int *v)
{
    int k = 0;

    *v = 0;
    while (k < max && *i < n && is_digit(s[*i])) {
        *v = *v * 10 + (s[*i] - '0');
        (*i)++;
        k++;
    }
    return k;
}

/*
 * PyYAML's timestamp regexp. implicit: the resolver's form, where a bare
 * date needs two-digit month and day; otherwise the constructor's.
 */
static bool
match_ts(const char *s, size_t n, bool implicit, struct ts *t)
{
    size_t i = 0;
    int md, dd, k;

    memset(t, 0, sizeof(*t));
    if (read_digits(s, n, &i, 4, &t->year) != 4 || i >= n || s[i++] != '-')
        return false;
    md = read_digits(s, n, &i, 2, &t->month);
    if (!md || i >= n || s[i++] != '-')
        return false;
    dd = read_digits(s, n, &i, 2, &t->day);
    if (!dd)
        return false;
    if (i == n)
        return !implicit || (md == 2 && dd == 2);
    if (s[i] == 'T' || s[i] == 't') {
        i++;
    } else if (s[i] == ' ' || s[i] == '\t') {
        while (i < n && (s[i] == ' ' || s[i] == '\t'))
            i++;
    } else {
        return false;
    }
    t->has_time = true;
    if (!read_digits(s, n, &i, 2, &t->hour) || i >= n || s[i++] != ':')
        return false;
    if (read_digits(s, n, &i, 2, &t->minute) != 2 || i >= n || s[i++] != ':')
        return false;
    if (read_digits(s, n, &i, 2, &t->second) != 2)
        return false;
    if (i < n && s[i] == '.') {
        /* fraction[:6], padded with zeros */
        for (i++, k = 0; i < n && is_digit(s[i]); i++, k++)
            if (k < 6)
                t->usec = t->usec * 10 + (s[i] - '0');
        for (; k < 6; k++)
            t->usec *= 10;
    }
    if (i == n)
        return true;
    while (i < n && (s[i] == ' ' || s[i] == '\t'))
        i++;
    if (i < n && s[i] == 'Z') {
        t->has_tz = true;
        t->tz_sign = 1;
        return i + 1 == n;
    }
    if (i >= n || (s[i] != '+' && s[i] != '-'))
        return false;
    t->has_tz = true;
    t->tz_sign = s[i++] == '-' ? -1 : 1;
    if (!read_digits(s, n, &i, 2, &t->tz_hour))
        return false;
    if (i < n && s[i] == ':') {
        i++;
        if (read_digits(s, n, &i, 2, &t->tz_minute) != 2)
            return false;
    }
    return i == n;
}

/* datetime.date/datetime() would accept these fields. */
static bool
ts_valid(const struct ts *t)
{
    static const int mdays[] = { 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31 };
    int dim;

    if (t->year < 1 || t->month < 1 || t->month > 12 || t->day < 1)
        return false;
    dim = mdays[t->month - 1];
    if (t->month == 2 && t->year % 4 == 0 && (t->year % 100 != 0 || t->year % 400 == 0))
        dim = 29;
    if (t->day > dim)
        return false;
    if (!t->has_time)
        return true;
    if (t->hour > 23 || t->minute > 59 || t->second > 59)
        return false;
    /* datetime.timezone() wants |offset| < 24 h */
    return t->tz_hour * 60 + t->tz_minute < 24 * 60;
}

/* str() of the date or datetime. */
static void
ts_str(const struct ts *t, struct buf *b)
{
    int off;

    buf_printf(b, "%04d-%02d-%02d", t->year, t->month, t->day);
    if (!t->has_time)
        return;
    buf_printf(b, " %02d:%02d:%02d", t->hour, t->minute, t->second);
    if (t->usec)
        buf_printf(b, ".%06d", t->usec);
    if (t->has_tz) {
        off = t->tz_hour * 60 + t->tz_minute;
        buf_printf(b, "%c%02d:%02d", off && t->tz_sign < 0 ? '-' : '+', off / 60, off % 60);
    }
}

/* Copies s without '_' (PyYAML strips them from numbers); caller frees. */
static char *
strip_underscores(const char *s, size_t n, size_t *ret_len)
{
    char *o = xmalloc(n + 1);
    size_t k = 0;

    for (size_t i = 0; i < n; i++)
        if (s[i] != '_')
            o[k++] = s[i];
    o[k] = '\0';
    *ret_len = k;
    return o;
}

/*
 * Splits a cleaned int as construct_yaml_int does: sign, then the digits
 * and their base (60 for sexagesimal, whose digits keep their ':').
 */
static void
int_split(const char *c, int *sign, const char **digits, int *base)
{
    *sign = 1;
    if (*c == '-')
        *sign = -1;
    if (*c == '+' || *c == '-')
        c++;
    if (c[0] == '0' && c[1] == 'b') {
        *base = 2;
        c += 2;
    } else if (c[0] == '0' && c[1] == 'x') {
        *base = 16;
        c += 2;
    } else if (c[0] == '0' && c[1]) {
        *base = 8;
    } else {
        *base = strchr(c, ':') ? 60 : 10;
    }
    *digits = c;
}

static int
digit_value(char c)
{
    if (is_digit(c))
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return c - 'A' + 10;
}

static void
acc_muladd(unsigned long long *m, unsigned mul, unsigned add, bool *over)
{
    if (*over || *m > (ULLONG_MAX - add) / mul)
        *over = true;
    else
        *m = *m * mul + add;
}

/*
 * Constructs an int scalar: ival/ival_ok, or BAD_INT where Python's int()
 * raises (no digits left once '_' is removed, a decimal part too long).
 */
static int
int_construct(struct pyyaml_node *nd)
{
    size_t cl, ndig = 0;
    char *c = strip_underscores(nd->val, nd->len, &cl);
    const char *d, *p;
    unsigned long long mag = 0;
    unsigned part;
    bool over = false;
    int sign, base, bad = BAD_NONE;

    int_split(c, &sign, &d, &base);
    if (base == 60) {
        /* the first part is decimal of any length, the others are < 60 */
        for (p = d; *p && *p != ':'; p++, ndig++)
            acc_muladd(&mag, 10, (unsigned)(*p - '0'), &over);
        while (*p == ':') {
            for (part = 0, p++; is_digit(*p); p++)
                part = part * 10 + (unsigned)(*p - '0');
            acc_muladd(&mag, 60, part, &over);
        }
    } else {
        for (p = d; *p; p++, ndig++)
            acc_muladd(&mag, (unsigned)base, (unsigned)digit_value(*p), &over);
    }
    if (!ndig || ((base == 10 || base == 60) && ndig > PY_INT_MAX_DIGITS))
        bad = BAD_INT;
    free(c);
    nd->ival_ok = !over && mag <= (unsigned long long)LLONG_MAX;
    nd->ival = nd->ival_ok ? sign * (long long)mag : 0;
    return bad;
}

/* Multiplies the little-endian decimal number d by mul and adds add. */
static int
dec_muladd(unsigned char *d, size_t *nd, unsigned mul, unsigned add)
{
    unsigned carry = add;

    for (size_t i = 0; i < *nd; i++) {
        unsigned v = d[i] * mul + carry;

        d[i] = (unsigned char)(v % 10);
        carry = v / 10;
    }
    while (carry) {
        if (*nd >= PY_INT_MAX_DIGITS)
            return -ERANGE;
        d[(*nd)++] = (unsigned char)(carry % 10);
        carry /= 10;
    }
    return 0;
}

/* str() of an int scalar; -ERANGE where Python 3.11 refuses (> 4300 digits). */
static int
int_str(const struct pyyaml_node *nd, struct buf *b)
{
    size_t cl, n = 0;
    char *c;
    const char *d, *p;
    unsigned char *dec;
    unsigned part;
    int sign, base, rc = 0;

    if (nd->ival_ok) {
        buf_printf(b, "%lld", nd->ival);
        return 0;
    }
    c = strip_underscores(nd->val, nd->len, &cl);
    dec = xmalloc(PY_INT_MAX_DIGITS);
    int_split(c, &sign, &d, &base);
    if (base == 60) {
        for (p = d; *p && *p != ':' && !rc; p++)
            rc = dec_muladd(dec, &n, 10, (unsigned)(*p - '0'));
        while (*p == ':' && !rc) {
            for (part = 0, p++; is_digit(*p); p++)
                part = part * 10 + (unsigned)(*p - '0');
            rc = dec_muladd(dec, &n, 60, part);
        }
    } else {
        for (p = d; *p && !rc; p++)
            rc = dec_muladd(dec, &n, (unsigned)base, (unsigned)digit_value(*p));
    }
    if (!rc) {
        if (!n)
            buf_putc(b, '0');
        else if (sign < 0)
            buf_putc(b, '-');
        while (n)
            buf_putc(b, (char)('0' + dec[--n]));
    }
    free(dec);
    free(c);
    return rc;
}

/* Python's float() on a cleaned, lower-cased string (no hex, no blanks). */
static bool
py_float(const char *s, double *v)
{
    char *end;

    if (!*s || strchr(s, 'x') || strchr(s, ' ') || strchr(s, '\t') || strchr(s, '\n'))
        return false;
    *v = strtod(s, &end);
    return *end == '\0';
}

/* construct_yaml_float; BAD_FLOAT where Python's float() raises. */
static int
float_construct(struct pyyaml_node *nd)
{
    size_t cl;
    char *c = strip_underscores(nd->val, nd->len, &cl);
    char *p = c;
    double sign = 1.0, v = 0.0;
    int bad = BAD_NONE;

    if (memchr(c, '\0', cl)) {
        /* only explicitly tagged quoted scalars get here with a NUL */
        free(c);
        return BAD_FLOAT;
    }
    for (size_t i = 0; i < cl; i++)
        if (c[i] >= 'A' && c[i] <= 'Z')
            c[i] = (char)(c[i] - 'A' + 'a');
    if (*p == '-')
        sign = -1.0;
    if (*p == '+' || *p == '-')
        p++;
    if (strcmp(p, ".inf") == 0) {
        v = INFINITY;
    } else if (strcmp(p, ".nan") == 0) {
        v = NAN;
        sign = 1.0;
    } else if (strchr(p, ':')) {
        /* digits reversed, value += digit * base, base *= 60 */
        double base = 1.0, digit;
        char *q;

        while ((q = strrchr(p, ':'))) {
            if (!py_float(q + 1, &digit)) {
                bad = BAD_FLOAT;
                break;
            }
            v += digit * base;
            base *= 60;
            *q = '\0';
        }
        if (!bad && py_float(p, &digit))
            v += digit * base;
        else
            bad = BAD_FLOAT;
    } else if (!py_float(p, &v)) {
        bad = BAD_FLOAT;
    }
    nd->fval = bad ? 0.0 : sign * v;
    free(c);
    return bad;
}

/* repr() of a float: the shortest string that reads back the same. */
static void
float_repr(double v, struct buf *b)
{
    char tmp[48], digits[24];
    const char *p;
    int prec, exp, nd = 0;

    if (isnan(v)) {
        buf_puts(b, "nan");
        return;
    }
    if (isinf(v)) {
        buf_puts(b, v < 0 ? "-inf" : "inf");
        return;
    }
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof(tmp), "%.*e", prec - 1, v);
        if (strtod(tmp, NULL) == v)
            break;
    }
    p = tmp;
    if (*p == '-') {
        buf_putc(b, '-');
        p++;
    }
    for (; *p && *p != 'e'; p++)
        if (is_digit(*p))
            digits[nd++] = *p;
    exp = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    if (exp < -4 || exp >= 16) {
        buf_putc(b, digits[0]);
        if (nd > 1) {
            buf_putc(b, '.');
            buf_append(b, digits + 1, (size_t)nd - 1);
        }
        buf_printf(b, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    } else if (exp < 0) {
        buf_puts(b, "0.");
        for (int i = 0; i < -exp - 1; i++)
            buf_putc(b, '0');
        buf_append(b, digits, (size_t)nd);
    } else {
        for (int i = 0; i <= exp; i++)
            buf_putc(b, i < nd ? digits[i] : '0');
        buf_putc(b, '.');
        if (nd > exp + 1)
            buf_append(b, digits + exp + 1, (size_t)(nd - exp - 1));
        else
            buf_putc(b, '0');
    }
}

/*
 * Types a scalar as PyYAML's composer and SafeConstructor would: plain
 * untagged scalars through the implicit resolvers, "!" and quoted ones as
 * str, explicit tags through their constructor.
 */
static void
scalar_type(struct pyyaml_node *nd, bool plain)
{
    const char *s = nd->val, *t = nd->tag;
    size_t n = nd->len;
    struct ts ts;
    int b;

    if (t && strncmp(t, yaml_tag_prefix, sizeof(yaml_tag_prefix) - 1) == 0)
        t += sizeof(yaml_tag_prefix) - 1;
    else if (t && strcmp(t, "!") != 0)
        goto unsupported;
    if (!t && plain) {
        if ((b = match_bool(s, n)) >= 0) {
            nd->type = PYYAML_BOOL;
            nd->ival = b;
            nd->ival_ok = true;
        } else if (match_float(s, n)) {
            nd->type = PYYAML_FLOAT;
            nd->bad = (unsigned char)float_construct(nd);
        } else if (match_int(s, n)) {
            nd->type = PYYAML_INT;
            nd->bad = (unsigned char)int_construct(nd);
        } else if (span_is(s, n, "<<")) {
            nd->type = PYYAML_MERGE;
        } else if (match_null(s, n)) {
            nd->type = PYYAML_NULL;
        } else if (n && is_digit(s[0]) && match_ts(s, n, true, &ts)) {
            nd->type = PYYAML_TS;
            if (!ts_valid(&ts))
                nd->bad = BAD_TS;
        } else if (span_is(s, n, "=")) {
            nd->type = PYYAML_VALUE;
        } else {
            nd->type = PYYAML_STR;
        }
        return;
    }
    if (!t || strcmp(t, "!") == 0 || strcmp(t, "str") == 0) {
        nd->type = PYYAML_STR;
    } else if (strcmp(t, "null") == 0) {
        nd->type = PYYAML_NULL; /* construct_yaml_null ignores the value */
    } else if (strcmp(t, "bool") == 0) {
        char low[8];
        size_t i;

        nd->type = PYYAML_BOOL;
        for (i = 0; i < n && i < sizeof(low) - 1; i++)
            low[i] = (char)(s[i] >= 'A' && s[i] <= 'Z' ? s[i] - 'A' + 'a' : s[i]);
        b = n < sizeof(low) ? match_bool(low, i) : -1;
        nd->ival = b > 0;
        nd->ival_ok = true;
        if (b < 0)
            nd->bad = BAD_BOOL;
    } else if (strcmp(t, "int") == 0) {
        nd->type = PYYAML_INT;
        nd->bad = match_int(s, n) ? (unsigned char)int_construct(nd) : BAD_INT;
    } else if (strcmp(t, "float") == 0) {
        nd->type = PYYAML_FLOAT;
        nd->bad = (unsigned char)float_construct(nd);
    } else if (strcmp(t, "timestamp") == 0) {
        nd->type = PYYAML_TS;
        if (!match_ts(s, n, false, &ts) || !ts_valid(&ts))
            nd->bad = BAD_TS;
    } else if (strcmp(t, "merge") == 0) {
        nd->type = PYYAML_MERGE;
    } else if (strcmp(t, "value") == 0) {
        nd->type = PYYAML_VALUE;
    } else {
        goto unsupported;
    }
    return;
unsupported:
    nd->type = PYYAML_STR;
    nd->bad = BAD_TAG;
}

/* ---- building the tree ---- */

static int
too_many(struct pyyaml_doc *d, struct esd_err *err)
{
    return err_set(err, -EINVAL, "recipe %s: too many YAML nodes (alias expansion?), limit %zu",
                   d->name, d->max_nodes);
}

static int
too_deep(struct pyyaml_doc *d, unsigned long line, struct esd_err *err)
{
    return err_set(err, -EINVAL, "recipe %s:%lu: YAML nesting deeper than %zu levels", d->name,
                   line, d->max_depth);
}

static struct pyyaml_node *
node_new(struct pyyaml_doc *d, int kind, const yaml_mark_t *mark, const yaml_char_t *tag)
{
    struct pyyaml_node *nd = xcalloc(1, sizeof(*nd));

    nd->kind = (unsigned char)kind;
    nd->line = (unsigned long)mark->line + 1;
    nd->size = 1;
    if (tag)
        nd->tag = xstrdup((const char *)tag);
    if (d->nall == d->capall) {
        d->capall = d->capall ? d->capall * 2 : 64;
        d->all = xrealloc(d->all, d->capall * sizeof(*d->all));
    }
    d->all[d->nall++] = nd;
    return nd;
}

static void
node_add(struct pyyaml_node *parent, struct pyyaml_node *kid)
{
    if (parent->n == parent->cap) {
        parent->cap = parent->cap ? parent->cap * 2 : 4;
        parent->kids = xrealloc(parent->kids, parent->cap * sizeof(*parent->kids));
    }
    parent->kids[parent->n++] = kid;
}

static size_t
anchor_hash(const char *s)
{
    size_t h = 14695981039346656037u;

    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211u;
    return h;
}

static struct pyyaml_anchor *
anchor_slot(struct pyyaml_doc *d, const char *name)
{
    size_t i = anchor_hash(name) & (d->capanch - 1);

    while (d->anch[i].name && strcmp(d->anch[i].name, name) != 0)
        i = (i + 1) & (d->capanch - 1);
    return &d->anch[i];
}

static struct pyyaml_node *
anchor_find(struct pyyaml_doc *d, const char *name)
{
    return d->capanch ? anchor_slot(d, name)->node : NULL;
}

/* Registers an anchor; PyYAML refuses a second one of the same name. */
static int
anchor_add(struct pyyaml_doc *d, const char *name, struct pyyaml_node *nd, struct esd_err *err)
{
    struct pyyaml_anchor *a;

    if (anchor_find(d, name))
        return err_set(err, -EINVAL, "recipe %s:%lu: found duplicate anchor '%s'", d->name,
                       nd->line, name);
    if (2 * (d->nanch + 1) > d->capanch) {
        struct pyyaml_anchor *old = d->anch;
        size_t oldcap = d->capanch;

        d->capanch = oldcap ? oldcap * 2 : 64;
        d->anch = xcalloc(d->capanch, sizeof(*d->anch));
        for (size_t i = 0; i < oldcap; i++)
            if (old[i].name)
                *anchor_slot(d, old[i].name) = old[i];
        free(old);
    }
    a = anchor_slot(d, name);
    a->name = xstrdup(name);
    a->node = nd;
    d->nanch++;
    return 0;
}

/* Hangs a complete node (or an alias target) under the open collection. */
static void
attach(struct pyyaml_doc *d, struct pyyaml_node **stack, size_t depth, struct pyyaml_node *nd)
{
    if (depth)
        node_add(stack[depth - 1], nd);
    else
        d->root = nd;
}

static int
yaml_error(struct pyyaml_doc *d, const yaml_parser_t *p, const char *data, size_t len,
           struct esd_err *err)
{
    unsigned long line = (unsigned long)p->problem_mark.line + 1;
    const char *problem = p->problem ? p->problem : "unknown error";

    if (p->error == YAML_MEMORY_ERROR)
        return err_set(err, -ENOMEM, "recipe %s: out of memory while parsing YAML", d->name);
    if (p->error == YAML_READER_ERROR) {
        /* reader errors carry a byte offset, not a mark */
        line = 1;
        for (size_t i = 0; i < p->problem_offset && i < len; i++)
            line += data[i] == '\n';
        return err_set(err, -EINVAL, "invalid YAML in %s:%lu: %s at byte %zu", d->name, line,
                       problem, p->problem_offset);
    }
    if (p->context)
        return err_set(err, -EINVAL, "invalid YAML in %s:%lu: %s (%s)", d->name, line, problem,
                       p->context);
    return err_set(err, -EINVAL, "invalid YAML in %s:%lu: %s", d->name, line, problem);
}

/* One event into the tree; *ret_end set at the end of the stream. */
static int
doc_event(struct pyyaml_doc *d, const yaml_event_t *ev, struct pyyaml_node **stack, size_t *depth,
          int *ndocs, bool *ret_end, struct esd_err *err)
{
    unsigned long line = (unsigned long)ev->start_mark.line + 1;
    const yaml_char_t *anchor = NULL;
    struct pyyaml_node *nd, *t;
    int rc;

    switch (ev->type) {
    case YAML_STREAM_END_EVENT:
        *ret_end = true;
        return 0;
    case YAML_DOCUMENT_START_EVENT:
        if ((*ndocs)++)
            return err_set(err, -EINVAL,
                           "recipe %s:%lu: only a single YAML document is allowed, found another",
                           d->name, line);
        return 0;
    case YAML_ALIAS_EVENT: {
        const char *name = (const char *)ev->data.alias.anchor;

        t = anchor_find(d, name);
        if (!t)
            return err_set(err, -EINVAL, "recipe %s:%lu: found undefined alias '%s'", d->name, line,
                           name);
        if (!t->done)
            return err_set(err, -EINVAL, "recipe %s:%lu: recursive alias '%s' is not supported",
                           d->name, line, name);
        /* expanded at every use: its whole subtree counts again */
        if (t->size > d->max_nodes - d->count)
            return too_many(d, err);
        d->count += t->size;
        if (*depth + t->height > d->max_depth)
            return too_deep(d, line, err);
        attach(d, stack, *depth, t);
        return 0;
    }
    case YAML_SCALAR_EVENT:
        if (d->count >= d->max_nodes)
            return too_many(d, err);
        d->count++;
        nd = node_new(d, PYYAML_SCALAR, &ev->start_mark, ev->data.scalar.tag);
        nd->val = xstrndup((const char *)ev->data.scalar.value, ev->data.scalar.length);
        nd->len = ev->data.scalar.length;
        nd->done = true;
        scalar_type(nd, ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE);
        anchor = ev->data.scalar.anchor;
        break;
    case YAML_SEQUENCE_START_EVENT:
    case YAML_MAPPING_START_EVENT: {
        bool seq = ev->type == YAML_SEQUENCE_START_EVENT;
        const yaml_char_t *tag = seq ? ev->data.sequence_start.tag : ev->data.mapping_start.tag;
        const char *want = seq ? "tag:yaml.org,2002:seq" : "tag:yaml.org,2002:map";

        if (d->count >= d->max_nodes)
            return too_many(d, err);
        d->count++;
        if (*depth + 1 > d->max_depth)
            return too_deep(d, line, err);
        nd = node_new(d, seq ? PYYAML_SEQ : PYYAML_MAP, &ev->start_mark, tag);
        if (nd->tag && strcmp(nd->tag, "!") != 0 && strcmp(nd->tag, want) != 0)
            nd->bad = BAD_TAG;
        anchor = seq ? ev->data.sequence_start.anchor : ev->data.mapping_start.anchor;
        /* the anchor is known before the children, as in PyYAML's composer,
         * so an alias inside its own node is seen (and refused) as recursive */
        if (anchor && (rc = anchor_add(d, (const char *)anchor, nd, err)) < 0)
            return rc;
        attach(d, stack, *depth, nd);
        stack[(*depth)++] = nd;
        return 0;
    }
    case YAML_SEQUENCE_END_EVENT:
    case YAML_MAPPING_END_EVENT:
        nd = stack[--(*depth)];
        for (size_t i = 0; i < nd->n; i++) {
            /* the running count already bounds these sums */
            nd->size += nd->kids[i]->size;
            if (nd->kids[i]->height + 1 > nd->height)
                nd->height = nd->kids[i]->height + 1;
        }
        if (!nd->height)
            nd->height = 1;
        nd->done = true;
        return 0;
    default:
        return 0;
    }
    if (anchor && (rc = anchor_add(d, (const char *)anchor, nd, err)) < 0)
        return rc;
    attach(d, stack, *depth, nd);
    return 0;
}

static int
doc_parse(struct pyyaml_doc *d, const char *data, size_t len, struct esd_err *err)
{
    yaml_parser_t p;
    yaml_event_t ev;
    /* the open collections; the depth check keeps within max_depth */
    struct pyyaml_node **stack = xcalloc(d->max_depth, sizeof(*stack));
    size_t depth = 0;
    int ndocs = 0, rc = 0;
    bool end = false;

    if (!yaml_parser_initialize(&p)) {
        free(stack);
        return err_set(err, -ENOMEM, "recipe %s: out of memory while parsing YAML", d->name);
    }
    yaml_parser_set_input_string(&p, (const unsigned char *)(data ? data : ""), len);
    while (!rc && !end) {
        if (!yaml_parser_parse(&p, &ev)) {
            rc = yaml_error(d, &p, data, len, err);
            break;
        }
        rc = doc_event(d, &ev, stack, &depth, &ndocs, &end, err);
        yaml_event_delete(&ev);
    }
    free(stack);
    yaml_parser_delete(&p);
    return rc;
}

void
pyyaml_free(struct pyyaml_doc *d)
{
    for (size_t i = 0; i < d->nall; i++) {
        free(d->all[i]->tag);
        free(d->all[i]->val);
        free(d->all[i]->kids);
        free(d->all[i]);
    }
    free(d->all);
    for (size_t i = 0; i < d->capanch; i++)
        free(d->anch[i].name);
    free(d->anch);
}

/* ---- reading the tree as Python would see it ---- */

bool
pyyaml_is_str(const struct pyyaml_node *nd)
{
    return nd->kind == PYYAML_SCALAR && (nd->type == PYYAML_STR || nd->type == PYYAML_VALUE);
}

bool
pyyaml_str_is(const struct pyyaml_node *nd, const char *s)
{
    return pyyaml_is_str(nd) && span_is(nd->val, nd->len, s);
}

bool
pyyaml_is_null(const struct pyyaml_node *nd)
{
    return nd->kind == PYYAML_SCALAR && nd->type == PYYAML_NULL;
}

static bool
is_merge_key(const struct pyyaml_node *nd)
{
    return nd->kind == PYYAML_SCALAR && nd->type == PYYAML_MERGE;
}

/*
 * The value the mapping PyYAML builds from m holds for the string key
 * `name`, or NULL. flatten_mapping puts the merged pairs (of the later "<<"
 * last; of a list of mappings, the first mapping last) before m's own, and
 * later pairs win, so: own pairs, then "<<" values from the last.
 */
const struct pyyaml_node *
pyyaml_map_get(const struct pyyaml_node *m, const char *name, const struct pyyaml_node **ret_key)
{
    const struct pyyaml_node *v;

    for (size_t i = m->n; i >= 2; i -= 2)
        if (!is_merge_key(m->kids[i - 2]) && pyyaml_str_is(m->kids[i - 2], name)) {
            if (ret_key)
                *ret_key = m->kids[i - 2];
            return m->kids[i - 1];
        }
    for (size_t i = m->n; i >= 2; i -= 2) {
        const struct pyyaml_node *mv = m->kids[i - 1];

        if (!is_merge_key(m->kids[i - 2]))
            continue;
        if (mv->kind == PYYAML_MAP && (v = pyyaml_map_get(mv, name, ret_key)))
            return v;
        if (mv->kind == PYYAML_SEQ)
            for (size_t j = 0; j < mv->n; j++)
                if ((v = pyyaml_map_get(mv->kids[j], name, ret_key)))
                    return v;
    }
    return NULL;
}

/* The pairs of m in the order flatten_mapping leaves them. */
bool
pyyaml_map_each(const struct pyyaml_node *m,
                bool (*fn)(const struct pyyaml_node *k, const struct pyyaml_node *v, void *arg),
                void *arg)
{
    for (size_t i = 0; i + 1 < m->n; i += 2) {
        const struct pyyaml_node *mv = m->kids[i + 1];

        if (!is_merge_key(m->kids[i]))
            continue;
        if (mv->kind == PYYAML_MAP && !pyyaml_map_each(mv, fn, arg))
            return false;
        if (mv->kind == PYYAML_SEQ)
            for (size_t j = mv->n; j > 0; j--)
                if (!pyyaml_map_each(mv->kids[j - 1], fn, arg))
                    return false;
    }
    for (size_t i = 0; i + 1 < m->n; i += 2)
        if (!is_merge_key(m->kids[i]) && !fn(m->kids[i], m->kids[i + 1], arg))
            return false;
    return true;
}

static bool
map_empty(const struct pyyaml_node *m)
{
    for (size_t i = 0; i + 1 < m->n; i += 2) {
        const struct pyyaml_node *mv = m->kids[i + 1];

        if (!is_merge_key(m->kids[i]))
            return false;
        if (mv->kind == PYYAML_MAP && !map_empty(mv))
            return false;
        if (mv->kind == PYYAML_SEQ)
            for (size_t j = 0; j < mv->n; j++)
                if (!map_empty(mv->kids[j]))
                    return false;
    }
    return true;
}

/* Python truthiness of the constructed value. */
bool
pyyaml_truthy(const struct pyyaml_node *nd)
{
    if (nd->kind == PYYAML_SEQ)
        return nd->n > 0;
    if (nd->kind == PYYAML_MAP)
        return !map_empty(nd);
    switch (nd->type) {
    case PYYAML_NULL:
        return false;
    case PYYAML_BOOL:
        return nd->ival != 0;
    case PYYAML_INT:
        return nd->ival_ok ? nd->ival != 0 : true;
    case PYYAML_FLOAT:
        return nd->fval != 0.0; /* nan is truthy */
    case PYYAML_TS:
        return true;
    default:
        return nd->len > 0;
    }
}

/*
 * Python equality of two hashable keys, enough to count an operator's keys:
 * str, None, numbers (True == 1 == 1.0), timestamps by their text. Ints
 * beyond 64 bits compare by their text, which can only miss equal ones.
 */
bool
pyyaml_key_equal(const struct pyyaml_node *a, const struct pyyaml_node *b)
{
    bool na = a->type == PYYAML_BOOL || a->type == PYYAML_INT || a->type == PYYAML_FLOAT;
    bool nb = b->type == PYYAML_BOOL || b->type == PYYAML_INT || b->type == PYYAML_FLOAT;

    if (a == b)
        return true;
    if (pyyaml_is_str(a) || pyyaml_is_str(b))
        return pyyaml_is_str(a) && pyyaml_is_str(b) && a->len == b->len &&
               memcmp(a->val, b->val, a->len) == 0;
    if (na && nb) {
        if (a->type == PYYAML_FLOAT || b->type == PYYAML_FLOAT) {
            double fa = a->type == PYYAML_FLOAT ? a->fval : (double)a->ival;
            double fb = b->type == PYYAML_FLOAT ? b->fval : (double)b->ival;

            if ((a->type != PYYAML_FLOAT && !a->ival_ok) ||
                (b->type != PYYAML_FLOAT && !b->ival_ok))
                return false;
            return fa == fb;
        }
        if (a->ival_ok && b->ival_ok)
            return a->ival == b->ival;
        return !a->ival_ok && !b->ival_ok && a->len == b->len &&
               memcmp(a->val, b->val, a->len) == 0;
    }
    if (a->type != b->type)
        return false;
    return a->type == PYYAML_NULL || (a->len == b->len && memcmp(a->val, b->val, a->len) == 0);
}

/* str() of a scalar; -ERANGE for an int Python 3.11 will not print. */
static int
scalar_str(const struct pyyaml_node *nd, struct buf *b)
{
    struct ts ts;

    switch (nd->type) {
    case PYYAML_NULL:
        buf_puts(b, "None");
        return 0;
    case PYYAML_BOOL:
        buf_puts(b, nd->ival ? "True" : "False");
        return 0;
    case PYYAML_INT:
        return int_str(nd, b);
    case PYYAML_FLOAT:
        float_repr(nd->fval, b);
        return 0;
    case PYYAML_TS:
        match_ts(nd->val, nd->len, false, &ts);
        ts_str(&ts, b);
        return 0;
    default:
        buf_append(b, nd->val, nd->len);
        return 0;
    }
}

struct repr {
    struct buf *b;
    size_t max;
};

static bool node_repr(const struct pyyaml_node *nd, struct repr *r);

static bool
repr_pair(const struct pyyaml_node *k, const struct pyyaml_node *v, void *arg)
{
    struct repr *r = arg;

    if (r->b->p[r->b->len - 1] != '{')
        buf_puts(r->b, ", ");
    if (!node_repr(k, r))
        return false;
    buf_puts(r->b, ": ");
    return node_repr(v, r);
}

/*
 * repr() of a value, cut with "..." past r->max bytes (false then). A
 * mapping lists its pairs in flattened order without folding duplicates.
 */
static bool
node_repr(const struct pyyaml_node *nd, struct repr *r)
{
    if (r->b->len > r->max) {
        buf_puts(r->b, "...");
        return false;
    }
    if (nd->kind == PYYAML_SEQ) {
        buf_putc(r->b, '[');
        for (size_t i = 0; i < nd->n; i++) {
            if (i)
                buf_puts(r->b, ", ");
            if (!node_repr(nd->kids[i], r))
                return false;
        }
        buf_putc(r->b, ']');
    } else if (nd->kind == PYYAML_MAP) {
        buf_putc(r->b, '{');
        if (!pyyaml_map_each(nd, repr_pair, r))
            return false;
        buf_putc(r->b, '}');
    } else if (pyyaml_is_str(nd)) {
        py_repr_str(nd->val, nd->len, r->b);
    } else if (nd->type == PYYAML_INT && nd->len > MSG_REPR_MAX) {
        buf_puts(r->b, "<int>");
    } else if (scalar_str(nd, r->b) < 0) {
        buf_puts(r->b, "<int>");
    }
    return true;
}

/* Python str() of any value, collections cut at STR_REPR_MAX; caller frees. */
int
pyyaml_str(const struct pyyaml_node *nd, char **ret)
{
    struct buf b;
    struct repr r;
    int rc = 0;

    buf_init(&b);
    if (nd->kind == PYYAML_SCALAR) {
        rc = scalar_str(nd, &b);
    } else {
        r.b = &b;
        r.max = STR_REPR_MAX;
        node_repr(nd, &r);
    }
    if (rc < 0) {
        buf_free(&b);
        return rc;
    }
    *ret = buf_steal(&b);
    return 0;
}

/* A value as Python's repr shows it, cut at max bytes. Caller frees. */
static char *
repr_cut(const struct pyyaml_node *nd, size_t max)
{
    struct buf b;
    struct repr r = { &b, max };

    buf_init(&b);
    node_repr(nd, &r);
    return buf_steal(&b);
}

/* For messages: a value as Python's repr shows it, shortened. Caller frees. */
char *
pyyaml_msg_repr(const struct pyyaml_node *nd)
{
    return repr_cut(nd, MSG_REPR_MAX);
}

/* For messages: str() of an operator name, shortened. Caller frees. */
char *
pyyaml_msg_str(const struct pyyaml_node *nd)
{
    struct buf b;

    if (!pyyaml_is_str(nd))
        return pyyaml_msg_repr(nd);
    buf_init(&b);
    buf_append(&b, nd->val, nd->len < MSG_REPR_MAX ? nd->len : MSG_REPR_MAX);
    if (nd->len > MSG_REPR_MAX)
        buf_puts(&b, "...");
    return buf_steal(&b);
}

/* ---- construction checks: what would make safe_load raise ---- */

const char *
pyyaml_kind_name(const struct pyyaml_node *nd)
{
    return nd->kind == PYYAML_SEQ ? "sequence" : nd->kind == PYYAML_MAP ? "mapping" : "scalar";
}

static int
bad_msg(struct pyyaml_doc *d, const struct pyyaml_node *nd, struct esd_err *err)
{
    static const char *const what[] = { "", "", "bool", "int", "float", "timestamp" };

    if (nd->bad == BAD_TAG)
        return err_set(err, -EINVAL, "recipe %s:%lu: unsupported YAML tag '%s' on a %s", d->name,
                       nd->line, nd->tag ? nd->tag : "", pyyaml_kind_name(nd));
    return err_set(err, -EINVAL, "recipe %s:%lu: cannot construct a %s from '%.*s%s'", d->name,
                   nd->line, what[nd->bad], (int)(nd->len < MSG_REPR_MAX ? nd->len : MSG_REPR_MAX),
                   nd->val, nd->len > MSG_REPR_MAX ? "..." : "");
}

/* A plain "<<" or "=" anywhere but as a key has no SafeLoader constructor. */
static int
check_value(struct pyyaml_doc *d, const struct pyyaml_node *nd, struct esd_err *err)
{
    if (nd->kind == PYYAML_SCALAR && (nd->type == PYYAML_MERGE || nd->type == PYYAML_VALUE))
        return err_set(err, -EINVAL,
                       "recipe %s:%lu: '%s' can only be used as a mapping key (quote it)", d->name,
                       nd->line, nd->type == PYYAML_MERGE ? "<<" : "=");
    return 0;
}

static int
doc_check(struct pyyaml_doc *d, struct esd_err *err)
{
    int rc;

    if (d->root && (rc = check_value(d, d->root, err)) < 0)
        return rc;
    for (size_t i = 0; i < d->nall; i++) {
        const struct pyyaml_node *nd = d->all[i];

        if (nd->bad)
            return bad_msg(d, nd, err);
        if (nd->kind == PYYAML_SEQ)
            for (size_t j = 0; j < nd->n; j++)
                if ((rc = check_value(d, nd->kids[j], err)) < 0)
                    return rc;
        if (nd->kind != PYYAML_MAP)
            continue;
        for (size_t j = 0; j + 1 < nd->n; j += 2) {
            const struct pyyaml_node *k = nd->kids[j], *v = nd->kids[j + 1];
            bool ok = v->kind == PYYAML_MAP;

            if (k->kind != PYYAML_SCALAR)
                return err_set(err, -EINVAL,
                               "recipe %s:%lu: found unhashable key (a %s used as a key)", d->name,
                               k->line, pyyaml_kind_name(k));
            if (k->type == PYYAML_MERGE) {
                for (size_t m = 0; v->kind == PYYAML_SEQ && m < v->n; m++)
                    if (v->kids[m]->kind != PYYAML_MAP)
                        return err_set(err, -EINVAL,
                                       "recipe %s:%lu: expected a mapping for merging, found a %s",
                                       d->name, v->kids[m]->line, pyyaml_kind_name(v->kids[m]));
                if (!ok && v->kind != PYYAML_SEQ)
                    return err_set(err, -EINVAL,
                                   "recipe %s:%lu: expected a mapping or list of mappings for "
                                   "merging, found a %s",
                                   d->name, v->line, pyyaml_kind_name(v));
            }
            if ((rc = check_value(d, v, err)) < 0)
                return rc;
        }
    }
    return 0;
}

/* ---- public interface ---- */

int
pyyaml_parse(struct pyyaml_doc *d, const char *data, size_t len, const char *name, size_t max_nodes,
             size_t max_depth, struct esd_err *err)
{
    int rc;

    memset(d, 0, sizeof(*d));
    d->name = name;
    d->max_nodes = max_nodes;
    d->max_depth = max_depth > DEPTH_CAP ? DEPTH_CAP : max_depth;
    rc = doc_parse(d, data, len, err);
    if (!rc)
        rc = doc_check(d, err);
    return rc;
}

char *
pyyaml_repr(const struct pyyaml_node *nd)
{
    return repr_cut(nd, STR_REPR_MAX);
}

/* ---- writing a tree back ---- */

/* A key written as "k": v, not as the explicit "? k : v" that long or
 * odd keys need (PyYAML takes a simple key of at most 1024 characters). */
static bool
plain_key(const struct pyyaml_node *k)
{
    if (k->kind != PYYAML_SCALAR || k->type != PYYAML_STR || k->len > 128)
        return false;
    for (size_t i = 0; i < k->len; i++)
        if ((unsigned char)k->val[i] < 0x20 || (unsigned char)k->val[i] >= 0x7f)
            return false;
    return true;
}

/*
 * s as a double-quoted scalar PyYAML reads back as the same str: the
 * characters its reader refuses raw (C0 and C1 controls, U+FEFF, U+FFFE,
 * U+FFFF) and those it takes for line breaks (NEL, U+2028, U+2029) are
 * escaped; everything else is copied. s is UTF-8, as libyaml gives it.
 */
static void
emit_quoted(const char *s, size_t n, struct buf *o)
{
    const unsigned char *u = (const unsigned char *)s;

    buf_putc(o, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = u[i];

        if (c == '"' || c == '\\') {
            buf_putc(o, '\\');
            buf_putc(o, (char)c);
        } else if (c < 0x20 || c == 0x7f) {
            buf_printf(o, "\\x%02x", c);
        } else if (c == 0xc2 && i + 1 < n && u[i + 1] >= 0x80 && u[i + 1] <= 0x9f) {
            buf_printf(o, "\\x%02x", u[++i]);
        } else if (c == 0xe2 && i + 2 < n && u[i + 1] == 0x80 &&
                   (u[i + 2] == 0xa8 || u[i + 2] == 0xa9)) {
            buf_printf(o, "\\u20%02x", u[i + 2] - 0x80);
            i += 2;
        } else if (c == 0xef && i + 2 < n &&
                   ((u[i + 1] == 0xbb && u[i + 2] == 0xbf) ||
                    (u[i + 1] == 0xbf && (u[i + 2] == 0xbe || u[i + 2] == 0xbf)))) {
            buf_printf(o, "\\u%s", u[i + 1] == 0xbb ? "feff" : u[i + 2] == 0xbe ? "fffe" : "ffff");
            i += 2;
        } else {
            buf_putc(o, (char)c);
        }
    }
    buf_putc(o, '"');
}

struct emit_st {
    struct buf *o;
    bool first;
};

static bool emit_pair(const struct pyyaml_node *k, const struct pyyaml_node *v, void *arg);

/* -?(0|[1-9][0-9]*), at most 18 digits */
static bool
plain_decimal(const char *p, size_t n)
{
    size_t i = n && p[0] == '-' ? 1 : 0;

    if (i == n || n - i > 18 || (p[i] == '0' && n - i > 1))
        return false;
    for (; i < n; i++)
        if (p[i] < '0' || p[i] > '9')
            return false;
    return true;
}

void
pyyaml_emit(const struct pyyaml_node *nd, struct buf *o)
{
    static const char *const tags[] = {
        [PYYAML_INT] = "!!int ",
        [PYYAML_FLOAT] = "!!float ",
        [PYYAML_TS] = "!!timestamp ",
    };
    struct emit_st st = { o, true };

    switch (nd->kind) {
    case PYYAML_SEQ:
        buf_putc(o, '[');
        for (size_t i = 0; i < nd->n; i++) {
            if (i)
                buf_puts(o, ", ");
            pyyaml_emit(nd->kids[i], o);
        }
        buf_putc(o, ']');
        return;
    case PYYAML_MAP:
        buf_putc(o, '{');
        pyyaml_map_each(nd, emit_pair, &st);
        buf_putc(o, '}');
        return;
    }
    switch (nd->type) {
    case PYYAML_NULL:
        buf_puts(o, "null");
        return;
    case PYYAML_BOOL:
        buf_puts(o, nd->ival ? "true" : "false");
        return;
    case PYYAML_INT:
        /* a plain decimal (what most recipes hold) as itself: every
         * reader takes it for the same int */
        if (plain_decimal(nd->val, nd->len)) {
            buf_append(o, nd->val, nd->len);
            return;
        }
        /* fall through */
    case PYYAML_FLOAT:
    case PYYAML_TS:
        /* the constructor the resolver chose, on the text it saw */
        buf_puts(o, tags[nd->type]);
        emit_quoted(nd->val, nd->len, o);
        return;
    default:
        emit_quoted(nd->val, nd->len, o);
    }
}

static bool
emit_pair(const struct pyyaml_node *k, const struct pyyaml_node *v, void *arg)
{
    struct emit_st *st = arg;
    bool simple = plain_key(k);

    if (!st->first)
        buf_puts(st->o, ", ");
    st->first = false;
    if (!simple)
        buf_puts(st->o, "? ");
    pyyaml_emit(k, st->o);
    buf_puts(st->o, simple ? ": " : " : ");
    pyyaml_emit(v, st->o);
    return true;
}
