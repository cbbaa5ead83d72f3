// Internal to cxlrt/allocator/: the per-thread caches in front of an owner's arena.
//
// Each thread keeps, per size class, a few private blocks that the arena
// counts as handed out. Allocate and Free of those take no lock, run no
// atomic read-modify-write and write nothing to the pool; blocks move
// between a thread's cache and the arena in batches under the allocator's
// lock. Double frees stay exact: the arena's per-block state byte
// (SlabView) says whether a block is with a caller or in some cache.
//
// Thread-safety: a ThreadCache is used by its own thread, except that the
// allocator's Close empties every cache (REQUIRES: no call in flight) and
// statistics read the counts (relaxed loads). The registry's mutex orders
// a thread's exit against Close; take it before the allocator's mutex.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "cxlrt/allocator/size_classes.h"
#include "cxlrt/runtime/pool.h"

namespace cxlrt::allocator_internal {

struct ThreadCache {
  // At most this many bytes per class (and at least two blocks).
  static constexpr uint64_t kBytesPerClass = 128 << 10;
  static constexpr uint32_t Capacity(uint32_t cls) {
    const uint64_t n = kBytesPerClass / allocator::kClassSizes[cls];
    return static_cast<uint32_t>(n < 2 ? 2 : (n > 128 ? 128 : n));
  }

  struct Bin {
    std::atomic<uint32_t> count{0};  // written by the owning thread only
    uint32_t capacity = 0;
    std::unique_ptr<runtime::PoolOffset[]> blocks;  // [0, count) are free blocks
  };
  std::array<Bin, allocator::kNumClasses> bins;

  ThreadCache() {
    for (uint32_t c = 0; c < allocator::kNumClasses; ++c) {
      bins[c].capacity = Capacity(c);
      bins[c].blocks = std::make_unique<runtime::PoolOffset[]>(bins[c].capacity);
    }
  }
};

// Shared by an allocator and the caches of its threads (which may outlive
// it: a thread that exits after Close finds `give_back` empty).
struct ThreadCacheRegistry {
  std::mutex mu;
  // Returns every block of a cache to the arena. Set by the allocator;
  // emptied by its Close.
  std::function<void(ThreadCache&)> give_back;  // guarded by mu
  std::vector<ThreadCache*> caches;             // guarded by mu
};

// Makes and registers the calling thread's cache for `registry`. The
// thread's exit gives its blocks back (unless the process forked since: a
// child never writes its parent's arena) and unregisters it.
ThreadCache* AttachThreadCache(const std::shared_ptr<ThreadCacheRegistry>& registry);

}  // namespace cxlrt::allocator_internal
