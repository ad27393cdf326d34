// char_lm: train a character-level language model on real text with plain AdamW, ZenFlow and
// ZeRO-Offload from the same initialisation and batches; print a table, write the loss curves
// as CSV and SVG. `char_lm --help` lists the flags.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unistd.h>
#include <stdexcept>
#include <string>
#include <vector>

#include "trainer.hpp"

namespace {

const char* usage = R"(char_lm: train a character-level language model with zenflow

usage: char_lm [flags]
By default a fine-tuning run: AdamW pretrains the model on one text, then AdamW, ZenFlow and
ZeRO-Offload each fine-tune it on another, from the same weights on the same batches.
  --text FILE          pretrain on FILE (repeatable); default: the copyleft licenses (GPL, LGPL,
                       GFDL) in /usr/share/common-licenses
  --finetune-text FILE fine-tune on FILE (repeatable); default: the other licenses there
  --pretrain-steps N   AdamW steps of pretraining (default 1200)
  --from-scratch       instead: each optimizer trains a fresh model on the --text files
                       (default: every license), as in the earlier versions of this example
  --optimizer LIST     comma-separated, in order: adamw,zenflow,zero_offload (default: all three)
  --steps N            optimizer steps per run (default 600 fine-tuning, 1200 from scratch)
  --hidden H           width of the two hidden layers (default 1024: about 1.6M parameters)
  --context T          characters of context (default 16)
  --embed E            embedding width per character (default 32)
  --batch B            examples per step (default 32)
  --lr LR              AdamW learning rate (default 0.001, no weight decay)
  --topk R             zenflow: fraction of columns updated on the device (default 0.1)
  --update-interval U  zenflow: steps per host update window (default 4)
  --threads T          threads for the model and for zenflow's host arena (default 2)
  --seed S             initialisation and batch order (default 1)
  --eval-every N       validation every N steps (default 200)
  --out DIR            where the CSV and SVG go (default char_lm_out)
  --help               this text
Every optimizer trains the same model from the same weights on the same batches; the last
10% of each text is held out for validation. Progress goes to stderr: one line updated
in place on a terminal, a line every tenth of a run otherwise.)";

long parse_int(const std::string& flag, const std::string& v, long lo) {
  std::size_t used = 0;
  long x = 0;
  try {
    x = std::stol(v, &used);
  } catch (...) {
    used = 0;
  }
  if (used != v.size() || x < lo) throw std::invalid_argument(flag + " expects an integer >= " + std::to_string(lo) + ", got '" + v + "'");
  return x;
}
double parse_real(const std::string& flag, const std::string& v, double lo, double hi) {
  std::size_t used = 0;
  double x = 0;
  try {
    x = std::stod(v, &used);
  } catch (...) {
    used = 0;
  }
  if (used != v.size() || !(x >= lo && x <= hi))
    throw std::invalid_argument(flag + " expects a number in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + v + "'");
  return x;
}

void write_csv(const std::string& path, const std::vector<char_lm::run_result>& runs) {
  std::ofstream f(path);
  f << "optimizer,step,train_loss,valid_loss\n";
  for (const auto& r : runs)
    for (const auto& p : r.curve) f << r.name << ',' << p.step << ',' << p.train << ',' << p.valid << '\n';
  if (!f) throw std::runtime_error("cannot write " + path);
}

// A self-contained SVG line chart: validation (solid) and training (dashed) loss per optimizer.
void write_svg(const std::string& path, const std::vector<char_lm::run_result>& runs, double unigram) {
  const double W = 760, H = 440, L = 70, R = 170, T = 40, B = 50;
  double lo = unigram, hi = unigram, max_step = 1;
  for (const auto& r : runs)
    for (const auto& p : r.curve) {
      lo = std::min({lo, p.train, p.valid});
      hi = std::max({hi, p.train, p.valid});
      max_step = std::max(max_step, double(p.step));
    }
  lo = std::floor(lo * 10) / 10;
  hi = std::ceil(hi * 10) / 10;
  auto x = [&](double s) { return L + (W - L - R) * s / max_step; };
  auto y = [&](double v) { return T + (H - T - B) * (hi - v) / (hi - lo); };
  const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd"};
  std::ostringstream o;
  o << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H << "' font-family='sans-serif' font-size='12'>\n";
  o << "<rect width='100%' height='100%' fill='white'/>\n";
  o << "<text x='" << L << "' y='22' font-size='15'>char_lm: loss (nats/char) vs step</text>\n";
  for (int i = 0; i <= 5; ++i) {
    const double v = lo + (hi - lo) * i / 5, s = max_step * i / 5;
    o << "<line x1='" << L << "' x2='" << W - R << "' y1='" << y(v) << "' y2='" << y(v) << "' stroke='#ddd'/>\n";
    o << "<text x='" << L - 8 << "' y='" << y(v) + 4 << "' text-anchor='end'>" << std::to_string(v).substr(0, 4) << "</text>\n";
    o << "<text x='" << x(s) << "' y='" << H - B + 18 << "' text-anchor='middle'>" << long(s) << "</text>\n";
  }
  o << "<text x='" << (L + W - R) / 2 << "' y='" << H - 12 << "' text-anchor='middle'>optimizer step</text>\n";
  o << "<line x1='" << L << "' x2='" << W - R << "' y1='" << y(unigram) << "' y2='" << y(unigram)
    << "' stroke='#888' stroke-dasharray='2,4'/>\n";
  o << "<text x='" << W - R + 8 << "' y='" << y(unigram) + 4 << "' fill='#888'>unigram entropy</text>\n";
  for (std::size_t k = 0; k < runs.size(); ++k) {
    const char* c = colors[k % 4];
    for (int valid = 1; valid >= 0; --valid) {
      o << "<polyline fill='none' stroke='" << c << "' stroke-width='" << (valid ? 2 : 1) << "'"
        << (valid ? "" : " stroke-dasharray='5,3'") << " points='";
      for (const auto& p : runs[k].curve) o << x(p.step) << ',' << y(valid ? p.valid : p.train) << ' ';
      o << "'/>\n";
    }
    std::string label = runs[k].name;
    for (std::size_t j = 0; j < k; ++j)  // say so when a curve hides under an earlier one
      if (runs[j].curve.size() == runs[k].curve.size() &&
          std::equal(runs[j].curve.begin(), runs[j].curve.end(), runs[k].curve.begin(),
                     [](const auto& a, const auto& b) { return a.train == b.train && a.valid == b.valid; })) {
        label += " (= " + runs[j].name + ")";
        break;
      }
    const double ly = T + 20 + 36 * double(k);
    o << "<line x1='" << W - R + 8 << "' x2='" << W - R + 34 << "' y1='" << ly << "' y2='" << ly << "' stroke='" << c << "' stroke-width='2'/>\n";
    o << "<text x='" << W - R + 40 << "' y='" << ly + 4 << "'>" << label << " valid</text>\n";
    o << "<line x1='" << W - R + 8 << "' x2='" << W - R + 34 << "' y1='" << ly + 15 << "' y2='" << ly + 15 << "' stroke='" << c << "' stroke-dasharray='5,3'/>\n";
    o << "<text x='" << W - R + 40 << "' y='" << ly + 19 << "'>" << label << " train</text>\n";
  }
  o << "</svg>\n";
  std::ofstream f(path);
  f << o.str();
  if (!f) throw std::runtime_error("cannot write " + path);
}

// The progress of a run on stderr: step, loss (a running mean), steps per second and the time
// left. On a terminal one line rewritten in place (at most 10 times a second); otherwise, a
// plain line every tenth of the run, so a log file stays readable.
class progress_line {
 public:
  progress_line() : tty_(::isatty(STDERR_FILENO) != 0) {}
  void operator()(const std::string& name, int step, int steps, double loss, double seconds) {
    mean_ = step == 1 ? loss : 0.95 * mean_ + 0.05 * loss;
    const bool last = step == steps;
    if (tty_) {
      if (!last && seconds - shown_ < 0.1) return;
      shown_ = seconds;
    } else if (step % std::max(1, steps / 10) != 0 && !last) {
      return;
    }
    const double rate = double(step) / std::max(seconds, 1e-9);
    std::fprintf(stderr, "%s%-12s step %5d/%d  loss %.4f  %7.1f steps/s  ETA %5.1f s%s", tty_ ? "\r" : "",
                 name.c_str(), step, steps, mean_, rate, double(steps - step) / rate, tty_ && !last ? "" : "\n");
    std::fflush(stderr);
    if (last) shown_ = 0;
  }

 private:
  bool tty_;
  double mean_ = 0, shown_ = 0;
};

}  // namespace

int main(int argc, char** argv) try {
  char_lm::options o;
  std::string out = "char_lm_out";
  bool steps_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::puts(usage);
      return 0;
    }
    if (a == "--from-scratch") {
      o.from_scratch = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument("unknown flag or missing value: " + a + " (try --help)");
    const std::string v = argv[++i];
    if (a == "--text") o.texts.push_back(v);
    else if (a == "--finetune-text") o.finetune_texts.push_back(v);
    else if (a == "--pretrain-steps") o.pretrain_steps = int(parse_int(a, v, 1));
    else if (a == "--optimizer") {
      o.optimizers.clear();
      std::stringstream ss(v);
      for (std::string item; std::getline(ss, item, ',');) o.optimizers.push_back(item);
    } else if (a == "--steps") {
      o.steps = int(parse_int(a, v, 1));
      steps_given = true;
    }
    else if (a == "--hidden") o.hidden = std::size_t(parse_int(a, v, 1));
    else if (a == "--context") o.context = std::size_t(parse_int(a, v, 1));
    else if (a == "--embed") o.embed = std::size_t(parse_int(a, v, 1));
    else if (a == "--batch") o.batch = std::size_t(parse_int(a, v, 1));
    else if (a == "--lr") o.lr = float(parse_real(a, v, 0, 1));
    else if (a == "--topk") o.topk = parse_real(a, v, 0, 1);
    else if (a == "--update-interval") o.update_interval = unsigned(parse_int(a, v, 1));
    else if (a == "--threads") o.threads = unsigned(parse_int(a, v, 1));
    else if (a == "--seed") o.seed = std::uint64_t(parse_int(a, v, 0));
    else if (a == "--eval-every") o.eval_every = int(parse_int(a, v, 1));
    else if (a == "--out") out = v;
    else throw std::invalid_argument("unknown flag " + a + " (try --help)");
  }
  for (const auto& name : o.optimizers)
    if (name != "adamw" && name != "zenflow" && name != "zero_offload")
      throw std::invalid_argument("unknown optimizer '" + name + "' (adamw, zenflow, zero_offload)");

  if (!o.from_scratch && !steps_given) o.steps = 600;
  if (o.from_scratch && !o.finetune_texts.empty()) throw std::invalid_argument("--finetune-text has no use with --from-scratch");
  auto describe = [&](const char* what, const char_lm::corpus& c) {
    std::printf("%s: %zu file(s), %zu training and %zu validation characters; unigram entropy %.3f nats/char\n", what,
                c.files, c.train.size(), c.valid.size(), c.unigram_entropy);
  };
  auto announce = [](const std::string& name) {
    std::printf("training with %s ...\n", name.c_str());
    std::fflush(stdout);
  };
  char_lm::corpus c;  // the text the compared runs train on
  std::vector<char_lm::run_result> runs;
  o.on_step = progress_line{};
  auto header = [&](const char_lm::corpus& cc) {
    const char_lm::model probe({cc.alphabet.size(), o.context, o.embed, o.hidden}, 0);
    std::printf("model: %zu parameters (embedding %zux%zu, dense %zux%zu, %zux%zu, %zux%zu), %zu distinct characters\n",
                probe.parameters(), cc.alphabet.size(), o.embed, o.context * o.embed, o.hidden, o.hidden, o.hidden,
                o.hidden, cc.alphabet.size(), cc.alphabet.size());
    std::printf("zenflow: topk_ratio %.2f, update_interval %u, overlap on; %d steps of %zu examples, lr %g, %u threads\n\n",
                o.topk, o.update_interval, o.steps, o.batch, double(o.lr), o.threads);
  };
  if (o.from_scratch) {
    c = char_lm::load_corpus(o.texts);
    describe("text", c);
    header(c);
    runs = char_lm::run_all(c, o, announce);
  } else {
    const char_lm::corpora cs = char_lm::load_corpora(o.texts, o.finetune_texts);
    describe("pretraining text", cs.pretrain);
    describe("fine-tuning text", cs.finetune);
    std::printf("pretraining: AdamW, %d steps\n", o.pretrain_steps);
    header(cs.finetune);
    auto ft = char_lm::run_finetune(cs, o, announce);
    std::printf("pretrained: train loss %.4f, valid loss %.4f on the pretraining text\n", ft.pretrain.final_train,
                ft.pretrain.final_valid);
    std::printf("fine-tuning starts at valid loss %.4f on the fine-tuning text\n",
                ft.runs.empty() ? 0.0 : ft.runs.front().curve.front().valid);
    c = cs.finetune;
    runs = std::move(ft.runs);
  }

  const char_lm::run_result* adamw = nullptr;
  for (const auto& r : runs)
    if (r.name == "adamw") adamw = &r;
  std::printf("\n| optimizer    | train loss | valid loss | vs adamw | steps/s | stall s | bytes/step (x model) |\n");
  std::printf("|--------------|------------|------------|----------|---------|---------|----------------------|\n");
  for (const auto& r : runs) {
    char rel[32] = "";
    if (adamw) std::snprintf(rel, sizeof rel, "%+.2f%%", 100.0 * (r.final_valid / adamw->final_valid - 1));
    std::printf("| %-12s | %10.4f | %10.4f | %8s | %7.1f | %7.3f | %20.3f |\n", r.name.c_str(), r.final_train,
                r.final_valid, rel, r.steps_per_second, r.stall_seconds, r.bytes_per_step);
  }
  std::filesystem::create_directories(out);
  write_csv(out + "/loss_curves.csv", runs);
  write_svg(out + "/loss_curves.svg", runs, c.unigram_entropy);
  std::printf("\nloss curves: %s/loss_curves.csv, %s/loss_curves.svg\n", out.c_str(), out.c_str());
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "char_lm: %s\n", e.what());
  return 2;
}
