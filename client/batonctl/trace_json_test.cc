#include "client/batonctl/trace_json.h"

#include <map>
#include <set>
#include <string>

#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace baton::cli {
namespace {

using ::testing::HasSubstr;

baton::v1::ActionSpan* Add(baton::v1::RankTrace* r, const std::string& action, int64_t start,
                           int64_t end, int64_t bytes = 0, bool wait = false) {
  baton::v1::ActionSpan* s = r->add_actions();
  s->set_action(action);
  s->set_start_ns(start);
  s->set_end_ns(end);
  s->set_bytes(bytes);
  s->set_send_wait(wait);
  return s;
}

// Two ranks, interleaved: rank 0 owns stages 0 and 2, rank 1 stages 1 and 3.
baton::v1::JobTrace Interleaved() {
  baton::v1::JobTrace t;
  t.set_job_id("job-000007");
  t.set_step(3);
  t.set_num_stages(4);
  t.set_schedule("interleaved-1f1b");
  for (int r : {0, 1, 0, 1}) t.add_stage_to_rank(r);
  baton::v1::RankTrace* r0 = t.add_ranks();
  r0->set_rank(0);
  r0->set_worker_id("w-a");
  r0->set_start_unix_nanos(1'000'000'000);
  Add(r0, "0F0", 0, 1000);
  Add(r0, "0SEND_F0", 1000, 1100, 4096);
  Add(r0, "2RECV_F0", 1100, 5000, 4096);
  Add(r0, "2F0", 5000, 6000);
  Add(r0, "STEP", 6000, 6500);
  Add(r0, "0SEND_F0", 6500, 7000, 0, /*wait=*/true);
  baton::v1::RankTrace* r1 = t.add_ranks();
  r1->set_rank(1);
  r1->set_worker_id("w-\"b\"");
  r1->set_start_unix_nanos(1'000'002'000);  // started 2 us after rank 0
  Add(r1, "1RECV_F0", 0, 100, 4096);
  Add(r1, "1F0", 100, 900)->set_device_ns(2500);  // a GPU rank: device time of the action
  Add(r1, "3F0", 900, 1900);
  Add(r1, "STEP", 1900, 2000);
  return t;
}

google::protobuf::Struct Parse(const std::string& json) {
  google::protobuf::Struct out;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &out);
  EXPECT_TRUE(status.ok()) << status.ToString() << "\n" << json;
  return out;
}

// A gradient all-reduce runs on the rank's communication thread: its own row, named, with
// the REDUCE_GRAD it serves and the bytes.
TEST(ChromeTraceJson, AllReducesGetTheCommunicationThreadsRow) {
  baton::v1::JobTrace t = Interleaved();
  Add(t.mutable_ranks(0), "0REDUCE_GRAD", 5200, 9000, 1 << 20)->set_allreduce(true);
  absl::StatusOr<std::string> json = ChromeTraceJson(t);
  ASSERT_TRUE(json.ok()) << json.status();
  const google::protobuf::Struct doc = Parse(*json);
  int spans = 0, names = 0;
  double comm_tid = -1;
  for (const auto& v : doc.fields().at("traceEvents").list_value().values()) {
    const auto& e = v.struct_value().fields();
    if (e.at("ph").string_value() == "M" && e.at("name").string_value() == "thread_name" &&
        e.at("args").struct_value().fields().at("name").string_value() == "gradient all-reduce") {
      ++names;
      EXPECT_EQ(e.at("pid").number_value(), 0);
      comm_tid = e.at("tid").number_value();
    }
    if (e.at("ph").string_value() == "X" && e.at("cat").string_value() == "allreduce") {
      ++spans;
      EXPECT_EQ(e.at("name").string_value(), "all-reduce 0REDUCE_GRAD");
      EXPECT_EQ(e.at("args").struct_value().fields().at("bytes").number_value(), 1 << 20);
      EXPECT_DOUBLE_EQ(e.at("dur").number_value(), 3.8);
      EXPECT_EQ(e.at("tid").number_value(), comm_tid);
    }
  }
  EXPECT_EQ(spans, 1);
  EXPECT_EQ(names, 1);  // only the rank that reduces gets the row
  EXPECT_GT(comm_tid, 3);  // not a stage's row
}

// A measured device time goes into the event's args; unmeasured ones add nothing.
TEST(ChromeTraceJson, DeviceTimeIsAnArgument) {
  absl::StatusOr<std::string> json = ChromeTraceJson(Interleaved());
  ASSERT_TRUE(json.ok()) << json.status();
  const google::protobuf::Struct doc = Parse(*json);
  int with_device = 0;
  for (const auto& v : doc.fields().at("traceEvents").list_value().values()) {
    const auto& e = v.struct_value().fields();
    if (e.at("ph").string_value() != "X") continue;
    const auto& args = e.at("args").struct_value().fields();
    if (args.contains("device_us")) {
      ++with_device;
      EXPECT_EQ(args.at("action").string_value(), "1F0");
      EXPECT_DOUBLE_EQ(args.at("device_us").number_value(), 2.5);
    }
  }
  EXPECT_EQ(with_device, 1);
}

TEST(ChromeTraceJson, OneTrackPerStageAndOneEventPerAction) {
  absl::StatusOr<std::string> json = ChromeTraceJson(Interleaved());
  ASSERT_TRUE(json.ok()) << json.status();
  const google::protobuf::Struct doc = Parse(*json);
  const auto& events = doc.fields().at("traceEvents").list_value().values();
  std::set<std::pair<int, int>> tracks;           // (pid, tid) named by thread_name
  std::map<std::string, int> per_category;
  std::map<std::pair<int, int>, int> per_track;   // complete events per (pid, tid)
  for (const auto& v : events) {
    const auto& e = v.struct_value().fields();
    const std::string ph = e.at("ph").string_value();
    const int pid = static_cast<int>(e.at("pid").number_value());
    if (ph == "M" && e.at("name").string_value() == "thread_name") {
      tracks.insert({pid, static_cast<int>(e.at("tid").number_value())});
    } else if (ph == "X") {
      ++per_category[e.at("cat").string_value()];
      ++per_track[{pid, static_cast<int>(e.at("tid").number_value())}];
    }
  }
  // Stages 0 and 2 on rank 0, 1 and 3 on rank 1: four tracks, one per stage.
  EXPECT_EQ(tracks, (std::set<std::pair<int, int>>{{0, 0}, {0, 2}, {1, 1}, {1, 3}}));
  for (const auto& [track, n] : per_track) EXPECT_TRUE(tracks.count(track)) << track.first;
  EXPECT_EQ(per_category["forward"], 4);
  EXPECT_EQ(per_category["send"], 1);
  EXPECT_EQ(per_category["recv_wait"], 2);
  EXPECT_EQ(per_category["optimizer"], 2);
  EXPECT_EQ(per_category["send_wait"], 1);
  // STEP goes on the rank's first stage: 0 on rank 0, 1 on rank 1.
  EXPECT_EQ((per_track[{0, 0}]), 4);  // 0F0, 0SEND_F0, STEP, wait 0SEND_F0
  EXPECT_EQ((per_track[{1, 1}]), 3);  // 1RECV_F0, 1F0, STEP
  EXPECT_EQ(doc.fields().at("otherData").struct_value().fields().at("step").number_value(), 3);
}

TEST(ChromeTraceJson, AlignsRanksByWallClockInMicroseconds) {
  absl::StatusOr<std::string> json = ChromeTraceJson(Interleaved());
  ASSERT_TRUE(json.ok());
  const google::protobuf::Struct doc = Parse(*json);
  double r1_recv_ts = -1, r0_recv_ts = -1, r0_recv_dur = -1;
  for (const auto& v : doc.fields().at("traceEvents").list_value().values()) {
    const auto& e = v.struct_value().fields();
    if (e.at("ph").string_value() != "X") continue;
    if (e.at("name").string_value() == "1RECV_F0") r1_recv_ts = e.at("ts").number_value();
    if (e.at("name").string_value() == "2RECV_F0") {
      r0_recv_ts = e.at("ts").number_value();
      r0_recv_dur = e.at("dur").number_value();
      EXPECT_EQ(e.at("args").struct_value().fields().at("bytes").number_value(), 4096);
    }
  }
  EXPECT_DOUBLE_EQ(r1_recv_ts, 2.0);   // rank 1 began 2000 ns after rank 0
  EXPECT_DOUBLE_EQ(r0_recv_ts, 1.1);
  EXPECT_DOUBLE_EQ(r0_recv_dur, 3.9);
  EXPECT_THAT(*json, HasSubstr("rank 1 (w-\\\"b\\\")"));  // names are escaped
}

TEST(ChromeTraceJson, RefusesBadActions) {
  baton::v1::JobTrace t = Interleaved();
  t.mutable_ranks(0)->mutable_actions(0)->set_action("0Q0");
  EXPECT_EQ(ChromeTraceJson(t).status().code(), absl::StatusCode::kInvalidArgument);
  t = Interleaved();
  t.mutable_ranks(0)->mutable_actions(0)->set_action("9F0");
  absl::StatusOr<std::string> r = ChromeTraceJson(t);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("stage 9"));
}

}  // namespace
}  // namespace baton::cli
