#!/usr/bin/env bash
# global_stage: a whole recipe (issue 17) with the stand-in processor
# mini-dj (NOT Data-Juicer; real_global.sh runs the real one). A recipe of
# two per-record operators and document_deduplicator, over data whose
# duplicates lie in different shards: prepare splits it (2 operators per
# shard, then 1 once), two esd nodes run the shards, the finalize winner
# merges them into the global stage's input, the global stage's first
# attempt fails (MINI_DJ_EXIT=3 on its input only, once) and is retried,
# and the final output is the per-record result of every shard, in order,
# with each text's first record only. merge.json records both stages.
# The metrics show the phase and the stage; a global stage that failed for
# good is requeued by esctl retry. Then `esd run` runs the same job on two
# one-shot nodes: status shows the stage running, and the node in it is
# killed (-9) and taken over.
set -euo pipefail
export LC_ALL=C
# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

new_workdir
unset_knobs
need_daemon_tools
python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
with open(w + "/data.jsonl", "w") as f:
    for i in range(160):
        # 40 texts, each four times, in all four shards, the spacing differing
        t = "document  %d\t of the  dataset" % (i % 40) if i % 2 else "document %d of the dataset " % (i % 40)
        f.write(json.dumps({"id": i, "text": t}) + "\n")
PY
cat >"$W/recipe.yaml" <<'Y'
# a whole recipe
project_name: whole
np: 2
process:
  - whitespace_normalization_mapper:
  - text_length_filter:
      min_len: 1
  - document_deduplicator:
      lowercase: false
Y
run "$ESCTL" prepare --local --config "$W/recipe.yaml" --dataset-path "$W/data.jsonl" \
    --job-dir "$W/job" --num-shards 4
check "prepare splits the recipe" 0 "2 operators per shard, then 1 once: document_deduplicator"
{ [ -f "$W/job/recipe.shards.yaml" ] && [ -f "$W/job/recipe.global.yaml" ] &&
    cmp -s "$W/recipe.yaml" "$W/job/recipe.yaml"; } ||
    fail "recipe.yaml is the user's, beside its two halves" "$(ls "$W/job")"
ok "recipe.yaml is the user's recipe; recipe.shards.yaml and recipe.global.yaml beside it"
run "$ESCTL" prepare --local --config "$W/recipe.yaml" --dataset-path "$W/data.jsonl" \
    --job-dir "$W/job2" --num-shards 4 --no-global-stage
check "--no-global-stage refuses the recipe as before" 2 "" "whole-dataset semantics"

give_job "$W/job"
mkdir -m 1777 "$W/once" # (the attempts run as the job's owner)
for n in n1 n2; do
    daemon_conf "$n" metrics.path="$W/$n.prom" metrics.interval_secs=1
    start_daemon "$n" MINI_DJ_EXIT=3 MINI_DJ_ONLY=global/input.jsonl MINI_DJ_FAIL_ONCE="$W/once"
done
run "$ESCTL" --socket "$(dsock n1)" submit "$W/job"
check "submit on n1" 0 "Submitted $W/job"
run "$ESCTL" --socket "$(dsock n2)" submit "$W/job"
check "submit on n2" 0 "Submitted $W/job"
complete() { [ "$(job_state n1 "$W/job")" = complete ] && [ "$(job_state n2 "$W/job")" = complete ]; }
wait_for "the job completes on both nodes" 40 complete
ok "the job completed on both nodes"

python3 - "$W" <<'PY' >"$W/verdict" 2>&1 || fail "the records of both stages" "$(cat "$W/verdict")"
import glob, hashlib, json, re, sys
w = sys.argv[1]
job = w + "/job"
man = json.load(open(job + "/manifest.json"))
g = man["recipe"]["global"]
assert man["recipe"]["snapshot_path"] == "recipe.shards.yaml", man["recipe"]
assert g["operators"] == ["document_deduplicator"] and g["shard_operators"] == 2, g
# the global stage's input: every shard's result, in manifest order
shards = sorted(man["shards"], key=lambda s: s["index"])
prefix = b""
for s in shards:
    d = json.load(open(job + "/state/done/%s.json" % s["id"]))
    prefix += open(job + "/" + d["output_path"], "rb").read()
inp = open(job + "/state/esd/global/input.jsonl", "rb").read()
assert inp == prefix, "input.jsonl is the shards' results in order"
pre = json.load(open(job + "/state/esd/global/prefix.json"))
assert pre["rows"] == 160 and pre["sha256"] == hashlib.sha256(inp).hexdigest(), pre
# the final output: the first record of each normalised text, in input order
seen, want = set(), []
for line in inp.splitlines(keepends=True):
    t = json.loads(line)["text"]
    assert t == re.sub(r"\s+", " ", t).strip()
    if t not in seen:
        seen.add(t)
        want.append(line)
out = open(job + "/merged.jsonl", "rb").read()
assert out == b"".join(want), "merged.jsonl is the deduplicated input"
assert len(want) == 40
m = json.load(open(job + "/merge.json"))
assert m["rows"] == 40 and m["sha256"] == hashlib.sha256(out).hexdigest(), m
assert m["num_shards"] == 4, m
st = m["stages"]
assert st["shards"]["rows"] == 160 and st["shards"]["sha256"] == pre["sha256"], st
assert st["global"]["rows"] == 40 and st["global"]["operators"] == ["document_deduplicator"], st
# the global stage's attempts: the first failed (a processor failure), the second done
ats = [json.load(open(f)) for f in sorted(glob.glob(job + "/attempts/_global/*/attempt.json"))]
assert [a["status"] for a in ats] == ["failed", "done"], [a["status"] for a in ats]
assert "--executor_type" in ats[1]["command"]
assert ats[1]["command"][ats[1]["command"].index("--executor_type") + 1] == "default"
assert ats[1]["command"][ats[1]["command"].index("--config") + 1] == job + "/recipe.global.yaml"
d = json.load(open(job + "/state/done/_global.json"))
assert d["rows"] == 40, d
print("prefix %d rows, global %d rows, attempts %s" % (pre["rows"], m["rows"],
      [a["status"] for a in ats]))
PY
ok "both stages recorded: $(cat "$W/verdict")"
run "$ESCTL" --json status --local "$W/job"
check "status of the finished job" 0
python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["phase"] == "complete", d["phase"]; assert d["global"]["status"] == "done" and d["global"]["rows"] == 40, d["global"]' <"$W/stdout" ||
    fail "status shows the phase and the global stage" "$OUT"
ok "status: phase complete, the global stage done with 40 rows"
run "$ESCTL" verify --local "$W/job"
check "verify checks both stages" 0 "PASS"
cp "$W/job/state/esd/global/input.jsonl" "$W/input.keep"
sed -i '1s/document/Document/' "$W/job/state/esd/global/input.jsonl"
run "$ESCTL" verify --local "$W/job"
check "verify refuses a tampered global-stage input" 2 "" "input.jsonl"
cp "$W/input.keep" "$W/job/state/esd/global/input.jsonl"
grep -q "the global stage runs next" "$W/n1/log" "$W/n2/log" ||
    fail "esd logs the global stage" "$(tail -n 30 "$W/n1/log")"
ok "esd logged the global stage"
prom_done() {
    grep -q '^esd_job_phase{esd_job="[0-9a-f]*",phase="complete"} 1$' "$W/n1.prom" &&
        grep -q '^esd_job_global_stage{esd_job="[0-9a-f]*",state="done"} 1$' "$W/n1.prom"
}
wait_for "the metrics show the phase and the global stage" 20 prom_done
ok "metrics: esd_job_phase complete, esd_job_global_stage done"
# a global stage that failed for good (no retry allowed; its input's first
# run fails, as above) is requeued by esctl retry, which names it, and the
# job, submitted again, completes with the same output
run "$ESCTL" prepare --local --config "$W/recipe.yaml" --dataset-path "$W/data.jsonl" \
    --job-dir "$W/job3" --num-shards 4 --max-retries 0
check "prepare of a job with no retries" 0
give_job "$W/job3"
run "$ESCTL" --socket "$(dsock n1)" submit "$W/job3"
check "submit of the job with no retries" 0
failed() { [ "$(job_state n1 "$W/job3")" = failed ]; }
wait_for "its global stage fails for good" 40 failed
run "$ESCTL" --json status --local "$W/job3"
py 'j["phase"] + " " + j["global"]["status"]' "$W/stdout" | grep -qx "failed failed" ||
    fail "status: the global stage failed" "$OUT"
run "$ESCTL" retry --local "$W/job3" --shard-id part-00000-of-00004
check "retry of a done shard requeues nothing" 0
run "$ESCTL" --json retry --local "$W/job3" --all-failed
check "retry --all-failed requeues the global stage" 0 '"_global"'
run "$ESCTL" --socket "$(dsock n1)" submit "$W/job3"
check "the retried job submitted again" 0
complete3() { [ "$(job_state n1 "$W/job3")" = complete ]; }
wait_for "the job completes after the retry" 40 complete3
cmp -s "$W/job/merged.jsonl" "$W/job3/merged.jsonl" ||
    fail "the retried global stage gives the same output" "$(head -c 300 "$W/job3/merged.jsonl")"
ok "a failed global stage, requeued by esctl retry, completes the job with the same output"
# a broken prefix.json (there before the shards are merged): said once,
# and the finalize winner merges the shards again over it
run "$ESCTL" prepare --local --config "$W/recipe.yaml" --dataset-path "$W/data.jsonl" \
    --job-dir "$W/job5" --num-shards 4
check "prepare of a job with a broken prefix record" 0
mkdir -p "$W/job5/state/esd/global"
echo '{"rows": "many"' >"$W/job5/state/esd/global/prefix.json"
give_job "$W/job5"
run "$ESCTL" --socket "$(dsock n1)" submit "$W/job5"
check "submit of the job with a broken prefix record" 0
complete5() { [ "$(job_state n1 "$W/job5")" = complete ]; }
wait_for "the job with a broken prefix record completes" 40 complete5
cmp -s "$W/job/merged.jsonl" "$W/job5/merged.jsonl" ||
    fail "the job with a broken prefix record gives the same output"
n=$(grep -c "job5.*cannot enter the global stage" "$W/n1/log" || true)
[ "$n" -eq 1 ] || fail "the broken prefix record is logged once" "$n lines" \
    "$(grep "job5.*global" "$W/n1/log" | tail -n 5)"
ok "a broken prefix.json: logged once, merged again over it, the same output"
head -n 7 "$W/recipe.yaml" >"$W/shards-only.yaml"
run "$ESCTL" prepare --local --config "$W/shards-only.yaml" --dataset-path "$W/data.jsonl" \
    --job-dir "$W/job4" --num-shards 2
check "prepare of a recipe without a global stage" 0
run "$ESCTL" retry --local "$W/job4" --shard-id _global
check "retry of _global in a job without one" 2 "" "_global"

for n in n1 n2; do
    stop_daemon "$n"
    [ "$DRC" -eq 0 ] || fail "esd $n exits 0" "status $DRC"
done

# ---- esd run: the same whole recipe on two one-shot nodes; the node
# running the global stage is killed (-9) in it, and the other takes the
# finalize election and the stage over after their leases ----
unset_knobs PAI_JOB_ID DLC_JOB_ID JOB_ID SLURM_JOB_ID SLURM_ARRAY_JOB_ID SLURM_ARRAY_TASK_ID \
    TORCHELASTIC_RUN_ID JOB_COMPLETION_INDEX WORLD_SIZE RANK SLURM_JOB_END_TIME
printf 'attempt_env: [LANG, "MINI_DJ_*"]\npoll_interval_secs: 1\n' >"$W/run.yaml"
declare -A RPID=()
for n in r1 r2; do
    MINI_DJ_SLEEP_MS=150 MINI_DJ_ONLY=global/input.jsonl MINI_DJ_FAIL_ONCE="$W/once-run" \
        "$ESD" run --job-dir "$W/job-run" --node "$n" --state-dir "$W/state.$n" --run-id whole \
        --processor "$MINI" --ray-mode off --lease-secs 3 --poll-interval-secs 0.3 \
        --esd-config "$W/run.yaml" --config "$W/recipe.yaml" --dataset-path "$W/data.jsonl" \
        --num-shards 4 >"$W/$n.out" 2>"$W/$n.err" &
    RPID[$n]=$!
    BG+=("$!")
done
holder() { grep -o '"node": *"r[12]"' "$W/job-run/state/locks/_global.lock" 2>/dev/null | grep -o 'r[12]'; }
has_holder() { [ -n "$(holder)" ]; }
wait_for "esd run: a node runs the global stage" 60 has_holder
H=$(holder)
# (the stage runs 160 rows x 150 ms: status sees it running)
run "$ESCTL" --json status --local "$W/job-run"
py 'j["phase"], j["global"]["status"], j["global"]["node"], j["global"]["input_rows"]' \
    "$W/stdout" | grep -qx "('global', 'running', '$H', 160)" ||
    fail "status while the global stage runs" "$OUT"
run "$ESCTL" status --local "$W/job-run"
grep -qi "global" "$W/stdout" || fail "status's text shows the global stage" "$OUT"
ok "status while the global stage runs: phase global, running on $H, 160 input rows"
O=r1
[ "$H" = r2 ] || O=r2
{
    kill -KILL "${RPID[$H]}"
    wait "${RPID[$H]}"
} 2>/dev/null || true
wait_for "esd run $O ends" 90 dead "${RPID[$O]}"
RC=0
wait "${RPID[$O]}" || RC=$?
[ "$RC" -eq 0 ] || fail "esd run: $O exits 0 after $H died in the global stage" "exit $RC" \
    "$(cat "$W/$O.out")" "$(tail -n 20 "$W/$O.err")"
cmp -s "$W/job/merged.jsonl" "$W/job-run/merged.jsonl" ||
    fail "esd run: the output is the daemons' output of the same job" "$(cat "$W/$O.out")"
grep -qF "elected as finalize coordinator" "$W/$O.out" ||
    fail "esd run: $O took the finalize over" "$(cat "$W/$O.out")"
[ "$(py 'j["stages"]["global"]["rows"]' "$W/job-run/merge.json")" = 40 ] ||
    fail "esd run: merge.json records the global stage" "$(cat "$W/job-run/merge.json")"
ok "esd run: $H killed in the global stage, $O took it over and exited 0 with the same output"
summary
