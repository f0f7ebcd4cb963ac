#!/bin/sh
# usage: check_unicode_tables.sh <source dir> <scratch file> [generator table]
# Regenerates a Unicode table with its generator in tools/ (default gen_unicode_tables.mjs ->
# src/tokenizer/unicode_tables.c) and compares it with the committed file (exit 77, a ctest skip,
# without node or the data packages).
SRC=$1; OUT=$2; GEN=${3:-gen_unicode_tables.mjs}; TABLE=${4:-unicode_tables.c}
if ! command -v node >/dev/null 2>&1; then echo "node not found: skipping"; exit 77; fi
node "$SRC/tools/$GEN" "$OUT" || exit $?
if cmp -s "$OUT" "$SRC/src/tokenizer/$TABLE"; then echo "$TABLE is current"; exit 0; fi
echo "src/tokenizer/$TABLE differs from tools/$GEN output:"; diff "$OUT" "$SRC/src/tokenizer/$TABLE" | head -20
exit 1
