// fused_adamw on cuda_space: the GpuUpdater of the paper's system.
//  - gradient_pass: ONE launch reads every gradient once (all matrices, either layout, and all
//    vectors, any dtype): per-column L1 and sum of squares, non-finite flags and the 32-column
//    group partials, which the launch's last block folds into the global sum of squares. Both
//    follow the canonical order of functors.hpp, so the values are the host space's bits. The
//    finite flag and the norm (16 bytes) are read back, because step() returns whether the step
//    was applied: with the overlapped offload this is a step's only wait for the device
//    (warm-up and synchronous steps also wait for their transfers). On request the same launch
//    also writes the offload's compaction (set_compaction). Data parallel, the pass runs in
//    parts (a rank's column blocks) and summarize() folds the gathered statistics.
//  - select_topk: the k best columns of every matrix in one sort over all matrices
//    (cub::DeviceSegmentedSort::StableSortPairsDescending: equal scores keep ascending column
//    order, the host selector's tie rule), then flags and cub::DeviceSelect::Flagged, which yields
//    each matrix's selection in ascending order.
//  - update: one launch computes each selected column's coefficients and advances its count,
//    one launch updates every selected column of every matrix and every vector (a multi-tensor
//    table), with the ZF_HD element body the host space runs (column_adamw_element); a
//    row-major matrix's selected columns go in tiles of 32 slots x 64 rows through shared
//    memory, so that both its rows and the slots' state are read along their lines.
// All memory is allocated in allocate(); nothing is allocated per step.
#pragma once

#if !defined(__CUDACC__)
#  error "zenflow's CUDA updater must be compiled by nvcc: include <zenflow/cuda.hpp> from a .cu file"
#endif

#include <cub/device/device_segmented_sort.cuh>
#include <cub/device/device_select.cuh>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "../adamw.hpp"
#include "../config.hpp"
#include "../cuda/error.hpp"
#include "../cuda/memory.hpp"
#include "../params.hpp"
#include "../space/cuda_space.hpp"
#include "functors.hpp"
#include "fused_adamw.hpp"
#include "updater_state.hpp"

namespace zenflow {

namespace cuda_kernels {

struct grad_segment {
  const void* grad;
  std::uint64_t rows, cols;  // a vector: rows = its chunk, cols = its chunks
  std::uint64_t n;           // a vector's length (0 for a matrix: every element exists)
  double* l1;                // null for a vector
  double* sumsq;
  unsigned char* bad;
  std::uint64_t group0;  // first 32-column group of this segment in the global list
  dtype type;
  matrix_layout layout;  // vectors: column_contiguous
  std::uint64_t ld;      // row-major: elements from a row to the next (the matrix's cols; a segment
                         // may be a range of its columns)
};

struct update_segment {
  void* param;
  const void* grad;
  float* master;
  float* exp_avg;
  float* exp_avg_sq;
  const std::uint32_t* columns;  // matrix: the slots' columns; null for a vector
  const adamw_coeffs* coeffs;    // matrix: per slot
  adamw_coeffs vector_coeffs;
  std::uint64_t rows, cols, n;  // a vector: rows = chunk, n = length; a matrix: n = its active slots
  std::uint64_t block0;         // first block
  dtype ptype, gtype;
  matrix_layout layout;
};

struct coeff_segment {
  std::uint32_t* counts;
  adamw_coeffs* coeffs;
  std::uint64_t slot0;
  adamw_hyper hyper;  // the matrix's parameter group
};

struct grad_totals {
  double sumsq;
  int bad;
  int pad;
};

// The segment containing item x: the last one whose first item is <= x.
template <class Seg, class First>
__device__ int find_segment(const Seg* segs, int n, std::uint64_t x, First first) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (first(segs[mid]) <= x) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

// lane_tree of functors.hpp across a warp: lane j gets v_j + v_{j+off} for off = 16..1.
__device__ __forceinline__ double warp_tree(double v) {
  for (int off = 16; off > 0; off /= 2) v = v + __shfl_down_sync(0xffffffffu, v, off);
  return v;
}

// One value into a lane's running sums, in the canonical form: |x| and x*x of the float taken in
// double (both exact), added in order. One conversion; fabs is a free operand modifier.
__device__ __forceinline__ void accumulate(float v, double& a, double& q, bool& finite) {
  finite = finite && (v - v == 0.0f);
  const double d = v;
  a = a + fabs(d);
  q = q + d * d;
}

// Loads per lane in flight in the gradient pass's main loops: the additions stay in row order,
// only the loads are issued ahead (a warp then has Unroll loads outstanding instead of one).
inline constexpr unsigned grad_unroll = 8;

// Lane sums of one contiguous run of `end` values (a column, or a vector's chunk): lane j adds
// values j, j+32, ... in order. Full tiles of 32*Unroll values load without bounds checks. With
// Store, every value is also copied to out (the compaction fused into the pass).
template <class G, bool Store = false>
__device__ __forceinline__ void contiguous_sums(const G* __restrict__ col, std::uint64_t end, unsigned lane,
                                                double& a, double& q, bool& finite, G* __restrict__ out = nullptr) {
  constexpr std::uint64_t tile = 32 * grad_unroll;
  const std::uint64_t full = end / tile * tile;
  for (std::uint64_t base = 0; base < full; base += tile) {
    G v[grad_unroll];
#pragma unroll
    for (unsigned u = 0; u < grad_unroll; ++u) v[u] = col[base + lane + 32 * u];
    if constexpr (Store) {
#pragma unroll
      for (unsigned u = 0; u < grad_unroll; ++u) out[base + lane + 32 * u] = v[u];
    }
#pragma unroll
    for (unsigned u = 0; u < grad_unroll; ++u) accumulate(to_float(v[u]), a, q, finite);
  }
  for (std::uint64_t i = full + lane; i < end; i += 32) {
    const G v = col[i];
    if constexpr (Store) out[i] = v;
    accumulate(to_float(v), a, q, finite);
  }
}

// Row-major lane sums of column c (thread (x, y) of the block: rows y, y+8, ... in 32-row tiles,
// the order of gradient_group's plain loop) with the group's 32 columns also compacted: each
// 64-row tile goes through shared memory, so that each compacted column's rows are written by
// the consecutive lanes of a warp. Every thread of the block runs every tile (two barriers each).
template <class G>
__device__ __forceinline__ void row_major_compacting(const G* __restrict__ grad, std::uint64_t rows, std::uint64_t cols,
                                                     std::uint64_t ld, std::uint64_t c, G* __restrict__ out,
                                                     const std::uint32_t* slot, G (*tile)[33], double (&a)[4],
                                                     double (&q)[4], bool& finite) {
  const unsigned x = threadIdx.x % 32, y = threadIdx.x / 32;
  const bool has = c < cols;
  const G* __restrict__ col = grad + (has ? c : 0);
  for (std::uint64_t base = 0; base < rows; base += 64) {
    G v[8];
#pragma unroll
    for (unsigned u = 0; u < 8; ++u) v[u] = G{};
    if (has) {
      if (base + 64 <= rows) {
#pragma unroll
        for (unsigned u = 0; u < 8; ++u) v[u] = col[(base + y + 8 * u) * ld];
#pragma unroll
        for (unsigned u = 0; u < 8; ++u) accumulate(to_float(v[u]), a[u % 4], q[u % 4], finite);
      } else {
#pragma unroll
        for (unsigned u = 0; u < 8; ++u) {
          const std::uint64_t i = base + y + 8 * u;
          if (i < rows) {
            v[u] = col[i * ld];
            accumulate(to_float(v[u]), a[u % 4], q[u % 4], finite);
          }
        }
      }
    }
#pragma unroll
    for (unsigned u = 0; u < 8; ++u) tile[y + 8 * u][x] = v[u];
    __syncthreads();
    // warp y: columns y, y+8, y+16, y+24 of the group; lane x: rows base + x and base + 32 + x
#pragma unroll
    for (unsigned t = 0; t < 4; ++t) {
      const unsigned xx = y + 8 * t;
      const std::uint32_t at = slot[xx];
      if (at != no_slot) {
        G* __restrict__ dst = out + std::uint64_t(at) * rows + base;
        if (base + x < rows) dst[x] = tile[x][xx];
        if (base + 32 + x < rows) dst[32 + x] = tile[32 + x][xx];
      }
    }
    __syncthreads();  // the tile is refilled by the next rows
  }
}

// gradient_pass's shared memory (declared once in the kernel: each instantiation of the typed
// body would otherwise reserve its own).
struct gradient_shared {
  double lane_a[32][33], lane_q[32][33];  // (lane_a is the last block's fold space afterwards)
  int lane_bad[32];
  double col_q[32];
  int col_bad[32];
  unsigned last;  // is this block the launch's last to finish?
  int fold_bad;
};
// ... and the compacting pass's: the group's columns' places, and a 64-row tile of any grad type
struct compacting_shared : gradient_shared {
  std::uint32_t slot[32];
  alignas(16) unsigned char tile[64 * 33 * 4];
};

// The body of gradient_pass for one gradient type (the segment's, dispatched once per block);
// Shared is compacting_shared when the pass also compacts: the columns of the group that target
// places (t.slot) are copied there too.
template <class G, class Shared>
__device__ __forceinline__ void gradient_group(const grad_segment& s, const compaction_target& ct, std::uint64_t g,
                                               double* partials, unsigned char* group_bad, Shared& sh) {
  constexpr bool compacting = std::is_same_v<Shared, compacting_shared>;
  auto& lane_a = sh.lane_a;
  auto& lane_q = sh.lane_q;
  auto& lane_bad = sh.lane_bad;
  auto& col_q = sh.col_q;
  auto& col_bad = sh.col_bad;
  const G* __restrict__ grad = static_cast<const G*>(s.grad);
  const std::uint64_t rows = s.rows, cols = s.cols;
  const std::uint64_t c0 = (g - s.group0) * 32;
  const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  auto finish_column = [&](unsigned x, double a, double q, bool finite) {
    // (all lanes of the warp call this with their lane sums of column c0 + x)
    a = warp_tree(a);
    q = warp_tree(q);
    const bool all_finite = __all_sync(0xffffffffu, finite);
    const std::uint64_t c = c0 + x;
    if (lane == 0) {
      if (c < cols) {
        if (s.l1) s.l1[c] = a;
        s.sumsq[c] = q;
        s.bad[c] = all_finite ? 0 : 1;
      }
      col_q[x] = c < cols ? q : 0.0;
      col_bad[x] = c < cols && !all_finite;
    }
  };
  G* __restrict__ out = static_cast<G*>(ct.dst);
  if (s.layout == matrix_layout::column_contiguous) {
    // warp w: columns w, w+8, w+16, w+24 of the group; lane j: rows j, j+32, ... (contiguous)
    for (unsigned t = 0; t < 4; ++t) {
      const unsigned x = warp + 8 * t;
      const std::uint64_t c = c0 + x;
      double a = 0.0, q = 0.0;
      bool finite = true;
      if (c < cols) {
        // rows of this column (a vector's last chunk is shorter)
        const std::uint64_t end = s.n && s.n - c * rows < rows ? s.n - c * rows : rows;
        if constexpr (compacting) {
          const std::uint32_t at = ct.slot ? ct.slot[c] : no_slot;  // (the warp's column)
          if (at != no_slot)
            contiguous_sums<G, true>(grad + c * rows, end, lane, a, q, finite, out + std::uint64_t(at) * rows);
          else
            contiguous_sums(grad + c * rows, end, lane, a, q, finite);
        } else {
          contiguous_sums(grad + c * rows, end, lane, a, q, finite);
        }
      }
      finish_column(x, a, q, finite);
    }
  } else {
    // thread (x, y): column c0 + x, lanes y, y+8, y+16, y+24; a warp reads 32 adjacent columns
    const unsigned x = threadIdx.x % 32, y = threadIdx.x / 32;
    double a[4] = {0, 0, 0, 0}, q[4] = {0, 0, 0, 0};
    bool finite = true;
    const std::uint64_t c = c0 + x;
    bool compact_rows = false;  // (the same for the whole block)
    if constexpr (compacting) {
      if (ct.slot) {
        if (threadIdx.x < 32) sh.slot[threadIdx.x] = c < cols ? ct.slot[c] : no_slot;
        __syncthreads();
        compact_rows = __syncthreads_or(sh.slot[x] != no_slot) != 0;
      }
    }
    if (compact_rows) {
      if constexpr (compacting)
        row_major_compacting(grad, rows, cols, s.ld, c, out, sh.slot, reinterpret_cast<G(*)[33]>(sh.tile), a, q, finite);
    } else if (c < cols) {
      const G* __restrict__ col = grad + c;
      const std::uint64_t full = rows / 64 * 64;
      for (std::uint64_t base = 0; base < full; base += 64) {  // two 32-row tiles, loads first
        float v[8];
#pragma unroll
        for (unsigned u = 0; u < 8; ++u) v[u] = to_float(col[(base + y + 8 * u) * s.ld]);
#pragma unroll
        for (unsigned u = 0; u < 8; ++u) accumulate(v[u], a[u % 4], q[u % 4], finite);
      }
      for (std::uint64_t base = full; base < rows; base += 32)
#pragma unroll
        for (unsigned u = 0; u < 4; ++u) {
          const std::uint64_t i = base + y + 8 * u;
          if (i < rows) accumulate(to_float(col[i * s.ld]), a[u], q[u], finite);
        }
    }
    if (threadIdx.x < 32) lane_bad[threadIdx.x] = 0;
    __syncthreads();
    for (unsigned u = 0; u < 4; ++u) {
      lane_a[y + 8 * u][x] = a[u];
      lane_q[y + 8 * u][x] = q[u];
    }
    if (!finite) atomicOr(&lane_bad[x], 1);
    __syncthreads();
    for (unsigned t = 0; t < 4; ++t) {
      const unsigned xx = warp + 8 * t;
      finish_column(xx, lane_a[lane][xx], lane_q[lane][xx], lane_bad[xx] == 0);
    }
  }
  __syncthreads();
  if (warp == 0) {
    const double p = warp_tree(col_q[lane]);
    const bool any_bad = __any_sync(0xffffffffu, col_bad[lane] != 0);
    if (lane == 0) {
      partials[g] = p;
      group_bad[g] = any_bad ? 1 : 0;
    }
  }
}

// canonical_total of functors.hpp by one block of total_lanes threads, into out: each thread's
// entries are loaded several at a time and added in order, then the lane sums combined by the
// tree. The entries were written by other blocks of the same launch: they are read through L2
// (__ldcg), never through the non-coherent read-only path.
__device__ __forceinline__ void fold_partials(const double* partials, const unsigned char* group_bad,
                                              std::uint64_t n, double* v, int& bad, grad_totals* out) {
  constexpr unsigned U = 8;
  constexpr std::uint64_t stride = device::total_lanes;
  const unsigned j = threadIdx.x;
  double s = 0.0;
  int b = 0;
  std::uint64_t e = j;
  for (; e + (U - 1) * stride < n; e += U * stride) {
    double p[U];
    unsigned char f[U];
#pragma unroll
    for (unsigned u = 0; u < U; ++u) {
      p[u] = __ldcg(partials + e + u * stride);
      f[u] = __ldcg(group_bad + e + u * stride);
    }
#pragma unroll
    for (unsigned u = 0; u < U; ++u) {
      s = s + p[u];
      b |= f[u];
    }
  }
  for (; e < n; e += stride) {
    s = s + __ldcg(partials + e);
    b |= __ldcg(group_bad + e);
  }
  if (j == 0) bad = 0;
  v[j] = s;
  __syncthreads();
  if (b) atomicOr(&bad, 1);
  for (unsigned off = device::total_lanes / 2; off > 0; off /= 2) {
    __syncthreads();
    if (j < off) v[j] = v[j] + v[j + off];
  }
  __syncthreads();
  if (j == 0) {
    out->sumsq = v[0];
    out->bad = bad;
  }
}

// The end of a launch of one block per group: each block, once its group's partial and flag are
// written, fences and takes a ticket; the block that takes the last one folds every partial into
// `out` and resets the ticket counter `done` for the next launch (stream-ordered after this one).
__device__ __forceinline__ void last_block_folds(const double* partials, const unsigned char* group_bad, unsigned* done,
                                                 grad_totals* out, gradient_shared& sh) {
  __threadfence();  // (thread 0 wrote this group's partial and flag) visible device-wide first
  if (threadIdx.x == 0) sh.last = atomicAdd(done, 1u) == gridDim.x - 1 ? 1u : 0u;
  __syncthreads();
  if (!sh.last) return;
  __threadfence();
  fold_partials(partials, group_bad, gridDim.x, &sh.lane_a[0][0], sh.fold_bad, out);
  if (threadIdx.x == 0) *done = 0u;
}

// The summary from per-column statistics already in place (a data-parallel pass in parts, every
// rank's columns gathered): one block per group, its partial from the 32 columns' sums of squares
// by the lane tree (gradient_group's), then the same fold.
template <int = 0>
__global__ void __launch_bounds__(256) summarize_groups(const grad_segment* segs, int nseg, double* partials,
                                                        unsigned char* group_bad, unsigned* done, grad_totals* out) {
  const std::uint64_t g = blockIdx.x;
  __shared__ gradient_shared sh;
  const grad_segment s = segs[find_segment(segs, nseg, g, [](const grad_segment& x) { return x.group0; })];
  if (threadIdx.x < 32) {
    const std::uint64_t c = (g - s.group0) * 32 + threadIdx.x;
    const double p = warp_tree(c < s.cols ? s.sumsq[c] : 0.0);
    const bool any_bad = __any_sync(0xffffffffu, c < s.cols && s.bad[c] != 0);
    if (threadIdx.x == 0) {
      partials[g] = p;
      group_bad[g] = any_bad ? 1 : 0;
    }
  }
  last_block_folds(partials, group_bad, done, out, sh);
}

// One block per 32-column group, 256 threads (8 warps) = total_lanes. The fold is in the same
// launch: each block, once its group's partial is written, fences and takes a ticket; the block
// that takes the last one folds every partial into `out` and resets the ticket counter `done`
// for the next launch (stream-ordered after this one).
// Compacting: `targets` (one per segment, the vectors' empty) say where the columns also go.
template <bool Compacting>
__global__ void __launch_bounds__(256) gradient_pass(const grad_segment* segs, int nseg, const compaction_target* targets,
                                                     double* partials, unsigned char* group_bad, unsigned* done,
                                                     grad_totals* out) {
  static_assert(device::total_lanes == 256, "the fold needs a thread per lane");
  const std::uint64_t g = blockIdx.x;
  __shared__ std::conditional_t<Compacting, compacting_shared, gradient_shared> sh;
  const int si = find_segment(segs, nseg, g, [](const grad_segment& x) { return x.group0; });
  const grad_segment s = segs[si];
  const compaction_target ct = Compacting ? targets[si] : compaction_target{};
  switch (s.type) {
    case dtype::bf16: gradient_group<bfloat16>(s, ct, g, partials, group_bad, sh); break;
    case dtype::f16: gradient_group<float16>(s, ct, g, partials, group_bad, sh); break;
    default: gradient_group<float>(s, ct, g, partials, group_bad, sh); break;
  }
  last_block_folds(partials, group_bad, done, out, sh);
}

template <int = 0>
__global__ void slot_coeffs(const coeff_segment* segs, int nseg, std::uint64_t total) {
  const std::uint64_t x = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (x >= total) return;
  const coeff_segment& s = segs[find_segment(segs, nseg, x, [](const coeff_segment& c) { return c.slot0; })];
  const std::uint64_t k = x - s.slot0;
  s.coeffs[k] = make_coeffs(s.hyper, s.counts[k] + 1u);
  s.counts[k] += 1u;
}

// Four consecutive elements of T in one aligned load or store (16 bytes of fp32, 8 of a 16-bit
// type): the caller has checked the address is a multiple of 4 * sizeof(T).
template <class T>
struct quad {
  using word = std::conditional_t<sizeof(T) == 4, uint4, uint2>;
  T v[4];
  __device__ __forceinline__ static quad load(const T* p) {
    quad q;
    const word w = *reinterpret_cast<const word*>(p);
    memcpy(q.v, &w, sizeof w);
    return q;
  }
  __device__ __forceinline__ void store(T* p) const {
    word w;
    memcpy(&w, v, sizeof w);
    *reinterpret_cast<word*>(p) = w;
  }
};
template <class T>
__device__ __forceinline__ bool quad_aligned(const T* p) {
  return (reinterpret_cast<std::uintptr_t>(p) & (4 * sizeof(T) - 1)) == 0;
}

// A selected column of a column-contiguous matrix, four rows per thread and step: the slot's
// master and moments ([slot][rows]) and the column's gradient and param (contiguous too) move in
// 16- and 8-byte words, so each thread has four loads of 4 elements in flight where the
// element loop had single ones. The element arithmetic is column_adamw_element's, in the same
// order for each element: the same bits. The caller has checked rows % 4 == 0 and that every
// array's column starts on the 4-element grid.
template <class P, class G>
__device__ __forceinline__ void update_column_quads(P* __restrict__ param, const G* __restrict__ grad,
                                                    float* __restrict__ master, float* __restrict__ exp_avg,
                                                    float* __restrict__ exp_avg_sq, std::uint64_t rows,
                                                    float factor, const adamw_coeffs& co) {
#pragma unroll 2
  for (std::uint64_t i = 4 * std::uint64_t(threadIdx.x); i < rows; i += 4 * std::uint64_t(blockDim.x)) {
    const quad<G> g = quad<G>::load(grad + i);
    quad<float> m1 = quad<float>::load(exp_avg + i), m2 = quad<float>::load(exp_avg_sq + i);
    if constexpr (std::is_same_v<P, float>) {
      if (!master) {  // the fp32 param is the master
        quad<float> w = quad<float>::load(param + i);
        for (int j = 0; j < 4; ++j) adamw_update(w.v[j], m1.v[j], m2.v[j], mul_rn(to_float(g.v[j]), factor), co);
        w.store(param + i);
        m1.store(exp_avg + i);
        m2.store(exp_avg_sq + i);
        continue;
      }
    }
    quad<float> w = quad<float>::load(master + i);
    quad<P> out;
    for (int j = 0; j < 4; ++j) {
      adamw_update(w.v[j], m1.v[j], m2.v[j], mul_rn(to_float(g.v[j]), factor), co);
      out.v[j] = from_float<P>(w.v[j]);
    }
    w.store(master + i);
    m1.store(exp_avg + i);
    m2.store(exp_avg_sq + i);
    out.store(param + i);
  }
}

// Selected columns of a row-major matrix, in tiles of 32 slots x 64 rows, one block (8 warps)
// each: there a selected column is one element a row, so the gradient and param are read and
// written with the lanes of a warp on 32 slots of one row (sectors taken in order along the row),
// and the slots' state ([slot][rows]) with the lanes on 32 rows of one slot (whole lines); the
// values cross between the two through shared memory. The element arithmetic is
// column_adamw_element's, in the same order for each element: the same bits.
inline constexpr std::uint64_t tile_slots = 32, tile_rows = 64;
struct row_tile_shared {
  float grad[tile_rows][tile_slots + 1];
  alignas(16) unsigned char param[tile_rows * (tile_slots + 1) * sizeof(float)];  // a P[64][33]
};
inline std::uint64_t row_major_tiles(std::uint64_t slots, std::uint64_t rows) {
  return (slots + tile_slots - 1) / tile_slots * ((rows + tile_rows - 1) / tile_rows);
}

template <class P, class G>
__device__ __forceinline__ void update_row_major_tile(const update_segment& s, std::uint64_t b, float factor,
                                                      row_tile_shared& sh) {
  P* __restrict__ param = static_cast<P*>(s.param);
  const G* __restrict__ grad = static_cast<const G*>(s.grad);
  float* __restrict__ master = s.master;
  float* __restrict__ exp_avg = s.exp_avg;
  float* __restrict__ exp_avg_sq = s.exp_avg_sq;
  const std::uint64_t rows = s.rows, cols = s.cols, k = s.n;  // (a matrix's n: its active slots)
  const std::uint64_t row_tiles = (rows + tile_rows - 1) / tile_rows;
  const std::uint64_t j0 = b / row_tiles * tile_slots, r0 = b % row_tiles * tile_rows;
  const unsigned x = threadIdx.x % 32, y = threadIdx.x / 32;
  P(*tile)[tile_slots + 1] = reinterpret_cast<P(*)[tile_slots + 1]>(sh.param);
  bool own_master = false;  // an fp32 param is its own master
  if constexpr (std::is_same_v<P, float>) own_master = master == nullptr;
  // lanes on slots: the gradient (and an own-master param) of rows r0 + y + 8u of slot j0 + x
  const bool has = j0 + x < k;
  const std::uint64_t c = has ? std::uint64_t(s.columns[j0 + x]) : 0;
  if (has) {
#pragma unroll
    for (unsigned u = 0; u < 8; ++u) {
      const std::uint64_t r = r0 + y + 8 * u;
      if (r < rows) {
        sh.grad[y + 8 * u][x] = to_float(grad[r * cols + c]);
        if (own_master) tile[y + 8 * u][x] = param[r * cols + c];
      }
    }
  }
  __syncthreads();
  // lanes on rows: slot j0 + y + 8t, rows r0 + x and r0 + 32 + x
#pragma unroll
  for (unsigned t = 0; t < 4; ++t) {
    const unsigned sl = y + 8 * t;
    const std::uint64_t j = j0 + sl;
    if (j >= k) continue;
    const adamw_coeffs co = s.coeffs[j];
#pragma unroll
    for (unsigned h = 0; h < 2; ++h) {
      const unsigned rr = x + 32 * h;
      const std::uint64_t r = r0 + rr, e = j * rows + r;
      if (r >= rows) continue;
      const float g = mul_rn(sh.grad[rr][sl], factor);
      if (own_master) {
        float w = to_float(tile[rr][sl]);
        adamw_update(w, exp_avg[e], exp_avg_sq[e], g, co);
        tile[rr][sl] = from_float<P>(w);
      } else {
        adamw_update(master[e], exp_avg[e], exp_avg_sq[e], g, co);
        tile[rr][sl] = from_float<P>(master[e]);
      }
    }
  }
  __syncthreads();
  if (has) {
#pragma unroll
    for (unsigned u = 0; u < 8; ++u) {
      const std::uint64_t r = r0 + y + 8 * u;
      if (r < rows) param[r * cols + c] = tile[y + 8 * u][x];
    }
  }
  __syncthreads();  // (the block's next tile, if any, refills the shared memory)
}

template <class P, class G>
__device__ __forceinline__ void update_block(const update_segment& s, std::uint64_t b, float factor) {
  // restrict-qualified locals: no store can alias a later load, so several rows' loads are in flight
  P* __restrict__ param = static_cast<P*>(s.param);
  const G* __restrict__ grad = static_cast<const G*>(s.grad);
  float* __restrict__ master = s.master;
  float* __restrict__ exp_avg = s.exp_avg;
  float* __restrict__ exp_avg_sq = s.exp_avg_sq;
  const std::uint64_t rows = s.rows;
  if (s.columns) {  // block b: selected slot b
    const std::uint64_t c = s.columns[b];
    const adamw_coeffs co = s.coeffs[b];
    if (s.layout == matrix_layout::column_contiguous && rows % 4 == 0) {
      // (rows % 4 == 0: every column and slot starts on the 4-element grid when its array does)
      P* pc = param + c * rows;
      const G* gc = grad + c * rows;
      float* mc = master ? master + b * rows : nullptr;
      float* m1 = exp_avg + b * rows;
      float* m2 = exp_avg_sq + b * rows;
      if (quad_aligned(pc) && quad_aligned(gc) && (!mc || quad_aligned(mc)) && quad_aligned(m1) && quad_aligned(m2))
        return update_column_quads(pc, gc, mc, m1, m2, rows, factor, co);
    }
#pragma unroll 4
    for (std::uint64_t i = threadIdx.x; i < rows; i += blockDim.x)
      device::column_adamw_element(param, grad, master, exp_avg, exp_avg_sq, b * rows + i,
                                   element_offset(s.layout, rows, s.cols, i, c), factor, co);
  } else {  // block b: chunk b of a vector
    const std::uint64_t end = (b + 1) * rows < s.n ? (b + 1) * rows : s.n;
    const adamw_coeffs co = s.vector_coeffs;
    if constexpr (std::is_same_v<P, float>) {
      if (!master) {  // the fp32 param is the master
#pragma unroll 4
        for (std::uint64_t i = b * rows + threadIdx.x; i < end; i += blockDim.x)
          adamw_update(param[i], exp_avg[i], exp_avg_sq[i], mul_rn(to_float(grad[i]), factor), co);
        return;
      }
    }
#pragma unroll 4
    for (std::uint64_t i = b * rows + threadIdx.x; i < end; i += blockDim.x) {
      adamw_update(master[i], exp_avg[i], exp_avg_sq[i], mul_rn(to_float(grad[i]), factor), co);
      param[i] = from_float<P>(master[i]);
    }
  }
}

// Block b of a segment: a tile of a row-major matrix's selected columns, a selected column of a
// column-contiguous one, or a vector's chunk (the same for every thread of the block).
template <class P, class G>
__device__ __forceinline__ void update_work(const update_segment& s, std::uint64_t b, float factor,
                                            row_tile_shared& sh) {
  if (s.columns && s.layout == matrix_layout::row_major) update_row_major_tile<P, G>(s, b, factor, sh);
  else update_block<P, G>(s, b, factor);
}

// Work block x of `total` (a row-major tile, a selected column, or a vector chunk) in block
// x % gridDim.x: one each but where total exceeds the grid's limit (over 2^31 - 1 work blocks).
template <int = 0>
__global__ void __launch_bounds__(256) fused_update(const update_segment* segs, int nseg, std::uint64_t total,
                                                    float factor) {
  __shared__ row_tile_shared sh;
  for (std::uint64_t x = blockIdx.x; x < total; x += gridDim.x) {
    const update_segment s = segs[find_segment(segs, nseg, x, [](const update_segment& u) { return u.block0; })];
    const std::uint64_t b = x - s.block0;
    switch (int(s.ptype) * 3 + int(s.gtype)) {
      case 0: update_work<float, float>(s, b, factor, sh); break;
      case 1: update_work<float, bfloat16>(s, b, factor, sh); break;
      case 2: update_work<float, float16>(s, b, factor, sh); break;
      case 3: update_work<bfloat16, float>(s, b, factor, sh); break;
      case 4: update_work<bfloat16, bfloat16>(s, b, factor, sh); break;
      case 5: update_work<bfloat16, float16>(s, b, factor, sh); break;
      case 6: update_work<float16, float>(s, b, factor, sh); break;
      case 7: update_work<float16, bfloat16>(s, b, factor, sh); break;
      default: update_work<float16, float16>(s, b, factor, sh); break;
    }
  }
}

// flags[offset(m) + idx] = 1 for the first k(m) entries of matrix m's sorted order.
template <int = 0>
__global__ void mark_topk(const std::uint32_t* sorted_idx, const std::int64_t* offsets, const std::uint32_t* ks,
                          int nseg, std::uint64_t total, unsigned char* flags) {
  const std::uint64_t p = std::uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= total) return;
  int lo = 0, hi = nseg - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (std::uint64_t(offsets[mid]) <= p) lo = mid;
    else hi = mid - 1;
  }
  const std::uint64_t off = std::uint64_t(offsets[lo]);
  if (p - off < ks[lo]) flags[off + sorted_idx[p]] = 1;
}

template <class P>
struct to_master_fn {
  const P* src;
  float* dst;
  ZF_HD void operator()(std::size_t i) const { dst[i] = to_float(src[i]); }
};

// Zen-auto's masses of one matrix (a block each): the L1 scores of its selected columns
// (columns[0, k), slot order) and of all its columns, each summed in order in double by one
// thread — the host's loop, so the same bits — from chunks the block stages in shared memory.
struct mass_segment {
  const std::uint32_t* columns;
  std::size_t col0, cols, k;
};
template <int = 0>
__global__ void __launch_bounds__(256) column_masses(const mass_segment* segs, const double* __restrict__ l1,
                                                     double* __restrict__ out) {
  __shared__ double chunk[256];
  const mass_segment s = segs[blockIdx.x];
  double sums[2] = {0.0, 0.0};
  for (int which = 0; which < 2; ++which) {
    const std::size_t n = which == 0 ? s.k : s.cols;
    for (std::size_t base = 0; base < n; base += 256) {
      const std::size_t j = base + threadIdx.x;
      if (j < n) chunk[threadIdx.x] = l1[s.col0 + (which == 0 ? std::size_t(s.columns[j]) : j)];
      __syncthreads();
      if (threadIdx.x == 0) {
        const std::size_t m = n - base < 256 ? n - base : 256;
        for (std::size_t t = 0; t < m; ++t) sums[which] = __dadd_rn(sums[which], chunk[t]);
      }
      __syncthreads();
    }
  }
  if (threadIdx.x == 0) {
    out[2 * std::size_t(blockIdx.x)] = sums[0];
    out[2 * std::size_t(blockIdx.x) + 1] = sums[1];
  }
}

}  // namespace cuda_kernels

namespace detail {
// fused_adamw<cuda_space>'s per-parameter state: the shared slot sets / AdamW state, plus where
// each parameter's entries start in the updater's concatenated per-column / per-chunk arrays.
struct cuda_matrix_state : column_slots<cuda_space> {
  pooled_array<cuda_space, adamw_coeffs> coeffs;  // this step's coefficients per slot
  std::size_t col0 = 0;               // first column in the concatenated per-column arrays
};
struct cuda_vector_state : vector_adamw_state<cuda_space> {
  std::size_t chunk0 = 0;  // first chunk in the concatenated per-chunk arrays
};
}  // namespace detail

template <>
class fused_adamw<cuda_space> : public updater_registry<detail::cuda_matrix_state, detail::cuda_vector_state> {
 public:
  template <class T>
  using buffer = device_array<T>;
  static constexpr std::size_t vector_chunk = 4096;

  using matrix_state = detail::cuda_matrix_state;
  using vector_state = detail::cuda_vector_state;
  struct grad_summary {
    bool finite;
    double sumsq;
  };

  fused_adamw() = default;
  fused_adamw(fused_adamw&&) = default;
  // (the optimizer assigns a fresh one only after a failed initialize(): no update had run)
  fused_adamw& operator=(fused_adamw&&) = default;
  // The last step's copies out of the pinned tables (and into the summary and the masses) may
  // still run on the compute stream when the optimizer goes: wait for them before the pinned
  // memory is freed — on our own events (the stream may be the trainer's, already destroyed),
  // best effort (a destructor does not throw; an error is the next CUDA call's to report).
  ~fused_adamw() {
    for (const cuda_space::event* e : {&summary_ready_, &tables_copied_, &masses_ready_})
      if (e->get()) (void)cudaEventSynchronize(e->get());
  }

  void allocate() {
    std::size_t cols = 0, chunks = 0, groups = 0, max_slots = 0;
    std::vector<cuda_kernels::grad_segment> gsegs;
    for (auto& s : matrices_) {
      s.param_master = s.p.param_type == dtype::f32;  // an fp32 param is its own master
      s.allocate_slots(pool_);
      pool_.request(s.coeffs, s.k);
      s.col0 = cols;
      cols += s.p.cols;
      max_slots += s.k;
    }
    for (auto& v : vectors_) {
      v.param_master = v.p.param_type == dtype::f32;
      v.allocate_state(pool_);
      v.chunk0 = chunks;
      chunks += (v.p.n + vector_chunk - 1) / vector_chunk;
    }
    pool_.commit();  // one allocation for every small per-parameter array
    l1_ = buffer<double>(cols);
    sumsq_ = buffer<double>(cols + chunks);
    bad_ = buffer<unsigned char>(cols + chunks);
    for (auto& s : matrices_) {
      gsegs.push_back({s.p.grad, s.p.rows, s.p.cols, 0, l1_.data() + s.col0, sumsq_.data() + s.col0,
                       bad_.data() + s.col0, groups, s.p.grad_type, s.p.layout, s.p.cols});
      groups += group_count(s.p.cols);
    }
    for (auto& v : vectors_) {
      const std::size_t nc = (v.p.n + vector_chunk - 1) / vector_chunk;
      gsegs.push_back({v.p.grad, vector_chunk, nc, v.p.n, nullptr, sumsq_.data() + cols + v.chunk0,
                       bad_.data() + cols + v.chunk0, groups, v.p.grad_type, matrix_layout::column_contiguous, 0});
      groups += group_count(nc);
    }
    groups_ = groups;
    partials_ = buffer<double>(groups);
    group_bad_ = buffer<unsigned char>(groups);
    grad_segs_ = buffer<cuda_kernels::grad_segment>(gsegs.size());
    upload(grad_segs_.data(), gsegs.data(), gsegs.size() * sizeof(gsegs[0]));
    full_segs_ = std::move(gsegs);
    ranges_.assign(matrices_.size(), {0, 0});
    totals_ = buffer<cuda_kernels::grad_totals>(1);
    pass_done_ = buffer<unsigned>(1);
    {
      const unsigned zero = 0;  // the gradient pass's ticket counter starts (and ends each launch) at 0
      upload(pass_done_.data(), &zero, sizeof zero);
    }
    totals_host_ = pinned_array<cuda_kernels::grad_totals>(1);
    // per-step tables (rebuilt on the host each step, uploaded from pinned memory)
    upd_segs_ = buffer<cuda_kernels::update_segment>(matrices_.size() + vectors_.size());
    upd_host_ = pinned_array<cuda_kernels::update_segment>(matrices_.size() + vectors_.size());
    coeff_segs_ = buffer<cuda_kernels::coeff_segment>(std::max<std::size_t>(1, matrices_.size()));
    coeff_host_ = pinned_array<cuda_kernels::coeff_segment>(std::max<std::size_t>(1, matrices_.size()));
    // Zen-auto's masses (a table and 2 doubles per matrix)
    mass_segs_ = buffer<cuda_kernels::mass_segment>(std::max<std::size_t>(1, matrices_.size()));
    mass_host_ = pinned_array<cuda_kernels::mass_segment>(std::max<std::size_t>(1, matrices_.size()));
    masses_dev_ = buffer<double>(2 * std::max<std::size_t>(1, matrices_.size()));
    masses_host_ = pinned_array<double>(2 * std::max<std::size_t>(1, matrices_.size()));
    // top-k over all matrices
    total_cols_ = cols;
    std::vector<std::int64_t> offsets(matrices_.size() + 1, 0);
    std::vector<std::uint32_t> ks(matrices_.size()), local(cols);
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      offsets[i + 1] = offsets[i] + std::int64_t(matrices_[i].p.cols);
      ks[i] = std::uint32_t(matrices_[i].k);
      for (std::size_t c = 0; c < matrices_[i].p.cols; ++c) local[matrices_[i].col0 + c] = std::uint32_t(c);
    }
    if (cols && max_slots) {
      offsets_ = buffer<std::int64_t>(offsets.size());
      upload(offsets_.data(), offsets.data(), 8 * offsets.size());
      ks_ = buffer<std::uint32_t>(ks.size());
      upload(ks_.data(), ks.data(), 4 * ks.size());
      local_ = buffer<std::uint32_t>(cols);
      upload(local_.data(), local.data(), 4 * cols);
      keys_out_ = buffer<double>(cols);
      sorted_ = buffer<std::uint32_t>(cols);
      flags_ = buffer<unsigned char>(cols);
      chosen_ = buffer<std::uint32_t>(cols);
      chosen_n_ = buffer<std::int64_t>(1);
      chosen_host_ = pinned_array<std::uint32_t>(max_slots);
      std::size_t sort_bytes = 0, select_bytes = 0;
      ZF_CUDA_TRY(cub::DeviceSegmentedSort::StableSortPairsDescending(
          nullptr, sort_bytes, l1_.data(), keys_out_.data(), local_.data(), sorted_.data(), std::int64_t(cols),
          std::int64_t(matrices_.size()), offsets_.data(), offsets_.data() + 1, stream_));
      ZF_CUDA_TRY(cub::DeviceSelect::Flagged(nullptr, select_bytes, local_.data(), flags_.data(), chosen_.data(),
                                             chosen_n_.data(), std::int64_t(cols), stream_));
      temp_ = buffer<unsigned char>(std::max(sort_bytes, select_bytes));
    }
  }

  // The vectors' fp32 masters start as their params (an fp32 param is its own master).
  void load_vectors(cuda_space& space) {
    for (auto& v : vectors_)
      if (!v.param_master) visit_dtype(v.p.param_type, [&](auto ptag) {
        using P = typename decltype(ptag)::type;
        space.parallel_for(v.p.n, cuda_kernels::to_master_fn<P>{static_cast<const P*>(v.p.param), v.master.data()});
      });
  }

  // The gradient pass, enqueued on the space's stream (no wait): one launch writes the per-column
  // scores and flags, and its last block the 16-byte summary, in device memory.
  // With `compact`, the pass also copies each matrix's columns to the places set_compaction()
  // gave (the offload's compaction, the gradient read once for both; the same statistics).
  void enqueue_gradient_pass(cuda_space& space, bool compact = false) {
    // (a compacting pass with nowhere to compact to would leave the offload a stale buffer)
    if (compact && !matrices_.empty() && targets_.size() == 0)
      throw std::logic_error("zenflow: a compacting gradient pass before set_compaction()");
    stream_ = space.stream();
    scores_valid_[0] = scores_valid_[1] = false;
    if (groups_ == 0) return;
    const int nseg = int(matrices_.size() + vectors_.size());
    if (compact && targets_.size()) {
      cuda_kernels::gradient_pass<true><<<unsigned(groups_), 256, 0, stream_>>>(
          grad_segs_.data(), nseg, targets_.data(), partials_.data(), group_bad_.data(), pass_done_.data(),
          totals_.data());
      ZF_CUDA_CHECK_LAUNCH("gradient_pass (compacting)");
    } else {
      cuda_kernels::gradient_pass<false><<<unsigned(groups_), 256, 0, stream_>>>(
          grad_segs_.data(), nseg, nullptr, partials_.data(), group_bad_.data(), pass_done_.data(), totals_.data());
      ZF_CUDA_CHECK_LAUNCH("gradient_pass");
    }
  }
  // Where a compacting pass puts each matrix's columns: targets[i] for matrix i (device
  // pointers; the slot tables are read at each compacting pass). Uploaded once.
  void set_compaction(cuda_space& space, const compaction_target* targets) {
    std::vector<compaction_target> all(matrices_.size() + vectors_.size());  // (the vectors': none)
    std::copy(targets, targets + matrices_.size(), all.begin());
    targets_ = buffer<compaction_target>(all.size());
    stream_ = space.stream();
    upload(targets_.data(), all.data(), all.size() * sizeof(all[0]));
  }

  grad_summary gradient_pass(cuda_space& space) { return gradient_pass(space, false); }
  grad_summary gradient_pass(cuda_space& space, bool compact) {
    stream_ = space.stream();
    if (groups_ == 0) return {true, 0.0};
    enqueue_gradient_pass(space, compact);
    return read_summary();
  }

  // The pass in parts, for a data-parallel optimizer whose rank holds the reduced gradient of
  // some columns only (fused_adamw's contract): column_stats(i, c0, c1) names the columns of
  // matrix i to pass over (the same ranges step after step: the launch table is built once per
  // change), vector_stats() runs one launch over those columns and every vector, writing their
  // per-column statistics; the others' the caller writes through column_l1/column_sumsq/
  // column_bad (device memory); summarize() then folds every column's into the summary (the
  // canonical order: the same bits as gradient_pass) and reads it back. Every matrix is named
  // once a pass (a matrix not named keeps its last range, which vector_stats would pass over
  // again, over what the caller wrote).
  void column_stats(cuda_space& space, std::size_t i, std::size_t c0, std::size_t c1) {
    stream_ = space.stream();
    if (ranges_[i] != std::pair{c0, c1}) {
      ranges_[i] = {c0, c1};
      parts_built_ = false;
    }
  }
  // The ranges column_stats will name (ranges[i] for matrix i), and the launch table built for
  // them now: data parallel, at initialize(), where a failure is every rank's, not in a step.
  void prepare_parts(cuda_space& space, const std::pair<std::size_t, std::size_t>* ranges) {
    stream_ = space.stream();
    for (std::size_t i = 0; i < matrices_.size(); ++i) ranges_[i] = ranges[i];
    build_parts();
  }
  void vector_stats(cuda_space& space) {
    stream_ = space.stream();
    scores_valid_[0] = scores_valid_[1] = false;
    if (!parts_built_) build_parts();
    if (part_groups_ == 0) return;
    cuda_kernels::gradient_pass<false><<<unsigned(part_groups_), 256, 0, stream_>>>(
        part_segs_.data(), int(part_count_), nullptr, part_partials_.data(), part_bad_.data(), pass_done_.data(),
        totals_.data());
    ZF_CUDA_CHECK_LAUNCH("gradient_pass (part)");
  }
  double* column_l1(std::size_t i) noexcept { return l1_.data() + matrices_[i].col0; }
  double* column_sumsq(std::size_t i) noexcept { return sumsq_.data() + matrices_[i].col0; }
  unsigned char* column_bad(std::size_t i) noexcept { return bad_.data() + matrices_[i].col0; }
  grad_summary summarize() {
    scores_valid_[0] = scores_valid_[1] = false;
    if (groups_ == 0) return {true, 0.0};
    cuda_kernels::summarize_groups<<<unsigned(groups_), 256, 0, stream_>>>(
        grad_segs_.data(), int(matrices_.size() + vectors_.size()), partials_.data(), group_bad_.data(),
        pass_done_.data(), totals_.data());
    ZF_CUDA_CHECK_LAUNCH("summarize_groups");
    return read_summary();
  }

  void update(cuda_space& space, float factor, const adamw_hyper& hyper) {
    stream_ = space.stream();
    std::size_t nseg = 0, blocks = 0, ncoeff = 0, slots = 0;
    // The pinned tables are rewritten below: the previous update's copies out of them must have
    // completed (they have, in a step, since every step waits for its gradient summary first; the
    // event makes that a guarantee of this function rather than of its caller's order).
    tables_copied_.wait();
    cuda_kernels::update_segment* u = upd_host_.data();
    cuda_kernels::coeff_segment* cs = coeff_host_.data();
    for (auto& s : matrices_) {
      if (s.active == 0) continue;
      const int b = s.cur;
      cs[ncoeff++] = {s.counts[b].data(), s.coeffs.data(), slots,
                      group_hyper(hyper, s.p.lr_scale, s.p.weight_decay_scale)};
      u[nseg++] = {s.p.param, s.p.grad, s.master_of(b), s.exp_avg[b].data(), s.exp_avg_sq[b].data(),
                   s.columns[b].data(), s.coeffs.data(), adamw_coeffs{}, s.p.rows, s.p.cols, s.active, blocks,
                   s.p.param_type, s.p.grad_type, s.p.layout};
      slots += s.active;
      blocks += s.p.layout == matrix_layout::row_major ? cuda_kernels::row_major_tiles(s.active, s.p.rows) : s.active;
    }
    for (auto& v : vectors_) {
      u[nseg++] = {v.p.param, v.p.grad, v.master_ptr(), v.exp_avg.data(), v.exp_avg_sq.data(), nullptr, nullptr,
                   make_coeffs(group_hyper(hyper, v.p.lr_scale, v.p.weight_decay_scale), v.count + 1u),
                   vector_chunk, 0, v.p.n, blocks,
                   v.p.param_type, v.p.grad_type, matrix_layout::column_contiguous};
      blocks += (v.p.n + vector_chunk - 1) / vector_chunk;
      ++v.count;
    }
    if (nseg == 0) return;
    if (ncoeff) {
      ZF_CUDA_TRY(cudaMemcpyAsync(coeff_segs_.data(), cs, ncoeff * sizeof(*cs), cudaMemcpyHostToDevice, stream_));
      cuda_kernels::slot_coeffs<<<cuda_kernels::blocks_for(slots, 256), 256, 0, stream_>>>(coeff_segs_.data(),
                                                                                            int(ncoeff), slots);
      ZF_CUDA_CHECK_LAUNCH("slot_coeffs");
    }
    ZF_CUDA_TRY(cudaMemcpyAsync(upd_segs_.data(), u, nseg * sizeof(*u), cudaMemcpyHostToDevice, stream_));
    space.record(tables_copied_);
    cuda_kernels::fused_update<<<unsigned(blocks < cuda_kernels::max_grid_x ? blocks : cuda_kernels::max_grid_x), 256,
                                 0, stream_>>>(upd_segs_.data(), int(nseg), std::uint64_t(blocks), factor);
    ZF_CUDA_CHECK_LAUNCH("fused_update");
  }

  // Zen-auto's L1 masses per matrix (selected columns, all columns; the host's loops and bits),
  // computed on the device after the step's selection and read back (16 bytes a matrix) behind
  // an event of their own: masses() waits for that, not for the compaction and the update
  // enqueued after it, and no score crosses to the host.
  void enqueue_masses(cuda_space& space) {
    stream_ = space.stream();
    const std::size_t n = matrices_.size();
    if (n == 0) return;
    masses_ready_.wait();  // the previous step's copies out of and into the pinned tables are done
    cuda_kernels::mass_segment* t = mass_host_.data();
    for (std::size_t i = 0; i < n; ++i) {
      const auto& s = matrices_[i];
      t[i] = {s.active ? s.columns[s.cur].data() : nullptr, s.col0, s.p.cols, s.active};
    }
    ZF_CUDA_TRY(cudaMemcpyAsync(mass_segs_.data(), t, n * sizeof(*t), cudaMemcpyHostToDevice, stream_));
    cuda_kernels::column_masses<<<unsigned(n), 256, 0, stream_>>>(mass_segs_.data(), l1_.data(), masses_dev_.data());
    ZF_CUDA_CHECK_LAUNCH("column_masses");
    ZF_CUDA_TRY(cudaMemcpyAsync(masses_host_.data(), masses_dev_.data(), 16 * n, cudaMemcpyDeviceToHost, stream_));
    space.record(masses_ready_);
  }
  std::pair<double, double> masses(cuda_space&, std::size_t i) {
    masses_ready_.wait();
    return {masses_host_.data()[2 * i], masses_host_.data()[2 * i + 1]};
  }

  // This step's scores in host memory (one read-back of all matrices' scores).
  void fetch_scores(cuda_space& space, score_kind kind) {
    stream_ = space.stream();
    const int w = kind == score_kind::l1 ? 0 : 1;
    if (scores_valid_[w]) return;
    scores_host_[w].resize(total_cols_);
    space.download(scores_host_[w].data(), w == 0 ? l1_.data() : sumsq_.data(), 8 * total_cols_);
    scores_valid_[w] = true;
  }
  const double* scores(std::size_t i, score_kind kind) const noexcept {
    return scores_host_[kind == score_kind::l1 ? 0 : 1].data() + matrices_[i].col0;
  }

  // Top-k of every matrix on the device; out[i] = matrix i's k columns, ascending.
  void select_topk(cuda_space& space, score_kind kind, std::vector<std::vector<std::uint32_t>>& out) {
    stream_ = space.stream();
    out.assign(matrices_.size(), {});
    if (total_cols_ == 0 || chosen_host_.size() == 0) return;
    const double* keys = kind == score_kind::l1 ? l1_.data() : sumsq_.data();
    std::size_t bytes = temp_.size();
    // (CUB checks its launches by peeking at the thread's last error: a query's "not ready" left
    // there, by the trainer or by a wait on a collective, would be reported as its failure)
    cuda_detail::clear_answer();
    ZF_CUDA_TRY(cub::DeviceSegmentedSort::StableSortPairsDescending(
        temp_.data(), bytes, keys, keys_out_.data(), local_.data(), sorted_.data(), std::int64_t(total_cols_),
        std::int64_t(matrices_.size()), offsets_.data(), offsets_.data() + 1, stream_));
    ZF_CUDA_TRY(cudaMemsetAsync(flags_.data(), 0, total_cols_, stream_));
    cuda_kernels::mark_topk<<<cuda_kernels::blocks_for(total_cols_, 256), 256, 0, stream_>>>(
        sorted_.data(), offsets_.data(), ks_.data(), int(matrices_.size()), total_cols_, flags_.data());
    ZF_CUDA_CHECK_LAUNCH("mark_topk");
    bytes = temp_.size();
    ZF_CUDA_TRY(cub::DeviceSelect::Flagged(temp_.data(), bytes, local_.data(), flags_.data(), chosen_.data(),
                                           chosen_n_.data(), std::int64_t(total_cols_), stream_));
    ZF_CUDA_TRY(cudaMemcpyAsync(chosen_host_.data(), chosen_.data(), 4 * chosen_host_.size(), cudaMemcpyDeviceToHost,
                                stream_));
    ZF_CUDA_TRY(cudaStreamSynchronize(stream_));
    std::size_t at = 0;
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      out[i].assign(chosen_host_.data() + at, chosen_host_.data() + at + matrices_[i].k);
      at += matrices_[i].k;
    }
  }

  // The per-column scores of this step, all matrices concatenated (matrix i from column
  // matrix(i).col0), in device memory: for tests and benchmarks that feed the selector directly.
  double* device_scores(score_kind kind) noexcept {
    scores_valid_[0] = scores_valid_[1] = false;
    return kind == score_kind::l1 ? l1_.data() : sumsq_.data();
  }

  // Host memory of the records: the registry's, plus the host copies of the gradient pass's
  // launch table and of each matrix's pass range, and the per-column scores a host-side selection
  // downloads (stats().host_bookkeeping_bytes).
  std::size_t records_bytes() const noexcept {
    return updater_registry::records_bytes() + sizeof(cuda_kernels::grad_segment) * full_segs_.size() +
           sizeof(std::pair<std::size_t, std::size_t>) * ranges_.size() +
           8 * (scores_host_[0].size() + scores_host_[1].size());
  }
  // Page-locked host memory: the per-step tables uploaded from it, the summary and the masses
  // read back into it, the selection's chosen columns (stats().host_pinned_bytes, with the
  // transport's staging).
  std::size_t pinned_bytes() const noexcept {
    return sizeof(cuda_kernels::grad_totals) * totals_host_.size() +
           sizeof(cuda_kernels::update_segment) * upd_host_.size() +
           sizeof(cuda_kernels::coeff_segment) * coeff_host_.size() +
           sizeof(cuda_kernels::mass_segment) * mass_host_.size() + 8 * masses_host_.size() +
           4 * chosen_host_.size();
  }

  std::size_t bytes_allocated() const noexcept {
    std::size_t b = 0;
    for (const auto& s : matrices_) b += s.slot_bytes() + sizeof(adamw_coeffs) * s.coeffs.size();
    for (const auto& v : vectors_) b += v.state_bytes();
    b += 8 * (l1_.size() + sumsq_.size() + partials_.size()) + bad_.size() + group_bad_.size();
    b += sizeof(cuda_kernels::grad_segment) * (grad_segs_.size() + part_segs_.size()) + 9 * part_partials_.size() +
         sizeof(compaction_target) * targets_.size() +
         sizeof(cuda_kernels::grad_totals) * totals_.size() +
         4 * pass_done_.size();
    b += sizeof(cuda_kernels::update_segment) * upd_segs_.size() + sizeof(cuda_kernels::coeff_segment) * coeff_segs_.size();
    b += 8 * (offsets_.size() + keys_out_.size() + chosen_n_.size()) +
         4 * (ks_.size() + local_.size() + sorted_.size() + chosen_.size()) + flags_.size() + temp_.size();
    return b;
  }

 private:
  static std::size_t group_count(std::size_t n) noexcept { return (n + device::column_lanes - 1) / device::column_lanes; }
  // Complete on return: a plain cudaMemcpy from pageable memory may return before its DMA has
  // landed, and nothing would order that DMA before the trainer's (possibly non-blocking) stream.
  // (On a stream of its own: see run_alone.)
  void upload(void* dst, const void* src, std::size_t bytes) {
    if (!bytes) return;
    const cudaError_t e =
        cuda_detail::run_alone([&](cudaStream_t s) { return cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s); });
    cuda_detail::check(e, "cudaMemcpyAsync (a table uploaded, and waited for)", __FILE__, __LINE__);
  }

  // The 16-byte summary the last launch wrote, read back. The wait is on a blocking-sync event:
  // the thread sleeps through the trainer's backward instead of spinning a core that the host
  // update and the offload lane need.
  grad_summary read_summary() {
    ZF_CUDA_TRY(cudaMemcpyAsync(totals_host_.data(), totals_.data(), sizeof(cuda_kernels::grad_totals),
                                cudaMemcpyDeviceToHost, stream_));
    summary_ready_.create();
    ZF_CUDA_TRY(cudaEventRecord(summary_ready_.get(), stream_));
    summary_ready_.wait();
    scores_valid_[0] = scores_valid_[1] = false;
    return {totals_host_.data()->bad == 0, totals_host_.data()->sumsq};
  }

  // The launch table of the pass in parts: each matrix's range as a segment of its own (the
  // grad, outputs and groups from the range's first column; row-major rows keep the matrix's
  // stride), then the vectors'; uploaded once per change of the ranges.
  void build_parts() {
    std::vector<cuda_kernels::grad_segment> segs;
    std::size_t groups = 0;
    for (std::size_t i = 0; i < matrices_.size(); ++i) {
      const auto [c0, c1] = ranges_[i];
      if (c1 <= c0) continue;
      cuda_kernels::grad_segment x = full_segs_[i];
      const std::size_t first = x.layout == matrix_layout::column_contiguous ? c0 * x.rows : c0;
      x.grad = static_cast<const unsigned char*>(x.grad) + first * size_of(x.type);
      x.cols = c1 - c0;
      x.l1 += c0;
      x.sumsq += c0;
      x.bad += c0;
      x.group0 = groups;
      groups += group_count(x.cols);
      segs.push_back(x);
    }
    for (std::size_t v = 0; v < vectors_.size(); ++v) {
      cuda_kernels::grad_segment x = full_segs_[matrices_.size() + v];
      x.group0 = groups;
      groups += group_count(x.cols);
      segs.push_back(x);
    }
    part_count_ = segs.size();
    part_groups_ = groups;
    if (part_segs_.size() < segs.size()) part_segs_ = buffer<cuda_kernels::grad_segment>(segs.size());
    if (part_partials_.size() < groups) {
      part_partials_ = buffer<double>(groups);
      part_bad_ = buffer<unsigned char>(groups);
    }
    if (!segs.empty()) {
      ZF_CUDA_TRY(cudaMemcpyAsync(part_segs_.data(), segs.data(), segs.size() * sizeof(segs[0]),
                                  cudaMemcpyHostToDevice, stream_));
      ZF_CUDA_TRY(cudaStreamSynchronize(stream_));  // (segs is a local)
    }
    parts_built_ = true;
  }

  cudaStream_t stream_ = nullptr;
  std::size_t groups_ = 0, total_cols_ = 0;
  buffer<double> l1_, sumsq_, partials_;
  buffer<unsigned char> bad_, group_bad_;
  buffer<cuda_kernels::grad_segment> grad_segs_;
  std::vector<cuda_kernels::grad_segment> full_segs_;  // grad_segs_ on the host
  // the pass in parts: each matrix's column range, and their launch table (then the vectors)
  std::vector<std::pair<std::size_t, std::size_t>> ranges_;
  bool parts_built_ = false;
  std::size_t part_count_ = 0, part_groups_ = 0;
  buffer<cuda_kernels::grad_segment> part_segs_;
  buffer<double> part_partials_;
  buffer<unsigned char> part_bad_;
  buffer<compaction_target> targets_;  // per segment (set_compaction; empty: never compacts)
  buffer<cuda_kernels::grad_totals> totals_;
  buffer<unsigned> pass_done_;
  pinned_array<cuda_kernels::grad_totals> totals_host_;
  cuda_space::event summary_ready_;  // the 16-byte summary has reached totals_host_
  buffer<cuda_kernels::update_segment> upd_segs_;
  pinned_array<cuda_kernels::update_segment> upd_host_;
  buffer<cuda_kernels::coeff_segment> coeff_segs_;
  pinned_array<cuda_kernels::coeff_segment> coeff_host_;
  cuda_space::event tables_copied_;  // the last update()'s copies out of the pinned tables are done
  buffer<cuda_kernels::mass_segment> mass_segs_;
  pinned_array<cuda_kernels::mass_segment> mass_host_;
  buffer<double> masses_dev_;
  pinned_array<double> masses_host_;
  cuda_space::event masses_ready_;  // this step's masses have reached masses_host_
  buffer<std::int64_t> offsets_, chosen_n_;
  buffer<std::uint32_t> ks_, local_, sorted_, chosen_;
  buffer<double> keys_out_;
  buffer<unsigned char> flags_, temp_;
  pinned_array<std::uint32_t> chosen_host_;
  std::vector<double> scores_host_[2];
  bool scores_valid_[2] = {false, false};
};

}  // namespace zenflow
