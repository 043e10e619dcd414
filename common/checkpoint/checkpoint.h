// Checkpoints: a job's training state after a step, block by block.
//
// Layout, under the job's checkpoint directory (dir/JOB):
//   step-N/<block>.safetensors   one file per block: its parameters under their own names
//                                ("block.3.attn.qkv.weight") and its optimizer state as
//                                "optimizer.<slot>.<parameter>" (slots named as PyTorch
//                                names them: momentum_buffer; exp_avg, exp_avg_sq); metadata
//                                format, job, step, block, optimizer_steps
//   step-N/manifest.rank-R.json  what rank R wrote: each block's file, bytes and SHA-256
//   step-N/manifest.rank-R.part-P.json  the same for part P > 0 of rank R's blocks, when
//                                the replicas of a sharded optimizer each write a part
// A step is a complete checkpoint when its manifests name every block of the model once and
// every file matches its SHA-256. Because files are per block, a checkpoint written by one
// partition of the model loads into any other (another number of stages, or one process).
//
// Every file is written atomically (a temporary file, fsync, rename, fsync of the
// directory): a reader sees a whole file or none. A manifest is written after its block
// files, so a manifest never names a file that is not there.
//
// Thread safety: functions touch only the paths they are given; concurrent writers must
// write different blocks (each rank its own).
#ifndef BATON_COMMON_CHECKPOINT_CHECKPOINT_H_
#define BATON_COMMON_CHECKPOINT_CHECKPOINT_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "common/nn/module.h"
#include "common/optim/optimizer.h"

namespace baton {

// The "format" metadata of every block file.
inline constexpr char kCheckpointFormat[] = "baton-checkpoint-1";

// dir/JOB/step-N (no trailing slash).
std::string CheckpointJobDir(const std::string& dir, const std::string& job);
std::string CheckpointStepDir(const std::string& job_dir, int64_t step);

// Writes `bytes` to `path` atomically (see above). Errors name the path and the call.
// `stop` (may be null) is read before every 8 MiB written: once true, the temporary file
// is removed, `path` is left as it was, and the result is ABORTED.
absl::Status WriteFileAtomically(const std::string& path, absl::string_view bytes,
                                 const std::atomic<bool>* stop = nullptr);

// Checks that `dir` can hold checkpoints: creates it if needed and writes and removes a
// probe file. FAILED_PRECONDITION naming the directory and the reason otherwise.
absl::Status CheckCheckpointDirWritable(const std::string& dir);

struct CheckpointBlockFile {
  std::string block;   // the block's name ("embed", "block.3", "head", "hidden.0", "out")
  int index = 0;       // its place in the model's canonical block order
  std::string file;    // relative to the step directory
  std::string sha256;  // hex
  int64_t bytes = 0;
};

struct CheckpointWriteInfo {
  std::string job;   // recorded in the metadata
  int rank = 0;      // names the manifest
  int64_t step = 0;  // steps done: the state after step `step`
  int num_blocks = 0;               // blocks in the whole model
  std::vector<int> block_indices;   // the canonical index of each block written, in order
  // Which part of the rank's blocks this is, when several writers share them (the replicas
  // of a sharded optimizer); part 0 is "manifest.rank-R.json", part P "…rank-R.part-P.json".
  int part = 0;
};

// A rank's checkpoint encoded in memory: every block file's bytes and the manifest, taken
// between steps so that writing it can overlap the next steps (the model may change while
// a snapshot is written; the snapshot does not). Holds a copy of the rank's weights and
// optimizer state in host memory until written.
struct CheckpointSnapshot {
  std::string step_dir;
  std::vector<CheckpointBlockFile> files;
  std::vector<std::string> contents;  // parallel to files
  std::string manifest;               // its JSON
  std::string manifest_file;          // "manifest.rank-R.json" (or "…rank-R.part-P.json")
  int64_t file_bytes() const;         // sum of files[].bytes
};
// Encodes `blocks` (their parameters and, from `optimizer`, their slots) and the rank's
// manifest, to be written into `step_dir` (created if needed) by WriteSnapshot. The
// optimizer covers the blocks' parameters (it may cover more: a rank's other chunks).
absl::StatusOr<CheckpointSnapshot> SnapshotBlocks(const std::string& step_dir,
                                                  const CheckpointWriteInfo& info,
                                                  const std::vector<Module*>& blocks,
                                                  Optimizer& optimizer);
// The same from the slots given, and the optimizer's step count: a sharded optimizer's own
// slots completed with the state other replicas own (stage_executor.h).
absl::StatusOr<CheckpointSnapshot> SnapshotBlocks(const std::string& step_dir,
                                                  const CheckpointWriteInfo& info,
                                                  const std::vector<Module*>& blocks,
                                                  const std::vector<Optimizer::Slot>& slots,
                                                  int64_t optimizer_steps);
// Writes a snapshot: the block files, then the manifest, each atomically. Thread-safe for
// different snapshots; touches nothing but the files. Once `stop` (may be null) reads true
// it ends with ABORTED (WriteFileAtomically), before the manifest: the step directory is
// then an incomplete checkpoint, which resume skips and pruning removes.
absl::Status WriteSnapshot(const CheckpointSnapshot& snap,
                           const std::atomic<bool>* stop = nullptr);

// A step directory's manifests, merged.
struct CheckpointIndex {
  int64_t step = 0;
  int num_blocks = 0;  // blocks in the whole model, as the manifests say
  std::map<std::string, CheckpointBlockFile> blocks;  // by block name
};
// NOT_FOUND when the directory has no manifest; DATA_LOSS when a manifest cannot be parsed
// or two name the same block differently.
absl::StatusOr<CheckpointIndex> ReadCheckpointIndex(const std::string& step_dir);

// Loads `blocks`' parameters and their optimizer slots from `step_dir` and sets the
// optimizer's step count; returns the checkpoint's step. Every file is checked against its
// manifest's SHA-256 first (DATA_LOSS naming the file on a mismatch). INVALID_ARGUMENT
// naming the tensor when the checkpoint does not fit the model (a missing or extra tensor,
// another shape, another optimizer). Nothing is partly loaded into a parameter, but on an
// error some blocks may have been loaded: the caller discards the model.
absl::StatusOr<int64_t> LoadBlocks(const std::string& step_dir,
                                   const std::vector<Module*>& blocks, Optimizer& optimizer);
// The same into the slots given (every slot of the blocks' parameters: the checkpoint must
// hold exactly those); `*steps_taken` receives the optimizer's step count from the files
// (-1 with no block).
absl::StatusOr<int64_t> LoadBlocks(const std::string& step_dir, const std::vector<Module*>& blocks,
                                   const std::vector<Optimizer::Slot>& slots, int64_t* steps_taken);

// The steps that have a directory under `job_dir`, ascending (none when it does not exist).
std::vector<int64_t> ListCheckpointSteps(const std::string& job_dir);

// Whether step_dir is a complete checkpoint of the named blocks (empty: of every block its
// manifests say the model has): OK, or why not (NOT_FOUND: no manifest or a block missing;
// DATA_LOSS: a file missing or failing its SHA-256). Files are read in pieces
// (VerifyBlockFile), never whole.
absl::Status VerifyCheckpoint(const std::string& step_dir,
                              const std::vector<std::string>& block_names);

// The newest step <= `at_most` (-1: any) that is a complete checkpoint of the named blocks.
// Each newer step skipped is appended to `skipped` with why. NOT_FOUND when there is none.
absl::StatusOr<int64_t> LatestCompleteCheckpoint(const std::string& job_dir,
                                                 const std::vector<std::string>& block_names,
                                                 int64_t at_most,
                                                 std::vector<std::string>* skipped);

// The checkpoint to resume or export: the newest complete one when `step` is -1, else step
// `step`, which must be complete (NOT_FOUND naming it otherwise). `skipped` as above.
absl::StatusOr<int64_t> FindCheckpoint(const std::string& job_dir,
                                       const std::vector<std::string>& block_names, int64_t step,
                                       std::vector<std::string>* skipped);

// Deletes all but the newest `keep` (>= 1) step directories that are complete checkpoints
// of the named blocks, and every incomplete one older than the oldest of those kept.
// Newer incomplete ones (being written) are left alone. Returns the steps deleted. Safe to
// run from every rank at once (a directory another pruner removed first is not an error).
absl::StatusOr<std::vector<int64_t>> PruneCheckpoints(const std::string& job_dir,
                                                      const std::vector<std::string>& block_names,
                                                      int keep);

// The block names of a complete index in canonical order; NOT_FOUND naming the first
// missing index when the manifests do not cover every block.
absl::StatusOr<std::vector<std::string>> CheckpointBlockOrder(const CheckpointIndex& index);

// The model's weights (no optimizer state) from a complete checkpoint, as one safetensors
// file: every parameter under its name, blocks in canonical order; metadata format, job,
// step. Files are checked against their SHA-256. The whole file in memory: to send or write
// a large model, stream it with WeightsExport (block_stream.h), which this gathers.
absl::StatusOr<std::string> ExportWeights(const std::string& step_dir);

}  // namespace baton

#endif  // BATON_COMMON_CHECKPOINT_CHECKPOINT_H_
