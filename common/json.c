/*
 * json: metadata JSON written byte for byte as the reference's Python writes
 * it (spec §5.1), so that files esd writes and files shard_job.py writes are
 * indistinguishable. cJSON is only the tree; the serialiser is our own:
 * sorted keys, Python's separators and indentation, Python's string escapes
 * with ensure_ascii=False, integers as integers and other doubles as
 * float.__repr__ writes them. Raw nodes carry number text that a double
 * cannot hold (repr of a float, integers beyond 2^53) and print verbatim.
 *
 * json_load_object reads as strictly as Python's json.loads (UTF-8, no
 * control characters in strings, JSON number grammar, nothing after the
 * value) and keeps the numbers a double would change as raw nodes: integers
 * of 2^53 and more keep their digits, integral floats such as 60.0 keep
 * their float form. Any other number stays a cJSON number, so a file read
 * and written again comes out as Python would write it.
 */
#include "json.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsutil.h"

/* 2^53: below it every integer is exact in a double. */
#define EXACT_INT_LIMIT 9007199254740992.0

void
json_init(void)
{
    cJSON_Hooks hooks = { .malloc_fn = xmalloc, .free_fn = free };

    cJSON_InitHooks(&hooks);
}

/* cJSON returns NULL only if json_init() was skipped and malloc failed. */
static cJSON *
must(cJSON *item)
{
    if (!item) {
        fprintf(stderr, "esd: out of memory creating a JSON node\n");
        abort();
    }
    return item;
}

void
json_escape(struct buf *out, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t start = 0;

    buf_reserve(out, n + 2);
    buf_putc(out, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char u[7];
        const char *esc = u;

        if (c >= 0x20 && c != '"' && c != '\\')
            continue;
        buf_append(out, s + start, i - start);
        start = i + 1;
        switch (c) {
        case '"':
            esc = "\\\"";
            break;
        case '\\':
            esc = "\\\\";
            break;
        case '\n':
            esc = "\\n";
            break;
        case '\r':
            esc = "\\r";
            break;
        case '\t':
            esc = "\\t";
            break;
        case '\b':
            esc = "\\b";
            break;
        case '\f':
            esc = "\\f";
            break;
        default:
            memcpy(u, "\\u00", 4);
            u[4] = hex[c >> 4];
            u[5] = hex[c & 15];
            u[6] = '\0';
            break;
        }
        buf_puts(out, esc);
    }
    buf_append(out, s + start, n - start);
    buf_putc(out, '"');
}

/*
 * Splits the output of "%.*e" into its digits (no point, no sign, trailing
 * zeros dropped) and decimal exponent. Any decimal point character is
 * skipped, so the locale does not matter.
 */
static void
split_exp(const char *s, char digits[24], int *exp)
{
    size_t n = 0;

    for (; *s && *s != 'e'; s++)
        if (*s >= '0' && *s <= '9' && n < 23)
            digits[n++] = *s;
    while (n > 1 && digits[n - 1] == '0')
        n--;
    digits[n] = '\0';
    *exp = *s == 'e' ? atoi(s + 1) : 0;
}

/*
 * Shortest digits that read back as v (v finite, not zero, positive).
 * "%.*e" gives the correctly rounded string of each length; when that one
 * misses, its neighbour on the other side of v may still read back (near
 * powers of two the interval that rounds to v is lopsided), and Python's
 * repr would pick it.
 */
static void
shortest_digits(double v, char digits[24], int *exp)
{
    char tmp[40];

    for (int prec = 1; prec <= 17; prec++) {
        char alt[40], d[24];
        double back;
        int e;
        size_t n;

        snprintf(tmp, sizeof(tmp), "%.*e", prec - 1, v);
        back = strtod(tmp, NULL);
        if (back == v || prec == 17)
            break;
        /* Step the last digit once towards v and try that. */
        split_exp(tmp, d, &e);
        n = strlen(d);
        while (n < (size_t)prec)
            d[n++] = '0';
        d[n] = '\0';
        if (back < v) {
            size_t i = n;

            while (i > 0 && d[i - 1] == '9')
                d[--i] = '0';
            if (i == 0) {
                memmove(d + 1, d, n + 1);
                d[0] = '1';
                d[n] = '\0';
                e++;
            } else {
                d[i - 1]++;
            }
        } else {
            size_t i = n;

            while (i > 0 && d[i - 1] == '0')
                d[--i] = '9';
            if (i == 0)
                continue;
            d[i - 1]--;
            if (d[0] == '0') {
                /* 10000 - 1 → 9999: one digit shorter, so it was tried already. */
                continue;
            }
        }
        snprintf(alt, sizeof(alt), "%c.%se%d", d[0], d + 1, e);
        if (strtod(alt, NULL) == v) {
            split_exp(alt, digits, exp);
            *exp = e;
            return;
        }
    }
    split_exp(tmp, digits, exp);
}

void
json_repr_double(double v, char out[32])
{
    char digits[24];
    char *p = out;
    int exp, nd;

    if (isnan(v)) {
        strcpy(out, "NaN");
        return;
    }
    if (isinf(v)) {
        strcpy(out, v > 0 ? "Infinity" : "-Infinity");
        return;
    }
    if (signbit(v)) {
        *p++ = '-';
        v = -v;
    }
    if (v == 0) {
        strcpy(p, "0.0");
        return;
    }
    shortest_digits(v, digits, &exp);
    nd = (int)strlen(digits);
    /* float_repr_style 'r': exponent form below 1e-4 and from 1e16 on. */
    if (exp < -4 || exp >= 16) {
        *p++ = digits[0];
        if (nd > 1) {
            *p++ = '.';
            memcpy(p, digits + 1, (size_t)nd - 1);
            p += nd - 1;
        }
        sprintf(p, "e%c%02d", exp < 0 ? '-' : '+', abs(exp));
    } else if (exp < 0) {
        *p++ = '0';
        *p++ = '.';
        for (int i = 0; i < -exp - 1; i++)
            *p++ = '0';
        strcpy(p, digits);
    } else if (exp + 1 >= nd) {
        memcpy(p, digits, (size_t)nd);
        p += nd;
        for (int i = 0; i < exp + 1 - nd; i++)
            *p++ = '0';
        strcpy(p, ".0");
    } else {
        memcpy(p, digits, (size_t)exp + 1);
        p += exp + 1;
        *p++ = '.';
        strcpy(p, digits + exp + 1);
    }
}

static void
dump_number(double d, struct buf *out)
{
    char tmp[32];

    if (fabs(d) < EXACT_INT_LIMIT && d == (double)(long long)d) {
        buf_printf(out, "%lld", (long long)d);
        return;
    }
    json_repr_double(d, tmp);
    buf_puts(out, tmp);
}

static void
newline_indent(struct buf *out, int depth)
{
    size_t n = (size_t)depth * 2;

    buf_reserve(out, n + 1);
    out->p[out->len++] = '\n';
    memset(out->p + out->len, ' ', n);
    out->len += n;
    out->p[out->len] = '\0';
}

struct member {
    const cJSON *item;
    size_t pos;
};

static const char *
key_of(const cJSON *item)
{
    return item->string ? item->string : "";
}

static int
cmp_member(const void *a, const void *b)
{
    const struct member *x = a, *y = b;
    int c = strcmp(key_of(x->item), key_of(y->item));

    if (c)
        return c;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static void dump(const cJSON *v, enum json_style style, int depth, struct buf *out);

static void
dump_container(const cJSON *v, enum json_style style, int depth, struct buf *out)
{
    static const char *const item_sep[] = {
        [JSON_PRETTY] = ",", [JSON_LINE] = ", ", [JSON_COMPACT] = ","
    };
    static const char *const key_sep[] = {
        [JSON_PRETTY] = ": ", [JSON_LINE] = ": ", [JSON_COMPACT] = ":"
    };
    bool object = cJSON_IsObject(v);
    struct member *m;
    size_t n = 0, k = 0;
    bool first = true;

    for (const cJSON *c = v->child; c; c = c->next)
        n++;
    if (n == 0) {
        buf_puts(out, object ? "{}" : "[]");
        return;
    }
    m = xmalloc(n * sizeof(*m));
    for (const cJSON *c = v->child; c; c = c->next, k++) {
        m[k].item = c;
        m[k].pos = k;
    }
    if (object)
        qsort(m, n, sizeof(*m), cmp_member);
    buf_putc(out, object ? '{' : '[');
    for (size_t i = 0; i < n; i++) {
        const cJSON *c = m[i].item;

        /* A repeated key: the last one wins, as in a Python dict. */
        if (object && i + 1 < n && strcmp(key_of(c), key_of(m[i + 1].item)) == 0)
            continue;
        if (!first)
            buf_puts(out, item_sep[style]);
        first = false;
        if (style == JSON_PRETTY)
            newline_indent(out, depth + 1);
        if (object) {
            json_escape(out, key_of(c), strlen(key_of(c)));
            buf_puts(out, key_sep[style]);
        }
        dump(c, style, depth + 1, out);
    }
    if (style == JSON_PRETTY)
        newline_indent(out, depth);
    buf_putc(out, object ? '}' : ']');
    free(m);
}

static void
dump(const cJSON *v, enum json_style style, int depth, struct buf *out)
{
    if (cJSON_IsTrue(v))
        buf_puts(out, "true");
    else if (cJSON_IsFalse(v))
        buf_puts(out, "false");
    else if (cJSON_IsNumber(v))
        dump_number(v->valuedouble, out);
    else if (cJSON_IsString(v))
        json_escape(out, v->valuestring ? v->valuestring : "",
                    v->valuestring ? strlen(v->valuestring) : 0);
    else if (cJSON_IsRaw(v) && v->valuestring)
        buf_puts(out, v->valuestring);
    else if (cJSON_IsArray(v) || cJSON_IsObject(v))
        dump_container(v, style, depth, out);
    else
        buf_puts(out, "null");
}

void
json_dump(const cJSON *v, enum json_style style, struct buf *out)
{
    dump(v, style, 0, out);
    if (style != JSON_COMPACT)
        buf_putc(out, '\n');
}

cJSON *
json_float(double v)
{
    char tmp[32];

    json_repr_double(v, tmp);
    return must(cJSON_CreateRaw(tmp));
}

cJSON *
json_int(long long v)
{
    char tmp[32];

    snprintf(tmp, sizeof(tmp), "%lld", v);
    return must(cJSON_CreateRaw(tmp));
}

void
json_add_float(cJSON *obj, const char *key, double v)
{
    cJSON_AddItemToObject(obj, key, json_float(v));
}

void
json_add_int(cJSON *obj, const char *key, long long v)
{
    cJSON_AddItemToObject(obj, key, json_int(v));
}

void
json_add_str(cJSON *obj, const char *key, const char *s)
{
    cJSON_AddItemToObject(obj, key, must(s ? cJSON_CreateString(s) : cJSON_CreateNull()));
}

void
json_add_bool(cJSON *obj, const char *key, bool v)
{
    cJSON_AddItemToObject(obj, key, must(cJSON_CreateBool(v)));
}

void
json_set(cJSON *obj, const char *key, cJSON *item)
{
    cJSON *c, *next;
    bool found = false;

    for (c = obj->child; c; c = next) {
        next = c->next;
        if (!c->string || strcmp(c->string, key) != 0)
            continue;
        if (!found) {
            cJSON_ReplaceItemInObjectCaseSensitive(obj, key, item);
            found = true;
        } else {
            /* Later duplicates would win when printed: drop them. */
            cJSON_Delete(cJSON_DetachItemViaPointer(obj, c));
        }
    }
    if (!found)
        cJSON_AddItemToObject(obj, key, item);
}

/* The member named key; the last one if repeated, as Python reads it. */
static const cJSON *
find(const cJSON *obj, const char *key)
{
    const cJSON *hit = NULL;

    if (!cJSON_IsObject(obj))
        return NULL;
    for (const cJSON *c = obj->child; c; c = c->next)
        if (c->string && strcmp(c->string, key) == 0)
            hit = c;
    return hit;
}

const char *
json_get_str(const cJSON *obj, const char *key)
{
    const cJSON *it = find(obj, key);

    return cJSON_IsString(it) ? it->valuestring : NULL;
}

int
json_get_int(const cJSON *obj, const char *key, long long *ret)
{
    const cJSON *it = find(obj, key);

    if (cJSON_IsNumber(it)) {
        double d = it->valuedouble;

        /* -2^63 <= d < 2^63 and integral. */
        if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0) ||
            d != (double)(long long)d)
            return -EINVAL;
        *ret = (long long)d;
        return 0;
    }
    if (cJSON_IsRaw(it) && it->valuestring) {
        const char *s = it->valuestring;
        char *end;
        long long v;

        if (!(s[0] == '-' || (s[0] >= '0' && s[0] <= '9')))
            return -EINVAL;
        errno = 0;
        v = strtoll(s, &end, 10);
        if (errno || *end)
            return -EINVAL;
        *ret = v;
        return 0;
    }
    return -EINVAL;
}

int
json_get_num(const cJSON *obj, const char *key, double *ret)
{
    const cJSON *it = find(obj, key);

    if (cJSON_IsNumber(it)) {
        *ret = it->valuedouble;
        return 0;
    }
    if (cJSON_IsRaw(it) && it->valuestring) {
        const char *s = it->valuestring;
        char *end;
        double v;

        if (!(s[0] == '-' || (s[0] >= '0' && s[0] <= '9') || s[0] == 'N' || s[0] == 'I'))
            return -EINVAL;
        v = strtod(s, &end);
        if (*end)
            return -EINVAL;
        *ret = v;
        return 0;
    }
    return -EINVAL;
}

bool
json_get_bool(const cJSON *obj, const char *key, bool *ret)
{
    const cJSON *it = find(obj, key);

    if (!cJSON_IsBool(it))
        return false;
    *ret = cJSON_IsTrue(it);
    return true;
}

/* Length of a valid UTF-8 sequence at s (Python's strict decoder: no
 * overlong forms, no surrogates, nothing above U+10FFFF), or 0. */
static size_t
utf8_len(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];

    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        return n >= 2 && (s[1] & 0xc0) == 0x80 ? 2 : 0;
    if (c >= 0xe0 && c <= 0xef) {
        if (n < 3 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80)
            return 0;
        if ((c == 0xe0 && s[1] < 0xa0) || (c == 0xed && s[1] >= 0xa0))
            return 0;
        return 3;
    }
    if (c >= 0xf0 && c <= 0xf4) {
        if (n < 4 || (s[1] & 0xc0) != 0x80 || (s[2] & 0xc0) != 0x80 || (s[3] & 0xc0) != 0x80)
            return 0;
        if ((c == 0xf0 && s[1] < 0x90) || (c == 0xf4 && s[1] >= 0x90))
            return 0;
        return 4;
    }
    return 0;
}

/* Length of a number that matches JSON's grammar at s, or 0. */
static size_t
number_len(const char *s, size_t n)
{
    size_t i = 0, d;

    if (i < n && s[i] == '-')
        i++;
    if (i < n && s[i] == '0')
        i++;
    else if (i < n && s[i] >= '1' && s[i] <= '9')
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
    else
        return 0;
    if (i < n && s[i] == '.') {
        for (d = ++i; i < n && s[i] >= '0' && s[i] <= '9';)
            i++;
        if (i == d)
            return 0;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        for (d = i; i < n && s[i] >= '0' && s[i] <= '9';)
            i++;
        if (i == d)
            return 0;
    }
    return i;
}

static bool
is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Numbers of a parsed text, in document order. */
struct numtok {
    size_t *off;
    size_t *len;
    size_t n;
    size_t cap;
};

static void
numtok_push(struct numtok *t, size_t off, size_t len)
{
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 16;
        t->off = xrealloc(t->off, t->cap * sizeof(*t->off));
        t->len = xrealloc(t->len, t->cap * sizeof(*t->len));
    }
    t->off[t->n] = off;
    t->len[t->n++] = len;
}

/*
 * What cJSON lets through and Python's json.loads does not: invalid UTF-8,
 * a BOM, control characters in strings or as whitespace, numbers such as
 * "01", "1." or "-". Runs on text cJSON has parsed, so strings and
 * structure are known to be well formed. Collects the numbers into t.
 * Returns 0, or the offset of the problem + 1 with *why set.
 */
static size_t
check_text(const char *s, size_t n, struct numtok *t, const char **why)
{
    bool in_str = false;

    if (n >= 3 && memcmp(s, "\xef\xbb\xbf", 3) == 0) {
        *why = "unexpected UTF-8 BOM";
        return 1;
    }
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t k;

        if (c >= 0x80) {
            k = utf8_len((const unsigned char *)s + i, n - i);
            if (!k) {
                *why = "invalid UTF-8";
                return i + 1;
            }
            i += k;
            continue;
        }
        if (in_str) {
            if (c < 0x20) {
                *why = "invalid control character in string";
                return i + 1;
            }
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = false;
            i++;
            continue;
        }
        if (c == '"') {
            in_str = true;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            /* The run cJSON takes for a number; all of it must be one. */
            /* (bounded by n: the text need not end in a NUL) */
            for (k = 0; i + k < n && strchr("0123456789+-.eE", s[i + k]) && s[i + k]; k++)
                ;
            if (number_len(s + i, k) != k) {
                *why = "invalid number";
                return i + 1;
            }
            numtok_push(t, i, k);
            i += k;
            continue;
        } else if (c < 0x20 && !is_ws((char)c)) {
            *why = "invalid control character";
            return i + 1;
        }
        i++;
    }
    return 0;
}

/* Turns the numbers a double would print differently from Python into raw
 * nodes (see the top of the file). Walks in document order, as t is. */
static void
keep_numbers(cJSON *v, const char *text, const struct numtok *t, size_t *next)
{
    for (cJSON *c = v; c; c = c->next) {
        if (cJSON_IsNumber(c) && *next < t->n) {
            const char *s = text + t->off[*next];
            size_t len = t->len[(*next)++];
            bool is_float = memchr(s, '.', len) || memchr(s, 'e', len) || memchr(s, 'E', len);
            double d = c->valuedouble;
            char *raw = NULL;

            if (!is_float && fabs(d) >= EXACT_INT_LIMIT) {
                raw = xstrndup(s, len);
            } else if (is_float && fabs(d) < EXACT_INT_LIMIT && d == (double)(long long)d) {
                raw = xmalloc(32);
                json_repr_double(d, raw);
            }
            if (raw) {
                c->type = (c->type & ~0xff) | cJSON_Raw;
                c->valuestring = raw;
            }
        }
        if (c->child)
            keep_numbers(c->child, text, t, next);
    }
}

static size_t
count_numbers(const cJSON *v)
{
    size_t n = 0;

    for (const cJSON *c = v; c; c = c->next)
        n += (cJSON_IsNumber(c) ? 1 : 0) + (c->child ? count_numbers(c->child) : 0);
    return n;
}

/* Sets the "Unable to read" error for a problem at byte off of text. */
static int
bad_json(struct esd_err *err, const char *path, const char *text, size_t off, const char *why)
{
    size_t line = 1, col = 1;

    for (size_t i = 0; i < off; i++) {
        if (text[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    return err_set(err, -EINVAL, "Unable to read JSON file %s: %s: line %zu column %zu (byte %zu)",
                   path, why, line, col, off);
}

int
json_parse_object(const char *text, size_t len, const char *name, cJSON **ret, struct esd_err *err)
{
    struct numtok t = { 0 };
    const char *end = NULL, *why = NULL;
    size_t bad, next = 0;
    cJSON *v;
    int r;

    v = cJSON_ParseWithLengthOpts(text, len, &end, false);
    if (!v)
        return bad_json(err, name, text, end ? (size_t)(end - text) : 0, "invalid JSON");
    while (end < text + len && is_ws(*end))
        end++;
    if (end != text + len) {
        r = bad_json(err, name, text, (size_t)(end - text), "extra data");
        goto fail;
    }
    bad = check_text(text, len, &t, &why);
    if (bad) {
        r = bad_json(err, name, text, bad - 1, why);
        goto fail;
    }
    if (!cJSON_IsObject(v)) {
        r = err_set(err, -EINVAL, "Expected a JSON object in %s", name);
        goto fail;
    }
    /* The walk pairs tokens with nodes; it relies on both being complete. */
    if (count_numbers(v) == t.n)
        keep_numbers(v, text, &t, &next);
    free(t.off);
    free(t.len);
    *ret = v;
    return 0;

fail:
    free(t.off);
    free(t.len);
    cJSON_Delete(v);
    return r;
}

int
json_load_object(const char *path, size_t max, cJSON **ret, struct esd_err *err)
{
    size_t len;
    char *text;
    int r;

    r = fs_read_job(path, max, &text, &len, NULL);
    if (r == -ELOOP)
        return err_set(err, r, "Unable to read JSON file %s: a symbolic link, not followed", path);
    if (r == -EFBIG)
        return err_set(err, r, "Unable to read JSON file %s: larger than %zu bytes", path, max);
    if (r == -EINVAL)
        return err_set(err, r, "Unable to read JSON file %s: not a regular file", path);
    if (r < 0)
        return err_sys(err, r, "Unable to read JSON file %s", path);
    r = json_parse_object(text, len, path, ret, err);
    free(text);
    return r;
}

static int
serialise_and(int (*write_fn)(const char *, const void *, size_t, mode_t, struct esd_err *),
              const char *path, const cJSON *v, enum json_style style, struct esd_err *err)
{
    struct buf b;
    int r;

    buf_init(&b);
    json_dump(v, style, &b);
    /* 0666 less the umask, as Python's open() creates files. */
    r = write_fn(path, b.p, b.len, 0666, err);
    buf_free(&b);
    return r;
}

int
json_write_atomic(const char *path, const cJSON *v, enum json_style style, struct esd_err *err)
{
    return serialise_and(fs_write_atomic, path, v, style, err);
}

int
json_publish_excl(const char *path, const cJSON *v, enum json_style style, struct esd_err *err)
{
    return serialise_and(fs_publish_excl, path, v, style, err);
}
