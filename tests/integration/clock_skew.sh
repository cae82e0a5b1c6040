#!/usr/bin/env bash
# clock_skew: a node whose clock is an hour off neither steals a live claim
# nor keeps a dead one alive, and its own heartbeats keep its claims. The
# skewed `esctl worker --local` runs under faketime (libfaketime) with
# '+1h' or '-1h', each scenario once with libfaketime's default (stat()
# results shifted too) and once with NO_FAKE_STAT=1 (real file times).
# mini-dj (tests/tools/mini-dj.c) is the test stand-in for Data-Juicer.
#   (a) a 2-shard job whose shard 0 is locked by hand by node "other"
#       (lease 30 s, mtime now): a skewed worker with --max-shards 1 takes
#       shard 1 and leaves the lock alone (same inode and bytes, no
#       takeover);
#   (b) a 1-shard job whose lock (lease 30 s) is 2 minutes old: a worker
#       at -1h takes it over and completes the shard;
#   (c) two workers at +1h and -1h, lease 4 s, on 6 shards of ~5 s each:
#       every shard is done by its first attempt and nothing is taken over.
#
# Environment: TOP (repository root; default two levels above this script),
# ESCTL (esctl binary; default $TOP/esctl), TOOLS (built test tools;
# default the directory of JSONL_CHECK if make set it, else
# $TOP/build/default/tools).
set -euo pipefail
export LC_ALL=C

# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"
# libfaketime is preloaded into sanitizer builds too: ASan must not insist
# on coming first.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"

new_workdir
unset_knobs FAKETIME NO_FAKE_STAT

{ [ -x "$MINI" ] && [ -x "$ESCTL" ]; } || fail "tools exist" "run make && make tools"
command -v faketime >/dev/null || fail "faketime is installed" "run scripts/deps --tools"

# VARIANT is "fake-stat" (libfaketime's default) or "no-fake-stat".
VARIANT=
# skewed SKEW CMD...: runs CMD with its clock moved by SKEW.
skewed() {
    local skew=$1
    shift
    if [ "$VARIANT" = no-fake-stat ]; then
        env NO_FAKE_STAT=1 faketime -f "$skew" "$@"
    else
        env -u NO_FAKE_STAT faketime -f "$skew" "$@"
    fi
}
# worker JOB NODE SKEW [OPTION...]: a skewed worker with mini-dj.
worker() {
    local job=$1 node=$2 skew=$3
    shift 3
    skewed "$skew" "$ESCTL" worker --local --job-dir "$job" --node "$node" \
        --processor "$MINI" --poll-interval-secs 1 "$@"
}
# prepare_job JOB SHARDS ROWS: a job of ROWS records in SHARDS shards.
prepare_job() {
    local i
    for i in $(seq 1 "$3"); do
        printf '{"id":%d,"text":"  row  %d  of a\\t skewed   test "}\n' "$i" "$i"
    done >"$W/data.jsonl"
    "$ESCTL" prepare --local --config "$W/recipe.yaml" --dataset-path "$W/data.jsonl" \
        --job-dir "$1" --num-shards "$2" >"$W/prepare.out" 2>&1 ||
        fail "prepare $1" "$(cat "$W/prepare.out")"
}
shard_id() { printf 'part-%05d-of-%05d' "$1" "$2"; }
# hand_lock JOB SHARD_ID AGE_SECS: a lock of node "other" (lease 30 s)
# written by hand, with an attempt directory in status running, its mtime
# AGE_SECS in the past (real time).
hand_lock() {
    local job=$1 id=$2 token=0123456789abcdef0123456789abcdef rel
    rel="attempts/$id/0001-$token"
    mkdir -p "$job/$rel"
    printf '{"shard_id":"%s","token":"%s","hostname":"elsewhere","pid":4242,"claimed_at":"x","attempt_number":1,"attempt_dir":"%s","lease_secs":30,"node":"other","status":"running"}\n' \
        "$id" "$token" "$rel" >"$job/$rel/attempt.json"
    printf '{"shard_id":"%s","token":"%s","hostname":"elsewhere","pid":4242,"attempt_dir":"%s","lease_secs":30,"node":"other"}\n' \
        "$id" "$token" "$rel" >"$job/state/locks/$id.lock"
    touch -d "@$(($(date +%s) - $3))" "$job/state/locks/$id.lock"
}
# skew_seen ATTEMPT_JSON SKEW_SECS: the worker's clock really was skewed
# (its claimed_at_epoch is its own clock's) by about SKEW_SECS.
skew_seen() {
    python3 - "$1" "$2" <<'EOF'
import json, sys, time
a = json.load(open(sys.argv[1]))
off = a["claimed_at_epoch"] - time.time()
sys.exit(not abs(off - float(sys.argv[2])) < 120)
EOF
}

printf 'process:\n  - whitespace_normalization_mapper:\n  - text_length_filter:\n      min_len: 1\n' \
    >"$W/recipe.yaml"

# (a) a skewed worker leaves a fresh lock alone
scenario_a() {
    local skew=$1 secs=$2 job id0 id1 ino before rc=0
    job="$W/a$skew-$VARIANT"
    prepare_job "$job" 2 4
    id0=$(shard_id 0 2)
    id1=$(shard_id 1 2)
    hand_lock "$job" "$id0" 0
    cp -p "$job/state/locks/$id0.lock" "$W/lock.copy"
    ino=$(stat -c %i "$job/state/locks/$id0.lock")
    before=$(stat -c %Y.%y "$job/state/locks/$id0.lock")
    worker "$job" "skew${skew//+/p}" "$skew" --max-shards 1 --lease-secs 30 \
        >"$W/a.out" 2>&1 || rc=$?
    [ "$rc" -eq 0 ] || fail "($VARIANT $skew) the worker exits 0" "$(cat "$W/a.out")"
    { [ -f "$job/state/done/$id1.json" ] && [ ! -e "$job/state/done/$id0.json" ]; } ||
        fail "($VARIANT $skew) the skewed worker did shard 1 only" "$(cat "$W/a.out")"
    ok "($VARIANT $skew) a skewed worker with --max-shards 1 takes shard 1, not the locked shard 0"
    skew_seen "$(ls "$job"/attempts/"$id1"/0001-*/attempt.json)" "$secs" ||
        fail "($VARIANT $skew) the worker's clock was skewed"
    { [ "$(stat -c %i "$job/state/locks/$id0.lock")" = "$ino" ] &&
        cmp -s "$job/state/locks/$id0.lock" "$W/lock.copy" &&
        [ "$(stat -c %Y.%y "$job/state/locks/$id0.lock")" = "$before" ]; } ||
        fail "($VARIANT $skew) the fresh lock is untouched"
    [ "$(count "$job/state/stale_locks")" -eq 0 ] ||
        fail "($VARIANT $skew) nothing in stale_locks" "$(ls "$job/state/stale_locks")"
    [ "$(py 'j["status"]' "$(ls "$job"/attempts/"$id0"/0001-*/attempt.json)")" = running ] ||
        fail "($VARIANT $skew) the other node's attempt is still running"
    ok "($VARIANT $skew) the fresh lock of shard 0 is untouched (same inode, bytes, mtime; no takeover)"
}

# (b) a worker at -1h takes over a lock whose lease ran out long ago
scenario_b() {
    local skew=$1 job id rc=0 stale pid
    job="$W/b$skew-$VARIANT"
    prepare_job "$job" 1 3
    id=$(shard_id 0 1)
    hand_lock "$job" "$id" 120
    worker "$job" skewed "$skew" --lease-secs 30 >"$W/b.out" 2>&1 &
    pid=$!
    BG+=("$pid")
    wait_for "($VARIANT $skew) the worker ends" 30 all_exited "$pid"
    wait "$pid" || rc=$?
    [ "$rc" -eq 0 ] || fail "($VARIANT $skew) the worker completes the job" "exit $rc" \
        "$(cat "$W/b.out")"
    [ "$(py 'j["attempt_number"]' "$job/state/done/$id.json")" = 2 ] ||
        fail "($VARIANT $skew) shard done by attempt 2"
    ok "($VARIANT $skew) a worker takes over a lock 2 minutes past a 30 s lease and completes the shard"
    stale=$(ls "$job/state/stale_locks")
    { [ "$(count "$job/state/stale_locks")" -eq 1 ] && [[ $stale == "$id".*.lock ]] &&
        grep -q '"node":"other"' "$job/state/stale_locks/$stale"; } ||
        fail "($VARIANT $skew) the old lock is in stale_locks" "$stale"
    [ "$(py 'j["status"]' "$(ls "$job"/attempts/"$id"/0001-*/attempt.json)")" = stale ] ||
        fail "($VARIANT $skew) the dead attempt is marked stale"
    ok "($VARIANT $skew) the old lock moved to stale_locks and its attempt says stale"
}

# (c) two skewed workers, heartbeats keep their claims
scenario_c() {
    local job p1 p2 rc
    job="$W/c-$VARIANT"
    prepare_job "$job" 6 30
    # 5 rows a shard, 1 s a row: each attempt outlives its 4 s lease (a
    # lease long enough that a loaded machine still renews it in time).
    MINI_DJ_SLEEP_MS=1000 worker "$job" ahead +1h --lease-secs 4 >"$W/c1.out" 2>&1 &
    p1=$!
    BG+=("$p1")
    MINI_DJ_SLEEP_MS=1000 worker "$job" behind -1h --lease-secs 4 >"$W/c2.out" 2>&1 &
    p2=$!
    BG+=("$p2")
    # a takeover ends the wait at once: it is the failure looked for
    settled() { all_exited "$p1" "$p2" || [ "$(count "$job/state/stale_locks")" -gt 0 ]; }
    wait_for "($VARIANT) the two skewed workers finish" 45 settled
    [ "$(count "$job/state/stale_locks")" -eq 0 ] ||
        fail "($VARIANT) no claim was taken over" "$(ls "$job/state/stale_locks")"
    for p in "$p1" "$p2"; do
        rc=0
        wait "$p" || rc=$?
        [ "$rc" -eq 0 ] || fail "($VARIANT) both skewed workers exit 0" "exit $rc" \
            "$(cat "$W/c1.out" "$W/c2.out")"
    done
    ok "($VARIANT) workers at +1h and -1h complete a 6-shard job, both exit 0"
    python3 - "$job" <<'EOF' || fail "($VARIANT) every shard done by attempt 1"
import json, os, sys
job = sys.argv[1]
ids = [s["id"] for s in json.load(open(job + "/manifest.json"))["shards"]]
nodes = set()
for i in ids:
    d = json.load(open("%s/state/done/%s.json" % (job, i)))
    assert d["attempt_number"] == 1, (i, d["attempt_number"])
    assert len(os.listdir("%s/attempts/%s" % (job, i))) == 1, i
    nodes.add(d["node"])
assert nodes == {"ahead", "behind"}, nodes
EOF
    ok "($VARIANT) every shard is done by its first attempt, by both nodes"
    [ "$(count "$job/state/stale_locks")" -eq 0 ] ||
        fail "($VARIANT) no claim was taken over" "$(ls "$job/state/stale_locks")"
    ok "($VARIANT) nothing in stale_locks: the skewed heartbeats kept both claims"
}

for VARIANT in fake-stat no-fake-stat; do
    scenario_a +1h 3600
    scenario_a -1h -3600
    scenario_b -1h
    scenario_c
done

summary
