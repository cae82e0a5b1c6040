/*
 * check_unitcheck: what a unit's sandbox lets esd see and write
 * (unit_sandbox_why), for the shipped esd.service's settings and their
 * variants: ProtectSystem=strict makes everything read-only but
 * ReadWritePaths=, the state and runtime directories and /dev, /proc,
 * /sys, the deepest listed path winning; ProtectHome=yes hides /home and
 * /root, read-only only protects them; PrivateTmp=yes gives a /tmp no
 * other process sees; InaccessiblePaths= hides; ProtectSystem=full
 * protects /etc, yes only /usr; the fix named is the drop-in line.
 */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "unitcheck.h"
#include "util.h"

static struct unit_sandbox sb;

static void
setup(void)
{
    memset(&sb, 0, sizeof(sb));
    strv_init(&sb.rw);
    strv_init(&sb.ro);
    strv_init(&sb.hidden);
    sb.unit = xstrdup("esd.service");
    sb.user = xstrdup("esd");
    sb.protect_system = xstrdup("strict");
    sb.protect_home = xstrdup("read-only");
    sb.private_tmp = true;
    strv_push(&sb.rw, "/mnt/shared");
    strv_push(&sb.rw, "/var/lib/esd");
    strv_push(&sb.rw, "/run/esd");
}

static void
teardown(void)
{
    unit_sandbox_free(&sb);
}

/* why(path, write) contains want (NULL: esd can use it) */
static void
expect(const char *path, bool write, const char *want)
{
    char *why = unit_sandbox_why(&sb, path, write);

    if (!want)
        ck_assert_msg(!why, "%s: %s", path, why);
    else
        ck_assert_msg(why && strstr(why, want), "%s: %s, not \"%s\"", path, why ? why : "ok", want);
    free(why);
}

static void
set(char **field, const char *value)
{
    free(*field);
    *field = xstrdup(value);
}

START_TEST(test_strict_writes)
{
    expect("/mnt/shared/esd/spool", true, NULL);
    expect("/mnt/shared", true, NULL);
    expect("/var/lib/esd", true, NULL);
    expect("/run/esd", true, NULL);
    expect("/dev/shm", true, NULL);
    expect("/mnt/sharedx", true, "(ProtectSystem=strict)");
    expect(
        "/var/lib/node-exporter", true,
        "esd.service may not write /var/lib/node-exporter (ProtectSystem=strict): add it in "
        "a drop-in, systemctl edit esd.service: [Service] ReadWritePaths=/var/lib/node-exporter");
    /* reading and running is not writing */
    expect("/usr/bin/ray", false, NULL);
    expect("/opt/esd/venv/bin/dj-process", false, NULL);
}
END_TEST

START_TEST(test_home_and_tmp)
{
    expect("/home/ann/venv/bin/dj-process", false, NULL);
    expect("/home/ann/jobs", true, "(ProtectHome=read-only)");
    strv_push(&sb.rw, "/home/ann/jobs");
    expect("/home/ann/jobs/x", true, NULL);
    set(&sb.protect_home, "yes");
    expect("/home/ann/venv/bin/dj-process", false, "hides /home (ProtectHome=yes)");
    expect("/root/bin/ray", false, "hides /root (ProtectHome=yes)");
    /* a ReadWritePaths= below /home is there all the same */
    expect("/home/ann/jobs/x", true, NULL);
    expect("/tmp/dj-process", false, "has a /tmp of its own (PrivateTmp=yes)");
    expect("/var/tmp/esd.prom", true, "has a /var/tmp of its own");
    sb.private_tmp = false;
    expect("/tmp/dj-process", false, NULL);
    expect("/tmp/esd.prom", true, "(ProtectSystem=strict)");
}
END_TEST

START_TEST(test_lists_and_levels)
{
    strv_push(&sb.ro, "/mnt/shared/recipes");
    expect("/mnt/shared/recipes/out", true, "(ReadOnlyPaths=)");
    expect("/mnt/shared/jobs", true, NULL);
    strv_push(&sb.hidden, "/opt/secret");
    expect("/opt/secret/bin/ray", false, "hides it (InaccessiblePaths=)");
    set(&sb.protect_system, "full");
    expect("/var/lib/node-exporter", true, NULL);
    expect("/etc/esd/x", true, "(ProtectSystem=full)");
    set(&sb.protect_system, "yes");
    expect("/etc/esd/x", true, NULL);
    expect("/usr/local/x", true, "(ProtectSystem=yes)");
    set(&sb.protect_system, "no");
    expect("/usr/local/x", true, NULL);
}
END_TEST

static Suite *
unitcheck_suite(void)
{
    Suite *s = suite_create("unitcheck");
    TCase *tc = tcase_create("sandbox");

    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_strict_writes);
    tcase_add_test(tc, test_home_and_tmp);
    tcase_add_test(tc, test_lists_and_levels);
    suite_add_tcase(s, tc);
    return s;
}

int
main(void)
{
    return tu_run(unitcheck_suite());
}
