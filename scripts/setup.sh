#!/usr/bin/env bash
# Install build dependencies (Debian), the node test references, and build smelt into ./build.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
PKGS="build-essential cmake pkg-config libcjson-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev libcurl4-openssl-dev libedit-dev libpng-dev libjpeg62-turbo-dev libwebp-dev libexif-dev zlib1g-dev nodejs npm python3 python3-numpy python3-jinja2"
missing=""
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
# node/npm may come from elsewhere (e.g. nvm); only install them if absent
if command -v node >/dev/null && command -v npm >/dev/null; then missing=$(echo "$missing" | sed 's/\bnodejs\b//; s/\bnpm\b//'); fi
if [ -x /usr/bin/python3 ] && /usr/bin/python3 -c "import numpy" 2>/dev/null; then missing=$(echo " $missing " | sed 's/ python3-numpy / /; s/ python3 / /'); fi
if [ -n "$(echo $missing)" ]; then
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
fi
# the node test references: `npm ci` only when node_modules was not installed from this lock file
# (a stamp holds the lock file's hash), so that a re-run needs no network and takes no time
if command -v npm >/dev/null; then
  lock_hash=$(sha256sum tests/node/package-lock.json | cut -d' ' -f1)
  stamp=tests/node/node_modules/.smelt-lock-sha256
  if [ "$(cat "$stamp" 2>/dev/null)" != "$lock_hash" ]; then
    (cd tests/node && npm ci --no-audit --no-fund --loglevel=error)
    echo "$lock_hash" >"$stamp"
  fi
fi
CUDA_FLAG=""
if [ -z "${SMELT_CUDA:-}" ] && ! command -v nvcc >/dev/null && [ ! -x /usr/local/cuda/bin/nvcc ]; then CUDA_FLAG="-DSMELT_CUDA=OFF"; fi
[ -x /usr/local/cuda/bin/nvcc ] && export PATH="/usr/local/cuda/bin:$PATH"
# SMELT_CMAKE_FLAGS: extra configure flags (scripts/test.sh passes -DSMELT_WERROR=ON)
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${SMELT_CUDA:+-DSMELT_CUDA=$SMELT_CUDA} $CUDA_FLAG ${SMELT_CMAKE_FLAGS:-} >/dev/null
cmake --build build -j"$(nproc)"
