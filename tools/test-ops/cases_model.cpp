// cases_model.cpp: test-ops cases for the model-specific ops: KDA (src/ops/kda.h) and causal / sparse
// attention (src/ops/attention.h).
//
// kda:       backends run the chunkwise form (cpu) against the fp64 recurrence (ref); "kda_recurrent" runs
// the
//            fp32 recurrence. Inputs as the model feeds them: q, k l2-normalized (q scaled by K^-1/2), gates
//            in (-5, 0) (K3 bound) or -exp(A) softplus(z) (KL, unbounded, down to about -30), beta in (0, 1),
//            a nonzero carried-in state; odd lengths (1, 17, 33, 127) and chunks 1, 16, 64. Outputs: o and S.
// attention: dense causal with a cached prefix (q_pos0 > 0), per-head K/V (unabsorbed MLA) and MQA over a
//            576-wide latent with V = its first 512 entries (absorbed MLA), and a sparse index set with -1
//            slots.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "harness.h"
#include "ops/attention.h"
#include "ops/kda.h"

namespace k3::opt {
namespace {

class KdaCase : public OpCase {
 public:
  KdaCase(bool recurrent, int64_t n_tok, int H, int K, int V, int chunk, bool kl_gate, bool perf = false)
      : recurrent_(recurrent),
        n_tok_(n_tok),
        H_(H),
        K_(K),
        V_(V),
        chunk_(chunk),
        kl_gate_(kl_gate),
        perf_(perf) {}
  bool perf() const override { return perf_; }
  double flops() const override { return 8.0 * double(n_tok_) * H_ * K_ * V_; }  // the recurrence's count
  std::string op() const override { return recurrent_ ? "kda_recurrent" : "kda"; }
  std::string shape() const override {
    return "n_tok=" + std::to_string(n_tok_) + " H=" + std::to_string(H_) + " K=" + std::to_string(K_) +
           " V=" + std::to_string(V_) + (recurrent_ ? "" : " chunk=" + std::to_string(chunk_)) +
           (kl_gate_ ? " gate=kl" : " gate=k3");
  }
  double max_nmse() const override { return 1e-9; }
  bool supports(Backend b) const override { return b != Backend::cuda || kCudaBuilt; }

  void init(Rng& rng) override {
    const int64_t nh = n_tok_ * H_;
    q_.resize(size_t(nh * K_));
    k_.resize(q_.size());
    g_.resize(q_.size());
    v_.resize(size_t(nh * V_));
    beta_.resize(size_t(nh));
    S0_.resize(size_t(int64_t(H_) * K_ * V_));
    fill_normal(rng, q_.data(), int64_t(q_.size()));
    fill_normal(rng, k_.data(), int64_t(k_.size()));
    fill_normal(rng, v_.data(), int64_t(v_.size()));
    fill_normal(rng, S0_.data(), int64_t(S0_.size()), 0.1f);
    fill_uniform(rng, beta_.data(), nh, 0.02f, 0.98f);
    for (int64_t r = 0; r < nh; ++r) {
      normalize(&q_[size_t(r * K_)], 1.f / std::sqrt(float(K_)));
      normalize(&k_[size_t(r * K_)], 1.f);
    }
    for (float& g : g_) {
      if (kl_gate_) {  // -exp(A) softplus(z), A in [-1, 1.5], z in [-6, 6]
        const float z = rng.uniform(-6.f, 6.f), A = std::exp(rng.uniform(-1.f, 1.5f));
        g = -A * (z > 20.f ? z : std::log1p(std::exp(z)));
      } else {
        g = rng.uniform(-5.f, -1e-3f);
      }
    }
  }

  void run(Backend b, RunContext& ctx) override {
    KdaParams p;
    p.n_tok = n_tok_;
    p.n_head = H_, p.d_k = K_, p.d_v = V_;
    p.q = q_.data(), p.k = k_.data(), p.v = v_.data(), p.g = g_.data(), p.beta = beta_.data();
    p.o = ctx.out_f32(0, n_tok_ * H_ * V_);
    p.S = ctx.out_f32(1, int64_t(S0_.size()));
    std::copy(S0_.begin(), S0_.end(), p.S);
    p.chunk = chunk_;
    if (b == Backend::ref)
      kda_ref(p);
    else if (b == Backend::cpu && recurrent_)
      kda_recurrent_cpu(p, ctx.pool);
    else if (b == Backend::cpu)
      kda_chunk_cpu(p, ctx.pool);
#ifdef K3_HAVE_CUDA
    else {  // S starts as the host copy of S0 (dev_out mirrors what the host buffer holds)
      p.q = ctx.dev_in(q_), p.k = ctx.dev_in(k_), p.v = ctx.dev_in(v_), p.g = ctx.dev_in(g_);
      p.beta = ctx.dev_in(beta_);
      p.o = ctx.dev_out_f32(0, n_tok_ * H_ * V_);
      p.S = ctx.dev_out_f32(1, int64_t(S0_.size()));
      ctx.gpu_run([&] {
        if (recurrent_)
          kda_recurrent_cuda(p, *ctx.gpu);
        else
          kda_chunk_cuda(p, *ctx.gpu);
      });
    }
#endif
  }

 private:
  void normalize(float* x, float scale) {
    float ss = 0.f;
    for (int i = 0; i < K_; ++i) ss += x[i] * x[i];
    const float r = scale / std::sqrt(ss + 1e-6f);
    for (int i = 0; i < K_; ++i) x[i] *= r;
  }
  bool recurrent_;
  int64_t n_tok_;
  int H_, K_, V_, chunk_;
  bool kl_gate_, perf_;
  std::vector<float> q_, k_, v_, g_, beta_, S0_;
};

enum class AttnLayout { per_head, mqa_latent, sparse };

class AttentionCase : public OpCase {
 public:
  AttentionCase(AttnLayout layout, int64_t n_q, int64_t n_past, int H, int d_qk, int d_v, int64_t n_sel = 0,
                bool perf = false)
      : layout_(layout),
        n_q_(n_q),
        n_past_(n_past),
        H_(H),
        d_qk_(d_qk),
        d_v_(d_v),
        n_sel_(n_sel),
        perf_(perf) {}
  bool perf() const override { return perf_; }
  // dense causal: query i sees n_past + i + 1 rows; scores and the weighted sum per (query, head, row)
  double flops() const override {
    const double rows = double(n_q_) * double(n_past_) + double(n_q_) * double(n_q_ + 1) / 2;
    return 2.0 * rows * H_ * (d_qk_ + d_v_);
  }
  double bytes() const override { return 4.0 * double(k_.size() + v_.size() + q_.size()); }
  std::string op() const override { return "attention"; }
  std::string shape() const override {
    static const char* names[] = {"per_head", "mqa_latent", "sparse"};
    return std::string(names[int(layout_)]) + " n_q=" + std::to_string(n_q_) +
           " n_past=" + std::to_string(n_past_) + " H=" + std::to_string(H_) +
           " d_qk=" + std::to_string(d_qk_) + " d_v=" + std::to_string(d_v_) +
           (n_sel_ ? " n_sel=" + std::to_string(n_sel_) : "");
  }
  double max_nmse() const override { return 1e-10; }
  bool supports(Backend b) const override { return b != Backend::cuda || kCudaBuilt; }

  void init(Rng& rng) override {
    const int64_t n_kv = n_past_ + n_q_;
    const int64_t kv_heads = layout_ == AttnLayout::mqa_latent ? 1 : H_;
    q_.resize(size_t(n_q_ * H_ * d_qk_));
    k_.resize(size_t(n_kv * kv_heads * d_qk_));
    v_.resize(size_t(n_kv * kv_heads * d_v_));
    fill_normal(rng, q_.data(), int64_t(q_.size()));
    fill_normal(rng, k_.data(), int64_t(k_.size()));
    fill_normal(rng, v_.data(), int64_t(v_.size()));
    if (layout_ == AttnLayout::sparse) {  // per query: a random subset of its visible positions, -1 padded
      sel_.assign(size_t(n_q_ * n_sel_), -1);
      std::vector<int32_t> all;
      for (int64_t i = 0; i < n_q_; ++i) {
        all.resize(size_t(n_past_ + i + 1));
        std::iota(all.begin(), all.end(), 0);
        for (size_t j = all.size(); j > 1; --j) std::swap(all[j - 1], all[size_t(rng.below(int64_t(j)))]);
        const int64_t take = std::min<int64_t>(n_sel_, int64_t(all.size()));
        std::sort(all.begin(), all.begin() + take);
        std::copy_n(all.begin(), take, &sel_[size_t(i * n_sel_)]);
      }
    }
  }

  void run(Backend b, RunContext& ctx) override {
    AttentionParams p;
    p.n_q = n_q_;
    p.n_kv = n_past_ + n_q_;
    p.n_head = H_, p.d_qk = d_qk_, p.d_v = d_v_;
    p.q = q_.data(), p.q_tok_stride = int64_t(H_) * d_qk_, p.q_head_stride = d_qk_;
    p.q_pos0 = n_past_;
    p.scale = 1.f / std::sqrt(float(layout_ == AttnLayout::mqa_latent ? 192 : d_qk_));
    if (layout_ == AttnLayout::mqa_latent) {  // V = the first d_v entries of each latent row
      p.k = k_.data(), p.k_tok_stride = d_qk_, p.k_head_stride = 0;
      p.v = k_.data(), p.v_tok_stride = d_qk_, p.v_head_stride = 0;
    } else {
      p.k = k_.data(), p.k_tok_stride = int64_t(H_) * d_qk_, p.k_head_stride = d_qk_;
      p.v = v_.data(), p.v_tok_stride = int64_t(H_) * d_v_, p.v_head_stride = d_v_;
    }
    if (layout_ == AttnLayout::sparse) p.sel = sel_.data(), p.n_sel = n_sel_;
    p.out = ctx.out_f32(0, n_q_ * H_ * d_v_);
    if (b == Backend::ref) {
      attention_ref(p);
    } else if (b == Backend::cpu) {
      attention_cpu(p, ctx.pool);
    } else {
#ifdef K3_HAVE_CUDA
      const float* kd = ctx.dev_in(k_);  // the latent layout reads k and v from one buffer
      p.q = ctx.dev_in(q_);
      p.k = kd;
      p.v = layout_ == AttnLayout::mqa_latent ? kd : ctx.dev_in(v_);
      p.sel = layout_ == AttnLayout::sparse ? ctx.dev_in(sel_) : nullptr;
      p.out = ctx.dev_out_f32(0, n_q_ * H_ * d_v_);
      ctx.gpu_run([&] { attention_cuda(p, *ctx.gpu); });
#endif
    }
  }

 private:
  AttnLayout layout_;
  int64_t n_q_, n_past_;
  int H_, d_qk_, d_v_;
  int64_t n_sel_;
  bool perf_;
  std::vector<float> q_, k_, v_;
  std::vector<int32_t> sel_;
};

}  // namespace

K3_OP_CASES(model_cases) {
  for (bool kl : {false, true}) {
    for (int64_t n : {1, 17, 33, 127})
      for (int chunk : {1, 16, 64})
        cases.push_back(std::make_unique<KdaCase>(false, n, 3, 16, 24, chunk, kl));
    cases.push_back(std::make_unique<KdaCase>(false, 130, 2, 128, 128, 64, kl));
    for (int64_t n : {1, 17, 33}) cases.push_back(std::make_unique<KdaCase>(true, n, 3, 16, 24, 0, kl));
  }
  // perf shapes: a 256-token prefill of 8 heads at K = V = 128, both forms
  cases.push_back(std::make_unique<KdaCase>(false, 256, 8, 128, 128, 64, false, true));
  cases.push_back(std::make_unique<KdaCase>(true, 256, 8, 128, 128, 0, false, true));
  for (int64_t n_q : {1, 17, 33})
    for (int64_t n_past : {0, 5, 127}) {
      cases.push_back(std::make_unique<AttentionCase>(AttnLayout::per_head, n_q, n_past, 3, 24, 16));
      cases.push_back(std::make_unique<AttentionCase>(AttnLayout::sparse, n_q, n_past, 3, 24, 16, 8));
    }
  for (int64_t n_q : {1, 7})
    cases.push_back(std::make_unique<AttentionCase>(AttnLayout::mqa_latent, n_q, 989, 4, 576, 512));
  // perf shapes: absorbed MLA decode over a 4k latent cache, and an unabsorbed 256-token prefill
  cases.push_back(std::make_unique<AttentionCase>(AttnLayout::mqa_latent, 1, 4095, 16, 576, 512, 0, true));
  cases.push_back(std::make_unique<AttentionCase>(AttnLayout::per_head, 256, 0, 8, 192, 128, 0, true));
}

}  // namespace k3::opt
