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

// -ffinite-math-only (which -ffast-math implies) lets the compiler assume no NaN or infinity: it
// folds the finite checks to "true", so a step whose gradients overflowed would be applied and
// corrupt the master weights and moments, silently. Refused unless the trainer says it knows
// (ZENFLOW_ALLOW_FINITE_MATH_ONLY: its gradients are never checked then).
#if defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__
#  if defined(ZENFLOW_ALLOW_FINITE_MATH_ONLY)
#    warning "zenflow: -ffinite-math-only (or -ffast-math): NaN/Inf gradients are NOT detected, a step with them is applied"
#  else
#    error "zenflow: built with -ffinite-math-only (or -ffast-math), which removes the NaN/Inf gradient checks; build zenflow's code without it (-fno-finite-math-only), or define ZENFLOW_ALLOW_FINITE_MATH_ONLY to accept unchecked steps"
#  endif
#endif
#if defined(__FAST_MATH__)
#  warning "zenflow: -ffast-math breaks the bit-exact AdamW contract (reassociation)"
#endif
