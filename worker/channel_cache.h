// ChannelCache: one gRPC channel per peer address, kept across jobs so that a peer is
// connected once. Factory() is the ChannelFactory a JobRun takes.
//
// Thread-safe: channels_ is guarded by mu_.
#ifndef BATON_WORKER_CHANNEL_CACHE_H_
#define BATON_WORKER_CHANNEL_CACHE_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "worker/peer_setup.h"
#include "common/core/mutex.h"

namespace baton {

class ChannelCache {
 public:
  // `make` opens a channel the first time an address is asked for (MakeTensorChannel in
  // the product).
  explicit ChannelCache(ChannelFactory make) : make_(std::move(make)) {}

  // The channel to `address`, opened on first use.
  std::shared_ptr<grpc::Channel> Get(const std::string& address) {
    MutexLock lock(mu_);
    std::shared_ptr<grpc::Channel>& ch = channels_[address];
    if (ch == nullptr) ch = make_(address);
    return ch;
  }
  // Get as a ChannelFactory; valid while this cache lives.
  ChannelFactory Factory() {
    return [this](const std::string& address) { return Get(address); };
  }

 private:
  const ChannelFactory make_;
  Mutex mu_;
  std::map<std::string, std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
};

}  // namespace baton

#endif  // BATON_WORKER_CHANNEL_CACHE_H_
