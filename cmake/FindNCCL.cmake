# FindNCCL: NVIDIA's collective communication library, for zenflow::nccl.
#
# Looks, in order, in NCCL_ROOT (a CMake or environment variable), the CUDA toolkit's directories,
# the system's, and the `nvidia-nccl-cu13` Python wheel (which ships nccl.h and libnccl.so.2) in
# the virtual environment cmake/install_dependencies.sh makes (under ZENFLOW_TOOLS_DIR, by
# default ~/.cache/zenflow-tools). Defines NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY,
# NCCL_VERSION and the imported target NCCL::NCCL.

set(_zf_nccl_hints "")
foreach(root IN ITEMS "${NCCL_ROOT}" "$ENV{NCCL_ROOT}")
  if(root)
    list(APPEND _zf_nccl_hints "${root}")
  endif()
endforeach()
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _zf_nccl_hints "${CUDAToolkit_LIBRARY_ROOT}")
endif()
set(_zf_tools "$ENV{ZENFLOW_TOOLS_DIR}")
if(NOT _zf_tools)
  set(_zf_tools "$ENV{HOME}/.cache/zenflow-tools")
endif()
file(GLOB _zf_nccl_wheels "${_zf_tools}/venv/lib/python3*/site-packages/nvidia/nccl")
list(APPEND _zf_nccl_hints ${_zf_nccl_wheels})

find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_zf_nccl_hints} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR HINTS ${_zf_nccl_hints} PATH_SUFFIXES lib lib64)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _zf_nccl_defs REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) ")
  foreach(part MAJOR MINOR PATCH)
    string(REGEX MATCH "NCCL_${part} +([0-9]+)" _zf_m "${_zf_nccl_defs}")
    set(_zf_nccl_${part} "${CMAKE_MATCH_1}")
  endforeach()
  set(NCCL_VERSION "${_zf_nccl_MAJOR}.${_zf_nccl_MINOR}.${_zf_nccl_PATCH}")
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES
    IMPORTED_LOCATION "${NCCL_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
