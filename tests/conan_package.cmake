# ctest driver: the Conan 2 package, built and consumed as a Conan user would, offline. A scratch
# Conan home (no remote: nothing is downloaded) gets two test-only wrapper recipes that package
# the system's oneTBB and xsimd (cmake/conan/system/), then `conan create` builds zenflow's recipe
# (cmake/conan/conanfile.py) twice — the default package (zenflow's own CMake config and compiled
# kernel library) and header_only — each followed by its test_package, a CMake consumer that
# finds zenflow and trains a small model (it fails unless the loss drops tenfold).
foreach(v SOURCE_DIR WORK_DIR CONAN)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "conan_package.cmake: ${v} not set")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
set(ENV{CONAN_HOME} "${WORK_DIR}/home")

function(conan)
  execute_process(COMMAND "${CONAN}" ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): conan ${ARGN}\n${out}\n${err}")
  endif()
  set(conan_out "${out}${err}" PARENT_SCOPE)
endfunction()

conan(profile detect --force)
conan(remote remove conancenter)  # offline: a missing package must fail, not be looked for
conan(create "${SOURCE_DIR}/cmake/conan/system/onetbb")
conan(create "${SOURCE_DIR}/cmake/conan/system/xsimd")
# test_package builds in its own folder: a copy, so that nothing is written into the sources
file(COPY "${SOURCE_DIR}/cmake/conan/test_package" DESTINATION "${WORK_DIR}")
# (the code unoptimised, the package's and test_package's: CMAKE_CXX_FLAGS_RELEASE without -O3
# and the kernels at the least level they take. This checks the recipe, not the code, which the
# test programs check; at -O3 the two packages' builds took ~300 s of compiler time here.)
set(unoptimised "{'CMAKE_CXX_FLAGS_RELEASE': {'value': '-DNDEBUG', 'cache': True, 'type': 'STRING', 'force': True}, \
'ZENFLOW_HOST_KERNELS_OPT': {'value': '-O1', 'cache': True, 'type': 'STRING', 'force': True}}")
foreach(header_only False True)
  conan(create "${SOURCE_DIR}/cmake/conan" --test-folder "${WORK_DIR}/test_package" --build=missing
        -o "zenflow/*:header_only=${header_only}" -s compiler.cppstd=20
        -c tools.cmake.cmaketoolchain:generator=Ninja -c tools.build:jobs=2
        -c "tools.cmake.cmaketoolchain:extra_variables=${unoptimised}")
  if(NOT conan_out MATCHES "zenflow ([0-9.]+) from Conan: loss [0-9.]+ -> [0-9.]+")
    message(FATAL_ERROR "header_only=${header_only}: test_package did not report its training:\n${conan_out}")
  endif()
  message(STATUS "header_only=${header_only}: ${CMAKE_MATCH_0}")
endforeach()
file(STRINGS "${SOURCE_DIR}/include/zenflow/version.hpp" vlines REGEX "^#define ZENFLOW_VERSION_(MAJOR|MINOR|PATCH) ")
string(REGEX REPLACE ".*MAJOR ([0-9]+).*MINOR ([0-9]+).*PATCH ([0-9]+).*" "\\1.\\2.\\3" header_version "${vlines}")
conan(list "zenflow/*")
if(NOT conan_out MATCHES "zenflow/${header_version}")
  message(FATAL_ERROR "the Conan package's version is not version.hpp's ${header_version}:\n${conan_out}")
endif()
message(STATUS "zenflow/${header_version} in the Conan cache")
