// cuda_space against the host space and the reference model. Every kernel is compared with the
// host space's code on the same inputs; the canonical summation order (functors.hpp) and the
// shared, unfused AdamW math make the expected result the host's exact bits, so the comparisons
// are bit-for-bit unless a comment argues otherwise. Skipped (ctest: "Skipped") without a GPU.
#include <doctest/doctest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <zenflow/cuda.hpp>

#include "cuda_support.hpp"
#include "optimizer_harness.hpp"
#include "support.hpp"

using namespace zenflow;
using zf_test::has_gpu;

namespace {

// Device copy of a host byte buffer.
struct dev_bytes {
  device_array<unsigned char> d;
  explicit dev_bytes(const std::vector<unsigned char>& h) : d(h.size()) {
    ZF_CUDA_TRY(cudaMemcpy(d.data(), h.data(), h.size(), cudaMemcpyHostToDevice));
  }
  std::vector<unsigned char> get() const {
    std::vector<unsigned char> h(d.size());
    ZF_CUDA_TRY(cudaMemcpy(h.data(), d.data(), h.size(), cudaMemcpyDeviceToHost));
    return h;
  }
};

template <class T>
device_array<T> to_device(const std::vector<T>& h) {
  device_array<T> d(h.size());
  ZF_CUDA_TRY(cudaMemcpy(d.data(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

std::vector<unsigned char> random_bytes(zf_test::rng& r, std::size_t n) {
  std::vector<unsigned char> v(n);
  for (auto& b : v) b = static_cast<unsigned char>(r.below(256));
  return v;
}

// Gradient values in [-1, 1) with a given count of distinct magnitudes (few: many exact ties).
std::vector<unsigned char> random_grad(zf_test::rng& r, dtype t, std::size_t n, int levels) {
  std::vector<unsigned char> v(n * size_of(t));
  for (std::size_t i = 0; i < n; ++i) {
    const double x = (levels ? double(r.below(levels)) / levels : r.uniform(0, 1)) * (r.below(2) ? 1 : -1);
    zf_test::store_float(v, t, i, float(x));
  }
  return v;
}

// The trainer's buffers of run_scenario, mirrored in device memory, each `offset` bytes into an
// allocation of its own (0: at the allocation's start, aligned for any access).
struct cuda_buffers {
  struct copy {
    std::vector<unsigned char>* host;
    device_array<unsigned char> dev;
    std::size_t offset;
    unsigned char* at() { return dev.data() + offset; }
  };
  std::vector<copy> copies;
  void* device(std::vector<unsigned char>& buf, std::size_t offset = 0) {
    copies.push_back({&buf, device_array<unsigned char>(buf.size() + offset), offset});
    ZF_CUDA_TRY(cudaMemcpy(copies.back().at(), buf.data(), buf.size(), cudaMemcpyHostToDevice));
    return copies.back().at();
  }
  void push(zf_test::trainer& tr) {
    for (auto& c : copies)
      for (auto* g : {&tr.mg, &tr.vgb})
        for (auto& b : *g)
          if (&b == c.host) ZF_CUDA_TRY(cudaMemcpy(c.at(), b.data(), b.size(), cudaMemcpyHostToDevice));
  }
  void pull(zf_test::trainer& tr) {
    ZF_CUDA_TRY(cudaDeviceSynchronize());  // the optimizer's stream has finished this step's work
    for (auto& c : copies)
      for (auto* p : {&tr.mp, &tr.vp})
        for (auto& b : *p)
          if (&b == c.host) ZF_CUDA_TRY(cudaMemcpy(b.data(), c.at(), b.size(), cudaMemcpyDeviceToHost));
  }
};

// One scenario on both spaces: a trainer each (the same gradient stream), the host optimizer on
// host buffers, the CUDA one on device copies (the matrices' params and grads `offset` elements
// into their allocations), both initialised.
struct lockstep {
  zf_test::trainer th, tc;
  cuda_buffers cb;
  optimizer<> ho;
  optimizer<cuda_space> co;
  explicit lockstep(const zf_test::scenario& sc, std::size_t offset = 0) : th(sc), tc(sc), ho(sc.cfg), co(sc.cfg) {
    for (std::size_t mi = 0; mi < sc.mats.size(); ++mi) {
      const auto& m = sc.mats[mi];
      ho.add_matrix({th.mp[mi].data(), th.mg[mi].data(), m.rows, m.cols, m.pt, m.gt, m.layout});
      co.add_matrix({cb.device(tc.mp[mi], offset * size_of(m.pt)), cb.device(tc.mg[mi], offset * size_of(m.gt)),
                     m.rows, m.cols, m.pt, m.gt, m.layout});
    }
    for (std::size_t vi = 0; vi < sc.vecs.size(); ++vi) {
      const auto& v = sc.vecs[vi];
      ho.add_vector({th.vp[vi].data(), th.vgb[vi].data(), v.n, v.pt, v.gt});
      co.add_vector({cb.device(tc.vp[vi]), cb.device(tc.vgb[vi]), v.n, v.pt, v.gt});
    }
    ho.initialize();
    co.initialize();
  }
};

// Busy for `ns` of wall time, whatever the SM clock (the global timer counts nanoseconds).
__global__ void spin_ns(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}
void busy_stream(cudaStream_t s, double ms) {
  spin_ns<<<1, 1, 0, s>>>((unsigned long long)(ms * 1e6));
  ZF_CUDA_TRY(cudaGetLastError());
}

// One fp32 matrix on the device (params 0.5, gradients 0.01) and a config at topk 0.1 with a
// host update every `interval` steps: the problem of the stream and debug-mode tests.
struct small_problem {
  std::size_t rows, cols;
  device_array<float> w, g;
  config cfg;
  small_problem(std::size_t r, std::size_t c, unsigned interval)
      : rows(r), cols(c), w(to_device(std::vector<float>(r * c, 0.5f))), g(to_device(std::vector<float>(r * c, 0.01f))) {
    cfg.topk_ratio = 0.1;
    cfg.update_interval = interval::every(interval);
  }
  matrix_param param() { return {w.data(), g.data(), rows, cols}; }
  // the params now (the device waited for first)
  std::vector<float> params() const {
    ZF_CUDA_TRY(cudaDeviceSynchronize());
    std::vector<float> h(rows * cols);
    ZF_CUDA_TRY(cudaMemcpy(h.data(), w.data(), 4 * h.size(), cudaMemcpyDeviceToHost));
    return h;
  }
};

}  // namespace

// This program is built without -ftz (test_cuda_ftz is built with it and must be refused): the
// probe that initialize() runs finds a subnormal kept through a product, a sum, a quotient and a
// widening to double.
TEST_CASE("cuda: a build that keeps subnormals passes the arithmetic probe" * doctest::skip(!has_gpu())) {
  cuda_space space;
  space.initialize();
  CHECK_NOTHROW(space.check_arithmetic());
  CHECK(cudaPeekAtLastError() == cudaSuccess);
}

TEST_CASE("cuda: column compaction, scatter and slot moves equal the host space's" * doctest::skip(!has_gpu())) {
  zf_test::rng r(11);
  cuda_space space;
  space.initialize();
  for (dtype t : {dtype::f32, dtype::bf16}) {
    for (matrix_layout layout : {matrix_layout::column_contiguous, matrix_layout::row_major}) {
      // the last shape has 65,625 row tiles of 32: more than a grid's 65,535 in y
      for (auto [rows, cols] : {std::pair<std::size_t, std::size_t>{1, 1}, {33, 70}, {300, 65}, {4096, 37},
                                {2'100'000, 3}}) {
        CAPTURE(rows);
        CAPTURE(cols);
        const std::size_t es = size_of(t);
        const auto m = random_bytes(r, rows * cols * es);
        std::vector<std::uint32_t> list;
        for (std::size_t c = 0; c < cols; ++c)
          if (r.below(3)) list.push_back(std::uint32_t(c));
        if (list.empty()) list.push_back(0);
        const std::size_t n = list.size();
        dev_bytes dm(m);
        auto dl = to_device(list);
        // gather
        std::vector<unsigned char> want(n * rows * es);
        host_space::compact_columns(m.data(), t, layout, rows, cols, list.data(), n, want.data());
        dev_bytes dblock(std::vector<unsigned char>(n * rows * es));
        space.compact_columns(dm.d.data(), t, layout, rows, cols, dl.data(), n, dblock.d.data());
        space.fence();
        CHECK(dblock.get() == want);
        // scatter into another matrix
        const auto base = random_bytes(r, rows * cols * es);
        std::vector<unsigned char> want2 = base;
        host_space::scatter_columns(want.data(), t, want2.data(), layout, rows, cols, list.data(), n);
        dev_bytes dm2(base);
        space.scatter_columns(dblock.d.data(), t, dm2.d.data(), layout, rows, cols, dl.data(), n);
        space.fence();
        CHECK(dm2.get() == want2);
      }
    }
  }
  // slot moves, with and without slot lists
  const std::size_t width = 4 * 77, slots = 50;
  const auto src = random_bytes(r, slots * width), dst0 = random_bytes(r, slots * width);
  std::vector<std::uint32_t> s_from(20), s_to(20);
  std::iota(s_from.begin(), s_from.end(), 3u);
  for (std::size_t k = 0; k < 20; ++k) s_to[k] = std::uint32_t(49 - 2 * k);
  for (int variant = 0; variant < 3; ++variant) {
    const std::uint32_t* hf = variant == 1 ? nullptr : s_from.data();
    const std::uint32_t* ht = variant == 2 ? nullptr : s_to.data();
    std::vector<unsigned char> want = dst0;
    host_space::move_slots(want.data(), ht, src.data(), hf, 20, width);
    dev_bytes ds(src), dd(dst0);
    auto df = to_device(s_from), dt = to_device(s_to);
    space.move_slots(dd.d.data(), ht ? dt.data() : nullptr, ds.d.data(), hf ? df.data() : nullptr, 20, width);
    space.fence();
    CHECK(dd.get() == want);
  }
  // batched copies: pieces at 8-byte-aligned places and lengths (the word path) and not (the
  // byte path: odd offsets, odd lengths, a flag array's single bytes), one piece empty; against the host space's memcpy of the same table
  {
    const std::size_t bytes = 40'000;
    const auto from = random_bytes(r, bytes), to0 = random_bytes(r, bytes);
    dev_bytes dfrom(from), dto(to0);
    std::vector<std::pair<std::size_t, std::size_t>> at;  // (offset, length), destinations disjoint
    std::size_t next = 0;
    for (std::size_t len : {std::size_t(8 * 513), std::size_t(1), std::size_t(0), std::size_t(4097), std::size_t(64),
                            std::size_t(3), std::size_t(8 * 1000 + 5), std::size_t(17)}) {
      at.push_back({next, len});
      next += len + (len % 2 ? 1 : 8);  // odd gaps put some pieces off the 8-byte grid
    }
    std::vector<copy_piece> host_table, dev_table;
    std::vector<unsigned char> want = to0;
    for (std::size_t k = 0; k < at.size(); ++k) {
      const auto [o, len] = at[k];
      const std::size_t src = (bytes - 9000 + 97 * k) % (bytes - len);  // a source anywhere, read only
      host_table.push_back({from.data() + src, want.data() + o, len});
      dev_table.push_back({dfrom.d.data() + src, dto.d.data() + o, len});
    }
    host_space::copy_pieces(host_table.data(), host_table.size());
    device_array<copy_piece> dtab(dev_table.size());
    space.upload(dtab.data(), dev_table.data(), dev_table.size() * sizeof(copy_piece));
    space.copy_pieces(dtab.data(), dev_table.size());
    space.fence();
    CHECK(dto.get() == want);
    CHECK(want != to0);  // (the reference moved something: two no-ops would agree too)
  }
}

// The gradient pass of both spaces on the same gradients: every per-column L1 and sum of
// squares, the flags and the total are the same bits (the canonical order; every term exact);
// every other trial the device pass also compacts (the offload's compaction fused into it), which
// changes none of those bits and writes each targeted column, and nothing else, to its place.
TEST_CASE("cuda: the fused gradient pass gives the host space's bits" * doctest::skip(!has_gpu())) {
  zf_test::rng r(12);
  for (int trial = 0; trial < 12; ++trial) {
    CAPTURE(trial);
    cuda_space cs;
    cs.initialize();
    host_space hs(1);
    fused_adamw<cuda_space> cu;
    fused_adamw<host_space> hu;
    std::vector<std::vector<unsigned char>> grads;
    std::vector<dev_bytes> dgrads;
    const dtype types[] = {dtype::f32, dtype::bf16, dtype::f16};
    const std::size_t nm = 1 + r.below(4), nv = r.below(3);
    std::vector<matrix_param> mats;
    std::vector<vector_param> vecs;
    for (std::size_t i = 0; i < nm; ++i) {
      const std::size_t rows = 1 + r.below(trial < 6 ? 70 : 3000), cols = 1 + r.below(trial < 6 ? 100 : 700);
      const dtype t = types[r.below(3)];
      grads.push_back(random_grad(r, t, rows * cols, trial % 2 ? 0 : 8));
      mats.push_back({nullptr, nullptr, rows, cols, dtype::f32, t,
                      r.below(2) ? matrix_layout::row_major : matrix_layout::column_contiguous});
    }
    for (std::size_t i = 0; i < nv; ++i) {
      const std::size_t n = 1 + r.below(20000);
      const dtype t = types[r.below(3)];
      grads.push_back(random_grad(r, t, n, 0));
      vecs.push_back({nullptr, nullptr, n, dtype::f32, t});
    }
    const bool poison = trial % 3 == 2;
    if (poison) {
      const std::size_t gi = r.below(grads.size());
      zf_test::store_float(grads[gi], gi < nm ? mats[gi].grad_type : vecs[gi - nm].grad_type, 0, NAN);
    }
    for (auto& g : grads) dgrads.emplace_back(g);
    for (std::size_t i = 0; i < nm; ++i) {
      matrix_param h = mats[i], d = mats[i];
      h.grad = grads[i].data();
      d.grad = dgrads[i].d.data();
      hu.add_matrix(h, 1);
      cu.add_matrix(d, 1);
    }
    for (std::size_t i = 0; i < nv; ++i) {
      vector_param h = vecs[i], d = vecs[i];
      h.grad = grads[nm + i].data();
      d.grad = dgrads[nm + i].d.data();
      hu.add_vector(h);
      cu.add_vector(d);
    }
    hu.allocate();
    cu.allocate();
    // The compacting pass's places: each matrix's columns in a random subset (none, some, all),
    // at random distinct places of a block with room to spare; the device writes only there.
    std::vector<compaction_target> htargets(nm), dtargets(nm);
    std::vector<std::vector<std::uint32_t>> slots(nm);
    std::vector<std::vector<unsigned char>> blocks(nm);
    std::vector<device_array<std::uint32_t>> dslots;
    std::vector<dev_bytes> dblocks;
    for (std::size_t i = 0; i < nm; ++i) {
      const std::size_t cols = mats[i].cols, col_bytes = mats[i].rows * size_of(mats[i].grad_type);
      const unsigned keep = unsigned(r.below(4));  // 0: none, 3: every column, else about keep / 3
      std::vector<std::uint32_t> place(cols + 2);
      std::iota(place.begin(), place.end(), 0u);
      for (std::size_t k = place.size() - 1; k > 0; --k) std::swap(place[k], place[r.below(k + 1)]);
      slots[i].assign(cols, no_slot);
      for (std::size_t c = 0; c < cols; ++c)
        if (keep == 3 || (keep && r.below(3) < keep)) slots[i][c] = place[c];
      blocks[i] = random_bytes(r, (cols + 2) * col_bytes);
      dslots.push_back(to_device(slots[i]));
      dblocks.emplace_back(blocks[i]);
      htargets[i] = {blocks[i].data(), slots[i].data()};
      dtargets[i] = {dblocks.back().d.data(), dslots.back().data()};
    }
    if (nm) {
      hu.set_compaction(hs, htargets.data());
      cu.set_compaction(cs, dtargets.data());
    }
    const bool compact = trial % 2 == 1;  // the plain pass and the compacting one, by turns
    const auto want = hu.gradient_pass(hs);
    const auto got = cu.gradient_pass(cs, compact);
    CHECK(got.finite == want.finite);
    if (poison) CHECK_FALSE(got.finite);
    for (std::size_t i = 0; i < nm; ++i) {
      CAPTURE(i);
      // the host pass did not compact: the expected block, column by column from the gradient
      std::vector<unsigned char> expect = blocks[i];
      const std::size_t rows = mats[i].rows, es = size_of(mats[i].grad_type);
      if (compact)
        for (std::size_t c = 0; c < mats[i].cols; ++c)
          if (slots[i][c] != no_slot)
            for (std::size_t e = 0; e < rows; ++e)
              std::memcpy(expect.data() + (std::size_t(slots[i][c]) * rows + e) * es,
                          grads[i].data() + element_offset(mats[i].layout, rows, mats[i].cols, e, c) * es, es);
      CHECK(dblocks[i].get() == expect);  // (every value's bits: a non-finite one too)
    }
    if (!want.finite) continue;  // (the scores of a non-finite gradient are never used)
    CHECK(got.sumsq == want.sumsq);  // bit-identical: the canonical order
    for (score_kind k : {score_kind::l1, score_kind::l2sq}) {
      cu.fetch_scores(cs, k);
      hu.fetch_scores(hs, k);
      for (std::size_t i = 0; i < nm; ++i)
        CHECK(std::memcmp(cu.scores(i, k), hu.scores(i, k), 8 * mats[i].cols) == 0);
    }
  }
}

// The pass in parts (a data-parallel rank's): each matrix's columns in two ranges, one launch per
// range set (so each launch's table starts inside matrices, row-major ones keeping their row
// stride), then the summary folded on the device from every column's statistics: the same bits
// as the host space's whole pass. And cuda_space's strided conversions (the reduce-scatter's
// packing) against the host's element conversions.
TEST_CASE("cuda: the gradient pass in parts and its device summary give the host space's bits" *
          doctest::skip(!has_gpu())) {
  zf_test::rng r(17);
  for (int trial = 0; trial < 8; ++trial) {
    CAPTURE(trial);
    cuda_space cs;
    cs.initialize();
    host_space hs(1);
    fused_adamw<cuda_space> cu;
    fused_adamw<host_space> hu;
    std::vector<std::vector<unsigned char>> grads;
    std::vector<dev_bytes> dgrads;
    const dtype types[] = {dtype::f32, dtype::bf16, dtype::f16};
    const std::size_t nm = 1 + r.below(4);
    std::vector<matrix_param> mats;
    for (std::size_t i = 0; i < nm; ++i) {
      const std::size_t rows = 1 + r.below(trial < 4 ? 70 : 900), cols = 2 + r.below(trial < 4 ? 100 : 400);
      const dtype t = types[r.below(3)];
      grads.push_back(random_grad(r, t, rows * cols, 0));
      mats.push_back({nullptr, nullptr, rows, cols, dtype::f32, t,
                      r.below(2) ? matrix_layout::row_major : matrix_layout::column_contiguous});
    }
    const std::size_t n = 1 + r.below(9000);
    grads.push_back(random_grad(r, dtype::bf16, n, 0));
    if (trial % 4 == 3) zf_test::store_float(grads[0], mats[0].grad_type, 0, NAN);
    for (auto& g : grads) dgrads.emplace_back(g);
    for (std::size_t i = 0; i < nm; ++i) {
      matrix_param h = mats[i], d = mats[i];
      h.grad = grads[i].data();
      d.grad = dgrads[i].d.data();
      hu.add_matrix(h, 1);
      cu.add_matrix(d, 1);
    }
    hu.add_vector({nullptr, grads[nm].data(), n, dtype::f32, dtype::bf16});
    cu.add_vector({nullptr, dgrads[nm].d.data(), n, dtype::f32, dtype::bf16});
    hu.allocate();
    cu.allocate();
    std::vector<std::size_t> split(nm);
    for (std::size_t i = 0; i < nm; ++i) split[i] = 1 + r.below(mats[i].cols - 1);
    for (int part = 0; part < 2; ++part) {
      for (std::size_t i = 0; i < nm; ++i)
        cu.column_stats(cs, i, part ? split[i] : 0, part ? mats[i].cols : split[i]);
      cu.vector_stats(cs);
    }
    const auto got = cu.summarize();
    const auto want = hu.gradient_pass(hs);
    CHECK(got.finite == want.finite);
    if (!want.finite) continue;
    CHECK(got.sumsq == want.sumsq);
    for (score_kind k : {score_kind::l1, score_kind::l2sq}) {
      cu.fetch_scores(cs, k);
      hu.fetch_scores(hs, k);
      for (std::size_t i = 0; i < nm; ++i) CHECK(std::memcmp(cu.scores(i, k), hu.scores(i, k), 8 * mats[i].cols) == 0);
    }
  }
  // strided conversions: `lines` runs of `len` between two strides, each way, every dtype pair
  cuda_space cs;
  cs.initialize();
  for (dtype st : {dtype::f32, dtype::bf16, dtype::f16})
    for (dtype dt : {dtype::f32, dtype::bf16, dtype::f16}) {
      CAPTURE(int(st));
      CAPTURE(int(dt));
      const std::size_t lines = 37, len = 53, ss = 61, ds = 58;
      const auto src = random_grad(r, st, lines * ss, 0);
      std::vector<unsigned char> dst0 = random_bytes(r, lines * ds * size_of(dt)), want = dst0;
      for (std::size_t l = 0; l < lines; ++l)
        for (std::size_t j = 0; j < len; ++j)
          zf_test::store_float(want, dt, l * ds + j, zf_test::load_as_float(src, st, l * ss + j));
      dev_bytes dsrc(src), ddst(dst0);
      cs.convert_lines(dsrc.d.data(), st, ss, ddst.d.data(), dt, ds, lines, len);
      cs.fence();
      CHECK(ddst.get() == want);
    }
}

// Top-k over all matrices in one call: the sets of the counting reference (reference.hpp) on the
// device's own scores, ties (few distinct gradient magnitudes, so many equal scores) broken by
// the lower column index.
TEST_CASE("cuda: top-k selects what the host selector selects, ties included" * doctest::skip(!has_gpu())) {
  zf_test::rng r(13);
  for (int trial = 0; trial < 10; ++trial) {
    CAPTURE(trial);
    cuda_space cs;
    cs.initialize();
    fused_adamw<cuda_space> cu;
    std::vector<std::vector<unsigned char>> grads;
    std::vector<dev_bytes> dgrads;
    std::vector<std::size_t> ks;
    const std::size_t nm = 1 + r.below(6);
    for (std::size_t i = 0; i < nm; ++i) {
      const std::size_t rows = 1 + r.below(40), cols = 1 + r.below(trial < 5 ? 200 : 5000);
      grads.push_back(random_grad(r, dtype::bf16, rows * cols, trial % 2 ? 3 : 0));
      dgrads.emplace_back(grads.back());
      ks.push_back(column_topk::k(trial < 5 ? 0.1 : 0.3, cols));
      cu.add_matrix({nullptr, dgrads.back().d.data(), rows, cols, dtype::f32, dtype::bf16,
                     r.below(2) ? matrix_layout::row_major : matrix_layout::column_contiguous},
                    ks.back());
    }
    cu.allocate();
    REQUIRE(cu.gradient_pass(cs).finite);
    for (score_kind kind : {score_kind::l1, score_kind::l2sq}) {
      std::vector<std::vector<std::uint32_t>> got;
      cu.select_topk(cs, kind, got);
      cu.fetch_scores(cs, kind);
      for (std::size_t i = 0; i < nm; ++i) {
        CHECK(got[i] == zf_ref::topk_columns(cu.scores(i, kind), cu.matrix(i).p.cols, ks[i]));
      }
    }
  }
}

// The whole optimizer on cuda_space against the reference model of the host issue: every
// selection, count, master (within master_tol), visible param and byte count, after every step.
TEST_CASE("cuda: zenflow on cuda_space matches the reference model, step by step" * doctest::skip(!has_gpu())) {
  const std::uint64_t seeds = zf_test::full_or_quick<std::uint64_t>(120, 20);
  for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
    CAPTURE(seed);
    const zf_test::scenario sc = zf_test::random_scenario(seed);
    optimizer<cuda_space> opt(sc.cfg);
    zf_test::run_scenario(sc, opt, nullptr, cuda_buffers{});
  }
}

// Uploads ahead (the update lane's copies on an upload stream of their own, into the device
// area; the boundary waits on an event and scatters): against the reference model step by step,
// with the same bits and bytes as the boundary upload, and the path taken.
TEST_CASE("cuda: uploads ahead match the reference model and the boundary upload, bit for bit" *
          doctest::skip(!has_gpu())) {
  const std::uint64_t seeds = zf_test::full_or_quick<std::uint64_t>(60, 12);
  std::uint64_t engaged = 0;
  for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
    CAPTURE(seed);
    const zf_test::scenario sc = zf_test::random_scenario(seed);
    std::vector<std::vector<std::vector<float>>> plain_trace, ahead_trace;
    optimizer<cuda_space> plain(sc.cfg);
    zf_test::run_scenario(sc, plain, &plain_trace, cuda_buffers{});
    optimizer<cuda_space> ahead(sc.cfg);
    ahead.transport().upload_ahead(true);
    zf_test::run_scenario(sc, ahead, &ahead_trace, cuda_buffers{});
    REQUIRE(ahead_trace == plain_trace);
    const optimizer_stats a = ahead.stats(), p = plain.stats();
    CHECK(a.bytes_to_device == p.bytes_to_device);
    CHECK(a.bytes_to_host == p.bytes_to_host);
    CHECK(a.host_pinned_bytes > p.host_pinned_bytes);  // two more lane buffers
    if (a.bytes_uploaded_ahead > 0) ++engaged;
  }
  CHECK(engaged > seeds / 4);
}

// Both spaces in lockstep on the same gradients: the same bits everywhere (masters, moments,
// counts, selections, params, byte counts), after every step.
void require_lockstep(const zf_test::scenario& sc, std::size_t offset = 0) {
  lockstep ls(sc, offset);
  auto& th = ls.th;
  auto& tc = ls.tc;
  auto& cb = ls.cb;
  auto& ho = ls.ho;
  auto& co = ls.co;
  std::vector<std::vector<double>> g1, g2, v1, v2;
  for (int step = 0; step < sc.steps; ++step) {
    CAPTURE(step);
    const double s1 = th.next(g1, v1), s2 = tc.next(g2, v2);
    REQUIRE(s1 == s2);
    cb.push(tc);
    const step_info a = ho.step(float(s1)), b = co.step(float(s2));
    cb.pull(tc);
    REQUIRE(a.skipped == b.skipped);
    REQUIRE(a.selection == b.selection);
    REQUIRE(a.boundary == b.boundary);
    for (std::size_t mi = 0; mi < sc.mats.size(); ++mi) {
      CAPTURE(mi);
      const std::size_t n = sc.mats[mi].rows * sc.mats[mi].cols;
      REQUIRE(ho.selected_columns(matrix_id{mi}) == co.selected_columns(matrix_id{mi}));
      REQUIRE(ho.column_counts(matrix_id{mi}) == co.column_counts(matrix_id{mi}));
      std::vector<float> x(n), y(n);
      ho.copy_master(matrix_id{mi}, x.data());
      co.copy_master(matrix_id{mi}, y.data());
      REQUIRE(std::memcmp(x.data(), y.data(), 4 * n) == 0);
      ho.copy_exp_avg_sq(matrix_id{mi}, x.data());
      co.copy_exp_avg_sq(matrix_id{mi}, y.data());
      REQUIRE(std::memcmp(x.data(), y.data(), 4 * n) == 0);
      REQUIRE(th.mp[mi] == tc.mp[mi]);
    }
    for (std::size_t vi = 0; vi < sc.vecs.size(); ++vi) REQUIRE(th.vp[vi] == tc.vp[vi]);
    REQUIRE(ho.stats().bytes_to_host == co.stats().bytes_to_host);
    REQUIRE(ho.stats().bytes_to_device == co.stats().bytes_to_device);
  }
}

TEST_CASE("cuda: cuda_space and host_space give bit-identical runs" * doctest::skip(!has_gpu())) {
  for (std::uint64_t seed = 401; seed <= 440; ++seed) {
    CAPTURE(seed);
    require_lockstep(zf_test::random_scenario(seed));
  }
}

// The selective AdamW moves a column-contiguous column of rows % 4 == 0 in 16- and 8-byte words
// when the column's param and grad and its slot's state start on the 4-element grid, else element
// by element (row-major, other row counts, buffers off the grid): every path gives the host's
// bits. Every param/grad dtype pair with 256 rows (k = 10 of 40 columns: 10 KB of state a
// moment, an allocation of its own, aligned), 66 rows and a row-major matrix; then the same with
// every param and grad buffer one element into its allocation (off the grid: the element loop).
TEST_CASE("cuda: the selective AdamW's word path and its element fallback give the host's bits" *
          doctest::skip(!has_gpu())) {
  zf_test::scenario sc;
  sc.cfg.topk_ratio = 0.25;
  sc.cfg.update_interval = interval::every(2);
  sc.cfg.select_interval = interval::every(4);
  sc.cfg.adam.weight_decay = 0.05f;
  sc.steps = 12;
  const dtype types[] = {dtype::f32, dtype::bf16, dtype::f16};
  for (dtype pt : types)
    for (dtype gt : types) sc.mats.push_back({256, 40, pt, gt, matrix_layout::column_contiguous});
  sc.mats.push_back({66, 40, dtype::bf16, dtype::bf16, matrix_layout::column_contiguous});
  sc.mats.push_back({256, 40, dtype::bf16, dtype::bf16, matrix_layout::row_major});
  for (std::size_t offset : {0, 1}) {
    CAPTURE(offset);
    require_lockstep(sc, offset);
  }
}

// A row-major matrix's selected columns are updated in tiles of 32 slots x 64 rows: every
// param/grad dtype pair (the fp32 param its own master among them) with 130 rows and 700 columns
// (k = 70: two full slot tiles and one of 6; two full row tiles and one of 2), and the edges —
// 64 rows and k = 32 exactly, one row, one column — give the host's bits, step for step.
TEST_CASE("cuda: the row-major selective AdamW's tiles give the host's bits" * doctest::skip(!has_gpu())) {
  zf_test::scenario sc;
  sc.cfg.topk_ratio = 0.1;
  sc.cfg.update_interval = interval::every(2);
  sc.cfg.select_interval = interval::every(4);
  sc.cfg.adam.weight_decay = 0.05f;
  sc.steps = 10;
  const dtype types[] = {dtype::f32, dtype::bf16, dtype::f16};
  for (dtype pt : types)
    for (dtype gt : types) sc.mats.push_back({130, 700, pt, gt, matrix_layout::row_major});
  sc.mats.push_back({64, 320, dtype::bf16, dtype::bf16, matrix_layout::row_major});
  sc.mats.push_back({1, 50, dtype::f32, dtype::bf16, matrix_layout::row_major});
  sc.mats.push_back({97, 1, dtype::bf16, dtype::f32, matrix_layout::row_major});
  require_lockstep(sc);
}

// Overlap: after step() returns, the offload (D2H + host accumulation) and the window's host
// AdamW finish while the stream is still busy with the next "forward/backward" (a spinning
// kernel): host work runs behind the device, not in front of it.
TEST_CASE("cuda: offload and host update overlap the device's next work" * doctest::skip(!has_gpu())) {
  small_problem pb(1024, 1024, 2);
  pb.cfg.select_interval = interval::every(1000);
  pb.cfg.overlap_step = true;
  cudaStream_t stream;
  ZF_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    // (background jobs with a 50 ms head start: still running when a step that does not wait returns)
    optimizer<cuda_space, column_topk, fused_adamw<cuda_space>, simd_accumulator, cuda_pinned, zf_test::late_lanes<50, 50>>
        opt(pb.cfg);
    opt.add_matrix(pb.param());
    opt.initialize(stream);
    CHECK(opt.stats().host_pinned_bytes > 0);
    for (int t = 0; t < 6; ++t) {
      const step_info info = opt.step(stream, 1.0f);
      // step() returned without waiting for its background work: the offload (after the first
      // selection: before it the offload is synchronous) and, at a boundary, the host update
      // are still in their 50 ms head start (a step that waited for them would find them done)
      if (t >= 1) CHECK(opt.scheduler().busy());
      CAPTURE(info.boundary);
      busy_stream(stream, 300.0);  // the next forward/backward
      // (polled: the optimizer's scheduler is read-only outside it; both lanes idle means the
      // step's offload and, at a boundary, its host update are done)
      while (opt.scheduler().busy()) std::this_thread::sleep_for(std::chrono::microseconds(200));
      REQUIRE_FALSE(opt.scheduler().failed());
      // the host side is done and the device is still in the 300 ms kernel
      CHECK(cudaStreamQuery(stream) == cudaErrorNotReady);
      ZF_CUDA_TRY(cudaStreamSynchronize(stream));
    }
  }
  ZF_CUDA_TRY(cudaStreamDestroy(stream));
}

// stats() counts the CUDA updater's host-side memory. Page-locked, beyond the transport's staging:
// one 16-byte summary, one update-table entry per matrix and vector, one coefficient and one mass
// entry and two masses per matrix, and the selection's read-back of 4 bytes per column of k.
// Bookkeeping: the host copy of the gradient pass's launch table (an entry per matrix and vector)
// and each matrix's pass range (a pair of sizes), beyond the records every space keeps. The sizes
// are spelt out here from what each table holds, not read back from the updater.
TEST_CASE("cuda: stats() counts the updater's host tables and its page-locked memory" * doctest::skip(!has_gpu())) {
  namespace ck = cuda_kernels;
  small_problem a(256, 64, 2), b(128, 40, 2);
  device_array<float> vw(to_device(std::vector<float>(300, 0.5f))), vg(to_device(std::vector<float>(300, 0.01f)));
  optimizer<cuda_space> opt(a.cfg);
  opt.add_matrix(a.param());
  opt.add_matrix(b.param());
  opt.add_vector({vw.data(), vg.data(), 300});
  opt.initialize();
  const std::size_t m = 2, v = 1;
  // (the read-back is sized for every matrix's k, whatever is selected yet: none before a step)
  const std::size_t k = column_topk::k(a.cfg.topk_ratio, 64) + column_topk::k(a.cfg.topk_ratio, 40);
  REQUIRE(k == 6 + 4);
  const std::size_t tables = sizeof(ck::grad_totals) + sizeof(ck::update_segment) * (m + v) +
                             (sizeof(ck::coeff_segment) + sizeof(ck::mass_segment) + 16) * m;
  const optimizer_stats s = opt.stats();
  CHECK(s.host_pinned_bytes == opt.transport().pinned_bytes() + tables + 4 * k);

  // the updater alone (the same tensors, with ks of its own): its records beyond the registry's
  fused_adamw<cuda_space> u;
  u.add_matrix(a.param(), 7);
  u.add_matrix(b.param(), 4);
  u.add_vector({vw.data(), vg.data(), 300});
  u.allocate();
  using registry = updater_registry<detail::cuda_matrix_state, detail::cuda_vector_state>;
  const std::size_t base = static_cast<const registry&>(u).records_bytes();
  CHECK(u.records_bytes() == base + sizeof(ck::grad_segment) * (m + v) + 2 * sizeof(std::size_t) * m);
  CHECK(u.pinned_bytes() == tables + 4 * (7 + 4));
  ZF_CUDA_TRY(cudaDeviceSynchronize());
}

// A trainer that polls its stream (cudaStreamQuery answering cudaErrorNotReady) must not make the
// optimizer's next launch check throw: the runtime may keep NotReady as the thread's last error.
TEST_CASE("cuda: a stream query answering NotReady does not fail the next step" * doctest::skip(!has_gpu())) {
  small_problem pb(64, 96, 1);
  cudaStream_t stream;
  ZF_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    optimizer<cuda_space> opt(pb.cfg);
    opt.add_matrix(pb.param());
    opt.initialize(stream);
    for (int t = 0; t < 3; ++t) {
      busy_stream(stream, 50.0);
      REQUIRE(cudaStreamQuery(stream) == cudaErrorNotReady);
      // what the runtime keeps (recorded in the test log; the step must pass either way)
      MESSAGE("last error after the query: " << std::string(cudaGetErrorName(cudaPeekAtLastError())));
      step_info info{};
      CHECK_NOTHROW(info = opt.step(stream, 1.0f));
      CHECK_FALSE(info.skipped);
      ZF_CUDA_TRY(cudaStreamSynchronize(stream));
    }
  }
  ZF_CUDA_TRY(cudaStreamDestroy(stream));
}

// initialize() after the trainer's stream query answered NotReady (kept in the thread's
// last-error slot): no error, so initialize() goes on — its arithmetic probe used to read the
// slot after its launch and fail on that answer — and a step and its selection too (CUB peeks
// at the slot after its launches).
TEST_CASE("cuda: initialize() and a selection after a query answering NotReady" * doctest::skip(!has_gpu())) {
  small_problem pb(64, 96, 1);
  cudaStream_t stream;
  ZF_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    optimizer<cuda_space> opt(pb.cfg);
    opt.add_matrix(pb.param());
    busy_stream(stream, 50.0);
    REQUIRE(cudaStreamQuery(stream) == cudaErrorNotReady);
    MESSAGE("last error after the query: " << std::string(cudaGetErrorName(cudaPeekAtLastError())));
    CHECK_NOTHROW(opt.initialize(stream));
    busy_stream(stream, 50.0);
    REQUIRE(cudaStreamQuery(stream) == cudaErrorNotReady);
    step_info info{};
    CHECK_NOTHROW(info = opt.step(stream, 1.0f));
    CHECK(info.selection);
    CHECK(opt.selected_columns(matrix_id{0}).size() == 9);  // floor(0.1 * 96)
    ZF_CUDA_TRY(cudaStreamSynchronize(stream));
  }
  ZF_CUDA_TRY(cudaStreamDestroy(stream));
}

// initialize()'s check of the params on the device: cuda_space::first_non_finite (one device
// pass) names the lowest index of a NaN or infinity in each dtype, as the host's scan of a copy
// does; through the optimizer, step() names the first bad param — a vector's element, a
// resident fp32 matrix's row and column (row-major here), a host-updated matrix's — and refuses
// until a load, after which the run trains.
TEST_CASE("cuda: a param that is not finite at initialize() is found on the device and named by step()" *
          doctest::skip(!has_gpu())) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  {
    cuda_space space;
    space.initialize();
    const std::size_t n = (std::size_t(3) << 20) + 17;
    for (const dtype t : {dtype::f32, dtype::bf16, dtype::f16}) {
      CAPTURE(t);
      for (const std::vector<std::size_t>& bad : std::vector<std::vector<std::size_t>>{
               {}, {n - 1}, {2500000, 70000, 1900000}, {0, 5}}) {
        std::vector<float> x(n, 0.75f);
        for (std::size_t k = 0; k < bad.size(); ++k) x[bad[k]] = k % 2 ? nan : -inf;
        std::vector<unsigned char> h(n * size_of(t));
        for (std::size_t i = 0; i < n; ++i) zf_test::store_float(h, t, i, x[i]);
        const dev_bytes d(h);
        std::size_t want = n;
        for (const std::size_t k : bad) want = std::min(want, k);
        CHECK(space.first_non_finite(d.d.data(), t, n) == want);
      }
    }
  }
  const std::size_t rows = 64, cols = 96;
  std::vector<float> w(rows * cols, 0.5f), b(40, 0.25f);
  device_array<float> wd = to_device(w), gd = to_device(std::vector<float>(rows * cols, 0.01f));
  device_array<bfloat16> bd(b.size()), gbd(b.size());
  {
    std::vector<bfloat16> hb(b.size(), to_bfloat16(0.25f)), hg(b.size(), to_bfloat16(0.01f));
    ZF_CUDA_TRY(cudaMemcpy(bd.data(), hb.data(), 2 * hb.size(), cudaMemcpyHostToDevice));
    ZF_CUDA_TRY(cudaMemcpy(gbd.data(), hg.data(), 2 * hg.size(), cudaMemcpyHostToDevice));
  }
  const std::string path = std::string(ZF_TEST_TMP_DIR) + "/cuda_unfit.zfckpt";
  for (const bool resident : {false, true}) {
    CAPTURE(resident);
    config cfg;
    cfg.topk_ratio = resident ? 1.0 : 0.1;
    if (resident) cfg.full_warm_up_rounds = 0;
    const matrix_param m = matrix(wd.data(), gd.data(), zenflow::rows{rows}, zenflow::cols{cols}).row_major();
    const vector_param v = zenflow::vector(bd.data(), gbd.data(), b.size()).dtypes(dtype::bf16, dtype::bf16);
    {  // the checkpoint a resume loads, from good params
      optimizer<cuda_space> good(cfg);
      good.add_matrix(m);
      good.add_vector(v);
      good.initialize();
      good.save(path);
    }
    // a NaN at row 5, column 70 and another at row 9, column 3: the first in the matrix's own
    // row-major order (resident), or the lowest column of the host's (column by column)
    const float saved[2] = {w[5 * cols + 70], w[9 * cols + 3]};
    ZF_CUDA_TRY(cudaMemcpy(wd.data() + 5 * cols + 70, &nan, 4, cudaMemcpyHostToDevice));
    ZF_CUDA_TRY(cudaMemcpy(wd.data() + 9 * cols + 3, &nan, 4, cudaMemcpyHostToDevice));
    const bfloat16 binf = to_bfloat16(inf);
    ZF_CUDA_TRY(cudaMemcpy(bd.data() + 33, &binf, 2, cudaMemcpyHostToDevice));
    optimizer<cuda_space> opt(cfg);
    opt.add_matrix(m);
    opt.add_vector(v);
    opt.initialize();
    const std::string want = std::string("step() refused: matrix 0's param held nan at row ") + (resident ? "5, column 70" : "9, column 3");
    CHECK_THROWS_WITH_AS(opt.step(), doctest::Contains(want.c_str()), std::invalid_argument);
    CHECK(opt.stats().steps == 0);
    // the matrix fixed by hand is still refused (its master was taken at initialize()); the
    // vector's infinity is named by an optimizer that sees only it
    ZF_CUDA_TRY(cudaMemcpy(wd.data() + 5 * cols + 70, &saved[0], 4, cudaMemcpyHostToDevice));
    ZF_CUDA_TRY(cudaMemcpy(wd.data() + 9 * cols + 3, &saved[1], 4, cudaMemcpyHostToDevice));
    CHECK_THROWS_AS(opt.step(), std::invalid_argument);
    {
      optimizer<cuda_space> other(cfg);
      other.add_matrix(m);
      other.add_vector(v);
      other.initialize();
      CHECK_THROWS_WITH_AS(other.step(), doctest::Contains("step() refused: vector 0's param held inf at element 33"),
                           std::invalid_argument);
    }
    opt.load(path);  // the file's params and masters: the refusal cleared
    step_info info{};
    CHECK_NOTHROW(info = opt.step());
    CHECK_FALSE(info.skipped);
    CHECK(info.t == 1);
    ZF_CUDA_TRY(cudaDeviceSynchronize());
  }
  std::remove(path.c_str());
}

// A stream of another GPU than the optimizer's: step(stream) refuses it as an argument
// (std::invalid_argument, nothing changed, the optimizer usable on its own stream), instead of a
// kernel launch failing midway through the step. Needs two GPUs (and CUDA 12.8 to ask a stream's
// device).
TEST_CASE("cuda: step() on a stream of another GPU is refused with nothing changed" *
          doctest::skip(!has_gpu() || [] {
            int n = 0;
            return cudaGetDeviceCount(&n) != cudaSuccess || n < 2;
          }())) {
  ZF_CUDA_TRY(cudaSetDevice(0));
  small_problem pb(64, 96, 2);
  cudaStream_t mine, foreign;
  ZF_CUDA_TRY(cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking));
  ZF_CUDA_TRY(cudaSetDevice(1));
  ZF_CUDA_TRY(cudaStreamCreateWithFlags(&foreign, cudaStreamNonBlocking));
  ZF_CUDA_TRY(cudaSetDevice(0));
  {
    optimizer<cuda_space> opt(pb.cfg);
    opt.add_matrix(pb.param());
    opt.initialize(mine);
    CHECK_FALSE(opt.step(mine, 1.0f).skipped);
    const auto before = opt.stats();
    CHECK_THROWS_WITH_AS(opt.step(foreign, 1.0f), doctest::Contains("the stream is on GPU 1"), std::invalid_argument);
    CHECK(opt.space().stream() == mine);
    CHECK(opt.stats().steps == before.steps);
    CHECK(opt.usable());
    CHECK_FALSE(opt.step(mine, 1.0f).skipped);
    opt.synchronize();
  }
  ZF_CUDA_TRY(cudaStreamDestroy(mine));
  ZF_CUDA_TRY(cudaSetDevice(1));
  ZF_CUDA_TRY(cudaStreamDestroy(foreign));
  ZF_CUDA_TRY(cudaSetDevice(0));
}

namespace {
__global__ void trainer_kernel() {}
}  // namespace

// The trainer's own launch that failed and was never checked (a grid of 0 blocks, its error left
// in the thread's last-error slot): step() refuses with that error, changes
// nothing and leaves it in the slot; once the trainer has read it, the run goes on bit for bit as
// one that never met it. (zenflow's launch checks used to report it as their own kernel's failure.)
TEST_CASE("cuda: an error the trainer left unchecked refuses step() with nothing changed, until it is read" *
          doctest::skip(!has_gpu())) {
  small_problem bad_pb(64, 96, 2), ref_pb(64, 96, 2);
  cudaStream_t stream, other;
  ZF_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ZF_CUDA_TRY(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  {
    optimizer<cuda_space> bad(bad_pb.cfg), ref(ref_pb.cfg);
    bad.add_matrix(bad_pb.param());
    ref.add_matrix(ref_pb.param());
    bad.initialize(stream);
    ref.initialize(stream);
    for (int t = 0; t < 6; ++t) {
      if (t == 3) {
        trainer_kernel<<<0, 1, 0, stream>>>();
        // (which code is the runtime's choice: CUDA 13.0 on an H200 gives cudaErrorInvalidValue)
        const cudaError_t left = cudaPeekAtLastError();
        REQUIRE(left != cudaSuccess);
        const auto before = bad.stats();
        try {
          bad.step(stream, 1.0f);
          FAIL("step() ran on a pending error");
        } catch (const cuda_error& e) {
          CHECK(e.code() == left);
          CHECK(std::string(e.what()).find("a CUDA error from an earlier call on this thread was never checked") !=
                std::string::npos);
        }
        // on another stream too, and the switch waits for the next call (a hand-over record that
        // the runtime refused would overwrite the error: nothing is recorded while one is pending)
        try {
          bad.step(other, 1.0f);
          FAIL("step() on another stream ran on a pending error");
        } catch (const cuda_error& e) {
          CHECK(e.code() == left);
        }
        CHECK(bad.space().stream() == stream);
        CHECK(bad.stats().steps == before.steps);
        CHECK(cudaGetLastError() == left);  // left for the trainer, who reads it now
      }
      CHECK_FALSE(bad.step(stream, 1.0f).skipped);
      CHECK_FALSE(ref.step(stream, 1.0f).skipped);
    }
    bad.synchronize();
    ref.synchronize();
    const std::vector<float> a = bad_pb.params(), b = ref_pb.params();
    CHECK(std::memcmp(a.data(), b.data(), 4 * a.size()) == 0);
  }
  ZF_CUDA_TRY(cudaStreamDestroy(other));
  ZF_CUDA_TRY(cudaStreamDestroy(stream));
}

// A step on another stream than the last one: the new stream first waits for what was queued on
// the old one (the optimizer's buffers and per-step tables were last used there). Each step here
// is followed by 200 ms of the "trainer's" work on its stream; the next step, on the other
// stream, reads back its finite flag, so when it returns the old stream's work must be done —
// without the hand-over the step would return while the other stream still spins. The training
// is that of one stream, bit for bit (a second optimizer on a third stream, same gradients).
TEST_CASE("cuda: steps on alternating streams wait for each other and train as on one stream" *
          doctest::skip(!has_gpu())) {
  // (update interval 1, selection every 3rd step: boundaries and selections on both streams)
  small_problem alt_pb(256, 384, 1), one_pb(256, 384, 1);
  alt_pb.cfg.select_interval = one_pb.cfg.select_interval = interval::every(3);
  cudaStream_t s[3];
  for (auto& x : s) ZF_CUDA_TRY(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
  {
    optimizer<cuda_space> alt(alt_pb.cfg), one(one_pb.cfg);
    alt.add_matrix(alt_pb.param());
    one.add_matrix(one_pb.param());
    alt.initialize(s[0]);
    one.initialize(s[2]);
    for (int t = 0; t < 8; ++t) {
      CHECK_FALSE(alt.step(s[t % 2], 1.0f).skipped);
      if (t > 0) CHECK(cudaStreamQuery(s[(t + 1) % 2]) == cudaSuccess);  // the last step's stream, done
      busy_stream(s[t % 2], 200.0);
      CHECK_FALSE(one.step(s[2], 1.0f).skipped);
    }
    alt.synchronize();
    one.synchronize();
    const std::vector<float> a = alt_pb.params(), b = one_pb.params();
    CHECK(std::memcmp(a.data(), b.data(), 4 * a.size()) == 0);
    CHECK(a != std::vector<float>(a.size(), 0.5f));  // (it trained)
  }
  for (auto& x : s) ZF_CUDA_TRY(cudaStreamDestroy(x));
}

// New device memory reads as zero from a non-blocking stream at once: the zeroing is complete
// when the array exists (it used to run on the default stream, unordered with such a stream).
// The old memory is filled first and freed, so a reallocation that reuses it and races its zeroing
// would show the fill; a race is timing-dependent, so this can catch a regression, not always.
TEST_CASE("cuda: new device arrays are zero on any stream" * doctest::skip(!has_gpu())) {
  const std::size_t n = std::size_t(64) << 20;  // 256 MB of floats: the zeroing takes ~0.1 ms
  cudaStream_t stream;
  ZF_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::vector<float> tail(1 << 16);
  for (int round = 0; round < 4; ++round) {
    {
      device_array<float> old(n);
      ZF_CUDA_TRY(cudaMemset(old.data(), 0x7f, n * sizeof(float)));
      ZF_CUDA_TRY(cudaDeviceSynchronize());
    }
    device_array<float> fresh(n);
    ZF_CUDA_TRY(cudaMemcpyAsync(tail.data(), fresh.data() + n - tail.size(), tail.size() * sizeof(float),
                                cudaMemcpyDeviceToHost, stream));
    ZF_CUDA_TRY(cudaStreamSynchronize(stream));
    std::size_t nonzero = 0;
    for (float v : tail) nonzero += v != 0.0f;
    CHECK(nonzero == 0);
  }
  ZF_CUDA_TRY(cudaStreamDestroy(stream));
}

// An exception thrown by the offload's consumer leaves no copy in flight: the next piece's copy,
// already enqueued, has landed when the exception leaves stream_to_host (the caller may reuse the
// source block and the lane buffers at once).
TEST_CASE("cuda: an exception on the offload lane leaves no copy in flight" * doctest::skip(!has_gpu())) {
  cuda_space space;
  space.initialize();
  cudaStream_t stream;
  ZF_CUDA_TRY(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  space.set_stream(stream);
  const std::size_t piece = std::size_t(64) << 20;  // ~1.2 ms per piece over PCIe
  cuda_pinned tr;
  tr.reserve(space, piece);
  device_array<unsigned char> block(4 * piece);
  cuda_space::event none;
  bool thrown = false;
  try {
    tr.stream_to_host(none, block.data(), block.size(), piece,
                      [](const void*, std::size_t, std::size_t) { throw std::runtime_error("consumer failed"); });
  } catch (const std::runtime_error&) {
    thrown = true;
  }
  CHECK(thrown);
  CHECK(cudaStreamQuery(tr.copy_stream()) == cudaSuccess);
  ZF_CUDA_TRY(cudaStreamDestroy(stream));
}

// The debug sync check (ZENFLOW_CUDA_SYNC_CHECK=1 or set_cuda_sync_check): every launch is
// followed by a device synchronisation and check; a correct run goes through unchanged.
TEST_CASE("cuda: steps with the debug sync check on" * doctest::skip(!has_gpu())) {
  small_problem pb(64, 96, 2);
  set_cuda_sync_check(true);
  struct off {  // (off again even when a step throws: the later cases run at full speed)
    ~off() { set_cuda_sync_check(false); }
  } restore;
  {
    optimizer<cuda_space> opt(pb.cfg);
    opt.add_matrix(pb.param());
    opt.initialize();
    for (int t = 0; t < 4; ++t) CHECK_FALSE(opt.step(1.0f).skipped);
    opt.synchronize();
  }
}

// A checkpoint written on one space loads on the other (one file format, the same state), and
// the two runs then go on with the same bits.
TEST_CASE("cuda: checkpoints move between spaces" * doctest::skip(!has_gpu())) {
  const zf_test::scenario sc = zf_test::random_scenario(7);
  lockstep ls(sc);
  auto& th = ls.th;
  auto& tc = ls.tc;
  auto& cb = ls.cb;
  auto& ho = ls.ho;
  auto& co = ls.co;
  std::vector<std::vector<double>> gm, gv;
  for (int s = 0; s < 17; ++s) {
    ho.step(float(th.next(gm, gv)));
    tc.next(gm, gv);  // the same gradient stream, not applied on the GPU side
  }
  const std::string path = std::string(ZF_TEST_TMP_DIR) + "/cuda_space.zfckpt";
  ho.save(path);
  co.load(path);
  for (int s = 0; s < 12; ++s) {
    CAPTURE(s);
    const float scale = float(th.next(gm, gv));
    tc.next(gm, gv);
    cb.push(tc);
    ho.step(scale);
    co.step(scale);
    cb.pull(tc);
    for (std::size_t mi = 0; mi < sc.mats.size(); ++mi) {
      const std::size_t n = sc.mats[mi].rows * sc.mats[mi].cols;
      std::vector<float> x(n), y(n);
      ho.copy_master(matrix_id{mi}, x.data());
      co.copy_master(matrix_id{mi}, y.data());
      REQUIRE(std::memcmp(x.data(), y.data(), 4 * n) == 0);
      REQUIRE(ho.column_counts(matrix_id{mi}) == co.column_counts(matrix_id{mi}));
      REQUIRE(th.mp[mi] == tc.mp[mi]);
    }
  }
  // and back: the GPU's checkpoint into a fresh host-space optimizer, which then goes on as the
  // host one that trained all along, bit for bit (its own buffers, fed the same gradients)
  co.save(path);
  zf_test::trainer t2(sc);
  optimizer<> h2(sc.cfg);
  for (std::size_t mi = 0; mi < sc.mats.size(); ++mi) {
    const auto& m = sc.mats[mi];
    h2.add_matrix({t2.mp[mi].data(), t2.mg[mi].data(), m.rows, m.cols, m.pt, m.gt, m.layout});
  }
  for (std::size_t vi = 0; vi < sc.vecs.size(); ++vi) {
    const auto& v = sc.vecs[vi];
    h2.add_vector({t2.vp[vi].data(), t2.vgb[vi].data(), v.n, v.pt, v.gt});
  }
  h2.initialize();
  h2.load(path);
  for (int s = 0; s < 6; ++s) {
    CAPTURE(s);
    for (std::size_t mi = 0; mi < sc.mats.size(); ++mi) {
      const std::size_t n = sc.mats[mi].rows * sc.mats[mi].cols;
      std::vector<float> x(n), y(n);
      ho.copy_master(matrix_id{mi}, x.data());
      h2.copy_master(matrix_id{mi}, y.data());
      REQUIRE(std::memcmp(x.data(), y.data(), 4 * n) == 0);
      REQUIRE(ho.column_counts(matrix_id{mi}) == h2.column_counts(matrix_id{mi}));
      REQUIRE(ho.selected_columns(matrix_id{mi}) == h2.selected_columns(matrix_id{mi}));
      REQUIRE(th.mp[mi] == t2.mp[mi]);
    }
    for (std::size_t vi = 0; vi < sc.vecs.size(); ++vi) REQUIRE(th.vp[vi] == t2.vp[vi]);
    const float scale = float(th.next(gm, gv));
    for (std::size_t mi = 0; mi < sc.mats.size(); ++mi) t2.mg[mi] = th.mg[mi];  // (same size: same buffer)
    for (std::size_t vi = 0; vi < sc.vecs.size(); ++vi) t2.vgb[vi] = th.vgb[vi];
    ho.step(scale);
    h2.step(scale);
  }
  std::remove(path.c_str());
}

namespace {
// A rows x cols fp32 matrix at wp (set to w0 first) with its grad at gp, trained 4 steps on
// `grads` (4 of them, one after another); the params then.
std::vector<float> train_in(const config& cfg, float* wp, float* gp, std::size_t rows, std::size_t cols,
                            const std::vector<float>& w0, const std::vector<float>& grads) {
  const std::size_t n = rows * cols;
  ZF_CUDA_TRY(cudaMemcpy(wp, w0.data(), 4 * n, cudaMemcpyDefault));
  optimizer<cuda_space> opt(cfg);
  opt.add_matrix({wp, gp, rows, cols});
  opt.initialize();
  for (int t = 0; t < 4; ++t) {
    ZF_CUDA_TRY(cudaMemcpy(gp, grads.data() + t * n, 4 * n, cudaMemcpyDefault));
    CHECK_FALSE(opt.step(1.0f).skipped);
  }
  opt.synchronize();
  ZF_CUDA_TRY(cudaDeviceSynchronize());
  std::vector<float> out(n);
  ZF_CUDA_TRY(cudaMemcpy(out.data(), wp, 4 * n, cudaMemcpyDefault));
  return out;
}
}  // namespace

// Buffers that kernels on the optimizer's GPU cannot use are refused at initialize(), naming the
// buffer, with nothing built and no CUDA error left behind (a fault at the first kernel would end
// the CUDA context and the training state on it): plain host memory (unless this GPU reaches
// pageable memory), an allocation shorter than the shape, a tensor carved out of an allocation
// that runs past its end. Those it can use — managed memory, page-locked host memory, memory
// from cudaMallocAsync's pool, a tensor carved out of a larger allocation — are accepted and
// train to the bits device memory gives.
// The shapes are whole multiples of 2 MiB, and every short case is short by 2 MiB or more, so
// that an allocation the driver rounds up to its granule still ends before the shape does.
TEST_CASE("cuda: initialize() refuses memory the GPU cannot use and accepts what it can" * doctest::skip(!has_gpu())) {
  const std::size_t rows = 1024, cols = 1024, n = rows * cols;  // 4 MiB of fp32
  config cfg;
  cfg.topk_ratio = 0.1;
  cfg.update_interval = interval::every(2);
  auto refused = [&](matrix_param p, const std::string& what) {
    CAPTURE(what);
    optimizer<cuda_space> opt(cfg);
    opt.add_matrix(p);
    try {
      opt.initialize();
      FAIL("initialize() accepted the buffer");
    } catch (const std::invalid_argument& e) {
      CHECK(std::string(e.what()).find(what) != std::string::npos);
      MESSAGE(e.what());
    }
    CHECK_FALSE(opt.initialized());
    CHECK(cudaPeekAtLastError() == cudaSuccess);
  };
  int dev = 0, pageable = 0;
  ZF_CUDA_TRY(cudaGetDevice(&dev));
  ZF_CUDA_TRY(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, dev));
  const std::string gpu = "GPU " + std::to_string(dev);
  device_array<float> w(n), g(n), half(n / 2), big(2 * n);
  std::vector<float> host(n, 0.5f);
  if (pageable) MESSAGE("this GPU reaches pageable host memory: a plain host pointer is usable, and accepted");
  else refused({host.data(), g.data(), rows, cols}, "matrix 0 param is host memory, which " + gpu + " cannot reach");
  refused({w.data(), half.data(), rows, cols},
          "matrix 0 grad needs " + std::to_string(4 * n) + " bytes by its shape, and its allocation ends " +
              std::to_string(2 * n) + " bytes after its start");
  // carved out of one allocation: the second half fits exactly, half a shape further does not
  refused({big.data() + n + n / 2, g.data(), rows, cols}, "its allocation ends " + std::to_string(2 * n) + " bytes");
  int count = 0;
  ZF_CUDA_TRY(cudaGetDeviceCount(&count));
  if (count > 1) {
    const int other = dev == 0 ? 1 : 0;
    ZF_CUDA_TRY(cudaSetDevice(other));
    device_array<float> elsewhere(n);
    ZF_CUDA_TRY(cudaSetDevice(dev));
    refused({w.data(), elsewhere.data(), rows, cols},
            "matrix 0 grad is device memory of GPU " + std::to_string(other) + ", and this optimizer runs on " + gpu);
  } else {
    MESSAGE("one GPU: device memory of another GPU is not tried here");
  }

  // accepted: the same training in device memory, in managed + page-locked memory, and in the
  // second half of one allocation, bit for bit
  zf_test::rng r(5);
  std::vector<float> w0(n), grads(4 * n);
  for (auto& x : w0) x = float(r.uniform(-1, 1));
  for (auto& x : grads) x = float(r.uniform(-1, 1));
  float* managed = nullptr;
  ZF_CUDA_TRY(cudaMallocManaged(&managed, 4 * n));
  struct free_managed {
    float* p;
    ~free_managed() { cudaFree(p); }
  } managed_guard{managed};
  pinned_array<float> pinned(n);
  auto train = [&](float* wp, float* gp) { return train_in(cfg, wp, gp, rows, cols, w0, grads); };
  const std::vector<float> want = train(w.data(), g.data());
  CHECK(want != w0);
  const std::vector<float> in_managed = train(managed, pinned.data());
  CHECK(std::memcmp(in_managed.data(), want.data(), 4 * n) == 0);
  const std::vector<float> carved = train(big.data() + n, g.data());
  CHECK(std::memcmp(carved.data(), want.data(), 4 * n) == 0);
  void* pooled = nullptr;
  ZF_CUDA_TRY(cudaMallocAsync(&pooled, 4 * n, nullptr));
  ZF_CUDA_TRY(cudaStreamSynchronize(nullptr));
  const std::vector<float> from_pool = train(static_cast<float*>(pooled), g.data());
  CHECK(std::memcmp(from_pool.data(), want.data(), 4 * n) == 0);
  ZF_CUDA_TRY(cudaFreeAsync(pooled, nullptr));
  ZF_CUDA_TRY(cudaStreamSynchronize(nullptr));
}

// The copies out of the optimizer write host memory: device memory as `out` is refused before
// anything is copied (the copy's host side would fault on it), the optimizer usable and no CUDA
// error left behind — except on a hardware-coherent system, whose host reaches device memory.
// Host memory of every kind (pageable, page-locked, managed) receives the same master.
TEST_CASE("cuda: a copy into device memory is refused, one into host memory of any kind is made" *
          doctest::skip(!has_gpu())) {
  small_problem pb(64, 96, 2);
  const std::size_t n = 64 * 96;
  optimizer<cuda_space> opt(pb.cfg);
  opt.add_matrix(pb.param());
  opt.initialize();
  for (int t = 0; t < 3; ++t) opt.step(1.0f);
  int dev = 0, coherent = 0;
  ZF_CUDA_TRY(cudaGetDevice(&dev));
  ZF_CUDA_TRY(cudaDeviceGetAttribute(&coherent, cudaDevAttrPageableMemoryAccessUsesHostPageTables, dev));
  device_array<float> on_device(n);
  if (!coherent) {
    const std::string what = "out is device memory of GPU " + std::to_string(dev);
    CHECK_THROWS_WITH_AS(opt.copy_master(matrix_id{0}, on_device.data()), doctest::Contains(what.c_str()),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(opt.copy_params_synchronized(matrix_id{0}, on_device.data()), doctest::Contains(what.c_str()),
                         std::invalid_argument);
    CHECK(opt.usable());
    CHECK(cudaPeekAtLastError() == cudaSuccess);
  } else {
    MESSAGE("a hardware-coherent system: its host writes device memory, which is accepted");
  }
  std::vector<float> want(n);
  opt.copy_master(matrix_id{0}, want.data());
  CHECK(want != std::vector<float>(n, 0.5f));  // (three steps moved it)
  pinned_array<float> pinned(n);
  opt.copy_master(matrix_id{0}, pinned.data());
  CHECK(std::memcmp(pinned.data(), want.data(), 4 * n) == 0);
  float* managed = nullptr;
  ZF_CUDA_TRY(cudaMallocManaged(&managed, 4 * n));
  opt.copy_master(matrix_id{0}, managed);
  CHECK(std::memcmp(managed, want.data(), 4 * n) == 0);
  ZF_CUDA_TRY(cudaFree(managed));
}

namespace {
// A driver call, looked up through the runtime as zenflow does (the tests never link libcuda).
template <class F>
F driver_call(const char* name) {
  void* f = nullptr;
  cudaDriverEntryPointQueryResult found{};
  ZF_CUDA_TRY(cudaGetDriverEntryPointByVersion(name, &f, 12000, cudaEnableDefault, &found));
  REQUIRE(found == cudaDriverEntryPointSuccess);
  return reinterpret_cast<F>(f);
}
}  // namespace

// Memory mapped with cuMemMap in pieces, as a caching allocator's expandable segments are: a
// tensor across two pieces mapped side by side in one reservation is accepted (its length is
// not measured there: the driver's range for its start may be one piece) and trains to the bits
// device memory gives. The range the driver reports is recorded in the log.
TEST_CASE("cuda: a tensor across two cuMemMap pieces is accepted and trains as device memory does" *
          doctest::skip(!has_gpu())) {
  int dev = 0;
  ZF_CUDA_TRY(cudaGetDevice(&dev));
  ZF_CUDA_TRY(cudaFree(nullptr));  // (the device's primary context, current on this thread)
  const auto granularity = driver_call<PFN_cuMemGetAllocationGranularity_v10020>("cuMemGetAllocationGranularity");
  const auto reserve = driver_call<PFN_cuMemAddressReserve_v10020>("cuMemAddressReserve");
  const auto create = driver_call<PFN_cuMemCreate_v10020>("cuMemCreate");
  const auto map = driver_call<PFN_cuMemMap_v10020>("cuMemMap");
  const auto set_access = driver_call<PFN_cuMemSetAccess_v10020>("cuMemSetAccess");
  const auto unmap = driver_call<PFN_cuMemUnmap_v10020>("cuMemUnmap");
  const auto release = driver_call<PFN_cuMemRelease_v10020>("cuMemRelease");
  const auto address_free = driver_call<PFN_cuMemAddressFree_v10020>("cuMemAddressFree");
  const auto attribute = driver_call<PFN_cuPointerGetAttribute_v4000>("cuPointerGetAttribute");
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  std::size_t piece = 0;
  REQUIRE(granularity(&piece, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS);
  // two pieces, mapped and released in the guard's destructor whatever happens
  struct mapping {
    decltype(unmap) unmap_;
    decltype(release) release_;
    decltype(address_free) free_;
    CUdeviceptr base = 0;
    std::size_t bytes = 0;
    CUmemGenericAllocationHandle h[2] = {};
    bool mapped[2] = {};
    ~mapping() {
      for (int k = 0; k < 2; ++k)
        if (mapped[k]) unmap_(base + k * bytes / 2, bytes / 2);
      for (auto x : h)
        if (x) release_(x);
      if (base) free_(base, bytes);
    }
  } m{unmap, release, address_free};
  m.bytes = 2 * piece;
  REQUIRE(reserve(&m.base, m.bytes, 0, 0, 0) == CUDA_SUCCESS);
  for (int k = 0; k < 2; ++k) {
    REQUIRE(create(&m.h[k], piece, &prop, 0) == CUDA_SUCCESS);
    REQUIRE(map(m.base + k * piece, piece, 0, m.h[k], 0) == CUDA_SUCCESS);
    m.mapped[k] = true;
  }
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  REQUIRE(set_access(m.base, m.bytes, &access, 1) == CUDA_SUCCESS);
  // a piece's worth of fp32 from the middle of the first piece to the middle of the second
  const std::size_t n = piece / 4, rows = 512, cols = n / rows;
  REQUIRE(rows * cols == n);
  float* across = reinterpret_cast<float*>(m.base + piece / 2);
  CUdeviceptr range_begin = 0;
  std::size_t range_size = 0;
  if (attribute(&range_begin, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, m.base + piece / 2) == CUDA_SUCCESS &&
      attribute(&range_size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, m.base + piece / 2) == CUDA_SUCCESS)
    MESSAGE("the driver's range for the tensor's start: " << range_size << " bytes from offset "
                                                          << std::int64_t(range_begin - m.base) << " of the reservation ("
                                                          << m.bytes << " bytes in two pieces)");
  config cfg;
  cfg.topk_ratio = 0.1;
  cfg.update_interval = interval::every(2);
  zf_test::rng r(9);
  std::vector<float> w0(n), grads(4 * n);
  for (auto& x : w0) x = float(r.uniform(-1, 1));
  for (auto& x : grads) x = float(r.uniform(-1, 1));
  device_array<float> w(n), g(n);
  const std::vector<float> want = train_in(cfg, w.data(), g.data(), rows, cols, w0, grads);
  const std::vector<float> got = train_in(cfg, across, g.data(), rows, cols, w0, grads);
  CHECK(std::memcmp(got.data(), want.data(), 4 * n) == 0);
}
