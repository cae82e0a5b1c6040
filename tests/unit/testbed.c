/*
 * testbed: the daemon core's test bed (see testbed.h).
 */
#include "testbed.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fsutil.h"
#include "jobs.h"
#include "json.h"
#include "log.h"
#include "testutil.h"
#include "util.h"

struct testbed tb;

static void
set_str(char **field, char *value)
{
    free(*field);
    *field = value;
}

void
tb_setup(void)
{
    json_init();
    /* (warnings show what went wrong when a case fails; ESD_TEST_DEBUG for all) */
    log_init(LOG_TARGET_STDERR, getenv("ESD_TEST_DEBUG") ? LOG_LVL_DEBUG : LOG_LVL_WARNING, true,
             "test");
    unsetenv("NOTIFY_SOCKET");
    unsetenv("ESD_TEST_MERGE_DELAY_SECS");
    memset(&tb, 0, sizeof(tb));
    tb.tmp = tu_tmpdir();
    tb.loop = ev_default_loop(0);
    config_defaults(&tb.conf);
    set_str(&tb.conf.node_name, xstrdup("node-a"));
    set_str(&tb.conf.state_dir, fs_join(tb.tmp, "state"));
    set_str(&tb.conf.socket_path, fs_join(tb.tmp, "esd.sock"));
    set_str(&tb.conf.socket_group, NULL);
    set_str(&tb.conf.metrics_path, NULL);
    set_str(&tb.conf.spool_dir, NULL);
    tb.conf.ray_mode = RAY_OFF;
    tb.conf.dj_warm = false;
    tb.conf.claim_ahead = false;
    tb.conf.shared_fs_check = false;
    tb.conf.poll_interval_secs = 1;
    tb.conf.lease_secs = 3;
    tb.conf.slots = 1;
    /* The caller's own job, as in `esd run`: a test that runs as root has
     * no other user to own the job, and esd as root refuses root's jobs
     * otherwise (jobs.c validate). Attempts run as the test itself. */
    tb.conf.run_mode = true;
    tu_job(tb.tmp, &tb.m);
    tb.job_dir = fs_join(tb.tmp, "job");
    tb_processor("cp \"$in\" \"$out\"");
}

void
tb_teardown(void)
{
    manifest_free(&tb.m);
    config_free(&tb.conf);
    fs_rm_rf(tb.tmp);
    free(tb.tmp);
    free(tb.job_dir);
    memset(&tb, 0, sizeof(tb));
}

void
tb_processor(const char *body)
{
    char *text = xasprintf("#!/bin/sh\n"
                           "while [ $# -gt 0 ]; do\n"
                           "    case $1 in\n"
                           "    --dataset_path) in=$2; shift ;;\n"
                           "    --export_path) out=$2; shift ;;\n"
                           "    esac\n"
                           "    shift\n"
                           "done\n"
                           "%s\n",
                           body);
    char *path = tu_write(tb.tmp, "processor.sh", text, (size_t)-1);

    ck_assert_int_eq(chmod(path, 0755), 0);
    strv_free(&tb.conf.processor);
    strv_init(&tb.conf.processor);
    strv_push_owned(&tb.conf.processor, path);
    free(text);
}

struct job *
tb_register(void)
{
    struct esd_err err;
    struct stat st;
    struct job *j;

    ck_assert_int_eq(stat(tb.job_dir, &st), 0);
    err_clear(&err);
    j = jobs_register(tb.job_dir, &st, NULL, false, getuid(), &err);
    ck_assert_msg(j != NULL, "jobs_register: %s", err.msg);
    return j;
}

void
tb_put_result(size_t i)
{
    char *in = fs_join(tb.job_dir, tb.m.shards[i].path);
    char *rel = xasprintf("attempts/%s/0001-x/processed.jsonl", tb.m.shards[i].id);
    size_t len;
    char *data = tu_read(in, &len);

    ck_assert_msg(data != NULL, "cannot read %s", in);
    free(tu_write(tb.job_dir, rel, data, len));
    tu_put_done(&tb.m, i);
    free(data);
    free(rel);
    free(in);
}

static bool
loaded(void *arg)
{
    return jobs_load(arg);
}

void
tb_load(struct job *j)
{
    ck_assert_msg(tb_run_until(loaded, j, 10.0), "job %s not loaded: %s", j->job_dir,
                  j->load_error ? j->load_error : "(no error)");
}

bool
tb_run_until(bool (*done)(void *), void *arg, double secs)
{
    return tu_run_until(tb.loop, done, arg, secs);
}

long
tb_count_lines(const char *path)
{
    size_t len;
    char *data = tu_read(path, &len);
    long n = 0;

    if (!data)
        return -1;
    for (size_t i = 0; i < len; i++)
        n += data[i] == '\n';
    free(data);
    return n;
}
