#include "cxlrt/kv/internal/store_view.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "cxlrt/runtime/checksum.h"
#include "cxlrt/runtime/status_macros.h"
#include "cxlrt/runtime/torn_read.h"

namespace cxlrt::kv_internal {

namespace {

constexpr int kTornRetries = 8;

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

template <typename T>
uint32_t ChecksumBefore(const T& v, size_t end) {
  return runtime::Crc32c(&v, end);
}

}  // namespace

uint32_t HeaderChecksum(const StoreHeaderLayout& h) {
  return ChecksumBefore(h, offsetof(StoreHeaderLayout, checksum));
}
uint32_t NamespaceChecksum(const NamespaceLayout& n) {
  return ChecksumBefore(n, offsetof(NamespaceLayout, checksum));
}
uint32_t EntryChecksum(const EntryLayout& e) {
  const auto* p = reinterpret_cast<const uint8_t*>(&e);
  const uint32_t crc = runtime::Crc32c(
      p + offsetof(EntryLayout, gen), offsetof(EntryLayout, checksum) - offsetof(EntryLayout, gen));
  return runtime::Crc32c(e.key, sizeof(e.key), crc);
}

absl::StatusOr<StoreHeaderLayout> PlanStore(kv::StoreOptions o, uint32_t pool_hosts) {
  auto bad = [](auto... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (o.hosts == 0) o.hosts = pool_hosts;
  if (o.hosts == 0 || o.hosts > pool_hosts) {
    return bad("a store for ", o.hosts, " hosts in a pool of ", pool_hosts, " host slots");
  }
  const uint32_t e = o.entries_per_host;
  if (e < 64 || e > (1u << 22) || (e & (e - 1)) != 0) {
    return bad("entries_per_host ", e, " is not a power of two in [64, 4M]");
  }
  if (o.pins_per_host == 0 || o.pins_per_host > 65536) {
    return bad("pins_per_host ", o.pins_per_host, " is not in [1, 65536]");
  }
  if (o.max_namespaces == 0 || o.max_namespaces > 4096) {
    return bad("max_namespaces ", o.max_namespaces, " is not in [1, 4096]");
  }
  StoreHeaderLayout h = {};
  h.magic = kv::kStoreMagic;
  h.version = kv::kStoreVersion;
  h.hosts = o.hosts;
  h.entries_per_host = e;
  h.pins_per_host = o.pins_per_host;
  h.max_namespaces = o.max_namespaces;
  h.probe_limit = std::min<uint32_t>(32, e);
  h.namespaces_offset = 4096;
  h.partitions_offset =
      AlignUp(h.namespaces_offset + uint64_t{o.max_namespaces} * sizeof(NamespaceLayout), 4096);
  h.counters_offset = 128;
  h.entries_offset =
      AlignUp(h.counters_offset + uint64_t{o.max_namespaces} * sizeof(NsCountersLayout), 128);
  h.pins_offset = h.entries_offset + uint64_t{e} * sizeof(EntryLayout);
  h.partition_stride =
      AlignUp(h.pins_offset + uint64_t{o.pins_per_host} * sizeof(kv::PinLayout), 4096);
  h.store_bytes = h.partitions_offset + uint64_t{o.hosts} * h.partition_stride;
  h.checksum = HeaderChecksum(h);
  return h;
}

absl::StatusOr<std::unique_ptr<StoreView>> StoreView::Open(const runtime::Pool& pool) {
  auto region = pool.FindRegion(kv::kStoreRegionName);
  if (!region.ok()) {
    if (region.status().code() == absl::StatusCode::kNotFound) {
      return absl::NotFoundError(
          absl::StrCat(pool.name(),
                       " has no KV store (open one with StoreOptions::create, or run "
                       "the demo)"));
    }
    return region.status();
  }
  const auto h = pool.coherence().FetchObject<StoreHeaderLayout>(region->offset);
  auto corrupt = [&](auto... what) {
    return absl::DataLossError(absl::StrCat("KV store header at 0x", absl::Hex(region->offset),
                                            " in ", pool.name(), ": ", what...));
  };
  if (h.magic == 0) return corrupt("not written (its creator died, or is still making it)");
  if (h.magic != kv::kStoreMagic) return corrupt("magic is 0x", absl::Hex(h.magic));
  if (h.checksum != HeaderChecksum(h)) return corrupt("checksum mismatch");
  if (h.version != kv::kStoreVersion) {
    return corrupt("version ", h.version, " (this build reads ", kv::kStoreVersion, ")");
  }
  // The geometry must be what PlanStore makes of it: every offset below is
  // then inside the block.
  kv::StoreOptions o;
  o.hosts = h.hosts;
  o.entries_per_host = h.entries_per_host;
  o.pins_per_host = h.pins_per_host;
  o.max_namespaces = h.max_namespaces;
  auto plan = PlanStore(o, pool.host_slots());
  if (!plan.ok()) return corrupt(plan.status().message());
  if (std::memcmp(&*plan, &h, sizeof(h)) != 0) return corrupt("tables laid out unexpectedly");
  if (h.store_bytes > region->size) {
    return corrupt("tables need ", h.store_bytes, " bytes but the block holds ", region->size);
  }
  return std::unique_ptr<StoreView>(new StoreView(pool, region->offset, h));
}

Slot StoreView::ReadEntry(uint32_t p, uint32_t i, EntryLayout* e) const {
  const PoolOffset off = EntryOff(p, i);
  for (int attempt = 0; attempt < kTornRetries; ++attempt) {
    c().Fetch(e, off, sizeof(*e));
    const auto state = static_cast<kv::EntryState>(e->state);
    if (state == kv::EntryState::kEmpty) return Slot::kEmpty;
    const bool evicting = state == kv::EntryState::kEvicting;
    if (!evicting && (state != kv::EntryState::kPut || e->seal != e->gen)) return Slot::kInvisible;
    if (e->gen == 0) return Slot::kInvisible;
    if (e->checksum != EntryChecksum(*e)) {
      if (evicting) return Slot::kInvisible;  // an interrupted put's slot, or torn
      continue;                               // being rewritten: read again
    }
    const uint64_t size = pool_.size();
    const uint64_t heap = pool_.header().heap_offset;
    if (e->key_len == 0 || e->key_len > kv::kMaxKeyBytes || e->ns >= h_.max_namespaces ||
        e->block < heap || e->block >= size || e->value_size > size ||
        kv::BlockBytes(e->value_size, e->key_len) > size - e->block) {
      return Slot::kCorrupt;
    }
    return evicting ? Slot::kEvicting : Slot::kVisible;
  }
  return Slot::kTorn;
}

absl::StatusOr<std::optional<NamespaceLayout>> StoreView::ReadNamespace(uint32_t id) const {
  NamespaceLayout n;
  const bool whole = runtime::RetryTornRead([&] {
    c().Fetch(&n, NsOff(id), sizeof(n));
    return n.used == 0 || (n.checksum == NamespaceChecksum(n) && n.name_len > 0 &&
                           n.name_len <= kv::kMaxNamespaceBytes);
  });
  if (whole) return n.used == 0 ? std::nullopt : std::optional<NamespaceLayout>(n);
  return absl::DataLossError(
      absl::StrCat("KV namespace record ", id, " at 0x", absl::Hex(NsOff(id)), " is corrupt"));
}

NsCountersLayout StoreView::ReadCounters(uint32_t p, uint32_t ns) const {
  return c().FetchObject<NsCountersLayout>(CounterOff(p, ns));
}

uint64_t StoreView::PartitionEpoch(uint32_t p) const {
  uint64_t epoch = 0;
  c().Fetch(&epoch, PartOff(p) + offsetof(kv::PartitionHeaderLayout, epoch), 8);
  return epoch;
}

absl::StatusOr<kv::StoreStats> StoreView::Stats() const {
  kv::StoreStats s;
  s.hosts = h_.hosts;
  s.entries_per_host = h_.entries_per_host;
  s.pins_per_host = h_.pins_per_host;
  s.max_namespaces = h_.max_namespaces;
  std::vector<uint32_t> used;
  for (uint32_t p = 0; p < h_.hosts; ++p) {
    if (PartitionEpoch(p) != 0) used.push_back(p);
  }
  for (uint32_t id = 0; id < h_.max_namespaces; ++id) {
    CXLRT_ASSIGN_OR_RETURN(auto n, ReadNamespace(id));
    if (!n) continue;
    kv::NamespaceStats ns;
    ns.name.assign(reinterpret_cast<const char*>(n->name), n->name_len);
    ns.quota = n->quota;
    for (uint32_t p : used) {
      const NsCountersLayout k = ReadCounters(p, id);
      ns.entries += k.entries;
      ns.bytes += k.bytes;
      ns.hits += k.hits;
      ns.misses += k.misses;
      ns.evictions += k.evictions;
      ns.puts += k.puts;
      ns.put_exists += k.put_exists;
    }
    s.live_entries += ns.entries;
    s.namespaces.push_back(std::move(ns));
  }
  return s;
}

absl::StatusOr<std::vector<kv::EntryInfo>> StoreView::List(
    const std::optional<std::string>& ns) const {
  std::vector<std::string> names(h_.max_namespaces);
  for (uint32_t id = 0; id < h_.max_namespaces; ++id) {
    CXLRT_ASSIGN_OR_RETURN(auto n, ReadNamespace(id));
    if (n) names[id].assign(reinterpret_cast<const char*>(n->name), n->name_len);
  }
  std::vector<kv::EntryInfo> out;
  for (uint32_t p = 0; p < h_.hosts; ++p) {
    if (PartitionEpoch(p) == 0) continue;
    for (uint32_t i = 0; i < h_.entries_per_host; ++i) {
      EntryLayout e;
      const Slot s = ReadEntry(p, i, &e);
      if (s == Slot::kCorrupt) {
        return absl::DataLossError(
            absl::StrCat("KV entry ", i, " of partition ", p, " names bytes outside the pool"));
      }
      if (s != Slot::kVisible) continue;
      if (ns && names[e.ns] != *ns) continue;
      kv::EntryInfo info;
      info.ns = names[e.ns];
      info.key.resize(e.key_len);
      const uint32_t inline_len = std::min<uint32_t>(e.key_len, kv::kInlineKeyBytes);
      std::memcpy(info.key.data(), e.key, inline_len);
      if (e.key_len > inline_len) {
        c().Fetch(info.key.data() + inline_len, e.block + e.value_size, e.key_len - inline_len);
      }
      info.value_size = e.value_size;
      info.owner = p;
      info.index = i;
      info.gen = e.gen;
      info.block = e.block;
      out.push_back(std::move(info));
    }
  }
  return out;
}

void StoreView::Audit(std::vector<std::string>* problems) const {
  auto problem = [&](auto... what) { problems->push_back(absl::StrCat(what...)); };
  std::vector<bool> ns_used(h_.max_namespaces);
  for (uint32_t id = 0; id < h_.max_namespaces; ++id) {
    auto n = ReadNamespace(id);
    if (!n.ok()) {
      problem(n.status().message());
    } else {
      ns_used[id] = n->has_value();
    }
  }
  std::map<PoolOffset, std::pair<uint32_t, uint32_t>> blocks;  // block -> (partition, index)
  for (uint32_t p = 0; p < h_.hosts; ++p) {
    if (PartitionEpoch(p) == 0) continue;
    std::vector<uint64_t> entries(h_.max_namespaces), bytes(h_.max_namespaces);
    for (uint32_t i = 0; i < h_.entries_per_host; ++i) {
      EntryLayout e;
      const Slot s = ReadEntry(p, i, &e);
      const std::string where = absl::StrCat("KV entry ", i, " of host ", p, ": ");
      if (s == Slot::kCorrupt) problem(where, "names bytes outside the pool");
      if (s == Slot::kTorn) problem(where, "checksum mismatch");
      if (s != Slot::kVisible) continue;
      if (!ns_used[e.ns]) problem(where, "namespace ", e.ns, " is not registered");
      auto [it, fresh] = blocks.emplace(e.block, std::make_pair(p, i));
      if (!fresh) {
        problem(where, "shares block 0x", absl::Hex(e.block), " with entry ", it->second.second,
                " of host ", it->second.first);
      }
      ++entries[e.ns];
      bytes[e.ns] += e.value_size;
    }
    // Counters are exact for a partition whose host is attached (it
    // publishes them with every change). A host that died may have had a
    // put finished by its arena's recovery: its counters are recomputed
    // when the slot reopens.
    auto rec = pool_.ReadHost(p);
    const bool owner_here =
        rec.ok() && rec->state == runtime::SlotState::kAttached && rec->epoch == PartitionEpoch(p);
    for (uint32_t id = 0; id < h_.max_namespaces && owner_here; ++id) {
      const NsCountersLayout k = ReadCounters(p, id);
      if (k.entries != entries[id] || k.bytes != bytes[id]) {
        problem("KV counters of host ", p, ", namespace ", id, ": ", k.entries, " entries / ",
                k.bytes, " bytes published, ", entries[id], " / ", bytes[id], " in its index");
      }
    }
    const auto ph = c().FetchObject<kv::PartitionHeaderLayout>(PartOff(p));
    if (ph.pins_high > h_.pins_per_host) {
      problem("KV pin table of host ", p, ": ", ph.pins_high, " records in use of ",
              h_.pins_per_host);
      continue;
    }
    for (uint32_t k = 0; k < ph.pins_high; ++k) {
      const auto pin = c().FetchObject<kv::PinLayout>(PinOff(p, k));
      if (pin.gen != 0 && (pin.partition >= h_.hosts || pin.index >= h_.entries_per_host)) {
        problem("KV pin ", k, " of host ", p, " names entry ", pin.index, " of host ",
                pin.partition, ", outside the index");
      }
    }
  }
}

}  // namespace cxlrt::kv_internal
