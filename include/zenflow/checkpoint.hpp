// The checkpoint file format: a header and a list of sections, each with its own CRC-32.
//
//   header:  magic "ZFCKPT\r\n" (8 bytes) | u32 format version | u32 byte-order mark 0x01020304
//            | u32 section count | u32 0
//   section: u32 tag | u32 0 | u64 payload length | payload | u32 CRC-32 (IEEE) of the payload
//
// Files are written to a temporary name, flushed to disk and renamed over the target, so a crash
// while saving leaves the previous checkpoint intact. Reading checks every length against the
// file size and every checksum before anything is used.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#  include <fcntl.h>
#  include <unistd.h>
#endif

namespace zenflow {

// A checkpoint that cannot be loaded: unreadable, corrupt, or not matching this optimizer.
struct checkpoint_error : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

namespace ckpt {

inline constexpr char magic[8] = {'Z', 'F', 'C', 'K', 'P', 'T', '\r', '\n'};
inline constexpr std::uint32_t version = 1;
inline constexpr std::uint32_t byte_order = 0x01020304u;

enum tag : std::uint32_t { config_tag = 1, layout_tag = 2, counters_tag = 3, matrix_tag = 4, vector_tag = 5 };

inline std::uint32_t crc32(const unsigned char* p, std::size_t n) noexcept {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xedb88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  std::uint32_t c = 0xffffffffu;
  for (std::size_t i = 0; i < n; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

// Builds a section's payload.
class writer {
 public:
  template <class T>
  void put(const T& x) {
    static_assert(std::is_trivially_copyable_v<T>);
    bytes(&x, sizeof x);
  }
  void bytes(const void* p, std::size_t n) {
    if (n == 0) return;  // p may be null for an empty array
    const auto* b = static_cast<const unsigned char*>(p);
    data_.insert(data_.end(), b, b + n);
  }
  const std::vector<unsigned char>& data() const noexcept { return data_; }

 private:
  std::vector<unsigned char> data_;
};

// Reads a section's payload; every read is bounds-checked.
class reader {
 public:
  reader(const unsigned char* p, std::size_t n, std::string what) : p_(p), n_(n), what_(std::move(what)) {}
  template <class T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    T x;
    bytes(&x, sizeof x);
    return x;
  }
  void bytes(void* out, std::size_t n) {
    if (n == 0) return;  // out may be null for an empty array
    if (n > n_ - at_) throw checkpoint_error("zenflow checkpoint: " + what_ + " section is truncated");
    std::memcpy(out, p_ + at_, n);
    at_ += n;
  }
  void skip(std::size_t n) {
    if (n > n_ - at_) throw checkpoint_error("zenflow checkpoint: " + what_ + " section is truncated");
    at_ += n;
  }
  void done() const {
    if (at_ != n_) throw checkpoint_error("zenflow checkpoint: " + what_ + " section has trailing bytes");
  }

 private:
  const unsigned char* p_;
  std::size_t n_, at_ = 0;
  std::string what_;
};

struct section {
  std::uint32_t tag;
  const unsigned char* data;
  std::size_t size;
};

// A temporary file name next to path, unique to this process and call, so that concurrent saves
// to one path never write into each other's file (the last rename wins, each file complete).
inline std::string temporary_name(const std::string& path) {
  static std::atomic<unsigned long long> counter{0};
#if defined(__unix__) || defined(__APPLE__)
  const long pid = long(::getpid());
#else
  const long pid = 0;
#endif
  return path + ".tmp." + std::to_string(pid) + "." + std::to_string(counter.fetch_add(1));
}

// Writes the sections atomically to path (temporary file, fsync, rename, fsync of the directory).
inline void write_file(const std::string& path, const std::vector<std::pair<std::uint32_t, const writer*>>& sections) {
  const std::string tmp = temporary_name(path);
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw std::runtime_error("zenflow: cannot create " + tmp);
  bool ok = std::fwrite(magic, 1, 8, f) == 8;
  const std::uint32_t head[4] = {version, byte_order, std::uint32_t(sections.size()), 0};
  ok = ok && std::fwrite(head, 4, 4, f) == 4;
  for (const auto& [t, w] : sections) {
    const std::uint32_t tag_and_pad[2] = {t, 0};
    const std::uint64_t len = w->data().size();
    const std::uint32_t crc = crc32(w->data().data(), w->data().size());
    ok = ok && std::fwrite(tag_and_pad, 4, 2, f) == 2 && std::fwrite(&len, 8, 1, f) == 1 &&
         (len == 0 || std::fwrite(w->data().data(), 1, len, f) == len) && std::fwrite(&crc, 4, 1, f) == 1;
  }
  ok = std::fflush(f) == 0 && ok;
#if defined(__unix__) || defined(__APPLE__)
  ok = ok && ::fsync(fileno(f)) == 0;
#endif
  ok = std::fclose(f) == 0 && ok;
  if (!ok) {
    std::remove(tmp.c_str());
    throw std::runtime_error("zenflow: writing " + tmp + " failed (disk full?)");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw std::runtime_error("zenflow: cannot rename " + tmp + " to " + path);
  }
#if defined(__unix__) || defined(__APPLE__)
  const std::size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  if (const int d = ::open(dir.c_str(), O_RDONLY); d >= 0) {  // make the rename itself durable
    ::fsync(d);
    ::close(d);
  }
#endif
}

// Verifies a checkpoint image: header, lengths, checksums. `out` points into `buf`. `name`
// (a path) is for the messages.
inline void parse(const unsigned char* data, std::size_t size, const std::string& name, std::vector<section>& out) {
  auto fail = [&](const std::string& why) -> void { throw checkpoint_error("zenflow checkpoint " + name + ": " + why); };
  if (size < 24 || std::memcmp(data, magic, 8) != 0) fail("not a zenflow checkpoint (bad magic)");
  std::uint32_t head[4];
  std::memcpy(head, data + 8, 16);
  if (head[1] != byte_order) fail("written on a machine of the other byte order");
  if (head[0] != version)
    fail("format version " + std::to_string(head[0]) + ", this build reads version " + std::to_string(version));
  std::size_t at = 24;
  out.clear();
  for (std::uint32_t s = 0; s < head[2]; ++s) {
    if (size - at < 16) fail("truncated (section " + std::to_string(s) + " header)");
    std::uint32_t th[2];
    std::uint64_t len;
    std::memcpy(th, data + at, 8);
    std::memcpy(&len, data + at + 8, 8);
    at += 16;
    if (len > size - at || size - at - len < 4) fail("truncated (section " + std::to_string(s) + ")");
    std::uint32_t crc;
    std::memcpy(&crc, data + at + len, 4);
    if (crc32(data + at, std::size_t(len)) != crc) fail("checksum mismatch in section " + std::to_string(s));
    out.push_back({th[0], data + at, std::size_t(len)});
    at += std::size_t(len) + 4;
  }
  if (at != size) fail("trailing bytes after the last section");
}

// Reads a whole file.
inline std::vector<unsigned char> read_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw checkpoint_error("zenflow checkpoint " + path + ": cannot open the file");
  std::vector<unsigned char> buf;
  unsigned char chunk[1 << 16];
  for (std::size_t n; (n = std::fread(chunk, 1, sizeof chunk, f)) > 0;) buf.insert(buf.end(), chunk, chunk + n);
  const bool err = std::ferror(f);
  std::fclose(f);
  if (err) throw checkpoint_error("zenflow checkpoint " + path + ": read error");
  return buf;
}

}  // namespace ckpt
}  // namespace zenflow
