#include "cxlrt/runtime/uri.h"

#include "cxlrt/runtime/units.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace cxlrt::runtime {
namespace {

TEST(UriTest, ParsesEveryEmuParameter) {
  auto uri =
      ParsePoolUri("emu://job1?size=4G&node=1&coherence=software&dir=/tmp/x&mode=0660&hosts=8");
  CXLRT_ASSERT_OK(uri);
  EXPECT_EQ(uri->scheme, PoolScheme::kEmu);
  EXPECT_EQ(uri->name, "job1");
  EXPECT_EQ(uri->size, 4ull << 30);
  EXPECT_EQ(uri->node, 1);
  EXPECT_EQ(uri->coherence, CoherenceDomain::kSoftware);
  EXPECT_EQ(uri->dir, "/tmp/x");
  EXPECT_EQ(uri->mode, 0660u);
  EXPECT_EQ(uri->hosts, 8u);
  EXPECT_EQ(uri->Identity(), "emu://job1");
}

TEST(UriTest, CanonicalTextParsesBackToTheSameUri) {
  const char* text =
      "emu://a.b-c_d?size=268435456&node=0&coherence=simulated&dir=/d&mode=0600&hosts=3";
  auto uri = ParsePoolUri(text);
  CXLRT_ASSERT_OK(uri);
  EXPECT_EQ(uri->ToString(), text);
  auto again = ParsePoolUri(uri->ToString());
  CXLRT_ASSERT_OK(again);
  EXPECT_EQ(again->ToString(), text);
}

TEST(UriTest, PrefaultIsPerOpenAndRoundTrips) {
  auto uri = ParsePoolUri("emu://p?size=8M&prefault=0");
  CXLRT_ASSERT_OK(uri);
  EXPECT_EQ(uri->prefault, false);
  EXPECT_EQ(uri->ToString(), "emu://p?size=8388608&prefault=0");
  EXPECT_EQ(uri->ForOpeners(), "emu://p?prefault=0");
  EXPECT_FALSE(ParsePoolUri("emu://p").value().prefault.has_value());
  CXLRT_EXPECT_ERROR(ParsePoolUri("emu://p?prefault=yes"), absl::StatusCode::kInvalidArgument,
                     "prefault 'yes' is not 0");
}

TEST(UriTest, LazyReservationIsForCreatorsAndExcludesPrefault) {
  auto uri = ParsePoolUri("emu://p?size=8M&reserve=lazy");
  CXLRT_ASSERT_OK(uri);
  EXPECT_EQ(uri->reserve_lazy, true);
  EXPECT_EQ(uri->ToString(), "emu://p?size=8388608&reserve=lazy");
  EXPECT_EQ(uri->ForOpeners(), "emu://p");
  EXPECT_EQ(ParsePoolUri("emu://p?reserve=all").value().reserve_lazy, false);
  CXLRT_EXPECT_ERROR(ParsePoolUri("emu://p?reserve=later"), absl::StatusCode::kInvalidArgument,
                     "reserve 'later' is not all");
  CXLRT_EXPECT_ERROR(ParsePoolUri("emu://p?reserve=lazy&prefault=1"),
                     absl::StatusCode::kInvalidArgument, "reserve=lazy with prefault=1");
  CXLRT_EXPECT_ERROR(ParsePoolUri("dax:///dev/dax0.0?reserve=lazy"),
                     absl::StatusCode::kInvalidArgument, "reserve");
}

TEST(UriTest, DeviceAndModelParametersRoundTrip) {
  auto uri = ParsePoolUri("emu://m?size=8M&devices=4&model=switch&latency_ns=900&bw_gbps=12.5");
  CXLRT_ASSERT_OK(uri);
  EXPECT_EQ(uri->devices, 4u);
  EXPECT_EQ(uri->model, "switch");
  EXPECT_EQ(uri->latency_ns, 900u);
  EXPECT_EQ(uri->bw_gbps, 12.5);
  EXPECT_TRUE(uri->HasModel());
  auto again = ParsePoolUri(uri->ToString());
  CXLRT_ASSERT_OK(again);
  EXPECT_EQ(again->ToString(), uri->ToString());
  EXPECT_EQ(uri->ForOpeners(), "emu://m?model=switch&latency_ns=900&bw_gbps=12.5");
}

TEST(UriTest, BareNamesAndDefaults) {
  auto emu = ParsePoolUri("emu://demo");
  CXLRT_ASSERT_OK(emu);
  EXPECT_FALSE(emu->size.has_value());
  EXPECT_EQ(emu->CoherenceOrDefault(), CoherenceDomain::kHardware);
  auto dax = ParsePoolUri("dax:///dev/dax0.0");
  CXLRT_ASSERT_OK(dax);
  EXPECT_EQ(dax->scheme, PoolScheme::kDax);
  EXPECT_EQ(dax->name, "/dev/dax0.0");
  EXPECT_EQ(dax->CoherenceOrDefault(), CoherenceDomain::kSoftware);
}

TEST(UriTest, PercentEscapesAreDecoded) {
  auto uri = ParsePoolUri("emu://p?dir=/tmp/with%20space");
  CXLRT_ASSERT_OK(uri);
  EXPECT_EQ(uri->dir, "/tmp/with space");
}

struct BadUri {
  const char* text;
  const char* expected_in_message;
};

class BadUriTest : public ::testing::TestWithParam<BadUri> {};

TEST_P(BadUriTest, IsInvalidArgumentNamingTheBadPart) {
  CXLRT_EXPECT_ERROR(ParsePoolUri(GetParam().text), absl::StatusCode::kInvalidArgument,
                     GetParam().expected_in_message);
}

INSTANTIATE_TEST_SUITE_P(
    Uris, BadUriTest,
    ::testing::Values(
        BadUri{"", "no scheme"}, BadUri{"demo", "no scheme"},
        BadUri{"nfs://x", "unknown scheme 'nfs'"}, BadUri{"emu://", "pool name ''"},
        BadUri{"emu://.hidden", "pool name '.hidden'"}, BadUri{"emu://a/b", "pool name 'a/b'"},
        BadUri{"emu://x?size=", "parameter 'size' is empty"},
        BadUri{"emu://x?size=4Q", "unknown suffix 'Q'"},
        BadUri{"emu://x?size=0", "size must be above 0"},
        BadUri{"emu://x?size=99999999999T", "overflows"},
        BadUri{"emu://x?size=-1", "is not a byte count"},
        BadUri{"emu://x?sise=4G", "unknown parameter 'sise'"},
        BadUri{"emu://x?size=4G&size=8G", "parameter 'size' repeated"},
        BadUri{"emu://x?size", "parameter 'size' has no value"},
        BadUri{"emu://x?size=4G&", "stray '&'"}, BadUri{"emu://x?node=-1", "node '-1'"},
        BadUri{"emu://x?node=one", "node 'one'"},
        BadUri{"emu://x?coherence=weak", "coherence 'weak'"},
        BadUri{"emu://x?dir=relative", "dir 'relative' is not absolute"},
        BadUri{"emu://x?mode=0400", "mode '0400'"}, BadUri{"emu://x?mode=0999", "mode '0999'"},
        BadUri{"emu://x?hosts=0", "hosts '0'"}, BadUri{"emu://x?hosts=5000", "hosts '5000'"},
        BadUri{"emu://x?dir=%zz", "%-escape"}, BadUri{"dax://dev/dax0.0", "absolute device path"},
        BadUri{"dax:///dev/dax0.0?node=1", "unknown parameter 'node'"},
        BadUri{"emu://x?devices=0", "devices '0'"}, BadUri{"emu://x?devices=17", "devices '17'"},
        BadUri{"emu://x?latency_ns=-1", "latency_ns '-1'"},
        BadUri{"emu://x?bw_gbps=0", "bw_gbps '0'"}, BadUri{"emu://x?model=fast", "model 'fast'"},
        BadUri{"dax:///dev/dax0.0?latency_ns=5", "unknown parameter 'latency_ns'"}));

TEST(UnitsTest, ParsesSuffixes) {
  EXPECT_EQ(*ParseByteSize("4096"), 4096u);
  EXPECT_EQ(*ParseByteSize("4K"), 4096u);
  EXPECT_EQ(*ParseByteSize("256M"), 256ull << 20);
  EXPECT_EQ(*ParseByteSize("256MiB"), 256ull << 20);
  EXPECT_EQ(*ParseByteSize("4g"), 4ull << 30);
  EXPECT_EQ(*ParseByteSize("2T"), 2ull << 40);
  EXPECT_FALSE(ParseByteSize("1.5G").ok());
  EXPECT_FALSE(ParseByteSize("G").ok());
}

TEST(UnitsTest, FormatsExactAndApproximateSizes) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1000), "1000 B");
  EXPECT_EQ(FormatBytes(256ull << 20), "256 MiB");
  EXPECT_EQ(FormatBytes(3ull << 30), "3 GiB");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB (1536 B)");
}

}  // namespace
}  // namespace cxlrt::runtime
