# Installs the build tree into a temporary prefix and builds examples/hello_transfer against it.
mc_script_test(test_install COMMAND ${CMAKE_CURRENT_LIST_DIR}/test_install.sh TIMEOUT 300
               LABELS install)
# The shared library: no load-time dependency on libibverbs or CUDA, exports exactly the public
# API (versioned), and an engine runs over tcp when libibverbs cannot be loaded.
mc_script_test(test_library COMMAND ${CMAKE_CURRENT_LIST_DIR}/test_library.sh TIMEOUT 120
               LABELS install)
