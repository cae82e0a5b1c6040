#!/usr/bin/env bash
# attempts: how `esctl worker --local` ends an attempt, driven through the
# failure knobs of the test stand-in mini-dj (tests/tools/mini-dj.c, not
# Data-Juicer), each case on a small fresh job: invalid output of every
# kind (failure class output, the error names the part file and line),
# no export, an exit code until the retry limit fails the shard, a crash, a
# timeout that kills the whole process group (even a helper that ignores
# SIGTERM), a lease lost to a takeover, a worker stopped with SIGTERM (the
# claim is released, nothing counted), a processor that cannot be started
# (infrastructure, its own limit), a processor that fails once, `esctl
# retry`, and the invocation contract of spec §8.4 (argv, cwd, environment,
# process.log).
#
# Environment: TOP (repository root; default two levels above this script),
# ESCTL (esctl binary; default $TOP/esctl), TOOLS (built test tools;
# default the directory of JSONL_CHECK if make set it, else
# $TOP/build/default/tools).
set -euo pipefail
export LC_ALL=C

# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"
new_workdir
unset_knobs XDG_CACHE_HOME HF_HOME PYTHONPATH

# attempts_of JOB ID: the attempt.json files of a shard, in attempt order.
attempts_of() { find "$1/attempts/$2" -mindepth 2 -maxdepth 2 -name attempt.json | sort; }
# attempt_of JOB ID N: the attempt.json of attempt N.
attempt_of() {
    local f
    f=$(find "$1/attempts/$2" -mindepth 2 -maxdepth 2 -path "*/$(printf %04d "$3")-*/attempt.json")
    # (in a command substitution: the report goes to stderr)
    [ -n "$f" ] || fail "attempt $3 of $2 exists" "$(find "$1/attempts" 2>&1 | head -20)" >&2
    echo "$f"
}
# field FILE KEY: a top-level field of a JSON file.
field() { py "j.get('$2')" "$1"; }

{ [ -x "$MINI" ] && [ -x "$ESCTL" ]; } || fail "tools exist" "run make && make tools"

printf 'process:\n  - whitespace_normalization_mapper:\n  - text_length_filter:\n      min_len: 1\n' \
    >"$W/recipe.yaml"
for i in $(seq 0 11); do
    printf '{"id":%d,"text":"  attempt   record\\t%d  "}\n' "$i" "$i"
done >"$W/data.jsonl"
# newjob NAME SHARDS [PREPARE OPTION...]: a fresh job of the 12 records in
# $W/NAME; JOB is its directory, ID0 its first shard.
newjob() {
    JOB="$W/$1"
    local n=$2
    shift 2
    "$ESCTL" prepare --local --config "$W/recipe.yaml" --dataset-path "$W/data.jsonl" \
        --job-dir "$JOB" --num-shards "$n" "$@" >"$W/prepare.out" 2>&1 ||
        fail "prepare $JOB" "$(cat "$W/prepare.out")"
    ID0=$(printf 'part-00000-of-%05d' "$n")
}
# start ENV=VALUE... -- WORKER OPTION...: starts a worker on JOB with
# mini-dj in the background (PID); its output goes to $W/worker.out.
start() {
    local envs=()
    while [ "$1" != -- ]; do
        envs+=("$1")
        shift
    done
    shift
    env "${envs[@]}" "$ESCTL" worker --local --job-dir "$JOB" --node n1 --processor "$MINI" \
        --poll-interval-secs 1 "$@" >"$W/worker.out" 2>&1 &
    PID=$!
    BG+=("$PID")
}
# finish SECS: waits for the worker PID to end; its exit status in RC.
finish() {
    wait_for "the worker ends" "$1" dead "$PID"
    RC=0
    wait "$PID" || RC=$?
    OUT=$(cat "$W/worker.out")
}
# work ENV=VALUE... -- WORKER OPTION...: start, then finish within 30 s.
work() {
    start "$@"
    finish 30
}
# processor_of PID: the worker's running processor (its process group).
processor_of() { pgrep -P "$1" | head -n 1; }
running() { [ -n "$(processor_of "$PID")" ]; }
# expect_attempt FILE STATUS CLASS TEXT: an attempt.json's outcome.
expect_attempt() {
    local what=$1 f=$2 status=$3 class=$4 text=$5 got
    got=$(py '"%s|%s|%s" % (j.get("status"), j.get("failure_class"), j.get("error"))' "$f")
    [[ $got == "$status|$class|"*"$text"* ]] ||
        fail "$what" "attempt.json: $got" "expected: $status|$class|*$text*" "worker: $OUT"
}

# ---- invalid output: class output, the error names file and line ----
# mini-dj writes the 12 rows as 12 parts <dataset-id>_<task-id>_000000.json
# and puts the bad line into the first one in string order, as its line 2:
# part 5, whose task id is the first 32 hex digits of sha256("mini-dj task 5")
# (see its header).
TASK5=$(printf 'mini-dj task 5' | sha256sum | cut -c1-32)
for mode in invalid blank notobject badutf8; do
    newjob "bad-$mode" 1
    work MINI_DJ_BAD="$mode" -- --max-shards 1
    [ "$RC" -eq 2 ] || fail "MINI_DJ_BAD=$mode: the worker exits 2" "exit $RC" "$OUT"
    f=$(attempt_of "$JOB" "$ID0" 1)
    part=$(find "$(dirname "$f")/ray-output.jsonl" -mindepth 1 -maxdepth 1 -printf '%P\n' | sort |
        head -n 1)
    [[ $part =~ ^[0-9A-Za-z]{22}_${TASK5}_000000\.json$ ]] ||
        fail "MINI_DJ_BAD=$mode: part 5 comes first in string order" "$part"
    expect_attempt "MINI_DJ_BAD=$mode" "$f" failed output "/ray-output.jsonl/$part:2"
    [ ! -e "$(dirname "$f")/processed.jsonl" ] ||
        fail "MINI_DJ_BAD=$mode leaves no processed.jsonl"
    { [ ! -e "$JOB/state/done/$ID0.json" ] && [ "$(count "$JOB/state/locks")" -eq 0 ]; } ||
        fail "MINI_DJ_BAD=$mode: no done record, no lock"
    ok "MINI_DJ_BAD=$mode: attempt failed (output), error names <dataset-id>_<task 5>_000000.json:2, no processed.jsonl, lock released"
done

# ---- no export ----
newjob no-export 1
work MINI_DJ_NO_EXPORT=1 -- --max-shards 1
f=$(attempt_of "$JOB" "$ID0" 1)
expect_attempt "MINI_DJ_NO_EXPORT" "$f" failed output "did not create"
{ [ "$RC" -eq 2 ] && [ ! -e "$(dirname "$f")/processed.jsonl" ]; } ||
    fail "MINI_DJ_NO_EXPORT: exit 2, no processed.jsonl" "exit $RC"
ok "MINI_DJ_NO_EXPORT: attempt failed (output): \"$(field "$f" error)\""

# ---- an exit code, until the retry limit fails the shard ----
newjob exit3 1 --max-retries 1
work MINI_DJ_EXIT=3 --
[ "$RC" -eq 2 ] || fail "MINI_DJ_EXIT=3: the worker exits 2" "exit $RC" "$OUT"
[ "$(attempts_of "$JOB" "$ID0" | wc -l)" -eq 2 ] ||
    fail "MINI_DJ_EXIT=3: two attempts" "$(attempts_of "$JOB" "$ID0")"
for n in 1 2; do
    expect_attempt "MINI_DJ_EXIT=3 attempt $n" "$(attempt_of "$JOB" "$ID0" "$n")" failed processor \
        "Data-Juicer returned exit code 3"
done
FAILED="$JOB/state/failed/$ID0.json"
[ -f "$FAILED" ] || fail "MINI_DJ_EXIT=3: a failed record" "$OUT"
got=$(py '"%s|%s|%s|%s" % (j["failures"], j["last_error"], j["failure_class"], j["last_attempt"])' \
    "$FAILED")
[ "$got" = "2|Data-Juicer returned exit code 3|processor|2" ] ||
    fail "MINI_DJ_EXIT=3: failed record" "$got"
[ "$(count "$JOB/state/locks")" -eq 0 ] || fail "MINI_DJ_EXIT=3: no lock left"
ok "MINI_DJ_EXIT=3, --max-retries 1: two failed attempts (processor), failed record with failures 2, worker exits 2"
run_status() {
    RC=0
    "$ESCTL" status --local "$JOB" >"$W/status.out" 2>&1 || RC=$?
}
run_status
[ "$RC" -eq 2 ] || fail "status of a failed job exits 2" "exit $RC"
ok "status of the failed job exits 2"

# ---- retry: requeued, then done by a fresh attempt 1 ----
"$ESCTL" retry --local "$JOB" --all-failed >"$W/retry.out" 2>&1 ||
    fail "esctl retry --all-failed" "$(cat "$W/retry.out")"
{ [ ! -e "$FAILED" ] && [ ! -e "$JOB/attempts/$ID0" ]; } ||
    fail "retry moves the failed record and attempts away"
work --
[ "$RC" -eq 0 ] || fail "a worker after retry exits 0" "exit $RC" "$OUT"
[ "$(py 'j["attempt_number"]' "$JOB/state/done/$ID0.json")" = 1 ] ||
    fail "after retry the shard is done by attempt number 1"
ok "retry --all-failed requeues the shard; a normal worker completes it with attempt number 1"

# ---- a crash ----
newjob crash 1
work MINI_DJ_CRASH=1 -- --max-shards 1
f=$(attempt_of "$JOB" "$ID0" 1)
expect_attempt "MINI_DJ_CRASH" "$f" failed processor "killed by signal 6"
{ [ "$(field "$f" return_code)" = -6 ] && [ ! -e "$(dirname "$f")/processed.jsonl" ]; } ||
    fail "MINI_DJ_CRASH: return_code -6, no processed.jsonl"
ok "MINI_DJ_CRASH: attempt failed (processor): \"$(field "$f" error)\""

# ---- a timeout kills the whole process group ----
newjob timeout 1
t0=$(date +%s)
work MINI_DJ_HANG=1 MINI_DJ_SPAWN_CHILD=1 -- --max-shards 1 --attempt-timeout-secs 2
f=$(attempt_of "$JOB" "$ID0" 1)
expect_attempt "MINI_DJ_HANG with --attempt-timeout-secs 2" "$f" failed processor "timed out"
[ $(($(date +%s) - t0)) -lt 15 ] || fail "the timeout acts within seconds"
child=$(sed -n 's/^mini-dj: spawned child pid \([0-9]*\).*/\1/p' "$(dirname "$f")/process.log")
[ -n "$child" ] || fail "process.log names mini-dj's spawned child" "$(cat "$(dirname "$f")/process.log")"
STRAYS+=("$child")
wait_for "the spawned child is gone" 5 dead "$child"
ok "MINI_DJ_HANG, --attempt-timeout-secs 2: failed (processor) \"$(field "$f" error)\"; spawned child $child killed with the group"

# A helper of the processor that ignores SIGTERM and keeps the output pipe
# open (as a slow-to-stop Ray worker could) must not keep the worker
# waiting: the group gets SIGKILL once the processor is gone.
cat >"$W/stubborn-dj" <<EOF
#!/bin/sh
(trap '' TERM; exec sleep 120) &
echo "stubborn helper pid \$!"
exec "$MINI" "\$@"
EOF
chmod +x "$W/stubborn-dj"
newjob stubborn 1
env MINI_DJ_HANG=1 "$ESCTL" worker --local --job-dir "$JOB" --node n1 --processor "$W/stubborn-dj" \
    --max-shards 1 --attempt-timeout-secs 2 >"$W/worker.out" 2>&1 &
PID=$!
BG+=("$PID")
wait_for "the stubborn processor runs" 10 running
f=$(attempt_of "$JOB" "$ID0" 1)
wait_for "the stubborn helper has started" 10 grep -q "stubborn helper pid" "$(dirname "$f")/process.log"
helper=$(sed -n 's/^stubborn helper pid \([0-9]*\)$/\1/p' "$(dirname "$f")/process.log")
STRAYS+=("$helper")
finish 20
expect_attempt "a helper ignoring SIGTERM" "$f" failed processor "timed out"
wait_for "the helper that ignores SIGTERM is gone" 5 dead "$helper"
ok "a timed-out processor's helper that ignores SIGTERM is killed too; the worker ends"

# ---- lease lost: the lock is taken over under a running attempt ----
newjob lease-lost 1
start MINI_DJ_HANG=1 -- --max-shards 1 --lease-secs 2
wait_for "the hanging attempt runs" 10 running
group=$(processor_of "$PID")
STRAYS+=("$group")
f=$(attempt_of "$JOB" "$ID0" 1)
mv "$JOB/state/locks/$ID0.lock" "$JOB/state/stale_locks/$ID0.$(date +%s).byhand.lock"
lost_or_stale() { [[ $(field "$f" status) == @(lost|stale) ]]; }
wait_for "the attempt ends lost or stale within a few seconds" 5 lost_or_stale
finish 10
expect_attempt "lease lost" "$f" "$(field "$f" status)" infrastructure "lease of $ID0 lost"
wait_for "the processor's group is killed" 5 group_gone "$group"
{ [ ! -e "$JOB/state/done/$ID0.json" ] && [ ! -e "$(dirname "$f")/processed.jsonl" ]; } ||
    fail "no done record after a lost lease"
ok "lease lost (lock moved to stale_locks): attempt $(field "$f" status) (infrastructure), group killed, nothing published (worker exit $RC)"

# ---- lease lost: the lock is replaced by another node's claim ----
# The old owner must notice (other inode, other token) and must not touch
# the new owner's lock.
newjob lease-replaced 1
start MINI_DJ_HANG=1 -- --max-shards 1 --lease-secs 2
wait_for "the hanging attempt runs" 10 running
group=$(processor_of "$PID")
STRAYS+=("$group")
f=$(attempt_of "$JOB" "$ID0" 1)
mv "$JOB/state/locks/$ID0.lock" "$JOB/state/stale_locks/$ID0.$(date +%s).byhand.lock"
printf '{"shard_id":"%s","token":"ffffffffffffffffffffffffffffffff","hostname":"elsewhere","pid":1,"attempt_dir":"attempts/%s/0002-ffffffffffffffffffffffffffffffff","lease_secs":600,"node":"other"}\n' \
    "$ID0" "$ID0" >"$W/new.lock"
cp "$W/new.lock" "$JOB/state/locks/$ID0.lock"
wait_for "the attempt ends lost or stale within a few seconds" 5 lost_or_stale
finish 10
expect_attempt "lease replaced" "$f" "$(field "$f" status)" infrastructure "lease of $ID0 lost"
wait_for "the processor's group is killed" 5 group_gone "$group"
cmp -s "$JOB/state/locks/$ID0.lock" "$W/new.lock" ||
    fail "the new owner's lock is left alone" "$(cat "$JOB/state/locks/$ID0.lock" 2>&1)"
[ ! -e "$JOB/state/done/$ID0.json" ] || fail "no done record after a replaced lock"
ok "lease lost (lock replaced by another claim): attempt $(field "$f" status), group killed, the new lock untouched"

# ---- SIGTERM: the claim is released, no failure counted ----
# --max-retries 0: had the stopped attempt counted, the shard would fail.
newjob sigterm 1 --max-retries 0
start MINI_DJ_HANG=1 --
wait_for "the hanging attempt runs" 10 running
group=$(processor_of "$PID")
STRAYS+=("$group")
kill -TERM "$PID"
finish 15
f=$(attempt_of "$JOB" "$ID0" 1)
[ "$(field "$f" status)" = released ] || fail "SIGTERM: attempt released" "$(cat "$f")"
{ [ "$(count "$JOB/state/locks")" -eq 0 ] && [ "$(count "$JOB/state/failed")" -eq 0 ]; } ||
    fail "SIGTERM: lock removed, no failed record"
wait_for "the processor's group is killed" 5 group_gone "$group"
ok "SIGTERM during an attempt: status released, lock removed, group killed (worker exit $RC)"
work --
[ "$RC" -eq 0 ] || fail "a worker after SIGTERM completes the shard" "exit $RC" "$OUT"
[ "$(py 'j["attempt_number"]' "$JOB/state/done/$ID0.json")" = 2 ] ||
    fail "after a release the shard is done by attempt 2"
ok "the next worker completes it with attempt 2 despite --max-retries 0: the release counted nothing"

# ---- a processor that cannot be started: infrastructure, own limit ----
newjob nostart 1 --max-retries 0
env "$ESCTL" worker --local --job-dir "$JOB" --node n1 --processor /nonexistent/dj \
    --poll-interval-secs 1 --max-infra-failures 2 >"$W/worker.out" 2>&1 &
PID=$!
BG+=("$PID")
finish 30
[ "$RC" -eq 2 ] || fail "--processor /nonexistent/dj: the worker exits 2" "exit $RC" "$OUT"
[ "$(attempts_of "$JOB" "$ID0" | wc -l)" -eq 3 ] ||
    fail "three attempts before the shard fails" "$(attempts_of "$JOB" "$ID0")"
for n in 1 2 3; do
    expect_attempt "unstartable attempt $n" "$(attempt_of "$JOB" "$ID0" "$n")" infra_failed \
        infrastructure "/nonexistent/dj"
done
got=$(py '"%s|%s|%s" % (j["failure_class"], j["failures"], j["infrastructure_failures"])' \
    "$JOB/state/failed/$ID0.json")
[ "$got" = "infrastructure|0|3" ] || fail "failed record of an unstartable processor" "$got"
# (the reference's workers count "failed" and "stale" only: none of these)
got=$(python3 -c 'import glob, json, sys
print(sum(json.load(open(f)).get("status") in ("failed", "stale")
          for f in glob.glob(sys.argv[1] + "/attempts/" + sys.argv[2] + "/*/attempt.json")))' \
    "$JOB" "$ID0")
[ "$got" -eq 0 ] || fail "the reference would count none of the infrastructure failures" "$got"
ok "an unstartable processor: infrastructure failures (infra_failed, which the reference does not count) do not use up --max-retries 0; the third fails the shard with --max-infra-failures 2"

# ---- failing once, then done; merge works ----
newjob once 2
work MINI_DJ_EXIT=5 MINI_DJ_FAIL_ONCE="$W/once-markers" --
[ "$RC" -eq 0 ] || fail "MINI_DJ_FAIL_ONCE: the worker completes the job" "exit $RC" "$OUT"
for id in part-00000-of-00002 part-00001-of-00002; do
    expect_attempt "MINI_DJ_FAIL_ONCE first attempt of $id" "$(attempt_of "$JOB" "$id" 1)" failed \
        processor "exit code 5"
    { [ "$(field "$(attempt_of "$JOB" "$id" 2)" status)" = "done" ] &&
        [ "$(py 'j["attempt_number"]' "$JOB/state/done/$id.json")" = 2 ]; } ||
        fail "MINI_DJ_FAIL_ONCE: second attempt of $id done"
done
"$ESCTL" merge --local "$JOB" --output "$W/once.jsonl" >"$W/merge.out" 2>&1 ||
    fail "merge after failing once" "$(cat "$W/merge.out")"
newjob clean 2
work --
"$ESCTL" merge --local "$JOB" --output "$W/clean.jsonl" >"$W/merge.out" 2>&1 ||
    fail "merge of a clean run" "$(cat "$W/merge.out")"
cmp "$W/once.jsonl" "$W/clean.jsonl" || fail "failing once changes nothing in the result"
ok "MINI_DJ_FAIL_ONCE: each shard fails once then is done by attempt 2; merge equals a clean run"

# ---- the invocation contract (spec §8.4) ----
newjob contract 1
work MINI_DJ_RECORD="$W/record.jsonl" -- --max-shards 1
[ "$RC" -eq 0 ] || fail "a recorded run succeeds" "exit $RC" "$OUT"
f=$(attempt_of "$JOB" "$ID0" 1)
python3 - "$W/record.jsonl" "$JOB" "$(dirname "$f")" "$MINI" "$ID0" <<'EOF' ||
import json, sys
rec, job, att, mini, sid = sys.argv[1:]
(r,) = [json.loads(l) for l in open(rec)]
argv = r["argv"]
assert argv[0] == mini, argv[0]
flags = argv[1::2]
want = ["--config", "--dataset_path", "--export_path", "--executor_type", "--ray_address",
        "--work_dir", "--job_id", "--event_log_dir", "--checkpoint_dir", "--partition_dir"]
assert flags == want and len(argv) == 21, argv
v = dict(zip(argv[1::2], argv[2::2]))
assert v["--executor_type"] == "ray" and v["--ray_address"] == "local", v
paths = {"--config": job + "/recipe.yaml", "--dataset_path": job + "/shards/" + sid + ".jsonl",
         "--export_path": att + "/ray-output.jsonl", "--work_dir": att + "/work",
         "--event_log_dir": att + "/logs", "--checkpoint_dir": att + "/checkpoints",
         "--partition_dir": att + "/partitions"}
for k, p in paths.items():
    assert v[k] == p, (k, v[k], p)
assert sid in v["--job_id"], v["--job_id"]
assert r["cwd"] == job, r["cwd"]
env = r["env"]
assert env["DJ_PRODUCED_DATA_DIR"] == att + "/produced", env
assert env["XDG_CACHE_HOME"] == job + "/cache", env
assert env["HF_HOME"] == job + "/cache/huggingface", env
EOF
    fail "argv, cwd and environment as spec §8.4" "$(cat "$W/record.jsonl")"
ok "the processor gets the ten flags in order with absolute paths, cwd the job dir, DJ_PRODUCED_DATA_DIR, XDG_CACHE_HOME, HF_HOME"
log="$(dirname "$f")/process.log"
{ grep -q "^mini-dj: TEST STAND-IN" "$log" && grep -q "^mini-dj: kept 12 rows" "$log" &&
    grep -q "^mini-dj: wrote 12 rows" "$log"; } || fail "process.log holds mini-dj's output" "$(cat "$log")"
ok "process.log holds mini-dj's stdout and stderr lines"

summary
