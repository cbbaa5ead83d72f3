// The proxy thread of a communicator in asynchronous mode
// (CommOptions::asynchronous, docs/gpu.md "Streams"): calls are queued and
// return at once; this thread runs them in order. After each it calls
// `done(seq)`, so a device engine can release the streams that wait for it.
//
// Errors: the first error an op returns is kept (error()); every later op
// is still handed to `run`, which is expected to fail it fast (the
// communicator is aborted by then), and still marked done, so no stream
// waits forever.
//
// Thread-safety: Enqueue, Drain and error are called by the
// communicator's user thread; ops and `done` run on the proxy thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"

namespace cxlrt::collectives {

class StreamProxy {
 public:
  using Op = std::function<absl::Status()>;
  // `done(seq)` runs on the proxy thread after op number seq (1, 2, ...).
  explicit StreamProxy(std::function<void(uint64_t)> done);
  // Drains the queue and joins the thread.
  ~StreamProxy();
  StreamProxy(const StreamProxy&) = delete;
  StreamProxy& operator=(const StreamProxy&) = delete;

  // Queues `op`; returns its sequence number.
  uint64_t Enqueue(Op op);
  // Waits until every op queued so far has run; returns error().
  absl::Status Drain();
  // OK, or the first error an op returned.
  absl::Status error() const;

 private:
  void Loop();

  std::function<void(uint64_t)> done_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<uint64_t, Op>> queue_;  // guarded by mu_
  uint64_t enqueued_ = 0, finished_ = 0;       // guarded by mu_
  absl::Status error_;                         // guarded by mu_
  bool stop_ = false;                          // guarded by mu_
  std::thread thread_;
};

}  // namespace cxlrt::collectives
