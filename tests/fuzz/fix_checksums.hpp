// The fuzz targets' checksum repair: every section's CRC-32 of a checkpoint file (a plain
// checkpoint, a sharded set's manifest or shard: one layout) recomputed in place, so that
// mutations also reach the checks behind the CRCs. Stops quietly at the first malformed length.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include <zenflow/checkpoint.hpp>

namespace zf_fuzz {

inline void fix_checksums(std::vector<unsigned char>& b) {
  std::size_t at = 24;  // (the file header)
  while (b.size() >= at + 16) {
    std::uint64_t len;
    std::memcpy(&len, b.data() + at + 8, 8);
    at += 16;
    if (len > b.size() - at || b.size() - at - len < 4) return;
    const std::uint32_t crc = zenflow::ckpt::crc32(b.data() + at, std::size_t(len));
    std::memcpy(b.data() + at + len, &crc, 4);
    at += std::size_t(len) + 4;
  }
}

}  // namespace zf_fuzz
