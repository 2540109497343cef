// test_ops_linear.cpp: MXFP4 decoding (all 16 codes, E8M0 extremes) against a scalar decoder written here
// from MODEL.md §9, the debug assert on scale byte 255, and linear_cpu == linear_ref at every CPU level this
// machine has (the portable fallback is forced with set_cpu_level_limit, so CI covers it too), and that a
// row's value does not depend on the token count or the row tile it falls in.
#include <gtest/gtest.h>

#include <algorithm>
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

// A row's value depends only on its weights and its token, bit for bit: not on how many tokens share the call
// (decode = prefill) nor on whether the row sits in a 4-row or a 1-row tile (the kernels reduce both alike).
TEST(OpsLinear, RowValueIndependentOfTileAndTokenCount) {
  ThreadPool pool(2);
  constexpr int64_t kOut = 9, kIn = 160, kTok = 7;  // rows 0..7 in 4-row tiles, row 8 in a 1-row tile
  std::mt19937 gen(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(size_t(kTok * kIn));
  for (auto& v : x) v = round_bf16(nd(gen));
  for (CpuLevel level : levels_here()) {
    LevelGuard guard(level);
    for (bool mxfp4 : {false, true})
      for (Precision prec : {Precision::fp32, Precision::bf16}) {
        const int64_t row_bytes = mxfp4 ? kIn / 2 : kIn * 2;
        std::vector<uint8_t> w(size_t(kOut * row_bytes)), sc(mxfp4 ? size_t(kOut * kIn / 32) : 0);
        if (mxfp4) {
          for (auto& b : w) b = uint8_t(gen());
          for (auto& b : sc) b = uint8_t(120 + gen() % 10);
        } else {
          auto* h = reinterpret_cast<uint16_t*>(w.data());
          for (int64_t i = 0; i < kOut * kIn; ++i) h[i] = f32_to_bf16(nd(gen));
        }
        // W2 = W with its rows rotated by one: W2 row i = W row (i + 1) % out, so W row 8 lands in a 4-row
        // tile (W2 row 7), W row 0 in the 1-row tile (W2 row 8), every other row in another tile slot.
        std::vector<uint8_t> w2(w.size()), sc2(sc.size());
        const int64_t sc_row = kIn / 32;
        for (int64_t i = 0; i < kOut; ++i) {
          const int64_t src = (i + 1) % kOut;
          std::copy_n(&w[size_t(src * row_bytes)], row_bytes, &w2[size_t(i * row_bytes)]);
          if (mxfp4) std::copy_n(&sc[size_t(src * sc_row)], sc_row, &sc2[size_t(i * sc_row)]);
        }
        const DType dt = mxfp4 ? DType::u8 : DType::bf16;
        LinearWeight W{dt, kOut, kIn, w.data(), mxfp4 ? sc.data() : nullptr};
        LinearWeight W2{dt, kOut, kIn, w2.data(), mxfp4 ? sc2.data() : nullptr};
        auto run = [&](const LinearWeight& Wt, const float* xs, int64_t n, float* y) {
          LinearParams p;
          p.n_tok = n;
          p.x = xs;
          p.y = y;
          p.x_precision = prec;
          linear_cpu(Wt, p, &pool);
        };
        std::vector<float> y(size_t(kTok * kOut)), y2(y.size()), y1(static_cast<size_t>(kOut));
        run(W, x.data(), kTok, y.data());
        run(W2, x.data(), kTok, y2.data());
        for (int64_t t = 0; t < kTok; ++t) {
          run(W, &x[size_t(t * kIn)], 1, y1.data());
          for (int64_t o = 0; o < kOut; ++o) {
            EXPECT_TRUE(same_float(y1[size_t(o)], y[size_t(t * kOut + o)]))
                << cpu_level_name(level) << " mxfp4 " << mxfp4 << " t " << t << " o " << o;
            EXPECT_TRUE(same_float(y2[size_t(t * kOut + o)], y[size_t(t * kOut + (o + 1) % kOut)]))
                << cpu_level_name(level) << " mxfp4 " << mxfp4 << " t " << t << " o " << o;
          }
        }
      }
  }
}

TEST(OpsLinear, ForcedPortableLevelSticks) {
  LevelGuard guard(CpuLevel::portable);
  EXPECT_EQ(cpu_level(), CpuLevel::portable);
}

}  // namespace
}  // namespace k3
