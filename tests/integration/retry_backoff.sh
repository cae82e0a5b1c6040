#!/usr/bin/env bash
# retry_backoff: retries of a shard on one node back off (issue 15 item 9).
# One esd (the stand-in processor failing every attempt, MINI_DJ_EXIT=3),
# one job of one shard with --max-retries 3: the shard fails after 4
# attempts, and the idle gaps between one's end and the next's start grow as CLAIM_BACKOFF_BASE *
# 2^(n-1) (0.5, 1, 2 s, +-20 % jitter, common/claim.h): each at least
# 0.8 of its base, and esd's log says "retries back off".
set -euo pipefail
export LC_ALL=C
# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

new_workdir
unset_knobs
need_daemon_tools
text_dataset 50
prepare_job "$W/job" 1 --max-retries 3
give_job "$W/job"
daemon_conf n1
start_daemon n1 MINI_DJ_EXIT=3
run "$ESCTL" --socket "$(dsock n1)" submit "$W/job"
check "submit" 0 "Submitted $W/job"
failed() { [ "$(job_state n1 "$W/job")" = failed ]; }
wait_for "the shard fails after its retries" 60 failed
python3 - "$W/job" <<'PY' >"$W/gaps" || fail "attempt gaps grow" "$(cat "$W/gaps")"
import glob, json, sys
ats = sorted((a["started_at_epoch"], a["duration_secs"]) for a in
             (json.load(open(f)) for f in glob.glob(sys.argv[1] + "/attempts/*/*/attempt.json")))
starts = [s for s, _ in ats]
# from the end of one attempt to the start of the next
gaps = [b[0] - (a[0] + a[1]) for a, b in zip(ats, ats[1:])]
print("attempts", len(starts), "idle gaps", " ".join("%.2f" % g for g in gaps))
ok = len(starts) == 4 and all(g >= 0.8 * 0.5 * 2 ** k for k, g in enumerate(gaps))
sys.exit(0 if ok else 1)
PY
ok "4 attempts, the idle gaps between them back off: $(cat "$W/gaps")"
grep -q "retries back off" "$W/n1/log" || fail "esd logs the backoff" "$(tail -n 20 "$W/n1/log")"
ok "esd logs the backoff: $(grep -m1 "retries back off" "$W/n1/log")"
stop_daemon n1
[ "$DRC" -eq 0 ] || fail "esd exits 0" "status $DRC"
summary
