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

# find_package(zenflow) from a probe project (configure only): `comps` the components asked for
# (REQUIRED), `before` lines ahead of it, `after` lines behind it; the result in rc/err.
function(probe name comps before after)
  file(WRITE "${WORK_DIR}/probe-${name}/CMakeLists.txt" "${before}
find_package(zenflow CONFIG REQUIRED ${comps})
${after}
")
  execute_process(
    COMMAND "${CMAKE_COMMAND}" -S "${WORK_DIR}/probe-${name}" -B "${WORK_DIR}/probe-${name}/build" -G "${GENERATOR}"
            -DCMAKE_CXX_COMPILER=${CXX_COMPILER} "-DCMAKE_PREFIX_PATH=${prefix};${WORK_DIR}/xtl-prefix"
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(REGEX REPLACE "[ \t\r\n]+" " " flat "${err}")
  set(rc "${rc}" PARENT_SCOPE)
  set(out "${out}" PARENT_SCOPE)
  set(err "${flat}" PARENT_SCOPE)
endfunction()
set(project_line "cmake_minimum_required(VERSION 3.25)\nproject(probe C CXX)")
# the three host components are always there
probe(host "COMPONENTS zenflow c host_kernels" "${project_line}" "")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "COMPONENTS zenflow c host_kernels should be found:\n${out}\n${err}")
endif()
# an unknown component, and one the package lacks, are refused with the reason (the package
# without CUDA and MPI: a copy of this one without their target files, as such a build installs)
file(COPY "${prefix}/" DESTINATION "${WORK_DIR}/host-only-prefix")
file(GLOB_RECURSE gpu_mpi_targets "${WORK_DIR}/host-only-prefix/zenflowCudaTargets*.cmake"
     "${WORK_DIR}/host-only-prefix/zenflowMpiTargets*.cmake" "${WORK_DIR}/host-only-prefix/zenflowNcclTargets*.cmake")
if(gpu_mpi_targets)
  file(REMOVE ${gpu_mpi_targets})
endif()
foreach(case "bogus;${prefix};no component bogus"
             "cuda;${WORK_DIR}/host-only-prefix;component cuda: this zenflow package was built without CUDA"
             "c_mpi;${WORK_DIR}/host-only-prefix;component c_mpi: this zenflow package was built without MPI")
  list(GET case 0 comp)
  list(GET case 1 at)
  list(GET case 2 why)
  set(saved_prefix "${prefix}")
  set(prefix "${at}")
  probe(missing-${comp} "COMPONENTS ${comp}" "${project_line}" "")
  set(prefix "${saved_prefix}")
  if(rc EQUAL 0 OR NOT err MATCHES "${why}")
    message(FATAL_ERROR "COMPONENTS ${comp} should be refused, saying '${why}':\n${out}\n${err}")
  endif()
endforeach()
# a consumer on old policies (the config uses no policy-dependent syntax)
probe(oldpolicy "" "cmake_minimum_required(VERSION 3.0)\nproject(probe C CXX)" "")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "a consumer with cmake_minimum_required(VERSION 3.0) should find zenflow:\n${out}\n${err}")
endif()
# the consumer's MPI settings are its own: MPI_CXX_SKIP_MPICXX as it was before find_package(zenflow)
probe(mpicxx "" "${project_line}\nset(MPI_CXX_SKIP_MPICXX OFF)"
      "if(NOT DEFINED MPI_CXX_SKIP_MPICXX OR MPI_CXX_SKIP_MPICXX)\n  message(FATAL_ERROR \"MPI_CXX_SKIP_MPICXX changed\")\nendif()")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "find_package(zenflow) should leave the consumer's MPI_CXX_SKIP_MPICXX alone:\n${out}\n${err}")
endif()
# an xtl package the consumer finds after zenflow is the real one, not an empty stand-in (a fake
# xtl in a prefix of its own, its target file as CMake writes them: it stops if xtl exists)
file(WRITE "${WORK_DIR}/xtl-prefix/share/cmake/xtl/xtlConfig.cmake" "if(TARGET xtl)\n  return()\nendif()
add_library(xtl INTERFACE IMPORTED)
set_target_properties(xtl PROPERTIES INTERFACE_INCLUDE_DIRECTORIES \"${WORK_DIR}/xtl-prefix/include\")
")
file(MAKE_DIRECTORY "${WORK_DIR}/xtl-prefix/include")
probe(xtl "" "${project_line}" "find_package(xtl CONFIG REQUIRED)
get_target_property(dirs xtl INTERFACE_INCLUDE_DIRECTORIES)
if(NOT dirs STREQUAL \"${WORK_DIR}/xtl-prefix/include\")
  message(FATAL_ERROR \"xtl's include directories: \${dirs}\")
endif()")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "a consumer's xtl should be the one it finds:\n${out}\n${err}")
endif()
message(STATUS "components, old policies, MPI settings and xtl: as they should be")

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
# An absolute CMAKE_INSTALL_LIBDIR (as some distributions' packaging passes) is written as it is
# in the .pc files, the include directory still found from the prefix (zenflow configured again,
# only configured: the .pc files are made then).
run("${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${WORK_DIR}/pc-absolute" -G "${GENERATOR}"
    -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DZENFLOW_BUILD_TESTS=OFF -DZENFLOW_BUILD_BENCH=OFF
    -DZENFLOW_BUILD_EXAMPLES=OFF -DZENFLOW_ENABLE_CUDA=OFF -DZENFLOW_ENABLE_MPI=OFF
    -DCMAKE_INSTALL_PREFIX=/opt/zf -DCMAKE_INSTALL_LIBDIR=/opt/zf/lib64)
foreach(pc zenflow zenflow-c)
  file(READ "${WORK_DIR}/pc-absolute/${pc}.pc" text)
  if(NOT text MATCHES "\nprefix=\\\${pcfiledir}/\\.\\./\\.\\.\n" OR NOT text MATCHES "\nlibdir=/opt/zf/lib64\n"
     OR NOT text MATCHES "\nincludedir=\\\${prefix}/include\n")
    message(FATAL_ERROR "${pc}.pc with CMAKE_INSTALL_LIBDIR=/opt/zf/lib64:\n${text}")
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
# With zenflow's install rules on (a parent that installs its own targets linking zenflow's), the
# build makes every library they install, the MPI C API's too, and the install succeeds.
# (The rest unoptimised, CMAKE_CXX_FLAGS_RELEASE without -O3: what this checks is the build's
# wiring, not its code, which the test programs check; the C API libraries' two sources took
# 220 s of compiler time here at -O3, a third of that at -O0.)
run("${CMAKE_COMMAND}" -S "${SOURCE_DIR}/tests/consumer" -B "${WORK_DIR}/build-subdir" -G "${GENERATOR}"
    -DCMAKE_CXX_COMPILER=${CXX_COMPILER} "-DCMAKE_CXX_FLAGS=${CXX_FLAGS}" -DZF_SOURCE_DIR=${SOURCE_DIR} -DZENFLOW_ENABLE_CUDA=OFF
    -DZENFLOW_HOST_KERNELS_OPT=-O1 -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE=-DNDEBUG -DZENFLOW_INSTALL=ON
    "-DCMAKE_INSTALL_PREFIX=${WORK_DIR}/subdir-prefix")
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
run("${CMAKE_COMMAND}" --install "${WORK_DIR}/build-subdir")
set(subdir_libs zenflow_host_kernels zenflow_c)
if(WITH_MPI)
  list(APPEND subdir_libs zenflow_c_mpi)
endif()
foreach(lib IN LISTS subdir_libs)
  file(GLOB_RECURSE found "${WORK_DIR}/subdir-prefix/lib${lib}.a")
  if(NOT found)
    message(FATAL_ERROR "the subproject's install has no lib${lib}.a")
  endif()
endforeach()
