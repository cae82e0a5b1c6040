#!/usr/bin/env bash
# completion: `esctl completion` prints a bash completion script made from
# the command table. Sourced into this shell, its function _esctl is driven
# the way bash drives it (COMP_WORDS, COMP_CWORD) and its COMPREPLY checked:
# the first word completes to every command `esctl --help` lists and to the
# global options, a command's options complete from their prefix, a path
# option's value to files, an option's other values to nothing, and the
# positional job directory to directories.
#
# Environment: ESCTL, TOP (see lib.bash).
set -euo pipefail
# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

new_workdir
[ -x "$ESCTL" ] || fail "esctl exists" "not executable: $ESCTL (run make first)"

run "$ESCTL" completion
check "esctl completion exits 0" 0 "complete -F _esctl esctl"
printf '%s\n' "$OUT" >"$W/esctl.bash"
bash -n "$W/esctl.bash" || fail "the script is valid bash" "$(cat "$W/esctl.bash")"
ok "the script is valid bash"
# shellcheck source=/dev/null
. "$W/esctl.bash"
declare -F _esctl >/dev/null || fail "the script defines _esctl"
ok "the script defines _esctl"

# complete WORD...: runs _esctl with the cursor on the last WORD (which may
# be empty); the candidates, one a line, in $W/reply and REPLY_TEXT.
complete_words() {
    COMP_WORDS=(esctl "$@")
    COMP_CWORD=$((${#COMP_WORDS[@]} - 1))
    COMP_LINE="${COMP_WORDS[*]}"
    COMP_POINT=${#COMP_LINE}
    COMPREPLY=()
    _esctl
    printf '%s\n' "${COMPREPLY[@]+"${COMPREPLY[@]}"}" | sed '/^$/d' | sort >"$W/reply"
    REPLY_TEXT=$(cat "$W/reply")
}
# expect WHAT WANT...: the candidates are exactly WANT (any order).
expect() {
    local what=$1
    shift
    if [ "$(printf '%s\n' "$@" | sed '/^$/d' | sort)" != "$REPLY_TEXT" ]; then
        fail "$what" "expected: $*" "got: $(tr '\n' ' ' <"$W/reply")"
    fi
    ok "$what"
}
# has WHAT WORD...: every WORD is among the candidates.
has() {
    local what=$1 w
    shift
    for w in "$@"; do
        grep -qxF -- "$w" "$W/reply" || fail "$what" "$w missing" "got: $(tr '\n' ' ' <"$W/reply")"
    done
    ok "$what"
}

# ---- commands ----
complete_words st
expect "\"esctl st\" completes to status" status

cmds=$("$ESCTL" --help | awk '/^commands:/ {on=1; next} on && /^  [a-z]/ {print $1} on && /^$/ {on=0}')
[ "$(echo "$cmds" | wc -l)" -ge 10 ] || fail "commands parsed from esctl --help" "$cmds"
complete_words ""
# shellcheck disable=SC2086 # one command a word
has "every command of esctl --help is a first-word completion" $cmds
has "the global options are first-word completions" --json --local --socket --color --help \
    --version
[ "$(grep -vc -- '^--' "$W/reply")" -eq "$(echo "$cmds" | wc -l)" ] ||
    fail "the first word offers nothing but commands and options" "$REPLY_TEXT"
ok "the first word offers nothing but commands and options"

complete_words --json --socket /x/esd.sock vers
expect "commands complete after global options and --socket's value" version

# ---- options ----
complete_words merge --ov
expect "\"esctl merge --ov\" completes to --overwrite" --overwrite

complete_words merge /some/job --
has "merge's options after its job directory" --output --overwrite --job-dir --lock-timeout-secs \
    --json --local --help
! grep -qxF -- --num-shards "$W/reply" || fail "merge does not offer prepare's --num-shards"
ok "merge does not offer prepare's --num-shards"

complete_words drain --
expect "drain's options are its own and the global ones" --release --wait --json --local \
    --socket --color --help

complete_words status --color a
expect "--color's values complete" auto always

complete_words status --w
expect "\"esctl status --w\" completes to --watch" --watch

# Every option that `esctl <cmd> --help` lists is offered for that command.
for c in $cmds; do
    complete_words "$c" --
    # shellcheck disable=SC2046 # one option a word
    has "every option of $c is offered" $("$ESCTL" "$c" --help | grep -o -- '^  --[a-z-]*')
done

# ---- values ----
mkdir -p "$W/files/sub.d"
: >"$W/files/recipe.yaml"
: >"$W/files/data.jsonl"
cd "$W/files"
complete_words prepare --config ""
expect "\"esctl prepare --config \" offers files and directories" recipe.yaml data.jsonl sub.d
complete_words prepare --config re
expect "\"esctl prepare --config re\" completes the file name" recipe.yaml
complete_words prepare --config = ""
expect "\"--config=\" offers files too" recipe.yaml data.jsonl sub.d
complete_words prepare --job-dir ""
expect "\"--job-dir \" offers directories only" sub.d
complete_words prepare --num-shards ""
expect "\"--num-shards \" offers nothing" ""
complete_words merge ""
expect "merge's positional job directory offers directories" sub.d
complete_words merge sub.d ""
has "after the job directory, merge offers its options" --output
complete_words --socket ""
has "--socket's value offers files" recipe.yaml data.jsonl
cd "$TOP"

# ---- the script comes from the table alone ----
grep -q "merge)" "$W/esctl.bash" || fail "the script has a case per command"
for c in $cmds; do
    grep -q "^    $c)\$" "$W/esctl.bash" || fail "the script has a case for $c"
done
ok "the script has a case for every command"

summary
