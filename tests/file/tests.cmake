# Files and block devices as segment buffers (the file transport): locally and from a peer (a
# child process) over tcp and shm, then over rdma on the software device.
mc_unit_test(test_file SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_file.c
             ${PROJECT_SOURCE_DIR}/tests/engine/harness.c TIMEOUT 120 LABELS integration)
if(TARGET softverbs)
  add_test(NAME test_file_rdma COMMAND test_file)
  set_tests_properties(test_file_rdma PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120
    LABELS "integration;rdma" ENVIRONMENT
    "FT_TRANSPORT=rdma;LD_LIBRARY_PATH=${CMAKE_BINARY_DIR}/lib/softverbs;SOFTVERBS_DEVICES=2;SOFTVERBS_FABRIC=test_file;SOFTVERBS_CTL_DIR=${CMAKE_BINARY_DIR}/softverbs-ctl-test_file")
endif()
