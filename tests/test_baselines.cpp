// Baselines as policy combinations: zero_offload (everything on the host, every step),
// device_adam (everything on the device) and ZenFlow with topk_ratio = 1 are all plain AdamW.
// They must agree with each other bit for bit (the same float operations in the same order,
// on different sides) and with a double-precision AdamW within float tolerance. Also the bytes
// moved, against their closed form.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include <zenflow/zenflow.hpp>

#include "optimizer_harness.hpp"

using namespace zenflow;
using namespace zf_test;

namespace {

struct run_result {
  std::vector<std::vector<float>> params;  // decoded params of every matrix and vector, after each step
  std::vector<float> masters;              // every matrix's and vector's fp32 master at the end
  optimizer_stats stats;
};

template <class Opt>
run_result train(Opt& opt, const scenario& sc) {
  trainer tr(sc);
  for (std::size_t mi = 0; mi < sc.mats.size(); ++mi) {
    const auto& m = sc.mats[mi];
    opt.add_matrix({tr.mp[mi].data(), tr.mg[mi].data(), m.rows, m.cols, m.pt, m.gt, m.layout});
  }
  for (std::size_t vi = 0; vi < sc.vecs.size(); ++vi)
    opt.add_vector({tr.vp[vi].data(), tr.vgb[vi].data(), sc.vecs[vi].n, sc.vecs[vi].pt, sc.vecs[vi].gt});
  opt.initialize();
  run_result out;
  std::vector<std::vector<double>> gm, gv;
  for (int s = 0; s < sc.steps; ++s) {
    const double scale = tr.next(gm, gv);
    opt.step(float(scale));
    std::vector<float> flat;
    for (std::size_t mi = 0; mi < sc.mats.size(); ++mi)
      for (std::size_t e = 0; e < sc.mats[mi].rows * sc.mats[mi].cols; ++e)
        flat.push_back(load_as_float(tr.mp[mi], sc.mats[mi].pt, e));
    for (std::size_t vi = 0; vi < sc.vecs.size(); ++vi)
      for (std::size_t e = 0; e < sc.vecs[vi].n; ++e) flat.push_back(load_as_float(tr.vp[vi], sc.vecs[vi].pt, e));
    out.params.push_back(std::move(flat));
  }
  opt.synchronize();
  for (std::size_t mi = 0; mi < sc.mats.size(); ++mi) {
    std::vector<float> m(sc.mats[mi].rows * sc.mats[mi].cols);
    opt.copy_master(matrix_id{mi}, m.data());
    out.masters.insert(out.masters.end(), m.begin(), m.end());
  }
  for (std::size_t vi = 0; vi < sc.vecs.size(); ++vi) {
    std::vector<float> m(sc.vecs[vi].n);
    opt.copy_vector_master(vector_id{vi}, m.data());
    out.masters.insert(out.masters.end(), m.begin(), m.end());
  }
  out.stats = opt.stats();
  return out;
}

scenario plain_scenario(std::uint64_t seed, dtype pt, dtype gt) {
  scenario sc = random_scenario(seed);
  for (auto& m : sc.mats) { m.pt = pt; m.gt = gt; }
  sc.nan_rate = 0.1;
  sc.cfg.max_grad_norm = 1.0;  // clipping on: the same factor must reach both sides
  return sc;
}

}  // namespace

TEST_CASE("zero_offload, device_adam and zenflow with topk_ratio 1 are the same AdamW, bit for bit") {
  std::size_t vectors = 0;  // (the scenarios must hold some: their params and masters are compared too)
  for (std::uint64_t seed = 1; seed <= 12; ++seed) {
    CAPTURE(seed);
    const dtype types[] = {dtype::f32, dtype::bf16, dtype::f16};
    const scenario sc = plain_scenario(seed, types[seed % 3], types[(seed / 3) % 3]);
    zero_offload<> zo(sc.cfg);
    device_adam<> da(sc.cfg);
    config all = sc.cfg;
    all.topk_ratio = 1.0;
    optimizer<> zf(all);
    const run_result a = train(zo, sc), b = train(da, sc), c = train(zf, sc);
    for (std::size_t s = 0; s < a.params.size(); ++s) {
      CAPTURE(s);
      REQUIRE(a.params[s] == b.params[s]);
      REQUIRE(a.params[s] == c.params[s]);
    }
    REQUIRE(a.masters == b.masters);
    REQUIRE(a.masters == c.masters);
    vectors += sc.vecs.size();
    // every matrix element crosses twice per applied step with zero_offload, never with device_adam
    const std::uint64_t applied = a.stats.steps - a.stats.skipped_steps;
    std::uint64_t grad_bytes = 0, param_bytes = 0;
    for (const auto& m : sc.mats) {
      grad_bytes += m.rows * m.cols * size_of(m.gt);
      param_bytes += m.rows * m.cols * size_of(m.pt);
    }
    CHECK(a.stats.bytes_to_host == applied * grad_bytes);
    CHECK(a.stats.bytes_to_device == applied * param_bytes);
    CHECK(a.stats.host_updates == applied);
    CHECK(b.stats.bytes_to_host == 0);
    CHECK(b.stats.host_updates == 0);  // device AdamW: no host pass updates a column
  }
  CHECK(vectors > 0);
}

TEST_CASE("zero_offload equals a double-precision AdamW within float tolerance") {
  // fp32 params and grads, so what the trainer sees is the master itself.
  scenario sc = plain_scenario(77, dtype::f32, dtype::f32);
  sc.steps = 40;
  zf_ref::zf_config plain = sc.ref;
  plain.selector = zf_ref::zf_config::none;  // the model with no selection, U = 1, synchronous
  plain.update_interval = 1;
  plain.overlap = false;
  plain.warm_up = 0;
  plain.max_grad_norm = sc.cfg.max_grad_norm;
  sc.ref = plain;
  zero_offload<> zo(sc.cfg);
  run_scenario(sc, zo);
}

TEST_CASE("bytes moved follow the closed form; 1.125x model size per step at r = 0.1, U = 4") {
  // One 64 x 40 matrix, bf16 params and grads, a fixed column ranking (column c has |g| growing
  // with c), so the first selection is the only one that moves state.
  const std::size_t R = 64, C = 40, k = 4, U = 4, W = 2, N = W + 6 * U;
  std::vector<bfloat16> w(R * C), dw(R * C);
  for (auto& x : w) x = to_bfloat16(0.5f);
  config cfg;
  cfg.topk_ratio = 0.1;
  cfg.update_interval = interval::every(U);
  cfg.select_interval = interval::every(2 * U);
  cfg.full_warm_up_rounds = W;
  optimizer<> opt(cfg);
  opt.add_matrix({w.data(), dw.data(), R, C, dtype::bf16, dtype::bf16});
  opt.initialize();
  for (std::size_t s = 0; s < N; ++s) {
    for (std::size_t c = 0; c < C; ++c)
      for (std::size_t i = 0; i < R; ++i) dw[c * R + i] = to_bfloat16(float(c + 1) * ((i + s) % 2 ? 1e-3f : -1e-3f));
    opt.step();
  }
  const std::uint64_t model = R * C * 2;  // bytes of the params (bf16)
  const std::uint64_t swap = 12 * R + 4;  // fp32 master, m, v and a count per column
  const std::uint64_t windows = (N - W) / U;
  const std::uint64_t unselected = R * (C - k) * 2;
  optimizer_stats st = opt.stats();
  CHECK(st.selections == 3);  // t = W+1, W+1+2U, W+1+4U
  CHECK(opt.selected_columns(matrix_id{0}) == std::vector<std::uint32_t>{36, 37, 38, 39});
  CHECK(st.bytes_to_host == W * model + (N - W) * unselected);
  // overlap: the last window's update is still in flight, not yet uploaded; a selection drains
  const std::uint64_t applied = windows - 1;
  CHECK(st.bytes_to_device == W * model + k * swap + applied * unselected);
  opt.synchronize();
  st = opt.stats();
  CHECK(st.bytes_to_device == W * model + k * swap + windows * unselected);
  // per applied step after warm-up: (1 - k/C) of the grads down, (1 - k/C)/U of the params up
  const double per_step = double(st.bytes_to_host - W * model + st.bytes_to_device - W * model - k * swap) /
                          double(N - W) / double(model);
  // (exact: the integers above are exact, and 0.9 * model + 0.9 / 4 * model per step is 1.125
  // models, a double the division gives exactly)
  CHECK(per_step == 1.125);
}

TEST_CASE("bytes moved: a reselection that replaces every column swaps 12*rows+4 bytes each way per column") {
  // Each leaving column hands its fp32 master, m, v (12 bytes a row) and count (4) to the host;
  // each joining one takes the same, except its master when the param is fp32: the device param
  // is its master, and it already holds the host master's value (8 bytes a row + 4).
  const std::size_t R = 16, C = 20, k = 2, U = 2;
  for (dtype pt : {dtype::f32, dtype::bf16}) {
    CAPTURE(int(pt));
    const std::size_t ps = size_of(pt);
    std::vector<unsigned char> w(R * C * ps);
    std::vector<float> dw(R * C);
    const float half = 0.5f;
    const bfloat16 half_bf16 = from_float<bfloat16>(half);
    for (std::size_t e = 0; e < R * C; ++e)
      std::memcpy(w.data() + e * ps, pt == dtype::f32 ? static_cast<const void*>(&half) : &half_bf16, ps);
    config cfg;
    cfg.topk_ratio = 0.1;  // k = 2
    cfg.update_interval = interval::every(U);
    cfg.select_interval = interval::every(U);  // a selection at every window start
    cfg.overlap_step = false;
    optimizer<> opt(cfg);
    opt.add_matrix({w.data(), dw.data(), R, C, pt, dtype::f32});
    opt.initialize();
    auto grads = [&](bool high_first) {  // the largest columns: the last two, or the first two
      for (std::size_t c = 0; c < C; ++c)
        for (std::size_t i = 0; i < R; ++i) dw[c * R + i] = 1e-3f * float(high_first ? C - c : c + 1);
    };
    grads(false);
    opt.step();  // t = 1: selects {18, 19}
    opt.step();  // t = 2: boundary
    const optimizer_stats before = opt.stats();
    grads(true);
    opt.step();  // t = 3: selects {0, 1}: both columns leave, two others join
    CHECK(opt.selected_columns(matrix_id{0}) == std::vector<std::uint32_t>{0, 1});
    const optimizer_stats after = opt.stats();
    const std::uint64_t leave = 12 * R + 4, join = (pt == dtype::f32 ? 8 : 12) * R + 4;
    const std::uint64_t unselected_grads = R * (C - k) * 4;
    CHECK(after.bytes_to_host - before.bytes_to_host == k * leave + unselected_grads);
    CHECK(after.bytes_to_device - before.bytes_to_device == k * join);
    CHECK(before.bytes_to_device == k * join + R * (C - k) * ps);  // first selection + one host update
  }
}

TEST_CASE("parameter groups: each tensor trains bit for bit as if alone with its group's lr and weight_decay") {
  // Without clipping and with a fixed update interval, tensors interact only through the step's
  // verdict (finite or not), so a tensor in a group must match the same tensor registered alone in
  // an optimizer whose config holds the group's values (lr * lr_scale, weight_decay * scale).
  const std::size_t R = 8, C = 30, V = 12;
  config base;
  base.topk_ratio = 0.2;
  base.update_interval = interval::every(2);
  base.select_interval = interval::every(4);
  base.full_warm_up_rounds = 1;
  base.adam.weight_decay = 0.1f;
  auto init = [](std::vector<float>& x, float s) {
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = s * std::sin(float(i) * 0.37f + s);
  };
  std::vector<float> a(R * C), ga(R * C), b(R * C), gb(R * C), v(V), gv(V);
  std::vector<float> a1(R * C), ga1(R * C), b1(R * C), gb1(R * C), v1(V), gv1(V);
  init(a, 0.5f), init(b, 0.25f), init(v, 0.125f);
  a1 = a, b1 = b, v1 = v;
  optimizer<> together(base);
  together.add_matrix(zenflow::matrix(a.data(), ga.data(), rows{R}, cols{C}).group(0.5f, 0.0f));
  together.add_matrix(zenflow::matrix(b.data(), gb.data(), rows{R}, cols{C}).row_major());
  together.add_vector(zenflow::vector(v.data(), gv.data(), V).no_weight_decay());
  config ca = base, cv = base;
  ca.adam.lr = base.adam.lr * 0.5f;
  ca.adam.weight_decay = 0.0f;
  cv.adam.weight_decay = 0.0f;
  optimizer<> alone_a(ca), alone_b(base), alone_v(cv);
  alone_a.add_matrix(zenflow::matrix(a1.data(), ga1.data(), rows{R}, cols{C}));
  alone_b.add_matrix(zenflow::matrix(b1.data(), gb1.data(), rows{R}, cols{C}).row_major());
  alone_v.add_vector(zenflow::vector(v1.data(), gv1.data(), V));
  together.initialize();
  alone_a.initialize();
  alone_b.initialize();
  alone_v.initialize();
  for (int t = 0; t < 13; ++t) {
    for (std::size_t i = 0; i < ga.size(); ++i) {
      ga[i] = ga1[i] = std::sin(float(i * 5 + std::size_t(t) * 3)) * 0.02f;
      gb[i] = gb1[i] = std::cos(float(i * 3 + std::size_t(t))) * 0.02f;
    }
    for (std::size_t i = 0; i < V; ++i) gv[i] = gv1[i] = std::sin(float(i + std::size_t(t) * 7)) * 0.02f;
    together.step();
    alone_a.step();
    alone_b.step();
    alone_v.step();
  }
  for (auto* o : {&together, &alone_a, &alone_b}) o->synchronize();
  alone_v.synchronize();
  CHECK(a == a1);
  CHECK(b == b1);
  CHECK(v == v1);
  // and the groups mattered: the default group's run differs
  std::vector<float> d(R * C), gd(R * C);
  init(d, 0.5f);
  optimizer<> plain(base);
  plain.add_matrix(zenflow::matrix(d.data(), gd.data(), rows{R}, cols{C}));
  plain.initialize();
  for (int t = 0; t < 13; ++t) {
    for (std::size_t i = 0; i < gd.size(); ++i) gd[i] = std::sin(float(i * 5 + std::size_t(t) * 3)) * 0.02f;
    plain.step();
  }
  plain.synchronize();
  CHECK(d != a);
}

TEST_CASE("parameter groups: scales are checked at registration and by set_lr") {
  std::vector<float> w(64), g(64), b(8), gb(8);
  config cfg;
  cfg.adam.lr = 0.1f;
  optimizer<> opt(cfg);
  auto m = zenflow::matrix(w.data(), g.data(), rows{8}, cols{8});
  CHECK_THROWS_WITH_AS(opt.add_matrix(m.group(-1.0f, 1.0f)), "zenflow: matrix 0: lr_scale must be finite and >= 0, got -1",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(opt.add_matrix(m.group(1.0f, NAN)),
                       "zenflow: matrix 0: weight_decay_scale must be finite and >= 0, got nan", std::invalid_argument);
  CHECK_THROWS_WITH_AS(opt.add_matrix(m.group(20.0f, 1.0f)),
                       "zenflow: matrix 0: lr 0.1 times lr_scale 20 must be at most 1", std::invalid_argument);
  opt.add_matrix(m.group(8.0f, 1.0f));  // lr 0.8
  opt.add_vector(zenflow::vector(b.data(), gb.data(), 8).no_weight_decay());
  CHECK_THROWS_WITH_AS(opt.set_lr(0.2f), "zenflow: matrix 0: lr 0.2 times lr_scale 8 must be at most 1",
                       std::invalid_argument);
  CHECK(opt.lr() == 0.1f);  // unchanged
  opt.set_lr(0.125f);       // 0.125 * 8 = 1: allowed
  CHECK(opt.lr() == 0.125f);
}

TEST_CASE("reselect_moments = reset: only the joining columns' moments and counts start over") {
  // The bytes test's schedule: t = 1 selects {18, 19}, t = 2 ends a window (a host update of the
  // other columns: counts 1, moments non-zero), t = 3 selects {0, 1}. Two runs on the same
  // gradients, keep and reset, agree bit for bit except on columns 0 and 1 after t = 3: their
  // counts restart (1 after t = 3's update, against 2), so their moments and masters differ.
  const std::size_t R = 16, C = 20;
  auto run = [&](reselect_policy p) {
    std::vector<float> w(R * C, 0.5f), dw(R * C);
    config cfg;
    cfg.topk_ratio = 0.1;
    cfg.update_interval = interval::every(2);
    cfg.select_interval = interval::every(2);
    cfg.overlap_step = false;
    cfg.reselect_moments = p;
    optimizer<> opt(cfg);
    opt.add_matrix({w.data(), dw.data(), R, C});
    opt.initialize();
    for (int t = 1; t <= 3; ++t) {
      for (std::size_t c = 0; c < C; ++c)
        for (std::size_t i = 0; i < R; ++i)
          dw[c * R + i] = 1e-3f * float(t < 3 ? c + 1 : C - c) + 1e-4f * float(i);
      opt.step();
    }
    struct state {
      std::vector<float> master, m, v;
      std::vector<std::uint32_t> counts, selected;
    } s{std::vector<float>(R * C), std::vector<float>(R * C), std::vector<float>(R * C),
        opt.column_counts(matrix_id{0}), opt.selected_columns(matrix_id{0})};
    opt.copy_master(matrix_id{0}, s.master.data());
    opt.copy_exp_avg(matrix_id{0}, s.m.data());
    opt.copy_exp_avg_sq(matrix_id{0}, s.v.data());
    return s;
  };
  const auto keep = run(reselect_policy::keep), reset = run(reselect_policy::reset);
  REQUIRE(keep.selected == std::vector<std::uint32_t>{0, 1});
  REQUIRE(reset.selected == keep.selected);
  for (std::size_t c = 0; c < C; ++c) {
    CAPTURE(c);
    const bool joined = c < 2;
    // joined: 1 host update + t = 3's (reset: restarted before it); 18, 19: device updates at
    // t = 1, 2 before they left; the rest: one host update
    const std::uint32_t others = c >= 18 ? 2u : 1u;
    CHECK(keep.counts[c] == (joined ? 2u : others));
    CHECK(reset.counts[c] == (joined ? 1u : others));
    const auto col = [&](const std::vector<float>& a) { return std::vector<float>(a.begin() + c * R, a.begin() + (c + 1) * R); };
    if (joined) {
      CHECK(col(keep.m) != col(reset.m));
      CHECK(col(keep.v) != col(reset.v));
    } else {
      CHECK(col(keep.m) == col(reset.m));
      CHECK(col(keep.v) == col(reset.v));
      CHECK(col(keep.master) == col(reset.master));
    }
  }
}
