// How a trainer hands its parameters to the optimizer: raw device buffers plus shape, layout and
// number formats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

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

namespace detail {
// Columns list[0..n) of a [rows] x [cols] matrix of es-byte elements, packed column after column
// into dst (a [n][rows] block). Host memory on both sides.
inline void gather_columns(const void* src, std::size_t es, matrix_layout layout, std::size_t rows,
                           std::size_t cols, const std::uint32_t* list, std::size_t n, void* dst) noexcept {
  auto* out = static_cast<unsigned char*>(dst);
  const auto* in = static_cast<const unsigned char*>(src);
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t c = list[k];
    if (layout == matrix_layout::column_contiguous) {
      std::memcpy(out + k * rows * es, in + c * rows * es, rows * es);
    } else {
      for (std::size_t i = 0; i < rows; ++i) std::memcpy(out + (k * rows + i) * es, in + (i * cols + c) * es, es);
    }
  }
}

// The inverse: block column k goes to column list[k] of the matrix.
inline void scatter_columns(const void* block, std::size_t es, void* dst, matrix_layout layout, std::size_t rows,
                            std::size_t cols, const std::uint32_t* list, std::size_t n) noexcept {
  const auto* in = static_cast<const unsigned char*>(block);
  auto* out = static_cast<unsigned char*>(dst);
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t c = list[k];
    if (layout == matrix_layout::column_contiguous) {
      std::memcpy(out + c * rows * es, in + k * rows * es, rows * es);
    } else {
      for (std::size_t i = 0; i < rows; ++i) std::memcpy(out + (i * cols + c) * es, in + (k * rows + i) * es, es);
    }
  }
}
}  // namespace detail

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
