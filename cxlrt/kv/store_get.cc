// Get: find the entry, copy the value out, then check that its seal still
// names the same put (a get that raced an eviction retries or reports
// kNotFound, never returns other bytes); batches of host memory; value
// sizes.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cxlrt/kv/internal/store_impl.h"
#include "cxlrt/kv/internal/store_items.h"
#include "cxlrt/kv/store.h"
#include "cxlrt/runtime/status_macros.h"
#include "cxlrt/runtime/wait.h"

namespace cxlrt::kv {

using kv_internal::CheckItem;
using kv_internal::CheckName;
using kv_internal::Copies;
using kv_internal::kGpuCopyDeadline;
using kv_internal::OutOfBlock;
using kv_internal::PartsOf;
using kv_internal::Printable;
using kv_internal::TotalOf;

absl::StatusOr<size_t> Store::Impl::Get(absl::string_view ns, absl::string_view key, void* dst,
                                        size_t capacity) {
  const runtime::SampledTimer timer;
  CXLRT_RETURN_IF_ERROR(CheckName("key", key, kMaxKeyBytes));
  auto id = NamespaceId(ns, false);
  if (!id.ok()) return id.status();
  if (gpu::KindOf(dst) == runtime::MemoryKind::kGpu) {
    auto got =
        GpuBatchGet(*id, {GetItem{key, dst, capacity, {}}}, {runtime::MemoryKind::kGpu}, {})[0];
    if (NsMetrics* m = MetricsOf(*id)) timer.Record(m->get_ns);
    return got;
  }
  const GetPart part{dst, capacity};
  // Initialised, not assigned: a default StatusOr costs an out-of-line
  // Status constructor, a tenth of this call's overhead budget.
  absl::StatusOr<size_t> got = GetOne(*id, key, {&part, 1}, /*exact=*/false);
  if (timer.sampled()) {
    if (NsMetrics* m = MetricsOf(*id)) timer.Record(m->get_ns);
  }
  return got;
}

std::vector<absl::StatusOr<size_t>> Store::Impl::BatchGet(absl::string_view ns,
                                                          absl::Span<const GetItem> items,
                                                          const BatchOptions& options) {
  const runtime::SampledTimer timer;
  std::vector<absl::StatusOr<size_t>> out(items.size(), absl::UnknownError("not run"));
  auto id = NamespaceId(ns, false);
  NsMetrics* m = id.ok() ? MetricsOf(*id) : nullptr;
  std::vector<absl::Status> refused;
  if (auto kinds = ItemKinds(items, options.memory, &refused); id.ok() && !kinds.empty()) {
    out = GpuBatchGet(*id, items, kinds, refused, options.stream);
    if (m != nullptr) timer.Record(m->get_ns);
    return out;
  }
  uint64_t bytes = 0;
  for (const GetItem& it : items) {
    bytes += it.capacity;
    for (const GetPart& p : it.parts) bytes += p.size;
  }
  ForEachItem(items.size(), bytes, [&](size_t i) {
    const GetItem& it = items[i];
    if (!id.ok()) {
      out[i] = id.status();
      return;
    }
    absl::Status st = CheckItem(it);
    GetPart one;
    out[i] = st.ok() ? GetOne(*id, it.key, PartsOf(it, &one), !it.parts.empty())
                     : absl::StatusOr<size_t>(st);
  });
  if (m != nullptr) timer.Record(m->get_ns);
  return out;
}

absl::StatusOr<size_t> Store::Impl::GetOne(uint32_t ns, absl::string_view key,
                                           absl::Span<const GetPart> parts, bool exact,
                                           gpu::DmaEngine* dev) {
  const size_t capacity = TotalOf(parts);
  const uint64_t hash = KeyHash(ns, key);
  // A get that races an eviction sees the seal change and looks again; a
  // key evicted for good is then not found.
  int waits = 0;  // evictions waited out (each one put the entry back)
  for (int attempt = 0; attempt < 4; ++attempt) {
    bool evicting = false;
    CXLRT_ASSIGN_OR_RETURN(auto found, SearchAll(ns, key, hash, &evicting));
    if (!found) break;
    const EntryLayout& e = found->e;
    if (evicting) {
      // Its owner is evicting it, and puts it back if a reader has it
      // pinned (this host may be that reader). Either happens within
      // microseconds; wait for it, within a deadline (an owner that dies
      // meanwhile leaves the entry unsealed: not found).
      const PoolOffset head = view_->EntryOff(found->partition, found->index);
      uint64_t line[2];
      absl::Status waited = runtime::WaitUntil(
          [&] {
            c_.Fetch(line, head, sizeof(line));  // seal, state
            return line[0] == e.gen || line[1] != static_cast<uint64_t>(EntryState::kEvicting);
          },
          absl::Now() + absl::Milliseconds(50), "a KV entry being evicted", nullptr,
          absl::Milliseconds(50));
      if (!waited.ok() || line[0] != e.gen) break;
      if (++waits < 16) --attempt;  // put back: read it again
      continue;
    }
    if (exact && e.value_size != capacity) {
      return absl::InvalidArgumentError(absl::StrCat("the value of key '", Printable(key), "' is ",
                                                     e.value_size, " bytes; its ", parts.size(),
                                                     " parts hold ", capacity));
    }
    if (e.value_size > capacity) {
      return absl::InvalidArgumentError(absl::StrCat("the value of key '", Printable(key), "' is ",
                                                     e.value_size, " bytes; the destination holds ",
                                                     capacity));
    }
    const uint8_t* base = pool_.backend().base();
    const Copies c = OutOfBlock(base + e.block, e.value_size, parts);
    if (dev) {
      // A DMA read returns this host's cached copy of a line when it has
      // one: drop the lines first, as CopyFromPool does.
      c_.Invalidate(e.block, e.value_size);
      const auto t = dev->CopyBatch(/*to_pool=*/false, c.dsts.data(), c.srcs.data(), c.sizes.data(),
                                    c.dsts.size());
      CXLRT_RETURN_IF_ERROR(dev->Wait(t, absl::Now() + kGpuCopyDeadline));
    } else {
      for (size_t i = 0; i < c.dsts.size(); ++i) {
        c_.CopyFromPoolStreaming(c.dsts[i], static_cast<const uint8_t*>(c.srcs[i]) - base,
                                 c.sizes[i]);
      }
    }
    // Loads of the value before the seal's: x86 keeps loads in order; the
    // fence keeps the compiler from moving them.
    std::atomic_thread_fence(std::memory_order_acquire);
    if (!SealIs(found->partition, found->index, e.gen)) continue;  // evicted meanwhile
    CountHit(ns, found->partition, found->index, e.gen, e.value_size);
    return static_cast<size_t>(e.value_size);
  }
  Count(misses_.get(), ns);
  return absl::NotFoundError(absl::StrCat("key '", Printable(key), "' is not in the store"));
}

absl::StatusOr<uint64_t> Store::Impl::ValueSize(absl::string_view ns, absl::string_view key) {
  CXLRT_RETURN_IF_ERROR(CheckName("key", key, kMaxKeyBytes));
  CXLRT_ASSIGN_OR_RETURN(uint32_t id, NamespaceId(ns, false));
  CXLRT_ASSIGN_OR_RETURN(auto found, SearchAll(id, key, KeyHash(id, key)));
  if (!found)
    return absl::NotFoundError(absl::StrCat("key '", Printable(key), "' is not in the store"));
  return found->e.value_size;
}

absl::StatusOr<bool> Store::Impl::Contains(absl::string_view ns, absl::string_view key) {
  auto size = ValueSize(ns, key);
  if (size.ok()) return true;
  if (size.status().code() == absl::StatusCode::kNotFound) return false;
  return size.status();
}

}  // namespace cxlrt::kv
