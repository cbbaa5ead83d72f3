// What this CPU offers: the coherence layer's flush instructions and the
// vector level every CPU kernel runs at, read once with cpuid and xgetbv.
//
// The vector level is one explicit choice per process (ActiveCpuLevel): the
// highest level the CPU and the OS support, lowered by CXLRT_CPU_LEVEL. Each
// kernel family (copies, checksums, reductions) keeps a table with one entry
// per level, and its dispatcher takes table[ActiveCpuLevel()] once. Nothing
// is left to a compiler-resolved ifunc, whose choice a test cannot see (clang
// 14's target_clones resolver picked an AVX-512 clone on a CPU without it).
// Thread-safe (immutable after first use).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "cxlrt/runtime/knobs.h"

namespace cxlrt::runtime {

enum class FlushInstruction { kClwb, kClflushopt, kClflush, kNone };

// The vector levels of the CPU kernels, in increasing order.
//   kBaseline: x86-64 as every 64-bit x86 CPU runs it (SSE2).
//   kAvx2: x86-64-v3 (AVX, AVX2, FMA, F16C, BMI1, BMI2, LZCNT, MOVBE, and
//          x86-64-v2's SSE4.2, POPCNT, ...), with the YMM state enabled by
//          the OS.
//   kAvx512: x86-64-v4 (AVX-512 F, BW, CD, DQ, VL) on top, with the opmask
//            and ZMM state enabled by the OS.
enum class CpuLevel : uint8_t { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };
inline constexpr int kNumCpuLevels = 3;

// "baseline", "avx2", "avx512".
const char* CpuLevelName(CpuLevel level);
// The inverse of CpuLevelName; nullopt for anything else.
std::optional<CpuLevel> ParseCpuLevel(std::string_view name);

struct CpuFeatures {
  bool clflush = false;
  bool clflushopt = false;
  bool clwb = false;
  bool movdir64b = false;
  // Enhanced rep movsb (cpuid 7.0 ebx bit 9): a string copy of a few KiB
  // stores whole lines without reading them for ownership first.
  bool erms = false;
  // x86-64-v2
  bool sse3 = false;
  bool ssse3 = false;
  bool sse41 = false;
  bool sse42 = false;
  bool popcnt = false;
  bool cx16 = false;
  bool lahf = false;
  // x86-64-v3
  bool avx = false;
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool bmi1 = false;
  bool bmi2 = false;
  bool lzcnt = false;
  bool movbe = false;
  bool osxsave = false;  // xgetbv may be executed
  // x86-64-v4
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512cd = false;
  bool avx512dq = false;
  bool avx512vl = false;
  // XCR0 (xgetbv 0): the register state the OS saves; 0 without OSXSAVE.
  // An AVX instruction faults unless the OS enabled its state, whatever
  // cpuid says.
  uint64_t xcr0 = 0;
  // Best instruction to write a line back (clwb keeps the line cached).
  FlushInstruction writeback = FlushInstruction::kNone;
  // Best instruction to drop a line (clwb does not invalidate).
  FlushInstruction invalidate = FlushInstruction::kNone;
  // The highest vector level the CPU and the OS support (MaxCpuLevel).
  CpuLevel max_level = CpuLevel::kBaseline;
};

const CpuFeatures& GetCpuFeatures();

const char* FlushInstructionName(FlushInstruction f);

// The highest level whose every instruction set `f` has and whose register
// state the OS enables (f.xcr0).
CpuLevel MaxCpuLevel(const CpuFeatures& f);

// Why `f` does not reach `level`: the missing features, e.g. "avx512bw,
// ZMM state not enabled by the OS"; "" when it does.
std::string MissingForCpuLevel(const CpuFeatures& f, CpuLevel level);

struct CpuLevelChoice {
  CpuLevel level = CpuLevel::kBaseline;
  // Set when the request was above `supported` and was lowered to it.
  std::string warning;
};

// The level to run at: `requested` (CXLRT_CPU_LEVEL), which may only lower
// the level; a request above `supported` is clamped to it with a warning
// that names both (a job's environment may be shared by machines of
// different CPUs: the request is a ceiling, never a reason to fail).
// nullopt: `supported`.
CpuLevelChoice ChooseCpuLevel(CpuLevel supported, std::optional<CpuLevel> requested);

// The level every CPU kernel of this process runs at: ChooseCpuLevel of
// GetCpuFeatures().max_level and CXLRT_CPU_LEVEL, chosen on first use and
// fixed for the life of the process (a clamp is logged once, as a warning).
CpuLevel ActiveCpuLevel();

// The level CXLRT_CPU_LEVEL asks for; nullopt: auto (unset, "auto", or a
// bad value, which ConfigStatus() reports).
std::optional<CpuLevel> RequestedCpuLevel();
// The same, read from `getenv` (tests); kInvalidArgument for a bad value.
absl::StatusOr<std::optional<CpuLevel>> RequestedCpuLevel(const Getenv& getenv);

// Picks a kernel family's entry for ActiveCpuLevel(). Dispatchers call it
// once and keep the result.
template <typename Fn>
Fn ForActiveCpuLevel(const Fn (&by_level)[kNumCpuLevels]) {
  return by_level[static_cast<int>(ActiveCpuLevel())];
}

}  // namespace cxlrt::runtime
