# Source this on the GPU machine (run from the repo root): unpacks the Debian -dev/runtime
# packages carried as build-cudadeps/deps.tar.xz or build-cudadeps/debs (bench/cuda/fetch_debs.sh
# makes both) into /tmp/deps and points pkg-config/ld at them.
D=/tmp/deps
mkdir -p $D/.stamps
new=0
if [ -f build-cudadeps/deps.tar.xz ] && [ ! -f $D/.stamps/deps.tar.xz ]; then
  tar xJf build-cudadeps/deps.tar.xz -C $D && touch $D/.stamps/deps.tar.xz && new=1
fi
for f in build-cudadeps/debs/*.deb; do
  [ -f "$f" ] || continue
  st=$D/.stamps/$(basename "$f")
  [ -f "$st" ] && continue
  dpkg -x "$f" $D && touch "$st" && new=1
done
if [ $new = 1 ]; then
  for pc in $D/usr/lib/x86_64-linux-gnu/pkgconfig/*.pc $D/usr/share/pkgconfig/*.pc; do
    [ -f "$pc" ] && sed -i "s#^prefix=/usr\$#prefix=$D/usr#; s#=/usr/include#=$D/usr/include#; s#=/usr/lib#=$D/usr/lib#; /^Requires.private/d" "$pc"
  done
fi
export PKG_CONFIG_LIBDIR=$D/usr/lib/x86_64-linux-gnu/pkgconfig:$D/usr/share/pkgconfig
export LD_LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu:$D/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
command -v pkg-config >/dev/null || export PATH=$PATH:$D/usr/bin
export PKG_CONFIG=$(command -v pkg-config)
