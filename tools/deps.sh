#!/usr/bin/env bash
# The build's dependencies, found and installed, so that `make`, `make run`, `make test` and
# `make CUDA=1` are the only commands a fresh Debian or Ubuntu machine needs. The Makefile runs
# it first, before it tests anything that an install could change (clang's libFuzzer):
#
#   tools/deps.sh NEED...   build   compiler and the -dev packages (or .deps, below)
#                           system  the same, on the system only (tools/cuda_deps.sh copies them)
#                           test    what the test suites run besides the build
#                           python  a python3 with numpy (tools/make_synth.py)
#                           cuda    nvcc
#   tools/deps.sh pick-python      prints the first of python3, /usr/bin/python3 that has numpy
#
# What is missing is checked cheaply (one preprocessor run for the headers, `command -v`, one
# numpy import): a machine that has everything calls no apt. Missing Debian packages are
# installed with apt-get (non-interactive; `apt-get update` first when one is unknown), as root
# or through sudo. Where that cannot be done it prints the one command to run, and fails.
#
# A machine without the -dev packages and without a package mirror (the GPU machine) builds
# against copies of them in .deps (or $DEPS), made by tools/cuda_deps.sh on a machine that has
# them: when the system lacks a header and .deps has them all, the folder's name is printed on
# stdout (the Makefile's DEPS) and nothing is installed. Everything else goes to stderr.
set -uo pipefail
exec 3>&1 1>&2
say() { echo "deps: $*"; }

# header | Debian package | why
HEADERS='jansson.h|libjansson-dev|JSON: config.json, tokenizer.json, the server
openssl/evp.h|libssl-dev|SHA-256 of packed files (libcrypto)
pcre2.h|libpcre2-dev|the tokenizer pre-tokenizer regex
utf8proc.h|libutf8proc-dev|NFC normalisation in the tokenizer
editline/readline.h|libedit-dev|line editing in `chat`
microhttpd.h|libmicrohttpd-dev|the HTTP server of `serve`
liburing.h|liburing-dev|io_uring expert reads (--io-engine uring; built without it when absent)'

missing=()   # "package|why"
need() { missing+=("$1|$2"); }

# has_headers [CFLAGS...]: every header above preprocesses. In a .deps folder liburing may be
# absent (one made before it was added): the build then goes without io_uring.
header_src() { echo '#define PCRE2_CODE_UNIT_WIDTH 8'; echo '#include <stdio.h>'; cut -d'|' -f1 <<<"$HEADERS" | grep -v "${SKIP_HEADER:-^$}" | sed 's/.*/#include <&>/'; }
has_headers() { header_src | cc "$@" -E -x c - -o /dev/null 2>/dev/null; }

check_build() { # $1: deps (a complete .deps will do) or system
    local h p why d=${DEPS:-.deps}
    command -v cc >/dev/null && command -v make >/dev/null || need build-essential "the C compiler, make"
    if command -v cc >/dev/null; then
        has_headers && return 0
        if [ "$1" = deps ] && [ -d "$d/include" ] && SKIP_HEADER=liburing has_headers -I"$d/include"; then
            say "the -dev packages' headers are not installed; building against $d (tools/cuda_deps.sh)"
            use_deps=$d
            return 0
        fi
    fi
    while IFS='|' read -r h p why; do
        printf '#define PCRE2_CODE_UNIT_WIDTH 8\n#include <stdio.h>\n#include <%s>\n' "$h" |
            cc -E -x c - -o /dev/null 2>/dev/null || need "$p" "$h: $why"
    done <<<"$HEADERS"
    [ "$1" = deps ] && nodeps=$d
    return 0
}

# The clang runtimes for the clang installed; with clang itself, the default version's.
rt_package() {
    if command -v clang >/dev/null; then
        local v
        v=$(clang -dumpversion)
        echo "libclang-rt-${v%%.*}-dev"
    else
        echo libclang-rt-dev
    fi
}
has_libfuzzer() {
    local f p
    for f in "libclang_rt.fuzzer-$(uname -m).a" libclang_rt.fuzzer.a; do
        p=$(clang -print-file-name="$f" 2>/dev/null) && [ "$p" != "$f" ] && return 0
    done
    return 1
}

pick_python() {
    local p
    for p in python3 /usr/bin/python3; do
        "$p" -c 'import numpy' 2>/dev/null && { command -v "$p"; return 0; }
    done
    return 1
}

check_python() { pick_python >/dev/null || need python3-numpy "numpy for tools/make_synth.py (the tests' tiny models)"; }

check_test() {
    if ! command -v clang >/dev/null; then
        need clang "libFuzzer fuzz targets"
        need RT "libFuzzer and sanitizer runtimes"
    elif ! has_libfuzzer; then
        need RT "libFuzzer and sanitizer runtimes for clang $(clang -dumpversion)"
    fi
    check_python
    command -v script >/dev/null || need bsdutils "\`script\`: drives \`chat\` through a pseudo-terminal"
    command -v curl >/dev/null || need curl "the server test's requests"
    command -v xz >/dev/null || need xz-utils "xz: the tests unpack tests/tokenizer/*.xz"
    [ -f /etc/ssl/certs/ca-certificates.crt ] || need ca-certificates "npm fetches the openai client over HTTPS"
    # npm from elsewhere (NodeSource) is fine: then Debian's nodejs/npm would conflict.
    if ! command -v npm >/dev/null; then
        need nodejs "the server test's client (the official openai npm package)"
        need npm "installs that client"
    elif ! command -v node >/dev/null; then
        need nodejs "the server test's client"
    fi
}

check_cuda() {
    command -v "${NVCC:-nvcc}" >/dev/null && return 0
    say "CUDA=1 needs nvcc (the CUDA toolkit) on the PATH, or NVCC=/path/to/nvcc"
    exit 1
}

check() {
    missing=()
    nodeps=
    local n
    for n in "$@"; do
        case $n in
            build) check_build deps ;;
            system) check_build system ;;
            test) check_test ;;
            python) check_python ;;
            cuda) check_cuda ;;
            *) say "unknown need '$n'"; exit 2 ;;
        esac
    done
}

# packages: the missing packages' names, once each, the clang runtime resolved.
packages() {
    local m p seen=' '
    for m in "${missing[@]}"; do
        p=${m%%|*}
        [ "$p" = RT ] && p=$(rt_package)
        case $seen in *" $p "*) ;; *) seen+="$p "; echo "$p" ;; esac
    done
}

# cannot_install WHY: the one command, then fail.
cannot_install() {
    local pk
    pk=$(packages | tr '\n' ' ')
    if [ "$(id -u)" = 0 ]; then
        say "cannot install them: $1 (above). The command, then make again:"
    else
        say "cannot install them: $1. Run this as root, then make again:"
    fi
    echo "    apt-get update && apt-get install -y --no-install-recommends ${pk% }"
    if [ -n "${nodeps:-}" ]; then
        [ -d "$nodeps/include" ] && say "($nodeps lacks some of the headers: made by an older tools/cuda_deps.sh?)"
        say "or, on a machine without a package mirror (the GPU machine): run tools/cuda_deps.sh on"
        say "a machine with the packages and carry $nodeps here; make then builds against it."
    fi
    exit 1
}

if [ "${1:-}" = pick-python ]; then
    pick_python >&3 || { say "no python3 with numpy (apt-get install python3-numpy)"; exit 1; }
    exit 0
fi

use_deps=
check "$@"
[ -n "$use_deps" ] && echo "$use_deps" >&3
[ ${#missing[@]} -eq 0 ] && exit 0

say "missing:"
for m in "${missing[@]}"; do
    p=${m%%|*}
    [ "$p" = RT ] && p=$(rt_package)
    printf '    %-26s %s\n' "$p" "${m#*|}"
done

command -v apt-get >/dev/null || {
    say "no apt-get: not a Debian or Ubuntu system; install the equivalents of the packages above."
    exit 1
}
SUDO=()
if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || cannot_install "not root, and no sudo"
    SUDO=(sudo)
fi
apt() {
    echo "+ ${SUDO[*]}${SUDO:+ }apt-get $*"
    "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q -o Acquire::Retries=1 \
        -o Acquire::http::Timeout=20 -o Acquire::https::Timeout=20 "$@"
}
mapfile -t pkgs < <(packages)
# An unknown package (a fresh machine's empty package lists) needs `apt-get update` first;
# so does a failed download (stale lists).
if ! apt-cache show --no-all-versions "${pkgs[@]}" >/dev/null 2>&1; then
    apt update || cannot_install "apt-get update failed"
    mapfile -t pkgs < <(packages)
    updated=1
fi
if ! apt install -y --no-install-recommends "${pkgs[@]}"; then
    [ -z "${updated:-}" ] && apt update && apt install -y --no-install-recommends "${pkgs[@]}" ||
        cannot_install "apt-get install failed"
fi

check "$@"
if [ ${#missing[@]} -gt 0 ]; then
    say "still missing after the install:"
    printf '    %s\n' "${missing[@]}"
    exit 1
fi
say "installed: ${pkgs[*]}"
