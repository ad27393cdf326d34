// Scheduler policy: host work runs on a background thread, at most one job in flight. wait()
// blocks until the job is done; the blocked time is the stall.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <utility>

namespace zenflow {

class bounded_async {
 public:
  static constexpr bool concurrent = true;

  bounded_async() : worker_([this] { run(); }) {}
  bounded_async(const bounded_async&) = delete;
  bounded_async& operator=(const bounded_async&) = delete;
  ~bounded_async() {
    {
      std::lock_guard lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  // Starts job in the background. The previous job must have been waited for.
  template <class Job>
  void launch(Job&& job) {
    std::lock_guard lock(mu_);
    if (job_ || running_) throw std::logic_error("zenflow: bounded_async: a host job is already in flight");
    job_ = std::function<void()>(std::forward<Job>(job));
    cv_.notify_all();
  }

  // Blocks until no job is in flight; rethrows what the job threw.
  void wait() {
    std::unique_lock lock(mu_);
    if (job_ || running_) {
      const auto t0 = std::chrono::steady_clock::now();
      done_cv_.wait(lock, [&] { return !job_ && !running_; });
      stall_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }

  bool busy() const {
    std::lock_guard lock(mu_);
    return job_ || running_;
  }
  double stall_seconds() const {
    std::lock_guard lock(mu_);
    return stall_;
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
        lock.unlock();
      }
      lock.lock();
      running_ = false;
      done_cv_.notify_all();
    }
  }

  mutable std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::function<void()> job_;
  bool running_ = false, quit_ = false;
  std::exception_ptr error_;
  double stall_ = 0;
  std::thread worker_;  // last: starts after the other members exist
};

}  // namespace zenflow
