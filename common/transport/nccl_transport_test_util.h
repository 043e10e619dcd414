// Test utility for the NCCL transport's tests and the transport contract suite
// (common/pipeline/transport_contract_test.cc): ranks as threads on the fake NCCL.
#ifndef BATON_COMMON_TRANSPORT_NCCL_TRANSPORT_TEST_UTIL_H_
#define BATON_COMMON_TRANSPORT_NCCL_TRANSPORT_TEST_UTIL_H_

#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "common/nccl/nccl_fake_test_util.h"
#include "common/transport/nccl_transport.h"
#include "gtest/gtest.h"

namespace baton {

// Ranks as threads: each with its own fake NCCL (so faults can differ per rank), its own
// compute stream and its own transport; one in-memory id exchange for all.
class NcclTestCluster {
 public:
  explicit NcclTestCluster(int n, std::map<int, FakeNcclOptions> faults = {},
                           uint64_t job_key = 7, int64_t attempt = 1)
      : job_key_(job_key), attempt_(attempt) {
    for (int r = 0; r < n; ++r) {
      auto rank = std::make_unique<Rank>();
      rank->api = MakeFakeNccl(faults[r]);
      absl::StatusOr<CudaStream> s = rank->api->StreamCreate(0);
      EXPECT_TRUE(s.ok()) << s.status();
      rank->compute = *s;
      ranks_.push_back(std::move(rank));
    }
  }
  ~NcclTestCluster() {
    for (auto& r : ranks_) r->transport.reset();
    for (auto& r : ranks_) EXPECT_TRUE(r->api->StreamDestroy(r->compute).ok());
  }

  int size() const { return static_cast<int>(ranks_.size()); }
  FakeNccl* api(int r) { return ranks_[r]->api.get(); }
  CudaStream compute(int r) { return ranks_[r]->compute; }
  NcclTransport* operator[](int r) { return ranks_[r]->transport.get(); }
  void Destroy(int r) { ranks_[r]->transport.reset(); }
  InMemoryNcclIdExchange& ids() { return ids_; }

  // Rank r of a pipeline: its neighbours are its peers. The bring-up and shutdown bounds
  // are far beyond what load can take, so that they only bound a hang; a test of a timeout
  // sets its own.
  NcclTransport::Options Options(int r) {
    NcclTransport::Options o;
    o.rank = r;
    o.num_ranks = size();
    o.job_key = job_key_;
    o.attempt = attempt_;
    if (r > 0) o.peers.push_back(r - 1);
    if (r + 1 < size()) o.peers.push_back(r + 1);
    o.init_timeout = absl::Seconds(60);
    o.compute_stream = reinterpret_cast<void*>(ranks_[r]->compute);
    o.api = ranks_[r]->api.get();
    o.ids = &ids_;
    o.shutdown_timeout = absl::Seconds(60);
    return o;
  }

  // Creates the transports of `which` (every rank when empty) at once, as separate
  // processes would: each Create waits for its peers. Returns each one's status.
  std::map<int, absl::Status> Start(
      std::vector<int> which = {},
      const std::function<void(NcclTransport::Options&)>& tweak = nullptr,
      std::map<int, std::vector<int>>* failed_peers = nullptr) {
    if (which.empty()) {
      for (int r = 0; r < size(); ++r) which.push_back(r);
    }
    std::map<int, absl::Status> out;
    std::map<int, std::vector<int>> failed;
    std::vector<absl::Status> status(size());
    std::vector<std::vector<int>> lists(size());
    std::vector<std::thread> threads;
    for (int r : which) {
      threads.emplace_back([&, r] {
        NcclTransport::Options o = Options(r);
        if (tweak) tweak(o);
        auto t = NcclTransport::Create(o, &lists[r]);
        status[r] = t.status();
        if (t.ok()) ranks_[r]->transport = *std::move(t);
      });
    }
    for (auto& t : threads) t.join();
    for (int r : which) {
      out[r] = status[r];
      failed[r] = lists[r];
    }
    if (failed_peers != nullptr) *failed_peers = failed;
    return out;
  }

  bool StartAll() {
    bool ok = true;
    for (auto& [r, s] : Start()) {
      EXPECT_TRUE(s.ok()) << "rank " << r << ": " << s;
      ok &= s.ok();
    }
    return ok;
  }

 private:
  const uint64_t job_key_;
  const int64_t attempt_;
  struct Rank {
    std::unique_ptr<FakeNccl> api;
    CudaStream compute = nullptr;
    std::unique_ptr<NcclTransport> transport;
  };
  InMemoryNcclIdExchange ids_;
  std::vector<std::unique_ptr<Rank>> ranks_;
};

}  // namespace baton

#endif  // BATON_COMMON_TRANSPORT_NCCL_TRANSPORT_TEST_UTIL_H_
