// Checkpoints: resume is bit-exact (random configurations, saved at random steps, mid-window and
// with a host update in flight); corrupt, truncated or mismatched files give clear errors and
// leave the optimizer unchanged; a storm of non-finite gradients changes nothing.
#include <doctest/doctest.h>

#include <algorithm>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <tuple>
#include <filesystem>
#include <fstream>
#include <optional>
#include <limits>
#include <string>
#include <vector>

#if defined(__unix__)
#  include <fcntl.h>
#  include <sys/file.h>
#  include <sys/stat.h>
#  include <unistd.h>
#endif

#include <zenflow/zenflow.hpp>

#include "optimizer_harness.hpp"

using namespace zenflow;
using namespace zf_test;

namespace {

std::string temp_path(const std::string& name) { return std::string(ZF_TEST_TMP_DIR) + "/" + name; }

// Crafting files whose checksums are right: a file's bytes; where section `index` of a
// one-process checkpoint has its payload (after the 24-byte file header, each section is a
// 16-byte header — tag, length — the payload and a 4-byte checksum); the checksum made right
// again after an edit; and a copy with `bytes` at `offset` of a section's payload replaced.
std::vector<unsigned char> file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
struct section_place {
  std::size_t payload;
  std::uint64_t len;
};
section_place section_of(const std::vector<unsigned char>& img, int index) {
  std::size_t at = 24;
  std::uint64_t len = 0;
  for (int s = 0;; ++s) {
    std::memcpy(&len, img.data() + at + 8, 8);
    if (s == index) return {at + 16, len};
    at += 16 + std::size_t(len) + 4;
  }
}
void reseal(std::vector<unsigned char>& img, section_place sec) {
  const std::uint32_t crc = ckpt::crc32(img.data() + sec.payload, std::size_t(sec.len));
  std::memcpy(img.data() + sec.payload + sec.len, &crc, 4);
}
std::vector<unsigned char> crafted(std::vector<unsigned char> img, section_place sec, std::size_t offset,
                                   const void* value, std::size_t bytes) {
  std::memcpy(img.data() + sec.payload + offset, value, bytes);
  reseal(img, sec);
  return img;
}

template <class Opt>
void register_all(Opt& opt, trainer& tr, const scenario& sc) {
  for (std::size_t mi = 0; mi < sc.mats.size(); ++mi) {
    const auto& m = sc.mats[mi];
    opt.add_matrix({tr.mp[mi].data(), tr.mg[mi].data(), m.rows, m.cols, m.pt, m.gt, m.layout});
  }
  for (std::size_t vi = 0; vi < sc.vecs.size(); ++vi)
    opt.add_vector({tr.vp[vi].data(), tr.vgb[vi].data(), sc.vecs[vi].n, sc.vecs[vi].pt, sc.vecs[vi].gt});
}

// n steps; a scenario with vary_lr sets the learning rate before each one by the trainer's own
// schedule (keyed by stats().steps, which a load restores), as the reference-model test does: a
// host update in flight at a save was launched with an earlier step's rate than the one in force.
template <class Opt>
void steps(Opt& opt, trainer& tr, int n) {
  std::vector<std::vector<double>> gm, gv;
  for (int i = 0; i < n; ++i) {
    if (tr.sc.vary_lr)
      opt.set_lr(float(double(tr.sc.cfg.adam.lr) * (1.0 + 0.5 * std::sin(0.9 * double(opt.stats().steps)))));
    opt.step(float(tr.next(gm, gv)));
  }
}

// Everything observable: the trainer's params, masters and moments, counts, selections, stats.
struct snapshot {
  std::vector<std::vector<unsigned char>> params;
  std::vector<std::vector<float>> state;
  std::vector<std::vector<std::uint32_t>> counts, selected;
  std::vector<std::uint64_t> stats;
  bool operator==(const snapshot&) const = default;
};
template <class Opt>
snapshot take(Opt& opt, const trainer& tr, const scenario& sc) {
  snapshot s;
  s.params = tr.mp;
  for (const auto& v : tr.vp) s.params.push_back(v);
  for (std::size_t mi = 0; mi < sc.mats.size(); ++mi) {
    const std::size_t n = sc.mats[mi].rows * sc.mats[mi].cols;
    std::vector<float> a(n), b(n), c(n);
    opt.copy_master(matrix_id{mi}, a.data());
    opt.copy_exp_avg(matrix_id{mi}, b.data());
    opt.copy_exp_avg_sq(matrix_id{mi}, c.data());
    s.state.push_back(a);
    s.state.push_back(b);
    s.state.push_back(c);
    s.counts.push_back(opt.column_counts(matrix_id{mi}));
    s.selected.push_back(opt.selected_columns(matrix_id{mi}));
  }
  for (std::size_t vi = 0; vi < sc.vecs.size(); ++vi) {
    std::vector<float> a(sc.vecs[vi].n);
    opt.copy_vector_master(vector_id{vi}, a.data());
    s.state.push_back(a);
  }
  const optimizer_stats st = opt.stats();
  s.stats = {st.steps, st.skipped_steps, st.selections, st.host_updates, st.bytes_to_host, st.bytes_to_device,
             opt.applied_steps()};
  return s;
}

}  // namespace

TEST_CASE("checkpoint CRC-32 is the standard one, in one piece or many") {
  // The IEEE CRC-32 check value: crc32("123456789") = 0xCBF43926. Files written before the
  // table-per-byte CRC became slicing-by-8 must still verify, so both must give the same value.
  const unsigned char check[] = {'1', '2', '3', '4', '5', '6', '7', '8', '9'};
  CHECK(ckpt::crc32(check, 9) == 0xCBF43926u);
  CHECK(ckpt::crc32(check, 0) == 0u);
  // a bitwise reference over a buffer of every length up to 64, fed in uneven pieces
  std::vector<unsigned char> data(64);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 37 + 11);
  for (std::size_t n = 0; n <= data.size(); ++n) {
    std::uint32_t ref = 0xffffffffu;
    for (std::size_t i = 0; i < n; ++i) {
      ref ^= data[i];
      for (int k = 0; k < 8; ++k) ref = (ref & 1) ? 0xedb88320u ^ (ref >> 1) : ref >> 1;
    }
    ref ^= 0xffffffffu;
    CAPTURE(n);
    CHECK(ckpt::crc32(data.data(), n) == ref);
    std::uint32_t c = ckpt::crc32_init;
    for (std::size_t at = 0; at < n;) {
      const std::size_t m = std::min<std::size_t>(n - at, 1 + at % 11);
      c = ckpt::crc32_update(c, data.data() + at, m);
      at += m;
    }
    CHECK(ckpt::crc32_final(c) == ref);
  }
}

TEST_CASE("checkpoint: resume is bit-exact, wherever the run is saved") {
  const std::string path = temp_path("resume.zfckpt");
  const std::uint64_t seeds = full_or_quick<std::uint64_t>(40, 10);
  for (std::uint64_t seed = 1; seed <= seeds; ++seed) {
    CAPTURE(seed);
    const scenario sc = random_scenario(seed);
    zf_test::rng pick(seed + 1000);
    const int total = sc.steps, at = 1 + int(pick.below(std::uint64_t(total - 1)));
    CAPTURE(at);
    // the uninterrupted run
    trainer t1(sc);
    optimizer<> a(sc.cfg);
    register_all(a, t1, sc);
    a.initialize();
    steps(a, t1, total);
    const snapshot want = take(a, t1, sc);
    // the same run saved at step `at`, dropped, and resumed by a new optimizer; half the seeds
    // with the host update's params uploaded ahead (a save with such an upload waiting to be
    // applied keeps it; a load uploads from the loaded master instead), which changes no bit —
    // with and without an lr schedule (vary_lr: the even seeds)
    const bool ahead = seed % 4 < 2;
    trainer t2(sc);
    std::optional<trainer> t3;  // the trainer as it was at the save
    {
      optimizer<> b(sc.cfg);
      b.transport().upload_ahead(ahead);
      register_all(b, t2, sc);
      b.initialize();
      steps(b, t2, at);
      b.save(path);
      t3.emplace(t2);
      if (ahead) {  // the saving run goes on, and so does one loaded at once, on a copy of the trainer
        trainer t4 = t2;
        optimizer<> d(sc.cfg);
        d.transport().upload_ahead(true);
        register_all(d, t4, sc);
        d.initialize();
        d.load(path);
        steps(b, t2, total - at);
        steps(d, t4, total - at);
        REQUIRE(take(b, t2, sc) == want);
        REQUIRE(take(d, t4, sc) == want);
      }
    }  // the optimizer is gone, and the weights are lost too:
    for (auto& buf : t3->mp) std::fill(buf.begin(), buf.end(), 0x55);
    for (auto& buf : t3->vp) std::fill(buf.begin(), buf.end(), 0x55);
    optimizer<> c(sc.cfg);
    c.transport().upload_ahead(ahead);
    register_all(c, *t3, sc);
    c.initialize();
    c.load(path);  // restores the weights as well
    steps(c, *t3, total - at);
    REQUIRE(take(c, *t3, sc) == want);
  }
  std::remove(path.c_str());
}

TEST_CASE("checkpoint: every counter of stats() continues from the saved run's") {
  // A load restores the counters as well as the state: right after it, a fresh optimizer
  // reports what the saved one did at the save, field by field — the time counters too (kept
  // exactly: nanoseconds, and the stall as a double) and the bytes uploaded ahead, which a
  // trainer's per-step ratios divide by the steps.
  const std::string path = temp_path("counters.zfckpt");
  scenario sc = random_scenario(5);
  sc.cfg.overlap_step = true;
  trainer tr(sc);
  optimizer<> a(sc.cfg);
  a.transport().upload_ahead(true);
  register_all(a, tr, sc);
  a.initialize();
  steps(a, tr, 11);
  a.save(path);
  const optimizer_stats want = a.stats();
  REQUIRE(want.bytes_uploaded_ahead > 0);  // (the run did upload ahead: the check below can fail)
  REQUIRE(want.host_update_seconds > 0);
  trainer t2(sc);
  optimizer<> b(sc.cfg);
  b.transport().upload_ahead(true);
  register_all(b, t2, sc);
  b.initialize();
  steps(b, t2, 2);  // counters of its own, which the load replaces
  b.load(path);
  const optimizer_stats got = b.stats();
  CHECK(got.steps == want.steps);
  CHECK(got.skipped_steps == want.skipped_steps);
  CHECK(got.selections == want.selections);
  CHECK(got.host_updates == want.host_updates);
  CHECK(got.bytes_to_host == want.bytes_to_host);
  CHECK(got.bytes_to_device == want.bytes_to_device);
  CHECK(got.bytes_uploaded_ahead == want.bytes_uploaded_ahead);
  CHECK(got.stall_seconds == want.stall_seconds);
  CHECK(got.host_update_seconds == want.host_update_seconds);
  // (the communication counters are 0 in one process, so these three only show that nothing
  // else lands in them; their restoring is checked with ranks, test_data_parallel_threads'
  // resharding case and test_mpi's)
  CHECK(got.bytes_reduced == want.bytes_reduced);
  CHECK(got.bytes_gathered == want.bytes_gathered);
  CHECK(got.reduce_seconds == want.reduce_seconds);
  std::remove(path.c_str());
}

TEST_CASE("checkpoint: corrupt, truncated or foreign files are refused and change nothing") {
  const std::string path = temp_path("corrupt.zfckpt"), bad = temp_path("corrupt-bad.zfckpt");
  scenario sc = random_scenario(3);
  sc.cfg.overlap_step = true;
  trainer tr(sc);
  optimizer<> opt(sc.cfg);
  register_all(opt, tr, sc);
  opt.initialize();
  steps(opt, tr, 9);
  opt.save(path);
  steps(opt, tr, 3);  // the optimizer moves on: a successful load would change it
  const snapshot before = take(opt, tr, sc);
  std::vector<unsigned char> good;
  {
    std::ifstream f(path, std::ios::binary);
    good.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  auto write = [&](const std::vector<unsigned char>& bytes) {
    std::ofstream f(bad, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  };
  auto refused = [&](const std::vector<unsigned char>& bytes, const std::string& why) {
    CAPTURE(why);
    write(bytes);
    std::string msg;
    try {
      opt.load(bad);
    } catch (const checkpoint_error& e) {
      msg = e.what();
    }
    CHECK_MESSAGE(msg.find(why) != std::string::npos, msg);
    REQUIRE(take(opt, tr, sc) == before);
  };
  // truncated at every section boundary (and one byte either side), and inside the header
  std::vector<std::size_t> cuts = {0, 7, 8, 23};
  for (std::size_t at = 24; at < good.size();) {
    std::uint64_t len;
    std::memcpy(&len, good.data() + at + 8, 8);
    cuts.insert(cuts.end(), {at, at + 1, at + 15, at + 16, at + 16 + std::size_t(len), at + 16 + std::size_t(len) + 3});
    at += 16 + std::size_t(len) + 4;
  }
  for (std::size_t cut : cuts) {
    CAPTURE(cut);
    const std::vector<unsigned char> t(good.begin(), good.begin() + std::ptrdiff_t(cut));
    refused(t, cut < 24 ? "bad magic" : "truncated");
  }
  auto flipped = [&](std::size_t at) {
    auto b = good;
    b[at] ^= 0x10;
    return b;
  };
  refused(flipped(0), "bad magic");
  refused(flipped(8), "format version");
  refused(flipped(12), "byte order");
  // the reserved words no checksum covers (the header's, and each section's after its tag) are
  // written 0 and read so
  refused(flipped(20), "the header's reserved field is not 0");
  for (std::size_t at = 24, k = 0; at < good.size(); ++k) {
    CAPTURE(k);
    refused(flipped(at + 4), "section " + std::to_string(k) + "'s reserved field is not 0");
    std::uint64_t len;
    std::memcpy(&len, good.data() + at + 8, 8);
    at += 16 + std::size_t(len) + 4;
  }
  zf_test::rng r(9);
  for (int i = 0; i < 40; ++i) {  // a flipped bit anywhere in the sections: a checksum (or a length) catches it
    const std::size_t at = 24 + std::size_t(r.below(good.size() - 24));
    CAPTURE(at);
    write(flipped(at));
    CHECK_THROWS_AS(opt.load(bad), checkpoint_error);
    REQUIRE(take(opt, tr, sc) == before);
  }
  auto extra = good;
  extra.push_back(0);
  refused(extra, "trailing bytes");
  refused({}, "bad magic");
  CHECK_THROWS_WITH_AS(opt.load(temp_path("no-such-file")),
                       doctest::Contains("cannot open the file"), checkpoint_error);
  REQUIRE(take(opt, tr, sc) == before);

  // a different optimizer: other shapes, or another config
  {
    scenario other = sc;
    other.mats[0].cols += 1;
    trainer t2(other);
    optimizer<> o2(other.cfg);
    register_all(o2, t2, other);
    o2.initialize();
    CHECK_THROWS_WITH_AS(o2.load(path), doctest::Contains("matrix 0 is"), checkpoint_error);
  }
  {
    config c2 = sc.cfg;
    c2.adam.beta2 = 0.95f;
    trainer t2(sc);
    optimizer<> o2(c2);
    register_all(o2, t2, sc);
    o2.initialize();
    CHECK_THROWS_WITH_AS(o2.load(path), doctest::Contains("config differs: beta2"), checkpoint_error);
  }
  // and the good file still loads
  opt.load(path);
  CHECK_FALSE(take(opt, tr, sc) == before);
  std::remove(path.c_str());
  std::remove(bad.c_str());
}

TEST_CASE("a storm of non-finite gradients changes nothing, and is counted") {
  const std::size_t R = 8, C = 24;
  auto run = [&](int storm) {
    std::vector<bfloat16> w(R * C), dw(R * C), b(R), db(R);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = to_bfloat16(float(i % 7) * 0.1f - 0.3f);
    config cfg;
    cfg.topk_ratio = 0.25;
    cfg.update_interval = interval::every(2);
    cfg.select_interval = interval::every(4);
    optimizer<> opt(cfg);
    opt.add_matrix({w.data(), dw.data(), R, C, dtype::bf16, dtype::bf16});
    opt.add_vector({b.data(), db.data(), R, dtype::bf16, dtype::bf16});
    opt.initialize();
    auto set = [&](int s) {
      for (std::size_t i = 0; i < dw.size(); ++i) dw[i] = to_bfloat16(std::sin(float(i * 3 + std::size_t(s))) * 0.01f);
      for (std::size_t i = 0; i < db.size(); ++i) db[i] = to_bfloat16(std::cos(float(i + std::size_t(s))) * 0.01f);
    };
    auto good = [&](int s) {
      set(s);
      CHECK_FALSE(opt.step(256.0f).skipped);
    };
    for (int s = 0; s < 7; ++s) good(s);  // stops mid-window, with an update in flight
    for (int s = 0; s < storm; ++s) {
      set(100 + s);
      dw[std::size_t(s) % dw.size()] = to_bfloat16(s % 3 == 0 ? NAN : s % 3 == 1 ? INFINITY : -INFINITY);
      if (s % 4 == 0) db[0] = to_bfloat16(NAN);
      CHECK(opt.step(256.0f).skipped);
    }
    for (int s = 7; s < 15; ++s) good(s);
    opt.synchronize();
    std::vector<float> master(R * C);
    opt.copy_master(matrix_id{0}, master.data());
    return std::make_tuple(w, b, master, opt.stats());
  };
  const auto [w0, b0, m0, s0] = run(0);
  const auto [w1, b1, m1, s1] = run(50);
  CHECK(std::memcmp(w0.data(), w1.data(), w0.size() * 2) == 0);
  CHECK(std::memcmp(b0.data(), b1.data(), b0.size() * 2) == 0);
  CHECK(m0 == m1);
  CHECK(s1.skipped_steps == 50);
  CHECK(s1.steps == s0.steps + 50);
  CHECK(s1.host_updates == s0.host_updates);
  CHECK(s1.bytes_to_host == s0.bytes_to_host);
}

TEST_CASE("checkpoint: found by fuzzing — empty selections round-trip, impossible counts are refused") {
  const std::string path = temp_path("fuzz-regress.zfckpt");
  std::vector<float> w(6 * 9, 0.5f), g(6 * 9, 0.01f);
  // topk_ratio 0: no selected columns, empty device arrays (a null pointer with zero length)
  config cfg;
  cfg.topk_ratio = 0;
  cfg.update_interval = interval::every(2);
  cfg.select_interval = interval::every(2);
  optimizer<> a(cfg);
  a.add_matrix({w.data(), g.data(), 6, 9});
  a.initialize();
  a.step();
  a.save(path);
  optimizer<> b(cfg);
  std::vector<float> w2(w.size()), g2(g.size());
  b.add_matrix({w2.data(), g2.data(), 6, 9});
  b.initialize();
  b.load(path);
  CHECK(w2 == w);
  CHECK(b.column_counts(matrix_id{0}) == a.column_counts(matrix_id{0}));
  // a file whose checksums are right but whose Adam counts exceed the applied steps
  std::vector<unsigned char> img = file_bytes(path);
  const section_place mat = section_of(img, 3);  // after config, layout, counters
  const std::size_t payload = mat.payload, n = 6 * 9;
  // matrix payload: active (0), then host master, moments, accumulator(s), then 9 counts
  const std::size_t counts_at = payload + 8 + (12 + 4 * 2) * n;  // overlap on: two accumulators
  const std::uint32_t huge = 0xfffffff0u;
  std::memcpy(img.data() + counts_at, &huge, 4);
  reseal(img, mat);
  CHECK_THROWS_WITH_AS(b.load_image(img.data(), img.size()),
                       doctest::Contains("an Adam count exceeds the applied steps"), checkpoint_error);
  CHECK(b.column_counts(matrix_id{0}) == a.column_counts(matrix_id{0}));
  std::memcpy(img.data() + counts_at, a.column_counts(matrix_id{0}).data(), 4);  // the count back
  // ... an infinite second moment (host v of column 0), checksum right: a column frozen for good
  // (or a NaN, which would spread) is refused
  // (or a negative one, whose square root is a NaN at the next update)
  for (const float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(), -1.0f}) {
    const std::vector<unsigned char> v = crafted(img, mat, 8 + 8 * n, &bad, 4);
    CHECK_THROWS_WITH_AS(b.load_image(v.data(), v.size()),
                         doctest::Contains("matrix 0: a master, moment or accumulator is not finite"), checkpoint_error);
  }
  // ... a NaN or an infinity in either gradient accumulator (its first element, and the second
  // accumulator's last), which the next boundary would add into the host columns' update
  for (const std::size_t at : {8 + 12 * n, 8 + 20 * n - 4})
    for (const float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
      CAPTURE(at);
      const std::vector<unsigned char> v = crafted(img, mat, at, &bad, 4);
      CHECK_THROWS_WITH_AS(b.load_image(v.data(), v.size()),
                           doctest::Contains("matrix 0: a master, moment or accumulator is not finite"), checkpoint_error);
    }
  reseal(img, mat);  // the same file, untouched, loads (the edits above were all that was wrong)
  CHECK_NOTHROW(b.load_image(img.data(), img.size()));
  // a null image is an error, not a read through a null pointer
  CHECK_THROWS_WITH_AS(b.load_image(nullptr, img.size()), doctest::Contains("the image is a null pointer"),
                       checkpoint_error);
  CHECK_THROWS_WITH_AS(b.load_image(nullptr, 0), doctest::Contains("bad magic"), checkpoint_error);
  CHECK(b.column_counts(matrix_id{0}) == a.column_counts(matrix_id{0}));
  std::remove(path.c_str());
}

// Checksums right, but a state the schedule cannot reach: refused by load (every later step
// would otherwise throw), the optimizer unchanged.
TEST_CASE("checkpoint: crafted counters the schedule cannot reach are refused") {
  const std::string path = temp_path("crafted-counters.zfckpt");
  std::vector<float> w(6 * 9, 0.5f), g(6 * 9, 0.01f);
  config cfg;  // overlap off
  cfg.topk_ratio = 0.25;
  cfg.update_interval = interval::every(4);
  cfg.select_interval = interval::every(4);
  cfg.overlap_step = false;
  optimizer<> a(cfg);
  a.add_matrix({w.data(), g.data(), 6, 9});
  a.initialize();
  a.step();  // mid-window: window_steps = 1
  a.save(path);
  const std::vector<unsigned char> img = file_bytes(path);
  // counters payload (section 2): 10 u64 (applied, steps, skipped, selections, host updates,
  // last selection, window steps, bytes to host, bytes to device, host ns), a double, then u8
  // selected_once, u8 pending, u8 accumulator
  const section_place counters = section_of(img, 2);
  const std::size_t payload = counters.payload;
  auto crafted = [&](std::size_t offset, const void* value, std::size_t bytes) {
    return ::crafted(img, counters, offset, value, bytes);
  };
  optimizer<> b(cfg);
  std::vector<float> w2(w.size(), 0.0f), g2(g.size());
  b.add_matrix({w2.data(), g2.data(), 6, 9});
  b.initialize();
  const std::uint8_t one = 1;
  const std::uint64_t window = 4, applied = 5, steps = 5;
  const auto acc = crafted(80 + 8 + 2, &one, 1);
  CHECK_THROWS_WITH_AS(b.load_image(acc.data(), acc.size()),
                       doctest::Contains("selects the second accumulator, which only overlap_step uses"), checkpoint_error);
  const auto pend = crafted(80 + 8 + 1, &one, 1);
  CHECK_THROWS_WITH_AS(b.load_image(pend.data(), pend.size()),
                       doctest::Contains("has a host update pending, which only overlap_step leaves"), checkpoint_error);
  // a window as long as update_interval (counters otherwise consistent: applied = steps >= window)
  std::vector<unsigned char> win = crafted(6 * 8, &window, 8);
  std::memcpy(win.data() + payload, &applied, 8);
  std::memcpy(win.data() + payload + 8, &steps, 8);
  reseal(win, counters);
  CHECK_THROWS_WITH_AS(b.load_image(win.data(), win.size()),
                       doctest::Contains("has an open window of 4 steps; update_interval is 4"), checkpoint_error);
  // applied + skipped == steps only modulo 2^64: applied = 2^64 - 1, skipped = 1, steps = 0
  // (an Adam step count of 2^64 - 1 would then pass every "count <= applied" check)
  const std::uint64_t most = std::numeric_limits<std::uint64_t>::max();
  std::vector<unsigned char> wrap = crafted(0, &most, 8);
  const std::uint64_t zero = 0, skipped = 1;
  std::memcpy(wrap.data() + payload + 8, &zero, 8);
  std::memcpy(wrap.data() + payload + 16, &skipped, 8);
  reseal(wrap, counters);
  CHECK_THROWS_WITH_AS(b.load_image(wrap.data(), wrap.size()), doctest::Contains("counters section is inconsistent"),
                       checkpoint_error);
  CHECK(std::all_of(w2.begin(), w2.end(), [](float x) { return x == 0.0f; }));  // nothing was committed
  CHECK_NOTHROW(b.load_image(img.data(), img.size()));  // the real file loads
  CHECK(w2 == w);
  std::remove(path.c_str());
}

TEST_CASE("checkpoint: a file's lr that this optimizer's parameter groups do not allow is refused, as set_lr refuses it") {
  // Group scales are not in the file: a run whose lr fits its own groups (0.5, weight decay 1)
  // loaded where a matrix decays 10x faster (lr 0.5 x weight decay 10 = 5: a decay factor of -4
  // a step) must be refused, not trained on.
  const std::string path = temp_path("lr-groups.zfckpt");
  config cfg;
  cfg.topk_ratio = 0.25;
  cfg.adam.lr = 0.5f;
  cfg.adam.weight_decay = 1.0f;
  std::vector<float> w(6 * 9, 0.5f), g(6 * 9, 0.01f);
  optimizer<> a(cfg);
  a.add_matrix({w.data(), g.data(), 6, 9});
  a.initialize();
  a.step();
  a.save(path);
  config low = cfg;
  low.adam.lr = 0.05f;
  std::vector<float> w2(w.size(), 0.0f), g2(g.size());
  optimizer<> b(low);
  b.add_matrix(matrix(w2.data(), g2.data(), rows{6}, cols{9}).group(1.0f, 10.0f));
  b.initialize();
  CHECK_THROWS_AS(b.set_lr(0.5f), std::invalid_argument);
  CHECK_THROWS_WITH_AS(b.load(path),
                       doctest::Contains("its lr does not fit this optimizer (zenflow: matrix 0: its lr (0.5) times its "
                                         "weight_decay (10) must be at most 1)"),
                       checkpoint_error);
  CHECK(b.lr() == 0.05f);  // nothing was committed
  CHECK(std::all_of(w2.begin(), w2.end(), [](float x) { return x == 0.0f; }));
  // with groups that allow it, the same file loads
  std::vector<float> w3(w.size(), 0.0f), g3(g.size());
  optimizer<> c(low);
  c.add_matrix(matrix(w3.data(), g3.data(), rows{6}, cols{9}).group(1.0f, 2.0f));
  c.initialize();
  CHECK_NOTHROW(c.load(path));
  CHECK(c.lr() == 0.5f);
  CHECK(w3 == w);
  std::remove(path.c_str());
}

TEST_CASE("checkpoint: a Zen-auto sum that is not finite is refused (the window would never close)") {
  const std::string path = temp_path("crafted-auto.zfckpt");
  std::vector<float> w(6 * 9, 0.5f), g(6 * 9);
  for (std::size_t i = 0; i < g.size(); ++i) g[i] = 0.01f * float(i % 7);
  config cfg;
  cfg.topk_ratio = 0.25;
  cfg.update_interval = interval::auto_();
  cfg.select_interval = interval::every(4);
  optimizer<> a(cfg);
  a.add_matrix({w.data(), g.data(), 6, 9});
  a.initialize();
  a.step();
  a.step();
  a.save(path);
  const std::vector<unsigned char> img = file_bytes(path);
  // counters payload (section 2): 10 u64, a double, 3 u8, u64 the number of Zen-auto pairs (1
  // here), then the pairs (double, double)
  const section_place counters = section_of(img, 2);
  std::uint64_t na;
  std::memcpy(&na, img.data() + counters.payload + 91, 8);
  REQUIRE(na == 1);
  optimizer<> b(cfg);
  std::vector<float> w2(w.size(), 0.0f), g2(g.size());
  b.add_matrix({w2.data(), g2.data(), 6, 9});
  b.initialize();
  for (std::size_t offset : {99u, 107u})
    for (const double bad : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity()}) {
      CAPTURE(offset);
      const std::vector<unsigned char> c = crafted(img, counters, offset, &bad, 8);
      CHECK_THROWS_WITH_AS(b.load_image(c.data(), c.size()),
                           doctest::Contains("counters section has a Zen-auto sum that is not finite"), checkpoint_error);
    }
  // a negative sum (norms times clip factors never are) would close the window at once or never
  for (std::size_t offset : {99u, 107u}) {
    CAPTURE(offset);
    const double minus = -1.0;
    const std::vector<unsigned char> c = crafted(img, counters, offset, &minus, 8);
    CHECK_THROWS_WITH_AS(b.load_image(c.data(), c.size()), doctest::Contains("counters section has a negative Zen-auto sum"),
                         checkpoint_error);
  }
  // the stall time (a double after the 10 counters): an infinite one is no run's
  for (const double stall : {std::numeric_limits<double>::infinity(), -1.0, std::numeric_limits<double>::quiet_NaN()}) {
    CAPTURE(stall);
    const std::vector<unsigned char> c = crafted(img, counters, 80, &stall, 8);
    CHECK_THROWS_WITH_AS(b.load_image(c.data(), c.size()), doctest::Contains("counters section is inconsistent"),
                         checkpoint_error);
  }
  CHECK(std::all_of(w2.begin(), w2.end(), [](float x) { return x == 0.0f; }));  // nothing was committed
  CHECK_NOTHROW(b.load_image(img.data(), img.size()));  // the real file loads
  CHECK(w2 == w);
  std::remove(path.c_str());
}

// The two tests of a file rewritten during a load: a 6 x 9 matrix and a 5-vector, trained with
// a gradient of step t.
config rewrite_config() {
  config cfg;
  cfg.topk_ratio = 0.25;
  cfg.overlap_step = false;
  return cfg;
}
struct rewrite_run {
  static constexpr std::size_t R = 6, C = 9, V = 5;
  std::vector<float> w, g, b, gb;
  optimizer<> opt;
  explicit rewrite_run(const config& c) : w(R * C, 0.5f), g(R * C), b(V, -0.25f), gb(V), opt(c) {
    opt.add_matrix({w.data(), g.data(), R, C});
    opt.add_vector({b.data(), gb.data(), V});
    opt.initialize();
  }
  void step(int t) {
    for (std::size_t i = 0; i < g.size(); ++i) g[i] = 0.01f * float((i * 7 + std::size_t(t)) % 11) - 0.05f;
    for (std::size_t i = 0; i < gb.size(); ++i) gb[i] = 0.02f * float(i) - 0.03f * float(t % 3);
    opt.step();
  }
};

// A file rewritten in place while it is being loaded: the first pass checked the old bytes, the
// second finds others after part of the state was written (here the matrices, before the vector
// whose bytes changed). The load throws, and the optimizer refuses step() and save() — its state
// is now half one checkpoint, half another — until a load succeeds; then it trains on exactly as
// the checkpoint's own run does.
TEST_CASE("checkpoint: a file changed between the two passes of a load is refused, and so is further work until a load succeeds") {
  const std::string path = temp_path("changing.zfckpt"), other = temp_path("changing-other.zfckpt");
  std::remove(other.c_str());  // (one an earlier, failed run may have left)
  const config cfg = rewrite_config();
  rewrite_run a(cfg), b(cfg);
  for (int t = 0; t < 3; ++t) a.step(t);
  a.opt.save(path);
  std::vector<unsigned char> img;
  {
    std::ifstream f(path, std::ios::binary);
    img.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  ckpt::input in(img.data(), img.size(), "changing");
  in.on_rewind([&] { img[img.size() - 6] ^= 0x40; });  // a byte of the vector's params, the last section
  CHECK_THROWS_WITH_AS(detail::optimizer_checkpoint<optimizer<>>::load(b.opt, in),
                       doctest::Contains("checksum mismatch in section 4"), checkpoint_error);
  CHECK_THROWS_WITH_AS(b.step(3), doctest::Contains("load a checkpoint to go on"), std::logic_error);
  CHECK_THROWS_WITH_AS(b.opt.save(other), doctest::Contains("load a checkpoint to go on"), std::logic_error);
  CHECK_FALSE(std::ifstream(other).good());  // nothing was written
  b.opt.load(path);
  for (int t = 3; t < 8; ++t) {
    a.step(t);
    b.step(t);
    REQUIRE(a.w == b.w);
    REQUIRE(a.b == b.b);
  }
  std::remove(path.c_str());
}

TEST_CASE("checkpoint: a file rewritten between the passes with another valid checkpoint of the same shape is refused") {
  // `cp older.zfckpt latest.zfckpt` landing while a load of latest is between its passes: every
  // section of the new bytes has a right checksum, so only the comparison with the first pass's
  // checksums can tell that the state being committed is not the one that was checked (and whose
  // counters the load takes). The load fails and the optimizer refuses work until a load succeeds.
  const std::string path = temp_path("rewritten.zfckpt"), other = temp_path("rewritten-other.zfckpt");
  const config cfg = rewrite_config();
  rewrite_run a(cfg), o(cfg);
  for (int t = 0; t < 3; ++t) a.step(t);
  a.opt.save(path);
  for (int t = 3; t < 6; ++t) a.step(t);
  a.opt.save(other);
  std::vector<unsigned char> img = file_bytes(path);
  const std::vector<unsigned char> later = file_bytes(other);
  REQUIRE(later.size() == img.size());  // the same shape: only the contents differ
  REQUIRE(later != img);
  ckpt::input in(img.data(), img.size(), "rewritten");
  in.on_rewind([&] { std::memcpy(img.data(), later.data(), img.size()); });
  CHECK_THROWS_WITH_AS(detail::optimizer_checkpoint<optimizer<>>::load(o.opt, in),
                       doctest::Contains("changed while it was being loaded"), checkpoint_error);
  CHECK_THROWS_WITH_AS(o.opt.step(), doctest::Contains("load a checkpoint to go on"), std::logic_error);
  // the file as it now is loads whole: the state after 6 steps
  o.opt.load(other);
  CHECK(o.opt.applied_steps() == 6);
  CHECK(o.w == a.w);
  CHECK(o.b == a.b);
  std::remove(path.c_str());
  std::remove(other.c_str());
}

TEST_CASE("checkpoint: an fp32 param that is its own master must be finite in the file (the load takes the master from it)") {
  // For an fp32 param the file holds the master twice: a copy (checked, then skipped by the
  // load) and the param itself, which the load takes. A crafted file whose copy is finite but
  // whose param holds a NaN or an infinity is refused, for a matrix and for a vector.
  const std::string path = temp_path("param-master.zfckpt"), bad = temp_path("param-master-bad.zfckpt");
  const std::size_t R = 4, C = 6, V = 5;
  config cfg;
  cfg.topk_ratio = 0.5;
  std::vector<float> w(R * C, 0.5f), g(R * C, 0.01f), b(V, -0.25f), gb(V, 0.02f);
  optimizer<> a(cfg);
  a.add_matrix({w.data(), g.data(), R, C});
  a.add_vector({b.data(), gb.data(), V});
  a.initialize();
  for (int t = 0; t < 3; ++t) a.step();
  a.save(path);
  const std::vector<unsigned char> good = file_bytes(path);
  const section_place mat = section_of(good, 3), vec = section_of(good, 4);
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  struct edit {
    section_place sec;
    std::size_t offset;
    float value;
  };
  // the param is the last 4 * n bytes of each section; the matrix's first and a last element
  const std::vector<edit> edits = {{mat, std::size_t(mat.len) - 4 * R * C, nan},
                                   {mat, std::size_t(mat.len) - 4, inf},
                                   {vec, std::size_t(vec.len) - 4 * V, -inf},
                                   {vec, std::size_t(vec.len) - 4, nan}};
  for (const edit& e : edits) {
    CAPTURE(e.offset);
    const auto img = crafted(good, e.sec, e.offset, &e.value, 4);
    {
      std::ofstream f(bad, std::ios::binary | std::ios::trunc);
      f.write(reinterpret_cast<const char*>(img.data()), std::streamsize(img.size()));
    }
    std::vector<float> w2(R * C, 0.5f), g2(R * C), b2(V, -0.25f), gb2(V);
    optimizer<> o(cfg);
    o.add_matrix({w2.data(), g2.data(), R, C});
    o.add_vector({b2.data(), gb2.data(), V});
    o.initialize();
    CHECK_THROWS_WITH_AS(o.load(bad), doctest::Contains("is not finite"), checkpoint_error);
    CHECK(o.applied_steps() == 0);  // unchanged
    CHECK(w2 == std::vector<float>(R * C, 0.5f));
  }
  // (the unedited file loads)
  std::vector<float> w3(R * C, 0.5f), g3(R * C), b3(V, -0.25f), gb3(V);
  optimizer<> o(cfg);
  o.add_matrix({w3.data(), g3.data(), R, C});
  o.add_vector({b3.data(), gb3.data(), V});
  o.initialize();
  o.load(path);
  CHECK(w3 == w);
  std::remove(path.c_str());
  std::remove(bad.c_str());
}

TEST_CASE("checkpoint: save refuses a state that load would refuse, and the previous file stands") {
  // A moment that overflowed (classic Adam's decay term g + wd * p squared, from a finite but
  // absurd param), or a param the trainer writes later (an fp32 param is its selected columns'
  // master): steps go on — only gradients are checked — but a checkpoint of that state would be
  // refused by load. save() refuses it before the rename instead of replacing the last good file
  // with it. (A param that is not finite at initialize() makes step() refuse: test_robustness.)
  const std::string path = temp_path("refused_state.zfckpt");
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  config cfg;
  cfg.topk_ratio = 0.25;
  cfg.update_interval = interval::every(2);
  auto refused = [&](auto& opt, const char* who) {
    const std::vector<unsigned char> before = file_bytes(path);
    REQUIRE(!before.empty());
    const std::string want = std::string("refused: ") + who + " holds a master, moment or accumulator that is not finite";
    CHECK_THROWS_WITH_AS(opt.save(path), doctest::Contains(want.c_str()), std::runtime_error);
    CHECK(file_bytes(path) == before);
    CHECK(opt.usable());  // (a save that refuses changes nothing)
  };
  {  // a bf16 matrix beside a good one, one of its params 1e30: with classic Adam and weight
     // decay 0.01 the column's g + wd * p is 1e28, whose square is past fp32: v = inf once the
     // column is updated (on the host or the device, by step 2: U = 2)
    std::vector<bfloat16> w(8 * 16, to_bfloat16(0.5f)), g(8 * 16, to_bfloat16(0.01f));
    std::vector<float> w1(8 * 16, 0.5f), g1(8 * 16, 0.01f);
    config classic = cfg;
    classic.adam.mode = adam_mode::classic;
    classic.adam.weight_decay = 0.01f;
    optimizer<> good(classic);
    good.add_matrix({w1.data(), g1.data(), 8, 16});
    good.initialize();
    good.step();
    good.save(path);  // the last good checkpoint at the path
    w[37] = to_bfloat16(1e30f);
    optimizer<> opt(classic);
    opt.add_matrix({w1.data(), g1.data(), 8, 16});
    opt.add_matrix({w.data(), g.data(), 8, 16, dtype::bf16, dtype::bf16});
    opt.initialize();
    opt.step();
    opt.step();
    refused(opt, "matrix 1");
  }
  {  // an fp32 vector (its own master) the trainer wrote an infinity into
    std::vector<float> w(8 * 16, 0.5f), g(8 * 16, 0.01f), b(5, 0.0f), gb(5, 0.01f);
    optimizer<> opt(cfg);
    opt.add_matrix({w.data(), g.data(), 8, 16});
    opt.add_vector({b.data(), gb.data(), 5});
    opt.initialize();
    opt.step();
    b[4] = inf;
    refused(opt, "vector 0");
  }
  {  // an fp32 matrix param the trainer wrote a NaN into after a few steps, in a selected column
    std::vector<float> w(8 * 16, 0.5f), g(8 * 16, 0.01f);
    optimizer<> opt(cfg);
    opt.add_matrix({w.data(), g.data(), 8, 16});
    opt.initialize();
    for (int s = 0; s < 3; ++s) opt.step();
    const std::uint32_t c = opt.selected_columns(matrix_id{0}).at(0);
    w[std::size_t(c) * 8 + 3] = nan;
    refused(opt, "matrix 0");
  }
  std::remove(path.c_str());
}

#if defined(__unix__)
TEST_CASE("checkpoint: a save removes the temporary files that killed saves of its path left, and nothing else") {
  namespace fs = std::filesystem;
  const std::string dir = temp_path("stale-temporaries");
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = dir + "/run.zfckpt";
  const auto old_time = fs::file_time_type::clock::now() - std::chrono::minutes(5);
  auto make = [&](const std::string& name, bool old) {
    std::ofstream(dir + "/" + name) << "partial";
    if (old) fs::last_write_time(dir + "/" + name, old_time);
    return dir + "/" + name;
  };
  // What the clean-up must take: killed saves' temporaries (their writers gone, so no lock is
  // held on them), untouched for longer than a minute.
  const std::vector<std::string> stale = {make("run.zfckpt.tmp.4242.0", true), make("run.zfckpt.tmp.1.17", true)};
  // What it must leave: a temporary written to within the minute (a writer that may still be
  // between creating and locking it), one whose writer holds its lock (another process's save in
  // flight: a lock of another open file description conflicts the same way), one this process is
  // writing (registered), names that only look alike, another path's temporary, a directory and a
  // symlink of the pattern (and the symlink's target).
  const std::string fresh = make("run.zfckpt.tmp.4243.0", false);
  const std::string locked = make("run.zfckpt.tmp.4244.0", true);
  const std::string mine = make("run.zfckpt.tmp.4245.0", true);
  const std::vector<std::string> unlike = {make("run.zfckpt.tmp.4246", true), make("run.zfckpt.tmp.4246.0.bak", true),
                                           make("run.zfckpt.tmp.x.0", true), make("run.zfckpt.tmpx.1.2", true),
                                           make("other.zfckpt.tmp.1.2", true), make("run.zfckpt.tmp..0", true)};
  fs::create_directory(dir + "/run.zfckpt.tmp.7.7");
  const std::string target = make("target", true);
  fs::create_symlink(target, dir + "/run.zfckpt.tmp.8.8");
  const int held = ::open(locked.c_str(), O_RDWR);
  REQUIRE(held >= 0);
  REQUIRE(::flock(held, LOCK_EX | LOCK_NB) == 0);
  ckpt::live_temporaries::add(mine);

  std::vector<float> w(12, 0.5f), g(12, 0.01f);
  optimizer<> opt{config{}};
  opt.add_matrix({w.data(), g.data(), 3, 4});
  opt.initialize();
  opt.step();
  opt.save(path);

  for (const auto& f : stale) CHECK_MESSAGE(!fs::exists(f), f);
  for (const auto& f : unlike) CHECK_MESSAGE(fs::exists(f), f);
  CHECK(fs::exists(fresh));
  CHECK(fs::exists(locked));
  CHECK(fs::exists(mine));
  CHECK(fs::is_directory(dir + "/run.zfckpt.tmp.7.7"));
  CHECK(fs::is_symlink(dir + "/run.zfckpt.tmp.8.8"));
  CHECK(fs::exists(target));
  // the save itself is whole, and no temporary of its own is left
  optimizer<> back{config{}};
  back.add_matrix({w.data(), g.data(), 3, 4});
  back.initialize();
  CHECK_NOTHROW(back.load(path));
  CHECK(back.applied_steps() == 1);
  // once its writer is gone (the lock released) and the registration too, the next save takes them
  ::close(held);
  ckpt::live_temporaries::remove(mine);
  opt.save(path);
  CHECK_FALSE(fs::exists(locked));
  CHECK_FALSE(fs::exists(mine));
  CHECK(fs::exists(fresh));  // still within its minute
  fs::remove_all(dir);
}

// A FIFO at the path: refused at once as not a regular file (opened without blocking, then
// checked), where a plain open would wait for a writer for good (this test would then hang
// until ctest's timeout).
TEST_CASE("checkpoint: a FIFO at the path is refused at once, not waited on") {
  const std::string path = temp_path("fifo.zfckpt");
  std::remove(path.c_str());
  REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
  std::vector<float> w(12, 0.5f), g(12, 0.01f);
  optimizer<> opt{config{}};
  opt.add_matrix({w.data(), g.data(), 3, 4});
  opt.initialize();
  CHECK_THROWS_WITH_AS(opt.load(path), doctest::Contains("not a regular file"), checkpoint_error);
  CHECK(opt.applied_steps() == 0);
  std::remove(path.c_str());
}

#if defined(__unix__)
// A save replaces the file by a rename: the new file takes the old one's permission bits (a
// checkpoint its owner made private stays private), and a first save gets the umask's.
TEST_CASE("checkpoint: a save keeps the permissions of the file it replaces") {
  const std::string path = temp_path("mode.zfckpt");
  std::remove(path.c_str());
  std::vector<float> w(12, 0.5f), g(12, 0.01f);
  optimizer<> opt{config{}};
  opt.add_matrix({w.data(), g.data(), 3, 4});
  opt.initialize();
  opt.step();
  auto mode = [&] {
    struct stat st{};
    REQUIRE(::stat(path.c_str(), &st) == 0);
    return st.st_mode & 07777;
  };
  const mode_t mask = ::umask(022);
  ::umask(mask);
  opt.save(path);
  CHECK(mode() == (0666 & ~mask));
  for (const mode_t m : {0600, 0640, 0444, 0604}) {
    CAPTURE(m);
    REQUIRE(::chmod(path.c_str(), m) == 0);
    opt.step();
    opt.save(path);
    CHECK(mode() == m);
    CHECK_NOTHROW(opt.load(path));
  }
  std::remove(path.c_str());
}
#endif

// The temporary file is created exclusively, never through a link: a symbolic link (or a file)
// someone left under the name the next save takes is neither written through nor truncated; the
// save takes the next name and is whole.
TEST_CASE("checkpoint: a link or file at the next temporary name is not written through, the save takes another") {
  namespace fs = std::filesystem;
  const std::string dir = temp_path("excl-temporaries");
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = dir + "/run.zfckpt", victim = dir + "/victim.txt";
  std::ofstream(victim) << "keep me";
  // the names of this process's next saves: <path>.tmp.<pid>.<n>, n counting per process
  const std::string taken = ckpt::temporary_name(path);
  const std::string stem = taken.substr(0, taken.rfind('.') + 1);
  const unsigned long long n = std::stoull(taken.substr(taken.rfind('.') + 1));
  fs::create_symlink(victim, stem + std::to_string(n + 1));
  std::ofstream(stem + std::to_string(n + 2)) << "someone's";
  std::vector<float> w(12, 0.5f), g(12, 0.01f);
  optimizer<> opt{config{}};
  opt.add_matrix({w.data(), g.data(), 3, 4});
  opt.initialize();
  opt.step();
  CHECK_NOTHROW(opt.save(path));
  auto text = [](const std::string& f) {
    std::ifstream in(f);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  CHECK(text(victim) == "keep me");
  CHECK(fs::is_symlink(stem + std::to_string(n + 1)));
  CHECK(text(stem + std::to_string(n + 2)) == "someone's");
  optimizer<> back{config{}};
  back.add_matrix({w.data(), g.data(), 3, 4});
  back.initialize();
  CHECK_NOTHROW(back.load(path));
  CHECK(back.applied_steps() == 1);
  fs::remove_all(dir);
}
#endif

TEST_CASE("checkpoint: a file of other registrations is refused, naming what differs in words") {
  // 8x21 matrix and 8 vector elements, each saved once as the file; the optimizer loading it
  // registers something else, and the message says what, with dtypes and layouts by name
  std::vector<float> w(8 * 21, 0.5f), g(8 * 21, 0.01f), b(8, 0.25f), gb(8, 0.01f), b2(8, 0.0f), gb2(8, 0.0f);
  std::vector<bfloat16> wh(8 * 21, bfloat16(0.5f)), gh(8 * 21, bfloat16(0.01f));
  const std::string path = temp_path("registrations.zfckpt");
  {
    optimizer<> file{config{}};
    file.add_matrix(matrix(w.data(), g.data(), rows{8}, cols{21}));
    file.add_vector(zenflow::vector(b.data(), gb.data(), 8));
    file.initialize();
    file.step();
    file.save(path);
  }
  auto refused = [&](auto&& add, const std::string& message) {
    optimizer<> here{config{}};
    add(here);
    here.initialize();
    CHECK_THROWS_WITH_AS(here.load(path), doctest::Contains(message.c_str()), checkpoint_error);
  };
  // one vector fewer here: the file's section count is a sharded set's for this optimizer, and
  // its layout is what tells them apart
  refused([&](auto& o) { o.add_matrix(matrix(w.data(), g.data(), rows{8}, cols{21})); },
          "registers 1 matrix and 1 vector, this optimizer 1 matrix and 0 vectors");
  // one vector more here
  refused(
      [&](auto& o) {
        o.add_matrix(matrix(w.data(), g.data(), rows{8}, cols{21}));
        o.add_vector(zenflow::vector(b.data(), gb.data(), 8));
        o.add_vector(zenflow::vector(b2.data(), gb2.data(), 8));
      },
      "has 5 sections, this optimizer needs 6");
  refused(
      [&](auto& o) {
        o.add_matrix(matrix(wh.data(), gh.data(), rows{8}, cols{21}).row_major().dtypes(dtype::bf16, dtype::bf16));
        o.add_vector(zenflow::vector(b.data(), gb.data(), 8));
      },
      "matrix 0 is 8x21 (param f32, grad f32, column_contiguous) in the file, 8x21 (param bf16, grad bf16, "
      "row_major) here");
  refused(
      [&](auto& o) {
        o.add_matrix(matrix(w.data(), g.data(), rows{8}, cols{21}));
        o.add_vector(zenflow::vector(b.data(), gh.data(), 8).dtypes(dtype::f32, dtype::bf16));
      },
      "vector 0 has 8 elements (param f32, grad f32) in the file, 8 (param f32, grad bf16) here");
  // the same registrations in another kind of optimizer: its config differs in a key nobody set
  zero_offload<> other{config{}};
  other.add_matrix(matrix(w.data(), g.data(), rows{8}, cols{21}));
  other.add_vector(zenflow::vector(b.data(), gb.data(), 8));
  other.initialize();
  CHECK_THROWS_WITH_AS(other.load(path),
                       doctest::Contains("config differs: topk_ratio is 0.1 in the file, 0 here (zero_offload fixes it "
                                         "at 0 and device_adam at 1: another kind of optimizer?)"),
                       checkpoint_error);
  std::remove(path.c_str());
}

// A path with a NUL character in it would name another file (the name ends there where the file
// is opened): save and load refuse it, and nothing is written at the shortened name.
TEST_CASE("checkpoint: a path holding a NUL is refused by save and load") {
  const std::string shortened = temp_path("nul-path"), path = shortened + std::string("\0.zfckpt", 8);
  std::remove(shortened.c_str());
  std::vector<float> w(12, 0.5f), g(12, 0.01f);
  optimizer<> opt{config{}};
  opt.add_matrix({w.data(), g.data(), 3, 4});
  opt.initialize();
  opt.step();
  CHECK_THROWS_WITH_AS(opt.save(path), doctest::Contains("holds a NUL character"), std::invalid_argument);
  CHECK_FALSE(std::filesystem::exists(shortened));
  CHECK(opt.usable());
  opt.save(shortened);  // (a file at the shortened name, which the load must not read)
  optimizer<> back{config{}};
  back.add_matrix({w.data(), g.data(), 3, 4});
  back.initialize();
  CHECK_THROWS_WITH_AS(back.load(path), doctest::Contains("holds a NUL character"), checkpoint_error);
  CHECK(back.applied_steps() == 0);
  std::remove(shortened.c_str());
}

// Checksums right, counters past what a run reaches or describing a schedule it never follows:
// refused, the optimizer unchanged. The file: one step of a 6x9 matrix and a vector, no warm-up
// (applied 1, one selection at step 1, a window of 1 open), or with a warm-up of 3 (applied 1,
// nothing of the schedule yet).
TEST_CASE("checkpoint: counters past a run's reach or off its schedule are refused") {
  const std::string path = temp_path("crafted-schedule.zfckpt");
  // counters payload: u64 applied 0, steps 8, skipped 16, selections 24, host updates 32, last
  // selection 40, window 48, ...; u8 selected_once at 88, pending 89, accumulator 90
  auto saved = [&](const config& cfg, bool with_vector) {
    std::vector<float> w(6 * 9, 0.5f), g(6 * 9, 0.01f), b(3, 0.5f), gb(3, 0.01f);
    optimizer<> a(cfg);
    a.add_matrix({w.data(), g.data(), 6, 9});
    if (with_vector) a.add_vector({b.data(), gb.data(), 3});
    a.initialize();
    a.step();
    a.save(path);
    return file_bytes(path);
  };
  struct edit {
    std::size_t offset;
    std::uint64_t value;
    unsigned bytes;
  };
  // `img` with the counters edited, refused by a fresh optimizer with `message`, which then holds
  // its initial params still
  auto refused = [&](const config& cfg, bool with_vector, const std::vector<unsigned char>& img,
                     std::initializer_list<edit> edits, const char* message) {
    std::vector<unsigned char> v = img;
    const section_place counters = section_of(v, 2);
    for (const edit& e : edits) std::memcpy(v.data() + counters.payload + e.offset, &e.value, e.bytes);
    reseal(v, counters);
    std::vector<float> w(6 * 9, 0.0f), g(6 * 9), b(3, 0.0f), gb(3);
    optimizer<> o(cfg);
    o.add_matrix({w.data(), g.data(), 6, 9});
    if (with_vector) o.add_vector({b.data(), gb.data(), 3});
    o.initialize();
    CHECK_THROWS_WITH_AS(o.load_image(v.data(), v.size()), doctest::Contains(message), checkpoint_error);
    CHECK(o.applied_steps() == 0);
    CHECK(std::all_of(w.begin(), w.end(), [](float x) { return x == 0.0f; }));
  };
  config cfg;
  cfg.topk_ratio = 0.25;
  cfg.update_interval = interval::every(4);
  cfg.select_interval = interval::every(4);
  const auto img = saved(cfg, false);
  // the file as saved loads (so what each case below edits is what is refused)
  {
    std::vector<float> w(6 * 9), g(6 * 9);
    optimizer<> o(cfg);
    o.add_matrix({w.data(), g.data(), 6, 9});
    o.initialize();
    CHECK_NOTHROW(o.load_image(img.data(), img.size()));
  }
  constexpr std::uint64_t u32_max = std::numeric_limits<std::uint32_t>::max();
  // 2^32 applied steps: a column's Adam count would have wrapped
  refused(cfg, false, img, {{0, u32_max + 1, 8}, {8, u32_max + 1, 8}},
          "has 4294967296 applied steps; a run applies at most 4294967295");
  // a step count past 2^63 (applied 1, the rest skipped): no run reaches it, and it would wrap
  refused(cfg, false, img, {{8, (std::uint64_t(1) << 63) + 1, 8}, {16, std::uint64_t(1) << 63, 8}},
          "has a step count no run reaches");
  // no selection made, though step 1 (after no warm-up) makes one
  refused(cfg, false, img, {{88, 0, 1}}, "has no selection made after the warm-up");
  refused(cfg, false, img, {{24, 0, 8}}, "has selections inconsistent with its applied steps");
  refused(cfg, false, img, {{24, 2, 8}}, "has selections inconsistent with its applied steps");  // 2 selections in 1 step
  refused(cfg, false, img, {{40, 0, 8}}, "has selections inconsistent with its applied steps");
  // a selection made where no matrix selects columns (topk_ratio 0: the file's own config)
  {
    config none = cfg;
    none.topk_ratio = 0;
    const auto img0 = saved(none, false);
    refused(none, false, img0, {{88, 1, 1}, {24, 1, 8}, {40, 1, 8}}, "has a selection made, though no matrix selects columns");
  }
  // a warm-up of 3 steps, saved after the first: a window, a selection or a pending host update
  // during it is none that the schedule has
  {
    config warm = cfg;
    warm.full_warm_up_rounds = 3;
    const auto imgw = saved(warm, false);
    const char* during = "has a selection, an open window or a host update pending during the warm-up";
    refused(warm, false, imgw, {{48, 1, 8}}, during);
    refused(warm, false, imgw, {{88, 1, 1}}, during);
    refused(warm, false, imgw, {{89, 1, 1}}, during);
    refused(warm, false, imgw, {{24, 1, 8}}, during);
    // past the warm-up (applied 4, a selection at step 4), with a window of 2 open: it began
    // during the warm-up
    refused(warm, false, imgw, {{0, 4, 8}, {8, 4, 8}, {88, 1, 1}, {24, 1, 8}, {40, 4, 8}, {48, 2, 8}},
            "has an open window longer than the steps since the warm-up");
    // past the warm-up (applied 4, a selection at step 4) with a matrix that has no selected
    // columns: the counters are consistent, the matrix section is not
    refused(warm, false, imgw, {{0, 4, 8}, {8, 4, 8}, {88, 1, 1}, {24, 1, 8}, {40, 4, 8}, {48, 1, 8}},
            "matrix 0 has 0 selected columns, though a selection was made");
  }
  // off a fixed update_interval's schedule (4): 5 applied steps leave a window of 1, not 2 (nor
  // 0); a selection is made only where a window begins (steps 1, 5, 9, ...)
  refused(cfg, false, img, {{0, 5, 8}, {8, 5, 8}, {48, 2, 8}},
          "has an open window of 2 steps; 5 applied steps after the warm-up with update_interval 4 leave 1");
  refused(cfg, false, img, {{0, 4, 8}, {8, 4, 8}, {48, 1, 8}},
          "has an open window of 1 steps; 4 applied steps after the warm-up with update_interval 4 leave 0");
  refused(cfg, false, img, {{0, 6, 8}, {8, 6, 8}, {48, 2, 8}, {40, 3, 8}},
          "has its last selection at applied step 3, where no window begins (update_interval 4)");
  // a vector's Adam count is the applied steps (it is updated at every one): 2 steps applied,
  // its count 1
  {
    const auto imgv = saved(cfg, true);
    refused(cfg, true, imgv, {{0, 2, 8}, {8, 2, 8}, {48, 2, 8}}, "vector 0: its Adam count (1) is not the applied steps (2)");
  }
  std::remove(path.c_str());
}

// The last step a run can take: applied = 2^32 - 1 loads (a column's count may reach it), and the
// next step() is refused — a count wrapping to 0 would divide the bias correction by zero —
// changing nothing.
TEST_CASE("checkpoint: at 2^32 - 1 applied steps step() refuses, changing nothing") {
  const std::string path = temp_path("last-step.zfckpt");
  config cfg;
  cfg.topk_ratio = 0.25;
  cfg.update_interval = interval::every(4);
  std::vector<float> w(6 * 9, 0.5f), g(6 * 9, 0.01f);
  optimizer<> a(cfg);
  a.add_matrix({w.data(), g.data(), 6, 9});
  a.initialize();
  a.step();
  a.save(path);
  std::vector<unsigned char> img = file_bytes(path);
  const section_place counters = section_of(img, 2);
  const std::uint64_t last = std::numeric_limits<std::uint32_t>::max();
  std::memcpy(img.data() + counters.payload, &last, 8);      // applied
  std::memcpy(img.data() + counters.payload + 8, &last, 8);  // steps
  const std::uint64_t window = last % 4;                      // (2^32 - 1 steps of update_interval 4)
  std::memcpy(img.data() + counters.payload + 48, &window, 8);
  reseal(img, counters);
  std::vector<float> w2(6 * 9), g2(6 * 9, 0.01f);
  optimizer<> b(cfg);
  b.add_matrix({w2.data(), g2.data(), 6, 9});
  b.initialize();
  REQUIRE_NOTHROW(b.load_image(img.data(), img.size()));
  CHECK(b.applied_steps() == last);
  const std::vector<float> before = w2;
  const auto counts = b.column_counts(matrix_id{0});
  CHECK_THROWS_WITH_AS(b.step(), doctest::Contains("4294967295 steps applied, the most a run takes"), std::overflow_error);
  CHECK(b.applied_steps() == last);
  CHECK(b.stats().steps == last);
  CHECK(w2 == before);
  CHECK(b.column_counts(matrix_id{0}) == counts);
  CHECK(b.usable());  // (refused before anything changed: the state can still be saved)
  CHECK_NOTHROW(b.save(path));
  std::remove(path.c_str());
}

// The gradient accumulators' rule (README, "Checkpoints"): zero in the accumulator not filling,
// in every one while no window is open, and in the selected columns; elsewhere at most 1.5 x
// window x the applied bound (2^63, or 2^63 / U with host_gradient = sum). A crafted value past
// the bound is refused (one host update would make its column's v infinite), one at it loads.
TEST_CASE("checkpoint: the gradient accumulators' rule, at its bound and off it") {
  const std::string path = temp_path("crafted-acc.zfckpt");
  for (const bool sum : {false, true}) {
    CAPTURE(sum);
    config cfg;  // overlap on: two accumulators
    cfg.topk_ratio = 0.25;
    cfg.update_interval = interval::every(4);
    cfg.select_interval = interval::every(4);
    if (sum) cfg.host_gradient = window_gradient::sum;
    std::vector<float> w(6 * 9, 0.5f), g(6 * 9);
    for (std::size_t e = 0; e < g.size(); ++e) g[e] = 0.01f * float(1 + e % 5);
    optimizer<> a(cfg);
    a.add_matrix({w.data(), g.data(), 6, 9});
    a.initialize();
    a.step();  // a window of 1 open: the filling accumulator holds step 1's unselected columns
    a.save(path);
    const std::vector<unsigned char> img = file_bytes(path);
    const section_place counters = section_of(img, 2), mat = section_of(img, 3);
    const unsigned active = img[counters.payload + 90];
    const std::vector<std::uint32_t> sel = a.selected_columns(matrix_id{0});
    REQUIRE(sel.size() == 2);
    std::uint32_t uns = 0;  // the first unselected column
    while (std::find(sel.begin(), sel.end(), uns) != sel.end()) ++uns;
    const std::size_t rows = 6, n = 6 * 9;
    // matrix payload: active, 2 columns, their master/m/v, 2 counts, then the host arrays
    const std::size_t host = 8 + 4 * 2 + 12 * 2 * rows + 4 * 2;
    auto acc_at = [&](unsigned which, std::uint32_t col, std::size_t row) {
      return host + 12 * n + 4 * (which * n + col * rows + row);
    };
    auto loads = [&](const std::vector<unsigned char>& v) {
      std::vector<float> w2(6 * 9), g2(6 * 9);
      optimizer<> b(cfg);
      b.add_matrix({w2.data(), g2.data(), 6, 9});
      b.initialize();
      b.load_image(v.data(), v.size());
    };
    REQUIRE_NOTHROW(loads(img));
    float at_acc;
    std::memcpy(&at_acc, img.data() + mat.payload + acc_at(active, uns, 0), 4);
    CHECK(at_acc == g[std::size_t(uns) * rows]);  // (the offsets are right: step 1's gradient, factor 1)
    const float bound = float(1.5 * 0x1p63 / (sum ? 4.0 : 1.0));  // a window of 1
    const float past = std::nextafter(bound, std::numeric_limits<float>::infinity());
    const float one = 1.0f, zero = 0.0f;
    CHECK_NOTHROW(loads(crafted(img, mat, acc_at(active, uns, 3), &bound, 4)));
    CHECK_NOTHROW(loads(crafted(img, mat, acc_at(active, uns, 3), &one, 4)));
    CHECK_NOTHROW(loads(crafted(img, mat, acc_at(active, uns, 3), &zero, 4)));
    const char* broken = "matrix 0: a gradient accumulator holds what no run leaves there";
    CHECK_THROWS_WITH_AS(loads(crafted(img, mat, acc_at(active, uns, 3), &past, 4)), doctest::Contains(broken),
                         checkpoint_error);
    const float minus = -past;
    CHECK_THROWS_WITH_AS(loads(crafted(img, mat, acc_at(active, uns, 5), &minus, 4)), doctest::Contains(broken),
                         checkpoint_error);
    // the accumulator not filling, and a selected column of the filling one: zero
    CHECK_THROWS_WITH_AS(loads(crafted(img, mat, acc_at(1 - active, uns, 0), &one, 4)), doctest::Contains(broken),
                         checkpoint_error);
    CHECK_THROWS_WITH_AS(loads(crafted(img, mat, acc_at(active, sel[1], rows - 1), &one, 4)), doctest::Contains(broken),
                         checkpoint_error);
    // no window open (the counters at 4 applied steps, where the window of update_interval 4
    // closed): step 1's sums in the filling one are what no run leaves there
    {
      const std::uint64_t four = 4, no_window = 0;
      std::vector<unsigned char> v = crafted(img, counters, 48, &no_window, 8);
      std::memcpy(v.data() + counters.payload, &four, 8);      // applied
      std::memcpy(v.data() + counters.payload + 8, &four, 8);  // steps
      reseal(v, counters);
      CHECK_THROWS_WITH_AS(loads(v), doctest::Contains(broken), checkpoint_error);
    }
  }
  std::remove(path.c_str());
}

// A NaN param of any dtype is refused by load and by save (it would make every later gradient
// NaN: every step skipped, for good); an infinity in a 16-bit param is what rounding a finite
// master can give, and loads.
TEST_CASE("checkpoint: a NaN param is refused by load and by save, a 16-bit infinity is not") {
  const std::string path = temp_path("nan-param.zfckpt");
  for (const dtype d : {dtype::bf16, dtype::f16}) {
    CAPTURE(name_of(d));
    config cfg;
    cfg.topk_ratio = 0.25;
    std::vector<std::uint16_t> w(6 * 9), g(6 * 9), b(3), gb(3);
    const std::uint16_t half = d == dtype::bf16 ? 0x3f00 : 0x3800, small = d == dtype::bf16 ? 0x3c24 : 0x211f;
    std::fill(w.begin(), w.end(), half);
    std::fill(b.begin(), b.end(), half);
    std::fill(g.begin(), g.end(), small);
    std::fill(gb.begin(), gb.end(), small);
    optimizer<> a(cfg);
    a.add_matrix({w.data(), g.data(), 6, 9, d, d});
    a.add_vector({b.data(), gb.data(), 3, d, d});
    a.initialize();
    a.step();
    a.save(path);
    const std::vector<unsigned char> img = file_bytes(path);
    const section_place mat = section_of(img, 3), vec = section_of(img, 4);
    auto loads = [&](const std::vector<unsigned char>& v) {
      std::vector<std::uint16_t> w2(6 * 9), g2(6 * 9), b2(3), gb2(3);
      optimizer<> o(cfg);
      o.add_matrix({w2.data(), g2.data(), 6, 9, d, d});
      o.add_vector({b2.data(), gb2.data(), 3, d, d});
      o.initialize();
      o.load_image(v.data(), v.size());
    };
    const std::uint16_t nan = d == dtype::bf16 ? 0x7fc0 : 0x7e00, inf = d == dtype::bf16 ? 0x7f80 : 0x7c00;
    const std::uint16_t neg_nan = std::uint16_t(nan | 0x8001), neg_inf = std::uint16_t(inf | 0x8000);
    // the params close each section: the matrix's 54, the vector's 3
    const std::size_t mp = std::size_t(mat.len) - 2 * 54, vp = std::size_t(vec.len) - 2 * 3;
    CHECK_THROWS_WITH_AS(loads(crafted(img, mat, mp + 2 * 17, &nan, 2)), doctest::Contains("matrix 0: a param is NaN"),
                         checkpoint_error);
    CHECK_THROWS_WITH_AS(loads(crafted(img, mat, mp + 2 * 53, &neg_nan, 2)), doctest::Contains("matrix 0: a param is NaN"),
                         checkpoint_error);
    CHECK_THROWS_WITH_AS(loads(crafted(img, vec, vp, &nan, 2)), doctest::Contains("vector 0: a param is NaN"),
                         checkpoint_error);
    CHECK_NOTHROW(loads(crafted(img, mat, mp, &inf, 2)));
    CHECK_NOTHROW(loads(crafted(img, vec, vp + 4, &neg_inf, 2)));
    // save: the trainer wrote a NaN into a param since; the previous file stands
    w[20] = nan;
    CHECK_THROWS_WITH_AS(a.save(path), doctest::Contains("refused: matrix 0 holds a param that is NaN"), std::runtime_error);
    CHECK(file_bytes(path) == img);
    w[20] = half;
    b[2] = nan;
    CHECK_THROWS_WITH_AS(a.save(path), doctest::Contains("refused: vector 0 holds a param that is NaN"), std::runtime_error);
    CHECK(file_bytes(path) == img);
    b[2] = half;
    CHECK_NOTHROW(a.save(path));
  }
  std::remove(path.c_str());
}
