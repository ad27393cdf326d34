// The definitions of zenflow's C API (<zenflow/c.h>): compile this header into exactly one C++
// file (the zenflow::c library does; without CMake, include it in a .cpp of your own). Each
// function catches every exception and turns it into a status code and a thread-local message.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "any_optimizer.hpp"
#include "c.h"
#include "config.hpp"
#include "detail/c_handle.hpp"
#include "detail/c_status.hpp"
#include "version.hpp"

#define ZF_C_HANDLE(opt)                                                                \
  if (!(opt)) return ::zenflow::c_api::fail(ZF_INVALID_ARGUMENT, "zenflow: the optimizer handle is NULL")

extern "C" {

zf_status zf_create(const char* kind, const char* config_json, zf_optimizer** out) noexcept {
  using namespace zenflow::c_api;
  if (!out) return fail(ZF_INVALID_ARGUMENT, "zenflow: zf_create: out is NULL");
  *out = nullptr;
  if (!kind) return fail(ZF_INVALID_ARGUMENT, "zenflow: zf_create: kind is NULL");
  return guarded([&] {
    *out = new zf_optimizer{zenflow::any_optimizer::create(kind, config_of(config_json)), {}, {}};
  });
}

void zf_destroy(zf_optimizer* opt) noexcept { delete opt; }  // ~optimizer never throws

zf_status zf_add_matrix(zf_optimizer* opt, void* param, const void* grad, size_t rows, size_t cols, int param_type,
                        int grad_type, int layout, size_t* id_out) noexcept {
  using namespace zenflow::c_api;
  ZF_C_HANDLE(opt);
  if (!valid_dtype(param_type) || !valid_dtype(grad_type)) return fail(ZF_INVALID_ARGUMENT, "zenflow: zf_add_matrix: unknown dtype");
  if (layout != ZF_COLUMN_CONTIGUOUS && layout != ZF_ROW_MAJOR)
    return fail(ZF_INVALID_ARGUMENT, "zenflow: zf_add_matrix: unknown layout");
  return guarded([&] {
    const zenflow::matrix_param p = zenflow::matrix(param, grad, zenflow::rows{rows}, zenflow::cols{cols})
                                        .with_layout(zenflow::matrix_layout(layout))
                                        .dtypes(zenflow::dtype(param_type), zenflow::dtype(grad_type))
                                        .group(opt->group);
    zenflow::detail::room_for_one(opt->matrix_sizes);  // (the push below cannot fail; geometric: N adds, O(N))
    const zenflow::matrix_id id = opt->opt.add_matrix(p);
    opt->matrix_sizes.push_back(rows * cols);  // (add_matrix refused a product that overflows)
    if (id_out) *id_out = id.index();
  });
}

zf_status zf_add_vector(zf_optimizer* opt, void* param, const void* grad, size_t n, int param_type, int grad_type,
                        size_t* id_out) noexcept {
  using namespace zenflow::c_api;
  ZF_C_HANDLE(opt);
  if (!valid_dtype(param_type) || !valid_dtype(grad_type)) return fail(ZF_INVALID_ARGUMENT, "zenflow: zf_add_vector: unknown dtype");
  return guarded([&] {
    const zenflow::vector_id id =
        opt->opt.add_vector(zenflow::vector(param, grad, n)
                                .dtypes(zenflow::dtype(param_type), zenflow::dtype(grad_type))
                                .group(opt->group));
    if (id_out) *id_out = id.index();
  });
}

zf_status zf_set_group(zf_optimizer* opt, const char* name) noexcept {
  ZF_C_HANDLE(opt);
  return zenflow::c_api::guarded([&] {
    opt->group = name ? opt->opt.get_config().group(name) : zenflow::param_group{};
  });
}

zf_status zf_initialize(zf_optimizer* opt) noexcept {
  ZF_C_HANDLE(opt);
  return zenflow::c_api::guarded(opt->opt, [&] { opt->opt.initialize(); });
}

zf_status zf_step(zf_optimizer* opt, float grad_scale, int* applied) noexcept {
  ZF_C_HANDLE(opt);
  return zenflow::c_api::guarded(opt->opt, [&] {
    const zenflow::step_info info = opt->opt.step(grad_scale);
    if (applied) *applied = info.skipped ? 0 : 1;
  });
}

zf_status zf_initialize_on_stream(zf_optimizer* opt, void* stream) noexcept {
  ZF_C_HANDLE(opt);
  return zenflow::c_api::guarded(opt->opt, [&] { opt->opt.initialize(stream); });
}

zf_status zf_step_on_stream(zf_optimizer* opt, void* stream, float grad_scale, int* applied) noexcept {
  ZF_C_HANDLE(opt);
  return zenflow::c_api::guarded(opt->opt, [&] {
    const zenflow::step_info info = opt->opt.step(stream, grad_scale);
    if (applied) *applied = info.skipped ? 0 : 1;
  });
}

zf_status zf_synchronize(zf_optimizer* opt) noexcept {
  ZF_C_HANDLE(opt);
  return zenflow::c_api::guarded(opt->opt, [&] { opt->opt.synchronize(); });
}

zf_status zf_set_lr(zf_optimizer* opt, float lr) noexcept {
  ZF_C_HANDLE(opt);
  return zenflow::c_api::guarded([&] { opt->opt.set_lr(lr); });
}

int zf_version(void) noexcept { return ZENFLOW_VERSION; }

zf_status zf_stats_get(const zf_optimizer* opt, zf_stats* out, size_t out_size) noexcept {
  using namespace zenflow::c_api;
  // The fields of 0.1.0 stay where they are; later ones are appended.
  static_assert(offsetof(zf_stats, reduce_seconds) + sizeof(double) == ZF_STATS_SIZE_0_1);
  static_assert(sizeof(zf_stats) >= ZF_STATS_SIZE_0_1);
  ZF_C_HANDLE(opt);
  if (!out) return fail(ZF_INVALID_ARGUMENT, "zenflow: zf_stats_get: out is NULL");
  if (out_size < ZF_STATS_SIZE_0_1)
    return fail(ZF_INVALID_ARGUMENT, "zenflow: zf_stats_get: out_size is smaller than any zf_stats (pass sizeof(zf_stats))");
  return guarded([&] {
    const zenflow::optimizer_stats s = opt->opt.stats();
    // (designated: a field moved in c.h fails to compile here rather than fill the wrong one)
    const zf_stats all{.steps = s.steps,
                       .skipped_steps = s.skipped_steps,
                       .selections = s.selections,
                       .host_updates = s.host_updates,
                       .bytes_to_host = s.bytes_to_host,
                       .bytes_to_device = s.bytes_to_device,
                       .stall_seconds = s.stall_seconds,
                       .host_update_seconds = s.host_update_seconds,
                       .host_pageable_bytes = s.host_pageable_bytes,
                       .host_pinned_bytes = s.host_pinned_bytes,
                       .device_bytes = s.device_bytes,
                       .host_bookkeeping_bytes = s.host_bookkeeping_bytes,
                       .bytes_uploaded_ahead = s.bytes_uploaded_ahead,
                       .bytes_reduced = s.bytes_reduced,
                       .bytes_gathered = s.bytes_gathered,
                       .reduce_seconds = s.reduce_seconds};
    // Only the caller's bytes: an older header's zf_stats is a prefix of this one, and a newer
    // header's fields past this one read as zero.
    auto* bytes = reinterpret_cast<unsigned char*>(out);
    const std::size_t known = std::min(out_size, sizeof(zf_stats));
    std::memcpy(bytes, &all, known);
    std::memset(bytes + known, 0, out_size - known);
  });
}

zf_status zf_copy_master(zf_optimizer* opt, size_t id, float* out, size_t out_count) noexcept {
  using namespace zenflow::c_api;
  ZF_C_HANDLE(opt);
  // (data parallel, a collective: the arguments voted on first; an id out of range and a bad out
  // are copy_master's to name, in its own vote)
  zf_status mine = ZF_OK;
  if (id < opt->matrix_sizes.size() && out_count != opt->matrix_sizes[id])
    mine = guarded([&] {
      throw std::invalid_argument("zenflow: zf_copy_master: out holds " + std::to_string(out_count) +
                                  " floats, matrix " + std::to_string(id) + " has " +
                                  std::to_string(opt->matrix_sizes[id]) + " (rows * cols); nothing was written");
    });
  return voted(opt, "zf_copy_master", mine, [&] { opt->opt.copy_master(zenflow::matrix_id{id}, out); });
}

zf_status zf_save(zf_optimizer* opt, const char* path) noexcept {
  using namespace zenflow::c_api;
  ZF_C_HANDLE(opt);
  const zf_status mine = path ? ZF_OK : fail(ZF_INVALID_ARGUMENT, "zenflow: zf_save: path is NULL");
  return voted(opt, "zf_save", mine, [&] { opt->opt.save(path); });
}

zf_status zf_load(zf_optimizer* opt, const char* path) noexcept {
  using namespace zenflow::c_api;
  ZF_C_HANDLE(opt);
  const zf_status mine = path ? ZF_OK : fail(ZF_INVALID_ARGUMENT, "zenflow: zf_load: path is NULL");
  return voted(opt, "zf_load", mine, [&] { opt->opt.load(path); });
}

const char* zf_last_error(void) noexcept { return zenflow::c_api::last_error().c_str(); }

const char* zf_status_string(int status) noexcept {
  switch (status) {
    case ZF_OK: return "ZF_OK";
    case ZF_INVALID_ARGUMENT: return "ZF_INVALID_ARGUMENT";
    case ZF_CHECKPOINT_ERROR: return "ZF_CHECKPOINT_ERROR";
    case ZF_IO_ERROR: return "ZF_IO_ERROR";
    case ZF_OUT_OF_MEMORY: return "ZF_OUT_OF_MEMORY";
    case ZF_UNUSABLE: return "ZF_UNUSABLE";
    case ZF_INTERNAL_ERROR: return "ZF_INTERNAL_ERROR";
    default: return "unknown zf_status";
  }
}

}  // extern "C"

#undef ZF_C_HANDLE
