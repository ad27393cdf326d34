# ctest driver: install the build tree to a scratch prefix, then configure, build and run a
# separate consumer project against it (find_package(zenflow CONFIG REQUIRED)), check that
# asking for an incompatible version is refused, and build the consumer once more with zenflow
# as a subproject.
if(NOT DEFINED CXX_FLAGS)
  set(CXX_FLAGS "")
endif()
foreach(v BUILD_DIR SOURCE_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "install_consumer.cmake: ${v} not set")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")

include("${CMAKE_CURRENT_LIST_DIR}/run_helper.cmake")

run("${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${prefix}")
# With CUDA, the consumer also builds a .cu file against zenflow::cuda, setting no CUDA standard
# of its own: the target must bring C++20 (one architecture, to keep the test short).
set(cuda_args -DZF_CUDA_CONSUMER=OFF)
if(WITH_CUDA)
  set(cuda_args -DZF_CUDA_CONSUMER=ON -DCMAKE_CUDA_COMPILER=${CUDA_COMPILER} -DCMAKE_CUDA_ARCHITECTURES=80)
  if(WITH_NCCL)  # and a .cu file against zenflow::nccl (NCCL found by the package's FindNCCL)
    list(APPEND cuda_args -DZF_NCCL_CONSUMER=ON)
  endif()
endif()
# With MPI, a C program against zenflow::c_mpi, run as one rank by mpiexec.
set(mpi_args -DZF_MPI_CONSUMER=OFF)
if(WITH_MPI)
  set(mpi_args -DZF_MPI_CONSUMER=ON)
endif()
run("${CMAKE_COMMAND}" -S "${SOURCE_DIR}/tests/consumer" -B "${WORK_DIR}/build" -G "${GENERATOR}"
    -DCMAKE_CXX_COMPILER=${CXX_COMPILER} "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}" -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release
    ${cuda_args} ${mpi_args})
run("${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
run("${WORK_DIR}/build/consumer")
run("${WORK_DIR}/build/consumer_c")
run("${WORK_DIR}/build/consumer_c_via_shared")
if(WITH_MPI)
  # (Open MPI refuses root unless told, as in a CI container)
  set(ENV{OMPI_ALLOW_RUN_AS_ROOT} 1)
  set(ENV{OMPI_ALLOW_RUN_AS_ROOT_CONFIRM} 1)
  set(ENV{OMPI_MCA_btl} self,vader)
  run("${MPIEXEC}" -n 1 ${MPIEXEC_FLAGS} "${WORK_DIR}/build/consumer_c_mpi")
endif()

# A project that enables only C is refused by find_package, naming the fix, instead of failing
# at the link without the C++ runtime.
file(WRITE "${WORK_DIR}/c-only/CMakeLists.txt" "cmake_minimum_required(VERSION 3.25)
project(c_only C)
find_package(zenflow CONFIG REQUIRED)
")
execute_process(
  COMMAND "${CMAKE_COMMAND}" -S "${WORK_DIR}/c-only" -B "${WORK_DIR}/c-only/build" -G "${GENERATOR}"
          -DCMAKE_PREFIX_PATH=${prefix}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(REGEX REPLACE "[ \t\r\n]+" " " flat "${err}")
if(rc EQUAL 0 OR NOT flat MATCHES "enable CXX in the project that uses it")
  message(FATAL_ERROR "a C-only project should be refused by find_package(zenflow), naming the fix:\n${out}\n${err}")
endif()
message(STATUS "a C-only project correctly refused")

# pkg-config: a Makefile builds the same consumers from zenflow.pc / zenflow-c.pc; the version
# they report is the one version.hpp holds.
find_program(PKG_CONFIG pkg-config REQUIRED)
find_program(MAKE_PROGRAM make REQUIRED)
file(GLOB pc_dirs "${prefix}/lib*/pkgconfig" "${prefix}/lib/*/pkgconfig")
list(GET pc_dirs 0 pc_dir)
set(ENV{PKG_CONFIG_PATH} "${pc_dir}")
file(STRINGS "${SOURCE_DIR}/include/zenflow/version.hpp" vlines REGEX "^#define ZENFLOW_VERSION_(MAJOR|MINOR|PATCH) ")
string(REGEX REPLACE ".*MAJOR ([0-9]+).*MINOR ([0-9]+).*PATCH ([0-9]+).*" "\\1.\\2.\\3" header_version "${vlines}")
foreach(pc zenflow zenflow-c)
  execute_process(COMMAND "${PKG_CONFIG}" --modversion ${pc} OUTPUT_VARIABLE pc_version RESULT_VARIABLE rc
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0 OR NOT pc_version STREQUAL header_version)
    message(FATAL_ERROR "${pc}.pc version '${pc_version}' (rc ${rc}), version.hpp says '${header_version}'")
  endif()
endforeach()
file(MAKE_DIRECTORY "${WORK_DIR}/make")
run("${MAKE_PROGRAM}" -f "${SOURCE_DIR}/tests/consumer/Makefile" "OUT=${WORK_DIR}/make" "CXX=${CXX_COMPILER}")
run("${WORK_DIR}/make/consumer_pc")
run("${WORK_DIR}/make/consumer_c_pc")
run("${WORK_DIR}/make/consumer_c_via_shared_pc")
if(WITH_CUDA)
  run("${WORK_DIR}/build/consumer_cuda")
  run("${WORK_DIR}/build/consumer_c_cuda")
endif()
if(WITH_CUDA AND WITH_NCCL)
  run("${WORK_DIR}/build/consumer_nccl")
endif()

# Incompatible versions are refused: another major; and, before 1.0, where a minor version may
# break the API, another minor (a request for 0.0 must not accept 0.1).
foreach(v 1.0 0.0)
  execute_process(
    COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}/tests/consumer" -B "${WORK_DIR}/build-v${v}" -G "${GENERATOR}"
            -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_PREFIX_PATH=${prefix} -DZF_REQUIRE_VERSION=${v}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc EQUAL 0 OR NOT err MATCHES "compatible with requested version")
    message(FATAL_ERROR "asking for zenflow ${v} should be refused:\n${out}\n${err}")
  endif()
  message(STATUS "version ${v} correctly refused")
endforeach()

# oneTBB's version as a package manager may present it: a TBB config whose version file accepts
# only its own major version (as Conan's CMakeDeps writes them). A 2022 must be accepted, a 2020
# refused with a message naming the version. (Configure only: the stand-in TBB::tbb is empty.)
foreach(tbb 2022.1.0 2020.3.0)
  string(REGEX MATCH "^[0-9]+" tbb_major "${tbb}")
  set(tbb_dir "${WORK_DIR}/tbb-${tbb}/lib/cmake/TBB")
  file(WRITE "${tbb_dir}/TBBConfig.cmake" "if(NOT TARGET TBB::tbb)\n  add_library(TBB::tbb INTERFACE IMPORTED)\nendif()\n")
  file(WRITE "${tbb_dir}/TBBConfigVersion.cmake" "set(PACKAGE_VERSION ${tbb})
set(PACKAGE_VERSION_COMPATIBLE FALSE)
if(NOT PACKAGE_FIND_VERSION OR PACKAGE_FIND_VERSION_MAJOR STREQUAL \"${tbb_major}\")
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
endif()
if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
  set(PACKAGE_VERSION_EXACT TRUE)
endif()
")
  execute_process(
    COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}/tests/consumer" -B "${WORK_DIR}/build-tbb${tbb_major}" -G "${GENERATOR}"
            -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_PREFIX_PATH=${prefix} -DTBB_DIR=${tbb_dir}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(tbb_major GREATER_EQUAL 2021)
    # accepted, and this one: not another TBB found instead (the system's)
    file(STRINGS "${WORK_DIR}/build-tbb${tbb_major}/CMakeCache.txt" found_dir REGEX "^TBB_DIR:")
    string(REGEX REPLACE "^TBB_DIR:[A-Z]*=" "" found_dir "${found_dir}")
    if(NOT rc EQUAL 0 OR NOT found_dir STREQUAL tbb_dir)
      message(FATAL_ERROR "oneTBB ${tbb} (a same-major version file) should be accepted (used: ${found_dir}):\n${out}\n${err}")
    endif()
  else()
    string(REGEX REPLACE "[ \t\r\n]+" " " flat "${err}")  # (CMake wraps long messages)
    if(rc EQUAL 0 OR NOT flat MATCHES "needs oneTBB 2021 or newer; found TBB ${tbb}")
      message(FATAL_ERROR "oneTBB ${tbb} should be refused, naming its version:\n${out}\n${err}")
    endif()
    # and zenflow's own build (as a subproject here) refuses it too, naming it
    execute_process(
      COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}/tests/consumer" -B "${WORK_DIR}/build-subdir-tbb${tbb_major}"
              -G "${GENERATOR}" -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DZF_SOURCE_DIR=${SOURCE_DIR}
              -DZENFLOW_ENABLE_CUDA=OFF -DTBB_DIR=${tbb_dir}
      RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
    string(REGEX REPLACE "[ \t\r\n]+" " " flat "${err}")
    if(rc EQUAL 0 OR NOT flat MATCHES "zenflow needs oneTBB 2021 or newer, found ${tbb}")
      message(FATAL_ERROR "zenflow's build should refuse oneTBB ${tbb}, naming its version:\n${out}\n${err}")
    endif()
  endif()
  message(STATUS "oneTBB ${tbb}: refused or accepted as it should be")
endforeach()

# The same consumer with zenflow as a subproject (add_subdirectory / FetchContent style), setting
# one of zenflow's options as a parent project may (the kernels at -O1: half their compile time).
run("${CMAKE_COMMAND}" -S "${SOURCE_DIR}/tests/consumer" -B "${WORK_DIR}/build-subdir" -G "${GENERATOR}"
    -DCMAKE_CXX_COMPILER=${CXX_COMPILER} "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}" -DZF_SOURCE_DIR=${SOURCE_DIR} -DZENFLOW_ENABLE_CUDA=OFF
    -DZENFLOW_HOST_KERNELS_OPT=-O1 -DCMAKE_BUILD_TYPE=Release)
file(GLOB_RECURSE subdir_rules "${WORK_DIR}/build-subdir/*.ninja" "${WORK_DIR}/build-subdir/*flags.make")
set(kernels_at_o1 FALSE)
foreach(f IN LISTS subdir_rules)
  file(STRINGS "${f}" lines REGEX "-O1 -fno-math-errno")
  if(lines)
    set(kernels_at_o1 TRUE)
  endif()
endforeach()
if(NOT kernels_at_o1)
  message(FATAL_ERROR "ZENFLOW_HOST_KERNELS_OPT=-O1 given to zenflow as a subproject did not reach its kernels' flags")
endif()
run("${CMAKE_COMMAND}" --build "${WORK_DIR}/build-subdir")
run("${WORK_DIR}/build-subdir/consumer")
run("${WORK_DIR}/build-subdir/consumer_c")
