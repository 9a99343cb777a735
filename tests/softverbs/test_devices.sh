#!/usr/bin/env bash
# softverbs: rdma-core's ibv_devices and ibv_devinfo -v over the stand-in, device
# configuration (count, link layer, config file) and the exported symbol versions.
# Exit 0 pass, 1 fail, 77 skipped.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=sv_lib.sh
. "$here/sv_lib.sh"

sys=$(ldconfig -p | awk '/libibverbs.so.1 .*x86-64/ { print $NF; exit }')
exports() { objdump -T "$1" | awk '!/\*UND\*/ && $3 == "DF" && $(NF-1) !~ /^\(/ { print $(NF-1), $NF }' | sort; }
check "stand-in exports every default-version symbol of $sys" \
    diff <(exports "$sys") <(exports "$SV_LIB/libibverbs.so.1")

out=$(ibv_devices)
echo "$out"
check "ibv_devices lists softverbs0" grep -q "softverbs0[[:space:]]*0253560000000001" <<<"$out"

out=$(ibv_devinfo -v)
check "ibv_devinfo -v runs" test $? = 0
check "one device by default" test "$(grep -c hca_id <<<"$out")" = 1
check "port ACTIVE" grep -q "state:.*PORT_ACTIVE" <<<"$out"
check "InfiniBand link layer" grep -q "link_layer:.*InfiniBand" <<<"$out"
check "LID 1" grep -q "port_lid:[[:space:]]*1$" <<<"$out"
check "GID from GUID" grep -q "GID\[  0\]:.*fe80:0000:0000:0000:0253:5600:0000:0001" <<<"$out"

out=$(SOFTVERBS_DEVICES=3 ibv_devinfo)
check "SOFTVERBS_DEVICES=3 gives three devices" test "$(grep -c hca_id <<<"$out")" = 3
check "distinct LIDs" test "$(grep port_lid <<<"$out" | sort -u | wc -l)" = 3

out=$(SOFTVERBS_DEVICES=2 SOFTVERBS_LINK=eth ibv_devinfo -v)
check "RoCE link layer" test "$(grep -c "link_layer:.*Ethernet" <<<"$out")" = 2
check "RoCE v2 GIDs from addresses" grep -q "::ffff:127.0.0.2, RoCE v2" <<<"$out"
check "distinct RoCE GIDs" test "$(grep 'GID\[' <<<"$out" | sort -u | wc -l)" = 4

printf '# test config\ndevice alpha link=ib\ndevice beta link=eth netdev=lo\n' >"$SV_TMP/conf"
out=$(SOFTVERBS_CONFIG=$SV_TMP/conf ibv_devinfo -v)
check "config file names devices" grep -q "hca_id:[[:space:]]*beta" <<<"$out"
check "config file netdev GIDs" grep -q "::ffff:127.0.0.1, RoCE v2" <<<"$out"

[ "$fails" = 0 ] || exit 1
echo PASSED
