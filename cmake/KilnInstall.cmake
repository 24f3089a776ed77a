# Install rules: `cmake --install build/default --prefix DIR` gives
#   DIR/lib/libkiln_runtime.so*, libkiln.so*, libkiln_serving.so*   (SONAME from PROJECT_VERSION)
#   DIR/bin/kiln                               (the CLI; RPATH $ORIGIN/../lib)
#   DIR/include/kiln/...                       (public headers + generated core/version.h)
#   DIR/bin/kiln_model_server                  (the server alone: runtime + serving)
#   DIR/lib/cmake/kiln/                        (find_package(kiln): kiln::kiln_runtime, kiln::kiln, kiln::kiln_serving)
#   DIR/lib/pkgconfig/kiln-runtime.pc, kiln.pc
# Generated protobuf headers stay private: no public header includes them.
# tests/cli/install_embed.sh builds examples/embed against such an installation.
include(CMakePackageConfigHelpers)
set(KILN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/kiln)

install(TARGETS kiln_runtime kiln kiln_serving EXPORT kilnTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(TARGETS kiln_cli kiln_model_server RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(KILN_WITH_CUDA)
  # The plugin: found next to libkiln_runtime at run time, also linkable (kiln::kiln_cuda)
  # by programs that use its public API (kiln/cuda/*.h: NCCL, TF32).
  install(TARGETS kiln_cuda EXPORT kilnTargets LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
endif()
if(TARGET kiln_mpi)
  # Loaded by libkiln, next to itself, when mpirun launches a multi-worker job.
  install(TARGETS kiln_mpi LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} OPTIONAL)
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/kiln DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.h")
install(FILES ${CMAKE_BINARY_DIR}/generated/kiln/core/version.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/kiln/core)

install(EXPORT kilnTargets NAMESPACE kiln:: DESTINATION ${KILN_CMAKE_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/kilnConfig.cmake.in
                              ${CMAKE_BINARY_DIR}/cmake/kilnConfig.cmake
                              INSTALL_DESTINATION ${KILN_CMAKE_DIR})
# Before 1.0 a minor version may break the API: 0.1.x accepts a request for 0.1.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(_kiln_compat SameMinorVersion)
else()
  set(_kiln_compat SameMajorVersion)
endif()
write_basic_package_version_file(${CMAKE_BINARY_DIR}/cmake/kilnConfigVersion.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY ${_kiln_compat})
install(FILES ${CMAKE_BINARY_DIR}/cmake/kilnConfig.cmake ${CMAKE_BINARY_DIR}/cmake/kilnConfigVersion.cmake
        DESTINATION ${KILN_CMAKE_DIR})

# pkg-config: the prefix is found relative to the .pc file (${pcfiledir}), so an
# installation moved or installed with `cmake --install --prefix` still works.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(KILN_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH _kiln_pc_up /${CMAKE_INSTALL_LIBDIR}/pkgconfig /)
  string(REGEX REPLACE "/$" "" _kiln_pc_up "${_kiln_pc_up}")
  set(KILN_PC_PREFIX "\${pcfiledir}/${_kiln_pc_up}")
endif()
foreach(pc kiln-runtime kiln)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/${pc}.pc.in ${CMAKE_BINARY_DIR}/pkgconfig/${pc}.pc @ONLY)
  install(FILES ${CMAKE_BINARY_DIR}/pkgconfig/${pc}.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endforeach()
