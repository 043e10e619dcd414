// Hugging Face transformers checkpoints: GPT-2 (GPT2LMHeadModel) and LLaMA
// (LlamaForCausalLM) model directories, read into baton's blocks and written from them.
//
// A model directory holds config.json and either model.safetensors or a sharded
// model.safetensors.index.json ({"weight_map": {tensor name: shard file}}). config.json is
// read with protobuf's JSON parser; only what baton computes exactly the same way is
// accepted (see ModelSpecFromHfConfig for the refusals).
//
// The mapping, one table in hf.cc (HfTable), baton name <- Hugging Face name(s):
//   GPT-2 (the "transformer." prefix is optional on read and written on export)
//     embed.token [V,C]              <- wte.weight [V,C]
//     embed.position [T,C]           <- wpe.weight [n_positions,C], rows 0..T-1 (an export
//                                       with a base keeps the rest: HfExportOptions)
//     block.i.ln1.{weight,bias}      <- h.i.ln_1.{weight,bias}
//     block.i.attn.qkv.weight [3C,C] <- h.i.attn.c_attn.weight [C,3C] transposed (Conv1D)
//     block.i.attn.qkv.bias          <- h.i.attn.c_attn.bias
//     block.i.attn.proj.weight       <- h.i.attn.c_proj.weight transposed (Conv1D)
//     block.i.ln2.*                  <- h.i.ln_2.*
//     block.i.mlp.fc.weight [4C,C]   <- h.i.mlp.c_fc.weight [C,4C] transposed (Conv1D)
//     block.i.mlp.proj.weight [C,4C] <- h.i.mlp.c_proj.weight [4C,C] transposed (Conv1D)
//     head.ln.{weight,bias}          <- ln_f.{weight,bias}
//     head.logits.weight [V,C]       <- wte.weight when tied, else lm_head.weight
//   LLaMA
//     embed.token                    <- model.embed_tokens.weight
//     block.i.attn_norm.weight       <- model.layers.i.input_layernorm.weight
//     block.i.attn.qkv.weight        <- rows of q_proj [H*D,C], k_proj [KVH*D,C], v_proj
//     block.i.attn.proj.weight       <- model.layers.i.self_attn.o_proj.weight
//     block.i.mlp_norm.weight        <- model.layers.i.post_attention_layernorm.weight
//     block.i.mlp.gate_up.weight     <- rows of mlp.gate_proj [I,C] then mlp.up_proj [I,C]
//     block.i.mlp.down.weight        <- model.layers.i.mlp.down_proj.weight [C,I]
//     head.norm.weight               <- model.norm.weight
//     head.logits.weight             <- model.embed_tokens.weight when tied, else lm_head.weight
// Rotary embeddings: Hugging Face's LLaMA checkpoints already hold q_proj and k_proj with
// the rows of each head permuted for rotate_half (convert_llama_weights_to_hf.py does
// that once, from Meta's interleaved layout), and baton's rotary pairs dimension j with
// j + D/2 exactly as rotate_half does, so q and k are copied without any permutation.
// Non-parameter buffers (GPT-2's h.i.attn.bias / masked_bias, rotary inv_freq) are ignored.
//
// Thread safety: the functions touch only their arguments and the named files.
#ifndef BATON_COMMON_CHECKPOINT_HF_H_
#define BATON_COMMON_CHECKPOINT_HF_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "baton/v1/job.pb.h"
#include "common/core/tensor.h"
#include "common/nn/model.h"
#include "google/protobuf/struct.pb.h"

namespace baton {

// config.json's text parsed. INVALID_ARGUMENT naming `where` (the file) when it is not a
// JSON object.
absl::StatusOr<google::protobuf::Struct> ParseHfConfig(const std::string& json,
                                                       const std::string& where = "config.json");
// dir/config.json read and parsed; the file's errors (NOT_FOUND, ...) name it.
absl::StatusOr<google::protobuf::Struct> ReadHfConfig(const std::string& dir);

// The baton model of a supported config:
//   gpt2:  vocab_size, n_positions -> context, n_embd -> d_model, n_head -> heads,
//          n_layer -> layers, tie_word_embeddings (default true) -> tie_embeddings;
//   llama: vocab_size, max_position_embeddings -> context, hidden_size -> d_model,
//          num_attention_heads -> heads, num_key_value_heads -> kv_heads,
//          num_hidden_layers -> layers, intermediate_size, rope_theta (also read from
//          rope_parameters), rms_norm_eps, tie_word_embeddings (default false).
// INVALID_ARGUMENT naming the config.json key and its value for what baton does not compute
// the same way: another model_type or architectures entry; rope_scaling (or a
// rope_parameters.rope_type other than "default"); mixture-of-experts keys
// (num_local_experts, num_experts, n_routed_experts); sliding_window; attention_bias or
// mlp_bias true; hidden_act other than "silu" (llama); activation_function other than
// "gelu_new", layer_norm_epsilon other than 1e-5, n_inner other than null or 4 * n_embd,
// scale_attn_by_inverse_layer_idx true or scale_attn_weights false (gpt2); head_dim other
// than hidden_size / num_attention_heads; a missing or non-integer dimension.
absl::StatusOr<baton::v1::ModelSpec> ModelSpecFromHfConfig(const google::protobuf::Struct& config);

// OK when `spec` is the model of `config` (ModelSpecFromHfConfig's refusals first): every
// field equal, defaults applied on both sides, except that the spec's context may be
// smaller than n_positions / max_position_embeddings (GPT-2 then uses wpe's first context
// rows). INVALID_ARGUMENT naming both sides otherwise, e.g. "model.gpt.d_model is 64 but
// config.json n_embd is 128".
absl::Status CheckSpecAgainstHf(const baton::v1::ModelSpec& spec,
                                const google::protobuf::Struct& config);

// Loads spec.init().from_hf into `blocks`, model blocks [first_block, first_block +
// blocks->size()) (a pipeline stage's; the whole model with first_block 0). The directory
// is confined to `data_roots` like training text (ConfineDataPath; a relative path is
// looked up under each root in turn; no roots: anywhere, relative to the working
// directory); errors name init.from_hf. config.json is checked against spec.model()
// (CheckSpecAgainstHf). Only the tensors these blocks own are read, each from the file
// the index names, with F16 and BF16 widened to float32. Every parameter of `blocks` is
// overwritten (on its device). INVALID_ARGUMENT naming the tensor, the file and what was
// expected for a missing tensor, another shape or an unsupported dtype; a parameter with no
// Hugging Face counterpart is INVALID_ARGUMENT naming it. On an error some parameters may
// have been loaded: the caller discards the model.
absl::Status LoadHfWeights(const baton::v1::JobSpec& spec,
                           const std::vector<std::string>& data_roots, int first_block,
                           Sequential* blocks);

// The submit-time check of init.from_hf on a service that may see the workers' files (the
// coordinator): the directory is found as LoadHfWeights finds it (and confined to
// `data_roots` alike). A directory this host does not have is left to the workers. One it
// has must be a directory whose config.json, model.safetensors and
// model.safetensors.index.json, those that exist, are regular files, the JSON ones of at most
// the 64 MiB LoadHfWeights reads (CheckDataFileAtSubmit); then everything LoadHfWeights
// would refuse short of the tensors' values is refused now: config.json against
// spec.model() (CheckSpecAgainstHf), every safetensors header (a truncated file says so),
// and every tensor the model maps (present, its shape, a readable dtype). Errors name
// init.from_hf.
absl::Status CheckHfModelAtSubmit(const baton::v1::JobSpec& spec,
                                  const std::vector<std::string>& data_roots);

// The config.json text for a (validated) gpt or llama model: what transformers'
// from_pretrained needs (architectures, model_type, dimensions, n_positions /
// max_position_embeddings = context, tie_word_embeddings, dtype and torch_dtype (`dtype`'s
// name), the norm epsilon, rope_theta, the activation). With `imported` (the config.json
// the model was initialized from, which must be its model: CheckSpecAgainstHf), the
// positions are the imported ones, and so are every key baton does not write (bos_token_id,
// eos_token_id, ...) and those that do not change what the model computes (dropout,
// initializer_range, use_cache). INVALID_ARGUMENT for an mlp model.
absl::StatusOr<std::string> HfConfigJson(const baton::v1::ModelSpec& spec,
                                         DType dtype = DType::kFloat32,
                                         const google::protobuf::Struct* imported = nullptr);

// What WriteHfModel writes besides the weights it is given.
struct HfExportOptions {
  // f32, or bf16: each weight rounded to nearest even, config.json's dtype "bfloat16".
  DType dtype = DType::kFloat32;
  // The Hugging Face model directory the model was initialized from (init.from_hf), as a
  // path here; empty: none. The export then loses nothing of it that baton did not train:
  // GPT-2's position rows past the context (wpe keeps all n_positions rows, the first
  // `context` trained, the rest as imported), the imported context and config.json's other
  // keys (HfConfigJson's `imported`), and its generation_config.json and tokenizer files
  // (tokenizer.json, tokenizer_config.json, special_tokens_map.json, vocab.json, merges.txt,
  // tokenizer.model, added_tokens.json, chat_template.jinja), copied byte for byte.
  std::string base_dir;
};

// Writes dir/config.json and dir/model.safetensors (Hugging Face names; a tied model
// without lm_head.weight, as transformers saves it), and the base's files
// (HfExportOptions), each atomically (a temporary file, then rename); creates `dir` if
// needed. `params_by_baton_name` must hold every parameter of the model by its baton name
// (on any device; the tied head's copy may be absent). INVALID_ARGUMENT naming a missing or
// misshapen parameter, or a base that is not the model's (naming it); file errors name the
// file.
absl::Status WriteHfModel(const baton::v1::ModelSpec& spec,
                          const std::map<std::string, const Tensor*>& params_by_baton_name,
                          const std::string& dir, const HfExportOptions& options = {});

}  // namespace baton

#endif  // BATON_COMMON_CHECKPOINT_HF_H_
