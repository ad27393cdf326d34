// Scheduler policy: host work runs inline, on the calling thread, when it is launched.
#pragma once

#include <chrono>
#include <utility>

namespace zenflow {

class synchronous {
 public:
  static constexpr bool concurrent = false;
  // Runs job now. The device waits for all of it: that time counts as stall.
  template <class Job>
  void launch(Job&& job) {
    const auto t0 = std::chrono::steady_clock::now();
    struct count {  // (on a throw too, as bounded_async counts a wait that ends in an error)
      double& stall;
      std::chrono::steady_clock::time_point t0;
      ~count() { stall += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); }
    } counted{stall_, t0};
    std::forward<Job>(job)();
  }
  void wait() noexcept {}
  // A step's offload, also inline (the optimizer's synchronous path does its offload itself).
  template <class Job>
  void launch_offload(Job&& job) {
    launch(std::forward<Job>(job));
  }
  void wait_offload() noexcept {}
  bool wait_offload_quiet() noexcept { return true; }
  bool busy() const noexcept { return false; }
  double stall_seconds() const noexcept { return stall_; }

 private:
  double stall_ = 0;
};

}  // namespace zenflow
