#!/usr/bin/env bash
# workers: many `esctl worker --local` processes on one job directory, with
# the test stand-in mini-dj (tests/tools/mini-dj.c, not Data-Juicer) as
# their processor.
#   (a) 8 workers (lease 3 s) finish a 200-shard job: one done record and
#       one attempt per shard, no lock left, every node one of the 8, and
#       the merged output equals an expectation computed independently:
#       Python applies the two operators to the input records, then orders
#       each shard's kept rows as the worker must read mini-dj's export, by
#       the plain string order of the part names (mini-dj's documented
#       rule: contiguous array_split chunks, part i named after the first
#       32 hex digits of sha256("mini-dj task i")), which is not the input
#       order.
#   (b) the same on a fresh job with slow shards; two workers are killed
#       with SIGKILL together with their processors' process groups while
#       each holds a lock (a node that dies loses everything). Their shards
#       are taken over once the lease runs out: the old locks end in
#       state/stale_locks, the old attempts say "stale", every shard still
#       has exactly one done record and the merged output is byte-identical
#       to the clean one. Prints the reclaim time of each killed shard (from
#       the kill to the claim of its next attempt).
#
# Environment: TOP (repository root; default two levels above this script),
# ESCTL (esctl binary; default $TOP/esctl), TOOLS (built test tools;
# default the directory of JSONL_CHECK if make set it, else
# $TOP/build/default/tools).
set -euo pipefail
export LC_ALL=C

# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

NWORKERS=8
NSHARDS=200
LEASE=3
# Each node starts its claim passes at an offset derived from its name
# (w1..w8: 39, 50, 61, 184, 195, 6, 17, 140 of 200); w8's shards lie
# furthest ahead of the next node behind it, so a takeover that waited for
# another node's pass to come by would show there.
VICTIMS=(w3 w8)

new_workdir
unset_knobs
# Workers started here (pid in BG, by node in PID_OF).
declare -A PID_OF=()
job_complete() { [ "$(count "$1/state/done")" -eq "$NSHARDS" ]; }

# start_workers JOB TAG [ENV=VALUE...]: starts the workers w1..w8 on JOB.
start_workers() {
    local job=$1 tag=$2 k
    shift 2
    for k in $(seq 1 "$NWORKERS"); do
        env "$@" "$ESCTL" worker --local --job-dir "$job" --node "w$k" --lease-secs "$LEASE" \
            --poll-interval-secs 1 --processor "$MINI" >"$W/$tag.w$k.log" 2>&1 &
        BG+=("$!")
        PID_OF[w$k]=$!
    done
}
# reap_workers TAG NODE...: waits for the workers to end; each must exit 0.
reap_workers() {
    local tag=$1 n rc pids=()
    shift
    for n in "$@"; do pids+=("${PID_OF[$n]}"); done
    wait_for "the $tag workers exit" 60 all_exited "${pids[@]}"
    for n in "$@"; do
        rc=0
        wait "${PID_OF[$n]}" || rc=$?
        [ "$rc" -eq 0 ] || fail "worker $n of $tag exits 0" "exit status $rc" \
            "$(tail -n 5 "$W/$tag.$n.log")"
    done
    ok "the $tag workers ${*} all exit 0"
}

# check_job JOB DONE_CHECK...: the done records and attempts of JOB, in
# Python. Every shard of the manifest has one done record whose node is one
# of the workers'; the extra arguments are shard=attempt_number pairs for
# shards expected to need more than one attempt (all others: one attempt
# directory, attempt number 1). Prints how many shards each node did.
check_job() {
    python3 - "$@" <<'EOF'
import json, os, sys
job, extra = sys.argv[1], dict(a.split("=") for a in sys.argv[2:])
m = json.load(open(os.path.join(job, "manifest.json")))
ids = [s["id"] for s in m["shards"]]
done = sorted(f[:-5] for f in os.listdir(os.path.join(job, "state/done")))
assert done == sorted(ids), "done records %d, shards %d" % (len(done), len(ids))
nodes = {}
for i in ids:
    d = json.load(open(os.path.join(job, "state/done", i + ".json")))
    assert d["status"] == "done" and d["shard_id"] == i, i
    assert d["node"] in ["w%d" % k for k in range(1, 9)], (i, d["node"])
    want = int(extra.get(i, 1))
    assert d["attempt_number"] == want, (i, d["attempt_number"], want)
    dirs = os.listdir(os.path.join(job, "attempts", i))
    assert len(dirs) == want, (i, dirs)
    assert d["output_path"].startswith("attempts/%s/%04d-" % (i, want)), d["output_path"]
    nodes[d["node"]] = nodes.get(d["node"], 0) + 1
print(" ".join("%s:%d" % kv for kv in sorted(nodes.items())))
EOF
}

{ [ -x "$MINI" ] && [ -x "$ESCTL" ]; } || fail "tools exist" "run make && make tools"

# ---- input and an independent expectation (lib.bash) ----
text_dataset 1000
prepare() { prepare_job "$1" "$NSHARDS"; }

# ---- (a) 8 workers, a clean run ----
JA="$W/job-a"
prepare "$JA"
ok "prepared a $NSHARDS-shard job"
expect_merged "$JA" "$W/expected-merged.jsonl" || fail "the expected merge of job a"
cmp -s "$W/expected-merged.jsonl" "$W/expected.jsonl" &&
    fail "mini-dj's name order differs from the input order within a shard"
cmp -s <(sort "$W/expected-merged.jsonl") <(sort "$W/expected.jsonl") ||
    fail "the expected merge holds the expected rows"
ok "expected merge: the kept rows, each shard's parts in name order (not the input order)"
start_workers "$JA" a
wait_for "the 8 workers complete the job" 50 job_complete "$JA"
reap_workers a w1 w2 w3 w4 w5 w6 w7 w8
ok "every shard of job a has a done record"
split=$(check_job "$JA") || fail "one done record per shard, attempt 1, node among w1..w8"
ok "one done record per shard, each attempt number 1, one attempt dir, node among w1..w8"
echo "# shards per node: $split"
[ "$(wc -w <<<"$split")" -ge 2 ] || fail "the work was shared" "$split"
ok "the work was shared by $(wc -w <<<"$split") nodes"
[ "$(count "$JA/state/locks")" -eq 0 ] || fail "no lock left" "$(ls "$JA/state/locks")"
ok "no lock left"
[ "$(count "$JA/state/stale_locks")" -eq 0 ] || fail "no takeover" "$(ls "$JA/state/stale_locks")"
ok "no lock was taken over"
"$ESCTL" status --local "$JA" >"$W/status.out" 2>&1 || fail "status exits 0" "$(cat "$W/status.out")"
ok "status exits 0"
"$ESCTL" merge --local "$JA" --output "$W/clean.jsonl" >"$W/merge.out" 2>&1 ||
    fail "merge of job a" "$(cat "$W/merge.out")"
ok "merge of job a"
cmp "$W/clean.jsonl" "$W/expected-merged.jsonl" || fail "the merged output equals the expectation"
ok "the merged output equals the independent expectation ($(wc -l <"$W/clean.jsonl") rows)"

# ---- (b) two nodes die while holding a lock ----
JB="$W/job-b"
prepare "$JB"
# 5 rows a shard, 200 ms a row: about a second a shard.
start_workers "$JB" b MINI_DJ_SLEEP_MS=200

# lock_of NODE: the lock file in job b held by NODE (none: fails).
lock_of() {
    local f
    f=$(grep -lE "\"node\": *\"$1\"" "$JB"/state/locks/*.lock 2>/dev/null | head -n 1) || return 1
    [ -n "$f" ] && echo "$f"
}
# holding NODE: NODE holds a lock and runs its processor.
holding() {
    lock_of "$1" >/dev/null && pgrep -P "${PID_OF[$1]}" >/dev/null
}
declare -A KILLED_AT=() SHARD_OF=() ATTEMPT_OF=() GROUP_OF=()
# kill_node NODE: freezes the worker, makes sure it holds a lock and runs
# its processor (else lets it go on and fails, to be retried), then kills
# the worker and the processor's group with SIGKILL.
kill_node() {
    local n=$1 pid=${PID_OF[$1]} lock child
    kill -STOP "$pid"
    if ! lock=$(lock_of "$n") || ! child=$(pgrep -P "$pid" | head -n 1); then
        kill -CONT "$pid"
        return 1
    fi
    kill -KILL "$pid"
    # reaped at once, quietly (bash reports a job killed by a signal)
    { wait "$pid"; } 2>/dev/null || true
    kill -KILL -- "-$child" 2>/dev/null || true
    KILLED_AT[$n]=$(date +%s.%N)
    GROUP_OF[$n]=$child
    SHARD_OF[$n]=$(basename "$lock" .lock)
    ATTEMPT_OF[$n]=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["attempt_dir"])' \
        "$lock")
}
for n in "${VICTIMS[@]}"; do
    wait_for "$n holds a lock and runs its processor" 20 holding "$n"
    wait_for "$n is killed while holding a lock" 20 kill_node "$n"
    wait_for "nothing of $n runs on" 10 group_vanished "${GROUP_OF[$n]}"
    ok "killed $n (and its processor's group) while it held ${SHARD_OF[$n]}"
done
SURVIVORS=()
for k in $(seq 1 "$NWORKERS"); do
    [[ " ${VICTIMS[*]} " == *" w$k "* ]] || SURVIVORS+=("w$k")
done
wait_for "the survivors complete job b" 55 job_complete "$JB"
reap_workers b "${SURVIVORS[@]}"

extra=()
for n in "${VICTIMS[@]}"; do
    s=${SHARD_OF[$n]}
    extra+=("$s=2")
    grep -lE "\"node\": *\"$n\"" "$JB/state/stale_locks/$s".*.lock >/dev/null 2>&1 ||
        fail "the lock of $n on $s is in state/stale_locks" "$(ls "$JB/state/stale_locks")"
    ok "the lock of $n on $s was taken over into state/stale_locks"
    python3 - "$JB" "${ATTEMPT_OF[$n]}" "$n" <<'EOF' || fail "the attempt of $n is stale"
import json, sys
a = json.load(open(sys.argv[1] + "/" + sys.argv[2] + "/attempt.json"))
assert a["status"] == "stale" and a["node"] == sys.argv[3], a
assert a["failure_class"] == "infrastructure", a
EOF
    ok "the attempt of $n on $s says stale (infrastructure)"
done
[ "$(count "$JB/state/stale_locks")" -eq "${#VICTIMS[@]}" ] ||
    fail "only the dead nodes' locks were taken over" "$(ls "$JB/state/stale_locks")"
ok "only the dead nodes' locks were taken over"
[ "$(count "$JB/state/locks")" -eq 0 ] || fail "no lock left in job b" "$(ls "$JB/state/locks")"
ok "no lock left in job b"
split=$(check_job "$JB" "${extra[@]}") ||
    fail "job b: one done record per shard, the killed shards at attempt 2, no other retry"
ok "job b: one done record per shard; the killed shards done by attempt 2, every other by 1"
echo "# shards per node: $split"
"$ESCTL" merge --local "$JB" --output "$W/b.jsonl" >"$W/merge.out" 2>&1 ||
    fail "merge of job b" "$(cat "$W/merge.out")"
cmp "$W/b.jsonl" "$W/clean.jsonl" || fail "job b's merged output is the clean result"
ok "job b's merged output is byte-identical to the clean result"

# Reclaim time: from the kill to the claim of the shard's next attempt. A
# lock goes stale one lease after its last heartbeat (at most lease/4
# before the kill); then any worker looking for work takes it over.
for n in "${VICTIMS[@]}"; do
    s=${SHARD_OF[$n]}
    secs=$(python3 - "$JB" "$s" "${KILLED_AT[$n]}" "$n" <<'EOF'
import glob, json, sys
job, shard, killed, node = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
(path,) = glob.glob("%s/attempts/%s/0002-*/attempt.json" % (job, shard))
a = json.load(open(path))
assert a["node"] != node, a["node"]
print("%.1f" % (a["claimed_at_epoch"] - killed))
EOF
    ) || fail "the next attempt of $s was claimed by another node"
    echo "reclaim: node $n $s $secs s"
    python3 -c 'import sys; sys.exit(not float(sys.argv[1]) < 3 * int(sys.argv[2]) + 5)' \
        "$secs" "$LEASE" || fail "reclaim of $s within 3*lease+5 s" "took $secs s"
    ok "$s was reclaimed $secs s after $n died (lease $LEASE s)"
done

summary
