/*
 * check_config: esd.yaml through the key table. Defaults, a file with every
 * key, nulls meaning the default, both forms of processor, and every kind
 * of refusal by its full message ("esd.yaml:4: slots must be an integer
 * from 1 to 256, got 0"); on failure *ret must be left untouched. The
 * documentation is checked against the table too: every key has an entry
 * in man/esd.yaml.5 (in table order) and a line in etc/esd.yaml, and the
 * sample loads to exactly the defaults.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config.h"
#include "fsutil.h"
#include "json.h"
#include "manifest.h"
#include "testutil.h"
#include "util.h"

static char *tmp;
static struct esd_err err;
static struct esd_conf conf;

static void
setup(void)
{
    json_init();
    tmp = tu_tmpdir();
    memset(&conf, 0, sizeof(conf));
}

static void
teardown(void)
{
    config_free(&conf);
    fs_rm_rf(tmp);
    free(tmp);
}

/* Loads path into conf; on failure checks that *ret was not touched and
 * that err carries the code. */
static int
load_file(const char *path)
{
    struct esd_conf sentinel;
    int rc;

    config_free(&conf);
    memset(&conf, 0xa5, sizeof(conf));
    memset(&sentinel, 0xa5, sizeof(sentinel));
    err_clear(&err);
    rc = config_load(path, &conf, &err);
    if (rc < 0) {
        ck_assert_msg(memcmp(&conf, &sentinel, sizeof(conf)) == 0, "*ret touched on failure");
        ck_assert_int_eq(err.code, rc);
        memset(&conf, 0, sizeof(conf));
    } else {
        ck_assert_int_eq(rc, 0);
    }
    return rc;
}

/* Writes yaml to tmp/esd.yaml and loads it. */
static int
load(const char *yaml)
{
    char *path = tu_write(tmp, "esd.yaml", yaml, (size_t)-1);
    int rc = load_file(path);

    free(path);
    return rc;
}

static void
accept(const char *yaml)
{
    int rc = load(yaml);

    ck_assert_msg(rc == 0, "refused (%s):\n%s", err.msg, yaml);
}

/* The message of a load that must fail, with tmp/ cut off the file name
 * ("esd.yaml:4: …"). */
static const char *
refuse(const char *yaml)
{
    size_t n = strlen(tmp);
    int rc = load(yaml);

    ck_assert_msg(rc == -EINVAL, "accepted (or not -EINVAL: %d):\n%s", rc, yaml);
    ck_assert_msg(strncmp(err.msg, tmp, n) == 0 && err.msg[n] == '/', "no file name: %s", err.msg);
    return err.msg + n + 1;
}

static void
refuse_eq(const char *yaml, const char *msg)
{
    const char *got = refuse(yaml);

    ck_assert_msg(strcmp(got, msg) == 0, "for:\n%s\nwant: %s\ngot:  %s", yaml, msg, got);
}

static void
json_eq(const struct esd_conf *a, const struct esd_conf *b)
{
    cJSON *ja = config_json(a), *jb = config_json(b);
    char *sa = cJSON_PrintUnformatted(ja), *sb = cJSON_PrintUnformatted(jb);

    ck_assert_msg(cJSON_Compare(ja, jb, true), "differ:\n%s\n%s", sa, sb);
    free(sa);
    free(sb);
    cJSON_Delete(ja);
    cJSON_Delete(jb);
}

static void
defaults_eq(const struct esd_conf *c)
{
    struct esd_conf d;

    config_defaults(&d);
    json_eq(c, &d);
    config_free(&d);
}

START_TEST(test_defaults)
{
    struct esd_conf c;

    config_defaults(&c);
    ck_assert_ptr_null(c.path);
    ck_assert_ptr_nonnull(c.node_name);
    ck_assert_msg(manifest_id_ok(c.node_name), "invalid default node name '%s'", c.node_name);
    ck_assert_int_eq(c.slots, 1);
    ck_assert_int_eq(c.lease_secs, 60);
    ck_assert_int_eq(c.poll_interval_secs, 20);
    ck_assert_uint_eq(c.processor.n, 0);
    ck_assert_ptr_null(c.dj_root);
    ck_assert_str_eq(c.dj_python, "python3");
    ck_assert(!c.allow_version_mismatch);
    ck_assert_int_eq(c.ray_mode, RAY_PERSISTENT);
    ck_assert_str_eq(c.ray_command, "ray");
    ck_assert_int_eq(c.ray_port, 6380);
    ck_assert_str_eq(c.ray_temp_dir, "/var/lib/esd/ray");
    ck_assert_uint_eq(c.ray_args.n, 0);
    ck_assert_int_eq(c.ray_num_gpus, -1); /* counted on the node */
    ck_assert_int_eq(c.ray_start_timeout_secs, 120);
    ck_assert_str_eq(c.state_dir, "/var/lib/esd");
    ck_assert_str_eq(c.socket_path, "/run/esd/esd.sock");
    ck_assert_str_eq(c.socket_group, "esd");
    ck_assert_ptr_null(c.spool_dir);
    ck_assert_int_eq(c.attempt_timeout_secs, 0);
    ck_assert_uint_eq(c.attempt_env.n, 14);
    ck_assert_str_eq(c.attempt_env.v[0], "LANG");
    ck_assert_str_eq(c.attempt_env.v[2], "LC_*");
    ck_assert(strv_contains(&c.attempt_env, "CUDA_VISIBLE_DEVICES"));
    ck_assert(strv_contains(&c.attempt_env, "https_proxy"));
    ck_assert(!strv_contains(&c.attempt_env, "HF_TOKEN"));
    ck_assert_int_eq(c.drain_timeout_secs, 60);
    ck_assert_int_eq(c.max_infra_failures, 10);
    ck_assert_int_eq(c.log_target, LOG_TARGET_AUTO);
    ck_assert_int_eq(c.log_level, LOG_LVL_INFO);
    config_free(&c);
    /* config_free leaves a zeroed struct, which it accepts again */
    ck_assert_ptr_null(c.node_name);
    config_free(&c);
}
END_TEST

START_TEST(test_node_name_from_host)
{
    char host[256] = "";

    ck_assert_int_eq(gethostname(host, sizeof(host) - 1), 0);
    config_defaults(&conf);
    if (manifest_id_ok(host))
        ck_assert_str_eq(conf.node_name, host);
    else
        ck_assert_uint_eq(strlen(conf.node_name), strlen(host) > 200 ? 200 : strlen(host));
}
END_TEST

START_TEST(test_empty_files)
{
    /* no document, only comments, an empty document: all defaults */
    accept("");
    defaults_eq(&conf);
    accept("# nothing here\n\n# at all\n");
    defaults_eq(&conf);
    accept("---\n...\n");
    defaults_eq(&conf);
    accept("~\n");
    defaults_eq(&conf);
    ck_assert_ptr_nonnull(conf.path);
    ck_assert_uint_eq(strlen(conf.path), strlen(tmp) + strlen("/esd.yaml"));
}
END_TEST

static const char full[] = "node_name: gpu-07.rack_3\n"
                           "slots: 4\n"
                           "lease_secs: 30\n"
                           "poll_interval_secs: 5\n"
                           "processor: [/opt/dj/bin/python, -m, data_juicer.tools.process]\n"
                           "data_juicer:\n"
                           "  root: /opt/data-juicer\n"
                           "  python: /opt/dj/bin/python\n"
                           "  allow_version_mismatch: yes\n"
                           "ray:\n"
                           "  mode: per-attempt\n"
                           "  command: /opt/ray/bin/ray\n"
                           "  port: 7000\n"
                           "  temp_dir: /scratch/ray\n"
                           "  args:\n"
                           "    - --num-cpus\n"
                           "    - \"8\"\n"
                           "state_dir: /srv/esd\n"
                           "socket: /run/esd/other.sock\n"
                           "socket_group: wheel\n"
                           "spool_dir: /mnt/shared/spool\n"
                           "attempt_timeout_secs: 3600\n"
                           "attempt_env: [LANG, MY_*]\n"
                           "drain_timeout_secs: 0\n"
                           "max_infra_failures: 3\n"
                           "log:\n"
                           "  target: stderr\n"
                           "  level: debug\n";

START_TEST(test_full)
{
    accept(full);
    ck_assert_str_eq(conf.node_name, "gpu-07.rack_3");
    ck_assert_int_eq(conf.slots, 4);
    ck_assert_int_eq(conf.lease_secs, 30);
    ck_assert_int_eq(conf.poll_interval_secs, 5);
    ck_assert_uint_eq(conf.processor.n, 3);
    ck_assert_str_eq(conf.processor.v[0], "/opt/dj/bin/python");
    ck_assert_str_eq(conf.processor.v[1], "-m");
    ck_assert_str_eq(conf.processor.v[2], "data_juicer.tools.process");
    ck_assert_str_eq(conf.dj_root, "/opt/data-juicer");
    ck_assert_str_eq(conf.dj_python, "/opt/dj/bin/python");
    ck_assert(conf.allow_version_mismatch);
    ck_assert_int_eq(conf.ray_mode, RAY_PER_ATTEMPT);
    ck_assert_str_eq(conf.ray_command, "/opt/ray/bin/ray");
    ck_assert_int_eq(conf.ray_port, 7000);
    ck_assert_str_eq(conf.ray_temp_dir, "/scratch/ray");
    ck_assert_uint_eq(conf.ray_args.n, 2);
    ck_assert_str_eq(conf.ray_args.v[0], "--num-cpus");
    ck_assert_str_eq(conf.ray_args.v[1], "8");
    ck_assert_str_eq(conf.state_dir, "/srv/esd");
    ck_assert_str_eq(conf.socket_path, "/run/esd/other.sock");
    ck_assert_str_eq(conf.socket_group, "wheel");
    ck_assert_str_eq(conf.spool_dir, "/mnt/shared/spool");
    ck_assert_int_eq(conf.attempt_timeout_secs, 3600);
    ck_assert_uint_eq(conf.attempt_env.n, 2);
    ck_assert_str_eq(conf.attempt_env.v[0], "LANG");
    ck_assert_str_eq(conf.attempt_env.v[1], "MY_*");
    ck_assert_int_eq(conf.drain_timeout_secs, 0);
    ck_assert_int_eq(conf.max_infra_failures, 3);
    ck_assert_int_eq(conf.log_target, LOG_TARGET_STDERR);
    ck_assert_int_eq(conf.log_level, LOG_LVL_DEBUG);
    ck_assert_ptr_nonnull(strstr(conf.path, "/esd.yaml"));
}
END_TEST

START_TEST(test_flow_and_quotes)
{
    /* flow style and quoted strings are YAML like any other */
    accept("{slots: 2, ray: {mode: 'off', command: \"ray\"}, log: {level: 'warning'}}\n");
    ck_assert_int_eq(conf.slots, 2);
    ck_assert_int_eq(conf.ray_mode, RAY_OFF);
    ck_assert_int_eq(conf.log_level, LOG_LVL_WARNING);
    /* off is a ray.mode here, not the boolean YAML 1.1 would make it */
    accept("ray:\n  mode: off\n");
    ck_assert_int_eq(conf.ray_mode, RAY_OFF);
    /* a number where a string belongs is its text */
    accept("node_name: 42\nsocket_group: 1000\n");
    ck_assert_str_eq(conf.node_name, "42");
    ck_assert_str_eq(conf.socket_group, "1000");
}
END_TEST

START_TEST(test_nulls_mean_default)
{
    accept("node_name:\n"
           "slots: ~\n"
           "lease_secs: null\n"
           "poll_interval_secs: Null\n"
           "processor: NULL\n"
           "data_juicer:\n"
           "  root:\n"
           "  python: ~\n"
           "  allow_version_mismatch: ~\n"
           "ray:\n"
           "  mode:\n"
           "  command:\n"
           "  port:\n"
           "  temp_dir:\n"
           "  args:\n"
           "  num_gpus: ~\n"
           "  start_timeout_secs:\n"
           "state_dir:\n"
           "socket:\n"
           "socket_group:\n"
           "spool_dir:\n"
           "attempt_timeout_secs:\n"
           "attempt_env:\n"
           "drain_timeout_secs:\n"
           "max_infra_failures:\n"
           "log:\n"
           "  target:\n"
           "  level:\n");
    defaults_eq(&conf);
    ck_assert_int_eq(conf.ray_num_gpus, -1);
    /* ray.num_gpus's auto shows as null; 0 is a count */
    {
        cJSON *j = config_json(&conf);

        ck_assert(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(j, "ray"), "num_gpus")));
        cJSON_Delete(j);
    }
    accept("ray:\n  num_gpus: 0\n");
    ck_assert_int_eq(conf.ray_num_gpus, 0);
    /* a section may be null as a whole */
    accept("data_juicer:\nray: ~\nlog:\n");
    defaults_eq(&conf);
    /* a null key still counts for duplicates */
    refuse_eq("slots:\nslots: 2\n", "esd.yaml:2: duplicate key 'slots' (first at line 1)");
}
END_TEST

START_TEST(test_temp_dir_follows_state_dir)
{
    accept("state_dir: /srv/esd/\n");
    ck_assert_str_eq(conf.ray_temp_dir, "/srv/esd/ray");
    accept("state_dir: /srv/esd\nray:\n  temp_dir: ~\n");
    ck_assert_str_eq(conf.ray_temp_dir, "/srv/esd/ray");
    accept("ray:\n  temp_dir: /tmp/r\nstate_dir: /srv/esd\n");
    ck_assert_str_eq(conf.ray_temp_dir, "/tmp/r");
}
END_TEST

START_TEST(test_processor_forms)
{
    accept("processor: python3 /opt/dj/tools/process_data.py\n");
    ck_assert_uint_eq(conf.processor.n, 2);
    ck_assert_str_eq(conf.processor.v[0], "python3");
    ck_assert_str_eq(conf.processor.v[1], "/opt/dj/tools/process_data.py");
    /* blanks and tabs separate words; no quoting inside the string */
    accept("processor: \"  a\\tb  'c d' \"\n");
    ck_assert_uint_eq(conf.processor.n, 4);
    ck_assert_str_eq(conf.processor.v[2], "'c");
    ck_assert_str_eq(conf.processor.v[3], "d'");
    /* a list keeps its words as they are */
    accept("processor:\n  - /bin/my processor\n  - --flag=a b\n");
    ck_assert_uint_eq(conf.processor.n, 2);
    ck_assert_str_eq(conf.processor.v[0], "/bin/my processor");
    ck_assert_str_eq(conf.processor.v[1], "--flag=a b");
    /* empty: the default */
    accept("processor: []\n");
    ck_assert_uint_eq(conf.processor.n, 0);
    accept("processor: ''\n");
    ck_assert_uint_eq(conf.processor.n, 0);
    refuse_eq("processor: {a: b}\n",
              "esd.yaml:1: processor must be a string or a list of strings, got a mapping");
    refuse_eq("processor: [a, [b]]\n",
              "esd.yaml:1: processor items must be non-empty strings, got a list");
    refuse_eq("processor:\n  - a\n  -\n",
              "esd.yaml:3: processor items must be non-empty strings, got an empty value");
    refuse_eq("ray:\n  args: [a, '']\n",
              "esd.yaml:2: ray.args items must be non-empty strings, got \"\"");
    refuse_eq("ray:\n  args: --num-cpus 8\n",
              "esd.yaml:2: ray.args must be a list of strings, got --num-cpus 8");
}
END_TEST

START_TEST(test_attempt_env)
{
    static const char *const bad[] = { "FOO-BAR", "1ABC", "A*B", "**", "LC_*X", "A B*" };
    static const char *const fixed[] = { "HOME", "PATH", "USER", "LOGNAME", "SHELL" };
    char yaml[128], want[256];

    /* names, prefixes, '*' for everything; a string is split on blanks */
    accept("attempt_env: [TZ, _X, a9, MINI_DJ_*, '*', HOME_*, PATHS]\n");
    ck_assert_uint_eq(conf.attempt_env.n, 7);
    ck_assert_str_eq(conf.attempt_env.v[3], "MINI_DJ_*");
    ck_assert_str_eq(conf.attempt_env.v[4], "*");
    accept("attempt_env: LANG  TZ\tFAKE_RAY_*\n");
    ck_assert_uint_eq(conf.attempt_env.n, 3);
    ck_assert_str_eq(conf.attempt_env.v[2], "FAKE_RAY_*");
    /* empty: nothing of esd's environment (null is the default) */
    accept("attempt_env: []\n");
    ck_assert_uint_eq(conf.attempt_env.n, 0);
    accept("attempt_env: ''\n");
    ck_assert_uint_eq(conf.attempt_env.n, 0);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(yaml, sizeof(yaml), "slots: 1\nattempt_env: [LANG, '%s']\n", bad[i]);
        snprintf(want, sizeof(want),
                 "esd.yaml:2: attempt_env items must be variable names, or prefixes ending "
                 "in '*', got \"%s\"",
                 bad[i]);
        refuse_eq(yaml, want);
    }
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++) {
        snprintf(yaml, sizeof(yaml), "attempt_env:\n  - TZ\n  - %s\n", fixed[i]);
        snprintf(want, sizeof(want),
                 "esd.yaml:3: attempt_env items must not name HOME, LOGNAME, PATH, SHELL or "
                 "USER (esd sets them), got %s",
                 fixed[i]);
        refuse_eq(yaml, want);
    }
    refuse_eq("attempt_env: LANG FOO-BAR\n",
              "esd.yaml:1: attempt_env items must be variable names, or prefixes ending in "
              "'*', got LANG FOO-BAR");
    refuse_eq("attempt_env: TZ HOME\n",
              "esd.yaml:1: attempt_env items must not name HOME, LOGNAME, PATH, SHELL or USER "
              "(esd sets them), got TZ HOME");
    refuse_eq("attempt_env: [LANG, '']\n",
              "esd.yaml:1: attempt_env items must be non-empty strings, got \"\"");
}
END_TEST

START_TEST(test_booleans)
{
    static const char *const yes[] = { "true", "True", "TRUE", "yes", "Yes", "on", "ON" };
    static const char *const no[] = { "false", "False", "no", "NO", "off", "Off" };
    char buf[128];

    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        snprintf(buf, sizeof(buf), "data_juicer:\n  allow_version_mismatch: %s\n", yes[i]);
        accept(buf);
        ck_assert_msg(conf.allow_version_mismatch, "%s", yes[i]);
    }
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++) {
        snprintf(buf, sizeof(buf), "data_juicer:\n  allow_version_mismatch: %s\n", no[i]);
        accept(buf);
        ck_assert_msg(!conf.allow_version_mismatch, "%s", no[i]);
    }
    refuse_eq("data_juicer:\n  allow_version_mismatch: maybe\n",
              "esd.yaml:2: data_juicer.allow_version_mismatch must be true or false, got maybe");
    refuse_eq("data_juicer:\n  allow_version_mismatch: 1\n",
              "esd.yaml:2: data_juicer.allow_version_mismatch must be true or false, got 1");
    refuse_eq("data_juicer:\n  allow_version_mismatch: \"true\"\n",
              "esd.yaml:2: data_juicer.allow_version_mismatch must be true or false, got \"true\"");
}
END_TEST

/* Every bounded integer key: both limits accepted, one past each refused
 * with the message that states the range. */
START_TEST(test_integer_ranges)
{
    static const struct {
        const char *section, *key;
        long min, max;
    } ints[] = {
        { NULL, "slots", 1, 256 },
        { NULL, "lease_secs", 2, 86400 },
        { NULL, "poll_interval_secs", 1, 3600 },
        { "ray", "port", 1, 65535 },
        { "ray", "num_gpus", 0, 4096 },
        { "ray", "start_timeout_secs", 5, 3600 },
        { NULL, "attempt_timeout_secs", 0, 30 * 86400 },
        { NULL, "drain_timeout_secs", 0, 86400 },
        { NULL, "max_infra_failures", 1, 1000 },
    };
    char yaml[256], msg[256], name[64];

    for (size_t i = 0; i < sizeof(ints) / sizeof(ints[0]); i++) {
        const char *ind = ints[i].section ? "  " : "";
        int line = ints[i].section ? 2 : 1;
        char head[32] = "";

        if (ints[i].section)
            snprintf(head, sizeof(head), "%s:\n", ints[i].section);
        snprintf(name, sizeof(name), "%s%s%s", ints[i].section ? ints[i].section : "",
                 ints[i].section ? "." : "", ints[i].key);
        for (int k = 0; k < 4; k++) {
            long v = k == 0   ? ints[i].min
                     : k == 1 ? ints[i].max
                     : k == 2 ? ints[i].min - 1
                              : ints[i].max + 1;

            snprintf(yaml, sizeof(yaml), "%s%s%s: %ld\n", head, ind, ints[i].key, v);
            if (k < 2) {
                accept(yaml);
                continue;
            }
            snprintf(msg, sizeof(msg),
                     "esd.yaml:%d: %s must be an integer from %ld to %ld, got %ld", line, name,
                     ints[i].min, ints[i].max, v);
            refuse_eq(yaml, msg);
        }
    }
    refuse_eq("\n\n\nslots: 0\n", "esd.yaml:4: slots must be an integer from 1 to 256, got 0");
    refuse_eq("attempt_timeout_secs: 2592001\n",
              "esd.yaml:1: attempt_timeout_secs must be an integer from 0 to 2592000, got 2592001");
}
END_TEST

START_TEST(test_integer_syntax)
{
    static const char *const bad[] = { "0x10", "010", "1_0",
                                       "1.5",  "1e3", "12abc",
                                       "+",    "--1", "99999999999999999999999" };
    char yaml[128], msg[256];

    accept("slots: +5\n");
    ck_assert_int_eq(conf.slots, 5);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(yaml, sizeof(yaml), "slots: %s\n", bad[i]);
        snprintf(msg, sizeof(msg), "esd.yaml:1: slots must be an integer from 1 to 256, got %s",
                 bad[i]);
        refuse_eq(yaml, msg);
    }
    /* quoted: a string, not an integer */
    refuse_eq("slots: \"5\"\n", "esd.yaml:1: slots must be an integer from 1 to 256, got \"5\"");
    refuse_eq("slots: '5'\n", "esd.yaml:1: slots must be an integer from 1 to 256, got \"5\"");
    refuse_eq("slots: [1]\n", "esd.yaml:1: slots must be an integer from 1 to 256, got a list");
    refuse_eq("slots: {a: 1}\n",
              "esd.yaml:1: slots must be an integer from 1 to 256, got a mapping");
}
END_TEST

START_TEST(test_enums)
{
    refuse_eq("ray:\n  mode: auto\n",
              "esd.yaml:2: ray.mode must be persistent, per-attempt or off, got auto");
    refuse_eq("ray:\n  mode: per_attempt\n",
              "esd.yaml:2: ray.mode must be persistent, per-attempt or off, got per_attempt");
    refuse_eq("ray:\n  mode: Persistent\n",
              "esd.yaml:2: ray.mode must be persistent, per-attempt or off, got Persistent");
    refuse_eq("log:\n  target: syslog\n",
              "esd.yaml:2: log.target must be auto, journal or stderr, got syslog");
    refuse_eq("log:\n  level: error\n",
              "esd.yaml:2: log.level must be err, warning, notice, info or debug, got error");
    refuse_eq("log:\n  level: [info]\n",
              "esd.yaml:2: log.level must be err, warning, notice, info or debug, got a list");
    accept("ray:\n  mode: per-attempt\nlog:\n  target: journal\n  level: err\n");
    ck_assert_int_eq(conf.ray_mode, RAY_PER_ATTEMPT);
    ck_assert_int_eq(conf.log_target, LOG_TARGET_JOURNAL);
    ck_assert_int_eq(conf.log_level, LOG_LVL_ERR);
    accept("log:\n  level: notice\n");
    ck_assert_int_eq(conf.log_level, LOG_LVL_NOTICE);
}
END_TEST

START_TEST(test_strings_and_paths)
{
    char yaml[512], msg[512], longp[200];

    refuse_eq("state_dir: var/lib/esd\n",
              "esd.yaml:1: state_dir must be an absolute path, got var/lib/esd");
    refuse_eq("ray:\n  temp_dir: ./ray\n",
              "esd.yaml:2: ray.temp_dir must be an absolute path, got ./ray");
    refuse_eq("data_juicer:\n  root: \"\"\n",
              "esd.yaml:2: data_juicer.root must be an absolute path, got \"\"");
    refuse_eq("spool_dir: [/a]\n", "esd.yaml:1: spool_dir must be an absolute path, got a list");
    refuse_eq("socket: esd.sock\n", "esd.yaml:1: socket must be an absolute path, got esd.sock");
    refuse_eq("ray:\n  command: ''\n", "esd.yaml:2: ray.command must not be empty, got \"\"");
    refuse_eq("socket_group: {a: b}\n", "esd.yaml:1: socket_group must be a string, got a mapping");
    refuse_eq("data_juicer:\n  python: \"py\\0thon\"\n",
              "esd.yaml:2: data_juicer.python must not contain NUL bytes, got \"py\\u0000thon\"");
    /* the control socket must fit sun_path */
    memset(longp, 'x', sizeof(longp));
    longp[0] = '/';
    snprintf(yaml, sizeof(yaml), "socket: %.108s\n", longp);
    snprintf(msg, sizeof(msg),
             "esd.yaml:1: socket must be shorter than 108 bytes (sun_path), got %.64s...", longp);
    refuse_eq(yaml, msg);
    snprintf(yaml, sizeof(yaml), "socket: %.107s\n", longp);
    accept(yaml);
}
END_TEST

START_TEST(test_node_name)
{
    static const char *const bad[] = { "a b", ".hidden", "node/1", "nöde" };
    char yaml[512], msg[512], name[202];

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(yaml, sizeof(yaml), "node_name: %s\n", bad[i]);
        snprintf(msg, sizeof(msg),
                 "esd.yaml:1: node_name must be at most 200 letters, digits, '.', '_' or '-', "
                 "not starting with '.', got %s",
                 bad[i]);
        refuse_eq(yaml, msg);
    }
    refuse_eq("node_name: ''\n", "esd.yaml:1: node_name must not be empty, got \"\"");
    memset(name, 'n', sizeof(name));
    name[200] = '\0';
    snprintf(yaml, sizeof(yaml), "node_name: %s\n", name);
    accept(yaml);
    name[200] = 'n';
    name[201] = '\0';
    snprintf(yaml, sizeof(yaml), "node_name: %s\n", name);
    ck_assert_ptr_nonnull(strstr(refuse(yaml), "node_name must be at most 200 letters"));
    accept("node_name: a.b_c-D9\n");
    ck_assert_str_eq(conf.node_name, "a.b_c-D9");
}
END_TEST

START_TEST(test_unknown_keys)
{
    refuse_eq("slots: 1\n\nslot: 2\n", "esd.yaml:3: unknown key 'slot'; did you mean 'slots'?");
    refuse_eq("lease_sec: 2\n", "esd.yaml:1: unknown key 'lease_sec'; did you mean 'lease_secs'?");
    /* a transposition is one edit */
    refuse_eq("ray:\n  mode: off\n  prot: 6379\n",
              "esd.yaml:3: unknown key 'ray.prot'; did you mean 'ray.port'?");
    refuse_eq("sokcet_grop: x\n",
              "esd.yaml:1: unknown key 'sokcet_grop'; did you mean 'socket_group'?");
    /* sections are suggested too */
    refuse_eq("rays:\n  mode: off\n", "esd.yaml:1: unknown key 'rays'; did you mean 'ray'?");
    refuse_eq("data-juicer:\n  root: /x\n",
              "esd.yaml:1: unknown key 'data-juicer'; did you mean 'data_juicer'?");
    /* nothing within two edits: no suggestion */
    refuse_eq("frobnicate: 1\n", "esd.yaml:1: unknown key 'frobnicate'");
    refuse_eq("a: 1\n", "esd.yaml:1: unknown key 'a'");
    refuse_eq("ry: {}\n", "esd.yaml:1: unknown key 'ry'; did you mean 'ray'?");
    refuse_eq("log:\n  colour: true\n", "esd.yaml:2: unknown key 'log.colour'");
    /* a nested key at the wrong level */
    refuse_eq("port: 6380\n", "esd.yaml:1: unknown key 'port'");
    refuse_eq("ray:\n  slots: 2\n", "esd.yaml:2: unknown key 'ray.slots'");
    /* the dotted names of the documentation are accepted only as nesting */
    refuse_eq("ray.mode: off\n",
              "esd.yaml:1: unknown key 'ray.mode'; write 'mode' inside the 'ray' mapping");
    refuse_eq("ray:\n  ray.mode: off\n", "esd.yaml:2: unknown key 'ray.ray.mode'");
    /* a key that is not a scalar */
    refuse_eq("? [a, b]\n: 1\n", "esd.yaml:1: keys must be strings, got a list");
    refuse_eq("ray:\n  ? {a: b}\n  : 1\n", "esd.yaml:2: keys must be strings, got a mapping");
}
END_TEST

START_TEST(test_duplicates)
{
    refuse_eq("slots: 1\nlease_secs: 60\nslots: 2\n",
              "esd.yaml:3: duplicate key 'slots' (first at line 1)");
    refuse_eq("ray:\n  mode: off\nlog:\n  level: info\nray:\n  port: 1\n",
              "esd.yaml:5: duplicate key 'ray' (first at line 1)");
    refuse_eq("ray:\n  port: 1\n  mode: off\n  port: 2\n",
              "esd.yaml:4: duplicate key 'ray.port' (first at line 2)");
}
END_TEST

START_TEST(test_structure)
{
    refuse_eq("- slots\n- 1\n",
              "esd.yaml:1: the top level must be a mapping of keys to values, got a list");
    refuse_eq("slots\n",
              "esd.yaml:1: the top level must be a mapping of keys to values, got slots");
    refuse_eq("ray: persistent\n", "esd.yaml:1: ray must be a mapping, got persistent");
    refuse_eq("log: [a]\n", "esd.yaml:1: log must be a mapping, got a list");
    refuse_eq("slots: 1\n---\nslots: 2\n",
              "esd.yaml:2: only one YAML document is allowed, found another");
}
END_TEST

START_TEST(test_anchors_aliases_tags)
{
    static const char anchors[] = "YAML anchors and aliases are not supported in the "
                                  "configuration (it has no need for them); write the value out";
    char msg[256];

    snprintf(msg, sizeof(msg), "esd.yaml:1: %s", anchors);
    refuse_eq("lease_secs: &l 60\ndrain_timeout_secs: *l\n", msg);
    snprintf(msg, sizeof(msg), "esd.yaml:2: %s", anchors);
    refuse_eq("slots: 1\nray: &r\n  mode: off\n", msg);
    snprintf(msg, sizeof(msg), "esd.yaml:3: %s", anchors);
    refuse_eq("ray:\n  args:\n    - *x\n", msg);
    refuse_eq("slots: !!int 4\n",
              "esd.yaml:1: YAML tags ('tag:yaml.org,2002:int') are not supported in the "
              "configuration");
}
END_TEST

START_TEST(test_invalid_yaml)
{
    const char *m;

    m = refuse("slots: 1\nray:\n  mode: 'off\n");
    ck_assert_msg(strncmp(m, "esd.yaml:", 9) == 0 && strstr(m, ": invalid YAML: "), "%s", m);
    m = refuse("slots: 1\nlease_secs: 2: 3\n");
    ck_assert_msg(strncmp(m, "esd.yaml:2: invalid YAML: ", 26) == 0, "%s", m);
    /* invalid UTF-8 is found by libyaml's reader, located by byte offset */
    m = refuse("slots: 1\n\nnode_name: caf\xe9\n");
    ck_assert_msg(strncmp(m, "esd.yaml:3: invalid YAML: ", 26) == 0, "%s", m);
}
END_TEST

START_TEST(test_file_errors)
{
    char *path = fs_join(tmp, "missing.yaml"), *big, *want;
    size_t n = 2u << 20;

    ck_assert_int_eq(load_file(path), -ENOENT);
    want = xasprintf("cannot open %s: No such file or directory", path);
    ck_assert_str_eq(err.msg, want);
    free(want);
    free(path);

    /* 2 MiB of comments: refused before it is parsed */
    big = xmalloc(n + 1);
    for (size_t i = 0; i < n; i++)
        big[i] = i % 64 == 63 ? '\n' : i % 64 == 0 ? '#' : 'x';
    big[n] = '\0';
    path = tu_write(tmp, "esd.yaml", big, n);
    free(big);
    ck_assert_int_eq(load_file(path), -EFBIG);
    want = xasprintf("%s is larger than 1048576 bytes", path);
    ck_assert_str_eq(err.msg, want);
    free(want);
    /* exactly 1 MiB is fine */
    ck_assert_int_eq(truncate(path, 1 << 20), 0);
    ck_assert_int_eq(load_file(path), 0);
    defaults_eq(&conf);
    free(path);
}
END_TEST

/* A directory is not a configuration. */
START_TEST(test_not_regular)
{
    ck_assert_int_eq(load_file(tmp), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "is not a regular file"));
}
END_TEST

/* The JSON form names every key of the table once, nested by section. */
START_TEST(test_json_keys)
{
    cJSON *j, *item;
    size_t leaves = 0;

    accept(full);
    j = config_json(&conf);
    for (size_t i = 0; i < config_nkeys(); i++) {
        const char *name = config_key_name(i), *dot = strchr(name, '.');
        cJSON *parent = j;

        if (dot) {
            char *sec = xstrndup(name, (size_t)(dot - name));

            parent = cJSON_GetObjectItemCaseSensitive(j, sec);
            ck_assert_msg(cJSON_IsObject(parent), "section %s", sec);
            free(sec);
            name = dot + 1;
        }
        ck_assert_msg(cJSON_GetObjectItemCaseSensitive(parent, name) != NULL, "key %s",
                      config_key_name(i));
    }
    ck_assert_ptr_null(config_key_name(config_nkeys()));
    cJSON_ArrayForEach(item, j)
    {
        leaves += cJSON_IsObject(item) ? (size_t)cJSON_GetArraySize(item) : 1;
    }
    ck_assert_uint_eq(leaves, config_nkeys());
    /* values as they were read */
    ck_assert_str_eq(cJSON_GetObjectItem(j, "node_name")->valuestring, "gpu-07.rack_3");
    ck_assert_int_eq(cJSON_GetObjectItem(j, "slots")->valueint, 4);
    item = cJSON_GetObjectItem(j, "ray");
    ck_assert_str_eq(cJSON_GetObjectItem(item, "mode")->valuestring, "per-attempt");
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(item, "args")), 2);
    ck_assert(cJSON_IsTrue(
        cJSON_GetObjectItem(cJSON_GetObjectItem(j, "data_juicer"), "allow_version_mismatch")));
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "log"), "level")->valuestring,
                     "debug");
    cJSON_Delete(j);
    /* unset optional paths are null */
    config_free(&conf);
    config_defaults(&conf);
    j = config_json(&conf);
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(j, "spool_dir")));
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "data_juicer"), "root")));
    ck_assert(cJSON_IsArray(cJSON_GetObjectItem(j, "processor")));
    cJSON_Delete(j);
}
END_TEST

/* config_print_keys: one "key\ttype\tdefault\thelp" line per key, in order. */
START_TEST(test_print_keys)
{
    char *path = fs_join(tmp, "keys.txt"), *text, *line, *save = NULL;
    int fd, saved;
    size_t i = 0;

    fflush(stdout);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ck_assert_int_ge(fd, 0);
    saved = dup(1);
    ck_assert_int_ge(dup2(fd, 1), 0);
    config_print_keys();
    fflush(stdout);
    ck_assert_int_ge(dup2(saved, 1), 0);
    close(saved);
    close(fd);
    text = tu_read(path, NULL);
    ck_assert_ptr_nonnull(text);
    for (line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save), i++) {
        char *f[4], *p = line;

        for (int k = 0; k < 4; k++) {
            f[k] = p;
            p = strchr(p, '\t');
            if (k < 3) {
                ck_assert_msg(p != NULL, "line %zu has fewer than 4 fields: %s", i, line);
                *p++ = '\0';
            }
        }
        ck_assert_msg(p == NULL, "line %zu has more than 4 fields", i);
        ck_assert_str_eq(f[0], config_key_name(i));
        ck_assert_msg(*f[1] && *f[2] && *f[3], "empty field in line %zu", i);
        if (strcmp(f[0], "slots") == 0) {
            ck_assert_str_eq(f[1], "integer 1..256");
            ck_assert_str_eq(f[2], "1");
        }
        if (strcmp(f[0], "ray.mode") == 0) {
            ck_assert_str_eq(f[1], "persistent|per-attempt|off");
            ck_assert_str_eq(f[2], "persistent");
        }
        if (strcmp(f[0], "ray.temp_dir") == 0)
            ck_assert_str_eq(f[2], "<state_dir>/ray");
    }
    ck_assert_uint_eq(i, config_nkeys());
    free(text);
    free(path);
}
END_TEST

/* man/esd.yaml.5 has an ".It Cm <key>" entry for every key, in table
 * order, and mandoc finds nothing at warning level. */
START_TEST(test_man_page)
{
    char *path = tu_data("../../man/esd.yaml.5"), *page = tu_read(path, NULL);
    const char *prev = page;
    pid_t pid;
    int st;

    ck_assert_msg(page != NULL, "cannot read %s", path);
    for (size_t i = 0; i < config_nkeys(); i++) {
        char *want = xasprintf("\n.It Cm %s", config_key_name(i));
        const char *at = strstr(page, want);
        size_t n = strlen(want);

        while (at && at[n] != ' ' && at[n] != '\n')
            at = strstr(at + 1, want);
        ck_assert_msg(at != NULL, "key %s missing from esd.yaml.5", config_key_name(i));
        ck_assert_msg(at >= prev, "key %s out of table order in esd.yaml.5", config_key_name(i));
        prev = at;
        free(want);
    }
    pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        execlp("mandoc", "mandoc", "-Tlint", "-Wwarning", path, (char *)NULL);
        _exit(127); /* no mandoc: skipped */
    }
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFEXITED(st) && (WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 127),
                  "mandoc -Tlint -Wwarning %s failed", path);
    free(page);
    free(path);
}
END_TEST

/* name[0..n) is the section of some key ("ray" of "ray.mode"). */
static bool
is_section(const char *name, size_t n)
{
    for (size_t i = 0; i < config_nkeys(); i++)
        if (strncmp(config_key_name(i), name, n) == 0 && config_key_name(i)[n] == '.')
            return true;
    return false;
}

/*
 * etc/esd.yaml names every key (computed defaults as commented-out lines,
 * "#key: example", directly after the indentation), loads to exactly the
 * defaults, and still loads with those lines uncommented.
 */
START_TEST(test_sample)
{
    char *path = tu_data("../../etc/esd.yaml"), *text = tu_read(path, NULL), *copy;
    struct strv found;
    struct buf un;
    char section[64] = "";

    ck_assert_msg(text != NULL, "cannot read %s", path);
    ck_assert_msg(load_file(path) == 0, "%s", err.msg);
    defaults_eq(&conf);
    ck_assert_str_eq(conf.path, path);

    strv_init(&found);
    buf_init(&un);
    copy = xstrdup(text);
    for (char *save = NULL, *line = strtok_r(copy, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        size_t ind = strspn(line, " "), klen;
        char *key = line + ind;

        if (key[0] == '#' && key[1] >= 'a' && key[1] <= 'z') {
            memmove(key, key + 1, strlen(key)); /* uncomment "#key: value" */
        }
        buf_printf(&un, "%s\n", line);
        klen = strspn(key, "abcdefghijklmnopqrstuvwxyz_");
        if (klen == 0 || key[klen] != ':')
            continue;
        if (ind == 0 && key[klen + 1] == '\0' && is_section(key, klen)) {
            snprintf(section, sizeof(section), "%.*s", (int)klen, key);
            continue;
        }
        if (ind == 0)
            section[0] = '\0';
        strv_push_owned(&found, section[0] ? xasprintf("%s.%.*s", section, (int)klen, key)
                                           : xstrndup(key, klen));
    }
    for (size_t i = 0; i < config_nkeys(); i++)
        ck_assert_msg(strv_contains(&found, config_key_name(i)), "key %s missing from %s",
                      config_key_name(i), path);
    ck_assert_uint_eq(found.n, config_nkeys());
    accept(un.p);
    buf_free(&un);
    strv_free(&found);
    free(copy);
    free(text);
    free(path);
}
END_TEST

static Suite *
config_suite(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("core");

    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_defaults);
    tcase_add_test(tc, test_node_name_from_host);
    tcase_add_test(tc, test_empty_files);
    tcase_add_test(tc, test_full);
    tcase_add_test(tc, test_flow_and_quotes);
    tcase_add_test(tc, test_nulls_mean_default);
    tcase_add_test(tc, test_temp_dir_follows_state_dir);
    tcase_add_test(tc, test_processor_forms);
    tcase_add_test(tc, test_attempt_env);
    tcase_add_test(tc, test_booleans);
    tcase_add_test(tc, test_integer_ranges);
    tcase_add_test(tc, test_integer_syntax);
    tcase_add_test(tc, test_enums);
    tcase_add_test(tc, test_strings_and_paths);
    tcase_add_test(tc, test_node_name);
    tcase_add_test(tc, test_unknown_keys);
    tcase_add_test(tc, test_duplicates);
    tcase_add_test(tc, test_structure);
    tcase_add_test(tc, test_anchors_aliases_tags);
    tcase_add_test(tc, test_invalid_yaml);
    tcase_add_test(tc, test_file_errors);
    tcase_add_test(tc, test_not_regular);
    tcase_add_test(tc, test_json_keys);
    tcase_add_test(tc, test_print_keys);
    tcase_add_test(tc, test_man_page);
    tcase_add_test(tc, test_sample);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(config_suite());
}
