/*
 * check_hashq: digests computed on the hashing thread equal the same digests
 * computed inline, whatever the update sizes, interleaving and reuse of the
 * caller's buffer.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "hashq.h"
#include "sha256.h"
#include "testutil.h"

static void
count_bytes(void *ctx, const char *data, size_t len)
{
    size_t *n = ctx;

    for (size_t i = 0; i < len; i++)
        *n += (unsigned char)data[i];
}

START_TEST(test_equal_inline)
{
    enum { TOTAL = 5 << 20 };
    char *data = xmalloc(TOTAL), *scratch = xmalloc(TOTAL);
    struct hashq *q = hashq_new();
    struct sha256 a, b, ref_a, ref_b;
    char ha[65], hb[65], ra[65], rb[65];
    size_t sum = 0, ref_sum = 0, off = 0, step = 1;

    for (size_t i = 0; i < TOTAL; i++)
        data[i] = (char)(i * 2654435761u >> 13);
    sha256_init(&a);
    sha256_init(&b);
    sha256_init(&ref_a);
    sha256_init(&ref_b);
    while (off < TOTAL) {
        size_t n = step < TOTAL - off ? step : TOTAL - off;
        /* the caller reuses its buffer right after each call */
        memcpy(scratch, data + off, n);
        hashq_update(q, &a, scratch, n);
        hashq_run(q, count_bytes, &sum, scratch, n);
        memset(scratch, 0xee, n);
        if (off % 3 == 0)
            hashq_update(q, &b, data + off, n);
        sha256_update(&ref_a, data + off, n);
        count_bytes(&ref_sum, data + off, n);
        if (off % 3 == 0)
            sha256_update(&ref_b, data + off, n);
        off += n;
        step = step * 3 + 1; /* 1 byte … several slots */
        if (step > (3u << 20))
            step = 7;
    }
    hashq_sync(q);
    sha256_final(&a, ha);
    sha256_final(&b, hb);
    sha256_final(&ref_a, ra);
    sha256_final(&ref_b, rb);
    ck_assert_str_eq(ha, ra);
    ck_assert_str_eq(hb, rb);
    ck_assert_uint_eq(sum, ref_sum);
    hashq_free(q);
    free(data);
    free(scratch);
}
END_TEST

START_TEST(test_free_idle)
{
    hashq_free(hashq_new());
    hashq_free(NULL);
}
END_TEST

static Suite *
hashq_suite(void)
{
    Suite *s = suite_create("hashq");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_equal_inline);
    tcase_add_test(tc, test_free_idle);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(hashq_suite());
}
