#!/usr/bin/env bash
# readme: every command in README.md is exercised by a test, and is real.
#
# The commands are the lines of the README's fenced shell blocks (```sh,
# ```bash, ```shell; in ```console blocks only the lines starting with
# "$ "), a line ending in a backslash continued on the next, comments and
# heredoc bodies left out, each line cut into simple commands at | || &&
# ; & ( ) <( $( (leading VAR=value, sudo [-u USER], env and runuser
# dropped). Checked for every simple command that runs esctl, esd, make or
# one of scripts/*:
#   (a) the README starts with `make demo` and `make check`, in its first
#       shell block, which holds nothing else;
#   (b) its program and subcommand (esctl: the command after the global
#       options; esd: its first --option; make: the first target) appear
#       together on one line of a test script (tests/, but not tests/data
#       or this script), .ci/run or scripts/demo, outside a comment and
#       outside quoted text with blanks (a message): the program as its
#       name, a path ending in it or $ESCTL/$ESD; the subcommand as a word
#       after it. A failure names the README's line;
#   (c) an esctl command is in `esctl --help` and its options in
#       `esctl <command> --help` (or global: --json --local --socket
#       --help); esd's options in `esd --help`; a make target is a target
#       of the Makefile; a scripts/ program exists and is executable.
#
# Environment: TOP, ESCTL, ESD (see lib.bash).
set -euo pipefail
export LC_ALL=C
# shellcheck source=tests/integration/lib.bash
. "$(dirname "$0")/lib.bash"

new_workdir
{ [ -x "$ESCTL" ] && [ -x "$ESD" ]; } || fail "esctl and esd exist" "run make"
README=$TOP/README.md
[ -f "$README" ] || fail "README.md exists" "$README"

# what esctl and esd say they accept
mkdir -p "$W/help"
"$ESCTL" --help >"$W/esctl.help" 2>&1 || fail "esctl --help" "$(cat "$W/esctl.help")"
sed -n '/^commands:/,/^$/p' "$W/esctl.help" | awk 'NF && $1 != "commands:" {print $1}' >"$W/commands"
[ "$(wc -l <"$W/commands")" -ge 10 ] || fail "esctl --help lists the commands" "$(cat "$W/esctl.help")"
while read -r c; do
    "$ESCTL" "$c" --help >"$W/help/$c" 2>&1 || fail "esctl $c --help" "$(cat "$W/help/$c")"
done <"$W/commands"
"$ESD" --help >"$W/esd.help" 2>&1 || fail "esd --help" "$(cat "$W/esd.help")"
"$ESD" run --help >"$W/esd-run.help" 2>&1 || fail "esd run --help" "$(cat "$W/esd-run.help")"
ok "esctl --help lists $(wc -l <"$W/commands") commands, each with its --help; esd --help"

python3 - "$TOP" "$README" "$W" <<'EOF' | tee "$W/result"
import os, re, shlex, sys

top, readme, w = sys.argv[1:]
rel = os.path.relpath(readme, top)
failures = []

def ok(text):
    print("ok - " + text)

def bad(text, *detail):
    failures.append(text)
    print("not ok - " + text)
    for d in detail:
        print("#   " + d)

# ---- the README's commands ----
SHELL_INFO = {"sh", "bash", "shell", "console"}

def readme_commands():
    """[(block number, README line, logical line)] of the shell blocks."""
    out, block, info, pending, start, heredoc = [], 0, None, "", 0, None
    for no, line in enumerate(open(readme, encoding="utf-8"), 1):
        line = line.rstrip("\n")
        fence = re.match(r"^\s*```\s*([\w-]*)", line)
        if fence:
            if info is None:
                info = fence.group(1) or "-"
                block += 1
            else:
                info, pending, heredoc = None, "", None
            continue
        if info not in SHELL_INFO:
            continue
        if heredoc is not None:
            if line.strip() == heredoc:
                heredoc = None
            continue
        text = line
        if info == "console":
            if not pending:
                if not text.startswith("$ "):
                    continue
                text = text[2:]
        elif not pending and text.startswith("$ "):
            text = text[2:]
        if not pending:
            start = no
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        text = pending + text
        pending = ""
        m = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", text)
        if m:
            heredoc = m.group(1)
        if text.strip() and not text.strip().startswith("#"):
            out.append((block, start, text))
    return out

PUNCT = set("();<>|&")

def simple_commands(text):
    lex = shlex.shlex(text, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    lex.commenters = "#"
    cmds, cur, skip = [], [], False
    for t in lex:
        if skip:
            skip = False
        elif t and set(t) <= PUNCT and not ("(" in t or ")" in t) and (">" in t or t[0] == "<"):
            skip = True  # a redirection: the next word is its file
        elif t and set(t) <= PUNCT:
            if cur:
                cmds.append(cur)
            cur = []  # | || && ; & ( ) <( and the like
        else:
            cur.append(t)
    if cur:
        cmds.append(cur)
    result = []
    for c in cmds:
        # leading assignments and wrappers
        while c:
            if re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", c[0]):
                c = c[1:]
            elif c[0] in ("sudo", "runuser"):
                c = c[1:]
                while c and c[0].startswith("-"):
                    c = c[2:] if c[0] in ("-u", "-g") else c[1:]
                    if c and c[0] == "--":
                        c = c[1:]
                        break
            elif c[0] in ("env", "time", "exec", "nohup", "command"):
                c = c[1:]
            else:
                break
        if c:
            result.append(c)
    return result

def program(word):
    base = os.path.basename(word)
    if word.startswith("scripts/") or word.startswith("./scripts/"):
        return "scripts/" + base
    if base in ("esctl", "esd", "make"):
        return base
    return None

GLOBAL = {"--json", "--local", "--socket", "--help"}

def key_of(prog, args):
    """(subcommand or None, global options given before it, the rest)."""
    if prog == "esctl":
        glob, i = [], 0
        while i < len(args) and args[i].startswith("-") and args[i] not in ("--help", "--version", "-h"):
            glob.append(args[i].split("=")[0])
            i += 2 if args[i] == "--socket" else 1
        return (args[i] if i < len(args) else None), glob, args[i + 1:]
    if prog == "esd":
        if args and args[0] == "run":
            return "run", [], args[1:]
        for a in args:
            if a.startswith("--") and a not in ("--config", "--foreground"):
                return a.split("=")[0], [], args
        return None, [], args
    if prog == "make":
        i = 0
        while i < len(args):
            a = args[i]
            if a in ("-C", "-f", "-I", "-o", "-W"):
                i += 2
                continue
            if a.startswith("-") or "=" in a:
                i += 1
                continue
            return a, [], args
        return None, [], args
    return None, [], args

# ---- where commands are exercised ----
def corpus():
    # the integration scripts first: they name the strongest evidence
    files = sorted(os.path.join(top, "tests/integration", n)
                   for n in os.listdir(os.path.join(top, "tests/integration")))
    files += [os.path.join(top, ".ci/run"), os.path.join(top, "scripts/demo")]
    for d, dirs, names in os.walk(os.path.join(top, "tests")):
        dirs[:] = [x for x in dirs if os.path.join(d, x) != os.path.join(top, "tests/data")]
        for n in sorted(names):
            p = os.path.join(d, n)
            if p in files:
                continue
            try:
                head = open(p, "rb").read(2)
            except OSError:
                continue
            if n.endswith((".sh", ".bash")) or head == b"#!":
                files.append(p)
    lines = []
    for p in files:
        if p == os.path.join(top, "tests/integration/readme.sh") or not os.path.isfile(p) or not (
                p.endswith((".sh", ".bash")) or open(p, "rb").read(2) == b"#!"):
            continue
        try:
            text = open(p, encoding="utf-8", errors="replace").read()
        except OSError:
            continue
        for no, l in enumerate(text.split("\n"), 1):
            s = l.strip()
            if s and not s.startswith("#"):
                # quoted text with blanks is a message, not a command
                l = re.sub(r"\"(?:[^\"\\]|\\.)*\"|'[^']*'",
                           lambda m: " " if re.search(r"\s", m.group(0)) else m.group(0), l)
                lines.append(("%s:%d" % (os.path.relpath(p, top), no), l))
    return lines

PROG_RE = {
    "esctl": r"(?:\$\{?ESCTL\}?(?!\w)|(?<![\w.-])(?:[\w./$-]*/)?esctl(?![\w./-]))",
    "esd": r"(?:\$\{?ESD\}?(?!\w)|(?<![\w.-])(?:[\w./$-]*/)?esd(?![\w./-]))",
    "make": r"(?<![\w$(.-])make(?![\w.-])",
}

def exercised(lines, prog, sub):
    if prog.startswith("scripts/"):
        pr = re.compile(r"(?<![\w.-])" + re.escape(prog) + r"(?![\w.-])")
    else:
        pr = re.compile(PROG_RE[prog])
    sr = re.compile(r"(?<![\w-])" + re.escape(sub) + r"(?![\w-])") if sub else None
    for path, l in lines:
        for m in pr.finditer(l):
            if sr is None or sr.search(l, m.end()):
                return path
    return None

# ---- what is real ----
commands = open(os.path.join(w, "commands")).read().split()
def esctl_options(cmd):
    return set(re.findall(r"^\s+(--[\w-]+)", open(os.path.join(w, "help", cmd)).read(), re.M))
esd_options = set(re.findall(r"(?<![\w-])(--?[\w-]+)", open(os.path.join(w, "esd.help")).read())) | {"-h", "--help"}
esd_run_options = set(re.findall(r"(?<![\w-])(--[\w-]+)", open(os.path.join(w, "esd-run.help")).read())) | {"-h", "--help"}
make_targets = set(re.findall(r"^([\w.-]+)\s*:(?!=)", open(os.path.join(top, "Makefile")).read(), re.M))

cmds = readme_commands()
if not cmds:
    bad("%s has shell blocks with commands" % rel)
first = [c for c in cmds if c[0] == min(b for b, _, _ in cmds)]
first_words = [" ".join(simple_commands(t)[0]) if simple_commands(t) else "" for _, _, t in first]
if first_words == ["make demo", "make check"] and first[0][1] < 12:
    ok("%s starts with `make demo` and `make check` (line %d)" % (rel, first[0][1]))
else:
    bad("%s starts with a shell block of `make demo` and `make check`" % rel,
        "its first shell block (line %d): %s" % (first[0][1], first_words))

lines = corpus()
seen = {}
checked = 0
for _, no, text in cmds:
    try:
        simple = simple_commands(text)
    except ValueError as e:
        bad("%s:%d: the command can be parsed (%s)" % (rel, no, e), text)
        continue
    for c in simple:
        prog = program(c[0])
        if prog is None:
            continue
        checked += 1
        sub, glob, rest = key_of(prog, c[1:])
        name = prog + (" " + sub if sub else "")
        where = "%s:%d" % (rel, no)
        # (c) real
        if prog == "esctl":
            for g in glob:
                if g not in GLOBAL:
                    bad("%s: `%s` is a global option of esctl" % (where, g), text)
            if sub is None:
                bad("%s: esctl is given a command" % where, text)
                continue
            if sub not in commands and sub not in ("--help", "--version", "-h"):
                bad("%s: `esctl %s` is a command of esctl (esctl --help)" % (where, sub), text)
                continue
            if sub in commands:
                allowed = esctl_options(sub) | GLOBAL
                for a in rest:
                    if a.startswith("--") and a.split("=")[0] not in allowed:
                        bad("%s: `%s` is an option of `esctl %s` (esctl %s --help)" % (where, a, sub, sub), text)
        elif prog == "esd" and sub == "run":
            for a in rest:
                if a.startswith("-") and a.split("=")[0] not in esd_run_options:
                    bad("%s: `%s` is an option of esd run (esd run --help)" % (where, a), text)
        elif prog == "esd":
            for a in c[1:]:
                if a.startswith("-") and a.split("=")[0] not in esd_options:
                    bad("%s: `%s` is an option of esd (esd --help)" % (where, a), text)
        elif prog == "make":
            if sub and sub not in make_targets:
                bad("%s: `make %s` is a target of the Makefile" % (where, sub), text)
        else:
            p = os.path.join(top, prog)
            if not (os.path.isfile(p) and os.access(p, os.X_OK)):
                bad("%s: %s exists and is executable" % (where, prog), text)
        # (b) exercised
        if name not in seen:
            seen[name] = exercised(lines, prog, sub)
        if seen[name] is None:
            bad("%s: `%s` is exercised by a test (tests/, .ci/run, scripts/demo)" % (where, name), text)

for name in sorted(seen):
    if seen[name]:
        ok("`%s` is exercised by %s" % (name, seen[name]))
if not failures:
    ok("%d commands on esctl, esd, make and scripts/ in %s: every one real, every program and"
       " subcommand exercised" % (checked, rel))
sys.exit(1 if failures else 0)
EOF
rc=${PIPESTATUS[0]}
PASSED=$((PASSED + $(grep -c '^ok - ' "$W/result" || true)))
[ "$rc" -eq 0 ] || { echo "# $SCRIPT: FAILED after $PASSED checks passed"; exit 1; }
summary
