#!/usr/bin/env bash
# prepare_race: root's prepare into a directory another user can write
# (issue 11, class 5), played as that user with two throwaway users: the
# attacker ATT and the victim VIC, who owns a prepared job.
#   (a) honest: root's `esctl prepare --local` into ATT's directory runs as
#       ATT: the job and the directories made on the way are ATT's, none
#       root's; into root's own directory it stays root's.
#   (b) the staging directory swapped for a link to VIC's job, by ATT
#       watching for it: in ATT's directory (where prepare runs as ATT) and
#       in a root-owned directory ATT's group may write (where root prepares
#       as root, through descriptors). The prepare fails and says so; VIC's
#       job is byte for byte as it was; nothing root-owned appears in ATT's
#       directory.
#   (c) a link to VIC's job planted at the job's own name while prepare
#       runs: not followed, not renamed over.
# Needs root (useradd, setpriv); skipped otherwise.
#
# Environment: ESCTL (absolute path of the esctl binary; default ./esctl),
# TOP (the repository root).
set -euo pipefail

ESCTL=${ESCTL:-./esctl}
# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

if [ "$(id -u)" -ne 0 ] || ! command -v useradd >/dev/null || ! command -v setpriv >/dev/null; then
    skip "needs root, useradd and setpriv to play other users"
fi
[ -x "$ESCTL" ] || fail "esctl exists" "not executable: $ESCTL (run make first)"

new_workdir
chmod 755 "$W"
ATT=esdpr-att-$$
VIC=esdpr-vic-$$
USERS=()
drop_users() {
    local u
    for u in "${USERS[@]}"; do
        userdel "$u" 2>/dev/null || true
        groupdel "$u" 2>/dev/null || true
    done
}
trap 'drop_users; cleanup' EXIT
for u in "$ATT" "$VIC"; do
    useradd -M -U -d /nonexistent -s /usr/sbin/nologin "$u" || fail "useradd $u"
    USERS+=("$u")
done
as() {
    local u=$1
    shift
    setpriv --reuid="$u" --regid="$(id -g "$u")" --init-groups "$@"
}
# A python every user may run (root's python3 may live under /root).
PYBIN=$(command -v python3)
[ -x /usr/bin/python3 ] && PYBIN=/usr/bin/python3

# Enough records that the staging directory lives for a while.
"$PYBIN" - "$W/data.jsonl" <<'EOF'
import sys
with open(sys.argv[1], "w") as f:
    for i in range(200000):
        f.write('{"id":%d,"text":"record %d with some words in it %s"}\n' % (i, i, "x" * (i % 40)))
EOF
printf 'process:\n  - whitespace_normalization_mapper:\n' >"$W/recipe.yaml"
chmod 644 "$W/data.jsonl" "$W/recipe.yaml"
prep() { # prep JOB: root's local prepare of the dataset into JOB
    run "$ESCTL" prepare --local --config "$W/recipe.yaml" --dataset-path "$W/data.jsonl" \
        --job-dir "$1" --num-shards 4
}

# VIC's job, made by VIC, and what it looks like.
mkdir -m 755 "$W/vic" "$W/att" "$W/rootdir"
chown "$VIC": "$W/vic"
chown "$ATT": "$W/att"
as "$VIC" "$ESCTL" prepare --local --config "$W/recipe.yaml" --dataset-path "$W/data.jsonl" \
    --job-dir "$W/vic/job" --num-shards 2 >"$W/vic.out" 2>&1 || fail "VIC prepares" "$(cat "$W/vic.out")"
snapshot() {
    (cd "$W/vic" && find . -printf '%p %U %G %m %s %T@\n' | sort &&
        find . -type f -exec sha256sum {} + | sort)
}
snapshot >"$W/vic.before"
vic_unchanged() {
    snapshot >"$W/vic.after"
    cmp -s "$W/vic.before" "$W/vic.after" ||
        fail "$1: VIC's job is as it was" "$(diff "$W/vic.before" "$W/vic.after" | head -n 10)"
}

# ---- (a) honest prepares ----
prep "$W/att/j1"
check "root prepares into ATT's directory" 0 "Prepared 4 shards from 200000 records"
[ "$(stat -c %U "$W/att/j1")" = "$ATT" ] || fail "the job is ATT's" "$(stat -c %U "$W/att/j1")"
[ -z "$(not_owned_by "$ATT" "$W/att")" ] ||
    fail "every file of the job is ATT's" "$(not_owned_by "$ATT" "$W/att")"
ok "the job and all in it belong to ATT, the owner of the directory: prepare ran as ATT"
prep "$W/att/new/deeper/j2"
check "root prepares into ATT's directory, two levels to make" 0 "Prepared 4 shards"
[ "$(stat -c %U "$W/att/new" "$W/att/new/deeper" "$W/att/new/deeper/j2" | sort -u)" = "$ATT" ] ||
    fail "the directories made on the way are ATT's" "$(stat -c '%n %U' "$W/att/new" "$W/att/new/deeper")"
ok "the directories made on the way are ATT's too"
prep "$W/rootdir/j"
check "root prepares into its own directory" 0 "Prepared 4 shards"
[ -z "$(not_owned_by root "$W/rootdir")" ] || fail "root's job is root's"
ok "in root's own directory the job stays root's"
cp "$W/recipe.yaml" "$W/root-recipe.yaml"
chmod 600 "$W/root-recipe.yaml"
run "$ESCTL" prepare --local --config "$W/root-recipe.yaml" --dataset-path "$W/data.jsonl" \
    --job-dir "$W/att/j3" --num-shards 2
check "as ATT, a recipe only root may read is not read" 4 "" "prepare ran as $ATT (uid $(id -u "$ATT")), the owner of $W/att"
[ ! -e "$W/att/j3" ] || fail "nothing was prepared from root's recipe"
ok "the error names the identity prepare took; nothing prepared"

# ---- (b) the staging directory swapped for a link ----
# attacker DIR JOBNAME MODE: as ATT, waits for the staging directory of
# JOBNAME in DIR, then (MODE swap) moves it aside and puts a link to VIC's
# job in its place, or (MODE plant) puts that link at JOBNAME itself.
# Writes $SIG/ready once watching, $SIG/done once done.
SIG=$W/sig
mkdir -m 755 "$SIG"
chown "$ATT": "$SIG"
attacker() {
    rm -f "$SIG/ready" "$SIG/done"
    as "$ATT" "$PYBIN" - "$@" "$W/vic/job" "$SIG" <<'EOF' &
import os, sys, time
d, job, mode, target, w = sys.argv[1:]
prefix = "." + job + ".preparing."
open(w + "/ready", "w").close()
deadline = time.time() + 60
while time.time() < deadline:
    for n in os.listdir(d):
        if not n.startswith(prefix):
            continue
        try:
            if mode == "swap":
                os.rename(os.path.join(d, n), os.path.join(d, "aside" + n))
                os.symlink(target, os.path.join(d, n))
            else:
                os.symlink(target, os.path.join(d, job))
        except OSError as e:
            print("attack failed:", e)
            continue
        with open(w + "/done", "w") as f:
            f.write(mode + "\n")
        sys.exit(0)
sys.exit(1)
EOF
    APID=$!
    BG+=("$APID")
    wait_for "the attacker watches" 20 test -e "$SIG/ready"
}
# race DIR MODE WHAT EXPECT...: root prepares DIR/jN while the attacker
# plays MODE; tried again (a new name) while the prepare wins the race.
# Passes when the attack happened and the prepare failed with one of the
# EXPECTed messages.
N=0
race() {
    local dir=$1 mode=$2 what=$3 tries=0 e hit
    shift 3
    while :; do
        N=$((N + 1))
        tries=$((tries + 1))
        attacker "$dir" "r$N" "$mode"
        prep "$dir/r$N"
        kill "$APID" 2>/dev/null || true
        wait "$APID" 2>/dev/null || true
        [ -e "$SIG/done" ] && break
        [ "$RC" -eq 0 ] || fail "$what: a prepare not attacked succeeds" "$ERR"
        [ "$tries" -lt 6 ] || fail "$what: the attacker saw the staging directory in time" "$tries tries"
    done
    [ "$RC" -ne 0 ] || fail "$what: the attacked prepare fails" "$OUT"
    hit=
    for e in "$@"; do [[ $ERR == *"$e"* ]] && hit=1; done
    [ -n "$hit" ] || fail "$what: the failure says why" "$ERR"
    ok "$what: the attacked prepare fails: ${ERR%%$'\n'*}"
    vic_unchanged "$what"
    ok "$what: nothing was written in VIC's job"
    JOB=$dir/r$N
}
SWAPPED=("was moved or replaced while this prepare ran" "is not the directory this prepare made"
    "cannot open staging directory" "cannot create shard" "cannot create"
    "cannot write")

race "$W/att" swap "ATT's directory, staging swapped" "${SWAPPED[@]}"
[ ! -e "$JOB" ] || [ -L "$JOB" ] || fail "no job published under the swapped name"
[ -z "$(find "$W/att" -user root | head -n 3)" ] ||
    fail "nothing of root's in ATT's directory" "$(find "$W/att" -user root | head -n 3)"
ok "ATT's directory holds nothing of root's"

# A directory of root's that ATT's group may write: root prepares as root.
mkdir -m 775 "$W/shared"
chgrp "$ATT" "$W/shared"
race "$W/shared" swap "root's group-writable directory, staging swapped" "${SWAPPED[@]}"
[ ! -e "$JOB" ] || [ -L "$JOB" ] || fail "no job published under the swapped name"
[ -z "$(find "$W/shared" -mindepth 2 -user root -type f | head -n 3)" ] ||
    fail "root's staging directory was emptied" "$(find "$W/shared" -mindepth 2 -type f | head -n 3)"
ok "root's moved staging directory was emptied, not published"

# ---- (c) a link planted at the job's name ----
race "$W/shared" plant "root's group-writable directory, link at the job's name" \
    "appeared while this prepare ran"
[ -L "$JOB" ] && [ "$(readlink "$JOB")" = "$W/vic/job" ] || fail "the link is still ATT's link"
ok "the planted link is neither followed nor replaced"
[ -z "$(find "$W/shared" -maxdepth 1 -name ".${JOB##*/}.preparing.*")" ] ||
    fail "no staging directory left behind" "$(find "$W/shared" -maxdepth 1 -name ".${JOB##*/}.preparing.*")"
ok "no staging directory left behind"

summary
