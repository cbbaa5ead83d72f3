// The transport through one pool (pool_transport.h).
#include "cxlrt/collectives/pool_transport.h"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cxlrt/runtime/fault.h"
#include "cxlrt/runtime/log.h"
#include "cxlrt/runtime/membership.h"

namespace cxlrt::collectives {
namespace {

// Spins of a wait before it reads the clock (Await).
constexpr int kQuickSpins = 64;

}  // namespace

PoolTransport::PoolTransport(Setup setup)
    : Transport(setup.nranks, setup.rank, setup.depth, setup.slot_bytes),
      c_(*setup.coherence),
      pool_size_(setup.pool_size),
      name_(std::move(setup.name)),
      block_(setup.block),
      instance_(setup.instance),
      rings_(std::move(setup.rings)),
      watch_(setup.watch),
      membership_(setup.membership),
      spins_(setup.spins),
      drain_(std::move(setup.drain)),
      posts_(size_t(setup.nranks) * setup.depth),
      peer_done_(setup.nranks, 0),
      read_in_place_(setup.nranks, 0) {}

absl::Status PoolTransport::EndCall(bool in_place) {
  CXLRT_RETURN_IF_ERROR(Progress(staged_));
  if (in_place && staged_ >= call_first_) CXLRT_RETURN_IF_ERROR(AwaitPeersDone(staged_));
  return CheckWritersInPlace();
}

absl::Status PoolTransport::CheckWritersInPlace() {
  absl::Status out;
  for (int j = 0; j < nranks_; ++j) {
    if (!read_in_place_[j]) continue;
    read_in_place_[j] = 0;
    if (!out.ok()) continue;
    if (c_.LoadFlag(RankAt(j)) == static_cast<uint64_t>(JoinState::kAborted)) {
      out = Fail(absl::AbortedError(absl::StrCat(
          name_, " rank ", rank_, " in ", Describe(desc_), ": rank ", j,
          " gave up on the call while this rank read its buffer posted in place (its caller may "
          "have written it since): the bytes read from it are not trusted")));
    }
  }
  return out;
}

absl::Status PoolTransport::Fail(absl::Status s) {
  if (failed_.ok()) {
    failed_ = s;
    const absl::Status drained = drain_ ? drain_() : absl::OkStatus();
    if (drained.ok() && membership_->LeaseHeld()) {
      c_.StoreFlag(RankAt(rank_), static_cast<uint64_t>(JoinState::kAborted));
    } else if (drained.ok()) {
      // Fenced (or the lease lapsed): the block may be recovered memory by
      // now; the peers see this host fenced instead.
      CXLRT_LOG(kWarning) << name_ << " rank " << rank_
                          << " does not mark itself aborted: its host holds no lease";
    } else {
      CXLRT_LOG(kWarning) << name_ << " rank " << rank_
                          << " is not marked aborted for its peers (its copies may still write "
                             "the block): "
                          << drained;
    }
  }
  return s;
}

template <typename Ready>
absl::Status PoolTransport::Await(Ready&& ready, const char* what) {
  absl::Status progress;
  auto step = [&] {
    // Our own pending posts may be what the peers wait for.
    if (!pending_.empty()) {
      progress = Progress(0);
      if (!progress.ok()) return true;
    }
    return ready();
  };
  // A peer in step with this rank arrives within a few hundred nanoseconds:
  // spin a little before the Waiter, which reads the clock (as deadline()
  // does the first time), a cost as large as an 8-byte all-reduce's whole
  // protocol here. These spins count against the wait's spins.
  const int quick = spins_ >= 0 ? std::min(spins_, kQuickSpins) : kQuickSpins;
  for (int i = 0; i < quick; ++i) {
    if (step()) return progress;
    _mm_pause();
  }
  absl::Status s = runtime::WaitUntil(step, deadline(), what, watch_, kDataPathYield,
                                      spins_ >= 0 ? spins_ - quick : spins_);
  return progress.ok() ? s : progress;
}

absl::Status PoolTransport::WaitFailed(absl::Status s, int j, const char* what) {
  return Fail(absl::Status(
      s.code(), absl::StrCat(name_, " rank ", rank_, " in ", Describe(desc_), ": waiting for rank ",
                             j, " (", what, "): ", s.message())));
}

absl::StatusOr<uint64_t> PoolTransport::Stage() {
  CXLRT_FAULT_POINT("coll.post.begin");
  const uint64_t s = staged_ + 1;
  // Post s reuses the slot and post line of post s - depth: every peer must
  // have read it.
  if (s > depth_) CXLRT_RETURN_IF_ERROR(AwaitPeersDone(s - depth_));
  // The post's bytes and line go into this host's slot, which survivors
  // reclaim once they fenced it: write only under a held lease.
  if (!membership_->LeaseHeld()) {
    if (absl::Status l = membership_->CheckLease(); !l.ok()) {
      return Fail(absl::Status(l.code(), absl::StrCat(name_, " rank ", rank_, " in ",
                                                      Describe(desc_), ": ", l.message())));
    }
  }
  staged_ = s;
  return s;
}

absl::Status PoolTransport::Publish(uint64_t s, const Bytes& bytes, bool in_place,
                                    std::vector<CopyEngine::Ticket> after) {
  Pending p;
  p.s = s;
  p.post = {};
  p.post.instance = instance_;
  p.post.desc = desc_;
  p.post.data = bytes.data;
  p.post.len = bytes.extent();
  p.post.stride = bytes.stride;
  p.in_place = in_place;
  p.bytes = bytes;
  p.after = std::move(after);
  return Enqueue(std::move(p));
}

absl::Status PoolTransport::PublishInline(uint64_t s, const void* bytes, size_t len,
                                          size_t stride) {
  PostLayout post = {};
  post.instance = instance_;
  post.desc = desc_;
  // Line 0 carries the first kHeadBytes (comm_layout.h, PostLayout).
  post.len = len | uint64_t{stride} << 32;
  const auto* b = static_cast<const uint8_t*>(bytes);
  if (len) std::memcpy(&post.stride, b, std::min(len, kHeadBytes));
  if (len > kHeadBytes)
    std::memcpy(post.inline_bytes + kHeadBytes, b + kHeadBytes, len - kHeadBytes);
  if (pending_.empty()) {  // the common case: no copy behind it is in flight
    PublishLine(s, post);
    return absl::OkStatus();
  }
  Pending p;
  p.s = s;
  p.post = post;
  p.in_place = false;
  return Enqueue(std::move(p));
}

absl::Status PoolTransport::Enqueue(Pending&& p) {
  // The common case (a CPU engine, nothing queued): publish at once,
  // without the queue.
  if (pending_.empty()) {
    bool complete = true;
    for (CopyEngine::Ticket t : p.after) complete = complete && (t == 0 || engine_->Poll(t));
    if (complete) {
      PublishPost(p);
      return absl::OkStatus();
    }
  }
  // The engine writes the line behind the copies, unless a post before
  // this one waits for the host to publish it (posts go out in order).
  bool engine_publishes = engine_->publishes_posts() && !p.in_place;
  for (const Pending& q : pending_) engine_publishes = engine_publishes && q.by_engine;
  if (engine_publishes) {
    p.post.seq = p.s;  // the flag, written last
    const CopyEngine::Ticket t =
        engine_->PublishLine(PostAt(rank_, p.s), reinterpret_cast<const uint8_t*>(&p.post),
                             sizeof(PostLayout), p.after.data(), p.after.size());
    p.after.push_back(t);
    p.by_engine = true;
  }
  pending_.push_back(std::move(p));
  return Progress(0);
}

absl::Status PoolTransport::Progress(uint64_t through) {
  while (!pending_.empty()) {
    Pending& p = pending_.front();
    const bool wait = p.s <= through;
    while (!p.after.empty()) {
      const absl::StatusOr<bool> done = engine_->Settle(p.after.back(), wait, deadline());
      if (!done.ok()) {
        const absl::Status& s = done.status();
        return Fail(absl::Status(
            s.code(), absl::StrCat(name_, " rank ", rank_, " in ", Describe(desc_), ": the ",
                                   engine_->name(), " copy engine: ", s.message())));
      }
      if (!*done) return absl::OkStatus();
      p.after.pop_back();
    }
    if (!p.by_engine) PublishPost(p);
    if (p.post.data != 0) published_ = std::max(published_, p.s);
    pending_.pop_front();
  }
  return absl::OkStatus();
}

void PoolTransport::PublishPost(const Pending& p) {
  if (p.in_place) {
    // The caller wrote its buffer with plain stores: write back the pieces
    // before the post makes them visible (a fence in the hardware domain).
    for (int j = 0; j < p.bytes.pieces; ++j) {
      c_.Flush(p.bytes.data + j * p.bytes.stride, p.bytes.piece_len);
    }
  }
  PublishLine(p.s, p.post);
}

void PoolTransport::PublishLine(uint64_t s, const PostLayout& post) {
  const PoolOffset line = PostAt(rank_, s);
  // Bytes after the flag word; Publish drops a stale copy of the flag line
  // first (the block may be a reused one), so the whole-line write-back
  // carries the pool's flag, not one of a previous instance. Line 1 only
  // when it carries inline bytes: no reader reads it otherwise (CheckPost).
  const bool two_lines = post.data == 0 && (post.len & 0xffffffffu) > kHeadBytes;
  const size_t n = two_lines ? sizeof(PostLayout) : offsetof(PostLayout, inline_bytes);
  c_.Publish(line + sizeof(uint64_t), reinterpret_cast<const uint8_t*>(&post) + sizeof(uint64_t),
             n - sizeof(uint64_t));
  CXLRT_FAULT_POINT("coll.round.posted");
  c_.StoreFlag(line, s);
  if (post.data != 0) published_ = std::max(published_, s);
}

uint64_t PoolTransport::published() const {
  uint64_t out = published_;
  for (const Pending& p : pending_) {
    if (p.by_engine && p.post.data != 0) out = std::max(out, p.s);
  }
  return out;
}

absl::Status PoolTransport::CheckPost(int j, uint64_t s) {
  PostLayout& p = posts_[size_t(j) * depth_ + s % depth_];
  // Line 0 first: it holds everything but an inline post's bytes past
  // kHeadBytes (comm_layout.h), so most posts cost the reader one line.
  const PoolOffset at = PostAt(j, s);
  c_.Fetch(&p, at, offsetof(PostLayout, inline_bytes));
  if (p.instance != instance_) {
    return absl::DataLossError(absl::StrCat("rank ", j, " of ", name_, " posted ", p.seq,
                                            " for communicator instance ", absl::Hex(p.instance),
                                            ", not this one (", absl::Hex(instance_), ")"));
  }
  if (p.seq == s && p.desc == desc_) {
    // Its bytes lie in the pool (or inline), aligned to the call's elements.
    const size_t es = SizeOf(static_cast<DataType>(desc_.type));
    if (p.data == 0) {
      // Inline: unpack the cached copy to the plain form PeerBytes reads
      // (len, stride, the bytes from inline_bytes[0]).
      const uint64_t len = p.len & 0xffffffffu, stride = p.len >> 32;
      if (len > kInlineBytes || stride > kInlineBytes) {
        return absl::DataLossError(absl::StrCat("rank ", j, " of ", name_, " posted ", len,
                                                " inline bytes (stride ", stride, "): more than ",
                                                kInlineBytes));
      }
      std::memcpy(p.inline_bytes, &p.stride, kHeadBytes);
      if (len > kHeadBytes) {
        c_.Fetch(p.inline_bytes + kHeadBytes, at + offsetof(PostLayout, inline_bytes) + kHeadBytes,
                 len - kHeadBytes);
      }
      p.len = len;
      p.stride = stride;
      return absl::OkStatus();
    }
    const bool bad = p.data > pool_size_ || p.len > pool_size_ - p.data || p.data % es != 0 ||
                     p.stride % es != 0;
    if (bad) {
      return absl::DataLossError(absl::StrCat(
          "rank ", j, " of ", name_, " posted ", p.len, " bytes at 0x", absl::Hex(p.data),
          " (stride ", p.stride, "): outside the pool or not aligned to its elements"));
    }
    // Not in the peer's slot for this post: its caller's buffer, in place.
    const PoolOffset slot = rings_[j].slot[s % depth_];
    if (p.data < slot || p.data - slot >= slot_bytes_) read_in_place_[j] = 1;
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      p.seq != s
          ? absl::StrCat("rank ", rank_, " of ", name_, " is at post ", s, " of ", Describe(desc_),
                         " but rank ", j, " is at post ", p.seq, " (", Describe(p.desc), ")")
          : absl::StrCat("rank ", rank_, " called ", Describe(desc_), " but rank ", j, " called ",
                         Describe(p.desc), " on ", name_));
}

absl::Status PoolTransport::WaitPosted(uint64_t s) {
  CXLRT_RETURN_IF_ERROR(Progress(s));
  for (int j = 0; j < nranks_; ++j) {
    if (j == rank_) continue;
    const PoolOffset at = PostAt(j, s);
    if (c_.LoadFlag(at) < s) {
      absl::Status w = Await([&] { return c_.LoadFlag(at) >= s; }, "its post");
      if (!w.ok()) {
        if (!failed_.ok()) return failed_;
        // A peer that saw a mismatched call aborts; a rank waiting on another
        // peer meanwhile reports the mismatch too when the posts show it.
        for (int k = 0; k < nranks_; ++k) {
          if (k == rank_ || c_.LoadFlag(PostAt(k, s)) != s) continue;
          if (absl::Status m = CheckPost(k, s); !m.ok()) return Fail(m);
        }
        return WaitFailed(w, j, "its post");
      }
    }
    if (absl::Status m = CheckPost(j, s); !m.ok()) return Fail(m);
  }
  return absl::OkStatus();
}

absl::StatusOr<const uint8_t*> PoolTransport::PeerBytes(int j, uint64_t s, size_t offset,
                                                        size_t n) {
  const PostLayout& p = posts_[size_t(j) * depth_ + s % depth_];
  if (offset > p.len || n > p.len - offset) {
    // Every rank runs the same call (CheckPost compared them), so a peer
    // that posted fewer bytes than the call implies wrote a corrupt post:
    // reading on would read past its data (issue 13, defect 7).
    return Fail(absl::DataLossError(absl::StrCat(
        "rank ", j, " of ", name_, " posted ", p.len, " bytes in ", Describe(desc_), " but rank ",
        rank_, " needs bytes [", offset, ", ", offset + n, ") of them")));
  }
  if (p.data == 0) return p.inline_bytes + offset;
  return c_.BeginRead(p.data + offset, n);
}

absl::StatusOr<const uint8_t*> PoolTransport::PeerPiece(int j, uint64_t s, int piece, size_t n) {
  const PostLayout& p = posts_[size_t(j) * depth_ + s % depth_];
  // stride <= len (CheckPost bounds len by the pool), so this cannot wrap.
  if (piece > 0 && p.stride > p.len / static_cast<uint64_t>(piece)) {
    return Fail(absl::DataLossError(absl::StrCat("rank ", j, " of ", name_, " posted ", p.len,
                                                 " bytes with stride ", p.stride, " in ",
                                                 Describe(desc_), ": no piece ", piece)));
  }
  return PeerBytes(j, s, piece * p.stride, n);
}

void PoolTransport::Done(uint64_t s) { c_.StoreFlag(DoneAt(rank_), s); }

absl::Status PoolTransport::AwaitPeersDone(uint64_t s) {
  for (int j = 0; j < nranks_; ++j) {
    if (j == rank_) continue;
    // A done counter only grows: a value seen before that suffices saves
    // loading a line the peer writes every post (a miss across cores).
    if (peer_done_[j] >= s) continue;
    const PoolOffset done = DoneAt(j);
    peer_done_[j] = c_.LoadFlag(done);
    if (peer_done_[j] >= s) continue;
    absl::Status w = Await(
        [&] {
          peer_done_[j] = c_.LoadFlag(done);
          return peer_done_[j] >= s;
        },
        "to read this rank's posts");
    if (!w.ok()) return failed_.ok() ? WaitFailed(w, j, "to read this rank's posts") : failed_;
  }
  return absl::OkStatus();
}

}  // namespace cxlrt::collectives
