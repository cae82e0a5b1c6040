/*
 * recipe: reads a Data-Juicer YAML recipe and decides whether it can run per
 * shard (spec §7). libyaml's event parser feeds a small tree of our own; the
 * tree is built under three bounds fixed before any work is done (file size,
 * a node budget that counts an alias at every use, and a nesting cap), so a
 * hostile recipe costs at most max_nodes nodes of memory and time. Recursive
 * aliases are refused when they are met. Scalars are then typed as PyYAML's
 * SafeLoader types them and every node is checked to be constructible as
 * safe_load would construct it, before the rules of §7 are applied to the
 * mapping PyYAML would have returned (merge keys flattened, later keys win).
 */
#include "recipe.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>

/* Python 3.11 refuses int <-> decimal str conversions beyond this. */
#define PY_INT_MAX_DIGITS 4300
/* The checks after parsing recurse along nesting; keep that off the C stack. */
#define DEPTH_CAP 1000u
/* Longest value quoted in a message, and longest str() of a list/mapping. */
#define MSG_REPR_MAX 120
#define STR_REPR_MAX 4096

enum { K_SCALAR, K_SEQ, K_MAP };
/* Python types of scalars; MERGE and VALUE are PyYAML's "<<" and "=". */
enum { T_STR, T_NULL, T_BOOL, T_INT, T_FLOAT, T_TS, T_MERGE, T_VALUE };
/* Why safe_load could not construct a node. */
enum { BAD_NONE, BAD_TAG, BAD_BOOL, BAD_INT, BAD_FLOAT, BAD_TS };

struct ynode {
    unsigned char kind;
    unsigned char type;  /* scalars */
    unsigned char bad;   /* BAD_*: reported after parsing, as PyYAML would */
    bool done;           /* complete: aliases to it may be expanded */
    bool ival_ok;        /* ints and bools: ival holds the exact value */
    unsigned long line;  /* 1-based */
    size_t size;         /* nodes in the alias-expanded subtree */
    size_t height;       /* sequence/mapping nesting inside, 0 for scalars */
    char *tag;           /* explicit tag as libyaml resolved it, or NULL */
    char *val;           /* scalars: value, NUL-terminated, may hold NULs */
    size_t len;
    long long ival;
    double fval;
    struct ynode **kids; /* sequences: items; mappings: key, value, key, … */
    size_t n, cap;
};

struct anchor {
    char *name;
    struct ynode *node;
};

struct ydoc {
    const char *name;
    size_t max_nodes;
    size_t max_depth;
    struct ynode **all; /* every node, in creation order; owns them */
    size_t nall, capall;
    struct anchor *anch; /* open addressing, capanch a power of two */
    size_t nanch, capanch;
    struct ynode *root;
    size_t count; /* nodes so far, aliases expanded */
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
    { "yes", true },    { "Yes", true },    { "YES", true },    { "no", false },
    { "No", false },    { "NO", false },    { "true", true },   { "True", true },
    { "TRUE", true },   { "false", false }, { "False", false }, { "FALSE", false },
    { "on", true },     { "On", true },     { "ON", true },     { "off", false },
    { "Off", false },   { "OFF", false },
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
int_construct(struct ynode *nd)
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
int_str(const struct ynode *nd, struct buf *b)
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
float_construct(struct ynode *nd)
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
scalar_type(struct ynode *nd, bool plain)
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
            nd->type = T_BOOL;
            nd->ival = b;
            nd->ival_ok = true;
        } else if (match_float(s, n)) {
            nd->type = T_FLOAT;
            nd->bad = (unsigned char)float_construct(nd);
        } else if (match_int(s, n)) {
            nd->type = T_INT;
            nd->bad = (unsigned char)int_construct(nd);
        } else if (span_is(s, n, "<<")) {
            nd->type = T_MERGE;
        } else if (match_null(s, n)) {
            nd->type = T_NULL;
        } else if (n && is_digit(s[0]) && match_ts(s, n, true, &ts)) {
            nd->type = T_TS;
            if (!ts_valid(&ts))
                nd->bad = BAD_TS;
        } else if (span_is(s, n, "=")) {
            nd->type = T_VALUE;
        } else {
            nd->type = T_STR;
        }
        return;
    }
    if (!t || strcmp(t, "!") == 0 || strcmp(t, "str") == 0) {
        nd->type = T_STR;
    } else if (strcmp(t, "null") == 0) {
        nd->type = T_NULL; /* construct_yaml_null ignores the value */
    } else if (strcmp(t, "bool") == 0) {
        char low[8];
        size_t i;

        nd->type = T_BOOL;
        for (i = 0; i < n && i < sizeof(low) - 1; i++)
            low[i] = (char)(s[i] >= 'A' && s[i] <= 'Z' ? s[i] - 'A' + 'a' : s[i]);
        b = n < sizeof(low) ? match_bool(low, i) : -1;
        nd->ival = b > 0;
        nd->ival_ok = true;
        if (b < 0)
            nd->bad = BAD_BOOL;
    } else if (strcmp(t, "int") == 0) {
        nd->type = T_INT;
        nd->bad = match_int(s, n) ? (unsigned char)int_construct(nd) : BAD_INT;
    } else if (strcmp(t, "float") == 0) {
        nd->type = T_FLOAT;
        nd->bad = (unsigned char)float_construct(nd);
    } else if (strcmp(t, "timestamp") == 0) {
        nd->type = T_TS;
        if (!match_ts(s, n, false, &ts) || !ts_valid(&ts))
            nd->bad = BAD_TS;
    } else if (strcmp(t, "merge") == 0) {
        nd->type = T_MERGE;
    } else if (strcmp(t, "value") == 0) {
        nd->type = T_VALUE;
    } else {
        goto unsupported;
    }
    return;
unsupported:
    nd->type = T_STR;
    nd->bad = BAD_TAG;
}

/* ---- building the tree ---- */

static int
too_many(struct ydoc *d, struct esd_err *err)
{
    return err_set(err, -EINVAL, "Recipe %s: too many YAML nodes (alias expansion?), limit %zu",
                   d->name, d->max_nodes);
}

static int
too_deep(struct ydoc *d, unsigned long line, struct esd_err *err)
{
    return err_set(err, -EINVAL, "Recipe %s:%lu: YAML nesting deeper than %zu levels", d->name,
                   line, d->max_depth);
}

static struct ynode *
node_new(struct ydoc *d, int kind, const yaml_mark_t *mark, const yaml_char_t *tag)
{
    struct ynode *nd = xcalloc(1, sizeof(*nd));

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
node_add(struct ynode *parent, struct ynode *kid)
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

static struct anchor *
anchor_slot(struct ydoc *d, const char *name)
{
    size_t i = anchor_hash(name) & (d->capanch - 1);

    while (d->anch[i].name && strcmp(d->anch[i].name, name) != 0)
        i = (i + 1) & (d->capanch - 1);
    return &d->anch[i];
}

static struct ynode *
anchor_find(struct ydoc *d, const char *name)
{
    return d->capanch ? anchor_slot(d, name)->node : NULL;
}

/* Registers an anchor; PyYAML refuses a second one of the same name. */
static int
anchor_add(struct ydoc *d, const char *name, struct ynode *nd, struct esd_err *err)
{
    struct anchor *a;

    if (anchor_find(d, name))
        return err_set(err, -EINVAL, "Recipe %s:%lu: found duplicate anchor '%s'", d->name,
                       nd->line, name);
    if (2 * (d->nanch + 1) > d->capanch) {
        struct anchor *old = d->anch;
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
attach(struct ydoc *d, struct ynode **stack, size_t depth, struct ynode *nd)
{
    if (depth)
        node_add(stack[depth - 1], nd);
    else
        d->root = nd;
}

static int
yaml_error(struct ydoc *d, const yaml_parser_t *p, const char *data, size_t len,
           struct esd_err *err)
{
    unsigned long line = (unsigned long)p->problem_mark.line + 1;
    const char *problem = p->problem ? p->problem : "unknown error";

    if (p->error == YAML_MEMORY_ERROR)
        return err_set(err, -ENOMEM, "Recipe %s: out of memory while parsing YAML", d->name);
    if (p->error == YAML_READER_ERROR) {
        /* reader errors carry a byte offset, not a mark */
        line = 1;
        for (size_t i = 0; i < p->problem_offset && i < len; i++)
            line += data[i] == '\n';
        return err_set(err, -EINVAL, "Invalid YAML in %s:%lu: %s at byte %zu", d->name, line,
                       problem, p->problem_offset);
    }
    if (p->context)
        return err_set(err, -EINVAL, "Invalid YAML in %s:%lu: %s (%s)", d->name, line, problem,
                       p->context);
    return err_set(err, -EINVAL, "Invalid YAML in %s:%lu: %s", d->name, line, problem);
}

/* One event into the tree; *ret_end set at the end of the stream. */
static int
doc_event(struct ydoc *d, const yaml_event_t *ev, struct ynode **stack, size_t *depth,
          int *ndocs, bool *ret_end, struct esd_err *err)
{
    unsigned long line = (unsigned long)ev->start_mark.line + 1;
    const yaml_char_t *anchor = NULL;
    struct ynode *nd, *t;
    int rc;

    switch (ev->type) {
    case YAML_STREAM_END_EVENT:
        *ret_end = true;
        return 0;
    case YAML_DOCUMENT_START_EVENT:
        if ((*ndocs)++)
            return err_set(err, -EINVAL,
                           "Recipe %s:%lu: only a single YAML document is allowed, found another",
                           d->name, line);
        return 0;
    case YAML_ALIAS_EVENT: {
        const char *name = (const char *)ev->data.alias.anchor;

        t = anchor_find(d, name);
        if (!t)
            return err_set(err, -EINVAL, "Recipe %s:%lu: found undefined alias '%s'", d->name,
                           line, name);
        if (!t->done)
            return err_set(err, -EINVAL, "Recipe %s:%lu: recursive alias '%s' is not supported",
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
        nd = node_new(d, K_SCALAR, &ev->start_mark, ev->data.scalar.tag);
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
        nd = node_new(d, seq ? K_SEQ : K_MAP, &ev->start_mark, tag);
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
doc_parse(struct ydoc *d, const char *data, size_t len, struct esd_err *err)
{
    yaml_parser_t p;
    yaml_event_t ev;
    /* the open collections; the depth check keeps within max_depth */
    struct ynode **stack = xcalloc(d->max_depth, sizeof(*stack));
    size_t depth = 0;
    int ndocs = 0, rc = 0;
    bool end = false;

    if (!yaml_parser_initialize(&p)) {
        free(stack);
        return err_set(err, -ENOMEM, "Recipe %s: out of memory while parsing YAML", d->name);
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

static void
doc_free(struct ydoc *d)
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

static bool
is_str(const struct ynode *nd)
{
    return nd->kind == K_SCALAR && (nd->type == T_STR || nd->type == T_VALUE);
}

static bool
str_is(const struct ynode *nd, const char *s)
{
    return is_str(nd) && span_is(nd->val, nd->len, s);
}

static bool
is_null(const struct ynode *nd)
{
    return nd->kind == K_SCALAR && nd->type == T_NULL;
}

static bool
is_merge_key(const struct ynode *nd)
{
    return nd->kind == K_SCALAR && nd->type == T_MERGE;
}

/*
 * The value the mapping PyYAML builds from m holds for the string key
 * `name`, or NULL. flatten_mapping puts the merged pairs (of the later "<<"
 * last; of a list of mappings, the first mapping last) before m's own, and
 * later pairs win, so: own pairs, then "<<" values from the last.
 */
static const struct ynode *
map_get(const struct ynode *m, const char *name, const struct ynode **ret_key)
{
    const struct ynode *v;

    for (size_t i = m->n; i >= 2; i -= 2)
        if (!is_merge_key(m->kids[i - 2]) && str_is(m->kids[i - 2], name)) {
            if (ret_key)
                *ret_key = m->kids[i - 2];
            return m->kids[i - 1];
        }
    for (size_t i = m->n; i >= 2; i -= 2) {
        const struct ynode *mv = m->kids[i - 1];

        if (!is_merge_key(m->kids[i - 2]))
            continue;
        if (mv->kind == K_MAP && (v = map_get(mv, name, ret_key)))
            return v;
        if (mv->kind == K_SEQ)
            for (size_t j = 0; j < mv->n; j++)
                if ((v = map_get(mv->kids[j], name, ret_key)))
                    return v;
    }
    return NULL;
}

/* The pairs of m in the order flatten_mapping leaves them. */
typedef bool (*pair_fn)(const struct ynode *k, const struct ynode *v, void *arg);

static bool
map_each(const struct ynode *m, pair_fn fn, void *arg)
{
    for (size_t i = 0; i + 1 < m->n; i += 2) {
        const struct ynode *mv = m->kids[i + 1];

        if (!is_merge_key(m->kids[i]))
            continue;
        if (mv->kind == K_MAP && !map_each(mv, fn, arg))
            return false;
        if (mv->kind == K_SEQ)
            for (size_t j = mv->n; j > 0; j--)
                if (!map_each(mv->kids[j - 1], fn, arg))
                    return false;
    }
    for (size_t i = 0; i + 1 < m->n; i += 2)
        if (!is_merge_key(m->kids[i]) && !fn(m->kids[i], m->kids[i + 1], arg))
            return false;
    return true;
}

static bool
map_empty(const struct ynode *m)
{
    for (size_t i = 0; i + 1 < m->n; i += 2) {
        const struct ynode *mv = m->kids[i + 1];

        if (!is_merge_key(m->kids[i]))
            return false;
        if (mv->kind == K_MAP && !map_empty(mv))
            return false;
        if (mv->kind == K_SEQ)
            for (size_t j = 0; j < mv->n; j++)
                if (!map_empty(mv->kids[j]))
                    return false;
    }
    return true;
}

/* Python truthiness of the constructed value. */
static bool
truthy(const struct ynode *nd)
{
    if (nd->kind == K_SEQ)
        return nd->n > 0;
    if (nd->kind == K_MAP)
        return !map_empty(nd);
    switch (nd->type) {
    case T_NULL:
        return false;
    case T_BOOL:
        return nd->ival != 0;
    case T_INT:
        return nd->ival_ok ? nd->ival != 0 : true;
    case T_FLOAT:
        return nd->fval != 0.0; /* nan is truthy */
    case T_TS:
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
static bool
key_equal(const struct ynode *a, const struct ynode *b)
{
    bool na = a->type == T_BOOL || a->type == T_INT || a->type == T_FLOAT;
    bool nb = b->type == T_BOOL || b->type == T_INT || b->type == T_FLOAT;

    if (a == b)
        return true;
    if (is_str(a) || is_str(b))
        return is_str(a) && is_str(b) && a->len == b->len && memcmp(a->val, b->val, a->len) == 0;
    if (na && nb) {
        if (a->type == T_FLOAT || b->type == T_FLOAT) {
            double fa = a->type == T_FLOAT ? a->fval : (double)a->ival;
            double fb = b->type == T_FLOAT ? b->fval : (double)b->ival;

            if ((a->type != T_FLOAT && !a->ival_ok) || (b->type != T_FLOAT && !b->ival_ok))
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
    return a->type == T_NULL || (a->len == b->len && memcmp(a->val, b->val, a->len) == 0);
}

/* str() of a scalar; -ERANGE for an int Python 3.11 will not print. */
static int
scalar_str(const struct ynode *nd, struct buf *b)
{
    struct ts ts;

    switch (nd->type) {
    case T_NULL:
        buf_puts(b, "None");
        return 0;
    case T_BOOL:
        buf_puts(b, nd->ival ? "True" : "False");
        return 0;
    case T_INT:
        return int_str(nd, b);
    case T_FLOAT:
        float_repr(nd->fval, b);
        return 0;
    case T_TS:
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

static bool node_repr(const struct ynode *nd, struct repr *r);

static bool
repr_pair(const struct ynode *k, const struct ynode *v, void *arg)
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
node_repr(const struct ynode *nd, struct repr *r)
{
    if (r->b->len > r->max) {
        buf_puts(r->b, "...");
        return false;
    }
    if (nd->kind == K_SEQ) {
        buf_putc(r->b, '[');
        for (size_t i = 0; i < nd->n; i++) {
            if (i)
                buf_puts(r->b, ", ");
            if (!node_repr(nd->kids[i], r))
                return false;
        }
        buf_putc(r->b, ']');
    } else if (nd->kind == K_MAP) {
        buf_putc(r->b, '{');
        if (!map_each(nd, repr_pair, r))
            return false;
        buf_putc(r->b, '}');
    } else if (is_str(nd)) {
        py_repr_str(nd->val, nd->len, r->b);
    } else if (nd->type == T_INT && nd->len > MSG_REPR_MAX) {
        buf_puts(r->b, "<int>");
    } else if (scalar_str(nd, r->b) < 0) {
        buf_puts(r->b, "<int>");
    }
    return true;
}

/* Python str() of any value, collections cut at STR_REPR_MAX; caller frees. */
static int
py_str(const struct ynode *nd, char **ret)
{
    struct buf b;
    struct repr r;
    int rc = 0;

    buf_init(&b);
    if (nd->kind == K_SCALAR) {
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

/* For messages: a value as Python's repr shows it, shortened. Caller frees. */
static char *
msg_repr(const struct ynode *nd)
{
    struct buf b;
    struct repr r = { &b, MSG_REPR_MAX };

    buf_init(&b);
    node_repr(nd, &r);
    return buf_steal(&b);
}

/* For messages: str() of an operator name, shortened. Caller frees. */
static char *
msg_str(const struct ynode *nd)
{
    struct buf b;

    if (!is_str(nd))
        return msg_repr(nd);
    buf_init(&b);
    buf_append(&b, nd->val, nd->len < MSG_REPR_MAX ? nd->len : MSG_REPR_MAX);
    if (nd->len > MSG_REPR_MAX)
        buf_puts(&b, "...");
    return buf_steal(&b);
}

/* ---- construction checks: what would make safe_load raise ---- */

static const char *
kind_name(const struct ynode *nd)
{
    return nd->kind == K_SEQ ? "sequence" : nd->kind == K_MAP ? "mapping" : "scalar";
}

static int
bad_msg(struct ydoc *d, const struct ynode *nd, struct esd_err *err)
{
    static const char *const what[] = { "", "", "bool", "int", "float", "timestamp" };

    if (nd->bad == BAD_TAG)
        return err_set(err, -EINVAL, "Recipe %s:%lu: unsupported YAML tag '%s' on a %s", d->name,
                       nd->line, nd->tag ? nd->tag : "", kind_name(nd));
    return err_set(err, -EINVAL, "Recipe %s:%lu: cannot construct a %s from '%.*s%s'", d->name,
                   nd->line, what[nd->bad], (int)(nd->len < MSG_REPR_MAX ? nd->len : MSG_REPR_MAX),
                   nd->val, nd->len > MSG_REPR_MAX ? "..." : "");
}

/* A plain "<<" or "=" anywhere but as a key has no SafeLoader constructor. */
static int
check_value(struct ydoc *d, const struct ynode *nd, struct esd_err *err)
{
    if (nd->kind == K_SCALAR && (nd->type == T_MERGE || nd->type == T_VALUE))
        return err_set(err, -EINVAL,
                       "Recipe %s:%lu: '%s' can only be used as a mapping key (quote it)",
                       d->name, nd->line, nd->type == T_MERGE ? "<<" : "=");
    return 0;
}

static int
doc_check(struct ydoc *d, struct esd_err *err)
{
    int rc;

    if (d->root && (rc = check_value(d, d->root, err)) < 0)
        return rc;
    for (size_t i = 0; i < d->nall; i++) {
        const struct ynode *nd = d->all[i];

        if (nd->bad)
            return bad_msg(d, nd, err);
        if (nd->kind == K_SEQ)
            for (size_t j = 0; j < nd->n; j++)
                if ((rc = check_value(d, nd->kids[j], err)) < 0)
                    return rc;
        if (nd->kind != K_MAP)
            continue;
        for (size_t j = 0; j + 1 < nd->n; j += 2) {
            const struct ynode *k = nd->kids[j], *v = nd->kids[j + 1];
            bool ok = v->kind == K_MAP;

            if (k->kind != K_SCALAR)
                return err_set(err, -EINVAL,
                               "Recipe %s:%lu: found unhashable key (a %s used as a key)",
                               d->name, k->line, kind_name(k));
            if (k->type == T_MERGE) {
                for (size_t m = 0; v->kind == K_SEQ && m < v->n; m++)
                    if (v->kids[m]->kind != K_MAP)
                        return err_set(err, -EINVAL,
                                       "Recipe %s:%lu: expected a mapping for merging, found a %s",
                                       d->name, v->kids[m]->line, kind_name(v->kids[m]));
                if (!ok && v->kind != K_SEQ)
                    return err_set(err, -EINVAL,
                                   "Recipe %s:%lu: expected a mapping or list of mappings for "
                                   "merging, found a %s",
                                   d->name, v->line, kind_name(v));
            }
            if ((rc = check_value(d, v, err)) < 0)
                return rc;
        }
    }
    return 0;
}

/* ---- validation (spec §7) ---- */

/* Python's str.isspace() for the code point starting at s; its length or 0. */
static size_t
py_space(const unsigned char *s, size_t n)
{
    unsigned cp;

    if (*s < 0x80)
        return (*s >= 0x09 && *s <= 0x0d) || (*s >= 0x1c && *s <= 0x20);
    if (n >= 2 && *s == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0))
        return 2;
    if (n < 3 || (*s & 0xf0) != 0xe0)
        return 0;
    cp = ((unsigned)(*s & 0x0f) << 12) | ((unsigned)(s[1] & 0x3f) << 6) | (s[2] & 0x3f);
    if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 ||
        cp == 0x202f || cp == 0x205f || cp == 0x3000)
        return 3;
    return 0;
}

static bool
py_blank(const char *s, size_t n)
{
    size_t i = 0, k;

    while (i < n && (k = py_space((const unsigned char *)s + i, n - i)))
        i += k;
    return i == n;
}

/* A string value to keep; C strings cannot hold the NULs YAML allows. */
static int
keep_str(struct ydoc *d, const struct ynode *nd, const char *what, char **ret,
         struct esd_err *err)
{
    if (memchr(nd->val, '\0', nd->len))
        return err_set(err, -EINVAL, "Recipe %s:%lu: %s contains a NUL character", d->name,
                       nd->line, what);
    *ret = xstrndup(nd->val, nd->len);
    return 0;
}

static int
check_executor(struct ydoc *d, struct recipe *r, struct esd_err *err)
{
    const struct ynode *v = map_get(d->root, "executor_type", NULL);
    char *got;
    int rc;

    if (v && !str_is(v, "default") && !str_is(v, "ray")) {
        got = msg_repr(v);
        rc = err_set(err, -EINVAL,
                     "Recipe %s:%lu: executor_type must be 'default' or 'ray', got %s", d->name,
                     v->line, got);
        free(got);
        return rc;
    }
    r->executor_type = xstrdup(v ? v->val : "default");
    if (strcmp(r->executor_type, "default") == 0)
        strv_push(&r->warnings, "recipe executor_type=default will be overridden with "
                                "executor_type=ray for shard workers");
    return 0;
}

/* custom_operator_paths (or the dashed spelling): falsy, a string or strings. */
static int
check_custom_paths(struct ydoc *d, struct recipe *r, struct esd_err *err)
{
    const char *key = "custom_operator_paths";
    const struct ynode *v = map_get(d->root, key, NULL);
    char *s;
    int rc;

    if (!v || !truthy(v)) {
        key = "custom-operator-paths";
        v = map_get(d->root, key, NULL);
    }
    if (!v || !truthy(v))
        return 0;
    if (is_str(v)) {
        if ((rc = keep_str(d, v, key, &s, err)) < 0)
            return rc;
        strv_push_owned(&r->custom_operator_paths, s);
        return 0;
    }
    if (v->kind != K_SEQ)
        goto bad;
    for (size_t i = 0; i < v->n; i++) {
        if (!is_str(v->kids[i]))
            goto bad;
        if ((rc = keep_str(d, v->kids[i], key, &s, err)) < 0)
            return rc;
        strv_push_owned(&r->custom_operator_paths, s);
    }
    return 0;
bad:
    return err_set(err, -EINVAL, "Recipe %s:%lu: %s must be a string or a list of strings",
                   d->name, v->line, key);
}

/*
 * Built-in exceptions to the name rule (recipe_classify), for operators of
 * Data-Juicer's registry whose name says something else than the
 * reference's test (a Mapper or Filter subclass, no truthy
 * is_global_operation, none of "deduplicator", "global_", "full_dataset_"
 * in the lower-cased name). Taken from Data-Juicer 1.6.1 with
 * tests/tools/dj-operators; tests/integration/real_registry.sh checks that
 * esd and the reference agree on every registered operator. Exact names,
 * as registered. The caller's lists take precedence over both.
 */

/* Registered operators the reference accepts but the name rule refuses. */
static const char *const builtin_allow[] = {
    /*
     * Class FusedSequentialBatchOp is a Mapper subclass but its name ends in
     * "_op". It runs the batch-local mappers and filters given in its
     * op_specs argument one after the other, which neither the reference
     * nor esd inspects.
     */
    "fused_sequential_batch_op",
    /*
     * Class GeneralFusedOP is a Mapper subclass but its name ends in "_op".
     * It runs the operators of its fused_op_list argument on each batch;
     * those are not inspected either.
     */
    "general_fused_op",
};

/*
 * Registered operators the reference refuses as whole-dataset where the name
 * rule would accept them or call them unknown (then esd's refusal says what
 * the reference's says).
 */
static const char *const builtin_deny[] = {
    /*
     * Classes LLMRayVLLMEnginePipeline, RayRepartitionPipeline and
     * VLMRayVLLMEnginePipeline are Pipeline subclasses, neither Mapper nor
     * Filter; their names end in "_pipeline", which the name rule does not
     * know. Repartitioning in particular works on the whole dataset.
     */
    "llm_ray_vllm_engine_pipeline",
    "ray_repartition_pipeline",
    "vlm_ray_vllm_engine_pipeline",
};

/* How an operator name is judged, and by what (for the messages). */
enum verdict { V_SAFE, V_WHOLE, V_UNKNOWN, V_DENIED };

static bool
in_table(const char *const *table, size_t n, const char *op)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(table[i], op) == 0)
            return true;
    return false;
}

#define IN_TABLE(t, op) in_table((t), sizeof(t) / sizeof((t)[0]), (op))

/*
 * The one place that decides whether an operator may run per shard: the
 * caller's deny list, the caller's allow list, the built-in deny and allow
 * tables, then the name rule.
 */
static enum verdict
verdict(const char *op, const struct recipe_policy *pol)
{
    if (!op)
        return V_UNKNOWN;
    if (pol && pol->deny && strv_contains(pol->deny, op))
        return V_DENIED;
    if (pol && pol->allow && strv_contains(pol->allow, op))
        return V_SAFE;
    if (IN_TABLE(builtin_deny, op))
        return V_WHOLE;
    if (IN_TABLE(builtin_allow, op))
        return V_SAFE;
    switch (recipe_classify(op)) {
    case 0:
        return V_SAFE;
    case -EPERM:
        return V_WHOLE;
    default:
        return V_UNKNOWN;
    }
}

int
recipe_verdict(const char *op, const struct recipe_policy *pol)
{
    switch (verdict(op, pol)) {
    case V_SAFE:
        return 0;
    case V_UNKNOWN:
        return -ENOENT;
    default:
        return -EPERM;
    }
}

/* The keys of a process item: the first, the value of the last, and
 * whether any differs from the first. */
struct opscan {
    const struct ynode *key;
    const struct ynode *val;
    bool several;
};

static bool
opscan_pair(const struct ynode *k, const struct ynode *v, void *arg)
{
    struct opscan *s = arg;

    if (!s->key) {
        s->key = k;
    } else if (!key_equal(s->key, k)) {
        s->several = true;
        return false;
    }
    s->val = v;
    return true;
}

/*
 * Operators that run other operators given in their arguments: those are
 * checked as if they stood in the process list themselves (the reference
 * checks only the outer name, so a deduplicator could hide inside).
 */
static const char *const fused_lists[][2] = {
    { "general_fused_op", "fused_op_list" },
    { "fused_sequential_batch_op", "op_specs" },
};

static int check_op(struct ydoc *d, const struct recipe_policy *pol, size_t idx,
                    const struct ynode *item, struct recipe *r, struct esd_err *err);

static int
check_fused(struct ydoc *d, const struct recipe_policy *pol, size_t idx, const char *name,
            const struct ynode *args, struct recipe *r, struct esd_err *err)
{
    for (size_t f = 0; f < sizeof(fused_lists) / sizeof(fused_lists[0]); f++) {
        const struct ynode *list, *k;
        int rc;

        if (strcmp(name, fused_lists[f][0]) != 0 || !(list = map_get(args, fused_lists[f][1], &k)) ||
            is_null(list))
            continue;
        if (list->kind != K_SEQ)
            return err_set(err, -EINVAL, "Operator '%s' in %s:%lu: %s must be a list", name,
                           d->name, k->line, fused_lists[f][1]);
        for (size_t i = 0; i < list->n; i++)
            if ((rc = check_op(d, pol, idx, list->kids[i], r, err)) < 0)
                return rc;
    }
    return 0;
}

static int
check_op(struct ydoc *d, const struct recipe_policy *pol, size_t idx, const struct ynode *item,
         struct recipe *r, struct esd_err *err)
{
    struct opscan s = { NULL, NULL, false };
    const struct ynode *args, *k, *v;
    const char *name;
    unsigned long line;
    char *shown = NULL, *ikey;
    int rc = 0;

    if (item->kind == K_MAP)
        map_each(item, opscan_pair, &s);
    if (!s.key || s.several)
        return err_set(err, -EINVAL, "process[%zu] in %s:%lu must contain exactly one operator",
                       idx, d->name, item->line);
    line = s.key->line;
    args = s.val;
    if (!is_str(s.key) || memchr(s.key->val, '\0', s.key->len)) {
        shown = msg_str(s.key);
        rc = err_set(err, -EINVAL, "Unknown operator '%s' in %s:%lu; cannot prove it is shard-safe",
                     shown, d->name, line);
        free(shown);
        return rc;
    }
    name = s.key->val;
    if (!is_null(args) && args->kind != K_MAP)
        return err_set(err, -EINVAL,
                       "Operator '%s' in %s:%lu: its arguments must be a mapping or null, not a %s",
                       name, d->name, args->line, kind_name(args));
    switch (verdict(name, pol)) {
    case V_SAFE:
        break;
    case V_DENIED:
        return err_set(err, -EINVAL,
                       "Operator '%s' in %s:%lu is denied by configuration and cannot run per "
                       "shard",
                       name, d->name, line);
    case V_UNKNOWN:
        return err_set(err, -EINVAL,
                       "Unknown operator '%s' in %s:%lu; cannot prove it is shard-safe", name,
                       d->name, line);
    case V_WHOLE:
        return err_set(err, -EINVAL,
                       "Operator '%s' in %s:%lu requires or may require whole-dataset "
                       "semantics and cannot run per shard",
                       name, d->name, line);
    }
    if (args->kind == K_MAP) {
        if ((v = map_get(args, "is_global_operation", &k)) && truthy(v))
            return err_set(err, -EINVAL,
                           "Operator '%s' in %s:%lu requires or may require whole-dataset "
                           "semantics and cannot run per shard (is_global_operation is set)",
                           name, d->name, k->line);
        if ((v = map_get(args, "stats_export_path", &k)) && truthy(v))
            return err_set(err, -EINVAL,
                           "Operator '%s' in %s:%lu sets stats_export_path, which cannot be used "
                           "per shard",
                           name, d->name, k->line);
        if ((v = map_get(args, "save_dir", NULL)) && truthy(v)) {
            /* the reference's words: the warning is kept in the manifest */
            struct buf w;

            buf_init(&w);
            buf_puts(&w, "operator ");
            py_repr_str(name, strlen(name), &w);
            buf_puts(&w, " uses an explicit save_dir; the caller must ensure generated "
                         "filenames do not collide across shards");
            strv_push_owned(&r->warnings, buf_steal(&w));
        }
        if ((v = map_get(args, "index_key", NULL)) && !is_null(v)) {
            if (!is_str(v) || !v->len)
                return err_set(err, -EINVAL,
                               "Operator '%s' in %s:%lu: index_key must be a non-empty string",
                               name, d->name, v->line);
            if ((rc = keep_str(d, v, "index_key", &ikey, err)) < 0)
                return rc;
            strv_push_owned(&r->index_keys, ikey);
        }
    }
    strv_push(&r->ops, name);
    /* the operators it runs follow it */
    return args->kind == K_MAP ? check_fused(d, pol, idx, name, args, r, err) : 0;
}

static int
check_media_keys(struct ydoc *d, struct recipe *r, struct esd_err *err)
{
    static const char *const keys[][2] = {
        { "image_key", "images" }, { "audio_key", "audios" }, { "video_key", "videos" }
    };
    const struct ynode *v;
    char *s;
    int rc;

    for (size_t i = 0; i < 3; i++) {
        v = map_get(d->root, keys[i][0], NULL);
        if (!v) {
            s = xstrdup(keys[i][1]);
        } else if (!is_str(v) || !v->len) {
            return err_set(err, -EINVAL, "Recipe %s:%lu: %s must be a non-empty string", d->name,
                           v->line, keys[i][0]);
        } else if ((rc = keep_str(d, v, keys[i][0], &s, err)) < 0) {
            return rc;
        }
        if (strv_contains(&r->media_keys, s))
            free(s);
        else
            strv_push_owned(&r->media_keys, s);
    }
    return 0;
}

/* Sorts and folds duplicates. */
static void
strv_uniq(struct strv *s)
{
    size_t k = 0;

    strv_sort(s);
    for (size_t i = 0; i < s->n; i++) {
        if (k && strcmp(s->v[k - 1], s->v[i]) == 0)
            free(s->v[i]);
        else
            s->v[k++] = s->v[i];
    }
    s->n = k;
    if (s->v)
        s->v[k] = NULL;
}

static int
validate(struct ydoc *d, const struct recipe_policy *pol, struct recipe *r, struct esd_err *err)
{
    const struct ynode *proc, *v;
    int rc;

    if (!d->root || d->root->kind != K_MAP)
        return err_set(err, -EINVAL, "Recipe %s must be a mapping", d->name);
    if ((rc = check_executor(d, r, err)) < 0)
        return rc;
    proc = map_get(d->root, "process", NULL);
    if (!proc)
        return err_set(err, -EINVAL, "Recipe %s: 'process' must be a list", d->name);
    if (proc->kind != K_SEQ)
        return err_set(err, -EINVAL, "Recipe %s:%lu: 'process' must be a list, not a %s", d->name,
                       proc->line, is_null(proc) ? "null" : kind_name(proc));
    if ((rc = check_custom_paths(d, r, err)) < 0)
        return rc;
    for (size_t i = 0; i < proc->n; i++)
        if ((rc = check_op(d, pol, i, proc->kids[i], r, err)) < 0)
            return rc;
    strv_uniq(&r->index_keys);
    if ((rc = check_media_keys(d, r, err)) < 0)
        return rc;
    v = map_get(d->root, "dataset_path", NULL);
    if (v && is_str(v)) {
        if ((rc = keep_str(d, v, "dataset_path", &r->dataset_path, err)) < 0)
            return rc;
        r->dataset_path_valid = !py_blank(v->val, v->len);
    } else if (v && !is_null(v) && py_str(v, &r->dataset_path) < 0) {
        return err_set(err, -EINVAL, "Recipe %s:%lu: dataset_path is an integer too large to print",
                       d->name, v->line);
    }
    v = map_get(d->root, "ray_address", NULL);
    if (v && is_str(v)) {
        if ((rc = keep_str(d, v, "ray_address", &r->ray_address, err)) < 0)
            return rc;
    } else if (v && !is_null(v) && py_str(v, &r->ray_address) < 0) {
        return err_set(err, -EINVAL, "Recipe %s:%lu: ray_address is an integer too large to print",
                       d->name, v->line);
    }
    if (r->ray_address) {
        struct buf b;
        struct repr rr = { &b, STR_REPR_MAX };

        buf_init(&b);
        node_repr(v, &rr);
        r->ray_address_repr = buf_steal(&b);
    }
    return 0;
}

/* ---- public interface ---- */

static size_t
limit_or(size_t v, size_t def)
{
    return v ? v : def;
}

int
recipe_parse(const char *data, size_t len, const char *name, const struct recipe_policy *pol,
             struct recipe *ret, struct esd_err *err)
{
    struct ydoc d;
    struct recipe r;
    size_t max_bytes = limit_or(pol ? pol->limits.max_bytes : 0, RECIPE_MAX_BYTES);
    int rc;

    memset(&d, 0, sizeof(d));
    memset(&r, 0, sizeof(r));
    d.name = name ? name : "<recipe>";
    d.max_nodes = limit_or(pol ? pol->limits.max_nodes : 0, RECIPE_MAX_NODES);
    d.max_depth = limit_or(pol ? pol->limits.max_depth : 0, RECIPE_MAX_DEPTH);
    if (d.max_depth > DEPTH_CAP)
        d.max_depth = DEPTH_CAP;
    if (len > max_bytes)
        return err_set(err, -EFBIG, "Recipe %s is larger than %zu bytes", d.name, max_bytes);
    rc = doc_parse(&d, data, len, err);
    if (!rc)
        rc = doc_check(&d, err);
    if (!rc)
        rc = validate(&d, pol, &r, err);
    doc_free(&d);
    if (rc < 0) {
        recipe_free(&r);
        return rc;
    }
    *ret = r;
    return 0;
}

int
recipe_load(const char *path, const struct recipe_policy *pol, struct recipe *ret,
            struct esd_err *err)
{
    size_t max_bytes = limit_or(pol ? pol->limits.max_bytes : 0, RECIPE_MAX_BYTES);
    struct stat st;
    struct buf b;
    ssize_t n;
    int fd, rc;

    /* O_NONBLOCK: a FIFO must not block us before fstat() turns it away */
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) {
        if (errno == ENOENT || errno == ENOTDIR)
            return err_set(err, -ENOENT, "Recipe does not exist: %s", path);
        return err_sys(err, -errno, "Cannot open recipe %s", path);
    }
    if (fstat(fd, &st) < 0) {
        rc = err_sys(err, -errno, "Cannot stat recipe %s", path);
        close(fd);
        return rc;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return err_set(err, -ENOENT, "Recipe does not exist: %s", path);
    }
    if ((unsigned long long)st.st_size > max_bytes) {
        close(fd);
        return err_set(err, -EFBIG, "Recipe %s is larger than %zu bytes", path, max_bytes);
    }
    buf_init(&b);
    buf_reserve(&b, (size_t)st.st_size + 1);
    for (;;) {
        /* one byte more than allowed, to notice a file that grew */
        size_t want = max_bytes + 1 - b.len;

        if (want > 65536)
            want = 65536;
        buf_reserve(&b, want + 1);
        n = read(fd, b.p + b.len, want);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = err_sys(err, -errno, "Cannot read recipe %s", path);
            goto out;
        }
        if (n == 0)
            break;
        b.len += (size_t)n;
        if (b.len > max_bytes) {
            rc = err_set(err, -EFBIG, "Recipe %s is larger than %zu bytes", path, max_bytes);
            goto out;
        }
    }
    rc = recipe_parse(b.p, b.len, path, pol, ret, err);
out:
    close(fd);
    buf_free(&b);
    return rc;
}

static bool
ends_with(const char *s, size_t n, const char *suffix)
{
    size_t k = strlen(suffix);

    return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

int
recipe_classify(const char *op)
{
    static const char *const whole_suffix[] = { "_deduplicator", "_selector", "_grouper",
                                                "_aggregator" };
    static const char *const whole_infix[] = { "deduplicator", "global_", "full_dataset_" };
    size_t n = op ? strlen(op) : 0;
    char *low;
    int rc = -ENOENT;

    if (!n)
        return -ENOENT;
    low = xstrdup(op);
    for (size_t i = 0; i < n; i++)
        if (low[i] >= 'A' && low[i] <= 'Z')
            low[i] = (char)(low[i] - 'A' + 'a');
    /* the whole-dataset marks win, so that global_foo_filter is refused */
    for (size_t i = 0; i < 4 && rc == -ENOENT; i++)
        if (ends_with(low, n, whole_suffix[i]))
            rc = -EPERM;
    for (size_t i = 0; i < 3 && rc == -ENOENT; i++)
        if (strstr(low, whole_infix[i]))
            rc = -EPERM;
    if (rc == -ENOENT && (ends_with(low, n, "_mapper") || ends_with(low, n, "_filter")))
        rc = 0;
    free(low);
    return rc;
}

/*
 * Frees what a successful recipe_load/recipe_parse put in *r and zeroes it,
 * so a zeroed struct, a freed one and NULL are all fine.
 */
void
recipe_free(struct recipe *r)
{
    if (!r)
        return;
    free(r->executor_type);
    free(r->dataset_path);
    free(r->ray_address);
    free(r->ray_address_repr);
    strv_free(&r->ops);
    strv_free(&r->media_keys);
    strv_free(&r->index_keys);
    strv_free(&r->custom_operator_paths);
    strv_free(&r->warnings);
    memset(r, 0, sizeof(*r));
}
