# examples/p2p_checkpoint: a publisher and N fetchers (mooncake-p2p processes) distribute a
# generated checkpoint; every copy is compared with the original and each fetcher's time and
# source mix (origin / replicas) is printed. Small sizes here; the example's defaults are
# larger (run.sh --help).
if(TARGET mooncake-p2p)
  set(P2P_EXAMPLE_RUN ${PROJECT_SOURCE_DIR}/examples/p2p_checkpoint/run.sh)
  # All processes on 127.0.0.1, metadata in the embedded file:// store.
  mc_script_test(p2p_example_loopback COMMAND ${P2P_EXAMPLE_RUN} 3 64M TIMEOUT 120 LABELS p2p)
  # Each process on a network-namespace "host" behind a tbf-shaped link (skipped, 77, without
  # root or namespaces).
  mc_script_test(p2p_example_netns COMMAND ${P2P_EXAMPLE_RUN} --netns 3 64M TIMEOUT 120
                 LABELS p2p netns)
  # Metadata in a throwaway etcd (skipped, 77, without etcd).
  mc_script_test(p2p_example_etcd COMMAND ${P2P_EXAMPLE_RUN} --etcd 3 64M TIMEOUT 120
                 LABELS p2p etcd)
  # Success is the example's own verdict, not only its exit status (77 still means skipped).
  set_tests_properties(p2p_example_loopback p2p_example_netns p2p_example_etcd PROPERTIES
                       PASS_REGULAR_EXPRESSION "run.sh: all 3 copies verified")
endif()
