/*
 * check_recipe: recipe loading and the per-shard validation rules of spec §7.
 * Every refusal is checked by its full message (file name and line); the
 * scalar typing is checked against what PyYAML 6's SafeLoader returns (the
 * expected str() values come from CPython 3.11), and the hostile inputs
 * (alias bombs, recursive aliases, deep nesting, oversized files) must fail
 * quickly with a clear message. On failure *ret must be left untouched.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "fsutil.h"
#include "pyyaml.h"
#include "recipe.h"
#include "testutil.h"
#include "util.h"

#define EXEC_WARNING \
    "recipe executor_type=default will be overridden with executor_type=ray for shard workers"
#define SAVE_DIR_WARNING(op)                                                                      \
    "operator '" op "' uses an explicit save_dir; the caller must ensure generated filenames do " \
    "not collide across shards"

static struct esd_err err;
static struct recipe rec;

/* Parses yaml as "r.yaml"; on failure checks that *ret was not touched. */
static int
parse_pol(const char *yaml, const struct recipe_policy *pol)
{
    struct recipe sentinel;
    int rc;

    memset(&rec, 0xa5, sizeof(rec));
    memset(&sentinel, 0xa5, sizeof(sentinel));
    err_clear(&err);
    rc = recipe_parse(yaml, strlen(yaml), "r.yaml", pol, &rec, &err);
    if (rc < 0) {
        ck_assert_msg(memcmp(&rec, &sentinel, sizeof(rec)) == 0, "*ret touched on failure");
        ck_assert_int_eq(err.code, rc);
        memset(&rec, 0, sizeof(rec));
    } else {
        ck_assert_int_eq(rc, 0);
    }
    return rc;
}

/* The message of a parse that must fail. */
static const char *
refuse_pol(const char *yaml, const struct recipe_policy *pol)
{
    int rc = parse_pol(yaml, pol);

    ck_assert_msg(rc < 0, "accepted:\n%s", yaml);
    return err.msg;
}

static const char *
refuse(const char *yaml)
{
    return refuse_pol(yaml, NULL);
}

static void
accept_pol(const char *yaml, const struct recipe_policy *pol)
{
    int rc = parse_pol(yaml, pol);

    ck_assert_msg(rc == 0, "refused (%s):\n%s", err.msg, yaml);
}

static void
accept(const char *yaml)
{
    accept_pol(yaml, NULL);
}

static void
assert_strv(const struct strv *s, const char *const *want, size_t n)
{
    ck_assert_uint_eq(s->n, n);
    for (size_t i = 0; i < n; i++)
        ck_assert_str_eq(s->v[i], want[i]);
}

#define ASSERT_STRV(s, ...)                                        \
    do {                                                           \
        static const char *const want_[] = { __VA_ARGS__ };        \
        assert_strv((s), want_, sizeof(want_) / sizeof(want_[0])); \
    } while (0)

static double
now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- the global stage: the split and the parts' texts ---- */

/* Parses text, emits its root, parses that: both reprs must agree. */
static void
assert_roundtrip(const char *text)
{
    struct pyyaml_doc a, b;
    struct buf o;
    char *ra, *rb;

    ck_assert_msg(pyyaml_parse(&a, text, strlen(text), "a", 100000, 64, &err) == 0, "%s", err.msg);
    buf_init(&o);
    pyyaml_emit(a.root, &o);
    buf_putc(&o, '\n');
    ck_assert_msg(pyyaml_parse(&b, o.p, o.len, "b", 100000, 64, &err) == 0, "%s in:\n%.*s", err.msg,
                  (int)o.len, o.p);
    ra = pyyaml_repr(a.root);
    rb = pyyaml_repr(b.root);
    ck_assert_msg(strcmp(ra, rb) == 0, "%s\n!=\n%s\nfrom:\n%.*s", ra, rb, (int)o.len, o.p);
    free(ra);
    free(rb);
    buf_free(&o);
    pyyaml_free(&a);
    pyyaml_free(&b);
}

START_TEST(test_emit_roundtrip)
{
    char longkey[2100];

    assert_roundtrip("ints: [0x1A, 1_000, 010, 0b101, 1:30, -0, +7, 123456789012345678901234]\n"
                     "floats: [1e5, 1.5e3, .inf, -.Inf, .NaN, 1_0.5, 6.8523015e+5, 190:20:30.15]\n"
                     "ts: [2001-12-14, 2001-12-14t21:59:43.10-05:00, 2002-12-14 21:59:43.1 +5]\n"
                     "bools: [yes, No, on, OFF, true, y, n]\n"
                     "nulls: [~, null, Null]\nempty:\n"
                     "strs: ['it''s', \"a\\\"b\\\\c\\td\\ne\", \"\\x85 \\u2028 \\u2029 \\ufeff\", "
                     "\"\\x00nul\", \"\\x7f\\x80\\x9f\", \"caf\u00e9 \U0001F600\", '1e5', '=', "
                     "\"\\uFFFD\", !!str 12, !!float 3, !!int '0x10']\n"
                     "base: &b {x: 1, y: [1, 2]}\n"
                     "merged: {<<: *b, y: 3, z: *b}\n"
                     "dup: {k: 1, k: 2}\n"
                     "keys: {1: a, ~: b, true: c, 1.5: d, 2001-01-01: e}\n");
    memset(longkey, 'k', sizeof(longkey) - 1);
    longkey[sizeof(longkey) - 1] = '\0';
    {
        char doc[2200];

        snprintf(doc, sizeof(doc), "{? \"%s\" : 1, \"a\\nb\": 2}\n", longkey);
        assert_roundtrip(doc);
    }
}
END_TEST

START_TEST(test_global_stage_split)
{
    struct recipe_policy pol = { .global_stage = true };
    struct recipe part;
    const char *y = "project_name: p\nexecutor_type: default\nnp: 2\n"
                    "process:\n"
                    "- whitespace_normalization_mapper:\n"
                    "- text_length_filter: {min_len: 5}\n"
                    "- document_deduplicator: {lowercase: true}\n"
                    "- language_id_score_filter: {lang: en, min_score: 0.5}\n"
                    "- topk_specified_field_selector: {field_key: n, topk: 2}\n"
                    "export_path: /x\n";

    /* without the flag, refused as ever */
    ck_assert_str_eq(refuse(y), "Operator 'document_deduplicator' in r.yaml:7 requires or may "
                                "require whole-dataset semantics and cannot run per shard");
    accept_pol(y, &pol);
    ck_assert_uint_eq(rec.nprocess, 5);
    ck_assert_uint_eq(rec.split, 2);
    ASSERT_STRV(&rec.global_ops, "document_deduplicator", "language_id_score_filter",
                "topk_specified_field_selector");
    ck_assert_ptr_nonnull(rec.shards_yaml);
    ck_assert_ptr_nonnull(rec.global_yaml);
    /* the shard part is a recipe that runs per shard, every other key kept */
    ck_assert_int_eq(recipe_parse(rec.shards_yaml, strlen(rec.shards_yaml), "s", NULL, &part, &err),
                     0);
    ASSERT_STRV(&part.ops, "whitespace_normalization_mapper", "text_length_filter");
    ck_assert_str_eq(part.executor_type, "default");
    recipe_free(&part);
    ck_assert_ptr_nonnull(strstr(rec.shards_yaml, "\"export_path\": \"/x\""));
    ck_assert_ptr_nonnull(strstr(rec.shards_yaml, "\"np\": 2"));
    ck_assert_int_eq(recipe_parse(rec.global_yaml, strlen(rec.global_yaml), "g", &pol, &part, &err),
                     0);
    ck_assert_uint_eq(part.split, 0);
    ASSERT_STRV(&part.ops, "document_deduplicator", "language_id_score_filter",
                "topk_specified_field_selector");
    recipe_free(&part);
    recipe_free(&rec);

    /* no whole-dataset operator: no split, no texts */
    accept_pol("process:\n- a_mapper:\n", &pol);
    ck_assert_uint_eq(rec.split, 1);
    ck_assert_ptr_null(rec.shards_yaml);
    recipe_free(&rec);

    /* global from the first item: the shard part is empty */
    accept_pol("process:\n- document_deduplicator:\n- a_mapper:\n", &pol);
    ck_assert_uint_eq(rec.split, 0);
    ck_assert_ptr_nonnull(strstr(rec.shards_yaml, "\"process\": []"));
    recipe_free(&rec);

    /* is_global_operation, a denied name and a fused operator holding a
     * deduplicator each start the stage */
    accept_pol("process:\n- a_mapper:\n- b_mapper: {is_global_operation: yes}\n", &pol);
    ck_assert_uint_eq(rec.split, 1);
    recipe_free(&rec);
    accept_pol("process:\n- a_mapper:\n- general_fused_op:\n    fused_op_list:\n"
               "    - c_filter:\n    - document_deduplicator:\n",
               &pol);
    ck_assert_uint_eq(rec.split, 1);
    ASSERT_STRV(&rec.global_ops, "general_fused_op");
    recipe_free(&rec);
    {
        struct strv deny;

        strv_init(&deny);
        strv_push(&deny, "b_mapper");
        pol.deny = &deny;
        accept_pol("process:\n- a_mapper:\n- b_mapper:\n- c_mapper:\n", &pol);
        ck_assert_uint_eq(rec.split, 1);
        recipe_free(&rec);
        pol.deny = NULL;
        strv_free(&deny);
    }

    /* the global stage still refuses what is unknown or malformed, and the
     * shard part what it always refused */
    ck_assert_str_eq(refuse_pol("process:\n- document_deduplicator:\n- foo_op:\n", &pol),
                     "Unknown operator 'foo_op' in r.yaml:3; cannot prove it is shard-safe");
    ck_assert_str_eq(
        refuse_pol("process:\n- document_deduplicator:\n- {a_mapper: , b_mapper: }\n", &pol),
        "process[1] in r.yaml:3 must contain exactly one operator");
    ck_assert_str_eq(refuse_pol("process:\n- a_mapper: {stats_export_path: /s}\n"
                                "- document_deduplicator:\n",
                                &pol),
                     "Operator 'a_mapper' in r.yaml:2 sets stats_export_path, which cannot be "
                     "used per shard");
    accept_pol("process:\n- document_deduplicator:\n- a_mapper: {stats_export_path: /s}\n", &pol);
    recipe_free(&rec);
}
END_TEST

/* ---- accepted recipes ---- */

START_TEST(test_minimal)
{
    accept("process: []\n");
    ck_assert_str_eq(rec.executor_type, "default");
    ASSERT_STRV(&rec.warnings, EXEC_WARNING);
    ck_assert_uint_eq(rec.ops.n, 0);
    ck_assert_uint_eq(rec.index_keys.n, 0);
    ck_assert_uint_eq(rec.custom_operator_paths.n, 0);
    ASSERT_STRV(&rec.media_keys, "images", "audios", "videos");
    ck_assert_ptr_null(rec.dataset_path);
    ck_assert(!rec.dataset_path_valid);
    ck_assert_ptr_null(rec.ray_address);
    recipe_free(&rec);
}
END_TEST

START_TEST(test_load_full)
{
    char *path = tu_data("recipes/ok-full.yaml");

    ck_assert_int_eq(recipe_load(path, NULL, &rec, &err), 0);
    ck_assert_str_eq(rec.executor_type, "default");
    ASSERT_STRV(&rec.ops, "whitespace_normalization_mapper", "text_length_filter",
                "image_captioning_mapper", "language_id_score_filter");
    ASSERT_STRV(&rec.index_keys, "doc_id", "row_id");
    ASSERT_STRV(&rec.media_keys, "pics", "sounds");
    ASSERT_STRV(&rec.custom_operator_paths, "ops/my_ops.py", "/opt/more_ops");
    ASSERT_STRV(&rec.warnings, EXEC_WARNING, SAVE_DIR_WARNING("image_captioning_mapper"));
    ck_assert_str_eq(rec.dataset_path, "/data/in");
    ck_assert(rec.dataset_path_valid);
    ck_assert_str_eq(rec.ray_address, "ray://head:10001");
    recipe_free(&rec);
    free(path);
}
END_TEST

START_TEST(test_free_zeroed)
{
    struct recipe z;

    memset(&z, 0, sizeof(z));
    recipe_free(&z);
    recipe_free(&z);
    recipe_free(NULL);
    accept("process: [a_mapper: {index_key: k}]\nray_address: x\n");
    recipe_free(&rec);
    /* recipe_free leaves a zeroed struct, so freeing again is harmless */
    recipe_free(&rec);
    ck_assert_ptr_null(rec.executor_type);
    ck_assert_uint_eq(rec.ops.n, 0);
}
END_TEST

/* ---- reading files ---- */

START_TEST(test_load_missing)
{
    char *dir = tu_tmpdir();
    char *missing = fs_join(dir, "nope.yaml");
    char *under_file, *fifo, *file;

    ck_assert_int_eq(recipe_load(missing, NULL, &rec, &err), -ENOENT);
    ck_assert_msg(strstr(err.msg, "Recipe does not exist: ") == err.msg, "%s", err.msg);
    ck_assert_str_eq(err.msg + strlen("Recipe does not exist: "), missing);

    /* a directory and a FIFO are not regular files */
    ck_assert_int_eq(recipe_load(dir, NULL, &rec, &err), -ENOENT);
    ck_assert_str_eq(err.msg + strlen("Recipe does not exist: "), dir);
    fifo = fs_join(dir, "fifo.yaml");
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    ck_assert_int_eq(recipe_load(fifo, NULL, &rec, &err), -ENOENT);
    ck_assert_str_eq(err.msg + strlen("Recipe does not exist: "), fifo);

    /* a path through a regular file */
    file = tu_write(dir, "f", "process: []\n", (size_t)-1);
    under_file = fs_join(file, "r.yaml");
    ck_assert_int_eq(recipe_load(under_file, NULL, &rec, &err), -ENOENT);
    ck_assert_str_eq(err.msg + strlen("Recipe does not exist: "), under_file);

    fs_rm_rf(dir);
    free(under_file);
    free(file);
    free(fifo);
    free(missing);
    free(dir);
}
END_TEST

START_TEST(test_load_unreadable)
{
    char *dir = tu_tmpdir();
    char *path = tu_write(dir, "r.yaml", "process: []\n", (size_t)-1);
    char want[4096];
    int rc;

    ck_assert_int_eq(chmod(path, 0), 0);
    rc = recipe_load(path, NULL, &rec, &err);
    if (geteuid() == 0) {
        /* root reads it anyway */
        ck_assert_int_eq(rc, 0);
        recipe_free(&rec);
    } else {
        ck_assert_int_eq(rc, -EACCES);
        snprintf(want, sizeof(want), "cannot open recipe %s: Permission denied", path);
        ck_assert_str_eq(err.msg, want);
    }
    fs_rm_rf(dir);
    free(path);
    free(dir);
}
END_TEST

START_TEST(test_too_large)
{
    struct recipe_policy pol = { NULL, NULL, { 100, 0, 0 }, false };
    char *dir = tu_tmpdir();
    char *big = xmalloc(RECIPE_MAX_BYTES + 2);
    char *path, want[4096];

    /* file cap from the policy, and the default cap */
    memset(big, '#', RECIPE_MAX_BYTES + 1);
    big[RECIPE_MAX_BYTES + 1] = '\0';
    path = tu_write(dir, "big.yaml", big, 101);
    ck_assert_int_eq(recipe_load(path, &pol, &rec, &err), -EFBIG);
    snprintf(want, sizeof(want), "recipe %s is larger than 100 bytes", path);
    ck_assert_str_eq(err.msg, want);
    free(path);
    path = tu_write(dir, "big.yaml", big, RECIPE_MAX_BYTES + 1);
    ck_assert_int_eq(recipe_load(path, NULL, &rec, &err), -EFBIG);
    snprintf(want, sizeof(want), "recipe %s is larger than 4194304 bytes", path);
    ck_assert_str_eq(err.msg, want);

    /* exactly at the cap is fine */
    memcpy(big, "process: []\n", 12);
    free(path);
    path = tu_write(dir, "big.yaml", big, 100);
    ck_assert_int_eq(recipe_load(path, &pol, &rec, &err), 0);
    recipe_free(&rec);

    /* buffers too */
    ck_assert_int_eq(recipe_parse(big, RECIPE_MAX_BYTES + 1, "r.yaml", NULL, &rec, &err), -EFBIG);
    ck_assert_str_eq(err.msg, "recipe r.yaml is larger than 4194304 bytes");
    ck_assert_int_eq(recipe_parse(big, RECIPE_MAX_BYTES, "r.yaml", NULL, &rec, &err), 0);
    recipe_free(&rec);
    ck_assert_str_eq(refuse_pol("process: []\n# padding ........................................."
                                "..........................................................\n",
                                &pol),
                     "recipe r.yaml is larger than 100 bytes");

    fs_rm_rf(dir);
    free(path);
    free(big);
    free(dir);
}
END_TEST

START_TEST(test_load_fixture_errors)
{
    static const struct {
        const char *file, *msg;
    } cases[] = {
        { "recipes/whole-dataset.yaml",
          "Operator 'document_deduplicator' in @:5 requires or may require whole-dataset "
          "semantics and cannot run per shard" },
        { "recipes/tab-indent.yaml",
          "invalid YAML in @:3: found character that cannot start any token (while scanning "
          "for the next token)" },
        { "recipes/billion-laughs.yaml",
          "recipe @: too many YAML nodes (alias expansion?), limit 200000" },
        { "recipes/multi-doc.yaml",
          "recipe @:3: only a single YAML document is allowed, found another" },
        { "recipes/not-mapping.yaml", "recipe @ must be a mapping" },
    };
    char want[4096];
    const char *at;

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char *path = tu_data(cases[i].file);

        memset(&rec, 0xa5, sizeof(rec));
        ck_assert_int_eq(recipe_load(path, NULL, &rec, &err), -EINVAL);
        /* "@" stands for the path */
        at = strchr(cases[i].msg, '@');
        snprintf(want, sizeof(want), "%.*s%s%s", (int)(at - cases[i].msg), cases[i].msg, path,
                 at + 1);
        ck_assert_str_eq(err.msg, want);
        ck_assert_uint_eq(((unsigned char *)&rec)[0], 0xa5);
        free(path);
    }
}
END_TEST

/* ---- YAML structure ---- */

START_TEST(test_not_mapping)
{
    ck_assert_str_eq(refuse("- process: []\n"), "recipe r.yaml must be a mapping");
    ck_assert_str_eq(refuse("process\n"), "recipe r.yaml must be a mapping");
    ck_assert_str_eq(refuse("~\n"), "recipe r.yaml must be a mapping");
    ck_assert_str_eq(refuse("'x'\n"), "recipe r.yaml must be a mapping");
    /* empty stream, comments only, empty document: safe_load gives None */
    ck_assert_str_eq(refuse(""), "recipe r.yaml must be a mapping");
    ck_assert_str_eq(refuse("# nothing\n\n"), "recipe r.yaml must be a mapping");
    ck_assert_str_eq(refuse("---\n"), "recipe r.yaml must be a mapping");
    ck_assert_str_eq(refuse("--- \n...\n"), "recipe r.yaml must be a mapping");
    ck_assert_int_eq(recipe_parse(NULL, 0, "r.yaml", NULL, &rec, &err), -EINVAL);
    ck_assert_str_eq(err.msg, "recipe r.yaml must be a mapping");
}
END_TEST

START_TEST(test_multiple_documents)
{
    ck_assert_str_eq(refuse("process: []\n---\nprocess: []\n"),
                     "recipe r.yaml:2: only a single YAML document is allowed, found another");
    ck_assert_str_eq(refuse("--- {process: []}\n--- \n"),
                     "recipe r.yaml:2: only a single YAML document is allowed, found another");
    ck_assert_str_eq(refuse("process: []\n...\n---\nx: 1\n"),
                     "recipe r.yaml:3: only a single YAML document is allowed, found another");
    /* one explicit document, with an end marker, is fine */
    accept("%YAML 1.1\n---\nprocess: []\n...\n");
    recipe_free(&rec);
}
END_TEST

START_TEST(test_invalid_yaml)
{
    ck_assert_str_eq(refuse("executor_type: ray\nprocess:\n\t- a_mapper:\n"),
                     "invalid YAML in r.yaml:3: found character that cannot start any token "
                     "(while scanning for the next token)");
    ck_assert_str_eq(refuse("process: [a_mapper\n\n"),
                     "invalid YAML in r.yaml:3: did not find expected ',' or ']' (while "
                     "parsing a flow sequence)");
    ck_assert_str_eq(refuse("a: 1\n b: 2\n"),
                     "invalid YAML in r.yaml:2: mapping values are not allowed in this context");
    ck_assert_str_eq(refuse("process: []\nx: 'unterminated\n"),
                     "invalid YAML in r.yaml:3: found unexpected end of stream (while scanning a "
                     "quoted scalar)");
    /* reader errors carry a byte offset; the line is computed from it */
    ck_assert_str_eq(refuse("process: []\n\nx: \xff\n"),
                     "invalid YAML in r.yaml:3: invalid leading UTF-8 octet at byte 16");
    ck_assert_str_eq(refuse("process: []\nx: \x01\n"),
                     "invalid YAML in r.yaml:2: control characters are not allowed at byte 15");
}
END_TEST

START_TEST(test_alias_bomb)
{
    struct recipe_policy pol = { NULL, NULL, { 0, 0, 0 }, false };
    double t0 = now();
    char *path = tu_data("recipes/billion-laughs.yaml");
    char *text = tu_read(path, NULL);

    ck_assert_ptr_nonnull(text);
    ck_assert_str_eq(refuse(text),
                     "recipe r.yaml: too many YAML nodes (alias expansion?), limit 200000");
    /* zero limits are the defaults */
    ck_assert_str_eq(refuse_pol(text, &pol),
                     "recipe r.yaml: too many YAML nodes (alias expansion?), limit 200000");
    pol.limits.max_nodes = 1000;
    ck_assert_str_eq(refuse_pol(text, &pol),
                     "recipe r.yaml: too many YAML nodes (alias expansion?), limit 1000");
    ck_assert_msg(now() - t0 < 2.0, "alias bomb took %.2f s", now() - t0);
    free(text);
    free(path);
}
END_TEST

START_TEST(test_node_budget_counts_aliases)
{
    /* root 1, keys a b process 3, a's list 1+9, b's list 1+6*10, process's list 1: 76 */
    static const char y[] = "a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9]\n"
                            "b: [*a, *a, *a, *a, *a, *a]\n"
                            "process: []\n";
    struct recipe_policy pol = { NULL, NULL, { 0, 76, 0 }, false };

    accept_pol(y, &pol);
    recipe_free(&rec);
    pol.limits.max_nodes = 75;
    ck_assert_str_eq(refuse_pol(y, &pol),
                     "recipe r.yaml: too many YAML nodes (alias expansion?), limit 75");
    /* merges expand too */
    pol.limits.max_nodes = 10;
    ck_assert_str_eq(
        refuse_pol("m: &m {a: 1, b: 2, c: 3}\nx: {<<: *m}\ny: {<<: *m}\nprocess: []\n", &pol),
        "recipe r.yaml: too many YAML nodes (alias expansion?), limit 10");
}
END_TEST

START_TEST(test_recursive_alias)
{
    double t0 = now();

    ck_assert_str_eq(refuse("a: &a [*a]\nprocess: []\n"),
                     "recipe r.yaml:1: recursive alias 'a' is not supported");
    ck_assert_str_eq(refuse("process: []\nb: &b\n  c: 1\n  d: [x, {e: *b}]\n"),
                     "recipe r.yaml:4: recursive alias 'b' is not supported");
    ck_assert_str_eq(refuse("c: &c {<<: *c}\nprocess: []\n"),
                     "recipe r.yaml:1: recursive alias 'c' is not supported");
    ck_assert_str_eq(refuse("&r {process: [], self: *r}\n"),
                     "recipe r.yaml:1: recursive alias 'r' is not supported");
    ck_assert_str_eq(refuse("process: &p [{a_mapper: *p}]\n"),
                     "recipe r.yaml:1: recursive alias 'p' is not supported");
    ck_assert_msg(now() - t0 < 2.0, "recursive aliases took %.2f s", now() - t0);
}
END_TEST

START_TEST(test_anchor_errors)
{
    ck_assert_str_eq(refuse("a: *nope\nprocess: []\n"),
                     "recipe r.yaml:1: found undefined alias 'nope'");
    ck_assert_str_eq(refuse("a: &x 1\nb: &x 2\nprocess: []\n"),
                     "recipe r.yaml:2: found duplicate anchor 'x'");
    /* an anchor used before its definition is undefined */
    ck_assert_str_eq(refuse("b: *late\na: &late 1\nprocess: []\n"),
                     "recipe r.yaml:1: found undefined alias 'late'");
    accept("a: &x [1]\nb: *x\nprocess: []\n");
    recipe_free(&rec);
}
END_TEST

START_TEST(test_deep_nesting)
{
    struct recipe_policy pol = { NULL, NULL, { 0, 0, 3 }, false };
    size_t n = 100000;
    char *deep = xmalloc(2 * n + 64), *p = deep;
    double t0 = now();

    /* the root mapping is level 1 */
    accept_pol("x: [[]]\nprocess: []\n", &pol);
    recipe_free(&rec);
    ck_assert_str_eq(refuse_pol("process: []\ny: [[]]\nx:\n  - [[1]]\n", &pol),
                     "recipe r.yaml:4: YAML nesting deeper than 3 levels");
    /* an alias brings its own height */
    ck_assert_str_eq(refuse_pol("a: &a [[1]]\nprocess: []\nb: [*a]\n", &pol),
                     "recipe r.yaml:3: YAML nesting deeper than 3 levels");
    accept_pol("a: &a [[1]]\nprocess: []\nb: *a\n", &pol);
    recipe_free(&rec);

    /* default: 64 levels */
    p += sprintf(p, "process: []\nx: ");
    for (size_t i = 0; i < 63; i++)
        *p++ = '[';
    for (size_t i = 0; i < 63; i++)
        *p++ = ']';
    strcpy(p, "\n");
    accept(deep);
    recipe_free(&rec);
    p = deep + sprintf(deep, "process: []\nx: ");
    for (size_t i = 0; i < n; i++)
        *p++ = '[';
    for (size_t i = 0; i < n; i++)
        *p++ = ']';
    strcpy(p, "\n");
    ck_assert_str_eq(refuse(deep), "recipe r.yaml:2: YAML nesting deeper than 64 levels");
    p = deep;
    for (size_t i = 0; i < n; i++)
        p += sprintf(p, "- ");
    strcpy(p, "x\n");
    ck_assert_str_eq(refuse(deep), "recipe r.yaml:1: YAML nesting deeper than 64 levels");
    ck_assert_msg(now() - t0 < 5.0, "deep nesting took %.2f s", now() - t0);
    free(deep);
}
END_TEST

START_TEST(test_construct_errors)
{
    /* what makes yaml.safe_load raise */
    ck_assert_str_eq(refuse("process: []\nx: !foo bar\n"),
                     "recipe r.yaml:2: unsupported YAML tag '!foo' on a scalar");
    ck_assert_str_eq(refuse("process: !!set {a: ~}\n"),
                     "recipe r.yaml:1: unsupported YAML tag 'tag:yaml.org,2002:set' on a mapping");
    ck_assert_str_eq(refuse("process: !!seq x\n"),
                     "recipe r.yaml:1: unsupported YAML tag 'tag:yaml.org,2002:seq' on a scalar");
    ck_assert_str_eq(refuse("process: []\nx: !!int abc\n"),
                     "recipe r.yaml:2: cannot construct a int from 'abc'");
    ck_assert_str_eq(refuse("process: []\nx: !!bool maybe\n"),
                     "recipe r.yaml:2: cannot construct a bool from 'maybe'");
    ck_assert_str_eq(refuse("process: []\nx: !!float abc\n"),
                     "recipe r.yaml:2: cannot construct a float from 'abc'");
    ck_assert_str_eq(refuse("process: []\nx: 0b_\n"),
                     "recipe r.yaml:2: cannot construct a int from '0b_'");
    ck_assert_str_eq(refuse("process: []\nx: 2001-02-29\n"),
                     "recipe r.yaml:2: cannot construct a timestamp from '2001-02-29'");
    ck_assert_str_eq(refuse("process: []\n? [a]\n: 1\n"),
                     "recipe r.yaml:2: found unhashable key (a sequence used as a key)");
    ck_assert_str_eq(refuse("process: []\nx: {{a: 1}: 2}\n"),
                     "recipe r.yaml:2: found unhashable key (a mapping used as a key)");
    ck_assert_str_eq(refuse("process: []\nx: =\n"),
                     "recipe r.yaml:2: '=' can only be used as a mapping key (quote it)");
    ck_assert_str_eq(refuse("process: [<<]\n"),
                     "recipe r.yaml:1: '<<' can only be used as a mapping key (quote it)");
    /* Python 3.11 refuses to turn more than 4300 decimal digits into an int */
    {
        char y[5000];

        memcpy(y, "process: []\nx: ", 15);
        memset(y + 15, '7', 4301);
        strcpy(y + 15 + 4301, "\n");
        ck_assert_msg(strstr(refuse(y), "recipe r.yaml:2: cannot construct a int from '777") ==
                          err.msg,
                      "%s", err.msg);
        y[15 + 4300] = '\n';
        y[15 + 4301] = '\0';
        accept(y);
        recipe_free(&rec);
    }
    /* fine: a plain '=' key, quoted values, the non-specific tag */
    accept("process: []\n=: 1\nx: '='\ny: '<<'\nz: ! 12\n");
    recipe_free(&rec);
}
END_TEST

/* ---- executor_type and process ---- */

START_TEST(test_executor_type)
{
    accept("executor_type: ray\nprocess: []\n");
    ck_assert_str_eq(rec.executor_type, "ray");
    ck_assert_uint_eq(rec.warnings.n, 0);
    recipe_free(&rec);
    accept("executor_type: 'ray'\nprocess: []\n");
    ck_assert_str_eq(rec.executor_type, "ray");
    recipe_free(&rec);
    accept("process: []\nexecutor_type: !!str default\n");
    ck_assert_str_eq(rec.executor_type, "default");
    ASSERT_STRV(&rec.warnings, EXEC_WARNING);
    recipe_free(&rec);

    ck_assert_str_eq(refuse("process: []\n\n\nexecutor_type: spark\n"),
                     "recipe r.yaml:4: executor_type must be 'default' or 'ray', got 'spark'");
    ck_assert_str_eq(refuse("executor_type: Ray\nprocess: []\n"),
                     "recipe r.yaml:1: executor_type must be 'default' or 'ray', got 'Ray'");
    ck_assert_str_eq(refuse("executor_type: ~\nprocess: []\n"),
                     "recipe r.yaml:1: executor_type must be 'default' or 'ray', got None");
    ck_assert_str_eq(refuse("executor_type:\nprocess: []\n"),
                     "recipe r.yaml:1: executor_type must be 'default' or 'ray', got None");
    ck_assert_str_eq(refuse("executor_type: [ray]\nprocess: []\n"),
                     "recipe r.yaml:1: executor_type must be 'default' or 'ray', got ['ray']");
    ck_assert_str_eq(refuse("executor_type: yes\nprocess: []\n"),
                     "recipe r.yaml:1: executor_type must be 'default' or 'ray', got True");
    /* checked before process */
    ck_assert_str_eq(refuse("executor_type: 'ray '\n"),
                     "recipe r.yaml:1: executor_type must be 'default' or 'ray', got 'ray '");
}
END_TEST

START_TEST(test_process_list)
{
    ck_assert_str_eq(refuse("executor_type: ray\n"), "recipe r.yaml: 'process' must be a list");
    ck_assert_str_eq(refuse("executor_type: ray\nprocess:\n"),
                     "recipe r.yaml:2: 'process' must be a list, not a null");
    ck_assert_str_eq(refuse("process: {a_mapper: ~}\n"),
                     "recipe r.yaml:1: 'process' must be a list, not a mapping");
    ck_assert_str_eq(refuse("process: a_mapper\n"),
                     "recipe r.yaml:1: 'process' must be a list, not a scalar");
    /* "process" quoted is the same key; not-a-string keys are others */
    accept("'process': []\n");
    recipe_free(&rec);
    ck_assert_str_eq(refuse("? !!null process\n: []\n"), "recipe r.yaml: 'process' must be a list");
    /* later duplicate keys win */
    accept("process: x\nprocess: [a_mapper: ~]\n");
    ASSERT_STRV(&rec.ops, "a_mapper");
    recipe_free(&rec);
    ck_assert_str_eq(refuse("process: [a_mapper: ~]\nprocess: 1\n"),
                     "recipe r.yaml:2: 'process' must be a list, not a scalar");
}
END_TEST

START_TEST(test_process_items)
{
    ck_assert_str_eq(refuse("process:\n  - a_mapper\n"),
                     "process[0] in r.yaml:2 must contain exactly one operator");
    ck_assert_str_eq(refuse("process:\n  - a_mapper: ~\n  - a_mapper: ~\n    b_filter: ~\n"),
                     "process[1] in r.yaml:3 must contain exactly one operator");
    ck_assert_str_eq(refuse("process:\n- a_mapper:\n- {}\n"),
                     "process[1] in r.yaml:3 must contain exactly one operator");
    ck_assert_str_eq(refuse("process:\n- a_mapper:\n-\n- [a_mapper]\n"),
                     "process[1] in r.yaml:3 must contain exactly one operator");
    ck_assert_str_eq(refuse("process:\n- a_mapper:\n- b_filter:\n- {x_mapper: ~, 1: ~}\n"),
                     "process[2] in r.yaml:4 must contain exactly one operator");
    /* the same key twice is one key, holding the later value */
    accept("process:\n- a_mapper: {index_key: first}\n  a_mapper: {index_key: second}\n");
    ASSERT_STRV(&rec.ops, "a_mapper");
    ASSERT_STRV(&rec.index_keys, "second");
    recipe_free(&rec);
    /* 1 and 1.0 and True are one dict key for Python: still not a name */
    ck_assert_str_eq(refuse("process:\n- {1: ~, 1.0: ~, true: ~}\n"),
                     "Unknown operator '1' in r.yaml:2; cannot prove it is shard-safe");

    ck_assert_str_eq(refuse("process:\n- a_mapper: 5\n"),
                     "Operator 'a_mapper' in r.yaml:2: its arguments must be a mapping or null, "
                     "not a scalar");
    ck_assert_str_eq(refuse("process:\n- a_mapper:\n  - x\n"),
                     "Operator 'a_mapper' in r.yaml:3: its arguments must be a mapping or null, "
                     "not a sequence");
    ck_assert_str_eq(refuse("process:\n- a_mapper: ''\n"),
                     "Operator 'a_mapper' in r.yaml:2: its arguments must be a mapping or null, "
                     "not a scalar");
    accept("process:\n- a_mapper: {}\n- b_filter:\n- c_mapper: ~\n");
    ASSERT_STRV(&rec.ops, "a_mapper", "b_filter", "c_mapper");
    recipe_free(&rec);
}
END_TEST

/* ---- operator names ---- */

START_TEST(test_classify)
{
    static const struct {
        const char *name;
        int rc;
    } cases[] = {
        { "clean_html_mapper", 0 },
        { "text_length_filter", 0 },
        { "Text_Length_FILTER", 0 },
        { "_mapper", 0 },
        { "document_deduplicator", -EPERM },
        { "document_minhash_deduplicator", -EPERM },
        { "deduplicator_mapper", -EPERM },
        { "ray_bts_minhash_deduplicator", -EPERM },
        { "Document_Deduplicator", -EPERM },
        { "topk_specified_field_selector", -EPERM },
        { "naive_grouper", -EPERM },
        { "entity_attribute_aggregator", -EPERM },
        { "global_foo_filter", -EPERM },
        { "my_global_stats_mapper", -EPERM },
        { "GLOBAL_x_mapper", -EPERM },
        { "full_dataset_mapper", -EPERM },
        { "x_full_dataset_filter", -EPERM },
        { "foo_op", -ENOENT },
        { "mapper", -ENOENT },
        { "filter", -ENOENT },
        { "a_mapper_v2", -ENOENT },
        { "a_mapper ", -ENOENT },
        { "globalfoo_filter", 0 },
        { "", -ENOENT },
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        ck_assert_msg(recipe_classify(cases[i].name) == cases[i].rc, "%s: %d", cases[i].name,
                      recipe_classify(cases[i].name));
    ck_assert_int_eq(recipe_classify(NULL), -ENOENT);
}
END_TEST

START_TEST(test_unknown_operator)
{
    ck_assert_str_eq(refuse("executor_type: ray\nprocess:\n  - a_mapper:\n  - b_filter:\n\n\n"
                            "  - foo_op:\n"),
                     "Unknown operator 'foo_op' in r.yaml:7; cannot prove it is shard-safe");
    ck_assert_str_eq(refuse("process:\n- 12: ~\n"),
                     "Unknown operator '12' in r.yaml:2; cannot prove it is shard-safe");
    ck_assert_str_eq(refuse("process:\n- ~: {}\n"),
                     "Unknown operator 'None' in r.yaml:2; cannot prove it is shard-safe");
    ck_assert_str_eq(refuse("process:\n- \"a_mapper\\0x\": {}\n"),
                     "Unknown operator 'a_mapper' in r.yaml:2; cannot prove it is shard-safe");
    /* the name is typed too: a string that merely looks like a mapper is fine */
    accept("process:\n- '1_mapper': ~\n");
    recipe_free(&rec);
}
END_TEST

START_TEST(test_whole_dataset)
{
    ck_assert_str_eq(refuse("executor_type: ray\nprocess:\n- a_mapper:\n\n"
                            "- document_deduplicator:\n"),
                     "Operator 'document_deduplicator' in r.yaml:5 requires or may require "
                     "whole-dataset semantics and cannot run per shard");
    ck_assert_str_eq(refuse("process:\n- global_foo_filter: {}\n"),
                     "Operator 'global_foo_filter' in r.yaml:2 requires or may require "
                     "whole-dataset semantics and cannot run per shard");
    ck_assert_str_eq(refuse("process:\n- topk_specified_field_selector: {topk: 3}\n"),
                     "Operator 'topk_specified_field_selector' in r.yaml:2 requires or may require "
                     "whole-dataset semantics and cannot run per shard");
}
END_TEST

START_TEST(test_is_global_operation)
{
    static const char *const truthy[] = { "yes", "true", "On",     "1",    "'no'",
                                          "x",   "[0]",  "{a: ~}", ".nan", "0x1" };
    static const char *const falsy[] = { "no", "false", "OFF", "0",  "0.0", "''",  "~",
                                         "[]", "{}",    "0x0", "-0", "0b0", "0_0", ".0" };
    char y[256];

    for (size_t i = 0; i < sizeof(truthy) / sizeof(truthy[0]); i++) {
        snprintf(y, sizeof(y), "process:\n- a_mapper:\n    x: 1\n    is_global_operation: %s\n",
                 truthy[i]);
        ck_assert_str_eq(refuse(y), "Operator 'a_mapper' in r.yaml:4 requires or may require "
                                    "whole-dataset semantics and cannot run per shard "
                                    "(is_global_operation is set)");
    }
    for (size_t i = 0; i < sizeof(falsy) / sizeof(falsy[0]); i++) {
        snprintf(y, sizeof(y), "process:\n- a_mapper:\n    is_global_operation: %s\n", falsy[i]);
        accept(y);
        recipe_free(&rec);
    }
}
END_TEST

START_TEST(test_deny_allow)
{
    struct strv allow, deny;
    struct recipe_policy pol = { &allow, &deny, { 0, 0, 0 }, false };

    strv_init(&allow);
    strv_init(&deny);
    strv_push(&allow, "foo_op");
    strv_push(&allow, "document_deduplicator");
    strv_push(&allow, "both_mapper");
    strv_push(&deny, "text_length_filter");
    strv_push(&deny, "both_mapper");

    accept_pol("process:\n- foo_op:\n- document_deduplicator: {}\n- a_mapper:\n", &pol);
    ASSERT_STRV(&rec.ops, "foo_op", "document_deduplicator", "a_mapper");
    recipe_free(&rec);
    ck_assert_str_eq(
        refuse_pol("process:\n- a_mapper:\n- text_length_filter: {min_len: 3}\n", &pol),
        "Operator 'text_length_filter' in r.yaml:3 is denied by configuration and "
        "cannot run per shard");
    /* deny wins over allow */
    ck_assert_str_eq(refuse_pol("process:\n- both_mapper:\n", &pol),
                     "Operator 'both_mapper' in r.yaml:2 is denied by configuration and cannot "
                     "run per shard");
    /* exact names only */
    ck_assert_str_eq(refuse_pol("process:\n- Foo_Op:\n", &pol),
                     "Unknown operator 'Foo_Op' in r.yaml:2; cannot prove it is shard-safe");
    /* an allowed operator still may not declare itself global */
    ck_assert_str_eq(refuse_pol("process:\n- foo_op: {is_global_operation: true}\n", &pol),
                     "Operator 'foo_op' in r.yaml:2 requires or may require whole-dataset "
                     "semantics and cannot run per shard (is_global_operation is set)");
    /* empty lists change nothing */
    strv_free(&allow);
    strv_free(&deny);
    ck_assert_str_eq(refuse_pol("process:\n- foo_op:\n", &pol),
                     "Unknown operator 'foo_op' in r.yaml:2; cannot prove it is shard-safe");
}
END_TEST

/* The built-in exceptions to the name rule, and their place among the lists. */
START_TEST(test_verdict)
{
    static const struct {
        const char *name;
        int rc;
    } cases[] = {
        /* built-in allow: Mapper subclasses whose names end in "_op" */
        { "general_fused_op", 0 },
        { "fused_sequential_batch_op", 0 },
        /* built-in deny: Pipeline subclasses */
        { "ray_repartition_pipeline", -EPERM },
        { "llm_ray_vllm_engine_pipeline", -EPERM },
        { "vlm_ray_vllm_engine_pipeline", -EPERM },
        /* exact names only */
        { "General_Fused_Op", -ENOENT },
        { "general_fused_op ", -ENOENT },
        { "ray_repartition_pipelines", -ENOENT },
        { "other_pipeline", -ENOENT },
        /* everything else is the name rule */
        { "clean_links_mapper", 0 },
        { "text_length_filter", 0 },
        { "ray_document_deduplicator", -EPERM },
        { "naive_grouper", -EPERM },
        { "foo_op", -ENOENT },
        { "", -ENOENT },
    };
    struct strv allow, deny;
    struct recipe_policy pol = { &allow, &deny, { 0, 0, 0 }, false };

    strv_init(&allow);
    strv_init(&deny);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ck_assert_msg(recipe_verdict(cases[i].name, NULL) == cases[i].rc, "%s: %d", cases[i].name,
                      recipe_verdict(cases[i].name, NULL));
        /* empty caller lists change nothing */
        ck_assert_int_eq(recipe_verdict(cases[i].name, &pol), cases[i].rc);
    }
    ck_assert_int_eq(recipe_verdict(NULL, NULL), -ENOENT);
    /* recipe_classify stays the pure name rule */
    ck_assert_int_eq(recipe_classify("general_fused_op"), -ENOENT);
    ck_assert_int_eq(recipe_classify("ray_repartition_pipeline"), -ENOENT);

    /* the caller's lists come first, deny before allow */
    strv_push(&deny, "general_fused_op");
    strv_push(&allow, "ray_repartition_pipeline");
    strv_push(&allow, "fused_sequential_batch_op");
    strv_push(&deny, "fused_sequential_batch_op");
    ck_assert_int_eq(recipe_verdict("general_fused_op", &pol), -EPERM);
    ck_assert_int_eq(recipe_verdict("ray_repartition_pipeline", &pol), 0);
    ck_assert_int_eq(recipe_verdict("fused_sequential_batch_op", &pol), -EPERM);
    ck_assert_int_eq(recipe_verdict("vlm_ray_vllm_engine_pipeline", &pol), -EPERM);
    strv_free(&allow);
    strv_free(&deny);
}
END_TEST

/* recipe_parse decides through recipe_verdict, with the matching messages. */
START_TEST(test_builtin_lists)
{
    struct strv allow, deny;
    struct recipe_policy pol = { &allow, &deny, { 0, 0, 0 }, false };

    accept("process:\n- general_fused_op: {batch_size: 2}\n- fused_sequential_batch_op:\n"
           "- a_mapper:\n");
    ASSERT_STRV(&rec.ops, "general_fused_op", "fused_sequential_batch_op", "a_mapper");
    recipe_free(&rec);
    ck_assert_str_eq(refuse("process:\n- a_mapper:\n- ray_repartition_pipeline: {}\n"),
                     "Operator 'ray_repartition_pipeline' in r.yaml:3 requires or may require "
                     "whole-dataset semantics and cannot run per shard");
    ck_assert_str_eq(refuse("process:\n- Ray_Repartition_Pipeline:\n"),
                     "Unknown operator 'Ray_Repartition_Pipeline' in r.yaml:2; cannot prove it is "
                     "shard-safe");
    /* a built-in allowed operator still may not declare itself global */
    ck_assert_str_eq(refuse("process:\n- general_fused_op: {is_global_operation: yes}\n"),
                     "Operator 'general_fused_op' in r.yaml:2 requires or may require "
                     "whole-dataset semantics and cannot run per shard (is_global_operation is "
                     "set)");

    strv_init(&allow);
    strv_init(&deny);
    strv_push(&deny, "general_fused_op");
    strv_push(&allow, "ray_repartition_pipeline");
    ck_assert_str_eq(refuse_pol("process:\n- general_fused_op:\n", &pol),
                     "Operator 'general_fused_op' in r.yaml:2 is denied by configuration and "
                     "cannot run per shard");
    accept_pol("process:\n- ray_repartition_pipeline:\n", &pol);
    ASSERT_STRV(&rec.ops, "ray_repartition_pipeline");
    recipe_free(&rec);
    strv_free(&allow);
    strv_free(&deny);
}
END_TEST

/* Operators inside a fused operator are checked like listed ones. */
START_TEST(test_fused_operators_checked_inside)
{
    accept("process:\n- general_fused_op:\n    fused_op_list:\n    - a_mapper:\n"
           "    - b_filter: {index_key: idx}\n- fused_sequential_batch_op:\n"
           "    op_specs: [{c_mapper: {}}]\n");
    ASSERT_STRV(&rec.ops, "general_fused_op", "a_mapper", "b_filter", "fused_sequential_batch_op",
                "c_mapper");
    ASSERT_STRV(&rec.index_keys, "idx");
    recipe_free(&rec);
    ck_assert_str_eq(refuse("process:\n- general_fused_op:\n    fused_op_list:\n"
                            "    - a_mapper:\n    - document_deduplicator:\n"),
                     "Operator 'document_deduplicator' in r.yaml:5 requires or may require "
                     "whole-dataset semantics and cannot run per shard");
    ck_assert_str_eq(refuse("process:\n- fused_sequential_batch_op:\n    op_specs:\n"
                            "    - mystery_op:\n"),
                     "Unknown operator 'mystery_op' in r.yaml:4; cannot prove it is shard-safe");
    ck_assert_str_eq(refuse("process:\n- general_fused_op:\n    fused_op_list: a_mapper\n"),
                     "Operator 'general_fused_op' in r.yaml:3: fused_op_list must be a list");
    /* nested fused operators are checked all the way down */
    ck_assert_str_eq(refuse("process:\n- general_fused_op:\n    fused_op_list:\n"
                            "    - general_fused_op:\n        fused_op_list: [{x_selector: }]\n"),
                     "Operator 'x_selector' in r.yaml:5 requires or may require whole-dataset "
                     "semantics and cannot run per shard");
}
END_TEST

/* ---- per-operator arguments ---- */

START_TEST(test_stats_export_path)
{
    static const char *const falsy[] = { "''", "~", "off", "no", "0", "0.0", "[]", "{}", "\"\"" };
    char y[256];

    ck_assert_str_eq(refuse("executor_type: ray\nprocess:\n- a_mapper:\n"
                            "- x_filter:\n    min: 1\n    stats_export_path: /tmp/stats.jsonl\n"),
                     "Operator 'x_filter' in r.yaml:6 sets stats_export_path, which cannot be "
                     "used per shard");
    /* YAML 1.1 strings that look like numbers are truthy */
    ck_assert_str_eq(refuse("process:\n- x_filter: {stats_export_path: 0e0}\n"),
                     "Operator 'x_filter' in r.yaml:2 sets stats_export_path, which cannot be "
                     "used per shard");
    ck_assert_str_eq(refuse("process:\n- x_filter: {stats_export_path: 'off'}\n"),
                     "Operator 'x_filter' in r.yaml:2 sets stats_export_path, which cannot be "
                     "used per shard");
    for (size_t i = 0; i < sizeof(falsy) / sizeof(falsy[0]); i++) {
        snprintf(y, sizeof(y), "process:\n- x_filter:\n    stats_export_path: %s\n", falsy[i]);
        accept(y);
        ck_assert_uint_eq(rec.warnings.n, 1);
        recipe_free(&rec);
    }
}
END_TEST

START_TEST(test_save_dir)
{
    accept("process:\n- a_mapper: {save_dir: off}\n- b_mapper: {save_dir: ''}\n"
           "- c_mapper: {save_dir: ~}\n- d_mapper: {save_dir: No}\n- e_mapper: {save_dir: 0}\n");
    ASSERT_STRV(&rec.warnings, EXEC_WARNING);
    recipe_free(&rec);
    /* warnings: executor first, then save_dir in operator order */
    accept("process:\n- b_mapper: {save_dir: \"off\"}\n- a_mapper: {save_dir: /shared}\n"
           "- c_mapper: {save_dir: n}\n- d_mapper: {}\n- e_mapper: {save_dir: [x]}\n");
    ASSERT_STRV(&rec.warnings, EXEC_WARNING, SAVE_DIR_WARNING("b_mapper"),
                SAVE_DIR_WARNING("a_mapper"), SAVE_DIR_WARNING("c_mapper"),
                SAVE_DIR_WARNING("e_mapper"));
    recipe_free(&rec);
    accept("executor_type: ray\nprocess:\n- a_mapper: {save_dir: 'off'}\n");
    ASSERT_STRV(&rec.warnings, SAVE_DIR_WARNING("a_mapper"));
    recipe_free(&rec);
}
END_TEST

START_TEST(test_index_key)
{
    accept(
        "process:\n- a_mapper: {index_key: b}\n- b_mapper: {index_key: a}\n"
        "- c_mapper: {index_key: b}\n- d_mapper: {index_key: ~}\n- e_mapper:\n"
        "- f_mapper: {index_key: B}\n- g_mapper: {index_key: _}\n- h_mapper: {index_key: 'yes'}\n"
        "- i_mapper: {index_key: \xc3\xa9}\n- j_mapper: {index_key: z}\n");
    /* strcmp order: upper case before '_' before lower case before UTF-8 */
    ASSERT_STRV(&rec.index_keys, "B", "_", "a", "b", "yes", "z", "\xc3\xa9");
    recipe_free(&rec);

    ck_assert_str_eq(refuse("process:\n- a_mapper:\n    index_key: ''\n"),
                     "Operator 'a_mapper' in r.yaml:3: index_key must be a non-empty string");
    ck_assert_str_eq(refuse("process:\n- a_mapper: {index_key: ok}\n- b_mapper: {index_key: 5}\n"),
                     "Operator 'b_mapper' in r.yaml:3: index_key must be a non-empty string");
    ck_assert_str_eq(refuse("process:\n- a_mapper: {index_key: yes}\n"),
                     "Operator 'a_mapper' in r.yaml:2: index_key must be a non-empty string");
    ck_assert_str_eq(refuse("process:\n- a_mapper:\n    index_key:\n      - id\n"),
                     "Operator 'a_mapper' in r.yaml:4: index_key must be a non-empty string");
    ck_assert_str_eq(refuse("process:\n- a_mapper: {index_key: \"a\\0b\"}\n"),
                     "recipe r.yaml:2: index_key contains a NUL character");
}
END_TEST

/* ---- top-level keys ---- */

START_TEST(test_media_keys)
{
    accept("image_key: pics\naudio_key: pics\nvideo_key: images\nprocess: []\n");
    ASSERT_STRV(&rec.media_keys, "pics", "images");
    recipe_free(&rec);
    accept("process: []\nvideo_key: audios\n");
    ASSERT_STRV(&rec.media_keys, "images", "audios");
    recipe_free(&rec);
    accept("process: []\nimage_key: x\naudio_key: x\nvideo_key: x\n");
    ASSERT_STRV(&rec.media_keys, "x");
    recipe_free(&rec);

    ck_assert_str_eq(refuse("process: []\nimage_key: ''\n"),
                     "recipe r.yaml:2: image_key must be a non-empty string");
    ck_assert_str_eq(refuse("process: []\n\naudio_key:\n"),
                     "recipe r.yaml:3: audio_key must be a non-empty string");
    ck_assert_str_eq(refuse("process: []\nvideo_key: 5\n"),
                     "recipe r.yaml:2: video_key must be a non-empty string");
    ck_assert_str_eq(refuse("process: []\nvideo_key: [v]\n"),
                     "recipe r.yaml:2: video_key must be a non-empty string");
    /* operators are checked first */
    ck_assert_str_eq(refuse("image_key: ''\nprocess: [foo_op: ~]\n"),
                     "Unknown operator 'foo_op' in r.yaml:2; cannot prove it is shard-safe");
}
END_TEST

START_TEST(test_custom_operator_paths)
{
    accept("process: []\ncustom_operator_paths: ops.py\n");
    ASSERT_STRV(&rec.custom_operator_paths, "ops.py");
    recipe_free(&rec);
    accept("process: []\ncustom-operator-paths: [a.py, ../b, '']\n");
    ASSERT_STRV(&rec.custom_operator_paths, "a.py", "../b", "");
    recipe_free(&rec);
    /* the underscore spelling wins when it is set */
    accept("process: []\ncustom-operator-paths: dash.py\ncustom_operator_paths: [under.py]\n");
    ASSERT_STRV(&rec.custom_operator_paths, "under.py");
    recipe_free(&rec);
    accept("process: []\ncustom-operator-paths: dash.py\ncustom_operator_paths: []\n");
    ASSERT_STRV(&rec.custom_operator_paths, "dash.py");
    recipe_free(&rec);
    accept("process: []\ncustom_operator_paths: ''\n");
    ck_assert_uint_eq(rec.custom_operator_paths.n, 0);
    recipe_free(&rec);

    ck_assert_str_eq(refuse("process: []\ncustom_operator_paths: [a.py, 1]\n"),
                     "recipe r.yaml:2: custom_operator_paths must be a string or a list of "
                     "strings");
    ck_assert_str_eq(refuse("process: []\n\ncustom-operator-paths: 5\n"),
                     "recipe r.yaml:3: custom-operator-paths must be a string or a list of "
                     "strings");
    ck_assert_str_eq(refuse("process: []\ncustom_operator_paths: {a: 1}\n"),
                     "recipe r.yaml:2: custom_operator_paths must be a string or a list of "
                     "strings");
}
END_TEST

START_TEST(test_dataset_path)
{
    static const struct {
        const char *yaml, *path;
        bool valid;
    } cases[] = {
        { "dataset_path: /data/in\n", "/data/in", true },
        { "dataset_path: ' x '\n", " x ", true },
        { "dataset_path: '  '\n", "  ", false },
        { "dataset_path: \"\\t\\n\"\n", "\t\n", false },
        { "dataset_path: \"\\u3000\\u00a0\"\n", "\xe3\x80\x80\xc2\xa0", false },
        { "dataset_path: ''\n", "", false },
        { "dataset_path: 5\n", "5", false },
        { "dataset_path: yes\n", "True", false },
        { "dataset_path: [a]\n", "['a']", false },
        { "dataset_path: ~\n", NULL, false },
        { "x: 1\n", NULL, false },
    };
    char y[256];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(y, sizeof(y), "process: []\n%s", cases[i].yaml);
        accept(y);
        if (cases[i].path)
            ck_assert_str_eq(rec.dataset_path, cases[i].path);
        else
            ck_assert_ptr_null(rec.dataset_path);
        ck_assert_msg(rec.dataset_path_valid == cases[i].valid, "%s", cases[i].yaml);
        recipe_free(&rec);
    }
    ck_assert_str_eq(refuse("process: []\ndataset_path: \"a\\0\"\n"),
                     "recipe r.yaml:2: dataset_path contains a NUL character");
}
END_TEST

/*
 * str() of ray_address for each scalar form, and its truthiness seen through
 * save_dir; expected values from PyYAML 6.0.3 safe_load on CPython 3.11.
 */
START_TEST(test_yaml11_scalars)
{
    static const struct {
        const char *yaml, *str;
        bool truthy;
    } cases[] = {
        /* null */
        { "~", "None", false },
        { "null", "None", false },
        { "Null", "None", false },
        { "NULL", "None", false },
        { "", "None", false },
        { "nULL", "nULL", true },
        /* bool */
        { "yes", "True", true },
        { "Yes", "True", true },
        { "YES", "True", true },
        { "no", "False", false },
        { "No", "False", false },
        { "NO", "False", false },
        { "true", "True", true },
        { "True", "True", true },
        { "TRUE", "True", true },
        { "false", "False", false },
        { "False", "False", false },
        { "FALSE", "False", false },
        { "on", "True", true },
        { "On", "True", true },
        { "ON", "True", true },
        { "off", "False", false },
        { "Off", "False", false },
        { "OFF", "False", false },
        { "yEs", "yEs", true },
        { "y", "y", true },
        { "n", "n", true },
        { "!!bool YeS", "True", true },
        { "!!bool oFF", "False", false },
        /* int */
        { "0", "0", false },
        { "-0", "0", false },
        { "+12", "12", true },
        { "1_000", "1000", true },
        { "0b1010", "10", true },
        { "-0b1_0", "-2", true },
        { "0b0", "0", false },
        { "017", "15", true },
        { "0_7", "7", true },
        { "0_0", "0", false },
        { "09", "09", true },
        { "0x1F", "31", true },
        { "0xff_ff", "65535", true },
        { "0x0", "0", false },
        { "-0x10", "-16", true },
        { "1:30", "90", true },
        { "-1:30:00", "-5400", true },
        { "190:20:30", "685230", true },
        { "1:60", "1:60", true },
        { "0:30", "0:30", true },
        { "0o17", "0o17", true },
        { "123456789012345678901234567890", "123456789012345678901234567890", true },
        { "0x123456789abcdef0123", "5373003642731685151011", true },
        { "-0b11111111111111111111111111111111111111111111111111111111111111111",
          "-36893488147419103231", true },
        { "!!int '0x10'", "16", true },
        /* float */
        { "1.5", "1.5", true },
        { "1.50", "1.5", true },
        { "1.", "1.0", true },
        { ".5", "0.5", true },
        { "0.0", "0.0", false },
        { "-0.0", "-0.0", false },
        { ".0", "0.0", false },
        { "0.", "0.0", false },
        { "1_0.5_0", "10.5", true },
        { "1.0e+5", "100000.0", true },
        { "1.e+5", "100000.0", true },
        { ".5e-3", "0.0005", true },
        { "1.0e5", "1.0e5", true },
        { "1e3", "1e3", true },
        { "0e0", "0e0", true },
        { "._", "._", true },
        { "1:30.5", "90.5", true },
        { "-1:30.5", "-90.5", true },
        { ".inf", "inf", true },
        { "-.Inf", "-inf", true },
        { "+.INF", "inf", true },
        { ".nan", "nan", true },
        { ".NaN", "nan", true },
        { "-.nan", "-.nan", true },
        { "10000000000000000.0", "1e+16", true },
        { "1000000000000000.0", "1000000000000000.0", true },
        { "0.0001", "0.0001", true },
        { "0.00001", "1e-05", true },
        { "0.1", "0.1", true },
        { "1.8e+308", "inf", true },
        { "!!float '1'", "1.0", true },
        { "!!float 1e3", "1000.0", true },
        /* timestamps */
        { "2001-12-14", "2001-12-14", true },
        { "2001-12-14t21:59:43.10-05:00", "2001-12-14 21:59:43.100000-05:00", true },
        { "2001-12-14T21:59:43Z", "2001-12-14 21:59:43+00:00", true },
        { "2001-12-14 21:59:43.10 -5", "2001-12-14 21:59:43.100000-05:00", true },
        { "2001-12-14 21:59:43", "2001-12-14 21:59:43", true },
        { "2001-1-2 3:04:05.1234567 +5:30", "2001-01-02 03:04:05.123456+05:30", true },
        { "2001-1-2", "2001-1-2", true },
        { "2000-02-29", "2000-02-29", true },
        /* strings */
        { "'yes'", "yes", true },
        { "\"1.5\"", "1.5", true },
        { "!!str 0", "0", true },
        { "''", "", false },
        { "ray://head:10001", "ray://head:10001", true },
        { "'0'", "0", true },
        /* collections */
        { "[]", "[]", false },
        { "{}", "{}", false },
        { "[a, 1, 'b''c', ~, [yes]]", "['a', 1, \"b'c\", None, [True]]", true },
        { "{a: 1, b: [x]}", "{'a': 1, 'b': ['x']}", true },
    };
    char y[512];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(y, sizeof(y),
                 "executor_type: ray\nprocess:\n- a_mapper:\n    save_dir: %s\nray_address: %s\n",
                 cases[i].yaml, cases[i].yaml);
        accept(y);
        /* a null ray_address is absent, as `is not None` makes it for the
         * reference; every other value keeps its str() */
        if (strcmp(cases[i].str, "None") == 0)
            ck_assert_msg(!rec.ray_address, "%s: null ray_address kept", cases[i].yaml);
        else
            ck_assert_msg(rec.ray_address && strcmp(rec.ray_address, cases[i].str) == 0,
                          "%s: str() is '%s', want '%s'", cases[i].yaml, rec.ray_address,
                          cases[i].str);
        ck_assert_msg((rec.warnings.n == 1) == cases[i].truthy, "%s: truthiness", cases[i].yaml);
        recipe_free(&rec);
    }
    accept("process: []\n");
    ck_assert_ptr_null(rec.ray_address);
    recipe_free(&rec);
}
END_TEST

START_TEST(test_merge_keys)
{
    char *path = tu_data("recipes/merge-keys.yaml");

    ck_assert_int_eq(recipe_load(path, NULL, &rec, &err), 0);
    ck_assert_str_eq(rec.executor_type, "ray");
    ASSERT_STRV(&rec.ops, "a_mapper", "b_filter", "c_mapper");
    ASSERT_STRV(&rec.index_keys, "loud", "own", "uid");
    ASSERT_STRV(&rec.media_keys, "frames", "audios", "videos");
    ASSERT_STRV(&rec.warnings, SAVE_DIR_WARNING("b_filter"));
    recipe_free(&rec);
    free(path);

    /* own keys win over merged ones, wherever they appear */
    accept("m: &m {save_dir: x, index_key: m}\nprocess:\n- a_mapper: {save_dir: off, <<: *m}\n");
    ASSERT_STRV(&rec.warnings, EXEC_WARNING);
    ASSERT_STRV(&rec.index_keys, "m");
    recipe_free(&rec);
    /* in a list the first mapping wins; a later "<<" wins over an earlier */
    accept("a: &a {index_key: a}\nb: &b {index_key: b}\nprocess:\n- x_mapper: {<<: [*b, *a]}\n"
           "- y_mapper: {<<: *a, <<: *b}\n");
    ASSERT_STRV(&rec.index_keys, "b");
    recipe_free(&rec);
    /* nested merges, and an operator item made entirely of a merge */
    accept("o: &o {a_mapper: {index_key: deep}}\nw: &w {<<: *o}\nprocess:\n- <<: *w\n"
           "- {<<: *o, a_mapper: ~}\n");
    ASSERT_STRV(&rec.ops, "a_mapper", "a_mapper");
    ASSERT_STRV(&rec.index_keys, "deep");
    recipe_free(&rec);
    /* a merge that adds a second operator key */
    ck_assert_str_eq(refuse("o: &o {a_mapper: ~}\nprocess:\n- <<: *o\n  b_mapper: ~\n"),
                     "process[0] in r.yaml:3 must contain exactly one operator");
    /* merged falsy/empty things */
    accept("e: &e {}\nprocess:\n- a_mapper: {<<: *e}\n- b_mapper: {<<: [*e, *e]}\n");
    recipe_free(&rec);
    ck_assert_str_eq(refuse("e: &e {}\nprocess:\n- {<<: *e}\n"),
                     "process[0] in r.yaml:3 must contain exactly one operator");
    /* a quoted "<<" is an ordinary key */
    accept("process: []\n'<<': {executor_type: spark}\n");
    recipe_free(&rec);
    accept("process: []\n\"<<\": 5\n");
    recipe_free(&rec);
    /* top level merge */
    accept("base: &base {executor_type: ray, process: [a_mapper: ~]}\n<<: *base\n");
    ck_assert_str_eq(rec.executor_type, "ray");
    ASSERT_STRV(&rec.ops, "a_mapper");
    recipe_free(&rec);
    ck_assert_str_eq(refuse("base: &base {executor_type: spark}\n<<: *base\nprocess: []\n"),
                     "recipe r.yaml:1: executor_type must be 'default' or 'ray', got 'spark'");

    ck_assert_str_eq(refuse("process: []\nx: {<<: 5}\n"),
                     "recipe r.yaml:2: expected a mapping or list of mappings for merging, found "
                     "a scalar");
    ck_assert_str_eq(refuse("m: &m {a: 1}\nprocess: []\nx:\n  <<: [*m, [1]]\n"),
                     "recipe r.yaml:4: expected a mapping for merging, found a sequence");
    ck_assert_str_eq(refuse("process: []\nx: {a: <<}\n"),
                     "recipe r.yaml:2: '<<' can only be used as a mapping key (quote it)");
}
END_TEST

START_TEST(test_check_order)
{
    /* mapping, executor_type, process, custom paths, operators in order,
     * media keys: the first failing rule is the one reported */
    ck_assert_str_eq(refuse("executor_type: spark\n"),
                     "recipe r.yaml:1: executor_type must be 'default' or 'ray', got 'spark'");
    ck_assert_str_eq(refuse("custom_operator_paths: 5\nexecutor_type: ray\n"),
                     "recipe r.yaml: 'process' must be a list");
    ck_assert_str_eq(refuse("custom_operator_paths: 5\nprocess: [foo_op: ~]\n"),
                     "recipe r.yaml:1: custom_operator_paths must be a string or a list of "
                     "strings");
    ck_assert_str_eq(refuse("process:\n- foo_op: ~\n- x\n"),
                     "Unknown operator 'foo_op' in r.yaml:2; cannot prove it is shard-safe");
    ck_assert_str_eq(refuse("process:\n- a_mapper: {stats_export_path: x, index_key: ''}\n"),
                     "Operator 'a_mapper' in r.yaml:2 sets stats_export_path, which cannot be "
                     "used per shard");
    ck_assert_str_eq(refuse("process:\n- a_mapper: {stats_export_path: x, "
                            "is_global_operation: 1}\n"),
                     "Operator 'a_mapper' in r.yaml:2 requires or may require whole-dataset "
                     "semantics and cannot run per shard (is_global_operation is set)");
}
END_TEST

START_TEST(test_name_as_given)
{
    ck_assert_int_eq(recipe_parse("x: 1\n", 5, "/abs/dir/recipe.yaml", NULL, &rec, &err), -EINVAL);
    ck_assert_str_eq(err.msg, "recipe /abs/dir/recipe.yaml: 'process' must be a list");
    ck_assert_int_eq(recipe_parse("process: [foo_op: ~]", 20, "rel/r.yaml", NULL, &rec, &err),
                     -EINVAL);
    ck_assert_str_eq(err.msg,
                     "Unknown operator 'foo_op' in rel/r.yaml:1; cannot prove it is shard-safe");
    /* the length is honoured: no NUL needed */
    ck_assert_int_eq(
        recipe_parse("process: []\nexecutor_type: spark", 11, "r.yaml", NULL, &rec, &err), 0);
    recipe_free(&rec);
    /* err may be NULL */
    ck_assert_int_eq(recipe_parse("x", 1, "r.yaml", NULL, &rec, NULL), -EINVAL);
}
END_TEST

static Suite *
recipe_suite(void)
{
    Suite *s = suite_create("recipe");
    TCase *tc = tcase_create("core");

    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_minimal);
    tcase_add_test(tc, test_load_full);
    tcase_add_test(tc, test_free_zeroed);
    tcase_add_test(tc, test_load_missing);
    tcase_add_test(tc, test_load_unreadable);
    tcase_add_test(tc, test_too_large);
    tcase_add_test(tc, test_load_fixture_errors);
    tcase_add_test(tc, test_not_mapping);
    tcase_add_test(tc, test_multiple_documents);
    tcase_add_test(tc, test_invalid_yaml);
    tcase_add_test(tc, test_alias_bomb);
    tcase_add_test(tc, test_node_budget_counts_aliases);
    tcase_add_test(tc, test_recursive_alias);
    tcase_add_test(tc, test_anchor_errors);
    tcase_add_test(tc, test_deep_nesting);
    tcase_add_test(tc, test_construct_errors);
    tcase_add_test(tc, test_executor_type);
    tcase_add_test(tc, test_process_list);
    tcase_add_test(tc, test_process_items);
    tcase_add_test(tc, test_classify);
    tcase_add_test(tc, test_unknown_operator);
    tcase_add_test(tc, test_whole_dataset);
    tcase_add_test(tc, test_is_global_operation);
    tcase_add_test(tc, test_deny_allow);
    tcase_add_test(tc, test_verdict);
    tcase_add_test(tc, test_builtin_lists);
    tcase_add_test(tc, test_fused_operators_checked_inside);
    tcase_add_test(tc, test_stats_export_path);
    tcase_add_test(tc, test_save_dir);
    tcase_add_test(tc, test_index_key);
    tcase_add_test(tc, test_media_keys);
    tcase_add_test(tc, test_custom_operator_paths);
    tcase_add_test(tc, test_dataset_path);
    tcase_add_test(tc, test_yaml11_scalars);
    tcase_add_test(tc, test_merge_keys);
    tcase_add_test(tc, test_check_order);
    tcase_add_test(tc, test_name_as_given);
    tcase_add_test(tc, test_emit_roundtrip);
    tcase_add_test(tc, test_global_stage_split);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(recipe_suite());
}
