#!/usr/bin/env bash
# Distribute a generated checkpoint from one publisher to N fetchers with mooncake-p2p, verify
# every copy against the original, and print each fetcher's time and source mix.
#
#   run.sh [--netns] [--etcd] [--rate RATE] [--shard-size S] [N] [SIZE]
#
#   N              fetchers (default 4)
#   SIZE           checkpoint size, N[K|M|G] in powers of 1024 (default 1G; at least 1M). The
#                  defaults finish in about 20 s on a 2-core VM; "run.sh 4 4G" is the multi-GiB
#                  case (needs 5 x SIZE of space, see P2P_DATA_DIR).
#   --netns        every process on a "host" of its own: a network namespace joined to a bridge
#                  (a "switch" namespace) by one veth link, shaped with tc tbf to RATE in both
#                  directions; needs root (exit 77 where namespaces cannot be made). Without it,
#                  every process runs on 127.0.0.1 (the engine then moves bytes between the
#                  processes through shared memory, not tcp).
#   --rate RATE    the link rate with --netns, tc syntax N[kbit|mbit|gbit] (default 1gbit)
#   --etcd         metadata in a throwaway etcd (tests/fixtures/etcd.sh on loopback; with
#                  --netns an etcd in the switch namespace) instead of the embedded file://
#                  store in the run's temporary directory; exit 77 if etcd is not installed
#   --shard-size S default SIZE/64 (at least 1M, at most 64M)
#
# Environment: MC_BUILD_DIR (build directory, relative to the repository root unless absolute;
# default build; needs bin/mooncake-p2p), P2P_DATA_DIR (where the checkpoint and the copies
# go; default /dev/shm when it has room, else TMPDIR), FETCH_ARGS (extra flags for every
# "mooncake-p2p fetch", e.g. "--random --max-inflight 4"), P2P_RUN_TIMEOUT (seconds the
# fetchers may take; default from N, SIZE and RATE).
#
# The checkpoint is a safetensors-style file: an 8-byte header length, a JSON header naming
# BF16 tensors, then their bytes (random: an AES-CTR keystream, or /dev/urandom).
# Every process started here, the temporary files and the namespaces are removed at exit.
# Exit: 0 when every fetcher succeeded and its copy is identical to the original; 1 otherwise;
# 77 as said above.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$root/tests/fixtures/hosts.sh"

netns=0
use_etcd=0
RATE=1gbit
SHARD=""
pos=()
while [[ $# -gt 0 ]]; do
    case $1 in
    --netns) netns=1; shift ;;
    --etcd) use_etcd=1; shift ;;
    --rate) RATE=${2:?--rate needs a value}; shift 2 ;;
    --shard-size) SHARD=${2:?--shard-size needs a value}; shift 2 ;;
    -h | --help)
        sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
        exit 0
        ;;
    -*) echo "run.sh: unknown option $1 (see --help)" >&2; exit 1 ;;
    *) pos+=("$1"); shift ;;
    esac
done
[[ ${#pos[@]} -le 2 ]] || { echo "run.sh: at most two arguments: N SIZE" >&2; exit 1; }
N=${pos[0]:-4}
SIZE=${pos[1]:-1G}

say() { echo "run.sh: $*"; }
die() {
    echo "run.sh: $*" >&2
    exit 1
}
skip() {
    echo "run.sh: skipped: $*" >&2
    exit 77
}
calc() { awk "BEGIN { printf($1) }"; } # calc '"FORMAT", EXPR'
mib() { calc "\"%.1f MiB\", $1 / 1048576"; }
gib() { # GiB from 1 GiB up, MiB below
    if (($1 >= 1 << 30)); then calc "\"%.2f GiB\", $1 / 1073741824"; else mib "$1"; fi
}

[[ $N =~ ^[0-9]+$ && $N -ge 1 && $N -le 200 ]] || die "N: 1..200 fetchers"
size_b=$(hosts_bytes "$SIZE") || die "SIZE $SIZE: expected N[K|M|G]"
((size_b >= 1 << 20)) || die "SIZE: at least 1M"
bps=$(hosts_rate_bps "$RATE") || die "--rate $RATE: expected N[kbit|mbit|gbit]"
((bps >= 1000000)) || die "--rate: at least 1mbit"
if [[ -n $SHARD ]]; then
    shard_b=$(hosts_bytes "$SHARD") || die "--shard-size $SHARD: expected N[K|M|G]"
else
    shard_b=$((size_b / 64 >> 20 << 20))
    ((shard_b >= 1 << 20)) || shard_b=$((1 << 20))
    ((shard_b <= 64 << 20)) || shard_b=$((64 << 20))
fi
read -r -a fetch_extra <<<"${FETCH_ARGS:-}"

B=${MC_BUILD_DIR:-build}
[[ $B == /* ]] || B=$root/$B
TOOL=$B/bin/mooncake-p2p
[[ -x $TOOL ]] || die "$TOOL not found; build it first: cmake --build $B --target mooncake-p2p"
command -v cmp >/dev/null || die "cmp not found (diffutils)"
if [[ $use_etcd -eq 1 ]]; then
    command -v etcd >/dev/null || skip "--etcd: etcd is not installed"
    command -v curl >/dev/null || skip "--etcd: curl is not installed"
fi

# How long the fetchers may take: far more than they need (origin-only pace, doubled).
if [[ -n ${P2P_RUN_TIMEOUT:-} ]]; then
    limit=$P2P_RUN_TIMEOUT
elif [[ $netns -eq 1 ]]; then
    limit=$(calc "\"%d\", 60 + 2 * $N * $size_b * 8 / $bps")
else
    limit=$(calc "\"%d\", 60 + $N * $size_b / 50000000")
fi

tmp=""
pids=()     # every process started here and not yet reaped
etcd_dir="" # the loopback etcd fixture's directory, once started

# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
    trap - EXIT
    trap '' INT TERM # no second interruption of the cleanup (and no re-raised SIGINT loop in bash)
    hosts_stop_pids "${pids[@]}"
    [[ -z $etcd_dir ]] || etcd_stop "$etcd_dir" >/dev/null 2>&1 || true
    hosts_bridge_down
    [[ -z $tmp ]] || rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- where the files go ----
need_kb=$(((N + 1) * (size_b >> 10) + 65536))
# tmpfs when it has room: the copies are written through a shared mapping and synced at the
# end, which on a slow disk would take longer than the transfer itself.
tmp=$(mktemp -d "$(hosts_data_dir "${P2P_DATA_DIR:-}" "$need_kb")/mc-p2p-ckpt.XXXXXX")
avail_kb=$(df -Pk "$tmp" | awk 'NR == 2 { print $4 }')
((avail_kb > need_kb)) || die "$tmp: $((avail_kb >> 10)) MiB free, $((need_kb >> 10)) MiB needed"

# ---- hosts ----
# host 0 is the publisher, 1..N the fetchers. HOST_NS[i] empty: the root namespace.
HOST_NS=()
HOST_ADDR=()
for ((i = 0; i <= N; i++)); do
    HOST_NS[i]=""
    HOST_ADDR[i]=127.0.0.1
done
SW=""
SW_ADDR=10.232.0.254
if [[ $netns -eq 1 ]]; then
    [[ $(id -u) -eq 0 ]] || skip "--netns needs root"
    command -v ip >/dev/null || skip "--netns: iproute2 'ip' not found"
    command -v tc >/dev/null || skip "--netns: 'tc' not found"
    P=p2pck$$
    SW=$P-sw
    for ((i = 0; i <= N; i++)); do
        HOST_NS[i]=$P-h$i
        HOST_ADDR[i]=10.232.0.$((i + 1))
    done
    # A switch (bridge) and one link per host, so that every fetcher reaches every other one
    # and the publisher; each link shaped at both ends: upload at the host, download at the
    # switch. Addresses exist only inside these namespaces.
    if ! hosts_bridge_up "$P" "$N" "$RATE" 10.232.0 "$SW_ADDR" 2>"$tmp/topology.err"; then
        skip "cannot build the namespaces, veth links, bridge or tbf: $(head -c 300 "$tmp/topology.err")"
    fi
    say "$((N + 1)) hosts in network namespaces $P-h0..$P-h$N on a bridge ($SW), every link" \
        "$RATE both ways (tc tbf)"
fi

# launch HOST OUT ERR cmd...: cmd in the background in host HOST's namespace (or here on
# loopback), its PID in LAUNCHED and in pids. The & is on the command itself, not on a function
# call: the PID is then the command's (ip netns exec execs it), not a subshell's.
launch() {
    local h=$1 out=$2 err=$3
    shift 3
    if [[ -n ${HOST_NS[h]} ]]; then
        ip netns exec "${HOST_NS[h]}" "$@" </dev/null >"$out" 2>"$err" &
    else
        "$@" </dev/null >"$out" 2>"$err" &
    fi
    LAUNCHED=$!
    pids+=("$LAUNCHED")
}

# ---- metadata ----
if [[ $use_etcd -eq 0 ]]; then
    export MC_METADATA=file://$tmp/meta
    meta_desc="the embedded file:// store in $tmp/meta"
elif [[ $netns -eq 0 ]]; then
    # shellcheck disable=SC1091 # tests/fixtures/etcd.sh: etcd_start, etcd_stop
    source "$root/tests/fixtures/etcd.sh"
    etcd_dir=$tmp/etcd
    etcd_start "$etcd_dir" >/dev/null || die "could not start etcd (log: $etcd_dir/etcd.log)"
    export MC_METADATA=etcd://$ETCD_ENDPOINT
    meta_desc="etcd at $ETCD_ENDPOINT (tests/fixtures/etcd.sh)"
else
    # The fixture's etcd listens on the root namespace's loopback, which no namespace reaches:
    # this one listens on the switch's address (every port of a new namespace is free).
    mkdir -p "$tmp/etcd"
    url=http://$SW_ADDR:2379
    ip netns exec "$SW" etcd --name p2pck --data-dir "$tmp/etcd/data" \
        --listen-client-urls "$url" --advertise-client-urls "$url" \
        --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
        --initial-cluster p2pck=http://127.0.0.1:2380 --initial-cluster-state new \
        --logger zap --log-outputs "$tmp/etcd/etcd.log" </dev/null >"$tmp/etcd/etcd.out" 2>&1 &
    etcd_pid=$!
    pids+=("$etcd_pid")
    for ((i = 0; i < 100; i++)); do
        hosts_running "$etcd_pid" || break
        ip netns exec "$SW" curl -s -m 1 "$url/health" 2>/dev/null | grep -q '"health":"true"' && break
        sleep 0.1
    done
    ip netns exec "$SW" curl -s -m 1 "$url/health" 2>/dev/null | grep -q '"health":"true"' ||
        die "etcd in $SW did not become healthy: $(tail -n 5 "$tmp/etcd/etcd.log" 2>/dev/null)"
    export MC_METADATA=etcd://$SW_ADDR:2379
    meta_desc="etcd at $SW_ADDR:2379 (in namespace $SW)"
fi
export MC_LOG_LEVEL=${MC_LOG_LEVEL:-error}
say "metadata: $meta_desc"

# ---- the checkpoint ----
CKPT=$tmp/checkpoint.safetensors
# le64 N: N as 8 bytes, little-endian
le64() {
    local i esc=""
    for ((i = 0; i < 8; i++)); do
        esc+=$(printf '\\x%02x' $((($1 >> (8 * i)) & 255)))
    done
    # shellcheck disable=SC2059 # the format is the escapes just built
    printf "$esc"
}
# make_checkpoint FILE SIZE: exactly SIZE bytes: header length, JSON header (padded with
# spaces, as safetensors allows), BF16 tensors of 4096 columns, 64 MiB at most each.
make_checkpoint() {
    local file=$1 size=$2 row=8192 per max_t hmin data hlen json off=0 rows i=0 n
    per=$((size / 16 / row * row))
    ((per >= row)) || per=$row
    ((per <= 64 << 20)) || per=$((64 << 20))
    max_t=$((size / per + 2))
    hmin=$((256 + 128 * max_t))
    data=$(((size - 8 - hmin) / row * row))
    hlen=$((size - 8 - data))
    json='{"__metadata__":{"format":"pt","generator":"mooncake-c examples/p2p_checkpoint"}'
    while ((off < data)); do
        n=$((data - off < per ? data - off : per))
        rows=$((n / row))
        json+=",\"model.layers.$i.weight\":{\"dtype\":\"BF16\",\"shape\":[$rows,4096],"
        json+="\"data_offsets\":[$off,$((off + n))]}"
        off=$((off + n))
        i=$((i + 1))
    done
    json+='}'
    ((${#json} <= hlen)) || die "checkpoint header too long (${#json} > $hlen)"
    {
        le64 "$hlen"
        printf '%-*s' "$hlen" "$json"
        if command -v openssl >/dev/null; then
            head -c "$data" < <(openssl enc -aes-128-ctr -nosalt -pbkdf2 \
                -pass "pass:p2p-checkpoint-$$" -in /dev/zero 2>/dev/null)
        else
            head -c "$data" /dev/urandom
        fi
    } >"$file"
    TENSORS=$i
}
t0=$EPOCHREALTIME
make_checkpoint "$CKPT" "$size_b"
[[ $(stat -c %s "$CKPT") -eq $size_b ]] || die "could not write $CKPT"
say "checkpoint: $CKPT, $(gib "$size_b") ($TENSORS BF16 tensors, safetensors layout)," \
    "made in $(calc "\"%.1f\", $EPOCHREALTIME - $t0") s"

# ---- publisher ----
NAME=checkpoints/example-$$
launch 0 "$tmp/publisher.out" "$tmp/publisher.err" timeout -k 5 $((limit + 120)) "$TOOL" \
    --listen "${HOST_ADDR[0]}:0" publish "$CKPT" "$NAME" --shard-size "$shard_b"
pub=$LAUNCHED
for ((i = 0; i < 300; i++)); do
    grep -q '^published ' "$tmp/publisher.out" 2>/dev/null && break
    hosts_running "$pub" || break
    sleep 0.1
done
grep -q '^published ' "$tmp/publisher.out" 2>/dev/null ||
    die "the publisher did not start: $(cat "$tmp/publisher.err")"
say "publisher$([[ -z ${HOST_NS[0]} ]] || echo " in ${HOST_NS[0]}"): $(head -n 1 "$tmp/publisher.out")"

# ---- fetchers ----
# All start at once; each serves the shards it has verified while it fetches, and with
# --serve-after goes on serving once complete, until every fetcher is done.
say "starting $N fetchers at once: mooncake-p2p fetch --serve-after --json${FETCH_ARGS:+ $FETCH_ARGS}"
fpid=()
done_t=()
failed=()
start=$EPOCHREALTIME
for ((i = 1; i <= N; i++)); do
    launch "$i" "$tmp/fetch.$i.json" "$tmp/fetch.$i.err" timeout -k 5 $((limit + 30)) "$TOOL" \
        --listen "${HOST_ADDR[i]}:0" fetch "$NAME" "$tmp/copy.$i" --json --serve-after \
        "${fetch_extra[@]}"
    fpid[i]=$LAUNCHED
    done_t[i]=""
    failed[i]=""
done
ndone=0
nfail=0
deadline=$(calc "\"%.3f\", $start + $limit")
while ((ndone + nfail < N)); do
    now=$EPOCHREALTIME
    for ((i = 1; i <= N; i++)); do
        [[ -z ${done_t[i]} && -z ${failed[i]} ]] || continue
        if [[ -e $tmp/copy.$i ]]; then # renamed into place once complete and synced
            done_t[i]=$(calc "\"%.2f\", $now - $start")
            ndone=$((ndone + 1))
        elif ! hosts_running "${fpid[i]}"; then
            failed[i]=1
            nfail=$((nfail + 1))
        fi
    done
    if awk -v a="$now" -v b="$deadline" 'BEGIN { exit !(a > b) }'; then
        say "the fetchers did not finish within ${limit} s (P2P_RUN_TIMEOUT)"
        break
    fi
    sleep 0.1
done

# Everyone is done (or given up on): stop the fetchers, then the publisher.
hosts_stop_pids "${fpid[@]}" "$pub"
pids=()
[[ -z ${etcd_pid:-} ]] || pids=("$etcd_pid")

# ---- results ----
ok=1
tot_origin=0
tot_replicas=0
slowest=0
echo
for ((i = 1; i <= N; i++)); do
    json=$(grep '^{' "$tmp/fetch.$i.json" 2>/dev/null | tail -n 1 || true)
    o=$(sed -n 's/.*"from_origin":\([0-9]*\).*/\1/p' <<<"$json")
    r=$(sed -n 's/.*"from_replicas":\([0-9]*\).*/\1/p' <<<"$json")
    s=$(sed -n 's/.*"seconds":\([0-9.]*\).*/\1/p' <<<"$json")
    retries=$(sed -n 's/.*"retries":\([0-9]*\).*/\1/p' <<<"$json")
    corrupt=$(sed -n 's/.*"corrupt":\([0-9]*\).*/\1/p' <<<"$json")
    o=${o:-0} r=${r:-0} s=${s:-0}
    where=${HOST_NS[i]:-127.0.0.1}
    [[ -z ${HOST_NS[i]} ]] || where="${HOST_NS[i]} ${HOST_ADDR[i]}"
    if [[ -z ${done_t[i]} ]]; then
        ok=0
        echo "fetcher $i ($where): FAILED: $(grep -v '%' "$tmp/fetch.$i.err" | tail -n 2 | tr '\n' ' ')"
        continue
    fi
    if cmp -s "$CKPT" "$tmp/copy.$i"; then
        verdict="identical to the original (cmp)"
    else
        verdict="DIFFERS from the original (cmp)"
        ok=0
    fi
    tot_origin=$((tot_origin + o))
    tot_replicas=$((tot_replicas + r))
    slowest=$(calc "\"%s\", ${done_t[i]} > $slowest ? ${done_t[i]} : $slowest")
    echo "fetcher $i ($where): $(gib "$size_b") in ${done_t[i]} s (transfer $(calc "\"%.2f\", $s") s," \
        "$(calc "\"%.0f\", $s > 0 ? $size_b / $s / 1048576 : 0") MiB/s);" \
        "from the origin $(mib "$o") ($(calc "\"%.0f\", $o + $r > 0 ? 100 * $o / ($o + $r) : 0")%)," \
        "from replicas $(mib "$r") ($(calc "\"%.0f\", $o + $r > 0 ? 100 * $r / ($o + $r) : 0")%);" \
        "retries ${retries:-?}, corrupt ${corrupt:-?}; $verdict"
    rm -f "$tmp/copy.$i"
done
echo
if [[ $ok -eq 1 ]]; then
    say "all $N copies verified; the last one complete after $slowest s." \
        "The origin sent $(gib "$tot_origin") ($(calc "\"%.2f\", $tot_origin / $size_b")x the checkpoint)," \
        "the fetchers each other $(gib "$tot_replicas")" \
        "($(calc "\"%.0f\", $tot_origin + $tot_replicas > 0 ? 100 * $tot_replicas / ($tot_origin + $tot_replicas) : 0")% of all bytes)"
    say OK
    exit 0
fi
say "FAILED (publisher log: $(tail -n 2 "$tmp/publisher.err" | tr '\n' ' '))"
exit 1
