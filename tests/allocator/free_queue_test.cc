#include "cxlrt/allocator/internal/free_queue.h"

#include <cstdint>
#include <deque>
#include <random>

#include "gtest/gtest.h"

namespace cxlrt::allocator_internal {
namespace {

// The queue against std::deque: pushes and pops in random runs, through
// growth from the first 64 KiB mapping to huge-page ones and slides of the
// consumed front, with the same words in the same order throughout.
TEST(FreeQueueTest, KeepsOrderThroughGrowthAndSlides) {
  FreeQueue q;
  std::deque<uint64_t> model;
  std::mt19937_64 rng(7);
  uint64_t next = 1;
  // A backlog of a million words first: past the 4 MiB mapping.
  for (; next <= (1 << 20); ++next) {
    ASSERT_TRUE(q.Push(next));
    model.push_back(next);
  }
  for (int round = 0; round < 400; ++round) {
    const uint64_t pushes = rng() % 20000;
    for (uint64_t k = 0; k < pushes; ++k) {
      ASSERT_TRUE(q.Push(next));
      model.push_back(next++);
    }
    const size_t pops = model.empty() ? 0 : rng() % (model.size() + 1);
    q.PopFront(pops);
    model.erase(model.begin(), model.begin() + static_cast<std::ptrdiff_t>(pops));
    ASSERT_EQ(q.size(), model.size());
    ASSERT_EQ(q.empty(), model.empty());
    if (!model.empty()) {
      ASSERT_EQ(q[0], model.front()) << "round " << round;
      ASSERT_EQ(q[q.size() - 1], model.back()) << "round " << round;
      ASSERT_EQ(q[q.size() / 2], model[model.size() / 2]) << "round " << round;
    }
  }
}

TEST(FreeQueueTest, EraseIfKeepsTheRestInOrder) {
  FreeQueue q;
  for (uint64_t v = 0; v < 100000; ++v) ASSERT_TRUE(q.Push(v));
  q.PopFront(10);
  q.EraseIf([](uint64_t v) { return v % 3 != 0; });
  ASSERT_EQ(q.size(), (99999 - 12) / 3 + 1);  // 12, 15, ..., 99999
  for (size_t i = 0; i < q.size(); ++i) ASSERT_EQ(q[i], 12 + 3 * i);
  q.EraseIf([](uint64_t) { return true; });
  EXPECT_TRUE(q.empty());
  ASSERT_TRUE(q.Push(5));  // usable after
  EXPECT_EQ(q[0], 5u);
}

TEST(FreeQueueTest, MovesHandOverTheWords) {
  FreeQueue a;
  for (uint64_t v = 0; v < 20000; ++v) ASSERT_TRUE(a.Push(v));
  FreeQueue b(std::move(a));
  EXPECT_TRUE(a.empty());  // NOLINT(bugprone-use-after-move): moved-from is empty
  ASSERT_EQ(b.size(), 20000u);
  FreeQueue c;
  ASSERT_TRUE(c.Push(1));
  c = std::move(b);
  ASSERT_EQ(c.size(), 20000u);
  EXPECT_EQ(c[19999], 19999u);
}

}  // namespace
}  // namespace cxlrt::allocator_internal
