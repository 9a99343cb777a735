#!/bin/sh
# Build hello_transfer against an installed Mooncake-C and run it.
#
#   MC_PREFIX     where Mooncake-C is installed. Unset: the build tree $MC_BUILD_DIR is first
#                 installed into $MC_BUILD_DIR/prefix.
#   MC_BUILD_DIR  the Mooncake-C build tree (default: build, relative to the repository root);
#                 the example itself is built in $MC_BUILD_DIR/hello_transfer.
#
# From the repository root: cmake -B build && cmake --build build && examples/hello_transfer/run.sh
set -eu

here=$(cd "$(dirname "$0")" && pwd)
build=${MC_BUILD_DIR:-build}
case $build in
/*) ;;
*) build=$(cd "$here/../.." && pwd)/$build ;;
esac

if [ -z "${MC_PREFIX:-}" ]; then
    MC_PREFIX=$build/prefix
    cmake --install "$build" --prefix "$MC_PREFIX" >/dev/null
fi

out=$build/hello_transfer
cmake --fresh -S "$here" -B "$out" -DCMAKE_PREFIX_PATH="$MC_PREFIX" >/dev/null
cmake --build "$out"
exec "$out/hello_transfer"
