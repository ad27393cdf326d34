// The C API's handle and the helpers its definitions share: c_impl.hpp (<zenflow/c.h>) and
// c_mpi_impl.hpp (<zenflow/c_mpi.h>), each compiled into a translation unit of its own, define
// their functions over this one struct (inline here: the same definition in both).
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "../any_optimizer.hpp"
#include "../c.h"
#include "../config.hpp"
#include "c_status.hpp"
#include "json.hpp"

struct zf_optimizer {
  zenflow::any_optimizer opt;
  zenflow::param_group group{};  // of the tensors registered next (zf_set_group)
  std::vector<std::size_t> matrix_sizes;  // rows * cols of each matrix, by id (zf_copy_master's check)
};

namespace zenflow::c_api {

// guarded(f) on a handle: a call that fails and makes the optimizer unusable (it failed midway:
// a step, a background job it met, a load's commit) returns ZF_UNUSABLE, whatever the cause (out
// of memory, an I/O error: the message names it), since what the caller must do next is load a
// checkpoint. (On a handle unusable already, the calls that refuse return ZF_UNUSABLE; a load
// that fails its checks there returns ZF_CHECKPOINT_ERROR, and the handle stays unusable.)
template <class F>
zf_status guarded(const any_optimizer& o, F&& f) noexcept {
  const bool was_usable = o.usable();
  const zf_status s = guarded(std::forward<F>(f));
  if (s == ZF_OK || s == ZF_UNUSABLE || !was_usable || o.usable()) return s;
  error_message& m = last_error();
  try {
    if (!m.fixed) m.text += "; the optimizer is unusable until zf_load succeeds";
  } catch (...) {  // (the cause's message stays as it is)
  }
  return ZF_UNUSABLE;
}

// A collective call's own argument checks (`mine`: ZF_OK, or the status its refusal returned,
// its message set), voted on before the call: data parallel, a rank that refuses its arguments
// must not leave the others waiting in the collective it never joins, so every rank refuses
// (the one at fault with its own message), nothing changed; then f, guarded on the handle. One
// process: mine, or f. (The vote is a collective of its own, and can itself fail.)
template <class F>
zf_status voted(zf_optimizer* h, const char* call, zf_status mine, F&& f) noexcept {
  bool all = false;
  if (const zf_status s = guarded([&] { all = h->opt.all_agree(mine == ZF_OK); }); s != ZF_OK) return s;
  if (mine != ZF_OK) return mine;
  if (!all)  // (ZF_INVALID_ARGUMENT with this message; out of memory building it, ZF_OUT_OF_MEMORY)
    return guarded([&] {
      throw std::invalid_argument(std::string("zenflow: ") + call +
                                  " refused on every rank: another rank refused its arguments (it returned that "
                                  "error); nothing was changed");
    });
  return guarded(h->opt, std::forward<F>(f));
}

inline bool valid_dtype(int t) { return t == ZF_F32 || t == ZF_BF16 || t == ZF_F16; }

inline config config_of(const char* text) {
  if (!text) return config{};
  const detail::json::value doc = detail::json_parse(text);
  if (doc.type == detail::json::kind::object && doc.find("zero_optimization"))
    return detail::config_from_deepspeed_doc(doc, config{});
  return detail::config_from_zenflow_doc(doc, config{});
}

}  // namespace zenflow::c_api
