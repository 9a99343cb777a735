# Installs the build tree into a temporary prefix and builds examples/hello_transfer against it.
mc_script_test(test_install COMMAND ${CMAKE_CURRENT_LIST_DIR}/test_install.sh TIMEOUT 300
               LABELS install)
