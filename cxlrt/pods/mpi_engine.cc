#include "cxlrt/pods/mpi_engine.h"

#include <sched.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::pods {
namespace {

using Ticket = InterPodEngine::Ticket;

// Process-wide MPI state. g_broken: an engine of this process gave up on an
// operation (its peers may be dead), so the exit handler must not call
// MPI_Finalize, which waits for every process of the job.
std::atomic<bool> g_we_initialised{false};
std::atomic<bool> g_broken{false};

// fp16 and bf16: a derived type each (so that the handle names the format)
// and one commutative MPI_Op per (format, op) calling collectives::Reduce.
std::once_flag g_types_once;
MPI_Datatype g_half_type = MPI_DATATYPE_NULL, g_bf16_type = MPI_DATATYPE_NULL;
MPI_Op g_half_ops[4], g_bf16_ops[4];
int g_types_rc = MPI_SUCCESS;

template <DataType T, RedOp O>
void UserReduce(void* in, void* inout, int* len, MPI_Datatype*) {
  const void* srcs[2] = {inout, in};
  collectives::Reduce(T, O, inout, srcs, 2, static_cast<size_t>(*len), 1);
}

template <DataType T>
int MakeOps(MPI_Op* ops) {
  MPI_User_function* fns[4] = {UserReduce<T, RedOp::kSum>, UserReduce<T, RedOp::kProd>,
                               UserReduce<T, RedOp::kMin>, UserReduce<T, RedOp::kMax>};
  for (int i = 0; i < 4; ++i) {
    if (int rc = MPI_Op_create(fns[i], /*commute=*/1, &ops[i]); rc != MPI_SUCCESS) return rc;
  }
  return MPI_SUCCESS;
}

void MakeTypes() {
  int rc = MPI_Type_contiguous(1, MPI_UINT16_T, &g_half_type);
  if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&g_half_type);
  if (rc == MPI_SUCCESS) rc = MPI_Type_contiguous(1, MPI_UINT16_T, &g_bf16_type);
  if (rc == MPI_SUCCESS) rc = MPI_Type_commit(&g_bf16_type);
  if (rc == MPI_SUCCESS) rc = MakeOps<DataType::kFloat16>(g_half_ops);
  if (rc == MPI_SUCCESS) rc = MakeOps<DataType::kBfloat16>(g_bf16_ops);
  g_types_rc = rc;
}

void FinalizeAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || g_broken.load()) return;
  MPI_Finalize();
}

std::string MpiErrorString(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int n = 0;
  if (MPI_Error_string(rc, text, &n) != MPI_SUCCESS) return absl::StrCat("MPI error ", rc);
  return std::string(text, static_cast<size_t>(n));
}

// An MPI error as a Status naming the call: argument errors are
// kInvalidArgument, the rest (a peer gone, a transport failure) kAborted.
absl::Status MpiStatus(int rc, absl::string_view call, absl::string_view what) {
  if (rc == MPI_SUCCESS) return absl::OkStatus();
  int cls = MPI_ERR_OTHER;
  MPI_Error_class(rc, &cls);
  std::string msg = absl::StrCat("mpi: ", call, " for ", what, " failed: ", MpiErrorString(rc),
                                 " (MPI error class ", cls, ")");
  switch (cls) {
    case MPI_ERR_ARG:
    case MPI_ERR_COUNT:
    case MPI_ERR_TYPE:
    case MPI_ERR_OP:
    case MPI_ERR_RANK:
    case MPI_ERR_ROOT:
    case MPI_ERR_TAG:
    case MPI_ERR_BUFFER:
    case MPI_ERR_TRUNCATE:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::AbortedError(msg);
  }
}

bool Overlap(const void* a, size_t an, const void* b, size_t bn) {
  const auto x = reinterpret_cast<uintptr_t>(a), y = reinterpret_cast<uintptr_t>(b);
  return an > 0 && bn > 0 && x < y + bn && y < x + an;
}

// The MPI type of a cxlrt type.
MPI_Datatype MpiType(DataType t) {
  switch (t) {
    case DataType::kInt8:
      return MPI_INT8_T;
    case DataType::kUint8:
      return MPI_UINT8_T;
    case DataType::kInt32:
      return MPI_INT32_T;
    case DataType::kUint32:
      return MPI_UINT32_T;
    case DataType::kInt64:
      return MPI_INT64_T;
    case DataType::kUint64:
      return MPI_UINT64_T;
    case DataType::kFloat16:
      return g_half_type;
    case DataType::kBfloat16:
      return g_bf16_type;
    case DataType::kFloat32:
      return MPI_FLOAT;
    case DataType::kFloat64:
      return MPI_DOUBLE;
  }
  return MPI_DATATYPE_NULL;
}

struct Pending {
  Ticket ticket = 0;
  std::vector<MPI_Request> reqs;
  // What the operation was, for messages: "AllReduce(count=1024, float32, sum)".
  std::string what;
  // Recv: the bytes each request must deliver (a shorter message is an
  // error, never a short buffer with OK), and the peer it waits on.
  std::vector<int> expect_bytes;
  int peer = -1;
  bool is_send = false;
  // AllToAllV's int arrays: MPI reads them until the operation completes.
  std::vector<int> a2a[4];
};

// Abort notices. An engine that aborts tells every member of its world
// (the engine World() made, and every engine split from it) on a
// communicator of their own, and every engine of that world polls for a
// notice while it waits: so a rank that gave up (a dead pod-mate, an
// error) fails the other pods' ranks at once, not at their deadline (MPI
// has no revoke). Shared by a world and its splits; its MPI calls are
// serialised by its mutex.
class NoticeChannel {
 public:
  static constexpr int kBytes = 256;
  static constexpr int kTag = 28;

  // On a duplicate of the world's communicator, with a receive posted.
  static absl::StatusOr<std::shared_ptr<NoticeChannel>> Make(MPI_Comm world) {
    auto c = std::shared_ptr<NoticeChannel>(new NoticeChannel);
    if (int rc = MPI_Comm_dup(world, &c->comm_); rc != MPI_SUCCESS) {
      return absl::UnavailableError(absl::StrCat(
          "mpi: MPI_Comm_dup for the engine's abort notices failed: ", MpiErrorString(rc)));
    }
    MPI_Comm_set_errhandler(c->comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->comm_, &c->rank_);
    MPI_Comm_size(c->comm_, &c->size_);
    if (int rc = MPI_Irecv(c->in_, kBytes, MPI_CHAR, MPI_ANY_SOURCE, kTag, c->comm_, &c->recv_);
        rc != MPI_SUCCESS) {
      return absl::UnavailableError(absl::StrCat(
          "mpi: posting the receive of the engine's abort notices failed: ", MpiErrorString(rc)));
    }
    return c;
  }

  ~NoticeChannel() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    std::lock_guard<std::mutex> l(mu_);
    FlushSends(absl::Milliseconds(200));
    if (!sends_.empty()) {
      // A member that did not take its notice may be dead: its send stays
      // pending, so its buffer outlives this channel (left to the process,
      // which ends in failure), and MPI_Finalize would wait for it.
      for (MPI_Request& r : sends_) MPI_Request_free(&r);
      (void)out_.release();
      g_broken = true;
    }
    if (recv_ != MPI_REQUEST_NULL) {
      MPI_Cancel(&recv_);
      MPI_Wait(&recv_, MPI_STATUS_IGNORE);
    }
    if (!told_ && !heard_) MPI_Comm_free(&comm_);
  }

  // Why a member aborted, once its notice arrived; "" until then.
  std::string Heard() {
    std::lock_guard<std::mutex> l(mu_);
    if (!heard_ && recv_ != MPI_REQUEST_NULL) {
      int flag = 0;
      MPI_Status st;
      if (MPI_Test(&recv_, &flag, &st) == MPI_SUCCESS && flag) {
        int n = 0;
        MPI_Get_count(&st, MPI_CHAR, &n);
        heard_ = true;
        why_ = absl::StrCat("world member ", st.MPI_SOURCE, " aborted: ",
                            absl::string_view(in_, static_cast<size_t>(std::clamp(n, 0, kBytes))));
        // The teller may have given up on a dead member, whom
        // MPI_Finalize would wait for.
        g_broken = true;
      }
    }
    FlushSends(absl::ZeroDuration());
    return heard_ ? why_ : std::string();
  }

  // Sends `why` to every other member, once (the first abort's reason).
  // Never waits for a receiver: sends to a live member complete in the
  // next calls here (or the destructor's bounded flush).
  void Tell(absl::string_view why) {
    std::lock_guard<std::mutex> l(mu_);
    if (told_ || heard_) return;  // a member that heard one tells no one
    told_ = true;
    const int n = static_cast<int>(std::min<size_t>(why.size(), kBytes));
    out_ = std::make_unique<char[]>(kBytes);
    std::memcpy(out_.get(), why.data(), static_cast<size_t>(n));
    for (int m = 0; m < size_; ++m) {
      if (m == rank_) continue;
      MPI_Request r;
      if (MPI_Isend(out_.get(), n, MPI_CHAR, m, kTag, comm_, &r) == MPI_SUCCESS) {
        sends_.push_back(r);
      }
    }
    FlushSends(absl::ZeroDuration());
  }

 private:
  NoticeChannel() = default;

  // Completes the sends that can be, for at most `budget`.
  void FlushSends(absl::Duration budget) {
    const absl::Time end = absl::Now() + budget;
    do {
      for (size_t i = 0; i < sends_.size();) {
        int flag = 0;
        if (MPI_Test(&sends_[i], &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag) {
          ++i;
          continue;
        }
        sends_.erase(sends_.begin() + static_cast<ptrdiff_t>(i));
      }
    } while (!sends_.empty() && absl::Now() < end && (sched_yield(), true));
  }

  std::mutex mu_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  MPI_Request recv_ = MPI_REQUEST_NULL;
  char in_[kBytes] = {};
  bool heard_ = false, told_ = false;
  std::string why_;
  std::unique_ptr<char[]> out_;  // the notice this member sent
  std::vector<MPI_Request> sends_;
};

class MpiEngineImpl final : public InterPodEngine {
 public:
  MpiEngineImpl(MPI_Comm comm, const MpiEngineOptions& options, bool progress_thread,
                std::shared_ptr<NoticeChannel> notices)
      : comm_(comm), options_(options), notices_(std::move(notices)) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    max_count_ = options_.max_count_per_call == 0
                     ? static_cast<size_t>(INT_MAX)
                     : std::min<size_t>(options_.max_count_per_call, INT_MAX);
    int* tag_ub = nullptr;
    int flag = 0;
    MPI_Comm_get_attr(comm_, MPI_TAG_UB, &tag_ub, &flag);
    tag_ub_ = flag && tag_ub ? *tag_ub : 32767;
    if (progress_thread) progress_ = std::thread([this] { ProgressLoop(); });
  }

  ~MpiEngineImpl() override {
    TellIfAborted();
    if (progress_.joinable()) {
      {
        std::lock_guard<std::mutex> l(mu_);
        stop_ = true;
      }
      cv_.notify_all();
      progress_.join();
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    // Operations never waited for: one last look; MPI forbids freeing a
    // communicator under a pending collective, so a broken or busy engine
    // leaves its communicators to the end of the process.
    while (broken_.ok() && !aborted_.load() && !pending_.empty()) {
      absl::StatusOr<bool> done = TestFront();
      if (!done.ok() || !*done) break;
    }
    if (!pending_.empty() || !broken_.ok() || aborted_.load()) return;
    MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "mpi"; }

  absl::StatusOr<std::unique_ptr<InterPodEngine>> Split(int color, int key,
                                                        absl::Time deadline) override;

  absl::StatusOr<Ticket> AllReduce(const void* send, void* recv, size_t count, DataType type,
                                   RedOp op) override {
    const std::string what =
        absl::StrCat("AllReduce(count=", count, ", ", collectives::DataTypeName(type), ", ",
                     collectives::RedOpName(op), ")");
    CXLRT_RETURN_IF_ERROR(Usable());
    MPI_Op mop;
    CXLRT_ASSIGN_OR_RETURN(mop, OpFor(type, op, what));
    const size_t esz = collectives::SizeOf(type);
    const bool in_place = send == recv;
    if (!in_place && Overlap(send, count * esz, recv, count * esz)) {
      return absl::InvalidArgumentError(
          absl::StrCat("mpi: ", what, ": send and recv overlap without being the same buffer"));
    }
    Pending p;
    p.what = what;
    for (size_t off = 0; off == 0 || off < count; off += max_count_) {
      const int n = static_cast<int>(std::min(max_count_, count - off));
      MPI_Request req;
      const void* s = in_place ? MPI_IN_PLACE : static_cast<const char*>(send) + off * esz;
      int rc = MPI_Iallreduce(s, static_cast<char*>(recv) + off * esz, n, MpiType(type), mop, comm_,
                              &req);
      if (rc != MPI_SUCCESS) return Break(MpiStatus(rc, "MPI_Iallreduce", what));
      p.reqs.push_back(req);
      if (count == 0) break;
    }
    return Start(std::move(p));
  }

  absl::StatusOr<Ticket> ReduceScatter(const void* send, void* recv, size_t recvcount,
                                       DataType type, RedOp op) override {
    const std::string what =
        absl::StrCat("ReduceScatter(recvcount=", recvcount, ", ", collectives::DataTypeName(type),
                     ", ", collectives::RedOpName(op), ")");
    CXLRT_RETURN_IF_ERROR(Usable());
    MPI_Op mop;
    CXLRT_ASSIGN_OR_RETURN(mop, OpFor(type, op, what));
    CXLRT_RETURN_IF_ERROR(CountFits(recvcount, what));
    const size_t esz = collectives::SizeOf(type);
    const bool in_place = send == recv;
    if (!in_place && Overlap(send, recvcount * size_ * esz, recv, recvcount * esz)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mpi: ", what, ": send and recv overlap without being the same buffer (in place)"));
    }
    Pending p;
    p.what = what;
    MPI_Request req;
    int rc =
        MPI_Ireduce_scatter_block(in_place ? MPI_IN_PLACE : send, recv, static_cast<int>(recvcount),
                                  MpiType(type), mop, comm_, &req);
    if (rc != MPI_SUCCESS) return Break(MpiStatus(rc, "MPI_Ireduce_scatter_block", what));
    p.reqs.push_back(req);
    return Start(std::move(p));
  }

  absl::StatusOr<Ticket> AllGather(const void* send, void* recv, size_t count,
                                   DataType type) override {
    const std::string what =
        absl::StrCat("AllGather(count=", count, ", ", collectives::DataTypeName(type), ")");
    CXLRT_RETURN_IF_ERROR(Usable());
    CXLRT_RETURN_IF_ERROR(TypeKnown(type, what));
    CXLRT_RETURN_IF_ERROR(CountFits(count, what));
    const size_t esz = collectives::SizeOf(type);
    const bool in_place = send == static_cast<const char*>(recv) + size_t(rank_) * count * esz;
    if (!in_place && Overlap(send, count * esz, recv, count * size_ * esz)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mpi: ", what, ": send overlaps recv without being recv + rank * count (in place)"));
    }
    Pending p;
    p.what = what;
    MPI_Request req;
    int rc = MPI_Iallgather(in_place ? MPI_IN_PLACE : send, static_cast<int>(count), MpiType(type),
                            recv, static_cast<int>(count), MpiType(type), comm_, &req);
    if (rc != MPI_SUCCESS) return Break(MpiStatus(rc, "MPI_Iallgather", what));
    p.reqs.push_back(req);
    return Start(std::move(p));
  }

  absl::StatusOr<Ticket> Broadcast(void* buf, size_t count, DataType type, int root) override {
    const std::string what = absl::StrCat("Broadcast(count=", count, ", ",
                                          collectives::DataTypeName(type), ", root=", root, ")");
    CXLRT_RETURN_IF_ERROR(Usable());
    CXLRT_RETURN_IF_ERROR(TypeKnown(type, what));
    CXLRT_RETURN_IF_ERROR(MemberOk(root, "root", what));
    const size_t esz = collectives::SizeOf(type);
    Pending p;
    p.what = what;
    for (size_t off = 0; off == 0 || off < count; off += max_count_) {
      const int n = static_cast<int>(std::min(max_count_, count - off));
      MPI_Request req;
      int rc = MPI_Ibcast(static_cast<char*>(buf) + off * esz, n, MpiType(type), root, comm_, &req);
      if (rc != MPI_SUCCESS) return Break(MpiStatus(rc, "MPI_Ibcast", what));
      p.reqs.push_back(req);
      if (count == 0) break;
    }
    return Start(std::move(p));
  }

  absl::StatusOr<Ticket> Reduce(const void* send, void* recv, size_t count, DataType type, RedOp op,
                                int root) override {
    const std::string what =
        absl::StrCat("Reduce(count=", count, ", ", collectives::DataTypeName(type), ", ",
                     collectives::RedOpName(op), ", root=", root, ")");
    CXLRT_RETURN_IF_ERROR(Usable());
    MPI_Op mop;
    CXLRT_ASSIGN_OR_RETURN(mop, OpFor(type, op, what));
    CXLRT_RETURN_IF_ERROR(MemberOk(root, "root", what));
    const size_t esz = collectives::SizeOf(type);
    const bool in_place = send == recv && rank_ == root;
    if (rank_ == root && !in_place && Overlap(send, count * esz, recv, count * esz)) {
      return absl::InvalidArgumentError(
          absl::StrCat("mpi: ", what, ": send and recv overlap without being the same buffer"));
    }
    Pending p;
    p.what = what;
    for (size_t off = 0; off == 0 || off < count; off += max_count_) {
      const int n = static_cast<int>(std::min(max_count_, count - off));
      MPI_Request req;
      const void* s = in_place ? MPI_IN_PLACE : static_cast<const char*>(send) + off * esz;
      void* r = rank_ == root ? static_cast<char*>(recv) + off * esz : nullptr;
      int rc = MPI_Ireduce(s, r, n, MpiType(type), mop, root, comm_, &req);
      if (rc != MPI_SUCCESS) return Break(MpiStatus(rc, "MPI_Ireduce", what));
      p.reqs.push_back(req);
      if (count == 0) break;
    }
    return Start(std::move(p));
  }

  absl::StatusOr<Ticket> AllToAllV(const void* send, absl::Span<const size_t> send_counts,
                                   absl::Span<const size_t> send_displs, void* recv,
                                   absl::Span<const size_t> recv_counts,
                                   absl::Span<const size_t> recv_displs) override {
    const std::string what = "AllToAllV";
    CXLRT_RETURN_IF_ERROR(Usable());
    const absl::Span<const size_t> arrays[4] = {send_counts, send_displs, recv_counts, recv_displs};
    const char* names[4] = {"send_counts", "send_displs", "recv_counts", "recv_displs"};
    Pending p;
    p.what = what;
    size_t send_end = 0, recv_end = 0;
    for (int a = 0; a < 4; ++a) {
      if (arrays[a].size() != static_cast<size_t>(size_)) {
        return absl::InvalidArgumentError(absl::StrCat("mpi: AllToAllV: ", names[a], " has ",
                                                       arrays[a].size(), " entries, expected ",
                                                       size_, " (one per member)"));
      }
      for (int j = 0; j < size_; ++j) {
        if (arrays[a][j] > static_cast<size_t>(INT_MAX)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "mpi: AllToAllV: ", names[a], "[", j, "] = ", arrays[a][j],
              " bytes is above INT_MAX, the most one MPI_Ialltoallv takes: split the exchange"));
        }
        p.a2a[a].push_back(static_cast<int>(arrays[a][j]));
      }
    }
    for (int j = 0; j < size_; ++j) {
      if (send_counts[j]) send_end = std::max(send_end, send_displs[j] + send_counts[j]);
      if (recv_counts[j]) recv_end = std::max(recv_end, recv_displs[j] + recv_counts[j]);
    }
    if (Overlap(send, send_end, recv, recv_end)) {
      return absl::InvalidArgumentError(
          "mpi: AllToAllV: send and recv overlap (MPI needs them apart)");
    }
    MPI_Request req;
    int rc = MPI_Ialltoallv(send, p.a2a[0].data(), p.a2a[1].data(), MPI_BYTE, recv, p.a2a[2].data(),
                            p.a2a[3].data(), MPI_BYTE, comm_, &req);
    if (rc != MPI_SUCCESS) return Break(MpiStatus(rc, "MPI_Ialltoallv", what));
    p.reqs.push_back(req);
    return Start(std::move(p));
  }

  absl::StatusOr<Ticket> Barrier() override {
    CXLRT_RETURN_IF_ERROR(Usable());
    Pending p;
    p.what = "Barrier";
    MPI_Request req;
    int rc = MPI_Ibarrier(comm_, &req);
    if (rc != MPI_SUCCESS) return Break(MpiStatus(rc, "MPI_Ibarrier", "Barrier"));
    p.reqs.push_back(req);
    return Start(std::move(p));
  }

  absl::StatusOr<Ticket> Send(const void* buf, size_t bytes, int peer, int tag) override {
    return PointToPoint(const_cast<void*>(buf), bytes, peer, tag, /*send=*/true);
  }
  absl::StatusOr<Ticket> Recv(void* buf, size_t bytes, int peer, int tag) override {
    return PointToPoint(buf, bytes, peer, tag, /*send=*/false);
  }

  absl::Status Wait(Ticket ticket, absl::Time deadline) override {
    CXLRT_RETURN_IF_ERROR(Usable());
    if (ticket == 0 || ticket >= next_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mpi: Wait(ticket ", ticket, "): no such ticket (the last started is ", next_ - 1, ")"));
    }
    absl::Duration nap = absl::Microseconds(2);
    for (int round = 0;; ++round) {
      while (!pending_.empty() && pending_.front().ticket <= ticket) {
        absl::StatusOr<bool> done = TestFront();
        if (!done.ok()) return Break(done.status());
        if (!*done) break;
      }
      if (pending_.empty() || pending_.front().ticket > ticket) return absl::OkStatus();
      if (aborted_.load()) return Usable();
      const bool late = absl::Now() >= deadline;
      if (round % 64 == 63 || late) {
        if (std::string why = notices_->Heard(); !why.empty()) {
          return Break(absl::AbortedError(absl::StrCat("mpi: ", pending_.front().what, " (member ",
                                                       rank_, " of ", size_, "): ", why)));
        }
      }
      if (late) {
        const Pending& p = pending_.front();
        std::string who;
        if (p.peer >= 0) {
          who = p.is_send ? absl::StrCat("member ", p.peer, " has not received it")
                          : absl::StrCat("member ", p.peer, " has not sent it");
        } else {
          who = absl::StrCat("one or more of the ", size_,
                             " members have not joined it (MPI does not say which)");
        }
        return Break(absl::DeadlineExceededError(absl::StrCat(
            "mpi: Wait(ticket ", ticket, ") passed its deadline: ", p.what, " (ticket ", p.ticket,
            ", member ", rank_, " of ", size_, ") is not complete: ", who)));
      }
      // Spin a little, then yield. Without a progress thread MPI moves the
      // bytes only inside MPI_Test, so Wait keeps calling it (as MPI_Wait
      // busy-polls); with one, Wait sleeps with backoff (at most 100 us past
      // the moment the operation completes).
      if (round < 64) continue;
      if (round < 256 || !progress_.joinable()) {
        sched_yield();
        continue;
      }
      absl::SleepFor(std::min(nap, std::max(absl::ZeroDuration(), deadline - absl::Now())));
      nap = std::min(nap * 2, absl::Microseconds(100));
    }
  }

  void Abort(absl::string_view why) override {
    {
      absl::MutexLock l(&abort_mu_);
      if (aborted_.load()) return;
      abort_why_ = std::string(why);
    }
    aborted_ = true;
    cv_.notify_all();
    // MPI from this thread only where MPI allows any thread; otherwise
    // the engine's own thread tells at its next call or destruction.
    if (MpiEngine::ThreadMultiple()) TellIfAborted();
  }

 private:
  // Tells the world (once) that this engine aborted, unless the abort
  // came from a notice heard.
  void TellIfAborted() {
    if (!aborted_.load() || told_.exchange(true)) return;
    std::string why;
    {
      absl::MutexLock l(&abort_mu_);
      why = abort_why_;
    }
    notices_->Tell(why);
  }

  absl::Status Usable() {
    if (aborted_.load()) {
      TellIfAborted();
      absl::MutexLock l(&abort_mu_);
      return absl::AbortedError(absl::StrCat("mpi: the engine was aborted: ", abort_why_));
    }
    if (!broken_.ok()) {
      return absl::Status(broken_.code(), absl::StrCat("mpi: the engine is unusable after an "
                                                       "earlier error: ",
                                                       broken_.message()));
    }
    return absl::OkStatus();
  }

  // Records the first error; the engine is unusable from here on.
  absl::Status Break(absl::Status s) {
    if (broken_.ok()) broken_ = s;
    // A deadline or a transport error: a member may be dead, and
    // MPI_Finalize would wait for it.
    if (s.code() == absl::StatusCode::kDeadlineExceeded || s.code() == absl::StatusCode::kAborted) {
      g_broken = true;
    }
    inflight_.store(0);
    return s;
  }

  absl::Status TypeKnown(DataType type, absl::string_view what) {
    if (static_cast<int>(type) >= collectives::kNumDataTypes) {
      return absl::InvalidArgumentError(
          absl::StrCat("mpi: ", what, ": data type ", static_cast<int>(type), " is unknown"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<MPI_Op> OpFor(DataType type, RedOp op, absl::string_view what) {
    CXLRT_RETURN_IF_ERROR(TypeKnown(type, what));
    const int i = static_cast<int>(op);
    if (op == RedOp::kAvg || i >= collectives::kNumRedOps) {
      return absl::InvalidArgumentError(
          absl::StrCat("mpi: ", what, ": the engine reduces with sum, prod, min or max only",
                       op == RedOp::kAvg ? " (for avg the caller sums and divides once)" : ""));
    }
    if (type == DataType::kFloat16) return g_half_ops[i];
    if (type == DataType::kBfloat16) return g_bf16_ops[i];
    const MPI_Op ops[4] = {MPI_SUM, MPI_PROD, MPI_MIN, MPI_MAX};
    return ops[i];
  }

  absl::Status CountFits(size_t count, absl::string_view what) {
    if (count > max_count_) {
      return absl::InvalidArgumentError(
          absl::StrCat("mpi: ", what, ": count ", count, " is above ", max_count_,
                       " elements, the most one MPI call of this engine takes: split the call"));
    }
    return absl::OkStatus();
  }

  absl::Status MemberOk(int m, absl::string_view role, absl::string_view what) {
    if (m < 0 || m >= size_) {
      return absl::InvalidArgumentError(
          absl::StrCat("mpi: ", what, ": ", role, " ", m, " is not a member (size ", size_, ")"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Ticket> PointToPoint(void* buf, size_t bytes, int peer, int tag, bool send) {
    const std::string what =
        absl::StrCat(send ? "Send" : "Recv", "(", bytes, " bytes, ", send ? "to" : "from",
                     " member ", peer, ", tag ", tag, ")");
    CXLRT_RETURN_IF_ERROR(Usable());
    CXLRT_RETURN_IF_ERROR(MemberOk(peer, "peer", what));
    if (tag < 0 || tag > tag_ub_) {
      return absl::InvalidArgumentError(
          absl::StrCat("mpi: ", what, ": tag ", tag, " is not in [0, ", tag_ub_, "]"));
    }
    Pending p;
    p.what = what;
    p.peer = peer;
    p.is_send = send;
    for (size_t off = 0; off == 0 || off < bytes; off += max_count_) {
      const int n = static_cast<int>(std::min(max_count_, bytes - off));
      MPI_Request req;
      char* b = static_cast<char*>(buf) + off;
      int rc = send ? MPI_Isend(b, n, MPI_BYTE, peer, tag, comm_, &req)
                    : MPI_Irecv(b, n, MPI_BYTE, peer, tag, comm_, &req);
      if (rc != MPI_SUCCESS) return Break(MpiStatus(rc, send ? "MPI_Isend" : "MPI_Irecv", what));
      p.reqs.push_back(req);
      p.expect_bytes.push_back(n);
      if (bytes == 0) break;
    }
    return Start(std::move(p));
  }

  Ticket Start(Pending p) {
    p.ticket = next_++;
    pending_.push_back(std::move(p));
    if (progress_.joinable() && inflight_.fetch_add(1) == 0) {
      std::lock_guard<std::mutex> l(mu_);
      cv_.notify_one();
    }
    return pending_.back().ticket;
  }

  // Tests the oldest pending operation; true (and retires it) when it is
  // complete.
  absl::StatusOr<bool> TestFront() {
    Pending& p = pending_.front();
    for (size_t i = 0; i < p.reqs.size(); ++i) {
      if (p.reqs[i] == MPI_REQUEST_NULL) continue;
      int flag = 0;
      MPI_Status st;
      const int rc = MPI_Test(&p.reqs[i], &flag, &st);
      if (rc != MPI_SUCCESS) return MpiStatus(rc, "MPI_Test", p.what);
      if (!flag) return false;
      if (!p.is_send && p.peer >= 0) {
        int got = 0;
        MPI_Get_count(&st, MPI_BYTE, &got);
        if (got != p.expect_bytes[i]) {
          return absl::InvalidArgumentError(
              absl::StrCat("mpi: ", p.what, ": member ", p.peer, " sent ", got,
                           " bytes where this Recv expected ", p.expect_bytes[i],
                           " (sizes of a Send and its Recv must be equal)"));
        }
      }
    }
    pending_.pop_front();
    if (progress_.joinable()) inflight_.fetch_sub(1);
    return true;
  }

  // The progress thread: while operations are in flight, enters MPI, which
  // progresses every request of the process, without touching them (MPI
  // forbids two threads to complete one request): an MPI_Iprobe on
  // MPI_COMM_SELF, where nothing is ever sent, so it matches nothing and
  // needs no collective to set up.
  void ProgressLoop() {
    while (true) {
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stop_ || (inflight_.load() > 0 && !aborted_.load()); });
        if (stop_) return;
      }
      int flag = 0;
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_SELF, &flag, MPI_STATUS_IGNORE);
      sched_yield();
    }
  }

  MPI_Comm comm_;
  MpiEngineOptions options_;
  int rank_ = 0, size_ = 1, tag_ub_ = 32767;
  size_t max_count_ = INT_MAX;
  Ticket next_ = 1;
  std::deque<Pending> pending_;
  absl::Status broken_;

  absl::Mutex abort_mu_;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> told_{false};
  std::string abort_why_;
  std::shared_ptr<NoticeChannel> notices_;  // the world's

  std::thread progress_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<int> inflight_{0};
};

// MPI_Comm_split on a thread of its own, so that the caller can give up at
// its deadline: MPI has no nonblocking split. Shared with the thread, which
// a caller that gave up leaves behind (detached).
struct SplitCall {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  int rc = MPI_SUCCESS;
  MPI_Comm result = MPI_COMM_NULL;
};

absl::StatusOr<std::unique_ptr<InterPodEngine>> MpiEngineImpl::Split(int color, int key,
                                                                     absl::Time deadline) {
  const std::string what = absl::StrCat("Split(color=", color, ", key=", key, ")");
  CXLRT_RETURN_IF_ERROR(Usable());
  if (color < 0) {
    return absl::InvalidArgumentError(absl::StrCat("mpi: ", what, ": color must be >= 0"));
  }
  // First every member's (color, key), with the deadline: once it is
  // complete, every member has called Split, and MPI_Comm_split (below)
  // waits on no straggler.
  int mine[2] = {color, key};
  std::vector<int> all(2 * size_);
  {
    Pending p;
    p.what = what;
    MPI_Request req;
    int rc = MPI_Iallgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, comm_, &req);
    if (rc != MPI_SUCCESS) return Break(MpiStatus(rc, "MPI_Iallgather", what));
    p.reqs.push_back(req);
    const Ticket t = Start(std::move(p));
    CXLRT_RETURN_IF_ERROR(Wait(t, deadline));
  }
  // MPI_Comm_split itself blocks: with MPI_THREAD_MULTIPLE it runs on a
  // helper thread and the caller still gives up at the deadline (a member
  // that died since the exchange above); otherwise it runs here.
  MPI_Comm out = MPI_COMM_NULL;
  if (MpiEngine::ThreadMultiple()) {
    auto call = std::make_shared<SplitCall>();
    MPI_Comm comm = comm_;
    std::thread([call, comm, color, key] {
      MPI_Comm r = MPI_COMM_NULL;
      const int rc = MPI_Comm_split(comm, color, key, &r);
      std::lock_guard<std::mutex> l(call->mu);
      call->rc = rc;
      call->result = r;
      call->done = true;
      call->cv.notify_all();
    }).detach();
    std::unique_lock<std::mutex> l(call->mu);
    while (!call->done) {
      if (aborted_.load()) return Usable();
      if (std::string why = notices_->Heard(); !why.empty()) {
        return Break(absl::AbortedError(absl::StrCat("mpi: ", what, ": ", why)));
      }
      const absl::Duration left = std::min(deadline - absl::Now(), absl::Milliseconds(10));
      if (left <= absl::ZeroDuration() && absl::Now() >= deadline) {
        return Break(absl::DeadlineExceededError(
            absl::StrCat("mpi: ", what,
                         ": MPI_Comm_split did not return by the deadline (every "
                         "member had called Split; one may have died since)")));
      }
      call->cv.wait_for(l, absl::ToChronoNanoseconds(std::max(left, absl::Microseconds(100))));
    }
    if (call->rc != MPI_SUCCESS) return Break(MpiStatus(call->rc, "MPI_Comm_split", what));
    out = call->result;
  } else {
    const int rc = MPI_Comm_split(comm_, color, key, &out);
    if (rc != MPI_SUCCESS) return Break(MpiStatus(rc, "MPI_Comm_split", what));
  }
  MPI_Comm_set_errhandler(out, MPI_ERRORS_RETURN);
  return std::unique_ptr<InterPodEngine>(
      new MpiEngineImpl(out, options_, progress_.joinable(), notices_));
}

}  // namespace

bool MpiEngine::ThreadMultiple() {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (!inited || finalized) return false;
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  return provided == MPI_THREAD_MULTIPLE;
}

namespace {
// Open MPI's TCP transport writes to a dead peer's socket without
// MSG_NOSIGNAL: the SIGPIPE would kill this rank (found under `cxlrt run
// --pods` with a rank of the other pod killed) before its Wait could
// report the error. With SIGPIPE ignored the write fails with EPIPE and
// MPI reports it. A handler the program installed is left alone.
void IgnoreSigpipe() {
  struct sigaction old = {};
  if (sigaction(SIGPIPE, nullptr, &old) == 0 && old.sa_handler == SIG_DFL &&
      !(old.sa_flags & SA_SIGINFO)) {
    signal(SIGPIPE, SIG_IGN);
  }
}
}  // namespace

absl::StatusOr<std::unique_ptr<InterPodEngine>> MpiEngine::World(MPI_Comm comm,
                                                                 const MpiEngineOptions& options) {
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (finalized) {
    return absl::UnavailableError("mpi: MPI was already finalised in this process");
  }
  if (!inited) {
    int provided = MPI_THREAD_SINGLE;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) {
      return absl::UnavailableError(
          absl::StrCat("mpi: MPI_Init_thread failed: ", MpiErrorString(rc)));
    }
    if (!g_we_initialised.exchange(true)) std::atexit(FinalizeAtExit);
  }
  if (comm == MPI_COMM_NULL) {
    return absl::InvalidArgumentError("mpi: World(MPI_COMM_NULL): no communicator to run on");
  }
  const bool multiple = ThreadMultiple();
  const bool thread = options.progress_thread.value_or(multiple);
  if (thread && !multiple) {
    return absl::FailedPreconditionError(
        "mpi: a progress thread needs MPI_THREAD_MULTIPLE, which this MPI does not provide "
        "(initialise MPI with MPI_Init_thread(MPI_THREAD_MULTIPLE), or leave progress_thread "
        "unset)");
  }
  IgnoreSigpipe();
  std::call_once(g_types_once, MakeTypes);
  if (g_types_rc != MPI_SUCCESS) {
    return MpiStatus(g_types_rc, "MPI_Type_contiguous/MPI_Op_create", "the fp16 and bf16 ops");
  }
  MPI_Comm dup = MPI_COMM_NULL;
  if (int rc = MPI_Comm_dup(comm, &dup); rc != MPI_SUCCESS) {
    return absl::UnavailableError(absl::StrCat(
        "mpi: MPI_Comm_dup of the caller's communicator failed: ", MpiErrorString(rc)));
  }
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  auto notices = NoticeChannel::Make(comm);
  if (!notices.ok()) {
    MPI_Comm_free(&dup);
    return notices.status();
  }
  return std::unique_ptr<InterPodEngine>(new MpiEngineImpl(dup, options, thread, *notices));
}

}  // namespace cxlrt::pods
