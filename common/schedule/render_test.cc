#include "common/schedule/render.h"

#include <string>

#include "common/schedule/generators.h"
#include "common/schedule/validate.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

struct Planned {
  Schedule schedule;
  SimResult sim;
};

Planned Plan(const ScheduleOptions& o, const Costs& c = Costs()) {
  absl::StatusOr<Schedule> s = BuildSchedule(o);
  EXPECT_TRUE(s.ok()) << s.status();
  absl::StatusOr<SimResult> r = Simulate(*s, c);
  EXPECT_TRUE(r.ok()) << r.status();
  return {*s, *r};
}

size_t Count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

TEST(RenderTest, TableIsATimeGrid) {
  const Planned p = Plan({ScheduleKind::k1F1B, 2, 1, 2});
  const std::string table = RenderTable(p.schedule, &p.sim);
  EXPECT_EQ(table,
            "1f1b: S=2 ranks, V=1, M=2 micro-batches, 2 stages\n"
            "makespan 9, bubble ratio 0.3333 (idle / total rank-time)\n"
            "time   | 0                   5\n"
            "rank 0 | 0F0 0F1 .   .   0B0 --- .   0B1 ---\n"
            "rank 1 | .   1F0 1B0 --- 1F1 1B1 --- .   .\n"
            "rank 0: busy 6, idle 3, peak in-flight 2\n"
            "rank 1: busy 6, idle 3, peak in-flight 1\n");
}

TEST(RenderTest, TableFallsBackToPositionsForUnevenCosts) {
  Costs c;
  c.f = 1;
  c.i = 0.7;
  c.w = 0.7;
  const Planned p = Plan({ScheduleKind::k1F1B, 2, 1, 2}, c);
  const std::string table = RenderTable(p.schedule, &p.sim);
  EXPECT_NE(table.find("columns are clock positions"), std::string::npos) << table;
  EXPECT_NE(table.find("rank 1 | 1F0 1B0 1F1 1B1"), std::string::npos) << table;
  // Without a simulation: the whole lowered clock.
  const std::string plain = RenderTable(p.schedule, nullptr);
  EXPECT_NE(plain.find("rank 0 | 0F0      0SEND_F0"), std::string::npos) << plain;
}

TEST(RenderTest, JsonCarriesTheRequiredFields) {
  const Planned p = Plan({ScheduleKind::kInterleaved1F1B, 2, 2, 2});
  Costs c;
  const std::string json = RenderJson(p.schedule, &p.sim, &c);
  for (const char* key :
       {"\"schedule\": \"interleaved-1f1b\"", "\"stages\": 2", "\"virtual\": 2",
        "\"microbatches\": 2", "\"num_stages\": 4", "\"stage_to_rank\": [0, 1, 0, 1]",
        "\"makespan\": ", "\"bubble_ratio\": ", "\"peak_inflight\": [", "\"busy\": [",
        "\"costs\": {\"F\": 1, \"B\": 2,", "\"ranks\": [", "\"0F0\"", "\"STEP\""}) {
    EXPECT_NE(json.find(key), std::string::npos) << key << "\n" << json;
  }
  EXPECT_EQ(json.front(), '{');
  EXPECT_EQ(json.substr(json.size() - 2), "}\n");
  // Balanced brackets (python's json.loads is run on this output by client/batonctl's test).
  EXPECT_EQ(Count(json, "["), Count(json, "]"));
  EXPECT_EQ(Count(json, "{"), Count(json, "}"));
}

TEST(RenderTest, SvgDrawsEveryComputeAction) {
  const Planned p = Plan({ScheduleKind::kZbH1, 4, 1, 8});
  const std::string svg = RenderSvg(p.schedule, p.sim);
  EXPECT_EQ(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_NE(svg.find("zb-h1: S=4, V=1, M=8; makespan 27, bubble 11.1%"), std::string::npos);
  for (const char* legend : {"F forward", "I input gradient", "W weight gradient", "idle"}) {
    EXPECT_NE(svg.find(legend), std::string::npos) << legend;
  }
  // 4 ranks x 8 micro-batches x (F, I, W): one rectangle each, with a tooltip.
  EXPECT_EQ(Count(svg, "<title>"), 4u * 8 * 3);
  EXPECT_NE(svg.find("<title>2I5 ["), std::string::npos);
}

}  // namespace
}  // namespace baton
