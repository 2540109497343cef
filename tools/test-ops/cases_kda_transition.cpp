// cases_kda_transition.cpp: test-ops cases for the KDA segment transition (src/ops/kda_transition.h).
//
// cpu (the chunkwise KDA on [v | 0] from [0 | I]) against the fp64 token-by-token reference. Inputs as the
// model feeds KDA: k l2-normalized, gates in (-5, 0) (K3) or the KL softplus form (down to about -30), beta
// in (0, 1); lengths 1, 17, 33, 40, 127 and chunks 1, 16, 64; d_v != d_k. Outputs: M [H, K, K] and S~ [H, K,
// V]. KL segments stay short: over ~100 tokens of KL gates M decays into the fp32 subnormal range, which the
// fast path flushes to zero (kda_cpu.cpp) and the reference keeps, so the NMSE of such an M is meaningless.
#include <cmath>
#include <memory>

#include "harness.h"
#include "ops/kda_transition.h"

namespace k3::opt {
namespace {

struct TransitionInputs {
  int64_t T;
  int H, K, V, chunk;
  bool kl_gate;
  std::vector<float> k, v, g, beta;
};

void init_inputs(TransitionInputs& s, Rng& rng) {
  const int64_t nh = s.T * s.H;
  s.k.resize(size_t(nh * s.K)), s.g.resize(s.k.size()), s.v.resize(size_t(nh * s.V)),
      s.beta.resize(static_cast<size_t>(nh));
  fill_normal(rng, s.k.data(), int64_t(s.k.size()));
  fill_normal(rng, s.v.data(), int64_t(s.v.size()));
  fill_uniform(rng, s.beta.data(), nh, 0.02f, 0.98f);
  for (int64_t r = 0; r < nh; ++r) {
    float ss = 0.f, *x = &s.k[size_t(r * s.K)];
    for (int i = 0; i < s.K; ++i) ss += x[i] * x[i];
    for (int i = 0; i < s.K; ++i) x[i] /= std::sqrt(ss + 1e-6f);
  }
  for (float& g : s.g) {
    if (s.kl_gate) {
      const float z = rng.uniform(-6.f, 6.f), A = std::exp(rng.uniform(-1.f, 1.5f));
      g = -A * (z > 20.f ? z : std::log1p(std::exp(z)));
    } else {
      g = rng.uniform(-5.f, -1e-3f);
    }
  }
}

}  // namespace

K3_OP_CASES(kda_transition_cases) {
  struct Shape {
    int64_t T;
    int H, K, V, chunk;
    bool kl_gate;
  };
  const Shape shapes[] = {{1, 2, 16, 16, 16, false},   {17, 3, 16, 24, 16, false},
                          {33, 2, 32, 32, 1, true},    {127, 2, 32, 16, 64, false},
                          {127, 1, 64, 64, 64, false}, {40, 1, 64, 64, 64, true}};
  for (const Shape& sh : shapes) {
    auto st = std::make_shared<TransitionInputs>(
        TransitionInputs{sh.T, sh.H, sh.K, sh.V, sh.chunk, sh.kl_gate, {}, {}, {}, {}});
    const std::string shape = "n_tok=" + std::to_string(sh.T) + " H=" + std::to_string(sh.H) +
                              " K=" + std::to_string(sh.K) + " V=" + std::to_string(sh.V) +
                              " chunk=" + std::to_string(sh.chunk) + (sh.kl_gate ? " gate=kl" : " gate=k3");
    cases.push_back(std::make_unique<FnCase>(
        "kda_transition", shape, 1e-9, [st](Rng& rng) { init_inputs(*st, rng); },
        [st](Backend b, RunContext& ctx) {
          KdaTransitionParams p;
          p.n_tok = st->T, p.n_head = st->H, p.d_k = st->K, p.d_v = st->V, p.chunk = st->chunk;
          p.k = st->k.data(), p.v = st->v.data(), p.g = st->g.data(), p.beta = st->beta.data();
          p.M = ctx.out_f32(0, int64_t(st->H) * st->K * st->K);
          p.S = ctx.out_f32(1, int64_t(st->H) * st->K * st->V);
          if (b == Backend::ref)
            kda_transition_ref(p);
          else
            kda_transition_cpu(p, ctx.pool);
        }));
  }
}

}  // namespace k3::opt
