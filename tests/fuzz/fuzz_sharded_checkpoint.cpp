// libFuzzer target: the loader of sharded checkpoint sets (a manifest, and a shard per rank of
// the data-parallel job that saved it), as a one-process optimizer resumes them: every input must
// load or be refused with zenflow::checkpoint_error — never crash, hang or corrupt memory — and
// an accepted set must leave an optimizer that can keep training.
//
// Input: a mode byte (odd: each file's section checksums recomputed first, as in fuzz_checkpoint,
// and the manifest's sizes and digests of the shards made those of the shards given, so that
// mutated shards get past the check that they are the set's own and reach the commit),
// the set's generation (u64) and rank count R (u32, 1 to 8), then files, each a u32 length and
// its bytes: the manifest, then the shards of ranks 0, 1, ... (fewer than R leave the others
// missing). They are written to a directory of this process's own as `set` and
// `set.g<generation>.rank<r>-of-<R>`, then `set` is loaded. Seeds: sets of 2 and 3 ranks
// (fuzz_write_seeds DIR SHARDED_DIR).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "fuzz_support.hpp"

namespace {

const std::filesystem::path& work_dir() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() / ("zenflow-fuzz-sharded-" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    // removed at exit (libFuzzer ends a timed run with exit()); by a name in static storage that
    // nothing destroys, since `dir` itself is destroyed before this handler runs
    static char name[4096];
    std::snprintf(name, sizeof name, "%s", d.c_str());
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(std::filesystem::path(name), ec);
    });
    return d;
  }();
  return dir;
}

template <class T>
bool take(const std::uint8_t*& p, const std::uint8_t* end, T& x) {
  if (std::size_t(end - p) < sizeof x) return false;
  std::memcpy(&x, p, sizeof x);
  p += sizeof x;
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::uint8_t *p = data, *end = data + size;
  std::uint8_t mode = 0;
  std::uint64_t generation = 0;
  std::uint32_t ranks = 0;
  if (!take(p, end, mode) || !take(p, end, generation) || !take(p, end, ranks) || ranks < 1 || ranks > 8) return 0;
  std::vector<std::vector<unsigned char>> files;
  std::uint32_t len = 0;
  while (files.size() < 1 + std::size_t(ranks) && take(p, end, len)) {
    const std::size_t n = std::min<std::size_t>(len, std::size_t(end - p));
    files.emplace_back(p, p + n);
    p += n;
  }
  if (files.empty()) return 0;
  if (mode & 1) {
    for (std::size_t f = 1; f < files.size(); ++f) zf_fuzz::fix_checksums(files[f]);
    zf_fuzz::match_shards(files[0], std::vector<std::vector<unsigned char>>(files.begin() + 1, files.end()));
  }
  // the previous input's files go; this one's are written
  const auto& dir = work_dir();
  for (const auto& e : std::filesystem::directory_iterator(dir)) std::filesystem::remove(e.path());
  const std::string set = (dir / "set").string();
  for (std::size_t f = 0; f < files.size(); ++f) {
    const std::string name = f == 0 ? set
                                    : set + ".g" + std::to_string(generation) + ".rank" + std::to_string(f - 1) +
                                          "-of-" + std::to_string(ranks);
    std::ofstream out(name, std::ios::binary);
    out.write(reinterpret_cast<const char*>(files[f].data()), std::streamsize(files[f].size()));
  }
  zenflow::optimizer<>& opt = zf_fuzz::target();
  try {
    opt.load(set);
  } catch (const zenflow::checkpoint_error&) {
    return 0;
  }
  opt.step();  // an accepted set must be trainable
  return 0;
}
