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
#       esd's open fds return to their number before. Then 1,000 from 40
#       uids: PROTO_MAX_CONNECTIONS served in all.
#   (e) with ESD_TEST_IDLE_SECS=3: a client that never sends and one that
#       sends a line a byte at a time are closed after the idle timeout, not
#       before, with nothing sent to them; other clients are served promptly
#       meanwhile, and one that keeps sending requests stays open.
#   (f) as nobody: drain, resume, submit, cancel, prepare, retry, merge are
#       "denied", each logged with nobody's uid and the client's pid;
#       status, list, ping, version and config are answered.
#   (g) both daemons stop on SIGTERM with status 0 (under ASan: no leak
#       report, no sanitizer error in their logs).
# Root is needed for (d) and (f) (setuid to nobody and other uids); they are
# skipped otherwise.
#
# Environment: TOP, ESD (esd binary; default $TOP/esd; a sanitizer build
# works), TOOLS (see lib.bash). esctl is not used.
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
    mapfile -t UIDS < <(seq 70001 70038)
    client "1000 connections from 40 uids" --deadline 120 flood "$S" 1000 root nobody "${UIDS[@]}"
    client "status after the second flood" status "$S"
    client "esd's fds after the second flood" fds "$P" "$BASE"

    # ---- (f) refusals ----
    client "node and job commands as nobody" refusals "$S" "$W/a/log"
    client "read commands as nobody" readers "$S"
else
    echo "# not root: the floods and refusals (setuid) are skipped"
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
