// Element types and reduction operations of the collectives, NCCL's set:
// int8 to uint64, fp16, bf16, fp32, fp64; sum, prod, min, max, avg.
// Thread-safe: constants and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace cxlrt::collectives {

// IEEE binary16 as a C++ type: _Float16 (g++, clang 15 and later), else
// clang's storage-only __fp16, which converts to and from float with the
// same round-to-nearest-even (clang 14 has no _Float16 on x86).
#if defined(__clang__) && __clang_major__ < 15
using Half = __fp16;
#else
using Half = _Float16;
#endif

enum class DataType : uint8_t {
  kInt8,
  kUint8,
  kInt32,
  kUint32,
  kInt64,
  kUint64,
  kFloat16,
  kBfloat16,
  kFloat32,
  kFloat64,
};
inline constexpr int kNumDataTypes = 10;

enum class RedOp : uint8_t { kSum, kProd, kMin, kMax, kAvg };
inline constexpr int kNumRedOps = 5;

// Bytes of one element.
size_t SizeOf(DataType t);
// "int8" ... "float64" (nccl-tests spells fp16/bf16 "half"/"bfloat16"; we
// take both when parsing).
const char* DataTypeName(DataType t);
const char* RedOpName(RedOp op);
std::optional<DataType> ParseDataType(absl::string_view name);
std::optional<RedOp> ParseRedOp(absl::string_view name);

// out[i] = srcs[0][i] op srcs[1][i] op ... op srcs[n-1][i], in that order
// (so every rank that reduces the same sources gets the same bits); avg
// divides the sum by `avg_divisor`. 16-bit floats accumulate in fp32 and
// round once; integers wrap. `out` may be one of the sources (the same
// pointer; partial overlaps are not supported).
// REQUIRES: n >= 1; buffers of `count` elements.
void Reduce(DataType t, RedOp op, void* out, const void* const* srcs, int n, size_t count,
            int avg_divisor);

}  // namespace cxlrt::collectives
