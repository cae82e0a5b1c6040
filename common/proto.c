/*
 * proto: parsing control requests and building their replies (the protocol
 * itself is described in proto.h).
 */
#include "proto.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "jsonl.h"

/* The name json_parse_object() is given, and the prefix it then puts in
 * front of its messages, which a peer has no use for. */
#define REQUEST_NAME "request"
#define PARSE_PREFIX "Unable to read JSON file " REQUEST_NAME ": "

static cJSON *
must(cJSON *v)
{
    if (!v)
        abort(); /* out of memory; json_init() makes cJSON abort itself */
    return v;
}

static int
bad_json(struct esd_err *err, const struct esd_err *why)
{
    const char *m = why->msg;

    if (!strncmp(m, PARSE_PREFIX, strlen(PARSE_PREFIX)))
        return err_set(err, -EINVAL, "request is not valid JSON: %s", m + strlen(PARSE_PREFIX));
    return err_set(err, -EINVAL, "request is not a JSON object");
}

int
proto_parse_request(const char *line, size_t len, struct proto_request *ret, struct esd_err *err)
{
    struct esd_err why;
    const cJSON *args;
    const char *cmd;
    long long id = -1, v;
    bool have_id;
    cJSON *root;
    int r;

    ret->id = -1;
    ret->cmd = NULL;
    ret->args = NULL;
    ret->root = NULL;
    if (len > PROTO_MAX_MESSAGE)
        return err_set(err, -EMSGSIZE, "request of more than %d bytes", PROTO_MAX_MESSAGE);
    if (json_parse_object(line, len, REQUEST_NAME, &root, &why) < 0)
        return bad_json(err, &why);

    /* The id first, so that every later error can be answered with it. */
    have_id = json_get_int(root, "id", &id) == 0;
    ret->id = have_id ? id : -1;
    if (!cJSON_HasObjectItem(root, "v")) {
        r = err_set(err, -EPROTONOSUPPORT,
                    "request has no protocol version \"v\"; this esd speaks version %d",
                    PROTO_VERSION);
        goto fail;
    }
    if (json_get_int(root, "v", &v) < 0 || v != PROTO_VERSION) {
        char *text = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(root, "v"));

        r = err_set(err, -EPROTONOSUPPORT,
                    "protocol version %.32s is not supported; this esd speaks version %d",
                    text ? text : "?", PROTO_VERSION);
        cJSON_free(text);
        goto fail;
    }
    if (!cJSON_HasObjectItem(root, "id")) {
        r = err_set(err, -EINVAL, "request has no \"id\"");
        goto fail;
    }
    if (!have_id) {
        r = err_set(err, -EINVAL, "request \"id\" must be an integer");
        goto fail;
    }
    cmd = json_get_str(root, "cmd");
    if (!cmd || !*cmd) {
        r = err_set(err, -EINVAL,
                    cJSON_HasObjectItem(root, "cmd") ? "request \"cmd\" must be a non-empty string"
                                                     : "request has no \"cmd\"");
        goto fail;
    }
    args = cJSON_GetObjectItemCaseSensitive(root, "args");
    if (args && !cJSON_IsObject(args)) {
        r = err_set(err, -EINVAL, "request \"args\" must be an object");
        goto fail;
    }
    ret->cmd = cmd;
    ret->args = args;
    ret->root = root;
    return 0;

fail:
    cJSON_Delete(root);
    return r;
}

void
proto_request_free(struct proto_request *r)
{
    if (!r)
        return;
    cJSON_Delete(r->root);
    r->root = NULL;
    r->cmd = NULL;
    r->args = NULL;
}

const char *
proto_error_code(int r)
{
    switch (r) {
    case -EMSGSIZE:
        return PROTO_E_TOO_LARGE;
    case -EPROTONOSUPPORT:
        return PROTO_E_BAD_VERSION;
    default:
        return PROTO_E_BAD_REQUEST;
    }
}

/* {"v":1,"id":id,"ok":ok}, the part every reply shares. */
static cJSON *
reply_new(long long id, bool ok)
{
    cJSON *m = must(cJSON_CreateObject());

    json_add_int(m, "v", PROTO_VERSION);
    json_add_int(m, "id", id);
    json_add_bool(m, "ok", ok);
    return m;
}

cJSON *
proto_reply_ok(long long id, cJSON *result)
{
    cJSON *m = reply_new(id, true);

    cJSON_AddItemToObject(m, "result", result ? result : must(cJSON_CreateObject()));
    return m;
}

cJSON *
proto_reply_error(long long id, const char *code, const char *message)
{
    cJSON *m = reply_new(id, false);
    cJSON *e = must(cJSON_CreateObject());
    struct buf b;

    /* A message may quote a request cut at a byte limit: valid UTF-8 only. */
    buf_init(&b);
    if (message)
        jsonl_utf8_clean(message, strlen(message), &b);
    json_add_str(e, "code", code);
    json_add_str(e, "message", b.p ? b.p : "");
    buf_free(&b);
    cJSON_AddItemToObject(m, "error", e);
    return m;
}

void
proto_frame(const cJSON *msg, struct buf *out)
{
    json_dump(msg, JSON_COMPACT, out);
    buf_putc(out, '\n');
}

/* ---- fair shares ---- */

/* Each tier leaves room for the ones above it, and one key never fills a tier. */
_Static_assert(PROTO_MAX_PER_UID < PROTO_MAX_CONN_UNPRIV &&
                   PROTO_MAX_CONN_UNPRIV < PROTO_MAX_CONN_NOT_ROOT &&
                   PROTO_MAX_CONN_NOT_ROOT < PROTO_MAX_CONNECTIONS,
               "connection shares");
_Static_assert(PROTO_MAX_OPS_PER_UID < PROTO_MAX_OPS_UNPRIV &&
                   PROTO_MAX_OPS_UNPRIV < PROTO_MAX_OPS_NOT_ROOT &&
                   PROTO_MAX_OPS_NOT_ROOT < PROTO_MAX_OPS,
               "operation shares");

const struct proto_limits proto_conn_limits = {
    .max = PROTO_MAX_CONNECTIONS,
    .not_root = PROTO_MAX_CONN_NOT_ROOT,
    .unpriv = PROTO_MAX_CONN_UNPRIV,
    .per_key = PROTO_MAX_PER_UID,
};

const struct proto_limits proto_op_limits = {
    .max = PROTO_MAX_OPS,
    .not_root = PROTO_MAX_OPS_NOT_ROOT,
    .unpriv = PROTO_MAX_OPS_UNPRIV,
    .per_key = PROTO_MAX_OPS_PER_UID,
};

void
proto_usage_add(struct proto_usage *u, const struct proto_share *held,
                const struct proto_share *who)
{
    u->all++;
    u->not_root += held->cls != PROTO_CLASS_ROOT;
    u->unpriv += held->cls == PROTO_CLASS_OTHER;
    u->key += held->key == who->key;
}

enum proto_full
proto_share_admit(const struct proto_limits *lim, const struct proto_usage *u,
                  const struct proto_share *who)
{
    if (u->key >= lim->per_key)
        return PROTO_FULL_KEY;
    if (who->cls == PROTO_CLASS_OTHER && u->unpriv >= lim->unpriv)
        return PROTO_FULL_UNPRIV;
    if (who->cls != PROTO_CLASS_ROOT && u->not_root >= lim->not_root)
        return PROTO_FULL_NOT_ROOT;
    if (u->all >= lim->max)
        return PROTO_FULL_ALL;
    return PROTO_FULL_NONE;
}

void
proto_share_explain(enum proto_full full, const struct proto_limits *lim,
                    const struct proto_share *who, const char *what, char *buf, size_t n)
{
    switch (full) {
    case PROTO_FULL_KEY:
        if (who->key == PROTO_SHARE_POOL)
            snprintf(buf, n,
                     "too many %s of uids without an account on this node (at most %u "
                     "for all of them together); try again later",
                     what, lim->per_key);
        else
            snprintf(buf, n, "too many %s of uid %u (at most %u); try again later", what,
                     (unsigned)who->key, lim->per_key);
        break;
    case PROTO_FULL_UNPRIV:
        snprintf(buf, n,
                 "too many %s of unprivileged users (at most %u together; the rest is "
                 "kept for root, esd and socket_group); try again later",
                 what, lim->unpriv);
        break;
    case PROTO_FULL_NOT_ROOT:
        snprintf(buf, n, "too many %s (the last %u of %u are kept for root); try again later", what,
                 lim->max - lim->not_root, lim->max);
        break;
    case PROTO_FULL_ALL:
    default:
        snprintf(buf, n, "too many %s (at most %u); try again later", what, lim->max);
        break;
    }
}
