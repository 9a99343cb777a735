# The etcd:// metadata backend against a real etcd (tests/fixtures/etcd.sh). Skipped (77)
# without etcd.
set(MC_ETCD_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})
mc_unit_test(test_meta_etcd SOURCES ${MC_ETCD_TEST_DIR}/test_meta_etcd.c
             ${MC_ETCD_TEST_DIR}/etcd_proc.c TIMEOUT 120 LABELS etcd)
mc_unit_test(test_meta_etcd_faults SOURCES ${MC_ETCD_TEST_DIR}/test_meta_etcd_faults.c
             ${MC_ETCD_TEST_DIR}/etcd_proc.c TIMEOUT 120 LABELS etcd)
# The etcd:// backend against a gateway that answers without end (no etcd needed).
mc_unit_test(test_meta_etcd_garbage SOURCES ${MC_ETCD_TEST_DIR}/test_meta_etcd_garbage.c)
mc_unit_test(test_meta_etcd_secure SOURCES ${MC_ETCD_TEST_DIR}/test_meta_etcd_secure.c
             ${MC_ETCD_TEST_DIR}/etcd_proc.c TIMEOUT 120 LABELS etcd)
mc_script_test(test_etcd_engine COMMAND ${MC_ETCD_TEST_DIR}/test_etcd_engine.sh TIMEOUT 120
               LABELS etcd)
mc_unit_test(test_segment_cache SOURCES ${MC_ETCD_TEST_DIR}/test_segment_cache.c
             ${MC_ETCD_TEST_DIR}/etcd_proc.c TIMEOUT 120 LABELS etcd)
# The segment cache keeps a peer's newest descriptor when a lookup's answer comes after a change
# the watch delivered (the file backend, behind a gate that holds the lookup: no etcd needed).
mc_unit_test(test_segment_cache_order SOURCES ${MC_ETCD_TEST_DIR}/test_segment_cache_order.c)
# Keys hosts put on the engine's lease (mc_engine_publish): gone with the process, put again
# with a new lease, there after an etcd restart.
mc_unit_test(test_engine_publish SOURCES ${MC_ETCD_TEST_DIR}/test_engine_publish.c
             ${MC_ETCD_TEST_DIR}/etcd_proc.c TIMEOUT 120 LABELS etcd)
# The public API (<mooncake/meta.h>): one suite, run on each backend (the etcd run skips, 77,
# without etcd).
mc_unit_test(test_meta_public SOURCES ${MC_ETCD_TEST_DIR}/test_meta_public.c
             ${MC_ETCD_TEST_DIR}/etcd_proc.c TIMEOUT 120)
add_test(NAME test_meta_public_etcd COMMAND test_meta_public etcd)
set_tests_properties(test_meta_public_etcd PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 120
  LABELS etcd ENVIRONMENT "MC_BUILD_DIR=${CMAKE_BINARY_DIR};MC_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
