#include "client/batonctl/measured_costs.h"

#include "client/batonctl/trace_json.h"
#include "gtest/gtest.h"

namespace baton::cli {
namespace {

baton::v1::ActionSpan* Add(baton::v1::RankTrace* r, const std::string& action, int64_t start_us,
                           int64_t end_us) {
  baton::v1::ActionSpan* s = r->add_actions();
  s->set_action(action);
  s->set_start_ns(start_us * 1000);
  s->set_end_ns(end_us * 1000);
  return s;
}

// Two stages on two ranks, two micro-batches, full backward on stage 0 and split on 1.
baton::v1::JobTrace Trace() {
  baton::v1::JobTrace t;
  t.set_job_id("job-000009");
  t.set_step(4);
  t.set_num_stages(2);
  t.set_schedule("1f1b");
  t.add_stage_to_rank(0);
  t.add_stage_to_rank(1);
  baton::v1::RankTrace* r0 = t.add_ranks();
  r0->set_rank(0);
  Add(r0, "0F0", 0, 2000);
  Add(r0, "0SEND_F0", 2000, 2100);
  Add(r0, "0F1", 2100, 6100);  // forwards 2 ms and 4 ms: mean 3 ms
  Add(r0, "0SEND_F1", 6100, 6300);
  Add(r0, "0RECV_B0", 6300, 9000);
  Add(r0, "0B0", 9000, 15000);
  Add(r0, "0RECV_B1", 15000, 15500);  // the shortest receive: 0.5 ms
  Add(r0, "0B1", 15500, 21500);
  Add(r0, "STEP", 21500, 22500);
  Add(r0, "0SEND_F1", 22500, 23500)->set_send_wait(true);  // not a send's cost
  baton::v1::RankTrace* r1 = t.add_ranks();
  r1->set_rank(1);
  Add(r1, "1RECV_F0", 0, 2100);
  Add(r1, "1F0", 2100, 3100);
  Add(r1, "1I0", 3100, 4100)->set_device_ns(3'000'000);  // a GPU rank: device time counts
  Add(r1, "1W0", 4100, 5100);
  Add(r1, "STEP", 5100, 8100);
  return t;
}

TEST(MeasuredCostsTest, PerStageMeansInMilliseconds) {
  absl::StatusOr<Costs> c = CostsFromTrace(Trace());
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->per_stage.size(), 2u);
  const Costs& s0 = c->per_stage[0];
  EXPECT_DOUBLE_EQ(s0.f, 3.0);
  EXPECT_DOUBLE_EQ(s0.b, 6.0);
  EXPECT_DOUBLE_EQ(s0.i, 3.0);  // no split backward measured: half of B each
  EXPECT_DOUBLE_EQ(s0.w, 3.0);
  EXPECT_DOUBLE_EQ(s0.send, 0.15);
  EXPECT_DOUBLE_EQ(s0.recv, 0.5);
  const Costs& s1 = c->per_stage[1];
  EXPECT_DOUBLE_EQ(s1.f, 1.0);
  EXPECT_DOUBLE_EQ(s1.i, 3.0);
  EXPECT_DOUBLE_EQ(s1.w, 1.0);
  EXPECT_LT(s1.b, 0);  // I + W
  EXPECT_DOUBLE_EQ(s1.recv, 2.1);
  EXPECT_DOUBLE_EQ(c->step, 2.0);
}

// What batonctl trace writes reads back to the same costs.
TEST(MeasuredCostsTest, AChromeTraceReadsBackToTheSameCosts) {
  absl::StatusOr<std::string> json = ChromeTraceJson(Trace());
  ASSERT_TRUE(json.ok()) << json.status();
  absl::StatusOr<baton::v1::JobTrace> back = JobTraceFromChromeJson(*json, "t.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->num_stages(), 2);
  EXPECT_EQ(back->job_id(), "job-000009");
  absl::StatusOr<Costs> a = CostsFromTrace(Trace());
  absl::StatusOr<Costs> b = CostsFromTrace(*back);
  ASSERT_TRUE(a.ok() && b.ok()) << b.status();
  for (int s = 0; s < 2; ++s) {
    EXPECT_NEAR(a->per_stage[s].f, b->per_stage[s].f, 1e-9) << s;
    EXPECT_NEAR(a->per_stage[s].i, b->per_stage[s].i, 1e-9) << s;
    EXPECT_NEAR(a->per_stage[s].w, b->per_stage[s].w, 1e-9) << s;
    EXPECT_NEAR(a->per_stage[s].recv, b->per_stage[s].recv, 1e-9) << s;
    EXPECT_NEAR(a->per_stage[s].send, b->per_stage[s].send, 1e-9) << s;
  }
}

TEST(MeasuredCostsTest, BadTracesAreRefusedNamingWhy) {
  EXPECT_NE(JobTraceFromChromeJson("{", "x.json").status().message().find("x.json: not JSON"),
            std::string::npos);
  EXPECT_NE(JobTraceFromChromeJson("{\"a\": 1}", "x.json").status().message().find(
                "not a baton trace"),
            std::string::npos);
  baton::v1::JobTrace t = Trace();
  t.mutable_ranks(1)->clear_actions();
  Add(t.mutable_ranks(1), "1I0", 0, 1);
  EXPECT_NE(CostsFromTrace(t).status().message().find("no forward of stage 1"),
            std::string::npos);
}

}  // namespace
}  // namespace baton::cli
