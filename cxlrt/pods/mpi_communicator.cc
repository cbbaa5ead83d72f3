// The front door across pods over Open MPI (mpi_communicator.h).
#include "cxlrt/pods/mpi_communicator.h"

#include <utility>

#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::pods {

absl::StatusOr<std::unique_ptr<MultiPodCommunicator>> CreateOverMpi(
    allocator::Allocator& pod_alloc, absl::string_view name, MPI_Comm comm,
    const CommOptions& options, const PodOptions& pod_options,
    const MpiEngineOptions& engine_options) {
  CXLRT_ASSIGN_OR_RETURN(std::unique_ptr<InterPodEngine> world,
                         MpiEngine::World(comm, engine_options));
  return MultiPodCommunicator::Create(pod_alloc, name, std::move(world), options, pod_options);
}

}  // namespace cxlrt::pods
