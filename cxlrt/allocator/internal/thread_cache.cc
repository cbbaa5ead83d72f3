#include "cxlrt/allocator/internal/thread_cache.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

namespace cxlrt::allocator_internal {
namespace {

// The caches of one thread, one per allocator it used.
struct ThreadCaches {
  const pid_t pid = getpid();
  std::vector<std::pair<std::shared_ptr<ThreadCacheRegistry>, std::unique_ptr<ThreadCache>>> all;

  ~ThreadCaches() {
    if (getpid() != pid) return;  // a forked child: the arena is its parent's
    for (auto& [registry, cache] : all) {
      std::lock_guard<std::mutex> lock(registry->mu);
      if (registry->give_back) registry->give_back(*cache);
      auto& v = registry->caches;
      v.erase(std::remove(v.begin(), v.end(), cache.get()), v.end());
    }
  }
};

thread_local ThreadCaches caches;

}  // namespace

ThreadCache* AttachThreadCache(const std::shared_ptr<ThreadCacheRegistry>& registry) {
  for (auto& [r, cache] : caches.all) {
    if (r == registry) return cache.get();
  }
  // Forget the caches of allocators closed since (Close emptied them).
  std::erase_if(caches.all, [](const auto& entry) {
    std::lock_guard<std::mutex> lock(entry.first->mu);
    return !entry.first->give_back;
  });
  auto cache = std::make_unique<ThreadCache>();
  ThreadCache* raw = cache.get();
  {
    std::lock_guard<std::mutex> lock(registry->mu);
    registry->caches.push_back(raw);
  }
  caches.all.emplace_back(registry, std::move(cache));
  return raw;
}

}  // namespace cxlrt::allocator_internal
