// A persistent pool of worker threads for the CPU kernels. Workers are created once and
// wait for work; run() splits a task into n_threads parts, fn(0, n) .. fn(n-1, n), which the
// caller and the workers claim one at a time, and returns when all parts are done. Waiting
// spins briefly before sleeping, so the many short parallel sections of a decode step do not
// pay a wake-up each; and since parts are claimed rather than assigned, a worker the OS has
// not scheduled yet never holds the caller up (the caller runs the part itself).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace hablar {

class ThreadPool {
 public:
  // n_threads >= 1; the calling thread is one of them, so n_threads - 1 workers start.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Runs fn(part, n_threads) for every part in [0, n_threads), each exactly once and on some
  // thread of the pool (never two parts at once on one thread), and waits for all of them.
  // An exception thrown by a part is rethrown here (the first one) after all parts finish.
  // Not reentrant: fn must not call run() on the same pool.
  void run(const std::function<void(int thread_index, int n_threads)>& fn);

 private:
  void worker_loop();
  // Claims and runs parts of the run numbered `generation` until none is left.
  void claim_parts(uint64_t generation);

  int n_threads_;
  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* task_ = nullptr;
  // (run number << 32) | next unclaimed part: a worker claims parts only of the run it saw.
  alignas(64) std::atomic<uint64_t> state_{0};
  alignas(64) std::atomic<int> done_{0};
  alignas(64) std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
  std::mutex error_mutex_;
  std::exception_ptr first_error_;
};

// Splits [0, n) into n_parts nearly equal ranges aligned to `align`; part i is returned.
struct IndexRange {
  int64_t begin;
  int64_t end;
};
IndexRange split_range(int64_t n, int part, int n_parts, int64_t align = 1);

}  // namespace hablar
