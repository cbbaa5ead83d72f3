#include "cxlrt/allocator/internal/free_queue.h"

#include <sys/mman.h>

#include <algorithm>
#include <utility>

namespace cxlrt::allocator_internal {

namespace {

constexpr size_t kFirstBytes = 64 << 10;  // one queue per owner: small at first
constexpr size_t kHugePage = 2 << 20;
// After the first mapping, at least this much: huge pages from then on (a
// backlog past 8192 frees is one that grows).
constexpr size_t kGrownBytes = 2 * kHugePage;

// `bytes` of fresh memory, 2 MiB aligned and advised huge when it is that
// large; nullptr when none could be had. Where THP is off it still works,
// at 4 KiB a fault.
void* MapWords(size_t bytes) {
  if (bytes < kHugePage) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? nullptr : p;
  }
  void* p =
      mmap(nullptr, bytes + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return nullptr;
  const auto at = reinterpret_cast<uintptr_t>(p);
  const uintptr_t aligned = (at + kHugePage - 1) & ~uintptr_t{kHugePage - 1};
  if (aligned > at) munmap(p, aligned - at);
  munmap(reinterpret_cast<void*>(aligned + bytes), at + kHugePage - aligned);
  (void)madvise(reinterpret_cast<void*>(aligned), bytes, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(aligned);
}

}  // namespace

FreeQueue::FreeQueue(FreeQueue&& other) noexcept
    : words_(std::exchange(other.words_, nullptr)),
      capacity_(std::exchange(other.capacity_, 0)),
      head_(std::exchange(other.head_, 0)),
      tail_(std::exchange(other.tail_, 0)) {}

FreeQueue& FreeQueue::operator=(FreeQueue&& other) noexcept {
  // `other` takes this queue's memory and releases it.
  std::swap(words_, other.words_);
  std::swap(capacity_, other.capacity_);
  std::swap(head_, other.head_);
  std::swap(tail_, other.tail_);
  return *this;
}

FreeQueue::~FreeQueue() {
  if (words_ != nullptr) munmap(words_, capacity_ * sizeof(uint64_t));
}

void FreeQueue::EraseIf(absl::FunctionRef<bool(uint64_t)> drop) {
  size_t out = 0;
  for (size_t k = head_; k < tail_; ++k) {
    if (!drop(words_[k])) words_[out++] = words_[k];
  }
  head_ = 0;
  tail_ = out;
}

bool FreeQueue::MakeRoom() {
  // Half or more of the mapping consumed at the front: slide down instead.
  if (head_ > 0 && head_ >= capacity_ / 2) {
    std::memmove(words_, words_ + head_, (tail_ - head_) * sizeof(uint64_t));
    tail_ -= head_;
    head_ = 0;
    return true;
  }
  const size_t old_bytes = capacity_ * sizeof(uint64_t);
  const size_t new_bytes = old_bytes == 0 ? kFirstBytes : std::max(2 * old_bytes, kGrownBytes);
  auto* words = static_cast<uint64_t*>(MapWords(new_bytes));
  if (words == nullptr) return false;
  if (words_ != nullptr) {
    std::memcpy(words, words_ + head_, (tail_ - head_) * sizeof(uint64_t));
    munmap(words_, old_bytes);
  }
  words_ = words;
  capacity_ = new_bytes / sizeof(uint64_t);
  tail_ -= head_;
  head_ = 0;
  return true;
}

}  // namespace cxlrt::allocator_internal
