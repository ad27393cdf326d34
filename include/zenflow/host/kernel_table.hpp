// The type-erased interface between the host drivers (kernels.hpp, compiled with the user's
// flags) and the per-ISA kernel bodies (compiled once per tier). One call processes the element
// range [begin, end) of a job; the drivers split jobs across threads.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../adamw.hpp"
#include "../numeric.hpp"
#include "isa.hpp"

namespace zenflow::host {

// AdamW over a column-contiguous block: element i belongs to column i / rows, whose Adam count
// before this update is counts[i / rows]. A flat buffer is one column of rows = n.
// With a column list, logical column c is the block's column columns[c] (every array, counts
// included, is indexed physically), so a call can update any subset of a matrix's columns.
struct adamw_job {
  float* param = nullptr;        // fp32 master, updated in place
  float* exp_avg = nullptr;      // m, in place
  float* exp_avg_sq = nullptr;   // v, in place
  const void* grad = nullptr;    // grad_type elements
  dtype grad_type = dtype::f32;
  void* param_copy = nullptr;    // optional: the updated param also written as copy_type
  dtype copy_type = dtype::bf16;
  std::size_t rows = 0;
  const std::uint32_t* counts = nullptr;
  const std::uint32_t* columns = nullptr;  // optional column list
  adamw_hyper hyper{};
  float grad_mul = 1.0f;         // g = grad * grad_mul ...
  float grad_div = 1.0f;         // ... / grad_div (1 = no division)
};

// acc += grad * factor, acc fp32. With a column list, the gradient is compact (logical column c
// at c * rows) and lands in column columns[c] of acc (a column-contiguous block of `rows`).
struct accumulate_job {
  float* acc = nullptr;
  const void* grad = nullptr;
  dtype grad_type = dtype::f32;
  float factor = 1.0f;
  std::size_t rows = 0;                    // with columns only
  const std::uint32_t* columns = nullptr;  // optional column list
};

// dst = src, converted (round to nearest even when narrowing).
struct convert_job {
  const void* src = nullptr;
  dtype src_type = dtype::f32;
  void* dst = nullptr;
  dtype dst_type = dtype::bf16;
};

struct kernel_table {
  isa tier;
  void (*adamw)(const adamw_job&, std::size_t begin, std::size_t end) noexcept;
  void (*accumulate)(const accumulate_job&, std::size_t begin, std::size_t end) noexcept;
  void (*convert)(const convert_job&, std::size_t begin, std::size_t end) noexcept;
  // Memory-only twins with the same loads and stores and no arithmetic: the measured roofline
  // the benchmarks compare against (bench/cpu_adam).
  void (*adamw_traffic)(const adamw_job&, std::size_t begin, std::size_t end) noexcept;
  void (*accumulate_traffic)(const accumulate_job&, std::size_t begin, std::size_t end) noexcept;
};

}  // namespace zenflow::host
