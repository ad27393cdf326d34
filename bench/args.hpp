// The benches' command lines, read strictly: every flag must be one the bench knows, a flag that
// takes a value must have one, and a number must be all digits (or a whole decimal number) within
// its range. A mistake ends the run with a message and exit status 2, before anything is measured,
// rather than a run with defaults that looks like the one asked for.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <zenflow/detail/format.hpp>  // exact: a number as its shortest round-trip text

namespace zf_bench {

class args {
 public:
  // valued: the flags that take a value; switches: those that do not. A flag given twice: the
  // last one counts.
  args(const char* program, int argc, char** argv, std::vector<std::string> valued,
       std::vector<std::string> switches = {})
      : program_(program) {
    auto known = [](const std::vector<std::string>& names, const std::string& a) {
      for (const auto& n : names)
        if (n == a) return true;
      return false;
    };
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (known(switches, a)) {
        given_.emplace_back(a, "");
      } else if (known(valued, a)) {
        if (i + 1 >= argc) fail(a + " needs a value");
        given_.emplace_back(a, argv[++i]);
      } else {
        fail("unknown flag '" + a + "'");
      }
    }
  }

  bool has(const std::string& name) const { return find(name) != nullptr; }
  std::string text(const std::string& name, const std::string& def) const {
    const std::string* v = find(name);
    return v ? *v : def;
  }
  // A count: decimal digits only, in [lo, hi].
  unsigned long long count(const std::string& name, unsigned long long def, unsigned long long lo,
                           unsigned long long hi) const {
    const std::string* v = find(name);
    if (!v) return def;
    const std::string& s = *v;
    bool digits = !s.empty() && s.size() <= 20;
    for (char ch : s) digits = digits && ch >= '0' && ch <= '9';
    errno = 0;
    const unsigned long long x = digits ? std::strtoull(s.c_str(), nullptr, 10) : 0;
    if (!digits || errno == ERANGE || x < lo || x > hi)
      fail(name + " expects an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + s + "'");
    return x;
  }
  // A finite number, the whole text, in [lo, hi].
  double real(const std::string& name, double def, double lo, double hi) const {
    const std::string* v = find(name);
    if (!v) return def;
    char* end = nullptr;
    errno = 0;
    const double x = std::strtod(v->c_str(), &end);
    if (v->empty() || end != v->c_str() + v->size() || errno == ERANGE || !std::isfinite(x) || x < lo || x > hi)
      fail(name + " expects a number in [" + zenflow::detail::exact(lo) + ", " + zenflow::detail::exact(hi) + "], got '" + *v + "'");
    return x;
  }
  [[noreturn]] void fail(const std::string& why) const {
    std::fprintf(stderr, "%s: %s\n", program_, why.c_str());
    std::exit(2);
  }

 private:
  const std::string* find(const std::string& name) const {
    for (auto it = given_.rbegin(); it != given_.rend(); ++it)
      if (it->first == name) return &it->second;
    return nullptr;
  }
  const char* program_;
  std::vector<std::pair<std::string, std::string>> given_;
};

// A JSON number, or null where there is none (a ratio over a zero): printf's "nan" and "inf"
// are not JSON.
inline std::string json_number(double x, const char* format = "%.4f") {
  if (!std::isfinite(x)) return "null";
  char buf[64];
  std::snprintf(buf, sizeof buf, format, x);
  return buf;
}

}  // namespace zf_bench
