#!/usr/bin/env bash
# nodes: esctl nodes, the fleet as every node sees it through the status
# files on the shared spool (<spool_dir>/nodes/<node>.json). Three real
# esd daemons a, b, c (ray.mode off) share one spool; node_status_interval
# 1 s, lease 3 s; the processor is the stand-in mini-dj (not Data-Juicer),
# told to hang, so that each busy slot keeps its shard.
#   (a) b is drained before a 2-shard job is submitted everywhere: on every
#       node, esctl nodes lists a, b and c; a and c busy 1/1 with a shard
#       each (job, shard, attempt), b drained with the reason (esctl drain
#       by uid ...); the versions of esd, Data-Juicer and the Ray state are
#       there; the human table has one line per node.
#   (b) garbage in the nodes directory (not JSON, a FIFO, a symbolic link,
#       a file too large, a file owned by another user, a file whose node
#       is not its name, a name that is no node name) is reported as
#       invalid, each with why; nothing blocks; no node is added or
#       changed by them.
#   (c) c is SIGKILLed: a shows it down with the shard it was running;
#       once b is resumed and takes the shard over (its lease ran out), a
#       shows that shard taken over by b.
#   (d) a restarted removes the temporary file a crash in the middle of
#       one of its writes left behind; a stops cleanly: b shows it
#       stopped, not down, even once its file is older than three
#       intervals.
#   (e) a daemon d without spool_dir, given the job: esctl nodes on d
#       shows d itself and b, known from the job's lock only.
#
# Environment: TOP, ESCTL, ESD, TOOLS (see lib.bash).
set -euo pipefail
export LC_ALL=C

# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

new_workdir
unset_knobs
need_daemon_tools
text_dataset 40

for n in a b c; do
    daemon_conf "$n" node_status_interval_secs=1 drain_timeout_secs=0 claim_ahead=false
    MINI_DJ_HANG=1 start_daemon "$n"
done
"$ESCTL" --socket "$(dsock b)" drain >"$W/drain.out" 2>&1 || fail "drain b" "$(cat "$W/drain.out")"

J=$W/job
prepare_job "$J" 2
give_job "$J"
"$ESCTL" --socket "$(dsock a)" submit --everywhere "$J" >"$W/submit.out" 2>&1 ||
    fail "submit --everywhere" "$(cat "$W/submit.out")"

# nodes_py NODE EXPR: EXPR on NODE's esctl nodes --json, with n["x"] the
# entry of node x, r the whole result; prints the value.
nodes_py() {
    "$ESCTL" --json --socket "$(dsock "$1")" nodes >"$W/$1.nodes" 2>"$W/$1.nodes.err" || return 1
    python3 - "$W/$1.nodes" "$2" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
n = {x["node"]: x for x in r["nodes"]}
print(eval("(" + sys.argv[2] + ")"))
EOF
}
# nodes_true NODE EXPR: EXPR holds on NODE's view.
nodes_true() { [ "$(nodes_py "$1" "$2" 2>/dev/null)" = True ]; }

# (a)
SEEN='sorted(n) == ["a", "b", "c"] and
  n["a"]["state"] == "running" and n["a"]["busy"] == 1 and n["a"]["slots"] == 1 and
  n["c"]["state"] == "running" and n["c"]["busy"] == 1 and
  len(n["a"]["attempts"]) == 1 and len(n["c"]["attempts"]) == 1 and
  n["a"]["attempts"][0]["shard_id"] != n["c"]["attempts"][0]["shard_id"] and
  all(x["attempts"][0]["job_dir"] == "'"$J"'" and x["attempts"][0]["attempt"] == 1
      for x in (n["a"], n["c"])) and
  n["b"]["state"] == "drained" and n["b"]["busy"] == 0 and
  "esctl drain by uid" in n["b"]["reason"] and
  all(x["esd_version"] and x["data_juicer"]["version"] and x["ray"]["state"] == "off"
      for x in n.values())'
for n in a b c; do
    wait_for "esctl nodes on $n shows a and c busy and b drained" 20 nodes_true "$n" "$SEEN"
done
ok "on every node esctl nodes lists a, c busy with a shard each, b drained (esctl drain)"
CSHARD=$(nodes_py a 'n["c"]["attempts"][0]["shard_id"]')
ID=$(py 'j["job_id"]' "$J/manifest.json")
for n in a b c; do
    "$ESCTL" --socket "$(dsock "$n")" nodes >"$W/$n.table" 2>&1 || fail "esctl nodes on $n" "$(cat "$W/$n.table")"
    grep -q '^NODE  *STATE  *AGE  *SLOTS  *RUNNING' "$W/$n.table" || fail "a header" "$(cat "$W/$n.table")"
    grep -q "^$n\\*  *running\\|^$n\\*  *drained" "$W/$n.table" || fail "$n marks itself" "$(cat "$W/$n.table")"
    grep -Eq "^c\\*? +running +[^ ]+ +1/1 +$ID $CSHARD#1 " "$W/$n.table" ||
        fail "$n's table shows c's shard" "$(cat "$W/$n.table")"
    grep -Eq '^b\*? +drained +[^ ]+ +0/1 +- ' "$W/$n.table" || fail "$n's table shows b drained" "$(cat "$W/$n.table")"
    grep -q '^b: drained: esctl drain by uid' "$W/$n.table" || fail "$n says why b is drained" "$(cat "$W/$n.table")"
done
ok "the table on every node: one line per node, c running $CSHARD, b drained and why"

# (b) garbage
ND=$W/spool/nodes
printf 'not json {' >"$ND/bogus.json"
mkfifo "$ND/fifo.json"
ln -s /etc/passwd "$ND/link.json"
head -c 100000 /dev/zero | tr '\0' ' ' >"$ND/huge.json"
python3 - "$ND" <<'EOF'
import json, sys
d = sys.argv[1]
a = json.load(open(d + "/a.json"))
a["node"] = "a"
json.dump(a, open(d + "/y.json", "w"))          # names a, is y
a["node"] = "x"
json.dump(a, open(d + "/x.json", "w"))          # owned by someone else
open(d + "/bad name!.json", "w").write("{}")
EOF
chown nobody "$ND/x.json"
BAD='sorted(x["file"] for x in r["invalid"]) ==
  ["bad name!.json", "bogus.json", "fifo.json", "huge.json", "link.json", "x.json", "y.json"] and
  sorted(n) == ["a", "b", "c"] and n["c"]["state"] == "running" and
  n["a"]["hostname"] == n["b"]["hostname"]'
run timeout 10 "$ESCTL" --json --socket "$(dsock b)" nodes
check "esctl nodes with garbage in the nodes directory" 0
nodes_true b "$BAD" || fail "the garbage is reported, nothing else changes" "$(cat "$W/b.nodes")"
WHY=$(nodes_py b '"|".join(x["error"] for x in sorted(r["invalid"], key=lambda x: x["file"]))')
for want in "not .*node name" "JSON" "regular file" "bytes\|large\|big" "symbolic link\|link" \
    "belongs to uid" "\"node\" is not \"y\""; do
    grep -qi -- "$want" <<<"$WHY" || fail "the reasons say \"$want\"" "$WHY"
done
"$ESCTL" --socket "$(dsock b)" nodes >"$W/b.table" 2>&1 || fail "esctl nodes on b" "$(cat "$W/b.table")"
[ "$(grep -c '^invalid: ' "$W/b.table")" -eq 7 ] || fail "7 invalid lines" "$(cat "$W/b.table")"
ok "garbage node files are reported with why (not JSON, FIFO, link, too large, foreign owner, wrong node, bad name) and change nothing"

# (c) c dies
kill -KILL "${DPID[c]}"
DOWN='n["c"]["state"] == "down" and n["c"]["attempts"][0]["shard_id"] == "'"$CSHARD"'"'
wait_for "a shows c down with its shard" 20 nodes_true a "$DOWN"
ok "a shows c down, with the shard it was running ($CSHARD)"
# a temporary file of a write of a that a crash left behind
touch "$W/spool/nodes/.a.json.0123456789abcdef0123456789abcdef.tmp"
"$ESCTL" --socket "$(dsock b)" resume >"$W/resume.out" 2>&1 || fail "resume b" "$(cat "$W/resume.out")"
TAKEN='n["c"]["state"] == "down" and n["c"]["attempts"][0].get("taken_over") is True and
  n["c"]["attempts"][0]["by"] == "b" and n["c"]["taken_over"] == 1 and
  n["b"]["attempts"][0]["shard_id"] == "'"$CSHARD"'"'
wait_for "a shows c's shard taken over by b" 30 nodes_true a "$TAKEN"
"$ESCTL" --socket "$(dsock a)" nodes >"$W/a.table" 2>&1 || fail "esctl nodes on a" "$(cat "$W/a.table")"
grep -q "^c: down: its status file is [0-9.]*s old" "$W/a.table" &&
    grep -q "^  c was running $ID $CSHARD#1: now running on b (taken over)$" "$W/a.table" ||
    fail "a's table says c is down and b took its shard over" "$(cat "$W/a.table")"
ok "a shows c down and its shard taken over by b"

# (d) a clean stop, and a start that sweeps its leftover temporary file
stop_daemon a
[ "$DRC" -eq 0 ] || fail "esd a stops with status 0" "status $DRC"
MINI_DJ_HANG=1 start_daemon a
wait_for "a's leftover temporary file is removed at its start" 10 \
    test ! -e "$W/spool/nodes/.a.json.0123456789abcdef0123456789abcdef.tmp"
stop_daemon a
[ "$DRC" -eq 0 ] || fail "esd a stops with status 0" "status $DRC"
OLD='n["a"]["state"] == "stopped" and n["a"]["age_secs"] > 4 and n["a"]["busy"] == 0'
wait_for "b shows a stopped, its file older than three intervals" 20 nodes_true b "$OLD"
ok "a stopped cleanly shows as stopped, not down"

# (e) without a spool: the nodes the job's locks name
daemon_conf d drain_timeout_secs=0 claim_ahead=false
sed -i '/^spool_dir:/d' "$W/d/esd.yaml"
MINI_DJ_HANG=1 start_daemon d
"$ESCTL" --socket "$(dsock d)" submit "$J" >"$W/submit-d.out" 2>&1 || fail "submit on d" "$(cat "$W/submit-d.out")"
NOSPOOL='"dir" not in r and n["d"].get("self") is True and
  n["b"]["source"] == "jobs" and n["b"]["state"] == "unknown" and n["b"]["locks"]["running"] == 1'
wait_for "d, without a spool, shows b from the job's locks" 20 nodes_true d "$NOSPOOL"
"$ESCTL" --socket "$(dsock d)" nodes >"$W/d.table" 2>&1 || fail "esctl nodes on d" "$(cat "$W/d.table")"
grep -q '^b: no status file; named by the jobs' "$W/d.table" && grep -q 'no spool_dir here' "$W/d.table" ||
    fail "d's table says b is known from the jobs only" "$(cat "$W/d.table")"
ok "a node without a spool_dir shows itself and the nodes its job's locks name"
stop_daemon d
stop_daemon b
summary
