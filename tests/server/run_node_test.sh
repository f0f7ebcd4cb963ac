#!/bin/sh
# Runs a node test script; exit 77 (skipped) when node is not installed.
if [ -z "$NODE_EXE" ] || [ "$NODE_EXE" = "NODE_EXE-NOTFOUND" ] || ! command -v "$NODE_EXE" >/dev/null 2>&1; then
  echo "node not found: skipping"
  exit 77
fi
exec "$NODE_EXE" "$@"
