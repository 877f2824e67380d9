#include "engine/handle_waker.h"

#include "engine/engine.h"

namespace hablar::engine {

HandleWaker::HandleWaker() : thread_([this] { run(); }) {}

HandleWaker::~HandleWaker() {
  flush();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  thread_.join();
}

void HandleWaker::flush() {
  if (collected_.empty()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pending_.empty()) {
      pending_.swap(collected_);
    } else {
      pending_.insert(pending_.end(), std::make_move_iterator(collected_.begin()),
                      std::make_move_iterator(collected_.end()));
      collected_.clear();
    }
  }
  cv_.notify_one();
}

void HandleWaker::run() {
  std::vector<std::shared_ptr<RequestHandle>> batch;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
      if (pending_.empty()) return;  // stop_, nothing left
      batch.swap(pending_);
    }
    for (const auto& handle : batch) handle->wake();
    batch.clear();  // the handles' last references may go here
  }
}

}  // namespace hablar::engine
