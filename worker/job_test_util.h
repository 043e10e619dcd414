// Helpers for tests that run jobs on workers in one process: a tiny MLP job split over
// two ranks, the plans the coordinator would send for it, each worker's receiving end
// (inbox, rendezvous box, TensorService on loopback), and what the reference trainer
// computes for the same job. Test-only.
#ifndef BATON_WORKER_JOB_TEST_UTIL_H_
#define BATON_WORKER_JOB_TEST_UTIL_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "baton/v1/worker.pb.h"
#include "common/plan/clock_proto.h"
#include "common/core/digest.h"
#include "common/nn/model.h"
#include "common/plan/partition.h"
#include "common/rpc/rpc.h"
#include "common/schedule/generators.h"
#include "common/schedule/schedule.h"
#include "common/spec/spec.h"
#include "common/train/reference_trainer.h"
#include "common/transport/rendezvous_test_util.h"
#include "common/transport/rendezvous.h"
#include "common/transport/tensor_inbox.h"
#include "common/transport/tensor_service.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace baton {
namespace testing_util {

// client/examples/mlp-tiny.json, split over two ranks.
inline constexpr char kTinyMlp[] = R"json({
  "name": "mlp-tiny",
  "model": {"mlp": {"inputDim": 8, "width": 32, "depth": 4, "outputDim": 4}},
  "data": {"synthetic": {"teacherWidth": 16, "noise": 0}, "batchSize": 32},
  "pipeline": {"stages": 2, "microbatches": 4, "schedule": "SCHEDULE_1F1B"},
  "optimizer": {"sgd": {"learningRate": 0.05, "momentum": 0.9}},
  "steps": 4,
  "seed": 1
})json";

inline constexpr int kRanks = 2;

inline baton::v1::JobSpec TinySpec(int64_t steps) {
  baton::v1::JobSpec spec;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(kTinyMlp, &spec).ok());
  spec.set_steps(steps);
  EXPECT_TRUE(ValidateAndDefaultJobSpec(&spec).ok());
  return spec;
}

// A worker's receiving end: its inbox and rendezvous box, served on loopback (the
// transport tests' RendezvousNode).
using Node = RendezvousNode;
inline std::unique_ptr<Node> StartNode() { return std::make_unique<Node>(); }

// The plans the coordinator sends for `spec` on workers w-0, w-1 at `addresses` (as
// coordinator/placement.cc builds them: 1F1B, FLOP-balanced blocks, every peer listed).
inline std::vector<baton::v1::JobPlan> Plans(const baton::v1::JobSpec& spec,
                                             const std::string& job_id,
                                             const std::vector<std::string>& addresses) {
  ScheduleOptions o;
  o.kind = ScheduleKind::k1F1B;
  o.num_ranks = kRanks;
  o.num_microbatches = spec.pipeline().microbatches();
  o.num_blocks = ModelBlockCount(spec.model());
  absl::StatusOr<Schedule> sc = BuildSchedule(o);
  EXPECT_TRUE(sc.ok()) << sc.status();
  absl::StatusOr<std::vector<BlockRange>> blocks =
      PartitionBlocks(DescribeBlocks(spec.model()), sc->num_stages());
  EXPECT_TRUE(blocks.ok()) << blocks.status();
  baton::v1::JobPlan common;
  common.set_job_id(job_id);
  common.set_job_key(0x5eed0000 + std::hash<std::string>()(job_id) % 1000);
  *common.mutable_spec() = spec;
  common.mutable_spec()->set_device(baton::v1::DEVICE_KIND_CPU);
  common.set_num_ranks(kRanks);
  common.set_schedule_kind(ScheduleKindToProto(sc->kind));
  common.set_virtual_stages(sc->virtual_stages);
  common.set_microbatches(sc->num_microbatches);
  for (int r : sc->stage_to_rank) common.add_stage_to_rank(r);
  for (int s = 0; s < sc->num_stages(); ++s) {
    baton::v1::StagePlan* sp = common.add_stages();
    sp->set_stage(s);
    sp->set_first_block((*blocks)[s].first);
    sp->set_last_block((*blocks)[s].last);
  }
  // Only bounds a hang: the ranks' threads may start far apart, and the tests that stop a
  // run waiting for a peer must see it stopped, not timed out (a test of the deadline sets
  // its own).
  *common.mutable_recv_timeout() = ToProtoDuration(absl::Seconds(60));
  common.set_data_parallel(1);
  std::vector<baton::v1::JobPlan> plans;
  for (int r = 0; r < kRanks; ++r) {
    baton::v1::JobPlan plan = common;
    plan.set_rank(r);
    for (int q = 0; q < kRanks; ++q) {
      baton::v1::Peer* peer = plan.add_peers();
      peer->set_rank(q);
      peer->set_worker_id(absl::StrCat("w-", q));
      peer->set_address(addresses[q]);
      peer->mutable_device()->set_kind("cpu");
      peer->add_capabilities("transport/grpc");
    }
    for (const Action& a : sc->ranks[r]) *plan.add_clock() = ActionToProto(a);
    plans.push_back(std::move(plan));
  }
  return plans;
}

// The reference trainer's block digests (hex, by block index) and step losses after
// `steps` steps of `spec`.
struct Reference {
  std::map<int, std::string> digests;
  std::vector<float> losses;
};
inline Reference Train(const baton::v1::JobSpec& spec, int64_t steps) {
  Reference ref;
  absl::StatusOr<std::unique_ptr<ReferenceTrainer>> t = ReferenceTrainer::Create(spec);
  EXPECT_TRUE(t.ok()) << t.status();
  for (int64_t s = 0; s < steps; ++s) {
    absl::StatusOr<StepStats> st = (*t)->Step();
    EXPECT_TRUE(st.ok()) << st.status();
    ref.losses.push_back(st->loss);
  }
  const std::vector<Digest> d = (*t)->BlockDigests();
  for (int i = 0; i < static_cast<int>(d.size()); ++i) ref.digests[i] = DigestHex(d[i]);
  return ref;
}

}  // namespace testing_util
}  // namespace baton

#endif  // BATON_WORKER_JOB_TEST_UTIL_H_
