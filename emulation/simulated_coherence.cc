#include "emulation/simulated_coherence.h"

#include <array>
#include <atomic>
#include <cstring>
#include <mutex>

#include "absl/container/btree_map.h"

namespace cxlrt::emulation {
namespace {

using runtime::kCacheLine;
using runtime::PoolOffset;

constexpr size_t kWords = kCacheLine / 8;

struct Line {
  std::array<uint64_t, kWords> words;
  bool dirty = false;
};

class SimulatedCoherence final : public runtime::Coherence {
 public:
  using Coherence::Coherence;

  runtime::CoherenceDomain domain() const override { return runtime::CoherenceDomain::kSimulated; }

  size_t cached_lines() {
    std::lock_guard<std::mutex> lock(mu_);
    return lines_.size();
  }

 protected:
  void DoWrite(PoolOffset dst, const void* src, size_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    const auto* s = static_cast<const uint8_t*>(src);
    ForEachLine(dst, n, [&](uint64_t line, size_t from, size_t len) {
      Line& l = Cached(line);
      std::memcpy(reinterpret_cast<uint8_t*>(l.words.data()) + from, s, len);
      l.dirty = true;
      s += len;
    });
  }

  void DoRead(void* dst, PoolOffset src, size_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto* d = static_cast<uint8_t*>(dst);
    ForEachLine(src, n, [&](uint64_t line, size_t from, size_t len) {
      const Line& l = Cached(line);
      std::memcpy(d, reinterpret_cast<const uint8_t*>(l.words.data()) + from, len);
      d += len;
    });
  }

  void DoFlush(PoolOffset off, size_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (n == 0) return;
    for (auto it = lines_.lower_bound(off / kCacheLine);
         it != lines_.end() && it->first * kCacheLine < off + n; ++it) {
      if (it->second.dirty) WriteBack(it->first, it->second);
    }
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }

  void DoInvalidate(PoolOffset off, size_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    Drop(off, n);
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }

  void DoStoreFlag(PoolOffset flag, uint64_t value) override {
    DoWrite(flag, &value, sizeof(value));
    DoFlush(flag, sizeof(value));
  }

  uint64_t DoLoadFlag(PoolOffset flag) override {
    DoInvalidate(flag, sizeof(uint64_t));
    uint64_t v;
    DoRead(&v, flag, sizeof(v));
    return v;
  }

  void DoCopyToPool(PoolOffset dst, const void* src, size_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    Drop(dst, n);
    std::memcpy(At(dst), src, n);
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }

  void DoCopyFromPool(void* dst, PoolOffset src, size_t n) override {
    std::lock_guard<std::mutex> lock(mu_);
    Drop(src, n);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    std::memcpy(dst, At(src), n);
  }

  uint64_t DoFetchAdd(PoolOffset off, uint64_t delta) override {
    std::lock_guard<std::mutex> lock(mu_);
    Drop(off, 8);
    return Coherence::DoFetchAdd(off, delta);
  }

  bool DoCompareExchange(PoolOffset off, uint64_t& expected, uint64_t desired) override {
    std::lock_guard<std::mutex> lock(mu_);
    Drop(off, 8);
    return Coherence::DoCompareExchange(off, expected, desired);
  }

 private:
  // Calls fn(line index, offset in line, length) for each line of [off, off+n).
  template <typename Fn>
  static void ForEachLine(PoolOffset off, size_t n, Fn&& fn) {
    while (n > 0) {
      const size_t from = off % kCacheLine;
      const size_t len = std::min(n, kCacheLine - from);
      fn(off / kCacheLine, from, len);
      off += len;
      n -= len;
    }
  }

  uint64_t* PoolWords(uint64_t line) const {
    return reinterpret_cast<uint64_t*>(At(line * kCacheLine));
  }

  // The private copy of `line`, filled from the pool when absent.
  // REQUIRES: mu_ held.
  Line& Cached(uint64_t line) {
    auto [it, inserted] = lines_.try_emplace(line);
    if (inserted) {
      uint64_t* w = PoolWords(line);
      for (size_t i = 0; i < kWords; ++i) {
        it->second.words[i] = std::atomic_ref<uint64_t>(w[i]).load(std::memory_order_acquire);
      }
    }
    return it->second;
  }

  void WriteBack(uint64_t line, Line& l) {
    uint64_t* w = PoolWords(line);
    for (size_t i = 0; i < kWords; ++i) {
      std::atomic_ref<uint64_t>(w[i]).store(l.words[i], std::memory_order_release);
    }
    l.dirty = false;
  }

  // Writes back and drops the cached lines of [off, off+n). REQUIRES: mu_ held.
  void Drop(PoolOffset off, size_t n) {
    if (n == 0) return;
    auto it = lines_.lower_bound(off / kCacheLine);
    while (it != lines_.end() && it->first * kCacheLine < off + n) {
      if (it->second.dirty) WriteBack(it->first, it->second);
      it = lines_.erase(it);
    }
  }

  std::mutex mu_;
  absl::btree_map<uint64_t, Line> lines_;  // guarded by mu_: line index -> private copy
};

std::unique_ptr<runtime::Coherence> Make(uint8_t* base, uint64_t size) {
  return std::make_unique<SimulatedCoherence>(base, size);
}

[[maybe_unused]] const bool kRegistered = [] {
  RegisterSimulatedCoherence();
  return true;
}();

}  // namespace

std::unique_ptr<runtime::Coherence> MakeSimulatedCoherence(uint8_t* base, uint64_t size) {
  return Make(base, size);
}

size_t SimulatedCachedLines(runtime::Coherence& c) {
  return static_cast<SimulatedCoherence&>(c).cached_lines();
}

void RegisterSimulatedCoherence() {
  runtime::RegisterCoherenceFactory(runtime::CoherenceDomain::kSimulated, &Make);
}

}  // namespace cxlrt::emulation
