// The server's slots (slot_table.h): which slot a request takes, and what each remembers.
#include "server/slot_table.h"

#include <gtest/gtest.h>

#include <vector>

namespace hablar::server {
namespace {

TEST(SlotTable, ARequestedSlotIsTakenEvenWhenBusy) {
  SlotTable t(3);
  EXPECT_EQ(t.acquire(2, std::vector<int32_t>{1, 2}), 2);
  EXPECT_EQ(t.acquire(2, std::vector<int32_t>{1, 2}), 2);  // llama-server would queue it
  EXPECT_TRUE(t.state(2).processing);
  t.release(2, std::vector<int32_t>{1, 2, 3});
  EXPECT_TRUE(t.state(2).processing);  // one request still runs on it
  t.release(2, std::vector<int32_t>{1, 2, 3, 4});
  EXPECT_FALSE(t.state(2).processing);
  EXPECT_EQ(t.history(2), (std::vector<int32_t>{1, 2, 3, 4}));  // the last to end sets it
}

TEST(SlotTable, AnIdleSlotSharingTheLongestPrefixIsPicked) {
  SlotTable t(3);
  for (int32_t s = 0; s < 3; ++s) t.release(t.acquire(s, {}), std::vector<int32_t>{s, 7, 8, 9});
  EXPECT_EQ(t.acquire(-1, std::vector<int32_t>{1, 7, 8, 5}), 1);
  // Slot 1 now busy: of the idle ones none shares a token, so the least recently used (0).
  EXPECT_EQ(t.acquire(-1, std::vector<int32_t>{1, 7}), 0);
  EXPECT_EQ(t.acquire(-1, std::vector<int32_t>{1, 7}), 2);
  // All busy: the least recently used, busy or not.
  EXPECT_EQ(t.acquire(-1, std::vector<int32_t>{2, 7}), 1);
}

TEST(SlotTable, ARequestThatComputedNothingLeavesTheHistory) {
  SlotTable t(2);
  t.release(t.acquire(0, {}), std::vector<int32_t>{4, 5, 6});
  t.release(t.acquire(0, std::vector<int32_t>{9}), {});  // e.g. cancelled while queued
  EXPECT_EQ(t.history(0), (std::vector<int32_t>{4, 5, 6}));
  const int32_t s = t.acquire(1, {});
  t.abandon(s);  // it could not start
  EXPECT_FALSE(t.state(1).processing);
  EXPECT_TRUE(t.history(1).empty());
  t.set_history(1, {1, 2});
  EXPECT_EQ(t.state(1).n_history, 2);
}

}  // namespace
}  // namespace hablar::server
