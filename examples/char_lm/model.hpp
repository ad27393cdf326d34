// A character-level MLP language model with hand-written forward and backward passes over raw
// fp32 buffers, parallel with oneTBB and deterministic for a given seed (every output element is
// computed by one thread in a fixed order; reductions across threads are done serially).
//
//   context of T characters -> embedding (V x E each) -> concat (T*E)
//   -> tanh(W1 x + b1) (H) -> tanh(W2 h1 + b2) (H) -> W3 h2 + b3 (V) -> softmax
//
// Weights are column-contiguous [in][out] (a column is one input feature), the layout zenflow
// selects columns in; the embedding table is [V][E]: a column per character.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include <oneapi/tbb/parallel_for.h>
#include <oneapi/tbb/task_arena.h>

namespace char_lm {

struct shape {
  std::size_t vocab = 0, context = 16, embed = 32, hidden = 1024;
};

struct layer {  // y = W x + b, W stored [in][out]
  std::size_t in = 0, out = 0;
  std::vector<float> w, b, dw, db;
  layer() = default;
  layer(std::size_t i, std::size_t o) : in(i), out(o), w(i * o), b(o), dw(i * o), db(o) {}
};

struct model {
  shape s;
  std::vector<float> emb, demb;  // [vocab][embed]
  layer l1, l2, l3;
  explicit model(const shape& sh, std::uint64_t seed)
      : s(sh),
        emb(sh.vocab * sh.embed),
        demb(emb.size()),
        l1(sh.context * sh.embed, sh.hidden),
        l2(sh.hidden, sh.hidden),
        l3(sh.hidden, sh.vocab) {
    std::mt19937_64 gen(seed);
    std::normal_distribution<float> n(0.0f, 1.0f);
    for (auto& x : emb) x = n(gen) * 0.5f;
    for (layer* l : {&l1, &l2, &l3})
      for (auto& x : l->w) x = n(gen) / std::sqrt(float(l->in));
  }
  std::size_t parameters() const {
    return emb.size() + l1.w.size() + l1.b.size() + l2.w.size() + l2.b.size() + l3.w.size() + l3.b.size();
  }
  // FNV-1a over every parameter's bits: equal models, equal hashes (data-parallel ranks compare it).
  std::uint64_t param_hash() const {
    std::uint64_t h = 0xcbf29ce484222325ull;
    auto add = [&](const std::vector<float>& v) {
      for (float x : v) {
        std::uint32_t bits;
        std::memcpy(&bits, &x, 4);
        for (int k = 0; k < 4; ++k) h = (h ^ ((bits >> (8 * k)) & 0xffu)) * 0x100000001b3ull;
      }
    };
    add(emb);
    for (const layer* l : {&l1, &l2, &l3}) {
      add(l->w);
      add(l->b);
    }
    return h;
  }
};

// Activations of one batch (kept for the backward pass).
struct batch_state {
  std::size_t n = 0;
  std::vector<float> x, h1, h2, p;  // [n][T*E], [n][H], [n][H], [n][V] (softmax)
  std::vector<float> dh1, dh2, dx;
  std::vector<float> dyt;  // dense_back's interleaved copy of dy (kept: no allocation a step)
};

namespace detail {
// The dense layers' arithmetic: each output element is one serial sum, in a fixed order, computed
// by one thread, so the bits do not depend on the thread count. The loops work on several rows
// or columns at once, for vector registers and cache reuse, without changing any one sum's
// order: the same bits as the plain loops (tests/test_char_lm.cpp holds those as the reference).

// y[b][:] = W^T x[b][:] + bias for each row b (W is [in][out]): y[b][r] starts at bias[r] and
// adds x[b][c] * W[c][r] for c = 0, 1, ... in turn. Four rows at a time, so that W is read once
// for four rows instead of once for each.
inline void dense(const layer& l, const float* x, float* y, std::size_t n) {
  constexpr std::size_t rb = 4;
  tbb::parallel_for(std::size_t(0), (n + rb - 1) / rb, [&](std::size_t blk) {
    const std::size_t b0 = blk * rb, nb = std::min(rb, n - b0);
    for (std::size_t i = 0; i < nb; ++i) std::copy(l.b.begin(), l.b.end(), y + (b0 + i) * l.out);
    const float* xb = x + b0 * l.in;
    if (nb == rb) {
      float* __restrict y0 = y + b0 * l.out;
      float* __restrict y1 = y0 + l.out;
      float* __restrict y2 = y1 + l.out;
      float* __restrict y3 = y2 + l.out;
      for (std::size_t c = 0; c < l.in; ++c) {
        const float* __restrict wc = l.w.data() + c * l.out;
        const float x0 = xb[c], x1 = xb[l.in + c], x2 = xb[2 * l.in + c], x3 = xb[3 * l.in + c];
        for (std::size_t r = 0; r < l.out; ++r) {
          const float w = wc[r];
          y0[r] += x0 * w;
          y1[r] += x1 * w;
          y2[r] += x2 * w;
          y3[r] += x3 * w;
        }
      }
      return;
    }
    for (std::size_t i = 0; i < nb; ++i) {  // a last partial block, a row at a time
      float* yb = y + (b0 + i) * l.out;
      for (std::size_t c = 0; c < l.in; ++c) {
        const float xc = xb[i * l.in + c];
        const float* wc = l.w.data() + c * l.out;
        for (std::size_t r = 0; r < l.out; ++r) yb[r] += xc * wc[r];
      }
    }
  });
}

// dW[c][:] = sum_b x[b][c] dy[b][:] (b in turn), db = sum_b dy[b]; and, if dx is given,
// dx[b][c] = dot(W[c][:], dy[b][:]), summed over the outputs in turn from 0. `dyt` is scratch
// (its capacity is kept from call to call).
inline void dense_back(layer& l, const float* x, const float* dy, float* dx, std::size_t n, std::vector<float>& dyt) {
  tbb::parallel_for(std::size_t(0), l.in, [&](std::size_t c) {
    float* dwc = l.dw.data() + c * l.out;
    std::fill(dwc, dwc + l.out, 0.0f);
    for (std::size_t b = 0; b < n; ++b) {
      const float xc = x[b * l.in + c];
      if (xc == 0.0f) continue;
      const float* dyb = dy + b * l.out;
      for (std::size_t r = 0; r < l.out; ++r) dwc[r] += xc * dyb[r];
    }
  });
  std::fill(l.db.begin(), l.db.end(), 0.0f);
  for (std::size_t b = 0; b < n; ++b)
    for (std::size_t r = 0; r < l.out; ++r) l.db[r] += dy[b * l.out + r];
  if (!dx) return;
  // The dots, 8 rows by 4 inputs at a time: dy's rows are first interleaved ([block][r][8], the
  // rows past n zero, their sums computed and dropped), so one output's 8 row values are adjacent.
  constexpr std::size_t rb = 8, cb = 4;
  const std::size_t blocks = (n + rb - 1) / rb;
  dyt.assign(blocks * l.out * rb, 0.0f);
  for (std::size_t b = 0; b < n; ++b)
    for (std::size_t r = 0; r < l.out; ++r) dyt[((b / rb) * l.out + r) * rb + b % rb] = dy[b * l.out + r];
  const std::size_t cblocks = (l.in + cb - 1) / cb;
  tbb::parallel_for(std::size_t(0), blocks * cblocks, [&](std::size_t task) {
    const std::size_t blk = task / cblocks, c0 = (task % cblocks) * cb;
    const std::size_t nc = std::min(cb, l.in - c0), nb = std::min(rb, n - blk * rb);
    const float* d = dyt.data() + blk * l.out * rb;
    float acc[cb][rb] = {};
    const float* w[cb];
    for (std::size_t j = 0; j < cb; ++j) w[j] = l.w.data() + (c0 + std::min(j, nc - 1)) * l.out;
    for (std::size_t r = 0; r < l.out; ++r)
      for (std::size_t j = 0; j < cb; ++j) {
        const float wr = w[j][r];
        for (std::size_t k = 0; k < rb; ++k) acc[j][k] += wr * d[r * rb + k];
      }
    for (std::size_t j = 0; j < nc; ++j)
      for (std::size_t k = 0; k < nb; ++k) dx[(blk * rb + k) * l.in + c0 + j] = acc[j][k];
  });
}
}  // namespace detail

// Mean cross-entropy (nats) of predicting text[pos[b] + T] from the T characters before it.
// With train = true, also leaves the gradients of the mean loss in the model's d* buffers.
inline double forward_backward(model& m, batch_state& st, const std::vector<std::uint8_t>& text,
                               const std::vector<std::size_t>& pos, bool train) {
  const shape& s = m.s;
  const std::size_t n = pos.size(), in = s.context * s.embed;
  st.n = n;
  st.x.resize(n * in);
  st.h1.resize(n * s.hidden);
  st.h2.resize(n * s.hidden);
  st.p.resize(n * s.vocab);
  tbb::parallel_for(std::size_t(0), n, [&](std::size_t b) {
    for (std::size_t t = 0; t < s.context; ++t)
      std::copy_n(m.emb.data() + std::size_t(text[pos[b] + t]) * s.embed, s.embed, st.x.data() + b * in + t * s.embed);
  });
  detail::dense(m.l1, st.x.data(), st.h1.data(), n);
  for (auto& v : st.h1) v = std::tanh(v);
  detail::dense(m.l2, st.h1.data(), st.h2.data(), n);
  for (auto& v : st.h2) v = std::tanh(v);
  detail::dense(m.l3, st.h2.data(), st.p.data(), n);
  std::vector<double> nll(n);
  tbb::parallel_for(std::size_t(0), n, [&](std::size_t b) {
    float* pb = st.p.data() + b * s.vocab;
    const float mx = *std::max_element(pb, pb + s.vocab);
    double z = 0;
    for (std::size_t v = 0; v < s.vocab; ++v) z += std::exp(double(pb[v] - mx));
    const std::size_t target = text[pos[b] + s.context];
    nll[b] = -(double(pb[target] - mx) - std::log(z));
    for (std::size_t v = 0; v < s.vocab; ++v) pb[v] = float(std::exp(double(pb[v] - mx)) / z);
  });
  double loss = 0;
  for (double l : nll) loss += l;  // serial: the same sum whatever the thread count
  loss /= double(n);
  if (!train) return loss;

  // d loss / d logits = (softmax - onehot) / n, in place
  for (std::size_t b = 0; b < n; ++b) {
    st.p[b * s.vocab + text[pos[b] + s.context]] -= 1.0f;
    for (std::size_t v = 0; v < s.vocab; ++v) st.p[b * s.vocab + v] /= float(n);
  }
  st.dh2.resize(n * s.hidden);
  st.dh1.resize(n * s.hidden);
  st.dx.resize(n * in);
  detail::dense_back(m.l3, st.h2.data(), st.p.data(), st.dh2.data(), n, st.dyt);
  for (std::size_t i = 0; i < st.dh2.size(); ++i) st.dh2[i] *= 1.0f - st.h2[i] * st.h2[i];
  detail::dense_back(m.l2, st.h1.data(), st.dh2.data(), st.dh1.data(), n, st.dyt);
  for (std::size_t i = 0; i < st.dh1.size(); ++i) st.dh1[i] *= 1.0f - st.h1[i] * st.h1[i];
  detail::dense_back(m.l1, st.x.data(), st.dh1.data(), st.dx.data(), n, st.dyt);
  // embedding gradient: a serial scatter-add in batch order (deterministic)
  std::fill(m.demb.begin(), m.demb.end(), 0.0f);
  for (std::size_t b = 0; b < n; ++b)
    for (std::size_t t = 0; t < s.context; ++t) {
      float* d = m.demb.data() + std::size_t(text[pos[b] + t]) * s.embed;
      const float* g = st.dx.data() + b * in + t * s.embed;
      for (std::size_t e = 0; e < s.embed; ++e) d[e] += g[e];
    }
  return loss;
}

}  // namespace char_lm
