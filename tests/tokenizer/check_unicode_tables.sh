#!/bin/sh
# usage: check_unicode_tables.sh <source dir> <scratch file>
# Regenerates the Unicode tables and compares them with the committed src/tokenizer/unicode_tables.c
# (exit 77, a ctest skip, without node or the @unicode packages).
SRC=$1; OUT=$2
if ! command -v node >/dev/null 2>&1; then echo "node not found: skipping"; exit 77; fi
node "$SRC/tools/gen_unicode_tables.mjs" "$OUT" || exit $?
if cmp -s "$OUT" "$SRC/src/tokenizer/unicode_tables.c"; then echo "unicode_tables.c is current"; exit 0; fi
echo "src/tokenizer/unicode_tables.c differs from tools/gen_unicode_tables.mjs output:"; diff "$OUT" "$SRC/src/tokenizer/unicode_tables.c" | head -20
exit 1
