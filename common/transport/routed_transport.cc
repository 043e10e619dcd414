#include "common/transport/routed_transport.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace baton {

RoutedTransport::RoutedTransport(int rank, std::vector<Transport*> by_peer)
    : rank_(rank), by_peer_(std::move(by_peer)) {
  std::vector<std::string> names;
  for (Transport* t : by_peer_) {
    if (t == nullptr || std::find(distinct_.begin(), distinct_.end(), t) != distinct_.end()) {
      continue;
    }
    distinct_.push_back(t);
    if (std::find(names.begin(), names.end(), t->backend()) == names.end()) {
      names.push_back(t->backend());
    }
  }
  backend_ = names.empty() ? "none" : absl::StrJoin(names, "+");
}

Transport* RoutedTransport::For(int peer) const {
  if (peer < 0 || peer >= static_cast<int>(by_peer_.size())) return nullptr;
  return by_peer_[peer];
}

std::string RoutedTransport::BackendFor(int peer) const {
  Transport* t = For(peer);
  return t == nullptr ? "" : t->backend();
}

std::unique_ptr<SendWork> RoutedTransport::Send(int peer, const TensorTag& tag, const Tensor& t) {
  Transport* to = For(peer);
  if (to == nullptr) {
    return CompletedSend(absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank_, ": sending ", tag.ToString(), " to rank ", peer, ": no link to it")));
  }
  return to->Send(peer, tag, t);
}

absl::StatusOr<Tensor> RoutedTransport::Recv(int peer, const TensorTag& tag, absl::Time deadline) {
  Transport* from = For(peer);
  if (from == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank_, ": receiving ", tag.ToString(),
                                                   " from rank ", peer, ": no link to it"));
  }
  return from->Recv(peer, tag, deadline);
}

void RoutedTransport::Abort(const absl::Status& reason) {
  for (Transport* t : distinct_) t->Abort(reason);
}

}  // namespace baton
