// How a trainer hands its parameters to the optimizer: raw device buffers plus shape, layout and
// number formats.
#pragma once

#include <cstddef>
#include <cstdint>

#include "detail/macros.hpp"
#include "numeric.hpp"

namespace zenflow {

// Storage order of a matrix parameter (rows = output features, cols = input features).
enum class matrix_layout : std::uint8_t {
  column_contiguous = 0,  // [cols][rows]: a column is contiguous (the fast path)
  row_major = 1,          // [rows][cols]: PyTorch's default
};

// Offset of element (row i, column c).
ZF_HD constexpr std::size_t element_offset(matrix_layout l, std::size_t rows, std::size_t cols,
                                     std::size_t i, std::size_t c) noexcept {
  return l == matrix_layout::column_contiguous ? c * rows + i : i * cols + c;
}

struct matrix_param {
  void* param = nullptr;        // device buffer, rows*cols elements of param_type
  const void* grad = nullptr;   // device buffer, rows*cols elements of grad_type
  std::size_t rows = 0, cols = 0;
  dtype param_type = dtype::f32;
  dtype grad_type = dtype::f32;
  matrix_layout layout = matrix_layout::column_contiguous;
};

struct vector_param {
  void* param = nullptr;
  const void* grad = nullptr;
  std::size_t n = 0;
  dtype param_type = dtype::f32;
  dtype grad_type = dtype::f32;
};

}  // namespace zenflow
