// The JSON configuration: the strict JSON reader on known documents and known malformations,
// the "zenflow" block's keys one by one (each checked against the config field it sets), the
// DeepSpeed document form, every rejection with its message, and a to_json round trip over
// random configurations.
#include <doctest/doctest.h>

#if defined(__linux__)
#  include <sched.h>
#endif

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <thread>

#include <zenflow/config.hpp>

using namespace zenflow;
namespace json = zenflow::detail::json;

namespace {
void expect_json_error(const std::string& text, const std::string& msg) {
  CAPTURE(text);
  CHECK_THROWS_WITH_AS(config_from_json(text), msg.c_str(), config_error);
}
}  // namespace

TEST_CASE("json: values, escapes, numbers and positions") {
  const json::value v = json::parse(
      "{\"a\": [1, -0.5, 2e3, 1E-2, 0, true, false, null],\n"
      " \"s\": \"q\\\"\\\\\\/\\b\\f\\n\\r\\t\\u0041\\u00e9\\ud83d\\ude00\xc3\xa9\",\n"
      " \"o\": {}}");
  REQUIRE(v.type == json::kind::object);
  REQUIRE(v.keys.size() == 3);
  const json::value& a = *v.find("a");
  REQUIRE(a.items.size() == 8);
  CHECK(a.items[0].number == 1.0);
  CHECK(a.items[1].number == -0.5);
  CHECK(a.items[2].number == 2000.0);
  CHECK(a.items[3].number == 0.01);  // both sides are the correctly rounded double of 1/100
  CHECK(a.items[3].text == "1E-2");
  CHECK(a.items[5].type == json::kind::boolean);
  CHECK(a.items[5].boolean);
  CHECK_FALSE(a.items[6].boolean);
  CHECK(a.items[7].type == json::kind::null);
  // U+00E9 is C3 A9 in UTF-8, U+1F600 (the surrogate pair) is F0 9F 98 80
  CHECK(v.find("s")->text == "q\"\\/\b\f\n\r\tA\xc3\xa9\xf0\x9f\x98\x80\xc3\xa9");
  CHECK(v.find("s")->line == 2);
  CHECK(v.find("s")->column == 7);
  CHECK(v.find("o")->type == json::kind::object);
  CHECK(v.find("missing") == nullptr);
  // Tiny magnitudes read as what they round to; huge ones are errors.
  CHECK(json::parse("1e-400").number == 0.0);
  CHECK(std::signbit(json::parse("-1e-400").number));
  CHECK(json::parse("4.9406564584124654e-324").number == std::ldexp(1.0, -1074));
  // ... judged by the value, not by the exponent's sign: 1 and 400 zeros e-5 is 1e395 (huge),
  // 0.(399 zeros)1e+5 is 1e-395 (tiny)
  const std::string huge = "1" + std::string(400, '0') + "e-5", tiny = "0." + std::string(399, '0') + "1e+5";
  CHECK_THROWS_WITH_AS(json::parse(huge), doctest::Contains("number out of range"), json::parse_error);
  CHECK(json::parse(tiny).number == 0.0);
  CHECK(json::parse("-" + tiny).number == 0.0);
  CHECK(std::signbit(json::parse("-" + tiny).number));
  CHECK_THROWS_WITH_AS(json::parse("-0.001e+99999999999999999999999"), doctest::Contains("number out of range"),
                       json::parse_error);
  CHECK(json::parse("123.5e-99999999999999999999999").number == 0.0);
}

// json::integral decides on the literal's exact decimal value (known cases: each row's value
// worked out by hand, the doubles they round to noted where they mislead).
TEST_CASE("json: whether a number literal is an integer, by its exact value") {
  for (const char* yes : {"0", "-0", "0.0", "0e-9", "0.000e5", "7", "-7", "70e-1", "7.0", "7.000", "0.7e1", "0.07e2",
                          "1e3", "1E+3", "12.5e1", "100e-2", "1.5e1", "4294967295", "1e999999999999999999"}) {
    CAPTURE(yes);
    CHECK(json::integral(yes));
  }
  for (const char* no : {"0.5", "-0.5", "7.01", "2.00000000000000001" /* the double 2 */, "1e-400" /* 0 */,
                         "125e-2", "1.25e1", "0.07e1", "5e-1", "1e-999999999999999999", "4294967295.5"}) {
    CAPTURE(no);
    CHECK_FALSE(json::integral(no));
  }
}

TEST_CASE("json: each malformation is refused with its position") {
  struct bad {
    const char* text;
    const char* msg;
  };
  const bad cases[] = {
      {"", "line 1 column 1: unexpected end of input, expected a value"},
      {"{\"a\": 1,}", "line 1 column 9: expected a member name in double quotes"},
      {"[1, 2,]", "line 1 column 7: unexpected character ']'"},
      {"{\"a\": 1, \"a\": 2}", "line 1 column 13: duplicate key \"a\""},
      {"{\"a\" 1}", "line 1 column 6: expected ':' after the member name"},
      {"{\"a\": 1 \"b\": 2}", "line 1 column 9: expected ',' or '}' in an object"},
      {"[1 2]", "line 1 column 4: expected ',' or ']' in an array"},
      {"01", "line 1 column 2: leading zero in a number"},
      {"-", "line 1 column 2: expected digits in a number"},
      {"1.", "line 1 column 3: expected digits after the decimal point"},
      {"1e+", "line 1 column 4: expected digits in the exponent"},
      {"1e400", "line 1 column 6: number out of range: 1e400"},
      {"+1", "line 1 column 1: unexpected character '+'"},
      {"tru", "line 1 column 1: invalid literal (expected true)"},
      {"\"abc", "line 1 column 5: unterminated string"},
      {"\"a\tb\"", "line 1 column 3: control character in a string (escape it)"},
      {"\"\\x\"", "line 1 column 4: invalid escape '\\x'"},
      {"\"\\u12G4\"", "line 1 column 7: invalid hex digit in a \\u escape"},
      {"\"\\udc00\"", "line 1 column 8: lone low surrogate in a \\u escape"},
      {"\"\\ud800x\"", "line 1 column 8: high surrogate not followed by a low one"},
      {"\"\xc0\xaf\"", "line 1 column 2: invalid UTF-8 in a string"},       // overlong '/'
      {"\"\xed\xa0\x80\"", "line 1 column 2: invalid UTF-8 in a string"},   // encoded surrogate
      {"\"\xe2\x82\"", "line 1 column 2: invalid UTF-8 in a string"},       // truncated, then quote
      {"{} x", "line 1 column 4: unexpected text after the JSON value"},
      {"// c\n{}", "line 1 column 1: unexpected character '/'"},
      {"{\n\n  \"a\": ?}", "line 3 column 8: unexpected character '?'"},
      {"\x01", "line 1 column 1: unexpected character '\\x01'"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.text);
    CHECK_THROWS_WITH_AS(json::parse(c.text), c.msg, json::parse_error);
  }
  // Nesting: 64 levels are fine, 65 are refused (no unbounded recursion on hostile input).
  CHECK_NOTHROW(json::parse(std::string(63, '[') + std::string(63, ']')));
  CHECK_THROWS_WITH_AS(json::parse(std::string(100000, '[')),
                       "line 1 column 65: nesting deeper than 64 levels", json::parse_error);
}

TEST_CASE("config_from_json: each key sets its field, absent keys keep the base") {
  const config def{};
  CHECK(config_from_json("{}") == def);
  config base;
  base.adam.lr = 3e-4f;
  base.update_interval = interval::every(2);
  base.select_interval = interval::every(8);
  CHECK(config_from_json("{}", base) == base);

  config c = config_from_json(R"({"topk_ratio": 0.25, "update_interval": 8, "select_strategy": "step",
      "select_interval": 32, "full_warm_up_rounds": 3.0, "overlap_step": false, "auto_ratio": 0.5,
      "steps_per_epoch": 100, "offload": false, "score": "l2sq", "host_threads": 6, "reselect_moments": "reset",
      "host_gradient": "sum", "gradient_reduction": "sum"})");
  CHECK(c.topk_ratio == 0.25);
  CHECK(c.update_interval == interval::every(8));
  CHECK(c.select_interval == interval::every(32));
  CHECK(c.full_warm_up_rounds == 3);  // an integral number written as 3.0 is an integer
  CHECK_FALSE(c.overlap_step);
  CHECK(c.auto_ratio == 0.5);
  CHECK(c.steps_per_epoch == 100);
  CHECK(c.score == score_kind::l2sq);
  CHECK(c.host_threads == 6);
  CHECK(c.reselect_moments == reselect_policy::reset);
  CHECK(def.reselect_moments == reselect_policy::keep);  // the default: lossless
  CHECK(c.host_gradient == window_gradient::sum);
  CHECK(def.host_gradient == window_gradient::mean);
  CHECK(c.gradient_reduction == reduce_op::sum);
  CHECK(def.gradient_reduction == reduce_op::mean);
  CHECK(c.adam.lr == def.adam.lr);  // not in the block

  // select_strategy x select_interval
  c = config_from_json(R"({"select_interval": 16})");
  CHECK(c.select_interval == interval::every(16));  // no strategy + integer = "step"
  c = config_from_json(R"({"select_strategy": "auto", "select_interval": "auto", "steps_per_epoch": 40})");
  CHECK(c.select_interval == interval::auto_());
  CHECK(c.select_steps() == 40);
  c = config_from_json(R"({"select_interval": "auto", "steps_per_epoch": 40})");
  CHECK(c.select_interval == interval::auto_());
  c = config_from_json(R"({"select_strategy": "auto", "steps_per_epoch": 40})");
  CHECK(c.select_interval == interval::auto_());
  c = config_from_json(R"({"select_strategy": "epoch", "select_interval": 3, "steps_per_epoch": 40})");
  CHECK(c.select_interval == interval::every(120));  // 3 epochs of 40 steps
  c = config_from_json(R"({"update_interval": "auto", "select_interval": 7})");
  CHECK(c.update_interval == interval::auto_());

  // pt_reserved_cores_perc: DeepSpeed's split of the n cores this process may use — the first
  // ceil(p n) to training, the rest to the host update; all to both when a side would get none;
  // only with overlap_step (written out here for the affinity mask's n)
  unsigned n = std::max(1u, std::thread::hardware_concurrency());
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) n = unsigned(CPU_COUNT(&set));
#endif
  CAPTURE(n);
  auto split = [&](double p) {
    const auto training = unsigned(std::ceil(p * n));
    return training == 0 || training >= n ? 0u : n - training;
  };
  for (const char* p : {"0", "0.25", "0.5", "0.75", "0.99", "1"}) {
    CAPTURE(p);
    c = config_from_json(std::string(R"({"overlap_step": true, "pt_reserved_cores_perc": )") + p + "}");
    CHECK(c.host_threads == split(std::stod(p)));
    c = config_from_json(std::string(R"({"pt_reserved_cores_perc": )") + p + R"(, "overlap_step": false})");
    CHECK(c.host_threads == 0);  // no effect without overlap_step: all cores
  }
  if (n == 2) {  // (the CI machine's): known values
    CHECK(config_from_json(R"({"pt_reserved_cores_perc": 0.5})").host_threads == 1);
    CHECK(config_from_json(R"({"pt_reserved_cores_perc": 0.75})").host_threads == 0);
  }
  if (n >= 4) CHECK(config_from_json(R"({"pt_reserved_cores_perc": 0.25})").host_threads == n - (n + 3) / 4);
}

TEST_CASE("config_from_json: named parameter groups") {
  const config c = config_from_json(
      R"({"param_groups": {"no_decay": {"weight_decay_scale": 0}, "embed": {"lr_scale": 0.5, "weight_decay_scale": 0.25}}})");
  REQUIRE(c.param_groups.size() == 2);
  CHECK(c.param_groups[0].name == "no_decay");  // in the file's order
  CHECK(c.group("no_decay") == param_group{1.0f, 0.0f});
  CHECK(c.group("embed") == param_group{0.5f, 0.25f});
  CHECK_THROWS_WITH_AS(c.group("bias"), "zenflow config: no parameter group \"bias\" (defined: no_decay, embed)", config_error);
  // a registration takes a group's scales
  float w[4] = {}, g[4] = {};
  const matrix_param m = matrix(w, g, rows{2}, cols{2}).group(c.group("embed"));
  CHECK(m.lr_scale == 0.5f);
  CHECK(m.weight_decay_scale == 0.25f);
  // the block replaces the base's groups; absent, it keeps them
  config base;
  base.param_groups = {{"old", {2.0f, 1.0f}}};
  CHECK(config_from_json("{}", base).param_groups == base.param_groups);
  CHECK(config_from_json(R"({"param_groups": {}})", base).param_groups.empty());
  // duplicates, checked by validate() for configs built in code (the JSON parser refuses
  // duplicate keys before that)
  config dup;
  dup.param_groups = {{"a", {}}, {"a", {}}};
  CHECK_THROWS_WITH_AS(dup.validate(), "zenflow config: param_groups must have distinct names, got \"a\" twice", config_error);
  dup.param_groups = {{"a\nb", {}}, {"a\nb", {}}};  // (shown escaped: the message stays one line)
  CHECK_THROWS_WITH_AS(dup.validate(), "zenflow config: param_groups must have distinct names, got \"a\\u000ab\" twice",
                       config_error);
  // ... and names in UTF-8, which to_json can write and the parser read back (a name in code
  // may hold any bytes: "emb\xff" could be written, but not read)
  config latin1;
  latin1.param_groups = {{"ok", {}}, {"emb\xff", {}}};
  CHECK_THROWS_WITH_AS(latin1.validate(),
                       "zenflow config: param_groups must have names in UTF-8, got a name that is not (group 1)",
                       config_error);
  config utf8;
  utf8.param_groups = {{"emb\xc3\xa9", {0.5f, 1.0f}}};  // U+00E9
  CHECK_NOTHROW(utf8.validate());
  CHECK(config_from_deepspeed_json(to_json(utf8)) == utf8);
  // in a DeepSpeed config the key sits in the zenflow block, and errors name it there
  CHECK_THROWS_WITH_AS(config_from_deepspeed_json(
                           R"({"zero_optimization": {"zenflow": {"param_groups": {"x": {"weight_decay_scale": -2}}}}})"),
                       "zenflow config: zero_optimization.zenflow.param_groups.x: weight_decay_scale must be finite and >= 0, got -2",
                       config_error);
}

TEST_CASE("config_from_json: the tutorial's block, given the epoch length") {
  const char* tutorial = R"({
      "topk_ratio": 0.05, "select_strategy": "auto", "select_interval": "auto",
      "update_interval": 4, "full_warm_up_rounds": 0, "overlap_step": true })";
  // S = "auto" is one epoch, which only the trainer knows: without it the error says so.
  expect_json_error(tutorial, "zenflow config: steps_per_epoch must be >= 1 when select_interval is \"auto\", got 0");
  config base;
  base.steps_per_epoch = 1000;
  const config c = config_from_json(tutorial, base);
  CHECK(c.topk_ratio == 0.05);
  CHECK(c.select_steps() == 1000);
  CHECK(c.update_interval == interval::every(4));
  CHECK(c.overlap_step);
}

TEST_CASE("config_from_json: unknown keys, wrong types and bad values are named") {
  expect_json_error("[]", "zenflow config: the zenflow block must be an object, got an array (line 1)");
  expect_json_error(R"({"topk": 0.1})",
                    "zenflow config: unknown key \"topk\" in the zenflow block (known: topk_ratio, select_strategy, "
                    "select_interval, update_interval, full_warm_up_rounds, overlap_step, auto_ratio, "
                    "steps_per_epoch, offload, pt_reserved_cores_perc, score, host_threads, param_groups, "
                    "reselect_moments, host_gradient, gradient_reduction)");
  expect_json_error(R"({"topk_ratio": "0.1"})", "zenflow config: topk_ratio must be a number, got a string 0.1 (line 1)");
  expect_json_error("{\n\"overlap_step\": 1}", "zenflow config: overlap_step must be a boolean, got a number 1 (line 2)");
  expect_json_error(R"({"topk_ratio": 2})", "zenflow config: topk_ratio must be in [0, 1], got 2");
  expect_json_error(R"({"update_interval": 2.5})", "zenflow config: update_interval must be an integer in [1, 4294967295] or \"auto\", got 2.5");
  expect_json_error(R"({"update_interval": -1})", "zenflow config: update_interval must be an integer in [1, 4294967295] or \"auto\", got -1");
  expect_json_error(R"({"update_interval": 4294967296})",
                    "zenflow config: update_interval must be an integer in [1, 4294967295] or \"auto\", got 4294967296");
  // a count is judged on the literal, not on the double it rounds to
  expect_json_error(R"({"host_threads": 2.00000000000000001})",
                    "zenflow config: host_threads must be an integer in [0, 4294967295], got 2.00000000000000001");
  expect_json_error(R"({"full_warm_up_rounds": 1e-400})",
                    "zenflow config: full_warm_up_rounds must be an integer in [0, 4294967295], got 1e-400");
  CHECK(config_from_json(R"({"update_interval": 400e-2, "select_interval": 0.08e2})").update_interval == interval::every(4));
  CHECK(config_from_json(R"({"full_warm_up_rounds": 0.0e-7})").full_warm_up_rounds == 0);
  expect_json_error(R"({"update_interval": "sometimes"})", "zenflow config: update_interval must be an integer or \"auto\", got \"sometimes\"");
  expect_json_error(R"({"update_interval": 0})", "zenflow config: update_interval must be >= 1 or \"auto\", got 0");
  expect_json_error(R"({"select_interval": 6})", "zenflow config: select_interval must be a multiple of update_interval (4), got 6");
  expect_json_error(R"({"select_interval": 0})", "zenflow config: select_interval must be >= 1 or \"auto\", got 0");
  expect_json_error(R"({"select_strategy": "often"})", "zenflow config: select_strategy must be \"auto\", \"step\" or \"epoch\", got \"often\"");
  expect_json_error(R"({"select_strategy": "auto", "select_interval": 8})",
                    "zenflow config: select_interval must be \"auto\" with select_strategy \"auto\" (use \"step\" for a fixed interval), got 8");
  expect_json_error(R"({"select_strategy": "step", "select_interval": "auto"})",
                    "zenflow config: select_interval \"auto\" needs select_strategy \"auto\", got \"step\"");
  expect_json_error(R"({"select_strategy": "step"})", "zenflow config: select_interval must be given (an integer) with select_strategy \"step\"");
  expect_json_error(R"({"select_strategy": "epoch", "select_interval": 2})",
                    "zenflow config: steps_per_epoch must be >= 1 with select_strategy \"epoch\"");
  expect_json_error(R"({"select_strategy": "epoch", "select_interval": 4294967295, "steps_per_epoch": 2})",
                    "zenflow config: select_interval * steps_per_epoch overflows 32 bits");
  expect_json_error(R"({"select_interval": "never"})", "zenflow config: select_interval must be an integer or \"auto\", got \"never\"");
  expect_json_error(R"({"offload": true})", "zenflow config: offload = true is not supported (zenflow keeps the device moments on the device)");
  expect_json_error(R"({"score": "l2"})", "zenflow config: score must be \"l1\" or \"l2sq\", got \"l2\"");
  // a control character of the document is shown escaped, not written into the message
  expect_json_error(R"({"score": "l\n2"})", "zenflow config: score must be \"l1\" or \"l2sq\", got \"l\\u000a2\"");
  expect_json_error(R"({"param_groups": {"a\tb": 3}})",
                    "zenflow config: param_groups.\"a\\u0009b\" must be an object, got a number 3 (line 1)");
  expect_json_error(R"({"reselect_moments": "zero"})",
                    "zenflow config: reselect_moments must be \"keep\" or \"reset\", got \"zero\"");
  expect_json_error(R"({"gradient_reduction": "max"})",
                    "zenflow config: gradient_reduction must be \"mean\" or \"sum\", got \"max\"");
  expect_json_error(R"({"host_gradient": "avg"})",
                    "zenflow config: host_gradient must be \"mean\" or \"sum\", got \"avg\"");
  expect_json_error(R"({"host_gradient": "sum", "update_interval": "auto"})",
                    "zenflow config: host_gradient = sum needs an integer update_interval (not \"auto\"), got sum");
  expect_json_error(R"({"host_threads": 2, "pt_reserved_cores_perc": 0.5})",
                    "zenflow config: host_threads and pt_reserved_cores_perc are exclusive; give one");
  expect_json_error(R"({"pt_reserved_cores_perc": 1.5})", "zenflow config: pt_reserved_cores_perc must be in [0, 1], got 1.5");
  expect_json_error(R"({"auto_ratio": -0.5})", "zenflow config: auto_ratio must be in [0, 1], got -0.5");
  CHECK(config_from_json(R"({"auto_ratio": 0})").auto_ratio == 0.0);
  // the epoch strategy's interval, in steps, not a multiple of U: the message says where it came from
  {
    config base;
    base.steps_per_epoch = 10;
    CHECK_THROWS_WITH_AS(config_from_json(R"({"select_strategy": "epoch", "select_interval": 3})", base),
                         "zenflow config: select_interval (3 epochs of steps_per_epoch 10 = 30 steps) must be a multiple "
                         "of update_interval (4)",
                         config_error);
    base.steps_per_epoch = 1001;  // the tutorial's block with a loader of 1001 batches
    CHECK_THROWS_WITH_AS(
        config_from_json(R"({"select_strategy": "auto", "select_interval": "auto", "update_interval": 4})", base),
        "zenflow config: steps_per_epoch must be a multiple of update_interval (4) when select_interval is \"auto\", got 1001",
        config_error);
  }
  expect_json_error(R"({"topk_ratio": 0.1,})", "zenflow config: invalid JSON: line 1 column 20: expected a member name in double quotes");
  expect_json_error(R"({"param_groups": []})", "zenflow config: param_groups must be an object, got an array (line 1)");
  expect_json_error(R"({"param_groups": {"a": 1}})", "zenflow config: param_groups.a must be an object, got a number 1 (line 1)");
  expect_json_error(R"({"param_groups": {"a": {"lr": 1}}})",
                    "zenflow config: unknown key \"lr\" in param_groups.a (known: lr_scale, weight_decay_scale)");
  expect_json_error(R"({"param_groups": {"a": {"lr_scale": "x"}}})",
                    "zenflow config: param_groups.a.lr_scale must be a number, got a string x (line 1)");
  expect_json_error(R"({"param_groups": {"a": {"lr_scale": -1}}})",
                    "zenflow config: param_groups.a: lr_scale must be finite and >= 0, got -1");
  expect_json_error(R"({"param_groups": {"a": {"lr_scale": 1e-50}}})",
                    "zenflow config: param_groups.a.lr_scale is 1e-50, which is not 0 but rounds to 0 in fp32 (below "
                    "about 1.4e-45); write 0 for 0");
  // the group's own bounds, with the config's lr (1e-3) and weight_decay (0.01): lr <= 1
  expect_json_error(R"({"param_groups": {"fast": {"lr_scale": 2000}}})",
                    "zenflow config: param_groups.fast: lr 0.001 times lr_scale 2000 must be at most 1");
  expect_json_error(R"({"param_groups": {"big": {"lr_scale": 1e39}}})",
                    "zenflow config: param_groups.big.lr_scale must be finite and >= 0, got 1e39 (infinite once rounded "
                    "to fp32)");
  expect_json_error(R"({"param_groups": {"": {}}})", "zenflow config: param_groups must have non-empty names, got \"\" (group 0)");
  // A failed parse returns nothing: the caller's config is untouched by construction (the
  // functions take the base by value).
}

TEST_CASE("config_from_deepspeed_json: the block, the optimizer and clipping") {
  const char* ds = R"({
    "train_batch_size": 8, "bf16": {"enabled": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 2e-5, "betas": [0.9, 0.95], "eps": 1e-6,
                                              "weight_decay": 0.1, "torch_adam": true}},
    "gradient_clipping": 1.0,
    "zero_optimization": {
      "stage": 2, "offload_optimizer": {"device": "cpu", "pin_memory": true},
      "zenflow": {"topk_ratio": 0.05, "select_strategy": "step", "select_interval": 16,
                  "update_interval": 4, "overlap_step": true}
    }
  })";
  const config c = config_from_deepspeed_json(ds);
  CHECK(c.topk_ratio == 0.05);
  CHECK(c.select_interval == interval::every(16));
  CHECK(c.adam.lr == 2e-5f);
  CHECK(c.adam.beta1 == 0.9f);
  CHECK(c.adam.beta2 == 0.95f);
  CHECK(c.adam.eps == 1e-6f);
  CHECK(c.adam.weight_decay == 0.1f);
  CHECK(c.adam.mode == adam_mode::adamw);
  CHECK(c.max_grad_norm == 1.0);

  const config classic = config_from_deepspeed_json(
      R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}, "zero_optimization": {"zenflow": {}}})");
  CHECK(classic.adam.mode == adam_mode::classic);
  // "AdamW" is AdamW whatever adam_w_mode says, as in DeepSpeed (type AdamW, or the flag)
  CHECK(config_from_deepspeed_json(
            R"({"optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}}, "zero_optimization": {"zenflow": {}}})")
            .adam.mode == adam_mode::adamw);
  // and a classic config is written as DeepSpeed reads classic Adam: "Adam" with the flag off
  const std::string doc = to_json(classic);
  CHECK(doc.find(R"("type": "Adam")") != std::string::npos);
  CHECK(doc.find(R"("adam_w_mode": false)") != std::string::npos);
  CHECK(config_from_deepspeed_json(doc) == classic);

  auto expect_ds_error = [](const std::string& text, const std::string& msg) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(config_from_deepspeed_json(text), msg.c_str(), config_error);
  };
  expect_ds_error(R"({"zero_optimization": {"stage": 2}})",
                  "zenflow config: the DeepSpeed config has no zero_optimization.zenflow block (ZenFlow is off in it)");
  expect_ds_error(R"({"zero_optimization": {"zenflow": {"topk_ratio": 0.1, "interval": 4}}})",
                  "zenflow config: unknown key \"interval\" in zero_optimization.zenflow (known: topk_ratio, select_strategy, "
                  "select_interval, update_interval, full_warm_up_rounds, overlap_step, auto_ratio, "
                  "steps_per_epoch, offload, pt_reserved_cores_perc, score, host_threads, param_groups, "
                    "reselect_moments, host_gradient, gradient_reduction)");
  expect_ds_error(R"({"zero_optimization": {"zenflow": {"update_interval": true}}})",
                  "zenflow config: zero_optimization.zenflow.update_interval must be a number, got a boolean (line 1)");
  expect_ds_error(R"({"optimizer": {"type": "SGD"}, "zero_optimization": {"zenflow": {}}})",
                  "zenflow config: optimizer.type must be \"Adam\" or \"AdamW\" (ZenFlow's update is Adam), got \"SGD\"");
  expect_ds_error(R"({"optimizer": {"params": {"lr": "auto"}}, "zero_optimization": {"zenflow": {}}})",
                  "zenflow config: optimizer.params.lr must be a number, got a string auto (line 1)");
  expect_ds_error(R"({"optimizer": {"params": {"betas": [0.9]}}, "zero_optimization": {"zenflow": {}}})",
                  "zenflow config: optimizer.params.betas must hold two numbers, got 1");
  expect_ds_error(R"({"optimizer": {"params": {"momentum": 0.9}}, "zero_optimization": {"zenflow": {}}})",
                  "zenflow config: unknown key \"momentum\" in optimizer.params (known: lr, betas, eps, weight_decay, "
                  "adam_w_mode, torch_adam, bias_correction)");
  // the optimizer block itself is read strictly too: a misspelt "params" or "type" would
  // otherwise lose the learning rate (or the Adam variant) without a word
  expect_ds_error(R"({"optimizer": {"type": "AdamW", "param": {"lr": 0.5}}, "zero_optimization": {"zenflow": {}}})",
                  "zenflow config: unknown key \"param\" in optimizer (known: type, params, legacy_fusion)");
  expect_ds_error(R"({"optimizer": {"typ": "Adam", "params": {"adam_w_mode": false}}, "zero_optimization": {"zenflow": {}}})",
                  "zenflow config: unknown key \"typ\" in optimizer (known: type, params, legacy_fusion)");
  expect_ds_error(R"({"optimizer": {"legacy_fusion": 1}, "zero_optimization": {"zenflow": {}}})",
                  "zenflow config: optimizer.legacy_fusion must be a boolean, got a number 1 (line 1)");
  // (DeepSpeed's legacy_fusion picks an implementation: accepted, nothing changes)
  CHECK(config_from_deepspeed_json(
            R"({"optimizer": {"type": "AdamW", "legacy_fusion": false, "params": {"lr": 0.002}}, "zero_optimization": {"zenflow": {}}})")
            .adam.lr == 0.002f);
  expect_ds_error(R"({"optimizer": {"params": {"bias_correction": false}}, "zero_optimization": {"zenflow": {}}})",
                  "zenflow config: optimizer.params.bias_correction = false is not supported");
  expect_ds_error(R"({"optimizer": {"params": {"betas": [0.9, 1.0]}}, "zero_optimization": {"zenflow": {}}})",
                  "zenflow config: optimizer.params.betas[1] must be in [0, 1), got 1");
  expect_ds_error(R"({"gradient_clipping": -1, "zero_optimization": {"zenflow": {}}})",
                  "zenflow config: gradient_clipping must be finite and >= 0 (0 = no clipping), got -1");
  // a value that fp32 rounds into a refused one says so
  expect_ds_error(R"({"optimizer": {"params": {"betas": [0.9, 0.99999999]}}, "zero_optimization": {"zenflow": {}}})",
                  "zenflow config: optimizer.params.betas[1] must be in [0, 1), got 1 (0.99999999 in the JSON, "
                  "rounded to fp32)");
  expect_ds_error(R"({"zero_optimization": {"zenflow": {"topk_ratio": 1.5}}})",
                  "zenflow config: zero_optimization.zenflow.topk_ratio must be in [0, 1], got 1.5");
  // a number that is not 0 but would be taken as 0 (a learning rate, a decay, a clip of 0 each
  // mean something else: none, no decay, no clipping) is refused, naming the key; 0 written in
  // any form stays 0
  expect_ds_error(R"({"optimizer": {"params": {"lr": 1e-46}}, "zero_optimization": {"zenflow": {}}})",
                  "zenflow config: optimizer.params.lr is 1e-46, which is not 0 but rounds to 0 in fp32 (below about "
                  "1.4e-45); write 0 for 0");
  expect_ds_error(R"({"optimizer": {"params": {"weight_decay": 2.5E-50}}, "zero_optimization": {"zenflow": {}}})",
                  "zenflow config: optimizer.params.weight_decay is 2.5E-50, which is not 0 but rounds to 0 in fp32 "
                  "(below about 1.4e-45); write 0 for 0");
  expect_ds_error(R"({"optimizer": {"params": {"betas": [1e-60, 0.99]}}, "zero_optimization": {"zenflow": {}}})",
                  "zenflow config: optimizer.params.betas[0] is 1e-60, which is not 0 but rounds to 0 in fp32 (below "
                  "about 1.4e-45); write 0 for 0");
  expect_ds_error(R"({"gradient_clipping": 1e-400, "zero_optimization": {"zenflow": {}}})",
                  "zenflow config: gradient_clipping is 1e-400, which is not 0 but reads as 0 (below the smallest "
                  "double); write 0 for 0");
  expect_ds_error(R"({"optimizer": {"params": {"eps": 3e-400}}, "zero_optimization": {"zenflow": {}}})",
                  "zenflow config: optimizer.params.eps is 3e-400, which is not 0 but reads as 0 (below the smallest "
                  "double); write 0 for 0");
  for (const char* zero : {"0", "0.0", "-0", "0e-500", "0.000e+12"}) {
    CAPTURE(zero);
    const config z = config_from_deepspeed_json(std::string(R"({"gradient_clipping": )") + zero +
                                                R"(, "optimizer": {"params": {"weight_decay": )" + zero +
                                                R"(}}, "zero_optimization": {"zenflow": {}}})");
    CHECK(z.max_grad_norm == 0);
    CHECK(z.adam.weight_decay == 0);
  }
  // (the smallest fp32 subnormal, 2^-149 = 1.401298e-45, is taken)
  CHECK(config_from_deepspeed_json(R"({"optimizer": {"params": {"lr": 1.401298e-45}}, "zero_optimization": {"zenflow": {}}})")
            .adam.lr == 0x1p-149f);
  expect_ds_error("[1]", "zenflow config: the DeepSpeed config must be an object, got an array (line 1)");
}

TEST_CASE("to_json: random configurations read back equal") {
  std::mt19937_64 rng(20261122);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  for (int i = 0; i < 2000; ++i) {
    config c;
    c.topk_ratio = (i % 7 == 0) ? 0.0 : u01(rng);
    const std::uint32_t U = 1 + std::uint32_t(rng() % 16);
    c.update_interval = (i % 5 == 0) ? interval::auto_() : interval::every(U);
    c.steps_per_epoch = std::uint32_t(rng() % 3) * U * std::uint32_t(1 + rng() % 50);
    if (i % 3 == 0 && c.steps_per_epoch > 0) c.select_interval = interval::auto_();
    else c.select_interval = interval::every(U * std::uint32_t(1 + rng() % 100));
    c.full_warm_up_rounds = std::uint32_t(rng() % 1000);
    c.overlap_step = rng() & 1;
    c.auto_ratio = 1.0 - u01(rng) * 0.999;
    c.score = (rng() & 1) ? score_kind::l1 : score_kind::l2sq;
    c.adam.lr = float(u01(rng) * 1e-2);
    c.adam.beta1 = float(u01(rng) * 0.999);
    c.adam.beta2 = float(u01(rng) * 0.9999);
    c.adam.eps = float(1e-12 + u01(rng) * 1e-6);
    c.adam.weight_decay = float(u01(rng));
    c.adam.mode = (rng() & 1) ? adam_mode::adamw : adam_mode::classic;
    c.max_grad_norm = (rng() & 1) ? 0.0 : u01(rng) * 10;
    c.host_threads = unsigned(rng() % 64);
    c.reselect_moments = (rng() & 1) ? reselect_policy::keep : reselect_policy::reset;
    if (!c.update_interval.automatic)
      c.host_gradient = (rng() & 1) ? window_gradient::mean : window_gradient::sum;
    c.gradient_reduction = (rng() & 1) ? reduce_op::mean : reduce_op::sum;
    for (int g = 0; g < int(rng() % 3); ++g)  // names that need escaping included
      c.param_groups.push_back({"group \"" + std::to_string(g) + "\"\n", {float(u01(rng) * 2), float(u01(rng) * 0.9)}});
    REQUIRE_NOTHROW(c.validate());
    const std::string text = to_json(c);
    CAPTURE(text);
    const config back = config_from_deepspeed_json(text);
    REQUIRE(back == c);
  }
}
