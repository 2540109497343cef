// test_gpu_kda_fast.cpp: the GPU model on the fast KDA kernels (ops/kda_fast.h, src/gpu/kda_fast_gpu.cu).
//
// They serve bf16 mode with KDA heads of 128, which no tiny checkpoint has (16), so the test makes one in
// memory: tiny-k3 / tiny-kl with the KDA head size set to 128, every other tensor the checkpoint's own, the
// KDA tensors drawn as scripts/make_tiny_checkpoints.py draws them. Then, on the GPU in bf16 mode:
//   - layer by layer against the CPU at the same rounding points (GpuModel::set_layer_inputs): every named
//     intermediate NMSE <= 1e-4, for a prefill (chunked fast kernel on K3, generic on KL's unbounded gate)
//     and then decode steps (the fused decode kernel);
//   - one-shot prefill, chunked prefill and token-by-token decode give the same logits;
//   - a batch mixing decode and prefill sequences = each alone; a state moved to the CPU and back.
// Without a CUDA device every test skips. Compiles; NOT YET RUN ON A GPU (session 3 had no device).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "core/dtype.h"
#include "gpu/model_gpu.h"
#include "io/checkpoint.h"
#include "io/hf_config.h"
#include "io/manifest.h"
#include "model/model.h"
#include "gpu_test_util.h"
#include "model_test_util.h"

namespace k3 {
namespace {


using testutil::nmse;
using testutil::random_tokens;
using testutil::run_gpu;

// A tiny checkpoint with KDA heads of 128: the base's tensors where the shape is unchanged, fresh KDA ones.
class WideKdaCheckpoint : public Checkpoint {
 public:
  static std::unique_ptr<WideKdaCheckpoint> make(const std::string& base_name) {
    const std::string dir = std::string(K3_SOURCE_DIR) + "/models/" + base_name;
    auto base = Checkpoint::open(dir);
    EXPECT_TRUE(base.ok()) << base.status().message();
    if (!base.ok()) return nullptr;
    std::ifstream f(dir + "/config.json");
    std::stringstream ss;
    ss << f.rdbuf();
    std::string json = ss.str();
    const size_t la = json.find("linear_attn_config"), hd = json.find("\"head_dim\"", la);
    EXPECT_NE(hd, std::string::npos);
    const size_t colon = json.find(':', hd), end = json.find_first_of(",}", colon);
    json.replace(colon + 1, end - colon - 1, " 128");
    auto cfg = parse_hf_config(json);
    EXPECT_TRUE(cfg.ok()) << cfg.status().message();
    if (!cfg.ok()) return nullptr;
    std::unique_ptr<WideKdaCheckpoint> c(new WideKdaCheckpoint);
    c->base_ = std::move(base).value();
    c->cfg_ = std::move(cfg).value();
    c->fill();
    return c;
  }
  const ModelConfig& config() const override { return cfg_; }
  const std::string& dir() const override { return dir_; }
  const TensorView* find(std::string_view name) const override {
    auto it = t_.find(std::string(name));
    return it == t_.end() ? nullptr : &it->second;
  }
  std::vector<std::string> names() const override {
    std::vector<std::string> n;
    for (const auto& [k, v] : t_) n.push_back(k);
    return n;
  }

 private:
  void fill() {
    std::mt19937 rng(1234);
    std::normal_distribution<float> N(0.f, 1.f);
    std::uniform_real_distribution<float> U(0.f, 1.f);
    const bool k3 = cfg_.kda.has_gate_lower_bound;
    const int64_t H = cfg_.kda.n_head;
    const auto has = [&](const std::string& n) { return base_->find(n) != nullptr; };
    for (const ExpectedTensor& e : expected_tensors(cfg_, has)) {
      const TensorView* b = base_->find(e.name);
      if (b && b->shape == e.shapes[0]) {
        t_[e.name] = *b;
        continue;
      }
      const std::vector<int64_t>& shape = e.shapes[0];
      TensorView v;
      v.shape = shape;
      v.dtype = b ? b->dtype : e.dtypes[0];
      const int64_t n = v.numel(), fan_in = shape.back();
      std::vector<float> x(static_cast<size_t>(n));
      const std::string& nm = e.name;
      auto ends = [&](const char* s) { return nm.size() >= std::strlen(s) && nm.ends_with(s); };
      for (int64_t i = 0; i < n; ++i) {
        if (ends("conv1d.weight")) {
          x[size_t(i)] = 0.5f * N(rng);
        } else if (ends("dt_bias")) {  // K3: g = -5 sigmoid(.) in about (-2.5, -0.2); KL: dt in (1e-3, 1e-1)
          const float dt = std::exp(std::log(1e-3f) + U(rng) * std::log(100.f));
          x[size_t(i)] = k3 ? -3.f * U(rng) : dt + std::log(-std::expm1(-dt));
        } else if (ends("A_log")) {
          x[size_t(i)] = i < H ? (k3 ? std::log(0.5f + 1.5f * U(rng)) : std::log(1.f + 15.f * U(rng))) : 0.f;
        } else if (ends("norm.weight")) {
          x[size_t(i)] = 1.f + 0.1f * N(rng);
        } else {  // [out, in] linear
          x[size_t(i)] = N(rng) / std::sqrt(float(fan_in)) * (ends("f_b_proj.weight") ? 0.5f : 1.f);
        }
      }
      std::vector<uint8_t>& d = data_.emplace_back();
      if (v.dtype == DType::bf16) {
        d.resize(size_t(n) * 2);
        auto* p = reinterpret_cast<uint16_t*>(d.data());
        for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16(x[size_t(i)]);
      } else {
        EXPECT_EQ(v.dtype, DType::f32) << nm;
        d.resize(size_t(n) * 4);
        std::memcpy(d.data(), x.data(), d.size());
      }
      v.data = d.data(), v.nbytes = d.size();
      t_[e.name] = v;
    }
  }
  std::unique_ptr<Checkpoint> base_;
  ModelConfig cfg_;
  std::string dir_ = "<memory: wide KDA>";
  std::map<std::string, TensorView> t_;
  std::vector<std::vector<uint8_t>> data_;
};

// The fast path is opt-in (K3_KDA_FAST=1, read when a GPU sequence state is made) until it has run on a GPU.
class GpuKdaFast : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override { setenv("K3_KDA_FAST", "1", 1); }
  void TearDown() override { unsetenv("K3_KDA_FAST"); }
};

// Layer by layer (each GPU layer fed the CPU's input): every named intermediate NMSE <= 1e-4, for a
// 23-token prefill and then three decode steps.
TEST_P(GpuKdaFast, Bf16EveryIntermediateMatchesCpu) {
  SKIP_WITHOUT_GPU();
  auto ck = WideKdaCheckpoint::make(GetParam());
  ASSERT_TRUE(ck);
  ASSERT_EQ(ck->config().kda.d_head, 128);
  ASSERT_NO_FATAL_FAILURE(testutil::expect_bf16_layers_match_cpu(
      *ck, {23, 1, 1, 1}, 21, std::string(GetParam()) + " wide-KDA", [](const gpu::GpuSeqState& st) {
        ASSERT_TRUE(st.kda[1].conv16) << "the fast path is not in use";
      }));
}


// One shot = chunks of 7 = token by token. bf16 end to end: the paths round differently inside the recurrence
// and the flips compound over the layers (a flipped MoE route moves a whole token: the GPU-vs-CPU bf16 logits
// of tiny-k3 differ by 1.3e-2 in session 2), so the bound is test_gpu_model's 5e-2; the strict check of the
// state and window hand-off between calls is the layer-by-layer test above (decode steps after a prefill).
TEST_P(GpuKdaFast, PrefillChunkedDecodeAgree) {
  SKIP_WITHOUT_GPU();
  auto ck = WideKdaCheckpoint::make(GetParam());
  ASSERT_TRUE(ck);
  ModelOptions opt;
  opt.precision = Precision::bf16;
  auto gpu = gpu::GpuModel::load(*ck, opt);
  ASSERT_TRUE(gpu.ok()) << gpu.status().message();
  const auto tok = random_tokens(40, ck->config().n_vocab, 5);
  const auto one = run_gpu(**gpu, tok, 40), chunked = run_gpu(**gpu, tok, 7), dec = run_gpu(**gpu, tok, 1);
  const double e_chunk = nmse(chunked, one), e_dec = nmse(dec, one);
  std::printf("[ %s wide-KDA bf16 logits NMSE vs one shot: chunks of 7 %.3g, token by token %.3g ]\n",
              GetParam(), e_chunk, e_dec);
  EXPECT_LE(e_chunk, 5e-2);
  EXPECT_LE(e_dec, 5e-2);
}

// A batch mixing decoding and prefilling sequences = each alone (bound as above: GEMM vs GEMV summation
// order); then a state moved to the CPU and back.
TEST_P(GpuKdaFast, BatchAndStateMove) {
  SKIP_WITHOUT_GPU();
  auto ck = WideKdaCheckpoint::make(GetParam());
  ASSERT_TRUE(ck);
  ModelOptions opt;
  opt.precision = Precision::bf16;
  opt.n_threads = 2;
  auto gpu = gpu::GpuModel::load(*ck, opt);
  auto cpu = Model::load(*ck, opt);
  ASSERT_TRUE(gpu.ok() && cpu.ok());
  const int32_t V = ck->config().n_vocab;
  const auto pre = random_tokens(9, V, 4);
  std::vector<std::vector<int32_t>> toks = {random_tokens(1, V, 1), random_tokens(13, V, 2),
                                            random_tokens(1, V, 3), random_tokens(6, V, 6)};
  std::vector<std::unique_ptr<gpu::GpuSeqState>> gs;
  std::vector<gpu::GpuSeqState*> ptrs;
  for (size_t i = 0; i < toks.size(); ++i) {
    auto s = (*gpu)->new_state();
    ASSERT_TRUE(s.ok());
    gs.push_back(std::move(s).value());
    ptrs.push_back(gs.back().get());
    if (i % 2 == 0) {
      ASSERT_TRUE((*gpu)->forward(*gs.back(), pre.data(), 9, nullptr, false).ok());
    }
  }
  std::vector<std::span<const int32_t>> spans(toks.begin(), toks.end());
  std::vector<std::vector<float>> last;
  Status s = (*gpu)->forward_batch(ptrs, spans, &last);
  ASSERT_TRUE(s.ok()) << s.message();
  for (size_t i = 0; i < toks.size(); ++i) {
    auto alone = (*gpu)->new_state();
    ASSERT_TRUE(alone.ok());
    std::vector<float> lg;
    if (i % 2 == 0) {
      ASSERT_TRUE((*gpu)->forward(**alone, pre.data(), 9, nullptr, false).ok());
    }
    ASSERT_TRUE((*gpu)->forward(**alone, toks[i].data(), int64_t(toks[i].size()), &lg, false).ok());
    const double e = nmse(last[i], lg);  // the batch's projections sum in another order (GEMM vs GEMV)
    std::printf("[ %s wide-KDA: sequence %zu in a mixed batch vs alone, logits NMSE %.3g ]\n", GetParam(), i,
                e);
    EXPECT_LE(e, 5e-2) << "sequence " << i << " in the batch vs alone";
  }
  // Sequence 0 (prefill, then one decode step) to the CPU and back: the uploaded copy continues exactly as
  // the GPU state it came from (S, bf16 window and latent cache moved without loss), and the CPU from the
  // same state gives nearly the same logits.
  auto host = (*cpu)->new_state();
  ASSERT_TRUE(gs[0]->download(host.get()).ok());
  auto g2 = (*gpu)->new_state();
  ASSERT_TRUE(g2.ok());
  ASSERT_TRUE((*g2)->upload(*host).ok());
  const int32_t next = 7;
  std::vector<float> lc, lg, l2;
  ASSERT_TRUE((*cpu)->forward(*host, &next, 1, &lc, false).ok());
  ASSERT_TRUE((*gpu)->forward(*gs[0], &next, 1, &lg, false).ok());
  ASSERT_TRUE((*gpu)->forward(**g2, &next, 1, &l2, false).ok());
  EXPECT_EQ(nmse(l2, lg), 0.0) << "uploaded state vs the GPU's own";
  const double e_cpu = nmse(lg, lc);
  std::printf("[ %s wide-KDA: next-token logits GPU vs CPU on a moved state NMSE %.3g ]\n", GetParam(),
              e_cpu);
  EXPECT_LE(e_cpu, 5e-2) << "GPU vs CPU continuing the same state (bf16, end to end)";
}

INSTANTIATE_TEST_SUITE_P(Families, GpuKdaFast, ::testing::Values("tiny-k3", "tiny-kl"));

}  // namespace
}  // namespace k3
