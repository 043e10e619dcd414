#include "coordinator/job_queries.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace baton {
namespace {

TEST(HistoryPageSizeTest, DefaultsCutsAndRefuses) {
  struct Case {
    int64_t from_step, page_size;
    absl::StatusCode code;
    int64_t want;
  };
  const std::vector<Case> cases = {
      {0, 0, absl::StatusCode::kOk, 100},
      {5, 20, absl::StatusCode::kOk, 20},
      {0, 500, absl::StatusCode::kOk, 100},
      {-1, 0, absl::StatusCode::kInvalidArgument, 0},
      {0, -1, absl::StatusCode::kInvalidArgument, 0},
  };
  for (const Case& c : cases) {
    baton::v1::GetJobHistoryRequest r;
    r.set_from_step(c.from_step);
    r.set_page_size(c.page_size);
    const absl::StatusOr<int64_t> size = HistoryPageSize(r, 100);
    EXPECT_EQ(size.status().code(), c.code) << c.from_step << " " << c.page_size;
    if (size.ok()) EXPECT_EQ(*size, c.want);
  }
}

std::vector<baton::v1::StepProgress> Steps(int64_t first, int n) {
  std::vector<baton::v1::StepProgress> out(n);
  for (int i = 0; i < n; ++i) out[i].set_step(first + i);
  return out;
}

TEST(HistoryPageTest, TheExtraRowSaysWhereTheNextPageStarts) {
  const baton::v1::JobHistory full = HistoryPage("job-000001", Steps(3, 4), 3);
  EXPECT_EQ(full.job_id(), "job-000001");
  ASSERT_EQ(full.steps_size(), 3);
  EXPECT_EQ(full.steps(2).step(), 5);
  EXPECT_EQ(full.next_from_step(), 6);
  const baton::v1::JobHistory last = HistoryPage("job-000001", Steps(3, 2), 3);
  EXPECT_EQ(last.steps_size(), 2);
  EXPECT_EQ(last.next_from_step(), 0);
}

TEST(AssembleTraceTest, NamesEachRanksWorkerOrTheKeptSteps) {
  baton::v1::Job job;
  job.set_id("job-000001");
  job.add_workers("w-1");
  job.add_workers("w-2");
  const JobStore::TraceSteps kept{4, 9, 8};
  const absl::StatusOr<baton::v1::JobTrace> none = AssembleTrace(job, 2, kept, {});
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(none.status().message(),
            "job job-000001 has no trace of step 2: steps 4 to 9 are kept");
  std::vector<baton::v1::RankTrace> traces(3);
  traces[0].set_rank(1);
  traces[1].set_rank(0);
  traces[2].set_rank(7);  // not a rank of the job: no worker named
  const absl::StatusOr<baton::v1::JobTrace> t = AssembleTrace(job, 8, kept, traces);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->step(), 8);
  EXPECT_EQ(t->first_kept_step(), 4);
  EXPECT_EQ(t->last_kept_step(), 9);
  ASSERT_EQ(t->ranks_size(), 3);
  EXPECT_EQ(t->ranks(0).worker_id(), "w-2");
  EXPECT_EQ(t->ranks(1).worker_id(), "w-1");
  EXPECT_EQ(t->ranks(2).worker_id(), "");
}

}  // namespace
}  // namespace baton
