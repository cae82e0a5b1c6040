#!/usr/bin/env bash
# The real stack: Data-Juicer's dj-process on a real, persistent Ray head
# (`ray start --head --block` with a port, a temp dir and an auth token of
# its own, so it can never join another cluster), driven by esd's engine
# through `esctl worker`; then the same shard with `--ray_address local`
# (Ray started per attempt, the reference's default) to measure what the
# persistent head saves. Checks the export layout Ray really writes, an
# all-filtered shard, the recorded Data-Juicer version and the version
# check. Skips when .venv (scripts/venv) is not installed.
set -euo pipefail
# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

need_real_stack
new_workdir
unset_knobs RAY_ADDRESS
RECIPE=$TOP/etc/recipes/cpu-text.yaml
SAMPLE=$TOP/tests/data/text-sample.jsonl
DJ=$VENV/bin/dj-process

# ---- one head for the whole script ----
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$W/ray"
python3 -c 'import secrets; print(secrets.token_hex(32))' >"$W/ray/token"
chmod 600 "$W/ray/token"
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH="$W/ray/token" RAY_USAGE_STATS_ENABLED=0
# its own session (and process group): the head's children must die with it
setsid "$VENV/bin/ray" start --head --block --port "$PORT" --temp-dir "$W/ray" \
    --node-ip-address 127.0.0.1 --include-dashboard=false --num-cpus 2 \
    --disable-usage-stats >"$W/ray.log" 2>&1 &
HEAD=$!
BG+=("$HEAD")
head_up() { "$VENV/bin/ray" status --address "127.0.0.1:$PORT" >/dev/null 2>&1; }
wait_for "the Ray head answers on 127.0.0.1:$PORT" 120 head_up
ok "a real Ray head is up on 127.0.0.1:$PORT with a token of its own"

# ---- prepare records the Data-Juicer version ----
want_version=$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("py-data-juicer"))')
run "$ESCTL" prepare --local --config "$RECIPE" --dataset-path "$SAMPLE" --job-dir "$W/job" \
    --num-shards 2 --processor "$DJ"
check "prepare the sample with the bundled recipe" 0
[ "$(py 'j["data_juicer"]["commit"]' "$W/job/manifest.json")" = "$want_version" ] ||
    fail "the manifest records the package version" \
        "$(py 'j["data_juicer"]' "$W/job/manifest.json")"
ok "the manifest records Data-Juicer $want_version"

# ---- two attempts on the persistent head ----
run "$ESCTL" worker --local "$W/job" --node real --processor "$DJ" \
    --ray-address "127.0.0.1:$PORT" --poll-interval-secs 1
check "a worker runs both shards through dj-process on the head" 0
grep -q "All 2 shards completed" <<<"$OUT" || fail "the worker saw the job complete" "$OUT"
for a in "$W"/job/attempts/*/*/; do
    grep -q -- "--ray_address" "$a/attempt.json" || fail "attempt.json records the command"
    grep -q "Connecting to existing Ray cluster" "$a/process.log" ||
        fail "the attempt used the persistent head" "$(tail -5 "$a/process.log")"
done
ok "each attempt connected to the persistent head (process.log)"
# Ray's export: one or more <dataset>_<task>_<block>.json files, nothing else
python3 - "$W/job" <<'EOF' || fail "the export layout is what Ray writes"
import glob, json, os, re, sys
job = sys.argv[1]
for done in glob.glob(job + "/state/done/*.json"):
    d = json.load(open(done))
    files = d["ray_output_files"]
    assert files, done
    for f in files:
        name = os.path.basename(f["path"])
        assert re.fullmatch(r"[0-9A-Za-z]+_[0-9a-f]{32}_\d{6}\.json", name), name
    export = os.path.join(job, os.path.dirname(files[0]["path"]))
    extra = [n for n in os.listdir(export) if not n.endswith(".json")]
    assert not extra, extra
EOF
ok "Ray writes <dataset>_<task>_<block>.json files and no _SUCCESS"
run "$ESCTL" merge --local "$W/job" --output "$W/merged.jsonl"
check "merge" 0
# the operators' effects, checked independently of Data-Juicer
python3 - "$SAMPLE" "$W/merged.jsonl" <<'EOF' || fail "the merged output is the recipe applied to the sample"
import json, re, sys
src = [json.loads(l) for l in open(sys.argv[1])]
out = [json.loads(l) for l in open(sys.argv[2])]
assert 0 < len(out) < len(src), (len(out), len(src))
ids = [r.get("id") for r in out]
assert ids == sorted(ids, key=[r.get("id") for r in src].index), "input order kept"
for r in out:
    t = r["text"]
    assert len(t) >= 20, t
    assert not re.search(r"https?://", t), t
    assert not re.search(r"[\w.+-]+@[\w-]+\.[\w.]+", t), t
    assert "__dj__stats__" in r
EOF
ok "merged $(wc -l <"$W/merged.jsonl") of $(wc -l <"$SAMPLE") records: short ones filtered, links and e-mails removed, order kept"
persistent=$(python3 -c '
import glob, json, sys
d = [json.load(open(p))["duration_secs"] for p in glob.glob(sys.argv[1] + "/attempts/*/*/attempt.json")]
print("%.1f" % (sum(d) / len(d)))' "$W/job")

# ---- the same shard with --ray_address local ----
run "$ESCTL" prepare --local --config "$RECIPE" --dataset-path "$SAMPLE" --job-dir "$W/local" \
    --num-shards 2 --processor "$DJ"
check "prepare a second job" 0
run "$ESCTL" worker --local "$W/local" --node local --processor "$DJ" --ray-address local \
    --max-shards 1
check "one attempt with --ray_address local (Ray started for the attempt)" 0
local_secs=$(python3 -c '
import glob, json, sys
d = [json.load(open(p))["duration_secs"] for p in glob.glob(sys.argv[1] + "/attempts/*/*/attempt.json")]
print("%.1f" % d[0])' "$W/local")
echo "# attempt time: persistent head ${persistent} s, --ray_address local ${local_secs} s"
ok "attempt time measured: persistent head ${persistent} s, local ${local_secs} s"

# ---- a shard whose rows are all filtered out ----
for i in 1 2 3; do echo "{\"id\":$i,\"text\":\"too short $i\"}"; done >"$W/short.jsonl"
run "$ESCTL" prepare --local --config "$RECIPE" --dataset-path "$W/short.jsonl" \
    --job-dir "$W/empty" --num-shards 1 --processor "$DJ"
check "prepare a job whose only shard filters to nothing" 0
run "$ESCTL" worker --local "$W/empty" --node real --processor "$DJ" \
    --ray-address "127.0.0.1:$PORT"
check "the all-filtered shard completes" 0
[ "$(py 'j["rows"]' "$W"/empty/state/done/*.json)" = 0 ] || fail "its result has 0 rows"
export_dir=$(dirname "$(py 'j["output_path"]' "$W"/empty/state/done/*.json)")
[ "$(count "$W/empty/$export_dir/ray-output.jsonl")" -eq 0 ] ||
    fail "Ray leaves an empty export directory" "$(ls -a "$W/empty/$export_dir/ray-output.jsonl")"
ok "an all-filtered shard: Ray leaves an empty export directory, esd publishes 0 rows"

# ---- the version check ----
python3 - "$W/local/manifest.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
m["data_juicer"]["commit"] = "0.0.1"
open(sys.argv[1], "w").write(json.dumps(m, indent=2, sort_keys=True) + "\n")
EOF
run "$ESCTL" worker --local "$W/local" --node v --processor "$DJ" --ray-address "127.0.0.1:$PORT" \
    --max-shards 1
check "a worker running another Data-Juicer refuses the job" 2 "" \
    "Data-Juicer version mismatch: job=0.0.1, worker=$want_version"
[ "$(count "$W/local/state/locks")" -eq 0 ] || fail "the refusing worker claimed nothing"
run "$ESCTL" worker --local "$W/local" --node v --processor "$DJ" --ray-address "127.0.0.1:$PORT" \
    --max-shards 1 --allow-version-mismatch
check "--allow-version-mismatch runs it anyway, with a warning" 0 "" "WARNING: Data-Juicer version mismatch"

# ---- the warm processor's forks draw their own Ray ids ----
# esd-dj --warm imports Ray and Data-Juicer once and forks each attempt:
# Ray's generator of random ids must not be seeded before the fork, or two
# attempts connecting at once make the same object (the second's ray.init
# then dies in WarmupStore). Two forks of its imports connect to the head
# at the same moment and each puts an object; a parent that drew an id
# before forking is refused by the warm processor's own check.
RUNNER=$(dirname "$(readlink -f "$ESD")")/esd-dj
[ -f "$RUNNER" ] || fail "esd-dj is built next to esd" "run make"
run "$VENV/bin/python" - "$RUNNER" "127.0.0.1:$PORT" <<'EOF'
import importlib.machinery, importlib.util, os, sys
loader = importlib.machinery.SourceFileLoader("esd_dj", sys.argv[1])
spec = importlib.util.spec_from_loader("esd_dj", loader)
m = importlib.util.module_from_spec(spec)
loader.exec_module(m)
m._import_all()
why = m._not_forkable()
assert why is None, why
go_r, go_w = os.pipe()
kids = []
for _ in range(2):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        rc = 1
        try:
            os.close(r)
            os.close(go_w)
            os.read(go_r, 1)  # (both connect at once)
            import ray
            ray.init(address=sys.argv[2], log_to_driver=False)
            ref = ray.put(os.getpid())
            assert ray.get(ref) == os.getpid()
            os.write(w, ref.binary())
            rc = 0
        finally:
            os._exit(rc)
    os.close(w)
    kids.append((pid, r))
os.close(go_w)
refs, codes = [], []
for pid, r in kids:
    with os.fdopen(r, "rb") as f:
        refs.append(f.read())
    codes.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
assert codes == [0, 0], ("both forks connected and put an object", codes)
assert refs[0] != refs[1], "distinct object ids"
from ray._raylet import ObjectID
ObjectID.from_random()  # (seeds the generator here, before the fork)
why = m._forks_share_ids()
assert why and "seeded before the fork" in why, why
print("refused:", why)
EOF
check "two forks of the warm processor's imports connect at once; a seeded parent is refused" 0 \
    "refused: Ray's random ids are seeded before the fork"

# ---- the head stops with its whole process group ----
kill -TERM -- "-$HEAD" 2>/dev/null || true
wait_for "the head's process group is gone" 60 group_gone "$HEAD"
ok "the head and every process it started stop with its process group"
summary
