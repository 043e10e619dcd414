#include "common/schedule/action.h"

#include <cctype>
#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace baton {
namespace {

// The kinds with a stage and a micro-batch in the text form ("2F0"); STEP, REDUCE_GRAD,
// TIE_GRAD and CLIP_GRAD follow. Parse matches a kind against the whole text between the two numbers.
constexpr ActionKindNames kKinds[] = {
    {ActionKind::kForward, "F", "F", "forward"},
    {ActionKind::kBackward, "B", "B", "backward"},
    {ActionKind::kBackwardInput, "I", "I", "backward_input"},
    {ActionKind::kBackwardWeight, "W", "W", "backward_weight"},
    {ActionKind::kSendF, "SEND_F", "send", "send"},
    {ActionKind::kRecvF, "RECV_F", "recv_wait", "recv_wait"},
    {ActionKind::kSendB, "SEND_B", "send", "send"},
    {ActionKind::kRecvB, "RECV_B", "recv_wait", "recv_wait"},
    {ActionKind::kStep, "STEP", "optimizer", "optimizer"},
    {ActionKind::kReduceGrad, "REDUCE_GRAD", "reduce_grad", "reduce_grad"},
    {ActionKind::kTieGrad, "TIE_GRAD", "tie_grad", "tie_grad"},
    {ActionKind::kClipGrad, "CLIP_GRAD", "clip_grad", "clip_grad"},
};
constexpr int kStagedKinds = 8;  // kKinds[0, 8) have the text form <stage><kind><mb>

// Largest stage or micro-batch index the text form accepts (fits int32 with room).
constexpr int64_t kMaxIndex = 1'000'000'000;

bool IsSpace(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

constexpr char kReduceGradText[] = "REDUCE_GRAD";
constexpr char kTieGradText[] = "TIE_GRAD";

const ActionKindNames& NamesOf(ActionKind k) {
  for (const ActionKindNames& n : kKinds) {
    if (n.kind == k) return n;
  }
  static constexpr ActionKindNames kUnknown = {ActionKind::kForward, "?", "other", "other"};
  return kUnknown;
}

const char* ActionKindName(ActionKind k) { return NamesOf(k).text; }

bool IsCompute(ActionKind k) {
  return k == ActionKind::kForward || k == ActionKind::kBackward ||
         k == ActionKind::kBackwardInput || k == ActionKind::kBackwardWeight;
}

bool IsComm(ActionKind k) {
  return k == ActionKind::kSendF || k == ActionKind::kRecvF || k == ActionKind::kSendB ||
         k == ActionKind::kRecvB;
}

std::string Action::ToString() const {
  if (kind == ActionKind::kStep) return "STEP";
  if (kind == ActionKind::kClipGrad) return "CLIP_GRAD";
  if (kind == ActionKind::kReduceGrad) return absl::StrCat(stage, kReduceGradText);
  if (kind == ActionKind::kTieGrad) return absl::StrCat(stage, kTieGradText);
  return absl::StrCat(stage, ActionKindName(kind), microbatch);
}

absl::StatusOr<Action> Action::Parse(const std::string& text) {
  size_t begin = 0;
  size_t end = text.size();
  while (begin < end && IsSpace(text[begin])) ++begin;
  while (end > begin && IsSpace(text[end - 1])) --end;
  const std::string t = text.substr(begin, end - begin);
  auto error = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("action '", t, "': ", why, " (expected e.g. 2F0, 1I3, 0SEND_F1, 1REDUCE_GRAD, 0TIE_GRAD, CLIP_GRAD or STEP)"));
  };
  if (t.empty()) return error("empty");
  if (t == "STEP") return Action{ActionKind::kStep, 0, 0};
  if (t == "CLIP_GRAD") return Action{ActionKind::kClipGrad, 0, 0};

  size_t i = 0;
  int64_t stage = 0;
  while (i < t.size() && IsDigit(t[i])) {
    stage = stage * 10 + (t[i] - '0');
    if (stage > kMaxIndex) return error("stage index out of range");
    ++i;
  }
  if (i == 0) return error("does not start with a stage index");
  const size_t kind_begin = i;
  while (i < t.size() && !IsDigit(t[i])) ++i;
  const std::string kind_text = t.substr(kind_begin, i - kind_begin);
  if (kind_text == kReduceGradText) {
    if (i != t.size()) return error("REDUCE_GRAD takes no micro-batch index");
    return Action{ActionKind::kReduceGrad, static_cast<int32_t>(stage), 0};
  }
  if (kind_text == kTieGradText) {
    if (i != t.size()) return error("TIE_GRAD takes no micro-batch index");
    return Action{ActionKind::kTieGrad, static_cast<int32_t>(stage), 0};
  }
  const ActionKindNames* kind = nullptr;
  for (int k = 0; k < kStagedKinds; ++k) {
    if (kind_text == kKinds[k].text) kind = &kKinds[k];
  }
  if (kind == nullptr) {
    return error(absl::StrCat("unknown action kind '", kind_text,
                              "' (known: F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B, REDUCE_GRAD, TIE_GRAD)"));
  }
  if (i == t.size()) return error("missing micro-batch index");
  int64_t mb = 0;
  const size_t mb_begin = i;
  while (i < t.size() && IsDigit(t[i])) {
    mb = mb * 10 + (t[i] - '0');
    if (mb > kMaxIndex) return error("micro-batch index out of range");
    ++i;
  }
  if (i != t.size() || i == mb_begin) return error("trailing characters after micro-batch index");
  return Action{kind->kind, static_cast<int32_t>(stage), static_cast<int32_t>(mb)};
}

int PeerStage(const Action& a, int num_stages) {
  switch (a.kind) {
    case ActionKind::kTieGrad:
      if (num_stages <= 0) return -1;
      return a.stage == 0 ? num_stages - 1 : 0;
    case ActionKind::kSendF:
    case ActionKind::kRecvB:
      return a.stage + 1;
    case ActionKind::kSendB:
    case ActionKind::kRecvF:
      return a.stage - 1;
    default:
      return -1;
  }
}

}  // namespace baton
