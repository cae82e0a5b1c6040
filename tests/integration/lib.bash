# shellcheck shell=bash
# lib.bash: what the integration scripts of this directory share. Sourced,
# never run: `make integration` runs tests/integration/*.sh only, hence the
# other suffix. A script sources it with
#     # shellcheck source=tests/integration/lib.bash
#     . "$(dirname "$0")/lib.bash"
# after its own `set -euo pipefail`. Sourcing only sets variables and
# defines functions; new_workdir makes the temporary directory.
#
# Tool lookup (on sourcing):
#   TOP       repository root; default two levels above the script.
#   ESCTL     esctl binary, made absolute; default $TOP/esctl (a script that
#             wants another default sets ESCTL=${ESCTL:-...} before sourcing).
#   TOOLS     built test tools; default the directory of JSONL_CHECK if make
#             set it, else $TOP/build/default/tools.
#   MINI      $TOOLS/mini-dj, the test stand-in for Data-Juicer.
#   FAKE_RAY  $TOP/tests/tools/fake-ray, the test stand-in for the ray CLI.
# Reporting (fail-fast, TAP-like lines):
#   ok TEXT...                 "ok - TEXT", counted in PASSED.
#   fail WHAT [DETAIL...]      "not ok - WHAT", each DETAIL as a "#   " line,
#                              a summary naming the script (from $0), exit 1.
#                              With ESD_TEST_KEEP_GOING=1 it records WHAT and
#                              returns 0 (but ends the script from wait_for).
#   summary                    "# NAME: all N checks passed"; in keep-going
#                              mode, if any check failed, their list, exit 1.
#   skip REASON                "# SKIP NAME: REASON", exit 0: the script
#                              cannot run here; counted as skipped.
#   (ESD_TEST_TALLY: the directory where `make integration` collects how
#   each script ended: pass, fail or skip, one file per script.)
# Setup:
#   new_workdir                W, a fresh temporary directory (physical
#                              path); ESD_SOCKET points into it (never a real
#                              esd). At exit (trap, INT/TERM exit 130)
#                              cleanup kills every pid in BG, the process
#                              groups and processes below them and every
#                              pid or group in STRAYS, then removes W.
#   unset_knobs [NAME...]      unsets every MINI_DJ_* and FAKE_RAY_* knob of
#                              the stand-ins, and the NAMEs given.
# Waiting, processes and daemons: tests/tools/proc.bash (sourced here, its
#   errors reported with fail): wait_for WHAT SECS CMD..., poll, alive, dead,
#   all_exited, group_gone, group_vanished, descendants, kill_tree,
#   start_daemon NAME [ENV=VALUE...] (output in $W/NAME/log), stop_daemon
#   NAME [SIGNAL], reap_daemon NAME, dsock NAME, DPID, DRC, DAEMON_AS.
# Files and commands:
#   count DIR                  how many names DIR holds (0 if it is missing).
#   py EXPR FILE...            a Python expression on JSON documents (j is
#                              the first, js all of them).
#   run CMD...                 runs CMD; exit status in RC, stdout and stderr
#                              in OUT and ERR (and $W/stdout, $W/stderr).
#   check WHAT RC [OUT] [ERR]  the last run's RC, and texts in OUT and ERR.
# The mini-dj text job (mini-dj applies the two operators of recipe.yaml):
#   text_dataset [N]           $W/data.jsonl: N (default 1000) short records
#                              whose text has runs of blanks, tabs and
#                              newlines, some non-ASCII, every 50th blank
#                              only; $W/expected.jsonl: the kept records
#                              after both operators, computed in Python;
#                              $W/kept.txt: 1 or 0 per input record;
#                              $W/recipe.yaml: whitespace_normalization_mapper
#                              and text_length_filter (min_len 1).
#   prepare_job JOB SHARDS     esctl prepare --local of that job into JOB.
#   expect_merged JOB OUT      the merge of JOB as mini-dj's export order
#                              makes it, computed independently, into OUT
#                              (the job's shards in manifest order must be
#                              the input cut in order).
# Daemons (esd -f, one per simulated node, all in W):
#   daemon_conf NAME [KEY=VALUE...]
#                              writes $W/NAME/esd.yaml: node_name NAME,
#                              slots 1, lease_secs 3, poll_interval_secs 1,
#                              processor $MINI, ray.mode off, state_dir
#                              $W/NAME/state, socket $W/NAME/esd.sock,
#                              spool_dir $W/spool, shared_fs_check false
#                              (every node on one local disk), log.target stderr,
#                              log.level debug, attempt_env esd's default
#                              plus the stand-ins' knobs (MINI_DJ_*,
#                              FAKE_RAY_*) and the sanitizers' options, so
#                              that knobs given to start_daemon reach the
#                              attempts. KEY=VALUE (ray.mode=... for
#                              a section's key) replaces a default or adds
#                              a key; VALUE is written as YAML, unquoted.
#   dstatus NAME               its status (JSON) in $W/NAME/status.json.
#   give_job JOB               makes JOB the job of an unprivileged user when
#                              run as root (esd refuses to run attempts as
#                              root): chown -R nobody, and W traversable.
#   spool_job JOB [OUTPUT]     registers JOB in $W/spool (atomically).

# ---- tool lookup ----
TOP=${TOP:-$(cd "$(dirname "$0")/../.." && pwd)}
export TOP
ESCTL=${ESCTL:-$TOP/esctl}
case $ESCTL in /*) ;; *) ESCTL=$(pwd)/$ESCTL ;; esac
TOOLS=${TOOLS:-$(dirname "${JSONL_CHECK:-$TOP/build/default/tools/jsonl-check}")}
# shellcheck disable=SC2034 # used by the scripts
MINI="$TOOLS/mini-dj"
# shellcheck disable=SC2034 # used by the scripts
FAKE_RAY="$TOP/tests/tools/fake-ray"
# shellcheck source=tests/tools/proc.bash
. "$TOP/tests/tools/proc.bash"
PROC_FAIL=fail

# ---- reporting ----
SCRIPT=${0##*/}
SCRIPT=${SCRIPT%.sh}
PASSED=0
# ESD_TEST_KEEP_GOING=1: a failed check is recorded (in a file, so that a
# failure inside $(...) or a pipeline counts too) and the script goes on;
# summary then fails listing them. A failed wait_for still ends the script
# (what follows depends on what it waited for), listing what failed so far.
KEEP_GOING_LOG=
if [ "${ESD_TEST_KEEP_GOING:-}" = 1 ]; then
    KEEP_GOING_LOG=$(mktemp "${TMPDIR:-/tmp}/esd-failed.XXXXXX")
fi
ok() {
    PASSED=$((PASSED + 1))
    echo "ok - $*"
}
# failed_list: the checks recorded as failed in keep-going mode, one a line.
failed_list() { [ -z "$KEEP_GOING_LOG" ] || cat "$KEEP_GOING_LOG" 2>/dev/null || true; }
# tally_note WORD [TEXT]: tells `make integration` (ESD_TEST_TALLY, a
# directory it makes) how this script ended; nothing when run by hand.
tally_note() {
    [ -n "${ESD_TEST_TALLY:-}" ] || return 0
    printf '%s %s\n' "$1" "${2:-}" >"$ESD_TEST_TALLY/$SCRIPT" 2>/dev/null || true
}
# failed_exit: the keep-going report of the failed checks, and exit 1.
failed_exit() {
    local n
    n=$(failed_list | wc -l)
    echo "# $SCRIPT: FAILED: $n failed check(s), $PASSED passed:"
    failed_list | sed 's/^/#   - /'
    rm -f "$KEEP_GOING_LOG"
    tally_note fail "$PASSED passed, $n failed"
    exit 1
}
fail() {
    echo "not ok - $1"
    [ -z "$KEEP_GOING_LOG" ] || echo "$1" >>"$KEEP_GOING_LOG"
    local what=$1 line
    shift
    for line in "$@"; do echo "#   $line"; done
    if [ -n "$KEEP_GOING_LOG" ]; then
        [ "${FUNCNAME[1]:-}" = wait_for ] || return 0
        failed_exit
    fi
    echo "# $SCRIPT: FAILED after $PASSED checks passed"
    tally_note fail "$PASSED passed, then: $what"
    exit 1
}
summary() {
    [ -z "$(failed_list)" ] || failed_exit
    [ -z "$KEEP_GOING_LOG" ] || rm -f "$KEEP_GOING_LOG"
    echo "# $SCRIPT: all $PASSED checks passed"
    tally_note pass "$PASSED checks"
}
# skip REASON: the whole script cannot run here (a missing tool, not root):
# one "# SKIP NAME: REASON" line, counted as skipped by `make integration`,
# and exit 0. A script that skips only some of its checks prints a
# "# skip: ..." note instead and goes on.
skip() {
    echo "# SKIP $SCRIPT: $*"
    [ -z "$KEEP_GOING_LOG" ] || rm -f "$KEEP_GOING_LOG"
    tally_note skip "$*"
    exit 0
}

# ---- the temporary directory and what is started in the background ----
# Background processes started by the script (BG, proc.bash's), and
# processes or groups seen below them that may outlive them (STRAYS); all
# killed at exit.
STRAYS=()
cleanup() {
    [ -z "${KEEP:-}" ] || { echo "# kept $W"; W=/nonexistent; }
    local p
    kill_tree "${BG[@]}"
    for p in "${STRAYS[@]}"; do
        kill -KILL -- "-$p" 2>/dev/null || true
        kill -KILL "$p" 2>/dev/null || true
    done
    # reaped here, quietly (bash reports jobs killed by a signal)
    { wait 2>/dev/null; } 2>/dev/null || true
    rm -rf "$W"
}
new_workdir() {
    W=$(mktemp -d)
    W=$(cd "$W" && pwd -P)
    trap cleanup EXIT
    trap 'exit 130' INT TERM
    export ESD_SOCKET="$W/no-esd.sock"
}
# shellcheck disable=SC2120 # the extra names are optional
unset_knobs() {
    unset "${!MINI_DJ_@}" "${!FAKE_RAY_@}" "$@" || true
}

# ---- the mini-dj text job ----
# The expectation applies both operators to the parsed records and
# serialises them as the input is: compact JSON, raw UTF-8.
text_dataset() {
    python3 - "$W" "${1:-1000}" <<'EOF'
import json, re, sys
w, n = sys.argv[1], int(sys.argv[2])
def dump(o):
    return json.dumps(o, ensure_ascii=False, separators=(",", ":")) + "\n"
with open(w + "/data.jsonl", "w", encoding="utf-8") as f, \
     open(w + "/expected.jsonl", "w", encoding="utf-8") as e, \
     open(w + "/kept.txt", "w") as k:
    for i in range(n):
        if i % 50 == 7:
            text = " \t \n  "
        else:
            text = "  record\t%d  has   extra\n whitespace  caf\u00e9 %s " % (i, "x" * (i % 13))
        rec = {"id": i, "text": text, "meta": {"n": i * 7, "tag": "t%d" % (i % 5)}}
        f.write(dump(rec))
        norm = re.sub(r"[ \t\n\r\f\v]+", " ", text).strip()
        if len(norm) >= 1:
            rec["text"] = norm
            e.write(dump(rec))
        k.write("%d\n" % (len(norm) >= 1))
EOF
    printf 'process:\n  - whitespace_normalization_mapper:\n  - text_length_filter:\n      min_len: 1\n' \
        >"$W/recipe.yaml"
}
# prepare_job JOB SHARDS [prepare options]: JOB prepared from text_dataset's
# data and recipe.
prepare_job() {
    local job=$1 shards=$2
    shift 2
    "$ESCTL" prepare --local --config "$W/recipe.yaml" --dataset-path "$W/data.jsonl" \
        --job-dir "$job" --num-shards "$shards" "$@" >"$W/prepare.out" 2>&1 ||
        fail "prepare $job" "$(cat "$W/prepare.out")"
}
# expect_merged JOB OUT: the expected merge of JOB into OUT. The shards (in
# manifest order) must be the input cut in order; each shard's kept rows
# (expected.jsonl) are cut into mini-dj's 12 contiguous array_split chunks,
# the empty ones dropped, and the chunks concatenated in the string order of
# their names, i.e. of sha256("mini-dj task i")[:32] (the dataset id is the
# same for every part of an attempt).
expect_merged() {
    python3 - "$1" "$W" "$2" <<'EOF'
import hashlib, json, sys
job, w, dest = sys.argv[1:]
shards = sorted(json.load(open(job + "/manifest.json"))["shards"], key=lambda s: s["index"])
data = open(w + "/data.jsonl", "rb").read()
assert b"".join(open(job + "/" + s["path"], "rb").read() for s in shards) == data, \
    "the shards are the input cut in order"
kept = open(w + "/kept.txt").read().split()
rows = iter(open(w + "/expected.jsonl", "rb").read().splitlines(keepends=True))
def task(i):
    return hashlib.sha256(b"mini-dj task %d" % i).hexdigest()[:32]
P, pos, out = 12, 0, []
for s in shards:
    mine = [next(rows) for k in kept[pos:pos + s["rows"]] if k == "1"]
    pos += s["rows"]
    q, r = divmod(len(mine), P)
    chunks = [mine[i * q + min(i, r):(i + 1) * q + min(i + 1, r)] for i in range(P)]
    chunks = [c for c in chunks if c]
    for i in sorted(range(len(chunks)), key=task):
        out += chunks[i]
assert pos == len(kept) and next(rows, None) is None
open(dest, "wb").write(b"".join(out))
EOF
}

# ---- daemons ----
ESD=${ESD:-$TOP/esd}
case $ESD in /*) ;; *) ESD=$(pwd)/$ESD ;; esac
# esd's default attempt_env and what the tests pass through esd to attempts
DAEMON_ATTEMPT_ENV="LANG, LANGUAGE, LC_*, TZ, CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES,\
 HF_ENDPOINT, HF_HUB_OFFLINE, HTTP_PROXY, HTTPS_PROXY, NO_PROXY, http_proxy, https_proxy,\
 no_proxy, MINI_DJ_*, FAKE_RAY_*, ASAN_OPTIONS, UBSAN_OPTIONS, LSAN_OPTIONS"
daemon_conf() {
    local name=$1 kv k sec
    local -A v=([node_name]=$name [slots]=1 [lease_secs]=3 [poll_interval_secs]=1
        [processor]=$MINI [ray.mode]=off [state_dir]=$W/$name/state
        [socket]=$W/$name/esd.sock [spool_dir]=$W/spool [shared_fs_check]=false [log.target]=stderr
        [log.level]=debug [attempt_env]="[$DAEMON_ATTEMPT_ENV]")
    shift
    for kv in "$@"; do v[${kv%%=*}]=${kv#*=}; done
    mkdir -p "$W/$name" "$W/spool"
    {
        for k in $(printf '%s\n' "${!v[@]}" | grep -v '\.' | sort); do
            echo "$k: ${v[$k]}"
        done
        for sec in $(printf '%s\n' "${!v[@]}" | grep '\.' | cut -d. -f1 | sort -u); do
            echo "$sec:"
            for k in $(printf '%s\n' "${!v[@]}" | grep "^$sec\." | sort); do
                echo "  ${k#*.}: ${v[$k]}"
            done
        done
    } >"$W/$name/esd.yaml"
}
dstatus() {
    "$ESCTL" --json --socket "$(dsock "$1")" status >"$W/$1/status.json" 2>"$W/$1/status.err" ||
        fail "status of esd $1" "$(cat "$W/$1/status.err")"
}
# job_state NODE JOB_DIR: the state of JOB_DIR in NODE's status ("absent").
job_state() {
    dstatus "$1"
    python3 - "$W/$1/status.json" "$2" <<'EOF'
import json, sys
st, job = json.load(open(sys.argv[1])), sys.argv[2]
print(" ".join(j["state"] for j in st["jobs"] if j["job_dir"] == job) or "absent")
EOF
}
# job_field NODE JOB EXPR: a Python expression on JOB's entry (x) in NODE's
# status ("absent" if NODE does not know JOB yet).
job_field() {
    dstatus "$1"
    python3 - "$W/$1/status.json" "$2" "$3" <<'EOF'
import json, sys
st, job, expr = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
xs = [x for x in st["jobs"] if x["job_dir"] == job]
print(eval(expr, {"x": xs[0]}) if xs else "absent")
EOF
}
# in_mount_ns WHAT "$@": re-runs the calling script in a private mount
# namespace (where it may mount a small tmpfs that no one else sees), or
# skips (skip) naming WHAT when not root.
in_mount_ns() {
    local what=$1
    shift
    [ "${ESD_IN_NS:-}" != 1 ] || return 0
    if [ "$(id -u)" -ne 0 ] || ! command -v unshare >/dev/null; then
        skip "$what needs root and unshare(1) to mount a small tmpfs"
    fi
    exec unshare --mount --propagation private env ESD_IN_NS=1 TOP="$TOP" ESCTL="$ESCTL" \
        ESD="${ESD:-}" JSONL_CHECK="${JSONL_CHECK:-}" bash "$0" "$@"
}
# need_real_stack: VENV is the real Data-Juicer and Ray (ESD_VENV, else
# scripts/venv's .venv); the script skips (skip) when they are not installed.
need_real_stack() {
    VENV=${ESD_VENV:-$TOP/.venv}
    if [ ! -x "$VENV/bin/dj-process" ] || [ ! -x "$VENV/bin/ray" ]; then
        skip "the real Data-Juicer and Ray are not installed (run scripts/venv)"
    fi
}
# not_owned_by USER PATH...: up to five files under the PATHs that are not
# USER's. A file that vanishes while find reads it (a daemon's transient
# probe file) is not one: find would list it, its owner unknown.
not_owned_by() {
    local user=$1 f
    shift
    find "$@" ! -user "$user" 2>/dev/null | while IFS= read -r f; do
        find "$f" -maxdepth 0 ! -user "$user" 2>/dev/null
    done | head -n 5
}
# need_daemon_tools: the daemon tests' programs are built.
need_daemon_tools() {
    { [ -x "$MINI" ] && [ -x "$ESCTL" ] && [ -x "$ESD" ]; } || fail "tools exist" "run make && make tools"
}
give_job() {
    [ "$(id -u)" -eq 0 ] || return 0
    chmod 755 "$W"
    chown -R nobody: "$1"
}
spool_job() {
    local name
    name=$(basename "$1")
    mkdir -p "$W/spool"
    if [ -n "${2:-}" ]; then
        printf '{"job_dir": "%s", "output": "%s"}\n' "$1" "$2"
    else
        printf '{"job_dir": "%s"}\n' "$1"
    fi >"$W/spool/.$name.tmp"
    mv "$W/spool/.$name.tmp" "$W/spool/$name.json"
}

# ---- files and commands ----
count() { find "$1" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l; }
py() {
    python3 -c 'import json,sys
js = [json.load(open(f)) for f in sys.argv[2:]]
j = js[0]
print(eval(sys.argv[1]))' "$@"
}
# The braces keep bash's own "Aborted" report of a killed child quiet.
run() {
    RC=0
    { "$@" >"$W/stdout" 2>"$W/stderr"; } 2>/dev/null || RC=$?
    OUT=$(cat "$W/stdout")
    ERR=$(cat "$W/stderr")
}
check() {
    local what=$1 want=$2 out=${3:-} err=${4:-}
    # (a failed part returns: in keep-going mode the check counts once)
    [ "$RC" -eq "$want" ] ||
        { fail "$what" "exit status $RC, expected $want" "stdout: $OUT" "stderr: $ERR"; return 0; }
    [ -z "$out" ] || [[ $OUT == *"$out"* ]] ||
        { fail "$what" "stdout lacks: $out" "stdout: $OUT" "stderr: $ERR"; return 0; }
    [ -z "$err" ] || [[ $ERR == *"$err"* ]] ||
        { fail "$what" "stderr lacks: $err" "stdout: $OUT" "stderr: $ERR"; return 0; }
    ok "$what"
}

# real_stack_as_nobody: for the real-stack tests (VENV, RAY, DJ set). As
# root, nobody runs the daemons, their heads and the attempts: proc.bash's
# venv_for_nobody, then DAEMON_AS=nobody. Nothing as another user.
real_stack_as_nobody() {
    [ "$(id -u)" -eq 0 ] || return 0
    venv_for_nobody
    [ -z "$VENV_OVERLAY" ] || echo "# $(readlink -f "$VENV/bin/python") is not executable by nobody:" \
        "the heads and attempts use $VENV_OVERLAY with .venv's packages"
    export DAEMON_AS=nobody
}

# ---- daemons on the real stack ----
# free_ports N: N distinct free TCP ports of 127.0.0.1 into PORTS (all
# bound at once, so distinct; free when chosen), for the ports a Ray head
# would otherwise take at fixed defaults that two heads would fight over.
free_ports() {
    read -r -a PORTS <<<"$(python3 -c '
import socket, sys
ss = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    ss.append(s)
print(" ".join(str(s.getsockname()[1]) for s in ss))' "$1")"
}
# real_conf NAME I [KEY=V...]: daemon_conf for a daemon with a persistent
# head of the real Ray on PORTS[I..I+5] and Data-Juicer as its processor;
# KEY=V as daemon_conf's, after these.
real_conf() {
    local n=$1 p=("${PORTS[@]:$2:6}")
    shift 2
    daemon_conf "$n" ray.mode=persistent "ray.port=${p[0]}" "ray.command=$RAY" \
        "ray.args=[--dashboard-port=${p[1]}, --dashboard-agent-listen-port=${p[2]},\
 --dashboard-agent-grpc-port=${p[3]}, --runtime-env-agent-port=${p[4]},\
 --metrics-export-port=${p[5]}]" "processor=$DJ" "$@"
}
# start_real NAME: start_daemon, with the home of real_stack_as_nobody's
# user when the daemons run as one.
start_real() {
    if [ -n "${DAEMON_AS:-}" ]; then
        start_daemon "$1" HOME="$W/home"
    else
        start_daemon "$1"
    fi
}
# head_pgid NAME: the process group of NAME's head (its `ray start`), from
# its log.
head_pgid() {
    sed -n 's/.*starting the ray head on .* (pid \([0-9]*\), temp dir .*/\1/p' "$W/$1/log"
}
real_ray_up() {
    dstatus "$1"
    [ "$(py 'j["ray"]["state"]' "$W/$1/status.json")" = up ]
}
# heads_up NODE...: waits for each NODE's head to come up, its process
# group then left for cleanup to end (STRAYS).
heads_up() {
    local n
    for n in "$@"; do
        wait_for "esd $n's Ray head comes up" 120 real_ray_up "$n"
        STRAYS+=("$(head_pgid "$n")")
    done
}

# ---- the real Ray dying under load ----
# ray_heads_up NODE: how many times esd NODE logged its Ray head up.
ray_heads_up() { grep -c 'ray head up on' "$W/$1/log" || true; }
# ray_restarts_logged NODE: how many times esd NODE logged its head gone
# (the head's exit, or a failed check and the restart it schedules).
ray_restarts_logged() {
    grep -c -E 'ray head \(pid [0-9]+\) exited|ray head on .*; restarting in' "$W/$1/log" || true
}
# ray_restarted_nodes NODE...: the NODEs whose head came up more than once
# (the real Ray can die on a busy machine; esd restarts it), blank-separated.
# A test of esd on the real Ray lets a shard of such a node have later
# attempts, provided each one before the last was an infrastructure failure.
ray_restarted_nodes() {
    local n
    for n in "$@"; do
        [ "$(ray_heads_up "$n")" -le 1 ] || printf '%s ' "$n"
    done
}
