// The definition of zf_create_cuda (<zenflow/c_cuda.h>): compile this header into exactly one
// .cu file (nvcc, C++20), beside c_impl.hpp's translation unit (the zenflow::c_cuda library
// does). The other C functions are c_impl.hpp's, over the same handle.
#pragma once

#include "any_optimizer.hpp"
#include "c_cuda.h"
#include "cuda.hpp"
#include "detail/c_handle.hpp"
#include "detail/c_status.hpp"

extern "C" zf_status zf_create_cuda(const char* kind, const char* config_json, zf_optimizer** out) noexcept {
  using namespace zenflow::c_api;
  if (!out) return fail(ZF_INVALID_ARGUMENT, "zenflow: zf_create_cuda: out is NULL");
  *out = nullptr;
  if (!kind) return fail(ZF_INVALID_ARGUMENT, "zenflow: zf_create_cuda: kind is NULL");
  return guarded([&] {
    *out = new zf_optimizer{zenflow::any_optimizer::create<zenflow::cuda_space>(kind, config_of(config_json)), {}, {}};
  });
}
