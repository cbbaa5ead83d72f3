#include "cxlrt/runtime/checksum.h"

#include <nmmintrin.h>

#include <array>
#include <cstring>

#include "cxlrt/runtime/cpu_features.h"
#include "cxlrt/runtime/internal/cpu_kernels.h"

namespace cxlrt::runtime {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
    t[i] = c;
  }
  return t;
}

constexpr auto kTable = MakeTable();

uint32_t Portable(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) crc = kTable[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc;
}

// Only reached at avx2 and up, whose CPUs all have SSE4.2.
__attribute__((target("sse4.2"))) uint32_t Hardware(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n--) c32 = _mm_crc32_u8(c32, *p++);
  return c32;
}

constexpr runtime_internal::Crc32cKernel kByLevel[kNumCpuLevels] = {Portable, Hardware, Hardware};

}  // namespace

uint32_t Crc32c(const void* data, size_t n, uint32_t crc) {
  static const runtime_internal::Crc32cKernel kernel = ForActiveCpuLevel(kByLevel);
  return ~kernel(data, n, ~crc);
}

}  // namespace cxlrt::runtime

namespace cxlrt::runtime_internal {

Crc32cKernel Crc32cKernelAt(runtime::CpuLevel level) {
  return runtime::kByLevel[static_cast<int>(level)];
}

}  // namespace cxlrt::runtime_internal
