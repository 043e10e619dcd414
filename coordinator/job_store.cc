#include "coordinator/job_store.h"

#include <sqlite3.h>

#include <charconv>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/core/log_text.h"
#include "common/core/status.h"
#include "common/core/mutex.h"

namespace baton {
namespace {

// 1: jobs. 2: traces. 3: steps. (Tables after the first are added with CREATE TABLE IF
// NOT EXISTS: older files upgrade in place.)
constexpr int kSchemaVersion = 3;

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS jobs(
  id TEXT PRIMARY KEY,
  seq INTEGER UNIQUE NOT NULL,
  submission_id TEXT UNIQUE,
  state INTEGER NOT NULL,
  job BLOB NOT NULL,
  updated_ns INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs(state);
CREATE TABLE IF NOT EXISTS traces(
  job_id TEXT NOT NULL,
  step INTEGER NOT NULL,
  rank INTEGER NOT NULL,
  trace BLOB NOT NULL,
  PRIMARY KEY(job_id, step, rank)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS steps(
  job_id TEXT NOT NULL,
  step INTEGER NOT NULL,
  progress BLOB NOT NULL,
  PRIMARY KEY(job_id, step)) WITHOUT ROWID;
)sql";

// A prepared statement, finalized on scope exit.
class Statement {
 public:
  Statement() = default;
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  int Prepare(sqlite3* db, const char* sql) {
    return sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr);
  }
  sqlite3_stmt* get() { return stmt_; }
  int BindText(int i, const std::string& s) {
    return sqlite3_bind_text(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
  }
  int BindBlob(int i, const std::string& s) {
    return sqlite3_bind_blob(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
  }
  int BindInt(int i, int64_t v) { return sqlite3_bind_int64(stmt_, i, v); }
  int BindNull(int i) { return sqlite3_bind_null(stmt_, i); }
  std::string ColumnBlob(int i) {
    const void* p = sqlite3_column_blob(stmt_, i);
    const int n = sqlite3_column_bytes(stmt_, i);
    return p == nullptr ? std::string() : std::string(static_cast<const char*>(p), n);
  }
  int64_t ColumnInt(int i) { return sqlite3_column_int64(stmt_, i); }

 private:
  sqlite3_stmt* stmt_ = nullptr;
};

std::string EncodeToken(int64_t seq) {
  return absl::WebSafeBase64Escape(absl::StrCat("before:", seq));
}

absl::StatusOr<int64_t> DecodeToken(const std::string& token) {
  const absl::Status bad = absl::InvalidArgumentError(
      "page_token: not a next_page_token from an earlier ListJobs response");
  std::string raw;
  if (!absl::WebSafeBase64Unescape(token, &raw)) return bad;
  if (!absl::StartsWith(raw, "before:")) return bad;
  const char* first = raw.data() + 7;
  const char* last = raw.data() + raw.size();
  int64_t seq = 0;
  const auto [ptr, ec] = std::from_chars(first, last, seq);
  if (ec != std::errc() || ptr != last || first == last || seq < 0) return bad;
  return seq;
}

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> JobStore::Open(const std::string& path) {
  std::unique_ptr<JobStore> store(new JobStore(path));
  MutexLock lock(store->mu_);
  const int rc =
      sqlite3_open_v2(path.c_str(), &store->db_,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    const std::string msg = store->db_ != nullptr ? sqlite3_errmsg(store->db_) : sqlite3_errstr(rc);
    return absl::UnavailableError(absl::StrCat("cannot open job database ", path, ": ", msg));
  }
  sqlite3_busy_timeout(store->db_, 5000);
  sqlite3_extended_result_codes(store->db_, 1);
  // WAL: readers never block the writer and a commit is one append. ":memory:" stays in
  // its "memory" journal mode, which is fine.
  BATON_RETURN_IF_ERROR(store->Exec("PRAGMA journal_mode=WAL"));
  BATON_RETURN_IF_ERROR(store->Exec("PRAGMA synchronous=NORMAL"));
  BATON_RETURN_IF_ERROR(store->Exec("PRAGMA foreign_keys=ON"));

  int64_t version = 0;
  {
    Statement st;
    int rc2 = st.Prepare(store->db_, "PRAGMA user_version");
    if (rc2 != SQLITE_OK) return store->Error("reading the schema version", rc2);
    if ((rc2 = sqlite3_step(st.get())) != SQLITE_ROW) {
      return store->Error("reading the schema version", rc2);
    }
    version = st.ColumnInt(0);
  }
  if (version > kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat("job database ", path, " has schema version ",
                                                      version, ", newer than this coordinator's ",
                                                      kSchemaVersion));
  }
  BATON_RETURN_IF_ERROR(store->Exec("BEGIN IMMEDIATE"));
  absl::Status s = store->Exec(kSchema);
  if (s.ok()) s = store->Exec(absl::StrCat("PRAGMA user_version=", kSchemaVersion).c_str());
  if (s.ok()) {
    s = store->Exec("COMMIT");
  } else {
    store->Exec("ROLLBACK").IgnoreError();
  }
  BATON_RETURN_IF_ERROR(s);

  Statement st;
  int rc3 = st.Prepare(store->db_, "SELECT COALESCE(MAX(seq), 0) FROM jobs");
  if (rc3 != SQLITE_OK) return store->Error("reading the last sequence number", rc3);
  if ((rc3 = sqlite3_step(st.get())) != SQLITE_ROW) {
    return store->Error("reading the last sequence number", rc3);
  }
  store->next_seq_ = st.ColumnInt(0) + 1;
  return store;
}

JobStore::~JobStore() {
  MutexLock lock(mu_);
  if (db_ != nullptr) sqlite3_close_v2(db_);
  db_ = nullptr;
}

absl::Status JobStore::Error(const std::string& what, int rc) {
  const char* msg = db_ != nullptr ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
  const std::string text = absl::StrCat("job database ", path_, ": ", what, ": ", msg);
  switch (rc & 0xff) {
    case SQLITE_CONSTRAINT:
      return absl::AlreadyExistsError(text);
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      return absl::UnavailableError(text);
    case SQLITE_FULL:
      return absl::ResourceExhaustedError(text);
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::DataLossError(text);
    default:
      return absl::InternalError(text);
  }
}

absl::Status JobStore::Exec(const char* sql) {
  char* err = nullptr;
  const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, &err);
  if (rc != SQLITE_OK) {
    sqlite3_free(err);  // the same text as sqlite3_errmsg, which Error reports
    return Error(sql, rc);
  }
  return absl::OkStatus();
}

int64_t JobStore::NextSequence() {
  MutexLock lock(mu_);
  return next_seq_++;
}

absl::Status JobStore::Insert(int64_t seq, const baton::v1::Job& job) {
  std::string blob;
  if (!job.SerializeToString(&blob)) {
    return absl::InternalError(
        absl::StrCat("job database ", path_, ": cannot serialize ", job.id()));
  }
  MutexLock lock(mu_);
  Statement st;
  int rc = st.Prepare(db_,
                      "INSERT INTO jobs(id, seq, submission_id, state, job, updated_ns) "
                      "VALUES(?1, ?2, ?3, ?4, ?5, ?6)");
  if (rc != SQLITE_OK) return Error("preparing insert", rc);
  st.BindText(1, job.id());
  st.BindInt(2, seq);
  if (job.submission_id().empty()) {
    st.BindNull(3);
  } else {
    st.BindText(3, job.submission_id());
  }
  st.BindInt(4, job.state());
  st.BindBlob(5, blob);
  st.BindInt(6, absl::ToUnixNanos(absl::Now()));
  // One statement in autocommit mode is one transaction.
  rc = sqlite3_step(st.get());
  if (rc != SQLITE_DONE) return Error(absl::StrCat("inserting ", job.id()), rc);
  if (seq >= next_seq_) next_seq_ = seq + 1;
  return absl::OkStatus();
}

absl::Status JobStore::Put(const baton::v1::Job& job) {
  std::string blob;
  if (!job.SerializeToString(&blob)) {
    return absl::InternalError(
        absl::StrCat("job database ", path_, ": cannot serialize ", job.id()));
  }
  MutexLock lock(mu_);
  Statement st;
  int rc = st.Prepare(db_, "UPDATE jobs SET state = ?2, job = ?3, updated_ns = ?4 WHERE id = ?1");
  if (rc != SQLITE_OK) return Error("preparing update", rc);
  st.BindText(1, job.id());
  st.BindInt(2, job.state());
  st.BindBlob(3, blob);
  st.BindInt(4, absl::ToUnixNanos(absl::Now()));
  rc = sqlite3_step(st.get());
  if (rc != SQLITE_DONE) return Error(absl::StrCat("updating ", job.id()), rc);
  if (sqlite3_changes(db_) == 0) {
    return absl::NotFoundError(absl::StrCat("job database ", path_, ": no job ", job.id()));
  }
  return absl::OkStatus();
}

absl::StatusOr<baton::v1::Job> JobStore::Get(const std::string& id) {
  MutexLock lock(mu_);
  Statement st;
  int rc = st.Prepare(db_, "SELECT job FROM jobs WHERE id = ?1");
  if (rc != SQLITE_OK) return Error("preparing get", rc);
  st.BindText(1, id);
  rc = sqlite3_step(st.get());
  if (rc == SQLITE_DONE) {
    return absl::NotFoundError(absl::StrCat("job ", EchoInput(id), " not found"));
  }
  if (rc != SQLITE_ROW) return Error(absl::StrCat("reading ", EchoInput(id)), rc);
  baton::v1::Job job;
  if (!job.ParseFromString(st.ColumnBlob(0))) {
    return absl::DataLossError(
        absl::StrCat("job database ", path_, ": the record of ", id, " does not parse"));
  }
  return job;
}

absl::StatusOr<std::optional<baton::v1::Job>> JobStore::FindBySubmission(
    const std::string& submission_id) {
  if (submission_id.empty()) return std::optional<baton::v1::Job>();
  MutexLock lock(mu_);
  Statement st;
  int rc = st.Prepare(db_, "SELECT job, id FROM jobs WHERE submission_id = ?1");
  if (rc != SQLITE_OK) return Error("preparing lookup", rc);
  st.BindText(1, submission_id);
  rc = sqlite3_step(st.get());
  if (rc == SQLITE_DONE) return std::optional<baton::v1::Job>();
  if (rc != SQLITE_ROW) return Error("looking up a submission id", rc);
  baton::v1::Job job;
  if (!job.ParseFromString(st.ColumnBlob(0))) {
    return absl::DataLossError(
        absl::StrCat("job database ", path_, ": the record of ", job.id(), " does not parse"));
  }
  return std::optional<baton::v1::Job>(std::move(job));
}

absl::StatusOr<JobStore::Page> JobStore::List(int page_size, const std::string& page_token,
                                              int64_t max_bytes) {
  if (page_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size: must be at least 1, got ", page_size));
  }
  int64_t before = INT64_MAX;
  if (!page_token.empty()) {
    BATON_ASSIGN_OR_RETURN(before, DecodeToken(page_token));
  }
  MutexLock lock(mu_);
  Statement st;
  int rc = st.Prepare(db_, "SELECT job, seq FROM jobs WHERE seq < ?1 ORDER BY seq DESC LIMIT ?2");
  if (rc != SQLITE_OK) return Error("preparing list", rc);
  st.BindInt(1, before);
  st.BindInt(2, static_cast<int64_t>(page_size) + 1);
  Page page;
  int64_t last_seq = 0;
  int64_t bytes = 0;
  while ((rc = sqlite3_step(st.get())) == SQLITE_ROW) {
    const std::string blob = st.ColumnBlob(0);
    if (static_cast<int>(page.jobs.size()) == page_size ||
        (!page.jobs.empty() && bytes + static_cast<int64_t>(blob.size()) > max_bytes)) {
      page.next_page_token = EncodeToken(last_seq);
      break;
    }
    bytes += static_cast<int64_t>(blob.size());
    baton::v1::Job job;
    if (!job.ParseFromString(blob)) {
      return absl::DataLossError(absl::StrCat("job database ", path_, ": the record with seq ",
                                              st.ColumnInt(1), " does not parse"));
    }
    last_seq = st.ColumnInt(1);
    page.jobs.push_back(std::move(job));
  }
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return Error("listing jobs", rc);
  return page;
}

absl::StatusOr<std::vector<std::pair<int64_t, baton::v1::Job>>> JobStore::ListInStates(
    const std::vector<baton::v1::JobState>& states) {
  std::vector<std::pair<int64_t, baton::v1::Job>> out;
  if (states.empty()) return out;
  std::string sql = "SELECT job, seq FROM jobs WHERE state IN (";
  for (size_t i = 0; i < states.size(); ++i) {
    absl::StrAppend(&sql, i == 0 ? "" : ", ", static_cast<int>(states[i]));
  }
  absl::StrAppend(&sql, ") ORDER BY seq ASC");
  MutexLock lock(mu_);
  Statement st;
  int rc = st.Prepare(db_, sql.c_str());
  if (rc != SQLITE_OK) return Error("preparing list by state", rc);
  while ((rc = sqlite3_step(st.get())) == SQLITE_ROW) {
    baton::v1::Job job;
    if (!job.ParseFromString(st.ColumnBlob(0))) {
      return absl::DataLossError(absl::StrCat("job database ", path_, ": the record with seq ",
                                              st.ColumnInt(1), " does not parse"));
    }
    out.emplace_back(st.ColumnInt(1), std::move(job));
  }
  if (rc != SQLITE_DONE) return Error("listing jobs by state", rc);
  return out;
}

absl::StatusOr<int64_t> JobStore::Count() {
  MutexLock lock(mu_);
  Statement st;
  int rc = st.Prepare(db_, "SELECT COUNT(*) FROM jobs");
  if (rc != SQLITE_OK) return Error("preparing count", rc);
  rc = sqlite3_step(st.get());
  if (rc != SQLITE_ROW) return Error("counting jobs", rc);
  return st.ColumnInt(0);
}

absl::StatusOr<std::map<baton::v1::JobState, int64_t>> JobStore::CountByState() {
  MutexLock lock(mu_);
  Statement st;
  int rc = st.Prepare(db_, "SELECT state, COUNT(*) FROM jobs GROUP BY state");
  if (rc != SQLITE_OK) return Error("preparing count by state", rc);
  std::map<baton::v1::JobState, int64_t> out;
  while ((rc = sqlite3_step(st.get())) == SQLITE_ROW) {
    out[static_cast<baton::v1::JobState>(st.ColumnInt(0))] = st.ColumnInt(1);
  }
  if (rc != SQLITE_DONE) return Error("counting jobs by state", rc);
  return out;
}

absl::Status JobStore::PutTrace(const std::string& job_id, int64_t step,
                                const baton::v1::RankTrace& trace, int64_t keep_steps) {
  MutexLock lock(mu_);
  BATON_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
  absl::Status s = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    Statement put;
    int rc = put.Prepare(
        db_, "INSERT OR REPLACE INTO traces(job_id, step, rank, trace) VALUES(?1, ?2, ?3, ?4)");
    if (rc != SQLITE_OK) return Error("preparing trace insert", rc);
    put.BindText(1, job_id);
    put.BindInt(2, step);
    put.BindInt(3, trace.rank());
    put.BindBlob(4, trace.SerializeAsString());
    if ((rc = sqlite3_step(put.get())) != SQLITE_DONE) {
      return Error(absl::StrCat("storing the trace of ", job_id, " step ", step), rc);
    }
    Statement prune;
    rc = prune.Prepare(db_, "DELETE FROM traces WHERE job_id = ?1 AND step <= ?2");
    if (rc != SQLITE_OK) return Error("preparing trace prune", rc);
    prune.BindText(1, job_id);
    prune.BindInt(2, step - keep_steps);
    if ((rc = sqlite3_step(prune.get())) != SQLITE_DONE) {
      return Error(absl::StrCat("pruning the traces of ", job_id), rc);
    }
    return absl::OkStatus();
  }();
  if (!s.ok()) {
    Exec("ROLLBACK").IgnoreError();
    return s;
  }
  return Exec("COMMIT");
}

absl::StatusOr<std::vector<baton::v1::RankTrace>> JobStore::GetTrace(const std::string& job_id,
                                                                     int64_t step) {
  MutexLock lock(mu_);
  Statement st;
  int rc = st.Prepare(db_, "SELECT trace FROM traces WHERE job_id = ?1 AND step = ?2 ORDER BY rank");
  if (rc != SQLITE_OK) return Error("preparing trace read", rc);
  st.BindText(1, job_id);
  st.BindInt(2, step);
  std::vector<baton::v1::RankTrace> out;
  while ((rc = sqlite3_step(st.get())) == SQLITE_ROW) {
    if (!out.emplace_back().ParseFromString(st.ColumnBlob(0))) {
      return absl::DataLossError(absl::StrCat("job database ", path_, ": a trace of ", job_id,
                                              " step ", step, " does not parse"));
    }
  }
  if (rc != SQLITE_DONE) return Error(absl::StrCat("reading the trace of ", job_id), rc);
  return out;
}

absl::StatusOr<JobStore::TraceSteps> JobStore::GetTraceSteps(const std::string& job_id,
                                                             int ranks) {
  MutexLock lock(mu_);
  Statement st;
  int rc = st.Prepare(db_,
                      "SELECT MIN(step), MAX(step), "
                      "(SELECT MAX(step) FROM (SELECT step FROM traces WHERE job_id = ?1 "
                      "GROUP BY step HAVING COUNT(*) >= ?2)) "
                      "FROM traces WHERE job_id = ?1");
  if (rc != SQLITE_OK) return Error("preparing trace range", rc);
  st.BindText(1, job_id);
  st.BindInt(2, ranks);
  if ((rc = sqlite3_step(st.get())) != SQLITE_ROW) {
    return Error(absl::StrCat("reading the trace range of ", job_id), rc);
  }
  TraceSteps out;
  out.first = st.ColumnInt(0);
  out.last = st.ColumnInt(1);
  out.last_complete = st.ColumnInt(2);  // NULL reads as 0
  return out;
}

absl::Status JobStore::PutStep(const std::string& job_id, const baton::v1::StepProgress& progress) {
  baton::v1::StepProgress kept = progress;
  kept.clear_stages();
  std::string blob;
  if (!kept.SerializeToString(&blob)) {
    return absl::InternalError(absl::StrCat("job database ", path_, ": cannot serialize step ",
                                            progress.step(), " of ", job_id));
  }
  MutexLock lock(mu_);
  Statement st;
  int rc =
      st.Prepare(db_, "INSERT OR REPLACE INTO steps(job_id, step, progress) VALUES(?1, ?2, ?3)");
  if (rc != SQLITE_OK) return Error("preparing step insert", rc);
  st.BindText(1, job_id);
  st.BindInt(2, progress.step());
  st.BindBlob(3, blob);
  // One statement in autocommit mode is one transaction.
  if ((rc = sqlite3_step(st.get())) != SQLITE_DONE) {
    return Error(absl::StrCat("storing step ", progress.step(), " of ", job_id), rc);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<baton::v1::StepProgress>> JobStore::GetSteps(const std::string& job_id,
                                                                        int64_t from_step,
                                                                        int64_t limit) {
  if (limit < 1) {
    return absl::InvalidArgumentError(absl::StrCat("limit: must be at least 1, got ", limit));
  }
  MutexLock lock(mu_);
  Statement st;
  int rc = st.Prepare(db_,
                      "SELECT progress, step FROM steps WHERE job_id = ?1 AND step >= ?2 "
                      "ORDER BY step LIMIT ?3");
  if (rc != SQLITE_OK) return Error("preparing step read", rc);
  st.BindText(1, job_id);
  st.BindInt(2, from_step);
  st.BindInt(3, limit);
  std::vector<baton::v1::StepProgress> out;
  while ((rc = sqlite3_step(st.get())) == SQLITE_ROW) {
    if (!out.emplace_back().ParseFromString(st.ColumnBlob(0))) {
      return absl::DataLossError(absl::StrCat("job database ", path_, ": step ", st.ColumnInt(1),
                                              " of ", job_id, " does not parse"));
    }
  }
  if (rc != SQLITE_DONE) return Error(absl::StrCat("reading the steps of ", job_id), rc);
  return out;
}

}  // namespace baton
