// The knob registry (cxlrt/runtime/knobs.h): every CXLRT_* knob the library
// declares, its parsing, its rules, and the README's table of them. This
// binary links every layer whole (tests/CMakeLists.txt), so it sees them all.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "cxlrt/collectives/comm_knobs.h"
#include "cxlrt/collectives/cuda/cuda_knobs.h"
#include "cxlrt/gpu/gpu_knobs.h"
#include "cxlrt/runtime/knobs.h"
#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace cxlrt::runtime {
namespace {

using Env = std::map<std::string, std::string>;

// Static objects are destroyed in the reverse order of their construction,
// so this probe, made before kExitKnob, is destroyed after it: armed, its
// destructor reads the knob as a cleanup guard at exit would, and writes
// what it read to `fd`.
struct ExitProbe {
  int fd = -1;
  ~ExitProbe();
} exit_probe;
const Knob<std::string> kExitKnob({"CXLRT_CONFIG_TEST_EXIT_KNOB", "default",
                                   "a knob this test reads after main returns"},
                                  "default", AnyText());
// Not one of the library's knobs (the README test would want a row).
[[maybe_unused]] const bool kExitKnobHidden = (kExitKnob.Unregister(), true);

ExitProbe::~ExitProbe() {
  if (fd < 0) return;
  const std::string v = kExitKnob.Get();
  (void)!write(fd, v.data(), v.size());
  close(fd);
}

Getenv From(const Env& env) {
  return [&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
}

// A good value of each knob, other than its default.
const Env& GoodValues() {
  static const Env kGood = {
      {"CXLRT_POOL", "emu://x?size=8M"}, {"CXLRT_HOST_ID", "3"},
      {"CXLRT_SLOTS_PER_HOST", "4"},     {"CXLRT_LEASE_MS", "500"},
      {"CXLRT_HEARTBEAT_MS", "50"},      {"CXLRT_LOCK_TIMEOUT_MS", "100"},
      {"CXLRT_WAIT_SPINS", "0"},         {"CXLRT_SHM_DIR", "/tmp"},
      {"CXLRT_LOG_LEVEL", "debug"},      {"CXLRT_FAULT", "pool.create.before_magic:crash"},
      {"CXLRT_COMM_TIMEOUT_MS", "1000"}, {"CXLRT_COMM_SLOT_BYTES", "8192"},
      {"CXLRT_COMM_P2P_BYTES", "65536"}, {"CXLRT_ALLREDUCE_ONESHOT_MAX", "0"},
      {"CXLRT_COMM_DEPTH", "8"},         {"CXLRT_COMM_CHUNK_BYTES", "1000"},
      {"CXLRT_AFFINITY", "0,1"},         {"CXLRT_CPU_LEVEL", "baseline"},
      {"CXLRT_CUDA_REDUCE", "mapped"},   {"CXLRT_CUDA_KV_COPY", "kernel"},
      {"CXLRT_CUDA_DOORBELL", "copy"},   {"CXLRT_SIM_STALE_WRITEBACK", "allow"},
      {"CXLRT_METRICS_SAMPLE", "1"},     {"CXLRT_METRICS_PUBLISH_MS", "250"},
      {"CXLRT_METRICS_PORT", "9464"},    {"CXLRT_METRICS_ADDR", "0.0.0.0"},
      {"CXLRT_TEST_BOOT_ID", "boot-2"},  {"CXLRT_TORCH_ASYNC", "1"},
      {"CXLRT_TORCH_JIT", "1"},          {"CXLRT_TORCH_BUILD_VERBOSE", "1"},
      {"CXLRT_TORCH_INTER_POD", "gloo"},
  };
  return kGood;
}

TEST(ConfigTest, DefaultsWhenNothingIsSet) {
  const Env none;
  CXLRT_EXPECT_OK(CheckKnobs(From(none)));
  EXPECT_EQ(*collectives::kCommTimeoutMs.Parse(From(none)), 60000u);
  EXPECT_EQ(*collectives::kCommSlotBytes.Parse(From(none)), 1u << 20);
  EXPECT_EQ(*collectives::kCommP2pBytes.Parse(From(none)), 0u);  // by the pool's size
  EXPECT_EQ(*collectives::kCommDepth.Parse(From(none)), 4u);
  EXPECT_EQ(*collectives::kCudaReduce.Parse(From(none)), "staged");
  EXPECT_EQ(*gpu::kCudaKvCopy.Parse(From(none)), "engine");
  EXPECT_EQ(*collectives::kCudaDoorbell.Parse(From(none)), "host");
  // An empty variable is unset.
  const Env empty = {{"CXLRT_COMM_DEPTH", ""}, {"CXLRT_LEASE_MS", ""}};
  CXLRT_EXPECT_OK(CheckKnobs(From(empty)));
  EXPECT_EQ(*collectives::kCommDepth.Parse(From(empty)), 4u);
}

TEST(ConfigTest, ReadsEveryVariable) {
  // Every knob has a good value here, so a knob added without one fails.
  for (const KnobBase* k : Knobs()) {
    EXPECT_TRUE(GoodValues().count(k->name())) << "no good value of " << k->name() << " here";
  }
  CXLRT_EXPECT_OK(CheckKnobs(From(GoodValues())));
  const Getenv good = From(GoodValues());
  EXPECT_EQ(*collectives::kCommTimeoutMs.Parse(good), 1000u);
  EXPECT_EQ(*collectives::kCommSlotBytes.Parse(good), 8192u);
  EXPECT_EQ(*collectives::kCommP2pBytes.Parse(good), 65536u);
  EXPECT_EQ(*collectives::kAllreduceOneshotMax.Parse(good), 0u);
  EXPECT_EQ(*collectives::kCommDepth.Parse(good), 8u);
  EXPECT_EQ(*collectives::kCommChunkBytes.Parse(good), 1000u);
  EXPECT_EQ(*collectives::kCudaReduce.Parse(good), "mapped");
  EXPECT_EQ(*gpu::kCudaKvCopy.Parse(good), "kernel");
  EXPECT_EQ(*collectives::kCudaDoorbell.Parse(good), "copy");
  EXPECT_TRUE(*kTorchAsync.Parse(good));
}

TEST(ConfigTest, BadValuesNameTheVariable) {
  auto check = [](Env env) { return CheckKnobs(From(env)); };
  CXLRT_EXPECT_ERROR(check({{"CXLRT_LEASE_MS", "2s"}}), absl::StatusCode::kInvalidArgument,
                     "CXLRT_LEASE_MS='2s' is not an integer in [10, 3600000]");
  CXLRT_EXPECT_ERROR(check({{"CXLRT_HOST_ID", "-5"}}), absl::StatusCode::kInvalidArgument,
                     "CXLRT_HOST_ID='-5'");
  CXLRT_EXPECT_ERROR(check({{"CXLRT_LOG_LEVEL", "loud"}}), absl::StatusCode::kInvalidArgument,
                     "CXLRT_LOG_LEVEL='loud' is not one of error, warning, info, debug");
  CXLRT_EXPECT_ERROR(check({{"CXLRT_CUDA_REDUCE", "fast"}}), absl::StatusCode::kInvalidArgument,
                     "CXLRT_CUDA_REDUCE='fast' is not staged or mapped");
  CXLRT_EXPECT_ERROR(check({{"CXLRT_CUDA_KV_COPY", "dma"}}), absl::StatusCode::kInvalidArgument,
                     "CXLRT_CUDA_KV_COPY='dma' is not engine or kernel");
  CXLRT_EXPECT_ERROR(check({{"CXLRT_COMM_DEPTH", "9"}}), absl::StatusCode::kInvalidArgument,
                     "CXLRT_COMM_DEPTH='9' is not an integer in [2, 8]");
  CXLRT_EXPECT_ERROR(check({{"CXLRT_AFFINITY", "first"}}), absl::StatusCode::kInvalidArgument,
                     "CXLRT_AFFINITY='first' is not auto, off or a comma-separated list");
  CXLRT_EXPECT_ERROR(check({{"CXLRT_PIN", "off"}}), absl::StatusCode::kInvalidArgument,
                     "CXLRT_PIN='off': the variable is now CXLRT_AFFINITY");
  CXLRT_EXPECT_ERROR(check({{"CXLRT_FAULT", "nowhere:crash"}}), absl::StatusCode::kInvalidArgument,
                     "CXLRT_FAULT: ");
  // A rule across knobs.
  CXLRT_EXPECT_ERROR(check({{"CXLRT_LEASE_MS", "100"}, {"CXLRT_HEARTBEAT_MS", "60"}}),
                     absl::StatusCode::kInvalidArgument, "below half of CXLRT_LEASE_MS");
}

TEST(ConfigTest, AKnobReadsTheEnvironmentOnceAndABadValueKeepsTheDefault) {
  setenv("CXLRT_CONFIG_TEST_KNOB", "7", 1);
  {
    const Knob<uint32_t> k({"CXLRT_CONFIG_TEST_KNOB", "3", "a knob of this test"}, 3,
                           UintIn(1, 10));
    EXPECT_EQ(FindKnob("CXLRT_CONFIG_TEST_KNOB"), &k);
    EXPECT_EQ(k.Get(), 7u);
    EXPECT_TRUE(k.IsSet());
    EXPECT_EQ(k.source(), KnobSource::kEnvironment);
    setenv("CXLRT_CONFIG_TEST_KNOB", "8", 1);
    EXPECT_EQ(k.Get(), 7u) << "read once";
    EXPECT_EQ(k.Current(), 8u) << "unless asked for the value now";
    k.Retire();
  }
  EXPECT_EQ(FindKnob("CXLRT_CONFIG_TEST_KNOB"), nullptr) << "a retired knob leaves it";

  setenv("CXLRT_CONFIG_TEST_KNOB", "11", 1);
  {
    const Knob<uint32_t> k({"CXLRT_CONFIG_TEST_KNOB", "3", "a knob of this test"}, 3,
                           UintIn(1, 10));
    EXPECT_EQ(k.Get(), 3u);
    EXPECT_FALSE(k.IsSet());
    EXPECT_EQ(k.ValueText(), "11");
    CXLRT_EXPECT_ERROR(k.status(), absl::StatusCode::kInvalidArgument,
                       "CXLRT_CONFIG_TEST_KNOB='11' is not an integer in [1, 10]");
    // What Pool::Open returns.
    CXLRT_EXPECT_ERROR(ConfigStatus(), absl::StatusCode::kInvalidArgument,
                       "CXLRT_CONFIG_TEST_KNOB='11'");
    k.Retire();
  }
  unsetenv("CXLRT_CONFIG_TEST_KNOB");
  CXLRT_EXPECT_OK(ConfigStatus());
}

TEST(ConfigTest, AKnobKeepsItsValueForStaticDestructorsThatRunAfterMain) {
  setenv("CXLRT_CONFIG_TEST_EXIT_KNOB", "from-env", 1);
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(p[0]);
    if (kExitKnob.Get() != "from-env") _exit(2);
    exit_probe.fd = p[1];
    std::exit(0);  // runs the static destructors, the knob's before the probe's
  }
  close(p[1]);
  std::string got;
  char buf[64];
  for (ssize_t n; (n = read(p[0], buf, sizeof(buf))) > 0;) got.append(buf, n);
  close(p[0]);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_EQ(got, "from-env") << "the knob was destroyed before a static destructor read it";
  unsetenv("CXLRT_CONFIG_TEST_EXIT_KNOB");
}

TEST(ConfigTest, EveryKnobHasAPrefixedNameOnceAndHelp) {
  std::set<std::string> names;
  for (const KnobBase* k : Knobs()) {
    EXPECT_EQ(std::string(k->name()).rfind("CXLRT_", 0), 0u) << k->name();
    EXPECT_TRUE(names.insert(k->name()).second) << k->name() << " is declared twice";
    EXPECT_GT(std::string(k->info().help).size(), 10u) << k->name();
  }
}

// The README's table is the registry's: a row per knob, reading
// | `NAME` | `default` | help | (the README may put code in backticks), and
// no row for a variable no knob declares.
TEST(ConfigTest, ReadmeDocumentsEveryKnobInOneTable) {
  std::ifstream in(CXLRT_SOURCE_DIR "/README.md");
  ASSERT_TRUE(in) << "README.md not found";
  std::stringstream ss;
  ss << in.rdbuf();
  std::map<std::string, std::string> rows;  // name: the row, backticks dropped
  std::istringstream lines(ss.str());
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("| `CXLRT_", 0) != 0) continue;
    rows[line.substr(3, line.find('`', 3) - 3)] = absl::StrReplaceAll(line, {{"`", ""}});
  }
  for (const KnobBase* k : Knobs()) {
    const std::string row = absl::StrCat("| `", k->name(), "` | `", k->info().default_text, "` | ",
                                         k->info().help, " |");
    auto it = rows.find(k->name());
    if (it == rows.end()) {
      ADD_FAILURE() << "README.md lacks the row\n" << row;
      continue;
    }
    EXPECT_EQ(it->second, absl::StrReplaceAll(row, {{"`", ""}}))
        << "README.md's row of " << k->name() << " differs from the knob's declaration:\n"
        << row;
  }
  for (const auto& [name, row] : rows) {
    EXPECT_NE(FindKnob(name), nullptr)
        << "README.md documents " << name << ", which no knob declares";
  }
}

}  // namespace
}  // namespace cxlrt::runtime
