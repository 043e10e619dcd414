// Helpers shared by the schedule library's .cc files. Not part of its API.
#ifndef BATON_COMMON_SCHEDULE_INTERNAL_H_
#define BATON_COMMON_SCHEDULE_INTERNAL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/schedule/schedule.h"

namespace baton::schedule_internal {

// Largest stages x micro-batches product the library accepts (dense per-(stage, micro-batch)
// tables are sized by it): 2^22, far above S=64, V=2, M=512 (65536).
inline constexpr int64_t kMaxCells = int64_t{1} << 22;
// Largest rank count accepted.
inline constexpr int kMaxRanks = 1 << 16;

// A point-to-point message is identified by its direction and the stage that produces it:
// the activation stage s sends forward to s+1, or the gradient stage s sends back to s-1.
enum MessageDir : int { kFwdMsg = 0, kBwdMsg = 1 };

inline int64_t MessageId(MessageDir dir, int stage, int mb, int num_stages, int num_mb) {
  return (static_cast<int64_t>(dir) * num_stages + stage) * num_mb + mb;
}

// The message a communication action sends or receives (its producer's stage), or false for
// non-communication actions.
inline bool MessageOf(const Action& a, MessageDir* dir, int* producer_stage) {
  switch (a.kind) {
    case ActionKind::kSendF:
      *dir = kFwdMsg;
      *producer_stage = a.stage;
      return true;
    case ActionKind::kRecvF:
      *dir = kFwdMsg;
      *producer_stage = a.stage - 1;
      return true;
    case ActionKind::kSendB:
      *dir = kBwdMsg;
      *producer_stage = a.stage;
      return true;
    case ActionKind::kRecvB:
      *dir = kBwdMsg;
      *producer_stage = a.stage + 1;
      return true;
    default:
      return false;
  }
}

// A cell of the rank x position grid to mark in an error message.
struct GridMark {
  int rank = 0;
  int index = 0;  // position in ranks[rank]
};

// The rank x time-position grid of `s` (columns = positions in each rank's clock), windowed
// around the marks when it is large, with each marked cell written >like this<. Marks whose
// column falls outside the window are listed at the end of their row.
std::string RenderGrid(const Schedule& s, const std::vector<GridMark>& marks);

// INVALID_ARGUMENT with `reason` on the first line and the marked grid below it.
absl::Status ClockError(const Schedule& s, const std::string& reason,
                        const std::vector<GridMark>& marks);

}  // namespace baton::schedule_internal

#endif  // BATON_COMMON_SCHEDULE_INTERNAL_H_
