#!/usr/bin/env bash
# The file transport against fio, on the same file, in one run.
#   (a) the engine's own file <-> memory path (mooncake-bench --mode self --target_memory
#       file:FILE: a task to its own segment, io_uring straight into registered memory) next to
#       fio (ioengine=io_uring), both O_DIRECT at the same queue depth: sequential and random,
#       1 MiB and 4 KiB, reads and writes. The engine keeps QD pieces in flight
#       (MC_FILE_QUEUE_DEPTH=QD) from two threads of QD requests each; fio runs one job at
#       iodepth QD.
#   (b) a peer's file read over tcp (mooncake-bench --mode local --protocol tcp --target_memory
#       file:FILE: the owner stages 1 MiB pieces in its bounce buffers, the initiator's tasks
#       carry them), next to the engine's tcp figure between two memories of the same size and
#       the disk's (fio's sequential 1 MiB read), the three in turns in each round.
# The file is written in full first, so that reads find blocks on the device, not holes. Each
# point runs ROUNDS times, engine and fio in turns (the first of the two alternates), and the
# medians are compared: shared or virtual disks drift, and both should see the same drift.
#
# Settings (environment):
#   FILE          the file (created, SIZE bytes; default under TMPDIR); a block device works too,
#                 and is overwritten
#   SIZE          bytes of the working set (1G)
#   QD            queue depth of both (32)
#   DURATION      seconds per run (2)
#   ROUNDS        runs of each tool per point (3)
#   MC_BUILD_DIR  build directory, relative to the repo root unless absolute (build); needs
#                 bin/mooncake-bench
# Output: progress on stderr; a table and, last, one JSON line on stdout with at least
# engine_gbps, fio_gbps and ratio for sequential 1 MiB reads.
# Exit: 0; 1 on a failure (a tool missing, a run that failed or did not verify).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/.." && pwd)

SIZE=${SIZE:-1G}
QD=${QD:-32}
DURATION=${DURATION:-2}
ROUNDS=${ROUNDS:-3}
B=${MC_BUILD_DIR:-build}
[[ $B == /* ]] || B=$root/$B
BENCH=$B/bin/mooncake-bench

say() { echo "$*" >&2; }
die() {
    say "file.sh: $*"
    exit 1
}
[[ -x $BENCH ]] || die "$BENCH not built (cmake --build $B --target mooncake-bench)"
command -v fio >/dev/null || die "fio is not installed (apt-get install fio)"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/mc-file.XXXXXX")
own_file=0
if [[ -z ${FILE:-} ]]; then
    FILE=$tmp/data.bin
    own_file=1
fi
cleanup() {
    [[ $own_file -eq 0 ]] || rm -f "$FILE"
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

bytes=$(python3 -c 'import sys; s=sys.argv[1]; m={"K":1<<10,"M":1<<20,"G":1<<30}
print(int(s[:-1])*m[s[-1].upper()] if s[-1].upper() in m else int(s))' "$SIZE")

# fio_gbps RW BS: GB/s of one fio job on FILE, O_DIRECT through io_uring at depth QD.
fio_gbps() {
    fio --name=mc --filename="$FILE" --rw="$1" --bs="$2" --iodepth="$QD" --ioengine=io_uring \
        --direct=1 --size="$bytes" --runtime="$DURATION" --time_based --output-format=json \
        >"$tmp/fio.json" 2>"$tmp/fio.err" || {
        cat "$tmp/fio.err" >&2
        die "fio $1 $2 failed"
    }
    python3 -c '
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
print("%.4f" % ((j["read"]["bw_bytes"] + j["write"]["bw_bytes"]) / 1e9))' "$tmp/fio.json"
}

# bench_gbps ARGS...: GB/s of a mooncake-bench run (its JSON line), which must have verified or
# not been asked to.
bench_gbps() {
    "$BENCH" --json "$@" >"$tmp/bench.out" 2>"$tmp/bench.err" || {
        cat "$tmp/bench.err" >&2
        die "mooncake-bench $* failed"
    }
    python3 -c '
import json, sys
j = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
assert j["verify"] in ("ok", "off"), j["verify"]
print("%.4f" % j["gbps"])' "$tmp/bench.out"
}

ratio() { python3 -c 'import sys; a, b = map(float, sys.argv[1:]); print("%.3f" % (a / b if b else 0))' "$1" "$2"; }
median() { python3 -c 'import statistics, sys; print("%.4f" % statistics.median(map(float, sys.argv[1:])))' "$@"; }

# point OP ORDER BS: "engine_median fio_median" over ROUNDS alternating runs.
point() {
    local op=$1 order=$2 bs=$3 rw=$1 es=() fs=() r
    [[ $order == random ]] && rw=rand$op
    for ((r = 0; r < ROUNDS; r++)); do
        if ((r % 2)); then
            fs+=("$(fio_gbps "$rw" "$bs")")
        fi
        es+=("$(MC_FILE_QUEUE_DEPTH=$QD bench_gbps --mode self --target_memory "file:$FILE" \
            --buffer_size "$SIZE" --operation "$op" --pattern "$order" --block_size "$bs" \
            --batch_size "$QD" --threads 2 --duration "$DURATION")")
        if ((r % 2 == 0)); then
            fs+=("$(fio_gbps "$rw" "$bs")")
        fi
    done
    echo "$(median "${es[@]}") $(median "${fs[@]}")"
}

say "file.sh: $FILE, $SIZE, queue depth $QD, $ROUNDS x $DURATION s per tool and point"
say "preparing: writing the whole file once"
fio --name=fill --filename="$FILE" --rw=write --bs=1M --iodepth="$QD" --ioengine=io_uring \
    --direct=1 --size="$bytes" >/dev/null 2>"$tmp/fio.err" || {
    cat "$tmp/fio.err" >&2
    die "cannot write $FILE"
}
# One correctness pass through the engine before measuring: every byte read back.
bench_gbps --mode self --target_memory "file:$FILE" --buffer_size 64M --operation write \
    --block_size 1M --duration 1 --verify >/dev/null

points=()
printf '%-6s %-5s %-8s %12s %12s %8s\n' op order block engine_GB/s fio_GB/s ratio
for op in read write; do
    for order in seq random; do
        for bs in 1M 4K; do
            read -r e f <<<"$(point "$op" "$order" "$bs")"
            r=$(ratio "$e" "$f")
            printf '%-6s %-5s %-8s %12s %12s %8s\n' "$op" "$order" "$bs" "$e" "$f" "$r"
            points+=("{\"op\":\"$op\",\"order\":\"$order\",\"block\":\"$bs\",\"engine_gbps\":$e,\"fio_gbps\":$f,\"ratio\":$r}")
            if [[ $op == read && $order == seq && $bs == 1M ]]; then
                seq_e=$e
                seq_f=$f
                seq_r=$r
            fi
        done
    done
done

say "a peer's file over tcp"
# Its two references run in the same rounds, in turns: the disk (fio's sequential 1 MiB read)
# and the engine's tcp READ between two memories of the same size as the file range (the
# initiator's buffer is SIZE either way; on this VM kernel copies over a working set of 1 GiB
# run at a fraction of their speed over 256 MiB, raw sockets alike, so the sizes must match).
rs=()
ts=()
ds=()
remote_run() {
    rs+=("$(bench_gbps --mode local --protocol tcp --target_memory "file:$FILE" \
        --buffer_size "$SIZE" --operation read --block_size 1M --batch_size "$QD" --threads 2 \
        --duration "$DURATION")")
}
tcp_run() {
    ts+=("$(bench_gbps --mode local --protocol tcp --buffer_size "$SIZE" --operation read \
        --block_size 1M --batch_size "$QD" --threads 2 --duration "$DURATION")")
}
disk_run() { ds+=("$(fio_gbps read 1M)"); }
runs=(remote_run tcp_run disk_run)
for ((r = 0; r < ROUNDS; r++)); do
    for ((k = 0; k < 3; k++)); do
        "${runs[(r + k) % 3]}"
    done
done
remote=$(median "${rs[@]}")
tcp=$(median "${ts[@]}")
disk=$(median "${ds[@]}")
least=$(python3 -c 'import sys; print(min(map(float, sys.argv[1:])))' "$disk" "$tcp")
remote_r=$(ratio "$remote" "$least")
printf '%-20s %12s   (engine tcp memory->memory %s, disk %s: ratio to the lesser %s)\n' \
    "remote read tcp 1M" "$remote" "$tcp" "$disk" "$remote_r"

joined=$(
    IFS=,
    echo "${points[*]}"
)
echo "{\"bench\":\"file\",\"file\":\"$FILE\",\"size\":$bytes,\"qd\":$QD,\"engine_gbps\":$seq_e,\"fio_gbps\":$seq_f,\"ratio\":$seq_r,\"remote_tcp_gbps\":$remote,\"engine_tcp_gbps\":$tcp,\"disk_gbps\":$disk,\"remote_ratio\":$remote_r,\"points\":[$joined]}"
