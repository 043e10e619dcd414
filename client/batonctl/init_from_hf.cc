#include "client/batonctl/init_from_hf.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/checkpoint/hf.h"

namespace baton::cli {

absl::Status ApplyInitFromHf(const Args& args, baton::v1::JobSpec* spec) {
  if (!args.Has("init-from-hf")) return absl::OkStatus();
  const std::string dir = args.Get("init-from-hf");
  spec->mutable_init()->set_from_hf(dir);
  absl::StatusOr<google::protobuf::Struct> config = ReadHfConfig(dir);
  const bool has_model =
      spec->model().architecture_case() != baton::v1::ModelSpec::ARCHITECTURE_NOT_SET;
  if (!has_model) {
    if (!config.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--init-from-hf: the spec has no model, and ", config.status().message()));
    }
    absl::StatusOr<baton::v1::ModelSpec> model = ModelSpecFromHfConfig(*config);
    if (!model.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--init-from-hf ", dir, ": ", model.status().message()));
    }
    *spec->mutable_model() = *std::move(model);
    return absl::OkStatus();
  }
  if (!config.ok()) return absl::OkStatus();  // not here: the workers check it
  if (absl::Status s = CheckSpecAgainstHf(spec->model(), *config); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--init-from-hf ", dir, ": ", s.message()));
  }
  return absl::OkStatus();
}

}  // namespace baton::cli
