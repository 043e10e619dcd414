// --init-from-hf DIR, shared by batonctl submit and train-local.
#ifndef BATON_CLIENT_BATONCTL_INIT_FROM_HF_H_
#define BATON_CLIENT_BATONCTL_INIT_FROM_HF_H_

#include "absl/status/status.h"
#include "baton/v1/job.pb.h"
#include "client/batonctl/args.h"

namespace baton::cli {

// With --init-from-hf DIR: sets spec.init.from_hf to DIR. DIR/config.json, when readable
// here, gives a spec without a model its model (ModelSpecFromHfConfig) and checks the model
// of a spec that has one (CheckSpecAgainstHf); a DIR not readable here is left to whoever
// loads it (a cluster's workers read it under their data roots). INVALID_ARGUMENT naming
// the flag otherwise. Without the flag: OK, nothing changed.
absl::Status ApplyInitFromHf(const Args& args, baton::v1::JobSpec* spec);

}  // namespace baton::cli

#endif  // BATON_CLIENT_BATONCTL_INIT_FROM_HF_H_
