#!/usr/bin/env bash
# nfs_semantics: two daemons on one job directory seen through two paths,
# the real directory and a bindfs mount of it with bindfs's default
# caching (attributes and names cached for about a second: a stale view,
# as an NFS client has one), must never publish a shard twice nor merge
# wrongly.
#   (a) esctl fscheck on both paths at once: claims can be exclusive
#       (O_EXCL and link ok), and the bindfs side really is stale (a
#       change or an unlink seen late), which is what the rest relies on.
#   (b) daemon a works $W/real/job, daemon b $W/bind/job (the same job):
#       one done record per shard, exactly one attempt of each shard says
#       "done" and it is the one whose token the done record holds (a
#       double publication would show two), no lock left, one merge, and
#       the merged output equals the independent expectation; daemon a is
#       frozen (SIGSTOP) while it holds a claim until b has taken the
#       claim over through its stale view, then woken: its late result is
#       never published.
# Needs root, unshare(1), /dev/fuse and bindfs (skips with a notice
# otherwise); runs in a private mount namespace.
#
# Environment: TOP, ESCTL, ESD, TOOLS (see lib.bash).
set -euo pipefail
export LC_ALL=C

# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

if ! command -v bindfs >/dev/null || [ ! -c /dev/fuse ]; then
    skip "nfs_semantics needs bindfs and /dev/fuse (apt-get install bindfs)"
fi
in_mount_ns "the bindfs test" "$@"

new_workdir
unset_knobs
need_daemon_tools
mkdir -p "$W/real" "$W/bind"
bindfs -f "$W/real" "$W/bind" >"$W/bindfs.log" 2>&1 &
BINDFS=$!
trap 'fusermount -u "$W/bind" 2>/dev/null || umount -l "$W/bind" 2>/dev/null || true; cleanup' EXIT
mounted() { alive "$BINDFS" && mountpoint -q "$W/bind"; }
if ! { for _ in $(seq 50); do mounted && break; sleep 0.1; done; mounted; }; then
    echo "skip - bindfs does not mount here: $(cat "$W/bindfs.log")"
    exit 0
fi
ok "bindfs mounts $W/real on $W/bind"

# (a)
"$ESCTL" --json fscheck "$W/real" --nodes 2 --run nfs --wait-secs 20 >"$W/a.json" 2>"$W/a.err" &
pa=$!
"$ESCTL" --json fscheck "$W/bind" --nodes 2 --run nfs --wait-secs 20 >"$W/b.json" 2>"$W/b.err" &
pb=$!
ra=0 rb=0
wait "$pa" || ra=$?
wait "$pb" || rb=$?
{ [ "$ra" -eq 0 ] && [ "$rb" -eq 0 ]; } || fail "fscheck on both paths" "$ra $rb" "$(cat "$W/a.err" "$W/b.err")"
[ "$(py 'j["exclusive"] and j["o_excl"] == "ok" and j["link"] == "ok"' "$W/a.json")" = True ] ||
    fail "claims can be exclusive across the two paths" "$(cat "$W/a.json")"
ok "fscheck across the two paths: O_EXCL and link ok; flock: $(py 'j["flock"]' "$W/a.json")"
stale=$(py 'max(x if isinstance(x, (int, float)) else 99 for x in (j["attr_lag_secs"], j["unlink_lag_secs"]))' "$W/a.json")
python3 -c "import sys; sys.exit(not float(sys.argv[1]) > 0.1)" "$stale" ||
    fail "the bindfs view is stale" "$(cat "$W/a.json")"
ok "the bindfs view is stale (attribute lag $(py 'j["attr_lag_secs"]' "$W/a.json") s, unlink lag $(py 'j["unlink_lag_secs"]' "$W/a.json") s)"

# (b)
NSHARDS=24
text_dataset 600
prepare_job "$W/real/job" "$NSHARDS"
give_job "$W/real/job"
chmod 755 "$W/real"
daemon_conf a spool_dir="$W/spool-a"
daemon_conf b spool_dir="$W/spool-b"
# 25 rows of 40 ms: a second a shard, so that a can be frozen mid-attempt
start_daemon a MINI_DJ_SLEEP_MS=40
start_daemon b MINI_DJ_SLEEP_MS=40
"$ESCTL" --socket "$(dsock a)" submit "$W/real/job" >"$W/submit-a" 2>&1 || fail "submit to a" "$(cat "$W/submit-a")"
"$ESCTL" --socket "$(dsock b)" submit "$W/bind/job" >"$W/submit-b" 2>&1 || fail "submit to b" "$(cat "$W/submit-b")"
ok "daemon a works $W/real/job, daemon b $W/bind/job"
# a frozen while it holds a claim (its attempt runs on and ends): b takes
# the claim over through its stale view; a, woken, must not publish
a_holds() { grep -ls '"node": *"a"' "$W/real/job/state/locks/"*.lock >/dev/null 2>&1; }
wait_for "a holds a claim" 20 a_holds
kill -STOP "${DPID[a]}"
taken() { [ "$(count "$W/real/job/state/stale_locks")" -ge 1 ]; }
wait_for "b takes a frozen claim of a over" 20 taken
kill -CONT "${DPID[a]}"
ok "b took over a claim of the frozen a ($(count "$W/real/job/state/stale_locks")); a woken"
finalized() {
    [ -e "$W/real/job/state/esd/finalize.json" ] &&
        [ "$(py 'j["status"]' "$W/real/job/state/esd/finalize.json")" = complete ]
}
wait_for "the job is merged" 50 finalized
ok "the job is merged"
split=$(python3 - "$W/real/job" <<'EOF'
import json, os, sys
job = sys.argv[1]
ids = [s["id"] for s in json.load(open(os.path.join(job, "manifest.json")))["shards"]]
done = sorted(f[:-5] for f in os.listdir(os.path.join(job, "state/done")))
assert done == sorted(ids), "done records %d, shards %d" % (len(done), len(ids))
nodes, late = {}, 0
for i in ids:
    d = json.load(open(os.path.join(job, "state/done", i + ".json")))
    says_done = []
    for a in os.listdir(os.path.join(job, "attempts", i)):
        p = os.path.join(job, "attempts", i, a, "attempt.json")
        st = json.load(open(p)).get("status") if os.path.exists(p) else None
        if st == "done":
            says_done.append(a)
        late += st in ("stale", "lost")
    assert len(says_done) == 1, (i, "attempts saying done", says_done)
    assert says_done[0].endswith("-" + d["token"]), (i, says_done, d["token"])
    nodes[d["node"]] = nodes.get(d["node"], 0) + 1
assert late >= 1, "the attempt taken over from a is not recorded as stale or lost"
print(" ".join("%s:%d" % kv for kv in sorted(nodes.items())))
EOF
) || fail "exactly one publication per shard"
ok "one done record per shard, exactly one attempt says done and holds its token, the taken-over one stale (shards per node: $split)"
[ "$(count "$W/real/job/state/locks")" -eq 0 ] || fail "no lock left" "$(ls "$W/real/job/state/locks")"
ok "no lock left"
out=$(py 'j["output_path"]' "$W/real/job/state/esd/finalize.json")
out=${out/#$W\/bind\//$W/real/}
expect_merged "$W/real/job" "$W/expected-merged.jsonl" || fail "the expected merge"
cmp "$out" "$W/expected-merged.jsonl" || fail "the merged output equals the expectation"
ok "one merge ($(py 'j["node"]' "$W/real/job/state/esd/finalize.json")), equal to the independent expectation ($(wc -l <"$out") rows)"
[ "$(grep -c "merging into" "$W/a/log" "$W/b/log" | awk -F: '{s += $2} END {print s}')" -eq 1 ] ||
    fail "exactly one node merged" "$(grep "merging into" "$W/a/log" "$W/b/log")"
ok "exactly one node merged"
stop_daemon a
stop_daemon b
summary
