#include "cxlrt/runtime/cpu_features.h"

#include <cpuid.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cxlrt/runtime/knobs.h"
#include "cxlrt/runtime/log.h"

namespace cxlrt::runtime {
namespace {

const Knob<std::optional<CpuLevel>> kCpuLevel(
    {"CXLRT_CPU_LEVEL", "auto",
     "Vector level of the CPU kernels (copies, checksums, reductions): auto (the highest this CPU "
     "and OS support), baseline, avx2 or avx512. Can only lower the level: a request above the "
     "CPU's is clamped with a warning (`cxlrt doctor` prints both)."},
    std::nullopt,
    [](const char* name, const std::string& text) -> absl::StatusOr<std::optional<CpuLevel>> {
      if (text == "auto") return std::nullopt;
      if (std::optional<CpuLevel> level = ParseCpuLevel(text)) return level;
      return absl::InvalidArgumentError(
          absl::StrCat(name, "='", text, "' is not auto, baseline, avx2 or avx512"));
    });

// XCR0 bits: SSE and AVX (YMM upper halves) state; AVX-512's opmask,
// ZMM_Hi256 and Hi16_ZMM state.
constexpr uint64_t kXcr0Ymm = (1u << 1) | (1u << 2);
constexpr uint64_t kXcr0Zmm = (1u << 5) | (1u << 6) | (1u << 7);

uint64_t ReadXcr0() {
  uint32_t lo = 0, hi = 0;
  // Inline assembly, not _xgetbv: that intrinsic needs the xsave target,
  // and this file is compiled for the baseline. REQUIRES: cpuid's OSXSAVE.
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t{hi} << 32) | lo;
}

CpuFeatures Detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d)) {
    f.clflush = d & (1u << 19);
    f.sse3 = c & (1u << 0);
    f.ssse3 = c & (1u << 9);
    f.fma = c & (1u << 12);
    f.cx16 = c & (1u << 13);
    f.sse41 = c & (1u << 19);
    f.sse42 = c & (1u << 20);
    f.movbe = c & (1u << 22);
    f.popcnt = c & (1u << 23);
    f.osxsave = c & (1u << 27);
    f.avx = c & (1u << 28);
    f.f16c = c & (1u << 29);
  }
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.bmi1 = b & (1u << 3);
    f.avx2 = b & (1u << 5);
    f.bmi2 = b & (1u << 8);
    f.erms = b & (1u << 9);
    f.avx512f = b & (1u << 16);
    f.avx512dq = b & (1u << 17);
    f.clflushopt = b & (1u << 23);
    f.clwb = b & (1u << 24);
    f.avx512cd = b & (1u << 28);
    f.avx512bw = b & (1u << 30);
    f.avx512vl = b & (1u << 31);
    f.movdir64b = c & (1u << 28);
  }
  if (__get_cpuid(0x80000001u, &a, &b, &c, &d)) {
    f.lahf = c & (1u << 0);
    f.lzcnt = c & (1u << 5);
  }
  if (f.osxsave) f.xcr0 = ReadXcr0();
  f.writeback = f.clwb         ? FlushInstruction::kClwb
                : f.clflushopt ? FlushInstruction::kClflushopt
                : f.clflush    ? FlushInstruction::kClflush
                               : FlushInstruction::kNone;
  f.invalidate = f.clflushopt ? FlushInstruction::kClflushopt
                 : f.clflush  ? FlushInstruction::kClflush
                              : FlushInstruction::kNone;
  f.max_level = MaxCpuLevel(f);
  return f;
}

// What `level` needs beyond the level below it.
std::vector<std::string> Missing(const CpuFeatures& f, CpuLevel level) {
  std::vector<std::string> missing;
  auto need = [&](bool has, const char* name) {
    if (!has) missing.push_back(name);
  };
  switch (level) {
    case CpuLevel::kBaseline:
      break;
    case CpuLevel::kAvx2:
      need(f.sse3, "sse3");
      need(f.ssse3, "ssse3");
      need(f.sse41, "sse4.1");
      need(f.sse42, "sse4.2");
      need(f.popcnt, "popcnt");
      need(f.cx16, "cx16");
      need(f.lahf, "lahf_lm");
      need(f.avx, "avx");
      need(f.avx2, "avx2");
      need(f.fma, "fma");
      need(f.f16c, "f16c");
      need(f.bmi1, "bmi1");
      need(f.bmi2, "bmi2");
      need(f.lzcnt, "lzcnt");
      need(f.movbe, "movbe");
      need(f.osxsave, "osxsave");
      need((f.xcr0 & kXcr0Ymm) == kXcr0Ymm, "YMM state not enabled by the OS");
      break;
    case CpuLevel::kAvx512:
      need(f.avx512f, "avx512f");
      need(f.avx512bw, "avx512bw");
      need(f.avx512cd, "avx512cd");
      need(f.avx512dq, "avx512dq");
      need(f.avx512vl, "avx512vl");
      need((f.xcr0 & kXcr0Zmm) == kXcr0Zmm, "ZMM state not enabled by the OS");
      break;
  }
  return missing;
}

}  // namespace

const CpuFeatures& GetCpuFeatures() {
  static const CpuFeatures features = Detect();
  return features;
}

const char* FlushInstructionName(FlushInstruction f) {
  switch (f) {
    case FlushInstruction::kClwb:
      return "clwb";
    case FlushInstruction::kClflushopt:
      return "clflushopt";
    case FlushInstruction::kClflush:
      return "clflush";
    case FlushInstruction::kNone:
      return "none";
  }
  return "?";
}

const char* CpuLevelName(CpuLevel level) {
  switch (level) {
    case CpuLevel::kBaseline:
      return "baseline";
    case CpuLevel::kAvx2:
      return "avx2";
    case CpuLevel::kAvx512:
      return "avx512";
  }
  return "?";
}

std::optional<CpuLevel> ParseCpuLevel(std::string_view name) {
  for (int i = 0; i < kNumCpuLevels; ++i) {
    if (name == CpuLevelName(static_cast<CpuLevel>(i))) return static_cast<CpuLevel>(i);
  }
  return std::nullopt;
}

CpuLevel MaxCpuLevel(const CpuFeatures& f) {
  CpuLevel level = CpuLevel::kBaseline;
  for (CpuLevel next : {CpuLevel::kAvx2, CpuLevel::kAvx512}) {
    if (!Missing(f, next).empty()) break;
    level = next;
  }
  return level;
}

std::string MissingForCpuLevel(const CpuFeatures& f, CpuLevel level) {
  std::vector<std::string> missing;
  for (int i = 1; i <= static_cast<int>(level); ++i) {
    for (auto& m : Missing(f, static_cast<CpuLevel>(i))) missing.push_back(std::move(m));
  }
  return absl::StrJoin(missing, ", ");
}

CpuLevelChoice ChooseCpuLevel(CpuLevel supported, std::optional<CpuLevel> requested) {
  if (!requested || *requested == supported) return {supported, ""};
  if (*requested < supported) return {*requested, ""};
  return {supported, absl::StrCat("CXLRT_CPU_LEVEL=", CpuLevelName(*requested),
                                  " is above what this CPU supports (", CpuLevelName(supported),
                                  "): running at ", CpuLevelName(supported))};
}

std::optional<CpuLevel> RequestedCpuLevel() { return kCpuLevel.Get(); }

absl::StatusOr<std::optional<CpuLevel>> RequestedCpuLevel(const Getenv& getenv) {
  return kCpuLevel.Parse(getenv);
}

CpuLevel ActiveCpuLevel() {
  static const CpuLevel level = [] {
    const CpuFeatures& f = GetCpuFeatures();
    CpuLevelChoice choice = ChooseCpuLevel(f.max_level, kCpuLevel.Get());
    if (!choice.warning.empty()) {
      CXLRT_LOG(kWarning) << choice.warning
                          << "; missing: " << MissingForCpuLevel(f, *kCpuLevel.Get());
    }
    return choice.level;
  }();
  return level;
}

}  // namespace cxlrt::runtime
