#!/usr/bin/env bash
# The docs run (docs/design.md, invariant 6): every fenced block of README.md
# and docs/*.md says what it is, and every command block runs as written.
#
#   ```sh             run: each command, from the top of a copy of the repository
#   ```python         run with python3, in the same place
#   ```sh gpu         not run here: needs an NVIDIA GPU (the doc says so)
#   ```sh cluster     not run here: needs a Slurm cluster of real nodes, or waits forever
#   ```sh ci          not run here: scripts/test.sh itself runs these steps (the CUDA builds)
#   ```sh long        not run here: over ten minutes on 2 cores (a benchmark); run by hand
#   ```text, yaml, c, js, json   not commands: output, synopses, config, code
#   ```text expect    what the sh block just before it prints: each line must
#                     be a line of that block's output (stdout and stderr),
#                     in order (other lines may come between), where `...`
#                     stands for any text (timings, paths); so quoted help
#                     texts, error messages and outputs are the program's own
#
# A block without a language fails the test, so a new command cannot slip in
# unmarked.  Each doc runs top to bottom in its own fresh copy of the
# repository (build/, data/ and .cache/ are links to the real ones), so its
# blocks see what the doc's earlier blocks made, as a reader's shell would.
# Commands that train (trident train / run, quickstart.sh, an sbatch of a
# training template) get `--set training.steps=2 --set data.val_sequences=8`
# appended (the end-of-run validation over 64 sequences was half of a
# shortened run's time); nothing else changes.  README's scripts/test.sh is this test suite itself and is not
# run from inside it.
#
#   TRIDENT_DOCS="README.md docs/slurm.md" tests/test_docs.sh   # only these
set -uo pipefail
: "${TRIDENT:?TRIDENT must point at the built binary}"
cd "${TRIDENT_SOURCE_ROOT:-.}"
root=$(pwd)
build=$(cd "$(dirname "$TRIDENT")" && pwd)
[ -f data/brown/gpt2.idx ] || { echo "FAIL: data/brown/gpt2 missing: run scripts/get_corpus.sh"; exit 1; }
# Debian's python3 for the helpers below and the ```python blocks: it has
# h5py (install_deps.sh), and it starts in 0.1 s where a pyenv shim earlier
# in PATH takes a second or more, twice for every block.
py=python3; [ -x /usr/bin/python3 ] && py=/usr/bin/python3
tmp=$(mktemp -d)
# docs/slurm.md starts the local cluster and stops it in its last line; a
# block that fails before that line must not leave the daemons running.
trap 'slurm/cluster/stop.sh >/dev/null 2>&1; rm -rf "$tmp"' EXIT
docs=${TRIDENT_DOCS:-README.md $(ls docs/*.md)}

# Split every doc into numbered block files; print "doc kind file line" rows.
"$py" - "$tmp/blocks" $docs > "$tmp/list" <<'PY' || exit 1
import os, re, sys
out, docs = sys.argv[1], sys.argv[2:]
os.makedirs(out)
known = {"sh", "python", "text", "yaml", "c", "js", "json"}
marks = {"gpu", "cluster", "ci", "long"}
bad = 0
for doc in docs:
    lines = open(doc).read().split("\n")
    i = n = 0
    while i < len(lines):
        m = re.match(r"^(\s*)```(.*)$", lines[i])
        if not m:
            i += 1
            continue
        info = m.group(2).split()
        start = i + 1
        j = start
        while j < len(lines) and not re.match(r"^\s*```\s*$", lines[j]):
            j += 1
        body = [l[len(m.group(1)):] for l in lines[start:j]]
        i = j + 1
        lang = info[0] if info else ""
        mark = info[1] if len(info) > 1 else ""
        where = f"{doc}:{start}"
        expect = lang == "text" and mark == "expect"
        if lang not in known or (mark and not expect and (lang != "sh" or mark not in marks)):
            print(f"FAIL {where}: a code block must say what it is: ```sh, ```sh gpu, "
                  f"```sh cluster, ```python, ```text, ```yaml, ```c or ```js (got '{m.group(2)}')",
                  file=sys.stderr)
            bad += 1
            continue
        kind = lang if lang in ("sh", "python") and not mark else "skip-" + (mark or lang)
        if expect:
            kind = "expect"
        n += 1
        path = f"{out}/{doc.replace('/', '_')}.{n:02d}.{lang}"
        open(path, "w").write("\n".join(body) + "\n")
        print(doc, kind, path, start)
sys.exit(1 if bad else 0)
PY
[ $? -eq 0 ] || { echo "FAIL: blocks without a language (above)"; exit 1; }

# A logical line (continuations joined) that trains gets the small step
# count before any trailing comment, redirection, pipe, && or ||.
shorten() {
    "$py" - "$1" <<'PY'
import re, sys
text = open(sys.argv[1]).read().replace("\\\n", " ")
out = []
for line in text.split("\n"):
    code = line.strip()
    if code == "scripts/test.sh" or code.startswith("scripts/test.sh "):
        out.append("# (the test suite itself: not run from inside it) " + line)
        continue
    if re.search(r"trident (train|run)\b|quickstart\.sh|\.sbatch\b", code) and "--help" not in code:
        m = re.search(r"\s+(#|>|\|\||\||&&)\s", line)
        at = m.start() if m else len(line)
        line = line[:at] + " --set training.steps=2 --set data.val_sequences=8" + line[at:]
    out.append(line)
open(sys.argv[1], "w").write("\n".join(out))
PY
}

# expect_lines EXPECTED OUTPUT: every non-empty line of EXPECTED is a line of
# OUTPUT, in order, other lines between them allowed ("..." within a line
# matches any text, a line of "..." alone stands for lines left out;
# spaces at the ends ignored).
expect_lines() {
    "$py" - "$1" "$2" <<'PY'
import re, sys
want = [l.strip() for l in open(sys.argv[1]) if l.strip() and l.strip() != "..."]
got = [l.strip() for l in open(sys.argv[2], errors="replace")]
at = 0
for w in want:
    pat = re.compile("^" + ".*".join(re.escape(p) for p in w.split("...")) + "$")
    while at < len(got) and not pat.match(got[at]):
        at += 1
    if at == len(got):
        print(f"not printed (in this order): {w}")
        sys.exit(1)
    at += 1
PY
}

fails=0 ran=0 skipped=0 current="" last_log=""
declare -A skips=()
while read -r doc kind file line; do
    if [ "$doc" != "$current" ]; then
        current=$doc last_log=""
        box="$tmp/box-${doc//\//_}"
        mkdir -p "$box"
        git ls-files -z --cached --others --exclude-standard |
            tar --null --ignore-failed-read -cf - -T - 2>/dev/null | tar -xf - -C "$box"
        ln -s "$build" "$box/build"
        mkdir "$box/data" && ln -s "$root/data/brown" "$box/data/brown"
        ln -s "$root/.cache" "$box/.cache"
    fi
    case $kind in
    skip-*) skipped=$((skipped + 1)); skips[${kind#skip-}]=$(( ${skips[${kind#skip-}]:-0} + 1 )); continue ;;
    expect)
        ran=$((ran + 1))
        if [ -n "$last_log" ] && expect_lines "$file" "$last_log" > "$file.why" 2>&1; then
            echo "ok   $doc:$line (expected output of the block above)"
        else
            fails=$((fails + 1))
            echo "FAIL $doc:$line: the quoted output is not what the sh block above prints"
            [ -n "$last_log" ] || echo "    (no sh block of this doc ran before it)"
            sed 's/^/    /' "$file.why"
        fi
        continue ;;
    esac
    last_log=$file.log
    ran=$((ran + 1))
    if [ "$kind" = sh ]; then
        shorten "$file"
        cmd=(bash -eo pipefail "$file")
    else
        cmd=("$py" "$file")
    fi
    start=$SECONDS
    if (cd "$box" && TRIDENT_PREEMPT_GRACE=60 timeout 600 "${cmd[@]}") > "$file.log" 2>&1 </dev/null; then
        echo "ok   $doc:$line ($kind, $((SECONDS - start)) s)"
    else
        rc=$?
        fails=$((fails + 1))
        echo "FAIL $doc:$line ($kind) exited $rc; the block as run:"
        sed 's/^/    | /' "$file"
        echo "  output (last 25 lines):"
        tail -25 "$file.log" | sed 's/^/    > /'
    fi
done < "$tmp/list"

not_run=""
for k in "${!skips[@]}"; do not_run+=" $k ${skips[$k]}"; done
echo "docs: $ran blocks run, $fails failed; $skipped not commands or not run here:$not_run"
[ "$fails" -eq 0 ] && [ "$ran" -gt 0 ]
