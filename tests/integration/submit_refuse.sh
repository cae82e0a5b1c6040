#!/usr/bin/env bash
# submit_refuse: esctl submit refuses what cannot work and says why, before
# anything is prepared or registered (issue 15 item 5). One esd (root,
# shared_fs_check on, the stand-in processor) runs in a mount namespace of
# its own, as under systemd: /tmp is another tmpfs there (PrivateTmp=) and
# $W/ro is read-only (ProtectSystem=strict); $W itself is bound back.
#   (a) --everywhere --config with spool_dir missing: refused naming it;
#       no job directory made.
#   (b) --everywhere on a node-local file system ($W's ext4/tmpfs...):
#       refused naming the type, nothing prepared, the spool empty.
#   (c) a job under a read-only path: refused naming ReadWritePaths= and
#       `systemctl edit esd`.
#   (d) a job under the submitter's /tmp that esd does not see: refused
#       naming PrivateTmp.
#   (e) the same job under $W, without --everywhere: registered (the
#       checks pass what works), and no refused job is in esd's list.
#   (f) uids that differ between nodes, simulated by a spool registration
#       (written by hand, as root may) that records another uid than the
#       directory's: node n2 refuses it and records why in the spool, and
#       `esctl status DIR` through n1 shows "node n2 refuses the job" with
#       both uids; the registration corrected, n2 adopts the job and its
#       record goes; cancel --everywhere of a refused registration removes
#       the nodes' records with it.
#   (g) an operator the processor's registry does not know (a stand-in
#       data_juicer.ops on PYTHONPATH behind a processor named
#       dj-process): submit --config through n2 refuses the misspelt
#       whitespace_normalisation_mapper with "did you mean
#       'whitespace_normalization_mapper'", before any job directory
#       exists; a correct recipe passes; prepare --local with no
#       readable registry prepares and says it judged the names alone.
#   (h) --processor ./bin/dj-process, relative to esctl's cwd, reaches esd
#       absolute: its prepare finds the processor's registry.
# Needs root (mounts, unshare); skips otherwise.
set -euo pipefail
export LC_ALL=C
# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

in_mount_ns "the submit refusals test" "$@"
new_workdir
unset_knobs
need_daemon_tools
chmod 755 "$W"
T2=$(mktemp -d)            # the submitter's /tmp only
B=$(mktemp -d -p /run)     # where esd's namespace keeps $W while /tmp is replaced
trap 'rm -rf "$T2"; rmdir "$B" 2>/dev/null || true; cleanup' EXIT
chmod 755 "$T2"
text_dataset 200
mkdir -p "$W/ro"
prepare_job "$W/ro/job" 2
prepare_job "$T2/job" 2
prepare_job "$W/job" 2
prepare_job "$W/job2" 2
prepare_job "$W/job3" 2
chown -R nobody: "$W/ro" "$T2/job" "$W/job" "$W/job2" "$W/job3"
mkdir -p "$W/mine" && chown nobody: "$W/mine"

# esd as systemd would sandbox it (PrivateTmp=yes, ProtectSystem=strict)
cat >"$W/esd-ns" <<SH
#!/bin/sh
exec unshare --mount --propagation private sh -c '
    mount --rbind "$W" "$B" && mount -t tmpfs tmpfs /tmp && mkdir -p "$W" &&
    mount --rbind "$B" "$W" && mount --bind "$W/ro" "$W/ro" &&
    mount -o remount,bind,ro "$W/ro" && exec "\$0" "\$@"' "$ESD" "\$@"
SH
chmod 755 "$W/esd-ns"
daemon_conf n1 shared_fs_check=true spool_dir="$W/nospool"
rmdir "$W/spool"
ESD=$W/esd-ns start_daemon n1
S=(--socket "$(dsock n1)")
REC=(--config "$W/recipe.yaml" --dataset-path "$W/data.jsonl" --num-shards 2)

# (a)
run "$ESCTL" "${S[@]}" submit --everywhere "$W/mine/new" "${REC[@]}"
check "(a) submit --everywhere --config without the spool_dir is refused" 2 "" \
    "spool_dir $W/nospool does not exist on this node"
[[ $ERR == *"mkdir -p $W/nospool"* ]] || fail "(a) the refusal names the fix" "$ERR"
[ ! -e "$W/mine/new" ] || fail "(a) nothing is prepared before the refusal" "$(ls -R "$W/mine")"
ok "(a) nothing prepared: $ERR"

# (b)
mkdir -p "$W/nospool"
FST=$(stat -f -c %T "$W")
run "$ESCTL" "${S[@]}" submit --everywhere "$W/mine/new" "${REC[@]}"
check "(b) submit --everywhere on a node-local file system is refused" 2 "" \
    "$W/mine/new is on a node-local file system ("
[[ $ERR == *"shared_fs_check: false"* ]] || fail "(b) the refusal names the escape hatch" "$ERR"
[ ! -e "$W/mine/new" ] || fail "(b) nothing is prepared before the refusal"
run "$ESCTL" "${S[@]}" submit --everywhere "$W/job"
check "(b) also for a prepared job" 2 "" "node-local file system"
[ -z "$(ls -A "$W/nospool")" ] || fail "(b) nothing is registered in the spool" "$(ls "$W/nospool")"
ok "(b) refused on $FST: $ERR"

# (c)
run "$ESCTL" "${S[@]}" submit "$W/ro/job"
check "(c) a job read-only for esd is refused" 2 "" "$W/ro/job is read-only for esd"
[[ $ERR == *"systemctl edit esd"* && $ERR == *"ReadWritePaths=$W/ro/job"* ]] ||
    fail "(c) the refusal names the drop-in" "$ERR"

# (d)
run "$ESCTL" "${S[@]}" submit "$T2/job"
check "(d) a job in the submitter's /tmp is refused" 2 "" \
    "esd runs with PrivateTmp: $T2/job is not the same directory for it"

# (e)
run "$ESCTL" "${S[@]}" --json list
check "(e) esd lists no refused job" 0
[[ $OUT != *"$W/ro/job"* && $OUT != *"$T2/job"* && $OUT != *"$W/job"* ]] ||
    fail "(e) a refused job is registered" "$OUT"
run "$ESCTL" "${S[@]}" submit "$W/job"
check "(e) a job esd sees and may write is registered" 0 "Submitted $W/job"
# (f)
daemon_conf n2 spool_dir="$W/nospool"
mkdir -p "$W/fakedj/data_juicer/ops" "$W/bin"
: >"$W/fakedj/data_juicer/__init__.py"
cat >"$W/fakedj/data_juicer/ops/__init__.py" <<'PY'
class _Registry:
    modules = {"whitespace_normalization_mapper": object, "text_length_filter": object,
               "clean_links_mapper": object}
OPERATORS = _Registry()
PY
printf '#!/usr/bin/python3\nimport os, sys\nos.execv(sys.argv[0] + ".real", sys.argv)\n' >"$W/bin/dj-process"
chmod -R a+rX "$W/fakedj" "$W/bin"
chmod 755 "$W/bin/dj-process"
start_daemon n2 PYTHONPATH="$W/fakedj"
reg() {
    printf '{"job_dir": "%s", "uid": %s, "node": "n1"}\n' "$W/job2" "$1" >"$W/nospool/.job2.tmp"
    mv "$W/nospool/.job2.tmp" "$W/nospool/job2.json"
}
refused() { compgen -G "$W/nospool/*.n2.refused" >/dev/null; }
reg 4242
wait_for "(f) n2 records in the spool why it refuses the job" 20 refused
run "$ESCTL" "${S[@]}" status "$W/job2"
[[ $OUT == *"node n2 refuses the job: $W/job2 is owned by uid $(id -u nobody) on node n2, but by uid 4242 on node n1"* &&
    $OUT == *"the uids differ between nodes"* ]] || fail "(f) status through n1 shows n2's refusal" "$OUT" "$ERR"
ok "(f) status through n1 shows n2's refusal: $(grep refuses <<<"$OUT")"
reg "$(id -u nobody)"
wait_for "(f) n2 adopts the corrected registration and drops its record" 20 eval '! refused'
[ "$(job_state n2 "$W/job2")" != absent ] || fail "(f) n2 works the job"
ok "(f) n2 adopted the corrected registration"
K3=$(printf %s "$W/job3" | sha256sum | cut -c1-16)
printf '{"job_dir": "%s", "uid": 4242, "node": "n1"}\n' "$W/job3" >"$W/nospool/.job3.tmp"
mv "$W/nospool/.job3.tmp" "$W/nospool/$K3.json"
wait_for "(f) n2 refuses another registration" 20 refused
run "$ESCTL" "${S[@]}" cancel --everywhere "$W/job3"
check "(f) cancel --everywhere of it" 0
[ ! -e "$W/nospool/$K3.json" ] || fail "(f) cancel --everywhere removes the registration"
wait_for "(f) cancel --everywhere removes the nodes' refusal records" 10 eval '! refused'
ok "(f) no refusal record is left"
# (g)
sed 's/whitespace_normalization_mapper/whitespace_normalisation_mapper/' "$W/recipe.yaml" >"$W/typo.yaml"
S2=(--socket "$(dsock n2)")
run "$ESCTL" "${S2[@]}" submit "$W/mine/typo" --config "$W/typo.yaml" --dataset-path "$W/data.jsonl" \
    --num-shards 2 --processor "$W/bin/dj-process"
check "(g) an operator the registry does not know is refused" 2 "" \
    "Unknown operator 'whitespace_normalisation_mapper' in $W/typo.yaml: the processor's Data-Juicer (3 operators of data_juicer.ops in /usr/bin/python3) registers no such operator; did you mean 'whitespace_normalization_mapper'?"
[ ! -e "$W/mine/typo" ] || fail "(g) nothing is prepared" "$(ls -R "$W/mine/typo")"
run "$ESCTL" "${S2[@]}" --json list
[[ $OUT != *"$W/mine/typo"* ]] || fail "(g) nothing is registered" "$OUT"
run "$ESCTL" "${S2[@]}" submit "$W/mine/good" "${REC[@]}" --processor "$W/bin/dj-process"
check "(g) a recipe of registered operators is prepared and registered" 0 "Submitted $W/mine/good"
[[ $OUT != *"judged by their names alone"* ]] || fail "(g) the registry was read" "$OUT"
run "$ESCTL" prepare --local --config "$W/typo.yaml" --dataset-path "$W/data.jsonl" \
    --job-dir "$W/unchecked" --num-shards 2 --processor "$W/bin/dj-process"
check "(g) without a readable registry prepare judges names alone and says so" 0 \
    "Operator names were judged by their names alone: the processor's operator registry could not be read (/usr/bin/python3 cannot import data_juicer.ops"
# (h)
run env -C "$W" "$ESCTL" "${S2[@]}" --json submit "$W/mine/rel" "${REC[@]}" --processor ./bin/dj-process
check "(h) submit with a relative --processor" 0 '"operators_checked": "3 operators of data_juicer.ops'
stop_daemon n2
stop_daemon n1
[ "$DRC" -eq 0 ] || fail "esd exits 0" "status $DRC" "$(tail -n 20 "$W/n1/log")"
summary
