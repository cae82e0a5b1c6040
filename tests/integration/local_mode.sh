#!/usr/bin/env bash
# local_mode: esctl's local mode end to end, through the command line only:
# prepare a small dataset (a directory with a nested file), let the test
# stand-in tests/tools/fake-finish play the workers (one shard fails, is
# requeued, then everything completes), then status, retry, merge and
# verify with their texts, exit codes and --json output; also help, bad
# options, and the refusal of daemon-only commands without --local.
#
# Environment: ESCTL (absolute path of the esctl binary; default ./esctl),
# TOP (the repository root; default: two levels above this script).
set -euo pipefail

ESCTL=${ESCTL:-./esctl}
# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"
FAKE="$TOP/tests/tools/fake-finish"

# Never talk to a real esd, whatever runs on this machine (new_workdir
# points ESD_SOCKET into W).
new_workdir
unset NO_COLOR || true

# json_ok WHAT: stdout of the last run parses as JSON.
json_ok() {
    python3 -c 'import json,sys; json.load(sys.stdin)' <"$W/stdout" ||
        fail "$1" "stdout is not JSON: $OUT"
    ok "$1"
}
# json_field EXPR: evaluates a Python expression on the parsed stdout (j).
json_field() {
    python3 -c 'import json,sys; j=json.load(sys.stdin); print(eval(sys.argv[1]))' "$1" \
        <"$W/stdout"
}
# shards_in_order JOB: the shard files, in manifest order.
shards_in_order() {
    python3 -c 'import json,sys
m = json.load(open(sys.argv[1] + "/manifest.json"))
print("\n".join(sys.argv[1] + "/" + s["path"] for s in m["shards"]))' "$1"
}
shard_id() {
    python3 -c 'import json,sys
print(json.load(open(sys.argv[1] + "/manifest.json"))["shards"][int(sys.argv[2])]["id"])' "$1" "$2"
}

[ -x "$ESCTL" ] || fail "esctl exists" "not executable: $ESCTL (run make first)"
[ -x "$FAKE" ] || fail "fake-finish exists" "not executable: $FAKE"

# ---- help and argument errors ----
run "$ESCTL" --help
check "esctl --help exits 0" 0 "usage: esctl"
for cmd in prepare status retry merge verify; do
    [[ $OUT == *"  $cmd "* ]] || fail "esctl --help lists $cmd" "stdout: $OUT"
done
ok "esctl --help lists every command"

run "$ESCTL" prepare --help
check "esctl prepare --help exits 0" 0 "usage: esctl prepare"
for opt in --config --dataset-path --job-dir --num-shards --lock-timeout-secs --max-retries \
    --ray-address; do
    [[ $OUT == *"$opt"* ]] || fail "esctl prepare --help lists $opt" "stdout: $OUT"
done
ok "esctl prepare --help lists its options"

run "$ESCTL" status --local --bogus "$W/job"
check "an unknown option exits 2" 2 "" "unknown option '--bogus'"

run "$ESCTL" frobnicate
check "an unknown command exits 2" 2 "" "unknown command 'frobnicate'"

run "$ESCTL" prepare --local --config "$W/recipe.yaml" --num-shards 3
check "a missing required option exits 2" 2 "" "--job-dir is required"

run "$ESCTL" prepare --local --config "$W/recipe.yaml" --job-dir "$W/job" --num-shards zero
check "a non-numeric --num-shards exits 2" 2 "" "--num-shards must be a positive integer"

# ---- prepare ----
mkdir -p "$W/data/nested/deeper"
printf '{"text":"one"}\n{"text":"two"}\n{"text":"three"}\n' >"$W/data/top.jsonl"
printf '{"text":"four"}\n{"text":"five"}\n{"text":"six"}\n{"text":"seven"}\n' \
    >"$W/data/nested/deeper/more.jsonl"
printf 'process:\n  - whitespace_normalization_mapper:\n' >"$W/recipe.yaml"
JOB="$W/job"

run "$ESCTL" prepare --config "$W/recipe.yaml" --dataset-path "$W/data" --job-dir "$JOB" \
    --num-shards 3
check "prepare without --local exits 3 and points at --local" 3 "" "--local"
[ ! -e "$JOB" ] || fail "prepare without --local creates nothing" "$JOB exists"
ok "prepare without --local creates nothing"

run "$ESCTL" prepare --local --config "$W/recipe.yaml" --dataset-path "$W/data" \
    --job-dir "$JOB" --num-shards 3
check "prepare --local" 0 "Prepared 3 shards from 7 records"
[ "$(find "$JOB/shards" -name 'part-*.jsonl' | wc -l)" -eq 3 ] ||
    fail "prepare wrote 3 shard files" "$(ls -l "$JOB/shards")"
[ "$(cat "$JOB"/shards/*.jsonl | wc -l)" -eq 7 ] || fail "the shards hold 7 records"
ok "prepare wrote 3 shards holding 7 records"

run "$ESCTL" --json prepare --local --config "$W/recipe.yaml" --dataset-path "$W/data" \
    --job-dir "$JOB" --num-shards 3
check "re-prepare is a no-op" 0
json_ok "prepare --json parses"
[ "$(json_field 'j["unchanged"]')" = True ] || fail "re-prepare reports unchanged" "$OUT"
ok "re-prepare reports unchanged"

S0=$(shard_id "$JOB" 0)
S1=$(shard_id "$JOB" 1)
S2=$(shard_id "$JOB" 2)

# ---- status, a failure, retry ----
run "$ESCTL" status --local "$JOB"
check "status of a fresh job exits 1" 1 \
    "Job job: executor=ray ray_address=local total=3 pending=3 running=0 stale=0 done=0 failed=0"

run "$ESCTL" status "$JOB"
check "status of a job directory reads it without --local" 1 "pending=3"
run "$ESCTL" status
check "status without a job asks esd, which is not running here" 3 "" "cannot reach esd at"
run "$ESCTL" ping
check "ping without esd exits 3" 3 "" "cannot reach esd at"

"$FAKE" --job-dir "$JOB" --shard-id "$S0" --fail "$S1" --hostname node-a ||
    fail "fake-finish one done, one failed" "exit $?"
run "$ESCTL" status --local "$JOB"
check "status with a failed shard exits 2" 2 "pending=1 running=0 stale=0 done=1 failed=1"
[[ $OUT == *"$S1"*"failed"*"Data-Juicer returned exit code 1"* ]] ||
    fail "status shows the failed shard and its error" "stdout: $OUT"
ok "status shows the failed shard and its error"

run "$ESCTL" --json status --local "$JOB"
check "status --json exits as status does" 2
json_ok "status --json parses"
[ "$(json_field '(j["counts"]["failed"], j["complete"], j["terminal"], j["shards"][1]["error"])')" \
    = "(1, False, False, 'Data-Juicer returned exit code 1')" ] ||
    fail "status --json counts and error" "$OUT"
ok "status --json counts and error"

run "$ESCTL" retry "$JOB" --all-failed
check "retry without --local exits 3" 3 "" "--local"

run "$ESCTL" retry --local "$JOB" --shard-id no-such-shard
check "retry of an unknown shard exits 2" 2 "" "Unknown shard IDs: no-such-shard"

run "$ESCTL" retry --local "$JOB" --all-failed
check "retry --all-failed requeues the failed shard" 0 "Requeued $S1"
[ "$(count "$JOB/state/failed")" -eq 0 ] || fail "retry emptied state/failed"
if [ "$(count "$JOB/state/history/failed")" -ne 1 ] ||
    [ "$(count "$JOB/state/history/attempts")" -ne 1 ]; then
    fail "retry moved the record and the attempts into history" "$(find "$JOB/state/history")"
fi
ok "retry moved the record and the attempts into history"

run "$ESCTL" --json retry --local "$JOB" --all-failed
check "retry with nothing failed exits 0" 0
json_ok "retry --json parses"
[ "$(json_field 'j["requeued"]')" = "[]" ] || fail "retry --json lists nothing" "$OUT"
ok "retry --json lists nothing"

run "$ESCTL" status --local "$JOB"
check "status after retry exits 1" 1 "pending=2 running=0 stale=0 done=1 failed=0"

# A running claim, then the same claim past its timeout.
"$FAKE" --job-dir "$JOB" --lock "$S2" --lock-age 120 --hostname node-b ||
    fail "fake-finish a lock" "exit $?"
run "$ESCTL" status --local "$JOB"
check "a fresh lock is running" 1 "pending=1 running=1 stale=0"
run "$ESCTL" status --local "$JOB" --lock-timeout-secs 60
check "a lock older than the timeout is stale" 1 "pending=1 running=0 stale=1"
run "$ESCTL" merge --local "$JOB"
check "merge refuses an incomplete job" 2 "" \
    "Cannot merge an incomplete job: pending=1 running=1 stale=0 failed=0 done=1"
[ ! -e "$JOB/merged.jsonl" ] || fail "a refused merge writes no output"
ok "a refused merge writes no output"
rm "$JOB/state/locks/$S2.lock"

"$FAKE" --job-dir "$JOB" --all --hostname node-b || fail "fake-finish the rest" "exit $?"
run "$ESCTL" status --local --all "$JOB"
check "status of a complete job exits 0" 0 "pending=0 running=0 stale=0 done=3 failed=0"
[[ $OUT == *"$S0"*"done"*"node-a"* && $OUT == *"$S2"*"done"*"node-b"* ]] ||
    fail "status --all shows every shard with its owner" "stdout: $OUT"
ok "status --all shows every shard with its owner"

# ---- merge ----
run "$ESCTL" merge --local "$JOB"
check "merge" 0 "Merged 3 shards and 7 rows into $JOB/merged.jsonl"
[ "$(wc -l <"$JOB/merged.jsonl")" -eq 7 ] || fail "the merged output has 7 rows"
shards_in_order "$JOB" | xargs cat >"$W/expected.jsonl"
cmp "$W/expected.jsonl" "$JOB/merged.jsonl" ||
    fail "the merged output is the shards concatenated in manifest order"
ok "the merged output is the shards concatenated in manifest order (7 rows)"
[ "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["rows"])' \
    "$JOB/merge.json")" = 7 ] || fail "merge.json records 7 rows" "$(cat "$JOB/merge.json")"
ok "merge.json records 7 rows"

cp "$JOB/merged.jsonl" "$W/first-merge.jsonl"
run "$ESCTL" merge --local "$JOB"
check "a second merge without --overwrite exits 2 naming the output" 2 "" \
    "Output already exists: $JOB/merged.jsonl; pass --overwrite to replace it"
cmp -s "$W/first-merge.jsonl" "$JOB/merged.jsonl" || fail "the refused merge left the output"
ok "the refused merge left the output untouched"

run "$ESCTL" merge --local "$JOB" --overwrite
check "merge --overwrite" 0 "Merged 3 shards and 7 rows"
cmp -s "$W/expected.jsonl" "$JOB/merged.jsonl" || fail "merge --overwrite wrote the same bytes"
ok "merge --overwrite wrote the same bytes"

run "$ESCTL" --json merge --local "$JOB" --output "$W/elsewhere/m.jsonl"
check "merge --json to another path" 0
json_ok "merge --json parses"
[ "$(json_field '(j["rows"], j["num_shards"], j["output_path"])')" = \
    "(7, 3, '$W/elsewhere/m.jsonl')" ] || fail "merge --json fields" "$OUT"
ok "merge --json fields"

# ---- verify ----
run "$ESCTL" verify --local "$JOB" --expect-nodes 1
check "verify --expect-nodes 1 passes" 0 "PASS: 3 shards were completed by 2 node(s)"
[[ $OUT == *"node-a: 1 shard(s)"* && $OUT == *"node-b: 2 shard(s)"* ]] ||
    fail "verify lists the owners" "stdout: $OUT"
ok "verify lists the owners"

run "$ESCTL" verify --local "$JOB" --expect-nodes 3
check "verify --expect-nodes 3 fails with exit 2" 2 "" \
    "only 2 node(s) completed shards; expected at least 3"
run "$ESCTL" --json verify --local "$JOB" --expect-nodes 3
check "verify --json --expect-nodes 3 fails with exit 2" 2
json_ok "verify --json error parses"
[ "$(json_field 'j["ok"]')" = False ] || fail "verify --json error says ok false" "$OUT"
ok "verify --json error says ok false"

run "$ESCTL" verify "$JOB"
check "verify reads the job directory without --local" 0 "PASS"

run "$ESCTL" --json verify --local "$JOB"
check "verify --json" 0
json_ok "verify --json parses"
[ "$(json_field '(j["ok"], j["owners"], j["rows"])')" = \
    "(True, {'node-a': 1, 'node-b': 2}, 7)" ] || fail "verify --json fields" "$OUT"
ok "verify --json fields"

# A result changed after its publication.
"$FAKE" --job-dir "$JOB" --mutate "$S2" || fail "fake-finish --mutate" "exit $?"
run "$ESCTL" verify --local "$JOB"
check "verify detects a result changed after publication" 2 "" \
    "Result checksum or row count mismatch for $S2"
run "$ESCTL" merge --local "$JOB" --overwrite
check "merge refuses a result changed after publication" 2 "" \
    "Result checksum or row count mismatch for $S2"
cmp -s "$W/expected.jsonl" "$JOB/merged.jsonl" || fail "the refused merge kept the old output"
ok "the refused merge kept the old output"

# ---- a result without its final newline ----
JOB2="$W/job2"
run "$ESCTL" prepare --local --config "$W/recipe.yaml" --dataset-path "$W/data" \
    --job-dir "$JOB2" --num-shards 2
check "prepare a second job" 0 "Prepared 2 shards"
"$FAKE" --job-dir "$JOB2" --all --no-newline "$(shard_id "$JOB2" 0)" ||
    fail "fake-finish --no-newline" "exit $?"
run "$ESCTL" merge --local "$JOB2"
check "merge a result without its final newline" 0 "Merged 2 shards and 7 rows"
shards_in_order "$JOB2" | xargs cat | cmp -s - "$JOB2/merged.jsonl" ||
    fail "merge restored the missing newline"
ok "merge restored the missing newline"

# A manifest without job_id: the directory's name stands in.
python3 -c 'import json,sys
p = sys.argv[1] + "/manifest.json"
m = json.load(open(p))
del m["job_id"]
open(p, "w").write(json.dumps(m, indent=2, sort_keys=True) + "\n")' "$JOB2"
run "$ESCTL" status --local "$JOB2"
check "a manifest without job_id is named after its directory" 0 "Job job2: executor=ray"

summary
