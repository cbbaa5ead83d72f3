// The workload of prometheus_test.py: two emulated hosts in this process
// (each its own cxlrt::Host on the pool, publishing its metrics into it)
// do a known amount of KV and collective work, then stay attached until
// the test is done reading.
//
//   metrics_workload URI READY_FILE DONE_FILE
//
// Host 0 puts 10 values of 4 KiB in namespace "prom"; host 1 gets each once
// (10 hits, 40960 bytes) and 3 missing keys (3 misses); both run 7
// all-reduces of 8 floats on communicator "prom" (14 calls, 448 bytes in
// all). Then it writes READY_FILE and waits (60 s at most) for DONE_FILE.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cxlrt/cxlrt.h"

namespace {

int Fail(const std::string& what, const absl::Status& s) {
  std::fprintf(stderr, "metrics_workload: %s: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: metrics_workload URI READY_FILE DONE_FILE\n");
    return 2;
  }
  const std::string uri = argv[1];
  cxlrt::HostOptions ho;
  ho.create = true;
  ho.attach.host_id = -1;
  auto h0 = cxlrt::Host::Open(uri, ho);
  if (!h0.ok()) return Fail("host 0", h0.status());
  auto h1 = cxlrt::Host::Open(uri, ho);
  if (!h1.ok()) return Fail("host 1", h1.status());
  cxlrt::kv::StoreOptions so;
  so.create = true;
  auto s0 = h0->OpenStore(so);
  if (!s0.ok()) return Fail("store 0", s0.status());
  auto s1 = h1->OpenStore(so);
  if (!s1.ok()) return Fail("store 1", s1.status());
  std::vector<char> v(4096, 'v'), out(4096);
  for (int i = 0; i < 10; ++i) {
    absl::Status s = (*s0)->Put("prom", absl::StrCat("k", i), v.data(), v.size());
    if (!s.ok()) return Fail("put", s);
  }
  for (int i = 0; i < 10; ++i) {
    auto g = (*s1)->Get("prom", absl::StrCat("k", i), out.data(), out.size());
    if (!g.ok()) return Fail("get", g.status());
  }
  for (int i = 0; i < 3; ++i) {
    auto g = (*s1)->Get("prom", absl::StrCat("missing", i), out.data(), out.size());
    if (g.ok() || !absl::IsNotFound(g.status())) return Fail("a missing key", g.status());
  }
  cxlrt::Host* hosts[2] = {&*h0, &*h1};
  std::vector<absl::Status> errs(2);
  std::vector<std::shared_ptr<cxlrt::collectives::Communicator>> comms(2);
  std::vector<std::thread> ts;
  for (int r = 0; r < 2; ++r) {
    ts.emplace_back([&, r] {
      auto c = hosts[r]->CreateCommunicator("prom", 2, r);
      if (!c.ok()) {
        errs[r] = c.status();
        return;
      }
      comms[r] = *c;
      std::vector<float> a(8, 1.0f), b(8);
      for (int i = 0; i < 7 && errs[r].ok(); ++i) {
        errs[r] = comms[r]->AllReduce(a.data(), b.data(), 8, cxlrt::collectives::DataType::kFloat32,
                                      cxlrt::collectives::RedOp::kSum);
      }
    });
  }
  for (auto& t : ts) t.join();
  for (int r = 0; r < 2; ++r) {
    if (!errs[r].ok()) return Fail(absl::StrCat("rank ", r), errs[r]);
  }
  std::ofstream(argv[2]) << "ready\n";
  const absl::Time end = absl::Now() + absl::Seconds(60);
  while (access(argv[3], F_OK) != 0 && absl::Now() < end) absl::SleepFor(absl::Milliseconds(20));
  // The communicators leave together (Destroy is a barrier).
  ts.clear();
  for (int r = 0; r < 2; ++r) ts.emplace_back([&, r] { comms[r].reset(); });
  for (auto& t : ts) t.join();
  return 0;
}
