// What this CPU offers the coherence layer, read once with cpuid.
// Thread-safe (immutable after first use).
#pragma once

namespace cxlrt::runtime {

enum class FlushInstruction { kClwb, kClflushopt, kClflush, kNone };

struct CpuFeatures {
  bool clflush = false;
  bool clflushopt = false;
  bool clwb = false;
  bool movdir64b = false;
  bool sse42 = false;
  bool avx2 = false;
  bool avx512f = false;
  // Best instruction to write a line back (clwb keeps the line cached).
  FlushInstruction writeback = FlushInstruction::kNone;
  // Best instruction to drop a line (clwb does not invalidate).
  FlushInstruction invalidate = FlushInstruction::kNone;
};

const CpuFeatures& GetCpuFeatures();

const char* FlushInstructionName(FlushInstruction f);

}  // namespace cxlrt::runtime
