#include "coordinator/worker_registry.h"

#include <algorithm>
#include <charconv>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/core/log_text.h"
#include "common/rpc/rpc.h"
#include "common/rpc/security.h"

namespace baton {
namespace {

using baton::v1::WorkerInfo;

bool ValidWorkerId(const std::string& id) {
  if (id.empty() || id.size() > 64) return false;
  for (char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.';
    if (!ok) return false;
  }
  return true;
}

absl::Status CheckAddress(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (address.empty()) {
    return absl::InvalidArgumentError(
        "address: required (host:port of the worker's WorkerService and TensorService)");
  }
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("address: \"", EchoInput(address), "\" is not host:port"));
  }
  int port = 0;
  const char* first = address.data() + colon + 1;
  const char* last = address.data() + address.size();
  const auto [ptr, ec] = std::from_chars(first, last, port);
  if (ec != std::errc() || ptr != last || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("address: \"", EchoInput(address), "\" has no valid port (1-65535)"));
  }
  return absl::OkStatus();
}

}  // namespace

WorkerRegistry::WorkerRegistry(absl::Duration lease_ttl, ClockFn clock,
                               absl::Duration dead_retention)
    : lease_ttl_(lease_ttl),
      dead_retention_(dead_retention),
      clock_(clock ? std::move(clock) : ClockFn([] { return absl::Now(); })) {}

absl::StatusOr<WorkerRegistry::Registration> WorkerRegistry::Register(
    const baton::v1::RegisterWorkerRequest& request, const std::string& identity) {
  MutexLock lock(mu_);
  if (absl::Status s = CheckAddress(request.address()); !s.ok()) return s;
  if (!request.session_token().empty() && (request.session_token().size() < 16 ||
                                           request.session_token().size() > 256)) {
    return absl::InvalidArgumentError("session_token: must be 16 to 256 characters");
  }
  if (!request.worker_id().empty() && !ValidWorkerId(request.worker_id())) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker_id: \"", EchoInput(request.worker_id()),
                     "\" must be 1 to 64 characters of letters, digits, '-', '_' and '.'"));
  }
  Registration out;
  std::string id = request.worker_id();
  const absl::Time now = Now();
  if (auto it = workers_.find(id); !id.empty() && it != workers_.end()) {
    const Entry& e = it->second;
    if (e.info.state() != baton::v1::WORKER_STATE_DEAD && now < e.lease_expiry &&
        e.info.address() != request.address()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "worker_id: \"", id, "\" is registered from ", e.info.address(),
          " and alive; another address can take the name once its lease runs out (in ",
          absl::FormatDuration(absl::Ceil(e.lease_expiry - now, absl::Milliseconds(1))), ")"));
    }
  }
  // Another identity may not replace a live worker, by its id or by its address.
  for (const auto& [other_id, other] : workers_) {
    const WorkerInfo& w = other.info;
    if (w.state() == baton::v1::WORKER_STATE_DEAD || now >= other.lease_expiry ||
        w.identity() == identity) {
      continue;
    }
    if ((!id.empty() && other_id == id) || w.address() == request.address()) {
      return absl::AlreadyExistsError(absl::StrCat(
          other_id == id ? absl::StrCat("worker_id: \"", id, "\"")
                         : absl::StrCat("address: ", EchoInput(request.address())),
          " belongs to live worker ", other_id, " of another identity (",
          w.identity().empty() ? "none" : w.identity(), "); it can be taken once its lease "
          "runs out"));
    }
  }
  // Replace live entries with this id or this address.
  for (auto it = workers_.begin(); it != workers_.end();) {
    const WorkerInfo& w = it->second.info;
    const bool same_id = it->first == id;
    const bool same_address = w.address() == request.address();
    if ((same_id || same_address) && w.state() != baton::v1::WORKER_STATE_DEAD) {
      out.replaced.push_back(w);
      it = workers_.erase(it);
    } else if (same_id) {
      it = workers_.erase(it);  // a dead entry of this id: registering revives the name
    } else {
      ++it;
    }
  }
  if (id.empty()) {
    do {
      id = absl::StrCat("w-", next_id_++);
    } while (workers_.count(id) > 0);
  }
  Entry e;
  e.info.set_worker_id(id);
  e.info.set_address(request.address());
  *e.info.mutable_device() = request.device();
  *e.info.mutable_capabilities() = request.capabilities();
  e.info.set_state(baton::v1::WORKER_STATE_IDLE);
  e.info.set_identity(identity);
  e.session = request.session_token().empty() ? NewSecret() : request.session_token();
  *e.info.mutable_registered() = ToProtoTime(now);
  *e.info.mutable_last_heartbeat() = ToProtoTime(now);
  e.order = next_order_++;
  e.lease_expiry = now + lease_ttl_;
  out.worker = e.info;
  workers_[id] = std::move(e);
  return out;
}

absl::Status WorkerRegistry::CheckSession(const std::string& worker_id,
                                          const std::string& session,
                                          const std::string& identity) const {
  MutexLock lock(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.info.state() == baton::v1::WORKER_STATE_DEAD) {
    return absl::OkStatus();
  }
  const Entry& e = it->second;
  if (session.empty()) {
    return absl::UnauthenticatedError(absl::StrCat(
        "no x-baton-session metadata: calls for worker ", worker_id,
        " need the session secret its registration returned"));
  }
  if (!SecretsEqual(session, e.session) || identity != e.info.identity()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the caller is not the process that registered worker ", worker_id,
        " (session or certificate identity differ)"));
  }
  return absl::OkStatus();
}

std::string WorkerRegistry::SessionOf(const std::string& worker_id) const {
  MutexLock lock(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.info.state() == baton::v1::WORKER_STATE_DEAD) return "";
  return it->second.session;
}

bool WorkerRegistry::Heartbeat(const std::string& worker_id, const std::string& reported_job_id) {
  return HeartbeatAndCheck(worker_id, reported_job_id).known;
}

WorkerRegistry::Beat WorkerRegistry::HeartbeatAndCheck(const std::string& worker_id,
                                                       const std::string& reported_job_id) {
  MutexLock lock(mu_);
  Beat beat;
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.info.state() == baton::v1::WORKER_STATE_DEAD) {
    return beat;
  }
  Entry& e = it->second;
  const absl::Time now = Now();
  // A lease that ran out but has not been collected yet is still dead: the worker may have
  // been declared dead by a concurrent ExpireLeases, and must not come back silently.
  if (now >= e.lease_expiry) return beat;
  beat.previous = FromProtoTime(e.info.last_heartbeat());  // set at registration
  e.lease_expiry = now + lease_ttl_;
  *e.info.mutable_last_heartbeat() = ToProtoTime(now);
  e.reported_job_id = reported_job_id;
  beat.known = true;
  beat.settled = reported_job_id.empty()
                     ? e.info.state() == baton::v1::WORKER_STATE_IDLE
                     : e.info.state() == baton::v1::WORKER_STATE_BUSY && e.wanted &&
                           e.info.job_id() == reported_job_id;
  return beat;
}

void WorkerRegistry::Unwant(const std::string& worker_id, const std::string& job_id) {
  MutexLock lock(mu_);
  auto it = workers_.find(worker_id);
  if (it != workers_.end() && it->second.info.job_id() == job_id) it->second.wanted = false;
}

std::optional<WorkerInfo> WorkerRegistry::Leave(const std::string& worker_id) {
  MutexLock lock(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.info.state() == baton::v1::WORKER_STATE_DEAD) {
    return std::nullopt;
  }
  Entry& e = it->second;
  WorkerInfo before = e.info;
  e.info.set_state(baton::v1::WORKER_STATE_DEAD);
  e.info.clear_job_id();
  e.died = Now();
  return before;
}

std::vector<WorkerInfo> WorkerRegistry::ExpireLeases() {
  MutexLock lock(mu_);
  std::vector<WorkerInfo> dead;
  const absl::Time now = Now();
  std::vector<const Entry*> sorted = Sorted();
  for (const Entry* c : sorted) {
    Entry& e = workers_[c->info.worker_id()];
    if (e.info.state() == baton::v1::WORKER_STATE_DEAD || now < e.lease_expiry) continue;
    dead.push_back(e.info);
    e.info.set_state(baton::v1::WORKER_STATE_DEAD);
    e.info.clear_job_id();
    e.died = now;
  }
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (it->second.info.state() == baton::v1::WORKER_STATE_DEAD &&
        now - it->second.died > dead_retention_) {
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
  return dead;
}

std::vector<WorkerInfo> WorkerRegistry::IdleWorkers() const {
  MutexLock lock(mu_);
  std::vector<WorkerInfo> out;
  for (const Entry* e : Sorted()) {
    if (e->info.state() == baton::v1::WORKER_STATE_IDLE && e->reported_job_id.empty()) {
      out.push_back(e->info);
    }
  }
  return out;
}

int WorkerRegistry::LiveCount() const {
  MutexLock lock(mu_);
  int n = 0;
  for (const auto& [id, e] : workers_) {
    if (e.info.state() != baton::v1::WORKER_STATE_DEAD) ++n;
  }
  return n;
}

absl::Status WorkerRegistry::MarkBusy(const std::string& worker_id, const std::string& job_id) {
  MutexLock lock(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.info.state() != baton::v1::WORKER_STATE_IDLE) {
    return absl::FailedPreconditionError(absl::StrCat("worker ", worker_id, " is not idle"));
  }
  it->second.info.set_state(baton::v1::WORKER_STATE_BUSY);
  it->second.info.set_job_id(job_id);
  it->second.wanted = true;
  return absl::OkStatus();
}

bool WorkerRegistry::MarkIdle(const std::string& worker_id, const std::string& job_id) {
  MutexLock lock(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.info.state() != baton::v1::WORKER_STATE_BUSY ||
      it->second.info.job_id() != job_id) {
    return false;
  }
  it->second.info.set_state(baton::v1::WORKER_STATE_IDLE);
  it->second.info.clear_job_id();
  it->second.wanted = false;
  // The worker reported the job in its heartbeats; it is done with it now.
  if (it->second.reported_job_id == job_id) it->second.reported_job_id.clear();
  return true;
}

std::optional<WorkerInfo> WorkerRegistry::Get(const std::string& worker_id) const {
  MutexLock lock(mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return std::nullopt;
  return it->second.info;
}

std::vector<WorkerInfo> WorkerRegistry::List() const {
  MutexLock lock(mu_);
  std::vector<WorkerInfo> out;
  std::vector<const Entry*> sorted = Sorted();
  for (const Entry* e : sorted) {
    if (e->info.state() != baton::v1::WORKER_STATE_DEAD) out.push_back(e->info);
  }
  for (const Entry* e : sorted) {
    if (e->info.state() == baton::v1::WORKER_STATE_DEAD) out.push_back(e->info);
  }
  return out;
}

std::vector<const WorkerRegistry::Entry*> WorkerRegistry::Sorted() const {
  std::vector<const Entry*> out;
  out.reserve(workers_.size());
  for (const auto& [id, e] : workers_) out.push_back(&e);
  std::sort(out.begin(), out.end(),
            [](const Entry* a, const Entry* b) { return a->order < b->order; });
  return out;
}

}  // namespace baton
