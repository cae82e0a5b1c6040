/*
 * check_log: the log's text on the stderr target ("[<job> <shard>#<attempt>] "
 * before every message about a job, the identifier esd-processor for the
 * processor's lines, escaping of names), the journal's ESD_JOB of a job
 * directory (distinct for two directories of one basename), and the message
 * catalog systemd/esd.catalog against daemon/msgid.h: every id there exactly
 * once, none other, each entry with a Subject: and Defined-By: esd.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fsutil.h"
#include "log.h"
#include "manifest.h"
#include "msgid.h"
#include "sha256.h"
#include "testutil.h"
#include "util.h"

/* The ids of msgid.h, in its order. */
#define X(name, id) { #name, id, MSGID_##name },
static const struct {
    const char *name, *id, *define;
} ids[] = { MSGID_LIST(X) };
#undef X
#define NIDS (sizeof(ids) / sizeof(ids[0]))

/* Runs fn with stderr going to a file; returns what it wrote (caller frees). */
static char *
captured(void (*fn)(void))
{
    char *dir = tu_tmpdir(), *path = fs_join(dir, "err"), *text;
    FILE *f = fopen(path, "w+");
    int saved = dup(STDERR_FILENO);

    ck_assert_ptr_nonnull(f);
    fflush(stderr);
    ck_assert_int_ge(dup2(fileno(f), STDERR_FILENO), 0);
    fn();
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    fclose(f);
    text = tu_read(path, NULL);
    ck_assert_ptr_nonnull(text);
    fs_rm_rf(dir);
    free(path);
    free(dir);
    return text;
}

static struct log_job job;

static void
lines(void)
{
    log_init(LOG_TARGET_STDERR, LOG_LVL_INFO, true, "n1");
    log_info(&(struct log_ctx){ .job = &job, .shard = "part-00017", .attempt = 4 }, "done: %d rows",
             3);
    log_event(LOG_LVL_NOTICE, &(struct log_ctx){ .job = &job }, MSGID_MERGED, "merged");
    log_warning(&(struct log_ctx){ .shard = "part-00001" }, "no job");
    log_notice(NULL, "started");
    log_processor(&(struct log_ctx){ .job = &job, .shard = "part-00017", .attempt = 4 },
                  "mini-dj: read 3\nrows", 20);
    log_debug(&(struct log_ctx){ .job = &job }, "not shown");
}

START_TEST(test_stderr_text)
{
    char *text, *p;
    static const char *const want[] = {
        " esd n1 info: [clean-002 part-00017#4] done: 3 rows\n",
        " esd n1 notice: [clean-002] merged\n",
        " esd n1 warning: [- part-00001] no job\n",
        " esd n1 notice: started\n",
        " esd-processor n1 info: [clean-002 part-00017#4] mini-dj: read 3\\x0arows\n",
    };

    log_job_init(&job, "/srv/jobs/clean-002");
    text = captured(lines);
    p = text;
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        char *nl = strchr(p, '\n'), *sp = strchr(p, ' ');

        ck_assert_msg(nl && sp && sp < nl, "line %zu missing in %s", i, text);
        /* a timestamp, then exactly the wanted rest */
        ck_assert_int_eq(sp - p, 23);
        ck_assert_msg(!strncmp(sp, want[i], strlen(want[i])), "line %zu: %s", i, p);
        p = nl + 1;
    }
    ck_assert_str_eq(p, "");
    free(text);
    log_job_free(&job);
}
END_TEST

START_TEST(test_escaped_name)
{
    char *text;

    log_job_init(&job, "/srv/evil\n2026-12-01T00:00:00.000 esd n1 err: forged");
    text = captured(lines);
    ck_assert_ptr_nonnull(strstr(text, "info: [evil\\x0a2026-12-01T00:00:00.000 esd n1 err: "
                                       "forged part-00017#4] done: 3 rows\n"));
    ck_assert_ptr_null(strstr(text, "\n2026-12-01T00:00:00.000 esd"));
    free(text);
    log_job_free(&job);
}
END_TEST

START_TEST(test_log_id)
{
    char hex[SHA256_HEX_LEN + 1], *want, *a = manifest_log_id("/a/clean-002"),
                                         *b = manifest_log_id("/b/clean-002");

    sha256_buf("/a/clean-002", strlen("/a/clean-002"), hex);
    want = xasprintf("clean-002@%.8s", hex);
    ck_assert_str_eq(a, want);
    ck_assert_str_ne(a, b);
    ck_assert_int_eq(strlen(b), strlen("clean-002@") + 8);
    log_job_init(&job, "/a/clean-002");
    ck_assert_str_eq(job.id, a);
    ck_assert_str_eq(job.name, "clean-002");
    ck_assert_str_eq(job.dir, "/a/clean-002");
    log_job_free(&job);
    log_job_free(&job); /* twice: a freed one is empty */
    free(want);
    free(a);
    free(b);
}
END_TEST

START_TEST(test_msgid_header)
{
    for (size_t i = 0; i < NIDS; i++) {
        ck_assert_str_eq(ids[i].id, ids[i].define);
        ck_assert_uint_eq(strlen(ids[i].id), 32);
        ck_assert_uint_eq(strspn(ids[i].id, "0123456789abcdef"), 32);
        for (size_t k = 0; k < i; k++)
            ck_assert_str_ne(ids[i].id, ids[k].id);
    }
}
END_TEST

/* The entries of the catalog: "-- <id>" lines, each followed by headers up to
 * an empty line, then text. */
START_TEST(test_catalog)
{
    char *path = tu_data("../../systemd/esd.catalog"), *text = tu_read(path, NULL), *nl;
    unsigned seen[NIDS] = { 0 };
    size_t entries = 0;
    bool in_head = false, subject = false, defined = false;

    ck_assert_msg(text, "cannot read %s", path);
    for (char *l = text; *l; l = nl ? nl + 1 : l + strlen(l)) {
        if ((nl = strchr(l, '\n')))
            *nl = '\0';
        if (!strncmp(l, "-- ", 3)) {
            size_t i;

            ck_assert_msg(!entries || (subject && defined), "entry before %s lacks headers", l);
            for (i = 0; i < NIDS && strcmp(l + 3, ids[i].id); i++)
                ;
            ck_assert_msg(i < NIDS, "%s: not an id of msgid.h", l);
            seen[i]++;
            entries++;
            in_head = true;
            subject = defined = false;
        } else if (in_head && !*l) {
            in_head = false; /* the empty line that ends the headers */
        } else if (in_head) {
            ck_assert_msg(strstr(l, ": "), "not a header: %s", l);
            subject |= !strncmp(l, "Subject: ", 9);
            defined |= !strcmp(l, "Defined-By: esd");
        } else {
            ck_assert_msg(entries || !*l || *l == '#', "text before the first entry: %s", l);
        }
    }
    ck_assert_msg(subject && defined, "the last entry lacks headers");
    ck_assert_uint_eq(entries, NIDS);
    for (size_t i = 0; i < NIDS; i++)
        ck_assert_msg(seen[i] == 1, "MSGID_%s: %u entries in the catalog", ids[i].name, seen[i]);
    free(text);
    free(path);
}
END_TEST

static Suite *
log_suite(void)
{
    Suite *s = suite_create("log");
    TCase *tc = tcase_create("log");

    tcase_add_test(tc, test_stderr_text);
    tcase_add_test(tc, test_escaped_name);
    tcase_add_test(tc, test_log_id);
    tcase_add_test(tc, test_msgid_header);
    tcase_add_test(tc, test_catalog);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(log_suite());
}
