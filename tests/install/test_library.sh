#!/usr/bin/env bash
# The library loads anywhere and exports exactly its API:
#  1. libmooncake_te.so needs neither libibverbs nor the CUDA runtime at load time;
#  2. it exports exactly the functions the public headers mark MC_API, each at the version of
#     engine/libmooncake_te.map, which lists the same ones;
#  3. with libibverbs and the CUDA runtime made unloadable (files of those names that are no
#     library, first on LD_LIBRARY_PATH), an engine still starts, says "rdma unavailable" and why
#     at info level, and moves data over tcp with every byte verified; mooncake-info says the
#     same.
set -euo pipefail
: "${MC_BUILD_DIR:?set by ctest}" "${MC_SOURCE_DIR:?set by ctest}"
lib=$MC_BUILD_DIR/lib/libmooncake_te.so
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mc-library.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() {
    echo "test_library: FAIL: $*" >&2
    exit 1
}
step() { echo "== $*"; }

step "load-time dependencies"
readelf -d "$lib" | grep NEEDED | tee "$tmp/needed"
if grep -Eq 'libibverbs|libcudart|libcuda\.' "$tmp/needed"; then
    fail "libmooncake_te.so needs libibverbs or CUDA at load time"
fi

step "exported symbols"
grep -ho 'MC_API [^(]*\bmc_[a-z_0-9]*(' "$MC_SOURCE_DIR"/include/mooncake/*.h |
    sed 's/.*[ *]\(mc_[a-z_0-9]*\)(/\1/' | sort -u >"$tmp/api"
nm -D --defined-only "$lib" | awk '$2 != "A" {print $3}' | sed 's/@.*//' | sort -u >"$tmp/exported"
sed -n 's/^ *\(mc_[a-z_0-9]*\);$/\1/p' "$MC_SOURCE_DIR/engine/libmooncake_te.map" | sort -u >"$tmp/map"
diff -u "$tmp/api" "$tmp/exported" || fail "the exports differ from the MC_API functions"
diff -u "$tmp/api" "$tmp/map" || fail "libmooncake_te.map differs from the MC_API functions"
unversioned=$(nm -D --defined-only "$lib" | awk '$2 != "A" && $3 !~ /@@MOONCAKE_0\.1$/ {print $3}')
[ -z "$unversioned" ] || fail "exported without the MOONCAKE_0.1 version: $unversioned"
echo "$(wc -l <"$tmp/api") functions, all at MOONCAKE_0.1"

step "without libibverbs and the CUDA runtime"
for f in libibverbs.so.1 libcudart.so libcudart.so.13 libcudart.so.12; do
    echo "not a library" >"$tmp/$f"
done
# MC_PROTOCOL=rdma asks for rdma even between two processes of this host (and keeps shm off):
# rdma must say it is unavailable, and tcp carry everything.
export LD_LIBRARY_PATH=$tmp MC_METADATA=none MC_LOG_LEVEL=info MC_PROTOCOL=rdma
"$MC_BUILD_DIR/bin/mooncake-bench" --mode local --protocol auto --operation write \
    --block_size 65536 --buffer_size 67108864 --duration 1 --verify --json \
    >"$tmp/bench.out" 2>"$tmp/bench.err" || { cat "$tmp/bench.err"; fail "mooncake-bench"; }
grep -q 'rdma unavailable: cannot load libibverbs.so.1' "$tmp/bench.err" ||
    { cat "$tmp/bench.err"; fail "no \"rdma unavailable\" line"; }
tail -n 1 "$tmp/bench.out" | grep -q '"verify":"ok"' || { cat "$tmp/bench.out"; fail "not verified"; }
tail -n 1 "$tmp/bench.out" | grep -q '"protocol":"tcp"' || fail "not over tcp"
grep 'rdma unavailable' "$tmp/bench.err" | head -n 1
info=$("$MC_BUILD_DIR/bin/mooncake-info")
grep -q 'rdma: no (unavailable: cannot load libibverbs.so.1' <<<"$info" ||
    { echo "$info"; fail "mooncake-info does not say why rdma is unavailable"; }
grep -q 'no CUDA device' <<<"$info" || { echo "$info"; fail "mooncake-info shows a GPU"; }
echo "verified over tcp; mooncake-info: $(grep 'rdma:' <<<"$info")"
