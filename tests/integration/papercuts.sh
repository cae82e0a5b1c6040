#!/usr/bin/env bash
# papercuts: small things of esctl's and esd's command lines, without a
# daemon: the did-you-mean of mistyped commands and options (esctl, esd,
# esd run); --shard and --shard-id alike for logs and retry; colour by
# --color and NO_COLOR (no-color.org: set and not empty), on a terminal made
# by script(1); a job directory that is not one (missing, not a directory,
# no manifest, unreadable) named as such by every command, in-process and
# through esd.
#
# Environment: ESCTL, ESD (absolute paths of the binaries), TOP.
set -euo pipefail

ESCTL=${ESCTL:-./esctl}
# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"
new_workdir
[ -x "$ESCTL" ] || fail "esctl exists" "not executable: $ESCTL (run make first)"
[ -x "$ESD" ] || fail "esd exists" "not executable: $ESD (run make first)"

# ---- did you mean ----
run "$ESCTL" stauts
check "a mistyped command: did you mean" 2 "" "esctl: unknown command 'stauts'; did you mean 'status'?"
[[ $ERR != *usage:* ]] || fail "a suggestion comes without the usage" "stderr: $ERR"
ok "a suggestion comes without the usage"
run "$ESCTL" frobnicate
check "a command far from every name: the usage, no suggestion" 2 "" "usage: esctl"
[[ $ERR != *"did you mean"* ]] || fail "no suggestion for frobnicate" "stderr: $ERR"
run "$ESCTL" status --wath
check "a mistyped option: did you mean" 2 "" \
    "esctl: status: unknown option '--wath'; did you mean '--watch'?"
run "$ESCTL" merge "$W" --overwirte
check "a swap in an option: did you mean" 2 "" "did you mean '--overwrite'?"
run "$ESCTL" retry "$W" --all-faild=1
check "a mistyped option with a value: did you mean" 2 "" \
    "unknown option '--all-faild'; did you mean '--all-failed'?"
run "$ESCTL" --sokcet /x status
check "a mistyped global option: did you mean" 2 "" \
    "unknown option '--sokcet'; did you mean '--socket'?"
run "$ESCTL" status --frobnicate
check "an option far from every name: see --help" 2 "" \
    "status: unknown option '--frobnicate' (see esctl status --help)"
run "$ESD" --forground
check "esd: a mistyped option: did you mean" 2 "" \
    "esd: unknown option '--forground'; did you mean '--foreground'?"
run "$ESD" --config
check "esd: an option without its value" 2 "" "esd: option '--config' needs a value"
run "$ESD" run --job-dri "$W/job"
check "esd run: a mistyped option: did you mean" 2 "" \
    "esd run: unknown option '--job-dri'; did you mean '--job-dir'?"
run "$ESD" run --explain=yes
check "esd run: a flag with a value" 2 "" "esd run: option '--explain' takes no value"
run "$ESD" run --frobnicate
check "esd run: an option far from every name" 2 "" "esd run: unknown or ambiguous option '--frobnicate'"

# ---- --shard and --shard-id ----
text_dataset 20
prepare_job "$W/job" 2
ID=$(py 'j["shards"][0]["id"]' "$W/job/manifest.json")
run "$ESCTL" --local logs "$W/job" --shard-id "$ID"
check "logs takes --shard-id as --shard" 2 "" "shard $ID of $W/job has no attempt yet"
run "$ESCTL" --local retry "$W/job" --shard nosuch --shard "$ID"
check "retry takes --shard as --shard-id (repeatable)" 2 "" "Unknown shard IDs: nosuch"
run "$ESCTL" --local retry "$W/job" --shard "$ID"
check "retry --shard of a pending shard" 0 "No failed shards selected"
run "$ESCTL" logs "$W/job" --shard a --shard-id b
check "logs: --shard and its alias are one option" 2 "" "logs: --shard given twice"
run "$ESCTL" logs --help
check "logs --help names the alias" 0 "(alias --shard-id)"
run "$ESCTL" completion
[[ $OUT == *'opts=" --job-dir --all-failed --shard-id"'* ]] &&
    [[ $OUT == *'opts=" --job-dir --shard --follow --lines --attempt"'* ]] ||
    fail "completion offers retry --shard-id and logs --shard" "$OUT"
ok "completion offers retry --shard-id and logs --shard"

# ---- colour ----
ESC=$'\033['
"$TOP/tests/tools/fake-finish" --job-dir "$W/job" --shard-id "$ID" >/dev/null ||
    fail "fake-finish a shard" "exit $?"
# on_tty ENV...: esctl status --all of the job on a pseudo-terminal (the
# environment ENV... on top of this one), its output in OUT
on_tty() {
    OUT=$(env "$@" script -qec "$(printf '%q ' "$ESCTL" --local status --all "$W/job")" \
        /dev/null </dev/null) || true
}
command -v script >/dev/null || fail "script(1) exists" "needed for a terminal"
on_tty -u NO_COLOR TERM=xterm
[[ $OUT == *"$ESC"* ]] || fail "colour on a terminal" "$OUT"
ok "colour on a terminal"
on_tty NO_COLOR= TERM=xterm
[[ $OUT == *"$ESC"* ]] || fail "an empty NO_COLOR keeps colour" "$OUT"
ok "an empty NO_COLOR keeps colour"
on_tty NO_COLOR=0 TERM=xterm
[[ $OUT != *"$ESC"* ]] || fail "NO_COLOR=0 (set, not empty): no colour" "$OUT"
ok "NO_COLOR=0 (set, not empty): no colour"
on_tty -u NO_COLOR TERM=dumb
[[ $OUT != *"$ESC"* ]] || fail "TERM=dumb: no colour" "$OUT"
ok "TERM=dumb: no colour"
OUT=$(env -u NO_COLOR TERM=xterm script -qec \
    "$(printf '%q ' "$ESCTL" --color=never --local status --all "$W/job")" /dev/null </dev/null) || true
[[ $OUT != *"$ESC"* ]] || fail "--color=never on a terminal: no colour" "$OUT"
ok "--color=never on a terminal: no colour"
run env NO_COLOR=1 "$ESCTL" --local status --all "$W/job" --color always
[[ $OUT == *"$ESC"* ]] || fail "--color always, not a terminal, NO_COLOR=1: colour" "$OUT"
ok "--color always, not a terminal, NO_COLOR=1: colour"
run env -u NO_COLOR TERM=xterm "$ESCTL" --local status --all "$W/job"
[[ $OUT != *"$ESC"* ]] || fail "not a terminal: no colour" "$OUT"
ok "not a terminal: no colour"
run "$ESCTL" --color=sometimes --local status "$W/job"
check "a bad --color" 2 "" "--color must be auto, always or never, got 'sometimes'"

# ---- not a job directory ----
mkdir "$W/empty"
: >"$W/file"
want_empty="$W/empty: not a job directory (no manifest.json): prepare it first, or check the path"
# each CMD [ARGS] of a job dir, in-process
for c in status logs "retry --all-failed" merge verify "worker --max-shards 1"; do
    # shellcheck disable=SC2086 # the command and its options
    set -- $c
    run "$ESCTL" --local "$1" "$W/empty" "${@:2}"
    check "$1 of a directory without a manifest" 2 "" "$want_empty"
    run "$ESCTL" --local "$1" "$W/missing" "${@:2}"
    check "$1 of a missing directory" 2 "" "$W/missing: no such directory"
    run "$ESCTL" --local "$1" "$W/file" "${@:2}"
    check "$1 of a file" 2 "" "$W/file: not a directory"
done
if [ "$(id -u)" -eq 0 ] && id nobody >/dev/null 2>&1; then
    chmod 711 "$W"
    mkdir -m 700 "$W/locked"
    run setpriv --reuid=nobody --regid=nogroup --clear-groups "$ESCTL" --local status "$W/locked"
    check "status of an unreadable directory: permission denied" 4 "" \
        "$W/locked: cannot read the directory: Permission denied"
    chmod 700 "$W"
else
    echo "ok - # skip an unreadable directory (needs root and nobody)"
fi

# through esd (which refuses to submit a root-owned directory before it looks in)
[ "$(id -u)" -ne 0 ] || { chown nobody: "$W/empty"; chmod 711 "$W"; }
daemon_conf n1
start_daemon n1
S=$(dsock n1)
for c in status logs verify "retry --all-failed" merge; do
    # shellcheck disable=SC2086
    set -- $c
    run "$ESCTL" --socket "$S" "$1" "$W/empty" "${@:2}"
    check "esd: $1 of a directory without a manifest" 2 "" "$want_empty"
done
run "$ESCTL" --socket "$S" status "$W/missing"
check "esd: status of a missing directory" 2 "" "$W/missing: no such directory"
run "$ESCTL" --socket "$S" submit "$W/empty"
check "esd: submit of a directory without a manifest" 2 "" "$want_empty"
run "$ESCTL" --socket "$S" --json cancel "$W/empty" --everywhere
check "esd: cancel --everywhere of a directory without a manifest" 2 '"code": "not-found"' \
    "$want_empty"

summary
