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
  for (int i = 1; i < n_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_.store(true, std::memory_order_seq_cst);
    state_.fetch_add(uint64_t{1} << 32, std::memory_order_seq_cst);
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::claim_parts(uint64_t generation) {
  for (;;) {
    uint64_t s = state_.load(std::memory_order_acquire);
    if ((s >> 32) != generation) return;
    const int part = (int)(s & 0xffffffffu);
    if (part >= n_threads_) return;
    if (!state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel)) continue;
    try {
      (*task_)(part, n_threads_);
    } catch (...) {
      std::lock_guard<std::mutex> lock(error_mutex_);
      if (!first_error_) first_error_ = std::current_exception();
    }
    done_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
  if (n_threads_ == 1) {
    fn(0, 1);
    return;
  }
  task_ = &fn;
  first_error_ = nullptr;
  done_.store(0, std::memory_order_relaxed);
  // Publishes the task: a new run number with part 0 next.
  const uint64_t generation = (state_.load(std::memory_order_relaxed) >> 32) + 1;
  state_.store(generation << 32, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> lock(mutex_);
    wake_.notify_all();
  }
  claim_parts(generation);
  for (int spin = 0; done_.load(std::memory_order_acquire) != n_threads_; ++spin) {
    if (spin < kSpinIterations) {
      HABLAR_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
  task_ = nullptr;
  if (first_error_) std::rethrow_exception(first_error_);
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    uint64_t generation = state_.load(std::memory_order_acquire) >> 32;
    for (int spin = 0; generation == seen && spin < kSpinIterations; ++spin) {
      HABLAR_CPU_RELAX();
      generation = state_.load(std::memory_order_acquire) >> 32;
    }
    if (generation == seen) {
      std::unique_lock<std::mutex> lock(mutex_);
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      wake_.wait(lock, [&] { return (state_.load(std::memory_order_seq_cst) >> 32) != seen; });
      sleepers_.fetch_sub(1, std::memory_order_seq_cst);
      generation = state_.load(std::memory_order_acquire) >> 32;
    }
    seen = generation;
    if (stop_.load(std::memory_order_acquire)) return;
    claim_parts(generation);
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
