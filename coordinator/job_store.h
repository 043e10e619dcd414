// JobStore: the coordinator's job records in one SQLite file.
//
// Every job record a serialized baton.v1.Job:
//   jobs(id TEXT PRIMARY KEY, seq INTEGER UNIQUE NOT NULL, submission_id TEXT UNIQUE NULL,
//        state INTEGER NOT NULL, job BLOB NOT NULL, updated_ns INTEGER NOT NULL)
// and the recent steps' action timelines, one serialized baton.v1.RankTrace per rank:
//   traces(job_id TEXT, step INTEGER, rank INTEGER, trace BLOB, PRIMARY KEY(job_id, step, rank))
// and every step's progress, one serialized baton.v1.StepProgress (without its per-rank
// timings) per step, kept for the job's whole life:
//   steps(job_id TEXT, step INTEGER, progress BLOB, PRIMARY KEY(job_id, step))
// `seq` orders jobs by submission (newest first in List); `submission_id` is NULL when the
// client gave none, so the UNIQUE constraint only binds real keys. The file runs in WAL
// mode with synchronous=NORMAL: every write is one transaction, so a crash leaves either
// the old or the new record, never half of one (an OS crash or power loss may lose the
// last transactions, never corrupt the file). One process owns the file; tools such as
// `sqlite3 FILE 'select id, state from jobs'` may read it while the coordinator runs.
//
// Thread-safe (one internal mutex around the connection). Every error is an absl::Status
// whose message names the file.
#ifndef BATON_COORDINATOR_JOB_STORE_H_
#define BATON_COORDINATOR_JOB_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "baton/v1/cluster.pb.h"
#include "baton/v1/jobs.pb.h"
#include "common/core/mutex.h"

struct sqlite3;

namespace baton {

class JobStore {
 public:
  // Opens (creating if missing) the database at `path`; ":memory:" gives a private
  // in-memory database (tests). Creates the schema when absent, and refuses a file
  // written by a newer schema version.
  static absl::StatusOr<std::unique_ptr<JobStore>> Open(const std::string& path);
  ~JobStore();
  JobStore(const JobStore&) = delete;
  JobStore& operator=(const JobStore&) = delete;

  const std::string& path() const { return path_; }

  // A fresh sequence number, larger than every one stored or handed out before (numbers
  // handed out but never inserted leave gaps). Job ids are formed from it.
  int64_t NextSequence();

  // Stores a new job under sequence number `seq`. ALREADY_EXISTS when the id, the
  // sequence number or the non-empty submission id is taken.
  absl::Status Insert(int64_t seq, const baton::v1::Job& job);
  // Replaces the stored record of an existing job (by job.id()); NOT_FOUND if there is none.
  // The submission id is fixed at Insert.
  absl::Status Put(const baton::v1::Job& job);

  // NOT_FOUND when there is no job with that id.
  absl::StatusOr<baton::v1::Job> Get(const std::string& id);
  // The job submitted with this (non-empty) submission id, or nullopt.
  absl::StatusOr<std::optional<baton::v1::Job>> FindBySubmission(const std::string& submission_id);

  struct Page {
    std::vector<baton::v1::Job> jobs;
    std::string next_page_token;  // empty when there are no more
  };
  // Newest first (by sequence). `page_size` must be >= 1; `page_token` is empty or a
  // next_page_token from an earlier List (an opaque string; INVALID_ARGUMENT naming
  // page_token otherwise). Jobs inserted after the first page do not disturb later pages.
  // A page also ends before its records would pass `max_bytes` (serialized), so a response
  // stays under gRPC's message limit however large jobs are; it holds at least one job.
  absl::StatusOr<Page> List(int page_size, const std::string& page_token,
                            int64_t max_bytes = INT64_MAX);

  // Every job in one of `states`, oldest first, with its sequence number (start-up
  // recovery).
  absl::StatusOr<std::vector<std::pair<int64_t, baton::v1::Job>>> ListInStates(
      const std::vector<baton::v1::JobState>& states);

  // How many jobs are stored.
  absl::StatusOr<int64_t> Count();
  // How many jobs are stored in each state (states with none are absent).
  absl::StatusOr<std::map<baton::v1::JobState, int64_t>> CountByState();

  // Stores one rank's timeline of `step` (replacing one stored before) and drops the job's
  // traces of steps <= step - keep_steps, in one transaction.
  absl::Status PutTrace(const std::string& job_id, int64_t step,
                        const baton::v1::RankTrace& trace, int64_t keep_steps);
  // The stored timelines of `step`, by rank (empty when none).
  absl::StatusOr<std::vector<baton::v1::RankTrace>> GetTrace(const std::string& job_id,
                                                             int64_t step);
  struct TraceSteps {
    int64_t first = 0;          // oldest step with any trace; 0 when none
    int64_t last = 0;           // newest step with any trace
    int64_t last_complete = 0;  // newest step with traces from `ranks` ranks; 0 when none
  };
  absl::StatusOr<TraceSteps> GetTraceSteps(const std::string& job_id, int ranks);

  // Stores `progress` as step progress.step() of the job (without its stages), replacing
  // what was stored for that step before (a step trained again after a recovery).
  absl::Status PutStep(const std::string& job_id, const baton::v1::StepProgress& progress);
  // The stored steps >= from_step, in step order, at most `limit` of them (`limit` >= 1;
  // INVALID_ARGUMENT naming it otherwise). Empty when there are none.
  absl::StatusOr<std::vector<baton::v1::StepProgress>> GetSteps(const std::string& job_id,
                                                                int64_t from_step, int64_t limit);

 private:
  explicit JobStore(std::string path) : path_(std::move(path)) {}
  absl::Status Error(const std::string& what, int rc) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Exec(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  Mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace baton

#endif  // BATON_COORDINATOR_JOB_STORE_H_
