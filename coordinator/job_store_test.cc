#include "coordinator/job_store.h"

#include <sqlite3.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using baton::v1::Job;

std::string MakeTempDir() {
  std::string tmpl = testing::TempDir() + "/job_store_test.XXXXXX";
  char* dir = mkdtemp(tmpl.data());
  EXPECT_NE(dir, nullptr);
  return tmpl;
}

Job MakeJob(int64_t seq, baton::v1::JobState state = baton::v1::JOB_STATE_QUEUED,
            const std::string& submission = "") {
  Job job;
  job.set_id(absl::StrFormat("job-%06d", seq));
  job.set_submission_id(submission);
  job.set_state(state);
  job.mutable_spec()->set_name(absl::StrFormat("spec %d", seq));
  job.mutable_spec()->set_steps(static_cast<int>(seq));
  return job;
}

TEST(JobStoreTest, InsertGetPutRoundTrip) {
  auto store = JobStore::Open(":memory:");
  ASSERT_TRUE(store.ok()) << store.status();
  const int64_t seq = (*store)->NextSequence();
  EXPECT_EQ(seq, 1);
  Job job = MakeJob(seq, baton::v1::JOB_STATE_QUEUED, "sub-1");
  ASSERT_TRUE((*store)->Insert(seq, job).ok());

  auto got = (*store)->Get(job.id());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->SerializeAsString(), job.SerializeAsString());

  job.set_state(baton::v1::JOB_STATE_RUNNING);
  job.set_steps_done(7);
  ASSERT_TRUE((*store)->Put(job).ok());
  got = (*store)->Get(job.id());
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->state(), baton::v1::JOB_STATE_RUNNING);
  EXPECT_EQ(got->steps_done(), 7);

  auto found = (*store)->FindBySubmission("sub-1");
  ASSERT_TRUE(found.ok());
  ASSERT_TRUE(found->has_value());
  EXPECT_EQ((*found)->id(), job.id());
  found = (*store)->FindBySubmission("other");
  ASSERT_TRUE(found.ok());
  EXPECT_FALSE(found->has_value());
  found = (*store)->FindBySubmission("");
  ASSERT_TRUE(found.ok());
  EXPECT_FALSE(found->has_value());
}

TEST(JobStoreTest, UnknownAndDuplicateIds) {
  auto store = JobStore::Open(":memory:");
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->Get("job-000404").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*store)->Put(MakeJob(404)).code(), absl::StatusCode::kNotFound);

  ASSERT_TRUE((*store)->Insert(1, MakeJob(1, baton::v1::JOB_STATE_QUEUED, "same")).ok());
  // Same id, same sequence, same submission id: each refused.
  EXPECT_EQ((*store)->Insert(2, MakeJob(1)).code(), absl::StatusCode::kAlreadyExists);
  Job other = MakeJob(3);
  EXPECT_EQ((*store)->Insert(1, other).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ((*store)->Insert(4, MakeJob(4, baton::v1::JOB_STATE_QUEUED, "same")).code(),
            absl::StatusCode::kAlreadyExists);
  // Jobs without a submission id do not collide with each other.
  EXPECT_TRUE((*store)->Insert(5, MakeJob(5)).ok());
  EXPECT_TRUE((*store)->Insert(6, MakeJob(6)).ok());
  EXPECT_EQ(*(*store)->Count(), 3);
  EXPECT_EQ((*store)->NextSequence(), 7);
}

TEST(JobStoreTest, ListPagesNewestFirst) {
  auto store = JobStore::Open(":memory:");
  ASSERT_TRUE(store.ok());
  for (int i = 0; i < 7; ++i) {
    const int64_t seq = (*store)->NextSequence();
    ASSERT_TRUE((*store)->Insert(seq, MakeJob(seq)).ok());
  }
  std::vector<std::string> ids;
  std::string token;
  int pages = 0;
  do {
    auto page = (*store)->List(3, token);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_LE(page->jobs.size(), 3u);
    for (const Job& j : page->jobs) ids.push_back(j.id());
    token = page->next_page_token;
    ++pages;
    if (pages == 1) {
      // A job inserted after the first page does not shift the later ones.
      const int64_t seq = (*store)->NextSequence();
      ASSERT_TRUE((*store)->Insert(seq, MakeJob(seq)).ok());
    }
  } while (!token.empty() && pages < 10);
  EXPECT_EQ(pages, 3);
  EXPECT_EQ(ids, (std::vector<std::string>{"job-000007", "job-000006", "job-000005", "job-000004",
                                           "job-000003", "job-000002", "job-000001"}));

  auto all = (*store)->List(100, "");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->jobs.size(), 8u);
  EXPECT_EQ(all->jobs[0].id(), "job-000008");
  EXPECT_TRUE(all->next_page_token.empty());

  auto bad = (*store)->List(3, "not-a-token");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("page_token"), std::string::npos);
  EXPECT_EQ((*store)->List(0, "").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(JobStoreTest, PagesEndBeforeTheirBytesPassTheBound) {
  auto store = JobStore::Open(":memory:");
  ASSERT_TRUE(store.ok());
  for (int i = 0; i < 5; ++i) {
    const int64_t seq = (*store)->NextSequence();
    Job job = MakeJob(seq);
    job.mutable_spec()->mutable_data()->mutable_text()->set_inline_text(std::string(10000, 'a'));
    ASSERT_TRUE((*store)->Insert(seq, job).ok());
  }
  std::vector<std::string> ids;
  std::string token;
  int pages = 0;
  do {
    auto page = (*store)->List(50, token, /*max_bytes=*/25000);
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_EQ(page->jobs.size(), page->next_page_token.empty() ? 1u : 2u);
    for (const Job& j : page->jobs) ids.push_back(j.id());
    token = page->next_page_token;
  } while (!token.empty() && ++pages < 10);
  EXPECT_EQ(ids, (std::vector<std::string>{"job-000005", "job-000004", "job-000003", "job-000002",
                                           "job-000001"}));
  // A single job larger than the bound still comes, alone.
  auto one = (*store)->List(50, "", /*max_bytes=*/100);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->jobs.size(), 1u);
  EXPECT_FALSE(one->next_page_token.empty());
}

TEST(JobStoreTest, ReopenedFileKeepsEveryJob) {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/jobs.db";
  {
    auto store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    for (int i = 0; i < 3; ++i) {
      const int64_t seq = (*store)->NextSequence();
      ASSERT_TRUE((*store)
                      ->Insert(seq, MakeJob(seq, i == 1 ? baton::v1::JOB_STATE_RUNNING
                                                        : baton::v1::JOB_STATE_SUCCEEDED))
                      .ok());
    }
  }
  {
    auto store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_EQ(*(*store)->Count(), 3);
    auto job = (*store)->Get("job-000002");
    ASSERT_TRUE(job.ok());
    EXPECT_EQ(job->spec().name(), "spec 2");
    EXPECT_EQ((*store)->NextSequence(), 4);  // never reuses a number
    auto running = (*store)->ListInStates({baton::v1::JOB_STATE_RUNNING});
    ASSERT_TRUE(running.ok());
    ASSERT_EQ(running->size(), 1u);
    EXPECT_EQ((*running)[0].first, 2);
    EXPECT_EQ((*running)[0].second.id(), "job-000002");
  }
  std::filesystem::remove_all(dir);
}

TEST(JobStoreTest, TracesArePrunedToTheLatestSteps) {
  auto store = JobStore::Open(":memory:");
  ASSERT_TRUE(store.ok());
  for (int64_t step = 1; step <= 5; ++step) {
    for (int rank = 0; rank < (step == 5 ? 1 : 2); ++rank) {
      baton::v1::RankTrace t;
      t.set_rank(rank);
      t.set_end_ns(step * 10 + rank);
      ASSERT_TRUE((*store)->PutTrace("job-000001", step, t, /*keep_steps=*/3).ok());
    }
  }
  baton::v1::RankTrace other;
  ASSERT_TRUE((*store)->PutTrace("job-000002", 1, other, 3).ok());
  auto steps = (*store)->GetTraceSteps("job-000001", /*ranks=*/2);
  ASSERT_TRUE(steps.ok());
  EXPECT_EQ(steps->first, 3);
  EXPECT_EQ(steps->last, 5);
  EXPECT_EQ(steps->last_complete, 4);  // step 5 has one rank of two
  auto four = (*store)->GetTrace("job-000001", 4);
  ASSERT_TRUE(four.ok());
  ASSERT_EQ(four->size(), 2u);
  EXPECT_EQ((*four)[1].end_ns(), 41);
  EXPECT_TRUE((*store)->GetTrace("job-000001", 2)->empty());  // pruned
  EXPECT_EQ((*store)->GetTraceSteps("job-000002", 1)->last_complete, 1);
  EXPECT_EQ((*store)->GetTraceSteps("job-000003", 1)->last, 0);
}

baton::v1::StepProgress MakeStep(int64_t step, float loss) {
  baton::v1::StepProgress p;
  p.set_step(step);
  p.set_total_steps(10);
  p.set_loss(loss);
  p.set_samples_per_second(100.0 * static_cast<double>(step));
  p.set_tokens_per_second(1600.0 * static_cast<double>(step));
  p.mutable_duration()->set_nanos(static_cast<int32_t>(step) * 1000);
  baton::v1::StageTiming* t = p.add_stages();
  t->set_rank(0);
  t->set_worker_id("w-1");
  return p;
}

std::vector<int64_t> StepNumbers(const std::vector<baton::v1::StepProgress>& steps) {
  std::vector<int64_t> out;
  for (const auto& s : steps) out.push_back(s.step());
  return out;
}

TEST(JobStoreTest, StepsComeInStepOrderWithoutStagesAndARepeatReplacesTheRow) {
  auto store = JobStore::Open(":memory:");
  ASSERT_TRUE(store.ok());
  for (int64_t step : {3, 1, 2, 5}) {
    ASSERT_TRUE((*store)->PutStep("job-000001", MakeStep(step, 1.0f * step)).ok());
  }
  ASSERT_TRUE((*store)->PutStep("job-000002", MakeStep(1, 9.0f)).ok());
  // Step 2 trained again (after a recovery): its last run stays.
  ASSERT_TRUE((*store)->PutStep("job-000001", MakeStep(2, 0.25f)).ok());

  auto all = (*store)->GetSteps("job-000001", 0, 100);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(StepNumbers(*all), (std::vector<int64_t>{1, 2, 3, 5}));
  EXPECT_FLOAT_EQ((*all)[1].loss(), 0.25f);
  EXPECT_FLOAT_EQ((*all)[2].loss(), 3.0f);
  EXPECT_DOUBLE_EQ((*all)[3].samples_per_second(), 500.0);
  EXPECT_DOUBLE_EQ((*all)[3].tokens_per_second(), 8000.0);
  EXPECT_EQ((*all)[3].duration().nanos(), 5000);
  EXPECT_EQ((*all)[3].total_steps(), 10);
  for (const auto& s : *all) EXPECT_EQ(s.stages_size(), 0) << "step " << s.step();

  // Pages: from a step on, at most `limit` rows.
  EXPECT_EQ(StepNumbers(*(*store)->GetSteps("job-000001", 2, 2)), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(StepNumbers(*(*store)->GetSteps("job-000001", 4, 2)), (std::vector<int64_t>{5}));
  EXPECT_TRUE((*store)->GetSteps("job-000001", 6, 2)->empty());
  EXPECT_EQ(StepNumbers(*(*store)->GetSteps("job-000002", 1, 10)), (std::vector<int64_t>{1}));
  EXPECT_TRUE((*store)->GetSteps("job-000404", 1, 10)->empty());
  auto bad = (*store)->GetSteps("job-000001", 1, 0);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("limit"), std::string::npos) << bad.status();
}

// Runs `sql` on the file at `path` with SQLite directly; returns its error message ("" ok).
std::string RawSql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  std::string out;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) {
    out = db != nullptr ? sqlite3_errmsg(db) : "cannot open";
  } else {
    char* err = nullptr;
    if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
      out = err != nullptr ? err : "error";
    }
    sqlite3_free(err);
  }
  sqlite3_close(db);
  return out;
}

int64_t UserVersion(const std::string& path) {
  sqlite3* db = nullptr;
  sqlite3_stmt* st = nullptr;
  int64_t version = -1;
  if (sqlite3_open(path.c_str(), &db) == SQLITE_OK &&
      sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &st, nullptr) == SQLITE_OK &&
      sqlite3_step(st) == SQLITE_ROW) {
    version = sqlite3_column_int64(st, 0);
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  return version;
}

TEST(JobStoreTest, VersionTwoFilesGainTheStepsTableAndNewerOnesAreRefused) {
  const std::string dir = MakeTempDir();
  const std::string path = dir + "/jobs.db";
  {
    auto store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->Insert(1, MakeJob(1, baton::v1::JOB_STATE_SUCCEEDED)).ok());
    baton::v1::RankTrace t;
    ASSERT_TRUE((*store)->PutTrace("job-000001", 1, t, 10).ok());
  }
  // What a version-2 coordinator left: jobs and traces, no steps table.
  ASSERT_EQ(RawSql(path, "DROP TABLE steps; PRAGMA user_version=2;"), "");
  {
    auto store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_EQ((*store)->Get("job-000001")->state(), baton::v1::JOB_STATE_SUCCEEDED);
    EXPECT_EQ((*store)->GetTrace("job-000001", 1)->size(), 1u);
    EXPECT_TRUE((*store)->GetSteps("job-000001", 1, 10)->empty());  // no history before v3
    ASSERT_TRUE((*store)->PutStep("job-000001", MakeStep(1, 2.5f)).ok());
    EXPECT_EQ(StepNumbers(*(*store)->GetSteps("job-000001", 1, 10)), (std::vector<int64_t>{1}));
  }
  {
    // Upgraded for good: version 3, the step still there.
    EXPECT_EQ(UserVersion(path), 3);
    auto store = JobStore::Open(path);
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_FLOAT_EQ((*(*store)->GetSteps("job-000001", 1, 10))[0].loss(), 2.5f);
  }
  ASSERT_EQ(RawSql(path, "PRAGMA user_version=4;"), "");
  auto newer = JobStore::Open(path);
  EXPECT_EQ(newer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(newer.status().message().find("schema version 4, newer than this coordinator's 3"),
            std::string::npos)
      << newer.status();
  std::filesystem::remove_all(dir);
}

TEST(JobStoreTest, CountsJobsByState) {
  auto store = JobStore::Open(":memory:");
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->Insert(1, MakeJob(1)).ok());
  ASSERT_TRUE((*store)->Insert(2, MakeJob(2, baton::v1::JOB_STATE_RUNNING)).ok());
  ASSERT_TRUE((*store)->Insert(3, MakeJob(3, baton::v1::JOB_STATE_RUNNING)).ok());
  auto counts = (*store)->CountByState();
  ASSERT_TRUE(counts.ok());
  EXPECT_EQ(counts->size(), 2u);
  EXPECT_EQ(counts->at(baton::v1::JOB_STATE_QUEUED), 1);
  EXPECT_EQ(counts->at(baton::v1::JOB_STATE_RUNNING), 2);
}

TEST(JobStoreTest, OpenErrorsNameTheFile) {
  auto store = JobStore::Open("/nonexistent-dir/for/sure/jobs.db");
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("/nonexistent-dir/for/sure/jobs.db"), std::string::npos)
      << store.status();
}

}  // namespace
}  // namespace baton
