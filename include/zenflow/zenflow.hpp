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
inline constexpr int version_major = ZENFLOW_VERSION_MAJOR;  // version.hpp's, as constants
inline constexpr int version_minor = ZENFLOW_VERSION_MINOR;
inline constexpr int version_patch = ZENFLOW_VERSION_PATCH;
}  // namespace zenflow
