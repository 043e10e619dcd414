#include "common/collective/grpc_gloo_store.h"

#include <stdexcept>
#include <utility>

#include "absl/strings/str_cat.h"

namespace baton {

std::string GlooGroupPrefix(uint64_t job_key, int attempt, int group) {
  return absl::StrCat("baton/gloo/job/", job_key, "/attempt/", attempt, "/group/", group, "/");
}

GrpcGlooStore::GrpcGlooStore(std::string prefix, int rank, int size, RendezvousBox* box,
                             std::function<std::shared_ptr<grpc::Channel>(int)> channel_for,
                             absl::Duration timeout)
    : prefix_(std::move(prefix)),
      rank_(rank),
      size_(size),
      box_(box),
      channel_for_(std::move(channel_for)),
      timeout_(timeout) {}

void GrpcGlooStore::set(const std::string& key, const std::vector<char>& data) {
  const std::string value(data.begin(), data.end());
  const absl::Time deadline = absl::Now() + timeout_;
  for (int m = 0; m < size_; ++m) {
    if (m == rank_) continue;
    const absl::Status s = SendRendezvous(channel_for_(m), prefix_ + key, value, deadline);
    if (!s.ok()) {
      throw std::runtime_error(absl::StrCat("gloo store: member ", rank_, " could not send ",
                                            RedactJobKey(prefix_ + key), " to member ", m, ": ",
                                            s.ToString()));
    }
  }
  values_[key] = data;
}

void GrpcGlooStore::Take(const std::string& key, absl::Time deadline) {
  if (values_.count(key) > 0) return;
  absl::StatusOr<std::string> v = box_->Take(prefix_ + key, deadline);
  if (!v.ok()) {
    throw std::runtime_error(absl::StrCat("gloo store: member ", rank_, " waiting for ",
                                          RedactJobKey(prefix_ + key), ": ",
                                          v.status().ToString()));
  }
  values_[key] = std::vector<char>(v->begin(), v->end());
}

std::vector<char> GrpcGlooStore::get(const std::string& key) {
  Take(key, absl::Now() + timeout_);
  return values_[key];
}

void GrpcGlooStore::wait(const std::vector<std::string>& keys) {
  wait(keys, std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout_)));
}

void GrpcGlooStore::wait(const std::vector<std::string>& keys,
                         const std::chrono::milliseconds& timeout) {
  const absl::Time deadline =
      absl::Now() + std::min(timeout_, absl::Milliseconds(timeout.count()));
  for (const std::string& key : keys) Take(key, deadline);
}

}  // namespace baton
