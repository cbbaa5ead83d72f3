// A gradient all-reduce across pods: the pool inside each pod, Open MPI
// between them (docs/collectives.md, "Beyond one pool"). Emulated pods on
// one machine:
//   cxlrt run --pods 2 -n 4 build/bin/example_pods_allreduce
// Across real hosts, mpirun (or srun) starts it with CXLRT_POOL set on each
// host to the pool of its pod, and CXLRT_HOST_ID to the rank's index in it.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cxlrt/cxlrt.h"
#include "cxlrt/pods/mpi_communicator.h"

namespace {

// Ends the program saying what failed when `s` is an error.
void Check(const absl::Status& s, const char* what) {
  if (s.ok()) return;
  std::fprintf(stderr, "pods_allreduce: %s: %s\n", what, s.ToString().c_str());
  std::exit(1);
}

}  // namespace

int main() {
  auto host = cxlrt::Host::Open();  // this rank's pod pool (CXLRT_POOL)
  Check(host.status(), "open the host");
  // MPI_COMM_WORLD; MPI is initialised here and finalised at exit.
  auto comm = cxlrt::pods::CreateOverMpi(host->allocator(), "train");
  Check(comm.status(), "join the communicator across pods");
  const int rank = (*comm)->rank(), size = (*comm)->size();
  std::vector<float> grad(1 << 20, static_cast<float>(rank + 1));
  Check((*comm)->AllReduce(grad.data(), grad.data(), grad.size(),  // in place
                           cxlrt::collectives::DataType::kFloat32, cxlrt::collectives::RedOp::kAvg),
        "all-reduce");
  const float want = (size + 1) / 2.0f;
  for (float g : grad) {
    if (g != want) Check(absl::DataLossError("a gradient differs from the average"), "check");
  }
  std::printf("rank %d/%d (pod %d of %d): averaged %zu gradients to %g\n", rank, size,
              (*comm)->pod(), (*comm)->npods(), grad.size(), want);
  Check((*comm)->Destroy(), "leave the communicator");
  return 0;
}
