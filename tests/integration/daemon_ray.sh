#!/usr/bin/env bash
# daemon_ray: two esd daemons in ray.mode persistent with the test
# stand-ins fake-ray (tests/tools/fake-ray, not Ray: it only listens on the
# head's port) and mini-dj (not Data-Juicer; with MINI_DJ_RAY_EACH_ROW it
# reaches the head before every row, as a Ray job keeps talking to its
# head, and exits 3 when it is gone).
#   (a) each daemon starts its head once, on its own port and temp dir,
#       reports it up at 127.0.0.1:<port> once its readiness check (the
#       stand-in's `python` beside ray.command, as a venv has it) passed,
#       and passes that address to its attempts; a was started with
#       CUDA_VISIBLE_DEVICES=0,1 and its head got --num-gpus 2 and the
#       variable, b (no GPU here) --num-gpus 0, and status says so.
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
#   (e) a third daemon c, with a job waiting, whose first head accepts on
#       its GCS port but never gets ready, and whose second gets ready 3 s
#       after it listens (ray.start_timeout_secs 5): status says why it is
#       starting ("GCS answers, raylet not registered yet", also in the
#       human output), the first head is killed after 5 s and restarted,
#       the second is up no sooner than 3 s after its start, and c claims
#       nothing before its head is up, then works the job to the end.
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
# file knobs/slow-start says, never gets ready if knobs/never-ready exists,
# or else gets ready as many seconds after it listens as knobs/ready-after
# says (each file read once, then removed). Beside it, as in a virtual
# environment, the python that runs esd's readiness check: the stand-in's.
mkdir -p "$W/knobs" "$W/bin"
cat >"$W/bin/ray" <<EOF
#!/bin/sh
if [ -f "$W/knobs/slow-start" ]; then
    FAKE_RAY_SLOW_START=\$(cat "$W/knobs/slow-start")
    export FAKE_RAY_SLOW_START
    rm -f "$W/knobs/slow-start"
fi
if [ -f "$W/knobs/never-ready" ]; then
    FAKE_RAY_NEVER_READY=1
    export FAKE_RAY_NEVER_READY
    rm -f "$W/knobs/never-ready"
elif [ -f "$W/knobs/ready-after" ]; then
    FAKE_RAY_READY_AFTER=\$(cat "$W/knobs/ready-after")
    export FAKE_RAY_READY_AFTER
    rm -f "$W/knobs/ready-after"
fi
exec python3 "$FAKE_RAY" "\$@"
EOF
cat >"$W/bin/python3" <<EOF
#!/bin/sh
exec python3 "$FAKE_RAY" python "\$@"
EOF
chmod 755 "$W/bin/ray" "$W/bin/python3"
# A persistent head as root would run every recipe as root: esd refuses
# that, so as root the daemons run as nobody, who owns the job.
if [ "$(id -u)" -eq 0 ]; then
    daemon_conf r ray.mode=persistent ray.command="$W/bin/ray"
    run "$ESD" --check-config -c "$W/r/esd.yaml"
    check "as root, esd refuses ray.mode persistent" 1 "" "needs esd to run as the user that owns the jobs"
    export DAEMON_AS=nobody
    chown nobody: "$W/knobs"
fi

free_ports() {
    python3 -c 'import socket
ss = [socket.socket() for _ in range(3)]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))'
}
read -r PORT_A PORT_B PORT_C <<<"$(free_ports)"
declare -A PORT=([a]=$PORT_A [b]=$PORT_B [c]=$PORT_C)

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
daemon_conf a ray.mode=persistent ray.command="$W/bin/ray" ray.port="${PORT[a]}"
start_daemon a CUDA_VISIBLE_DEVICES=0,1
daemon_conf b ray.mode=persistent ray.command="$W/bin/ray" ray.port="${PORT[b]}"
start_daemon b
for n in a b; do
    wait_for "$n reports its head up" 30 ray_up "$n"
    [ "$(ray_field "$n" 'j["ray"]["address"]')" = "127.0.0.1:${PORT[$n]}" ] ||
        fail "$n's head address" "$(cat "$W/$n/status.json")"
    [ "$(ray_field "$n" 'j["ray"]["restarts"]')" -eq 0 ] || fail "$n's head has not restarted"
    [ "$(sessions "$n")" -eq 1 ] || fail "$n's head started once" "$(ls "$W/$n/state/ray")"
    [ -s "$W/$n/state/ray/fake-ray.pid" ] || fail "$n's head runs in $W/$n/state/ray"
    [ "$(ray_field "$n" 'j["ray"]["ready_check"]')" = task ] ||
        fail "$n's head was checked with a task" "$(cat "$W/$n/status.json")"
    grep -q "ray head up on 127.0.0.1:${PORT[$n]} (its raylet took a task" "$W/$n/log" ||
        fail "$n logs its head up after the readiness check" "$(grep 'ray head' "$W/$n/log")"
done
ok "each daemon started its own head once, up at 127.0.0.1:<its port> after a task ran"

# The GPUs: a's from CUDA_VISIBLE_DEVICES (which its head got), b's counted
# from /dev/nvidia<N> (b's count is checked only where there is none).
# head_arg PID FLAG: the word after FLAG on PID's command line.
head_arg() { tr '\0' '\n' <"/proc/$1/cmdline" | grep -A1 -x -- "$2" | sed -n 2p; }
HEAD=$(cat "$W/a/state/ray/fake-ray.pid")
[ "$(head_arg "$HEAD" --num-gpus)" = 2 ] ||
    fail "a's head offers 2 GPUs" "$(tr '\0' ' ' <"/proc/$HEAD/cmdline")"
tr '\0' '\n' <"/proc/$HEAD/environ" | grep -qx CUDA_VISIBLE_DEVICES=0,1 ||
    fail "a's head got CUDA_VISIBLE_DEVICES"
[ "$(ray_field a 'j["ray"]["num_gpus"], j["ray"]["gpus_from"]')" = \
    "(2, 'CUDA_VISIBLE_DEVICES')" ] || fail "a's status shows its GPUs" "$(cat "$W/a/status.json")"
"$ESCTL" --socket "$(dsock a)" status >"$W/a/status.txt" ||
    fail "human status of a" "$(cat "$W/a/status.txt")"
grep -q "ray up at 127.0.0.1:${PORT[a]}, 2 GPUs (CUDA_VISIBLE_DEVICES)" "$W/a/status.txt" ||
    fail "a's human status shows its GPUs" "$(cat "$W/a/status.txt")"
if ! compgen -G '/dev/nvidia[0-9]*' >/dev/null; then
    HEAD=$(cat "$W/b/state/ray/fake-ray.pid")
    [ "$(head_arg "$HEAD" --num-gpus)" = 0 ] || fail "b's head offers no GPU"
    [ "$(ray_field b 'j["ray"]["num_gpus"], j["ray"]["gpus_from"]')" = "(0, '/dev/nvidia*')" ] ||
        fail "b's status shows no GPUs" "$(cat "$W/b/status.json")"
fi
ok "a's head offers the 2 GPUs of CUDA_VISIBLE_DEVICES (and got it), b's the /dev/nvidia* count"
# Claim-ahead (on by default, 1 slot): the head keeps the idle workers an
# attempt claimed ahead prewarms, its CPUs + min(CPUs, 4) a slot.
HEAD=$(cat "$W/a/state/ray/fake-ray.pid")
cpus=$(getconf _NPROCESSORS_ONLN)
want=$((cpus + (cpus < 4 ? cpus : 4)))
tr '\0' '\n' <"/proc/$HEAD/environ" | grep -qx "RAY_num_workers_soft_limit=$want" ||
    fail "a's head keeps $want idle workers" \
        "$(tr '\0' '\n' <"/proc/$HEAD/environ" | grep RAY_ || true)"
ok "the head keeps the workers claim-ahead prewarms (RAY_num_workers_soft_limit=$want)"

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

# ---- (e) ready means ready ----
JOB2="$W/job2"
prepare_job "$JOB2" 4
give_job "$JOB2"
spool_job "$JOB2"
touch "$W/knobs/never-ready"
echo 3 >"$W/knobs/ready-after"
[ "$(id -u)" -ne 0 ] || chown nobody: "$W/knobs/never-ready" "$W/knobs/ready-after"
# starting_because NODE TEXT: NODE's head is starting, and status says TEXT.
starting_because() {
    [ "$(ray_field "$1" 'j["ray"]["state"] + "|" + j["ray"].get("starting", "")')" = \
        "starting|$2" ]
}
daemon_conf c ray.mode=persistent ray.command="$W/bin/ray" ray.port="${PORT[c]}" \
    ray.start_timeout_secs=5
start_daemon c
wait_for "c says its raylet is not registered yet" 10 \
    starting_because c "GCS answers, raylet not registered yet"
"$ESCTL" --socket "$(dsock c)" status >"$W/c/status.txt" || fail "human status of c"
grep -q "ray starting at 127.0.0.1:${PORT[c]}, [0-9]* GPUs ([^)]*): GCS answers, raylet not" \
    "$W/c/status.txt" || fail "c's human status says why it starts" "$(cat "$W/c/status.txt")"
{ [ ! -e "$W/knobs/never-ready" ] && [ -e "$W/knobs/ready-after" ]; } ||
    fail "the first head took the never-ready knob only"
ok "c's first head answers on its GCS port; c says it is starting, and why"
restarted() { [ "$(ray_field c 'j["ray"]["restarts"]')" -ge 1 ]; }
wait_for "c restarts the head that never got ready" 30 restarted
grep -q "was not ready within 5 s (GCS answers, raylet not registered" "$W/c/log" ||
    fail "c logs why it killed its head" "$(grep 'ray head' "$W/c/log")"
wait_for "c's second head is up" 30 ray_up c
[ "$(ray_field c 'j["ray"]["restarts"]')" -eq 1 ] || fail "c restarted its head once"
[ "$(ray_field c '"starting" in j["ray"]')" = False ] || fail "no starting reason once up"
ok "c killed its never-ready head after 5 s and started another, which came up"
wait_for "job2 is merged" 60 finalized "$JOB2"
python3 - "$W/c/log" <<'PYEOF' || fail "c claimed nothing before its head was up"
import datetime, sys
log = open(sys.argv[1]).read().splitlines()
def t(line):
    return datetime.datetime.fromisoformat(line.split()[0])
starts = [i for i, l in enumerate(log) if "info: starting the ray head" in l]
up = [i for i, l in enumerate(log) if "ray head up on" in l]
claims = [i for i, l in enumerate(log) if "claimed (attempt" in l]
assert len(starts) == 2 and len(up) == 1, (starts, up)
assert claims and min(claims) > up[0], (claims[:3], up)
took = (t(log[up[0]]) - t(log[starts[1]])).total_seconds()
assert took >= 2.9, "up %.2f s after the second start, before its raylet was ready" % took
print("# c: second head up %.1f s after its start; %d claims, all after it" % (took, len(claims)))
PYEOF
ok "c made no claim before its head was up, and worked job2 to the end"
stop_daemon c
[ "$DRC" -eq 0 ] || fail "esd c exits 0" "status $DRC"
summary
