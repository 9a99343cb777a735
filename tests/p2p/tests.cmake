# The P2P store (libmooncake_p2p, mooncake-p2p) between real processes: p2p_node is one node
# driven on stdin; the tests start several and check bytes, counters and errors. Labels: p2p,
# and etcd for the ones that need a real etcd (skipped, 77, without it).
if(TARGET mooncake_p2p)
  set(MC_P2P_TEST_DIR ${CMAKE_CURRENT_LIST_DIR})
  add_executable(p2p_node ${MC_P2P_TEST_DIR}/p2p_node.c)
  target_link_libraries(p2p_node PRIVATE mooncake_p2p Threads::Threads)

  # mc_p2p_test(NAME SOURCES src... [LABELS l...] [TIMEOUT s]): a cmocka program that starts
  # p2p_node processes (found next to itself), linked with the public libraries only.
  function(mc_p2p_test name)
    cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LABELS" ${ARGN})
    add_executable(${name} ${T_SOURCES} ${MC_P2P_TEST_DIR}/p2p_test.c)
    target_link_libraries(${name} PRIVATE mooncake_p2p PkgConfig::CMOCKA)
    add_dependencies(${name} p2p_node)
    add_test(NAME ${name} COMMAND ${name})
    list(PREPEND T_LABELS p2p)
    set_tests_properties(${name} PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT ${T_TIMEOUT}
      LABELS "${T_LABELS}"
      ENVIRONMENT "MC_BUILD_DIR=${CMAKE_BINARY_DIR};MC_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
  endfunction()

  mc_p2p_test(test_p2p SOURCES ${MC_P2P_TEST_DIR}/test_p2p.c TIMEOUT 180)
  mc_p2p_test(test_p2p_etcd SOURCES ${MC_P2P_TEST_DIR}/test_p2p_etcd.c
              ${PROJECT_SOURCE_DIR}/tests/metadata/etcd_proc.c TIMEOUT 180 LABELS etcd)

  # Names, keys, JSON codecs, shard pieces, holder choice: the library's internals.
  add_executable(test_p2p_units ${MC_P2P_TEST_DIR}/test_p2p_units.c)
  target_link_libraries(test_p2p_units PRIVATE mooncake_p2p_internal PkgConfig::CMOCKA)
  # The metadata backend interface: a store that loses answers, wrapped around a real one.
  target_include_directories(test_p2p_units PRIVATE ${PROJECT_SOURCE_DIR}/engine)
  add_test(NAME test_p2p_units COMMAND test_p2p_units)
  set_tests_properties(test_p2p_units PROPERTIES TIMEOUT 60 LABELS "p2p")

  # One holder over a slow link (namespaces, tbf): shards queued behind others are not canceled.
  mc_script_test(test_p2p_slow_link COMMAND ${MC_P2P_TEST_DIR}/test_p2p_slow_link.sh TIMEOUT 180
                 LABELS "p2p;netns")
  set_property(TEST test_p2p_slow_link APPEND PROPERTY DEPENDS mooncake-p2p)
  mc_script_test(test_p2p_tool COMMAND ${MC_P2P_TEST_DIR}/test_p2p_tool.sh TIMEOUT 180
                 LABELS p2p)
  set_property(TEST test_p2p_tool APPEND PROPERTY DEPENDS mooncake-p2p)

  # The library exports exactly the MC_P2P_API functions of the header, all versioned.
  add_test(NAME test_p2p_exports COMMAND sh -c
    "api=$(grep -ho 'MC_P2P_API [^(]*mc_p2p_[a-z_]*(' \"$1\" | sed 's/.*\\(mc_p2p_[a-z_]*\\)(/\\1/' | sort) &&
     exp=$(nm -D --defined-only \"$0\" | awk '$2 != \"A\" {print $3}' | sort) &&
     want=$(echo \"$api\" | sed 's/$/@@MOONCAKE_P2P_0.1/') && echo \"$exp\" &&
     test \"$exp\" = \"$want\""
    $<TARGET_FILE:mooncake_p2p> ${PROJECT_SOURCE_DIR}/include/mooncake/p2p.h)
  set_tests_properties(test_p2p_exports PROPERTIES LABELS "p2p")
endif()
