// cuda_space: the device side of the optimizer on a CUDA GPU. Every primitive the optimizer
// orders is enqueued on one stream (the trainer's, set by initialize(stream) / step(stream));
// the host waits only where a value must reach it (download) or a host buffer must be free
// (upload, fence). Must be compiled by nvcc (include <zenflow/cuda.hpp> from a .cu file).
#pragma once

#if !defined(__CUDACC__)
#  error "zenflow's CUDA space must be compiled by nvcc: include <zenflow/cuda.hpp> from a .cu file"
#endif

#include <cuda_runtime.h>
#include <cudaTypedefs.h>  // (the driver API's types only: its calls are looked up at run time)

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "../cuda/error.hpp"
#include "../cuda/memory.hpp"
#include "../numeric.hpp"
#include "../params.hpp"

namespace zenflow {

namespace cuda_detail {
// What the runtime and the driver say of a buffer the trainer registered (gathered by
// cuda_space::check_registered_memory; judged by memory_refusal, which needs no GPU).
struct memory_facts {
  cudaMemoryType type = cudaMemoryTypeUnregistered;
  int device = -1;               // device memory: the GPU it belongs to
  bool same_address = false;     // page-locked host memory: the GPU reaches it at its host address
  bool pageable_access = false;  // the GPU reaches plain (pageable) host memory: HMM or ATS
  bool range_known = false;      // the allocation's extent below was given by the driver
  std::uintptr_t range_begin = 0, range_end = 0;
};
// Why kernels on GPU `device` cannot use `bytes` at p, the buffer `f` describes: a sentence to
// follow the buffer's name, or "" when they can. Usable: device memory of that GPU, managed
// memory, page-locked host memory mapped at its own address, and any host memory where the GPU
// reaches pageable memory; and where the driver gives the allocation's extent, all `bytes` inside it.
// (Device memory of another GPU is refused even with peer access on: every step would cross
// the link between the two.)
inline std::string memory_refusal(const memory_facts& f, const void* p, std::size_t bytes, int device) {
  const std::string gpu = "GPU " + std::to_string(device);
  switch (f.type) {
    case cudaMemoryTypeDevice:
      if (f.device != device)
        return "is device memory of GPU " + std::to_string(f.device) + ", and this optimizer runs on " + gpu;
      break;
    case cudaMemoryTypeManaged:
      break;
    case cudaMemoryTypeHost:
      if (!f.same_address) return "is page-locked host memory that " + gpu + " does not reach at its host address";
      break;
    default:  // plain host memory, or an address the runtime does not know
      if (!f.pageable_access)
        return "is host memory, which " + gpu + " cannot reach: the params and grads must be memory it can use "
               "(device memory from cudaMalloc or cudaMallocAsync, managed memory, or page-locked host memory)";
      return "";  // (no allocation of the runtime's to measure)
  }
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  if (f.range_known && at >= f.range_begin && at < f.range_end && bytes > f.range_end - at)
    return "needs " + std::to_string(bytes) + " bytes by its shape, and its allocation ends " +
           std::to_string(f.range_end - at) + " bytes after its start";
  return "";
}
// Why the host cannot write `out`, the destination of a copy out of the optimizer, of the kind
// `type` (as the runtime reports it) on a GPU that does (`coherent`: it shares the host's page
// tables, as a hardware-coherent system does) or does not let the host reach its memory: a
// sentence to follow "out", or "" when the host can.
inline std::string host_refusal(cudaMemoryType type, int device, bool coherent) {
  if (type != cudaMemoryTypeDevice || coherent) return "";
  return "is device memory of GPU " + std::to_string(device) +
         ": the copies write host memory (pageable, page-locked or managed)";
}
}  // namespace cuda_detail

namespace cuda_kernels {

inline constexpr unsigned threads = 256;

// The grid's limit in x (blocks).
inline constexpr unsigned max_grid_x = 0x7fffffffu;

// Blocks for n items at `per_block` items per block, at least 1, at most max_grid_x (the
// kernels launched with more items than that covers loop over them, or take sizes that cannot
// reach it: a matrix's columns, a line's length).
inline unsigned blocks_for(std::size_t n, std::size_t per_block) {
  const std::size_t b = (n + per_block - 1) / per_block;
  return b == 0 ? 1u : b < max_grid_x ? unsigned(b) : max_grid_x;
}

// A subnormal float s = in[0] (in[1] = 1) through a product, a sum, a quotient and a widening
// to double: unchanged in IEEE arithmetic, zero where the code was compiled to flush subnormals
// to zero (-ftz=true, which --use_fast_math implies: every f32 instruction gets .ftz). nvcc
// defines no macro for it that a header could test, so cuda_space::check_arithmetic() runs this.
template <int = 0>
__global__ void arithmetic_probe(const float* in, float* out) {
  const float s = in[0], one = in[1];
  out[0] = __fmul_rn(s, one);
  out[1] = __fadd_rn(s, s);
  out[2] = __fdiv_rn(s, one);
  out[3] = float(double(s) * 0x1p140);
}

template <class F>
__global__ void for_each(std::size_t n, F f) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    f(i);
}

// for_each's body for cuda_space::first_non_finite: the lowest index of a value that is not
// finite, into *first (which starts at n).
template <class P>
struct first_non_finite_fn {
  const P* x;
  unsigned long long* first;
  __device__ void operator()(std::size_t i) const {
    if (detail::not_finite(x[i])) atomicMin(first, static_cast<unsigned long long>(i));
  }
};

// Element type of a given size, moved as raw bits.
template <std::size_t Bytes>
struct word;
template <>
struct word<2> {
  using type = std::uint16_t;
};
template <>
struct word<4> {
  using type = std::uint32_t;
};

// Column-contiguous: block k copies column list[k] (rows elements, contiguous) to/from block k
// of the compact [n][rows] array (blocks k, k + gridDim.x, ... when n exceeds the grid). Gather:
// in -> out[k]; scatter: in[k] -> out. 16-byte words where both sides are 16-byte aligned (rows a
// multiple of 8 for 16-bit data), else elements.
template <class W, bool Scatter>
__global__ void columns_contiguous(const W* __restrict__ in, W* __restrict__ out, std::size_t rows,
                                   const std::uint32_t* __restrict__ list, std::size_t n) {
  for (std::size_t k = blockIdx.x; k < n; k += gridDim.x) {
    const std::size_t c = list[k];
    const W* __restrict__ src = in + (Scatter ? k : c) * rows;
    W* __restrict__ dst = out + (Scatter ? c : k) * rows;
    std::size_t done = 0;
    if (((reinterpret_cast<std::uintptr_t>(src) | reinterpret_cast<std::uintptr_t>(dst)) & 15u) == 0) {
      const std::size_t n16 = rows * sizeof(W) / 16;
      const uint4* __restrict__ s16 = reinterpret_cast<const uint4*>(src);
      uint4* __restrict__ d16 = reinterpret_cast<uint4*>(dst);
#pragma unroll 4
      for (std::size_t i = threadIdx.x; i < n16; i += blockDim.x) d16[i] = s16[i];
      done = n16 * 16 / sizeof(W);
    }
    for (std::size_t i = done + threadIdx.x; i < rows; i += blockDim.x) dst[i] = src[i];
  }
}

// Row-major: a 32x32 tile (32 list entries x 32 rows) through shared memory, so that the
// strided side (matrix rows of `cols` elements) and the compact side are both read and written
// by consecutive threads. Block (bx, by): entries 32*bx.., row tiles by, by + gridDim.y, ...
// (gridDim.y is at most 65535, so a taller matrix loops); blockDim = (32, 8), each thread moves
// 4 elements each way per tile (the loops unroll: 4 loads in flight).
inline constexpr unsigned tile_rows_per_pass = 8;
inline constexpr unsigned max_grid_y = 65535;
template <class W, bool Scatter>
__global__ void __launch_bounds__(256) columns_row_major(const W* __restrict__ in, W* __restrict__ out,
                                                         std::size_t rows, std::size_t cols,
                                                         const std::uint32_t* __restrict__ list, std::size_t n) {
  __shared__ W tile[32][33];
  const std::size_t k0 = std::size_t(blockIdx.x) * 32, row_tiles = (rows + 31) / 32;
  const std::size_t k = k0 + threadIdx.x;
  const bool has_k = k < n;
  const std::size_t c = has_k ? list[k] : 0;
  for (std::size_t by = blockIdx.y; by < row_tiles; by += gridDim.y) {
    const std::size_t i0 = by * 32;
    if (!Scatter) {
      // read the matrix: x over entries (adjacent columns for runs in the list), y over rows
#pragma unroll
      for (unsigned y = threadIdx.y; y < 32; y += tile_rows_per_pass) {
        const std::size_t i = i0 + y;
        if (has_k && i < rows) tile[y][threadIdx.x] = in[i * cols + c];
      }
      __syncthreads();
      // write the compact block: x over rows (contiguous), y over entries
#pragma unroll
      for (unsigned y = threadIdx.y; y < 32; y += tile_rows_per_pass) {
        const std::size_t kk = k0 + y, i = i0 + threadIdx.x;
        if (kk < n && i < rows) out[kk * rows + i] = tile[threadIdx.x][y];
      }
    } else {
#pragma unroll
      for (unsigned y = threadIdx.y; y < 32; y += tile_rows_per_pass) {
        const std::size_t kk = k0 + y, i = i0 + threadIdx.x;
        if (kk < n && i < rows) tile[threadIdx.x][y] = in[kk * rows + i];
      }
      __syncthreads();
#pragma unroll
      for (unsigned y = threadIdx.y; y < 32; y += tile_rows_per_pass) {
        const std::size_t i = i0 + y;
        if (has_k && i < rows) out[i * cols + c] = tile[y][threadIdx.x];
      }
    }
    __syncthreads();  // the tile is refilled by the next row tile
  }
}

// Block k copies piece table[k] (k, k + gridDim.x, ... when n exceeds the grid): 8-byte words
// where source, destination and length are multiples of 8, else bytes (still consecutive
// threads on consecutive bytes).
template <int = 0>
__global__ void copy_pieces(const copy_piece* __restrict__ table, std::size_t n) {
  for (std::size_t k = blockIdx.x; k < n; k += gridDim.x) {
    const copy_piece p = table[k];
    const auto* s = static_cast<const unsigned char*>(p.src);
    auto* d = static_cast<unsigned char*>(p.dst);
    if (((reinterpret_cast<std::uintptr_t>(s) | reinterpret_cast<std::uintptr_t>(d) | p.bytes) & 7u) == 0) {
      const auto* s8 = reinterpret_cast<const std::uint64_t*>(s);
      auto* d8 = reinterpret_cast<std::uint64_t*>(d);
      for (std::size_t i = threadIdx.x; i < p.bytes / 8; i += blockDim.x) d8[i] = s8[i];
    } else {
      for (std::size_t i = threadIdx.x; i < p.bytes; i += blockDim.x) d[i] = s[i];
    }
  }
}

// Slots of `words` 32-bit words: dst[dst_slot[k]] = src[src_slot[k]] (null list = identity),
// block k for slot k (k, k + gridDim.x, ... when n exceeds the grid).
template <int = 0>
__global__ void move_slots(std::uint32_t* dst, const std::uint32_t* dst_slot, const std::uint32_t* src,
                           const std::uint32_t* src_slot, std::size_t words, std::size_t n) {
  for (std::size_t k = blockIdx.x; k < n; k += gridDim.x) {
    const std::size_t d = dst_slot ? dst_slot[k] : k, s = src_slot ? src_slot[k] : k;
    for (std::size_t i = threadIdx.x; i < words; i += blockDim.x) dst[d * words + i] = src[s * words + i];
  }
}

// dst[i] = src[i] converted through fp32 (widening exact, narrowing to nearest even: the
// host's convert bits).
template <class S, class D>
__global__ void convert(const S* __restrict__ src, D* __restrict__ dst, std::size_t n) {
  for (std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x)
    dst[i] = from_float<D>(to_float(src[i]));
}

// Lines l of len elements: dst[l * dst_stride + j] = src[l * src_stride + j] converted through
// fp32 (convert's bits); block (bx, by): elements bx*blockDim.x.. of lines by, by + gridDim.y, ...
template <class S, class D>
__global__ void convert_lines(const S* __restrict__ src, std::size_t src_stride, D* __restrict__ dst,
                              std::size_t dst_stride, std::size_t lines, std::size_t len) {
  const std::size_t j = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= len) return;
  for (std::size_t l = blockIdx.y; l < lines; l += gridDim.y)
    dst[l * dst_stride + j] = from_float<D>(to_float(src[l * src_stride + j]));
}

}  // namespace cuda_kernels

class cuda_space {
 public:
  static constexpr const char* name = "cuda";
  template <class T>
  using buffer = device_array<T>;
  using stream_type = cudaStream_t;

  // A point in the stream's work (blocking-sync, so waiting on it sleeps instead of spinning).
  class event {
   public:
    event() = default;
    event(event&& o) noexcept : e_(std::exchange(o.e_, nullptr)) {}
    event& operator=(event&& o) noexcept {
      if (this != &o) {
        reset();
        e_ = std::exchange(o.e_, nullptr);
      }
      return *this;
    }
    ~event() { reset(); }
    cudaEvent_t get() const noexcept { return e_; }
    void create() {
      if (!e_) ZF_CUDA_TRY(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming | cudaEventBlockingSync));
    }
    void wait() const {
      if (e_) ZF_CUDA_TRY(cudaEventSynchronize(e_));
    }

   private:
    void reset() noexcept {
      if (e_) cudaEventDestroy(e_);
      e_ = nullptr;
    }
    cudaEvent_t e_ = nullptr;
  };

  // device: the CUDA device to use (-1: the calling thread's current device). Nothing touches
  // CUDA before initialize().
  explicit cuda_space(int device = -1) noexcept : device_(device) {}

  // Fails with a clear cuda_error when there is no usable GPU (no device, or no driver).
  void initialize() {
    int n = 0;  // left unwritten when there is no driver
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // (reported here: see cuda_detail::throw_error)
      throw cuda_error(e, std::string("zenflow: cuda_space needs a CUDA GPU: cudaGetDeviceCount: ") +
                              cudaGetErrorName(e) + " (" + std::to_string(int(e)) + "): " + cudaGetErrorString(e));
    }
    if (n == 0) throw cuda_error(cudaErrorNoDevice, "zenflow: cuda_space needs a CUDA GPU: no CUDA device found");
    if (device_ >= n)
      throw cuda_error(cudaErrorInvalidDevice, "zenflow: cuda_space: device " + std::to_string(device_) +
                                                   " requested, " + std::to_string(n) + " present");
    if (device_ >= 0) ZF_CUDA_TRY(cudaSetDevice(device_));
    else ZF_CUDA_TRY(cudaGetDevice(&device_));
    live_ = true;
  }
  // A CUDA error waiting in the calling thread's last-error slot from before a call into zenflow:
  // an earlier launch or runtime call whose status nobody read (the trainer's, or a library's).
  // zenflow's launch checks read that slot, so it would be reported as the failure of zenflow's
  // next kernel, and the trainer's own failure (a backward that did not launch) would be
  // misnamed. step() and initialize() look first (the optimizer calls these two) and throw this
  // instead, before anything changed, leaving the slot as it is: the error is the caller's to
  // read. A query's "not ready" or a call's "already enabled" is no error
  // (cuda_detail::answer_not_failure).
  static bool error_pending() noexcept { return cuda_detail::is_failure(cudaPeekAtLastError()); }
  static void check_no_pending_error(const char* call) {
    const cudaError_t e = cudaPeekAtLastError();
    if (!cuda_detail::is_failure(e)) return;
    throw cuda_error(e, std::string("zenflow: ") + call + ": a CUDA error from an earlier call on this thread was never checked: " +
                            cudaGetErrorName(e) + " (" + std::to_string(int(e)) + "): " + cudaGetErrorString(e) +
                            "; nothing was done. cudaGetLastError() reads and clears it (unless it is a sticky device "
                            "fault, which ends the CUDA context); see the README for NCCL 2.28.3 linked statically");
  }
  int device() const noexcept { return device_; }

  // Refuses (std::logic_error) a program whose CUDA code flushes subnormal floats to zero: built
  // with -ftz=true or --use_fast_math, the device's AdamW, gradient norms and column scores would
  // differ from the host space's and from a build without it, where zenflow promises the same
  // bits. (Division and square roots are immune to -prec-div / -prec-sqrt: the kernels call the
  // correctly rounded intrinsics; products are never contracted: mul_rn.) The optimizer asks at
  // initialize(), after check_no_pending_error; one small kernel on a stream of its own.
  void check_arithmetic() const {
    const float in[2] = {0x1p-140f, 1.0f};
    float out[4] = {};
    device_array<float> d(6);
    const cudaError_t e = cuda_detail::run_alone([&](cudaStream_t s) {
      cudaError_t r = cudaMemcpyAsync(d.data(), in, sizeof in, cudaMemcpyHostToDevice, s);
      if (r != cudaSuccess) return r;
      cuda_kernels::arithmetic_probe<<<1, 1, 0, s>>>(d.data(), d.data() + 2);
      // (a "not ready" or "already enabled" the trainer left on the thread is no failure of the
      // launch: check_no_pending_error let it through)
      if (cuda_detail::is_failure(r = cudaGetLastError())) return r;
      return cudaMemcpyAsync(out, d.data() + 2, sizeof out, cudaMemcpyDeviceToHost, s);
    });
    if (e != cudaSuccess) cuda_detail::throw_error(e, "the arithmetic probe", __FILE__, __LINE__);
    if (!(out[0] == in[0] && out[1] == 2 * in[0] && out[2] == in[0] && out[3] == 1.0f))
      throw std::logic_error(
          "zenflow: this program's CUDA code flushes subnormal floats to zero (compiled with -ftz=true or "
          "--use_fast_math): the device's AdamW, gradient norms and selections would not give the bits the host space "
          "and other builds give. Compile the translation units that include zenflow's CUDA headers without "
          "--use_fast_math (or add -ftz=false after it); the trainer's own kernels may keep it in units of their own");
  }

  // Whether kernels on this space's GPU can use `bytes` at p, a param or grad the trainer
  // registered (`who` names it); the optimizer asks at initialize(), once the device is chosen,
  // before it builds anything. Refused with std::invalid_argument (see
  // cuda_detail::memory_refusal): a host pointer or a short allocation would be a fault, or a
  // write past the allocation, at the first kernel — and a fault ends the CUDA context with the
  // training state on it. The length of device and managed memory is measured against its
  // allocation's extent, which the driver's cuPointerGetAttribute gives (looked up through the
  // runtime: no link to the driver library); a trainer's sub-allocator (one allocation carved
  // into many tensors) is measured against the whole allocation. Not measured: memory mapped
  // with cuMemMap (a caching allocator's expandable segments: one range of the driver's may be
  // one mapped piece of several), page-locked host memory (registered in pieces, perhaps), and
  // any buffer where the driver's calls cannot be had or do not answer.
  void check_registered_memory(const void* p, std::size_t bytes, const std::string& who) const {
    cuda_detail::memory_facts f;
    cudaPointerAttributes a{};
    ZF_CUDA_TRY(cudaPointerGetAttributes(&a, p));
    f.type = a.type;
    f.device = a.device;
    f.same_address = a.devicePointer == p;
    if (a.type == cudaMemoryTypeUnregistered) {
      int pageable = 0;
      ZF_CUDA_TRY(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, device_));
      f.pageable_access = pageable != 0;
    } else if (const driver_calls& drv = driver();
               (a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged) && drv.complete()) {
      CUmemGenericAllocationHandle h{};
      const bool mapped_by_vmm = drv.retain(&h, const_cast<void*>(p)) == CUDA_SUCCESS;
      if (mapped_by_vmm) (void)drv.release(h);
      CUdeviceptr begin = 0;
      std::size_t size = 0;
      const auto d = static_cast<CUdeviceptr>(reinterpret_cast<std::uintptr_t>(p));
      if (!mapped_by_vmm && drv.pointer_attribute(&begin, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, d) == CUDA_SUCCESS &&
          drv.pointer_attribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, d) == CUDA_SUCCESS && size > 0) {
        f.range_known = true;
        f.range_begin = std::uintptr_t(begin);
        f.range_end = std::uintptr_t(begin) + size;
      }
    }
    const std::string why = cuda_detail::memory_refusal(f, p, bytes, device_);
    if (!why.empty()) throw std::invalid_argument("zenflow: " + who + " " + why);
  }

  // Whether the host can write `out`, the destination of a copy out of the optimizer (`who`
  // names the call; asked before the copy, with its other argument checks): device memory is
  // refused with std::invalid_argument, where the host cannot reach it (cuda_detail::host_refusal)
  // — the copy's host side would fault on it.
  void check_host_memory(const void* out, const std::string& who) const {
    cudaPointerAttributes a{};
    ZF_CUDA_TRY(cudaPointerGetAttributes(&a, out));
    int coherent = 0;
    if (a.type == cudaMemoryTypeDevice)
      ZF_CUDA_TRY(cudaDeviceGetAttribute(&coherent, cudaDevAttrPageableMemoryAccessUsesHostPageTables, a.device));
    const std::string why = cuda_detail::host_refusal(a.type, a.device, coherent != 0);
    if (!why.empty()) throw std::invalid_argument("zenflow: " + who + ": out " + why);
  }

  // Makes this space's device current on the calling thread (the optimizer calls it at each
  // public entry point; nothing to do before initialize() has chosen the device).
  void activate() {
    if (device_ >= 0) ZF_CUDA_TRY(cudaSetDevice(device_));
  }

  // The stream the device work goes on from now on. When it changes after initialize(), the new
  // stream first waits, on the device, for everything queued on the old one so far: the
  // optimizer's buffers and per-step tables were last used there, and the next step must not
  // overtake that work (it waits for the trainer's later work there too: a conservative order).
  // A stream the trainer destroyed is undefined to use: keep the old one alive until the switch.
  // Should the runtime refuse it anyway, the host waits for the whole device instead (best
  // effort). The stream changes only once the hand-over is in place: if it throws, the next call
  // tries again. With an error pending on the thread nothing is done (a refused record would
  // overwrite it, and the fallback's wait would report another error): the step or initialize()
  // this call precedes refuses, naming that error, and the switch waits for the next call.
  void set_stream(cudaStream_t s) {
    if (s == stream_ || !live_) {
      stream_ = s;
      return;
    }
    if (error_pending()) return;
    activate();
    handoff_.create();
    if (cudaEventRecord(handoff_.get(), stream_) == cudaSuccess) {
      ZF_CUDA_TRY(cudaStreamWaitEvent(s, handoff_.get(), 0));
    } else {
      (void)cudaGetLastError();  // (that refusal, not left for a later launch check to find)
      ZF_CUDA_TRY(cudaDeviceSynchronize());
    }
    stream_ = s;
  }
  // Why `s` cannot take the optimizer's work (empty: it can): a stream of another GPU than this
  // space's, where its kernels cannot launch — refused as an argument, before anything changes,
  // instead of a launch failing midway through a step. Asked of the runtime (CUDA 12.8 and
  // later); a stream it cannot place is left to the hand-over to report, and before initialize()
  // (the device not chosen yet) any stream is taken. With an error pending on the thread nothing
  // is asked (the step refuses, naming that error; the answer's clean-up below would clear it).
  std::string stream_refusal(cudaStream_t s) const {
#if CUDART_VERSION >= 12080
    if (!live_ || s == stream_ || error_pending()) return {};
    int d = -1;
    if (cudaStreamGetDevice(s, &d) != cudaSuccess) {
      (void)cudaGetLastError();  // (that answer, not left for a later launch check to find)
      return {};
    }
    if (d != device_)
      return "the stream is on GPU " + std::to_string(d) + ", the optimizer's work on GPU " + std::to_string(device_) +
             " (its kernels cannot launch there); nothing changed";
#else
    (void)s;
#endif
    return {};
  }
  // Nothing of the optimizer's is queued any more (a failed initialize() freed everything): the
  // next change of stream needs no hand-over.
  void forget_queued_work() noexcept { live_ = false; }
  cudaStream_t stream() const noexcept { return stream_; }

  void record(event& e) {
    e.create();
    ZF_CUDA_TRY(cudaEventRecord(e.get(), stream_));
  }
  // Waits for the stream's work so far, asleep on a blocking-sync event rather than spinning a
  // core the host lanes need (data parallel, each step's vote waits here while the trainer's
  // backward still runs).
  void fence() {
    fence_.create();
    ZF_CUDA_TRY(cudaEventRecord(fence_.get(), stream_));
    fence_.wait();
  }

  template <class F>
  void parallel_for(std::size_t n, const F& f) {
    if (n == 0) return;
    const unsigned b = cuda_kernels::blocks_for(n, cuda_kernels::threads);
    cuda_kernels::for_each<<<b < 65536u ? b : 65535u, cuda_kernels::threads, 0, stream_>>>(n, f);
    ZF_CUDA_CHECK_LAUNCH("for_each");
  }

  // Complete on return (waits for the stream up to this point).
  void download(void* host_dst, const void* src, std::size_t bytes) {
    if (!bytes) return;
    ZF_CUDA_TRY(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
    fence();
  }
  // Complete on return, whatever kind of host memory the source is (used for control data,
  // checkpoints and, data parallel, the step's 12-byte vote: a wait for the stream's work so far).
  void upload(void* dst, const void* host_src, std::size_t bytes) {
    if (!bytes) return;
    ZF_CUDA_TRY(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_));
    fence();
  }

  // The index of the first of n values of dtype t at p (device memory) that is not finite, or
  // n: initialize()'s check of the params it takes masters from, one pass on the device and 8
  // bytes back (complete on return, in the stream's order).
  std::size_t first_non_finite(const void* p, dtype t, std::size_t n) {
    if (n == 0) return 0;
    device_array<unsigned long long> first(1);
    unsigned long long got = n;
    upload(first.data(), &got, sizeof got);
    visit_dtype(t, [&](auto tag) {
      using P = typename decltype(tag)::type;
      parallel_for(n, cuda_kernels::first_non_finite_fn<P>{static_cast<const P*>(p), first.data()});
    });
    download(&got, first.data(), sizeof got);
    return std::size_t(got);
  }

  // Columns list[0..n) (a device list) of a device matrix into a compact [n][rows] block, and back.
  void compact_columns(const void* src, dtype t, matrix_layout layout, std::size_t rows, std::size_t cols,
                       const std::uint32_t* list, std::size_t n, void* dst) {
    columns<false>(src, t, dst, layout, rows, cols, list, n);
  }
  void scatter_columns(const void* block, dtype t, void* dst, matrix_layout layout, std::size_t rows,
                       std::size_t cols, const std::uint32_t* list, std::size_t n) {
    columns<true>(block, t, dst, layout, rows, cols, list, n);
  }
  // n elements of type st at src to type dt at dst (device memory; fp32 on at least one side).
  void convert(const void* src, dtype st, void* dst, dtype dt, std::size_t n) {
    if (n == 0) return;
    const unsigned b = cuda_kernels::blocks_for(n, cuda_kernels::threads);
    const unsigned grid = b < 65536u ? b : 65535u;
    with_types(st, dt, [&](auto s, auto d) {
      using S = decltype(s);
      using D = decltype(d);
      cuda_kernels::convert<S, D><<<grid, cuda_kernels::threads, 0, stream_>>>(static_cast<const S*>(src),
                                                                               static_cast<D*>(dst), n);
    });
    ZF_CUDA_CHECK_LAUNCH("convert");
  }
  // `lines` runs of len elements: type st at src (a run every src_stride elements) to type dt at
  // dst (every dst_stride), converted as convert() does (device memory).
  void convert_lines(const void* src, dtype st, std::size_t src_stride, void* dst, dtype dt, std::size_t dst_stride,
                     std::size_t lines, std::size_t len) {
    if (lines == 0 || len == 0) return;
    const dim3 grid(cuda_kernels::blocks_for(len, cuda_kernels::threads),
                    unsigned(lines < cuda_kernels::max_grid_y ? lines : cuda_kernels::max_grid_y));
    with_types(st, dt, [&](auto s, auto d) {
      using S = decltype(s);
      using D = decltype(d);
      cuda_kernels::convert_lines<S, D><<<grid, cuda_kernels::threads, 0, stream_>>>(
          static_cast<const S*>(src), src_stride, static_cast<D*>(dst), dst_stride, lines, len);
    });
    ZF_CUDA_CHECK_LAUNCH("convert_lines");
  }
  // table[0..n) of pieces (see copy_piece; the table in device memory too), in one launch. The
  // pieces must not overlap one another's destinations or sources being written.
  void copy_pieces(const copy_piece* table, std::size_t n) {
    if (n == 0) return;
    const unsigned blocks = n < cuda_kernels::max_grid_x ? unsigned(n) : cuda_kernels::max_grid_x;
    cuda_kernels::copy_pieces<<<blocks, cuda_kernels::threads, 0, stream_>>>(table, n);
    ZF_CUDA_CHECK_LAUNCH("copy_pieces");
  }
  void move_slots(void* dst, const std::uint32_t* dst_slot, const void* src, const std::uint32_t* src_slot,
                  std::size_t n, std::size_t width) {
    if (n == 0) return;
    const unsigned blocks = n < cuda_kernels::max_grid_x ? unsigned(n) : cuda_kernels::max_grid_x;
    cuda_kernels::move_slots<<<blocks, cuda_kernels::threads, 0, stream_>>>(
        static_cast<std::uint32_t*>(dst), dst_slot, static_cast<const std::uint32_t*>(src), src_slot, width / 4, n);
    ZF_CUDA_CHECK_LAUNCH("move_slots");
  }

 private:
  // run(S{}, D{}) with the element types of st and dt
  template <class Run>
  static void with_types(dtype st, dtype dt, Run run) {
    auto to = [&](auto s) {
      switch (dt) {
        case dtype::f32: return run(s, float{});
        case dtype::bf16: return run(s, bfloat16{});
        case dtype::f16: return run(s, float16{});
      }
    };
    switch (st) {
      case dtype::f32: to(float{}); break;
      case dtype::bf16: to(bfloat16{}); break;
      case dtype::f16: to(float16{}); break;
    }
  }
  template <bool Scatter>
  void columns(const void* in, dtype t, void* out, matrix_layout layout, std::size_t rows, std::size_t cols,
               const std::uint32_t* list, std::size_t n) {
    if (n == 0) return;
    auto run = [&](auto w) {
      using W = typename decltype(w)::type;
      if (layout == matrix_layout::column_contiguous) {
        const unsigned blocks = n < cuda_kernels::max_grid_x ? unsigned(n) : cuda_kernels::max_grid_x;
        cuda_kernels::columns_contiguous<W, Scatter><<<blocks, cuda_kernels::threads, 0, stream_>>>(
            static_cast<const W*>(in), static_cast<W*>(out), rows, list, n);
      } else {
        const unsigned row_tiles = cuda_kernels::blocks_for(rows, 32);
        const dim3 grid(cuda_kernels::blocks_for(n, 32),
                        row_tiles < cuda_kernels::max_grid_y ? row_tiles : cuda_kernels::max_grid_y);
        cuda_kernels::columns_row_major<W, Scatter><<<grid, dim3(32, cuda_kernels::tile_rows_per_pass), 0, stream_>>>(
            static_cast<const W*>(in), static_cast<W*>(out), rows, cols, list, n);
      }
    };
    if (size_of(t) == 2) run(cuda_kernels::word<2>{});
    else run(cuda_kernels::word<4>{});
    ZF_CUDA_CHECK_LAUNCH(layout == matrix_layout::column_contiguous ? "columns_contiguous" : "columns_row_major");
  }

  // The driver calls check_registered_memory makes, looked up once through the runtime (each
  // null where it cannot be had; the length check is then skipped).
  struct driver_calls {
    PFN_cuPointerGetAttribute_v4000 pointer_attribute = nullptr;
    PFN_cuMemRetainAllocationHandle_v11000 retain = nullptr;
    PFN_cuMemRelease_v10020 release = nullptr;
    bool complete() const noexcept { return pointer_attribute && retain && release; }
  };
  static const driver_calls& driver() noexcept {
    static const driver_calls calls = [] {
      auto find = [](const char* name) -> void* {
        void* f = nullptr;
        cudaDriverEntryPointQueryResult found{};
        if (cudaGetDriverEntryPointByVersion(name, &f, 12000, cudaEnableDefault, &found) != cudaSuccess ||
            found != cudaDriverEntryPointSuccess) {
          (void)cudaGetLastError();  // (not left for a later launch check to report)
          return nullptr;
        }
        return f;
      };
      driver_calls c;
      c.pointer_attribute = reinterpret_cast<PFN_cuPointerGetAttribute_v4000>(find("cuPointerGetAttribute"));
      c.retain = reinterpret_cast<PFN_cuMemRetainAllocationHandle_v11000>(find("cuMemRetainAllocationHandle"));
      c.release = reinterpret_cast<PFN_cuMemRelease_v10020>(find("cuMemRelease"));
      return c;
    }();
    return calls;
  }

  int device_ = -1;
  cudaStream_t stream_ = nullptr;
  bool live_ = false;  // initialize() has run: a change of stream hands the work over (set_stream)
  event handoff_;
  event fence_;  // fence()'s point in the stream
};

}  // namespace zenflow
