// Writes the fuzzers' seed corpora: for fuzz_checkpoint, checkpoints of tests/checkpoint_models.hpp
// (small) after 0..9 steps (before and after selections, mid-window, with an update in flight), each
// prefixed by the fuzzer's mode byte (even and odd); for fuzz_sharded_checkpoint (into SHARDED_DIR),
// sets of the same model saved by 2 and 3 ranks (threads, tests/host_hub.hpp) after 0, 3, 6 and 9
// steps, packed as that target reads them (fuzz_sharded_checkpoint.cpp).
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "../checkpoint_models.hpp"
#include "../host_hub.hpp"

namespace {

std::vector<char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("write_seeds: cannot read " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

template <class T>
void put(std::ofstream& out, T x) {
  out.write(reinterpret_cast<const char*>(&x), sizeof x);
}

using dp_optimizer = zenflow::optimizer<zenflow::host_space, zenflow::column_topk, zenflow::fused_adamw<zenflow::host_space>,
                                        zenflow::simd_accumulator, zenflow::host_copy, zenflow::bounded_async,
                                        zf_test::hub_communicator>;

// Sets saved by `ranks` ranks after each of `at` steps (under dir/.sharded/set), packed into
// dir/sharded-<ranks>-<steps>-<mode>.
void write_sharded_seeds(const std::string& dir, int ranks, const std::vector<int>& at) {
  namespace fs = std::filesystem;
  const std::string work = dir + "/.sharded";
  fs::remove_all(work);
  fs::create_directories(work);
  zf_test::thread_hub hub(ranks);
  std::vector<std::string> saved;  // (written by rank 0 after each save, read after the threads end)
  std::vector<std::uint64_t> generations;
  zf_test::on_ranks(hub, [&](int r) {
    zf_ckpt_models::small m;
    dp_optimizer opt(zf_ckpt_models::small::config(), zf_test::hub_communicator(hub, r));
    m.register_with(opt);
    opt.initialize();
    for (int s = 0, k = 0; k < int(at.size()); ++s) {
      if (s == at[std::size_t(k)]) {
        opt.save(work + "/set");
        if (r == 0) {
          // the set just saved: the manifest, and the shard files of its (highest) generation
          std::uint64_t g = 0;
          for (const auto& e : fs::directory_iterator(work)) {
            const std::string name = e.path().filename().string();
            if (name.rfind("set.g", 0) == 0) g = std::max<std::uint64_t>(g, std::stoull(name.substr(5)));
          }
          const std::string packed = dir + "/sharded-" + std::to_string(ranks) + "-" + std::to_string(s);
          for (char mode : {char(0), char(1)}) {
            std::ofstream out(packed + "-" + std::to_string(int(mode)), std::ios::binary);
            out.put(mode);
            put<std::uint64_t>(out, g);
            put<std::uint32_t>(out, std::uint32_t(ranks));
            std::vector<std::vector<char>> files{file_bytes(work + "/set")};
            for (int q = 0; q < ranks; ++q)
              files.push_back(file_bytes(work + "/set.g" + std::to_string(g) + ".rank" + std::to_string(q) + "-of-" +
                                         std::to_string(ranks)));
            for (const auto& f : files) {
              put<std::uint32_t>(out, std::uint32_t(f.size()));
              out.write(f.data(), std::streamsize(f.size()));
            }
          }
        }
        hub.barrier();  // (rank 0 has read the set before the next save replaces it)
        ++k;
      }
      m.gradients(s);
      opt.step();
    }
  });
  fs::remove_all(work);
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: write_seeds DIR [SHARDED_DIR]\n");
    return 2;
  }
  const std::string dir = argv[1], tmp = dir + "/.ckpt";
  zf_ckpt_models::small m;
  zenflow::optimizer<> opt(zf_ckpt_models::small::config());
  m.register_with(opt);
  opt.initialize();
  for (int s = 0; s < 10; ++s) {
    opt.save(tmp);
    std::ifstream in(tmp, std::ios::binary);
    const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (char mode : {char(0), char(1)}) {
      std::ofstream out(dir + "/seed-" + std::to_string(s) + "-" + std::to_string(int(mode)), std::ios::binary);
      out.put(mode);
      out.write(bytes.data(), std::streamsize(bytes.size()));
    }
    m.gradients(s);
    opt.step();
  }
  std::remove(tmp.c_str());
  if (argc == 3) {
    std::filesystem::create_directories(argv[2]);
    for (int ranks : {2, 3}) write_sharded_seeds(argv[2], ranks, {0, 3, 6, 9});
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "write_seeds: %s\n", e.what());
  return 1;
}
