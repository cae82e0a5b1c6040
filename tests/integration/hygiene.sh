#!/usr/bin/env bash
# hygiene: output hygiene (issue 11 class 8). Names, errors and processor
# lines that job files, peers and processors write never reach a terminal
# or a log raw: no ESC, BEL, CR or C1 byte, no forged line.
#   (a) A job directory whose name holds an OSC title sequence, a colour
#       and a newline followed by a fake esd log line: prepare refuses the
#       name, escaped; a job prepared under a good name and renamed to it
#       is refused at load (status --local exits 2) with one escaped line
#       naming its manifest; --json's error is JSON.
#   (b) Records a job owner or a peer writes (a failed record's
#       last_error, host names in a lock and in a done record, with ESC, a
#       newline and the C1 CSI U+009B): status --all, human, has them
#       escaped on one line each; --json is valid JSON without a raw C1
#       byte and gives back the very strings.
#   (c) esd (the processor a wrapper that prints hostile lines, then runs
#       the stand-in mini-dj): the good job "ok job é" (space, non-ASCII:
#       fine) completes; the bad one is registered but refused at load;
#       `esctl list` shows it escaped on one line; `esctl list` and esd's
#       own log hold none of the bytes, no line starts like the forged
#       one, and the hostile lines and the refusal are there, escaped.
#   (d) logs --shard: raw bytes when piped; on a terminal (script(1), a
#       pty) escaped but for newlines and tabs.
set -euo pipefail
export LC_ALL=C.UTF-8

# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

new_workdir
unset_knobs
need_daemon_tools

ESC=$'\e'
BEL=$'\a'
CR=$'\r'
C1=$'\xc2\x9b'
FORGED='2026-12-01T00:00:00.000 esd n1 err: forged'
# the hostile name, and what every escaped form of it reads
EVIL_NAME="evil${ESC}]0;pwned${BEL}${ESC}[31m"$'\n'"$FORGED"
EVIL_SHOWN='evil\x1b]0;pwned\x07\x1b[31m\x0a'"$FORGED"

# clean WHAT FILE: FILE holds no ESC, BEL, CR, C1 (as UTF-8) or raw 0x9b.
RAW='[\x1b\x07\x0d\x9b]|\xc2[\x80-\x9f]'
clean() {
    if LC_ALL=C grep -q -P "$RAW" "$2"; then
        fail "$1: no raw control bytes" "$(LC_ALL=C grep -n -a -P "$RAW" "$2" | od -c | head -n 20)"
    fi
    ok "$1: no raw control bytes"
}
# no_forged WHAT FILE: no line of FILE starts as the forged log line.
no_forged() {
    ! grep -q "^${FORGED%% *}" "$2" || fail "$1: no forged line" "$(grep -n "^${FORGED%% *}" "$2")"
    ok "$1: no forged line"
}

text_dataset 40
EVIL=$W/$EVIL_NAME
OKJOB="$W/ok job é"
REC_JOB=$W/records

# ---- (a) the name is refused by prepare and at load, escaped ----
run "$ESCTL" prepare --local --config "$W/recipe.yaml" --dataset-path "$W/data.jsonl" \
    --job-dir "$EVIL" --num-shards 2
check "prepare refuses the hostile name" 2 "" "the job directory's name 'evil\\x1b]0;pwned"
clean "prepare's refusal of the hostile directory" "$W/stderr"
[ ! -e "$EVIL" ] || fail "prepare left nothing under the hostile name"
ok "prepare refuses the name, escaped, and leaves nothing"
prepare_job "$W/good-name" 2
mv "$W/good-name" "$EVIL"
# (without a job_id the directory's name is the job id, as in the reference)
python3 - "$EVIL/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
del m["job_id"]
json.dump(m, open(sys.argv[1], "w"), indent=2)
PY

run "$ESCTL" status --local "$EVIL"
check "status --local of the hostile job is refused" 2 "" "job_id '$EVIL_SHOWN' is not allowed"
[[ $ERR == "esctl: malformed manifest $W/$EVIL_SHOWN/manifest.json: job_id "* ]] ||
    fail "the refusal names the manifest, escaped" "$ERR"
[ "$(wc -l <"$W/stderr")" -eq 1 ] || fail "the refusal is one line" "$ERR"
clean "the refusal" "$W/stderr"
ok "the refusal is one line naming the manifest"
run "$ESCTL" --json status --local "$EVIL"
check "status --json of the hostile job" 2
[ "$(py '"is not allowed" in j["error"]' "$W/stdout")" = True ] || fail "--json's error is JSON" "$OUT"
ok "--json's error is JSON"

# ---- (b) records an owner or peer writes ----
prepare_job "$REC_JOB" 3
mapfile -t IDS < <(py '"\n".join(s["id"] for s in j["shards"])' "$REC_JOB/manifest.json")
BAD_ERR="boom${ESC}[2J"$'\n'"$FORGED${C1}31m"
BAD_HOST="peer${ESC}]2;title${BEL}${C1}"
python3 - "$REC_JOB" "${IDS[@]}" "$BAD_ERR" "$BAD_HOST" <<'EOF'
import json, os, sys
job, a, b, c, err, host = sys.argv[1:]
def put(kind, name, rec):
    os.makedirs(job + "/state/" + kind, exist_ok=True)
    with open(job + "/state/" + kind + "/" + name, "w") as f:
        json.dump(rec, f, ensure_ascii=False)
put("failed", a + ".json", {"shard_id": a, "last_error": err, "hostname": host, "attempts": 4})
put("locks", b + ".lock", {"shard_id": b, "hostname": host, "node": host, "pid": 7})
put("done", c + ".json", {"shard_id": c, "hostname": host, "node": host, "rows": 1})
EOF
run "$ESCTL" status --local --all "$REC_JOB"
check "status --all with hostile records" 2 'boom\x1b[2J\x0a'"$FORGED"'\xc2\x9b31m'
clean "status --all" "$W/stdout"
no_forged "status --all" "$W/stdout"
[[ $OUT == *'peer\x1b]2;title\x07\xc2\x9b'* ]] || fail "status shows the host name escaped" "$OUT"
ok "status shows the host name escaped"
run "$ESCTL" --json status --local --all "$REC_JOB"
check "status --json with hostile records" 2
clean "status --json" "$W/stdout"
python3 - "$W/stdout" "$BAD_ERR" "$BAD_HOST" <<'EOF' ||
    fail "status --json gives back the strings" "$OUT"
import json, sys
st = json.load(open(sys.argv[1], encoding="utf-8"))
errs = [s.get("error") for s in st["shards"] if s["status"] == "failed"]
owners = [s.get("owner") for s in st["shards"] if s.get("owner")]
assert errs == [sys.argv[2]], errs
assert owners and all(o == sys.argv[3] for o in owners), owners
EOF
ok "status --json gives back the strings"

# ---- (c) esd: list and its log ----
# the processor: hostile lines on both streams, then the stand-in
cat >"$W/evil-dj" <<EOF
#!/bin/sh
printf 'out \\033]0;pwned\\007 \\033[2J\\033[1A\\r%s\\n' '$FORGED'
printf 'err \\302\\233 31m \\377 tab\\there\\n' >&2
exec "$MINI" "\$@"
EOF
chmod 755 "$W/evil-dj"
daemon_conf n1 processor="$W/evil-dj"
start_daemon n1
export ESD_SOCKET
ESD_SOCKET=$(dsock n1)
prepare_job "$OKJOB" 2
give_job "$OKJOB"
give_job "$EVIL"
run "$ESCTL" submit "$OKJOB"
check "submit of the good job" 0 "Submitted $OKJOB"
run "$ESCTL" submit "$EVIL"
clean "submit of the hostile job" "$W/stdout"
clean "submit of the hostile job (stderr)" "$W/stderr"
ok_done() { [ -e "$OKJOB/merge.json" ]; }
wait_for "the good job completes" 60 ok_done
run "$ESCTL" list
check "list" 0 "ok job é"
clean "list" "$W/stdout"
no_forged "list" "$W/stdout"
[ "$(grep -c . "$W/stdout")" -eq 3 ] || fail "list: a header and a line per job" "$OUT"
[[ $OUT == *"$EVIL_SHOWN"* ]] || fail "list shows the hostile job escaped" "$OUT"
ok "list: a header and a line per job, the hostile one escaped"
run "$ESCTL" status
check "esd's status" 0
clean "esd's status" "$W/stdout"
no_forged "esd's status" "$W/stdout"

grep -qF 'out \x1b]0;pwned\x07 \x1b[2J\x1b[1A\x0d'"$FORGED" "$W/n1/log" ||
    fail "esd logged the processor's line escaped" "$(tail -n 30 "$W/n1/log")"
grep -qF 'err \xc2\x9b 31m \xff tab\x09here' "$W/n1/log" ||
    fail "esd logged the processor's stderr line escaped" "$(tail -n 30 "$W/n1/log")"
ok "esd logged the processor's lines escaped"
grep -qF "job_id '$EVIL_SHOWN' is not allowed" "$W/n1/log" ||
    fail "esd logged the refusal of the hostile job, escaped" "$(tail -n 30 "$W/n1/log")"
ok "esd logged the refusal of the hostile job, escaped"
stop_daemon n1
[ "$DRC" -eq 0 ] || fail "esd stops with status 0" "status $DRC"
clean "esd's log" "$W/n1/log"
no_forged "esd's log" "$W/n1/log"
if LC_ALL=C grep -q -P '\t' "$W/n1/log"; then fail "esd's log has no raw tab"; fi
ok "esd's log has no raw tab"

# ---- (d) logs: raw when piped, escaped on a terminal ----
ID=$(py 'j["shards"][0]["id"]' "$OKJOB/manifest.json")
run "$ESCTL" logs --local "$OKJOB" --shard "$ID"
check "logs --shard piped" 0
grep -q "$ESC" "$W/stdout" || fail "logs piped: the raw bytes" "$OUT"
ok "logs piped: the raw bytes"
script -q -e -c "$(printf '%q ' "$ESCTL" logs --local "$OKJOB" --shard "$ID")" /dev/null \
    >"$W/tty.out" 2>&1 </dev/null || fail "logs on a terminal" "$(cat "$W/tty.out")"
tr -d '\r' <"$W/tty.out" >"$W/tty.txt"
clean "logs on a terminal" "$W/tty.txt"
grep -qF 'out \x1b]0;pwned\x07 \x1b[2J\x1b[1A\x0d' "$W/tty.txt" ||
    fail "logs on a terminal: escaped" "$(cat "$W/tty.txt")"
grep -qP 'tab\there' "$W/tty.txt" || fail "logs on a terminal: tabs kept" "$(cat "$W/tty.txt")"
[ "$(wc -l <"$W/tty.txt")" -eq "$(wc -l <"$W/stdout")" ] ||
    fail "logs on a terminal: the same lines" "$(wc -l <"$W/tty.txt") vs $(wc -l <"$W/stdout")"
ok "logs on a terminal: escaped, newlines and tabs kept"

summary
