// zenflow: the umbrella header.
#pragma once

#include "adamw.hpp"
#include "any_optimizer.hpp"
#include "checkpoint.hpp"
#include "config.hpp"
#include "numeric.hpp"
#include "host/isa.hpp"
#include "host/kernel_table.hpp"
#include "host/buffer.hpp"
#include "host/kernels.hpp"
#include "optimizer.hpp"
#include "params.hpp"
#include "version.hpp"

namespace zenflow {
inline constexpr int version_major = 0;
inline constexpr int version_minor = 1;
inline constexpr int version_patch = 0;
}  // namespace zenflow
