# Files and block devices as segment buffers (the file transport): locally and from a peer (a
# child process) over tcp and shm, then over rdma on the software device.
mc_unit_test(test_file SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_file.c
             ${PROJECT_SOURCE_DIR}/tests/engine/harness.c TIMEOUT 120 LABELS integration)
# The staging pipeline's copier (VRAM to and from host memory) on a test runtime: no device.
mc_unit_test(test_file_copy SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_file_copy.c)
if(TARGET softverbs)
  add_test(NAME test_file_rdma COMMAND test_file)
  set_tests_properties(test_file_rdma PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120
    LABELS "integration;rdma" ENVIRONMENT
    "FT_TRANSPORT=rdma;LD_LIBRARY_PATH=${CMAKE_BINARY_DIR}/lib/softverbs;SOFTVERBS_DEVICES=2;SOFTVERBS_FABRIC=test_file;SOFTVERBS_CTL_DIR=${CMAKE_BINARY_DIR}/softverbs-ctl-test_file")
endif()
# VRAM staged through host memory, a peer's and ours (needs a CUDA device: 77 without one): the
# host bytes over tcp, shm, and rdma on the software device (which no GPU reaches).
mc_unit_test(test_vram SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_vram.c
             ${PROJECT_SOURCE_DIR}/tests/engine/harness.c TIMEOUT 300 LABELS "integration;gpu")
target_compile_definitions(test_vram PRIVATE MC_HAVE_CUDA=${MC_HAVE_CUDA})
if(MC_HAVE_CUDA)
  target_link_libraries(test_vram PRIVATE CUDA::cudart)
endif()
add_test(NAME test_vram_shm COMMAND test_vram)
set_tests_properties(test_vram_shm PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300
  LABELS "integration;gpu" ENVIRONMENT "VT_TRANSPORT=shm")
if(TARGET softverbs)
  add_test(NAME test_vram_rdma COMMAND test_vram)
  set_tests_properties(test_vram_rdma PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300
    LABELS "integration;rdma;gpu" ENVIRONMENT
    "VT_TRANSPORT=rdma;LD_LIBRARY_PATH=${CMAKE_BINARY_DIR}/lib/softverbs;SOFTVERBS_DEVICES=2;SOFTVERBS_FABRIC=test_vram;SOFTVERBS_CTL_DIR=${CMAKE_BINARY_DIR}/softverbs-ctl-test_vram")
endif()
# The same pipeline end to end without a device: two engines of this process, host memory taken
# for VRAM, a test runtime's copies (white box).
mc_unit_test(test_vram_staging SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_vram_staging.c
             ${PROJECT_SOURCE_DIR}/tests/engine/harness.c TIMEOUT 120 LABELS integration)
