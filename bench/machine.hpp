// The machine a bench ran on, for its JSON lines: the CPU's model name.
#pragma once

#include <fstream>
#include <string>

namespace zf_bench {

// Linux's /proc/cpuinfo "model name" ("" elsewhere), with characters that JSON would need to
// escape replaced by spaces.
inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) {
      const std::size_t colon = line.find(':');
      std::string name = colon == std::string::npos ? "" : line.substr(colon + 1);
      name.erase(0, name.find_first_not_of(' '));
      for (char& c : name)
        if (c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20) c = ' ';
      return name;
    }
  return "";
}

}  // namespace zf_bench
