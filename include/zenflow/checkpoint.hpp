// The checkpoint file format: a header and a list of sections, each with its own CRC-32.
//
//   header:  magic "ZFCKPT\r\n" (8 bytes) | u32 format version | u32 byte-order mark 0x01020304
//            | u32 section count | u32 0
//   section: u32 tag | u32 0 | u64 payload length | payload | u32 CRC-32 (IEEE) of the payload
//
// Files are written to a temporary name, flushed to disk and renamed over the target, so a crash
// while saving leaves the previous checkpoint intact. Both directions stream through bounded
// buffers: a section's length is known before its payload is written and its CRC is computed on
// the way, so neither side ever holds a whole file. Reading checks the header and every length
// against the file's size before reading a payload, and every checksum before anything is used.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#  include <dirent.h>
#  include <fcntl.h>
#  include <sys/file.h>
#  include <sys/stat.h>
#  include <unistd.h>
#endif

namespace zenflow {

// A checkpoint that cannot be loaded: unreadable, corrupt, or not matching this optimizer.
struct checkpoint_error : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

namespace ckpt {

inline constexpr char magic[8] = {'Z', 'F', 'C', 'K', 'P', 'T', '\r', '\n'};
// 2: no staged params, no host arrays for k = cols; 3: the communication counters, and a
// sharded checkpoint's manifest holds each shard's digest
inline constexpr std::uint32_t version = 3;
inline constexpr std::uint32_t byte_order = 0x01020304u;

// (shards_tag: a sharded checkpoint's manifest names its set; shard_tag and block_tag: a shard's
// header and a matrix's block of host arrays in it)
enum tag : std::uint32_t {
  config_tag = 1,
  layout_tag = 2,
  counters_tag = 3,
  matrix_tag = 4,
  vector_tag = 5,
  shards_tag = 6,
  shard_tag = 7,
  block_tag = 8
};

// CRC-32 (IEEE, reflected) in pieces: state starts at crc32_init, each piece goes through
// crc32_update, crc32_final gives the checksum. Slicing by 8 (eight tables, eight bytes a round).
inline constexpr std::uint32_t crc32_init = 0xffffffffu;
inline std::uint32_t crc32_update(std::uint32_t c, const unsigned char* p, std::size_t n) noexcept {
  static const std::array<std::array<std::uint32_t, 256>, 8> t = [] {
    std::array<std::array<std::uint32_t, 256>, 8> r{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c0 = i;
      for (int k = 0; k < 8; ++k) c0 = (c0 & 1) ? 0xedb88320u ^ (c0 >> 1) : c0 >> 1;
      r[0][i] = c0;
    }
    for (std::uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) r[s][i] = (r[s - 1][i] >> 8) ^ r[0][r[s - 1][i] & 0xff];
    return r;
  }();
  for (; n >= 8; n -= 8, p += 8) {
    const std::uint32_t lo = c ^ (std::uint32_t(p[0]) | std::uint32_t(p[1]) << 8 | std::uint32_t(p[2]) << 16 |
                                  std::uint32_t(p[3]) << 24);
    c = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^ t[3][p[4]] ^
        t[2][p[5]] ^ t[1][p[6]] ^ t[0][p[7]];
  }
  for (; n > 0; --n, ++p) c = t[0][(c ^ *p) & 0xff] ^ (c >> 8);
  return c;
}
inline constexpr std::uint32_t crc32_final(std::uint32_t c) noexcept { return c ^ 0xffffffffu; }
inline std::uint32_t crc32(const unsigned char* p, std::size_t n) noexcept {
  return crc32_final(crc32_update(crc32_init, p, n));
}

// FNV-1a, 64 bits: a digest for comparing bytes that are not at hand (not a checksum of a file).
inline constexpr std::uint64_t fnv1a64_init = 0xcbf29ce484222325ull;
inline std::uint64_t fnv1a64(const unsigned char* p, std::size_t n, std::uint64_t h = fnv1a64_init) noexcept {
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}
// A file's digest: FNV-1a over its sections' CRC-32s in order (as written, and as read by a
// pass that finished every section once). It identifies the file's contents: two files of
// equal digest are, but for a collision, the same checkpoint.
inline std::uint64_t digest_step(std::uint64_t h, std::uint32_t crc) noexcept {
  unsigned char b[4];
  std::memcpy(b, &crc, 4);
  return fnv1a64(b, 4, h);
}

// The bounded buffer size both directions stream through.
inline constexpr std::size_t stream_chunk = std::size_t(1) << 20;

// Typed access for the byte streams below: put<T>() / get<T>() of a trivially copyable value
// through the stream's bytes().
template <class Stream>
struct typed_writes {
  template <class T>
  void put(const T& x) {
    static_assert(std::is_trivially_copyable_v<T>);
    static_cast<Stream*>(this)->bytes(&x, sizeof x);
  }
};
template <class Stream>
struct typed_reads {
  template <class T>
  T get() {
    static_assert(std::is_trivially_copyable_v<T>);
    T x;
    static_cast<Stream*>(this)->bytes(&x, sizeof x);
    return x;
  }
};

// Builds a section's payload.
class writer : public typed_writes<writer> {
 public:
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
class reader : public typed_reads<reader> {
 public:
  reader(const unsigned char* p, std::size_t n, std::string what) : p_(p), n_(n), what_(std::move(what)) {}
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

// The temporary files this process is writing now (file_writer registers each), which a clean-up
// never touches, whatever the file system's locks do.
struct live_temporaries {
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::set<std::string>& names() {
    static std::set<std::string> s;
    return s;
  }
  static void add(const std::string& n) {
    std::lock_guard lock(mutex());
    names().insert(n);
  }
  static void remove(const std::string& n) noexcept {
    std::lock_guard lock(mutex());
    names().erase(n);
  }
  static bool contains(const std::string& n) {
    std::lock_guard lock(mutex());
    return names().count(n) != 0;
  }
};

// Calls f(name) for each entry of directory `dir` ("": the working directory; "." and ".."
// left out; f may throw). Returns false, with ec saying why, if the directory could not be
// listed whole. With POSIX, readdir: std::filesystem's iterator (libstdc++'s) ends the process
// when an allocation fails while it advances, where this lets the caller's own bad_alloc reach
// it (a save refused on every rank rather than a rank gone).
template <class F>
bool for_each_name(const std::string& dir, F&& f, std::error_code& ec) {
  ec.clear();
#if defined(__unix__) || defined(__APPLE__)
  struct closer {
    void operator()(DIR* d) const noexcept { ::closedir(d); }
  };
  const std::unique_ptr<DIR, closer> d(::opendir(dir.empty() ? "." : dir.c_str()));
  if (!d) {
    ec = std::error_code(errno, std::generic_category());
    return false;
  }
  for (;;) {
    errno = 0;
    const dirent* e = ::readdir(d.get());
    if (!e) {
      if (errno != 0) ec = std::error_code(errno, std::generic_category());
      return !ec;
    }
    const std::string_view name(e->d_name);
    if (name != "." && name != "..") f(name);
  }
#else
  for (std::filesystem::directory_iterator it(dir.empty() ? std::string(".") : dir, ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    f(std::string_view(name));
  }
  return !ec;
#endif
}

// A temporary file nothing has written to for this long, and whose writer is gone, is stale.
inline constexpr std::time_t stale_temporary_seconds = 60;

// Removes the temporary files of path (path.tmp.<digits>.<digits>, exactly) that a save killed
// while writing them left behind: a file goes when it is not one this process is writing, nothing
// has written to it for stale_temporary_seconds, and an exclusive lock on it can be taken (a
// writer holds one from creation until it closes the file; the lock dies with its process). On a
// file system without locks the lock fails and nothing is removed. Never throws: the save it
// follows has succeeded.
inline void remove_stale_temporaries(const std::string& path) noexcept {
#if defined(__unix__) || defined(__APPLE__)
  try {
    const std::size_t slash = path.find_last_of('/');
    const std::string dir = slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
    const std::string prefix = path.substr(dir.size()) + ".tmp.";
    auto digits = [](std::string_view s, std::size_t& k) {
      const std::size_t k0 = k;
      while (k < s.size() && s[k] >= '0' && s[k] <= '9' && k - k0 < 20) ++k;
      return k > k0;
    };
    std::error_code ec;
    std::vector<std::string> stale;
    for_each_name(dir, [&](std::string_view name) {
      if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return;
      std::size_t k = prefix.size();
      if (!digits(name, k) || k >= name.size() || name[k] != '.') return;
      ++k;
      if (!digits(name, k) || k != name.size()) return;
      stale.push_back(dir + std::string(name));
    }, ec);
    const std::time_t now = std::time(nullptr);
    for (const std::string& f : stale) {
      if (live_temporaries::contains(f)) continue;
      const int fd = ::open(f.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
      if (fd < 0) continue;
      struct stat st {};
      if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && now - st.st_mtime >= stale_temporary_seconds &&
          ::flock(fd, LOCK_EX | LOCK_NB) == 0)
        ::unlink(f.c_str());
      ::close(fd);
    }
  } catch (...) {
  }
#else
  (void)path;
#endif
}

// Writes a checkpoint file section by section, atomically: to a temporary file that commit()
// flushes, syncs and renames over path; destroyed without commit() (an exception on the way),
// the temporary file is removed and path is untouched. The writer holds an exclusive lock on its
// temporary file while it writes (where the file system has locks), and commit() removes the
// stale temporary files of path (remove_stale_temporaries). Each section announces its length, takes
// exactly that many payload bytes in any number of pieces, and gets its CRC on end().
class file_writer : public typed_writes<file_writer> {
 public:
  file_writer(const std::string& path, std::uint32_t sections) : path_(path) {
    // (a NUL would end the name early where the file is made: another file's)
    if (path.find('\0') != std::string::npos)
      throw std::invalid_argument("zenflow: a checkpoint path holds a NUL character; nothing was written");
    create_temporary();
#if defined(__unix__) || defined(__APPLE__)
    ::flock(fileno(f_), LOCK_EX | LOCK_NB);  // (where locks fail, the clean-up cannot take one either)
#endif
    const std::uint32_t head[4] = {version, byte_order, sections, 0};
    try {
      raw(magic, 8);
      raw(head, 16);
    } catch (...) {  // (no destructor runs for a constructor that throws: its clean-up, here)
      std::fclose(f_);
      std::remove(tmp_.c_str());
      live_temporaries::remove(tmp_);
      throw;
    }
  }
  file_writer(const file_writer&) = delete;
  file_writer& operator=(const file_writer&) = delete;
  ~file_writer() {
    if (f_) {
      std::fclose(f_);
      std::remove(tmp_.c_str());
    }
    live_temporaries::remove(tmp_);
  }

  // Creates a new temporary file (tmp_, f_, registered as live): a name no file has — created
  // exclusively and never through a symbolic link, so that a file or link someone left under
  // a temporary name (a killed process of the same pid, say) is neither written through nor
  // truncated; the next name is tried instead.
  void create_temporary() {
    for (int attempt = 0;; ++attempt) {
      tmp_ = temporary_name(path_);
      live_temporaries::add(tmp_);
#if defined(__unix__) || defined(__APPLE__)
      const int fd = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
      const int e = errno;
      if (fd >= 0) {
        keep_mode_of_target(fd);
        f_ = ::fdopen(fd, "wb");
        if (f_) return;
        const int fe = errno;
        ::close(fd);
        std::remove(tmp_.c_str());
        live_temporaries::remove(tmp_);
        throw std::runtime_error("zenflow: cannot create " + tmp_ + " (" + std::strerror(fe) + ")");
      }
      live_temporaries::remove(tmp_);
      if (e == EEXIST && attempt < 100) continue;
      throw std::runtime_error("zenflow: cannot create " + tmp_ + " (" + std::strerror(e) + ")");
#else
      f_ = std::fopen(tmp_.c_str(), "wb");
      if (f_) return;
      live_temporaries::remove(tmp_);
      throw std::runtime_error("zenflow: cannot create " + tmp_);
#endif
    }
  }

#if defined(__unix__) || defined(__APPLE__)
  // The file replacing a regular file at path_ gets its permission bits (a checkpoint made private
  // stays private; the rename would otherwise give it the umask's). Where they cannot be set and
  // the old file allowed less than the new one would, the save fails rather than widen access.
  void keep_mode_of_target(int fd) {
    struct stat old_st{}, new_st{};
    if (::stat(path_.c_str(), &old_st) != 0 || !S_ISREG(old_st.st_mode) || ::fstat(fd, &new_st) != 0) return;
    const mode_t want = old_st.st_mode & 07777, have = new_st.st_mode & 07777;
    if (want == have || ::fchmod(fd, want) == 0) return;
    const int e = errno;
    if ((have & ~want) == 0) return;  // (narrower already: nothing widened)
    ::close(fd);
    std::remove(tmp_.c_str());
    live_temporaries::remove(tmp_);
    throw std::runtime_error("zenflow: cannot give " + tmp_ + " the permissions of " + path_ + " (" + std::strerror(e) +
                             "); not saving a file others could read where only fewer could");
  }
#endif

  void begin(std::uint32_t t, std::uint64_t len) {
    const std::uint32_t tag_and_pad[2] = {t, 0};
    raw(tag_and_pad, 8);
    raw(&len, 8);
    left_ = len;
    crc_ = crc32_init;
  }
  void bytes(const void* p, std::size_t n) {
    if (n == 0) return;  // p may be null for an empty array
    if (n > left_) throw std::logic_error("zenflow: checkpoint section longer than announced");
    crc_ = crc32_update(crc_, static_cast<const unsigned char*>(p), n);
    raw(p, n);
    left_ -= n;
  }
  void end() {
    if (left_ != 0) throw std::logic_error("zenflow: checkpoint section shorter than announced");
    const std::uint32_t crc = crc32_final(crc_);
    raw(&crc, 4);
    digest_ = digest_step(digest_, crc);
  }
  // The digest of the sections ended so far (digest_step).
  std::uint64_t digest() const noexcept { return digest_; }
  // A section built in memory (the small ones).
  void section(std::uint32_t t, const writer& w) {
    begin(t, w.data().size());
    bytes(w.data().data(), w.data().size());
    end();
  }

  // Flushes, syncs and renames the file over path (then syncs the directory). Returns whether the
  // rename is durable too (the directory's sync succeeded): a caller about to remove what the
  // old file referred to does so only then, else a crash could keep the removals and lose the
  // rename.
  // What allocates comes first: after the rename nothing throws, since the file is in place (a
  // caller that saw an exception would take the new file for a failed one and undo around it).
  bool commit() {
#if defined(__unix__) || defined(__APPLE__)
    const std::size_t slash = path_.find_last_of('/');
    const std::string dir = slash == std::string::npos ? "." : path_.substr(0, slash + 1);
#endif
    bool ok = std::fflush(f_) == 0;
#if defined(__unix__) || defined(__APPLE__)
    ok = ok && ::fsync(fileno(f_)) == 0;
#endif
    ok = std::fclose(f_) == 0 && ok;
    f_ = nullptr;
    if (!ok) {
      std::remove(tmp_.c_str());
      throw std::runtime_error("zenflow: writing " + tmp_ + " failed (disk full?)");
    }
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
      const int e = errno;
      std::remove(tmp_.c_str());
      throw std::runtime_error("zenflow: cannot rename " + tmp_ + " to " + path_ + " (" + std::strerror(e) + ")");
    }
    bool durable = true;
#if defined(__unix__) || defined(__APPLE__)
    durable = false;
    if (const int d = ::open(dir.c_str(), O_RDONLY); d >= 0) {  // make the rename itself durable
      durable = ::fsync(d) == 0;
      ::close(d);
    }
#endif
    live_temporaries::remove(tmp_);
    remove_stale_temporaries(path_);
    return durable;
  }

 private:
  void raw(const void* p, std::size_t n) {
    if (std::fwrite(p, 1, n, f_) != n) throw std::runtime_error("zenflow: writing " + tmp_ + " failed (disk full?)");
  }
  std::string path_, tmp_;
  std::FILE* f_ = nullptr;
  std::uint64_t left_ = 0;
  std::uint32_t crc_ = crc32_init;
  std::uint64_t digest_ = fnv1a64_init;
};

// Where a checkpoint is read from: a file (opened once; read twice by load, a check pass and a
// commit pass, from the same open file, so a save renamed over the path meanwhile changes
// nothing) or an image in memory. Sequential reads with seek; a read past the end is refused.
class input {
 public:
  // A regular file; its size is known before anything is read.
  explicit input(const std::string& path) : name_(path) {
    auto cannot_open = [&](int e) {  // (why: a missing file, permissions, too many open files)
      return checkpoint_error("zenflow checkpoint " + path + ": cannot open the file (" + std::strerror(e) + ")");
    };
    // (a NUL would end the name early where the file is opened: another file's)
    if (path.find('\0') != std::string::npos) throw checkpoint_error("zenflow checkpoint: the path holds a NUL character");
#if defined(__unix__) || defined(__APPLE__)
    // opened without blocking, then checked: a FIFO (or a device) at the path would block a
    // plain open until a writer came; it is refused at once instead
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) throw cannot_open(errno);
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      throw checkpoint_error("zenflow checkpoint " + path + ": not a regular file");
    }
    const int flags = ::fcntl(fd, F_GETFL);  // (blocking reads again: a regular file's are anyway)
    if (flags != -1) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    f_ = ::fdopen(fd, "rb");
    if (!f_) {
      const int e = errno;
      ::close(fd);
      throw cannot_open(e);
    }
    size_ = std::uint64_t(st.st_size);
#else
    f_ = std::fopen(path.c_str(), "rb");
    if (!f_) throw cannot_open(errno);
    std::fseek(f_, 0, SEEK_END);
    size_ = std::uint64_t(std::ftell(f_));
    std::fseek(f_, 0, SEEK_SET);
#endif
  }
  input(const void* data, std::size_t size, std::string name)
      : name_(std::move(name)), mem_(static_cast<const unsigned char*>(data)), size_(size), memory_(true) {
    if (!data && size) fail("the image is a null pointer");
  }
  input(const input&) = delete;
  input& operator=(const input&) = delete;
  ~input() {
    if (f_) std::fclose(f_);
  }

  const std::string& name() const noexcept { return name_; }
  std::uint64_t size() const noexcept { return size_; }
  std::uint64_t offset() const noexcept { return at_; }
  std::uint64_t left() const noexcept { return size_ - at_; }
  bool from_memory() const noexcept { return memory_; }
  [[noreturn]] void fail(const std::string& why) const { throw checkpoint_error("zenflow checkpoint " + name_ + ": " + why); }

  void read(void* out, std::size_t n) {
    if (n == 0) return;
    if (n > left()) fail("truncated");
    if (memory_) std::memcpy(out, mem_ + at_, n);
    else if (std::fread(out, 1, n, f_) != n) fail(std::ferror(f_) ? "read error" : "truncated (the file shrank)");
    at_ += n;
  }
  void seek(std::uint64_t to) {
    if (to > size_) fail("truncated");
    if (to < at_ && rewind_hook_) rewind_hook_();
    if (!memory_ && std::fseek(f_, long(to), SEEK_SET) != 0) fail("read error (seek)");
    at_ = to;
  }
  // Called when a read goes back (load's second pass starts): lets a test change the data in
  // between, as a file rewritten in place during a load would.
  void on_rewind(std::function<void()> f) { rewind_hook_ = std::move(f); }
  // The digest (digest_step) of the sections whose checksums have been checked (section_in::
  // finish), in order: after a pass that finished each section once, the file's.
  std::uint64_t digest() const noexcept { return digest_; }
  void add_to_digest(std::uint32_t crc) noexcept { digest_ = digest_step(digest_, crc); }

 private:
  std::string name_;
  std::FILE* f_ = nullptr;
  const unsigned char* mem_ = nullptr;
  std::uint64_t size_ = 0, at_ = 0;
  bool memory_ = false;
  std::function<void()> rewind_hook_;
  std::uint64_t digest_ = fnv1a64_init;
};

// One section's payload read from an input in pieces, its CRC computed on the way; finish()
// reads the stored CRC and refuses the section if they differ. `index` names it in messages.
class section_in : public typed_reads<section_in> {
 public:
  section_in(input& in, std::uint64_t len, std::size_t index) : in_(in), left_(len), index_(index) {}
  void bytes(void* out, std::size_t n) {
    if (n == 0) return;
    if (n > left_) in_.fail("section " + std::to_string(index_) + " is shorter than its contents");
    in_.read(out, n);
    crc_ = crc32_update(crc_, static_cast<const unsigned char*>(out), n);
    left_ -= n;
  }
  // n bytes through a bounded buffer: f(piece, bytes) for each piece, in order.
  template <class F>
  void pieces(std::uint64_t n, std::vector<unsigned char>& buf, F&& f) {
    // grown to what is needed, up to the bound (a small checkpoint never touches a whole MiB)
    const std::size_t want = std::size_t(std::min<std::uint64_t>(n, stream_chunk));
    if (buf.size() < want) buf.resize(want);
    while (n > 0) {
      const std::size_t m = std::size_t(std::min<std::uint64_t>(n, buf.size()));
      bytes(buf.data(), m);
      f(buf.data(), m);
      n -= m;
    }
  }
  void skip(std::uint64_t n, std::vector<unsigned char>& buf) {
    pieces(n, buf, [](const unsigned char*, std::size_t) {});
  }
  // Checks the section's checksum; returns it (a second pass over a file compares it with the
  // first pass's: a file rewritten in between with other valid contents is caught there).
  std::uint32_t finish() {
    if (left_ != 0) in_.fail("section " + std::to_string(index_) + " has trailing bytes");
    std::uint32_t stored;
    in_.read(&stored, 4);
    if (crc32_final(crc_) != stored) in_.fail("checksum mismatch in section " + std::to_string(index_));
    in_.add_to_digest(stored);
    return stored;
  }

 private:
  input& in_;
  std::uint64_t left_;
  std::size_t index_;
  std::uint32_t crc_ = crc32_init;
};

// The header: magic, byte order, version; returns the section count.
inline std::uint32_t read_header(input& in) {
  if (in.size() < 24) in.fail("not a zenflow checkpoint (bad magic)");
  unsigned char m[8];
  in.read(m, 8);
  if (std::memcmp(m, magic, 8) != 0) in.fail("not a zenflow checkpoint (bad magic)");
  std::uint32_t head[4];
  in.read(head, 16);
  if (head[1] != byte_order) in.fail("written on a machine of the other byte order");
  if (head[0] != version)
    in.fail("format version " + std::to_string(head[0]) + ", this build reads version " + std::to_string(version));
  // (no checksum covers the header: its reserved word is checked as written, 0)
  if (head[3] != 0) in.fail("corrupt (the header's reserved field is not 0)");
  return head[2];
}

// A section's header: its tag and payload length, the length checked against what is left.
struct section_header {
  std::uint32_t tag;
  std::uint64_t len;
};
inline section_header read_section_header(input& in, std::size_t index) {
  if (in.left() < 16) in.fail("truncated (section " + std::to_string(index) + " header)");
  std::uint32_t th[2];
  std::uint64_t len;
  in.read(th, 8);
  in.read(&len, 8);
  if (th[1] != 0) in.fail("corrupt (section " + std::to_string(index) + "'s reserved field is not 0)");
  if (len > in.left() || in.left() - len < 4) in.fail("truncated (section " + std::to_string(index) + ")");
  return {th[0], len};
}

}  // namespace ckpt
}  // namespace zenflow
