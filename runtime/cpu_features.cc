#include "runtime/cpu_features.h"

#include <cpuid.h>

namespace cxlrt::runtime {
namespace {

CpuFeatures Detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d)) {
    f.clflush = d & (1u << 19);
    f.sse42 = c & (1u << 20);
  }
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = b & (1u << 5);
    f.avx512f = b & (1u << 16);
    f.clflushopt = b & (1u << 23);
    f.clwb = b & (1u << 24);
    f.movdir64b = c & (1u << 28);
  }
  f.writeback = f.clwb         ? FlushInstruction::kClwb
                : f.clflushopt ? FlushInstruction::kClflushopt
                : f.clflush    ? FlushInstruction::kClflush
                               : FlushInstruction::kNone;
  f.invalidate = f.clflushopt ? FlushInstruction::kClflushopt
                 : f.clflush  ? FlushInstruction::kClflush
                              : FlushInstruction::kNone;
  return f;
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

}  // namespace cxlrt::runtime
