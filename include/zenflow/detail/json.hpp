// A small strict JSON reader (RFC 8259) for configuration text: objects, arrays, strings
// (escapes, surrogate pairs, UTF-8 validated), numbers, true/false/null. It is strict on
// purpose: trailing commas, comments, duplicate keys, leading zeros, lone surrogates, invalid
// UTF-8, control characters in strings and anything after the top-level value are errors, each
// reported with its line and column. Nesting deeper than max_depth is refused (no unbounded
// recursion on hostile input).
#pragma once

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_set>
#include <vector>

namespace zenflow::detail::json {

struct parse_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class kind : std::uint8_t { null, boolean, number, string, array, object };

inline const char* kind_name(kind k) noexcept {
  switch (k) {
    case kind::null: return "null";
    case kind::boolean: return "a boolean";
    case kind::number: return "a number";
    case kind::string: return "a string";
    case kind::array: return "an array";
    case kind::object: return "an object";
  }
  return "?";
}

struct value {
  kind type = kind::null;
  bool boolean = false;
  double number = 0.0;
  std::string text;                // the string, or the number's literal as written
  std::vector<std::string> keys;   // object: member names, in order (unique)
  std::vector<value> items;        // object: member values (parallel to keys); array: elements
  std::size_t line = 1, column = 1;  // where the value starts

  // The member named `key`, or nullptr (objects only).
  const value* find(std::string_view key) const noexcept {
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (keys[i] == key) return &items[i];
    return nullptr;
  }
};

inline constexpr int max_depth = 64;
// Whether a well-formed JSON number that is not zero has a magnitude below 1 — so that, out of
// fp64's range, it underflowed rather than overflowed. Decided by the decimal exponent of its
// first nonzero digit plus the exponent part, not by the exponent's sign alone ("1" and 400
// zeros "e-5" is 1e395; "0." and 400 zeros "1e+5" about 1e-396). The exponent part saturates.
inline bool below_one(std::string_view t) {
  if (!t.empty() && t[0] == '-') t.remove_prefix(1);
  const std::size_t e = t.find_first_of("eE");
  const std::string_view m = t.substr(0, e);
  const std::size_t dot = m.find('.'), ints = dot == std::string_view::npos ? m.size() : dot;
  const std::size_t nz = m.find_first_not_of("0.");
  if (nz == std::string_view::npos) return true;  // (zero: never out of range)
  long long at = nz < ints ? (long long)(ints - nz) - 1 : -(long long)(nz - ints);
  if (e != std::string_view::npos) {
    std::string_view x = t.substr(e + 1);
    const bool neg = !x.empty() && x[0] == '-';
    if (!x.empty() && (x[0] == '-' || x[0] == '+')) x.remove_prefix(1);
    long long ex = 0;
    for (const char c : x) ex = std::min(ex * 10 + (c - '0'), 1'000'000'000'000LL);
    at += neg ? -ex : ex;
  }
  return at < 0;
}

// Whether a well-formed JSON number denotes an integer: its exact decimal value, not the double
// it rounds to (2.00000000000000001 rounds to 2 and 1e-400 to 0, neither is an integer). The
// significand's digits less its trailing zeros, scaled by the exponent part (saturating) less
// the fraction's length, must not reach below the units.
inline bool integral(std::string_view t) {
  if (!t.empty() && t[0] == '-') t.remove_prefix(1);
  const std::size_t e = t.find_first_of("eE");
  const std::string_view m = t.substr(0, e);
  const std::size_t dot = m.find('.');
  const long long fraction = dot == std::string_view::npos ? 0 : (long long)(m.size() - dot - 1);
  const std::size_t last = m.find_last_not_of("0.");
  if (last == std::string_view::npos) return true;  // (zero)
  long long trailing = 0;  // the zeros after the last nonzero digit (the point skipped)
  for (std::size_t i = last + 1; i < m.size(); ++i) trailing += m[i] != '.';
  long long ex = 0;
  if (e != std::string_view::npos) {
    std::string_view x = t.substr(e + 1);
    const bool neg = !x.empty() && x[0] == '-';
    if (!x.empty() && (x[0] == '-' || x[0] == '+')) x.remove_prefix(1);
    for (const char c : x) ex = std::min(ex * 10 + (c - '0'), 1'000'000'000'000LL);
    if (neg) ex = -ex;
  }
  return ex - fraction + trailing >= 0;
}

class parser {
 public:
  explicit parser(std::string_view s) : s_(s) {}

  value parse_document() {
    skip_ws();
    value v = parse_value(0);
    skip_ws();
    if (i_ != s_.size()) fail("unexpected text after the JSON value");
    return v;
  }

 private:
  std::string_view s_;
  std::size_t i_ = 0, line_ = 1, line_start_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw parse_error("line " + std::to_string(line_) + " column " +
                      std::to_string(i_ - line_start_ + 1) + ": " + what);
  }
  bool at_end() const noexcept { return i_ >= s_.size(); }
  char peek() const noexcept { return at_end() ? '\0' : s_[i_]; }

  void skip_ws() noexcept {
    while (!at_end()) {
      const char c = s_[i_];
      if (c == '\n') {
        ++i_;
        ++line_;
        line_start_ = i_;
      } else if (c == ' ' || c == '\t' || c == '\r') {
        ++i_;
      } else {
        break;
      }
    }
  }

  void expect_word(std::string_view w) {
    if (s_.substr(i_, w.size()) != w) fail("invalid literal (expected " + std::string(w) + ")");
    i_ += w.size();
  }

  value parse_value(int depth) {
    if (depth >= max_depth) fail("nesting deeper than " + std::to_string(max_depth) + " levels");
    value v;
    v.line = line_;
    v.column = i_ - line_start_ + 1;
    if (at_end()) fail("unexpected end of input, expected a value");
    switch (peek()) {
      case '{': parse_object(v, depth); break;
      case '[': parse_array(v, depth); break;
      case '"': v.type = kind::string; v.text = parse_string(); break;
      case 't': expect_word("true"); v.type = kind::boolean; v.boolean = true; break;
      case 'f': expect_word("false"); v.type = kind::boolean; v.boolean = false; break;
      case 'n': expect_word("null"); v.type = kind::null; break;
      default:
        if (peek() == '-' || (peek() >= '0' && peek() <= '9')) {
          parse_number(v);
        } else {
          fail(std::string("unexpected character '") + printable(peek()) + "'");
        }
    }
    return v;
  }

  static std::string printable(char c) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) return std::string(1, c);
    static const char* hex = "0123456789abcdef";
    return std::string("\\x") + hex[u >> 4] + hex[u & 15];
  }

  void parse_object(value& v, int depth) {
    v.type = kind::object;
    ++i_;  // '{'
    skip_ws();
    if (peek() == '}') {
      ++i_;
      return;
    }
    std::unordered_set<std::string> seen;  // duplicate keys found in O(1) each
    for (;;) {
      skip_ws();
      if (peek() != '"') fail("expected a member name in double quotes");
      std::string key = parse_string();
      if (!seen.insert(key).second) fail("duplicate key \"" + key + "\"");
      skip_ws();
      if (peek() != ':') fail("expected ':' after the member name");
      ++i_;
      skip_ws();
      v.keys.push_back(std::move(key));
      v.items.push_back(parse_value(depth + 1));
      skip_ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      if (peek() == '}') {
        ++i_;
        return;
      }
      fail("expected ',' or '}' in an object");
    }
  }

  void parse_array(value& v, int depth) {
    v.type = kind::array;
    ++i_;  // '['
    skip_ws();
    if (peek() == ']') {
      ++i_;
      return;
    }
    for (;;) {
      skip_ws();
      v.items.push_back(parse_value(depth + 1));
      skip_ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      if (peek() == ']') {
        ++i_;
        return;
      }
      fail("expected ',' or ']' in an array");
    }
  }

  unsigned hex4() {
    if (s_.size() - i_ < 4) fail("truncated \\u escape");
    unsigned u = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s_[i_++];
      u <<= 4;
      if (c >= '0' && c <= '9') u |= unsigned(c - '0');
      else if (c >= 'a' && c <= 'f') u |= unsigned(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') u |= unsigned(c - 'A' + 10);
      else fail("invalid hex digit in a \\u escape");
    }
    return u;
  }

  static void put_utf8(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xC0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += char(0xE0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    } else {
      out += char(0xF0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3F));
      out += char(0x80 | ((cp >> 6) & 0x3F));
      out += char(0x80 | (cp & 0x3F));
    }
  }

  // One UTF-8 sequence starting at i_ (first byte >= 0x80), copied to out; rejects overlong
  // forms, surrogates and code points above U+10FFFF.
  void copy_utf8(std::string& out) {
    const auto b0 = static_cast<unsigned char>(s_[i_]);
    int n;
    std::uint32_t cp, min;
    if (b0 >= 0xC2 && b0 <= 0xDF) { n = 1; cp = b0 & 0x1F; min = 0x80; }
    else if (b0 >= 0xE0 && b0 <= 0xEF) { n = 2; cp = b0 & 0x0F; min = 0x800; }
    else if (b0 >= 0xF0 && b0 <= 0xF4) { n = 3; cp = b0 & 0x07; min = 0x10000; }
    else fail("invalid UTF-8 in a string");
    if (s_.size() - i_ <= std::size_t(n)) fail("truncated UTF-8 sequence in a string");
    for (int k = 1; k <= n; ++k) {
      const auto b = static_cast<unsigned char>(s_[i_ + std::size_t(k)]);
      if ((b & 0xC0) != 0x80) fail("invalid UTF-8 in a string");
      cp = (cp << 6) | (b & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) fail("invalid UTF-8 in a string");
    out.append(s_.substr(i_, std::size_t(n) + 1));
    i_ += std::size_t(n) + 1;
  }

  std::string parse_string() {
    ++i_;  // opening quote
    std::string out;
    for (;;) {
      if (at_end()) fail("unterminated string");
      const char c = s_[i_];
      if (c == '"') {
        ++i_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail("control character in a string (escape it)");
      if (static_cast<unsigned char>(c) >= 0x80) {
        copy_utf8(out);
        continue;
      }
      if (c != '\\') {
        out += c;
        ++i_;
        continue;
      }
      ++i_;
      if (at_end()) fail("unterminated escape");
      const char e = s_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          std::uint32_t cp = hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail("lone low surrogate in a \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (s_.substr(i_, 2) != "\\u") fail("high surrogate not followed by a low one");
            i_ += 2;
            const std::uint32_t lo = hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) fail("high surrogate not followed by a low one");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          put_utf8(out, cp);
          break;
        }
        default: fail(std::string("invalid escape '\\") + printable(e) + "'");
      }
    }
  }

  void parse_number(value& v) {
    const std::size_t start = i_;
    auto digits = [&] {
      const std::size_t d = i_;
      while (!at_end() && s_[i_] >= '0' && s_[i_] <= '9') ++i_;
      return i_ - d;
    };
    if (peek() == '-') ++i_;
    if (peek() == '0') {
      ++i_;
      if (peek() >= '0' && peek() <= '9') fail("leading zero in a number");
    } else if (digits() == 0) {
      fail("expected digits in a number");
    }
    if (peek() == '.') {
      ++i_;
      if (digits() == 0) fail("expected digits after the decimal point");
    }
    if (peek() == 'e' || peek() == 'E') {
      ++i_;
      if (peek() == '+' || peek() == '-') ++i_;
      if (digits() == 0) fail("expected digits in the exponent");
    }
    v.type = kind::number;
    v.text = std::string(s_.substr(start, i_ - start));
    const char* first = v.text.data();
    const char* last = first + v.text.size();
    auto [ptr, ec] = std::from_chars(first, last, v.number);
    // from_chars reports out-of-range for overflow and for underflow to zero or subnormal;
    // overflow is an error, a tiny magnitude is read as what it rounds to.
    if (ec == std::errc::result_out_of_range) {
      if (!below_one(v.text)) fail("number out of range: " + v.text);
      v.number = v.text[0] == '-' ? -0.0 : 0.0;
    } else if (ec != std::errc{} || ptr != last) {
      fail("malformed number: " + v.text);
    }
  }
};

// Parses a complete JSON document; throws parse_error naming line and column.
inline value parse(std::string_view text) { return parser(text).parse_document(); }

// Appends s as a JSON string literal (quotes and escapes).
inline void write_string(std::string& out, std::string_view s) {
  static const char* hex = "0123456789abcdef";
  out += '"';
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      out += "\\u00";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  out += '"';
}

// Whether s is valid UTF-8 as this parser takes it (what write_string writes reads back the same).
// ASCII is, without the round trip (config::validate runs this on every set_lr: no allocation
// for the usual names).
inline bool is_utf8(std::string_view s) {
  bool ascii = true;
  for (const char c : s) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return true;
  std::string quoted;
  write_string(quoted, s);
  try {
    return parse(quoted).text == s;
  } catch (const parse_error&) {
    return false;
  }
}

}  // namespace zenflow::detail::json
