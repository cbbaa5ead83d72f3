// The device-DAX backend cannot be exercised without a device; these tests
// cover what can be: the refusals, and the size rules as a pure function.
#include "cxlrt/runtime/dax_backend.h"

#include <fstream>

#include "cxlrt/runtime/pool.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace cxlrt::runtime {
namespace {

TEST(DaxBackendTest, AMissingDeviceIsNotFound) {
  CXLRT_EXPECT_ERROR(Pool::Open("dax:///dev/dax97.3"), absl::StatusCode::kNotFound,
                     "no device-DAX device at /dev/dax97.3");
  CXLRT_EXPECT_ERROR(Pool::Create("dax:///dev/dax97.3?size=2M"), absl::StatusCode::kInvalidArgument,
                     "at least 4 MiB");
  CXLRT_EXPECT_ERROR(Pool::Create("dax:///dev/dax97.3?size=4M"), absl::StatusCode::kNotFound,
                     "/dev/dax97.3");
}

TEST(DaxBackendTest, ARegularFileIsNotADaxDevice) {
  ::cxlrt::testing::TempDir dir;
  const std::string path = dir.path() + "/file";
  std::ofstream(path) << "x";
  CXLRT_EXPECT_ERROR(Pool::Open("dax://" + path), absl::StatusCode::kInvalidArgument,
                     "is not a character device");
}

TEST(DaxBackendTest, AnotherCharacterDeviceIsNotADaxDevice) {
  CXLRT_EXPECT_ERROR(Pool::Open("dax:///dev/zero"), absl::StatusCode::kInvalidArgument,
                     "/dev/zero is a character device of subsystem 'mem', not device-DAX");
  CXLRT_EXPECT_ERROR(Pool::Destroy("dax:///dev/null", {.force = true}),
                     absl::StatusCode::kInvalidArgument, "not device-DAX");
}

TEST(DaxBackendTest, SizesFollowTheDeviceAlignment) {
  constexpr uint64_t k2M = 2u << 20;
  auto whole = ValidateDaxSize(std::nullopt, 64 * k2M, k2M, "/dev/dax0.0");
  CXLRT_ASSERT_OK(whole);
  EXPECT_EQ(*whole, 64 * k2M);
  EXPECT_EQ(*ValidateDaxSize(8 * k2M, 64 * k2M, k2M, "/dev/dax0.0"), 8 * k2M);
  CXLRT_EXPECT_ERROR(ValidateDaxSize(3u << 20, 64 * k2M, k2M, "/dev/dax0.0"),
                     absl::StatusCode::kInvalidArgument,
                     "size 3 MiB is not a multiple of the alignment of /dev/dax0.0 (2 MiB)");
  CXLRT_EXPECT_ERROR(ValidateDaxSize(128 * k2M, 64 * k2M, k2M, "/dev/dax0.0"),
                     absl::StatusCode::kInvalidArgument, "exceeds /dev/dax0.0 (128 MiB)");
  CXLRT_EXPECT_ERROR(ValidateDaxSize(std::nullopt, 64 * k2M, 3, "/dev/dax0.0"),
                     absl::StatusCode::kInvalidArgument, "not a power of two");
  CXLRT_EXPECT_ERROR(ValidateDaxSize(std::nullopt, k2M + 4096, k2M, "/dev/dax0.0"),
                     absl::StatusCode::kInvalidArgument, "not a multiple of its alignment");
  CXLRT_EXPECT_OK(ValidateDaxSize(1u << 30, 4ull << 30, 1u << 30, "/dev/dax1.0"));
}

// Found by the VM harness (tests/vm): a pool created smaller than its device
// could not be opened again ("header says the pool is 32 MiB but its backing
// holds 254 MiB"), because Open mapped the whole device.
TEST(DaxBackendTest, OpenMapsThePoolSizeItsHeaderRecords) {
  EXPECT_EQ(DaxOpenSize(32u << 20, 254u << 20, 2u << 20), 32u << 20);
  EXPECT_EQ(DaxOpenSize(254u << 20, 254u << 20, 2u << 20), 254u << 20);
}

TEST(DaxBackendTest, OpenMapsTheWholeDeviceWhenTheHeaderSizeCannotBeAPool) {
  EXPECT_EQ(DaxOpenSize(0, 254u << 20, 2u << 20), 254u << 20);           // no pool
  EXPECT_EQ(DaxOpenSize(1ull << 40, 254u << 20, 2u << 20), 254u << 20);  // too big
  EXPECT_EQ(DaxOpenSize(33u << 20, 254u << 20, 2u << 20), 254u << 20);   // unaligned
}

}  // namespace
}  // namespace cxlrt::runtime
