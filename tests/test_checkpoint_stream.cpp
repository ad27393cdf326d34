// Checkpoints stream both ways through bounded buffers: saving or loading a 100 MB state raises
// the process's peak memory by a few MB, not by the file's size; a file that is not a checkpoint
// of this optimizer — a large foreign file, a good one with a gigabyte appended, a device — is
// refused from its header and size before any payload is read. Peak memory is the kernel's
// high-water mark (VmHWM), reset before each measured call (Linux: /proc/self/clear_refs).
#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <zenflow/zenflow.hpp>

using namespace zenflow;

namespace {

std::string temp_path(const std::string& name) { return std::string(ZF_TEST_TMP_DIR) + "/" + name; }

long status_kb(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind(key, 0) == 0) return std::stol(line.substr(line.find(':') + 1));
  return -1;
}
// Resets the peak to the current resident size; false where the kernel does not allow it.
bool reset_peak() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.close();
  return bool(f) && status_kb("VmHWM") - status_kb("VmRSS") < 1024;
}
// How far the peak rose above the resident size at the reset, in MB, while f ran.
template <class F>
double peak_rise_mb(F&& f) {
  REQUIRE_MESSAGE(reset_peak(), "this test needs /proc/self/clear_refs to reset the peak RSS");
  const long base = status_kb("VmRSS");
  f();
  return double(status_kb("VmHWM") - base) / 1024.0;
}

// One 2048 x 2048 fp32 matrix with overlap: a checkpoint of about 100 MB (master, moments, two
// accumulators, staged and current params, 4 bytes each per element).
constexpr std::size_t R = 2048, C = 2048;

// `steps` steps trained (a model of another step count holds another state, so that a load
// that changed nothing, or changed part, shows).
struct model {
  std::vector<float> w, dw;
  optimizer<> opt;
  explicit model(config cfg, int steps = 3) : w(R * C), dw(R * C), opt(cfg) {
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = float(i % 97) * 1e-3f;
    opt.add_matrix(zenflow::matrix(w.data(), dw.data(), zenflow::rows{R}, zenflow::cols{C}));
    opt.initialize();
    for (int s = 0; s < steps; ++s) {
      for (std::size_t i = 0; i < dw.size(); ++i) dw[i] = float((i * 7 + std::size_t(s)) % 13) * 1e-4f - 6e-4f;
      opt.step();
    }
    opt.synchronize();
  }
};

std::string load_error(optimizer<>& opt, const std::string& path) {
  try {
    opt.load(path);
  } catch (const checkpoint_error& e) {
    return e.what();
  }
  return "(loaded)";
}

}  // namespace

TEST_CASE("save and load stream: peak memory rises by a few MB for a 100 MB checkpoint") {
  config cfg;
  cfg.overlap_step = true;
  model m(cfg);
  const std::string path = temp_path("stream.zfckpt");
  // A whole-file buffer would add the file's size (over 100 MB) to the peak; the bounded
  // buffers are 1 MiB, and the stdio buffers and small sections add little. 16 MB leaves room for
  // allocator and sanitizer overheads while staying far below the file's size.
  const double save_mb = peak_rise_mb([&] { m.opt.save(path); });
  std::FILE* f = std::fopen(path.c_str(), "rb");
  REQUIRE(f);
  std::fseek(f, 0, SEEK_END);
  const long bytes = std::ftell(f);
  std::fclose(f);
  CHECK(bytes > 100l * 1000 * 1000);
  MESSAGE("save: peak +" << save_mb << " MB for a " << bytes / 1000000 << " MB file");
  CHECK(save_mb < 16);

  // a second optimizer on the same buffers' shape, one step further (another state), loads it:
  // bit-identical state, bounded memory
  model other(cfg, 4);
  std::vector<float> a(R * C), b(R * C), ma(R * C), mb(R * C);
  m.opt.copy_exp_avg_sq(matrix_id{0}, a.data());
  other.opt.copy_exp_avg_sq(matrix_id{0}, b.data());
  REQUIRE(a != b);
  REQUIRE(other.w != m.w);
  const double load_mb = peak_rise_mb([&] { other.opt.load(path); });
  MESSAGE("load: peak +" << load_mb << " MB");
  CHECK(load_mb < 16);
  other.opt.copy_exp_avg_sq(matrix_id{0}, b.data());
  CHECK(a == b);
  m.opt.copy_master(matrix_id{0}, ma.data());
  other.opt.copy_master(matrix_id{0}, mb.data());
  CHECK(ma == mb);
  CHECK(other.w == m.w);
  std::remove(path.c_str());
}

TEST_CASE("foreign and oversized files are refused from the header and the size, reading nothing more") {
  config cfg;
  model m(cfg);
  const std::string good = temp_path("stream-good.zfckpt"), big = temp_path("stream-big.zfckpt");
  m.opt.save(good);
  // the refused files go to an optimizer one step further: a load that committed any of the
  // good file's state would change its master
  model other(cfg, 4);
  std::vector<float> before(R * C), after(R * C), saved(R * C);
  other.opt.copy_master(matrix_id{0}, before.data());
  m.opt.copy_master(matrix_id{0}, saved.data());
  REQUIRE(before != saved);

  // 4 GiB of zeros (a sparse file: nothing is written to disk): bad magic, and the peak does
  // not move (reading it whole would need the 4 GiB)
  {
    std::FILE* f = std::fopen(big.c_str(), "wb");
    REQUIRE(f);
    std::fclose(f);
    REQUIRE(::truncate(big.c_str(), 4l << 30) == 0);
  }
  std::string msg;
  double mb = peak_rise_mb([&] { msg = load_error(other.opt, big); });
  CHECK(msg.find("bad magic") != std::string::npos);
  CHECK(mb < 16);

  // the good checkpoint with 4 GiB appended: refused by its size once the small sections are read
  {
    std::ifstream in(good, std::ios::binary);
    std::ofstream out(big, std::ios::binary | std::ios::trunc);
    out << in.rdbuf();
  }
  std::FILE* f = std::fopen(big.c_str(), "rb");
  REQUIRE(f);
  std::fseek(f, 0, SEEK_END);
  const long good_size = std::ftell(f);
  std::fclose(f);
  REQUIRE(::truncate(big.c_str(), good_size + (4l << 30)) == 0);
  mb = peak_rise_mb([&] { msg = load_error(other.opt, big); });
  CHECK(msg.find("trailing bytes after the last section") != std::string::npos);
  CHECK(msg.find("bytes; a checkpoint of this optimizer has") != std::string::npos);
  CHECK(mb < 16);

  // a device is not a file (it would never end)
  CHECK(load_error(other.opt, "/dev/zero").find("not a regular file") != std::string::npos);

  other.opt.copy_master(matrix_id{0}, after.data());
  CHECK(before == after);  // nothing changed
  CHECK(other.opt.usable());
  std::remove(big.c_str());
  std::remove(good.c_str());
}
