#!/usr/bin/env bash
# fleet_claims: what claims cost a fleet of real esd daemons (one per
# simulated node, sharing job directories through a spool directory; the
# test stand-in mini-dj, not Data-Juicer; ray.mode off), with a poll
# interval of 30 s, so that nothing below can come from polling:
#   (a) three daemons (2 slots each) finish a 60-shard job: one done record
#       per shard, attempt 1; no lock created in vain, i.e. the status
#       counters "claims" of every node have locks_created == claimed, and
#       the claims add up to the shards (a shard done elsewhere was passed
#       on its done record, never by creating its lock), passed_done +
#       claimed <= 60 on every node, and every node is finalizing or done
#       with the job; the merge (finalize.json) follows the last done record
#       within 5 s.
#   (b) a cancel racing claims: while the three work a 200-shard job,
#       `esctl cancel --everywhere` through one of them; once it returned,
#       no node starts an attempt of the job (every attempt's
#       claimed_at_epoch, stamped before the claim's last look at the
#       marker, is before the moment the command returned), every node
#       reports the job cancelled within 10 s (not at its next rescan), and
#       no lock is left once the attempts stopped.
#
# Environment: TOP, ESCTL, ESD (esd binary; default $TOP/esd), TOOLS (see
# lib.bash).
set -euo pipefail
export LC_ALL=C

# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

NODES=(a b c)

new_workdir
unset_knobs
need_daemon_tools

# a few rows a shard, 10 ms a row: short attempts, so that the nodes claim
# all the time
export MINI_DJ_SLEEP_MS=10
text_dataset 1000

finalized() {
    [ -e "$1/state/esd/finalize.json" ] && [ "$(py 'j["status"]' "$1/state/esd/finalize.json")" = complete ]
}
state_is() { [ "$(job_state "$1" "$2")" = "$3" ]; }
# entries JOB KIND OP N: the number of entries in JOB/state/KIND OP N
entries() { [ "$(count "$1/state/$2")" "$3" "$4" ]; }

for n in "${NODES[@]}"; do
    daemon_conf "$n" slots=2 poll_interval_secs=30
    start_daemon "$n"
done
ok "daemons ${NODES[*]} answer ping"

# ---- (a) no wasted lock, a prompt merge ----
JA="$W/job-a"
prepare_job "$JA" 60
give_job "$JA"
spool_job "$JA"
wait_for "job a is merged" 60 finalized "$JA"
ok "job a finished and merged"
python3 - "$JA" <<'EOF' || fail "one done record per shard of job a, attempt 1, one attempt dir each"
import json, os, sys
job = sys.argv[1]
ids = [s["id"] for s in json.load(open(os.path.join(job, "manifest.json")))["shards"]]
assert sorted(f[:-5] for f in os.listdir(os.path.join(job, "state/done"))) == sorted(ids)
for i in ids:
    d = json.load(open(os.path.join(job, "state/done", i + ".json")))
    assert d["attempt_number"] == 1, (i, d["attempt_number"])
    assert len(os.listdir(os.path.join(job, "attempts", i))) == 1, i
EOF
ok "one done record per shard, attempt 1, one attempt dir each"
# (a node that lost the election learns the merge's end at its own poll)
ended() { [[ " finalizing complete " == *" $(job_state "$1" "$2") "* ]]; }
for n in "${NODES[@]}"; do
    wait_for "node $n saw every shard of job a done within a poll" 35 ended "$n" "$JA"
done
created=0
claimed=0
for n in "${NODES[@]}"; do
    c=$(job_field "$n" "$JA" 'x["claims"]["locks_created"], x["claims"]["claimed"], x["claims"]["passed_done"]')
    read -r lc cl pd <<<"$(tr -d '(),' <<<"$c")"
    [ "$lc" -eq "$cl" ] || fail "node $n created no lock in vain" "claims $c"
    # (a node may learn the end from the merge's record instead)
    [ $((pd + cl)) -le 60 ] || fail "node $n counted no shard twice" "claims $c"
    created=$((created + lc))
    claimed=$((claimed + cl))
    echo "# node $n: locks_created $lc, claimed $cl, passed_done $pd"
done
[ "$claimed" -eq 60 ] || fail "the claims add up to the shards" "$claimed claims, $created locks"
ok "no lock created in vain: $created locks for $claimed claims of 60 shards"
gap=$(python3 - "$JA" <<'EOF'
import os, sys
job = sys.argv[1]
last = max(os.stat(os.path.join(job, "state/done", f)).st_mtime
           for f in os.listdir(os.path.join(job, "state/done")))
print("%.2f" % (os.stat(os.path.join(job, "state/esd/finalize.json")).st_mtime - last))
EOF
)
python3 -c "import sys; sys.exit(not float('$gap') < 5)" ||
    fail "the merge follows the last done record within 5 s" "$gap s"
ok "the merge was recorded $gap s after the last done record (poll interval 30 s)"

# ---- (b) cancel --everywhere racing claims ----
JB="$W/job-b"
prepare_job "$JB" 200
give_job "$JB"
spool_job "$JB"
wait_for "job b is being worked" 30 entries "$JB" done -ge 20
"$ESCTL" --socket "$(dsock a)" cancel --everywhere "$JB" >"$W/cancel.out" 2>&1 ||
    fail "esctl cancel --everywhere" "$(cat "$W/cancel.out")"
returned=$(date +%s.%N)
ok "cancelled job b everywhere through a after $(count "$JB/state/done") done records"
for n in "${NODES[@]}"; do
    wait_for "node $n reports job b cancelled" 10 state_is "$n" "$JB" cancelled
done
ok "every node reports job b cancelled"
wait_for "the stopped attempts released their locks" 20 entries "$JB" locks -eq 0
late=$(python3 - "$JB" "$returned" <<'EOF'
import json, os, sys
job, at = sys.argv[1], float(sys.argv[2])
late, n = [], 0
for sid in os.listdir(os.path.join(job, "attempts")):
    for a in os.listdir(os.path.join(job, "attempts", sid)):
        n += 1
        rec = json.load(open(os.path.join(job, "attempts", sid, a, "attempt.json")))
        if rec["claimed_at_epoch"] > at:
            late.append("%s/%s by %s at +%.3f s" % (sid, a, rec.get("node"), rec["claimed_at_epoch"] - at))
print("%d attempts; late: %s" % (n, ", ".join(late) or "none"))
EOF
)
[[ $late == *"late: none" ]] || fail "no attempt started after cancel --everywhere returned" "$late"
ok "no attempt started after cancel --everywhere returned ($late)"
[ "$(count "$JB/state/done")" -lt 200 ] || fail "job b was cancelled before its end"

for n in "${NODES[@]}"; do
    stop_daemon "$n"
    [ "$DRC" -eq 0 ] || fail "esd $n exits 0 on SIGTERM" "status $DRC" "$(tail -n 5 "$W/$n/log")"
done
ok "all daemons stop with status 0"
summary
