// What every transport shares: the call in progress and its description.
#include "cxlrt/collectives/transport.h"

#include "absl/strings/str_cat.h"

namespace cxlrt::collectives {

void Transport::BeginCall(const CallDesc& desc, absl::Duration timeout, CopyEngine* engine) {
  desc_ = desc;
  timeout_ = timeout;
  deadline_ = absl::InfinitePast();
  engine_ = engine;
  call_first_ = staged_ + 1;
}

std::string Transport::Describe(const CallDesc& d) const {
  const auto kind = static_cast<CollKind>(d.kind);
  // AllToAllV's counts differ per rank (its first post carries them): no count.
  std::string s = absl::StrCat(CollKindName(kind), "(");
  if (kind != CollKind::kAllToAllV) absl::StrAppend(&s, "count=", d.count);
  if (kind != CollKind::kBarrier) {
    absl::StrAppend(&s, kind == CollKind::kAllToAllV ? "" : ", ",
                    DataTypeName(static_cast<DataType>(d.type)));
  }
  if (kind == CollKind::kAllReduce || kind == CollKind::kReduce ||
      kind == CollKind::kReduceScatter) {
    absl::StrAppend(&s, ", ", RedOpName(static_cast<RedOp>(d.op)));
  }
  if (d.root >= 0) absl::StrAppend(&s, ", root=", d.root);
  absl::StrAppend(&s, ") [call ", d.call, "]");
  return s;
}

}  // namespace cxlrt::collectives
