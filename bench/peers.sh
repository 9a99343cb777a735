#!/usr/bin/env bash
# Runs the engine's benchmark next to its peers, alternating them in one invocation so drift on a
# shared machine hits every figure alike, and reports medians over the rounds.
#
# Peers per block size and round:
#   raw_tcp_write, raw_tcp_read   mc-raw-tcp --mode local (best-case blocking sockets)
#   memcpy                        mc-memcpy-bw (single thread)
#   cma_read, cma_write           mc-cma-bw (process_vm_readv / writev, one iovec per call)
#   ucx_ucp_put_bw, ucx_ucp_get   ucx_perftest over UCX_TLS=tcp, server and client on loopback
#   ucx_uct_put_bw                ucx_perftest -t put_bw -x tcp -d lo -D zcopy (UCT level)
#   engine_write, engine_read     $MC_BUILD_DIR/bin/mooncake-bench --mode local --protocol tcp
#   engine_shm_write, _read       the same with --protocol shm (engine memory, same host)
#   engine_shm_malloc_write, _read  --protocol shm --memory malloc (CMA)
# Figures are GB/s (1e9 bytes/s).  ucx_perftest reuses one message buffer (no working set) and
# runs a fixed iteration count, sized from the previous round's rate to last about DURATION.
#
# Settings (flag or environment variable):
#   --rounds R        ROUNDS       rounds (3)
#   --sizes "S..."    SIZES        block sizes in bytes ("65536 1048576")
#   --working-set N   WORKING_SET  working set per side in bytes (1073741824)
#   --duration S      DURATION     seconds per run (3)
#   MC_BUILD_DIR      build dir, relative to the repo root unless absolute (build)
#   MC_BENCH_ARGS     extra arguments for mooncake-bench
#   PEERS_SKIP        space-separated peers to leave out: raw_tcp memcpy cma ucx engine
# Output: progress on stderr; a table and, last, one JSON line with every median and ratio on
# stdout.  Exit 0 when every run that was attempted worked (skips are fine), 1 otherwise.
set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
source "$here/lib.sh"
ROUNDS=${ROUNDS:-3}
SIZES=${SIZES:-"65536 1048576"}
WORKING_SET=${WORKING_SET:-1073741824}
DURATION=${DURATION:-3}
PEERS_SKIP=${PEERS_SKIP:-}

while [[ $# -gt 0 ]]; do
    case $1 in
    --rounds) ROUNDS=$2 ;;
    --sizes) SIZES=$2 ;;
    --working-set | --working_set) WORKING_SET=$2 ;;
    --duration) DURATION=$2 ;;
    -h | --help)
        sed -n '2,/^set -u/s/^# \{0,1\}//p' "$0" | sed '$d'
        exit 0
        ;;
    *)
        echo "peers.sh: unknown argument '$1' (see --help)" >&2
        exit 2
        ;;
    esac
    shift 2 || {
        echo "peers.sh: $1 needs a value" >&2
        exit 2
    }
done

build=${MC_BUILD_DIR:-build}
[[ $build == /* ]] || build=$root/$build
bin=$build/bin

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mc-peers.XXXXXX")
results=$tmp/results # lines: "<figure> <size> <gbps>"
: >"$results"
bg_pids=()
failures=0

cleanup() {
    local pid
    for pid in "${bg_pids[@]}"; do
        kill -TERM "$pid" 2>/dev/null && sleep 0.2
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { echo "$*" >&2; }
skipped() { [[ " $PEERS_SKIP " == *" $1 "* ]]; }
record() { echo "$1 $2 $3" >>"$results"; }

# The last line of a file, parsed as JSON, field gbps.
json_gbps() {
    python3 -c '
import json, sys
lines = [l for l in open(sys.argv[1]).read().splitlines() if l.strip()]
print(float(json.loads(lines[-1])["gbps"]))' "$1" 2>/dev/null
}

# run_json FIGURE SIZE cmd...: runs a program that ends with a JSON line; 77 means skipped.
run_json() {
    local fig=$1 size=$2 log=$tmp/run.log rc gbps
    shift 2
    timeout -k 5 $((${DURATION%.*} + 120)) "$@" >"$log" 2>&1
    rc=$?
    if [[ $rc -eq 77 ]]; then
        say "  $fig $size: skipped: $(grep -m1 -i skip "$log")"
        return 0
    fi
    if [[ $rc -ne 0 ]] || ! gbps=$(json_gbps "$log"); then
        say "  $fig $size: FAILED (exit $rc):"
        tail -n 5 "$log" | sed 's/^/    /' >&2
        failures=$((failures + 1))
        return 1
    fi
    say "  $fig $size: $gbps GB/s"
    record "$fig" "$size" "$gbps"
}

# Previous round's rate per "figure:size" for sizing ucx_perftest runs; first guesses from UCX
# 1.13 on a small VM (tcp: UCP put ~0.6 GB/s, UCP get 64 KiB ~0.05 GB/s, UCT put ~4 GB/s).
declare -A ucx_rate=()
ucx_iters() {
    local fig=$1 size=$2 guess=$3 rate
    rate=${ucx_rate[$fig:$size]:-$guess}
    python3 -c '
import sys
d, r, s = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
print(max(100, min(2000000, int(d * r * 1e9 / s))))' "$DURATION" "$rate" "$size"
}

# run_ucx FIGURE SIZE GUESS_GBPS [server env] -- client args...
run_ucx() {
    local fig=$1 size=$2 guess=$3 port n w srv log=$tmp/ucx.log slog=$tmp/ucx-server.log
    local tls=$4 rc mbs gbps i
    shift 4
    port=$(free_port)
    n=$(ucx_iters "$fig" "$size" "$guess")
    w=$((n / 10 < 1000 ? n / 10 : 1000))
    ucx_server "$tls" "$port" "$slog" $((${DURATION%.*} * 10 + 60))
    srv=$UCX_SERVER
    UCX_TLS=$tls timeout -k 5 $((${DURATION%.*} * 10 + 60)) \
        ucx_perftest 127.0.0.1 -p "$port" "$@" -s "$size" -n "$n" -w "$w" >"$log" 2>&1
    rc=$?
    wait "$srv" 2>/dev/null
    # "Final:" iterations, 50%ile, avg and overall overhead, avg and overall MB/s (2^20 B), ...
    mbs=$(awk '/^Final:/ { print $7 }' "$log" | tail -n 1)
    if [[ $rc -ne 0 || -z $mbs ]]; then
        say "  $fig $size: FAILED (exit $rc):"
        tail -n 5 "$log" "$slog" | sed 's/^/    /' >&2
        failures=$((failures + 1))
        return 1
    fi
    gbps=$(awk -v m="$mbs" 'BEGIN { printf "%.6f", m * 1048576 / 1e9 }')
    ucx_rate[$fig:$size]=$gbps
    say "  $fig $size: $gbps GB/s ($n iterations)"
    record "$fig" "$size" "$gbps"
}

have_ucx=0
if ! skipped ucx; then
    if command -v ucx_perftest >/dev/null 2>&1; then
        have_ucx=1
    else
        say "skipped: ucx_perftest not installed"
    fi
fi
have_engine=0
if ! skipped engine; then
    if [[ -x $bin/mooncake-bench ]]; then
        have_engine=1
    else
        say "skipped: mooncake-bench not built ($bin/mooncake-bench)"
    fi
fi
for prog in mc-raw-tcp mc-memcpy-bw mc-cma-bw; do
    [[ -x $bin/$prog ]] || {
        say "peers.sh: $bin/$prog not built (cmake --build $build)"
        exit 1
    }
done

common=(--duration "$DURATION" --buffer_size "$WORKING_SET" --json)
for ((round = 1; round <= ROUNDS; round++)); do
    for size in $SIZES; do
        say "round $round/$ROUNDS, block $size:"
        if ! skipped raw_tcp; then
            for op in write read; do
                run_json "raw_tcp_$op" "$size" "$bin/mc-raw-tcp" --mode local --operation $op \
                    --block_size "$size" "${common[@]}"
            done
        fi
        if [[ $have_engine -eq 1 ]]; then
            for op in write read; do
                # shellcheck disable=SC2086 # MC_BENCH_ARGS holds several arguments
                run_json "engine_$op" "$size" "$bin/mooncake-bench" --mode local --protocol tcp \
                    --operation $op --block_size "$size" "${common[@]}" ${MC_BENCH_ARGS:-}
                # shellcheck disable=SC2086
                run_json "engine_shm_$op" "$size" "$bin/mooncake-bench" --mode local \
                    --protocol shm --operation $op --block_size "$size" "${common[@]}" \
                    ${MC_BENCH_ARGS:-}
                # shellcheck disable=SC2086
                run_json "engine_shm_malloc_$op" "$size" "$bin/mooncake-bench" --mode local \
                    --protocol shm --memory malloc --operation $op --block_size "$size" \
                    "${common[@]}" ${MC_BENCH_ARGS:-}
            done
        fi
        skipped memcpy || run_json memcpy "$size" "$bin/mc-memcpy-bw" --block_size "$size" \
            "${common[@]}"
        if ! skipped cma; then
            for op in read write; do
                run_json "cma_$op" "$size" "$bin/mc-cma-bw" --operation $op --block_size "$size" \
                    "${common[@]}"
            done
        fi
        if [[ $have_ucx -eq 1 ]]; then
            run_ucx ucx_ucp_put_bw "$size" 0.6 tcp -t ucp_put_bw
            run_ucx ucx_ucp_get "$size" 0.05 tcp -t ucp_get
            run_ucx ucx_uct_put_bw "$size" 4 tcp -t put_bw -x tcp -d lo -D zcopy
        fi
    done
done

python3 - "$results" "$ROUNDS" "$WORKING_SET" "$DURATION" "$SIZES" "$failures" <<'EOF'
import json, statistics, sys

path, rounds, ws, duration, sizes, failures = sys.argv[1:7]

def size_value(text):
    units = {"k": 10, "m": 20, "g": 30}
    t = text.lower().rstrip("ib").rstrip("b") if not text.isdigit() else text
    return int(t[:-1]) << units[t[-1]] if t[-1] in units else int(t)

runs = {}
for line in open(path):
    fig, size, gbps = line.split()
    runs.setdefault(size_value(size), {}).setdefault(fig, []).append(float(gbps))

order = ["engine_write", "raw_tcp_write", "engine_read", "raw_tcp_read", "engine_shm_write",
         "engine_shm_read", "memcpy", "engine_shm_malloc_write", "engine_shm_malloc_read",
         "cma_write", "cma_read", "ucx_ucp_put_bw", "ucx_ucp_get", "ucx_uct_put_bw"]
ratios = [("ratio_engine_raw_tcp_write", "engine_write", "raw_tcp_write"),
          ("ratio_engine_raw_tcp_read", "engine_read", "raw_tcp_read"),
          ("ratio_engine_read_write", "engine_read", "engine_write"),
          ("ratio_raw_tcp_read_write", "raw_tcp_read", "raw_tcp_write"),
          ("ratio_engine_shm_write_memcpy", "engine_shm_write", "memcpy"),
          ("ratio_engine_shm_read_memcpy", "engine_shm_read", "memcpy"),
          ("ratio_engine_shm_malloc_write_cma", "engine_shm_malloc_write", "cma_write"),
          ("ratio_engine_shm_malloc_read_cma", "engine_shm_malloc_read", "cma_read")]
out = {"rounds": int(rounds), "working_set": size_value(ws), "duration": float(duration),
       "unit": "GB/s (1e9 B/s), median over rounds", "runs_failed": int(failures), "sizes": {}}
size_list = [size_value(s) for s in sizes.split()]
for size in size_list:
    figs = runs.get(size, {})
    med = {f: round(statistics.median(v), 4) for f, v in figs.items()}
    for name, num, den in ratios:
        if num in med and den in med and med[den] > 0:
            med[name] = round(med[num] / med[den], 4)
    out["sizes"][str(size)] = med

names = [f for f in order if any(f in out["sizes"][str(s)] for s in size_list)]
names += [r[0] for r in ratios if any(r[0] in out["sizes"][str(s)] for s in size_list)]
w = max([len(n) for n in names] + [10])
print("%-*s" % (w, "GB/s (median of %s)" % rounds) + "".join("%14s" % s for s in size_list))
for n in names:
    cells = []
    for s in size_list:
        v = out["sizes"][str(s)].get(n)
        cells.append("%14s" % ("-" if v is None else "%.3f" % v))
    print("%-*s" % (w, n) + "".join(cells))
print(json.dumps(out, separators=(",", ":")))
EOF
summary_rc=$?
[[ $failures -eq 0 && $summary_rc -eq 0 ]]
