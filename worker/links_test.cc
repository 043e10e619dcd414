#include "worker/links.h"

#include <set>
#include <string>
#include <tuple>
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

// The inbox of a rank accepts exactly what its clock receives: for rank 1 of 1F1B on 3
// ranks, stage 0's activations from rank 0 and stage 2's gradients from rank 2; with the
// interleaved schedule, also what wraps around between the chunks.
TEST(PlanInboxTest, TheInboxAcceptsWhatTheClockReceives) {
  baton::v1::JobPlan plan = Plan(1, {"", "", ""}, {false, false, false});
  plan.set_job_key(42);
  plan.mutable_peers(0)->set_identity("baton-worker-0");
  plan.mutable_peers(2)->set_identity("baton-worker-2");
  const InboxPlan p = PlanInbox(plan, Build(ScheduleKind::k1F1B, 3, 1, 4), 1000);
  EXPECT_EQ(p.job_key, 42u);
  EXPECT_EQ(p.capacity_bytes, 1000);
  EXPECT_EQ(p.num_ranks, 3);
  EXPECT_EQ(p.identities, (std::vector<std::string>{"baton-worker-0", "", "baton-worker-2"}));
  EXPECT_EQ(p.sources, (std::vector<InboxSource>{{0, 0, TensorKind::kActivation},
                                                 {2, 2, TensorKind::kGradient}}));
  // Rank 0 of the interleaved schedule (stages 0 and 4 of 8 on 4 ranks) receives stage 3's
  // activations from rank 3 and stage 1's and 5's gradients from rank 1.
  plan.set_rank(0);
  plan.set_num_ranks(4);
  const InboxPlan i = PlanInbox(plan, Build(ScheduleKind::kInterleaved1F1B, 4, 2, 4), 1000);
  std::set<std::tuple<int, int, int>> got;
  for (const InboxSource& s : i.sources) got.insert({s.rank, s.stage, static_cast<int>(s.kind)});
  EXPECT_EQ(got, (std::set<std::tuple<int, int, int>>{
                     {3, 3, static_cast<int>(TensorKind::kActivation)},
                     {1, 1, static_cast<int>(TensorKind::kGradient)},
                     {1, 5, static_cast<int>(TensorKind::kGradient)}}));
}

// CLIP_GRAD: the norm's chain runs between ranks r and r + 1 (adjacent stages under every
// placement), both ways; the inbox accepts both directions' gradient-norm tensors.
TEST(PlanInboxTest, TheGradientNormChainLinksAdjacentRanks) {
  absl::StatusOr<Schedule> s = AddGradClips(Build(ScheduleKind::kZbV, 3, 2, 6));
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(Neighbours(*s, 0), (std::set<int>{1}));
  EXPECT_EQ(Neighbours(*s, 1), (std::set<int>{0, 2}));
  EXPECT_EQ(Neighbours(*s, 2), (std::set<int>{1}));
  baton::v1::JobPlan plan = Plan(1, {"", "", ""}, {false, false, false});
  const InboxPlan p = PlanInbox(plan, *s, 1000);
  std::set<std::tuple<int, int, int>> got;
  for (const InboxSource& src : p.sources) {
    if (src.kind == TensorKind::kGradNorm) got.insert({src.rank, src.stage, 0});
  }
  EXPECT_EQ(got, (std::set<std::tuple<int, int, int>>{{0, 0, 0}, {2, 2, 0}}));
  EXPECT_TRUE(Neighbours(*AddGradClips(Build(ScheduleKind::k1F1B, 1, 1, 2)), 0).empty());
}

TEST(RendezvousMembersTest, TheJobsRanksAndReplicasOrAnyoneWithoutCertificates) {
  baton::v1::JobPlan plan = Plan(0, {"", ""}, {false, false});
  EXPECT_TRUE(RendezvousMembers(plan).empty());  // no identities: plaintext
  plan.mutable_peers(0)->set_identity("baton-worker-0");
  plan.mutable_peers(1)->set_identity("baton-worker-1");
  baton::v1::Peer* replica = plan.add_replica_peers();
  replica->set_identity("baton-worker-5");
  EXPECT_EQ(RendezvousMembers(plan),
            (std::vector<std::string>{"baton-worker-0", "baton-worker-1", "baton-worker-5"}));
}

}  // namespace
}  // namespace baton
