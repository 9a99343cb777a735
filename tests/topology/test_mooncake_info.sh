#!/bin/sh
# mooncake-info on the live host (--json is one valid JSON object with the expected keys), on
# the two-socket XML topology (8 GPUs, the computed matrix), and with bad configuration.
set -eu
dir=${1:-${MC_SOURCE_DIR:-.}/tests/topology}
info=${MC_BUILD_DIR:-build}/bin/mooncake-info
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
unset MC_DEVICES MC_NIC_PRIORITY_MATRIX

fail() { echo "FAIL: $*" >&2; exit 1; }

"$info" >"$out/table" || fail "mooncake-info exited $?"
for section in "NUMA nodes" "Devices" "GPUs" "Priority matrix" "Transports" "tcp: yes"; do
    grep -q "$section" "$out/table" || fail "table lacks '$section'"
done

"$info" --json >"$out/live.json" || fail "mooncake-info --json exited $?"
python3 - "$out/live.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for k in ("version", "numa_nodes", "devices", "gpus", "gpu_note", "matrix", "transports"):
    assert k in d, "missing key %s" % k
assert d["transports"]["tcp"]["available"] is True
assert len(d["numa_nodes"]) >= 1
assert "cpu:%d" % d["numa_nodes"][0]["id"] in d["matrix"]
assert d["gpus"] or "no CUDA device" in d["gpu_note"]
PY

"$info" --topology "$dir/two-socket.xml" >"$out/two" || fail "--topology exited $?"
for g in 0 1 2 3 4 5 6 7; do
    grep -q "^  cuda$g " "$out/two" || fail "--topology lacks cuda$g"
done
grep -q "^  GPUs (8)\|^GPUs (8)" "$out/two" || fail "--topology does not count 8 GPUs"
grep -Eq "^  cuda:5 +mlx5_2 +mlx5_0,mlx5_1,mlx5_3" "$out/two" || fail "cuda:5 row"

"$info" --json --topology "$dir/two-socket.xml" >"$out/two.json"
python3 - "$out/two.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert [g["name"] for g in d["gpus"]] == ["cuda%d" % i for i in range(8)], d["gpus"]
assert d["matrix"]["cpu:1"] == [["mlx5_2", "mlx5_3"], ["mlx5_0", "mlx5_1"]], d["matrix"]
assert d["matrix"]["cuda:2"] == [["mlx5_1"], ["mlx5_0", "mlx5_2", "mlx5_3"]], d["matrix"]
PY

MC_DEVICES=ib1,ib2 "$info" --json --topology "$dir/two-socket.xml" >"$out/f.json"
python3 -c 'import json,sys; m=json.load(open(sys.argv[1]))["matrix"]; assert m["cuda:0"]==[["ib1"],["ib2"]], m' "$out/f.json"

if MC_DEVICES=nosuch0 "$info" 2>"$out/err" >/dev/null; then fail "unknown MC_DEVICES accepted"; fi
grep -q "MC_DEVICES" "$out/err" || fail "error does not name MC_DEVICES"
if MC_NIC_PRIORITY_MATRIX='{"cpu:0":' "$info" 2>"$out/err" >/dev/null; then
    fail "bad MC_NIC_PRIORITY_MATRIX accepted"
fi
grep -q "MC_NIC_PRIORITY_MATRIX" "$out/err" || fail "error does not name MC_NIC_PRIORITY_MATRIX"
if "$info" --topology /nonexistent.xml 2>/dev/null >/dev/null; then fail "missing file accepted"; fi
echo "mooncake-info: ok"
