#!/usr/bin/env bash
# nspawn: esd under a real systemd. A throwaway container boots the host's
# own OS (systemd-nspawn --volatile=yes -D /: a tmpfs root, the host's /usr
# read-only; of the host, only the test's directory is written) with esd
# installed by `make install DESTDIR=$W/root PREFIX=/usr` laid over its /usr
# (--overlay-ro; the installed esd and esctl replaced by $ESD and $ESCTL if
# they differ), so systemd-sysusers makes the user esd from the installed
# sysusers snippet at boot. The test's drop-in (ReadWritePaths=/srv/esd, the
# job area, as an operator adds a shared mount) and esd.yaml (ray.mode off,
# the test stand-in mini-dj as processor, drain_timeout_secs 1) are bound
# in. Every command inside runs through nsenter; every wait polls with a
# deadline.
#   (t) the README's "A five-minute tour", its commands as written (read
#       from README.md with its esd.yaml and drop-in; the stand-ins as
#       /opt/esd/venv/bin/dj-process and ray, /mnt/shared a directory of
#       the test), on units not yet enabled: the spool and jobs directories
#       made esd's, `esd --check-config` as root checks as user esd under
#       the unit's sandbox, `systemctl enable --now esd`, `systemctl reload
#       esd` after a change (slots 3 in effect) and after an unknown key
#       (the reload fails, esd runs on with slots 3), a 64-shard job
#       submitted --everywhere, watched to its end, retried, verified and
#       merged twice (as computed independently); then `esd --check-config
#       --unit esd.service` reports a metrics.path under ProtectSystem=strict
#       with its ReadWritePaths= drop-in, and a processor under /home with
#       ProtectHome=yes; the units are disabled again and the state removed;
#   (a) `systemctl enable --now esd.socket esd.service`: esd.service is
#       active, runs as user esd, serves the socket passed by esd.socket,
#       restricts no device (no DeviceAllow=: GPUs stay reachable), and
#       `systemctl status esd` shows its STATUS= line;
#   (b) a 3-shard job, prepared by user esd in /srv/esd and submitted with
#       esctl by root, is worked and merged (the merge as computed
#       independently); `journalctl -u esd ESD_SHARD=<id>` returns exactly
#       that shard's lines, "[job-a <shard>#1] claimed", "... started" and
#       "... done:" among them, claimed and done with their MESSAGE_ID;
#   (c) `systemctl reload esd` with ray.mode persistent (the stand-in
#       fake-ray): the journal says "reloaded" once more, the main pid stays, and the
#       Ray head comes up under the hardened unit (TCP on loopback);
#   (d) `systemctl stop esd.service` exits cleanly (Result=success, status
#       0) and leaves esd.socket's socket in place; the next `esctl ping`
#       starts esd again through the socket;
#   (e) a drop-in runs `esd --test-hang-watchdog` with WatchdogSec=2:
#       systemd kills it with SIGABRT ("Watchdog timeout" in the journal)
#       and restarts it (Restart=on-failure), a new pid;
#   (f) with Environment=MINI_DJ_HANG=1 (for the job hang-job only) a shard
#       hangs; `systemctl stop esd` drains (drain_timeout_secs 1), stops the
#       attempt and releases its claim: no lock file left, no failure
#       counted, no mini-dj left, Result=success;
#   (g) the root variant, the drop-in of systemd/README.md as it is written
#       there, with ray.mode per-attempt: a job owned by nobody is worked as
#       nobody.
# Skipped with "# skip: ..." unless run as root with systemd-nspawn
# (package systemd-container), nsenter and setpriv, or if systemd-nspawn
# cannot run even /bin/true in a container on this machine.
#
# Environment: TOP, ESCTL, ESD, TOOLS, JSONL_CHECK (see lib.bash).
set -euo pipefail
export LC_ALL=C

# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

[ "$(id -u)" -eq 0 ] || skip "not root (systemd-nspawn needs root)"
for t in systemd-nspawn nsenter setpriv make; do
    command -v "$t" >/dev/null || skip "no $t (systemd-nspawn is in package systemd-container)"
done
[ -x /lib/systemd/systemd ] || skip "no /lib/systemd/systemd to boot"

new_workdir
unset_knobs
need_daemon_tools
T0=$(date +%s)
elapsed() { echo "$(($(date +%s) - T0)) s"; }

# ---- install into a DESTDIR that becomes the container's /usr and /etc/esd ----
R="$W/root"
make -C "$TOP" --no-print-directory install DESTDIR="$R" PREFIX=/usr \
    UNITDIR=/usr/lib/systemd/system SYSUSERSDIR=/usr/lib/sysusers.d >"$W/install.log" 2>&1 ||
    fail "make install DESTDIR=$R PREFIX=/usr" "$(tail -n 20 "$W/install.log")"
for f in usr/sbin/esd usr/bin/esctl usr/lib/systemd/system/esd.service \
    usr/lib/systemd/system/esd.socket usr/lib/sysusers.d/esd.conf etc/esd/esd.yaml; do
    [ -e "$R/$f" ] || fail "make install installs /$f"
done
grep -qx 'ExecStart=/usr/sbin/esd' "$R/usr/lib/systemd/system/esd.service" ||
    fail "the installed unit runs /usr/sbin/esd" "$(grep Exec "$R/usr/lib/systemd/system/esd.service")"
# the binaries under test (a sanitizer build, say), if make installed others
cmp -s "$ESD" "$R/usr/sbin/esd" || install -m 0755 "$ESD" "$R/usr/sbin/esd"
cmp -s "$ESCTL" "$R/usr/bin/esctl" || install -m 0755 "$ESCTL" "$R/usr/bin/esctl"
ok "make install DESTDIR=\$W/root PREFIX=/usr: esd, esctl, units (ExecStart=/usr/sbin/esd), sysusers, esd.yaml"

# The test's esd.yaml and drop-in. /srv/esd is the "shared mount".
conf() {
    cat >"$R/etc/esd/esd.yaml" <<EOF
# nspawn.sh: the test stand-in mini-dj as processor; ${1:-off} Ray
node_name: ct
slots: 1
lease_secs: 10
poll_interval_secs: 1
processor: /opt/esd-test/tools/mini-dj
attempt_env: [LANG, LC_*, MINI_DJ_*, ASAN_OPTIONS]
drain_timeout_secs: 1
log:
  level: debug
ray:
  mode: ${1:-off}
  command: /opt/esd-test/stand-ins/fake-ray
  port: $RAY_PORT
EOF
}
# the container shares the host's network: a port free here
RAY_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
conf off
DROPIN="$W/dropin"
mkdir -p "$DROPIN" "$W/srv"
cat >"$DROPIN/test.conf" <<'EOF'
# nspawn.sh: the job area, as an operator adds a shared mount; a hanging
# processor for the job hang-job only; no leak check in a sanitizer build
# (LeakSanitizer needs ptrace, which SystemCallFilter= denies).
[Unit]
RequiresMountsFor=/srv/esd
[Service]
ReadWritePaths=/srv/esd
Environment=MINI_DJ_HANG=1 MINI_DJ_ONLY=hang-job ASAN_OPTIONS=detect_leaks=0
EOF
# the tour's data, recipe and stand-ins (section t)
text_dataset 320
mkdir -p "$W/shared/raw" "$W/shared/recipes" "$W/tour-data" "$W/venv/bin"
cp "$W/data.jsonl" "$W/shared/raw/"
cp "$W/recipe.yaml" "$W/shared/recipes/clean.yaml"
cp "$W/data.jsonl" "$W/kept.txt" "$W/expected.jsonl" "$W/tour-data/"
ln -s /opt/esd-test/tools/mini-dj "$W/venv/bin/dj-process"
ln -s /opt/esd-test/stand-ins/fake-ray "$W/venv/bin/ray"
text_dataset 60
cp "$W/data.jsonl" "$W/recipe.yaml" "$W/srv/"

# ---- boot ----
# Can this machine run a container at all? (If not, skip; if it can, a
# failed boot below is a failure.)
probe=$(systemd-nspawn --quiet --volatile=yes -D / --keep-unit --register=no --machine="esd-probe-$$" \
    --console=pipe /bin/true </dev/null 2>&1) ||
    skip "systemd-nspawn cannot run a container here: $(echo "$probe" | tail -n 3 | tr '\n' ' ')"
# --volatile=yes: the root is a tmpfs, /usr the host's (read-only), with
# the DESTDIR's usr/ laid over it. First boot: systemd-sysusers makes esd,
# presets enable units; systemd.firstboot=off keeps the wizard quiet.
systemd-nspawn --quiet --volatile=yes -D / --keep-unit --register=no --machine="esd-test-$$" \
    --console=read-only --overlay-ro="/usr:$R/usr:/usr" \
    --bind-ro="$TOOLS:/opt/esd-test/tools" --bind-ro="$TOP/tests/tools:/opt/esd-test/stand-ins" \
    --bind="$W/srv:/srv/esd" --bind="$R/etc/esd:/etc/esd" \
    --bind="$W/shared:/mnt/shared" --bind-ro="$W/venv:/opt/esd/venv" \
    --bind="$DROPIN:/etc/systemd/system/esd.service.d" \
    -b systemd.firstboot=off </dev/null >"$W/boot.log" 2>&1 &
NSPAWN=$!
BG+=("$NSPAWN")
CT=""
in_ct() {
    nsenter --target "$CT" --all -- env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C \
        SYSTEMD_PAGER= SYSTEMD_COLORS=0 "$@"
}
booted() {
    alive "$NSPAWN" || fail "systemd-nspawn boots the container" "it exited" "$(tail -n 20 "$W/boot.log")"
    if [ -z "$CT" ]; then
        # the child of nspawn that is systemd (nspawn forks short-lived
        # helpers first)
        local p
        for p in $(pgrep -P "$NSPAWN" || true); do
            [ "$(readlink "/proc/$p/exe" 2>/dev/null)" != /usr/lib/systemd/systemd ] || CT=$p
        done
        [ -n "$CT" ] || return 1
        STRAYS+=("$CT") # killing PID 1 of the container ends all of it
    fi
    local st
    st=$(in_ct systemctl is-system-running 2>/dev/null) || true
    [ "$st" = running ] || [ "$st" = degraded ]
}
deadline=$(($(date +%s) + 60))
until booted; do
    [ "$(date +%s)" -le "$deadline" ] || fail "the container boots (systemctl is-system-running)" \
        "not within 60 s; jobs: $(in_ct systemctl list-jobs --no-legend 2>&1 | tr '\n' ';')" \
        "$(tail -n 15 "$W/boot.log")" "$(in_ct journalctl -b --no-pager -n 30 2>&1)"
    sleep "$WAIT_POLL"
done
# From here on a failure also shows the end of esd's journal.
eval "lib_$(declare -f fail)"
fail() {
    local what=$1 lines=()
    shift
    mapfile -t lines < <(in_ct journalctl --no-pager -u esd.service -n 25 2>&1 | sed 's/^/  /')
    lib_fail "$what" "$@" "the end of journalctl -u esd:" "${lines[@]}"
}
[ "$(in_ct systemctl is-system-running 2>/dev/null || true)" = running ] ||
    echo "# degraded: $(in_ct systemctl --failed --no-legend --plain | tr '\n' ' ')"
ok "a container booted systemd from the host's /usr in $(elapsed)"

ESD_UID=$(in_ct id -u esd) || fail "systemd-sysusers made the user esd from the installed snippet"
[ "$(in_ct id -gn esd)" = esd ] || fail "the user esd's group is esd" "$(in_ct id esd)"
ok "the user esd (uid $ESD_UID, group esd) was made at boot from esd.conf in sysusers.d"

# ---- (t) the README's tour, as written ----
# The commands of the README's "A five-minute tour" (its ```sh blocks, a
# line ending in a backslash, && or | joined to the next, comments left
# out), its esd.yaml block and its drop-in block, extracted here as readme.sh reads
# them: a change to the tour changes what runs. Each runs in order as root
# in the container (bash -c, under timeout), except the ones TOUR_NOT_RUN
# names with the reason; TOUR_INSTEAD runs another command in a command's
# place. /mnt/shared is a directory of the test; /opt/esd/venv/bin holds
# the stand-ins as dj-process (mini-dj) and ray (fake-ray). sudo has no
# /etc/sudoers in a --volatile container (nor runuser its PAM files):
# there `sudo -u USER` is setpriv.
python3 - "$TOP/README.md" "$W/tour" <<'EOF' || fail "README.md has the tour's commands, esd.yaml and drop-in"
import re, sys
text = open(sys.argv[1], encoding="utf-8").read()
tour = text.split("\n## A five-minute tour\n", 1)[1].split("\n## ", 1)[0]
cmds, blocks = [], {}
for info, body in re.findall(r"^```(\w*)\n(.*?)^```", tour, re.M | re.S):
    if info == "sh":
        pending = ""
        for line in body.splitlines():
            if line.endswith("\\"):
                pending += line[:-1].rstrip() + " "
                continue
            if line.endswith(("&&", "||", "|")):
                pending += line + " "
                continue
            line, pending = pending + line, ""
            line = re.sub(r"\s+#\s.*$", "", line).strip()
            if line and not line.startswith("#"):
                cmds.append(line)
    else:
        blocks.setdefault(info, body)
assert cmds and "yaml" in blocks and "ini" in blocks, (cmds, list(blocks))
open(sys.argv[2] + ".cmds", "w").write("\n".join(cmds) + "\n")
open(sys.argv[2] + ".yaml", "w").write(blocks["yaml"])
open(sys.argv[2] + ".ini", "w").write(blocks["ini"])
EOF
show() { in_ct systemctl show -P "$2" "$1"; }
journal() { in_ct journalctl --no-pager -u esd.service "$@"; }
# as on a node where make install has just put the units: the first boot's
# presets enabled and started them here
in_ct systemctl disable --now esd.socket esd.service >/dev/null 2>&1
in_ct rm -rf /var/lib/esd
declare -A TOUR_NOT_RUN=(
    ["make install PREFIX=/usr"]="installed above (make install DESTDIR=, laid over the container's /usr)"
    ["dpkg-buildpackage -us -uc -b && apt install ../esd_*.deb"]="the package: deb.sh"
)
declare -A TOUR_INSTEAD=(
    ["esctl fscheck /mnt/shared/esd --nodes 4"]="esctl fscheck /mnt/shared/esd" # one node here
)
# what the drop-in and esd.yaml of the tour say, as written; the Ray port
# one free here (the container shares the host's network)
cp "$W/tour.ini" "$DROPIN/override.conf"
tour_conf() {
    sed "s/^ray:\$/ray:\n  port: $RAY_PORT/" "$W/tour.yaml" >"$R/etc/esd/esd.yaml"
    # (and /mnt/shared is a directory of this machine's own disk, which
    # submit --everywhere refuses unless told that it is shared)
    printf 'poll_interval_secs: 1\nshared_fs_check: false\n%s' "${1:-}" >>"$R/etc/esd/esd.yaml"
}
tour_conf
SUDO='command -v sudo >/dev/null && [ -e /etc/sudoers ] ||
    sudo() { if [ "$1" = -u ]; then local u=$2; shift 2
        setpriv --reuid="$u" --regid="$(id -g "$u")" --init-groups -- "$@"; else "$@"; fi; }'
tour_run() { run in_ct timeout 120 bash -c "$SUDO"$'\n'"$1"; }
TOUR_RAN=0
while IFS= read -r cmd; do
    if [ -n "${TOUR_NOT_RUN[$cmd]:-}" ]; then
        echo "# not run: $cmd: ${TOUR_NOT_RUN[$cmd]}"
        continue
    fi
    [ -z "${TOUR_INSTEAD[$cmd]:-}" ] || echo "# instead of $cmd: ${TOUR_INSTEAD[$cmd]}"
    line=${TOUR_INSTEAD[$cmd]:-$cmd}
    case "$cmd" in
    "systemctl reload esd")
        # a change, then a file esd refuses: the reload fails, esd runs on
        MAINPID=$(show esd.service MainPID)
        sed -i 's/^slots: 2 /slots: 3 /' "$R/etc/esd/esd.yaml"
        tour_run "$line"
        check "tour: $cmd (slots 2 -> 3)" 0
        run in_ct esctl config
        check "tour: esctl config after the reload" 0 "slots: 3"
        echo "slot: 4" >>"$R/etc/esd/esd.yaml"
        tour_run "$line"
        refused=$RC
        [ "$RC" -ne 0 ] || fail "tour: $cmd fails for a file esd refuses" "stdout: $OUT" "stderr: $ERR"
        { [ "$(show esd.service ActiveState)" = active ] &&
            [ "$(show esd.service MainPID)" = "$MAINPID" ]; } ||
            fail "esd runs on after the refused reload" "$(in_ct systemctl status --no-pager esd)"
        run in_ct esctl config
        check "tour: esd keeps the configuration it had" 0 "slots: 3"
        journal -o cat | grep -q "unknown key 'slot'; did you mean 'slots'?; keeping the current" ||
            fail "the journal says why the reload was refused" "$(journal -o cat | tail -n 5)"
        sed -i '$d' "$R/etc/esd/esd.yaml"
        ok "tour: $cmd: 0 for slots 3; non-zero ($refused) for an unknown key, esd still active (pid $MAINPID), slots still 3"
        ;;
    *)
        tour_run "$line"
        check "tour: $line" 0
        ;;
    esac
    TOUR_RAN=$((TOUR_RAN + 1))
    case "$cmd" in
    install\ -d*)
        [ "$(in_ct stat -c '%U:%G %a' /mnt/shared/esd/spool /mnt/shared/jobs | sort -u)" = "esd:esd 755" ] ||
            fail "the spool and jobs directories are esd's" "$(ls -la "$W/shared" "$W/shared/esd")" ;;
    "esd --check-config") [[ $OUT == "/etc/esd/esd.yaml: ok (as user esd, under esd.service's sandbox)" ]] ||
        fail "esd --check-config as root checks as the unit's user" "$OUT" ;;
    "esctl ping") [[ $OUT == *"on node gpu-07"* ]] || fail "esd is gpu-07" "$OUT" ;;
    journalctl*) [[ $OUT == *"done: "* ]] || fail "the shard's journal lines" "$OUT" ;;
    esac
done <"$W/tour.cmds"
[ "$TOUR_RAN" -ge 15 ] || fail "the tour's commands ran" "only $TOUR_RAN"
J="$W/shared/jobs/clean-001"
W="$W/tour-data" expect_merged "$J" "$W/expected-tour.jsonl"
{ cmp -s "$J/merged.jsonl" "$W/expected-tour.jsonl" && cmp -s "$W/shared/clean.jsonl" "$W/expected-tour.jsonl"; } ||
    fail "the tour's merges are as computed independently"
ok "the README's tour: $TOUR_RAN commands as written, clean-001's 64 shards merged as expected"

# --check-config under the unit's sandbox: a metrics.path the unit may not
# write, a processor that ProtectHome=yes hides
in_ct install -d -o esd /var/lib/node-exporter /home/tour
ln -s /opt/esd-test/tools/mini-dj "$W/shared/mini-dj"
in_ct cp -P /mnt/shared/mini-dj /home/tour/dj-process
sed 's|^processor: .*|processor: /home/tour/dj-process|' "$R/etc/esd/esd.yaml" >"$R/etc/esd/home.yaml"
cp "$R/etc/esd/esd.yaml" "$R/etc/esd/metrics.yaml"
printf 'metrics:\n  path: /var/lib/node-exporter/esd.prom\n' >>"$R/etc/esd/metrics.yaml"
run in_ct esd --check-config -c /etc/esd/metrics.yaml --unit esd.service
check "--check-config: metrics.path where the unit may not write" 1 "" \
    "esd.service may not write /var/lib/node-exporter (ProtectSystem=strict): add it in a drop-in, systemctl edit esd.service: [Service] ReadWritePaths=/var/lib/node-exporter"
printf '[Service]\nProtectHome=yes\n' >"$DROPIN/zz-home.conf"
in_ct systemctl daemon-reload
run in_ct esd --check-config -c /etc/esd/home.yaml --unit esd.service
check "--check-config: a processor under /home with ProtectHome=yes" 1 "" \
    "processor /home/tour/dj-process: esd.service hides /home (ProtectHome=yes)"
rm -f "$DROPIN/zz-home.conf" "$R/etc/esd/home.yaml" "$R/etc/esd/metrics.yaml"
in_ct systemctl daemon-reload
ok "--check-config names the ReadWritePaths= drop-in for metrics.path, and ProtectHome=yes hiding the processor"

# the rest starts from a node that never ran esd
run in_ct systemctl disable --now esd.service
check "systemctl disable --now esd" 0
in_ct rm -rf /var/lib/esd
in_ct journalctl --rotate --vacuum-files=1 >/dev/null 2>&1 || true
conf off

# ---- (a) enable, start ----
run in_ct systemctl enable --now esd.socket esd.service
check "systemctl enable --now esd.socket esd.service" 0
# show P: the property's value
show() { in_ct systemctl show -P "$2" "$1"; }
run in_ct systemctl is-active esd.service
check "systemctl is-active esd" 0 active
MAINPID=$(show esd.service MainPID)
[ "$(in_ct stat -c %U "/proc/$MAINPID")" = esd ] || fail "esd runs as user esd"
# the socket esd serves: passed by esd.socket (it is enabled and was there first)
journal() { in_ct journalctl --no-pager -u esd.service "$@"; }
wait_for "esd logs that it serves the passed socket" 10 \
    eval 'journal -o cat | grep -q "listening on the socket passed by systemd"'
[ "$(in_ct stat -c '%a %U %G' /run/esd/esd.sock)" = "660 esd esd" ] ||
    fail "/run/esd/esd.sock: 0660 esd:esd" "$(in_ct stat -c '%a %U %G' /run/esd/esd.sock)"
ok "esd.service is active as user esd, on the socket passed by esd.socket (0660 esd:esd)"
# no device allow-list (ProtectClock= added one before systemd 252): GPUs stay reachable
{ [ -z "$(show esd.service DeviceAllow)" ] && [ "$(show esd.service DevicePolicy)" = auto ]; } ||
    fail "esd.service restricts no device" "$(in_ct systemctl show -p DeviceAllow -p DevicePolicy esd)"
ok "esd.service has no device allow-list (DevicePolicy=auto, no DeviceAllow=): GPUs stay reachable"
status_line() { in_ct systemctl status --no-pager esd.service | grep -F "Status: \"$1" >/dev/null; }
wait_for "systemctl status esd shows STATUS=" 10 status_line "0/1 slots busy; no active job; ray off"
ok "systemctl status esd: Status: \"0/1 slots busy; no active job; ray off\""

# ---- (b) a job ----
chown -R "$ESD_UID:$ESD_UID" "$W/srv"
as_esd() { in_ct setpriv --reuid=esd --regid=esd --clear-groups "$@"; }
run as_esd esctl prepare --local --config /srv/esd/recipe.yaml --dataset-path /srv/esd/data.jsonl \
    --job-dir /srv/esd/job-a --num-shards 3
check "user esd prepares a 3-shard job in /srv/esd" 0
run in_ct esctl submit /srv/esd/job-a
check "root submits it with esctl" 0
finalized() {
    [ -e "$1/state/esd/finalize.json" ] &&
        [ "$(py 'j["status"]' "$1/state/esd/finalize.json")" = complete ]
}
wait_for "esd works and merges job-a" 30 finalized "$W/srv/job-a"
expect_merged "$W/srv/job-a" "$W/expected-a.jsonl"
cmp -s "$W/srv/job-a/merged.jsonl" "$W/expected-a.jsonl" || fail "job-a's merge is as expected"
[ "$(stat -c %u "$W/srv/job-a/merged.jsonl")" = "$ESD_UID" ] || fail "the merge is esd's"
ok "a job submitted with esctl was worked and merged under the unit (as computed independently)"

SHARD=$(py 'sorted(j["shards"], key=lambda s: s["index"])[1]["id"]' "$W/srv/job-a/manifest.json")
in_ct journalctl --sync
journal -o json "ESD_SHARD=$SHARD" >"$W/shard.json"
journal -o json >"$W/all.json"
python3 - "$W/shard.json" "$W/all.json" "$SHARD" <<'EOF' || fail "journalctl -u esd ESD_SHARD=$SHARD"
import json, sys
mine = [json.loads(l) for l in open(sys.argv[1])]
every = [json.loads(l) for l in open(sys.argv[2])]
shard = sys.argv[3]
assert mine, "no line"
assert all(e.get("ESD_SHARD") == shard and e.get("_SYSTEMD_UNIT") == "esd.service" for e in mine)
assert sorted(e["__CURSOR"] for e in mine) == sorted(e["__CURSOR"] for e in every
                                                     if e.get("ESD_SHARD") == shard)
msgs = [e["MESSAGE"] for e in mine]
for want in ("claimed (attempt 1)", "started ", "done: "):
    assert any(m.startswith("[job-a %s#1] %s" % (shard, want)) for m in msgs), (want, msgs)
ids = {e["MESSAGE"].split("] ", 1)[1].split(" ")[0]: e.get("MESSAGE_ID") for e in mine}
assert ids["claimed"] == "fe0b67e82adc492d8cf83fe9a14a4b41", ids
assert ids["done:"] == "5d97e15df8304591b4804a68c5b5444e", ids
print("# %d lines, e.g. %r" % (len(mine), msgs[0]))
EOF
ok "journalctl -u esd ESD_SHARD=$SHARD: exactly that shard's lines ([job-a SHARD#1] claimed, started, done; MESSAGE_ID of claimed and done)"

# ---- (c) reload ----
conf persistent
reloads() { journal -o cat | grep -c "^reloaded /etc/esd/esd.yaml$" || true; }
RELOADS=$(reloads)
run in_ct systemctl reload esd.service
check "systemctl reload esd" 0
wait_for "esd logs the reload" 10 eval '[ "$(reloads)" -gt "$RELOADS" ]'
[ "$(show esd.service MainPID)" = "$MAINPID" ] || fail "the reload keeps the main pid"
wait_for "the Ray head (fake-ray, persistent) comes up under the unit" 20 status_line \
    "0/1 slots busy; no active job; ray up"
ok "systemctl reload esd: \"reloaded\" in the journal, same pid; ray.mode persistent: ray up"

# ---- (d) stop, then socket activation ----
run in_ct systemctl stop esd.service
check "systemctl stop esd.service" 0
{ [ "$(show esd.service ActiveState)" = inactive ] && [ "$(show esd.service Result)" = success ] &&
    [ "$(show esd.service ExecMainStatus)" = 0 ]; } ||
    fail "esd stops cleanly" "$(in_ct systemctl status --no-pager esd.service)"
in_ct test -S /run/esd/esd.sock || fail "esd.socket's socket outlives the stopped service"
[ "$(show esd.socket SubState)" = listening ] || fail "esd.socket listens"
ok "systemctl stop esd.service: Result=success, status 0; the socket stays (esd.socket listening)"
run in_ct esctl ping
check "esctl ping starts esd through esd.socket" 0 "node ct"
[ "$(show esd.service ActiveState)" = active ] || fail "esd.service is active again"
MAINPID=$(show esd.service MainPID)
ok "socket activation: esd.service started by the first connection (pid $MAINPID)"

# ---- (e) watchdog ----
cat >"$DROPIN/zz-hang.conf" <<'EOF'
[Service]
ExecStart=
ExecStart=/usr/sbin/esd --test-hang-watchdog
WatchdogSec=2
RestartSec=1
LimitCORE=0
EOF
in_ct systemctl daemon-reload
NRESTARTS=$(show esd.service NRestarts)
run in_ct systemctl restart esd.service
check "systemctl restart esd (--test-hang-watchdog, WatchdogSec=2)" 0
HUNG=$(show esd.service MainPID)
restarted() {
    [ "$(show esd.service NRestarts)" -gt "$NRESTARTS" ] && [ "$(show esd.service ActiveState)" = active ] &&
        [ "$(show esd.service MainPID)" != "$HUNG" ]
}
wait_for "systemd kills the hung esd and restarts it" 20 restarted
journal -o cat >"$W/journal.txt"
{ grep -q "Watchdog timeout" "$W/journal.txt" &&
    grep -q "Killing process $HUNG (esd) with signal SIGABRT" "$W/journal.txt"; } || fail "the watchdog kill is in the journal" "$(tail -n 30 "$W/journal.txt")"
grep -q "Scheduled restart job" "$W/journal.txt" || fail "systemd restarts esd" \
    "$(tail -n 30 "$W/journal.txt")"
ok "watchdog: \"Watchdog timeout\", SIGABRT to pid $HUNG, restarted as pid $(show esd.service MainPID)"
rm -f "$DROPIN/zz-hang.conf"
in_ct systemctl daemon-reload
run in_ct systemctl restart esd.service
check "systemctl restart esd without the hang" 0
in_ct systemctl reset-failed esd.service 2>/dev/null || true

# ---- (f) a clean stop releases the claims of running attempts ----
run as_esd esctl prepare --local --config /srv/esd/recipe.yaml --dataset-path /srv/esd/data.jsonl \
    --job-dir /srv/esd/hang-job --num-shards 2
check "user esd prepares hang-job" 0
run in_ct esctl submit /srv/esd/hang-job
check "root submits hang-job" 0
hanging() { journal -o cat | grep -q "mini-dj: hanging"; }
wait_for "a shard of hang-job hangs" 20 hanging
LOCKS=$(count "$W/srv/hang-job/state/locks")
[ "$LOCKS" -ge 1 ] || fail "the hanging shard is claimed"
in_ct pgrep -x mini-dj >/dev/null || fail "mini-dj runs"
t=$(date +%s)
run in_ct systemctl stop esd.service
check "systemctl stop esd with a hanging attempt" 0
secs=$(($(date +%s) - t))
{ [ "$(show esd.service Result)" = success ] && [ "$(show esd.service ExecMainStatus)" = 0 ]; } ||
    fail "esd stops cleanly" "$(in_ct systemctl status --no-pager esd.service)"
[ "$(count "$W/srv/hang-job/state/locks")" -eq 0 ] ||
    fail "no lock file is left" "$(ls "$W/srv/hang-job/state/locks")"
[ "$(count "$W/srv/hang-job/state/failed")" -eq 0 ] || fail "no shard failed"
! in_ct pgrep -x mini-dj >/dev/null || fail "no mini-dj is left"
# (journald may file the last lines of a stopping service a moment later)
wait_for "esd logs the release" 10 eval 'journal -o cat | grep -q "^\[hang-job part-[0-9]*-of-00002#1\] released: "'
ok "systemctl stop with a hanging attempt: done in $secs s, Result=success, $LOCKS claim(s) released, no lock left, no failure, no mini-dj left"

# ---- (g) the root variant of systemd/README.md ----
# The drop-in is the README's block that starts with its path.
awk '/^```/ { if (on) exit; next } /^# \/etc\/systemd\/system\/esd.service.d\/root.conf$/ { on = 1 }
     on' "$TOP/systemd/README.md" >"$DROPIN/root.conf"
grep -qx 'User=root' "$DROPIN/root.conf" || fail "systemd/README.md has the root drop-in" \
    "$(cat "$DROPIN/root.conf")"
conf per-attempt
in_ct systemctl daemon-reload
in_ct install -d -o nobody -g nogroup /srv/esd/nobody
in_ct setpriv --reuid=nobody --regid=nogroup --clear-groups esctl prepare --local \
    --config /srv/esd/recipe.yaml --dataset-path /srv/esd/data.jsonl \
    --job-dir /srv/esd/nobody/job-r --num-shards 2 >"$W/prepare-r.out" 2>&1 ||
    fail "nobody prepares job-r" "$(cat "$W/prepare-r.out")"
run in_ct systemctl start esd.service
check "systemctl start esd (root variant)" 0
MAINPID=$(show esd.service MainPID)
[ "$(in_ct stat -c %U "/proc/$MAINPID")" = root ] || fail "esd runs as root"
# hang-job is still registered, and its shard would take the only slot
run in_ct esctl cancel /srv/esd/hang-job
check "esctl cancel hang-job" 0
run in_ct esctl submit /srv/esd/nobody/job-r
check "root submits nobody's job" 0
wait_for "esd (root) works and merges job-r" 30 finalized "$W/srv/nobody/job-r"
NOBODY=$(in_ct id -u nobody)
[ -z "$(find "$W/srv/nobody/job-r" ! -uid "$NOBODY" -print -quit)" ] ||
    fail "every file of job-r is nobody's" "$(find "$W/srv/nobody/job-r" ! -uid "$NOBODY" | head)"
expect_merged "$W/srv/nobody/job-r" "$W/expected-r.jsonl"
cmp -s "$W/srv/nobody/job-r/merged.jsonl" "$W/expected-r.jsonl" || fail "job-r's merge is as expected"
run in_ct systemctl stop esd.service
check "systemctl stop esd (root variant)" 0
[ "$(show esd.service Result)" = success ] || fail "the root variant stops cleanly"
ok "root variant (README drop-in, ray.mode per-attempt): nobody's job worked as nobody, merged"

# ---- power off ----
in_ct systemctl poweroff --no-block >/dev/null 2>&1 || true
wait_for "the container powers off" 30 dead "$NSPAWN"
ok "the container powered off; $(elapsed) in all"
summary
