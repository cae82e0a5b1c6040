#!/usr/bin/env bash
# history: a shard's attempts as the operator reads them. Two `esctl
# worker --local` nodes (n1, n2) with the stand-in mini-dj (not
# Data-Juicer) work a job of four shards: one shard fails once (two
# attempts), n1 is killed (SIGKILL) under a hanging attempt so that n2
# takes its lock over. Checked: status --all (the attempts table: node,
# start, end, elapsed, outcome, class, rows), --state and --sort, through
# esd as well as --local; a shard pending after a failure shows its last
# error; logs --shard --attempt with its header; esctl report's HTML in a
# headless chromium (skipped with "# skip:" when chromium is missing):
# what it draws, its attempt rects and node rows, no network; status
# --watch off a tty prints only changes, on a tty (script) a per-node view.
#
# Environment: TOP, ESCTL, ESD, TOOLS as the other integration tests.
set -euo pipefail
export LC_ALL=C

# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"
new_workdir
unset_knobs XDG_CACHE_HOME HF_HOME PYTHONPATH
{ [ -x "$MINI" ] && [ -x "$ESCTL" ]; } || fail "tools exist" "run make && make tools"

text_dataset 8
prep() { prepare_job "$@"; }
JOB=$W/job
prep "$JOB" 4
S0=part-00000-of-00004 S1=part-00001-of-00004
# worker NODE ENV...: a worker on JOB in the background (PID), lease 2 s
worker() {
    local node=$1
    shift
    env "$@" "$ESCTL" worker --local --job-dir "$JOB" --node "$node" --processor "$MINI" \
        --poll-interval-secs 1 --lease-secs 2 >"$W/$node.out" 2>&1 &
    PID=$!
    BG+=("$PID")
}

# ---- n1 hangs on shard 0 and is killed; n2 fails shard 1 once, takes over ----
worker n1 MINI_DJ_HANG=1 MINI_DJ_ONLY="$S0"
P1=$PID
lock_by_n1() { grep -qs '"node": *"n1"' "$JOB/state/locks/$S0.lock"; }
wait_for "n1 claims $S0" 20 lock_by_n1
hung() { grep -qs "hanging" "$JOB"/attempts/"$S0"/0001-*/process.log; }
wait_for "n1's attempt of $S0 hangs" 20 hung
for k in $(descendants "$P1"); do kill -KILL -- "-$k" 2>/dev/null || kill -KILL "$k" || true; done
kill -KILL "$P1"
{ wait "$P1"; } 2>/dev/null || true
ok "n1 killed (SIGKILL) under its attempt of $S0"
worker n2 MINI_DJ_EXIT=1 MINI_DJ_ONLY="$S1" MINI_DJ_FAIL_ONCE="$W/once"
P2=$PID
wait_for "n2 finishes the job" 60 dead "$P2"
wait "$P2" || fail "n2's worker exits 0" "$(tail -n 20 "$W/n2.out")"
ok "n2 took over $S0, retried $S1 and finished the job"

# ---- status --all, locally ----
run "$ESCTL" status --local --all "$JOB"
check "status --local --all of the complete job" 0 "done=4"
hdr=$(grep -E '^SHARD +ATTEMPT +NODE +START +END +ELAPSED +OUTCOME +CLASS +ROWS +ERROR' <<<"$OUT") ||
    fail "status --all: the attempts table's header" "$OUT"
ok "status --all: the attempts table"
grep -Eq "^$S0 +1 +n1 +[0-9:]{8} +[0-9:]{8} +[0-9.]+ ?[a-z]* +taken over +infrastructure" <<<"$OUT" ||
    fail "status --all: $S0's first attempt, n1's, taken over" "$OUT"
grep -Eq "^$S0 +2 +n2 +[0-9:]{8} +[0-9:]{8} .* done +[0-9]+" <<<"$OUT" ||
    fail "status --all: $S0's second attempt, n2's, done with its rows" "$OUT"
grep -Eq "^$S1 +1 +n[12] .* failed +processor +.*exit" <<<"$OUT" ||
    fail "status --all: $S1's first attempt failed (processor) with its error" "$OUT"
grep -Eq "^$S1 +2 +n[12] .* done" <<<"$OUT" || fail "status --all: $S1's second attempt done" "$OUT"
ok "status --all: per attempt its node, start, end, elapsed, outcome, class, rows, error"
# (the reference's shard lines stay as they were)
grep -Eq "^$S0 +done +[0-9]+ +" <<<"$OUT" || fail "status --all: the shard table stays" "$OUT"

run "$ESCTL" --json status --local --all "$JOB"
check "status --json --all" 0
py 'len([a for s in j["shards"] for a in s["attempts"]]) == 6 and [a["outcome"] for a in next(s for s in j["shards"] if s["shard_id"] == "'"$S0"'")["attempts"]] == ["taken over", "done"]' \
    "$W/stdout" | grep -qx True || fail "status --json --all: 6 attempts, $S0's taken over then done" "$OUT"
ok "status --json --all: every attempt, with its outcome"

run "$ESCTL" status --local --sort attempts "$JOB"
check "status --sort attempts" 0
first=$(grep -E '^part-' <<<"$OUT" | head -n 1 | awk '{print $1}')
[[ $first == "$S0" || $first == "$S1" ]] || fail "--sort attempts: a shard of two attempts first" "$OUT"
run "$ESCTL" --json status --local --sort elapsed "$JOB"
py '(lambda e: e == sorted(e, reverse=True))([s["attempts"][-1].get("elapsed_secs", -1) for s in j["shards"]])' \
    "$W/stdout" | grep -qx True || fail "--sort elapsed: slowest first" "$OUT"
ok "status --sort attempts / elapsed order the shards"
run "$ESCTL" status --local --state failed "$JOB"
check "status --state failed" 0
! grep -Eq '^part-' <<<"$OUT" || fail "--state failed lists no shard of a complete job" "$OUT"
run "$ESCTL" status --local --state done --sort node "$JOB"
[ "$(grep -Ec '^part-[0-9a-z-]+ +done' <<<"$OUT")" -eq 4 ] || fail "--state done: the four shards" "$OUT"
run "$ESCTL" status --local --state bogus "$JOB"
[ "$RC" -ne 0 ] && [[ $ERR == *"not a state"* ]] || fail "--state bogus is refused" "$ERR"
ok "status --state filters the shards; a bad state or key is refused"

# ---- logs --attempt ----
run "$ESCTL" logs --local "$JOB" --shard "$S0" --attempt 1
check "logs --attempt 1" 0 "==> shard $S0, attempt 1 on node n1 (taken over): attempts/$S0/0001-"
[[ $OUT == *"mini-dj: hanging"* ]] || fail "logs --attempt 1: n1's process.log" "$OUT"
run "$ESCTL" logs --local "$JOB" --shard "$S0" --attempt 7
[ "$RC" -ne 0 ] && [[ $ERR == *"no attempt 7"* ]] || fail "logs --attempt 7 does not exist" "$ERR"
ok "logs --shard --attempt: a header naming node, attempt and file, then the log"

# ---- a shard pending after a failure shows its last error ----
J2=$W/job2
prep "$J2" 1
MINI_DJ_EXIT=3 "$ESCTL" worker --local --job-dir "$J2" --node n3 --processor "$MINI" \
    --max-shards 1 >"$W/n3.out" 2>&1 || true
run "$ESCTL" status --local --all "$J2"
grep -Eq "^part-00000-of-00001 +pending +[0-9]+ .*exit" <<<"$OUT" ||
    fail "a pending shard shows its last error" "$OUT"
ok "a shard pending after a failure shows its last error"

# ---- status --watch: off a tty only changes; on a tty a per-node view ----
"$ESCTL" status --local --watch "$J2" >"$W/watch.out" 2>&1 &
WPID=$!
BG+=("$WPID")
one_line() { [ "$(wc -l <"$W/watch.out")" -ge 1 ]; }
wait_for "status --watch prints its first line" 10 one_line
# two more rounds (2 s apart) of the unchanged job print nothing more
t0=$(date +%s)
after() { [ "$(date +%s)" -ge "$1" ]; }
wait_for "5 s pass" 10 after $((t0 + 5))
[ "$(wc -l <"$W/watch.out")" -eq 1 ] || fail "status --watch off a tty: nothing while nothing changes" "$(cat "$W/watch.out")"
"$ESCTL" worker --local --job-dir "$J2" --node n3 --processor "$MINI" >"$W/n3b.out" 2>&1 ||
    fail "n3 finishes job2" "$(cat "$W/n3b.out")"
wait_for "status --watch ends with the job" 10 dead "$WPID"
wait "$WPID" || fail "status --watch of a complete job exits 0" "$(cat "$W/watch.out")"
[ "$(wc -l <"$W/watch.out")" -eq 2 ] && grep -q '1/1 shards done' "$W/watch.out" ||
    fail "status --watch off a tty: one line for the change, then it ends" "$(cat "$W/watch.out")"
ok "status --watch off a tty: a line when something changed, none when not, ends with the job"
if command -v script >/dev/null; then
    script -q -c "$ESCTL status --local --watch $JOB" /dev/null >"$W/tty.out" 2>&1 </dev/null ||
        fail "status --watch on a tty" "$(cat "$W/tty.out")"
    tr -d '\r' <"$W/tty.out" | grep -Eq '^NODE +DONE +RUNNING NOW' &&
        tr -d '\r' <"$W/tty.out" | grep -Eq '^n2 +2 +-' && grep -q '\[#' "$W/tty.out" ||
        fail "status --watch on a tty: a bar and the per-node view" "$(cat -v "$W/tty.out")"
    ok "status --watch on a tty (script): progress bar, nodes with what they run"
else
    echo "# skip: no script(1) for the tty case"
fi

# ---- esctl report: one HTML file, drawn by a headless chromium ----
# A forged attempt whose node and error carry markup: the page must show it
# as text.
S2=part-00002-of-00004
F=$JOB/attempts/$S2/0009-0123456789abcdef0123456789abcdef
mkdir "$F"
t=$(py 'j["claimed_at_epoch"]' "$(ls "$JOB"/attempts/"$S2"/0001-*/attempt.json)")
cat >"$F/attempt.json" <<JSON
{"shard_id": "$S2", "attempt_number": 9, "status": "failed", "failure_class": "processor",
 "node": "<img src=x onerror=alert(1)>evil", "started_at_epoch": $t,
 "finished_at": "2099-01-01T00:00:00+00:00", "duration_secs": 0.5,
 "error": "</title><script>alert(1)</script><a href=\"javascript:alert(2)\">x</a>"}
JSON
run "$ESCTL" report "$JOB" -o "$W/report.html"
check "esctl report -o" 0 "Wrote $W/report.html: 7 attempts of 4 shards on 3 nodes"
H=$W/report.html
! grep -Eiq '<(script|img|link|iframe|object|embed)|(src|href)="|@import|url\(|https?://' "$H" ||
    fail "the report loads nothing and holds no markup from the job dir" "$(grep -Eio '.{40}(<script|<img|https?://).{40}' "$H" | head)"
grep -q '&lt;img src=x onerror=alert(1)&gt;evil' "$H" && grep -q '&lt;/title&gt;&lt;script&gt;' "$H" ||
    fail "the forged node and error are shown escaped" "$(grep -c evil "$H")"
ok "the report holds no script, link, image or URL; the job dir's markup is escaped"
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CHROMIUM" ]; then
    echo "# skip: chromium is not installed (scripts/deps --tools installs it)"
else
    # a proxy that refuses: any request the page made would fail, and is
    # logged (--enable-logging) as a net error
    chrome() {
        timeout 120 "$CHROMIUM" --headless --no-sandbox --disable-gpu --no-first-run \
            --user-data-dir="$W/chrome" --proxy-server=127.0.0.1:9 --hide-scrollbars \
            --window-size=1200,900 "$@" "file://$H" 2>>"$W/chrome.err"
    }
    chrome --dump-dom >"$W/dom.html" || fail "chromium --dump-dom" "$(tail -n 5 "$W/chrome.err")"
    n=$(grep -o '<rect class="attempt [a-z]*"' "$W/dom.html" | sort | uniq -c | tr -s ' ' | tr '\n' ';')
    [ "$(grep -c '<rect class="attempt ' "$W/dom.html")" -eq 7 ] ||
        fail "the DOM has the 7 attempt rects" "$n"
    [ "$n" = ' 4 <rect class="attempt done"; 2 <rect class="attempt failed"; 1 <rect class="attempt takenover";' ] ||
        fail "the DOM's attempts: 4 done, 2 failed, 1 taken over" "$n"
    [ "$(grep -o '<g class="node"' "$W/dom.html" | wc -l)" -eq 3 ] ||
        fail "the DOM has a row group per node (n1, n2, the forged one)" "$(grep -o '<g class="node"[^>]*>' "$W/dom.html")"
    grep -q '<title>shard '"$S0"', attempt 1 on node n1' "$W/dom.html" ||
        fail "an attempt's tooltip names shard, attempt and node" "$(grep -o '<title>[^<]*' "$W/dom.html" | head -3)"
    ! grep -q '<script\|<img' "$W/dom.html" || fail "no script or image element in the DOM"
    ok "chromium's DOM: 7 attempt rects ($n), 3 node rows, tooltips, no injected element"
    chrome --screenshot="$W/shot.png" >/dev/null || fail "chromium --screenshot" "$(tail -n 5 "$W/chrome.err")"
    python3 - "$W/shot.png" >"$W/pixels" <<'PY' || fail "the screenshot decodes" "$(cat "$W/pixels")"
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat = 8, b""
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
assert depth == 8 and ctype in (2, 6), (depth, ctype)
bpp = 3 if ctype == 2 else 4
raw, stride = zlib.decompress(idat), w * bpp
prev, counts, i = bytearray(stride), {}, 0
want = {"done": (46, 125, 50), "failed": (198, 40, 40), "takenover": (239, 108, 0)}
for y in range(h):
    f, line = raw[i], bytearray(raw[i + 1:i + 1 + stride])
    i += 1 + stride
    for x in range(stride):
        a = line[x - bpp] if x >= bpp else 0
        b, c = prev[x], prev[x - bpp] if x >= bpp else 0
        if f == 1: line[x] = (line[x] + a) & 255
        elif f == 2: line[x] = (line[x] + b) & 255
        elif f == 3: line[x] = (line[x] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    for x in range(0, stride, bpp):
        px = tuple(line[x:x + 3])
        for k, v in want.items():
            if px == v:
                counts[k] = counts.get(k, 0) + 1
    prev = line
print(" ".join("%s=%d" % (k, counts.get(k, 0)) for k in want))
PY
    px=$(cat "$W/pixels")
    for k in done failed takenover; do
        [[ $px =~ $k=([0-9]+) ]] && [ "${BASH_REMATCH[1]}" -ge 50 ] ||
            fail "the screenshot shows the $k colour" "$px"
    done
    ! grep -Eiq 'ERR_PROXY|ERR_(CONNECTION|TUNNEL)|net::ERR' "$W/chrome.err" ||
        fail "the page asked the network for nothing" "$(grep -Ei 'net::ERR|ERR_PROXY' "$W/chrome.err" | head -3)"
    ok "chromium's screenshot shows done, failed and taken-over attempts ($px); no network request"
fi

# ---- through esd ----
if [ -x "${ESD:-}" ]; then
    declare -A DPID
    daemon_conf d1 spool_dir=
    sed -i '/^spool_dir/d' "$W/d1/esd.yaml"
    start_daemon d1
    run "$ESCTL" --socket "$(dsock d1)" status --all --sort elapsed "$JOB"
    check "status --all --sort elapsed through esd" 0 "taken over"
    grep -Eq "^$S0 +2 +n2 " <<<"$OUT" || fail "through esd: the attempts table" "$OUT"
    run "$ESCTL" --socket "$(dsock d1)" logs "$JOB" --shard "$S1" --attempt 1
    check "logs --attempt through esd" 0 "==> shard $S1, attempt 1 on node"
    stop_daemon d1
fi
summary
