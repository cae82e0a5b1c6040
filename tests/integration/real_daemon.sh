#!/usr/bin/env bash
# real_daemon: two esd daemons on the real stack, end to end. Each keeps its
# own persistent Ray head (ray.mode persistent, free ports of its own,
# .venv's ray) and runs .venv's dj-process; a 4-shard job of the sample
# text (300 records) with the bundled recipe etc/recipes/cpu-text.yaml is
# registered through the spool and worked by both. Checks:
#   - the job completes: every shard has one done record (attempt 1, done
#     by a or b, on that node's head), finalize.json says complete and the
#     merged output is valid JSONL (libesd's validator) whose rows are the
#     recipe applied to the input, computed independently in plain Python
#     (same ids in input order, same texts, other fields kept); every
#     attempt was forked by its node's warm processor (esd's log);
#   - both daemons report their head up on 127.0.0.1:<its port>, up once
#     or, when the real Ray died under load, again after a restart esd
#     logged (an attempt it cost retried as an infrastructure failure), and
#     the job complete;
#   - after SIGTERM both exit 0, their heads stopped without a SIGKILL,
#     and nothing of the heads is left (their process groups, their
#     descendants, anything naming their temp dirs).
# Run as root, the job belongs to nobody (give_job) and the daemons run as
# nobody too (lib.bash's DAEMON_AS), ARCHITECTURE.md's service-user deployment:
# the heads, the attempts and Ray's workers all run as nobody, who owns the
# job. (esd refuses ray.mode persistent as root: a head of root's would run
# every recipe as root, and an attempt of another user could use neither
# its token nor its session files; daemon_ray.sh checks the refusal.)
# Run as another user, the daemons and the job are that user's.
# Skips when .venv (scripts/venv) is not installed.
set -euo pipefail
export LC_ALL=C
# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

need_real_stack
{ [ -x "$ESD" ] && [ -x "$ESCTL" ] && [ -x "$TOOLS/jsonl-check" ]; } ||
    fail "tools exist" "run make && make tools"
T0=$(date +%s)
new_workdir
unset_knobs RAY_ADDRESS RAY_AUTH_MODE RAY_AUTH_TOKEN_PATH
export RAY_USAGE_STATS_ENABLED=0
RAY=$VENV/bin/ray
DJ=$VENV/bin/dj-process
real_stack_as_nobody
[ "$(id -u)" -ne 0 ] || echo "# as root: the job belongs to nobody, and esd runs as nobody"
RECIPE=$TOP/etc/recipes/cpu-text.yaml
SAMPLE=$TOP/tests/data/text-sample.jsonl
JOB=$W/job
NODES=(a b)

# ---- ports: the GCS port of each head, and the ports Ray would otherwise
# take at fixed defaults (8265, 52365), which two heads on one
# machine (or another test's head) would fight over. All bound at once, so
# they are distinct; free when chosen.
free_ports 12
declare -A PORT=()
i=0
for n in "${NODES[@]}"; do
    PORT[$n]=${PORTS[i]}
    real_conf "$n" "$i" slots=1 lease_secs=30 poll_interval_secs=1
    i=$((i + 6))
done

# ---- the job, registered before the heads are up: claims wait for them ----
"$ESCTL" prepare --local --config "$RECIPE" --dataset-path "$SAMPLE" --job-dir "$JOB" \
    --num-shards 4 --processor "$DJ" >"$W/prepare.out" 2>&1 ||
    fail "prepare the sample into 4 shards" "$(cat "$W/prepare.out")"
give_job "$JOB"
ok "prepared $(wc -l <"$SAMPLE") records into 4 shards (owner $(stat -c %U "$JOB"))"
for n in "${NODES[@]}"; do start_real "$n"; done
spool_job "$JOB"
ok "esd a and b answer ping; the job is in the spool"

heads_up "${NODES[@]}"
ok "both heads are up ($(($(date +%s) - T0)) s after the start)"

# ---- the job completes ----
complete() {
    [ -f "$JOB/merged.jsonl" ] && [ -f "$JOB/state/esd/finalize.json" ] &&
        [ "$(py 'j["status"]' "$JOB/state/esd/finalize.json")" = complete ]
}
progress() {
    local n
    for n in "${NODES[@]}"; do
        echo "esd $n: $(tail -n 5 "$W/$n/log")"
    done
    echo "done records: $(count "$JOB/state/done"), failed records: $(count "$JOB/state/failed")"
    tail -n 20 "$JOB"/attempts/*/*/process.log 2>/dev/null | tail -n 40
}
deadline=$(($(date +%s) + 300))
until complete; do
    if [ "$(date +%s)" -gt "$deadline" ] || [ "$(count "$JOB/state/failed")" -gt 0 ]; then
        mapfile -t lines < <(progress)
        fail "the job completes within 300 s" "${lines[@]}"
    fi
    sleep 0.5
done
ok "the job is complete: merged.jsonl and finalize.json ($(($(date +%s) - T0)) s after the start)"

# every shard: one done record, by a or b, on its own node's head; attempt 1,
# unless the real Ray died under an attempt (it can, on a busy machine) and
# esd logged the head's restart after it had been up: then a shard of that
# node may have later attempts, every one before the last an infrastructure
# failure (esd's retry): lib.bash's ray_restarted_nodes.
split=$(python3 - "$JOB" "${PORT[a]}" "${PORT[b]}" "$(ray_restarted_nodes "${NODES[@]}")" <<'EOF'
import json, os, sys
job, ports = sys.argv[1], {"a": sys.argv[2], "b": sys.argv[3]}
restarted = sys.argv[4].split()
m = json.load(open(os.path.join(job, "manifest.json")))
ids = [s["id"] for s in m["shards"]]
assert len(ids) == 4, ids
done = sorted(f[:-5] for f in os.listdir(os.path.join(job, "state/done")))
assert done == sorted(ids), ("done records", done, ids)
nodes, attempts = {}, 0
for i in ids:
    d = json.load(open(os.path.join(job, "state/done", i + ".json")))
    assert d["status"] == "done" and d["shard_id"] == i, d
    assert d["node"] in ports, d["node"]
    dirs = sorted(os.listdir(os.path.join(job, "attempts", i)))
    assert d["attempt_number"] == len(dirs), (i, d, dirs)
    assert len(dirs) == 1 or d["node"] in restarted, ("a retry without a head restart", i, dirs)
    for early in dirs[:-1]:
        a = json.load(open(os.path.join(job, "attempts", i, early, "attempt.json")))
        assert a.get("failure_class") == "infrastructure", ("an earlier attempt", i, early, a)
    attempts += len(dirs)
    adir = os.path.join(job, "attempts", i, dirs[-1])
    cmd = json.load(open(os.path.join(adir, "attempt.json")))["command"]
    addr = cmd[cmd.index("--ray_address") + 1]
    assert addr == "127.0.0.1:" + ports[d["node"]], (i, d["node"], addr)
    log = open(os.path.join(adir, "process.log"), errors="replace").read()
    assert "Connecting to existing Ray cluster" in log, (i, log[-2000:])
    nodes[d["node"]] = nodes.get(d["node"], 0) + 1
print(attempts, " ".join("%s:%d" % kv for kv in sorted(nodes.items())))
EOF
) || fail "one done record per shard, attempt 1 (or retries after a logged head restart)," \
    "on the head of the node that ran it"
ATTEMPTS=${split%% *}
ok "one done record per shard, each run on its node's own head, $ATTEMPTS attempts" \
    "(shards: ${split#* }; heads up again after a restart: $(ray_restarted_nodes "${NODES[@]}"))"
# Data-Juicer's own processor (a dj-process): each attempt a fork of its
# node's warm processor (data_juicer.warm's default)
nf=$(cat "$W/a/log" "$W/b/log" | grep -c 'forked by the warm processor' || true)
[ "$nf" -eq "$ATTEMPTS" ] || fail "the $ATTEMPTS attempts were forked by their node's warm processor" "$nf were" \
    "$(grep -h -E 'warm processor|started ' "$W/a/log" "$W/b/log")"
ok "the $ATTEMPTS attempts were forked by their node's warm processor"
[ "$(count "$JOB/state/locks")" -eq 0 ] || fail "no lock left" "$(ls "$JOB/state/locks")"
ok "no lock left"

# the merged output: valid JSONL, the recipe applied to the input
verdicts=$("$TOOLS/jsonl-check" <"$JOB/merged.jsonl" | sort | uniq -c)
[ "$(awk '{print $2}' <<<"$verdicts")" = ok ] || fail "merged.jsonl is valid JSONL" "$verdicts"
ok "merged.jsonl is valid JSONL ($(wc -l <"$JOB/merged.jsonl") records)"
[ "$(py 'j["rows"]' "$JOB/state/esd/finalize.json")" = "$(wc -l <"$JOB/merged.jsonl")" ] ||
    fail "finalize.json counts the merged rows" "$(cat "$JOB/state/esd/finalize.json")"
# The recipe's five operators, written from their documented behaviour
# with the standard library only: whitespace normalised (every blank but a
# newline becomes a space, ends stripped), links and e-mail addresses
# removed, a sentence (ended by . ! ? 。！？, or by a closing quote after
# one) repeated within a record kept once (compared on its ASCII letters,
# digits, CJK ideographs and spaces, when at least 2 of them), texts
# shorter than 20 characters dropped.
python3 - "$SAMPLE" "$JOB/merged.jsonl" <<'EOF' || fail "the merged rows are the recipe applied to the input"
import json, os, re, sys
sys.path.insert(0, os.environ["TOP"] + "/tests/tools")
from cpu_text_model import recipe
src = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8")]
want = [dict(r, text=recipe(r["text"])) for r in src if recipe(r["text"]) is not None]
got = [json.loads(l) for l in open(sys.argv[2], encoding="utf-8")]
# documented in the recipe: the sample keeps 256 of its 300 records
assert (len(src), len(want)) == (300, 256), ("the model of the recipe", len(src), len(want))
assert [r["id"] for r in got] == [r["id"] for r in want], \
    ("ids", sorted(set(r["id"] for r in got) ^ set(r["id"] for r in want)))
for g, w in zip(got, want):
    stats = g.pop("__dj__stats__", None)
    assert g == w, (g, w)
    assert stats and stats.get("text_len") == len(w["text"]), (w["id"], stats)
EOF
ok "the merged rows are the recipe applied to the input: the same 256 ids in input order, the same texts"

# ---- both daemons: the head up on their own port ----
# (A head may die on a loaded machine, the real Ray's doing, while it
# starts or after it was up: esd restarts it. What is checked is esd's
# part: every time the head came up again followed a restart esd logged,
# and the attempts the dead head cost were retried as infrastructure
# failures, checked above; the job's output is checked in full either way.)
job_complete_on() {
    dstatus "$1"
    [ "$(py '[x["state"] for x in j["jobs"]]' "$W/$1/status.json")" = "['complete']" ]
}
for n in "${NODES[@]}"; do
    dstatus "$n"
    got=$(py '"%s %s" % (j["ray"]["state"], j["ray"].get("address"))' "$W/$n/status.json")
    [ "$got" = "up 127.0.0.1:${PORT[$n]}" ] ||
        fail "esd $n reports its head up on 127.0.0.1:${PORT[$n]}" "$got"
    # Up once; or, if the real Ray died after it was up, every further "up"
    # follows a restart esd logged (the head's exit or its failed check).
    ups=$(ray_heads_up "$n")
    downs=$(ray_restarts_logged "$n")
    [ "$ups" -ge 1 ] && [ $((ups - 1)) -le "$downs" ] ||
        fail "esd $n had its head up once, or again only after a restart it logged" \
            "$(grep 'ray head' "$W/$n/log")"
    # (the node that did not merge sees finalize.json at its next poll)
    wait_for "esd $n sees the job complete" 20 job_complete_on "$n"
done
ok "esd a and b: ray up on 127.0.0.1:${PORT[a]} and :${PORT[b]}, up (once, or again after a logged restart), job complete"

# ---- stop: both exit 0, nothing of their heads is left ----
# ray_procs PGID TEMP_DIR: the live processes of a head: its process group,
# the processes below its `ray start` (pid PGID), anything naming its temp
# dir (zombies, which a container's init may never reap, do not count).
ray_procs() {
    local pg=$1 tmp=$2 p
    {
        pgrep -g "$pg" || true
        descendants "$pg"
        pgrep -f -- "$tmp" || true
    } | sort -u | while read -r p; do
        ! alive "$p" || echo "$p"
    done
}
declare -A BEFORE=()
for n in "${NODES[@]}"; do
    BEFORE[$n]=$(ray_procs "$(head_pgid "$n")" "$W/$n/state/ray" | wc -l)
    [ "${BEFORE[$n]}" -ge 3 ] || fail "esd $n's head has its processes" "${BEFORE[$n]}"
done
t=$(date +%s)
kill -TERM "${DPID[a]}" "${DPID[b]}"
for n in "${NODES[@]}"; do
    wait_for "esd $n exits after SIGTERM" 60 dead "${DPID[$n]}"
    DRC=0
    { wait "${DPID[$n]}"; } 2>/dev/null || DRC=$?
    [ "$DRC" -eq 0 ] || fail "esd $n exits 0 after SIGTERM" "exit status $DRC" \
        "$(tail -n 20 "$W/$n/log")"
done
ok "esd a and b exit 0 after SIGTERM ($(($(date +%s) - t)) s)"
for n in "${NODES[@]}"; do
    ! grep -q 'sending SIGKILL' "$W/$n/log" ||
        fail "esd $n's head stops on SIGTERM" "$(grep 'ray head' "$W/$n/log")"
done
ok "both heads stopped on SIGTERM, without SIGKILL (Ray's own drain is off)"
for n in "${NODES[@]}"; do
    left=$(ray_procs "$(head_pgid "$n")" "$W/$n/state/ray")
    [ -z "$left" ] || fail "nothing of esd $n's head is left" \
        "$(ps -o pid,pgid,user,stat,args -p "$(tr '\n' ',' <<<"$left" | sed 's/,$//')")"
done
ok "nothing of either head is left (${BEFORE[a]} and ${BEFORE[b]} processes before the stop)"
echo "# real_daemon: $(($(date +%s) - T0)) s in all"
summary
