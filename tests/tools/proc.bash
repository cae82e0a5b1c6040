# shellcheck shell=bash
# proc.bash: the process helpers that tests/integration/lib.bash (the test
# harness) and scripts/demo (the newcomer's demo) share: waiting with a
# deadline, esd daemons started, pinged and stopped, process trees killed,
# and the real stack made runnable by nobody. Sourced, never run; sourcing
# only sets variables and defines functions.
#
# The sourcing script provides:
#   PROC_FAIL   the name of its error function, called as
#               "$PROC_FAIL" WHAT DETAIL... when a wait runs out or a daemon
#               dies; it should not return (lib.bash: fail, the demo: die).
#   W           the directory the daemons live in: $W/NAME/esd.yaml,
#               $W/NAME/esd.sock, their log $W/NAME/$DAEMON_LOG, $W/spool.
#   ESD, ESCTL  the programs (absolute paths).
#
# Waiting:
#   poll SECS CMD...           runs CMD every WAIT_POLL seconds (0.1 unless
#                              set) until it succeeds: 0; 1 once SECS seconds
#                              have passed.
#   wait_for WHAT SECS CMD...  poll, else "$PROC_FAIL" WHAT.
#   alive PID / dead PID       the process exists and is not a zombie / not.
#   all_exited PID...          none of them is alive.
#   group_gone PGID            no process of the group is alive (zombies aside).
#   group_vanished PGID        no process of the group is left, not even a
#                              zombie (kill -0 fails).
# Processes:
#   descendants PID            the pids below PID, recursively.
#   kill_tree PID...           SIGKILL to the process groups and processes
#                              below each PID, then to its group (or itself).
# Daemons (esd -f, one per simulated node; DPID[NAME] its pid, BG every pid
# started, for the caller's cleanup):
#   start_daemon NAME [ENV=VALUE...]
#                              starts esd on $W/NAME/esd.yaml with ENV, its
#                              output appended to $W/NAME/$DAEMON_LOG ("log"
#                              unless set), and waits until it answers ping.
#                              With DAEMON_AS=USER set and run as root, esd
#                              runs as USER (setpriv), who is given $W/NAME
#                              and the spool: the service-user deployment,
#                              which ray.mode persistent needs (esd refuses
#                              it as root).
#   stop_daemon NAME [SIGNAL]  SIGTERM (or SIGNAL), then reap_daemon NAME.
#   reap_daemon NAME           waits (60 s) until it exits; its exit status
#                              in DRC.
#   dsock NAME                 the daemon's socket.
# The real stack:
#   venv_for_nobody            as root, with VENV the real Data-Juicer and
#                              Ray: makes RAY and DJ (set by the caller) ones
#                              nobody can run, and gives nobody $W/home. A
#                              venv made by root from a Python nobody may not
#                              run (pyenv under /root, which is 0700) gets an
#                              overlay: a venv of the system Python of the same
#                              minor version in $W/venv, reading the venv's
#                              packages through a .pth file; then
#                              VENV_OVERLAY is that Python. Nothing when not
#                              root.

# ---- waiting ----
WAIT_POLL=0.1
poll() {
    local deadline
    deadline=$(($(date +%s) + $1))
    shift
    until "$@"; do
        [ "$(date +%s)" -le "$deadline" ] || return 1
        sleep "$WAIT_POLL"
    done
}
wait_for() {
    local what=$1
    shift
    # (the hook is called from here: lib.bash's fail knows a failed wait
    # by its caller's name, and ends the script even in keep-going mode)
    poll "$@" || "$PROC_FAIL" "$what" "not within the deadline"
}
alive() {
    local st
    st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
    [ -n "$st" ] && [ "$st" != Z ]
}
dead() { ! alive "$1"; }
all_exited() {
    local p
    for p in "$@"; do
        ! alive "$p" || return 1
    done
}
group_gone() {
    local p
    for p in $(pgrep -g "$1" 2>/dev/null || true); do
        ! alive "$p" || return 1
    done
}
group_vanished() { ! kill -0 -- "-$1" 2>/dev/null; }

# ---- processes ----
descendants() {
    local k
    for k in $(pgrep -P "$1" 2>/dev/null || true); do
        echo "$k"
        descendants "$k"
    done
}
kill_tree() {
    local p k
    for p in "$@"; do
        for k in $(descendants "$p"); do
            kill -KILL -- "-$k" 2>/dev/null || true
            kill -KILL "$k" 2>/dev/null || true
        done
        kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null || true
    done
}

# ---- daemons ----
declare -A DPID=()
BG=()
# shellcheck disable=SC2034 # read by the callers
DRC=0
DAEMON_LOG=${DAEMON_LOG:-log}
dsock() { echo "$W/$1/esd.sock"; }
daemon_up() {
    alive "${DPID[$1]}" || "$PROC_FAIL" "esd $1 starts" "it exited" "$(tail -n 20 "$W/$1/$DAEMON_LOG")"
    "$ESCTL" --socket "$(dsock "$1")" ping >/dev/null 2>&1
}
start_daemon() {
    local name=$1 as=()
    shift
    if [ -n "${DAEMON_AS:-}" ] && [ "$(id -u)" -eq 0 ]; then
        chmod 755 "$W"
        mkdir -p "$W/$name/state" "$W/spool"
        chown -R "$DAEMON_AS:" "$W/$name" "$W/spool"
        # (setpriv execs: the pid is esd's, so signals reach esd itself)
        as=(setpriv "--reuid=$DAEMON_AS" "--regid=$(id -g "$DAEMON_AS")" --clear-groups)
    fi
    env "$@" "${as[@]}" "$ESD" -f -c "$W/$name/esd.yaml" >>"$W/$name/$DAEMON_LOG" 2>&1 &
    DPID[$name]=$!
    BG+=("$!")
    wait_for "esd $name answers ping" 20 daemon_up "$name"
}
stop_daemon() {
    kill "-${2:-TERM}" "${DPID[$1]}"
    reap_daemon "$1"
}
reap_daemon() {
    wait_for "esd $1 exits" 60 dead "${DPID[$1]}"
    DRC=0
    # shellcheck disable=SC2034 # read by the callers
    { wait "${DPID[$1]}"; } 2>/dev/null || DRC=$?
}

# ---- the real stack ----
VENV_OVERLAY=
venv_for_nobody() {
    local minor site x
    [ "$(id -u)" -eq 0 ] || return 0
    chmod 755 "$W"
    # (runuser, not setpriv, tells: setpriv's child was seen to run a python
    # behind /root that esd's children could not)
    if ! runuser -u nobody -- "$VENV/bin/python" -c '' 2>/dev/null; then
        minor=$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
        VENV_OVERLAY=/usr/bin/python$minor
        [ -x "$VENV_OVERLAY" ] || "$PROC_FAIL" "nobody can run .venv's python, or $VENV_OVERLAY exists" \
            "$(readlink -f "$VENV/bin/python") is not executable by nobody"
        "$VENV_OVERLAY" -m venv --without-pip "$W/venv"
        site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        echo "$site" >"$W/venv/lib/python$minor/site-packages/esd-real.pth"
        for x in ray dj-process; do
            sed "1s|.*|#!$W/venv/bin/python|" "$VENV/bin/$x" >"$W/venv/bin/$x"
            chmod 755 "$W/venv/bin/$x"
        done
        # shellcheck disable=SC2034  # (the caller's)
        RAY=$W/venv/bin/ray
        # shellcheck disable=SC2034
        DJ=$W/venv/bin/dj-process
        runuser -u nobody -- "$W/venv/bin/python" -c 'import ray, data_juicer' ||
            "$PROC_FAIL" "nobody can run the overlay venv $W/venv"
    fi
    mkdir -p "$W/home"
    chown nobody: "$W/home"
}
