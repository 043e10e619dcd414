// Writes a rank's checkpoint snapshots on a background thread, one at a time, so that the
// files' writing and fsyncs overlap the next training steps; prunes after each write.
//
// The job thread takes a snapshot between steps (StageExecutor::SnapshotCheckpoint: the
// only time training stands still) and hands it to Start; it asks Poll after each step for
// writes that finished, to report them, and Wait before the last step's report and before
// the job ends. A checkpoint is complete only once every rank's files and manifest are
// written, so a write still in flight when a worker dies leaves an incomplete checkpoint
// that resume skips.
//
// Thread safety: one job thread calls every method; the writes run on a thread of their
// own, which touches only the snapshot it was given and the checkpoint directory.
#ifndef BATON_WORKER_CHECKPOINT_WRITER_H_
#define BATON_WORKER_CHECKPOINT_WRITER_H_

#include <atomic>
#include <cstdint>
#include <future>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/checkpoint/checkpoint.h"

namespace baton {

class CheckpointWriter {
 public:
  struct Done {
    int64_t step = 0;
    int64_t bytes = 0;
    absl::Duration stall;  // training stood still: the snapshot, and waiting for a write
    absl::Duration write;  // the write in the background
    absl::Status status;   // of the write (a failed prune is only logged)
  };

  // `job_dir` is dir/JOB; `block_names` every block of the model (for pruning to `keep`).
  // Once `stop` (not owned, may be null) reads true, a write in flight ends within 8 MiB
  // written (WriteSnapshot), its checkpoint left incomplete, and its Done says ABORTED.
  CheckpointWriter(std::string job_dir, std::vector<std::string> block_names, int keep,
                   const std::atomic<bool>* stop = nullptr);
  ~CheckpointWriter();  // waits for the write in flight

  // Starts writing the snapshot of step `step`, which took `snapshot_time` to take. A write
  // still in flight is waited for first (its Done is kept for Poll; the wait counts as
  // stall of this checkpoint).
  void Start(CheckpointSnapshot snap, int64_t step, absl::Duration snapshot_time);
  // Writes that finished and were not returned yet, oldest first; does not block.
  std::vector<Done> Poll();
  // Waits for the write in flight, then returns every write not returned yet.
  std::vector<Done> Wait();

 private:
  const std::string job_dir_;
  const std::vector<std::string> block_names_;
  const int keep_;
  const std::atomic<bool>* const stop_;
  std::future<Done> pending_;
  std::vector<Done> finished_;
};

}  // namespace baton

#endif  // BATON_WORKER_CHECKPOINT_WRITER_H_
