# The etcd:// metadata backend against a real etcd (tests/fixtures/etcd.sh). Skipped (77)
# without etcd.
set(MC_ETCD_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})
mc_unit_test(test_meta_etcd SOURCES ${MC_ETCD_TEST_DIR}/test_meta_etcd.c
             ${MC_ETCD_TEST_DIR}/etcd_proc.c TIMEOUT 120 LABELS etcd)
mc_unit_test(test_meta_etcd_faults SOURCES ${MC_ETCD_TEST_DIR}/test_meta_etcd_faults.c
             ${MC_ETCD_TEST_DIR}/etcd_proc.c TIMEOUT 120 LABELS etcd)
mc_unit_test(test_meta_etcd_secure SOURCES ${MC_ETCD_TEST_DIR}/test_meta_etcd_secure.c
             ${MC_ETCD_TEST_DIR}/etcd_proc.c TIMEOUT 120 LABELS etcd)
mc_script_test(test_etcd_engine COMMAND ${MC_ETCD_TEST_DIR}/test_etcd_engine.sh TIMEOUT 120
               LABELS etcd)
mc_unit_test(test_segment_cache SOURCES ${MC_ETCD_TEST_DIR}/test_segment_cache.c
             ${MC_ETCD_TEST_DIR}/etcd_proc.c TIMEOUT 120 LABELS etcd)
