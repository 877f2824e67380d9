#include "core/thread_pool.h"

#include <algorithm>
#include <string>

#include "core/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define HABLAR_CPU_RELAX() _mm_pause()
#else
#define HABLAR_CPU_RELAX() ((void)0)
#endif

namespace hablar {

namespace {
// Spin iterations before a waiting thread sleeps: long enough to cover the gap between the
// parallel sections of one decode step, short enough not to burn a core when idle.
constexpr int kSpinIterations = 1 << 14;
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads) {
  if (n_threads < 1)
    throw_error(ErrorKind::kInvalidArgument,
                "ThreadPool: n_threads must be >= 1, got " + std::to_string(n_threads));
  workers_.reserve((size_t)n_threads - 1);
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_task(int thread_index) {
  try {
    (*task_)(thread_index, n_threads_);
  } catch (...) {
    std::lock_guard<std::mutex> lock(error_mutex_);
    if (!first_error_) first_error_ = std::current_exception();
  }
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  task_ = &fn;
  first_error_ = nullptr;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  {
    // The lock orders the generation bump against a worker that is about to sleep.
    std::lock_guard<std::mutex> lock(mutex_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  if (sleepers_.load(std::memory_order_acquire) > 0) wake_.notify_all();
  run_task(0);
  for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) {
    if (spin < kSpinIterations) {
      HABLAR_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
  task_ = nullptr;
  if (first_error_) std::rethrow_exception(first_error_);
}

void ThreadPool::worker_loop(int thread_index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = generation_.load(std::memory_order_acquire);
    for (int spin = 0; gen == seen && spin < kSpinIterations; ++spin) {
      HABLAR_CPU_RELAX();
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      sleepers_.fetch_add(1, std::memory_order_acq_rel);
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      sleepers_.fetch_sub(1, std::memory_order_acq_rel);
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_.load(std::memory_order_acquire)) return;
    run_task(thread_index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

IndexRange split_range(int64_t n, int part, int n_parts, int64_t align) {
  if (align < 1) align = 1;
  const int64_t units = (n + align - 1) / align;
  const int64_t base = units / n_parts;
  const int64_t extra = units % n_parts;
  const int64_t begin_unit = part * base + std::min<int64_t>(part, extra);
  const int64_t end_unit = begin_unit + base + (part < extra ? 1 : 0);
  return {std::min(n, begin_unit * align), std::min(n, end_unit * align)};
}

}  // namespace hablar
