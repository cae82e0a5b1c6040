/*
 * check_tries: common/tries.c on its own, without a claim or a claimer:
 * attempt directory names, the first attempt.json of a claim, reading
 * attempt.json safely, and the terminal rule's decisions from counts.
 * Counting over real attempts, and the rule as claims and attempt_finish
 * apply it, are check_attempt's and check_claim's.
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "claim.h"
#include "fsutil.h"
#include "json.h"
#include "manifest.h"
#include "testutil.h"
#include "tries.h"
#include "util.h"

#define TOKEN "0123456789abcdef0123456789abcdef"

static char *tmp;
static struct manifest M;

static void
setup(void)
{
    tmp = tu_tmpdir();
    tu_job(tmp, &M);
}

static void
teardown(void)
{
    fs_rm_rf(tmp);
    manifest_free(&M);
    free(tmp);
}

START_TEST(test_name_number)
{
    ck_assert_int_eq(tries_name_number("0001-" TOKEN), 1);
    ck_assert_int_eq(tries_name_number("0042-" TOKEN), 42);
    ck_assert_int_eq(tries_name_number("123456789-" TOKEN), 123456789);
    /* negative: too few or too many digits, no dash, a bad token */
    ck_assert_int_eq(tries_name_number("001-" TOKEN), -1);
    ck_assert_int_eq(tries_name_number("1234567890-" TOKEN), -1);
    ck_assert_int_eq(tries_name_number("0001" TOKEN), -1);
    ck_assert_int_eq(tries_name_number("0001-0123456789ABCDEF0123456789abcdef"), -1);
    ck_assert_int_eq(tries_name_number("0001-" TOKEN "0"), -1);
    ck_assert_int_eq(tries_name_number("0001-0123"), -1);
    ck_assert_int_eq(tries_name_number(""), -1);
}
END_TEST

START_TEST(test_record_start)
{
    char *dir = fs_join(tmp, "attempt"), *path = fs_join(dir, "attempt.json"), *before;
    cJSON *claim = cJSON_CreateObject(), *j;
    struct esd_err err;

    ck_assert_int_eq(mkdir(dir, 0755), 0);
    json_add_str(claim, "shard_id", "s1");
    json_add_str(claim, "token", TOKEN);
    json_add_int(claim, "attempt_number", 3);
    ck_assert_msg(tries_record_start(dir, claim, "data/a.jsonl", &err) == 0, "%s", err.msg);
    /* the claim's fields, then the start's own; the claim is not taken */
    ck_assert_ptr_null(json_get_str(claim, "status"));
    j = tries_json_load(path);
    ck_assert_ptr_nonnull(j);
    ck_assert_str_eq(json_get_str(j, "shard_id"), "s1");
    ck_assert_str_eq(json_get_str(j, "token"), TOKEN);
    ck_assert_str_eq(json_get_str(j, "status"), "running");
    ck_assert_str_eq(json_get_str(j, "input_path"), "data/a.jsonl");
    cJSON_Delete(j);
    /* negative: never over an existing attempt.json */
    before = tu_read(path, NULL);
    ck_assert_int_eq(tries_record_start(dir, claim, "other", &err), -EEXIST);
    ck_assert_ptr_nonnull(strstr(err.msg, path));
    j = tries_json_load(path);
    ck_assert_str_eq(json_get_str(j, "input_path"), "data/a.jsonl");
    cJSON_Delete(j);
    /* negative: the directory must exist */
    fs_rm_rf(dir);
    ck_assert_int_eq(tries_record_start(dir, claim, "data/a.jsonl", &err), -ENOENT);
    free(before);
    cJSON_Delete(claim);
    free(path);
    free(dir);
}
END_TEST

START_TEST(test_json_load_refuses)
{
    char *obj = tu_write(tmp, "t/obj.json", "{\"status\": \"running\"}", (size_t)-1);
    char *arr = tu_write(tmp, "t/arr.json", "[1]", (size_t)-1);
    char *bad = tu_write(tmp, "t/bad.json", "{\"status\":", (size_t)-1);
    char *link = fs_join(tmp, "t/link.json"), *fifo = fs_join(tmp, "t/fifo.json");
    cJSON *j;

    j = tries_json_load(obj);
    ck_assert_ptr_nonnull(j);
    cJSON_Delete(j);
    ck_assert_int_eq(symlink(obj, link), 0);
    ck_assert_int_eq(mkfifo(fifo, 0644), 0);
    /* none of these is an attempt.json: not an object, not JSON, a link, a
     * FIFO (which must not block), a missing file */
    ck_assert_ptr_null(tries_json_load(arr));
    ck_assert_ptr_null(tries_json_load(bad));
    ck_assert_ptr_null(tries_json_load(link));
    ck_assert_ptr_null(tries_json_load(fifo));
    ck_assert_ptr_null(tries_json_load("/nonexistent/attempt.json"));
    free(obj);
    free(arr);
    free(bad);
    free(link);
    free(fifo);
}
END_TEST

static struct tries_rule
rule(const char *node)
{
    return (struct tries_rule){
        .job_dir = M.job_dir, .node = node, .hostname = node, .max_retries = 2, .max_infra = 3
    };
}

START_TEST(test_limit_without_peers)
{
    struct tries_rule r = rule("n1");
    struct tries_counts n = { 0 };
    char *clock = tu_write(M.job_dir, "state/clock/n1", "", 0);

    ck_assert_int_eq(tries_limit(&r, &n), TL_OPEN);
    n.counted = 2; /* at max_retries: still open */
    n.here = 2;
    n.nodes = 1;
    ck_assert_int_eq(tries_limit(&r, &n), TL_OPEN);
    n.counted = 3; /* used up by this node alone, nobody else alive */
    n.here = 3;
    ck_assert_int_eq(tries_limit(&r, &n), TL_TERMINAL);
    n.here = 0; /* used up by one other node: this one tries it */
    ck_assert_int_eq(tries_limit(&r, &n), TL_OPEN);
    n.nodes = 2; /* two nodes failed it */
    ck_assert_int_eq(tries_limit(&r, &n), TL_TERMINAL);
    n = (struct tries_counts){ .infra = 4 }; /* the fleet's infrastructure limit */
    ck_assert_int_eq(tries_limit(&r, &n), TL_TERMINAL);
    n.infra = 3;
    ck_assert_int_eq(tries_limit(&r, &n), TL_OPEN);
    free(clock);
}
END_TEST

START_TEST(test_limit_left_to_live_peer)
{
    struct tries_rule r = rule("n1");
    struct tries_counts n = { .counted = 3, .here = 3, .nodes = 1 };
    char *own = tu_write(M.job_dir, "state/clock/n1", "", 0);
    char *peer = tu_write(M.job_dir, "state/clock/n2", "", 0);

    /* (tries.h cannot see claim.h: the window is three missed resyncs of
     * a node's clock file, as claims touch it) */
    ck_assert_double_eq(TRIES_PEER_ALIVE_SECS, 3 * CLAIM_CLOCK_RESYNC);
    /* n2 touched its clock just now: the shard is left to it */
    ck_assert_int_eq(tries_limit(&r, &n), TL_LEFT);
    /* n2 silent for longer than TRIES_PEER_ALIVE_SECS: terminal here */
    tu_set_age(peer, 2 * TRIES_PEER_ALIVE_SECS);
    ck_assert_int_eq(tries_limit(&r, &n), TL_TERMINAL);
    /* negative: no clock file of its own is no server time: as if alone */
    unlink(own);
    tu_set_age(peer, 0);
    ck_assert_int_eq(tries_limit(&r, &n), TL_TERMINAL);
    free(own);
    free(peer);
}
END_TEST

static Suite *
tries_suite(void)
{
    Suite *s = suite_create("tries");
    TCase *tc = tcase_create("core");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_name_number);
    tcase_add_test(tc, test_record_start);
    tcase_add_test(tc, test_json_load_refuses);
    tcase_add_test(tc, test_limit_without_peers);
    tcase_add_test(tc, test_limit_left_to_live_peer);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(tries_suite());
}
