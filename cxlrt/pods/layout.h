// Which ranks form which pod (docs/collectives.md, "Beyond one pool").
//
// A rank names its pod by the pool it maps: the pool header's creation_id
// and name. The ranks exchange those over the world engine; pods are
// ordered by their lowest world rank, a pod's ranks by world rank. The
// hierarchical communicator's rank is pod-major (pod 0's ranks first), which
// is the world rank when pods are contiguous (as `cxlrt run --pods` places
// them). Pods may differ in size.
//
// Thread-safety: PodLayout is a value; DiscoverLayout calls the engine (one
// thread at a time, inter_pod.h).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cxlrt/pods/inter_pod.h"
#include "cxlrt/runtime/pool_layout.h"

namespace cxlrt::pods {

// What names a pod: its pool.
struct PoolIdLayout {
  uint64_t creation_id;
  char name[64];  // NUL-terminated
};
static_assert(sizeof(PoolIdLayout) == 72);

PoolIdLayout PoolIdOf(const runtime::PoolHeaderLayout& header);

struct PodLayout {
  int world_rank = 0, world_size = 1;
  int rank = 0;  // pod-major
  int pod = 0, npods = 1;
  int local_rank = 0, pod_size = 1;
  int min_pod_size = 1;        // the rails that every pod joins: local 0 .. min - 1
  std::vector<int> pod_sizes;  // [pod]
  std::vector<int> pod_first;  // [pod]: pod-major rank of its local 0
  std::vector<int> world_of;   // [pod-major rank]: world rank
  std::vector<int> rank_of;    // [world rank]: pod-major rank
  std::vector<int> pod_of;     // [pod-major rank]: pod
  int RankOf(int p, int local) const { return pod_first[p] + local; }
};

// The layout from every world rank's pool, as `world_rank` sees it.
// kInvalidArgument: `ids` is empty or world_rank is out of range.
absl::StatusOr<PodLayout> LayoutFromIds(absl::Span<const PoolIdLayout> ids, int world_rank);

// Exchanges this rank's pool over `world` (an all-gather) and returns the
// layout. Errors: the engine's, or kDeadlineExceeded at `deadline`.
absl::StatusOr<PodLayout> DiscoverLayout(const runtime::PoolHeaderLayout& header,
                                         InterPodEngine& world, absl::Time deadline);

}  // namespace cxlrt::pods
