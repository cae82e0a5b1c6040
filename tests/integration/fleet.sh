#!/usr/bin/env bash
# fleet: bench/fleet's fleet run as a check. ESD_FLEET_NODES (8) daemons
# on one job of ESD_FLEET_SHARDS (2000) shards of ESD_FLEET_ROWS (1) rows
# (the stand-in mini-dj, ray.mode off, esd.yaml's defaults otherwise),
# without the idle windows, without waiting for every node to say
# complete and with a latency sample a second only (CI time):
#   (a) the run ends within its deadline with a merged output;
#   (b) exactly-once: every shard has exactly one done record (status
#       done), the merged output holds every kept input row once and
#       equals lib.bash's expect_merged;
#   (c) the wasted claims (lock creations in state/locks that did not
#       become an attempt, counted with fanotify or inotify) are printed,
#       fleet-wide and per node, and there must be none but races (issue
#       12: a shard done elsewhere is passed with a stat, never a lock
#       creation; see below; ESD_FLEET_STRICT=0 only prints them).
# The merge start, the status latencies and RSS are printed, not asserted
# (bench/fleet and `make bench` judge them).
#
# Environment: TOP, ESCTL, ESD, TOOLS (see lib.bash), the ESD_FLEET_* above.
set -euo pipefail
export LC_ALL=C

# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

new_workdir
unset_knobs
need_daemon_tools

run env TOP="$TOP" ESD="$ESD" ESCTL="$ESCTL" TOOLS="$TOOLS" FLEET_IDLE_SECS=0 \
    FLEET_LEARN_SECS=0 FLEET_ROWS="${ESD_FLEET_ROWS:-1}" FLEET_SAMPLE_PAUSE=1 FLEET_RESULT="$W/result.json" \
    BENCH_STRICT= bash "$TOP/bench/fleet" "${ESD_FLEET_NODES:-8}" "${ESD_FLEET_SHARDS:-2000}"
printf '%s\n' "$OUT" | sed 's/^/# /'
[ -s "$W/result.json" ] || fail "the fleet run ends with a merged output" "exit status $RC" \
    "$(printf '%s\n' "$OUT" "$ERR" | tail -n 20)"
ok "the fleet run of $(py '"%d daemons x %d shards" % (j["nodes"], j["shards"])' "$W/result.json") ends with a merged output"
[ "$(py 'j["exactly_once"]' "$W/result.json")" = True ] ||
    fail "exactly-once" "$(py '"; ".join(j["problems"])' "$W/result.json")"
[ "$RC" -eq 0 ] || fail "bench fleet exits 0" "exit status $RC" "$ERR"
ok "exactly-once: one done record a shard, every kept row merged once, the expected merge"
WASTED=$(py 'j["wasted_total"]' "$W/result.json")
PER_NODE=$(py '" ".join("%s:%s" % (n, v["wasted"]) for n, v in j["per_node"].items())' "$W/result.json")
echo "# wasted claims: $WASTED fleet-wide (per node: $PER_NODE; backend $(py 'j["backend"]' "$W/result.json"))"
# The one waste left is a race, not a cost of the fleet's size: another
# node publishes a shard and drops its lock between this node's stat of the
# done record and its O_EXCL create (2 of 10,000 at 32 daemons on 2 cores,
# 0 in every 8 x 2,000 run). One in 1,000 shards is allowed for it; the
# old cost was N*(W-1), 14,000 here.
if [ "${ESD_FLEET_STRICT:-1}" = 1 ]; then
    allowed=$(( ${ESD_FLEET_SHARDS:-2000} / 1000 ))
    [ "$WASTED" -le "$allowed" ] ||
        fail "no wasted claims (at most $allowed lost to races)" "$WASTED lock creations did not become an attempt"
    ok "no wasted claims ($WASTED lost to races; at most $allowed allowed)"
fi
summary
