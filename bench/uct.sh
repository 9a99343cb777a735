#!/usr/bin/env bash
# The UCX module (UCX_TLS=mooncake) next to UCX's own transports, with UCX's own ucx_perftest,
# in one invocation, alternating them per round; medians of the rounds.
#
# Per round, between two processes on loopback and between two network-namespace hosts (a veth
# link the script creates and removes):
#   UCT level  put_bw -D zcopy, get -D zcopy            -x mooncake -d engine   vs  -x tcp
#   UCP level  ucp_put_bw, ucp_get, tag_bw              UCX_TLS=mooncake,self   vs  UCX_TLS=tcp
# at 64 KiB and 1 MiB; and on loopback UCP tag_bw against UCX's shared-memory copy (cma, with
# tcp for its active messages: UCX_TLS=cma,tcp). Eager messages (active messages all the way):
#   UCP level  tag_bw, stream_bw at 4 KiB and 16 KiB    UCX_TLS=mooncake,self   vs  UCX_TLS=tcp
# and on loopback against UCX's shared-memory active messages (UCX_TLS=posix,self).
# Figures are MB/s (ucx_perftest's average).
# Targets (issue 14): UCP put/get over mooncake >= 4x UCX tcp at 1 MiB and ucp_get >= 10x at
# 64 KiB; UCT zcopy put >= 0.9x UCX tcp's; on one host UCP tag_bw at 1 MiB >= 0.8x cma.
#
# Settings (flag or environment variable):
#   --rounds R   ROUNDS   rounds (3)
#   MC_BUILD_DIR          build dir, relative to the repo root unless absolute (build)
#   UCT_SKIP              "netns" leaves the namespace figures out
# Output: progress on stderr, a table and, last, one JSON line with every median and ratio.
# Exit 0 when every run worked (a UCX transport that lacks an operation gives null), else 1.
set -u

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
source "$here/lib.sh"
source "$root/tests/fixtures/netns.sh"

ROUNDS=${ROUNDS:-3}
while (($#)); do
    case $1 in
    --rounds) ROUNDS=$2; shift 2 ;;
    *) echo "usage: $0 [--rounds R]" >&2; exit 2 ;;
    esac
done
B=${MC_BUILD_DIR:-build}
[[ $B == /* ]] || B=$root/$B
MOD=$B/lib/libuct_mooncake.so
[[ -f $MOD ]] || { echo "uct.sh: missing $MOD (build first, after scripts/install-deps)" >&2; exit 1; }
command -v ucx_perftest >/dev/null || { echo "uct.sh: ucx_perftest missing (ucx-utils)" >&2; exit 1; }

LOG=$(mktemp -d)
P=mcb$$
bg_pids=()
NETNS=0
cleanup() {
    for p in "${bg_pids[@]}"; do kill "$p" 2>/dev/null; done
    ((NETNS)) && netns_down $P 2>/dev/null
    rm -rf "$LOG"
}
trap cleanup EXIT

# One ucx_perftest pair. run WHERE TRANSPORT TEST SIZE ITERS: prints MB/s or "null".
#   WHERE: lo | ns;  TRANSPORT: mooncake | tcp | cma | posix
run() {
    local where=$1 tr=$2 test=$3 size=$4 iters=$5 port env=() args=() srv host i rc=0
    case $tr in
    mooncake) env=(LD_PRELOAD="$MOD") ;;
    esac
    case $test in
    put_bw | get)
        if [[ $tr == mooncake ]]; then
            args=(-x mooncake -d engine)
        else
            args=(-x tcp -d "$([[ $where == lo ]] && echo lo || echo $NS_DEV)")
        fi
        args+=(-D zcopy) ;;
    *)
        case $tr in
        mooncake) env+=(UCX_TLS=mooncake,self) ;;
        tcp) env+=(UCX_TLS=tcp) ;;
        cma) env+=(UCX_TLS=cma,tcp) ;;
        posix) env+=(UCX_TLS=posix,self) ;;
        esac ;;
    esac
    port=$(free_port)
    if [[ $where == lo ]]; then
        env "${env[@]}" timeout -k 5 90 ucx_perftest -p "$port" "${args[@]}" >"$LOG/srv" 2>&1 &
        srv=$!
        bg_pids+=("$srv")
        host=127.0.0.1
        for ((i = 0; i < 100; i++)); do listening "$port" && break; sleep 0.05; done
        env "${env[@]}" timeout -k 5 90 ucx_perftest -p "$port" "${args[@]}" -t "$test" \
            -s "$size" -n "$iters" $host >"$LOG/cli" 2>&1 || rc=$?
    else
        local senv=("${env[@]}") cenv=("${env[@]}")
        [[ $tr == mooncake ]] && senv+=(UCX_MOONCAKE_LISTEN="$A2:0") && cenv+=(UCX_MOONCAKE_LISTEN="$A1:0")
        srv=$(netns_spawn $P 2 env "${senv[@]}" timeout -k 5 90 ucx_perftest -p "$port" "${args[@]}")
        host=$A2
        for ((i = 0; i < 100; i++)); do
            netns_exec $P 2 awk -v p="$(printf '%04X' "$port")" \
                '$4 == "0A" && $2 ~ (":" p "$") { f = 1 } END { exit !f }' /proc/net/tcp && break
            sleep 0.05
        done
        netns_exec $P 1 env "${cenv[@]}" timeout -k 5 90 ucx_perftest -p "$port" "${args[@]}" \
            -t "$test" -s "$size" -n "$iters" $host >"$LOG/cli" 2>&1 || rc=$?
    fi
    for ((i = 0; i < 50; i++)); do kill -0 "$srv" 2>/dev/null || break; sleep 0.1; done
    kill "$srv" 2>/dev/null
    if ((rc == 0)) && grep -q '^Final:' "$LOG/cli"; then
        awk '/^Final:/ { print $6 }' "$LOG/cli"
    else
        # a transport that lacks the operation is a null figure, not a failure
        if ! grep -qE 'Unsupported operation' "$LOG/cli"; then
            echo "uct.sh: $where $tr $test $size failed (rc $rc):" >&2
            tail -3 "$LOG/cli" >&2
            touch "$LOG/failed"
        fi
        echo null
    fi
}

# the figures: name -> one value per round
declare -A fig
record() { fig[$1]+="$2 "; echo "  $1: $2" >&2; }
median() {
    tr ' ' '\n' <<<"${fig[$1]:-}" | grep -v '^$' | grep -v null | sort -g |
        awk '{ a[NR] = $1 } END { if (NR == 0) print "null"; else if (NR % 2) print a[(NR + 1) / 2]; else printf "%.2f\n", (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

WHERES=(lo)
if [[ ${UCT_SKIP:-} != *netns* ]] && (netns_require) >/dev/null 2>&1; then
    netns_up $P 2 1 >/dev/null && NETNS=1 && WHERES+=(ns)
    A1=$(netns_addr $P 1 1)
    A2=$(netns_addr $P 2 1)
    # ucx_perftest's server takes the client's device name: give both ends the same one
    NS_DEV=mcuct0
    for h in 1 2; do
        dev=$(netns_ifname $P $h 1)
        netns_exec $P $h ip link set dev "$dev" down
        netns_exec $P $h ip link set dev "$dev" name $NS_DEV
        netns_exec $P $h ip link set dev $NS_DEV up
    done
fi

EAGER_SIZES=(4096 16384)
EAGER_TESTS=(tag_bw stream_bw)
for ((r = 1; r <= ROUNDS; r++)); do
    echo "round $r/$ROUNDS" >&2
    for where in "${WHERES[@]}"; do
        for size in 65536 1048576; do
            n=$((size == 65536 ? 2000 : 300))
            for tr in mooncake tcp; do
                record "${where}_${tr}_uct_put_zcopy_$size" "$(run $where $tr put_bw $size $n)"
                record "${where}_${tr}_uct_get_zcopy_$size" "$(run $where $tr get $size $n)"
                record "${where}_${tr}_ucp_put_bw_$size" "$(run $where $tr ucp_put_bw $size $n)"
                m=$n
                [[ $tr == tcp && $size == 65536 ]] && m=300 # UCX tcp: about 1 ms each
                record "${where}_${tr}_ucp_get_$size" "$(run $where $tr ucp_get $size $m)"
                record "${where}_${tr}_tag_bw_$size" "$(run $where $tr tag_bw $size $n)"
            done
            [[ $where == lo ]] && record "lo_cma_tag_bw_$size" "$(run lo cma tag_bw $size $n)"
        done
        for size in "${EAGER_SIZES[@]}"; do
            for t in "${EAGER_TESTS[@]}"; do
                for tr in mooncake tcp posix; do
                    [[ $tr == posix && $where != lo ]] && continue
                    record "${where}_${tr}_${t}_$size" "$(run $where $tr $t $size 50000)"
                done
            done
        done
    done
done

ratio() { # ratio NAME A B: median(A) / median(B)
    local a b
    a=$(median "$2")
    b=$(median "$3")
    if [[ $a == null || $b == null ]]; then echo null; else awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f\n", a / b }'; fi
}

printf '%-34s %12s %12s %8s\n' "figure (MB/s, median of $ROUNDS)" mooncake "UCX peer" ratio
json="{\"rounds\":$ROUNDS"
for where in "${WHERES[@]}"; do
    for size in 65536 1048576; do
        for t in uct_put_zcopy uct_get_zcopy ucp_put_bw ucp_get tag_bw; do
            m=$(median "${where}_mooncake_${t}_$size")
            u=$(median "${where}_tcp_${t}_$size")
            x=$(ratio x "${where}_mooncake_${t}_$size" "${where}_tcp_${t}_$size")
            printf '%-34s %12s %12s %8s\n' "$where $t $size (vs tcp)" "$m" "$u" "$x"
            json+=",\"${where}_mooncake_${t}_$size\":$m,\"${where}_tcp_${t}_$size\":$u,\"${where}_${t}_${size}_vs_tcp\":$x"
        done
        if [[ $where == lo ]]; then
            m=$(median "lo_mooncake_tag_bw_$size")
            u=$(median "lo_cma_tag_bw_$size")
            x=$(ratio x "lo_mooncake_tag_bw_$size" "lo_cma_tag_bw_$size")
            printf '%-34s %12s %12s %8s\n' "lo tag_bw $size (vs cma)" "$m" "$u" "$x"
            json+=",\"lo_cma_tag_bw_$size\":$u,\"lo_tag_bw_${size}_vs_cma\":$x"
        fi
    done
    for size in "${EAGER_SIZES[@]}"; do
        for t in "${EAGER_TESTS[@]}"; do
            for peer in tcp posix; do
                [[ $peer == posix && $where != lo ]] && continue
                m=$(median "${where}_mooncake_${t}_$size")
                u=$(median "${where}_${peer}_${t}_$size")
                x=$(ratio x "${where}_mooncake_${t}_$size" "${where}_${peer}_${t}_$size")
                printf '%-34s %12s %12s %8s\n' "$where $t $size (vs $peer)" "$m" "$u" "$x"
                [[ $peer == tcp ]] && json+=",\"${where}_mooncake_${t}_$size\":$m"
                json+=",\"${where}_${peer}_${t}_$size\":$u,\"${where}_${t}_${size}_vs_$peer\":$x"
            done
        done
    done
done
echo "$json}"
[[ ! -e $LOG/failed ]]
