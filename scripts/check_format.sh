#!/usr/bin/env bash
# The uniform style: every C, C++ (.cc) and CUDA source of the repository exactly as
# clang-format writes it with .clang-format (docs/design.md, "How the code
# reads").  Generated tables are left as their generator writes them.
#   scripts/check_format.sh         list the files that differ (exit 1 if any)
#   scripts/check_format.sh --fix   rewrite them
set -uo pipefail
cd "$(dirname "$0")/.."
command -v clang-format >/dev/null ||
    { echo "check_format: clang-format is missing (scripts/install_deps.sh installs it)"; exit 1; }
mapfile -t files < <(git ls-files '*.c' '*.cc' '*.h' '*.cu' '*.cuh' |
    grep -v -e '^src/data/unicode_categories\.c$' -e '^src/data/unicode_classes\.c$')
if [ "${1:-}" = --fix ]; then
    clang-format -i "${files[@]}"
    echo "check_format: formatted ${#files[@]} files"
    exit 0
fi
bad=0
for f in "${files[@]}"; do
    if ! clang-format "$f" | cmp -s "$f" -; then
        bad=$((bad + 1))
        echo "check_format: $f is not as clang-format writes it:"
        clang-format "$f" | diff "$f" - | head -10
    fi
done
echo "check_format: ${#files[@]} files, $bad not formatted$([ $bad -gt 0 ] && echo '; scripts/check_format.sh --fix rewrites them')"
[ "$bad" -eq 0 ]
