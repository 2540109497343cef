// engine_args.h: what `k3 run`, `k3 chat`, `k3 perplexity` and `k3 bench` share: the model flags
// (-m, --precision, -t, --device), loading checkpoint + tokenizer + model, the llama.cpp-style sampling flags,
// the stop-id set, and timing lines.
//
//   stop ids = { config eos_token_id, [EOS] = n_base + 1, <|im_end|> / <|end_of_msg|> = n_base + 2 }
//              (FORMATS.md §1.3 and §3; MODEL.md §13 row 18), plus a chat format's own stop ids
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/sampler.h"
#include "gpu/model_gpu.h"
#include "io/checkpoint.h"
#include "io/tokenizer.h"
#include "model/model.h"

namespace k3::cli {

struct ModelArgs {
  std::string dir;                 // -m
  std::string precision = "fp32";  // --precision fp32 | bf16
  int threads = 0;                 // -t; 0 = all cores
  std::string device = "cpu";      // --device cpu | cuda
  bool cuda_graph = false;         // --cuda-graph: GPU decode steps as CUDA graphs (opt-in)
};
// with_device: also --device cpu|cuda (commands whose forward calls go through Sequence).
void add_model_options(CLI::App* cmd, ModelArgs* a, bool with_device = false);

struct Loaded {
  std::unique_ptr<Checkpoint> ckpt;  // outlives `model` (declared first, destroyed last)
  std::unique_ptr<Tokenizer> tok;    // null when not asked for
  std::unique_ptr<Model> model;          // always loaded (config, CPU path)
  std::unique_ptr<gpu::GpuModel> gpu;    // --device cuda: the forward pass runs here
};
Result<Loaded> load_model(const ModelArgs& a, bool with_tokenizer);

// One sequence on the chosen device: the CPU Model with a SeqState, or the GpuModel with a GpuSeqState.
class Sequence {
 public:
  // As Model::forward.
  Status forward(const int32_t* ids, int64_t n, std::vector<float>* logits, bool all_logits);
  int64_t n_past() const { return gpu_state ? gpu_state->n_past() : cpu_state->n_past(); }
  int64_t bytes() const { return gpu_state ? gpu_state->bytes() : cpu_state->bytes(); }

  Model* cpu = nullptr;
  std::unique_ptr<SeqState> cpu_state;
  gpu::GpuModel* gpu = nullptr;
  std::unique_ptr<gpu::GpuSeqState> gpu_state;
};
Result<std::unique_ptr<Sequence>> new_sequence(const Loaded& l);
// As Model::forward_batch over sequences of one Loaded model; last_logits[i]: [n_vocab].
Status forward_batch(const Loaded& l, std::span<Sequence* const> seqs,
                     std::span<const std::span<const int32_t>> tokens, std::vector<std::vector<float>>* last_logits);

// Sampling flags with llama.cpp's CLI defaults (temp 0.8, top-k 40, top-p 0.95, min-p 0.05, repeat
// penalty 1.0 over the last 64 tokens, seed -1 = random).
struct SamplingArgs {
  float temperature = 0.8f;
  int top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  int repeat_last_n = 64;
  int64_t seed = -1;
};
void add_sampling_options(CLI::App* cmd, SamplingArgs* a);
// Validated params; a random seed is drawn (and reported on stderr) when seed < 0.
Result<SamplerParams> sampler_params(const SamplingArgs& a, int32_t n_vocab);

std::vector<int32_t> stop_ids(const ModelConfig& cfg, const Tokenizer& tok);

// "k3: error message" on stderr and exit code 1.
void fail(const char* command, const Status& s);

}  // namespace k3::cli
