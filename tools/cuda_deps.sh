#!/usr/bin/env bash
# Copies what sluice builds against, the headers and libraries of jansson, OpenSSL's libcrypto,
# PCRE2, utf8proc, libedit, liburing and libmicrohttpd, into DIR (default .deps), for a machine that lacks
# the -dev packages and a package mirror (the GPU machine). The whole CLI builds there, `chat`
# and `serve` included:
#   tools/cuda_deps.sh      # here: installs the -dev packages if needed (tools/deps.sh), copies
#   make CUDA=1             # there, .deps carried along: the Makefile picks it (or DEPS=DIR)
# Static libraries where the whole chain exists as .a: libedit's needs ncurses' libtinfo, libbsd
# and libmd, all there. Debian builds libmicrohttpd with GnuTLS, whose chain has no static
# libp11-kit or libunistring: libmicrohttpd goes as a shared library, with every library it
# loads but glibc's, and the binary finds them in DIR/lib through its RPATH (Makefile).
set -euo pipefail
D=${1:-.deps}
"$(dirname "$0")/deps.sh" system
M=$(gcc -print-multiarch)
L=/usr/lib/$M
mkdir -p "$D/include/openssl" "$D/include/editline" "$D/lib"
cp /usr/include/{jansson.h,jansson_config.h,pcre2.h,utf8proc.h,microhttpd.h} "$D/include/"
cp /usr/include/editline/*.h "$D/include/editline/"
cp -r /usr/include/openssl/. "$D/include/openssl/"
cp /usr/include/"$M"/openssl/*.h "$D/include/openssl/"
cp "$L"/{libjansson,libpcre2-8,libutf8proc,libcrypto,libedit,libtinfo,libbsd,libmd}.a "$D/lib/"
# liburing (io_uring expert reads): its header, its folder of headers, the static library
mkdir -p "$D/include/liburing"
cp /usr/include/liburing.h "$D/include/"
cp -r /usr/include/liburing/. "$D/include/liburing/"
cp "$L"/liburing.a "$D/lib/"
# libmicrohttpd.so for the linker, then each shared library under its soname, as loaded at run
# time (files, not links, so that carrying the folder keeps them).
mhd=$(readlink -f "$L/libmicrohttpd.so")
cp "$mhd" "$D/lib/libmicrohttpd.so"
echo "$(objdump -p "$mhd" | awk '$1 == "SONAME" {print $2}') $mhd" |
    cat - <(ldd "$mhd" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}') |
    while read -r so path; do
        case $so in
            libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | libresolv.so.* | ld-linux*) ;;
            *) cp "$(readlink -f "$path")" "$D/lib/$so" ;;
        esac
    done
echo "cuda_deps: $D ($(du -sh "$D" | cut -f1)): headers, static libraries, and shared ones:"
(cd "$D/lib" && ls -- *.so*)
