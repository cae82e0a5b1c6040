/*
 * check_manifest: loading manifest.json with the load-time checks of spec
 * §5.2 and esd's own (plain shard ids, unique ids, safe job ids refused
 * with an escaped message), policy defaults, shard names, and the paths of
 * the layout.
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "manifest.h"
#include "testutil.h"

static const char *GOOD =
    "{\"schema_version\": 2, \"job_id\": \"j\", \"total_rows\": 3,\n"
    " \"execution\": {\"executor_type\": \"ray\", \"ray_address\": \"local\"},\n"
    " \"policy\": {\"lock_timeout_secs\": 60, \"max_retries\": 0},\n"
    " \"shards\": [{\"id\": \"part-00000-of-00002\", \"index\": 0, \"path\": "
    "\"shards/part-00000-of-00002.jsonl\", \"rows\": 2, \"size_bytes\": 10, \"sha256\": \"ab\"},\n"
    "            {\"id\": \"part-00001-of-00002\", \"index\": 1, \"path\": "
    "\"shards/part-00001-of-00002.jsonl\", \"rows\": 1}]}\n";

static int
load(const char *text, struct manifest *m, struct esd_err *err)
{
    char *dir = tu_tmpdir();
    int r;

    free(tu_write(dir, "manifest.json", text, (size_t)-1));
    r = manifest_load(dir, m, err);
    fs_rm_rf(dir);
    free(dir);
    return r;
}

START_TEST(test_good)
{
    struct manifest m;
    struct esd_err err;
    char *p;

    ck_assert_msg(load(GOOD, &m, &err) == 0, "%s", err.msg);
    ck_assert_str_eq(m.job_id, "j");
    ck_assert_uint_eq(m.nshards, 2);
    ck_assert_str_eq(m.shards[1].id, "part-00001-of-00002");
    ck_assert_int_eq(m.shards[0].rows, 2);
    ck_assert_int_eq(m.shards[0].size_bytes, 10);
    ck_assert_int_eq(m.shards[1].size_bytes, -1);
    ck_assert_int_eq(m.lock_timeout_secs, 60);
    ck_assert_int_eq(m.max_retries, 0);
    ck_assert_int_eq(m.poll_interval_secs, POLICY_POLL_INTERVAL_DEFAULT);
    ck_assert_int_eq(m.total_rows, 3);
    ck_assert_str_eq(m.ray_address, "local");
    ck_assert_int_eq(manifest_find(&m, "part-00001-of-00002"), 1);
    ck_assert_int_eq(manifest_find(&m, "nope"), -1);
    p = manifest_state_path(&m, "done", "x", ".json");
    ck_assert_ptr_nonnull(strstr(p, "/state/done/x.json"));
    free(p);
    manifest_free(&m);
}
END_TEST

static const struct {
    const char *from, *to, *msg;
} bad[] = {
    { "\"schema_version\": 2", "\"schema_version\": 3", "unsupported manifest schema_version 3" },
    { "\"schema_version\": 2", "\"schema_version\": \"2\"", "unsupported manifest schema_version" },
    { "\"executor_type\": \"ray\"", "\"executor_type\": \"default\"", "executor_type \"ray\"" },
    { "\"ray_address\": \"local\"", "\"ray_address\": \"\"", "non-empty ray_address" },
    { "\"id\": \"part-00000-of-00002\"", "\"id\": \"../../etc\"", "is not a plain file name" },
    { "\"id\": \"part-00000-of-00002\"", "\"id\": \"part-00001-of-00002\"", "duplicate shard id" },
    { "\"rows\": 2", "\"rows\": \"2\"", "shards[0] needs" },
    { "\"shards/part-00000-of-00002.jsonl\"", "\"shards/../../x.jsonl\"",
      "is not a relative path inside" },
    { "\"shards/part-00000-of-00002.jsonl\"", "\"/etc/passwd\"", "is not a relative path inside" },
    { "\"max_retries\": 0", "\"max_retries\": -1", "policy.max_retries" },
    { "\"lock_timeout_secs\": 60", "\"lock_timeout_secs\": 0", "policy.lock_timeout_secs" },
    /* job ids that would act on a terminal or forge a log line, shown escaped */
    { "\"job_id\": \"j\"", "\"job_id\": \"j\\u001b]0;x\\u0007\\nforged\"",
      "job_id 'j\\x1b]0;x\\x07\\x0aforged' is not allowed" },
    { "\"job_id\": \"j\"", "\"job_id\": \"j\\tk\"", "job_id 'j\\x09k' is not allowed" },
    { "\"job_id\": \"j\"", "\"job_id\": \"j\\u007f\"", "job_id 'j\\x7f' is not allowed" },
    { "\"job_id\": \"j\"", "\"job_id\": \"\\u009b31m\"", "job_id '\\xc2\\x9b31m' is not allowed" },
    { "\"job_id\": \"j\"", "\"job_id\": \"a/b\"", "job_id 'a/b' is not allowed" },
    { "\"job_id\": \"j\"", "\"job_id\": \"--config=/x\"", "job_id '--config=/x' is not" },
    { "\"job_id\": \"j\"", "\"job_id\": \"\"", "job_id '' is not allowed" },
};

START_TEST(test_bad)
{
    struct manifest m;
    struct esd_err err;
    const char *at = strstr(GOOD, bad[_i].from);
    char *text;

    ck_assert_ptr_nonnull(at);
    text = xasprintf("%.*s%s%s", (int)(at - GOOD), GOOD, bad[_i].to, at + strlen(bad[_i].from));
    ck_assert_int_eq(load(text, &m, &err), -EINVAL);
    ck_assert_msg(strstr(err.msg, bad[_i].msg), "%s", err.msg);
    free(text);
}
END_TEST

START_TEST(test_job_id)
{
    char name[300];
    struct manifest m;
    struct esd_err err;
    char *text, *dir, *job;
    const char *at = strstr(GOOD, "\"job_id\": \"j\", ");

    /* job ids are directory names: spaces and non-ASCII are fine */
    ck_assert(manifest_job_id_ok("j"));
    ck_assert(manifest_job_id_ok("my job (v2)"));
    ck_assert(manifest_job_id_ok("caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac"));
    ck_assert(manifest_job_id_ok("a-b"));
    ck_assert(!manifest_job_id_ok("-a"));
    ck_assert(!manifest_job_id_ok(""));
    ck_assert(!manifest_job_id_ok("a/b"));
    ck_assert(!manifest_job_id_ok("a\nb"));
    ck_assert(!manifest_job_id_ok("a\x1b"));
    ck_assert(!manifest_job_id_ok("a\x7f"));
    ck_assert(!manifest_job_id_ok("a\xc2\x85"));
    ck_assert(!manifest_job_id_ok("a\xc3"));
    memset(name, 'x', 255);
    name[255] = '\0';
    ck_assert(manifest_job_id_ok(name));
    name[255] = 'x';
    name[256] = '\0';
    ck_assert(!manifest_job_id_ok(name));

    /* accepted through manifest_load too */
    text = xasprintf("%.*s\"job_id\": \"my job \xc3\xa9\", %s", (int)(at - GOOD), GOOD,
                     at + strlen("\"job_id\": \"j\", "));
    ck_assert_msg(load(text, &m, &err) == 0, "%s", err.msg);
    ck_assert_str_eq(m.job_id, "my job \xc3\xa9");
    manifest_free(&m);
    free(text);

    /* without a job_id field the directory's name is the id, checked alike;
     * the message names the manifest, escaped */
    dir = tu_tmpdir();
    job = xasprintf("%s/evil\x1b[2J\nname", dir);
    text = xasprintf("%.*s%s", (int)(at - GOOD), GOOD, at + strlen("\"job_id\": \"j\", "));
    free(tu_write(job, "manifest.json", text, (size_t)-1));
    ck_assert_int_eq(manifest_load(job, &m, &err), -EINVAL);
    ck_assert_msg(strstr(err.msg, "evil\\x1b[2J\\x0aname/manifest.json: job_id "
                                  "'evil\\x1b[2J\\x0aname' is not allowed"),
                  "%s", err.msg);
    ck_assert_ptr_null(strchr(err.msg, '\x1b'));
    ck_assert_ptr_null(strchr(err.msg, '\n'));
    fs_rm_rf(dir);
    free(dir);
    free(job);
    free(text);
}
END_TEST

/* A job directory that is not one: missing, a file, a path through a
 * file, no manifest; other errors are left to the caller. */
START_TEST(test_not_a_job_dir)
{
    char *dir = tu_tmpdir(), *empty, *file, *through, *missing, *want;
    struct manifest m;
    struct esd_err err;

    empty = fs_join(dir, "empty");
    missing = fs_join(dir, "missing");
    through = fs_join(dir, "file/sub");
    ck_assert_int_eq(mkdir(empty, 0755), 0);
    file = tu_write(dir, "file", "x", (size_t)-1);

    ck_assert_int_eq(manifest_load(empty, &m, &err), -ENOENT);
    want = xasprintf("%s: not a job directory (no manifest.json): prepare it first, or check "
                     "the path",
                     empty);
    ck_assert_str_eq(err.msg, want);
    free(want);
    ck_assert_int_eq(manifest_load(missing, &m, &err), -ENOENT);
    want = xasprintf("%s: no such directory", missing);
    ck_assert_str_eq(err.msg, want);
    free(want);
    ck_assert_int_eq(manifest_load(file, &m, &err), -ENOTDIR);
    want = xasprintf("%s: not a directory", file);
    ck_assert_str_eq(err.msg, want);
    free(want);
    ck_assert_int_eq(manifest_load(through, &m, &err), -ENOTDIR);
    want = xasprintf("%s: not a directory", through);
    ck_assert_str_eq(err.msg, want);
    free(want);
    /* not one of the four: err untouched */
    err_set(&err, -1, "kept");
    ck_assert(!manifest_dir_explain(empty, -EIO, &err));
    ck_assert(!manifest_dir_explain(empty, -ELOOP, &err));
    ck_assert_str_eq(err.msg, "kept");
    fs_rm_rf(dir);
    free(empty);
    free(missing);
    free(through);
    free(file);
    free(dir);
}
END_TEST

START_TEST(test_unreadable)
{
    struct manifest m;
    struct esd_err err;

    ck_assert_int_lt(load("{\"shards\": [", &m, &err), 0);
    ck_assert_ptr_nonnull(strstr(err.msg, "Unable to read JSON file"));
    ck_assert_int_lt(load("[]", &m, &err), 0);
    ck_assert_ptr_nonnull(strstr(err.msg, "Expected a JSON object in"));
    ck_assert_int_lt(load("{\"schema_version\": 2, \"shards\": [], \"execution\": {}}", &m, &err),
                     0);
    ck_assert_ptr_nonnull(strstr(err.msg, "shards must be a non-empty list"));
}
END_TEST

START_TEST(test_names)
{
    char *s = manifest_shard_id(3, 16);

    ck_assert_str_eq(s, "part-00003-of-00016");
    free(s);
    s = manifest_shard_id(7, 123456);
    ck_assert_str_eq(s, "part-000007-of-123456");
    free(s);
    ck_assert(manifest_id_ok("part-00000-of-00001"));
    ck_assert(!manifest_id_ok(".hidden"));
    ck_assert(!manifest_id_ok("a/b"));
    ck_assert(!manifest_id_ok(""));
}
END_TEST

/* A manifest padded far beyond what its two shards can need is refused
 * before it is parsed; so are a FIFO and a symbolic link in its place. */
START_TEST(test_size_and_type)
{
    struct manifest m;
    struct esd_err err;
    struct buf b;
    char *dir, *path, *link;
    size_t pad = (size_t)3 << 20;

    buf_init(&b);
    buf_puts(&b, "{\"pad\": \"");
    for (size_t i = 0; i < pad; i++)
        buf_putc(&b, 'x');
    buf_puts(&b, "\", ");
    buf_puts(&b, GOOD + 1);
    ck_assert_int_eq(load(b.p, &m, &err), -EFBIG);
    ck_assert_msg(strstr(err.msg, "for 2 shards and 0 input files"), "%s", err.msg);
    ck_assert_int_eq(manifest_check_size(b.p, b.len, "m", &err), -EFBIG);
    ck_assert_int_eq(manifest_check_size(GOOD, strlen(GOOD), "m", &err), 0);
    buf_free(&b);

    dir = tu_tmpdir();
    path = fs_join(dir, "manifest.json");
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    ck_assert_int_eq(manifest_load(dir, &m, &err), -EINVAL);
    ck_assert_msg(strstr(err.msg, "not a regular file"), "%s", err.msg);
    unlink(path);
    link = tu_write(dir, "elsewhere.json", GOOD, (size_t)-1);
    ck_assert_int_eq(symlink(link, path), 0);
    ck_assert_int_eq(manifest_load(dir, &m, &err), -ELOOP);
    ck_assert_msg(strstr(err.msg, "symbolic link"), "%s", err.msg);
    fs_rm_rf(dir);
    free(dir);
    free(path);
    free(link);
}
END_TEST

/* What a loading child sends back reads as the same manifest. */
START_TEST(test_compact_round_trip)
{
    struct manifest m, back;
    struct esd_err err;
    struct buf b;

    struct manifest_reader rd;

    ck_assert_msg(load(GOOD, &m, &err) == 0, "%s", err.msg);
    buf_init(&b);
    manifest_compact(&m, &b);
    /* fed in pieces of 7 bytes, as a pipe may deliver it */
    manifest_reader_init(&rd);
    for (size_t i = 0; i < b.len; i += 7)
        ck_assert_int_eq(manifest_reader_feed(&rd, b.p + i, b.len - i < 7 ? b.len - i : 7, &err),
                         0);
    ck_assert_msg(manifest_reader_finish(&rd, m.job_dir, &back, &err) == 0, "%s", err.msg);
    manifest_reader_free(&rd);
    ck_assert_str_eq(back.job_id, m.job_id);
    ck_assert_uint_eq(back.nshards, m.nshards);
    for (size_t i = 0; i < m.nshards; i++) {
        ck_assert_str_eq(back.shards[i].id, m.shards[i].id);
        ck_assert_str_eq(back.shards[i].path, m.shards[i].path);
        ck_assert_int_eq(back.shards[i].rows, m.shards[i].rows);
        ck_assert_int_eq(back.shards[i].size_bytes, m.shards[i].size_bytes);
    }
    /* no shard digests: the daemon checks none */
    ck_assert_ptr_null(back.shards[0].sha256);
    ck_assert_ptr_null(back.shards[1].sha256);
    ck_assert_str_eq(back.job_dir, m.job_dir);
    ck_assert_int_eq(manifest_find(&back, m.shards[1].id), 1);
    ck_assert_int_eq(back.lock_timeout_secs, 60);
    ck_assert_int_eq(back.max_retries, 0);
    ck_assert_str_eq(back.ray_address, "local");
    ck_assert_int_eq(back.total_rows, 3);
    buf_free(&b);
    manifest_free(&back);
    manifest_free(&m);
}
END_TEST

/* A manifest of a split recipe (issue 17): recipe.global is loaded, kept
 * in the compact form, and refused with the key named when malformed. */
static const char *GLOBAL_RECIPE =
    "\"recipe\": {\"sha256\": \"aa\", \"snapshot_path\": \"recipe.shards.yaml\", "
    "\"whole_sha256\": \"bb\", \"global\": {\"snapshot_path\": \"recipe.global.yaml\", "
    "\"sha256\": \"cc\", \"operators\": [\"document_deduplicator\", \"topk_selector\"], "
    "\"shard_operators\": 12, \"executor_type\": \"default\"}},\n";

static char *
with_global(const char *from, const char *to)
{
    const char *at = strstr(GOOD, " \"shards\"");
    char *g = xstrdup(GLOBAL_RECIPE), *t;

    if (from) {
        char *p = strstr(g, from);

        ck_assert_ptr_nonnull(p);
        t = xasprintf("%.*s%s%s", (int)(p - g), g, to, p + strlen(from));
        free(g);
        g = t;
    }
    t = xasprintf("%.*s%s%s", (int)(at - GOOD), GOOD, g, at);
    free(g);
    return t;
}

START_TEST(test_global)
{
    static const struct {
        const char *from, *to, *msg;
    } refused[] = {
        { "\"recipe.global.yaml\"", "\"../x.yaml\"", "recipe.global.snapshot_path" },
        { "\"recipe.global.yaml\"", "\"/etc/x.yaml\"", "recipe.global.snapshot_path" },
        { "\"cc\"", "\"zz\"", "recipe.global.sha256" },
        { "\"default\"", "\"spark\"", "recipe.global.executor_type" },
        { "[\"document_deduplicator\", \"topk_selector\"]", "[]", "recipe.global.operators" },
        { "[\"document_deduplicator\", \"topk_selector\"]", "[1]", "recipe.global.operators" },
        { "12", "\"12\"", "recipe.global.shard_operators" },
        { "\"bb\"", "3", "recipe.whole_sha256" },
        { "\"global\": {", "\"global\": 5, \"g\": {", "recipe.global is not an object" },
    };
    struct manifest m, back;
    struct manifest_reader rd;
    struct esd_err err;
    struct buf b;
    char *text = with_global(NULL, NULL);

    ck_assert_msg(load(text, &m, &err) == 0, "%s", err.msg);
    free(text);
    ck_assert_str_eq(m.global_snapshot, "recipe.global.yaml");
    ck_assert_str_eq(m.global_sha256, "cc");
    ck_assert_str_eq(m.global_executor, "default");
    ck_assert_str_eq(m.global_ops_json, "[\"document_deduplicator\",\"topk_selector\"]");
    ck_assert_int_eq(m.global_shard_ops, 12);
    ck_assert_str_eq(m.recipe_whole_sha256, "bb");
    ck_assert_str_eq(m.recipe_snapshot, "recipe.shards.yaml");
    buf_init(&b);
    manifest_compact(&m, &b);
    manifest_reader_init(&rd);
    ck_assert_int_eq(manifest_reader_feed(&rd, b.p, b.len, &err), 0);
    ck_assert_msg(manifest_reader_finish(&rd, m.job_dir, &back, &err) == 0, "%s", err.msg);
    manifest_reader_free(&rd);
    ck_assert_str_eq(back.global_snapshot, "recipe.global.yaml");
    ck_assert_str_eq(back.global_ops_json, m.global_ops_json);
    ck_assert_str_eq(back.global_executor, "default");
    ck_assert_int_eq(back.global_shard_ops, 12);
    manifest_free(&back);
    manifest_free(&m);
    buf_free(&b);
    /* without recipe.global: no global stage */
    ck_assert_msg(load(GOOD, &m, &err) == 0, "%s", err.msg);
    ck_assert_ptr_null(m.global_snapshot);
    ck_assert_ptr_null(m.recipe_whole_sha256);
    manifest_free(&m);
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        text = with_global(refused[i].from, refused[i].to);
        ck_assert_int_eq(load(text, &m, &err), -EINVAL);
        ck_assert_msg(strstr(err.msg, refused[i].msg) && strstr(err.msg, "manifest.json"),
                      "%zu: %s", i, err.msg);
        free(text);
    }
}
END_TEST

/* A compact form that is cut short, lies about its count, or holds an
 * unusable shard id is refused. */
START_TEST(test_compact_refused)
{
    static const char *const cut[] = {
        "",
        "H\t2\t60\t0\t20\t=j\t=local\t\t\t\t\t\t\t\t\t\t0\nS\t0\t1\t-1\t=a\t=shards/a.jsonl\t\n",
        "H\t1\t60\t0\t20\t=j\t=local\t\t\t\t\t\t\t\t\t\t0\nS\t0\t1\t-1\t=../a\t=shards/a.jsonl\t\n",
        "H\t1\t60\t0\t20\t=j\t\t\t\t\t\t\t\t\t\t\t0\nS\t0\t1\t-1\t=a\t=shards/a.jsonl\t\n",
        "H\tx\t60\t0\t20\t=j\t=local\t\t\t\t\t\t\t\t\t\t0\n",
        "H\t1\t60\t0\t20\t=j\t=local\t\t\t\t\t\t\t\t\t\t0\nS\t0\t1\t-1\t=a\t=shards/a.jsonl\t\nS\t1",
    };
    struct manifest_reader rd;
    struct manifest m;
    struct esd_err err;
    int r;

    manifest_reader_init(&rd);
    r = manifest_reader_feed(&rd, cut[_i], strlen(cut[_i]), &err);
    if (r == 0)
        r = manifest_reader_finish(&rd, "/x/job", &m, &err);
    ck_assert_int_eq(r, -EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "compact manifest"));
    manifest_reader_free(&rd);
}
END_TEST

static Suite *
manifest_suite(void)
{
    Suite *s = suite_create("manifest");
    TCase *tc = tcase_create("core");

    tcase_add_test(tc, test_good);
    tcase_add_loop_test(tc, test_bad, 0, (int)(sizeof(bad) / sizeof(bad[0])));
    tcase_add_test(tc, test_job_id);
    tcase_add_test(tc, test_unreadable);
    tcase_add_test(tc, test_not_a_job_dir);
    tcase_add_test(tc, test_names);
    tcase_add_test(tc, test_size_and_type);
    tcase_add_test(tc, test_compact_round_trip);
    tcase_add_test(tc, test_global);
    tcase_add_loop_test(tc, test_compact_refused, 0, 6);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(manifest_suite());
}
