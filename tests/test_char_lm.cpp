// Acceptance of the example trainer (examples/char_lm): on the system's license texts, ZenFlow
// with its default configuration fine-tunes a pretrained model to within 0.5% of plain AdamW's
// validation loss (the default run), and from scratch ends within 2% of it (--from-scratch);
// ZeRO-Offload equals AdamW (the same math, on the host), the model learns (loss well below the
// unigram entropy), and a run is deterministic whatever the thread count.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "../examples/char_lm/trainer.hpp"
#include "support.hpp"

namespace {
auto no_progress = [](const std::string&) {};
}  // namespace

TEST_CASE("char_lm: zero_offload equals adamw, and runs are deterministic across thread counts") {
  const char_lm::corpus c = char_lm::load_corpus({});
  char_lm::options o;
  // (the claims are exact and hold at any length: 60 steps, 20 in the sanitizer runs, where this
  // test took 78 s of ThreadSanitizer's 3 minutes)
  o.steps = zf_test::full_or_quick(60, 20);
  o.hidden = 128;
  o.eval_every = o.steps / 2;
  o.eval_positions = 512;
  o.final_positions = 512;  // (every held-out position would cost minutes under ThreadSanitizer)
  o.threads = 2;
  const auto two = char_lm::run_all(c, o, no_progress);
  REQUIRE(two.size() == 3);
  // adamw and zero_offload do the same float operations in the same order (adamw.hpp), one on
  // the device side, one on the host side: the losses agree exactly, not only within a tolerance.
  for (std::size_t i = 0; i < two[0].curve.size(); ++i) {
    CHECK(two[2].curve[i].valid == two[0].curve[i].valid);
    CHECK(two[2].curve[i].train == two[0].curve[i].train);
  }
  o.threads = 1;
  o.optimizers = {"zenflow"};
  const auto one = char_lm::run_all(c, o, no_progress);
  for (std::size_t i = 0; i < one[0].curve.size(); ++i) CHECK(one[0].curve[i].valid == two[1].curve[i].valid);
}

TEST_CASE("char_lm --from-scratch: zenflow's validation loss is within 2% of adamw's, far below the unigram entropy") {
  // The default model and from-scratch length (1.6M parameters, 1200 steps, seed 1), AdamW and
  // ZenFlow only.
  // The gap is a property of the training regime: shorter runs of this model end 0.7-3% apart
  // across seeds at 800 steps, while at the default length seeds 1-4 gave +1.8, +0.8, +1.6 and
  // +0.1%. The run is deterministic (same code, same seed: same bits), so this is not flaky on a
  // given machine image; the figures are those of Debian 12's license directory (14 files,
  // 237,320 bytes), and another image's texts give other numbers: the text's size is printed.
  const char_lm::corpus c = char_lm::load_corpus({});
  MESSAGE("text: ", c.files, " files, ", c.train.size() + c.valid.size(), " characters");
  char_lm::options o;
  o.optimizers = {"adamw", "zenflow"};
  o.eval_every = 1200;
  o.final_positions = 2048;  // as in the published comparison (char_lm --from-scratch does the same)
  if (zf_test::quick_mode()) {
    // Under the sanitizers this run would take 10+ minutes: train a small model briefly, which
    // exercises the same code, and leave the accuracy bounds to the normal run of the suite.
    MESSAGE("quick mode: short run; the 2% and entropy bounds are checked by the normal run");
    o.steps = 30;
    o.hidden = 128;
    o.eval_every = 30;
    o.eval_positions = 256;
    const auto runs = char_lm::run_all(c, o, no_progress);
    CHECK(runs[1].final_valid < runs[1].curve.front().valid);  // it learns something
    return;
  }
  const auto runs = char_lm::run_all(c, o, no_progress);
  const double adamw = runs[0].final_valid, zenflow = runs[1].final_valid;
  MESSAGE("valid loss: adamw ", adamw, ", zenflow ", zenflow, ", unigram entropy ", c.unigram_entropy);
  CHECK(std::fabs(zenflow / adamw - 1.0) <= 0.02);
  // "learns": at least 10% below the entropy of the character distribution (a model that only
  // knew character frequencies would sit at the entropy)
  CHECK(adamw <= 0.9 * c.unigram_entropy);
  CHECK(zenflow <= 0.9 * c.unigram_entropy);
  // ZenFlow's traffic: about (1 - r) of the grads down each step and (1 - r)/U of the params up,
  // 1.125 models, within 2%: the vectors (biases, norms: a small share of the model) never
  // cross, k = floor(r cols) leaves a little more than 1 - r unselected where cols is not a
  // multiple of 10, and each reselection swaps its changed columns' state (12 rows + 4 bytes
  // each way, a few columns every S steps). Seed 1 on Debian 12: 1.130.
  CHECK(runs[1].bytes_per_step == doctest::Approx(0.9 + 0.9 / 4).epsilon(0.02));
}

TEST_CASE("char_lm fine-tuning (the default): zenflow's validation loss is within 0.5% of adamw's") {
  // The default run: AdamW pretrains the default model for 1200 steps on the copyleft licenses,
  // then AdamW and ZenFlow fine-tune it for 600 steps on the other licenses (seed 1), validated
  // on every held-out position (one 512-character block in ten). ZenFlow's goal in its own
  // regime: no worse than AdamW by more than 0.5%. (Seeds 1-4 gave the figures in README.md,
  // ZenFlow 3.5-5.2% below AdamW; the run is deterministic, so this is not flaky.)
  char_lm::options o;
  o.optimizers = {"adamw", "zenflow"};
  o.steps = 600;
  o.eval_every = 600;
  // (figures of Debian 12's license directory: another image's texts give other numbers; the
  // texts' sizes are printed)
  const char_lm::corpora cs = char_lm::load_corpora({}, {});
  MESSAGE("texts: pretraining ", cs.pretrain.files, " files, ", cs.pretrain.train.size() + cs.pretrain.valid.size(),
          " characters; fine-tuning ", cs.finetune.files, " files, ", cs.finetune.train.size() + cs.finetune.valid.size(),
          " characters");
  if (zf_test::quick_mode()) {
    MESSAGE("quick mode: short run; the 0.5% bound is checked by the normal run");
    o.steps = 20;
    o.pretrain_steps = 20;
    o.hidden = 128;
    o.eval_every = 20;
    o.eval_positions = 256;
    o.final_positions = 256;
    const auto ft = char_lm::run_finetune(cs, o, no_progress);
    CHECK(ft.runs[1].final_valid < ft.runs[1].curve.front().valid);  // it learns something
    return;
  }
  const auto ft = char_lm::run_finetune(cs, o, no_progress);
  // (start and final: on every held-out position)
  const double start = ft.runs[0].start_valid, adamw = ft.runs[0].final_valid, zenflow = ft.runs[1].final_valid;
  MESSAGE("fine-tuning valid loss: from ", start, " to adamw ", adamw, ", zenflow ", zenflow);
  CHECK(ft.runs[1].start_valid == start);  // both start from the same pretrained weights
  CHECK(adamw < start);                            // fine-tuning helps
  CHECK(zenflow <= 1.005 * adamw);
}

TEST_CASE("char_lm: an optimizer's settings in --optimizer reach its config; bad ones are named") {
  char_lm::options o;  // topk 0.1, U 4, lr 0.001
  const auto plain = char_lm::parse_spec("zenflow", o);
  CHECK(plain.kind == "zenflow");
  CHECK(plain.cfg == char_lm::zenflow_config(o));
  const auto v = char_lm::parse_spec("zenflow:topk=0.05:U=8:reselect=reset:grad=sum:lr=0.0005", o);
  CHECK(v.name == "zenflow:topk=0.05:U=8:reselect=reset:grad=sum:lr=0.0005");
  CHECK(v.cfg.topk_ratio == 0.05);
  CHECK(v.cfg.update_interval == zenflow::interval::every(8));
  CHECK(v.cfg.select_interval == zenflow::interval::every(128));  // 16 U, as for the default
  CHECK(v.cfg.reselect_moments == zenflow::reselect_policy::reset);
  CHECK(v.cfg.host_gradient == zenflow::window_gradient::sum);
  CHECK(v.cfg.adam.lr == 0.0005f);
  const auto a = char_lm::parse_spec("adamw:lr=0.00025", o);
  CHECK(a.kind == "adamw");
  CHECK(a.cfg.adam.lr == 0.00025f);
  for (const char* bad : {"sgd", "zenflow:", "zenflow:topk", "zenflow:topk=x", "zenflow:topk=2", "zenflow:U=0",
                          "zenflow:U=2.5", "zenflow:reselect=zero", "zenflow:grad=avg", "adamw:U=8", "adamw:lr=nan"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(char_lm::parse_spec(bad, o), std::invalid_argument);
  }
}

TEST_CASE("char_lm: the fine-tuning corpora hold out one 512-character block in ten, from every file") {
  std::vector<unsigned char> bytes(12345);
  for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>('a' + (i * 7 + i / 512) % 26);
  const auto alphabet = char_lm::alphabet_of({&bytes});
  const auto c = char_lm::make_corpus(bytes, alphabet, 1, char_lm::holdout::blocks);
  // blocks 9 and 19 of 25 (the last one partial) are held out: 2 * 512 characters, in order
  REQUIRE(c.valid.size() == 2 * 512);
  REQUIRE(c.train.size() == bytes.size() - c.valid.size());
  for (std::size_t i = 0; i < 512; ++i) {
    CHECK(alphabet[c.valid[i]] == bytes[9 * 512 + i]);
    CHECK(alphabet[c.valid[512 + i]] == bytes[19 * 512 + i]);
  }
  CHECK(alphabet[c.train[9 * 512]] == bytes[10 * 512]);  // training text skips the held-out block
  const auto tail = char_lm::make_corpus(bytes, alphabet, 1, char_lm::holdout::tail);
  CHECK(tail.valid.size() == bytes.size() / 10);  // the from-scratch split: the last tenth
  CHECK(alphabet[tail.valid.front()] == bytes[bytes.size() - bytes.size() / 10]);
}

namespace {
// The dense layers as plain loops, one output element at a time (the reference the tiled
// kernels of model.hpp must match bit for bit: each element is the same serial sum).
void plain_dense(const char_lm::layer& l, const float* x, float* y, std::size_t n) {
  for (std::size_t b = 0; b < n; ++b)
    for (std::size_t r = 0; r < l.out; ++r) {
      float s = l.b[r];
      for (std::size_t c = 0; c < l.in; ++c) s += x[b * l.in + c] * l.w[c * l.out + r];
      y[b * l.out + r] = s;
    }
}
void plain_dx(const char_lm::layer& l, const float* dy, float* dx, std::size_t n) {
  for (std::size_t b = 0; b < n; ++b)
    for (std::size_t c = 0; c < l.in; ++c) {
      float s = 0;
      for (std::size_t r = 0; r < l.out; ++r) s += l.w[c * l.out + r] * dy[b * l.out + r];
      dx[b * l.in + c] = s;
    }
}
}  // namespace

TEST_CASE("char_lm: the tiled dense layers give the plain loops' bits, at any size and thread count") {
  // Shapes around the tiles (4 rows forward; 8 rows by 4 inputs for dx): whole tiles, partial
  // ones, fewer rows than a tile. Values of many magnitudes, so that another summation order
  // would round differently (checked: summing dx's outputs in reverse fails this test).
  zf_test::rng r(11);
  const std::size_t shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {4, 8, 16}, {5, 33, 9}, {8, 4, 64}, {9, 13, 100}, {33, 70, 31}};
  // dense_back's scratch is kept from shape to shape, as a trainer's batch_state keeps it, and
  // starts as garbage: what an earlier call left in it is overwritten or lands only in the
  // padding rows, whose sums are dropped (a guard against reading past what a call wrote)
  std::vector<float> scratch(5000, 1e30f);
  for (const auto& sh : shapes)
    for (const int threads : {1, 2}) {
      const std::size_t n = sh[0], in = sh[1], out = sh[2];
      CAPTURE(n);
      CAPTURE(in);
      CAPTURE(out);
      char_lm::layer l(in, out);
      auto fill = [&](std::vector<float>& v) {
        for (auto& e : v) e = r.spread(-8, 8);
      };
      fill(l.w);
      fill(l.b);
      std::vector<float> x(n * in), dy(n * out);
      fill(x);
      fill(dy);
      for (std::size_t i = 0; i < x.size(); i += 3) x[i] = 0.0f;  // (dW skips zero inputs)
      std::vector<float> y(n * out), want_y(n * out), dx(n * in), want_dx(n * in);
      tbb::task_arena arena(threads);
      arena.execute([&] {
        char_lm::detail::dense(l, x.data(), y.data(), n);
        char_lm::detail::dense_back(l, x.data(), dy.data(), dx.data(), n, scratch);
      });
      plain_dense(l, x.data(), want_y.data(), n);
      plain_dx(l, dy.data(), want_dx.data(), n);
      CHECK(std::memcmp(y.data(), want_y.data(), y.size() * 4) == 0);
      CHECK(std::memcmp(dx.data(), want_dx.data(), dx.size() * 4) == 0);
      // dW and db: serial sums over the batch rows
      bool dw_same = true, db_same = true;
      for (std::size_t c = 0; c < in; ++c)
        for (std::size_t o = 0; o < out; ++o) {
          float s = 0;
          for (std::size_t b = 0; b < n; ++b) s += x[b * in + c] * dy[b * out + o];
          dw_same = dw_same && std::memcmp(&s, &l.dw[c * out + o], 4) == 0;
        }
      for (std::size_t o = 0; o < out; ++o) {
        float s = 0;
        for (std::size_t b = 0; b < n; ++b) s += dy[b * out + o];
        db_same = db_same && std::memcmp(&s, &l.db[o], 4) == 0;
      }
      CHECK(dw_same);
      CHECK(db_same);
    }
}
