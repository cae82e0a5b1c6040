/*
 * proto: parsing control requests and building their replies (the protocol
 * itself is described in proto.h).
 */
#include "proto.h"

#include <errno.h>
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
proto_parse_request(const char *line, size_t len, struct proto_request *ret,
                    struct esd_err *err)
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
        r = err_set(err, -EINVAL, cJSON_HasObjectItem(root, "cmd")
                                      ? "request \"cmd\" must be a non-empty string"
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
