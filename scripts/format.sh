#!/usr/bin/env bash
# Format the C sources with .clang-format (clang-format 14, Debian's clang-format-14).
#   scripts/format.sh            reformat every tracked .c/.h file in place
#   scripts/format.sh --check    list the files that differ from their formatted form; exit 1 if any
#   scripts/format.sh [--check] FILE...   only these files
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
if [ "${1:-}" = "--check" ]; then check=1; shift; fi
CF=""
for c in clang-format-14 clang-format; do
  if command -v "$c" >/dev/null; then CF=$c; break; fi
done
[ -n "$CF" ] || { echo "format.sh: clang-format not found (apt-get install clang-format-14)" >&2; exit 2; }
# CUDA files (.cu, .cuh) are left as written: clang-format 14 breaks some kernel launches
# (`k<<<a->n, a->hd<128 ? 128 : a->hd, 0, s>>>(...)` became `k < <<...`, which does not compile)
# Generated files ("do not edit" in their opening comment) stay as their generator writes them: tests
# check that they are current by regenerating them.
if [ $# -gt 0 ]; then files=("$@"); else
  mapfile -t files < <(git ls-files '*.c' '*.h' | while read -r f; do head -3 "$f" | grep -qi "do not edit" || echo "$f"; done)
fi
if [ $check = 0 ]; then
  [ ${#files[@]} = 0 ] || "$CF" -i --style=file "${files[@]}"
  exit 0
fi
bad=0
for f in "${files[@]}"; do
  if ! "$CF" --style=file "$f" | cmp -s - "$f"; then echo "$f"; bad=1; fi
done
exit $bad
