// Portability macros shared by host and device code.
#pragma once

// ZF_HD marks functions that run on the host and, under nvcc, on the device.
#if defined(__CUDACC__)
#  define ZF_HD __host__ __device__
#else
#  define ZF_HD
#endif

// Scalar helpers are forced inline: the per-ISA kernel translation units are compiled with
// different instruction sets, and an out-of-line copy of a shared inline function could be
// merged by the linker with one that uses instructions the running CPU lacks.
#if defined(__CUDACC__)
#  define ZF_FORCEINLINE __forceinline__
#elif defined(__GNUC__) || defined(__clang__)
#  define ZF_FORCEINLINE inline __attribute__((always_inline))
#elif defined(_MSC_VER)
#  define ZF_FORCEINLINE __forceinline
#else
#  define ZF_FORCEINLINE inline
#endif

#if defined(__FAST_MATH__)
#  warning "zenflow: -ffast-math breaks the bit-exact AdamW contract (reassociation, no NaN checks)"
#endif
