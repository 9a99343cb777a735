mc_unit_test(test_sha256 SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_sha256.c)
mc_unit_test(test_meta_file SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_meta_file.c)
