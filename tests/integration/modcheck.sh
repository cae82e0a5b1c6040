#!/usr/bin/env bash
# modcheck: scripts/modcheck, the module graph check of make check (issue 16).
#   (a) The real tree (with the objects next to $ESD): exit 0, the layers of
#       common/, daemon/ and ctl/ printed, tries below claim below attempt,
#       call below watch, and the cycles cut by issue 16 gone: none is left.
#   (b) A tiny fake tree whose two modules include each other's headers:
#       exit 1 naming the cycle "common/a -> common/b -> common/a".
#   (c) Three modules that call round in a ring by their objects' symbols
#       only (no header includes another): exit 1 naming all three.
#   (d) A common/ file that includes a daemon/ header: a layering error.
set -euo pipefail

# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

new_workdir
MODCHECK=$TOP/scripts/modcheck
command -v python3 >/dev/null || skip "python3 missing"

# (a)
BUILT=$(dirname "$ESD")
run "$MODCHECK" "$TOP" "$BUILT"
check "the real tree has no cycle" 0 "modcheck: no cycle (includes, symbols)"
[ -z "$ERR" ] || fail "the real tree is clean" "stderr: $ERR"
missing=
for folder in common/ daemon/ ctl/; do
    grep -qx "$folder" <<<"$OUT" || missing="$missing $folder"
done
if [ -n "$missing" ]; then
    fail "the layers of every folder" "no line for:$missing" "stdout: $OUT"
else
    ok "the layers of every folder are printed"
fi
level() { # level of module $2 in folder $1 in $OUT
    awk -v f="$1/" -v m="$2" '/^[a-z]+\/$/ { in_f = ($0 == f); next }
        in_f { for (i = 2; i <= NF; i++) if ($i == m) { sub(":", "", $1); print $1 } }' <<<"$OUT"
}
t=$(level common tries) c=$(level common claim) a=$(level common attempt)
if [ -n "$t" ] && [ "$t" -lt "$c" ] && [ "$c" -lt "$a" ]; then
    ok "tries is below claim, claim below attempt"
else
    fail "tries < claim < attempt" "levels tries=$t claim=$c attempt=$a" "stdout: $OUT"
fi
cl=$(level ctl call) wa=$(level ctl watch) wo=$(level ctl worker)
if [ -n "$cl" ] && [ "$cl" -lt "$wa" ] && [ "$cl" -lt "$wo" ]; then
    ok "call is below watch and worker"
else
    fail "call < watch, worker" "levels call=$cl watch=$wa worker=$wo" "stdout: $OUT"
fi
left=
while read -r x y; do
    if grep -E "cycle: ($x -> $y -> $x|$y -> $x -> $y) " <<<"$ERR" >/dev/null; then
        left="$left $x<->$y"
    fi
done <<'PAIRS'
common/attempt common/claim
ctl/call ctl/watch
ctl/call ctl/worker
daemon/metrics daemon/runner
daemon/jobs daemon/sched
daemon/jobs daemon/jobview
daemon/nodes daemon/sched
PAIRS
if [ -n "$left" ]; then
    fail "the cycles of issue 16 item 2 are gone" "still there:$left" "stderr: $ERR"
else
    ok "the cycles of issue 16 item 2 are gone"
fi

# A fake tree: fake NAME makes $W/NAME with common/ and daemon/.
fake() {
    rm -rf "${W:?}/$1"
    mkdir -p "$W/$1/common" "$W/$1/daemon" "$W/$1/build/common"
}

# (b)
fake inc
printf '#include "b.h"\nint a_f(void) { return 1; }\n' >"$W/inc/common/a.c"
printf 'int a_f(void);\n' >"$W/inc/common/a.h"
printf '#include "a.h"\nint b_g(void) { return 2; }\n' >"$W/inc/common/b.c"
printf 'int b_g(void);\n' >"$W/inc/common/b.h"
run "$MODCHECK" "$W/inc" "$W/inc/build"
check "an include cycle fails" 1 "" "modcheck: cycle: common/a -> common/b -> common/a (includes)"

# (c)
command -v "${CC:-cc}" >/dev/null || skip "no C compiler for (c)"
fake sym
printf 'int b_g(void);\nint a_f(void) { return b_g(); }\n' >"$W/sym/common/a.c"
printf 'int c_h(void);\nint b_g(void) { return c_h(); }\n' >"$W/sym/common/b.c"
printf 'int a_f(void);\nint c_h(void) { return a_f(); }\n' >"$W/sym/common/c.c"
printf 'int other(void) { return 0; }\n' >"$W/sym/common/d.c"
for m in a b c d; do
    "${CC:-cc}" -c -o "$W/sym/build/common/$m.o" "$W/sym/common/$m.c"
done
run "$MODCHECK" "$W/sym" "$W/sym/build"
check "a symbol cycle fails" 1 "" \
    "modcheck: cycle: common/a -> common/b -> common/c -> common/a (symbols)"
if [[ $ERR != *"(includes)"* && $ERR != *common/d* ]]; then
    ok "the symbol cycle alone is named"
else
    fail "only the symbol cycle" "stderr names more" "stderr: $ERR"
fi
run "$MODCHECK" "$W/sym" "$W/none"
check "without objects only the includes are read" 0 "modcheck: no cycle (includes)"

# (d)
fake lay
printf '#include "conf.h"\n' >"$W/lay/common/x.c"
printf 'int conf;\n' >"$W/lay/daemon/conf.h"
run "$MODCHECK" "$W/lay" "$W/lay/build"
check "common/ including a daemon/ header fails" 1 "" \
    "modcheck: layering: common/x -> daemon/conf (includes: common/ sees only common/)"

summary
