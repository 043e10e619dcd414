// Test utility for the planner's tests (common/plan/planner_test.cc) and the tests that run
// its plans (common/pipeline/planner_pipeline_test.cc).
#ifndef BATON_COMMON_PLAN_PLANNER_TEST_UTIL_H_
#define BATON_COMMON_PLAN_PLANNER_TEST_UTIL_H_

#include "absl/strings/str_cat.h"
#include "common/plan/planner.h"
#include "common/spec/spec.h"
#include "gtest/gtest.h"

namespace baton {
namespace planner_test {

// Dimensions are multiples of 16 floats (the allocator rounds to 64 bytes), so predicted
// and allocated bytes can be compared closely.
inline baton::v1::JobSpec Gpt(int layers = 6, int batch = 16) {
  absl::StatusOr<baton::v1::JobSpec> s = ParseJobSpecJson(absl::StrCat(R"({
    "model": {"gpt": {"vocabSize": 32, "context": 16, "dModel": 32, "heads": 2, "layers": )",
                                                                        layers, R"(}},
    "data": {"text": {"inlineText": "a planner should choose what a careful engineer would, and say why the others lost."},
             "batchSize": )", batch, R"(},
    "optimizer": {"adamw": {"learningRate": 0.01}},
    "device": "DEVICE_KIND_CPU", "steps": 2, "seed": 4})"));
  EXPECT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(ValidateAndDefaultJobSpec(&*s).ok());
  return *s;
}

inline PlannerInput AutoInput(const baton::v1::JobSpec& spec, int stages) {
  PlannerInput in = PlannerInputFor(spec, stages);
  in.schedule.reset();
  in.virtual_stages = 0;
  in.microbatches = 0;
  in.keep = 1000;
  return in;
}

}  // namespace planner_test
}  // namespace baton

#endif  // BATON_COMMON_PLAN_PLANNER_TEST_UTIL_H_
