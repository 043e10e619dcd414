// The pipeline vocabulary: one table of every schedule baton knows by name, the single
// source for its name and aliases, its job-spec enum value, its generator, how many model
// chunks it places per rank and where, and what it costs. batonctl (submit, plan, get), the
// coordinator, the worker, the in-process trainer and the benchmarks all read it, so a new
// schedule is one entry plus its generator, and an unknown name is refused everywhere with
// the list of known ones.
//
// The job-spec enum (baton.v1.Schedule) is kept as its number so that this library needs
// no protobuf; common/spec/schedule_spec.h converts, and spec_test checks that every
// entry's number has the enum name its entry implies.
#ifndef BATON_COMMON_SCHEDULE_VOCABULARY_H_
#define BATON_COMMON_SCHEDULE_VOCABULARY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/schedule/schedule.h"

namespace baton {

// How a schedule places model chunks on ranks.
enum class ChunkPlacement : uint8_t {
  kOne,      // one chunk per rank: stage s on rank s (V must be 1)
  kLooped,   // V >= 2 chunks per rank, stage s on rank s % S (Megatron's interleaving)
  kV,        // exactly two chunks per rank in a V: rank r holds stages r and 2S-1-r
};

struct ScheduleEntry {
  ScheduleKind kind;
  const char* name;                  // as batonctl, plans, traces and reports spell it
  std::vector<std::string> aliases;  // also accepted when parsing ("interleaved")
  int spec_value;                    // its baton.v1.Schedule number; 0 for custom
  ChunkPlacement placement;
  bool split_backward;  // runs I and W instead of B (zero-bubble family; dualpipe-v mixes both)
  // The fewest micro-batches per rank it runs: M >= this x S (0: no such rule).
  int min_microbatches_per_rank;
  // The compute-only clock for S ranks, V chunks per rank, M micro-batches (options
  // already checked); null for custom (imported from CSV).
  Schedule (*generate)(int num_ranks, int virtual_stages, int num_microbatches);
  // What it costs, for `batonctl plan` and docs/schedules.md: the bubble with unit costs
  // and the peak of micro-batch chunks holding activations on a rank.
  const char* bubble;
  const char* memory;
};

// Every schedule, in the order help texts list them (custom last).
const std::vector<ScheduleEntry>& ScheduleTable();
// The entry of `kind` (every kind has one).
const ScheduleEntry& ScheduleEntryOf(ScheduleKind kind);
// By name or alias, case-insensitive, '_' read as '-'. INVALID_ARGUMENT listing the
// known names for any other.
absl::StatusOr<const ScheduleEntry*> FindScheduleEntry(absl::string_view name);
// By job-spec enum number; 0 (unspecified) is 1F1B, the spec's default. INVALID_ARGUMENT
// naming pipeline.schedule for a number no entry has.
absl::StatusOr<const ScheduleEntry*> ScheduleEntryForSpecValue(int value);
// "gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-v, v-half, dualpipe-v" (with_custom: ", custom" too).
std::string ScheduleNames(bool with_custom = false);

}  // namespace baton

#endif  // BATON_COMMON_SCHEDULE_VOCABULARY_H_
