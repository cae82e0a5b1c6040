#!/usr/bin/env bash
# oneshot: `esd run`, the same command on every node of a scheduler's job,
# with the test stand-in mini-dj (tests/tools/mini-dj.c, not Data-Juicer)
# and no Ray. Several processes with different node names act as the nodes.
#   (a) four nodes, one run id: one prepare, one finalize, every node exits
#       0, the merged output is the expected one (expect_merged), the
#       prepare's progress is said; a second process of one node exits 2
#       without disturbing the run.
#   (b) the prepare coordinator is killed (-9) mid-prepare: another node
#       takes the election over after the lease and prepares; all exit 0.
#   (c) the finalize coordinator is killed (-9) mid-merge: another takes it
#       over after the lease and merges; all exit 0.
#   (d) strict mode: three nodes of --nodes 3, two shards' first attempts
#       failing (failed attempts do not eat the per-node cap): 3 nodes
#       completed shards, at most ceil(12/3) each, exit 0; then two nodes
#       of --nodes 3: all exit 2 naming the missing node.
#   (e) a shard that always fails: every node exits 2 naming it and its
#       error; abort.json says 2.
#   (f) SIGTERM to a node mid-attempt: it exits 143 at once, its claim is
#       released and counted nowhere; the other nodes finish (exit 0).
#   (g) launcher ranks: torchrun (4 ranks on one host: one works, three
#       wait, all exit 0; a host's worker killed, a waiting rank works in
#       its place), OpenMPI (2 hosts of 2 ranks), Slurm (an array
#       task's run id), a Kubernetes Indexed Job (run id from its pod's
#       host name), and no run id at all (refused).
#   (h) a daemon works the same job at the same time: one merge, all 0.
#   (i) the reference's dlc_job.py layout: a run it prepared is finished by
#       esd without preparing again; a new run id re-prepares idempotently
#       and leaves the merged job alone; a dead reference coordinator's
#       lock (no lease) is taken over after the wait timeout.
#   (j) walltime (SLURM_JOB_END_TIME): no claim that cannot end in time;
#       the node exits 1 at the deadline with nothing failed or locked.
#   (k) a FIFO, a symbolic link as results: exit 2 at once, naming them.
#   (l) the persistent head (fake-ray, not Ray) runs the ray next to
#       --processor; without any ray, esd run refuses to start.
set -euo pipefail
export LC_ALL=C

# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

new_workdir
unset_knobs PAI_JOB_ID DLC_JOB_ID JOB_ID SLURM_JOB_ID SLURM_ARRAY_JOB_ID SLURM_ARRAY_TASK_ID \
    TORCHELASTIC_RUN_ID JOB_COMPLETION_INDEX WORLD_SIZE RANK LOCAL_RANK LOCAL_WORLD_SIZE \
    OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_LOCAL_RANK SLURM_NTASKS \
    SLURM_PROCID SLURM_LOCALID SLURM_NNODES SLURM_JOB_END_TIME XDG_RUNTIME_DIR
text_dataset 480
printf 'attempt_env: [LANG, "MINI_DJ_*"]\npoll_interval_secs: 1\n' >"$W/run.yaml"
RUN_FLAGS=(--processor "$MINI" --ray-mode off --lease-secs 3 --poll-interval-secs 0.3
    --esd-config "$W/run.yaml")
declare -A RPID=() RRC=()

# start_node JOB NODE RUNID [ENV=V...] -- [esd run options]: one node in
# the background (RUNID "": none given, the environment's); its stdout in $W/NODE.out, stderr in $W/NODE.err.
start_node() {
    local job=$1 node=$2 rid=$3 envs=()
    shift 3
    while [ $# -gt 0 ] && [ "$1" != -- ]; do
        envs+=("$1")
        shift
    done
    [ $# -eq 0 ] || shift
    [ -z "$rid" ] || set -- --run-id "$rid" "$@"
    env "${envs[@]}" "$ESD" run --job-dir "$job" --node "$node" \
        --state-dir "$W/state.$node" "${RUN_FLAGS[@]}" "$@" >"$W/$node.out" 2>"$W/$node.err" &
    RPID[$node]=$!
    BG+=("$!")
}
# prepare_flags SHARDS: esd run's prepare options for text_dataset's job.
prepare_flags() {
    echo --config "$W/recipe.yaml" --dataset-path "$W/data.jsonl" --num-shards "$1"
}
# reap NODE...: waits for each node (at most 120 s); RRC[node] is its code.
reap() {
    local n
    for n in "$@"; do
        wait_for "esd run $n ends" 120 dead "${RPID[$n]}"
        RRC[$n]=0
        { wait "${RPID[$n]}"; } 2>/dev/null || RRC[$n]=$?
    done
}
# expect_codes CODE WHAT NODE...: every node exited CODE.
expect_codes() {
    local want=$1 what=$2 n
    shift 2
    for n in "$@"; do
        [ "${RRC[$n]}" -eq "$want" ] || fail "$what: node $n exits $want" \
            "it exited ${RRC[$n]}" "stdout: $(cat "$W/$n.out")" "stderr: $(tail -n 15 "$W/$n.err")"
    done
}
# lines_in TEXT NODE...: how many lines of the nodes' stdout contain TEXT.
lines_in() {
    local text=$1 n c=0
    shift
    for n in "$@"; do c=$((c + $(grep -cF -- "$text" "$W/$n.out" || true))); done
    echo "$c"
}
coord_of() { echo "$(dirname "$1")/.$(basename "$1").dlc-coordination/$(printf %s "$2" |
    sha256sum | cut -c1-20)"; }
said() { grep -qF -- "$2" "$W/$1.out"; }
code_of() { py 'j["return_code"]' "$1"; }

# ---- (a) four nodes, one run id ----
JOB=$W/job-a
for n in a1 a2 a3 a4; do
    # shellcheck disable=SC2046 # the words of prepare_flags
    start_node "$JOB" "$n" run-a MINI_DJ_SLEEP_MS=5 -- $(prepare_flags 16)
done
# a second process of node a1 (its state directory) takes no part and
# leaves the run alone
wait_for "(a) a1 works" 30 said a1 "working:"
run "$ESD" run --job-dir "$JOB" --run-id run-a --node a1 --state-dir "$W/state.a1" "${RUN_FLAGS[@]}"
check "(a) a second a1 cannot take part" 2 "this node cannot take part"
reap a1 a2 a3 a4
expect_codes 0 "(a) four nodes" a1 a2 a3 a4
[ "$(lines_in "elected as prepare coordinator" a1 a2 a3 a4)" -eq 1 ] &&
    [ "$(lines_in "prepare: 480 records into 16 shards" a1 a2 a3 a4)" -eq 1 ] ||
    fail "(a) exactly one node prepares" "$(cat "$W"/a?.out)"
# (the prepare runs in a helper child whose stdout is /dev/null: its
# progress comes back on its report pipe)
[ "$(lines_in "MiB, 480 records" a1 a2 a3 a4)" -ge 1 ] ||
    fail "(a) the prepare's progress is said by its coordinator" "$(cat "$W"/a?.out)"
[ "$(lines_in "elected as finalize coordinator" a1 a2 a3 a4)" -eq 1 ] ||
    fail "(a) exactly one node finalizes" "$(cat "$W"/a?.out)"
[ "$(lines_in "PASS: 16 shards were completed" a1 a2 a3 a4)" -eq 4 ] ||
    fail "(a) every node reports the same result" "$(cat "$W"/a?.out)"
expect_merged "$JOB" "$W/expected-a.jsonl"
cmp -s "$W/expected-a.jsonl" "$JOB/merged.jsonl" || fail "(a) the merged output is the expected one"
C=$(coord_of "$JOB" run-a)
[ "$(code_of "$C/prepare-result.json")" = 0 ] && [ "$(code_of "$C/finalize-result.json")" = 0 ] ||
    fail "(a) the coordination results say 0" "$(ls -l "$C")"
[ "$(count "$JOB/state/done")" -eq 16 ] && [ "$(count "$JOB/state/locks")" -eq 0 ] ||
    fail "(a) 16 done records, no lock left"
ok "(a) four nodes: one prepare, one finalize, all exit 0, merged output as expected"

# ---- (b) the prepare coordinator dies mid-prepare ----
JOB=$W/job-b
# shellcheck disable=SC2046
start_node "$JOB" b1 run-b ESD_TEST_PREPARE_DELAY_SECS=60 -- $(prepare_flags 8)
wait_for "(b) b1 is elected to prepare" 20 said b1 "elected as prepare coordinator"
for n in b2 b3; do
    # shellcheck disable=SC2046
    start_node "$JOB" "$n" run-b -- $(prepare_flags 8)
done
kill -KILL "${RPID[b1]}"
reap b2 b3
expect_codes 0 "(b) after the preparer's death" b2 b3
[ "$(lines_in "stopped renewing" b2 b3)" -ge 1 ] &&
    [ "$(lines_in "elected as prepare coordinator" b2 b3)" -eq 1 ] ||
    fail "(b) one node takes the prepare over" "$(cat "$W"/b?.out)"
C=$(coord_of "$JOB" run-b)
compgen -G "$C/prepare.lock.stale.*" >/dev/null || fail "(b) the dead lock is moved aside"
ok "(b) the prepare coordinator killed mid-prepare: taken over after its lease, all exit 0"
# frozen instead (SIGSTOP past its lease, with its prepare), then thawed
# once the node that took over has finished: it publishes nothing of its
# own and exits with the run's code
JOB=$W/job-b2
# shellcheck disable=SC2046
start_node "$JOB" b4 run-b2 ESD_TEST_PREPARE_DELAY_SECS=6 -- $(prepare_flags 4)
wait_for "(b) b4 is elected to prepare" 20 said b4 "elected as prepare coordinator"
mapfile -t FROZEN < <(echo "${RPID[b4]}"; pgrep -P "${RPID[b4]}" || true)
kill -STOP "${FROZEN[@]}"
# shellcheck disable=SC2046
start_node "$JOB" b5 run-b2 -- $(prepare_flags 4)
reap b5
kill -CONT "${FROZEN[@]}"
reap b4
expect_codes 0 "(b) a frozen preparer, thawed" b4 b5
said b4 "was taken over while it prepared" || fail "(b) b4 knows it lost the election" \
    "$(cat "$W/b4.out")"
[ "$(py 'j["node"]' "$(coord_of "$JOB" run-b2)/prepare-result.json")" = b5 ] ||
    fail "(b) the result is the node's that took over"
ok "(b) a preparer frozen past its lease: taken over; thawed, it takes the run's result"

# ---- (c) the finalize coordinator dies mid-merge ----
JOB=$W/job-c
# shellcheck disable=SC2046
start_node "$JOB" c1 run-c ESD_TEST_MERGE_DELAY_SECS=60 -- $(prepare_flags 4)
wait_for "(c) c1 is elected to finalize" 30 said c1 "elected as finalize coordinator"
for n in c2 c3; do start_node "$JOB" "$n" run-c; done
wait_for "(c) c2 and c3 wait for the finalize" 30 eval \
    'said c2 "another node finalizes" && said c3 "another node finalizes"'
kill -KILL "${RPID[c1]}"
reap c2 c3
expect_codes 0 "(c) after the finalizer's death" c2 c3
[ "$(lines_in "elected as finalize coordinator" c2 c3)" -eq 1 ] ||
    fail "(c) one node takes the finalize over" "$(cat "$W"/c?.out)"
expect_merged "$JOB" "$W/expected-c.jsonl"
cmp -s "$W/expected-c.jsonl" "$JOB/merged.jsonl" || fail "(c) the merged output is the expected one"
ok "(c) the finalize coordinator killed mid-merge: taken over after its lease, all exit 0"

# ---- (d) strict mode ----
JOB=$W/job-d
for n in d1 d2 d3; do
    # shellcheck disable=SC2046
    start_node "$JOB" "$n" run-d MINI_DJ_EXIT=1 MINI_DJ_ONLY=part-0001 MINI_DJ_FAIL_ONCE="$W/once-d" \
        -- $(prepare_flags 12) --nodes 3 --require-all-nodes
done
reap d1 d2 d3
expect_codes 0 "(d) strict, every node present" d1 d2 d3
py 'sorted(__import__("collections").Counter(json.load(open(f))["node"] for f in sys.argv[2:]).values())' \
    "$JOB"/state/done/*.json >"$W/d-counts"
[ "$(cat "$W/d-counts")" = "[4, 4, 4]" ] || fail "(d) three nodes completed 4 shards each" \
    "$(cat "$W/d-counts")"
[ "$(find "$JOB/attempts" -name attempt.json | wc -l)" -eq 14 ] ||
    fail "(d) two shards failed once first"
JOB=$W/job-d2
for n in d4 d5; do
    # shellcheck disable=SC2046
    start_node "$JOB" "$n" run-d2 MINI_DJ_SLEEP_MS=5 -- $(prepare_flags 6) --nodes 3 \
        --require-all-nodes --wait-timeout-secs 6
done
reap d4 d5
expect_codes 2 "(d) strict, a node missing" d4 d5
for n in d4 d5; do
    said "$n" "FAILED: timed out: 6 s without a shard done" && said "$n" "2 of 3 node(s) completed shards" ||
        fail "(d) node $n names what is missing" "$(cat "$W/$n.out")"
done
ok "(d) strict: 3 nodes at most 4 shards each despite failed attempts; a missing node fails all"

# ---- (e) a shard that always fails ----
JOB=$W/job-e
for n in e1 e2 e3; do
    # shellcheck disable=SC2046
    start_node "$JOB" "$n" run-e MINI_DJ_EXIT=3 MINI_DJ_ONLY=part-00002-of-00006 \
        -- $(prepare_flags 6) --max-retries 1
done
reap e1 e2 e3
expect_codes 2 "(e) a shard always fails" e1 e2 e3
for n in e1 e2 e3; do
    said "$n" "failed shard part-00002-of-00006: Data-Juicer returned exit code 3" ||
        fail "(e) node $n names the shard and its error" "$(cat "$W/$n.out")"
done
[ "$(code_of "$(coord_of "$JOB" run-e)/abort.json")" = 2 ] || fail "(e) abort.json says 2"
ok "(e) a shard that always fails: every node exits 2 with its error"

# ---- (f) SIGTERM mid-attempt ----
JOB=$W/job-f
# shellcheck disable=SC2046
start_node "$JOB" f1 run-f MINI_DJ_HANG=1 -- $(prepare_flags 4)
wait_for "(f) f1 runs an attempt" 30 eval '[ "$(count "$JOB/state/locks")" -eq 1 ]'
kill -TERM "${RPID[f1]}"
reap f1
expect_codes 143 "(f) SIGTERM" f1
[ "$(count "$JOB/state/locks")" -eq 0 ] || fail "(f) the claim is released"
grep -q '"status": *"released"' "$JOB"/attempts/*/*/attempt.json ||
    fail "(f) the attempt says released" "$(cat "$JOB"/attempts/*/*/attempt.json)"
[ "$(count "$JOB/state/failed")" -eq 0 ] || fail "(f) nothing failed"
for n in f2 f3; do start_node "$JOB" "$n" run-f; done
reap f2 f3
expect_codes 0 "(f) the others finish" f2 f3
py 'j.get("failures", 0)' "$JOB"/state/done/*.json | sort -u >"$W/f-failures"
[ "$(cat "$W/f-failures")" = 0 ] || fail "(f) no failure counted" "$(cat "$W/f-failures")"
ok "(f) SIGTERM mid-attempt: exit 143, claim released without a failure, the others finish"

# ---- (g) launcher ranks ----
JOB=$W/job-g
for r in 0 1 2 3; do
    # shellcheck disable=SC2046
    start_node "$JOB" "t$r" "" WORLD_SIZE=4 RANK=$r LOCAL_RANK=$r LOCAL_WORLD_SIZE=4 \
        TORCHELASTIC_RUN_ID=torch-g -- $(prepare_flags 4) --node host-g
done
reap t0 t1 t2 t3
expect_codes 0 "(g) torchrun, 4 ranks" t0 t1 t2 t3
said t0 "this host's worker" || fail "(g) rank 0 works" "$(cat "$W/t0.out")"
for r in 1 2 3; do
    said "t$r" "waits: the lowest local rank of this host works" && said "t$r" "ended with code 0" ||
        fail "(g) rank $r waits and exits with the run's code" "$(cat "$W/t$r.out")"
done
[ "$(count "$(coord_of "$JOB" torch-g)/ranks")" -eq 4 ] || fail "(g) one rank file a rank"
py 'sorted(set(json.load(open(f))["node"] for f in sys.argv[2:]))' "$JOB"/state/done/*.json \
    >"$W/g-nodes"
[ "$(cat "$W/g-nodes")" = "['host-g']" ] || fail "(g) only rank 0 worked" "$(cat "$W/g-nodes")"
# the worker of a host dies (-9, mid-prepare): a waiting rank of that host
# works in its place
JOB=$W/job-g2
# shellcheck disable=SC2046
start_node "$JOB" u0 "" WORLD_SIZE=2 RANK=0 LOCAL_RANK=0 TORCHELASTIC_RUN_ID=torch-g2 \
    ESD_TEST_PREPARE_DELAY_SECS=60 -- $(prepare_flags 4) --node host-u
wait_for "(g) u0 is elected to prepare" 20 said u0 "elected as prepare coordinator"
# shellcheck disable=SC2046
start_node "$JOB" u1 "" WORLD_SIZE=2 RANK=1 LOCAL_RANK=1 TORCHELASTIC_RUN_ID=torch-g2 \
    -- $(prepare_flags 4) --node host-u
wait_for "(g) u1 waits" 20 said u1 "waits: the lowest local rank"
kill -KILL "${RPID[u0]}"
reap u1
expect_codes 0 "(g) a waiting rank takes over" u1
said u1 "works in its place" && said u1 "elected as prepare coordinator" ||
    fail "(g) u1 works in place of the dead u0" "$(cat "$W/u1.out")"
# the explanation of each launcher's environment (no job is run)
explain() { env "$@" "$ESD" run --job-dir "$W/job-x" --explain; }
run explain OMPI_COMM_WORLD_SIZE=4 OMPI_COMM_WORLD_RANK=3 OMPI_COMM_WORLD_LOCAL_RANK=1 \
    OMPI_COMM_WORLD_LOCAL_SIZE=2 PAI_JOB_ID=dlc-42
check "(g) OpenMPI: rank 3 (local 1) of 2 hosts waits" 0 $'launcher: OpenMPI\nrank: 3\nlocal_rank: 1\nworld_size: 4\nnodes: 2\nrole: waiter'
[[ $OUT == *"run_id: dlc-42"* ]] || fail "(g) PAI_JOB_ID is the run id" "$OUT"
run explain SLURM_JOB_ID=981 SLURM_ARRAY_JOB_ID=980 SLURM_ARRAY_TASK_ID=1 SLURM_NTASKS=2 \
    SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NNODES=2 SLURM_JOB_END_TIME=2000000000
check "(g) Slurm: an array task's run id, rank 0 works" 0 \
    $'run_id: 980_1\nrun_id_from: SLURM_ARRAY_JOB_ID_SLURM_ARRAY_TASK_ID'
[[ $OUT == *"role: worker"* && $OUT == *"deadline: 2000000000 (SLURM_JOB_END_TIME)"* ]] ||
    fail "(g) Slurm: worker with the job's end time" "$OUT"
# Slurm before 23.02 sets no SLURM_JOB_END_TIME: the end is squeue's
mkdir -p "$W/sq"
cat >"$W/sq/squeue" <<'SQ'
#!/bin/sh
[ "$*" = "-h -j 982 -o %e" ] && echo 2033-05-18T03:33:20
SQ
chmod +x "$W/sq/squeue"
run explain PATH="$W/sq:$PATH" TZ=UTC SLURM_JOB_ID=982 SLURM_NTASKS=1 SLURM_PROCID=0 \
    SLURM_LOCALID=0
[[ $OUT == *"deadline: 2000000000 (squeue -o %e (no SLURM_JOB_END_TIME))"* ]] ||
    fail "(g) Slurm without SLURM_JOB_END_TIME: the end of the job from squeue" "$OUT"
if [ "$(id -u)" -eq 0 ] && command -v unshare >/dev/null; then
    run unshare -u sh -c 'hostname clean-job-7 && exec env JOB_COMPLETION_INDEX=7 "$0" run --job-dir "$1" --explain' "$ESD" "$W/job-x"
    check "(g) Kubernetes Indexed Job: the job name from the pod's host name" 0 \
        $'run_id: clean-job\nrun_id_from: the Kubernetes job name in the pod'"'"'s host name'
fi
run env -u JOB_COMPLETION_INDEX "$ESD" run --job-dir "$W/job-x" --explain
check "(g) no run id: refused" 2 "" "no run id: pass --run-id"
run env JOB_COMPLETION_INDEX=7 "$ESD" run --job-dir "$W/job-x" --explain
check "(g) JOB_COMPLETION_INDEX on a host not named as a pod: refused, naming the host" 2 "" \
    "but the host name \"$(hostname)\" is not <job name>-7"
[ ! -e "$W/job-x" ] && [ ! -e "$W/.job-x.dlc-coordination" ] || fail "(g) --explain creates nothing"
ok "(g) launcher ranks: one worker a host, the other ranks wait and exit with its code"

# ---- (h) a daemon on the same job at the same time ----
# (as root, the daemon runs the attempts of a job of nobody's, and esd run
# becomes the job's owner: the job, its parent and the nodes' state are
# nobody's)
mkdir -p "$W/hjobs" "$W/hstates"
JOB=$W/hjobs/job-h
prepare_job "$JOB" 12
give_job "$JOB"
[ "$(id -u)" -ne 0 ] || chown nobody: "$W/hstates" "$W/hjobs"
daemon_conf d1 slots=1
start_daemon d1 MINI_DJ_SLEEP_MS=10
spool_job "$JOB"
wait_for "(h) the daemon works the job" 30 eval '[ "$(job_state d1 "$JOB")" = active ]'
for n in h1 h2; do
    start_node "$JOB" "$n" run-h MINI_DJ_SLEEP_MS=10 -- --state-dir "$W/hstates/$n"
done
reap h1 h2
expect_codes 0 "(h) with a daemon" h1 h2
wait_for "(h) the daemon knows the job complete" 30 eval '[ "$(job_state d1 "$JOB")" = complete ]'
py 'sorted(set(json.load(open(f))["node"] for f in sys.argv[2:]))' "$JOB"/state/done/*.json \
    >"$W/h-nodes"
[[ $(cat "$W/h-nodes") == *d1* ]] || fail "(h) the daemon worked shards too" "$(cat "$W/h-nodes")"
M=$(cat "$W/d1/log" "$W"/h?.err | grep -c "every shard is done; merging into" || true)
[ "$M" -eq 1 ] || fail "(h) exactly one merge" "$M merges"
expect_merged "$JOB" "$W/expected-h.jsonl"
cmp -s "$W/expected-h.jsonl" "$JOB/merged.jsonl" || fail "(h) the merged output is the expected one"
stop_daemon d1
ok "(h) esd run and a daemon on one job: one merge, all exit 0"

# ---- (i) the reference's coordination files ----
JOB=$W/job-i
prepare_job "$JOB" 6
C=$(coord_of "$JOB" dlc-7)
mkdir -p "$C"
printf '{"created_at": "2026-11-30T10:00:00+00:00", "hostname": "ref-host", "phase": "prepare", "pid": 4242}\n' \
    >"$C/prepare.lock"
printf '{"finished_at": "2026-11-30T10:00:05+00:00", "hostname": "ref-host", "phase": "prepare", "return_code": 0}\n' \
    >"$C/prepare-result.json"
for n in i1 i2; do
    # shellcheck disable=SC2046
    start_node "$JOB" "$n" dlc-7 -- $(prepare_flags 6)
done
reap i1 i2
expect_codes 0 "(i) a run prepared by dlc_job.py" i1 i2
[ "$(lines_in "elected as prepare coordinator" i1 i2)" -eq 0 ] ||
    fail "(i) nobody prepares again" "$(cat "$W"/i?.out)"
py '(j["phase"], j["return_code"])' "$C/finalize-result.json" >"$W/i-final"
[ "$(cat "$W/i-final")" = "('finalize', 0)" ] || fail "(i) finalize-result.json" "$(cat "$W/i-final")"
ls -li "$JOB/merged.jsonl" >"$W/i-merged"
# a new run id: prepared again (idempotently), the merged job left alone
# shellcheck disable=SC2046
start_node "$JOB" i3 dlc-8 -- $(prepare_flags 6)
reap i3
expect_codes 0 "(i) a new run id" i3
said i3 "already prepared with this request" || fail "(i) re-prepared idempotently" \
    "$(cat "$W/i3.out")"
ls -li "$JOB/merged.jsonl" | cmp -s - "$W/i-merged" || fail "(i) the merged output is left alone"
# a reference coordinator that died holding prepare.lock (no lease):
# taken over after the wait timeout
C=$(coord_of "$JOB" dlc-9)
mkdir -p "$C"
printf '{"created_at": "2026-11-30T10:00:00+00:00", "hostname": "ref-host", "phase": "prepare", "pid": 4242}\n' \
    >"$C/prepare.lock"
touch -d '1 hour ago' "$C/prepare.lock"
# shellcheck disable=SC2046
start_node "$JOB" i4 dlc-9 -- $(prepare_flags 6) --wait-timeout-secs 30
reap i4
expect_codes 0 "(i) a dead reference coordinator" i4
said i4 "stopped renewing" || fail "(i) its lock is taken over" "$(cat "$W/i4.out")"
ok "(i) dlc_job.py's coordination files: its prepare is used, its dead lock taken over"

# ---- (j) walltime ----
JOB=$W/job-j
END=$(($(date +%s) + 14))
SL=(SLURM_NTASKS=2 "SLURM_JOB_END_TIME=$END")
# shellcheck disable=SC2046
start_node "$JOB" j1 run-j MINI_DJ_SLEEP_MS=60 "${SL[@]}" SLURM_PROCID=0 SLURM_LOCALID=0 \
    -- $(prepare_flags 8) --node host-j
start_node "$JOB" j2 run-j "${SL[@]}" SLURM_PROCID=1 SLURM_LOCALID=1 -- --node host-j
reap j1 j2
expect_codes 1 "(j) the walltime ends the run, of the worker and of the waiting rank" j1 j2
said j1 "walltime:" && said j1 "this node claims no more" || fail "(j) it says why it stops" \
    "$(cat "$W/j1.out")"
[ "$(count "$JOB/state/failed")" -eq 0 ] && [ "$(count "$JOB/state/locks")" -eq 0 ] ||
    fail "(j) nothing failed, nothing locked"
[ "$(date +%s)" -ge "$END" ] || fail "(j) it stopped at the deadline, not before"
D=$(count "$JOB/state/done")
[ "$D" -ge 1 ] && [ "$D" -lt 8 ] || fail "(j) some shards done, not all" "$D done"
ok "(j) walltime: $D of 8 shards done, no claim that could not end in time, exit 1"

# ---- (k) hostile coordination files ----
JOB=$W/job-k
C=$(coord_of "$JOB" run-k)
mkdir -p "$C"
mkfifo "$C/prepare-result.json"
# shellcheck disable=SC2046
start_node "$JOB" k1 run-k -- $(prepare_flags 4)
reap k1
expect_codes 2 "(k) a FIFO as prepare-result.json" k1
said k1 "prepare-result.json: not a regular file" || fail "(k) it names the file" \
    "$(cat "$W/k1.out")"
rm "$C/prepare-result.json"
ln -s /etc/passwd "$C/abort.json"
# shellcheck disable=SC2046
start_node "$JOB" k2 run-k -- $(prepare_flags 4)
reap k2
expect_codes 2 "(k) a symbolic link as abort.json" k2
said k2 "abort.json: a symbolic link, not followed" || fail "(k) it says so" "$(cat "$W/k2.out")"
ok "(k) hostile coordination files: refused at once, named, nothing followed or waited on"

# ---- (l) the persistent head's ray: the one next to --processor ----
# (a virtual environment of stand-ins: fake-ray, not Ray, and mini-dj)
mkdir -p "$W/venv/bin"
printf '#!/bin/sh\nexec python3 "%s" "$@"\n' "$FAKE_RAY" >"$W/venv/bin/ray"
printf '#!/bin/sh\nexec python3 "%s" python "$@"\n' "$FAKE_RAY" >"$W/venv/bin/python3"
cp "$MINI" "$W/venv/bin/mini-dj"
chmod 755 "$W/venv/bin/ray" "$W/venv/bin/python3"
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
printf 'attempt_env: [LANG, "MINI_DJ_*"]\nray:\n  port: %s\n' "$PORT" >"$W/run-l.yaml"
JOB=$W/job-l
# shellcheck disable=SC2046
run env PATH=/usr/bin:/bin "$ESD" run --job-dir "$JOB" --run-id run-l --node l1 \
    --state-dir "$W/state.l1" --processor "$W/venv/bin/mini-dj" --lease-secs 3 \
    --poll-interval-secs 0.3 --esd-config "$W/run-l.yaml" $(prepare_flags 4)
check "(l) the head of the processor's ray" 0 "ray persistent head"
# (no ray on that PATH: the head that came up is the stand-in's)
[[ $ERR == *"ray head up on 127.0.0.1:$PORT"* && $ERR == *"connected to Ray at 127.0.0.1:$PORT"* ]] &&
    [ -e "$W/state.l1/ray/session_latest" ] ||
    fail "(l) the head of $W/venv/bin/ray ran on port $PORT and the attempts used it" "$ERR"
# shellcheck disable=SC2046
run env PATH=/usr/bin:/bin "$ESD" run --job-dir "$W/job-l2" --run-id run-l2 --node l2 \
    --state-dir "$W/state.l2" --processor "$MINI" $(prepare_flags 4)
check "(l) no ray for a persistent head: refused at start" 2 "" "is not on PATH: pass --ray-command"
[ ! -e "$W/job-l2" ] || fail "(l) nothing prepared without a head"

summary
