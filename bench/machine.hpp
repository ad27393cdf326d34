// The machine a bench ran on, for its JSON lines: the CPU's model name; and the run itself:
// when it started, the commit it was built from and its command line, so that a number in
// bench/results can be traced to the code and the flags that made it.
#pragma once

#include <ctime>
#include <fstream>
#include <string>

#include <zenflow/version.hpp>

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

// The commit the bench was built from, "-dirty" with changes to tracked files, "unknown" outside
// a git checkout (a file written at build time by bench/revision.cmake).
const char* build_revision();

namespace detail {
inline std::string& run_fields_text() {
  static std::string text;
  return text;
}
inline void append_json_string(std::string& out, const std::string& s) {
  out += '"';
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += static_cast<unsigned char>(c) < 0x20 ? ' ' : c;
  }
  out += '"';
}
}  // namespace detail

// Called first in main: makes the fields run_fields() returns.
inline void record_run(int argc, char** argv) {
  char utc[32] = "unknown";
  const std::time_t now = std::time(nullptr);
  std::tm t{};
  if (gmtime_r(&now, &t)) std::strftime(utc, sizeof utc, "%Y-%m-%dT%H:%M:%SZ", &t);
  std::string command;
  for (int i = 0; i < argc; ++i) (command += i ? " " : "") += argv[i];
  std::string& f = detail::run_fields_text();
  f = "\"run\":{\"utc\":\"";
  f += utc;
  f += "\",\"commit\":\"";
  f += build_revision();
  f += "\",\"zenflow\":\"" + std::to_string(ZENFLOW_VERSION_MAJOR) + '.' +
       std::to_string(ZENFLOW_VERSION_MINOR) + '.' + std::to_string(ZENFLOW_VERSION_PATCH) + "\",\"argv\":";
  detail::append_json_string(f, command);
  f += "},";
}

// `"run":{"utc":…,"commit":…,"zenflow":…,"argv":…},` — printed as the first field of every
// JSON line ("" before record_run).
inline const char* run_fields() { return detail::run_fields_text().c_str(); }

}  // namespace zf_bench
