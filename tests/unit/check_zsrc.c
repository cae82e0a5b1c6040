/*
 * check_zsrc: compressed inputs under the JSONL reader. The same text read
 * plain, as one or several gzip members, as one or several zstd frames
 * (with skippable frames between) gives the same lines, line numbers and
 * raw bytes; a truncated, corrupt, mislabelled or trailing-garbage stream
 * is an error naming the file, the compressed offset and the line reached;
 * an empty file is an empty text. The streams are made here with zlib and
 * libzstd, so that each fault sits at a known offset.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define ZLIB_CONST
#include <zlib.h>
#include <zstd.h>

#include "fsutil.h"
#include "jsonl.h"
#include "testutil.h"
#include "zsrc.h"

/* A text of n records, each line different, over several MiB when n is
 * large (the ring and the reader's buffer both wrap). */
static void
make_text(struct buf *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        buf_printf(b, "{\"id\":%zu,\"text\":\"record %zu %.*s\"}\n", i, i * 7919 % 100003,
                   (int)(i % 61), "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz0123456789");
}

/* Appends p[0..n) as one gzip member. */
static void
gz_member(struct buf *out, const char *p, size_t n)
{
    z_stream s;
    size_t cap = n + n / 100 + 1024; /* deflate's worst case, with room */
    char *o = malloc(cap);

    memset(&s, 0, sizeof(s));
    ck_assert_int_eq(deflateInit2(&s, 1, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
    s.next_in = (const unsigned char *)p;
    s.avail_in = (unsigned)n;
    s.next_out = (unsigned char *)o;
    s.avail_out = (unsigned)cap;
    ck_assert_int_eq(deflate(&s, Z_FINISH), Z_STREAM_END);
    buf_append(out, o, s.total_out);
    deflateEnd(&s);
    free(o);
}

/* Appends p[0..n) as one zstd frame (with its checksum). */
static void
zst_frame(struct buf *out, const char *p, size_t n)
{
    ZSTD_CCtx *c = ZSTD_createCCtx();
    size_t cap = ZSTD_compressBound(n), k;
    char *o = malloc(cap);

    ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1);
    k = ZSTD_compress2(c, o, cap, p, n);
    ck_assert(!ZSTD_isError(k));
    buf_append(out, o, k);
    ZSTD_freeCCtx(c);
    free(o);
}

/* Appends a skippable frame of len payload bytes. */
static void
zst_skippable(struct buf *out, unsigned variant, size_t len)
{
    unsigned char h[8] = { (unsigned char)(0x50 + variant), 0x2a, 0x4d, 0x18, (unsigned char)len,
                           (unsigned char)(len >> 8),       0,    0 };

    buf_append(out, (const char *)h, 8);
    for (size_t i = 0; i < len; i++)
        buf_putc(out, 'x');
}

struct seen {
    char *lines;           /* "lineno:len|…" and each line's bytes */
    struct buf text;       /* what on_text saw */
    struct buf raw;        /* what on_data saw */
    int r;                 /* jsonl_reader_next's last return */
    struct esd_err err;    /* its error */
    uint64_t offset;       /* rd.offset at the end */
    unsigned long long nl; /* lines read */
};

/* on_data and on_text: the bytes, appended to a buf */
static void
collect(void *ctx, const char *p, size_t n)
{
    buf_append(ctx, p, n);
}

/* Writes data as dir/name and reads it through the reader as its name
 * says; the caller frees with seen_free. */
static void
read_as(const char *dir, const char *name, const char *data, size_t len, struct seen *s)
{
    char *path = tu_write(dir, name, data, len);
    struct jsonl_reader rd;
    struct buf lines;
    const char *line;
    size_t n;
    bool nl;

    memset(s, 0, sizeof(*s));
    buf_init(&lines);
    buf_init(&s->text);
    buf_init(&s->raw);
    ck_assert_int_eq(jsonl_reader_open_as(&rd, path, zsrc_kind_of_name(name), 0, &s->err), 0);
    rd.on_data = collect;
    rd.on_data_ctx = &s->raw;
    rd.on_text = collect;
    rd.on_text_ctx = &s->text;
    while ((s->r = jsonl_reader_next(&rd, &line, &n, &nl, &s->err)) == 1) {
        buf_printf(&lines, "%llu:%zu:%d|", rd.lineno, n, nl);
        buf_append(&lines, line, n);
        s->nl = rd.lineno;
    }
    s->offset = rd.offset;
    jsonl_reader_close(&rd);
    s->lines = buf_steal(&lines);
    free(path);
}

static void
seen_free(struct seen *s)
{
    free(s->lines);
    buf_free(&s->text);
    buf_free(&s->raw);
}

START_TEST(test_kind_of_name)
{
    ck_assert_int_eq(zsrc_kind_of_name("a.jsonl"), ZSRC_PLAIN);
    ck_assert_int_eq(zsrc_kind_of_name("a.jsonl.gz"), ZSRC_GZIP);
    ck_assert_int_eq(zsrc_kind_of_name("A.JSON.GZ"), ZSRC_GZIP);
    ck_assert_int_eq(zsrc_kind_of_name("a.jsonl.zst"), ZSRC_ZSTD);
    ck_assert_int_eq(zsrc_kind_of_name("a.json.ZST"), ZSRC_ZSTD);
    ck_assert_int_eq(zsrc_kind_of_name("a.gzip"), ZSRC_PLAIN);
    ck_assert_str_eq(zsrc_kind_name(ZSRC_GZIP), "gzip");
    ck_assert_str_eq(zsrc_kind_name(ZSRC_ZSTD), "zstd");
    ck_assert_ptr_null(zsrc_kind_name(ZSRC_PLAIN));
}
END_TEST

/* Every form of the same text reads as the plain file does. */
static void
same_as_plain(size_t records)
{
    char *dir = tu_tmpdir();
    struct buf text, gz1, gzn, zs1, zsn;
    struct seen plain, s;
    size_t third;

    buf_init(&text);
    make_text(&text, records);
    third = text.len / 3;
    buf_init(&gz1);
    buf_init(&gzn);
    buf_init(&zs1);
    buf_init(&zsn);
    gz_member(&gz1, text.p, text.len);
    /* members split inside a record, and an empty one */
    gz_member(&gzn, text.p, third);
    gz_member(&gzn, text.p + third, 0);
    gz_member(&gzn, text.p + third, text.len - third);
    zst_frame(&zs1, text.p, text.len);
    zst_skippable(&zsn, 0, 5);
    zst_frame(&zsn, text.p, third);
    zst_skippable(&zsn, 15, 300);
    zst_frame(&zsn, text.p + third, text.len - third);
    zst_skippable(&zsn, 3, 0);

    read_as(dir, "a.jsonl", text.p, text.len, &plain);
    ck_assert_int_eq(plain.r, 0);
    ck_assert_uint_eq(plain.nl, records);
    ck_assert_uint_eq(plain.offset, text.len);
    {
        const struct buf *forms[] = { &gz1, &gzn, &zs1, &zsn };
        const char *names[] = { "b.jsonl.gz", "c.json.gz", "d.jsonl.zst", "e.json.zst" };

        for (size_t i = 0; i < 4; i++) {
            read_as(dir, names[i], forms[i]->p, forms[i]->len, &s);
            ck_assert_msg(s.r == 0, "%s: %s", names[i], s.err.msg);
            ck_assert_str_eq(s.lines, plain.lines);
            /* the text to on_text, the compressed bytes to on_data */
            ck_assert_uint_eq(s.text.len, text.len);
            ck_assert(!memcmp(s.text.p, text.p, text.len));
            ck_assert_uint_eq(s.raw.len, forms[i]->len);
            ck_assert(!memcmp(s.raw.p, forms[i]->p, forms[i]->len));
            /* a compressed file's offset is in its raw bytes */
            ck_assert_uint_eq(s.offset, forms[i]->len);
            seen_free(&s);
        }
    }
    seen_free(&plain);
    buf_free(&text);
    buf_free(&gz1);
    buf_free(&gzn);
    buf_free(&zs1);
    buf_free(&zsn);
    fs_rm_rf(dir);
    free(dir);
}

START_TEST(test_same_lines_small)
{
    same_as_plain(20);
}
END_TEST

/* several MiB of text: the ring of entries and the reader's buffer wrap */
START_TEST(test_same_lines_large)
{
    same_as_plain(150000);
}
END_TEST

/* An empty file is an empty text; so is a member or a frame of nothing. */
START_TEST(test_empty)
{
    char *dir = tu_tmpdir();
    struct buf gz, zs;
    struct seen s;

    read_as(dir, "a.jsonl.gz", "", 0, &s);
    ck_assert_int_eq(s.r, 0);
    ck_assert_str_eq(s.lines, "");
    seen_free(&s);
    read_as(dir, "a.jsonl.zst", "", 0, &s);
    ck_assert_int_eq(s.r, 0);
    ck_assert_str_eq(s.lines, "");
    seen_free(&s);
    buf_init(&gz);
    buf_init(&zs);
    gz_member(&gz, "", 0);
    zst_frame(&zs, "", 0);
    zst_skippable(&zs, 1, 10);
    read_as(dir, "b.jsonl.gz", gz.p, gz.len, &s);
    ck_assert_int_eq(s.r, 0);
    ck_assert_str_eq(s.lines, "");
    seen_free(&s);
    read_as(dir, "b.jsonl.zst", zs.p, zs.len, &s);
    ck_assert_int_eq(s.r, 0);
    ck_assert_str_eq(s.lines, "");
    seen_free(&s);
    buf_free(&gz);
    buf_free(&zs);
    fs_rm_rf(dir);
    free(dir);
}
END_TEST

/* Reads data as name and expects an error containing want, naming the
 * file and the line reached (the one after the lines read), after
 * lines_before lines were read (ANY: as many as the decoder gave). */
enum { ANY = -1 };

static void
expect_fault(const char *dir, const char *name, const struct buf *data, const char *want,
             long long lines_before)
{
    struct seen s;
    char line[64];

    read_as(dir, name, data->p, data->len, &s);
    ck_assert_int_eq(s.r, -EINVAL);
    ck_assert_msg(strstr(s.err.msg, want) != NULL, "%s: '%s' has no '%s'", name, s.err.msg, want);
    ck_assert_msg(strstr(s.err.msg, name) != NULL, "'%s' does not name %s", s.err.msg, name);
    snprintf(line, sizeof(line), "(line %llu)", s.nl + 1);
    ck_assert_msg(strstr(s.err.msg, line) != NULL, "'%s' does not say %s", s.err.msg, line);
    if (lines_before != ANY)
        ck_assert_uint_eq(s.nl, (unsigned long long)lines_before);
    seen_free(&s);
}

START_TEST(test_faults)
{
    char *dir = tu_tmpdir();
    struct buf text, gz, zs, bad;
    char want[128];
    size_t gz1, zs1;

    buf_init(&text);
    make_text(&text, 2000);
    buf_init(&gz);
    buf_init(&zs);
    gz_member(&gz, text.p, text.len);
    gz1 = gz.len;
    gz_member(&gz, text.p, text.len);
    zst_frame(&zs, text.p, text.len);
    zs1 = zs.len;
    zst_frame(&zs, text.p, text.len);
    buf_init(&bad);

    /* the wrong magic: text named .gz, gzip named .zst, zstd named .gz */
    expect_fault(dir, "plain.jsonl.gz", &text, "not a gzip file", 0);
    expect_fault(dir, "gzip.jsonl.zst", &gz, "not a zstd file", 0);
    expect_fault(dir, "zstd.jsonl.gz", &zs, "not a gzip file", 0);
    buf_append(&bad, "x", 1);
    expect_fault(dir, "x.jsonl.gz", &bad, "not a gzip file", 0);

    /* truncated inside the second member: every line of the first is
     * read, and the line reached is the one after */
    bad.len = 0;
    buf_append(&bad, gz.p, gz1 + 100);
    snprintf(want, sizeof(want), "truncated gzip stream at byte %zu (line ", gz1 + 100);
    expect_fault(dir, "t.jsonl.gz", &bad, want, ANY);
    bad.len = 0;
    buf_append(&bad, gz.p, gz1 + 1); /* inside its magic */
    snprintf(want, sizeof(want), "truncated gzip stream at byte %zu (line 2001)", gz1 + 1);
    expect_fault(dir, "t1.jsonl.gz", &bad, want, 2000);
    bad.len = 0;
    buf_append(&bad, gz.p, gz.len - 4); /* its trailer */
    snprintf(want, sizeof(want), "truncated gzip stream at byte %zu", gz.len - 4);
    expect_fault(dir, "t2.jsonl.gz", &bad, want, ANY);
    bad.len = 0;
    buf_append(&bad, zs.p, zs1 + 2); /* inside the second frame's magic */
    snprintf(want, sizeof(want), "truncated zstd stream at byte %zu (line 2001)", zs1 + 2);
    expect_fault(dir, "t.jsonl.zst", &bad, want, 2000);
    bad.len = 0;
    buf_append(&bad, zs.p, zs.len - 1); /* its checksum */
    snprintf(want, sizeof(want), "truncated zstd stream at byte %zu", zs.len - 1);
    expect_fault(dir, "t1.jsonl.zst", &bad, want, ANY);

    /* trailing garbage after a complete stream: all its lines are read */
    bad.len = 0;
    buf_append(&bad, gz.p, gz.len);
    buf_append(&bad, "\0\0\0\0", 4);
    snprintf(want, sizeof(want),
             "trailing garbage after the last gzip member at byte %zu (line 4001)", gz.len);
    expect_fault(dir, "g.jsonl.gz", &bad, want, 4000);
    bad.len = 0;
    buf_append(&bad, zs.p, zs.len);
    buf_append(&bad, "junk", 4);
    snprintf(want, sizeof(want),
             "trailing garbage after the last zstd frame at byte %zu (line 4001)", zs.len);
    expect_fault(dir, "g.jsonl.zst", &bad, want, 4000);

    /* corrupt data: the check value of the first member, a byte inside
     * the second frame's blocks */
    bad.len = 0;
    buf_append(&bad, gz.p, gz.len);
    bad.p[gz1 - 6] ^= 0x55;
    expect_fault(dir, "c.jsonl.gz", &bad, "corrupt gzip data at byte ", ANY);
    bad.p[gz1 - 6] ^= 0x55;
    bad.p[gz1 + 40] ^= 0xff;
    expect_fault(dir, "c1.jsonl.gz", &bad, "corrupt gzip data at byte ", ANY);
    bad.len = 0;
    buf_append(&bad, zs.p, zs.len);
    bad.p[zs.len - 2] ^= 0x55;
    expect_fault(dir, "c.jsonl.zst", &bad, "corrupt zstd data at byte ", ANY);

    buf_free(&bad);
    buf_free(&text);
    buf_free(&gz);
    buf_free(&zs);
    fs_rm_rf(dir);
    free(dir);
}
END_TEST

/* The reader closed before the end: the thread stops, nothing leaks. */
START_TEST(test_close_early)
{
    char *dir = tu_tmpdir(), *path;
    struct buf text, gz;
    struct jsonl_reader rd;
    struct esd_err err;
    const char *line;
    size_t n;
    bool nl;

    buf_init(&text);
    buf_init(&gz);
    make_text(&text, 200000);
    gz_member(&gz, text.p, text.len);
    path = tu_write(dir, "a.jsonl.gz", gz.p, gz.len);
    ck_assert_int_eq(jsonl_reader_open_as(&rd, path, ZSRC_GZIP, 0, &err), 0);
    ck_assert_int_eq(jsonl_reader_next(&rd, &line, &n, &nl, &err), 1);
    ck_assert(!strncmp(line, "{\"id\":0,", 8));
    jsonl_reader_close(&rd);
    jsonl_reader_close(&rd);
    free(path);
    buf_free(&text);
    buf_free(&gz);
    fs_rm_rf(dir);
    free(dir);
}
END_TEST

static Suite *
zsrc_suite(void)
{
    Suite *s = suite_create("zsrc");
    TCase *tc = tcase_create("core");

    /* (several MiB compressed and read five ways: seconds on a busy machine) */
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_kind_of_name);
    tcase_add_test(tc, test_same_lines_small);
    tcase_add_test(tc, test_same_lines_large);
    tcase_add_test(tc, test_empty);
    tcase_add_test(tc, test_faults);
    tcase_add_test(tc, test_close_early);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(zsrc_suite());
}
