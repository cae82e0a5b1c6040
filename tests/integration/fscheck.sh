#!/usr/bin/env bash
# fscheck: esctl fscheck DIR and esd's refusal of a mount where claims
# cannot be exclusive.
#   (a) one participant (the single-node subset): exit 0, a human verdict,
#       --json with "exclusive": true, nothing left behind in DIR, nothing
#       recorded (DIR is not a job).
#   (b) two esctl fscheck at once with --nodes 2 on a job dir (two nodes
#       simulated by two processes: real verdicts need two nodes): both
#       exit 0 with the same verdict naming both participants, O_EXCL and
#       link ok, the note that they ran on one host, the verdict recorded
#       in state/esd/fscheck.json, no rendezvous directory left.
#   (c) a run whose partner never comes goes on alone after --wait-secs.
#   (d) esd refuses to work a job whose recorded verdict says claims
#       cannot be exclusive: status shows why, the log (the journal) says
#       it, no claim is made; once esctl fscheck records a good verdict and
#       the job is submitted again, esd loads it at once (not after
#       poll_interval_secs, an hour here) and works it to the end.
#
# Environment: TOP, ESCTL, ESD, TOOLS (see lib.bash).
set -euo pipefail
export LC_ALL=C

# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

new_workdir
unset_knobs

# (a)
mkdir "$W/plain"
run "$ESCTL" fscheck "$W/plain"
check "fscheck of a plain directory" 0 "verdict: claims can be exclusive here"
[[ $OUT == *"O_EXCL create"*"ok (one participant"* ]] || fail "the O_EXCL line" "$OUT"
[ "$(count "$W/plain")" -eq 0 ] || fail "nothing left in DIR" "$(ls -A "$W/plain")"
ok "nothing left behind, nothing recorded"
run "$ESCTL" --json fscheck "$W/plain"
check "fscheck --json" 0
[ "$(py 'j["exclusive"] and len(j["participants"]) == 1' "$W/stdout")" = True ] ||
    fail "--json: exclusive, one participant" "$OUT"
ok "--json says exclusive, one participant"
run "$ESCTL" fscheck "$W/plain" --run ../x --nodes 2
check "a bad --run is refused" 2 "" "invalid run name"

# (b)
text_dataset 40
prepare_job "$W/job" 4
"$ESCTL" --json fscheck "$W/job" --nodes 2 --run two --wait-secs 20 >"$W/a.json" 2>"$W/a.err" &
pa=$!
"$ESCTL" fscheck "$W/job" --nodes 2 --run two --wait-secs 20 >"$W/b.txt" 2>"$W/b.err" &
pb=$!
ra=0 rb=0
wait "$pa" || ra=$?
wait "$pb" || rb=$?
{ [ "$ra" -eq 0 ] && [ "$rb" -eq 0 ]; } || fail "both participants exit 0" "$ra $rb" "$(cat "$W/a.err" "$W/b.err")"
ok "two participants at once both exit 0"
[ "$(py 'len(j["participants"]) == 2 and j["o_excl"] == "ok" and j["link"] == "ok" and j["rename"] == "ok"' "$W/a.json")" = True ] ||
    fail "two participants, O_EXCL, link and rename ok" "$(cat "$W/a.json")"
{ grep -q "2 participant(s) on 1 host(s)" "$W/b.txt" && grep -q "real verdicts need two nodes" "$W/b.txt" &&
    grep -q "O_EXCL create *ok$" "$W/b.txt"; } || fail "the human verdict of the other" "$(cat "$W/b.txt")"
ok "the same verdict in both, with the note that one host is not two nodes"
[ "$(py 'len(j["participants"]) == 2 and j["exclusive"]' "$W/job/state/esd/fscheck.json")" = True ] ||
    fail "the verdict recorded in the job" "$(cat "$W/job/state/esd/fscheck.json")"
[ ! -e "$W/job/.esd-fscheck" ] || fail "no rendezvous left" "$(ls -R "$W/job/.esd-fscheck")"
ok "recorded in state/esd/fscheck.json, rendezvous removed"

# (c)
t0=$(date +%s)
run "$ESCTL" --json fscheck "$W/plain" --nodes 2 --run alone --wait-secs 1
check "a run without its partner" 0
[ $(($(date +%s) - t0)) -lt 15 ] || fail "it ends soon after --wait-secs"
[ "$(py 'len(j["participants"])' "$W/stdout")" = 1 ] || fail "alone: one participant" "$OUT"
ok "a partner that never comes: the run goes on alone after --wait-secs"

# (d)
need_daemon_tools
python3 - "$W/job/state/esd/fscheck.json" <<'EOF'
import json, sys
v = json.load(open(sys.argv[1]))
v["exclusive"] = False
v["link"] = "FAILED: 2 participants won k.7"
v["reason"] = "link(): FAILED: 2 participants won k.7"
json.dump(v, open(sys.argv[1], "w"))
EOF
give_job "$W/job"
# (an hour between loads: only a new submit loads the refused job again soon)
daemon_conf a poll_interval_secs=3600
start_daemon a
spool_job "$W/job"
refused() { job_field a "$W/job" 'x.get("load_error", "")' | grep -q "claims cannot be exclusive"; }
wait_for "status says why the job is not worked" 20 refused
ok "status: $(job_field a "$W/job" 'x.get("load_error")' | cut -c1-90)..."
grep -q "cannot work job $W/job: claims cannot be exclusive on this file system: link(): FAILED: 2 participants won k.7" "$W/a/log" ||
    fail "the log says why" "$(tail -n 5 "$W/a/log")"
ok "the log (journal) says why"
{ [ "$(count "$W/job/state/locks")" -eq 0 ] && [ "$(count "$W/job/state/done")" -eq 0 ]; } ||
    fail "no claim on a refused mount" "$(ls "$W/job/state/locks" "$W/job/state/done")"
ok "no claim made"
# a good verdict recorded again (as the owner): the job is worked
if [ "$(id -u)" -eq 0 ]; then
    setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups "$ESCTL" fscheck "$W/job" >"$W/fix.out" 2>&1 ||
        fail "fscheck as the owner" "$(cat "$W/fix.out")"
else
    "$ESCTL" fscheck "$W/job" >"$W/fix.out" 2>&1 || fail "fscheck" "$(cat "$W/fix.out")"
fi
"$ESCTL" --socket "$(dsock a)" submit "$W/job" >"$W/resubmit.out" 2>&1 ||
    fail "submit again" "$(cat "$W/resubmit.out")"
complete() { [ "$(job_state a "$W/job")" = complete ]; }
wait_for "the job is worked once the verdict is good and it is submitted again" 40 complete
[ "$(count "$W/job/state/done")" -eq 4 ] || fail "4 done records"
ok "after a good verdict, submitted again, the job is loaded at once and completes"
stop_daemon a
summary
