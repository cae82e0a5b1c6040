/*
 * jsonl: a non-allocating, iterative JSON validator for one JSONL record,
 * plus a bounded streaming line reader. The grammar is Python's json module
 * (what the reference accepts), with lone surrogate escapes refused. String
 * bodies, where almost all bytes of real records live, are scanned 16 bytes
 * at a time with SSE2 when available.
 */
#include "jsonl.h"

#include "fsutil.h"
#include "zsrc.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

const struct jsonl_limits jsonl_default_limits = {
    .max_line = JSONL_MAX_LINE_DEFAULT,
    .max_depth = JSONL_MAX_DEPTH_DEFAULT,
};

void
jsonl_record_init(struct jsonl_record *rec, bool want_members)
{
    memset(rec, 0, sizeof(*rec));
    rec->want_members = want_members;
}

void
jsonl_record_free(struct jsonl_record *rec)
{
    free(rec->members);
    rec->members = NULL;
    rec->members_cap = 0;
    rec->nmembers = 0;
}

/*
 * Strict UTF-8 sequence at p (p[0] >= 0x80), at most n bytes available.
 * Returns its length, or 0 if invalid (overlong, surrogate, > U+10FFFF,
 * truncated, stray continuation byte).
 */
static size_t
utf8_seq(const unsigned char *p, size_t n)
{
    unsigned char c = p[0];

    /* 0x80-0xbf is a continuation byte with no lead; 0xc0 and 0xc1 could
     * only start an overlong two-byte form of ASCII. */
    if (c < 0xc2)
        return 0;
    if (c < 0xe0) {
        if (n < 2 || (p[1] & 0xc0) != 0x80)
            return 0;
        return 2;
    }
    if (c < 0xf0) {
        if (n < 3 || (p[1] & 0xc0) != 0x80 || (p[2] & 0xc0) != 0x80)
            return 0;
        if (c == 0xe0 && p[1] < 0xa0)
            return 0; /* overlong */
        /* Python's strict "utf-8" codec refuses encoded surrogates, so
         * the reference reports them as invalid UTF-8 */
        if (c == 0xed && p[1] >= 0xa0)
            return 0; /* UTF-16 surrogate */
        return 3;
    }
    if (c < 0xf5) {
        if (n < 4 || (p[1] & 0xc0) != 0x80 || (p[2] & 0xc0) != 0x80 || (p[3] & 0xc0) != 0x80)
            return 0;
        if (c == 0xf0 && p[1] < 0x90)
            return 0; /* overlong */
        if (c == 0xf4 && p[1] >= 0x90)
            return 0; /* above U+10FFFF */
        return 4;
    }
    return 0;
}

bool
jsonl_utf8_valid(const char *p, size_t n, size_t *ret_bad)
{
    const unsigned char *s = (const unsigned char *)p;
    size_t i = 0;

    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t k = utf8_seq(s + i, n - i);
        if (!k) {
            if (ret_bad)
                *ret_bad = i;
            return false;
        }
        i += k;
    }
    return true;
}

static int
hexval(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c |= 0x20;
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* Four hex digits at s[0..4) (caller checked length); -1 if not hex. */
static long
hex4(const unsigned char *s)
{
    long v = 0;

    for (int i = 0; i < 4; i++) {
        int h = hexval(s[i]);
        if (h < 0)
            return -1;
        v = v << 4 | h;
    }
    return v;
}

/*
 * The scanner's state. Offsets travel as arguments and return values, so
 * that they live in registers: a scanning function returns the offset past
 * what it scanned, or 0 after recording a fault (whatever it scanned was
 * at least one byte, so the offset past it is never 0).
 */
struct scan {
    const unsigned char *s;
    size_t n;
    struct jsonl_record *rec;
};

static int
fault(struct scan *sc, enum jsonl_fault f, size_t off, const char *detail)
{
    sc->rec->fault = f;
    sc->rec->fault_off = off;
    sc->rec->detail = detail;
    return -EINVAL;
}

/* fault for the scanning functions, which return 0 on a fault; cold, so
 * that the compiler lays out the paths of valid records first */
static size_t __attribute__((cold, noinline))
fail(struct scan *sc, enum jsonl_fault f, size_t off, const char *detail)
{
    fault(sc, f, off, detail);
    return 0;
}

/* JSON's whitespace, Python json's WHITESPACE: " \t\n\r" and nothing
 * else ("\v" and "\f" are syntax errors between tokens, though is_blank
 * counts them). "\n" cannot occur in a line, but jsonl_check takes any
 * buffer. Most tokens follow each other without any: one comparison
 * decides that case. */
static inline size_t
skip_ws(const unsigned char *s, size_t i, size_t n)
{
    while (i < n && s[i] <= ' ' && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r' || s[i] == '\n'))
        i++;
    return i;
}

/* Byte classes, for the scalar loops of run_end: RUN_STR stops a run of
 * plain string bytes (quote, backslash, control, non-ASCII), RUN_DIGIT a
 * run of digits. Non-ASCII stops a string run so that its UTF-8 is
 * validated where it stands; DEL (0x7f) does not: Python's strict mode
 * refuses only the characters below 0x20. */
enum { RUN_STR = 1, RUN_DIGIT = 2 };
static const unsigned char run_stop[256] = {
    [0 ... 0x1f] = RUN_STR | RUN_DIGIT, /* control characters */
    [' ' ... '!'] = RUN_DIGIT,
    ['"'] = RUN_STR | RUN_DIGIT,
    ['#' ... '/'] = RUN_DIGIT,
    [':' ... '['] = RUN_DIGIT, /* ('0' to '9': 0) */
    ['\\'] = RUN_STR | RUN_DIGIT,
    [']' ... 0x7f] = RUN_DIGIT,
    [0x80 ... 0xff] = RUN_STR | RUN_DIGIT, /* non-ASCII */
};

#if defined(__SSE2__)
/* One bit per byte of the 16 at p: set where the byte stops a run of
 * kind (RUN_STR or RUN_DIGIT, a constant once inlined). */
static inline unsigned
run_mask16(const unsigned char *p, unsigned kind)
{
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)p), m;

    /* signed compares: bytes >= 0x80 are negative, below ' ' and '0' */
    if (kind == RUN_STR)
        m = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')),
                                      _mm_cmpeq_epi8(v, _mm_set1_epi8('\\'))),
                         _mm_cmplt_epi8(v, _mm_set1_epi8(0x20)));
    else
        m = _mm_or_si128(_mm_cmplt_epi8(v, _mm_set1_epi8('0')),
                         _mm_cmpgt_epi8(v, _mm_set1_epi8('9')));
    return (unsigned)_mm_movemask_epi8(m);
}
#endif

/*
 * The first offset at or after i in s[0..n) whose byte stops a run of
 * kind, or n. Sixteen bytes at a time with SSE2; where fewer than 16 are
 * left, the buffer's last 16 are looked at instead (the bytes before i
 * shifted out), so that a record's last tokens take no byte by byte loop
 * either. Never reads outside s[0..n).
 */
static inline size_t
run_end(const unsigned char *s, size_t i, size_t n, unsigned kind)
{
#if defined(__SSE2__)
    unsigned mask;

    for (; i + 16 <= n; i += 16)
        if ((mask = run_mask16(s + i, kind)))
            return i + (size_t)__builtin_ctz(mask);
    if (i < n && n >= 16) {
        mask = run_mask16(s + n - 16, kind) >> (i - (n - 16));
        return mask ? i + (size_t)__builtin_ctz(mask) : n;
    }
#endif
    while (i < n && !(run_stop[s[i]] & kind))
        i++;
    return i;
}

/*
 * The same, the first 16 bytes one by one, for strings: most (keys, short
 * values) are short and of lengths that repeat from record to record, so
 * that the processor predicts this loop's branches and goes on to the next
 * token at once, where the vector loop makes it wait for the mask that
 * says where the run ends (numbers, of lengths that vary, keep that one).
 */
static inline size_t
run_end_short(const unsigned char *s, size_t i, size_t n, unsigned kind)
{
    size_t lim = n - i > 16 ? i + 16 : n;

    while (i < lim && !(run_stop[s[i]] & kind))
        i++;
    return i < lim || i == n ? i : run_end(s, i, n, kind);
}

/*
 * The rest of a string whose opening quote is at s[start], from s[i], the
 * first byte that stops a run of plain bytes (or n). Returns the offset
 * past the closing quote, with *ret_escaped telling whether a backslash
 * occurred, or 0 with the fault recorded.
 */
static size_t
string_rest(struct scan *sc, size_t start, size_t i, bool *ret_escaped)
{
    const unsigned char *s = sc->s;
    size_t n = sc->n;
    bool escaped = false;

    for (;; i = run_end(s, i, n, RUN_STR)) {
        if (i >= n)
            return fail(sc, JSONL_SYNTAX, start, "unterminated string");
        unsigned char c = s[i];
        if (c == '"') {
            *ret_escaped = escaped;
            return i + 1;
        }
        if (c >= 0x80) {
            /* Runs of non-ASCII text (CJK, …) stay in this inner loop. */
            do {
                size_t k = utf8_seq(s + i, n - i);
                if (!k)
                    return fail(sc, JSONL_UTF8, i, "invalid UTF-8 sequence");
                i += k;
            } while (i < n && s[i] >= 0x80);
            continue;
        }
        /* json.loads is strict by default: a raw tab or newline inside a
         * string is "Invalid control character", as here */
        if (c < 0x20)
            return fail(sc, JSONL_SYNTAX, i, "raw control character in string");
        /* backslash */
        escaped = true;
        if (i + 1 >= n)
            return fail(sc, JSONL_SYNTAX, start, "unterminated string");
        c = s[i + 1];
        switch (c) {
        case '"':
        case '\\':
        case '/':
        case 'b':
        case 'f':
        case 'n':
        case 'r':
        case 't':
            i += 2;
            continue;
        case 'u':
            break;
        default:
            return fail(sc, JSONL_SYNTAX, i, "invalid escape in string");
        }
        if (i + 6 > n)
            return fail(sc, JSONL_SYNTAX, i, "invalid \\u escape in string");
        long u = hex4(s + i + 2);
        if (u < 0)
            return fail(sc, JSONL_SYNTAX, i, "invalid \\u escape in string");
        /* Python combines a high surrogate with a following \u low one and
         * keeps any other surrogate as it is: the record then parses but
         * cannot be written as UTF-8 (the reference's crash of spec §6.4,
         * §16.5). Refused here, at the byte that starts it. */
        if (u >= 0xd800 && u <= 0xdbff) {
            long lo = -1;
            if (i + 12 <= n && s[i + 6] == '\\' && s[i + 7] == 'u')
                lo = hex4(s + i + 8);
            if (lo < 0xdc00 || lo > 0xdfff)
                return fail(sc, JSONL_SURROGATE, i, "lone surrogate escape");
            i += 12;
            continue;
        }
        if (u >= 0xdc00 && u <= 0xdfff)
            return fail(sc, JSONL_SURROGATE, i, "lone surrogate escape");
        i += 6;
    }
}

/*
 * A string whose opening quote is at s[i]. Returns the offset past the
 * closing quote, with *ret_escaped telling whether a backslash occurred,
 * or 0 with the fault recorded. Inline for the common case, a string of
 * plain bytes; any other byte is left to string_rest.
 */
static inline size_t
scan_string(struct scan *sc, size_t i, bool *ret_escaped)
{
    size_t end = run_end_short(sc->s, i + 1, sc->n, RUN_STR);

    if (end < sc->n && sc->s[end] == '"') {
        *ret_escaped = false;
        return end + 1;
    }
    return string_rest(sc, i, end, ret_escaped);
}

/* Whether the literal lit (len bytes) is at s[i]. */
static inline bool
match_lit(const unsigned char *s, size_t i, size_t n, const char *lit, size_t len)
{
    return n - i >= len && memcmp(s + i, lit, len) == 0;
}

static inline bool
is_digit(unsigned char c)
{
    return c >= '0' && c <= '9';
}

/*
 * Python's NUMBER_RE, (-?(?:0|[1-9]\d*))(\.\d+)?([eE][-+]?\d+)?, plus
 * -Infinity, at s[i] (a '-' or a digit). The optional parts are taken only
 * when complete, as the regular expression takes them: "01", "1." and
 * "1e" end the number after "0" or "1" and leave the rest to fail as the
 * next token, where Python fails too. The value is never computed: Python
 * accepts any length (arbitrary precision integers, 1e999 as inf), so only
 * the shape matters. Returns the offset past the number, or 0 with the
 * fault recorded.
 */
static size_t
scan_number(struct scan *sc, size_t i)
{
    const unsigned char *s = sc->s;
    size_t n = sc->n, start = i;

    if (s[i] == '-') {
        i++;
        if (i < n && s[i] == 'I') {
            if (match_lit(s, i, n, "Infinity", 8))
                return i + 8;
            return fail(sc, JSONL_SYNTAX, start, "expected a value");
        }
    }
    if (i >= n || !is_digit(s[i]))
        return fail(sc, JSONL_SYNTAX, start, "expected a value");
    if (s[i] == '0')
        i++;
    else
        i = run_end(s, i + 1, n, RUN_DIGIT);
    if (i + 1 < n && s[i] == '.' && is_digit(s[i + 1]))
        i = run_end(s, i + 2, n, RUN_DIGIT);
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        size_t j = i + 1;
        if (j < n && (s[j] == '+' || s[j] == '-'))
            j++;
        if (j < n && is_digit(s[j]))
            i = run_end(s, j + 1, n, RUN_DIGIT);
    }
    return i;
}

static void
add_member(struct jsonl_record *rec, size_t key_off, size_t key_len, bool key_escaped)
{
    struct jsonl_member *m;

    if (rec->nmembers == rec->members_cap) {
        rec->members_cap = rec->members_cap ? rec->members_cap * 2 : 16;
        rec->members = xrealloc(rec->members, rec->members_cap * sizeof(*rec->members));
    }
    m = &rec->members[rec->nmembers++];
    m->key_off = key_off;
    m->key_len = key_len;
    m->key_escaped = key_escaped;
    m->val_off = m->val_len = 0;
}

/*
 * The grammar as a loop over an explicit container stack: one bit per level
 * (1 = object), so depth costs max_depth/8 bytes and no recursion. A
 * max_depth above what the stack holds is lowered to it. The value starts
 * at s[i] or after whitespace; returns the offset past it, or 0 with the
 * fault recorded.
 *
 * Control reaches "after" once per complete value, with depth the level
 * of the container holding it (0: the record itself) and obj telling
 * whether that container is an object. For members, a value of the
 * top-level object starts at "value" and ends at "after" with depth 1
 * (top is set there and only there); a nested container's own values pass
 * there at depth 2 and more. Members are recorded in order, duplicates
 * included: what Python makes of a duplicate key (the last value at the
 * first one's place, spec §6.3) is for the caller to apply.
 */
static size_t
scan_value(struct scan *sc, size_t i, unsigned max_depth)
{
    enum { STACK_BYTES = 512 };
    unsigned char stack[STACK_BYTES];
    const unsigned char *s = sc->s;
    size_t n = sc->n, kstart;
    unsigned depth = 0;
    struct jsonl_record *rec = sc->rec;
    bool members = rec->want_members, obj = false, top = false, esc;

    if (max_depth > STACK_BYTES * 8)
        max_depth = STACK_BYTES * 8;

value:
    i = skip_ws(s, i, n);
    if (i >= n)
        return fail(sc, JSONL_SYNTAX, i, "expected a value");
    if (top)
        rec->members[rec->nmembers - 1].val_off = i;
    switch (s[i]) {
    case '{':
    case '[':
        if (depth >= max_depth)
            return fail(sc, JSONL_DEPTH, i, "nested too deeply");
        obj = s[i] == '{';
        if (obj)
            stack[depth / 8] |= (unsigned char)(1u << (depth % 8));
        else
            stack[depth / 8] &= (unsigned char)~(1u << (depth % 8));
        if (depth == 0 && obj)
            rec->obj_open = i;
        depth++;
        top = members && depth == 1 && obj;
        i = skip_ws(s, i + 1, n);
        if (i < n && s[i] == (obj ? '}' : ']'))
            goto close;
        if (!obj)
            goto value;
        goto key;
    case '"':
        if (!(i = scan_string(sc, i, &esc)))
            return 0;
        goto after;
    case 't':
        if (!match_lit(s, i, n, "true", 4))
            break;
        i += 4;
        goto after;
    case 'f':
        if (!match_lit(s, i, n, "false", 5))
            break;
        i += 5;
        goto after;
    case 'n':
        if (!match_lit(s, i, n, "null", 4))
            break;
        i += 4;
        goto after;
    case 'N':
        if (!match_lit(s, i, n, "NaN", 3))
            break;
        i += 3;
        goto after;
    case 'I':
        if (!match_lit(s, i, n, "Infinity", 8))
            break;
        i += 8;
        goto after;
    default:
        if (s[i] == '-' || is_digit(s[i])) {
            if (!(i = scan_number(sc, i)))
                return 0;
            goto after;
        }
        break;
    }
    return fail(sc, JSONL_SYNTAX, i, "expected a value");

key:
    /* at the first byte after '{' or ',' (whitespace skipped) */
    if (i >= n || s[i] != '"')
        return fail(sc, JSONL_SYNTAX, i, "expected a string key");
    kstart = i;
    if (!(i = scan_string(sc, i, &esc)))
        return 0;
    if (top)
        add_member(rec, kstart + 1, i - kstart - 2, esc);
    i = skip_ws(s, i, n);
    if (i >= n || s[i] != ':')
        return fail(sc, JSONL_SYNTAX, i, "expected ':'");
    i++;
    goto value;

close:
    /* at the closing bracket of the innermost container, which obj tells */
    i++;
    depth--;
    if (depth == 0 && obj)
        rec->obj_close = i - 1;
    if (depth > 0)
        obj = (stack[(depth - 1) / 8] >> ((depth - 1) % 8)) & 1;
    top = members && depth == 1 && obj;

after:
    if (depth == 0)
        return i;
    if (top) {
        struct jsonl_member *m = &rec->members[rec->nmembers - 1];
        m->val_len = i - m->val_off;
    }
    i = skip_ws(s, i, n);
    if (i < n && s[i] == ',') {
        i++;
        if (obj) {
            i = skip_ws(s, i, n);
            goto key;
        }
        goto value;
    }
    if (i < n && s[i] == (obj ? '}' : ']'))
        goto close;
    return fail(sc, JSONL_SYNTAX, i, obj ? "expected ',' or '}'" : "expected ',' or ']'");
}

/* Spec §6.3's blank line: only ASCII whitespace, the six bytes Python's
 * bytes methods call whitespace, a wider set than JSON's (skip_ws). */
static bool
is_blank(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r' && c != '\v' && c != '\f')
            return false;
    }
    return true;
}

int
jsonl_check(struct jsonl_record *rec, const char *p, size_t n, const struct jsonl_limits *lim)
{
    struct scan sc = { (const unsigned char *)p, n, rec };
    size_t bad, first, end;

    if (!lim)
        lim = &jsonl_default_limits;
    rec->fault = JSONL_OK;
    rec->fault_off = 0;
    rec->detail = NULL;
    rec->nmembers = 0;
    rec->obj_open = rec->obj_close = 0;
    /* Length first: nothing is scanned past the bound. Blankness before the
     * grammar: a blank line is its own error, never "Invalid JSON". */
    if (n > lim->max_line)
        return fault(&sc, JSONL_TOO_LONG, lim->max_line, "record too long");
    if (is_blank(p, n))
        return fault(&sc, JSONL_BLANK, 0, NULL);
    first = skip_ws(sc.s, 0, n);
    end = scan_value(&sc, first, lim->max_depth ? lim->max_depth : JSONL_MAX_DEPTH_DEFAULT);
    if (end) {
        end = skip_ws(sc.s, end, n);
        if (end < n)
            end = fail(&sc, JSONL_SYNTAX, end, "extra data after the value");
    }
    if (!end) {
        /* Python decodes the whole line before parsing: a bad byte anywhere
         * wins over a syntax error, and a BOM is reported as such. Only a
         * failed scan needs this pass: a byte >= 0x80 outside a string is a
         * syntax error and strings validate their own, so a record that
         * scans is valid UTF-8 throughout. */
        if (!jsonl_utf8_valid(p, n, &bad))
            return fault(&sc, JSONL_UTF8, bad, "invalid UTF-8 sequence");
        if (n >= 3 && memcmp(p, "\xef\xbb\xbf", 3) == 0)
            return fault(&sc, JSONL_BOM, 0, "Unexpected UTF-8 BOM");
        return -EINVAL;
    }
    /* After the whole value, as Python checks the type of what it parsed:
     * a broken array is "Invalid JSON", not "must be an object". */
    if (p[first] != '{')
        return fault(&sc, JSONL_NOT_OBJECT, first, NULL);
    return 0;
}

int
jsonl_error(const struct jsonl_record *rec, const struct jsonl_limits *lim, const char *file,
            unsigned long long line, struct esd_err *err)
{
    unsigned long long byte = (unsigned long long)rec->fault_off + 1;

    if (!lim)
        lim = &jsonl_default_limits;
    switch (rec->fault) {
    case JSONL_BLANK:
        return err_set(err, -EINVAL, "Blank JSONL record at %s:%llu", file, line);
    case JSONL_TOO_LONG:
        return err_set(err, -EINVAL, "JSONL record longer than %zu bytes at %s:%llu", lim->max_line,
                       file, line);
    case JSONL_UTF8:
        return err_set(err, -EINVAL, "Invalid UTF-8 at %s:%llu: %s at byte %llu", file, line,
                       rec->detail, byte);
    case JSONL_BOM:
        return err_set(err, -EINVAL, "Invalid JSON at %s:%llu: Unexpected UTF-8 BOM", file, line);
    case JSONL_DEPTH:
        return err_set(err, -EINVAL,
                       "Invalid JSON at %s:%llu: nested deeper than %u levels at byte %llu", file,
                       line, lim->max_depth ? lim->max_depth : JSONL_MAX_DEPTH_DEFAULT, byte);
    case JSONL_SURROGATE:
        return err_set(err, -EINVAL, "Invalid JSON at %s:%llu: lone surrogate escape at byte %llu",
                       file, line, byte);
    case JSONL_NOT_OBJECT:
        return err_set(err, -EINVAL, "JSONL record must be an object at %s:%llu", file, line);
    case JSONL_SYNTAX:
        return err_set(err, -EINVAL, "Invalid JSON at %s:%llu: %s at byte %llu", file, line,
                       rec->detail, byte);
    case JSONL_OK:
        break;
    }
    return err_set(err, -EINVAL, "invalid JSONL record at %s:%llu", file, line);
}

static void
put_utf8(struct buf *out, unsigned long cp)
{
    char b[4];

    if (cp < 0x80) {
        buf_putc(out, (char)cp);
    } else if (cp < 0x800) {
        b[0] = (char)(0xc0 | cp >> 6);
        b[1] = (char)(0x80 | (cp & 0x3f));
        buf_append(out, b, 2);
    } else if (cp < 0x10000) {
        b[0] = (char)(0xe0 | cp >> 12);
        b[1] = (char)(0x80 | (cp >> 6 & 0x3f));
        b[2] = (char)(0x80 | (cp & 0x3f));
        buf_append(out, b, 3);
    } else {
        b[0] = (char)(0xf0 | cp >> 18);
        b[1] = (char)(0x80 | (cp >> 12 & 0x3f));
        b[2] = (char)(0x80 | (cp >> 6 & 0x3f));
        b[3] = (char)(0x80 | (cp & 0x3f));
        buf_append(out, b, 4);
    }
}

/* The input passed jsonl_check, so every backslash starts a valid escape
 * and a \u high surrogate is followed by its low one: the defensive exits
 * below are not reached for it. '"', '\\' and '/' are the default case. */
void
jsonl_unescape(const char *s, size_t n, struct buf *out)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0;

    buf_reserve(out, n);
    while (i < n) {
        if (u[i] != '\\') {
            i++;
            run++;
            continue;
        }
        buf_append(out, s + i - run, run);
        run = 0;
        if (i + 1 >= n)
            break;
        switch (u[i + 1]) {
        case 'b':
            buf_putc(out, '\b');
            i += 2;
            continue;
        case 'f':
            buf_putc(out, '\f');
            i += 2;
            continue;
        case 'n':
            buf_putc(out, '\n');
            i += 2;
            continue;
        case 'r':
            buf_putc(out, '\r');
            i += 2;
            continue;
        case 't':
            buf_putc(out, '\t');
            i += 2;
            continue;
        case 'u':
            break;
        default:
            buf_putc(out, (char)u[i + 1]);
            i += 2;
            continue;
        }
        long cp = i + 6 <= n ? hex4(u + i + 2) : -1;
        if (cp < 0)
            break; /* not reached for validated input */
        i += 6;
        if (cp >= 0xd800 && cp <= 0xdbff && i + 6 <= n && u[i] == '\\' && u[i + 1] == 'u') {
            long lo = hex4(u + i + 2);
            if (lo >= 0xdc00 && lo <= 0xdfff) {
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
                i += 6;
            }
        }
        put_utf8(out, (unsigned long)cp);
    }
    buf_append(out, s + i - run, run);
}

/* ---- streaming reader ---- */

/*
 * The buffer holds [beg, end) unread bytes; scan marks how far the current
 * partial record was searched for "\n", so a long record's bytes are
 * searched once, not once per read. It grows only while a record is
 * incomplete and never past max_line + READ_CHUNK: the memory a reader
 * takes is bounded by the limit, not by the input.
 */
enum { READ_CHUNK = 4 << 20 };

int
jsonl_reader_open(struct jsonl_reader *r, const char *path, size_t max_line, struct esd_err *err)
{
    return jsonl_reader_open_as(r, path, ZSRC_PLAIN, max_line, err);
}

int
jsonl_reader_open_as(struct jsonl_reader *r, const char *path, int compression, size_t max_line,
                     struct esd_err *err)
{
    /* (a FIFO or a device in place of an input or a result is refused) */
    int fd = fs_open_file(path, O_RDONLY, 0, NULL, err);

    if (fd < 0)
        return fd;
    jsonl_reader_open_fd(r, fd, path, max_line);
    if (compression != ZSRC_PLAIN) {
        r->z = zsrc_new(fd, (enum zsrc_kind)compression, path);
        r->decoded = true;
    }
    return 0;
}

void
jsonl_reader_open_fd(struct jsonl_reader *r, int fd, const char *name, size_t max_line)
{
    /* a hint only: a pipe (standard input) refuses it, harmlessly */
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    memset(r, 0, sizeof(*r));
    r->fd = fd;
    r->path = xstrdup(name);
    r->max_line = max_line ? max_line : JSONL_MAX_LINE_DEFAULT;
    r->cap = READ_CHUNK;
    r->buf = xmalloc(r->cap);
}

void
jsonl_reader_close(struct jsonl_reader *r)
{
    /* buf is set from open to close only: a second close is harmless */
    zsrc_free(r->z);
    r->z = NULL;
    if (r->fd >= 0 && r->buf)
        close(r->fd);
    free(r->buf);
    free(r->path);
    r->buf = NULL;
    r->path = NULL;
    r->fd = -1;
}

/* Reads more into the buffer, keeping [beg, end): 1 when bytes came, 0 at
 * the end of the file, or a negative errno with err set. At most
 * room + READ_CHUNK bytes are held. */
static int
reader_fill(struct jsonl_reader *r, size_t room, struct esd_err *err)
{
    if (r->beg > 0) {
        memmove(r->buf, r->buf + r->beg, r->end - r->beg);
        r->end -= r->beg;
        r->scan -= r->beg;
        r->beg = 0;
    }
    if (r->cap - r->end < READ_CHUNK / 4) {
        size_t want = r->cap * 2;
        if (want > room + READ_CHUNK)
            want = room + READ_CHUNK;
        if (want > r->cap) {
            r->buf = xrealloc(r->buf, want);
            r->cap = want;
        }
    }
    for (;;) {
        ssize_t got;

        if (r->z) {
            struct esd_err zerr;

            got = zsrc_read(r->z, r->buf + r->end, r->cap - r->end, r->on_data, r->on_data_ctx,
                            &r->offset, &zerr);
            /* the line reached in the text, after the file's offset */
            if (got < 0)
                return err_set(err, (int)got, "%s (line %llu)", zerr.msg, r->lineno + 1);
        } else {
            got = read(r->fd, r->buf + r->end, r->cap - r->end);
            if (got < 0 && errno == EINTR)
                continue;
            if (got < 0)
                return err_sys(err, -errno, "cannot read %s", r->path);
            /* Every byte as read, before any is split: on_data sees the
             * file exactly, final line without "\n" included. */
            if (got > 0 && r->on_data)
                r->on_data(r->on_data_ctx, r->buf + r->end, (size_t)got);
        }
        if (got == 0) {
            r->eof = true;
            return 0;
        }
        if (r->on_text)
            r->on_text(r->on_text_ctx, r->buf + r->end, (size_t)got);
        r->end += (size_t)got;
        return 1;
    }
}

int
jsonl_reader_next(struct jsonl_reader *r, const char **ret_line, size_t *ret_len, bool *ret_nl,
                  struct esd_err *err)
{
    int rr;

    for (;;) {
        char *nl = NULL;

        if (r->scan < r->end)
            nl = memchr(r->buf + r->scan, '\n', r->end - r->scan);
        if (nl) {
            size_t len = (size_t)(nl - (r->buf + r->beg));
            if (len > r->max_line)
                return err_set(err, -EFBIG, "JSONL record longer than %zu bytes at %s:%llu",
                               r->max_line, r->path, r->lineno + 1);
            *ret_line = r->buf + r->beg;
            *ret_len = len;
            *ret_nl = true;
            r->beg = r->scan = (size_t)(nl - r->buf) + 1;
            r->lineno++;
            if (!r->z)
                r->offset += len + 1;
            return 1;
        }
        /* No "\n" yet: a partial record over the bound fails now, before
         * more of it is read. */
        r->scan = r->end;
        if (r->end - r->beg > r->max_line)
            return err_set(err, -EFBIG, "JSONL record longer than %zu bytes at %s:%llu",
                           r->max_line, r->path, r->lineno + 1);
        if (r->eof) {
            if (r->beg == r->end)
                return 0;
            *ret_line = r->buf + r->beg;
            *ret_len = r->end - r->beg;
            *ret_nl = false;
            if (!r->z)
                r->offset += r->end - r->beg;
            r->beg = r->scan = r->end;
            r->lineno++;
            return 1;
        }
        /* Keep the partial record, make room, read more. */
        if ((rr = reader_fill(r, r->max_line, err)) < 0)
            return rr;
    }
}

/* The "\n" in p[0..n), 16 bytes at a time with SSE2 when available. */
static unsigned long long
count_nl(const char *p, size_t n)
{
    unsigned long long lines = 0;
    size_t i = 0;

#if defined(__SSE2__)
    /* each byte of acc counts the newlines in its lane, up to 255 blocks;
     * _mm_sad_epu8 then sums the lanes (no popcount instruction needed) */
    const __m128i nl = _mm_set1_epi8('\n'), zero = _mm_setzero_si128();

    while (i + 16 <= n) {
        __m128i acc = zero, sum;

        for (int k = 0; k < 255 && i + 16 <= n; k++, i += 16) {
            __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(p + i));
            acc = _mm_sub_epi8(acc, _mm_cmpeq_epi8(v, nl));
        }
        sum = _mm_sad_epu8(acc, zero);
        lines += (unsigned long long)_mm_cvtsi128_si64(sum) +
                 (unsigned long long)_mm_cvtsi128_si64(_mm_unpackhi_epi64(sum, sum));
    }
#endif
    for (; i < n; i++)
        lines += p[i] == '\n';
    return lines;
}

/* The block of the common case, without a look at each record: want
 * bytes or more are there, a record ends at or after them, and the block
 * is no longer than a record may be, so none of its records is too long.
 * 1 with the block's length and lines, 0 where the record by record loop
 * must decide (the file's end, a record longer than the block), or a
 * negative errno. */
static int
block_fast(struct jsonl_reader *r, size_t want, size_t *ret_at, unsigned long long *ret_lines,
           struct esd_err *err)
{
    int rr;

    for (;;) {
        size_t have = r->end - r->beg;

        if (have >= want) {
            const char *b = r->buf + r->beg;
            const char *nl = memchr(b + want - 1, '\n', have - (want - 1));

            if (nl) {
                size_t at = (size_t)(nl + 1 - b);

                if (at > r->max_line)
                    return 0;
                *ret_at = at;
                *ret_lines = count_nl(b, at);
                return 1;
            }
        }
        if (r->eof || have > want + r->max_line)
            return 0;
        if ((rr = reader_fill(r, want + r->max_line, err)) < 0)
            return rr;
    }
}

int
jsonl_reader_block(struct jsonl_reader *r, size_t want, const char **ret_p, size_t *ret_len,
                   unsigned long long *ret_lines, struct esd_err *err)
{
    size_t at = 0; /* the block so far: [beg, beg + at), whole records */
    unsigned long long lines = 0;
    int rr;

    if (want == 0)
        want = 1;
    if ((rr = block_fast(r, want, &at, &lines, err)) < 0)
        return rr;
    for (bool fast = rr == 1; !fast;) {
        char *nl = NULL;

        if (at >= want)
            break;
        if (r->scan < r->beg + at)
            r->scan = r->beg + at;
        if (r->scan < r->end)
            nl = memchr(r->buf + r->scan, '\n', r->end - r->scan);
        if (nl) {
            size_t len = (size_t)(nl - (r->buf + r->beg + at));

            if (len > r->max_line)
                break; /* reported by the next call, after the records before it */
            at += len + 1;
            lines++;
            r->scan = r->beg + at;
            continue;
        }
        r->scan = r->end;
        if (r->end - (r->beg + at) > r->max_line)
            break;
        if (r->eof) {
            if (r->end > r->beg + at) { /* the last record, without "\n" */
                at = r->end - r->beg;
                lines++;
            }
            break;
        }
        if ((rr = reader_fill(r, want + r->max_line, err)) < 0)
            return rr;
    }
    if (lines == 0) {
        if (r->beg == r->end && r->eof)
            return 0;
        return err_set(err, -EFBIG, "JSONL record longer than %zu bytes at %s:%llu", r->max_line,
                       r->path, r->lineno + 1);
    }
    *ret_p = r->buf + r->beg;
    *ret_len = at;
    *ret_lines = lines;
    r->beg += at;
    r->scan = r->beg > r->scan ? r->beg : r->scan;
    r->lineno += lines;
    if (!r->z) /* (a compressed file's: the raw bytes zsrc_read counted) */
        r->offset += at;
    return 1;
}

/* Appends s[0..n) to out with every invalid UTF-8 sequence as U+FFFD. */
void
jsonl_utf8_clean(const char *s, size_t n, struct buf *out)
{
    size_t i = 0, bad;

    while (i < n) {
        if (jsonl_utf8_valid(s + i, n - i, &bad))
            bad = n - i;
        /* NUL bytes too: they would end the text in a C string */
        for (size_t k = 0; k < bad; k++) {
            if (s[i + k] == '\0') {
                bad = k;
                break;
            }
        }
        buf_append(out, s + i, bad);
        i += bad;
        if (i == n)
            break;
        buf_append(out, "\xef\xbf\xbd", 3);
        i++;
        /* Skip the continuation bytes of the broken sequence: one U+FFFD
         * for it, not one per byte. */
        while (i < n && ((unsigned char)s[i] & 0xC0) == 0x80)
            i++;
    }
}
