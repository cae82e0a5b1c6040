#!/usr/bin/env bash
# metrics: esd's Prometheus textfile-collector file (metrics.path), with a
# real esd and the test stand-in mini-dj (not Data-Juicer), ray.mode off.
#   (a) metrics.path in a directory that does not exist: one warning in the
#       log, not one per interval; once the directory exists the file
#       appears and the log says so.
#   (b) after a 6-shard job (one shard failing once with a processor
#       error, so that a failure is counted), the file parses as the text
#       exposition format (a strict checker here, and prometheus_client's
#       parser when the real-stack venv has it), and says: 6 shards done
#       and 0 remaining for the job, the job complete, 7 attempts (6 done,
#       1 failed, class processor), the rows of the job, a histogram whose
#       +Inf bucket equals its count, no temporary file left beside it.
#       A job's series carry esd_job=<registration key> (never "job",
#       which Prometheus sets itself), esd_job_info joins the key to the
#       job's id and directory, and esd_job_attempts_failed_total counts
#       the job's failed attempt by class.
#   (c) the file is rewritten: esd_attempts_running follows a hanging
#       attempt (1 while it runs) and the job's remaining shards.
#   (d) the labels survive a restart (the first file after it names both
#       jobs as before, loaded or not), and a job that leaves the registry
#       leaves the file: after its registration is removed and esd
#       restarted, no series names it, the other job's remain.
#   (e) the default, metrics.path auto: no file while node_exporter's
#       textfile directory (/var/lib/prometheus/node-exporter) is missing,
#       esd.prom there once it exists (as root, made here and removed
#       after, when the machine has none); off: none either way.
#
# Environment: TOP, ESCTL, ESD (see lib.bash).
set -euo pipefail
export LC_ALL=C

# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

new_workdir
unset_knobs
need_daemon_tools

text_dataset 120
PROM=$W/textfile/esd.prom

# (a) the directory is missing at first
# (a stop does not wait for the hanging attempts below)
daemon_conf m metrics.path="$PROM" metrics.interval_secs=1 drain_timeout_secs=1 attempt_kill_grace_secs=1
MINI_DJ_EXIT=2 MINI_DJ_ONLY=part-00002 MINI_DJ_FAIL_ONCE=$W/once start_daemon m
mkdir -p "$W/once" && chmod 777 "$W/once"
warned() { grep -q "metrics: .*$PROM" "$W/m/log"; }
wait_for "a failed metrics write is logged" 10 warned
# (let two more intervals pass: a negative check needs time to pass)
sleep 2.5
n=$(grep -c "metrics: .*$PROM" "$W/m/log" || true)
[ "$n" -eq 1 ] || fail "the failed write is logged once" "$n lines" "$(grep metrics "$W/m/log")"
ok "a metrics path in a missing directory is logged once, not every interval"
mkdir -p "$W/textfile"
wait_for "the metrics file appears once its directory exists" 10 test -s "$PROM"
grep -q "metrics: writing $PROM again" "$W/m/log" || fail "the log says the metrics are written again"
ok "the metrics file appears once its directory exists, and the log says so"

# (b) a job
JOB=$W/job
prepare_job "$JOB" 6
give_job "$JOB"
"$ESCTL" --socket "$(dsock m)" submit "$JOB" >"$W/submit.out" 2>&1 || fail "submit" "$(cat "$W/submit.out")"
ID=$(py 'j["job_id"]' "$JOB/manifest.json")
# key JOB: its registration key (the label esd_job)
key() {
    "$ESCTL" --json --socket "$(dsock m)" list | python3 -c '
import json, sys
print([x["key"] for x in json.load(sys.stdin)["jobs"] if x["job_dir"] == sys.argv[1]][0])' "$1"
}
KEY=$(key "$JOB")
done_in_file() { grep -q "^esd_job_shards{esd_job=\"$KEY\",state=\"done\"} 6$" "$PROM" &&
    grep -q "^esd_job_state{esd_job=\"$KEY\",state=\"complete\"} 1$" "$PROM"; }
wait_for "the metrics file shows the job complete" 60 done_in_file
ok "the metrics say 6 shards done and the job complete"

ROWS=$(python3 -c '
import json, sys
m = json.load(open(sys.argv[1]))
print(sum(s["rows"] for s in m["shards"]))' "$JOB/manifest.json")
KEPT=$(grep -c 1 "$W/kept.txt")
python3 - "$PROM" "$KEY" "$KEPT" "$ID" "$JOB" <<'PYEOF' || fail "the metrics file is well-formed and right" "$(cat "$PROM")"
import re, sys
path, job, kept, job_id, job_dir = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
text = open(path).read()
assert text.endswith("\n"), "ends with a newline"
samples, types, helped = {}, {}, set()
name_re = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
label_re = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\["\\n])*"'
sample_re = re.compile(r"^(%s)(\{%s(?:,%s)*\})? (-?[0-9.e+]+|\+Inf|NaN)$" % (name_re, label_re, label_re))
for line in text.splitlines():
    if line.startswith("# HELP "):
        helped.add(line.split()[2]); continue
    if line.startswith("# TYPE "):
        _, _, name, typ = line.split()
        assert typ in ("gauge", "counter", "histogram"), line
        assert name not in types, "one TYPE per family: " + name
        types[name] = typ; continue
    m = sample_re.match(line)
    assert m, "not a sample line: %r" % line
    name, labels, value = m.group(1), m.group(2) or "", m.group(3)
    family = re.sub(r"_(bucket|sum|count)$", "", name) if name not in types else name
    assert family in types and family in helped, "sample before its TYPE/HELP: " + line
    assert (name, labels) not in samples, "duplicate sample " + line
    samples[(name, labels)] = float(value)
def get(name, labels=""):
    return samples[(name, labels)]
assert not any(re.search(r'[{,]job=', l) for (n, l) in samples), "no label named job"
j = '{esd_job="%s",' % job
assert get("esd_job_info", j + 'job_id="%s",job_dir="%s"}' % (job_id, job_dir)) == 1
assert get("esd_job_attempts_failed_total", j + 'class="processor"}') == 1
assert get("esd_job_attempts_failed_total", j + 'class="output"}') == 0
assert get("esd_job_shards", j + 'state="done"}') == 6
assert get("esd_job_shards", j + 'state="failed"}') == 0
assert get("esd_job_shards", j + 'state="remaining"}') == 0
assert get("esd_job_shards_done_here_total", '{esd_job="%s"}' % job) == 6
assert get("esd_job_rows_done_here_total", '{esd_job="%s"}' % job) == kept, kept
assert get("esd_rows_done_total") == kept
assert get("esd_bytes_done_total") > 0
assert get("esd_attempts_total", '{outcome="done"}') == 6
assert get("esd_attempts_total", '{outcome="failed"}') == 1
assert get("esd_attempt_failures_total", '{class="processor"}') == 1
assert get("esd_attempt_failures_total", '{class="output"}') == 0
assert get("esd_attempt_duration_seconds_count") == 7
assert get("esd_attempt_duration_seconds_bucket", '{le="+Inf"}') == 7
b = [v for (n, l), v in samples.items() if n == "esd_attempt_duration_seconds_bucket"]
assert b == sorted(b), "buckets are cumulative"
assert get("esd_ray_head_restarts_total") == 0
assert get("esd_lease_takeovers_total") == 0
assert get("esd_attempts_running") == 0
assert types["esd_attempt_duration_seconds"] == "histogram"
try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    print("# prometheus_client not importable here; the strict checker above only")
else:
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert "esd_attempt_duration_seconds" in fams and "esd_job_shards" in fams
    print("# prometheus_client parsed %d families" % len(fams))
PYEOF
ok "the file is the exposition format: 6 done of $ROWS input rows ($KEPT kept), 7 attempts, 1 processor failure, a consistent histogram"
# the venv's Python has prometheus_client (Ray depends on it)
if [ -x "$TOP/.venv/bin/python" ] && "$TOP/.venv/bin/python" -c 'import prometheus_client' 2>/dev/null; then
    "$TOP/.venv/bin/python" - "$PROM" <<'PYEOF' || fail "prometheus_client parses the file" "$(cat "$PROM")"
import sys
from prometheus_client.parser import text_string_to_metric_families
fams = list(text_string_to_metric_families(open(sys.argv[1]).read()))
assert len(fams) >= 10, len(fams)
print("# prometheus_client parsed %d families" % len(fams))
PYEOF
    ok "prometheus_client's parser reads the file"
else
    echo "# skip: prometheus_client (from the real-stack venv) is not available"
fi
leftovers=$(find "$W/textfile" -mindepth 1 ! -name esd.prom)
[ -z "$leftovers" ] || fail "no temporary file beside the metrics file" "$leftovers"
ok "no temporary file is left beside the metrics file"

# (c) a hanging attempt shows up
stop_daemon m
[ "$DRC" -eq 0 ] || fail "esd m stops with status 0" "status $DRC"
JOB2=$W/hangjob
prepare_job "$JOB2" 2
give_job "$JOB2"
MINI_DJ_HANG=1 MINI_DJ_ONLY=hangjob start_daemon m
"$ESCTL" --socket "$(dsock m)" submit "$JOB2" >"$W/submit2.out" 2>&1 || fail "submit the hanging job" "$(cat "$W/submit2.out")"
KEY2=$(key "$JOB2")
running() { grep -q '^esd_attempts_running 1$' "$PROM" &&
    grep -q "^esd_job_shards{esd_job=\"$KEY2\",state=\"remaining\"} 2$" "$PROM"; }
wait_for "the metrics show the hanging attempt running" 20 running
ok "the file is rewritten: one attempt running, 2 shards remaining"
stop_daemon m
[ "$DRC" -eq 0 ] || fail "esd m stops with status 0" "status $DRC"

# (d) restarts: the same labels; a job that leaves the registry leaves the file
labels() { grep -o 'esd_job="[0-9a-f]*"' "$PROM" | sort -u | tr '\n' ' '; }
BEFORE=$(labels)
[ "$BEFORE" = "$(printf 'esd_job="%s"\n' "$KEY" "$KEY2" | sort | tr '\n' ' ')" ] ||
    fail "the file names both jobs by their keys before the restart" "$BEFORE"
rm -f "$PROM"
MINI_DJ_HANG=1 MINI_DJ_ONLY=hangjob start_daemon m
wait_for "the metrics file is written after the restart" 10 test -s "$PROM"
[ "$(labels)" = "$BEFORE" ] || fail "the labels are the same after a restart" "before: $BEFORE" "after: $(labels)"
ok "after a restart the file names the same jobs with the same labels: $BEFORE"
stop_daemon m
rm "$W/m/state/jobs/$KEY.json"
rm -f "$PROM"
MINI_DJ_HANG=1 MINI_DJ_ONLY=hangjob start_daemon m
wait_for "the metrics file is written after the second restart" 10 test -s "$PROM"
! grep -q "esd_job=\"$KEY\"" "$PROM" || fail "no series of a job that left the registry" "$(grep "$KEY" "$PROM")"
grep -q "^esd_job_state{esd_job=\"$KEY2\",state=" "$PROM" || fail "the other job's series remain" "$(cat "$PROM")"
ok "a job that left the registry has no series any more; the other job's remain"
stop_daemon m
[ "$DRC" -eq 0 ] || fail "esd m stops with status 0" "status $DRC"
grep -q '^esd_attempts_running 0$' "$PROM" || fail "the last write after the stop says nothing runs" "$(grep running "$PROM")"
ok "after a stop the file says nothing runs"

# ---- (e) the default path ----
AUTO=/var/lib/prometheus/node-exporter
mpath() { "$ESCTL" --socket "$(dsock a)" --json config | py 'j["metrics"]["path"]' /dev/stdin; }
if [ "$(id -u)" -eq 0 ] && [ ! -e "$AUTO" ] && [ ! -e /var/lib/prometheus ]; then
    daemon_conf a
    start_daemon a
    [ "$(mpath)" = None ] || fail "auto without $AUTO: no metrics" "$(mpath)"
    stop_daemon a
    mkdir -p "$AUTO"
    start_daemon a
    wait_for "(e) auto: esd writes $AUTO/esd.prom once the directory exists" 10 test -s "$AUTO/esd.prom"
    stop_daemon a
    rm -f "$AUTO/esd.prom"
    daemon_conf a metrics.path=off
    start_daemon a
    [ "$(mpath)" = None ] || fail "metrics.path off: no metrics" "$(mpath)"
    stop_daemon a
    [ ! -e "$AUTO/esd.prom" ] || fail "metrics.path off writes nothing"
    rm -rf /var/lib/prometheus
    ok "(e) metrics.path auto: $AUTO/esd.prom only when the directory exists; off: none"
else
    echo "# skip (e): not root, or $AUTO is this machine's own"
fi
summary
