#include "cxlrt/kv/internal/eviction.h"

#include <utility>

namespace cxlrt::kv_internal {

EvictionOrder::EvictionOrder(Policy policy, uint32_t capacity)
    : policy_(policy),
      capacity_(capacity),
      prev_(capacity, kNil),
      next_(capacity, kNil),
      where_(capacity, kNone),
      freq_(capacity, 0),
      hash_(capacity, 0),
      stamp_(capacity, 0) {}

void EvictionOrder::PushHead(uint8_t which, uint32_t i) {
  List& l = ListOf(which);
  prev_[i] = kNil;
  next_[i] = l.head;
  if (l.head != kNil) prev_[l.head] = i;
  l.head = i;
  if (l.tail == kNil) l.tail = i;
  ++l.size;
  where_[i] = which;
  ++size_;
}

void EvictionOrder::PushTail(uint8_t which, uint32_t i) {
  List& l = ListOf(which);
  next_[i] = kNil;
  prev_[i] = l.tail;
  if (l.tail != kNil) next_[l.tail] = i;
  l.tail = i;
  if (l.head == kNil) l.head = i;
  ++l.size;
  where_[i] = which;
  ++size_;
}

void EvictionOrder::Unlink(uint32_t i) {
  List& l = ListOf(where_[i]);
  if (prev_[i] != kNil) {
    next_[prev_[i]] = next_[i];
  } else {
    l.head = next_[i];
  }
  if (next_[i] != kNil) {
    prev_[next_[i]] = prev_[i];
  } else {
    l.tail = prev_[i];
  }
  --l.size;
  where_[i] = kNone;
  --size_;
}

void EvictionOrder::AddGhost(uint64_t hash) {
  ghost_fifo_.push_back(hash);
  ghosts_.insert(hash);
  if (ghost_fifo_.size() > capacity_) {
    ghosts_.erase(ghosts_.find(ghost_fifo_.front()));
    ghost_fifo_.pop_front();
  }
}

void EvictionOrder::Insert(uint32_t i, uint64_t hash) {
  hash_[i] = hash;
  freq_[i] = 0;
  stamp_[i] = ++clock_;
  if (policy_ == Policy::kLru) {
    PushHead(kMain, i);
    return;
  }
  auto g = ghosts_.find(hash);
  if (g != ghosts_.end()) {
    ghosts_.erase(g);  // its fifo record stays and is dropped when it ages out
    PushHead(kMain, i);
  } else {
    PushHead(kSmall, i);
  }
}

void EvictionOrder::Touch(uint32_t i) {
  if (where_[i] == kNone) return;
  stamp_[i] = ++clock_;
  if (freq_[i] < 3) ++freq_[i];
  if (policy_ == Policy::kLru) {
    Unlink(i);
    PushHead(kMain, i);
  }
}

void EvictionOrder::Remove(uint32_t i) {
  if (where_[i] != kNone) Unlink(i);
}

void EvictionOrder::Reinstate(uint32_t i) {
  if (where_[i] != kNone) return;
  PushHead(kMain, i);
  freq_[i] = 1;
  stamp_[i] = ++clock_;
}

std::vector<uint32_t> EvictionOrder::TakeVictims(size_t want,
                                                 const std::function<bool(uint32_t)>& eligible) {
  std::vector<uint32_t> out;
  if (policy_ == Policy::kLru) {
    for (uint32_t i = main_.tail; i != kNil && out.size() < want;) {
      const uint32_t prev = prev_[i];
      if (eligible(i)) {
        Unlink(i);
        out.push_back(i);
      }
      i = prev;
    }
    return out;
  }
  // S3-FIFO. Entries that are not eligible are passed over in place; the
  // pass count bounds the work when few are eligible.
  std::vector<std::pair<uint32_t, uint8_t>> skipped;
  size_t budget = 2 * size_ + 2;
  while (out.size() < want && size_ > 0 && budget-- > 0) {
    const bool from_small = small_.size > 0 && (small_.size * 10 >= size_ || main_.size == 0);
    const uint32_t t = from_small ? small_.tail : main_.tail;
    Unlink(t);
    if (!eligible(t)) {
      skipped.emplace_back(t, from_small ? kSmall : kMain);
      continue;
    }
    if (from_small) {
      if (freq_[t] > 0) {  // read again while new: it earns a place in main
        freq_[t] = 0;
        PushHead(kMain, t);
        continue;
      }
      AddGhost(hash_[t]);
      out.push_back(t);
    } else {
      if (freq_[t] > 0) {  // another pass
        --freq_[t];
        PushHead(kMain, t);
        continue;
      }
      out.push_back(t);
    }
  }
  // Passed-over entries go back to the tail they came from, oldest last.
  for (auto it = skipped.rbegin(); it != skipped.rend(); ++it) PushTail(it->second, it->first);
  return out;
}

int64_t EvictionOrder::OldestOf(const std::vector<uint32_t>& slots) const {
  int64_t best = -1;
  for (uint32_t i : slots) {
    if (where_[i] == kNone) continue;
    if (best < 0 || freq_[i] < freq_[best] ||
        (freq_[i] == freq_[best] && stamp_[i] < stamp_[best])) {
      best = i;
    }
  }
  return best;
}

}  // namespace cxlrt::kv_internal
