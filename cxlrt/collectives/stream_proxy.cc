#include "cxlrt/collectives/stream_proxy.h"

#include <utility>

namespace cxlrt::collectives {

StreamProxy::StreamProxy(std::function<void(uint64_t)> done)
    : done_(std::move(done)), thread_([this] { Loop(); }) {}

StreamProxy::~StreamProxy() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

uint64_t StreamProxy::Enqueue(Op op) {
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(mu_);
    seq = ++enqueued_;
    queue_.emplace_back(seq, std::move(op));
  }
  cv_.notify_all();
  return seq;
}

absl::Status StreamProxy::Drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return finished_ == enqueued_; });
  return error_;
}

absl::Status StreamProxy::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void StreamProxy::Loop() {
  for (;;) {
    std::pair<uint64_t, Op> item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      // Drains before it stops: the destructor runs what was queued.
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    absl::Status s = item.second();
    if (done_) done_(item.first);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!s.ok() && error_.ok()) error_ = std::move(s);
      finished_ = item.first;
    }
    cv_.notify_all();
  }
}

}  // namespace cxlrt::collectives
