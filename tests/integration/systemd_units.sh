#!/usr/bin/env bash
# systemd_units: the files of systemd/ and `make install`/`make uninstall`,
# without running systemd.
#   (a) `systemd-analyze verify` passes, silently, on esd.service (with
#       @SBINDIR@ replaced by the directory of the built $ESD) and
#       esd.socket, with MANPATH on this tree's man pages so that their
#       Documentation= is checked too; again with the root drop-in of
#       systemd/README.md beside the unit. `systemd-sysusers --dry-run`
#       accepts esd.sysusers and makes the user and group esd from it.
#   (b) `systemd-analyze security --offline=true esd.service` (the unit's
#       own directory only: no drop-in of this machine counts) gives an
#       exposure no worse than the figure recorded in
#       systemd/security-exposure; both are printed, and the root
#       variant's figure too, for the record.
#   (c) `make install DESTDIR=$W/d PREFIX=/usr` installs exactly the
#       expected files, with their modes (the journal catalog esd.catalog
#       among them); the units as in systemd/ with
#       ExecStart=/usr/sbin/esd; the bash completion as `esctl completion`
#       prints it; esd.yaml as etc/esd.yaml. A second install keeps an
#       edited esd.yaml. `make uninstall` removes every file but the edited
#       esd.yaml, and, once that is the sample again, everything.
#   (d) the directory knobs: PREFIX=/opt/esd SYSCONFDIR=/opt/esd/etc
#       UNITDIR=... SYSUSERSDIR=... CATALOGDIR=... BASHCOMPDIR=... put every file where
#       they say, and the unit's ExecStart follows SBINDIR.
# (a) and (b) are skipped with "# skip:" without systemd-analyze.
#
# Environment: TOP, ESCTL, ESD (see lib.bash).
set -euo pipefail
export LC_ALL=C

# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

new_workdir
{ [ -x "$ESCTL" ] && [ -x "$ESD" ]; } || fail "esd and esctl exist" "run make"
S="$TOP/systemd"
RECORD="$S/security-exposure"

# ---- (a) verify ----
U="$W/units"
mkdir -p "$U" "$W/man/man1" "$W/man/man5" "$W/man/man8"
sed -e "s|@SBINDIR@|$(dirname "$ESD")|g" -e "s|@BINDIR@|$(dirname "$ESCTL")|g" "$S/esd.service" >"$U/esd.service"
sed "s|@SBINDIR@|$(dirname "$ESD")|g" "$S/esd.socket" >"$U/esd.socket"
grep -qx "ExecStart=$(dirname "$ESD")/esd" "$U/esd.service" || fail "esd.service has ExecStart=@SBINDIR@/esd"
cp "$TOP/man/esctl.1" "$W/man/man1/"
cp "$TOP/man/esd.yaml.5" "$W/man/man5/"
cp "$TOP/man/esd.8" "$W/man/man8/"
if command -v systemd-analyze >/dev/null; then
    # Documentation= is checked with man(1), if there is one
    MANCHECK=--man=yes
    command -v man >/dev/null || { MANCHECK=--man=no && echo "# no man: Documentation= not checked"; }
    verify() {
        (cd "$U" && MANPATH="$W/man" systemd-analyze verify "$MANCHECK" ./esd.service ./esd.socket) \
            >"$W/verify.out" 2>&1 || fail "systemd-analyze verify $*" "$(cat "$W/verify.out")"
        [ ! -s "$W/verify.out" ] || fail "systemd-analyze verify $* says nothing" "$(cat "$W/verify.out")"
    }
    verify esd.service esd.socket
    ok "systemd-analyze verify esd.service esd.socket: no complaint (Documentation= man pages found)"
    mkdir "$U/esd.service.d"
    awk '/^```/ { if (on) exit; next } /^# \/etc\/systemd\/system\/esd.service.d\/root.conf$/ { on = 1 }
         on' "$S/README.md" >"$U/esd.service.d/root.conf"
    grep -qx 'User=root' "$U/esd.service.d/root.conf" || fail "systemd/README.md has the root drop-in"
    verify "with the README's root drop-in"
    ok "systemd-analyze verify with the root drop-in of systemd/README.md: no complaint"
else
    echo "# skip: (a) systemd-analyze verify (no systemd-analyze)"
fi
if command -v systemd-sysusers >/dev/null; then
    mkdir "$W/sysroot"
    run systemd-sysusers --root="$W/sysroot" --dry-run "$S/esd.sysusers"
    check "systemd-sysusers --dry-run esd.sysusers" 0
    [[ "$OUT$ERR" == *"Creating group 'esd'"* && "$OUT$ERR" == *"Creating user 'esd'"* ]] ||
        fail "esd.sysusers makes the group and the user esd" "$OUT" "$ERR"
    ok "esd.sysusers makes the group esd and the user esd"
fi

# ---- (b) security exposure ----
# exposure [DIR]: the overall exposure of esd.service in DIR (default $U
# without drop-ins), only that directory on the unit path.
exposure() {
    local d=${1:-$W/plain}
    SYSTEMD_UNIT_PATH=$d systemd-analyze security --offline=true --no-pager esd.service \
        >"$W/security.out" 2>&1 || fail "systemd-analyze security esd.service" "$(cat "$W/security.out")"
    sed -n 's/^.*Overall exposure level for esd\.service: \([0-9.]*\).*$/\1/p' "$W/security.out"
}
if command -v systemd-analyze >/dev/null; then
    mkdir "$W/plain"
    cp "$U/esd.service" "$U/esd.socket" "$W/plain/"
    NOW=$(exposure)
    cp "$W/security.out" "$W/security-plain.out"
    [ -n "$NOW" ] || fail "systemd-analyze security prints the exposure" "$(cat "$W/security.out")"
    ROOT_NOW=$(exposure "$U")
    [ -s "$RECORD" ] || fail "the recorded exposure is in $RECORD"
    RECORDED=$(grep -v '^#' "$RECORD" | tr -d ' \n')
    echo "# exposure of esd.service: $NOW now, $RECORDED recorded in systemd/security-exposure" \
        "(root variant: $ROOT_NOW)"
    python3 -c 'import sys; sys.exit(float(sys.argv[1]) > float(sys.argv[2]))' "$NOW" "$RECORDED" ||
        fail "the exposure is no worse than recorded" "now $NOW, recorded $RECORDED" \
            "$(grep -E ' [0-9]\.[0-9]+ *$' "$W/security-plain.out" || true)"
    if python3 -c 'import sys; sys.exit(not float(sys.argv[1]) < float(sys.argv[2]))' "$NOW" \
        "$RECORDED"; then
        echo "# the exposure improved: record $NOW in systemd/security-exposure"
    fi
    ok "systemd-analyze security --offline=true esd.service: $NOW, no worse than $RECORDED"
else
    echo "# skip: (b) systemd-analyze security (no systemd-analyze)"
fi

# ---- (c) make install / make uninstall ----
# files DIR: every file and symlink below DIR, with its mode, one a line.
files() { (cd "$1" && find . ! -type d -printf '%m %P\n' | sort); }
unitdir=$(pkg-config --variable=systemdsystemunitdir systemd 2>/dev/null || echo /lib/systemd/system)
sysusersdir=$(pkg-config --variable=sysusersdir systemd 2>/dev/null || echo /usr/lib/sysusers.d)
catalogdir=$(pkg-config --variable=catalogdir systemd 2>/dev/null || echo /usr/lib/systemd/catalog)
# make_in DIR TARGET [VAR=VALUE...]
make_in() {
    local dest=$1 target=$2
    shift 2
    make -C "$TOP" --no-print-directory "$target" DESTDIR="$dest" "$@" >"$W/make.log" 2>&1 ||
        fail "make $target DESTDIR=$dest $*" "$(tail -n 20 "$W/make.log")"
}
D="$W/d"
make_in "$D" install PREFIX=/usr
{
    echo "755 usr/bin/esctl"
    echo "755 usr/sbin/esd"
    echo "755 usr/lib/esd/esd-dj"
    echo "644 etc/esd/esd.yaml"
    echo "644 ${unitdir#/}/esd.service"
    echo "644 ${unitdir#/}/esd.socket"
    echo "644 ${sysusersdir#/}/esd.conf"
    echo "644 ${catalogdir#/}/esd.catalog"
    echo "644 usr/share/bash-completion/completions/esctl"
    echo "644 usr/share/man/man1/esctl.1"
    echo "644 usr/share/man/man5/esd.yaml.5"
    echo "644 usr/share/man/man8/esd.8"
} | sort >"$W/want"
files "$D" >"$W/got"
diff "$W/want" "$W/got" >"$W/diff" || fail "make install PREFIX=/usr installs the expected files" \
    "$(cat "$W/diff")"
ok "make install DESTDIR=\$W/d PREFIX=/usr: the $(wc -l <"$W/want") expected files and modes ($unitdir, $sysusersdir, $catalogdir)"
sed -e 's|@SBINDIR@|/usr/sbin|g' -e 's|@BINDIR@|/usr/bin|g' "$S/esd.service" |
    cmp -s - "$D/$unitdir/esd.service" ||
    fail "the installed esd.service is systemd/esd.service with @SBINDIR@ = /usr/sbin, @BINDIR@ = /usr/bin"
grep -qx 'ExecStart=/usr/sbin/esd' "$D/$unitdir/esd.service" || fail "ExecStart=/usr/sbin/esd"
! grep -rI '@[A-Z]*@' "$D" >/dev/null || fail "no @VAR@ is left" "$(grep -rIl '@[A-Z]*@' "$D")"
cmp -s "$S/esd.socket" "$D/$unitdir/esd.socket" || fail "esd.socket installed as is"
cmp -s "$S/esd.sysusers" "$D/$sysusersdir/esd.conf" || fail "esd.sysusers installed as esd.conf"
cmp -s "$TOP/etc/esd.yaml" "$D/etc/esd/esd.yaml" || fail "esd.yaml installed as etc/esd.yaml"
"$ESCTL" completion | cmp -s - "$D/usr/share/bash-completion/completions/esctl" ||
    fail "the bash completion is what esctl completion prints"
ok "installed units (ExecStart=/usr/sbin/esd, no @VAR@ left), sysusers, esd.yaml and completion are right"

echo "# edited by the operator" >>"$D/etc/esd/esd.yaml"
cp "$D/etc/esd/esd.yaml" "$W/edited.yaml"
make_in "$D" install PREFIX=/usr
cmp -s "$W/edited.yaml" "$D/etc/esd/esd.yaml" || fail "make install keeps an existing esd.yaml"
files "$D" >"$W/got"
diff "$W/want" "$W/got" >"$W/diff" || fail "a second make install installs the same files" "$(cat "$W/diff")"
ok "a second make install leaves the edited esd.yaml alone"
make_in "$D" uninstall PREFIX=/usr
[ "$(files "$D")" = "644 etc/esd/esd.yaml" ] ||
    fail "make uninstall removes every file but the edited esd.yaml" "$(files "$D")"
cp "$TOP/etc/esd.yaml" "$D/etc/esd/esd.yaml"
make_in "$D" uninstall PREFIX=/usr
[ -z "$(files "$D")" ] || fail "make uninstall removes the unedited esd.yaml" "$(files "$D")"
[ ! -e "$D/etc/esd" ] || fail "make uninstall removes the empty etc/esd"
ok "make uninstall: every file gone but an edited esd.yaml; the sample esd.yaml and etc/esd too"

# ---- (d) the directory knobs ----
D2="$W/d2"
make_in "$D2" install PREFIX=/opt/esd SYSCONFDIR=/opt/esd/etc UNITDIR=/opt/esd/units \
    SYSUSERSDIR=/opt/esd/sysusers BASHCOMPDIR=/opt/esd/completions MANDIR=/opt/esd/man \
    CATALOGDIR=/opt/esd/catalog
cat >"$W/want2" <<'EOF'
644 opt/esd/catalog/esd.catalog
644 opt/esd/completions/esctl
644 opt/esd/etc/esd/esd.yaml
644 opt/esd/man/man1/esctl.1
644 opt/esd/man/man5/esd.yaml.5
644 opt/esd/man/man8/esd.8
644 opt/esd/sysusers/esd.conf
644 opt/esd/units/esd.service
644 opt/esd/units/esd.socket
755 opt/esd/bin/esctl
755 opt/esd/lib/esd/esd-dj
755 opt/esd/sbin/esd
EOF
files "$D2" | sort >"$W/got2"
sort -o "$W/want2" "$W/want2"
diff "$W/want2" "$W/got2" >"$W/diff" || fail "the directory knobs are honoured" "$(cat "$W/diff")"
grep -qx 'ExecStart=/opt/esd/sbin/esd' "$D2/opt/esd/units/esd.service" ||
    fail "ExecStart follows SBINDIR" "$(grep ExecStart "$D2/opt/esd/units/esd.service")"
make_in "$D2" uninstall PREFIX=/opt/esd SYSCONFDIR=/opt/esd/etc UNITDIR=/opt/esd/units \
    SYSUSERSDIR=/opt/esd/sysusers BASHCOMPDIR=/opt/esd/completions MANDIR=/opt/esd/man \
    CATALOGDIR=/opt/esd/catalog
[ -z "$(files "$D2")" ] || fail "make uninstall with the same knobs removes everything" "$(files "$D2")"
ok "PREFIX, SYSCONFDIR, UNITDIR, SYSUSERSDIR, CATALOGDIR, BASHCOMPDIR, MANDIR honoured by install and uninstall (ExecStart=/opt/esd/sbin/esd)"

summary
