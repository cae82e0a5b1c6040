#!/usr/bin/env bash
# ctl_robust: the control socket of a real esd (ray.mode off, mini-dj as
# processor) against bad, greedy and slow clients, spoken to directly in
# Python (tests/tools/ctl-client), not through esctl. The socket has mode
# 0666 so that user nobody can connect. Every wait has a deadline.
#   (a) a line above PROTO_MAX_MESSAGE (more than 1 MiB without a newline;
#       a 2 MiB line) gets one "too-large" error with id -1, then the
#       connection is closed; a line of exactly the limit is answered.
#   (b) bad lines (not JSON, not an object, no or another "v", no or a
#       non-integer id, no cmd, an unknown command, esctl-only worker and
#       completion, arguments of the wrong type, unknown or relative) each
#       get their error code with the request's id where it could be read,
#       and the same connection answers a ping after each; ids (negative,
#       above 2^53, 2^63-1) are echoed exactly; error messages quoting a
#       long non-ASCII command, argument name or job_dir are valid UTF-8
#       (cut at a byte limit, they must not end inside a character).
#   (c) 100 requests pipelined in one write: 100 replies in order; a client
#       that half-closes after its requests still gets the replies.
#   (d) 1,000 connections opened at once, half by root and half by nobody:
#       each is served (a ping) or gets one "busy" line and is closed, none
#       hangs, PROTO_MAX_PER_UID served per uid; a fresh root ping meanwhile
#       is served or busy, and served after the flood; status is fine and
#       esd's open fds return to their number before.
#   (e) with ESD_TEST_IDLE_SECS=3: a client that never sends and one that
#       sends a line a byte at a time are closed after the idle timeout, not
#       before, with nothing sent to them; other clients are served promptly
#       meanwhile, and one that keeps sending requests stays open.
#   (f) as nobody: drain, resume, submit, cancel, prepare, retry, merge are
#       "denied", each logged with nobody's uid and the client's pid;
#       status, list, ping, version and config are answered.
#   (h) fair shares (common/proto.h), played by a throwaway user (useradd,
#       removed at exit) that owns a job with a shard's process.log:
#       operations: it asks for 16 `logs --follow`, PROTO_MAX_OPS_PER_UID
#       run and the rest are "busy" (request-level, naming its uid); 4 uids
#       without an account ask for 2 each, and run PROTO_MAX_OPS_PER_UID
#       together; nobody gets what is left of PROTO_MAX_OPS_UNPRIV; all the
#       while root's ping, `status <job>` (an operation), drain and resume
#       are served; the slots come back once they hang up. Connections:
#       through a user namespace with its subordinate uids (unshare
#       --user --map-auto, newuidmap from uidmap), 40 uids with 10 each:
#       PROTO_MAX_PER_UID served for all of them together (esd sees uids
#       without an account), and PROTO_MAX_PER_UID of 40 as itself; root's
#       ping, drain and resume and nobody's ping are served meanwhile; esd's
#       fds return to their number. Without newuidmap or user namespaces,
#       root sets the 40 uids without an account itself (what SO_PEERCRED
#       reports is the same), and says so.
#   (g) both daemons stop on SIGTERM with status 0 (under ASan: no leak
#       report, no sanitizer error in their logs).
# Root is needed for (d), (f) and (h) (setuid to nobody and other uids,
# useradd); they are skipped otherwise.
#
# Environment: TOP, ESD (esd binary; default $TOP/esd; a sanitizer build
# works), ESCTL (prepares (h)'s job), TOOLS (see lib.bash). The daemon is
# spoken to without esctl.
set -euo pipefail
export LC_ALL=C

# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

CLIENT="$TOP/tests/tools/ctl-client"

new_workdir
unset_knobs
{ [ -x "$MINI" ] && [ -x "$ESD" ]; } || fail "tools exist" "run make && make tools"

# Readiness by a ping from Python: this test does not depend on esctl.
daemon_up() {
    alive "${DPID[$1]}" || fail "esd $1 starts" "it exited" "$(tail -n 20 "$W/$1/log")"
    python3 "$CLIENT" --deadline 2 ping "$(dsock "$1")" >/dev/null 2>&1
}
# client WHAT SUBCOMMAND ARGS...: one check by ctl-client against daemon
# $CUR; ctl-client's line is the detail.
client() {
    local what=$1
    shift
    run python3 "$CLIENT" "$@"
    [ "$RC" -eq 0 ] || fail "$what" "$ERR" "$OUT" "esd's log: $(grep -v ' debug: ' "$W/$CUR/log" | tail -n 5)"
    ok "$what: $OUT"
}

ROOT=0
[ "$(id -u)" -eq 0 ] && ROOT=1

# fair_scripts: (h)'s two Python programs into W: fair.py (as root: the
# attackers and root's checks, with ctl-client's helpers) and ns-flood.py
# (run as the throwaway user inside its user namespace, hence standalone).
fair_scripts() {
    cat >"$W/fair.py" <<'EOF'
"""fair: (h) of ctl_robust.sh, as root. The fair shares of common/proto.h
against a real esd, played by attackers; the limits come from the daemon's
version reply.
    fair.py ops SOCK JOB SHARD USER    operation slots
    fair.py conns SOCK USER MODE       connections (MODE userns or simulate)
Prints one line on success; a Failure (stderr, exit 1) otherwise."""
import json
import os
import pwd
import signal
import subprocess
import sys
import time
import types

CLIENT = os.environ["CLIENT"]
ctlc = types.ModuleType("ctlc")
exec(compile(open(CLIENT).read(), CLIENT, "exec"), ctlc.__dict__)  # pylint: disable=exec-used
Conn, Failure, fail, req, check_reply = (ctlc.Conn, ctlc.Failure, ctlc.fail, ctlc.req,
                                         ctlc.check_reply)
DEADLINE = time.monotonic() + 90
RELEASES = []  # the release ends of the holding children: none may inherit another's


def limits(sock):
    c = Conn(sock, DEADLINE)
    v = c.call("version", 1, DEADLINE, ok=True)["result"]
    c.close()
    return v


def unknown_uids(n, start=70001):
    """n uids without an account: what SO_PEERCRED shows for a user namespace."""
    out, u = [], start
    while len(out) < n:
        try:
            pwd.getpwuid(u)
        except KeyError:
            out.append(u)
        u += 1
    return out


def hold(sock, user, n, request):
    """Forks a child as user (a name or a uid) that opens n connections and
    sends request on each; returns (pid, release fd, its report): how many
    got an event first (an operation runs), a reply ok, or busy (with the
    messages). The child holds its connections until release is closed."""
    rep_r, rep_w = os.pipe()
    rel_r, rel_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(rep_r), os.close(rel_w)
            for fd in RELEASES:
                os.close(fd)
            if user != "root":
                ctlc.become(user)
            conns, got = [], {"event": 0, "ok": 0, "busy": 0, "other": [], "why": []}
            for i in range(n):
                c = Conn(sock, DEADLINE)
                c.send(request(i), DEADLINE)
                conns.append(c)
            for c in conns:
                ln = c.line(DEADLINE, "the first line of a request")
                m = json.loads(ln) if ln else {}
                if "event" in m:
                    got["event"] += 1
                elif m.get("ok") is True:
                    got["ok"] += 1
                elif m.get("ok") is False and m["error"]["code"] == "busy":
                    check_reply(ln, code="busy")
                    got["busy"] += 1
                    got["why"].append(m["error"]["message"])
                else:
                    got["other"].append((ln or b"").decode(errors="replace")[:200])
            os.write(rep_w, json.dumps(got).encode() + b"\n")
            os.read(rel_r, 1)  # until the parent says (or ends)
            for c in conns:
                c.close()
        except BaseException as e:  # pylint: disable=broad-except
            os.write(rep_w, json.dumps({"error": "%s: %s" % (type(e).__name__, e)}).encode())
            code = 1
        os._exit(code)
    os.close(rep_w), os.close(rel_r)
    RELEASES.append(rel_w)
    with os.fdopen(rep_r, "rb") as f:
        got = json.loads(f.readline() or b'{"error": "the child said nothing"}')
    if "error" in got:
        fail("as %s: %s" % (user, got["error"]))
    if got["other"]:
        fail("as %s: unexpected replies: %s" % (user, got["other"][:3]))
    return pid, rel_w, got


def release(held):
    for pid, rel_w, _ in held:
        RELEASES.remove(rel_w)
        os.close(rel_w)
        os.waitpid(pid, 0)


def root_is_served(sock, job, what):
    """Root's ping, status of the job (an operation), drain and resume."""
    c = Conn(sock, DEADLINE)
    c.call("ping", 1, DEADLINE, ok=True)
    st = c.call("status", 2, DEADLINE, args={"job_dir": job}, ok=True)["result"] if job else None
    if job and "counts" not in st:
        fail("root's status of %s: %s" % (job, json.dumps(st)[:300]))
    if c.call("drain", 3, DEADLINE, ok=True)["result"].get("held") is not True:
        fail("root's drain %s did not hold the node" % what)
    if c.call("resume", 4, DEADLINE, ok=True)["result"].get("held") is not False:
        fail("root's resume %s did not resume the node" % what)
    c.close()
    return "ping, %sdrain and resume" % ("status <job>, " if job else "")


def expect(got, user, running, key, want_busy, why):
    if got[key] != running or got["busy"] != want_busy:
        fail("as %s: %d served and %d busy, expected %d and %d (%s)"
             % (user, got[key], got["busy"], running, want_busy, got["why"][:2]))
    if want_busy and not all(why in w for w in got["why"]):
        fail("as %s: busy without \"%s\": %s" % (user, why, got["why"][:2]))


def cmd_ops(sock, job, shard, user):
    v = limits(sock)
    per, unpriv = v["max_operations_per_uid"], v["max_operations_unprivileged"]
    uid = pwd.getpwnam(user).pw_uid

    def follow(i):
        return req("logs", i, {"job_dir": job, "shard": shard, "follow": True})
    held = []
    # one user's logs --follow calls: its share, no more
    n = per * 4
    held.append(hold(sock, user, n, follow))
    expect(held[-1][2], user, per, "event", n - per, "of uid %d (at most %d)" % (uid, per))
    # uids without an account, 2 calls each: one share for all of them
    pool = unknown_uids(per)
    for u in pool:
        held.append(hold(sock, u, 2, follow))
    ran = sum(h[2]["event"] for h in held[1:])
    if ran != per:
        fail("%d uids without an account ran %d operations, expected %d together"
             % (len(pool), ran, per))
    why = [w for h in held[1:] for w in h[2]["why"]]
    if len(why) != 2 * len(pool) - per or not all("uids without an account" in w for w in why):
        fail("the pool's busy replies: %s" % why[:3])
    # nobody fills what is left of the unprivileged part
    left = unpriv - 2 * per
    held.append(hold(sock, "nobody", per, follow))
    expect(held[-1][2], "nobody", left, "event", per - left, "of unprivileged users")
    served = root_is_served(sock, job, "while the unprivileged part is full")
    release(held)
    # and the slots come back: the user may follow again
    while True:
        pid, rel, got = hold(sock, user, 1, follow)
        release([(pid, rel, got)])
        if got["event"] == 1:
            break
        if time.monotonic() > DEADLINE:
            fail("as %s: still busy after the others went: %s" % (user, got["why"]))
        time.sleep(0.1)
    return ("%s held %d logs --follow of %d (the rest busy), %d uids without an account %d "
            "together, nobody %d (the unprivileged %d); root's %s were served meanwhile; the "
            "slots came back after" % (user, per, n, len(pool), per, left, unpriv, served))


def cmd_conns(sock, user, mode):
    """As user: 40 uids of its user namespace (or, simulated, 40 uids without an
    account set by root) with 10 connections each, and 40 as itself."""
    v = limits(sock)
    per = v["max_connections_per_uid"]
    pw = pwd.getpwnam(user)
    inner = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ns-flood.py")
    if mode == "userns":
        argv = ["setpriv", "--reuid=%d" % pw.pw_uid, "--regid=%d" % pw.pw_gid, "--init-groups",
                "unshare", "--user", "--map-auto", "--map-root-user",
                "python3", inner, sock, "40", "10", "40"]
    else:
        argv = ["python3", inner, sock, "40", "10", "40", "--uids"] + \
            [str(u) for u in unknown_uids(40)] + ["--self", str(pw.pw_uid)]
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    ln = p.stdout.readline()
    try:
        got = json.loads(ln)
    except ValueError:
        p.kill()
        fail("the flood said %r (exit %s)" % (ln[:300], p.wait()))
    if "error" in got:
        fail("the flood: %s" % got["error"])
    # what esd saw: every namespaced uid without an account
    for u in got["outside"]:
        try:
            fail("uid %d of the namespace has an account (%s): not the attack"
                 % (u, pwd.getpwuid(u).pw_name))
        except KeyError:
            pass
    if got["self_served"] != per or got["ns_served"] != per:
        fail("as %s: %d of its own connections and %d of its %d namespace uids' served, "
             "expected %d each" % (user, got["self_served"], got["ns_served"], len(got["outside"]),
                                   per))
    if not all("uids without an account" in w for w in got["ns_why"]) or \
            not all("of uid %d " % pw.pw_uid in w for w in got["self_why"]):
        fail("busy messages: %s / %s" % (got["ns_why"][:1], got["self_why"][:1]))
    served = root_is_served(sock, None, "during the flood")
    # a user with an account of its own keeps its own share
    pid, rel, nb = hold(sock, "nobody", 1, lambda i: req("ping", i))
    release([(pid, rel, nb)])
    if nb["ok"] != 1:
        fail("nobody's ping during the flood: %s" % nb["why"])
    p.stdin.close()
    if p.wait() != 0:
        fail("the flood exited with status %d" % p.returncode)
    return ("%s: 40 uids %s (uids %d..%d as esd sees them, no account) with 10 connections "
            "each got %d served in all, %d as itself; root's %s and nobody's ping were served "
            "meanwhile"
            % (mode, "of its user namespace" if mode == "userns" else "set by root",
               min(got["outside"]), max(got["outside"]), got["ns_served"], got["self_served"],
               served))


def hang(signum, frame):
    raise Failure("no result within 120 s (a hang)")


if __name__ == "__main__":
    signal.signal(signal.SIGALRM, hang)
    signal.alarm(120)
    try:
        print({"ops": cmd_ops, "conns": cmd_conns}[sys.argv[1]](*sys.argv[2:]))
    except (Failure, OSError) as e:
        sys.stderr.write("%s: %s\n" % (sys.argv[1], e))
        sys.exit(1)
EOF
    cat >"$W/ns-flood.py" <<'EOF'
"""ns-flood: run by fair.py, inside a user namespace (unshare --user
--map-auto --map-root-user: uid 0 here is the user, 1.. its subordinate
uids) or, simulated, as root. For each of NUIDS uids (1..NUIDS, or those of
--uids) a child setuid()s to it and opens PER connections with a ping; the
process itself (or --self UID) opens SELF. Prints one JSON line with what
was served and refused, and what uids esd sees (from /proc/self/uid_map),
then holds every connection until stdin ends. Standalone: ctl-client is not
readable from inside the namespace."""
import json
import os
import socket
import sys
import time

sock, nuids, per, nself = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
uids = list(range(1, nuids + 1))
selfuid = None
if "--uids" in sys.argv:
    i = sys.argv.index("--uids")
    uids = [int(u) for u in sys.argv[i + 1:i + 1 + nuids]]
if "--self" in sys.argv:
    selfuid = int(sys.argv[sys.argv.index("--self") + 1])
deadline = time.monotonic() + 60


def outside(u):
    """u as the init namespace sees it."""
    for ln in open("/proc/self/uid_map"):
        inner, out, n = (int(x) for x in ln.split())
        if inner <= u < inner + n:
            return out + u - inner
    return u


def flood(n):
    conns, served, why = [], 0, []
    for i in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(max(0.1, deadline - time.monotonic()))
        s.connect(sock)
        try:
            s.sendall(b'{"v":1,"id":%d,"cmd":"ping"}\n' % i)
        except (BrokenPipeError, ConnectionResetError):
            pass
        conns.append(s)
    for s in conns:
        buf = b""
        while b"\n" not in buf:
            d = s.recv(65536)
            if not d:
                break
            buf += d
        m = json.loads(buf.split(b"\n")[0])
        if m.get("ok"):
            served += 1
        elif m["error"]["code"] == "busy":
            why.append(m["error"]["message"])
        else:
            raise RuntimeError("unexpected reply %r" % buf[:200])
    return conns, served, why


try:
    kids = []
    for u in uids:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            if selfuid is not None:  # simulated, as root: no groups of root's
                os.setgroups([])
                os.setgid(u)
            os.setuid(u)
            conns, served, why = flood(per)
            os.write(w, json.dumps({"served": served, "why": why}).encode() + b"\n")
            sys.stdin.read()  # hold until the end of stdin
            os._exit(0)
        os.close(w)
        kids.append((pid, os.fdopen(r, "rb")))
    res = [json.loads(f.readline() or b'{"served": 0, "why": ["the child died"]}')
           for _, f in kids]
    if selfuid is not None:
        os.setgroups([])
        os.setgid(selfuid)
        os.setuid(selfuid)
    conns, served, why = flood(nself)
    print(json.dumps({"outside": [outside(u) for u in uids],
                      "ns_served": sum(x["served"] for x in res),
                      "ns_why": [w for x in res for w in x["why"]],
                      "self_served": served, "self_why": why}), flush=True)
    sys.stdin.read()
    for pid, _ in kids:
        os.waitpid(pid, 0)
except Exception as e:  # pylint: disable=broad-except
    print(json.dumps({"error": "%s: %s" % (type(e).__name__, e)}), flush=True)
    sys.exit(1)
EOF
    chmod 644 "$W/fair.py" "$W/ns-flood.py"
}
# nobody must reach the sockets in W
chmod 755 "$W"

daemon_conf a socket_mode='"0666"'
start_daemon a
CUR=a
ok "esd a answers ping (socket mode 0666)"
S=$(dsock a)
[ "$(stat -c %a "$S")" = 666 ] || fail "the socket has mode 0666" "$(stat -c %a "$S")"

# ---- (a) too large ----
client "oversized requests" oversized "$S"
client "a line of exactly the limit" boundary "$S"

# ---- (b) bad lines ----
client "bad requests" malformed "$S"
client "request ids" ids "$S"
client "error messages quoting non-ASCII" utf8 "$S"

# ---- (c) pipelining, half-close ----
client "pipelined requests" pipeline "$S"
client "half-closed client" halfclose "$S"

if [ "$ROOT" -eq 1 ]; then
    # ---- (d) floods ----
    P=${DPID[a]}
    BASE=$(python3 "$CLIENT" count-fds "$P")
    client "1000 connections, root and nobody" --deadline 120 flood "$S" 1000 root nobody
    client "status after the flood" status "$S"
    client "esd's fds after the flood" fds "$P" "$BASE"

    # ---- (f) refusals ----
    client "node and job commands as nobody" refusals "$S" "$W/a/log"
    client "read commands as nobody" readers "$S"

    # ---- (h) fair shares ----
    fair_scripts
    FAIR=esdfair$$
    useradd -M -s /usr/sbin/nologin "$FAIR" || fail "useradd $FAIR"
    trap 'cleanup; userdel -f "$FAIR" 2>/dev/null || true' EXIT
    text_dataset 40
    prepare_job "$W/fair-job" 2
    SHARD=$(py 'sorted(j["shards"], key=lambda s: s["index"])[0]["id"]' "$W/fair-job/manifest.json")
    mkdir -p "$W/fair-job/attempts/$SHARD/0001-0123456789abcdef0123456789abcdef"
    echo "a line of the attempt" >"$W/fair-job/attempts/$SHARD/0001-0123456789abcdef0123456789abcdef/process.log"
    chown -R "$FAIR:" "$W/fair-job"
    export CLIENT
    run python3 "$W/fair.py" ops "$S" "$W/fair-job" "$SHARD" "$FAIR"
    [ "$RC" -eq 0 ] || fail "operation slots shared fairly" "$ERR" "$(grep -v ' debug: ' "$W/a/log" | tail -n 5)"
    ok "operation slots: $OUT"
    client "status after the operations" status "$S"
    MODE=simulate
    if command -v newuidmap >/dev/null &&
        setpriv --reuid="$FAIR" --regid="$(id -g "$FAIR")" --init-groups \
            unshare --user --map-auto --map-root-user true 2>/dev/null; then
        MODE=userns
    else
        echo "# no user namespaces with subordinate uids here (uidmap missing?): root sets the uids"
    fi
    run python3 "$W/fair.py" conns "$S" "$FAIR" "$MODE"
    [ "$RC" -eq 0 ] || fail "connections shared fairly ($MODE)" "$ERR" "$(grep -v ' debug: ' "$W/a/log" | tail -n 5)"
    ok "connections, $OUT"
    client "status after the namespace flood" status "$S"
    client "esd's fds after the namespace flood" fds "$P" "$BASE"
else
    echo "# not root: the floods, refusals and fair shares (setuid, useradd) are skipped"
fi

# ---- (e) idle clients ----
daemon_conf b socket_mode='"0666"'
start_daemon b ESD_TEST_IDLE_SECS=3
CUR=b
S=$(dsock b)
client "stalled clients" stall "$S" 3

# ---- (g) a clean exit ----
for n in a b; do
    stop_daemon "$n"
    [ "$DRC" -eq 0 ] || fail "esd $n exits with status 0" "status $DRC" "$(tail -n 20 "$W/$n/log")"
    ! grep -qE 'Sanitizer|runtime error:' "$W/$n/log" ||
        fail "esd $n: no sanitizer report" "$(grep -E -A5 'Sanitizer|runtime error' "$W/$n/log" | head -n 20)"
done
ok "both daemons stopped on SIGTERM with status 0, no sanitizer report"

summary
