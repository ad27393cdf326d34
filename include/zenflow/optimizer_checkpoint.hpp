// The optimizer's checkpoint format: what a checkpoint of zenflow::optimizer holds — a config
// section, a layout section (the registrations), a counters section, then one section per matrix
// and one per vector — how save() fills it from the optimizer's state, and how load() checks a
// file completely (sizes, registrations, config, column lists, counts against the applied steps)
// before committing anything. The container format (framing, checksums, atomic replacement) is
// checkpoint.hpp's; the optimizer's state is read and written through friendship.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "checkpoint.hpp"
#include "communicator.hpp"
#include "config.hpp"
#include "detail/format.hpp"
#include "params.hpp"

namespace zenflow::detail {

// The file, written until its first failure, which is kept and rethrown by finish(): past it
// every write is dropped, so that rank 0 still goes through every gather the other ranks
// take part in.
class tolerant_file : public ckpt::typed_writes<tolerant_file> {
 public:
  tolerant_file(const std::string& path, std::uint32_t sections) {
    attempt([&] { f_.emplace(path, sections); });
  }
  void begin(std::uint32_t t, std::uint64_t len) {
    attempt([&] { f_->begin(t, len); });
  }
  void bytes(const void* p, std::size_t n) {
    attempt([&] { f_->bytes(p, n); });
  }
  void end() {
    attempt([&] { f_->end(); });
  }
  void section(std::uint32_t t, const ckpt::writer& w) {
    attempt([&] { f_->section(t, w); });
  }
  void finish() {
    attempt([&] { f_->commit(); });
    if (failed_) std::rethrow_exception(failed_);
  }

 private:
  template <class F>
  void attempt(F&& f) {
    if (failed_) return;
    try {
      f();
    } catch (...) {
      failed_ = std::current_exception();
    }
  }
  std::optional<ckpt::file_writer> f_;
  std::exception_ptr failed_;
};

template <class Opt>
struct optimizer_checkpoint {
  // Bytes of a matrix section with `active` selected columns, and of a vector section. A matrix
  // with every column selected (k = cols) has no host arrays. The section's layout:
  //   u64 active | u32 columns[active] | the selected columns' fp32 master, m, v ([active][rows]
  //   each) | u32 counts[active] | host arrays: fp32 master, m, v, accumulator(s) ([cols][rows]
  //   each), u32 counts[cols] | the params (rows*cols of the param dtype, registered layout)
  // The same on every space: where an fp32 param is its own master, its selected columns are
  // written as the master (and read back from the params on load).
  static std::uint64_t matrix_bytes(const Opt& o, std::size_t i, std::uint64_t active) {
    const matrix_param& p = o.matrices_[i];
    const std::uint64_t n = std::uint64_t(p.rows) * p.cols, pb = n * size_of(p.param_type);
    const std::uint64_t accs = o.cfg_.overlap_step ? 2 : 1;
    const std::uint64_t host = o.resident(i) ? 0 : (12 + 4 * accs) * n + 4 * p.cols;
    return 8 + 4 * active + 12 * active * p.rows + 4 * active + host + pb;
  }
  static std::uint64_t vector_bytes(const vector_param& p) { return 12 * std::uint64_t(p.n) + 4 + p.n * size_of(p.param_type); }

  // The complete state (see optimizer::save), written atomically to `path`, streamed: host
  // arrays go to the file from where they are, device arrays through one bounded buffer. The
  // optimizer has finished any host update in flight. Data parallel, rank 0 writes the file and
  // the others send it their blocks of the host arrays as it reaches them (the file is the one
  // a single process writes: any number of ranks can load it); every rank throws if the file
  // could not be written.
  static void save(Opt& o, const std::string& path) {
    if (o.comm_.rank() != 0) {
      send_host_state(o);
      if (!o.comm_.all_agree(true)) throw std::runtime_error("zenflow: rank 0 could not write the checkpoint " + path);
      return;
    }
    // Once the ranks are sending, rank 0 must go on receiving whatever happens to its file: a
    // failure is kept and rethrown at the end, after every rank has heard of it.
    std::exception_ptr failed;
    try {
      write(o, path);
    } catch (...) {
      failed = std::current_exception();
    }
    if (!o.comm_.all_agree(!failed)) {
      if (failed) std::rethrow_exception(failed);
      throw std::runtime_error("zenflow: a rank could not take part in writing the checkpoint " + path);
    }
  }

  // The other ranks' part of save(): their blocks of every host array, in the file's order.
  static void send_host_state(Opt& o) {
    const byte_sink none = [](const void*, std::size_t) {};
    for (std::size_t i = 0; i < o.matrices_.size(); ++i) {
      const auto& h = o.host_.matrix(i);
      if (!h.on_host) continue;
      const std::size_t n = h.rows * h.cols;
      for (const float* a : {h.master.data(), h.exp_avg.data(), h.exp_avg_sq.data(), h.acc[0].data()})
        o.comm_.gather_to_root(a, 4 * n, none);
      if (o.cfg_.overlap_step) o.comm_.gather_to_root(h.acc[1].data(), 4 * n, none);
      o.comm_.gather_to_root(h.counts.data(), 4 * h.cols, none);
    }
  }

  static void write(Opt& o, const std::string& path) {
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
    tolerant_file f(path, std::uint32_t(3 + o.matrices_.size() + o.vectors_.size()));
    f.section(ckpt::config_tag, conf);
    f.section(ckpt::layout_tag, lay);
    f.section(ckpt::counters_tag, cnt);
    std::vector<unsigned char> buf;
    auto from_device = [&](const void* src, std::size_t bytes) {
      const auto* at = static_cast<const unsigned char*>(src);
      buf.resize(std::min(bytes, ckpt::stream_chunk));
      for (std::size_t off = 0; off < bytes; off += buf.size()) {
        const std::size_t m = std::min(buf.size(), bytes - off);
        o.space_.download(buf.data(), at + off, m);
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
      f.begin(ckpt::matrix_tag, matrix_bytes(o, i, d.active));
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
          from_device(gather.data(), 4 * m * p.rows);
        }
      } else {
        from_device(d.master[d.cur].data(), 4 * ks);
      }
      for (const float* a : {d.exp_avg[d.cur].data(), d.exp_avg_sq[d.cur].data()}) from_device(a, 4 * ks);
      from_device(d.counts[d.cur].data(), 4 * d.active);
      if (h.on_host) {  // every rank's block of each array, in rank order: the array
        const byte_sink to_file = [&](const void* piece, std::size_t m) { f.bytes(piece, m); };
        const std::size_t own = 4 * h.rows * h.cols;
        for (const float* a : {h.master.data(), h.exp_avg.data(), h.exp_avg_sq.data(), h.acc[0].data()})
          o.comm_.gather_to_root(a, own, to_file);
        if (o.cfg_.overlap_step) o.comm_.gather_to_root(h.acc[1].data(), own, to_file);
        o.comm_.gather_to_root(h.counts.data(), 4 * h.cols, to_file);
      }
      from_device(p.param, pb);
      f.end();
    }
    for (std::size_t i = 0; i < o.vectors_.size(); ++i) {
      const vector_param& p = o.vectors_[i];
      const auto& v = o.updater_.vector(i);
      f.begin(ckpt::vector_tag, vector_bytes(p));
      for (const void* a : {v.param_master ? p.param : v.master.data(), static_cast<const void*>(v.exp_avg.data()),
                            static_cast<const void*>(v.exp_avg_sq.data())})
        from_device(a, 4 * p.n);
      f.put<std::uint32_t>(v.count);
      from_device(p.param, p.n * size_of(p.param_type));
      f.end();
    }
    f.finish();
  }

  // Checks a checkpoint against this optimizer and, only if everything holds, restores it (see
  // optimizer::load). Two passes over the input through bounded buffers: the first reads the
  // header, the small sections (config, layout, counters; their sizes are known, so the file's
  // total size is checked before any payload is read) and streams every payload through its
  // checksum, keeping only what the checks need (column lists, counts); the second commits,
  // reading each array straight into place. A file that changes between the passes (written in
  // place while loading) fails the second pass's checksums: the state is then half-restored,
  // and the optimizer refuses further work until a load succeeds.
  static void load(Opt& o, ckpt::input& in) {
    auto bad = [&](const std::string& why) -> void { in.fail(why); };
    const std::size_t nm = o.matrices_.size(), nv = o.vectors_.size();
    const std::size_t want = 3 + nm + nv;
    const std::uint32_t count = ckpt::read_header(in);
    if (count != want)
      bad("has " + std::to_string(count) + " sections, this optimizer needs " + std::to_string(want) +
          " (a different number of registered parameters?)");
    std::vector<unsigned char> buf;
    // a small section, whole, its checksum checked; at most `cap` bytes
    auto small = [&](std::size_t index, std::uint32_t t, const char* what, std::uint64_t cap) {
      const ckpt::section_header h = ckpt::read_section_header(in, index);
      if (h.tag != t) bad("section " + std::to_string(index) + " should be the " + what + " section");
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
        bad("matrix " + std::to_string(i) + " is " + std::to_string(rows) + "x" + std::to_string(cols) +
            " (param dtype " + std::to_string(pt) + ", grad dtype " + std::to_string(gt) + ", layout " +
            std::to_string(lo) + ") in the file, " + std::to_string(p.rows) + "x" + std::to_string(p.cols) +
            " (" + std::to_string(int(p.param_type)) + ", " + std::to_string(int(p.grad_type)) + ", " +
            std::to_string(int(p.layout)) + ") here");
    }
    if (rl.get<std::uint64_t>() != nv) bad("registers a different number of vectors");
    for (std::size_t i = 0; i < nv; ++i) {
      const auto n = rl.get<std::uint64_t>();
      const auto pt = rl.get<std::uint8_t>(), gt = rl.get<std::uint8_t>();
      if (n != o.vectors_[i].n || pt != std::uint8_t(o.vectors_[i].param_type) || gt != std::uint8_t(o.vectors_[i].grad_type))
        bad("vector " + std::to_string(i) + " has " + std::to_string(n) + " elements in the file, " +
            std::to_string(o.vectors_[i].n) + " here (or other dtypes)");
    }
    rl.done();
    // counters
    const auto cnt = small(2, ckpt::counters_tag, "counters", 99 + 16 * std::uint64_t(nm));
    ckpt::reader rn(cnt.data(), cnt.size(), "counters");
    std::uint64_t c[10];
    for (auto& v : c) v = rn.get<std::uint64_t>();
    const double stall = rn.get<double>();
    const auto sel_once = rn.get<std::uint8_t>(), pend = rn.get<std::uint8_t>(), acc = rn.get<std::uint8_t>();
    const auto na = rn.get<std::uint64_t>();
    if (sel_once > 1 || pend > 1 || acc > 1 || (na != 0 && na != nm) || c[0] + c[2] != c[1] ||
        c[6] > c[0] || c[5] > c[0] || !(stall >= 0))
      bad("counters section is inconsistent");
    // states the schedule can reach: without overlap_step no second accumulator and no host
    // update pending across a step; an open window always shorter than a fixed update_interval
    if (!o.cfg_.overlap_step && acc != 0)
      bad("counters section selects the second accumulator, which only overlap_step uses");
    if (!o.cfg_.overlap_step && pend != 0)
      bad("counters section has a host update pending, which only overlap_step leaves");
    if (!o.cfg_.update_interval.automatic && c[6] >= o.cfg_.update_interval.steps)
      bad("counters section has an open window of " + std::to_string(c[6]) + " steps; update_interval is " +
          std::to_string(o.cfg_.update_interval.steps));
    std::vector<double> aa(na), ab(na);
    for (std::size_t i = 0; i < na; ++i) {
      aa[i] = rn.get<double>();
      ab[i] = rn.get<double>();
    }
    rn.done();
    // The file's size against what this optimizer's checkpoint can be (a matrix section holds its
    // selected columns, none before the first selection), before any payload is read.
    std::uint64_t lo = in.offset(), hi = in.offset();
    for (std::size_t i = 0; i < nm; ++i) {
      // (a matrix with every column selected is placed on the device at initialize: always k)
      const std::uint64_t b = matrix_bytes(o, i, o.updater_.matrix(i).k), a = o.resident(i) ? b : matrix_bytes(o, i, 0);
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
    };
    std::vector<placed> where;
    // fp32 masters and moments read through their checksum and checked finite: a state holding an
    // infinite v would freeze its column for good (what a step whose gradient would cause it is
    // skipped for), a NaN would spread; neither can come from save(). (Reported after the
    // section's checksum: a damaged file is called damaged.)
    auto finite_floats = [&](ckpt::section_in& r, std::uint64_t count) {
      unsigned char carry[4];
      std::size_t nc = 0;
      bool ok = true;
      r.pieces(4 * count, buf, [&](const unsigned char* p, std::size_t m) {
        std::size_t k = 0;
        while (nc > 0 && nc < 4 && k < m) carry[nc++] = p[k++];  // a float split between pieces
        if (nc == 4) {
          float x;
          std::memcpy(&x, carry, 4);
          ok = ok && std::isfinite(x);
          nc = 0;
        }
        for (; k + 4 <= m; k += 4) {
          float x;
          std::memcpy(&x, p + k, 4);
          ok = ok && std::isfinite(x);
        }
        while (k < m) carry[nc++] = p[k++];
      });
      return ok;
    };
    for (std::size_t i = 0; i < nm; ++i) {
      const std::size_t index = 3 + i;
      const ckpt::section_header h = ckpt::read_section_header(in, index);
      if (h.tag != ckpt::matrix_tag) bad("section " + std::to_string(index) + " should be matrix " + std::to_string(i));
      const matrix_param& p = o.matrices_[i];
      const std::size_t k = o.updater_.matrix(i).k;
      const std::size_t active = h.len == matrix_bytes(o, i, k) || o.resident(i) ? k : 0;
      if (h.len != matrix_bytes(o, i, active)) bad("matrix " + std::to_string(i) + " section has the wrong size");
      const std::size_t n = p.rows * p.cols, pb = n * size_of(p.param_type);
      const std::size_t accs = o.cfg_.overlap_step ? 2 : 1;
      const bool on_host = !o.resident(i);
      where.push_back({in.offset(), h.len, active});
      ckpt::section_in r(in, h.len, index);
      const auto stored = r.get<std::uint64_t>();
      std::vector<std::uint32_t> cols(active), counts(active), hcounts(p.cols);
      r.bytes(cols.data(), 4 * active);
      bool finite = finite_floats(r, 3 * std::uint64_t(active) * p.rows);
      r.bytes(counts.data(), 4 * active);
      if (on_host) {
        finite = finite_floats(r, 3 * std::uint64_t(n)) && finite;
        r.skip(4 * accs * std::uint64_t(n), buf);
        r.bytes(hcounts.data(), 4 * p.cols);
      } else {
        hcounts.clear();
      }
      r.skip(std::uint64_t(pb), buf);
      r.finish();
      if (!finite) bad("matrix " + std::to_string(i) + ": a master or moment is not finite");
      if (stored != active) bad("matrix " + std::to_string(i) + ": selection size differs");
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
      const std::size_t index = 3 + nm + i;
      const vector_param& p = o.vectors_[i];
      const ckpt::section_header h = ckpt::read_section_header(in, index);
      if (h.tag != ckpt::vector_tag) bad("section " + std::to_string(index) + " should be vector " + std::to_string(i));
      if (h.len != vector_bytes(p)) bad("vector " + std::to_string(i) + " section has the wrong size");
      where.push_back({in.offset(), h.len, 0});
      ckpt::section_in r(in, h.len, index);
      const bool finite = finite_floats(r, 3 * std::uint64_t(p.n));
      const auto vc = r.get<std::uint32_t>();
      r.skip(std::uint64_t(p.n) * size_of(p.param_type), buf);
      r.finish();
      if (!finite) bad("vector " + std::to_string(i) + ": a master or moment is not finite");
      if (vc > c[0]) bad("vector " + std::to_string(i) + ": its Adam count exceeds the applied steps");
    }
    if (in.left() != 0) bad("trailing bytes after the last section");

    // ---- Pass 2, everything checked (data parallel: on every rank): commit ----
    o.agree_to_commit(in);
    o.quiesce();
    try {
      commit(o, in, where, buf);
    } catch (const std::exception& e) {
      o.broken_ = std::string("a checkpoint load failed while committing: ") + e.what();
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
    o.base_stall_ = o.scheduler_.stall_seconds() - stall;
    o.selected_once_ = sel_once;
    o.pending_ = pend;
    o.active_acc_ = acc;
    o.auto_a_ = std::move(aa);
    o.auto_b_ = std::move(ab);
  }


  // Pass 2 of load: each section read again, straight into the optimizer's arrays (device ones
  // through the bounded buffer), its checksum checked again at the end.
  template <class Placed>
  static void commit(Opt& o, ckpt::input& in, const std::vector<Placed>& where, std::vector<unsigned char>& buf) {
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
      ckpt::section_in r(in, where[i].len, 3 + i);
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
      if (h.on_host) {  // this rank's block of columns of each array (all of them in one process)
        const std::uint64_t c0 = o.col_begin(i, o.comm_.rank()), own = h.cols;
        auto block = [&](void* dst, std::uint64_t per_col) {
          r.skip(c0 * per_col, buf);
          r.bytes(dst, std::size_t(own * per_col));
          r.skip((p.cols - c0 - own) * per_col, buf);
        };
        for (float* a : {h.master.data(), h.exp_avg.data(), h.exp_avg_sq.data(), h.acc[0].data()}) block(a, 4 * p.rows);
        if (o.cfg_.overlap_step) block(h.acc[1].data(), 4 * p.rows);
        block(h.counts.data(), 4);
      }
      to_device(r, p.param, pb);
      r.finish();
      o.set_unselected(i);
    }
    for (std::size_t i = 0; i < o.vectors_.size(); ++i) {
      const vector_param& p = o.vectors_[i];
      auto& v = o.updater_.vector(i);
      in.seek(where[nm + i].at);
      ckpt::section_in r(in, where[nm + i].len, 3 + nm + i);
      if (v.param_master) r.skip(4 * std::uint64_t(p.n), buf);  // the param below is the master
      else to_device(r, v.master.data(), 4 * p.n);
      to_device(r, v.exp_avg.data(), 4 * p.n);
      to_device(r, v.exp_avg_sq.data(), 4 * p.n);
      v.count = r.get<std::uint32_t>();
      to_device(r, p.param, p.n * size_of(p.param_type));
      r.finish();
    }
    o.space_.fence();
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
  // Everything but lr and host_threads must agree between the file (f) and this optimizer.
  template <class Bad>
  static void compare_config(const config& here, const config& f, Bad bad) {
    auto differ = [&](const char* key, auto file, auto here) {
      if (!(file == here)) bad(std::string("config differs: ") + key + " is " + detail::exact(file) + " in the file, " +
                               detail::exact(here) + " here");
    };
    differ("topk_ratio", f.topk_ratio, here.topk_ratio);
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
