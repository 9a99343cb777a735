# The Python binding of the KV plugin (plugins/python): its unittest suite, the
# connector-shaped example and the offload example (FILE regions), run from the build directory against $MC_BUILD_DIR/lib's plugin.
if(TARGET mooncake_kv)
  find_program(MC_PYTHON3 python3 REQUIRED)
  set(_kvpy ${PROJECT_SOURCE_DIR}/plugins/python)
  mc_script_test(kv_python_binding COMMAND ${MC_PYTHON3} ${_kvpy}/test_mooncake_kv.py -v
    TIMEOUT 300 LABELS kv python)
  mc_script_test(kv_python_connector_example COMMAND ${MC_PYTHON3}
    ${_kvpy}/kv_connector_example.py TIMEOUT 120 LABELS kv python)
  mc_script_test(kv_python_offload_example COMMAND ${MC_PYTHON3}
    ${_kvpy}/kv_offload_example.py TIMEOUT 120 LABELS kv python)
  set_tests_properties(kv_python_binding kv_python_connector_example kv_python_offload_example
    PROPERTIES WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
endif()
