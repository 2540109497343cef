// k3 perplexity: sliding-window perplexity of a text file (the Hugging Face "strided" evaluation).
//
//   k3 perplexity -m DIR -f FILE [-c CTX] [--stride S] [--max-windows N] [--precision ...] [-t ...]
//                 [--device cpu|cuda]
//
// ids = encode(file) (ordinary text, no BOS). Window k covers ids [b, e) with b = k * S, e = min(b + CTX, N),
// each run from a fresh state with logits at every position. Position j is scored in the window where it
// is new: j in [max(prev_e, b + 1), e), with the window's logits row j - b - 1, so every id after the first
// is scored once and sees at least CTX - S ids of context (all of them in the first window):
//   NLL_j = logsumexp(z) - z[id_j],   perplexity = exp(mean_j NLL_j)
// With S = CTX (the default) windows do not overlap and each window's first id is not scored.
// Progress per window goes to stderr; stdout's last line is exactly "perplexity: <value>".
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>

#include "commands.h"
#include "engine_args.h"

namespace k3::cli {
namespace {

struct PplArgs {
  ModelArgs model;
  std::string file;
  int64_t n_ctx = 512;
  int64_t stride = 0;  // 0 = n_ctx
  int64_t max_windows = 0;
};

// -log softmax(z)[id], in double.
double nll(const float* z, int64_t n_vocab, int32_t id) {
  double m = z[0];
  for (int64_t i = 1; i < n_vocab; ++i) m = std::max(m, double(z[i]));
  double s = 0;
  for (int64_t i = 0; i < n_vocab; ++i) s += std::exp(double(z[i]) - m);
  return m + std::log(s) - double(z[id]);
}

Status run(const PplArgs& a) {
  const int64_t stride = a.stride > 0 ? a.stride : a.n_ctx;
  if (a.n_ctx < 2) return error(Code::invalid_argument, "-c/--ctx-size must be at least 2");
  if (stride > a.n_ctx) return error(Code::invalid_argument, "--stride must not exceed -c/--ctx-size");
  std::ifstream f(a.file, std::ios::binary);
  if (!f) return error(Code::not_found, a.file + ": cannot open");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());

  K3_ASSIGN_OR_RETURN(Loaded l, load_model(a.model, /*with_tokenizer=*/true));
  const std::vector<int32_t> ids = l.tok->encode(text, false);
  const int64_t N = int64_t(ids.size()), V = l.model->config().n_vocab;
  if (N < 2)
    return error(Code::invalid_argument, a.file + ": needs at least 2 tokens, has " + std::to_string(N));
  int64_t n_windows = 0;
  for (int64_t b = 0;; b += stride) {
    ++n_windows;
    if (b + a.n_ctx >= N) break;
  }
  if (a.max_windows > 0) n_windows = std::min(n_windows, a.max_windows);
  std::fprintf(stderr, "k3 perplexity: %lld tokens, %lld windows of %lld (stride %lld)\n", (long long)N,
               (long long)n_windows, (long long)std::min(a.n_ctx, N), (long long)stride);

  double sum_nll = 0;
  int64_t n_scored = 0, n_fed = 0, prev_e = 0;
  double seconds = 0;
  std::vector<float> logits;
  for (int64_t k = 0; k < n_windows; ++k) {
    const int64_t b = k * stride, e = std::min(b + a.n_ctx, N);
    K3_ASSIGN_OR_RETURN(auto seq, new_sequence(l));
    const auto t0 = std::chrono::steady_clock::now();
    K3_RETURN_IF_ERROR(seq->forward(ids.data() + b, e - b, &logits, true)
                           .with_context("window " + std::to_string(k + 1)));
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    n_fed += e - b;
    for (int64_t j = std::max(prev_e, b + 1); j < e; ++j) {
      sum_nll += nll(logits.data() + (j - b - 1) * V, V, ids[size_t(j)]);
      ++n_scored;
    }
    prev_e = e;
    std::fprintf(stderr, "[%lld/%lld] scored %lld tokens, perplexity so far %.4f, %.1f tokens/s\n",
                 (long long)(k + 1), (long long)n_windows, (long long)n_scored,
                 n_scored ? std::exp(sum_nll / double(n_scored)) : 0.0,
                 double(n_fed) / std::max(seconds, 1e-9));
  }
  if (n_scored == 0)
    return error(Code::invalid_argument, "no token was scored (stride equals a 1-token window?)");
  std::printf("perplexity: %.6f\n", std::exp(sum_nll / double(n_scored)));
  return ok_status();
}

}  // namespace

void add_perplexity(CLI::App& app) {
  auto a = std::make_shared<PplArgs>();
  auto* cmd = app.add_subcommand("perplexity", "sliding-window perplexity of a text file");
  add_model_options(cmd, &a->model, /*with_device=*/true);
  cmd->add_option("-f,--file", a->file, "text file to score")->required();
  cmd->add_option("-c,--ctx-size", a->n_ctx, "window size in tokens (default 512)");
  cmd->add_option("--stride", a->stride, "tokens each window advances (default: the window size)");
  cmd->add_option("--max-windows", a->max_windows, "stop after N windows (0 = all)");
  cmd->callback([a] {
    Status s = run(*a);
    if (!s.ok()) fail("perplexity", s);
  });
}

}  // namespace k3::cli
