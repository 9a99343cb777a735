# examples/kv_disagg: kv_prefill and kv_decode (two processes) move a request's KV cache layer by
# layer through the plugin; decode verifies every layer byte for byte as its notification comes.
if(TARGET mooncake_kv)
  set(KV_EXAMPLE_RUN ${PROJECT_SOURCE_DIR}/examples/kv_disagg/run.sh)
  mc_script_test(kv_example_loopback COMMAND ${KV_EXAMPLE_RUN} TIMEOUT 120 LABELS kv)
  # Prefill on one network-namespace "host", decode on another (skipped without namespaces).
  mc_script_test(kv_example_netns COMMAND ${KV_EXAMPLE_RUN} --netns TIMEOUT 120 LABELS kv netns)
  # The check is real: prefill spoils one byte of layer 5 (middle byte of its middle block), and
  # decode must name that layer, block and byte, and the run must fail.
  mc_script_test(kv_example_detects_corruption COMMAND ${KV_EXAMPLE_RUN} --layers 8 TIMEOUT 120
    LABELS kv)
  set_property(TEST kv_example_detects_corruption APPEND PROPERTY ENVIRONMENT
    "PREFILL_ARGS=--corrupt-layer 5")
  set_property(TEST kv_example_detects_corruption PROPERTY PASS_REGULAR_EXPRESSION
    "kv_decode: layer 5: MISMATCH in block [0-9]+ \\(from prefill block [0-9]+\\) at byte 16384[^\n]*\n.*run.sh: FAILED \\(kv_decode exit 1, kv_prefill exit 1\\)")
endif()
