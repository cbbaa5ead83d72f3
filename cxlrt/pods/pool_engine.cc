// The pool engine (pool_engine.h): a synchronous communicator in the
// interconnect pool driven by a worker thread that runs the queued calls
// in order.
#include "cxlrt/pods/pool_engine.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <numeric>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::pods {
namespace {

using collectives::CommOptions;
using collectives::Communicator;

// What a Send puts before its bytes, so that a Recv can check tag and size.
struct MessageHeader {
  int64_t tag;
  uint64_t bytes;
};
static_assert(sizeof(MessageHeader) == 16);

class PoolEngine final : public InterPodEngine {
 public:
  PoolEngine(allocator::Allocator& alloc, std::string name, const CommOptions& options,
             std::unique_ptr<Communicator> comm)
      : alloc_(alloc), name_(std::move(name)), options_(options), comm_(std::move(comm)) {
    worker_ = std::thread([this] { Loop(); });
  }

  ~PoolEngine() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
    // The communicator leaves (a barrier when it did not fail) in its
    // destructor, on this thread, once the worker is gone.
    comm_.reset();
  }

  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  const char* name() const override { return "pool"; }

  absl::StatusOr<std::unique_ptr<InterPodEngine>> Split(int color, int key,
                                                        absl::Time deadline) override {
    if (color < 0) return Bad(absl::StrCat("Split: color ", color, " is negative"));
    // Every queued call first: the worker then leaves the communicator to
    // this thread until the next Enqueue (the mutex orders the handoff).
    Ticket last;
    {
      std::lock_guard<std::mutex> l(mu_);
      last = enqueued_;
    }
    CXLRT_RETURN_IF_ERROR(Wait(last, deadline));
    const int n = size();
    std::vector<int64_t> mine = {color, key};
    std::vector<int64_t> all(2 * n);
    absl::Status s = comm_->AllGather(mine.data(), all.data(), 2, collectives::DataType::kInt64);
    if (!s.ok()) return Failed(s);
    std::vector<int> members;
    for (int r = 0; r < n; ++r) {
      if (all[2 * r] == color) members.push_back(r);
    }
    std::stable_sort(members.begin(), members.end(),
                     [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
    const int me =
        static_cast<int>(std::find(members.begin(), members.end(), rank()) - members.begin());
    const std::string child = absl::StrCat(name_, "/", splits_++, "c", color);
    CommOptions o = options_;
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("pool engine ", name_, " rank ", rank(), ": Split past its deadline"));
    }
    if (!o.timeout || *o.timeout > left) o.timeout = left;
    auto e = MakePoolEngine(alloc_, child, static_cast<int>(members.size()), me, o);
    if (!e.ok()) return e.status();
    // The child's calls wait as long as this engine's.
    static_cast<PoolEngine*>(e->get())->options_ = options_;
    return e;
  }

  absl::StatusOr<Ticket> AllReduce(const void* send, void* recv, size_t count, DataType type,
                                   RedOp op) override {
    if (op == RedOp::kAvg) return Bad("AllReduce: kAvg is the caller's (sum, then divide)");
    return Enqueue([=](Communicator& c) { return c.AllReduce(send, recv, count, type, op); });
  }
  absl::StatusOr<Ticket> ReduceScatter(const void* send, void* recv, size_t recvcount,
                                       DataType type, RedOp op) override {
    if (op == RedOp::kAvg) return Bad("ReduceScatter: kAvg is the caller's (sum, then divide)");
    return Enqueue(
        [=](Communicator& c) { return c.ReduceScatter(send, recv, recvcount, type, op); });
  }
  absl::StatusOr<Ticket> AllGather(const void* send, void* recv, size_t count,
                                   DataType type) override {
    return Enqueue([=](Communicator& c) { return c.AllGather(send, recv, count, type); });
  }
  absl::StatusOr<Ticket> Broadcast(void* buf, size_t count, DataType type, int root) override {
    if (root < 0 || root >= size()) return Bad(absl::StrCat("Broadcast: root ", root, BadPeer()));
    return Enqueue([=](Communicator& c) { return c.Broadcast(buf, buf, count, type, root); });
  }
  absl::StatusOr<Ticket> Reduce(const void* send, void* recv, size_t count, DataType type, RedOp op,
                                int root) override {
    if (op == RedOp::kAvg) return Bad("Reduce: kAvg is the caller's (sum, then divide)");
    if (root < 0 || root >= size()) return Bad(absl::StrCat("Reduce: root ", root, BadPeer()));
    return Enqueue([=](Communicator& c) { return c.Reduce(send, recv, count, type, op, root); });
  }
  absl::StatusOr<Ticket> AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                                   absl::Span<const size_t> send_displs, void* recv,
                                   absl::Span<const size_t> recv_counts,
                                   absl::Span<const size_t> recv_displs) override {
    const size_t n = static_cast<size_t>(size());
    if (send_counts.size() != n || send_displs.size() != n || recv_counts.size() != n ||
        recv_displs.size() != n) {
      return Bad(absl::StrCat("AllToAllV: count and displacement spans must have ", n,
                              " entries (got ", send_counts.size(), ", ", send_displs.size(), ", ",
                              recv_counts.size(), ", ", recv_displs.size(), ")"));
    }
    // The spans are the caller's only until this returns.
    std::vector<size_t> sc(send_counts.begin(), send_counts.end()),
        sd(send_displs.begin(), send_displs.end()), rc(recv_counts.begin(), recv_counts.end()),
        rd(recv_displs.begin(), recv_displs.end());
    return Enqueue([=, sc = std::move(sc), sd = std::move(sd), rc = std::move(rc),
                    rd = std::move(rd)](Communicator& c) {
      return c.AllToAllV(send, sc, sd, recv, rc, rd, collectives::DataType::kUint8);
    });
  }
  absl::StatusOr<Ticket> Barrier() override {
    return Enqueue([](Communicator& c) { return c.Barrier(); });
  }
  absl::StatusOr<Ticket> Send(const void* buf, size_t bytes, int peer, int tag) override {
    if (peer < 0 || peer >= size() || peer == rank()) {
      return Bad(absl::StrCat("Send: peer ", peer, BadPeer(), " other than ", rank()));
    }
    if (tag < 0) return Bad(absl::StrCat("Send: tag ", tag, " is negative"));
    return Enqueue([=](Communicator& c) -> absl::Status {
      const MessageHeader h{tag, bytes};
      CXLRT_RETURN_IF_ERROR(c.Send(&h, sizeof h, collectives::DataType::kUint8, peer));
      if (bytes == 0) return absl::OkStatus();
      return c.Send(buf, bytes, collectives::DataType::kUint8, peer);
    });
  }
  absl::StatusOr<Ticket> Recv(void* buf, size_t bytes, int peer, int tag) override {
    if (peer < 0 || peer >= size() || peer == rank()) {
      return Bad(absl::StrCat("Recv: peer ", peer, BadPeer(), " other than ", rank()));
    }
    if (tag < 0) return Bad(absl::StrCat("Recv: tag ", tag, " is negative"));
    return Enqueue([=, this](Communicator& c) -> absl::Status {
      MessageHeader h;
      CXLRT_RETURN_IF_ERROR(c.Recv(&h, sizeof h, collectives::DataType::kUint8, peer));
      if (h.tag != tag || h.bytes != bytes) {
        const absl::Status s = absl::InvalidArgumentError(absl::StrCat(
            "pool engine ", name_, ": rank ", c.rank(), " called Recv(", bytes, " bytes, tag ", tag,
            ") from rank ", peer, " but it called Send(", h.bytes, " bytes, tag ", h.tag, ")"));
        c.Abort(s.message());
        return s;
      }
      if (bytes == 0) return absl::OkStatus();
      return c.Recv(buf, bytes, collectives::DataType::kUint8, peer);
    });
  }

  absl::Status Wait(Ticket ticket, absl::Time deadline) override {
    std::unique_lock<std::mutex> l(mu_);
    const auto until = absl::ToChronoTime(deadline);
    cv_.wait_until(l, until, [&] { return finished_ >= ticket || aborted_ || !error_.ok(); });
    if (aborted_) return absl::AbortedError(why_);
    if (!error_.ok()) return error_;
    if (finished_ >= ticket) return absl::OkStatus();
    why_ = absl::StrCat("pool engine ", name_, " rank ", comm_->rank(), ": operation ", ticket,
                        " of ", enqueued_, " not done by its deadline");
    aborted_ = true;  // unusable now; the worker tells the members
    cv_.notify_all();
    return absl::DeadlineExceededError(why_);
  }

  void Abort(absl::string_view why) override {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (aborted_) return;
      aborted_ = true;
      why_ = absl::StrCat("pool engine ", name_, " aborted: ", why);
    }
    cv_.notify_all();
  }

 private:
  using Op = std::function<absl::Status(Communicator&)>;

  static std::string BadPeer() { return " is out of range"; }

  absl::Status Bad(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("pool engine ", name_, ": ", what));
  }

  // Marks the engine failed by `s` (a call on this thread failed).
  absl::Status Failed(absl::Status s) {
    std::lock_guard<std::mutex> l(mu_);
    if (error_.ok()) error_ = s;
    return s;
  }

  absl::StatusOr<Ticket> Enqueue(Op op) {
    std::lock_guard<std::mutex> l(mu_);
    if (aborted_) return absl::AbortedError(why_);
    if (!error_.ok()) return error_;
    queue_.emplace_back(++enqueued_, std::move(op));
    cv_.notify_all();
    return enqueued_;
  }

  void Loop() {
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      cv_.wait(l, [&] { return stop_ || !queue_.empty() || (aborted_ && !comm_aborted_); });
      if (aborted_ && !comm_aborted_) {
        // Tell the members (their waits on this rank end with kAborted).
        comm_aborted_ = true;
        const std::string why = why_;
        l.unlock();
        comm_->Abort(why);
        l.lock();
      }
      if (queue_.empty()) {
        if (stop_) return;
        continue;
      }
      auto [seq, op] = std::move(queue_.front());
      queue_.pop_front();
      const bool skip = aborted_ || !error_.ok();
      l.unlock();
      const absl::Status s = skip ? absl::OkStatus() : op(*comm_);
      l.lock();
      if (!s.ok() && error_.ok()) error_ = s;
      finished_ = seq;
      cv_.notify_all();
    }
  }

  allocator::Allocator& alloc_;
  const std::string name_;
  CommOptions options_;
  std::unique_ptr<Communicator> comm_;
  int splits_ = 0;  // Split calls so far (names the children)

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<Ticket, Op>> queue_;  // guarded by mu_
  Ticket enqueued_ = 0, finished_ = 0;       // guarded by mu_
  absl::Status error_;                       // guarded by mu_: the first failure
  bool aborted_ = false;                     // guarded by mu_
  bool comm_aborted_ = false;                // guarded by mu_
  std::string why_;                          // guarded by mu_
  bool stop_ = false;                        // guarded by mu_
  std::thread worker_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<InterPodEngine>> MakePoolEngine(allocator::Allocator& alloc,
                                                               absl::string_view name, int nranks,
                                                               int rank,
                                                               const CommOptions& options) {
  CommOptions o = options;
  o.asynchronous = false;
  auto comm = Communicator::Create(alloc, name, nranks, rank, o);
  if (!comm.ok()) {
    return absl::Status(comm.status().code(),
                        absl::StrCat("pool engine ", name, ": ", comm.status().message()));
  }
  return std::unique_ptr<InterPodEngine>(
      new PoolEngine(alloc, std::string(name), o, *std::move(comm)));
}

}  // namespace cxlrt::pods
