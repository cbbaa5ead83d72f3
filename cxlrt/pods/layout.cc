#include "cxlrt/pods/layout.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cxlrt/runtime/status_macros.h"

namespace cxlrt::pods {

PoolIdLayout PoolIdOf(const runtime::PoolHeaderLayout& header) {
  PoolIdLayout id{};
  id.creation_id = header.creation_id;
  std::memcpy(id.name, header.name, sizeof id.name);
  id.name[sizeof id.name - 1] = '\0';
  return id;
}

absl::StatusOr<PodLayout> LayoutFromIds(absl::Span<const PoolIdLayout> ids, int world_rank) {
  const int n = static_cast<int>(ids.size());
  if (n == 0 || world_rank < 0 || world_rank >= n) {
    return absl::InvalidArgumentError(
        absl::StrCat("pod layout: world rank ", world_rank, " of ", n, " ranks"));
  }
  auto same = [&](int a, int b) {
    return ids[a].creation_id == ids[b].creation_id &&
           std::strncmp(ids[a].name, ids[b].name, sizeof ids[a].name) == 0;
  };
  PodLayout l;
  l.world_rank = world_rank;
  l.world_size = n;
  // Pods in order of their lowest world rank; members in world-rank order.
  std::vector<int> pod_of_world(n, -1);
  std::vector<std::vector<int>> members;
  for (int r = 0; r < n; ++r) {
    for (size_t p = 0; p < members.size(); ++p) {
      if (same(members[p][0], r)) {
        pod_of_world[r] = static_cast<int>(p);
        break;
      }
    }
    if (pod_of_world[r] < 0) {
      pod_of_world[r] = static_cast<int>(members.size());
      members.emplace_back();
    }
    members[pod_of_world[r]].push_back(r);
  }
  l.npods = static_cast<int>(members.size());
  l.rank_of.assign(n, -1);
  int next = 0;
  for (int p = 0; p < l.npods; ++p) {
    l.pod_sizes.push_back(static_cast<int>(members[p].size()));
    l.pod_first.push_back(next);
    for (int w : members[p]) {
      l.rank_of[w] = next++;
      l.world_of.push_back(w);
      l.pod_of.push_back(p);
    }
  }
  l.rank = l.rank_of[world_rank];
  l.pod = pod_of_world[world_rank];
  l.local_rank = l.rank - l.pod_first[l.pod];
  l.pod_size = l.pod_sizes[l.pod];
  l.min_pod_size = *std::min_element(l.pod_sizes.begin(), l.pod_sizes.end());
  return l;
}

absl::StatusOr<PodLayout> DiscoverLayout(const runtime::PoolHeaderLayout& header,
                                         InterPodEngine& world, absl::Time deadline) {
  const PoolIdLayout mine = PoolIdOf(header);
  std::vector<PoolIdLayout> all(world.size());
  CXLRT_ASSIGN_OR_RETURN(
      auto t, world.AllGather(&mine, all.data(), sizeof mine, collectives::DataType::kUint8));
  CXLRT_RETURN_IF_ERROR(world.Wait(t, deadline));
  return LayoutFromIds(all, world.rank());
}

}  // namespace cxlrt::pods
