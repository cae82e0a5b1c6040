#!/usr/bin/env bash
# Keeps esctl(1) in step with esctl's command table: every command that
# `esctl --help` lists has an entry, every option that `esctl <cmd> --help`
# lists is documented, the entries follow the table's order, and mandoc
# finds nothing at warning level or above.
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
if command -v mandoc >/dev/null; then
    if mandoc -Tlint -Wwarning "$page"; then echo "ok - mandoc -Tlint"; else fail=1; fi
else
    echo "skip - mandoc not installed"
fi
exit $fail
