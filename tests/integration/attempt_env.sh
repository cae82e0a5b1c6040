#!/usr/bin/env bash
# attempt_env: what an attempt inherits from esd (issue 11, class 10; class
# 4 for its groups). One esd is started with secrets in its environment
# (ESD_TEST_SECRET, HF_TOKEN, its own HOME, USER, SHELL, TMPDIR,
# PYTHONPATH, XDG_CACHE_HOME, HF_HOME), with variables that attempt_env
# lists (a name and a PREFIX* pattern) and one that only looks like the
# pattern, and with two descriptors open without O_CLOEXEC (a secret file,
# a pipe). The test stand-in mini-dj (not Data-Juicer) records what every
# attempt got (MINI_DJ_RECORD):
#   (a) its environment holds only the listed variables of esd's (with
#       their values), HOME, USER, LOGNAME and SHELL from the passwd entry
#       of the user it runs as, esd's PATH and spec §8.4's variables
#       (XDG_CACHE_HOME and HF_HOME in the job, not esd's); no value holds
#       a secret;
#   (b) it has descriptors 0, 1 and 2 only, and no ignored or blocked
#       signal (esd ignores SIGPIPE);
#   (c) as root, the owner is a throwaway user with a supplementary group,
#       and the job directory belongs (setgid) to a group that user is not
#       in: the attempt runs with the user's uid, primary group and group
#       list from the user database, not the directory's group; and a job
#       whose owner has no passwd entry is refused, with the reason in the
#       log, before anything runs.
#
# Environment: TOP, ESCTL, ESD, TOOLS (see lib.bash).
set -euo pipefail
export LC_ALL=C

# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

new_workdir
unset_knobs ESD_TEST_SECRET HF_TOKEN MY_LISTED MY_PFX_ONE MY_PFX_TWO MY_PFXNOT
need_daemon_tools

OWNER=$(id -un)
if [ "$(id -u)" -eq 0 ]; then
    # a user with a group of its own and a supplementary one; a third group
    # it is not in owns the job directory
    OWNER=esdenv$$
    groupadd "${OWNER}x"
    groupadd "${OWNER}d"
    useradd -M -d "$W/home-of-$OWNER" -s /bin/false -G "${OWNER}x" "$OWNER"
    drop_users() {
        userdel "$OWNER" 2>/dev/null || true
        groupdel "${OWNER}x" 2>/dev/null || true
        groupdel "${OWNER}d" 2>/dev/null || true
        groupdel "$OWNER" 2>/dev/null || true
    }
    trap 'cleanup; drop_users' EXIT
    chmod 755 "$W"
fi

text_dataset 40
JOB=$W/job
prepare_job "$JOB" 2
REC=$W/rec
mkdir -m 1777 "$REC"
if [ "$(id -u)" -eq 0 ]; then
    chown -R "$OWNER:${OWNER}d" "$JOB"
    find "$JOB" -type d -exec chmod g+s {} +
fi
echo "a secret only esd may read" >"$W/secret"
chmod 600 "$W/secret"
mkfifo "$W/fifo"

daemon_conf a "attempt_env=[$DAEMON_ATTEMPT_ENV, MY_LISTED, MY_PFX_*]"
MARKED_PATH="$W/marker-bin:$PATH"
# descriptors 7 and 8 open in esd without O_CLOEXEC (bash's redirections)
exec 7<"$W/secret" 8<>"$W/fifo"
start_daemon a ESD_TEST_SECRET=s3cret-env HF_TOKEN=hf_s3cret MY_LISTED=listed MY_PFX_ONE=1 \
    MY_PFX_TWO=2 MY_PFXNOT=s3cret-near HOME=/s3cret/home USER=s3cret-user LOGNAME=s3cret-user \
    SHELL=/s3cret/shell TMPDIR=/s3cret/tmp PYTHONPATH=/s3cret/py XDG_CACHE_HOME=/s3cret/cache \
    HF_HOME=/s3cret/hf "PATH=$MARKED_PATH" "MINI_DJ_RECORD=$REC/record.jsonl"
exec 7<&- 8<&-
[ -e "/proc/${DPID[a]}/fd/7" ] && [ -e "/proc/${DPID[a]}/fd/8" ] ||
    fail "esd holds descriptors 7 and 8" "$(ls -l "/proc/${DPID[a]}/fd")"
ok "esd started with secrets in its environment and descriptors 7 and 8 open"

finalized() {
    [ -e "$1/state/esd/finalize.json" ] && [ "$(py 'j["status"]' "$1/state/esd/finalize.json")" = complete ]
}
spool_job "$JOB"
wait_for "esd a finishes the job" 60 finalized "$JOB"
ok "the job of $OWNER is complete"

python3 - "$REC/record.jsonl" "$JOB" "$MARKED_PATH" "$(id -u)" "$DAEMON_ATTEMPT_ENV" <<'EOF' ||
import json, os, pwd, sys
rec, job, path, euid, allow = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
patterns = [p.strip() for p in allow.split(",")] + ["MY_LISTED", "MY_PFX_*"]
fixed = {"HOME", "USER", "LOGNAME", "SHELL", "PATH", "DJ_PRODUCED_DATA_DIR", "XDG_CACHE_HOME",
         "HF_HOME"}
runs = [json.loads(l) for l in open(rec)]
assert len(runs) == 2, "%d attempts recorded, 2 shards" % len(runs)
for r in runs:
    env = dict(e.split("=", 1) for e in r["environ"])
    listed = lambda n: any(n.startswith(p[:-1]) if p.endswith("*") else n == p for p in patterns)
    extra = sorted(n for n in env if n not in fixed and not listed(n))
    assert not extra, "variables that attempt_env does not list: %s" % extra
    leaked = sorted(e for e in r["environ"] if "s3cret" in e)
    assert not leaked, "esd's secrets reached the attempt: %s" % leaked
    for gone in ("ESD_TEST_SECRET", "HF_TOKEN", "MY_PFXNOT", "TMPDIR", "PYTHONPATH"):
        assert gone not in env, gone
    assert (env["MY_LISTED"], env["MY_PFX_ONE"], env["MY_PFX_TWO"]) == ("listed", "1", "2"), env
    assert env["PATH"] == path, env["PATH"]
    st = r["status"]
    uid, gid = int(st["Uid"].split()[0]), int(st["Gid"].split()[0])
    pw = pwd.getpwuid(uid)
    want = {"HOME": pw.pw_dir, "USER": pw.pw_name, "LOGNAME": pw.pw_name,
            "SHELL": pw.pw_shell or "/bin/sh"}
    got = {k: env.get(k) for k in want}
    assert got == want, "login variables %s, passwd says %s" % (got, want)
    assert env["XDG_CACHE_HOME"] == job + "/cache", env["XDG_CACHE_HOME"]
    assert env["HF_HOME"] == job + "/cache/huggingface", env["HF_HOME"]
    assert env["DJ_PRODUCED_DATA_DIR"].startswith(job + "/attempts/"), env["DJ_PRODUCED_DATA_DIR"]
    assert r["fds"] == [0, 1, 2], "descriptors %s" % r["fds"]
    assert int(st["SigIgn"], 16) == 0 and int(st["SigBlk"], 16) == 0, st
    if euid == 0:
        owner = os.stat(job).st_uid
        assert uid == owner and st["Uid"].split() == [str(owner)] * 4, st["Uid"]
        assert st["Gid"].split() == [str(pw.pw_gid)] * 4, "gid %s, passwd says %d" % (
            st["Gid"], pw.pw_gid)
        assert gid != os.stat(job).st_gid
        groups = sorted(int(g) for g in st["Groups"].split())
        assert groups == sorted(set(os.getgrouplist(pw.pw_name, pw.pw_gid))), (
            "groups %s, the user database says %s" % (groups, os.getgrouplist(pw.pw_name, pw.pw_gid)))
        assert len(groups) == 2, groups
EOF
    fail "what the attempts got" "$(cat "$REC/record.jsonl")"
ok "attempts got only the listed variables, HOME/USER/LOGNAME/SHELL of their user, esd's PATH and spec §8.4's"
ok "attempts got descriptors 0-2 only, no ignored or blocked signal"
if [ "$(id -u)" -eq 0 ]; then
    ok "attempts ran as $OWNER with its primary group and group list, not the job directory's group"

    # an owner the user database does not know: refused before anything runs
    GHOST=$W/ghost
    prepare_job "$GHOST" 1
    for u in $(seq 3999000000 3999000100); do getent passwd "$u" >/dev/null || break; done
    chown -R "$u:$u" "$GHOST"
    spool_job "$GHOST"
    refused() { grep -q "uid $u has no entry in the user database" "$W/a/log"; }
    wait_for "esd a refuses to run an attempt for uid $u" 30 refused
    n=$(wc -l <"$REC/record.jsonl")
    [ "$n" -eq 2 ] || fail "nothing ran for the unknown owner" "$n attempts recorded"
    ok "an attempt of an owner without a passwd entry (uid $u) is refused, with the reason in the log"
fi
stop_daemon a
summary
