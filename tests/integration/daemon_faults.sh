#!/usr/bin/env bash
# daemon_faults: esd daemons (ray.mode off, the test stand-in mini-dj as
# processor, not Data-Juicer) under faults.
#   (a) kill -9 of daemon a while it runs an attempt: the attempt dies with
#       it (no orphan works on under a lease nobody renews), b takes the
#       shard over once the lease (3 s) has run out ("taken over from node
#       a" in its log, the old lock in state/stale_locks, the old attempt
#       marked stale) and the merged output is byte-identical to a clean
#       run (the independent expectation). Prints the reclaim time: from
#       the kill to b's claim of the shard. a restarted resumes the job
#       from its registry.
#   (a2) kill -9 of the only daemon (lease 60 s) mid-shard: restarted, it
#       takes its own claim back at once (its claim record in
#       <state_dir>/claims), so the job completes long before the lease
#       could have run out; a second esd on the same state_dir is refused.
#   (b) SIGTERM drain: a daemon whose attempt cannot finish within
#       drain_timeout_secs (1 s) stops it, releases its claim (no lock
#       left, the attempt marked "released", no failed record) and exits 0;
#       restarted, it resumes: the shard's next attempt succeeds and the
#       retry budget is untouched (max_retries 0 and the job still
#       completes).
#   (c) a hanging attempt (once, MINI_DJ_HANG with MINI_DJ_FAIL_ONCE) is
#       killed after attempt_timeout_secs (2 s), fails as "processor" with
#       "timed out", and the shard is done by attempt 2.
#   (d) a processor that always fails on one shard (MINI_DJ_EXIT=1 with
#       MINI_DJ_ONLY): the shard ends failed after 1 + max_retries (2)
#       attempts, the job is reported failed naming the shard and its last
#       error, and every other shard is done.
#   (e) SIGHUP with a bad configuration keeps the old one (the error names
#       the file and line); with a good one, the new values apply.
#   (f) a node whose processor cannot start: after 3 failed attempts in a
#       row it pauses its claims (1 s, then 2, 4, ... up to 60 s), so the
#       job is not failed in seconds by one broken node.
# Run as root (the jobs are nobody's), every file and directory esd left in
# the job directories must be nobody's.
#
# Environment: TOP, ESCTL, ESD, TOOLS (see lib.bash).
set -euo pipefail
export LC_ALL=C

# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

new_workdir
unset_knobs
need_daemon_tools
text_dataset 480

finalized() { [ -e "$1/state/esd/finalize.json" ]; }
# attempt_running NODE: NODE runs an attempt that has at least SECS to go
# (it started under a second ago).
attempt_running() {
    dstatus "$1"
    [ "$(py 'sum(1 for x in j["attempts"] if x["phase"] == "running" and x["running_secs"] < 1)' \
        "$W/$1/status.json")" -ge 1 ]
}
# new_job NAME SHARDS [prepare options]: a prepared job given to nobody.
new_job() {
    local job=$W/$1
    prepare_job "$job" "${@:2}"
    give_job "$job"
}
check_merged() {
    expect_merged "$1" "$W/expected-merged.jsonl" || fail "the expected merge of $1"
    cmp "$1/merged.jsonl" "$W/expected-merged.jsonl" || fail "the merged output of $1 equals the expectation"
}
reset_daemons() {
    local n
    for n in "$@"; do
        rm -rf "${W:?}/$n"
    done
}

# ---- (a) kill -9 mid-shard ----
# 40 rows a shard, 60 ms a row: over two seconds a shard.
new_job job-a 12
daemon_conf a
daemon_conf b
start_daemon a MINI_DJ_SLEEP_MS=60
start_daemon b MINI_DJ_SLEEP_MS=60
spool_job "$W/job-a"
wait_for "a runs an attempt" 30 attempt_running a
SHARD=$(py 'j["attempts"][0]["shard_id"]' "$W/a/status.json")
CHILD=$(py 'j["attempts"][0]["pid"]' "$W/a/status.json")
kill -KILL "${DPID[a]}"
KILLED_AT=$(date +%s.%N)
{ wait "${DPID[a]}"; } 2>/dev/null || true
wait_for "a's attempt dies with a" 10 dead "$CHILD"
ok "killed a (SIGKILL) while it ran $SHARD; its attempt (pid $CHILD) died with it"
wait_for "b takes $SHARD over" 30 grep -q "$SHARD#2\] claimed (attempt 2), taken over from node a" "$W/b/log"
CLAIMED_AT=$(grep "$SHARD#2\] claimed (attempt 2), taken over" "$W/b/log" | cut -d' ' -f1)
python3 - "$KILLED_AT" "$CLAIMED_AT" <<'EOF'
import datetime, sys
killed = float(sys.argv[1])
claimed = datetime.datetime.fromisoformat(sys.argv[2]).timestamp()
print("reclaim: %.1f s from the kill of a to b's claim (lease 3 s)" % (claimed - killed))
EOF
ok "b took $SHARD over from a after the lease"
wait_for "job a is merged" 60 finalized "$W/job-a"
python3 - "$W/job-a" "$SHARD" <<'EOF' || fail "the takeover left its marks"
import glob, json, sys
job, shard = sys.argv[1:]
assert glob.glob("%s/state/stale_locks/%s.*.lock" % (job, shard)), "no stale lock"
old = json.load(open(glob.glob("%s/attempts/%s/0001-*/attempt.json" % (job, shard))[0]))
assert old["status"] == "stale", old
d = json.load(open("%s/state/done/%s.json" % (job, shard)))
assert d["attempt_number"] == 2 and d["node"] == "b", d
EOF
ok "the old lock is in state/stale_locks, the old attempt stale, attempt 2 by b done"
check_merged "$W/job-a"
ok "the merged output is byte-identical to a clean run"
start_daemon a
# (it loads the job in a helper first: one poll at most)
a_knows_complete() { [ "$(job_field a "$W/job-a" 'x["state"]')" = complete ]; }
wait_for "a, restarted, knows job a complete" 10 a_knows_complete
ok "a, restarted, resumed from its registry: job a complete"
stop_daemon a
stop_daemon b
reset_daemons a b

# ---- (a2) the only node restarts after a crash ----
new_job job-r 6
daemon_conf s lease_secs=60
start_daemon s MINI_DJ_SLEEP_MS=60
spool_job "$W/job-r"
wait_for "s runs an attempt" 30 attempt_running s
SHARD=$(py 'j["attempts"][0]["shard_id"]' "$W/s/status.json")
[ "$(count "$W/s/state/claims")" -eq 1 ] || fail "s records its claim" "$(ls "$W/s/state/claims")"
kill -KILL "${DPID[s]}"
{ wait "${DPID[s]}"; } 2>/dev/null || true
RESTART=$(date +%s)
start_daemon s MINI_DJ_SLEEP_MS=5
daemon_conf s2 lease_secs=60 state_dir="$W/s/state"
run timeout 20 "$ESD" -f -c "$W/s2/esd.yaml"
check "a second esd on the same state_dir is refused" 1 "" "another esd with pid ${DPID[s]}"
wait_for "s takes its claim back" 10 grep -q "$SHARD\] this node's claim from its previous run was taken back at once" "$W/s/log"
wait_for "job r is merged" 20 finalized "$W/job-r"
echo "# job r complete $(($(date +%s) - RESTART)) s after the restart (lease 60 s)"
[ "$(py 'j["attempt_number"]' "$W/job-r/state/done/$SHARD.json")" -eq 2 ] || fail "$SHARD done by attempt 2"
[ "$(count "$W/s/state/claims")" -eq 0 ] || fail "no claim record left" "$(ls "$W/s/state/claims")"
check_merged "$W/job-r"
ok "restarted after kill -9, s took $SHARD back at once (no 60 s lease wait) and finished the job"
stop_daemon s
reset_daemons s s2

# ---- (b) SIGTERM drain ----
new_job job-b 6 --max-retries 0
daemon_conf a drain_timeout_secs=1
start_daemon a MINI_DJ_SLEEP_MS=100
spool_job "$W/job-b"
wait_for "a runs an attempt" 30 attempt_running a
SHARD=$(py 'j["attempts"][0]["shard_id"]' "$W/a/status.json")
stop_daemon a
[ "$DRC" -eq 0 ] || fail "a exits 0 after the drain" "status $DRC" "$(tail -n 5 "$W/a/log")"
grep -q "drain timeout: stopping 1 attempt" "$W/a/log" || fail "a logged the drain timeout"
ok "SIGTERM: a drained for 1 s, stopped its attempt on $SHARD and exited 0"
[ "$(count "$W/job-b/state/locks")" -eq 0 ] || fail "no lock left" "$(ls "$W/job-b/state/locks")"
[ "$(count "$W/job-b/state/failed")" -eq 0 ] || fail "no failed record"
py 'j["status"]' "$W"/job-b/attempts/"$SHARD"/0001-*/attempt.json | grep -qx released ||
    fail "the stopped attempt is marked released"
ok "its claim was released: no lock, attempt 1 'released', no failed record"
start_daemon a MINI_DJ_SLEEP_MS=5
wait_for "job b is merged after the restart" 60 finalized "$W/job-b"
[ "$(py 'j["attempt_number"]' "$W/job-b/state/done/$SHARD.json")" -eq 2 ] ||
    fail "$SHARD done by attempt 2"
check_merged "$W/job-b"
ok "restarted, a resumed: $SHARD done by attempt 2 despite max_retries 0, job merged"
stop_daemon a
reset_daemons a

# ---- (c) a hanging attempt ----
new_job job-c 6
daemon_conf a attempt_timeout_secs=2
start_daemon a MINI_DJ_HANG=1 MINI_DJ_ONLY=part-00003 MINI_DJ_FAIL_ONCE="$W/once"
mkdir -p "$W/once"
give_job "$W/once"
spool_job "$W/job-c"
wait_for "job c is merged" 60 finalized "$W/job-c"
python3 - "$W/job-c" <<'EOF' || fail "the hanging attempt timed out and was retried"
import glob, json
job = __import__("sys").argv[1]
a = json.load(open(glob.glob(job + "/attempts/part-00003-of-00006/0001-*/attempt.json")[0]))
assert a["status"] == "failed" and a["failure_class"] == "processor", a
assert "timed out after 2 s" in a["error"], a
d = json.load(open(job + "/state/done/part-00003-of-00006.json"))
assert d["attempt_number"] == 2, d
EOF
check_merged "$W/job-c"
ok "the hanging attempt was killed after 2 s (processor, timed out); attempt 2 did the shard"
stop_daemon a
reset_daemons a

# ---- (d) a processor that always fails ----
new_job job-d 6 --max-retries 1
daemon_conf a
daemon_conf b
start_daemon a MINI_DJ_EXIT=1 MINI_DJ_ONLY=part-00002
start_daemon b MINI_DJ_EXIT=1 MINI_DJ_ONLY=part-00002
spool_job "$W/job-d"
failed_on() { [ "$(job_field "$1" "$W/job-d" 'x["state"]')" = failed ]; }
wait_for "a reports job d failed" 60 failed_on a
wait_for "b reports job d failed" 30 failed_on b
ERROR=$(job_field a "$W/job-d" 'x["error"]')
[[ $ERROR == *part-00002-of-00006* && $ERROR == *"exit code 1"* ]] ||
    fail "the job's error names the shard and its last error" "$ERROR"
ok "job d reported failed on both nodes: $ERROR"
python3 - "$W/job-d" <<'EOF' || fail "one shard failed after 2 or 3 attempts, the others done"
import glob, json, os
job = __import__("sys").argv[1]
assert sorted(os.listdir(job + "/state/failed")) == ["part-00002-of-00006.json"]
f = json.load(open(job + "/state/failed/part-00002-of-00006.json"))
# two attempts, or three when one node made the first two: its failures
# alone never fail a shard while the other node is alive (esd(8), a bad
# node), so the other node makes the last
assert f["last_attempt"] in (2, 3) and f["failures"] == f["last_attempt"], f
assert len(os.listdir(job + "/attempts/part-00002-of-00006")) == f["last_attempt"]
nodes = [json.load(open(os.path.join(d, "attempt.json")))["node"]
         for d in glob.glob(job + "/attempts/part-00002-of-00006/*")]
assert set(nodes) == {"a", "b"}, nodes
assert len(os.listdir(job + "/state/done")) == 5
EOF
[ ! -e "$W/job-d/state/esd/finalize.json" ] || fail "a failed job is not merged"
ok "the failing shard ended failed after 2 or 3 attempts, by both nodes; the 5 others are done; nothing merged"
stop_daemon b
reset_daemons b

# ---- (e) SIGHUP ----
slots() { dstatus a && py 'j["slots"]' "$W/a/status.json"; }
printf 'slots: 3\nno_such_key: 1\n' >"$W/a/esd.yaml.bad"
cp "$W/a/esd.yaml" "$W/a/esd.yaml.good"
cp "$W/a/esd.yaml.bad" "$W/a/esd.yaml"
kill -HUP "${DPID[a]}"
wait_for "a rejects the bad configuration" 10 grep -q "reload: .*esd.yaml:2.*keeping the current" "$W/a/log"
[ "$(slots)" -eq 1 ] || fail "a keeps 1 slot"
ok "SIGHUP with a bad file: $(grep -o 'reload: .*' "$W/a/log" | head -n 1)"
sed 's/^slots: .*/slots: 2/' "$W/a/esd.yaml.good" >"$W/a/esd.yaml"
kill -HUP "${DPID[a]}"
wait_for "a reloads" 10 grep -q "reloaded $W/a/esd.yaml" "$W/a/log"
[ "$(slots)" -eq 2 ] || fail "a has 2 slots after the reload"
ok "SIGHUP with a good file: 2 slots"
stop_daemon a
[ "$DRC" -eq 0 ] || fail "a exits 0"

# ---- (f) a node where nothing can start ----
new_job job-f 6
daemon_conf n processor="$W/no-such-processor"
start_daemon n
spool_job "$W/job-f"
paused() { dstatus n && py '"paused_secs" in j["jobs"][0]' "$W/n/status.json" | grep -qx True; }
wait_for "n pauses its claims after 3 failures in a row" 20 paused
grep -q "3 attempts of job $W/job-f in a row failed on this node: no claims of it for 1 s" "$W/n/log" ||
    fail "n says why it pauses" "$(grep -v debug "$W/n/log" | tail -n 5)"
wait_for "n pauses again, longer" 20 grep -q "in a row failed on this node: no claims of it for 4 s" "$W/n/log"
[ "$(job_field n "$W/job-f" 'x["state"]')" = active ] || fail "job f is not failed yet"
n=$(find "$W/job-f/attempts" -name attempt.json | wc -l)
[ "$n" -le 8 ] || fail "n made few attempts while paused" "$n attempts"
ok "a node whose processor cannot start backs off the job (1, 2, 4 s...) after 3 failures in a row: $n attempts, the job still active"
stop_daemon n

if [ "$(id -u)" -eq 0 ]; then
    foreign=$(not_owned_by nobody "$W"/job-?)
    [ -z "$foreign" ] || fail "everything in the job directories is nobody's" "$foreign"
    ok "after takeovers, releases, timeouts and failures, every file is the job owner's"
fi
summary
