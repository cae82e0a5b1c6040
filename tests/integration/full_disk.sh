#!/usr/bin/env bash
# A full disk during prepare (of a plain input, of a compressed one in one
# pass, and of one whose text is spooled) and during merge (a small tmpfs): esctl exits 2
# naming the file and ENOSPC, leaves no job directory, no staging directory,
# no output and no temporary file behind, and an existing output survives.
# A whole recipe's global stage without room for it fails at once as an
# infrastructure failure, and completes once room is made.
# Needs root for the mount; runs in a private mount namespace so nothing is
# visible outside it, and skips with a notice otherwise.
# The conditions below are quoted on purpose: expect() evaluates them.
# shellcheck disable=SC2016,SC2034
set -euo pipefail
# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

in_mount_ns "the full disk test" "$@"

new_workdir
tmp=$W
small=$tmp/small
trap 'umount "$small" 2>/dev/null || true; cleanup' EXIT
mkdir -p "$small"
mount -t tmpfs -o size=1m tmpfs "$small"
printf 'process:\n  - whitespace_normalization_mapper:\n' > "$tmp/recipe.yaml"
# about 3 MiB of records: more than the tmpfs holds
python3 - "$tmp/data.jsonl" <<'PY'
import sys
with open(sys.argv[1], "w") as f:
    for i in range(12000):
        f.write('{"id":%d,"text":"%s"}\n' % (i, "x" * 240))
PY
# expect WHAT CONDITION: CONDITION (evaluated) holds. Every one is checked
# with ESD_TEST_KEEP_GOING=1; otherwise the first that does not ends it.
expect() { if eval "$2"; then ok "$1"; else fail "$1" "$(cat "$tmp/err")"; fi; }

# full_prepare WHAT INPUT PATTERN: a prepare of INPUT onto the full disk
# exits 2 with an error matching PATTERN (a grep pattern) and leaves
# nothing there.
full_prepare() {
    local what=$1 input=$2 pattern=$3 rc=0
    "$ESCTL" prepare --local --config "$tmp/recipe.yaml" --dataset-path "$input" \
        --job-dir "$small/job" --num-shards 4 >"$tmp/out" 2>"$tmp/err" || rc=$?
    expect "prepare of $what on a full disk exits 2" '[ "$rc" -eq 2 ]'
    expect "prepare of $what says the disk is full, naming the file" 'grep -q "$pattern" "$tmp/err"'
    expect "prepare of $what leaves nothing behind" '[ -z "$(ls -A "$small")" ]'
    sed 's/^/    /' "$tmp/err"
}

full_prepare "a plain input" "$tmp/data.jsonl" "$small/.*No space left on device"

# The same records gzip-compressed (a few KiB), in one member: one pass
# on the size gzip records, which fills the disk with the shards.
gzip -c "$tmp/data.jsonl" >"$tmp/data.jsonl.gz"
full_prepare "a compressed input" "$tmp/data.jsonl.gz" \
    "cannot write shard $small/.*No space left on device"

# In a member of 100 records each (as bgzip and parallel compressors
# write): no size to believe, so the scan spools the text into the staging
# directory, which fills the disk before any shard.
python3 - "$tmp/data.jsonl" "$tmp/many.jsonl.gz" <<'PY'
import gzip, sys
lines = open(sys.argv[1], "rb").read().splitlines(keepends=True)
with open(sys.argv[2], "wb") as f:
    for i in range(0, len(lines), 100):
        f.write(gzip.compress(b"".join(lines[i:i + 100])))
PY
full_prepare "a many-member input" "$tmp/many.jsonl.gz" \
    "spool-00000.jsonl (the text of $tmp/many.jsonl.gz): No space left on device"

# A finished job on the big disk, merged into the small one.
"$ESCTL" prepare --local --config "$tmp/recipe.yaml" --dataset-path "$tmp/data.jsonl" \
    --job-dir "$tmp/job" --num-shards 4 >/dev/null 2>&1
python3 "$TOP/tests/tools/fake-finish" --job-dir "$tmp/job" --all >/dev/null
echo "keep me" > "$small/merged.jsonl"
rc=0
"$ESCTL" merge --local "$tmp/job" --output "$small/merged.jsonl" --overwrite \
    >"$tmp/out" 2>"$tmp/err" || rc=$?
expect "merge on a full disk exits 2" '[ "$rc" -eq 2 ]'
expect "merge says the disk is full" 'grep -q "No space left on device" "$tmp/err"'
expect "merge keeps the existing output" '[ "$(cat "$small/merged.jsonl")" = "keep me" ]'
expect "merge leaves no temporary file" '[ "$(ls -A "$small")" = merged.jsonl ]'
expect "merge writes no merge.json" '[ ! -e "$tmp/job/merge.json" ]'
sed 's/^/    /' "$tmp/err"
rm -f "$small/merged.jsonl"
rc=0
"$ESCTL" merge --local "$tmp/job" --output "$small/out/merged.jsonl" >/dev/null 2>"$tmp/err" || rc=$?
expect "merge into a new path on a full disk leaves nothing" \
    '[ "$rc" -eq 2 ] && [ -z "$(find "$small" -type f)" ]'

# A whole recipe's global stage on a disk without room for it (three
# times its input and 64 MiB): its attempt fails at once, as an
# infrastructure failure that says so; with room made, the stage requeued
# and the job submitted again, it completes.
need_daemon_tools
mid=$tmp/mid
mkdir -p "$mid"
mount -t tmpfs -o size=40m tmpfs "$mid"
trap 'umount "$small" "$mid" 2>/dev/null || true; cleanup' EXIT
printf 'process:\n  - whitespace_normalization_mapper:\n  - document_deduplicator:\n' \
    >"$tmp/whole.yaml"
"$ESCTL" prepare --local --config "$tmp/whole.yaml" --dataset-path "$tmp/data.jsonl" \
    --job-dir "$mid/job" --num-shards 4 >"$tmp/out" 2>"$tmp/err"
give_job "$mid/job"
daemon_conf d max_infra_failures=1
start_daemon d
"$ESCTL" --socket "$(dsock d)" submit "$mid/job" >"$tmp/out" 2>"$tmp/err"
wait_for "the global stage fails for want of space" 60 eval '[ "$(job_state d "$mid/job")" = failed ]'
"$ESCTL" --json status --local "$mid/job" >"$tmp/err" || true
expect "the global stage failed, saying why" \
    'py "j[\"global\"][\"status\"] + \" \" + j[\"global\"][\"error\"]" "$tmp/err" |
        grep -q "^failed .*not enough free space for the global stage in $mid/job"'
expect "as an infrastructure failure" \
    'py "j[\"failure_class\"]" "$mid/job/state/failed/_global.json" | grep -qx infrastructure'
expect "the shards' results are all there" '[ "$(find "$mid/job/state/done" -name "part-*" | wc -l)" -eq 4 ]'
mount -o remount,size=200m "$mid"
"$ESCTL" retry --local "$mid/job" --all-failed >"$tmp/out" 2>"$tmp/err"
"$ESCTL" --socket "$(dsock d)" submit "$mid/job" >"$tmp/out" 2>"$tmp/err"
wait_for "the job completes with room" 60 eval '[ "$(job_state d "$mid/job")" = complete ]'
expect "the output is the one deduplicated record" '[ "$(wc -l <"$mid/job/merged.jsonl")" -eq 1 ]'
stop_daemon d
summary
