#!/usr/bin/env bash
# daemon_ray: two esd daemons in ray.mode persistent with the test
# stand-ins fake-ray (tests/tools/fake-ray, not Ray: it only listens on the
# head's port) and mini-dj (not Data-Juicer; with MINI_DJ_RAY_EACH_ROW it
# reaches the head before every row, as a Ray job keeps talking to its
# head, and exits 3 when it is gone).
#   (a) each daemon starts its head once, on its own port and temp dir,
#       reports it up at 127.0.0.1:<port> and passes that address to its
#       attempts.
#   (b) a's head is killed (SIGKILL) while a runs an attempt, and its
#       restart is made slow (3 s before it listens): the attempt fails as
#       "infrastructure" naming the head, a makes no claim between "no new
#       claims" and "claims resume" in its log, b goes on claiming, a's
#       head is started again (restarts 1, a second session dir) and a
#       claims again; b's head is untouched (restarts 0).
#   (c) the job completes: one done record per shard, the shard of the
#       failed attempt done by a later attempt, the merged output equal to
#       the independent expectation.
#   (d) SIGTERM stops each daemon with status 0 and its head with it.
# Run as root, the daemons run as nobody (the service-user deployment:
# esd refuses ray.mode persistent as root, which is checked first).
#
# Environment: TOP, ESCTL, ESD, TOOLS (see lib.bash).
set -euo pipefail
export LC_ALL=C

# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

NSHARDS=24

new_workdir
unset_knobs
need_daemon_tools

# The ray command: fake-ray, whose next start waits as many seconds as the
# file knobs/slow-start says (read once, then removed).
mkdir -p "$W/knobs"
cat >"$W/ray-cmd" <<EOF
#!/bin/sh
if [ -f "$W/knobs/slow-start" ]; then
    FAKE_RAY_SLOW_START=\$(cat "$W/knobs/slow-start")
    export FAKE_RAY_SLOW_START
    rm -f "$W/knobs/slow-start"
fi
exec python3 "$FAKE_RAY" "\$@"
EOF
chmod 755 "$W/ray-cmd"
# A persistent head as root would run every recipe as root: esd refuses
# that, so as root the daemons run as nobody, who owns the job.
if [ "$(id -u)" -eq 0 ]; then
    daemon_conf r ray.mode=persistent ray.command="$W/ray-cmd"
    run "$ESD" --check-config -c "$W/r/esd.yaml"
    check "as root, esd refuses ray.mode persistent" 1 "" "needs esd to run as the user that owns the jobs"
    export DAEMON_AS=nobody
    chown nobody: "$W/knobs"
fi

free_ports() {
    python3 -c 'import socket
ss = [socket.socket() for _ in range(2)]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))'
}
read -r PORT_A PORT_B <<<"$(free_ports)"
declare -A PORT=([a]=$PORT_A [b]=$PORT_B)

# ray_field NODE EXPR: a Python expression on NODE's status (st).
ray_field() {
    dstatus "$1"
    py "$2" "$W/$1/status.json"
}
ray_up() { [ "$(ray_field "$1" 'j["ray"]["state"]')" = up ]; }
sessions() { find "$W/$1/state/ray" -maxdepth 1 -name 'session_2*' | wc -l; }
finalized() { [ -e "$1/state/esd/finalize.json" ]; }

# 42 rows a shard, 30 ms a row: over a second a shard.
text_dataset 1000
export MINI_DJ_SLEEP_MS=30 MINI_DJ_RAY_EACH_ROW=1

# ---- (a) the heads ----
for n in a b; do
    daemon_conf "$n" ray.mode=persistent ray.command="$W/ray-cmd" ray.port="${PORT[$n]}"
    start_daemon "$n"
done
for n in a b; do
    wait_for "$n reports its head up" 30 ray_up "$n"
    [ "$(ray_field "$n" 'j["ray"]["address"]')" = "127.0.0.1:${PORT[$n]}" ] ||
        fail "$n's head address" "$(cat "$W/$n/status.json")"
    [ "$(ray_field "$n" 'j["ray"]["restarts"]')" -eq 0 ] || fail "$n's head has not restarted"
    [ "$(sessions "$n")" -eq 1 ] || fail "$n's head started once" "$(ls "$W/$n/state/ray")"
    [ -s "$W/$n/state/ray/fake-ray.pid" ] || fail "$n's head runs in $W/$n/state/ray"
done
ok "each daemon started its own head once, up at 127.0.0.1:<its port>"

JOB="$W/job"
prepare_job "$JOB" "$NSHARDS"
give_job "$JOB"
spool_job "$JOB"

# ---- (b) a's head dies while a works ----
# running_on NODE: NODE runs an attempt that has most of its second to go.
running_on() {
    [ "$(ray_field "$1" 'sum(1 for x in j["attempts"] if x["phase"] == "running"
        and x["running_secs"] < 0.5)')" -ge 1 ]
}
wait_for "a runs an attempt on its head" 30 running_on a
VICTIM=$(py 'j["attempts"][0]["shard_id"]' "$W/a/status.json")
HEAD=$(cat "$W/a/state/ray/fake-ray.pid")
echo 3 >"$W/knobs/slow-start"
kill -KILL "$HEAD"
ok "killed a's head (pid $HEAD) while a ran $VICTIM"
wait_for "a's head is up again" 30 grep -q "claims resume" "$W/a/log"
wait_for "a reports its head up again" 10 ray_up a
[ "$(ray_field a 'j["ray"]["restarts"]')" -eq 1 ] || fail "a restarted its head once" \
    "$(cat "$W/a/status.json")"
[ "$(sessions a)" -eq 2 ] || fail "a's head started a second time" "$(ls "$W/a/state/ray")"
[ ! -e "$W/knobs/slow-start" ] || fail "the restart read the slow-start file"
ok "a's head was started again (restarts 1, a second session)"

# The log between the loss and the resumption: no claim by a; b claims on.
python3 - "$W/a/log" "$W/b/log" <<'EOF' || fail "no claims by a while its head was down"
import sys
a = open(sys.argv[1]).read().splitlines()
lost = next(i for i, l in enumerate(a) if "no new claims while the Ray head is" in l)
back = next(i for i, l in enumerate(a) if "claims resume" in l and i > lost)
claims = [l for l in a[lost:back] if "claimed (attempt" in l]
assert not claims, claims
t0, t1 = a[lost].split()[0], a[back].split()[0]
b = [l for l in open(sys.argv[2]).read().splitlines()
     if "claimed (attempt" in l and t0 <= l.split()[0] <= t1]
assert b, "b claimed nothing between %s and %s" % (t0, t1)
print("# a was without its head from %s to %s; b claimed %d shards meanwhile" % (t0, t1, len(b)))
EOF
ok "a made no claim while its head was down; b claimed on"

# ---- (c) the job completes ----
wait_for "the job is merged" 90 finalized "$JOB"
python3 - "$JOB" "$VICTIM" <<'EOF' || fail "done records and the failed attempt"
import glob, json, os, sys
job, victim = sys.argv[1:]
ids = [s["id"] for s in json.load(open(os.path.join(job, "manifest.json")))["shards"]]
assert sorted(f[:-5] for f in os.listdir(job + "/state/done")) == sorted(ids)
first = json.load(open(glob.glob("%s/attempts/%s/0001-*/attempt.json" % (job, victim))[0]))
assert first["status"] == "infra_failed", first  # (not counted by the reference)
assert first["failure_class"] == "infrastructure", first
assert "Ray head" in first["error"], first
d = json.load(open("%s/state/done/%s.json" % (job, victim)))
assert d["attempt_number"] == 2, d
EOF
ok "the killed attempt failed as infrastructure; its shard was done by attempt 2"
expect_merged "$JOB" "$W/expected-merged.jsonl" || fail "the expected merge"
cmp "$JOB/merged.jsonl" "$W/expected-merged.jsonl" || fail "the merged output equals the expectation"
ok "the merged output equals the independent expectation"
{ [ "$(ray_field b 'j["ray"]["restarts"]')" -eq 0 ] && [ "$(sessions b)" -eq 1 ]; } ||
    fail "b's head was untouched"
ok "b's head was started once and never restarted"

# ---- (d) stop ----
for n in a b; do
    HEAD=$(cat "$W/$n/state/ray/fake-ray.pid")
    stop_daemon "$n"
    [ "$DRC" -eq 0 ] || fail "esd $n exits 0" "status $DRC" "$(tail -n 5 "$W/$n/log")"
    wait_for "$n's head exits with it" 10 dead "$HEAD"
    [ ! -e "$W/$n/state/ray/fake-ray.pid" ] || fail "$n's head stopped cleanly (pid file removed)"
done
ok "SIGTERM stopped both daemons (status 0) and their heads cleanly"
summary
