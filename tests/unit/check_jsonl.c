/*
 * check_jsonl: the record validator (spec §6.3 grammar, faults, offsets,
 * member spans), string decoding, and the streaming reader (line splitting,
 * line numbers, chunk boundaries, the length bound).
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fsutil.h"
#include "jsonl.h"
#include "testutil.h"

struct vcase {
    const char *in;
    size_t len; /* 0: strlen */
    enum jsonl_fault fault;
    size_t off; /* expected fault offset (0-based), ignored for OK */
};

#define V(s)                          \
    {                                 \
        s, sizeof(s) - 1, JSONL_OK, 0 \
    }
#define F(s, f, o)             \
    {                          \
        s, sizeof(s) - 1, f, o \
    }

static const struct vcase cases[] = {
    /* accepted, as Python's json accepts them */
    V("{}"),
    V("  {}  "),
    V("\t{ }\r"),
    V("{\"a\":1}"),
    V("{\"a\" : [1, 2.5, -3e10, 0, -0, 0.0, 1E+2, 1e-2]}"),
    V("{\"big\":12345678901234567890123}"),
    V("{\"f\":0.1000000000000000055511151231257827}"),
    V("{\"n\":NaN,\"i\":Infinity,\"m\":-Infinity}"),
    V("{\"t\":true,\"f\":false,\"z\":null}"),
    V("{\"s\":\"\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\uD83D\\uDE00\"}"),
    V("{\"u\":\"caf\xc3\xa9 \xe6\x95\xb0\xe6\x8d\xae \xf0\x9f\x98\x80\"}"),
    V("{\"del\":\"\x7f\"}"),
    V("{\"a\":{\"b\":{\"c\":[[],{}]}}}"),
    V("{\"dup\":1,\"dup\":2}"),
    V("{\"\":\"\"}"),
    V("{\"x\":\"0123456789abcdef0123456789abcdef0123456789\"}"),
    V("{\"nul\":\"\\u0000\"}"),
    /* faults */
    F("", JSONL_BLANK, 0),
    F("   \t\r\v\f", JSONL_BLANK, 0),
    F("[1,2]", JSONL_NOT_OBJECT, 0),
    F("  \"s\"", JSONL_NOT_OBJECT, 2),
    F("42", JSONL_NOT_OBJECT, 0),
    F("null", JSONL_NOT_OBJECT, 0),
    F("\xef\xbb\xbf{}", JSONL_BOM, 0),
    F("{\"a\":\"\xff\"}", JSONL_UTF8, 6),
    F("{\"a\":\"\xc0\xaf\"}", JSONL_UTF8, 6),
    F("{\"a\":\"\xed\xa0\x80\"}", JSONL_UTF8, 6),
    F("{\"a\":\"\xf4\x90\x80\x80\"}", JSONL_UTF8, 6),
    F("{\"a\":\"\xe6\x95\"}", JSONL_UTF8, 6),
    F("{\"a\":1} \xff", JSONL_UTF8, 8), /* UTF-8 wins over the syntax error */
    F("{\"a\":1,}", JSONL_SYNTAX, 7),
    F("{\"a\":[1,]}", JSONL_SYNTAX, 8),
    F("{'a':1}", JSONL_SYNTAX, 1),
    F("{a:1}", JSONL_SYNTAX, 1),
    F("{\"a\" 1}", JSONL_SYNTAX, 5),
    F("{\"a\":}", JSONL_SYNTAX, 5),
    F("{\"a\":\"x", JSONL_SYNTAX, 5),
    F("{\"a\":\"x\ty\"}", JSONL_SYNTAX, 7),
    F("{\"a\":\"\\x\"}", JSONL_SYNTAX, 6),
    F("{\"a\":\"\\u12\"}", JSONL_SYNTAX, 6),
    F("{\"a\":\"\\ud800\"}", JSONL_SURROGATE, 6),
    F("{\"a\":\"\\udc00\"}", JSONL_SURROGATE, 6),
    F("{\"a\":\"\\udc00\\ud800\"}", JSONL_SURROGATE, 6),
    F("{\"a\":\"\\ud800\\u0041\"}", JSONL_SURROGATE, 6),
    F("{\"a\":01}", JSONL_SYNTAX, 6),
    F("{\"a\":1.}", JSONL_SYNTAX, 6),
    F("{\"a\":.5}", JSONL_SYNTAX, 5),
    F("{\"a\":+1}", JSONL_SYNTAX, 5),
    F("{\"a\":-}", JSONL_SYNTAX, 5),
    F("{\"a\":tru}", JSONL_SYNTAX, 5),
    F("{\"a\":nan}", JSONL_SYNTAX, 5),
    F("{\"a\":-NaN}", JSONL_SYNTAX, 5),
    F("{} {}", JSONL_SYNTAX, 3),
    F("{\"a\":1}x", JSONL_SYNTAX, 7),
    F("{\"a\":1\x01}", JSONL_SYNTAX, 6),
    F("{\"a\"\x00:1}", JSONL_SYNTAX, 4),
    F("{\v}", JSONL_SYNTAX, 1),
    F("{", JSONL_SYNTAX, 1),
    F("{\"a\":[", JSONL_SYNTAX, 6),
    F("}", JSONL_SYNTAX, 0),
};

START_TEST(test_cases)
{
    struct jsonl_record rec;
    const struct vcase *c = &cases[_i];
    char *copy = xmalloc(c->len ? c->len : 1);
    int r;

    /* an exact-size heap copy, so ASan catches any read past the end */
    memcpy(copy, c->in, c->len);
    jsonl_record_init(&rec, true);
    r = jsonl_check(&rec, copy, c->len, NULL);
    ck_assert_msg(rec.fault == c->fault, "case %d '%s': fault %d, expected %d", _i, c->in,
                  rec.fault, c->fault);
    ck_assert_int_eq(r, c->fault == JSONL_OK ? 0 : -EINVAL);
    if (c->fault != JSONL_OK && c->fault != JSONL_BLANK)
        ck_assert_msg(rec.fault_off == c->off, "case %d '%s': offset %zu, expected %zu", _i, c->in,
                      rec.fault_off, c->off);
    jsonl_record_free(&rec);
    free(copy);
}
END_TEST

START_TEST(test_depth_and_length)
{
    struct jsonl_limits lim = { 64, 4 };
    struct jsonl_record rec;
    struct esd_err err;
    char deep[20000];
    size_t n = 0;

    jsonl_record_init(&rec, false);
    ck_assert_int_eq(jsonl_check(&rec, "{\"a\":[[[1]]]}", 13, &lim), 0);
    ck_assert_int_eq(jsonl_check(&rec, "{\"a\":[[[[1]]]]}", 15, &lim), -EINVAL);
    ck_assert_int_eq(rec.fault, JSONL_DEPTH);
    jsonl_error(&rec, &lim, "d.jsonl", 3, &err);
    ck_assert_str_eq(err.msg, "Invalid JSON at d.jsonl:3: nested deeper than 4 levels at byte 9");
    /* length bound */
    memset(deep, ' ', 65);
    deep[0] = '{', deep[64] = '}';
    ck_assert_int_eq(jsonl_check(&rec, deep, 65, &lim), -EINVAL);
    ck_assert_int_eq(rec.fault, JSONL_TOO_LONG);
    jsonl_error(&rec, &lim, "d.jsonl", 9, &err);
    ck_assert_str_eq(err.msg, "JSONL record longer than 64 bytes at d.jsonl:9");
    /* default depth: 10000 nested arrays are refused cleanly, not a crash */
    deep[n++] = '{', deep[n++] = '"', deep[n++] = 'a', deep[n++] = '"', deep[n++] = ':';
    while (n < sizeof(deep) - 1)
        deep[n++] = '[';
    ck_assert_int_eq(jsonl_check(&rec, deep, n, NULL), -EINVAL);
    ck_assert_int_eq(rec.fault, JSONL_DEPTH);
    jsonl_record_free(&rec);
}
END_TEST

START_TEST(test_messages)
{
    static const struct {
        const char *in;
        const char *msg;
    } m[] = {
        { "  ", "Blank JSONL record at f.jsonl:7" },
        { "[1]", "JSONL record must be an object at f.jsonl:7" },
        { "\xef\xbb\xbf{}", "Invalid JSON at f.jsonl:7: Unexpected UTF-8 BOM" },
        { "{\"a\":\"\xff\"}", "Invalid UTF-8 at f.jsonl:7: invalid UTF-8 sequence at byte 7" },
        { "{\"a\":1,}", "Invalid JSON at f.jsonl:7: expected a string key at byte 8" },
        { "{\"a\" 1}", "Invalid JSON at f.jsonl:7: expected ':' at byte 6" },
        { "{\"a\":1 2}", "Invalid JSON at f.jsonl:7: expected ',' or '}' at byte 8" },
        { "{\"a\":[1 2]}", "Invalid JSON at f.jsonl:7: expected ',' or ']' at byte 9" },
        { "{\"a\":\"\\ud800\"}", "Invalid JSON at f.jsonl:7: lone surrogate escape at byte 7" },
        { "{} x", "Invalid JSON at f.jsonl:7: extra data after the value at byte 4" },
    };
    struct jsonl_record rec;
    struct esd_err err;

    jsonl_record_init(&rec, false);
    for (size_t i = 0; i < sizeof(m) / sizeof(m[0]); i++) {
        ck_assert_int_eq(jsonl_check(&rec, m[i].in, strlen(m[i].in), NULL), -EINVAL);
        ck_assert_int_eq(jsonl_error(&rec, NULL, "f.jsonl", 7, &err), -EINVAL);
        ck_assert_str_eq(err.msg, m[i].msg);
    }
    jsonl_record_free(&rec);
}
END_TEST

START_TEST(test_members)
{
    const char *s = "{ \"a\" : 1 , \"b\":[1,{\"x\":2}],\"c\\u0064\":\"v\" , \"e\":{} }";
    struct jsonl_record rec;

    jsonl_record_init(&rec, true);
    ck_assert_int_eq(jsonl_check(&rec, s, strlen(s), NULL), 0);
    ck_assert_uint_eq(rec.nmembers, 4);
    ck_assert_uint_eq(rec.obj_open, 0);
    ck_assert_uint_eq(rec.obj_close, strlen(s) - 1);
    ck_assert_int_eq(strncmp(s + rec.members[0].key_off, "a", rec.members[0].key_len), 0);
    ck_assert_int_eq(strncmp(s + rec.members[0].val_off, "1", rec.members[0].val_len), 0);
    ck_assert_uint_eq(rec.members[0].val_len, 1);
    ck_assert_uint_eq(rec.members[1].val_len, strlen("[1,{\"x\":2}]"));
    ck_assert_int_eq(strncmp(s + rec.members[1].val_off, "[1,{\"x\":2}]", rec.members[1].val_len),
                     0);
    ck_assert(!rec.members[1].key_escaped);
    ck_assert(rec.members[2].key_escaped);
    ck_assert_uint_eq(rec.members[2].key_len, 7);
    ck_assert_uint_eq(rec.members[3].val_len, 2);
    /* the same record twice: the member list is reset */
    ck_assert_int_eq(jsonl_check(&rec, s, strlen(s), NULL), 0);
    ck_assert_uint_eq(rec.nmembers, 4);
    /* members of a top-level array are not collected */
    ck_assert_int_eq(jsonl_check(&rec, "[{\"a\":1}]", 9, NULL), -EINVAL);
    ck_assert_uint_eq(rec.nmembers, 0);
    jsonl_record_free(&rec);
}
END_TEST

START_TEST(test_unescape)
{
    struct buf b;
    const char *s = "a\\\"b\\\\c\\/d\\n\\u00e9\\ud83d\\ude00\\u0041";

    buf_init(&b);
    jsonl_unescape(s, strlen(s), &b);
    ck_assert_str_eq(b.p, "a\"b\\c/d\n\xc3\xa9\xf0\x9f\x98\x80"
                          "A");
    buf_free(&b);
}
END_TEST

START_TEST(test_utf8)
{
    size_t bad = 99;

    ck_assert(jsonl_utf8_valid("abc\xc3\xa9\xe6\x95\xb0\xf0\x9f\x98\x80", 12, &bad));
    ck_assert(!jsonl_utf8_valid("ab\x80", 3, &bad));
    ck_assert_uint_eq(bad, 2);
    ck_assert(!jsonl_utf8_valid("a\xe0\x80\x80", 4, &bad)); /* overlong */
    ck_assert_uint_eq(bad, 1);
    ck_assert(!jsonl_utf8_valid("\xf5\x80\x80\x80", 4, &bad));
}
END_TEST

/* Reads every line of path into a NUL-separated summary "len:nl|…". */
static char *
read_all(const char *path, size_t max_line, int *ret_r, struct esd_err *err)
{
    struct jsonl_reader rd;
    struct buf out;
    const char *line;
    size_t len;
    bool nl;
    int r;

    buf_init(&out);
    ck_assert_int_eq(jsonl_reader_open(&rd, path, max_line, err), 0);
    while ((r = jsonl_reader_next(&rd, &line, &len, &nl, err)) == 1)
        buf_printf(&out, "%llu:%zu:%d|", rd.lineno, len, nl);
    *ret_r = r;
    jsonl_reader_close(&rd);
    return buf_steal(&out);
}

START_TEST(test_reader_small)
{
    char *dir = tu_tmpdir(), *p, *s;
    struct esd_err err;
    int r;

    p = tu_write(dir, "a.jsonl", "{}\r\n\n{\"a\":1}", (size_t)-1);
    s = read_all(p, 0, &r, &err);
    ck_assert_int_eq(r, 0);
    ck_assert_str_eq(s, "1:3:1|2:0:1|3:7:0|");
    free(s);
    free(p);
    p = tu_write(dir, "empty.jsonl", "", 0);
    s = read_all(p, 0, &r, &err);
    ck_assert_str_eq(s, "");
    free(s);
    free(p);
    /* the length bound applies to a line without its newline */
    p = tu_write(dir, "b.jsonl", "{\"a\":1}\n{\"a\":12}\n", (size_t)-1);
    s = read_all(p, 7, &r, &err);
    ck_assert_int_eq(r, -EFBIG);
    ck_assert_str_eq(s, "1:7:1|");
    ck_assert_ptr_nonnull(strstr(err.msg, "JSONL record longer than 7 bytes at "));
    ck_assert_ptr_nonnull(strstr(err.msg, "b.jsonl:2"));
    free(s);
    free(p);
    p = fs_join(dir, "missing.jsonl");
    ck_assert_int_lt(jsonl_reader_open(&(struct jsonl_reader){ 0 }, p, 0, &err), 0);
    ck_assert_ptr_nonnull(strstr(err.msg, "missing.jsonl"));
    free(p);
    fs_rm_rf(dir);
    free(dir);
}
END_TEST

/* Reads path in blocks of want bytes: "lines:len|…" and the bytes, which
 * must be the file's. */
static char *
read_blocks(const char *path, size_t want, size_t max_line, struct buf *bytes, int *ret_r,
            struct esd_err *err)
{
    struct jsonl_reader rd;
    unsigned long long lines;
    struct buf out;
    const char *p;
    size_t len;
    int r;

    buf_init(&out);
    ck_assert_int_eq(jsonl_reader_open(&rd, path, max_line, err), 0);
    while ((r = jsonl_reader_block(&rd, want, &p, &len, &lines, err)) == 1) {
        buf_printf(&out, "%llu:%zu|", lines, len);
        buf_append(bytes, p, len);
    }
    *ret_r = r;
    jsonl_reader_close(&rd);
    return buf_steal(&out);
}

START_TEST(test_reader_block)
{
    char *dir = tu_tmpdir(), *p, *s, *s2;
    struct esd_err err;
    struct buf b, big;
    int r;

    buf_init(&b);
    /* a block ends at the first record end at or after want bytes */
    p = tu_write(dir, "a.jsonl", "{}\n{\"a\":1}\n{}\n\n{\"b\":2}", (size_t)-1);
    s = read_blocks(p, 4, 0, &b, &r, &err);
    ck_assert_int_eq(r, 0);
    ck_assert_str_eq(s, "2:11|2:4|1:7|");
    ck_assert_str_eq(b.p, "{}\n{\"a\":1}\n{}\n\n{\"b\":2}");
    free(s);
    buf_reset(&b);
    s = read_blocks(p, 1, 0, &b, &r, &err);
    ck_assert_str_eq(s, "1:3|1:8|1:3|1:1|1:7|");
    free(s);
    free(p);
    buf_reset(&b);
    p = tu_write(dir, "empty.jsonl", "", 0);
    s = read_blocks(p, 4, 0, &b, &r, &err);
    ck_assert_int_eq(r, 0);
    ck_assert_str_eq(s, "");
    free(s);
    free(p);
    /* a record over the bound: the records before it first, then the error */
    p = tu_write(dir, "b.jsonl", "{\"a\":1}\n{}\n{\"a\":12}\n{}\n", (size_t)-1);
    s = read_blocks(p, 100, 7, &b, &r, &err);
    ck_assert_int_eq(r, -EFBIG);
    ck_assert_str_eq(s, "2:11|");
    ck_assert_ptr_nonnull(strstr(err.msg, "JSONL record longer than 7 bytes at "));
    ck_assert_ptr_nonnull(strstr(err.msg, "b.jsonl:3"));
    free(s);
    free(p);
    /* ... also unterminated at the end of the file */
    p = tu_write(dir, "c.jsonl", "{}\n{\"a\":123}", (size_t)-1);
    s = read_blocks(p, 100, 7, &b, &r, &err);
    ck_assert_int_eq(r, -EFBIG);
    ck_assert_str_eq(s, "1:3|");
    ck_assert_ptr_nonnull(strstr(err.msg, "c.jsonl:2"));
    free(s);
    free(p);
    /* 9 MiB across several reads: the blocks are the file, their bounds
     * the records' */
    buf_init(&big);
    for (int i = 0; big.len < (9u << 20); i++)
        buf_printf(&big, "{\"i\":%d,\"pad\":\"%0*d\"}\n", i, i % 997, 0);
    p = tu_write(dir, "big.jsonl", big.p, big.len);
    buf_reset(&b);
    s = read_blocks(p, 1 << 20, 0, &b, &r, &err);
    ck_assert_int_eq(r, 0);
    ck_assert_uint_eq(b.len, big.len);
    ck_assert(memcmp(b.p, big.p, big.len) == 0);
    for (char *q = s; *q; q = strchr(q, '|') + 1) {
        size_t len = strtoull(strchr(q, ':') + 1, NULL, 10);

        /* at least want bytes, except the last; never more than want + a record */
        ck_assert(len >= (1u << 20) || strchr(q, '|')[1] == '\0');
        ck_assert_uint_lt(len, (1u << 20) + 1100);
    }
    /* the same blocks from the record by record loop, which a bound
     * shorter than a block makes read them */
    buf_reset(&b);
    s2 = read_blocks(p, 1 << 20, 2000, &b, &r, &err);
    ck_assert_int_eq(r, 0);
    ck_assert_str_eq(s2, s);
    ck_assert_uint_eq(b.len, big.len);
    free(s2);
    free(s);
    free(p);
    buf_free(&big);
    buf_free(&b);
    fs_rm_rf(dir);
    free(dir);
}
END_TEST

struct count {
    size_t bytes;
};

static void
count_data(void *ctx, const char *p, size_t n)
{
    ((struct count *)ctx)->bytes += n;
}

START_TEST(test_reader_large)
{
    /* Lines of growing size across many 4 MiB chunks, including one line of
     * 9 MiB, so records span chunk boundaries and the buffer grows. */
    char *dir = tu_tmpdir(), *path = fs_join(dir, "big.jsonl");
    struct buf data;
    struct jsonl_reader rd;
    struct jsonl_record rec;
    struct count cnt = { 0 };
    struct esd_err err;
    const char *line;
    size_t len, total_lines = 0, expect_len;
    bool nl;
    int r;

    buf_init(&data);
    for (size_t i = 0; i < 3000; i++) {
        size_t k = (i * 7919) % 5000;
        buf_puts(&data, "{\"t\":\"");
        for (size_t j = 0; j < k; j++)
            buf_putc(&data, (char)('a' + j % 26));
        buf_puts(&data, "\"}\n");
        if (i == 1500) {
            buf_puts(&data, "{\"huge\":\"");
            for (size_t j = 0; j < (9u << 20); j++)
                buf_putc(&data, 'x');
            buf_puts(&data, "\"}\n");
        }
    }
    free(tu_write(dir, "big.jsonl", data.p, data.len));
    jsonl_record_init(&rec, false);
    ck_assert_int_eq(jsonl_reader_open(&rd, path, 0, &err), 0);
    rd.on_data = count_data;
    rd.on_data_ctx = &cnt;
    while ((r = jsonl_reader_next(&rd, &line, &len, &nl, &err)) == 1) {
        size_t i = total_lines < 1501 ? total_lines : total_lines - 1;
        ck_assert_int_eq(jsonl_check(&rec, line, len, NULL), 0);
        expect_len = total_lines == 1501 ? 11 + (9u << 20) : 8 + (i * 7919) % 5000;
        ck_assert_uint_eq(len, expect_len);
        total_lines++;
    }
    ck_assert_int_eq(r, 0);
    ck_assert_uint_eq(total_lines, 3001);
    ck_assert_uint_eq(rd.offset, data.len);
    ck_assert_uint_eq(cnt.bytes, data.len);
    jsonl_reader_close(&rd);
    jsonl_record_free(&rec);
    buf_free(&data);
    fs_rm_rf(dir);
    free(dir);
    free(path);
}
END_TEST

/* Checks p[0..n) from an exact-size heap copy (ASan sees any read past
 * its end): the fault (JSONL_OK: valid) and, for a fault, its offset. */
static void
check_at(const char *p, size_t n, bool want_members, enum jsonl_fault fault, size_t off)
{
    struct jsonl_record rec;
    char *copy = xmalloc(n ? n : 1);

    memcpy(copy, p, n);
    jsonl_record_init(&rec, want_members);
    jsonl_check(&rec, copy, n, NULL);
    ck_assert_msg(rec.fault == fault && (fault == JSONL_OK || rec.fault_off == off),
                  "'%.*s' (%zu bytes): fault %d at %zu, expected %d at %zu", (int)n, p, n,
                  rec.fault, rec.fault_off, fault, off);
    jsonl_record_free(&rec);
    free(copy);
}

/*
 * The scanner looks at strings and digits 16 bytes at a time, the first
 * bytes of a string one by one, and a run's last bytes as the buffer's
 * last 16: every length of string, key and number around those bounds,
 * with what ends or breaks them at every place, and the record ending
 * right after them.
 */
START_TEST(test_block_edges)
{
    struct jsonl_record rec;
    struct buf b;

    buf_init(&b);
    jsonl_record_init(&rec, true);
    for (size_t len = 0; len <= 70; len++) {
        /* {"k":"aaa…"}: valid, the record ending 2 bytes after the string */
        buf_reset(&b);
        buf_puts(&b, "{\"k\":\"");
        for (size_t j = 0; j < len; j++)
            buf_putc(&b, (char)('a' + j % 26));
        buf_puts(&b, "\"}");
        check_at(b.p, b.len, true, JSONL_OK, 0);
        /* the string unterminated, the buffer ending inside it */
        check_at(b.p, b.len - 2, true, JSONL_SYNTAX, 5);
        /* ... and without its closing brace */
        check_at(b.p, b.len - 1, true, JSONL_SYNTAX, b.len - 1);
        /* as a key, of every length: its span */
        buf_reset(&b);
        buf_puts(&b, "{\"");
        for (size_t j = 0; j < len; j++)
            buf_putc(&b, 'k');
        buf_puts(&b, "\":1}");
        ck_assert_int_eq(jsonl_check(&rec, b.p, b.len, NULL), 0);
        ck_assert_uint_eq(rec.nmembers, 1);
        ck_assert_uint_eq(rec.members[0].key_off, 2);
        ck_assert_uint_eq(rec.members[0].key_len, len);
        ck_assert_uint_eq(rec.members[0].val_off, len + 4);
        ck_assert_uint_eq(rec.members[0].val_len, 1);
        /* a number of every length, and the buffer ending in its digits */
        buf_reset(&b);
        buf_puts(&b, "{\"n\":1");
        for (size_t j = 0; j < len; j++)
            buf_putc(&b, (char)('0' + j % 10));
        check_at(b.p, b.len, true, JSONL_SYNTAX, b.len);
        buf_puts(&b, ".5");
        for (size_t j = 0; j < len; j++)
            buf_putc(&b, (char)('9' - j % 10));
        check_at(b.p, b.len, true, JSONL_SYNTAX, b.len);
        buf_puts(&b, "e-");
        for (size_t j = 0; j <= len; j++)
            buf_putc(&b, '7');
        check_at(b.p, b.len, true, JSONL_SYNTAX, b.len);
        buf_putc(&b, '}');
        ck_assert_int_eq(jsonl_check(&rec, b.p, b.len, NULL), 0);
        ck_assert_uint_eq(rec.members[0].val_len, b.len - 6);
        /* the exponent's last digit a letter: the number ends before it,
         * or before the 'e' when that left it no digit */
        b.p[b.len - 2] = 'x';
        check_at(b.p, b.len, true, JSONL_SYNTAX, len ? b.len - 2 : b.len - 4);
    }
    /* in a string of 70 bytes, at every place: each byte that stops a run
     * of plain bytes, as a fault or as valid text, at its offset */
    for (size_t at = 0; at < 70; at++) {
        static const struct {
            const char *put;
            enum jsonl_fault fault;
        } edits[] = {
            { "\x01", JSONL_SYNTAX },
            { "\x1f", JSONL_SYNTAX },
            { "\t", JSONL_SYNTAX },
            { "\xff", JSONL_UTF8 },
            { "\x80", JSONL_UTF8 },
            { "\xc3", JSONL_UTF8 },
            { "\\x", JSONL_SYNTAX },
            { "\\u12g4", JSONL_SYNTAX },
            { "\\ud800", JSONL_SURROGATE },
            { "\xc3\xa9", JSONL_OK },
            { "\xe6\x95\xb0", JSONL_OK },
            { "\xf0\x9f\x98\x80", JSONL_OK },
            { "\\n", JSONL_OK },
            { "\\\\", JSONL_OK },
            { "\\\"", JSONL_OK },
            { "\\u00e9", JSONL_OK },
            { "\\ud83d\\ude00", JSONL_OK },
            { "\x7f", JSONL_OK },
        };

        for (size_t e = 0; e < sizeof(edits) / sizeof(edits[0]); e++) {
            size_t k = strlen(edits[e].put);

            /* the edit at offset at of the string, the rest after it */
            buf_reset(&b);
            buf_puts(&b, "{\"t\":\"");
            for (size_t j = 0; j < at; j++)
                buf_putc(&b, 'x');
            buf_puts(&b, edits[e].put);
            for (size_t j = at + k; j < 70; j++)
                buf_putc(&b, 'x');
            buf_puts(&b, "\",\"n\":0}");
            check_at(b.p, b.len, true, edits[e].fault, 6 + at);
            /* the record ending right after the edit, inside the string */
            if (edits[e].fault == JSONL_OK)
                check_at(b.p, 6 + at + k, false, JSONL_SYNTAX, 5);
        }
    }
    jsonl_record_free(&rec);
    buf_free(&b);
}
END_TEST

static Suite *
jsonl_suite(void)
{
    Suite *s = suite_create("jsonl");
    TCase *tc = tcase_create("core");

    tcase_add_loop_test(tc, test_cases, 0, (int)(sizeof(cases) / sizeof(cases[0])));
    tcase_add_test(tc, test_depth_and_length);
    tcase_add_test(tc, test_block_edges);
    tcase_add_test(tc, test_messages);
    tcase_add_test(tc, test_members);
    tcase_add_test(tc, test_unescape);
    tcase_add_test(tc, test_utf8);
    tcase_add_test(tc, test_reader_small);
    tcase_add_test(tc, test_reader_block);
    tcase_add_test(tc, test_reader_large);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(jsonl_suite());
}
