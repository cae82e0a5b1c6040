/*
 * check_sha256: the FIPS 180-2 test vectors through the buffer, streaming
 * and file interfaces (the file one across its 1 MiB read chunks), and the
 * errors sha256_file reports for what it cannot read; each case once on
 * the CPU's SHA extensions (where it has them) and once on OpenSSL's code.
 * sha256_update2, two digests interleaved, against two sha256_update and
 * against OpenSSL, over every alignment of two streams' partial blocks.
 */
#include <check.h>
#include <sys/stat.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "fsutil.h"
#include "sha256.h"
#include "testutil.h"
#include "util.h"

static const struct {
    const char *msg;
    const char *hex;
} vectors[] = {
    { "", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" },
    { "abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad" },
    { "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
      "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1" },
    { "abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklm"
      "nopqrlmnopqrsmnopqrstnopqrstu",
      "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1" },
};

/* sha256("a" * 1000000) */
static const char million_a[] = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";

START_TEST(test_vectors_buf)
{
    char hex[SHA256_HEX_LEN + 1];

    for (size_t i = 0; i < sizeof(vectors) / sizeof(vectors[0]); i++) {
        sha256_buf(vectors[i].msg, strlen(vectors[i].msg), hex);
        ck_assert_str_eq(hex, vectors[i].hex);
    }
}
END_TEST

START_TEST(test_vectors_streaming)
{
    char hex[SHA256_HEX_LEN + 1];

    /* Fed one byte at a time, and with empty updates in between. */
    for (size_t i = 0; i < sizeof(vectors) / sizeof(vectors[0]); i++) {
        struct sha256 s;
        size_t n = strlen(vectors[i].msg);

        sha256_init(&s);
        for (size_t k = 0; k < n; k++) {
            sha256_update(&s, vectors[i].msg + k, 1);
            sha256_update(&s, "", 0);
            sha256_update(&s, NULL, 0);
        }
        sha256_final(&s, hex);
        ck_assert_ptr_null(s.ctx);
        ck_assert_str_eq(hex, vectors[i].hex);
    }
}
END_TEST

START_TEST(test_million_a)
{
    char hex[SHA256_HEX_LEN + 1];
    char *a = xmalloc(1000000);
    struct sha256 s;

    memset(a, 'a', 1000000);
    sha256_buf(a, 1000000, hex);
    ck_assert_str_eq(hex, million_a);
    /* In uneven pieces. */
    sha256_init(&s);
    for (size_t off = 0; off < 1000000;) {
        size_t n = off % 7919 + 1;

        if (n > 1000000 - off)
            n = 1000000 - off;
        sha256_update(&s, a + off, n);
        off += n;
    }
    sha256_final(&s, hex);
    ck_assert_str_eq(hex, million_a);
    free(a);
}
END_TEST

START_TEST(test_abort)
{
    struct sha256 s;

    sha256_init(&s);
    sha256_update(&s, "abc", 3);
    sha256_abort(&s);
    ck_assert_ptr_null(s.ctx);
    sha256_abort(&s);
    s.ctx = NULL;
    sha256_abort(&s);
}
END_TEST

START_TEST(test_file)
{
    char *dir = tu_tmpdir();
    char *empty = tu_write(dir, "empty", "", 0);
    char *abc = tu_write(dir, "abc", "abc", 3);
    char *big, *data, hex[SHA256_HEX_LEN + 1], want[SHA256_HEX_LEN + 1];
    size_t len = (3 << 20) + 12345; /* spans several 1 MiB chunks */
    struct esd_err err;

    ck_assert_int_eq(sha256_file(empty, hex, &err), 0);
    ck_assert_str_eq(hex, vectors[0].hex);
    ck_assert_int_eq(sha256_file(abc, hex, &err), 0);
    ck_assert_str_eq(hex, vectors[1].hex);

    data = xmalloc(len);
    for (size_t i = 0; i < len; i++)
        data[i] = (char)(i * 31 + i / 4096);
    big = tu_write(dir, "big", data, len);
    sha256_buf(data, len, want);
    ck_assert_int_eq(sha256_file(big, hex, &err), 0);
    ck_assert_str_eq(hex, want);

    fs_rm_rf(dir);
    free(data);
    free(big);
    free(abc);
    free(empty);
    free(dir);
}
END_TEST

START_TEST(test_file_errors)
{
    char *dir = tu_tmpdir();
    char *missing = fs_join(dir, "missing");
    char hex[SHA256_HEX_LEN + 1] = "untouched";
    struct esd_err err;
    char *want;

    ck_assert_int_eq(sha256_file(missing, hex, &err), -ENOENT);
    want = xasprintf("cannot open %s: No such file or directory", missing);
    ck_assert_str_eq(err.msg, want);
    free(want);

    /* a directory, or a FIFO, is refused at once, never read or waited on */
    ck_assert_int_eq(sha256_file(dir, hex, &err), -EINVAL);
    want = xasprintf("%s is not a regular file", dir);
    ck_assert_str_eq(err.msg, want);
    free(want);
    ck_assert_str_eq(hex, "untouched");
    ck_assert_int_eq(mkfifo(missing, 0600), 0);
    ck_assert_int_eq(sha256_file(missing, hex, &err), -EINVAL);
    ck_assert_str_eq(hex, "untouched");

    fs_rm_rf(dir);
    free(missing);
    free(dir);
}
END_TEST

/* Two streams of random lengths, in random pieces, some fed together:
 * each digest equals OpenSSL's of the same bytes. */
START_TEST(test_update2)
{
    enum { LEN = 70000 };
    unsigned char *data = xmalloc(LEN);
    unsigned seed = 12345;
    bool accel = sha256_accel(-1);

    for (size_t i = 0; i < LEN; i++)
        data[i] = (unsigned char)((seed = seed * 1103515245u + 12345u) >> 16);
    for (int round = 0; round < 300; round++) {
        size_t na = (seed = seed * 1103515245u + 12345u) >> 8, nb, off_b, at = 0, bt = 0;
        char ha[SHA256_HEX_LEN + 1], hb[SHA256_HEX_LEN + 1], wa[SHA256_HEX_LEN + 1],
            wb[SHA256_HEX_LEN + 1];
        struct sha256 a, b;

        na %= LEN / 2;
        nb = ((seed = seed * 1103515245u + 12345u) >> 8) % (LEN / 2);
        off_b = round % 3 == 0 ? 0 : (seed >> 3) % (LEN / 2); /* the same bytes, or others */
        sha256_init(&a);
        sha256_init(&b);
        while (at < na || bt < nb) {
            size_t r = (seed = seed * 1103515245u + 12345u) >> 8;
            /* pieces from 0 bytes to a few blocks, each stream its own */
            size_t ka = (r % 300) < na - at ? r % 300 : na - at;
            size_t kb = ((r >> 9) % 300) < nb - bt ? (r >> 9) % 300 : nb - bt;

            if (r & (1u << 20)) {
                sha256_update2(&a, data + at, ka, &b, data + off_b + bt, kb);
            } else {
                sha256_update(&a, data + at, ka);
                sha256_update(&b, data + off_b + bt, kb);
            }
            at += ka, bt += kb;
        }
        sha256_final(&a, ha);
        sha256_final(&b, hb);
        /* what OpenSSL says of the same bytes */
        sha256_accel(0);
        sha256_buf(data, na, wa);
        sha256_buf(data + off_b, nb, wb);
        sha256_accel(accel);
        ck_assert_msg(!strcmp(ha, wa) && !strcmp(hb, wb), "round %d: %zu and %zu bytes", round, na,
                      nb);
    }
    free(data);
}
END_TEST

/* Long runs of whole blocks together, unequal, from partial blocks. */
START_TEST(test_update2_long)
{
    size_t len = (1 << 20) + 77;
    unsigned char *data = xmalloc(len);
    char ha[SHA256_HEX_LEN + 1], hb[SHA256_HEX_LEN + 1], wa[SHA256_HEX_LEN + 1],
        wb[SHA256_HEX_LEN + 1];
    struct sha256 a, b;
    bool accel = sha256_accel(-1);

    for (size_t i = 0; i < len; i++)
        data[i] = (unsigned char)(i * 7 + (i >> 11));
    sha256_init(&a);
    sha256_init(&b);
    sha256_update2(&a, data, 5, &b, data + 1, 63);
    sha256_update2(&a, data + 5, len - 5, &b, data + 64, len - 64 - 1000);
    sha256_update2(&a, "", 0, &b, data + len - 1000, 1000);
    sha256_update2(&a, NULL, 0, &b, NULL, 0);
    sha256_final(&a, ha);
    sha256_final(&b, hb);
    sha256_accel(0);
    sha256_buf(data, len, wa);
    sha256_buf(data + 1, len - 1, wb);
    sha256_accel(accel);
    ck_assert_str_eq(ha, wa);
    ck_assert_str_eq(hb, wb);
    free(data);
}
END_TEST

static void
accel_on(void)
{
    sha256_accel(1);
}

static void
accel_off(void)
{
    sha256_accel(0);
    ck_assert(!sha256_accel(-1));
}

static Suite *
sha256_suite(void)
{
    Suite *s = suite_create("sha256");
    /* the CPU's extensions where it has them (accel_on), then OpenSSL's */
    for (int k = 0; k < 2; k++) {
        TCase *tc = tcase_create(k ? "openssl" : "cpu");

        tcase_add_checked_fixture(tc, k ? accel_off : accel_on, NULL);
        tcase_add_test(tc, test_vectors_buf);
        tcase_add_test(tc, test_vectors_streaming);
        tcase_add_test(tc, test_million_a);
        tcase_add_test(tc, test_abort);
        tcase_add_test(tc, test_file);
        tcase_add_test(tc, test_file_errors);
        tcase_add_test(tc, test_update2);
        tcase_add_test(tc, test_update2_long);
        suite_add_tcase(s, tc);
    }
    return s;
}

int
main(void)
{
    return tu_run(sha256_suite());
}
