#!/bin/sh
# `cmake --install` into a fresh prefix puts smelt, smelt-server, smelt.h, libsmelt.a, smelt.pc and the
# built-in models there; a C program built with `pkg-config --cflags --libs smelt` against the prefix
# generates text; the installed smelt lists its built-in models from the prefix.
# usage: test_install.sh BUILD_DIR C_COMPILER WORKDIR [EXTRA_CFLAGS]
#   EXTRA_CFLAGS: what a program linking this build's library needs besides pkg-config's flags
#   (-fsanitize=... for a sanitizer build)
set -eu
BUILD=$1 CC=$2 WORK=$3 XFLAGS=${4:-}
command -v pkg-config >/dev/null || { echo "pkg-config missing"; exit 77; }
rm -rf "$WORK"
mkdir -p "$WORK"
P="$WORK/prefix"
cmake --install "$BUILD" --prefix "$P" >"$WORK/install.log"
fail() { echo "FAIL: $*"; exit 1; }
for f in bin/smelt include/smelt.h share/smelt/models/smelt-tiny/config.json share/smelt/models/smelt-tiny-draft/config.json; do
  [ -e "$P/$f" ] || fail "$f not installed"
done
[ -L "$P/bin/smelt-server" ] && [ "$(readlink "$P/bin/smelt-server")" = smelt ] || fail "bin/smelt-server is not a link to smelt"
"$P/bin/smelt-server" --help | grep -q "usage: smelt serve" || fail "smelt-server --help"
LIB=$(find "$P" -name libsmelt.a | head -1)
PC=$(find "$P" -name smelt.pc | head -1)
[ -n "$LIB" ] || fail "libsmelt.a not installed"
[ -n "$PC" ] || fail "smelt.pc not installed"
export PKG_CONFIG_PATH="$(dirname "$PC")"
[ "$(pkg-config --modversion smelt)" = "$(sed -n 's/#define SMELT_VERSION "\(.*\)"/\1/p' "$P/include/smelt.h")" ] || fail "pkg-config version"
cat >"$WORK/prog.c" <<'C'
#include <smelt.h>
#include <stdio.h>
#include <string.h>
static bool piece(const char *p, size_t n, void *u) { (*(int *)u) += (int)n; fwrite(p, 1, n, stdout); return true; }
int main(int argc, char **argv) {
  smelt_model_params mp;
  smelt_model_params_default(&mp);
  mp.device = SMELT_DEVICE_CPU;
  smelt_model *m;
  if (smelt_model_load(argv[1], &mp, &m)) { fprintf(stderr, "%s\n", smelt_last_error()); return 1; }
  smelt_sampling s;
  smelt_sampling_default(&s);
  s.temperature = 0;
  smelt_stats st;
  int bytes = 0;
  if (smelt_generate(m, "In the beginning", 8, &s, piece, &bytes, &st)) { fprintf(stderr, "%s\n", smelt_last_error()); return 1; }
  printf("\n%d tokens\n", st.n_generated);
  smelt_model_free(m);
  return st.n_generated == 8 && bytes > 0 ? 0 : 1;
}
C
# shellcheck disable=SC2046
$CC $XFLAGS -o "$WORK/prog" "$WORK/prog.c" $(pkg-config --cflags --libs smelt) || fail "building against the installed library"
"$WORK/prog" "$P/share/smelt/models/smelt-tiny" >"$WORK/prog.out" || fail "the program: $(cat "$WORK/prog.out")"
grep -q "^8 tokens" "$WORK/prog.out" || fail "program output: $(cat "$WORK/prog.out")"
cd "$WORK"
HF_ENDPOINT=http://127.0.0.1:9 SMELT_CACHE_DIR="$WORK/cache" HF_HUB_CACHE="$WORK/hf" "$P/bin/smelt" list --json >list.json
RP=$(cd "$P" && pwd -P)
grep -q "\"path\":[[:space:]]*\"$RP/share/smelt/models/smelt-tiny\"" list.json || fail "built-ins not from the prefix: $(cat list.json)"
HF_ENDPOINT=http://127.0.0.1:9 SMELT_CACHE_DIR="$WORK/cache" "$P/bin/smelt" run smelt-tiny -p hi -n 3 </dev/null >run.out 2>&1 ||
  fail "installed smelt run: $(cat run.out)"
echo "install test passed"
