#!/usr/bin/env bash
# The style stays uniform: every C/CUDA source as clang-format writes it
# (.clang-format), and the editor settings of .editorconfig.
cd "${TRIDENT_SOURCE_ROOT:-.}" || exit 1
fails=0
scripts/check_format.sh || fails=$((fails + 1))
# .editorconfig: no tabs in C sources, no trailing whitespace, a final newline.
while IFS= read -r f; do
    if grep -qP '\t' "$f"; then echo "FAIL: $f has a tab"; fails=$((fails + 1)); fi
    if grep -qP '[ \t]+$' "$f"; then echo "FAIL: $f has trailing whitespace"; fails=$((fails + 1)); fi
    if [ -s "$f" ] && [ "$(tail -c1 "$f" | od -An -c | tr -d ' ')" != '\n' ]; then
        echo "FAIL: $f does not end with a newline"; fails=$((fails + 1))
    fi
done < <(git ls-files '*.c' '*.h' '*.cu' '*.cuh' '*.py' '*.sh' 'meson.build' '*/meson.build')
echo "format: $fails failed"
[ "$fails" -eq 0 ]
