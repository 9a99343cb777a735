#!/usr/bin/env bash
# Metadata benchmark: puts and gets per second against a throwaway local etcd, through the
# etcd:// backend (mc-meta-bench, 1 and 4 threads) and through etcdctl doing the same work in the
# same run (one etcdctl process per operation, as scripts use it), plus the file:// backend.
#
#   bench/metadata.sh [COUNT] [VALUE_BYTES]      (MC_BUILD_DIR: the build, default ./build)
set -u
src=$(cd "$(dirname "$0")/.." && pwd)
build=${MC_BUILD_DIR:-$src/build}
count=${1:-2000}
vlen=${2:-256}
ctl_count=$((count / 10 > 0 ? count / 10 : 1))
command -v etcd >/dev/null 2>&1 || { echo "etcd not installed" >&2; exit 77; }
# shellcheck source=../tests/fixtures/etcd.sh
source "$src/tests/fixtures/etcd.sh"
work=$(mktemp -d /tmp/mc-meta-bench-XXXXXX)
trap 'etcd_stop "$work/etcd"; rm -rf "$work"' EXIT
etcd_start "$work/etcd" >/dev/null || exit 1

echo "== mc-meta-bench etcd://$ETCD_ENDPOINT, $count keys, $vlen-byte values"
"$build/bin/mc-meta-bench" "etcd://$ETCD_ENDPOINT" "$count" "$vlen" 1 || exit 1
"$build/bin/mc-meta-bench" "etcd://$ETCD_ENDPOINT" "$count" "$vlen" 4 || exit 1
echo "== mc-meta-bench file://, same work"
"$build/bin/mc-meta-bench" "file://$work/store" "$count" "$vlen" 1 || exit 1

echo "== etcdctl, $ctl_count keys (one process per operation)"
val=$(head -c "$vlen" /dev/zero | tr '\0' a)
export ETCDCTL_API=3
t0=$(date +%s.%N)
for ((i = 0; i < ctl_count; i++)); do
    etcdctl --endpoints="$ETCD_ENDPOINT" put "ctl/$i" "$val" >/dev/null || exit 1
done
t1=$(date +%s.%N)
for ((i = 0; i < ctl_count; i++)); do
    etcdctl --endpoints="$ETCD_ENDPOINT" get "ctl/$i" --print-value-only >/dev/null || exit 1
done
t2=$(date +%s.%N)
awk -v n="$ctl_count" -v a="$t0" -v b="$t1" -v c="$t2" -v v="$vlen" 'BEGIN {
    printf "{\"tool\":\"etcdctl\",\"count\":%d,\"value_bytes\":%d,\"threads\":1,\"puts_per_s\":%.0f,\"gets_per_s\":%.0f}\n",
        n, v, n / (b - a), n / (c - b) }'
echo "== etcdctl put, $count keys from one process (txn batches of 100 puts)"
t0=$(date +%s.%N)
for ((i = 0; i < count; i += 100)); do
    { echo; for ((k = i; k < i + 100 && k < count; k++)); do echo "put txn/$k $val"; done; echo; echo; } |
        etcdctl --endpoints="$ETCD_ENDPOINT" txn >/dev/null || exit 1
done
t1=$(date +%s.%N)
awk -v n="$count" -v a="$t0" -v b="$t1" 'BEGIN { printf "{\"tool\":\"etcdctl-txn\",\"count\":%d,\"puts_per_s\":%.0f}\n", n, n / (b - a) }'
