// The optimizer's checkpoint format: what a checkpoint of zenflow::optimizer holds — a config
// section, a layout section (the registrations), a counters section, then one section per matrix
// and one per vector — how save() fills it from the optimizer's state, and how load() checks a
// file completely (sizes, registrations, config, column lists, counts against the applied steps)
// before committing anything. The container format (framing, checksums, atomic replacement) is
// checkpoint.hpp's; the optimizer's state is read and written through friendship.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint.hpp"
#include "config.hpp"
#include "detail/format.hpp"
#include "params.hpp"

namespace zenflow::detail {

template <class Opt>
struct optimizer_checkpoint {
  // The complete state (see optimizer::save), written atomically to `path`. The optimizer has
  // finished any host update in flight.
  static void save(Opt& o, const std::string& path) {
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
    std::vector<ckpt::writer> mats(o.matrices_.size()), vecs(o.vectors_.size());
    for (std::size_t i = 0; i < o.matrices_.size(); ++i) {
      const matrix_param& p = o.matrices_[i];
      const auto& d = o.updater_.matrix(i);
      const auto& h = o.host_.matrix(i);
      const std::size_t n = p.rows * p.cols, ks = d.active * p.rows, pb = n * size_of(p.param_type);
      ckpt::writer& w = mats[i];
      w.put<std::uint64_t>(d.active);
      w.bytes(o.selected_[i].data(), 4 * d.active);
      for (const float* a : {d.master[d.cur].data(), d.exp_avg[d.cur].data(), d.exp_avg_sq[d.cur].data()}) {
        const auto dev = o.template download<float>(a, ks);
        w.bytes(dev.data(), 4 * ks);
      }
      const auto counts = o.template download<std::uint32_t>(d.counts[d.cur].data(), d.active);
      w.bytes(counts.data(), 4 * d.active);
      for (const float* a : {h.master.data(), h.exp_avg.data(), h.exp_avg_sq.data(), h.acc[0].data()}) w.bytes(a, 4 * n);
      if (o.cfg_.overlap_step) w.bytes(h.acc[1].data(), 4 * n);
      w.bytes(h.counts.data(), 4 * p.cols);
      w.bytes(h.param_stage.data(), pb);
      const auto params = o.download(static_cast<const unsigned char*>(p.param), pb);
      w.bytes(params.data(), pb);
    }
    for (std::size_t i = 0; i < o.vectors_.size(); ++i) {
      const vector_param& p = o.vectors_[i];
      const auto& v = o.updater_.vector(i);
      ckpt::writer& w = vecs[i];
      for (const float* a : {v.master.data(), v.exp_avg.data(), v.exp_avg_sq.data()}) {
        const auto dev = o.template download<float>(a, p.n);
        w.bytes(dev.data(), 4 * p.n);
      }
      w.put<std::uint32_t>(v.count);
      const auto params = o.download(static_cast<const unsigned char*>(p.param), p.n * size_of(p.param_type));
      w.bytes(params.data(), params.size());
    }
    std::vector<std::pair<std::uint32_t, const ckpt::writer*>> sections = {
        {ckpt::config_tag, &conf}, {ckpt::layout_tag, &lay}, {ckpt::counters_tag, &cnt}};
    for (const auto& w : mats) sections.push_back({ckpt::matrix_tag, &w});
    for (const auto& w : vecs) sections.push_back({ckpt::vector_tag, &w});
    ckpt::write_file(path, sections);
  }

  // Checks the image of a checkpoint against this optimizer and, only if everything holds,
  // restores it (see optimizer::load).
  static void load_image(Opt& o, const void* data, std::size_t size, const std::string& name) {
    const std::string& path = name;
    std::vector<ckpt::section> secs;
    ckpt::parse(static_cast<const unsigned char*>(data), size, path, secs);
    auto bad = [&](const std::string& why) -> void { throw checkpoint_error("zenflow checkpoint " + path + ": " + why); };
    const std::size_t want = 3 + o.matrices_.size() + o.vectors_.size();
    if (secs.size() != want)
      bad("has " + std::to_string(secs.size()) + " sections, this optimizer needs " + std::to_string(want) +
          " (a different number of registered parameters?)");
    auto expect_tag = [&](std::size_t i, std::uint32_t t, const char* what) {
      if (secs[i].tag != t) bad("section " + std::to_string(i) + " should be the " + what + " section");
    };
    expect_tag(0, ckpt::config_tag, "config");
    expect_tag(1, ckpt::layout_tag, "layout");
    expect_tag(2, ckpt::counters_tag, "counters");
    // config: everything but lr and host_threads must agree
    ckpt::reader rc(secs[0].data, secs[0].size, "config");
    const config fc = read_config(rc);
    rc.done();
    compare_config(o.cfg_, fc, bad);
    // registrations
    ckpt::reader rl(secs[1].data, secs[1].size, "layout");
    if (rl.get<std::uint64_t>() != o.matrices_.size()) bad("registers a different number of matrices");
    for (std::size_t i = 0; i < o.matrices_.size(); ++i) {
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
    if (rl.get<std::uint64_t>() != o.vectors_.size()) bad("registers a different number of vectors");
    for (std::size_t i = 0; i < o.vectors_.size(); ++i) {
      const auto n = rl.get<std::uint64_t>();
      const auto pt = rl.get<std::uint8_t>(), gt = rl.get<std::uint8_t>();
      if (n != o.vectors_[i].n || pt != std::uint8_t(o.vectors_[i].param_type) || gt != std::uint8_t(o.vectors_[i].grad_type))
        bad("vector " + std::to_string(i) + " has " + std::to_string(n) + " elements in the file, " +
            std::to_string(o.vectors_[i].n) + " here (or other dtypes)");
    }
    rl.done();
    // counters
    ckpt::reader rn(secs[2].data, secs[2].size, "counters");
    std::uint64_t c[10];
    for (auto& v : c) v = rn.get<std::uint64_t>();
    const double stall = rn.get<double>();
    const auto sel_once = rn.get<std::uint8_t>(), pend = rn.get<std::uint8_t>(), acc = rn.get<std::uint8_t>();
    const auto na = rn.get<std::uint64_t>();
    if (sel_once > 1 || pend > 1 || acc > 1 || (na != 0 && na != o.matrices_.size()) || c[0] + c[2] != c[1] ||
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
    // matrices and vectors: sizes and column lists checked while parsing into staging copies
    struct mat_blob {
      std::size_t active;
      const unsigned char* at;
    };
    std::vector<mat_blob> mb;
    for (std::size_t i = 0; i < o.matrices_.size(); ++i) {
      const ckpt::section& sec = secs[3 + i];
      if (sec.tag != ckpt::matrix_tag) bad("section " + std::to_string(3 + i) + " should be matrix " + std::to_string(i));
      const matrix_param& p = o.matrices_[i];
      ckpt::reader r(sec.data, sec.size, "matrix " + std::to_string(i));
      const auto active = r.get<std::uint64_t>();
      if (active != 0 && active != o.updater_.matrix(i).k) bad("matrix " + std::to_string(i) + ": selection size differs");
      const std::size_t n = p.rows * p.cols, pb = n * size_of(p.param_type);
      const std::size_t accs = o.cfg_.overlap_step ? 2 : 1;
      const std::size_t expect = 8 + 4 * active + 12 * active * p.rows + 4 * active + (12 + 4 * accs) * n + 4 * p.cols + 2 * pb;
      if (sec.size != expect) bad("matrix " + std::to_string(i) + " section has the wrong size");
      std::vector<std::uint32_t> cols(active), counts(active), hcounts(p.cols);
      r.bytes(cols.data(), 4 * active);
      for (std::size_t s = 0; s < active; ++s)
        if (cols[s] >= p.cols || (s > 0 && cols[s] <= cols[s - 1]))
          bad("matrix " + std::to_string(i) + ": corrupt column list");
      // a column's Adam count can never exceed the number of applied steps
      r.skip(12 * active * p.rows);
      r.bytes(counts.data(), 4 * active);
      r.skip((12 + 4 * accs) * n);
      r.bytes(hcounts.data(), 4 * p.cols);
      for (auto x : counts)
        if (x > c[0]) bad("matrix " + std::to_string(i) + ": an Adam count exceeds the applied steps");
      for (auto x : hcounts)
        if (x > c[0]) bad("matrix " + std::to_string(i) + ": an Adam count exceeds the applied steps");
      mb.push_back({active, sec.data + 8});
    }
    for (std::size_t i = 0; i < o.vectors_.size(); ++i) {
      const ckpt::section& sec = secs[3 + o.matrices_.size() + i];
      if (sec.tag != ckpt::vector_tag) bad("section " + std::to_string(3 + o.matrices_.size() + i) + " should be vector " + std::to_string(i));
      if (sec.size != 12 * o.vectors_[i].n + 4 + o.vectors_[i].n * size_of(o.vectors_[i].param_type))
        bad("vector " + std::to_string(i) + " section has the wrong size");
      std::uint32_t vc;
      std::memcpy(&vc, sec.data + 12 * o.vectors_[i].n, 4);
      if (vc > c[0]) bad("vector " + std::to_string(i) + ": its Adam count exceeds the applied steps");
    }

    // ---- everything checked: commit (copies only, nothing can fail from here) ----
    o.quiesce();
    o.cfg_.adam.lr = fc.adam.lr;
    for (std::size_t i = 0; i < o.matrices_.size(); ++i) {
      const matrix_param& p = o.matrices_[i];
      auto& d = o.updater_.matrix(i);
      auto& h = o.host_.matrix(i);
      const std::size_t n = p.rows * p.cols, ks = mb[i].active * p.rows, pb = n * size_of(p.param_type);
      const unsigned char* at = mb[i].at;
      auto take = [&](void* dst, std::size_t bytes) {
        if (bytes) std::memcpy(dst, at, bytes);  // dst is null for an empty array
        at += bytes;
      };
      auto take_dev = [&](void* dst, std::size_t bytes) {
        if (bytes) o.space_.upload(dst, at, bytes);
        at += bytes;
      };
      d.cur = 0;
      d.active = mb[i].active;
      o.selected_[i].assign(d.active, 0);
      take(o.selected_[i].data(), 4 * d.active);
      if (d.active) o.space_.upload(d.columns[0].data(), o.selected_[i].data(), 4 * d.active);
      take_dev(d.master[0].data(), 4 * ks);
      take_dev(d.exp_avg[0].data(), 4 * ks);
      take_dev(d.exp_avg_sq[0].data(), 4 * ks);
      take_dev(d.counts[0].data(), 4 * d.active);
      for (float* a : {h.master.data(), h.exp_avg.data(), h.exp_avg_sq.data(), h.acc[0].data()}) take(a, 4 * n);
      if (o.cfg_.overlap_step) take(h.acc[1].data(), 4 * n);
      take(h.counts.data(), 4 * p.cols);
      take(h.param_stage.data(), pb);
      take_dev(p.param, pb);
      o.set_unselected(i);
    }
    for (std::size_t i = 0; i < o.vectors_.size(); ++i) {
      const vector_param& p = o.vectors_[i];
      auto& v = o.updater_.vector(i);
      const unsigned char* at = secs[3 + o.matrices_.size() + i].data;
      o.space_.upload(v.master.data(), at, 4 * p.n);
      o.space_.upload(v.exp_avg.data(), at + 4 * p.n, 4 * p.n);
      o.space_.upload(v.exp_avg_sq.data(), at + 8 * p.n, 4 * p.n);
      std::memcpy(&v.count, at + 12 * p.n, 4);
      o.space_.upload(p.param, at + 12 * p.n + 4, p.n * size_of(p.param_type));
    }
    o.space_.fence();  // the uploads read the file image, which the caller may free
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
