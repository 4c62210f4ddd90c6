#!/usr/bin/env bash
# Copies the headers and static libraries of sluice's library dependencies (jansson, PCRE2,
# utf8proc, OpenSSL's libcrypto) into DIR (default .deps), for building the CUDA tests and
# benchmark on a GPU machine that lacks the -dev packages and a package mirror:
#   tools/cuda_deps.sh              # here, with the Debian -dev packages installed
#   make test-cuda DEPS=.deps       # there (the device tool carries .deps along)
set -euo pipefail
D=${1:-.deps}
L=/usr/lib/$(gcc -print-multiarch)
mkdir -p "$D/include/openssl" "$D/lib"
cp /usr/include/{jansson.h,jansson_config.h,pcre2.h,utf8proc.h} "$D/include/"
cp -r /usr/include/openssl/. "$D/include/openssl/"
cp /usr/include/"$(gcc -print-multiarch)"/openssl/*.h "$D/include/openssl/"
cp "$L"/{libjansson,libpcre2-8,libutf8proc,libcrypto}.a "$D/lib/"
du -sh "$D"
