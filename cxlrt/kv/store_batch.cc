// Batches whose buffers are GPU memory (docs/gpu.md, "KV blocks"): the
// memory kind of each item, and puts and gets whose copies are pipelined
// on the CUDA engine in groups while the CPU seals or checks the group
// before.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cxlrt/kv/internal/store_impl.h"
#include "cxlrt/kv/internal/store_items.h"
#include "cxlrt/kv/store.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::kv {

using kv_internal::CheckItem;
using kv_internal::Copies;
using kv_internal::IntoBlock;
using kv_internal::kGpuCopyDeadline;
using kv_internal::OutOfBlock;
using kv_internal::PartsOf;
using kv_internal::Printable;
using kv_internal::TotalOf;

namespace {

absl::Status MixedParts(absl::string_view key) {
  return absl::InvalidArgumentError(absl::StrCat(
      "the parts of key '", Printable(key), "' are in both GPU and host memory; give one kind"));
}

}  // namespace

template <typename Item>
std::vector<runtime::MemoryKind> Store::Impl::ItemKinds(absl::Span<const Item> items,
                                                        std::optional<runtime::MemoryKind> told,
                                                        std::vector<absl::Status>* refused) {
  using runtime::MemoryKind;
  const bool gpu_usable = gpu::GpuAvailable();
  if (!gpu_usable && told != MemoryKind::kGpu) return {};  // every pointer is host memory
  std::vector<MemoryKind> kinds(items.size(), MemoryKind::kHost);
  refused->assign(items.size(), absl::OkStatus());
  bool gpu_path = false;
  for (size_t i = 0; i < items.size(); ++i) {
    const Item& it = items[i];
    auto part = [&](size_t j) -> const void* {
      if (!it.parts.empty()) return it.parts[j].data;
      if constexpr (std::is_same_v<Item, PutItem>) {
        return it.data;
      } else {
        return it.dst;
      }
    };
    const size_t n = it.parts.empty() ? 1 : it.parts.size();
    if (told.has_value()) {
      kinds[i] = *told;
      if (gpu_usable && gpu::KindOf(part(0)) != kinds[i]) {
        (*refused)[i] = absl::InvalidArgumentError(absl::StrCat(
            "key '", Printable(it.key), "' was said to be in ",
            kinds[i] == MemoryKind::kGpu ? "GPU" : "host", " memory, but its first part is not"));
      }
    } else if (gpu_usable) {
      kinds[i] = gpu::KindOf(part(0));
      for (size_t j = 1; j < n && (*refused)[i].ok(); ++j) {
        if (gpu::KindOf(part(j)) != kinds[i]) (*refused)[i] = MixedParts(it.key);
      }
    }
    gpu_path = gpu_path || kinds[i] == MemoryKind::kGpu || !(*refused)[i].ok();
  }
  if (!gpu_path) kinds.clear();
  return kinds;
}

// BatchPut and BatchGet (store_put.cc, store_get.cc) ask for the kinds.
template std::vector<runtime::MemoryKind> Store::Impl::ItemKinds<PutItem>(
    absl::Span<const PutItem>, std::optional<runtime::MemoryKind>, std::vector<absl::Status>*);
template std::vector<runtime::MemoryKind> Store::Impl::ItemKinds<GetItem>(
    absl::Span<const GetItem>, std::optional<runtime::MemoryKind>, std::vector<absl::Status>*);

absl::StatusOr<gpu::DmaEngine*> Store::Impl::Dma(void* stream) {
  if (!dma_) {
    CXLRT_ASSIGN_OR_RETURN(dma_, gpu::MakeDmaEngine(c_, pool_.backend().base(), pool_.size()));
  }
  CXLRT_RETURN_IF_ERROR(dma_->StartAfter(stream));
  return dma_.get();
}

namespace {

// GPU copies of a batch go out in groups of about this many bytes: one
// submission each (CopyBatch), a few in flight, so that the GPU's copy
// engine is busy while the CPU seals (or checks) the group before.
constexpr uint64_t kGroupBytes = 8 << 20;
constexpr size_t kGroupsInFlight = 3;

// A batch's GPU copies, in groups: Add queues an item's copy, a full
// group goes out as one CopyBatch, and `done(items, status)` runs for each
// group, in order, once its copies completed (or failed). Flush sends the
// last group and waits for all.
template <typename T>
class CopyGroups {
 public:
  using Done = std::function<void(const std::vector<T>&, const absl::Status&)>;
  CopyGroups(gpu::DmaEngine& engine, bool to_pool, Done done)
      : engine_(engine), to_pool_(to_pool), done_(std::move(done)) {}

  // An item and its copies (its value's parts), all in one group: the item
  // is done when they all are.
  void Add(T item, const Copies& c) {
    open_.items.push_back(std::move(item));
    for (size_t i = 0; i < c.dsts.size(); ++i) {
      open_.copies.Add(c.dsts[i], c.srcs[i], c.sizes[i]);
      open_.bytes += c.sizes[i];
    }
    if (open_.bytes >= kGroupBytes) Submit();
  }
  void Flush() {
    Submit();
    while (!flying_.empty()) FinishOne();
  }

 private:
  struct Group {
    std::vector<T> items;
    Copies copies;
    uint64_t bytes = 0;
    gpu::DmaEngine::Ticket ticket = 0;
  };
  void Submit() {
    if (open_.items.empty()) return;
    const Copies& c = open_.copies;
    open_.ticket =
        engine_.CopyBatch(to_pool_, c.dsts.data(), c.srcs.data(), c.sizes.data(), c.sizes.size());
    flying_.push_back(std::move(open_));
    open_ = {};
    if (flying_.size() >= kGroupsInFlight) FinishOne();
  }
  void FinishOne() {
    const absl::Status st = engine_.Wait(flying_.front().ticket, absl::Now() + kGpuCopyDeadline);
    std::atomic_thread_fence(std::memory_order_acquire);  // the seals after the bytes
    done_(flying_.front().items, st);
    flying_.pop_front();
  }

  gpu::DmaEngine& engine_;
  const bool to_pool_;
  const Done done_;
  Group open_;
  std::deque<Group> flying_;
};

}  // namespace

// Every item is reserved, its copy submitted with its group's, and sealed
// once its group's copies completed; the GPU's copy engine never waits for
// the protocol. Items in host memory are put by the CPU as in BatchPut.
std::vector<absl::Status> Store::Impl::GpuBatchPut(uint32_t ns, absl::string_view ns_name,
                                                   absl::Span<const PutItem> items,
                                                   const std::vector<runtime::MemoryKind>& kinds,
                                                   const std::vector<absl::Status>& refused,
                                                   void* stream) {
  std::vector<absl::Status> out(items.size());
  std::lock_guard<std::mutex> lock(gpu_mu_);
  auto dev = Dma(stream);
  struct Pending {
    size_t item;
    Reserved r;
    size_t size;
  };
  std::optional<CopyGroups<Pending>> g;
  if (dev.ok()) {
    g.emplace(**dev, /*to_pool=*/true,
              [&](const std::vector<Pending>& done, const absl::Status& st) {
                for (const Pending& p : done) {
                  if (!st.ok()) {
                    Abandon(p.r);
                    out[p.item] =
                        absl::Status(st.code(), absl::StrCat("copying the value of key '",
                                                             Printable(items[p.item].key),
                                                             "' from GPU memory: ", st.message()));
                  } else {
                    out[p.item] = Seal(ns, items[p.item].key, p.r, p.size);
                  }
                }
              });
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const PutItem& it = items[i];
    if (absl::Status st = CheckItem(it); !st.ok()) {
      out[i] = st;
      continue;
    }
    if (!refused.empty() && !refused[i].ok()) {
      out[i] = refused[i];
      continue;
    }
    PutPart one;
    const absl::Span<const PutPart> parts = PartsOf(it, &one);
    if (kinds[i] != runtime::MemoryKind::kGpu) {
      out[i] = PutOne(ns, ns_name, it.key, parts);
      continue;
    }
    if (!dev.ok()) {
      out[i] = dev.status();
      continue;
    }
    const size_t size = TotalOf(parts);
    auto r = Reserve(ns, ns_name, it.key, size);
    if (!r.ok()) {
      out[i] = r.status();
      continue;
    }
    g->Add({i, *r, size}, IntoBlock(pool_.backend().base() + r->block, parts));
  }
  if (g) g->Flush();
  return out;
}

// Every item is found and its copy submitted with its group's; once the
// group's copies are done, each item's seal is checked again. An item
// whose entry changed meanwhile (evicted, its block reused), a miss, or an
// entry being evicted is read on its own, as Get does.
std::vector<absl::StatusOr<size_t>> Store::Impl::GpuBatchGet(
    uint32_t ns, absl::Span<const GetItem> items, const std::vector<runtime::MemoryKind>& kinds,
    const std::vector<absl::Status>& refused, void* stream) {
  std::vector<absl::StatusOr<size_t>> out(items.size(), absl::UnknownError("not run"));
  std::lock_guard<std::mutex> lock(gpu_mu_);
  auto dev = Dma(stream);
  struct Pending {
    size_t item;
    uint32_t partition, index;
    uint64_t gen, size;
  };
  std::vector<size_t> again;  // items read on their own
  std::optional<CopyGroups<Pending>> g;
  if (dev.ok()) {
    g.emplace(**dev, /*to_pool=*/false,
              [&](const std::vector<Pending>& done, const absl::Status& st) {
                for (const Pending& p : done) {
                  if (!st.ok()) {
                    out[p.item] =
                        absl::Status(st.code(), absl::StrCat("copying the value of key '",
                                                             Printable(items[p.item].key),
                                                             "' to GPU memory: ", st.message()));
                  } else if (!SealIs(p.partition, p.index, p.gen)) {
                    again.push_back(p.item);
                  } else {
                    CountHit(ns, p.partition, p.index, p.gen, p.size);
                    out[p.item] = static_cast<size_t>(p.size);
                  }
                }
              });
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const GetItem& it = items[i];
    if (absl::Status st = CheckItem(it); !st.ok()) {
      out[i] = st;
      continue;
    }
    if (!refused.empty() && !refused[i].ok()) {
      out[i] = refused[i];
      continue;
    }
    GetPart one;
    const absl::Span<const GetPart> parts = PartsOf(it, &one);
    const bool exact = !it.parts.empty();
    if (kinds[i] != runtime::MemoryKind::kGpu) {
      out[i] = GetOne(ns, it.key, parts, exact);
      continue;
    }
    if (!dev.ok()) {
      out[i] = dev.status();
      continue;
    }
    const size_t capacity = TotalOf(parts);
    bool evicting = false;
    auto found = SearchAll(ns, it.key, KeyHash(ns, it.key), &evicting);
    if (!found.ok() || !*found || evicting || (*found)->e.value_size > capacity ||
        (exact && (*found)->e.value_size != capacity)) {
      again.push_back(i);  // GetOne says why, or waits out the eviction
      continue;
    }
    const EntryLayout& e = (*found)->e;
    // A DMA read returns this host's cached copy of a line when it has
    // one: drop the lines first, as CopyFromPool does.
    c_.Invalidate(e.block, e.value_size);
    g->Add({i, (*found)->partition, (*found)->index, e.gen, e.value_size},
           OutOfBlock(pool_.backend().base() + e.block, e.value_size, parts));
  }
  if (g) g->Flush();
  for (size_t i : again) {
    GetPart one;
    out[i] = GetOne(ns, items[i].key, PartsOf(items[i], &one), !items[i].parts.empty(), *dev);
  }
  return out;
}

}  // namespace cxlrt::kv
