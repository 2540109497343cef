// test_cuda_ops.cpp: the GPU plumbing of src/gpu (arena bump allocation, context) and a few CUDA ops against
// their references end to end (upload, run on the context's stream, synchronize, download). The op
// harness (test-ops test -b cuda) covers every op and shape; these check the pieces the model code uses.
// Device tests skip when k3::cuda::device_count() == 0 (CI has no GPU); the arena logic runs anywhere.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/cuda_check.h"
#include "core/dtype.h"
#include "gpu/arena.h"
#include "gpu/context.h"
#include "ops/attention.h"
#include "ops/kda.h"
#include "ops/linear.h"
#include "ops/rms_norm.h"

namespace k3 {
namespace {

TEST(GpuArena, BumpAllocationIsAlignedAndBounded) {
  alignas(256) static char host[4096];
  gpu::DeviceArena a;
  a.adopt(host, sizeof host, "test arena");
  auto p1 = a.alloc<float>(3);  // 12 bytes at offset 0
  ASSERT_TRUE(p1.ok());
  EXPECT_EQ(static_cast<void*>(p1.value()), static_cast<void*>(host));
  auto p2 = a.alloc_bytes(100, 64);  // next multiple of 64
  ASSERT_TRUE(p2.ok());
  EXPECT_EQ(static_cast<char*>(p2.value()) - host, 64);
  EXPECT_EQ(a.used(), 164u);
  const size_t m = a.mark();
  auto p3 = a.alloc_bytes(1000);  // default alignment 256
  ASSERT_TRUE(p3.ok());
  EXPECT_EQ(static_cast<char*>(p3.value()) - host, 256);
  a.release(m);
  EXPECT_EQ(a.used(), 164u);
  EXPECT_EQ(a.high_water(), 1256u);
  a.reset();
  EXPECT_EQ(a.used(), 0u);
}

TEST(GpuArena, ExhaustionIsAStatusNamingAskedAndLeft) {
  alignas(256) static char host[1024];
  gpu::DeviceArena a;
  a.adopt(host, sizeof host, "kv arena");
  ASSERT_TRUE(a.alloc_bytes(1000, 8).ok());
  auto r = a.alloc_bytes(100, 8);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::out_of_memory);
  const std::string& msg = r.status().message();
  EXPECT_NE(msg.find("kv arena"), std::string::npos) << msg;
  EXPECT_NE(msg.find("asked 100 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("24 of 1024 bytes left"), std::string::npos) << msg;
  EXPECT_EQ(a.used(), 1000u);  // a failed alloc changes nothing
  EXPECT_TRUE(a.alloc_bytes(24, 8).ok());
  EXPECT_FALSE(a.alloc_bytes(1, 1).ok());
  EXPECT_FALSE(a.alloc_bytes(8, 3).ok());  // not a power of two
  auto huge = a.alloc<double>(SIZE_MAX / 4);
  EXPECT_FALSE(huge.ok());
}

TEST(GpuArena, EmptyArenaRefuses) {
  gpu::DeviceArena a;
  EXPECT_FALSE(a.alloc_bytes(1).ok());
}

TEST(CudaContext, CreateOrSayWhyNot) {
  gpu::ContextOwner owner;
  const Status st = owner.create();
  if (cuda::device_count() == 0) {
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("no CUDA device"), std::string::npos) << st.message();
    GTEST_SKIP() << "no CUDA device";
  }
  ASSERT_TRUE(st.ok()) << st.message();
  GpuContext& g = owner.get();
  EXPECT_NE(g.stream, nullptr);
  EXPECT_NE(g.cublas, nullptr);
  EXPECT_NE(g.workspace, nullptr);
  gpu::DeviceArena a;
  ASSERT_TRUE(a.init(1 << 20).ok());
  auto too_big = a.alloc_bytes(size_t(2) << 20);
  EXPECT_EQ(too_big.status().code(), Code::out_of_memory);
  gpu::DeviceArena huge;
  const Status big = huge.init(size_t(1) << 50);  // 1 PiB: a clear out_of_memory, not a crash
  EXPECT_EQ(big.code(), Code::out_of_memory) << big.message();
}

#ifdef K3_HAVE_CUDA

// Device copies of host vectors for the duration of a test.
class Dev {
 public:
  explicit Dev(GpuContext& g) : g_(g) {}
  ~Dev() {
    for (void* p : ptrs_) gpu::free_device(p);
  }
  template <class T>
  T* up(const std::vector<T>& v) {
    void* d = nullptr;
    EXPECT_TRUE(gpu::malloc_device(&d, v.size() * sizeof(T)).ok());
    ptrs_.push_back(d);
    EXPECT_TRUE(gpu::copy_to_device(d, v.data(), v.size() * sizeof(T), g_).ok());
    return static_cast<T*>(d);
  }
  template <class T>
  std::vector<T> down(const T* d, size_t n) {
    std::vector<T> h(n);
    EXPECT_TRUE(gpu::copy_to_host(h.data(), d, n * sizeof(T), g_).ok());
    EXPECT_TRUE(gpu::synchronize(g_).ok());
    return h;
  }

 private:
  GpuContext& g_;
  std::vector<void*> ptrs_;
};

double nmse(const std::vector<float>& y, const std::vector<float>& ref) {
  double e = 0, d = 0;
  for (size_t i = 0; i < y.size(); ++i)
    e += (double(y[i]) - ref[i]) * (double(y[i]) - ref[i]), d += double(ref[i]) * ref[i];
  return d > 0 ? e / d : e;
}

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
    ASSERT_TRUE(owner_.create().ok());
  }
  GpuContext& g() { return owner_.get(); }
  gpu::ContextOwner owner_;
  std::mt19937 rng_{7};
  std::vector<float> randn(size_t n, float s = 1.f) {
    std::normal_distribution<float> d(0.f, s);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng_);
    return v;
  }
};

TEST_F(CudaOps, RmsNormInPlaceBf16MatchesReference) {
  const int64_t n = 5, d = 300;
  std::vector<float> x = randn(size_t(n * d), 2.f), w = randn(size_t(d));
  for (auto* v : {&x, &w}) round_bf16_inplace(v->data(), int64_t(v->size()));
  std::vector<float> ref(x.size());
  RmsNormParams p{n, d, x.data(), 0, w.data(), ref.data(), 0, 1e-5f, Precision::bf16};
  rms_norm_ref(p);
  Dev dev(g());
  float* xd = dev.up(x);
  p.x = xd, p.y = xd, p.w = dev.up(w);  // in place
  rms_norm_cuda(p, g());
  EXPECT_LT(nmse(dev.down(xd, x.size()), ref), 1e-6);
}

TEST_F(CudaOps, LinearMxfp4DecodeAndPrefillAgree) {
  const int64_t in = 256, out = 48;
  std::vector<uint8_t> w(size_t(out * in / 2)), sc(size_t(out * in / 32));
  for (auto& b : w) b = uint8_t(rng_());
  for (auto& s : sc) s = uint8_t(120 + rng_() % 8);
  LinearWeight W{DType::u8, out, in, w.data(), sc.data()};
  Dev dev(g());
  LinearWeight Wd{DType::u8, out, in, dev.up(w), dev.up(sc)};
  for (int64_t n_tok : {1, 8, 9, 40}) {  // GEMV (<= 8) and decode-to-tile + GEMM
    for (Precision prec : {Precision::fp32, Precision::bf16}) {
      std::vector<float> x = randn(size_t(n_tok * in)), ref(size_t(n_tok * out));
      if (prec == Precision::bf16) round_bf16_inplace(x.data(), int64_t(x.size()));
      LinearParams p;
      p.n_tok = n_tok, p.x = x.data(), p.y = ref.data(), p.x_precision = prec;
      linear_ref(W, p);
      std::vector<float> y0(ref.size(), NAN);
      p.x = dev.up(x), p.y = dev.up(y0);
      linear_cuda(Wd, p, g());
      EXPECT_LT(nmse(dev.down(p.y, ref.size()), ref), 1e-10)
          << "n_tok " << n_tok << " " << precision_name(prec);
    }
  }
}

TEST_F(CudaOps, LinearTilesThroughASmallWorkspace) {
  gpu::ContextOwner small;  // 64 KiB: 2 token tiles of the bf16 x copy, 64-row weight tiles
  ASSERT_TRUE(small.create({0, size_t(64) << 10, false}).ok());
  GpuContext& gs = small.get();
  const int64_t in = 256, out = 300, n_tok = 100;
  std::vector<uint8_t> w8(size_t(out * in));
  for (auto& b : w8) do
      b = uint8_t(rng_());
    while ((b & 0x7f) == 0x7f);  // no fp8 NaN codes
  std::vector<uint16_t> w16(size_t(out * in));
  for (auto& h : w16) h = f32_to_bf16(std::normal_distribution<float>(0.f, 0.1f)(rng_));
  Dev dev(gs);
  struct Case {
    DType dt;
    const void* host;
    const void* dev;
    Precision prec;
  } cases[] = {{DType::f8_e4m3, w8.data(), dev.up(w8), Precision::bf16},
               {DType::bf16, w16.data(), dev.up(w16), Precision::fp32},
               {DType::bf16, w16.data(), dev.up(w16), Precision::bf16}};
  for (const Case& c : cases) {
    std::vector<float> x = randn(size_t(n_tok * (in + 4))), ref(size_t(n_tok * out));
    if (c.prec == Precision::bf16) round_bf16_inplace(x.data(), int64_t(x.size()));
    LinearParams p;
    p.n_tok = n_tok, p.x = x.data(), p.ldx = in + 4, p.y = ref.data(), p.x_precision = c.prec;
    linear_ref(LinearWeight{c.dt, out, in, c.host, nullptr}, p);
    std::vector<float> y0(ref.size(), NAN);
    p.x = dev.up(x), p.y = dev.up(y0);
    linear_cuda(LinearWeight{c.dt, out, in, c.dev, nullptr}, p, gs);
    EXPECT_LT(nmse(dev.down(p.y, ref.size()), ref), 1e-10)
        << dtype_name(c.dt) << " " << precision_name(c.prec);
  }
}

TEST_F(CudaOps, KdaChunkEqualsReferenceAtK128) {
  const int64_t T = 20;
  const int H = 2, K = 128, V = 40;
  std::vector<float> q = randn(size_t(T * H * K), 0.05f), k = randn(q.size(), 0.088f),
                     v = randn(size_t(T * H * V));
  std::vector<float> gl(q.size()), beta(size_t(T * H)), S = randn(size_t(H * K * V), 0.1f),
                                                        o(size_t(T * H * V));
  std::uniform_real_distribution<float> ug(-3.f, -0.01f), ub(0.05f, 0.95f);
  for (float& x : gl) x = ug(rng_);
  for (float& x : beta) x = ub(rng_);
  std::vector<float> S_ref = S;
  KdaParams p{T, H, K, V, q.data(), k.data(), v.data(), gl.data(), beta.data(), S_ref.data(), o.data(), 64};
  kda_ref(p);
  Dev dev(g());
  KdaParams pd{T,         H,         K, V, dev.up(q), dev.up(k), dev.up(v), dev.up(gl), dev.up(beta),
               dev.up(S), dev.up(o), 64};
  kda_chunk_cuda(pd, g());
  EXPECT_LT(nmse(dev.down(pd.o, o.size()), o), 1e-10);
  EXPECT_LT(nmse(dev.down(pd.S, S.size()), S_ref), 1e-10);
}

TEST_F(CudaOps, AttentionCausalWithPrefixMatchesReference) {
  const int64_t n_q = 6, n_past = 40, n_kv = n_q + n_past;
  const int H = 3, D = 64, DV = 32;
  std::vector<float> q = randn(size_t(n_q * H * D)), k = randn(size_t(n_kv * H * D)),
                     v = randn(size_t(n_kv * H * DV));
  std::vector<float> ref(size_t(n_q * H * DV));
  AttentionParams p;
  p.n_q = n_q, p.n_kv = n_kv, p.n_head = H, p.d_qk = D, p.d_v = DV;
  p.q_tok_stride = H * D, p.q_head_stride = D, p.k_tok_stride = H * D, p.k_head_stride = D;
  p.v_tok_stride = H * DV, p.v_head_stride = DV, p.q_pos0 = n_past, p.scale = 0.125f;
  p.q = q.data(), p.k = k.data(), p.v = v.data(), p.out = ref.data();
  attention_ref(p);
  Dev dev(g());
  std::vector<float> y0(ref.size(), NAN);
  p.q = dev.up(q), p.k = dev.up(k), p.v = dev.up(v), p.out = dev.up(y0);
  attention_cuda(p, g());
  EXPECT_LT(nmse(dev.down(p.out, ref.size()), ref), 1e-10);
}

#endif  // K3_HAVE_CUDA

}  // namespace
}  // namespace k3
