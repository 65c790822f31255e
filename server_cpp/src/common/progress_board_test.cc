#include "common/progress_board.h"

#include <gtest/gtest.h>

#include "common/manual_clock.h"

namespace tce {
namespace {

TEST(ProgressBoard, ShowsAnOperationWhileItsEntryLivesWithItsProgressAndTime) {
  ManualClock clock;
  ProgressBoard board(&clock);
  {
    ProgressBoard::Entry e = board.Begin(ProgressBoard::kPrefetch, "run1", "step200", "", 1000);
    e.SetTotal(4, 4000);
    clock.Advance(std::chrono::seconds(3));
    e.AddDone(1, 1000);
    e.AddDone(1, 0, /*failed=*/1);
    const std::vector<OperationProgress> ops = board.Running(true, 0);
    ASSERT_EQ(ops.size(), 1u);
    EXPECT_EQ(ops[0].kind, "prefetch");
    EXPECT_EQ(ops[0].job, "run1");
    EXPECT_EQ(ops[0].tag, "step200");
    EXPECT_EQ(ops[0].files_done, 2u);
    EXPECT_EQ(ops[0].files_failed, 1u);
    EXPECT_EQ(ops[0].files_total, 4u);
    EXPECT_EQ(ops[0].bytes_done, 1000u);
    EXPECT_EQ(ops[0].bytes_total, 4000u);
    EXPECT_DOUBLE_EQ(ops[0].elapsed_s, 3.0);
    EXPECT_EQ(ops[0].started_unix_ms, 1700000000000);
    ProgressBoard::Entry moved = std::move(e);  // a prefetch's entry moves with it between steps
    EXPECT_FALSE(e.active());
    e.AddDone(1, 1);  // the moved-from entry changes nothing
    EXPECT_EQ(board.Running(true, 0)[0].files_done, 2u);
  }
  EXPECT_TRUE(board.Running(true, 0).empty());  // finished: gone
}

TEST(ProgressBoard, ShowsAUserOnlyTheOperationsOfTheirJobs) {
  ProgressBoard board;
  ProgressBoard::Entry a = board.Begin(ProgressBoard::kPrefetch, "ja", "", "", 1000);
  ProgressBoard::Entry b = board.Begin(ProgressBoard::kRingRestore, "jb", "", "10.0.0.2:7070", 1001);
  ASSERT_EQ(board.Running(false, 1001).size(), 1u);
  EXPECT_EQ(board.Running(false, 1001)[0].job, "jb");
  EXPECT_EQ(board.Running(true, 0).size(), 2u);
  a.End();
  ASSERT_EQ(board.Running(true, 0).size(), 1u);
  EXPECT_EQ(board.Running(true, 0)[0].from, "10.0.0.2:7070");
}

}  // namespace
}  // namespace tce
