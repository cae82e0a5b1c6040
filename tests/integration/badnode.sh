#!/usr/bin/env bash
# badnode: a bad node cannot fail a job. Real esd daemons (ray.mode off)
# on one job prepared with a processor that reports Data-Juicer 1.6.1. The
# processors are stand-ins: shell scripts named python3 that answer the
# version probe (python3 -c ...) with a version and otherwise run mini-dj
# (tests/tools/mini-dj.c, not Data-Juicer).
#   (a) a node whose processor reports 9.9.9 and one whose processor is a
#       shell wrapper (its version cannot be read) refuse the job: status
#       (load_error) and the log say why (a mismatch naming both versions;
#       "cannot be read" naming the wrapper), each said once in the log
#       over many rescans; neither creates an attempt.
#   (b) a healthy node h (1.6.1) and a bad node b (1.6.1, but every attempt
#       exits 1), max_retries 0: b's failures never make a shard terminally
#       failed while h lives (no failed record; shards b used up are done
#       by h); after 3 of b's failed shards were done by h, b stops claiming
#       the job and says why in status ("refused") and in its log, once,
#       and makes no attempt after that; the job completes and is merged,
#       every done record h's.
#   (c) the mismatched node restarted with data_juicer.allow_version_mismatch
#       works a second job.
#
# Environment: TOP, ESCTL, ESD, TOOLS (see lib.bash).
set -euo pipefail
export LC_ALL=C

# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

NSHARDS=20

new_workdir
unset_knobs
need_daemon_tools

# 12 rows a shard, 40 ms a row: half a second a shard on h, so that b
# fails several shards (its claims paused 1, 2, 4 s after failures in a
# row) before h is done
export MINI_DJ_SLEEP_MS=40
text_dataset 240

# fake_dj DIR VERSION: DIR/python3, a processor that says it runs VERSION.
fake_dj() {
    mkdir -p "$W/$1"
    # shellcheck disable=SC2016 # ($1 and $@ are the script's)
    printf '#!/bin/sh\nif [ "$1" = -c ]; then echo %s; exit 0; fi\nexec %s "$@"\n' "$2" "$MINI" \
        >"$W/$1/python3"
    chmod 755 "$W/$1/python3"
}
fake_dj good 1.6.1
fake_dj other 9.9.9
printf '#!/bin/sh\nexec %s "$@"\n' "$MINI" >"$W/wrap.sh"
chmod 755 "$W/wrap.sh" "$W"

J="$W/job"
"$ESCTL" prepare --local --config "$W/recipe.yaml" --dataset-path "$W/data.jsonl" --job-dir "$J" \
    --num-shards "$NSHARDS" --max-retries 0 --processor "$W/good/python3" >"$W/prepare.out" 2>&1 ||
    fail "prepare" "$(cat "$W/prepare.out")"
[ "$(py 'j["data_juicer"]["commit"]' "$J/manifest.json")" = 1.6.1 ] ||
    fail "the job records the processor's version" "$(cat "$J/manifest.json")"
ok "the job was prepared with Data-Juicer 1.6.1 (asked of the processor)"
give_job "$J"

# ---- (a) refused for a mismatched or an unreadable version ----
daemon_conf m processor="$W/other/python3"
daemon_conf u processor="$W/wrap.sh"
start_daemon m
start_daemon u
grep -q "Data-Juicer version here: 9.9.9" "$W/m/log" || fail "m logs its version" "$(head "$W/m/log")"
grep -q "the Data-Juicer version here cannot be read: the processor $W/wrap.sh is a script for /bin/sh" \
    "$W/u/log" || fail "u logs why its version cannot be read" "$(grep -i version "$W/u/log")"
ok "each node logs its version, or why it cannot be read"
spool_job "$J"
refused_m() { [[ $(job_field m "$J" 'x.get("load_error", "")') == *"version mismatch: job=1.6.1, worker=9.9.9"* ]]; }
refused_u() { [[ $(job_field u "$J" 'x.get("load_error", "")') == *"cannot be read on this node: the processor $W/wrap.sh is a script for /bin/sh"* ]]; }
wait_for "m's status says why it refuses the job" 20 refused_m
wait_for "u's status says why it refuses the job" 20 refused_u
ok "status: m refuses (version mismatch), u refuses (version unreadable)"

# ---- (b) a healthy node and one whose processor always fails ----
daemon_conf h processor="$W/good/python3"
daemon_conf b processor="$W/good/python3"
start_daemon h
# (h's first attempt runs before b starts: h is known alive)
h_started() { [ -n "$(find "$J/state/locks" "$J/state/done" -mindepth 1 -print -quit)" ]; }
wait_for "h claims a shard" 20 h_started
start_daemon b MINI_DJ_EXIT=1
stopped_b() { [[ $(job_field b "$J" 'x.get("refused", "")') == *"claims no more of this job"* ]]; }
finalized() { [ "$(py 'j["status"]' "$J/state/esd/finalize.json" 2>/dev/null)" = complete ]; }
wait_for "the job is merged" 60 finalized
ok "the job completed and was merged"
wait_for "b says it stopped claiming the job" 10 stopped_b
ok "status: b refuses the job (its failed shards were done elsewhere)"
left=$(python3 - "$J" <<'EOF'
import json, os, sys
job = sys.argv[1]
assert not os.listdir(os.path.join(job, "state/failed")), os.listdir(os.path.join(job, "state/failed"))
ids = [s["id"] for s in json.load(open(os.path.join(job, "manifest.json")))["shards"]]
used_up = 0
for i in ids:
    d = json.load(open(os.path.join(job, "state/done", i + ".json")))
    assert d["node"] == "h", (i, d["node"])
    atts = [json.load(open(os.path.join(job, "attempts", i, a, "attempt.json")))
            for a in os.listdir(os.path.join(job, "attempts", i))]
    bad = [a for a in atts if a["node"] == "b"]
    assert all(a["status"] == "failed" and a["failure_class"] == "processor" for a in bad), bad
    assert not [a for a in atts if a["node"] in ("m", "u")], i
    used_up += len(bad) >= 1
# every failure of b used up max_retries (0) of its shard, which h then did:
# at least the 3 after which b stopped
assert used_up >= 3, used_up
print(used_up)
EOF
) || fail "b's failures did not fail the job"
ok "no failed record; every done record is h's ($left shards b used up were left to h); b's attempts failed (processor), m and u made none"
grep -q "failed (processor), its retries used up by this node alone: left to the other nodes" \
    "$W/b/log" || fail "b logs that it left a shard whose retries it used up to the others"
ok "b logged the shards it left to the other nodes"
n=$(grep -c "claims no more of this job" "$W/b/log")
[ "$n" -eq 1 ] || fail "b logs once that it stopped claiming the job" "$n times"
python3 - "$J" "$W/b/log" <<'EOF' || fail "b made no attempt after it stopped"
import glob, json, sys, time
job, log = sys.argv[1:]
line = [l for l in open(log) if "claims no more of this job" in l][0]
stopped = time.mktime(time.strptime(line.split()[0].split(".")[0], "%Y-%m-%dT%H:%M:%S")) + 1
late = [a for a in map(lambda p: json.load(open(p)), glob.glob(job + "/attempts/*/*/attempt.json"))
        if a["node"] == "b" and a["claimed_at_epoch"] > stopped]
assert not late, late
EOF
ok "b logged once that it stopped claiming, and made no attempt since"
for n in m u; do
    c=$(grep -c "cannot work job $J: Data-Juicer version" "$W/$n/log")
    [ "$c" -eq 1 ] || fail "$n logs its refusal once over the rescans" "$c times"
done
ok "m and u each logged their refusal once"

# ---- (c) a mismatch allowed explicitly ----
stop_daemon m
daemon_conf m processor="$W/other/python3" data_juicer.allow_version_mismatch=true
start_daemon m
J2="$W/job2"
"$ESCTL" prepare --local --config "$W/recipe.yaml" --dataset-path "$W/data.jsonl" \
    --job-dir "$J2" --num-shards 2 --processor "$W/good/python3" >"$W/prepare.out" 2>&1 ||
    fail "prepare job2" "$(cat "$W/prepare.out")"
give_job "$J2"
for n in h b u; do stop_daemon "$n"; done
spool_job "$J2"
wait_for "m works job2 (mismatch allowed)" 30 test -e "$J2/state/esd/finalize.json"
ok "with data_juicer.allow_version_mismatch, m works a job of another version"
stop_daemon m
summary
