// Core affinity plans (cxlrt/runtime/affinity.h): auto, off, lists, and ranks that
// outnumber the allowed cores.
#include "cxlrt/runtime/affinity.h"

#include <sched.h>

#include "gtest/gtest.h"

namespace cxlrt::runtime {
namespace {

int AllowedCores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  return CPU_COUNT(&set);
}

int FirstAllowedCore() {
  cpu_set_t set;
  CPU_ZERO(&set);
  sched_getaffinity(0, sizeof(set), &set);
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) return c;
  }
  return -1;
}

TEST(AffinityTest, AutoPinsEachRankToItsOwnAllowedCore) {
  const int cores = AllowedCores();
  auto plan = PlanAffinity(cores, "");
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->cores.size(), static_cast<size_t>(cores));
  for (int r = 1; r < cores; ++r) EXPECT_LT(plan->cores[r - 1], plan->cores[r]);
  EXPECT_EQ(PlanAffinity(cores, "auto")->cores, plan->cores);
}

TEST(AffinityTest, AutoIsOffWhenRanksOutnumberCores) {
  auto plan = PlanAffinity(AllowedCores() + 1, "");
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->cores.empty());
  EXPECT_NE(plan->why.find("off"), std::string::npos) << plan->why;
}

TEST(AffinityTest, OffAndListsAreFollowedAndBadCoresRefused) {
  EXPECT_TRUE(PlanAffinity(2, "off")->cores.empty());
  const int c = FirstAllowedCore();
  auto plan = PlanAffinity(3, std::to_string(c));  // a list is reused round-robin
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->cores, (std::vector<int>{c, c, c}));
  auto bad = PlanAffinity(1, std::to_string(CPU_SETSIZE + 5));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlanAffinity(1, "x,1").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(AffinityTest, BindToCoreBindsTheCallingProcess) {
  cpu_set_t before;
  sched_getaffinity(0, sizeof(before), &before);
  const int c = FirstAllowedCore();
  ASSERT_TRUE(BindToCore(c).ok());
  cpu_set_t now;
  sched_getaffinity(0, sizeof(now), &now);
  EXPECT_EQ(CPU_COUNT(&now), 1);
  EXPECT_TRUE(CPU_ISSET(c, &now));
  sched_setaffinity(0, sizeof(before), &before);
}

}  // namespace
}  // namespace cxlrt::runtime
