#include "common/schedule/validate.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/core/status.h"
#include "common/schedule/internal.h"

namespace baton {
namespace {

using schedule_internal::ClockError;
using schedule_internal::GridMark;
using schedule_internal::kBwdMsg;
using schedule_internal::kFwdMsg;
using schedule_internal::kMaxCells;
using schedule_internal::kMaxRanks;
using schedule_internal::MessageDir;
using schedule_internal::MessageId;
using schedule_internal::MessageOf;

// Per-(stage, micro-batch) position tables, one per action kind but STEP.
enum Slot : int { kF, kB, kI, kW, kSendF, kRecvF, kSendB, kRecvB, kNumSlots };

Slot SlotOf(ActionKind k) {
  switch (k) {
    case ActionKind::kForward:
      return kF;
    case ActionKind::kBackward:
      return kB;
    case ActionKind::kBackwardInput:
      return kI;
    case ActionKind::kBackwardWeight:
      return kW;
    case ActionKind::kSendF:
      return kSendF;
    case ActionKind::kRecvF:
      return kRecvF;
    case ActionKind::kSendB:
      return kSendB;
    case ActionKind::kRecvB:
      return kRecvB;
    case ActionKind::kStep:
    case ActionKind::kReduceGrad:
    case ActionKind::kTieGrad:
    case ActionKind::kClipGrad:
      break;
  }
  return kNumSlots;
}

std::string Str(ActionKind k, int stage, int mb) { return Action{k, stage, mb}.ToString(); }

class Checker {
 public:
  explicit Checker(const Schedule& s)
      : s_(s), n_(s.num_stages()), m_(s.num_microbatches), rank_of_(s.stage_to_rank) {}

  absl::Status Run() {
    BATON_RETURN_IF_ERROR(CheckShape());
    BATON_RETURN_IF_ERROR(ScanActions());
    BATON_RETURN_IF_ERROR(CheckCells());
    BATON_RETURN_IF_ERROR(CheckReductions());
    BATON_RETURN_IF_ERROR(CheckTies());
    BATON_RETURN_IF_ERROR(CheckClips());
    return CheckChannelOrder();
  }

 private:
  int64_t Cell(int stage, int mb) const { return static_cast<int64_t>(stage) * m_ + mb; }
  int Pos(Slot slot, int stage, int mb) const { return pos_[slot][Cell(stage, mb)]; }
  GridMark Mark(int stage, int index) const { return GridMark{rank_of_[stage], index}; }
  absl::Status Error(const std::string& reason, const std::vector<GridMark>& marks) const {
    return ClockError(s_, reason, marks);
  }

  absl::Status CheckShape() {
    if (s_.num_ranks < 1 || s_.num_ranks > kMaxRanks) {
      return absl::InvalidArgumentError(
          absl::StrCat("schedule: num_ranks must be in [1, ", kMaxRanks, "], got ", s_.num_ranks));
    }
    if (static_cast<int>(s_.ranks.size()) != s_.num_ranks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "schedule: ", s_.ranks.size(), " rank clocks for num_ranks = ", s_.num_ranks));
    }
    if (n_ < 1) return absl::InvalidArgumentError("schedule: empty stage-to-rank map");
    for (int st = 0; st < n_; ++st) {
      if (rank_of_[st] < 0 || rank_of_[st] >= s_.num_ranks) {
        return absl::InvalidArgumentError(absl::StrCat("schedule: stage-to-rank map sends stage ",
                                                       st, " to rank ", rank_of_[st],
                                                       ", outside [0, ", s_.num_ranks, ")"));
      }
    }
    if (m_ < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("schedule: num_microbatches must be >= 1, got ", m_));
    }
    if (static_cast<int64_t>(n_) * m_ > kMaxCells) {
      return absl::InvalidArgumentError(absl::StrCat("schedule: ", n_, " stages x ", m_,
                                                     " micro-batches is too large (limit ",
                                                     kMaxCells, ")"));
    }
    if (!s_.lowered()) {
      return absl::FailedPreconditionError(
          "schedule is not lowered (no communication or STEP): run Lower() first");
    }
    return absl::OkStatus();
  }

  // Check 2 (and the comm legality part of 4): per action, fills pos_.
  absl::Status ScanActions() {
    for (auto& table : pos_) table.assign(static_cast<size_t>(n_) * m_, -1);
    reduce_pos_.assign(n_, -1);
    tie_pos_.assign(n_, -1);
    clip_pos_.assign(s_.num_ranks, -1);
    for (int r = 0; r < s_.num_ranks; ++r) {
      const auto& clock = s_.ranks[r];
      const int len = static_cast<int>(clock.size());
      if (len == 0 || clock.back().kind != ActionKind::kStep) {
        return Error(absl::StrCat("rank ", r, " does not end with STEP (the optimizer step)"),
                     len == 0 ? std::vector<GridMark>{} : std::vector<GridMark>{{r, len - 1}});
      }
      for (int j = 0; j < len; ++j) {
        const Action& a = clock[j];
        if (a.kind == ActionKind::kStep) {
          if (j != len - 1) {
            return Error(absl::StrCat("STEP at position ", j, " on rank ", r,
                                      " is not the rank's last action"),
                         {{r, j}});
          }
          continue;
        }
        if (a.kind == ActionKind::kClipGrad) {
          int& p = clip_pos_[r];
          if (p >= 0) {
            return Error(absl::StrCat("CLIP_GRAD appears twice on rank ", r, " (positions ", p,
                                      " and ", j, ")"),
                         {{r, p}, {r, j}});
          }
          p = j;
          ++clips_;
          continue;
        }
        if (a.stage < 0 || a.stage >= n_) {
          return Error(absl::StrCat(a.ToString(), " on rank ", r, ": stage ", a.stage,
                                    " outside [0, ", n_, ")"),
                       {{r, j}});
        }
        if (a.microbatch < 0 || a.microbatch >= m_) {
          return Error(absl::StrCat(a.ToString(), " on rank ", r, ": micro-batch ", a.microbatch,
                                    " outside [0, ", m_, ")"),
                       {{r, j}});
        }
        if (rank_of_[a.stage] != r) {
          return Error(absl::StrCat(a.ToString(), " is on rank ", r, " but stage ", a.stage,
                                    " runs on rank ", rank_of_[a.stage], " (stage-to-rank map)"),
                       {{r, j}});
        }
        const int st = a.stage;
        if (a.kind == ActionKind::kReduceGrad) {
          int& p = reduce_pos_[st];
          if (p >= 0) {
            return Error(absl::StrCat(a.ToString(), " appears twice on rank ", r, " (positions ",
                                      p, " and ", j, ")"),
                         {{r, p}, {r, j}});
          }
          p = j;
          ++reductions_;
          continue;
        }
        if (a.kind == ActionKind::kTieGrad) {
          if (st != 0 && st != n_ - 1) {
            return Error(absl::StrCat(a.ToString(), ": only the first stage (0) and the last (",
                                      n_ - 1, ") hold the tied embedding"),
                         {{r, j}});
          }
          int& p = tie_pos_[st];
          if (p >= 0) {
            return Error(absl::StrCat(a.ToString(), " appears twice on rank ", r, " (positions ",
                                      p, " and ", j, ")"),
                         {{r, p}, {r, j}});
          }
          p = j;
          continue;
        }
        switch (a.kind) {
          case ActionKind::kSendF:
          case ActionKind::kRecvB:
            if (st + 1 >= n_) {
              return Error(absl::StrCat(a.ToString(), ": stage ", st,
                                        " is the last stage; it has no "
                                        "next stage to talk to"),
                           {{r, j}});
            }
            if (rank_of_[st + 1] == r) {
              return Error(
                  absl::StrCat(a.ToString(), ": stages ", st, " and ", st + 1, " are both on rank ",
                               r, " and hand over locally, without communication"),
                  {{r, j}});
            }
            break;
          case ActionKind::kRecvF:
          case ActionKind::kSendB:
            if (st == 0) {
              return Error(absl::StrCat(a.ToString(), ": stage 0 has no previous stage to talk to"),
                           {{r, j}});
            }
            if (rank_of_[st - 1] == r) {
              return Error(
                  absl::StrCat(a.ToString(), ": stages ", st - 1, " and ", st, " are both on rank ",
                               r, " and hand over locally, without communication"),
                  {{r, j}});
            }
            break;
          default:
            break;
        }
        int& p = pos_[SlotOf(a.kind)][Cell(st, a.microbatch)];
        if (p >= 0) {
          return Error(absl::StrCat(a.ToString(), " appears twice on rank ", r, " (positions ", p,
                                    " and ", j, ")"),
                       {{r, p}, {r, j}});
        }
        p = j;
      }
    }
    return absl::OkStatus();
  }

  // Checks 3 then 4, per (stage, micro-batch): compute first for all of them, so that a
  // missing backward is reported as such rather than as the receive that waits for it.
  absl::Status CheckCells() {
    for (int st = 0; st < n_; ++st) {
      for (int mb = 0; mb < m_; ++mb) BATON_RETURN_IF_ERROR(CheckCompute(st, mb));
    }
    for (int st = 0; st < n_; ++st) {
      for (int mb = 0; mb < m_; ++mb) BATON_RETURN_IF_ERROR(CheckComm(st, mb));
    }
    return absl::OkStatus();
  }

  // Data parallelism: either no REDUCE_GRAD at all, or one per stage, after every weight
  // gradient of that stage (the gradients it sums must be complete) and before STEP.
  absl::Status CheckReductions() {
    if (reductions_ == 0) return absl::OkStatus();
    for (int st = 0; st < n_; ++st) {
      const Action reduce{ActionKind::kReduceGrad, st, 0};
      if (reduce_pos_[st] < 0) {
        return Error(absl::StrCat(reduce.ToString(), " is missing: the clock reduces other "
                                  "stages' gradients, so every stage must (rank ",
                                  rank_of_[st], ")"),
                     {});
      }
      for (int mb = 0; mb < m_; ++mb) {
        const int b = Pos(kB, st, mb);
        const int w = b >= 0 ? b : Pos(kW, st, mb);
        if (w > reduce_pos_[st]) {
          return Error(absl::StrCat(reduce.ToString(), " runs before ",
                                    s_.ranks[rank_of_[st]][w].ToString(),
                                    ": it would sum gradients that are not complete"),
                       {Mark(st, reduce_pos_[st]), Mark(st, w)});
        }
      }
    }
    return absl::OkStatus();
  }

  // Tied embeddings: either no TIE_GRAD, or one on each end (one in all with one stage),
  // after every other action of its rank but STEP (so after the stage's weight gradients
  // and its REDUCE_GRAD, and after every message the two ends exchange otherwise).
  absl::Status CheckTies() {
    const int first = tie_pos_[0], last = tie_pos_[n_ - 1];
    if (first < 0 && last < 0) return absl::OkStatus();
    for (int st : {0, n_ - 1}) {
      const Action tie{ActionKind::kTieGrad, st, 0};
      if (tie_pos_[st] < 0) {
        return Error(absl::StrCat(tie.ToString(), " is missing: the other end of the tied "
                                  "embedding sums its gradient with it (rank ",
                                  rank_of_[st], ")"),
                     {});
      }
      const auto& clock = s_.ranks[rank_of_[st]];
      for (int j = tie_pos_[st] + 1; j + 1 < static_cast<int>(clock.size()); ++j) {
        if (clock[j].kind != ActionKind::kTieGrad && clock[j].kind != ActionKind::kClipGrad) {
          return Error(absl::StrCat(tie.ToString(), " runs before ", clock[j].ToString(),
                                    ": it must come after every other action but CLIP_GRAD "
                                    "and STEP"),
                       {Mark(st, tie_pos_[st]), Mark(st, j)});
        }
      }
    }
    return absl::OkStatus();
  }

  // Gradient clipping: either no CLIP_GRAD, or one on every rank (every rank takes part in
  // the norm's exchange), its rank's last action before STEP (the norm is of the final
  // gradients: after every weight gradient, REDUCE_GRAD and TIE_GRAD).
  absl::Status CheckClips() {
    if (clips_ == 0) return absl::OkStatus();
    for (int r = 0; r < s_.num_ranks; ++r) {
      const int len = static_cast<int>(s_.ranks[r].size());
      if (clip_pos_[r] < 0) {
        return Error(absl::StrCat("CLIP_GRAD is missing on rank ", r,
                                  ": the clock clips gradients, so every rank must (the norm "
                                  "is over every stage)"),
                     {});
      }
      if (clip_pos_[r] != len - 2) {
        return Error(absl::StrCat("CLIP_GRAD on rank ", r, " runs before ",
                                  s_.ranks[r][clip_pos_[r] + 1].ToString(),
                                  ": it must be the last action before STEP"),
                     {{r, clip_pos_[r]}, {r, clip_pos_[r] + 1}});
      }
    }
    return absl::OkStatus();
  }

  // The action that computes the input gradient of (st, mb): B or I; -1 if neither.
  int BackwardPos(int st, int mb) const {
    const int b = Pos(kB, st, mb);
    return b >= 0 ? b : Pos(kI, st, mb);
  }
  std::string BackwardStr(int st, int mb) const {
    return Str(Pos(kB, st, mb) >= 0 ? ActionKind::kBackward : ActionKind::kBackwardInput, st, mb);
  }

  absl::Status CheckCompute(int st, int mb) {
    const int f = Pos(kF, st, mb);
    const int b = Pos(kB, st, mb);
    const int i = Pos(kI, st, mb);
    const int w = Pos(kW, st, mb);
    auto fs = [&] { return Str(ActionKind::kForward, st, mb); };
    if (f < 0) {
      for (Slot slot : {kB, kI, kW}) {
        const int p = Pos(slot, st, mb);
        if (p >= 0) {
          return Error(absl::StrCat(s_.ranks[rank_of_[st]][p].ToString(), " has no forward: ", fs(),
                                    " is missing"),
                       {Mark(st, p)});
        }
      }
      return Error(absl::StrCat("stage ", st, " never runs micro-batch ", mb, ": ", fs(),
                                " and its backward are missing (rank ", rank_of_[st], ")"),
                   {});
    }
    if (b >= 0 && (i >= 0 || w >= 0)) {
      return Error(absl::StrCat("stage ", st, " micro-batch ", mb,
                                " has both a full backward (B) and a split one (I/W)"),
                   {Mark(st, b), Mark(st, i >= 0 ? i : w)});
    }
    if (b < 0 && i < 0 && w < 0) {
      return Error(
          absl::StrCat(fs(), " has no backward: neither ", Str(ActionKind::kBackward, st, mb),
                       " nor ", Str(ActionKind::kBackwardInput, st, mb), " + ",
                       Str(ActionKind::kBackwardWeight, st, mb)),
          {Mark(st, f)});
    }
    if (b < 0 && w < 0) {
      return Error(absl::StrCat(Str(ActionKind::kBackwardInput, st, mb), " has no weight-gradient ",
                                Str(ActionKind::kBackwardWeight, st, mb)),
                   {Mark(st, i)});
    }
    if (b < 0 && i < 0) {
      return Error(absl::StrCat(Str(ActionKind::kBackwardWeight, st, mb), " has no input-gradient ",
                                Str(ActionKind::kBackwardInput, st, mb)),
                   {Mark(st, w)});
    }
    const int bi = b >= 0 ? b : i;  // the action that produces the input gradient
    const ActionKind bi_kind = b >= 0 ? ActionKind::kBackward : ActionKind::kBackwardInput;
    auto bis = [&] { return Str(bi_kind, st, mb); };
    if (bi < f) {
      return Error(absl::StrCat(bis(), " runs before its forward ", fs()),
                   {Mark(st, bi), Mark(st, f)});
    }
    if (b < 0 && w < i) {
      return Error(absl::StrCat(Str(ActionKind::kBackwardWeight, st, mb), " runs before ", bis()),
                   {Mark(st, w), Mark(st, i)});
    }
    // Local hand-over to the next stage and back from it.
    if (st + 1 < n_ && rank_of_[st + 1] == rank_of_[st]) {
      const int nf = Pos(kF, st + 1, mb);
      const int nb = BackwardPos(st + 1, mb);
      if (nf >= 0 && nf < f) {
        return Error(absl::StrCat(Str(ActionKind::kForward, st + 1, mb), " runs before ", fs(),
                                  ", whose output it takes (same rank, local hand-over)"),
                     {Mark(st, nf), Mark(st, f)});
      }
      if (nb >= 0 && bi < nb) {
        return Error(absl::StrCat(bis(), " runs before ", BackwardStr(st + 1, mb),
                                  ", whose gradient it takes (same rank, local hand-over)"),
                     {Mark(st, bi), Mark(st, nb)});
      }
    }
    return absl::OkStatus();
  }

  // Check 4 for the link between st and st+1 (on different ranks) for micro-batch mb. Runs
  // after CheckCompute passed for every cell, so all compute actions exist; ScanActions
  // already refused communication between stages on the same rank.
  absl::Status CheckComm(int st, int mb) {
    if (st + 1 >= n_ || rank_of_[st + 1] == rank_of_[st]) return absl::OkStatus();
    const int f = Pos(kF, st, mb);
    const int bi = BackwardPos(st, mb);
    const int nf = Pos(kF, st + 1, mb);
    const int nb = BackwardPos(st + 1, mb);
    auto fs = [&] { return Str(ActionKind::kForward, st, mb); };
    auto bis = [&] { return BackwardStr(st, mb); };
    auto nfs = [&] { return Str(ActionKind::kForward, st + 1, mb); };
    auto nbs = [&] { return BackwardStr(st + 1, mb); };
    const int here = rank_of_[st];
    const int there = rank_of_[st + 1];

    // Activation st -> st+1.
    const int send = Pos(kSendF, st, mb);
    const int recv = Pos(kRecvF, st + 1, mb);
    auto sends = [&] { return Str(ActionKind::kSendF, st, mb); };
    auto recvs = [&] { return Str(ActionKind::kRecvF, st + 1, mb); };
    if (send < 0) {
      return Error(absl::StrCat(fs(), "'s output goes to stage ", st + 1, " on rank ", there,
                                ", but no ", sends(), " follows it"),
                   {Mark(st, f)});
    }
    if (send < f) {
      return Error(absl::StrCat(sends(), " sends before its forward ", fs(), " ran"),
                   {Mark(st, send), Mark(st, f)});
    }
    if (recv < 0) {
      return Error(absl::StrCat(nfs(), " needs the output of stage ", st, " from rank ", here,
                                ", but no ", recvs(), " precedes it"),
                   {Mark(st + 1, nf)});
    }
    if (nf < recv) {
      return Error(absl::StrCat(nfs(), " runs before ", recvs(), " brings its input"),
                   {Mark(st + 1, nf), Mark(st + 1, recv)});
    }

    // Gradient st+1 -> st.
    const int bsend = Pos(kSendB, st + 1, mb);
    const int brecv = Pos(kRecvB, st, mb);
    auto bsends = [&] { return Str(ActionKind::kSendB, st + 1, mb); };
    auto brecvs = [&] { return Str(ActionKind::kRecvB, st, mb); };
    if (bsend < 0) {
      return Error(absl::StrCat(nbs(), "'s gradient goes to stage ", st, " on rank ", here,
                                ", but no ", bsends(), " follows it"),
                   {Mark(st + 1, nb)});
    }
    if (bsend < nb) {
      return Error(absl::StrCat(bsends(), " sends before the backward ", nbs(), " ran"),
                   {Mark(st + 1, bsend), Mark(st + 1, nb)});
    }
    if (brecv < 0) {
      return Error(absl::StrCat(bis(), " needs the gradient of stage ", st + 1, " from rank ",
                                there, ", but no ", brecvs(), " precedes it"),
                   {Mark(st, bi)});
    }
    if (bi < brecv) {
      return Error(absl::StrCat(bis(), " runs before ", brecvs(), " brings its gradient"),
                   {Mark(st, bi), Mark(st, brecv)});
    }
    return absl::OkStatus();
  }

  // Check 5: per ordered rank pair, sends in order == receives in order.
  absl::Status CheckChannelOrder() {
    const int64_t num_msgs = 2 * static_cast<int64_t>(n_) * m_;
    std::vector<int32_t> send_seq(num_msgs, -1);
    absl::flat_hash_map<int64_t, int> channel_index;
    std::vector<std::vector<int32_t>> channel_sends;  // positions of the sends, in order
    auto channel = [&](int src, int dst) {
      const int64_t key = static_cast<int64_t>(src) * s_.num_ranks + dst;
      auto [it, inserted] = channel_index.try_emplace(key, static_cast<int>(channel_sends.size()));
      if (inserted) channel_sends.emplace_back();
      return it->second;
    };
    for (int r = 0; r < s_.num_ranks; ++r) {
      const auto& clock = s_.ranks[r];
      for (int j = 0; j < static_cast<int>(clock.size()); ++j) {
        const Action& a = clock[j];
        if (a.kind != ActionKind::kSendF && a.kind != ActionKind::kSendB) continue;
        const int dst = rank_of_[PeerStage(a)];
        const int ch = channel(r, dst);
        const MessageDir dir = a.kind == ActionKind::kSendF ? kFwdMsg : kBwdMsg;
        send_seq[MessageId(dir, a.stage, a.microbatch, n_, m_)] =
            static_cast<int32_t>(channel_sends[ch].size());
        channel_sends[ch].push_back(j);
      }
    }
    std::vector<int32_t> received(channel_sends.size(), 0);
    for (int r = 0; r < s_.num_ranks; ++r) {
      const auto& clock = s_.ranks[r];
      for (int j = 0; j < static_cast<int>(clock.size()); ++j) {
        const Action& a = clock[j];
        if (a.kind != ActionKind::kRecvF && a.kind != ActionKind::kRecvB) continue;
        MessageDir dir;
        int producer;
        MessageOf(a, &dir, &producer);
        const int src = rank_of_[producer];
        const int ch = channel(src, r);
        const int32_t seq = received[ch]++;
        const int32_t expected = send_seq[MessageId(dir, producer, a.microbatch, n_, m_)];
        if (expected == seq) continue;
        const auto& sends = channel_sends[ch];
        std::vector<GridMark> marks = {{r, j}};
        std::string other;
        if (seq < static_cast<int32_t>(sends.size())) {
          marks.push_back({src, sends[seq]});
          other = absl::StrCat(", but rank ", src, "'s send #", seq + 1, " to rank ", r, " is ",
                               s_.ranks[src][sends[seq]].ToString());
        }
        return Error(
            absl::StrCat("receive order differs from send order between rank ", src, " and rank ",
                         r, ": rank ", r, "'s receive #", seq + 1, " from rank ", src, " is ",
                         a.ToString(), other, " (NCCL matches point-to-point messages in order)"),
            marks);
      }
    }
    return absl::OkStatus();
  }

  const Schedule& s_;
  const int n_;
  const int m_;
  const std::vector<int>& rank_of_;
  std::vector<int32_t> pos_[kNumSlots];
  std::vector<int32_t> reduce_pos_;  // by stage: position of its REDUCE_GRAD, -1 if none
  std::vector<int32_t> tie_pos_;     // by stage: position of its TIE_GRAD, -1 if none
  std::vector<int32_t> clip_pos_;    // by rank: position of its CLIP_GRAD, -1 if none
  int reductions_ = 0;
  int clips_ = 0;
};

absl::Status CheckCosts(const Costs& c, int num_stages, bool top_level) {
  const std::pair<const char*, double> values[] = {
      {"F", c.f}, {"I", c.i}, {"W", c.w}, {"SEND", c.send}, {"RECV", c.recv}, {"STEP", c.step}};
  for (const auto& [name, v] : values) {
    if (!std::isfinite(v) || v < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("cost ", name, " must be finite and >= 0, got ", v));
    }
  }
  if (!std::isfinite(c.b)) {
    return absl::InvalidArgumentError(absl::StrCat("cost B must be finite, got ", c.b));
  }
  if (!top_level) return absl::OkStatus();
  if (!c.per_stage.empty()) {
    if (static_cast<int>(c.per_stage.size()) != num_stages) {
      return absl::InvalidArgumentError(absl::StrCat("per-stage costs: ", c.per_stage.size(),
                                                     " entries for ", num_stages, " stages"));
    }
    for (const Costs& sc : c.per_stage) BATON_RETURN_IF_ERROR(CheckCosts(sc, num_stages, false));
  }
  return absl::OkStatus();
}

// Runs the (already checked) clocks. Returns the deadlock error, or the timings.
absl::StatusOr<SimResult> RunClocks(const Schedule& s, const Costs& costs, bool record) {
  const int num_ranks = s.num_ranks;
  const int n = s.num_stages();
  const int m = s.num_microbatches;
  const int64_t num_msgs = 2 * static_cast<int64_t>(n) * m;
  std::vector<double> sent_at(num_msgs, -1.0);
  std::vector<int> waiter(num_msgs, -1);
  std::vector<size_t> pos(num_ranks, 0);
  std::vector<double> now(num_ranks, 0.0);
  std::vector<int> inflight(num_ranks, 0);
  SimResult res;
  res.peak_inflight.assign(num_ranks, 0);
  res.busy.assign(num_ranks, 0.0);
  std::vector<std::vector<SimResult::Span>> spans(record ? num_ranks : 0);

  auto cost_of = [&](const Action& a) {
    const Costs& c =
        costs.per_stage.empty() || a.kind == ActionKind::kStep ? costs : costs.per_stage[a.stage];
    switch (a.kind) {
      case ActionKind::kForward:
        return c.f;
      case ActionKind::kBackward:
        return c.backward();
      case ActionKind::kBackwardInput:
        return c.i;
      case ActionKind::kBackwardWeight:
        return c.w;
      case ActionKind::kSendF:
      case ActionKind::kSendB:
        return c.send;
      case ActionKind::kRecvF:
      case ActionKind::kRecvB:
        return c.recv;
      case ActionKind::kStep:
        return costs.step;
      case ActionKind::kReduceGrad:
        // Starts the reduction on the communication thread and returns; the time it takes
        // is not modelled here (the rank's compute goes on under it).
        return 0.0;
      case ActionKind::kTieGrad:
        // One embedding-sized exchange right before STEP; not modelled.
        return 0.0;
      case ActionKind::kClipGrad:
        // A few doubles along the chain of ranks right before STEP; not modelled.
        return 0.0;
    }
    return 0.0;
  };

  std::vector<int> ready;
  ready.reserve(num_ranks);
  for (int r = num_ranks - 1; r >= 0; --r) ready.push_back(r);
  while (!ready.empty()) {
    const int r = ready.back();
    ready.pop_back();
    const auto& clock = s.ranks[r];
    if (record && spans[r].empty()) spans[r].reserve(clock.size());
    while (pos[r] < clock.size()) {
      const Action& a = clock[pos[r]];
      double start = now[r];
      MessageDir dir;
      int producer;
      const bool comm = MessageOf(a, &dir, &producer);
      const int64_t msg = comm ? MessageId(dir, producer, a.microbatch, n, m) : -1;
      if (a.kind == ActionKind::kRecvF || a.kind == ActionKind::kRecvB) {
        if (sent_at[msg] < 0) {
          waiter[msg] = r;
          break;
        }
        start = std::max(start, sent_at[msg]);
      }
      const double dur = cost_of(a);
      const double end = start + dur;
      if (a.kind == ActionKind::kSendF || a.kind == ActionKind::kSendB) {
        sent_at[msg] = end;
        if (waiter[msg] >= 0) {
          ready.push_back(waiter[msg]);
          waiter[msg] = -1;
        }
      } else if (a.kind == ActionKind::kForward) {
        res.peak_inflight[r] = std::max(res.peak_inflight[r], ++inflight[r]);
      } else if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight) {
        --inflight[r];
      }
      res.busy[r] += dur;
      now[r] = end;
      if (record) spans[r].push_back(SimResult::Span{r, a, start, end});
      ++pos[r];
    }
  }

  std::vector<GridMark> stuck;
  std::string why;
  for (int r = 0; r < num_ranks; ++r) {
    if (pos[r] >= s.ranks[r].size()) continue;
    const Action& a = s.ranks[r][pos[r]];
    stuck.push_back({r, static_cast<int>(pos[r])});
    if (stuck.size() <= 6) {
      MessageDir dir;
      int producer = 0;
      MessageOf(a, &dir, &producer);
      absl::StrAppend(&why, stuck.size() > 1 ? "; " : "", "rank ", r, " waits in ", a.ToString(),
                      " for rank ", s.stage_to_rank[producer]);
    }
  }
  if (!stuck.empty()) {
    if (stuck.size() > 6) absl::StrAppend(&why, "; and ", stuck.size() - 6, " more ranks");
    return ClockError(s,
                      absl::StrCat("deadlock: no rank can progress (receives block, sends do "
                                   "not): ",
                                   why),
                      stuck);
  }

  for (int r = 0; r < num_ranks; ++r) res.makespan = std::max(res.makespan, now[r]);
  double busy = 0;
  for (double b : res.busy) busy += b;
  const double total = res.makespan * num_ranks;
  res.bubble_ratio = total > 0 ? (total - busy) / total : 0.0;
  if (record) {
    size_t count = 0;
    for (const auto& v : spans) count += v.size();
    res.timeline.reserve(count);
    for (auto& v : spans) res.timeline.insert(res.timeline.end(), v.begin(), v.end());
  }
  return res;
}

std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

absl::Status Validate(const Schedule& s) {
  BATON_RETURN_IF_ERROR(Checker(s).Run());
  return RunClocks(s, Costs(), /*record=*/false).status();
}

absl::StatusOr<SimResult> Simulate(const Schedule& s, const Costs& costs) {
  BATON_RETURN_IF_ERROR(Checker(s).Run());
  BATON_RETURN_IF_ERROR(CheckCosts(costs, s.num_stages(), /*top_level=*/true));
  return RunClocks(s, costs, /*record=*/true);
}

absl::StatusOr<Costs> ParseCosts(const std::string& text) {
  Costs c;
  for (absl::string_view piece : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    const std::string item(piece);
    const size_t eq = item.find('=');
    auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(
          absl::StrCat("costs '", text, "': '", item, "' ", why,
                       " (expected e.g. F=1,I=1,W=1; keys F, B, I, W, SEND, RECV, STEP)"));
    };
    if (eq == std::string::npos) return bad("has no '='");
    std::string key(absl::StripAsciiWhitespace(item.substr(0, eq)));
    const std::string value(absl::StripAsciiWhitespace(item.substr(eq + 1)));
    key = Upper(key);
    double v = 0;
    if (!absl::SimpleAtod(value, &v) || !std::isfinite(v) || v < 0) {
      return bad("needs a finite number >= 0");
    }
    if (key == "F") {
      c.f = v;
    } else if (key == "B") {
      c.b = v;
    } else if (key == "I") {
      c.i = v;
    } else if (key == "W") {
      c.w = v;
    } else if (key == "SEND") {
      c.send = v;
    } else if (key == "RECV") {
      c.recv = v;
    } else if (key == "STEP") {
      c.step = v;
    } else {
      return bad("has an unknown key");
    }
  }
  return c;
}

}  // namespace baton
