#include "cxlrt/kv/internal/workers.h"

namespace cxlrt::kv_internal {

Workers::~Workers() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (std::thread& t : threads_) t.join();
}

void Workers::Run(size_t n, const std::function<void(size_t)>& fn) {
  std::unique_lock<std::mutex> lock(mu_);
  if (helpers_ == 0 || n < 2 || job_ != nullptr) {
    lock.unlock();
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  if (threads_.empty()) {
    for (int k = 0; k < helpers_; ++k) threads_.emplace_back([this] { Loop(); });
  }
  job_ = &fn;
  n_ = n;
  next_.store(0, std::memory_order_relaxed);
  running_ = helpers_;
  ++job_id_;
  lock.unlock();
  start_cv_.notify_all();
  for (size_t i; (i = next_.fetch_add(1, std::memory_order_relaxed)) < n;) fn(i);
  lock.lock();
  done_cv_.wait(lock, [&] { return running_ == 0; });
  job_ = nullptr;
}

void Workers::Loop() {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    start_cv_.wait(lock, [&] { return stop_ || job_id_ != seen; });
    if (stop_) return;
    seen = job_id_;
    const auto* fn = job_;
    const size_t n = n_;
    lock.unlock();
    for (size_t i; (i = next_.fetch_add(1, std::memory_order_relaxed)) < n;) (*fn)(i);
    lock.lock();
    if (--running_ == 0) done_cv_.notify_all();
  }
}

}  // namespace cxlrt::kv_internal
