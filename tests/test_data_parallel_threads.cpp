// Data parallel with the ranks as threads of one process (host_hub.hpp: a host-space
// Communicator over shared memory with the contract's rank-order fp32 sum), against the same
// independent reference as test_mpi — one process fed the reduced gradient written out by
// data_parallel_support.hpp — bit for bit on every rank: R = 1 to 4, the gradients
// reduce-scattered (in one round and in rounds of 16 elements) and all-reduced, overlap on and
// off, mean and sum, a NaN on one rank, and a set saved by 3 ranks resumed by 2 and by one
// process. test_mpi checks all of this and more over MPI; this file runs in every build, the
// sanitizer runs included — ThreadSanitizer cannot follow MPI, so here is where it sees the
// data-parallel path (each rank's background host update against its training thread while the
// ranks meet in collectives).
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/resource.h>
#endif

#include <oneapi/tbb/info.h>

#include <zenflow/zenflow.hpp>

#include "data_parallel_model.hpp"
#include "data_parallel_support.hpp"
#include "error_slot_space.hpp"
#include "host_hub.hpp"
#include "thread_ranks.hpp"

using namespace zenflow;
using namespace zf_dp_test;

namespace {

static_assert(thread_optimizer<zf_test::hub_communicator>::reduce_scatters &&
              !thread_optimizer<zf_test::hub_allreduce_communicator>::reduce_scatters);
// Reduction rounds of 16 elements (the model's 812 otherwise fit one): about 50 a step, split
// inside rows, across tensors and across the ranks' blocks.
struct short_round_hub : zf_test::hub_communicator {
  static constexpr std::size_t reduce_round = 16;
  using zf_test::hub_communicator::hub_communicator;
};

// One process, steps [from, to) fed the reduced gradient of `ranks` ranks.
void feed_reduced(optimizer<>& opt, model& m, const gradient_source& src, int ranks, reduce_op op, int from, int to,
                  std::vector<bool>* skipped = nullptr) {
  for (int s = from; s < to; ++s) {
    src.fill_all(m, s, 0, ranks, op);
    const bool sk = opt.step().skipped;
    if (skipped) skipped->push_back(sk);
  }
}

// The state every rank must end with: one process fed the reduced gradient of R ranks (the mean),
// steps [0, n).
std::vector<unsigned char> reduced_reference(const config& cfg, const gradient_source& src, int R, int n) {
  model rm;
  optimizer<> ref(cfg);
  rm.add_to(ref);
  ref.initialize();
  feed_reduced(ref, rm, src, R, reduce_op::mean, 0, n);
  return state_of(ref, rm);
}

struct rank_out {
  std::vector<unsigned char> state;
  std::vector<bool> skipped;
};

// R ranks as threads, each writing its own gradient at steps [0, n); what each rank ends with.
template <class Comm>
std::vector<rank_out> threads_run(int R, const config& cfg, const gradient_source& src, int n) {
  zf_test::thread_hub hub(R);
  std::vector<rank_out> out(static_cast<std::size_t>(R));
  zf_test::on_ranks(hub, [&](int r) {
    model m;
    thread_optimizer<Comm> opt(cfg, Comm(hub, r));
    m.add_to(opt);
    opt.initialize();
    auto& o = out[static_cast<std::size_t>(r)];
    for (int s = 0; s < n; ++s) {
      src.fill_all(m, s, r, 0, cfg.gradient_reduction);
      o.skipped.push_back(opt.step().skipped);
    }
    o.state = state_of(opt, m);
  });
  return out;
}

}  // namespace

TEST_CASE("data parallel, ranks as threads: R ranks equal one process fed the reduced gradient, bit for bit") {
  const int steps = 13;
  for (int R = 1; R <= 4; ++R)
    for (reduce_op op : {reduce_op::mean, reduce_op::sum})
      for (bool overlap : {false, true}) {
        CAPTURE(R);
        CAPTURE(int(op));
        CAPTURE(overlap);
        const config cfg = test_config(overlap, op);
        gradient_source src;
        if (R == 3 && overlap) {  // and a NaN on one rank: every rank skips that step
          src.nan_rank = 1;
          src.nan_step = 6;
        }
        model rm;
        optimizer<> ref(cfg);
        rm.add_to(ref);
        ref.initialize();
        std::vector<bool> ref_skipped;
        feed_reduced(ref, rm, src, R, op, 0, steps, &ref_skipped);
        const auto want = state_of(ref, rm);
        if (src.nan_rank >= 0) REQUIRE(ref_skipped[std::size_t(src.nan_step)]);
        const auto scattered = threads_run<zf_test::hub_communicator>(R, cfg, src, steps);
        const auto all_reduced = threads_run<zf_test::hub_allreduce_communicator>(R, cfg, src, steps);
        const auto short_rounds = threads_run<short_round_hub>(R, cfg, src, steps);
        for (int r = 0; r < R; ++r) {
          CAPTURE(r);
          for (const auto* run : {&scattered, &all_reduced, &short_rounds}) {
            CHECK((*run)[std::size_t(r)].state == want);
            CHECK((*run)[std::size_t(r)].skipped == ref_skipped);
          }
        }
      }
}

namespace {
// A hub communicator with use_arena, as mpi_communicator has: it notes what it is lent, and
// whether each reduction call found an arena lent.
struct lending_hub : zf_test::hub_communicator {
  using zf_test::hub_communicator::hub_communicator;
  void use_arena(tbb::task_arena* a) noexcept {
    lent = a;
    if (a) {
      ++lendings;
      concurrency = a->max_concurrency();
    }
  }
  void reduce(float* data, std::size_t n, reduce_op op) {
    count();
    zf_test::hub_communicator::reduce(data, n, op);
  }
  void reduce_scatter(float* data, const std::size_t* counts, reduce_op op) {
    count();
    zf_test::hub_communicator::reduce_scatter(data, counts, op);
  }
  // (call number throw_at throws, before it meets the other ranks)
  void count() {
    ++(lent ? reduced_lent : reduced_alone);
    if (calls++ == throw_at) throw std::runtime_error("reduction failed");
  }
  tbb::task_arena* lent = nullptr;
  int lendings = 0, concurrency = 0, reduced_lent = 0, reduced_alone = 0, calls = 0, throw_at = -1;
};
}  // namespace

// An optimizer over the host space lends a communicator with use_arena its space's arena (the
// device-side threads: all cores by default, not the host updates' host_threads) for each
// step's reduction, and takes it back after the step, a skipped one too — the communicator
// never keeps a pointer into an optimizer that may move. The state is the same as without.
TEST_CASE("data parallel, ranks as threads: the reduction runs on the space's arena, lent for the step only") {
  const int R = 2, steps = 5;
  config cfg = test_config(true);
  cfg.host_threads = unsigned(tbb::info::default_concurrency()) + 1;  // (another size than the space's)
  gradient_source src;
  src.nan_rank = 1;
  src.nan_step = 3;
  const auto want = threads_run<zf_test::hub_communicator>(R, cfg, src, steps);
  std::vector<std::vector<unsigned char>> states(R);
  {
    zf_test::thread_hub hub(R);
    std::vector<int> lendings(R), concurrency(R), lent(R), alone(R), kept(R), skipped(R);
    zf_test::on_ranks(hub, [&](int r) {
      model m;
      thread_optimizer<lending_hub> opt(cfg, lending_hub(hub, r));
      m.add_to(opt);
      opt.initialize();
      for (int s = 0; s < steps; ++s) {
        src.fill_all(m, s, r, 0, reduce_op::mean);
        skipped[std::size_t(r)] += opt.step().skipped;
        kept[std::size_t(r)] += opt.communicator().lent != nullptr;
      }
      const lending_hub& c = opt.communicator();
      lendings[std::size_t(r)] = c.lendings;
      concurrency[std::size_t(r)] = c.concurrency;
      lent[std::size_t(r)] = c.reduced_lent;
      alone[std::size_t(r)] = c.reduced_alone;
      states[std::size_t(r)] = state_of(opt, m);
    });
    for (std::size_t r = 0; r < std::size_t(R); ++r) {
      CAPTURE(r);
      CHECK(skipped[r] == 1);
      CHECK(lendings[r] == steps);  // once a step, the skipped one too
      CHECK(kept[r] == 0);          // and back after each
      CHECK(concurrency[r] == tbb::info::default_concurrency());
      CHECK(lent[r] >= 2 * steps);  // (a reduce-scatter and an all-reduce a step at least)
      CHECK(alone[r] == 0);
      CHECK(states[r] == want[r].state);
    }
  }
  // A reduction that throws (the second call of the first step, on every rank alike): the arena
  // is taken back all the same.
  zf_test::thread_hub hub(R);
  std::vector<int> threw(R), lent_after(R), lent_once(R);
  zf_test::on_ranks(hub, [&](int r) {
    model m;
    lending_hub comm(hub, r);
    comm.throw_at = 1;
    thread_optimizer<lending_hub> opt(cfg, std::move(comm));
    m.add_to(opt);
    opt.initialize();
    src.fill_all(m, 0, r, 0, reduce_op::mean);
    try {
      opt.step();
    } catch (const std::runtime_error& e) {
      threw[std::size_t(r)] = std::string(e.what()) == "reduction failed";
    }
    lent_after[std::size_t(r)] = opt.communicator().lent != nullptr;
    lent_once[std::size_t(r)] = opt.communicator().lendings == 1;
  });
  for (std::size_t r = 0; r < std::size_t(R); ++r) {
    CAPTURE(r);
    CHECK(threw[r] == 1);
    CHECK(lent_once[r] == 1);
    CHECK(lent_after[r] == 0);
  }
}

TEST_CASE("data parallel, ranks as threads: a set saved by 3 ranks resumes on 2 ranks and in one process, bit-exact") {
  // 3 ranks train steps [0, 6) and save; 2 ranks (and, separately, one process) load the set and
  // train steps [6, 13) with 2 ranks' gradients. Reference: one process fed 3 ranks' reduced
  // gradient, then 2 ranks'.
  const int k = 6, n = 13;
  const std::string path = std::string(ZF_TEST_TMP_DIR) + "/threads_set.ckpt";
  for (bool overlap : {false, true}) {
    CAPTURE(overlap);
    const config cfg = test_config(overlap, reduce_op::mean);
    const gradient_source src;
    model rm;
    optimizer<> ref(cfg);
    rm.add_to(ref);
    ref.initialize();
    feed_reduced(ref, rm, src, 3, reduce_op::mean, 0, k);
    feed_reduced(ref, rm, src, 2, reduce_op::mean, k, n);
    const auto want = state_of(ref, rm);
    // rank 0's counters at the save, which every loading rank reports right after the load (the
    // communication ones included: nonzero here, where one process's are always 0)
    std::vector<optimizer_stats> after_load(2);
    const optimizer_stats at_save = save_set_on_threads(3, cfg, src, k, path);
    REQUIRE(at_save.bytes_reduced > 0);
    REQUIRE(at_save.bytes_gathered > 0);
    REQUIRE(at_save.reduce_seconds > 0);
    std::vector<std::vector<unsigned char>> resumed(2);
    {
      zf_test::thread_hub hub(2);
      zf_test::on_ranks(hub, [&](int r) {
        model m;
        thread_optimizer<zf_test::hub_communicator> opt(cfg, zf_test::hub_communicator(hub, r));
        m.add_to(opt);
        opt.initialize();
        opt.load(path);
        after_load[std::size_t(r)] = opt.stats();
        for (int s = k; s < n; ++s) {
          src.fill_all(m, s, r, 0, reduce_op::mean);
          opt.step();
        }
        resumed[std::size_t(r)] = state_of(opt, m);
      });
    }
    for (const optimizer_stats& st : after_load) {
      CHECK(st.steps == at_save.steps);
      CHECK(st.bytes_reduced == at_save.bytes_reduced);
      CHECK(st.bytes_gathered == at_save.bytes_gathered);
      CHECK(st.reduce_seconds == at_save.reduce_seconds);
    }
    CHECK(resumed[0] == want);
    CHECK(resumed[1] == want);
    model m;
    optimizer<> one(cfg);
    m.add_to(one);
    one.initialize();
    one.load(path);
    feed_reduced(one, m, src, 2, reduce_op::mean, k, n);
    CHECK(state_of(one, m) == want);
  }
  // (the set: its manifest and 3 shard files)
  for (const auto& e : std::filesystem::directory_iterator(ZF_TEST_TMP_DIR))
    if (e.path().filename().string().rfind("threads_set.ckpt", 0) == 0) std::filesystem::remove(e.path());
}

TEST_CASE("data parallel, ranks as threads: an error an earlier call left on one rank's thread refuses that step on "
          "every rank, nothing changed") {
  // (CUDA's last-error slot, played on the host by error_slot_space: a rank throwing alone
  // before the step's collectives would leave the others waiting in them, so the step's vote
  // carries it)
  using zf_test::error_slot_space;
  using slot_optimizer = optimizer<error_slot_space, column_topk, fused_adamw<error_slot_space>, simd_accumulator,
                                   host_copy, bounded_async, zf_test::hub_communicator>;
  const int R = 3, n = 13, bad = 6;
  const config cfg = test_config(true);
  const gradient_source src;
  const auto want = reduced_reference(cfg, src, R, n);

  zf_test::thread_hub hub(R);
  std::vector<std::vector<unsigned char>> got(R);
  std::vector<std::string> refused(R), refused_save(R), empty_path(R);
  const std::string path = std::string(ZF_TEST_TMP_DIR) + "/refused_set.ckpt";
  zf_test::on_ranks(hub, [&](int r) {
    model m;
    slot_optimizer opt(cfg, zf_test::hub_communicator(hub, r));
    m.add_to(opt);
    opt.initialize();
    for (int s = 0; s < n; ++s) {
      src.fill_all(m, s, r, 0, reduce_op::mean);
      if (s == bad) {
        if (r == 1) error_slot_space::left = 5;
        try {
          opt.step();
        } catch (const std::runtime_error& e) {
          refused[std::size_t(r)] = e.what();
        }
        try {  // the other collectives the same way (no rank out of step: the run goes on below)
          opt.save(path);
        } catch (const std::runtime_error& e) {
          refused_save[std::size_t(r)] = e.what();
        }
        error_slot_space::left = 0;
      }
      if (s == bad + 2) {  // an argument one rank alone refuses: every rank refuses, nothing written
        try {
          opt.save(r == 2 ? std::string() : path);
        } catch (const std::exception& e) {
          empty_path[std::size_t(r)] = e.what();
        }
      }
      opt.step();  // (at s == bad: the step again, once rank 1 cleared its error)
    }
    got[std::size_t(r)] = state_of(opt, m);
  });
  CHECK(refused[1] == "step(): error 5 left by an earlier call");  // rank 1: its own error
  for (int r : {0, 2}) {
    CAPTURE(r);
    CHECK(refused[std::size_t(r)] ==
          "zenflow: step() refused on every rank: rank 1 has an error left on its thread by an earlier call, not "
          "zenflow's (it throws that error); nothing was changed: step again once that rank has cleared it");
  }
  CHECK(refused_save[1] == "save(): error 5 left by an earlier call");
  for (int r : {0, 2}) {
    CAPTURE(r);
    CHECK(refused_save[std::size_t(r)] ==
          "zenflow: save() refused on every rank: another rank refused its arguments, could not allocate the call's "
          "host buffer or has an error left on its thread by an earlier call, not zenflow's (it throws that error); "
          "nothing was changed");
  }
  CHECK(empty_path[2] == "zenflow: save(): the path is empty");  // rank 2: its own refusal
  for (int r : {0, 1}) CHECK(empty_path[std::size_t(r)] == refused_save[0]);
  CHECK_FALSE(std::filesystem::exists(path));  // nothing was written
  for (int r = 0; r < R; ++r) CHECK(got[std::size_t(r)] == want);  // as if the refused calls never were
}

// The state copies and column_counts are collectives: a matrix id that one rank alone refuses
// must not leave the others waiting in the gather (it did: the id was checked before the vote).
// Every rank refuses, nothing changes, no rank is out of step: the run goes on bit-exactly.
TEST_CASE("data parallel, ranks as threads: a bad matrix id on one rank refuses the copy on every rank, nothing changed") {
  const int R = 3, n = 9, bad = 4;
  const config cfg = test_config(true);
  const gradient_source src;
  const auto want = reduced_reference(cfg, src, R, n);

  zf_test::thread_hub hub(R);
  std::vector<std::vector<unsigned char>> got(R);
  std::vector<std::vector<std::string>> refused(R);
  zf_test::on_ranks(hub, [&](int r) {
    model m;
    thread_optimizer<zf_test::hub_communicator> opt(cfg, zf_test::hub_communicator(hub, r));
    m.add_to(opt);
    opt.initialize();
    for (int s = 0; s < n; ++s) {
      src.fill_all(m, s, r, 0, reduce_op::mean);
      opt.step();
      if (s == bad) {
        const matrix_id id{r == 1 ? 99u : 0u};
        std::vector<float> out(R0 * C0);
        std::vector<unsigned char> params(R0 * C0 * 4);
        auto attempt = [&](auto&& call) {
          try {
            call();
            refused[std::size_t(r)].push_back("");
          } catch (const std::exception& e) {
            refused[std::size_t(r)].push_back(e.what());
          }
        };
        attempt([&] { opt.copy_master(id, out.data()); });
        attempt([&] { opt.copy_exp_avg_sq(id, out.data()); });
        attempt([&] { (void)opt.column_counts(id); });
        attempt([&] { opt.copy_params_synchronized(id, params.data()); });
      }
    }
    got[std::size_t(r)] = state_of(opt, m);
  });
  const char* calls[] = {"copy_master()", "copy_exp_avg_sq()", "column_counts()", "copy_params_synchronized()"};
  for (int r = 0; r < R; ++r) {
    CAPTURE(r);
    REQUIRE(refused[std::size_t(r)].size() == 4);
    for (std::size_t c = 0; c < 4; ++c) {
      CAPTURE(c);
      if (r == 1)
        CHECK(refused[1][c] == "zenflow: no matrix 99");
      else
        CHECK(refused[std::size_t(r)][c] ==
              "zenflow: " + std::string(calls[c]) +
                  " refused on every rank: another rank refused its arguments, could not allocate the call's host "
                  "buffer or has an error left on its thread by "
                  "an earlier call, not zenflow's (it throws that error); nothing was changed");
    }
    CHECK(got[std::size_t(r)] == want);  // as if the refused calls never were
  }
}

// any_optimizer's stream calls on a space without streams refuse a stream themselves: on one rank
// alone that refusal must go through the call's vote (before, the rank threw at once and the
// others waited for it in initialize()'s vote or the step's for ever). Every rank refuses, the
// rank at fault with its own message, nothing is built or changed, and the run goes on
// bit-exactly (against the one-process reference fed the reduced gradient).
TEST_CASE("data parallel, ranks as threads: a stream passed on one rank to a space without streams is refused on "
          "every rank, initialize() and step() alike") {
  const int R = 3, n = 9, bad = 5;
  const config cfg = test_config(true);
  const gradient_source src;
  const auto want = reduced_reference(cfg, src, R, n);
  const std::string own = "zenflow: this optimizer's space has no streams; pass no stream";

  zf_test::thread_hub hub(R);
  std::vector<std::vector<unsigned char>> got(R);
  std::vector<std::string> init_refused(R), step_refused(R);
  std::vector<int> built_after_refusal(R, -1);
  zf_test::on_ranks(hub, [&](int r) {
    model m;
    any_optimizer opt =
        any_optimizer::create<host_space>(optimizer_kind::zenflow, cfg, zf_test::hub_communicator(hub, r));
    m.add_to(opt);
    int not_a_stream = 0;
    try {
      opt.initialize(r == 1 ? static_cast<void*>(&not_a_stream) : nullptr);
    } catch (const std::invalid_argument& e) {
      init_refused[std::size_t(r)] = e.what();
    }
    built_after_refusal[std::size_t(r)] = opt.initialized() ? 1 : 0;
    opt.initialize(nullptr);  // on every rank, as if the refused call never were
    for (int s = 0; s < n; ++s) {
      src.fill_all(m, s, r, 0, reduce_op::mean);
      if (s == bad) {
        try {
          (void)opt.step(r == 2 ? static_cast<void*>(&not_a_stream) : nullptr, 1.0f);
        } catch (const std::invalid_argument& e) {
          step_refused[std::size_t(r)] = e.what();
        }
      }
      (void)opt.step(nullptr, 1.0f);
    }
    got[std::size_t(r)] = state_of(opt, m);
  });
  for (int r = 0; r < R; ++r) {
    CAPTURE(r);
    CHECK(built_after_refusal[std::size_t(r)] == 0);
    CHECK(init_refused[std::size_t(r)] ==
          (r == 1 ? own
                  : "zenflow: initialize(): another rank's initialize() failed; nothing was built on this rank either"));
    CHECK(step_refused[std::size_t(r)] ==
          (r == 2 ? own
                  : "zenflow: step() refused on every rank: rank 2's call passed an argument it refuses (that rank "
                    "throws why); nothing was changed"));
    CHECK(got[std::size_t(r)] == want);
  }
}

// The ranks' gather space grows in the middle of a step (its first statistics gather here): a
// rank that cannot allocate it throws its error and the others throw too (they waited in the
// gather for ever), every rank stops alike (the step failed midway: refused until a load), and
// a load on every rank goes on bit-exactly.
TEST_CASE("data parallel, ranks as threads: an allocation that fails on one rank mid-step stops every rank alike") {
  using zf_test::alloc_fail_space;
  using fail_optimizer = optimizer<alloc_fail_space, column_topk, fused_adamw<alloc_fail_space>, simd_accumulator,
                                   host_copy, bounded_async, zf_test::hub_communicator>;
  const int R = 3, n = 9;
  const config cfg = test_config(true);
  const gradient_source src;
  const auto want = reduced_reference(cfg, src, R, n);

  const std::string path = std::string(ZF_TEST_TMP_DIR) + "/alloc_fail_set.ckpt";
  zf_test::thread_hub hub(R);
  std::vector<std::vector<unsigned char>> got(R);
  std::vector<std::string> failed(R), refused(R);
  zf_test::on_ranks(hub, [&](int r) {
    model m;
    fail_optimizer opt(cfg, zf_test::hub_communicator(hub, r));
    m.add_to(opt);
    opt.initialize();
    opt.save(path);  // (the state before the first step)
    src.fill_all(m, 0, r, 0, reduce_op::mean);
    alloc_fail_space::fail_alloc = r == 1;
    try {
      opt.step();
    } catch (const std::exception& e) {
      failed[std::size_t(r)] = e.what();
    }
    alloc_fail_space::fail_alloc = false;
    try {
      opt.step();
    } catch (const std::exception& e) {
      refused[std::size_t(r)] = e.what();
    }
    opt.load(path);
    for (int s = 0; s < n; ++s) {
      src.fill_all(m, s, r, 0, reduce_op::mean);
      opt.step();
    }
    got[std::size_t(r)] = state_of(opt, m);
  });
  CHECK(failed[1] == std::bad_alloc().what());
  for (int r : {0, 2}) {
    CAPTURE(r);
    CHECK(failed[std::size_t(r)].find("another rank could not allocate") != std::string::npos);
  }
  for (int r = 0; r < R; ++r) {
    CAPTURE(r);
    CAPTURE(refused[std::size_t(r)]);
    // every rank refuses (load to go on), each naming its own failure (not an earlier rank's)
    CHECK(refused[std::size_t(r)].find("failed midway (" + failed[std::size_t(r)] + ")") != std::string::npos);
    CHECK(got[std::size_t(r)] == want);
  }
}

// save() takes rank 0's path for the manifest and the shards' base: a rank passing another
// (a relative path from another working directory, say) would write a shard the manifest never
// names while its clean-up removed the previous set's, leaving no loadable set. Refused on every
// rank before anything is written: the previous set stands, no rank is out of step.
TEST_CASE("data parallel, ranks as threads: a save whose path differs on one rank is refused on every rank, the previous "
          "set intact") {
  const int R = 3, n = 9, first = 3, second = 6;
  const config cfg = test_config(true);
  const gradient_source src;
  const auto at_first = reduced_reference(cfg, src, R, first), want = reduced_reference(cfg, src, R, n);

  const std::string dir = std::string(ZF_TEST_TMP_DIR) + "/path_vote", path = dir + "/set.ckpt";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  zf_test::thread_hub hub(R);
  std::vector<std::vector<unsigned char>> got(R);
  std::vector<std::string> refused(R);
  std::vector<std::string> files_before, files_after;
  auto files = [&] {
    std::vector<std::string> f;
    for (const auto& e : std::filesystem::directory_iterator(dir)) f.push_back(e.path().filename().string());
    std::sort(f.begin(), f.end());
    return f;
  };
  zf_test::on_ranks(hub, [&](int r) {
    model m;
    thread_optimizer<zf_test::hub_communicator> opt(cfg, zf_test::hub_communicator(hub, r));
    m.add_to(opt);
    opt.initialize();
    for (int s = 0; s < n; ++s) {
      src.fill_all(m, s, r, 0, reduce_op::mean);
      opt.step();
      if (s + 1 == first) opt.save(r == 1 ? dir + "/./set.ckpt" : path);  // (the same place, spelled otherwise)
      if (s + 1 == second) {
        if (r == 0) files_before = files();
        opt.synchronize();  // (a collective: every rank has seen the files before the save)
        try {
          opt.save(r == 2 ? dir + "/./../path_vote/other.ckpt" : path);
        } catch (const std::invalid_argument& e) {
          refused[std::size_t(r)] = e.what();
        }
        opt.synchronize();
        if (r == 0) files_after = files();
      }
    }
    got[std::size_t(r)] = state_of(opt, m);
  });
  for (int r = 0; r < R; ++r) {
    CAPTURE(r);
    CHECK(refused[std::size_t(r)] == "zenflow: save(" + (r == 2 ? dir + "/./../path_vote/other.ckpt" : path) +
                                         ") refused on every rank: rank 2's path names another file than rank 0's "
                                         "(every rank must pass the same path, naming the same place: made absolute, "
                                         "they differ); nothing was written");
    CHECK(got[std::size_t(r)] == want);  // no rank out of step
  }
  CHECK(files_after == files_before);
  CHECK(files_before.size() == std::size_t(R) + 1);  // the first set: its shards and manifest
  model om;
  optimizer<> one(cfg);
  om.add_to(one);
  one.initialize();
  one.load(path);
  CHECK(state_of(one, om) == at_first);
}

namespace {
// A Scheduler whose next job of a lane, once armed on a rank's thread, fails after a pause: long
// enough for the rank's next step to have voted before the failure, so that it surfaces in the
// middle of that step (the offload at its selection or before its own offload, the host update at
// the drain that publishes it).
struct late_failure : bounded_async {
  static inline thread_local bool offload_armed = false, update_armed = false;
  static std::function<void()> failing(const char* what, int ms) {
    return [what, ms] {
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      throw std::runtime_error(what);
    };
  }
  template <class Job>
  void launch_offload(Job&& job) {
    if (!std::exchange(offload_armed, false)) return bounded_async::launch_offload(std::forward<Job>(job));
    bounded_async::launch_offload(failing("gradient offload failed", 150));
  }
  template <class Job>
  void launch(Job&& job) {
    if (!std::exchange(update_armed, false)) return bounded_async::launch(std::forward<Job>(job));
    // (long enough for the rank's next step to vote first even under a sanitizer: the step has
    // nothing to wait for before its vote but the last offload, milliseconds here)
    bounded_async::launch(failing("host update failed", 1000));
  }
};
}  // namespace

// A background job that fails on one rank after the ranks voted to step would throw on that rank
// alone in the middle of the step, the others waiting in its collectives for ever. The offload
// lane is settled before the vote (its error is in it: every rank refuses the step), the host
// update's wait is voted on (every rank stops there): either way every rank throws, and a load
// on every rank goes on bit-exactly.
TEST_CASE("data parallel, ranks as threads: a background job failing late on one rank stops every rank alike") {
  using late_optimizer =
      optimizer<host_space, column_topk, fused_adamw<host_space>, simd_accumulator, host_copy, late_failure,
                zf_test::hub_communicator>;
  const int R = 3, n = 9, saved_after = 2;
  const config cfg = test_config(true);  // selections at t = 1, 5, 9; boundaries every 2
  const gradient_source src;
  const auto want = reduced_reference(cfg, src, R, n);
  // the offload launched by step t = 4 (a boundary), met by t = 5 (a selection: it waits for the
  // offload, then drains); the host update launched at t = 4, met by t = 5's drain
  for (const bool offload : {true, false}) {
    CAPTURE(offload);
    const std::string path = std::string(ZF_TEST_TMP_DIR) + "/late_failure_set.ckpt";
    zf_test::thread_hub hub(R);
    std::vector<std::vector<unsigned char>> got(R);
    std::vector<std::string> failed(R);
    zf_test::on_ranks(hub, [&](int r) {
      model m;
      late_optimizer opt(cfg, zf_test::hub_communicator(hub, r));
      m.add_to(opt);
      opt.initialize();
      for (int s = 0; s <= 4; ++s) {
        src.fill_all(m, s, r, 0, reduce_op::mean);
        if (s == 3 && r == 1) (offload ? late_failure::offload_armed : late_failure::update_armed) = true;
        try {
          opt.step();
        } catch (const std::exception& e) {
          failed[std::size_t(r)] = e.what();
          REQUIRE(s == 4);
        }
        if (s == saved_after) opt.save(path);
      }
      opt.load(path);
      for (int s = saved_after + 1; s < n; ++s) {
        src.fill_all(m, s, r, 0, reduce_op::mean);
        opt.step();
      }
      got[std::size_t(r)] = state_of(opt, m);
    });
    CHECK(failed[1] == (offload ? "gradient offload failed" : "host update failed"));
    for (int r : {0, 2}) {
      CAPTURE(r);
      if (offload)
        CHECK(failed[std::size_t(r)] == "zenflow: step() refused on every rank: rank 1's background job failed; the "
                                        "ranks are no longer in step: load a checkpoint on every rank to go on");
      else  // (the drain's vote; were the machine slow enough for the update to fail before the
            // step's vote, that vote would refuse the step instead: also every rank)
        CHECK((failed[std::size_t(r)] == "zenflow: the host update failed on another rank (which threw its error)" ||
               failed[std::size_t(r)] == "zenflow: step() refused on every rank: rank 1's background job failed; the "
                                         "ranks are no longer in step: load a checkpoint on every rank to go on"));
    }
    for (int r = 0; r < R; ++r) CHECK(got[std::size_t(r)] == want);
  }
}

#if defined(__linux__)
TEST_CASE("data parallel, ranks as threads: a set whose shards exceed the open-file limit is refused with the limit named, "
          "and loads once it is raised") {
  // A load keeps every shard it reads open until it commits; one process resuming a set of 6
  // ranks with room for only 3 more files fails with a checkpoint_error that says so, nothing
  // changed, then loads with the limit back.
  const std::string path = std::string(ZF_TEST_TMP_DIR) + "/fd_set.ckpt";
  const config cfg = test_config(false);
  const gradient_source src;
  std::vector<unsigned char> saved;
  {
    zf_test::thread_hub hub(6);
    zf_test::on_ranks(hub, [&](int r) {
      model m;
      thread_optimizer<zf_test::hub_communicator> opt(cfg, zf_test::hub_communicator(hub, r));
      m.add_to(opt);
      opt.initialize();
      for (int s = 0; s < 5; ++s) {
        src.fill_all(m, s, r, 0, reduce_op::mean);
        opt.step();
      }
      opt.save(path);
      const auto st = state_of(opt, m);
      if (r == 0) saved = st;
    });
  }
  model m;
  optimizer<> one(cfg);
  m.add_to(one);
  one.initialize();
  const auto before = state_of(one, m);
  // the smallest limit that leaves exactly 3 descriptors free, whatever is open now
  std::vector<int> open;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) open.push_back(std::stoi(e.path().filename()));
  rlimit old{};
  REQUIRE(getrlimit(RLIMIT_NOFILE, &old) == 0);
  rlimit low = old;
  for (rlim_t L = 0;; ++L) {
    rlim_t used = 0;
    for (int fd : open) used += rlim_t(fd) < L ? 1 : 0;
    if (L - used == 3) {
      low.rlim_cur = L;
      break;
    }
  }
  REQUIRE(setrlimit(RLIMIT_NOFILE, &low) == 0);
  std::string refused;
  try {
    one.load(path);
  } catch (const checkpoint_error& e) {
    refused = e.what();
  }
  REQUIRE(setrlimit(RLIMIT_NOFILE, &old) == 0);
  CHECK(refused.find("Too many open files") != std::string::npos);
  CHECK(refused.find("this load keeps the 6 shard files it reads open until it commits: raise the process's open-file "
                     "limit (ulimit -n) or resume on more ranks") != std::string::npos);
  CHECK(state_of(one, m) == before);
  one.load(path);
  CHECK(state_of(one, m) == saved);
  for (const auto& e : std::filesystem::directory_iterator(ZF_TEST_TMP_DIR))
    if (e.path().filename().string().rfind("fd_set.ckpt", 0) == 0) std::filesystem::remove(e.path());
}
#endif

TEST_CASE("data parallel, ranks as threads: a param that is not finite in one rank's block: step() refused on every rank until a load") {
  // Each rank checks the columns whose host state it builds (its block), so only rank 1 finds
  // the NaN in column C0 - 1; the step's vote refuses the step on rank 0 too, nothing changed.
  // A set saved at the start by a run without it, loaded, clears the refusal on both, and the
  // run goes on as that one.
  const config cfg = test_config(true);
  const gradient_source src;
  const std::string dir = std::string(ZF_TEST_TMP_DIR) + "/unfit_params_set";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/set.ckpt";
  std::vector<std::string> errors(2);
  std::vector<std::vector<unsigned char>> states(2), references(2);
  zf_test::thread_hub hub(2);
  zf_test::on_ranks(hub, [&](int r) {
    model m, ref;
    thread_optimizer<zf_test::hub_communicator> other(cfg, zf_test::hub_communicator(hub, r));
    ref.add_to(other);
    other.initialize();
    other.save(path);
    m.w0[R0 * (C0 - 1) + 2] = std::numeric_limits<float>::quiet_NaN();
    thread_optimizer<zf_test::hub_communicator> opt(cfg, zf_test::hub_communicator(hub, r));
    m.add_to(opt);
    opt.initialize();
    src.fill_all(m, 0, r, 0, cfg.gradient_reduction);
    try {
      opt.step();
    } catch (const std::invalid_argument& e) {
      errors[std::size_t(r)] = e.what();
    }
    CHECK(opt.stats().steps == 0);
    opt.load(path);
    for (int s = 0; s < 3; ++s) {
      src.fill_all(m, s, r, 0, cfg.gradient_reduction);
      src.fill_all(ref, s, r, 0, cfg.gradient_reduction);
      opt.step();
      other.step();
    }
    states[std::size_t(r)] = state_of(opt, m);
    references[std::size_t(r)] = state_of(other, ref);
  });
  CHECK(errors[1].rfind("zenflow: step() refused: matrix 0's param held nan at row 2, column " + std::to_string(C0 - 1) +
                            " at initialize(), and no checkpoint was loaded since",
                        0) == 0);
  CHECK(errors[0] ==
        "zenflow: step() refused on every rank: rank 1 found a param that is not finite at initialize(), and no "
        "checkpoint was loaded since (that rank throws where); nothing was changed");
  for (std::size_t r = 0; r < 2; ++r) CHECK(states[r] == references[r]);
  // a vector is checked whole on every rank: each names it itself
  zf_test::on_ranks(hub, [&](int r) {
    model m;
    m.b2[3] = std::numeric_limits<float>::infinity();
    thread_optimizer<zf_test::hub_communicator> opt(cfg, zf_test::hub_communicator(hub, r));
    m.add_to(opt);
    opt.initialize();
    src.fill_all(m, 0, r, 0, cfg.gradient_reduction);
    errors[std::size_t(r)].clear();
    try {
      opt.step();
    } catch (const std::invalid_argument& e) {
      errors[std::size_t(r)] = e.what();
    }
  });
  for (std::size_t r = 0; r < 2; ++r)
    CHECK(errors[r].rfind("zenflow: step() refused: vector 0's param held inf at element 3 at initialize()", 0) == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("data parallel, ranks as threads: a rank whose shard holds a non-finite master refuses the save on every rank") {
  // A finite but absurd param (1e30, replicated: on every rank) in a column of rank 1's block,
  // with classic Adam and weight decay: the host update at t = 2 squares g + wd * p = 1e28 into
  // that column's v, infinite, in rank 1's shard, which a load would refuse. Rank 1 refuses to
  // write it, and every rank's save throws; nothing is left at the path.
  config cfg = test_config(true);
  cfg.adam.mode = adam_mode::classic;
  cfg.adam.weight_decay = 0.01f;
  const gradient_source src;
  const std::string dir = std::string(ZF_TEST_TMP_DIR) + "/nonfinite_set";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/set.ckpt";
  std::vector<std::string> errors(2);
  zf_test::thread_hub hub(2);
  zf_test::on_ranks(hub, [&](int r) {
    model m;
    m.w0[R0 * (C0 - 1) + 2] = 1e30f;  // column C0 - 1: rank 1's block
    thread_optimizer<zf_test::hub_communicator> opt(cfg, zf_test::hub_communicator(hub, r));
    m.add_to(opt);
    opt.initialize();
    for (int s = 0; s < 2; ++s) {
      src.fill_all(m, s, r, 0, cfg.gradient_reduction);
      opt.step();
    }
    try {
      opt.save(path);
    } catch (const std::exception& e) {
      errors[std::size_t(r)] = e.what();
    }
  });
  CHECK(errors[1].find("save(" + path + ") refused: matrix 0 holds a master, moment or accumulator that is not finite") !=
        std::string::npos);
  CHECK(errors[0].find("could not be written; the previous checkpoint stands") != std::string::npos);
  CHECK(std::filesystem::is_empty(dir));
  std::filesystem::remove_all(dir);
}

TEST_CASE("data parallel, ranks as threads: a set saved by 2 ranks resumes on 3 and on 5 ranks, bit-exact") {
  // More ranks than saved the set: each new rank's block of columns starts and ends inside the
  // old blocks (40 and 24 columns: 2 blocks of 20 and 12, read as 3 of 13-14 and 8, or 5 of 8
  // and 4-5). Reference: one process fed 2 ranks' reduced gradient, then R' ranks'. Saved at a
  // boundary (6 steps, U = 2) and mid-window (7: the shards' accumulators hold step 7's
  // unselected columns, each new rank's read from the old blocks and checked against the
  // selection, which keeps the selected columns' zero).
  const int n = 11;
  const std::string path = std::string(ZF_TEST_TMP_DIR) + "/threads_grow.ckpt";
  const config cfg = test_config(true, reduce_op::mean);
  const gradient_source src;
  for (const int k : {6, 7})
  for (const int R : {3, 5}) {
    CAPTURE(k);
    CAPTURE(R);
    save_set_on_threads(2, cfg, src, k, path);
    model rm;
    optimizer<> ref(cfg);
    rm.add_to(ref);
    ref.initialize();
    feed_reduced(ref, rm, src, 2, reduce_op::mean, 0, k);
    feed_reduced(ref, rm, src, R, reduce_op::mean, k, n);
    const auto want = state_of(ref, rm);
    std::vector<std::vector<unsigned char>> resumed(static_cast<std::size_t>(R));
    zf_test::thread_hub hub(R);
    zf_test::on_ranks(hub, [&](int r) {
      model m;
      thread_optimizer<zf_test::hub_communicator> opt(cfg, zf_test::hub_communicator(hub, r));
      m.add_to(opt);
      opt.initialize();
      opt.load(path);
      for (int s = k; s < n; ++s) {
        src.fill_all(m, s, r, 0, reduce_op::mean);
        opt.step();
      }
      resumed[std::size_t(r)] = state_of(opt, m);
    });
    for (int r = 0; r < R; ++r) {
      CAPTURE(r);
      CHECK(resumed[std::size_t(r)] == want);
    }
  }
  for (const auto& e : std::filesystem::directory_iterator(ZF_TEST_TMP_DIR))
    if (e.path().filename().string().rfind("threads_grow.ckpt", 0) == 0) std::filesystem::remove(e.path());
}

TEST_CASE("data parallel, ranks as threads: a manifest whose shard name holds a NUL is refused as inconsistent") {
  // The manifest names its shards by a base; a NUL in it would end the name early where a shard
  // is opened (another file's). The base's last character made a NUL, the checksum made right
  // again: refused before any shard is opened.
  const std::string path = std::string(ZF_TEST_TMP_DIR) + "/threads_nul.ckpt";
  const std::string crafted_path = std::string(ZF_TEST_TMP_DIR) + "/threads_nul_crafted.ckpt";
  const config cfg = test_config(false, reduce_op::mean);
  const gradient_source src;
  save_set_on_threads(2, cfg, src, 3, path);
  std::vector<unsigned char> img;
  {
    std::ifstream f(path, std::ios::binary);
    img.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  // the shards section: the 4th (config, layout, counters, shards), after the 24-byte header;
  // each section is a 16-byte header (tag, length), the payload, a 4-byte checksum
  std::size_t at = 24;
  std::uint64_t len = 0;
  for (int s = 0; s < 4; ++s) {
    std::memcpy(&len, img.data() + at + 8, 8);
    if (s < 3) at += 16 + std::size_t(len) + 4;
  }
  const std::size_t payload = at + 16;
  const std::string base = "threads_nul.ckpt";
  const auto hit = std::search(img.begin() + std::ptrdiff_t(payload), img.begin() + std::ptrdiff_t(payload + len),
                               base.begin(), base.end());
  REQUIRE(hit != img.begin() + std::ptrdiff_t(payload + len));
  *(hit + std::ptrdiff_t(base.size() - 1)) = 0;
  const std::uint32_t crc = ckpt::crc32(img.data() + payload, std::size_t(len));
  std::memcpy(img.data() + payload + len, &crc, 4);
  std::ofstream(crafted_path, std::ios::binary).write(reinterpret_cast<const char*>(img.data()), std::streamsize(img.size()));
  model m;
  optimizer<> one(cfg);
  m.add_to(one);
  one.initialize();
  CHECK_THROWS_WITH_AS(one.load(crafted_path), doctest::Contains("shards section is inconsistent"), checkpoint_error);
  CHECK(one.applied_steps() == 0);
  CHECK_NOTHROW(one.load(path));  // (the set as saved loads)
  CHECK(one.applied_steps() == 3);
  std::remove(crafted_path.c_str());
  for (const auto& e : std::filesystem::directory_iterator(ZF_TEST_TMP_DIR))
    if (e.path().filename().string().rfind("threads_nul.ckpt", 0) == 0) std::filesystem::remove(e.path());
}
