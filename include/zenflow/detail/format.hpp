// Numbers in zenflow's messages, printed exactly: the shortest text that reads back as the same
// value (std::to_chars), so "eps is 1e-08 in the file, 1.0000001e-08 here" shows the difference
// that was refused, where a fixed six decimals would print 0.000000 twice.
#pragma once

#include <charconv>
#include <string>
#include <type_traits>

namespace zenflow::detail {

template <class T>
std::string exact(T x) {
  if constexpr (std::is_floating_point_v<T>) {
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, x);
    return std::string(buf, r.ptr);
  } else {
    return std::to_string(x);
  }
}

}  // namespace zenflow::detail
