#!/usr/bin/env bash
# daemon_systemd: esd's side of the systemd contract (daemon/notify.c,
# daemon/log.c), without systemd: real esd daemons with the test stand-in
# mini-dj (tests/tools/mini-dj.c, not Data-Juicer) as processor and
# ray.mode off, each job a small one (200 records).
#   (a) sd_notify, read from an AF_UNIX datagram socket the test binds
#       itself (a python3 receiver logs every assignment it receives) and
#       passes as NOTIFY_SOCKET, with WATCHDOG_USEC=2000000:
#       - daemon a (WATCHDOG_PID = its own pid): READY=1 arrives, and the
#         control socket answers ping at the first try once it has;
#       - STATUS= lines come, each saying "N/1 slots busy" and "ray off"
#         and differing from the one before, and change as a 6-shard job registered in the spool is worked:
#         "1/1 slots busy; job <job id> K/6 done" while a shard runs, the
#         done count never going down and reaching 6/6, then "no active
#         job" once the job is merged;
#       - WATCHDOG=1 arrives repeatedly: at least 3, at less than
#         WATCHDOG_USEC apart on average (the mean interval is printed);
#       - daemon h (WATCHDOG_PID unset) runs with esd --test-hang-watchdog
#         next to it: its watchdog is configured (its debug log says so)
#         and its loop runs (it answers ping), but while a sends 3
#         WATCHDOG=1 it sends none;
#       - the processor's environment holds none of NOTIFY_SOCKET,
#         WATCHDOG_* and LISTEN_* (a processor that speaks sd_notify must
#         not speak for esd);
#       - SIGHUP gives RELOADING=1, then READY=1 (also when the new file
#         is bad: the daemon logs that it keeps its configuration); `esctl
#         reload` (the unit's ExecReload=) exits 2 with the file's error
#         for the bad file and 0 once it is fixed; `esd --check-config -c`
#         passes the file, warns of a missing metrics.path directory, and
#         with --unit fails where systemd does not run; and
#         WATCHDOG=1 goes on after the reloads;
#       - SIGTERM gives STOPPING=1 after the last READY=1 and the daemon
#         exits 0 (a and h); a's STATUS= then says "draining; ...".
#   (a2) socket activation with systemd-socket-activate: esd started at
#        the first connection uses the passed socket (LISTEN_FDS), creates
#        none of its own, and leaves the passed one in place at exit.
#   (b) journal fields, read back from a real systemd-journald that runs in
#       a private mount namespace (unshare --mount, tmpfs on /run and
#       /var/log there; esd, journalctl --sync and journalctl run in it
#       through nsenter): daemon j (log.target journal, not -f) works a
#       4-shard job job-b and a 2-shard job of the same basename in another
#       directory (other/job-b). For every shard the lines "claimed (attempt
#       1)", "started ..." and "done: N rows ..." and the processor's own
#       output that the runner forwards (mini-dj's "read N rows" on stdout
#       and "kept N rows" on stderr) all start with "[job-b <shard>#1] " and
#       carry ESD_NODE=j, ESD_JOB=job-b@<the first 8 hex digits of the
#       SHA-256 of the job's directory> (distinct for the two jobs),
#       ESD_JOB_DIR, ESD_SHARD=<shard id>, ESD_ATTEMPT=1, PRIORITY=6 and
#       esd's own _PID; esd's lines SYSLOG_IDENTIFIER=esd, the processor's
#       esd-processor; claimed and done carry the MESSAGE_IDs of
#       daemon/msgid.h, started and the processor's lines none; each job's
#       "job ... registered" and "merged" lines (prefix "[job-b] ") their
#       MESSAGE_IDs; `journalctl ESD_SHARD=<id>` returns exactly that shard's
#       lines, `journalctl ESD_JOB_DIR=<dir>` those of its ESD_JOB, and
#       `esctl logs DIR` exactly the lines of that job, none of the other
#       job-b; `journalctl -x` with only systemd/esd.catalog installed (tmpfs
#       over the catalog directories in the namespace) explains a done line
#       with its fields filled in; the start-up line carries ESD_NODE and no
#       ESD_JOB/ESD_SHARD/ESD_ATTEMPT, no "[" prefix, with PRIORITY=5; every
#       PRIORITY is 3..7, debug lines (7) are there (log.level debug);
#       nothing fell back to stderr. Daemons k (log.target auto,
#       INVOCATION_ID set, as under systemd) and f (log.target journal but
#       -f) only start and stop: k's lines are in the journal, f's on stderr
#       only. (b) is
#       skipped with a "# skipped:" line unless the test runs as root with
#       unshare, nsenter, journalctl and an executable $JOURNALD.
#
# Environment: TOP, ESCTL, ESD (esd binary; default $TOP/esd), TOOLS (see
# lib.bash), JOURNALD (default /lib/systemd/systemd-journald).
set -euo pipefail
export LC_ALL=C

# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

WD_USEC=2000000
JOURNALD=${JOURNALD:-/lib/systemd/systemd-journald}

new_workdir
unset_knobs NOTIFY_SOCKET WATCHDOG_USEC WATCHDOG_PID JOURNAL_STREAM INVOCATION_ID LISTEN_FDS \
    LISTEN_PID LISTEN_FDNAMES
need_daemon_tools
text_dataset 200

# ---- the notify receiver ----
declare -A RPID=()
# receiver NAME: binds $W/NAME.notify and appends every assignment of every
# datagram as "<monotonic seconds> <assignment>" to $W/NAME.notify.log.
receiver() {
    : >"$W/$1.notify.log"
    python3 - "$W/$1.notify" "$W/$1.notify.log" <<'EOF' &
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
with open(sys.argv[2], "a", buffering=1) as f:
    while True:
        for a in s.recv(65536).decode("utf-8", "replace").split("\n"):
            if a:
                f.write("%.3f %s\n" % (time.monotonic(), a))
EOF
    BG+=("$!")
    RPID[$1]=$!
    wait_for "the notify receiver of $1 listens" 10 test -S "$W/$1.notify"
}
# notes NAME ASSIGNMENT: how many times NAME sent exactly ASSIGNMENT.
notes() { grep -c " $2\$" "$W/$1.notify.log" || true; }
at_least() { [ "$(notes "$1" "$2")" -ge "$3" ]; }
# start_notified NAME [COMMAND...]: esd -f on NAME's config, run through
# COMMAND (which must exec it) if given, with NOTIFY_SOCKET and
# WATCHDOG_USEC; waits for READY=1, not for ping.
start_notified() {
    local name=$1
    shift
    env NOTIFY_SOCKET="$W/$name.notify" WATCHDOG_USEC=$WD_USEC "$@" \
        "$ESD" -f -c "$W/$name/esd.yaml" >>"$W/$name/log" 2>&1 &
    DPID[$name]=$!
    BG+=("$!")
    wait_for "esd $name sends READY=1" 20 at_least "$name" READY=1 1
}
daemon_alive() { alive "${DPID[$1]}" || fail "esd $1 runs" "it exited" "$(tail -n 20 "$W/$1/log")"; }
ping_now() {
    daemon_alive "$1"
    "$ESCTL" --socket "$(dsock "$1")" ping >"$W/ping.out" 2>&1 ||
        fail "esd $1 answers ping" "$(cat "$W/ping.out")"
}
finalized() {
    [ -e "$1/state/esd/finalize.json" ] && [ "$(py 'j["status"]' "$1/state/esd/finalize.json")" = complete ]
}
# status_has NAME TEXT: the last STATUS= of NAME contains TEXT.
status_has() { grep ' STATUS=' "$W/$1.notify.log" | tail -n 1 | grep -qF -- "$2"; }

# ---- (a) sd_notify ----
JA="$W/job-a"
prepare_job "$JA" 6
give_job "$JA"
JOB_A=$(py 'j["job_id"]' "$JA/manifest.json")
# a's processor records its environment, then runs mini-dj
cat >"$W/proc-env" <<EOF
#!/bin/sh
env >"$W/proc-env.out/\$\$"
exec "$MINI" "\$@"
EOF
chmod 755 "$W/proc-env"
mkdir -p "$W/proc-env.out"
give_job "$W/proc-env.out"
daemon_conf a processor="$W/proc-env"
# h has a spool of its own: job a is a's alone
daemon_conf h spool_dir="$W/spool-h"
receiver a
receiver h

# h first, so that a's watchdog pings all fall while h runs
start_notified h sh -c 'exec "$@" --test-hang-watchdog' sh
ping_now h
ok "esd h (--test-hang-watchdog, WATCHDOG_PID unset) sent READY=1 and answers ping"
# a: WATCHDOG_PID is the pid esd runs as (sh execs it)
start_notified a sh -c 'export WATCHDOG_PID=$$ && exec "$@"' sh
ping_now a
ok "esd a (WATCHDOG_PID = its pid) sent READY=1 and answered ping at the first try"
grep -q ' STATUS=0/1 slots busy; no active job; ray off$' "$W/a.notify.log" ||
    fail "an idle STATUS=" "$(cat "$W/a.notify.log")"
ok "STATUS= while idle: 0/1 slots busy; no active job; ray off"

spool_job "$JA"
wait_for "esd a finishes job a" 40 finalized "$JA"
wait_for "STATUS= says no active job after the merge" 10 status_has a "no active job"
python3 - "$W/a.notify.log" "$JOB_A" 6 <<'EOF' || fail "STATUS= follows the job" "$(grep STATUS= "$W/a.notify.log")"
import re, sys
log, job, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
st = [l.split(" ", 1)[1][len("STATUS="):] for l in open(log).read().splitlines()
      if l.split(" ", 1)[1].startswith("STATUS=")]
assert all(re.match(r"(draining; )?[01]/1 slots busy; ", s) and s.endswith("; ray off") for s in st), st
assert all(a != b for a, b in zip(st, st[1:])), "a STATUS= repeated"
done = [int(m.group(1)) for s in st
        for m in [re.search(r"; job %s (\d+)/%d done" % (re.escape(job), n), s)] if m]
assert done and done == sorted(done) and done[-1] == n, done
busy = [s for s in st if s.startswith("1/1 slots busy; job %s " % job)]
assert busy, "no STATUS= with a shard running"
first = min(i for i, s in enumerate(st) if job in s)
assert "no active job" in st[-1] and first > 0 and "no active job" in st[first - 1], st
print("# %d STATUS= lines, e.g. %r" % (len(st), busy[0]))
EOF
ok "STATUS= changes as the job is worked: 1/1 slots busy, job $JOB_A K/6 done up to 6/6, then no active job"

[ "$(count "$W/proc-env.out")" -eq 6 ] || fail "a's processor ran 6 times" "$(ls "$W/proc-env.out")"
! grep -lE '^(NOTIFY_SOCKET|WATCHDOG_USEC|WATCHDOG_PID|LISTEN_[A-Z]+)=' "$W"/proc-env.out/* ||
    fail "the processor does not inherit systemd's variables for esd"
ok "the processor's environment holds no NOTIFY_SOCKET, WATCHDOG_* or LISTEN_*"

wait_for "3 WATCHDOG=1 from esd a" 15 at_least a WATCHDOG=1 3
ok "esd a sent WATCHDOG=1 $(notes a WATCHDOG=1) times"
mean=$(python3 - "$W/a.notify.log" <<'EOF'
import sys
t = [float(l.split()[0]) for l in open(sys.argv[1]) if l.rstrip().endswith(" WATCHDOG=1")]
print("%.2f" % ((t[-1] - t[0]) / (len(t) - 1)))
EOF
)
echo "# mean WATCHDOG=1 interval: $mean s (WATCHDOG_USEC $WD_USEC)"
python3 -c 'import sys; sys.exit(not 0.2 < float(sys.argv[1]) < int(sys.argv[2]) / 1e6)' "$mean" \
    "$WD_USEC" || fail "WATCHDOG=1 comes within WATCHDOG_USEC" "mean interval $mean s"
ok "WATCHDOG=1 comes within WATCHDOG_USEC on average ($mean s)"
[ "$(notes h WATCHDOG=1)" -eq 0 ] || fail "esd --test-hang-watchdog sends no WATCHDOG=1" \
    "$(cat "$W/h.notify.log")"
grep -q "watchdog: WATCHDOG=1 every 1.0 s" "$W/h/log" ||
    fail "esd h's watchdog is configured" "$(cat "$W/h/log")"
ping_now h
ok "esd h (--test-hang-watchdog): watchdog configured, loop running, no WATCHDOG=1 meanwhile"

# reload: a good file, then a bad one
kill -HUP "${DPID[a]}"
wait_for "RELOADING=1 and READY=1 after SIGHUP" 10 at_least a READY=1 2
wait_for "esd a logs the reload" 10 grep -q "reloaded $W/a/esd.yaml" "$W/a/log"
echo "slots: [" >>"$W/a/esd.yaml"
kill -HUP "${DPID[a]}"
wait_for "RELOADING=1 and READY=1 after SIGHUP with a bad file" 10 at_least a READY=1 3
wait_for "esd a keeps its configuration" 10 grep -q "keeping the current configuration" "$W/a/log"
python3 - "$W/a.notify.log" <<'EOF' || fail "RELOADING=1 then READY=1, twice" "$(cat "$W/a.notify.log")"
import sys
ev = [l.split(" ", 1)[1] for l in open(sys.argv[1]).read().splitlines()]
ev = [e for e in ev if e in ("READY=1", "RELOADING=1")]
assert ev == ["READY=1", "RELOADING=1", "READY=1", "RELOADING=1", "READY=1"], ev
EOF
ok "SIGHUP: RELOADING=1 then READY=1 (good file), again with a bad file (kept)"
# esctl reload (the unit's ExecReload=): the same reload, answered
run "$ESCTL" --socket "$(dsock a)" reload
check "esctl reload with a bad file fails with esd's error" 2 "" \
    "esd.yaml:$(wc -l <"$W/a/esd.yaml"): duplicate key"
wait_for "esctl reload: READY=1 again" 10 at_least a READY=1 4
sed -i '$d' "$W/a/esd.yaml"
run "$ESCTL" --socket "$(dsock a)" reload
check "esctl reload with the file fixed" 0 "reloaded $W/a/esd.yaml"
# --check-config of a file of one's own (-c): no unit; a missing
# metrics.path directory is a warning only
run "$ESD" --check-config -c "$W/a/esd.yaml"
check "esd --check-config -c a's file" 0 "$W/a/esd.yaml: ok"
printf 'ray:\n  mode: off\nmetrics:\n  path: %s/nowhere/esd.prom\n' "$W" >"$W/metrics.yaml"
run "$ESD" --check-config -c "$W/metrics.yaml"
check "esd --check-config: a missing metrics directory is a warning without a unit" 0 "ok" \
    "warning: metrics.path $W/nowhere/esd.prom: $W/nowhere: no such directory"
if [ ! -e /run/systemd/system ]; then
    run "$ESD" --check-config -c "$W/a/esd.yaml" --unit esd.service
    check "esd --check-config --unit where systemd does not run" 1 "" "systemd does not run here"
fi
ping_now a
wd=$(notes a WATCHDOG=1)
wait_for "WATCHDOG=1 goes on after the reloads" 10 at_least a WATCHDOG=1 $((wd + 1))
ok "WATCHDOG=1 goes on after the reloads"

for n in a h; do
    stop_daemon "$n"
    [ "$DRC" -eq 0 ] || fail "esd $n exits 0 after SIGTERM" "exit status $DRC" "$(tail -n 20 "$W/$n/log")"
    python3 - "$W/$n.notify.log" <<'EOF' || fail "esd $n: STOPPING=1 after READY=1" "$(cat "$W/$n.notify.log")"
import sys
ev = [l.split(" ", 1)[1] for l in open(sys.argv[1]).read().splitlines()]
assert ev.count("STOPPING=1") == 1, ev
last_ready = max(i for i, e in enumerate(ev) if e == "READY=1")
assert ev.index("STOPPING=1") > last_ready, ev
EOF
    ok "esd $n: SIGTERM gives STOPPING=1 (after the last READY=1), exit status 0"
    # reaped quietly (bash reports a job killed by a signal)
    { kill "${RPID[$n]}" && wait "${RPID[$n]}"; } 2>/dev/null || true
done
grep -q ' STATUS=draining; 0/1 slots busy; no active job; ray off$' "$W/a.notify.log" ||
    fail "STATUS= says draining" "$(grep STATUS= "$W/a.notify.log")"
ok "STATUS= says draining after SIGTERM"

# ---- (a2) socket activation ----
if command -v systemd-socket-activate >/dev/null; then
    daemon_conf s spool_dir="$W/spool-s"
    # systemd-socket-activate binds the socket and execs esd (same pid) at
    # the first connection, passing the socket as LISTEN_FDS
    systemd-socket-activate --listen="$W/activated.sock" \
        "$ESD" -f -c "$W/s/esd.yaml" >>"$W/s/log" 2>&1 &
    DPID[s]=$!
    BG+=("$!")
    wait_for "the activation socket exists" 10 test -S "$W/activated.sock"
    run "$ESCTL" --socket "$W/activated.sock" ping
    check "esd started by socket activation answers ping on the passed socket" 0 "node s"
    grep -q "control socket: listening on the socket passed by systemd" "$W/s/log" ||
        fail "esd s uses the passed socket" "$(cat "$W/s/log")"
    [ ! -e "$(dsock s)" ] || fail "esd s did not create its configured socket too"
    stop_daemon s
    [ "$DRC" -eq 0 ] || fail "esd s exits 0" "status $DRC" "$(tail -n 5 "$W/s/log")"
    [ -S "$W/activated.sock" ] || fail "esd leaves the passed socket in place"
    ok "socket activation: the passed socket is used, not created, and left in place at exit"
else
    echo "# skipped: (a2) socket activation (no systemd-socket-activate)"
fi

# ---- (b) journal fields ----
why=""
if [ "$(id -u)" -ne 0 ]; then
    why="not root"
else
    for t in unshare nsenter journalctl; do
        command -v "$t" >/dev/null || why="no $t"
    done
    [ -x "$JOURNALD" ] || why="no $JOURNALD"
fi
if [ -n "$why" ]; then
    echo "# skipped: (b) journal fields ($why)"
    summary
    exit 0
fi

# journald in its own mount namespace: tmpfs on /run (its sockets, the
# runtime journal) and /var/log (a persistent journal, if configured);
# its own messages on stderr, not in the kernel log. unshare execs it:
# JPID is journald and names the namespace.
# shellcheck disable=SC2016 # $0 is for the inner sh
SYSTEMD_LOG_TARGET=console unshare --mount --propagation private sh -c \
    'mount -t tmpfs -o mode=755 tmpfs /run && mount -t tmpfs -o mode=755 tmpfs /var/log &&
     exec "$0"' "$JOURNALD" >"$W/journald.log" 2>&1 &
JPID=$!
BG+=("$JPID")
in_ns() { nsenter --target "$JPID" --mount -- "$@"; }
journald_up() {
    alive "$JPID" || fail "systemd-journald starts" "$(cat "$W/journald.log")"
    in_ns test -S /run/systemd/journal/socket
}
wait_for "systemd-journald listens in its namespace" 10 journald_up
[ ! -e /run/systemd/journal/socket ] || [ "$(stat -L -c %i /run/systemd/journal/socket)" != \
    "$(in_ns stat -L -c %i /run/systemd/journal/socket)" ] ||
    fail "the namespace's journald socket is its own"
ok "systemd-journald runs in a private mount namespace"

JB="$W/job-b"
prepare_job "$JB" 4
give_job "$JB"
JOB_B=$(py 'j["job_id"]' "$JB/manifest.json")
# a second job of the same basename in another directory
JB2="$W/other/job-b"
mkdir -p "$W/other"
prepare_job "$JB2" 2
give_job "$JB2"
rm -f "$W/spool/job-a.json"
# start_in_ns NAME [ENV=VALUE...] [-- OPTION...]: esd on NAME's config in
# journald's namespace; nsenter (no --fork) and env exec it, so the pid is
# esd's. Waits until it answers ping.
start_in_ns() {
    local name=$1 envs=()
    shift
    while [ $# -gt 0 ] && [ "$1" != -- ]; do
        envs+=("$1")
        shift
    done
    [ $# -eq 0 ] || shift
    nsenter --target "$JPID" --mount -- env "${envs[@]}" "$ESD" "$@" -c "$W/$name/esd.yaml" \
        >>"$W/$name/log" 2>&1 &
    DPID[$name]=$!
    BG+=("$!")
    wait_for "esd $name answers ping" 20 daemon_up "$name"
}
daemon_conf j log.target=journal
start_in_ns j
spool_job "$JB"
printf '{"job_dir": "%s"}\n' "$JB2" >"$W/spool/.other.tmp"
mv "$W/spool/.other.tmp" "$W/spool/other-job-b.json"
wait_for "esd j finishes job b" 40 finalized "$JB"
wait_for "esd j finishes the other job b" 40 finalized "$JB2"
stop_daemon j
[ "$DRC" -eq 0 ] || fail "esd j exits 0" "exit status $DRC" "$(tail -n 20 "$W/j/log")"
ok "esd j (log.target journal) worked both jobs job-b and exited 0"
# log.target auto: the journal when systemd started esd (INVOCATION_ID);
# -f: stderr even with log.target journal. Neither works a job.
daemon_conf k spool_dir="$W/spool-k" log.target=auto
start_in_ns k INVOCATION_ID=0123456789abcdef0123456789abcdef
stop_daemon k
daemon_conf f spool_dir="$W/spool-k" log.target=journal
start_in_ns f -- -f
stop_daemon f
in_ns journalctl --sync >"$W/sync.out" 2>&1 || fail "journalctl --sync" "$(cat "$W/sync.out")"
# journal NAME MATCH...: journalctl -o json with those matches into $W/NAME.json
journal() {
    local name=$1
    shift
    in_ns journalctl --no-pager -o json "$@" >"$W/$name.json" 2>"$W/journal.err" ||
        fail "journalctl $*" "$(cat "$W/journal.err")"
}
journal journal ESD_NODE=j
journal jobdir "ESD_JOB_DIR=$JB"
for d in "$JB" "$JB2"; do
    in_ns "$ESCTL" logs "$d" >"$W/logs.$(basename "$(dirname "$d")").out" 2>"$W/logs.err" ||
        fail "esctl logs $d" "$(cat "$W/logs.err")"
done
journal k SYSLOG_IDENTIFIER=esd ESD_NODE=k
journal f SYSLOG_IDENTIFIER=esd ESD_NODE=f
SHARD1=$(py 'sorted(j["shards"], key=lambda s: s["index"])[0]["id"]' "$JB/manifest.json")
journal shard "ESD_SHARD=$SHARD1"
# journalctl -x with esd's catalog alone (tmpfs over the catalog directories,
# in the namespace only)
DONE_ID=$(sed -n 's/^#define MSGID_DONE "\(.*\)"$/\1/p' "$TOP/daemon/msgid.h")
in_ns sh -c 'mount -t tmpfs tmpfs /usr/lib/systemd/catalog &&
    mount -t tmpfs tmpfs /var/lib/systemd/catalog && cp "$1" /usr/lib/systemd/catalog/ &&
    journalctl --update-catalog && journalctl --no-pager -x "MESSAGE_ID=$2" "ESD_SHARD=$3"' \
    sh "$TOP/systemd/esd.catalog" "$DONE_ID" "$SHARD1" >"$W/x.out" 2>&1 ||
    fail "journalctl -x with esd.catalog" "$(cat "$W/x.out")"
ESD_JOB_B=job-b@$(printf %s "$JB" | sha256sum | cut -c1-8)
grep -qF "Subject: esd finished shard $SHARD1 of job $ESD_JOB_B" "$W/x.out" &&
    grep -qF "Attempt 1 of shard $SHARD1 succeeded on node j" "$W/x.out" ||
    fail "journalctl -x explains the done line from esd.catalog" "$(cat "$W/x.out")"
ok "journalctl -x explains a done line from systemd/esd.catalog, its fields filled in ($ESD_JOB_B)"
kill -TERM "$JPID"
wait_for "systemd-journald exits" 10 dead "$JPID"
ok "read back $(wc -l <"$W/journal.json") esd lines from the journal"
[ ! -s "$W/j/log" ] || fail "esd j wrote nothing on stderr" "$(head -n 20 "$W/j/log")"
ok "esd j wrote nothing on stderr (no line fell back)"
if ! grep -q 'started: node k' "$W/k.json" || [ -s "$W/k/log" ]; then
    fail "log.target auto with INVOCATION_ID logs to the journal" "$(cat "$W/k.json" "$W/k/log")"
fi
ok "log.target auto with INVOCATION_ID set: the journal, nothing on stderr"
if ! grep -q '^[-0-9T:.]* esd f notice: esd .* started: node f' "$W/f/log" || [ -s "$W/f.json" ]; then
    fail "esd -f logs to stderr even with log.target journal" "$(cat "$W/f.json" "$W/f/log")"
fi
ok "esd -f with log.target journal: stderr, nothing in the journal"

python3 - "$W/journal.json" "$W/shard.json" "$JB/manifest.json" "$JOB_B" "${DPID[j]}" "$SHARD1" \
    "$JB" "$JB2" "$JB2/manifest.json" "$W/jobdir.json" "$W/logs.$(basename "$W").out" \
    "$W/logs.other.out" "$TOP/daemon/msgid.h" <<'EOF' || fail "the journal fields of esd j's lines"
import hashlib, json, re, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
by_shard = [json.loads(l) for l in open(sys.argv[2])]
shards = [s["id"] for s in json.load(open(sys.argv[3]))["shards"]]
job, pid, shard1, jb, jb2 = sys.argv[4:9]
shards2 = [s["id"] for s in json.load(open(sys.argv[9]))["shards"]]
by_dir = [json.loads(l) for l in open(sys.argv[10])]
logs, logs2 = open(sys.argv[11]).read().splitlines(), open(sys.argv[12]).read().splitlines()
ids = dict(re.findall(r'#define MSGID_(\w+) "([0-9a-f]{32})"', open(sys.argv[13]).read()))
msg = lambda e: e.get("MESSAGE", "")
# ESD_JOB: <basename>@<the first 8 hex digits of sha256(resolved dir)>
esd_job = {d: "job-b@" + hashlib.sha256(d.encode()).hexdigest()[:8] for d in (jb, jb2)}
assert job == "job-b" and esd_job[jb] != esd_job[jb2], esd_job
assert lines, "no esd line in the journal"
for e in lines:
    assert e.get("ESD_NODE") == "j", e
    assert e.get("SYSLOG_IDENTIFIER") == ("esd-processor" if msg(e).split("] ", 1)[-1]
                                          .startswith("mini-dj: ") else "esd"), e
    assert e.get("PRIORITY") in ("3", "4", "5", "6", "7"), e
    assert e.get("_PID") == pid, (e.get("_PID"), pid, msg(e))
    if "ESD_SHARD" in e or "ESD_ATTEMPT" in e:
        d = jb if e.get("ESD_SHARD") in shards else jb2
        assert e.get("ESD_SHARD") in shards + shards2, e
        assert e.get("ESD_JOB") == esd_job[d] and e.get("ESD_JOB_DIR") == d, e
        assert e.get("ESD_ATTEMPT") == "1", e
        assert msg(e).startswith("[job-b %s#1] " % e["ESD_SHARD"]), e
    elif "ESD_JOB" in e:
        assert e["ESD_JOB"] == esd_job[e.get("ESD_JOB_DIR")], e
        assert msg(e).startswith("[job-b] "), e
    else:
        assert not msg(e).startswith("["), e
assert any(e["PRIORITY"] == "7" for e in lines), "no debug line"
start = [e for e in lines if msg(e).startswith("esd ") and " started: node j" in msg(e)]
assert len(start) == 1 and start[0]["PRIORITY"] == "5", start
assert not {"ESD_JOB", "ESD_SHARD", "ESD_ATTEMPT"} & set(start[0]), start[0]
want = {"claimed": (lambda m: m == "claimed (attempt 1)", ids["CLAIMED"]),
        "started": (lambda m: m.startswith("started "), None),
        "done": (lambda m: m.startswith("done: ") and " rows in " in m, ids["DONE"]),
        "mini-dj stdout": (lambda m: m.startswith("mini-dj: read ") and " rows from " in m, None),
        "mini-dj stderr": (lambda m: m.startswith("mini-dj: kept "), None)}
for s in shards + shards2:
    mine = [e for e in lines if e.get("ESD_SHARD") == s]
    for what, (match, mid) in want.items():
        got = [e for e in mine if match(msg(e).split("] ", 1)[1])]
        assert len(got) == 1, (s, what, [msg(e) for e in mine])
        assert got[0]["PRIORITY"] == "6", (s, what, got[0])
        assert got[0]["ESD_ATTEMPT"] == "1", got[0]
        assert got[0].get("MESSAGE_ID") == mid, (what, got[0])
for d in (jb, jb2):
    for what, mid in (("] job %s registered" % d, ids["JOB_REGISTERED"]), ("] merged ", ids["MERGED"])):
        got = [e for e in lines if e.get("ESD_JOB_DIR") == d and what in msg(e)]
        assert len(got) == 1 and got[0].get("MESSAGE_ID") == mid, (d, what, got)
key = lambda e: e["__CURSOR"]
assert sorted(map(key, by_shard)) == sorted(key(e) for e in lines if e.get("ESD_SHARD") == shard1), \
    "journalctl ESD_SHARD= returns that shard's lines"
assert sorted(map(key, by_dir)) == sorted(key(e) for e in lines if e.get("ESD_JOB") == esd_job[jb]), \
    "journalctl ESD_JOB_DIR= returns the lines of ESD_JOB"
# esctl logs DIR: exactly that job's lines, not those of the other job-b
for out, d, mine, other in ((logs, jb, shards, shards2), (logs2, jb2, shards2, shards)):
    out = [l for l in out if not l.startswith("-- ")]
    want_n = sum(e.get("ESD_JOB") == esd_job[d] for e in lines)
    assert len(out) == want_n, (d, len(out), want_n, out[:5])
    assert all(any(s + "#1] " in l for l in out) for s in mine), (d, out[:5])
    assert not any(s in l for l in out for s in other), (d, [l for l in out if "#1]" in l][:3])
print("# %d lines, %d with ESD_SHARD; e.g. %s" % (len(lines), sum("ESD_SHARD" in e for e in lines),
      json.dumps({k: v for k, v in by_shard[-1].items() if k.startswith("ESD_") or k in
                  ("MESSAGE", "PRIORITY")}, sort_keys=True)))
EOF
ok "every shard's claimed/started/done lines and mini-dj's stdout and stderr lines carry ESD_NODE, ESD_JOB, ESD_JOB_DIR, ESD_SHARD, ESD_ATTEMPT=1, PRIORITY=6 and start with [job-b SHARD#1]"
ok "two jobs named job-b in different directories: ESD_JOB job-b@<8 hex digits of each directory's key>, distinct"
ok "MESSAGE_ID on claimed, done (not on started or the processor's lines), job registered and merged"
ok "the processor's lines have SYSLOG_IDENTIFIER=esd-processor, esd's own esd"
ok "esctl logs DIR shows exactly that job's lines, not the other job-b's"
ok "journalctl ESD_SHARD=$SHARD1 returns exactly that shard's lines"
ok "the start-up line: PRIORITY=5, ESD_NODE only; every PRIORITY 3..7; debug lines present"

summary
