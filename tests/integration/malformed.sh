#!/usr/bin/env bash
# The malformed-input corpus (tests/data/malformed/EXPECT): every input must
# make `esctl prepare` exit 2 with a message naming the file and the line,
# and leave no job directory and no staging directory behind.
set -euo pipefail
# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"
corpus=$TOP/tests/data/malformed
new_workdir
tmp=$W
printf 'process:\n  - whitespace_normalization_mapper:\n  - text_length_filter:\n' > "$tmp/recipe.yaml"

while IFS=$'\t' read -r name line fragment extra; do
    case "$name" in ''|'#'*) continue ;; esac
    job=$tmp/jobs/job-$name
    mkdir -p "$tmp/jobs"
    rc=0
    # shellcheck disable=SC2086
    "$ESCTL" prepare --local --config "$tmp/recipe.yaml" --dataset-path "$corpus/$name" \
        --job-dir "$job" --num-shards 1 $extra >"$tmp/out" 2>"$tmp/err" || rc=$?
    # a directory input names the file inside it in its fragment
    if [ -d "$corpus/$name" ]; then where=$fragment; else where=$name:$line; fi
    problems=()
    [ "$rc" -eq 2 ] || problems+=("exit $rc, expected 2")
    grep -qF -- "$where" "$tmp/err" || problems+=("message does not name $where")
    grep -qF -- "$fragment" "$tmp/err" || problems+=("message lacks '$fragment'")
    [ ! -e "$job" ] || problems+=("job directory left behind")
    left=$(find "$tmp/jobs" -mindepth 1 -maxdepth 1 -printf '%f ')
    [ -z "$left" ] || problems+=("left behind: $left")
    if [ ${#problems[@]} -eq 0 ]; then
        ok "$name"
    else
        # every input is checked (ESD_TEST_KEEP_GOING=1) or the first
        # failure ends the script
        mapfile -t errs <"$tmp/err"
        fail "$name: ${problems[*]}" "${errs[@]/#/stderr: }"
    fi
    rm -rf "${tmp:?}/jobs"
done < "$corpus/EXPECT"

[ "$PASSED" -ge 30 ] || fail "the corpus has at least 30 inputs" "only $PASSED"
summary
