#!/usr/bin/env bash
# daemons: real esd daemons, one per simulated node (own config, node name,
# socket and state dir), sharing job directories through a spool
# directory, with the test stand-in mini-dj (tests/tools/mini-dj.c, not
# Data-Juicer) as processor and ray.mode off.
#   (a) two daemons (a: 1 slot, b: 2 slots) finish a 40-shard job
#       registered in the spool: one done record per shard with attempt
#       number 1 and a node among a and b, both nodes did shards, no lock
#       left, (run as root) every file and directory in the job directory
#       belongs to its owner (nobody), as esd works there as the owner, exactly one node merged (state/esd/finalize.json names it,
#       the other logged that another node merges or has merged), the merged output
#       equals the independent expectation (lib.bash's expect_merged), and
#       both daemons report the job complete with their shard counts
#       adding up to 40.
#   (b) two more daemons (c, d) join; a second 40-shard job with its own
#       output path is finished by the four, every node doing shards.
#   (c) bad registrations in the spool (not JSON, a relative job_dir, a
#       directory that is not a prepared job) are logged with their file
#       name and the daemon goes on, each once, not at every rescan; the
#       one that is not a job is retried and worked once it has been
#       prepared.
#   (d) all four stop on SIGTERM with status 0; restarted, a daemon
#       remembers both jobs as complete and merges nothing again.
#   (e) a registration written on this node (temporary file renamed into
#       the spool) is seen at once (inotify), not at the next rescan: a
#       daemon with poll_interval_secs 3600 works a new job.
#
# Environment: TOP, ESCTL, ESD (esd binary; default $TOP/esd), TOOLS (see
# lib.bash).
set -euo pipefail
export LC_ALL=C

# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

NSHARDS=40

new_workdir
unset_knobs
need_daemon_tools

# 25 rows a shard, 10 ms a row: a quarter of a second a shard, so that
# several daemons work at once.
export MINI_DJ_SLEEP_MS=10
text_dataset 1000

# finalized JOB: the job's merge record says it is complete.
finalized() {
    [ -e "$1/state/esd/finalize.json" ] && [ "$(py 'j["status"]' "$1/state/esd/finalize.json")" = complete ]
}
complete_on() { [ "$(job_state "$1" "$2")" = complete ]; }

# check_run JOB OUTPUT NODE...: done records, locks, the merge and what
# every node reports, for a job finished by NODEs.
check_run() {
    local job=$1 out=$2 n merger
    shift 2
    split=$(python3 - "$job" "$@" <<'EOF'
import json, os, sys
job, nodes = sys.argv[1], sys.argv[2:]
ids = [s["id"] for s in json.load(open(os.path.join(job, "manifest.json")))["shards"]]
done = sorted(f[:-5] for f in os.listdir(os.path.join(job, "state/done")))
assert done == sorted(ids), "done records %d, shards %d" % (len(done), len(ids))
count = {}
for i in ids:
    d = json.load(open(os.path.join(job, "state/done", i + ".json")))
    assert d["status"] == "done" and d["shard_id"] == i, i
    assert d["node"] in nodes, (i, d["node"])
    assert d["attempt_number"] == 1, (i, d["attempt_number"])
    assert len(os.listdir(os.path.join(job, "attempts", i))) == 1, i
    count[d["node"]] = count.get(d["node"], 0) + 1
print(" ".join("%s:%d" % kv for kv in sorted(count.items())))
EOF
    ) || fail "one done record per shard of $job, attempt 1, node among $*"
    ok "one done record per shard, attempt 1, one attempt dir each (shards per node: $split)"
    for n in "$@"; do
        [[ " $split" == *" $n:"* ]] || fail "node $n did shards of $job" "$split"
    done
    ok "every node ($*) did shards"
    [ "$(count "$job/state/locks")" -eq 0 ] || fail "no lock left" "$(ls "$job/state/locks")"
    [ "$(count "$job/state/stale_locks")" -eq 0 ] || fail "no takeover" "$(ls "$job/state/stale_locks")"
    ok "no lock left, none taken over"
    if [ "$(id -u)" -eq 0 ]; then
        local foreign
        foreign=$(not_owned_by nobody "$job")
        [ -z "$foreign" ] || fail "everything in $job is nobody's" "$foreign"
        ok "every file esd (root) made in the job directory is the owner's (nobody's)"
    fi
    merger=$(py 'j["node"]' "$job/state/esd/finalize.json")
    [ "$(py 'j["output_path"]' "$job/state/esd/finalize.json")" = "$out" ] ||
        fail "finalize.json names the output" "$(cat "$job/state/esd/finalize.json")"
    [ "$(py 'j["num_shards"]' "$job/state/esd/finalize.json")" -eq "$NSHARDS" ] ||
        fail "finalize.json counts the shards" "$(cat "$job/state/esd/finalize.json")"
    ok "node $merger merged into $out"
    expect_merged "$job" "$W/expected-merged.jsonl" || fail "the expected merge of $job"
    cmp "$out" "$W/expected-merged.jsonl" || fail "the merged output of $job equals the expectation"
    ok "the merged output equals the independent expectation ($(wc -l <"$out") rows)"
    [ "$(py 'j["rows"]' "$job/state/esd/finalize.json")" -eq "$(wc -l <"$out")" ] ||
        fail "finalize.json counts the rows"
    local total=0 here
    for n in "$@"; do
        wait_for "node $n reports $job complete" 20 complete_on "$n" "$job"
        here=$(py "[x['done_here'] for x in j['jobs'] if x['job_dir'] == '$job'][0]" "$W/$n/status.json")
        total=$((total + here))
        if [ "$n" = "$merger" ]; then
            grep -q "merging into $out" "$W/$n/log" || fail "$n logged its merge"
        else
            grep -qE "another node merges|merged [0-9]+ rows into $out \(by node $merger\)" "$W/$n/log" ||
                fail "$n logged that another node merges" "$(grep -v 'debug:' "$W/$n/log" | tail -n 5)"
            ! grep -q "merging into $out" "$W/$n/log" || fail "$n did not merge $job too"
        fi
    done
    [ "$total" -eq "$NSHARDS" ] || fail "the nodes' done_here add up to $NSHARDS" "$total"
    ok "every node reports the job complete; their done_here add up to $NSHARDS; one merge"
}

# ---- (a) two daemons ----
daemon_conf a slots=1
daemon_conf b slots=2
start_daemon a
start_daemon b
ok "daemons a and b answer ping"
JA="$W/job-a"
prepare_job "$JA" "$NSHARDS"
give_job "$JA"
spool_job "$JA"
wait_for "job a is merged" 60 finalized "$JA"
ok "job a finished and merged"
check_run "$JA" "$JA/merged.jsonl" a b

# ---- (b) four daemons, an output of its own ----
daemon_conf c slots=1
daemon_conf d slots=1
start_daemon c
start_daemon d
ok "daemons c and d answer ping"
JB="$W/job-b"
prepare_job "$JB" "$NSHARDS"
give_job "$JB"
# (an output inside the job directory: esd merges nowhere else)
spool_job "$JB" "$JB/out/b.jsonl"
wait_for "job b is merged" 60 finalized "$JB"
ok "job b finished and merged"
check_run "$JB" "$JB/out/b.jsonl" a b c d
[ "$(job_state c "$JA")" = complete ] || fail "c adopted job a (complete) from the spool"
ok "c and d adopted the finished job a as complete"

# ---- (c) bad registrations ----
printf '{"job_dir": ' >"$W/spool/broken.json"
printf '{"job_dir": "relative/dir"}\n' >"$W/spool/relative.json"
JC="$W/job-c"
mkdir -p "$JC"
give_job "$JC"
spool_job "$JC"
wait_for "a logs the broken registration" 20 grep -q "spool/broken.json" "$W/a/log"
grep "spool/broken.json" "$W/a/log" | grep -q "ignoring" || fail "the broken file is ignored"
wait_for "a logs the relative job_dir" 20 grep -q "relative.json: job_dir must be an absolute path" "$W/a/log"
wait_for "a says why job c cannot be worked" 20 grep -q "$JC.*manifest.json" "$W/a/log"
daemon_up a
ok "bad registrations are logged with their file and the daemon goes on"
rm -rf "$JC"
prepare_job "$JC" "$NSHARDS"
give_job "$JC"
wait_for "job c is merged once prepared" 90 finalized "$JC"
ok "job c, prepared after its registration, was worked and merged"
[ "$(grep -c "spool/broken.json" "$W/a/log")" -eq 1 ] ||
    fail "the broken registration is logged once, not at every rescan" \
        "$(grep "spool/broken.json" "$W/a/log")"
ok "the broken registration was logged once over the rescans since"
rm -f "$W/spool/broken.json" "$W/spool/relative.json"

# ---- (d) stop and restart ----
for n in a b c d; do
    stop_daemon "$n"
    [ "$DRC" -eq 0 ] || fail "esd $n exits 0 on SIGTERM" "status $DRC" "$(tail -n 5 "$W/$n/log")"
done
ok "all four exit 0 on SIGTERM"
before=$(stat -c %Y.%i "$JA/merged.jsonl" "$JB/out/b.jsonl")
start_daemon a
for job in "$JA" "$JB" "$JC"; do
    [ "$(job_state a "$job")" = complete ] || fail "a remembers $job complete" "$(job_state a "$job")"
done
ok "restarted, a remembers the three jobs as complete"
[ "$(stat -c %Y.%i "$JA/merged.jsonl" "$JB/out/b.jsonl")" = "$before" ] || fail "nothing merged again"
ok "nothing was merged again"
stop_daemon a
[ "$DRC" -eq 0 ] || fail "esd a exits 0"

# ---- (e) a local registration is seen at once ----
daemon_conf e poll_interval_secs=3600
start_daemon e
JE="$W/job-e"
prepare_job "$JE" 4
give_job "$JE"
spool_job "$JE"
wait_for "e works the new job without waiting for a rescan" 20 finalized "$JE"
ok "a registration renamed into the spool was seen at once (poll_interval_secs 3600)"
stop_daemon e
summary
