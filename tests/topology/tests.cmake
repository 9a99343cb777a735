# Topology discovery and the NIC priority matrix, on hand-written hwloc XML topologies.
mc_unit_test(test_topology SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_topology.c LABELS topology)
mc_script_test(test_mooncake_info COMMAND ${CMAKE_CURRENT_LIST_DIR}/test_mooncake_info.sh
  ${CMAKE_CURRENT_LIST_DIR} LABELS topology TIMEOUT 60)
