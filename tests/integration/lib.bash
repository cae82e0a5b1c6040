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
#   summary                    "# NAME: all N checks passed".
# Setup:
#   new_workdir                W, a fresh temporary directory (physical
#                              path); ESD_SOCKET points into it (never a real
#                              esd). At exit (trap, INT/TERM exit 130)
#                              cleanup kills every pid in BG, the process
#                              groups and processes below them and every
#                              pid or group in STRAYS, then removes W.
#   unset_knobs [NAME...]      unsets every MINI_DJ_* and FAKE_RAY_* knob of
#                              the stand-ins, and the NAMEs given.
# Waiting and processes:
#   wait_for WHAT SECS CMD...  polls CMD every WAIT_POLL seconds (0.1 unless
#                              the script sets it) until it succeeds; fails
#                              WHAT once SECS seconds have passed.
#   alive PID / dead PID       the process exists and is not a zombie / not.
#   all_exited PID...          none of them is alive.
#   group_gone PGID            no process of the group is alive (zombies aside).
#   group_vanished PGID        no process of the group is left, not even a
#                              zombie (kill -0 fails).
#   descendants PID            the pids below PID, recursively.
# Files and commands:
#   count DIR                  how many names DIR holds (0 if it is missing).
#   py EXPR FILE...            a Python expression on JSON documents (j is
#                              the first, js all of them).
#   run CMD...                 runs CMD; exit status in RC, stdout and stderr
#                              in OUT and ERR (and $W/stdout, $W/stderr).
#   check WHAT RC [OUT] [ERR]  the last run's RC, and texts in OUT and ERR.

# ---- tool lookup ----
TOP=${TOP:-$(cd "$(dirname "$0")/../.." && pwd)}
ESCTL=${ESCTL:-$TOP/esctl}
case $ESCTL in /*) ;; *) ESCTL=$(pwd)/$ESCTL ;; esac
TOOLS=${TOOLS:-$(dirname "${JSONL_CHECK:-$TOP/build/default/tools/jsonl-check}")}
# shellcheck disable=SC2034 # used by the scripts
MINI="$TOOLS/mini-dj"
# shellcheck disable=SC2034 # used by the scripts
FAKE_RAY="$TOP/tests/tools/fake-ray"

# ---- reporting ----
SCRIPT=${0##*/}
SCRIPT=${SCRIPT%.sh}
PASSED=0
ok() {
    PASSED=$((PASSED + 1))
    echo "ok - $*"
}
fail() {
    echo "not ok - $1"
    shift
    for line in "$@"; do echo "#   $line"; done
    echo "# $SCRIPT: FAILED after $PASSED checks passed"
    exit 1
}
summary() { echo "# $SCRIPT: all $PASSED checks passed"; }

# ---- the temporary directory and what is started in the background ----
# Background processes started by the script (BG), and processes or groups
# seen below them that may outlive them (STRAYS); all killed at exit.
BG=()
STRAYS=()
descendants() {
    local k
    for k in $(pgrep -P "$1" 2>/dev/null || true); do
        echo "$k"
        descendants "$k"
    done
}
cleanup() {
    local p k
    for p in "${BG[@]}"; do
        for k in $(descendants "$p"); do
            kill -KILL -- "-$k" 2>/dev/null || true
            kill -KILL "$k" 2>/dev/null || true
        done
        kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null || true
    done
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

# ---- waiting and processes ----
WAIT_POLL=0.1
wait_for() {
    local what=$1 deadline
    deadline=$(($(date +%s) + $2))
    shift 2
    until "$@"; do
        [ "$(date +%s)" -le "$deadline" ] || fail "$what" "not within the deadline"
        sleep "$WAIT_POLL"
    done
}
alive() {
    local st
    st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
    [ -n "$st" ] && [ "$st" != Z ]
}
dead() { ! alive "$1"; }
all_exited() {
    local p
    for p in "$@"; do
        ! alive "$p" || return 1
    done
}
group_gone() {
    local p
    for p in $(pgrep -g "$1" 2>/dev/null || true); do
        ! alive "$p" || return 1
    done
}
group_vanished() { ! kill -0 -- "-$1" 2>/dev/null; }

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
    [ "$RC" -eq "$want" ] ||
        fail "$what" "exit status $RC, expected $want" "stdout: $OUT" "stderr: $ERR"
    [ -z "$out" ] || [[ $OUT == *"$out"* ]] ||
        fail "$what" "stdout lacks: $out" "stdout: $OUT" "stderr: $ERR"
    [ -z "$err" ] || [[ $ERR == *"$err"* ]] ||
        fail "$what" "stderr lacks: $err" "stdout: $OUT" "stderr: $ERR"
    ok "$what"
}
