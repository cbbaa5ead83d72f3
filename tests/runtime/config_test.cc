#include "cxlrt/runtime/config.h"

#include <fstream>
#include <map>
#include <sstream>

#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace cxlrt::runtime {
namespace {

absl::StatusOr<Config> Parse(std::map<std::string, std::string> env) {
  return ParseConfig([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(ConfigTest, DefaultsWhenNothingIsSet) {
  auto c = Parse({});
  CXLRT_ASSERT_OK(c);
  EXPECT_EQ(c->lease_ms, 2000u);
  EXPECT_EQ(c->heartbeat_ms, 100u);
  EXPECT_EQ(c->host_id, -1);
  EXPECT_EQ(c->shm_dir, "/dev/shm");
  EXPECT_EQ(c->cuda_reduce, "staged");
  EXPECT_EQ(c->cuda_kv_copy, "engine");
  EXPECT_EQ(c->cuda_doorbell, "host");
  EXPECT_FALSE(c->comm_slot_bytes_set);  // so a GPU communicator may choose its slots
}

TEST(ConfigTest, ReadsEveryVariable) {
  auto c = Parse({{"CXLRT_POOL", "emu://x?size=8M"},
                  {"CXLRT_HOST_ID", "3"},
                  {"CXLRT_SLOTS_PER_HOST", "4"},
                  {"CXLRT_FAULT", "pool.create.before_magic:crash"},
                  {"CXLRT_LEASE_MS", "500"},
                  {"CXLRT_HEARTBEAT_MS", "50"},
                  {"CXLRT_LOCK_TIMEOUT_MS", "100"},
                  {"CXLRT_WAIT_SPINS", "0"},
                  {"CXLRT_SHM_DIR", "/tmp"},
                  {"CXLRT_LOG_LEVEL", "debug"},
                  {"CXLRT_COMM_SLOT_BYTES", "8192"},
                  {"CXLRT_CUDA_REDUCE", "mapped"},
                  {"CXLRT_CUDA_KV_COPY", "kernel"},
                  {"CXLRT_CUDA_DOORBELL", "copy"}});
  CXLRT_ASSERT_OK(c);
  EXPECT_EQ(c->pool, "emu://x?size=8M");
  EXPECT_EQ(c->host_id, 3);
  EXPECT_EQ(c->slots_per_host, 4u);
  EXPECT_EQ(c->fault, "pool.create.before_magic:crash");
  EXPECT_EQ(c->lease_ms, 500u);
  EXPECT_EQ(c->heartbeat_ms, 50u);
  EXPECT_EQ(c->lock_timeout_ms, 100u);
  EXPECT_EQ(c->wait_spins, 0u);
  EXPECT_EQ(c->shm_dir, "/tmp");
  EXPECT_EQ(c->log_level, "debug");
  EXPECT_EQ(c->comm_slot_bytes, 8192u);
  EXPECT_TRUE(c->comm_slot_bytes_set);
  EXPECT_EQ(c->cuda_reduce, "mapped");
  EXPECT_EQ(c->cuda_kv_copy, "kernel");
  EXPECT_EQ(c->cuda_doorbell, "copy");
}

TEST(ConfigTest, BadValuesNameTheVariable) {
  CXLRT_EXPECT_ERROR(Parse({{"CXLRT_LEASE_MS", "2s"}}), absl::StatusCode::kInvalidArgument,
                     "CXLRT_LEASE_MS='2s'");
  CXLRT_EXPECT_ERROR(Parse({{"CXLRT_HOST_ID", "-5"}}), absl::StatusCode::kInvalidArgument,
                     "CXLRT_HOST_ID='-5'");
  CXLRT_EXPECT_ERROR(Parse({{"CXLRT_LOG_LEVEL", "loud"}}), absl::StatusCode::kInvalidArgument,
                     "CXLRT_LOG_LEVEL='loud'");
  CXLRT_EXPECT_ERROR(Parse({{"CXLRT_CUDA_REDUCE", "fast"}}), absl::StatusCode::kInvalidArgument,
                     "CXLRT_CUDA_REDUCE='fast' is not staged or mapped");
  CXLRT_EXPECT_ERROR(Parse({{"CXLRT_CUDA_KV_COPY", "dma"}}), absl::StatusCode::kInvalidArgument,
                     "CXLRT_CUDA_KV_COPY='dma' is not engine or kernel");
  CXLRT_EXPECT_ERROR(Parse({{"CXLRT_LEASE_MS", "100"}, {"CXLRT_HEARTBEAT_MS", "60"}}),
                     absl::StatusCode::kInvalidArgument, "below half of CXLRT_LEASE_MS");
}

// The README documents the same table: a variable added here and not there
// (or the other way round) fails this test.
TEST(ConfigTest, ReadmeDocumentsEveryVariableInOneTable) {
  std::ifstream in(CXLRT_SOURCE_DIR "/README.md");
  ASSERT_TRUE(in) << "README.md not found";
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string readme = ss.str();
  for (const ConfigVar& v : ConfigTable()) {
    std::string row = absl::StrCat("| `", v.name, "` | `", v.default_value, "` |");
    EXPECT_NE(readme.find(row), std::string::npos) << "README.md lacks the row starting " << row;
  }
  // And no CXLRT_ variable in the README's table that the code does not read.
  std::istringstream lines(readme);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("| `CXLRT_", 0) != 0) continue;
    std::string name = line.substr(3, line.find('`', 3) - 3);
    bool known = false;
    for (const ConfigVar& v : ConfigTable()) known |= name == v.name;
    EXPECT_TRUE(known) << "README.md documents " << name << ", which config.cc does not read";
  }
}

}  // namespace
}  // namespace cxlrt::runtime
