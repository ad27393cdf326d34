// The optimizer's checkpoint format: what a checkpoint of zenflow::optimizer holds — a config
// section, a layout section (the registrations), a counters section, then one section per matrix
// and one per vector — how save() fills it from the optimizer's state, and how load() checks a
// file completely (sizes, registrations, config, column lists, counts against the applied steps)
// before committing anything. The container format (framing, checksums, atomic replacement) is
// checkpoint.hpp's; the optimizer's state is read and written through friendship.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <system_error>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "checkpoint.hpp"
#include "communicator.hpp"  // shard_begin
#include "config.hpp"
#include "detail/format.hpp"
#include "params.hpp"

namespace zenflow::detail {

template <class Opt>
struct optimizer_checkpoint {
  // Bytes of a matrix section with `active` selected columns, and of a vector section. A matrix
  // with every column selected (k = cols) has no host arrays. The section's layout:
  //   u64 active | u32 columns[active] | the selected columns' fp32 master, m, v ([active][rows]
  //   each) | u32 counts[active] | host arrays: fp32 master, m, v, accumulator(s) ([cols][rows]
  //   each), u32 counts[cols] | the params (rows*cols of the param dtype, registered layout)
  // The same on every space: where an fp32 param is its own master, its selected columns are
  // written as the master (and read back from the params on load). In the manifest of a sharded
  // checkpoint (below) the host arrays are left out: they are in the shards.
  static std::uint64_t matrix_bytes(const Opt& o, std::size_t i, std::uint64_t active, bool host = true) {
    const matrix_param& p = o.matrices_[i];
    const std::uint64_t n = std::uint64_t(p.rows) * p.cols, pb = n * size_of(p.param_type);
    const std::uint64_t h = host && !o.resident(i) ? host_bytes(o, i, p.cols) : 0;
    return 8 + 4 * active + 12 * active * p.rows + 4 * active + h + pb;
  }
  // The host arrays of `cols` columns of matrix i: master, m, v, the accumulator(s), the counts.
  static std::uint64_t host_bytes(const Opt& o, std::size_t i, std::uint64_t cols) {
    const std::uint64_t accs = o.cfg_.overlap_step ? 2 : 1;
    return (12 + 4 * accs) * o.matrices_[i].rows * cols + 4 * cols;
  }
  static std::uint64_t vector_bytes(const vector_param& p) { return 12 * std::uint64_t(p.n) + 4 + p.n * size_of(p.param_type); }

  // ---- sharded checkpoints (data parallel) ------------------------------------------------
  // A data-parallel optimizer saves a set of files: each rank writes its shard — the host arrays
  // of its blocks of columns — to <path>.g<generation>.rank<r>-of-<R>, and rank 0 then writes
  // the manifest to <path>: the checkpoint of one process without the host arrays, plus a
  // section naming the set (generation, R, the shards' base name and sizes). Each file is
  // written atomically, and the manifest only once every shard is in place, so until then <path>
  // names the previous, complete set — whichever rank dies whenever. Then, once every rank's
  // renames are durable, every older shard file of that name goes (save_set). Any number of ranks (or one process) can load the set: each reads
  // the manifest and, from the shards whose blocks overlap its own, its columns.
  struct set_info {
    std::uint64_t generation = 0;
    std::uint32_t ranks = 0;
    std::string base;                    // the manifest's file name when it was written
    std::vector<std::uint64_t> sizes;    // of each shard file
    std::vector<std::uint64_t> digests;  // of each shard file (ckpt::digest_step)
  };
  static constexpr std::uint32_t max_shards = 1u << 16;
  static constexpr std::size_t max_base = 4096;
  // The shards section's largest size.
  static constexpr std::uint64_t max_set_info = 16 + max_base + 16 * std::uint64_t(max_shards);

  static std::string dir_of(const std::string& path) {
    const std::size_t slash = path.find_last_of('/');
    return slash == std::string::npos ? std::string() : path.substr(0, slash + 1);
  }
  static std::string base_of(const std::string& path) { return path.substr(dir_of(path).size()); }
  static std::string shard_path(const std::string& dir, const std::string& base, std::uint64_t generation, int r,
                                int ranks) {
    return dir + base + ".g" + std::to_string(generation) + ".rank" + std::to_string(r) + "-of-" + std::to_string(ranks);
  }

  static void write_set_info(ckpt::writer& w, const set_info& s) {
    w.put(s.generation);
    w.put(s.ranks);
    w.put<std::uint32_t>(std::uint32_t(s.base.size()));
    w.bytes(s.base.data(), s.base.size());
    for (std::uint64_t b : s.sizes) w.put(b);
    for (std::uint64_t d : s.digests) w.put(d);
  }
  template <class Bad>
  static set_info read_set_info(ckpt::reader& r, Bad bad) {
    set_info s;
    s.generation = r.template get<std::uint64_t>();
    s.ranks = r.template get<std::uint32_t>();
    const auto len = r.template get<std::uint32_t>();
    if (s.ranks == 0 || s.ranks > max_shards || len == 0 || len > max_base) bad("shards section is inconsistent");
    s.base.resize(len);
    r.bytes(s.base.data(), len);
    // (a NUL would end the name early where the file is opened: another file's)
    if (s.base.find_first_of(std::string_view("/\0", 2)) != std::string::npos || s.base == "." || s.base == "..")
      bad("shards section is inconsistent");
    s.sizes.resize(s.ranks);
    for (auto& b : s.sizes) b = r.template get<std::uint64_t>();
    s.digests.resize(s.ranks);
    for (auto& d : s.digests) d = r.template get<std::uint64_t>();
    r.done();
    return s;
  }
  // The regular files dir/base.gN.rankR-of-M (R, M: digits; none if the directory cannot be
  // listed), and the temporary files of such shards (a save killed while writing them left
  // them: .tmp.<pid>.<n> after the name).
  struct shard_file {
    std::uint64_t generation;
    std::uint64_t rank;
    std::string path;
  };
  // (*error: why the directory could not be listed whole, if it could not)
  static std::vector<shard_file> shard_files(const std::string& dir, const std::string& base,
                                             std::error_code* error = nullptr) {
    std::vector<shard_file> out;
    std::error_code ec;
    const std::string prefix = base + ".g";
    auto number = [](std::string_view s, std::size_t& k, std::uint64_t& v) {
      const std::size_t k0 = k;
      for (v = 0; k < s.size() && s[k] >= '0' && s[k] <= '9' && v < (std::uint64_t(1) << 59); ++k)
        v = v * 10 + std::uint64_t(s[k] - '0');
      return k > k0;
    };
    ckpt::for_each_name(dir, [&](std::string_view name) {
      if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return;
      std::size_t k = prefix.size();
      std::uint64_t g = 0, r = 0, m = 0;
      if (!number(name, k, g) || name.compare(k, 5, ".rank") != 0) return;
      k += 5;
      if (!number(name, k, r) || name.compare(k, 4, "-of-") != 0) return;
      k += 4;
      if (!number(name, k, m)) return;
      if (k != name.size()) {  // a temporary file: .tmp.<digits>.<digits>, exactly
        std::uint64_t x = 0;
        if (name.compare(k, 5, ".tmp.") != 0) return;
        k += 5;
        if (!number(name, k, x) || k >= name.size() || name[k] != '.') return;
        ++k;
        if (!number(name, k, x) || k != name.size()) return;
      }
      std::string file = dir + std::string(name);
      std::error_code fec;
      if (!std::filesystem::is_regular_file(file, fec)) return;
      out.push_back({g, r, std::move(file)});
    }, ec);
    if (error) *error = ec;
    return out;
  }
  // Removes the shard files of the sets saved at `path` that pick(f) chooses, after a save that
  // succeeded: a listing that fails (out of memory; the names made here included) leaves them for
  // the next save, rather than fail a save that is done.
  template <class Pick>
  static void remove_shards(const std::string& path, Pick&& pick) noexcept {
    try {
      for (const shard_file& f : shard_files(dir_of(path), base_of(path)))
        if (pick(f)) std::remove(f.path.c_str());
    } catch (const std::exception&) {
    }
  }
  // The highest generation N among the shard files of base in dir (0 if none; a temporary one
  // counts too: its generation is never reused); nothing if the directory cannot be listed whole
  // (*error says why).
  static std::optional<std::uint64_t> highest_generation(const std::string& dir, const std::string& base,
                                                         std::error_code& error) {
    std::uint64_t high = 0;
    for (const shard_file& f : shard_files(dir, base, &error)) high = std::max(high, f.generation);
    if (error) return std::nullopt;
    return high;
  }
  // The set a manifest at `path` names, if `path` is a readable manifest (else nothing).
  static std::optional<set_info> set_at(const std::string& path) {
    try {
      ckpt::input in(path);
      if (ckpt::read_header(in) < 4) return std::nullopt;
      for (std::size_t k = 0; k < 3; ++k) {  // (config, layout, counters: skipped)
        const std::uint64_t len = ckpt::read_section_header(in, k).len;
        in.seek(in.offset() + len + 4);
      }
      const ckpt::section_header h = ckpt::read_section_header(in, 3);
      if (h.tag != ckpt::shards_tag || h.len > max_set_info) return std::nullopt;
      std::vector<unsigned char> data(std::size_t(h.len));
      ckpt::section_in r(in, h.len, 3);
      r.bytes(data.data(), data.size());
      r.finish();
      ckpt::reader rd(data.data(), data.size(), "shards");
      return read_set_info(rd, [&](const std::string& why) { in.fail(why); });
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }

  // The complete state (see optimizer::save), written atomically. One process: one file, at
  // `path`, streamed (host arrays go to the file from where they are, device arrays through one
  // bounded buffer). Data parallel: a set of shards and a manifest (above); every rank throws
  // if any file could not be written, and <path> keeps naming the previous set. The optimizer
  // has finished any host update in flight.
  static void save(Opt& o, const std::string& path) {
    if constexpr (Opt::data_parallel) {
      save_set(o, path);
    } else {
      // a sharded set that <path> named before is no longer named by anything: its shards go
      // (once the new file's rename is durable)
      if (write(o, path, nullptr)) remove_shards(path, [](const shard_file&) { return true; });
    }
  }

  // A digest of `path` made absolute (lexically: no file-system look-up), to compare the ranks'.
  static std::uint64_t path_digest(const std::string& path) {
    std::string abs;
    try {
      abs = std::filesystem::absolute(std::filesystem::path(path)).lexically_normal().string();
    } catch (const std::filesystem::filesystem_error&) {  // (no working directory: the path as given)
      abs = path;
    }
    return ckpt::fnv1a64(reinterpret_cast<const unsigned char*>(abs.data()), abs.size());
  }

  static void save_set(Opt& o, const std::string& path) {
    auto& comm = o.comm_;
    const int R = comm.size(), rank = comm.rank();
    if (std::uint64_t(R) > max_shards)  // (the same R on every rank: every rank throws here)
      throw std::runtime_error("zenflow: a sharded checkpoint holds at most " + std::to_string(max_shards) +
                               " shards; this job has " + std::to_string(R) + " ranks");
    // The new generation: above the previous set's and above every shard file of this base that
    // any rank finds in its directory (ranks may have file systems of their own: a shard a killed
    // save left on one node is seen by that rank only, and taking rank 0's listing alone would
    // refuse every later save on that rank's file being there), so that a set whose manifest
    // cannot be read (damaged, or an I/O error) never has its shards overwritten. Each rank
    // gathers its listing's bound with its path made absolute (a digest): rank 0's names the
    // manifest and the shards' base, so a rank whose path differs (a relative path from another
    // working directory, say) would write shards the manifest never finds while its clean-up
    // removed the previous set's — every rank refuses instead, before anything is written.
    // A directory a rank cannot list (an I/O error, no permission, no descriptor left) gives no
    // bound (0): a guess could be the current set's, whose shards the new ones would replace.
    // Between collectives nothing is thrown on one rank alone: what fails (an allocation, a
    // listing running out of memory) is caught and voted on, so that every rank refuses at the
    // same point instead of leaving the others waiting in the next collective.
    std::vector<std::size_t> counts;
    std::vector<std::uint64_t> gen;
    std::error_code unlisted;
    std::exception_ptr early;
    try {
      counts.assign(std::size_t(R), 16);
      gen.assign(2 * std::size_t(R), 0);
      std::uint64_t& bound = gen[2 * std::size_t(rank)];
      if (const auto high = highest_generation(dir_of(path), base_of(path), unlisted)) {
        bound = *high + 1;
        if (rank == 0)
          if (const auto old = set_at(path)) bound = std::max(bound, old->generation + 1);
      }
      gen[2 * std::size_t(rank) + 1] = path_digest(path);
    } catch (...) {
      early = std::current_exception();
    }
    if (!comm.all_agree(!early)) {
      if (early) std::rethrow_exception(early);
      throw std::runtime_error("zenflow: save(" + path + ") refused on every rank: another rank failed before "
                               "anything was written (it threw its error); the previous checkpoint stands");
    }
    o.all_gather_host(gen.data(), counts.data());
    std::uint64_t generation = 0;
    for (int r = 0; r < R; ++r) {
      const std::uint64_t bound = gen[2 * std::size_t(r)];
      if (bound == 0)
        throw std::runtime_error("zenflow: save(" + path + ") refused on every rank: rank " + std::to_string(r) +
                                 " could not list the directory of " + path +
                                 (r == rank && unlisted ? " (" + unlisted.message() + ")" : std::string()) +
                                 " (a new set's generation must be above every shard file there); nothing was "
                                 "written, the previous checkpoint stands");
      generation = std::max(generation, bound);
    }
    for (int r = 1; r < R; ++r)
      if (gen[2 * std::size_t(r) + 1] != gen[1])
        throw std::invalid_argument("zenflow: save(" + path + ") refused on every rank: rank " + std::to_string(r) +
                                    "'s path names another file than rank 0's (every rank must pass the same path, "
                                    "naming the same place: made absolute, they differ); nothing was written");
    std::string dir, base, mine;
    std::exception_ptr failed;
    bool wrote = false;    // (only a shard this call wrote is removed when the save gives up)
    bool durable = false;  // this rank's renames, its shard's and rank 0's manifest's, synced
    // each rank's shard: its size and digest, gathered for the manifest
    std::vector<std::uint64_t> shards;
    try {
      dir = dir_of(path);
      base = base_of(path);
      mine = shard_path(dir, base, generation, rank, R);
      shards.assign(2 * std::size_t(R), 0);
      // A new generation has no files yet; one there already (a directory listed in part, or
      // a file made meanwhile) may be a set's that a manifest names: it is not written over.
      std::error_code ec;  // (not found: file_type::not_found; a failed look-up: file_type::none)
      if (std::filesystem::symlink_status(mine, ec).type() != std::filesystem::file_type::not_found)
        throw std::runtime_error("zenflow: " + mine + " exists already (or cannot be looked up), though its generation " +
                                 std::to_string(generation) + " should be new; nothing was written over it");
      const auto [size, digest, synced] = write_shard(o, mine, generation, path);
      wrote = true;
      durable = synced;
      shards[2 * std::size_t(rank)] = size;
      shards[2 * std::size_t(rank) + 1] = digest;
    } catch (...) {
      failed = std::current_exception();
    }
    auto give_up = [&](const char* what) {
      if (wrote) std::remove(mine.c_str());
      if (failed) std::rethrow_exception(failed);
      throw std::runtime_error(std::string("zenflow: ") + what + " of checkpoint " + path +
                               " could not be written; the previous checkpoint stands");
    };
    if (!comm.all_agree(!failed)) give_up("a shard");
    for (auto& c : counts) c = 16;
    o.all_gather_host(shards.data(), counts.data());
    if (rank == 0) {
      try {
        set_info info{generation, std::uint32_t(R), base, {}, {}};
        for (int r = 0; r < R; ++r) {
          info.sizes.push_back(shards[2 * std::size_t(r)]);
          info.digests.push_back(shards[2 * std::size_t(r) + 1]);
        }
        durable = write(o, path, &info) && durable;
      } catch (...) {
        failed = std::current_exception();
      }
    }
    if (!comm.all_agree(!failed)) give_up("the manifest");
    // (a rename whose directory could not be synced might not survive a crash: then the older
    // shards stay, for the next save to remove)
    if (!comm.all_agree(durable)) return;
    // <path> names the new set: every older shard of this base goes — the previous set's, any
    // that a save interrupted after its manifest was written (a rank killed while removing the
    // previous set's shards) left behind, and the temporary files of shards that a rank killed
    // while writing them left. Each rank removes the files of its rank number, rank 0 also those
    // of ranks beyond R (a previous set of more ranks), so that ranks on file systems of their
    // own clean up theirs.
    // (after the last collective: remove_shards fails no rank's save alone)
    remove_shards(path, [&](const shard_file& f) {
      return f.generation < generation && (f.rank == std::uint64_t(rank) || (rank == 0 && f.rank >= std::uint64_t(R)));
    });
  }

  // This rank's shard: a header section (generation, rank, R, matrix count), then, for each
  // matrix with host state, its block's host arrays. Returns the file's size and digest, and
  // whether its rename is durable.
  // (named: the checkpoint's path, as the save was called, for a message)
  static std::tuple<std::uint64_t, std::uint64_t, bool> write_shard(Opt& o, const std::string& path,
                                                                     std::uint64_t generation, const std::string& named) {
    ckpt::writer head;
    head.put(generation);
    head.put<std::uint32_t>(std::uint32_t(o.comm_.rank()));
    head.put<std::uint32_t>(std::uint32_t(o.comm_.size()));
    head.put<std::uint64_t>(o.matrices_.size());
    std::uint32_t sections = 1;
    for (std::size_t i = 0; i < o.matrices_.size(); ++i) sections += o.host_.matrix(i).on_host ? 1 : 0;
    ckpt::file_writer f(path, sections);
    f.section(ckpt::shard_tag, head);
    std::uint64_t size = 24 + 20 + head.data().size();
    value_check check;
    for (std::size_t i = 0; i < o.matrices_.size(); ++i) {
      const auto& h = o.host_.matrix(i);
      if (!h.on_host) continue;
      f.begin(ckpt::block_tag, host_bytes(o, i, h.cols));
      write_host_arrays(o, f, h, check, i);
      f.end();
      size += 20 + host_bytes(o, i, h.cols);
    }
    check.refuse_if_bad(named);
    const bool durable = f.commit();
    return {size, f.digest(), durable};
  }

  // What load refuses as a state no run reaches, refused by save before the rename instead (save
  // would otherwise replace a good checkpoint with one that cannot be loaded): fp32 masters,
  // moments, accumulators that are not finite, second moments below 0, accumulators that break
  // their rule (acc_rule), params that are NaN. They come from a param that was not finite at
  // initialize() (its master is taken from it) or that the trainer wrote since (an fp32 param
  // is its selected columns' master); an accumulator breaking its rule, only from a fault of
  // this library (its schedule keeps it). The first offender is named.
  // The one test of a stored fp32 value, load's (floats_ok) and save's (value_check) alike, so
  // that save refuses exactly what load would: finite, and (a second moment) not negative.
  static bool value_ok(float x, bool second_moment) noexcept {
    return std::fabs(x) <= std::numeric_limits<float>::max() && !(second_moment && x < 0.0f);
  }
  // A param of dtype d (its bits at p) that is not NaN: an infinity can be the rounding of a
  // finite master to f16 (or, past bf16's largest, to bf16), a NaN never (it would make every
  // later gradient NaN: every step skipped, for good).
  static bool param_ok(const unsigned char* p, dtype d) noexcept {
    if (d == dtype::f32) {
      float x;
      std::memcpy(&x, p, 4);
      return x == x;
    }
    std::uint16_t b;
    std::memcpy(&b, p, 2);
    return (b & 0x7fffu) <= (d == dtype::bf16 ? 0x7f80u : 0x7c00u);  // (above: exponent all ones, a mantissa)
  }
  // The gradient accumulators' rule, save's and load's: an element is zero where nothing has been
  // added since its column was last cleared — the accumulator not filling (overlap_step's other
  // one, whose host update has finished and cleared it by the time a save or a load runs: both
  // wait for it), every accumulator while no window is open, the selected columns (never
  // accumulated) —; elsewhere it is a sum of `window` steps' gradients, each element of which is
  // at most the applied bound (applied_norm_limit, 2^63 or 2^63 / U) in magnitude, so at most
  // window x that bound. The factor 1.5 covers fp32's rounding of the products and of the running
  // sum ((1 + 2^-24)^window < 1.5 for any window under 6.8 million steps) and keeps the window's
  // mean squared finite in fp32 ((1.5 x 2^63)^2 < 2^128), which a crafted value past it would
  // not: one host update would make that column's v infinite, on a step not reported skipped.
  struct acc_rule {
    std::uint64_t window = 0;  // the open window's applied steps
    unsigned active = 0;       // the accumulator filling
    double bound = 0;          // the largest magnitude where the window's sum may be
    static acc_rule of(const Opt& o, std::uint64_t window, unsigned active) {
      return {window, active, std::min(1.5 * double(window) * o.applied_norm_limit(),
                                       double(std::numeric_limits<float>::max()))};
    }
    // must accumulator `which`'s elements of a column be zero?
    bool zero(unsigned which, bool selected) const noexcept { return which != active || window == 0 || selected; }
    bool ok(float x, bool zero) const noexcept { return zero ? x == 0.0f : std::fabs(x) <= bound; }
    static constexpr const char* broken =
        "a gradient accumulator holds what no run leaves there (a value where the schedule keeps it zero, or one past "
        "the bound of the window's gradients)";
  };
  // The selected columns matrix i has in a state whose first selection was (once) or was not
  // made yet: all k where one was, and from the start in a matrix that lives on the device, else
  // none.
  static std::size_t expected_active(const Opt& o, std::size_t i, bool once) {
    return once || o.resident(i) ? o.updater_.matrix(i).k : 0;
  }
  // Whether the schedule's counters describe a state it reaches ("" if so, else what is wrong):
  // load refuses the others (a resumed run would differ from every real one without an error:
  // a warm-up with an open window delays the first selection, a count past 2^32 - 1 wraps), and
  // save refuses to write one (a fault of this library). With W = full_warm_up_rounds: during the
  // warm-up (applied <= W) nothing of the schedule has happened; after it, the first step has
  // selected if any matrix selects columns, and every selection and window step is one of the
  // applied steps after W.
  static std::string schedule_problem(const Opt& o, std::uint64_t applied, std::uint64_t steps, std::uint64_t selections,
                                      std::uint64_t last_selection, std::uint64_t window, bool once, bool pending,
                                      unsigned acc) {
    const std::uint64_t W = o.cfg_.full_warm_up_rounds;
    // without overlap_step no second accumulator and no host update pending across a step; an
    // open window always shorter than a fixed update_interval
    if (!o.cfg_.overlap_step && acc != 0) return "selects the second accumulator, which only overlap_step uses";
    if (!o.cfg_.overlap_step && pending) return "has a host update pending, which only overlap_step leaves";
    if (!o.cfg_.update_interval.automatic && window >= o.cfg_.update_interval.steps)
      return "has an open window of " + std::to_string(window) + " steps; update_interval is " +
             std::to_string(o.cfg_.update_interval.steps);
    if (applied > Opt::max_applied_steps)
      return "has " + std::to_string(applied) + " applied steps; a run applies at most " +
             std::to_string(Opt::max_applied_steps) + " (a column's Adam count has 32 bits)";
    if (steps > std::numeric_limits<std::uint64_t>::max() / 2) return "has a step count no run reaches";
    if (applied <= W) {
      if (window != 0 || once || selections != 0 || last_selection != 0 || pending)
        return "has a selection, an open window or a host update pending during the warm-up";
      return "";
    }
    if (once != o.any_selected_)
      return once ? "has a selection made, though no matrix selects columns"
                  : "has no selection made after the warm-up, whose next step makes one";
    if (once ? !(last_selection > W && selections >= 1 && selections <= applied - W)
             : (selections != 0 || last_selection != 0))
      return "has selections inconsistent with its applied steps";
    if (window > applied - W) return "has an open window longer than the steps since the warm-up";
    if (!o.cfg_.update_interval.automatic) {
      // a fixed update_interval U ends a window at every U-th applied step after the warm-up, and
      // a selection is made only where a window begins
      const std::uint64_t U = o.cfg_.update_interval.steps;
      if (window != (applied - W) % U)
        return "has an open window of " + std::to_string(window) + " steps; " + std::to_string(applied - W) +
               " applied steps after the warm-up with update_interval " + std::to_string(U) + " leave " +
               std::to_string((applied - W) % U);
      if (once && (last_selection - W - 1) % U != 0)
        return "has its last selection at applied step " + std::to_string(last_selection) +
               ", where no window begins (update_interval " + std::to_string(U) + ")";
    }
    return "";
  }
  // Save's check of the same: the counters, each matrix's selected columns, each vector's count.
  static std::string state_problem(const Opt& o) {
    std::string why = schedule_problem(o, o.applied_, o.steps_, o.selections_, o.last_selection_, o.window_steps_,
                                       o.selected_once_, o.pending_, unsigned(o.active_acc_));
    if (!why.empty()) return "its counters: the state " + why;
    for (std::size_t i = 0; i < o.matrices_.size(); ++i)
      if (o.updater_.matrix(i).active != expected_active(o, i, o.selected_once_))
        return "matrix " + std::to_string(i) + "'s selection is inconsistent with its counters";
    for (std::size_t i = 0; i < o.vectors_.size(); ++i)
      if (o.updater_.vector(i).count != o.applied_)
        return "vector " + std::to_string(i) + "'s Adam count is not the applied steps";
    return "";
  }
  // The selected columns of a matrix as a map over its `cols` columns.
  static std::vector<char> selected_map(const std::uint32_t* list, std::size_t n, std::size_t cols) {
    std::vector<char> m(cols, 0);
    for (std::size_t s = 0; s < n; ++s) m[list[s]] = 1;
    return m;
  }
  struct value_check {
    std::string bad;  // "matrix 3 holds ...", empty while every value checked was fine
    // fp32 masters or moments (second_moment: v)
    void operator()(const void* p, std::size_t count, bool second_moment, const char* kind, std::size_t index) {
      if (!bad.empty()) return;
      const auto* x = static_cast<const float*>(p);
      // (no early exit, so that it vectorises: a save scans all of its state once more)
      unsigned wrong = 0;
      for (std::size_t k = 0; k < count; ++k) wrong |= unsigned(!value_ok(x[k], second_moment));
      if (wrong) fail(kind, index, "a master, moment or accumulator that is not finite");
    }
    // params of dtype d
    void params(const void* p, std::size_t count, dtype d, const char* kind, std::size_t index) {
      if (!bad.empty()) return;
      const auto* b = static_cast<const unsigned char*>(p);
      const std::size_t es = size_of(d);
      unsigned wrong = 0;
      for (std::size_t k = 0; k < count; ++k) wrong |= unsigned(!param_ok(b + k * es, d));
      if (wrong) fail(kind, index, "a param that is NaN (written by the trainer since initialize()?)");
    }
    // accumulator `which` of a block of `cols` columns of `rows`, whose columns' selection is sel
    void accumulator(const float* a, std::size_t rows, std::size_t cols, const char* sel, unsigned which,
                     const acc_rule& rule, std::size_t index) {
      if (!bad.empty()) return;
      unsigned wrong = 0, infinite = 0;
      for (std::size_t c = 0; c < cols; ++c) {
        const bool zero = rule.zero(which, sel[c] != 0);
        for (std::size_t r = 0; r < rows; ++r) {
          const float x = a[c * rows + r];
          wrong |= unsigned(!rule.ok(x, zero));
          infinite |= unsigned(!value_ok(x, false));
        }
      }
      if (infinite) fail("matrix", index, "a master, moment or accumulator that is not finite");
      else if (wrong)
        fail("matrix", index,
             "a gradient accumulator that breaks its rule (a value where the schedule keeps it zero, or one past the "
             "bound of the window's gradients: a fault of zenflow)");
    }
    void fail(const char* kind, std::size_t index, const char* what) {
      bad = std::string(kind) + " " + std::to_string(index) + " holds " + what;
    }
    void refuse_if_bad(const std::string& path) const {
      if (bad.empty()) return;
      throw std::runtime_error("zenflow: save(" + path + ") refused: " + bad +
                               "; a load would refuse the checkpoint, so it was not saved and the previous one stands");
    }
  };

  template <class File, class State>
  static void write_host_arrays(const Opt& o, File& f, const State& h, value_check& check, std::size_t matrix) {
    const std::size_t n = h.rows * h.cols;
    for (const float* a : {h.master.data(), h.exp_avg.data(), h.exp_avg_sq.data()}) {
      check(a, n, a == h.exp_avg_sq.data(), "matrix", matrix);
      f.bytes(a, 4 * n);
    }
    // (this rank's block of the matrix's columns: from col_begin on)
    const std::vector<char> sel = selected_map(o.selected_[matrix].data(), o.selected_[matrix].size(),
                                               o.matrices_[matrix].cols);
    const char* block = sel.data() + o.col_begin(matrix, o.comm_.rank());
    const acc_rule rule = acc_rule::of(o, o.window_steps_, unsigned(o.active_acc_));
    for (unsigned j = 0; j < (o.cfg_.overlap_step ? 2u : 1u); ++j) {
      check.accumulator(h.acc[j].data(), h.rows, h.cols, block, j, rule, matrix);
      f.bytes(h.acc[j].data(), 4 * n);
    }
    f.bytes(h.counts.data(), 4 * h.cols);
  }

  // One process's checkpoint at `path`; with `set`, the manifest of a sharded one instead (no
  // host arrays; a shards section after the counters).
  static bool write(Opt& o, const std::string& path, const set_info* set) {
    if (const std::string why = state_problem(o); !why.empty())
      throw std::logic_error("zenflow: save(" + path + ") refused: " + why +
                             " (a fault of zenflow); a load would refuse the checkpoint, so it was not saved and the "
                             "previous one stands");
    ckpt::writer conf, lay, cnt;
    write_config(conf, o.cfg_);
    lay.put<std::uint64_t>(o.matrices_.size());
    for (std::size_t i = 0; i < o.matrices_.size(); ++i) {
      const matrix_param& p = o.matrices_[i];
      lay.put<std::uint64_t>(p.rows);
      lay.put<std::uint64_t>(p.cols);
      lay.put<std::uint8_t>(std::uint8_t(p.param_type));
      lay.put<std::uint8_t>(std::uint8_t(p.grad_type));
      lay.put<std::uint8_t>(std::uint8_t(p.layout));
      lay.put<std::uint64_t>(o.updater_.matrix(i).k);
    }
    lay.put<std::uint64_t>(o.vectors_.size());
    for (const vector_param& p : o.vectors_) {
      lay.put<std::uint64_t>(p.n);
      lay.put<std::uint8_t>(std::uint8_t(p.param_type));
      lay.put<std::uint8_t>(std::uint8_t(p.grad_type));
    }
    const auto st = o.stats();
    const std::uint64_t host_ns = o.host_ns_.load();
    const std::uint64_t counters[] = {o.applied_,         o.steps_,          o.skipped_,        o.selections_,
                                      o.host_updates_,    o.last_selection_, o.window_steps_,   st.bytes_to_host,
                                      st.bytes_to_device, host_ns};
    for (std::uint64_t v : counters) cnt.put(v);
    cnt.put<double>(st.stall_seconds);
    cnt.put<std::uint8_t>(o.selected_once_);
    cnt.put<std::uint8_t>(o.pending_);
    cnt.put<std::uint8_t>(std::uint8_t(o.active_acc_));
    cnt.put<std::uint64_t>(o.auto_a_.size());
    for (std::size_t i = 0; i < o.auto_a_.size(); ++i) {
      cnt.put(o.auto_a_[i]);
      cnt.put(o.auto_b_[i]);
    }
    // the communication counters (version 3)
    const std::uint64_t comm_counts[] = {st.bytes_reduced, st.bytes_gathered, o.reduce_ns_, st.bytes_uploaded_ahead};
    for (std::uint64_t v : comm_counts) cnt.put(v);
    ckpt::file_writer f(path, std::uint32_t((set ? 4 : 3) + o.matrices_.size() + o.vectors_.size()));
    f.section(ckpt::config_tag, conf);
    f.section(ckpt::layout_tag, lay);
    f.section(ckpt::counters_tag, cnt);
    if (set) {
      ckpt::writer sh;
      write_set_info(sh, *set);
      f.section(ckpt::shards_tag, sh);
    }
    std::vector<unsigned char> buf;
    value_check check;
    // (kind: 0 nothing checked, 1 finite fp32s, 2 finite fp32s >= 0, 3 params of dtype d, none
    // NaN; of tensor `what` `index`)
    auto from_device = [&](const void* src, std::size_t bytes, int kind = 0, const char* what = "", std::size_t index = 0,
                           dtype d = dtype::f32) {
      const auto* at = static_cast<const unsigned char*>(src);
      buf.resize(std::min(bytes, ckpt::stream_chunk));  // (a multiple of 4)
      for (std::size_t off = 0; off < bytes; off += buf.size()) {
        const std::size_t m = std::min(buf.size(), bytes - off);
        o.space_.download(buf.data(), at + off, m);
        if (kind == 3) check.params(buf.data(), m / size_of(d), d, what, index);
        else if (kind) check(buf.data(), m / 4, kind == 2, what, index);
        f.bytes(buf.data(), m);
      }
    };
    // device memory through which an fp32 param's selected columns are gathered (its master)
    typename std::remove_reference_t<decltype(o.space_)>::template buffer<unsigned char> gather;
    for (std::size_t i = 0; i < o.matrices_.size(); ++i) {
      const matrix_param& p = o.matrices_[i];
      const auto& d = o.updater_.matrix(i);
      const auto& h = o.host_.matrix(i);
      const std::size_t n = p.rows * p.cols, ks = d.active * p.rows, pb = n * size_of(p.param_type);
      f.begin(ckpt::matrix_tag, matrix_bytes(o, i, d.active, !set));
      f.put<std::uint64_t>(d.active);
      f.bytes(o.selected_[i].data(), 4 * d.active);
      if (d.param_master) {  // the selected columns of the param, gathered a chunk at a time
        const std::size_t chunk = std::max<std::size_t>(1, ckpt::stream_chunk / (4 * p.rows));
        if (gather.size() < 4 * std::min(chunk, d.active) * p.rows)
          gather = decltype(gather)(4 * std::min(chunk, d.active) * p.rows);
        for (std::size_t c0 = 0; c0 < d.active; c0 += chunk) {
          const std::size_t m = std::min(chunk, d.active - c0);
          o.space_.compact_columns(p.param, dtype::f32, p.layout, p.rows, p.cols, d.columns[d.cur].data() + c0, m,
                                   gather.data());
          from_device(gather.data(), 4 * m * p.rows, 1, "matrix", i);
        }
      } else {
        from_device(d.master[d.cur].data(), 4 * ks, 1, "matrix", i);
      }
      from_device(d.exp_avg[d.cur].data(), 4 * ks, 1, "matrix", i);
      from_device(d.exp_avg_sq[d.cur].data(), 4 * ks, 2, "matrix", i);
      from_device(d.counts[d.cur].data(), 4 * d.active);
      if (h.on_host && !set) write_host_arrays(o, f, h, check, i);
      // (an fp32 param that is its own master: load checks it whole, its host columns too; any
      // other param: not NaN)
      from_device(p.param, pb, d.param_master ? 1 : 3, "matrix", i, p.param_type);
      f.end();
    }
    for (std::size_t i = 0; i < o.vectors_.size(); ++i) {
      const vector_param& p = o.vectors_[i];
      const auto& v = o.updater_.vector(i);
      f.begin(ckpt::vector_tag, vector_bytes(p));
      from_device(v.param_master ? p.param : v.master.data(), 4 * p.n, 1, "vector", i);
      from_device(v.exp_avg.data(), 4 * p.n, 1, "vector", i);
      from_device(v.exp_avg_sq.data(), 4 * p.n, 2, "vector", i);
      f.put<std::uint32_t>(v.count);
      from_device(p.param, p.n * size_of(p.param_type), v.param_master ? 1 : 3, "vector", i, p.param_type);
      f.end();
    }
    check.refuse_if_bad(path);
    return f.commit();
  }

  // A registration's dtypes (and layout) as a message names them; a value no zenflow writes, as
  // its number.
  static std::string describe(std::uint8_t param_type, std::uint8_t grad_type, int layout = -1) {
    auto type = [](std::uint8_t t) {
      return t <= std::uint8_t(dtype::f16) ? std::string(name_of(dtype(t))) : "dtype " + std::to_string(t);
    };
    std::string s = "param " + type(param_type) + ", grad " + type(grad_type);
    if (layout == int(matrix_layout::column_contiguous)) s += ", column_contiguous";
    else if (layout == int(matrix_layout::row_major)) s += ", row_major";
    else if (layout >= 0) s += ", layout " + std::to_string(layout);
    return s;
  }

  // Checks a checkpoint against this optimizer and, only if everything holds, restores it (see
  // optimizer::load). Two passes over the input through bounded buffers: the first reads the
  // header, the small sections (config, layout, counters; their sizes are known, so the file's
  // total size is checked before any payload is read) and streams every payload through its
  // checksum, keeping only what the checks need (column lists, counts); the second commits,
  // reading each array straight into place. A file that changes between the passes (written in
  // place while loading) fails the second pass's checksums, or their comparison with the first
  // pass's (a rewrite with another valid checkpoint of the same shape): the state is then half-restored,
  // and the optimizer refuses further work until a load succeeds.
  static void load(Opt& o, ckpt::input& in) {
    auto bad = [&](const std::string& why) -> void { in.fail(why); };
    const std::size_t nm = o.matrices_.size(), nv = o.vectors_.size();
    const std::size_t want = 3 + nm + nv;
    const std::uint32_t count = ckpt::read_header(in);
    // one process's checkpoint, or the manifest of a sharded one (a shards section more)
    const bool sharded = count == want + 1;
    if (count != want && !sharded)
      bad("has " + std::to_string(count) + " sections, this optimizer needs " + std::to_string(want) +
          " (a different number of registered parameters?)");
    const std::size_t first = sharded ? 4 : 3;  // the first matrix section
    std::vector<unsigned char> buf;
    // a small section, whole, its checksum checked; at most `cap` bytes
    auto small = [&](std::size_t index, std::uint32_t t, const char* what, std::uint64_t cap) {
      const ckpt::section_header h = ckpt::read_section_header(in, index);
      if (h.tag != t) bad("section " + std::to_string(index) + " should be the " + what + " section");
      if (h.len > cap && t == ckpt::layout_tag && h.len >= 16) {
        // a layout longer than this optimizer's can be: a file of more tensors (one more vector
        // than here looks like a sharded set's section count); its counts, for the message, from
        // its first field and its length (only the message uses them: the file is refused)
        unsigned char head[8];
        ckpt::section_in r(in, h.len, index);
        r.bytes(head, sizeof head);
        ckpt::reader rh(head, sizeof head, what);
        const std::uint64_t fm = rh.get<std::uint64_t>();
        auto tensors = [](std::uint64_t m, std::uint64_t v) {
          return std::to_string(m) + (m == 1 ? " matrix and " : " matrices and ") + std::to_string(v) +
                 (v == 1 ? " vector" : " vectors");
        };
        if (fm <= (h.len - 16) / 27 && (h.len - 16 - 27 * fm) % 10 == 0)
          bad("registers " + tensors(fm, (h.len - 16 - 27 * fm) / 10) + ", this optimizer " + tensors(nm, nv) +
              " (a different number of registered parameters)");
      }
      if (h.len > cap) bad(std::string(what) + " section has the wrong size");
      std::vector<unsigned char> data(std::size_t(h.len));
      ckpt::section_in r(in, h.len, index);
      r.bytes(data.data(), data.size());
      r.finish();
      return data;
    };
    // config: everything but lr and host_threads must agree
    ckpt::writer conf_here;
    write_config(conf_here, o.cfg_);
    const auto conf = small(0, ckpt::config_tag, "config", conf_here.data().size());
    ckpt::reader rc(conf.data(), conf.size(), "config");
    const config fc = read_config(rc);
    rc.done();
    compare_config(o.cfg_, fc, bad);
    // registrations
    const auto lay = small(1, ckpt::layout_tag, "layout", 16 + 27 * std::uint64_t(nm) + 10 * std::uint64_t(nv));
    ckpt::reader rl(lay.data(), lay.size(), "layout");
    if (rl.get<std::uint64_t>() != nm) bad("registers a different number of matrices");
    for (std::size_t i = 0; i < nm; ++i) {
      const matrix_param& p = o.matrices_[i];
      const auto rows = rl.get<std::uint64_t>(), cols = rl.get<std::uint64_t>();
      const auto pt = rl.get<std::uint8_t>(), gt = rl.get<std::uint8_t>(), lo = rl.get<std::uint8_t>();
      const auto k = rl.get<std::uint64_t>();
      if (rows != p.rows || cols != p.cols || pt != std::uint8_t(p.param_type) || gt != std::uint8_t(p.grad_type) ||
          lo != std::uint8_t(p.layout) || k != o.updater_.matrix(i).k)
        bad("matrix " + std::to_string(i) + " is " + std::to_string(rows) + "x" + std::to_string(cols) + " (" +
            describe(pt, gt, lo) + ") in the file, " + std::to_string(p.rows) + "x" + std::to_string(p.cols) + " (" +
            describe(std::uint8_t(p.param_type), std::uint8_t(p.grad_type), std::uint8_t(p.layout)) + ") here");
    }
    if (rl.get<std::uint64_t>() != nv) bad("registers a different number of vectors");
    for (std::size_t i = 0; i < nv; ++i) {
      const auto n = rl.get<std::uint64_t>();
      const auto pt = rl.get<std::uint8_t>(), gt = rl.get<std::uint8_t>();
      const vector_param& v = o.vectors_[i];
      if (n != v.n || pt != std::uint8_t(v.param_type) || gt != std::uint8_t(v.grad_type))
        bad("vector " + std::to_string(i) + " has " + std::to_string(n) + " elements (" + describe(pt, gt) +
            ") in the file, " + std::to_string(v.n) + " (" +
            describe(std::uint8_t(v.param_type), std::uint8_t(v.grad_type)) + ") here");
    }
    rl.done();
    try {  // the file's lr under this optimizer's parameter groups (not stored in the file)
      o.check_lr(fc.adam.lr);
    } catch (const std::invalid_argument& e) {
      bad(std::string("its lr does not fit this optimizer (") + e.what() + ")");
    }
    // counters
    const auto cnt = small(2, ckpt::counters_tag, "counters", 131 + 16 * std::uint64_t(nm));
    ckpt::reader rn(cnt.data(), cnt.size(), "counters");
    std::uint64_t c[10];
    for (auto& v : c) v = rn.get<std::uint64_t>();
    const double stall = rn.get<double>();
    const auto sel_once = rn.get<std::uint8_t>(), pend = rn.get<std::uint8_t>(), acc = rn.get<std::uint8_t>();
    const auto na = rn.get<std::uint64_t>();
    // (applied + skipped == steps, written so that no sum wraps)
    if (sel_once > 1 || pend > 1 || acc > 1 || (na != 0 && na != nm) || c[2] > c[1] || c[0] != c[1] - c[2] ||
        c[6] > c[0] || c[5] > c[0] || !(stall >= 0 && std::isfinite(stall)))
      bad("counters section is inconsistent");
    if (const std::string why = schedule_problem(o, c[0], c[1], c[3], c[5], c[6], sel_once, pend, acc); !why.empty())
      bad("counters section " + why);
    std::vector<double> aa(na), ab(na);
    for (std::size_t i = 0; i < na; ++i) {
      aa[i] = rn.get<double>();
      ab[i] = rn.get<double>();
      // (a NaN sum would never close Zen-auto's window again)
      if (!std::isfinite(aa[i]) || !std::isfinite(ab[i])) bad("counters section has a Zen-auto sum that is not finite");
      // (sums of norms times clip factors: never negative in a run)
      if (aa[i] < 0 || ab[i] < 0) bad("counters section has a negative Zen-auto sum");
    }
    std::uint64_t comm_counts[4];  // bytes reduced, gathered, reduction ns, bytes uploaded ahead
    for (auto& v : comm_counts) v = rn.get<std::uint64_t>();
    rn.done();
    set_info set;
    if (sharded) {
      if (in.from_memory()) bad("is the manifest of a sharded checkpoint: load it from its file, beside its shards");
      const auto sh = small(3, ckpt::shards_tag, "shards", max_set_info);
      ckpt::reader rs(sh.data(), sh.size(), "shards");
      set = read_set_info(rs, bad);
    }
    // The file's size against what this optimizer's checkpoint can be (a matrix section holds its
    // selected columns, none before the first selection), before any payload is read.
    std::uint64_t lo = in.offset(), hi = in.offset();
    for (std::size_t i = 0; i < nm; ++i) {
      // (a matrix with every column selected is placed on the device at initialize: always k)
      const std::uint64_t b = matrix_bytes(o, i, o.updater_.matrix(i).k, !sharded),
                          a = o.resident(i) ? b : matrix_bytes(o, i, 0, !sharded);
      lo += 20 + std::min(a, b);
      hi += 20 + std::max(a, b);
    }
    for (const vector_param& p : o.vectors_) {
      lo += 20 + vector_bytes(p);
      hi += 20 + vector_bytes(p);
    }
    if (in.size() < lo || in.size() > hi)
      bad(std::string(in.size() < lo ? "truncated" : "trailing bytes after the last section") + " (" +
          std::to_string(in.size()) + " bytes; a checkpoint of this optimizer has " +
          (lo == hi ? std::to_string(lo) : "between " + std::to_string(lo) + " and " + std::to_string(hi)) + ")");

    // Pass 1: every payload through its checksum; column lists and counts checked.
    struct placed {
      std::uint64_t at, len;
      std::size_t active;
      std::uint32_t crc;  // pass 1's checksum: pass 2 must read the same section
    };
    std::vector<placed> where;
    // each matrix's selected columns (a map over its columns), for its accumulators' rule
    std::vector<std::vector<char>> selected(nm);
    const acc_rule rule = acc_rule::of(o, c[6], acc);
    // fp32 masters and moments checked finite, v >= 0 (moments_ok), accumulators against their
    // rule, params not NaN, all reported after the section's checksum: a damaged file is called
    // damaged.
    for (std::size_t i = 0; i < nm; ++i) {
      const std::size_t index = first + i;
      const ckpt::section_header h = ckpt::read_section_header(in, index);
      if (h.tag != ckpt::matrix_tag) bad("section " + std::to_string(index) + " should be matrix " + std::to_string(i));
      const matrix_param& p = o.matrices_[i];
      const std::size_t k = o.updater_.matrix(i).k;
      const std::size_t active = h.len == matrix_bytes(o, i, k, !sharded) || o.resident(i) ? k : 0;
      if (h.len != matrix_bytes(o, i, active, !sharded)) bad("matrix " + std::to_string(i) + " section has the wrong size");
      const std::size_t n = p.rows * p.cols;
      const std::size_t accs = o.cfg_.overlap_step ? 2 : 1;
      const bool on_host = !o.resident(i) && !sharded;
      where.push_back({in.offset(), h.len, active, 0});
      ckpt::section_in r(in, h.len, index);
      const auto stored = r.get<std::uint64_t>();
      std::vector<std::uint32_t> cols(active), counts(active), hcounts(p.cols);
      r.bytes(cols.data(), 4 * active);
      // (a column past the matrix is left out of the map: the list is refused below)
      auto& sel = selected[i];
      sel.assign(p.cols, 0);
      for (const std::uint32_t col : cols)
        if (col < p.cols) sel[col] = 1;
      bool finite = moments_ok(r, std::uint64_t(active) * p.rows, buf);
      r.bytes(counts.data(), 4 * active);
      int accs_verdict = 0;
      if (on_host) {
        finite = moments_ok(r, std::uint64_t(n), buf) && finite;
        // (the window's gradient accumulators: a NaN there would reach every host column at the
        // next boundary, on a step not reported skipped; so would a value past their rule's bound)
        accs_verdict = accs_ok(r, p.rows, p.cols, unsigned(accs), sel.data(), rule, buf);
        r.bytes(hcounts.data(), 4 * p.cols);
      } else {
        hcounts.clear();
      }
      // an fp32 param that is its own master: the load takes the master from the param (the
      // copy above is skipped), so the param is what must be finite; any other, not NaN
      bool params_fine = true;
      if (o.updater_.matrix(i).param_master) finite = floats_ok(r, std::uint64_t(n), no_sign_check, buf) && finite;
      else params_fine = params_ok(r, std::uint64_t(n), p.param_type, buf);
      where.back().crc = r.finish();
      if (!finite || accs_verdict == 1)
        bad("matrix " + std::to_string(i) + ": a master, moment or accumulator is not finite, or a second moment is negative");
      if (accs_verdict == 2) bad("matrix " + std::to_string(i) + ": " + acc_rule::broken);
      if (!params_fine) bad("matrix " + std::to_string(i) + ": a param is NaN");
      if (stored != active) bad("matrix " + std::to_string(i) + ": selection size differs");
      if (active != expected_active(o, i, sel_once))
        bad("matrix " + std::to_string(i) + " has " + std::to_string(active) + " selected columns, " +
            (sel_once ? "though a selection was made" : "though no selection was made yet"));
      for (std::size_t s = 0; s < active; ++s)
        if (cols[s] >= p.cols || (s > 0 && cols[s] <= cols[s - 1]))
          bad("matrix " + std::to_string(i) + ": corrupt column list");
      // a column's Adam count can never exceed the number of applied steps
      for (auto x : counts)
        if (x > c[0]) bad("matrix " + std::to_string(i) + ": an Adam count exceeds the applied steps");
      for (auto x : hcounts)
        if (x > c[0]) bad("matrix " + std::to_string(i) + ": an Adam count exceeds the applied steps");
    }
    for (std::size_t i = 0; i < nv; ++i) {
      const std::size_t index = first + nm + i;
      const vector_param& p = o.vectors_[i];
      const ckpt::section_header h = ckpt::read_section_header(in, index);
      if (h.tag != ckpt::vector_tag) bad("section " + std::to_string(index) + " should be vector " + std::to_string(i));
      if (h.len != vector_bytes(p)) bad("vector " + std::to_string(i) + " section has the wrong size");
      where.push_back({in.offset(), h.len, 0, 0});
      ckpt::section_in r(in, h.len, index);
      bool finite = moments_ok(r, std::uint64_t(p.n), buf), params_fine = true;
      const auto vc = r.get<std::uint32_t>();
      if (o.updater_.vector(i).param_master) finite = floats_ok(r, std::uint64_t(p.n), no_sign_check, buf) && finite;
      else params_fine = params_ok(r, std::uint64_t(p.n), p.param_type, buf);
      where.back().crc = r.finish();
      if (!finite) bad("vector " + std::to_string(i) + ": a master or moment is not finite, or a second moment is negative");
      if (!params_fine) bad("vector " + std::to_string(i) + ": a param is NaN");
      // (a vector is updated at every applied step, the warm-up's too)
      if (vc != c[0])
        bad("vector " + std::to_string(i) + ": its Adam count (" + std::to_string(vc) + ") is not the applied steps (" +
            std::to_string(c[0]) + ")");
    }
    if (in.left() != 0) bad("trailing bytes after the last section");
    // the shards this rank reads its columns from, each checked whole
    std::vector<shard_in> shards;
    if (sharded) shards = open_shards(o, in, set, c[0], rule, selected, buf);

    // Room for each selection now, so that the commit allocates nothing (an allocation that
    // failed there would leave the state half loaded; here it leaves the optimizer as it was).
    for (std::size_t i = 0; i < nm; ++i) o.selected_[i].reserve(where[i].active);

    // ---- Pass 2, everything checked (data parallel: on every rank): commit ----
    o.agree_to_commit(in);
    try {
      o.quiesce();
      commit(o, in, first, where, buf);
      for (auto& sh : shards) commit_shard(o, sh, buf);
    } catch (const std::exception& e) {
      o.mark_broken([&] { return std::string("a checkpoint load failed while committing: ") + e.what(); });
      throw;
    }
    o.cfg_.adam.lr = fc.adam.lr;
    o.applied_ = c[0];
    o.steps_ = c[1];
    o.skipped_ = c[2];
    o.selections_ = c[3];
    o.host_updates_ = c[4];
    o.last_selection_ = c[5];
    o.window_steps_ = c[6];
    o.base_to_host_ = o.transport_.bytes_to_host() - c[7];  // o.stats() continues from the saved values
    o.owed_to_host_ = 0;                                     // (the lane is idle: load quiesced it)
    o.base_to_device_ = o.transport_.bytes_to_device() - c[8];
    o.host_ns_ = c[9];
    o.base_stall_ = o.scheduler_.stall_seconds();
    o.stall_carried_ = stall;
    o.setup_sent_ = o.comm_.bytes_sent();  // bytes_reduced continues from the file's
    o.shared_ = comm_counts[0];
    o.gathered_ = comm_counts[1];
    o.reduce_ns_ = comm_counts[2];
    o.ahead_bytes_ = comm_counts[3];
    o.selected_once_ = sel_once;
    o.pending_ = pend;
    o.ahead_filled_ = false;  // a pending update is uploaded from the loaded master, not the device area
    o.active_acc_ = acc;
    o.auto_a_ = std::move(aa);
    o.auto_b_ = std::move(ab);
  }


  // Pass 2 of load: each section read again, straight into the optimizer's arrays (device ones
  // through the bounded buffer), its checksum checked again at the end.
  template <class Placed>
  static void commit(Opt& o, ckpt::input& in, std::size_t first, const std::vector<Placed>& where,
                     std::vector<unsigned char>& buf) {
    const std::size_t nm = o.matrices_.size();
    auto to_device = [&](ckpt::section_in& r, void* dst, std::size_t bytes) {
      auto* at = static_cast<unsigned char*>(dst);
      std::size_t off = 0;
      r.pieces(bytes, buf, [&](const unsigned char* piece, std::size_t m) {
        o.space_.upload(at + off, piece, m);
        off += m;
      });
    };
    for (std::size_t i = 0; i < nm; ++i) {
      const matrix_param& p = o.matrices_[i];
      auto& d = o.updater_.matrix(i);
      auto& h = o.host_.matrix(i);
      const std::size_t active = where[i].active;
      const std::size_t n = p.rows * p.cols, ks = active * p.rows, pb = n * size_of(p.param_type);
      in.seek(where[i].at);
      ckpt::section_in r(in, where[i].len, first + i);
      if (r.get<std::uint64_t>() != active) in.fail("changed while it was being loaded");
      d.cur = 0;
      d.active = active;
      o.selected_[i].assign(active, 0);
      r.bytes(o.selected_[i].data(), 4 * active);
      if (active) o.space_.upload(d.columns[0].data(), o.selected_[i].data(), 4 * active);
      if (d.param_master) r.skip(4 * std::uint64_t(ks), buf);  // the params below hold it
      else to_device(r, d.master[0].data(), 4 * ks);
      to_device(r, d.exp_avg[0].data(), 4 * ks);
      to_device(r, d.exp_avg_sq[0].data(), 4 * ks);
      to_device(r, d.counts[0].data(), 4 * active);
      if (h.on_host && first == 3) read_host_arrays(o, i, r, 0, p.cols, buf);  // (a manifest has none)
      to_device(r, p.param, pb);
      if (r.finish() != where[i].crc) in.fail("changed while it was being loaded (section " + std::to_string(first + i) + ")");
      o.set_unselected(i);
    }
    for (std::size_t i = 0; i < o.vectors_.size(); ++i) {
      const vector_param& p = o.vectors_[i];
      auto& v = o.updater_.vector(i);
      in.seek(where[nm + i].at);
      ckpt::section_in r(in, where[nm + i].len, first + nm + i);
      if (v.param_master) r.skip(4 * std::uint64_t(p.n), buf);  // the param below is the master
      else to_device(r, v.master.data(), 4 * p.n);
      to_device(r, v.exp_avg.data(), 4 * p.n);
      to_device(r, v.exp_avg_sq.data(), 4 * p.n);
      v.count = r.get<std::uint32_t>();
      to_device(r, p.param, p.n * size_of(p.param_type));
      if (r.finish() != where[nm + i].crc)
        in.fail("changed while it was being loaded (section " + std::to_string(first + nm + i) + ")");
    }
    o.space_.fence();
  }

  // `count` fp32 values of a section read through its checksum: are they all finite? (A state
  // holding an infinite v would freeze its column for good — what a step whose gradient would
  // cause it is skipped for —, a NaN would spread; neither can come from save().)
  // Three fp32 arrays of `each` floats (a master, m, v): every value finite, and v's >= 0 (a
  // negative second moment makes the next update's sqrt a NaN, on a step not reported skipped;
  // the arithmetic never produces one).
  static bool moments_ok(ckpt::section_in& r, std::uint64_t each, std::vector<unsigned char>& buf) {
    return floats_ok(r, 3 * each, 2 * each, buf);
  }
  static constexpr std::uint64_t no_sign_check = ~std::uint64_t(0);
  // `count` values of `size` bytes (at most 4) read through the section's checksum, each handed
  // to f (its bytes), in order.
  template <class F>
  static void each_value(ckpt::section_in& r, std::uint64_t count, std::size_t size, std::vector<unsigned char>& buf,
                         F&& f) {
    unsigned char carry[4];
    std::size_t nc = 0;
    r.pieces(size * count, buf, [&](const unsigned char* p, std::size_t m) {
      std::size_t k = 0;
      while (nc > 0 && nc < size && k < m) carry[nc++] = p[k++];  // a value split between pieces
      if (nc == size) {
        f(static_cast<const unsigned char*>(carry));
        nc = 0;
      }
      for (; k + size <= m; k += size) f(p + k);
      while (k < m) carry[nc++] = p[k++];
    });
  }
  // `count` fp32 values read through the section's checksum: every one finite, and those from
  // index v0 on also >= 0 (no_sign_check: none).
  static bool floats_ok(ckpt::section_in& r, std::uint64_t count, std::uint64_t v0, std::vector<unsigned char>& buf) {
    std::uint64_t at = 0;  // the next float's index
    bool ok = true;
    each_value(r, count, 4, buf, [&](const unsigned char* p) {
      float x;
      std::memcpy(&x, p, 4);
      ok = ok && value_ok(x, at >= v0);
      ++at;
    });
    return ok;
  }
  // `count` params of dtype d read through the section's checksum: none NaN (param_ok).
  static bool params_ok(ckpt::section_in& r, std::uint64_t count, dtype d, std::vector<unsigned char>& buf) {
    bool ok = true;
    each_value(r, count, size_of(d), buf, [&](const unsigned char* p) { ok = ok && param_ok(p, d); });
    return ok;
  }
  // The accumulator(s) of a block of `cols` columns of `rows` (accs of them, [cols][rows] each)
  // read through the section's checksum against their rule; sel: the block's columns' selection.
  // 0: fine, 1: a value not finite, 2: a finite value that breaks the rule.
  static int accs_ok(ckpt::section_in& r, std::uint64_t rows, std::uint64_t cols, unsigned accs, const char* sel,
                     const acc_rule& rule, std::vector<unsigned char>& buf) {
    std::uint64_t row = 0, col = 0;
    unsigned which = 0;
    int verdict = 0;
    each_value(r, accs * rows * cols, 4, buf, [&](const unsigned char* p) {
      float x;
      std::memcpy(&x, p, 4);
      if (!value_ok(x, false)) verdict = 1;
      else if (verdict == 0 && !rule.ok(x, rule.zero(which, sel[col] != 0))) verdict = 2;
      if (++row == rows) {
        row = 0;
        if (++col == cols) {
          col = 0;
          ++which;
        }
      }
    });
    return verdict;
  }

  // Host arrays of matrix i's columns [o0, o1), as stored in a section, read where they overlap
  // this rank's block (all of them in one process) into its host state; the rest is skipped.
  static void read_host_arrays(Opt& o, std::size_t i, ckpt::section_in& r, std::uint64_t o0, std::uint64_t o1,
                               std::vector<unsigned char>& buf) {
    auto& h = o.host_.matrix(i);
    const std::uint64_t c0 = o.col_begin(i, o.comm_.rank()), c1 = c0 + h.cols;
    const std::uint64_t lo = std::clamp(c0, o0, o1), hi = std::clamp(c1, lo, o1);
    auto array = [&](void* dst, std::uint64_t per_col) {
      r.skip((lo - o0) * per_col, buf);
      r.bytes(static_cast<unsigned char*>(dst) + (lo - std::min(lo, c0)) * per_col, std::size_t((hi - lo) * per_col));
      r.skip((o1 - hi) * per_col, buf);
    };
    const std::uint64_t col = 4 * std::uint64_t(h.rows);
    for (float* a : {h.master.data(), h.exp_avg.data(), h.exp_avg_sq.data(), h.acc[0].data()}) array(a, col);
    if (o.cfg_.overlap_step) array(h.acc[1].data(), col);
    array(h.counts.data(), 4);
  }

  // A shard of a set that this rank reads from: its file, open from the check to the commit, and
  // where its matrices' sections are (len 0: a matrix without host state).
  struct shard_in {
    std::unique_ptr<ckpt::input> in;
    int rank = 0, ranks = 1;
    struct place {
      std::uint64_t at = 0, len = 0;
      std::uint32_t crc = 0;  // the first pass's checksum: the commit must read the same section
    };
    std::vector<place> where;
  };

  // Opens the shards whose blocks overlap this rank's and checks each whole — size, header,
  // every checksum, finite masters and moments, counts within the applied steps — like a
  // checkpoint's own sections.
  static std::vector<shard_in> open_shards(Opt& o, ckpt::input& manifest, const set_info& set, std::uint64_t applied,
                                           const acc_rule& rule, const std::vector<std::vector<char>>& selected,
                                           std::vector<unsigned char>& buf) {
    const std::size_t nm = o.matrices_.size();
    const int R = int(set.ranks);
    std::vector<shard_in> out;
    auto needed = [&](int s) {
      for (std::size_t i = 0; i < nm; ++i) {
        const auto& h = o.host_.matrix(i);
        const std::uint64_t cols = o.matrices_[i].cols, c0 = o.col_begin(i, o.comm_.rank());
        const std::uint64_t o0 = detail::shard_begin(cols, R, s), o1 = detail::shard_begin(cols, R, s + 1);
        if (h.on_host && std::max(c0, o0) < std::min(c0 + h.cols, o1)) return true;
      }
      return false;
    };
    int count = 0;
    for (int s = 0; s < R; ++s) count += needed(s) ? 1 : 0;
    for (int s = 0; s < R; ++s) {
      if (!needed(s)) continue;
      shard_in sh;
      sh.rank = s;
      sh.ranks = R;
      try {
        sh.in = std::make_unique<ckpt::input>(shard_path(dir_of(manifest.name()), set.base, set.generation, s, R));
      } catch (const checkpoint_error& e) {
        // Every shard read stays open until the commit (so that a save renamed over one
        // meanwhile changes nothing): few ranks resuming a set of many may meet the open-file
        // limit. The load fails: the shards opened so far are closed first, so that what runs
        // next (building this message; a sanitizer's checks, which open a pipe) has descriptors.
        out.clear();
        const std::string what = e.what();
        if (what.find(std::string("(") + std::strerror(EMFILE) + ")") == std::string::npos) throw;
        throw checkpoint_error(what + "; this load keeps the " + std::to_string(count) +
                               " shard files it reads open until it commits: raise the process's open-file limit "
                               "(ulimit -n) or resume on more ranks");
      }
      ckpt::input& in = *sh.in;
      auto bad = [&](const std::string& why) { in.fail(why + " (a shard of " + manifest.name() + ")"); };
      if (in.size() != set.sizes[std::size_t(s)])
        bad("has " + std::to_string(in.size()) + " bytes, the manifest says " + std::to_string(set.sizes[std::size_t(s)]));
      std::uint32_t sections = 1;
      for (std::size_t i = 0; i < nm; ++i) sections += o.host_.matrix(i).on_host ? 1 : 0;
      if (ckpt::read_header(in) != sections) bad("has the wrong number of sections");
      const ckpt::section_header hh = ckpt::read_section_header(in, 0);
      if (hh.tag != ckpt::shard_tag || hh.len != 24) bad("has no shard header");
      std::vector<unsigned char> head(24);
      {
        ckpt::section_in r(in, hh.len, 0);
        r.bytes(head.data(), head.size());
        r.finish();
      }
      ckpt::reader rh(head.data(), head.size(), "shard header");
      const auto gen = rh.get<std::uint64_t>();
      const auto rank = rh.get<std::uint32_t>(), ranks = rh.get<std::uint32_t>();
      const auto matrices = rh.get<std::uint64_t>();
      if (gen != set.generation || rank != std::uint32_t(s) || ranks != set.ranks || matrices != nm)
        bad("belongs to another checkpoint (generation " + std::to_string(gen) + ", rank " + std::to_string(rank) + " of " +
            std::to_string(ranks) + "; the manifest wants generation " + std::to_string(set.generation) + ", rank " +
            std::to_string(s) + " of " + std::to_string(R) + ")");
      std::size_t index = 1;
      // a matrix whose accumulators break their rule against the manifest's selection, reported
      // once the shard is known to be the manifest's (a shard of another set breaks it too)
      std::string broken;
      sh.where.assign(nm, {});
      for (std::size_t i = 0; i < nm; ++i) {
        const auto& h = o.host_.matrix(i);
        if (!h.on_host) continue;
        const std::uint64_t cols = o.matrices_[i].cols;
        const std::uint64_t n = detail::shard_begin(cols, R, s + 1) - detail::shard_begin(cols, R, s);
        const ckpt::section_header mh = ckpt::read_section_header(in, index);
        if (mh.tag != ckpt::block_tag || mh.len != host_bytes(o, i, n))
          bad("section " + std::to_string(index) + " is not matrix " + std::to_string(i) + "'s block");
        sh.where[i] = {in.offset(), mh.len, 0};
        ckpt::section_in r(in, mh.len, index);
        const unsigned accs = o.cfg_.overlap_step ? 2 : 1;
        const bool finite = moments_ok(r, n * h.rows, buf);
        // (the accumulators of the block's columns, from shard_begin(cols, R, s) on)
        const int accs_verdict = accs_ok(r, h.rows, n, accs, selected[i].data() + detail::shard_begin(cols, R, s), rule, buf);
        std::vector<std::uint32_t> counts(n);
        r.bytes(counts.data(), 4 * n);
        sh.where[i].crc = r.finish();
        if (!finite || accs_verdict == 1)
          bad("matrix " + std::to_string(i) + ": a master, moment or accumulator is not finite, or a second moment is negative");
        if (accs_verdict == 2 && broken.empty()) broken = "matrix " + std::to_string(i) + ": " + acc_rule::broken;
        for (auto x : counts)
          if (x > applied) bad("matrix " + std::to_string(i) + ": an Adam count exceeds the applied steps");
        ++index;
      }
      if (in.left() != 0) bad("trailing bytes after the last section");
      if (in.digest() != set.digests[std::size_t(s)])  // (well formed, but not the set's: from another save)
        bad("is not the shard this manifest was saved with (its contents differ)");
      if (!broken.empty()) bad(broken);
      out.push_back(std::move(sh));
    }
    return out;
  }

  // Pass 2 for a shard: the columns of its blocks that are this rank's, into the host state.
  static void commit_shard(Opt& o, shard_in& sh, std::vector<unsigned char>& buf) {
    for (std::size_t i = 0, index = 1; i < o.matrices_.size(); ++i) {
      if (!o.host_.matrix(i).on_host) continue;
      const std::uint64_t cols = o.matrices_[i].cols;
      sh.in->seek(sh.where[i].at);
      ckpt::section_in r(*sh.in, sh.where[i].len, index++);
      read_host_arrays(o, i, r, detail::shard_begin(cols, sh.ranks, sh.rank), detail::shard_begin(cols, sh.ranks, sh.rank + 1),
                       buf);
      if (r.finish() != sh.where[i].crc) sh.in->fail("changed while it was being loaded");
    }
  }

  static void write_config(ckpt::writer& w, const config& c) {
    w.put(c.topk_ratio);
    w.put(c.select_interval.steps);
    w.put<std::uint8_t>(c.select_interval.automatic);
    w.put(c.update_interval.steps);
    w.put<std::uint8_t>(c.update_interval.automatic);
    w.put(c.full_warm_up_rounds);
    w.put<std::uint8_t>(c.overlap_step);
    w.put(c.auto_ratio);
    w.put(c.steps_per_epoch);
    w.put<std::uint8_t>(std::uint8_t(c.score));
    w.put<std::uint8_t>(std::uint8_t(c.reselect_moments));
    w.put<std::uint8_t>(std::uint8_t(c.host_gradient));
    w.put<std::uint8_t>(std::uint8_t(c.gradient_reduction));
    for (float x : {c.adam.lr, c.adam.beta1, c.adam.beta2, c.adam.eps, c.adam.weight_decay}) w.put(x);
    w.put<std::uint8_t>(std::uint8_t(c.adam.mode));
    w.put(c.max_grad_norm);
    w.put(c.host_threads);
  }
  static config read_config(ckpt::reader& r) {
    config c;
    c.topk_ratio = r.get<double>();
    c.select_interval.steps = r.get<std::uint32_t>();
    c.select_interval.automatic = r.get<std::uint8_t>() != 0;
    c.update_interval.steps = r.get<std::uint32_t>();
    c.update_interval.automatic = r.get<std::uint8_t>() != 0;
    c.full_warm_up_rounds = r.get<std::uint32_t>();
    c.overlap_step = r.get<std::uint8_t>() != 0;
    c.auto_ratio = r.get<double>();
    c.steps_per_epoch = r.get<std::uint32_t>();
    c.score = score_kind(r.get<std::uint8_t>());
    c.reselect_moments = reselect_policy(r.get<std::uint8_t>());
    c.host_gradient = window_gradient(r.get<std::uint8_t>());
    c.gradient_reduction = reduce_op(r.get<std::uint8_t>());
    c.adam.lr = r.get<float>();
    c.adam.beta1 = r.get<float>();
    c.adam.beta2 = r.get<float>();
    c.adam.eps = r.get<float>();
    c.adam.weight_decay = r.get<float>();
    c.adam.mode = adam_mode(r.get<std::uint8_t>());
    c.max_grad_norm = r.get<double>();
    c.host_threads = r.get<unsigned>();
    return c;
  }
  // Everything but lr and host_threads must agree between the file (f) and this optimizer (or,
  // with other names, between two ranks).
  template <class Bad>
  static void compare_config(const config& here, const config& f, Bad bad, const std::string& f_name = "in the file",
                             const std::string& here_name = "here") {
    auto differ = [&](const char* key, auto file, auto here, const char* hint = "") {
      if (!(file == here))
        bad(std::string("config differs: ") + key + " is " + detail::exact(file) + " " + f_name + ", " +
            detail::exact(here) + " " + here_name + hint);
    };
    // (a topk_ratio of 0 or 1 nobody set: the baselines fix it so, and a checkpoint or rank of
    // one kind meets another)
    const bool fixed_by_a_kind = f.topk_ratio == 0 || f.topk_ratio == 1 || here.topk_ratio == 0 || here.topk_ratio == 1;
    differ("topk_ratio", f.topk_ratio, here.topk_ratio,
           fixed_by_a_kind ? " (zero_offload fixes it at 0 and device_adam at 1: another kind of optimizer?)" : "");
    differ("select_interval", f.select_interval.automatic ? -1.0 : double(f.select_interval.steps),
           here.select_interval.automatic ? -1.0 : double(here.select_interval.steps));
    differ("update_interval", f.update_interval.automatic ? -1.0 : double(f.update_interval.steps),
           here.update_interval.automatic ? -1.0 : double(here.update_interval.steps));
    differ("full_warm_up_rounds", f.full_warm_up_rounds, here.full_warm_up_rounds);
    differ("overlap_step", int(f.overlap_step), int(here.overlap_step));
    differ("auto_ratio", f.auto_ratio, here.auto_ratio);
    differ("steps_per_epoch", f.steps_per_epoch, here.steps_per_epoch);
    differ("score", int(f.score), int(here.score));
    differ("reselect_moments", int(f.reselect_moments), int(here.reselect_moments));
    differ("host_gradient", int(f.host_gradient), int(here.host_gradient));
    differ("gradient_reduction", int(f.gradient_reduction), int(here.gradient_reduction));
    differ("beta1", f.adam.beta1, here.adam.beta1);
    differ("beta2", f.adam.beta2, here.adam.beta2);
    differ("eps", f.adam.eps, here.adam.eps);
    differ("weight_decay", f.adam.weight_decay, here.adam.weight_decay);
    differ("adam_mode", int(f.adam.mode), int(here.adam.mode));
    differ("max_grad_norm", f.max_grad_norm, here.max_grad_norm);
    if (!(std::isfinite(f.adam.lr) && f.adam.lr >= 0)) bad("config: lr is not finite and >= 0");
  }
};

}  // namespace zenflow::detail
