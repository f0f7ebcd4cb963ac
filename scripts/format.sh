#!/usr/bin/env bash
# Format the C and CUDA sources with .clang-format (clang-format 14, Debian's clang-format-14).
#   scripts/format.sh            reformat every tracked .c/.h/.cu/.cuh file in place
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
if [ $# -gt 0 ]; then files=("$@"); else mapfile -t files < <(git ls-files '*.c' '*.h' '*.cu' '*.cuh'); fi
if [ $check = 0 ]; then
  [ ${#files[@]} = 0 ] || "$CF" -i --style=file "${files[@]}"
  exit 0
fi
bad=0
for f in "${files[@]}"; do
  if ! "$CF" --style=file "$f" | cmp -s - "$f"; then echo "$f"; bad=1; fi
done
exit $bad
