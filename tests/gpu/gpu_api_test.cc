// The gpu/ layer's interface (cxlrt/gpu/) on any machine: without a GPU (or
// a build without CUDA) every pointer is host memory and calls that need a
// GPU say why. With a GPU, GPU memory is told from host and pool memory.
#include <vector>

#include "bench/gpu_timing.h"
#include "cxlrt/collectives/gpu_engine.h"
#include "cxlrt/gpu/dma_engine.h"
#include "cxlrt/gpu/gpu.h"
#include "cxlrt/gpu/memory.h"
#include "cxlrt/gpu/registration.h"
#include "cxlrt/runtime/pool.h"
#include "gtest/gtest.h"
#include "tests/testing/mem_buffer.h"
#include "tests/testing/test_util.h"

namespace cxlrt::gpu {
namespace {

using runtime::MemoryKind;

TEST(GpuApiTest, HostAndPoolMemoryAreNeverGpuMemory) {
  ::cxlrt::testing::TempDir dir;
  auto pool = runtime::Pool::Create(::cxlrt::testing::PoolUri(dir, "", "16M"));
  ASSERT_TRUE(pool.ok()) << pool.status();
  std::vector<uint8_t> heap(4096);
  int stack = 0;
  EXPECT_EQ(KindOf(heap.data()), MemoryKind::kHost);
  EXPECT_EQ(KindOf(&stack), MemoryKind::kHost);
  EXPECT_EQ(KindOf((*pool)->backend().base() + 8192), MemoryKind::kHost);
  EXPECT_EQ(KindOf(nullptr), MemoryKind::kHost);
}

TEST(GpuApiTest, WithoutAGpuEveryGpuCallSaysWhy) {
  if (GpuAvailable()) GTEST_SKIP() << "a GPU is present: gpu_test covers it";
  const std::string why = GpuUnavailableReason();
  EXPECT_FALSE(why.empty());
  ::cxlrt::testing::TempDir dir;
  auto pool = runtime::Pool::Create(::cxlrt::testing::PoolUri(dir, "", "16M"));
  ASSERT_TRUE(pool.ok()) << pool.status();
  uint8_t* base = (*pool)->backend().base();
  const uint64_t size = (*pool)->size();
  auto dma = MakeDmaEngine((*pool)->coherence(), base, size);
  ASSERT_FALSE(dma.ok());
  EXPECT_EQ(dma.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(std::string(dma.status().message()).find(why), std::string::npos) << dma.status();
  auto engine = collectives::MakeGpuCopyEngine((*pool)->coherence(), base, size);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(std::string(engine.status().message()).find(why), std::string::npos) << engine.status();
  EXPECT_EQ(PoolRegistration::Get(base, size).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(GpuAlloc(1024).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(PageLockedAlloc(1024).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(StreamCreate().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(CopySync(nullptr, nullptr, 0).code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(DescribeGpus(nullptr, 0).find("no device"), std::string::npos);
  // The benchmarks' and tests' GPU helpers say so too.
  EXPECT_EQ(::cxlrt::testing::FillPatternAsync(nullptr, 1, 1, 0, nullptr).code(),
            absl::StatusCode::kUnavailable);
  uint64_t flags[64] = {};
  for (bench::Doorbell d : bench::kDoorbells) {
    EXPECT_EQ(bench::TimePingPong(d, nullptr, nullptr, flags, flags + 32, 8, 1, 1).status().code(),
              absl::StatusCode::kUnavailable)
        << bench::DoorbellName(d);
  }
}

TEST(GpuApiTest, WithAGpuGpuMemoryIsToldApart) {
  if (!GpuAvailable()) GTEST_SKIP() << "no GPU: " << GpuUnavailableReason();
  auto d = GpuAlloc(1 << 20);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(KindOf(*d), MemoryKind::kGpu);
  EXPECT_EQ(KindOf(static_cast<uint8_t*>(*d) + 4096), MemoryKind::kGpu);
  auto p = PageLockedAlloc(4096);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(KindOf(*p), MemoryKind::kHost);
  GpuFree(*d);
  PageLockedFree(*p);
}

}  // namespace
}  // namespace cxlrt::gpu
