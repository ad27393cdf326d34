// One block of a streamed device -> host transfer (the per-step offload: a matrix's compacted
// unselected gradient columns): `bytes` from `src`, handed over in pieces of at most `piece`
// bytes (a whole number of columns).
#pragma once

#include <cstddef>

namespace zenflow {

struct offload_block {
  const void* src = nullptr;
  std::size_t bytes = 0;
  std::size_t piece = 0;
};

}  // namespace zenflow
