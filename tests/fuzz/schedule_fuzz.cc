// libFuzzer target: arbitrary bytes as a schedule CSV (what `batonctl plan --import` and
// custom-schedule specs read), through FromCsv and the validator; and, split off by a first
// byte, as a cost text (ParseCosts) and an action text (Action::Parse). Besides what the
// sanitizers catch, it checks that an imported schedule survives ToCsv and FromCsv again
// unchanged.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/schedule/action.h"
#include "common/schedule/schedule.h"
#include "common/schedule/validate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
      (void)baton::ParseCosts(text);
      return 0;
    case 1:
      (void)baton::Action::Parse(text);
      return 0;
    default:
      break;
  }
  absl::StatusOr<baton::Schedule> s = baton::FromCsv(text);
  if (!s.ok()) return 0;
  (void)baton::Validate(*s);
  const std::string csv = baton::ToCsv(*s);
  absl::StatusOr<baton::Schedule> again = baton::FromCsv(csv);
  if (!again.ok() || baton::ToCsv(*again) != csv) {
    std::fprintf(stderr, "schedule_fuzz: ToCsv output does not import back unchanged: %s\n",
                 again.ok() ? "different CSV" : again.status().ToString().c_str());
    std::abort();
  }
  return 0;
}
