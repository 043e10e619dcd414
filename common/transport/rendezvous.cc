#include "common/transport/rendezvous.h"

#include <chrono>
#include <algorithm>
#include <cstring>
#include <iterator>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "baton/v1/tensor.grpc.pb.h"
#include "common/rpc/rpc.h"
#include "common/core/mutex.h"

namespace baton {

std::optional<uint64_t> JobKeyOfRendezvousKey(absl::string_view key) {
  // "baton/<kind>/job/<digits>/..."
  if (!absl::ConsumePrefix(&key, "baton/")) return std::nullopt;
  const size_t slash = key.find('/');
  if (slash == 0 || slash == absl::string_view::npos) return std::nullopt;
  key.remove_prefix(slash + 1);
  if (!absl::ConsumePrefix(&key, "job/")) return std::nullopt;
  const size_t end = key.find('/');
  if (end == absl::string_view::npos) return std::nullopt;
  uint64_t job_key = 0;
  if (!absl::SimpleAtoi(key.substr(0, end), &job_key)) return std::nullopt;
  return job_key;
}

std::string RedactJobKey(absl::string_view text) {
  std::string out;
  for (;;) {
    const size_t at = text.find("/job/");
    if (at == absl::string_view::npos) break;
    size_t end = at + 5;
    while (end < text.size() && absl::ascii_isdigit(static_cast<unsigned char>(text[end]))) ++end;
    absl::StrAppend(&out, text.substr(0, at + 5), end > at + 5 ? "<key>" : "");
    text.remove_prefix(end);
  }
  absl::StrAppend(&out, text);
  return out;
}

void RendezvousBox::OpenJob(uint64_t job_key, std::vector<std::string> members) {
  MutexLock lock(mu_);
  Attempt& a = open_[job_key];
  a.members.clear();
  for (std::string& m : members) {
    if (!m.empty()) a.members.insert(std::move(m));
  }
}

void RendezvousBox::CloseJob(uint64_t job_key) {
  MutexLock lock(mu_);
  open_.erase(job_key);
  for (auto it = values_.begin(); it != values_.end();) {
    if (JobKeyOfRendezvousKey(it->first) == job_key) {
      it = values_.erase(it);
    } else {
      ++it;
    }
  }
}

void RendezvousBox::EraseLocked(std::map<std::string, std::string>::iterator it) {
  const std::optional<uint64_t> job = JobKeyOfRendezvousKey(it->first);
  if (job.has_value()) {
    auto a = open_.find(*job);
    if (a != open_.end() && a->second.entries > 0) --a->second.entries;
  }
  values_.erase(it);
}

absl::Status RendezvousBox::Put(const std::string& key, std::string value,
                                absl::string_view identity) {
  const std::optional<uint64_t> job = JobKeyOfRendezvousKey(key);
  if (!job.has_value()) {
    return absl::InvalidArgumentError(
        "rendezvous: the key names no job attempt (baton/<kind>/job/<job key>/...)");
  }
  const std::string named = RedactJobKey(key);
  if (value.size() > options_.max_value_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("rendezvous: value of ", value.size(),
                                                   " bytes under ", named, " is over ",
                                                   options_.max_value_bytes));
  }
  MutexLock lock(mu_);
  auto attempt = open_.find(*job);
  if (attempt == open_.end()) {
    return absl::UnavailableError(
        absl::StrCat("rendezvous: ", named, ": its job attempt does not run on this worker (yet)"));
  }
  Attempt& a = attempt->second;
  if (!a.members.empty() && a.members.count(std::string(identity)) == 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "rendezvous: ", named, ": ",
        identity.empty() ? "a caller without a certificate" : std::string(identity),
        " is not a member of its job"));
  }
  auto it = values_.find(key);
  if (it != values_.end()) {
    if (it->second == value) return absl::OkStatus();
    return absl::AlreadyExistsError(
        absl::StrCat("rendezvous: ", named, " already holds another value"));
  }
  if (a.entries >= options_.max_entries_per_job) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "rendezvous: ", named, ": its job holds ", options_.max_entries_per_job, " values already"));
  }
  values_.emplace(key, std::move(value));
  ++a.entries;
  put_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::string> RendezvousBox::Take(const std::string& key, absl::Time deadline) {
  MutexLock lock(mu_);
  for (;;) {
    auto it = values_.find(key);
    if (it != values_.end()) {
      std::string value = std::move(it->second);
      EraseLocked(it);
      return value;
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("rendezvous: nothing arrived under ", RedactJobKey(key)));
    }
    put_.wait_for(lock.native(), absl::ToChronoNanoseconds(std::min(deadline - now, absl::Hours(1))));
  }
}

void RendezvousBox::DropPrefix(const std::string& prefix) {
  MutexLock lock(mu_);
  for (auto it = values_.lower_bound(prefix);
       it != values_.end() && it->first.compare(0, prefix.size(), prefix) == 0;) {
    auto next = std::next(it);
    EraseLocked(it);
    it = next;
  }
}

size_t RendezvousBox::size() const {
  MutexLock lock(mu_);
  return values_.size();
}

absl::Status SendRendezvous(const std::shared_ptr<grpc::Channel>& channel, const std::string& key,
                            const std::string& value, absl::Time deadline) {
  auto stub = baton::v1::TensorService::NewStub(channel);
  baton::v1::RendezvousMessage msg;
  msg.set_key(key);
  msg.set_value(value);
  absl::Duration backoff = absl::Milliseconds(20);
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(deadline));
    ctx.set_wait_for_ready(true);  // the peer's server may still be coming up
    baton::v1::RendezvousAck ack;
    const grpc::Status st = stub->Rendezvous(&ctx, msg, &ack);
    if (st.ok()) return absl::OkStatus();
    const absl::Status s = FromGrpcStatus(st);
    if (s.code() != absl::StatusCode::kUnavailable || absl::Now() + backoff >= deadline) {
      return absl::Status(s.code(),
                          absl::StrCat("rendezvous ", RedactJobKey(key), ": ", s.message()));
    }
    std::this_thread::sleep_for(absl::ToChronoNanoseconds(backoff));
    backoff = std::min(backoff * 2, absl::Milliseconds(500));
  }
}

GrpcNcclIdExchange::GrpcNcclIdExchange(
    int rank, RendezvousBox* box, std::function<std::shared_ptr<grpc::Channel>(int)> channel_for,
    absl::Duration publish_timeout)
    : rank_(rank),
      box_(box),
      channel_for_(std::move(channel_for)),
      publish_timeout_(publish_timeout) {}

absl::Status GrpcNcclIdExchange::Publish(const std::string& key, const NcclUniqueId& id) {
  // ".../<src>-><dst>": the peer is the end that is not this rank.
  const size_t slash = key.rfind('/');
  const size_t arrow = key.find("->", slash == std::string::npos ? 0 : slash);
  int src = -1, dst = -1;
  if (slash == std::string::npos || arrow == std::string::npos ||
      !absl::SimpleAtoi(key.substr(slash + 1, arrow - slash - 1), &src) ||
      !absl::SimpleAtoi(key.substr(arrow + 2), &dst) || (src != rank_ && dst != rank_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous: key ", RedactJobKey(key), " names no edge of rank ", rank_));
  }
  const int peer = src == rank_ ? dst : src;
  return SendRendezvous(channel_for_(peer), key, std::string(id.bytes.data(), id.bytes.size()),
                        absl::Now() + publish_timeout_);
}

absl::StatusOr<NcclUniqueId> GrpcNcclIdExchange::Fetch(const std::string& key,
                                                       absl::Time deadline) {
  absl::StatusOr<std::string> value = box_->Take(key, deadline);
  if (!value.ok()) return value.status();
  NcclUniqueId id;
  if (value->size() != id.bytes.size()) {
    return absl::DataLossError(absl::StrCat("rendezvous: ", RedactJobKey(key), " carries ",
                                            value->size(),
                                            " bytes, not a ", id.bytes.size(),
                                            "-byte NCCL unique id"));
  }
  std::memcpy(id.bytes.data(), value->data(), id.bytes.size());
  return id;
}

}  // namespace baton
