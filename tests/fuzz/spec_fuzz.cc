// libFuzzer target: arbitrary bytes as a job spec in JSON, through the parser and the
// validator every submit runs (ParseJobSpecJson, ValidateAndDefaultJobSpec). Besides what
// the sanitizers catch, it checks the validator's contract: a spec that passed once passes
// again, unchanged (defaults are filled in once).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/spec/spec.h"
#include "google/protobuf/stubs/logging.h"

// Protobuf logs every string field with invalid UTF-8 it meets; quiet, as the services
// would be under the same input if they logged it, which they do not.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*, int,
                                     const std::string&) {});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string json(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<baton::v1::JobSpec> spec = baton::ParseJobSpecJson(json);
  if (!spec.ok()) return 0;
  if (!baton::ValidateAndDefaultJobSpec(&*spec).ok()) return 0;
  const std::string once = spec->SerializeAsString();
  const absl::Status again = baton::ValidateAndDefaultJobSpec(&*spec);
  if (!again.ok() || spec->SerializeAsString() != once) {
    std::fprintf(stderr, "spec_fuzz: a valid spec is not valid again, unchanged: %s\n",
                 again.ToString().c_str());
    std::abort();
  }
  (void)baton::EstimateJobBytes(*spec);
  return 0;
}
