// Suites parameterized by CPU vector level (cxlrt/runtime/cpu_features.h): every
// level is instantiated, and a level above this CPU's is skipped, saying
// which features the CPU lacks, so each machine runs every level it has.
#pragma once

#include <string>

#include "absl/strings/str_cat.h"
#include "cxlrt/runtime/cpu_features.h"
#include "gtest/gtest.h"

namespace cxlrt::runtime {
// Test names print the level, not its byte.
inline void PrintTo(CpuLevel level, std::ostream* os) { *os << CpuLevelName(level); }
}  // namespace cxlrt::runtime

namespace cxlrt::testing {

inline auto AllCpuLevels() {
  return ::testing::Values(runtime::CpuLevel::kBaseline, runtime::CpuLevel::kAvx2,
                           runtime::CpuLevel::kAvx512);
}

inline std::string CpuLevelTestName(const ::testing::TestParamInfo<runtime::CpuLevel>& info) {
  return runtime::CpuLevelName(info.param);
}

// Skips the current test when this CPU cannot run `level`'s kernels.
#define CXLRT_SKIP_ABOVE_THIS_CPU(level)                                                          \
  do {                                                                                            \
    const auto& cxlrt_f = ::cxlrt::runtime::GetCpuFeatures();                                     \
    if ((level) > cxlrt_f.max_level) {                                                            \
      GTEST_SKIP() << "this CPU runs up to " << ::cxlrt::runtime::CpuLevelName(cxlrt_f.max_level) \
                   << ", not " << ::cxlrt::runtime::CpuLevelName(level)                           \
                   << " (missing: " << ::cxlrt::runtime::MissingForCpuLevel(cxlrt_f, level)       \
                   << ")";                                                                        \
    }                                                                                             \
  } while (0)

}  // namespace cxlrt::testing
