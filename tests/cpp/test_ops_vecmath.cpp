// test_ops_vecmath.cpp: the branchless fp32 math under the fast activation kernels (src/ops/vec_math.h)
// against <cmath> in fp64, including the edges: overflow to +inf, underflow to 0, NaN in -> NaN out,
// and bf16 rounding equal to dtype.h's round_bf16 on every pattern class.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/dtype.h"
#include "ops/vec_math.h"

namespace k3 {
namespace {

using namespace vecmath;

TEST(OpsVecMath, ExpRelativeErrorOverRange) {
  double worst = 0;
  for (double x = -87.0; x <= 88.5; x += 0.01) {
    const double want = std::exp(double(float(x)));
    worst = std::max(worst, std::fabs(exp_fast(float(x)) - want) / want);
  }
  EXPECT_LT(worst, 5e-7);
}

TEST(OpsVecMath, ExpEdges) {
  EXPECT_EQ(exp_fast(0.0f), 1.0f);
  EXPECT_EQ(exp_fast(-INFINITY), 0.0f);
  EXPECT_EQ(exp_fast(-100.0f), 0.0f);
  EXPECT_TRUE(std::isinf(exp_fast(INFINITY)));
  EXPECT_TRUE(std::isinf(exp_fast(100.0f)));
  EXPECT_TRUE(std::isnan(exp_fast(NAN)));
  EXPECT_TRUE(std::isfinite(exp_fast(88.7f)));
  EXPECT_GT(exp_fast(-87.0f), 0.0f);
}

TEST(OpsVecMath, SigmoidAndTanh) {
  double worst_sig = 0, worst_tanh = 0;
  for (double x = -30; x <= 30; x += 0.003) {
    const float xf = float(x);
    worst_sig = std::max(worst_sig, std::fabs(sigmoid_fast(xf) - 1.0 / (1.0 + std::exp(-double(xf)))));
    worst_tanh = std::max(worst_tanh, std::fabs(tanh_fast(xf) - std::tanh(double(xf))));
  }
  EXPECT_LT(worst_sig, 2e-7);
  EXPECT_LT(worst_tanh, 3e-7);
  EXPECT_EQ(tanh_fast(1e30f), 1.0f);
  EXPECT_EQ(tanh_fast(-1e30f), -1.0f);
  EXPECT_EQ(sigmoid_fast(-1e30f), 0.0f);
  EXPECT_EQ(sigmoid_fast(1e30f), 1.0f);
  EXPECT_TRUE(std::isnan(tanh_fast(NAN)));
}

TEST(OpsVecMath, RoundBf16MatchesDtype) {
  std::mt19937 gen(7);
  for (int i = 0; i < 200000; ++i) {
    uint32_t u = gen();
    float f;
    std::memcpy(&f, &u, 4);
    const float a = round_bf16_fast(f), b = round_bf16(f);
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(a)) << std::hex << u;
      continue;
    }
    ASSERT_EQ(f32_to_bits(a), f32_to_bits(b)) << std::hex << u;
  }
  // ties to even, in both directions
  EXPECT_EQ(round_bf16_fast(1.0f + std::ldexp(1.0f, -8)), 1.0f);
  EXPECT_EQ(round_bf16_fast(1.0f + 3 * std::ldexp(1.0f, -8)), 1.0f + std::ldexp(1.0f, -6));
}

}  // namespace
}  // namespace k3
