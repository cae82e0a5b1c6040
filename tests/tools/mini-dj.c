/*
 * mini-dj: a TEST STAND-IN for Data-Juicer's tools/process_data.py
 * (dj-process) run with the Ray executor. It is NOT Data-Juicer and talks to
 * no Ray cluster; fast tests run it where a worker would run the real thing
 * (spec §8.4), and its output has the shape of Ray's (spec §8.5).
 *
 * Flags: exactly the ten the worker passes, each with a value, in any order,
 * as "--flag value" or "--flag=value": --config --dataset_path --export_path
 * --executor_type --ray_address --work_dir --job_id --event_log_dir
 * --checkpoint_dir --partition_dir. An unknown, repeated, empty or missing
 * flag is an error (exit 2). --executor_type must be "ray", or "default"
 * (Data-Juicer's own executor: no Ray is reached, and the output is ONE
 * JSONL file at --export_path, rows in input order). --ray_address is
 * "local" (accepted as is) or [ray://]host:port, where something must accept
 * a TCP connection within 2 s, as a Ray client needs its head (exit 3
 * "cannot reach Ray at host:port" otherwise).
 *
 * Recipe: the YAML file's "process" list (libyaml events, first document;
 * absent or null means no operators). Three operators exist, applied in
 * recipe order to the "text" member of every record (the last one if the
 * key is repeated, as Python keeps the last duplicate); any other operator
 * name is "mini-dj: unsupported operator X", exit 2. Other arguments than
 * the ones below are ignored.
 *   whitespace_normalization_mapper: every run of whitespace in "text"
 *     becomes one space and leading/trailing whitespace goes. Whitespace is
 *     ASCII \t \n \v \f \r and space, U+0084, U+0085, U+00A0, U+1680,
 *     U+2000-U+200D, U+2028, U+2029, U+202F, U+205F, U+2060, U+3000,
 *     U+FEFF, U+FFFC. (Real Data-Juicer replaces EACH such character by a
 *     space instead of each run: never compare the two.) Records without a
 *     string "text" are left alone.
 *   document_deduplicator: a record whose "text" equals (byte for byte)
 *     that of an earlier record is dropped; arguments are ignored (real
 *     Data-Juicer hashes the text, by default as is: the same records).
 *   text_length_filter: min_len (default 10) and max_len (default
 *     unlimited), length in Unicode code points of "text"; records outside
 *     [min_len, max_len], or without a string "text", are dropped.
 * An edited record is the input record's bytes with only the value of
 * "text" replaced by the new JSON string (raw UTF-8, escapes as Python's
 * json.dumps(ensure_ascii=False)); every other byte, big integers included,
 * is kept. Input records are checked as the worker checks them (spec §6.3);
 * an invalid one ends the run with exit 1.
 *
 * Output (Ray style, as Data-Juicer 1.6.1 on Ray 2.x writes it; see
 * tests/integration/real_dj.sh): --export_path becomes a DIRECTORY of
 * part files. With M kept rows and P = MINI_DJ_PARTS (default 12), the
 * rows are cut into P contiguous chunks in input order, numpy.array_split
 * style: chunk i (0-based) holds q + (i < r ? 1 : 0) rows, q = M / P,
 * r = M % P, starting at row i*q + min(i, r). Only non-empty chunks are
 * written, so the parts are 0 .. N-1 with N = min(M, P). Part i is named
 *     <dataset-id>_<task-id>_000000.json
 * where
 *   dataset-id  22 characters, the same for every part of a run:
 *               character k (0..21) is ALNUM[b_k mod 62], where b_k is
 *               byte k of SHA-256(--job_id as given) and ALNUM the 62
 *               characters 0-9, A-Z, a-z in that (ASCII) order;
 *   task-id     the first 32 (lower-case hex) digits of the SHA-256 of the
 *               ASCII string "mini-dj task <i>", i in decimal without
 *               padding: it depends on the part index only, not on P, M or
 *               the job;
 *   000000      the block number, always 0 (one block per task).
 * Each part holds its chunk as JSON lines, every row ending in "\n". As the
 * dataset id is shared, the plain string order of the names is the order
 * of the task ids, which is NOT the part (= input) order: part 1 sorts
 * before part 0, and for the default P = 12 the string order is
 *     parts 5, 11, 7, 9, 1, 6, 10, 8, 0, 3, 4, 2
 * (for N < 12 parts: this list without the indices >= N, e.g. 1, 0, 3, 4, 2
 * for N = 5). A reader that orders by name, as the worker and the
 * reference do, therefore gets a shard's chunks in this order, not in
 * input order. (Ray's task ids are random; these are fixed so that tests
 * can name the files and predict the order.) The parts are written
 * (created) in this string order too.
 * Nothing else is written: no _SUCCESS and no checksum files (the real
 * export has none) unless MINI_DJ_SUCCESS=1. With no rows left the
 * directory is created EMPTY, or nothing is created at all with
 * MINI_DJ_EMPTY=nodir.
 *
 * Side effects: creates --work_dir and --event_log_dir (with events.log,
 * one line per step) if missing; prints progress lines on stdout and
 * stderr. --checkpoint_dir and --partition_dir are only checked for
 * presence.
 *
 * Knobs (environment). The failure knobs (MINI_DJ_EXIT, _SLEEP_MS, _HANG,
 * _CRASH, _BAD, _NO_EXPORT, _SPAWN_CHILD, _ESCAPE) act only when MINI_DJ_ONLY and
 * MINI_DJ_FAIL_ONCE allow it; the others always act.
 *   MINI_DJ_EXIT=N         exit N at once after the flags are checked
 *   MINI_DJ_SLEEP_MS=N     sleep N ms per input row
 *   MINI_DJ_HANG=1         after reading the input print "mini-dj: hanging"
 *                          and sleep until killed (SIGTERM/SIGKILL kill it)
 *   MINI_DJ_CRASH=1        write the parts in string order as usual but stop
 *                          after ceil(M/2) rows (the part being written
 *                          holds the rows it got so far), write no _SUCCESS
 *                          or .crc for it, then abort() (SIGABRT, no core
 *                          file). Read in string order, what is left is the
 *                          first ceil(M/2) rows of a full run read in string
 *                          order.
 *   MINI_DJ_BAD=MODE       put one bad line into the FIRST part in string
 *                          order (the written part with the smallest task id,
 *                          the one a reader opens first: part 5 with the
 *                          default P = 12 and M >= 12) as its line 2, after
 *                          its first row; with no rows (M = 0) part 0 is
 *                          written holding the bad line alone (line 1), even
 *                          with MINI_DJ_EMPTY=nodir. Exit 0; stderr names the
 *                          file. MODE is invalid (cut-off JSON), blank (empty
 *                          line), notobject (a JSON array) or badutf8 (a 0xff
 *                          byte inside a string)
 *   MINI_DJ_NO_EXPORT=1    process, then exit 0 without creating --export_path
 *   MINI_DJ_SPAWN_CHILD=1  fork a child that sleeps forever in mini-dj's
 *                          process group, keeping its stdout/stderr open, and
 *                          print "mini-dj: spawned child pid N"
 *   MINI_DJ_ESCAPE=MODE    leave a process behind that escapes the process
 *                          group, keeps stdout/stderr (the output pipe) open,
 *                          ignores SIGTERM and SIGHUP and sleeps until killed:
 *                          setsid (a child that calls setsid()) or double (a
 *                          child that forks a grandchild calling setsid()
 *                          and exits at once, so the grandchild is an
 *                          orphan). Prints "mini-dj: escaped pid N (MODE)"
 *                          with the escaped process's pid
 *   MINI_DJ_ONLY=SUBSTR    failure knobs only if --dataset_path contains SUBSTR
 *   MINI_DJ_FAIL_ONCE=DIR  failure knobs only on the first run for a given
 *                          --dataset_path: that run creates the marker
 *                          DIR/<first 16 hex of sha256(path as given)>.once
 *                          (DIR is created if missing)
 *   MINI_DJ_PARTS=N        number of chunks, 1..100000 (default 12)
 *   MINI_DJ_EMPTY=dir|nodir  no row left: an empty directory (dir, the
 *                          default, as Ray) or no export path at all (nodir)
 *   MINI_DJ_SUCCESS=1      also write what Spark/Hadoop-style writers add and
 *                          Ray does not, for tests that readers skip names
 *                          starting with "." or "_": a hidden ".<part>.crc"
 *                          after each complete part (not JSONL) and an empty
 *                          "_SUCCESS" at the end (so an all-filtered run
 *                          leaves _SUCCESS alone). Default 0: neither
 *   MINI_DJ_RAY_EACH_ROW=1 with a host:port --ray_address, connect to it
 *                          again before every input row, as a Ray job keeps
 *                          talking to its head; when that fails, exit 3
 *                          "lost the Ray head at host:port"
 *   MINI_DJ_RECORD=FILE    append one JSON line per invocation, before the
 *                          flags are checked: {"argv":[...],"cwd":"...",
 *                          "env":{"DJ_PRODUCED_DATA_DIR":..,"HF_HOME":..,
 *                          "PYTHONPATH":..,"XDG_CACHE_HOME":..},"pid":N,
 *                          "environ":["NAME=value",...],"fds":[0,1,2,...],
 *                          "status":{"SigBlk":..,"SigIgn":..,"Uid":..,
 *                          "Gid":..,"Groups":..}} (null for an unset
 *                          variable; environ is the whole environment in
 *                          its order, fds the open descriptors, status
 *                          those lines of /proc/self/status as written,
 *                          tabs kept: what the process was given)
 *
 * Exit status: 0 ok; 1 input or I/O error; 2 usage, knob or recipe error;
 * 3 Ray unreachable; N for MINI_DJ_EXIT=N; killed by SIGABRT for CRASH.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <yaml.h>

#include "fsutil.h"
#include "json.h"
#include "jsonl.h"
#include "sha256.h"
#include "util.h"

#define RECIPE_MAX ((size_t)16 << 20)
#define CONNECT_TIMEOUT_MS 2000
#define PARTS_MAX 100000

/* ---- usage ---- */

static void
usage(FILE *f)
{
    fputs(
        "usage: mini-dj --config RECIPE --dataset_path SHARD.jsonl --export_path DIR\n"
        "               --executor_type ray|default --ray_address local|HOST:PORT --work_dir DIR\n"
        "               --job_id ID --event_log_dir DIR --checkpoint_dir DIR --partition_dir DIR\n"
        "\n"
        "mini-dj is a TEST STAND-IN for Data-Juicer's process_data.py / dj-process with the\n"
        "Ray executor. It is not Data-Juicer and uses no Ray cluster. It knows three operators,\n"
        "whitespace_normalization_mapper (runs of whitespace -> one space, trimmed; real\n"
        "Data-Juicer replaces each character), document_deduplicator (exact text) and\n"
        "text_length_filter (min_len default 10,\n"
        "max_len default unlimited, in code points), and writes Ray-style output: part i\n"
        "(contiguous chunks of the kept rows in input order, chunk i = rows\n"
        "[i*q+min(i,r), +q+(i<r)), q=M/P, r=M%P, empty chunks not written) goes to\n"
        "EXPORT_PATH/<dataset-id>_<task-id>_000000.json, dataset-id = 22 alphanumerics\n"
        "from sha256(job id), task-id = first 32 hex of sha256(\"mini-dj task <i>\"), so\n"
        "name order is not part order (P=12: 5 11 7 9 1 6 10 8 0 3 4 2). No _SUCCESS, no\n"
        ".crc files (see MINI_DJ_SUCCESS); no rows left: an empty directory.\n"
        "\n"
        "Every flag takes a value, as --flag VALUE or --flag=VALUE; all ten are required.\n"
        "\n"
        "environment (failure knobs marked * obey MINI_DJ_ONLY and MINI_DJ_FAIL_ONCE):\n"
        "  MINI_DJ_EXIT=N          * exit N right after checking the flags\n"
        "  MINI_DJ_SLEEP_MS=N      * sleep N ms per input row\n"
        "  MINI_DJ_HANG=1          * after reading the input, sleep until killed\n"
        "  MINI_DJ_CRASH=1         * write half of the rows (in name order), then abort()\n"
        "  MINI_DJ_BAD=MODE        * put a bad line (invalid|blank|notobject|badutf8) into\n"
        "                            the first part in name order as line 2 (part 0, line 1\n"
        "                            without rows), exit 0\n"
        "  MINI_DJ_NO_EXPORT=1     * exit 0 without creating the export path\n"
        "  MINI_DJ_SPAWN_CHILD=1   * fork a child sleeping forever in this process group\n"
        "  MINI_DJ_ESCAPE=MODE     * leave a process that left the group (setsid: a child\n"
        "                            calling setsid; double: an orphaned grandchild), holds\n"
        "                            the output open, ignores SIGTERM and sleeps forever\n"
        "  MINI_DJ_ONLY=SUBSTR       failure knobs only if --dataset_path contains SUBSTR\n"
        "  MINI_DJ_FAIL_ONCE=DIR     failure knobs only on the first run per dataset\n"
        "                            (marker files in DIR)\n"
        "  MINI_DJ_PARTS=N           number of chunks P (default 12)\n"
        "  MINI_DJ_EMPTY=dir|nodir   no rows left: an empty directory (dir) or no export path\n"
        "  MINI_DJ_SUCCESS=1         also write an empty _SUCCESS and a hidden .<part>.crc\n"
        "                            per part (not JSONL)\n"
        "  MINI_DJ_RAY_EACH_ROW=1    reach the Ray head again before every row; exit 3 when\n"
        "                            it is gone\n"
        "  MINI_DJ_RECORD=FILE       append {argv, cwd, env, pid, environ, fds, status} as one\n"
        "                            JSON line\n"
        "\n"
        "exit status: 0 ok, 1 input or I/O error, 2 usage/knob/recipe error,\n"
        "3 Ray unreachable, N for MINI_DJ_EXIT=N, SIGABRT for MINI_DJ_CRASH.\n",
        f);
}

/* ---- flags ---- */

struct opts {
    const char *config;
    const char *dataset_path;
    const char *export_path;
    const char *executor_type;
    const char *ray_address;
    const char *work_dir;
    const char *job_id;
    const char *event_log_dir;
    const char *checkpoint_dir;
    const char *partition_dir;
};

static const struct flag {
    const char *name;
    size_t off;
} flags[] = {
    { "config", offsetof(struct opts, config) },
    { "dataset_path", offsetof(struct opts, dataset_path) },
    { "export_path", offsetof(struct opts, export_path) },
    { "executor_type", offsetof(struct opts, executor_type) },
    { "ray_address", offsetof(struct opts, ray_address) },
    { "work_dir", offsetof(struct opts, work_dir) },
    { "job_id", offsetof(struct opts, job_id) },
    { "event_log_dir", offsetof(struct opts, event_log_dir) },
    { "checkpoint_dir", offsetof(struct opts, checkpoint_dir) },
    { "partition_dir", offsetof(struct opts, partition_dir) },
};
#define NFLAGS (sizeof(flags) / sizeof(flags[0]))

static const char **
flag_slot(struct opts *o, const struct flag *f)
{
    return (const char **)((char *)o + f->off);
}

/* Parses argv into o; values point into argv. */
static int
opts_parse(int argc, char **argv, struct opts *o, struct esd_err *err)
{
    memset(o, 0, sizeof(*o));
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *name, *eq, *val;
        const struct flag *f = NULL;
        size_t nlen;

        if (strncmp(a, "--", 2) != 0)
            return err_set(err, -EINVAL, "unexpected argument '%s'", a);
        name = a + 2;
        eq = strchr(name, '=');
        nlen = eq ? (size_t)(eq - name) : strlen(name);
        for (size_t k = 0; k < NFLAGS && !f; k++)
            if (strlen(flags[k].name) == nlen && memcmp(flags[k].name, name, nlen) == 0)
                f = &flags[k];
        if (!f)
            return err_set(err, -EINVAL, "unknown flag '--%.*s'", (int)nlen, name);
        if (eq) {
            val = eq + 1;
        } else {
            if (i + 1 >= argc || strncmp(argv[i + 1], "--", 2) == 0)
                return err_set(err, -EINVAL, "--%s needs a value", f->name);
            val = argv[++i];
        }
        if (!*val)
            return err_set(err, -EINVAL, "--%s must not be empty", f->name);
        if (*flag_slot(o, f))
            return err_set(err, -EINVAL, "--%s given twice", f->name);
        *flag_slot(o, f) = val;
    }
    for (size_t k = 0; k < NFLAGS; k++)
        if (!*flag_slot(o, &flags[k]))
            return err_set(err, -EINVAL, "missing flag --%s", flags[k].name);
    if (strcmp(o->executor_type, "ray") != 0 && strcmp(o->executor_type, "default") != 0)
        return err_set(err, -EINVAL, "--executor_type must be ray or default, not '%s'",
                       o->executor_type);
    return 0;
}

/* ---- knobs ---- */

enum bad_mode { BAD_NONE, BAD_INVALID, BAD_BLANK, BAD_NOTOBJECT, BAD_BADUTF8 };

static const struct {
    const char *name;
    const char *line; /* without "\n" */
} bad_lines[] = {
    [BAD_NONE] = { "", "" },
    [BAD_INVALID] = { "invalid", "{\"text\": \"mini-dj: this record is cut short" },
    [BAD_BLANK] = { "blank", "" },
    [BAD_NOTOBJECT] = { "notobject", "[\"mini-dj\", \"a JSON array, not an object\"]" },
    [BAD_BADUTF8] = { "badutf8", "{\"text\": \"mini-dj: invalid UTF-8 \xff here\"}" },
};

struct knobs {
    int exit_code; /* -1: not set */
    long long sleep_ms;
    bool hang, crash, no_export, spawn_child;
    const char *escape; /* NULL, "setsid" or "double" */
    enum bad_mode bad;
    const char *only, *fail_once, *record;
    long long parts;
    bool empty_nodir, success, ray_each_row;
};

/* The head of a host:port --ray_address (NULL: local). */
static const char *ray_host, *ray_port;

static int
env_int(const char *name, long long min, long long max, long long dflt, long long *ret,
        struct esd_err *err)
{
    const char *v = getenv(name);

    if (!v || !*v) {
        *ret = dflt;
        return 0;
    }
    if (parse_int(v, min, max, ret) < 0)
        return err_set(err, -EINVAL, "%s must be an integer in %lld..%lld, not '%s'", name, min,
                       max, v);
    return 0;
}

static int
env_bool(const char *name, bool *ret, struct esd_err *err)
{
    const char *v = getenv(name);

    if (!v || !*v || strcmp(v, "0") == 0)
        *ret = false;
    else if (strcmp(v, "1") == 0)
        *ret = true;
    else
        return err_set(err, -EINVAL, "%s must be 0 or 1, not '%s'", name, v);
    return 0;
}

static const char *
env_str(const char *name)
{
    const char *v = getenv(name);

    return v && *v ? v : NULL;
}

static int
knobs_parse(struct knobs *k, struct esd_err *err)
{
    const char *v;
    long long n;
    int r;

    memset(k, 0, sizeof(*k));
    if ((r = env_int("MINI_DJ_EXIT", 0, 255, -1, &n, err)) < 0)
        return r;
    k->exit_code = (int)n;
    if ((r = env_int("MINI_DJ_SLEEP_MS", 0, 3600000, 0, &k->sleep_ms, err)) < 0 ||
        (r = env_int("MINI_DJ_PARTS", 1, PARTS_MAX, 12, &k->parts, err)) < 0 ||
        (r = env_bool("MINI_DJ_HANG", &k->hang, err)) < 0 ||
        (r = env_bool("MINI_DJ_CRASH", &k->crash, err)) < 0 ||
        (r = env_bool("MINI_DJ_NO_EXPORT", &k->no_export, err)) < 0 ||
        (r = env_bool("MINI_DJ_SPAWN_CHILD", &k->spawn_child, err)) < 0 ||
        (r = env_bool("MINI_DJ_SUCCESS", &k->success, err)) < 0 ||
        (r = env_bool("MINI_DJ_RAY_EACH_ROW", &k->ray_each_row, err)) < 0)
        return r;
    if ((v = env_str("MINI_DJ_BAD"))) {
        for (size_t i = BAD_INVALID; i <= BAD_BADUTF8 && !k->bad; i++)
            if (strcmp(v, bad_lines[i].name) == 0)
                k->bad = (enum bad_mode)i;
        if (!k->bad)
            return err_set(err, -EINVAL,
                           "MINI_DJ_BAD must be invalid, blank, notobject or badutf8, not '%s'", v);
    }
    if ((v = env_str("MINI_DJ_ESCAPE"))) {
        if (strcmp(v, "setsid") != 0 && strcmp(v, "double") != 0)
            return err_set(err, -EINVAL, "MINI_DJ_ESCAPE must be setsid or double, not '%s'", v);
        k->escape = v;
    }
    if ((v = env_str("MINI_DJ_EMPTY")) && strcmp(v, "dir") != 0) {
        if (strcmp(v, "nodir") != 0)
            return err_set(err, -EINVAL, "MINI_DJ_EMPTY must be dir or nodir, not '%s'", v);
        k->empty_nodir = true;
    }
    k->only = env_str("MINI_DJ_ONLY");
    k->fail_once = env_str("MINI_DJ_FAIL_ONCE");
    k->record = env_str("MINI_DJ_RECORD");
    return 0;
}

static void
knobs_disarm(struct knobs *k)
{
    k->exit_code = -1;
    k->sleep_ms = 0;
    k->hang = k->crash = k->no_export = k->spawn_child = false;
    k->escape = NULL;
    k->bad = BAD_NONE;
}

/*
 * Decides whether the failure knobs act on this run (MINI_DJ_ONLY,
 * MINI_DJ_FAIL_ONCE) and disarms them if not. The FAIL_ONCE marker is
 * "<DIR>/<first 16 hex of sha256(dataset path)>.once", created with O_EXCL.
 */
static int
knobs_gate(struct knobs *k, const char *dataset, struct esd_err *err)
{
    char hex[SHA256_HEX_LEN + 1];
    char *marker;
    int r;

    if (k->only && !strstr(dataset, k->only)) {
        fprintf(stderr, "mini-dj: MINI_DJ_ONLY=%s does not match, failure knobs off\n", k->only);
        knobs_disarm(k);
        return 0;
    }
    if (!k->fail_once)
        return 0;
    if ((r = fs_mkdir_p(k->fail_once, 0755, err)) < 0)
        return r;
    sha256_buf(dataset, strlen(dataset), hex);
    marker = xasprintf("%s/%.16s.once", k->fail_once, hex);
    r = fs_create_excl(marker, dataset, strlen(dataset), 0644, NULL, err);
    free(marker);
    if (r == -EEXIST) {
        fprintf(stderr,
                "mini-dj: MINI_DJ_FAIL_ONCE: failed once already for %s, "
                "failure knobs off\n",
                dataset);
        knobs_disarm(k);
        return 0;
    }
    return r;
}

/* ---- invocation record ---- */

/* A JSON string for s; invalid UTF-8 bytes become U+FFFD. */
static void
put_str(struct buf *out, const char *s)
{
    size_t n = strlen(s), bad;
    struct buf tmp;

    if (jsonl_utf8_valid(s, n, &bad)) {
        json_escape(out, s, n);
        return;
    }
    buf_init(&tmp);
    while (!jsonl_utf8_valid(s, n, &bad)) {
        buf_append(&tmp, s, bad);
        buf_puts(&tmp, "\xef\xbf\xbd");
        s += bad + 1;
        n -= bad + 1;
    }
    buf_append(&tmp, s, n);
    json_escape(out, tmp.p, tmp.len);
    buf_free(&tmp);
}

/* What the process was given besides its arguments: its whole
 * environment, its open descriptors (before the record file is opened),
 * its signal mask and ignored signals, its credentials. */
static void
record_given(struct buf *b)
{
    static const char *const lines[] = { "SigBlk", "SigIgn", "Uid", "Gid", "Groups" };
    extern char **environ;
    DIR *d = opendir("/proc/self/fd");
    FILE *st;
    const struct dirent *e;
    char line[4096];
    bool first = true;

    buf_puts(b, ",\"environ\":[");
    for (char **v = environ; v && *v; v++) {
        if (v != environ)
            buf_putc(b, ',');
        put_str(b, *v);
    }
    buf_puts(b, "],\"fds\":[");
    while (d && (e = readdir(d))) {
        char *end;
        long fd = strtol(e->d_name, &end, 10);

        /* the listing's own descriptor is not one it was given (procfs
         * lists in numeric order) */
        if (*end || end == e->d_name || fd == dirfd(d))
            continue;
        buf_printf(b, "%s%ld", first ? "" : ",", fd);
        first = false;
    }
    if (d)
        closedir(d);
    st = fopen("/proc/self/status", "re");
    buf_puts(b, "],\"status\":{");
    first = true;
    while (st && fgets(line, sizeof(line), st)) {
        size_t n = strcspn(line, ":");

        line[strcspn(line, "\n")] = '\0';
        for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++)
            if (line[n] == ':' && n == strlen(lines[i]) && !strncmp(line, lines[i], n)) {
                buf_printf(b, "%s\"%s\":", first ? "" : ",", lines[i]);
                put_str(b, line + n + 1 + strspn(line + n + 1, "\t"));
                first = false;
            }
    }
    if (st)
        fclose(st);
    buf_putc(b, '}');
}

static int
record_invocation(const char *path, int argc, char **argv, struct esd_err *err)
{
    static const char *const vars[] = { "DJ_PRODUCED_DATA_DIR", "HF_HOME", "PYTHONPATH",
                                        "XDG_CACHE_HOME" };
    struct buf b;
    char *cwd = getcwd(NULL, 0);
    int fd, r = 0;

    buf_init(&b);
    buf_puts(&b, "{\"argv\":[");
    for (int i = 0; i < argc; i++) {
        if (i)
            buf_putc(&b, ',');
        put_str(&b, argv[i]);
    }
    buf_puts(&b, "],\"cwd\":");
    if (cwd)
        put_str(&b, cwd);
    else
        buf_puts(&b, "null");
    buf_puts(&b, ",\"env\":{");
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *v = getenv(vars[i]);

        buf_printf(&b, "%s\"%s\":", i ? "," : "", vars[i]);
        if (v)
            put_str(&b, v);
        else
            buf_puts(&b, "null");
    }
    buf_printf(&b, "},\"pid\":%ld", (long)getpid());
    record_given(&b);
    buf_puts(&b, "}\n");
    free(cwd);
    /* One write() with O_APPEND: lines of concurrent runs do not mix. */
    fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0 || fs_write_all(fd, b.p, b.len) < 0)
        r = err_sys(err, -errno, "cannot append to MINI_DJ_RECORD file %s", path);
    if (fd >= 0)
        close(fd);
    buf_free(&b);
    return r;
}

/* ---- Ray reachability ---- */

/*
 * Splits "[ray://]host:port" (host may be "[v6addr]") into ret_host and
 * ret_port (caller frees). "local" gives 0 with *ret_host NULL.
 */
static int
ray_parse(const char *addr, char **ret_host, char **ret_port, struct esd_err *err)
{
    const char *a = addr, *colon;
    size_t hlen;
    long long port;

    *ret_host = *ret_port = NULL;
    if (strcmp(addr, "local") == 0)
        return 0;
    if (strncmp(a, "ray://", 6) == 0)
        a += 6;
    colon = strrchr(a, ':');
    if (!colon || colon == a || parse_int(colon + 1, 1, 65535, &port) < 0)
        return err_set(err, -EINVAL,
                       "unsupported --ray_address '%s' (the stand-in takes local or host:port)",
                       addr);
    hlen = (size_t)(colon - a);
    if (a[0] == '[' && hlen >= 2 && a[hlen - 1] == ']') {
        a++;
        hlen -= 2;
    }
    *ret_host = xstrndup(a, hlen);
    *ret_port = xasprintf("%lld", port);
    return 0;
}

/* 0 if a TCP connect to one of ai's addresses succeeds within the timeout. */
static int
try_connect(const struct addrinfo *ai)
{
    struct pollfd pfd;
    int fd, soerr = 0, r;
    socklen_t len = sizeof(soerr);

    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0)
        return -errno;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
        close(fd);
        return 0;
    }
    if (errno != EINPROGRESS) {
        r = -errno;
        close(fd);
        return r;
    }
    pfd.fd = fd;
    pfd.events = POLLOUT;
    do
        r = poll(&pfd, 1, CONNECT_TIMEOUT_MS);
    while (r < 0 && errno == EINTR);
    if (r == 0)
        r = -ETIMEDOUT;
    else if (r < 0)
        r = -errno;
    else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) < 0)
        r = -errno;
    else
        r = soerr ? -soerr : 0;
    close(fd);
    return r;
}

static int
ray_reach(const char *host, const char *port, struct esd_err *err)
{
    struct addrinfo hints = { .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV };
    struct addrinfo *res, *ai;
    int r = -EHOSTUNREACH, g;

    g = getaddrinfo(host, port, &hints, &res);
    if (g != 0)
        return err_set(err, -EHOSTUNREACH, "cannot reach Ray at %s:%s: %s", host, port,
                       gai_strerror(g));
    for (ai = res; ai; ai = ai->ai_next)
        if ((r = try_connect(ai)) == 0)
            break;
    freeaddrinfo(res);
    if (r < 0)
        return err_set(err, r, "cannot reach Ray at %s:%s: %s", host, port, strerror(-r));
    return 0;
}

/* ---- recipe ---- */

enum op_kind { OP_WHITESPACE, OP_LENGTH, OP_DEDUP };

static const struct {
    const char *name;
    enum op_kind kind;
} op_table[] = {
    { "whitespace_normalization_mapper", OP_WHITESPACE },
    { "text_length_filter", OP_LENGTH },
    { "document_deduplicator", OP_DEDUP },
};

/* The texts an OP_DEDUP saw: open addressing on FNV-1a, texts in one buffer. */
struct seen {
    struct buf texts;
    struct seen_slot {
        uint64_t hash;
        size_t off, len; /* len + 1; 0: free */
    } * slots;
    size_t n, cap;
};

struct op {
    enum op_kind kind;
    long long min_len, max_len; /* OP_LENGTH */
    struct seen *seen;          /* OP_DEDUP */
};

struct recipe {
    struct op *ops;
    size_t n, cap;
};

/* libyaml's event parser with the one current event. */
struct yw {
    yaml_parser_t p;
    yaml_event_t ev;
    bool have;
    const char *path;
};

static int
yw_next(struct yw *y, struct esd_err *err)
{
    if (y->have)
        yaml_event_delete(&y->ev);
    y->have = false;
    if (!yaml_parser_parse(&y->p, &y->ev))
        return err_set(err, -EINVAL, "invalid YAML in %s at line %lu: %s", y->path,
                       (unsigned long)y->p.problem_mark.line + 1,
                       y->p.problem ? y->p.problem : "parse error");
    y->have = true;
    if (y->ev.type == YAML_ALIAS_EVENT)
        return err_set(err, -EINVAL, "%s line %lu: aliases are not supported by mini-dj", y->path,
                       (unsigned long)y->ev.start_mark.line + 1);
    return 0;
}

/* Skips the node whose first event is the current one. */
static int
yw_skip(struct yw *y, struct esd_err *err)
{
    size_t depth = 0;
    int r;

    for (;;) {
        if (y->ev.type == YAML_SEQUENCE_START_EVENT || y->ev.type == YAML_MAPPING_START_EVENT)
            depth++;
        else if (y->ev.type == YAML_SEQUENCE_END_EVENT || y->ev.type == YAML_MAPPING_END_EVENT)
            depth--;
        if (depth == 0)
            return 0;
        if ((r = yw_next(y, err)) < 0)
            return r;
    }
}

static bool
yw_scalar_is(const struct yw *y, const char *s)
{
    return y->ev.type == YAML_SCALAR_EVENT && strlen(s) == y->ev.data.scalar.length &&
           memcmp(y->ev.data.scalar.value, s, y->ev.data.scalar.length) == 0;
}

static bool
yw_is_null(const struct yw *y)
{
    return y->ev.type == YAML_SCALAR_EVENT && y->ev.data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
           (yw_scalar_is(y, "") || yw_scalar_is(y, "~") || yw_scalar_is(y, "null") ||
            yw_scalar_is(y, "Null") || yw_scalar_is(y, "NULL"));
}

/* An integer argument: a plain decimal scalar; null keeps *val. */
static int
yw_int_arg(struct yw *y, const char *op, const char *key, long long *val, struct esd_err *err)
{
    const char *s;
    char *end;
    long long v;

    if (yw_is_null(y))
        return 0;
    if (y->ev.type != YAML_SCALAR_EVENT || y->ev.data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
        return err_set(err, -EINVAL, "%s: %s must be an integer", op, key);
    s = (const char *)y->ev.data.scalar.value;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (errno || end == s || *end || (size_t)(end - s) != y->ev.data.scalar.length)
        return err_set(err, -EINVAL, "%s: %s must be an integer, not '%s'", op, key, s);
    *val = v;
    return 0;
}

/* One item of the process list; the current event is its first. */
static int
recipe_op(struct yw *y, size_t idx, struct recipe *rc, struct esd_err *err)
{
    struct op op = { .min_len = 10, .max_len = LLONG_MAX };
    char *name;
    bool found = false;
    int r;

    if (y->ev.type != YAML_MAPPING_START_EVENT)
        return err_set(err, -EINVAL, "process[%zu] must contain exactly one operator", idx);
    if ((r = yw_next(y, err)) < 0)
        return r;
    if (y->ev.type != YAML_SCALAR_EVENT)
        return err_set(err, -EINVAL, "process[%zu] must contain exactly one operator", idx);
    name = xstrndup((const char *)y->ev.data.scalar.value, y->ev.data.scalar.length);
    for (size_t i = 0; i < sizeof(op_table) / sizeof(op_table[0]) && !found; i++)
        if (strcmp(name, op_table[i].name) == 0) {
            op.kind = op_table[i].kind;
            found = true;
        }
    if (!found) {
        r = err_set(err, -EINVAL, "unsupported operator %s", name);
        goto out;
    }
    if ((r = yw_next(y, err)) < 0)
        goto out;
    if (y->ev.type == YAML_MAPPING_START_EVENT) {
        for (;;) {
            bool is_min, is_max;

            if ((r = yw_next(y, err)) < 0)
                goto out;
            if (y->ev.type == YAML_MAPPING_END_EVENT)
                break;
            is_min = op.kind == OP_LENGTH && yw_scalar_is(y, "min_len");
            is_max = op.kind == OP_LENGTH && yw_scalar_is(y, "max_len");
            if ((r = yw_skip(y, err)) < 0 || (r = yw_next(y, err)) < 0)
                goto out;
            if (is_min || is_max)
                r = yw_int_arg(y, name, is_min ? "min_len" : "max_len",
                               is_min ? &op.min_len : &op.max_len, err);
            else
                r = yw_skip(y, err);
            if (r < 0)
                goto out;
        }
    } else if (!yw_is_null(y)) {
        r = err_set(err, -EINVAL, "arguments of %s must be a mapping", name);
        goto out;
    }
    if ((r = yw_next(y, err)) < 0)
        goto out;
    if (y->ev.type != YAML_MAPPING_END_EVENT) {
        r = err_set(err, -EINVAL, "process[%zu] must contain exactly one operator", idx);
        goto out;
    }
    if (rc->n == rc->cap) {
        rc->cap = rc->cap ? 2 * rc->cap : 8;
        rc->ops = xrealloc(rc->ops, rc->cap * sizeof(*rc->ops));
    }
    if (op.kind == OP_DEDUP) {
        op.seen = xcalloc(1, sizeof(*op.seen));
        buf_init(&op.seen->texts);
    }
    rc->ops[rc->n++] = op;
out:
    free(name);
    return r;
}

/* The value of "process"; the current event is its first. */
static int
recipe_process(struct yw *y, struct recipe *rc, struct esd_err *err)
{
    int r;

    rc->n = 0; /* a repeated key: the last one wins, as in PyYAML */
    if (yw_is_null(y))
        return 0;
    if (y->ev.type != YAML_SEQUENCE_START_EVENT)
        return err_set(err, -EINVAL, "process must be a list");
    for (size_t idx = 0;; idx++) {
        if ((r = yw_next(y, err)) < 0)
            return r;
        if (y->ev.type == YAML_SEQUENCE_END_EVENT)
            return 0;
        if ((r = recipe_op(y, idx, rc, err)) < 0)
            return r;
    }
}

/* Reads the operators of the recipe at path into rc (caller frees rc->ops). */
static int
recipe_load(const char *path, struct recipe *rc, struct esd_err *err)
{
    struct yw y = { .path = path };
    char *data;
    size_t len;
    int r;

    memset(rc, 0, sizeof(*rc));
    if ((r = fs_read_file(path, RECIPE_MAX, &data, &len, err)) < 0)
        return r;
    if (!yaml_parser_initialize(&y.p)) {
        free(data);
        return err_set(err, -ENOMEM, "cannot initialise libyaml");
    }
    yaml_parser_set_input_string(&y.p, (const unsigned char *)data, len);
    if ((r = yw_next(&y, err)) < 0 || (r = yw_next(&y, err)) < 0)
        goto out;
    if (y.ev.type != YAML_DOCUMENT_START_EVENT) {
        r = err_set(err, -EINVAL, "recipe %s is empty", path);
        goto out;
    }
    if ((r = yw_next(&y, err)) < 0)
        goto out;
    if (y.ev.type != YAML_MAPPING_START_EVENT) {
        r = err_set(err, -EINVAL, "recipe %s is not a mapping", path);
        goto out;
    }
    for (;;) {
        bool is_process;

        if ((r = yw_next(&y, err)) < 0)
            goto out;
        if (y.ev.type == YAML_MAPPING_END_EVENT)
            break;
        is_process = yw_scalar_is(&y, "process");
        if ((r = yw_skip(&y, err)) < 0 || (r = yw_next(&y, err)) < 0)
            goto out;
        r = is_process ? recipe_process(&y, rc, err) : yw_skip(&y, err);
        if (r < 0)
            goto out;
    }
out:
    if (y.have)
        yaml_event_delete(&y.ev);
    yaml_parser_delete(&y.p);
    free(data);
    if (r < 0) {
        free(rc->ops);
        memset(rc, 0, sizeof(*rc));
    }
    return r;
}

/* ---- operators ---- */

/* Decodes the code point at s[*i] (valid UTF-8) and advances *i. */
static unsigned
utf8_next(const char *s, size_t n, size_t *i)
{
    const unsigned char *u = (const unsigned char *)s + *i;
    unsigned c = u[0], len = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;

    if (*i + len > n)
        len = 1;
    if (len == 1)
        c = u[0];
    else if (len == 2)
        c = (c & 0x1fu) << 6 | (u[1] & 0x3fu);
    else if (len == 3)
        c = (c & 0x0fu) << 12 | (u[1] & 0x3fu) << 6 | (u[2] & 0x3fu);
    else
        c = (c & 0x07u) << 18 | (u[1] & 0x3fu) << 12 | (u[2] & 0x3fu) << 6 | (u[3] & 0x3fu);
    *i += len;
    return c;
}

static bool
is_space(unsigned c)
{
    return c == ' ' || (c >= '\t' && c <= '\r') || c == 0x84 || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200d) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x2060 || c == 0x3000 || c == 0xfeff || c == 0xfffc;
}

/* Runs of whitespace in s[0..n) become one space, ends trimmed; into out. */
static void
normalize_ws(const char *s, size_t n, struct buf *out)
{
    bool pending = false;

    buf_reset(out);
    buf_reserve(out, n);
    for (size_t i = 0; i < n;) {
        size_t start = i;

        if (is_space(utf8_next(s, n, &i))) {
            pending = out->len > 0;
            continue;
        }
        if (pending)
            buf_putc(out, ' ');
        pending = false;
        buf_append(out, s + start, i - start);
    }
}

static size_t
count_code_points(const char *s, size_t n)
{
    size_t cps = 0;

    for (size_t i = 0; i < n; i++)
        cps += ((unsigned char)s[i] & 0xc0) != 0x80;
    return cps;
}

/* Scratch space for one record, reused across records. */
struct work {
    struct jsonl_record rec;
    struct buf cur, next, key, text, out;
};

/*
 * The member holding "text" in work->cur (checked into work->rec): the
 * last one with that key, as Python keeps the last duplicate. NULL if
 * there is none or its value is not a string.
 */
static const struct jsonl_member *
text_member(struct work *w)
{
    for (size_t j = w->rec.nmembers; j-- > 0;) {
        const struct jsonl_member *m = &w->rec.members[j];
        const char *k = w->cur.p + m->key_off;
        size_t klen = m->key_len;

        if (m->key_escaped) {
            buf_reset(&w->key);
            jsonl_unescape(k, klen, &w->key);
            k = w->key.p;
            klen = w->key.len;
        }
        if (klen == 4 && memcmp(k, "text", 4) == 0)
            return w->cur.p[m->val_off] == '"' ? m : NULL;
    }
    return NULL;
}

static uint64_t
fnv1a(const char *p, size_t n)
{
    uint64_t h = 1469598103934665603ull;

    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 1099511628211ull;
    return h;
}

static void
seen_grow(struct seen *sn)
{
    size_t cap = sn->cap ? 2 * sn->cap : 1024;
    struct seen_slot *v = xcalloc(cap, sizeof(*v));

    for (size_t i = 0; i < sn->cap; i++) {
        struct seen_slot *o = &sn->slots[i];
        size_t k;

        if (!o->len)
            continue;
        for (k = o->hash & (cap - 1); v[k].len; k = (k + 1) & (cap - 1))
            ;
        v[k] = *o;
    }
    free(sn->slots);
    sn->slots = v;
    sn->cap = cap;
}

/* Whether text was seen before; remembers it if not. */
static bool
seen_add(struct seen *sn, const char *p, size_t n)
{
    uint64_t h = fnv1a(p, n);
    size_t k;

    if (2 * (sn->n + 1) > sn->cap)
        seen_grow(sn);
    for (k = h & (sn->cap - 1); sn->slots[k].len; k = (k + 1) & (sn->cap - 1))
        if (sn->slots[k].hash == h && sn->slots[k].len == n + 1 &&
            !memcmp(sn->texts.p + sn->slots[k].off, p, n))
            return true;
    sn->slots[k].hash = h;
    sn->slots[k].off = sn->texts.len;
    sn->slots[k].len = n + 1;
    buf_append(&sn->texts, p, n);
    sn->n++;
    return false;
}

/* Applies ops to the record in w->cur; *ret_keep false if a filter drops it. */
static int
record_apply(const struct recipe *rc, struct work *w, bool *ret_keep)
{
    for (size_t i = 0; i < rc->n; i++) {
        const struct op *op = &rc->ops[i];
        const struct jsonl_member *m;
        struct buf swap;
        size_t cps;

        if (jsonl_check(&w->rec, w->cur.p, w->cur.len, NULL) < 0)
            return -EINVAL; /* cannot happen: splices keep records valid */
        m = text_member(w);
        if (!m) {
            if (op->kind == OP_LENGTH) {
                *ret_keep = false;
                return 0;
            }
            continue;
        }
        buf_reset(&w->text);
        buf_reserve(&w->text, m->val_len); /* never a NULL buffer, even for "" */
        jsonl_unescape(w->cur.p + m->val_off + 1, m->val_len - 2, &w->text);
        switch (op->kind) {
        case OP_LENGTH:
            cps = count_code_points(w->text.p, w->text.len);
            if ((long long)cps < op->min_len || (long long)cps > op->max_len) {
                *ret_keep = false;
                return 0;
            }
            break;
        case OP_DEDUP:
            if (seen_add(op->seen, w->text.p, w->text.len)) {
                *ret_keep = false;
                return 0;
            }
            break;
        case OP_WHITESPACE:
            normalize_ws(w->text.p, w->text.len, &w->out);
            buf_reset(&w->next);
            buf_append(&w->next, w->cur.p, m->val_off);
            json_escape(&w->next, w->out.p, w->out.len);
            buf_append(&w->next, w->cur.p + m->val_off + m->val_len,
                       w->cur.len - m->val_off - m->val_len);
            swap = w->cur;
            w->cur = w->next;
            w->next = swap;
            break;
        }
    }
    *ret_keep = true;
    return 0;
}

/* ---- the run ---- */

/* Kept rows, concatenated without newlines; row i ends at end[i]. */
struct rows {
    struct buf data;
    size_t *end;
    size_t n, cap;
};

static void
rows_push(struct rows *rs, const char *p, size_t len)
{
    if (rs->n == rs->cap) {
        rs->cap = rs->cap ? 2 * rs->cap : 64;
        rs->end = xrealloc(rs->end, rs->cap * sizeof(*rs->end));
    }
    buf_append(&rs->data, p, len);
    rs->end[rs->n++] = rs->data.len;
}

static void
rows_line(const struct rows *rs, size_t i, struct buf *out)
{
    size_t start = i ? rs->end[i - 1] : 0;

    buf_append(out, rs->data.p + start, rs->end[i] - start);
    buf_putc(out, '\n');
}

static void
sleep_ms(long long ms)
{
    struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000 };

    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* Reads, checks and processes every record of path into rs. */
static int
process_input(const char *path, const struct recipe *rc, const struct knobs *k, struct rows *rs,
              unsigned long long *ret_read, struct esd_err *err)
{
    struct jsonl_reader rd;
    struct work w;
    const char *line;
    size_t len;
    bool nl, keep;
    unsigned long long nread = 0;
    int r;

    if ((r = jsonl_reader_open(&rd, path, 0, err)) < 0)
        return r;
    memset(&w, 0, sizeof(w));
    jsonl_record_init(&w.rec, true);
    buf_init(&w.cur);
    buf_init(&w.next);
    buf_init(&w.key);
    buf_init(&w.text);
    buf_init(&w.out);
    while ((r = jsonl_reader_next(&rd, &line, &len, &nl, err)) == 1) {
        if (jsonl_check(&w.rec, line, len, NULL) < 0) {
            r = jsonl_error(&w.rec, NULL, path, rd.lineno, err);
            break;
        }
        nread++;
        if (k->ray_each_row && ray_host && ray_reach(ray_host, ray_port, err) < 0) {
            r = err_set(err, -ECONNABORTED, "lost the Ray head at %s:%s", ray_host, ray_port);
            break;
        }
        if (k->sleep_ms)
            sleep_ms(k->sleep_ms);
        buf_reset(&w.cur);
        buf_append(&w.cur, line, len);
        if ((r = record_apply(rc, &w, &keep)) < 0) {
            r = err_set(err, r, "internal error editing %s:%llu", path, rd.lineno);
            break;
        }
        if (keep)
            rows_push(rs, w.cur.p, w.cur.len);
    }
    jsonl_record_free(&w.rec);
    buf_free(&w.cur);
    buf_free(&w.next);
    buf_free(&w.key);
    buf_free(&w.text);
    buf_free(&w.out);
    jsonl_reader_close(&rd);
    if (r == 0)
        *ret_read = nread;
    return r;
}

static int
write_file(const char *dir, const char *name, const struct buf *b, struct esd_err *err)
{
    char *path = fs_join(dir, name);
    int fd, r = 0;

    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || fs_write_all(fd, b->p, b->len) < 0)
        r = err_sys(err, -errno, "cannot write %s", path);
    if (fd >= 0 && close(fd) < 0 && r == 0)
        r = err_sys(err, -errno, "cannot write %s", path);
    free(path);
    return r;
}

static void
crash(size_t written, size_t total)
{
    fprintf(stderr, "mini-dj: MINI_DJ_CRASH: aborting after %zu of %zu rows\n", written, total);
    fflush(NULL);
    prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); /* no core file */
    abort();
}

/* ---- part names ---- */

#define DATASET_ID_LEN 22
#define TASK_ID_LEN 32
/* <dataset-id>_<task-id>_000000.json */
#define PART_NAME_LEN (DATASET_ID_LEN + 1 + TASK_ID_LEN + 1 + 6 + 5)

/* The dataset id of a run: ALNUM[b_k mod 62] for the bytes b_k of SHA-256(job_id). */
static void
dataset_id(const char *job_id, char out[DATASET_ID_LEN + 1])
{
    static const char alnum[] = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    static const char digits[] = "0123456789abcdef"; /* sha256_buf's lower-case hex */
    char hex[SHA256_HEX_LEN + 1];

    sha256_buf(job_id, strlen(job_id), hex);
    for (size_t k = 0; k < DATASET_ID_LEN; k++) {
        const char *hi = strchr(digits, hex[2 * k]), *lo = strchr(digits, hex[2 * k + 1]);

        out[k] = alnum[((hi - digits) * 16 + (lo - digits)) % 62];
    }
    out[DATASET_ID_LEN] = '\0';
}

struct part {
    size_t index;
    char name[PART_NAME_LEN + 1];
};

/* The name of part i: <dataset-id>_<first 32 hex of SHA-256("mini-dj task <i>")>_000000.json */
static void
part_name(const char *dsid, size_t i, struct part *p)
{
    char seed[64], hex[SHA256_HEX_LEN + 1];

    snprintf(seed, sizeof(seed), "mini-dj task %zu", i);
    sha256_buf(seed, strlen(seed), hex);
    p->index = i;
    snprintf(p->name, sizeof(p->name), "%s_%.*s_000000.json", dsid, TASK_ID_LEN, hex);
}

static int
cmp_part(const void *a, const void *b)
{
    return strcmp(((const struct part *)a)->name, ((const struct part *)b)->name);
}

/*
 * Writes the Ray-style export directory (see the header comment): chunk i
 * of the kept rows, array_split style, goes to part i, and the parts are
 * written in the string order of their names. Returns the number of part
 * files in *ret_parts and the name of the part with the bad line (if any)
 * in bad_name.
 */
static int
write_output(const char *dir, const char *job_id, const struct rows *rs, const struct knobs *k,
             size_t *ret_parts, char bad_name[PART_NAME_LEN + 1], struct esd_err *err)
{
    size_t q = rs->n / (size_t)k->parts, rem = rs->n % (size_t)k->parts;
    size_t limit = (rs->n + 1) / 2, written = 0;
    /* only non-empty chunks are written; with no rows, MINI_DJ_BAD writes part 0 */
    size_t nparts = rs->n < (size_t)k->parts ? rs->n : (size_t)k->parts;
    char dsid[DATASET_ID_LEN + 1];
    struct part *parts;
    struct buf body, crc, empty;
    int r;

    if (nparts == 0 && k->bad)
        nparts = 1;
    if ((r = fs_mkdir_p(dir, 0755, err)) < 0)
        return r;
    dataset_id(job_id, dsid);
    parts = xcalloc(nparts ? nparts : 1, sizeof(*parts));
    for (size_t i = 0; i < nparts; i++)
        part_name(dsid, i, &parts[i]);
    qsort(parts, nparts, sizeof(*parts), cmp_part);
    buf_init(&body);
    buf_init(&crc);
    buf_init(&empty);
    buf_reserve(&empty, 0);
    for (size_t n = 0; n < nparts; n++) {
        size_t i = parts[n].index;
        size_t cnt = q + (i < rem), start = i * q + (i < rem ? i : rem);
        const char *name = parts[n].name;
        bool bad_here = k->bad && n == 0;
        char *crcname;

        if (k->crash && written == limit)
            crash(written, rs->n);
        buf_reset(&body);
        if (bad_here) {
            snprintf(bad_name, PART_NAME_LEN + 1, "%s", name);
            if (cnt == 0)
                buf_printf(&body, "%s\n", bad_lines[k->bad].line);
        }
        for (size_t j = start; j < start + cnt; j++) {
            if (k->crash && written == limit) {
                if ((r = write_file(dir, name, &body, err)) < 0)
                    goto out;
                crash(written, rs->n);
            }
            rows_line(rs, j, &body);
            written++;
            if (bad_here && j == start)
                buf_printf(&body, "%s\n", bad_lines[k->bad].line);
        }
        if ((r = write_file(dir, name, &body, err)) < 0)
            goto out;
        if (k->success) {
            buf_reset(&crc);
            buf_printf(&crc,
                       "not JSONL: hidden checksum file of %s (%zu bytes), written by "
                       "the mini-dj test stand-in; readers must skip it\n",
                       name, body.len);
            crcname = xasprintf(".%s.crc", name);
            r = write_file(dir, crcname, &crc, err);
            free(crcname);
            if (r < 0)
                goto out;
        }
    }
    if (k->crash)
        crash(written, rs->n);
    if (k->success && (r = write_file(dir, "_SUCCESS", &empty, err)) < 0)
        goto out;
    *ret_parts = nparts;
out:
    free(parts);
    buf_free(&body);
    buf_free(&crc);
    buf_free(&empty);
    return r;
}

static void event(const char *dir, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Appends "<time> mini-dj (test stand-in) <message>" to dir/events.log; best effort. */
static void
event(const char *dir, const char *fmt, ...)
{
    char now[40], msg[1024], *path = fs_join(dir, "events.log");
    struct buf b;
    va_list ap;
    int fd;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    time_iso_now(now, NULL);
    buf_init(&b);
    buf_printf(&b, "%s mini-dj (test stand-in) %s\n", now, msg);
    fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
        (void)fs_write_all(fd, b.p, b.len);
        close(fd);
    }
    buf_free(&b);
    free(path);
}

/* Forks a child that sleeps until killed, in this process group. */
static int
spawn_child(struct esd_err *err)
{
    pid_t pid;

    fflush(NULL);
    pid = fork();
    if (pid < 0)
        return err_sys(err, -errno, "cannot fork");
    if (pid == 0) {
        prctl(PR_SET_NAME, "mini-dj-child", 0, 0, 0);
        for (;;)
            pause();
    }
    printf("mini-dj: spawned child pid %ld (MINI_DJ_SPAWN_CHILD)\n", (long)pid);
    return 0;
}

/* MINI_DJ_ESCAPE: leaves a process behind outside this process group;
 * returns once it has said its pid. */
static int
escape(const char *mode, struct esd_err *err)
{
    int p[2], st;
    char c;
    pid_t pid;

    fflush(NULL);
    if (pipe(p) < 0)
        return err_sys(err, -errno, "cannot make a pipe");
    if ((pid = fork()) < 0)
        return err_sys(err, -errno, "cannot fork");
    if (pid == 0) {
        close(p[0]);
        if (strcmp(mode, "double") == 0) {
            pid_t g = fork();

            if (g < 0)
                _exit(1);
            if (g > 0)
                _exit(0);
        }
        /* out of the group and the session, deaf to SIGTERM and SIGHUP,
         * the output pipe kept; "ready" once the pid is printed */
        setsid();
        signal(SIGTERM, SIG_IGN);
        signal(SIGHUP, SIG_IGN);
        prctl(PR_SET_NAME, "mini-dj-escape", 0, 0, 0);
        printf("mini-dj: escaped pid %ld (%s)\n", (long)getpid(), mode);
        fflush(NULL);
        (void)!write(p[1], "x", 1);
        close(p[1]);
        for (;;)
            pause();
    }
    close(p[1]);
    (void)!read(p[0], &c, 1);
    close(p[0]);
    if (strcmp(mode, "double") == 0)
        waitpid(pid, &st, 0);
    return 0;
}

int
main(int argc, char **argv)
{
    struct esd_err err;
    struct opts o;
    struct knobs k;
    struct recipe rc = { 0 };
    struct rows rs = { 0 };
    sigset_t none;
    char *host = NULL, *port = NULL;
    unsigned long long nread = 0;
    size_t parts = 0;
    char bad_name[PART_NAME_LEN + 1] = "";
    int rc_exit = 1, r;

    setvbuf(stdout, NULL, _IOLBF, 0);
    /* Die on SIGTERM/SIGINT whatever the parent left us with. */
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    json_init();
    err_clear(&err);

    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        }
    if (knobs_parse(&k, &err) < 0) {
        fprintf(stderr, "mini-dj: %s\n", err.msg);
        return 2;
    }
    if (k.record && record_invocation(k.record, argc, argv, &err) < 0) {
        fprintf(stderr, "mini-dj: %s\n", err.msg);
        return 1;
    }
    if (opts_parse(argc, argv, &o, &err) < 0 || ray_parse(o.ray_address, &host, &port, &err) < 0) {
        fprintf(stderr, "mini-dj: %s\n", err.msg);
        fprintf(stderr, "mini-dj: a test stand-in for Data-Juicer's process_data; "
                        "see mini-dj --help\n");
        return 2;
    }
    printf("mini-dj: TEST STAND-IN for Data-Juicer process_data (not Data-Juicer), job %s\n",
           o.job_id);
    if (knobs_gate(&k, o.dataset_path, &err) < 0) {
        fprintf(stderr, "mini-dj: %s\n", err.msg);
        goto out;
    }
    if (k.exit_code >= 0) {
        fprintf(stderr, "mini-dj: MINI_DJ_EXIT=%d, exiting\n", k.exit_code);
        rc_exit = k.exit_code;
        goto out;
    }
    if (host && strcmp(o.executor_type, "ray") == 0) {
        if (ray_reach(host, port, &err) < 0) {
            fprintf(stderr, "mini-dj: %s\n", err.msg);
            rc_exit = 3;
            goto out;
        }
        fprintf(stderr, "mini-dj: connected to Ray at %s\n", o.ray_address);
        ray_host = host;
        ray_port = port;
    } else {
        fprintf(stderr, "mini-dj: using a local Ray (nothing to connect to)\n");
    }
    if (recipe_load(o.config, &rc, &err) < 0) {
        fprintf(stderr, "mini-dj: %s\n", err.msg);
        rc_exit = 2;
        goto out;
    }
    fprintf(stderr, "mini-dj: recipe %s: %zu operator(s)\n", o.config, rc.n);
    if (fs_mkdir_p(o.work_dir, 0755, &err) < 0 || fs_mkdir_p(o.event_log_dir, 0755, &err) < 0) {
        fprintf(stderr, "mini-dj: %s\n", err.msg);
        goto out;
    }
    event(o.event_log_dir, "started job %s on %s", o.job_id, o.dataset_path);
    if (k.spawn_child && spawn_child(&err) < 0) {
        fprintf(stderr, "mini-dj: %s\n", err.msg);
        goto out;
    }
    if (k.escape && escape(k.escape, &err) < 0) {
        fprintf(stderr, "mini-dj: %s\n", err.msg);
        goto out;
    }
    if ((r = process_input(o.dataset_path, &rc, &k, &rs, &nread, &err)) < 0) {
        fprintf(stderr, "mini-dj: %s\n", err.msg);
        event(o.event_log_dir, "failed: %s", err.msg);
        if (r == -ECONNABORTED)
            rc_exit = 3;
        goto out;
    }
    printf("mini-dj: read %llu rows from %s\n", nread, o.dataset_path);
    fprintf(stderr, "mini-dj: kept %zu rows, dropped %llu\n", rs.n, nread - rs.n);
    event(o.event_log_dir, "read %llu rows, kept %zu", nread, rs.n);
    if (k.hang) {
        printf("mini-dj: hanging (MINI_DJ_HANG), kill me\n");
        for (;;)
            pause();
    }
    if (k.no_export) {
        fprintf(stderr, "mini-dj: MINI_DJ_NO_EXPORT: not creating %s\n", o.export_path);
        rc_exit = 0;
        goto out;
    }
    if (rs.n == 0 && !k.bad && k.empty_nodir) {
        printf("mini-dj: no rows left, MINI_DJ_EMPTY=nodir: not creating %s\n", o.export_path);
        rc_exit = 0;
        goto out;
    }
    if (strcmp(o.executor_type, "default") == 0) {
        /* Data-Juicer's default executor: one JSONL file at the export path */
        struct buf all;

        buf_init(&all);
        buf_reserve(&all, 0);
        for (size_t i = 0; i < rs.n; i++)
            rows_line(&rs, i, &all);
        r = fs_write_atomic(o.export_path, all.p, all.len, 0644, &err);
        buf_free(&all);
        if (r < 0) {
            fprintf(stderr, "mini-dj: %s\n", err.msg);
            goto out;
        }
        printf("mini-dj: wrote %zu rows to the file %s (executor default)\n", rs.n, o.export_path);
        event(o.event_log_dir, "finished: %zu rows in one file", rs.n);
        rc_exit = 0;
        goto out;
    }
    if (write_output(o.export_path, o.job_id, &rs, &k, &parts, bad_name, &err) < 0) {
        fprintf(stderr, "mini-dj: %s\n", err.msg);
        goto out;
    }
    if (k.bad)
        fprintf(stderr, "mini-dj: MINI_DJ_BAD=%s: wrote a bad line into %s (line %d)\n",
                bad_lines[k.bad].name, bad_name, rs.n ? 2 : 1);
    printf("mini-dj: wrote %zu rows in %zu parts to %s\n", rs.n, parts, o.export_path);
    event(o.event_log_dir, "finished: %zu rows in %zu parts", rs.n, parts);
    rc_exit = 0;
out:
    free(host);
    free(port);
    for (size_t i = 0; i < rc.n; i++)
        if (rc.ops[i].seen) {
            buf_free(&rc.ops[i].seen->texts);
            free(rc.ops[i].seen->slots);
            free(rc.ops[i].seen);
        }
    free(rc.ops);
    buf_free(&rs.data);
    free(rs.end);
    return rc_exit;
}
