// Wakes the readers of request handles off the step thread. The engine appends a step's
// stream items to their handles without waking anyone (RequestHandle::append), collects the
// handles whose reader is blocked waiting, and at the end of the loop's turn hands them to
// this thread, which wakes them while the engine plans and runs its next step. Waking a
// blocked thread is a system call of several microseconds; with 256 streams, done inline it
// had become milliseconds of every decode step (bench/engine/engine_overhead).
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace hablar::engine {

class RequestHandle;

class HandleWaker {
 public:
  HandleWaker();
  ~HandleWaker();  // wakes whatever was handed over, then joins
  HandleWaker(const HandleWaker&) = delete;
  HandleWaker& operator=(const HandleWaker&) = delete;

  // Step thread: a handle to wake at the next flush().
  void add(std::shared_ptr<RequestHandle> handle) { collected_.push_back(std::move(handle)); }
  // Step thread: hands the collected handles to the waking thread (one wake-up of it).
  void flush();

 private:
  void run();

  std::vector<std::shared_ptr<RequestHandle>> collected_;  // step thread only
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::shared_ptr<RequestHandle>> pending_;  // handed over, not yet woken
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace hablar::engine
