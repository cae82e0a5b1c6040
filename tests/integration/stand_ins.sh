#!/usr/bin/env bash
# stand_ins: checks the two test stand-ins themselves, so that the tests
# built on them can trust them. mini-dj (tests/tools/mini-dj.c) stands in
# for Data-Juicer's process_data.py and fake-ray (tests/tools/fake-ray) for
# the `ray` CLI; neither is the real thing. A tiny job is prepared with
# `esctl prepare --local` and mini-dj is run by hand on one of its shards
# with the flags of spec §8.4: output layout (Ray's, as real_dj.sh sees it:
# <dataset-id>_<task-id>_000000.json parts, nothing else) and part-name
# order, _SUCCESS and .crc files on request, the exact bytes the two
# operators produce, every knob, flag errors and the
# Ray reachability check; then fake-ray start/status/stop and its knobs.
#
# Environment: TOP (repository root; default two levels above this script),
# ESCTL (esctl binary; default ./esctl), TOOLS (built test tools; default
# the directory of JSONL_CHECK if make set it, else $TOP/build/default/tools).
set -euo pipefail
export LC_ALL=C

ESCTL=${ESCTL:-./esctl}
# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"
CHECK="$TOOLS/jsonl-check"

new_workdir
unset_knobs
WAIT_POLL=0.05

has_text() { grep -qF -- "$2" "$1" 2>/dev/null; }
free_port() {
    python3 -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])'
}
# dj_args SHARD DIR [RAY_ADDRESS]: the flags of spec §8.4 in ARGS, for one
# attempt directory DIR (export path DIR/ray-output.jsonl). Two use the
# --flag=value form.
dj_args() {
    ARGS=(--config "$JOB/recipe.yaml" --dataset_path "$1"
        --export_path "$2/ray-output.jsonl" --executor_type=ray
        --ray_address "${3-local}" --work_dir "$2/work" --job_id="job_part_${2##*/}"
        --event_log_dir "$2/logs" --checkpoint_dir "$2/checkpoints"
        --partition_dir "$2/partitions")
}
# mdj DIR [SHARD]: runs mini-dj on SHARD (default shard 0) into DIR.
mdj() {
    dj_args "${2:-$SHARD0}" "$1"
    run "$MINI" "${ARGS[@]}"
}
# rows_in FILE...: total number of lines.
rows_in() { cat "$@" | wc -l; }
# mini-dj's part names, computed here from its documented rule:
# <dataset-id>_<task-id>_000000.json.
# task_id I: the first 32 hex digits of sha256("mini-dj task I").
task_id() { printf 'mini-dj task %d' "$1" | sha256sum | cut -c1-32; }
# dataset_id JOB_ID: 0-9A-Z-a-z[b mod 62] for the first 22 bytes b of sha256(JOB_ID).
dataset_id() {
    python3 -c 'import hashlib, string, sys
a = string.digits + string.ascii_uppercase + string.ascii_lowercase
print("".join(a[b % 62] for b in hashlib.sha256(sys.argv[1].encode()).digest()[:22]))' "$1"
}
# part_name DIR I: the name of part I of the run into the attempt directory
# DIR (whose job id dj_args makes job_part_<last component of DIR>).
part_name() { echo "$(dataset_id "job_part_${1##*/}")_$(task_id "$2")_000000.json"; }
# numeric_parts DIR: the part files of DIR's export in numeric order of their index.
numeric_parts() {
    local i=0 ds
    ds=$(dataset_id "job_part_${1##*/}")
    while [ -e "$1/ray-output.jsonl/${ds}_$(task_id $i)_000000.json" ]; do
        echo "$1/ray-output.jsonl/${ds}_$(task_id $i)_000000.json"
        i=$((i + 1))
    done
}
# name_parts DIR: the part files of DIR's export (names not starting with
# . or _) in plain string order, as the worker reads them.
name_parts() { find "$1/ray-output.jsonl" -mindepth 1 -maxdepth 1 -name '[!._]*' | sort; }
# names DIR: every name in DIR's export, hidden ones too, in string order, on one line.
names() { (cd "$1/ray-output.jsonl" && find . -mindepth 1 -maxdepth 1 -printf '%P\n' | sort | tr '\n' ' '); }
# The string order of the 12 default parts, as mini-dj's header gives it.
ORDER12=(5 11 7 9 1 6 10 8 0 3 4 2)

for t in "$MINI" "$CHECK" "$ESCTL" "$FAKE_RAY"; do
    [ -x "$t" ] || fail "tools exist" "not executable: $t (run make tools)"
done
ok "mini-dj, jsonl-check, esctl and fake-ray exist"

# ---- a tiny job ----
# Compact JSON as prepare writes it, so the shard keeps these exact bytes.
# Record 0 has non-ASCII whitespace (U+00A0, U+3000, U+2003, U+2009) and
# escaped \t \n; record 1 big integers; 2, 3, 4 and 6 are dropped by
# text_length_filter (too short, no text, text not a string, 9 code points);
# 5 has exactly 10 code points.
{
    printf '{"id":0,"text":"  Hello\xc2\xa0\xe3\x80\x80 world\xe2\x80\x83\xe2\x80\x89again\\t\\n ","lang":"en"}\n'
    printf '{"id":123456789012345678901234567890,"text":"big  numbers\xe2\x80\x8bstay","neg":-98765432109876543210,"f":1.5,"e":1e+100,"nested":{"a":[1,2.25,null,true]}}\n'
    printf '{"id":2,"text":"tiny"}\n'
    printf '{"id":3,"title":"no text field"}\n'
    printf '{"id":4,"text":12345678901}\n'
    printf '{"id":5,"text":"\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe3\x83\x86\xe3\x82\xad\xe3\x82\xb9\xe3\x83\x88\xe3\x81\xa7\xe3\x81\x99"}\n'
    printf '{"id":6,"text":"\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e\xe3\x81\xae\xe3\x83\x86\xe3\x82\xad\xe3\x82\xb9\xe3\x83\x88\xe3\x81\xa7"}\n'
    printf '{"id":7,"text":"say \\"hi\\"\\\\there  now"}\n'
    for i in $(seq 8 69); do printf '{"id":%d,"text":"filler record number %d"}\n' "$i" "$i"; done
} >"$W/data.jsonl"
printf 'process:\n  - whitespace_normalization_mapper:\n  - text_length_filter:\n' >"$W/recipe.yaml"
JOB="$W/job"
run "$ESCTL" prepare --local --config "$W/recipe.yaml" --dataset-path "$W/data.jsonl" \
    --job-dir "$JOB" --num-shards 3
check "esctl prepare --local makes a 3-shard job" 0
SHARD0=$JOB/shards/part-00000-of-00003.jsonl
SHARD1=$JOB/shards/part-00001-of-00003.jsonl
SHARD2=$JOB/shards/part-00002-of-00003.jsonl
head -n 8 "$W/data.jsonl" | cmp -s - <(head -n 8 "$SHARD0") ||
    fail "shard 0 starts with the 8 special records, byte for byte"
ok "shard 0 starts with the 8 special records, byte for byte"

# ---- help and flag errors ----
run "$MINI" --help
check "mini-dj --help exits 0 and says it is a stand-in" 0 "TEST STAND-IN"
for knob in EXIT SLEEP_MS HANG CRASH BAD NO_EXPORT SPAWN_CHILD ONLY FAIL_ONCE PARTS EMPTY SUCCESS \
    RECORD; do
    [[ $OUT == *"MINI_DJ_$knob"* ]] || fail "mini-dj --help lists MINI_DJ_$knob" "$OUT"
done
ok "mini-dj --help lists every knob"
grep -q "TEST STAND-IN" "$TOP/tests/tools/mini-dj.c" || fail "mini-dj.c header says stand-in"
ok "mini-dj.c's header says it is a stand-in"

dj_args "$SHARD0" "$W/flags"
run "$MINI" "${ARGS[@]}" --bogus 1
check "an unknown flag exits 2" 2 "" "mini-dj: unknown flag '--bogus'"
run "$MINI" "${ARGS[@]:0:16}"
check "a missing flag exits 2" 2 "" "mini-dj: missing flag --partition_dir"
run "$MINI" "${ARGS[@]}" --config
check "a flag without a value exits 2" 2 "" "--config needs a value"
run "$MINI" "${ARGS[@]}" --job_id=again
check "a repeated flag exits 2" 2 "" "--job_id given twice"
run "$MINI" "${ARGS[@]}" stray
check "a stray argument exits 2" 2 "" "unexpected argument 'stray'"
dj_args "$SHARD0" "$W/flags" ""
run "$MINI" "${ARGS[@]}"
check "an empty --ray_address exits 2" 2 "" "--ray_address must not be empty"
dj_args "$SHARD0" "$W/flags" auto
run "$MINI" "${ARGS[@]}"
check "a --ray_address that is neither local nor host:port exits 2" 2 "" "unsupported --ray_address"
dj_args "$SHARD0" "$W/flags"
ARGS[6]=--executor_type=spark
run "$MINI" "${ARGS[@]}"
check "--executor_type other than ray or default exits 2" 2 "" "--executor_type must be ray or default"
[ ! -e "$W/flags" ] || fail "flag errors create nothing" "$(ls -R "$W/flags")"
ok "flag errors create nothing"

# ---- a normal run ----
A="$W/a1"
mdj "$A"
check "mini-dj runs on shard 0" 0 "mini-dj: wrote" "mini-dj: kept"
EXP="$A/ray-output.jsonl"
[ -d "$EXP" ] || fail "the export path is a directory"
ok "the export path is a directory"
SHARD_ROWS=$(rows_in "$SHARD0")
M=$((SHARD_ROWS - 4))
[[ $OUT == *"mini-dj: read $SHARD_ROWS rows from $SHARD0"* ]] || fail "read line" "$OUT"
[[ $OUT == *"mini-dj: wrote $M rows in 12 parts to $EXP"* ]] || fail "wrote line" "$OUT"
ok "stdout reports $SHARD_ROWS rows read and $M written in 12 parts"
[ "$M" -gt 12 ] || fail "shard 0 keeps more than 12 rows" "M=$M"
# Ray's layout (real_dj.sh): <dataset>_<task>_<block>.json files, nothing else.
got=$(names "$A")
[ "$(count "$EXP")" -eq 12 ] || fail "the export holds the 12 parts and nothing else" "$got"
DSID=$(dataset_id job_part_a1)
for n in $got; do
    [[ $n =~ ^[0-9A-Za-z]{22}_[0-9a-f]{32}_000000\.json$ ]] ||
        fail "every name is <22 alphanumerics>_<32 hex>_000000.json" "$n"
    [ "${n%%_*}" = "$DSID" ] ||
        fail "every part has the dataset id derived from --job_id" "want $DSID" "got: $n"
done
ok "the export holds 12 parts named <22 alphanumerics>_<32 hex>_000000.json, no _SUCCESS, no hidden file"
ok "every part has the dataset id $DSID derived from --job_id"
want=""
for i in "${ORDER12[@]}"; do want+="$(part_name "$A" "$i") "; done
[ "$got" = "$want" ] || fail "the parts in plain string order" "got:  $got" "want: $want"
ok "part i's task id is sha256(\"mini-dj task i\"); string order is parts ${ORDER12[*]}"
mdj "$W/rerun/a1"
check "a second run with the same --job_id" 0 "wrote $M rows in 12 parts"
[ "$(names "$W/rerun/a1")" = "$got" ] || fail "the same --job_id gives the same names"
mdj "$W/other"
other=$(names "$W/other")
tasks() { sed -E 's/(^| )[0-9A-Za-z]{22}_/\1/g' <<<"$1"; }
if [ "$other" = "$got" ] || [ "$(tasks "$other")" != "$(tasks "$got")" ]; then
    fail "another --job_id changes the dataset id only" "$other"
fi
ok "the names are deterministic: the same --job_id gives the same names, another one another dataset id"
q=$((M / 12)) r=$((M % 12))
for i in $(seq 0 11); do
    n=$(rows_in "$EXP/$(part_name "$A" "$i")")
    [ "$n" -eq $((q + (i < r ? 1 : 0))) ] || fail "part $i holds q + (i < r) rows" "$n rows"
done
ok "part i holds M/12 rows, plus one for i < M%12 (M=$M)"

# MINI_DJ_SUCCESS=1: an empty _SUCCESS and a hidden .crc per part, which
# readers must skip.
MINI_DJ_SUCCESS=1 mdj "$W/s1"
check "MINI_DJ_SUCCESS=1 runs" 0 "wrote $M rows in 12 parts"
S1="$W/s1/ray-output.jsonl"
[[ -f $S1/_SUCCESS && ! -s $S1/_SUCCESS ]] || fail "_SUCCESS exists and is empty"
ok "MINI_DJ_SUCCESS=1: _SUCCESS exists and is empty"
for i in $(seq 0 11); do
    [ -f "$S1/.$(part_name "$W/s1" "$i").crc" ] || fail "hidden .<part $i>.crc exists"
done
[ "$(count "$S1")" -eq 25 ] || fail "12 parts, 12 .crc files and _SUCCESS" "$(names "$W/s1")"
run "$CHECK" <"$S1/.$(part_name "$W/s1" 0).crc"
[ "$OUT" = syntax ] || fail "the hidden .crc files are not JSONL" "$OUT"
ok "MINI_DJ_SUCCESS=1: every part has a hidden .crc file that is not JSONL"
readable=$(find "$S1" -type f ! -name '.*' ! -name '_*' | wc -l)
[ "$readable" -eq 12 ] || fail "a reader skipping . and _ names sees the 12 parts" "$readable"
ok "a reader skipping names that start with . or _ sees exactly the 12 parts"
mapfile -t parts < <(numeric_parts "$W/s1")
mapfile -t parts_a1 < <(numeric_parts "$A")
cat "${parts[@]}" | cmp -s - <(cat "${parts_a1[@]}") || fail "MINI_DJ_SUCCESS changes no part"
ok "MINI_DJ_SUCCESS=1 writes the same parts"

# The expected output: shard 0 without the dropped records, the edited
# records replaced by their exact expected bytes.
{
    printf '{"id":0,"text":"Hello world again","lang":"en"}\n'
    printf '{"id":123456789012345678901234567890,"text":"big numbers stay","neg":-98765432109876543210,"f":1.5,"e":1e+100,"nested":{"a":[1,2.25,null,true]}}\n'
    sed -n 6p "$SHARD0"
    printf '{"id":7,"text":"say \\"hi\\"\\\\there now"}\n'
    tail -n +9 "$SHARD0"
} >"$W/expected.jsonl"
mapfile -t parts < <(numeric_parts "$A")
[ "${#parts[@]}" -eq 12 ] || fail "12 parts in numeric order" "${parts[*]}"
cat "${parts[@]}" | cmp -s - "$W/expected.jsonl" ||
    fail "parts in numeric order are the expected records, byte for byte" \
        "$(cat "${parts[@]}" | diff - "$W/expected.jsonl" | head -20)"
ok "parts in numeric order hold the expected records, byte for byte"
ok "whitespace_normalization_mapper: non-ASCII whitespace runs become one space, ends trimmed"
ok "big integers and every other byte of an edited record are kept"
ok "text_length_filter drops short, missing and non-string text, keeps exactly 10 code points"
mapfile -t sparts < <(name_parts "$A")
cat "${sparts[@]}" | cmp -s - "$W/expected.jsonl" &&
    fail "string order of the parts differs from the input order"
cat "${sparts[@]}" | sort | cmp -s - <(sort "$W/expected.jsonl") ||
    fail "the parts in string order hold the same rows"
ok "string order of the parts differs from the input order (same rows)"
[ "$(cat "${sparts[@]}" | "$CHECK" | sort -u)" = ok ] || fail "every output row is valid"
ok "every output row passes the JSONL validator"
[[ -d $A/work && -f $A/logs/events.log ]] || fail "work dir and events.log are created"
[ "$(wc -l <"$A/logs/events.log")" -eq 3 ] || fail "events.log has 3 lines" "$(cat "$A/logs/events.log")"
[[ ! -e $A/checkpoints && ! -e $A/partitions ]] || fail "checkpoint/partition dirs untouched"
ok "--work_dir and --event_log_dir (with events.log) are created, the others left alone"

# Another recipe: max_len, the operators in the other order.
printf 'process:\n  - text_length_filter:\n      min_len: 0\n      max_len: 17\n  - whitespace_normalization_mapper:\n' \
    >"$W/short.yaml"
dj_args "$SHARD0" "$W/a2"
ARGS[1]="$W/short.yaml"
MINI_DJ_PARTS=1 run "$MINI" "${ARGS[@]}"
check "a recipe with max_len runs" 0 "wrote 4 rows in 1 parts"
{
    sed -n 2p "$W/expected.jsonl"
    sed -n 3p "$SHARD0"
    sed -n 6,7p "$SHARD0"
} >"$W/expected2.jsonl"
A2="$W/a2/ray-output.jsonl/$(part_name "$W/a2" 0)"
[ "$(count "$W/a2/ray-output.jsonl")" -eq 1 ] || fail "MINI_DJ_PARTS=1 writes one file"
cmp -s "$A2" "$W/expected2.jsonl" ||
    fail "filter then mapper, max_len 17" "$(diff "$A2" "$W/expected2.jsonl")"
ok "operators run in recipe order (filter on the raw text first); max_len 17 keeps exactly 17 code points"

printf 'process:\n  - whitespace_normalization_mapper:\n  - topk_specified_field_selector:\n' >"$W/dedup.yaml"
dj_args "$SHARD0" "$W/a3"
ARGS[1]="$W/dedup.yaml"
run "$MINI" "${ARGS[@]}"
check "an unsupported operator exits 2" 2 "" "mini-dj: unsupported operator topk_specified_field_selector"
printf 'process: [\n' >"$W/broken.yaml"
ARGS[1]="$W/broken.yaml"
run "$MINI" "${ARGS[@]}"
check "invalid YAML exits 2" 2 "" "invalid YAML in $W/broken.yaml"

# ---- MINI_DJ_PARTS and MINI_DJ_EMPTY ----
MINI_DJ_PARTS=3 mdj "$W/p3"
check "MINI_DJ_PARTS=3 writes 3 parts" 0 "in 3 parts"
mapfile -t parts < <(numeric_parts "$W/p3")
[ "$(count "$W/p3/ray-output.jsonl")" -eq 3 ] || fail "3 files" "$(names "$W/p3")"
[ "${#parts[@]}" -eq 3 ] || fail "parts 0, 1, 2" "$(names "$W/p3")"
cat "${parts[@]}" | cmp -s - "$W/expected.jsonl" || fail "3 parts hold the same rows"
ok "3 parts hold the same rows in the same order"
mapfile -t sparts < <(name_parts "$W/p3")
[ "${sparts[*]}" = "${parts[1]} ${parts[0]} ${parts[2]}" ] ||
    fail "string order of 3 parts is 1, 0, 2" "${sparts[*]}"
ok "string order of 3 parts is 1, 0, 2 (the 12-part order without 3..11)"
MINI_DJ_PARTS=100 mdj "$W/p100"
check "MINI_DJ_PARTS above the row count writes one part per row" 0 "in $M parts"
[[ -e $W/p100/ray-output.jsonl/$(part_name "$W/p100" $((M - 1))) &&
    ! -e $W/p100/ray-output.jsonl/$(part_name "$W/p100" "$M") ]] || fail "no empty part files"
[ "$(count "$W/p100/ray-output.jsonl")" -eq "$M" ] || fail "$M part files" "$(names "$W/p100")"
[ "$(cat "$W"/p100/ray-output.jsonl/* | wc -l)" -eq "$M" ] || fail "one row per part"
ok "empty chunks are not written"
MINI_DJ_PARTS=0 mdj "$W/p0"
check "MINI_DJ_PARTS=0 exits 2" 2 "" "MINI_DJ_PARTS must be an integer in 1..100000"

printf 'process:\n  - text_length_filter:\n      min_len: 1000\n' >"$W/none.yaml"
dj_args "$SHARD0" "$W/e1"
ARGS[1]="$W/none.yaml"
run "$MINI" "${ARGS[@]}"
check "a run that keeps no row exits 0" 0 "wrote 0 rows in 0 parts"
[ -d "$W/e1/ray-output.jsonl" ] || fail "no rows: the export dir exists"
[ "$(count "$W/e1/ray-output.jsonl")" -eq 0 ] ||
    fail "no rows: the export dir is empty" "$(ls -A "$W/e1/ray-output.jsonl")"
ok "no rows: the export dir exists and is empty (as Ray leaves it)"
dj_args "$SHARD0" "$W/e3"
ARGS[1]="$W/none.yaml"
MINI_DJ_SUCCESS=1 run "$MINI" "${ARGS[@]}"
check "no rows, MINI_DJ_SUCCESS=1 exits 0" 0 "wrote 0 rows in 0 parts"
[ "$(names "$W/e3")" = "_SUCCESS " ] ||
    fail "no rows, MINI_DJ_SUCCESS=1: the export dir holds _SUCCESS only" "$(names "$W/e3")"
ok "no rows, MINI_DJ_SUCCESS=1: the export dir holds _SUCCESS only"
dj_args "$SHARD0" "$W/e2"
ARGS[1]="$W/none.yaml"
MINI_DJ_EMPTY=nodir run "$MINI" "${ARGS[@]}"
check "MINI_DJ_EMPTY=nodir exits 0" 0 "MINI_DJ_EMPTY=nodir"
[ ! -e "$W/e2/ray-output.jsonl" ] || fail "MINI_DJ_EMPTY=nodir creates no export path"
ok "MINI_DJ_EMPTY=nodir creates no export path"

# ---- failure knobs ----
MINI_DJ_EXIT=7 mdj "$W/k-exit"
check "MINI_DJ_EXIT=7 exits 7" 7 "" "MINI_DJ_EXIT=7"
[[ ! -e $W/k-exit/ray-output.jsonl && ! -e $W/k-exit/work ]] ||
    fail "MINI_DJ_EXIT does nothing"
ok "MINI_DJ_EXIT does nothing else"
MINI_DJ_EXIT=0 mdj "$W/k-exit0"
check "MINI_DJ_EXIT=0 exits 0 without output" 0
[ ! -e "$W/k-exit0/ray-output.jsonl" ] || fail "MINI_DJ_EXIT=0 writes nothing"

MINI_DJ_NO_EXPORT=1 mdj "$W/k-noexp"
check "MINI_DJ_NO_EXPORT=1 exits 0" 0 "mini-dj: read $SHARD_ROWS rows" "MINI_DJ_NO_EXPORT"
[ ! -e "$W/k-noexp/ray-output.jsonl" ] || fail "MINI_DJ_NO_EXPORT creates no export path"
ok "MINI_DJ_NO_EXPORT creates no export path"

t0=$(date +%s%N)
MINI_DJ_SLEEP_MS=20 mdj "$W/k-sleep"
t1=$(date +%s%N)
check "MINI_DJ_SLEEP_MS=20 still succeeds" 0 "wrote $M rows"
[ $(((t1 - t0) / 1000000)) -ge $((SHARD_ROWS * 20)) ] ||
    fail "MINI_DJ_SLEEP_MS sleeps per row" "$(((t1 - t0) / 1000000)) ms for $SHARD_ROWS rows"
ok "MINI_DJ_SLEEP_MS=20 takes at least 20 ms per input row"

# MINI_DJ_BAD: line 2 of the first part in string order (part ${ORDER12[0]})
declare -A FAULT=([invalid]=syntax [blank]=blank [notobject]=not_object [badutf8]=utf8)
first=${ORDER12[0]}
for mode in invalid blank notobject badutf8; do
    MINI_DJ_BAD=$mode mdj "$W/k-bad-$mode"
    bad=$(part_name "$W/k-bad-$mode" "$first")
    check "MINI_DJ_BAD=$mode exits 0" 0 "" "MINI_DJ_BAD=$mode: wrote a bad line into $bad (line 2)"
    mapfile -t sparts < <(name_parts "$W/k-bad-$mode")
    [ "${sparts[0]}" = "$W/k-bad-$mode/ray-output.jsonl/$bad" ] ||
        fail "MINI_DJ_BAD=$mode: part $first is the first in string order" "${sparts[0]}"
    got=$("$CHECK" <"${sparts[0]}" | tr '\n' ' ')
    want="ok ${FAULT[$mode]}"
    for _ in $(seq 2 $((q + (first < r ? 1 : 0)))); do want="$want ok"; done
    [ "$got" = "$want " ] || fail "MINI_DJ_BAD=$mode: line 2 of part $first is bad" "got: $got"
    [ "$(cat "${sparts[@]:1}" | "$CHECK" | sort -u)" = ok ] ||
        fail "MINI_DJ_BAD=$mode: the other parts are intact"
    [ "$(cat "${sparts[@]}" | grep -cvxF -f "$W/expected.jsonl")" -eq 1 ] ||
        fail "MINI_DJ_BAD=$mode: the expected rows and one line more"
    [ "$(count "$W/k-bad-$mode/ray-output.jsonl")" -eq 12 ] ||
        fail "MINI_DJ_BAD=$mode: 12 parts, nothing else" "$(names "$W/k-bad-$mode")"
    ok "MINI_DJ_BAD=$mode: line 2 of part $first (first in string order) is ${FAULT[$mode]}, the rest is intact"
done
MINI_DJ_BAD=invalid MINI_DJ_SUCCESS=1 mdj "$W/k-bad-success"
check "MINI_DJ_BAD with MINI_DJ_SUCCESS=1 exits 0" 0 "" "MINI_DJ_BAD=invalid"
[ -f "$W/k-bad-success/ray-output.jsonl/_SUCCESS" ] ||
    fail "MINI_DJ_BAD with MINI_DJ_SUCCESS=1 writes _SUCCESS"
ok "MINI_DJ_BAD with MINI_DJ_SUCCESS=1 still writes _SUCCESS, as a successful run"
MINI_DJ_BAD=weird mdj "$W/k-bad-weird"
check "an unknown MINI_DJ_BAD mode exits 2" 2 "" "MINI_DJ_BAD must be"
dj_args "$SHARD0" "$W/k-bad-empty"
ARGS[1]="$W/none.yaml"
MINI_DJ_BAD=invalid MINI_DJ_EMPTY=nodir run "$MINI" "${ARGS[@]}"
bad=$(part_name "$W/k-bad-empty" 0)
check "MINI_DJ_BAD with no rows exits 0" 0 "" "wrote a bad line into $bad (line 1)"
[ "$(names "$W/k-bad-empty")" = "$bad " ] || fail "MINI_DJ_BAD with no rows writes part 0 only" \
    "$(names "$W/k-bad-empty")"
[ "$("$CHECK" <"$W/k-bad-empty/ray-output.jsonl/$bad")" = syntax ] ||
    fail "MINI_DJ_BAD with no rows writes the bad line alone"
ok "MINI_DJ_BAD with no rows writes part 0 with the bad line alone"

# MINI_DJ_CRASH (with MINI_DJ_SUCCESS=1, which it must override)
MINI_DJ_CRASH=1 MINI_DJ_SUCCESS=1 mdj "$W/k-crash"
check "MINI_DJ_CRASH=1 dies of SIGABRT" 134 "" "MINI_DJ_CRASH: aborting after $(((M + 1) / 2)) of $M rows"
[ ! -e "$W/k-crash/ray-output.jsonl/_SUCCESS" ] || fail "a crash leaves no _SUCCESS"
mapfile -t parts < <(name_parts "$W/k-crash")
mapfile -t sparts < <(name_parts "$A")
cat "${parts[@]}" | cmp -s - <(cat "${sparts[@]}" | head -n $(((M + 1) / 2))) ||
    fail "a crash leaves the first half of the rows in string order" "$(cat "${parts[@]}" | wc -l) rows"
for k in "${!parts[@]}"; do
    [ "${parts[k]##*/}" = "$(part_name "$W/k-crash" "${ORDER12[k]}")" ] ||
        fail "the crash left the first parts in string order" "${parts[*]##*/}"
done
ok "MINI_DJ_CRASH leaves the first ceil(M/2) rows in string order (parts ${ORDER12[*]:0:${#parts[@]}}) and no _SUCCESS"

# HANG: runs in the background, dies on SIGTERM.
dj_args "$SHARD0" "$W/k-hang"
MINI_DJ_HANG=1 "$MINI" "${ARGS[@]}" >"$W/hang.out" 2>"$W/hang.err" &
pid=$!
BG+=("$pid")
wait_for "MINI_DJ_HANG says it hangs" 10 has_text "$W/hang.out" "mini-dj: hanging"
alive "$pid" || fail "MINI_DJ_HANG keeps running"
[ ! -e "$W/k-hang/ray-output.jsonl" ] || fail "MINI_DJ_HANG writes nothing"
ok "MINI_DJ_HANG hangs after reading the input, before writing"
kill -TERM "$pid"
RC=0
wait "$pid" || RC=$?
[ "$RC" -eq 143 ] || fail "MINI_DJ_HANG dies on SIGTERM" "exit status $RC"
ok "MINI_DJ_HANG dies on SIGTERM"

# SPAWN_CHILD: the child is in mini-dj's process group and dies with it.
dj_args "$SHARD0" "$W/k-spawn"
MINI_DJ_SPAWN_CHILD=1 MINI_DJ_HANG=1 setsid "$MINI" "${ARGS[@]}" >"$W/spawn.out" 2>"$W/spawn.err" &
pid=$!
BG+=("$pid")
wait_for "MINI_DJ_SPAWN_CHILD prints the child's pid" 10 has_text "$W/spawn.out" "mini-dj: hanging"
child=$(sed -n 's/^mini-dj: spawned child pid \([0-9]*\).*/\1/p' "$W/spawn.out")
[ -n "$child" ] || fail "MINI_DJ_SPAWN_CHILD prints the child's pid" "$(cat "$W/spawn.out")"
pg_mini=$(ps -o pgid= -p "$pid" | tr -d ' ')
pg_child=$(ps -o pgid= -p "$child" | tr -d ' ')
[[ $pg_mini == "$pid" && $pg_child == "$pid" ]] ||
    fail "the child is in mini-dj's process group" "mini-dj $pid pgid $pg_mini, child $child pgid $pg_child"
ok "MINI_DJ_SPAWN_CHILD prints a pid that is in mini-dj's process group"
kill -TERM -- "-$pid"
wait "$pid" || true
wait_for "the child dies with its process group" 10 dead "$child"
ok "killing the process group kills mini-dj and its child"

# ONLY and FAIL_ONCE
MINI_DJ_ONLY=part-00001 MINI_DJ_EXIT=9 mdj "$W/k-only0"
check "MINI_DJ_ONLY not matching: normal run" 0 "wrote $M rows" "MINI_DJ_ONLY=part-00001 does not match"
MINI_DJ_ONLY=part-00001 MINI_DJ_EXIT=9 mdj "$W/k-only1" "$SHARD1"
check "MINI_DJ_ONLY matching: the knob acts" 9
ONCE="$W/once"
MINI_DJ_FAIL_ONCE=$ONCE MINI_DJ_EXIT=5 mdj "$W/k-once1"
check "MINI_DJ_FAIL_ONCE: the first run fails" 5
[ "$(find "$ONCE" -name '*.once' | wc -l)" -eq 1 ] || fail "MINI_DJ_FAIL_ONCE records a marker"
MINI_DJ_FAIL_ONCE=$ONCE MINI_DJ_EXIT=5 mdj "$W/k-once2"
check "MINI_DJ_FAIL_ONCE: the second run on the same shard succeeds" 0 "wrote $M rows" \
    "failed once already"
MINI_DJ_FAIL_ONCE=$ONCE MINI_DJ_EXIT=5 mdj "$W/k-once3" "$SHARD1"
check "MINI_DJ_FAIL_ONCE: another shard fails once too" 5
MINI_DJ_FAIL_ONCE=$ONCE MINI_DJ_ONLY=part-00002 MINI_DJ_EXIT=5 mdj "$W/k-once4" "$SHARD2"
check "MINI_DJ_FAIL_ONCE with MINI_DJ_ONLY: the matching shard fails once" 5

# RECORD: argv, cwd and four variables, one JSON line per run.
REC="$W/record.jsonl"
mkdir -p "$W/cwd"
dj_args "$SHARD0" "$W/k-rec"
(cd "$W/cwd" && DJ_PRODUCED_DATA_DIR="$W/k-rec/produced" XDG_CACHE_HOME="$JOB/cache" \
    PYTHONPATH="/repo:/old" MINI_DJ_RECORD="$REC" env -u HF_HOME "$MINI" "${ARGS[@]}" \
    >/dev/null 2>&1)
MINI_DJ_RECORD="$REC" run "$MINI" --bogus
check "a bad invocation is recorded too, then refused" 2
python3 - "$REC" "$W" "$MINI" "${ARGS[@]}" <<'EOF' || fail "MINI_DJ_RECORD lines"
import json, sys
rec, w, mini, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
lines = open(rec, encoding="utf-8").read().splitlines()
assert len(lines) == 2, lines
a, b = (json.loads(x) for x in lines)
assert a["argv"] == [mini] + args, a["argv"]
assert a["cwd"] == w + "/cwd", a["cwd"]
assert a["env"] == {"DJ_PRODUCED_DATA_DIR": w + "/k-rec/produced",
                    "XDG_CACHE_HOME": w + "/job/cache", "HF_HOME": None,
                    "PYTHONPATH": "/repo:/old"}, a["env"]
assert isinstance(a["pid"], int)
assert b["argv"] == [mini, "--bogus"], b["argv"]
EOF
ok "MINI_DJ_RECORD appends argv, cwd, DJ_PRODUCED_DATA_DIR, XDG_CACHE_HOME, HF_HOME, PYTHONPATH"

# ---- Ray reachability ----
CLOSED=$(free_port)
dj_args "$SHARD0" "$W/r1" "127.0.0.1:$CLOSED"
run "$MINI" "${ARGS[@]}"
check "a closed Ray port exits 3" 3 "" "mini-dj: cannot reach Ray at 127.0.0.1:$CLOSED"
[ ! -e "$W/r1/ray-output.jsonl" ] || fail "an unreachable Ray writes nothing"

# ---- fake-ray ----
run "$FAKE_RAY" --help
check "fake-ray --help says it is a stand-in" 0 "TEST STAND-IN"
run "$FAKE_RAY" start --head --port 1 --temp-dir "$W/ray0"
check "fake-ray start without --block exits 2" 2 "" "--block is required"
run "$FAKE_RAY" start --block --port 1 --temp-dir "$W/ray0"
check "fake-ray start without --head exits 2" 2 "" "only \`start --head\`"

PORT=$(free_port)
RAYD="$W/ray1"
"$FAKE_RAY" start --head --block --port "$PORT" --temp-dir "$RAYD" --num-cpus=2 \
    --dashboard-host 0.0.0.0 >"$W/ray1.out" 2>"$W/ray1.err" &
rpid=$!
BG+=("$rpid")
wait_for "fake-ray start prints Ray runtime started." 10 has_text "$W/ray1.out" "Ray runtime started."
ok "fake-ray start --head --block ignores other arguments and prints Ray runtime started."
[ "$(cat "$RAYD/fake-ray.pid")" = "$rpid" ] || fail "fake-ray.pid holds the head's pid"
[ -f "$RAYD/session_latest/fake-ray-session" ] || fail "session_latest marker exists"
ok "fake-ray writes fake-ray.pid and a session_latest marker"
run "$FAKE_RAY" status --address "127.0.0.1:$PORT"
check "fake-ray status finds the head" 0
dj_args "$SHARD0" "$W/r2" "127.0.0.1:$PORT"
run "$MINI" "${ARGS[@]}"
check "mini-dj succeeds against a port where fake-ray listens" 0 "wrote $M rows" \
    "connected to Ray at 127.0.0.1:$PORT"
run "$FAKE_RAY" start --head --block --port "$PORT" --temp-dir "$W/ray1b"
check "a second head on the same port exits 1" 1 "" "port $PORT in use"
run "$FAKE_RAY" stop --temp-dir "$RAYD"
check "fake-ray stop --temp-dir stops the head" 0 "stopped 1 fake-ray head(s)"
RC=0
wait "$rpid" || RC=$?
[ "$RC" -eq 0 ] || fail "the head exits 0 on SIGTERM" "exit status $RC"
[ ! -e "$RAYD/fake-ray.pid" ] || fail "the head removes its pid file"
ok "the head exits 0 on SIGTERM and removes its pid file"
run "$FAKE_RAY" status --address "127.0.0.1:$PORT"
check "fake-ray status fails once the head is gone" 1
run "$FAKE_RAY" stop --temp-dir "$RAYD"
check "fake-ray stop with nothing running exits 0" 0
run "$FAKE_RAY" status --address nonsense
check "fake-ray status with a bad address exits 2" 2

"$FAKE_RAY" start --head --block --port 0 --temp-dir "$W/ray2" >"$W/ray2.out" 2>&1 &
rpid=$!
BG+=("$rpid")
wait_for "a head for SIGINT starts" 10 has_text "$W/ray2.out" "Ray runtime started."
kill -INT "$rpid"
RC=0
wait "$rpid" || RC=$?
[ "$RC" -eq 0 ] || fail "the head exits 0 on SIGINT" "exit status $RC"
ok "the head exits 0 on SIGINT"

# stop without --temp-dir stops every head of this user: run it in a PID
# namespace of its own, so that no other test's head on this machine is hit.
if unshare --pid --fork --mount-proc true 2>/dev/null; then
    mkdir -p "$W/ns"
    # shellcheck disable=SC2016 # the inner script expands its own arguments
    run unshare --pid --fork --mount-proc bash -c '
        set -eu
        for d in a b; do "$1" start --head --block --port 0 --temp-dir "$2/$d" >"$2/$d.out" 2>&1 & done
        for d in a b; do
            n=0
            until grep -q "Ray runtime started." "$2/$d.out" 2>/dev/null; do
                n=$((n + 1)); [ "$n" -lt 200 ] || exit 9; sleep 0.05
            done
        done
        "$1" stop
        wait' _ "$FAKE_RAY" "$W/ns"
    check "fake-ray stop without --temp-dir stops every head" 0 "stopped 2 fake-ray head(s)"
else
    ok "# SKIP fake-ray stop without --temp-dir (no PID namespace here)"
fi

# Knobs
run env FAKE_RAY_REFUSE=1 "$FAKE_RAY" start --head --block --port 0 --temp-dir "$W/ray3"
check "FAKE_RAY_REFUSE=1 exits 1" 1 "" "refusing to start"
[ ! -e "$W/ray3/fake-ray.pid" ] || fail "a refusing head writes no pid file"

PORT=$(free_port)
t0=$SECONDS
FAKE_RAY_SLOW_START=6 "$FAKE_RAY" start --head --block --port "$PORT" --temp-dir "$W/ray4" \
    >"$W/ray4.out" 2>"$W/ray4.err" &
rpid=$!
BG+=("$rpid")
run "$FAKE_RAY" status --address "127.0.0.1:$PORT"
check "FAKE_RAY_SLOW_START: the port is closed at first" 1
wait_for "FAKE_RAY_SLOW_START: the head starts later" 30 has_text "$W/ray4.out" "Ray runtime started."
[ $((SECONDS - t0)) -ge 1 ] || fail "FAKE_RAY_SLOW_START waits" "$((SECONDS - t0)) s"
grep -q FAKE_RAY_SLOW_START "$W/ray4.err" || fail "FAKE_RAY_SLOW_START says so"
ok "FAKE_RAY_SLOW_START delays the bind"
kill -TERM "$rpid"
wait "$rpid" || true

FAKE_RAY_DIE_AFTER=1 "$FAKE_RAY" start --head --block --port 0 --temp-dir "$W/ray5" \
    >"$W/ray5.out" 2>"$W/ray5.err" &
rpid=$!
BG+=("$rpid")
wait_for "FAKE_RAY_DIE_AFTER: the head starts" 10 has_text "$W/ray5.out" "Ray runtime started."
wait_for "FAKE_RAY_DIE_AFTER: the head dies" 15 dead "$rpid"
RC=0
wait "$rpid" || RC=$?
[ "$RC" -eq 1 ] || fail "FAKE_RAY_DIE_AFTER exits 1" "exit status $RC"
grep -q "dying after 1 s" "$W/ray5.err" || fail "FAKE_RAY_DIE_AFTER says so" "$(cat "$W/ray5.err")"
[ -e "$W/ray5/fake-ray.pid" ] || fail "a dead head leaves its pid file behind"
ok "FAKE_RAY_DIE_AFTER=1: exits 1 after serving, leaving its pid file"
run "$FAKE_RAY" stop --temp-dir "$W/ray5"
check "fake-ray stop on a dead head's pid file exits 0" 0 "stopped 0 fake-ray head(s)"
[ ! -e "$W/ray5/fake-ray.pid" ] || fail "stop removes a stale pid file"

summary
