#!/usr/bin/env bash
# How the rdma transport is chosen and configured, seen through mooncake-bench on the software
# RDMA device (two processes on this host, every run verified):
#  1. MC_NIC_PRIORITY_MATRIX preferring softverbs1 for cpu:0: only softverbs1->softverbs1 carries.
#  2. one InfiniBand and one Ethernet device: no rail pairs the two link layers.
#  3. RoCE with MC_GID_INDEX=1 (the IPv4 GID) and MC_MTU=1024: verified over rdma.
#  4. MC_IB_PORT=2 (no such port) or MC_GID_INDEX=9 (no such GID): no device is used, and
#     --protocol rdma fails saying no byte went over rdma.
#  5. MC_FORCE_TCP=1 wins over rdma; auto picks shm for a target on this host.
#  6. MC_PROTOCOL=bogus is refused, naming the variable.
#  7. MC_RDMA_MAX_QPS=1: one QP, so one rail carries everything, verified.
set -euo pipefail
B=${MC_BUILD_DIR:-build}
BENCH=$B/bin/mooncake-bench
SV=$B/lib/softverbs
[[ -x $BENCH ]] || { echo "missing $BENCH"; exit 1; }
[[ -e $SV/libibverbs.so.1 ]] || { echo "no software RDMA device built: skipped"; exit 77; }
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
export LD_LIBRARY_PATH=$SV SOFTVERBS_DEVICES=2 SOFTVERBS_FABRIC=select-$$
export SOFTVERBS_CTL_DIR=$TMP/ctl
fails=0

# bench OUT [env...] -- [bench args...]: a short verified local run; its JSON summary in OUT.
bench() {
    local out=$1
    shift
    local envs=()
    while [[ $1 != -- ]]; do envs+=("$1"); shift; done
    shift
    env "${envs[@]}" timeout 120 "$BENCH" --mode local --block_size 65536 --duration 1 \
        --buffer_size 16777216 --verify --json "$@" >"$out" 2>"$out.err"
}

# field FILE EXPR: evaluate a Python expression on the last JSON line (j), rails by name (r).
field() {
    python3 - "$1" "$2" <<'EOF'
import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
r = {x["name"]: x for x in j.get("rails", [])}
print(eval(sys.argv[2]))
EOF
}

expect() { # NAME VALUE WANTED
    if [[ $2 == "$3" ]]; then echo "ok   $1"; else echo "FAIL $1: got '$2', wanted '$3'"; fails=$((fails + 1)); fi
}

# 1. the matrix
bench "$TMP/m" MC_NIC_PRIORITY_MATRIX='{"cpu:0":[["softverbs1"],["softverbs0"]]}' -- --protocol rdma
expect "matrix: protocol" "$(field "$TMP/m" 'j["protocol"]')" rdma
expect "matrix: verified" "$(field "$TMP/m" 'j["verify"]')" ok
expect "matrix: softverbs1->softverbs1 carries" \
    "$(field "$TMP/m" 'r["softverbs1->softverbs1"]["bytes"] >= j["bytes"]')" True
expect "matrix: no other rail carries" \
    "$(field "$TMP/m" 'sum(x["bytes"] for n, x in r.items() if n != "softverbs1->softverbs1")')" 0

# 2. link layers: one IB, one Ethernet device
printf 'device softverbs0 link=ib\ndevice softverbs1 link=eth\n' >"$TMP/sv.conf"
bench "$TMP/l" SOFTVERBS_CONFIG="$TMP/sv.conf" -- --protocol rdma
expect "links: verified over rdma" "$(field "$TMP/l" 'j["protocol"] + " " + j["verify"]')" "rdma ok"
expect "links: rdma rails" "$(field "$TMP/l" 'sorted(n for n in r if "->softverbs" in n)')" \
    "['softverbs0->softverbs0', 'softverbs1->softverbs1']"

# 3. RoCE, GID index and MTU
bench "$TMP/r" SOFTVERBS_LINK=eth MC_GID_INDEX=1 MC_MTU=1024 MC_LOG_LEVEL=info -- --protocol rdma
expect "roce: verified over rdma" "$(field "$TMP/r" 'j["protocol"] + " " + j["verify"]')" "rdma ok"
expect "roce: gid index 1, mtu 1024 in use" \
    "$(grep -c 'RoCE lid 0 gid\[1\] mtu 1024' "$TMP/r.err" | awk '{print ($1 > 0)}')" 1

# 4. no usable device
for bad in MC_IB_PORT=2 MC_GID_INDEX=9; do
    rc=0
    bench "$TMP/n" "$bad" -- --protocol rdma || rc=$?
    expect "$bad: --protocol rdma fails" "$rc" 1
    expect "$bad: says why" "$(grep -c 'no byte went through rdma' "$TMP/n.err")" 1
done

# 5. forced tcp; auto on one host
bench "$TMP/t" MC_FORCE_TCP=1 -- --protocol auto
expect "MC_FORCE_TCP: protocol" "$(field "$TMP/t" 'j["protocol"] + " " + j["verify"]')" "tcp ok"
bench "$TMP/a" -- --protocol auto
expect "auto on this host: protocol" "$(field "$TMP/a" 'j["protocol"] + " " + j["verify"]')" "shm ok"

# 6. a bad value
rc=0
MC_PROTOCOL=bogus timeout 30 "$BENCH" --mode local --duration 1 >/dev/null 2>"$TMP/b.err" || rc=$?
expect "MC_PROTOCOL=bogus refused" "$(grep -c 'MC_PROTOCOL=bogus' "$TMP/b.err")" 1
expect "MC_PROTOCOL=bogus exit status" "$((rc != 0))" 1

# 7. the QP cap
bench "$TMP/q" MC_RDMA_MAX_QPS=1 -- --protocol rdma
expect "one QP: verified over rdma" "$(field "$TMP/q" 'j["protocol"] + " " + j["verify"]')" "rdma ok"
expect "one QP: rails that carried" \
    "$(field "$TMP/q" 'sum(1 for n, x in r.items() if "->softverbs" in n and x["bytes"])')" 1

[[ $fails == 0 ]] || exit 1
echo PASSED
