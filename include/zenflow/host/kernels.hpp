// Host kernels: AdamW (fp32 master and moments, gradient in fp32/bf16/fp16, optional rounded
// copy of the new params), gradient accumulation and dtype conversion. Vectorised with xsimd,
// split across the threads of a caller-owned oneTBB task_arena.
//
// Two ways to get the ISA-specific code (README, "Host kernels and ISA dispatch"):
//  - linking the CMake target zenflow::zenflow defines ZENFLOW_HOST_DISPATCH: the kernels come
//    from a small library with one translation unit per tier (SSE2, AVX2, AVX-512, AVX-512
//    with BF16), and the best tier the running CPU supports is picked at run time;
//  - including the headers alone compiles the kernels inline for the ISA this translation unit
//    is compiled for (e.g. -march=x86-64-v3 gives the AVX2 tier).
// Either way every tier returns the same bits, whatever the thread count.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/partitioner.h>
#include <oneapi/tbb/task_arena.h>

#include "../detail/format.hpp"
#include "../detail/fp_env.hpp"
#include "kernel_table.hpp"

#if !defined(ZENFLOW_HOST_DISPATCH)
#  if defined(__CUDACC__)
#    error "zenflow: in a .cu file the host kernels come from the zenflow::host_kernels library: link zenflow::cuda (CMake) or define ZENFLOW_HOST_DISPATCH and link libzenflow_host_kernels"
#  endif
#  include "detail/kernels_impl.hpp"
#endif

namespace zenflow::host {

// Elements per scheduling block: a multiple of every vector width and of a 64-byte cache line,
// so threads never share a written line over a whole aligned array (a column list's blocks may
// start mid-line: shared lines, the same bits). Below serial_below elements one thread is faster.
inline constexpr std::size_t block_elems = 4096;
inline constexpr std::size_t serial_below = std::size_t(1) << 15;

// Runs f(begin, end) over [0, n) split into contiguous per-thread ranges (what every kernel
// here uses; also how to first-touch buffers so their pages sit near the threads using them),
// with subnormals kept on every thread whatever its flush-to-zero settings (detail/fp_env.hpp).
template <class F>
void parallel_blocks(tbb::task_arena& arena, std::size_t n, const F& f) {
  if (n == 0) return;
  if (n <= serial_below) {
    const ::zenflow::detail::keep_subnormals ieee;
    return f(std::size_t(0), n);
  }
  const std::size_t blocks = (n + block_elems - 1) / block_elems;
  // static_partitioner: one contiguous range per thread, the same split on every call, so each
  // thread streams its own part of memory and repeated calls find it in the same place.
  arena.execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<std::size_t>(0, blocks),
        [&](const tbb::blocked_range<std::size_t>& r) {
          const ::zenflow::detail::keep_subnormals ieee;
          f(r.begin() * block_elems, std::min(n, r.end() * block_elems));
        },
        tbb::static_partitioner{});
  });
}

// Copies n pieces of `bytes` bytes each, piece k from src(k) to dst(k) (no destination may
// overlap another piece's source or destination), split over the arena's threads once there
// are serial_copy_below bytes or more: moving columns between a contiguous staging area and
// their places in a matrix's arrays, which one thread does at a fraction of the memory's
// bandwidth (a reselection moves every column that changes sides so, three arrays each).
inline constexpr std::size_t serial_copy_below = std::size_t(1) << 18;
template <class Dst, class Src>
void copy_pieces(tbb::task_arena& arena, std::size_t n, std::size_t bytes, const Dst& dst, const Src& src) {
  if (n == 0 || bytes == 0) return;
  auto some = [&](std::size_t k0, std::size_t k1) {
    for (std::size_t k = k0; k < k1; ++k) std::memcpy(dst(k), src(k), bytes);
  };
  if (n == 1 || n * bytes < serial_copy_below || arena.max_concurrency() < 2) return some(0, n);
  arena.execute([&] {
    tbb::parallel_for(
        tbb::blocked_range<std::size_t>(0, n), [&](const tbb::blocked_range<std::size_t>& r) { some(r.begin(), r.end()); },
        tbb::static_partitioner{});
  });
}

namespace detail {

[[noreturn]] inline void fail(const std::string& what) {
  throw std::invalid_argument("zenflow: " + what);
}

inline void check_buffer(const void* p, dtype t, const char* name) {
  if (!p) fail(std::string(name) + " is null");
  if (reinterpret_cast<std::uintptr_t>(p) % size_of(t) != 0)
    fail(std::string(name) + " is not aligned to its element size (" +
         std::to_string(size_of(t)) + " bytes)");
}

// A column list naming a column twice would have two threads update it at once (and count it
// twice): refused. Free for an ascending list (the optimizer's); another is sorted in a copy.
inline void check_distinct(const std::uint32_t* cols, std::size_t n) {
  bool ascending = true;
  for (std::size_t c = 1; c < n && ascending; ++c) ascending = cols[c] > cols[c - 1];
  if (ascending) return;
  std::vector<std::uint32_t> sorted(cols, cols + n);
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) fail("a column is listed twice");
}

struct extent {
  const void* p;
  std::size_t bytes;
  const char* name;
  bool written;
};
// Written buffers must not overlap anything else (a silent wrong answer otherwise).
inline void check_disjoint(std::initializer_list<extent> xs) {
  for (auto a = xs.begin(); a != xs.end(); ++a)
    for (auto b = a + 1; b != xs.end(); ++b) {
      if (!a->p || !b->p || !(a->written || b->written)) continue;
      const auto a0 = reinterpret_cast<std::uintptr_t>(a->p), b0 = reinterpret_cast<std::uintptr_t>(b->p);
      if (a0 < b0 + b->bytes && b0 < a0 + a->bytes)
        fail(std::string(a->name) + " and " + b->name + " overlap");
    }
}

inline bool finite(float x) noexcept { return x - x == 0.0f; }

inline void check_hyper(const adamw_hyper& h) {
  if (!finite(h.lr) || h.lr < 0) fail("lr must be finite and >= 0, got " + ::zenflow::detail::exact(h.lr));
  if (!(h.beta1 >= 0 && h.beta1 < 1)) fail("beta1 must be in [0, 1), got " + ::zenflow::detail::exact(h.beta1));
  if (!(h.beta2 >= 0 && h.beta2 < 1)) fail("beta2 must be in [0, 1), got " + ::zenflow::detail::exact(h.beta2));
  if (!finite(h.eps) || !(h.eps > 0)) fail("eps must be finite and > 0, got " + ::zenflow::detail::exact(h.eps));
  if (!finite(h.weight_decay) || h.weight_decay < 0)
    fail("weight_decay must be finite and >= 0, got " + ::zenflow::detail::exact(h.weight_decay));
  if (h.mode != adam_mode::adamw && h.mode != adam_mode::classic) fail("unknown adam_mode");
}

inline void check_dtype(dtype t, const char* name) {
  if (t != dtype::f32 && t != dtype::bf16 && t != dtype::f16) fail(std::string("unknown dtype of ") + name);
}

inline std::size_t checked_elems(std::size_t rows, std::size_t cols) {
  if (cols != 0 && rows > std::numeric_limits<std::size_t>::max() / 4 / cols)
    fail("rows * cols overflows");
  return rows * cols;
}


// sum_in_rank_order's arithmetic without its argument checks, for a caller that has made them
// (mpi_communicator: its own buffers, and the caller's data between two collectives, where a
// throw on one rank would leave the others waiting).
inline void sum_in_rank_order_unchecked(tbb::task_arena* arena, const void* pieces, dtype t, std::size_t ranks,
                                        std::size_t n, bool mean, void* out, const kernel_table& k) {
  if (n == 0 || ranks == 0) return;
  const std::size_t es = size_of(t);
  const auto* in = static_cast<const unsigned char*>(pieces);
  auto* to = static_cast<unsigned char*>(out);
  const float div = float(ranks);
  auto range = [&](std::size_t b, std::size_t e) {
    constexpr std::size_t chunk = 1024;
    alignas(64) float acc[chunk];
    for (std::size_t c = b; c < e; c += chunk) {
      const std::size_t len = std::min(chunk, e - c);
      k.convert({in + c * es, t, acc, dtype::f32}, 0, len);
      // (the accumulate kernel: acc + x * 1, which is acc + x, widened and added on the tier's
      // vectors whatever this file's compile flags)
      for (std::size_t r = 1; r < ranks; ++r) k.accumulate({acc, in + (r * n + c) * es, t, 1.0f}, 0, len);
      if (mean)
        for (std::size_t i = 0; i < len; ++i) acc[i] /= div;
      k.convert({acc, dtype::f32, to + c * es, t}, 0, len);
    }
  };
  if (arena) {
    parallel_blocks(*arena, n, range);
  } else {
    const ::zenflow::detail::keep_subnormals ieee;
    range(0, n);
  }
}
}  // namespace detail

#if defined(ZENFLOW_HOST_DISPATCH)
inline namespace dispatched {
// Defined by the zenflow_host_kernels library: the table of a tier, or nullptr if not built.
const kernel_table* library_table(isa t) noexcept;
// (internal) the table of a built tier, or nullptr
inline const kernel_table* built_table(isa t) noexcept { return library_table(t); }
#else
inline namespace header_only {
// (internal) the table of a built tier, or nullptr
inline const kernel_table* built_table(isa t) noexcept {
  static constexpr kernel_table scalar = detail::make_table<isa::scalar>();
  static constexpr kernel_table native = detail::make_table<compiled_isa>();
  if (t == isa::scalar) return &scalar;
  if (t == compiled_isa) return &native;
  return nullptr;
}
#endif

// A tier is available when it was built and the running CPU supports it. Asked once per tier:
// CPUID is slow (under a hypervisor it traps), and every kernel call asks.
inline bool available(isa t) noexcept {
  static const std::array<bool, std::size(all_isas)> ok = [] {
    std::array<bool, std::size(all_isas)> r{};
    for (isa u : all_isas) r[std::size_t(u)] = built_table(u) && cpu_supports(u);
    return r;
  }();
  const auto i = std::size_t(t);
  return i < ok.size() && ok[i];
}

inline isa best_isa() noexcept {
  static const isa best = [] {
    for (auto t = std::rbegin(all_isas); t != std::rend(all_isas); ++t)
      if (available(*t)) return *t;
    return isa::scalar;
  }();
  return best;
}

inline const kernel_table& kernels(isa t) {
  if (!available(t))
    throw std::invalid_argument("zenflow: host ISA tier '" + std::string(name_of(t)) +
                                "' is not available (not built, or not supported by this CPU)");
  return *built_table(t);
}

// One AdamW step over a column-contiguous [cols][rows] block (a flat buffer: rows = n, cols = 1).
// Column c uses Adam count counts[c] + 1 for its bias correction, and counts[c] is incremented.
// With job.columns (a list of `ncols` distinct column indices < cols, in any order; a repeated
// one is refused), only those columns are updated; otherwise ncols = cols. Bad arguments throw std::invalid_argument before anything is
// written. Empty blocks do nothing.
inline void adamw(tbb::task_arena& arena, const adamw_job& job, std::size_t cols,
                  std::uint32_t* counts, isa tier = best_isa(), std::size_t ncols = ~std::size_t(0)) {
  using namespace detail;
  if (!job.columns) ncols = cols;
  else if (ncols > cols) fail("ncols must be given and <= cols with a column list");
  const std::size_t total = checked_elems(job.rows, cols);
  const std::size_t n = job.rows * ncols;
  if (n == 0) return;
  const kernel_table& k = kernels(tier);
  check_hyper(job.hyper);
  check_dtype(job.grad_type, "grad");
  if (!finite(job.grad_mul)) fail("grad_mul must be finite");
  if (!finite(job.grad_div) || !(job.grad_div > 0)) fail("grad_div must be finite and > 0");
  check_buffer(job.param, dtype::f32, "param");
  check_buffer(job.exp_avg, dtype::f32, "exp_avg");
  check_buffer(job.exp_avg_sq, dtype::f32, "exp_avg_sq");
  check_buffer(job.grad, job.grad_type, "grad");
  if (job.param_copy) {
    check_dtype(job.copy_type, "param_copy");
    check_buffer(job.param_copy, job.copy_type, "param_copy");
  }
  if (!counts) fail("counts is null");
  check_disjoint({{job.param, 4 * total, "param", true},
                  {job.exp_avg, 4 * total, "exp_avg", true},
                  {job.exp_avg_sq, 4 * total, "exp_avg_sq", true},
                  {job.grad, size_of(job.grad_type) * total, "grad", false},
                  {job.param_copy, size_of(job.copy_type) * total, "param_copy", true},
                  {counts, 4 * cols, "counts", true}});
  auto column = [&](std::size_t c) -> std::size_t { return job.columns ? job.columns[c] : c; };
  for (std::size_t c = 0; c < ncols; ++c) {
    if (column(c) >= cols) fail("column index out of range");
    if (counts[column(c)] == std::numeric_limits<std::uint32_t>::max()) fail("an Adam step count would overflow");
  }
  if (job.columns) check_distinct(job.columns, ncols);
  adamw_job j = job;
  j.counts = counts;
  parallel_blocks(arena, n, [&](std::size_t b, std::size_t e) { k.adamw(j, b, e); });
  for (std::size_t c = 0; c < ncols; ++c) ++counts[column(c)];
}

// acc[i] += grad[i] * factor, for i < n. With job.columns: n = rows * (number of listed
// columns), grad holds those columns one after another, and acc is a [cols][rows] block (cols
// given, every listed index < cols).
inline void accumulate(tbb::task_arena& arena, const accumulate_job& job, std::size_t n,
                       isa tier = best_isa(), std::size_t cols = 0) {
  using namespace detail;
  if (n == 0) return;
  if (job.columns) {
    if (job.rows == 0 || n % job.rows != 0) fail("n must be a multiple of rows with a column list");
    for (std::size_t c = 0; c < n / job.rows; ++c)
      if (job.columns[c] >= cols) fail("column index out of range");
    check_distinct(job.columns, n / job.rows);
  }
  const kernel_table& k = kernels(tier);
  check_dtype(job.grad_type, "grad");
  if (!finite(job.factor)) fail("factor must be finite");
  check_buffer(job.acc, dtype::f32, "acc");
  check_buffer(job.grad, job.grad_type, "grad");
  checked_elems(n, 1);
  const std::size_t acc_n = job.columns ? checked_elems(job.rows, cols) : n;
  check_disjoint({{job.acc, 4 * acc_n, "acc", true}, {job.grad, size_of(job.grad_type) * n, "grad", false}});
  parallel_blocks(arena, n, [&](std::size_t b, std::size_t e) { k.accumulate(job, b, e); });
}

// dst[i] = src[i] converted, for i < n (round to nearest even when narrowing).
inline void convert(tbb::task_arena& arena, const convert_job& job, std::size_t n,
                    isa tier = best_isa()) {
  using namespace detail;
  if (n == 0) return;
  const kernel_table& k = kernels(tier);
  check_dtype(job.src_type, "src");
  check_dtype(job.dst_type, "dst");
  check_buffer(job.src, job.src_type, "src");
  check_buffer(job.dst, job.dst_type, "dst");
  checked_elems(n, 1);
  check_disjoint({{job.src, size_of(job.src_type) * n, "src", false},
                  {job.dst, size_of(job.dst_type) * n, "dst", true}});
  parallel_blocks(arena, n, [&](std::size_t b, std::size_t e) { k.convert(job, b, e); });
}

// The data-parallel reduction's arithmetic over `ranks` pieces of n elements of dtype t lying
// one after the other at `pieces`: out[i] = ((x_0[i] + x_1[i]) + x_2[i]) + ... in fp32 over the
// widened values (exact), divided by `ranks` when `mean`, then rounded to t (nearest even) — the
// arithmetic of ::zenflow::detail::reduce_in_rank_order, rounded as the optimizer rounds an fp32
// result. Element by element, in chunks that stay in the first-level cache, the additions on the
// tier's vectors, split across the arena's threads or on the calling thread alone when arena is
// null: the same bits either way (subnormals kept on either, whatever flush-to-zero settings
// the threads have: detail/fp_env.hpp).
// out must not overlap the pieces.
inline void sum_in_rank_order(tbb::task_arena* arena, const void* pieces, dtype t, std::size_t ranks,
                              std::size_t n, bool mean, void* out, isa tier = best_isa()) {
  using namespace detail;
  if (n == 0) return;
  if (ranks == 0) fail("sum_in_rank_order of no pieces");
  const kernel_table& k = kernels(tier);
  check_dtype(t, "the pieces");
  check_buffer(pieces, t, "pieces");
  check_buffer(out, t, "out");
  const std::size_t es = size_of(t);
  check_disjoint({{pieces, es * checked_elems(n, ranks), "pieces", false}, {out, es * checked_elems(n, 1), "out", true}});
  sum_in_rank_order_unchecked(arena, pieces, t, ranks, n, mean, out, k);
}

}  // inline namespace
}  // namespace zenflow::host
