/*
 * check_record: byte-preserving normalisation of single records: which media
 * items are rewritten, where index keys are appended, duplicate and escaped
 * keys, and the type errors of spec §6.4.
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "jsonl.h"
#include "record.h"
#include "testutil.h"
#include "util.h"

struct rfix {
    struct strv media, index;
    struct record_ctx ctx;
    struct jsonl_record rec;
    struct buf out;
};

static void
rfix_init(struct rfix *f, const char *index_key)
{
    strv_init(&f->media);
    strv_init(&f->index);
    strv_push(&f->media, "images");
    strv_push(&f->media, "audios");
    if (index_key)
        strv_push(&f->index, index_key);
    f->ctx.media_keys = &f->media;
    f->ctx.index_keys = &f->index;
    f->ctx.media_root = "/data/set"; /* does not exist: resolved textually */
    jsonl_record_init(&f->rec, true);
    buf_init(&f->out);
}

static void
rfix_free(struct rfix *f)
{
    strv_free(&f->media);
    strv_free(&f->index);
    jsonl_record_free(&f->rec);
    buf_free(&f->out);
}

/* Normalises in; returns the result ("=" when unedited) or the error. */
static char *
norm(struct rfix *f, const char *in, uint64_t index)
{
    struct esd_err err;
    bool edited = true;
    int r;

    ck_assert_int_eq(jsonl_check(&f->rec, in, strlen(in), NULL), 0);
    r = record_normalize(&f->ctx, in, strlen(in), &f->rec, index, &f->out, &edited, "r.jsonl", 4,
                         &err);
    if (r < 0)
        return xstrdup(err.msg);
    return edited ? xstrndup(f->out.p, f->out.len) : xstrdup("=");
}

static const struct {
    const char *index_key;
    const char *in;
    const char *out;
} cases[] = {
    { NULL, "{\"text\":\"no media\"}", "=" },
    { NULL, "{\"images\":null}", "=" },
    { NULL, "{\"images\":[]}", "=" },
    { NULL,
      "{\"images\":[\"/abs.jpg\",\"http://a/b\",\"https://a\",\"s3://b\",\"gs://c\","
      "\"hdfs://d\",\"\"]}",
      "=" },
    { NULL, "{\"images\": [ \"a.jpg\" , \"/x\" ] }",
      "{\"images\": [ \"/data/set/a.jpg\" , \"/x\" ] }" },
    { NULL, "{\"images\":[\"sub/../b.jpg\",\"./c.jpg\"],\"n\":1.50}",
      "{\"images\":[\"/data/set/b.jpg\",\"/data/set/c.jpg\"],\"n\":1.50}" },
    /* the item is decoded before it is judged and re-encoded after */
    { NULL, "{\"images\":[\"d\\u00e9j\\u00e0.jpg\",\"q\\\"t.jpg\"]}",
      "{\"images\":[\"/data/set/d\xc3\xa9j\xc3\xa0.jpg\",\"/data/set/q\\\"t.jpg\"]}" },
    /* ftp:// is not a kept scheme: a relative path to Python too */
    { NULL, "{\"audios\":[\"ftp://x\"]}", "{\"audios\":[\"/data/set/ftp:/x\"]}" },
    /* escaped key names are still the media key */
    { NULL, "{\"\\u0069mages\":[\"a\"]}", "{\"\\u0069mages\":[\"/data/set/a\"]}" },
    /* duplicates: only the last occurrence counts, as in a Python dict */
    { NULL, "{\"images\":5,\"images\":[\"a\"]}", "{\"images\":5,\"images\":[\"/data/set/a\"]}" },
    /* index keys */
    { "idx", "{\"a\":1}", "{\"a\":1,\"idx\":7}" },
    { "idx", "{ \"a\" : [1] }", "{ \"a\" : [1],\"idx\":7 }" },
    { "idx", "{}", "{\"idx\":7}" },
    { "idx", "{ }", "{\"idx\":7 }" },
    { "idx", "{\"idx\":null}", "=" },
    { "idx", "{\"i\\u0064x\":0}", "=" },
    { "idx", "{\"images\":[\"a\"]}", "{\"images\":[\"/data/set/a\"],\"idx\":7}" },
    { "a\"b", "{}", "{\"a\\\"b\":7}" },
    /* errors */
    { NULL, "{\"images\":\"a.jpg\"}", "Media field 'images' must be a list or null at r.jsonl:4" },
    { NULL, "{\"audios\":{}}", "Media field 'audios' must be a list or null at r.jsonl:4" },
    { NULL, "{\"images\":[\"a\",null]}",
      "Every item in media field 'images' must be a string at r.jsonl:4" },
    { NULL, "{\"images\":[\"a\\u0000b\"]}",
      "media path in field 'images' contains a NUL character at r.jsonl:4" },
};

START_TEST(test_cases)
{
    struct rfix f;
    char *got;

    rfix_init(&f, cases[_i].index_key);
    got = norm(&f, cases[_i].in, 7);
    ck_assert_msg(strcmp(got, cases[_i].out) == 0, "case %d: %s\n  got:    %s\n  wanted: %s", _i,
                  cases[_i].in, got, cases[_i].out);
    free(got);
    rfix_free(&f);
}
END_TEST

START_TEST(test_kept)
{
    ck_assert(record_media_item_kept("", 0));
    ck_assert(record_media_item_kept("/a", 2));
    ck_assert(record_media_item_kept("hdfs://x", 8));
    ck_assert(!record_media_item_kept("http:/x", 7));
    ck_assert(!record_media_item_kept("a/b", 3));
    ck_assert(!record_media_item_kept("HTTP://x", 8));
}
END_TEST

START_TEST(test_edited_record_is_valid)
{
    /* Every edit keeps a valid record: check the output again. */
    struct rfix f;
    struct jsonl_record again;

    rfix_init(&f, "global_index");
    jsonl_record_init(&again, false);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *got = norm(&f, cases[i].in, 123456789012345ULL);
        if (got[0] == '{')
            ck_assert_msg(jsonl_check(&again, got, strlen(got), NULL) == 0, "%s", got);
        free(got);
    }
    jsonl_record_free(&again);
    rfix_free(&f);
}
END_TEST

static Suite *
record_suite(void)
{
    Suite *s = suite_create("record");
    TCase *tc = tcase_create("core");

    tcase_add_loop_test(tc, test_cases, 0, (int)(sizeof(cases) / sizeof(cases[0])));
    tcase_add_test(tc, test_kept);
    tcase_add_test(tc, test_edited_record_is_valid);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(record_suite());
}
