#!/usr/bin/env bash
# Run kv_decode and kv_prefill against each other and show what both print.
#
#   run.sh [--netns] [FLAG...]
#
# FLAGs go to both programs (--layers, --blocks, --block-size, --opt KEY=VALUE, --timeout);
# PREFILL_ARGS and DECODE_ARGS add flags for one side only, e.g. DECODE_ARGS="--seed 7" or
# PREFILL_ARGS="--compute-us 500 --inflight 8".
#
# Builds nothing: the programs and the plugin come from MC_BUILD_DIR (default ../../build,
# relative to this script): bin/kv_prefill, bin/kv_decode, lib/libmooncake_kv.so.
#
# Without --netns both run on 127.0.0.1. With --netns they run on two "hosts", network
# namespaces joined by a veth link (tests/fixtures/netns.sh; needs root): prefill in h1 listens
# on h1's address, decode in h2 connects to it.
#
# Exit: 0 when decode verified every layer and both programs succeeded; 77 with --netns where
# namespaces cannot be created; 1 otherwise.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${MC_BUILD_DIR:-$root/build}
limit=${KV_RUN_TIMEOUT:-90} # seconds either program may run before it is killed

netns=0
if [[ ${1:-} == --netns ]]; then
    netns=1
    shift
fi

prefill=$build/bin/kv_prefill
decode=$build/bin/kv_decode
plugin=$build/lib/libmooncake_kv.so
for f in "$prefill" "$decode" "$plugin"; do
    if [[ ! -e $f ]]; then
        echo "run.sh: $f not found; build it first:" \
            "cmake --build $build --target mooncake_kv kv_prefill kv_decode" >&2
        exit 1
    fi
done
read -r -a prefill_args <<<"${PREFILL_ARGS:-}"
read -r -a decode_args <<<"${DECODE_ARGS:-}"

source "$root/bench/lib.sh" # free_port
tmp=$(mktemp -d)
pids=()   # what this script started and has not reaped yet
prefix="" # the namespaces, once created

cleanup() {
    local pid
    for pid in "${pids[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    if [[ -n $prefix ]]; then
        netns_down "$prefix" || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

port=$(free_port) # the side channel's port
common=(--plugin "$plugin" "$@")

if [[ $netns -eq 0 ]]; then
    timeout -k 5 "$limit" "$prefill" "${common[@]}" --side "127.0.0.1:$port" \
        "${prefill_args[@]}" >"$tmp/prefill.log" 2>&1 &
    pids+=($!)
    timeout -k 5 "$limit" "$decode" "${common[@]}" --side "127.0.0.1:$port" \
        "${decode_args[@]}" >"$tmp/decode.log" 2>&1 &
    pids+=($!)
else
    source "$root/tests/fixtures/netns.sh"
    netns_require # exits 77 where namespaces cannot be made
    prefix=kvx$$
    netns_up "$prefix" 2 1 || exit 77
    a1=$(netns_addr "$prefix" 1 1) # prefill's host
    a2=$(netns_addr "$prefix" 2 1) # decode's host
    echo "run.sh: prefill on $a1 (namespace $(netns_name "$prefix" 1))," \
        "decode on $a2 (namespace $(netns_name "$prefix" 2))"
    # Redirected rather than captured with $(...), so the process stays this shell's child.
    NETNS_LOG=$tmp/prefill.log netns_spawn "$prefix" 1 timeout -k 5 "$limit" "$prefill" \
        "${common[@]}" --listen "$a1:0" --side "$a1:$port" "${prefill_args[@]}" >"$tmp/pid"
    pids+=("$(<"$tmp/pid")")
    netns_exec "$prefix" 2 timeout -k 5 "$limit" "$decode" "${common[@]}" --listen "$a2:0" \
        --side "$a1:$port" "${decode_args[@]}" >"$tmp/decode.log" 2>&1 &
    pids+=($!)
fi

prefill_rc=0
decode_rc=0
wait "${pids[1]}" || decode_rc=$?
wait "${pids[0]}" || prefill_rc=$?
pids=()

cat "$tmp/decode.log"
echo
cat "$tmp/prefill.log"
echo
if [[ $decode_rc -ne 0 || $prefill_rc -ne 0 ]]; then
    echo "run.sh: FAILED (kv_decode exit $decode_rc, kv_prefill exit $prefill_rc)"
    exit 1
fi
# Both said success; insist on decode's own summary as well.
if ! grep -q '^decode: all [0-9]* layers verified' "$tmp/decode.log"; then
    echo "run.sh: FAILED (no verification summary from kv_decode)"
    exit 1
fi
echo "run.sh: OK"
