// zenflow on a CUDA GPU: cuda_space, its transport and its GpuUpdater. Include from a .cu file
// (compiled by nvcc); then zenflow::optimizer<zenflow::cuda_space> is the paper's system and
// zenflow::zero_offload<zenflow::cuda_space> its baseline.
#pragma once

#include "zenflow.hpp"

#include "cuda/error.hpp"
#include "cuda/memory.hpp"
#include "device_update/cuda_fused_adamw.hpp"
#include "space/cuda_space.hpp"
#include "transport/cuda_pinned.hpp"

namespace zenflow {
template <>
struct default_transport<cuda_space> {
  using type = cuda_pinned;
};
}  // namespace zenflow
