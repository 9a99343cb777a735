mc_unit_test(test_sha256 SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_sha256.c)
mc_unit_test(test_meta_file SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_meta_file.c)
# Integration suites: real engines in child processes on loopback (harness.c).
mc_unit_test(test_conformance SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_conformance.c
             ${CMAKE_CURRENT_LIST_DIR}/harness.c TIMEOUT 300 LABELS integration)
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
