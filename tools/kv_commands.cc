// `cxlrt kv ...`: stats, ls (read the store without attaching), put, get
// (attach as a host), handoff (the demo: one emulated host puts a chain of
// KV blocks, the others look the chain up and get every block verified).
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bench/harness.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/collectives/communicator.h"
#include "cxlrt/kv/store.h"
#include "cxlrt/runtime/checksum.h"
#include "cxlrt/runtime/membership.h"
#include "cxlrt/runtime/pool.h"
#include "cxlrt/runtime/status_macros.h"
#include "cxlrt/runtime/units.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"

namespace cxlrt::tools {
namespace {

using nlohmann::json;
using runtime::FormatBytes;

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "cxlrt: %s\n", std::string(s.message()).c_str());
  return 1;
}

// This process as a host of the pool (attached as the environment says:
// CXLRT_HOST_ID under cxlrt run), with the store open.
struct KvHost {
  bench::AttachedHost attached;
  std::unique_ptr<kv::Store> store;
  uint32_t slot() const { return attached.membership->slot(); }
};

absl::StatusOr<KvHost> OpenKvHost(const std::string& uri, bool create) {
  KvHost h;
  CXLRT_ASSIGN_OR_RETURN(h.attached, bench::AttachHost(uri, {}));
  kv::StoreOptions so;
  so.create = create;
  CXLRT_ASSIGN_OR_RETURN(h.store, kv::Store::Open(*h.attached.alloc, so));
  return h;
}

// The demo's block i: bytes any host can regenerate to verify.
std::vector<uint8_t> DemoBlock(uint64_t i, size_t n) {
  std::vector<uint8_t> v(n);
  std::mt19937_64 rng(0x6b76ull * 1000003 + i);
  for (size_t k = 0; k < n; k += 8) {
    const uint64_t x = rng();
    std::memcpy(v.data() + k, &x, std::min<size_t>(8, n - k));
  }
  return v;
}

}  // namespace

int KvStats(const std::string& uri, bool as_json) {
  auto pool = runtime::Pool::Open(uri);
  if (!pool.ok()) return Fail(pool.status());
  auto stats = kv::ReadStats(**pool);
  if (!stats.ok()) return Fail(stats.status());
  if (as_json) {
    json j = {{"uri", uri},
              {"hosts", stats->hosts},
              {"entries_per_host", stats->entries_per_host},
              {"pins_per_host", stats->pins_per_host},
              {"live_entries", stats->live_entries},
              {"namespaces", json::array()}};
    for (const kv::NamespaceStats& n : stats->namespaces) {
      j["namespaces"].push_back({{"name", absl::CHexEscape(n.name)},
                                 {"quota", n.quota},
                                 {"entries", n.entries},
                                 {"bytes", n.bytes},
                                 {"hits", n.hits},
                                 {"misses", n.misses},
                                 {"evictions", n.evictions},
                                 {"puts", n.puts},
                                 {"put_exists", n.put_exists}});
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("KV store of %s: %u host partitions x %u entries, %u pins each; %lu entries\n",
              (*pool)->name().c_str(), stats->hosts, stats->entries_per_host, stats->pins_per_host,
              static_cast<unsigned long>(stats->live_entries));
  std::printf("%-32s %9s %10s %10s %10s %10s %6s %10s %9s %7s\n", "namespace", "entries", "bytes",
              "quota", "hits", "misses", "hit%", "evictions", "puts", "exists");
  for (const kv::NamespaceStats& n : stats->namespaces) {
    const uint64_t reads = n.hits + n.misses;
    std::printf("%-32s %9lu %10s %10s %10lu %10lu %6s %10lu %9lu %7lu\n",
                absl::CHexEscape(n.name).substr(0, 32).c_str(),
                static_cast<unsigned long>(n.entries), FormatBytes(n.bytes).c_str(),
                n.quota ? FormatBytes(n.quota).c_str() : "-", static_cast<unsigned long>(n.hits),
                static_cast<unsigned long>(n.misses),
                reads ? absl::StrFormat("%.1f", 100.0 * n.hits / reads).c_str() : "-",
                static_cast<unsigned long>(n.evictions), static_cast<unsigned long>(n.puts),
                static_cast<unsigned long>(n.put_exists));
  }
  return 0;
}

int KvList(const std::string& uri, const std::string& ns, bool as_json) {
  auto pool = runtime::Pool::Open(uri);
  if (!pool.ok()) return Fail(pool.status());
  auto entries = kv::ListEntries(**pool, ns.empty() ? std::nullopt : std::optional(ns));
  if (!entries.ok()) return Fail(entries.status());
  if (as_json) {
    json j = json::array();
    for (const kv::EntryInfo& e : *entries) {
      j.push_back({{"namespace", absl::CHexEscape(e.ns)},
                   {"key", absl::CHexEscape(e.key)},
                   {"size", e.value_size},
                   {"owner", e.owner},
                   {"slot", e.index},
                   {"gen", e.gen},
                   {"block", e.block}});
    }
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("%-20s %-40s %10s %5s %6s %14s\n", "namespace", "key", "size", "owner", "slot",
              "block");
  for (const kv::EntryInfo& e : *entries) {
    std::printf("%-20s %-40s %10s %5u %6u %14s\n", absl::CHexEscape(e.ns).substr(0, 20).c_str(),
                absl::CHexEscape(e.key).substr(0, 40).c_str(), FormatBytes(e.value_size).c_str(),
                e.owner, e.index, absl::StrFormat("0x%x", e.block).c_str());
  }
  std::printf("%zu entries\n", entries->size());
  return 0;
}

int KvPut(const std::string& uri, const std::string& ns, const std::string& key,
          const std::string& file) {
  std::vector<char> data;
  if (file == "-") {
    data.assign(std::istreambuf_iterator<char>(std::cin), {});
  } else {
    std::ifstream in(file, std::ios::binary);
    if (!in) return Fail(absl::NotFoundError(absl::StrCat("cannot read ", file)));
    data.assign(std::istreambuf_iterator<char>(in), {});
  }
  auto h = OpenKvHost(uri, /*create=*/true);
  if (!h.ok()) return Fail(h.status());
  if (absl::Status s = h->store->Put(ns, key, data.data(), data.size()); !s.ok()) return Fail(s);
  std::printf("put %s/%s: %zu bytes, crc32c 0x%08x, by host %u\n", absl::CHexEscape(ns).c_str(),
              absl::CHexEscape(key).c_str(), data.size(), runtime::Crc32c(data.data(), data.size()),
              h->slot());
  return 0;
}

int KvGet(const std::string& uri, const std::string& ns, const std::string& key,
          const std::string& out) {
  auto h = OpenKvHost(uri, /*create=*/false);
  if (!h.ok()) return Fail(h.status());
  auto size = h->store->ValueSize(ns, key);
  if (!size.ok()) {
    // A get of a missing key: Get says so (and counts the miss).
    if (size.status().code() == absl::StatusCode::kNotFound) {
      return Fail(h->store->Get(ns, key, nullptr, 0).status());
    }
    return Fail(size.status());
  }
  std::vector<char> data(*size);
  auto n = h->store->Get(ns, key, data.data(), data.size());
  if (!n.ok()) return Fail(n.status());
  data.resize(*n);
  if (out == "-") {
    std::fwrite(data.data(), 1, data.size(), stdout);
  } else {
    std::ofstream f(out, std::ios::binary);
    f.write(data.data(), static_cast<std::streamsize>(data.size()));
    if (!f) return Fail(absl::InternalError(absl::StrCat("cannot write ", out)));
    std::printf("got %s/%s: %zu bytes, crc32c 0x%08x, by host %u\n", absl::CHexEscape(ns).c_str(),
                absl::CHexEscape(key).c_str(), data.size(),
                runtime::Crc32c(data.data(), data.size()), h->slot());
  }
  return 0;
}

int KvHandoff(uint64_t block_bytes, int blocks, double timeout_s) {
  auto env = collectives::RankFromEnvironment();
  if (!env.ok()) return Fail(env.status());
  const std::string uri = runtime::DefaultPoolUri();
  auto h = OpenKvHost(uri, /*create=*/true);
  if (!h.ok()) return Fail(h.status());
  const std::string ns = "demo/llama-8b/bf16/tenant-0";
  std::vector<std::string> chain;
  for (int i = 0; i < blocks; ++i) chain.push_back(absl::StrCat("prefix-hash-", i));
  const uint32_t me = h->slot();
  if (env->rank == 0) {
    // The prefill host: computes the KV blocks of a prompt and puts them.
    for (int i = 0; i < blocks; ++i) {
      auto v = DemoBlock(i, block_bytes);
      absl::Status s = h->store->Put(ns, chain[i], v.data(), v.size());
      if (!s.ok() && s.code() != absl::StatusCode::kAlreadyExists) return Fail(s);
    }
    std::printf("host %u (prefill): put %d KV blocks of %s under %s\n", me, blocks,
                FormatBytes(block_bytes).c_str(), ns.c_str());
    return 0;
  }
  // A decode host: finds the longest cached prefix (pinned), gets each
  // block into its own buffer and checks every byte.
  const absl::Time deadline = absl::Now() + absl::Seconds(timeout_s);
  kv::PinSet pins;
  size_t found = 0;
  while (true) {
    auto n = h->store->Lookup(ns, chain, &pins);
    if (!n.ok()) return Fail(n.status());
    found = *n;
    if (found == chain.size() || absl::Now() > deadline) break;
    h->store->Release(pins);
    absl::SleepFor(absl::Milliseconds(5));
  }
  if (found != chain.size()) {
    return Fail(absl::DeadlineExceededError(absl::StrCat(
        "host ", me, " found ", found, " of ", blocks, " blocks within ", timeout_s, " s")));
  }
  std::vector<uint8_t> buf(block_bytes);
  for (int i = 0; i < blocks; ++i) {
    auto n = h->store->Get(ns, chain[i], buf.data(), buf.size());
    if (!n.ok()) return Fail(n.status());
    if (*n != block_bytes || buf != DemoBlock(i, block_bytes)) {
      return Fail(absl::DataLossError(absl::StrCat("block ", i, " has wrong bytes")));
    }
  }
  h->store->Release(pins);
  std::printf(
      "host %u (decode): Lookup found the whole %d-block prefix (pinned), got every block: "
      "%s, verified byte for byte\n",
      me, blocks, FormatBytes(block_bytes * blocks).c_str());
  return 0;
}

}  // namespace cxlrt::tools
