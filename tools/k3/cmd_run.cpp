// k3 run: continue a text prompt, streaming the continuation to stdout as it is generated (llama.cpp's
// llama-cli / llama-simple for plain completion).
//
//   k3 run -m DIR (-p TEXT | -f FILE) [-n N] [--temp T] [--top-k K] [--top-p P] [--min-p P] [--seed S]
//          [--repeat-penalty R] [--repeat-last-n N] [--stop STR]... [-c CTX] [--truncate]
//          [--precision fp32|bf16] [--device cpu|cuda] [-t THREADS] [--special] [--echo]
//          [--tokens-out FILE.npy]
//
// stdout: only the continuation (the prompt too with --echo). stderr: timings at the end:
//   k3: prompt      N tokens in  X ms (Y tokens/s)
//   k3: generation  M tokens in  X ms (Y tokens/s)
// Generation stops at a stop id (engine_args.h), at a --stop string (excluded from the output), after
// -n tokens, or when the -c context is full. A prompt that does not fit the context is an error unless
// --truncate (keeps the prompt's tail). --tokens-out writes the generated ids (int32 .npy).
#include <cstdio>
#include <fstream>
#include <iterator>

#include "commands.h"
#include "engine/generate.h"
#include "engine/npy.h"
#include "engine_args.h"

namespace k3::cli {
namespace {

struct RunArgs {
  ModelArgs model;
  SamplingArgs sampling;
  std::string prompt, prompt_file, tokens_out;
  std::vector<std::string> stop;
  int n_predict = -1;
  int64_t n_ctx = 4096;
  bool truncate = false, special = false, echo = false;
  bool has_prompt = false;  // -p given (possibly empty)
};

void print_timing(const char* what, int64_t n, double seconds) {
  std::fprintf(stderr, "k3: %-11s %6lld tokens in %9.2f ms (%9.2f tokens/s)\n", what, (long long)n,
               seconds * 1e3, seconds > 0 ? double(n) / seconds : 0.0);
}

Status run(const RunArgs& a) {
  if (a.has_prompt == !a.prompt_file.empty()) return error(Code::invalid_argument, "give one of -p or -f");
  std::string text = a.prompt;
  if (!a.prompt_file.empty()) {
    std::ifstream f(a.prompt_file, std::ios::binary);
    if (!f) return error(Code::not_found, a.prompt_file + ": cannot open");
    text.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  if (a.n_ctx < 2) return error(Code::invalid_argument, "-c/--ctx-size must be at least 2");

  K3_ASSIGN_OR_RETURN(Loaded l, load_model(a.model, /*with_tokenizer=*/true));
  const ModelConfig& cfg = l.model->config();
  K3_ASSIGN_OR_RETURN(SamplerParams sp, sampler_params(a.sampling, cfg.n_vocab));
  std::vector<int32_t> prompt = l.tok->encode(text, a.special);
  if (prompt.empty()) return error(Code::invalid_argument, "the prompt encodes to no tokens");
  const size_t n_given = prompt.size();
  K3_ASSIGN_OR_RETURN(prompt, fit_to_context(std::move(prompt), a.n_ctx, a.n_predict, a.truncate));
  if (prompt.size() < n_given)
    std::fprintf(stderr, "k3: prompt truncated from %zu to its last %zu tokens (-c %lld)\n", n_given,
                 prompt.size(), (long long)a.n_ctx);

  GenerateOptions go;
  go.n_predict = a.n_predict;
  go.n_ctx = a.n_ctx;
  go.stop_ids = stop_ids(cfg, *l.tok);
  go.stop_strings = a.stop;
  K3_ASSIGN_OR_RETURN(auto seq, new_sequence(l));
  StepFn step = [&](std::span<const int32_t> ids, std::vector<float>* logits) {
    return seq->forward(ids.data(), int64_t(ids.size()), logits, false);
  };
  if (a.echo) {
    std::fputs(l.tok->decode(prompt).c_str(), stdout);
    std::fflush(stdout);
  }
  Sampler sampler(sp);
  K3_ASSIGN_OR_RETURN(GenerateResult r,
                      generate(step, *l.tok, prompt, go, sampler, [](int32_t, std::string_view t) {
                        std::fwrite(t.data(), 1, t.size(), stdout);
                        std::fflush(stdout);
                        return true;
                      }));
  std::fprintf(stderr, "\n");
  print_timing("prompt", r.n_prompt_eval, r.t_prompt_s);
  print_timing("generation", r.n_decode_eval, r.t_decode_s);
  std::fprintf(stderr, "k3: %zu tokens generated, finish: %s, sampling %.2f ms\n", r.tokens.size(),
               finish_reason_name(r.finish), r.t_sample_s * 1e3);
  if (!a.tokens_out.empty())
    K3_RETURN_IF_ERROR(write_npy(a.tokens_out, r.tokens.data(), {int64_t(r.tokens.size())}));
  return ok_status();
}

}  // namespace

void add_run(CLI::App& app) {
  auto a = std::make_shared<RunArgs>();
  auto* cmd = app.add_subcommand("run", "continue a text prompt, streaming the output");
  add_model_options(cmd, &a->model, /*with_device=*/true);
  auto* p = cmd->add_option("-p,--prompt", a->prompt, "prompt text");
  cmd->add_option("-f,--file", a->prompt_file, "read the prompt from a file")->excludes(p);
  cmd->add_option("-n,--n-predict", a->n_predict,
                  "tokens to generate; -1 = until a stop or the context is full");
  add_sampling_options(cmd, &a->sampling);
  cmd->add_option("--stop", a->stop, "stop string (repeatable); excluded from the output");
  cmd->add_option("-c,--ctx-size", a->n_ctx, "context size in tokens (default 4096)");
  cmd->add_flag("--truncate", a->truncate, "keep the tail of a prompt that does not fit the context");
  cmd->add_flag("--special", a->special, "special-token spellings in the prompt become their ids");
  cmd->add_flag("--echo", a->echo, "print the prompt before the continuation");
  cmd->add_option("--tokens-out", a->tokens_out, "write the generated ids to an int32 .npy file");
  cmd->callback([a, p] {
    a->has_prompt = p->count() > 0;
    Status s = run(*a);
    if (!s.ok()) fail("run", s);
  });
}

}  // namespace k3::cli
