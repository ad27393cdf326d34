// Scheduler policy: host work runs on background threads, in two lanes of at most one job each.
//  - the update lane: a window's host AdamW (launch / wait);
//  - the offload lane: a step's gradient transfer and accumulation (launch_offload /
//    wait_offload), so that it overlaps the next forward/backward the way a copy stream does.
// A wait by the training thread that actually blocks is the stall; wait_offload_quiet() is the
// wait made by a host job (the update waiting for its window's last accumulation): for the
// offloads launched before it only, not counted (the device does not see it), and it never takes
// the offload's error from the training thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

namespace zenflow {

namespace detail {

// One background thread running one job at a time.
class worker_lane {
 public:
  worker_lane() : worker_([this] { run(); }) {}
  worker_lane(const worker_lane&) = delete;
  worker_lane& operator=(const worker_lane&) = delete;
  ~worker_lane() {
    {
      std::lock_guard lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  void launch(std::function<void()> job, const char* lane) {
    std::lock_guard lock(mu_);
    if (job_ || running_) throw std::logic_error(std::string("zenflow: bounded_async: a ") + lane + " job is already in flight");
    // (a failed job's error is thrown by the next wait first: a new job neither takes it for
    // its own nor overwrites it)
    if (error_)
      throw std::logic_error(std::string("zenflow: bounded_async: the last ") + lane +
                             " job failed and its error has not been waited for");
    job_ = std::move(job);
    ++launched_;
    cv_.notify_all();
  }

  // Blocks until no job is in flight, the seconds blocked in `blocked` (set before anything is
  // thrown: the device idled all the same); then rethrows what the job threw (with `rethrow`;
  // else the error stays held for the next wait).
  void wait(double& blocked, bool rethrow = true) {
    std::unique_lock lock(mu_);
    blocked = 0;
    if (job_ || running_) {
      const auto t0 = std::chrono::steady_clock::now();
      done_cv_.wait(lock, [&] { return !job_ && !running_; });
      blocked = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    if (error_ && rethrow) std::rethrow_exception(std::exchange(error_, nullptr));
  }

  // The jobs launched so far (a ticket for wait_quiet).
  std::uint64_t launched() const {
    std::lock_guard lock(mu_);
    return launched_;
  }
  // Blocks until the first `target` jobs have finished — not one launched later: the training
  // thread, woken by the same job's end, may launch the next before this waiter runs again, and
  // a wait for "no job in flight" would then wait for that one too, and so on at every step.
  // False when one of those jobs failed and its error is held for wait() (left there); a later
  // job's error is not theirs.
  bool wait_quiet(std::uint64_t target) {
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return finished_ >= target; });
    return !(error_ && error_job_ <= target);
  }
  // Whether the calling thread is this lane's.
  bool on_this_thread() const noexcept { return std::this_thread::get_id() == worker_.get_id(); }

  bool busy() const {
    std::lock_guard lock(mu_);
    return job_ || running_;
  }
  // Whether a job's error is held for wait() (a job still running has not failed yet).
  bool failed() const {
    std::lock_guard lock(mu_);
    return error_ != nullptr;
  }

 private:
  void run() {
    std::unique_lock lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return quit_ || job_; });
      if (!job_) return;  // quit with nothing pending
      std::function<void()> job = std::move(job_);
      job_ = nullptr;
      running_ = true;
      lock.unlock();
      try {
        job();
      } catch (...) {
        lock.lock();
        error_ = std::current_exception();
        error_job_ = finished_ + 1;  // (jobs run one at a time, in launch order)
        lock.unlock();
      }
      lock.lock();
      running_ = false;
      ++finished_;
      done_cv_.notify_all();
    }
  }

  mutable std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::function<void()> job_;
  bool running_ = false, quit_ = false;
  std::uint64_t launched_ = 0, finished_ = 0;  // jobs, counted at their launch and at their end
  std::exception_ptr error_;
  std::uint64_t error_job_ = 0;  // which job error_ is from (1 = the first launched)
  std::thread worker_;  // last: starts after the other members exist
};

}  // namespace detail

class bounded_async {
 public:
  static constexpr bool concurrent = true;

  bounded_async() = default;
  bounded_async(const bounded_async&) = delete;
  bounded_async& operator=(const bounded_async&) = delete;

  // Starts a host update in the background. The previous one must have been waited for.
  template <class Job>
  void launch(Job&& job) {
    // the offloads launched before this update: those its wait_offload_quiet() waits for, counted
    // now — its thread may start only after the training thread has launched the next step's.
    // (Set by the update's own thread as the job starts, so that a refused launch changes
    // nothing a job in flight reads.)
    const std::uint64_t before = offload_.launched();
    update_.launch(
        [this, before, f = std::function<void()>(std::forward<Job>(job))] {
          update_offloads_ = before;
          f();
        },
        "host update");
  }
  // Blocks until no host update is in flight (stall); rethrows what it threw.
  void wait() { timed_wait(update_); }

  // Starts a step's offload (transfer + accumulation) in the background; one at a time.
  template <class Job>
  void launch_offload(Job&& job) {
    offload_.launch(std::function<void()>(std::forward<Job>(job)), "gradient offload");
  }
  // Blocks until no offload is in flight (stall); rethrows what it threw.
  void wait_offload() { timed_wait(offload_); }
  // The wait from a host job, for the offloads launched before it: from the host update's own
  // thread, those launched before the update was (the window's; not the next step's, which the
  // training thread may launch before the update's thread even starts), from any other thread
  // those launched before the call. Not device idle time, not counted. It leaves an error one of
  // those offloads threw for the training thread's next wait_offload (which then fails the step
  // and marks the optimizer unusable), returning false: the job must not go on with what the
  // failed offload left (a window's accumulation short of its last step); a later offload's
  // error is not the window's (true). (The training thread may have taken that error already;
  // the job then goes on, on an optimizer marked unusable, whose state a load replaces once the
  // job is done.)
  bool wait_offload_quiet() {
    const std::uint64_t target = update_.on_this_thread() ? update_offloads_ : offload_.launched();
    return offload_.wait_quiet(target);
  }
  // Whether an offload is in flight (a job that has finished, even with an error, is not).
  bool offload_busy() const { return offload_.busy(); }
  // Blocks until no offload is in flight (stall, as wait_offload), leaving an error it threw held
  // (failed() then says so) for the next wait_offload. The data-parallel ranks settle the lane
  // before they compare failed() for a step: an offload that failed later, once the ranks had
  // agreed to go on, would throw on its rank alone in the middle of the step's collectives.
  void settle_offload() {
    double s = 0;
    offload_.wait(s, false);
    add_stall(s);
  }

  bool busy() const { return update_.busy() || offload_.busy(); }
  // Whether a job has failed and its error waits for the next wait() or wait_offload(): a poll
  // that never blocks (the data-parallel optimizer's ranks compare it before each step).
  bool failed() const { return update_.failed() || offload_.failed(); }
  double stall_seconds() const {
    std::lock_guard lock(mu_);
    return stall_;
  }

 private:
  // The blocked time counts as stall whether the wait returns or rethrows the job's error.
  void timed_wait(detail::worker_lane& lane) {
    double s = 0;
    try {
      lane.wait(s);
    } catch (...) {
      add_stall(s);
      throw;
    }
    add_stall(s);
  }
  void add_stall(double s) {
    std::lock_guard lock(mu_);
    stall_ += s;
  }

  mutable std::mutex mu_;
  double stall_ = 0;
  std::uint64_t update_offloads_ = 0;  // offloads launched before the running host update (its thread's only)
  // Declared last: destroyed first, so their threads are joined while the rest still exists.
  detail::worker_lane offload_, update_;
};

}  // namespace zenflow
