/*
 * check_proto: the control protocol's requests and replies: valid requests,
 * missing members and members of the wrong type (bad-request), a version
 * mismatch that still yields the id (bad-version), text that is not a JSON
 * object, lines over the size limit (too-large), and replies framed as one
 * compact line with sorted keys.
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "proto.h"
#include "testutil.h"
#include "util.h"

/* Parses the NUL-terminated s; *ret is freed by the caller on success. */
static int
parse(const char *s, struct proto_request *ret, struct esd_err *err)
{
    err_clear(err);
    return proto_parse_request(s, strlen(s), ret, err);
}

/* Expects s to be refused with r and code, carrying id. */
static void
expect_error(const char *s, int r, const char *code, long long id)
{
    struct proto_request req;
    struct esd_err err;
    int got = parse(s, &req, &err);

    ck_assert_msg(got == r, "%s: got %d, want %d (%s)", s, got, r, err.msg);
    ck_assert_str_eq(proto_error_code(got), code);
    ck_assert_msg(req.id == id, "%s: id %lld, want %lld", s, req.id, id);
    ck_assert_ptr_null(req.root);
    ck_assert_ptr_null(req.cmd);
    ck_assert_ptr_null(req.args);
    ck_assert_msg(err.msg[0] != '\0', "%s: no message", s);
}

/* Frames msg and frees it; caller frees the string. */
static char *
framed(cJSON *msg)
{
    struct buf b;

    buf_init(&b);
    proto_frame(msg, &b);
    cJSON_Delete(msg);
    return buf_steal(&b);
}

static void
setup(void)
{
    json_init();
}

START_TEST(test_parse_valid)
{
    struct proto_request req;
    struct esd_err err;

    ck_assert_int_eq(parse("{\"v\":1,\"id\":7,\"cmd\":\"ping\"}", &req, &err), 0);
    ck_assert_int_eq(req.id, 7);
    ck_assert_str_eq(req.cmd, "ping");
    ck_assert_ptr_null(req.args);
    proto_request_free(&req);
    ck_assert_ptr_null(req.root);
    proto_request_free(&req); /* twice is harmless */

    /* args, whitespace, unknown members, a large id kept exactly. */
    ck_assert_int_eq(parse(" {\"cmd\": \"status\", \"id\": 1152921504606846977, \"v\": 1, "
                           "\"args\": {\"job\": \"a\"}, \"future\": [1]}\r",
                           &req, &err),
                     0);
    ck_assert_int_eq(req.id, 1152921504606846977LL);
    ck_assert_str_eq(req.cmd, "status");
    ck_assert_ptr_nonnull(req.args);
    ck_assert_str_eq(json_get_str(req.args, "job"), "a");
    proto_request_free(&req);

    /* An empty args object, a zero id. */
    ck_assert_int_eq(parse("{\"v\":1,\"id\":0,\"cmd\":\"x\",\"args\":{}}", &req, &err), 0);
    ck_assert_int_eq(req.id, 0);
    ck_assert_ptr_nonnull(req.args);
    proto_request_free(&req);
    proto_request_free(NULL);
}
END_TEST

START_TEST(test_parse_not_nul_terminated)
{
    const char text[] = "{\"v\":1,\"id\":3,\"cmd\":\"ping\"}{garbage";
    struct proto_request req;
    struct esd_err err;

    ck_assert_int_eq(
        proto_parse_request(text, strlen("{\"v\":1,\"id\":3,\"cmd\":\"ping\"}"), &req, &err), 0);
    ck_assert_int_eq(req.id, 3);
    proto_request_free(&req);
}
END_TEST

START_TEST(test_parse_missing_members)
{
    expect_error("{\"v\":1,\"cmd\":\"ping\"}", -EINVAL, PROTO_E_BAD_REQUEST, -1);
    expect_error("{\"v\":1,\"id\":4}", -EINVAL, PROTO_E_BAD_REQUEST, 4);
    expect_error("{\"id\":5,\"cmd\":\"ping\"}", -EPROTONOSUPPORT, PROTO_E_BAD_VERSION, 5);
    expect_error("{}", -EPROTONOSUPPORT, PROTO_E_BAD_VERSION, -1);
}
END_TEST

START_TEST(test_parse_wrong_types)
{
    struct proto_request req;
    struct esd_err err;

    expect_error("{\"v\":1,\"id\":\"7\",\"cmd\":\"ping\"}", -EINVAL, PROTO_E_BAD_REQUEST, -1);
    expect_error("{\"v\":1,\"id\":1.5,\"cmd\":\"ping\"}", -EINVAL, PROTO_E_BAD_REQUEST, -1);
    expect_error("{\"v\":1,\"id\":null,\"cmd\":\"ping\"}", -EINVAL, PROTO_E_BAD_REQUEST, -1);
    expect_error("{\"v\":1,\"id\":2,\"cmd\":5}", -EINVAL, PROTO_E_BAD_REQUEST, 2);
    expect_error("{\"v\":1,\"id\":2,\"cmd\":\"\"}", -EINVAL, PROTO_E_BAD_REQUEST, 2);
    expect_error("{\"v\":1,\"id\":2,\"cmd\":[\"ping\"]}", -EINVAL, PROTO_E_BAD_REQUEST, 2);
    expect_error("{\"v\":1,\"id\":2,\"cmd\":\"ping\",\"args\":[]}", -EINVAL, PROTO_E_BAD_REQUEST,
                 2);
    expect_error("{\"v\":1,\"id\":2,\"cmd\":\"ping\",\"args\":\"x\"}", -EINVAL, PROTO_E_BAD_REQUEST,
                 2);
    expect_error("{\"v\":1,\"id\":2,\"cmd\":\"ping\",\"args\":null}", -EINVAL, PROTO_E_BAD_REQUEST,
                 2);
    /* A version that is not the integer 1 is a version problem. */
    expect_error("{\"v\":\"1\",\"id\":2,\"cmd\":\"ping\"}", -EPROTONOSUPPORT, PROTO_E_BAD_VERSION,
                 2);
    expect_error("{\"v\":1.5,\"id\":2,\"cmd\":\"ping\"}", -EPROTONOSUPPORT, PROTO_E_BAD_VERSION, 2);
    ck_assert_int_eq(parse("{\"v\":1,\"id\":2,\"cmd\":5}", &req, &err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "\"cmd\""));
}
END_TEST

START_TEST(test_parse_bad_version_keeps_id)
{
    struct proto_request req;
    struct esd_err err;

    ck_assert_int_eq(parse("{\"v\":2,\"id\":42,\"cmd\":\"ping\"}", &req, &err), -EPROTONOSUPPORT);
    ck_assert_int_eq(req.id, 42);
    ck_assert_str_eq(proto_error_code(-EPROTONOSUPPORT), PROTO_E_BAD_VERSION);
    ck_assert_msg(strstr(err.msg, "version 1"), "%s", err.msg);
    ck_assert_msg(strstr(err.msg, "2"), "%s", err.msg);
    ck_assert_ptr_null(req.root);
    /* The version is judged before the rest: a future request shape still
     * gets bad-version with its id. */
    expect_error("{\"v\":3,\"id\":8,\"command\":{\"name\":\"ping\"}}", -EPROTONOSUPPORT,
                 PROTO_E_BAD_VERSION, 8);
    expect_error("{\"v\":0,\"id\":\"x\"}", -EPROTONOSUPPORT, PROTO_E_BAD_VERSION, -1);
}
END_TEST

START_TEST(test_parse_not_an_object)
{
    static const char *const bad[] = {
        "",
        " ",
        "[1]",
        "\"ping\"",
        "1",
        "null",
        "{",
        "{\"v\":1,\"id\":1,\"cmd\":\"ping\"",
        "{\"v\":1,\"id\":1,\"cmd\":\"ping\"} x",
        "{\"v\":1,\"id\":1,\"cmd\":\"ping\"}{}",
        "not json",
        "{\"v\":1,\"id\":1,\"cmd\":\"p\xff\"}",
        "{'v':1}",
    };
    struct proto_request req;
    struct esd_err err;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        expect_error(bad[i], -EINVAL, PROTO_E_BAD_REQUEST, -1);
    /* The message speaks of the request, not of a file. */
    parse("{", &req, &err);
    ck_assert_msg(!strstr(err.msg, "file"), "%s", err.msg);
    ck_assert_msg(strstr(err.msg, "request"), "%s", err.msg);
    parse("[1]", &req, &err);
    ck_assert_msg(strstr(err.msg, "object"), "%s", err.msg);
}
END_TEST

START_TEST(test_parse_oversize)
{
    const char *head = "{\"v\":1,\"id\":9,\"cmd\":\"ping\"}";
    size_t n = PROTO_MAX_MESSAGE + 1;
    char *line = xmalloc(n + 1);
    struct proto_request req;
    struct esd_err err;

    /* Exactly the limit: a valid request padded with blanks. */
    memset(line, ' ', n);
    memcpy(line, head, strlen(head));
    line[n] = '\0';
    ck_assert_int_eq(proto_parse_request(line, PROTO_MAX_MESSAGE, &req, &err), 0);
    ck_assert_int_eq(req.id, 9);
    proto_request_free(&req);

    /* One byte more is refused before parsing, so the id is unknown. */
    ck_assert_int_eq(proto_parse_request(line, n, &req, &err), -EMSGSIZE);
    ck_assert_int_eq(req.id, -1);
    ck_assert_ptr_null(req.root);
    ck_assert_str_eq(proto_error_code(-EMSGSIZE), PROTO_E_TOO_LARGE);
    ck_assert_msg(strstr(err.msg, "1048576"), "%s", err.msg);
    free(line);
}
END_TEST

START_TEST(test_reply_ok_framing)
{
    cJSON *result = cJSON_CreateObject();
    char *s;

    json_add_bool(result, "pong", true);
    json_add_str(result, "node", "n1");
    s = framed(proto_reply_ok(3, result));
    ck_assert_str_eq(s,
                     "{\"id\":3,\"ok\":true,\"result\":{\"node\":\"n1\",\"pong\":true},\"v\":1}\n");
    free(s);

    s = framed(proto_reply_ok(1152921504606846977LL, NULL));
    ck_assert_str_eq(s, "{\"id\":1152921504606846977,\"ok\":true,\"result\":{},\"v\":1}\n");
    free(s);
}
END_TEST

START_TEST(test_reply_error_framing)
{
    char *s;
    cJSON *back;
    struct esd_err err;

    s = framed(proto_reply_error(-1, PROTO_E_BUSY, "too many"));
    ck_assert_str_eq(s, "{\"error\":{\"code\":\"busy\",\"message\":\"too many\"},\"id\":-1,"
                        "\"ok\":false,\"v\":1}\n");
    free(s);

    /* Newlines and quotes in a message stay inside the one line. */
    s = framed(proto_reply_error(5, PROTO_E_UNKNOWN_COMMAND, "unknown \"a\nb\" é"));
    ck_assert_ptr_eq(strchr(s, '\n'), s + strlen(s) - 1);
    ck_assert_int_eq(json_parse_object(s, strlen(s), "reply", &back, &err), 0);
    ck_assert_str_eq(json_get_str(cJSON_GetObjectItem(back, "error"), "message"),
                     "unknown \"a\nb\" é");
    ck_assert_str_eq(json_get_str(cJSON_GetObjectItem(back, "error"), "code"), "unknown-command");
    cJSON_Delete(back);
    free(s);

    /* NULL message: an empty one. */
    s = framed(proto_reply_error(0, PROTO_E_INTERNAL, NULL));
    ck_assert_str_eq(s, "{\"error\":{\"code\":\"internal\",\"message\":\"\"},\"id\":0,"
                        "\"ok\":false,\"v\":1}\n");
    free(s);
}
END_TEST

START_TEST(test_frame_appends)
{
    struct buf b;
    cJSON *m = proto_reply_ok(1, NULL);

    buf_init(&b);
    buf_puts(&b, "x");
    proto_frame(m, &b);
    proto_frame(m, &b);
    ck_assert_str_eq(b.p, "x{\"id\":1,\"ok\":true,\"result\":{},\"v\":1}\n"
                          "{\"id\":1,\"ok\":true,\"result\":{},\"v\":1}\n");
    buf_free(&b);
    cJSON_Delete(m);
}
END_TEST

START_TEST(test_constants)
{
    ck_assert_int_eq(PROTO_VERSION, 1);
    ck_assert_int_eq(PROTO_MAX_MESSAGE, 1048576);
    ck_assert_int_eq(PROTO_MAX_CONNECTIONS, 256);
    ck_assert_int_eq(PROTO_MAX_PER_UID, 32);
    ck_assert_int_eq(PROTO_MAX_REPLY, 256 * 1024 * 1024);
    ck_assert_int_eq(PROTO_IDLE_SECS, 60);
    ck_assert_str_eq(ESD_VERSION, "0.1.0");
    ck_assert_str_eq(PROTO_E_BAD_REQUEST, "bad-request");
    ck_assert_str_eq(PROTO_E_BAD_VERSION, "bad-version");
    ck_assert_str_eq(PROTO_E_UNKNOWN_COMMAND, "unknown-command");
    ck_assert_str_eq(PROTO_E_TOO_LARGE, "too-large");
    ck_assert_str_eq(PROTO_E_DENIED, "denied");
    ck_assert_str_eq(PROTO_E_BUSY, "busy");
    ck_assert_str_eq(PROTO_E_INTERNAL, "internal");
    ck_assert_str_eq(proto_error_code(-EINVAL), PROTO_E_BAD_REQUEST);
}
END_TEST

static Suite *
proto_suite(void)
{
    Suite *s = suite_create("proto");
    TCase *tc = tcase_create("proto");

    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_add_test(tc, test_parse_valid);
    tcase_add_test(tc, test_parse_not_nul_terminated);
    tcase_add_test(tc, test_parse_missing_members);
    tcase_add_test(tc, test_parse_wrong_types);
    tcase_add_test(tc, test_parse_bad_version_keeps_id);
    tcase_add_test(tc, test_parse_not_an_object);
    tcase_add_test(tc, test_parse_oversize);
    tcase_add_test(tc, test_reply_ok_framing);
    tcase_add_test(tc, test_reply_error_framing);
    tcase_add_test(tc, test_frame_appends);
    tcase_add_test(tc, test_constants);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(proto_suite());
}
