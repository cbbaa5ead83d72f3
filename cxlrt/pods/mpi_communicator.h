// The front door across pods over Open MPI (docs/collectives.md, "Beyond
// one pool"): a MultiPodCommunicator whose engine between pods is MPI, in
// one call, from what `cxlrt run --pods` (or mpirun / srun across real
// hosts, with CXLRT_POOL set per host to the pool of its pod) gives:
//
//   auto host = cxlrt::Host::Open();  // this rank's pod pool (CXLRT_POOL)
//   auto comm = cxlrt::pods::CreateOverMpi(host->allocator(), "train");
//   (*comm)->AllReduce(grad, grad, n, DataType::kFloat32, RedOp::kAvg);
//
// Part of cxlrt_pods_mpi (built when MPI is found), so that cxlrt_pods and
// everything else in cxlrt stay free of MPI.
//
// Thread-safety: that of MultiPodCommunicator and MpiEngine::World.
#pragma once

#include <mpi.h>

#include <memory>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cxlrt/allocator/allocator.h"
#include "cxlrt/pods/mpi_engine.h"
#include "cxlrt/pods/pod_communicator.h"

namespace cxlrt::pods {

// Makes the MPI engine over a duplicate of `comm` (MpiEngine::World: it
// initialises MPI when the program has not) and, over it, the hierarchical
// communicator `name` (MultiPodCommunicator::Create: the pods are learned
// from the pool each rank's `pod_alloc` lives in; ranks are pod-major, so
// rank() may differ from the MPI rank when a pod's ranks are not
// contiguous in `comm`). Collective over `comm`; waits up to the
// communicator's timeout (options.timeout, else CXLRT_COMM_TIMEOUT_MS),
// which is also every engine wait's.
// Errors: those of MpiEngine::World and MultiPodCommunicator::Create.
// REQUIRES: `pod_alloc` outlives the communicator.
absl::StatusOr<std::unique_ptr<MultiPodCommunicator>> CreateOverMpi(
    allocator::Allocator& pod_alloc, absl::string_view name, MPI_Comm comm = MPI_COMM_WORLD,
    const CommOptions& options = {}, const PodOptions& pod_options = {},
    const MpiEngineOptions& engine_options = {});

}  // namespace cxlrt::pods
