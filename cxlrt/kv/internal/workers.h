// Internal to cxlrt/kv/: helper threads that copy the items of one batch in
// parallel with the calling thread (one core copies at most ~10-15 GB/s;
// a batch of KV blocks is many independent copies).
//
// Thread-safety: Run may be called from any thread; one batch runs on the
// helpers at a time, and a caller that finds them busy runs its batch alone.
// Helpers start on the first Run, so a process that never batches large
// values has no extra threads (and forks cleanly).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace cxlrt::kv_internal {

class Workers {
 public:
  // `threads` in all, the caller included: threads - 1 helpers.
  explicit Workers(int threads) : helpers_(threads > 1 ? threads - 1 : 0) {}
  ~Workers();
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;

  // Runs fn(i) for every i in [0, n) and returns when all have run.
  void Run(size_t n, const std::function<void(size_t)>& fn);

 private:
  void Loop();

  const int helpers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  std::vector<std::thread> threads_;                  // guarded by mu_ (started once)
  const std::function<void(size_t)>* job_ = nullptr;  // guarded by mu_
  size_t n_ = 0;                                      // guarded by mu_
  uint64_t job_id_ = 0;                               // guarded by mu_
  int running_ = 0;                                   // guarded by mu_: helpers in the job
  bool stop_ = false;                                 // guarded by mu_
  std::atomic<size_t> next_{0};
};

}  // namespace cxlrt::kv_internal
