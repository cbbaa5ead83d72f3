// Internal to cxlrt/allocator/: the queue of remote frees a host holds for one
// owner while that owner's ring is full.
//
// A backlog can reach millions of frees (an owner that does not drain for
// a while), so the queue keeps its words in memory of its own: mapped with
// mmap, 64 KiB at first, then 4 MiB and doubling, 2 MiB aligned and
// advised for transparent huge pages (a growth copies the live words once
// into the new mapping). A 4 KiB page fault costs 11-16 us on the VMs we measure
// (MACHINE-NOTES), which a malloc'd queue pays on every new page: 8 MiB of
// backlog would cost 25 ms of faults, a huge page costs 0.28 us per 4 KiB.
// The memory is kept when the queue empties, for the next backlog.
//
// Thread-safety: none; the allocator uses it under its mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "absl/functional/function_ref.h"

namespace cxlrt::allocator_internal {

class FreeQueue {
 public:
  FreeQueue() = default;
  FreeQueue(FreeQueue&& other) noexcept;
  FreeQueue& operator=(FreeQueue&& other) noexcept;
  FreeQueue(const FreeQueue&) = delete;
  FreeQueue& operator=(const FreeQueue&) = delete;
  ~FreeQueue();

  size_t size() const { return tail_ - head_; }
  bool empty() const { return tail_ == head_; }
  // The i-th oldest word. REQUIRES: i < size().
  uint64_t operator[](size_t i) const { return words_[head_ + i]; }

  // Appends `word`; false (the queue unchanged) when no memory could be had.
  bool Push(uint64_t word) {
    if (tail_ == capacity_ && !MakeRoom()) return false;
    words_[tail_++] = word;
    return true;
  }
  // Drops the oldest `n`. REQUIRES: n <= size().
  void PopFront(size_t n) {
    head_ += n;
    if (head_ == tail_) head_ = tail_ = 0;
  }
  // Drops every word for which `drop` is true, keeping the others' order.
  void EraseIf(absl::FunctionRef<bool(uint64_t)> drop);

 private:
  // Moves the words to the front, or grows the mapping. False on ENOMEM.
  bool MakeRoom();

  uint64_t* words_ = nullptr;
  size_t capacity_ = 0;  // words mapped
  size_t head_ = 0, tail_ = 0;
};

}  // namespace cxlrt::allocator_internal
