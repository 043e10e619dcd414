#include "common/schedule/schedule.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/core/status.h"
#include "common/schedule/internal.h"
#include "common/schedule/vocabulary.h"

namespace baton {
namespace {

using schedule_internal::kBwdMsg;
using schedule_internal::kFwdMsg;
using schedule_internal::kMaxCells;
using schedule_internal::kMaxRanks;
using schedule_internal::MessageDir;
using schedule_internal::MessageId;

std::string Lowercase(const std::string& s) {
  std::string out = s;
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string Trim(const std::string& s) {
  size_t b = 0;
  size_t e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

// Checks what Lower needs of its input: a consistent shape and compute actions only, each on
// the rank its stage maps to.
absl::Status CheckLowerable(const Schedule& s) {
  if (s.num_ranks < 1 || s.num_ranks > kMaxRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("Lower: num_ranks must be in [1, ", kMaxRanks, "], got ", s.num_ranks));
  }
  if (static_cast<int>(s.ranks.size()) != s.num_ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("Lower: ", s.ranks.size(), " rank clocks for num_ranks = ", s.num_ranks));
  }
  const int n = s.num_stages();
  if (n < 1) return absl::InvalidArgumentError("Lower: empty stage-to-rank map");
  for (int st = 0; st < n; ++st) {
    const int r = s.stage_to_rank[st];
    if (r < 0 || r >= s.num_ranks) {
      return absl::InvalidArgumentError(absl::StrCat("Lower: stage ", st, " maps to rank ", r,
                                                     ", outside [0, ", s.num_ranks, ")"));
    }
  }
  if (s.num_microbatches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Lower: num_microbatches must be >= 1, got ", s.num_microbatches));
  }
  if (static_cast<int64_t>(n) * s.num_microbatches > kMaxCells) {
    return absl::InvalidArgumentError(absl::StrCat("Lower: ", n, " stages x ", s.num_microbatches,
                                                   " micro-batches is too large (limit ", kMaxCells,
                                                   ")"));
  }
  for (int r = 0; r < s.num_ranks; ++r) {
    for (const Action& a : s.ranks[r]) {
      if (!IsCompute(a.kind) && a.kind != ActionKind::kReduceGrad) {
        return absl::FailedPreconditionError(absl::StrCat(
            "Lower: the schedule is already lowered (rank ", r, " has ", a.ToString(), ")"));
      }
      if (a.stage < 0 || a.stage >= n) {
        return absl::InvalidArgumentError(
            absl::StrCat("Lower: ", a.ToString(), " on rank ", r, ": stage outside [0, ", n, ")"));
      }
      if (a.microbatch < 0 || a.microbatch >= s.num_microbatches) {
        return absl::InvalidArgumentError(absl::StrCat("Lower: ", a.ToString(), " on rank ", r,
                                                       ": micro-batch outside [0, ",
                                                       s.num_microbatches, ")"));
      }
      if (s.stage_to_rank[a.stage] != r) {
        return absl::InvalidArgumentError(absl::StrCat("Lower: ", a.ToString(), " is on rank ", r,
                                                       " but stage ", a.stage, " runs on rank ",
                                                       s.stage_to_rank[a.stage]));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

const char* ScheduleKindName(ScheduleKind k) { return ScheduleEntryOf(k).name; }

absl::StatusOr<ScheduleKind> ParseScheduleKind(const std::string& name) {
  BATON_ASSIGN_OR_RETURN(const ScheduleEntry* e, FindScheduleEntry(name));
  return e->kind;
}

bool Schedule::lowered() const {
  for (const auto& rank : ranks) {
    for (const Action& a : rank) {
      if (!IsCompute(a.kind) && a.kind != ActionKind::kReduceGrad) return true;
    }
  }
  return false;
}

bool Schedule::reduces_grads() const {
  for (const auto& rank : ranks) {
    for (const Action& a : rank) {
      if (a.kind == ActionKind::kReduceGrad) return true;
    }
  }
  return false;
}

bool Schedule::ties_grads() const {
  for (const auto& rank : ranks) {
    for (const Action& a : rank) {
      if (a.kind == ActionKind::kTieGrad) return true;
    }
  }
  return false;
}

bool Schedule::clips_grads() const {
  for (const auto& rank : ranks) {
    for (const Action& a : rank) {
      if (a.kind == ActionKind::kClipGrad) return true;
    }
  }
  return false;
}

absl::StatusOr<Schedule> AddGradClips(const Schedule& lowered) {
  if (!lowered.lowered()) {
    return absl::FailedPreconditionError("AddGradClips: the schedule is not lowered");
  }
  if (lowered.clips_grads()) {
    return absl::FailedPreconditionError(
        "AddGradClips: the schedule already has CLIP_GRAD actions");
  }
  Schedule out = lowered;
  for (int r = 0; r < out.num_ranks && r < static_cast<int>(out.ranks.size()); ++r) {
    std::vector<Action>& clock = out.ranks[r];
    if (clock.empty() || clock.back().kind != ActionKind::kStep) {
      return absl::InvalidArgumentError(
          absl::StrCat("AddGradClips: rank ", r, "'s clock does not end with STEP"));
    }
    clock.insert(clock.end() - 1, Action{ActionKind::kClipGrad, 0, 0});
  }
  return out;
}

absl::StatusOr<Schedule> AddTiedGradSums(const Schedule& lowered) {
  if (!lowered.lowered()) {
    return absl::FailedPreconditionError("AddTiedGradSums: the schedule is not lowered");
  }
  if (lowered.ties_grads()) {
    return absl::FailedPreconditionError(
        "AddTiedGradSums: the schedule already has TIE_GRAD actions");
  }
  Schedule out = lowered;
  const int n = lowered.num_stages();
  std::vector<int> ends = {0};
  if (n > 1) ends.push_back(n - 1);
  for (int st : ends) {
    const int r = lowered.stage_to_rank[st];
    std::vector<Action>& clock = out.ranks[r];
    if (clock.empty() || clock.back().kind != ActionKind::kStep) {
      return absl::InvalidArgumentError(
          absl::StrCat("AddTiedGradSums: rank ", r, "'s clock does not end with STEP"));
    }
    clock.insert(clock.end() - 1, Action{ActionKind::kTieGrad, st, 0});
  }
  return out;
}

absl::StatusOr<Schedule> AddGradReductions(const Schedule& lowered) {
  if (!lowered.lowered()) {
    return absl::FailedPreconditionError("AddGradReductions: the schedule is not lowered");
  }
  if (lowered.reduces_grads()) {
    return absl::FailedPreconditionError(
        "AddGradReductions: the schedule already has REDUCE_GRAD actions");
  }
  Schedule out = lowered;
  const int n = lowered.num_stages();
  for (int r = 0; r < lowered.num_ranks; ++r) {
    const std::vector<Action>& in = lowered.ranks[r];
    // Where each of this rank's stages completes its weight gradients: its last B or W.
    std::vector<int> last(n, -1);
    for (int j = 0; j < static_cast<int>(in.size()); ++j) {
      const Action& a = in[j];
      if ((a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight) &&
          a.stage >= 0 && a.stage < n) {
        last[a.stage] = j;
      }
    }
    // After it, and after the send of a B's input gradient that follows it, so the
    // reduction never delays a neighbour.
    std::vector<std::vector<int>> after(in.size());
    for (int st = 0; st < n; ++st) {
      if (lowered.stage_to_rank[st] != r) continue;
      int j = last[st];
      if (j < 0) {
        return absl::InvalidArgumentError(absl::StrCat("AddGradReductions: stage ", st,
                                                       " has no backward on rank ", r));
      }
      if (j + 1 < static_cast<int>(in.size()) && in[j + 1].kind == ActionKind::kSendB &&
          in[j + 1].stage == st && in[j + 1].microbatch == in[j].microbatch) {
        ++j;
      }
      after[j].push_back(st);
    }
    std::vector<Action>& clock = out.ranks[r];
    clock.clear();
    clock.reserve(in.size() + n);
    for (size_t j = 0; j < in.size(); ++j) {
      clock.push_back(in[j]);
      for (int st : after[j]) clock.push_back(Action{ActionKind::kReduceGrad, st, 0});
    }
  }
  return out;
}

std::vector<int> LoopedStageToRank(int num_ranks, int virtual_stages) {
  std::vector<int> map(static_cast<size_t>(std::max(0, num_ranks * virtual_stages)));
  for (size_t s = 0; s < map.size(); ++s) map[s] = static_cast<int>(s) % num_ranks;
  return map;
}

std::vector<int> VShapeStageToRank(int num_ranks) {
  std::vector<int> map(static_cast<size_t>(std::max(0, 2 * num_ranks)));
  for (int s = 0; s < 2 * num_ranks; ++s) map[s] = s < num_ranks ? s : 2 * num_ranks - 1 - s;
  return map;
}

// Lowering in two passes.
//  1. Sends: each rank's clock gets SEND_F after every F whose next stage is remote and
//     SEND_B after every B/I whose previous stage is remote. The sends on rank a addressed to
//     rank b, in a's order, form the FIFO "channel" a->b; each message records its sequence
//     number in its channel.
//  2. Receives: before each compute action that consumes a remote message, the receiver
//     takes every message of that channel up to and including the one it needs, in channel
//     order. Usually that is exactly the one message (the receive sits immediately before its
//     consumer; always so for the built-in generators, a test checks). When a peer sends two
//     messages in an order the receiver consumes them the other way round (an imported
//     schedule may), the earlier-sent one is received early, so that receives match sends in
//     order, as NCCL requires. Receiving a message that was sent before the one the
//     rank waits for never adds waiting, so this keeps a deadlock-free order deadlock-free.
absl::StatusOr<Schedule> Lower(const Schedule& compute_only) {
  BATON_RETURN_IF_ERROR(CheckLowerable(compute_only));
  const Schedule& in = compute_only;
  const int n = in.num_stages();
  const int m = in.num_microbatches;
  const std::vector<int>& rank_of = in.stage_to_rank;

  Schedule out = in;
  std::vector<std::vector<Action>> with_sends(in.num_ranks);
  const int64_t num_msgs = 2 * static_cast<int64_t>(n) * m;
  std::vector<int> msg_channel(num_msgs, -1);
  std::vector<int> msg_seq(num_msgs, -1);
  std::vector<std::vector<Action>> channel_recvs;   // per channel, the receive of each message
  absl::flat_hash_map<int64_t, int> channel_index;  // src * num_ranks + dst -> channel
  auto channel = [&](int src, int dst) {
    const int64_t key = static_cast<int64_t>(src) * in.num_ranks + dst;
    auto [it, inserted] = channel_index.try_emplace(key, static_cast<int>(channel_recvs.size()));
    if (inserted) channel_recvs.emplace_back();
    return it->second;
  };
  auto add_send = [&](int src, std::vector<Action>& clock, ActionKind kind, MessageDir dir,
                      int stage, int mb, int dst_stage) {
    clock.push_back(Action{kind, stage, mb});
    const int ch = channel(src, rank_of[dst_stage]);
    const int64_t id = MessageId(dir, stage, mb, n, m);
    msg_channel[id] = ch;
    msg_seq[id] = static_cast<int>(channel_recvs[ch].size());
    const ActionKind recv = dir == kFwdMsg ? ActionKind::kRecvF : ActionKind::kRecvB;
    channel_recvs[ch].push_back(Action{recv, dst_stage, mb});
  };

  for (int r = 0; r < in.num_ranks; ++r) {
    std::vector<Action>& clock = with_sends[r];
    clock.reserve(in.ranks[r].size() * 2);
    for (const Action& a : in.ranks[r]) {
      clock.push_back(a);
      if (a.kind == ActionKind::kForward && a.stage + 1 < n && rank_of[a.stage + 1] != r) {
        add_send(r, clock, ActionKind::kSendF, kFwdMsg, a.stage, a.microbatch, a.stage + 1);
      } else if ((a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardInput) &&
                 a.stage > 0 && rank_of[a.stage - 1] != r) {
        add_send(r, clock, ActionKind::kSendB, kBwdMsg, a.stage, a.microbatch, a.stage - 1);
      }
    }
  }

  std::vector<size_t> channel_received(channel_recvs.size(), 0);
  for (int r = 0; r < in.num_ranks; ++r) {
    std::vector<Action>& clock = out.ranks[r];
    clock.clear();
    clock.reserve(with_sends[r].size() * 3 / 2 + 1);
    for (const Action& a : with_sends[r]) {
      int64_t needed = -1;
      if (a.kind == ActionKind::kForward && a.stage > 0 && rank_of[a.stage - 1] != r) {
        needed = MessageId(kFwdMsg, a.stage - 1, a.microbatch, n, m);
      } else if ((a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardInput) &&
                 a.stage + 1 < n && rank_of[a.stage + 1] != r) {
        needed = MessageId(kBwdMsg, a.stage + 1, a.microbatch, n, m);
      }
      if (needed >= 0) {
        const int ch = msg_channel[needed];
        if (ch < 0) {
          // Never sent (its producer is missing): receive it here anyway; Validate reports it.
          const ActionKind recv =
              a.kind == ActionKind::kForward ? ActionKind::kRecvF : ActionKind::kRecvB;
          clock.push_back(Action{recv, a.stage, a.microbatch});
        } else {
          while (channel_received[ch] <= static_cast<size_t>(msg_seq[needed])) {
            clock.push_back(channel_recvs[ch][channel_received[ch]++]);
          }
        }
      }
      clock.push_back(a);
    }
    clock.push_back(Action{ActionKind::kStep, 0, 0});
  }
  return out;
}

std::string ToCsv(const Schedule& s) {
  std::string out;
  for (const auto& rank : s.ranks) {
    bool first = true;
    for (const Action& a : rank) {
      if (a.kind == ActionKind::kStep) continue;
      if (!first) out += ',';
      first = false;
      out += a.ToString();
    }
    out += '\n';
  }
  return out;
}

absl::StatusOr<Schedule> FromCsv(const std::string& csv) {
  // Split into lines; drop trailing empty ones.
  std::vector<std::string> lines;
  size_t start = 0;
  while (start <= csv.size()) {
    size_t end = csv.find('\n', start);
    if (end == std::string::npos) end = csv.size();
    std::string line = csv.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
    start = end + 1;
  }
  while (!lines.empty() && Trim(lines.back()).empty()) lines.pop_back();
  if (lines.empty()) return absl::InvalidArgumentError("CSV schedule: no rows (one row per rank)");
  if (static_cast<int64_t>(lines.size()) > kMaxRanks) {
    return absl::InvalidArgumentError(
        absl::StrCat("CSV schedule: ", lines.size(), " rows, more than ", kMaxRanks, " ranks"));
  }

  Schedule s;
  s.kind = ScheduleKind::kCustom;
  s.num_ranks = static_cast<int>(lines.size());
  s.ranks.resize(lines.size());
  int max_stage = -1;
  int max_mb = -1;
  bool has_comm = false;
  for (size_t r = 0; r < lines.size(); ++r) {
    size_t col = 0;
    size_t pos = 0;
    const std::string& line = lines[r];
    while (pos <= line.size()) {
      size_t comma = line.find(',', pos);
      if (comma == std::string::npos) comma = line.size();
      std::string cell = Trim(line.substr(pos, comma - pos));
      pos = comma + 1;
      ++col;
      if (cell.size() >= 2 && cell.front() == '"' && cell.back() == '"') {
        cell = Trim(cell.substr(1, cell.size() - 2));
      }
      // PyTorch writes idle slots as empty cells (or None); they carry no action.
      if (cell.empty() || Lowercase(cell) == "none") continue;
      absl::StatusOr<Action> a = Action::Parse(cell);
      if (!a.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("CSV schedule: row ", r + 1, " (rank ", r,
                                                       "), column ", col, ": ",
                                                       a.status().message()));
      }
      if (a->kind != ActionKind::kStep && a->kind != ActionKind::kClipGrad) {
        max_stage = std::max(max_stage, a->stage);
        max_mb = std::max(max_mb, a->microbatch);
      }
      has_comm = has_comm || IsComm(a->kind);
      s.ranks[r].push_back(*a);
    }
  }
  if (max_stage < 0) return absl::InvalidArgumentError("CSV schedule: no actions");
  const int n = max_stage + 1;
  if (static_cast<int64_t>(n) * (max_mb + 1) > kMaxCells) {
    return absl::InvalidArgumentError(absl::StrCat("CSV schedule: ", n, " stages x ", max_mb + 1,
                                                   " micro-batches is too large (limit ", kMaxCells,
                                                   ")"));
  }
  s.num_microbatches = max_mb + 1;

  // Read the stage-to-rank map off the rows.
  s.stage_to_rank.assign(n, -1);
  std::vector<Action> first_seen(n);
  for (int r = 0; r < s.num_ranks; ++r) {
    for (const Action& a : s.ranks[r]) {
      if (a.kind == ActionKind::kStep || a.kind == ActionKind::kClipGrad) continue;
      int& owner = s.stage_to_rank[a.stage];
      if (owner == -1) {
        owner = r;
        first_seen[a.stage] = a;
      } else if (owner != r) {
        return absl::InvalidArgumentError(
            absl::StrCat("CSV schedule: stage ", a.stage, " appears on rank ", owner, " (",
                         first_seen[a.stage].ToString(), ") and on rank ", r, " (", a.ToString(),
                         "); each stage must run on exactly one rank"));
      }
    }
  }
  for (int st = 0; st < n; ++st) {
    if (s.stage_to_rank[st] == -1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CSV schedule: stage ", st, " appears on no rank (stages 0..", n - 1, " are used)"));
    }
  }
  std::vector<int> per_rank(s.num_ranks, 0);
  for (int st = 0; st < n; ++st) ++per_rank[s.stage_to_rank[st]];
  for (int r = 0; r < s.num_ranks; ++r) {
    if (n % s.num_ranks != 0 || per_rank[r] != n / s.num_ranks) {
      return absl::InvalidArgumentError(
          absl::StrCat("CSV schedule: ", n, " stages over ", s.num_ranks, " ranks, rank ", r,
                       " holding ", per_rank[r], "; every rank must hold the same number"));
    }
  }
  s.virtual_stages = n / s.num_ranks;

  if (has_comm) {
    for (auto& rank : s.ranks) {
      if (rank.empty() || rank.back().kind != ActionKind::kStep) {
        rank.push_back(Action{ActionKind::kStep, 0, 0});
      }
    }
    return s;
  }
  // Compute-only: a STEP closing a row is dropped (Lower appends it again).
  for (auto& rank : s.ranks) {
    if (!rank.empty() && rank.back().kind == ActionKind::kStep) rank.pop_back();
  }
  return Lower(s);
}

}  // namespace baton
