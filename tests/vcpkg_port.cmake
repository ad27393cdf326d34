# ctest driver: what the vcpkg port (cmake/vcpkg/ports/zenflow) produces, without vcpkg, which
# cannot be obtained here. The port's portfile configures and installs zenflow with the options
# it lists; this script reads those options from the portfile, runs the same configure, build
# and install into a staging tree laid out as vcpkg's installed/<triplet> (CMake package files in
# share/zenflow, pkg-config files in lib/pkgconfig, the usage file beside the config), checks the
# layout and the port's version, and builds and runs the manifest-mode example
# (cmake/vcpkg/example) against it, as vcpkg's toolchain file would point it there.
# What this does not run: vcpkg itself (its helper functions, the tbb and xsimd ports, the
# copyright install); README.md says so.
cmake_minimum_required(VERSION 3.25)
foreach(v SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "vcpkg_port.cmake: ${v} not set")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK_DIR}")
set(port "${SOURCE_DIR}/cmake/vcpkg/ports/zenflow")
set(staging "${WORK_DIR}/vcpkg_installed/x64-linux")

include("${CMAKE_CURRENT_LIST_DIR}/run_helper.cmake")

# the portfile's configure options (the default features: no cuda)
file(READ "${port}/portfile.cmake" portfile)
if(NOT portfile MATCHES "vcpkg_cmake_configure\\(([^)]*)\\)")
  message(FATAL_ERROR "portfile.cmake: no vcpkg_cmake_configure call")
endif()
string(REGEX MATCHALL "-D[A-Za-z_]+=[^ \t\n)]+" options "${CMAKE_MATCH_1}")
list(LENGTH options n)
if(n LESS 5 OR NOT "-DZENFLOW_INSTALL_CMAKEDIR=share/zenflow" IN_LIST options)
  message(FATAL_ERROR "portfile.cmake: unexpected configure options: ${options}")
endif()
message(STATUS "the port's options: ${options}")

# (the port's configure, its code unoptimised: the kernels at the least level they take, the rest
# without -O3. This checks the port's layout and options, not the code, which the test programs
# check; at -O3 the library's build took ~200 s of compiler time here.)
run("${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${WORK_DIR}/build" -G "${GENERATOR}" -DCMAKE_CXX_COMPILER=${CXX_COMPILER}
    -DCMAKE_BUILD_TYPE=Release ${options} -DZENFLOW_ENABLE_CUDA=OFF "-DCMAKE_INSTALL_PREFIX=${staging}"
    -DCMAKE_CXX_FLAGS_RELEASE=-DNDEBUG -DZENFLOW_HOST_KERNELS_OPT=-O1)
run("${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
run("${CMAKE_COMMAND}" --install "${WORK_DIR}/build")
file(INSTALL "${port}/usage" DESTINATION "${staging}/share/zenflow")

# vcpkg's layout
foreach(f share/zenflow/zenflowConfig.cmake share/zenflow/zenflowConfigVersion.cmake share/zenflow/zenflowTargets.cmake
          share/zenflow/usage lib/pkgconfig/zenflow.pc lib/pkgconfig/zenflow-c.pc include/zenflow/zenflow.hpp)
  if(NOT EXISTS "${staging}/${f}")
    message(FATAL_ERROR "the staged port lacks ${f}")
  endif()
endforeach()
if(EXISTS "${staging}/lib/cmake")
  message(FATAL_ERROR "the staged port has lib/cmake: vcpkg wants the package files in share/zenflow")
endif()
# the port's version is version.hpp's; the usage text names what the example uses
file(STRINGS "${SOURCE_DIR}/include/zenflow/version.hpp" vlines REGEX "^#define ZENFLOW_VERSION_(MAJOR|MINOR|PATCH) ")
string(REGEX REPLACE ".*MAJOR ([0-9]+).*MINOR ([0-9]+).*PATCH ([0-9]+).*" "\\1.\\2.\\3" header_version "${vlines}")
file(READ "${port}/vcpkg.json" manifest)
if(NOT manifest MATCHES "\"version\": \"${header_version}\"")
  message(FATAL_ERROR "cmake/vcpkg/ports/zenflow/vcpkg.json: version is not version.hpp's ${header_version}")
endif()
file(READ "${port}/usage" usage)
foreach(line "find_package(zenflow CONFIG REQUIRED)" "zenflow::zenflow" "zenflow::c")
  string(FIND "${usage}" "${line}" at)
  if(at LESS 0)
    message(FATAL_ERROR "the usage file does not say ${line}")
  endif()
endforeach()

# the manifest-mode example, with the staging tree where vcpkg's toolchain would put it
run("${CMAKE_COMMAND}" -S "${SOURCE_DIR}/cmake/vcpkg/example" -B "${WORK_DIR}/example" -G "${GENERATOR}"
    -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_BUILD_TYPE=Release "-DCMAKE_PREFIX_PATH=${staging}")
run("${CMAKE_COMMAND}" --build "${WORK_DIR}/example")
run("${WORK_DIR}/example/main")
message(STATUS "${run_out}")
if(NOT run_out MATCHES "zenflow from vcpkg: loss")
  message(FATAL_ERROR "the example did not report its training: ${run_out}")
endif()
