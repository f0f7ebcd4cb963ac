#!/bin/sh
# usage: run_norm_ref.sh <gen_norm_reference.mjs> <node_modules> <checker> <out.json>
# Runs the HF normalizer reference (node) then the C checker; exits 77 (ctest skip) without node or the packages.
SCRIPT=$1; MODS=$2; CHECKER=$3; OUT=$4
if ! command -v node >/dev/null 2>&1; then echo "node not found: skipping"; exit 77; fi
if [ ! -d "$MODS/@anush008/tokenizers" ]; then echo "reference packages missing in $MODS: skipping"; exit 77; fi
SMELT_NODE_MODULES="$MODS" node "$SCRIPT" "$OUT"
rc=$?
[ $rc -eq 0 ] || exit $rc
exec "$CHECKER" "$OUT"
