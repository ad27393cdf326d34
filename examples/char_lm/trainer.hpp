// Trains the character-level LM with one optimizer after another — plain AdamW (device_adam),
// ZenFlow, ZeRO-Offload — from the same initialisation on the same batches, and reports losses,
// speed, stall and bytes moved. Used by examples/char_lm/main.cpp and by the acceptance test.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <oneapi/tbb/task_arena.h>

#include <zenflow/zenflow.hpp>
#ifdef CHAR_LM_MPI
#include <zenflow/mpi.hpp>
#endif

#include "model.hpp"

namespace char_lm {

struct options {
  int steps = 1200;
  std::size_t hidden = 1024, context = 16, embed = 32, batch = 32;
  unsigned threads = 2;
  std::uint64_t seed = 1;
  // Data parallel (built with MPI, run under mpirun): this process's rank and the number of
  // ranks. Each rank draws its own batches (rank 0 the single-process ones); the optimizers
  // reduce the gradients (mean), so every rank keeps the same model.
  int rank = 0, ranks = 1;
  double topk = 0.1;
  unsigned update_interval = 4;
  float lr = 1e-3f;
  // The loss curves get a point every eval_every steps: the mean training loss of the batches
  // since the last point, and the validation loss on eval_positions evenly spaced held-out
  // positions. The final validation loss (and the starting one) is measured on final_positions
  // of them (0: every held-out position).
  int eval_every = 20;
  std::size_t eval_positions = 1024;
  std::size_t final_positions = 0;
  std::vector<std::string> optimizers = {"adamw", "zenflow", "zero_offload"};
  std::vector<std::string> texts;  // empty: the license texts of the system
  // Fine-tuning (the default): the model is first trained with AdamW for pretrain_steps on
  // `texts`, then each optimizer trains it on for `steps` from those weights on finetune_texts.
  // Empty texts: the copyleft licenses (GPL, LGPL, GFDL) to pretrain, the others to fine-tune.
  // from_scratch: every optimizer trains a fresh model on all of `texts` (default: every license).
  bool from_scratch = false;
  int pretrain_steps = 1200;
  std::vector<std::string> finetune_texts;
  // told after every step: the run's name, the step, the steps in all, the step's loss and the
  // seconds spent training so far (empty: nothing is reported)
  std::function<void(const std::string&, int, int, double, double)> on_step;
};

struct corpus {
  std::vector<std::uint8_t> train, valid;  // character ids
  std::vector<unsigned char> alphabet;     // id -> byte
  double unigram_entropy = 0;              // nats per character, of the training text
  std::size_t files = 0;
};

inline const char* default_text_dir = "/usr/share/common-licenses";

// The license files (regular files of the license directory, sorted by name, symbolic links
// skipped): all of them, or only the copyleft ones (GPL, LGPL, GFDL) or only the others.
enum class licenses { all, copyleft, others };
// `flag`: the option that would have named the text (for the error without that directory).
inline std::vector<std::string> license_files(licenses which, const char* flag = "--text") {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(default_text_dir, ec))
    throw std::runtime_error(std::string("no text given and ") + default_text_dir +
                             " does not exist: pass a text file, e.g. " + flag + " book.txt");
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(default_text_dir)) {
    if (!e.is_regular_file() || e.is_symlink()) continue;
    const std::string name = e.path().filename().string();
    const bool copyleft = name.rfind("GPL", 0) == 0 || name.rfind("LGPL", 0) == 0 || name.rfind("GFDL", 0) == 0;
    if (which == licenses::all || (which == licenses::copyleft) == copyleft) files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

inline std::vector<unsigned char> read_texts(const std::vector<std::string>& files) {
  std::vector<unsigned char> bytes;
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read text file " + f);
    bytes.insert(bytes.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (bytes.size() < 10000) throw std::runtime_error("the text is too short (" + std::to_string(bytes.size()) + " bytes; at least 10000 needed)");
  return bytes;
}

// Which characters are held out for validation: the last 10% of the text (the from-scratch
// comparison, as published), or one block of every ten (`blocks`: 512-character blocks, the
// tenth of each run of ten; the held-out text then samples every file instead of the tail of
// the last one, which makes the fine-tuning comparison far less noisy).
enum class holdout { tail, blocks };
inline constexpr std::size_t holdout_block = 512;

// Maps the bytes to ids of `alphabet` (the sorted distinct bytes of every text in play) and
// splits them into training and validation text.
inline corpus make_corpus(const std::vector<unsigned char>& bytes, const std::vector<unsigned char>& alphabet,
                          std::size_t files, holdout how = holdout::tail) {
  corpus c;
  c.files = files;
  c.alphabet = alphabet;
  int id_of[256];
  std::fill(std::begin(id_of), std::end(id_of), -1);
  for (std::size_t i = 0; i < c.alphabet.size(); ++i) id_of[c.alphabet[i]] = int(i);
  const std::size_t split = bytes.size() - bytes.size() / 10;
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    const bool held = how == holdout::tail ? i >= split : (i / holdout_block) % 10 == 9;
    (held ? c.valid : c.train).push_back(std::uint8_t(id_of[bytes[i]]));
  }
  std::vector<double> freq(c.alphabet.size(), 0);
  for (auto id : c.train) freq[id] += 1;
  for (double f : freq)
    if (f > 0) c.unigram_entropy -= f / double(c.train.size()) * std::log(f / double(c.train.size()));
  return c;
}

inline std::vector<unsigned char> alphabet_of(std::initializer_list<const std::vector<unsigned char>*> texts) {
  bool seen[256] = {};
  for (const auto* t : texts)
    for (unsigned char b : *t) seen[b] = true;
  std::vector<unsigned char> a;
  for (int b = 0; b < 256; ++b)
    if (seen[b]) a.push_back(static_cast<unsigned char>(b));
  return a;
}

// One corpus of the texts (default: every license file).
inline corpus load_corpus(const std::vector<std::string>& texts) {
  const std::vector<std::string> files = texts.empty() ? license_files(licenses::all) : texts;
  const auto bytes = read_texts(files);
  return make_corpus(bytes, alphabet_of({&bytes}), files.size());
}

// The pretraining and fine-tuning corpora, over one alphabet (default: the copyleft licenses,
// then the others), each with one 512-character block of every ten held out.
struct corpora {
  corpus pretrain, finetune;
};
inline corpora load_corpora(const std::vector<std::string>& pretrain_texts, const std::vector<std::string>& finetune_texts) {
  const auto pf = pretrain_texts.empty() ? license_files(licenses::copyleft) : pretrain_texts;
  const auto ff = finetune_texts.empty() ? license_files(licenses::others, "--finetune-text") : finetune_texts;
  const auto pb = read_texts(pf), fb = read_texts(ff);
  const auto alphabet = alphabet_of({&pb, &fb});
  return {make_corpus(pb, alphabet, pf.size(), holdout::blocks), make_corpus(fb, alphabet, ff.size(), holdout::blocks)};
}

// A context that fits the corpus: a training example and a held-out one each need context + 1
// characters (checked before any model is built).
inline void check_context(const corpus& c, std::size_t context) {
  if (c.alphabet.size() < 2)  // (its loss would be 0 from the first step: nothing to compare)
    throw std::invalid_argument("the text holds one distinct character: nothing to learn");
  if (c.train.size() < context + 3 || c.valid.size() < context + 2)
    throw std::invalid_argument("the text has " + std::to_string(c.train.size()) + " training and " +
                                std::to_string(c.valid.size()) + " held-out characters: too few for a context of " +
                                std::to_string(context) + " (--context)");
}

struct curve_point {
  int step;
  double train, valid;
};

struct run_result {
  std::string name;
  std::vector<curve_point> curve;
  double start_valid = 0;  // before the first step, on the final_positions
  double final_train = 0, final_valid = 0, steps_per_second = 0, stall_seconds = 0;
  double bytes_per_step = 0;  // host<->device bytes per step, as a multiple of the model's bytes
  double collective_bytes_per_step = 0;  // data parallel: what this rank sent to the others, the same multiple
  std::uint64_t param_hash = 0;          // the trained model's (model::param_hash)
  zenflow::optimizer_stats stats;
};

// Evenly spaced prediction positions of a text (count 0: all of them but the last, position
// size - context - 1: the span has always left it out, and taking it in would change every
// recorded loss in README.md and bench/README.md by a hair, so it stays as it was).
inline std::vector<std::size_t> eval_positions(const std::vector<std::uint8_t>& text, std::size_t context,
                                               std::size_t count) {
  if (text.size() < context + 2)
    throw std::invalid_argument("the held-out text has " + std::to_string(text.size()) +
                                " characters: too few for a context of " + std::to_string(context) +
                                " (--context) and a character to predict");
  const std::size_t span = text.size() - context - 1;
  count = count == 0 ? span : std::min(count, span);
  std::vector<std::size_t> pos(count);
  for (std::size_t i = 0; i < count; ++i) pos[i] = i * span / count;
  return pos;
}

inline double evaluate(model& m, const std::vector<std::uint8_t>& text, const std::vector<std::size_t>& pos) {
  batch_state st;
  double total = 0;
  const std::size_t chunk = 512;
  for (std::size_t i = 0; i < pos.size(); i += chunk) {
    const std::vector<std::size_t> part(pos.begin() + std::ptrdiff_t(i),
                                        pos.begin() + std::ptrdiff_t(std::min(pos.size(), i + chunk)));
    total += forward_backward(m, st, text, part, false) * double(part.size());
  }
  return total / double(pos.size());
}

// Trains m (from where it is) with opt for o.steps on c.
template <class Optimizer>
run_result train_with(const std::string& name, Optimizer& opt, model& m, const corpus& c, const options& o,
                      tbb::task_arena& arena) {
  const shape sh = m.s;
  // ---- the zenflow integration: register the raw buffers, then step() after each backward ----
  using zenflow::rows, zenflow::cols;
  opt.add_matrix(zenflow::matrix(m.emb.data(), m.demb.data(), rows{sh.embed}, cols{sh.vocab}));  // a column per character
  for (layer* l : {&m.l1, &m.l2, &m.l3}) {
    opt.add_matrix(zenflow::matrix(l->w.data(), l->dw.data(), rows{l->out}, cols{l->in}));  // [in][out]: a column per input
    opt.add_vector(zenflow::vector(l->b.data(), l->db.data(), l->out));
  }
  opt.initialize();
  // -----------------------------------------------------------------------------------------
  run_result r;
  r.name = name;
  // the same batches for every optimizer; per rank its own
  std::mt19937_64 gen(o.seed ^ 0x9e3779b97f4a7c15ull ^ (std::uint64_t(o.rank) * 0xd1b54a32d192ed03ull));
  check_context(c, o.context);
  std::uniform_int_distribution<std::size_t> at(0, c.train.size() - o.context - 2);
  const auto valid_pos = eval_positions(c.valid, o.context, o.eval_positions);
  const auto final_pos = eval_positions(c.valid, o.context, o.final_positions);
  batch_state st;
  std::vector<std::size_t> pos(o.batch);
  double window_loss = 0;
  int window = 0;
  double train_seconds = 0;
  {  // step 0: the initial model, on held-out and on training text
    const auto train_pos = eval_positions(c.train, o.context, o.eval_positions);
    double v = 0, t = 0;
    arena.execute([&] {
      v = evaluate(m, c.valid, valid_pos);
      t = evaluate(m, c.train, train_pos);
      r.start_valid = final_pos == valid_pos ? v : evaluate(m, c.valid, final_pos);
    });
    r.curve.push_back({0, t, v});
  }
  for (int step = 1; step <= o.steps; ++step) {
    for (auto& p : pos) p = at(gen);
    const auto t0 = std::chrono::steady_clock::now();
    double loss = 0;
    arena.execute([&] {
      loss = forward_backward(m, st, c.train, pos, true);
      opt.step();
    });
    train_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (o.on_step) o.on_step(name, step, o.steps, loss, train_seconds);
    window_loss += loss;
    ++window;
    if (step % o.eval_every == 0 || step == o.steps) {
      // Intermediate evaluations see the params as training does (a host update may be in
      // flight); synchronizing here would land it early and change the run. The last one waits.
      if (step == o.steps) opt.synchronize();
      double v = 0;
      arena.execute([&] {
        v = evaluate(m, c.valid, valid_pos);
        if (step == o.steps) r.final_valid = final_pos == valid_pos ? v : evaluate(m, c.valid, final_pos);
      });
      r.curve.push_back({step, window_loss / window, v});
      window_loss = 0;
      window = 0;
    }
  }
  r.final_train = r.curve.back().train;
  r.steps_per_second = double(o.steps) / train_seconds;
  r.stats = opt.stats();
  r.stall_seconds = r.stats.stall_seconds;
  const double model_bytes = double(m.parameters()) * 4;
  r.bytes_per_step = double(r.stats.bytes_to_host + r.stats.bytes_to_device) / double(o.steps) / model_bytes;
  r.collective_bytes_per_step = double(r.stats.bytes_reduced + r.stats.bytes_gathered) / double(o.steps) / model_bytes;
  r.param_hash = m.param_hash();
  return r;
}

inline zenflow::config zenflow_config(const options& o) {
  zenflow::config cfg;
  cfg.adam.lr = o.lr;
  cfg.adam.weight_decay = 0.0f;
  cfg.topk_ratio = o.topk;
  cfg.update_interval = zenflow::interval::every(o.update_interval);
  cfg.select_interval = zenflow::interval::every(16 * o.update_interval);
  cfg.host_threads = o.threads;
  return cfg;
}

// Is v a number and nothing else? Then x is its value.
inline bool parse_number(const std::string& v, double& x) {
  std::size_t used = 0;
  try {
    x = std::stod(v, &used);
  } catch (...) {
    return false;
  }
  return used == v.size();
}

// The optimizer of a run, as written in --optimizer: "adamw", "zenflow" or "zero_offload",
// then settings that differ from the options, each ":key=value": lr=X for any of them, and for
// zenflow topk=R, U=N (the selection interval stays 16 U), reselect=keep|reset and
// grad=mean|sum (the config's reselect_moments and host_gradient). "zenflow:topk=0.05:U=8".
struct optimizer_spec {
  std::string name;  // as written: the run's name
  std::string kind;  // adamw, zenflow or zero_offload
  zenflow::config cfg;
};

inline optimizer_spec parse_spec(const std::string& text, const options& o) {
  auto bad = [&](const std::string& why) {
    throw std::invalid_argument("optimizer '" + text + "': " + why +
                                " (adamw, zenflow or zero_offload, then :lr=X; zenflow also :topk=R, :U=N, "
                                ":reselect=keep|reset, :grad=mean|sum)");
  };
  auto number = [&](const std::string& key, const std::string& v) {
    double x = 0;
    if (!parse_number(v, x) || !std::isfinite(x)) bad(key + " expects a number, got '" + v + "'");
    return x;
  };
  optimizer_spec sp;
  sp.name = text;
  const std::size_t colon = text.find(':');
  sp.kind = text.substr(0, colon);
  if (sp.kind != "adamw" && sp.kind != "zenflow" && sp.kind != "zero_offload")
    throw std::invalid_argument("unknown optimizer '" + sp.kind + "' (adamw, zenflow, zero_offload)");
  options so = o;
  std::string reselect = "keep", grad = "mean";
  for (std::size_t at = colon; at != std::string::npos;) {
    const std::size_t next = text.find(':', at + 1);
    const std::string item = text.substr(at + 1, next == std::string::npos ? std::string::npos : next - at - 1);
    at = next;
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) bad("a setting is key=value, got '" + item + "'");
    const std::string key = item.substr(0, eq), v = item.substr(eq + 1);
    if (key == "lr") so.lr = float(number(key, v));
    else if (sp.kind != "zenflow") bad("'" + key + "' is a zenflow setting");
    else if (key == "topk") so.topk = number(key, v);
    else if (key == "U") {
      const double u = number(key, v);
      if (!(u >= 1 && u <= 1e6 && u == std::floor(u))) bad("U expects an integer in [1, 1000000], got '" + v + "'");
      so.update_interval = unsigned(u);
    } else if (key == "reselect" && (v == "keep" || v == "reset")) reselect = v;
    else if (key == "grad" && (v == "mean" || v == "sum")) grad = v;
    else bad("unknown setting '" + item + "'");
  }
  sp.cfg = zenflow_config(so);
  sp.cfg.reselect_moments = reselect == "keep" ? zenflow::reselect_policy::keep : zenflow::reselect_policy::reset;
  sp.cfg.host_gradient = grad == "mean" ? zenflow::window_gradient::mean : zenflow::window_gradient::sum;
  try {
    sp.cfg.validate();
  } catch (const zenflow::config_error& e) {
    bad(e.what());
  }
  return sp;
}

// Every optimizer of o.optimizers on the same data and batches, each from a copy of `start`;
// `progress` is told of each run's start.
template <class Progress>
std::vector<run_result> run_each(const corpus& c, const options& o, const model& start, tbb::task_arena& arena,
                                 Progress progress) {
  std::vector<optimizer_spec> specs;
  for (const auto& text : o.optimizers) specs.push_back(parse_spec(text, o));  // all checked first
  std::vector<run_result> out;
  for (const auto& sp : specs) {
    progress(sp.name);
    model m = start;
    if (o.ranks > 1) {
#ifdef CHAR_LM_MPI
      auto comm = [] { return zenflow::mpi_communicator(MPI_COMM_WORLD); };  // (the config's mean)
      if (sp.kind == "adamw") {
        zenflow::device_adam<zenflow::host_space, zenflow::mpi_communicator> opt(sp.cfg, comm());
        out.push_back(train_with(sp.name, opt, m, c, o, arena));
      } else if (sp.kind == "zenflow") {
        using zenflow::host_space;
        zenflow::optimizer<host_space, zenflow::column_topk, zenflow::fused_adamw<host_space>, zenflow::simd_accumulator,
                           zenflow::host_copy, zenflow::bounded_async, zenflow::mpi_communicator>
            opt(sp.cfg, comm());
        out.push_back(train_with(sp.name, opt, m, c, o, arena));
      } else {
        zenflow::zero_offload<zenflow::host_space, zenflow::mpi_communicator> opt(sp.cfg, comm());
        out.push_back(train_with(sp.name, opt, m, c, o, arena));
      }
      continue;
#else
      throw std::invalid_argument("data parallel: char_lm was built without MPI");
#endif
    }
    if (sp.kind == "adamw") {
      zenflow::device_adam<> opt(sp.cfg);
      out.push_back(train_with(sp.name, opt, m, c, o, arena));
    } else if (sp.kind == "zenflow") {
      zenflow::optimizer<> opt(sp.cfg);
      out.push_back(train_with(sp.name, opt, m, c, o, arena));
    } else {
      zenflow::zero_offload<> opt(sp.cfg);
      out.push_back(train_with(sp.name, opt, m, c, o, arena));
    }
  }
  return out;
}

// From scratch: every optimizer trains the same freshly initialised model.
template <class Progress>
std::vector<run_result> run_all(const corpus& c, const options& o, Progress progress) {
  tbb::task_arena arena(int(o.threads));
  const model start(shape{c.alphabet.size(), o.context, o.embed, o.hidden}, o.seed);
  return run_each(c, o, start, arena, progress);
}

// Fine-tuning: AdamW pretrains the model on cs.pretrain for o.pretrain_steps; then every
// optimizer trains a copy of the pretrained model on cs.finetune for o.steps, with fresh
// optimizer state (as a fine-tuning run starts), the same batches for each.
struct finetune_result {
  run_result pretrain;
  model pretrained;
  std::vector<run_result> runs;
};
template <class Progress>
finetune_result run_finetune(const corpora& cs, const options& o, Progress progress) {
  tbb::task_arena arena(int(o.threads));
  model m(shape{cs.pretrain.alphabet.size(), o.context, o.embed, o.hidden}, o.seed);
  options po = o;
  po.steps = o.pretrain_steps;
  po.eval_every = po.steps;  // only the pretrained model's losses are reported
  po.final_positions = 2048;
  po.rank = 0;  // data parallel: every rank pretrains the same model on rank 0's batches, alone
  po.ranks = 1;
  progress("pretrain (adamw)");
  zenflow::device_adam<> opt(zenflow_config(po));
  run_result pre = train_with("pretrain", opt, m, cs.pretrain, po, arena);
  std::vector<run_result> runs = run_each(cs.finetune, o, m, arena, progress);
  return {std::move(pre), std::move(m), std::move(runs)};
}

}  // namespace char_lm
