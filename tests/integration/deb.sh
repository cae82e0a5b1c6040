#!/usr/bin/env bash
# deb: the Debian package (debian/). Copies the working tree as a clean
# checkout of it would be (tracked files and untracked ones that are not
# ignored, in their working-tree versions; no build/, no .venv) into a
# temporary directory, builds it there with `dpkg-buildpackage -us -uc -b`
# (the unit suites run in the build, the integration scripts do not), runs
# lintian on the .changes and fails on any error or warning that is not
# overridden, and checks the package: esd, esctl, their man pages, the
# configuration as a conffile, the units of systemd/ when there are any,
# the journal catalog in /usr/lib/systemd/catalog,
# every file `make install` installs, the shared libraries in Depends
# (zlib1g and libzstd1 too, for compressed inputs), a
# sysusers snippet's postinst call, and that installing does not start esd.
# Prints the build time and "deb size: N KiB".
#
# Needs dpkg-buildpackage, debhelper, lintian and git (scripts/deps --tools
# installs the first three as root); without them it prints "# skip: ..."
# and exits 0. Skipped under SANITIZE too: the package is the same whatever
# the sanitizers, so the plain `make check` builds it once.
#
# Environment: TOP (see lib.bash); KEEP=1 keeps the temporary directory.
set -euo pipefail
export LC_ALL=C
# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

if [ -n "${SANITIZE:-}" ]; then
    skip "the package is built by the plain make check, not again under SANITIZE=$SANITIZE"
fi
for tool in dpkg-buildpackage dh lintian git; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        skip "no $tool (as root: scripts/deps --tools)"
    fi
done
git -C "$TOP" rev-parse --git-dir >/dev/null 2>&1 || {
    skip "$TOP is not a git checkout"
}

new_workdir
# The package build is an operator's build: nothing of an outer make (its
# jobserver, WERROR=1, V, CFLAGS) leaks into it.
unset MAKEFLAGS MFLAGS MAKELEVEL MAKEOVERRIDES WERROR V CFLAGS LDFLAGS CPPFLAGS OPT CC
unset DEB_BUILD_OPTIONS DEB_BUILD_PROFILES

# ---- a clean copy of the working tree ----
SRC=$W/esd
mkdir "$SRC"
# (deleted but still tracked files are listed too; only existing ones are copied)
git -C "$TOP" ls-files -z --cached --others --exclude-standard |
    (cd "$TOP" && while IFS= read -r -d '' f; do
        if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\0' "$f"; fi
    done) | tar -C "$TOP" --null -T - -cf - | tar -C "$SRC" -xf -
[ -x "$SRC/debian/rules" ] || fail "the copy has an executable debian/rules" "$(ls -l "$SRC/debian")"
{ [ ! -e "$SRC/build" ] && [ ! -e "$SRC/.venv" ]; } || fail "the copy has no build/ and no .venv"
ok "clean copy of the working tree: $(find "$SRC" -type f | wc -l) files"

# ---- build ----
t0=$(date +%s)
if ! (cd "$SRC" && DEB_BUILD_OPTIONS="parallel=$(nproc)" \
    dpkg-buildpackage -us -uc -b) >"$W/build.log" 2>&1; then
    fail "dpkg-buildpackage -us -uc -b" "$(tail -n 40 "$W/build.log")"
fi
secs=$(($(date +%s) - t0))
grep -q '^== build/default/tests/' "$W/build.log" ||
    fail "the build runs the unit suites" "$(grep -n 'dh_auto_test\|make.*unit' "$W/build.log")"
ok "dpkg-buildpackage -us -uc -b, with the unit suites: $secs s"
echo "build time: $secs s"

version=$(cd "$SRC" && dpkg-parsechangelog -S Version)
arch=$(dpkg-architecture -qDEB_HOST_ARCH)
DEB=$W/esd_${version}_$arch.deb
CHANGES=$W/esd_${version}_$arch.changes
{ [ -f "$DEB" ] && [ -f "$CHANGES" ]; } || fail "the .deb and .changes exist" "$(ls "$W")"

# ---- lintian ----
# Every hint is printed, informational, pedantic and overridden ones
# included; errors and warnings that are not overridden fail.
lrc=0
lintian --display-info --pedantic --show-overrides --fail-on error,warning "$CHANGES" >"$W/lintian.out" 2>&1 || lrc=$?
sed 's/^/# lintian: /' "$W/lintian.out"
[ "$lrc" -eq 0 ] || fail "lintian finds no error or warning that is not overridden" "exit $lrc" \
    "$(grep -E '^[EW]: ' "$W/lintian.out" || true)"
ok "lintian: no error or warning; $(grep -c '^I: ' "$W/lintian.out" || true) informational, $(grep -c '^P: ' "$W/lintian.out" || true) pedantic, $(grep -c '^O: ' "$W/lintian.out" || true) overridden"

# ---- contents ----
dpkg-deb -c "$DEB" | awk '{ print $6 }' | sed 's,^\./,/,; s,/$,,' | sort >"$W/contents"
has() { grep -qxF "$1" "$W/contents"; }
want=(/usr/sbin/esd /usr/bin/esctl /usr/share/man/man1/esctl.1.gz /usr/share/man/man5/esd.yaml.5.gz
    /usr/share/man/man8/esd.8.gz /etc/esd/esd.yaml /usr/share/doc/esd/copyright
    /usr/share/doc/esd/README.Debian /usr/lib/esd/esd-dj /usr/lib/systemd/catalog/esd.catalog)
# The units of systemd/, where Debian 12's dh_installsystemd takes them.
for u in "$SRC"/systemd/*.service "$SRC"/systemd/*.socket; do
    [ -e "$u" ] && want+=("/lib/systemd/system/${u##*/}")
done
missing=()
for f in "${want[@]}"; do has "$f" || missing+=("$f"); done
[ ${#missing[@]} -eq 0 ] || fail "the package holds ${want[*]}" "missing: ${missing[*]}" \
    "$(cat "$W/contents")"
ok "the package holds ${want[*]}"

dpkg-deb -e "$DEB" "$W/control"
grep -qxF /etc/esd/esd.yaml "$W/control/conffiles" ||
    fail "/etc/esd/esd.yaml is a conffile" "$(cat "$W/control/conffiles" 2>&1)"
ok "/etc/esd/esd.yaml is a conffile"

# Everything `make install` installs is in the package, at the same path
# (man pages compressed): installed into a staging directory from the tree
# the package was built from, with debian/rules' directories.
(cd "$SRC" && make install DESTDIR="$W/stage" PREFIX=/usr SYSCONFDIR=/etc \
    UNITDIR=/lib/systemd/system SYSUSERSDIR=/usr/lib/sysusers.d CATALOGDIR=/usr/lib/systemd/catalog) \
    >"$W/stage.log" 2>&1 ||
    fail "make install into a staging directory" "$(tail -n 20 "$W/stage.log")"
(cd "$W/stage" && find . \( -type f -o -type l \) -printf '/%P\n' | sort) >"$W/staged"
missing=()
while IFS= read -r f; do
    has "$f" || has "$f.gz" || missing+=("$f")
done <"$W/staged"
[ ${#missing[@]} -eq 0 ] || fail "every file make install installs is in the package" \
    "missing: ${missing[*]}"
ok "the $(wc -l <"$W/staged") files that make install installs are in the package"

depends=$(dpkg-deb -f "$DEB" Depends)
for lib in libev libcjson libyaml libssl libsystemd zlib1g libzstd1; do
    [[ $depends == *"$lib"* ]] || fail "Depends names $lib (shlibs)" "Depends: $depends"
done
ok "Depends: $depends"

# Installing enables esd but does not start it (debian/README.Debian).
postinst=$W/control/postinst
if grep -q '^/usr/lib/sysusers.d/.*\.conf$' "$W/contents"; then
    grep -q 'systemd-sysusers' "$postinst" || fail "postinst runs systemd-sysusers" "$(cat "$postinst")"
    ok "postinst runs systemd-sysusers"
fi
if grep -q '^/lib/systemd/system/esd\.service$' "$W/contents"; then
    { grep -q "deb-systemd-helper enable 'esd.service'" "$postinst" &&
        ! grep -q "debian-installed 'esd.service'" "$postinst"; } ||
        fail "postinst enables esd.service" "$(cat "$postinst")"
    # shellcheck disable=SC2016 # a literal $_dh_action: the snippet that starts
    ! grep -qE 'deb-systemd-invoke (start|\$_dh_action)' "$postinst" ||
        fail "postinst does not start esd" "$(cat "$postinst")"
    # (dh_installsystemd --no-enable: re-enabled only if it was enabled before)
    ! has /lib/systemd/system/esd.socket || grep -q "debian-installed 'esd.socket'" "$postinst" ||
        fail "postinst does not enable esd.socket" "$(cat "$postinst")"
    grep -q 'deb-systemd-invoke stop' "$W/control/prerm" ||
        fail "prerm stops esd on removal" "$(cat "$W/control/prerm")"
    ok "postinst enables esd.service without starting it (try-restart on upgrade) and leaves esd.socket disabled, prerm stops both on removal"
fi

size=$(stat -c %s "$DEB")
echo "deb size: $(((size + 1023) / 1024)) KiB"
summary
