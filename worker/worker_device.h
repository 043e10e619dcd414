// The device a worker owns: one GPU, or the CPU when it has none.
#ifndef BATON_WORKER_WORKER_DEVICE_H_
#define BATON_WORKER_WORKER_DEVICE_H_

#include <string>

#include "absl/status/statusor.h"
#include "baton/v1/cluster.pb.h"

namespace baton {

// Claims the device named by a worker's --device flag: "" (the first visible GPU, else
// the CPU), "cpu", "cuda" or "cuda:N". For a GPU it makes that device the process's CUDA
// device (cuda_context.h) and checks it works (a small kernel and copies). Returns what
// the worker registers with: kind, name, memory, and for a GPU its index and compute
// capability. INVALID_ARGUMENT for a name that is none of those or a GPU that does not
// exist; UNAVAILABLE when the GPU fails its self-test.
absl::StatusOr<baton::v1::DeviceInfo> ClaimDevice(const std::string& flag);

}  // namespace baton

#endif  // BATON_WORKER_WORKER_DEVICE_H_
