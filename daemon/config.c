/*
 * config: esd.yaml through one key table. Every key is a row of keys[]
 * (dotted name, type, field offset, default text, bounds or rule, help);
 * defaults, parsing, validation, config_json and config_print_keys all walk
 * that table, and the default texts are applied by the same setter that
 * applies a value read from the file. The file is read whole (at most
 * 1 MiB) and walked with libyaml's event parser: one document whose top
 * level is a mapping, scalars and lists of scalars as values, and the
 * mappings data_juicer, ray and log holding the dotted keys. Anchors,
 * aliases and tags are refused: a configuration has no use for them. The
 * first error stops the parse and names the file and 1-based line.
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <yaml.h>

#include "fsutil.h"
#include "json.h"
#include "manifest.h"
#include "suggest.h"

/* A configuration is a page of text; anything larger is a mistake. */
#define CONFIG_MAX_BYTES (1u << 20)
/* Longest value quoted back in a message. */
#define GOT_MAX 64
#define NODE_NAME_MAX 200

enum ktype {
    KT_STR,   /* non-empty string */
    KT_PATH,  /* absolute path */
    KT_INT,   /* decimal integer in [min, max] */
    KT_BOOL,  /* true/false/yes/no/on/off */
    KT_ENUM,  /* one of names[] */
    KT_LIST,  /* sequence of non-empty strings */
    KT_WORDS, /* like KT_LIST, or one string split on blanks */
};

struct enum_name {
    const char *name;
    int value;
};

struct key {
    const char *name; /* dotted: "ray.mode" is mode: inside ray: */
    enum ktype type;
    size_t off;           /* of the field in struct esd_conf */
    const char *def;      /* default as it would be written in the file; NULL: none/empty */
    const char *computed; /* for help output: how a NULL default is computed instead */
    long min, max;        /* KT_INT */
    const struct enum_name *names; /* KT_ENUM, NULL-terminated */
    /* KT_STR, KT_PATH: extra rule; KT_LIST, KT_WORDS: rule for each item;
     * returns the rule broken ("must …") or NULL */
    const char *(*check)(const char *s);
    const char *help;
};

static const struct enum_name socket_modes[] = {
    { "0600", 0600 },
    { "0660", 0660 },
    { "0666", 0666 },
    { NULL, 0 },
};

static const struct enum_name ray_modes[] = {
    { "persistent", RAY_PERSISTENT },
    { "per-attempt", RAY_PER_ATTEMPT },
    { "off", RAY_OFF },
    { NULL, 0 },
};

static const struct enum_name log_targets[] = {
    { "auto", LOG_TARGET_AUTO },
    { "journal", LOG_TARGET_JOURNAL },
    { "stderr", LOG_TARGET_STDERR },
    { NULL, 0 },
};

static const struct enum_name log_levels[] = {
    { "err", LOG_LVL_ERR },   { "warning", LOG_LVL_WARNING }, { "notice", LOG_LVL_NOTICE },
    { "info", LOG_LVL_INFO }, { "debug", LOG_LVL_DEBUG },     { NULL, 0 },
};

/* Enum fields are written through an int. */
_Static_assert(sizeof(enum ray_mode) == sizeof(int), "enum ray_mode is not int-sized");
_Static_assert(sizeof(enum log_target) == sizeof(int), "enum log_target is not int-sized");

static const char *
node_name_rule(const char *s)
{
    /* the engine's rule for names that become file names (claimer_init) */
    return manifest_id_ok(s) ? NULL
                             : "must be at most 200 letters, digits, '.', '_' or '-', not "
                               "starting with '.'";
}

static const char *
socket_rule(const char *s)
{
    struct sockaddr_un sa;

    return strlen(s) < sizeof(sa.sun_path) ? NULL : "must be shorter than 108 bytes (sun_path)";
}

/* metrics.path: auto, off or an absolute path. */
static const char *
metrics_path_rule(const char *s)
{
    return !strcmp(s, "auto") || !strcmp(s, "off") || s[0] == '/'
               ? NULL
               : "must be auto, off or an absolute path";
}

/* An item of attempt_env: a variable name, or a prefix of names ending in
 * '*'; not one of the variables that runner.c's attempt_env() sets from
 * the user database and esd's PATH. */
static const char *
env_pattern_rule(const char *s)
{
    static const char *const fixed[] = { "HOME", "LOGNAME", "PATH", "SHELL", "USER" };
    size_t n = strcspn(s, "*");

    if ((s[n] == '*' && s[n + 1]) || (n && s[0] >= '0' && s[0] <= '9') ||
        strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_") != n)
        return "must be variable names, or prefixes ending in '*'";
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
        if (!strcmp(s, fixed[i]))
            return "must not name HOME, LOGNAME, PATH, SHELL or USER (esd sets them)";
    return NULL;
}

#define F(field) offsetof(struct esd_conf, field)
#define DAY 86400L

static const struct key keys[] = {
    { .name = "node_name",
      .type = KT_STR,
      .off = F(node_name),
      .computed = "(host name)",
      .check = node_name_rule,
      .help = "this node's name in claims, records and logs; default: the host name, made "
              "of A-Z a-z 0-9 . _ - only" },
    { .name = "slots",
      .type = KT_INT,
      .off = F(slots),
      .def = "1",
      .min = 1,
      .max = 256,
      .help = "shards this node works at once" },
    { .name = "threads",
      .type = KT_INT,
      .off = F(threads),
      .def = "0",
      .min = 0,
      .max = 256,
      .help = "threads of the prepares and merges esd runs (reading, validation, the "
              "digests); 0: the CPUs available to esd" },
    { .name = "lease_secs",
      .type = KT_INT,
      .off = F(lease_secs),
      .def = "60",
      .min = 2,
      .max = DAY,
      .help = "a claim's lease: heartbeat every lease_secs/4, taken over when older" },
    { .name = "poll_interval_secs",
      .type = KT_INT,
      .off = F(poll_interval_secs),
      .def = "20",
      .min = 1,
      .max = 3600,
      .help = "how often an idle node looks for claimable shards and new jobs (jittered)" },
    { .name = "claim_ahead",
      .type = KT_BOOL,
      .off = F(claim_ahead),
      .def = "true",
      .help = "claim a busy slot's next shard shortly before its attempt ends and let it "
              "read its configuration and connect to Ray meanwhile (warm processor only)" },
    { .name = "processor",
      .type = KT_WORDS,
      .off = F(processor),
      .help = "command that processes a shard (string split on blanks, or list); empty: "
              "dj-process, or data_juicer.python <root>/tools/process_data.py" },
    { .name = "data_juicer.root",
      .type = KT_PATH,
      .off = F(dj_root),
      .help = "a Data-Juicer checkout whose tools/process_data.py processes shards" },
    { .name = "data_juicer.python",
      .type = KT_STR,
      .off = F(dj_python),
      .def = "python3",
      .help = "the interpreter that runs <root>/tools/process_data.py" },
    { .name = "data_juicer.allow_version_mismatch",
      .type = KT_BOOL,
      .off = F(allow_version_mismatch),
      .def = "false",
      .help = "work jobs prepared with a different Data-Juicer version" },
    { .name = "data_juicer.warm",
      .type = KT_BOOL,
      .off = F(dj_warm),
      .def = "true",
      .help = "fork attempts of Data-Juicer's own processor from a warm processor that has "
              "imported Data-Juicer and Ray (false: exec each)" },
    { .name = "ray.mode",
      .type = KT_ENUM,
      .off = F(ray_mode),
      .def = "persistent",
      .names = ray_modes,
      .help = "persistent: a node-local Ray head kept by esd; per-attempt: every attempt "
              "starts its own; off: no Ray" },
    { .name = "ray.command",
      .type = KT_STR,
      .off = F(ray_command),
      .def = "ray",
      .help = "the ray program that starts the head" },
    { .name = "ray.port",
      .type = KT_INT,
      .off = F(ray_port),
      .def = "6380",
      .min = 1,
      .max = 65535,
      .help = "port of the node-local Ray head (persistent mode)" },
    { .name = "ray.temp_dir",
      .type = KT_PATH,
      .off = F(ray_temp_dir),
      .computed = "<state_dir>/ray",
      .help = "the Ray head's temporary directory" },
    { .name = "ray.args",
      .type = KT_LIST,
      .off = F(ray_args),
      .help = "extra arguments of ray start --head (list)" },
    { .name = "ray.num_gpus",
      .type = KT_INT,
      .off = F(ray_num_gpus),
      .min = 0,
      .max = 4096,
      .computed = "(auto: CUDA_VISIBLE_DEVICES, else /dev/nvidia<N>, else 0)",
      .help = "GPUs the head offers Ray (--num-gpus); empty: counted on the node" },
    { .name = "ray.start_timeout_secs",
      .type = KT_INT,
      .off = F(ray_start_timeout_secs),
      .def = "120",
      .min = 5,
      .max = 3600,
      .help = "a head whose raylet cannot take a task by then is killed and restarted" },
    { .name = "state_dir",
      .type = KT_PATH,
      .off = F(state_dir),
      .def = "/var/lib/esd",
      .help = "esd's own state: the job registry and the Ray head's files" },
    { .name = "socket",
      .type = KT_PATH,
      .off = F(socket_path),
      .def = "/run/esd/esd.sock",
      .check = socket_rule,
      .help = "the control socket esctl talks to" },
    { .name = "socket_group",
      .type = KT_STR,
      .off = F(socket_group),
      .def = "esd",
      .help = "group of the control socket; its members may change this node's work" },
    { .name = "socket_mode",
      .type = KT_ENUM,
      .off = F(socket_mode),
      .def = "0660",
      .names = socket_modes,
      .help = "mode of the control socket: 0660 (root, esd and socket_group connect), 0666 "
              "(any local user may also read status, list, logs), or 0600" },
    { .name = "spool_dir",
      .type = KT_PATH,
      .off = F(spool_dir),
      .help = "a shared directory where a job submitted on any node is registered for every "
              "node" },
    { .name = "node_status_interval_secs",
      .type = KT_INT,
      .off = F(node_status_interval_secs),
      .def = "30",
      .min = 1,
      .max = 300,
      .help = "how often this node rewrites its status file <spool_dir>/nodes/<node>.json "
              "(esctl nodes; a node silent for 3 of its intervals is down)" },
    { .name = "retention_secs",
      .type = KT_INT,
      .off = F(retention_secs),
      .def = "604800",
      .min = 0,
      .max = 3650 * DAY,
      .help = "a job over (complete, failed or cancelled) that long leaves the registry, and a "
              "merged or failed one the spool; a new node adopts no job of the spool merged "
              "that long ago; 0: kept until esctl forget" },
    { .name = "shared_fs_check",
      .type = KT_BOOL,
      .off = F(shared_fs_check),
      .def = "true",
      .help = "submit --everywhere refuses a job directory or spool_dir on a node-local file "
              "system (ext4, xfs, btrfs, tmpfs, ...); false only for tests and single-machine "
              "setups where every node shares one local disk" },
    { .name = "attempt_timeout_secs",
      .type = KT_INT,
      .off = F(attempt_timeout_secs),
      .def = "0",
      .min = 0,
      .max = 30 * DAY,
      .help = "an attempt running longer is killed and fails; 0: no limit" },
    { .name = "attempt_kill_grace_secs",
      .type = KT_INT,
      .off = F(attempt_kill_grace_secs),
      .def = "10",
      .min = 1,
      .max = 3600,
      .help = "seconds from SIGTERM to SIGKILL of every process of an attempt that is stopped "
              "(timeout, lost lease, drain, shutdown)" },
    { .name = "helper_timeout_secs",
      .type = KT_INT,
      .off = F(helper_timeout_secs),
      .def = "21600",
      .min = 60,
      .max = 30 * DAY,
      .help = "a helper process of esd's (a shard's validation and publication, a merge, a "
              "job's loading, a control operation) running longer is killed" },
    { .name = "attempt_env",
      .type = KT_WORDS,
      .off = F(attempt_env),
      .def = "LANG LANGUAGE LC_* TZ CUDA_VISIBLE_DEVICES NVIDIA_VISIBLE_DEVICES HF_ENDPOINT "
             "HF_HUB_OFFLINE HTTP_PROXY HTTPS_PROXY NO_PROXY http_proxy https_proxy no_proxy",
      .check = env_pattern_rule,
      .help = "the only variables of esd's environment that attempts get (NAME, or PREFIX*); "
              "besides, their user's HOME, USER, LOGNAME, SHELL, esd's PATH and spec 8.4's" },
    { .name = "drain_timeout_secs",
      .type = KT_INT,
      .off = F(drain_timeout_secs),
      .def = "60",
      .min = 0,
      .max = DAY,
      .help = "on SIGTERM, how long running attempts may finish before they are stopped" },
    { .name = "max_infra_failures",
      .type = KT_INT,
      .off = F(max_infra_failures),
      .def = "10",
      .min = 1,
      .max = 1000,
      .help = "infrastructure failures of one shard (lease lost, node down) before it fails" },
    { .name = "metrics.path",
      .type = KT_STR,
      .off = F(metrics_path),
      .def = "auto",
      .check = metrics_path_rule,
      .help =
          "a Prometheus textfile-collector file esd rewrites atomically; auto: " METRICS_AUTO_DIR
          "/esd.prom when that directory (node_exporter's textfile "
          "collector's on Debian) exists, else none; off: no metrics" },
    { .name = "metrics.interval_secs",
      .type = KT_INT,
      .off = F(metrics_interval_secs),
      .def = "15",
      .min = 1,
      .max = 3600,
      .help = "how often the metrics file is rewritten" },
    { .name = "log.target",
      .type = KT_ENUM,
      .off = F(log_target),
      .def = "auto",
      .names = log_targets,
      .help = "auto: journald under systemd, stderr otherwise; journal; stderr" },
    { .name = "log.level",
      .type = KT_ENUM,
      .off = F(log_level),
      .def = "info",
      .names = log_levels,
      .help = "least important messages logged: err, warning, notice, info or debug" },
};

#define NKEYS (sizeof(keys) / sizeof(keys[0]))

static void *
field(struct esd_conf *c, const struct key *k)
{
    return (char *)c + k->off;
}

static const void *
cfield(const struct esd_conf *c, const struct key *k)
{
    return (const char *)c + k->off;
}

/* ---- typed values from text ---- */

static bool
span_is(const char *s, size_t n, const char *lit)
{
    return strlen(lit) == n && memcmp(s, lit, n) == 0;
}

/* Decimal only: no 0x, no underscores, no leading zeros (YAML 1.1 octal). */
static bool
parse_decimal(const char *s, size_t n, long *ret)
{
    size_t i = 0;
    bool neg = false;
    long v = 0;

    if (i < n && (s[i] == '+' || s[i] == '-'))
        neg = s[i++] == '-';
    if (i == n || (s[i] == '0' && n - i > 1))
        return false;
    for (; i < n; i++) {
        int d = s[i] - '0';

        if (d < 0 || d > 9 || v > (LONG_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *ret = neg ? -v : v;
    return true;
}

/* 1 true, 0 false, -1 not a boolean. */
static int
parse_bool(const char *s, size_t n)
{
    static const char *const words[][3] = {
        { "true", "True", "TRUE" },    { "yes", "Yes", "YES" }, { "on", "On", "ON" },
        { "false", "False", "FALSE" }, { "no", "No", "NO" },    { "off", "Off", "OFF" },
    };

    for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
        for (size_t j = 0; j < 3; j++)
            if (span_is(s, n, words[i][j]))
                return i < 3;
    return -1;
}

static const char *
enum_name(const struct enum_name *names, int value)
{
    for (; names->name; names++)
        if (names->value == value)
            return names->name;
    return "?";
}

/* What any value of k must be, in general ("must be …"). */
static void
key_rule(const struct key *k, struct buf *b)
{
    switch (k->type) {
    case KT_STR:
        buf_puts(b, "must be a string");
        break;
    case KT_PATH:
        buf_puts(b, "must be an absolute path");
        break;
    case KT_INT:
        buf_printf(b, "must be an integer from %ld to %ld", k->min, k->max);
        break;
    case KT_BOOL:
        buf_puts(b, "must be true or false");
        break;
    case KT_ENUM:
        buf_puts(b, "must be ");
        for (size_t i = 0; k->names[i].name; i++) {
            if (i)
                buf_puts(b, k->names[i + 1].name ? ", " : " or ");
            buf_puts(b, k->names[i].name);
        }
        break;
    case KT_LIST:
        buf_puts(b, "must be a list of strings");
        break;
    case KT_WORDS:
        buf_puts(b, "must be a string or a list of strings");
        break;
    }
}

/* What a string value must be, or NULL if s[0..n) is fine for k. */
static const char *
string_rule(const struct key *k, const char *s, size_t n)
{
    if (memchr(s, '\0', n))
        return "must not contain NUL bytes";
    if (n == 0)
        return k->type == KT_PATH ? "must be an absolute path" : "must not be empty";
    if (k->type == KT_PATH && s[0] != '/')
        return "must be an absolute path";
    return k->check ? k->check(s) : NULL;
}

/*
 * Sets key k of c from one scalar, s[0..n) (plain: written without
 * quotes). Returns 0, or -EINVAL with the rule that was broken ("must be
 * …") in why; c is unchanged then.
 */
static int
key_set(struct esd_conf *c, const struct key *k, const char *s, size_t n, bool plain,
        struct buf *why)
{
    const char *rule;
    long v;
    int b;

    switch (k->type) {
    case KT_STR:
    case KT_PATH:
        if ((rule = string_rule(k, s, n))) {
            buf_puts(why, rule);
            return -EINVAL;
        }
        free(*(char **)field(c, k));
        *(char **)field(c, k) = xstrndup(s, n);
        return 0;
    case KT_INT:
        if (!plain || !parse_decimal(s, n, &v) || v < k->min || v > k->max)
            break;
        *(long *)field(c, k) = v;
        return 0;
    case KT_BOOL:
        if (!plain || (b = parse_bool(s, n)) < 0)
            break;
        *(bool *)field(c, k) = b;
        return 0;
    case KT_ENUM:
        for (const struct enum_name *e = k->names; e->name; e++)
            if (span_is(s, n, e->name)) {
                *(int *)field(c, k) = e->value;
                return 0;
            }
        break;
    case KT_WORDS: {
        struct strv words;

        if (memchr(s, '\0', n)) {
            buf_puts(why, "must not contain NUL bytes");
            return -EINVAL;
        }
        strv_init(&words);
        strv_split(&words, s);
        for (size_t i = 0; k->check && i < words.n; i++)
            if ((rule = k->check(words.v[i]))) {
                buf_printf(why, "items %s", rule);
                strv_free(&words);
                return -EINVAL;
            }
        strv_free(field(c, k));
        *(struct strv *)field(c, k) = words;
        return 0;
    }
    case KT_LIST:
        break;
    }
    key_rule(k, why);
    return -EINVAL;
}

/* ---- defaults ---- */

/* The host name made a node name: other characters than the allowed ones
 * (and a leading '.') become '-'. */
static char *
host_node_name(void)
{
    char host[256] = "";
    size_t n;

    if (gethostname(host, sizeof(host) - 1) < 0)
        host[0] = '\0';
    host[sizeof(host) - 1] = '\0';
    n = strlen(host);
    if (n > NODE_NAME_MAX)
        host[n = NODE_NAME_MAX] = '\0';
    for (size_t i = 0; i < n; i++) {
        char ch = host[i];

        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || ch == '-' || (ch == '.' && i > 0)))
            host[i] = '-';
    }
    return xstrdup(n ? host : "localhost");
}

/* The table's default texts. */
static void
defaults_from_table(struct esd_conf *c)
{
    struct buf why;

    memset(c, 0, sizeof(*c));
    /* the one key whose "unset" is not its zero: no GPU count is 0 GPUs */
    c->ray_num_gpus = -1;
    buf_init(&why);
    for (size_t i = 0; i < NKEYS; i++)
        if (keys[i].def && key_set(c, &keys[i], keys[i].def, strlen(keys[i].def), true, &why) < 0) {
            fprintf(stderr, "esd: bad default of %s: %s\n", keys[i].name, why.p);
            abort();
        }
    buf_free(&why);
}

/* The computed defaults (keys[].computed), once the file has been read. */
static void
defaults_computed(struct esd_conf *c)
{
    if (!c->node_name)
        c->node_name = host_node_name();
    if (!c->ray_temp_dir)
        c->ray_temp_dir = fs_join(c->state_dir, "ray");
    /* metrics.path auto: node_exporter's textfile directory, if there is one */
    if (c->metrics_path && (!strcmp(c->metrics_path, "auto") || !strcmp(c->metrics_path, "off"))) {
        struct stat st;
        bool on = !strcmp(c->metrics_path, "auto") && stat(METRICS_AUTO_DIR, &st) == 0 &&
                  S_ISDIR(st.st_mode);

        free(c->metrics_path);
        c->metrics_path = on ? xstrdup(METRICS_AUTO_DIR "/esd.prom") : NULL;
    }
}

void
config_defaults(struct esd_conf *c)
{
    defaults_from_table(c);
    defaults_computed(c);
}

void
config_free(struct esd_conf *c)
{
    for (size_t i = 0; i < NKEYS; i++) {
        switch (keys[i].type) {
        case KT_STR:
        case KT_PATH:
            free(*(char **)field(c, &keys[i]));
            break;
        case KT_LIST:
        case KT_WORDS:
            strv_free(field(c, &keys[i]));
            break;
        default:
            break;
        }
    }
    free(c->path);
    memset(c, 0, sizeof(*c));
}

/* ---- the YAML walk ---- */

struct parse {
    const char *file;
    const char *data;
    size_t len;
    yaml_parser_t p;
    struct esd_conf *c;
    /* line where each key was met, 0 if not yet; for a section, at the
     * index of its first key */
    unsigned long key_line[NKEYS];
    unsigned long section_line[NKEYS];
    struct esd_err *err;
};

static unsigned long
ev_line(const yaml_event_t *ev)
{
    return (unsigned long)ev->start_mark.line + 1;
}

static bool
is_null(const yaml_event_t *ev)
{
    const char *s = (const char *)ev->data.scalar.value;
    size_t n = ev->data.scalar.length;

    return ev->type == YAML_SCALAR_EVENT && ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
           (n == 0 || span_is(s, n, "~") || span_is(s, n, "null") || span_is(s, n, "Null") ||
            span_is(s, n, "NULL"));
}

/* The value of ev as written, for "got …": plain text, quoted text in
 * double quotes, or what kind of node it is. */
static void
got(const yaml_event_t *ev, struct buf *b)
{
    const char *s;
    size_t n;

    if (ev->type == YAML_SEQUENCE_START_EVENT) {
        buf_puts(b, "a list");
        return;
    }
    if (ev->type == YAML_MAPPING_START_EVENT) {
        buf_puts(b, "a mapping");
        return;
    }
    s = (const char *)ev->data.scalar.value;
    n = ev->data.scalar.length;
    if (ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE && n == 0) {
        buf_puts(b, "an empty value");
        return;
    }
    if (n > GOT_MAX) {
        if (ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE) {
            buf_append(b, s, GOT_MAX);
            buf_puts(b, "...");
        } else {
            json_escape(b, s, GOT_MAX);
            buf_puts(b, "...");
        }
    } else if (ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE) {
        buf_append(b, s, n);
    } else {
        json_escape(b, s, n);
    }
}

/* "<file>:<line>: <key> <rule>, got <value>" */
static int
bad_value(struct parse *ps, const char *name, const char *rule, const yaml_event_t *ev)
{
    struct buf b;
    int r;

    buf_init(&b);
    got(ev, &b);
    r = err_set(ps->err, -EINVAL, "%s:%lu: %s %s, got %s", ps->file, ev_line(ev), name, rule, b.p);
    buf_free(&b);
    return r;
}

static int
yaml_error(struct parse *ps)
{
    const yaml_parser_t *p = &ps->p;
    unsigned long line = (unsigned long)p->problem_mark.line + 1;
    const char *problem = p->problem ? p->problem : "unknown error";

    if (p->error == YAML_MEMORY_ERROR)
        return err_set(ps->err, -ENOMEM, "%s: out of memory while parsing YAML", ps->file);
    if (p->error == YAML_READER_ERROR) {
        /* reader errors carry a byte offset, not a mark */
        line = 1;
        for (size_t i = 0; i < p->problem_offset && i < ps->len; i++)
            line += ps->data[i] == '\n';
    }
    if (p->context)
        return err_set(ps->err, -EINVAL, "%s:%lu: invalid YAML: %s (%s)", ps->file, line, problem,
                       p->context);
    return err_set(ps->err, -EINVAL, "%s:%lu: invalid YAML: %s", ps->file, line, problem);
}

/* The next event, refusing anchors, aliases and tags. On success the
 * caller deletes *ev. */
static int
next(struct parse *ps, yaml_event_t *ev)
{
    const yaml_char_t *anchor = NULL, *tag = NULL;
    int r = 0;

    if (!yaml_parser_parse(&ps->p, ev))
        return yaml_error(ps);
    switch (ev->type) {
    case YAML_ALIAS_EVENT:
        anchor = ev->data.alias.anchor;
        break;
    case YAML_SCALAR_EVENT:
        anchor = ev->data.scalar.anchor;
        tag = ev->data.scalar.tag;
        break;
    case YAML_SEQUENCE_START_EVENT:
        anchor = ev->data.sequence_start.anchor;
        tag = ev->data.sequence_start.tag;
        break;
    case YAML_MAPPING_START_EVENT:
        anchor = ev->data.mapping_start.anchor;
        tag = ev->data.mapping_start.tag;
        break;
    default:
        break;
    }
    if (anchor)
        r = err_set(ps->err, -EINVAL,
                    "%s:%lu: YAML anchors and aliases are not supported in the configuration "
                    "(it has no need for them); write the value out",
                    ps->file, ev_line(ev));
    else if (tag)
        r = err_set(ps->err, -EINVAL,
                    "%s:%lu: YAML tags ('%s') are not supported in the configuration", ps->file,
                    ev_line(ev), (const char *)tag);
    if (r < 0)
        yaml_event_delete(ev);
    return r;
}

/* A sequence of strings (its start event consumed) into k. */
static int
parse_list(struct parse *ps, const struct key *k)
{
    struct strv v;
    yaml_event_t ev;
    struct buf rule;
    const char *item_rule;
    int r;

    strv_init(&v);
    buf_init(&rule);
    buf_printf(&rule, "items must be non-empty strings");
    for (;;) {
        if ((r = next(ps, &ev)) < 0)
            break;
        if (ev.type == YAML_SEQUENCE_END_EVENT) {
            yaml_event_delete(&ev);
            strv_free(field(ps->c, k));
            *(struct strv *)field(ps->c, k) = v;
            strv_init(&v);
            break;
        }
        if (ev.type != YAML_SCALAR_EVENT || is_null(&ev) || ev.data.scalar.length == 0 ||
            memchr(ev.data.scalar.value, '\0', ev.data.scalar.length)) {
            r = bad_value(ps, k->name, rule.p, &ev);
            yaml_event_delete(&ev);
            break;
        }
        strv_push_owned(&v, xstrndup((const char *)ev.data.scalar.value, ev.data.scalar.length));
        if (k->check && (item_rule = k->check(v.v[v.n - 1]))) {
            buf_reset(&rule);
            buf_printf(&rule, "items %s", item_rule);
            r = bad_value(ps, k->name, rule.p, &ev);
            yaml_event_delete(&ev);
            break;
        }
        yaml_event_delete(&ev);
    }
    strv_free(&v);
    buf_free(&rule);
    return r;
}

/* The value of key k (its key event consumed). */
static int
parse_value(struct parse *ps, const struct key *k)
{
    yaml_event_t ev;
    struct buf why;
    int r;

    if ((r = next(ps, &ev)) < 0)
        return r;
    buf_init(&why);
    if (ev.type == YAML_SCALAR_EVENT) {
        if (!is_null(&ev) &&
            key_set(ps->c, k, (const char *)ev.data.scalar.value, ev.data.scalar.length,
                    ev.data.scalar.style == YAML_PLAIN_SCALAR_STYLE, &why) < 0)
            r = bad_value(ps, k->name, why.p, &ev);
    } else if (ev.type == YAML_SEQUENCE_START_EVENT &&
               (k->type == KT_LIST || k->type == KT_WORDS)) {
        r = parse_list(ps, k);
    } else {
        /* a collection where a scalar belongs */
        key_rule(k, &why);
        r = bad_value(ps, k->name, why.p, &ev);
    }
    yaml_event_delete(&ev);
    buf_free(&why);
    return r;
}

static const struct key *
key_find(const char *name)
{
    for (size_t i = 0; i < NKEYS; i++)
        if (strcmp(keys[i].name, name) == 0)
            return &keys[i];
    return NULL;
}

/* Index of the first key of section name[0..n) ("ray"), or -1. */
static long
section_find(const char *name, size_t n)
{
    for (size_t i = 0; i < NKEYS; i++)
        if (strncmp(keys[i].name, name, n) == 0 && keys[i].name[n] == '.')
            return (long)i;
    return -1;
}

/* suggest_distance of two NUL-terminated names. */
static size_t
edit_distance(const char *a, const char *b)
{
    return (size_t)suggest_distance(a, strlen(a), b, strlen(b));
}

/* The key or section name nearest to name (within 2 edits, and fewer
 * edits than name has characters: 'a' is not a misspelt 'ray'), or NULL;
 * sections are candidates only at the top level. Returns a new string. */
static char *
suggest(const char *name, bool top)
{
    size_t best = strlen(name) < 3 ? strlen(name) : 3, dist;
    char *found = NULL;

    for (size_t i = 0; i < NKEYS; i++) {
        const char *dot = strchr(keys[i].name, '.');

        if ((dist = edit_distance(name, keys[i].name)) < best) {
            best = dist;
            free(found);
            found = xstrdup(keys[i].name);
        }
        if (top && dot && section_find(keys[i].name, (size_t)(dot - keys[i].name)) == (long)i) {
            char *sec = xstrndup(keys[i].name, (size_t)(dot - keys[i].name));

            if ((dist = edit_distance(name, sec)) < best) {
                best = dist;
                free(found);
                found = sec;
            } else {
                free(sec);
            }
        }
    }
    return found;
}

static int
unknown_key(struct parse *ps, const char *name, const char *leaf, unsigned long line)
{
    const char *dot = strchr(leaf, '.');
    char *near;
    int r;

    /* a dotted key at the top level: the names are dotted only in docs */
    if (dot && key_find(name))
        return err_set(ps->err, -EINVAL,
                       "%s:%lu: unknown key '%s'; write '%s' inside the '%.*s' mapping", ps->file,
                       line, name, dot + 1, (int)(dot - leaf), leaf);
    near = suggest(name, leaf == name);
    if (near)
        r = err_set(ps->err, -EINVAL, "%s:%lu: unknown key '%s'; did you mean '%s'?", ps->file,
                    line, name, near);
    else
        r = err_set(ps->err, -EINVAL, "%s:%lu: unknown key '%s'", ps->file, line, name);
    free(near);
    return r;
}

static int
duplicate(struct parse *ps, const char *name, unsigned long line, unsigned long first)
{
    return err_set(ps->err, -EINVAL, "%s:%lu: duplicate key '%s' (first at line %lu)", ps->file,
                   line, name, first);
}

static int parse_map(struct parse *ps, const char *section);

/* A section's value (its key event consumed): a mapping, or null. */
static int
parse_section(struct parse *ps, const char *name)
{
    yaml_event_t ev;
    int r;

    if ((r = next(ps, &ev)) < 0)
        return r;
    if (ev.type == YAML_MAPPING_START_EVENT)
        r = parse_map(ps, name);
    else if (!is_null(&ev))
        r = bad_value(ps, name, "must be a mapping", &ev);
    yaml_event_delete(&ev);
    return r;
}

/* The pairs of a mapping (its start event consumed) up to its end;
 * section is NULL at the top level. */
static int
parse_map(struct parse *ps, const char *section)
{
    yaml_event_t ev;
    struct buf name;
    int r;

    buf_init(&name);
    for (;;) {
        const struct key *k;
        unsigned long line, *seen;
        const char *leaf;
        long sec;

        if ((r = next(ps, &ev)) < 0)
            break;
        if (ev.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&ev);
            break;
        }
        line = ev_line(&ev);
        if (ev.type != YAML_SCALAR_EVENT) {
            r = err_set(ps->err, -EINVAL, "%s:%lu: keys must be strings, got %s", ps->file, line,
                        ev.type == YAML_SEQUENCE_START_EVENT ? "a list" : "a mapping");
            yaml_event_delete(&ev);
            break;
        }
        buf_reset(&name);
        if (section)
            buf_printf(&name, "%s.", section);
        leaf = (const char *)ev.data.scalar.value;
        buf_append(&name, leaf, strnlen(leaf, ev.data.scalar.length));
        leaf = name.p + (section ? strlen(section) + 1 : 0);
        yaml_event_delete(&ev);

        if (!section && (sec = section_find(name.p, name.len)) >= 0) {
            seen = &ps->section_line[sec];
            if (*seen) {
                r = duplicate(ps, name.p, line, *seen);
                break;
            }
            *seen = line;
            if ((r = parse_section(ps, name.p)) < 0)
                break;
            continue;
        }
        k = strchr(leaf, '.') ? NULL : key_find(name.p);
        if (!k) {
            r = unknown_key(ps, name.p, leaf, line);
            break;
        }
        seen = &ps->key_line[k - keys];
        if (*seen) {
            r = duplicate(ps, name.p, line, *seen);
            break;
        }
        *seen = line;
        if ((r = parse_value(ps, k)) < 0)
            break;
    }
    buf_free(&name);
    return r;
}

/* The stream: nothing, or one document holding a mapping (or null). */
static int
parse_stream(struct parse *ps)
{
    yaml_event_t ev;
    int r, docs = 0;

    for (;;) {
        if ((r = next(ps, &ev)) < 0)
            return r;
        switch (ev.type) {
        case YAML_STREAM_END_EVENT:
            yaml_event_delete(&ev);
            return 0;
        case YAML_DOCUMENT_START_EVENT:
            if (docs++)
                r = err_set(ps->err, -EINVAL,
                            "%s:%lu: only one YAML document is allowed, found another", ps->file,
                            ev_line(&ev));
            break;
        case YAML_MAPPING_START_EVENT:
            r = parse_map(ps, NULL);
            break;
        case YAML_SCALAR_EVENT:
        case YAML_SEQUENCE_START_EVENT:
            if (!is_null(&ev))
                r = bad_value(ps, "the top level", "must be a mapping of keys to values", &ev);
            break;
        default:
            break;
        }
        yaml_event_delete(&ev);
        if (r < 0)
            return r;
    }
}

int
config_load(const char *path, struct esd_conf *ret, struct esd_err *err)
{
    struct parse *ps;
    struct esd_conf c;
    char *data;
    size_t len;
    int r;

    if ((r = fs_read_file(path, CONFIG_MAX_BYTES, &data, &len, err)) < 0)
        return r;
    defaults_from_table(&c);
    /* key_line[] is a few hundred bytes: keep it off the stack */
    ps = xcalloc(1, sizeof(*ps));
    ps->file = path;
    ps->data = data;
    ps->len = len;
    ps->c = &c;
    ps->err = err;
    if (!yaml_parser_initialize(&ps->p)) {
        r = err_set(err, -ENOMEM, "%s: out of memory while parsing YAML", path);
    } else {
        yaml_parser_set_input_string(&ps->p, (const unsigned char *)data, len);
        r = parse_stream(ps);
        yaml_parser_delete(&ps->p);
    }
    free(ps);
    free(data);
    if (r < 0) {
        config_free(&c);
        return r;
    }
    defaults_computed(&c);
    c.path = xstrdup(path);
    *ret = c;
    return 0;
}

/* ---- output ---- */

static cJSON *
key_json(const struct esd_conf *c, const struct key *k)
{
    const struct strv *v;
    const char *s;
    cJSON *a;

    switch (k->type) {
    case KT_STR:
    case KT_PATH:
        s = *(char *const *)cfield(c, k);
        return s ? cJSON_CreateString(s) : cJSON_CreateNull();
    case KT_INT:
        /* a computed default (ray.num_gpus's auto) is below the range */
        if (k->computed && *(const long *)cfield(c, k) < k->min)
            return cJSON_CreateNull();
        return cJSON_CreateNumber((double)*(const long *)cfield(c, k));
    case KT_BOOL:
        return cJSON_CreateBool(*(const bool *)cfield(c, k));
    case KT_ENUM:
        return cJSON_CreateString(enum_name(k->names, *(const int *)cfield(c, k)));
    case KT_LIST:
    case KT_WORDS:
        v = cfield(c, k);
        a = cJSON_CreateArray();
        for (size_t i = 0; i < v->n; i++)
            cJSON_AddItemToArray(a, cJSON_CreateString(v->v[i]));
        return a;
    }
    abort();
}

cJSON *
config_json(const struct esd_conf *c)
{
    cJSON *root = cJSON_CreateObject();

    for (size_t i = 0; i < NKEYS; i++) {
        const char *name = keys[i].name, *dot = strchr(name, '.');
        cJSON *parent = root;

        if (dot) {
            char *sec = xstrndup(name, (size_t)(dot - name));

            parent = cJSON_GetObjectItemCaseSensitive(root, sec);
            if (!parent) {
                parent = cJSON_CreateObject();
                cJSON_AddItemToObject(root, sec, parent);
            }
            free(sec);
            name = dot + 1;
        }
        cJSON_AddItemToObject(parent, name, key_json(c, &keys[i]));
    }
    return root;
}

size_t
config_nkeys(void)
{
    return NKEYS;
}

const char *
config_key_name(size_t i)
{
    return i < NKEYS ? keys[i].name : NULL;
}

void
config_print_keys(void)
{
    struct buf type, list;

    buf_init(&type);
    buf_init(&list);
    for (size_t i = 0; i < NKEYS; i++) {
        const struct key *k = &keys[i];
        const char *def = k->def ? k->def : k->computed ? k->computed : "(none)";

        buf_reset(&type);
        switch (k->type) {
        case KT_STR:
            buf_puts(&type, "string");
            break;
        case KT_PATH:
            buf_puts(&type, "path");
            break;
        case KT_INT:
            buf_printf(&type, "integer %ld..%ld", k->min, k->max);
            break;
        case KT_BOOL:
            buf_puts(&type, "boolean");
            break;
        case KT_ENUM:
            for (size_t j = 0; k->names[j].name; j++)
                buf_printf(&type, "%s%s", j ? "|" : "", k->names[j].name);
            break;
        case KT_LIST:
        case KT_WORDS: {
            /* the default as a YAML list, like config_json */
            struct strv words;

            buf_puts(&type, k->type == KT_LIST ? "list" : "string|list");
            strv_init(&words);
            strv_split(&words, k->def ? k->def : "");
            buf_reset(&list);
            buf_putc(&list, '[');
            for (size_t j = 0; j < words.n; j++)
                buf_printf(&list, "%s%s", j ? ", " : "", words.v[j]);
            buf_putc(&list, ']');
            def = list.p;
            strv_free(&words);
            break;
        }
        }
        printf("%s\t%s\t%s\t%s\n", k->name, type.p, def, k->help);
    }
    buf_free(&list);
    buf_free(&type);
}
