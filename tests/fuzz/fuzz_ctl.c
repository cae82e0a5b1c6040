/*
 * fuzz_ctl: libFuzzer target for the control server's request parser and
 * dispatcher (daemon/ctl.c through ctl_test_answer(), which never forks:
 * operations are answered "internal"). The input is split on "\n"; every
 * line is answered for three peers: root, a member of the control group
 * (uid 4242) and an unprivileged uid without groups (65534). Each reply
 * must be one reply object of common/proto.h: v 1, the id the request
 * parser read, exactly one of ok true with a result object or ok false
 * with an error {code, message} whose code is a PROTO_E_* string, and
 * framed as one line of valid JSON in UTF-8 (the client's parser, which
 * rejects what Python's json does, must take it back). The unprivileged
 * peer must never get ok for a command above "read".
 *
 * The daemon's modules are set up once as esd's main does, in a private
 * temporary directory: state_dir, spool_dir, the socket (socket_group the
 * fuzzer's own group, the control group), and a prepared-looking job
 * directory <tmp>/job (owned by nobody when run as root). What a
 * privileged peer may write (cancel --everywhere writes into the job
 * directory) must stay in there: for root and the group member, every
 * absolute path argument (job_dir, output, config, …: the path options of
 * common/cmds.c) is moved under <tmp>, and a line with ".." in one is not
 * given to them; the unprivileged peer gets every line as it is.
 */
#include <errno.h>
#include <grp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ev.h>

#include "cmds.h"
#include "config.h"
#include "ctl.h"
#include "finalize.h"
#include "jobs.h"
#include "json.h"
#include "log.h"
#include "opchild.h"
#include "proto.h"
#include "ray.h"
#include "runner.h"
#include "sched.h"
#include "util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NOBODY 65534
#define MEMBER 4242

static struct esd_conf conf;
static char *sandbox; /* $TMPDIR/fuzz_ctl.XXXXXX */
static gid_t control_gid;

/* Removes the sandbox: at exit, and before the harness reports a bad reply. */
static void
remove_sandbox(void)
{
    char *cmd;

    if (!sandbox)
        return;
    cmd = xasprintf("rm -rf '%s'", sandbox);
    if (system(cmd) != 0)
        fprintf(stderr, "fuzz_ctl: cannot remove %s\n", sandbox);
    free(cmd);
    free(sandbox);
    sandbox = NULL;
}

static void
die(const char *what, const char *why)
{
    fprintf(stderr, "fuzz_ctl: %s: %s\n", what, why);
    remove_sandbox();
    abort();
}

static void
set_str(char **field, char *value)
{
    free(*field);
    *field = value;
}

int
LLVMFuzzerInitialize(int *argc, char ***argv)
{
    struct ev_loop *loop;
    struct esd_err err;
    struct group *gr;
    char *job, *manifest;
    FILE *f;

    (void)argc;
    (void)argv;
    json_init();
    sandbox = xasprintf("%s/fuzz_ctl.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(sandbox))
        die(sandbox, strerror(errno));
    /* (a crash leaves it: libFuzzer takes the sanitizers' death callback) */
    atexit(remove_sandbox);
    chmod(sandbox, 0755);
    config_defaults(&conf);
    set_str(&conf.node_name, xstrdup("fuzz"));
    set_str(&conf.state_dir, xasprintf("%s/state", sandbox));
    set_str(&conf.socket_path, xasprintf("%s/esd.sock", sandbox));
    set_str(&conf.spool_dir, xasprintf("%s/spool", sandbox));
    set_str(&conf.ray_temp_dir, xasprintf("%s/ray", sandbox));
    /* the fuzzer's own group is the control group; the unprivileged peer
     * must be neither esd's uid nor in that group */
    control_gid = getegid();
    if (geteuid() == NOBODY || control_gid == NOBODY)
        die("fuzz_ctl", "run it as another user than nobody");
    gr = getgrgid(control_gid);
    set_str(&conf.socket_group, xstrdup(gr ? gr->gr_name : "root"));
    conf.ray_mode = RAY_OFF;
    strv_free(&conf.processor);
    strv_init(&conf.processor);
    strv_push(&conf.processor, "/bin/true");
    if (mkdir(conf.spool_dir, 0755) < 0)
        die(conf.spool_dir, strerror(errno));
    /* a directory that looks prepared, for submit and cancel */
    job = xasprintf("%s/job", sandbox);
    manifest = xasprintf("%s/manifest.json", job);
    if (mkdir(job, 0755) < 0 || !(f = fopen(manifest, "w")))
        die(job, strerror(errno));
    fputs("{}\n", f);
    fclose(f);
    if (geteuid() == 0 && (chown(job, NOBODY, NOBODY) < 0 || chown(manifest, NOBODY, NOBODY) < 0))
        die(job, strerror(errno));
    free(manifest);
    free(job);

    log_init(LOG_TARGET_STDERR, LOG_LVL_ERR, true, conf.node_name);
    loop = ev_default_loop(EVFLAG_AUTO);
    if (!loop)
        die("ev_default_loop", "failed");
    if (ctl_init(loop, &conf, -1, &err) < 0 || jobs_init(loop, &conf, &err) < 0 ||
        ray_init(loop, &conf, &err) < 0)
        die("init", err.msg);
    runner_init(loop, &conf);
    finalize_init(loop, &conf);
    opchild_init(loop, &conf);
    sched_init(loop, &conf);
    ctl_set_status(sched_status_json);
    return 0;
}

static bool
known_code(const char *c)
{
    static const char *const codes[] = {
        PROTO_E_BAD_REQUEST, PROTO_E_BAD_VERSION, PROTO_E_UNKNOWN_COMMAND, PROTO_E_BAD_ARGS,
        PROTO_E_TOO_LARGE,   PROTO_E_DENIED,      PROTO_E_NOT_FOUND,       PROTO_E_BUSY,
        PROTO_E_FAILED,      PROTO_E_CONFLICT,    PROTO_E_INTERNAL,
    };

    for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++)
        if (!strcmp(c, codes[i]))
            return true;
    return false;
}

static void
bad_reply(const char *why, const cJSON *reply, const char *line, size_t len)
{
    char *text = cJSON_PrintUnformatted(reply);

    fprintf(stderr, "fuzz_ctl: %s\n  request (%zu bytes): %.*s\n  reply: %s\n", why, len,
            (int)(len > 2000 ? 2000 : len), line, text ? text : "(unprintable)");
    remove_sandbox();
    abort();
}

/*
 * Checks reply against proto.h: want_id is the id proto_parse_request read
 * from the line; may_succeed is false when the peer is unprivileged and the
 * line names a command above "read" (it must not succeed).
 */
static void
check_reply(const cJSON *reply, long long want_id, bool may_succeed, const char *line, size_t len)
{
    const cJSON *ok, *res, *e, *code, *msg;
    struct esd_err err;
    long long v, id;
    struct buf frame;
    cJSON *back;
    char *nl;

    if (!cJSON_IsObject(reply))
        bad_reply("the reply is not an object", reply, line, len);
    ok = cJSON_GetObjectItemCaseSensitive(reply, "ok");
    res = cJSON_GetObjectItemCaseSensitive(reply, "result");
    e = cJSON_GetObjectItemCaseSensitive(reply, "error");
    if (cJSON_GetArraySize(reply) != 4 || json_get_int(reply, "v", &v) < 0 || v != PROTO_VERSION ||
        json_get_int(reply, "id", &id) < 0 || !cJSON_IsBool(ok))
        bad_reply("the reply lacks v 1, an integer id or ok", reply, line, len);
    if (id != want_id)
        bad_reply("the reply's id is not the request's", reply, line, len);
    if (cJSON_IsTrue(ok)) {
        if (!cJSON_IsObject(res) || e)
            bad_reply("ok true without exactly a result object", reply, line, len);
        if (!may_succeed)
            bad_reply("an unprivileged peer succeeded with a node or job command", reply, line,
                      len);
    } else {
        code = cJSON_GetObjectItemCaseSensitive(e, "code");
        msg = cJSON_GetObjectItemCaseSensitive(e, "message");
        if (res || !cJSON_IsObject(e) || cJSON_GetArraySize(e) != 2 || !cJSON_IsString(code) ||
            !known_code(code->valuestring) || !cJSON_IsString(msg))
            bad_reply("ok false without exactly an error {code, message} of proto.h", reply, line,
                      len);
    }
    /* On the wire: one line of JSON the client's parser takes back. */
    buf_init(&frame);
    proto_frame(reply, &frame);
    nl = memchr(frame.p, '\n', frame.len);
    if (!nl || (size_t)(nl - frame.p) != frame.len - 1)
        bad_reply("the framed reply is not exactly one line", reply, line, len);
    if (json_parse_object(frame.p, frame.len - 1, "reply", &back, &err) < 0) {
        fprintf(stderr, "fuzz_ctl: the framed reply does not parse back: %s\n", err.msg);
        bad_reply("the framed reply is not valid JSON in UTF-8", reply, line, len);
    }
    cJSON_Delete(back);
    buf_free(&frame);
}

/* Is key the request argument of a path option (job_dir, output, config…)? */
static bool
path_arg(const char *key)
{
    for (int o = 0; o < O__COUNT; o++)
        if (cmd_opts[o].key && cmd_opts[o].path && !strcmp(cmd_opts[o].key, key))
            return true;
    return false;
}

/*
 * The line a privileged peer gets: every absolute path argument moved under
 * the sandbox. Returns true with *ret_new a new line (caller frees), or
 * NULL when nothing was moved (the line as it is); false when the line must
 * not be given to a privileged peer (a path with "..").
 */
static bool
confine(const char *line, size_t len, char **ret_new, size_t *ret_len)
{
    struct esd_err err;
    cJSON *root, *args, *a;
    bool changed = false, safe = true;

    *ret_new = NULL;
    *ret_len = len;
    /* What the daemon's parser does not take, it does not act on. */
    if (json_parse_object(line, len, "request", &root, &err) < 0)
        return true;
    args = cJSON_GetObjectItemCaseSensitive(root, "args");
    if (!cJSON_IsObject(args))
        args = NULL;
    cJSON_ArrayForEach(a, args)
    {
        char *moved;

        if (!a->string || !path_arg(a->string) || !cJSON_IsString(a) || a->valuestring[0] != '/')
            continue;
        if (strstr(a->valuestring, "..")) {
            safe = false;
            break;
        }
        moved = xasprintf("%s%s", sandbox, a->valuestring);
        cJSON_SetValuestring(a, moved);
        free(moved);
        changed = true;
    }
    if (safe && changed) {
        struct buf b;

        buf_init(&b);
        json_dump(root, JSON_COMPACT, &b);
        *ret_new = xstrdup(b.p);
        *ret_len = b.len;
        buf_free(&b);
    }
    cJSON_Delete(root);
    return safe;
}

static void
answer(const struct ucred *peer, const gid_t *groups, size_t ngroups, bool privileged,
       const char *line, size_t len)
{
    struct proto_request req;
    struct esd_err err;
    const struct cmd_def *cmd = NULL;
    bool may_succeed = true;
    cJSON *reply;

    /* What the reply must say: the id as the parser reads it; and an
     * unprivileged peer gets no node or job command done. */
    if (proto_parse_request(line, len, &req, &err) == 0)
        cmd = cmd_find(req.cmd);
    if (cmd && !privileged && cmd->auth != AUTH_READ)
        may_succeed = false;
    reply = ctl_test_answer(peer, groups, ngroups, line, len);
    if (!reply)
        die("ctl_test_answer", "returned NULL");
    check_reply(reply, req.id, may_succeed, line, len);
    cJSON_Delete(reply);
    proto_request_free(&req);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const struct ucred root = { .pid = 1000, .uid = 0, .gid = 0 };
    static const struct ucred member = { .pid = 1001, .uid = MEMBER, .gid = MEMBER };
    static const struct ucred nobody = { .pid = 1002, .uid = NOBODY, .gid = NOBODY };
    const char *p = (const char *)data, *end = p + size;

    /* (a final "\n" ends the last line; nothing follows it) */
    while (p < end || (p == end && size == 0)) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
        /* an exact-size copy so out-of-bounds reads are caught */
        char *line = xmalloc(len ? len : 1), *moved;
        size_t mlen;

        memcpy(line, p, len);
        answer(&nobody, NULL, 0, false, line, len);
        if (confine(line, len, &moved, &mlen)) {
            const char *l = moved ? moved : line;

            answer(&root, NULL, 0, true, l, mlen);
            answer(&member, &control_gid, 1, true, l, mlen);
            free(moved);
        }
        free(line);
        if (!nl)
            break;
        p = nl + 1;
    }
    return 0;
}
