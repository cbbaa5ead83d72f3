// What the tests of the hierarchical communicator share, whatever engine
// runs between the pods (pod_communicator_test.cc: the pool engine in
// forked ranks; pod_mpi_test.cc: Open MPI under `cxlrt run --pods`): one
// rank's run of a case checked bit for bit against communicator_test_util's
// single-pool reference, the case matrix, and all-to-all-v with random
// splits. Thread-safety: one rank's thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cxlrt/pods/pod_communicator.h"
#include "tests/collectives/communicator_test_util.h"

namespace cxlrt::pods {

// One rank's run of `c` on `comm` (host buffers), checked against the
// reference: what one pool of all the ranks gives. Returns "" or what was
// wrong (the case, the rank, the first wrong byte).
std::string RunPodCase(MultiPodCommunicator& comm, const collectives::Case& c);

// Every collective; a few types and ops (every op on int32 and more types
// when `full`, kAvg on 16-bit floats); counts 0, 1, 7, 1001 and 20011.
std::vector<collectives::Case> PodMatrix(int n, bool full);

// All-to-all-v with counts drawn from `seed` (zeros, small, a few large),
// gaps between the pieces that must stay untouched. Returns "" or what was
// wrong.
std::string RunAllToAllV(MultiPodCommunicator& comm, uint32_t seed, collectives::DataType type);

}  // namespace cxlrt::pods
