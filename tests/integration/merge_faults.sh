#!/usr/bin/env bash
# merge_faults: storage failures are infrastructure, and the merge is fenced
# like a shard's publication (issue 12, items 9 and 10), with real daemons
# and the stand-in processor on a small tmpfs:
#   (a) the disk is full when a shard's result is materialised (the
#       processor's export fits, esd's processed.jsonl does not): the
#       attempt fails as infrastructure, no retry of the shard is used up,
#       and the job completes once there is room again;
#   (b) the disk is full during the merge: the job is never failed; it
#       stays active with the error, no finalize.json is written, status in
#       text and in JSON agree; `esctl merge` holds the election again at
#       once; once there is room the job completes with the right rows;
#   (c) a merging node frozen (SIGSTOP) past its lease while its merge
#       waits: another node is elected and merges; woken, the first one
#       never publishes (the merged output is the other node's, untouched).
# Needs root for the mount (a private mount namespace); skips otherwise.
set -euo pipefail
# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

in_mount_ns merge_faults "$@"

new_workdir
unset_knobs
need_daemon_tools
FS=$W/fs
mkdir -p "$FS"
mount -t tmpfs -o size=48m,mode=755 tmpfs "$FS"
trap 'umount -l "$FS" 2>/dev/null || true; cleanup' EXIT

# avail: bytes free on the tmpfs. fill BYTES: a filler leaving BYTES free.
avail() { df --output=avail -B1 "$FS" | tail -n 1 | tr -d ' '; }
fill() {
    rm -f "$FS/filler"
    local n
    n=$(($(avail) - $1))
    [ "$n" -le 0 ] || fallocate -l "$n" "$FS/filler"
}
unfill() { rm -f "$FS/filler"; }
jfield() { job_field "$@"; }
ctl() { "$ESCTL" --socket "$(dsock "$1")" "${@:2}"; }

# a dataset of about 2 MiB: each of 2 shards holds about 1 MiB of results
python3 - "$W/big.jsonl" <<'EOF'
import sys
with open(sys.argv[1], "w") as f:
    for i in range(4000):
        f.write('{"id": %d, "text": "%s"}\n' % (i, "w" * 500))
EOF
printf 'process:\n  - whitespace_normalization_mapper:\n' >"$W/recipe.yaml"
prep() {
    "$ESCTL" prepare --local --config "$W/recipe.yaml" --dataset-path "$W/big.jsonl" \
        --job-dir "$1" --num-shards 2 >"$W/prepare.out" 2>&1 || fail "prepare $1" "$(cat "$W/prepare.out")"
    give_job "$1"
}
shard_bytes() { py 'j["shards"][0]["size_bytes"]' "$1/manifest.json"; }
ndone() { count "$1/state/done"; }

daemon_conf n1 lease_secs=3 poll_interval_secs=1
# (2 s a shard: time to hold the node between the two shards of job b)
start_daemon n1 MINI_DJ_SLEEP_MS=1

# ---- (a) a full disk while esd materialises a result ----
JA=$FS/job-a
prep "$JA"
R=$(shard_bytes "$JA")
ctl n1 drain >/dev/null
ctl n1 submit "$JA" >/dev/null
# room for the processor's export of a shard, not for esd's copy of it too
fill $((R * 3 / 2))
ctl n1 resume >/dev/null
infra_attempt() {
    grep -l '"failure_class": "infrastructure"' "$JA"/attempts/*/*/attempt.json >/dev/null 2>&1
}
wait_for "an attempt fails as infrastructure on the full disk" 30 infra_attempt
f=$(grep -l '"failure_class": "infrastructure"' "$JA"/attempts/*/*/attempt.json | head -n 1)
grep -q 'No space left on device' "$f" || fail "the attempt says the disk is full" "$(cat "$f")"
! grep -l '"failure_class": "output"' "$JA"/attempts/*/*/attempt.json >/dev/null 2>&1 ||
    fail "no attempt failed as output"
ok "a result that cannot be materialised for want of space fails as infrastructure, not output"
ctl n1 drain >/dev/null
idle() { dstatus n1 && [ "$(py 'j["busy"]' "$W/n1/status.json")" -eq 0 ]; }
wait_for "n1 is idle" 30 idle
unfill
ctl n1 resume >/dev/null
merged() { [ "$(py 'j["status"]' "$1/state/esd/finalize.json" 2>/dev/null)" = complete ]; }
wait_for "job a completes once there is room" 60 merged "$JA"
ok "job a completes once there is room again"

# ---- (b) a full disk during the merge ----
JB=$FS/job-b
prep "$JB"
ctl n1 submit "$JB" >/dev/null
# the first shard done, the node held: the second finishes, no merge starts
first_done() { [ "$(ndone "$JB")" -ge 1 ]; }
wait_for "job b's first shard is done" 30 first_done
ctl n1 drain >/dev/null
wait_for "n1 is idle" 30 idle
[ "$(ndone "$JB")" -eq 2 ] || fail "both shards of job b are done" "$(ndone "$JB")"
fill 65536
ctl n1 resume >/dev/null
merge_failed() {
    [ "$(jfield n1 "$JB" 'x.get("error") or ""' | grep -c 'the merge failed on node n1')" -ge 1 ]
}
wait_for "the merge fails on the full disk" 30 merge_failed
[ "$(jfield n1 "$JB" 'x["state"]')" = active ] || fail "job b stays active" "$(jfield n1 "$JB" 'x["state"]')"
[ ! -e "$JB/state/esd/finalize.json" ] || fail "no finalize.json after a transient failure" "$(cat "$JB/state/esd/finalize.json")"
err=$(jfield n1 "$JB" 'x["error"]')
[[ $err == *"No space left on device"* && $err == *"held again in"* ]] || fail "the error says why and when" "$err"
ok "a merge on a full disk: the job stays active, nothing recorded, the error says it is held again"
run "$ESCTL" --socket "$(dsock n1)" status "$JB"
check "status of job b" 0
[[ $OUT != *"the merge failed"* ]] || fail "no merge record in status (text)" "$OUT"
run "$ESCTL" --socket "$(dsock n1)" --json status "$JB"
[ "$(py '"merge" in j' "$W/stdout")" = False ] || fail "no merge record in status (JSON)" "$OUT"
ok "status in text and in JSON agree: no merge recorded"
unfill
run "$ESCTL" --socket "$(dsock n1)" merge "$JB"
check "esctl merge holds the election again at once" 0 "held again now"
wait_for "job b completes once there is room" 20 merged "$JB"
[ "$(wc -l <"$JB/merged.jsonl")" -eq 4000 ] || fail "job b's merged output has every row" "$(wc -l <"$JB/merged.jsonl")"
run "$ESCTL" --socket "$(dsock n1)" status "$JB"
check "status of job b merged" 0 "merged by node n1: 4000 rows"
run "$ESCTL" --socket "$(dsock n1)" --json status "$JB"
[ "$(py 'j["merge"]["status"], j["merge"]["rows"]' "$W/stdout")" = "('complete', 4000)" ] ||
    fail "status --json says the same" "$OUT"
ok "once there is room, esctl merge merges it at once: 4000 rows, text and JSON agree"
stop_daemon n1

# ---- (c) a merging node frozen past its lease ----
JC=$W/job-c
prep "$JC"
daemon_conf a lease_secs=3 poll_interval_secs=1
daemon_conf b lease_secs=3 poll_interval_secs=1
start_daemon a ESD_TEST_MERGE_DELAY_SECS=20
ctl a submit "$JC" >/dev/null
wait_for "a is elected to merge job c" 30 test -e "$JC/state/esd/finalize.lock"
grep -q '"node": "a"' "$JC/state/esd/finalize.lock" || fail "a holds the election" "$(cat "$JC/state/esd/finalize.lock")"
merger=$(pgrep -P "${DPID[a]}" | head -n 1)
[ -n "$merger" ] || fail "a's merging child runs"
kill -STOP "${DPID[a]}"
start_daemon b
ctl b submit "$JC" >/dev/null
merged_by_b() { [ "$(py 'j["node"]' "$JC/state/esd/finalize.json" 2>/dev/null)" = b ]; }
wait_for "b takes the election over and merges" 40 merged_by_b
before=$(stat -c '%i %Y.%y' "$JC/merged.jsonl" "$JC/merge.json" "$JC/state/esd/finalize.json")
# a's child merges on, its node still frozen, and comes to publish: the
# fence (the election lock, its token) is not its own any more
gone() { ! alive "$merger"; }
wait_for "a's merging child ends while a is frozen" 40 gone
kill -CONT "${DPID[a]}"
wait_for "a says that it lost its election" 40 grep -q "lost the finalize election" "$W/a/log"
# (woken, a may see its lease gone before it reads its child's record,
# which says why the child did not publish)
wait_for "the child's fence refused the publication" 20 \
    grep -q "no longer holds the finalize election" "$W/a/log"
a_complete() { [ "$(job_state a "$JC")" = complete ]; }
wait_for "a reports job c complete" 20 a_complete
[ "$(stat -c '%i %Y.%y' "$JC/merged.jsonl" "$JC/merge.json" "$JC/state/esd/finalize.json")" = "$before" ] ||
    fail "a published nothing after it woke" "$before"
ok "a frozen finalizer, woken after another node merged, never publishes: output, merge.json and finalize.json are b's"
stop_daemon a
stop_daemon b
summary
