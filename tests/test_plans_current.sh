#!/usr/bin/env bash
# The committed plans (docs/plans/*.txt) are what `trident plan` prints now.
# The regeneration block of docs/plan.md ("Committed plans"), as written, is
# run in an empty copy of docs/plans; every committed file must come out of
# it, byte for byte, and it must write no file that is not committed.  A
# change to the model, the engine or the planner that moves a figure fails
# here until the plans are regenerated (the block's command) and committed.
set -uo pipefail
: "${TRIDENT:?TRIDENT must point at the built binary}"
cd "${TRIDENT_SOURCE_ROOT:-.}"
root=$(pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The first sh block after the heading, as test_docs.sh would run it.
awk '/^## Committed plans/ {on = 1; next}
     on && /^## / {exit}
     on && /^```sh$/ {inblock = 1; next}
     inblock && /^```$/ {exit}
     inblock {print}' docs/plan.md > "$tmp/regen.sh"
grep -q 'trident plan' "$tmp/regen.sh" ||
    { echo "FAIL: no regeneration block under 'Committed plans' in docs/plan.md"; exit 1; }
mkdir -p "$tmp/box/docs/plans"
cp -r configs "$tmp/box/configs"
ln -s "$(cd "$(dirname "$TRIDENT")" && pwd)" "$tmp/box/build"
(cd "$tmp/box" && bash -e "$tmp/regen.sh") > "$tmp/regen.log" 2>&1 ||
    { echo "FAIL: the block of docs/plan.md failed:"; sed 's/^/    /' "$tmp/regen.log"; exit 1; }
fails=0 n=0
for f in docs/plans/*.txt; do
    n=$((n + 1))
    new="$tmp/box/$f"
    if [ ! -f "$new" ]; then
        echo "FAIL: $f is committed but the block of docs/plan.md does not write it"
        fails=$((fails + 1))
    elif ! cmp -s "$f" "$new"; then
        echo "FAIL: $f is not what trident plan prints now (regenerate: the block in docs/plan.md):"
        diff "$f" "$new" | head -20 | sed 's/^/    /'
        fails=$((fails + 1))
    else
        echo "ok   $f"
    fi
done
for new in "$tmp"/box/docs/plans/*.txt; do
    [ -f "$root/docs/plans/$(basename "$new")" ] && continue
    echo "FAIL: the block writes docs/plans/$(basename "$new"), which is not committed"
    fails=$((fails + 1))
done
[ "$n" -gt 0 ] || { echo "FAIL: no committed plans"; exit 1; }
echo "$((n - fails < 0 ? 0 : n - fails)) of $n plans current"
[ "$fails" -eq 0 ]
