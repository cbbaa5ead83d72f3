// Namespaces: the ids that entries and counters carry, registered in the
// store's table under the pool lock, and their quotas.
#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "cxlrt/kv/internal/store_impl.h"
#include "cxlrt/kv/internal/store_items.h"
#include "cxlrt/kv/store.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::kv {

using kv_internal::CheckName;
using kv_internal::Printable;

absl::Status Store::Impl::RefreshNamespaces() {
  const uint32_t n = view_->h().max_namespaces;
  ns_names_.resize(n);
  for (uint32_t id = 0; id < n; ++id) {
    if (!ns_names_[id].empty()) continue;  // names never change
    CXLRT_ASSIGN_OR_RETURN(auto rec, view_->ReadNamespace(id));
    if (!rec) continue;
    ns_names_[id].assign(reinterpret_cast<const char*>(rec->name), rec->name_len);
    ns_ids_[ns_names_[id]] = id;
    NoteNamespace(id);
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> Store::Impl::NamespaceId(absl::string_view ns, bool create) {
  CXLRT_RETURN_IF_ERROR(CheckName("namespace", ns, kMaxNamespaceBytes));
  std::lock_guard<std::mutex> lock(ns_mu_);
  auto it = ns_ids_.find(ns);
  if (it != ns_ids_.end()) return it->second;
  CXLRT_RETURN_IF_ERROR(RefreshNamespaces());
  it = ns_ids_.find(ns);
  if (it != ns_ids_.end()) return it->second;
  if (!create) {
    return absl::NotFoundError(absl::StrCat("namespace '", Printable(ns), "' has no entries"));
  }
  CXLRT_RETURN_IF_ERROR(membership_.WithPoolLock([&]() -> absl::Status {
    CXLRT_RETURN_IF_ERROR(RefreshNamespaces());
    if (ns_ids_.contains(ns)) return absl::OkStatus();  // another host made it
    for (uint32_t id = 0; id < ns_names_.size(); ++id) {
      if (!ns_names_[id].empty()) continue;
      NamespaceLayout rec = {};
      rec.used = 1;
      rec.name_len = static_cast<uint16_t>(ns.size());
      std::memcpy(rec.name, ns.data(), ns.size());
      rec.checksum = kv_internal::NamespaceChecksum(rec);
      c_.PublishObject(view_->NsOff(id), rec);
      ns_names_[id] = std::string(ns);
      ns_ids_[ns_names_[id]] = id;
      NoteNamespace(id);
      return absl::OkStatus();
    }
    return absl::ResourceExhaustedError(absl::StrCat("the KV store has all ", ns_names_.size(),
                                                     " namespaces in use; '", Printable(ns),
                                                     "' cannot be added"));
  }));
  return ns_ids_.find(ns)->second;
}

uint64_t Store::Impl::QuotaOf(uint32_t ns) {
  // One aligned 8-byte field: read alone, it cannot be torn (the record's
  // CRC was checked when the namespace was first read).
  uint64_t quota = 0;
  c_.Fetch(&quota, view_->NsOff(ns) + offsetof(NamespaceLayout, quota), 8);
  return quota;
}

absl::Status Store::Impl::SetQuota(absl::string_view ns, uint64_t bytes) {
  CXLRT_ASSIGN_OR_RETURN(uint32_t id, NamespaceId(ns, true));
  return membership_.WithPoolLock([&]() -> absl::Status {
    CXLRT_ASSIGN_OR_RETURN(auto rec, view_->ReadNamespace(id));
    if (!rec) return absl::DataLossError("a registered namespace record is gone");
    rec->quota = bytes;
    rec->checksum = kv_internal::NamespaceChecksum(*rec);
    c_.PublishObject(view_->NsOff(id), *rec);
    return absl::OkStatus();
  });
}

uint64_t Store::Impl::NsBytesElsewhere(uint32_t ns) {
  uint64_t total = 0;
  const uint32_t seen = partitions_seen_.load(std::memory_order_relaxed);
  for (uint32_t p = 0; p < std::max(seen, me_ + 1); ++p) {
    if (p != me_) total += view_->ReadCounters(p, ns).bytes;
  }
  return total;
}

}  // namespace cxlrt::kv
