#!/usr/bin/env bash
# demo: scripts/demo, the newcomer's `make demo`, end to end.
#   (a) STANDIN=1 (the test stand-in mini-dj, ray.mode off), with
#       DEMO_KEEP=1 so that its workspace can be checked: exit 0; the
#       output says it uses the stand-in and not Data-Juicer, that the
#       dataset comes from a fixed seed, and prints the merged rows, the
#       shards per node and where the logs are; the merged row count is
#       the number of input records the recipe keeps, computed here
#       independently from the demo's dataset, and the merged output is
#       byte for byte the expected one (lib.bash's expect_merged); both
#       nodes did shards (their done records); both daemons exited 0 and
#       nothing runs from the workspace any more.
#   (b) `make demo STANDIN=1` without DEMO_KEEP: exit 0, the workspace is
#       removed; the same dataset (fixed seed) is generated again.
#   (c) interrupted (SIGTERM to its process group, as Ctrl-C would reach
#       it) while the job runs: exit 130, nothing left running, the
#       workspace removed. A bad setting fails at once with exit 1.
#   (d) the real Data-Juicer and Ray, when .venv exists (scripts/venv;
#       .ci/run installs it before `make check`): exit 0, two Ray heads,
#       the merged rows are etc/recipes/cpu-text.yaml applied to the
#       dataset (computed independently in plain Python, as real_daemon.sh
#       does; in shard order, rows within a shard in Ray's block order),
#       both nodes did shards, nothing left running. About 75 s here;
#       not again under SANITIZE (real_daemon.sh covers that).
#
# Environment: TOP, ESCTL, ESD, TOOLS (see lib.bash); DEMO_REAL=0 skips (d).
set -euo pipefail
export LC_ALL=C
# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

new_workdir
unset_knobs DEMO_KEEP DEMO_DIR DEMO_ROWS DEMO_SHARDS STANDIN
need_daemon_tools
# run as root, the demo's daemons run as nobody, who must reach DEMO_DIR
chmod 755 "$W"
DEMO=$TOP/scripts/demo
export ESD ESCTL TOOLS

# run_demo LOG ENV...: runs the demo with ENV, output in LOG, status in DRC
run_demo() {
    local log=$1
    shift
    DRC=0
    env "$@" "$DEMO" >"$log" 2>&1 </dev/null || DRC=$?
}
# left DIR: the live processes whose command line names DIR
left() {
    local p
    for p in $(pgrep -f -- "$1" || true); do
        [ "$p" = $$ ] || ! alive "$p" || ps -o pid=,user=,args= -p "$p" || true
    done
}
# line LOG PREFIX: the demo's output line starting with PREFIX
line() { grep -m1 "^$2" "$1" || fail "the demo prints '$2...'" "$(tail -n 30 "$1")"; }

# ---- (a) the stand-in, kept ----
D=$W/standin
T=$(date +%s)
run_demo "$W/standin.out" STANDIN=1 DEMO_KEEP=1 DEMO_DIR="$D"
[ "$DRC" -eq 0 ] || fail "STANDIN=1 scripts/demo exits 0" "exit status $DRC" "$(tail -n 40 "$W/standin.out")"
ok "STANDIN=1 scripts/demo exits 0 ($(($(date +%s) - T)) s)"
for want in "STAND-IN MODE" "NOT Data-Juicer" "generated from a fixed seed by tests/tools/gen-text-sample" \
    "submit \$W/jobs/demo --everywhere --config" "status --watch" "--shard part-00000-of-00008" \
    "$D/node-a/esd.log" "$D/node-b/esd.log" "node-a: esd exited 0" "node-b: esd exited 0" \
    "demo: OK in" "(STAND-IN mode: mini-dj, not Data-Juicer)"; do
    grep -qF -- "$want" "$W/standin.out" || fail "the demo's output says: $want" "$(cat "$W/standin.out")"
done
ok "it says it uses the stand-in, not Data-Juicer; shows submit, status --watch, logs --shard, the daemon logs"
[ -z "$(left "$D")" ] || fail "nothing runs from the demo's workspace" "$(left "$D")"
ok "nothing runs from the demo's workspace after it"

# every key the demo's esd.yaml files set is one esd lists (esd --help-config)
"$ESD" --help-config | cut -f1 | sort >"$W/keys"
for n in node-a node-b; do
    python3 - "$D/$n/esd.yaml" <<'EOF' | sort >"$W/demo-keys"
import re, sys
sec = ""
for line in open(sys.argv[1]):
    m = re.match(r"^( *)([a-z_]+):", line)
    if m and m.group(1):
        print(sec + "." + m.group(2))
    elif m:
        sec = m.group(2)
        print(sec)
EOF
    unknown=$(comm -23 "$W/demo-keys" "$W/keys" | grep -vxE 'ray|metrics|log|data_juicer' || true)
    [ -z "$unknown" ] || fail "the demo's $n/esd.yaml sets only keys of esd --help-config" "$unknown"
done
ok "the demo's esd.yaml files set only keys that esd --help-config lists"

# the recipe the demo says it ran, and the rows it keeps, computed here
{ grep -q '^  - whitespace_normalization_mapper:$' "$D/recipe.yaml" &&
    grep -q '^  - text_length_filter:$' "$D/recipe.yaml" &&
    grep -q '^      min_len: 20$' "$D/recipe.yaml"; } ||
    fail "the stand-in recipe is whitespace_normalization_mapper, text_length_filter min_len 20" \
        "$(cat "$D/recipe.yaml")"
cp "$D/data.jsonl" "$W/data.jsonl"
# mini-dj's operators (tests/tools/mini-dj.c): every run of its whitespace
# becomes one space, ends stripped; texts under 20 code points dropped.
# An edited record is the input's bytes with the new text as
# json.dumps(ensure_ascii=False) writes it; the demo's records are
# json.dumps(ensure_ascii=False) lines, so dumping them again gives them.
python3 - "$W" <<'EOF' || fail "the expected rows of the stand-in recipe"
import json, re, sys
w = sys.argv[1]
WS = "[\t\n\v\f\r \u0084\u0085\u00a0\u1680\u2000-\u200d\u2028\u2029\u202f\u205f\u2060\u3000\ufeff\ufffc]+"
with open(w + "/data.jsonl", encoding="utf-8") as f, \
     open(w + "/expected.jsonl", "w", encoding="utf-8") as e, open(w + "/kept.txt", "w") as k:
    for line in f:
        rec = json.loads(line)
        assert json.dumps(rec, ensure_ascii=False) + "\n" == line, line
        text = re.sub(WS, " ", rec["text"]).strip(" ")
        keep = len(text) >= 20
        if keep:
            rec["text"] = text
            e.write(json.dumps(rec, ensure_ascii=False) + "\n")
        k.write("%d\n" % keep)
EOF
inputs=$(wc -l <"$W/data.jsonl")
kept=$(wc -l <"$W/expected.jsonl")
{ [ "$kept" -gt 0 ] && [ "$kept" -lt "$inputs" ]; } || fail "the recipe keeps some records and drops some" "$kept of $inputs"
got=$(line "$W/standin.out" "merged rows: ")
[ "$got" = "merged rows: $kept of $inputs input records (the recipe dropped $((inputs - kept)))" ] ||
    fail "the demo's merged rows are the records the recipe keeps ($kept of $inputs)" "$got"
ok "merged rows: $kept of $inputs, as computed here from the demo's dataset"
JOB=$D/jobs/demo
expect_merged "$JOB" "$W/expected-merged.jsonl" || fail "the expected merge"
cmp "$JOB/merged.jsonl" "$W/expected-merged.jsonl" || fail "the merged output is the expected one"
ok "the merged output is byte for byte the expected one"

split=$(python3 - "$JOB" <<'EOF'
import json, os, sys
job = sys.argv[1]
ids = [s["id"] for s in json.load(open(os.path.join(job, "manifest.json")))["shards"]]
count = {}
for i in ids:
    d = json.load(open(os.path.join(job, "state/done", i + ".json")))
    count[d["node"]] = count.get(d["node"], 0) + 1
print(", ".join("%s %d" % kv for kv in sorted(count.items())))
EOF
) || fail "every shard has a done record"
[[ $split =~ ^node-a\ [1-9][0-9]*,\ node-b\ [1-9][0-9]*$ ]] || fail "both nodes did shards" "$split"
got=$(line "$W/standin.out" "shards per node: ")
[[ $got == "shards per node: $split "* ]] || fail "the demo's shards per node are the done records' ($split)" "$got"
ok "both nodes did shards, as the demo says: $split"

# ---- (b) make demo STANDIN=1, not kept: the workspace goes; the same
# dataset again ----
D2=$W/standin2
# (the make of this run, whose SANITIZE make exports, not its jobserver)
DRC=0
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL DEMO_DIR="$D2" \
    make -s -C "$TOP" demo STANDIN=1 ${SANITIZE:+SANITIZE=$SANITIZE} >"$W/standin2.out" 2>&1 </dev/null ||
    DRC=$?
[ "$DRC" -eq 0 ] || fail "make demo STANDIN=1 exits 0" "exit status $DRC" "$(tail -n 40 "$W/standin2.out")"
grep -q "STAND-IN MODE" "$W/standin2.out" || fail "make demo STANDIN=1 runs the stand-in" "$(cat "$W/standin2.out")"
[ ! -e "$D2" ] || fail "without DEMO_KEEP the workspace is removed" "$(ls "$D2")"
[ -z "$(left "$D2")" ] || fail "nothing runs from the second workspace" "$(left "$D2")"
{ [ "$(line "$W/standin2.out" "merged rows: ")" = "$(line "$W/standin.out" "merged rows: ")" ] &&
    [ "$(line "$W/standin2.out" "merged output: " | sed 's/.*(//')" = \
        "$(line "$W/standin.out" "merged output: " | sed 's/.*(//')" ]; } ||
    fail "the same dataset (fixed seed) gives the same merged output" \
        "$(grep '^merged' "$W/standin.out" "$W/standin2.out")"
ok "make demo STANDIN=1 without DEMO_KEEP: exit 0, the workspace removed, the same merged rows and SHA-256"

# ---- (c) interrupted, and a bad setting ----
D3=$W/interrupted
# (setsid: its own process group, which the demo's daemons share, as a
# terminal's Ctrl-C reaches all of them; 5 s a shard)
setsid env STANDIN=1 DEMO_DIR="$D3" DEMO_ROWS=20000 "$DEMO" >"$W/int.out" 2>&1 </dev/null &
IPID=$!
BG+=("$IPID")
watching() {
    alive "$IPID" || fail "the demo is interrupted while it watches the job" "it ended first" "$(cat "$W/int.out")"
    grep -q 'watching the job' "$W/int.out"
}
wait_for "the demo watches the job" 60 watching
sleep 1
kill -TERM -- "-$IPID"
wait_for "the interrupted demo exits" 90 dead "$IPID"
DRC=0
{ wait "$IPID"; } 2>/dev/null || DRC=$?
[ "$DRC" -eq 130 ] || fail "the interrupted demo exits 130" "exit status $DRC" "$(tail -n 30 "$W/int.out")"
grep -q 'demo: interrupted' "$W/int.out" || fail "it says it was interrupted" "$(tail -n 30 "$W/int.out")"
! grep -q 'demo: OK' "$W/int.out" || fail "it does not say OK" "$(tail -n 30 "$W/int.out")"
[ -z "$(left "$D3")" ] || fail "nothing runs from the interrupted demo's workspace" "$(left "$D3")"
[ ! -e "$D3" ] || fail "the interrupted demo's workspace is removed" "$(ls "$D3")"
ok "interrupted while it watches the job: exit 130, both daemons stopped, nothing left, workspace removed"
run_demo "$W/bad.out" STANDIN=1 DEMO_DIR="$W/bad" DEMO_SHARDS=1
{ [ "$DRC" -eq 1 ] && grep -q '^demo: FAILED: DEMO_SHARDS must be at least 2' "$W/bad.out"; } ||
    fail "DEMO_SHARDS=1 fails with exit 1 and says why" "exit status $DRC" "$(cat "$W/bad.out")"
[ ! -e "$W/bad" ] || fail "a failed demo leaves no workspace" "$(ls "$W/bad")"
ok "DEMO_SHARDS=1: exit 1, 'demo: FAILED: DEMO_SHARDS must be at least 2 ...', nothing left"

# ---- (d) the real Data-Juicer and Ray ----
VENV=${ESD_VENV:-$TOP/.venv}
if [ "${DEMO_REAL:-1}" = 0 ]; then
    echo "# skipped the real demo: DEMO_REAL=0"
elif [ -n "${SANITIZE:-}" ]; then
    # (real_daemon.sh runs daemons on the real stack under the sanitizers)
    echo "# skipped the real demo: run by the plain make check, not again under SANITIZE=$SANITIZE"
elif [ ! -x "$VENV/bin/dj-process" ] || [ ! -x "$VENV/bin/ray" ]; then
    echo "# skipped the real demo: the real Data-Juicer and Ray are not installed (run scripts/venv)"
else
    D4=$W/real
    T=$(date +%s)
    run_demo "$W/real.out" DEMO_KEEP=1 DEMO_DIR="$D4"
    [ "$DRC" -eq 0 ] || fail "scripts/demo (real Data-Juicer and Ray) exits 0" "exit status $DRC" \
        "$(grep -v 'shards done' "$W/real.out" | tail -n 40)"
    ok "scripts/demo on the real Data-Juicer and Ray exits 0 ($(($(date +%s) - T)) s)"
    ! grep -qi 'stand-in' "$W/real.out" || fail "the real demo does not mention the stand-in"
    [ "$(grep -c 'Ray head up at 127.0.0.1:' "$W/real.out")" -eq 2 ] ||
        fail "both nodes' Ray heads came up" "$(grep -i 'ray' "$W/real.out")"
    [ -z "$(left "$D4")" ] || fail "nothing runs from the real demo's workspace" "$(left "$D4")"
    ok "two Ray heads; both daemons exited 0; nothing runs from the workspace (no head, no attempt)"
    JOB=$D4/jobs/demo
    # etc/recipes/cpu-text.yaml's five operators from their documented
    # behaviour (the model of real_daemon.sh): whitespace normalised (every
    # blank but a newline becomes a space, ends stripped), links and e-mail
    # addresses removed, a sentence repeated within a record kept once,
    # texts shorter than 20 characters dropped. Ray writes a shard's rows in
    # its blocks' order, so rows are compared by id, and the shards' order
    # is checked on its own.
    kept=$(python3 - "$D4/data.jsonl" "$JOB" <<'EOF'
import json, os, re, sys
sys.path.insert(0, os.environ["TOP"] + "/tests/tools")
from cpu_text_model import recipe
data, job = sys.argv[1:]
src = [json.loads(l) for l in open(data, encoding="utf-8")]
want = [dict(r, text=recipe(r["text"])) for r in src if recipe(r["text"]) is not None]
got = [json.loads(l) for l in open(os.path.join(job, "merged.jsonl"), encoding="utf-8")]
assert len(got) == len(want), ("rows", len(got), len(want))
# shard k holds the input records [start_k, start_k + rows_k), ids = line numbers
shards = sorted(json.load(open(os.path.join(job, "manifest.json")))["shards"], key=lambda s: s["index"])
bounds, start = [], 0
for s in shards:
    start += s["rows"]
    bounds.append(start)
which = [next(k for k, b in enumerate(bounds) if r["id"] < b) for r in got]
assert which == sorted(which), "the merged output keeps the shards' order"
got.sort(key=lambda r: r["id"])
assert [r["id"] for r in got] == [r["id"] for r in want], "the same ids"
for g, w in zip(got, want):
    stats = g.pop("__dj__stats__", None)
    assert g == w, (g, w)
    assert stats and stats.get("text_len") == len(w["text"]), (w["id"], stats)
print("%d of %d" % (len(want), len(src)))
EOF
    ) || fail "the real demo's merged rows are the recipe applied to its dataset"
    got=$(line "$W/real.out" "merged rows: ")
    [[ $got == "merged rows: $kept input records "* ]] ||
        fail "the real demo's merged rows are the records the recipe keeps ($kept)" "$got"
    ok "merged rows: $kept, the recipe applied to the dataset here, in shard order, the same texts"
    got=$(line "$W/real.out" "shards per node: ")
    [[ $got =~ ^shards\ per\ node:\ node-a\ [1-9][0-9]*,\ node-b\ [1-9][0-9]*\  ]] ||
        fail "both nodes did shards of the real demo" "$got"
    ok "both nodes did shards: ${got#shards per node: }"
fi
summary
