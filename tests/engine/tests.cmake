mc_unit_test(test_sha256 SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_sha256.c)
mc_unit_test(test_meta_file SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_meta_file.c)
# Integration suites: real engines in child processes on loopback (harness.c).
mc_unit_test(test_conformance SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_conformance.c
             ${CMAKE_CURRENT_LIST_DIR}/harness.c TIMEOUT 300 LABELS integration)
set_property(TEST test_conformance APPEND PROPERTY ENVIRONMENT "TH_TRANSPORT=tcp,tcp-engine-memory,shm,shm-cma")
# The same suite over rdma on the software RDMA device (two per side), in its own fabric.
if(TARGET softverbs)
  add_test(NAME test_conformance_rdma COMMAND test_conformance)
  set_tests_properties(test_conformance_rdma PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 400
    LABELS "integration;rdma" ENVIRONMENT
    "TH_TRANSPORT=rdma,rdma-engine-memory;LD_LIBRARY_PATH=${CMAKE_BINARY_DIR}/lib/softverbs;SOFTVERBS_DEVICES=2;SOFTVERBS_FABRIC=conformance;SOFTVERBS_CTL_DIR=${CMAKE_BINARY_DIR}/softverbs-ctl-conformance")
endif()
mc_script_test(test_netns_transfer COMMAND ${CMAKE_CURRENT_LIST_DIR}/test_netns_transfer.sh
  TIMEOUT 180 LABELS netns)
mc_unit_test(test_engine_api SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_engine_api.c
             ${CMAKE_CURRENT_LIST_DIR}/harness.c TIMEOUT 300 LABELS integration)
mc_unit_test(test_faults SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_faults.c
             ${CMAKE_CURRENT_LIST_DIR}/harness.c TIMEOUT 300 LABELS integration)
mc_script_test(test_multirail COMMAND ${CMAKE_CURRENT_LIST_DIR}/test_multirail.sh
  TIMEOUT 240 LABELS netns)
mc_unit_test(test_shm SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_shm.c
             ${CMAKE_CURRENT_LIST_DIR}/harness.c TIMEOUT 120 LABELS integration)
