#!/usr/bin/env bash
# log_format: the text of esd's log lines (daemon/log.c), on the stderr
# target: one daemon (the stand-in mini-dj, not Data-Juicer) works two jobs
# of one basename, p1/clean-002 (2 shards) and p2/clean-002 (1 shard),
# adopted from the spool. Every line about a shard's attempt starts with
# "[clean-002 <shard>#1] " after "<time> esd n <level>: " (claimed, done),
# the processor's lines with "esd-processor" in place of "esd"; each job's
# "job DIR registered" and "merged N rows into DIR/merged.jsonl" lines with
# "[clean-002] "; every line that names either job's directory carries the
# prefix; lines about no job (the start-up line) none. (The journal's
# fields of the same lines: daemon_systemd.sh (b).)
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

J1=$W/p1/clean-002
J2=$W/p2/clean-002
mkdir -p "$W/p1" "$W/p2"
prepare_job "$J1" 2
prepare_job "$J2" 1
give_job "$J1"
give_job "$J2"
finalized() {
    [ -e "$1/state/esd/finalize.json" ] && [ "$(py 'j["status"]' "$1/state/esd/finalize.json")" = complete ]
}
daemon_conf n
start_daemon n
for d in "$J1" "$J2"; do
    printf '{"job_dir": "%s"}\n' "$d" >"$W/spool/.tmp"
    mv "$W/spool/.tmp" "$W/spool/$(basename "$(dirname "$d")").json"
done
wait_for "esd n merges p1/clean-002" 30 finalized "$J1"
wait_for "esd n merges p2/clean-002" 30 finalized "$J2"
stop_daemon n
[ "$DRC" -eq 0 ] || fail "esd n exits 0" "exit status $DRC" "$(tail -n 20 "$W/n/log")"
ok "esd n worked p1/clean-002 and p2/clean-002 and exited 0"

python3 - "$W/n/log" "$J1" "$J2" <<'PY' || fail "the log's text" "$(head -n 40 "$W/n/log")"
import json, re, sys
log, dirs = open(sys.argv[1]).read().splitlines(), sys.argv[2:]
line = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3} (esd|esd-processor) n "
                  r"(err|warning|notice|info|debug): (\[([^] ]+)(?: ([^] #]+)(?:#(\d+))?)?\] )?(.*)$")
parsed = []
for l in log:
    m = line.match(l)
    assert m, ("not a log line", l)
    parsed.append(m.groups())
for d in dirs:
    shards = [s["id"] for s in json.load(open(d + "/manifest.json"))["shards"]]
    for s in shards:
        mine = [p for p in parsed if p[4] == s]
        for who, what in (("esd", "claimed (attempt 1)"), ("esd", "done: "),
                          ("esd-processor", "mini-dj: read ")):
            got = [p for p in mine if p[6].startswith(what)]
            assert len(got) == 1, (s, what, mine)
            assert got[0][0] == who and got[0][3] == "clean-002" and got[0][5] == "1", got[0]
    for what in ("job %s registered" % d, "merged "):
        got = [p for p in parsed if p[6].startswith(what) and d in p[6]]
        assert len(got) == 1, (d, what, got)
        assert got[0][2] == "[clean-002] " and got[0][0] == "esd", got[0]
    bare = [l for l, p in zip(log, parsed) if d in p[6] and p[3] != "clean-002"]
    assert not bare, ("a line naming the job without its prefix", bare)
start = [p for p in parsed if " started: node n" in p[6]]
assert len(start) == 1 and start[0][2] is None and start[0][0] == "esd", start
print("# %d lines; e.g. %s" % (len(log), next(l for l in log if "] done: " in l)))
PY
ok "[clean-002 SHARD#1] on claimed, done and the processor's lines (esd-processor), [clean-002] on registered and merged, of both jobs"
ok "every line naming either job's directory carries the prefix; the start-up line none"

summary
