// `cxlrt pool ...`: create, info, check, destroy, attach, fence.
#include <unistd.h>

#include <cstdio>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/allocator/size_classes.h"
#include "cxlrt/kv/store.h"
#include "cxlrt/runtime/membership.h"
#include "cxlrt/runtime/pool.h"
#include "cxlrt/runtime/units.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"

namespace cxlrt::tools {
namespace {

using nlohmann::json;
using runtime::FormatBytes;
using runtime::HostRecord;
using runtime::Pool;
using runtime::SlotState;

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "cxlrt: %s\n", std::string(s.message()).c_str());
  return 1;
}

const char* StateName(SlotState s) {
  switch (s) {
    case SlotState::kFree:
      return "free";
    case SlotState::kAttached:
      return "attached";
    case SlotState::kFenced:
      return "fenced";
  }
  return "?";
}

std::string Hex(uint64_t v) { return absl::StrFormat("0x%x", v); }

struct HostSample {
  HostRecord record;
  bool beating = false;  // heartbeat moved during the sample
};

// Reads every used slot twice, three heartbeat periods (at least 250 ms) apart, to tell hosts
// whose heartbeat moves from hosts that stopped.
std::vector<HostSample> SampleHosts(const Pool& pool) {
  std::map<uint32_t, HostRecord> first;
  uint32_t longest_ms = 0;
  for (uint32_t i = 0; i < pool.host_slots(); ++i) {
    auto r = pool.ReadHost(i);
    if (r.ok() && r->state != SlotState::kFree) {
      first[i] = *r;
      if (r->owner_current) longest_ms = std::max(longest_ms, r->heartbeat_ms);
    }
  }
  bool any_attached = false;
  for (auto& [i, r] : first) any_attached |= r.state == SlotState::kAttached;
  if (any_attached)
    absl::SleepFor(absl::Milliseconds(
        std::max(3 * std::min(longest_ms, runtime::kMaxSampledHeartbeatMs), 250u)));
  std::vector<HostSample> out;
  for (auto& [i, before] : first) {
    auto r = pool.ReadHost(i);
    HostSample s;
    s.record = r.ok() ? *r : before;
    s.beating =
        r.ok() && r->owner_current && r->epoch == before.epoch && r->heartbeat != before.heartbeat;
    out.push_back(s);
  }
  return out;
}

json HostJson(const HostSample& s) {
  const HostRecord& r = s.record;
  json j = {{"slot", r.slot},
            {"state", StateName(r.state)},
            {"epoch", r.epoch},
            {"changed_by", r.changed_by},
            {"owner_current", r.owner_current}};
  if (r.owner_current) {
    j["pid"] = r.pid;
    j["hostname"] = r.hostname;
    j["heartbeat"] = r.heartbeat;
    j["lease_ms"] = r.lease_ms;
    j["heartbeat_ms"] = r.heartbeat_ms;
    j["attached_at"] = absl::FormatTime(absl::FromUnixNanos(r.attach_unix_ns));
  }
  j["heartbeat_moving"] = s.beating;
  return j;
}

}  // namespace

json AllocatorJson(const allocator::AllocatorStats& st) {
  json a = {
      {"heap_bytes", st.heap_bytes},           {"segments", st.segment_count},
      {"metadata_segments", st.meta_segments}, {"free_segments", st.free_segments},
      {"free_bytes", st.free_bytes},           {"largest_free_extent", st.largest_free_extent},
      {"fragmentation", st.fragmentation}};
  a["hosts"] = json::array();
  for (const allocator::HostStats& h : st.hosts) {
    json classes = json::array();
    for (uint32_t c = 0; c < allocator::kNumClasses; ++c) {
      const auto& k = h.classes[c];
      if (k.allocated == 0) continue;
      classes.push_back({{"size", allocator::kClassSizes[c]},
                         {"allocated", k.allocated},
                         {"in_use", k.handed_out},
                         {"durable", k.durable}});
    }
    a["hosts"].push_back({{"slot", h.slot},
                          {"owned", h.owner_epoch != 0},
                          {"segments", h.segments},
                          {"bytes_in_use", h.bytes_in_use},
                          {"bytes_cached", h.bytes_cached},
                          {"durable_bytes", h.durable_bytes},
                          {"pages", h.pages_allocated},
                          {"huge_segments", h.huge_segments},
                          {"rejected_frees", h.rejected_frees},
                          {"classes", classes}});
  }
  return a;
}

void PrintAllocator(const allocator::AllocatorStats& st) {
  std::printf(
      "  allocator   %u segments of 2 MiB (%u metadata, %u free); free %s, largest free "
      "run %s, fragmentation %.2f\n",
      st.segment_count, st.meta_segments, st.free_segments, FormatBytes(st.free_bytes).c_str(),
      FormatBytes(st.largest_free_extent).c_str(), st.fragmentation);
  for (const allocator::HostStats& h : st.hosts) {
    std::printf(
        "    host %-3u %s %llu segments, in use %s, cached %s, durable %s%s\n", h.slot,
        h.owner_epoch ? "owned, " : "unowned,", static_cast<unsigned long long>(h.segments),
        FormatBytes(h.bytes_in_use).c_str(), FormatBytes(h.bytes_cached).c_str(),
        FormatBytes(h.durable_bytes).c_str(),
        h.rejected_frees ? absl::StrCat(", ", h.rejected_frees, " frees refused").c_str() : "");
    std::string classes;
    for (uint32_t c = 0; c < allocator::kNumClasses; ++c) {
      if (h.classes[c].handed_out == 0) continue;
      absl::StrAppend(&classes, classes.empty() ? "" : ", ", h.classes[c].handed_out, " x ",
                      FormatBytes(allocator::kClassSizes[c]));
    }
    if (!classes.empty()) std::printf("             blocks in use: %s\n", classes.c_str());
  }
}

int PoolCreate(const std::string& uri) {
  auto pool = Pool::Create(uri);
  if (!pool.ok()) return Fail(pool.status());
  const auto& info = (*pool)->backend().info();
  std::printf("created %s: %s, coherence %s, %u host slots, at %s (%s)\n", (*pool)->name().c_str(),
              FormatBytes((*pool)->size()).c_str(),
              std::string(runtime::CoherenceDomainName((*pool)->domain())).c_str(),
              (*pool)->host_slots(), info.path.c_str(), info.placement.c_str());
  return 0;
}

int PoolInfo(const std::string& uri, bool as_json) {
  auto opened = Pool::Open(uri);
  if (!opened.ok()) return Fail(opened.status());
  const Pool& pool = **opened;
  const auto& h = pool.header();
  const auto& b = pool.backend().info();
  auto regions = pool.ListRegions();
  if (!regions.ok()) return Fail(regions.status());
  std::vector<HostSample> hosts = SampleHosts(pool);

  if (as_json) {
    json j;
    j["uri"] = pool.name();
    j["size"] = pool.size();
    j["coherence"] = std::string(runtime::CoherenceDomainName(pool.domain()));
    j["backend"] = {{"kind", b.kind},
                    {"path", b.path},
                    {"numa_node", b.numa_node},
                    {"placement", b.placement},
                    {"huge_pages", b.huge_pages},
                    {"alignment", b.alignment},
                    {"granularity", b.granularity}};
    j["format"] = {{"version", h.format_version},
                   {"creation_id", Hex(h.creation_id)},
                   {"created_at", absl::FormatTime(absl::FromUnixNanos(h.created_unix_ns))},
                   {"host_table_offset", h.host_table_offset},
                   {"host_slots", h.host_slot_count},
                   {"host_slot_size", h.host_slot_size},
                   {"directory_offset", h.directory_offset},
                   {"directory_entries", h.directory_entry_count},
                   {"directory_entry_size", h.directory_entry_size},
                   {"heap_offset", h.heap_offset},
                   {"heap_size", h.heap_size}};
    j["hosts"] = json::array();
    for (const auto& s : hosts) j["hosts"].push_back(HostJson(s));
    j["regions"] = json::array();
    for (const auto& r : *regions) {
      j["regions"].push_back({{"index", r.index},
                              {"name", r.name},
                              {"offset", r.offset},
                              {"size", r.size},
                              {"owner_host", r.owner_host},
                              {"generation", r.generation}});
    }
    if (allocator::HasAllocator(pool)) {
      auto st = allocator::ReadStats(pool);
      if (!st.ok()) return Fail(st.status());
      j["allocator"] = AllocatorJson(*st);
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }

  std::printf("pool %s\n", pool.name().c_str());
  std::printf("  backing     %s %s\n", b.kind.c_str(), b.path.c_str());
  std::printf("  placement   %s%s\n",
              b.numa_node >= 0 ? absl::StrCat("pages on node ", b.numa_node, "; ").c_str() : "",
              b.placement.c_str());
  std::printf("  size        %s (heap %s from offset %s)\n", FormatBytes(pool.size()).c_str(),
              FormatBytes(h.heap_size).c_str(), Hex(h.heap_offset).c_str());
  std::printf("  coherence   %s\n",
              std::string(runtime::CoherenceDomainName(pool.domain())).c_str());
  std::printf("  format      v%u, creation id %s, created %s\n", h.format_version,
              Hex(h.creation_id).c_str(),
              absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixNanos(h.created_unix_ns),
                               absl::UTCTimeZone())
                  .c_str());
  std::printf("  tables      host table at %s (%u slots x %u B), directory at %s (%u x %u B)\n",
              Hex(h.host_table_offset).c_str(), h.host_slot_count, h.host_slot_size,
              Hex(h.directory_offset).c_str(), h.directory_entry_count, h.directory_entry_size);
  int attached = 0, fenced = 0;
  for (const auto& s : hosts) (s.record.state == SlotState::kFenced ? fenced : attached)++;
  std::printf("  hosts       %d attached, %d fenced, %u free\n", attached, fenced,
              pool.host_slots() - attached - fenced);
  for (const auto& s : hosts) {
    const HostRecord& r = s.record;
    if (r.owner_current) {
      std::printf("    slot %-3u %-8s epoch %-4llu pid %-7u on %-12s heartbeat %-6llu %s\n", r.slot,
                  StateName(r.state), static_cast<unsigned long long>(r.epoch), r.pid,
                  r.hostname.c_str(), static_cast<unsigned long long>(r.heartbeat),
                  s.beating ? "(beating)" : "(heartbeat stopped: dead or stalled)");
    } else {
      std::printf("    slot %-3u %-8s epoch %-4llu (changed by slot %u; owner record stale)\n",
                  r.slot, StateName(r.state), static_cast<unsigned long long>(r.epoch),
                  r.changed_by);
    }
  }
  std::printf("  regions     %zu\n", regions->size());
  for (const auto& r : *regions) {
    std::printf("    %-32s at %s, %s, owner slot %u\n", r.name.c_str(), Hex(r.offset).c_str(),
                FormatBytes(r.size).c_str(), r.owner_host);
  }
  if (allocator::HasAllocator(pool)) {
    auto st = allocator::ReadStats(pool);
    if (!st.ok()) return Fail(st.status());
    PrintAllocator(*st);
  } else {
    std::printf("  allocator   none yet (made by the first host that opens one)\n");
  }
  return 0;
}

int PoolCheck(const std::string& uri, bool as_json) {
  std::vector<std::string> problems;
  absl::Status status;
  auto pool = Pool::Open(uri);
  if (pool.ok()) {
    status = (*pool)->Check(&problems);
    if (status.ok()) status = allocator::Audit(**pool, &problems);
    if (status.ok() && kv::HasStore(**pool)) status = kv::Audit(**pool, &problems);
  } else {
    status = pool.status();
    if (status.code() != absl::StatusCode::kDataLoss) return Fail(status);
    problems.emplace_back(status.message());
  }
  if (as_json) {
    json j = {{"uri", uri}, {"healthy", status.ok()}, {"problems", problems}};
    std::printf("%s\n", j.dump(2).c_str());
    return status.ok() ? 0 : 1;
  }
  if (status.ok()) {
    std::printf("%s: healthy (header, %u host slots, %u directory entries%s%s checked)\n",
                (*pool)->name().c_str(), (*pool)->host_slots(),
                (*pool)->header().directory_entry_count,
                allocator::HasAllocator(**pool) ? ", allocator metadata" : "",
                kv::HasStore(**pool) ? ", KV store" : "");
    return 0;
  }
  std::fprintf(stderr, "%s: %zu problem%s\n", uri.c_str(), problems.size(),
               problems.size() == 1 ? "" : "s");
  for (const auto& p : problems) std::fprintf(stderr, "  - %s\n", p.c_str());
  return 1;
}

int PoolDestroy(const std::string& uri, bool force) {
  if (absl::Status s = Pool::Destroy(uri, {.force = force}); !s.ok()) return Fail(s);
  std::printf("destroyed %s\n", uri.c_str());
  return 0;
}

int PoolAttach(const std::string& uri, int slot, double seconds, int interval_ms) {
  auto pool = Pool::Open(uri);
  if (!pool.ok()) return Fail(pool.status());
  runtime::AttachOptions options;
  if (slot >= 0) options.slot = static_cast<uint32_t>(slot);
  auto m = runtime::Membership::Attach(**pool, options);
  if (!m.ok()) return Fail(m.status());
  runtime::Membership& me = **m;
  std::printf("[slot %u] attached to %s at epoch %llu as pid %d\n", me.slot(),
              (*pool)->name().c_str(), static_cast<unsigned long long>(me.epoch()), getpid());
  std::fflush(stdout);
  const absl::Time end = absl::Now() + absl::Seconds(seconds);
  std::map<uint32_t, uint64_t> last_beat;
  while (absl::Now() < end) {
    absl::SleepFor(std::min(absl::Milliseconds(interval_ms), end - absl::Now()));
    if (me.fenced()) {
      std::printf("[slot %u] fenced by a survivor: leaving\n", me.slot());
      return 1;
    }
    auto hosts = me.Hosts();
    if (!hosts.ok()) return Fail(hosts.status());
    std::string line = absl::StrCat("[slot ", me.slot(), "] sees");
    int others = 0;
    for (const auto& v : *hosts) {
      if (v.liveness == runtime::Liveness::kSelf) continue;
      ++others;
      const uint64_t beat = v.record.heartbeat;
      const uint64_t moved = last_beat.count(v.record.slot) ? beat - last_beat[v.record.slot] : 0;
      last_beat[v.record.slot] = beat;
      absl::StrAppend(&line, " | slot ", v.record.slot, " ", runtime::LivenessName(v.liveness));
      if (v.record.owner_current) {
        absl::StrAppend(&line, " pid ", v.record.pid, " heartbeat ", beat, " (+", moved, ")");
      }
    }
    if (others == 0) {
      absl::StrAppend(&line, last_beat.empty() ? " no other host yet" : " no other host now");
    }
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
  }
  if (absl::Status s = me.Detach(); !s.ok()) return Fail(s);
  std::printf("[slot %u] detached\n", me.slot());
  return 0;
}

int PoolFence(const std::string& uri, int slot, bool force) {
  auto pool = Pool::Open(uri);
  if (!pool.ok()) return Fail(pool.status());
  auto m = runtime::Membership::Attach(**pool);
  if (!m.ok()) return Fail(m.status());
  // A fresh observer must watch for a whole lease and its margin before it
  // may call a host dead (runtime::DeadAfter).
  auto view = (*m)->Host(static_cast<uint32_t>(slot));
  if (!view.ok()) return Fail(view.status());
  if (!force && view->liveness == runtime::Liveness::kAlive) {
    absl::SleepFor(runtime::DeadAfter(view->lease) + absl::Milliseconds(100));
  }
  if (absl::Status s = (*m)->Fence(static_cast<uint32_t>(slot), force); !s.ok()) return Fail(s);
  std::printf("fenced host slot %d of %s\n", slot, (*pool)->name().c_str());
  return 0;
}

}  // namespace cxlrt::tools
