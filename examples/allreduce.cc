// A data-parallel gradient all-reduce through the pool, one process per
// rank (examples/allreduce.py in C++):
//   cxlrt run -n 2 build/bin/example_allreduce
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cxlrt/cxlrt.h"

namespace {

// Ends the program saying what failed when `s` is an error.
void Check(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "allreduce: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

}  // namespace

int main() {
  auto host = cxlrt::Host::Open();  // the pool cxlrt run made (CXLRT_POOL)
  Check(host.status(), "open the host");
  auto comm = host->CreateCommunicator("train");  // rank and size from the launcher
  Check(comm.status(), "join the communicator");
  const int rank = (*comm)->rank(), size = (*comm)->size();
  std::vector<float> grad(1 << 20, static_cast<float>(rank + 1));
  Check((*comm)->AllReduce(grad.data(), grad.data(), grad.size(),  // in place
                           cxlrt::collectives::DataType::kFloat32, cxlrt::collectives::RedOp::kAvg),
        "all-reduce");
  const float want = (size + 1) / 2.0f;
  for (float g : grad) {
    if (g != want) Check(absl::DataLossError("a gradient differs from the average"), "check");
  }
  std::printf("rank %d/%d: averaged %zu gradients to %g\n", rank, size, grad.size(), want);
  Check((*comm)->Destroy(), "leave the communicator");
  return 0;
}
