// cases_act.cpp: test-ops cases for glu (SiTU / SiLU), sigmoid and softmax (src/ops/{glu,sigmoid,softmax}.h).
//
// Inputs: SiTU g in (-10, 10), u in (-40, 40) so both tanh caps (beta1 = 4, beta2 = 25) are exercised, and
// the key-absent case (beta2 <= 0); SiLU g in (-8, 8), u in (-4, 4); g, u come from one fused gate_up row (u
// = g + d, stride 2d) in some cases; sigmoid x in (-20, 20); softmax x in (-10, 10) times a scale, with some
// rows partly masked by -inf. Bounds: 1e-9 fp32, 1e-6 when the output is rounded to bf16.
#include <cmath>
#include <memory>

#include "cases_common.h"
#include "harness.h"
#include "ops/glu.h"
#include "ops/sigmoid.h"
#include "ops/softmax.h"

namespace k3::opt {
namespace {

struct GluState {
  std::vector<float> gu;  // [n_tok, 2d + pad]: g = row, u = row + d (fused) or separate halves
};

void add_glu(CaseList& cases, const RowShape& s, GluKind kind, float beta2, Precision prec, bool perf) {
  auto st = std::make_shared<GluState>();
  const int64_t ld = 2 * s.d + s.pad;
  std::string shape = s.str() + (kind == GluKind::silu ? " silu" : " situ") + " " + precision_name(prec);
  if (kind == GluKind::situ && beta2 <= 0) shape += " no-beta2";
  cases.push_back(std::make_unique<FnCase>(
      "glu", shape, prec == Precision::bf16 ? 1e-6 : 1e-9,
      [st, s, ld, kind, prec](Rng& rng) {
        st->gu.resize(size_t(s.n_row * ld));
        for (int64_t t = 0; t < s.n_row; ++t)
          for (int64_t i = 0; i < ld; ++i) {
            const bool is_u = i >= s.d;
            const float lim = kind == GluKind::silu ? (is_u ? 4.f : 8.f) : (is_u ? 40.f : 10.f);
            st->gu[size_t(t * ld + i)] = rng.uniform(-lim, lim);
          }
        if (prec == Precision::bf16) round_bf16_inplace(st->gu.data(), int64_t(st->gu.size()));
      },
      [st, s, ld, kind, beta2, prec](Backend b, RunContext& ctx) {
        GluParams p;
        p.kind = kind;
        p.n_tok = s.n_row;
        p.d = s.d;
        p.g = st->gu.data();
        p.u = st->gu.data() + s.d;
        p.ldg = p.ldu = ld;
        p.h = ctx.out_f32(0, s.n_row * (s.d + s.pad));
        p.ldh = s.d + s.pad;
        p.beta2 = beta2;
        p.precision = prec;
        if (b == Backend::ref)
          glu_ref(p);
        else if (b == Backend::cpu)
          glu_cpu(p, ctx.pool);
#ifdef K3_HAVE_CUDA
        else {
          const float* gu = ctx.dev_in(st->gu);
          p.g = gu;
          p.u = gu + s.d;
          p.h = ctx.dev_out_f32(0, s.n_row * (s.d + s.pad));
          ctx.gpu_run([&] { glu_cuda(p, *ctx.gpu); });
        }
#endif
      },
      perf, 12.0 * double(s.n_row * s.d), 20.0 * double(s.n_row * s.d), kCudaBuilt));
}

void add_sigmoid(CaseList& cases, const RowShape& s, bool perf) {
  auto st = std::make_shared<std::vector<float>>();
  const int64_t ld = s.d + s.pad;
  cases.push_back(std::make_unique<FnCase>(
      "sigmoid", s.str(), 1e-10,
      [st, s, ld](Rng& rng) {
        st->resize(size_t(s.n_row * ld));
        fill_uniform(rng, st->data(), int64_t(st->size()), -20.f, 20.f);
      },
      [st, s, ld](Backend b, RunContext& ctx) {
        SigmoidParams p;
        p.n_row = s.n_row;
        p.d = s.d;
        p.x = st->data();
        p.ldx = ld;
        p.y = ctx.out_f32(0, s.n_row * ld);
        p.ldy = ld;
        if (b == Backend::ref)
          sigmoid_ref(p);
        else if (b == Backend::cpu)
          sigmoid_cpu(p, ctx.pool);
#ifdef K3_HAVE_CUDA
        else {
          p.x = ctx.dev_in(*st);
          p.y = ctx.dev_out_f32(0, s.n_row * ld);
          ctx.gpu_run([&] { sigmoid_cuda(p, *ctx.gpu); });
        }
#endif
      },
      perf, 8.0 * double(s.n_row * s.d), 4.0 * double(s.n_row * s.d), kCudaBuilt));
}

void add_softmax(CaseList& cases, const RowShape& s, float scale, bool masked, bool perf) {
  auto st = std::make_shared<std::vector<float>>();
  const int64_t ld = s.d + s.pad;
  std::string shape = s.str() + " scale=" + std::to_string(scale).substr(0, 5) + (masked ? " masked" : "");
  cases.push_back(std::make_unique<FnCase>(
      "softmax", shape, 1e-10,
      [st, s, ld, masked](Rng& rng) {
        st->resize(size_t(s.n_row * ld));
        fill_uniform(rng, st->data(), int64_t(st->size()), -10.f, 10.f);
        if (masked)  // causal-like mask: row t keeps its first (t % d) + 1 entries
          for (int64_t t = 0; t < s.n_row; ++t)
            for (int64_t i = t % s.d + 1; i < s.d; ++i) (*st)[size_t(t * ld + i)] = -INFINITY;
      },
      [st, s, ld, scale](Backend b, RunContext& ctx) {
        SoftmaxParams p;
        p.n_row = s.n_row;
        p.n = s.d;
        p.x = st->data();
        p.ldx = ld;
        p.y = ctx.out_f32(0, s.n_row * ld);
        p.ldy = ld;
        p.scale = scale;
        if (b == Backend::ref)
          softmax_ref(p);
        else if (b == Backend::cpu)
          softmax_cpu(p, ctx.pool);
#ifdef K3_HAVE_CUDA
        else {
          p.x = ctx.dev_in(*st);
          p.y = ctx.dev_out_f32(0, s.n_row * ld);
          ctx.gpu_run([&] { softmax_cuda(p, *ctx.gpu); });
        }
#endif
      },
      perf, 8.0 * double(s.n_row * s.d), 5.0 * double(s.n_row * s.d), kCudaBuilt));
}

}  // namespace

K3_OP_CASES(act_cases) {
  for (const RowShape& s : row_shapes()) {
    for (Precision prec : {Precision::fp32, Precision::bf16}) {
      add_glu(cases, s, GluKind::situ, 25.f, prec, false);
      add_glu(cases, s, GluKind::silu, 0.f, prec, false);
    }
    add_glu(cases, s, GluKind::situ, 0.f, Precision::bf16, false);
    add_sigmoid(cases, s, false);
    add_softmax(cases, s, 1.f, false, false);
    add_softmax(cases, s, 0.0883883f, true, false);
  }
  const RowShape ps = row_perf_shape();
  add_glu(cases, ps, GluKind::situ, 25.f, Precision::bf16, true);
  add_glu(cases, ps, GluKind::silu, 0.f, Precision::bf16, true);
  add_sigmoid(cases, ps, true);
  add_softmax(cases, ps, 1.f, false, true);
}

}  // namespace k3::opt
