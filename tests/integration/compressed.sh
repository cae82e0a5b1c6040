#!/usr/bin/env bash
# Compressed inputs: the same dataset prepared plain, as gzip (one member,
# and several concatenated) and as zstd (one frame, and several) gives
# byte-identical shards and manifests but for each input file's fingerprint
# (path, size, mtime, sha256 of its raw bytes) and its compression field;
# re-prepare of a compressed input is unchanged; every corrupt stream
# (truncated, corrupt, not what its name says, trailing garbage) exits 2
# naming the file and leaves nothing behind; a directory of mixed plain and
# compressed files keeps the order by relative path; an empty compressed
# file is an empty input, as an empty plain one is.
set -euo pipefail
# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"
command -v gzip >/dev/null || skip "gzip is not installed"
command -v zstd >/dev/null || skip "zstd is not installed (scripts/deps --tools)"
new_workdir
text_dataset 3000
head -n 1200 "$W/data.jsonl" >"$W/a.part"
tail -n +1201 "$W/data.jsonl" >"$W/b.part"

mkdir -p "$W/plain" "$W/gz1" "$W/gzn" "$W/zs1" "$W/zsn"
cp "$W/data.jsonl" "$W/plain/data.jsonl"
gzip -c "$W/data.jsonl" >"$W/gz1/data.jsonl.gz"
{ gzip -c "$W/a.part"; gzip -c "$W/b.part"; } >"$W/gzn/data.jsonl.gz"
zstd -q -c "$W/data.jsonl" >"$W/zs1/data.jsonl.zst"
{ zstd -q -c "$W/a.part"; zstd -q -c "$W/b.part"; } >"$W/zsn/data.json.zst"
[ "$(gzip -dc "$W/gzn/data.jsonl.gz" | cmp - "$W/data.jsonl" && echo same)" = same ] ||
    fail "the two-member gzip file holds the dataset"

# prep NAME INPUT: prepares INPUT into $W/jobs/NAME (4 shards), into RC/OUT/ERR.
prep() {
    mkdir -p "$W/jobs"
    run "$ESCTL" prepare --local --config "$W/recipe.yaml" --dataset-path "$2" \
        --job-dir "$W/jobs/$1" --num-shards 4
}
# The manifest without what differs between the forms of one dataset: the
# job's name and time, the dataset's path, and each input's fingerprint and
# compression (printed apart: "compression sha256-ok").
canon() {
    python3 - "$1" "$2" <<'EOF'
import hashlib, json, sys
m = json.load(open(sys.argv[1]))
for k in ("job_id", "created_at", "dataset_path", "media_root"):
    m.pop(k)
files = []
for f in m.pop("input_files"):
    raw = open(f["path"], "rb").read()
    ok = (hashlib.sha256(raw).hexdigest() == f["sha256"] and len(raw) == f["size_bytes"])
    files.append("%s %s" % (f.get("compression", "-"), "raw-fingerprint-ok" if ok else "BAD"))
    for k in ("path", "relative_path", "size_bytes", "mtime_ns", "sha256", "compression"):
        f.pop(k, None)
    assert list(f) == ["rows"], f
m["input_rows"] = [f["rows"]]
print(json.dumps(m, indent=1, sort_keys=True))
open(sys.argv[2], "w").write(" ".join(files))
EOF
}

prep plain "$W/plain/data.jsonl"
check "prepare of the plain dataset" 0 "Prepared 4 shards from 3000 records"
canon "$W/jobs/plain/manifest.json" "$W/plain.files" >"$W/plain.canon"
grep -q '"compression"' "$W/jobs/plain/manifest.json" &&
    fail "a plain input's entry has no compression field" "$(cat "$W/jobs/plain/manifest.json")"
ok "a plain job's manifest names no compression"

for form in gz1:gzip:data.jsonl.gz gzn:gzip:data.jsonl.gz zs1:zstd:data.jsonl.zst \
    zsn:zstd:data.json.zst; do
    name=${form%%:*} rest=${form#*:}
    kind=${rest%%:*} file=${rest#*:}
    prep "$name" "$W/$name/$file"
    check "prepare of $name ($file)" 0 "Prepared 4 shards from 3000 records"
    diff -r "$W/jobs/plain/shards" "$W/jobs/$name/shards" >/dev/null ||
        fail "$name: the shards are the plain job's, byte for byte"
    ok "$name: the shards are the plain job's, byte for byte"
    canon "$W/jobs/$name/manifest.json" "$W/$name.files" >"$W/$name.canon"
    diff -u "$W/plain.canon" "$W/$name.canon" >"$W/diff" ||
        fail "$name: the manifest is the plain job's but for the input's fingerprint" "$(cat "$W/diff")"
    ok "$name: the manifest is the plain job's but for the input's fingerprint"
    [ "$(cat "$W/$name.files")" = "$kind raw-fingerprint-ok" ] ||
        fail "$name: the input is recorded as $kind, fingerprinted raw" "$(cat "$W/$name.files")"
    ok "$name: the input is recorded as $kind, with its raw bytes' size and sha256"
    [ "$(find "$W/jobs" -mindepth 1 -maxdepth 1 -name '.*')" = "" ] ||
        fail "$name: no staging directory is left"
    [ "$(count "$W/jobs/$name")" -eq "$(count "$W/jobs/plain")" ] ||
        fail "$name: the job holds what the plain one does (no spool)" "$(ls -a "$W/jobs/$name")"
    ok "$name: no staging directory or spool is left"
    prep "$name" "$W/$name/$file"
    check "re-prepare of $name is unchanged" 0 "Job is already prepared and unchanged"
done

# ---- corrupt streams: exit 2, the file named, nothing left behind ----
mkdir -p "$W/bad"
gz=$W/gz1/data.jsonl.gz zs=$W/zs1/data.jsonl.zst
gsize=$(stat -c %s "$gz") zsize=$(stat -c %s "$zs")
head -c $((gsize - 10)) "$gz" >"$W/bad/truncated.jsonl.gz"
head -c $((zsize / 2)) "$zs" >"$W/bad/truncated.jsonl.zst"
# flip_at SRC OFFSET DEST: SRC with the byte at OFFSET inverted.
flip_at() {
    python3 -c 'import sys
d = bytearray(open(sys.argv[1], "rb").read()); d[int(sys.argv[2])] ^= 0xff
open(sys.argv[3], "wb").write(d)' "$@"
}
flip_at "$gz" $((gsize / 2)) "$W/bad/corrupt.jsonl.gz"
flip_at "$zs" $((zsize / 2)) "$W/bad/corrupt.jsonl.zst"
flip_at "$gz" $((gsize - 6)) "$W/bad/checksum.jsonl.gz"
flip_at "$zs" $((zsize - 2)) "$W/bad/checksum.jsonl.zst"
cp "$W/data.jsonl" "$W/bad/notgzip.jsonl.gz"
cp "$gz" "$W/bad/gzip.jsonl.zst"
{ cat "$gz"; echo junk; } >"$W/bad/trailing.jsonl.gz"
{ cat "$zs"; printf '\0\0\0\0\0\0\0\0'; } >"$W/bad/trailing.jsonl.zst"
# (a byte flipped inside the data may first decode to text that is not
# JSON: "-" accepts any error naming the file; the check values are sure)
while read -r name what; do
    rm -rf "$W/jobs"
    prep bad "$W/bad/$name"
    if [ "$what" = - ]; then
        check "$name: exit 2 naming the file" 2 "" "$W/bad/$name"
    else
        check "$name: exit 2 naming the file" 2 "" "$W/bad/$name: $what"
        # (a wrong magic is at the start: "its first bytes")
        [[ $what == not\ a* ]] || [[ $ERR =~ at\ byte\ [0-9]+.*\(line\ [0-9]+\) ]] ||
            fail "$name: the message gives the offset and the line reached" "$ERR"
    fi
    [ "$(count "$W/jobs")" -eq 0 ] || fail "$name: nothing is left behind" "$(ls -a "$W/jobs")"
    ok "$name: nothing is left behind"
done <<'EOF'
truncated.jsonl.gz truncated gzip stream
truncated.jsonl.zst truncated zstd stream
corrupt.jsonl.gz -
corrupt.jsonl.zst -
checksum.jsonl.gz corrupt gzip data
checksum.jsonl.zst corrupt zstd data
notgzip.jsonl.gz not a gzip file
gzip.jsonl.zst not a zstd file
trailing.jsonl.gz trailing garbage after the last gzip member
trailing.jsonl.zst trailing garbage after the last zstd frame
EOF

# ---- a directory of mixed files: the order by relative path ----
rm -rf "$W/jobs"
mixed=$W/mixed
mkdir -p "$mixed/b" "$mixed/c"
head -n 500 "$W/data.jsonl" | zstd -q -c >"$mixed/c/z.jsonl.zst"
sed -n '501,1000p' "$W/data.jsonl" >"$mixed/c/zz.jsonl"
sed -n '1001,2000p' "$W/data.jsonl" | gzip -c >"$mixed/d.json.gz"
tail -n +2001 "$W/data.jsonl" >"$mixed/e.jsonl"
: >"$mixed/b/empty.jsonl.gz"
: >"$mixed/b/empty.jsonl"
printf 'not an input\n' >"$mixed/notes.json"
prep mixed "$mixed"
check "prepare of a directory of mixed files" 0 "Prepared 4 shards from 3000 records"
python3 - "$W/jobs/mixed/manifest.json" >"$W/order" <<'EOF'
import json, sys
print(" ".join("%s:%s:%d" % (f["relative_path"], f.get("compression", "-"), f["rows"])
               for f in json.load(open(sys.argv[1]))["input_files"]))
EOF
want="b/empty.jsonl:-:0 b/empty.jsonl.gz:gzip:0 c/z.jsonl.zst:zstd:500 c/zz.jsonl:-:500"
want="$want d.json.gz:gzip:1000 e.jsonl:-:1000"
[ "$(cat "$W/order")" = "$want" ] ||
    fail "the inputs are in the order of their relative paths" "got:  $(cat "$W/order")" "want: $want"
ok "mixed inputs are in the order of their relative paths, empty ones empty"
cat "$W"/jobs/mixed/shards/*.jsonl | cmp -s - "$W/data.jsonl" ||
    fail "the mixed job's shards are the dataset in that order"
ok "the mixed job's shards are the dataset in that order"
prep mixed "$mixed"
check "re-prepare of the mixed directory is unchanged" 0 "Job is already prepared and unchanged"

# an empty compressed file alone is an empty dataset, as an empty plain one is
rm -rf "$W/jobs"
prep empty "$mixed/b/empty.jsonl"
plain_err=$ERR plain_rc=$RC
prep empty "$mixed/b/empty.jsonl.gz"
{ [ "$RC" = "$plain_rc" ] && [ "$ERR" = "$plain_err" ]; } ||
    fail "an empty .jsonl.gz fails as an empty .jsonl does" "plain: $plain_rc $plain_err" "gz: $RC $ERR"
ok "an empty .jsonl.gz fails as an empty .jsonl does ($plain_err)"
summary
