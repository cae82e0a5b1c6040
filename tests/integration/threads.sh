#!/usr/bin/env bash
# --threads: prepare and merge are pipelines over N threads
# (common/pipeline.c), and N must change nothing. The same datasets
# prepared with --threads 1, 2 and 7 give the same job directory byte for
# byte (the manifest's created_at aside), with and without normalisation
# edits (an index key, relative media paths), over several files of several
# 1 MiB chunks, plain or compressed (whose shards are the plain ones'); the digests in the manifest are those of the files;
# malformed input gives the same error whatever N, the first in input order;
# and the merge (and verify) of a finished job gives the same output and
# merge.json (merged_at aside), a result without its last newline and a
# corrupt result included.
set -euo pipefail
# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"
new_workdir
FINISH=$TOP/tests/tools/fake-finish

python3 - "$W" <<'EOF'
import os, random, sys
w = sys.argv[1]
rng = random.Random(18)
os.makedirs(w + "/ds/sub")
os.makedirs(w + "/ds/media")
def rec(i, media):
    text = " ".join(rng.choice(["shard", "claim", "数据", "café", "\\u00e9", "\\\"q\\\""])
                    for _ in range(rng.randint(5, 60)))
    extra = ',"images":["media/%d.png","/abs/x.png"]' % i if media else ""
    return '{"id":%d,"text":"%s","n":%r%s}' % (i, text, rng.random(), extra)
def write(path, n, media=False, last_nl=True, start=0):
    with open(path, "w", encoding="utf-8") as f:
        lines = [rec(start + i, media) for i in range(n)]
        f.write("\n".join(lines) + ("\n" if last_nl else ""))
write(w + "/ds/a.jsonl", 14000)                           # about 2.5 MiB
write(w + "/ds/b.jsonl", 9000, media=True, start=14000)   # edited: media paths
write(w + "/ds/c.jsonl", 5, last_nl=False, start=23000)   # no final newline
open(w + "/ds/sub/empty.jsonl", "w").close()
write(w + "/ds/sub/d.jsonl", 3000, start=23005)
write(w + "/one.jsonl", 14000)                            # one file, nothing edited
# malformed: far into the file, and two in different chunks
good = [rec(i, False) for i in range(20000)]
bad = list(good)
bad[15000] = bad[15000][:-1]            # an unterminated object, line 15001
open(w + "/bad1.jsonl", "w").write("\n".join(bad) + "\n")
bad[6001] = '{"id": 1,}'                # an earlier one, line 6002
open(w + "/bad2.jsonl", "w").write("\n".join(bad) + "\n")
long = list(good)
long[9000] = '{"t":"%s"}' % ("x" * 5000)  # over --max-line-bytes 4096, line 9001
long[12000] = "[1]"                      # not an object, later
open(w + "/long.jsonl", "w").write("\n".join(long) + "\n")
long[3000] = "[2]"                       # not an object, before the long one
open(w + "/long2.jsonl", "w").write("\n".join(long) + "\n")
EOF
# the same dataset with two files compressed (gzip, zstd): the same order
cp -r "$W/ds" "$W/zds"
gzip "$W/zds/a.jsonl"
zstd -q --rm "$W/zds/sub/d.jsonl"
printf 'process:\n  - whitespace_normalization_mapper:\n' >"$W/plain.yaml"
printf 'process:\n  - whitespace_normalization_mapper:\n  - text_length_filter:\n      index_key: global_index\n' \
    >"$W/index.yaml"

# check_digests JOB: every shard's sha256 and the normalised stream's in the
# manifest are those of the files, computed here.
check_digests() {
    python3 - "$1" <<'EOF' || fail "digests of $1" "see above"
import hashlib, json, sys
job = sys.argv[1]
m = json.load(open(job + "/manifest.json"))
allh = hashlib.sha256()
for s in m["shards"]:
    data = open(job + "/" + s["path"], "rb").read()
    assert hashlib.sha256(data).hexdigest() == s["sha256"], s["path"]
    assert data.count(b"\n") == s["rows"], s["path"]
    allh.update(data)
assert allh.hexdigest() == m["normalized_sha256"], "normalized_sha256"
for f in m["input_files"]:
    assert hashlib.sha256(open(f["path"], "rb").read()).hexdigest() == f["sha256"], f["path"]
EOF
}

# same_job A B: the job directories are equal byte for byte but for the
# manifest's created_at line.
same_job() {
    diff -r --exclude=manifest.json "$1" "$2" >/dev/null || return 1
    diff <(grep -v '"created_at"' "$1/manifest.json") \
        <(grep -v '"created_at"' "$2/manifest.json") >/dev/null
}

for recipe in plain index; do
    for data in ds one.jsonl zds; do
        for n in 1 2 7; do
            "$ESCTL" prepare --local --threads "$n" --config "$W/$recipe.yaml" \
                --dataset-path "$W/$data" --job-dir "$W/job" --num-shards 5 >"$W/out" 2>&1 ||
                fail "prepare $recipe $data --threads $n" "$(cat "$W/out")"
            check_digests "$W/job"
            if [ "$n" = 1 ]; then
                mv "$W/job" "$W/job.1"
                continue
            fi
            same_job "$W/job.1" "$W/job" ||
                fail "$recipe $data: --threads $n gives the job of --threads 1" \
                    "$(diff -r "$W/job.1" "$W/job" | head -20)"
            rm -rf "$W/job"
        done
        ok "$recipe recipe, $data: the same job with --threads 1, 2 and 7, its digests right"
        if [ "$data" = zds ]; then
            # (the same records, in order; media paths name the dataset dir)
            cmp -s <(cat "$W/$recipe-ds/shards/"*) <(sed "s#$W/zds/#$W/ds/#g" "$W/job.1/shards/"*) ||
                fail "$recipe recipe: compressed inputs give the records of plain ones"
            ok "$recipe recipe: the dataset with gzip and zstd files gives the same records"
        fi
        if [ "$data" = ds ]; then cp -r "$W/job.1" "$W/$recipe-ds"; fi
        if [ "$recipe/$data" = index/ds ]; then mv "$W/job.1" "$W/kept"; else rm -rf "$W/job.1"; fi
    done
done
grep -q '"global_index":23004' "$W/kept/shards/"*.jsonl ||
    fail "the index key counts records across files and chunks" "no global_index 23004"
ok "the index key counts records across files and chunks"

# the balancing rule of spec §6.5, computed here, on records of very
# uneven sizes and nearly as many shards as records (where its second
# clause, records left = shards left, decides), and on a file without its
# last newline
python3 - "$W" <<'EOF'
import random, sys
w = sys.argv[1]
rng = random.Random(5)
with open(w + "/uneven.jsonl", "w") as f:
    for i in range(60):
        f.write('{"i":%d,"t":"%s"}\n' % (i, "x" * (20000 if i in (3, 4, 50) else rng.randint(1, 300))))
with open(w + "/nonl.jsonl", "w") as f:
    f.write("\n".join('{"i":%d,"t":"%s"}' % (i, "y" * rng.randint(1, 3000)) for i in range(3000)))
EOF
expect_shards() { # JOB INPUT SHARDS
    python3 - "$@" <<'EOF' || fail "the shards of $2 in $3 follow spec §6.5" "see above"
import json, sys
job, data, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
recs = [l + b"\n" for l in open(data, "rb").read().split(b"\n") if l]
total, rows = sum(map(len, recs)), len(recs)
want, cur, written = [[]], 0, 0
for i, r in enumerate(recs):
    want[-1].append(r)
    written += len(r)
    left = rows - i - 1
    if cur < n - 1 and (written * n >= total * (cur + 1) or left == n - cur - 1):
        want.append([])
        cur += 1
m = json.load(open(job + "/manifest.json"))
got = [open(job + "/" + s["path"], "rb").read() for s in m["shards"]]
assert [b"".join(x) for x in want] == got, "shards differ"
EOF
}
for spec in "uneven.jsonl 40" "uneven.jsonl 3" "nonl.jsonl 7"; do
    read -r data n <<<"$spec"
    for t in 1 7; do
        rm -rf "$W/job"
        "$ESCTL" prepare --local --threads "$t" --config "$W/plain.yaml" \
            --dataset-path "$W/$data" --job-dir "$W/job" --num-shards "$n" >"$W/out" 2>&1 ||
            fail "prepare $data in $n shards" "$(cat "$W/out")"
        expect_shards "$W/job" "$W/$data" "$n"
        check_digests "$W/job"
    done
    ok "$data in $n shards: the balancing rule's shards, with --threads 1 and 7"
done
rm -rf "$W/job"

# the same error whatever the threads: the first in input order
expect_error() { # NAME WHERE [OPTIONS...]
    local name=$1 where=$2 first=
    shift 2
    for n in 1 2 7; do
        rc=0
        "$ESCTL" prepare --local --threads "$n" --config "$W/plain.yaml" \
            --dataset-path "$W/$name" --job-dir "$W/bad" --num-shards 3 "$@" \
            >"$W/out" 2>"$W/err.$n" || rc=$?
        [ "$rc" = 2 ] || fail "$name --threads $n: exit $rc, expected 2" "$(cat "$W/err.$n")"
        grep -qF "$name:$where" "$W/err.$n" ||
            fail "$name --threads $n names $name:$where" "$(cat "$W/err.$n")"
        [ ! -e "$W/bad" ] || fail "$name --threads $n: no job directory left"
        [ -z "$first" ] || cmp -s "$W/err.1" "$W/err.$n" ||
            fail "$name: the same message with --threads $n" "$(cat "$W/err.1" "$W/err.$n")"
        first=1
    done
    ok "$name: $(head -1 "$W/err.1")"
}
expect_error bad1.jsonl 15001
expect_error bad2.jsonl 6002
expect_error long.jsonl 9001 --max-line-bytes 4096
expect_error long2.jsonl 3001 --max-line-bytes 4096

# merge: the same output and merge.json with any threads
job=$W/kept
"$FINISH" --job-dir "$job" --all --hostname n1 --no-newline part-00002-of-00005 >/dev/null
for n in 1 2 7; do
    "$ESCTL" merge --local --threads "$n" --job-dir "$job" --output "$W/merged.$n.jsonl" \
        >"$W/out" 2>&1 || fail "merge --threads $n" "$(cat "$W/out")"
    grep -v '"merged_at"\|"output_path"' "$job/merge.json" >"$W/merge.$n.json"
    "$ESCTL" verify --local --threads "$n" --job-dir "$job" >"$W/out" 2>&1 ||
        fail "verify --threads $n" "$(cat "$W/out")"
    [ "$n" = 1 ] && continue
    cmp "$W/merged.1.jsonl" "$W/merged.$n.jsonl" || fail "merge --threads $n: the same output"
    cmp "$W/merge.1.json" "$W/merge.$n.json" || fail "merge --threads $n: the same merge.json"
done
python3 - "$job" "$W/merged.1.jsonl" <<'EOF' || fail "the merged output is the results in order"
import hashlib, json, sys
job, out = sys.argv[1:]
want = b""
for s in json.load(open(job + "/manifest.json"))["shards"]:
    d = json.load(open(job + "/state/done/" + s["id"] + ".json"))
    data = open(job + "/" + d["output_path"], "rb").read()
    want += data if data.endswith(b"\n") else data + b"\n"
got = open(out, "rb").read()
assert got == want
assert json.load(open(job + "/merge.json"))["sha256"] == hashlib.sha256(got).hexdigest()
EOF
ok "merge and verify: the same output and merge.json with --threads 1, 2 and 7"

# a corrupt result: the same error whatever the threads
out=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["output_path"])' \
    "$job/state/done/part-00003-of-00005.json")
python3 - "$job/$out" <<'EOF'
import sys
p = sys.argv[1]
lines = open(p, "rb").read().split(b"\n")
lines[4000] = b'{"broken": tru}'
open(p, "wb").write(b"\n".join(lines))
EOF
for n in 1 2 7; do
    rc=0
    "$ESCTL" merge --local --threads "$n" --job-dir "$job" --output "$W/m.jsonl" \
        >"$W/out" 2>"$W/merr.$n" || rc=$?
    [ "$rc" = 2 ] || fail "merge of a corrupt result --threads $n: exit $rc" "$(cat "$W/merr.$n")"
    grep -qF "$out:4001" "$W/merr.$n" || fail "merge --threads $n names $out:4001" \
        "$(cat "$W/merr.$n")"
    cmp -s "$W/merr.1" "$W/merr.$n" || fail "merge: the same error with --threads $n"
    [ ! -e "$W/m.jsonl" ] || fail "merge --threads $n: no output left"
done
ok "a corrupt result: $(head -1 "$W/merr.1")"
summary
