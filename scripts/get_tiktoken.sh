#!/usr/bin/env bash
# Install the reference tiktoken encoder (npm js-tiktoken) and write the
# ranks of its encodings as .tiktoken files (base64 token, space, rank).
#
#   scripts/get_tiktoken.sh [ENCODING ...]     (default: cl100k_base o200k_base)
#
# Idempotent: every step whose output exists is skipped.  Outputs (under the
# repository root, ignored by git):
#   .cache/npm-tiktoken/node_modules/js-tiktoken/   js-tiktoken@1.0.21 (the reference encoder)
#   .cache/tiktoken/ENCODING.tiktoken                 its ranks, in tiktoken's file format
# `trident prepare-data --tokenizer tiktoken --encoding ENCODING` reads
# .cache/tiktoken/ENCODING.tiktoken unless --ranks says otherwise.  The
# files are those OpenAI publishes (e.g. cl100k_base.tiktoken), rebuilt from
# the package's compressed copy so no other download is needed.
set -euo pipefail

cd "$(dirname "$0")/.."
prefix=.cache/npm-tiktoken
pkg=$prefix/node_modules/js-tiktoken
out=.cache/tiktoken
version=1.0.21
encodings=("$@")
[[ ${#encodings[@]} -gt 0 ]] || encodings=(cl100k_base o200k_base)

say() { echo "get_tiktoken: $*"; }
die() { echo "get_tiktoken: error: $*" >&2; exit 1; }

command -v node >/dev/null && command -v npm >/dev/null ||
    die "node and npm are needed (scripts/install_deps.sh installs them)"

if [[ -f $pkg/package.json ]] && grep -q "\"version\": \"$version\"" "$pkg/package.json"; then
    say "js-tiktoken $version present in $prefix"
else
    # Into a fresh directory renamed at the end, so that an interrupted or
    # concurrent install never leaves a half-installed package in place.
    mkdir -p "$(dirname "$prefix")"
    tmp=$(mktemp -d "$prefix.tmp.XXXXXX")
    chmod 755 "$tmp"
    say "installing js-tiktoken@$version into $prefix"
    npm install --prefer-offline --no-audit --no-fund --prefix "$tmp" "js-tiktoken@$version" >/dev/null ||
        { rm -rf "$tmp"; die "npm install failed (network? registry?)"; }
    rm -rf "$prefix"
    mv "$tmp" "$prefix" 2>/dev/null || rm -rf "$tmp"   # another install won the race
fi

mkdir -p "$out"
for enc in "${encodings[@]}"; do
    [[ $enc =~ ^[a-z0-9_]+$ && -f $pkg/dist/ranks/$enc.cjs ]] ||
        die "unknown encoding '$enc' (js-tiktoken has: $(cd "$pkg/dist/ranks" && ls *.cjs | sed 's/\.cjs$//' | tr '\n' ' '))"
    if [[ -s $out/$enc.tiktoken ]]; then
        say "ranks present: $out/$enc.tiktoken"
        continue
    fi
    # js-tiktoken stores ranks compactly: lines "PREFIX OFFSET TOKEN TOKEN ..."
    # in which the i-th token (base64) has rank OFFSET + i.
    node -e '
const ranks = require(process.argv[1]);
const lines = [];
for (const line of ranks.bpe_ranks.split("\n").filter(Boolean)) {
  const [, offset, ...tokens] = line.split(" ");
  tokens.forEach((t, i) => lines.push([Number(offset) + i, t]));
}
lines.sort((a, b) => a[0] - b[0]);
process.stdout.write(lines.map(([r, t]) => `${t} ${r}\n`).join(""));
' "$(pwd)/$pkg/dist/ranks/$enc.cjs" > "$out/$enc.tiktoken.tmp.$$"
    mv "$out/$enc.tiktoken.tmp.$$" "$out/$enc.tiktoken"
    say "wrote $out/$enc.tiktoken ($(wc -l < "$out/$enc.tiktoken") ranks)"
done
