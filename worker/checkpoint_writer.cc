#include "worker/checkpoint_writer.h"

#include <chrono>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace baton {

CheckpointWriter::CheckpointWriter(std::string job_dir, std::vector<std::string> block_names,
                                   int keep, const std::atomic<bool>* stop)
    : job_dir_(std::move(job_dir)),
      block_names_(std::move(block_names)),
      keep_(keep),
      stop_(stop) {}

CheckpointWriter::~CheckpointWriter() {
  if (pending_.valid()) pending_.wait();
}

void CheckpointWriter::Start(CheckpointSnapshot snap, int64_t step, absl::Duration snapshot_time) {
  absl::Duration waited;
  if (pending_.valid()) {
    const absl::Time t0 = absl::Now();
    finished_.push_back(pending_.get());
    waited = absl::Now() - t0;
  }
  pending_ = std::async(std::launch::async, [this, snap = std::move(snap), step,
                                             stall = snapshot_time + waited]() {
    Done d;
    d.step = step;
    d.bytes = snap.file_bytes();
    d.stall = stall;
    const absl::Time t0 = absl::Now();
    d.status = WriteSnapshot(snap, stop_);
    d.write = absl::Now() - t0;
    if (d.status.ok()) {
      // Every rank prunes after its write; the last to finish a checkpoint sees it
      // complete. Pruning keeps the newest `keep` complete checkpoints (by their manifests)
      // and leaves newer incomplete ones alone, so it is safe while other ranks still write.
      absl::StatusOr<std::vector<int64_t>> pruned = PruneCheckpoints(job_dir_, block_names_, keep_);
      if (!pruned.ok()) {
        std::fprintf(stderr, "worker: pruning checkpoints: %s\n",
                     pruned.status().ToString().c_str());
      }
    } else {
      d.status = absl::Status(d.status.code(), absl::StrCat("checkpoint after step ", step, ": ",
                                                            d.status.message()));
    }
    return d;
  });
}

std::vector<CheckpointWriter::Done> CheckpointWriter::Poll() {
  if (pending_.valid() &&
      pending_.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
    finished_.push_back(pending_.get());
  }
  return std::exchange(finished_, {});
}

std::vector<CheckpointWriter::Done> CheckpointWriter::Wait() {
  if (pending_.valid()) finished_.push_back(pending_.get());
  return std::exchange(finished_, {});
}

}  // namespace baton
