#!/usr/bin/env bash
# one_truth: every node reports the same counts for a job, read from the
# job directory (esd(8) "JOB VIEWS"), with real daemons and the test
# stand-in mini-dj (not Data-Juicer), ray.mode off. Two observer nodes o1
# and o2 each claim one shard whose attempt hangs (so they never claim
# again and their claimers learn nothing more) while a third node w works
# every other shard. Once the job directory holds N-2 done records and
# two live locks, the list, `status DIR --json` and the metrics file of o1,
# o2 and w all say done=N-2, failed=0, running=2, pending=0, say where
# the counts come from and how old the reading is; the text of `esctl
# list` and `esctl status DIR` shows the same figures.
#
# Environment: TOP, ESCTL, ESD (see lib.bash).
set -euo pipefail
export LC_ALL=C

# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

new_workdir
unset_knobs
need_daemon_tools

N=12
text_dataset $((N * 5))
prepare_job "$W/job" "$N"
give_job "$W/job"
for n in o1 o2 w; do
    daemon_conf "$n" metrics.path="$W/$n/esd.prom" metrics.interval_secs=1 lease_secs=4
done
start_daemon o1 MINI_DJ_SLEEP_MS=600000
start_daemon o2 MINI_DJ_SLEEP_MS=600000
spool_job "$W/job"
# shellcheck disable=SC2317 # called through wait_for
held() { [ "$(count "$W/job/state/locks")" -ge 2 ]; }
wait_for "the observers claim a shard each" 30 held
start_daemon w MINI_DJ_SLEEP_MS=20
# shellcheck disable=SC2317
worked() { [ "$(count "$W/job/state/done")" -eq $((N - 2)) ]; }
wait_for "w works every other shard" 60 worked
ok "w works the shards the observers do not hold"

# counts NODE: "done failed running pending" from its list, status and
# metrics, one line each
counts() {
    local s
    s=$(dsock "$1")
    "$ESCTL" --socket "$s" list --json >"$W/$1.list" 2>/dev/null || return 1
    "$ESCTL" --socket "$s" status --json "$W/job" >"$W/$1.status" 2>/dev/null || true
    python3 - "$W/$1.list" "$W/$1.status" "$W/$1/esd.prom" <<'PY'
import json, re, sys
li = json.load(open(sys.argv[1]))["jobs"][0]
st = json.load(open(sys.argv[2]))
prom = open(sys.argv[3]).read() if __import__("os").path.exists(sys.argv[3]) else ""
def m(state):
    x = re.search(r'esd_job_shards\{esd_job="%s",state="%s"\} (\d+)' % (li["key"], state), prom)
    return x.group(1) if x else "-"
print("list", li["done"], li["failed"], li.get("running", "-"), li.get("pending", "-"),
      li.get("counts_from"))
c = st.get("counts", {})
print("status", c.get("done"), c.get("failed"), c.get("running"), c.get("pending"),
      st.get("source"))
print("metrics", m("done"), m("failed"), m("running"), m("pending"), "job_dir")
PY
}
WANT="$((N - 2)) 0 2 0"
# shellcheck disable=SC2317
agree() {
    local n
    for n in o1 o2 w; do
        counts "$n" >"$W/$n.counts" || return 1
        [ "$(cut -d' ' -f2-5 "$W/$n.counts" | sort -u)" = "$WANT" ] || return 1
    done
}
agree_or_show() {
    agree && return 0
    for n in o1 o2 w; do echo "$n:"; cat "$W/$n.counts" 2>/dev/null; done
    return 1
}
wait_for "o1, o2 and w agree" 30 agree ||
    fail "the nodes report the job directory's counts" "$(agree_or_show)"
for n in o1 o2 w; do
    grep -q "^list .* job_dir$" "$W/$n.counts" ||
        fail "$n's list says its counts are the job directory's" "$(cat "$W/$n.counts")"
    grep -q "^status .* view$" "$W/$n.counts" ||
        fail "$n's status is answered from its view" "$(cat "$W/$n.counts")"
    py '"read_at" in j["jobs"][0] and j["jobs"][0]["read_age_secs"] >= 0' "$W/$n.list" | grep -q True ||
        fail "$n's list dates its reading" "$(cat "$W/$n.list")"
    grep -q 'esd_job_status_age_seconds{esd_job="' "$W/$n/esd.prom" ||
        fail "$n's metrics date the reading" "$(cat "$W/$n/esd.prom")"
done
ok "o1, o2 and w give the same counts in list, status and metrics: $WANT (done failed running pending)"

run "$ESCTL" --socket "$(dsock o1)" list
check "esctl list" 0 "$((N - 2))/$N"
run "$ESCTL" --socket "$(dsock o2)" status "$W/job"
check "esctl status DIR" 1 "$((N - 2)) of $N shards done"
[[ $OUT == *"running"* ]] || fail "esctl status lists the running shards" "$OUT"
ok "the texts of list and status show the same figures"
summary
