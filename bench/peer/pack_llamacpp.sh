#!/bin/bash
# On the development machine: a pruned xz tarball of a llama.cpp git checkout (or bare repository, e.g.
# the fetch tool's /work/.mirror/ORG+llama.cpp/repo) small enough to carry to the GPU machine with the
# tree (about 4 MB): the sources that CPU and CUDA builds of llama-bench need and gguf-py (for
# bench/peer/make_gguf.py), without docs, model vocabularies, the web UI, examples, tests and the other
# GPU backends. Build it with LLAMA_CMAKE_FLAGS="-DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=OFF"
# (bench/peer/build_llamacpp.sh), as the server's UI and the examples are left out.
# usage: bash bench/peer/pack_llamacpp.sh GIT_DIR OUT.tar.xz [REV]
set -eo pipefail
G=$1 OUT=$2 REV=${3:-HEAD}
[ -n "$G" ] && [ -n "$OUT" ] || { echo "usage: $0 GIT_DIR OUT.tar.xz [REV]" >&2; exit 2; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
EX=()
for p in models docs tools/ui benches media examples pocs tests .github; do EX+=(":!$p"); done
for b in cann hexagon hip metal musa opencl openvino sycl vulkan webgpu zdnn zendnn et virtgpu; do EX+=(":!ggml/src/ggml-$b"); done
git -C "$G" archive "$REV" -- . "${EX[@]}" | tar -x -C "$T"
tar cJf "$OUT" -C "$T" .
echo "$OUT: $(du -h "$OUT" | cut -f1), llama.cpp $(git -C "$G" rev-parse --short "$REV")"
