# Topology discovery and the NIC priority matrix, on hand-written hwloc XML topologies.
mc_unit_test(test_topology SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_topology.c LABELS topology)
mc_script_test(test_mooncake_info COMMAND ${CMAKE_CURRENT_LIST_DIR}/test_mooncake_info.sh
  ${CMAKE_CURRENT_LIST_DIR} LABELS topology TIMEOUT 60)

# RDMA devices known only to libibverbs, and mooncake-info's port listing, over the softverbs
# stand-in (tools/softverbs).
if(TARGET softverbs)
  mc_unit_test(test_topology_verbs SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_topology_verbs.c
    LABELS topology softverbs TIMEOUT 60)
  add_dependencies(test_topology_verbs softverbs)
  set_property(TEST test_topology_verbs APPEND PROPERTY ENVIRONMENT
    "LD_LIBRARY_PATH=${CMAKE_BINARY_DIR}/lib/softverbs" "SOFTVERBS_DEVICES=2")
  mc_script_test(test_mooncake_info_verbs COMMAND ${CMAKE_CURRENT_LIST_DIR}/test_mooncake_info_verbs.sh
    LABELS topology softverbs TIMEOUT 60)
endif()
