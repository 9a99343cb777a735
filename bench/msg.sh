#!/usr/bin/env bash
# Message latency and rate of the engine next to UCX's active messages, in one invocation,
# alternating them per round so drift on a shared machine hits every figure alike; medians.
#
# Per message size and round:
#   engine_tcp          mooncake-bench --mode local --operation msg --protocol tcp
#                       --progress caller (both sides spin, as ucx_perftest does)
#   engine_tcp_thread   the same with the engine's progress threads (they sleep in epoll)
#   engine_shm          --protocol shm: a target on this host
#   engine_rdma         --protocol rdma on the software RDMA device: correctness only (--verify)
#   ucx_tcp, ucx_shm    ucx_perftest -t am_lat and -t am_bw, UCT over tcp (lo) and posix shared
#                       memory; above UCT's largest active message (tcp 8 KiB, posix 100 B short,
#                       8 KiB bcopy) the UCP level: -t ucp_am_lat / ucp_am_bw, UCX_TLS=tcp or
#                       posix,cma
# Latency is one way (half a round trip): median (p50) and, for the engine, p99, in µs; rate in
# messages/s (the engine's up to a flush: every message in the receiver's queue).
#
# Settings (flag or environment variable):
#   --rounds R        ROUNDS    rounds (3)
#   --sizes "S..."    SIZES     message sizes in bytes ("8 4096 65536")
#   --duration S      DURATION  seconds per engine run (2): half ping-pong, half streaming
#   MC_BUILD_DIR      build dir, relative to the repo root unless absolute (build)
#   MSG_SKIP          space-separated figures to leave out: ucx rdma thread
# Output: progress on stderr; a table, the engine/UCX latency ratios round by round, and, last,
# one JSON line of medians (with those ratios) on stdout.  Exit 0
# when every run that was attempted worked (skips are fine), 1 otherwise.
set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
source "$here/lib.sh"
ROUNDS=${ROUNDS:-3}
SIZES=${SIZES:-"8 4096 65536"}
DURATION=${DURATION:-2}
MSG_SKIP=${MSG_SKIP:-}

while [[ $# -gt 0 ]]; do
    case $1 in
    --rounds) ROUNDS=$2 ;;
    --sizes) SIZES=$2 ;;
    --duration) DURATION=$2 ;;
    -h | --help)
        sed -n '2,/^set -u/s/^# \{0,1\}//p' "$0" | sed '$d'
        exit 0
        ;;
    *)
        echo "msg.sh: unknown argument '$1' (see --help)" >&2
        exit 2
        ;;
    esac
    shift 2
done

B=${MC_BUILD_DIR:-build}
[[ $B == /* ]] || B=$root/$B
BENCH=$B/bin/mooncake-bench
[[ -x $BENCH ]] || { echo "msg.sh: missing $BENCH (build first)" >&2; exit 1; }
tmp=$(mktemp -d)
bg_pids=()
cleanup() {
    for p in "${bg_pids[@]}"; do kill "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT
failures=0
say() { echo "$@" >&2; }
skipped() { [[ " $MSG_SKIP " == *" $1 "* ]]; }

# Figures: "figure size metric" -> space-separated values, one per round.
declare -A vals=()
record() { vals["$1 $2 $3"]+="$4 "; }

# engine FIGURE SIZE [env...] -- [bench args...]
engine() {
    local fig=$1 size=$2 log=$tmp/engine.log envs=() line
    shift 2
    while [[ $1 != -- ]]; do envs+=("$1"); shift; done
    shift
    env "${envs[@]}" timeout -k 5 $((${DURATION%.*} + 60)) "$BENCH" --mode local \
        --operation msg --block_size "$size" --duration "$DURATION" --json "$@" >"$log" 2>&1
    local rc=$?
    line=$(grep '^{' "$log" | tail -n 1)
    if [[ $rc -ne 0 || -z $line ]]; then
        say "  $fig $size: FAILED (exit $rc):"
        tail -n 5 "$log" | sed 's/^/    /' >&2
        failures=$((failures + 1))
        return 1
    fi
    read -r p50 p99 rate carrier verify < <(python3 -c '
import json, sys
j = json.loads(sys.argv[1])
print("%.2f %.2f %.0f %s %s" % (j["lat_us_p50"], j["lat_us_p99"], j["msgs_per_sec"],
                                j["protocol"], j["verify"]))' "$line")
    say "  $fig $size: p50 $p50 us, p99 $p99 us, $rate msgs/s (carried by $carrier, verify $verify)"
    record "$fig" "$size" p50 "$p50"
    record "$fig" "$size" p99 "$p99"
    record "$fig" "$size" rate "$rate"
}

# ucx TLS FIELD -- client args...: one ucx_perftest run; prints the "Final:" field asked for
# (3: the latency median, 9: overall messages/s).
ucx() {
    local tls=$1 field=$2 port srv log=$tmp/ucx.log rc
    shift 3
    port=$(free_port)
    ucx_server "$tls" "$port" "$tmp/ucx-server.log" 60
    srv=$UCX_SERVER
    UCX_TLS=$tls timeout -k 5 60 ucx_perftest 127.0.0.1 -p "$port" "$@" >"$log" 2>&1
    rc=$?
    wait "$srv" 2>/dev/null
    local v
    v=$(awk -v f="$field" '/^Final:/ { print $f }' "$log" | tail -n 1)
    if [[ $rc -ne 0 || -z $v ]]; then
        tail -n 3 "$log" | sed 's/^/    /' >&2
        return 1
    fi
    echo "$v"
}

# ucx_pair FIGURE SIZE: latency and rate over one UCX transport (tcp or shm).
ucx_pair() {
    local fig=$1 size=$2 tls lat_args rate_args p50 rate n
    if [[ $fig == ucx_tcp ]]; then
        if ((size <= 8192)); then
            tls=tcp lat_args=(-t am_lat -x tcp -d lo) rate_args=(-t am_bw -x tcp -d lo)
        else
            tls=tcp lat_args=(-t ucp_am_lat) rate_args=(-t ucp_am_bw)
        fi
        n=20000
    else
        if ((size <= 100)); then
            tls=posix lat_args=(-t am_lat -x posix -d memory) rate_args=(-t am_bw -x posix -d memory)
        elif ((size <= 8192)); then
            tls=posix lat_args=(-t am_lat -x posix -d memory -D bcopy)
            rate_args=(-t am_bw -x posix -d memory -D bcopy)
        else
            tls=posix,cma lat_args=(-t ucp_am_lat) rate_args=(-t ucp_am_bw)
        fi
        n=200000
    fi
    ((size >= 65536)) && n=$((n / 10))
    if ! p50=$(ucx "$tls" 3 -- "${lat_args[@]}" -s "$size" -n "$n") ||
        ! rate=$(ucx "$tls" 9 -- "${rate_args[@]}" -s "$size" -n $((n * 2))); then
        say "  $fig $size: FAILED"
        failures=$((failures + 1))
        return 1
    fi
    say "  $fig $size: p50 $p50 us, $rate msgs/s (${lat_args[*]})"
    record "$fig" "$size" p50 "$p50"
    record "$fig" "$size" rate "$rate"
}

have_ucx=0
if ! skipped ucx; then
    if command -v ucx_perftest >/dev/null 2>&1; then
        have_ucx=1
    else
        say "skipped: ucx_perftest not installed"
    fi
fi
SV=$B/lib/softverbs
have_rdma=0
if ! skipped rdma && [[ -e $SV/libibverbs.so.1 ]]; then
    have_rdma=1
fi

for ((r = 1; r <= ROUNDS; r++)); do
    say "round $r/$ROUNDS"
    for size in $SIZES; do
        engine engine_tcp "$size" -- --protocol tcp --progress caller
        skipped thread || engine engine_tcp_thread "$size" -- --protocol tcp --progress thread
        engine engine_shm "$size" -- --protocol shm --progress caller
        [[ $have_ucx -eq 1 ]] && ucx_pair ucx_tcp "$size"
        [[ $have_ucx -eq 1 ]] && ucx_pair ucx_shm "$size"
        if [[ $have_rdma -eq 1 && $r -eq 1 ]]; then
            engine engine_rdma "$size" LD_LIBRARY_PATH="$SV" SOFTVERBS_DEVICES=2 \
                SOFTVERBS_FABRIC=msg-$$ SOFTVERBS_CTL_DIR="$tmp/ctl" -- --protocol rdma --verify
        fi
    done
done

# Medians, a table and the JSON line.
{
    for k in "${!vals[@]}"; do echo "$k ${vals[$k]}"; done
} | python3 -c '
import json, statistics, sys
rows, runs = {}, {}
for line in sys.stdin:
    f = line.split()
    fig, size, metric, values = f[0], int(f[1]), f[2], [float(v) for v in f[3:]]
    rows.setdefault((fig, size), {})[metric] = statistics.median(values)
    runs[(fig, size, metric)] = values
print("%-18s %10s %10s %10s %14s" % ("figure", "size", "p50_us", "p99_us", "msgs_per_sec"))
out = {}
for (fig, size), m in sorted(rows.items(), key=lambda x: (x[0][1], x[0][0])):
    print("%-18s %10d %10s %10s %14s" % (fig, size, "%.2f" % m["p50"] if "p50" in m else "-",
          "%.2f" % m["p99"] if "p99" in m else "-", "%.0f" % m["rate"] if "rate" in m else "-"))
    out["%s_%d" % (fig, size)] = {k: round(v, 2) for k, v in m.items()}
for size in sorted({s for _, s in rows}):
    for eng, ucx in (("engine_tcp", "ucx_tcp"), ("engine_shm", "ucx_shm")):
        a, b = rows.get((eng, size), {}), rows.get((ucx, size), {})
        if "p50" in a and "p50" in b and b["p50"] > 0:
            out["%s_%d_lat_vs_ucx" % (eng, size)] = round(a["p50"] / b["p50"], 2)
        # Round by round: this VM swings between a fast and a slow mode for minutes at a time,
        # and the two figures of one round share it more often than the medians do.
        ra, rb = runs.get((eng, size, "p50"), []), runs.get((ucx, size, "p50"), [])
        if ra and len(ra) == len(rb) and all(rb):
            paired = [x / y for x, y in zip(ra, rb)]
            out["%s_%d_lat_vs_ucx_by_round" % (eng, size)] = [round(r, 2) for r in paired]
            print("%s / %s %d B, round by round: %s" % (eng, ucx, size,
                  " ".join("%.2f" % r for r in paired)))
print(json.dumps(out, sort_keys=True))
'
[[ $failures -eq 0 ]]
