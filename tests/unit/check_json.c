/*
 * check_json: the serialiser must write what Python's json.dumps writes for
 * the reference's three styles, byte for byte; floats as repr() writes them;
 * the loader must read as strictly as json.loads and keep the numbers a
 * double would change. Every expected string below was produced by
 * CPython 3.11 (json.dumps(..., sort_keys=True, ensure_ascii=False) with
 * indent=2, the default separators, or (",", ":")).
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "json.h"
#include "testutil.h"
#include "util.h"

/* Serialises v in style into a fresh string (caller frees). */
static char *
dump_str(const cJSON *v, enum json_style style)
{
    struct buf b;

    buf_init(&b);
    json_dump(v, style, &b);
    return buf_steal(&b);
}

/* The tree used by the style tests:
 * {"b": [1, "x", {"z": None, "a": True}, [], {}], "a": {"k": False, "n": [[]]},
 *  "é": "ü", "c": 1.5, "d": -3} */
static cJSON *
sample_tree(void)
{
    cJSON *v = cJSON_CreateObject(), *b = cJSON_CreateArray(), *o = cJSON_CreateObject();
    cJSON *a = cJSON_CreateObject(), *n = cJSON_CreateArray();

    cJSON_AddItemToArray(b, cJSON_CreateNumber(1));
    cJSON_AddItemToArray(b, cJSON_CreateString("x"));
    cJSON_AddNullToObject(o, "z");
    cJSON_AddTrueToObject(o, "a");
    cJSON_AddItemToArray(b, o);
    cJSON_AddItemToArray(b, cJSON_CreateArray());
    cJSON_AddItemToArray(b, cJSON_CreateObject());
    cJSON_AddItemToObject(v, "b", b);
    cJSON_AddFalseToObject(a, "k");
    cJSON_AddItemToArray(n, cJSON_CreateArray());
    cJSON_AddItemToObject(a, "n", n);
    cJSON_AddItemToObject(v, "a", a);
    cJSON_AddStringToObject(v, "\xc3\xa9", "\xc3\xbc");
    cJSON_AddNumberToObject(v, "c", 1.5);
    cJSON_AddNumberToObject(v, "d", -3);
    return v;
}

START_TEST(test_pretty_nested)
{
    cJSON *v = sample_tree();
    char *s = dump_str(v, JSON_PRETTY);

    ck_assert_str_eq(s, "{\n"
                        "  \"a\": {\n"
                        "    \"k\": false,\n"
                        "    \"n\": [\n"
                        "      []\n"
                        "    ]\n"
                        "  },\n"
                        "  \"b\": [\n"
                        "    1,\n"
                        "    \"x\",\n"
                        "    {\n"
                        "      \"a\": true,\n"
                        "      \"z\": null\n"
                        "    },\n"
                        "    [],\n"
                        "    {}\n"
                        "  ],\n"
                        "  \"c\": 1.5,\n"
                        "  \"d\": -3,\n"
                        "  \"\xc3\xa9\": \"\xc3\xbc\"\n"
                        "}\n");
    free(s);
    cJSON_Delete(v);
}
END_TEST

START_TEST(test_line_style)
{
    cJSON *v = sample_tree();
    char *s = dump_str(v, JSON_LINE);

    ck_assert_str_eq(s, "{\"a\": {\"k\": false, \"n\": [[]]}, \"b\": [1, \"x\", {\"a\": true, "
                        "\"z\": null}, [], {}], \"c\": 1.5, \"d\": -3, "
                        "\"\xc3\xa9\": \"\xc3\xbc\"}\n");
    free(s);
    cJSON_Delete(v);
}
END_TEST

START_TEST(test_compact_style)
{
    cJSON *v = sample_tree();
    char *s = dump_str(v, JSON_COMPACT);

    ck_assert_str_eq(s, "{\"a\":{\"k\":false,\"n\":[[]]},\"b\":[1,\"x\",{\"a\":true,\"z\":null},"
                        "[],{}],\"c\":1.5,\"d\":-3,\"\xc3\xa9\":\"\xc3\xbc\"}");
    free(s);
    cJSON_Delete(v);
}
END_TEST

START_TEST(test_empty_and_scalars)
{
    cJSON *o = cJSON_CreateObject(), *a = cJSON_CreateArray(), *n = cJSON_CreateNull();
    cJSON *str = cJSON_CreateString("s");
    char *s;

    s = dump_str(o, JSON_PRETTY);
    ck_assert_str_eq(s, "{}\n");
    free(s);
    s = dump_str(a, JSON_PRETTY);
    ck_assert_str_eq(s, "[]\n");
    free(s);
    s = dump_str(a, JSON_COMPACT);
    ck_assert_str_eq(s, "[]");
    free(s);
    s = dump_str(n, JSON_LINE);
    ck_assert_str_eq(s, "null\n");
    free(s);
    s = dump_str(str, JSON_COMPACT);
    ck_assert_str_eq(s, "\"s\"");
    free(s);
    cJSON_Delete(o);
    cJSON_Delete(a);
    cJSON_Delete(n);
    cJSON_Delete(str);
}
END_TEST

START_TEST(test_dump_appends)
{
    cJSON *a = cJSON_CreateArray();
    struct buf b;

    buf_init(&b);
    buf_puts(&b, "x=");
    json_dump(a, JSON_COMPACT, &b);
    json_dump(a, JSON_LINE, &b);
    ck_assert_str_eq(b.p, "x=[][]\n");
    ck_assert_uint_eq(b.len, 7);
    buf_free(&b);
    cJSON_Delete(a);
}
END_TEST

START_TEST(test_escapes)
{
    /* json.dumps("q\"b\\n\nr\rt\tb\bf\f\x01\x1f/\x7f é 😀 \u2028 \x00", ensure_ascii=False) */
    static const char in[] = "q\"b\\n\nr\rt\tb\bf\f\x01\x1f/\x7f \xc3\xa9 \xf0\x9f\x98\x80 "
                             "\xe2\x80\xa8 \0";
    static const char want[] = "\"q\\\"b\\\\n\\nr\\rt\\tb\\bf\\f\\u0001\\u001f/\x7f \xc3\xa9 "
                               "\xf0\x9f\x98\x80 \xe2\x80\xa8 \\u0000\"";
    struct buf b;

    buf_init(&b);
    json_escape(&b, in, sizeof(in) - 1);
    ck_assert_str_eq(b.p, want);
    ck_assert_uint_eq(b.len, sizeof(want) - 1);
    buf_free(&b);
}
END_TEST

START_TEST(test_escape_lower_hex)
{
    struct buf b;

    buf_init(&b);
    json_escape(&b, "\x0b\x1a\x1e", 3);
    ck_assert_str_eq(b.p, "\"\\u000b\\u001a\\u001e\"");
    buf_reset(&b);
    json_escape(&b, "", 0);
    ck_assert_str_eq(b.p, "\"\"");
    buf_free(&b);
}
END_TEST

START_TEST(test_keys_escaped_and_sorted)
{
    /* {"B":1,"a":2,"b":3,"z":4,"ä":5,"é":6,"\uffff":8,"😀":7}: code point order */
    cJSON *v = cJSON_CreateObject();
    char *s;

    cJSON_AddNumberToObject(v, "\xf0\x9f\x98\x80", 7);
    cJSON_AddNumberToObject(v, "\xc3\xa9", 6);
    cJSON_AddNumberToObject(v, "z", 4);
    cJSON_AddNumberToObject(v, "b", 3);
    cJSON_AddNumberToObject(v, "\xef\xbf\xbf", 8);
    cJSON_AddNumberToObject(v, "a", 2);
    cJSON_AddNumberToObject(v, "\xc3\xa4", 5);
    cJSON_AddNumberToObject(v, "B", 1);
    s = dump_str(v, JSON_COMPACT);
    ck_assert_str_eq(s, "{\"B\":1,\"a\":2,\"b\":3,\"z\":4,\"\xc3\xa4\":5,\"\xc3\xa9\":6,"
                        "\"\xef\xbf\xbf\":8,\"\xf0\x9f\x98\x80\":7}");
    free(s);
    cJSON_Delete(v);

    v = cJSON_CreateObject();
    cJSON_AddStringToObject(v, "k\"\n", "v");
    s = dump_str(v, JSON_COMPACT);
    ck_assert_str_eq(s, "{\"k\\\"\\n\":\"v\"}");
    free(s);
    cJSON_Delete(v);
}
END_TEST

START_TEST(test_duplicate_key_last_wins)
{
    cJSON *v = cJSON_CreateObject();
    char *s;

    cJSON_AddNumberToObject(v, "k", 1);
    cJSON_AddNumberToObject(v, "a", 0);
    cJSON_AddNumberToObject(v, "k", 2);
    s = dump_str(v, JSON_COMPACT);
    ck_assert_str_eq(s, "{\"a\":0,\"k\":2}");
    free(s);
    cJSON_Delete(v);
}
END_TEST

START_TEST(test_repr_double)
{
    static const struct {
        double v;
        const char *want;
    } t[] = {
        { 0.1, "0.1" },
        { 1e16, "1e+16" },
        { 1e15, "1000000000000000.0" },
        { 1.5e16, "1.5e+16" },
        { 1e-5, "1e-05" },
        { 1e-4, "0.0001" },
        { -2.5e-7, "-2.5e-07" },
        { 1e22, "1e+22" },
        { 5e-324, "5e-324" },
        { 1.7976931348623157e308, "1.7976931348623157e+308" },
        { 123456789.123, "123456789.123" },
        { 100.0, "100.0" },
        { 0.0, "0.0" },
        { -0.0, "-0.0" },
        { 1.0 / 3.0, "0.3333333333333333" },
        { 1795948056.4014602, "1795948056.4014602" },
        /* 2^-44: the correctly rounded 16 digits do not read back, the
         * neighbour does (Python picks it). */
        { 5.684341886080802e-14, "5.684341886080802e-14" },
    };
    char out[32];

    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        json_repr_double(t[i].v, out);
        ck_assert_msg(strcmp(out, t[i].want) == 0, "repr(%.17g): got %s, want %s", t[i].v, out,
                      t[i].want);
    }
    json_repr_double(NAN, out);
    ck_assert_str_eq(out, "NaN");
    json_repr_double(INFINITY, out);
    ck_assert_str_eq(out, "Infinity");
    json_repr_double(-INFINITY, out);
    ck_assert_str_eq(out, "-Infinity");
}
END_TEST

START_TEST(test_numbers)
{
    static const struct {
        double v;
        const char *want;
    } t[] = {
        { 0, "0" },
        { -3, "-3" },
        { 9007199254740991.0, "9007199254740991" }, /* 2^53 - 1 */
        { -9007199254740991.0, "-9007199254740991" },
        { 9007199254740992.0, "9007199254740992.0" }, /* 2^53: a float */
        { 1e16, "1e+16" },
        { 0.5, "0.5" },
        { -0.0, "0" },
        { 1795948056.4014602, "1795948056.4014602" },
    };

    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        cJSON *n = cJSON_CreateNumber(t[i].v);
        char *s = dump_str(n, JSON_COMPACT);

        ck_assert_msg(strcmp(s, t[i].want) == 0, "%.17g: got %s, want %s", t[i].v, s, t[i].want);
        free(s);
        cJSON_Delete(n);
    }
}
END_TEST

START_TEST(test_nonfinite_numbers)
{
    cJSON *a = cJSON_CreateArray();
    char *s;

    cJSON_AddItemToArray(a, cJSON_CreateNumber(NAN));
    cJSON_AddItemToArray(a, cJSON_CreateNumber(INFINITY));
    cJSON_AddItemToArray(a, cJSON_CreateNumber(-INFINITY));
    s = dump_str(a, JSON_LINE);
    ck_assert_str_eq(s, "[NaN, Infinity, -Infinity]\n");
    free(s);
    cJSON_Delete(a);
}
END_TEST

START_TEST(test_raw_nodes)
{
    cJSON *v = cJSON_CreateObject();
    char *s;

    json_add_float(v, "f", 60.0);
    json_add_float(v, "g", 0.1);
    json_add_int(v, "mtime_ns", 1732871256401432123LL);
    json_add_int(v, "big", 9007199254740992LL);
    json_add_int(v, "min", -9223372036854775807LL - 1);
    cJSON_AddItemToObject(v, "raw", cJSON_CreateRaw("[1,2]"));
    s = dump_str(v, JSON_LINE);
    ck_assert_str_eq(s, "{\"big\": 9007199254740992, \"f\": 60.0, \"g\": 0.1, "
                        "\"min\": -9223372036854775808, \"mtime_ns\": 1732871256401432123, "
                        "\"raw\": [1,2]}\n");
    free(s);
    cJSON_Delete(v);
}
END_TEST

START_TEST(test_claim_line)
{
    /* The shape of a claim file (spec 5.3): one line, sorted, ", " / ": ". */
    cJSON *v = cJSON_CreateObject();
    char *s;

    json_add_str(v, "token", "0123456789abcdef0123456789abcdef");
    json_add_str(v, "hostname",
                 "n\xc3\xb6"
                 "de-1");
    json_add_int(v, "pid", 4242);
    json_add_float(v, "claimed_at_epoch", 1795948056.4014602);
    json_add_bool(v, "fresh", true);
    json_add_str(v, "none", NULL);
    s = dump_str(v, JSON_LINE);
    ck_assert_str_eq(s, "{\"claimed_at_epoch\": 1795948056.4014602, \"fresh\": true, "
                        "\"hostname\": \"n\xc3\xb6"
                        "de-1\", \"none\": null, \"pid\": 4242, "
                        "\"token\": \"0123456789abcdef0123456789abcdef\"}\n");
    free(s);
    cJSON_Delete(v);
}
END_TEST

START_TEST(test_set)
{
    cJSON *v = cJSON_CreateObject();
    char *s;

    json_set(v, "a", cJSON_CreateNumber(1));
    json_set(v, "b", cJSON_CreateString("x"));
    json_set(v, "a", cJSON_CreateString("replaced"));
    cJSON_AddNumberToObject(v, "b", 7); /* a duplicate */
    json_set(v, "b", json_int(9));
    s = dump_str(v, JSON_COMPACT);
    ck_assert_str_eq(s, "{\"a\":\"replaced\",\"b\":9}");
    free(s);
    ck_assert_int_eq(cJSON_GetArraySize(v), 2);
    cJSON_Delete(v);
}
END_TEST

START_TEST(test_getters)
{
    cJSON *v = cJSON_CreateObject();
    long long i = 77;
    double d = 7.5;
    bool bo = false;

    cJSON_AddNumberToObject(v, "n", 42);
    cJSON_AddNumberToObject(v, "neg", -5);
    cJSON_AddNumberToObject(v, "half", 2.5);
    cJSON_AddNumberToObject(v, "huge", 1e300);
    cJSON_AddStringToObject(v, "s", "text");
    cJSON_AddTrueToObject(v, "t");
    cJSON_AddNullToObject(v, "null");
    json_add_int(v, "ri", 1732871256401432123LL);
    json_add_float(v, "rf", 60.0);
    json_add_float(v, "rnan", NAN);
    cJSON_AddItemToObject(v, "rbad", cJSON_CreateRaw(" 12"));

    ck_assert_str_eq(json_get_str(v, "s"), "text");
    ck_assert_ptr_null(json_get_str(v, "n"));
    ck_assert_ptr_null(json_get_str(v, "missing"));
    ck_assert_ptr_null(json_get_str(NULL, "s"));

    ck_assert_int_eq(json_get_int(v, "n", &i), 0);
    ck_assert_int_eq(i, 42);
    ck_assert_int_eq(json_get_int(v, "neg", &i), 0);
    ck_assert_int_eq(i, -5);
    ck_assert_int_eq(json_get_int(v, "ri", &i), 0);
    ck_assert(i == 1732871256401432123LL);
    i = 77;
    ck_assert_int_eq(json_get_int(v, "half", &i), -EINVAL);
    ck_assert_int_eq(json_get_int(v, "huge", &i), -EINVAL);
    ck_assert_int_eq(json_get_int(v, "rf", &i), -EINVAL);
    ck_assert_int_eq(json_get_int(v, "rbad", &i), -EINVAL);
    ck_assert_int_eq(json_get_int(v, "s", &i), -EINVAL);
    ck_assert_int_eq(json_get_int(v, "t", &i), -EINVAL);
    ck_assert_int_eq(json_get_int(v, "null", &i), -EINVAL);
    ck_assert_int_eq(json_get_int(v, "missing", &i), -EINVAL);
    ck_assert_int_eq(i, 77);

    ck_assert_int_eq(json_get_num(v, "half", &d), 0);
    ck_assert(d == 2.5);
    ck_assert_int_eq(json_get_num(v, "rf", &d), 0);
    ck_assert(d == 60.0);
    ck_assert_int_eq(json_get_num(v, "ri", &d), 0);
    ck_assert(d == 1732871256401432123.0);
    ck_assert_int_eq(json_get_num(v, "rnan", &d), 0);
    ck_assert(isnan(d));
    d = 7.5;
    ck_assert_int_eq(json_get_num(v, "s", &d), -EINVAL);
    ck_assert_int_eq(json_get_num(v, "t", &d), -EINVAL);
    ck_assert_int_eq(json_get_num(v, "rbad", &d), -EINVAL);
    ck_assert_int_eq(json_get_num(v, "missing", &d), -EINVAL);
    ck_assert(d == 7.5);

    ck_assert(json_get_bool(v, "t", &bo));
    ck_assert(bo);
    bo = false;
    ck_assert(!json_get_bool(v, "n", &bo));
    ck_assert(!json_get_bool(v, "missing", &bo));
    ck_assert(!bo);
    cJSON_Delete(v);
}
END_TEST

START_TEST(test_getter_duplicate_reads_last)
{
    cJSON *v = cJSON_CreateObject();
    long long i = 0;

    cJSON_AddNumberToObject(v, "k", 1);
    cJSON_AddNumberToObject(v, "k", 2);
    ck_assert_int_eq(json_get_int(v, "k", &i), 0);
    ck_assert_int_eq(i, 2);
    cJSON_Delete(v);
}
END_TEST

/* Loads text from a file in a fresh directory. */
static int
load_text(const char *text, size_t len, cJSON **ret, struct esd_err *err, char **ret_path)
{
    char *dir = tu_tmpdir();
    char *path = tu_write(dir, "f.json", text, len);
    int r = json_load_object(path, 1 << 20, ret, err);

    fs_rm_rf(dir);
    free(dir);
    if (ret_path)
        *ret_path = path;
    else
        free(path);
    return r;
}

START_TEST(test_load_object)
{
    struct esd_err err;
    cJSON *v = NULL;
    char *s;

    ck_assert_int_eq(load_text("{\"b\": \"\xc3\xa9\", \"a\": [1, {\"c\": null}]}\n\n", (size_t)-1,
                               &v, &err, NULL),
                     0);
    s = dump_str(v, JSON_COMPACT);
    ck_assert_str_eq(s, "{\"a\":[1,{\"c\":null}],\"b\":\"\xc3\xa9\"}");
    free(s);
    cJSON_Delete(v);
}
END_TEST

START_TEST(test_load_keeps_numbers)
{
    /* json.dumps(json.loads(IN), sort_keys=True, separators=(",", ":")) */
    static const char in[] = "{\"a\":[1, 2.0, {\"b\": 12345678901234567890}], \"c\": -0, "
                             "\"d\": 1e3, \"e\": 1.5, \"f\": 60.0, \"g\": -1E-7, "
                             "\"h\": 9007199254740993, \"i\": 1e400}";
    struct esd_err err;
    long long i = 0;
    double d = 0;
    cJSON *v = NULL;
    char *s;

    ck_assert_int_eq(load_text(in, (size_t)-1, &v, &err, NULL), 0);
    s = dump_str(v, JSON_COMPACT);
    ck_assert_str_eq(s, "{\"a\":[1,2.0,{\"b\":12345678901234567890}],\"c\":0,\"d\":1000.0,"
                        "\"e\":1.5,\"f\":60.0,\"g\":-1e-07,\"h\":9007199254740993,"
                        "\"i\":Infinity}");
    free(s);
    ck_assert_int_eq(json_get_int(v, "h", &i), 0);
    ck_assert(i == 9007199254740993LL);
    /* 60.0 is a float to Python: not an int, but a number. */
    ck_assert_int_eq(json_get_int(v, "f", &i), -EINVAL);
    ck_assert_int_eq(json_get_num(v, "f", &d), 0);
    ck_assert(d == 60.0);
    ck_assert_int_eq(json_get_num(v, "e", &d), 0);
    ck_assert(d == 1.5);
    ck_assert_int_eq(json_get_int(v, "c", &i), 0);
    ck_assert_int_eq(i, 0);
    cJSON_Delete(v);
}
END_TEST

START_TEST(test_load_errors)
{
#define T(s)             \
    {                    \
        s, sizeof(s) - 1 \
    }
    static const struct {
        const char *text;
        size_t len;
    } bad[] = {
        T(""),
        T("{"),
        T("{} x"),
        T("{}{}"),
        T("\xef\xbb\xbf{}"),            /* BOM */
        T("{\"a\": \"\xff\"}"),         /* invalid UTF-8 */
        T("{\"a\": \"\xed\xa0\x80\"}"), /* encoded surrogate */
        T("{\"a\": \"\xc0\xaf\"}"),     /* overlong */
        T("{\"a\": \"x\ty\"}"),         /* raw control character */
        T("{\"a\": \"x\0y\"}"),         /* raw NUL */
        T("{\"a\":\f1}"),               /* \f is not JSON whitespace */
        T("{\"a\": 01}"),
        T("{\"a\": 1.}"),
        T("{\"a\": .5}"),
        T("{\"a\": -}"),
        T("{\"a\": 1e}"),
        T("{\"a\": NaN}"),
        T("{\"a\": 'x'}"),
        T("{\"a\": 1,}"),
    };

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct esd_err err;
        cJSON *v = (cJSON *)&err; /* must stay untouched */
        char *path, *prefix;
        int r;

        err_clear(&err);
        r = load_text(bad[i].text, bad[i].len, &v, &err, &path);
        ck_assert_msg(r == -EINVAL, "case %zu: r=%d", i, r);
        ck_assert_ptr_eq(v, (cJSON *)&err);
        prefix = xasprintf("Unable to read JSON file %s: ", path);
        ck_assert_msg(strncmp(err.msg, prefix, strlen(prefix)) == 0, "case %zu: %s", i, err.msg);
        ck_assert_int_eq(err.code, -EINVAL);
        free(prefix);
        free(path);
    }
#undef T
}
END_TEST

START_TEST(test_load_error_position)
{
    struct esd_err err;
    cJSON *v = NULL;
    char *path, *want;

    ck_assert_int_eq(load_text("{\n  \"a\": 01\n}\n", (size_t)-1, &v, &err, &path), -EINVAL);
    want = xasprintf("Unable to read JSON file %s: invalid number: line 2 column 8 (byte 9)", path);
    ck_assert_str_eq(err.msg, want);
    free(want);
    free(path);
}
END_TEST

START_TEST(test_load_not_object)
{
    static const char *const texts[] = { "[]", "[1, 2]", "\"s\"", "3", "null", "true" };

    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        struct esd_err err;
        cJSON *v = NULL;
        char *path, *want;

        ck_assert_int_eq(load_text(texts[i], (size_t)-1, &v, &err, &path), -EINVAL);
        ck_assert_ptr_null(v);
        want = xasprintf("Expected a JSON object in %s", path);
        ck_assert_str_eq(err.msg, want);
        free(want);
        free(path);
    }
}
END_TEST

START_TEST(test_load_missing_and_too_large)
{
    char *dir = tu_tmpdir();
    char *missing = fs_join(dir, "nope.json");
    char *big = tu_write(dir, "big.json", "{\"a\": \"0123456789\"}", (size_t)-1);
    struct esd_err err;
    cJSON *v = NULL;
    char *want;

    ck_assert_int_eq(json_load_object(missing, 1024, &v, &err), -ENOENT);
    want = xasprintf("Unable to read JSON file %s: No such file or directory", missing);
    ck_assert_str_eq(err.msg, want);
    free(want);

    ck_assert_int_eq(json_load_object(big, 10, &v, &err), -EFBIG);
    want = xasprintf("Unable to read JSON file %s: larger than 10 bytes", big);
    ck_assert_str_eq(err.msg, want);
    free(want);

    ck_assert_int_eq(json_load_object(dir, 1024, &v, &err), -EINVAL);
    want = xasprintf("Unable to read JSON file %s: not a regular file", dir);
    ck_assert_str_eq(err.msg, want);
    free(want);
    ck_assert_ptr_null(v);

    ck_assert_int_eq(json_load_object(big, 19, &v, &err), 0);
    ck_assert_str_eq(json_get_str(v, "a"), "0123456789");
    cJSON_Delete(v);

    fs_rm_rf(dir);
    free(missing);
    free(big);
    free(dir);
}
END_TEST

START_TEST(test_round_trip_pretty)
{
    /* A file written by Python reads back and writes out identically. */
    static const char text[] = "{\n"
                               "  \"created_at\": \"2026-11-29T10:27:36.401432+00:00\",\n"
                               "  \"epoch\": 1795948056.4014602,\n"
                               "  \"files\": [\n"
                               "    {\n"
                               "      \"mtime_ns\": 1795948056401460200,\n"
                               "      \"path\": \"/data/\xe6\x95\xb0\xe6\x8d\xae.jsonl\",\n"
                               "      \"size\": 0\n"
                               "    }\n"
                               "  ],\n"
                               "  \"lease\": 60.0,\n"
                               "  \"schema_version\": 2,\n"
                               "  \"tags\": {}\n"
                               "}\n";
    struct esd_err err;
    cJSON *v = NULL;
    char *s;

    ck_assert_int_eq(load_text(text, (size_t)-1, &v, &err, NULL), 0);
    s = dump_str(v, JSON_PRETTY);
    ck_assert_str_eq(s, text);
    free(s);
    cJSON_Delete(v);
}
END_TEST

START_TEST(test_write_atomic)
{
    char *dir = tu_tmpdir();
    char *path = tu_write(dir, "manifest.json", "old", (size_t)-1);
    cJSON *v = cJSON_CreateObject();
    struct esd_err err;
    char *got;

    cJSON_AddNumberToObject(v, "schema_version", 2);
    json_add_str(v, "job_id", "j");
    ck_assert_int_eq(json_write_atomic(path, v, JSON_PRETTY, &err), 0);
    got = tu_read(path, NULL);
    ck_assert_str_eq(got, "{\n  \"job_id\": \"j\",\n  \"schema_version\": 2\n}\n");
    free(got);
    ck_assert_int_eq(tu_count_entries(dir), 1);

    fs_rm_rf(dir);
    cJSON_Delete(v);
    free(path);
    free(dir);
}
END_TEST

START_TEST(test_publish_excl)
{
    char *dir = tu_tmpdir();
    char *path = fs_join(dir, "done.json");
    cJSON *v = cJSON_CreateObject(), *w = cJSON_CreateObject();
    struct esd_err err;
    char *got, *want;

    json_add_str(v, "status", "done");
    json_add_str(w, "status", "other");
    ck_assert_int_eq(json_publish_excl(path, v, JSON_PRETTY, &err), 0);
    ck_assert_int_eq(json_publish_excl(path, w, JSON_PRETTY, &err), -EEXIST);
    want = xasprintf("%s already exists", path);
    ck_assert_str_eq(err.msg, want);
    got = tu_read(path, NULL);
    ck_assert_str_eq(got, "{\n  \"status\": \"done\"\n}\n");
    ck_assert_int_eq(tu_count_entries(dir), 1);

    fs_rm_rf(dir);
    cJSON_Delete(v);
    cJSON_Delete(w);
    free(want);
    free(got);
    free(path);
    free(dir);
}
END_TEST

static Suite *
json_suite(void)
{
    Suite *s = suite_create("json");
    TCase *tc = tcase_create("json");

    tcase_add_test(tc, test_pretty_nested);
    tcase_add_test(tc, test_line_style);
    tcase_add_test(tc, test_compact_style);
    tcase_add_test(tc, test_empty_and_scalars);
    tcase_add_test(tc, test_dump_appends);
    tcase_add_test(tc, test_escapes);
    tcase_add_test(tc, test_escape_lower_hex);
    tcase_add_test(tc, test_keys_escaped_and_sorted);
    tcase_add_test(tc, test_duplicate_key_last_wins);
    tcase_add_test(tc, test_repr_double);
    tcase_add_test(tc, test_numbers);
    tcase_add_test(tc, test_nonfinite_numbers);
    tcase_add_test(tc, test_raw_nodes);
    tcase_add_test(tc, test_claim_line);
    tcase_add_test(tc, test_set);
    tcase_add_test(tc, test_getters);
    tcase_add_test(tc, test_getter_duplicate_reads_last);
    tcase_add_test(tc, test_load_object);
    tcase_add_test(tc, test_load_keeps_numbers);
    tcase_add_test(tc, test_load_errors);
    tcase_add_test(tc, test_load_error_position);
    tcase_add_test(tc, test_load_not_object);
    tcase_add_test(tc, test_load_missing_and_too_large);
    tcase_add_test(tc, test_round_trip_pretty);
    tcase_add_test(tc, test_write_atomic);
    tcase_add_test(tc, test_publish_excl);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    json_init();
    json_init(); /* idempotent */
    return tu_run(json_suite());
}
