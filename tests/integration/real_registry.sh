#!/usr/bin/env bash
# real_registry: esd's operator verdicts against the reference's, on every
# operator of the real Data-Juicer registry. tests/tools/dj-operators (run
# with the Python of .venv, made by scripts/venv) lists the registry with
# the reference's verdict (a Mapper or Filter subclass, no truthy
# is_global_operation, no "deduplicator", "global_" or "full_dataset_" in
# the name); the test tool classify prints esd's (recipe_verdict with no
# caller lists: the built-in exceptions of common/recipe.c, then the name
# rule). Every operator must get the same answer: shard-safe in both, or
# refused in both ("unknown" for an operator the reference accepts is a
# failure too). Also checks that every operator module imports and that the
# operators of the bundled recipes etc/recipes/*.yaml are registered and
# shard-safe. Skipped when .venv is missing; nothing is downloaded.
#
# Environment: TOP (the repository root; default: two levels above this
# script), JSONL_CHECK or TOOLS (where the built test tools are).
set -euo pipefail

# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

PY="$TOP/.venv/bin/python"
if [ ! -x "$PY" ]; then
    skip "the real Data-Juicer is not installed (run scripts/venv)"
fi
CLASSIFY="$TOOLS/classify"
[ -x "$CLASSIFY" ] || fail "classify exists" "not executable: $CLASSIFY (run make tools)"

new_workdir

# ---- the registry, with the reference's verdicts ----
run "$PY" "$TOP/tests/tools/dj-operators"
check "dj-operators imports every operator module" 0
cp "$W/stdout" "$W/ops.jsonl"

# ---- esd's verdicts on the same names ----
"$PY" -c 'import json, sys
for line in open(sys.argv[1]):
    print(json.loads(line)["name"])' "$W/ops.jsonl" >"$W/names"
"$CLASSIFY" <"$W/names" >"$W/esd" || fail "classify runs" "exit status $?"

# compare: prints "counts N SAFE" first, then one line per disagreement,
# then "note ..." lines for refusals esd calls unknown (the message differs
# from the reference's, the verdict does not).
"$PY" - "$W/ops.jsonl" "$W/esd" >"$W/compare" <<'EOF'
import json, sys
ref = [json.loads(line) for line in open(sys.argv[1])]
esd = dict(line.rsplit(" ", 1) for line in open(sys.argv[2]).read().splitlines())
print("counts", len(ref), sum(o["shard_safe"] for o in ref))
for o in ref:
    got = esd.get(o["name"], "missing")
    want = "safe" if o["shard_safe"] else "refused"
    if (got == "safe") != o["shard_safe"] or got == "missing":
        print("%s: the reference says %s (class %s, base %s, is_global_operation %s), esd says %s"
              % (o["name"], want, o["class"], o["base"], o["is_global"], got))
for o in ref:
    if not o["shard_safe"] and esd.get(o["name"]) == "unknown":
        print("note %s: esd refuses it as unknown, the reference as whole-dataset (base %s)"
              % (o["name"], o["base"]))
EOF
read -r _ total safe <"$W/compare"
mapfile -t diffs < <(sed 1d "$W/compare" | grep -v '^note ' || true)
[ "${#diffs[@]}" -eq 0 ] ||
    fail "esd agrees with the reference on all $total operators" "${diffs[@]}" \
        "(fix the built-in tables in common/recipe.c)"
sed -n 's/^note /# note: /p' "$W/compare"
ok "$total operators: $safe shard-safe, $((total - safe)) not; esd agrees on all"

# ---- the bundled recipes use registered, shard-safe operators ----
for recipe in "$TOP"/etc/recipes/*.yaml; do
    [ -e "$recipe" ] || continue
    bad=$("$PY" -c 'import json, sys, yaml
ref = {o["name"]: o for o in map(json.loads, open(sys.argv[2]))}
for item in yaml.safe_load(open(sys.argv[1]))["process"]:
    for name in item:
        if name not in ref:
            print(name, "is not registered")
        elif not ref[name]["shard_safe"]:
            print(name, "is not shard-safe")' "$recipe" "$W/ops.jsonl") ||
        fail "${recipe#"$TOP"/} parses" "$bad"
    [ -z "$bad" ] || fail "${recipe#"$TOP"/} uses registered shard-safe operators" "$bad"
    ok "${recipe#"$TOP"/} uses registered shard-safe operators"
done

summary
