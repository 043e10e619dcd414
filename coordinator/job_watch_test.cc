#include "coordinator/job_watch.h"

#include <memory>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace baton {
namespace {

baton::v1::JobEvent State(baton::v1::JobState state) {
  baton::v1::JobEvent e;
  e.mutable_state_change()->set_state(state);
  return e;
}

baton::v1::JobEvent Step(int64_t step) {
  baton::v1::JobEvent e;
  e.mutable_step()->set_step(step);
  return e;
}

TEST(JobWatchTest, FirstTheCurrentStateThenWhatFollowsTheCursor) {
  auto log = std::make_shared<JobEventLog>();
  log->Append(Step(1));  // before the watch: not seen
  JobWatch watch(log, log->End(), State(baton::v1::JOB_STATE_RUNNING));
  log->Append(Step(2));
  bool done = false;
  absl::StatusOr<std::vector<baton::v1::JobEvent>> got = watch.Next(absl::ZeroDuration(), &done);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->size(), 1u);
  EXPECT_EQ((*got)[0].state_change().state(), baton::v1::JOB_STATE_RUNNING);
  EXPECT_FALSE(done);
  got = watch.Next(absl::ZeroDuration(), &done);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->size(), 1u);
  EXPECT_EQ((*got)[0].step().step(), 2);
  EXPECT_FALSE(done);
  // Nothing new: an empty list once the timeout passed.
  got = watch.Next(absl::Milliseconds(1), &done);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->empty());
  EXPECT_FALSE(done);
}

TEST(JobWatchTest, DoneAfterTheTerminalStateAndNothingFollows) {
  auto log = std::make_shared<JobEventLog>();
  JobWatch watch(log, log->End(), State(baton::v1::JOB_STATE_RUNNING));
  bool done = false;
  ASSERT_TRUE(watch.Next(absl::ZeroDuration(), &done).ok());
  log->Append(Step(1));
  log->Append(State(baton::v1::JOB_STATE_SUCCEEDED));
  log->Close();
  absl::StatusOr<std::vector<baton::v1::JobEvent>> got = watch.Next(absl::Seconds(5), &done);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->size(), 2u);
  EXPECT_TRUE(done);
  got = watch.Next(absl::Seconds(5), &done);
  ASSERT_TRUE(got.ok());
  EXPECT_TRUE(got->empty());
  EXPECT_TRUE(done);
}

TEST(JobWatchTest, AWatchOfAnEndedJobReturnsItsLastStateAndIsDone) {
  auto log = std::make_shared<JobEventLog>();
  log->Close();
  JobWatch watch(log, 0, State(baton::v1::JOB_STATE_FAILED));
  bool done = false;
  absl::StatusOr<std::vector<baton::v1::JobEvent>> got = watch.Next(absl::Seconds(5), &done);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->size(), 1u);
  EXPECT_TRUE(done);
}

TEST(JobWatchTest, StoppingWakesAWaitingWatcherWithUnavailable) {
  auto log = std::make_shared<JobEventLog>();
  JobWatch watch(log, log->End(), State(baton::v1::JOB_STATE_RUNNING));
  bool done = false;
  ASSERT_TRUE(watch.Next(absl::ZeroDuration(), &done).ok());
  std::thread stopper([log] { log->Stop(); });
  absl::StatusOr<std::vector<baton::v1::JobEvent>> got = watch.Next(absl::Seconds(30), &done);
  stopper.join();
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnavailable);
}

TEST(JobWatchTest, ASlowWatcherSkipsTheOldestEvents) {
  auto log = std::make_shared<JobEventLog>();
  JobWatch watch(log, log->End(), State(baton::v1::JOB_STATE_RUNNING));
  bool done = false;
  ASSERT_TRUE(watch.Next(absl::ZeroDuration(), &done).ok());
  const int64_t n = JobEventLog::kMaxBufferedEvents + 10;
  for (int64_t s = 1; s <= n; ++s) log->Append(Step(s));
  EXPECT_EQ(log->End(), n);
  absl::StatusOr<std::vector<baton::v1::JobEvent>> got = watch.Next(absl::ZeroDuration(), &done);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->size(), JobEventLog::kMaxBufferedEvents);
  EXPECT_EQ(got->front().step().step(), 11);
  EXPECT_EQ(got->back().step().step(), n);
}

}  // namespace
}  // namespace baton
