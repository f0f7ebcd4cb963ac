#!/bin/bash
# On the development machine (Debian 12, which reaches Debian's registry): download into
# build-cudadeps/debs the Debian packages that building and running smelt needs on the GPU machine,
# which has none of them and no network;
# there, `source bench/cuda/device_env.sh` unpacks them into /tmp/deps. The list is the -dev packages
# of scripts/setup.sh with their runtime libraries, libcurl's own runtime dependencies (without them
# linking fails on libssh2 and libldap, and running on libunistring), ninja and pkg-config: 58 files,
# about 12 MB. The call carries at most 64 MiB (counted in disk blocks) and the tracked files take 53, so
# the script also unpacks them here without documentation, translations and static libraries into
# build-cudadeps/deps.tar.xz (about 5 MB): carry that file alone.
# usage (repo root): bash bench/cuda/fetch_debs.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p build-cudadeps/debs
cd build-cudadeps/debs
apt-get download \
  libcjson-dev libcjson1 libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 \
  libutf8proc-dev libutf8proc2 libmicrohttpd-dev libmicrohttpd12 libgnutls30 libnettle8 libhogweed6 libtasn1-6 \
  libp11-kit0 libcurl4-openssl-dev libcurl4 libssh2-1 libldap-2.5-0 libsasl2-2 libsasl2-modules-db \
  libunistring2 libidn2-0 libnghttp2-14 librtmp1 libpsl5 libbrotli1 libgssapi-krb5-2 libkrb5-3 libk5crypto3 \
  libkrb5support0 libkeyutils1 libcom-err2 libzstd1 libedit-dev libedit2 libbsd-dev libbsd0 libmd-dev libmd0 \
  libncurses-dev libpng-dev libpng16-16 libjpeg62-turbo-dev libjpeg62-turbo libwebp-dev libwebp7 libwebpdemux2 \
  libwebpmux3 libexif-dev libexif12 zlib1g-dev ninja-build pkg-config pkgconf pkgconf-bin libpkgconf3
echo "$(ls ./*.deb | wc -l) packages, $(du -sh . | cut -f1) in build-cudadeps/debs"
rm -rf ../tree && mkdir ../tree
for f in ./*.deb; do dpkg -x "$f" ../tree; done
rm -rf ../tree/usr/share/doc ../tree/usr/share/man ../tree/usr/share/locale ../tree/usr/share/info
find ../tree -name '*.a' -delete
tar cJf ../deps.tar.xz -C ../tree .
rm -rf ../tree
echo "build-cudadeps/deps.tar.xz: $(du -h ../deps.tar.xz | cut -f1)"
