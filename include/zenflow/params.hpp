// How a trainer hands its parameters to the optimizer: raw device buffers plus shape, layout and
// number formats.
#pragma once

#include <cstddef>
#include <compare>
#include <cstdint>

#include "adamw.hpp"
#include "detail/macros.hpp"
#include "numeric.hpp"

namespace zenflow {

// Storage order of a matrix parameter (rows = output features, cols = input features).
enum class matrix_layout : std::uint8_t {
  column_contiguous = 0,  // [cols][rows]: a column is contiguous (the fast path)
  row_major = 1,          // [rows][cols]: PyTorch's default
};

// One piece of a batched copy between places of a space's device memory: the spaces'
// copy_pieces moves a table of them in one operation (one launch on a GPU, not one call each).
struct copy_piece {
  const void* src = nullptr;
  void* dst = nullptr;
  std::size_t bytes = 0;
};

// Offset of element (row i, column c).
ZF_HD constexpr std::size_t element_offset(matrix_layout l, std::size_t rows, std::size_t cols,
                                     std::size_t i, std::size_t c) noexcept {
  return l == matrix_layout::column_contiguous ? c * rows + i : i * cols + c;
}

// A matrix's two extents as distinct types, so that zenflow::matrix() cannot take them swapped:
// rows are output features, cols input features — a column is what ZenFlow selects. A PyTorch or
// llm.c weight stored [out][in] has rows = out, cols = in, and is row_major.
struct rows {
  constexpr explicit rows(std::size_t count) noexcept : n(count) {}
  std::size_t n;
};
struct cols {
  constexpr explicit cols(std::size_t count) noexcept : n(count) {}
  std::size_t n;
};

// A matrix parameter. Build it with zenflow::matrix() (named extents, chained options) or with
// designated initializers; the plain fields stay public for both.
struct matrix_param {
  void* param = nullptr;        // device buffer, rows*cols elements of param_type
  const void* grad = nullptr;   // device buffer, rows*cols elements of grad_type
  std::size_t rows = 0, cols = 0;
  dtype param_type = dtype::f32;
  dtype grad_type = dtype::f32;
  matrix_layout layout = matrix_layout::column_contiguous;
  // Parameter group: this tensor's lr and weight_decay are the config's times these (0 for
  // weight_decay_scale exempts it from decay, as trainers do for biases, norms and embeddings).
  float lr_scale = 1.0f;
  float weight_decay_scale = 1.0f;

  // Chained options: zenflow::matrix(w, dw, rows{4096}, cols{11008}).row_major().dtypes(bf16, bf16)
  constexpr matrix_param with_layout(matrix_layout l) const noexcept {
    matrix_param m = *this;
    m.layout = l;
    return m;
  }
  constexpr matrix_param row_major() const noexcept { return with_layout(matrix_layout::row_major); }
  constexpr matrix_param column_contiguous() const noexcept { return with_layout(matrix_layout::column_contiguous); }
  constexpr matrix_param dtypes(dtype param, dtype grad) const noexcept {
    matrix_param m = *this;
    m.param_type = param;
    m.grad_type = grad;
    return m;
  }
  constexpr matrix_param group(float lr_scale_, float weight_decay_scale_) const noexcept {
    matrix_param m = *this;
    m.lr_scale = lr_scale_;
    m.weight_decay_scale = weight_decay_scale_;
    return m;
  }
  constexpr matrix_param group(param_group g) const noexcept { return group(g.lr_scale, g.weight_decay_scale); }
  constexpr matrix_param no_weight_decay() const noexcept { return group(lr_scale, 0.0f); }
};

// A matrix of r x c elements at param (its gradient at grad), fp32, column-contiguous unless a
// chained option says otherwise.
constexpr matrix_param matrix(void* param, const void* grad, rows r, cols c) noexcept {
  matrix_param m;
  m.param = param;
  m.grad = grad;
  m.rows = r.n;
  m.cols = c.n;
  return m;
}

struct vector_param {
  void* param = nullptr;
  const void* grad = nullptr;
  std::size_t n = 0;
  dtype param_type = dtype::f32;
  dtype grad_type = dtype::f32;
  float lr_scale = 1.0f;            // parameter group, as for matrices
  float weight_decay_scale = 1.0f;

  constexpr vector_param dtypes(dtype param, dtype grad) const noexcept {
    vector_param v = *this;
    v.param_type = param;
    v.grad_type = grad;
    return v;
  }
  constexpr vector_param group(float lr_scale_, float weight_decay_scale_) const noexcept {
    vector_param v = *this;
    v.lr_scale = lr_scale_;
    v.weight_decay_scale = weight_decay_scale_;
    return v;
  }
  constexpr vector_param group(param_group g) const noexcept { return group(g.lr_scale, g.weight_decay_scale); }
  constexpr vector_param no_weight_decay() const noexcept { return group(lr_scale, 0.0f); }
};

// A vector (bias, norm weight) of n elements, fp32 unless .dtypes() says otherwise.
constexpr vector_param vector(void* param, const void* grad, std::size_t n) noexcept {
  vector_param v;
  v.param = param;
  v.grad = grad;
  v.n = n;
  return v;
}

// What add_matrix / add_vector return and what the inspection calls take. Matrices and vectors
// are numbered separately (matrix 0 and vector 0 are different tensors), so each index has its
// own type and one cannot be passed for the other. Explicit from an integer: matrix_id{3}.
template <class Tag>
class tensor_id {
 public:
  constexpr explicit tensor_id(std::size_t index) noexcept : i_(index) {}
  constexpr std::size_t index() const noexcept { return i_; }
  friend constexpr bool operator==(tensor_id, tensor_id) noexcept = default;
  friend constexpr auto operator<=>(tensor_id, tensor_id) noexcept = default;

 private:
  std::size_t i_;
};
using matrix_id = tensor_id<struct matrix_tag>;
using vector_id = tensor_id<struct vector_tag>;

}  // namespace zenflow
