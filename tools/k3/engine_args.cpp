// engine_args.cpp: shared flags and loading for the generation commands (engine_args.h).
#include "engine_args.h"

#include <algorithm>
#include <cstdio>
#include <random>

#include <unistd.h>

#include "commands.h"

namespace k3::cli {

void add_model_options(CLI::App* cmd, ModelArgs* a, bool with_device) {
  cmd->add_option("-m,--model", a->dir, "checkpoint directory")->required();
  cmd->add_option("--precision", a->precision, "fp32 | bf16 (default fp32)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  cmd->add_option("-t,--threads", a->threads, "threads (default: all cores)")->check(CLI::NonNegativeNumber);
  if (with_device) {
    cmd->add_option("--device", a->device, "cpu | cuda (default cpu)")->check(CLI::IsMember({"cpu", "cuda"}));
    cmd->add_flag("--cuda-graph", a->cuda_graph,
                  "--device cuda: decode steps as CUDA graphs (opt-in; bit-identical to eager steps)");
  }
}

Result<Loaded> load_model(const ModelArgs& a, bool with_tokenizer) {
  Loaded l;
  ModelOptions opt;
  opt.precision = a.precision == "bf16" ? Precision::bf16 : Precision::fp32;
  opt.n_threads = a.threads;
  opt.cuda_graph = a.cuda_graph;
  CheckpointOptions copt;
  copt.progress = isatty(STDERR_FILENO);  // a bar while shards are mapped, only on a terminal
  K3_ASSIGN_OR_RETURN(l.ckpt, Checkpoint::open(a.dir, copt));
  if (with_tokenizer) {
    K3_ASSIGN_OR_RETURN(l.tok, Tokenizer::open(a.dir));
    if (l.tok->n_vocab() > l.ckpt->config().n_vocab)
      return error(Code::bad_file, a.dir + ": the tokenizer has " + std::to_string(l.tok->n_vocab()) +
                                       " ids but the model's vocab_size is " +
                                       std::to_string(l.ckpt->config().n_vocab));
  }
  K3_ASSIGN_OR_RETURN(l.model, Model::load(*l.ckpt, opt));
  if (a.device == "cuda") {
    K3_ASSIGN_OR_RETURN(l.gpu, gpu::GpuModel::load(*l.ckpt, opt));
  } else if (a.device != "cpu") {
    return error(Code::invalid_argument, "--device must be cpu or cuda");
  }
  return l;
}

Status Sequence::forward(const int32_t* ids, int64_t n, std::vector<float>* logits, bool all_logits) {
  return gpu ? gpu->forward(*gpu_state, ids, n, logits, all_logits)
             : cpu->forward(*cpu_state, ids, n, logits, all_logits);
}

Result<std::unique_ptr<Sequence>> new_sequence(const Loaded& l) {
  auto s = std::make_unique<Sequence>();
  if (l.gpu) {
    s->gpu = l.gpu.get();
    K3_ASSIGN_OR_RETURN(s->gpu_state, l.gpu->new_state());
  } else {
    s->cpu = l.model.get();
    s->cpu_state = l.model->new_state();
  }
  return Result<std::unique_ptr<Sequence>>(std::move(s));
}

Status forward_batch(const Loaded& l, std::span<Sequence* const> seqs,
                     std::span<const std::span<const int32_t>> tokens, std::vector<std::vector<float>>* last_logits) {
  if (l.gpu) {
    std::vector<gpu::GpuSeqState*> st;
    for (Sequence* s : seqs) st.push_back(s->gpu_state.get());
    return l.gpu->forward_batch(st, tokens, last_logits);
  }
  std::vector<SeqState*> st;
  for (Sequence* s : seqs) st.push_back(s->cpu_state.get());
  return l.model->forward_batch(st, tokens, last_logits);
}

void add_sampling_options(CLI::App* cmd, SamplingArgs* a) {
  cmd->add_option("--temp,--temperature", a->temperature, "temperature; 0 = greedy (default 0.8)");
  cmd->add_option("--top-k", a->top_k, "top-k; 0 = off (default 40)");
  cmd->add_option("--top-p", a->top_p, "top-p; 1 = off (default 0.95)");
  cmd->add_option("--min-p", a->min_p, "min-p; 0 = off (default 0.05)");
  cmd->add_option("--repeat-penalty", a->repeat_penalty, "repeat penalty; 1 = off (default 1.0)");
  cmd->add_option("--repeat-last-n", a->repeat_last_n,
                  "tokens the penalty looks back; -1 = all (default 64)");
  cmd->add_option("-s,--seed", a->seed, "RNG seed; -1 = random (default)");
}

Result<SamplerParams> sampler_params(const SamplingArgs& a, int32_t n_vocab) {
  SamplerParams p;
  p.temperature = a.temperature;
  p.top_k = a.top_k;
  p.top_p = a.top_p;
  p.min_p = a.min_p;
  p.repeat_penalty = a.repeat_penalty;
  p.repeat_last_n = a.repeat_last_n;
  if (a.seed >= 0) {
    p.seed = uint64_t(a.seed);
  } else {
    p.seed = std::random_device{}() & 0x7fffffff;
    if (p.temperature > 0.f) std::fprintf(stderr, "k3: sampling seed %llu\n", (unsigned long long)p.seed);
  }
  K3_RETURN_IF_ERROR(validate(p, n_vocab));
  return p;
}

std::vector<int32_t> stop_ids(const ModelConfig& cfg, const Tokenizer& tok) {
  std::vector<int32_t> ids = {tok.n_base() + 1, tok.n_base() + 2};
  if (cfg.eos_id >= 0) ids.push_back(cfg.eos_id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

void fail(const char* command, const Status& s) {
  std::fprintf(stderr, "k3 %s: %s\n", command, s.message().c_str());
  exit_code() = 1;
}

}  // namespace k3::cli
