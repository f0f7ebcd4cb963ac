#!/usr/bin/env bash
# Fresh machine: install dependencies, build, run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir build --output-on-failure -j2 --timeout 900
