/*
 * check_sha256: the FIPS 180-2 test vectors through the buffer, streaming
 * and file interfaces (the file one across its 1 MiB read chunks), and the
 * errors sha256_file reports for what it cannot read.
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

static Suite *
sha256_suite(void)
{
    Suite *s = suite_create("sha256");
    TCase *tc = tcase_create("sha256");

    tcase_add_test(tc, test_vectors_buf);
    tcase_add_test(tc, test_vectors_streaming);
    tcase_add_test(tc, test_million_a);
    tcase_add_test(tc, test_abort);
    tcase_add_test(tc, test_file);
    tcase_add_test(tc, test_file_errors);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(sha256_suite());
}
