#include "common/schedule/action.h"

#include <string>

#include "gtest/gtest.h"

namespace baton {
namespace {

TEST(ActionTest, TextRoundTripsForEveryKind) {
  const ActionKind kinds[] = {ActionKind::kForward,       ActionKind::kBackward,
                              ActionKind::kBackwardInput, ActionKind::kBackwardWeight,
                              ActionKind::kSendF,         ActionKind::kRecvF,
                              ActionKind::kSendB,         ActionKind::kRecvB};
  for (ActionKind k : kinds) {
    for (int stage : {0, 3, 127}) {
      for (int mb : {0, 1, 511}) {
        const Action a{k, stage, mb};
        absl::StatusOr<Action> back = Action::Parse(a.ToString());
        ASSERT_TRUE(back.ok()) << a.ToString() << ": " << back.status();
        EXPECT_EQ(*back, a) << a.ToString();
      }
    }
  }
  absl::StatusOr<Action> step = Action::Parse("STEP");
  ASSERT_TRUE(step.ok());
  EXPECT_EQ(step->kind, ActionKind::kStep);
  EXPECT_EQ(step->ToString(), "STEP");
  // CLIP_GRAD, like STEP, belongs to the rank: no stage, no micro-batch.
  absl::StatusOr<Action> clip = Action::Parse(" CLIP_GRAD ");
  ASSERT_TRUE(clip.ok()) << clip.status();
  EXPECT_EQ(*clip, (Action{ActionKind::kClipGrad, 0, 0}));
  EXPECT_EQ(clip->ToString(), "CLIP_GRAD");
  EXPECT_FALSE(HasStage(ActionKind::kClipGrad));
  EXPECT_FALSE(HasStage(ActionKind::kStep));
  EXPECT_TRUE(HasStage(ActionKind::kTieGrad));
  EXPECT_STREQ(NamesOf(ActionKind::kClipGrad).metric, "clip_grad");
  EXPECT_STREQ(NamesOf(ActionKind::kClipGrad).trace, "clip_grad");
  EXPECT_FALSE(Action::Parse("0CLIP_GRAD").ok());
  EXPECT_EQ(PeerStage(*clip, 4), -1);
  // REDUCE_GRAD carries a stage and no micro-batch (torch's text for it).
  const Action reduce{ActionKind::kReduceGrad, 3, 0};
  EXPECT_EQ(reduce.ToString(), "3REDUCE_GRAD");
  absl::StatusOr<Action> back = Action::Parse("3REDUCE_GRAD");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, reduce);
  EXPECT_FALSE(IsCompute(ActionKind::kReduceGrad));
  EXPECT_FALSE(IsComm(ActionKind::kReduceGrad));
}

TEST(ActionTest, PyTorchSpellings) {
  EXPECT_EQ((Action{ActionKind::kForward, 2, 0}).ToString(), "2F0");
  EXPECT_EQ((Action{ActionKind::kBackwardInput, 1, 3}).ToString(), "1I3");
  EXPECT_EQ((Action{ActionKind::kBackwardWeight, 1, 3}).ToString(), "1W3");
  EXPECT_EQ((Action{ActionKind::kBackward, 1, 3}).ToString(), "1B3");
  EXPECT_EQ((Action{ActionKind::kSendF, 0, 1}).ToString(), "0SEND_F1");
  EXPECT_EQ((Action{ActionKind::kRecvB, 0, 1}).ToString(), "0RECV_B1");
  absl::StatusOr<Action> a = Action::Parse("  12SEND_B34 \t");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, (Action{ActionKind::kSendB, 12, 34}));
}

TEST(ActionTest, PeerStagesOfCommunication) {
  EXPECT_EQ(PeerStage(*Action::Parse("2SEND_F0")), 3);
  EXPECT_EQ(PeerStage(*Action::Parse("2RECV_B0")), 3);
  EXPECT_EQ(PeerStage(*Action::Parse("2SEND_B0")), 1);
  EXPECT_EQ(PeerStage(*Action::Parse("2RECV_F0")), 1);
  EXPECT_EQ(PeerStage(*Action::Parse("2F0")), -1);
  EXPECT_EQ(PeerStage(*Action::Parse("STEP")), -1);
  EXPECT_TRUE(CarriesActivation(ActionKind::kRecvF));
  EXPECT_FALSE(CarriesActivation(ActionKind::kSendB));
}

TEST(ActionTest, KindPredicates) {
  EXPECT_TRUE(IsCompute(ActionKind::kForward));
  EXPECT_TRUE(IsCompute(ActionKind::kBackwardWeight));
  EXPECT_FALSE(IsCompute(ActionKind::kSendF));
  EXPECT_FALSE(IsCompute(ActionKind::kStep));
  EXPECT_TRUE(IsComm(ActionKind::kRecvB));
  EXPECT_FALSE(IsComm(ActionKind::kStep));
  EXPECT_STREQ(ActionKindName(ActionKind::kRecvF), "RECV_F");
  EXPECT_STREQ(ActionKindName(ActionKind::kStep), "STEP");
}

TEST(ActionTest, ParseErrorsNameTheText) {
  struct Case {
    std::string text;
    std::string expect;
  };
  const Case cases[] = {
      {"", "empty"},
      {"F0", "does not start with a stage index"},
      {"0X1", "unknown action kind 'X'"},
      {"0UNSHARD", "unknown action kind 'UNSHARD'"},
      {"0F", "missing micro-batch"},
      {"0F1x", "trailing characters"},
      {"-1F0", "does not start with a stage index"},
      {"99999999999F0", "stage index out of range"},
      {"0F99999999999", "micro-batch index out of range"},
      {"step", "does not start with a stage index"},
      {"0REDUCE_GRAD1", "REDUCE_GRAD takes no micro-batch index"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<Action> a = Action::Parse(c.text);
    ASSERT_FALSE(a.ok()) << c.text;
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string msg(a.status().message());
    EXPECT_NE(msg.find("'" + c.text + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace baton
