#include "common/nn/generate.h"

#include <algorithm>
#include <memory>
#include <set>
#include <vector>

#include "baton/v1/job.pb.h"
#include "common/nn/model.h"
#include "common/nn/transformer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace baton {
namespace {

using ::testing::HasSubstr;

baton::v1::ModelSpec SmallGpt() {
  baton::v1::ModelSpec s;
  auto* g = s.mutable_gpt();
  g->set_vocab_size(17);
  g->set_context(8);
  g->set_d_model(16);
  g->set_heads(2);
  g->set_layers(2);
  return s;
}

std::unique_ptr<Sequential> Model() {
  absl::StatusOr<std::unique_ptr<Sequential>> m = BuildBlocks(SmallGpt(), /*seed=*/5);
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

// The logits of every position of `tokens`, as a check computes them itself.
std::vector<float> AllLogits(Sequential& model, const std::vector<int32_t>& tokens) {
  Tensor x = Tensor::Empty({1, static_cast<int64_t>(tokens.size())}, DType::kInt32);
  std::copy(tokens.begin(), tokens.end(), x.i32());
  MicroBatch mb;
  for (int i = 0; i + 1 < model.size(); ++i) {
    Tensor y;
    EXPECT_TRUE(model.at(i).Forward(mb, x, &y).ok());
    model.at(i).Discard(mb.index);
    x = y;
  }
  auto& head = dynamic_cast<LmHead&>(model.at(model.size() - 1));
  Tensor logits = *head.Logits(x);
  return std::vector<float>(logits.f32(), logits.f32() + logits.numel());
}

// Greedy decoding takes, each time, the first largest logit of the last position of the
// window (the last `context` tokens), which a check computes independently.
TEST(GenerateTest, GreedyTakesTheLargestLogitOfTheCroppedWindow) {
  auto model = Model();
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5};
  absl::StatusOr<std::vector<int32_t>> got =
      Generate(*model, 8, prompt, {.max_new_tokens = 9, .temperature = 0.0f});
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(got->size(), 9u);
  std::vector<int32_t> tokens = prompt;
  for (int32_t next : *got) {
    const std::vector<int32_t> window(tokens.end() - std::min<size_t>(tokens.size(), 8),
                                      tokens.end());
    const std::vector<float> logits = AllLogits(*model, window);
    const float* last = logits.data() + (window.size() - 1) * 17;
    EXPECT_EQ(next, std::max_element(last, last + 17) - last);
    tokens.push_back(next);
  }
}

// Sampling is a function of the seed: the same seed, the same tokens; other seeds, other
// tokens. top-k 1 is greedy; a stop id ends the generation after it.
TEST(GenerateTest, SamplingIsAFunctionOfTheSeed) {
  auto model = Model();
  const std::vector<int32_t> prompt = {2, 7};
  GenerateOptions opts{.max_new_tokens = 20, .temperature = 1.5f, .seed = 11};
  const std::vector<int32_t> a = *Generate(*model, 8, prompt, opts);
  const std::vector<int32_t> b = *Generate(*model, 8, prompt, opts);
  EXPECT_EQ(a, b);
  std::set<std::vector<int32_t>> others;
  for (uint64_t seed = 12; seed < 16; ++seed) {
    opts.seed = seed;
    others.insert(*Generate(*model, 8, prompt, opts));
  }
  others.insert(a);
  EXPECT_GT(others.size(), 1u) << "every seed drew the same 20 tokens";
  opts.top_k = 1;
  const std::vector<int32_t> greedy =
      *Generate(*model, 8, prompt, {.max_new_tokens = 20, .temperature = 0.0f});
  EXPECT_EQ(*Generate(*model, 8, prompt, opts), greedy);
  opts.top_k = 0;
  opts.temperature = 0.0f;
  opts.stop_id = greedy[2];
  const std::vector<int32_t> stopped = *Generate(*model, 8, prompt, opts);
  const size_t first = std::find(greedy.begin(), greedy.end(), greedy[2]) - greedy.begin();
  EXPECT_EQ(stopped, std::vector<int32_t>(greedy.begin(), greedy.begin() + first + 1));
}

// With top-k the draws stay among the k largest logits of each position.
TEST(GenerateTest, TopKDrawsOnlyAmongTheKLargest) {
  auto model = Model();
  std::vector<int32_t> tokens = {4};
  const std::vector<int32_t> got = *Generate(
      *model, 8, tokens, {.max_new_tokens = 12, .temperature = 5.0f, .top_k = 3, .seed = 1});
  for (int32_t next : got) {
    const std::vector<int32_t> window(tokens.end() - std::min<size_t>(tokens.size(), 8),
                                      tokens.end());
    std::vector<float> last = AllLogits(*model, window);
    last.erase(last.begin(), last.end() - 17);
    std::vector<float> sorted = last;
    std::sort(sorted.rbegin(), sorted.rend());
    EXPECT_GE(last[next], sorted[2]) << "token " << next << " is outside the top 3";
    tokens.push_back(next);
  }
}

TEST(GenerateTest, BadArgumentsAreRefusedNamingThem) {
  auto model = Model();
  EXPECT_THAT(Generate(*model, 8, {}, {}).status().message(), HasSubstr("no tokens"));
  EXPECT_THAT(Generate(*model, 8, {1, 17}, {}).status().message(),
              HasSubstr("prompt token 1 is id 17, outside the vocabulary [0, 17)"));
  EXPECT_THAT(Generate(*model, 8, {1}, {.temperature = -1.0f}).status().message(),
              HasSubstr("temperature"));
  EXPECT_THAT(Generate(*model, 8, {1}, {.top_k = -2}).status().message(), HasSubstr("top-k"));
}

}  // namespace
}  // namespace baton
