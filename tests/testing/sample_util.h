// Finding metric samples in tests (tests/metrics/).
#pragma once

#include <string>
#include <vector>

#include "cxlrt/runtime/metrics.h"

namespace cxlrt::testing {

// The sample of `name` whose labels include every one of `want`; null if none.
inline const runtime::Sample* FindSample(const std::vector<runtime::Sample>& all,
                                         const std::string& name, const runtime::Labels& want) {
  for (const runtime::Sample& s : all) {
    if (s.name != name) continue;
    bool match = true;
    for (const runtime::Label& w : want) {
      bool has = false;
      for (const runtime::Label& l : s.labels) has |= l == w;
      match &= has;
    }
    if (match) return &s;
  }
  return nullptr;
}

}  // namespace cxlrt::testing
