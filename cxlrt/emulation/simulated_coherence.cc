#include "cxlrt/emulation/simulated_coherence.h"

#include <execinfo.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>

#include "absl/container/btree_map.h"
#include "cxlrt/runtime/coherence_counters.h"
#include "cxlrt/runtime/knobs.h"

namespace cxlrt::emulation {
namespace {

const runtime::Knob<bool> kSimStaleWriteBack(
    {"CXLRT_SIM_STALE_WRITEBACK", "",
     "For tests of the simulator: allow lets the simulated domain write back a line another host "
     "changed; otherwise that aborts naming the line (docs/coherence.md)."},
    false,
    [](const char*, const std::string& text) -> absl::StatusOr<bool> { return text == "allow"; });

using runtime::kCacheLine;
using runtime::PoolOffset;

constexpr size_t kWords = kCacheLine / 8;

struct Line {
  std::array<uint64_t, kWords> words;
  // What the pool held when this host last filled or wrote back the line,
  // and which bytes this host has stored since: a write-back checks that
  // the bytes it did not store are still what the pool holds.
  std::array<uint64_t, kWords> seen;
  uint64_t stored = 0;  // bit b: byte b stored by this host since `seen`
  bool dirty = false;
};

// Bytes [from, from+len) of a line as a bit mask.
uint64_t ByteMask(size_t from, size_t len) {
  const uint64_t bits = len >= 64 ? ~uint64_t{0} : (uint64_t{1} << len) - 1;
  return bits << from;
}

// The 8 byte-mask bits of word i widened to a 64-bit mask of its bits.
uint64_t WordBits(uint64_t byte_mask, size_t i) {
  uint64_t m = 0;
  for (size_t b = 0; b < 8; ++b) {
    if ((byte_mask >> (i * 8 + b)) & 1) m |= uint64_t{0xff} << (b * 8);
  }
  return m;
}

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
      l.stored |= ByteMask(from, len);
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
    counters_.flushes.Add();
    counters_.flushed_lines.Add(runtime::LinesOf(off, n));
    std::lock_guard<std::mutex> lock(mu_);
    if (n == 0) return;
    for (auto it = lines_.lower_bound(off / kCacheLine);
         it != lines_.end() && it->first * kCacheLine < off + n; ++it) {
      if (it->second.dirty) WriteBack(it->first, it->second);
    }
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }

  void DoInvalidate(PoolOffset off, size_t n) override {
    counters_.invalidates.Add();
    counters_.invalidated_lines.Add(runtime::LinesOf(off, n));
    std::lock_guard<std::mutex> lock(mu_);
    Drop(off, n);
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }

  // A DMA writes the pool itself: this host's copies of the lines would
  // hide its bytes (and a dirty one would later overwrite them).
  void DoBeforeGpuWrite(PoolOffset off, size_t n) override { DoInvalidate(off, n); }

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
      it->second.seen = it->second.words;
    }
    return it->second;
  }

  // Writes the whole line back, as a cache does. Bytes this host did not
  // store go back as this host last saw them: if another host has changed
  // them since, the write-back undoes its stores. That is always a protocol
  // bug (two writers of one line, or a partial write of a stale copy after
  // a block was reused: invalidate first, Coherence::Publish does), so it
  // is reported and aborts, unless CXLRT_SIM_STALE_WRITEBACK=allow (tests
  // of the simulator itself).
  void WriteBack(uint64_t line, Line& l) {
    uint64_t* w = PoolWords(line);
    for (size_t i = 0; i < kWords; ++i) {
      const uint64_t now = std::atomic_ref<uint64_t>(w[i]).load(std::memory_order_acquire);
      const uint64_t theirs = (now ^ l.seen[i]) & ~WordBits(l.stored, i);
      if (theirs != 0 && !AllowStaleWriteBack()) StaleWriteBack(line, i, now, l);
      std::atomic_ref<uint64_t>(w[i]).store(l.words[i], std::memory_order_release);
    }
    l.seen = l.words;
    l.stored = 0;
    l.dirty = false;
  }

  static bool AllowStaleWriteBack() {
    static const bool allow = [] {
      // Read at the first stale write-back, not at open: tests set it late.
      return kSimStaleWriteBack.Current();
    }();
    return allow;
  }

  [[noreturn]] void StaleWriteBack(uint64_t line, size_t word, uint64_t now, const Line& l) const {
    std::fprintf(stderr,
                 "cxlrt: FATAL: simulated coherence: this host writes back pool line %#llx whose "
                 "word %zu another host changed since this host cached it (pool holds %#llx, "
                 "this host's copy %#llx): a partial write of a stale line undoes the other "
                 "host's stores; invalidate the line before writing part of it\n",
                 static_cast<unsigned long long>(line * kCacheLine), word,
                 static_cast<unsigned long long>(now),
                 static_cast<unsigned long long>(l.words[word]));
    // Where: the write-back's caller is the protocol to fix.
    void* frames[32];
    backtrace_symbols_fd(frames, backtrace(frames, 32), 2);
    std::abort();
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

  runtime::CoherenceCounters& counters_ = runtime::GetCoherenceCounters();
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
