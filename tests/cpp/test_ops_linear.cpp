// test_ops_linear.cpp: MXFP4 decoding (all 16 codes, E8M0 extremes) against a scalar decoder written here
// from MODEL.md §9, the debug assert on scale byte 255, and linear_cpu == linear_ref at every CPU level this
// machine has (the portable fallback is forced with set_cpu_level_limit, so CI covers it too).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "ops/linear.h"

namespace k3 {
namespace {

// MODEL.md §9, written out independently of dtype.h and the kernels.
float scalar_mxfp4(const uint8_t* packed, const uint8_t* scale, int64_t in, int64_t r, int64_t c) {
  const uint8_t byte = packed[r * (in / 2) + c / 2];
  const int nib = (c % 2 == 0) ? (byte & 0x0f) : (byte >> 4);
  const float mags[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float mag = (nib & 8) ? -mags[nib & 7] : mags[nib & 7];
  return mag * std::ldexp(1.0f, int(scale[r * (in / 32) + c / 32]) - 127);
}

// Restores the CPU level limit when a test ends.
struct LevelGuard {
  CpuLevel old;
  explicit LevelGuard(CpuLevel l) : old(set_cpu_level_limit(l)) {}
  ~LevelGuard() { set_cpu_level_limit(old); }
};

std::vector<CpuLevel> levels_here() {
  std::vector<CpuLevel> out = {CpuLevel::portable};
  for (CpuLevel l : {CpuLevel::avx512, CpuLevel::avx512_bf16})
    if (cpu_level_detected() >= l) out.push_back(l);
  return out;
}

bool same_float(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

TEST(OpsLinear, Mxfp4DecodeAllCodesAndScaleExtremes) {
  // 4 rows (one per scale extreme) x 64 columns; byte b = 7b + 3r covers all 16 low nibbles per row.
  const int64_t out = 4, in = 64;
  std::vector<uint8_t> packed(size_t(out * in / 2)), scale(size_t(out * in / 32));
  const uint8_t extremes[4] = {0, 1, 127, 254};
  for (int64_t r = 0; r < out; ++r) {
    for (int64_t b = 0; b < in / 2; ++b) packed[size_t(r * in / 2 + b)] = uint8_t((b * 7 + r * 3) & 0xff);
    for (int64_t g = 0; g < in / 32; ++g) scale[size_t(r * in / 32 + g)] = extremes[r];
  }
  LinearWeight W{DType::u8, out, in, packed.data(), scale.data()};
  for (CpuLevel level : levels_here()) {
    LevelGuard guard(level);
    std::vector<float> row(static_cast<size_t>(in));
    for (int64_t r = 0; r < out; ++r) {
      linear_decode_row(W, r, 0, in, row.data());
      for (int64_t c = 0; c < in; ++c)
        ASSERT_TRUE(same_float(row[size_t(c)], scalar_mxfp4(packed.data(), scale.data(), in, r, c)))
            << cpu_level_name(level) << " r=" << r << " c=" << c << " got " << row[size_t(c)];
    }
  }
  // all 16 codes as both nibbles at scale 127 (x1): the exact table, with -0.0 for code 8
  for (int code = 0; code < 16; ++code) {
    std::vector<uint8_t> p(16, uint8_t(code | (code << 4))), s(1, 127);
    LinearWeight W1{DType::u8, 1, 32, p.data(), s.data()};
    for (CpuLevel level : levels_here()) {
      LevelGuard guard(level);
      float row[32];
      linear_decode_row(W1, 0, 0, 32, row);
      for (int c = 0; c < 32; ++c) {
        EXPECT_EQ(row[c], e2m1_to_f32(uint8_t(code))) << code;
        EXPECT_EQ(std::signbit(row[c]), code >= 8) << code;
      }
    }
  }
}

TEST(OpsLinear, Mxfp4ExtremeScalesInLinear) {
  // E8M0 0 and 254 through the full kernel: the scale is applied per group, so 6 * 2^127 * small x is finite.
  const int64_t in = 64;
  std::vector<uint8_t> packed(size_t(in / 2), 0x77), scale = {254, 0};  // all codes 7 (= 6)
  LinearWeight W{DType::u8, 1, in, packed.data(), scale.data()};
  std::vector<float> x(size_t(in), std::ldexp(1.0f, -100));
  for (CpuLevel level : levels_here()) {
    LevelGuard guard(level);
    float y = 0, y_ref = 0;
    linear_cpu(W, x.data(), &y, 1, nullptr);
    linear_ref(W, x.data(), &y_ref, 1);
    EXPECT_TRUE(std::isfinite(y_ref));
    EXPECT_NEAR(y / y_ref, 1.0, 1e-6) << cpu_level_name(level);
  }
}

TEST(OpsLinear, Mxfp4ScaleByte255IsRejected) {
  std::vector<uint8_t> scale = {127, 3, 255, 9};
  EXPECT_EQ(mxfp4_find_bad_scale(scale.data(), 4), 2);
  EXPECT_EQ(mxfp4_find_bad_scale(scale.data(), 2), -1);
#ifndef NDEBUG
  std::vector<uint8_t> packed(16 * 4, 0x11);
  LinearWeight W{DType::u8, 4, 32, packed.data(), scale.data()};
  std::vector<float> x(32, 1.0f), y(4);
  EXPECT_DEATH(linear_cpu(W, x.data(), y.data(), 1, nullptr), "assertion failed");
#endif
}

// linear_cpu against linear_ref for one weight dtype at every CPU level; returns the worst NMSE.
double worst_nmse(DType dt, bool mxfp4, int64_t n_tok, int64_t in, int64_t out, Precision prec, ThreadPool* pool) {
  std::mt19937 gen(uint32_t(n_tok * 131 + in * 7 + out));
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> x(size_t(n_tok * in));
  for (auto& v : x) v = prec == Precision::bf16 ? round_bf16(u(gen)) : u(gen);
  std::vector<uint8_t> w(size_t(out * in) * (mxfp4 ? 1 : dtype_size(dt))), scale;
  for (auto& b : w) b = uint8_t(gen());
  if (dt == DType::bf16) {
    auto* h = reinterpret_cast<uint16_t*>(w.data());
    for (int64_t i = 0; i < out * in; ++i) h[i] = f32_to_bf16(u(gen));
  }
  if (dt == DType::f32) {
    auto* f = reinterpret_cast<float*>(w.data());
    for (int64_t i = 0; i < out * in; ++i) f[i] = u(gen);
  }
  if (mxfp4) {
    w.resize(size_t(out * in / 2));
    scale.resize(size_t(out * in / 32));
    for (auto& s : scale) s = uint8_t(120 + gen() % 10);
  }
  LinearWeight W{mxfp4 ? DType::u8 : dt, out, in, w.data(), mxfp4 ? scale.data() : nullptr};
  std::vector<float> y_ref(size_t(n_tok * out)), y(size_t(n_tok * out));
  linear_ref(W, x.data(), y_ref.data(), n_tok);
  double worst = 0;
  for (CpuLevel level : levels_here()) {
    LevelGuard guard(level);
    LinearParams p;
    p.n_tok = n_tok;
    p.x = x.data();
    p.y = y.data();
    p.x_precision = prec;
    linear_cpu(W, p, pool);
    double err = 0, den = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      err += (double(y[i]) - y_ref[i]) * (double(y[i]) - y_ref[i]);
      den += double(y_ref[i]) * y_ref[i];
    }
    worst = std::max(worst, err / den);
  }
  return worst;
}

TEST(OpsLinear, CpuMatchesRefAtEveryLevel) {
  ThreadPool pool(2);
  for (int64_t n_tok : {1, 5, 989})
    for (Precision prec : {Precision::fp32, Precision::bf16}) {
      EXPECT_LT(worst_nmse(DType::bf16, false, n_tok, 96, 19, prec, &pool), 1e-10) << n_tok;
      EXPECT_LT(worst_nmse(DType::u8, true, n_tok, 96, 19, prec, &pool), 1e-10) << n_tok;
      EXPECT_LT(worst_nmse(DType::f32, false, n_tok, 37, 6, prec, nullptr), 1e-10) << n_tok;
    }
}

TEST(OpsLinear, ForcedPortableLevelSticks) {
  LevelGuard guard(CpuLevel::portable);
  EXPECT_EQ(cpu_level(), CpuLevel::portable);
}

}  // namespace
}  // namespace k3
