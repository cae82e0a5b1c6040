/*
 * check_pipeline: every chunk goes through every stage, an ordered stage
 * sees the chunks in sequence and one at a time, the source never has more
 * chunks out than it was given, and a failure reports the earliest chunk
 * that failed (in any stage, the source's included) after every chunk
 * before it went through every stage; with 1 to 8 threads and 1 to 5
 * chunks. And pipeline_cpus gives at least one CPU, no more than online.
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pipeline.h"
#include "testutil.h"
#include "util.h"

enum { MAX_SEQ = 64 };

struct chunk {
    uint64_t seq;
    uint64_t value; /* the parallel stage's */
};

struct run {
    uint64_t total;      /* chunks the source makes */
    uint64_t src_fail;   /* the source fails here (UINT64_MAX: never) */
    uint64_t work_fail;  /* the parallel stage fails at this chunk and the next */
    uint64_t order_fail; /* the first ordered stage fails here */
    size_t nchunks;
    uint64_t made, done;         /* by the source, by the last stage (atomics) */
    uint64_t seen1[MAX_SEQ], n1; /* sequences the ordered stages saw */
    uint64_t seen2[MAX_SEQ], n2;
    int busy1, busy2; /* an ordered stage running (atomics) */
    bool overlap, ahead;
};

static int
src(void *ctx, void *chunk, uint64_t seq, struct esd_err *err)
{
    struct run *r = ctx;
    struct chunk *c = chunk;
    uint64_t done = __atomic_load_n(&r->done, __ATOMIC_SEQ_CST);

    if (seq == r->total)
        return 0;
    if (seq == r->src_fail)
        return err_set(err, -EIO, "source failed at %llu", (unsigned long long)seq);
    /* the chunk being filled is one of those given */
    if (r->made - done >= r->nchunks)
        r->ahead = true;
    c->seq = seq;
    r->made++;
    return 1;
}

static int
work(void *ctx, void *chunk, uint64_t seq, struct esd_err *err)
{
    struct run *r = ctx;
    struct chunk *c = chunk;
    uint64_t v = seq;

    /* some work of uneven length, so that chunks pass each other */
    for (uint64_t i = 0; i < (seq * 7919) % 50000; i++)
        v = v * 6364136223846793005ULL + 1;
    c->value = v | 1;
    if (seq >= r->work_fail)
        return err_set(err, -EINVAL, "work failed at %llu", (unsigned long long)seq);
    return 0;
}

static int
ordered1(void *ctx, void *chunk, uint64_t seq, struct esd_err *err)
{
    struct run *r = ctx;
    struct chunk *c = chunk;

    if (__atomic_fetch_add(&r->busy1, 1, __ATOMIC_SEQ_CST) != 0)
        r->overlap = true;
    ck_assert_uint_eq(c->seq, seq);
    ck_assert_uint_ne(c->value, 0); /* the stage before it has run */
    r->seen1[r->n1++] = seq;
    __atomic_fetch_sub(&r->busy1, 1, __ATOMIC_SEQ_CST);
    if (seq == r->order_fail)
        return err_set(err, -ENOSPC, "ordered failed at %llu", (unsigned long long)seq);
    return 0;
}

static int
ordered2(void *ctx, void *chunk, uint64_t seq, struct esd_err *err)
{
    struct run *r = ctx;
    struct chunk *c = chunk;

    (void)err;
    if (__atomic_fetch_add(&r->busy2, 1, __ATOMIC_SEQ_CST) != 0)
        r->overlap = true;
    ck_assert_uint_eq(c->seq, seq);
    r->seen2[r->n2++] = seq;
    c->value = 0; /* the chunk is free again after this */
    __atomic_fetch_sub(&r->busy2, 1, __ATOMIC_SEQ_CST);
    __atomic_fetch_add(&r->done, 1, __ATOMIC_SEQ_CST);
    return 0;
}

static const struct pipeline_stage stages[] = {
    { src, true },
    { work, false },
    { ordered1, true },
    { ordered2, true },
};

/* Runs r over threads threads; returns pipeline_run's result. */
static int
run(struct run *r, unsigned threads, struct esd_err *err)
{
    struct chunk *c = xcalloc(r->nchunks, sizeof(*c));
    void **v = xcalloc(r->nchunks, sizeof(*v));
    int rc;

    for (size_t i = 0; i < r->nchunks; i++)
        v[i] = &c[i];
    rc = pipeline_run(stages, 4, r, v, r->nchunks, threads, err);
    free(v);
    free(c);
    return rc;
}

static void
setup(struct run *r, uint64_t total, size_t nchunks)
{
    memset(r, 0, sizeof(*r));
    r->total = total;
    r->nchunks = nchunks;
    r->src_fail = r->work_fail = r->order_fail = UINT64_MAX;
}

START_TEST(test_order)
{
    static const unsigned threads[] = { 1, 2, 3, 8 };
    static const size_t chunks[] = { 1, 2, 5 };

    for (size_t t = 0; t < 4; t++)
        for (size_t k = 0; k < 3; k++) {
            struct esd_err err = { 0 };
            struct run r;

            setup(&r, 40, chunks[k]);
            ck_assert_int_eq(run(&r, threads[t], &err), 0);
            ck_assert_uint_eq(r.n1, 40);
            ck_assert_uint_eq(r.n2, 40);
            for (uint64_t i = 0; i < 40; i++) {
                ck_assert_uint_eq(r.seen1[i], i);
                ck_assert_uint_eq(r.seen2[i], i);
            }
            ck_assert(!r.overlap);
            ck_assert(!r.ahead);
        }
}
END_TEST

START_TEST(test_empty)
{
    struct esd_err err = { 0 };
    struct run r;

    setup(&r, 0, 3);
    ck_assert_int_eq(run(&r, 4, &err), 0);
    ck_assert_uint_eq(r.made, 0);
    ck_assert_uint_eq(r.n1, 0);
}
END_TEST

/* The earliest failure wins, whichever stage it is in, and everything
 * before it went through every stage. */
START_TEST(test_first_failure)
{
    static const struct {
        uint64_t src, work, order, first;
        int code;
        const char *msg;
    } cases[] = {
        { UINT64_MAX, 9, UINT64_MAX, 9, -EINVAL, "work failed at 9" },
        { UINT64_MAX, 9, 4, 4, -ENOSPC, "ordered failed at 4" },
        { 6, 9, UINT64_MAX, 6, -EIO, "source failed at 6" },
        { 12, 3, 20, 3, -EINVAL, "work failed at 3" },
        { 0, UINT64_MAX, UINT64_MAX, 0, -EIO, "source failed at 0" },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        for (unsigned threads = 1; threads <= 8; threads *= 2) {
            struct esd_err err = { 0 };
            struct run r;

            setup(&r, 40, 4);
            r.src_fail = cases[i].src;
            r.work_fail = cases[i].work;
            r.order_fail = cases[i].order;
            ck_assert_int_eq(run(&r, threads, &err), cases[i].code);
            ck_assert_str_eq(err.msg, cases[i].msg);
            /* the chunks before the failure, every one through every stage */
            ck_assert_uint_eq(r.n2, cases[i].first);
            ck_assert_uint_eq(r.n1, cases[i].first + (cases[i].code == -ENOSPC));
            for (uint64_t k = 0; k < r.n2; k++)
                ck_assert_uint_eq(r.seen2[k], k);
        }
}
END_TEST

START_TEST(test_cpus)
{
    unsigned n = pipeline_cpus();
    long online = sysconf(_SC_NPROCESSORS_ONLN);

    ck_assert_uint_ge(n, 1);
    if (online > 0)
        ck_assert_uint_le(n, (unsigned)online);
    ck_assert_uint_ge(pipeline_chunks_for(n, 4), (size_t)n + 4);
}
END_TEST

static Suite *
pipeline_suite(void)
{
    Suite *s = suite_create("pipeline");
    TCase *tc = tcase_create("pipeline");

    tcase_add_test(tc, test_order);
    tcase_add_test(tc, test_empty);
    tcase_add_test(tc, test_first_failure);
    tcase_add_test(tc, test_cpus);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(pipeline_suite());
}
