# zenflow_host_kernels: the host kernels compiled once per ISA tier, each translation unit with
# that tier's flags only, plus a dispatch table. Linking it (through zenflow::zenflow) defines
# ZENFLOW_HOST_DISPATCH, which switches kernels.hpp from inline code to runtime dispatch.

set(_zf_tiers scalar)
set(_zf_flags_scalar "")
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64|i.86)$"
   AND CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  list(APPEND _zf_tiers sse2 avx2 avx512)
  set(_zf_flags_sse2 "-msse2")
  set(_zf_flags_avx2 "-mavx2;-mf16c")
  # GCC 12 warns falsely about _mm512_undefined_ps inside its own avx512fintrin.h.
  set(_zf_flags_avx512 "-mavx512f;-mavx512cd;-mavx512dq;-mavx512bw;-mf16c")
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    list(APPEND _zf_flags_avx512 "-Wno-maybe-uninitialized;-Wno-uninitialized")
  endif()
  # AVX-512 BF16 (GCC 10, Clang 9 and later): the bf16 rounding in one instruction.
  include(CheckCXXCompilerFlag)
  check_cxx_compiler_flag(-mavx512bf16 ZENFLOW_CXX_HAS_MAVX512BF16)
  if(ZENFLOW_CXX_HAS_MAVX512BF16)
    list(APPEND _zf_tiers avx512_bf16)
    set(_zf_flags_avx512_bf16 ${_zf_flags_avx512} -mavx512bf16)
  endif()
endif()

set(_zf_gen "${CMAKE_CURRENT_BINARY_DIR}/zenflow_host_kernels")
set(_zf_sources "")
set(ZF_TIER_DECLS "")
set(ZF_TIER_CASES "")
foreach(ZF_TIER IN LISTS _zf_tiers)
  configure_file("${CMAKE_CURRENT_LIST_DIR}/host_kernels_tier.cpp.in" "${_zf_gen}/tier_${ZF_TIER}.cpp" @ONLY)
  set_source_files_properties("${_zf_gen}/tier_${ZF_TIER}.cpp" PROPERTIES
    COMPILE_OPTIONS "${_zf_flags_${ZF_TIER}}")
  list(APPEND _zf_sources "${_zf_gen}/tier_${ZF_TIER}.cpp")
  string(APPEND ZF_TIER_DECLS "extern const kernel_table tier_table_${ZF_TIER};\n")
  string(APPEND ZF_TIER_CASES "    case isa::${ZF_TIER}: return &detail::tier_table_${ZF_TIER};\n")
endforeach()
configure_file("${CMAKE_CURRENT_LIST_DIR}/host_kernels_dispatch.cpp.in" "${_zf_gen}/dispatch.cpp" @ONLY)
list(APPEND _zf_sources "${_zf_gen}/dispatch.cpp")

add_library(zenflow_host_kernels STATIC ${_zf_sources})
add_library(zenflow::host_kernels ALIAS zenflow_host_kernels)
set_target_properties(zenflow_host_kernels PROPERTIES
  EXPORT_NAME host_kernels
  POSITION_INDEPENDENT_CODE ON
  CXX_EXTENSIONS OFF)
target_compile_features(zenflow_host_kernels PUBLIC cxx_std_20)
target_compile_definitions(zenflow_host_kernels PUBLIC ZENFLOW_HOST_DISPATCH=1)
target_include_directories(zenflow_host_kernels PRIVATE "${PROJECT_SOURCE_DIR}/include")
target_link_libraries(zenflow_host_kernels PRIVATE TBB::tbb xsimd)
# The kernels' optimisation level, whatever the build type (optimised even in a consumer's Debug
# build); never -ffast-math. -O1 and -O2 are for test builds (under AddressSanitizer the tiers
# compile in half the time at -O1 than at -O3): that the tier objects share no code, which a
# library shipped to other CPUs needs, is checked at -O3 only (tests/host_kernels_symbols.cmake).
set(ZENFLOW_HOST_KERNELS_OPT "-O3" CACHE STRING "Optimisation level of the host kernels library (-O3; -O1, -O2 for test builds)")
set_property(CACHE ZENFLOW_HOST_KERNELS_OPT PROPERTY STRINGS -O1 -O2 -O3)
mark_as_advanced(ZENFLOW_HOST_KERNELS_OPT)
if(NOT ZENFLOW_HOST_KERNELS_OPT MATCHES "^-O[123]$")
  message(FATAL_ERROR "ZENFLOW_HOST_KERNELS_OPT is '${ZENFLOW_HOST_KERNELS_OPT}': -O1, -O2 or -O3")
endif()
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  target_compile_options(zenflow_host_kernels PRIVATE ${ZENFLOW_HOST_KERNELS_OPT} -fno-math-errno)
endif()
