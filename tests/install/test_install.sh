#!/usr/bin/env bash
# Installs the build tree into a temporary prefix and uses it the way a user would: checks the
# headers, the library's SONAME, the CMake package and the pkg-config file, then builds
# examples/hello_transfer against the prefix both with find_package() and with pkg-config, and
# runs both programs. Nothing outside the temporary directory is touched.
set -euo pipefail

: "${MC_BUILD_DIR:?set by ctest}" "${MC_SOURCE_DIR:?set by ctest}"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mc-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
example=$MC_SOURCE_DIR/examples/hello_transfer

fail() {
    echo "test_install: FAIL: $*" >&2
    exit 1
}
step() { echo "== $*"; }

step "install into $prefix"
cmake --install "$MC_BUILD_DIR" --prefix "$prefix" >"$tmp/install.log" ||
    { cat "$tmp/install.log"; fail "cmake --install"; }

step "headers"
for h in "$MC_SOURCE_DIR"/include/mooncake/*.h; do
    cmp -s "$h" "$prefix/include/mooncake/$(basename "$h")" || fail "header $(basename "$h") not installed"
done

step "library and SONAME"
lib=$(find "$prefix" -name libmooncake_te.so.0 | head -n 1)
[ -n "$lib" ] || fail "libmooncake_te.so.0 not installed"
libdir=$(dirname "$lib")
[ -L "$libdir/libmooncake_te.so" ] || fail "development link libmooncake_te.so missing"
soname=$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = libmooncake_te.so.0 ] || fail "SONAME is '$soname', want libmooncake_te.so.0"
if readelf -d "$lib" | grep -E '(RPATH|RUNPATH)' | grep -qF "$MC_BUILD_DIR"; then
    fail "installed library keeps a run path into the build tree"
fi

step "no build or source paths in the installed package files"
if grep -rlF -e "$MC_BUILD_DIR" -e "$MC_SOURCE_DIR" "$libdir/cmake" "$libdir/pkgconfig"; then
    fail "the files above name the build or source tree"
fi

step "KV plugin: loaded by name from the prefix by a host linking only the loader"
[ -f "$libdir/libmooncake_kv.so" ] || fail "libmooncake_kv.so not installed"
[ -f "$libdir/libmooncake_kv_loader.a" ] || fail "libmooncake_kv_loader.a not installed"
cat >"$tmp/kvhost.c" <<'C'
#include <stdio.h>
#include <mooncake/kv_loader.h>
int main(void)
{
    mc_kv_loaded_t *l;
    char err[512];

    if (mc_kv_load("mooncake_kv", MC_KV_ABI_CURRENT, &l, err, sizeof(err))) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    printf("%s %s ABI %u.%u\n", l->plugin->name, l->plugin->version, l->plugin->abi_major,
           l->plugin->abi_minor);
    mc_kv_unload(l);
    return 0;
}
C
cc -o "$tmp/kvhost" "$tmp/kvhost.c" -I"$prefix/include" "$libdir/libmooncake_kv_loader.a" -ldl ||
    fail "a host does not build against kv_loader.h and libmooncake_kv_loader.a"
out=$(env -u LD_LIBRARY_PATH MC_PLUGIN_DIR="$libdir" "$tmp/kvhost") || fail "kvhost: $out"
echo "$out"
[[ "$out" == "mooncake "*" ABI 1."* ]] || fail "kvhost printed '$out'"

step "pkg-config"
export PKG_CONFIG_PATH=$libdir/pkgconfig
# pkgconf ends its output with a space; strip it.
libs=$(pkg-config --libs mooncake | sed 's/ *$//') || fail "pkg-config does not find mooncake.pc"
cflags=$(pkg-config --cflags mooncake | sed 's/ *$//')
echo "libs: $libs / cflags: $cflags"
[ "$libs" = "-L$libdir -lmooncake_te" ] || fail "pkg-config --libs gave '$libs'"
[ "$cflags" = "-I$prefix/include" ] || fail "pkg-config --cflags gave '$cflags'"

step "find_package version checks"
version=$(pkg-config --modversion mooncake)
mkdir -p "$tmp/ver"
cat >"$tmp/ver/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.16)
project(ver C) # C: the multiarch libdir is searched only with a language on
find_package(Mooncake ${version%%.*} REQUIRED)
if(NOT Mooncake_VERSION VERSION_EQUAL "$version" OR NOT TARGET Mooncake::mooncake_te)
  message(FATAL_ERROR "Mooncake_VERSION=\${Mooncake_VERSION}, want $version and the target")
endif()
find_package(Mooncake $((${version%%.*} + 1)) QUIET)
if(Mooncake_FOUND)
  message(FATAL_ERROR "a package of another major version was accepted")
endif()
CMAKE
cmake -S "$tmp/ver" -B "$tmp/ver/build" -DCMAKE_PREFIX_PATH="$prefix" >"$tmp/ver.log" ||
    { cat "$tmp/ver.log"; fail "find_package(Mooncake) version checks"; }

# A sanitized library needs the sanitizer runtime in the program that loads it.
flags="-Wall -Wextra -Werror"
if grep -q '^MC_SANITIZE:BOOL=ON' "$MC_BUILD_DIR/CMakeCache.txt"; then
    flags="$flags -fsanitize=address,undefined"
fi

step "examples/hello_transfer/run.sh: build with find_package(Mooncake), run"
# CMake takes its first CMAKE_C_FLAGS and linker flags from CFLAGS and LDFLAGS.
CFLAGS=$flags LDFLAGS=$flags MC_BUILD_DIR=$tmp MC_PREFIX=$prefix timeout 120 "$example/run.sh" ||
    fail "examples/hello_transfer/run.sh exited with $?"
[ -x "$tmp/hello_transfer/hello_transfer" ] || fail "run.sh did not build in \$MC_BUILD_DIR"

step "build examples/hello_transfer with make and pkg-config, run"
mkdir -p "$tmp/make"
make -C "$tmp/make" -f "$example/Makefile" VPATH="$example" CFLAGS="-O2 $flags" ||
    fail "build with make and pkg-config"
LD_LIBRARY_PATH=$libdir timeout 120 "$tmp/make/hello_transfer" || fail "hello_transfer exited with $?"

for tool in mooncake-info mooncake-bench; do
    [ -x "$MC_BUILD_DIR/bin/$tool" ] || continue
    step "installed $tool finds the installed library"
    [ -x "$prefix/bin/$tool" ] || fail "$tool not installed"
    # A tool linked against the static internal library (mooncake-info) needs no resolution.
    if readelf -d "$prefix/bin/$tool" | grep -q 'NEEDED.*libmooncake_te'; then
        found=$(ldd "$prefix/bin/$tool" | awk '/libmooncake_te/ { print $3 }')
        [ "$(readlink -f "$found")" = "$(readlink -f "$lib")" ] ||
            fail "$tool resolves libmooncake_te to '$found', not to $lib"
    fi
    "$prefix/bin/$tool" --help >/dev/null || fail "installed $tool --help exited with $?"
done
echo "test_install: OK"
