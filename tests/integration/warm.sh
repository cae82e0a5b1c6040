#!/usr/bin/env bash
# warm: the warm processor (data_juicer.warm, daemon/warm.c, esd-dj --warm;
# issue 13, items 1 and 7). esd runs as root; the jobs belong to a throwaway
# user with a supplementary group. The processor is Data-Juicer's own, here
# the stand-in tests/tools/pydj (copied into W: data_juicer.root, python3;
# NOT Data-Juicer), which writes a probe of itself into each attempt
# directory and takes its faults from control files (its header says how).
#   (a) one job worked with the warm processor and a fresh copy of it with
#       data_juicer.warm false: every attempt of the first was forked by the
#       warm processor (esd's log, and the probe: its command line is
#       esd-dj --warm), none of the second; the probes of both agree on the
#       environment (attempt paths aside), argv (the same up to attempt
#       paths), cwd, identity (the owner's uid, gid and groups, not root),
#       umask, rlimits, signal mask (empty) and dispositions, descriptors
#       (0 on /dev/null, 1 and 2 on one pipe, nothing else), process group
#       (their own, led by their keeper, their parent) and session; the
#       merged outputs are byte-identical (and the input, copied).
#   (b) the processor of a warm attempt killed with SIGKILL while it hangs:
#       the attempt fails (processor class), is retried, and the job
#       completes; nothing of the killed attempt is left (no process of the
#       owner's but the warm processor).
#   (c) the warm processor killed with SIGKILL while an attempt runs: the
#       attempt still finishes (done, attempt 1), esd logs the warm
#       processor's end, a new one forks a later attempt, the job completes.
#   (d) a warm processor that cannot serve (a Python thread after its
#       imports): esd logs why and execs the attempts, the job completes;
#       after three failures in a row it says the job's attempts are exec'd
#       for the next 600 s.
#   (e) SIGTERM to esd while two warm attempts hang: esd exits 0 within
#       seconds, the claims are released without a failure, and nothing of
#       the warm processor, its forks or their attempts is left.
# Needs root (the job owner is another user than esd); skips otherwise.
#
# Environment: TOP, ESCTL, ESD, TOOLS (see lib.bash).
set -euo pipefail
export LC_ALL=C

# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

if [ "$(id -u)" -ne 0 ]; then
    skip "warm.sh runs esd as root for jobs of a throwaway user: it needs root"
fi
command -v python3 >/dev/null || skip "warm.sh needs python3"
new_workdir
unset_knobs
need_daemon_tools
[ -r "$(dirname "$ESD")/esd-dj" ] || fail "esd-dj is next to esd" "run make"
T0=$(date +%s)

OWNER=esdwarm$$
groupadd "${OWNER}x"
useradd -M -d "$W/home-of-$OWNER" -s /bin/false -G "${OWNER}x" "$OWNER"
OWNER_UID=$(id -u "$OWNER")
drop_user() {
    # (anything of the owner's left, i.e. of this script's, is killed
    # first: userdel refuses otherwise)
    local p
    for p in $(pgrep -U "$OWNER_UID" 2>/dev/null || true); do
        kill -KILL "$p" 2>/dev/null || true
    done
    userdel "$OWNER" 2>/dev/null || true
    groupdel "${OWNER}x" 2>/dev/null || true
    groupdel "$OWNER" 2>/dev/null || true
}
# A cgroup v2 directory given to esd as if delegated (ESD_TEST_CGROUP, as
# contain.sh does), where there is one: the attempts run in cgroups of
# their own, warm or exec'd.
CG=
for root in /sys/fs/cgroup/unified /sys/fs/cgroup; do
    if [ "$(stat -f -c %T "$root" 2>/dev/null)" = cgroup2fs ] &&
        mkdir "$root/esd-warm-$$" 2>/dev/null; then
        CG=$root/esd-warm-$$
        break
    fi
done
drop_cgroups() {
    [ -n "$CG" ] && [ -d "$CG" ] || return 0
    local d
    find "$CG" -mindepth 1 -depth -type d | while read -r d; do
        echo 1 >"$d/cgroup.kill" 2>/dev/null || true
        rmdir "$d" 2>/dev/null || true
    done
    rmdir "$CG" 2>/dev/null || true
}
trap 'cleanup; drop_cgroups; drop_user' EXIT
chmod 755 "$W"

# the stand-in, as a checkout of the owner's to read (not to write)
ROOT=$W/pydj
cp -r "$TOP/tests/tools/pydj" "$ROOT"
mkdir -p "$ROOT/control"
chmod -R a+rX "$ROOT"
mode() { echo "$1" >"$ROOT/control/mode.tmp" && mv "$ROOT/control/mode.tmp" "$ROOT/control/mode"; }
mode ok

text_dataset 40
# new_job NAME SHARDS [prepare options]: a prepared job of the owner's
new_job() {
    local job=$W/$1
    prepare_job "$job" "${@:2}"
    chown -R "$OWNER:" "$job"
}
# conf NAME [KEY=VALUE...]: a daemon of pydj, with a spool of its own
conf() {
    local name=$1
    shift
    daemon_conf "$name" "processor=[]" "data_juicer.root=$ROOT" data_juicer.python=python3 \
        "spool_dir=$W/spool-$name" "$@"
    mkdir -p "$W/spool-$name"
}
# spool NAME JOB: registers JOB with daemon NAME
spool() {
    printf '{"job_dir": "%s"}\n' "$2" >"$W/spool-$1/.$(basename "$2").tmp"
    mv "$W/spool-$1/.$(basename "$2").tmp" "$W/spool-$1/$(basename "$2").json"
}
complete() {
    [ -f "$1/state/esd/finalize.json" ] &&
        [ "$(py 'j["status"]' "$1/state/esd/finalize.json")" = complete ]
}
# stop NAME: SIGTERM, and esd exits 0 (a sanitizer's report would make it fail)
stop() {
    stop_daemon "$1"
    [ "$DRC" -eq 0 ] || fail "esd $1 exits 0 on SIGTERM" "exit $DRC" "$(tail -n 20 "$W/$1/log")"
}
# probes JOB: the probe files of JOB's attempts
probes() { find "$1/attempts" -name 'probe-*.json' 2>/dev/null | sort; }
nprobes() { [ "$(probes "$1" | wc -l)" -ge "$2" ]; }
# warm_pids NAME: the pids of the warm processors esd NAME started
warm_pids() { sed -n 's/.*started a warm processor (pid \([0-9]*\)).*/\1/p' "$W/$1/log"; }
# owner_procs: the live processes of the owner's
owner_procs() {
    local p
    for p in $(pgrep -U "$OWNER_UID" 2>/dev/null || true); do
        ! alive "$p" || echo "$p"
    done
}

# ---- (a) warm and exec'd attempts of the same job ----
new_job job-warm 4
cp -a "$W/job-warm" "$W/job-exec"
conf a slots=2
conf b slots=2 data_juicer.warm=false
spool a "$W/job-warm"
spool b "$W/job-exec"
cgenv=()
[ -z "$CG" ] || { mkdir "$CG/a" "$CG/b"; cgenv=(ESD_TEST_CGROUP="$CG/a"); }
start_daemon a -u LC_ALL -u LANG -u LC_CTYPE "${cgenv[@]}"
[ -z "$CG" ] || cgenv=(ESD_TEST_CGROUP="$CG/b")
start_daemon b -u LC_ALL -u LANG -u LC_CTYPE "${cgenv[@]}"
wait_for "(a) the warm job completes" 30 complete "$W/job-warm"
wait_for "(a) the exec'd job completes" 30 complete "$W/job-exec"
for p in $(warm_pids a); do STRAYS+=("$p"); done
[ "$(warm_pids b | wc -l)" -eq 0 ] || fail "(a) no warm processor with data_juicer.warm false"
nf=$(grep -c 'forked by the warm processor' "$W/a/log" || true)
[ "$nf" -eq 4 ] || fail "(a) esd a says each of the 4 attempts was forked by the warm processor" \
    "$nf times" "$(grep -E 'warm|started' "$W/a/log")"
! grep -q 'forked by the warm processor' "$W/b/log" ||
    fail "(a) esd b forked nothing" "$(grep 'forked' "$W/b/log")"
cmp -s "$W/job-warm/merged.jsonl" "$W/job-exec/merged.jsonl" ||
    fail "(a) the merged outputs are byte-identical"
cmp -s "$W/job-warm/merged.jsonl" "$W/data.jsonl" || fail "(a) the merged output is the input"
ok "(a) both jobs complete, 4 attempts forked by the warm processor and 4 exec'd; merged outputs byte-identical"

mapfile -t PW < <(probes "$W/job-warm")
mapfile -t PE < <(probes "$W/job-exec")
{ [ "${#PW[@]}" -eq 4 ] && [ "${#PE[@]}" -eq 4 ]; } ||
    fail "(a) one probe an attempt" "warm: ${PW[*]}" "exec'd: ${PE[*]}"
python3 - "$W/job-warm" "$W/job-exec" "${DPID[a]}" "${DPID[b]}" "$OWNER" \
    "$W/a/log" "$W/b/log" "$CG" <<'EOF' ||
import glob, json, os, pwd, re, sys
jw, je, esd_a, esd_b, owner = sys.argv[1:6]
logs, cg = sys.argv[6:8], sys.argv[8]
cgroups = set()
pw = pwd.getpwnam(owner)
groups = sorted(set(os.getgrouplist(owner, pw.pw_gid)))
esd_sid = {jw: os.getsid(int(esd_a)), je: os.getsid(int(esd_b))}
esd_pgid = {jw: os.getpgid(int(esd_a)), je: os.getpgid(int(esd_b))}

def norm(job, path, v):
    """v with the attempt's own paths and names replaced (its directory,
    the job's, the shard id)."""
    adir = os.path.dirname(path)
    shard = os.path.basename(os.path.dirname(adir))
    if isinstance(v, str):
        return v.replace(adir, "<attempt>").replace(job, "<job>").replace(shard, "<shard>")
    if isinstance(v, list):
        return [norm(job, path, x) for x in v]
    if isinstance(v, dict):
        return {k: norm(job, path, x) for k, x in v.items()}
    return v

def view(job, path):
    p = json.load(open(path))
    where = "%s: " % path
    assert p["uid"] == p["euid"] == pw.pw_uid and p["gid"] == p["egid"] == pw.pw_gid, \
        where + "runs as %d/%d, not the owner's %d/%d" % (p["uid"], p["gid"], pw.pw_uid, pw.pw_gid)
    assert p["groups"] == groups and len(groups) == 2, \
        where + "groups %s, want %s" % (p["groups"], groups)
    assert p["pgid"] == p["ppid"] != p["pid"], where + "pgid %d, parent %d" % (p["pgid"], p["ppid"])
    assert p["pgid"] != esd_pgid[job], where + "in esd's process group"
    fds = p["fds"]
    assert sorted(fds) == ["0", "1", "2"], where + "descriptors %s" % fds
    assert fds["0"] == "/dev/null" and fds["1"] == fds["2"] and fds["1"].startswith("pipe:"), \
        where + "descriptors %s" % fds
    assert p["sigmask"] == [] and int(p["SigBlk"], 16) == 0, where + "blocked %s" % p["SigBlk"]
    assert p["preserve_order"] is True, where + "preserve_order %r" % p["preserve_order"]
    argv = p["argv"]
    i = argv.index("--job_id")
    argv = argv[:i + 1] + ["<job_id>"] + argv[i + 2:]
    sid = "esd's" if p["sid"] == esd_sid[job] else "its own" if p["sid"] == p["pid"] else "another"
    cgroup = "(not tested)"
    if cg:
        # its own: attempt-<token> under the one esd was given
        mine = cg[cg.index("/esd-warm-"):] + "/" + ("a" if job == jw else "b") + "/attempt-"
        assert p["cgroup"].startswith("0::/") and mine in p["cgroup"] and \
            p["cgroup"].rindex("/") == p["cgroup"].index(mine) + len(mine) - 9, \
            where + "cgroup %s, not one under %s" % (p["cgroup"], mine)
        assert p["cgroup"] not in cgroups, where + "cgroup %s twice" % p["cgroup"]
        cgroups.add(p["cgroup"])
        cgroup = "attempt-*"
    return {
        "environ": norm(job, path, p["environ"]),
        "argv": norm(job, path, argv),
        "cwd": p["cwd"],
        "identity": [p["uid"], p["euid"], p["gid"], p["egid"], p["groups"]],
        "umask": p["umask"],
        "rlimits": p["rlimits"],
        "signals": [p["SigIgn"], p["SigCgt"], p["dispositions"]],
        "session": sid,
        "cgroup": cgroup,
        "threads": p["threads"],
    }

keepers = {}
for job, log in ((jw, logs[0]), (je, logs[1])):
    keepers[job] = set()
    for line in open(log, errors="replace"):
        m = re.search(r"started \S+ \(pid (\d+), its keeper (\d+)[,)]", line)
        if m:
            keepers[job].add((int(m.group(2)), False))
        m = re.search(r"started \S+ \(its keeper (\d+), forked by the warm processor[,)]", line)
        if m:
            keepers[job].add((int(m.group(1)), True))
views = {}
for job, forked in ((jw, True), (je, False)):
    for path in sorted(glob.glob(job + "/attempts/*/*/probe-*.json")):
        p = json.load(open(path))
        assert p["forked"] is forked, "%s: forked %s" % (path, p["forked"])
        # esd's log names the attempt's keeper (and, exec'd, the processor)
        assert (p["ppid"], forked) in keepers[job], "%s: parent %d, esd's log: %s" % (
            path, p["ppid"], keepers[job])
        views.setdefault(forked, []).append((path, view(job, path)))
ref_path, ref = views[False][0]
for forked in (False, True):
    for path, v in views[forked]:
        for k in ref:
            assert v[k] == ref[k], "%s and %s differ in %s:\n %s\n %s" % (
                path, ref_path, k, json.dumps(v[k], sort_keys=True),
                json.dumps(ref[k], sort_keys=True))
print("# the attempts' session: %s; environment: %d variables; cgroups: %s" % (
    ref["session"], len(ref["environ"]), ref["cgroup"]))
EOF
    fail "(a) the probes of the warm and the exec'd attempts agree"
ok "(a) warm attempts are forks (of esd-dj --warm, under esd's keeper), exec'd ones are not"
ok "(a) warm and exec'd attempts agree on environment, argv, cwd, identity ($OWNER, 2 groups), umask, rlimits, signals, session${CG:+, a cgroup of their own}"
ok "(a) both: descriptors 0-2 only (/dev/null, one pipe), no blocked signal, a process group of their own led by their keeper"
wp=$(warm_pids a | tail -n 1)
[ "$(ps -o uid=,ppid= -p "$wp" | xargs)" = "$OWNER_UID ${DPID[a]}" ] ||
    fail "(a) the warm processor $wp is esd's child, run by the owner" \
        "$(ps -o pid,ppid,user,args -p "$wp")"
ok "(a) the warm processor is a child of esd's, run by $OWNER"
if [ -n "$CG" ]; then
    grep -q "^0::/.*esd-warm-$$/a/esd\$" "/proc/$wp/cgroup" ||
        fail "(a) the warm processor is in esd's own cgroup, not an attempt's" \
            "$(cat "/proc/$wp/cgroup")"
    cg_gone() { [ -z "$(find "$CG/a" "$CG/b" -mindepth 1 -maxdepth 1 -name 'attempt-*')" ]; }
    wait_for "(a) the attempts' cgroups are removed" 10 cg_gone
    ok "(a) the warm processor is in esd's cgroup, the attempts' cgroups are removed"
fi
stop a
stop b
wait_for "(a) nothing of the owner's is left once both have stopped" 5 test -z "$(owner_procs)"
ok "(a) nothing of the owner's is left once both have stopped"

# attempt_json JOB SHARD_INDEX N: attempt N's attempt.json of JOB's shard
attempt_json() {
    local d
    d=$(find "$1/attempts" -mindepth 1 -maxdepth 1 -type d | sort | sed -n "$(($2 + 1))p")
    find "$d" -mindepth 2 -maxdepth 2 -path "*/$(printf %04d "$3")-*/attempt.json"
}
# probe_field JOB EXPR: EXPR on JOB's first probe (p)
probe_field() { python3 -c 'import json,sys; p=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$(probes "$1" | head -n 1)" "$2"; }
running_pid() {
    dstatus "$1"
    py '[a.get("pid") for a in j["attempts"]]' "$W/$1/status.json"
}

# ---- (b) the processor of a warm attempt killed with SIGKILL ----
new_job job-b 1 --max-retries 1
conf c
mode "hang 1"
spool c "$W/job-b"
start_daemon c
wait_for "(b) the attempt runs (its probe)" 20 nprobes "$W/job-b" 1
proc=$(probe_field "$W/job-b" 'p["pid"]')
STRAYS+=("$proc")
[ "$(probe_field "$W/job-b" 'p["forked"]')" = True ] || fail "(b) the attempt was forked"
[ "$(running_pid c)" = "[$proc]" ] ||
    fail "(b) esctl status names the forked processor" "$(running_pid c), probe: $proc"
kill -KILL "$proc"
wait_for "(b) the job completes after a retry" 30 complete "$W/job-b"
a1=$(attempt_json "$W/job-b" 0 1)
a2=$(attempt_json "$W/job-b" 0 2)
{ [ -n "$a1" ] && [ -n "$a2" ]; } || fail "(b) two attempts" "$(find "$W/job-b/attempts")"
got=$(py '"%s|%s|%s" % (j.get("status"), j.get("failure_class"), j.get("error"))' "$a1")
[[ $got == "failed|processor|"* ]] || fail "(b) the killed attempt failed, class processor" "$got"
[ "$(py 'j["status"]' "$a2")" = "done" ] || fail "(b) its retry is done" "$(cat "$a2")"
[ "$(py 'j["attempt_number"]' "$W"/job-b/state/done/*.json)" = 2 ] || fail "(b) done at attempt 2"
[ "$(grep -c 'forked by the warm processor' "$W/c/log")" -eq 2 ] ||
    fail "(b) both attempts were forked" "$(grep -E 'warm|started' "$W/c/log")"
mapfile -t wp < <(warm_pids c)
STRAYS+=("${wp[@]}")
[ "${#wp[@]}" -eq 1 ] || fail "(b) one warm processor all along" "${wp[*]}"
dead "$proc" || fail "(b) the killed processor is gone"
left=$(owner_procs)
[ "$left" = "${wp[0]}" ] || fail "(b) no process of the owner's but the warm processor ${wp[0]}" \
    "$(ps -o pid,ppid,pgid,stat,args -u "$OWNER_UID")"
ok "(b) SIGKILL of a warm attempt's processor: failed ($got), retried, done at attempt 2; only the warm processor is left"
mode ok
stop c

# ---- (c) the warm processor killed while an attempt runs ----
new_job job-c 3
conf d
mode hang
spool d "$W/job-c"
start_daemon d
wait_for "(c) the first attempt runs (its probe)" 20 nprobes "$W/job-c" 1
mapfile -t wp < <(warm_pids d)
STRAYS+=("${wp[@]}")
[ "${#wp[@]}" -eq 1 ] || fail "(c) one warm processor" "${wp[*]}"
proc=$(probe_field "$W/job-c" 'p["pid"]')
STRAYS+=("$proc")
kill -KILL "${wp[0]}"
# (its socket's end or its exit, whichever esd sees first)
ended() { grep -q 'warm processor: it \(was killed\|closed its socket\)' "$W/d/log"; }
wait_for "(c) esd logs the warm processor's end" 10 ended
alive "$proc" || fail "(c) the attempt's processor runs on without the warm processor"
# (the attempt goes on for longer than warm.c's backoff of 1 s after a
# failure, so the next attempt may have a new warm processor)
mode "sleep 1.5"
first_done() { [ "$(count "$W/job-c/state/done")" -ge 1 ]; }
wait_for "(c) the attempt whose warm processor died is done" 20 first_done
mode ok
wait_for "(c) the job completes" 30 complete "$W/job-c"
got=$(python3 -c 'import glob, json, sys
print(sorted((json.load(open(f))["attempt_number"]) for f in glob.glob(sys.argv[1] + "/state/done/*.json")))' \
    "$W/job-c")
[ "$got" = "[1, 1, 1]" ] || fail "(c) every shard done at its first attempt" "$got"
mapfile -t wp < <(warm_pids d)
STRAYS+=("${wp[@]}")
[ "${#wp[@]}" -ge 2 ] || fail "(c) a new warm processor was started" "$(grep warm "$W/d/log")"
[ "$(grep -c 'forked by the warm processor' "$W/d/log")" -ge 2 ] ||
    fail "(c) a later attempt was forked by the new warm processor" "$(grep -E 'warm|started' "$W/d/log")"
left=$(owner_procs)
[ "$left" = "${wp[-1]}" ] || fail "(c) no process of the owner's but the new warm processor ${wp[-1]}" \
    "$(ps -o pid,ppid,pgid,stat,args -u "$OWNER_UID")"
ok "(c) the warm processor killed mid-attempt: its end logged, the attempt done, a new warm processor (${wp[1]}) forked a later attempt"
stop d

# ---- (d) a warm processor that cannot serve ----
new_job job-d 5
conf e
touch "$ROOT/control/warm-thread"
# (each attempt outlasts warm.c's backoff, 1 s then 2 s: the first, the
# second and the fourth attempt each start a warm processor that fails)
mode "sleep 1"
spool e "$W/job-d"
start_daemon e
wait_for "(d) the job completes with exec'd attempts" 40 complete "$W/job-d"
rm "$ROOT/control/warm-thread"
mode ok
grep -q "warm processor: it cannot serve: 2 Python threads after the imports (MainThread, pydj-marker)" \
    "$W/e/log" || fail "(d) esd logs why the warm processor cannot serve" "$(grep warm "$W/e/log")"
grep -q "starting the attempt on its own" "$W/e/log" ||
    fail "(d) esd says it execs the attempt" "$(grep -E 'warm|started' "$W/e/log")"
grep -q "the warm processor failed 3 times in a row (last: it cannot serve: .*): this job's attempts are exec'd for the next 600 s" \
    "$W/e/log" || fail "(d) after three failures esd execs the job's attempts for 600 s" \
    "$(grep warm "$W/e/log")"
! grep -q 'forked by the warm processor' "$W/e/log" || fail "(d) no attempt was forked"
[ "$(grep -c 'started python3 (pid' "$W/e/log")" -eq 5 ] ||
    fail "(d) the 5 attempts were exec'd" "$(grep -E 'warm|started' "$W/e/log")"
[ "$(warm_pids e | wc -l)" -eq 3 ] ||
    fail "(d) no warm processor is started once disabled" "$(grep warm "$W/e/log")"
got=$(python3 -c 'import glob, json, sys
print(sorted(json.load(open(f))["forked"] for f in glob.glob(sys.argv[1] + "/attempts/*/*/probe-*.json")))' \
    "$W/job-d")
[ "$got" = "[False, False, False, False, False]" ] || fail "(d) the probes say exec'd" "$got"
cmp -s "$W/job-d/merged.jsonl" "$W/data.jsonl" || fail "(d) the merged output is the input"
ok "(d) a warm processor with a thread after its imports: refused (logged), 5 attempts exec'd, 3 failures then exec'd for 600 s; the job complete"
stop e

# ---- (e) SIGTERM to esd while warm attempts run ----
new_job job-e 2
conf f slots=2 drain_timeout_secs=1 attempt_kill_grace_secs=1
mode hang
spool f "$W/job-e"
start_daemon f
wait_for "(e) both attempts run (their probes)" 20 nprobes "$W/job-e" 2
mapfile -t wp < <(warm_pids f)
mapfile -t procs < <(for f in $(probes "$W/job-e"); do py 'j["pid"]' "$f"; py 'j["ppid"]' "$f"; done)
STRAYS+=("${wp[@]}" "${procs[@]}")
[ "$(grep -c 'forked by the warm processor' "$W/f/log")" -eq 2 ] || fail "(e) both attempts were forked"
t0=$(date +%s%N)
stop_daemon f
stopped=$((($(date +%s%N) - t0) / 1000000))
[ "$DRC" -eq 0 ] || fail "(e) esd exits 0 after its drain" "exit $DRC" "$(tail -n 20 "$W/f/log")"
[ "$stopped" -lt 8000 ] || fail "(e) esd exits within seconds of SIGTERM" "$stopped ms"
all_exited "${wp[@]}" "${procs[@]}" ||
    fail "(e) the warm processor ${wp[*]}, the attempts and their keepers (${procs[*]}) are gone"
left=$(owner_procs)
[ -z "$left" ] || fail "(e) nothing of the owner's is left" "$(ps -o pid,ppid,pgid,stat,args -u "$OWNER_UID")"
[ "$(count "$W/job-e/state/locks")" -eq 0 ] || fail "(e) the claims were released" "$(ls "$W/job-e/state/locks")"
[ "$(count "$W/job-e/state/failed")" -eq 0 ] || fail "(e) no failure was counted"
mode ok
ok "(e) SIGTERM during two hanging warm attempts: esd exited 0 in ${stopped} ms, claims released, no failure, nothing of the owner's left"

# ---- (f) claim-ahead: one slot, the next shard claimed before the last ends ----
new_job job-f 5
conf g slots=1
mode "sleep 1"
spool g "$W/job-f"
start_daemon g
wait_for "(f) the job completes" 60 complete "$W/job-f"
got=$(python3 - "$W/job-f" <<'PY'
import glob, json, sys
runs = []
for f in glob.glob(sys.argv[1] + "/attempts/*/*/attempt.json"):
    a = json.load(open(f))
    # (the processor's run; validation and publication come after it)
    runs.append((a["started_at_epoch"], a["processor_ended_at_epoch"], a["claimed_at_epoch"]))
runs.sort()
# one slot: the processors ran one after the other
overlap = sum(1 for p, n in zip(runs, runs[1:]) if n[0] < p[1] - 0.05)
# claim-ahead: the next was claimed before the last ended
ahead = sum(1 for p, n in zip(runs, runs[1:]) if n[2] < p[1])
print(len(runs), overlap, ahead)
PY
)
read -r nruns overlap ahead <<<"$got"
[ "$nruns" -eq 5 ] && [ "$overlap" -eq 0 ] ||
    fail "(f) five attempts, never two at once on one slot" "runs, overlaps, ahead: $got"
# (the first attempt starts the warm processor; the others are claimed ahead)
[ "$ahead" -ge 3 ] || fail "(f) the next shard was claimed before the last attempt ended" \
    "runs, overlaps, ahead: $got" "$(grep -E 'claimed|slot is free|started' "$W/g/log")"
[ "$(grep -c 'claimed ahead: it runs once a slot is free' "$W/g/log")" -ge 3 ] &&
    grep -q 'a slot is free: the attempt claimed ahead runs' "$W/g/log" ||
    fail "(f) esd logs the attempts claimed ahead and let run" "$(grep -E 'ahead|slot' "$W/g/log")"
cmp -s "$W/job-f/merged.jsonl" "$W/data.jsonl" || fail "(f) the merged output is the input"
ok "(f) claim-ahead: 5 attempts on one slot one after the other, $ahead of the next claimed before the last ended"
stop g
# a drain stops what waits for its slot: released, not counted
new_job job-g 3
conf h slots=1 drain_timeout_secs=30
mode "sleep 4"
spool h "$W/job-g"
start_daemon h
one_ahead() {
    dstatus h
    [ "$(py 'sum(1 for x in j["attempts"] if x["phase"] == "ahead")' "$W/h/status.json")" -ge 1 ]
}
wait_for "(f) an attempt waits for its slot (phase ahead)" 40 one_ahead
stop h
mode ok
grep -q 'released' "$W/h/log" || fail "(f) the attempt claimed ahead was released" "$(tail -n 20 "$W/h/log")"
[ "$(count "$W/job-g/state/locks")" -eq 0 ] || fail "(f) no claim is left" "$(ls "$W/job-g/state/locks")"
[ "$(count "$W/job-g/state/failed")" -eq 0 ] || fail "(f) no failure was counted"
[ -z "$(owner_procs)" ] || fail "(f) nothing of the owner's is left" "$(ps -o pid,ppid,pgid,stat,args -u "$OWNER_UID")"
ok "(f) a drain: the running attempt finishes, the one claimed ahead is released, no failure"

echo "# warm: $(($(date +%s) - T0)) s in all"
summary
