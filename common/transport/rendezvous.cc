#include "common/transport/rendezvous.h"

#include <chrono>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "baton/v1/tensor.grpc.pb.h"
#include "common/rpc/rpc.h"

namespace baton {

absl::Status RendezvousBox::Put(const std::string& key, std::string value) {
  if (key.empty()) return absl::InvalidArgumentError("rendezvous: empty key");
  if (value.size() > options_.max_value_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("rendezvous: value of ", value.size(),
                                                   " bytes under ", key, " is over ",
                                                   options_.max_value_bytes));
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = values_.find(key);
  if (it != values_.end()) {
    if (it->second == value) return absl::OkStatus();
    return absl::AlreadyExistsError(
        absl::StrCat("rendezvous: ", key, " already holds another value"));
  }
  if (values_.size() >= options_.max_entries) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rendezvous: ", options_.max_entries, " values held already"));
  }
  values_.emplace(key, std::move(value));
  put_.notify_all();
  return absl::OkStatus();
}

absl::StatusOr<std::string> RendezvousBox::Take(const std::string& key, absl::Time deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    auto it = values_.find(key);
    if (it != values_.end()) {
      std::string value = std::move(it->second);
      values_.erase(it);
      return value;
    }
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("rendezvous: nothing arrived under ", key));
    }
    put_.wait_for(lock, absl::ToChronoNanoseconds(deadline - now));
  }
}

void RendezvousBox::DropPrefix(const std::string& prefix) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = values_.lower_bound(prefix);
       it != values_.end() && it->first.compare(0, prefix.size(), prefix) == 0;) {
    it = values_.erase(it);
  }
}

size_t RendezvousBox::size() const {
  std::lock_guard<std::mutex> lock(mu_);
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
      return absl::Status(s.code(), absl::StrCat("rendezvous ", key, ": ", s.message()));
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
        absl::StrCat("rendezvous: key ", key, " names no edge of rank ", rank_));
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
    return absl::DataLossError(absl::StrCat("rendezvous: ", key, " carries ", value->size(),
                                            " bytes, not a ", id.bytes.size(),
                                            "-byte NCCL unique id"));
  }
  std::memcpy(id.bytes.data(), value->data(), id.bytes.size());
  return id;
}

}  // namespace baton
