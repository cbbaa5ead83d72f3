// Internal to cxlrt/kv/: the eviction order of one host's own entries (process
// memory; rebuilt from the pool when a host reopens its partition).
//
// - LRU: one list, most recent at the head; victims from the tail.
// - S3-FIFO (Yang et al., SOSP 2023): a small FIFO for new entries (a tenth
//   of them), a main FIFO, and a ghost FIFO of recently evicted key hashes.
//   An entry read again while in the small FIFO moves to the main one; an
//   entry whose hash is a ghost goes straight to the main FIFO; the main
//   FIFO gives an entry read since its last pass another pass. One-hit
//   wonders (a prefix seen once) leave quickly without flushing hot ones.
//
// Entries are index slots [0, capacity). Thread-safety: none (the store's
// partition mutex guards it).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <unordered_set>
#include <vector>

namespace cxlrt::kv_internal {

enum class Policy { kLru, kS3Fifo };

class EvictionOrder {
 public:
  EvictionOrder(Policy policy, uint32_t capacity);

  // A new entry at slot `i` with key hash `hash`. REQUIRES: i not in the order.
  void Insert(uint32_t i, uint64_t hash);
  // Slot `i` was read (or pinned). No-op when it is not in the order.
  void Touch(uint32_t i);
  // Slot `i` leaves the order (deleted). No-op when it is not in it.
  void Remove(uint32_t i);
  // Takes up to `want` victims out of the order, in eviction order, among
  // slots for which `eligible` holds (others keep their place). The caller
  // evicts them, or Reinstate()s those it could not (pinned).
  std::vector<uint32_t> TakeVictims(size_t want, const std::function<bool(uint32_t)>& eligible);
  // Puts back a victim the caller kept, as if just read.
  void Reinstate(uint32_t i);
  // Of `slots`, the one in the order that is coldest (least read, then
  // least recently inserted or read); -1 when none is in the order.
  int64_t OldestOf(const std::vector<uint32_t>& slots) const;

  size_t size() const { return size_; }
  Policy policy() const { return policy_; }

 private:
  static constexpr uint8_t kNone = 0, kSmall = 1, kMain = 2;
  static constexpr uint32_t kNil = ~uint32_t{0};
  struct List {
    uint32_t head = kNil, tail = kNil;
    size_t size = 0;
  };
  List& ListOf(uint8_t which) { return which == kSmall ? small_ : main_; }
  void PushHead(uint8_t which, uint32_t i);
  void PushTail(uint8_t which, uint32_t i);
  void Unlink(uint32_t i);
  void AddGhost(uint64_t hash);

  const Policy policy_;
  const uint32_t capacity_;
  std::vector<uint32_t> prev_, next_;
  std::vector<uint8_t> where_;  // kNone, kSmall, kMain
  std::vector<uint8_t> freq_;   // S3-FIFO: reads since insertion or the last pass, up to 3
  std::vector<uint64_t> hash_;
  std::vector<uint64_t> stamp_;  // order of the last insert or touch, for OldestOf
  uint64_t clock_ = 0;
  List small_, main_;  // LRU uses main_ only
  size_t size_ = 0;
  std::deque<uint64_t> ghost_fifo_;
  std::unordered_multiset<uint64_t> ghosts_;
};

}  // namespace cxlrt::kv_internal
