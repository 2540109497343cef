// cases_linear.cpp: test-ops cases for linear (src/ops/linear.h).
//
// Every weight dtype (f32, bf16, f16, fp8 e4m3, MXFP4) x input precision (fp32 exact, bf16-rounded x)
// x odd shapes: n_tok in {1, 3, 8, 17, 33, 127, 989} (<= 8: the GPU's GEMV, with 1 and 4-row groups: out =
// 105601 is enough row groups for 4-row groups on any occupancy), widths that are not multiples of 16/32
// (MXFP4 keeps in % 32 == 0; bf16 in = 1000 takes the GEMV's unaligned loop), row strides ldx > in and
// ldy > out, and NaN / +inf in x. Bound: NMSE <= 1e-9 against the fp64 reference; with round_bf16 (bf16 x
// only) 1e-5: a sum a last bit away from the reference's may round to the other bf16 neighbour.
#include <cmath>
#include <cstring>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "harness.h"
#include "ops/linear.h"

namespace k3::opt {
namespace {

enum class WType { f32, bf16, f16, fp8, mxfp4 };
const char* wtype_name(WType t) {
  static const char* n[] = {"f32", "bf16", "f16", "fp8", "mxfp4"};
  return n[int(t)];
}

// A random weight [out, in] of type wt: bytes in w (and MXFP4 scales in scale), which must outlive it.
LinearWeight make_weight(WType wt, int64_t out, int64_t in, Rng& rng, std::vector<uint8_t>& w,
                         std::vector<uint8_t>& scale) {
  LinearWeight W;
  W.out = out;
  W.in = in;
  const int64_t n = out * in;
  switch (wt) {
    case WType::f32: {
      W.dtype = DType::f32;
      w.resize(size_t(n) * 4);
      std::vector<float> v(static_cast<size_t>(n));
      fill_normal(rng, v.data(), n, 0.1f);
      std::memcpy(w.data(), v.data(), w.size());
      break;
    }
    case WType::bf16:
    case WType::f16: {
      W.dtype = wt == WType::bf16 ? DType::bf16 : DType::f16;
      w.resize(size_t(n) * 2);
      auto* h = reinterpret_cast<uint16_t*>(w.data());
      for (int64_t i = 0; i < n; ++i) {
        const float v = rng.normal(0, 0.1f);
        h[i] = wt == WType::bf16 ? f32_to_bf16(v) : f32_to_f16(v);
      }
      break;
    }
    case WType::fp8:
      W.dtype = DType::f8_e4m3;
      w.resize(size_t(n));
      for (auto& b : w) {
        do b = uint8_t(rng.bits());
        while ((b & 0x7f) == 0x7f);  // NaN codes: a checkpoint has none
      }
      break;
    case WType::mxfp4:
      W.dtype = DType::u8;
      w.resize(size_t(n / 2));
      for (auto& b : w) b = uint8_t(rng.bits());
      scale.resize(size_t(n / 32));
      for (auto& s : scale) s = uint8_t(118 + rng.below(12));  // 2^-9 .. 2^2
      W.scale = scale.data();
      break;
  }
  W.w = w.data();
  return W;
}

class LinearCase : public OpCase {
 public:
  LinearCase(WType wt, Precision prec, int64_t n_tok, int64_t in, int64_t out, int64_t pad_x, int64_t pad_y,
             bool perf = false, bool specials = false, bool round = false)
      : wt_(wt),
        prec_(prec),
        n_tok_(n_tok),
        in_(in),
        out_(out),
        ldx_(in + pad_x),
        ldy_(out + pad_y),
        perf_(perf),
        specials_(specials),
        round_(round) {}

  std::string op() const override { return "linear"; }
  std::string shape() const override {
    return "n_tok=" + std::to_string(n_tok_) + " in=" + std::to_string(in_) + " out=" + std::to_string(out_) +
           " w=" + wtype_name(wt_) + " x=" + precision_name(prec_) +
           (ldx_ != in_ ? " ldx=" + std::to_string(ldx_) : "") +
           (ldy_ != out_ ? " ldy=" + std::to_string(ldy_) : "") + (specials_ ? " x-has-nan-inf" : "") +
           (round_ ? " round_bf16" : "");
  }
  double max_nmse() const override { return round_ ? 1e-5 : 1e-9; }
  bool supports(Backend b) const override { return b != Backend::cuda || kCudaBuilt; }
  bool perf() const override { return perf_; }
  double bytes() const override { return double(w_.size() + scale_.size()); }
  double flops() const override { return 2.0 * double(n_tok_) * double(in_) * double(out_); }

  void init(Rng& rng) override {
    x_.resize(size_t(n_tok_ * ldx_));
    if (prec_ == Precision::bf16)
      fill_uniform_bf16(rng, x_.data(), int64_t(x_.size()), -2.f, 2.f);
    else
      fill_uniform(rng, x_.data(), int64_t(x_.size()), -2.f, 2.f);
    if (specials_ && n_tok_ >= 3) {  // token 1 gets a NaN, token 2 a +inf (a zero weight then gives NaN)
      x_[size_t(1 * ldx_ + 3)] = NAN;
      x_[size_t(2 * ldx_ + in_ / 2)] = INFINITY;
    }
    W_ = make_weight(wt_, out_, in_, rng, w_, scale_);
  }

  void run(Backend b, RunContext& ctx) override {
    LinearParams p;
    p.n_tok = n_tok_;
    p.x = x_.data();
    p.ldx = ldx_;
    p.y = ctx.out_f32(0, n_tok_ * ldy_);
    p.ldy = ldy_;
    p.x_precision = prec_;
    p.round_bf16 = round_;
    if (b == Backend::ref)
      linear_ref(W_, p);
    else if (b == Backend::cpu)
      linear_cpu(W_, p, ctx.pool);
#ifdef K3_HAVE_CUDA
    else {
      LinearWeight Wd = W_;
      Wd.w = ctx.dev_in(w_);
      Wd.scale = W_.is_mxfp4() ? ctx.dev_in(scale_) : nullptr;
      p.x = ctx.dev_in(x_);
      p.y = ctx.dev_out_f32(0, n_tok_ * ldy_);
      ctx.gpu_run([&] { linear_cuda(Wd, p, *ctx.gpu); });
    }
#endif
  }

 private:
  WType wt_;
  Precision prec_;
  int64_t n_tok_, in_, out_, ldx_, ldy_;
  bool perf_, specials_, round_;
  std::vector<float> x_;
  std::vector<uint8_t> w_, scale_;
  LinearWeight W_;
};

// linear_group_cuda: n weights of one type over one x (one GEMV launch at n_tok <= 8) against n linear_ref /
// linear_cpu calls; the outputs are laid out one after the other in one buffer.
class LinearGroupCase : public OpCase {
 public:
  LinearGroupCase(WType wt, int64_t n_tok, int64_t in, std::vector<int64_t> outs)
      : wt_(wt), n_tok_(n_tok), in_(in), outs_(std::move(outs)) {}

  std::string op() const override { return "linear"; }
  std::string shape() const override {
    std::string s = "group n_tok=" + std::to_string(n_tok_) + " in=" + std::to_string(in_) + " outs=";
    for (int64_t o : outs_) s += std::to_string(o) + ",";
    return s + " w=" + wtype_name(wt_) + " x=bf16 round_bf16 on odd weights";
  }
  double max_nmse() const override { return 1e-5; }  // rounded outputs: see the file comment
  bool supports(Backend b) const override { return b != Backend::cuda || kCudaBuilt; }

  void init(Rng& rng) override {
    x_.resize(size_t(n_tok_ * in_));
    fill_uniform_bf16(rng, x_.data(), int64_t(x_.size()), -2.f, 2.f);
    const size_t n = outs_.size();
    w_.resize(n), scale_.resize(n), W_.resize(n);
    for (size_t i = 0; i < n; ++i) W_[i] = make_weight(wt_, outs_[i], in_, rng, w_[i], scale_[i]);
  }

  void run(Backend b, RunContext& ctx) override {
    int64_t total = 0;
    for (int64_t o : outs_) total += n_tok_ * o;
    std::vector<LinearParams> p(outs_.size());
    std::vector<LinearWeight> Wd = W_;
    std::vector<const LinearWeight*> Wp;
    float* y = ctx.out_f32(0, total);
#ifdef K3_HAVE_CUDA
    const float* xd = b == Backend::cuda ? ctx.dev_in(x_) : nullptr;
    if (b == Backend::cuda) y = ctx.dev_out_f32(0, total);
#endif
    int64_t off = 0;
    for (size_t i = 0; i < outs_.size(); ++i) {
      p[i].n_tok = n_tok_, p[i].x = x_.data(), p[i].y = y + off, p[i].x_precision = Precision::bf16;
      p[i].round_bf16 = i % 2 == 1;
      off += n_tok_ * outs_[i];
#ifdef K3_HAVE_CUDA
      if (b == Backend::cuda) {
        p[i].x = xd;
        Wd[i].w = ctx.dev_in(w_[i]);
        Wd[i].scale = W_[i].is_mxfp4() ? ctx.dev_in(scale_[i]) : nullptr;
      }
#endif
      Wp.push_back(&Wd[i]);
    }
    if (b == Backend::ref) {
      for (size_t i = 0; i < outs_.size(); ++i) linear_ref(W_[i], p[i]);
    } else if (b == Backend::cpu) {
      for (size_t i = 0; i < outs_.size(); ++i) linear_cpu(W_[i], p[i], ctx.pool);
    }
#ifdef K3_HAVE_CUDA
    else {
      ctx.gpu_run([&] { linear_group_cuda(Wp.data(), p.data(), int(p.size()), *ctx.gpu); });
    }
#endif
  }

 private:
  WType wt_;
  int64_t n_tok_, in_;
  std::vector<int64_t> outs_;
  std::vector<float> x_;
  std::vector<std::vector<uint8_t>> w_, scale_;
  std::vector<LinearWeight> W_;
};

}  // namespace

K3_OP_CASES(linear_cases) {
  struct Shape {
    int64_t n_tok, in, out, pad_x, pad_y;
  };
  const Shape shapes[] = {{1, 64, 13, 0, 0},     {1, 1000, 37, 5, 0},  {3, 1000, 37, 0, 2},
                          {8, 256, 300, 4, 1},   {17, 96, 40, 0, 3},   {33, 130, 9, 7, 0},
                          {127, 256, 67, 0, 0},  {989, 48, 21, 16, 1}, {1, 64, 105601, 0, 0},
                          {5, 96, 105601, 0, 3}, {2, 200, 77, 3, 0},   {1, 128, 12288, 0, 0}};
  for (WType wt : {WType::f32, WType::bf16, WType::f16, WType::fp8, WType::mxfp4})
    for (Precision prec : {Precision::fp32, Precision::bf16})
      for (const Shape& s : shapes) {
        const int64_t in = wt == WType::mxfp4 ? (s.in + 31) / 32 * 32 : s.in;
        cases.push_back(std::make_unique<LinearCase>(wt, prec, s.n_tok, in, s.out, s.pad_x, s.pad_y));
        if (prec == Precision::bf16)  // the model's rounding point, fused into the GEMV on the GPU
          cases.push_back(std::make_unique<LinearCase>(wt, prec, s.n_tok, in, s.out, s.pad_x, s.pad_y, false,
                                                       false, true));
      }
  // NaN / Inf inputs: the positions of NaN and Inf outputs must match the reference exactly
  for (WType wt : {WType::f32, WType::bf16, WType::f16, WType::fp8, WType::mxfp4})
    for (Precision prec : {Precision::fp32, Precision::bf16})
      cases.push_back(std::make_unique<LinearCase>(wt, prec, 5, 64, 24, 0, 0, false, true));
  // grouped GEMV: segments that start inside a 4-row group, a one-row segment, n_tok 1 / 5, > 8 tokens
  // (n linear calls), unaligned rows (bf16 in = 1000)
  for (WType wt : {WType::f32, WType::bf16, WType::f16, WType::fp8, WType::mxfp4}) {
    const int64_t in = wt == WType::mxfp4 ? 1024 : 1000;
    cases.push_back(std::make_unique<LinearGroupCase>(wt, 1, in, std::vector<int64_t>{37, 1, 130, 6, 64}));
    cases.push_back(std::make_unique<LinearGroupCase>(wt, 5, 256, std::vector<int64_t>{3000, 11, 2050}));
    cases.push_back(std::make_unique<LinearGroupCase>(wt, 9, 64, std::vector<int64_t>{40, 7}));
  }
  cases.push_back(std::make_unique<LinearGroupCase>(WType::bf16, 1, 512, std::vector<int64_t>(8, 13001)));
  // perf shapes: decode GEMV (bandwidth) and a prefill block (compute)
  for (WType wt : {WType::bf16, WType::mxfp4})
    for (Precision prec : {Precision::fp32, Precision::bf16}) {
      cases.push_back(std::make_unique<LinearCase>(wt, prec, 1, 4096, 4096, 0, 0, true));
      cases.push_back(std::make_unique<LinearCase>(wt, prec, 64, 2048, 1024, 0, 0, true));
    }
}

}  // namespace k3::opt
