#!/usr/bin/env bash
# Keeps the man pages in step with the programs:
#   esctl(1): the COMMANDS section has one entry (".It Cm NAME", at the top
#     level of its list) for every command that `esctl --help` lists, none
#     other, each once and in the order of `esctl --help` (the command
#     table's); every option that `esctl <cmd> --help` lists is an item
#     (".It Fl \-OPT") of the option list inside that command's entry, and
#     that list holds no option the command does not accept; the global
#     options of the usage line, --help and --version are items of GLOBAL
#     OPTIONS;
#   esd(8): every long option that `esd --help` and `esd run --help`
#     print, and every one of the option tables in daemon/main.c and
#     daemon/oneshot.c (--help and the test-only
#     --test-hang-watchdog are not in the usage), has an ".It" entry;
#   and `mandoc -Tlint` reports nothing at all on either page, style
#   messages included, except those that depend on the machine rather than
#   on the page: a cross-reference to a manual that is not installed
#   ("referenced manual not found", checked here instead for our own
#   pages: they must exist in man/) and notes on the system's mandoc.db.
# The configuration keys (`esd --help-config`, the same table) are checked
# against esd.yaml(5), in table order, and against etc/esd.yaml by the unit
# suite tests/unit/check_config.c (test_man_page, which also runs mandoc on
# esd.yaml.5, and test_sample); they are not checked twice here.
#
# Every check runs; the script fails at the end if any did (lib.bash's
# keep-going mode is this script's default; ESD_TEST_KEEP_GOING=0 stops at
# the first).
# Environment: TOP, ESCTL, ESD (see lib.bash).
set -euo pipefail
ESD_TEST_KEEP_GOING=${ESD_TEST_KEEP_GOING:-1}
# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"
page=$TOP/man/esctl.1
epage=$TOP/man/esd.8
# stop WHAT: a check that what follows needs failed: the script ends here.
stop() {
    fail "$@"
    failed_exit
}

# ---- esctl(1) ----

usage=$("$ESCTL" --help) || stop "esctl --help failed"
mapfile -t cmds < <(awk '/^commands:/ {on=1; next} on && /^  [a-z]/ {print $1} on && /^$/ {on=0}' \
    <<<"$usage")
[ ${#cmds[@]} -gt 0 ] || stop "no commands parsed from esctl --help"

# The COMMANDS section as "C NAME" for each top-level entry, in page order,
# and "O NAME OPT" for each option item of the lists nested in it.
sect=$(awk '
    /^\.Sh / { on = ($0 == ".Sh COMMANDS"); depth = 0; cmd = ""; next }
    !on { next }
    /^\.Bl( |$)/ { depth++; next }
    /^\.El( |$)/ { depth--; next }
    depth == 1 && /^\.It Cm [a-z]/ { cmd = $3; print "C " cmd; next }
    depth == 1 && /^\.It / { cmd = ""; next }
    depth == 2 && cmd != "" && /^\.It Fl \\-[a-z]/ {
        o = $3; sub(/^\\-/, "", o); print "O " cmd " " o
    }
' "$page")
mapfile -t entries < <(awk '$1 == "C" {print $2}' <<<"$sect")
[ ${#entries[@]} -gt 0 ] || fail "esctl.1 has no COMMANDS section with .It Cm entries"

in_list() {
    local x=$1
    shift
    local y
    for y in "$@"; do [ "$x" = "$y" ] && return 0; done
    return 1
}

for c in "${cmds[@]}"; do
    n=$(awk -v c="$c" '$1 == "C" && $2 == c' <<<"$sect" | wc -l)
    if [ "$n" -eq 0 ]; then
        fail "command $c missing from the COMMANDS section of esctl.1"
        continue
    fi
    [ "$n" -eq 1 ] || fail "command $c has $n entries in esctl.1"
    if ! chelp=$("$ESCTL" "$c" --help); then
        fail "esctl $c --help failed"
        continue
    fi
    mapfile -t opts < <(grep -o -- '^  --[a-z][a-z-]*' <<<"$chelp" | sed 's/^  --//')
    mapfile -t documented < <(awk -v c="$c" '$1 == "O" && $2 == c {print $3}' <<<"$sect")
    ok=1
    for o in ${opts[@]+"${opts[@]}"}; do
        if ! in_list "$o" ${documented[@]+"${documented[@]}"}; then
            fail "option --$o of $c missing from its entry in esctl.1 (.It Fl \\-$o)"
            ok=0
        fi
    done
    for o in ${documented[@]+"${documented[@]}"}; do
        if ! in_list "$o" ${opts[@]+"${opts[@]}"}; then
            fail "esctl.1 documents --$o for $c, which $c does not accept"
            ok=0
        fi
    done
    [ $ok -eq 0 ] || ok "$c documented with its ${#opts[@]} option(s)"
done
for e in ${entries[@]+"${entries[@]}"}; do
    in_list "$e" "${cmds[@]}" || fail "esctl.1 documents $e, which esctl --help does not list"
done

# Order: the commands both lists have, in the same order.
want=() have=()
for c in "${cmds[@]}"; do in_list "$c" ${entries[@]+"${entries[@]}"} && want+=("$c"); done
for e in ${entries[@]+"${entries[@]}"}; do in_list "$e" "${cmds[@]}" && have+=("$e"); done
if [ "${want[*]-}" = "${have[*]-}" ]; then
    ok "commands of esctl.1 in the order of esctl --help"
else
    fail "commands of esctl.1 not in the order of esctl --help" \
        "esctl --help: ${want[*]-}" "esctl.1:      ${have[*]-}"
fi

# Global options: those of the usage line, and --help and --version.
gopts=$({
    head -1 <<<"$usage" | grep -o -- '--[a-z][a-z-]*'
    printf '%s\n' --help --version
} | sort -u)
gsect=$(awk '/^\.Sh / {on = ($0 == ".Sh GLOBAL OPTIONS"); next} on' "$page")
for o in $gopts; do
    if grep -Eq "^\.It Fl \\\\-${o#--}( |\$)" <<<"$gsect"; then
        ok "global option $o documented"
    else
        fail "global option $o missing from GLOBAL OPTIONS in esctl.1"
    fi
done

# ---- esd(8) ----

if [ -f "$epage" ]; then
    eopts=$({
        "$ESD" --help | grep -o -- '--[a-z][a-z-]*'
        "$ESD" run --help | grep -o -- '--[a-z][a-z-]*'
        grep -o '{ "[a-z][a-z-]*", [a-z_]*_argument' "$TOP/daemon/main.c" "$TOP/daemon/oneshot.c" |
            cut -d'"' -f2 | sed 's/^/--/'
    } | sort -u)
    [ -n "$eopts" ] || stop "no options parsed from esd --help and daemon/main.c"
    for o in $eopts; do
        if grep -Eq "^\.It (.* )?Fl \\\\-${o#--}( |\$)" "$epage"; then
            ok "esd $o documented"
        else
            fail "option $o of esd missing from esd.8"
        fi
    done
else
    fail "man/esd.8 missing"
fi

# ---- mandoc ----

if command -v mandoc >/dev/null; then
    for p in "$page" "$epage"; do
        [ -f "$p" ] || continue
        rc=0
        out=$(mandoc -Tlint "$p" 2>&1) || rc=$?
        rest=$(grep -v -e 'STYLE: referenced manual not found: ' -e 'outdated mandoc.db' \
            <<<"$out" || true)
        # mandoc: 0 nothing, 1 style, 2 warnings, 3 errors, 4 and above
        # unsupported input or a failure of mandoc itself.
        if [ -n "$rest" ] || [ "$rc" -gt 3 ]; then
            mapfile -t lines <<<"$rest"
            fail "mandoc -Tlint ${p##*/} (status $rc)" "${lines[@]}"
        else
            ok "mandoc -Tlint ${p##*/}"
        fi
        # Our own pages are not installed here: they must exist in man/.
        for xr in $({ grep -o 'Xr \(esd\|esctl\)[a-z.]* [1-9]' "$p" || true; } |
            sed 's/^Xr //; s/ /./' | sort -u); do
            [ -f "$TOP/man/$xr" ] || fail "${p##*/} refers to $xr, which man/ does not have"
        done
    done
else
    echo "# skip: mandoc -Tlint (mandoc not installed)"
fi
summary
