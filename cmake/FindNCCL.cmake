# FindNCCL: NVIDIA's collective communication library, for zenflow::nccl.
#
# Looks, in order, in NCCL_ROOT (a CMake or environment variable), the CUDA toolkit's directories,
# the system's, and the `nvidia-nccl-cu13` (or -cu12) Python wheel (which ships nccl.h and libnccl.so.2): in
# the virtual environment cmake/install_dependencies.sh makes (under ZENFLOW_TOOLS_DIR, by
# default ~/.cache/zenflow-tools), then wherever the `python3` on PATH imports it from (a
# PyTorch environment usually has it). Requires NCCL 2.13 or newer (ncclGetLastError).
# Defines NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION and the imported target
# NCCL::NCCL.

set(_zf_nccl_hints "")
foreach(root IN ITEMS "${NCCL_ROOT}" "$ENV{NCCL_ROOT}")
  if(root)
    list(APPEND _zf_nccl_hints "${root}")
  endif()
endforeach()
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _zf_nccl_hints "${CUDAToolkit_LIBRARY_ROOT}")
endif()
# (the wheels come after the system's directories: a second search, below, which runs only when
# the first found nothing; CMake searches HINTS before the system's paths)
set(_zf_nccl_wheel_hints "")
set(_zf_tools "$ENV{ZENFLOW_TOOLS_DIR}")
if(NOT _zf_tools)
  set(_zf_tools "$ENV{HOME}/.cache/zenflow-tools")
endif()
file(GLOB _zf_nccl_wheels "${_zf_tools}/venv/lib/python3*/site-packages/nvidia/nccl")
list(APPEND _zf_nccl_wheel_hints ${_zf_nccl_wheels})
# the wheel in the active Python's environment (nvidia.nccl is a namespace package: its __path__)
find_program(_zf_nccl_python NAMES python3)
mark_as_advanced(_zf_nccl_python)
if(_zf_nccl_python)
  execute_process(COMMAND "${_zf_nccl_python}" -c "import nvidia.nccl as m; print(list(m.__path__)[0])"
                  OUTPUT_VARIABLE _zf_nccl_py_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
                  RESULT_VARIABLE _zf_nccl_py_rc TIMEOUT 30)
  if(_zf_nccl_py_rc EQUAL 0 AND IS_DIRECTORY "${_zf_nccl_py_dir}")
    list(APPEND _zf_nccl_wheel_hints "${_zf_nccl_py_dir}")
  endif()
endif()

find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_zf_nccl_hints} PATH_SUFFIXES include)
if(NOT NCCL_INCLUDE_DIR)
  unset(NCCL_INCLUDE_DIR CACHE)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_zf_nccl_wheel_hints} PATH_SUFFIXES include NO_DEFAULT_PATH)
endif()
# (the library from where the header is, first: a system header with a wheel's library would
# be two versions)
get_filename_component(_zf_nccl_home "${NCCL_INCLUDE_DIR}" DIRECTORY)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS "${_zf_nccl_home}" ${_zf_nccl_hints}
             PATH_SUFFIXES lib lib64)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _zf_nccl_defs REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  foreach(part MAJOR MINOR PATCH)
    string(REGEX MATCH "NCCL_${part} +([0-9]+)" _zf_m "${_zf_nccl_defs}")
    set(_zf_nccl_${part} "${CMAKE_MATCH_1}")
  endforeach()
  set(NCCL_VERSION "${_zf_nccl_MAJOR}.${_zf_nccl_MINOR}.${_zf_nccl_PATCH}")
endif()

include(FindPackageHandleStandardArgs)
# (an older NCCL is reported as not found, with its version, rather than failing the compile)
set(_zf_nccl_new_enough TRUE)
set(_zf_nccl_why "")
if(NCCL_VERSION AND NCCL_VERSION VERSION_LESS 2.13)
  set(_zf_nccl_new_enough FALSE)
  set(_zf_nccl_why "NCCL ${NCCL_VERSION} in ${NCCL_INCLUDE_DIR} is older than 2.13, which zenflow::nccl needs")
endif()
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR _zf_nccl_new_enough
                                  VERSION_VAR NCCL_VERSION REASON_FAILURE_MESSAGE "${_zf_nccl_why}")

if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
