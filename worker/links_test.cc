#include "worker/links.h"

#include <set>
#include <string>
#include <vector>

#include "common/schedule/generators.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

Schedule Build(ScheduleKind kind, int ranks, int virtual_stages, int microbatches) {
  ScheduleOptions o;
  o.kind = kind;
  o.num_ranks = ranks;
  o.virtual_stages = virtual_stages;
  o.num_microbatches = microbatches;
  absl::StatusOr<Schedule> s = BuildSchedule(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

TEST(NeighboursTest, PipelineNeighboursAndTheInterleavedWrapAround) {
  const Schedule s = Build(ScheduleKind::k1F1B, 4, 1, 4);
  EXPECT_EQ(Neighbours(s, 0), (std::set<int>{1}));
  EXPECT_EQ(Neighbours(s, 2), (std::set<int>{1, 3}));
  EXPECT_EQ(Neighbours(s, 3), (std::set<int>{2}));
  // Interleaved: stage 3 (rank 3, chunk 0) feeds stage 4 (rank 0, chunk 1).
  const Schedule i = Build(ScheduleKind::kInterleaved1F1B, 4, 2, 4);
  EXPECT_EQ(Neighbours(i, 0), (std::set<int>{1, 3}));
  EXPECT_EQ(Neighbours(i, 3), (std::set<int>{0, 2}));
  EXPECT_TRUE(Neighbours(Build(ScheduleKind::k1F1B, 1, 1, 2), 0).empty());
}

baton::v1::JobPlan Plan(int rank, const std::vector<std::string>& uuids,
                        const std::vector<bool>& nccl) {
  baton::v1::JobPlan plan;
  plan.set_rank(rank);
  plan.set_num_ranks(static_cast<int>(uuids.size()));
  plan.mutable_spec()->set_device(baton::v1::DEVICE_KIND_CUDA);
  for (size_t r = 0; r < uuids.size(); ++r) {
    baton::v1::Peer* p = plan.add_peers();
    p->set_rank(static_cast<int>(r));
    p->set_worker_id("w-" + std::to_string(r));
    p->mutable_device()->set_kind("cuda");
    p->mutable_device()->set_uuid(uuids[r]);
    p->add_capabilities("transport/grpc");
    if (nccl[r]) p->add_capabilities(kNcclCapability);
  }
  return plan;
}

TEST(PlanLinksTest, NcclOnlyBetweenDistinctGpusThatBothRunIt) {
  // Ranks 0 and 1 share a GPU; rank 2 has no NCCL; rank 3 is a fine GPU of its own.
  const std::vector<std::string> uuids = {"GPU-a", "GPU-a", "GPU-c", "GPU-d"};
  const std::vector<bool> nccl = {true, true, false, true};
  std::vector<LinkPlan> l = PlanLinks(Plan(1, uuids, nccl), {0, 2, 3});
  ASSERT_EQ(l.size(), 3u);
  EXPECT_FALSE(l[0].nccl);
  EXPECT_EQ(l[0].reason,
            "grpc: ranks 0 and 1 share GPU GPU-a (NCCL cannot connect two ranks on one device)");
  EXPECT_FALSE(l[1].nccl);
  EXPECT_EQ(l[1].reason, "grpc: worker w-2 (rank 2) cannot run NCCL");
  EXPECT_TRUE(l[2].nccl);
  // Both ends decide alike.
  std::vector<LinkPlan> back = PlanLinks(Plan(3, uuids, nccl), {1});
  ASSERT_EQ(back.size(), 1u);
  EXPECT_TRUE(back[0].nccl);
}

TEST(PlanLinksTest, TheSpecAndTheDeviceComeFirst) {
  baton::v1::JobPlan plan = Plan(0, {"GPU-a", "GPU-b"}, {true, true});
  plan.mutable_spec()->set_transport(baton::v1::TRANSPORT_KIND_GRPC);
  EXPECT_EQ(PlanLinks(plan, {1})[0].reason, "grpc: asked for");
  plan.mutable_spec()->set_transport(baton::v1::TRANSPORT_KIND_UNSPECIFIED);
  plan.mutable_spec()->set_device(baton::v1::DEVICE_KIND_CPU);
  EXPECT_EQ(PlanLinks(plan, {1})[0].reason, "grpc: the job computes on the CPU");
  plan.mutable_spec()->set_device(baton::v1::DEVICE_KIND_CUDA);
  EXPECT_TRUE(PlanLinks(plan, {1})[0].nccl);
}

TEST(PlanLinksTest, KeysNameTheJob) {
  EXPECT_EQ(VerdictKey(7, 0, 1, 2), "baton/nccl/job/7/attempt/0/verdict/1->2");
  EXPECT_EQ(VerdictKey(7, 0, 1, 2).rfind(JobRendezvousPrefix(7), 0), 0u);
}

// A data-parallel group's engine: the replicas' peers as the plan lists them.
baton::v1::JobPlan GroupPlan(const std::vector<std::string>& uuids, const std::vector<bool>& nccl) {
  baton::v1::JobPlan plan = Plan(0, uuids, nccl);
  plan.mutable_replica_peers()->CopyFrom(plan.peers());
  plan.mutable_spec()->mutable_pipeline()->set_data_parallel(static_cast<int>(uuids.size()));
  return plan;
}

TEST(PlanGroupEngineTest, NcclForDistinctGpusThatAllRunItGlooOtherwiseWithTheReason) {
  GroupEnginePlan e = PlanGroupEngine(GroupPlan({"GPU-a", "GPU-b", "GPU-c"}, {true, true, true}));
  EXPECT_TRUE(e.nccl) << e.reason;

  e = PlanGroupEngine(GroupPlan({"GPU-a", "GPU-b", "GPU-a"}, {true, true, true}));
  EXPECT_FALSE(e.nccl);
  EXPECT_EQ(e.reason, "gloo: replicas 0 and 2 share GPU GPU-a (NCCL cannot connect two ranks on "
                      "one device)");

  e = PlanGroupEngine(GroupPlan({"GPU-a", "GPU-b"}, {true, false}));
  EXPECT_FALSE(e.nccl);
  EXPECT_EQ(e.reason, "gloo: worker w-1 (replica 1) cannot run NCCL");

  baton::v1::JobPlan cpu = GroupPlan({"GPU-a", "GPU-b"}, {true, true});
  cpu.mutable_spec()->set_device(baton::v1::DEVICE_KIND_CPU);
  e = PlanGroupEngine(cpu);
  EXPECT_FALSE(e.nccl);
  EXPECT_EQ(e.reason, "gloo: the job computes on the CPU");

  baton::v1::JobPlan asked = GroupPlan({"GPU-a", "GPU-b"}, {true, true});
  asked.mutable_spec()->mutable_pipeline()->set_collective_engine(
      baton::v1::COLLECTIVE_ENGINE_GLOO);
  e = PlanGroupEngine(asked);
  EXPECT_FALSE(e.nccl);
  EXPECT_EQ(e.reason, "gloo: asked for");
}

}  // namespace
}  // namespace baton
