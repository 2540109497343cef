// cases_norm.cpp: test-ops cases for rms_norm, layer_norm and l2norm
// (src/ops/{rms_norm,layer_norm,l2norm}.h).
//
// Inputs: x ~ N(0, 2^2) plus a per-row offset (so the mean matters for layer_norm), weights in (0.5, 1.5),
// bias in (-1, 1). rms_norm in both precisions (bf16 mode: inputs bf16-rounded, as the model feeds it).
// Bounds: 1e-10 for fp32 math; 1e-6 for bf16 mode, where r differing by one ulp from the fp64 reference
// may move x*r across a bf16 rounding boundary (a 2^-8 relative step on rare elements).
#include <memory>

#include "cases_common.h"
#include "harness.h"
#include "ops/l2norm.h"
#include "ops/layer_norm.h"
#include "ops/rms_norm.h"

namespace k3::opt {
namespace {

struct RowState {
  RowShape s;
  std::vector<float> x, w, b;
  int64_t ld() const { return s.d + s.pad; }
};

void fill_rows(Rng& rng, RowState& st, bool bf16) {
  st.x.resize(size_t(st.s.n_row * st.ld()));
  for (int64_t t = 0; t < st.s.n_row; ++t) {
    const float off = rng.uniform(-1.f, 1.f);
    for (int64_t i = 0; i < st.ld(); ++i) st.x[size_t(t * st.ld() + i)] = off + rng.normal(0, 2.f);
  }
  if (bf16) round_bf16_inplace(st.x.data(), int64_t(st.x.size()));
  st.w.resize(size_t(st.s.d));
  st.b.resize(size_t(st.s.d));
  fill_uniform(rng, st.w.data(), st.s.d, 0.5f, 1.5f);
  if (bf16) round_bf16_inplace(st.w.data(), st.s.d);
  fill_uniform(rng, st.b.data(), st.s.d, -1.f, 1.f);
}

void add_rms_norm(CaseList& cases, const RowShape& s, Precision prec, bool with_w, bool perf) {
  auto st = std::make_shared<RowState>();
  st->s = s;
  const std::string shape = s.str() + " " + precision_name(prec) + (with_w ? "" : " no-w");
  const double bytes = 8.0 * double(s.n_row * s.d);
  cases.push_back(std::make_unique<FnCase>(
      "rms_norm", shape, prec == Precision::bf16 ? 1e-6 : 1e-10,
      [st, prec](Rng& rng) { fill_rows(rng, *st, prec == Precision::bf16); },
      [st, prec, with_w](Backend b, RunContext& ctx) {
        RmsNormParams p;
        p.n_row = st->s.n_row;
        p.d = st->s.d;
        p.x = st->x.data();
        p.ldx = st->ld();
        p.w = with_w ? st->w.data() : nullptr;
        p.y = ctx.out_f32(0, p.n_row * st->ld());
        p.ldy = st->ld();
        p.precision = prec;
        if (b == Backend::ref)
          rms_norm_ref(p);
        else if (b == Backend::cpu)
          rms_norm_cpu(p, ctx.pool);
#ifdef K3_HAVE_CUDA
        else {
          p.x = ctx.dev_in(st->x);
          p.w = with_w ? ctx.dev_in(st->w) : nullptr;
          p.y = ctx.dev_out_f32(0, p.n_row * st->ld());
          ctx.gpu_run([&] { rms_norm_cuda(p, *ctx.gpu); });
        }
#endif
      },
      perf, bytes, 3.0 * double(s.n_row * s.d), kCudaBuilt));
}

void add_layer_norm(CaseList& cases, const RowShape& s, bool affine, bool perf) {
  auto st = std::make_shared<RowState>();
  st->s = s;
  cases.push_back(std::make_unique<FnCase>(
      "layer_norm", s.str() + (affine ? "" : " no-affine"), 1e-10,
      [st](Rng& rng) { fill_rows(rng, *st, false); },
      [st, affine](Backend b, RunContext& ctx) {
        LayerNormParams p;
        p.n_row = st->s.n_row;
        p.d = st->s.d;
        p.x = st->x.data();
        p.ldx = st->ld();
        p.gain = affine ? st->w.data() : nullptr;
        p.bias = affine ? st->b.data() : nullptr;
        p.y = ctx.out_f32(0, p.n_row * st->ld());
        p.ldy = st->ld();
        if (b == Backend::ref)
          layer_norm_ref(p);
        else if (b == Backend::cpu)
          layer_norm_cpu(p, ctx.pool);
#ifdef K3_HAVE_CUDA
        else {
          p.x = ctx.dev_in(st->x);
          p.gain = affine ? ctx.dev_in(st->w) : nullptr;
          p.bias = affine ? ctx.dev_in(st->b) : nullptr;
          p.y = ctx.dev_out_f32(0, p.n_row * st->ld());
          ctx.gpu_run([&] { layer_norm_cuda(p, *ctx.gpu); });
        }
#endif
      },
      perf, 8.0 * double(s.n_row * s.d), 5.0 * double(s.n_row * s.d), kCudaBuilt));
}

void add_l2norm(CaseList& cases, int64_t n_row, int64_t n_head, int64_t d_head, int64_t pad, float scale,
                bool perf) {
  auto st = std::make_shared<RowState>();
  st->s = {n_row, n_head * d_head, pad};
  const std::string shape = "n_row=" + std::to_string(n_row) + " n_head=" + std::to_string(n_head) +
                            " d_head=" + std::to_string(d_head) + (pad ? " pad=" + std::to_string(pad) : "") +
                            (scale != 1.f ? " scaled" : "");
  cases.push_back(std::make_unique<FnCase>(
      "l2norm", shape, 1e-10, [st](Rng& rng) { fill_rows(rng, *st, true); },
      [st, n_head, d_head, scale](Backend b, RunContext& ctx) {
        L2NormParams p;
        p.n_row = st->s.n_row;
        p.n_head = n_head;
        p.d_head = d_head;
        p.x = st->x.data();
        p.ldx = st->ld();
        p.y = ctx.out_f32(0, p.n_row * st->ld());
        p.ldy = st->ld();
        p.scale = scale;
        if (b == Backend::ref)
          l2norm_ref(p);
        else if (b == Backend::cpu)
          l2norm_cpu(p, ctx.pool);
#ifdef K3_HAVE_CUDA
        else {
          p.x = ctx.dev_in(st->x);
          p.y = ctx.dev_out_f32(0, p.n_row * st->ld());
          ctx.gpu_run([&] { l2norm_cuda(p, *ctx.gpu); });
        }
#endif
      },
      perf, 8.0 * double(st->s.n_row * st->s.d), 3.0 * double(st->s.n_row * st->s.d), kCudaBuilt));
}

}  // namespace

K3_OP_CASES(norm_cases) {
  for (const RowShape& s : row_shapes()) {
    for (Precision prec : {Precision::fp32, Precision::bf16}) add_rms_norm(cases, s, prec, true, false);
    add_layer_norm(cases, s, true, false);
  }
  add_rms_norm(cases, {17, 100, 0}, Precision::bf16, false, false);
  add_rms_norm(cases, {5, 33, 2}, Precision::fp32, false, false);
  add_layer_norm(cases, {33, 65, 0}, false, false);
  for (int64_t n_row : {1, 17, 33, 127, 989}) add_l2norm(cases, n_row, 3, 128, 0, 0.08838834764f, false);
  add_l2norm(cases, 17, 5, 24, 7, 1.f, false);
  add_l2norm(cases, 4, 2, 13, 0, 1.f, false);
  const RowShape ps = row_perf_shape();
  add_rms_norm(cases, ps, Precision::bf16, true, true);
  add_layer_norm(cases, ps, true, true);
  add_l2norm(cases, ps.n_row, 56, 128, 0, 1.f, true);
}

}  // namespace k3::opt
