#!/bin/sh
# mooncake-info over the softverbs stand-in (two devices): the devices and their ports (state,
# link layer, MTU, LID, GIDs) in the table and in --json, a port set down through the control
# file, and RoCE GIDs. Exit 77 (skipped) when the stand-in is not built.
set -eu
build=${MC_BUILD_DIR:-build}
info=$build/bin/mooncake-info
[ -e "$build/lib/softverbs/libibverbs.so.1" ] || { echo "skipped: softverbs not built"; exit 77; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
unset MC_DEVICES MC_NIC_PRIORITY_MATRIX SOFTVERBS_CONFIG SOFTVERBS_LINK
export LD_LIBRARY_PATH=$build/lib/softverbs SOFTVERBS_DEVICES=2 SOFTVERBS_CTL_DIR=$out/ctl

fail() { echo "FAIL: $*" >&2; exit 1; }
# row DEVICE STATE LINK MTU LID: the port row of the RDMA ports table, in $out/table.
row() { grep -Eq "^  $1 +1 +$2 +$3 +$4 +$5 +0 +fe80::253:5600:0:" "$out/table"; }

"$info" >"$out/table" || fail "mooncake-info exited $?"
grep -q "rdma: 2 devices via libibverbs: softverbs0,softverbs1" "$out/table" || fail "rdma line"
grep -Eq "^  softverbs1 +rdma " "$out/table" || fail "softverbs1 not among the devices"
grep -q "^RDMA ports" "$out/table" || fail "no RDMA ports section"
row softverbs0 ACTIVE InfiniBand 4096 1 || fail "softverbs0 port row"
row softverbs1 ACTIVE InfiniBand 4096 2 || fail "softverbs1 port row"

"$info" --json >"$out/ib.json" || fail "--json exited $?"
python3 - "$out/ib.json" <<'PY'
import json, sys
ports = json.load(open(sys.argv[1]))["transports"]["rdma"]["ports"]
assert [(p["device"], p["port"]) for p in ports] == [("softverbs0", 1), ("softverbs1", 1)], ports
for i, p in enumerate(ports):
    assert (p["state"], p["link_layer"], p["active_mtu"], p["lid"]) == \
        ("ACTIVE", "InfiniBand", 4096, i + 1), p
    assert p["gids"] == [{"index": 0, "gid": "fe80::253:5600:0:%d" % (i + 1), "type": "IB"}], p
PY

mkdir -p "$out/ctl"
echo port=down >"$out/ctl/softverbs1"
"$info" >"$out/table" || fail "mooncake-info with a port down exited $?"
row softverbs0 ACTIVE InfiniBand 4096 1 || fail "softverbs0 not ACTIVE with softverbs1 down"
row softverbs1 DOWN InfiniBand 4096 2 || fail "softverbs1 port not DOWN"
"$info" --json >"$out/down.json"
python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["transports"]["rdma"]["ports"]; assert [x["state"] for x in p]==["ACTIVE","DOWN"], p' "$out/down.json"
rm "$out/ctl/softverbs1"

SOFTVERBS_LINK=eth "$info" >"$out/table" || fail "mooncake-info on RoCE exited $?"
row softverbs1 ACTIVE Ethernet 1024 0 || fail "RoCE port row"
grep -Eq "^ +1 +::ffff:127.0.0.2 \(RoCE v2\)$" "$out/table" || fail "RoCE v2 GID of softverbs1"
echo "mooncake-info over softverbs: ok"
