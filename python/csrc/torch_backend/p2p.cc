// The torch backend's point to point (backend.h): send, recv and
// recvAnysource, moved by the group's p2p thread.
//
// Point to point: send, recv and recvAnysource queue the call for the
// group's p2p thread and return at once. That thread alone uses the p2p
// communicator and never waits for a peer: it sends a piece only when the
// channel has room for all of it, and receives one only when its first
// chunk is posted (whose sender then completes it without waiting), so any
// number of calls are in flight, in any order of posting on either side,
// and a rank inside a collective still moves its pending sends. A message
// is a header (tag, size, type) and then its bytes in pieces of the channel
// ring; a receive takes the next message from its peer with its tag (per
// (peer, tag) order, as Gloo's), and a message that arrives before its
// receive is posted (another tag's, or any source's) waits in a buffer.
#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "python/csrc/torch_backend/backend.h"

namespace cxlrt::torch_backend {

c10::intrusive_ptr<c10d::Work> CxlrtBackend::send(std::vector<at::Tensor>& tensors, int dst,
                                                  int tag) {
  at::Tensor t = OneOfAnyType(tensors);
  CheckPeer(dst, "send to");
  return PostP2p(c10d::OpType::SEND, t, dst, tag);
}

c10::intrusive_ptr<c10d::Work> CxlrtBackend::recv(std::vector<at::Tensor>& tensors, int src,
                                                  int tag) {
  at::Tensor t = OneOfAnyType(tensors);
  CheckPeer(src, "recv from");
  return PostP2p(c10d::OpType::RECV, t, src, tag);
}

c10::intrusive_ptr<c10d::Work> CxlrtBackend::recvAnysource(std::vector<at::Tensor>& tensors,
                                                           int tag) {
  at::Tensor t = OneOfAnyType(tensors);
  if (size_ < 2) {
    throw std::invalid_argument(
        absl::StrCat("cxlrt: rank ", rank_, ": recv from any source in a group of one rank"));
  }
  return PostP2p(c10d::OpType::RECVANYSOURCE, t, -1, tag);
}

at::Tensor CxlrtBackend::OneOfAnyType(const std::vector<at::Tensor>& tensors) {
  if (tensors.size() != 1) throw std::invalid_argument("cxlrt: one tensor per call");
  CheckTensor(tensors[0]);
  return tensors[0];
}

void CxlrtBackend::CheckPeer(int peer, const char* what) const {
  if (peer < 0 || peer >= size_ || peer == rank_) {
    throw std::invalid_argument(absl::StrCat("cxlrt: rank ", rank_, ": ", what, " rank ", peer,
                                             ": not another rank of this group of ", size_));
  }
}

std::string CxlrtBackend::Describe(const P2pOp& op, bool send) const {
  return absl::StrCat("rank ", rank_, ": ", send ? "send to rank " : "recv from ",
                      send          ? absl::StrCat(op.peer)
                      : op.peer < 0 ? std::string("any source")
                                    : absl::StrCat("rank ", op.peer),
                      " (tag ", op.tag, ", ", op.tensor.defined() ? op.tensor.nbytes() : 0,
                      " bytes)");
}

c10::intrusive_ptr<c10d::Work> CxlrtBackend::PostP2p(c10d::OpType type, const at::Tensor& t,
                                                     int peer, int tag) {
  auto op = std::make_shared<P2pOp>();
  op->work = c10::make_intrusive<CxlrtWork>(rank_, type, std::vector<at::Tensor>{t}, StreamOf({t}));
  op->tensor = t;
  op->peer = peer;
  op->tag = tag;
  op->since = std::chrono::steady_clock::now();
  const bool send = type == c10d::OpType::SEND;
  if (send) {
    op->header = {tag, t.nbytes(), t.numel(), static_cast<int64_t>(t.scalar_type())};
  }
  {
    std::lock_guard<std::mutex> l(p2p_mu_);
    if (p2p_stop_) throw std::runtime_error("cxlrt: the process group is being destroyed");
    inbox_.push_back({send, op});
    if (!p2p_thread_.joinable()) p2p_thread_ = std::thread([this] { P2pRun(); });
  }
  p2p_cv_.notify_one();
  return op->work;
}

void CxlrtBackend::Complete(P2pOp& op, std::exception_ptr error, int source) {
  const std::optional<c10::Stream>& stream = op.work->stream();
  std::optional<c10::StreamGuard> on;
  if (stream) on.emplace(*stream);
  if (source >= 0) op.work->SetSource(source);
  op.work->Finish(error);
}

void CxlrtBackend::Fail(P2pOp& op, bool send, absl::string_view why) {
  Complete(op, std::make_exception_ptr(
                   std::runtime_error(absl::StrCat("cxlrt: ", Describe(op, send), ": ", why))));
}

void CxlrtBackend::P2pRun() {
  using Clock = std::chrono::steady_clock;
  Clock::time_point moved = Clock::now();
  int naps = 0;
  for (;;) {
    std::deque<std::pair<bool, std::shared_ptr<P2pOp>>> posted;
    {
      std::unique_lock<std::mutex> l(p2p_mu_);
      if (!p2p_stop_ && inbox_.empty()) {
        if (!Pending()) {
          p2p_cv_.wait(l, [&] { return p2p_stop_ || !inbox_.empty(); });
        } else if (Clock::now() - moved > std::chrono::milliseconds(1)) {
          const auto nap = std::chrono::microseconds(std::min(200, 10 << std::min(naps++, 5)));
          p2p_cv_.wait_for(l, nap, [&] { return p2p_stop_ || !inbox_.empty(); });
        }
      }
      if (p2p_stop_) break;
      posted.swap(inbox_);
    }
    if (!posted.empty()) moved = Clock::now();
    for (auto& [send, op] : posted) {
      if (!p2p_error_.empty()) {
        Fail(*op, send, p2p_error_);
      } else if (send) {
        sends_[op->peer].push_back(op);
      } else {
        PostRecv(op);
      }
    }
    if (Step()) {
      moved = Clock::now();
      naps = 0;
    } else {
      std::this_thread::yield();
    }
  }
  // Destroyed with calls pending: they fail rather than hang.
  const char* why = "the process group was destroyed with this call pending";
  for (auto& [send, op] : inbox_) Fail(*op, send, why);
  inbox_.clear();
  FailAll(why);
}

bool CxlrtBackend::Pending() const {
  for (const auto& q : sends_) {
    if (!q.empty()) return true;
  }
  for (const auto& m : in_) {
    if (m) return true;
  }
  return !recvs_.empty();
}

void CxlrtBackend::FailAll(absl::string_view why) {
  for (auto& q : sends_) {
    for (auto& op : q) Fail(*op, true, why);
    q.clear();
  }
  for (auto& m : in_) {
    if (m && m->recv) Fail(*m->recv, false, why);
    m.reset();
  }
  for (auto& m : unexpected_) {
    if (m->recv) Fail(*m->recv, false, why);
  }
  unexpected_.clear();
  for (auto& op : recvs_) Fail(*op, false, why);
  recvs_.clear();
}

void CxlrtBackend::Broken(const P2pOp& op, bool send, const absl::Status& s) {
  p2p_error_ =
      absl::StrCat("p2p broken by an earlier failure: ", Describe(op, send), ": ", s.ToString());
  FailAll(p2p_error_);
}

bool CxlrtBackend::Matches(const P2pOp& recv, const P2pMessage& m) {
  return (recv.peer < 0 || recv.peer == m.peer) && recv.tag == m.header.tag;
}

void CxlrtBackend::PostRecv(const std::shared_ptr<P2pOp>& op) {
  for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
    if (!Matches(*op, **it)) continue;
    std::shared_ptr<P2pMessage> m = *it;
    unexpected_.erase(it);
    m->recv = op;
    if (m->complete) Deliver(*m);  // else when its last piece arrives
    return;
  }
  recvs_.push_back(op);
}

void CxlrtBackend::Deliver(P2pMessage& m) {
  P2pOp& op = *m.recv;
  const P2pHeader& h = m.header;
  if (h.bytes != op.tensor.nbytes() || h.type != static_cast<int64_t>(op.tensor.scalar_type())) {
    return Fail(op, false,
                absl::StrCat("rank ", m.peer, " sent ", h.numel, " elements of ",
                             c10::toString(static_cast<c10::ScalarType>(h.type)), " (", h.bytes,
                             " bytes) but this receive is of ", op.tensor.numel(), " ",
                             c10::toString(op.tensor.scalar_type())));
  }
  if (m.buffer.defined() && h.bytes > 0) {
    const std::optional<c10::Stream>& stream = op.work->stream();
    std::optional<c10::StreamGuard> on;
    if (stream) on.emplace(*stream);
    op.tensor.reshape({-1}).view(at::kByte).copy_(m.buffer);
  }
  Complete(op, nullptr, m.peer);
}

uint8_t* CxlrtBackend::Destination(P2pMessage& m) {
  if (m.recv && !m.buffer.defined() && m.header.bytes == m.recv->tensor.nbytes() &&
      m.header.type == static_cast<int64_t>(m.recv->tensor.scalar_type())) {
    return static_cast<uint8_t*>(m.recv->tensor.data_ptr());
  }
  if (!m.buffer.defined()) {
    m.buffer = at::empty({static_cast<int64_t>(m.header.bytes)}, at::kByte);
  }
  return m.buffer.data_ptr<uint8_t>();
}

bool CxlrtBackend::Step() {
  bool moved = false;
  const uint64_t piece = p2p_->p2p_bytes();
  for (int p = 0; p < size_ && p2p_error_.empty(); ++p) {
    if (p == rank_) continue;
    // Sends to p, in posting order: header, then pieces, each only when
    // the channel has room for all of it.
    auto& q = sends_[p];
    while (!q.empty() && p2p_error_.empty()) {
      P2pOp& op = *q.front();
      if (!op.header_sent) {
        if (!p2p_->SendFits(p, sizeof(P2pHeader))) break;
        if (absl::Status s =
                p2p_->Send(&op.header, sizeof(P2pHeader), collectives::DataType::kUint8, p);
            !s.ok()) {
          Broken(op, true, s);
          return true;
        }
        op.header_sent = moved = true;
        sent_at_[p] = std::chrono::steady_clock::now();
      }
      const uint64_t bytes = op.header.bytes;
      bool blocked = false;
      while (op.done < bytes) {
        const uint64_t len = std::min(piece, bytes - op.done);
        if (!p2p_->SendFits(p, len)) {
          blocked = true;
          break;
        }
        const std::optional<c10::Stream>& stream = op.work->stream();
        std::optional<c10::StreamGuard> on;
        if (stream) on.emplace(*stream);
        if (absl::Status s = p2p_->Send(static_cast<const uint8_t*>(op.tensor.data_ptr()) + op.done,
                                        len, collectives::DataType::kUint8, p,
                                        stream ? stream->native_handle() : nullptr);
            !s.ok()) {
          Broken(op, true, s);
          return true;
        }
        op.done += len;
        moved = true;
        sent_at_[p] = std::chrono::steady_clock::now();
      }
      if (blocked) break;
      Complete(op, nullptr);
      q.pop_front();
      sent_at_[p] = std::chrono::steady_clock::now();  // the next one's wait starts now
    }
    if (!p2p_error_.empty()) break;
    // Receives from p: a header only while a posted receive could take
    // a message from p (messages for no receive wait in the channel).
    if (!in_[p] && Wanted(p) && p2p_->RecvReady(p)) {
      auto m = std::make_shared<P2pMessage>();
      m->peer = p;
      if (absl::Status s =
              p2p_->Recv(&m->header, sizeof(P2pHeader), collectives::DataType::kUint8, p);
          !s.ok()) {
        P2pOp none;
        none.peer = p;
        none.tag = -1;
        Broken(none, false, s);
        return true;
      }
      moved = true;
      received_at_[p] = std::chrono::steady_clock::now();
      Arrived(m);
      in_[p] = m;
    }
    while (in_[p] && p2p_error_.empty()) {
      P2pMessage& m = *in_[p];
      if (m.done < m.header.bytes) {
        if (!p2p_->RecvReady(p)) break;
        const uint64_t len = std::min(piece, m.header.bytes - m.done);
        uint8_t* to = Destination(m) + m.done;
        const bool direct = !m.buffer.defined();
        std::optional<c10::Stream> stream;
        if (direct) stream = m.recv->work->stream();
        std::optional<c10::StreamGuard> on;
        if (stream) on.emplace(*stream);
        if (absl::Status s = p2p_->Recv(to, len, collectives::DataType::kUint8, p,
                                        stream ? stream->native_handle() : nullptr);
            !s.ok()) {
          P2pOp none;
          none.peer = p;
          none.tag = static_cast<int>(m.header.tag);
          Broken(m.recv ? *m.recv : none, false, s);
          return true;
        }
        m.done += len;
        moved = true;
        received_at_[p] = std::chrono::steady_clock::now();
        continue;
      }
      m.complete = true;
      if (m.recv) Deliver(m);
      in_[p].reset();
    }
  }
  if (p2p_error_.empty()) Expire();
  return moved;
}

bool CxlrtBackend::Wanted(int p) const {
  for (const auto& op : recvs_) {
    if (op->peer < 0 || op->peer == p) return true;
  }
  return false;
}

void CxlrtBackend::Arrived(const std::shared_ptr<P2pMessage>& m) {
  for (const auto& u : unexpected_) {
    if (u->peer == m->peer && u->header.tag == m->header.tag) {
      unexpected_.push_back(m);
      return;
    }
  }
  for (auto it = recvs_.begin(); it != recvs_.end(); ++it) {
    if (Matches(**it, *m)) {
      m->recv = *it;
      recvs_.erase(it);
      return;
    }
  }
  unexpected_.push_back(m);
}

void CxlrtBackend::Expire() {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point now = Clock::now();
  const std::string why =
      absl::StrCat("Timed out after ", timeout_.count(), " ms: the peer did not take part");
  for (int p = 0; p < size_; ++p) {
    auto& q = sends_[p];
    if (q.empty() || now - std::max(q.front()->since, sent_at_[p]) <= timeout_) continue;
    P2pOp& op = *q.front();
    if (op.header_sent) {
      p2p_->Abort(absl::StrCat(Describe(op, true), ": ", why));
      return Broken(op, true, absl::DeadlineExceededError(why));
    }
    Fail(op, true, why);
    q.pop_front();
  }
  for (int p = 0; p < size_; ++p) {
    if (in_[p] && in_[p]->recv && now - received_at_[p] > timeout_) {
      P2pOp& op = *in_[p]->recv;
      p2p_->Abort(absl::StrCat(Describe(op, false), ": ", why));
      return Broken(op, false, absl::DeadlineExceededError(why));
    }
  }
  for (auto it = recvs_.begin(); it != recvs_.end();) {
    Clock::time_point moved = (*it)->since;
    for (int p = 0; p < size_; ++p) {
      if ((*it)->peer < 0 || (*it)->peer == p) moved = std::max(moved, received_at_[p]);
    }
    if (now - moved > timeout_) {
      Fail(**it, false, why);
      it = recvs_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace cxlrt::torch_backend
