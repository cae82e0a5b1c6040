#!/usr/bin/env bash
# housekeeping: esctl wait, esctl forget, retention_secs and list --state,
# with the stand-in processor, two or three daemons and one spool:
#   (a) wait exits 0 on a job that merges, 2 on one whose shard fails
#       terminally, 1 after --timeout-secs on a job nobody works (and not
#       much later), 2 with a clear message on a directory that is no job
#       and on one removed while it waits; wait --local reads the job dir;
#   (b) list --state filters (failed, merged, running), an unknown state is
#       refused;
#   (c) forget refuses a job still active here, forgets it once cancelled;
#       forgetting a failed job drops it from list and from the metrics
#       file while its directory stays;
#   (d) forget --everywhere on node a: node b, which adopted the job from
#       the spool, drops it too, and a fresh node c does not adopt it;
#   (e) a fresh node d with retention_secs=1 on a spool whose job was merged
#       long ago does not adopt it and removes its entry; a node reloaded
#       with retention_secs=1 forgets its ended jobs by itself.
# Environment: TOP, ESCTL, ESD, JSONL_CHECK (see lib.bash).
set -euo pipefail
export LC_ALL=C
# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

new_workdir
unset_knobs
need_daemon_tools
text_dataset 40

new_job() {
    prepare_job "$W/$1" "${@:2}"
    give_job "$W/$1"
}
ctl() { run "$ESCTL" --socket "$(dsock "$1")" "${@:2}"; }
listed() { "$ESCTL" --json --socket "$(dsock "$1")" list "${@:3}" | grep -q "\"$W/$2\""; }
not_listed() { ! listed "$@"; }

new_job good 2
new_job failjob 1 --max-retries 0
new_job idle 1
new_job old 1
PROM=$W/esd.prom
daemon_conf a metrics.path="$PROM" metrics.interval_secs=1
start_daemon a MINI_DJ_EXIT=1 MINI_DJ_ONLY=failjob

# ---- (a) wait ----
ctl a submit "$W/good" --everywhere
check "submit good --everywhere" 0
ctl a wait "$W/good"
check "wait on a job that merges exits 0" 0 "merged"
[ -s "$W/good/merged.jsonl" ] || fail "wait returned before the merged output existed"
ok "the merged output is there when wait returns"
ctl a submit "$W/failjob"
check "submit failjob" 0
ctl a wait "$W/failjob"
check "wait on a job whose shard failed exits 2" 2 "failed"
run "$ESCTL" wait --local "$W/good"
check "wait --local on the merged job exits 0" 0 "merged"
t0=$(date +%s)
ctl a wait "$W/idle" --timeout-secs 2
check "wait --timeout-secs on a job nobody works exits 1" 1 "" "not over after 2 s"
[ $(($(date +%s) - t0)) -le 6 ] || fail "wait ends soon after its timeout" "$(($(date +%s) - t0)) s"
ok "wait ends soon after its timeout"
mkdir "$W/empty"
ctl a wait "$W/empty"
check "wait on a directory that is no job exits 2" 2 "" "not a job directory"
cp -a "$W/idle" "$W/gone"
"$ESCTL" --socket "$(dsock a)" wait "$W/gone" >"$W/gone.out" 2>"$W/gone.err" &
WPID=$!
BG+=("$WPID")
rm -rf "$W/gone"
wait_for "wait notices the removed directory" 15 dead "$WPID"
RC=0
wait "$WPID" || RC=$?
OUT=$(cat "$W/gone.out") ERR=$(cat "$W/gone.err")
# (caught in the middle of rm -rf, the directory may still be there)
[[ $ERR == *"is gone"* || $ERR == *"not a job directory"* ]] ||
    fail "wait says the job directory went" "stderr: $ERR"
check "wait on a job directory removed meanwhile exits 2" 2

# ---- (b) list --state ----
ctl a list --state failed
check "list --state failed shows the failed job" 0 "$W/failjob"
[[ $OUT != *"$W/good"* ]] || fail "list --state failed hides the merged job" "$OUT"
ctl a list --state merged
check "list --state merged shows the merged job" 0 "$W/good"
[[ $OUT != *"$W/failjob"* ]] || fail "list --state merged hides the failed job" "$OUT"
ctl a list --state running
check "list --state running: none" 0 "No jobs on this node in that state"
ctl a list --state sleeping
check "list --state with an unknown state is refused" 2 "" "unknown state"

# ---- (c) forget on this node ----
ctl a drain
check "drain a" 0
ctl a submit "$W/idle"
check "submit idle while drained" 0
run "$ESCTL" --socket "$(dsock a)" forget "$W/idle"
check "forget refuses an active job" 2 "" "cancel it first"
ctl a cancel "$W/idle"
check "cancel idle" 0
run "$ESCTL" --socket "$(dsock a)" forget "$W/idle"
check "forget the cancelled job" 0 "Forgot $W/idle on this node"
ctl a resume
check "resume a" 0
FID=$(py 'j["job_id"]' "$W/failjob/manifest.json")
wait_for "the metrics file shows the failed job" 10 grep -q "\"$FID\"" "$PROM"
run "$ESCTL" --socket "$(dsock a)" forget "$W/failjob"
check "forget the failed job" 0 "Forgot"
not_listed a failjob || fail "list no longer shows the forgotten job"
ok "list no longer shows the forgotten job"
FKEY=$(printf %s "$W/failjob" | sha256sum | cut -c1-16)
[ ! -e "$W/a/state/jobs/$FKEY.json" ] || fail "forget removes the registry file"
ok "forget removes the registry file"
gone_from_metrics() { [ -s "$PROM" ] && ! grep -q "$FID" "$PROM"; }
wait_for "the metrics file no longer mentions the forgotten job $FID" 10 gone_from_metrics
ok "the metrics file no longer mentions the forgotten job"
[ -e "$W/failjob/manifest.json" ] && [ -d "$W/failjob/shards" ] ||
    fail "forget keeps the job directory"
ok "forget keeps the job directory"
run "$ESCTL" --socket "$(dsock a)" forget "$W/failjob"
check "forget of a job this node does not hold exits 2" 2 "" "not a job of this node"

# ---- (d) forget --everywhere ----
daemon_conf b
start_daemon b
wait_for "b adopts the merged job from the spool" 15 listed b good --state merged
run "$ESCTL" --socket "$(dsock a)" forget "$W/good" --everywhere
check "forget --everywhere on a" 0 "on every node"
not_listed a good || fail "a no longer lists the job"
wait_for "b forgets the job too" 15 not_listed b good
ok "b forgets the job forgotten everywhere"
ctl b list --all
check "b's list --all shows the spool's tombstone" 0 "forgotten"
daemon_conf c
start_daemon c
ctl c list
check "a fresh node c starts" 0
# (c's first rescan ran before it answered ping)
not_listed c good || fail "c adopts no forgotten job" "$OUT"
ok "a fresh node adopts no job forgotten everywhere"
[ -e "$W/good/merged.jsonl" ] || fail "forget --everywhere keeps the merged output"
ok "forget --everywhere keeps the merged output"

# ---- (e) retention ----
ctl a submit "$W/old" --everywhere
check "submit old --everywhere" 0
ctl a wait "$W/old"
check "old merges" 0
# merged an hour ago, as far as the files say
for f in "$W/old/merge.json" "$W/old/state/esd/finalize.json"; do
    [ ! -e "$f" ] || touch -d '-1 hour' "$f"
done
KEY=$(basename "$(grep -l "\"$W/old\"" "$W"/spool/*.json)" .json)
daemon_conf d retention_secs=1
start_daemon d
not_listed d old || fail "d adopts no job merged before its retention"
ok "a fresh node adopts no job merged before its retention"
[ ! -e "$W/spool/$KEY.json" ] || fail "d removes the spool entry of the old job"
ok "d removes the spool entry of the old job"
grep -q "not adopting it" "$W/d/log" || fail "d says why it did not adopt the job"
ok "d says why it did not adopt the job"
listed a old || fail "a still holds old (retention 7 days)"
daemon_conf a metrics.path="$PROM" metrics.interval_secs=1 retention_secs=1
kill -HUP "${DPID[a]}"
wait_for "a forgets its ended jobs after the reloaded retention" 15 not_listed a old
ok "a forgets its ended jobs after retention_secs"
grep -q "forgotten: over for more than retention_secs" "$W/a/log" ||
    fail "a logs why it forgot the job"
ok "a logs why it forgot the job"
summary
