#!/usr/bin/env bash
# P2P fan-out benchmark: one checkpoint from 1 origin to FETCHERS hosts, each host behind one
# link of RATE in both directions, in network namespaces. In ONE run it measures
#   (a) single:      one fetcher alone (what one copy costs on such a link),
#   (b) p2p:         all FETCHERS fetching at once, every fetcher a holder of the shards it has
#                    verified (mooncake-p2p fetch --serve-after: finished fetchers go on serving),
#   (c) origin-only: all FETCHERS at once with --no-p2p (everything from the origin),
# each as the time from starting the fetchers until the last one has its file complete
# (verified shard by shard by the tool, renamed into place), and every file compared byte for
# byte with the source (cmp). Target of the P2P store (issue 16): p2p <= 2x single (stretch
# 1.3x), against ~FETCHERSx for origin-only.
#
# Topology (tests/fixtures/hosts.sh, not netns.sh, whose star joins hosts to h1 only, so
# fetchers could not reach each other): a "switch" namespace PREFIX-sw with a Linux bridge, and
# one namespace per host (PREFIX-h0 the origin, PREFIX-h1.. the fetchers), each joined to the
# bridge by ONE veth pair with tc tbf at RATE on both ends: the host's end shapes its upload,
# the switch's end its download. Addresses 10.231.0.<i+1>/24 exist only inside these
# namespaces. PREFIX is p2pf<pid>; everything is removed at exit (trap), also on failure.
# Metadata: the embedded file:// store in the data directory (namespaces share the file
# system). The engine uses tcp (MC_PROTOCOL=tcp).
#
# Settings (flags or environment):
#   --size SIZE | SIZE=1G          object size, N[K|M|G] (powers of 1024)
#   --rate RATE | RATE=400mbit     tc rate of every link, each direction: N[kbit|mbit|gbit]
#   --fetchers N | FETCHERS=8
#   --shard-size S | SHARD_SIZE=16M  at most 32M (the issue asks for >= 32 shards per GiB)
#   --repeat K | REPEAT=1          run the three phases K times; figures are medians
#   --fetch-args "..." | FETCH_ARGS  extra flags for every "mooncake-p2p fetch" (e.g.
#                                  "--random", "--max-inflight 2"): to compare policies
#   --trace | TRACE=1              print each link's rate every 2 s during the p2p phase
#   --phases LIST | PHASES=single,p2p,origin  run only some phases (to explore fetch flags
#                                  quickly); the figures of the others are null
#   P2P_BENCH_DIR                  where the source and fetched files go (default: /dev/shm
#                                  when it has room, else TMPDIR): (1 + FETCHERS) x SIZE
#   MC_BUILD_DIR                   build directory, relative to the repo root unless absolute
#                                  (build); needs bin/mooncake-p2p
# Defaults take about 5 minutes on a 2-core VM (most of it the origin-only phase, ~8x a single
# fetch). RATE must be low enough that the CPUs are not the bottleneck: the table shows how
# close the single fetch came to RATE and how busy the CPUs were in each phase.
#
# Output: progress on stderr; a table, per-fetcher lines and, last, one JSON line on stdout
# with single_seconds, p2p_seconds, origin_only_seconds, all_verified (a JSON boolean), the
# ratios, rate, size, shards and fetchers.
# Exit: 0 when every fetch succeeded and verified (whether or not the target was met); 1 on a
# failure; 77 when network namespaces, veth, bridges or tbf are not available (or not root).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)
# shellcheck disable=SC1091 # bench/lib.sh: free_port, listening
source "$root/bench/lib.sh" # (free_port is not needed: every host has a namespace of its own)
source "$root/tests/fixtures/hosts.sh"

SIZE=${SIZE:-1G}
RATE=${RATE:-400mbit}
FETCHERS=${FETCHERS:-8}
SHARD_SIZE=${SHARD_SIZE:-16M}
REPEAT=${REPEAT:-1}
FETCH_ARGS=${FETCH_ARGS:-}
TRACE=${TRACE:-0}
PHASES=${PHASES:-single,p2p,origin}

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2
    exit "${1:-1}"
}
while [[ $# -gt 0 ]]; do
    case $1 in
    --size) SIZE=${2:?}; shift 2 ;;
    --rate) RATE=${2:?}; shift 2 ;;
    --fetchers) FETCHERS=${2:?}; shift 2 ;;
    --shard-size) SHARD_SIZE=${2:?}; shift 2 ;;
    --repeat) REPEAT=${2:?}; shift 2 ;;
    --fetch-args) FETCH_ARGS=${2?}; shift 2 ;;
    --trace) TRACE=1; shift ;;
    --phases) PHASES=${2:?}; shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "p2p-fanout.sh: unknown argument $1" >&2; usage 1 ;;
    esac
done

say() { echo "$*" >&2; }
die() {
    say "p2p-fanout.sh: $*"
    exit 1
}
skip() {
    say "p2p-fanout.sh: skipped: $*"
    exit 77
}

calc() { awk "BEGIN { printf($1) }"; } # calc '"FORMAT", EXPR' (awk; the parentheses keep > a comparison)
# median [-0] VALUES...: the median, with 3 decimals (-0: none)
median() {
    local f=%.3f
    if [[ ${1:-} == -0 ]]; then
        f=%.0f
        shift
    fi
    if [[ $# -eq 0 ]]; then
        echo null # a phase that did not run
        return
    fi
    printf '%s\n' "$@" | sort -g | awk -v f="$f" '{ v[NR] = $1 } END {
        printf f, NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

size_b=$(hosts_bytes "$SIZE") || die "--size $SIZE: expected N[K|M|G]"
shard_b=$(hosts_bytes "$SHARD_SIZE") || die "--shard-size $SHARD_SIZE: expected N[K|M|G]"
bps=$(hosts_rate_bps "$RATE") || die "--rate $RATE: expected N[kbit|mbit|gbit]"
[[ $FETCHERS =~ ^[0-9]+$ && $FETCHERS -ge 1 && $FETCHERS -le 200 ]] || die "--fetchers 1..200"
[[ $REPEAT =~ ^[0-9]+$ && $REPEAT -ge 1 ]] || die "--repeat: a positive number"
((size_b >= 4096)) || die "--size: at least 4K"
((shard_b >= 4096 && shard_b <= 32 << 20)) ||
    die "--shard-size: 4K..32M (the benchmark needs >= 32 shards per GiB)"
((bps >= 1000000)) || die "--rate: at least 1mbit"
[[ ,$PHASES, =~ ^(,(single|p2p|origin))+,$ ]] || die "--phases: a list of single, p2p, origin"
want() { [[ ,$PHASES, == *,$1,* ]]; }
shards=$(((size_b + shard_b - 1) / shard_b))
read -r -a fetch_extra <<<"$FETCH_ARGS"

B=${MC_BUILD_DIR:-build}
[[ $B == /* ]] || B=$root/$B
TOOL=$B/bin/mooncake-p2p
[[ -x $TOOL ]] || die "$TOOL not built (cmake --build $B --target mooncake-p2p)"
command -v cmp >/dev/null || die "cmp not found (diffutils)"

# ---- namespaces available? (77 if not) ----
[[ $(id -u) -eq 0 ]] || skip "network namespaces need root"
command -v ip >/dev/null || skip "iproute2 'ip' not found"
command -v tc >/dev/null || skip "'tc' not found"

P=p2pf$$
SW=$P-sw
NS=() # NS[i]: host i's namespace (0: the origin)
ADDR=()
for ((i = 0; i <= FETCHERS; i++)); do
    NS[i]=$P-h$i
    ADDR[i]=10.231.0.$((i + 1))
done

tmp=""
pids=()    # processes started here and not yet reaped
sampler="" # the --trace link sampler

cleanup() {
    trap - EXIT
    trap '' INT TERM # no second interruption of the cleanup (and no re-raised SIGINT loop in bash)
    [[ -z $sampler ]] || hosts_stop_pids "$sampler"
    hosts_stop_pids "${pids[@]}"
    hosts_bridge_down
    [[ -z $tmp ]] || rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if ! hosts_bridge_up "$P" "$FETCHERS" "$RATE" 10.231.0 2>"${TMPDIR:-/tmp}/$P.topo.err"; then
    err=$(head -c 300 "${TMPDIR:-/tmp}/$P.topo.err")
    rm -f "${TMPDIR:-/tmp}/$P.topo.err"
    skip "cannot build the namespace topology (namespaces, veth, bridge, tbf): $err"
fi
rm -f "${TMPDIR:-/tmp}/$P.topo.err"

# ---- data directory and source file ----
need_kb=$(((FETCHERS + 1) * (size_b / 1024) + 262144))
base=$(hosts_data_dir "${P2P_BENCH_DIR:-}" "$need_kb")
tmp=$(mktemp -d "$base/mc-p2p-fanout.XXXXXX")
avail_kb=$(df -Pk "$tmp" | awk 'NR == 2 { print $4 }')
((avail_kb > need_kb)) || die "$tmp: $((avail_kb >> 10)) MiB free, need $((need_kb >> 10)) MiB"
SRC=$tmp/source.bin

export MC_METADATA=file://$tmp/meta MC_PROTOCOL=tcp MC_LOG_LEVEL=${MC_LOG_LEVEL:-error}

say "== generating $SIZE of random data in $SRC"
if command -v openssl >/dev/null; then # an AES-CTR keystream: fast, and not compressible
    head -c "$size_b" < <(openssl enc -aes-128-ctr -nosalt -pbkdf2 -pass pass:p2p-fanout \
        -in /dev/zero 2>/dev/null) >"$SRC"
else
    head -c "$size_b" /dev/urandom >"$SRC"
fi
[[ $(stat -c %s "$SRC") -eq $size_b ]] || die "could not generate $SRC"

single_exp=$(calc "\"%.3f\", $size_b * 8 / $bps") # seconds one fetch needs at RATE
say "== $FETCHERS fetchers + 1 origin, every link $RATE both ways (tbf), object $SIZE in" \
    "$shards shards of $SHARD_SIZE; one copy at $RATE: ${single_exp} s; data in $tmp"

# ---- processes ----
# spawn HOST LIMIT_S OUT ERR args...: the tool in HOST's namespace, listening on its address.
spawn() {
    local h=$1 limit=$2 out=$3 err=$4
    shift 4
    ip netns exec "${NS[h]}" timeout -k 5 "$limit" "$TOOL" --listen "${ADDR[h]}:0" "$@" \
        </dev/null >"$out" 2>"$err" &
    SPAWNED=$!
    pids+=("$SPAWNED")
}
forget_pid() {
    local p keep=()
    for p in "${pids[@]}"; do
        [[ $p == "$1" ]] || keep+=("$p")
    done
    pids=("${keep[@]}")
}

# "busy total" jiffies of all CPUs (busy: user, nice, system, irq, softirq, steal)
cpu_ticks() { awk '/^cpu / { b = $2 + $3 + $4 + $7 + $8 + $9; print b, b + $5 + $6 }' /proc/stat; }
# bytes the switch received from host i (= host i's upload), from its /proc/net/dev
# shellcheck disable=SC2016 # awk's own $fields
link_rx() { ip netns exec "$SW" awk -v d="p$1:" '$1 == d { print $2 }' /proc/net/dev; }

# shellcheck disable=SC2016 # awk's own $fields
sample_links() { # every 0.5 s: "time rx0 tx0 rx1 tx1 ..." of the switch's ports
    local line
    while :; do
        line=$(ip netns exec "$SW" awk -v n="$FETCHERS" '$1 ~ /^p[0-9]+:$/ {
            i = substr($1, 2, length($1) - 2) + 0; rx[i] = $2; tx[i] = $10 }
            END { for (i = 0; i <= n; i++) printf " %s %s", rx[i], tx[i] }' /proc/net/dev)
        echo "$EPOCHREALTIME$line"
        sleep 0.5
    done
}
print_trace() { # FILE T0 T1: Mbit/s per 2 s window from T0 to T1: origin's upload, each fetcher's down/up
    awk -v n="$FETCHERS" -v t0="$2" -v t1="$3" '$1 >= t0 - 0.5 && $1 <= t1 + 1 {
        m++; t[m] = $1; for (j = 2; j <= NF; j++) v[m, j] = $j }
    END {
        printf "   t(s)  origin-up"; for (i = 1; i <= n; i++) printf "  h%d dn/up", i; printf "   (Mbit/s)\n"
        for (k = 5; k <= m; k += 4) {
            dt = t[k] - t[k - 4]; if (dt <= 0) continue
            printf "%7.1f  %9.0f", t[k] - t0, (v[k, 2] - v[k - 4, 2]) * 8 / dt / 1e6
            for (i = 1; i <= n; i++)
                printf "  %4.0f/%-4.0f", (v[k, 2 * i + 3] - v[k - 4, 2 * i + 3]) * 8 / dt / 1e6,
                    (v[k, 2 * i + 2] - v[k - 4, 2 * i + 2]) * 8 / dt / 1e6
            printf "\n"
        } }' "$1"
}

# Figures of the last phase (run_phase sets them).
PH_SECONDS=0 PH_OK=1 PH_FROM_ORIGIN=0 PH_FROM_REPLICAS=0 PH_ORIGIN_SENT=0 PH_CPU=0 PH_T0=0 PH_T1=0
PH_LINES=()
PH_FETCH_SECONDS=()

# run_phase LABEL COUNT MODE(p2p|origin) REP: publish a fresh object, start COUNT fetchers at
# once, wait until every file is complete, stop them, verify.
run_phase() {
    local label=$1 count=$2 mode=$3 rep=$4 name pub i t0 now deadline limit mode_args=()
    local done_t=() failed=() ndone=0 nfail=0 c0 c1 k0 k1 rx0 rx1 json o r s rc v fpids=()
    name=fanout/$label-$rep
    # Deadline: generous next to what the phase needs at RATE (origin-only: COUNT copies).
    case $mode in
    p2p) limit=$(calc "\"%d\", $single_exp * ($count > 1 ? 1.5 * $count : 3) + 60") ;;
    origin) limit=$(calc "\"%d\", $single_exp * 1.5 * $count + 60") ;;
    esac
    if [[ $mode == origin ]]; then
        mode_args=(--no-p2p)
    elif [[ $count -gt 1 ]]; then
        mode_args=(--serve-after) # a finished fetcher goes on serving the others
    fi

    spawn 0 $((limit + 120)) "$tmp/pub.$label.out" "$tmp/pub.$label.err" \
        publish "$SRC" "$name" --shard-size "$shard_b"
    pub=$SPAWNED
    for ((i = 0; i < 300; i++)); do
        grep -q '^published ' "$tmp/pub.$label.out" 2>/dev/null && break
        hosts_running "$pub" || break
        sleep 0.1
    done
    grep -q '^published ' "$tmp/pub.$label.out" 2>/dev/null ||
        die "the publisher did not start: $(cat "$tmp/pub.$label.err")"

    rx0=$(link_rx 0)
    read -r c0 k0 < <(cpu_ticks)
    t0=$EPOCHREALTIME
    for ((i = 1; i <= count; i++)); do
        rm -f "$tmp/out.$i"
        spawn "$i" "$limit" "$tmp/f.$i.json" "$tmp/f.$i.err" fetch "$name" "$tmp/out.$i" --json \
            "${mode_args[@]}" "${fetch_extra[@]}"
        fpids[i]=$SPAWNED
        done_t[i]=""
    done
    deadline=$(calc "\"%.1f\", $t0 + $limit + 10")
    while ((ndone + nfail < count)); do
        now=$EPOCHREALTIME
        for ((i = 1; i <= count; i++)); do
            [[ -z ${done_t[i]} && -z ${failed[i]:-} ]] || continue
            if [[ -e $tmp/out.$i ]]; then
                done_t[i]=$(calc "\"%.3f\", $now - $t0")
                ndone=$((ndone + 1))
            elif ! hosts_running "${fpids[i]}"; then
                failed[i]=1
                nfail=$((nfail + 1))
            fi
        done
        if awk -v a="$now" -v b="$deadline" 'BEGIN { exit !(a > b) }'; then
            break
        fi
        sleep 0.1
    done
    PH_T0=$t0 PH_T1=$EPOCHREALTIME
    read -r c1 k1 < <(cpu_ticks)
    PH_CPU=$(calc "\"%.0f\", $k1 > $k0 ? 100 * ($c1 - $c0) / ($k1 - $k0) : 0")
    rx1=$(link_rx 0)

    # Stop the fetchers (--serve-after ones serve until told), then the origin.
    PH_OK=1
    for ((i = 1; i <= count; i++)); do
        if hosts_running "${fpids[i]}"; then
            kill -TERM "${fpids[i]}" 2>/dev/null || true
        fi
    done
    for ((i = 1; i <= count; i++)); do
        rc=0
        wait "${fpids[i]}" || rc=$?
        forget_pid "${fpids[i]}"
        if [[ $rc -ne 0 || -z ${done_t[i]} ]]; then
            PH_OK=0
            say "  fetcher $i: exit $rc$([[ -n ${done_t[i]} ]] || echo ", no complete file"):" \
                "$(grep -v '%' "$tmp/f.$i.err" | tail -n 3)"
        fi
    done
    hosts_stop_pids "$pub"
    forget_pid "$pub"

    PH_SECONDS=0 PH_FROM_ORIGIN=0 PH_FROM_REPLICAS=0 PH_LINES=() PH_FETCH_SECONDS=()
    for ((i = 1; i <= count; i++)); do
        json=$(grep '^{' "$tmp/f.$i.json" | tail -n 1 || true)
        o=$(sed -n 's/.*"from_origin":\([0-9]*\).*/\1/p' <<<"$json")
        r=$(sed -n 's/.*"from_replicas":\([0-9]*\).*/\1/p' <<<"$json")
        s=$(sed -n 's/.*"seconds":\([0-9.]*\).*/\1/p' <<<"$json")
        o=${o:-0} r=${r:-0} s=${s:-0}
        PH_FROM_ORIGIN=$((PH_FROM_ORIGIN + o))
        PH_FROM_REPLICAS=$((PH_FROM_REPLICAS + r))
        PH_FETCH_SECONDS+=("$s")
        v=FAILED
        if [[ -n ${done_t[i]} ]]; then
            if cmp -s "$SRC" "$tmp/out.$i"; then
                v="verified"
            else
                v="MISMATCH"
                PH_OK=0
            fi
            PH_SECONDS=$(awk -v a="$PH_SECONDS" -v b="${done_t[i]}" 'BEGIN { print (b > a ? b : a) }')
        fi
        PH_LINES+=("$(printf '  run %-2s %-7s h%-3s done at %8s s (fetch %7.2f s): from origin %6.1f MiB (%3.0f%%), from replicas %6.1f MiB; %s' \
            "$rep" "$label" "$i" "${done_t[i]:--}" "$s" "$(calc "\"%.1f\", $o / 1048576")" \
            "$(calc "\"%.0f\", ($o + $r) ? 100 * $o / ($o + $r) : 0")" \
            "$(calc "\"%.1f\", $r / 1048576")" "$v")")
        rm -f "$tmp/out.$i" "$tmp/out.$i.p2p-part"
    done
    PH_ORIGIN_SENT=$((rx1 - rx0))
    rm -rf "$tmp/meta"
}

declare -A secs                         # secs[phase,rep]
all_ok=1
single_fetch_s=()                       # the single fetch's own transfer time (its JSON)
p2p_from_origin=() origin_sent_p2p=() cpu_single=() cpu_p2p=() cpu_origin=()
lines=()
for ((rep = 1; rep <= REPEAT; rep++)); do
    if want single; then
        say "== run $rep/$REPEAT: (a) one fetcher alone"
        run_phase single 1 p2p "$rep"
        secs[single, $rep]=$PH_SECONDS
        [[ $PH_OK -eq 1 ]] || all_ok=0
        single_fetch_s+=("${PH_FETCH_SECONDS[0]}")
        cpu_single+=("$PH_CPU")
        lines+=("${PH_LINES[@]}")
        say "   ${PH_SECONDS} s"
    fi

    if want p2p; then
        say "== run $rep/$REPEAT: (b) $FETCHERS fetchers at once, P2P"
        if [[ $TRACE == 1 ]]; then
            sample_links >"$tmp/trace.$rep" &
            sampler=$!
        fi
        run_phase p2p "$FETCHERS" p2p "$rep"
        if [[ -n $sampler ]]; then
            hosts_stop_pids "$sampler"
            sampler=""
        fi
        secs[p2p, $rep]=$PH_SECONDS
        [[ $PH_OK -eq 1 ]] || all_ok=0
        p2p_from_origin+=("$PH_FROM_ORIGIN")
        origin_sent_p2p+=("$PH_ORIGIN_SENT")
        cpu_p2p+=("$PH_CPU")
        lines+=("${PH_LINES[@]}")
        say "   ${PH_SECONDS} s; the origin sent $(calc "\"%.2f\", $PH_ORIGIN_SENT / $size_b")x the object"
        if [[ $TRACE == 1 ]]; then
            say "   link rates during the p2p phase (run $rep):"
            print_trace "$tmp/trace.$rep" "$PH_T0" "$PH_T1" >&2
        fi
    fi

    if want origin; then
        say "== run $rep/$REPEAT: (c) $FETCHERS fetchers at once, origin only (--no-p2p)"
        run_phase origin "$FETCHERS" origin "$rep"
        secs[origin, $rep]=$PH_SECONDS
        [[ $PH_OK -eq 1 ]] || all_ok=0
        cpu_origin+=("$PH_CPU")
        lines+=("${PH_LINES[@]}")
        say "   ${PH_SECONDS} s"
    fi
done

# ---- report ----
col() { # col PHASE -> the per-run seconds (nothing if the phase did not run)
    local r out=()
    want "$1" || return 0
    for ((r = 1; r <= REPEAT; r++)); do out+=("${secs[$1, $r]}"); done
    echo "${out[@]}"
}
read -r -a s_single <<<"$(col single)"
read -r -a s_p2p <<<"$(col p2p)"
read -r -a s_origin <<<"$(col origin)"
m_single=$(median "${s_single[@]}")
m_p2p=$(median "${s_p2p[@]}")
m_origin=$(median "${s_origin[@]}")
m_single_fetch=$(median "${single_fetch_s[@]}")
m_from_origin=$(median -0 "${p2p_from_origin[@]}")
m_origin_sent=$(median -0 "${origin_sent_p2p[@]}")
ratio() { # A / B, null if either is
    if [[ $1 == null || $2 == null ]]; then echo null; else calc "\"%.2f\", $2 > 0 ? $1 / $2 : 0"; fi
}
r_p2p=$(ratio "$m_p2p" "$m_single")
r_origin=$(ratio "$m_origin" "$m_single")
util=null
[[ $m_single_fetch == null ]] ||
    util=$(calc "\"%.2f\", $m_single_fetch > 0 ? $size_b * 8 / $m_single_fetch / $bps : 0")
meets=null
stretch=null
if [[ $r_p2p != null ]]; then
    meets=$(awk -v r="$r_p2p" 'BEGIN { print (r > 0 && r <= 2.0) ? "true" : "false" }')
    stretch=$(awk -v r="$r_p2p" 'BEGIN { print (r > 0 && r <= 1.3) ? "true" : "false" }')
fi
of_size() { # X / size, or null
    if [[ $1 == null ]]; then echo null; else calc "\"%.2f\", $1 / $size_b"; fi
}
verified=$([[ $all_ok -eq 1 ]] && echo true || echo false)
join() { local IFS=,; echo "$*"; }

per_gib=$(calc "\"%.0f\", $shards * 1073741824 / $size_b")
c_single=$(median -0 "${cpu_single[@]}")
c_p2p=$(median -0 "${cpu_p2p[@]}")
c_origin=$(median -0 "${cpu_origin[@]}")
row() { # LABEL SECONDS RATIO IDEAL CPU
    local cpu=$5
    [[ ! $cpu =~ ^[0-9]+$ ]] || cpu=$cpu%
    printf '%-34s %10s %10s %10s %9s\n' "$1" "${2/null/-}" "${3/null/-}" "$4" "${cpu/null/-}"
}
echo
echo "P2P fan-out: $(calc "\"%.2f\", $size_b / 1073741824") GiB object, $shards shards of" \
    "$(calc "\"%g\", $shard_b / 1048576") MiB ($per_gib per GiB), 1 origin + $FETCHERS fetchers," \
    "every link $RATE both ways (tbf); fetch flags: ${FETCH_ARGS:-(defaults)};" \
    "$REPEAT run(s), medians"
row "phase" "seconds" "vs single" "ideal" "cpu busy"
row "(a) 1 fetcher alone" "$m_single" "$([[ $m_single == null ]] && echo null || echo 1.00)" \
    "$single_exp" "$c_single"
row "(b) $FETCHERS fetchers, P2P" "$m_p2p" "$r_p2p" "$single_exp" "$c_p2p"
row "(c) $FETCHERS fetchers, origin only" "$m_origin" "$r_origin" \
    "$(calc "\"%.3f\", $single_exp * $FETCHERS")" "$c_origin"
echo "seconds: from starting the fetchers to the last complete file (process start and the final"
echo "write-back included); ideal: the object's bytes at RATE through the busiest link, nothing"
echo "else; cpu busy: the whole machine (2 cores here; other work on it counts too)."
if [[ $util != null ]]; then
    echo "single fetch: its transfer took $m_single_fetch s = $(calc "\"%.0f\", $util * 100")% of RATE" \
        "$(awk -v u="$util" 'BEGIN { if (u < 0.8) print "(WARNING: below 80%: the CPUs or the setup, not the link, limit it; lower --rate)" }')"
fi
if [[ $m_p2p != null ]]; then
    echo "p2p: the origin's link carried $(of_size "$m_origin_sent")x the object (the fetchers" \
        "counted $(of_size "$m_from_origin")x from the origin; 1x is the least possible)"
fi
if [[ $r_p2p != null ]]; then
    echo "target: p2p <= 2x single (stretch 1.3x): $([[ $meets == true ]] && echo met || echo MISSED)" \
        "(${r_p2p}x); origin only: ${r_origin/null/-}x (~${FETCHERS}x expected)"
fi
echo "per fetcher:"
printf '%s\n' "${lines[@]}"
echo "all files verified against the source (cmp): $verified"
printf '{"bench":"p2p-fanout","size_bytes":%s,"rate":"%s","rate_bps":%s,"shard_size":%s,"shards":%s,"shards_per_gib":%s,"fetchers":%s,"repeat":%s,"phases":"%s","fetch_args":"%s","single_seconds":%s,"p2p_seconds":%s,"origin_only_seconds":%s,"p2p_ratio":%s,"origin_only_ratio":%s,"target_ratio":2.0,"stretch_ratio":1.3,"p2p_meets_target":%s,"p2p_meets_stretch":%s,"single_fetch_seconds":%s,"single_link_utilization":%s,"p2p_origin_link_bytes":%s,"p2p_from_origin_bytes":%s,"single_runs":[%s],"p2p_runs":[%s],"origin_only_runs":[%s],"cpu_busy_pct":{"single":%s,"p2p":%s,"origin_only":%s},"all_verified":%s}\n' \
    "$size_b" "$RATE" "$bps" "$shard_b" "$shards" "$per_gib" "$FETCHERS" "$REPEAT" "$PHASES" \
    "${FETCH_ARGS//\"/}" "$m_single" "$m_p2p" "$m_origin" "$r_p2p" "$r_origin" "$meets" "$stretch" \
    "$m_single_fetch" "$util" "$m_origin_sent" "$m_from_origin" \
    "$(join "${s_single[@]}")" "$(join "${s_p2p[@]}")" "$(join "${s_origin[@]}")" \
    "$c_single" "$c_p2p" "$c_origin" "$verified"
[[ $all_ok -eq 1 ]] || exit 1
