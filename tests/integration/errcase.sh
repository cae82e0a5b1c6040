#!/usr/bin/env bash
# errcase: scripts/errcase (make errcase) finds every error text that breaks
# the one rule (lower-case first word unless it is a name, no trailing
# period) and names it by file and line; it leaves alone what is not an
# error text (info logs, stdout, comments), names and the reference's texts
# of its allow-list; an allow-list entry that nothing uses is an error.
#
# Environment: TOP (see lib.bash).
set -euo pipefail
# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

new_workdir
EC=$TOP/scripts/errcase

run "$EC"
check "the tree's error texts keep the rule" 0
[ -z "$OUT$ERR" ] || fail "errcase is quiet on the tree" "$OUT" "$ERR"

mkdir "$W/src"
cat >"$W/src/bad.c" <<'EOF'
/* A fixture: the line numbers below are what errcase must name. */
static int
f(struct esd_err *err, const char *p, int cond)
{
    err_set(err, -EINVAL, "Cannot open %s", p);
    err_sys(err, -EIO, "cannot read %s.", p);
    log_warning(NULL, "Lost the lease of %s", p);
    log_msg(LOG_LVL_INFO, NULL, "Started %s", p);
    log_msg(LOG_LVL_ERR, NULL, "Stopped %s", p);
    log_event(LOG_LVL_WARNING, NULL, MSGID_X, "Gave up on %s", p);
    fprintf(stderr, "esd: Bad thing\n");
    fprintf(stdout, "Fine on stdout\n");
    err_set(err, -EINVAL, "JSON is bad at %s", p);
    err_set(err, -EINVAL, "Ray head died, ValueError in %s", p);
    err_set(err, -EINVAL, "Blank JSONL record at %s:%d", p, 1);
    err_set(err, -EIO,
            "Could not"
            " write %" PRIu64 " bytes", (uint64_t)1);
    render_error(NULL, "x", cond ? "fine" : "Bad", 2);
    /* err_set(err, -1, "Commented out"); */
    out_error("%s", p);
    return err_set(err, -EINVAL, "ends in an ellipsis...");
}
static void
g(struct runner *r, char *buf)
{
    snprintf(r->error, sizeof(r->error), "Died: %s", "x");
    snprintf(buf, 10, "Fine: %s", "x");
}
EOF
run "$EC" "$W/src"
check "errcase fails on the fixture" 1
want="$W/src/bad.c:5: starts with a capital: err_set('Cannot open %s')
$W/src/bad.c:6: ends with a period: err_sys('cannot read %s.')
$W/src/bad.c:7: starts with a capital: log_warning('Lost the lease of %s')
$W/src/bad.c:9: starts with a capital: log_msg('Stopped %s')
$W/src/bad.c:10: starts with a capital: log_event('Gave up on %s')
$W/src/bad.c:11: starts with a capital: fprintf('esd: Bad thing\n')
$W/src/bad.c:17: starts with a capital: err_set('Could not write %d bytes')
$W/src/bad.c:19: starts with a capital: render_error('Bad')
$W/src/bad.c:27: starts with a capital: snprintf('Died: %s')"
[ "$OUT" == "$want" ] || fail "errcase names exactly the bad texts, by file and line" "got:" "$OUT" \
    "expected:" "$want"
ok "errcase names the 9 bad texts and no other (info log, stdout, comment, names, allow-list, a plain buffer)"

cp "$TOP/scripts/errcase.allow" "$W/allow"
echo "Never printed by anything" >>"$W/allow"
n=$(wc -l <"$W/allow")
ERRCASE_ALLOW=$W/allow run "$EC"
check "an unused allow-list entry fails" 1 "$W/allow:$n: no text uses this entry any more"

summary
