#!/usr/bin/env bash
# gpu_recipe: the bundled GPU recipe etc/recipes/gpu-text.yaml, which no
# test can run here (no GPU, and its models are not downloaded), is at
# least a valid recipe:
#   - `esctl prepare --local` accepts it (esd's recipe validation: every
#     operator shard-safe) and shards the sample with it;
#   - with .venv (scripts/venv) installed, against Data-Juicer 1.6.1 itself:
#     every operator is registered, every argument is one its class or
#     Data-Juicer's base operator takes (a misspelt key would otherwise
#     only show on a GPU node), at least one Mapper and one Filter use CUDA
#     (_accelerator "cuda") and ask Ray for a GPU (num_gpus), and every
#     hf_model is an absolute local path, never a Hub id. No operator is
#     instantiated (that would load the models). Skipped without .venv.
# real_registry.sh checks the recipe's operators against the registry too.
#
# Environment: TOP, ESCTL (see lib.bash).
set -euo pipefail
export LC_ALL=C

# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

RECIPE=$TOP/etc/recipes/gpu-text.yaml
new_workdir

run "$ESCTL" prepare --local --config "$RECIPE" --dataset-path "$TOP/tests/data/text-sample.jsonl" \
    --job-dir "$W/job" --num-shards 2
check "esctl prepare --local accepts the GPU recipe" 0 "Prepared 2 shards from 300 records"
cmp -s "$RECIPE" "$W/job/recipe.yaml" || fail "the job keeps the recipe as it is"
ok "the job holds the recipe, byte for byte"

PY="$TOP/.venv/bin/python"
if [ ! -x "$PY" ]; then
    echo "# skipped the Data-Juicer checks: the real Data-Juicer is not installed (scripts/venv)"
    summary
    exit 0
fi
run "$PY" - "$RECIPE" <<'PYEOF'
import inspect, os, sys
import yaml
from data_juicer.ops import OPERATORS
from data_juicer.ops.base_op import OP, Filter, Mapper

recipe = yaml.safe_load(open(sys.argv[1]))
base = set(OP._BASE_PARAMS) | set(inspect.signature(OP.__init__).parameters)
gpu = set()
for item in recipe["process"]:
    ((name, args),) = item.items()
    args = args or {}
    cls = OPERATORS.modules.get(name)
    assert cls, "%s is not a registered operator" % name
    own = set(inspect.signature(cls.__init__).parameters)
    unknown = sorted(set(args) - own - base)
    assert not unknown, "%s takes no %s" % (name, unknown)
    if getattr(cls, "_accelerator", "cpu") == "cuda":
        assert args.get("num_gpus", 0) > 0, "%s asks Ray for no GPU" % name
        gpu.add(Mapper if issubclass(cls, Mapper) else Filter if issubclass(cls, Filter) else None)
    for key in ("hf_model", "zh_to_en_hf_model"):
        if args.get(key) is not None:
            assert os.path.isabs(args[key]), "%s: %s %r is not a local path" % (
                name, key, args[key])
assert gpu >= {Mapper, Filter}, "a GPU Mapper and a GPU Filter: %s" % gpu
print("checked %d operators" % len(recipe["process"]))
PYEOF
check "Data-Juicer takes the recipe's operators and arguments" 0 "checked 6 operators"
summary
