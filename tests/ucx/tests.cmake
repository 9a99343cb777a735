# The UCX module (libuct_mooncake.so) under UCP. Only where the module is built (UCX's internal
# headers found); UCX 1.13 loads a transport module that is not its own only through LD_PRELOAD.
if(TARGET uct_mooncake)
  add_executable(test_ucp_data ${CMAKE_CURRENT_LIST_DIR}/test_ucp_data.c)
  target_link_libraries(test_ucp_data PRIVATE PkgConfig::UCX)
  add_dependencies(test_ucp_data uct_mooncake)
  set(MC_UCX_TEST_ENV "LD_PRELOAD=$<TARGET_FILE:uct_mooncake>;UCX_TLS=mooncake,self;UCX_WARN_UNUSED_ENV_VARS=n;MC_BUILD_DIR=${CMAKE_BINARY_DIR};MC_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
  # UCP tag/put/get/AM/stream byte for byte between processes; bad RMA and a killed peer fail cleanly.
  add_test(NAME test_ucp_data COMMAND test_ucp_data)
  set_tests_properties(test_ucp_data PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS "ucx"
    ENVIRONMENT "${MC_UCX_TEST_ENV}")
  # The same over the engine's tcp transport, where RMA is still in flight when the peer dies.
  add_test(NAME test_ucp_data_tcp COMMAND test_ucp_data)
  set_tests_properties(test_ucp_data_tcp PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS "ucx"
    ENVIRONMENT "${MC_UCX_TEST_ENV};UCX_MOONCAKE_PROTOCOL=tcp")
  # ... and over rdma on the software device (rendezvous by GET with keys of registrations
  # that come and go).
  if(TARGET softverbs)
    add_test(NAME test_ucp_data_rdma COMMAND test_ucp_data)
    set_tests_properties(test_ucp_data_rdma PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300
      LABELS "ucx;softverbs" ENVIRONMENT "${MC_UCX_TEST_ENV};UCX_MOONCAKE_PROTOCOL=rdma;LD_LIBRARY_PATH=${CMAKE_BINARY_DIR}/lib/softverbs;SOFTVERBS_DEVICES=2;SOFTVERBS_FABRIC=test_ucp_data;SOFTVERBS_CTL_DIR=${CMAKE_BINARY_DIR}/softverbs-ctl-test_ucp_data")
  endif()
  # The module's endpoints at the UCT level: which callbacks it calls (a pack callback only for
  # a send it takes), the order it issues queued requests in (a fence behind them), and what
  # happens to an operation the engine holds while the interface closes.
  add_executable(test_uct_ep ${CMAKE_CURRENT_LIST_DIR}/test_uct_ep.c)
  target_link_libraries(test_uct_ep PRIVATE PkgConfig::UCX)
  # uct_md_mem_dereg_v2 (memory invalidation) is declared only in UCX's source tree (uct_v2.h)
  target_include_directories(test_uct_ep SYSTEM PRIVATE "${MC_UCX_SOURCE_DIR}/src")
  add_dependencies(test_uct_ep uct_mooncake)
  add_test(NAME test_uct_ep COMMAND test_uct_ep)
  set_tests_properties(test_uct_ep PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300 LABELS "ucx"
    ENVIRONMENT "${MC_UCX_TEST_ENV}")
  # ... its rdma case (a remote key used again after a newer one went) on the software device.
  if(TARGET softverbs)
    add_test(NAME test_uct_ep_rdma COMMAND test_uct_ep)
    set_tests_properties(test_uct_ep_rdma PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300
      LABELS "ucx;softverbs" ENVIRONMENT "${MC_UCX_TEST_ENV};UCT_EP_CASE=rkey_reuse;LD_LIBRARY_PATH=${CMAKE_BINARY_DIR}/lib/softverbs;SOFTVERBS_DEVICES=2;SOFTVERBS_FABRIC=test_uct_ep;SOFTVERBS_CTL_DIR=${CMAKE_BINARY_DIR}/softverbs-ctl-test_uct_ep")
  endif()
  # UCX's installed examples, built from Debian's libucx-dev documentation when it is there
  # (not copied into the tree), for test_ucx_tools.sh.
  set(MC_UCX_EXAMPLES /usr/share/doc/libucx-dev/examples)
  foreach(ex ucp_hello_world uct_hello_world ucp_client_server)
    if(EXISTS ${MC_UCX_EXAMPLES}/${ex}.c)
      add_executable(${ex} ${MC_UCX_EXAMPLES}/${ex}.c)
      target_link_libraries(${ex} PRIVATE PkgConfig::UCX)
      target_compile_options(${ex} PRIVATE -w) # UCX's code, not ours: its warnings are not ours
    endif()
  endforeach()
  # ucx_info lists the transport, its settings and lanes; ucx_perftest (UCT and UCP tests) on
  # loopback and across two network namespaces; UCX's examples pass their own checks.
  mc_script_test(test_ucx_tools COMMAND ${CMAKE_CURRENT_LIST_DIR}/test_ucx_tools.sh loopback
    TIMEOUT 300 LABELS ucx)
  mc_script_test(test_netns_ucx_tools COMMAND ${CMAKE_CURRENT_LIST_DIR}/test_ucx_tools.sh netns
    TIMEOUT 300 LABELS "ucx;netns")
endif()
