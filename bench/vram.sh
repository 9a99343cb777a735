#!/usr/bin/env bash
# VRAM through host memory against its limits, in one run (needs a CUDA device; exits 77
# without one):
#   shm   VRAM <-> a same-host peer's DRAM (mooncake-bench --mode local --protocol shm
#         --memory cuda:0: our chunks staged by the GPU's copies, their bytes over shm), WRITE
#         against cudaMemcpy device-to-host from pinned memory, READ against host-to-device
#         (mc-cuda-copy-bw: the limit). Goal: 0.8x.
#   tcp   VRAM -> VRAM between two processes over tcp (both ends staged), against the engine's
#         DRAM -> DRAM tcp figure. Goal: 0.8x.
#   ipc   VRAM -> a same-host peer's VRAM (--protocol shm: opened with CUDA IPC, one device copy
#         per slice), against cudaMemcpy device-to-device on one GPU. Goal: 0.8x.
# Each point runs ROUNDS times, engine and reference in turns; medians are compared. A verified
# pass of each engine pair runs first.
#
# Settings (environment): SIZE working set (256M), BS block (1M), DURATION seconds per run (2),
# ROUNDS (3), MC_BUILD_DIR (build; needs bin/mooncake-bench and bin/mc-cuda-copy-bw).
# Output: a table, then one JSON line with shm_write_ratio, shm_read_ratio, tcp_ratio and
# ipc_ratio.
# Exit: 0; 77 without a CUDA device; 1 on a failure.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
SIZE=${SIZE:-256M}
BS=${BS:-1M}
DURATION=${DURATION:-2}
ROUNDS=${ROUNDS:-3}
B=${MC_BUILD_DIR:-build}
[[ $B == /* ]] || B=$root/$B
BENCH=$B/bin/mooncake-bench
COPY=$B/bin/mc-cuda-copy-bw

say() { echo "$*" >&2; }
die() {
    say "vram.sh: $*"
    exit 1
}
[[ -x $BENCH ]] || die "$BENCH not built"
if [[ ! -x $COPY ]]; then
    say "vram.sh: $COPY not built (a build without the CUDA toolkit has none): skipped"
    exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mc-vram.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM

rc=0
"$COPY" --duration 0.1 --buffer_size 16M >/dev/null 2>"$tmp/probe.err" || rc=$?
if ((rc == 77)); then
    cat "$tmp/probe.err" >&2
    exit 77
fi
((rc == 0)) || die "$(cat "$tmp/probe.err")"

gbps_of() {
    python3 -c '
import json, sys
j = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
assert j.get("verify", "off") in ("ok", "off"), j["verify"]
print("%.4f" % j["gbps"])' "$1"
}
# engine ARGS...: GB/s of a mooncake-bench run between two processes.
engine() {
    "$BENCH" --mode local --json --buffer_size "$SIZE" --block_size "$BS" --batch_size 32 \
        --threads 2 "$@" >"$tmp/b.out" 2>"$tmp/b.err" || {
        cat "$tmp/b.err" >&2
        die "mooncake-bench $* failed"
    }
    gbps_of "$tmp/b.out"
}
# limit DIRECTION: GB/s of cudaMemcpy from pinned memory in blocks of BS.
limit() {
    "$COPY" --json --direction "$1" --block_size "$BS" --buffer_size "$SIZE" \
        --duration "$DURATION" >"$tmp/c.out" 2>"$tmp/c.err" || {
        cat "$tmp/c.err" >&2
        die "mc-cuda-copy-bw $1 failed"
    }
    gbps_of "$tmp/c.out"
}
median() { python3 -c 'import statistics, sys; print("%.4f" % statistics.median(map(float, sys.argv[1:])))' "$@"; }
ratio() { python3 -c 'import sys; a, b = map(float, sys.argv[1:]); print("%.3f" % (a / b if b else 0))' "$1" "$2"; }

shm_w=(--protocol shm --memory cuda:0 --target_memory engine --operation write)
shm_r=(--protocol shm --memory cuda:0 --target_memory engine --operation read)
tcp_v=(--protocol tcp --memory cuda:0 --target_memory cuda:0 --operation write)
tcp_d=(--protocol tcp --memory malloc --target_memory malloc --operation write)
ipc_v=(--protocol shm --memory cuda:0 --target_memory cuda:0 --operation write)

say "vram.sh: $SIZE, blocks of $BS, $ROUNDS x $DURATION s per run; verified passes first"
for args in shm_w shm_r tcp_v ipc_v; do
    declare -n a=$args
    engine "${a[@]}" --duration 1 --verify >/dev/null
done

sw=() sr=() d2h=() h2d=() tv=() td=() iv=() d2d=()
for ((r = 0; r < ROUNDS; r++)); do
    if ((r % 2)); then
        d2h+=("$(limit d2h)")
        h2d+=("$(limit h2d)")
        d2d+=("$(limit d2d)")
        td+=("$(engine "${tcp_d[@]}" --duration "$DURATION")")
    fi
    sw+=("$(engine "${shm_w[@]}" --duration "$DURATION")")
    sr+=("$(engine "${shm_r[@]}" --duration "$DURATION")")
    tv+=("$(engine "${tcp_v[@]}" --duration "$DURATION")")
    iv+=("$(engine "${ipc_v[@]}" --duration "$DURATION")")
    if ((r % 2 == 0)); then
        d2h+=("$(limit d2h)")
        h2d+=("$(limit h2d)")
        d2d+=("$(limit d2d)")
        td+=("$(engine "${tcp_d[@]}" --duration "$DURATION")")
    fi
done
SW=$(median "${sw[@]}") SR=$(median "${sr[@]}") TV=$(median "${tv[@]}")
D2H=$(median "${d2h[@]}") H2D=$(median "${h2d[@]}") TD=$(median "${td[@]}")
IV=$(median "${iv[@]}") D2D=$(median "${d2d[@]}")
swr=$(ratio "$SW" "$D2H") srr=$(ratio "$SR" "$H2D") tr=$(ratio "$TV" "$TD") ir=$(ratio "$IV" "$D2D")
printf '%-34s %10s %10s %8s\n' point engine_GB/s limit_GB/s ratio
printf '%-34s %10s %10s %8s\n' "shm WRITE VRAM->peer DRAM (d2h)" "$SW" "$D2H" "$swr"
printf '%-34s %10s %10s %8s\n' "shm READ peer DRAM->VRAM (h2d)" "$SR" "$H2D" "$srr"
printf '%-34s %10s %10s %8s\n' "tcp WRITE VRAM->VRAM (DRAM tcp)" "$TV" "$TD" "$tr"
printf '%-34s %10s %10s %8s\n' "ipc WRITE VRAM->peer VRAM (d2d)" "$IV" "$D2D" "$ir"
echo "{\"bench\":\"vram\",\"size\":\"$SIZE\",\"block\":\"$BS\",\"shm_write_gbps\":$SW,\"d2h_gbps\":$D2H,\"shm_write_ratio\":$swr,\"shm_read_gbps\":$SR,\"h2d_gbps\":$H2D,\"shm_read_ratio\":$srr,\"tcp_vram_gbps\":$TV,\"tcp_dram_gbps\":$TD,\"tcp_ratio\":$tr,\"ipc_gbps\":$IV,\"d2d_gbps\":$D2D,\"ipc_ratio\":$ir}"
