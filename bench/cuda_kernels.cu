// The GPU kernels of cuda_space against the device's own copy speed, measured side by side in
// one run, as JSON lines. The layer set is Llama-2-7B-shaped (32 layers: q, k, v, o 4096x4096;
// gate, up 11008x4096; down 4096x11008; cols = input features, one score each; bf16 params and
// grads), 224 matrices, 6.48G elements. Each kernel is timed with CUDA events around its launches
// only (no host round trip inside the timed region), alternated with a device-to-device copy
// that moves the same number of bytes (read + written); ratio = the kernel's GB/s over the
// copy's. Bytes are what each kernel must move:
//  - gradient_pass: every gradient read once (the per-column outputs, 18 B per column, are
//    counted too); both layouts, bf16 and f32 gradients;
//  - compact: the unselected 90 % of every matrix's columns read and written once (the
//    per-step offload's compaction), both layouts; then the same compaction fused into the
//    gradient pass (gradient_pass_compacting: every gradient read, the 90 % written) and its time
//    against the plain pass followed by the separate compaction (compaction_fused_vs_separate);
//  - fused_adamw: the selected 10 % of the columns: fp32 master and both moments read and
//    written, the gradient read, the param written;
//  - topk: the column top-k of all 224 matrices in one call, from device scores to the host's
//    sorted lists (host wall time, read-back included; goal 1 ms);
//  - step_overheads: per-step GPU idle inside step(): the summary read-back (host wall time of
//    gradient_pass() minus its kernels' device time) and a selection step's top-k; and the cost
//    of the host's wait itself, a blocking-sync event against a polled one (event_wait).
// Usage: cuda_kernels [--quick]   (quick: 4 layers, 5 repetitions)
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include <zenflow/cuda.hpp>

#include "cuda_timer.hpp"
#include "machine.hpp"

using namespace zenflow;
using zf_bench::median;
using zf_bench::spin_ns;
using zf_bench::timer;

namespace {

__global__ void fill_scores(double* s, std::size_t n, std::uint64_t seed) {
  const std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  std::uint64_t x = (i + 1) * 0x9e3779b97f4a7c15ull ^ seed;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 29;
  s[i] = double(x >> 11) * 0x1p-53;
}

// Median seconds of `work` and of a device-to-device copy moving `copy_bytes` (read + write),
// alternated.
template <class F>
std::pair<double, double> side_by_side(cudaStream_t s, int reps, std::size_t copy_bytes, F&& work) {
  device_array<unsigned char> a(copy_bytes / 2), b(copy_bytes / 2);
  timer t;
  std::vector<double> tw, tc;
  for (int r = -1; r < reps; ++r) {
    const double w = t.seconds(s, work);
    const double c = t.seconds(s, [&] {
      ZF_CUDA_TRY(cudaMemcpyAsync(b.data(), a.data(), copy_bytes / 2, cudaMemcpyDeviceToDevice, s));
    });
    if (r >= 0) {
      tw.push_back(w);
      tc.push_back(c);
    }
  }
  return {median(tw), median(tc)};
}

const char* layout_name(matrix_layout l) { return l == matrix_layout::row_major ? "row_major" : "column_contiguous"; }

struct shape {
  std::size_t rows, cols;
};
std::vector<shape> llama_layers(int layers) {
  std::vector<shape> v;
  for (int l = 0; l < layers; ++l)
    for (shape sh : {shape{4096, 4096}, shape{4096, 4096}, shape{4096, 4096}, shape{4096, 4096}, shape{11008, 4096},
                     shape{11008, 4096}, shape{4096, 11008}})
      v.push_back(sh);
  return v;
}

void print_ratio(const char* kernel, const char* extra, std::size_t bytes, double tw, double tc, const char* gpu,
                 int reps) {
  const double gbps = double(bytes) / tw / 1e9, copy = double(bytes) / tc / 1e9;
  std::printf("{%s\"kernel\":\"%s\",%s\"bytes\":%zu,\"seconds\":%.6g,\"gbps\":%.4g,\"copy_gbps\":%.4g,"
              "\"ratio\":%.4f,\"goal_ratio\":0.8,\"gpu\":\"%s\",\"reps\":%d}\n",
              zf_bench::run_fields(), kernel, extra, bytes, tw, gbps, copy, gbps / copy, gpu, reps);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) try {
  zf_bench::record_run(argc, argv);
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  const int reps = quick ? 5 : 15;
  const int layers = quick ? 4 : 32;
  cuda_space space;
  space.initialize();
  cudaDeviceProp prop{};
  ZF_CUDA_TRY(cudaGetDeviceProperties(&prop, space.device()));
  cudaStream_t s;
  ZF_CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  space.set_stream(s);
  const std::vector<shape> shapes = llama_layers(layers);
  std::size_t elems = 0, total_cols = 0;
  for (const shape& sh : shapes) {
    elems += sh.rows * sh.cols;
    total_cols += sh.cols;
  }
  char extra[256];

  // gradient pass over the whole layer set
  for (dtype gt : {dtype::bf16, dtype::f32})
    for (matrix_layout layout : {matrix_layout::column_contiguous, matrix_layout::row_major}) {
      device_array<unsigned char> g(elems * size_of(gt));
      ZF_CUDA_TRY(cudaMemsetAsync(g.data(), 0x3c, g.size(), s));  // finite values in every dtype
      fused_adamw<cuda_space> u;
      std::size_t at = 0;
      for (const shape& sh : shapes) {
        u.add_matrix({nullptr, g.data() + at * size_of(gt), sh.rows, sh.cols, dtype::bf16, gt, layout},
                     column_topk::k(0.1, sh.cols));
        at += sh.rows * sh.cols;
      }
      u.allocate();
      const std::size_t bytes = g.size() + 18 * total_cols;  // grads read; l1, sumsq, flag written
      const auto [tw, tc] = side_by_side(s, reps, bytes, [&] { u.enqueue_gradient_pass(space); });
      std::snprintf(extra, sizeof extra, "\"model\":\"llama2-7b\",\"layers\":%d,\"grad\":\"%s\",\"layout\":\"%s\",",
                    layers, std::string(name_of(gt)).c_str(), layout_name(layout));
      print_ratio("gradient_pass", extra, bytes, tw, tc, prop.name, reps);
      if (gt == dtype::bf16 && layout == matrix_layout::column_contiguous) {
        // the per-step read-back: host wall time of gradient_pass() against its kernels' time
        std::vector<double> wall;
        for (int r = -1; r < reps; ++r) {
          ZF_CUDA_TRY(cudaStreamSynchronize(s));
          const auto t0 = std::chrono::steady_clock::now();
          (void)u.gradient_pass(space);
          const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          if (r >= 0) wall.push_back(dt);
        }
        const double w = median(wall);
        std::printf("{%s\"kernel\":\"step_overheads\",\"what\":\"summary_readback\",\"model\":\"llama2-7b\",\"layers\":%d,"
                    "\"wall_seconds\":%.6g,\"kernel_seconds\":%.6g,\"gpu_idle_seconds\":%.6g,\"gpu\":\"%s\",\"reps\":%d}\n",
                    zf_bench::run_fields(), layers, w, tw, w > tw ? w - tw : 0.0, prop.name, reps);
        std::fflush(stdout);
      }
    }

  // What the wait itself costs: a 200 us spin kernel, then the host waits for an event recorded
  // after it — a blocking-sync event (what cuda_space's events are: the thread sleeps) against a
  // plain one polled with cudaEventQuery (a spinning core). Host wall time from the launch to the
  // wait's return, medians; the difference is the sleeping thread's wake-up.
  {
    const unsigned long long ns = 200000;
    cudaEvent_t sleeping, polled;
    ZF_CUDA_TRY(cudaEventCreateWithFlags(&sleeping, cudaEventDisableTiming | cudaEventBlockingSync));
    ZF_CUDA_TRY(cudaEventCreateWithFlags(&polled, cudaEventDisableTiming));
    std::vector<double> slept, spun;
    for (int r = -5; r < 20 * reps; ++r) {
      for (int mode = 0; mode < 2; ++mode) {  // alternated
        ZF_CUDA_TRY(cudaStreamSynchronize(s));
        const auto t0 = std::chrono::steady_clock::now();
        spin_ns<<<1, 1, 0, s>>>(ns);
        ZF_CUDA_TRY(cudaGetLastError());
        if (mode == 0) {
          ZF_CUDA_TRY(cudaEventRecord(sleeping, s));
          ZF_CUDA_TRY(cudaEventSynchronize(sleeping));
        } else {
          ZF_CUDA_TRY(cudaEventRecord(polled, s));
          cudaError_t e;
          while ((e = cudaEventQuery(polled)) == cudaErrorNotReady) {
          }
          ZF_CUDA_TRY(e);
        }
        const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (r >= 0) (mode == 0 ? slept : spun).push_back(dt);
      }
    }
    ZF_CUDA_TRY(cudaEventDestroy(sleeping));
    ZF_CUDA_TRY(cudaEventDestroy(polled));
    const double a = median(slept), b = median(spun);
    std::printf("{%s\"kernel\":\"step_overheads\",\"what\":\"event_wait\",\"spin_seconds\":%.6g,"
                "\"blocking_sync_wall_seconds\":%.6g,\"polling_wall_seconds\":%.6g,\"wakeup_seconds\":%.6g,"
                "\"gpu\":\"%s\",\"reps\":%zu}\n",
                zf_bench::run_fields(), double(ns) * 1e-9, a, b, a - b, prop.name, slept.size());
    std::fflush(stdout);
  }

  // compaction of the unselected 90 % of every matrix (bf16)
  for (matrix_layout layout : {matrix_layout::column_contiguous, matrix_layout::row_major}) {
    device_array<unsigned char> g(elems * 2);
    ZF_CUDA_TRY(cudaMemsetAsync(g.data(), 0x3c, g.size(), s));
    std::vector<device_array<std::uint32_t>> lists;
    std::vector<std::size_t> counts;
    std::vector<std::vector<std::uint32_t>> unselected;
    std::size_t moved = 0;
    for (const shape& sh : shapes) {
      const std::size_t k = column_topk::k(0.1, sh.cols);
      std::vector<std::uint32_t>& un = unselected.emplace_back();  // every column but a spread-out 10 %
      for (std::size_t c = 0; c < sh.cols; ++c)
        if ((c * k) % sh.cols >= k) un.push_back(std::uint32_t(c));
      lists.emplace_back(un.size());
      space.upload(lists.back().data(), un.data(), 4 * un.size());
      counts.push_back(un.size());
      moved += un.size() * sh.rows;
    }
    device_array<unsigned char> out(moved * 2);
    const std::size_t bytes = 2 * moved * 2 + 4 * [&] {
      std::size_t n = 0;
      for (std::size_t c : counts) n += c;
      return n;
    }();
    auto compact_all = [&] {
      std::size_t at = 0, src = 0;
      for (std::size_t i = 0; i < shapes.size(); ++i) {
        space.compact_columns(g.data() + src * 2, dtype::bf16, layout, shapes[i].rows, shapes[i].cols,
                              lists[i].data(), counts[i], out.data() + at * 2);
        at += counts[i] * shapes[i].rows;
        src += shapes[i].rows * shapes[i].cols;
      }
    };
    const auto [tw, tc] = side_by_side(s, reps, bytes, compact_all);
    std::snprintf(extra, sizeof extra, "\"model\":\"llama2-7b\",\"layers\":%d,\"dtype\":\"bf16\",\"layout\":\"%s\",",
                  layers, layout_name(layout));
    print_ratio("compact", extra, bytes, tw, tc, prop.name, reps);

    // The same compaction fused into the gradient pass (what step() does on a step without a
    // selection when the offload lane is idle), against the plain pass followed by the compaction
    // above, side by side. Bytes: every gradient read, the 90 % written, a 4-byte place read and
    // 18 B of scores written per column.
    fused_adamw<cuda_space> u;
    {
      std::size_t src = 0;
      for (const shape& sh : shapes) {
        u.add_matrix({nullptr, g.data() + src * 2, sh.rows, sh.cols, dtype::bf16, dtype::bf16, layout},
                     column_topk::k(0.1, sh.cols));
        src += sh.rows * sh.cols;
      }
    }
    u.allocate();
    std::vector<device_array<std::uint32_t>> places;
    std::vector<compaction_target> targets;
    for (std::size_t i = 0, at = 0; i < shapes.size(); at += counts[i] * shapes[i].rows, ++i) {
      std::vector<std::uint32_t> place(shapes[i].cols, no_slot);
      for (std::size_t k = 0; k < counts[i]; ++k) place[unselected[i][k]] = std::uint32_t(k);
      places.emplace_back(place.size());
      space.upload(places.back().data(), place.data(), 4 * place.size());
      targets.push_back({out.data() + at * 2, places.back().data()});
    }
    u.set_compaction(space, targets.data());
    const std::size_t fused_bytes = g.size() + 2 * moved + 22 * total_cols;
    const auto [tf, tcf] = side_by_side(s, reps, fused_bytes, [&] { u.enqueue_gradient_pass(space, true); });
    print_ratio("gradient_pass_compacting", extra, fused_bytes, tf, tcf, prop.name, reps);
    const auto [tsep, tcsep] = side_by_side(s, reps, fused_bytes, [&] {
      u.enqueue_gradient_pass(space);
      compact_all();
    });
    std::printf("{%s\"kernel\":\"compaction_fused_vs_separate\",%s\"fused_seconds\":%.6g,\"separate_seconds\":%.6g,"
                "\"fused_over_separate\":%.4f,\"gpu\":\"%s\",\"reps\":%d}\n",
                zf_bench::run_fields(), extra, tf, tsep, tf / tsep, prop.name, reps);
    std::fflush(stdout);
    (void)tcsep;
  }

  // fused selective AdamW on the selected 10 % (bf16 params and grads; f32 would not fit in
  // 80 GB next to the copy buffers at this size), both layouts: a row-major matrix's selected
  // column is one 2-byte element a row, so its param and grad move in sectors mostly unused
  // (the bytes counted are still only those the update needs)
  for (matrix_layout layout : {matrix_layout::column_contiguous, matrix_layout::row_major}) {
    const dtype t = dtype::bf16;
    device_array<unsigned char> p(elems * size_of(t)), g(elems * size_of(t));
    ZF_CUDA_TRY(cudaMemsetAsync(g.data(), 0x3c, g.size(), s));
    fused_adamw<cuda_space> u;
    std::size_t at = 0, sel = 0;
    for (const shape& sh : shapes) {
      u.add_matrix({p.data() + at * size_of(t), g.data() + at * size_of(t), sh.rows, sh.cols, t, t, layout},
                   column_topk::k(0.1, sh.cols));
      at += sh.rows * sh.cols;
    }
    u.allocate();
    for (std::size_t i = 0; i < shapes.size(); ++i) {
      auto& m = u.matrix(i);
      std::vector<std::uint32_t> cols(m.k);
      for (std::size_t j = 0; j < m.k; ++j) cols[j] = std::uint32_t(j * (shapes[i].cols / m.k));
      space.upload(m.columns[0].data(), cols.data(), 4 * m.k);
      m.active = m.k;
      sel += m.k * shapes[i].rows;
    }
    const std::size_t bytes = sel * (24 + 2 * size_of(t));
    const adamw_hyper h;
    const auto [tw, tc] = side_by_side(s, reps, bytes, [&] { u.update(space, 1.0f, h); });
    std::snprintf(extra, sizeof extra,
                  "\"model\":\"llama2-7b\",\"layers\":%d,\"dtype\":\"%s\",\"layout\":\"%s\",\"selected\":0.1,", layers,
                  std::string(name_of(t)).c_str(), layout_name(layout));
    print_ratio("fused_adamw", extra, bytes, tw, tc, prop.name, reps);
  }

  // top-k over the layer set in one call (a selection step's device work and read-back)
  {
    fused_adamw<cuda_space> u;
    for (const shape& sh : shapes)  // the scores are written directly; params and grads are never read
      u.add_matrix({nullptr, nullptr, sh.rows, sh.cols, dtype::bf16, dtype::bf16}, column_topk::k(0.1, sh.cols));
    u.allocate();
    std::vector<double> times;
    std::vector<std::vector<std::uint32_t>> out;
    for (int r = -1; r < reps; ++r) {
      fill_scores<<<unsigned((total_cols + 255) / 256), 256, 0, s>>>(u.device_scores(score_kind::l1), total_cols,
                                                                     77 + r);
      ZF_CUDA_TRY(cudaStreamSynchronize(s));
      const auto t0 = std::chrono::steady_clock::now();
      u.select_topk(space, score_kind::l1, out);
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (r >= 0) times.push_back(dt);
    }
    std::printf("{%s\"kernel\":\"topk\",\"model\":\"llama2-7b\",\"layers\":%d,\"matrices\":%zu,\"columns\":%zu,"
                "\"topk_ratio\":0.1,\"seconds\":%.6g,\"goal_seconds\":0.001,\"gpu\":\"%s\",\"reps\":%d}\n",
                zf_bench::run_fields(), layers, shapes.size(), total_cols, median(times), prop.name, reps);
  }
  // The pinned transport over the host link, per direction, against a plain cudaMemcpyAsync of
  // the same bytes between device memory and one page-locked buffer (the link's own speed):
  //  - d2h: stream_to_host (the offload lane: pieces into the two pinned lane buffers, each
  //    handed to a consumer that does nothing, so only the transport is timed);
  //  - h2d: fill_to_device with a fill that writes nothing (the pinned pieces' DMA alone); to_device
//    from pageable memory (each piece copied into a pinned buffer, then DMA);
  //    and the boundary upload's rounding of fp32 masters to bf16, through a pageable stage and
  //    to_device, or straight into the pinned buffer with fill_to_device.
  // Piece sizes: the optimizer's (columns of the largest matrix that fit its staging, ~2 MB at
  // this shape) and 32 MB.
  {
    const std::size_t bytes = quick ? (std::size_t(256) << 20) : (std::size_t(2) << 30);
    device_array<unsigned char> d(bytes);
    pinned_array<unsigned char> pinned(bytes);
    std::vector<unsigned char> pageable(bytes, 1);
    auto wall = [&](auto&& f) {
      std::vector<double> t;
      for (int r = -1; r < reps; ++r) {
        ZF_CUDA_TRY(cudaStreamSynchronize(s));
        const auto t0 = std::chrono::steady_clock::now();
        f();
        ZF_CUDA_TRY(cudaStreamSynchronize(s));
        if (r >= 0) t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      return median(t);
    };
    const double plain_d2h = wall([&] {
      ZF_CUDA_TRY(cudaMemcpyAsync(pinned.data(), d.data(), bytes, cudaMemcpyDeviceToHost, s));
    });
    const double plain_h2d = wall([&] {
      ZF_CUDA_TRY(cudaMemcpyAsync(d.data(), pinned.data(), bytes, cudaMemcpyHostToDevice, s));
    });
    for (std::size_t piece : {std::size_t(4096) * 2 * 256, std::size_t(32) << 20}) {
      cuda_pinned tr;
      tr.reserve(space, piece);
      cuda_space::event none;
      const double d2h = wall([&] { tr.stream_to_host(none, d.data(), bytes, piece, [](const void*, std::size_t, std::size_t) {}); });
      const double h2d = wall([&] { tr.to_device(d.data(), pageable.data(), bytes); });
      // The boundary upload's way (bf16 params rounded from an fp32 master, one thread): rounded
      // into a pageable stage then copied to pinned memory by to_device, as before fill_to_device;
      // and rounded straight into the pinned buffer by fill_to_device, as the optimizer does now.
      const std::size_t elems = bytes / 2;
      std::vector<float> master(elems, 0.5f);
      std::vector<unsigned char> stage(piece);
      const host::kernel_table& kt = host::kernels(host::best_isa());
      auto round_into = [&](void* out, std::size_t e0, std::size_t m) {
        kt.convert(host::convert_job{master.data() + e0, dtype::f32, out, dtype::bf16}, 0, m);
      };
      const double staged = wall([&] {
        for (std::size_t off = 0; off < bytes; off += piece) {
          const std::size_t len = std::min(piece, bytes - off);
          round_into(stage.data(), off / 2, len / 2);
          tr.to_device(d.data() + off, stage.data(), len);
        }
      });
      // The transport's own upload: fill_to_device with a fill that writes nothing (the pinned
      // pieces and their DMA only), the direction's counterpart of stream_to_host.
      const double upload = wall([&] {
        for (std::size_t off = 0; off < bytes; off += piece)
          tr.fill_to_device(d.data() + off, std::min(piece, bytes - off), [](void*) {});
      });
      const double filled = wall([&] {
        for (std::size_t off = 0; off < bytes; off += piece) {
          const std::size_t len = std::min(piece, bytes - off);
          tr.fill_to_device(d.data() + off, len, [&](void* pin) { round_into(pin, off / 2, len / 2); });
        }
      });
      for (auto [dir, path, t, plain] :
           {std::tuple{"d2h", "stream_to_host", d2h, plain_d2h}, std::tuple{"h2d", "fill_to_device", upload, plain_h2d},
            std::tuple{"h2d", "to_device_pageable", h2d, plain_h2d},
            std::tuple{"h2d", "round_stage_to_device", staged, plain_h2d},
            std::tuple{"h2d", "round_fill_to_device", filled, plain_h2d}})
        std::printf("{%s\"kernel\":\"transport\",\"direction\":\"%s\",\"path\":\"%s\",\"piece_bytes\":%zu,"
                    "\"bytes\":%zu,\"seconds\":%.6g,\"gbps\":%.4g,\"plain_gbps\":%.4g,\"ratio\":%.4f,"
                    "\"goal_ratio\":0.9,\"gpu\":\"%s\",\"reps\":%d}\n",
                    zf_bench::run_fields(),
                    dir, path, piece, bytes, t, double(bytes) / t / 1e9, double(bytes) / plain / 1e9, plain / t,
                    prop.name, reps);
      std::fflush(stdout);
    }
  }
  ZF_CUDA_TRY(cudaStreamDestroy(s));
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "cuda_kernels: %s\n", e.what());
  return 2;
}
