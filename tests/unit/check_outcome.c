/*
 * check_outcome: outcome_classify, the one mapping from an attempt's end to
 * its outcome: every branch (a clean stop, a start that failed, a lease
 * lost, a Ray head that went down, a timeout, an exit code, a signal, the
 * output's validation, success), the precedence where several facts hold
 * at once, and that the fields of the outcome that are the caller's stay
 * untouched.
 */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "outcome.h"
#include "testutil.h"

/* Wait statuses as waitpid gives them. */
#define EXITED(code) ((code) << 8)
#define KILLED(sig) (sig)

#define STOPPED_TEXT "the attempt was stopped on purpose (drain, cancel or shutdown)"

struct want {
    bool more; /* outcome_classify's return: validate the output first */
    enum failure_class fc;
    bool released;
    int return_code;
    const char *error; /* NULL: none */
};

/* Classifies f and checks every field outcome_classify writes. */
static void
expect(const char *what, const struct outcome_facts *f, const struct want *w)
{
    struct attempt_outcome out = {
        .fc = FC_OUTPUT, .error = "stale", .released = !w->released, .return_code = 99
    };
    char msg[OUTCOME_MSG_MAX];
    bool more = outcome_classify(f, &out, msg, sizeof(msg));

    ck_assert_msg(more == w->more, "%s: returned %d", what, more);
    ck_assert_msg(out.fc == w->fc, "%s: class %d, expected %d", what, out.fc, w->fc);
    ck_assert_msg(out.released == w->released, "%s: released %d", what, out.released);
    ck_assert_msg(out.return_code == w->return_code, "%s: return code %d, expected %d", what,
                  out.return_code, w->return_code);
    if (w->error)
        ck_assert_msg(out.error && !strcmp(out.error, w->error),
                      "%s: error \"%s\", expected \"%s\"", what, out.error ? out.error : "(null)",
                      w->error);
    else
        ck_assert_msg(!out.error, "%s: error \"%s\", expected none", what, out.error);
}

START_TEST(test_success_validates_first)
{
    struct outcome_facts f = { .ran = true, .status = EXITED(0) };

    expect("exit 0, not validated", &f, &(struct want){ .more = true, .fc = FC_NONE });
    f.validated = true;
    expect("exit 0, validated", &f, &(struct want){ .fc = FC_NONE });
    /* a Ray head that went down under a processor that succeeded: its
     * output decides */
    f.ray_restarted = true;
    f.validated = false;
    expect("exit 0, Ray restarted", &f, &(struct want){ .more = true, .fc = FC_NONE });
}
END_TEST

START_TEST(test_invalid_output)
{
    struct outcome_facts f = { .ran = true,
                               .status = EXITED(0),
                               .validated = true,
                               .result_rc = -EINVAL,
                               .result_error = "invalid JSON at x:2" };

    expect("invalid output", &f, &(struct want){ .fc = FC_OUTPUT, .error = "invalid JSON at x:2" });
    /* the storage failed, not the processor: infrastructure */
    f.result_rc = -ENOSPC;
    f.result_error = "cannot write processed.jsonl: No space left on device";
    expect("ENOSPC while validating", &f,
           &(struct want){ .fc = FC_INFRASTRUCTURE, .error = f.result_error });
    /* without a message, the errno's */
    f.result_rc = -EINVAL;
    f.result_error = NULL;
    expect("no message", &f, &(struct want){ .fc = FC_OUTPUT, .error = strerror(EINVAL) });
}
END_TEST

START_TEST(test_exit_code_and_signal)
{
    struct outcome_facts f = { .ran = true, .status = EXITED(3), .validated = true };

    expect("exit 3", &f,
           &(struct want){
               .fc = FC_PROCESSOR, .return_code = 3, .error = "Data-Juicer returned exit code 3" });
    f.status = KILLED(SIGABRT);
    expect("SIGABRT", &f,
           &(struct want){ .fc = FC_PROCESSOR,
                           .return_code = -SIGABRT,
                           .error = "Data-Juicer was killed by signal 6 (ABRT)" });
}
END_TEST

START_TEST(test_timeout)
{
    struct outcome_facts f = {
        .ran = true, .status = KILLED(SIGTERM), .timed_out = true, .timeout_secs = 2
    };
    struct want w = { .fc = FC_PROCESSOR,
                      .return_code = -SIGTERM,
                      .error = "Data-Juicer timed out after 2 s and was killed" };

    expect("timed out", &f, &w);
    /* one that exited 0 as it was killed still timed out */
    f.status = EXITED(0);
    w.return_code = 0;
    expect("timed out, exit 0", &f, &w);
}
END_TEST

START_TEST(test_ray_head_down)
{
    struct outcome_facts f = { .ran = true, .status = EXITED(1), .ray_restarted = true };

    expect("Ray down, exit 1", &f,
           &(struct want){ .fc = FC_INFRASTRUCTURE,
                           .return_code = 1,
                           .error = "the Ray head went down during the attempt (Data-Juicer "
                                    "returned exit code 1)" });
    /* before the timeout: a lost head makes it hang */
    f.status = KILLED(SIGTERM);
    f.timed_out = true;
    f.timeout_secs = 60;
    expect("Ray down, timed out", &f,
           &(struct want){ .fc = FC_INFRASTRUCTURE,
                           .return_code = -SIGTERM,
                           .error = "the Ray head went down during the attempt (Data-Juicer "
                                    "was killed by signal 15 (TERM))" });
}
END_TEST

START_TEST(test_lease_lost)
{
    /* it ran and was killed for it; before a Ray restart and a timeout */
    struct outcome_facts f = { .ran = true,
                               .status = KILLED(SIGTERM),
                               .timed_out = true,
                               .ray_restarted = true,
                               .lease_error = "lock taken over by n2" };

    expect("lease lost", &f,
           &(struct want){ .fc = FC_INFRASTRUCTURE,
                           .return_code = -SIGTERM,
                           .error = "lock taken over by n2" });
    /* lost before the processor ran (claimed ahead) */
    f.ran = false;
    expect("lease lost, never ran", &f,
           &(struct want){
               .fc = FC_INFRASTRUCTURE, .return_code = -1, .error = "lock taken over by n2" });
    /* the exit status of a kill the lease loss caused says nothing */
    f.ran = true;
    f.timed_out = f.ray_restarted = false;
    f.status = EXITED(0);
    f.validated = true;
    expect("lease lost, exit 0", &f,
           &(struct want){ .fc = FC_INFRASTRUCTURE, .error = "lock taken over by n2" });
}
END_TEST

START_TEST(test_start_failed)
{
    struct outcome_facts f = { .start_error = "cannot execute dj-process: No such file" };
    struct want w = { .fc = FC_INFRASTRUCTURE, .return_code = -1, .error = f.start_error };

    expect("start failed", &f, &w);
    /* the start's error is the first thing that went wrong */
    f.lease_error = "lock taken over by n2";
    expect("start failed, lease lost", &f, &w);
    /* nothing ran and nobody said why */
    f.start_error = f.lease_error = NULL;
    expect("never ran", &f,
           &(struct want){ .fc = FC_INFRASTRUCTURE,
                           .return_code = -1,
                           .error = "the processor never started" });
}
END_TEST

START_TEST(test_stop_wins)
{
    struct outcome_facts f = { .stopped = true,
                               .ran = true,
                               .status = KILLED(SIGTERM),
                               .timed_out = true,
                               .ray_restarted = true,
                               .lease_error = "lock taken over by n2" };

    expect("stopped, everything else too", &f,
           &(struct want){ .released = true, .return_code = -SIGTERM, .error = STOPPED_TEXT });
    f = (struct outcome_facts){ .stopped = true, .start_error = "no such file" };
    expect("stopped before it started", &f,
           &(struct want){ .released = true, .return_code = -1, .error = STOPPED_TEXT });
    f = (struct outcome_facts){ .stopped = true, .ran = true, .status = EXITED(0) };
    expect("stopped, exit 0", &f, &(struct want){ .released = true, .error = STOPPED_TEXT });
}
END_TEST

START_TEST(test_leaves_callers_fields)
{
    struct outcome_facts f = { .ran = true, .status = EXITED(2) };
    struct attempt_outcome out = { .duration = 1.5,
                                   .dj_commit = "abc",
                                   .ray_address = "h:6379",
                                   .started_epoch = 10,
                                   .ended_epoch = 11.5 };
    char msg[OUTCOME_MSG_MAX];

    ck_assert(!outcome_classify(&f, &out, msg, sizeof(msg)));
    ck_assert(out.duration == 1.5);
    ck_assert_str_eq(out.dj_commit, "abc");
    ck_assert_str_eq(out.ray_address, "h:6379");
    ck_assert(out.started_epoch == 10 && out.ended_epoch == 11.5);
    /* the message is in the caller's buffer, cut to its size */
    ck_assert_ptr_eq(out.error, msg);
    ck_assert(!outcome_classify(&f, &out, msg, 12));
    ck_assert_str_eq(out.error, "Data-Juicer");
}
END_TEST

static Suite *
outcome_suite(void)
{
    Suite *s = suite_create("outcome");
    TCase *tc = tcase_create("classify");

    tcase_add_test(tc, test_success_validates_first);
    tcase_add_test(tc, test_invalid_output);
    tcase_add_test(tc, test_exit_code_and_signal);
    tcase_add_test(tc, test_timeout);
    tcase_add_test(tc, test_ray_head_down);
    tcase_add_test(tc, test_lease_lost);
    tcase_add_test(tc, test_start_failed);
    tcase_add_test(tc, test_stop_wins);
    tcase_add_test(tc, test_leaves_callers_fields);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(outcome_suite());
}
