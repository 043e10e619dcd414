// The action IR: a pipeline schedule is data, an ordered list of actions per rank.
//
// Text form (the one PyTorch's torch.distributed.pipelining uses, so schedules drawn
// there import here and ours export there): "{stage}{kind}{microbatch}", e.g.
//   2F0       forward of stage 2 on micro-batch 0
//   1B3       full backward (input then weight gradient) of stage 1, micro-batch 3
//   1I3, 1W3  the input-gradient and weight-gradient halves of that backward
//   0SEND_F1  stage 0 sends its output activation for micro-batch 1 to stage 1's rank
//   1RECV_F1  stage 1 receives that activation from stage 0's rank
//   1SEND_B1  stage 1 sends the gradient of its input for micro-batch 1 to stage 0's rank
//   0RECV_B1  stage 0 receives the gradient of its output from stage 1's rank
// "Stage" is the global stage (model chunk) index in [0, S*V); which rank runs it is the
// schedule's stage-to-rank map (schedule.h). The peer of a communication action follows
// from that map: SEND_F/RECV_B talk to the rank of stage+1, RECV_F/SEND_B to stage-1.
//
//   1REDUCE_GRAD  stage 1's gradients, complete for the step, are summed across its
//                 data-parallel replicas (no micro-batch; torch's text for it too). It
//                 starts the reduction and returns: it runs on a communication thread
//                 while the rank goes on, and STEP waits for it.
//
//   0TIE_GRAD    with tied embeddings (docs/models.md), the gradient of the token
//                embedding, which the first stage (0) and the last stage (S*V-1) each hold,
//                is summed across the two: embedding's + output projection's, after their
//                replica sums, so both apply the same update. One per end, after the
//                stage's REDUCE_GRAD and right before STEP; on one stage (S*V = 1) it is a
//                local sum. The first stage sends its part and then receives; the last
//                receives and then sends (no deadlock on any transport).
//
//   CLIP_GRAD    global-norm gradient clipping (docs/training.md), on every rank right
//                before STEP (after TIE_GRAD): the ranks pass their blocks' squared
//                gradient norms along the pipeline 0 -> 1 -> ... -> S-1, the last sums
//                them in block order and the norm travels back; every rank then scales its
//                gradients by the same coefficient. No stage, no micro-batch, like STEP.
//
// One action has no PyTorch text form: the optimizer step, written "STEP" (no stage, no
// micro-batch). Every lowered clock ends with it on every rank; CSV files omit it and
// import appends it (see schedule.h).
#ifndef BATON_COMMON_SCHEDULE_ACTION_H_
#define BATON_COMMON_SCHEDULE_ACTION_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace baton {

enum class ActionKind : uint8_t {
  kForward,         // F
  kBackward,        // B = I then W
  kBackwardInput,   // I
  kBackwardWeight,  // W
  kSendF,           // SEND_F
  kRecvF,           // RECV_F
  kSendB,           // SEND_B
  kRecvB,           // RECV_B
  kStep,            // STEP: the optimizer update, once per rank per step
  kReduceGrad,      // REDUCE_GRAD: a stage's gradients summed over its replicas
  kTieGrad,         // TIE_GRAD: the tied embedding's gradient summed across the two ends
  kClipGrad,        // CLIP_GRAD: global-norm gradient clipping, on every rank before STEP
};

// Every name an action kind goes by, from one table (action.cc): its clock text, the `kind`
// label of the worker's action-duration metrics (the dashboard queries these), and its
// category in Chrome traces (batonctl trace).
struct ActionKindNames {
  ActionKind kind;
  const char* text;    // "F", "SEND_F", "STEP", "REDUCE_GRAD"
  const char* metric;  // "F", "B", "I", "W", "send", "recv_wait", "optimizer", "reduce_grad",
                       // "tie_grad", "clip_grad"
  const char* trace;   // "forward", "backward_input", "send", "recv_wait", "optimizer", ...
};
const ActionKindNames& NamesOf(ActionKind k);

const char* ActionKindName(ActionKind k);  // NamesOf(k).text
bool IsCompute(ActionKind k);               // F, B, I, W
bool IsComm(ActionKind k);                  // SEND_*, RECV_*
// Whether an action belongs to a stage: all but STEP and CLIP_GRAD, which belong to the
// rank (their stage field is 0 whatever stages the rank holds).
inline bool HasStage(ActionKind k) { return k != ActionKind::kStep && k != ActionKind::kClipGrad; }

struct Action {
  ActionKind kind = ActionKind::kForward;
  int32_t stage = 0;       // global stage index; 0 for STEP and CLIP_GRAD
  int32_t microbatch = 0;  // 0 for STEP, REDUCE_GRAD, TIE_GRAD and CLIP_GRAD

  // "2F0", "0SEND_F1", "1REDUCE_GRAD", "0TIE_GRAD", "CLIP_GRAD", "STEP"
  std::string ToString() const;
  // Parses the text form; surrounding spaces are ignored. Errors name the text.
  static absl::StatusOr<Action> Parse(const std::string& text);

  friend bool operator==(const Action& a, const Action& b) {
    return a.kind == b.kind && a.stage == b.stage && a.microbatch == b.microbatch;
  }
  friend bool operator!=(const Action& a, const Action& b) { return !(a == b); }
};

// The stage a communication action talks to: stage + 1 for SEND_F and RECV_B (the next
// stage's activation goes out, its gradient comes back), stage - 1 for SEND_B and RECV_F;
// for TIE_GRAD, given the schedule's `num_stages`, the other end (0 <-> num_stages - 1;
// the stage itself when there is one); -1 for every other kind, and for TIE_GRAD without
// num_stages. The one place this rule is written.
int PeerStage(const Action& a, int num_stages = 0);
// Whether a communication action carries an activation (SEND_F, RECV_F) rather than a
// gradient (SEND_B, RECV_B).
inline bool CarriesActivation(ActionKind k) {
  return k == ActionKind::kSendF || k == ActionKind::kRecvF;
}

}  // namespace baton

#endif  // BATON_COMMON_SCHEDULE_ACTION_H_
