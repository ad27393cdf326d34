// What the checkpoint fuzz targets share: the optimizer they load into, and the checksum
// repair — every section's CRC-32 of a checkpoint file (a plain
// checkpoint, a sharded set's manifest or shard: one layout — a 24-byte file header, then
// sections of tag and index (4 bytes each), length (8), payload, CRC-32 (4)) recomputed in place,
// so that mutations also reach the checks behind the CRCs; and, for sets, the manifest's record
// of its shards (sizes and digests) rewritten to match the shards as given, so that mutated shards
// also get past the check that they are the set's own. Each stops quietly at the first malformed
// length.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include <zenflow/checkpoint.hpp>

#include "../checkpoint_models.hpp"

namespace zf_fuzz {

// The optimizer every input is loaded into (checkpoint_models.hpp's small model, initialised
// once; a refused input leaves it as it was, an accepted one as the input says).
inline zenflow::optimizer<>& target() {
  static zf_ckpt_models::small m;
  static zenflow::optimizer<>* opt = [] {
    auto* o = new zenflow::optimizer<>(zf_ckpt_models::small::config());
    m.register_with(*o);
    o->initialize();
    return o;
  }();
  return *opt;
}

// Calls f(offset of the section header, tag, payload length) for each well-formed section.
template <class F>
void for_each_section(const std::vector<unsigned char>& b, F f) {
  std::size_t at = 24;
  while (b.size() >= at + 16) {
    std::uint32_t tag;
    std::uint64_t len;
    std::memcpy(&tag, b.data() + at, 4);
    std::memcpy(&len, b.data() + at + 8, 8);
    if (len > b.size() - at - 16 || b.size() - at - 16 - len < 4) return;
    f(at, tag, std::size_t(len));
    at += 16 + std::size_t(len) + 4;
  }
}

inline void fix_checksums(std::vector<unsigned char>& b) {
  for_each_section(b, [&](std::size_t at, std::uint32_t, std::size_t len) {
    const std::uint32_t crc = zenflow::ckpt::crc32(b.data() + at + 16, len);
    std::memcpy(b.data() + at + 16 + len, &crc, 4);
  });
}

// The file's digest as a load computes it: FNV-1a over its sections' CRC-32s, in order.
inline std::uint64_t digest_of(const std::vector<unsigned char>& b) {
  std::uint64_t h = zenflow::ckpt::fnv1a64_init;
  for_each_section(b, [&](std::size_t at, std::uint32_t, std::size_t len) {
    std::uint32_t crc;
    std::memcpy(&crc, b.data() + at + 16 + len, 4);
    h = zenflow::ckpt::digest_step(h, crc);
  });
  return h;
}

// In the manifest's shards section (generation u64, ranks u32, base length u32, base, then a
// size and a digest per shard), shard s's size and digest set to those of shards[s], for the
// shards given; then the manifest's checksums repaired.
inline void match_shards(std::vector<unsigned char>& manifest, const std::vector<std::vector<unsigned char>>& shards) {
  for_each_section(manifest, [&](std::size_t at, std::uint32_t tag, std::size_t len) {
    if (tag != zenflow::ckpt::shards_tag || len < 16) return;
    unsigned char* p = manifest.data() + at + 16;
    std::uint32_t ranks, base;
    std::memcpy(&ranks, p + 8, 4);
    std::memcpy(&base, p + 12, 4);
    const std::size_t sizes = 16 + std::size_t(base);
    if (sizes > len || (len - sizes) / 16 < ranks) return;
    for (std::size_t s = 0; s < shards.size() && s < ranks; ++s) {
      const std::uint64_t size = shards[s].size(), digest = digest_of(shards[s]);
      std::memcpy(p + sizes + 8 * s, &size, 8);
      std::memcpy(p + sizes + 8 * std::size_t(ranks) + 8 * s, &digest, 8);
    }
  });
  fix_checksums(manifest);
}

}  // namespace zf_fuzz
