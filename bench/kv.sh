#!/usr/bin/env bash
# The KV backend plugin's goal points in one run, each next to the engine's own figure measured
# in the same run (rounds alternate plugin and engine, so drift on a shared machine hits both
# alike), medians over the rounds:
#   (a) same host, protocol auto (shm): 100 000 descriptors of 4 KiB, READ and WRITE, through the
#       plugin (mooncake-kv-bench, peer spawned by it): descriptors/s posted to completion, and
#       with each transfer prepared and released as well (descs_per_sec_cycle). Next to it the
#       ceiling: raw CMA (mc-cma-bw, the same scattered 4 KiB blocks, 256 per call, from as many
#       threads as the shm transport uses: min(CPUs, 4)); and the engine's
#       mooncake-bench --mode local --memory malloc (host memory, as the plugin registers) with
#       one batch of 100 000 4 KiB requests in random order: requests/s.
#   (b) tcp between two network namespaces (tests/fixtures/netns.sh: 2 hosts, 1 link): the
#       plugin at 64 KiB x 1024 and 1 MiB x 64 descriptors (64 MiB per transfer), READ and
#       WRITE, peer started in host 2 with --serve --listen_side; against mooncake-bench
#       --mode target (host 2) / --mode initiator (host 1) --protocol tcp with the same block
#       size, batch (= descriptors) and buffer, random order. Ratio = plugin GB/s / engine GB/s.
#
# Settings (environment):
#   ROUNDS        rounds (3)
#   MC_BUILD_DIR  build directory, relative to the repo root unless absolute (build); needs
#                 bin/mooncake-kv-bench, bin/mooncake-bench and lib/libmooncake_kv.so
#   PLUGIN        the plugin to load ($MC_BUILD_DIR/lib/libmooncake_kv.so)
#   DURATION      seconds per mooncake-bench run (3)
#   ITERS         timed posts per plugin point in (b) (20); (a) uses 10
#   SAME_DESCS    descriptors in (a) (100000)
#   KVB_ARGS      extra arguments for every mooncake-kv-bench initiator (e.g. "--poll_us 20")
# Output: progress on stderr; a table and, last, one JSON line on stdout.
# Exit: 0; 77 when network namespaces are not available (after printing (a)); 1 on a failure.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
source "$here/lib.sh"
source "$root/tests/fixtures/netns.sh"
source "$root/tests/fixtures/bench_target.sh"

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-3}
ITERS=${ITERS:-20}
SAME_DESCS=${SAME_DESCS:-100000}
B=${MC_BUILD_DIR:-build}
[[ $B == /* ]] || B=$root/$B
KVB=$B/bin/mooncake-kv-bench
BENCH=$B/bin/mooncake-bench
CMA=$B/bin/mc-cma-bw
# The threads the shm transport moves a long CMA run with (MC_SHM_CMA_THREADS=auto and the
# submitting thread): as many for the raw CMA figure.
CMA_THREADS=$(($(nproc) < 4 ? $(nproc) : 4))
PLUGIN=${PLUGIN:-$B/lib/libmooncake_kv.so}
TCP_POINTS="65536:1024 1048576:64" # block size:descriptors, 64 MiB per transfer
TCP_BUFFER=64M
read -ra kvb_args <<<"${KVB_ARGS:-}"

for f in "$KVB" "$BENCH" "$CMA" "$PLUGIN"; do
    [[ -e $f ]] || {
        echo "kv.sh: $f not built (cmake --build $B --target mooncake-kv-bench mooncake-bench mc-cma-bw" \
            "mooncake_kv)" >&2
        exit 1
    }
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mc-kv.XXXXXX")
results=$tmp/results # lines: "<figure> <value>"
: >"$results"
NS=kvb$$
ns_up=0
cleanup() {
    if [[ $ns_up -eq 1 ]]; then
        netns_down "$NS" >/dev/null 2>&1 || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { echo "$*" >&2; }
record() { echo "$1 $2" >>"$results"; }
die() {
    say "kv.sh: $*"
    exit 1
}

# field FILE NAME...: fields of the last JSON line of FILE, space separated.
field() {
    python3 -c '
import json, sys
lines = [l for l in open(sys.argv[1]).read().splitlines() if l.strip().startswith("{")]
p = json.loads(lines[-1])
print(" ".join(str(p[k]) for k in sys.argv[2:]))' "$@"
}

# run LOG cmd...: run a program (not a shell function) with a time limit, stdout to LOG; on
# failure show its tail and stop.
run() {
    local log=$1 rc=0
    shift
    timeout -k 5 600 "$@" >"$log" 2>"$log.err" || rc=$?
    if [[ $rc -ne 0 ]]; then
        tail -n 8 "$log" "$log.err" | sed 's/^/    /' >&2
        die "failed (exit $rc): $*"
    fi
}

# ---- (a) same host ----
same_host() {
    local op=$1 log=$tmp/a.json dps gbps prep p99 req secs
    run "$log" "$KVB" --plugin "$PLUGIN" --block_size 4096 --num_descs "$SAME_DESCS" --op "$op" \
        --iters 10 --json "${kvb_args[@]}"
    read -r dps gbps prep p99 cyc < <(field "$log" descs_per_sec gbps prep_us post_us_p99 \
        descs_per_sec_cycle)
    record "a_${op}_plugin_descs_per_sec" "$dps"
    record "a_${op}_plugin_cycle_descs_per_sec" "$cyc"
    record "a_${op}_plugin_gbps" "$gbps"
    record "a_${op}_plugin_prep_us" "$prep"
    record "a_${op}_plugin_post_us_p99" "$p99"
    say "  (a) plugin $op 4 KiB x $SAME_DESCS: $dps descs/s ($cyc in whole cycles)," \
        "$gbps GB/s, prep $prep us"
    run "$log" "$BENCH" --mode local --protocol auto --memory malloc --operation "$op" \
        --block_size 4096 --batch_size "$SAME_DESCS" --buffer_size $((SAME_DESCS * 4096)) \
        --pattern random --duration "$DURATION" --json
    read -r req secs < <(field "$log" requests seconds)
    req=$(python3 -c "print(round($req / $secs))")
    record "a_${op}_engine_req_per_sec" "$req"
    say "  (a) engine $op 4 KiB batch $SAME_DESCS: $req requests/s"
    run "$log" "$CMA" --operation "$op" --block_size 4096 --batch 256 --pattern random \
        --threads "$CMA_THREADS" --buffer_size $((SAME_DESCS * 4096)) --duration 2 --json
    read -r gbps < <(field "$log" gbps)
    req=$(python3 -c "print(round($gbps * 1e9 / 4096))")
    record "a_${op}_cma_per_sec" "$req"
    say "  (a) raw CMA $op 4 KiB scattered, $CMA_THREADS threads: $req iovecs/s"
}

# ---- (b) tcp across namespaces ----
h1='' a1='' a2='' segment=''
ns_setup() {
    netns_up "$NS" 2 1 >/dev/null || die "netns_up failed"
    ns_up=1
    h1=$(netns_name "$NS" 1)
    a1=$(netns_addr "$NS" 1 1)
    a2=$(netns_addr "$NS" 2 1)
    bench_target_start "$NS" 2 "$tmp/target.log" "$a2:0" "$TCP_BUFFER" \
        --protocol tcp || die "mooncake-bench target in host 2 did not start"
    segment=$BENCH_SEGMENT
}

# The plugin's peer in host 2, serving one initiator; its PID in serve_pid, address in serve_at.
serve_start() {
    local log=$tmp/serve.$1.log
    : >"$log"
    NETNS_LOG=$log netns_spawn "$NS" 2 "$KVB" --plugin "$PLUGIN" --serve \
        --listen_side "$a2:0" --listen "$a2:0" --protocol tcp >/dev/null
    serve_pid=$!
    for _ in $(seq 100); do
        grep -q '^listening: ' "$log" && break
        sleep 0.1
    done
    serve_at=$(sed -n 's/^listening: //p' "$log")
    [[ -n $serve_at ]] || die "the plugin's peer did not start: $(cat "$log")"
}

tcp_point() {
    local op=$1 bs=$2 n=$3 log=$tmp/b.json gbps tag="b_$1_$2"
    serve_start "$op$bs"
    run "$log" ip netns exec "$h1" "$KVB" --plugin "$PLUGIN" --peer "$serve_at" \
        --listen "$a1:0" --protocol tcp --block_size "$bs" --num_descs "$n" --op "$op" \
        --iters "$ITERS" --json "${kvb_args[@]}"
    wait "$serve_pid" || die "the plugin's peer failed: $(cat "$tmp/serve.$op$bs.log")"
    gbps=$(field "$log" gbps)
    record "${tag}_plugin_gbps" "$gbps"
    record "${tag}_plugin_descs_per_sec" "$(field "$log" descs_per_sec)"
    say "  (b) plugin $op $bs x $n over tcp: $gbps GB/s"
    run "$log" ip netns exec "$h1" env MC_LISTEN="$a1:0" MC_METADATA=none "$BENCH" \
        --mode initiator --segment_id "$segment" --protocol tcp --operation "$op" \
        --block_size "$bs" --batch_size "$n" --buffer_size "$TCP_BUFFER" --pattern random \
        --duration "$DURATION" --json
    gbps=$(field "$log" gbps)
    record "${tag}_engine_gbps" "$gbps"
    say "  (b) engine $op $bs batch $n over tcp: $gbps GB/s"
}

have_ns=1
if ! (netns_require) 2>"$tmp/ns.why"; then
    have_ns=0
    say "(b) skipped: $(cat "$tmp/ns.why")"
fi
[[ $have_ns -eq 0 ]] || ns_setup

for ((round = 1; round <= ROUNDS; round++)); do
    say "round $round/$ROUNDS"
    for op in read write; do
        same_host "$op"
    done
    [[ $have_ns -eq 1 ]] || continue
    for pt in $TCP_POINTS; do
        for op in read write; do
            tcp_point "$op" "${pt%:*}" "${pt#*:}"
        done
    done
done

python3 - "$results" "$ROUNDS" "$SAME_DESCS" "$have_ns" "$TCP_POINTS" <<'EOF'
import json, statistics, sys

path, rounds, same_descs, have_ns, tcp_points = sys.argv[1:6]
runs = {}
for line in open(path):
    k, v = line.split()
    runs.setdefault(k, []).append(float(v))
med = {k: statistics.median(v) for k, v in runs.items()}

out = {"rounds": int(rounds), "median_of": int(rounds), "same_host": {}, "tcp_netns": None}
print("(a) same host, protocol auto, %s x 4 KiB (median of %s)" % (same_descs, rounds))
print("%-6s %16s %16s %10s %10s %12s %18s %8s %14s %8s" % (
    "op", "plugin descs/s", "cycle descs/s", "GB/s", "prep_us", "post_us_p99",
    "engine requests/s", "ratio", "raw CMA /s", "vs raw"))
for op in ("read", "write"):
    p, e = med["a_%s_plugin_descs_per_sec" % op], med["a_%s_engine_req_per_sec" % op]
    row = {"descs": int(same_descs), "block_size": 4096, "plugin_descs_per_sec": round(p),
           "plugin_cycle_descs_per_sec": round(med["a_%s_plugin_cycle_descs_per_sec" % op]),
           "plugin_gbps": med["a_%s_plugin_gbps" % op],
           "plugin_prep_us": med["a_%s_plugin_prep_us" % op],
           "plugin_post_us_p99": med["a_%s_plugin_post_us_p99" % op],
           "engine_req_per_sec": round(e), "ratio": round(p / e, 4),
           "cma_iovecs_per_sec": round(med["a_%s_cma_per_sec" % op]),
           "ratio_to_cma": round(p / med["a_%s_cma_per_sec" % op], 4)}
    out["same_host"][op] = row
    print("%-6s %16.0f %16.0f %10.3f %10.1f %12.1f %18.0f %8.3f %14.0f %8.3f" % (
        op, p, row["plugin_cycle_descs_per_sec"], row["plugin_gbps"], row["plugin_prep_us"],
        row["plugin_post_us_p99"], e, row["ratio"], row["cma_iovecs_per_sec"],
        row["ratio_to_cma"]))
if have_ns == "1":
    out["tcp_netns"] = {}
    print("(b) tcp between two namespaces, GB/s (median of %s)" % rounds)
    print("%-6s %10s %8s %12s %12s %8s" % ("op", "block_size", "descs", "plugin", "engine",
                                          "ratio"))
    for pt in tcp_points.split():
        bs, n = pt.split(":")
        for op in ("read", "write"):
            tag = "b_%s_%s" % (op, bs)
            p, e = med[tag + "_plugin_gbps"], med[tag + "_engine_gbps"]
            out["tcp_netns"].setdefault(bs, {})[op] = {
                "descs": int(n), "plugin_gbps": p, "engine_gbps": e,
                "plugin_descs_per_sec": round(med[tag + "_plugin_descs_per_sec"]),
                "ratio": round(p / e, 4)}
            print("%-6s %10s %8s %12.3f %12.3f %8.3f" % (op, bs, n, p, e, p / e))
else:
    print("(b) skipped: network namespaces are not available")
print(json.dumps(out, separators=(",", ":")))
EOF
[[ $have_ns -eq 1 ]] || exit 77
