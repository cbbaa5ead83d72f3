// The workload of top_tmux_test.py, one rank per process under
//   cxlrt run -n 2 --pool URI -- top_workload READY_FILE DONE_FILE
// Each rank is a host of the pool (cxlrt::Host, publishing its metrics).
//
// First a known amount of work: rank 0 puts 10 values of 4 KiB in
// namespace "top"; rank 1 gets each once (10 hits) and 3 missing keys
// (3 misses): hit rate 76.9%; both run 7 all-reduces of 8 floats on
// communicator "top". Then, until DONE_FILE exists (60 s at most), a steady
// load that moves the rates: every 20 ms both ranks all-reduce on
// communicator "live" (the all-reduce of a stop flag: both stop together)
// and rank 0 puts a 4 KiB value in namespace "churn", whose 16 KiB quota
// makes each put past the fourth evict one. Rank 0 writes READY_FILE when
// the steady load has begun.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cxlrt/cxlrt.h"

namespace {

void Check(const absl::Status& s, const std::string& what) {
  if (s.ok()) return;
  std::fprintf(stderr, "top_workload: %s: %s\n", what.c_str(), s.ToString().c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: top_workload READY_FILE DONE_FILE (under cxlrt run -n 2)\n");
    return 2;
  }
  using cxlrt::collectives::DataType;
  using cxlrt::collectives::RedOp;
  auto host = cxlrt::Host::Open();  // CXLRT_POOL
  Check(host.status(), "open the host");
  auto top = host->CreateCommunicator("top");
  Check(top.status(), "join communicator top");
  const int rank = (*top)->rank();
  cxlrt::kv::StoreOptions so;
  so.create = rank == 0;
  std::shared_ptr<cxlrt::kv::Store> store;
  std::vector<char> value(4096, 'v'), out(4096);
  if (rank == 0) {
    auto s = host->OpenStore(so);
    Check(s.status(), "open the store");
    store = *s;
    Check(store->SetQuota("churn", 16 << 10), "set the quota of churn");
    for (int i = 0; i < 10; ++i) {
      Check(store->Put("top", absl::StrCat("k", i), value.data(), value.size()), "put");
    }
    Check((*top)->Barrier(), "barrier");
  } else {
    Check((*top)->Barrier(), "barrier");
    auto s = host->OpenStore(so);
    Check(s.status(), "open the store");
    store = *s;
    for (int i = 0; i < 10; ++i) {
      Check(store->Get("top", absl::StrCat("k", i), out.data(), out.size()).status(), "get");
    }
    for (int i = 0; i < 3; ++i) {
      auto g = store->Get("top", absl::StrCat("missing", i), out.data(), out.size());
      if (g.ok() || !absl::IsNotFound(g.status())) Check(g.status(), "get a missing key");
    }
  }
  std::vector<float> a(8, 1.0f), b(8);
  for (int i = 0; i < 7; ++i) {
    Check((*top)->AllReduce(a.data(), b.data(), 8, DataType::kFloat32, RedOp::kSum), "all-reduce");
  }

  auto live = host->CreateCommunicator("live");
  Check(live.status(), "join communicator live");
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  for (int i = 0;; ++i) {
    float stop = access(argv[2], F_OK) == 0 || absl::Now() > deadline ? 1.0f : 0.0f;
    Check((*live)->AllReduce(&stop, &stop, 1, DataType::kFloat32, RedOp::kMax), "live all-reduce");
    if (stop > 0) break;
    if (rank == 0) {
      Check(store->Put("churn", absl::StrCat("c", i), value.data(), value.size()), "churn put");
      if (i == 0) std::ofstream(argv[1]) << "ready\n";
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  Check((*live)->Destroy(), "leave live");
  Check((*top)->Destroy(), "leave top");
  return 0;
}
