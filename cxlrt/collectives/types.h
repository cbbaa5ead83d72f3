// Element types and reduction operations of the collectives, NCCL's set:
// int8 to uint64, fp16, bf16, fp32, fp64; sum, prod, min, max, avg.
// Thread-safe: constants and pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace cxlrt::collectives {

// IEEE binary16: 16 bits of storage, converted to and from float with
// round-to-nearest-even by the compiler's half type: _Float16 (g++, clang 15
// and later) or clang 14's storage-only __fp16, which cannot be a parameter
// or return type; hence a class over the bits rather than an alias.
struct Half {
#if defined(__clang__) && __clang_major__ < 15
  using Native = __fp16;
#else
  using Native = _Float16;
#endif
  uint16_t bits;

  Half() = default;
  explicit Half(float f) {
    const Native h = static_cast<Native>(f);
    std::memcpy(&bits, &h, sizeof bits);
  }
  explicit operator float() const {
    Native h;
    std::memcpy(&h, &bits, sizeof h);
    return static_cast<float>(h);
  }
};
static_assert(sizeof(Half) == 2);

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

// The collectives, as a call descriptor names them.
enum class CollKind : uint8_t {
  kAllReduce = 1,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kReduce,
  kGather,
  kScatter,
  kAllToAll,
  kBarrier,
  kAllToAllV,  // uneven all-to-all: counts and displacements per peer
};
const char* CollKindName(CollKind k);

// Slots (and post lines) per rank of a communicator (CommOptions::depth):
// a rank posts up to depth - 1 chunks ahead of the slowest peer's reads.
inline constexpr uint32_t kMinDepth = 2, kMaxDepth = 8;

// Bytes of one element. Inline: the CUDA library (cxlrt/collectives/cuda/),
// linked below this one, uses it too.
constexpr size_t SizeOf(DataType t) {
  switch (t) {
    case DataType::kInt8:
    case DataType::kUint8:
      return 1;
    case DataType::kFloat16:
    case DataType::kBfloat16:
      return 2;
    case DataType::kInt32:
    case DataType::kUint32:
    case DataType::kFloat32:
      return 4;
    case DataType::kInt64:
    case DataType::kUint64:
    case DataType::kFloat64:
      return 8;
  }
  return 1;
}
// "int8" ... "float64" (nccl-tests spells fp16/bf16 "half"/"bfloat16"; we
// take both when parsing). A value outside the enum (read from a peer's
// post) is "?".
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
