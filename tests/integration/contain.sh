#!/usr/bin/env bash
# contain: nothing of an attempt outlives it (esd(8) "Containment"). Real
# esd daemons (ray.mode off, mini-dj as processor), one shard a job, and a
# processor that leaves a process behind outside its process group that
# ignores SIGTERM and keeps the output pipe open (MINI_DJ_ESCAPE):
#   (a) setsid, the processor exits 0: the attempt is done within seconds
#       (not "finishing" for ever), the slot is free, the escaped process
#       is dead, and esd exits at once on SIGTERM.
#   (a2) setsid, the processor hangs, SIGTERM to esd (drain_timeout_secs 1,
#       attempt_kill_grace_secs 1): esd stops the attempt, kills the
#       escaped process and exits within seconds; the claim is released.
#   (b) double (an orphaned grandchild in a session of its own), kill -9
#       of esd mid-attempt: the keeper, the processor and the escaped
#       process are all gone within 5 s.
#   (c) an attempt that outlives attempt_timeout_secs (4 s) is killed with
#       its whole tree, the escaped process included, and fails as timed
#       out. Run as root where a cgroup v2 hierarchy is writable, in a
#       cgroup given to esd as if delegated (ESD_TEST_CGROUP): the attempt
#       ran in a cgroup of its own, removed once it ended.
#   (e) the keeper killed with SIGKILL (no cgroup): the escapee, handed to
#       esd (its subreaper), holds the output; esd closes it 2 s after the
#       keeper's end, the attempt ends, and esd kills the escapee when it
#       stops.
#   (d) esctl worker: the same escape does not keep it waiting; the
#       escaped process is dead when it returns.
# Prints how long each end took.
#
# Environment: TOP, ESCTL, ESD, TOOLS (see lib.bash).
set -euo pipefail
export LC_ALL=C

# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

new_workdir
unset_knobs
need_daemon_tools
text_dataset 40

CG=
cg_cleanup() {
    if [ -n "$CG" ] && [ -d "$CG" ]; then
        local d
        for d in "$CG"/*/; do
            [ -d "$d" ] || continue
            echo 1 >"$d/cgroup.kill" 2>/dev/null || true
            rmdir "$d" 2>/dev/null || true
        done
        rmdir "$CG" 2>/dev/null || true
    fi
    cleanup
}
trap cg_cleanup EXIT

# new_job NAME [prepare options]: a prepared one-shard job given to nobody.
new_job() {
    local job=$W/$1
    shift
    prepare_job "$job" 1 "$@"
    give_job "$job"
    # (each case's daemon sees its own job only)
    rm -f "$W"/spool/*.json
}
finalized() { [ -e "$1/state/esd/finalize.json" ]; }
# escaped JOB: the pid of the process that escaped, from process.log.
escaped() {
    find "$1/attempts" -name process.log -exec sed -n 's/^mini-dj: escaped pid \([0-9]*\).*/\1/p' {} + \
        2>/dev/null | head -n 1
}
has_escaped() { [ -n "$(escaped "$1")" ]; }
no_attempts() {
    dstatus "$1"
    [ "$(py 'len(j["attempts"])' "$W/$1/status.json")" -eq 0 ]
}
# attempt_pid NODE: the processor's pid in NODE's status.
attempt_pid() {
    dstatus "$1"
    py 'j["attempts"][0]["pid"]' "$W/$1/status.json"
}
ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }

# ---- (a) an escaped process that keeps the pipe, the processor exits 0 ----
new_job job-a
daemon_conf a attempt_kill_grace_secs=1
spool_job "$W/job-a"
t0=$(date +%s%N)
start_daemon a MINI_DJ_ESCAPE=setsid
wait_for "(a) the job completes though an escaped process holds the output" 15 finalized "$W/job-a"
took=$(ms_since "$t0")
esc=$(escaped "$W/job-a")
[ -n "$esc" ] || fail "(a) process.log names the escaped process"
STRAYS+=("$esc")
wait_for "(a) the escaped process $esc is dead" 2 dead "$esc"
[ "$(count "$W/job-a/state/done")" -eq 1 ] || fail "(a) the shard is done"
wait_for "(a) no attempt is left in esd's status (the slot is free)" 2 no_attempts a
t0=$(date +%s%N)
stop_daemon a
stopped=$(ms_since "$t0")
[ "$DRC" -eq 0 ] || fail "(a) esd exits 0 on SIGTERM" "exit $DRC" "$(tail -n 20 "$W/a/log")"
[ "$stopped" -lt 5000 ] || fail "(a) esd exits promptly on SIGTERM" "$stopped ms"
ok "(a) setsid escapee holding the pipe: job complete in ${took} ms from esd's start, escapee $esc dead, slot free, SIGTERM exit in ${stopped} ms"

# ---- (a2) SIGTERM while the processor hangs and its escapee holds the pipe ----
new_job job-a2
daemon_conf a2 attempt_kill_grace_secs=1 drain_timeout_secs=1
spool_job "$W/job-a2"
start_daemon a2 MINI_DJ_ESCAPE=setsid MINI_DJ_HANG=1
wait_for "(a2) the attempt runs, its escapee too" 15 has_escaped "$W/job-a2"
esc=$(escaped "$W/job-a2")
STRAYS+=("$esc")
proc=$(attempt_pid a2)
STRAYS+=("$proc")
alive "$esc" || fail "(a2) the escapee runs"
t0=$(date +%s%N)
stop_daemon a2
stopped=$(ms_since "$t0")
[ "$DRC" -eq 0 ] || fail "(a2) esd exits 0 after its drain" "exit $DRC" "$(tail -n 20 "$W/a2/log")"
# drain 1 s + grace 1 s, with room for a busy machine
[ "$stopped" -lt 8000 ] || fail "(a2) esd exits within seconds of SIGTERM" "$stopped ms"
all_exited "$esc" "$proc" || fail "(a2) the processor $proc and the escapee $esc are dead when esd has exited"
[ "$(count "$W/job-a2/state/locks")" -eq 0 ] || fail "(a2) the claim was released" "$(ls "$W/job-a2/state/locks")"
[ "$(count "$W/job-a2/state/failed")" -eq 0 ] || fail "(a2) no failure was counted"
ok "(a2) SIGTERM during a hanging attempt with an escapee: esd exited 0 in ${stopped} ms, processor and escapee dead, claim released"

# ---- (b) kill -9 of esd mid-attempt ----
new_job job-b
daemon_conf b
spool_job "$W/job-b"
start_daemon b MINI_DJ_ESCAPE=double MINI_DJ_HANG=1
wait_for "(b) the attempt runs, its escapee too" 15 has_escaped "$W/job-b"
esc=$(escaped "$W/job-b")
proc=$(attempt_pid b)
keeper=$(ps -o ppid= -p "$proc" | tr -d ' ')
STRAYS+=("$esc" "$proc" "$keeper")
[ "$(ps -o ppid= -p "$keeper" | tr -d ' ')" = "${DPID[b]}" ] ||
    fail "(b) the processor's parent is a keeper of esd's" "keeper $keeper, esd ${DPID[b]}"
[ "$(ps -o ppid= -p "$esc" | tr -d ' ')" = "$keeper" ] ||
    fail "(b) the orphaned escapee was handed to the keeper (its subreaper)" \
        "$(ps -o pid,ppid,pgid,sid,comm -p "$esc")"
[ "$(ps -o sid= -p "$esc" | tr -d ' ')" = "$esc" ] || fail "(b) the escapee has a session of its own"
t0=$(date +%s%N)
kill -KILL "${DPID[b]}"
wait_for "(b) keeper $keeper, processor $proc and escapee $esc die with esd" 5 \
    all_exited "$keeper" "$proc" "$esc"
{ wait "${DPID[b]}"; } 2>/dev/null || true
ok "(b) kill -9 of esd: keeper, processor and orphaned escapee gone in $(ms_since "$t0") ms"

# ---- (c) a timeout kills the whole tree ----
new_job job-c --max-retries 0
daemon_conf c attempt_timeout_secs=4 attempt_kill_grace_secs=1
spool_job "$W/job-c"
cgenv=()
for root in /sys/fs/cgroup/unified /sys/fs/cgroup; do
    if [ "$(id -u)" -eq 0 ] && [ "$(stat -f -c %T "$root" 2>/dev/null)" = cgroup2fs ] &&
        mkdir "$root/esd-test-$$" 2>/dev/null; then
        CG=$root/esd-test-$$
        cgenv=(ESD_TEST_CGROUP="$CG")
        break
    fi
done
t0=$(date +%s%N)
start_daemon c "${cgenv[@]}" MINI_DJ_ESCAPE=setsid MINI_DJ_HANG=1
wait_for "(c) the attempt runs, its escapee too" 15 has_escaped "$W/job-c"
esc=$(escaped "$W/job-c")
proc=$(attempt_pid c)
STRAYS+=("$esc" "$proc")
incg=
if [ -n "$CG" ]; then
    grep -q "^0::/.*esd-test-$$/attempt-" "/proc/$esc/cgroup" ||
        fail "(c) the escapee is in the attempt's cgroup" "$(cat "/proc/$esc/cgroup")"
    grep -q "^0::/.*esd-test-$$/esd\$" "/proc/${DPID[c]}/cgroup" ||
        fail "(c) esd moved itself into the leaf esd" "$(cat "/proc/${DPID[c]}/cgroup")"
    incg=", in cgroup $(sed -n 's|^0::.*/||p' "/proc/$esc/cgroup")"
fi
failed_rec() { [ "$(count "$W/job-c/state/failed")" -eq 1 ]; }
wait_for "(c) the attempt times out and the shard fails" 15 failed_rec
took=$(ms_since "$t0")
wait_for "(c) processor $proc and escapee $esc are dead" 2 all_exited "$proc" "$esc"
grep -q "timed out" "$W"/job-c/state/failed/*.json ||
    fail "(c) the failure says timed out" "$(cat "$W"/job-c/state/failed/*.json)"
if [ -n "$CG" ]; then
    cg_gone() { [ -z "$(find "$CG" -mindepth 1 -maxdepth 1 -type d -name 'attempt-*')" ]; }
    wait_for "(c) the attempt's cgroup is removed" 5 cg_gone
fi
wait_for "(c) no attempt is left in esd's status" 2 no_attempts c
stop_daemon c
ok "(c) attempt_timeout_secs 4, grace 1: failed as timed out ${took} ms from esd's start, processor and escapee dead${incg}${CG:+, its cgroup removed}"

# ---- (e) the keeper itself killed: the drain, and esd's sweep at its stop ----
new_job job-e --max-retries 0
daemon_conf e
spool_job "$W/job-e"
start_daemon e MINI_DJ_ESCAPE=setsid MINI_DJ_HANG=1
wait_for "(e) the attempt runs, its escapee too" 15 has_escaped "$W/job-e"
esc=$(escaped "$W/job-e")
proc=$(attempt_pid e)
keeper=$(ps -o ppid= -p "$proc" | tr -d ' ')
STRAYS+=("$esc" "$proc" "$keeper")
t0=$(date +%s%N)
kill -KILL "$keeper"
wait_for "(e) the attempt ends though the escapee, now esd's, holds its output" 10 no_attempts e
took=$(ms_since "$t0")
grep -q "the processor's output is still open after its process tree ended" "$W/e/log" ||
    fail "(e) esd says that it closed the output" "$(tail -n 20 "$W/e/log")"
wait_for "(e) the processor died with its keeper" 2 dead "$proc"
alive "$esc" || fail "(e) the escapee outlives a killed keeper (no cgroup)"
[ "$(ps -o ppid= -p "$esc" | tr -d ' ')" = "${DPID[e]}" ] ||
    fail "(e) the escapee was handed to esd, the subreaper" "$(ps -o pid,ppid,comm -p "$esc")"
stop_daemon e
[ "$DRC" -eq 0 ] || fail "(e) esd exits 0" "exit $DRC"
wait_for "(e) esd killed the escapee at its stop" 2 dead "$esc"
ok "(e) keeper killed: attempt ended in ${took} ms (output closed after 2 s), escapee handed to esd and killed at its stop"

# ---- (d) esctl worker ----
new_job job-d
t0=$(date +%s%N)
run env MINI_DJ_ESCAPE=setsid timeout 30 "$ESCTL" worker --local --job-dir "$W/job-d" --node d \
    --processor "$MINI" --max-shards 1
took=$(ms_since "$t0")
check "(d) esctl worker completes the shard though an escapee holds the output" 0
esc=$(escaped "$W/job-d")
[ -n "$esc" ] || fail "(d) process.log names the escaped process"
STRAYS+=("$esc")
wait_for "(d) the escaped process $esc is dead" 2 dead "$esc"
[ "$(count "$W/job-d/state/done")" -eq 1 ] || fail "(d) the shard is done"
ok "(d) esctl worker: done in ${took} ms, escapee $esc dead"

summary
