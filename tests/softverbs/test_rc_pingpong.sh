#!/usr/bin/env bash
# softverbs: unmodified ibv_rc_pingpong between two processes over the stand-in, in the modes
# the issue lists, plus RoCE, ibv_srq_pingpong and ibv_uc_pingpong. Exit 0 pass, 1 fail, 77 skipped.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=sv_lib.sh
. "$here/sv_lib.sh"

check "default" pingpong default "" ""
check "-s 65536" pingpong size "-s 65536" "-s 65536"
check "-e (completion events)" pingpong events "-e" "-e"
check "-g 0 (GID mode)" pingpong gid "-g 0" "-g 0"
check "-n 1000" pingpong iters "-n 1000" "-n 1000"
check "-s 1000000 -n 20 (chunked)" pingpong big "-s 1000000 -n 20" "-s 1000000 -n 20"
PP_TOOL=ibv_srq_pingpong check "ibv_srq_pingpong (SRQ)" pingpong srq "" ""
PP_TOOL=ibv_srq_pingpong check "ibv_srq_pingpong -e -s 65536" pingpong srq2 "-e -s 65536" "-e -s 65536"
PP_TOOL=ibv_uc_pingpong check "ibv_uc_pingpong (UC)" pingpong uc "" ""
PP_TOOL=ibv_uc_pingpong check "ibv_uc_pingpong -e -s 65536" pingpong uc2 "-e -s 65536" "-e -s 65536"
export SOFTVERBS_DEVICES=2
check "-d: server softverbs0, client softverbs1" \
    pingpong twodev "-d softverbs0" "-d softverbs1"
check "-d softverbs1 -e -g 0" pingpong twodev2 "-d softverbs1 -e -g 0" "-d softverbs1 -e -g 0"
export SOFTVERBS_LINK=eth
check "RoCE, IPv4 GID (-g 1), two devices" \
    pingpong roce "-d softverbs0 -g 1" "-d softverbs1 -g 1"
check "RoCE, link-local GID (-g 0)" pingpong roce0 "-d softverbs0 -g 0" "-d softverbs1 -g 0"

[ "$fails" = 0 ] || exit 1
echo PASSED
