// The CPU vector level: never above what the CPU and the OS support, lowered
// by CXLRT_CPU_LEVEL and never raised by it. ctest runs this binary twice:
// as the environment has it, and with CXLRT_CPU_LEVEL=baseline.
#include "cxlrt/runtime/cpu_features.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "cxlrt/runtime/knobs.h"
#include "gtest/gtest.h"
#include "tests/testing/cpu_levels.h"
#include "tests/testing/test_util.h"

namespace cxlrt::runtime {
namespace {

// The kernel's view of the CPU (/proc/cpuinfo "flags"): an oracle apart from
// our own cpuid code. The kernel hides AVX-512 when it does not save the ZMM
// state, as it must.
std::set<std::string> KernelCpuFlags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string w; words >> w;) flags.insert(w);
    return flags;
  }
  return {};
}

// The flags /proc/cpuinfo shows for what each level needs beyond the one below.
const std::map<CpuLevel, std::vector<std::string>>& KernelFlagsOfLevel() {
  static const auto* m = new std::map<CpuLevel, std::vector<std::string>>{
      {CpuLevel::kAvx2,
       {"pni", "ssse3", "sse4_1", "sse4_2", "popcnt", "cx16", "lahf_lm", "avx", "avx2", "fma",
        "f16c", "bmi1", "bmi2", "abm", "movbe", "xsave"}},
      {CpuLevel::kAvx512, {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}},
  };
  return *m;
}

TEST(CpuLevelTest, ChosenLevelNeverExceedsWhatTheCpuReports) {
  const CpuFeatures& f = GetCpuFeatures();
  EXPECT_LE(ActiveCpuLevel(), f.max_level);
  EXPECT_EQ(f.max_level, MaxCpuLevel(f));
  const std::set<std::string> flags = KernelCpuFlags();
  ASSERT_FALSE(flags.empty()) << "no flags line in /proc/cpuinfo";
  // Every level up to the chosen one has all its flags; the first level
  // above max_level lacks one (our detection is neither bolder nor shyer
  // than the kernel's).
  CpuLevel kernel_max = CpuLevel::kBaseline;
  for (const auto& [level, needed] : KernelFlagsOfLevel()) {
    std::string missing;
    for (const auto& flag : needed) {
      if (!flags.count(flag)) missing += flag + " ";
    }
    if (!missing.empty()) break;
    kernel_max = level;
  }
  EXPECT_EQ(f.max_level, kernel_max)
      << "cpuid/xgetbv say " << CpuLevelName(f.max_level) << ", /proc/cpuinfo says "
      << CpuLevelName(kernel_max)
      << " (missing by cpuid: " << MissingForCpuLevel(f, CpuLevel::kAvx512) << ")";
  for (const auto& [level, needed] : KernelFlagsOfLevel()) {
    if (ActiveCpuLevel() < level) break;
    for (const auto& flag : needed) {
      EXPECT_TRUE(flags.count(flag))
          << "running at " << CpuLevelName(ActiveCpuLevel()) << " without " << flag;
    }
  }
}

TEST(CpuLevelTest, FollowsCxlrtCpuLevelDownButNeverUp) {
  const CpuLevel max = GetCpuFeatures().max_level;
  const char* env = std::getenv("CXLRT_CPU_LEVEL");
  if (env == nullptr || std::string(env).empty() || std::string(env) == "auto") {
    EXPECT_EQ(ActiveCpuLevel(), max);
    return;
  }
  const std::optional<CpuLevel> asked = ParseCpuLevel(env);
  ASSERT_TRUE(asked.has_value()) << "CXLRT_CPU_LEVEL=" << env;
  EXPECT_EQ(ActiveCpuLevel(), std::min(*asked, max)) << "CXLRT_CPU_LEVEL=" << env;
}

TEST(CpuLevelTest, ARequestOnlyLowersTheLevel) {
  for (int s = 0; s < kNumCpuLevels; ++s) {
    const auto supported = static_cast<CpuLevel>(s);
    EXPECT_EQ(ChooseCpuLevel(supported, std::nullopt).level, supported);
    EXPECT_EQ(ChooseCpuLevel(supported, std::nullopt).warning, "");
    for (int r = 0; r < kNumCpuLevels; ++r) {
      const auto requested = static_cast<CpuLevel>(r);
      const CpuLevelChoice c = ChooseCpuLevel(supported, requested);
      EXPECT_EQ(c.level, std::min(supported, requested));
      if (requested > supported) {
        EXPECT_NE(c.warning.find(absl::StrCat("CXLRT_CPU_LEVEL=", CpuLevelName(requested))),
                  std::string::npos)
            << c.warning;
        EXPECT_NE(c.warning.find(CpuLevelName(supported)), std::string::npos) << c.warning;
      } else {
        EXPECT_EQ(c.warning, "");
      }
    }
  }
}

CpuFeatures EveryFeature() {
  CpuFeatures f;
  f.sse3 = f.ssse3 = f.sse41 = f.sse42 = f.popcnt = f.cx16 = f.lahf = true;
  f.avx = f.avx2 = f.fma = f.f16c = f.bmi1 = f.bmi2 = f.lzcnt = f.movbe = f.osxsave = true;
  f.avx512f = f.avx512bw = f.avx512cd = f.avx512dq = f.avx512vl = true;
  f.xcr0 = 0xe7;  // x87, SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM
  return f;
}

TEST(CpuLevelTest, EachLevelNeedsEveryFeatureAndTheOsState) {
  CpuFeatures f = EveryFeature();
  EXPECT_EQ(MaxCpuLevel(f), CpuLevel::kAvx512);
  EXPECT_EQ(MissingForCpuLevel(f, CpuLevel::kAvx512), "");

  // An AMD EPYC of the development machines: AVX2 and no AVX-512.
  f.avx512f = f.avx512bw = f.avx512cd = f.avx512dq = f.avx512vl = false;
  EXPECT_EQ(MaxCpuLevel(f), CpuLevel::kAvx2);

  f = EveryFeature();
  f.avx512bw = false;  // Knights Landing: AVX-512F without BW/VL/DQ
  EXPECT_EQ(MaxCpuLevel(f), CpuLevel::kAvx2);
  EXPECT_EQ(MissingForCpuLevel(f, CpuLevel::kAvx512), "avx512bw");

  f = EveryFeature();
  f.xcr0 = 0x7;  // the OS saves YMM but not the ZMM state
  EXPECT_EQ(MaxCpuLevel(f), CpuLevel::kAvx2);
  EXPECT_NE(MissingForCpuLevel(f, CpuLevel::kAvx512).find("ZMM state"), std::string::npos);

  f = EveryFeature();
  f.xcr0 = 0x3;  // no YMM state: AVX faults whatever cpuid says
  EXPECT_EQ(MaxCpuLevel(f), CpuLevel::kBaseline);
  EXPECT_NE(MissingForCpuLevel(f, CpuLevel::kAvx2).find("YMM state"), std::string::npos);

  for (bool CpuFeatures::*feature : {&CpuFeatures::fma, &CpuFeatures::f16c, &CpuFeatures::bmi2,
                                     &CpuFeatures::avx2, &CpuFeatures::lzcnt}) {
    f = EveryFeature();
    f.*feature = false;
    EXPECT_EQ(MaxCpuLevel(f), CpuLevel::kBaseline) << MissingForCpuLevel(f, CpuLevel::kAvx2);
  }
  EXPECT_EQ(MaxCpuLevel(CpuFeatures{}), CpuLevel::kBaseline);
}

absl::StatusOr<std::optional<CpuLevel>> ParseLevel(const char* value) {
  return RequestedCpuLevel([&](const char* name) -> const char* {
    return std::string(name) == "CXLRT_CPU_LEVEL" ? value : nullptr;
  });
}

TEST(CpuLevelTest, TheKnobNamesALevelOrAuto) {
  EXPECT_EQ(*ParseLevel(nullptr), std::nullopt);
  EXPECT_EQ(*ParseLevel("auto"), std::nullopt);
  EXPECT_EQ(*ParseLevel("baseline"), CpuLevel::kBaseline);
  EXPECT_EQ(*ParseLevel("avx2"), CpuLevel::kAvx2);
  EXPECT_EQ(*ParseLevel("avx512"), CpuLevel::kAvx512);
  CXLRT_EXPECT_ERROR(ParseLevel("avx-512"), absl::StatusCode::kInvalidArgument,
                     "CXLRT_CPU_LEVEL='avx-512' is not auto, baseline, avx2 or avx512");
}

}  // namespace
}  // namespace cxlrt::runtime
