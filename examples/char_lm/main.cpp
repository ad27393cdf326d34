// char_lm: train a character-level language model on real text with plain AdamW, ZenFlow and
// ZeRO-Offload from the same initialisation and batches; print a table, write the loss curves
// as CSV and SVG. `char_lm --help` lists the flags.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <sstream>
#include <unistd.h>
#include <stdexcept>
#include <limits>
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
  --optimizer LIST     comma-separated, in order: adamw,zenflow,zero_offload (default: all three);
                       each may carry settings of its own: adamw:lr=0.0005, zenflow:topk=0.05,
                       zenflow:U=8, zenflow:reselect=reset, zenflow:grad=sum (combine with ':')
  --ablation           fine-tune a set of variants (AdamW at three learning rates, ZenFlow with
                       each design choice changed in turn; or the --optimizer list) on each of
                       --seeds, and write a table, ablation.json and ablation.svg
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
  --seeds LIST         --ablation: comma-separated seeds (default 1,2,3,4)
  --eval-every N       a point of the loss curves every N steps (default 20; --ablation: the
                       whole run, so its final_train is the mean over every step)
  --out DIR            where the CSV and SVG go (default char_lm_out)
  --data-parallel      run under mpirun: every rank trains on its own batches and the optimizers
                       reduce the gradients (mean; global batch = ranks x --batch); rank 0
                       reports (needs a build with MPI)
  --help               this text
Every optimizer trains the same model from the same weights on the same batches. One
512-character block in ten of each text is held out for validation; the final validation loss
is measured on every held-out position with a full context but the last, the curves on 1024 of
them (from scratch: the last 10% is held out, and the final loss measured on 2048 positions of
it, as first published).
Progress goes to stderr: one line updated in place on a terminal, a line every tenth of a run
otherwise.)";

// A bound as a reader writes it (1, 0.5; not std::to_string's 1.000000): the shortest text that
// reads back as the same value.
std::string shortest(double x) {
  char buf[32];
  return std::string(buf, std::to_chars(buf, buf + sizeof buf, x).ptr);
}

// An integer in [lo, hi] (by default what an int holds: the counts are ints), else a clear error.
long parse_int(const std::string& flag, const std::string& v, long lo, long hi = std::numeric_limits<int>::max()) {
  std::size_t used = 0;
  long x = 0;
  try {
    x = std::stol(v, &used);
  } catch (...) {
    used = 0;
  }
  if (used != v.size() || x < lo || x > hi)
    throw std::invalid_argument(flag + " expects an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                                "], got '" + v + "'");
  return x;
}
double parse_real(const std::string& flag, const std::string& v, double lo, double hi) {
  double x = 0;
  if (!char_lm::parse_number(v, x) || !(x >= lo && x <= hi))
    throw std::invalid_argument(flag + " expects a number in [" + shortest(lo) + ", " + shortest(hi) + "], got '" + v + "'");
  return x;
}

// The output directory, made and written into once before any training: a path that cannot
// take the results is refused now, not after the runs (hours, for --ablation).
void prepare_out(const std::string& out) {
  std::filesystem::create_directories(out);
  const std::string probe = out + "/.char_lm-" + std::to_string(::getpid()) + ".probe";
  std::ofstream f(probe);
  f << "char_lm\n";
  f.close();
  std::error_code ec;
  std::filesystem::remove(probe, ec);
  if (!f) throw std::runtime_error("cannot write into " + out + " (--out)");
}

void write_csv(const std::string& path, const std::vector<char_lm::run_result>& runs) {
  std::ofstream f(path);
  f << "optimizer,step,train_loss,valid_loss\n";
  for (const auto& r : runs)
    for (const auto& p : r.curve) f << r.name << ',' << p.step << ',' << p.train << ',' << p.valid << '\n';
  f.close();  // (a small file is written only here: its error, a full disk say, too)
  if (!f) throw std::runtime_error("cannot write " + path);
}

// A self-contained SVG line chart: validation (solid) and training (dashed) loss per optimizer.
void write_svg(const std::string& path, const std::vector<char_lm::run_result>& runs, double unigram) {
  const double W = 860, H = 460, L = 70, R = 270, T = 40, B = 50;
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
  o << "<text x='" << L << "' y='22' font-size='15'>char_lm: loss (nats/char) vs step; training loss: mean of the steps since the last point</text>\n";
  for (int i = 0; i <= 5; ++i) {
    const double v = lo + (hi - lo) * i / 5, s = max_step * i / 5;
    o << "<line x1='" << L << "' x2='" << W - R << "' y1='" << y(v) << "' y2='" << y(v) << "' stroke='#ddd'/>\n";
    o << "<text x='" << L - 8 << "' y='" << y(v) + 4 << "' text-anchor='end'>" << std::to_string(v).substr(0, 4) << "</text>\n";
    o << "<text x='" << x(s) << "' y='" << H - B + 18 << "' text-anchor='middle'>" << long(s) << "</text>\n";
  }
  o << "<text x='" << (L + W - R) / 2 << "' y='" << H - 12 << "' text-anchor='middle'>optimizer step</text>\n";
  o << "<line x1='" << L << "' x2='" << W - R << "' y1='" << y(unigram) << "' y2='" << y(unigram)
    << "' stroke='#888' stroke-dasharray='2,4'/>\n";
  o << "<text x='" << L + 6 << "' y='" << y(unigram) - 4 << "' fill='#888'>unigram entropy</text>\n";
  for (std::size_t k = 0; k < runs.size(); ++k) {
    const char* c = colors[k % 4];
    // A run identical to an earlier one (ZeRO-Offload and AdamW do the same math) says so in the
    // legend and is drawn with gaps, through which the earlier curve shows.
    std::string label = runs[k].name;
    bool same = false;
    for (std::size_t j = 0; j < k && !same; ++j)
      if (runs[j].curve.size() == runs[k].curve.size() &&
          std::equal(runs[j].curve.begin(), runs[j].curve.end(), runs[k].curve.begin(),
                     [](const auto& a, const auto& b) { return a.train == b.train && a.valid == b.valid; })) {
        label += " (= " + runs[j].name + ")";
        same = true;
      }
    const char* valid_dash = same ? " stroke-dasharray='7,7'" : "";
    const char* train_dash = same ? " stroke-dasharray='2,8'" : " stroke-dasharray='5,3'";
    for (int valid = 1; valid >= 0; --valid) {
      o << "<polyline fill='none' stroke='" << c << "' stroke-width='" << (valid ? 2 : 1) << "'"
        << (valid ? valid_dash : train_dash) << " points='";
      for (const auto& p : runs[k].curve) o << x(p.step) << ',' << y(valid ? p.valid : p.train) << ' ';
      o << "'/>\n";
    }
    // the legend: each run's two curves, then what it cost (stall and traffic per step)
    const double ly = T + 20 + 56 * double(k);
    char cost[96];
    std::snprintf(cost, sizeof cost, "stall %.3f s, %.2f x model bytes/step", runs[k].stall_seconds, runs[k].bytes_per_step);
    o << "<line x1='" << W - R + 8 << "' x2='" << W - R + 34 << "' y1='" << ly << "' y2='" << ly << "' stroke='" << c
      << "' stroke-width='2'" << valid_dash << "/>\n";
    o << "<text x='" << W - R + 40 << "' y='" << ly + 4 << "'>" << label << " valid</text>\n";
    o << "<line x1='" << W - R + 8 << "' x2='" << W - R + 34 << "' y1='" << ly + 15 << "' y2='" << ly + 15 << "' stroke='" << c
      << "'" << train_dash << "/>\n";
    o << "<text x='" << W - R + 40 << "' y='" << ly + 19 << "'>" << label << " train</text>\n";
    o << "<text x='" << W - R + 40 << "' y='" << ly + 34 << "' fill='#555' font-size='11'>" << cost << "</text>\n";
  }
  o << "</svg>\n";
  std::ofstream f(path);
  f << o.str();
  f.close();  // (a small file is written only here: its error, a full disk say, too)
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


// ---- the ablation: fine-tuning variants across seeds -----------------------------------------

struct ablation_row {
  std::string variant;
  std::uint64_t seed;
  char_lm::run_result run;
  double vs_adamw;  // final validation loss / AdamW's (the plain "adamw" run of the same seed) - 1
};

struct variant_summary {
  std::string variant;
  double mean_valid = 0, mean = 0, lo = 0, hi = 0;  // of vs_adamw across seeds
  std::vector<double> each;
};

std::vector<variant_summary> summarize(const std::vector<std::string>& variants, const std::vector<ablation_row>& rows) {
  std::vector<variant_summary> out;
  for (const auto& v : variants) {
    variant_summary s;
    s.variant = v;
    for (const auto& r : rows)
      if (r.variant == v) {
        s.each.push_back(r.vs_adamw);
        s.mean_valid += r.run.final_valid;
      }
    if (s.each.empty()) continue;
    s.mean_valid /= double(s.each.size());
    for (double x : s.each) s.mean += x / double(s.each.size());
    s.lo = *std::min_element(s.each.begin(), s.each.end());
    s.hi = *std::max_element(s.each.begin(), s.each.end());
    out.push_back(std::move(s));
  }
  return out;
}

std::string json_escape(const std::string& x) {
  std::string o;
  for (char ch : x) {
    if (static_cast<unsigned char>(ch) < 0x20) {  // (JSON allows no raw control character)
      char u[8];
      std::snprintf(u, sizeof u, "\\u%04x", unsigned(static_cast<unsigned char>(ch)));
      o += u;
      continue;
    }
    if (ch == '"' || ch == '\\') o += '\\';
    o += ch;
  }
  return o;
}

void write_ablation_json(const std::string& path, const char_lm::options& o, const std::vector<ablation_row>& rows) {
  std::ofstream f(path);
  f << std::setprecision(9);
  f << "{\n  \"benchmark\": \"char_lm_ablation\",\n  \"settings\": {\"pretrain_steps\": " << o.pretrain_steps
    << ", \"steps\": " << o.steps << ", \"hidden\": " << o.hidden << ", \"context\": " << o.context
    << ", \"embed\": " << o.embed << ", \"batch\": " << o.batch << ", \"lr\": " << o.lr << ", \"topk\": " << o.topk
    << ", \"update_interval\": " << o.update_interval << ", \"threads\": " << o.threads
    // final_train is the mean batch loss of the last train_window steps (--eval-every; the whole
    // run unless given), not a fixed last-20-step figure
    << ", \"train_window\": " << o.eval_every << "},\n  \"runs\": [\n";
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    f << "    {\"variant\": \"" << json_escape(r.variant) << "\", \"seed\": " << r.seed
      << ", \"start_valid\": " << r.run.start_valid << ", \"final_valid\": " << r.run.final_valid
      << ", \"final_train\": " << r.run.final_train << ", \"vs_adamw\": " << r.vs_adamw
      << ", \"stall_seconds\": " << r.run.stall_seconds << ", \"bytes_per_step\": " << r.run.bytes_per_step
      << ", \"steps_per_second\": " << r.run.steps_per_second << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  f << "  ]\n}\n";
  f.close();  // (a small file is written only here: its error, a full disk say, too)
  if (!f) throw std::runtime_error("cannot write " + path);
}

// A dot plot: per variant, each seed's validation loss relative to AdamW's (grey dots), their
// mean (a black mark) and range (a line); the +-0.5% band shaded.
void write_ablation_svg(const std::string& path, const std::vector<variant_summary>& sums, std::size_t seeds) {
  const double W = 820, L = 230, R = 120, T = 56, row = 28;
  const double H = T + row * double(sums.size()) + 50;
  double lo = -0.01, hi = 0.01;
  for (const auto& s : sums) {
    lo = std::min(lo, s.lo);
    hi = std::max(hi, s.hi);
  }
  lo = std::floor(lo * 100) / 100;  // whole percents
  hi = std::ceil(hi * 100) / 100;
  auto x = [&](double v) { return L + (W - L - R) * (v - lo) / (hi - lo); };
  std::ostringstream o;
  o << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H << "' font-family='sans-serif' font-size='12'>\n";
  o << "<rect width='100%' height='100%' fill='white'/>\n";
  o << "<text x='10' y='22' font-size='15'>char_lm fine-tuning: validation loss vs AdamW (lr 0.001), " << seeds
    << " seeds</text>\n";
  o << "<text x='10' y='40' fill='#555'>grey: each seed; black: mean; line: min to max; shaded: within 0.5%; lower is better</text>\n";
  o << "<rect x='" << x(-0.005) << "' y='" << T - 6 << "' width='" << x(0.005) - x(-0.005) << "' height='"
    << row * double(sums.size()) + 6 << "' fill='#e8f4e8'/>\n";
  const int ticks = int(std::lround((hi - lo) * 100));
  const int every = ticks > 12 ? 2 : 1;
  for (int i = 0; i <= ticks; i += every) {
    const double v = lo + 0.01 * i;
    o << "<line x1='" << x(v) << "' x2='" << x(v) << "' y1='" << T - 6 << "' y2='" << T + row * double(sums.size())
      << "' stroke='" << (std::fabs(v) < 1e-9 ? "#888" : "#ddd") << "'/>\n";
    o << "<text x='" << x(v) << "' y='" << T + row * double(sums.size()) + 16 << "' text-anchor='middle'>"
      << std::lround(v * 100) << "%</text>\n";
  }
  o << "<text x='" << (L + W - R) / 2 << "' y='" << H - 10 << "' text-anchor='middle'>final validation loss relative to AdamW's, same seed</text>\n";
  for (std::size_t k = 0; k < sums.size(); ++k) {
    const auto& s = sums[k];
    const double y = T + row * (double(k) + 0.5);
    o << "<text x='" << L - 10 << "' y='" << y + 4 << "' text-anchor='end'>" << s.variant << "</text>\n";
    o << "<line x1='" << x(s.lo) << "' x2='" << x(s.hi) << "' y1='" << y << "' y2='" << y << "' stroke='black'/>\n";
    for (double e : s.each) o << "<circle cx='" << x(e) << "' cy='" << y << "' r='3.5' fill='#999' fill-opacity='0.7'/>\n";
    o << "<rect x='" << x(s.mean) - 1.5 << "' y='" << y - 8 << "' width='3' height='16' fill='black'/>\n";
    char txt[32];
    std::snprintf(txt, sizeof txt, "%+.2f%%", 100 * s.mean);
    o << "<text x='" << W - R + 10 << "' y='" << y + 4 << "'>" << txt << "</text>\n";
  }
  o << "</svg>\n";
  std::ofstream f(path);
  f << o.str();
  f.close();  // (a small file is written only here: its error, a full disk say, too)
  if (!f) throw std::runtime_error("cannot write " + path);
}

const std::vector<std::string> ablation_variants = {
    "adamw",             "adamw:lr=0.0005",  "adamw:lr=0.00025", "zenflow",     "zenflow:lr=0.0005",
    "zenflow:lr=0.002",  "zenflow:reselect=reset", "zenflow:grad=sum", "zenflow:topk=0.05",
    "zenflow:topk=0.2",  "zenflow:U=2",      "zenflow:U=8"};

int run_ablation(char_lm::options o, const std::vector<std::uint64_t>& seeds, bool variants_given, const std::string& out,
                 const std::function<void(const std::string&)>& announce) {
  if (o.from_scratch) throw std::invalid_argument("--ablation studies fine-tuning: not with --from-scratch");
  if (!variants_given) o.optimizers = ablation_variants;
  if (std::find(o.optimizers.begin(), o.optimizers.end(), "adamw") == o.optimizers.end())
    o.optimizers.insert(o.optimizers.begin(), "adamw");  // the reference of every comparison
  for (const auto& v : o.optimizers) char_lm::parse_spec(v, o);  // every variant checked first
  const char_lm::corpora cs = char_lm::load_corpora(o.texts, o.finetune_texts);
  char_lm::check_context(cs.pretrain, o.context);
  char_lm::check_context(cs.finetune, o.context);
  std::vector<ablation_row> rows;
  for (const std::uint64_t seed : seeds) {
    o.seed = seed;
    std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
    auto ft = char_lm::run_finetune(cs, o, announce);
    double ref = 0;
    for (const auto& r : ft.runs)
      if (r.name == "adamw") ref = r.final_valid;
    for (auto& r : ft.runs) rows.push_back({r.name, seed, r, r.final_valid / ref - 1});
  }
  const auto sums = summarize(o.optimizers, rows);
  std::printf("\nfine-tuning validation loss vs AdamW (lr %g), %zu seeds; %d steps from %d of AdamW pretraining\n\n",
              double(o.lr), seeds.size(), o.steps, o.pretrain_steps);
  std::printf("| variant                  | valid (mean) | vs adamw: mean | min     | max     | each seed\n");
  std::printf("|--------------------------|--------------|----------------|---------|---------|----------\n");
  for (const auto& s : sums) {
    std::string each;
    for (double e : s.each) {
      char b[16];
      std::snprintf(b, sizeof b, "%s%+.2f", each.empty() ? "" : " ", 100 * e);
      each += b;
    }
    std::printf("| %-24s | %12.4f | %+13.2f%% | %+6.2f%% | %+6.2f%% | %s\n", s.variant.c_str(), s.mean_valid,
                100 * s.mean, 100 * s.lo, 100 * s.hi, each.c_str());
  }
  std::filesystem::create_directories(out);
  write_ablation_json(out + "/ablation.json", o, rows);
  write_ablation_svg(out + "/ablation.svg", sums, seeds.size());
  std::printf("\n%s/ablation.json, %s/ablation.svg\n", out.c_str(), out.c_str());
  return 0;
}

}  // namespace

#ifdef CHAR_LM_MPI
bool mpi_started = false;
#endif

int main(int argc, char** argv) try {
  char_lm::options o;
  std::string out = "char_lm_out";
  bool steps_given = false, ablation = false, variants_given = false, eval_given = false, data_parallel = false;
  std::vector<std::uint64_t> seeds = {1, 2, 3, 4};
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
    if (a == "--ablation") {
      ablation = true;
      continue;
    }
    if (a == "--data-parallel") {
      data_parallel = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument("unknown flag or missing value: " + a + " (try --help)");
    const std::string v = argv[++i];
    if (a == "--text") o.texts.push_back(v);
    else if (a == "--finetune-text") o.finetune_texts.push_back(v);
    else if (a == "--pretrain-steps") o.pretrain_steps = int(parse_int(a, v, 1));
    else if (a == "--optimizer") {
      o.optimizers.clear();
      variants_given = true;
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
    else if (a == "--update-interval")  // (as an optimizer spec's U=; 16 U, the select interval, fits)
      o.update_interval = unsigned(parse_int(a, v, 1, 1000000));
    else if (a == "--threads") o.threads = unsigned(parse_int(a, v, 1, 65536));  // (host_threads' bound)
    else if (a == "--seed") o.seed = std::uint64_t(parse_int(a, v, 0, std::numeric_limits<long>::max()));
    else if (a == "--eval-every") {
      o.eval_every = int(parse_int(a, v, 1));
      eval_given = true;
    } else if (a == "--seeds") {
      seeds.clear();
      std::stringstream ss(v);
      for (std::string item; std::getline(ss, item, ',');)
        seeds.push_back(std::uint64_t(parse_int(a, item, 0, std::numeric_limits<long>::max())));
      if (seeds.empty()) throw std::invalid_argument("--seeds expects a comma-separated list of seeds");
    }
    else if (a == "--out") out = v;
    else throw std::invalid_argument("unknown flag " + a + " (try --help)");
  }
  if (o.optimizers.empty()) throw std::invalid_argument("--optimizer expects a comma-separated list of optimizers, got none");
  for (const auto& name : o.optimizers) char_lm::parse_spec(name, o);  // a bad one is named before any training

  if (!o.from_scratch && !steps_given) o.steps = 600;
  // from scratch, the final validation loss is measured on 2048 held-out positions, as in the
  // published comparison
  if (o.from_scratch) o.final_positions = 2048;
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
  if (data_parallel) {
    if (ablation) throw std::invalid_argument("--ablation runs in one process: not with --data-parallel");
#ifdef CHAR_LM_MPI
    int provided = 0;  // zenflow runs threads of its own; only this one calls MPI
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    mpi_started = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &o.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &o.ranks);
    if (o.rank != 0) {  // one report: rank 0's
      o.on_step = nullptr;
      if (!std::freopen("/dev/null", "w", stdout)) throw std::runtime_error("cannot silence rank " + std::to_string(o.rank));
    }
    std::printf("data parallel: %d ranks, each %zu examples a step (global batch %zu); losses: rank 0's batches, the "
                "held-out text\n",
                o.ranks, o.batch, o.batch * std::size_t(o.ranks));
#else
    throw std::invalid_argument("--data-parallel: this char_lm was built without MPI");
#endif
  }
  if (o.rank == 0) prepare_out(out);  // (the rank that writes the results)
  if (ablation) {
    if (!steps_given) o.steps = 600;
    if (!eval_given) o.eval_every = o.steps;  // only the final losses are compared
    return run_ablation(o, seeds, variants_given, out, announce);
  }
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
    char_lm::check_context(c, o.context);
    describe("text", c);
    header(c);
    runs = char_lm::run_all(c, o, announce);
  } else {
    const char_lm::corpora cs = char_lm::load_corpora(o.texts, o.finetune_texts);
    char_lm::check_context(cs.pretrain, o.context);
    char_lm::check_context(cs.finetune, o.context);
    describe("pretraining text", cs.pretrain);
    describe("fine-tuning text", cs.finetune);
    std::printf("pretraining: AdamW, %d steps\n", o.pretrain_steps);
    header(cs.finetune);
    auto ft = char_lm::run_finetune(cs, o, announce);
    std::printf("pretrained: train loss %.4f, valid loss %.4f on the pretraining text\n", ft.pretrain.final_train,
                ft.pretrain.final_valid);
    std::printf("fine-tuning starts at valid loss %.4f on the fine-tuning text\n",
                ft.runs.empty() ? 0.0 : ft.runs.front().start_valid);
    c = cs.finetune;
    runs = std::move(ft.runs);
  }

  const char_lm::run_result* adamw = nullptr;
  for (const auto& r : runs)
    if (r.name == "adamw") adamw = &r;
  int w = 12;  // the optimizer column fits the longest name
  for (const auto& r : runs) w = std::max(w, int(r.name.size()));
  std::printf("\n| %-*s | train loss | valid loss | vs adamw | steps/s | stall s | bytes/step (x model) |\n", w, "optimizer");
  std::printf("|%s|------------|------------|----------|---------|---------|----------------------|\n",
              std::string(std::size_t(w) + 2, '-').c_str());
  for (const auto& r : runs) {
    char rel[32] = "";
    if (adamw) std::snprintf(rel, sizeof rel, "%+.2f%%", 100.0 * (r.final_valid / adamw->final_valid - 1));
    std::printf("| %-*s | %10.4f | %10.4f | %8s | %7.1f | %7.3f | %20.3f |\n", w, r.name.c_str(), r.final_train,
                r.final_valid, rel, r.steps_per_second, r.stall_seconds, r.bytes_per_step);
  }
#ifdef CHAR_LM_MPI
  if (mpi_started) {
    // what each optimizer sent the other ranks (the reduction, the statistics and selected columns
    // gathered, the params gathered), the same multiple of the model's fp32 bytes as above
    std::printf("\ndata parallel, rank 0's collectives per step (x model):");
    for (const auto& r : runs) std::printf(" %s %.3f", r.name.c_str(), r.collective_bytes_per_step);
    std::printf("\n");
    // every rank must hold the same model, bit for bit: the params' hash and the validation losses
    std::vector<std::uint64_t> mine;
    for (const auto& r : runs) {
      std::uint64_t v;
      std::memcpy(&v, &r.final_valid, 8);
      mine.push_back(r.param_hash);
      mine.push_back(v);
    }
    std::vector<std::uint64_t> all(mine.size() * std::size_t(o.ranks));
    MPI_Allgather(mine.data(), int(mine.size()), MPI_UINT64_T, all.data(), int(mine.size()), MPI_UINT64_T, MPI_COMM_WORLD);
    const bool same = std::equal(all.begin(), all.end() - std::ptrdiff_t(mine.size()), all.begin() + std::ptrdiff_t(mine.size()));
    std::printf("data parallel: final params and validation losses %s on all %d ranks\n", same ? "identical" : "DIFFERENT",
                o.ranks);
    if (!same) throw std::runtime_error("the ranks' models differ");
  }
  if (o.rank == 0) {
#endif
    std::filesystem::create_directories(out);
    write_csv(out + "/loss_curves.csv", runs);
    write_svg(out + "/loss_curves.svg", runs, c.unigram_entropy);
    std::printf("\nloss curves: %s/loss_curves.csv, %s/loss_curves.svg\n", out.c_str(), out.c_str());
#ifdef CHAR_LM_MPI
  }
  if (mpi_started) MPI_Finalize();
#endif
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "char_lm: %s\n", e.what());
#ifdef CHAR_LM_MPI
  if (mpi_started) MPI_Abort(MPI_COMM_WORLD, 2);  // the other ranks would wait for this one forever
#endif
  return 2;
}
