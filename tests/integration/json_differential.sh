#!/usr/bin/env bash
# Differential test of the JSONL validator against Python's json module,
# which is what the reference uses: thousands of random near-JSON records
# (fixed seeds, so a failure reproduces) must get the same verdict from both:
# accepted, blank, not an object, or rejected. Lone surrogate escapes are
# left out of the generator on purpose: esd refuses them where Python
# accepts them (and the reference later crashes).
set -euo pipefail
# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"
CHECK=${JSONL_CHECK:-$TOP/build/default/tools/jsonl-check}
[ -x "$CHECK" ] || fail "jsonl-check is built" "$CHECK not built (make tools)"
new_workdir
# The Python side prints one "not ok" line for each of the first ten
# records on which the verdicts differ, then its verdict line.
rc=0
python3 - "$CHECK" >"$W/out" <<'PY' || rc=$?
import json, random, subprocess, sys
check = sys.argv[1]
atoms = ['{', '}', '[', ']', ',', ':', '"a"', '"\\u00e9"', '"\\ud83d\\ude00"', '1', '-0',
         '0.5', '1e5', '1E-2', '01', '-', '.', 'e', 'NaN', 'Infinity', '-Infinity', 'nan',
         'true', 'false', 'null', 'tru', ' ', '\t', '\r', '"x', '\\', '"\\n"', '"\\x"',
         '"\u00e9"', '\x01', '\x7f', '"\t"', '"\\u12"', '+1', '1.', '.5', '"\\"', '"\\\\"',
         '\ufeff', '\u2028', '12345678901234567890123', '1e999', '-1.5e-7']
failed = 0
total = 0
for seed in range(1, 6):
    rng = random.Random(seed)
    lines = []
    for _ in range(8000):
        k = rng.randint(1, 12)
        body = ''.join(rng.choice(atoms) for _ in range(k))
        lines.append('{"k":' + body + '}' if rng.random() < 0.5 else body)
    data = '\n'.join(lines) + '\n'
    got = subprocess.run([check], input=data.encode(), capture_output=True,
                         check=True).stdout.decode().split()
    assert len(got) == len(lines), (len(got), len(lines))
    for s, g in zip(lines, got):
        b = s.encode()
        if not b.strip(b' \t\r\x0b\x0c'):
            want = 'blank'
        else:
            try:
                v = json.loads(s)
                want = 'ok' if isinstance(v, dict) else 'not_object'
            except ValueError:
                want = 'rejected'
        mine = g if g in ('ok', 'blank', 'not_object') else 'rejected'
        total += 1
        if mine != want:
            failed += 1
            if failed <= 10:
                print('not ok - %r: python %s, esd %s' % (s, want, g))
print('%d records, %d verdicts differ from Python' % (total, failed))
sys.exit(1 if failed else 0)
PY
verdict=$(tail -n 1 "$W/out")
if [ "$rc" -eq 0 ]; then
    ok "$verdict"
else
    mapfile -t lines <"$W/out"
    fail "jsonl-check and Python's json module agree (exit status $rc)" "${lines[@]}"
fi
summary
