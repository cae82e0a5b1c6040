#!/usr/bin/env bash
# Keeps the man pages in step with the programs:
#   esctl(1): every command that `esctl --help` lists has an entry, every
#     option that `esctl <cmd> --help` lists is documented, and the entries
#     follow the table's order;
#   esd(8): every long option that `esd --help` prints, and every one of
#     the option table in daemon/main.c (--help and the test-only
#     --test-hang-watchdog are not in the usage), has an ".It" entry;
#   and mandoc finds nothing at warning level or above in either.
# The configuration keys (`esd --help-config`, the same table) are checked
# against esd.yaml(5), in table order, and against etc/esd.yaml by the unit
# suite tests/unit/check_config.c (test_man_page, which also runs mandoc on
# esd.yaml.5, and test_sample); they are not checked twice here.
#
# Environment: TOP, ESCTL, ESD (see lib.bash).
set -euo pipefail
# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"
page=$TOP/man/esctl.1
fail=0

cmds=$("$ESCTL" --help | awk '/^commands:/ {on=1; next} on && /^  [a-z]/ {print $1} on && /^$/ {on=0}')
[ -n "$cmds" ] || { echo "not ok - no commands parsed from esctl --help"; exit 1; }
prev=0
for c in $cmds; do
    line=$(grep -n "^\.It Cm $c\( \|$\)" "$page" | head -1 | cut -d: -f1)
    if [ -z "$line" ]; then
        echo "not ok - command $c missing from esctl.1"; fail=1; continue
    fi
    if [ "$line" -lt "$prev" ]; then
        echo "not ok - command $c out of table order in esctl.1"; fail=1
    fi
    prev=$line
    for o in $("$ESCTL" "$c" --help | grep -o -- '^  --[a-z-]*' | sed 's/^  --//'); do
        grep -q -- "Fl \\\\-$o\\b" "$page" || { echo "not ok - option --$o of $c missing"; fail=1; }
    done
    echo "ok - $c documented"
done

epage=$TOP/man/esd.8
if [ -f "$epage" ]; then
    opts=$({
        "$ESD" --help | grep -o -- '--[a-z][a-z-]*'
        grep -o '{ "[a-z][a-z-]*", [a-z_]*_argument' "$TOP/daemon/main.c" | cut -d'"' -f2 | sed 's/^/--/'
    } | sort -u)
    [ -n "$opts" ] || { echo "not ok - no options parsed from esd --help and daemon/main.c"; exit 1; }
    for o in $opts; do
        if grep -Eq "^\.It (.* )?Fl \\\\-${o#--}( |\$)" "$epage"; then
            echo "ok - esd $o documented"
        else
            echo "not ok - option $o of esd missing from esd.8"; fail=1
        fi
    done
else
    echo "not ok - man/esd.8 missing"; fail=1
fi

if command -v mandoc >/dev/null; then
    for p in "$page" "$epage"; do
        [ -f "$p" ] || continue
        if mandoc -Tlint -Wwarning "$p"; then echo "ok - mandoc -Tlint ${p##*/}"; else fail=1; fi
    done
else
    echo "skip - mandoc not installed"
fi
exit $fail
