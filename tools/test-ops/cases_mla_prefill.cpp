// cases_mla_prefill.cpp: test-ops cases for dense causal MLA prefill attention (ops/mla_prefill.h).
//
// ref  = mla_prefill_ref (fp64).
// cpu  = attention.h's attention_cpu on fp32 copies (k = [k_nope | k_rope] gathered per head).
// cuda = mla_prefill_cuda (mma.sync; softmax weights in bf16, so a looser bound).
// Layouts as the model has them: k_nope and v interleaved in one kv_b_proj output row per token
// ([n_kv, H, 128 + 128]), the rope key one shared row of the latent cache (head stride 0, token stride
// 576); also a per-head rope key. Odd lengths (1, 17, 130, 300), queries after a cache prefix (q_pos0 > 0),
// several query blocks of 128, head counts 1..5.
#include <algorithm>
#include <cmath>
#include <memory>

#include "core/dtype.h"
#include "harness.h"
#include "ops/attention.h"
#include "ops/mla_prefill.h"

namespace k3::opt {
namespace {

struct PrefillState {
  int n_q = 0, q_pos0 = 0, H = 0;
  bool shared_rope = true;
  float scale = 0;
  std::vector<uint16_t> q, kv, rope;  // q [n_q, H, 192]; kv [n_kv, H, 256]; rope [n_kv, 576] or [n_kv, H, 64]
  int n_kv() const { return q_pos0 + n_q; }
  MlaPrefillParams params(const uint16_t* qp, const uint16_t* kvp, const uint16_t* rp, float* out) const {
    MlaPrefillParams p;
    p.n_q = n_q, p.n_kv = n_kv(), p.n_head = H, p.q_pos0 = q_pos0, p.scale = scale, p.out = out;
    p.q = qp, p.q_tok_stride = int64_t(H) * kMlaPrefillQk, p.q_head_stride = kMlaPrefillQk;
    p.k_nope = kvp, p.k_tok_stride = int64_t(H) * 256, p.k_head_stride = 256;
    p.v = kvp + kMlaPrefillNope, p.v_tok_stride = int64_t(H) * 256, p.v_head_stride = 256;
    if (shared_rope)
      p.k_rope = rp + 512, p.r_tok_stride = 576, p.r_head_stride = 0;
    else
      p.k_rope = rp, p.r_tok_stride = int64_t(H) * kMlaPrefillRope, p.r_head_stride = kMlaPrefillRope;
    return p;
  }
};

std::vector<uint16_t> random_bf16(Rng& rng, size_t n, float sigma) {
  std::vector<float> x(n);
  fill_normal(rng, x.data(), int64_t(n));
  std::vector<uint16_t> y(n);
  for (size_t i = 0; i < n; ++i) y[i] = f32_to_bf16(sigma * x[i]);
  return y;
}

void add_case(CaseList& cases, int H, int n_q, int q_pos0, bool shared_rope, float sigma, bool perf = false) {
  auto st = std::make_shared<PrefillState>();
  st->n_q = n_q, st->q_pos0 = q_pos0, st->H = H, st->shared_rope = shared_rope;
  st->scale = 1.f / std::sqrt(float(kMlaPrefillQk));
  const std::string shape =
      "H=" + std::to_string(H) + " n_q=" + std::to_string(n_q) + " q_pos0=" + std::to_string(q_pos0) +
      (shared_rope ? " rope=shared" : " rope=per-head") + " sigma=" + std::to_string(sigma).substr(0, 4);
  const double n_kv = q_pos0 + n_q;
  const double flops = double(H) * n_q * (q_pos0 + (n_q + 1) / 2.0) * (kMlaPrefillQk + kMlaPrefillV) * 2;
  const double bytes =
      2.0 * (double(n_q) * H * kMlaPrefillQk + n_kv * H * 256 + n_kv * 64) + 4.0 * n_q * H * 128;
  cases.push_back(std::make_unique<FnCase>(
      "mla_prefill", shape, 1e-5,
      [st, sigma](Rng& rng) {
        const size_t n_kv = size_t(st->n_kv());
        st->q = random_bf16(rng, size_t(st->n_q) * st->H * kMlaPrefillQk, sigma);
        st->kv = random_bf16(rng, n_kv * st->H * 256, 1.f);
        st->rope = random_bf16(rng, st->shared_rope ? n_kv * 576 : n_kv * st->H * kMlaPrefillRope, 1.f);
      },
      [st](Backend b, RunContext& ctx) {
        const int64_t n_out = int64_t(st->n_q) * st->H * kMlaPrefillV;
        float* out = ctx.out_f32(0, n_out);
        MlaPrefillParams p = st->params(st->q.data(), st->kv.data(), st->rope.data(), out);
        if (b == Backend::ref) {
          mla_prefill_ref(p);
        } else if (b == Backend::cpu) {
          const int n_kv = st->n_kv(), H = st->H;
          std::vector<float> q(st->q.size()), k(size_t(n_kv) * H * kMlaPrefillQk), v(size_t(n_kv) * H * 128);
          for (size_t i = 0; i < q.size(); ++i) q[i] = bf16_to_f32(st->q[i]);
          for (int s = 0; s < n_kv; ++s)
            for (int h = 0; h < H; ++h) {
              float* kd = &k[(size_t(s) * H + h) * kMlaPrefillQk];
              const uint16_t* kn = p.k_nope + s * p.k_tok_stride + h * p.k_head_stride;
              const uint16_t* kr = p.k_rope + s * p.r_tok_stride + h * p.r_head_stride;
              const uint16_t* vs = p.v + s * p.v_tok_stride + h * p.v_head_stride;
              for (int i = 0; i < kMlaPrefillNope; ++i) kd[i] = bf16_to_f32(kn[i]);
              for (int i = 0; i < kMlaPrefillRope; ++i) kd[kMlaPrefillNope + i] = bf16_to_f32(kr[i]);
              for (int i = 0; i < kMlaPrefillV; ++i)
                v[(size_t(s) * H + h) * 128 + size_t(i)] = bf16_to_f32(vs[i]);
            }
          AttentionParams a;
          a.n_q = st->n_q, a.n_kv = n_kv, a.n_head = H, a.d_qk = kMlaPrefillQk, a.d_v = kMlaPrefillV;
          a.q = q.data(), a.q_tok_stride = int64_t(H) * kMlaPrefillQk, a.q_head_stride = kMlaPrefillQk;
          a.k = k.data(), a.k_tok_stride = int64_t(H) * kMlaPrefillQk, a.k_head_stride = kMlaPrefillQk;
          a.v = v.data(), a.v_tok_stride = int64_t(H) * 128, a.v_head_stride = 128;
          a.q_pos0 = st->q_pos0, a.scale = st->scale, a.out = out;
          attention_cpu(a, ctx.pool);
        } else {
#ifdef K3_HAVE_CUDA
          p = st->params(ctx.dev_in(st->q), ctx.dev_in(st->kv), ctx.dev_in(st->rope),
                         ctx.dev_out_f32(0, n_out));
          ctx.gpu_run([&] { mla_prefill_cuda(p, *ctx.gpu); });
#endif
        }
      },
      perf, bytes, flops, kCudaBuilt));
}

}  // namespace

K3_OP_CASES(mla_prefill_cases) {
  add_case(cases, 1, 1, 0, true, 1.f);
  add_case(cases, 3, 17, 0, true, 1.f);
  add_case(cases, 2, 130, 0, false, 1.f);        // two query blocks, the second of 2 rows
  add_case(cases, 5, 300, 0, true, 0.3f);        // flat softmax
  add_case(cases, 2, 17, 100, true, 3.f);        // after a cache prefix, peaky softmax
  add_case(cases, 1, 200, 77, false, 1.f);       // prefix not a multiple of the tile, diagonal across tiles
  add_case(cases, 96, 64, 0, true, 1.f);         // K3's head count
  add_case(cases, 8, 1024, 0, true, 1.f, true);  // perf shape
}

}  // namespace k3::opt
