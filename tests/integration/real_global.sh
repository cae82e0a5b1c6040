#!/usr/bin/env bash
# real_global: a whole recipe (issue 17) on the real stack. Text mappers
# and a filter, then document_deduplicator, over 600 records whose 150
# texts each occur in all three shards: prepare splits it, esd a and esd b
# (each with its own persistent Ray head) run the shards, the finalize
# winner merges them, and the node that claims the global stage is killed
# (SIGKILL, its attempt's processes with it) while the stage runs: the
# other node takes it over once its lease ends and completes the job. The
# final output holds the same records, in the same order, as Data-Juicer's
# own unsharded run of the whole recipe (dj-process, default executor).
# Prints the time of the sharded stage and of the global stage.
set -euo pipefail
export LC_ALL=C
# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

need_real_stack
{ [ -x "$ESD" ] && [ -x "$ESCTL" ]; } || fail "tools exist" "run make && make tools"
new_workdir
unset_knobs RAY_ADDRESS RAY_AUTH_MODE RAY_AUTH_TOKEN_PATH
export RAY_USAGE_STATS_ENABLED=0
RAY=$VENV/bin/ray
DJ=$VENV/bin/dj-process
real_stack_as_nobody

python3 - "$W/data.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(600):
        k = i % 150
        sp = "  " if i % 2 else " "
        t = "Record%snumber %d of the whole-recipe test,%skept once." % (sp, k, sp)
        if k % 10 == 3:
            t = "short %d" % k  # dropped by the length filter
        f.write(json.dumps({"id": i, "text": t}) + "\n")
PY
cat >"$W/recipe.yaml" <<'Y'
project_name: esd-real-global
text_keys: text
np: 1
process:
  - whitespace_normalization_mapper:
  - clean_links_mapper:
  - text_length_filter:
      min_len: 12
  - document_deduplicator:
      lowercase: false
Y
"$ESCTL" prepare --local --config "$W/recipe.yaml" --dataset-path "$W/data.jsonl" \
    --job-dir "$W/job" --num-shards 3 --processor "$DJ" >"$W/prepare.out" 2>&1 ||
    fail "prepare the whole recipe" "$(cat "$W/prepare.out")"
grep -q "3 operators per shard, then 1 once: document_deduplicator" "$W/prepare.out" ||
    fail "prepare prints the split" "$(cat "$W/prepare.out")"
ok "prepare: $(grep -m1 'operators per shard' "$W/prepare.out")"
give_job "$W/job"

# Data-Juicer's own unsharded run of the whole recipe
(cd "$W" && "$DJ" --config "$W/recipe.yaml" --dataset_path "$W/data.jsonl" \
    --export_path "$W/unsharded.jsonl" --executor_type default --work_dir "$W/djwork" \
    >"$W/unsharded.log" 2>&1) || fail "dj-process runs the whole recipe" "$(tail -n 20 "$W/unsharded.log")"
ok "dj-process ran the whole recipe unsharded ($(wc -l <"$W/unsharded.jsonl") records)"

free_ports 12
i=0
for n in a b; do
    real_conf "$n" "$i" slots=1 lease_secs=8 poll_interval_secs=1 "spool_dir=$W/$n/spool"
    i=$((i + 6))
    mkdir -p "$W/$n/spool"
    start_real "$n"
done
heads_up a b
ok "esd a and esd b are up, each on its own head"
T0=$(date +%s)
for n in a b; do
    printf '{"job_dir": "%s"}\n' "$W/job" >"$W/$n/spool/.job.tmp"
    mv "$W/$n/spool/.job.tmp" "$W/$n/spool/job.json"
done
# the global stage claimed: its lock names the node running it
claimed() { [ -f "$W/job/state/locks/_global.lock" ]; }
wait_for "the global stage is claimed" 400 claimed
T1=$(date +%s)
victim=$(py 'j["node"]' "$W/job/state/locks/_global.lock")
case $victim in a) other=b ;; b) other=a ;; *) fail "the lock names a node" "$victim" ;; esac
# (the victim's attempt with it: its whole process tree)
kill_tree "${DPID[$victim]}"
ok "killed esd $victim while it ran the global stage (shards took $((T1 - T0)) s)"
complete() {
    [ -f "$W/job/state/esd/finalize.json" ] &&
        [ "$(py 'j["status"]' "$W/job/state/esd/finalize.json")" = complete ]
}
wait_for "esd $other takes the global stage over and completes the job" 400 complete
T2=$(date +%s)
ok "esd $other completed the job: the global stage with its takeover took $((T2 - T1)) s"

python3 - "$W" "$other" <<'PY' >"$W/verdict" 2>&1 || fail "the result equals Data-Juicer's unsharded run" "$(cat "$W/verdict")"
import glob, json, sys
w, other = sys.argv[1:]
job = w + "/job"
def recs(p):
    return [json.loads(l) for l in open(p, encoding="utf-8") if l.strip()]
want, got = recs(w + "/unsharded.jsonl"), recs(job + "/merged.jsonl")
assert [r["id"] for r in got] == [r["id"] for r in want], ("ids", [r["id"] for r in got][:20], [r["id"] for r in want][:20])
assert got == want, "the same records"
d = json.load(open(job + "/state/done/_global.json"))
assert d["node"] == other, d
ats = [json.load(open(f)) for f in glob.glob(job + "/attempts/_global/*/attempt.json")]
st = sorted(a["status"] for a in ats)
assert "done" in st and "stale" in st, st
m = json.load(open(job + "/merge.json"))
assert m["stages"]["global"]["rows"] == len(want) and m["stages"]["shards"]["num_shards"] == 3, m
print("%d records as dj-process's own run; global attempts %s" % (len(got), st))
PY
ok "$(cat "$W/verdict")"
echo "# timing: sharded stage $((T1 - T0)) s, global stage (killed, taken over) $((T2 - T1)) s"
stop_daemon "$other"
summary
