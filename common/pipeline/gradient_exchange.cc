#include "common/pipeline/gradient_exchange.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/core/backend.h"
#include "common/core/status.h"
#include "common/optim/optimizer.h"
#include "common/pipeline/wire.h"

namespace baton {
namespace {

// The gradient norm's messages carry doubles bit for bit, as int32 pairs.
Tensor DoublesTensor(const std::vector<double>& v) {
  Tensor t = Tensor::Empty({static_cast<int64_t>(2 * v.size())}, DType::kInt32);
  if (!v.empty()) std::memcpy(t.i32(), v.data(), v.size() * sizeof(double));
  return t;
}

absl::StatusOr<std::vector<double>> DoublesOf(const Tensor& t, size_t want, const Action& a,
                                              const char* what) {
  if (t.dtype() != DType::kInt32 || t.shape() != Shape{static_cast<int64_t>(2 * want)}) {
    return absl::InvalidArgumentError(
        absl::StrCat("received ", what, " for ", a.ToString(), " is ", ShapeString(t.shape()),
                     " of ", DTypeName(t.dtype()), "; the plan expects [", 2 * want, "] of int32"));
  }
  BATON_ASSIGN_OR_RETURN(Tensor host, t.On(Device::kCpu));
  std::vector<double> out(want);
  if (want > 0) std::memcpy(out.data(), host.i32(), want * sizeof(double));
  return out;
}

}  // namespace

absl::Status CheckExchangeActions(const Schedule& schedule, int rank, bool clips, bool tied) {
  if (rank < 0 || rank >= static_cast<int>(schedule.ranks.size())) return absl::OkStatus();
  const std::vector<Action>& clock = schedule.ranks[rank];
  auto has = [&](const Action& a) {
    return std::find(clock.begin(), clock.end(), a) != clock.end();
  };
  if (has(Action{ActionKind::kClipGrad, 0, 0}) != clips) {
    return absl::InvalidArgumentError(absl::StrCat(
        clips ? "the optimizer clips gradients (optimizer.clip_grad_norm) but rank "
              : "the optimizer does not clip gradients but rank ",
        rank, "'s clock ", clips ? "has no CLIP_GRAD (AddJobActions)" : "has CLIP_GRAD"));
  }
  // A worker's plan carries its own clock only: the rank sums the tied embedding exactly
  // when the model ties and the rank holds an end.
  const int n = schedule.num_stages();
  for (int end : {0, n - 1}) {
    if (schedule.stage_to_rank[end] != rank) continue;
    const Action tie{ActionKind::kTieGrad, end, 0};
    if (has(tie) != tied && (n > 1 || end == 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(tied ? "the model ties its embeddings but rank "
                            : "the model does not tie its embeddings but rank ",
                       rank, "'s clock ", tied ? "has no " : "has ", tie.ToString(),
                       tied ? " (AddJobActions)" : ""));
    }
  }
  return absl::OkStatus();
}

absl::Status SumTiedGradientWithPeer(const Action& a, int other_stage, int peer, Parameter& mine,
                                     Device device, const ExchangeLink& link, int64_t* bytes) {
  const int s = a.stage;
  BATON_ASSIGN_OR_RETURN(Backend * be, BackendFor(device));
  const TensorTag mine_tag{link.job_id, link.step, 0, s, TensorKind::kTiedGradient};
  const TensorTag their_tag{link.job_id, link.step, 0, other_stage, TensorKind::kTiedGradient};
  auto send = [&]() {
    return link.transport->Send(peer, mine_tag, mine.grad)->Wait(link.deadline);
  };
  if (s == 0) BATON_RETURN_IF_ERROR(send());
  BATON_ASSIGN_OR_RETURN(Tensor theirs, link.transport->Recv(peer, their_tag, link.deadline));
  BATON_RETURN_IF_ERROR(CheckReceived(theirs, mine.grad.shape(), "tied embedding gradient", a));
  if (s != 0) BATON_RETURN_IF_ERROR(send());
  *bytes = 2 * theirs.numel() * static_cast<int64_t>(sizeof(float));
  BATON_ASSIGN_OR_RETURN(theirs, theirs.On(device));
  // embedding's + output projection's (model.h): the same two floats on both ends.
  if (s == 0) {
    be->Add(mine.grad.numel(), mine.grad.f32(), theirs.f32(), mine.grad.f32());
  } else {
    be->Add(mine.grad.numel(), theirs.f32(), mine.grad.f32(), mine.grad.f32());
  }
  return absl::OkStatus();
}

absl::StatusOr<float> ClipGradients(const Action& a, const ClipInputs& in, const ExchangeLink& link,
                                    int64_t* bytes) {
  std::vector<double> parts(in.num_blocks, 0.0);
  auto fill_mine = [&]() -> absl::Status {
    std::vector<Module*> mine;
    for (const IndexedBlock& b : in.blocks) {
      if (b.index >= in.num_blocks) return absl::InternalError("a block outside the model");
      mine.push_back(b.block);
    }
    if (in.block_squares.has_value() && in.block_squares->size() != mine.size()) {
      return absl::InternalError("block parts for another set of blocks");
    }
    std::vector<double> squares;
    if (in.block_squares.has_value()) {
      squares = *in.block_squares;
    } else {
      BATON_ASSIGN_OR_RETURN(squares, BlockGradSquares(mine, in.tied));
    }
    for (size_t i = 0; i < mine.size(); ++i) parts[in.blocks[i].index] = squares[i];
    return absl::OkStatus();
  };
  // The chain: rank r receives ranks 0..r-1's parts from r - 1, adds its own, hands them to
  // r + 1; the last rank sums them in block order and the total comes back down the chain.
  const int rank = in.rank;
  const int last = in.num_ranks - 1;
  auto tag = [&](int from, int direction) {
    return TensorTag{link.job_id, link.step, direction, from, TensorKind::kGradNorm};
  };
  auto send = [&](int to, int direction, const Tensor& t) -> absl::Status {
    *bytes += static_cast<int64_t>(t.nbytes());
    return link.transport->Send(to, tag(rank, direction), t)->Wait(link.deadline);
  };
  auto recv = [&](int from, int direction) -> absl::StatusOr<Tensor> {
    BATON_ASSIGN_OR_RETURN(Tensor got,
                           link.transport->Recv(from, tag(from, direction), link.deadline));
    *bytes += static_cast<int64_t>(got.nbytes());
    return got;
  };
  if (rank > 0) {
    BATON_ASSIGN_OR_RETURN(const Tensor got, recv(rank - 1, 0));
    BATON_ASSIGN_OR_RETURN(parts, DoublesOf(got, in.num_blocks, a, "gradient norm parts"));
  }
  BATON_RETURN_IF_ERROR(fill_mine());
  double squared = 0.0;
  if (rank < last) {
    BATON_RETURN_IF_ERROR(send(rank + 1, 0, DoublesTensor(parts)));
    BATON_ASSIGN_OR_RETURN(const Tensor got, recv(rank + 1, 1));
    BATON_ASSIGN_OR_RETURN(const std::vector<double> total,
                           DoublesOf(got, 1, a, "gradient norm total"));
    squared = total[0];
  } else {
    for (double part : parts) squared += part;  // block order, whatever the partition
  }
  if (rank > 0) BATON_RETURN_IF_ERROR(send(rank - 1, 1, DoublesTensor({squared})));
  const GradClip clip = ClipFromSquaredNorm(squared, in.max_norm);
  if (!clip.finite()) {
    return DivergedError(absl::StrCat("training diverged: the global gradient norm is ", clip.norm,
                                      " (CLIP_GRAD, step ", link.step + 1, ")"));
  }
  if (clip.clips()) BATON_RETURN_IF_ERROR(ScaleGradients(in.params, clip.coef));
  return static_cast<float>(clip.norm);
}

}  // namespace baton
