// A persistent pool of worker threads for the CPU kernels. Workers are created once and
// wait for work; run() hands every thread (the caller included, as thread 0) the same
// function and returns when all have finished. Waiting spins briefly before sleeping, so
// the many short parallel sections of a decode step do not pay a wake-up each.
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

  // Runs fn(thread_index, n_threads) on every thread and waits for all of them. An
  // exception thrown by fn on any thread is rethrown here (the first one) after all finish.
  // Not reentrant: fn must not call run() on the same pool.
  void run(const std::function<void(int thread_index, int n_threads)>& fn);

 private:
  void worker_loop(int thread_index);
  void run_task(int thread_index);

  int n_threads_;
  std::vector<std::thread> workers_;
  const std::function<void(int, int)>* task_ = nullptr;
  // generation_ counts run() calls; a worker starts the task when it sees a new value.
  alignas(64) std::atomic<uint64_t> generation_{0};
  alignas(64) std::atomic<int> pending_{0};
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
