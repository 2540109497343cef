// cases_moe.cpp: test-ops cases for the MoE router selection (ops/moe_route.h) and the routed MXFP4 experts
// (ops/moe_experts.h). Backends: ref, cpu (moe_route: the CPU model's model/moe.cpp moe_route on the
// sigmoid scores; moe_experts: moe_experts_cpu, the CUDA kernels' algorithm and layout rules run on the host)
// and cuda.
//
// moe_route: logits N(0, 2) in a wider row (ld > n_expert), small biases, copied logits so ties happen;
//   ids must be equal, weights within 1e-10. Shapes: K3 (896 / 16), KL (256 / 8), k3-tiny (56 / 8), k > 32,
//   k = n_expert, n_expert 1 and not a power of two, up to kMoeRouteMaxExpert (every CUDA block shape).
//   `ties`: logits on a 0.5 grid and zero biases (most scores tie, and distinct ones stay far more than the
//   device expf's ulps apart, so large k and n_expert cannot flip a near-tie); `nan_inf`: the same with 1
//   in 8 logits NaN and some +-inf (NaN c ranks last, a selected NaN score makes the token's weights NaN;
//   ref and cuda only, the CPU model's moe_route assumes finite scores).
// moe_experts: random MXFP4 bytes, scales in [116, 124], z bf16 N(0, 1) in a wider row, random distinct
//   experts and positive weights per token; the decode and prefill kernels forced on every shape (odd token
//   counts 1, 3, 17, 45, 70, 150; d_in / d_ff multiples of 32 that are not multiples of the 128-column
//   chunk; neuron counts below one warp's tile; experts with more rows than one tile of either path; SiTU
//   and SiLU; three decode shapes whose reductions are multiples of 512, as K3's 3584 / 3072 are). NMSE
//   bound 1e-5: the kernels round at the same
//   points as the reference, only fp32 accumulation order differs (a bf16 rounding may flip).
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <set>

#include "core/dtype.h"
#include "harness.h"
#include "k3/config.h"
#include "model/common.h"
#include "model/moe.h"
#include "ops/moe_experts.h"
#include "ops/moe_route.h"

namespace k3::opt {
namespace {

enum class RouteInput { normal, ties, nan_inf };
constexpr const char* kRouteInputTag[] = {"", " ties", " nan-inf"};

struct RouteState {
  int64_t n_tok = 0, ld = 0;
  int E = 0, k = 0;
  bool renorm = true;
  RouteInput in = RouteInput::normal;
  std::vector<float> logits, bias;
};

// FnCase without the cpu backend where the inputs leave the CPU model's domain (NaN logits).
class RouteCase : public FnCase {
 public:
  RouteCase(bool cpu, std::string shape, std::function<void(Rng&)> init,
            std::function<void(Backend, RunContext&)> run)
      : FnCase("moe_route", std::move(shape), 1e-10, std::move(init), std::move(run), false, 0, 0,
               kCudaBuilt),
        cpu_(cpu) {}
  bool supports(Backend b) const override { return (b != Backend::cpu || cpu_) && FnCase::supports(b); }

 private:
  bool cpu_;
};

void add_route(CaseList& cases, int64_t n_tok, int E, int k, bool renorm,
               RouteInput in = RouteInput::normal) {
  auto st = std::make_shared<RouteState>();
  st->n_tok = n_tok, st->E = E, st->k = k, st->ld = E + 5, st->renorm = renorm, st->in = in;
  const std::string shape = "n_tok=" + std::to_string(n_tok) + " n_expert=" + std::to_string(E) +
                            " k=" + std::to_string(k) + (renorm ? "" : " no-renorm") +
                            kRouteInputTag[int(in)];
  cases.push_back(std::make_unique<RouteCase>(
      in != RouteInput::nan_inf, shape,
      [st](Rng& rng) {
        st->logits.resize(size_t(st->n_tok * st->ld));
        fill_normal(rng, st->logits.data(), int64_t(st->logits.size()), 2.0f);
        for (size_t i = 0; i < st->logits.size(); i += 7) st->logits[i] = st->logits[i / 3];  // ties
        st->bias.resize(size_t(st->E));
        fill_uniform(rng, st->bias.data(), st->E, -0.1f, 0.1f);
        for (int e = 0; e < st->E; e += 5) st->bias[size_t(e)] = 0.f;
        if (st->in != RouteInput::normal) {
          for (float& v : st->logits) v = std::round(2.f * v) / 2.f;
          std::fill(st->bias.begin(), st->bias.end(), 0.f);
        }
        if (st->in == RouteInput::nan_inf) {
          const float inf = std::numeric_limits<float>::infinity();
          for (size_t i = 0; i < st->logits.size(); i += 8) st->logits[i] = std::nanf("");
          for (size_t i = 3; i < st->logits.size(); i += 29) st->logits[i] = inf;
          for (size_t i = 5; i < st->logits.size(); i += 31) st->logits[i] = -inf;
        }
      },
      [st](Backend b, RunContext& ctx) {
        MoeRouteParams p;
        p.n_tok = st->n_tok, p.n_expert = st->E, p.k = st->k, p.ld = st->ld;
        p.renormalize = st->renorm, p.scaling = 2.446f;
        K3_ASSERT(moe_route_check(p).ok());
        if (b == Backend::ref) {
          p.logits = st->logits.data(), p.bias = st->bias.data();
          p.sel = ctx.out_i32(0, st->n_tok * st->k), p.wt = ctx.out_f32(1, st->n_tok * st->k);
          moe_route_ref(p);
        } else if (b == Backend::cpu) {  // the CPU model's routing
          ModelConfig cfg;
          cfg.moe.n_expert = st->E, cfg.moe.n_expert_used = st->k;
          cfg.moe.renormalize = st->renorm, cfg.moe.routed_scaling_factor = p.scaling;
          int32_t* sel = ctx.out_i32(0, st->n_tok * st->k);
          float* wt = ctx.out_f32(1, st->n_tok * st->k);
          std::vector<float> s(static_cast<size_t>(st->E));
          for (int64_t t = 0; t < st->n_tok; ++t) {
            for (int e = 0; e < st->E; ++e) s[size_t(e)] = sigmoidf(st->logits[size_t(t * st->ld + e)]);
            moe_route(cfg, s.data(), st->bias.data(), sel + t * st->k, wt + t * st->k);
          }
        } else {
#ifdef K3_HAVE_CUDA
          p.logits = ctx.dev_in(st->logits), p.bias = ctx.dev_in(st->bias);
          p.sel = ctx.dev_out_i32(0, st->n_tok * st->k), p.wt = ctx.dev_out_f32(1, st->n_tok * st->k);
          ctx.gpu_run([&] { moe_route_cuda(p, *ctx.gpu); });
#endif
        }
      }));
}

struct ExpertState {
  int64_t n_tok = 0, ldz = 0, ldy = 0;
  int E = 0, k = 0, d_in = 0, d_ff = 0;
  MoeAct act = MoeAct::situ;
  MoePath path = MoePath::automatic;
  int scale_lo = 116, scale_span = 9;   // E8M0 exponents drawn in [lo, lo + span)
  std::vector<std::vector<uint8_t>> w;  // per expert: w1 | w3 | w2 | s1 | s3 | s2
  std::vector<float> z, wt;
  std::vector<int32_t> sel;
  size_t w13() const { return size_t(d_ff) * d_in / 2; }
  size_t s13() const { return size_t(d_ff) * d_in / 32; }
  MoeExpertPtrs ptrs(const uint8_t* b) const {
    const uint8_t* s = b + 3 * w13();
    return {b, s, b + w13(), s + s13(), b + 2 * w13(), s + 2 * s13()};
  }
};

void add_experts(CaseList& cases, int64_t n_tok, int E, int k, int d_in, int d_ff, MoePath path,
                 MoeAct act = MoeAct::situ, int scale_lo = 116, int scale_span = 9) {
  auto st = std::make_shared<ExpertState>();
  st->n_tok = n_tok, st->E = E, st->k = k, st->d_in = d_in, st->d_ff = d_ff, st->path = path, st->act = act;
  st->scale_lo = scale_lo, st->scale_span = scale_span;
  st->ldz = d_in + 8, st->ldy = d_in + 3;
  const std::string shape =
      "n_tok=" + std::to_string(n_tok) + " n_expert=" + std::to_string(E) + " k=" + std::to_string(k) +
      " d_in=" + std::to_string(d_in) + " d_ff=" + std::to_string(d_ff) +
      (path == MoePath::decode ? " decode" : path == MoePath::prefill_mma ? " prefill_mma" : " prefill") + (act == MoeAct::silu ? " silu" : "") +
      (scale_lo != 116 ? " scales>=" + std::to_string(scale_lo) : "");
  cases.push_back(std::make_unique<FnCase>(
      "moe_experts", shape, 1e-5,
      [st](Rng& rng) {
        st->w.assign(size_t(st->E), {});
        for (auto& b : st->w) {
          b.resize(3 * st->w13() + 3 * st->s13());
          for (size_t i = 0; i < 3 * st->w13(); ++i) b[i] = uint8_t(rng.bits());
          for (size_t i = 3 * st->w13(); i < b.size(); ++i)
            b[i] = uint8_t(st->scale_lo + rng.below(st->scale_span));
        }
        st->z.resize(size_t(st->n_tok * st->ldz));
        fill_uniform_bf16(rng, st->z.data(), int64_t(st->z.size()), -2.f, 2.f);
        st->sel.resize(size_t(st->n_tok * st->k));
        st->wt.resize(st->sel.size());
        std::vector<int32_t> ids(static_cast<size_t>(st->E));
        std::iota(ids.begin(), ids.end(), 0);
        for (int64_t t = 0; t < st->n_tok; ++t) {
          for (int j = 0; j < st->k; ++j) std::swap(ids[size_t(j)], ids[size_t(j + rng.below(st->E - j))]);
          for (int j = 0; j < st->k; ++j) {
            st->sel[size_t(t * st->k + j)] = ids[size_t(j)];
            st->wt[size_t(t * st->k + j)] = rng.uniform(0.05f, 1.f);
          }
        }
      },
      [st](Backend b, RunContext& ctx) {
        MoeExpertsParams p;
        p.n_tok = st->n_tok, p.n_expert = st->E, p.k = st->k, p.d_in = st->d_in, p.d_ff = st->d_ff;
        p.ldz = st->ldz, p.ldy = st->ldy, p.act = st->act, p.path = st->path;
        K3_ASSERT(moe_experts_check(p).ok());
        const int64_t n_y = (st->n_tok - 1) * st->ldy + st->d_in;
        if (b == Backend::ref) {
          std::vector<MoeExpertPtrs> table;
          for (auto& w : st->w) table.push_back(st->ptrs(w.data()));
          p.z = st->z.data(), p.sel = st->sel.data(), p.wt = st->wt.data(), p.experts = table.data();
          p.y = ctx.out_f32(0, n_y);  // the gaps between rows keep the harness's NaN fill in every backend
          moe_experts_ref(p);
        } else if (b == Backend::cpu) {
          std::vector<MoeExpertPtrs> table;
          for (auto& w : st->w) table.push_back(st->ptrs(w.data()));
          p.z = st->z.data(), p.sel = st->sel.data(), p.wt = st->wt.data(), p.experts = table.data();
          p.y = ctx.out_f32(0, n_y);
          moe_experts_cpu(p);
        } else {
#ifdef K3_HAVE_CUDA
          std::vector<MoeExpertPtrs> table;
          for (auto& w : st->w) table.push_back(st->ptrs(ctx.dev_in(w)));
          p.experts = ctx.dev_in(table);
          p.z = ctx.dev_in(st->z), p.sel = ctx.dev_in(st->sel), p.wt = ctx.dev_in(st->wt);
          ctx.out_f32(0, n_y);
          p.y = ctx.dev_out_f32(0, n_y);
          std::vector<uint8_t> scratch(moe_experts_scratch_bytes(p));
          p.scratch = const_cast<uint8_t*>(ctx.dev_in(scratch));
          ctx.gpu_run([&] { moe_experts_cuda(p, *ctx.gpu); });
#endif
        }
      },
      false, 0, 0, kCudaBuilt));
}

}  // namespace

K3_OP_CASES(moe_cases) {
  add_route(cases, 1, 896, 16, true);
  add_route(cases, 127, 896, 16, true);
  add_route(cases, 17, 256, 8, true);
  add_route(cases, 33, 56, 8, false);
  add_route(cases, 5, 100, 40, true);  // k > 32
  add_route(cases, 3, 16, 16, true);   // k = n_expert
  add_route(cases, 2, 1, 1, true);
  add_route(cases, 9, 2048, 64, true);
  add_route(cases, 3, 3000, 100, false);
  add_route(cases, 2, 4096, 4096, true, RouteInput::ties);  // k = n_expert = kMoeRouteMaxExpert
  add_route(cases, 64, 896, 16, true, RouteInput::ties);
  add_route(cases, 7, 1000, 1000, true, RouteInput::ties);
  add_route(cases, 17, 896, 16, true, RouteInput::nan_inf);
  add_route(cases, 5, 100, 100, false, RouteInput::nan_inf);  // NaN scores selected
  add_route(cases, 5, 100, 100, true, RouteInput::nan_inf);
  add_route(cases, 3, 4096, 2000, true, RouteInput::nan_inf);
  for (MoePath path : {MoePath::decode, MoePath::prefill}) {
    add_experts(cases, 1, 23, 4, 96, 160, path);
    add_experts(cases, 3, 9, 9, 32, 32, path);
    add_experts(cases, 17, 56, 8, 128, 64, path);  // k3-tiny
    add_experts(cases, 70, 40, 6, 288, 96, path);
    add_experts(cases, 45, 12, 3, 64, 416, path, MoeAct::silu);
    add_experts(cases, 150, 4, 2, 64, 64, path);  // ~75 rows per expert: several tiles of one expert
    add_experts(cases, 40, 5, 2, 32, 96, path);   // ~16 rows per expert
    // exponents on both sides of the decode kernel's one-multiply limit (moe::kPairScaleMax = 128)
    add_experts(cases, 2, 7, 3, 96, 64, path, MoeAct::silu, 112, 24);
  }
  // the wgmma prefill kernel (d_in, d_ff multiples of 128): tiles of 25 rows (N 32), 117 (N 128, one
  // chunk of k), 45 with exponents past the one-multiply limit and a partial block of down rows (384 of 512)
  add_experts(cases, 150, 24, 4, 256, 384, MoePath::prefill);
  add_experts(cases, 700, 6, 3, 128, 256, MoePath::prefill);
  add_experts(cases, 90, 16, 8, 384, 128, MoePath::prefill, MoeAct::silu, 112, 24);
  add_experts(cases, 150, 24, 4, 256, 384, MoePath::prefill_mma);  // the same shape on the mma kernel
  // decode with reductions that are multiples of 512 (whole 512-column stages, as at K3's shapes)
  add_experts(cases, 1, 12, 4, 512, 1024, MoePath::decode);
  add_experts(cases, 9, 6, 3, 1024, 512, MoePath::decode, MoeAct::silu);
  add_experts(cases, 33, 16, 4, 512, 512, MoePath::decode, MoeAct::situ, 112, 24);
  // reductions of 9-11 chunks of 128 (partial last chunks; 3 a warp, more than the 2 in flight), several
  // tiles of 2 rows per expert at 8 tokens
  add_experts(cases, 1, 12, 4, 1184, 1056, MoePath::decode);
  add_experts(cases, 8, 10, 3, 1056, 1184, MoePath::decode, MoeAct::silu);
  add_experts(cases, 3, 7, 5, 1312, 1088, MoePath::decode, MoeAct::situ, 112, 24);
}

}  // namespace k3::opt
