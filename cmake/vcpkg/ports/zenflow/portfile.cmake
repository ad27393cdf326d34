# vcpkg port of zenflow, as an overlay port of this repository:
#   vcpkg install zenflow --overlay-ports=<zenflow>/cmake/vcpkg/ports
# (a registry port would fetch a release with vcpkg_from_github instead of SOURCE_PATH below).
# vcpkg knows this port by the port's files only, not by the sources it builds: after editing
# zenflow, raise port-version (see the README for the alternative).
# tests/vcpkg_port.cmake runs the same configure and install into a staging tree with vcpkg's
# layout and builds the manifest-mode example against it; keep the options in step with it.
set(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../../../..")

vcpkg_check_features(OUT_FEATURE_OPTIONS FEATURE_OPTIONS FEATURES cuda ZENFLOW_ENABLE_CUDA)

vcpkg_cmake_configure(
  SOURCE_PATH "${SOURCE_PATH}"
  OPTIONS
    -DZENFLOW_BUILD_TESTS=OFF
    -DZENFLOW_BUILD_BENCH=OFF
    -DZENFLOW_BUILD_EXAMPLES=OFF
    -DZENFLOW_INSTALL=ON
    -DZENFLOW_INSTALL_CMAKEDIR=share/zenflow
    -DZENFLOW_ENABLE_MPI=OFF
    -DZENFLOW_ENABLE_NCCL=OFF
    ${FEATURE_OPTIONS}
)
vcpkg_cmake_install()
vcpkg_cmake_config_fixup(PACKAGE_NAME zenflow CONFIG_PATH share/zenflow)
vcpkg_fixup_pkgconfig()

file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/debug/include" "${CURRENT_PACKAGES_DIR}/debug/share")
file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/README.md")
