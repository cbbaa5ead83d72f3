#include "bench/kv_bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/gpu_timing.h"
#include "bench/harness.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/gpu/gpu.h"
#include "cxlrt/gpu/memory.h"
#include "cxlrt/kv/store.h"
#include "cxlrt/runtime/membership.h"
#include "cxlrt/runtime/status_macros.h"
#include "cxlrt/runtime/units.h"
#include "nlohmann/json.hpp"

namespace cxlrt::bench {
namespace {

using runtime::FormatBytes;

double NowS() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// One emulated host: its own mapping of the pool, membership, allocator, store.
struct Host {
  AttachedHost attached;
  std::unique_ptr<kv::Store> store;
};

absl::StatusOr<Host> OpenHost(const std::string& uri, uint32_t entries) {
  Host h;
  CXLRT_ASSIGN_OR_RETURN(h.attached, AttachHost(uri, AnySlot()));
  kv::StoreOptions so;
  so.create = true;
  so.hosts = 8;
  so.entries_per_host = entries;
  so.pins_per_host = 4096;
  CXLRT_ASSIGN_OR_RETURN(h.store, kv::Store::Open(*h.attached.alloc, so));
  return h;
}

struct Rates {
  double gbps = 0, ops = 0;
};

struct Row {
  uint64_t block = 0;
  std::string op;  // put, get
  Summary gbps, ops, batch_gbps, batch_ops;
};

constexpr char kNs[] = "bench/model/bf16";

std::string Key(uint64_t block, int rep, uint64_t i) {
  return absl::StrCat("b", block, "-r", rep, "-", i);
}

}  // namespace

int RunKvBench(const KvBenchOptions& o) {
  auto fail = [](const absl::Status& s) {
    std::fprintf(stderr, "cxlrt bench kv: %s\n", std::string(s.message()).c_str());
    return 1;
  };
  std::vector<uint64_t> blocks = o.blocks;
  if (blocks.empty()) blocks = {16 << 10, 256 << 10, 2 << 20};
  const uint64_t biggest = *std::max_element(blocks.begin(), blocks.end());
  const uint64_t ws = std::max(o.working_set, biggest * 8);
  uint64_t max_items = 0;
  for (uint64_t b : blocks) max_items = std::max(max_items, ws / b);
  uint32_t entries = 1024;
  while (entries < 2 * max_items + 256) entries *= 2;
  // Room for the working set twice over (the store, allocator rounding).
  const uint64_t pool_bytes = std::max<uint64_t>(
      1ull << 30, (2 * ws + (256ull << 20) + (2 << 20) - 1) / (2 << 20) * (2 << 20));
  const std::string uri =
      o.uri.empty() ? absl::StrCat("emu://bench-kv-", getpid(), "?hosts=8") : o.uri;
  auto scratch = ScratchPool::Create(uri, pool_bytes);
  if (!scratch.ok()) return fail(scratch.status());
  const int hosts = std::max(1, o.hosts);
  std::vector<Host> h;
  for (int i = 0; i < hosts; ++i) {
    auto host = OpenHost((*scratch)->open_uri(), entries);
    if (!host.ok()) return fail(host.status());
    h.push_back(std::move(*host));
  }
  Host& writer = h[0];
  const int readers = hosts > 1 ? hosts - 1 : 1;
  auto reader = [&](int r) -> Host& { return hosts > 1 ? h[1 + r] : h[0]; };

  const Summary memcpy_bw = MeasureMemcpy(64 << 20, 7);
  // Caller buffers: distinct sources for puts and destinations for gets,
  // as large as the working set and pre-faulted (a decode host gets blocks
  // into distinct KV pages; so does memcpy's reference copy).
  std::unique_ptr<uint8_t[]> src(new uint8_t[ws]);
  Prefault(src.get(), ws);
  for (uint64_t i = 0; i < ws; i += 8) {
    const uint64_t x = i * 0x9e3779b97f4a7c15ull;
    std::memcpy(src.get() + i, &x, std::min<uint64_t>(8, ws - i));
  }
  std::vector<std::unique_ptr<uint8_t[]>> dst(readers);
  for (auto& d : dst) {
    d.reset(new uint8_t[ws]);
    Prefault(d.get(), ws);
  }

  // --device: values are put from GPU memory and got into GPU memory (the
  // CUDA engine); src and dst above are their host images. The reference
  // is pinned cudaMemcpy at 64 MiB, each direction.
  uint8_t* dsrc = nullptr;
  std::vector<uint8_t*> ddst(readers, nullptr);
  double pinned_h2d = 0, pinned_d2h = 0;
  if (o.device) {
    auto a = gpu::GpuAlloc(ws);
    if (!a.ok()) return fail(a.status());
    dsrc = static_cast<uint8_t*>(*a);
    if (absl::Status st = gpu::CopySync(dsrc, src.get(), ws); !st.ok()) return fail(st);
    for (auto& d : ddst) {
      auto b = gpu::GpuAlloc(ws);
      if (!b.ok()) return fail(b.status());
      d = static_cast<uint8_t*>(*b);
    }
    const size_t ref = std::min<uint64_t>(ws, 64 << 20);
    auto pin = gpu::PageLockedAlloc(ref);
    if (!pin.ok()) return fail(pin.status());
    std::memset(*pin, 1, ref);
    auto h2d = TimeCopies(ddst[0], *pin, ref, 10);
    auto d2h = TimeCopies(*pin, dsrc, ref, 10);
    if (h2d.ok() && *h2d > 0) pinned_h2d = ref / *h2d / 1e9;
    if (d2h.ok() && *d2h > 0) pinned_d2h = ref / *d2h / 1e9;
    gpu::PageLockedFree(*pin);
  }
  uint8_t* put_src = o.device ? dsrc : src.get();

  std::vector<Row> rows;
  uint64_t wrong = 0;
  for (uint64_t b : blocks) {
    const uint64_t n = ws / b;
    std::vector<double> put_g, put_o, get_g, get_o, bput_g, bput_o, bget_g, bget_o;
    // Rep 0 warms up (faults the pool's pages in every mapping).
    for (int rep = 0; rep <= o.reps; ++rep) {
      for (int batched = 0; batched < 2; ++batched) {
        const int tag = rep * 2 + batched;
        std::vector<std::string> keys(n);
        for (uint64_t i = 0; i < n; ++i) keys[i] = Key(b, tag, i);
        // Put, by the writer.
        double t0 = NowS();
        if (!batched) {
          for (uint64_t i = 0; i < n; ++i) {
            absl::Status s = writer.store->Put(kNs, keys[i], put_src + i * b, b);
            if (!s.ok()) return fail(s);
          }
        } else {
          std::vector<kv::PutItem> items;
          for (uint64_t i = 0; i < n; i += o.batch) {
            items.clear();
            for (uint64_t k = i; k < std::min<uint64_t>(n, i + o.batch); ++k) {
              items.push_back({keys[k], put_src + k * b, b, {}});
            }
            for (const absl::Status& s : writer.store->BatchPut(kNs, items)) {
              if (!s.ok()) return fail(s);
            }
          }
        }
        const double put_s = NowS() - t0;
        // Get, by every reader at once.
        std::vector<double> took(readers);
        std::vector<absl::Status> errs(readers);
        auto read_all = [&](int r) {
          Host& me = reader(r);
          uint8_t* d = o.device ? ddst[r] : dst[r].get();
          const double s0 = NowS();
          if (!batched) {
            for (uint64_t i = 0; i < n && errs[r].ok(); ++i) {
              auto got = me.store->Get(kNs, keys[i], d + i * b, b);
              if (!got.ok()) errs[r] = got.status();
            }
          } else {
            std::vector<kv::GetItem> items;
            for (uint64_t i = 0; i < n && errs[r].ok(); i += o.batch) {
              items.clear();
              for (uint64_t k = i; k < std::min<uint64_t>(n, i + o.batch); ++k) {
                items.push_back({keys[k], d + k * b, b, {}});
              }
              for (const auto& got : me.store->BatchGet(kNs, items)) {
                if (!got.ok()) errs[r] = got.status();
              }
            }
          }
          took[r] = NowS() - s0;
        };
        if (readers == 1) {
          read_all(0);
        } else {
          std::vector<std::thread> ts;
          for (int r = 0; r < readers; ++r) ts.emplace_back(read_all, r);
          for (auto& t : ts) t.join();
        }
        for (const absl::Status& e : errs) {
          if (!e.ok()) return fail(e);
        }
        if (rep == 0) {  // check the bytes once per size
          for (int r = 0; r < readers; ++r) {
            if (o.device) {
              if (absl::Status st = gpu::CopySync(dst[r].get(), ddst[r], n * b); !st.ok()) {
                return fail(st);
              }
            }
            if (std::memcmp(dst[r].get(), src.get(), n * b) != 0) ++wrong;
          }
        }
        const double get_s = *std::max_element(took.begin(), took.end());
        // Make room for the next repetition.
        for (uint64_t i = 0; i < n; ++i) {
          absl::Status s = writer.store->Delete(kNs, keys[i]);
          if (!s.ok()) return fail(s);
        }
        if (rep == 0) continue;
        const double bytes = static_cast<double>(n * b);
        (batched ? bput_g : put_g).push_back(bytes / put_s / 1e9);
        (batched ? bput_o : put_o).push_back(n / put_s);
        (batched ? bget_g : get_g).push_back(readers * bytes / get_s / 1e9);
        (batched ? bget_o : get_o).push_back(readers * n / get_s);
      }
    }
    rows.push_back(
        {b, "put", Summarize(put_g), Summarize(put_o), Summarize(bput_g), Summarize(bput_o)});
    rows.push_back(
        {b, "get", Summarize(get_g), Summarize(get_o), Summarize(bget_g), Summarize(bget_o)});
  }

  // Lookup latency: keys put by the writer, looked up by a reader (pins
  // taken and released each time).
  std::vector<std::string> chain;
  for (int i = 0; i < 64; ++i) chain.push_back(absl::StrCat("chain-", i));
  for (const std::string& k : chain) {
    absl::Status s = writer.store->Put(kNs, k, src.get(), 16 << 10);
    if (!s.ok()) return fail(s);
  }
  auto time_lookup = [&](size_t len, int iters) {
    std::vector<double> ns;
    absl::Span<const std::string> keys(chain.data(), len);
    kv::PinSet pins;
    for (int i = 0; i < iters; ++i) {
      const double t0 = NowS();
      auto got = reader(0).store->Lookup(kNs, keys, &pins);
      const double t1 = NowS();
      if (!got.ok() || *got != len) ++wrong;
      reader(0).store->Release(pins);
      ns.push_back((t1 - t0) * 1e9);
    }
    return Summarize(ns);
  };
  const Summary one = time_lookup(1, 2000 * std::max(1, o.reps / 5));
  const Summary sixty_four = time_lookup(64, 300 * std::max(1, o.reps / 5));

  // The reference of a row: memcpy, or with --device pinned cudaMemcpy in
  // the row's direction (a get is host to device, a put device to host).
  auto ref = [&](const Row& r) {
    if (!o.device) return memcpy_bw.median;
    return r.op == "get" ? pinned_h2d : pinned_d2h;
  };
  gpu::GpuFree(dsrc);
  for (uint8_t* d : ddst) gpu::GpuFree(d);
  if (o.json) {
    nlohmann::json j = {{"hosts", hosts},
                        {"device", o.device},
                        {"pinned_h2d_gbps", pinned_h2d},
                        {"pinned_d2h_gbps", pinned_d2h},
                        {"readers", readers},
                        {"working_set_bytes", ws},
                        {"batch", o.batch},
                        {"memcpy_gbps", memcpy_bw.median},
                        {"lookup_1_ns", one.median},
                        {"lookup_64_ns", sixty_four.median},
                        {"wrong", wrong},
                        {"rows", nlohmann::json::array()}};
    for (const Row& r : rows) {
      j["rows"].push_back({{"block", r.block},
                           {"op", r.op},
                           {"gbps", r.gbps.median},
                           {"ops", r.ops.median},
                           {"batch_gbps", r.batch_gbps.median},
                           {"batch_ops", r.batch_ops.median},
                           {"vs_reference", r.gbps.median / ref(r)},
                           {"batch_vs_reference", r.batch_gbps.median / ref(r)}});
    }
    std::printf("%s\n", j.dump(2).c_str());
    return wrong == 0 ? 0 : 1;
  }
  std::printf(
      "cxlrt bench kv: %d host%s (host 0 puts, %s gets), %s per size and repetition, median of "
      "%d\nthis machine's memcpy: %s (64 MiB, median of 7)\n\n",
      hosts, hosts > 1 ? "s" : "",
      hosts > 1 ? absl::StrCat(readers, " other host", readers > 1 ? "s" : "").c_str()
                : "the same host",
      FormatBytes(ws).c_str(), o.reps, FormatGbps(memcpy_bw.median).c_str());
  if (o.device) {
    std::printf(
        "GPU buffers: values put from and got into device memory; /ref is pinned "
        "cudaMemcpy (64 MiB): host->device %s (gets), device->host %s (puts)\n\n",
        FormatGbps(pinned_h2d).c_str(), FormatGbps(pinned_d2h).c_str());
  }
  std::printf("%-9s %-4s %12s %11s %8s   %12s %11s %8s\n", "block", "op", "GB/s", "ops/s",
              o.device ? "/ref" : "/memcpy", absl::StrCat("batch ", o.batch, " GB/s").c_str(),
              "ops/s", o.device ? "/ref" : "/memcpy");
  for (const Row& r : rows) {
    std::printf("%-9s %-4s %12.2f %11.0f %8.2f   %12.2f %11.0f %8.2f\n",
                FormatBytes(r.block).c_str(), r.op.c_str(), r.gbps.median, r.ops.median,
                r.gbps.median / ref(r), r.batch_gbps.median, r.batch_ops.median,
                r.batch_gbps.median / ref(r));
  }
  std::printf("\nLookup (pins taken and released): 1 key %s, 64-key chain %s (medians)\n",
              FormatNs(one.median).c_str(), FormatNs(sixty_four.median).c_str());
  std::printf("#wrong %lu\n", static_cast<unsigned long>(wrong));
  return wrong == 0 ? 0 : 1;
}

}  // namespace cxlrt::bench
