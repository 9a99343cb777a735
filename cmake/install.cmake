# Installation: headers, libmooncake_te, the tools, and the two ways to consume the package:
#   CMake:      find_package(Mooncake REQUIRED)  target_link_libraries(app Mooncake::mooncake_te)
#   pkg-config: cc app.c $(pkg-config --cflags --libs mooncake)
# Components: "runtime" (shared library, tools) and "dev" (headers, .so link, CMake and
# pkg-config files), so that a distribution can split them into two packages.
include(CMakePackageConfigHelpers)

set(MC_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/Mooncake)

# The same name inside the tree (add_subdirectory users) as after find_package().
add_library(Mooncake::mooncake_te ALIAS mooncake_te)

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/mooncake
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT dev
        FILES_MATCHING PATTERN "*.h")

# mooncake_te links jansson, numa, threads and cudart PRIVATE: a shared library's private
# dependencies stay out of the exported interface, so the export carries no build paths and
# the config file needs no find_dependency().
install(TARGETS mooncake_te EXPORT MooncakeTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev)

# Tools find the library next to them wherever the prefix is (/opt/mooncake, $HOME/.local).
file(RELATIVE_PATH MC_BIN_TO_LIB ${CMAKE_INSTALL_FULL_BINDIR} ${CMAKE_INSTALL_FULL_LIBDIR})
foreach(tool mooncake-bench mooncake-info)
  if(TARGET ${tool})
    set_target_properties(${tool} PROPERTIES INSTALL_RPATH "$ORIGIN/${MC_BIN_TO_LIB}")
    install(TARGETS ${tool} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
  endif()
endforeach()

# CMake package: MooncakeTargets.cmake, MooncakeConfig.cmake, MooncakeConfigVersion.cmake.
install(EXPORT MooncakeTargets
        NAMESPACE Mooncake::
        DESTINATION ${MC_CMAKE_DIR}
        COMPONENT dev)

file(WRITE ${PROJECT_BINARY_DIR}/MooncakeConfig.cmake.in [=[
@PACKAGE_INIT@

include("${CMAKE_CURRENT_LIST_DIR}/MooncakeTargets.cmake")
check_required_components(Mooncake)
]=])
configure_package_config_file(${PROJECT_BINARY_DIR}/MooncakeConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/MooncakeConfig.cmake
                              INSTALL_DESTINATION ${MC_CMAKE_DIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/MooncakeConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION}
                                 COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/MooncakeConfig.cmake
              ${PROJECT_BINARY_DIR}/MooncakeConfigVersion.cmake
        DESTINATION ${MC_CMAKE_DIR}
        COMPONENT dev)

# mooncake.pc is written at install time, so that it names the prefix actually installed to
# (`cmake --install build --prefix DIR`), not the one the build was configured with.
install(CODE "
  set(MC_PC_VERSION \"${PROJECT_VERSION}\")
  set(MC_PC_LIBDIR \"${CMAKE_INSTALL_LIBDIR}\")
  set(MC_PC_INCLUDEDIR \"${CMAKE_INSTALL_INCLUDEDIR}\")
  foreach(dir MC_PC_LIBDIR MC_PC_INCLUDEDIR)
    if(NOT IS_ABSOLUTE \"\${\${dir}}\")
      set(\${dir} \"\\\${prefix}/\${\${dir}}\")
    endif()
  endforeach()
  configure_file(\"${CMAKE_CURRENT_LIST_DIR}/mooncake.pc.in\"
                 \"${PROJECT_BINARY_DIR}/mooncake.pc\" @ONLY)
" COMPONENT dev)
install(FILES ${PROJECT_BINARY_DIR}/mooncake.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
        COMPONENT dev)

# The KV backend plugin (a module: no SONAME, no development link; hosts dlopen it by path, or
# by name from the library directory, where the loader looks last) and the loader, a static
# library hosts link.
if(TARGET mooncake_kv)
  install(TARGETS mooncake_kv LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime)
  install(TARGETS mooncake_kv_loader ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)
endif()

# The P2P store library (runtime; its header is in the dev component with the others) and its
# tool, which finds the libraries next to it as the other tools do.
if(TARGET mooncake_p2p)
  install(TARGETS mooncake_p2p LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime
          NAMELINK_COMPONENT dev)
  set_target_properties(mooncake-p2p PROPERTIES INSTALL_RPATH "$ORIGIN/${MC_BIN_TO_LIB}")
  install(TARGETS mooncake-p2p RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
endif()
