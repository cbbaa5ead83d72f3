// A copy engine for tests that completes every operation late and out of
// order: nothing runs when it is submitted; each Poll runs one pending
// operation chosen at random (of any ticket, or none), and Wait(t) runs
// random pending operations until t has run. An algorithm that publishes
// a post before its copies completed, reads a reduced shard before the
// reduction ran, or marks a post read while a copy still reads it, then
// hands its peers (or itself) wrong bytes, and the exactness checks fail.
// Thread-safety: one thread, like every engine.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <vector>

#include "cxlrt/collectives/copy_engine.h"

namespace cxlrt::collectives {

class LateEngine final : public CopyEngine {
 public:
  // `device_like`: behave as the CUDA engine does towards the algorithms:
  // caller buffers are not host-readable (no inline posts), so every chunk
  // goes through ToPool and completes late.
  // `publishes`: publish post lines itself, late too, as the CUDA engine
  // does under CXLRT_CUDA_DOORBELL=copy (each after the tickets behind it,
  // as a stream orders them).
  LateEngine(runtime::Coherence& c, uint32_t seed, bool device_like = false, bool publishes = false)
      : c_(c), rng_(seed), device_like_(device_like), publishes_(publishes) {}
  const char* name() const override { return "late (test)"; }
  bool host_buffers() const override { return !device_like_; }
  bool publishes_posts() const override { return publishes_; }

  Ticket PublishLine(runtime::PoolOffset line, const uint8_t* image, size_t n, const Ticket* after,
                     size_t n_after) override {
    std::vector<uint8_t> img(image, image + n);
    std::vector<Ticket> deps(after, after + n_after);
    ++published_;
    return Add([this, line, img, deps] {
      for (Ticket t : deps) RunTicket(t);  // what a stream runs before it
      c_.Publish(line + 8, img.data() + 8, img.size() - 8);
      uint64_t seq;
      std::memcpy(&seq, img.data(), 8);
      c_.StoreFlag(line, seq);
    });
  }
  // Post lines this engine published.
  uint64_t published() const { return published_; }
  // From its `n`th operation on, the engine has failed, as the CUDA engine
  // after a sticky error: that operation and every later one never
  // complete, and failure() and Wait return the error.
  void FailFrom(uint64_t n) { fail_from_ = n; }
  absl::Status failure() const override {
    return next_ >= fail_from_ ? absl::InternalError("injected copy-engine failure")
                               : absl::OkStatus();
  }

  Ticket ToPool(runtime::PoolOffset dst, const void* src, size_t n) override {
    return Add([this, dst, src, n] {
      if (n) c_.CopyToPool(dst, src, n);
    });
  }
  Ticket FromPool(void* dst, const void* pool_src, size_t n) override {
    return Add([dst, pool_src, n] {
      if (n) runtime::CopyBytes(dst, pool_src, n);
    });
  }
  Ticket Copy(void* dst, const void* src, size_t n) override {
    return Add([dst, src, n] {
      if (n) runtime::CopyBytes(dst, src, n);
    });
  }
  Ticket Reduce(DataType t, RedOp op, void* out, const void* const* srcs, int n, size_t count,
                int avg_divisor) override {
    std::vector<const void*> s(srcs, srcs + n);  // the caller reuses its array
    return Add([=] {
      if (count) collectives::Reduce(t, op, out, s.data(), n, count, avg_divisor);
    });
  }
  // From now on Poll runs nothing and Wait(t) runs only t: an operation
  // runs only when Wait or Drain asks for it (a GPU whose copies are all still in flight when the
  // host looks).
  void RunOnlyWhenWaited() { lazy_ = true; }
  bool Poll(Ticket t) override {
    if (t >= fail_from_) return false;
    if (!lazy_ && !pending_.empty() && rng_() % 3 == 0) RunOne();
    return !pending_.count(t);
  }
  absl::Status Wait(Ticket t, absl::Time) override {
    if (t >= fail_from_) return failure();
    if (lazy_) RunTicket(t);
    while (pending_.count(t)) RunOne();
    return absl::OkStatus();
  }

  // Runs every pending operation that will ever run (a failed engine's
  // never do), as a GPU's streams finish their queued copies.
  absl::Status Drain(absl::Time) override {
    while (!pending_.empty()) RunOne();
    return absl::OkStatus();
  }
  // Operations submitted and not yet run (they run at a later Poll, Wait or
  // Drain: a GPU's copies still in flight).
  size_t pending() const { return pending_.size(); }

  // Operations run so far, and the most that were pending at once.
  uint64_t ran() const { return ran_; }
  size_t most_pending() const { return most_pending_; }

 private:
  Ticket Add(std::function<void()> op) {
    const Ticket t = ++next_;
    if (t >= fail_from_) return t;  // never runs
    pending_.emplace(t, std::move(op));
    most_pending_ = std::max(most_pending_, pending_.size());
    return t;
  }
  void RunOne() {
    auto it = pending_.begin();
    std::advance(it, rng_() % pending_.size());
    RunTicket(it->first);
  }
  void RunTicket(Ticket t) {
    auto it = pending_.find(t);
    if (it == pending_.end()) return;  // ran already
    std::function<void()> op = std::move(it->second);
    pending_.erase(it);
    op();
    ++ran_;
  }

  runtime::Coherence& c_;
  std::mt19937 rng_;
  const bool device_like_;
  const bool publishes_;
  bool lazy_ = false;
  uint64_t published_ = 0;
  Ticket fail_from_ = UINT64_MAX;
  Ticket next_ = 0;
  std::map<Ticket, std::function<void()>> pending_;
  uint64_t ran_ = 0;
  size_t most_pending_ = 0;
};

}  // namespace cxlrt::collectives
