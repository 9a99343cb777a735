# The KV backend plugin (libmooncake_kv.so) as hosts use it: loaded by path through the loader.
# test_kv_plugin links no Mooncake library, which is what proves the plugin self-contained.
if(TARGET mooncake_kv)
  foreach(kind NEWER MAJOR NOSYM)
    string(TOLOWER ${kind} lname)
    add_library(kv_fixture_${lname} MODULE ${CMAKE_CURRENT_LIST_DIR}/kv_fixture_plugin.c)
    target_include_directories(kv_fixture_${lname} PRIVATE ${PROJECT_SOURCE_DIR}/include)
    target_compile_definitions(kv_fixture_${lname} PRIVATE KV_FIXTURE_${kind})
    set_target_properties(kv_fixture_${lname} PROPERTIES PREFIX "lib"
      LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/lib/kv-fixtures)
  endforeach()
  add_executable(test_kv_plugin ${CMAKE_CURRENT_LIST_DIR}/test_kv_plugin.c)
  target_link_libraries(test_kv_plugin PRIVATE mooncake_kv_loader PkgConfig::CMOCKA Threads::Threads)
  add_dependencies(test_kv_plugin mooncake_kv kv_fixture_newer kv_fixture_major kv_fixture_nosym)
  add_test(NAME test_kv_plugin COMMAND test_kv_plugin)
  set_tests_properties(test_kv_plugin PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS "kv"
    ENVIRONMENT "MC_BUILD_DIR=${CMAKE_BINARY_DIR};MC_KV_FIXTURES=${CMAKE_BINARY_DIR}/lib/kv-fixtures")
  # A region's public data over rdma (software device): the key of that very registration.
  if(TARGET softverbs)
    add_test(NAME test_kv_plugin_rdma COMMAND test_kv_plugin)
    set_tests_properties(test_kv_plugin_rdma PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300
      LABELS "kv;softverbs" ENVIRONMENT "MC_BUILD_DIR=${CMAKE_BINARY_DIR};KV_TEST_FILTER=test_public_key_of_region;KV_TEST_PROTOCOL=rdma;LD_LIBRARY_PATH=${CMAKE_BINARY_DIR}/lib/softverbs;SOFTVERBS_DEVICES=1;SOFTVERBS_FABRIC=test_kv_plugin;SOFTVERBS_CTL_DIR=${CMAKE_BINARY_DIR}/softverbs-ctl-test_kv_plugin")
  endif()
  # The plugin exports exactly one symbol.
  add_test(NAME test_kv_exports COMMAND sh -c
    "out=$(nm -D --defined-only \"$0\" | awk '{print $3}'); echo \"$out\"; test \"$out\" = mc_kv_plugin_init"
    $<TARGET_FILE:mooncake_kv>)
  set_tests_properties(test_kv_exports PROPERTIES LABELS "kv")
endif()
