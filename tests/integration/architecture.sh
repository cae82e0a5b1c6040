#!/usr/bin/env bash
# architecture: ARCHITECTURE.md stays true. Every module of common/,
# daemon/ and ctl/ (a .c or .h file, or esd-dj.py) is a row of its
# folder's table there, and every row names a module that exists; every
# path the document mentions (common/…, daemon/…, ctl/…, tests/…,
# scripts/…, man/…, etc/…, systemd/…) exists; and the folders' include
# rule it states holds: no common/ file includes a daemon/ or ctl/ header.
# A second run on a copy of the document with one row removed and one
# invented proves that the check can fail.
set -euo pipefail
export LC_ALL=C

# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

new_workdir

# rows DOC FOLDER: the first column's `name` of each row of the table
# under the heading "### `FOLDER/`" (up to the next heading).
rows() {
    awk -v h="### \`$2/\`" '
        /^#/ { on = index($0, h) == 1; next }
        on && /^\| `/ { s = $0; sub(/^\| `/, "", s); sub(/`.*/, "", s); print s }
    ' "$1" | sort -u
}
# modules FOLDER: the modules the tree has in FOLDER.
modules() {
    (cd "$TOP/$1" && ls -- *.c *.h *.py 2>/dev/null) |
        sed 's/\.[ch]$//' | sort -u
}
# problems DOC: one line per disagreement between DOC and the tree.
problems() {
    local d
    for d in common daemon ctl; do
        comm -13 <(rows "$1" "$d") <(modules "$d") | sed "s|^|not in ARCHITECTURE.md: $d/|"
        comm -23 <(rows "$1" "$d") <(modules "$d") | sed "s|^|no such module: $d/|"
    done
    grep -o '`\(common\|daemon\|ctl\|tests\|scripts\|man\|etc\|systemd\|bench\)/[A-Za-z0-9_./-]*`' "$1" |
        tr -d '`' | sort -u | while read -r p; do
            p=${p%/}
            case $p in *'*'*|*'<'*) continue ;; esac
            [ -e "$TOP/$p" ] || [ -e "$TOP/$p.c" ] || echo "no such path: $p"
        done
}

DOC=$TOP/ARCHITECTURE.md
[ -f "$DOC" ] || fail "ARCHITECTURE.md exists"
out=$(problems "$DOC")
[ -z "$out" ] || fail "ARCHITECTURE.md names every module and only modules that exist" "$out"
ok "ARCHITECTURE.md names all $(modules common | wc -l) modules of common/, $(modules daemon | wc -l) of daemon/, $(modules ctl | wc -l) of ctl/"

# the rule the document states: common/ sees only common/ headers
bad=$(grep -n '#include "' "$TOP"/common/*.c "$TOP"/common/*.h | while IFS=: read -r f l inc; do
    h=$(printf '%s' "$inc" | sed 's/.*#include "\([^"]*\)".*/\1/')
    [ -e "$TOP/common/$h" ] || echo "${f#"$TOP"/}:$l includes $h"
done)
[ -z "$bad" ] || fail "common/ includes only common/ headers" "$bad"
ok "common/ includes only common/ headers"

# the check itself: a document that lost a row and gained an invented
# module and path
first=$(rows "$DOC" common | head -n1)
sed -e "/^| \`$first\` |/d" -e '/^### `ctl\/`/,/^## /s/^| `watch` |/| `nosuchmod` | x |\n&/' \
    -e 's|`common/merge.h`|`common/nosuch.h`|' "$DOC" >"$W/doc.md"
printf '\nSee `scripts/nosuch-tool`.\n' >>"$W/doc.md"
out=$(problems "$W/doc.md")
for want in "not in ARCHITECTURE.md: common/$first" "no such module: ctl/nosuchmod" \
            "no such path: scripts/nosuch-tool"; do
    grep -qxF "$want" <<<"$out" || fail "a broken document is caught: $want" "$out"
done
ok "a document missing common/$first, naming ctl/nosuchmod and scripts/nosuch-tool is caught"

summary
