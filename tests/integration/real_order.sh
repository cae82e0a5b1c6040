#!/usr/bin/env bash
# real_order: the merged output follows the input order and is the same
# bytes however a job is run (issue 13, item 3), on the real stack. One
# job of 8,000 records derived from the sample text (some with several
# paragraphs, some short) is prepared into 2 shards with a recipe that
# splits (text_chunk_mapper on blank lines), edits (the mappers of
# etc/recipes/cpu-text.yaml) and drops (text_length_filter), and that reads
# each shard as 4 Ray blocks (override_num_blocks), so that every shard
# spans 4 blocks and Ray writes it as 4 files. Two fresh copies
# of the prepared job are run:
#   1. by esd a alone, slots 1, on its persistent head;
#   2. by esd a and esd b (slots 2, a head of its own) together.
# Checks: every attempt ran Data-Juicer's own processor as esd-dj
# (attempt.json "command" is <dj-process's python> <esd's dir>/esd-dj ...,
# and its process.log has esd-dj's notice that preserve_order is on);
# an attempt's ray-output.jsonl holds several files; run 2 ran attempts at
# the same time; both merged outputs are the recipe applied to the input in
# input order, computed independently in plain Python (ids non-decreasing,
# the pieces of a split record together and in order, the dropped ones
# missing), and byte-identical to each other.
# Run as root, the jobs and the daemons are nobody's (as real_daemon.sh);
# as another user, that user's. Skips when .venv (scripts/venv) is not
# installed.
set -euo pipefail
export LC_ALL=C
# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

need_real_stack
{ [ -x "$ESD" ] && [ -x "$ESCTL" ]; } || fail "tools exist" "run make && make tools"
[ -f "$(dirname "$ESD")/esd-dj" ] || fail "esd-dj is built next to esd" "run make"
T0=$(date +%s)
new_workdir
unset_knobs RAY_ADDRESS RAY_AUTH_MODE RAY_AUTH_TOKEN_PATH
export RAY_USAGE_STATS_ENABLED=0
RAY=$VENV/bin/ray
DJ=$VENV/bin/dj-process
real_stack_as_nobody
# the interpreter esd runs esd-dj on: dj-process's "#!" line
DJ_PYTHON=$(sed -n '1s/^#! *//p' "$DJ")
RUNNER=$(cd "$(dirname "$ESD")" && pwd -P)/esd-dj

# ---- the input, the recipe, one prepared job ----
# Each shard (4,000 records) is read as 4 blocks of 1,000 rows, processed by
# 4 Ray tasks (2 at a time) and written as 4 files. Its first half is slow
# to process (the sample's texts, every third with two more paragraphs),
# its second half fast (short texts): without preserve_order the blocks of
# the second half were seen to finish, and be written, first.
python3 - "$TOP/tests/data/text-sample.jsonl" "$W/data.jsonl" <<'EOF'
import json, sys
src = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
with open(sys.argv[2], "w", encoding="utf-8") as f:
    for i in range(8000):
        r = dict(src[i % 300], id=i)
        if i % 4000 < 2000:
            if i % 3 == 0:
                r["text"] += "\n\n%s\n\n%s" % (src[(i * 7 + 3) % 300]["text"],
                                              src[(i * 11 + 5) % 300]["text"])
        else:
            r["text"] = ["Short record %d  is kept." % i, "tiny %d" % i,
                         "Piece one of %d.\n\nPiece two of %d, kept too." % (i, i)][i % 3]
        f.write(json.dumps(r, ensure_ascii=False) + "\n")
EOF
cat >"$W/recipe.yaml" <<'EOF'
project_name: esd-real-order
executor_type: ray
text_keys: text
skip_op_error: false
# each shard is read as 4 blocks (Data-Juicer's filters bundle blocks
# into batches of at least 1,000 rows: 1,000 rows a block keeps them)
override_num_blocks: 4
process:
  # one record per paragraph
  - text_chunk_mapper:
      split_pattern: "\n\n"
  # the edits and the drop of etc/recipes/cpu-text.yaml
  - whitespace_normalization_mapper:
  - clean_links_mapper:
  - clean_email_mapper:
  - remove_repeat_sentences_mapper:
      lowercase: false
      ignore_special_character: true
      min_repeat_sentence_length: 2
  - text_length_filter:
      min_len: 20
EOF
"$ESCTL" prepare --local --config "$W/recipe.yaml" --dataset-path "$W/data.jsonl" \
    --job-dir "$W/prepared/job" --num-shards 2 --processor "$DJ" >"$W/prepare.out" 2>&1 ||
    fail "prepare 8,000 records into 2 shards" "$(cat "$W/prepare.out")"
# (the same basename in every copy: it is the job id)
for run in 1 2; do
    mkdir -p "$W/run$run"
    cp -a "$W/prepared/job" "$W/run$run/job"
    give_job "$W/run$run/job"
done
ok "prepared 8,000 records into 2 shards, and two fresh copies of the job"

# ---- two daemons, each with its own persistent head ----
free_ports 12
declare -A SLOTS=([a]=1 [b]=2)
i=0
for n in a b; do
    # b has a spool of its own: it sees only the jobs given to it (run 2)
    real_conf "$n" "$i" "slots=${SLOTS[$n]}" lease_secs=30 poll_interval_secs=1 \
        "spool_dir=$W/$n/spool"
    i=$((i + 6))
    mkdir -p "$W/$n/spool"
    start_real "$n"
done
heads_up a b
ok "esd a (slots 1) and esd b (slots 2) are up, each on its own head ($(($(date +%s) - T0)) s)"

# give JOB NODE...: registers JOB with each NODE (through its spool).
give() {
    local job=$1 n
    shift
    for n in "$@"; do
        printf '{"job_dir": "%s"}\n' "$job" >"$W/$n/spool/.job.tmp"
        mv "$W/$n/spool/.job.tmp" "$W/$n/spool/$(basename "$(dirname "$job")").json"
    done
}
complete() {
    [ -f "$1/merged.jsonl" ] && [ -f "$1/state/esd/finalize.json" ] &&
        [ "$(py 'j["status"]' "$1/state/esd/finalize.json")" = complete ]
}
# work RUN NODE...: the job of RUN, given to the NODEs, until it is complete.
work() {
    local job=$W/run$1/job t deadline
    shift
    t=$(date +%s)
    deadline=$((t + 300))
    give "$job" "$@"
    until complete "$job"; do
        if [ "$(date +%s)" -gt "$deadline" ] || [ "$(count "$job/state/failed")" -gt 0 ]; then
            fail "the job completes within 300 s" "$(tail -n 5 "$W/a/log")" \
                "$(tail -n 5 "$W/b/log")" "failed: $(ls "$job/state/failed")" \
                "$(tail -n 20 "$job"/attempts/*/*/process.log 2>/dev/null | tail -n 30)"
        fi
        sleep 0.5
    done
    SECS=$(($(date +%s) - t))
}
work 1 a
ok "run 1 (esd a, slots 1) is complete ($SECS s)"
work 2 a b
ok "run 2 (esd a with slots 1 and esd b with slots 2) is complete ($SECS s)"

# ---- how the runs ran ----
# Per run: one done record per shard, attempt 1 (unless Ray died: above),
# every command esd-dj; the
# nodes, the most files one attempt's export holds, and whether attempts
# ran at the same time.
shape() {
    python3 - "$W/run$1/job" "$RUNNER" "$DJ_PYTHON" "$(ray_restarted_nodes a b)" <<'EOF'
import datetime, json, os, sys
job, runner, python, restarted = sys.argv[1:]
restarted = restarted.split()
m = json.load(open(os.path.join(job, "manifest.json")))
nodes, files, spans = {}, 0, []
for s in m["shards"]:
    d = json.load(open(os.path.join(job, "state/done", s["id"] + ".json")))
    # attempt 1, or later after the real Ray died under the node's attempt
    # and esd restarted the head: every attempt before it infrastructure
    if d["attempt_number"] != 1:
        assert d["node"] in restarted, ("a retry without a head restart", d)
        for k in range(1, d["attempt_number"]):
            prev = os.path.join(job, "attempts", s["id"])
            for name in os.listdir(prev):
                a = json.load(open(os.path.join(prev, name, "attempt.json")))
                if a.get("attempt_number") == k:
                    assert a.get("failure_class") == "infrastructure", ("an earlier attempt", a)
    nodes[d["node"]] = nodes.get(d["node"], 0) + 1
    adir = os.path.join(job, d["output_path"].rsplit("/", 1)[0])
    a = json.load(open(os.path.join(adir, "attempt.json")))
    cmd = a["command"]
    assert cmd[:3] == [python, runner, "--config"], ("the command is esd-dj's", cmd[:3])
    log = open(os.path.join(adir, "process.log"), errors="replace").read()
    assert "esd-dj: Ray Data preserve_order is on" in log, ("esd-dj's notice", adir)
    files = max(files, len(os.listdir(os.path.join(adir, "ray-output.jsonl"))))
    # (the processor's run: a shard claimed ahead waits for its slot, and
    # the last one's result is published beside the next)
    spans.append((a["started_at_epoch"], a["processor_ended_at_epoch"]))
spans.sort()
# (each epoch is converted from the monotonic clock at its own moment:
# a tenth of a second is not an overlap)
overlap = any(b[0] < a[1] - 0.1 for a, b in zip(spans, spans[1:]))
print(",".join("%s:%d" % kv for kv in sorted(nodes.items())), files, int(overlap))
EOF
}
out=$(shape 1) || fail "run 1: one done record per shard, attempt 1, run by esd-dj"
read -r nodes1 files1 overlap1 <<<"$out"
out=$(shape 2) || fail "run 2: one done record per shard, attempt 1, run by esd-dj"
read -r nodes2 files2 overlap2 <<<"$out"
ok "every attempt ran $DJ_PYTHON $RUNNER (shards: run 1 $nodes1, run 2 $nodes2)"
{ [ "$nodes1" = a:2 ] && [ "$overlap1" = 0 ]; } ||
    fail "run 1 ran on esd a alone, one attempt at a time" "$nodes1 $overlap1"
[ "$overlap2" = 1 ] || fail "run 2 ran attempts at the same time" "$nodes2"
ok "run 1: one attempt at a time on a; run 2: attempts at the same time ($nodes2)"
{ [ "$files1" -ge 3 ] && [ "$files2" -ge 3 ]; } ||
    fail "an attempt's ray-output.jsonl holds several files (several Ray blocks)" \
        "run 1: $files1, run 2: $files2"
ok "Ray wrote a shard as several files (up to $files1 and $files2 an attempt)"

# ---- the merged outputs ----
# The recipe in plain Python: the text cut at every blank line ("\n\n",
# empty pieces dropped), then each piece through cpu_text_model's recipe
# (tests/tools/cpu_text_model.py), the other fields copied.
python3 - "$W/data.jsonl" "$W/run1/job/merged.jsonl" <<'EOF' || fail "run 1's merged rows are the recipe applied to the input, in input order"
import json, os, re, sys
sys.path.insert(0, os.environ["TOP"] + "/tests/tools")
from cpu_text_model import recipe
src = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
got = [json.loads(l) for l in open(sys.argv[2], encoding="utf-8")]
want = []
for r in src:
    for piece in re.split(r"\n\n", r["text"]):
        t = recipe(piece) if piece.strip() else None
        if t is not None:
            want.append(dict(r, text=t))
ids = [g["id"] for g in got]
assert ids == sorted(ids), "the ids are not in input order"
split = sum(1 for a, b in zip(ids, ids[1:]) if a == b)
dropped = len(src) - len(set(ids))
assert split > 0 and dropped > 0, ("the recipe splits and drops", split, dropped)
assert len(got) == len(want), (len(got), len(want))
for g, w in zip(got, want):
    stats = g.pop("__dj__stats__", None)
    assert g == w, (g, w)
    assert stats and stats.get("text_len") == len(w["text"]), (w["id"], stats)
print("# %d rows from %d records: %d extra pieces of split records, %d records dropped"
      % (len(got), len(src), split, dropped))
EOF
ok "run 1's merged rows are the recipe applied to the input, in input order"
cmp -s "$W/run1/job/merged.jsonl" "$W/run2/job/merged.jsonl" ||
    fail "the two runs' merged outputs are byte-identical" \
        "$(cmp "$W/run1/job/merged.jsonl" "$W/run2/job/merged.jsonl" 2>&1)"
ok "the two runs' merged outputs are byte-identical (sha256 $(sha256sum <"$W/run1/job/merged.jsonl" | cut -c1-16)…)"

for n in a b; do
    stop_daemon "$n"
    [ "$DRC" -eq 0 ] || fail "esd $n exits 0 after SIGTERM" "exit status $DRC"
done
ok "both daemons exit 0 after SIGTERM"
echo "# real_order: $(($(date +%s) - T0)) s in all"
summary
