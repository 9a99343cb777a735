# softverbs: the stand-in libibverbs (tools/softverbs) tested with rdma-core's own tools and
# our verbs test. Registered only when the stand-in is built.
if(NOT TARGET softverbs)
  return()
endif()

set(SV_DIR ${CMAKE_CURRENT_LIST_DIR})
set(SV_LIBDIR ${CMAKE_BINARY_DIR}/lib/softverbs)

# The verbs test links against the SYSTEM libibverbs and runs over the stand-in.
find_library(SV_SYSTEM_IBVERBS NAMES ibverbs)
if(SV_SYSTEM_IBVERBS)
  add_executable(sv_verbs_test ${SV_DIR}/sv_verbs_test.c ${SV_DIR}/sv_verbs_cases.c)
  target_link_libraries(sv_verbs_test PRIVATE ${SV_SYSTEM_IBVERBS})
  add_dependencies(sv_verbs_test softverbs)
  add_test(NAME softverbs_verbs COMMAND sv_verbs_test)
  set_tests_properties(softverbs_verbs PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 600
    LABELS softverbs
    ENVIRONMENT "LD_LIBRARY_PATH=${SV_LIBDIR};SOFTVERBS_DEVICES=2;SOFTVERBS_FABRIC=ctest-verbs;SOFTVERBS_CTL_DIR=${CMAKE_CURRENT_BINARY_DIR}/sv_ctl_verbs")
  # Single process: MR limits and pinning, completion channel and async fds (sets its own env).
  add_executable(sv_local_test ${SV_DIR}/sv_local_test.c)
  target_link_libraries(sv_local_test PRIVATE ${SV_SYSTEM_IBVERBS})
  add_dependencies(sv_local_test softverbs)
  add_test(NAME softverbs_local COMMAND sv_local_test)
  set_tests_properties(softverbs_local PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 60
    LABELS softverbs ENVIRONMENT "LD_LIBRARY_PATH=${SV_LIBDIR}")
endif()

mc_script_test(softverbs_devices COMMAND bash ${SV_DIR}/test_devices.sh TIMEOUT 120 LABELS softverbs)
mc_script_test(softverbs_rc_pingpong COMMAND bash ${SV_DIR}/test_rc_pingpong.sh
  TIMEOUT 600 LABELS softverbs)
mc_script_test(softverbs_port_down COMMAND bash ${SV_DIR}/test_port_down.sh
  TIMEOUT 300 LABELS softverbs)
