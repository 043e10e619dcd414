// Text generation from a token model (model.gpt or model.llama built by BuildBlocks): the
// next token from the logits of the last position, again and again, as nanoGPT's sample.py
// and transformers' generate do it (no key/value cache: each token runs the whole window
// forward, which is what a check against a peer needs, not what a server would do).
//
// Thread safety: Generate uses the model (its activations) for the call's duration: one
// call per model at a time.
#ifndef BATON_COMMON_NN_GENERATE_H_
#define BATON_COMMON_NN_GENERATE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/nn/model.h"

namespace baton {

struct GenerateOptions {
  int max_new_tokens = 50;
  // 0: greedy (the first of the largest logits, as torch.argmax); else the logits are divided
  // by it before the softmax.
  float temperature = 0.0f;
  // > 0: sample among the k largest logits only (ties at the k-th all kept out by index
  // order: the k first in descending value, lower ids first among equals).
  int top_k = 0;
  // The draws of one generation (sampling only): the same seed gives the same tokens.
  uint64_t seed = 0;
  // Stop after generating this id (e.g. the end-of-text token); -1: never.
  int32_t stop_id = -1;
};

// The tokens after `prompt` (at least one id, each in [0, vocab)), at most
// opts.max_new_tokens of them. The window fed to the model is the last `context` tokens
// (the model's context), as nanoGPT crops it. `model` must end in an LmHead. Sampling draws
// u in [0, 1) from a SplitMix64 stream of opts.seed (one draw per token) and takes the first
// id whose cumulative probability (float64, in id order over the kept ids) exceeds u.
// INVALID_ARGUMENT for an empty prompt, an id out of range, a negative temperature or
// top_k, a model without a head.
absl::StatusOr<std::vector<int32_t>> Generate(Sequential& model, int64_t context,
                                              const std::vector<int32_t>& prompt,
                                              const GenerateOptions& opts);

}  // namespace baton

#endif  // BATON_COMMON_NN_GENERATE_H_
