/*
 * check_util: the error struct (including a message built from itself), the
 * aborting allocators, byte buffers and their growth, string lists in code
 * point order, Python-compatible ISO timestamps (expected strings from
 * CPython's datetime.isoformat()), uuid4-style tokens, Python int()
 * parsing, the human-readable size and duration formats, and escaping for
 * terminals and logs (C0, DEL, C1, malformed UTF-8; multibyte text kept).
 */
#include <check.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "testutil.h"
#include "util.h"

#ifdef __SANITIZE_ADDRESS__
/* The abort tests need malloc to fail the way libc's does (NULL), not with
 * ASan's own report. */
const char *__asan_default_options(void);
const char *
__asan_default_options(void)
{
    return "allocator_may_return_null=1";
}
#endif

START_TEST(test_err_set)
{
    struct esd_err err;

    ck_assert_int_eq(err_set(&err, -EINVAL, "bad %s at %d", "thing", 7), -EINVAL);
    ck_assert_int_eq(err.code, -EINVAL);
    ck_assert_str_eq(err.msg, "bad thing at 7");
    err_clear(&err);
    ck_assert_int_eq(err.code, 0);
    ck_assert_str_eq(err.msg, "");
    ck_assert_int_eq(err_set(NULL, -ENOENT, "ignored %d", 1), -ENOENT);
    err_clear(NULL);
}
END_TEST

START_TEST(test_err_sys)
{
    struct esd_err err;

    ck_assert_int_eq(err_sys(&err, -ENOENT, "cannot open %s", "/x"), -ENOENT);
    ck_assert_str_eq(err.msg, "cannot open /x: No such file or directory");
    ck_assert_int_eq(err.code, -ENOENT);
    ck_assert_int_eq(err_sys(&err, -ENOSPC, "cannot write"), -ENOSPC);
    ck_assert_str_eq(err.msg, "cannot write: No space left on device");
    ck_assert_int_eq(err_sys(NULL, -EIO, "x"), -EIO);
}
END_TEST

START_TEST(test_err_wraps_own_message)
{
    /* Callers add context to a message they got back: err->msg is then
     * both an argument and the destination. */
    struct esd_err err;

    err_set(&err, -EINVAL, "inner problem");
    err_set(&err, err.code, "while loading job: %s", err.msg);
    ck_assert_str_eq(err.msg, "while loading job: inner problem");
    err_sys(&err, -EIO, "%s (again)", err.msg);
    ck_assert_str_eq(err.msg, "while loading job: inner problem (again): Input/output error");
}
END_TEST

START_TEST(test_err_truncates)
{
    struct esd_err err;
    char *big = xmalloc(ESD_ERR_MAX * 2);

    memset(big, 'x', ESD_ERR_MAX * 2 - 1);
    big[ESD_ERR_MAX * 2 - 1] = '\0';
    err_set(&err, -E2BIG, "%s", big);
    ck_assert_uint_eq(strlen(err.msg), ESD_ERR_MAX - 1);
    err_sys(&err, -E2BIG, "%s", big);
    ck_assert_uint_eq(strlen(err.msg), ESD_ERR_MAX - 1);
    free(big);
}
END_TEST

START_TEST(test_alloc)
{
    char *p = xmalloc(0), *s;
    int *z = xcalloc(16, sizeof(int));

    ck_assert_ptr_nonnull(p);
    for (int i = 0; i < 16; i++)
        ck_assert_int_eq(z[i], 0);
    z = xrealloc(z, 1024 * sizeof(int));
    ck_assert_int_eq(z[15], 0);
    free(z);
    free(p);
    p = xcalloc(0, 0);
    ck_assert_ptr_nonnull(p);
    free(p);

    s = xstrdup("hello");
    ck_assert_str_eq(s, "hello");
    free(s);
    s = xstrndup("hello", 3);
    ck_assert_str_eq(s, "hel");
    free(s);
    s = xasprintf("%d-%s", 42, "x");
    ck_assert_str_eq(s, "42-x");
    free(s);
}
END_TEST

START_TEST(test_alloc_aborts)
{
    /* An impossible size ends the process instead of returning NULL. */
    volatile size_t huge = SIZE_MAX / 2;

    free(xmalloc(huge));
}
END_TEST

START_TEST(test_buf)
{
    struct buf b;
    char *s;

    buf_init(&b);
    ck_assert_ptr_null(b.p);
    buf_append(&b, NULL, 0);
    ck_assert_ptr_nonnull(b.p);
    ck_assert_str_eq(b.p, "");
    buf_puts(&b, "ab");
    buf_putc(&b, 'c');
    buf_append(&b, "d\0e", 3);
    ck_assert_uint_eq(b.len, 6);
    ck_assert(memcmp(b.p, "abcd\0e", 7) == 0);
    buf_reset(&b);
    ck_assert_uint_eq(b.len, 0);
    ck_assert_str_eq(b.p, "");
    buf_printf(&b, "%s=%d", "n", 5);
    ck_assert_str_eq(b.p, "n=5");
    s = buf_steal(&b);
    ck_assert_str_eq(s, "n=5");
    ck_assert_ptr_null(b.p);
    ck_assert_uint_eq(b.len, 0);
    free(s);

    /* Stealing an empty buffer still gives a string. */
    s = buf_steal(&b);
    ck_assert_str_eq(s, "");
    free(s);
    buf_free(&b);
    buf_free(&b);
}
END_TEST

START_TEST(test_buf_growth)
{
    struct buf b;
    size_t n = 0;

    buf_init(&b);
    for (int i = 0; i < 10000; i++) {
        buf_printf(&b, "%d,", i);
        n += (size_t)snprintf(NULL, 0, "%d,", i);
        ck_assert_uint_eq(b.len, n);
        ck_assert_uint_lt(b.len, b.cap);
        ck_assert_int_eq(b.p[b.len], '\0');
    }
    ck_assert(strncmp(b.p, "0,1,2,", 6) == 0);
    ck_assert_str_eq(b.p + b.len - 5, "9999,");
    buf_reset(&b);
    buf_printf(&b, "%0300d", 1);
    ck_assert_uint_eq(b.len, 300);
    ck_assert_uint_eq(strlen(b.p), 300);
    buf_free(&b);
}
END_TEST

START_TEST(test_buf_reserve_overflow)
{
    /* A size that wraps around must not be taken as "fits". */
    struct buf b;

    buf_init(&b);
    buf_puts(&b, "x");
    buf_reserve(&b, SIZE_MAX);
    buf_free(&b);
}
END_TEST

START_TEST(test_strv)
{
    struct strv s;

    strv_init(&s);
    ck_assert(!strv_contains(&s, "a"));
    strv_push(&s, "b");
    strv_push(&s, "\xc3\xa9");
    strv_push_owned(&s, xstrdup("a"));
    strv_push(&s, "Z");
    strv_push(&s, "\xf0\x9f\x98\x80");
    strv_push(&s, "\xef\xbf\xbf");
    for (int i = 0; i < 20; i++)
        strv_push(&s, "b");
    ck_assert_uint_eq(s.n, 26);
    ck_assert_ptr_null(s.v[s.n]);
    ck_assert(strv_contains(&s, "a"));
    ck_assert(!strv_contains(&s, "A"));
    strv_sort(&s);
    ck_assert_str_eq(s.v[0], "Z");
    ck_assert_str_eq(s.v[1], "a");
    ck_assert_str_eq(s.v[2], "b");
    ck_assert_str_eq(s.v[22], "b");
    ck_assert_str_eq(s.v[23], "\xc3\xa9");
    ck_assert_str_eq(s.v[24], "\xef\xbf\xbf");
    ck_assert_str_eq(s.v[25], "\xf0\x9f\x98\x80");
    ck_assert_ptr_null(s.v[s.n]);
    strv_free(&s);
    ck_assert_uint_eq(s.n, 0);
    strv_free(&s);
}
END_TEST

START_TEST(test_time_iso_format)
{
    static const struct {
        time_t sec;
        long nsec;
        const char *want;
    } t[] = {
        { 0, 0, "1970-01-01T00:00:00+00:00" },
        { 1795948056, 401432000, "2026-11-29T10:27:36.401432+00:00" },
        { 1795948056, 0, "2026-11-29T10:27:36+00:00" },
        { 1795948056, 999, "2026-11-29T10:27:36+00:00" }, /* below a microsecond */
        { 1, 1000, "1970-01-01T00:00:01.000001+00:00" },
        { 951782400, 999999999, "2000-02-29T00:00:00.999999+00:00" },
    };
    char out[40];

    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        struct timespec ts = { .tv_sec = t[i].sec, .tv_nsec = t[i].nsec };

        time_iso_format(&ts, out);
        ck_assert_str_eq(out, t[i].want);
    }
}
END_TEST

START_TEST(test_time_iso_now)
{
    char out[40], again[40];
    double epoch = 0;
    struct timespec ts;
    size_t n;

    time_iso_now(out, &epoch);
    n = strlen(out);
    ck_assert(n == 25 || n == 32);
    ck_assert_str_eq(out + n - 6, "+00:00");
    ck_assert_int_eq(out[10], 'T');
    ck_assert(epoch > 1.7e9);
    /* The epoch value is the same instant as the string. */
    ts.tv_sec = (time_t)epoch;
    ts.tv_nsec = (long)llround((epoch - (double)ts.tv_sec) * 1e6) * 1000;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    time_iso_format(&ts, again);
    ck_assert_str_eq(out, again);
    time_iso_now(out, NULL);
}
END_TEST

START_TEST(test_time_mono)
{
    double a = time_mono(), b = time_mono();

    ck_assert(a > 0);
    ck_assert(b >= a);
}
END_TEST

START_TEST(test_rand_hex32)
{
    char a[33], b[33];

    rand_hex32(a);
    rand_hex32(b);
    ck_assert_uint_eq(strlen(a), 32);
    ck_assert_uint_eq(strspn(a, "0123456789abcdef"), 32);
    ck_assert_int_eq(a[12], '4');
    ck_assert_ptr_nonnull(strchr("89ab", a[16]));
    ck_assert_str_ne(a, b);
}
END_TEST

START_TEST(test_parse_int)
{
    static const struct {
        const char *s;
        long long min, max;
        int r;
        long long v;
    } t[] = {
        { "42", 0, 100, 0, 42 },
        { " +7\n", 0, 100, 0, 7 },
        { "007", 0, 100, 0, 7 },
        { "1_000", 0, 10000, 0, 1000 },
        { "-5", -10, 10, 0, -5 },
        { "-5", 0, 10, -ERANGE, 0 },
        { "101", 0, 100, -ERANGE, 0 },
        { "9223372036854775807", 0, LLONG_MAX, 0, LLONG_MAX },
        { "-9223372036854775808", LLONG_MIN, 0, 0, LLONG_MIN },
        { "9223372036854775808", 0, LLONG_MAX, -ERANGE, 0 },
        { "-9223372036854775809", LLONG_MIN, 0, -ERANGE, 0 },
        { "99999999999999999999999", 0, LLONG_MAX, -ERANGE, 0 },
        { "", 0, 10, -EINVAL, 0 },
        { "  ", 0, 10, -EINVAL, 0 },
        { "+", 0, 10, -EINVAL, 0 },
        { "_1", 0, 10, -EINVAL, 0 },
        { "1_", 0, 10, -EINVAL, 0 },
        { "1__0", 0, 100, -EINVAL, 0 },
        { "0x10", 0, 100, -EINVAL, 0 },
        { "1.5", 0, 10, -EINVAL, 0 },
        { "12a", 0, 100, -EINVAL, 0 },
        { "1 2", 0, 100, -EINVAL, 0 },
        { "--1", -10, 10, -EINVAL, 0 },
    };

    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        long long v = 12345;
        int r = parse_int(t[i].s, t[i].min, t[i].max, &v);

        ck_assert_msg(r == t[i].r, "parse_int(\"%s\") = %d, want %d", t[i].s, r, t[i].r);
        ck_assert_msg(v == (r == 0 ? t[i].v : 12345), "parse_int(\"%s\") gave %lld", t[i].s, v);
    }
}
END_TEST

START_TEST(test_fmt_size)
{
    static const struct {
        uint64_t n;
        const char *want;
    } t[] = {
        { 0, "0 B" },
        { 1023, "1023 B" },
        { 1024, "1.00 KiB" },
        { 1536, "1.50 KiB" },
        { 10 << 20, "10.0 MiB" },
        { 200ULL << 30, "200 GiB" },
        { 1ULL << 50, "1.00 PiB" },
        { 1ULL << 60, "1024 PiB" },
        { UINT64_MAX, "16384 PiB" },
    };
    char out[32];

    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        fmt_size(t[i].n, out);
        ck_assert_str_eq(out, t[i].want);
    }
}
END_TEST

START_TEST(test_fmt_duration)
{
    static const struct {
        double s;
        const char *want;
    } t[] = {
        { 0, "0.0s" },      { 9.94, "9.9s" },  { 42, "42s" },      { 59.4, "59s" }, { 62, "1m02s" },
        { 3599, "59m59s" }, { 3725, "1h02m" }, { 90061, "1d01h" }, { -1, "0.0s" },  { NAN, "0.0s" },
    };
    char out[32];

    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        fmt_duration(t[i].s, out);
        ck_assert_str_eq(out, t[i].want);
    }
    /* Out of range values must not be undefined behaviour (UBSan checks). */
    fmt_duration(INFINITY, out);
    ck_assert_int_gt(strlen(out), 0);
    fmt_duration(1e300, out);
    ck_assert_int_gt(strlen(out), 0);
}
END_TEST

/* s (n bytes) escaped, as a string the test frees */
static char *
esc(const char *s, size_t n, bool lines)
{
    struct buf b;

    buf_init(&b);
    if (lines)
        str_escape_lines(s, n, &b);
    else
        str_escape(s, n, &b);
    ck_assert_uint_eq(strlen(b.p), b.len);
    return buf_steal(&b);
}

static const struct {
    const char *in;
    size_t n; /* 0: strlen */
    const char *out;
} escapes[] = {
    { "plain job-1 ok", 0, "plain job-1 ok" },
    { "", 0, "" },
    /* C0: the terminal ones, and the ones that break a line */
    { "a\x1b]0;owned\x07z", 0, "a\\x1b]0;owned\\x07z" },
    { "\x1b[2J\x1b[31mred", 0, "\\x1b[2J\\x1b[31mred" },
    { "one\ntwo\r\tthree", 0, "one\\x0atwo\\x0d\\x09three" },
    { "nul\0after", 9, "nul\\x00after" },
    { "\x01\x1f", 0, "\\x01\\x1f" },
    /* DEL */
    { "del\x7f", 0, "del\\x7f" },
    /* C1 in UTF-8: U+0080, U+0085 (NEL), U+009B (CSI), U+009F; U+00A0 is not */
    { "\xc2\x80\xc2\x85\xc2\x9b\xc2\x9f|\xc2\xa0", 0,
      "\\xc2\\x80\\xc2\\x85\\xc2\\x9b\\xc2\\x9f|\xc2\xa0" },
    /* raw C1 bytes are not UTF-8 either */
    { "\x9b"
      "31m",
      0, "\\x9b31m" },
    /* malformed UTF-8: stray continuation, overlong, surrogate, too big,
     * bad lead bytes, truncated at the end and before ASCII */
    { "\x80", 0, "\\x80" },
    { "\xc0\xaf", 0, "\\xc0\\xaf" },
    { "\xe0\x80\xaf", 0, "\\xe0\\x80\\xaf" },
    { "\xed\xa0\x80", 0, "\\xed\\xa0\\x80" },
    { "\xf4\x90\x80\x80", 0, "\\xf4\\x90\\x80\\x80" },
    { "\xf5\xff", 0, "\\xf5\\xff" },
    { "end\xe2\x82", 0, "end\\xe2\\x82" },
    { "\xe2\x82x", 0, "\\xe2\\x82x" },
    /* well-formed multibyte kept: é, €, 日本, 🙂, U+10FFFF, U+D7FF, U+E000 */
    { "caf\xc3\xa9 \xe2\x82\xac \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x99\x82", 0,
      "caf\xc3\xa9 \xe2\x82\xac \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x99\x82" },
    { "\xf4\x8f\xbf\xbf\xed\x9f\xbf\xee\x80\x80", 0, "\xf4\x8f\xbf\xbf\xed\x9f\xbf\xee\x80\x80" },
    /* backslashes are kept (so escaping is idempotent) */
    { "C:\\dir \\x1b", 0, "C:\\dir \\x1b" },
};

START_TEST(test_str_escape)
{
    const char *in = escapes[_i].in;
    size_t n = escapes[_i].n ? escapes[_i].n : strlen(in);
    char *out = esc(in, n, false), *again = esc(out, strlen(out), false);

    ck_assert_str_eq(out, escapes[_i].out);
    /* idempotent, and what it wrote is clean */
    ck_assert_str_eq(again, out);
    ck_assert(str_clean(out, strlen(out)));
    ck_assert(str_clean(in, n) == (strcmp(in, out) == 0 && memchr(in, 0, n) == NULL));
    for (const char *p = out; *p; p++)
        ck_assert_msg((unsigned char)*p >= 0x20 && *p != 0x7f, "control in %s", out);
    free(again);
    free(out);
}
END_TEST

START_TEST(test_str_escape_lines)
{
    char *out = esc("a\tb\nc\r\x1b[Kd\n", strlen("a\tb\nc\r\x1b[Kd\n"), true);
    char *dup = str_escape_dup("job\x1b[1m\n");

    ck_assert_str_eq(out, "a\tb\nc\\x0d\\x1b[Kd\n");
    ck_assert_str_eq(dup, "job\\x1b[1m\\x0a");
    /* appends, and a buffer that grows keeps what it had */
    {
        struct buf b;

        buf_init(&b);
        buf_puts(&b, "> ");
        for (int i = 0; i < 100; i++)
            str_escape("\x1b", 1, &b);
        ck_assert_uint_eq(b.len, 2 + 400);
        ck_assert(!strncmp(b.p, "> \\x1b\\x1b", 10));
        buf_free(&b);
    }
    ck_assert(!str_clean("a\tb", 3));
    ck_assert(str_clean("", 0));
    free(dup);
    free(out);
}
END_TEST

static Suite *
util_suite(void)
{
    Suite *s = suite_create("util");
    TCase *tc = tcase_create("util");

    tcase_add_test(tc, test_err_set);
    tcase_add_test(tc, test_err_sys);
    tcase_add_test(tc, test_err_wraps_own_message);
    tcase_add_test(tc, test_err_truncates);
    tcase_add_test(tc, test_alloc);
    tcase_add_test_raise_signal(tc, test_alloc_aborts, SIGABRT);
    tcase_add_test(tc, test_buf);
    tcase_add_test(tc, test_buf_growth);
    tcase_add_test_raise_signal(tc, test_buf_reserve_overflow, SIGABRT);
    tcase_add_test(tc, test_strv);
    tcase_add_test(tc, test_time_iso_format);
    tcase_add_test(tc, test_time_iso_now);
    tcase_add_test(tc, test_time_mono);
    tcase_add_test(tc, test_rand_hex32);
    tcase_add_test(tc, test_parse_int);
    tcase_add_test(tc, test_fmt_size);
    tcase_add_test(tc, test_fmt_duration);
    tcase_add_loop_test(tc, test_str_escape, 0, (int)(sizeof(escapes) / sizeof(escapes[0])));
    tcase_add_test(tc, test_str_escape_lines);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(util_suite());
}
